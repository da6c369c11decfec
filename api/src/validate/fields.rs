//! The rules of a spec's own fields against the policy (V1 to V4, V11, V18): the image, the
//! sizes, the network, the node pin and selector, the workload and the lifetimes. A SmolVM's spec, a SmolVMClass and a
//! pool's template share them, each with its paths.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{
    policy::Policy,
    syntax,
    types::{
        DEFAULT_CPUS, DEFAULT_MEMORY_MIB, DEFAULT_OVERLAY_GIB, DEFAULT_STORAGE_GIB, Lifecycle, MAX_LIFETIME_SECONDS,
        MAX_SELECTOR_ENTRIES, MIN_SUSPEND_AFTER_IDLE_SECONDS, SmolVMSpec,
    },
};

use super::verdict::*;

/// How [`check_spec_fields`] treats a size the spec leaves unset.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Unset {
    /// Checked as its built-in default (M1), which the SmolVM will get.
    Defaulted,
    /// Not checked: a SmolVMClass's unset field is no value at all.
    Skipped,
}

/// V1 to V4, V11 and V18 on a spec against the policy.
pub(super) fn check_spec_fields(spec: &SmolVMSpec, policy: &Policy, unset: Unset, v: &mut Verdict) {
    check_image(spec, v);
    check_sizes(spec, policy, unset, v);
    check_network(spec, policy, v);
    check_node_fields(spec, v);
    check_workload(spec, policy, v);
    check_lifecycle(spec, policy, v);
}

/// V18: the lifetimes lie within 0 seconds and ten years; `suspendAfterIdle` is a duration of
/// at least 30 s and at most the policy's `maxSuspendAfterIdleSeconds`; `wakeOnTraffic` needs it.
fn check_lifecycle(spec: &SmolVMSpec, policy: &Policy, v: &mut Verdict) {
    let Some(lifecycle) = &spec.lifecycle else { return };
    check_idle(lifecycle, policy, v);
    let fields = [
        ("ttlSecondsAfterFinished", lifecycle.ttl_seconds_after_finished),
        ("activeDeadlineSeconds", lifecycle.active_deadline_seconds),
    ];
    for (field, seconds) in fields {
        if let Some(seconds) = seconds
            && !(0..=MAX_LIFETIME_SECONDS).contains(&seconds)
        {
            v.violation(
                RuleId::V18,
                &format!("spec.lifecycle.{field}"),
                seconds.to_string(),
                format!("{seconds} is outside 0 to {MAX_LIFETIME_SECONDS} seconds (ten years)"),
            );
        }
    }
}

/// V18's idle half: `suspendAfterIdle` and `wakeOnTraffic`.
fn check_idle(lifecycle: &Lifecycle, policy: &Policy, v: &mut Verdict) {
    let path = "spec.lifecycle.suspendAfterIdle";
    match lifecycle.suspend_after_idle.as_deref().map(syntax::parse_duration) {
        None => {
            if let Some(wake) = lifecycle.wake_on_traffic {
                v.violation(
                    RuleId::V18,
                    "spec.lifecycle.wakeOnTraffic",
                    wake.to_string(),
                    format!("{wake} needs spec.lifecycle.suspendAfterIdle: only a VM suspended for idleness is woken by traffic"),
                );
            }
        }
        Some(Err(why)) => {
            let text = lifecycle.suspend_after_idle.as_deref().unwrap_or_default();
            v.violation(RuleId::V18, path, render(text), why);
        }
        Some(Ok(after)) => {
            let text = lifecycle.suspend_after_idle.as_deref().unwrap_or_default();
            let max = u64::try_from(policy.max_suspend_after_idle_seconds).unwrap_or(0);
            if after < Duration::from_secs(MIN_SUSPEND_AFTER_IDLE_SECONDS) {
                v.violation(
                    RuleId::V18,
                    path,
                    render(text),
                    format!(
                        "{} is shorter than {MIN_SUSPEND_AFTER_IDLE_SECONDS}s, the least idle time (idleness is seen at the heartbeat's grain)",
                        render(text)
                    ),
                );
            } else if after > Duration::from_secs(max) {
                v.violation(
                    RuleId::V18,
                    path,
                    render(text),
                    format!(
                        "{} is longer than the policy's maxSuspendAfterIdleSeconds ({max} seconds)",
                        render(text)
                    ),
                );
            }
        }
    }
}

/// V1: the image is an OCI reference or `local:<name>`.
fn check_image(spec: &SmolVMSpec, v: &mut Verdict) {
    // Absent (decoded as empty). A pooled SmolVM takes its image from its pool, a branch from its
    // source; one whose pool or source is unknown has none, which V14 or V17 reports.
    if spec.image.is_empty() {
        if spec.pool_ref.is_none() && spec.branch_of.is_none() {
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
