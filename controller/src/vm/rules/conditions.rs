//! Conditions: set and cleared in a list ([`set_condition`], [`clear_condition`]), the Suspended
//! condition ([`suspended_condition`]), and phase and Ready from the machine the node reports
//! ([`apply_machine`]).

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use smolvm_api::{
    Phase, SmolVM, SmolVMStatus,
    constants::{condition, reason},
    nodeapi::{MachineState, MachineStatus},
    types::RestartPolicy,
};

use super::machine::{Want, effective_of};
use super::run_goal::{RunGoal, exited_message};

/// Sets a condition in a list, keeping `lastTransitionTime` when the status does not change.
/// Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let changed = c.status != status || c.reason != reason || c.message != message;
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status.into();
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                last_transition_time: Time(now),
                observed_generation: generation,
            });
            true
        }
    }
}

/// Removes a condition; returns whether it was there.
pub fn clear_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    before != conditions.len()
}

/// The Suspended condition of a SmolVM whose machine its node reports as `machine`:
/// (status, reason, message), or `None` when it is neither suspended nor asked to be.
/// `resume_pending` is why a resume waits, when it does.
pub fn suspended_condition(
    vm: &SmolVM,
    machine: Option<&MachineStatus>,
    want: Want,
    node: &str,
    resume_pending: Option<&str>,
) -> Option<(&'static str, &'static str, String)> {
    let suspended = machine.filter(|m| m.state == MachineState::Suspended);
    let Some(m) = suspended else {
        return want.suspended.then(|| {
            let why = if machine.is_some_and(|m| m.state == MachineState::Running) {
                "the machine is being suspended"
            } else {
                "nothing is saved yet: the machine is started, then suspended"
            };
            ("False", reason::SUSPENDING, why.to_string())
        });
    };
    if let Some(pending) = resume_pending.filter(|_| want.running && !want.suspended) {
        return Some(("True", reason::RESUME_PENDING, pending.to_string()));
    }
    if want.running && !want.suspended {
        return Some((
            "True",
            reason::RESUMING,
            format!("the machine is being resumed on node {node}"),
        ));
    }
    let request = vm.spec.request();
    let since = m
        .suspended
        .as_ref()
        .map(|s| format!(" since {}", s.since))
        .unwrap_or_default();
    let saved = match m.suspended.as_ref().and_then(|s| s.saved_state_mib) {
        Some(mib) => format!("its saved state ({mib} MiB, as the node reports it)"),
        None => format!(
            "its saved state (counted as {} GiB, its memory: smolvm reports no saved-state size)",
            crate::placement::saved_state_gib(request.memory_mib)
        ),
    };
    Some((
        "True",
        reason::SUSPENDED,
        format!(
            "suspended on node {node}{since}: its memory and disks are saved there; its {} CPUs and {} MiB are given back to the node, and its disks and {saved} stay counted; set spec.suspended to false to resume it",
            request.cpus, request.memory_mib
        ),
    ))
}

/// Phase, Ready and effective resources from the machine the node reports.
pub fn apply_machine(
    status: &mut SmolVMStatus,
    machine: Option<&MachineStatus>,
    goal: RunGoal,
    policy: RestartPolicy,
    generation: Option<i64>,
    now: Timestamp,
) {
    let Some(m) = machine else {
        status.phase = Some(Phase::Creating);
        set_condition(
            &mut status.conditions,
            condition::READY,
            "False",
            reason::CREATING,
            "the machine is being created",
            generation,
            now,
        );
        return;
    };
    let running = goal.running();
    let (phase, ready, why, message) = match (&m.state, running) {
        (MachineState::Running, true) => (Phase::Running, "True", reason::RUNNING, "the machine runs".to_string()),
        (MachineState::Suspended, true) => (
            Phase::Suspended,
            "False",
            reason::SUSPENDED,
            "the machine is suspended: see the Suspended condition".to_string(),
        ),
        (state, false) if goal == RunGoal::Exited && *state != MachineState::Running => {
            (Phase::Stopped, "False", reason::EXITED, exited_message(policy))
        }
        (MachineState::Running, false) => (
            Phase::Running,
            "False",
            reason::STOPPED,
            "the machine is being stopped".into(),
        ),
        (MachineState::Failed, _) => (
            Phase::Failed,
            "False",
            "MachineFailed",
            format!("smolvm reports the machine as {}", m.runtime_state),
        ),
        (_, false) => (
            Phase::Stopped,
            "True",
            reason::STOPPED,
            "the machine is stopped as asked".into(),
        ),
        (_, true) => (
            Phase::Creating,
            "False",
            reason::CREATING,
            "the machine is starting".into(),
        ),
    };
    status.phase = Some(phase);
    set_condition(
        &mut status.conditions,
        condition::READY,
        ready,
        why,
        &message,
        generation,
        now,
    );
    status.effective = Some(effective_of(m));
}
