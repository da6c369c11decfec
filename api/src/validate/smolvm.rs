//! The rules of a SmolVM write (V1 to V8, V11, V13; V14's are in `pool`, V16's in `volume`): the spec against the policy, the workload,
//! the Service, suspend, placement against the known nodes, and the force-delete and recreate
//! annotations.

use std::collections::BTreeMap;

use crate::{
    admission::Operation,
    constants::{
        FORCE_DELETE_ANNOTATION, FORCE_DELETE_VALUE, RECREATE_LOST_MACHINE_ANNOTATION, RECREATE_LOST_MACHINE_VALUE,
        condition, reason,
    },
    policy::Policy,
    syntax,
    types::{
        DEFAULT_CPUS, DEFAULT_MEMORY_MIB, DEFAULT_OVERLAY_GIB, DEFAULT_STORAGE_GIB, MAX_SELECTOR_ENTRIES,
        NodeResources, SmolVM, SmolVMNode, SmolVMSpec,
    },
};

use super::{
    bound::*,
    context::*,
    pool::check_pool_ref,
    verdict::*,
    volume::{check_volumes, check_volumes_unchanged},
};

/// Validates a SmolVM write on the main resource (rules V1 to V8, V11 to V14).
pub fn validate_smolvm(op: Operation, old: Option<&SmolVM>, new: &SmolVM, ctx: &Context<'_>) -> Verdict {
    let mut verdict = Verdict::default();
    if !matches!(op, Operation::Create | Operation::Update) {
        return verdict;
    }
    let old = if op == Operation::Update { old } else { None };
    check_class_name(op, old, new, ctx, &mut verdict);
    check_pool_ref(op, old, new, ctx, &mut verdict);
    check_force_delete(op, old, new, &mut verdict);
    check_recreate_lost(op, old, new, &mut verdict);

    // V8: an object being deleted accepts metadata changes only, and nothing else is checked, so
    // that removing a finalizer is never blocked.
    if let Some(old) = old
        && (old.is_deleting() || new.is_deleting())
    {
        if old.spec != new.spec {
            verdict.violation(
                RuleId::V8,
                "spec",
                String::new(),
                "cannot change while the SmolVM is being deleted; only metadata (such as finalizers and annotations) may change".into());
        }
        return verdict;
    }

    let mut spec_checks = Verdict::default();
    check_object(new, ctx.policy, &mut spec_checks);
    match old {
        // Ratcheting: a violation the stored object already had, under the current policy, is
        // not this update's doing (the policy may have tightened since); it is reported as a
        // warning so the object stays updatable, for example to fix it. A violation the update
        // brings about (also through another field: disabling the network under existing ports,
        // a port changed into a duplicate of an untouched one) stays a violation.
        Some(old) => {
            let mut before = Verdict::default();
            if !spec_checks.violations.is_empty() {
                check_object(old, ctx.policy, &mut before);
            }
            for finding in spec_checks.violations {
                let predates = before
                    .violations
                    .iter()
                    .any(|b| b.rule == finding.rule && b.pointer == finding.pointer && b.message == finding.message);
                if predates {
                    verdict.warnings.push(Finding {
                        message: format!(
                            "{} (unchanged by this update; it predates the current policy)",
                            finding.message
                        ),
                        ..finding
                    });
                } else {
                    verdict.violations.push(finding);
                }
            }
        }
        None => verdict.violations.extend(spec_checks.violations),
    }
    verdict.warnings.extend(spec_checks.warnings);
    check_expose(new, &mut verdict);
    check_suspend(old, new, &mut verdict);

    match old.and_then(SmolVM::bound_node) {
        Some(bound) => {
            if let Some(old) = old {
                check_bound(bound, &old.spec, &new.spec, &mut verdict);
                check_volumes_unchanged(old, new, &mut verdict);
                if old.spec.request() != new.spec.request() {
                    check_bound_capacity(bound, &new.spec, ctx, &mut verdict);
                }
            }
        }
        None => {
            let placement_changed =
                old.is_none_or(|o| o.spec.node_name != new.spec.node_name || o.spec.request() != new.spec.request());
            if placement_changed {
                check_placement(&new.spec, ctx, &mut verdict);
            }
        }
    }
    verdict
}

/// V3, `network.exposeService`: the Service takes the SmolVM's name, so the name must be able to
/// name a Service; a Service without ports, or with two published ports on one guest port and
/// protocol, is warned about.
fn check_expose(vm: &SmolVM, v: &mut Verdict) {
    if !vm.spec.expose_service() {
        return;
    }
    let name = vm.metadata.name.as_deref().unwrap_or_default();
    // A generateName object has no name yet at admission; the controller reports a bad one.
    if !name.is_empty()
        && let Err(why) = syntax::check_dns1035_label(name)
    {
        v.violation(
            RuleId::V3,
            "spec.network.exposeService",
            "true".into(),
            format!("true needs a SmolVM name that can name its Service, and metadata.name {name:?} {why}"),
        );
    }
    let ports = vm.spec.ports();
    if ports.is_empty() {
        v.warning(
            RuleId::V3,
            "spec.network.exposeService",
            "true".into(),
            "is true but spec.network.ports is empty: no Service is made until the SmolVM publishes a port".into(),
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        if !seen.insert((p.guest_port, p.protocol)) {
            v.warning(
                RuleId::V3,
                &format!("spec.network.ports[{i}]"),
                format!("{}->{}/{}", p.host_port, p.guest_port, p.protocol.as_str()),
                format!(
                    "{}->{}/{} publishes guest port {} a second time; the Service carries the first only",
                    p.host_port,
                    p.guest_port,
                    p.protocol.as_str(),
                    p.guest_port
                ),
            );
        }
    }
}

/// V13: `suspended: true` with `running: false` saves nothing (admitted, with a warning); a bound
/// SmolVM that is suspended, or becomes so in this update, keeps its CPUs and memory (its saved
/// memory image is resumed as it was).
fn check_suspend(old: Option<&SmolVM>, new: &SmolVM, v: &mut Verdict) {
    let spec = &new.spec;
    if spec.suspended == Some(true) && !spec.running() {
        v.warning(
            RuleId::V13,
            "spec.suspended",
            "true".into(),
            "true has nothing to save while spec.running is false: the machine stays stopped, and is started and suspended once spec.running is true again".into(),
        );
    }
    let Some(old) = old.filter(|o| o.bound_node().is_some()) else {
        return;
    };
    if !(old.spec.suspended() || spec.suspended()) {
        return;
    }
    let (before, after) = (old.spec.effective(), spec.effective());
    let changes = [
        (
            "spec.resources.cpus",
            i64::from(before.cpus),
            i64::from(after.cpus),
            "CPUs",
        ),
        ("spec.resources.memoryMiB", before.memory_mib, after.memory_mib, "MiB"),
    ];
    for (path, was, now, unit) in changes {
        if was != now {
            v.violation(
                RuleId::V13,
                path,
                now.to_string(),
                format!(
                    "{now} cannot replace {was} {unit} while the SmolVM is suspended: its saved memory resumes at the size it was saved with; resume it (spec.suspended: false), then resize"
                ),
            );
        }
    }
}

/// V1 to V4 and V11: the spec on its own, against the policy.
fn check_spec(spec: &SmolVMSpec, policy: &Policy, v: &mut Verdict) {
    check_spec_fields(spec, policy, Unset::Defaulted, v);
}

/// The rules of a SmolVM's own fields against the policy: its spec (V1 to V4, V11) and its
/// volumes (V16), which need its name.
fn check_object(vm: &SmolVM, policy: &Policy, v: &mut Verdict) {
    check_spec(&vm.spec, policy, v);
    check_volumes(vm, policy, v);
}

/// How [`check_spec_fields`] treats a size the spec leaves unset.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Unset {
    /// Checked as its built-in default (M1), which the SmolVM will get.
    Defaulted,
    /// Not checked: a SmolVMClass's unset field is no value at all.
    Skipped,
}

/// V1 to V4 and V11 on a spec against the policy.
pub(super) fn check_spec_fields(spec: &SmolVMSpec, policy: &Policy, unset: Unset, v: &mut Verdict) {
    check_image(spec, v);
    check_sizes(spec, policy, unset, v);
    check_network(spec, policy, v);
    check_node_fields(spec, v);
    check_workload(spec, policy, v);
}

/// V1: the image is an OCI reference or `local:<name>`.
fn check_image(spec: &SmolVMSpec, v: &mut Verdict) {
    // Absent (decoded as empty). A pooled SmolVM takes its image from its pool; one whose pool
    // is unknown has none, which V14 reports.
    if spec.image.is_empty() {
        if spec.pool_ref.is_none() {
            v.violation(
                RuleId::V1,
                "spec.image",
                String::new(),
                "is required: an OCI reference such as alpine:latest, or local:<name>; or name a pool in spec.poolRef, whose template gives it".into(),
            );
        }
        return;
    }
    if let Err(reason) = syntax::parse_image(&spec.image) {
        v.violation(
            RuleId::V1,
            "spec.image",
            render(&spec.image),
            format!("{} {reason}", render(&spec.image)),
        );
    }
}

/// One size of V2: where it is, its value, its built-in default and the policy's bounds (each
/// with the policy field's name).
struct SizeBound<'a> {
    path: &'a str,
    value: Option<i64>,
    default: i64,
    min: (&'a str, i64),
    max: (&'a str, i64),
}

/// V2: CPUs, memory and disk sizes within the policy's bounds.
fn check_sizes(spec: &SmolVMSpec, policy: &Policy, unset: Unset, v: &mut Verdict) {
    let resources = spec.resources.as_ref();
    let storage = spec.storage.as_ref();
    let bounds = [
        SizeBound {
            path: "resources/cpus",
            value: resources.and_then(|r| r.cpus).map(i64::from),
            default: i64::from(DEFAULT_CPUS),
            min: ("minCpus", policy.min_cpus),
            max: ("maxCpus", policy.max_cpus),
        },
        SizeBound {
            path: "resources/memoryMiB",
            value: resources.and_then(|r| r.memory_mib),
            default: DEFAULT_MEMORY_MIB,
            min: ("minMemoryMiB", policy.min_memory_mib),
            max: ("maxMemoryMiB", policy.max_memory_mib),
        },
        SizeBound {
            path: "storage/storageGiB",
            value: storage.and_then(|s| s.storage_gib),
            default: DEFAULT_STORAGE_GIB,
            min: ("minStorageGiB", policy.min_storage_gib),
            max: ("maxStorageGiB", policy.max_storage_gib),
        },
        SizeBound {
            path: "storage/overlayGiB",
            value: storage.and_then(|s| s.overlay_gib),
            default: DEFAULT_OVERLAY_GIB,
            min: ("minOverlayGiB", policy.min_overlay_gib),
            max: ("maxOverlayGiB", policy.max_overlay_gib),
        },
    ];
    for b in bounds {
        check_size(b, unset, v);
    }
}

/// V2 on one size.
fn check_size(b: SizeBound<'_>, unset: Unset, v: &mut Verdict) {
    let actual = match (b.value, unset) {
        (Some(value), _) => value,
        (None, Unset::Defaulted) => b.default,
        (None, Unset::Skipped) => return,
    };
    let ((min_name, min), (max_name, max)) = (b.min, b.max);
    if (min..=max).contains(&actual) {
        return; // the common case: nothing to report, nothing to format
    }
    let path = format!("spec.{}", b.path.replace('/', "."));
    let shown = match b.value {
        Some(x) => x.to_string(),
        None => format!("{} (the default)", b.default),
    };
    if actual < min {
        let message = format!("{shown} is below the minimum {min} (policy {min_name})");
        v.violation(RuleId::V2, &path, actual.to_string(), message);
    } else if actual > max {
        let message = format!("{shown} exceeds the maximum {max} (policy {max_name})");
        v.violation(RuleId::V2, &path, actual.to_string(), message);
    }
}

/// V3: ports and egress CIDRs need the network, within the policy's counts and ranges.
fn check_network(spec: &SmolVMSpec, policy: &Policy, v: &mut Verdict) {
    let ports = spec.ports();
    let cidrs = spec.allowed_cidrs();
    if !spec.network_enabled() {
        if !ports.is_empty() {
            v.violation(
                RuleId::V3,
                "spec.network.ports",
                format!("{} port(s)", ports.len()),
                format!("{} port(s) need spec.network.enabled: true", ports.len()),
            );
        }
        if !cidrs.is_empty() {
            v.violation(
                RuleId::V3,
                "spec.network.allowedCIDRs",
                format!("{} CIDR(s)", cidrs.len()),
                format!("{} CIDR(s) need spec.network.enabled: true", cidrs.len()),
            );
        }
    }
    v.too_many(
        RuleId::V3,
        "spec.network.ports",
        "ports",
        ports.len(),
        policy.max_ports,
        "maxPorts",
    );
    let mut seen: BTreeMap<(i32, crate::types::Protocol), usize> = BTreeMap::new();
    for (i, port) in ports.iter().enumerate() {
        check_port(i, port, policy, v);
        if let Some(first) = seen.insert((port.host_port, port.protocol), i) {
            v.violation(
                RuleId::V3,
                &format!("spec.network.ports[{i}]"),
                format!("{}/{}", port.host_port, port.protocol),
                format!(
                    "{}/{} duplicates ports[{first}]: a host port and protocol may be used once",
                    port.host_port, port.protocol
                ),
            );
        }
    }
    v.too_many(
        RuleId::V3,
        "spec.network.allowedCIDRs",
        "entries",
        cidrs.len(),
        policy.max_allowed_cidrs,
        "maxAllowedCIDRs",
    );
    v.each_invalid(RuleId::V3, "spec.network.allowedCIDRs", cidrs, syntax::check_cidr);
}

/// V3 on the `i`th port on its own: port numbers, and the host port against the policy's range
/// and exclusions.
fn check_port(i: usize, port: &crate::types::Port, policy: &Policy, v: &mut Verdict) {
    for (field, value) in [("hostPort", port.host_port), ("guestPort", port.guest_port)] {
        if !(1..=65535).contains(&value) {
            v.violation(
                RuleId::V3,
                &format!("spec.network.ports[{i}].{field}"),
                value.to_string(),
                format!("{value} is not a port number (1-65535)"),
            );
        }
    }
    let host = i64::from(port.host_port);
    if (1..=65535).contains(&host) && !(policy.host_port_min..=policy.host_port_max).contains(&host) {
        v.violation(
            RuleId::V3,
            &format!("spec.network.ports[{i}].hostPort"),
            host.to_string(),
            format!(
                "{host} is outside the allowed host port range {}-{} (policy hostPortMin, hostPortMax)",
                policy.host_port_min, policy.host_port_max
            ),
        );
    } else if let Some(rule) = policy.excluded_host_port(host) {
        v.violation(
            RuleId::V3,
            &format!("spec.network.ports[{i}].hostPort"),
            host.to_string(),
            format!(
                "{host} is an excluded host port ({rule}, policy excludedHostPorts): it is reserved for the node's own services or the runtime agent"
            ),
        );
    }
}

/// V4: the node pin and the node selector.
pub(super) fn check_node_fields(spec: &SmolVMSpec, v: &mut Verdict) {
    if let Some(node) = &spec.node_name
        && let Err(reason) = syntax::check_dns1123_subdomain(node)
    {
        v.violation(
            RuleId::V4,
            "spec.nodeName",
            render(node),
            format!("{} {reason}", render(node)),
        );
    }
    let Some(selector) = &spec.node_selector else { return };
    if selector.len() > MAX_SELECTOR_ENTRIES {
        v.violation(
            RuleId::V4,
            "spec.nodeSelector",
            format!("{} entries", selector.len()),
            format!("{} entries exceed the maximum {MAX_SELECTOR_ENTRIES}", selector.len()),
        );
    }
    for (key, value) in selector {
        if let Err(reason) = syntax::check_label_key(key) {
            v.violation(
                RuleId::V4,
                &format!("spec.nodeSelector[{}]", render(key)),
                render(key),
                format!("key {} {reason}", render(key)),
            );
        }
        if let Err(reason) = syntax::check_label_value(value) {
            v.violation(
                RuleId::V4,
                &format!("spec.nodeSelector[{}]", render(key)),
                render(value),
                format!("value {} {reason}", render(value)),
            );
        }
    }
}

/// V11: the workload, against the policy's maxima. Values are never echoed (an env value or an
/// argument may be a secret): a finding names the entry and its size.
fn check_workload(spec: &SmolVMSpec, policy: &Policy, v: &mut Verdict) {
    let max_bytes = usize::try_from(policy.max_value_bytes).unwrap_or(usize::MAX);
    for (field, list) in [("command", &spec.command), ("args", &spec.args)] {
        let Some(list) = list else { continue };
        let path = format!("spec.{field}");
        v.too_many(RuleId::V11, &path, "entries", list.len(), policy.max_args, "maxArgs");
        for (i, entry) in list.iter().enumerate() {
            v.too_long(RuleId::V11, &format!("{path}[{i}]"), entry.len(), max_bytes);
        }
    }
    check_working_dir(spec, max_bytes, v);
    if let Some(env) = &spec.env {
        check_env(env, policy, max_bytes, v);
    }
    for (i, secret) in spec.image_pull_secrets.iter().flatten().enumerate() {
        let path = format!("spec.imagePullSecrets[{i}].name");
        v.invalid(RuleId::V11, &path, &secret.name, syntax::check_dns1123_subdomain);
    }
    if let Some(grace) = spec.termination_grace_period_seconds
        && !(0..=300).contains(&grace)
    {
        v.violation(
            RuleId::V11,
            "spec.terminationGracePeriodSeconds",
            grace.to_string(),
            format!("{grace} is outside 0 to 300 seconds"),
        );
    }
    check_allowed_hosts(spec, policy, v);
}

/// V11: the working directory is an absolute path of bounded length.
fn check_working_dir(spec: &SmolVMSpec, max_bytes: usize, v: &mut Verdict) {
    let Some(dir) = &spec.working_dir else { return };
    if !dir.starts_with('/') {
        v.violation(
            RuleId::V11,
            "spec.workingDir",
            render(dir),
            format!("{} is not an absolute path (it must start with '/')", render(dir)),
        );
    } else if dir.len() > max_bytes.min(4096) {
        v.violation(
            RuleId::V11,
            "spec.workingDir",
            format!("{} bytes", dir.len()),
            format!("{} bytes exceed the maximum {}", dir.len(), max_bytes.min(4096)),
        );
    }
}

/// V11 on `spec.env`: how many, unique names, and each entry's value or reference.
fn check_env(env: &[crate::types::EnvVar], policy: &Policy, max_bytes: usize, v: &mut Verdict) {
    v.too_many(RuleId::V11, "spec.env", "entries", env.len(), policy.max_env, "maxEnv");
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, var) in env.iter().enumerate() {
        let at = |field: &str| format!("spec.env[{i}]{field}");
        if var.name.is_empty() || var.name.contains('=') {
            v.violation(
                RuleId::V11,
                &at(".name"),
                render(&var.name),
                format!(
                    "{} is not a variable name: it must be non-empty and have no '='",
                    render(&var.name)
                ),
            );
        } else if let Some(first) = seen.insert(var.name.as_str(), i) {
            seen.insert(var.name.as_str(), first);
            v.violation(
                RuleId::V11,
                &at(".name"),
                render(&var.name),
                format!("{} duplicates env[{first}]: names are unique", render(&var.name)),
            );
        }
        check_env_source(i, var, max_bytes, v);
    }
}

/// V11 on the `i`th env entry's source: exactly one of a bounded value and a reference to one
/// key of a Secret or a ConfigMap.
fn check_env_source(i: usize, var: &crate::types::EnvVar, max_bytes: usize, v: &mut Verdict) {
    let at = |field: &str| format!("spec.env[{i}]{field}");
    match (&var.value, &var.value_from) {
        (Some(_), Some(_)) | (None, None) => v.violation(
            RuleId::V11,
            &at(""),
            render(&var.name),
            format!(
                "{} has {}: an env entry has exactly one of value and valueFrom",
                render(&var.name),
                if var.value.is_some() {
                    "both value and valueFrom"
                } else {
                    "neither value nor valueFrom"
                }
            ),
        ),
        (Some(value), None) => v.too_long(RuleId::V11, &at(".value"), value.len(), max_bytes),
        (None, Some(from)) => {
            let refs = [
                ("secretKeyRef", from.secret_key_ref.as_ref()),
                ("configMapKeyRef", from.config_map_key_ref.as_ref()),
            ];
            let given = refs.iter().filter(|(_, r)| r.is_some()).count();
            if given != 1 {
                v.violation(
                    RuleId::V11,
                    &at(".valueFrom"),
                    format!("{given} references"),
                    format!("{given} references: valueFrom has exactly one of secretKeyRef and configMapKeyRef"),
                );
            }
            for (kind, selector) in refs {
                let Some(selector) = selector else { continue };
                let name_path = at(&format!(".valueFrom.{kind}.name"));
                v.invalid(RuleId::V11, &name_path, &selector.name, syntax::check_dns1123_subdomain);
                let key_path = at(&format!(".valueFrom.{kind}.key"));
                v.invalid(RuleId::V11, &key_path, &selector.key, syntax::check_config_key);
            }
        }
    }
}

/// V11 on `spec.network.allowedHosts`: they need the network, within the policy's count, each
/// a host name or a `*.` wildcard.
fn check_allowed_hosts(spec: &SmolVMSpec, policy: &Policy, v: &mut Verdict) {
    let hosts = spec.allowed_hosts();
    if !hosts.is_empty() && !spec.network_enabled() {
        v.violation(
            RuleId::V11,
            "spec.network.allowedHosts",
            format!("{} entries", hosts.len()),
            format!("{} entries need network.enabled: true", hosts.len()),
        );
    }
    v.too_many(
        RuleId::V11,
        "spec.network.allowedHosts",
        "entries",
        hosts.len(),
        policy.max_allowed_hosts,
        "maxAllowedHosts",
    );
    v.each_invalid(
        RuleId::V11,
        "spec.network.allowedHosts",
        hosts,
        syntax::check_allowed_host,
    );
}

/// V5 for an unbound SmolVM: pins and capacity against the known nodes.
fn check_placement(spec: &SmolVMSpec, ctx: &Context<'_>, v: &mut Verdict) {
    let request = spec.request();
    match &spec.node_name {
        Some(pin) => {
            match ctx.nodes.node(pin) {
                None => v.warning(
                    RuleId::V5,
                    "spec.nodeName",
                    render(pin),
                    format!(
                        "no SmolVMNode {} is known; the SmolVM stays Pending until a runtime registers that node",
                        render(pin)
                    ),
                ),
                Some(facts) => {
                    if let Some(allocatable) = facts.allocatable
                        && !allocatable.holds(&request)
                    {
                        v.violation(
                        RuleId::V5,
                        "spec.nodeName",
                        render(pin),
                        format!(
                            "pinned node {} can never hold this SmolVM: it needs {request}, the node's allocatable is {allocatable}",
                            render(pin)
                        ));
                    }
                    if facts.unschedulable {
                        v.warning(
                        RuleId::V5,
                        "spec.nodeName",
                        render(pin),
                        format!("node {} is cordoned (spec.unschedulable); the SmolVM stays Pending until it is uncordoned", render(pin)));
                    }
                }
            }
        }
        None => {
            if ctx.nodes.is_empty() {
                v.warning(
                    RuleId::V5,
                    "spec",
                    String::new(),
                    "no SmolVMNode is registered yet; the SmolVM stays Pending until a runtime agent reports a node"
                        .into(),
                );
            } else if !ctx.nodes.any_node(&mut |node| could_ever_hold(node, spec, &request)) {
                v.warning(
                    RuleId::V5,
                    "spec.resources",
                    request.to_string(),
                    format!(
                        "no known node can hold {request}{}; the SmolVM stays Pending until one can",
                        if spec.node_selector.as_ref().is_some_and(|s| !s.is_empty()) {
                            " and carries the spec.nodeSelector labels, uncordoned"
                        } else {
                            " uncordoned"
                        }
                    ),
                );
            }
        }
    }
}

/// Whether `node` could ever hold a SmolVM with `spec` (placement may still wait for room):
/// uncordoned, carrying every `spec.nodeSelector` label, with an allocatable that holds
/// `request`.
fn could_ever_hold(node: &SmolVMNode, spec: &SmolVMSpec, request: &NodeResources) -> bool {
    let facts = NodeFacts::of(node);
    let labels = node.metadata.labels.as_ref();
    let selected = spec.node_selector.as_ref().is_none_or(|selector| {
        selector
            .iter()
            .all(|(key, value)| labels.and_then(|l| l.get(key)) == Some(value))
    });
    !facts.unschedulable && selected && facts.allocatable.is_some_and(|a| a.holds(request))
}

/// V7: the force-delete annotation.
fn check_force_delete(op: Operation, old: Option<&SmolVM>, new: &SmolVM, v: &mut Verdict) {
    let annotation = |vm: &SmolVM| {
        vm.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FORCE_DELETE_ANNOTATION))
            .cloned()
    };
    let Some(value) = annotation(new) else { return };
    let path = format!("metadata.annotations[{FORCE_DELETE_ANNOTATION}]");
    if op == Operation::Update && old.and_then(annotation).as_deref() == Some(value.as_str()) {
        return; // unchanged: judged when it was set
    }
    // Every misuse is reported, not only the first.
    let shown = render(&value);
    let mut misuse = Vec::new();
    if value != FORCE_DELETE_VALUE {
        misuse.push(format!("{shown} must be exactly \"true\""));
    }
    if op == Operation::Create {
        misuse.push(format!(
            "{shown} cannot be set on create: it is an escape hatch for deleting a SmolVM whose node cannot confirm cleanup"
        ));
    } else if !new.is_deleting() {
        misuse.push(format!(
            "{shown} can only be set on a SmolVM that is being deleted: run kubectl delete first, then annotate if deletion stays blocked"
        ));
    }
    if !misuse.is_empty() {
        for message in misuse {
            v.violation(RuleId::V7, &path, shown.clone(), message);
        }
        return;
    }
    let node = new.bound_node().or_else(|| old.and_then(SmolVM::bound_node));
    let message = match node {
        Some(node) => format!(
            "{shown}: if node {node} stays unreachable, the finalizer is removed and the machine's local state on {node} (/var/lib/smolvm) may be orphaned"
        ),
        None => format!("{shown}: the SmolVM is not bound to a node; nothing can be orphaned"),
    };
    v.warning(RuleId::V7, &path, shown, message);
}

/// V7 for the recreate-lost-machine annotation: exactly `"true"`, only on a SmolVM whose machine
/// is lost (Ready=False, reason MachineLost), never on create; when admitted, the answer warns that
/// the new machine starts empty.
fn check_recreate_lost(op: Operation, old: Option<&SmolVM>, new: &SmolVM, v: &mut Verdict) {
    let annotation = |vm: &SmolVM| {
        vm.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RECREATE_LOST_MACHINE_ANNOTATION))
            .cloned()
    };
    let Some(value) = annotation(new) else { return };
    if op == Operation::Update && old.and_then(annotation).as_deref() == Some(value.as_str()) {
        return; // unchanged: judged when it was set
    }
    let path = format!("metadata.annotations[{RECREATE_LOST_MACHINE_ANNOTATION}]");
    let shown = render(&value);
    let mut misuse = Vec::new();
    if value != RECREATE_LOST_MACHINE_VALUE {
        misuse.push(format!("{shown} must be exactly \"true\""));
    }
    let lost = |vm: &SmolVM| {
        vm.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == condition::READY && c.status == "False" && c.reason == reason::MACHINE_LOST)
        })
    };
    if op == Operation::Create {
        misuse.push(format!(
            "{shown} cannot be set on create: it asks for a fresh machine in place of one its node lost"
        ));
    } else if !old.is_some_and(lost) {
        misuse.push(format!(
            "{shown} can only be set on a SmolVM whose machine is lost (Ready=False, reason {})",
            reason::MACHINE_LOST
        ));
    }
    if !misuse.is_empty() {
        for message in misuse {
            v.violation(RuleId::V7, &path, shown.clone(), message);
        }
        return;
    }
    let node = new.bound_node().unwrap_or("its node");
    v.warning(
        RuleId::V7,
        &path,
        shown.clone(),
        format!("{shown}: a fresh, empty machine is created on {node}; the lost machine's disks are not recovered"),
    );
}

/// V12: at CREATE `spec.className` names a known class (the mutating webhook has then applied
/// it); it never changes afterwards. A class deleted later does not concern existing SmolVMs.
fn check_class_name(op: Operation, old: Option<&SmolVM>, new: &SmolVM, ctx: &Context<'_>, v: &mut Verdict) {
    let name = new.spec.class_name.as_deref();
    let shown = |n: Option<&str>| n.map_or_else(|| "none".to_string(), render);
    match (op, old) {
        (Operation::Update, Some(old)) if old.spec.class_name.as_deref() != name => {
            v.violation(
                RuleId::V12,
                "spec.className",
                name.map(render).unwrap_or_default(),
                format!(
                    "cannot change from {} to {}: a SmolVM's class is applied once, at CREATE; delete and recreate to change it",
                    shown(old.spec.class_name.as_deref()),
                    shown(name),
                ),
            );
        }
        (Operation::Create, _) => {
            if let Some(name) = name
                && ctx.classes.class(name).is_none()
            {
                let known = ctx.classes.names();
                let known = if known.is_empty() {
                    "no SmolVMClass exists".to_string()
                } else {
                    format!("known classes: {}", known.join(", "))
                };
                v.violation(
                    RuleId::V12,
                    "spec.className",
                    render(name),
                    format!("{} names no SmolVMClass ({known})", render(name)),
                );
            }
        }
        _ => {}
    }
}
