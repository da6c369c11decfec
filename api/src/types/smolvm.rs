//! The `SmolVM` custom resource: its spec (what to run, how big, where, whether it runs), the
//! defaults rule M1 gives it, and what its fields read with those defaults applied. Its network
//! is in `network`, its workload in `workload`, its status in `status`.

// Clippy's duplicated_attributes lint misreads kube's repeated `printcolumn(type_ = ...)` arguments.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{
    network::{Network, Port},
    node::NodeResources,
    status::{EffectiveResources, SmolVMStatus},
    workload::{EnvVar, LocalObjectReference, RestartPolicy},
};

/// Default of `spec.running` (rule M1).
pub const DEFAULT_RUNNING: bool = true;
/// Default of `spec.suspended` (rule M1).
pub const DEFAULT_SUSPENDED: bool = false;
/// Default of `spec.resources.cpus` (rule M1).
pub const DEFAULT_CPUS: i32 = 1;
/// Default of `spec.resources.memoryMiB` (rule M1).
pub const DEFAULT_MEMORY_MIB: i64 = 512;
/// Default of `spec.storage.storageGiB` (rule M1).
pub const DEFAULT_STORAGE_GIB: i64 = 20;
/// Default of `spec.storage.overlayGiB` (rule M1).
pub const DEFAULT_OVERLAY_GIB: i64 = 10;
/// Default of `spec.network.exposeService` (rule M1).
pub const DEFAULT_EXPOSE_SERVICE: bool = false;
/// Default of `spec.network.enabled` (rule M1).
pub const DEFAULT_NETWORK_ENABLED: bool = false;
/// Default `spec.restartPolicy` (M1).
pub const DEFAULT_RESTART_POLICY: RestartPolicy = RestartPolicy::Always;
/// Default `spec.terminationGracePeriodSeconds` (M1).
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 10;

/// Longest accepted image reference.
pub const MAX_IMAGE_LEN: usize = 512;
/// Most nodeSelector entries.
pub const MAX_SELECTOR_ENTRIES: usize = 32;

/// Desired state of a SmolVM: what to run, how big, where, and whether it runs.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "vm.smolvm.dev",
    version = "v1alpha1",
    kind = "SmolVM",
    doc = "A microVM run by smolvm on one node of the cluster. The controller places it on a node (or honours spec.nodeName), binds it there for good in status.nodeName, and drives that node's runtime agent.",
    plural = "smolvms",
    singular = "smolvm",
    namespaced,
    status = "SmolVMStatus",
    shortname = "svm",
    category = "smolvm-all",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", description = "Lifecycle phase of the machine"),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.nodeName", description = "Node the machine is bound to"),
    printcolumn(name = "CPUs", type_ = "integer", json_path = ".spec.resources.cpus", description = "Virtual CPUs"),
    printcolumn(name = "Memory", type_ = "integer", json_path = ".spec.resources.memoryMiB", description = "Memory in MiB"),
    printcolumn(name = "Suspended", type_ = "string", json_path = ".status.conditions[?(@.type==\"Suspended\")].reason", description = "Suspended (memory and disks saved, CPU and memory given back to the node), Suspending, Resuming or ResumePending"),
    printcolumn(name = "Class", type_ = "string", json_path = ".spec.className", priority = 1, description = "The SmolVMClass whose defaults it took at CREATE"),
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.image", priority = 1, description = "Image the machine boots"),
    printcolumn(name = "Branch Of", type_ = "string", json_path = ".spec.branchOf.name", priority = 1, description = "The SmolVM this one is a branch of"),
    printcolumn(name = "Address", type_ = "string", json_path = ".status.nodeAddress", priority = 1, description = "The node's InternalIP, where the published ports are reachable"),
    printcolumn(name = "Ports", type_ = "string", json_path = ".status.ports", priority = 1, description = "Published ports: hostPort->guestPort/protocol"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].reason", priority = 1, description = "Why the machine is or is not ready"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("!has(self.status) || !has(self.status.nodeName) || !has(self.spec.nodeName) || self.spec.nodeName == self.status.nodeName")
        .message("spec.nodeName must equal status.nodeName once bound: SmolVMs never move; delete and recreate (V5)")
        .field_path(".spec.nodeName"),
    validation = Rule::new("has(self.spec.image)")
        .message("spec.image is required: name the image to boot, a pool in spec.poolRef whose template gives it, or a branch source in spec.branchOf (V1)")
        .field_path(".spec.image"),
)]
#[serde(rename_all = "camelCase")]
pub struct SmolVMSpec {
    /// Whether the machine should be running. Set to false to stop it while keeping its disks. Defaults to true. False wins over `suspended`: the machine stops and any saved memory is discarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<bool>,

    /// Whether the machine is suspended: paused through smolvm with its memory and disks saved durably on its node, its process stopped, and its CPU and memory given back to the node (its disks and the saved memory stay counted, and its host ports stay reserved). Set back to false to resume it on the same node with its processes as they were; a resume waits, with the Suspended condition saying why, while the node lacks the CPU or memory. A machine with nothing saved yet (at create, or after a stop) is started and then suspended. Has no effect while `running` is false. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<bool>,

    /// Image the machine boots: an OCI reference such as `alpine:latest` or `registry.example.com/org/app@sha256:...`, or `local:<name>` for an image in the node's local image directory. Required, except that a SmolVM naming a pool in `poolRef` gets its pool's, and a branch (`branchOf`) its source's. Immutable once the SmolVM is bound to a node.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("!self.startsWith('local:') || self.matches('^local:[A-Za-z0-9][A-Za-z0-9._-]{0,127}$')").message("a local image is local:<name>, the name made of letters, digits, '.', '_' and '-' (V1)"))]
    #[x_kube(validation = Rule::new("!self.matches('\\\\s')").message("an image reference has no whitespace (V1)"))]
    #[x_kube(validation = Rule::new("self.startsWith('local:') || self.matches('^([^/@]+/)?[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@[a-z][a-z0-9+._-]*:[0-9a-f]{32,})?$')").message("an image is an OCI reference, [registry/]path[:tag][@digest] with a lower-case path, or local:<name> (V1)"))]
    pub image: String,

    /// Optional hard pin to the SmolVMNode (and Kubernetes Node) of this name. The controller never falls back to another node. Once bound, it may only be absent or equal to `status.nodeName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("nodeName must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.' (V4)"))]
    pub node_name: Option<String>,

    /// Labels a SmolVMNode must carry for the machine to be placed there. SmolVMNodes mirror the labels of their Kubernetes Node, so `kubernetes.io/arch: amd64` works as with Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 32, "additionalProperties" = {"type": "string", "maxLength": 63}))]
    #[x_kube(validation = Rule::new("self.all(k, size(k) <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))").message("nodeSelector keys must be valid label keys: [prefix/]name (V4)"))]
    #[x_kube(validation = Rule::new("self.all(k, self[k].matches('^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$'))").message("nodeSelector values must be valid label values: at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric (V4)"))]
    pub node_selector: Option<BTreeMap<String, LabelValue>>,

    /// CPU and memory of the machine. Defaults to 1 CPU and 512 MiB. May change after binding, within the policy bounds; the runtime applies it live where smolvm supports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,

    /// Disk sizes of the machine. Defaults to 20 GiB of storage and a 10 GiB overlay. After binding, sizes may only grow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,

    /// Networking of the machine. Disabled by default. Immutable once bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,

    /// The workload's entrypoint, as a Pod's `command`: replaces the image's entrypoint (smolvm `entrypoint`). Not run through a shell; use `["/bin/sh", "-c", "..."]` for one. Omitted: the image's own. Immutable once bound; the policy bounds the number of entries (by default 64) and the bytes of each (16384).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(max = 32768)))]
    pub command: Option<Vec<String>>,

    /// Arguments to the entrypoint, as a Pod's `args` (smolvm `cmd`). Omitted: the image's own. Immutable once bound; bounded like `command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(max = 32768)))]
    pub args: Option<Vec<String>>,

    /// Working directory of the workload, an absolute path (smolvm `workdir`). Omitted: the image's own. Immutable once bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("workingDir must be an absolute path (V11)"))]
    pub working_dir: Option<String>,

    /// Environment of the workload, as in a Pod: each entry a literal `value` or a `valueFrom` reference to a key of a Secret or ConfigMap in the SmolVM's namespace, resolved by the controller when it creates the machine. A missing reference that is not `optional` keeps the machine from being created (Ready=False, reason CreateConfigError). Names are unique; immutable once bound; the policy bounds the number (by default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub env: Option<Vec<EnvVar>>,

    /// Secrets of type `kubernetes.io/dockerconfigjson` in the SmolVM's namespace holding credentials for private registries, as in a Pod. The credential for the image's registry is sent with every start and never stored on the node or in status. Immutable once bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,

    /// What happens when the machine stops on its own while `running` is true: Always (the default) starts it again; OnFailure leaves it stopped after a clean exit (smolvm restarts it after a failed one); Never leaves it stopped. A machine left stopped reports Ready=False with reason Exited: set `running` to false, then back to true, to run it again. A failed start is retried whatever the policy. Immutable once bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,

    /// Seconds the workload gets to exit after its stop signal before it is killed, 0 to 300 (smolvm `stopTimeoutSecs`). Defaults to 10. Immutable once bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 300))]
    pub termination_grace_period_seconds: Option<i64>,

    /// The SmolVMClass (instance type) whose defaults fill, at CREATE, every field this SmolVM leaves unset: resources, storage, network.enabled, allowedCIDRs and allowedHosts, nodeSelector, restartPolicy, terminationGracePeriodSeconds. Fields set here always win. Omitted: the class annotated `vm.smolvm.dev/is-default-class: "true"`, if any, whose name is then written here. Must name an existing class; never changes after CREATE (see `kubectl get smolvmclasses`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("className must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.' (V12)"))]
    pub class_name: Option<String>,

    /// The SmolVMPool in this namespace this SmolVM is served from: at CREATE it takes every field of its spec from the pool's template (and its nodeSelector), and is then served from a ready slot, in milliseconds instead of a cold boot. It sets only `env` (carried to the slot), `running` and `suspended` itself. Never changes after CREATE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<PoolRef>,

    /// Data that outlives the VM, as a Pod's volumes with the mount on the same item: an existing PersistentVolumeClaim, a claim made from a template, or a ConfigMap's or Secret's keys as read-only files. The kubelet mounts them into a holder Pod on the VM's node (`kubectl get pods -l vm.smolvm.dev/smolvm=NAME`) and the node's agent passes them to the guest; the machine is created only once every volume is mounted (the VolumesReady condition says what it waits for). Immutable once bound; the policy bounds the number (by default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = Rule::new("self.all(v, self.exists_one(w, w.mountPath == v.mountPath))").message("each volume has its own mountPath (V16)"))]
    pub volumes: Option<Vec<crate::volume::Volume>>,

    /// Start the machine as a branch source (SPEC 2.6): smolvm keeps it ready to be branched, so that SmolVMs naming it in `branchOf` are made as copy-on-write clones of it as it runs (memory and disks), in milliseconds instead of a boot. A branchable SmolVM carries no volumes (a branch would share them) and is no branch itself. Never changes after CREATE. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branchable: Option<bool>,

    /// The branchable SmolVM in this namespace this SmolVM is a branch of (SPEC 2.6): at CREATE it takes its spec from the source's, except `branchable`, `volumes`, `nodeName` and the published ports; it is placed on the source's node and made, once the source runs, as a copy-on-write clone of the running machine. It sets only `env` (its own, delivered to the clone), `running`, `suspended` and `network.ports` (its own published ports; none otherwise) itself. Never changes after CREATE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_of: Option<BranchOf>,

    /// How long the SmolVM lives (SPEC 2.7), as a Job's lifetimes: `ttlSecondsAfterFinished` deletes it that long after its machine finished (stopped on its own, and its restartPolicy keeps it stopped), `activeDeadlineSeconds` that long after it first ran. The deletion goes through the normal node-aware cleanup, with an Expired event. May change at any time; a branch may set its own (it takes its source's otherwise), a SmolVMClass and a pool's template may carry one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<super::Lifecycle>,
}

/// The SmolVM a branch is made from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BranchOf {
    /// Name of a branchable SmolVM in the branch's namespace.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("branchOf.name must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.' (V17)"))]
    pub name: String,
}

/// The pool a SmolVM is served from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PoolRef {
    /// Name of a SmolVMPool in the SmolVM's namespace.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("poolRef.name must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.' (V14)"))]
    pub name: String,
}

/// A label value (at most 63 characters).
pub type LabelValue = String;

/// CPU and memory of a machine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// Number of virtual CPUs. Defaults to 1; the policy bounds it (by default 1 to 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub cpus: Option<i32>,

    /// Memory in MiB. Defaults to 512; the policy bounds it (by default 128 to 131072).
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16777216))]
    pub memory_mib: Option<i64>,
}

/// Disk sizes of a machine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Storage {
    /// Size of the machine's storage disk in GiB. Defaults to 20. May only grow once bound.
    #[serde(default, rename = "storageGiB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub storage_gib: Option<i64>,

    /// Size of the writable overlay on top of the image, in GiB. Defaults to 10. May only grow once bound.
    #[serde(default, rename = "overlayGiB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub overlay_gib: Option<i64>,
}

impl SmolVMSpec {
    /// `lifecycle.ttlSecondsAfterFinished`, when set.
    pub fn ttl_seconds_after_finished(&self) -> Option<i64> {
        self.lifecycle.as_ref().and_then(|l| l.ttl_seconds_after_finished)
    }

    /// `lifecycle.suspendAfterIdle`, when set and valid.
    pub fn suspend_after_idle(&self) -> Option<std::time::Duration> {
        self.lifecycle.as_ref().and_then(super::Lifecycle::idle_after)
    }

    /// Whether traffic wakes it from an idle suspension (`lifecycle.wakeOnTraffic`, M6).
    pub fn wakes_on_traffic(&self) -> bool {
        self.lifecycle.as_ref().is_some_and(super::Lifecycle::wakes_on_traffic)
    }

    /// `lifecycle.activeDeadlineSeconds`, when set.
    pub fn active_deadline_seconds(&self) -> Option<i64> {
        self.lifecycle.as_ref().and_then(|l| l.active_deadline_seconds)
    }

    /// Whether the machine should run, defaults applied.
    pub fn running(&self) -> bool {
        self.running.unwrap_or(DEFAULT_RUNNING)
    }

    /// Whether the machine should be suspended, defaults applied (and only while it should run:
    /// `running: false` wins).
    pub fn suspended(&self) -> bool {
        self.running() && self.suspended.unwrap_or(DEFAULT_SUSPENDED)
    }

    /// Whether networking is enabled, defaults applied.
    pub fn network_enabled(&self) -> bool {
        self.network
            .as_ref()
            .and_then(|n| n.enabled)
            .unwrap_or(DEFAULT_NETWORK_ENABLED)
    }

    /// Whether the controller keeps a Service for the VM, defaults applied.
    pub fn expose_service(&self) -> bool {
        self.network
            .as_ref()
            .and_then(|n| n.expose_service)
            .unwrap_or(DEFAULT_EXPOSE_SERVICE)
    }

    /// Whether the machine is started as a branch source, defaults applied.
    pub fn branchable(&self) -> bool {
        self.branchable.unwrap_or(false)
    }

    /// The SmolVM this one is a branch of, if any.
    pub fn source(&self) -> Option<&str> {
        self.branch_of.as_ref().map(|b| b.name.as_str())
    }

    /// Forwarded ports (empty when none).
    pub fn ports(&self) -> &[Port] {
        self.network.as_ref().and_then(|n| n.ports.as_deref()).unwrap_or(&[])
    }

    /// Allowed CIDRs (empty when none).
    pub fn allowed_cidrs(&self) -> &[String] {
        self.network
            .as_ref()
            .and_then(|n| n.allowed_cidrs.as_deref())
            .unwrap_or(&[])
    }

    /// Allowed host names (empty when none).
    pub fn allowed_hosts(&self) -> &[String] {
        self.network
            .as_ref()
            .and_then(|n| n.allowed_hosts.as_deref())
            .unwrap_or(&[])
    }

    /// The restart policy, defaulted.
    pub fn restart_policy(&self) -> RestartPolicy {
        self.restart_policy.unwrap_or(DEFAULT_RESTART_POLICY)
    }

    /// The termination grace period in seconds, defaulted.
    pub fn termination_grace_period_seconds(&self) -> i64 {
        self.termination_grace_period_seconds
            .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
    }

    /// The share of a node this machine takes, defaults applied (no allocation).
    pub fn request(&self) -> NodeResources {
        let resources = self.resources.as_ref();
        let storage = self.storage.as_ref();
        let disk = storage
            .and_then(|s| s.storage_gib)
            .unwrap_or(DEFAULT_STORAGE_GIB)
            .saturating_add(storage.and_then(|s| s.overlay_gib).unwrap_or(DEFAULT_OVERLAY_GIB));
        NodeResources {
            cpus: i64::from(resources.and_then(|r| r.cpus).unwrap_or(DEFAULT_CPUS)),
            memory_mib: resources.and_then(|r| r.memory_mib).unwrap_or(DEFAULT_MEMORY_MIB),
            storage_gib: disk,
        }
    }

    /// Resources and ports with every default applied: what the machine gets on its node.
    pub fn effective(&self) -> EffectiveResources {
        let resources = self.resources.as_ref();
        let storage = self.storage.as_ref();
        EffectiveResources {
            cpus: resources.and_then(|r| r.cpus).unwrap_or(DEFAULT_CPUS),
            memory_mib: resources.and_then(|r| r.memory_mib).unwrap_or(DEFAULT_MEMORY_MIB),
            storage_gib: storage.and_then(|s| s.storage_gib).unwrap_or(DEFAULT_STORAGE_GIB),
            overlay_gib: storage.and_then(|s| s.overlay_gib).unwrap_or(DEFAULT_OVERLAY_GIB),
            ports: self.ports().to_vec(),
        }
    }
}

impl SmolVM {
    /// The node this VM is bound to, if any.
    pub fn bound_node(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.node_name.as_deref())
    }

    /// Whether its status says the controller suspended it for idleness (SPEC 2.7): the
    /// Suspended condition True with reason IdleSuspended (`spec.suspended` stays false).
    pub fn idle_suspended(&self) -> bool {
        use crate::constants::{condition, reason};
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == condition::SUSPENDED && c.status == "True" && c.reason == reason::IDLE_SUSPENDED)
        })
    }

    /// Whether the object is being deleted.
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The name of this VM's machine on its node: `svm-<metadata.uid>`, lower-cased. It derives
    /// from the UID alone, so a re-created object of the same name never adopts an old machine and
    /// nothing written to the status can point the controller at another VM's machine. `None`
    /// before the API server has assigned a UID.
    pub fn machine_name(&self) -> Option<String> {
        self.metadata
            .uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .map(|uid| format!("{}{}", crate::constants::MACHINE_NAME_PREFIX, uid.to_ascii_lowercase()))
    }
}
