//! Reconcile planning: what the controller does next for a SmolVM, as pure functions of what it
//! observed. The I/O layer fetches, calls [`next_step`] and [`machine_action`], carries the step
//! out, and writes the status that [`conditions`] computes.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::{SignedDuration, Timestamp},
};
use smolvm_api::{
    SmolVM, SmolVMNode,
    constants::{FINALIZER, FORCE_DELETE_ANNOTATION, FORCE_DELETE_VALUE, condition},
    nodeapi::{MachineSpec, MachineState, MachineStatus, NetworkSpec, PortProtocol, PortSpec, ResizeSpec},
    types::Protocol,
};

/// Prefix of machine names on the nodes.
pub const MACHINE_PREFIX: &str = "svm-";

/// The machine name of a SmolVM on its node, derived from the object's UID so that a re-created
/// object of the same name never adopts an old machine.
pub fn machine_name(vm: &SmolVM) -> Option<String> {
    vm.metadata
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .map(|uid| format!("{MACHINE_PREFIX}{}", uid.to_ascii_lowercase()))
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

/// Judges the bound node.
pub fn node_health(vm: &SmolVM, node: Option<&SmolVMNode>, now: Timestamp, timeout: SignedDuration) -> NodeHealth {
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
    match &status.heartbeat_time {
        Some(t) if now.duration_since(t.0) <= timeout => {}
        Some(t) => {
            return NodeHealth::Unreachable {
                why: format!(
                    "its last heartbeat was at {} ({}s ago)",
                    t.0,
                    now.duration_since(t.0).as_secs()
                ),
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
    let machine = vm
        .status
        .as_ref()
        .and_then(|s| s.machine_name.clone())
        .or_else(|| machine_name(vm))
        .unwrap_or_default();
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
                protocol: match p.protocol {
                    Protocol::Tcp => PortProtocol::Tcp,
                    Protocol::Udp => PortProtocol::Udp,
                },
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
        },
    })
}

/// What to ask of the node, given the machine it reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineAction {
    /// The machine does not exist: create it.
    Create(MachineSpec),
    /// It should run and does not.
    EnsureRunning,
    /// It runs and should not.
    Stop,
    /// Sizes differ from the spec. CPU and memory are included only while the machine runs
    /// (smolvm changes them live); disk growth applies in any state.
    Resize(ResizeSpec),
    /// CPU or memory differ but the machine is not running: reported as ResizePending.
    ResizePending(String),
    /// Nothing to do.
    None,
}

/// Chooses the next machine action. One action per pass; the controller reconciles again after it.
pub fn machine_action(desired: &MachineSpec, running: bool, machine: Option<&MachineStatus>) -> MachineAction {
    let Some(m) = machine else {
        return MachineAction::Create(desired.clone());
    };
    let is_running = m.state == MachineState::Running;
    if running && !is_running {
        return MachineAction::EnsureRunning;
    }
    if !running && is_running {
        return MachineAction::Stop;
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
