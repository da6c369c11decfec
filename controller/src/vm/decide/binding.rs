//! The decisions of a placement: the status of a SmolVM bound to a node ([`bound`]), the
//! outcome of one no node can take ([`unschedulable`]), and that of a branch whose source is not
//! placed, or cannot be branched ([`branch_waits`]).

use k8s_openapi::jiff::Timestamp;
use smolvm_api::{
    Phase, SmolVM, SmolVMStatus,
    constants::{condition, reason},
};

use super::outcome::{Outcome, Requeue, warned};
use crate::vm::rules;

/// The status of a SmolVM just bound to `node` (with that node's UID): phase Scheduled,
/// Scheduled=True.
pub fn bound(vm: &SmolVM, node: &str, node_uid: String, now: Timestamp) -> SmolVMStatus {
    let mut status = vm.status.clone().unwrap_or_default();
    status.node_name = Some(node.to_string());
    status.node_uid = Some(node_uid);
    status.machine_name = rules::machine_name(vm);
    status.phase = Some(Phase::Scheduled);
    status.observed_generation = vm.metadata.generation;
    let message = format!("bound to node {node}");
    rules::set_condition(
        &mut status.conditions,
        condition::SCHEDULED,
        "True",
        reason::BOUND,
        &message,
        vm.metadata.generation,
        now,
    );
    status
}

/// A SmolVM no node can take: Pending, Scheduled=False Unschedulable with the placement's
/// explanation, and a FailedScheduling event when that changed.
pub fn unschedulable(vm: &SmolVM, message: String, now: Timestamp) -> Outcome {
    let condition = [condition::SCHEDULED, "False", reason::UNSCHEDULABLE];
    warned(
        vm,
        Phase::Pending,
        condition,
        message,
        ("FailedScheduling", "Schedule"),
        now,
    )
}

/// A branch that cannot be placed: its source is not placed yet, or is gone (`message` says
/// which). Pending, Scheduled=False BranchPending, an event when that changed; looked at again
/// with a backoff of 1 s doubling to 30 s, so that it goes on soon after its source is placed.
pub fn branch_waits(vm: &SmolVM, message: String, now: Timestamp) -> Outcome {
    let condition = [condition::SCHEDULED, "False", reason::BRANCH_PENDING];
    let mut out = warned(
        vm,
        Phase::Pending,
        condition,
        message,
        (reason::BRANCH_PENDING, "Schedule"),
        now,
    );
    out.requeue = Requeue::Unsettled;
    out
}
