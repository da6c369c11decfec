//! The rules of a SmolVM write (V1 to V8, V11 to V14, V16), gathered here: the spec's own fields
//! against the policy (V1 to V4, V11, in `fields`), ratcheted on update; the Service (V3);
//! suspend (V13); placement against the known nodes (V5; once bound, V6 in `bound`); the class
//! (V12); objects being deleted (V8). The force-delete and recreate annotations (V7) are in
//! `annotations`, the pool's rules (V14) in `pool`, the volumes' (V16) in `volume`.

use crate::{
    admission::Operation,
    policy::Policy,
    syntax,
    types::{NodeResources, SmolVM, SmolVMNode, SmolVMSpec},
};

use super::{
    annotations::{check_force_delete, check_recreate_lost},
    bound::*,
    branch::{check_branch, check_delete_branches},
    context::*,
    fields::{Unset, check_spec_fields},
    pool::check_pool_ref,
    verdict::*,
    volume::{check_volumes, check_volumes_unchanged},
};

/// Validates a SmolVM write on the main resource (rules V1 to V8, V11 to V14, V16, V17).
pub fn validate_smolvm(op: Operation, old: Option<&SmolVM>, new: &SmolVM, ctx: &Context<'_>) -> Verdict {
    let mut verdict = Verdict::default();
    if !matches!(op, Operation::Create | Operation::Update) {
        return verdict;
    }
    let old = if op == Operation::Update { old } else { None };
    check_class_name(op, old, new, ctx, &mut verdict);
    check_pool_ref(op, old, new, ctx, &mut verdict);
    check_branch(op, old, new, ctx, &mut verdict);
    check_force_delete(op, old, new, &mut verdict);
    check_delete_branches(op, old, new, &mut verdict);
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
    // An idle suspension (SPEC 2.7) is the controller's: `spec.suspended` stays false, and the
    // status says so.
    let idle = old.idle_suspended();
    if !(old.spec.suspended() || spec.suspended() || idle) {
        return;
    }
    let resume = if idle {
        "wake it (kubectl smolvm resume), then resize"
    } else {
        "resume it (spec.suspended: false), then resize"
    };
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
                    "{now} cannot replace {was} {unit} while the SmolVM is suspended: its saved memory resumes at the size it was saved with; {resume}"
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
        // A branch's className is its source's, copied at its create with the rest of the
        // source's spec (M5); it takes no defaults from it, so a class deleted since the source
        // was made does not keep it from being branched. A className it sets itself is V17's.
        (Operation::Create, _) if new.spec.branch_of.is_none() => {
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
