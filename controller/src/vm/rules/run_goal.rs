//! Whether the machine runs in a pass: what a restart request asks ([`restart`]), and the run
//! goal that `spec.running` and the restart policy give ([`run_goal`]).

use smolvm_api::{
    Phase, SmolVM,
    constants::{condition, reason},
    nodeapi::{MachineState, MachineStatus},
    types::RestartPolicy,
};

/// The restart request on `vm` (the value of [`smolvm_api::constants::RESTART_ANNOTATION`]),
/// if any.
pub fn restart_request(vm: &SmolVM) -> Option<&str> {
    vm.metadata
        .annotations
        .as_ref()?
        .get(smolvm_api::constants::RESTART_ANNOTATION)
        .map(String::as_str)
}

/// The longest restart request acted on (`status.restartHandled` holds it); `kubectl smolvm
/// restart` writes an RFC 3339 time, far shorter. A longer value is dropped with an event.
pub const MAX_RESTART_REQUEST: usize = 256;

/// What a restart request asks of this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// No request.
    None,
    /// Stop the running machine first, then run it (whatever the restart policy).
    StopThenRun,
    /// The machine does not run: run it.
    Run,
    /// `spec.running` is false, or the SmolVM is suspended: nothing runs to restart; the request
    /// is dropped with an event.
    Skip,
    /// The request was acted on already (`status.restartHandled` holds its value; the
    /// annotation's removal failed after): only the annotation is dropped.
    Done,
}

/// Decides what a restart request means for the machine the node reports.
pub fn restart(vm: &SmolVM, machine: Option<&MachineStatus>) -> Restart {
    let Some(requested) = restart_request(vm) else {
        return Restart::None;
    };
    if vm.status.as_ref().and_then(|s| s.restart_handled.as_deref()) == Some(requested) {
        return Restart::Done;
    }
    if !vm.spec.running() || vm.spec.suspended() || requested.len() > MAX_RESTART_REQUEST {
        return Restart::Skip;
    }
    match machine {
        Some(m) if m.state == MachineState::Running => Restart::StopThenRun,
        _ => Restart::Run,
    }
}

/// Whether the machine should run in this pass, as `spec.running` and the restart policy decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunGoal {
    /// `spec.running` is false: stop it, keep it stopped.
    Stop,
    /// Run it (and start it if it is not running: it was never started, was stopped on
    /// purpose, or its start failed).
    Run,
    /// It ran, stopped on its own, and restartPolicy Always starts it again.
    Restart,
    /// It ran and exited on its own; the restart policy (Never, or OnFailure after a clean exit,
    /// smolvm having restarted failed ones) keeps it stopped until `spec.running` goes false and
    /// back to true.
    Exited,
}

impl RunGoal {
    /// Whether the machine should be running.
    pub fn running(self) -> bool {
        matches!(self, RunGoal::Run | RunGoal::Restart)
    }
}

/// Decides [`RunGoal`] from the SmolVM and the machine its node reports.
///
/// A machine "ran" when the last status the controller wrote says so: phase Running with Ready
/// True (reason Running). The controller stops a machine only when `spec.running` is false, so a
/// machine that ran and is now not running while `spec.running` is true stopped on its own (its
/// workload exited, or the node restarted). An exit is remembered as Ready reason Exited, which
/// `spec.running: false` replaces with Stopped; a start that failed is retried whatever the policy,
/// as a Pod's is.
pub fn run_goal(vm: &SmolVM, machine: Option<&MachineStatus>) -> RunGoal {
    if !vm.spec.running() {
        return RunGoal::Stop;
    }
    let Some(m) = machine else { return RunGoal::Run };
    // A suspended machine was stopped by the controller, not by its workload.
    if matches!(m.state, MachineState::Running | MachineState::Suspended) {
        return RunGoal::Run;
    }
    let status = vm.status.as_ref();
    let ready_reason = status
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == condition::READY))
        .map(|c| (c.status.as_str(), c.reason.as_str()));
    let exit_remembered = ready_reason.is_some_and(|(_, why)| why == reason::EXITED);
    let ran = status.and_then(|s| s.phase) == Some(Phase::Running) && ready_reason == Some(("True", reason::RUNNING));
    match (vm.spec.restart_policy(), exit_remembered, ran) {
        (RestartPolicy::Always, _, true) => RunGoal::Restart,
        (RestartPolicy::Always, _, false) => RunGoal::Run,
        (_, true, _) | (_, _, true) => RunGoal::Exited,
        _ => RunGoal::Run,
    }
}

/// The Ready message of a machine whose workload exited and stays stopped.
pub fn exited_message(policy: RestartPolicy) -> String {
    let why = match policy {
        RestartPolicy::OnFailure => {
            "restartPolicy OnFailure keeps it stopped after a clean exit (smolvm restarts it after a failed one)"
        }
        RestartPolicy::Never | RestartPolicy::Always => "restartPolicy Never keeps it stopped",
    };
    format!(
        "the workload exited on its own; {why}. To run it again, set spec.running to false, wait for the Stopped reason, then set it to true"
    )
}
