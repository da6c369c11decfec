//! The rules of a SmolVM's lifecycle, as pure functions of what was observed: the next step
//! ([`next_step`]), the node's health, the machine the spec asks for and the action that brings
//! it there, restarts and run goals, conditions, and the events of a transition. [`super::decide`]
//! combines them into one decision per pass.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use smolvm_api::{
    NodeResources, Phase, SmolVM, SmolVMNode, SmolVMStatus,
    constants::{
        FINALIZER, FORCE_DELETE_ANNOTATION, FORCE_DELETE_VALUE, RECREATE_LOST_MACHINE_ANNOTATION,
        RECREATE_LOST_MACHINE_VALUE, condition, reason,
    },
    nodeapi::{
        MachineSpec, MachineState, MachineStatus, NetworkSpec, PortSpec, ResizeSpec,
        RestartPolicy as NodeRestartPolicy, WorkloadSpec,
    },
    types::RestartPolicy,
};

/// The machine name of a SmolVM on its node: `svm-<uid>` (see [`SmolVM::machine_name`]). The
/// controller never takes it from `status.machineName`, which is only a report for users.
pub fn machine_name(vm: &SmolVM) -> Option<String> {
    vm.machine_name()
}

/// The health of the node a SmolVM is bound to, as far as the API server shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeHealth {
    /// Ready with a fresh heartbeat and the bound UID.
    Healthy,
    /// No SmolVMNode of that name.
    Missing,
    /// The SmolVMNode reports another node UID than the binding: the node was replaced.
    Replaced {
        /// UID in the binding.
        bound: String,
        /// UID the node reports now.
        reported: String,
    },
    /// The heartbeat is stale or missing, or Ready is not True.
    Unreachable {
        /// Why, for the condition message.
        why: String,
    },
}

/// Judges the bound node; its heartbeat's age as `liveness` judges it (the controller's clock).
pub fn node_health(
    vm: &SmolVM,
    node: Option<&SmolVMNode>,
    now: Timestamp,
    liveness: &crate::placement::Config,
) -> NodeHealth {
    let Some(node) = node else { return NodeHealth::Missing };
    let Some(status) = &node.status else {
        return NodeHealth::Unreachable {
            why: "the node reports no status".into(),
        };
    };
    let bound_uid = vm.status.as_ref().and_then(|s| s.node_uid.as_deref());
    if let (Some(bound), Some(reported)) = (bound_uid, status.node_uid.as_deref())
        && bound != reported
    {
        return NodeHealth::Replaced {
            bound: bound.into(),
            reported: reported.into(),
        };
    }
    match liveness.heartbeat_age(node, now) {
        Some(age) if age <= liveness.heartbeat_timeout => {}
        Some(age) => {
            return NodeHealth::Unreachable {
                why: format!("its heartbeat has not changed for {}s", age.as_secs()),
            };
        }
        None => {
            return NodeHealth::Unreachable {
                why: "it never sent a heartbeat".into(),
            };
        }
    }
    let ready = status.conditions.iter().find(|c| c.type_ == condition::READY);
    match ready {
        Some(c) if c.status == "True" => NodeHealth::Healthy,
        Some(c) => NodeHealth::Unreachable {
            why: format!("its runtime is not Ready ({}: {})", c.reason, c.message),
        },
        None => NodeHealth::Unreachable {
            why: "its runtime reports no Ready condition".into(),
        },
    }
}

/// The next thing to do for a SmolVM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Not being deleted and the finalizer is missing: add it first.
    AddFinalizer,
    /// Being deleted and nothing holds it on a node: remove the finalizer.
    RemoveFinalizer,
    /// Being deleted and bound: delete the machine on its node, then remove the finalizer.
    DeleteMachine {
        /// Bound node.
        node: String,
        /// Machine on it.
        machine: String,
        /// Whether the force-delete annotation allows removing the finalizer if the node cannot
        /// be reached.
        force: bool,
    },
    /// Being deleted, and the finalizer is already gone: nothing to do.
    Forget,
    /// Not bound: choose a node and bind.
    Place,
    /// Bound: bring the machine on the node in line with the spec.
    Converge {
        /// Bound node.
        node: String,
        /// Machine on it.
        machine: String,
    },
}

/// Decides the next step from the object alone.
pub fn next_step(vm: &SmolVM) -> Step {
    let has_finalizer = vm.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER);
    let bound = vm.bound_node().map(str::to_string);
    // Always the UID-derived name: a status write (which tenants may be allowed) must never
    // point a create or a delete at another VM's machine.
    let machine = machine_name(vm).unwrap_or_default();
    if vm.is_deleting() {
        if !has_finalizer {
            return Step::Forget;
        }
        return match bound {
            None => Step::RemoveFinalizer,
            Some(node) => Step::DeleteMachine {
                node,
                machine,
                force: force_delete(vm),
            },
        };
    }
    if !has_finalizer {
        return Step::AddFinalizer;
    }
    match bound {
        None => Step::Place,
        Some(node) => Step::Converge { node, machine },
    }
}

/// What to do about a machine the node does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingMachine {
    /// It was never seen on the node: create it.
    Create,
    /// The node reported it before (`status.effective` is set) and it is gone: report
    /// MachineLost and do not re-create an empty one behind the user's back.
    Lost,
    /// Lost, and the recreate-lost-machine annotation asks for a fresh machine.
    Recreate,
}

/// Judges a missing machine from the object alone.
pub fn missing_machine(vm: &SmolVM) -> MissingMachine {
    let seen = vm.status.as_ref().is_some_and(|s| s.effective.is_some());
    if !seen {
        return MissingMachine::Create;
    }
    if recreate_lost_machine(vm) {
        MissingMachine::Recreate
    } else {
        MissingMachine::Lost
    }
}

/// Whether the recreate-lost-machine annotation is set to exactly `"true"`.
pub fn recreate_lost_machine(vm: &SmolVM) -> bool {
    vm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RECREATE_LOST_MACHINE_ANNOTATION))
        .map(String::as_str)
        == Some(RECREATE_LOST_MACHINE_VALUE)
}

/// Whether the force-delete annotation is set to exactly `"true"`.
pub fn force_delete(vm: &SmolVM) -> bool {
    vm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FORCE_DELETE_ANNOTATION))
        .map(String::as_str)
        == Some(FORCE_DELETE_VALUE)
}

/// What the node must create for this SmolVM (defaults applied). `Err` names a value the node API
/// cannot carry (the webhook and the CRD schema keep such values out).
pub fn machine_spec(vm: &SmolVM) -> Result<MachineSpec, String> {
    let e = vm.spec.effective();
    let ports = e
        .ports
        .iter()
        .map(|p| {
            Ok(PortSpec {
                host_port: u16::try_from(p.host_port).map_err(|_| format!("hostPort {} out of range", p.host_port))?,
                guest_port: u16::try_from(p.guest_port)
                    .map_err(|_| format!("guestPort {} out of range", p.guest_port))?,
                protocol: p.protocol,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(MachineSpec {
        image: vm.spec.image.clone(),
        cpus: u32::try_from(e.cpus).map_err(|_| format!("cpus {} out of range", e.cpus))?,
        memory_mib: u32::try_from(e.memory_mib).map_err(|_| format!("memoryMiB {} out of range", e.memory_mib))?,
        storage_gib: u64::try_from(e.storage_gib).map_err(|_| format!("storageGiB {} out of range", e.storage_gib))?,
        overlay_gib: u64::try_from(e.overlay_gib).map_err(|_| format!("overlayGiB {} out of range", e.overlay_gib))?,
        network: NetworkSpec {
            enabled: vm.spec.network_enabled(),
            ports,
            allowed_cidrs: vm.spec.allowed_cidrs().to_vec(),
            allowed_hosts: vm.spec.allowed_hosts().to_vec(),
        },
        workload: WorkloadSpec {
            command: vm.spec.command.clone().unwrap_or_default(),
            args: vm.spec.args.clone().unwrap_or_default(),
            working_dir: vm.spec.working_dir.clone(),
            // Resolved from Secrets and ConfigMaps when the machine is created
            // (`workload::resolve_env`): values are read at that moment only.
            env: Vec::new(),
            restart_policy: match vm.spec.restart_policy() {
                RestartPolicy::Always => NodeRestartPolicy::Always,
                RestartPolicy::OnFailure => NodeRestartPolicy::OnFailure,
                RestartPolicy::Never => NodeRestartPolicy::Never,
            },
            termination_grace_period_seconds: u32::try_from(vm.spec.termination_grace_period_seconds())
                .ok()
                .filter(|s| *s <= 300)
                .ok_or_else(|| {
                    format!(
                        "terminationGracePeriodSeconds {} out of range",
                        vm.spec.termination_grace_period_seconds()
                    )
                })?,
        },
        volumes: None,
    })
}

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

/// What to ask of the node, given the machine it reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineAction {
    /// The machine does not exist: create it.
    Create(Box<MachineSpec>),
    /// It should run and does not.
    EnsureRunning,
    /// It runs and should not.
    Stop,
    /// Sizes differ from the spec. CPU and memory are included only while the machine runs
    /// (smolvm changes them live); disk growth applies in any state.
    Resize(ResizeSpec),
    /// CPU or memory differ but the machine is not running: reported as ResizePending.
    ResizePending(String),
    /// It runs and `spec.suspended` asks for it to be suspended.
    Suspend,
    /// It is suspended and `spec.suspended` no longer asks for it (the node has room for it).
    Resume,
    /// It is suspended and `spec.running` is false: stopped, its saved memory discarded.
    Discard,
    /// Its mounts were pointed at the volumes of the holder Pod of this UID (a new holder, after
    /// its holder was evicted); decided by [`super::volumes::step`], never by [`machine_action`].
    BindVolumes(String),
    /// Nothing to do.
    None,
}

/// What a pass wants of the machine: whether it runs and whether it is suspended
/// ([`smolvm_api::SmolVMSpec::suspended`]: only while it runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    /// The machine should be running (or suspended).
    pub running: bool,
    /// The machine should be suspended.
    pub suspended: bool,
}

impl Want {
    /// Running, not suspended.
    pub const RUN: Want = Want {
        running: true,
        suspended: false,
    };
    /// Stopped.
    pub const STOP: Want = Want {
        running: false,
        suspended: false,
    };
    /// Running and suspended.
    pub const SUSPEND: Want = Want {
        running: true,
        suspended: true,
    };

    /// What `goal` and the SmolVM's `spec.suspended` ask.
    pub fn of(vm: &SmolVM, goal: RunGoal) -> Want {
        let running = goal.running();
        Want {
            running,
            suspended: running && vm.spec.suspended(),
        }
    }
}

/// Chooses the next machine action. One action per pass; the controller reconciles again after
/// it. A machine with nothing saved that should be suspended is started first: a suspended VM is
/// always one that can be resumed.
pub fn machine_action(desired: &MachineSpec, want: Want, machine: Option<&MachineStatus>) -> MachineAction {
    let Some(m) = machine else {
        return MachineAction::Create(Box::new(desired.clone()));
    };
    let running = want.running;
    let is_running = m.state == MachineState::Running;
    if m.state == MachineState::Suspended {
        return match (running, want.suspended) {
            (false, _) => MachineAction::Discard,
            (true, false) => MachineAction::Resume,
            (true, true) => suspended_sizes(desired, m),
        };
    }
    if running && !is_running {
        return MachineAction::EnsureRunning;
    }
    if !running && is_running {
        return MachineAction::Stop;
    }
    if want.suspended {
        return MachineAction::Suspend;
    }
    let mut resize = ResizeSpec::default();
    if m.storage_gib.is_some_and(|s| s < desired.storage_gib) {
        resize.storage_gib = Some(desired.storage_gib);
    }
    if m.overlay_gib.is_some_and(|s| s < desired.overlay_gib) {
        resize.overlay_gib = Some(desired.overlay_gib);
    }
    let cpu_mem_differs = m.cpus != desired.cpus || m.memory_mib != u64::from(desired.memory_mib);
    if cpu_mem_differs && is_running {
        resize.cpus = Some(desired.cpus);
        resize.memory_mib = Some(desired.memory_mib);
    }
    if resize != ResizeSpec::default() {
        return MachineAction::Resize(resize);
    }
    if cpu_mem_differs {
        return MachineAction::ResizePending(format!(
            "{} CPUs and {} MiB take effect when the machine runs (it has {} CPUs and {} MiB)",
            desired.cpus, desired.memory_mib, m.cpus, m.memory_mib
        ));
    }
    MachineAction::None
}

/// A suspended machine stays as it is; a disk growth (admitted while suspended) waits for the
/// resume, and says so.
fn suspended_sizes(desired: &MachineSpec, m: &MachineStatus) -> MachineAction {
    let grows = |have: Option<u64>, want: u64| have.is_some_and(|h| h < want);
    if grows(m.storage_gib, desired.storage_gib) || grows(m.overlay_gib, desired.overlay_gib) {
        return MachineAction::ResizePending(format!(
            "{} GiB of storage and {} GiB of overlay take effect when the machine is resumed (it is suspended)",
            desired.storage_gib, desired.overlay_gib
        ));
    }
    MachineAction::None
}

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

/// One event per transition the actions `done` of a pass made: a create immediately followed by
/// a start is one transition, "Started", that says both; a start after the workload exited under
/// restartPolicy Always is "Restarted".
pub fn step_events(
    done: &[MachineAction],
    served_from: Option<&str>,
    goal: RunGoal,
    machine: &str,
    node: &str,
) -> Vec<StepEvent> {
    let event = |reason, action, note| StepEvent { reason, action, note };
    let mut events = Vec::new();
    let mut i = 0;
    while i < done.len() {
        let e = match (&done[i], done.get(i + 1)) {
            // A create served from a ready slot: the machine runs already, and this one event
            // says both where it came from and that it runs.
            (MachineAction::Create(_), _) if served_from.is_some() => event(
                reason::SERVED_FROM_POOL,
                "Create",
                format!(
                    "served machine {machine} on node {node} from a ready slot of pool {}: it runs",
                    served_from.unwrap_or_default()
                ),
            ),
            (MachineAction::Create(_), Some(MachineAction::EnsureRunning)) => {
                i += 1;
                event(
                    "Started",
                    "Start",
                    format!("created and started machine {machine} on node {node}"),
                )
            }
            (MachineAction::Create(_), _) => {
                event("Created", "Create", format!("created machine {machine} on node {node}"))
            }
            (MachineAction::EnsureRunning, _) if goal == RunGoal::Restart => event(
                reason::RESTARTED,
                "Start",
                format!(
                    "the workload of machine {machine} on node {node} exited on its own; restartPolicy Always started it again"
                ),
            ),
            (MachineAction::EnsureRunning, _) => {
                event("Started", "Start", format!("machine {machine} runs on node {node}"))
            }
            (MachineAction::Stop, _) => event("Stopped", "Stop", format!("stopped machine {machine} on node {node}")),
            (MachineAction::Suspend, _) => event(
                reason::SUSPENDED,
                "Suspend",
                format!(
                    "suspended machine {machine} on node {node}: its memory and disks are saved there, and its CPU and memory are given back to the node"
                ),
            ),
            (MachineAction::Resume, _) => event(
                reason::RESUMED,
                "Resume",
                format!("resumed machine {machine} on node {node} with its processes as they were"),
            ),
            (MachineAction::Discard, _) => event(
                reason::SAVED_STATE_DISCARDED,
                "Stop",
                format!(
                    "spec.running is false: stopped suspended machine {machine} on node {node} and discarded its saved memory; it boots afresh when it runs again"
                ),
            ),
            (MachineAction::Resize(spec), _) => event(
                "Resized",
                "Resize",
                format!("resized machine {machine} on node {node} to {}", describe(spec)),
            ),
            (MachineAction::BindVolumes(holder), _) => event(
                "VolumesBound",
                "Bind",
                format!(
                    "pointed the volumes of machine {machine} on node {node} at holder Pod {holder}, which has mounted them"
                ),
            ),
            (MachineAction::ResizePending(_) | MachineAction::None, _) => {
                i += 1;
                continue;
            }
        };
        events.push(e);
        i += 1;
    }
    events
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

/// A resize the node has no room for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    /// `cpus`, `memoryMiB` or `storageGiB` (storage plus overlay), as the spec spells them.
    pub resource: &'static str,
    /// What the VM asks for in all, after the resize.
    pub requested: i64,
    /// What the node has for this VM: its allocatable minus what every other VM holds there.
    pub free: i64,
}

impl Shortfall {
    /// For the ResizePending condition and its event.
    pub fn message(&self, node: &str) -> String {
        format!(
            "node {node} has no room for the resize: {} {} requested, {} free for this VM (allocatable minus the other VMs bound there); it is applied when room frees up",
            self.requested, self.resource, self.free
        )
    }
}

/// Whether `node` can hold a resize of a machine from `current` to `request`. Only the
/// dimensions the resize touches (`resize`) and that grow are checked: shrinking always fits.
/// `others` is what every other VM holds on the node; without a reported allocatable nothing is
/// checked (the node itself then decides).
pub fn resize_shortfall(
    resize: &ResizeSpec,
    request: &NodeResources,
    current: &NodeResources,
    allocatable: Option<&NodeResources>,
    others: &NodeResources,
) -> Option<Shortfall> {
    let free = allocatable?.minus(others);
    let disk = resize.storage_gib.is_some() || resize.overlay_gib.is_some();
    [
        ("cpus", resize.cpus.is_some(), request.cpus, current.cpus, free.cpus),
        (
            "memoryMiB",
            resize.memory_mib.is_some(),
            request.memory_mib,
            current.memory_mib,
            free.memory_mib,
        ),
        (
            "storageGiB",
            disk,
            request.storage_gib,
            current.storage_gib,
            free.storage_gib,
        ),
    ]
    .into_iter()
    .find(|&(_, touched, want, have, room)| touched && want > have && want > room)
    .map(|(resource, _, requested, _, free)| Shortfall {
        resource,
        requested,
        free,
    })
}

/// Why a suspended VM cannot resume on its node now, or `None` when it can: its CPU and memory
/// against the node's `allocatable` minus what the `others` bound there hold (without a reported
/// allocatable the node itself decides).
pub fn resume_shortfall(
    request: &NodeResources,
    allocatable: Option<&NodeResources>,
    others: &NodeResources,
    node: &str,
) -> Option<String> {
    let free = allocatable?.minus(others);
    let short: Vec<String> = [
        (request.cpus, free.cpus, "CPUs"),
        (request.memory_mib, free.memory_mib, "MiB of memory"),
    ]
    .into_iter()
    .filter(|(want, room, _)| want > room)
    .map(|(want, room, unit)| format!("{want} {unit} ({} free)", room.max(0)))
    .collect();
    if short.is_empty() {
        return None;
    }
    Some(format!(
        "node {node} has too little room to resume it: it needs {} beyond what the other VMs bound there hold; it resumes when room frees up there (a bound SmolVM never moves)",
        short.join(" and ")
    ))
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

/// What a machine holds on its node, as the node reports it (disk is storage plus overlay).
pub fn machine_resources(m: &MachineStatus) -> NodeResources {
    let gib = |v: Option<u64>| v.and_then(|v| i64::try_from(v).ok()).unwrap_or_default();
    NodeResources {
        cpus: i64::from(m.cpus),
        memory_mib: i64::try_from(m.memory_mib).unwrap_or(i64::MAX),
        storage_gib: gib(m.storage_gib).saturating_add(gib(m.overlay_gib)),
    }
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

/// The resources and ports a machine has, as the status shows them.
pub fn effective_of(m: &MachineStatus) -> smolvm_api::EffectiveResources {
    smolvm_api::EffectiveResources {
        cpus: i32::try_from(m.cpus).unwrap_or(i32::MAX),
        memory_mib: i64::try_from(m.memory_mib).unwrap_or(i64::MAX),
        storage_gib: m.storage_gib.and_then(|s| i64::try_from(s).ok()).unwrap_or_default(),
        overlay_gib: m.overlay_gib.and_then(|s| i64::try_from(s).ok()).unwrap_or_default(),
        ports: m
            .network
            .ports
            .iter()
            .map(|p| smolvm_api::Port {
                host_port: i32::from(p.host_port),
                guest_port: i32::from(p.guest_port),
                protocol: p.protocol,
            })
            .collect(),
    }
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
