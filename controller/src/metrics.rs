//! Prometheus metrics of the controller.

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
}

fn buckets() -> impl Iterator<Item = f64> {
    [
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ]
    .into_iter()
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("smolvm_controller");
        let reconciles = Family::<ResultLabel, Counter>::default();
        let reconcile_duration = Histogram::new(buckets());
        let vms = Family::<PhaseLabel, Gauge>::default();
        let placement_failures = Family::<ReasonLabel, Counter>::default();
        let runtime_calls = Family::<OperationLabel, Histogram>::new_with_constructor(|| Histogram::new(buckets()));
        registry.register("reconciles", "Reconciles by result", reconciles.clone());
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile duration",
            reconcile_duration.clone(),
        );
        registry.register("vms", "SmolVMs by phase", vms.clone());
        registry.register(
            "placement_failures",
            "Placement failures by reason",
            placement_failures.clone(),
        );
        registry.register(
            "runtime_call_duration_seconds",
            "Node API call latency by operation",
            runtime_calls.clone(),
        );
        let orphans = Family::<NodeLabel, Gauge>::default();
        registry.register(
            "orphan_machines",
            "Machines on a node that no SmolVM owns (booked in placement, deleted after the grace period), by node",
            orphans.clone(),
        );
        let access_calls = Family::<AccessLabels, Counter>::default();
        registry.register(
            "access_calls",
            "Calls of the access API (subresources.vm.smolvm.dev) by subresource and outcome",
            access_calls.clone(),
        );
        let access_bytes = Family::<StreamLabels, Counter>::default();
        registry.register(
            "access_bytes",
            "Bytes streamed through the access API, by subresource and direction",
            access_bytes.clone(),
        );
        Metrics {
            registry,
            access_calls,
            access_bytes,
            reconciles,
            reconcile_duration,
            vms,
            placement_failures,
            runtime_calls,
            orphans,
        }
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

    /// Records one access call.
    pub fn access_call(&self, subresource: &'static str, outcome: &'static str) {
        self.access_calls
            .get_or_create(&AccessLabels { subresource, outcome })
            .inc();
    }

    /// Counts bytes through the access API.
    pub fn access_streamed(&self, subresource: &'static str, direction: &'static str, bytes: u64) {
        self.access_bytes
            .get_or_create(&StreamLabels { subresource, direction })
            .inc_by(bytes);
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        smolvm_kit::ops::encode_metrics(&self.registry)
    }
}
