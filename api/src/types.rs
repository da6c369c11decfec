//! The `SmolVM` and `SmolVMNode` custom resources (`SmolVMClass` is in [`crate::class`]) (group `vm.smolvm.dev`, version `v1alpha1`).
//!
//! Doc comments become the `kubectl explain` descriptions; `#[x_kube(validation)]` rules become
//! the CRD's `x-kubernetes-validations` (CEL), which keep the API safe even while the webhook is
//! down. Rules that CEL cannot express (identities, policy, cross-object checks) live in
//! [`crate::validate`].

// Clippy's duplicated_attributes lint misreads kube's repeated `printcolumn(type_ = ...)` arguments.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

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
/// Most ports a schema admits (the policy usually allows fewer).
pub const MAX_PORTS_SCHEMA: usize = 64;
/// Most allowed CIDRs a schema admits (the policy usually allows fewer).
pub const MAX_CIDRS_SCHEMA: usize = 64;
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
    printcolumn(name = "Address", type_ = "string", json_path = ".status.nodeAddress", priority = 1, description = "The node's InternalIP, where the published ports are reachable"),
    printcolumn(name = "Ports", type_ = "string", json_path = ".status.ports", priority = 1, description = "Published ports: hostPort->guestPort/protocol"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].reason", priority = 1, description = "Why the machine is or is not ready"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("!has(self.status) || !has(self.status.nodeName) || !has(self.spec.nodeName) || self.spec.nodeName == self.status.nodeName")
        .message("spec.nodeName must equal status.nodeName once bound: SmolVMs never move; delete and recreate (V5)")
        .field_path(".spec.nodeName"),
    validation = Rule::new("has(self.spec.image)")
        .message("spec.image is required: name the image to boot, or a pool in spec.poolRef whose template gives it (V1)")
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

    /// Image the machine boots: an OCI reference such as `alpine:latest` or `registry.example.com/org/app@sha256:...`, or `local:<name>` for an image in the node's local image directory. Required, except that a SmolVM naming a pool in `poolRef` gets its pool's. Immutable once the SmolVM is bound to a node.
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

/// The schema's most `env` entries (the policy's `maxEnv` may lower it).
pub const MAX_ENV: i64 = 256;
/// The schema's most `command` (and `args`) entries (the policy's `maxArgs` may lower it).
pub const MAX_ARGS: i64 = 256;
/// The schema's most `network.allowedHosts` entries (the policy's `maxAllowedHosts` may lower it).
pub const MAX_ALLOWED_HOSTS: i64 = 64;
/// The schema's most bytes per env value, command or args entry (the policy's `maxValueBytes`
/// may lower it).
pub const MAX_VALUE_BYTES: i64 = 32_768;

/// One environment variable of the workload.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.value) != has(self.valueFrom)").message("an env entry has exactly one of value and valueFrom (V11)"))]
pub struct EnvVar {
    /// Name of the variable: not empty, without '='.
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(validation = Rule::new("!self.contains('=')").message("an env name must not contain '=' (V11)"))]
    pub name: String,

    /// A literal value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub value: Option<String>,

    /// A value read from a key of a Secret or ConfigMap in the SmolVM's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

/// Where an env value comes from: exactly one of a Secret's or a ConfigMap's key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.secretKeyRef) != has(self.configMapKeyRef)").message("valueFrom has exactly one of secretKeyRef and configMapKeyRef (V11)"))]
pub struct EnvVarSource {
    /// A key of a Secret in the SmolVM's namespace (the controller needs the workload-secrets component to read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeySelector>,

    /// A key of a ConfigMap in the SmolVM's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeySelector>,
}

/// A key of a Secret or ConfigMap.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct KeySelector {
    /// Name of the Secret or ConfigMap (a DNS-1123 subdomain).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("a referenced name must be a DNS-1123 subdomain (V11)"))]
    pub name: String,

    /// The key: letters, digits, '-', '_' and '.'.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$')").message("a key is made of letters, digits, '-', '_' and '.' (V11)"))]
    pub key: String,

    /// Whether a missing object or key is allowed (the variable is then left out). Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// A reference to an object by name in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// Name of the object (a DNS-1123 subdomain).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("imagePullSecrets names must be DNS-1123 subdomains (V11)"))]
    pub name: String,
}

/// What happens when the workload's machine stops on its own while spec.running is true.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum RestartPolicy {
    /// Started again by the controller after every exit, while spec.running is true (the default).
    #[default]
    Always,
    /// Restarted by smolvm after a failed exit; left stopped after a clean one.
    OnFailure,
    /// Left stopped after any exit.
    Never,
}

impl RestartPolicy {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "Always",
            RestartPolicy::OnFailure => "OnFailure",
            RestartPolicy::Never => "Never",
        }
    }
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

/// Networking of a machine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.ports) || size(self.ports) == 0 || (has(self.enabled) && self.enabled)").message("ports need network.enabled: true (V3)").field_path(".ports"))]
#[x_kube(validation = Rule::new("!has(self.allowedCIDRs) || size(self.allowedCIDRs) == 0 || (has(self.enabled) && self.enabled)").message("allowedCIDRs need network.enabled: true (V3)").field_path(".allowedCIDRs"))]
#[x_kube(validation = Rule::new("!has(self.allowedHosts) || size(self.allowedHosts) == 0 || (has(self.enabled) && self.enabled)").message("allowedHosts need network.enabled: true (V11)").field_path(".allowedHosts"))]
pub struct Network {
    /// Whether the machine has a network interface. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Host ports forwarded into the machine. Each (hostPort, protocol) pair is unique, and the host port must lie in the policy's allowed range (by default 1024 to 65535).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["hostPort".into(), "protocol".into()]))]
    pub ports: Option<Vec<Port>>,

    /// Destination CIDRs the machine may reach (for example `10.0.0.0/8` or `2001:db8::/32`). Empty means no restriction beyond smolvm's defaults.
    #[serde(default, rename = "allowedCIDRs", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("every allowedCIDRs entry must be a CIDR such as 10.0.0.0/8 (V3)"))]
    pub allowed_cidrs: Option<Vec<CidrString>>,

    /// Host names the machine may reach, with their subdomains (smolvm `allowedHosts`): DNS names such as `api.example.com`, or `*.example.com`. Needs `enabled`. Immutable once bound; the policy bounds the number (by default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        inner(
            length(min = 1, max = 253),
            regex(pattern = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        )
    )]
    pub allowed_hosts: Option<Vec<String>>,

    /// Whether the controller keeps a Service named like the SmolVM in its namespace (ClusterIP, one port per published port, named `<protocol>-<guestPort>`, targetPort = hostPort), whose EndpointSlice points at the node's InternalIP while the machine runs. A Service of that name the SmolVM does not own is never touched. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expose_service: Option<bool>,
}

/// A CIDR in string form (at most 64 characters).
pub type CidrString = String;

/// One forwarded port.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// Port on the node's host network, 1 to 65535 and inside the policy's allowed range.
    #[schemars(range(min = 1, max = 65535))]
    pub host_port: i32,

    /// Port inside the machine, 1 to 65535.
    #[schemars(range(min = 1, max = 65535))]
    pub guest_port: i32,

    /// Transport protocol: TCP (the default) or UDP.
    #[serde(default = "default_protocol")]
    #[schemars(extend("maxLength" = 3))]
    pub protocol: Protocol,
}

fn default_protocol() -> Protocol {
    Protocol::Tcp
}

/// Transport protocol of a forwarded port.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default,
)]
pub enum Protocol {
    /// TCP.
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
}

impl Protocol {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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

    /// Current state as conditions: Scheduled, Ready, Suspended, DeletionBlocked, ResizePending, ServiceExposed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
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

impl SmolVMSpec {
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

impl SmolVM {
    /// The node this VM is bound to, if any.
    pub fn bound_node(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.node_name.as_deref())
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
