//! Prometheus metrics of the controller.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Label: the outcome of a reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or the error's stable reason.
    pub result: String,
}

/// Label: a stable reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason.
    pub reason: String,
}

/// Label: a phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// The phase.
    pub phase: String,
}

/// Label: a node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    /// The node.
    pub node: String,
}

/// Label: a node API operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    /// The operation.
    pub operation: String,
}

/// Labels: a condition of a SmolVMNode.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeConditionLabels {
    /// The SmolVMNode.
    pub node: String,
    /// The condition type (`Ready`, `GuestBootable`, ...).
    pub condition: String,
    /// `true`, `false` or `unknown`.
    pub status: &'static str,
}

/// What the leader sees of one SmolVMNode when it is scraped (see `tasks::probe`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeObservation {
    /// The SmolVMNode's name.
    pub node: String,
    /// Seconds since the controller saw its heartbeat change; `None` before any heartbeat.
    pub heartbeat_age_seconds: Option<f64>,
    /// Each condition's type and status (`true`, `false`, `unknown`).
    pub conditions: Vec<(String, &'static str)>,
    /// The agent's serving certificate's expiry as it reports it, Unix seconds.
    pub serving_certificate_not_after: Option<i64>,
}

/// Labels: an access call's subresource and outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AccessLabels {
    /// `log`, `exec`, `files` (or `discovery`).
    pub subresource: &'static str,
    /// `ok` or the refusal's stable reason.
    pub outcome: &'static str,
}

/// Labels: bytes through the access API.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    /// `log`, `exec`, `files`.
    pub subresource: &'static str,
    /// `out` (from the machine to the user) or `in`.
    pub direction: &'static str,
}

/// Labels: the lifetime of `spec.lifecycle` that passed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LifetimeLabel {
    /// `activeDeadlineSeconds` or `ttlSecondsAfterFinished`.
    pub lifetime: &'static str,
}

/// The controller's metrics.
pub struct Metrics {
    registry: Registry,
    /// Reconciles by result.
    pub reconciles: Family<ResultLabel, Counter>,
    /// Reconcile duration.
    pub reconcile_duration: Histogram,
    /// SmolVMs by phase, as of the last scrape.
    pub vms: Family<PhaseLabel, Gauge>,
    /// Placement failures by reason.
    pub placement_failures: Family<ReasonLabel, Counter>,
    /// Node API call latency by operation.
    pub runtime_calls: Family<OperationLabel, Histogram>,
    /// Machines no SmolVM owns, by node.
    pub orphans: Family<NodeLabel, Gauge>,
    /// Access API calls by subresource and outcome.
    pub access_calls: Family<AccessLabels, Counter>,
    /// Bytes streamed through the access API.
    pub access_bytes: Family<StreamLabels, Counter>,
    /// Access API connections closed by a bound of its listener, by reason.
    pub access_connections_closed: Family<ReasonLabel, Counter>,
    /// SmolVMs deleted because a lifetime of `spec.lifecycle` passed, by lifetime.
    pub expiries: Family<LifetimeLabel, Counter>,
    /// Idle suspensions the controller made.
    pub idle_suspensions: Counter,
    /// Wakes of VMs suspended for idleness.
    pub wakes: Counter,
    /// Time from a wake's request (as the controller first saw it) to the machine running.
    pub wake_duration: Histogram,
    /// SmolVMs suspended for idleness now, as of the scrape.
    pub idle_suspended: Gauge,
    /// 1 while this replica holds the Lease.
    pub leader: Gauge,
    /// Heartbeat age per SmolVMNode, by the controller's clock.
    pub node_heartbeat_age: Family<NodeLabel, Gauge<f64, AtomicU64>>,
    /// SmolVMNode conditions.
    pub node_conditions: Family<NodeConditionLabels, Gauge>,
    /// Agents' serving certificate expiry per SmolVMNode.
    pub node_serving_cert_expiry: Family<NodeLabel, Gauge>,
    /// The runtime CA's expiry.
    pub runtime_ca_expiry: Gauge,
    /// SmolVMs waiting for a node.
    pub unschedulable: Gauge,
    /// The longest any SmolVM has been waiting for a node.
    pub unschedulable_longest: Gauge<f64, AtomicU64>,
}

/// Registers a metric that is listed on `/metrics` (`# HELP`, `# TYPE`) before its first sample.
fn declare<M>(registry: &mut Registry, name: &str, help: &str, metric: &M)
where
    M: Clone,
    smolvm_kit::ops::Declared<M>: prometheus_client::registry::Metric,
{
    registry.register(name, help, smolvm_kit::ops::Declared(metric.clone()));
}

fn buckets() -> impl Iterator<Item = f64> {
    [
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ]
    .into_iter()
}

impl Default for Metrics {
    fn default() -> Self {
        let mut metrics = Metrics {
            registry: Registry::default(),
            leader: Gauge::default(),
            node_heartbeat_age: Family::default(),
            node_conditions: Family::default(),
            node_serving_cert_expiry: Family::default(),
            runtime_ca_expiry: Gauge::default(),
            unschedulable: Gauge::default(),
            unschedulable_longest: Gauge::default(),
            access_calls: Family::default(),
            access_bytes: Family::default(),
            access_connections_closed: Family::default(),
            expiries: Family::default(),
            idle_suspensions: Counter::default(),
            wakes: Counter::default(),
            wake_duration: Histogram::new(buckets()),
            idle_suspended: Gauge::default(),
            reconciles: Family::default(),
            reconcile_duration: Histogram::new(buckets()),
            vms: Family::default(),
            placement_failures: Family::default(),
            runtime_calls: Family::new_with_constructor(|| Histogram::new(buckets())),
            orphans: Family::default(),
        };
        let mut registry = Registry::with_prefix("smolvm_controller");
        metrics.register_lifecycle(&mut registry);
        metrics.register_fleet(&mut registry);
        metrics.registry = registry;
        metrics
    }
}

impl Metrics {
    /// The SmolVMs' lifecycle: reconciles, phases, placement, node calls, the access API.
    fn register_lifecycle(&self, registry: &mut Registry) {
        declare(
            registry,
            "reconciles",
            "SmolVM reconciles by result (ok, or the error's stable reason)",
            &self.reconciles,
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time one SmolVM reconcile took",
            self.reconcile_duration.clone(),
        );
        declare(
            registry,
            "vms",
            "SmolVMs by phase in the leader's cache, as of the scrape (only the leader reports)",
            &self.vms,
        );
        declare(
            registry,
            "placement_failures",
            "Placement attempts that found no node, by reason",
            &self.placement_failures,
        );
        declare(
            registry,
            "runtime_call_duration_seconds",
            "Time a node API call from the controller took, by operation",
            &self.runtime_calls,
        );
        declare(
            registry,
            "expiries",
            "SmolVMs deleted because a lifetime of spec.lifecycle passed (SPEC 2.7), by lifetime: activeDeadlineSeconds or ttlSecondsAfterFinished",
            &self.expiries,
        );
        registry.register(
            "idle_suspensions",
            "SmolVMs the controller suspended because their published ports and access sessions were quiet for lifecycle.suspendAfterIdle (SPEC 2.7)",
            self.idle_suspensions.clone(),
        );
        registry.register(
            "wakes",
            "SmolVMs suspended for idleness that the controller resumed (a held connection, an exec or copy, kubectl smolvm resume)",
            self.wakes.clone(),
        );
        registry.register(
            "wake_duration_seconds",
            "Time from a wake's request, as the controller first saw it on its SmolVMNode, until the node answered the resume",
            self.wake_duration.clone(),
        );
        registry.register(
            "idle_suspended_vms",
            "SmolVMs suspended for idleness now, in the leader's cache, as of the scrape",
            self.idle_suspended.clone(),
        );
        declare(
            registry,
            "access_calls",
            "Calls of the access API (subresources.vm.smolvm.dev) by subresource and outcome",
            &self.access_calls,
        );
        declare(
            registry,
            "access_bytes",
            "Bytes streamed through the access API, by subresource and direction",
            &self.access_bytes,
        );
        declare(
            registry,
            "access_connections_closed",
            "Access API connections closed by a bound of its listener before any request: at once when the open connections or the TLS handshakes in progress are at their cap, in all (reason connections, handshakes) or from one source address (source_connections, source_handshakes), or when a handshake did not finish in time (handshake_timeout)",
            &self.access_connections_closed,
        );
    }

    /// The leader, the nodes, the certificates, unplaced VMs and orphans.
    fn register_fleet(&self, registry: &mut Registry) {
        registry.register(
            "leader",
            "1 while this replica holds the controller's Lease and acts, 0 while it stands by",
            self.leader.clone(),
        );
        declare(
            registry,
            "node_heartbeat_age_seconds",
            "Seconds since the leader saw each SmolVMNode's heartbeat change, by its own clock (only the leader reports)",
            &self.node_heartbeat_age,
        );
        declare(
            registry,
            "node_condition",
            "Conditions of each SmolVMNode (Ready, KVMAvailable, RuntimeReady, GuestBootable): 1 for the status it has (true, false, unknown) (only the leader reports)",
            &self.node_conditions,
        );
        declare(
            registry,
            "node_serving_certificate_expiry_timestamp_seconds",
            "Expiry of each agent's node API serving certificate, as its SmolVMNode reports it, Unix seconds (only the leader reports)",
            &self.node_serving_cert_expiry,
        );
        registry.register(
            "runtime_ca_expiry_timestamp_seconds",
            "Expiry of the runtime CA that signs new node certificates, Unix seconds (only the leader reports)",
            self.runtime_ca_expiry.clone(),
        );
        registry.register(
            "unschedulable_vms",
            "SmolVMs whose Scheduled condition is False with reason Unschedulable (only the leader reports)",
            self.unschedulable.clone(),
        );
        registry.register(
            "unschedulable_longest_seconds",
            "Seconds the longest-waiting Unschedulable SmolVM has been so, 0 when none is (only the leader reports)",
            self.unschedulable_longest.clone(),
        );
        declare(
            registry,
            "orphan_machines",
            "Machines on a node that no SmolVM owns (booked in placement, deleted after the grace period), by node",
            &self.orphans,
        );
    }
}

impl Metrics {
    /// Records one reconcile.
    pub fn reconciled(&self, result: &str, took: Duration) {
        self.reconciles
            .get_or_create(&ResultLabel { result: result.into() })
            .inc();
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    /// Records one node API call.
    pub fn runtime_call(&self, operation: &str, took: Duration) {
        self.runtime_calls
            .get_or_create(&OperationLabel {
                operation: operation.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Sets the per-phase gauge from a count.
    pub fn set_phases<'a>(&self, counts: impl IntoIterator<Item = (&'a str, i64)>) {
        self.vms.clear();
        for (phase, n) in counts {
            self.vms.get_or_create(&PhaseLabel { phase: phase.into() }).set(n);
        }
    }

    /// Sets the orphan gauge from a count per node.
    pub fn set_orphans(&self, counts: std::collections::BTreeMap<String, i64>) {
        self.orphans.clear();
        for (node, n) in counts {
            self.orphans.get_or_create(&NodeLabel { node }).set(n);
        }
    }

    /// Counts one wake, which took `took` from its request to the machine running.
    pub fn woke(&self, took: Duration) {
        self.wakes.inc();
        self.wake_duration.observe(took.as_secs_f64());
    }

    /// Counts a SmolVM deleted because its lifetime `lifetime` passed.
    pub fn expired(&self, lifetime: &'static str) {
        self.expiries.get_or_create(&LifetimeLabel { lifetime }).inc();
    }

    /// Records one access call.
    pub fn access_call(&self, subresource: &'static str, outcome: &'static str) {
        self.access_calls
            .get_or_create(&AccessLabels { subresource, outcome })
            .inc();
    }

    /// Counts an access API connection closed by a bound of its listener
    /// ([`smolvm_kit::accept::Closed::as_str`]).
    pub fn access_connection_closed(&self, reason: &'static str) {
        self.access_connections_closed
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts bytes through the access API.
    pub fn access_streamed(&self, subresource: &'static str, direction: &'static str, bytes: u64) {
        self.access_bytes
            .get_or_create(&StreamLabels { subresource, direction })
            .inc_by(bytes);
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Sets the per-node gauges from what the leader sees of every SmolVMNode (series of nodes
    /// gone since the last scrape disappear).
    pub fn set_nodes(&self, nodes: &[NodeObservation]) {
        self.node_heartbeat_age.clear();
        self.node_conditions.clear();
        self.node_serving_cert_expiry.clear();
        for observed in nodes {
            let node = NodeLabel {
                node: observed.node.clone(),
            };
            if let Some(age) = observed.heartbeat_age_seconds {
                self.node_heartbeat_age.get_or_create(&node).set(age);
            }
            if let Some(not_after) = observed.serving_certificate_not_after {
                self.node_serving_cert_expiry.get_or_create(&node).set(not_after);
            }
            for (condition, status) in &observed.conditions {
                self.node_conditions
                    .get_or_create(&NodeConditionLabels {
                        node: observed.node.clone(),
                        condition: condition.clone(),
                        status,
                    })
                    .set(1);
            }
        }
    }

    /// Sets the runtime CA's expiry (Unix seconds).
    pub fn set_runtime_ca_not_after(&self, not_after_unix: i64) {
        self.runtime_ca_expiry.set(not_after_unix);
    }

    /// Sets how many SmolVMs are Unschedulable and for how long the longest has been.
    pub fn set_unschedulable(&self, count: i64, longest_seconds: f64) {
        self.unschedulable.set(count);
        self.unschedulable_longest.set(longest_seconds);
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        smolvm_kit::ops::encode_metrics(&self.registry)
    }
}
