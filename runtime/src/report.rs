//! Keeping this node's `SmolVMNode` current: created if missing (owned by the Node), labels
//! mirrored from the Node without erasing admin-set labels, and status applied server-side
//! (field manager [`FIELD_MANAGER_RUNTIME`], forced) with a heartbeat.
//!
//! The merge and status-building rules are pure functions; [`Reporter`] is the thin I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use smolvm_api::constants::{
    AGENT_LABEL_PREFIX, ANNOTATION_MIRRORED_LABELS, API_VERSION, FIELD_MANAGER_RUNTIME, KIND_SMOLVM_NODE,
    LABEL_GPU_COUNT, LABEL_GUEST_BOOTABLE, LABEL_NESTED_VIRT, LABEL_NODE, PROTOCOL_VERSION, RECHECK_BOOT_ANNOTATION,
    RECHECK_BOOT_VALUE, condition, reason,
};
use smolvm_api::types::{
    CanaryStatus, Endpoint, NodeResources, ServingCertificate, SmolVMNode, SmolVMNodeSpec, SmolVMNodeStatus,
};

use crate::canary::{BootCheck, CheckState, Outcome};
use crate::error::Result;

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

/// The capability labels the agent owns, each with its value, or `None` to remove it: what a
/// `nodeSelector` can ask of a node. Guest-bootable follows the last canary boot (absent while
/// none finished, or with the check off); nested-virt and gpu-count follow smolvm's `/health`
/// and `/capacity` (absent when not true, or none).
pub fn capability_labels(check: Option<&BootCheck>) -> BTreeMap<&'static str, Option<String>> {
    let bootable = check.and_then(|c| match &c.state {
        CheckState::Pending => None,
        CheckState::Done(Outcome::Booted { .. }) => Some("true".to_string()),
        CheckState::Done(Outcome::Failed(_)) => Some("false".to_string()),
    });
    let nested = check
        .and_then(|c| c.nested_virt)
        .filter(|nested| *nested)
        .map(|_| "true".to_string());
    let gpus = check
        .and_then(|c| c.gpu_count)
        .filter(|n| *n > 0)
        .map(|n| n.to_string());
    BTreeMap::from([
        (LABEL_GUEST_BOOTABLE, bootable),
        (LABEL_NESTED_VIRT, nested),
        (LABEL_GPU_COUNT, gpus),
    ])
}

/// Mirrors `node_labels` onto `current`: every Node label is set; a key mirrored before
/// (`previously_mirrored`) and gone from the Node is removed; every other label (set by an
/// admin) is kept, also when the Node has the same key: the admin's value overrides the
/// Node's, and the Node's is mirrored again once the admin removes theirs. [`LABEL_NODE`]
/// names the node whenever its name fits a label value (63 characters). Keys under
/// [`AGENT_LABEL_PREFIX`] belong to the agent: a Node label with such a key is not mirrored,
/// and `agent` (from [`capability_labels`]) sets or removes the agent's own.
pub fn merge_labels(
    current: &BTreeMap<String, String>,
    previously_mirrored: &BTreeSet<String>,
    node_labels: &BTreeMap<String, String>,
    node_name: &str,
    agent: &BTreeMap<&'static str, Option<String>>,
) -> LabelMerge {
    let mut labels = current.clone();
    for key in previously_mirrored {
        if !node_labels.contains_key(key) || key.starts_with(AGENT_LABEL_PREFIX) {
            labels.remove(key);
        }
    }
    let mut mirrored = BTreeSet::new();
    for (key, value) in node_labels {
        if key.starts_with(AGENT_LABEL_PREFIX) {
            continue;
        }
        let set_by_admin = current.contains_key(key) && !previously_mirrored.contains(key) && key != LABEL_NODE;
        if !set_by_admin {
            labels.insert(key.clone(), value.clone());
            mirrored.insert(key.clone());
        }
    }
    // A label value holds at most 63 characters and node names run to 253: a longer name is
    // not written (an apply with it would be refused and the node would never register); the
    // object's own name is the node's name in every case.
    if smolvm_api::syntax::check_label_value(node_name).is_ok() {
        labels.insert(LABEL_NODE.to_string(), node_name.to_string());
    } else {
        labels.remove(LABEL_NODE);
    }
    for (key, value) in agent {
        match value {
            Some(value) => labels.insert((*key).to_string(), value.clone()),
            None => labels.remove(*key),
        };
    }
    LabelMerge { labels, mirrored }
}

/// The JSON merge patch turning `current` labels and annotation into `merge`, or `None` when
/// nothing changes.
pub fn label_patch(
    current: &BTreeMap<String, String>,
    current_annotation: Option<&str>,
    merge: &LabelMerge,
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

/// A condition, keeping `lastTransitionTime` from `previous` when the status did not change.
pub fn next_condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" };
    condition_with_status(previous, type_, status, reason, message, now)
}

/// [`next_condition`] with the status spelled out (`True`, `False` or `Unknown`).
pub fn condition_with_status(
    previous: &[Condition],
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: &Time,
) -> Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time,
        observed_generation: None,
    }
}

/// What the agent observed, for one status report.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The Node's UID.
    pub node_uid: String,
    /// Where the node API listens.
    pub endpoint: Endpoint,
    /// The Node's InternalIP, where published ports are reachable.
    pub internal_ip: Option<String>,
    /// smolvm's version, once seen.
    pub runtime_version: Option<String>,
    /// smolvm answers its health check.
    pub runtime_ready: bool,
    /// Why not (when not ready).
    pub runtime_message: String,
    /// KVM usable.
    pub kvm_available: bool,
    /// KVM check's message.
    pub kvm_message: String,
    /// Host capacity.
    pub capacity: NodeResources,
    /// Capacity minus reservations.
    pub allocatable: NodeResources,
    /// The machines smolvm holds (names), while it answers; `None` when unknown.
    pub machines: Option<Vec<String>>,
    /// Of `machines`, those the agent suspended (names), while smolvm answers.
    pub suspended_machines: Option<Vec<String>>,
    /// The pools smolvm keeps, while it answers.
    pub pools: Option<Vec<smolvm_api::nodeapi::PoolStatus>>,
    /// The serving certificate: which runtime CA signed it, when it expires.
    pub serving_certificate: Option<ServingCertificate>,
    /// The guest boot check and the host's capabilities; `None` with the check off.
    pub boot_check: Option<BootCheck>,
}

/// The Node's first InternalIP, as `status.addresses` lists it.
pub fn internal_ip(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
}

/// Most machine names a SmolVMNode reports (the CRD's bound on `status.machines`).
pub const MAX_REPORTED_MACHINES: usize = 4096;

/// The GuestBootable condition of a boot check.
pub fn guest_bootable_condition(check: &BootCheck, previous: &[Condition], now: &Time) -> Condition {
    let (status, why, message) = match &check.state {
        CheckState::Pending => (
            "Unknown",
            reason::CANARY_PENDING,
            "the first guest boot check has not finished; VMs are placed here once a guest booted".to_string(),
        ),
        CheckState::Done(Outcome::Booted { millis }) => (
            "True",
            reason::CANARY_BOOTED,
            format!("a canary guest booted in {millis} ms"),
        ),
        CheckState::Done(Outcome::Failed(diagnosis)) => ("False", reason::CANARY_FAILED, diagnosis.message.clone()),
    };
    condition_with_status(previous, condition::GUEST_BOOTABLE, status, why, &message, now)
}

/// `status.canary` of a boot check (absent until one finished).
pub fn canary_status(check: &BootCheck) -> Option<CanaryStatus> {
    let last_run = check.last_run?;
    Some(CanaryStatus {
        last_run: Some(Time(last_run)),
        boot_millis: match &check.state {
            CheckState::Done(Outcome::Booted { millis }) => Some(i64::try_from(*millis).unwrap_or(i64::MAX)),
            _ => None,
        },
        smolvm_version: check.smolvm_version.clone(),
    })
}

/// The machine names a status reports: at most [`MAX_REPORTED_MACHINES`].
fn reported_machines(machines: Option<&[String]>) -> Vec<String> {
    let mut names = machines.unwrap_or_default().to_vec();
    names.truncate(MAX_REPORTED_MACHINES);
    names
}

/// The pools a status reports: at most 1024, by name, counts saturated into the schema's type.
fn reported_pools(pools: &[smolvm_api::nodeapi::PoolStatus]) -> Vec<smolvm_api::NodePool> {
    let count = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    pools
        .iter()
        .take(1024)
        .map(|p| smolvm_api::NodePool {
            name: p.name.clone(),
            ready: count(p.ready),
            slots: count(p.slots),
            leased: count(p.leased),
        })
        .collect()
}

/// The suspended machines a status reports: sorted, a subset of the machines it reports.
fn reported_suspended(obs: &Observation) -> Vec<String> {
    let machines = reported_machines(obs.machines.as_deref());
    let mut names: Vec<String> = obs
        .suspended_machines
        .iter()
        .flatten()
        .filter(|name| machines.contains(name))
        .cloned()
        .collect();
    names.sort();
    names
}

/// The status to apply, given the previous conditions.
pub fn build_status(obs: &Observation, previous: &[Condition], now: &Time) -> SmolVMNodeStatus {
    let kvm = if obs.kvm_available {
        next_condition(
            previous,
            condition::KVM_AVAILABLE,
            true,
            reason::AS_EXPECTED,
            &obs.kvm_message,
            now,
        )
    } else {
        next_condition(
            previous,
            condition::KVM_AVAILABLE,
            false,
            reason::KVM_UNAVAILABLE,
            &obs.kvm_message,
            now,
        )
    };
    let runtime = if obs.runtime_ready {
        let message = format!(
            "smolvm {} is serving",
            obs.runtime_version.as_deref().unwrap_or("(unknown version)")
        );
        next_condition(
            previous,
            condition::RUNTIME_READY,
            true,
            reason::AS_EXPECTED,
            &message,
            now,
        )
    } else {
        next_condition(
            previous,
            condition::RUNTIME_READY,
            false,
            reason::RUNTIME_DOWN,
            &obs.runtime_message,
            now,
        )
    };
    let ready = match (obs.kvm_available, obs.runtime_ready) {
        (true, true) => next_condition(
            previous,
            condition::READY,
            true,
            reason::AS_EXPECTED,
            "the node can run SmolVMs",
            now,
        ),
        (false, _) => next_condition(
            previous,
            condition::READY,
            false,
            reason::KVM_UNAVAILABLE,
            &obs.kvm_message,
            now,
        ),
        (true, false) => next_condition(
            previous,
            condition::READY,
            false,
            reason::RUNTIME_DOWN,
            &obs.runtime_message,
            now,
        ),
    };
    SmolVMNodeStatus {
        node_uid: Some(obs.node_uid.clone()),
        endpoint: Some(obs.endpoint.clone()),
        internal_ip: obs.internal_ip.clone(),
        runtime_version: obs.runtime_version.clone(),
        protocol_version: Some(PROTOCOL_VERSION.to_string()),
        heartbeat_time: Some(now.clone()),
        capacity: Some(obs.capacity),
        allocatable: Some(obs.allocatable),
        // Known only while smolvm answers; absent otherwise, so nobody acts on a stale list.
        machines: obs.runtime_ready.then(|| reported_machines(obs.machines.as_deref())),
        suspended_machines: obs.runtime_ready.then(|| reported_suspended(obs)),
        pools: obs
            .pools
            .as_ref()
            .filter(|_| obs.runtime_ready)
            .map(|pools| reported_pools(pools)),
        serving_certificate: obs.serving_certificate.clone(),
        canary: obs.boot_check.as_ref().and_then(canary_status),
        conditions: {
            let mut conditions = vec![ready, kvm, runtime];
            if let Some(check) = &obs.boot_check {
                conditions.push(guest_bootable_condition(check, previous, now));
            }
            conditions
        },
    }
}

/// The server-side-apply body for the status subresource.
pub fn status_apply_body(node_name: &str, status: &SmolVMNodeStatus) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": KIND_SMOLVM_NODE,
        "metadata": { "name": node_name },
        "status": status,
    })
}

/// The SmolVMNode to create for a Node (owned by it, labels mirrored).
pub fn new_smolvm_node(node: &Node, node_name: &str) -> SmolVMNode {
    let node_labels = node.metadata.labels.clone().unwrap_or_default();
    let merge = merge_labels(
        &BTreeMap::new(),
        &BTreeSet::new(),
        &node_labels,
        node_name,
        &capability_labels(None),
    );
    let mut annotations = BTreeMap::new();
    annotations.insert(ANNOTATION_MIRRORED_LABELS.to_string(), render_mirrored(&merge.mirrored));
    SmolVMNode {
        metadata: ObjectMeta {
            name: Some(node_name.to_string()),
            labels: Some(merge.labels),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name.to_string(),
                uid: node.metadata.uid.clone().unwrap_or_default(),
                controller: None,
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: SmolVMNodeSpec::default(),
        status: None,
    }
}

/// Whether a SmolVMNode carries the recheck annotation with its one value.
pub fn recheck_requested(node: &SmolVMNode) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RECHECK_BOOT_ANNOTATION))
        .is_some_and(|v| v == RECHECK_BOOT_VALUE)
}

/// Talks to the API server for one node.
pub struct Reporter {
    nodes: Api<Node>,
    smolvm_nodes: Api<SmolVMNode>,
    node_name: String,
    recheck: Option<std::sync::Arc<tokio::sync::Notify>>,
}

impl Reporter {
    /// A reporter for `node_name`.
    pub fn new(client: kube::Client, node_name: impl Into<String>) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            smolvm_nodes: Api::all(client),
            node_name: node_name.into(),
            recheck: None,
        }
    }

    /// Acts on the recheck annotation ([`RECHECK_BOOT_ANNOTATION`]): notifies `recheck` and
    /// removes the annotation.
    pub fn with_recheck(mut self, recheck: std::sync::Arc<tokio::sync::Notify>) -> Self {
        self.recheck = Some(recheck);
        self
    }

    /// The Node (for its UID and labels).
    pub async fn node(&self) -> Result<Node> {
        Ok(self.nodes.get(&self.node_name).await?)
    }

    /// One report: ensures the SmolVMNode exists, mirrors labels, applies status. `observe`
    /// gets the Node's UID and returns what to report; the Node's InternalIP is taken from it.
    pub async fn report_once<F>(&self, now: Time, observe: F) -> Result<SmolVMNodeStatus>
    where
        F: FnOnce(&str) -> Observation,
    {
        let node = self.node().await?;
        let node_uid = node.metadata.uid.clone().unwrap_or_default();
        let existing = match self.smolvm_nodes.get_opt(&self.node_name).await? {
            Some(existing) => existing,
            None => {
                tracing::info!(node = %self.node_name, "creating SmolVMNode");
                match self
                    .smolvm_nodes
                    .create(&PostParams::default(), &new_smolvm_node(&node, &self.node_name))
                    .await
                {
                    Ok(created) => created,
                    Err(kube::Error::Api(status)) if status.code == 409 => {
                        self.smolvm_nodes.get(&self.node_name).await?
                    }
                    Err(error) => return Err(error.into()),
                }
            }
        };
        if let Some(recheck) = &self.recheck
            && recheck_requested(&existing)
        {
            tracing::info!(node = %self.node_name, annotation = RECHECK_BOOT_ANNOTATION, "guest boot check asked for");
            recheck.notify_one();
            let patch = serde_json::json!({ "metadata": { "annotations": { RECHECK_BOOT_ANNOTATION: null } } });
            self.smolvm_nodes
                .patch(&self.node_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        let mut observed = observe(&node_uid);
        observed.internal_ip = internal_ip(&node);
        let current_labels = existing.metadata.labels.clone().unwrap_or_default();
        let annotation = existing
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_MIRRORED_LABELS))
            .cloned();
        let merge = merge_labels(
            &current_labels,
            &parse_mirrored(annotation.as_deref()),
            &node.metadata.labels.clone().unwrap_or_default(),
            &self.node_name,
            &capability_labels(observed.boot_check.as_ref()),
        );
        if let Some(patch) = label_patch(&current_labels, annotation.as_deref(), &merge) {
            self.smolvm_nodes
                .patch(&self.node_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        let previous = existing.status.map(|s| s.conditions).unwrap_or_default();
        let status = build_status(&observed, &previous, &now);
        let params = PatchParams::apply(FIELD_MANAGER_RUNTIME).force();
        self.smolvm_nodes
            .patch_status(
                &self.node_name,
                &params,
                &Patch::Apply(status_apply_body(&self.node_name, &status)),
            )
            .await?;
        Ok(status)
    }
}

/// Reports every `interval` until the task is aborted; failures are logged and retried.
pub fn spawn_reporter<F>(reporter: Reporter, interval: Duration, mut observe: F) -> tokio::task::JoinHandle<()>
where
    F: FnMut(&str) -> Observation + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            match reporter.report_once(now, &mut observe).await {
                Ok(_) => tracing::debug!("SmolVMNode status reported"),
                Err(error) => tracing::warn!(%error, reason = error.reason(), "reporting SmolVMNode failed"),
            }
            tokio::time::sleep(interval).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn set(keys: &[&str]) -> BTreeSet<String> {
        keys.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn label_merge_keeps_admin_labels() {
        struct Case {
            name: &'static str,
            current: BTreeMap<String, String>,
            mirrored: BTreeSet<String>,
            node: BTreeMap<String, String>,
            labels: BTreeMap<String, String>,
            now_mirrored: BTreeSet<String>,
        }
        let cases = [
            Case {
                name: "fresh",
                current: map(&[]),
                mirrored: set(&[]),
                node: map(&[("zone", "a")]),
                labels: map(&[("zone", "a"), (LABEL_NODE, "n1")]),
                now_mirrored: set(&["zone"]),
            },
            Case {
                name: "admin label kept, removed node label dropped",
                current: map(&[("zone", "a"), ("gpu", "yes"), ("team", "x"), (LABEL_NODE, "n1")]),
                mirrored: set(&["zone", "gpu"]),
                node: map(&[("zone", "b")]),
                labels: map(&[("zone", "b"), ("team", "x"), (LABEL_NODE, "n1")]),
                now_mirrored: set(&["zone"]),
            },
            Case {
                name: "an admin label whose key the node now has keeps the admin's value",
                current: map(&[("team", "x")]),
                mirrored: set(&[]),
                node: map(&[("team", "y")]),
                labels: map(&[("team", "x"), (LABEL_NODE, "n1")]),
                now_mirrored: set(&[]),
            },
            Case {
                name: "once the admin removes it, the node's value is mirrored",
                current: map(&[(LABEL_NODE, "n1")]),
                mirrored: set(&[]),
                node: map(&[("team", "y")]),
                labels: map(&[("team", "y"), (LABEL_NODE, "n1")]),
                now_mirrored: set(&["team"]),
            },
            Case {
                name: "node lost all labels",
                current: map(&[("zone", "a"), ("team", "x"), (LABEL_NODE, "n1")]),
                mirrored: set(&["zone"]),
                node: map(&[]),
                labels: map(&[("team", "x"), (LABEL_NODE, "n1")]),
                now_mirrored: set(&[]),
            },
        ];
        for case in cases {
            let merged = merge_labels(&case.current, &case.mirrored, &case.node, "n1", &BTreeMap::new());
            assert_eq!(merged.labels, case.labels, "{}", case.name);
            assert_eq!(merged.mirrored, case.now_mirrored, "{}", case.name);
        }
    }

    #[test]
    fn node_label_is_written_only_when_the_name_fits_a_label_value() {
        let short = "ip-10-0-0-1.ec2.internal";
        let long = "ip-192-168-101-202.ap-southeast-2.compute.internal.example-long-suffix";
        assert!(long.len() > 63);
        let merged = merge_labels(&map(&[]), &set(&[]), &map(&[("zone", "a")]), short, &BTreeMap::new());
        assert_eq!(merged.labels.get(LABEL_NODE).map(String::as_str), Some(short));
        let merged = merge_labels(
            &map(&[(LABEL_NODE, "stale")]),
            &set(&[]),
            &map(&[("zone", "a")]),
            long,
            &BTreeMap::new(),
        );
        assert_eq!(merged.labels.get(LABEL_NODE), None);
        assert_eq!(merged.labels.get("zone").map(String::as_str), Some("a"));
    }

    #[test]
    fn label_patch_sets_removes_and_is_empty_when_equal() {
        let current = map(&[("zone", "a"), ("gpu", "yes"), (LABEL_NODE, "n1")]);
        let merged = merge_labels(
            &current,
            &set(&["zone", "gpu"]),
            &map(&[("zone", "b")]),
            "n1",
            &BTreeMap::new(),
        );
        let patch = label_patch(&current, Some("gpu,zone"), &merged).expect("patch");
        assert_eq!(
            patch,
            serde_json::json!({"metadata": {"labels": {"gpu": null, "zone": "b"},
                "annotations": {ANNOTATION_MIRRORED_LABELS: "zone"}}})
        );
        let after = merged.labels.clone();
        assert_eq!(label_patch(&after, Some("zone"), &merged), None);
        assert_eq!(parse_mirrored(Some("b, a,,")), set(&["a", "b"]));
        assert_eq!(render_mirrored(&set(&["b", "a"])), "a,b");
    }

    fn time(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("time"))
    }

    fn observation(runtime_ready: bool, kvm_available: bool) -> Observation {
        Observation {
            node_uid: "uid-1".into(),
            endpoint: Endpoint {
                address: "10.0.0.5".into(),
                port: 10250,
            },
            internal_ip: None,
            runtime_version: Some("1.32.2".into()),
            runtime_ready,
            runtime_message: if runtime_ready { String::new() } else { "exited".into() },
            kvm_available,
            kvm_message: if kvm_available {
                "KVM API version 12".into()
            } else {
                "cannot open /dev/kvm".into()
            },
            capacity: NodeResources {
                cpus: 8,
                memory_mib: 16384,
                storage_gib: 100,
            },
            allocatable: NodeResources {
                cpus: 7,
                memory_mib: 15360,
                storage_gib: 90,
            },
            machines: Some(vec!["svm-a".into(), "svm-b".into()]),
            suspended_machines: Some(vec!["svm-b".into(), "svm-gone".into()]),
            pools: None,
            serving_certificate: None,
            boot_check: None,
        }
    }

    #[test]
    fn machines_are_reported_only_while_smolvm_answers() {
        let ready = build_status(&observation(true, true), &[], &time(100));
        assert_eq!(ready.machines, Some(vec!["svm-a".to_string(), "svm-b".to_string()]));
        assert_eq!(
            ready.suspended_machines,
            Some(vec!["svm-b".to_string()]),
            "a subset of machines"
        );
        let down = build_status(&observation(false, true), &[], &time(100));
        assert_eq!(down.machines, None, "a stale list would let the controller act on it");
        assert_eq!(down.suspended_machines, None);
        let mut many = observation(true, true);
        many.machines = Some((0..5000).map(|i| format!("svm-{i:05}")).collect());
        let capped = build_status(&many, &[], &time(100));
        assert_eq!(capped.machines.map(|m| m.len()), Some(MAX_REPORTED_MACHINES));
    }

    #[test]
    fn conditions_keep_transition_time_while_unchanged() {
        let first = build_status(&observation(true, true), &[], &time(100));
        let second = build_status(&observation(true, true), &first.conditions, &time(200));
        for c in &second.conditions {
            assert_eq!(c.last_transition_time, time(100), "{}", c.type_);
            assert_eq!(c.status, "True");
        }
        assert_eq!(second.heartbeat_time, Some(time(200)));
        let third = build_status(&observation(false, true), &second.conditions, &time(300));
        let by_type = |t: &str| {
            third
                .conditions
                .iter()
                .find(|c| c.type_ == t)
                .cloned()
                .expect("condition")
        };
        assert_eq!(by_type(condition::READY).status, "False");
        assert_eq!(by_type(condition::READY).reason, reason::RUNTIME_DOWN);
        assert_eq!(by_type(condition::READY).last_transition_time, time(300));
        assert_eq!(by_type(condition::KVM_AVAILABLE).last_transition_time, time(100));
        assert_eq!(by_type(condition::RUNTIME_READY).message, "exited");
    }

    #[test]
    fn ready_table() {
        let cases = [
            (true, true, "True", reason::AS_EXPECTED),
            (true, false, "False", reason::KVM_UNAVAILABLE),
            (false, true, "False", reason::RUNTIME_DOWN),
            (false, false, "False", reason::KVM_UNAVAILABLE),
        ];
        for (runtime, kvm, status, why) in cases {
            let s = build_status(&observation(runtime, kvm), &[], &time(1));
            let ready = &s.conditions[0];
            assert_eq!(
                (ready.type_.as_str(), ready.status.as_str(), ready.reason.as_str()),
                (condition::READY, status, why)
            );
        }
    }

    fn check(state: CheckState) -> BootCheck {
        BootCheck {
            state,
            last_run: Some(k8s_openapi::jiff::Timestamp::from_second(50).expect("time")),
            smolvm_version: Some("1.32.2".into()),
            nested_virt: Some(false),
            gpu_count: Some(0),
        }
    }

    fn failed() -> CheckState {
        CheckState::Done(Outcome::Failed(crate::canary::Diagnosis {
            cause: crate::canary::Cause::HostCannotRunGuest,
            message: "no guest booted: this host is itself a virtual machine".into(),
        }))
    }

    #[test]
    fn guest_bootable_table() {
        let cases = [
            ("off", None, None, None, None),
            (
                "pending",
                Some(check(CheckState::Pending)),
                Some(("Unknown", reason::CANARY_PENDING)),
                None,
                None,
            ),
            (
                "booted",
                Some(check(CheckState::Done(Outcome::Booted { millis: 812 }))),
                Some(("True", reason::CANARY_BOOTED)),
                Some(812),
                Some("true"),
            ),
            (
                "failed",
                Some(check(failed())),
                Some(("False", reason::CANARY_FAILED)),
                None,
                Some("false"),
            ),
        ];
        for (name, boot_check, want, millis, label) in cases {
            let mut obs = observation(true, true);
            obs.boot_check = boot_check.clone();
            let status = build_status(&obs, &[], &time(100));
            let got = status
                .conditions
                .iter()
                .find(|c| c.type_ == condition::GUEST_BOOTABLE)
                .map(|c| (c.status.as_str(), c.reason.as_str()));
            assert_eq!(got, want, "{name}");
            assert_eq!(status.canary.as_ref().and_then(|c| c.boot_millis), millis, "{name}");
            if boot_check.is_some() && !matches!(boot_check.as_ref().map(|c| &c.state), Some(CheckState::Pending)) {
                assert_eq!(
                    status.canary.as_ref().and_then(|c| c.smolvm_version.as_deref()),
                    Some("1.32.2"),
                    "{name}"
                );
            }
            let labels = capability_labels(boot_check.as_ref());
            assert_eq!(labels[LABEL_GUEST_BOOTABLE].as_deref(), label, "{name}");
            // KVMAvailable keeps its narrow meaning: the device answered.
            let kvm = status
                .conditions
                .iter()
                .find(|c| c.type_ == condition::KVM_AVAILABLE)
                .expect("kvm");
            assert_eq!(kvm.status, "True", "{name}");
        }
        let booted = build_status(
            &Observation {
                boot_check: Some(check(CheckState::Done(Outcome::Booted { millis: 812 }))),
                ..observation(true, true)
            },
            &[],
            &time(100),
        );
        let message = &booted
            .conditions
            .iter()
            .find(|c| c.type_ == condition::GUEST_BOOTABLE)
            .expect("condition")
            .message;
        assert!(message.contains("812 ms"), "the boot time is in the message: {message}");
    }

    #[test]
    fn capability_labels_are_the_agents_own() {
        let mut caps = check(CheckState::Done(Outcome::Booted { millis: 5 }));
        caps.nested_virt = Some(true);
        caps.gpu_count = Some(2);
        let agent = capability_labels(Some(&caps));
        assert_eq!(agent[LABEL_NESTED_VIRT].as_deref(), Some("true"));
        assert_eq!(agent[LABEL_GPU_COUNT].as_deref(), Some("2"));
        // A Node label of an agent key is not mirrored over the agent's value; the agent's own
        // labels are set, and removed once they no longer hold.
        let node = map(&[(LABEL_GUEST_BOOTABLE, "true"), ("zone", "a")]);
        let merged = merge_labels(
            &map(&[]),
            &set(&[]),
            &node,
            "n1",
            &capability_labels(Some(&check(failed()))),
        );
        assert_eq!(
            merged.labels.get(LABEL_GUEST_BOOTABLE).map(String::as_str),
            Some("false")
        );
        assert!(!merged.mirrored.contains(LABEL_GUEST_BOOTABLE));
        assert_eq!(merged.labels.get(LABEL_GPU_COUNT), None);
        let current = merged.labels.clone();
        let later = merge_labels(
            &current,
            &merged.mirrored,
            &node,
            "n1",
            &capability_labels(Some(&check(CheckState::Pending))),
        );
        assert_eq!(later.labels.get(LABEL_GUEST_BOOTABLE), None, "pending: no label");
        assert_eq!(later.labels.get("zone").map(String::as_str), Some("a"));
    }

    #[test]
    fn recheck_annotation_needs_its_one_value() {
        let mut node = SmolVMNode::new("n1", SmolVMNodeSpec::default());
        assert!(!recheck_requested(&node));
        node.metadata.annotations = Some(BTreeMap::from([(
            RECHECK_BOOT_ANNOTATION.to_string(),
            "yes".to_string(),
        )]));
        assert!(!recheck_requested(&node));
        node.metadata.annotations = Some(BTreeMap::from([(
            RECHECK_BOOT_ANNOTATION.to_string(),
            "true".to_string(),
        )]));
        assert!(recheck_requested(&node));
    }
}
