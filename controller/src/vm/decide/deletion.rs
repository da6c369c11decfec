//! The decisions of a deletion: what a failed DeleteMachine means for the finalizer
//! ([`delete_failure`]), the event of one that went through ([`deleted`]), the outcome of one
//! held because the node cannot confirm the machine is gone ([`deletion_blocked`]), and that of a
//! branch source whose branches live ([`branches_first`]).

use k8s_openapi::jiff::Timestamp;
use smolvm_api::{
    Phase, SmolVM,
    constants::{DELETE_BRANCHES_ANNOTATION, DELETE_BRANCHES_VALUE, FORCE_DELETE_ANNOTATION, condition, reason},
};

use super::outcome::{Note, Outcome, Requeue, warned};
use crate::nodeclient::CallError;

/// What a failed DeleteMachine means for the finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteFailure {
    /// The agent cannot be reached and the force-delete annotation is set: remove the finalizer.
    GiveUp,
    /// The agent cannot be reached: deletion waits (the annotation would let it go).
    AgentUnreachable,
    /// The agent answers but its runtime is unavailable: retried, never forced, since the
    /// machine may still run.
    RuntimeUnavailable,
    /// The node answered with a failure: retried.
    Failed,
}

/// Classifies a failed DeleteMachine. Only an agent that cannot be reached at all (connection
/// refused, TLS failure, timeout) lets the force-delete annotation give up the local state.
pub fn delete_failure(force: bool, e: &CallError) -> DeleteFailure {
    match (e.agent_unreachable(), e.is_unreachable()) {
        (true, _) if force => DeleteFailure::GiveUp,
        (true, _) => DeleteFailure::AgentUnreachable,
        (false, true) => DeleteFailure::RuntimeUnavailable,
        (false, false) => DeleteFailure::Failed,
    }
}

/// The event of a deletion that went through: the machine deleted (or already gone), or given
/// up on because of the force-delete annotation.
pub fn deleted(node: &str, machine: &str, result: Result<bool, &CallError>) -> Note {
    match result {
        Ok(true) => Note::normal(
            "Deleted",
            "Delete",
            format!("machine {machine} was already gone from node {node}"),
        ),
        Ok(false) => Note::normal("Deleted", "Delete", format!("deleted machine {machine} on node {node}")),
        Err(e) => Note::warning(
            reason::FORCE_DELETED,
            "Delete",
            format!(
                "node {node} is unreachable ({}); finalizer removed because of {FORCE_DELETE_ANNOTATION}; the local state of machine {machine} on {node} may be orphaned",
                e.message()
            ),
        ),
    }
}

/// A deletion held because the node cannot confirm the machine is gone: Deleting,
/// DeletionBlocked=True, and a Warning event when that changed.
pub fn deletion_blocked(
    vm: &SmolVM,
    node: &str,
    machine: &str,
    failure: DeleteFailure,
    e: &CallError,
    now: Timestamp,
) -> Outcome {
    let (why, message) = match failure {
        DeleteFailure::AgentUnreachable | DeleteFailure::GiveUp => (
            reason::RUNTIME_UNREACHABLE,
            format!(
                "node {node} cannot confirm that machine {machine} is gone: {}. Deletion waits for it; to give up on the local state, annotate the SmolVM with {FORCE_DELETE_ANNOTATION}=true",
                e.message()
            ),
        ),
        // The agent answers but smolvm does not: the machine may well still run, so giving up on
        // it is not offered; the delete is retried.
        DeleteFailure::RuntimeUnavailable => (
            reason::RUNTIME_UNREACHABLE,
            format!(
                "node {node} answers but its runtime cannot delete machine {machine} now: {}. Deletion is retried; {FORCE_DELETE_ANNOTATION} applies only while the node's agent cannot be reached at all",
                e.message()
            ),
        ),
        DeleteFailure::Failed => (
            "RuntimeError",
            format!("node {node} failed to delete machine {machine}: {}", e.message()),
        ),
    };
    let condition = [condition::DELETION_BLOCKED, "True", why];
    warned(
        vm,
        Phase::Deleting,
        condition,
        message,
        ("DeletionBlocked", "Delete"),
        now,
    )
}

/// What the deletion of a branch source does while branches of it live (`branches`, sorted; SPEC
/// 2.6): smolvm keeps a machine while branches of it live, so the source's machine is not
/// deleted yet. With `vm.smolvm.dev/delete-branches: "true"` the branches are deleted first
/// (`delete` is true: act deletes them); without, the deletion waits for them. Either way
/// Deleting, DeletionBlocked=True LiveBranches naming them, an event when that changed, and a
/// look again with a backoff of 1 s doubling to 30 s. Pure.
pub fn branches_first(vm: &SmolVM, node: &str, branches: &[String], now: Timestamp) -> (bool, Outcome) {
    let delete = vm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DELETE_BRANCHES_ANNOTATION))
        .is_some_and(|v| v == DELETE_BRANCHES_VALUE);
    let name = vm.metadata.name.as_deref().unwrap_or("");
    let listed = branches.join(", ");
    let count = branches.len();
    let (message, event) = if delete {
        (
            format!(
                "deleting its {count} branch(es) on node {node} first, as {DELETE_BRANCHES_ANNOTATION} asks: {listed}; then its machine"
            ),
            reason::DELETING_BRANCHES,
        )
    } else {
        (
            format!(
                "{count} branch(es) of it live on node {node}: {listed}. smolvm keeps a branch source while branches of it live, so its machine is deleted once they are gone: delete them (kubectl delete svm -l vm.smolvm.dev/branch-of={name}), or annotate this SmolVM with {DELETE_BRANCHES_ANNOTATION}=true to delete them first"
            ),
            "DeletionBlocked",
        )
    };
    let condition = [condition::DELETION_BLOCKED, "True", reason::LIVE_BRANCHES];
    let mut out = warned(vm, Phase::Deleting, condition, message, (event, "Delete"), now);
    out.requeue = Requeue::Unsettled;
    (delete, out)
}
