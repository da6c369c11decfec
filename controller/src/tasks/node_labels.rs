//! The Node's labels on its SmolVMNode (SPEC 2.2; 6.3, "Node identity"): copied by the controller,
//! not by the node's agent, which may set there only its status and its own three labels (rule
//! V10). Placement and warm pools match SmolVMNode labels, and a pool's slots carry its resolved
//! env and registry credential to the node: a node that could label its own SmolVMNode
//! `tenant: a` would be handed tenant a's pools, with their Secrets.
//!
//! A node's kubelet can still set most labels on its own Node, as in Kubernetes itself; only
//! `node-restriction.kubernetes.io/` labels (which NodeRestriction keeps from kubelets) and labels
//! a cluster admin sets on the SmolVMNode are beyond a compromised node's reach
//! (docs/operations.md, "Tenant isolation on nodes").
//!
//! The decision is pure ([`merge_labels`], [`label_patch`], [`plan`]); [`run`] is the thin task:
//! a kube-runtime `Controller` over the Nodes' metadata, woken by a Node whose labels changed and
//! by a SmolVMNode whose labels or annotations changed (its agent created it, an admin removed a
//! label), each writing one JSON merge patch with the controller's field manager, conditional on
//! the SmolVMNode's resourceVersion so that a label set meanwhile is never overwritten unseen.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Client, ResourceExt,
    api::{PartialObjectMeta, Patch, PatchParams},
    runtime::{
        Controller, Predicate, WatchStreamExt,
        controller::Action,
        predicates,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use smolvm_api::SmolVMNode;
use smolvm_api::constants::{AGENT_LABEL_PREFIX, ANNOTATION_MIRRORED_LABELS, FIELD_MANAGER_CONTROLLER, LABEL_NODE};
use smolvm_kit::backoff::{Backoff, Schedule};

use crate::vm::Error;

/// Parses the mirrored-labels annotation (comma-separated label keys).
pub fn parse_mirrored(annotation: Option<&str>) -> BTreeSet<String> {
    annotation
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect()
}

/// Renders the mirrored-labels annotation: sorted keys joined by commas.
pub fn render_mirrored(keys: &BTreeSet<String>) -> String {
    keys.iter().cloned().collect::<Vec<_>>().join(",")
}

/// The result of mirroring Node labels onto a SmolVMNode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelMerge {
    /// The SmolVMNode's labels afterwards.
    pub labels: BTreeMap<String, String>,
    /// Keys now mirrored from the Node (for [`ANNOTATION_MIRRORED_LABELS`]).
    pub mirrored: BTreeSet<String>,
}

/// Mirrors `node_labels` onto `current`: every Node label is set; a key mirrored before
/// (`previously_mirrored`) and gone from the Node is removed; every other label (set by an
/// admin) is kept, also when the Node has the same key: the admin's value overrides the
/// Node's, and the Node's is mirrored again once the admin removes theirs. [`LABEL_NODE`]
/// names the node whenever its name fits a label value (63 characters). Keys under
/// [`AGENT_LABEL_PREFIX`] are the operator's: a Node label with such a key is not mirrored, and
/// none but [`LABEL_NODE`] is touched here (the agent's own labels are the agent's to set).
pub fn merge_labels(
    current: &BTreeMap<String, String>,
    previously_mirrored: &BTreeSet<String>,
    node_labels: &BTreeMap<String, String>,
    node_name: &str,
) -> LabelMerge {
    // The annotation is writable by whoever may edit the SmolVMNode: a key of the operator's it
    // lists was never mirrored, and is neither removed nor counted as mirrored.
    let previously_mirrored: BTreeSet<&String> = previously_mirrored
        .iter()
        .filter(|k| !k.starts_with(AGENT_LABEL_PREFIX))
        .collect();
    let mut labels = current.clone();
    for key in &previously_mirrored {
        if !node_labels.contains_key(*key) {
            labels.remove(*key);
        }
    }
    let mut mirrored = BTreeSet::new();
    for (key, value) in node_labels {
        if key.starts_with(AGENT_LABEL_PREFIX) {
            continue;
        }
        let set_by_admin = current.contains_key(key) && !previously_mirrored.contains(key);
        if !set_by_admin {
            labels.insert(key.clone(), value.clone());
            mirrored.insert(key.clone());
        }
    }
    // A label value holds at most 63 characters and node names run to 253: a longer name is
    // not written (a patch with it would be refused); the object's own name is the node's name
    // in every case.
    if smolvm_api::syntax::check_label_value(node_name).is_ok() {
        labels.insert(LABEL_NODE.to_string(), node_name.to_string());
    } else {
        labels.remove(LABEL_NODE);
    }
    LabelMerge { labels, mirrored }
}

/// The JSON merge patch turning `current` labels and annotation into `merge`, or `None` when
/// nothing changes. With `resource_version`, the patch applies only to that version of the
/// object (the API server answers 409 Conflict to any other).
pub fn label_patch(
    current: &BTreeMap<String, String>,
    current_annotation: Option<&str>,
    merge: &LabelMerge,
    resource_version: Option<&str>,
) -> Option<serde_json::Value> {
    let mut labels = serde_json::Map::new();
    for key in current.keys() {
        if !merge.labels.contains_key(key) {
            labels.insert(key.clone(), serde_json::Value::Null);
        }
    }
    for (key, value) in &merge.labels {
        if current.get(key) != Some(value) {
            labels.insert(key.clone(), serde_json::Value::String(value.clone()));
        }
    }
    let annotation = render_mirrored(&merge.mirrored);
    let annotation_changed = current_annotation.unwrap_or("") != annotation;
    if labels.is_empty() && !annotation_changed {
        return None;
    }
    let mut metadata = serde_json::Map::new();
    if let Some(version) = resource_version {
        metadata.insert("resourceVersion".into(), version.into());
    }
    if !labels.is_empty() {
        metadata.insert("labels".into(), serde_json::Value::Object(labels));
    }
    if annotation_changed {
        metadata.insert(
            "annotations".into(),
            serde_json::json!({ ANNOTATION_MIRRORED_LABELS: annotation }),
        );
    }
    Some(serde_json::json!({ "metadata": metadata }))
}

/// The patch that brings a SmolVMNode (its `metadata`) in step with its Node's labels, or `None`
/// when it already is: [`merge_labels`] then [`label_patch`], conditional on the SmolVMNode's
/// resourceVersion.
pub fn plan(
    smolvm_node: &ObjectMeta,
    node_labels: &BTreeMap<String, String>,
    node_name: &str,
) -> Option<serde_json::Value> {
    let empty = BTreeMap::new();
    let current = smolvm_node.labels.as_ref().unwrap_or(&empty);
    let annotation = smolvm_node
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_MIRRORED_LABELS))
        .map(String::as_str);
    let merge = merge_labels(current, &parse_mirrored(annotation), node_labels, node_name);
    label_patch(current, annotation, &merge, smolvm_node.resource_version.as_deref())
}

/// The retries of a failed write, per node: 1 s, doubling with each further failure of the same
/// node, at most 5 minutes.
pub const RETRY: Schedule = Schedule::new(Duration::from_secs(1), Duration::from_secs(300));
/// A write that lost a race (409: the SmolVMNode changed since it was read) is tried again
/// soon, from the newer version the watch brings.
const RETRY_CONFLICT: Duration = Duration::from_millis(500);

/// What the task's reconciles share.
struct Mirror {
    smolvm_nodes: Api<SmolVMNode>,
    /// The SmolVMNodes' metadata, as the watch last saw it.
    cache: Store<PartialObjectMeta<SmolVMNode>>,
    /// Failures in a row, by node name, on [`RETRY`].
    failures: Mutex<Backoff<String>>,
}

/// Keeps every SmolVMNode's labels in step with its Node's, until the task is dropped. Only the
/// metadata of Nodes and SmolVMNodes is watched and cached (no status, no managedFields).
pub async fn run(client: Client) {
    let (nodes, node_writer) = reflector::store::<PartialObjectMeta<Node>>();
    let node_changes = watcher(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|n| n.metadata.managed_fields = None)
    .reflect(node_writer)
    .applied_objects()
    // A Node's status and heartbeats change nothing here.
    .predicate_filter(predicates::labels, Default::default());
    let (cache, cache_writer) = reflector::store::<PartialObjectMeta<SmolVMNode>>();
    let smolvm_node_changes = watcher(
        Api::<PartialObjectMeta<SmolVMNode>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|n| n.metadata.managed_fields = None)
    .reflect(cache_writer)
    .applied_objects()
    // The agent's heartbeats (status) change nothing here; a new SmolVMNode, a label or the
    // mirrored-labels annotation does.
    .predicate_filter(predicates::labels.combine(predicates::annotations), Default::default());
    let mirror = Arc::new(Mirror {
        smolvm_nodes: Api::all(client),
        cache,
        failures: Mutex::new(Backoff::new(RETRY)),
    });
    Controller::for_stream(node_changes, nodes)
        .watches_stream(smolvm_node_changes, |n| Some(ObjectRef::new(&n.name_any())))
        .run(reconcile, error_policy, mirror)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "node label mirror");
            }
        })
        .await;
}

/// One Node: its SmolVMNode's labels brought in step, when it has one (its agent creates it).
async fn reconcile(node: Arc<PartialObjectMeta<Node>>, mirror: Arc<Mirror>) -> Result<Action, Error> {
    let name = node.name_any();
    let Some(smolvm_node) = mirror.cache.get(&ObjectRef::new(&name)) else {
        return Ok(Action::await_change());
    };
    if let Some(patch) = plan(&smolvm_node.metadata, node.labels(), &name) {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER_CONTROLLER.into()),
            ..PatchParams::default()
        };
        mirror.smolvm_nodes.patch(&name, &params, &Patch::Merge(&patch)).await?;
        tracing::info!(node = %name, "the Node's labels mirrored onto its SmolVMNode");
    }
    mirror
        .failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .succeeded(&name);
    Ok(Action::await_change())
}

/// A failed write is tried again: soon after a lost race, else on the node's retry schedule.
fn error_policy(node: Arc<PartialObjectMeta<Node>>, error: &Error, mirror: Arc<Mirror>) -> Action {
    let name = node.name_any();
    let (failures, scheduled) = {
        let mut failures = mirror.failures.lock().unwrap_or_else(|e| e.into_inner());
        let wait = failures.failed(name.clone(), std::time::Instant::now(), ());
        (failures.get(&name).map_or(1, |f| f.count), wait)
    };
    let wait = match error.reason() {
        "Conflict" => RETRY_CONFLICT,
        _ => scheduled,
    };
    tracing::warn!(node = %name, reason = error.reason(), %error, failures, retry_in = ?wait, "mirroring the Node's labels failed");
    Action::requeue(wait)
}
