//! The machine: its name on its node ([`machine_name`]), the spec the node must create for a
//! SmolVM ([`machine_spec`]), what a pass wants of it ([`Want`]) and the action that brings it
//! there ([`machine_action`]), and what it holds as the node reports it.

use smolvm_api::{
    EffectiveResources, NodeResources, Port, SmolVM,
    nodeapi::{
        MachineSpec, MachineState, MachineStatus, NetworkSpec, PortSpec, ResizeSpec,
        RestartPolicy as NodeRestartPolicy, WorkloadSpec,
    },
    types::RestartPolicy,
};

use super::run_goal::RunGoal;

/// The machine name of a SmolVM on its node: `svm-<uid>` (see [`SmolVM::machine_name`]). The
/// controller never takes it from `status.machineName`, which is only a report for users.
pub fn machine_name(vm: &SmolVM) -> Option<String> {
    vm.machine_name()
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
    /// its holder was evicted); decided by [`crate::vm::volumes::step`], never by [`machine_action`].
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
        Want::with_sleep(vm, goal, super::Sleep::Awake)
    }

    /// What `goal`, the SmolVM's `spec.suspended` and its idleness (`sleep`, SPEC 2.7) ask.
    pub fn with_sleep(vm: &SmolVM, goal: RunGoal, sleep: super::Sleep) -> Want {
        let running = goal.running();
        Want {
            running,
            suspended: running && (vm.spec.suspended() || sleep.suspends()),
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

/// What a machine holds on its node, as the node reports it (disk is storage plus overlay).
pub fn machine_resources(m: &MachineStatus) -> NodeResources {
    let gib = |v: Option<u64>| v.and_then(|v| i64::try_from(v).ok()).unwrap_or_default();
    NodeResources {
        cpus: i64::from(m.cpus),
        memory_mib: i64::try_from(m.memory_mib).unwrap_or(i64::MAX),
        storage_gib: gib(m.storage_gib).saturating_add(gib(m.overlay_gib)),
    }
}

/// The resources and ports a machine has, as the status shows them.
pub fn effective_of(m: &MachineStatus) -> EffectiveResources {
    EffectiveResources {
        cpus: i32::try_from(m.cpus).unwrap_or(i32::MAX),
        memory_mib: i64::try_from(m.memory_mib).unwrap_or(i64::MAX),
        storage_gib: m.storage_gib.and_then(|s| i64::try_from(s).ok()).unwrap_or_default(),
        overlay_gib: m.overlay_gib.and_then(|s| i64::try_from(s).ok()).unwrap_or_default(),
        ports: m
            .network
            .ports
            .iter()
            .map(|p| Port {
                host_port: i32::from(p.host_port),
                guest_port: i32::from(p.guest_port),
                protocol: p.protocol,
            })
            .collect(),
    }
}
