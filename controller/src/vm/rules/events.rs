//! The events of a pass: one per transition its machine actions made ([`step_events`]), and
//! one for a phase transition no action told ([`transition_event`]).

use smolvm_api::{
    Phase, SmolVMStatus,
    constants::{condition, reason},
    nodeapi::ResizeSpec,
};

use super::machine::MachineAction;
use super::run_goal::RunGoal;

/// A Normal event for a machine action a pass took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepEvent {
    /// Event reason: Created, Started, Restarted, Stopped or Resized.
    pub reason: &'static str,
    /// Event action: Create, Start, Stop or Resize.
    pub action: &'static str,
    /// Event note, naming the machine and the node.
    pub note: String,
}

/// How a pass's create made the machine, when it was not made cold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made<'a> {
    /// Served from a ready slot of this SmolVMPool.
    Served(&'a str),
    /// Branched from the running machine of this SmolVM, in this many milliseconds (the node
    /// call's time: smolvm's branch and the agent's way to it).
    Branched {
        /// The source SmolVM.
        source: &'a str,
        /// How long the node took.
        millis: u128,
    },
}

/// One event per transition the actions `done` of a pass made: a create immediately followed by
/// a start is one transition, "Started", that says both; a start after the workload exited under
/// restartPolicy Always is "Restarted"; a create served from a pool or branched from a source
/// says so (`made`).
pub fn step_events(
    done: &[MachineAction],
    made: Option<Made<'_>>,
    goal: RunGoal,
    machine: &str,
    node: &str,
) -> Vec<StepEvent> {
    let event = |reason, action, note| StepEvent { reason, action, note };
    let mut events = Vec::new();
    let mut i = 0;
    while i < done.len() {
        let e = match (&done[i], done.get(i + 1), made) {
            // A create served from a ready slot, or branched from a running source: the machine
            // runs already, and this one event says both where it came from and that it runs.
            (MachineAction::Create(_), _, Some(made)) => made_event(made, machine, node),
            (MachineAction::Create(_), Some(MachineAction::EnsureRunning), _) => {
                i += 1;
                event(
                    "Started",
                    "Start",
                    format!("created and started machine {machine} on node {node}"),
                )
            }
            (MachineAction::Create(_), _, _) => {
                event("Created", "Create", format!("created machine {machine} on node {node}"))
            }
            (MachineAction::EnsureRunning, _, _) if goal == RunGoal::Restart => event(
                reason::RESTARTED,
                "Start",
                format!(
                    "the workload of machine {machine} on node {node} exited on its own; restartPolicy Always started it again"
                ),
            ),
            (MachineAction::EnsureRunning, _, _) => {
                event("Started", "Start", format!("machine {machine} runs on node {node}"))
            }
            (MachineAction::Stop, _, _) => {
                event("Stopped", "Stop", format!("stopped machine {machine} on node {node}"))
            }
            (MachineAction::Suspend, _, _) => event(
                reason::SUSPENDED,
                "Suspend",
                format!(
                    "suspended machine {machine} on node {node}: its memory and disks are saved there, and its CPU and memory are given back to the node"
                ),
            ),
            (MachineAction::Resume, _, _) => event(
                reason::RESUMED,
                "Resume",
                format!("resumed machine {machine} on node {node} with its processes as they were"),
            ),
            (MachineAction::Discard, _, _) => event(
                reason::SAVED_STATE_DISCARDED,
                "Stop",
                format!(
                    "spec.running is false: stopped suspended machine {machine} on node {node} and discarded its saved memory; it boots afresh when it runs again"
                ),
            ),
            (MachineAction::Resize(spec), _, _) => event(
                "Resized",
                "Resize",
                format!("resized machine {machine} on node {node} to {}", describe(spec)),
            ),
            (MachineAction::BindVolumes(holder), _, _) => event(
                "VolumesBound",
                "Bind",
                format!(
                    "pointed the volumes of machine {machine} on node {node} at holder Pod {holder}, which has mounted them"
                ),
            ),
            (MachineAction::ResizePending(_) | MachineAction::None, _, _) => {
                i += 1;
                continue;
            }
        };
        events.push(e);
        i += 1;
    }
    events
}

/// The one event of a create served from a pool or branched from a source.
fn made_event(made: Made<'_>, machine: &str, node: &str) -> StepEvent {
    match made {
        Made::Served(pool) => StepEvent {
            reason: reason::SERVED_FROM_POOL,
            action: "Create",
            note: format!("served machine {machine} on node {node} from a ready slot of pool {pool}: it runs"),
        },
        Made::Branched { source, millis } => StepEvent {
            reason: reason::BRANCHED,
            action: "Create",
            note: format!(
                "branched machine {machine} on node {node} from the running SmolVM {source} in {millis} ms: it runs"
            ),
        },
    }
}

/// A resize in words: `4 CPUs, 30 GiB storage`.
fn describe(spec: &ResizeSpec) -> String {
    let parts: Vec<String> = [
        spec.cpus.map(|c| format!("{c} CPUs")),
        spec.memory_mib.map(|m| format!("{m} MiB memory")),
        spec.storage_gib.map(|s| format!("{s} GiB storage")),
        spec.overlay_gib.map(|o| format!("{o} GiB overlay")),
    ]
    .into_iter()
    .flatten()
    .collect();
    parts.join(", ")
}

/// An event for a phase transition no machine action of the pass already told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionEvent {
    /// Warning (a failure) or Normal (progress or recovery).
    pub warning: bool,
    /// Event reason: `Recovered`, or the Ready reason reached (`Running`, `Stopped`,
    /// `Creating`, `MachineFailed`).
    pub reason: String,
    /// Event note.
    pub note: String,
}

/// The event for the transition from `before` to `after` that a converge pass observed, if any.
/// `steps_reported`: the pass already published an event for a machine action it took (create,
/// start, stop, resize), which tells this transition. A status without a Ready condition was never
/// converged: its first pass creates the machine, and that action has its event.
pub fn transition_event(
    before: Option<&SmolVMStatus>,
    after: &SmolVMStatus,
    steps_reported: bool,
) -> Option<TransitionEvent> {
    if steps_reported {
        return None;
    }
    let ready = |s: &SmolVMStatus| s.conditions.iter().find(|c| c.type_ == condition::READY).cloned();
    let before = before?;
    let was = ready(before)?;
    let is = ready(after)?;
    let (from, to) = (before.phase.unwrap_or_default(), after.phase.unwrap_or_default());
    if from == to && was.status == is.status && was.reason == is.reason {
        return None;
    }
    let node = after.node_name.as_deref().unwrap_or("its node");
    let note = format!("{} on node {node} (was {}: {})", is.message, from.as_str(), was.reason);
    if to == Phase::Failed {
        return Some(TransitionEvent {
            warning: true,
            reason: is.reason,
            note,
        });
    }
    let recovered = matches!(from, Phase::Unknown | Phase::Failed) || was.status == "Unknown";
    Some(TransitionEvent {
        warning: false,
        reason: if recovered { "Recovered".into() } else { is.reason },
        note,
    })
}
