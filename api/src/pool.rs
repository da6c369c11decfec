//! The `SmolVMPool` custom resource (warm pools, SPEC section 2.4) and the catalogue of known
//! pools that admission reads.
//!
//! A pool keeps `slotsPerNode` machines made from its template booted and ready on every node
//! its `nodeSelector` matches, through smolvm's own fork pools. A SmolVM that names the pool in
//! `spec.poolRef` takes its whole spec from the template at CREATE (rule M4,
//! [`crate::defaulting`]) and is served from a ready slot. Rule V14 ([`crate::validate`]) keeps
//! the template within every SmolVM rule and a pooled SmolVM to what a lease can carry.

// Clippy's duplicated_attributes lint misreads kube's repeated `printcolumn(type_ = ...)` arguments.
#![allow(clippy::duplicated_attributes)]

use std::{borrow::Borrow, collections::BTreeMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use crate::types::PoolRef;
use crate::types::{EnvVar, LabelValue, LocalObjectReference, Network, Resources, RestartPolicy, SmolVMSpec, Storage};

/// The fields a pooled SmolVM may set besides `poolRef`: what a lease carries (`env`) and its
/// lifecycle (`running`, `suspended`). Everything else comes from the pool's template (V14).
pub const POOLED_FIELDS: [&str; 4] = ["poolRef", "env", "running", "suspended"];

/// The schema's most `slotsPerNode` (the policy's `maxSlotsPerNode` may lower it).
pub const MAX_SLOTS_PER_NODE: i64 = 1024;

/// A set of warm slots: machines made from one template, kept booted and ready on every
/// matching node, from which SmolVMs naming the pool are served.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "vm.smolvm.dev",
    version = "v1alpha1",
    kind = "SmolVMPool",
    doc = "A warm pool of SmolVMs: on every node its nodeSelector matches, smolvm keeps slotsPerNode machines made from spec.template booted and ready. A SmolVM that names the pool in spec.poolRef takes its spec from the template at CREATE and is served from a ready slot, in milliseconds instead of a cold boot; when no slot is ready it is created cold or waits, as spec.whenEmpty says.",
    plural = "smolvmpools",
    singular = "smolvmpool",
    namespaced,
    status = "SmolVMPoolStatus",
    shortname = "svmp",
    category = "smolvm-all",
    printcolumn(
        name = "Slots/Node",
        type_ = "integer",
        json_path = ".spec.slotsPerNode",
        description = "Ready slots asked for on each matching node (as many as fit are kept)"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readySlots",
        description = "Slots ready to serve, on all nodes"
    ),
    printcolumn(
        name = "Total",
        type_ = "integer",
        json_path = ".status.totalSlots",
        description = "Slots kept, on all matching nodes: as many as fit in their spare room and the quota"
    ),
    printcolumn(
        name = "When Empty",
        type_ = "string",
        json_path = ".spec.whenEmpty",
        description = "What a SmolVM gets when no slot is ready: Cold or Wait"
    ),
    printcolumn(
        name = "Image",
        type_ = "string",
        json_path = ".spec.template.image",
        priority = 1,
        description = "Image of the template"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct SmolVMPoolSpec {
    /// What every slot runs, and so every SmolVM served from the pool: the fields of a SmolVM spec that describe the machine. A SmolVM naming the pool gets all of them at CREATE; it sets only `env`, `running` and `suspended` itself. A change replaces the idle slots and never touches SmolVMs already served.
    pub template: PoolTemplate,

    /// Ready slots kept on each matching node, 0 or more, within the policy's `maxSlotsPerNode`. smolvm boots a replacement whenever a slot is taken. 0 keeps the pool's template and serves every SmolVM cold.
    #[schemars(range(min = 0, max = 1024))]
    pub slots_per_node: i32,

    /// Labels a SmolVMNode must carry to hold slots of this pool; SmolVMs served from the pool are placed on such nodes. Omitted: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 32, "additionalProperties" = {"type": "string", "maxLength": 63}))]
    #[x_kube(validation = Rule::new("self.all(k, size(k) <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))").message("nodeSelector keys must be valid label keys: [prefix/]name (V4)"))]
    #[x_kube(validation = Rule::new("self.all(k, self[k].matches('^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$'))").message("nodeSelector values must be valid label values: at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric (V4)"))]
    pub node_selector: Option<BTreeMap<String, LabelValue>>,

    /// What a SmolVM naming the pool gets when no node has a ready slot: `Cold` (the default) creates its machine from the template as any SmolVM, `Wait` keeps it pending until a slot is ready. Its Ready condition says which happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_empty: Option<WhenEmpty>,
}

/// The machine every slot of a pool runs: the fields of a SmolVM spec that describe it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PoolTemplate {
    /// Image the slots boot, as a SmolVM's `image`.
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("!self.matches('\\\\s')").message("an image reference has no whitespace (V1)"))]
    pub image: String,

    /// The SmolVMClass whose defaults fill what the template leaves unset, as a SmolVM's `className`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub class_name: Option<String>,

    /// CPU and memory of each slot, as a SmolVM's `resources`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,

    /// Disk sizes of each slot, as a SmolVM's `storage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,

    /// Networking of each slot, as a SmolVM's `network`, without `ports`: a host port is published by one machine per node, and a node holds several slots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,

    /// The workload's entrypoint, as a SmolVM's `command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(max = 32768)))]
    pub command: Option<Vec<String>>,

    /// Arguments to the entrypoint, as a SmolVM's `args`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(max = 32768)))]
    pub args: Option<Vec<String>>,

    /// Working directory of the workload, as a SmolVM's `workingDir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub working_dir: Option<String>,

    /// Environment every slot boots with, as a SmolVM's `env`. A SmolVM served from the pool adds its own entries (its lease carries them); one of the same name wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub env: Option<Vec<EnvVar>>,

    /// Registry credentials for the image, as a SmolVM's `imagePullSecrets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,

    /// What happens when a served machine stops on its own, as a SmolVM's `restartPolicy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,

    /// How long a served SmolVM lives (SPEC 2.7), as a SmolVM's `lifecycle`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<crate::types::Lifecycle>,
}

/// What a SmolVM naming a pool gets when no slot is ready.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WhenEmpty {
    /// Its machine is created cold from the template, as any SmolVM's (the default).
    #[default]
    Cold,
    /// It stays pending until a slot is ready.
    Wait,
}

impl WhenEmpty {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            WhenEmpty::Cold => "Cold",
            WhenEmpty::Wait => "Wait",
        }
    }
}

/// Observed state of a SmolVMPool, written by the controller.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SmolVMPoolStatus {
    /// The `metadata.generation` the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Slots ready to serve, on all nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_slots: Option<i32>,

    /// Slots kept: on each matching node, as many of `slotsPerNode` as fit in its spare room (and
    /// the namespace's quota), summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_slots: Option<i32>,

    /// Ready and wanted slots on each matching node, sorted by node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5000))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["nodeName".into()]))]
    pub nodes: Vec<PoolNodeStatus>,

    /// Current state as conditions: Ready (every matching node has its slots), with smolvm's cleaned cause when slots fail.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The slots of a pool on one node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PoolNodeStatus {
    /// The node.
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
    /// Slots ready to serve there.
    pub ready: i32,
    /// Slots kept there: as many of `slotsPerNode` as fit in the node's spare room (and the
    /// namespace's quota).
    pub total: i32,
    /// Why slots fail there, smolvm's cause cleaned, when they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
}

impl SmolVMPool {
    /// The pool's name.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// The pool's namespace.
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("")
    }

    /// What a SmolVM gets when no slot is ready (`Cold` when unset).
    pub fn when_empty(&self) -> WhenEmpty {
        self.spec.when_empty.unwrap_or_default()
    }

    /// The SmolVM spec the template makes, with the pool's `nodeSelector`: what a SmolVM served
    /// from the pool holds (before its own `env`, and before its class's defaults), and what
    /// rule V14 checks against every SmolVM rule.
    pub fn as_smolvm_spec(&self) -> SmolVMSpec {
        let t = &self.spec.template;
        SmolVMSpec {
            image: t.image.clone(),
            class_name: t.class_name.clone(),
            resources: t.resources.clone(),
            storage: t.storage.clone(),
            network: t.network.clone(),
            command: t.command.clone(),
            args: t.args.clone(),
            working_dir: t.working_dir.clone(),
            env: t.env.clone(),
            image_pull_secrets: t.image_pull_secrets.clone(),
            restart_policy: t.restart_policy,
            lifecycle: t.lifecycle.clone(),
            node_selector: self.spec.node_selector.clone(),
            ..Default::default()
        }
    }
}

/// The known SmolVMPools, as the webhook's cache sees them.
pub trait PoolCatalog {
    /// The pool of that name in that namespace, if known.
    fn pool(&self, namespace: &str, name: &str) -> Option<SmolVMPool>;
    /// The names of the known pools in a namespace, sorted.
    fn names_in(&self, namespace: &str) -> Vec<String>;
}

/// No pools at all (a [`PoolCatalog`] for contexts that have none).
pub static NO_POOLS: Vec<SmolVMPool> = Vec::new();

/// A list of pools, owned or shared (`Vec<SmolVMPool>`, `Vec<Arc<SmolVMPool>>`).
impl<T: Borrow<SmolVMPool>> PoolCatalog for Vec<T> {
    fn pool(&self, namespace: &str, name: &str) -> Option<SmolVMPool> {
        self.iter()
            .map(Borrow::borrow)
            .find(|p| p.namespace() == namespace && p.name() == name)
            .cloned()
    }
    fn names_in(&self, namespace: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .iter()
            .map(Borrow::borrow)
            .filter(|p| p.namespace() == namespace)
            .map(|p| p.name().to_string())
            .collect();
        names.sort();
        names
    }
}
