//! The observed state of a SmolVM, written by the controller: its phase, its binding to a node
//! (rule V9) and the resources and ports in effect there.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::{network::Port, node::NodeResources};

/// Lifecycle phase of a SmolVM.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Phase {
    /// Waiting for a node.
    #[default]
    Pending,
    /// Bound to a node; the machine is not created yet.
    Scheduled,
    /// The node is creating the machine.
    Creating,
    /// The machine runs.
    Running,
    /// The machine exists and is stopped.
    Stopped,
    /// The machine is suspended: its memory and disks saved on its node, its CPU and memory
    /// given back; see the Suspended condition.
    Suspended,
    /// The node could not create or start the machine; see the Ready condition.
    Failed,
    /// The node cannot be reached; the binding stays.
    Unknown,
    /// The machine is being removed from its node.
    Deleting,
}

impl Phase {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Scheduled => "Scheduled",
            Phase::Creating => "Creating",
            Phase::Running => "Running",
            Phase::Stopped => "Stopped",
            Phase::Suspended => "Suspended",
            Phase::Failed => "Failed",
            Phase::Unknown => "Unknown",
            Phase::Deleting => "Deleting",
        }
    }
}

/// Observed state of a SmolVM, written by the controller.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.nodeName) || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)").message("status.nodeName never changes or clears once set: SmolVMs never move (V9)").field_path(".nodeName"))]
#[x_kube(validation = Rule::new("!has(oldSelf.nodeUID) || (has(self.nodeUID) && self.nodeUID == oldSelf.nodeUID)").message("status.nodeUID never changes or clears once set (V9)").field_path(".nodeUID"))]
#[x_kube(validation = Rule::new("!has(oldSelf.machineName) || (has(self.machineName) && self.machineName == oldSelf.machineName)").message("status.machineName never changes or clears once set (V9)").field_path(".machineName"))]
#[x_kube(validation = Rule::new("has(self.nodeName) == has(self.nodeUID)").message("status.nodeName and status.nodeUID are written together (V9)").field_path(".nodeName"))]
pub struct SmolVMStatus {
    /// Lifecycle phase: Pending, Scheduled, Creating, Running, Stopped, Suspended, Failed, Unknown or Deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        description = "Lifecycle phase: Pending, Scheduled, Creating, Running, Stopped, Suspended, Failed, Unknown or Deleting."
    )]
    pub phase: Option<Phase>,

    /// The node the machine is bound to, for good. Written once by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("status.nodeName must be a DNS-1123 subdomain (V9)"))]
    pub node_name: Option<String>,

    /// UID of the Kubernetes Node at binding time. A node replaced under the same name has another UID, and the controller reports it instead of adopting it.
    #[serde(default, rename = "nodeUID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub node_uid: Option<String>,

    /// Name of the machine on the node: svm-<metadata.uid>, written once by the controller. A report only: the controller always derives the name from the UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[x_kube(validation = Rule::new("self.startsWith('svm-')").message("status.machineName is svm-<metadata.uid> (V9)"))]
    pub machine_name: Option<String>,

    /// The `metadata.generation` the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Resources and ports in effect on the node (defaults applied; a resize the runtime could not apply yet shows here as the old values, with the ResizePending condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective: Option<EffectiveResources>,

    /// The bound node's InternalIP, where the published ports are reachable (from its SmolVMNode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub node_address: Option<String>,

    /// The published ports as `hostPort->guestPort/PROTOCOL`, comma-separated, for `kubectl get -o wide`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub ports: Option<String>,

    /// The restart request (the value of the `vm.smolvm.dev/restart-requested-at` annotation) the controller last acted on, written before it stops the machine: a request with this value is never acted on twice, even when removing the annotation fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub restart_handled: Option<String>,

    /// The SmolVM this branch was made from, as it was when its machine was branched (SPEC 2.6): its name and UID. Written once, by the controller, with the branch's first machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branched_from: Option<BranchedFrom>,

    /// When the machine first ran (phase Running), as a Job's `startTime`: `lifecycle.activeDeadlineSeconds` counts from here. Written once, by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,

    /// When the machine finished: it stopped on its own and its restartPolicy keeps it stopped (Ready reason Exited). `lifecycle.ttlSecondsAfterFinished` counts from here. Cleared when it runs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,

    /// Current state as conditions: Scheduled, Ready, Suspended, DeletionBlocked, ResizePending, ServiceExposed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The source a branch's machine was made from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BranchedFrom {
    /// The source SmolVM's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The source SmolVM's `metadata.uid`.
    #[schemars(length(max = 128))]
    pub uid: String,
}

/// Resources and ports in effect for a machine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveResources {
    /// Virtual CPUs in effect.
    pub cpus: i32,
    /// Memory in MiB in effect.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: i64,
    /// Storage disk size in GiB in effect.
    #[serde(rename = "storageGiB")]
    pub storage_gib: i64,
    /// Overlay size in GiB in effect.
    #[serde(rename = "overlayGiB")]
    pub overlay_gib: i64,
    /// Forwarded ports in effect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub ports: Vec<Port>,
}

impl EffectiveResources {
    /// Disk a machine takes on its node: storage plus overlay, in GiB.
    pub fn disk_gib(&self) -> i64 {
        self.storage_gib.saturating_add(self.overlay_gib)
    }

    /// The share of a node this machine takes.
    pub fn request(&self) -> NodeResources {
        NodeResources {
            cpus: i64::from(self.cpus),
            memory_mib: self.memory_mib,
            storage_gib: self.disk_gib(),
        }
    }
}
