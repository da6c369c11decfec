//! The course of one pass: the node calls it makes ([`Call`]), why one did not happen
//! ([`Failure`]), what the pass has done so far ([`Progress`]), the next thing it does
//! ([`Decision`]), and how it goes once the machine was read ([`Course`]).

use smolvm_api::{
    BranchedFrom,
    nodeapi::{ErrorCode, MachineSpec, MachineStatus, Operation, ResizeSpec, VolumeMounts},
};

use super::outcome::{ExposureWrite, Outcome};
use crate::nodeclient::CallError;
use crate::vm::rules::{MachineAction, Restart, RunGoal};
use crate::vm::volumes::Verdict;

/// A node call a pass makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Read the machine.
    Get,
    /// Create it (the environment is resolved from Secrets and ConfigMaps as it is made).
    Create(Box<MachineSpec>),
    /// Make it from a ready slot of its pool on its node (the environment resolved as for a
    /// create): node pool `node_pool` of SmolVMPool `pool`; `spec` is the create it stands for.
    Lease {
        /// The create the lease stands for.
        spec: Box<MachineSpec>,
        /// The node pool on the node.
        node_pool: String,
        /// The SmolVMPool's name.
        pool: String,
    },
    /// Make it a copy-on-write branch of its running source's machine `source` on its node (the
    /// branch's own environment resolved as for a create); `spec` is the create it stands for.
    Branch {
        /// The create the branch stands for.
        spec: Box<MachineSpec>,
        /// The source's machine on the node.
        source: String,
        /// The source SmolVM's name and UID, for `status.branchedFrom`.
        from: BranchedFrom,
    },
    /// Start it unless it runs (with the registry credential of its pull secrets).
    EnsureRunning,
    /// Stop it.
    Stop,
    /// Change its sizes.
    Resize(ResizeSpec),
    /// Suspend it (it runs).
    Suspend,
    /// Resume it (it is suspended, and the node has room for it).
    Resume,
    /// Stop a suspended machine, discarding its saved memory (`spec.running` is false).
    Discard,
    /// Point the stopped machine's mounts at a new holder Pod's volumes.
    BindVolumes(Box<VolumeMounts>),
}

impl Call {
    /// The node API operation this call is (its name labels the latency metric and the logs).
    pub fn operation(&self) -> Operation {
        match self {
            Call::Get => Operation::GetMachine,
            Call::Create(_) => Operation::CreateMachine,
            Call::Lease { .. } => Operation::LeaseMachine,
            Call::Branch { .. } => Operation::BranchMachine,
            Call::EnsureRunning => Operation::EnsureMachineRunning,
            Call::Stop => Operation::StopMachine,
            Call::Resize(_) => Operation::ResizeMachine,
            Call::Suspend => Operation::SuspendMachine,
            Call::Resume => Operation::ResumeMachine,
            Call::Discard => Operation::StopMachine,
            Call::BindVolumes(_) => Operation::BindVolumes,
        }
    }

    /// The machine action this call carries out (`None` for a read).
    pub fn action(&self) -> Option<MachineAction> {
        match self {
            Call::Get => None,
            Call::Create(spec) | Call::Lease { spec, .. } | Call::Branch { spec, .. } => {
                Some(MachineAction::Create(spec.clone()))
            }
            Call::EnsureRunning => Some(MachineAction::EnsureRunning),
            Call::Stop => Some(MachineAction::Stop),
            Call::Resize(spec) => Some(MachineAction::Resize(*spec)),
            Call::Suspend => Some(MachineAction::Suspend),
            Call::Resume => Some(MachineAction::Resume),
            Call::Discard => Some(MachineAction::Discard),
            Call::BindVolumes(mounts) => Some(MachineAction::BindVolumes(mounts.holder_uid.clone())),
        }
    }
}

/// Why a call of the pass did not happen.
#[derive(Debug)]
pub enum Failure {
    /// The node API call failed.
    Call(CallError),
    /// The workload's configuration could not be read: a condition reason and its message.
    Config {
        /// Ready reason.
        reason: &'static str,
        /// Ready message.
        message: String,
    },
}

/// What the pass has done so far.
#[derive(Debug, Default)]
pub struct Progress {
    /// The machine as the node first reported it in this pass: `None` until asked, then
    /// `Some(None)` when the node has none.
    pub observed: Option<Option<MachineStatus>>,
    /// The machine as the last call left it.
    pub machine: Option<MachineStatus>,
    /// The machine actions carried out, in order.
    pub done: Vec<MachineAction>,
    /// The SmolVMPool whose ready slot served the pass's create, when one did.
    pub served_from: Option<String>,
    /// The source a branch was made from by this pass, and how long the node took to make it.
    pub branched: Option<(BranchedFrom, std::time::Duration)>,
    /// How long the last node call took.
    pub took: std::time::Duration,
    /// A lease of this pass found no ready slot (or no node pool) on the node: the create goes
    /// as the pool's `whenEmpty` says.
    pub pool_empty: bool,
    /// The call that failed, which ends the pass.
    pub failed: Option<(Call, Failure)>,
    /// The Service and EndpointSlice writes made before the first machine call (a start may
    /// take half a minute where a guest cannot boot); the report does not repeat them.
    pub exposed: Option<Vec<ExposureWrite>>,
}

impl Progress {
    /// Records a call's result.
    pub fn record(&mut self, call: Call, result: Result<Option<MachineStatus>, Failure>) {
        match result {
            Ok(machine) if call == Call::Get => {
                self.observed = Some(machine.clone());
                self.machine = machine;
            }
            Ok(machine) => {
                if let Call::Lease { pool, .. } = &call {
                    self.served_from = Some(pool.clone());
                }
                if let Call::Branch { from, .. } = &call {
                    self.branched = Some((from.clone(), self.took));
                }
                if let Some(action) = call.action() {
                    self.done.push(action);
                }
                self.machine = machine;
            }
            Err(Failure::Call(e))
                if matches!(call, Call::Lease { .. })
                    && matches!(e.code(), Some(ErrorCode::NoReadySlot | ErrorCode::PoolNotFound)) =>
            {
                self.pool_empty = true;
            }
            Err(failure) => self.failed = Some((call, failure)),
        }
    }

    pub(super) fn did(&self, action: fn(&MachineAction) -> bool) -> bool {
        self.done.iter().any(action)
    }

    /// Whether the pass made, started or resumed the machine: from then it was quiet for no
    /// time yet (SPEC 2.7).
    pub fn started(&self) -> bool {
        self.did(|a| {
            matches!(
                a,
                MachineAction::EnsureRunning | MachineAction::Resume | MachineAction::Create(_)
            )
        })
    }
}

/// The next thing a pass does.
#[derive(Debug)]
pub enum Decision {
    /// Make this node call, then decide again. `record_first` is a restart request to record in
    /// `status.restartHandled` before the call (the stop of a restart), so that a pass after a
    /// failure never restarts the machine twice.
    Act {
        /// The call.
        call: Call,
        /// The restart request to record first.
        record_first: Option<String>,
        /// Service and EndpointSlice writes to make before the call (on the pass's first machine
        /// call), so that the Service never waits for a slow start.
        expose_first: Vec<ExposureWrite>,
    },
    /// Nothing more to call: report.
    Report(Box<Outcome>),
}

/// How a pass goes once the machine was read: the run goal, whether a lost machine is made anew,
/// what a restart request asks, and what its volumes decided.
#[derive(Debug, Clone, Copy)]
pub(super) struct Course<'v> {
    /// The run goal.
    pub(super) goal: RunGoal,
    /// Whether a lost machine is made anew.
    pub(super) recreating: bool,
    /// What a restart request asks.
    pub(super) restart: Restart,
    /// What its volumes decided.
    pub(super) volumes: Option<&'v Verdict>,
}
