//! The rules of a SmolVM once it is bound to a node (V7): what may change in place, and a
//! resize its node can never hold (V5).

use crate::types::SmolVMSpec;

use super::{context::*, verdict::*};

/// V5 and V6 for a SmolVM already bound to `bound`.
pub(super) fn check_bound(bound: &str, old: &SmolVMSpec, new: &SmolVMSpec, v: &mut Verdict) {
    // V5
    if let Some(pin) = &new.node_name
        && pin != bound
    {
        v.violation(
            RuleId::V5,
            "spec.nodeName",
            render(pin),
            format!(
                "{} cannot be set: the SmolVM is bound to {}; SmolVMs never move; delete and recreate it",
                render(pin),
                render(bound)
            ),
        );
    }
    // V6
    check_image_and_network(old, new, v);
    check_workload_unchanged(old, new, v);
    check_sizes_in_place(bound, old, new, v);
}

/// What V6 says of a field that may not change once bound.
const IMMUTABLE: &str = "is immutable once the SmolVM is bound to a node; delete and recreate it to change it";

/// V6: the image and the network stay as they were.
fn check_image_and_network(old: &SmolVMSpec, new: &SmolVMSpec, v: &mut Verdict) {
    if old.image != new.image {
        v.violation(
            RuleId::V6,
            "spec.image",
            render(&new.image),
            format!("{} (was {}) {IMMUTABLE}", render(&new.image), render(&old.image)),
        );
    }
    if old.network_enabled() != new.network_enabled() {
        v.violation(
            RuleId::V6,
            "spec.network.enabled",
            new.network_enabled().to_string(),
            format!("{} (was {}) {IMMUTABLE}", new.network_enabled(), old.network_enabled()),
        );
    }
    if !same_ports(old, new) {
        v.violation(
            RuleId::V6,
            "spec.network.ports",
            render(new.ports()),
            format!("{} (was {}) {IMMUTABLE}", render(new.ports()), render(old.ports())),
        );
    }
    let lists = [
        ("spec.network.allowedCIDRs", old.allowed_cidrs(), new.allowed_cidrs()),
        ("spec.network.allowedHosts", old.allowed_hosts(), new.allowed_hosts()),
    ];
    for (path, before, after) in lists {
        if before != after {
            v.violation(
                RuleId::V6,
                path,
                render(after),
                format!("{} (was {}) {IMMUTABLE}", render(after), render(before)),
            );
        }
    }
}

/// V6: the workload stays as it was. Values are not echoed (an argument or env value may be a
/// secret).
fn check_workload_unchanged(old: &SmolVMSpec, new: &SmolVMSpec, v: &mut Verdict) {
    let empty = Vec::new();
    let workload_changes: [(&str, bool); 7] = [
        (
            "command",
            old.command.as_ref().unwrap_or(&empty) != new.command.as_ref().unwrap_or(&empty),
        ),
        (
            "args",
            old.args.as_ref().unwrap_or(&empty) != new.args.as_ref().unwrap_or(&empty),
        ),
        ("workingDir", old.working_dir != new.working_dir),
        (
            "env",
            old.env.as_deref().unwrap_or(&[]) != new.env.as_deref().unwrap_or(&[]),
        ),
        (
            "imagePullSecrets",
            old.image_pull_secrets.as_deref().unwrap_or(&[]) != new.image_pull_secrets.as_deref().unwrap_or(&[]),
        ),
        ("restartPolicy", old.restart_policy() != new.restart_policy()),
        (
            "terminationGracePeriodSeconds",
            old.termination_grace_period_seconds() != new.termination_grace_period_seconds(),
        ),
    ];
    for (field, changed) in workload_changes {
        if changed {
            v.violation(
                RuleId::V6,
                &format!("spec.{field}"),
                "(changed)".into(),
                format!("(changed) {IMMUTABLE}"),
            );
        }
    }
}

/// V6: storage only grows once bound; a resize of CPUs or memory is warned about (applied live
/// where the runtime can).
fn check_sizes_in_place(bound: &str, old: &SmolVMSpec, new: &SmolVMSpec, v: &mut Verdict) {
    let (o, n) = (old.effective(), new.effective());
    for (path, before, after) in [
        ("spec.storage.storageGiB", o.storage_gib, n.storage_gib),
        ("spec.storage.overlayGiB", o.overlay_gib, n.overlay_gib),
    ] {
        if after < before {
            v.violation(
                RuleId::V6,
                path,
                after.to_string(),
                format!("{after} is smaller than {before}: storage may only grow once bound"),
            );
        }
    }
    if (o.cpus, o.memory_mib) != (n.cpus, n.memory_mib) {
        v.warning(
            RuleId::V6,
            "spec.resources",
            format!("{} CPUs, {} MiB", n.cpus, n.memory_mib),
            format!(
                "resize from {} CPUs, {} MiB to {} CPUs, {} MiB on node {bound} is applied live where the runtime supports it, otherwise shown as ResizePending",
                o.cpus, o.memory_mib, n.cpus, n.memory_mib
            ));
    }
}

fn same_ports(old: &SmolVMSpec, new: &SmolVMSpec) -> bool {
    let mut a = old.ports().to_vec();
    let mut b = new.ports().to_vec();
    let key = |p: &crate::types::Port| (p.host_port, p.protocol, p.guest_port);
    a.sort_by_key(key);
    b.sort_by_key(key);
    a == b
}

/// V5 for a bound SmolVM whose request changes: its node is now its pin, so a request the
/// node's allocatable can never hold is rejected (it would stay ResizePending forever). Room
/// that other SmolVMs hold now is the controller's concern, not admission's.
pub(super) fn check_bound_capacity(bound: &str, spec: &SmolVMSpec, ctx: &Context<'_>, v: &mut Verdict) {
    let Some(allocatable) = ctx.nodes.node(bound).and_then(|facts| facts.allocatable) else {
        return;
    };
    let request = spec.request();
    let dimensions = [
        ("spec.resources.cpus", request.cpus, allocatable.cpus, "CPUs"),
        (
            "spec.resources.memoryMiB",
            request.memory_mib,
            allocatable.memory_mib,
            "MiB of memory",
        ),
        (
            "spec.storage",
            request.storage_gib,
            allocatable.storage_gib,
            "GiB of disk (storage plus overlay)",
        ),
    ];
    for (path, wanted, available, unit) in dimensions {
        if wanted > available {
            v.violation(
                RuleId::V5,
                path,
                wanted.to_string(),
                format!(
                    "{wanted} {unit} can never fit on node {}, whose allocatable is {available}; a bound SmolVM never moves: ask for less, or delete and recreate it to place it elsewhere",
                    render(bound)
                ));
        }
    }
}
