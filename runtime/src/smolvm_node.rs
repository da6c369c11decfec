//! Keeping this node's `SmolVMNode` current: created if missing (owned by the Node), its own
//! labels set (the capability labels, [`capability_labels`]), and status applied server-side
//! (field manager [`FIELD_MANAGER_RUNTIME`], forced) with a heartbeat.
//!
//! The agent sets nothing else there (rule V10, as the NodeRestriction admission plugin keeps a
//! kubelet to its own labels): the Node's labels are mirrored by the controller
//! (controller/src/tasks/node_labels.rs), so a compromised node cannot label its SmolVMNode into
//! another tenant's VMs and pools.
//!
//! The label and status-building rules are pure functions; [`Reporter`] is the thin I/O.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use smolvm_api::constants::{
    API_VERSION, FIELD_MANAGER_RUNTIME, KIND_SMOLVM_NODE, LABEL_GPU_COUNT, LABEL_GUEST_BOOTABLE, LABEL_NESTED_VIRT,
    PROTOCOL_VERSION, RECHECK_BOOT_ANNOTATION, RECHECK_BOOT_VALUE, condition, reason,
};
use smolvm_api::types::{
    CanaryStatus, Endpoint, NodeResources, ServingCertificate, SmolVMNode, SmolVMNodeSpec, SmolVMNodeStatus,
};

use crate::canary::{BootCheck, CheckState, Outcome};
use crate::error::Result;

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

/// The JSON merge patch that sets the agent's own labels (`agent`, from [`capability_labels`]:
/// each set to its value, or removed where `None`) on a SmolVMNode whose labels are `current`,
/// or `None` when they already hold. It names no other label: every other one is the cluster
/// admin's or the controller's (rule V10 refuses an agent that changes one).
pub fn agent_label_patch(
    current: &BTreeMap<String, String>,
    agent: &BTreeMap<&'static str, Option<String>>,
) -> Option<serde_json::Value> {
    let mut labels = serde_json::Map::new();
    for (key, value) in agent {
        match value {
            Some(value) if current.get(*key) != Some(value) => {
                labels.insert((*key).to_string(), serde_json::Value::String(value.clone()));
            }
            None if current.contains_key(*key) => {
                labels.insert((*key).to_string(), serde_json::Value::Null);
            }
            _ => {}
        }
    }
    (!labels.is_empty()).then(|| serde_json::json!({ "metadata": { "labels": labels } }))
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
    /// Each machine's last activity (Unix seconds, the agent's clock), sorted by name.
    pub activity: Vec<(String, i64)>,
    /// The machines a connection or session asked to wake, sorted.
    pub wake_requests: Vec<String>,
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
/// The machines' last activity as the status carries it (none: absent).
fn reported_activity(activity: &[(String, i64)]) -> Option<Vec<smolvm_api::MachineActivity>> {
    let reported: Vec<smolvm_api::MachineActivity> = activity
        .iter()
        .filter_map(|(name, at)| {
            let time = k8s_openapi::jiff::Timestamp::from_second(*at).ok()?;
            Some(smolvm_api::MachineActivity {
                name: name.clone(),
                last_active_time: Time(time),
            })
        })
        .collect();
    (!reported.is_empty()).then_some(reported)
}

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

/// KvmAvailable: whether KVM is usable, with the check's message.
fn kvm_condition(obs: &Observation, previous: &[Condition], now: &Time) -> Condition {
    let why = if obs.kvm_available {
        reason::AS_EXPECTED
    } else {
        reason::KVM_UNAVAILABLE
    };
    next_condition(
        previous,
        condition::KVM_AVAILABLE,
        obs.kvm_available,
        why,
        &obs.kvm_message,
        now,
    )
}

/// RuntimeReady: whether smolvm answers its health check, with its version or why not.
fn runtime_condition(obs: &Observation, previous: &[Condition], now: &Time) -> Condition {
    if obs.runtime_ready {
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
    }
}

/// Ready: KVM usable and smolvm serving; else the first of the two that is not, with its message.
fn ready_condition(obs: &Observation, previous: &[Condition], now: &Time) -> Condition {
    match (obs.kvm_available, obs.runtime_ready) {
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
    }
}

/// The status to apply, given the previous conditions.
pub fn build_status(obs: &Observation, previous: &[Condition], now: &Time) -> SmolVMNodeStatus {
    let kvm = kvm_condition(obs, previous, now);
    let runtime = runtime_condition(obs, previous, now);
    let ready = ready_condition(obs, previous, now);
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
        activity: reported_activity(&obs.activity),
        wake_requests: (!obs.wake_requests.is_empty()).then(|| obs.wake_requests.clone()),
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

/// The SmolVMNode to create for a Node: its name and the Node as its owner, nothing else (rule
/// V10). Its own labels follow once it exists ([`agent_label_patch`]), the Node's labels once the
/// controller mirrors them.
pub fn new_smolvm_node(node: &Node, node_name: &str) -> SmolVMNode {
    SmolVMNode {
        metadata: ObjectMeta {
            name: Some(node_name.to_string()),
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

    /// The agent's merge patches of its SmolVMNode, under its field manager.
    fn patch_params() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER_RUNTIME.into()),
            ..PatchParams::default()
        }
    }

    /// The Node (for its UID and InternalIP).
    pub async fn node(&self) -> Result<Node> {
        Ok(self.nodes.get(&self.node_name).await?)
    }

    /// One report: ensures the SmolVMNode exists, sets the agent's own labels, applies status.
    /// `observe` gets the Node's UID and returns what to report; the Node's InternalIP is taken
    /// from it.
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
                .patch(&self.node_name, &Self::patch_params(), &Patch::Merge(&patch))
                .await?;
        }
        let mut observed = observe(&node_uid);
        observed.internal_ip = internal_ip(&node);
        let current_labels = existing.metadata.labels.clone().unwrap_or_default();
        if let Some(patch) = agent_label_patch(&current_labels, &capability_labels(observed.boot_check.as_ref())) {
            self.smolvm_nodes
                .patch(&self.node_name, &Self::patch_params(), &Patch::Merge(&patch))
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

/// Reports every `interval`, and at once when a wake is asked for (`activity`), until the task
/// is aborted; failures are logged and retried.
pub fn spawn_reporter<F>(
    reporter: Reporter,
    interval: Duration,
    activity: Option<std::sync::Arc<crate::activity::Activity>>,
    mut observe: F,
) -> tokio::task::JoinHandle<()>
where
    F: FnMut(&str) -> Observation + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            match reporter.report_once(now, &mut observe).await {
                Ok(_) => tracing::debug!("SmolVMNode status reported"),
                Err(error) => tracing::warn!(
                    error = %smolvm_kit::causes::explained(&error),
                    reason = error.reason(),
                    "reporting SmolVMNode failed"
                ),
            }
            match &activity {
                Some(activity) => {
                    tokio::select! {
                        () = tokio::time::sleep(interval) => {}
                        () = activity.wake_asked() => tracing::debug!("a wake was asked for: reporting now"),
                    }
                }
                None => tokio::time::sleep(interval).await,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
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
            activity: Vec::new(),
            wake_requests: Vec::new(),
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
        // The keys are exactly those rule V10 lets an agent set, whatever the check found.
        for check in [None, Some(&caps), Some(&check(failed()))] {
            let keys: Vec<&str> = capability_labels(check).keys().copied().collect();
            let mut owned = smolvm_api::constants::AGENT_LABELS.to_vec();
            owned.sort();
            assert_eq!(keys, owned);
        }
    }

    /// The agent's label patch names its own labels only: set where they changed, removed where
    /// they no longer hold, and every other label (the Node's, mirrored by the controller; an
    /// admin's; `vm.smolvm.dev/node`) left out, so rule V10 never has a reason to refuse it.
    #[test]
    fn agent_label_patch_table() {
        let others = [
            ("kubernetes.io/hostname", "n1"),
            ("tenant", "a"),
            (smolvm_api::constants::LABEL_NODE, "n1"),
        ];
        let with = |extra: &[(&str, &str)]| map(&[&others[..], extra].concat());
        let booted = capability_labels(Some(&check(CheckState::Done(Outcome::Booted { millis: 5 }))));
        let failed = capability_labels(Some(&check(failed())));
        let pending = capability_labels(Some(&check(CheckState::Pending)));
        let cases = [
            (
                "first result: set",
                with(&[]),
                &booted,
                Some(serde_json::json!({"metadata": {"labels": {LABEL_GUEST_BOOTABLE: "true"}}})),
            ),
            (
                "unchanged: no patch",
                with(&[(LABEL_GUEST_BOOTABLE, "true")]),
                &booted,
                None,
            ),
            (
                "changed",
                with(&[(LABEL_GUEST_BOOTABLE, "true")]),
                &failed,
                Some(serde_json::json!({"metadata": {"labels": {LABEL_GUEST_BOOTABLE: "false"}}})),
            ),
            (
                "no longer holds: removed, with a stale gpu count",
                with(&[(LABEL_GUEST_BOOTABLE, "false"), (LABEL_GPU_COUNT, "4")]),
                &pending,
                Some(serde_json::json!({"metadata": {"labels": {LABEL_GUEST_BOOTABLE: null, LABEL_GPU_COUNT: null}}})),
            ),
            ("nothing to set or remove", with(&[]), &capability_labels(None), None),
        ];
        for (name, current, agent, want) in cases {
            assert_eq!(agent_label_patch(&current, agent), want, "{name}");
        }
    }

    /// What the agent creates carries its name and its Node as owner, nothing else (rule V10).
    #[test]
    fn a_new_smolvm_node_carries_only_its_owner() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "uid": "uid-n1", "labels": {"tenant": "a"}}}))
        .expect("node");
        let created = new_smolvm_node(&node, "n1");
        assert_eq!(created.metadata.name.as_deref(), Some("n1"));
        assert_eq!(
            created.metadata.labels, None,
            "the Node's labels are the controller's to mirror"
        );
        assert_eq!(created.metadata.annotations, None);
        assert_eq!(created.metadata.finalizers, None);
        let owners = created.metadata.owner_references.unwrap_or_default();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (
                owners[0].api_version.as_str(),
                owners[0].kind.as_str(),
                owners[0].name.as_str(),
                owners[0].uid.as_str()
            ),
            ("v1", "Node", "n1", "uid-n1")
        );
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
