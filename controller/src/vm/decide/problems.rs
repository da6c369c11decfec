//! The Ready condition of a pass that cannot go on: a node that cannot be vouched for
//! ([`unhealthy`]), a node call that failed ([`call_failure`]), a workload configuration that
//! could not be read; with their Warning events.

use smolvm_api::{
    Phase,
    constants::{condition, reason},
    nodeapi::{ErrorCode, MachineStatus},
};

use super::observed::Observed;
use super::outcome::{Note, Outcome, Requeue};
use super::pass::{Call, Failure};
use crate::vm::rules::NodeHealth;

/// The Ready condition's (status, reason, message) when the node cannot be vouched for.
pub(super) fn unhealthy(o: &Observed) -> Option<(&'static str, &'static str, String)> {
    let node = o.node;
    match &o.health {
        NodeHealth::Healthy => None,
        NodeHealth::Missing => Some((
            "Unknown",
            reason::NODE_MISSING,
            format!("node {node} has no SmolVMNode; the binding stays"),
        )),
        NodeHealth::Replaced { bound, reported } => Some((
            "False",
            reason::NODE_REPLACED,
            format!(
                "node {node} was replaced (bound to UID {bound}, it now reports {reported}); the machine is not adopted and the binding stays; delete and recreate the SmolVM"
            ),
        )),
        NodeHealth::Unreachable { why } => Some((
            "Unknown",
            reason::NODE_UNREACHABLE,
            format!("node {node} is unreachable: {why}"),
        )),
    }
}

/// Phase and Ready reason after a node API call failed with an error other than unreachable:
/// the reason names the operation that failed (or smolvm's start failure, whatever the call).
/// `None` keeps the phase: a failed stop or resize leaves the machine as it was.
pub fn call_failure(call: &Call, code: Option<&ErrorCode>) -> (Option<Phase>, &'static str) {
    if code == Some(&ErrorCode::StartFailed) {
        return (Some(Phase::Failed), reason::START_FAILED);
    }
    if code == Some(&ErrorCode::HostPortInUse)
        && matches!(
            call,
            Call::Create(_) | Call::Lease { .. } | Call::Branch { .. } | Call::EnsureRunning
        )
    {
        return (Some(Phase::Failed), reason::HOST_PORT_IN_USE);
    }
    // The agent's own refusals, whatever admission did: an excluded host port (create), a
    // private image started without credentials (start).
    if code == Some(&ErrorCode::HostPortExcluded) {
        return (Some(Phase::Failed), reason::HOST_PORT_EXCLUDED);
    }
    if code == Some(&ErrorCode::ImagePullCredentialsRequired) {
        return (Some(Phase::Failed), reason::IMAGE_PULL_CREDENTIALS_REQUIRED);
    }
    match call {
        // The source's machine stopped, or is being made again, since the pass looked: the
        // branch waits for it.
        Call::Branch { .. } if matches!(code, Some(ErrorCode::SourceNotRunning | ErrorCode::SourceNotFound)) => {
            (Some(Phase::Scheduled), reason::BRANCH_PENDING)
        }
        Call::Branch { .. } => (Some(Phase::Failed), reason::CREATE_FAILED),
        Call::Get => (Some(Phase::Unknown), "RuntimeError"),
        Call::Create(_) | Call::Lease { .. } => (Some(Phase::Failed), reason::CREATE_FAILED),
        Call::EnsureRunning => (Some(Phase::Failed), reason::START_FAILED),
        Call::Stop | Call::Discard => (None, reason::STOP_FAILED),
        Call::Resize(_) => (None, reason::RESIZE_FAILED),
        Call::Suspend => (None, reason::SUSPEND_FAILED),
        Call::Resume => (None, reason::RESUME_FAILED),
        // The agent refused the new holder (not the SmolVM's, or a path outside it) or found a
        // volume not mounted yet: the machine stays stopped, as it was.
        Call::BindVolumes(_) => match code {
            Some(ErrorCode::HolderNotOwned | ErrorCode::VolumePathOutsideHolder) => (None, reason::HOLDER_CONFLICT),
            _ => (None, reason::HOLDER_PENDING),
        },
    }
}

impl Outcome {
    /// A problem on the Ready condition: the phase, the condition, and a Warning event when the
    /// condition changed. Looked at again after the retry interval.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn problem(
        &mut self,
        o: &Observed,
        phase: Phase,
        status: &str,
        why: &str,
        message: String,
        event_reason: &str,
        action: &'static str,
        note: Option<String>,
    ) {
        self.status.phase = Some(phase);
        if self.set(o, condition::READY, status, why, &message) {
            self.events
                .push(Note::warning(event_reason, action, note.unwrap_or(message)));
        }
        self.requeue = Requeue::Retry;
    }

    /// A failed call (or a configuration that could not be read) ends the pass.
    pub(super) fn failed(&mut self, o: &Observed, call: &Call, failure: &Failure, machine: Option<&MachineStatus>) {
        let node = o.node;
        match failure {
            Failure::Call(e) if e.is_unreachable() => {
                let message = format!("node {node} is unreachable: {}", e.message());
                let why = reason::NODE_UNREACHABLE;
                self.problem(o, Phase::Unknown, "Unknown", why, message, why, "Observe", None);
            }
            Failure::Call(e) => {
                let (phase, why) = call_failure(call, e.code());
                let phase = phase.or(self.status.phase).unwrap_or(Phase::Unknown);
                let note = Some(format!("node {node}: {}", e.message()));
                self.problem(o, phase, "False", why, e.message().to_string(), why, "Converge", note);
            }
            Failure::Config { reason: why, message } => {
                let phase = if machine.is_some() {
                    Phase::Stopped
                } else {
                    Phase::Scheduled
                };
                let action = if matches!(call, Call::Create(_) | Call::Lease { .. } | Call::Branch { .. }) {
                    "Create"
                } else {
                    "Start"
                };
                self.problem(o, phase, "False", why, message.clone(), why, action, None);
                // Retried with a backoff (1 s doubling to 30 s), so the VM proceeds soon after
                // the missing object appears or the permission is granted.
                self.requeue = Requeue::Unsettled;
            }
        }
    }
}
