//! Decide: what one pass over a bound SmolVM does next, as a pure function of what was observed
//! ([`Observed`]) and what the pass has done so far ([`Progress`]).
//!
//! [`converge`] answers either with the next node call to make ([`Decision::Act`]) or, once
//! nothing more is to be done in this pass, with the whole [`Outcome`]: the status to write, the
//! Service and EndpointSlice writes, the events, the annotations to drop and when to look again.
//! Every phase and condition of a bound SmolVM is chosen here, and exposure is decided on every
//! path, whatever the machine calls did. The placement and deletion steps have their own small
//! decisions ([`bound`], [`unschedulable`], [`deletion_blocked`]).

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    jiff::Timestamp,
};
use kube::ResourceExt;
use smolvm_api::{
    NodeResources, Phase, SmolVM, SmolVMNode, SmolVMStatus,
    constants::{FORCE_DELETE_ANNOTATION, RECREATE_LOST_MACHINE_ANNOTATION, RESTART_ANNOTATION, condition, reason},
    nodeapi::{ErrorCode, MachineSpec, MachineState, MachineStatus, Operation, ResizeSpec, VolumeMounts},
};

use super::exposure::{self, Exposure, NotExposed};
use super::rules::{self, MachineAction, MissingMachine, NodeHealth, Restart, RunGoal, Want};
use super::volumes::{self, Verdict, VolumeWrite};
use crate::nodeclient::CallError;
use crate::placement::Hold;

/// Machine steps one pass may take (create, start, suspend, and one spare), besides a restart's
/// stop.
pub const MAX_STEPS_PER_PASS: usize = 4;

/// How soon a resume that waits for room on its node looks again (room frees up without any
/// change to this SmolVM or its node: another VM is deleted, stopped or suspended).
pub const RESUME_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// What a pass over a bound SmolVM observed before acting, from the caches.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The SmolVM as the cache holds it.
    pub vm: &'a SmolVM,
    /// The node it is bound to.
    pub node: &'a str,
    /// Its machine's name on that node.
    pub machine: &'a str,
    /// The node's SmolVMNode, if there is one.
    pub node_object: Option<&'a SmolVMNode>,
    /// The node's health as the controller judges it ([`rules::node_health`]).
    pub health: NodeHealth,
    /// The Service of the SmolVM's name, if one exists (whoever owns it).
    pub service: Option<&'a Service>,
    /// The EndpointSlice of the SmolVM's name, if one exists (whoever owns it).
    pub slice: Option<&'a EndpointSlice>,
    /// What the node has for this VM, for a resize.
    pub room: Room,
    /// The controller's clock.
    pub now: Timestamp,
    /// How long the machine's next start waits: its last start failed that recently (the
    /// backoff of [`super::StartFailures`], as the kubelet's CrashLoopBackOff).
    pub start_backoff: Option<std::time::Duration>,
    /// What was observed of its volumes; `None` for a SmolVM without volumes.
    pub volumes: Option<&'a volumes::Seen>,
}

/// What a node has for one VM: its allocatable (when it reports one) and what every other VM
/// bound there holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Room {
    /// The node's allocatable.
    pub allocatable: Option<NodeResources>,
    /// What the other VMs bound there hold.
    pub others: NodeResources,
}

/// A node call a pass makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Read the machine.
    Get,
    /// Create it (the environment is resolved from Secrets and ConfigMaps as it is made).
    Create(Box<MachineSpec>),
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
            Call::Create(spec) => Some(MachineAction::Create(spec.clone())),
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
                if let Some(action) = call.action() {
                    self.done.push(action);
                }
                self.machine = machine;
            }
            Err(failure) => self.failed = Some((call, failure)),
        }
    }

    fn did(&self, action: fn(&MachineAction) -> bool) -> bool {
        self.done.iter().any(action)
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

/// What a pass reports: one status write, the exposure writes before it, then events and the
/// annotations it drops.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The status to write (not written when it equals the stored one).
    pub status: SmolVMStatus,
    /// The Service and EndpointSlice writes, and the ServiceExposed condition they give.
    pub exposure: Exposing,
    /// Events, in order.
    pub events: Vec<Note>,
    /// Annotations to drop after the status write.
    pub drops: Vec<AnnotationDrop>,
    /// When to look again.
    pub requeue: Requeue,
    /// What the VM holds on its node now, as the machine the pass left says (its CPU and memory
    /// given back while suspended); `None` when the pass did not learn the machine's state.
    pub hold: Option<Hold>,
    /// The writes of the claims and the holder Pod its volumes need, before the status write.
    pub volumes: Vec<VolumeWrite>,
}

impl Outcome {
    /// Whether the pass's own events tell where the VM was bound, so that a binding written with
    /// this outcome needs no Scheduled event of its own: a warm claim's ServedFromPool names the
    /// node, the machine and the pool (one event per warm claim, not two).
    pub fn tells_binding(&self) -> bool {
        self.events.iter().any(|e| e.reason == reason::SERVED_FROM_POOL)
    }
}

/// An event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Warning rather than Normal.
    pub warning: bool,
    /// Reason.
    pub reason: String,
    /// Action.
    pub action: &'static str,
    /// Note.
    pub note: String,
}

impl Note {
    /// A SmolVM bound to a node.
    pub fn bound(note: String) -> Self {
        Note::normal("Scheduled", "Bind", note)
    }

    pub(crate) fn normal(reason: impl Into<String>, action: &'static str, note: String) -> Self {
        Note {
            warning: false,
            reason: reason.into(),
            action,
            note,
        }
    }

    fn warning(reason: impl Into<String>, action: &'static str, note: String) -> Self {
        Note {
            warning: true,
            reason: reason.into(),
            action,
            note,
        }
    }
}

/// An annotation the pass is done with, dropped only while it still holds `value` (a JSON patch
/// `test`), with the event that tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationDrop {
    /// The annotation.
    pub key: &'static str,
    /// The value acted on.
    pub value: String,
    /// A newer value written meanwhile (the test fails) is left for the next pass, silently.
    pub newer_may_replace: bool,
    /// The event, once dropped.
    pub then: Note,
}

/// When to look at the SmolVM again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// On its next change only.
    AwaitChange,
    /// After the retry interval (a node or call problem).
    Retry,
    /// Settled: after the slow resync.
    Settled,
    /// Still on its way: soon, with a backoff that grows while it does not settle.
    Unsettled,
    /// After this long (a start held back after a failed one).
    After(std::time::Duration),
}

/// The exposure writes of a pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exposing {
    /// The writes, in order.
    pub writes: Vec<ExposureWrite>,
    /// The ServiceExposed condition once they succeed: `None` removes it.
    pub condition: Option<(&'static str, &'static str, String)>,
    /// Whether a failed write is a removal (for its message).
    pub removing: bool,
}

/// One write of a Service or EndpointSlice.
#[derive(Debug, Clone, PartialEq)]
pub enum ExposureWrite {
    /// Server-side apply of the Service.
    ApplyService(Box<Service>),
    /// Server-side apply of the EndpointSlice.
    ApplySlice(Box<EndpointSlice>),
    /// Delete the EndpointSlice: exposure is off, or, before its apply, the node's address
    /// changed family (addressType is immutable).
    DeleteSlice,
    /// Delete the Service.
    DeleteService,
}

/// Decides the next step of a pass over a bound SmolVM. A SmolVM with volumes has them judged
/// on every decision ([`volumes::judge`], from the machine as the pass left it): what they mean
/// for the next machine call, then VolumesReady and the claim and holder writes on its outcome.
pub fn converge(o: &Observed, p: &Progress) -> Decision {
    let machine = p.observed.as_ref().map(|_| p.machine.as_ref());
    let verdict = o.volumes.map(|seen| volumes::judge(o.vm, o.node, seen, machine));
    match converge_with(o, p, verdict.as_ref()) {
        Decision::Report(mut out) => {
            out.volumes(o.vm, verdict.as_ref(), o.now);
            Decision::Report(out)
        }
        act => act,
    }
}

/// [`converge`], the volumes judged.
fn converge_with(o: &Observed, p: &Progress, verdict: Option<&Verdict>) -> Decision {
    let vm = o.vm;
    let mut out = Outcome::of(vm);
    if let Some((status, why, message)) = unhealthy(o) {
        out.expose(o, p, false);
        out.problem(o, Phase::Unknown, status, why, message, why, "Observe", None);
        return Decision::Report(Box::new(out));
    }
    if let Some((Call::Get, failure)) = &p.failed {
        out.expose(o, p, false);
        out.failed(o, &Call::Get, failure, None);
        return Decision::Report(Box::new(out));
    }
    let Some(observed) = &p.observed else {
        return Decision::Act {
            call: Call::Get,
            record_first: None,
            expose_first: Vec::new(),
        };
    };
    let desired = match rules::machine_spec(vm) {
        Ok(mut desired) => {
            desired.volumes = verdict.and_then(|v| v.mounts.clone());
            desired
        }
        Err(message) => {
            out.status.phase = Some(Phase::Failed);
            out.set(o, condition::READY, "False", "InvalidSpec", &message);
            out.expose(o, p, false);
            out.requeue = Requeue::AwaitChange;
            return Decision::Report(Box::new(out));
        }
    };
    let recreating = observed.is_none() && rules::missing_machine(vm) == MissingMachine::Recreate;
    if observed.is_none() && rules::missing_machine(vm) == MissingMachine::Lost {
        let message = format!(
            "machine {} existed on node {} and is gone (its state there was removed); it is not re-created empty.{} To start over with a fresh, empty machine, annotate the SmolVM with {RECREATE_LOST_MACHINE_ANNOTATION}=true",
            o.machine,
            o.node,
            o.volumes
                .and_then(|seen| volumes::lost_data(vm, seen))
                .unwrap_or_default(),
        );
        out.expose(o, p, false);
        let why = reason::MACHINE_LOST;
        out.problem(o, Phase::Failed, "False", why, message, why, "Observe", None);
        return Decision::Report(Box::new(out));
    }
    // A restart request (`kubectl smolvm restart`): a running machine is stopped and started
    // again whatever the restart policy. The request is recorded in `status.restartHandled`
    // (before the stop, so a failure after it never restarts twice) and its annotation is
    // dropped by the next pass, which sees it handled.
    let restart = rules::restart(vm, observed.as_ref());
    let goal = goal_of(o, p, restart, verdict);
    let requested = rules::restart_request(vm);
    if matches!(restart, Restart::StopThenRun | Restart::Run) {
        out.status.restart_handled = requested.map(str::to_string);
    }
    let restart_stop_done = p.did(|a| matches!(a, MachineAction::Stop));
    if restart == Restart::StopThenRun && !restart_stop_done && p.failed.is_none() {
        return machine_call(o, p, Call::Stop, requested.map(str::to_string));
    }
    proceed(
        o,
        p,
        out,
        &desired,
        Course {
            goal,
            recreating,
            restart,
            volumes: verdict,
        },
    )
}

/// The run goal of the machine the node reported first in this pass, as a restart request,
/// `spec.running` and the restart policy have it. A machine its holder's eviction stopped did
/// not exit on its own: it runs again once a new holder has mounted its volumes (and this pass
/// pointed it at them), whatever its restart policy.
fn goal_of(o: &Observed, p: &Progress, restart: Restart, verdict: Option<&Verdict>) -> RunGoal {
    let observed = p.observed.as_ref().and_then(|m| m.as_ref());
    let goal = match restart {
        Restart::StopThenRun | Restart::Run => RunGoal::Run,
        Restart::None | Restart::Skip | Restart::Done => rules::run_goal(o.vm, observed),
    };
    let evicted = verdict.is_some_and(|v| v.evicted) || p.did(|a| matches!(a, MachineAction::BindVolumes(_)));
    match goal {
        RunGoal::Exited | RunGoal::Restart if evicted => RunGoal::Run,
        goal => goal,
    }
}

/// How a pass goes once the machine was read: the run goal, whether a lost machine is made anew,
/// what a restart request asks, and what its volumes decided.
#[derive(Debug, Clone, Copy)]
struct Course<'v> {
    goal: RunGoal,
    recreating: bool,
    restart: Restart,
    volumes: Option<&'v Verdict>,
}

/// The machine steps after the read: the next call, or the report of a pass that failed, is held
/// back, or went as far as it should.
fn proceed(o: &Observed, p: &Progress, mut out: Outcome, desired: &MachineSpec, course: Course) -> Decision {
    let Course {
        goal,
        recreating,
        restart,
        ..
    } = course;
    let mut settled = false;
    let mut warnings = Vec::new();
    let mut resume_pending = None;
    let mut waits = None;
    match &p.failed {
        Some((_, Failure::Call(e))) if e.code() == Some(&ErrorCode::ResizeRequiresRunning) => {
            out.set(
                o,
                condition::RESIZE_PENDING,
                "True",
                reason::RESIZE_NOT_APPLIED,
                e.message(),
            );
            settled = true;
        }
        Some((call, failure)) => {
            out.after_failure(o, p, goal, recreating, restart);
            out.failed(o, call, failure, p.machine.as_ref());
            return Decision::Report(Box::new(out));
        }
        None if start_held(o, p, desired, goal, restart) => {
            // A start that failed moments ago is not made again at once (a pass follows each
            // status write): the status stays as the failure left it, the exposure is kept, and
            // the start is made when the backoff ends.
            let runs = p.machine.as_ref().is_some_and(|m| m.state == MachineState::Running);
            out.expose(o, p, runs);
            out.requeue = Requeue::After(o.start_backoff.unwrap_or_default());
            return Decision::Report(Box::new(out));
        }
        None => {
            let budget = MAX_STEPS_PER_PASS + usize::from(restart == Restart::StopThenRun);
            let want = Want::of(o.vm, goal);
            let action = rules::machine_action(desired, want, p.machine.as_ref());
            let bound = p.did(|a| matches!(a, MachineAction::BindVolumes(_)));
            // The volumes first: a machine is created or started only once they are mounted.
            match course.volumes.map(|v| volumes::step(v, &action, bound)) {
                _ if p.done.len() >= budget => {}
                Some(volumes::Step::Bind(mounts)) => return machine_call(o, p, Call::BindVolumes(mounts), None),
                Some(volumes::Step::Stop) => return machine_call(o, p, Call::Stop, None),
                Some(volumes::Step::Wait) => waits = course.volumes,
                Some(volumes::Step::Proceed) | None => {
                    let step = next_machine_step(
                        o,
                        desired,
                        want,
                        p.machine.as_ref(),
                        &mut out,
                        &mut warnings,
                        &mut resume_pending,
                    );
                    match step {
                        Some(call) => return machine_call(o, p, call, None),
                        None => settled = true,
                    }
                }
            }
        }
    }
    out.settle(o, p, course, warnings, waits);
    out.suspension(o, p, goal, resume_pending.as_deref());
    if resume_pending.is_some() {
        out.requeue = Requeue::After(RESUME_RECHECK);
    } else if settled {
        out.requeue = Requeue::Settled;
    }
    Decision::Report(Box::new(out))
}

/// Whether the pass's next step is a start that the start backoff holds back (never a restart
/// the user asked for).
fn start_held(o: &Observed, p: &Progress, desired: &MachineSpec, goal: RunGoal, restart: Restart) -> bool {
    o.start_backoff.is_some()
        && p.done.is_empty()
        && restart == Restart::None
        && rules::machine_action(desired, Want::of(o.vm, goal), p.machine.as_ref()) == MachineAction::EnsureRunning
}

/// A machine call, with the exposure of the machine as it is written first on the pass's first
/// machine call.
fn machine_call(o: &Observed, p: &Progress, call: Call, record_first: Option<String>) -> Decision {
    let expose_first = if p.exposed.is_none() {
        let runs = p.machine.as_ref().is_some_and(|m| m.state == MachineState::Running);
        exposing(o, address_of(o).as_deref(), runs).writes
    } else {
        Vec::new()
    };
    Decision::Act {
        call,
        record_first,
        expose_first,
    }
}

/// The node's InternalIP, which the EndpointSlice points at.
fn address_of(o: &Observed) -> Option<String> {
    o.node_object
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.internal_ip.clone())
}

/// The machine call that brings the machine in line, or `None` when it is (with the
/// ResizePending condition set or cleared on `out`).
fn next_machine_step(
    o: &Observed,
    desired: &MachineSpec,
    want: Want,
    machine: Option<&MachineStatus>,
    out: &mut Outcome,
    warnings: &mut Vec<Note>,
    resume_pending: &mut Option<String>,
) -> Option<Call> {
    match rules::machine_action(desired, want, machine) {
        MachineAction::Create(spec) => Some(Call::Create(spec)),
        MachineAction::EnsureRunning => Some(Call::EnsureRunning),
        MachineAction::Stop => Some(Call::Stop),
        MachineAction::Suspend => Some(Call::Suspend),
        MachineAction::Discard => Some(Call::Discard),
        MachineAction::Resume => {
            // A resume takes the VM's CPU and memory back: it needs them free on its node (its
            // allocatable minus what the other VMs bound there hold). Without room it waits
            // there, saying what is missing; a bound VM never moves.
            let request = o.vm.spec.request();
            match rules::resume_shortfall(&request, o.room.allocatable.as_ref(), &o.room.others, o.node) {
                None => Some(Call::Resume),
                Some(message) => {
                    *resume_pending = Some(message);
                    None
                }
            }
        }
        MachineAction::Resize(spec) => {
            // A resize up needs room on the node: its allocatable minus what the other VMs bound
            // there hold. Without it the node is not asked; the VM reports why.
            let current = machine.map(rules::machine_resources).unwrap_or_default();
            let short = rules::resize_shortfall(
                &spec,
                &o.vm.spec.request(),
                &current,
                o.room.allocatable.as_ref(),
                &o.room.others,
            );
            let Some(short) = short else {
                return Some(Call::Resize(spec));
            };
            let message = short.message(o.node);
            if out.set(
                o,
                condition::RESIZE_PENDING,
                "True",
                reason::INSUFFICIENT_CAPACITY,
                &message,
            ) {
                warnings.push(Note::warning(reason::INSUFFICIENT_CAPACITY, "Resize", message));
            }
            None
        }
        MachineAction::ResizePending(message) => {
            out.set(
                o,
                condition::RESIZE_PENDING,
                "True",
                reason::RESIZE_NOT_APPLIED,
                &message,
            );
            None
        }
        MachineAction::None | MachineAction::BindVolumes(_) => {
            rules::clear_condition(&mut out.status.conditions, condition::RESIZE_PENDING);
            None
        }
    }
}

/// The Ready condition's (status, reason, message) when the node cannot be vouched for.
fn unhealthy(o: &Observed) -> Option<(&'static str, &'static str, String)> {
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
    if code == Some(&ErrorCode::HostPortInUse) && matches!(call, Call::Create(_) | Call::EnsureRunning) {
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
        Call::Get => (Some(Phase::Unknown), "RuntimeError"),
        Call::Create(_) => (Some(Phase::Failed), reason::CREATE_FAILED),
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
    /// An outcome that changes nothing yet: the stored status with this generation observed.
    fn of(vm: &SmolVM) -> Self {
        let mut status = vm.status.clone().unwrap_or_default();
        status.observed_generation = vm.metadata.generation;
        Outcome {
            status,
            exposure: Exposing::default(),
            events: Vec::new(),
            drops: Vec::new(),
            requeue: Requeue::Retry,
            hold: None,
            volumes: Vec::new(),
        }
    }

    /// Sets a condition at the SmolVM's generation; whether it changed.
    fn set(&mut self, o: &Observed, type_: &str, status: &str, why: &str, message: &str) -> bool {
        let generation = o.vm.metadata.generation;
        rules::set_condition(
            &mut self.status.conditions,
            type_,
            status,
            why,
            message,
            generation,
            o.now,
        )
    }

    /// A problem on the Ready condition: the phase, the condition, and a Warning event when the
    /// condition changed. Looked at again after the retry interval.
    #[allow(clippy::too_many_arguments)]
    fn problem(
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
    fn failed(&mut self, o: &Observed, call: &Call, failure: &Failure, machine: Option<&MachineStatus>) {
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
                let action = if matches!(call, Call::Create(_)) {
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

    /// What a pass that failed part-way still reports: the events of the steps it took, the
    /// annotations it is done with, the machine it made, and the exposure of what it left.
    fn after_failure(&mut self, o: &Observed, p: &Progress, goal: RunGoal, recreating: bool, restart: Restart) {
        self.events.extend(step_notes(o, p, goal));
        self.drop_annotations(o, p, recreating, restart);
        // The machine exists (it may have been made in this pass): recorded, so that its later
        // loss is told as MachineLost rather than re-created empty.
        if let Some(m) = &p.machine {
            self.status.effective = Some(rules::effective_of(m));
        }
        let runs = p.machine.as_ref().is_some_and(|m| m.state == MachineState::Running);
        self.expose(o, p, runs);
        self.suspension(o, p, goal, None);
    }

    /// The Suspended condition of the machine the pass left, its event when a resume starts to
    /// wait, and what the VM holds on its node.
    fn suspension(&mut self, o: &Observed, p: &Progress, goal: RunGoal, resume_pending: Option<&str>) {
        let want = Want::of(o.vm, goal);
        let machine = p.machine.as_ref();
        match rules::suspended_condition(o.vm, machine, want, o.node, resume_pending) {
            Some((status, why, message)) => {
                let changed = self.set(o, condition::SUSPENDED, status, why, &message);
                if changed && why == reason::RESUME_PENDING {
                    self.events.push(Note::warning(why, "Resume", message));
                }
            }
            None => {
                rules::clear_condition(&mut self.status.conditions, condition::SUSPENDED);
            }
        }
        if let Some(m) = machine {
            self.hold = Some(if m.state == MachineState::Suspended {
                Hold::Suspended
            } else {
                Hold::Full
            });
        }
    }

    /// The report of a pass that went as far as it should: the steps' events, phase and Ready
    /// from the machine (or, where its create or start `waits` for its volumes, from them), the
    /// exposure, the annotations it is done with, and an event for a transition no step told.
    fn settle(&mut self, o: &Observed, p: &Progress, course: Course, warnings: Vec<Note>, waits: Option<&Verdict>) {
        let Course {
            goal,
            recreating,
            restart,
            ..
        } = course;
        let steps = step_notes(o, p, goal);
        let steps_reported = !steps.is_empty();
        self.events.extend(steps);
        rules::apply_machine(
            &mut self.status,
            p.machine.as_ref(),
            goal,
            o.vm.spec.restart_policy(),
            o.vm.metadata.generation,
            o.now,
        );
        if let Some(verdict) = waits {
            volumes::hold_ready(
                &mut self.status,
                verdict,
                p.machine.as_ref(),
                o.vm.metadata.generation,
                o.now,
            );
        }
        rules::clear_condition(&mut self.status.conditions, condition::DELETION_BLOCKED);
        let runs = p.machine.as_ref().is_some_and(|m| m.state == MachineState::Running);
        self.expose(o, p, runs);
        self.drop_annotations(o, p, recreating, restart);
        // Waiting for its volumes is told by VolumesReady's own events.
        let told = steps_reported || waits.is_some();
        if let Some(t) = rules::transition_event(o.vm.status.as_ref(), &self.status, told) {
            self.events.push(Note {
                warning: t.warning,
                reason: t.reason,
                action: "Observe",
                note: t.note,
            });
        }
        self.events.extend(warnings);
        self.requeue = Requeue::Unsettled;
    }

    /// The recreate-lost-machine annotation once a fresh machine was made, and a restart request
    /// that is handled or skipped.
    fn drop_annotations(&mut self, o: &Observed, p: &Progress, recreating: bool, restart: Restart) {
        let (machine, node) = (o.machine, o.node);
        if recreating && p.did(|a| matches!(a, MachineAction::Create(_))) {
            self.drops.push(AnnotationDrop {
                key: RECREATE_LOST_MACHINE_ANNOTATION,
                value: smolvm_api::constants::RECREATE_LOST_MACHINE_VALUE.into(),
                newer_may_replace: false,
                then: Note::normal(
                    "Recreated",
                    "Create",
                    format!(
                        "created a fresh, empty machine {machine} on node {node} in place of the lost one, as {RECREATE_LOST_MACHINE_ANNOTATION} asked"
                    ),
                ),
            });
        }
        let Some(requested) = rules::restart_request(o.vm) else {
            return;
        };
        let (why, note) = match restart {
            Restart::Skip if requested.len() > rules::MAX_RESTART_REQUEST => (
                "RestartSkipped",
                format!(
                    "restart request not done: its value is longer than {} characters (kubectl smolvm restart writes the time of the request)",
                    rules::MAX_RESTART_REQUEST
                ),
            ),
            Restart::Skip if o.vm.spec.suspended() => (
                "RestartSkipped",
                format!(
                    "restart requested at {requested} not done: the SmolVM is suspended; resume it (spec.suspended: false), then restart it"
                ),
            ),
            Restart::Skip => (
                "RestartSkipped",
                format!("restart requested at {requested} not done: spec.running is false, nothing runs to restart"),
            ),
            Restart::Done => (
                "Restarted",
                format!("machine {machine} on node {node} restarted as requested at {requested}"),
            ),
            Restart::None | Restart::Run | Restart::StopThenRun => return,
        };
        self.drops.push(AnnotationDrop {
            key: RESTART_ANNOTATION,
            value: requested.to_string(),
            newer_may_replace: true,
            then: Note::normal(why, "Restart", note),
        });
    }

    /// Decides the Service and EndpointSlice from what was observed, and the ServiceExposed
    /// condition they give; `runs`: the machine runs (the endpoint is ready).
    fn expose(&mut self, o: &Observed, p: &Progress, runs: bool) {
        let address = address_of(o);
        if o.node_object.is_some() {
            self.status.node_address = address.clone();
        }
        self.status.ports = exposure::ports_summary(o.vm.spec.ports());
        self.exposure = exposing(o, address.as_deref(), runs);
        if p.exposed.as_ref() == Some(&self.exposure.writes) {
            // Written before this pass's machine calls, and still what is wanted.
            self.exposure.writes.clear();
        }
        let changed = match self.exposure.condition.clone() {
            Some((status, why, message)) => self.set(o, condition::SERVICE_EXPOSED, status, why, &message),
            None => rules::clear_condition(&mut self.status.conditions, condition::SERVICE_EXPOSED),
        };
        if changed && let Some(("False", why, message)) = &self.exposure.condition {
            self.events.push(Note::warning(*why, "Expose", message.clone()));
        }
    }

    /// A Service or EndpointSlice write failed: the condition says so (the machine's own status
    /// is still written), with a Warning event when that changed.
    pub fn exposure_failed(&mut self, vm: &SmolVM, error: &str, now: Timestamp) {
        let (namespace, name) = (vm.namespace().unwrap_or_default(), vm.name_any());
        let verb = if self.exposure.removing { "removing" } else { "writing" };
        let message = format!("{verb} Service {namespace}/{name}: {error}");
        let changed = rules::set_condition(
            &mut self.status.conditions,
            condition::SERVICE_EXPOSED,
            "False",
            reason::SERVICE_ERROR,
            &message,
            vm.metadata.generation,
            now,
        );
        if changed {
            self.events
                .push(Note::warning(reason::SERVICE_ERROR, "Expose", message));
        }
    }
}

/// The Normal events of the machine actions a pass took.
fn step_notes(o: &Observed, p: &Progress, goal: RunGoal) -> Vec<Note> {
    rules::step_events(&p.done, p.served_from.as_deref(), goal, o.machine, o.node)
        .into_iter()
        .map(|e| Note::normal(e.reason, e.action, e.note))
        .collect()
}

/// The exposure of a SmolVM, from its spec and the objects observed.
fn exposing(o: &Observed, address: Option<&str>, runs: bool) -> Exposing {
    let vm = o.vm;
    let (namespace, name) = (vm.namespace().unwrap_or_default(), vm.name_any());
    if !vm.spec.expose_service() {
        // A Service and EndpointSlice left from an earlier `exposeService: true` go.
        return Exposing {
            writes: removal(vm, o.service, o.slice),
            condition: None,
            removing: true,
        };
    }
    let condition = |status, why, message: String| Some((status, why, message));
    let want = match exposure::desired(vm, o.node, address, runs) {
        Ok(want) => want,
        Err(NotExposed::NoPorts) => {
            return Exposing {
                condition: condition(
                    "False",
                    reason::NO_PORTS,
                    "network.exposeService is true but the SmolVM publishes no port: no Service is made".into(),
                ),
                ..Exposing::default()
            };
        }
        Err(NotExposed::InvalidName) => {
            return Exposing {
                condition: condition(
                    "False",
                    reason::INVALID_SERVICE_NAME,
                    format!(
                        "a Service cannot be named {name:?}: Service names are DNS-1035 labels (at most 63 characters: lowercase letters, digits and '-', starting with a letter)"
                    ),
                ),
                ..Exposing::default()
            };
        }
        Err(NotExposed::Incomplete) => return Exposing::default(),
    };
    let foreign = [
        o.service
            .and_then(|s| exposure::check_owner(&s.metadata, vm).err().map(|w| ("Service", w))),
        o.slice.and_then(|s| {
            exposure::check_owner(&s.metadata, vm)
                .err()
                .map(|w| ("EndpointSlice", w))
        }),
    ]
    .into_iter()
    .flatten()
    .next();
    if let Some((kind, who)) = foreign {
        return Exposing {
            condition: condition(
                "False",
                reason::SERVICE_NOT_OWNED,
                format!(
                    "{kind} {namespace}/{name} {who}; it is left untouched: delete or rename it, or set network.exposeService to false"
                ),
            ),
            ..Exposing::default()
        };
    }
    Exposing {
        writes: exposure_writes(o, &want),
        condition: Some(exposure::condition(&want, &name, o.node, address, runs)),
        removing: false,
    }
}

/// The writes that remove the Service and EndpointSlice of a SmolVM (its own: one it does not
/// own stays).
pub fn removal(vm: &SmolVM, service: Option<&Service>, slice: Option<&EndpointSlice>) -> Vec<ExposureWrite> {
    let owned =
        |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| exposure::check_owner(meta, vm).is_ok();
    let mut writes = Vec::new();
    if slice.is_some_and(|s| owned(&s.metadata)) {
        writes.push(ExposureWrite::DeleteSlice);
    }
    if service.is_some_and(|s| owned(&s.metadata)) {
        writes.push(ExposureWrite::DeleteService);
    }
    writes
}

/// The writes that make the observed Service and EndpointSlice what `want` asks for.
fn exposure_writes(o: &Observed, want: &Exposure) -> Vec<ExposureWrite> {
    let mut writes = Vec::new();
    if !o
        .service
        .is_some_and(|have| exposure::service_matches(have, &want.service))
    {
        writes.push(ExposureWrite::ApplyService(Box::new(want.service.clone())));
    }
    match o.slice {
        Some(have) if exposure::slice_matches(have, &want.slice) => {}
        Some(have) if have.address_type != want.slice.address_type => {
            writes.push(ExposureWrite::DeleteSlice);
            writes.push(ExposureWrite::ApplySlice(Box::new(want.slice.clone())));
        }
        _ => writes.push(ExposureWrite::ApplySlice(Box::new(want.slice.clone()))),
    }
    writes
}

impl Outcome {
    /// The volumes' part of a pass's outcome: VolumesReady (removed from a SmolVM without
    /// volumes), its event when its reason changed, and the claim and holder writes.
    pub fn volumes(&mut self, vm: &SmolVM, verdict: Option<&Verdict>, now: Timestamp) {
        let Some(v) = verdict else {
            rules::clear_condition(&mut self.status.conditions, condition::VOLUMES_READY);
            return;
        };
        self.volume_condition(vm, v.condition.clone(), now);
        self.volumes = v.writes.clone();
    }

    /// A claim or holder write failed with `error`: VolumesReady says so.
    pub fn volume_write_failed(&mut self, vm: &SmolVM, write: &VolumeWrite, error: &str, now: Timestamp) {
        let (why, message) = write.failed(error);
        self.volume_condition(vm, ("False", why, message), now);
    }

    /// Sets VolumesReady, with an event when its reason changed to one that is told
    /// ([`volumes::notable`]).
    fn volume_condition(&mut self, vm: &SmolVM, (status, why, message): volumes::ConditionParts, now: Timestamp) {
        let conditions = &mut self.status.conditions;
        let before = conditions.iter().find(|c| c.type_ == condition::VOLUMES_READY);
        let changed = before.is_none_or(|c| c.reason != why);
        let generation = vm.metadata.generation;
        rules::set_condition(
            conditions,
            condition::VOLUMES_READY,
            status,
            why,
            &message,
            generation,
            now,
        );
        if let Some(warning) = volumes::notable(why).filter(|_| changed) {
            let action = if why == reason::HOLDER_EVICTED {
                "Evict"
            } else {
                "Mount"
            };
            let note = if warning { Note::warning } else { Note::normal };
            self.events.push(note(why, action, message));
        }
    }
}

/// A SmolVM that is not placed because of its volumes (a claim missing or another's): Pending,
/// VolumesReady False with `why` and `message`, and its event when the reason changed.
pub fn waiting_for_volumes(vm: &SmolVM, why: &'static str, message: String, now: Timestamp) -> Outcome {
    let mut out = Outcome::of(vm);
    out.status.phase = Some(Phase::Pending);
    out.volume_condition(vm, ("False", why, message), now);
    out
}

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

/// The stored status with `phase` and one condition (type, status, reason) set to `message`, and
/// a Warning event (reason, action) when the condition changed: the outcome of a placement or a
/// deletion, which observe no machine.
fn warned(
    vm: &SmolVM,
    phase: Phase,
    [type_, status, why]: [&str; 3],
    message: String,
    (event_reason, action): (&str, &'static str),
    now: Timestamp,
) -> Outcome {
    let mut out = Outcome::of(vm);
    out.status = vm.status.clone().unwrap_or_default();
    out.status.phase = Some(phase);
    let generation = vm.metadata.generation;
    if rules::set_condition(
        &mut out.status.conditions,
        type_,
        status,
        why,
        &message,
        generation,
        now,
    ) {
        out.events.push(Note::warning(event_reason, action, message));
    }
    out
}

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
