//! The `SmolVMNode` custom resource: a node that can run SmolVMs, its spec set by cluster admins
//! and its status reported by its runtime agent (endpoint, resources, machines, warm pools,
//! serving certificate, guest boot check).

// Clippy's duplicated_attributes lint misreads kube's repeated `printcolumn(type_ = ...)` arguments.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Desired state of a SmolVMNode, set by cluster admins.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "vm.smolvm.dev",
    version = "v1alpha1",
    kind = "SmolVMNode",
    doc = "A node that can run SmolVMs, reported by its runtime agent. Its name is the Kubernetes Node's name, and the Node owns it.",
    plural = "smolvmnodes",
    singular = "smolvmnode",
    status = "SmolVMNodeStatus",
    shortname = "svmn",
    category = "smolvm-all",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the runtime serves"
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".status.endpoint.address",
        description = "Node API address"
    ),
    printcolumn(
        name = "Port",
        type_ = "integer",
        json_path = ".status.endpoint.port",
        priority = 1,
        description = "Node API port"
    ),
    printcolumn(
        name = "Bootable",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"GuestBootable\")].status",
        description = "Whether a canary guest booted here (GuestBootable)"
    ),
    printcolumn(
        name = "Boot-ms",
        type_ = "integer",
        json_path = ".status.canary.bootMillis",
        description = "How long the last canary boot took, in milliseconds"
    ),
    printcolumn(
        name = "CPUs",
        type_ = "integer",
        json_path = ".status.allocatable.cpus",
        description = "Allocatable CPUs"
    ),
    printcolumn(
        name = "Memory",
        type_ = "integer",
        json_path = ".status.allocatable.memoryMiB",
        description = "Allocatable memory in MiB"
    ),
    printcolumn(
        name = "Runtime",
        type_ = "string",
        json_path = ".status.runtimeVersion",
        description = "smolvm version"
    ),
    printcolumn(
        name = "Heartbeat",
        type_ = "date",
        json_path = ".status.heartbeatTime",
        description = "Last heartbeat"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct SmolVMNodeSpec {
    /// Cordon for VMs: when true, no new SmolVM is placed on this node. Machines already bound here stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unschedulable: Option<bool>,
}

/// Observed state of a node, written by its runtime agent.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SmolVMNodeStatus {
    /// UID of the Kubernetes Node this agent runs on.
    #[serde(default, rename = "nodeUID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub node_uid: Option<String>,

    /// Where the node API listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,

    /// The Kubernetes Node's InternalIP (from the Node): where the published ports of the VMs on this node are reachable.
    #[serde(default, rename = "internalIP", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub internal_ip: Option<String>,

    /// Version of smolvm on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub runtime_version: Option<String>,

    /// Node API protocol version the agent speaks (for example `v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub protocol_version: Option<String>,

    /// Last time the agent reported; a stale heartbeat makes the node ineligible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<Time>,

    /// Total machine resources of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<NodeResources>,

    /// Resources available to SmolVMs: capacity minus the agent's reservations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<NodeResources>,

    /// Names of the machines smolvm holds on this node, as the agent last listed them (sorted). The controller compares them with the SmolVMs bound here: a machine no live SmolVM owns is an orphan, counted against the node at once and deleted after a grace period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096), inner(length(min = 1, max = 128)))]
    pub machines: Option<Vec<String>>,

    /// Names of the machines on this node that are suspended (paused by the agent, their memory and disks saved; sorted), a subset of `machines`. A suspended machine holds no CPU or memory here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096), inner(length(min = 1, max = 128)))]
    pub suspended_machines: Option<Vec<String>>,

    /// The last activity of each machine on this node that had any since its agent started (sorted by name): bytes through its published ports, or an exec, log-follow or copy session. Reported with the heartbeat (coarse: at most one change per heartbeat). The controller notes by its own clock when each value changes, and suspends a VM with `lifecycle.suspendAfterIdle` that stayed quiet that long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub activity: Option<Vec<MachineActivity>>,

    /// Machines suspended for idleness that a connection to a published port (or an access session) asked to wake, sorted: the agent holds those connections until the machine runs. Written at once when a wake is asked for; the controller resumes each one as any resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096), inner(length(min = 1, max = 128)))]
    pub wake_requests: Option<Vec<String>>,

    /// The warm pools on this node, as its agent last listed them (sorted by name): each pool's slots ready to serve, wanted, and leased. The controller places a SmolVM naming a pool where its pool has a ready slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub pools: Option<Vec<NodePool>>,

    /// The node API's serving certificate, as the agent last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_certificate: Option<ServingCertificate>,

    /// The last guest boot check (canary) the agent ran; absent with the check off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStatus>,

    /// Current state as conditions: Ready, KVMAvailable, RuntimeReady, GuestBootable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The last activity of one machine, as its agent reports it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MachineActivity {
    /// The machine's name (`svm-<SmolVM uid>`).
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    /// When the agent last saw traffic or a session for it (its own clock, whole seconds): a marker whose changes the controller notes, never compared with the controller's clock.
    pub last_active_time: Time,
}

/// One warm pool on a node, as its agent reports it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodePool {
    /// The pool's name on the node (its source machine's).
    #[schemars(length(max = 128))]
    pub name: String,
    /// Slots ready to serve.
    pub ready: i32,
    /// Ready slots wanted.
    pub slots: i32,
    /// Machines served from it and still leased.
    pub leased: i32,
}

/// The last guest boot check of a node: a smallest machine from smolvm's own guest (no image
/// pull, no network) created, started and deleted by the agent.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    /// When the check last finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<Time>,
    /// How long the guest took to boot, in milliseconds, when it booted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub boot_millis: Option<i64>,
    /// The smolvm version the check ran with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub smolvm_version: Option<String>,
}

/// A node API serving certificate, as its agent reports it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ServingCertificate {
    /// SHA-256 fingerprint (`sha256:` and 64 hex digits) of the runtime CA that signed it. During a runtime CA rotation the controller keeps the old CA trusted until every live node reports the new CA's fingerprint here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 71))]
    pub ca_fingerprint: Option<String>,
    /// When it expires; the agent renews it after two thirds of its lifetime, and at once when the runtime CA changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<Time>,
}

/// Address and port of a node API.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// IP address or DNS name the controller connects to.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("isIP(self) || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("endpoint.address must be an IP address or a DNS-1123 subdomain (V10)"))]
    pub address: String,
    /// TCP port, 1 to 65535.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// Resources of a node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeResources {
    /// CPUs.
    #[schemars(range(min = 0))]
    pub cpus: i64,
    /// Memory in MiB.
    #[serde(rename = "memoryMiB")]
    #[schemars(range(min = 0))]
    pub memory_mib: i64,
    /// Storage in GiB.
    #[serde(rename = "storageGiB")]
    #[schemars(range(min = 0))]
    pub storage_gib: i64,
}

impl NodeResources {
    /// Whether these resources can hold `request` in every dimension.
    pub fn holds(&self, request: &NodeResources) -> bool {
        request.cpus <= self.cpus && request.memory_mib <= self.memory_mib && request.storage_gib <= self.storage_gib
    }

    /// These resources minus `used`, never below zero.
    pub fn minus(&self, used: &NodeResources) -> NodeResources {
        NodeResources {
            cpus: self.cpus.saturating_sub(used.cpus).max(0),
            memory_mib: self.memory_mib.saturating_sub(used.memory_mib).max(0),
            storage_gib: self.storage_gib.saturating_sub(used.storage_gib).max(0),
        }
    }

    /// Sum of two resource amounts.
    pub fn plus(&self, other: &NodeResources) -> NodeResources {
        NodeResources {
            cpus: self.cpus.saturating_add(other.cpus),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
            storage_gib: self.storage_gib.saturating_add(other.storage_gib),
        }
    }
}

impl std::fmt::Display for NodeResources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} CPUs, {} MiB memory, {} GiB disk",
            self.cpus, self.memory_mib, self.storage_gib
        )
    }
}
