//! The decisions of a placement: the status of a SmolVM bound to a node ([`bound`]), and the
//! outcome of one no node can take ([`unschedulable`]).

use k8s_openapi::jiff::Timestamp;
use smolvm_api::{
    Phase, SmolVM, SmolVMStatus,
    constants::{condition, reason},
};

use super::outcome::{Outcome, warned};
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
