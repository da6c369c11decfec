//! What the controller's ops server reports: every replica is ready (a standby serves health and
//! waits for the Lease); the body says which it is. Metrics count the SmolVMs by phase from the
//! leader's cache as they are scraped, and report what the leader sees of the fleet: which
//! replica leads, each SmolVMNode's heartbeat age, conditions and serving certificate expiry,
//! the runtime CA's expiry, and the SmolVMs waiting for a node.

use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Condition, jiff::Timestamp};
use kube::{ResourceExt, runtime::reflector};
use smolvm_api::{
    SmolVM, SmolVMNode,
    constants::{condition, reason},
};
use tokio::sync::watch;

use crate::{
    metrics::{Metrics, NodeObservation},
    pki::runtime_ca::RuntimeTrust,
    placement,
};

/// The SmolVM cache, once the controller leads and runs.
pub type VmStoreSlot = Arc<RwLock<Option<reflector::Store<SmolVM>>>>;

/// What the leader knows of the fleet, once it leads: the SmolVMNode cache, the heartbeat
/// clock, and the runtime CA in force.
#[derive(Clone)]
pub struct Fleet {
    /// The SmolVMNode cache.
    pub nodes: reflector::Store<SmolVMNode>,
    /// Heartbeat freshness by the controller's own clock.
    pub liveness: placement::Config,
    /// The runtime CA in force.
    pub trust: Arc<RuntimeTrust>,
}

/// [`Fleet`], once the controller leads.
pub type FleetSlot = Arc<RwLock<Option<Fleet>>>;

/// A condition's status as a label value: `true`, `false` or `unknown`.
fn status_label(status: &str) -> &'static str {
    match status {
        "True" => "true",
        "False" => "false",
        _ => "unknown",
    }
}

/// Pure: what the metrics report of one SmolVMNode at `now`.
pub fn observe_node(node: &SmolVMNode, now: Timestamp, liveness: &placement::Config) -> NodeObservation {
    let status = node.status.as_ref();
    NodeObservation {
        node: node.name_any(),
        heartbeat_age_seconds: liveness.heartbeat_age(node, now).map(|age| age.as_secs_f64()),
        conditions: status
            .map(|s| {
                s.conditions
                    .iter()
                    .map(|c| (c.type_.clone(), status_label(&c.status)))
                    .collect()
            })
            .unwrap_or_default(),
        serving_certificate_not_after: status
            .and_then(|s| s.serving_certificate.as_ref())
            .and_then(|c| c.not_after.as_ref())
            .map(|t| t.0.as_second()),
    }
}

/// Pure: the Scheduled condition of a SmolVM when it says Unschedulable.
fn unschedulable_since(conditions: &[Condition]) -> Option<Timestamp> {
    conditions
        .iter()
        .find(|c| c.type_ == condition::SCHEDULED && c.status == "False" && c.reason == reason::UNSCHEDULABLE)
        .map(|c| c.last_transition_time.0)
}

/// Pure: how many SmolVMs are Unschedulable at `now`, and the longest any has been, in seconds.
pub fn unschedulable<'a>(vms: impl IntoIterator<Item = &'a SmolVM>, now: Timestamp) -> (i64, f64) {
    let mut count = 0;
    let mut longest: f64 = 0.0;
    for vm in vms {
        let since = vm.status.as_ref().and_then(|s| unschedulable_since(&s.conditions));
        if let Some(since) = since {
            count += 1;
            longest = longest.max(now.duration_since(since).as_secs_f64().max(0.0));
        }
    }
    (count, longest)
}

/// The expiry of a certificate, Unix seconds.
fn not_after_unix(der: &rustls::pki_types::CertificateDer<'_>) -> Option<i64> {
    let info = smolvm_certs::cert_info_from_der(der).ok()?;
    let since = info.not_after.duration_since(std::time::SystemTime::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_secs()).ok()
}

/// The controller's [`smolvm_kit::ops::Probe`].
pub struct Probe {
    /// Whether this replica leads.
    pub leader: watch::Receiver<bool>,
    /// The controller's metrics.
    pub metrics: Arc<Metrics>,
    /// The SmolVM cache to count phases in.
    pub vms: VmStoreSlot,
    /// The fleet, once this replica leads.
    pub fleet: FleetSlot,
}

impl smolvm_kit::ops::Probe for Probe {
    fn readiness(&self) -> Result<String, String> {
        Ok(if *self.leader.borrow() {
            "ok (leader)"
        } else {
            "ok (standby)"
        }
        .into())
    }

    fn metrics(&self) -> String {
        self.metrics.set_leader(*self.leader.borrow());
        let now = Timestamp::now();
        let store = self.vms.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(store) = store {
            let vms = store.state();
            let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
            for vm in &vms {
                let phase = vm.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
                *counts.entry(phase.as_str()).or_default() += 1;
            }
            self.metrics.set_phases(counts);
            let idle = vms.iter().filter(|vm| vm.idle_suspended()).count();
            self.metrics.idle_suspended.set(i64::try_from(idle).unwrap_or(i64::MAX));
            let (count, longest) = unschedulable(vms.iter().map(|vm| vm.as_ref()), now);
            self.metrics.set_unschedulable(count, longest);
        }
        let fleet = self.fleet.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(fleet) = fleet {
            let nodes: Vec<NodeObservation> = fleet
                .nodes
                .state()
                .iter()
                .map(|node| observe_node(node, now, &fleet.liveness))
                .collect();
            self.metrics.set_nodes(&nodes);
            if let Some(not_after) = not_after_unix(fleet.trust.signing().cert_der()) {
                self.metrics.set_runtime_ca_not_after(not_after);
            }
        }
        self.metrics.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::SignedDuration;
    use smolvm_api::{ServingCertificate, SmolVMNodeStatus, SmolVMStatus};

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap_or_default()
    }

    fn condition(type_: &str, status: &str, reason: &str, since: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(at(since)),
            observed_generation: None,
        }
    }

    fn vm(conditions: Vec<Condition>) -> SmolVM {
        let mut vm = SmolVM::new("vm", Default::default());
        vm.status = Some(SmolVMStatus {
            conditions,
            ..Default::default()
        });
        vm
    }

    /// Only a Scheduled=False condition with reason Unschedulable counts; the longest wait wins.
    #[test]
    fn unschedulable_counts_and_the_longest_wait() {
        let cases: Vec<(Vec<SmolVM>, (i64, f64))> = vec![
            (vec![], (0, 0.0)),
            (
                vec![vm(vec![condition("Scheduled", "True", "Scheduled", 100)])],
                (0, 0.0),
            ),
            (vec![vm(vec![condition("Scheduled", "False", "Other", 100)])], (0, 0.0)),
            (
                vec![
                    vm(vec![condition("Scheduled", "False", "Unschedulable", 400)]),
                    vm(vec![condition("Scheduled", "False", "Unschedulable", 100)]),
                    vm(vec![condition("Ready", "False", "Unschedulable", 0)]),
                ],
                (2, 900.0),
            ),
        ];
        for (vms, expected) in cases {
            assert_eq!(unschedulable(vms.iter(), at(1000)), expected);
        }
    }

    /// A node's conditions, heartbeat age (by its own heartbeat time without an observing
    /// clock) and serving certificate expiry.
    #[test]
    fn a_node_as_the_metrics_see_it() {
        let mut node = SmolVMNode::new("n1", Default::default());
        node.status = Some(SmolVMNodeStatus {
            heartbeat_time: Some(Time(at(970))),
            conditions: vec![
                condition("Ready", "True", "Ready", 0),
                condition("GuestBootable", "False", "HostCannotRunGuest", 0),
                condition("KVMAvailable", "Unknown", "", 0),
            ],
            serving_certificate: Some(ServingCertificate {
                not_after: Some(Time(at(5000))),
                ..Default::default()
            }),
            ..Default::default()
        });
        let liveness = placement::Config {
            heartbeat_timeout: SignedDuration::from_secs(40),
            clock: None,
        };
        let seen = observe_node(&node, at(1000), &liveness);
        assert_eq!(seen.node, "n1");
        assert_eq!(seen.heartbeat_age_seconds, Some(30.0));
        assert_eq!(seen.serving_certificate_not_after, Some(5000));
        assert_eq!(
            seen.conditions,
            vec![
                ("Ready".to_string(), "true"),
                ("GuestBootable".to_string(), "false"),
                ("KVMAvailable".to_string(), "unknown"),
            ]
        );
        let bare = observe_node(&SmolVMNode::new("n2", Default::default()), at(1000), &liveness);
        assert_eq!(bare.heartbeat_age_seconds, None);
        assert!(bare.conditions.is_empty());
    }

    /// The fleet's gauges show in the exposition, and a node gone since the last scrape goes.
    #[test]
    fn fleet_gauges_render_and_forget_gone_nodes() {
        let metrics = Metrics::default();
        metrics.set_leader(true);
        metrics.set_unschedulable(2, 900.0);
        metrics.set_runtime_ca_not_after(5000);
        let node = |name: &str| NodeObservation {
            node: name.into(),
            heartbeat_age_seconds: Some(3.0),
            conditions: vec![("GuestBootable".into(), "false")],
            serving_certificate_not_after: Some(7000),
        };
        metrics.set_nodes(&[node("a"), node("b")]);
        metrics.set_nodes(&[node("a")]);
        let text = metrics.encode();
        for line in [
            "smolvm_controller_leader 1",
            "smolvm_controller_unschedulable_vms 2",
            "smolvm_controller_unschedulable_longest_seconds 900.0",
            "smolvm_controller_runtime_ca_expiry_timestamp_seconds 5000",
            "smolvm_controller_node_heartbeat_age_seconds{node=\"a\"} 3.0",
            "smolvm_controller_node_condition{node=\"a\",condition=\"GuestBootable\",status=\"false\"} 1",
            "smolvm_controller_node_serving_certificate_expiry_timestamp_seconds{node=\"a\"} 7000",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(!text.contains("node=\"b\""), "{text}");
    }
}
