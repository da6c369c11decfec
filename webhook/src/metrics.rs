//! Prometheus metrics (prometheus-client), served as text on the ops port's `/metrics`.

use std::sync::OnceLock;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::review::{Outcome, RequestError, Route};

/// Labels of `smolvm_webhook_requests`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `mutate` or `validate`.
    pub webhook: &'static str,
    /// `smolvms`, `smolvms/status`, `smolvmnodes`, `smolvmnodes/status`.
    pub resource: String,
    /// `CREATE`, `UPDATE`, ...
    pub operation: &'static str,
    /// `allowed`, `denied`, or `error`.
    pub verdict: &'static str,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The URL path.
    pub path: &'static str,
}

/// Labels of `smolvm_webhook_rejections`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    /// The rule id (`V1` ... `V10`, `schema`).
    pub rule: &'static str,
}

/// Labels of counters keyed by an error reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// A stable reason string.
    pub reason: &'static str,
}

type HistogramFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// Upper bounds (seconds) past the doubling ones: the latency alert's 250 ms threshold is a
/// bucket bound, so its p99 is not interpolated across a wide bucket, and the API server's 10 s
/// timeout is the last.
const SLOW_BUCKETS: [f64; 6] = [0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

fn latency_histogram() -> Histogram {
    // 50 µs, doubling, to ~0.1 s; then SLOW_BUCKETS.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 12).chain(SLOW_BUCKETS))
}

/// The resources a route can report (`Outcome::resource`), for [`Handles`].
const KNOWN_RESOURCES: [&str; 6] = [
    "smolvms",
    "smolvms/status",
    "smolvmnodes",
    "smolvmnodes/status",
    "smolvmclasses",
    "smolvmpools",
];
const OPERATIONS: [&str; 4] = ["CREATE", "UPDATE", "DELETE", "CONNECT"];
const VERDICTS: [&str; 2] = ["allowed", "denied"];
const REQUEST_SLOTS: usize = Route::ALL.len() * KNOWN_RESOURCES.len() * OPERATIONS.len() * VERDICTS.len();

/// Handles on series of the families, taken on first use, so that a request does not hash its
/// labels and look them up in the family every time. A handle is the series itself (prometheus
/// client metrics share their value between clones), so what is exported is unchanged.
struct Handles {
    requests: Vec<OnceLock<Counter>>,
    latency: [OnceLock<Histogram>; Route::ALL.len()],
}

fn route_index(route: Route) -> usize {
    match route {
        Route::MutateSmolVM => 0,
        Route::ValidateSmolVM => 1,
        Route::ValidateSmolVMNode => 2,
        Route::ValidateSmolVMClass => 3,
        Route::ValidateSmolVMPool => 4,
    }
}

/// The slot of a request counter, for the label values a route reports.
fn request_slot(route: Route, resource: &str, operation: &str, verdict: &str) -> Option<usize> {
    let r = KNOWN_RESOURCES.iter().position(|k| *k == resource)?;
    let o = OPERATIONS.iter().position(|k| *k == operation)?;
    let v = VERDICTS.iter().position(|k| *k == verdict)?;
    Some(((route_index(route) * KNOWN_RESOURCES.len() + r) * OPERATIONS.len() + o) * VERDICTS.len() + v)
}

/// The webhook's metrics.
pub struct Metrics {
    handles: Handles,
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily,
    rejections: Family<RuleLabels, Counter>,
    bad_requests: Family<ReasonLabels, Counter>,
    policy_reload_errors: Counter,
    policy_reloads: Counter,
    cert_reload_errors: Family<ReasonLabels, Counter>,
    cert_reloads: Counter,
    shed: Family<RouteLabels, Counter>,
    cert_not_after: Gauge,
    connections_closed: Family<ReasonLabels, Counter>,
    quota_charges: Family<ResultLabels, Counter>,
    quota_conflicts: Counter,
}

/// Labels of `smolvm_webhook_quota_charges`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `charged`, `judged` (a dry run), `QuotaExceeded`, `QuotaBusy`, `QuotaUnavailable`.
    pub result: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The quota charges' metrics (rule V15), registered in `registry`.
fn register_quota(registry: &mut Registry) -> (Family<ResultLabels, Counter>, Counter) {
    let quota_charges = Family::<ResultLabels, Counter>::default();
    registry.register(
        "quota_charges",
        "SmolVM writes charged to their namespace's ResourceQuotas (rule V15), by result: charged, judged (a dry run, never written), QuotaExceeded (refused), QuotaBusy or QuotaUnavailable (refused: the quota could not be updated)",
        smolvm_kit::ops::Declared(quota_charges.clone()),
    );
    let quota_conflicts = Counter::default();
    registry.register(
        "quota_conflicts",
        "Conflicts met while charging ResourceQuotas (another writer charged the quota first; each cost a read of it)",
        quota_conflicts.clone(),
    );
    (quota_charges, quota_conflicts)
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("smolvm_webhook");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: HistogramFamily = Family::new_with_constructor(latency_histogram);
        let rejections = Family::<RuleLabels, Counter>::default();
        let bad_requests = Family::<ReasonLabels, Counter>::default();
        let policy_reload_errors = Counter::default();
        let policy_reloads = Counter::default();
        let cert_reload_errors = Family::<ReasonLabels, Counter>::default();
        let cert_reloads = Counter::default();
        let shed = Family::<RouteLabels, Counter>::default();
        registry.register(
            "shed_requests",
            "Requests shed with 429 and Retry-After because every review slot was busy (the API server retries them)",
            smolvm_kit::ops::Declared(shed.clone()),
        );
        let cert_not_after = Gauge::default();
        let connections_closed = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "connections_closed",
            "Connections closed before they were served: a cap of open connections or handshakes in progress was reached, in all (reason connections, handshakes) or for the connection's source address (source_connections, source_handshakes), or a TLS handshake did not finish in time (handshake_timeout)",
            smolvm_kit::ops::Declared(connections_closed.clone()),
        );
        registry.register(
            "requests",
            "Admission requests answered, by webhook (mutate, validate), resource, operation and verdict (allowed, denied, or error for a request answered with an HTTP error)",
            smolvm_kit::ops::Declared(requests.clone()),
        );
        registry.register(
            "request_duration_seconds",
            "Time to answer an admission request, body read included, by path",
            smolvm_kit::ops::Declared(latency.clone()),
        );
        registry.register(
            "rejections",
            "Admission requests denied, by violated rule",
            smolvm_kit::ops::Declared(rejections.clone()),
        );
        registry.register(
            "bad_requests",
            "Admission requests answered with an HTTP error (not a review), by reason",
            smolvm_kit::ops::Declared(bad_requests.clone()),
        );
        registry.register(
            "policy_reload_errors",
            "Policy file reloads that failed (the last good policy stays in force)",
            policy_reload_errors.clone(),
        );
        registry.register("policy_reloads", "Policy file reloads applied", policy_reloads.clone());
        registry.register(
            "certificate_reload_errors",
            "Serving certificate reloads that failed, by reason (the current certificate stays in use)",
            smolvm_kit::ops::Declared(cert_reload_errors.clone()),
        );
        registry.register(
            "certificate_reloads",
            "Serving certificates swapped in by a reload",
            cert_reloads.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "Expiry of the serving certificate in use, Unix seconds",
            cert_not_after.clone(),
        );
        let (quota_charges, quota_conflicts) = register_quota(&mut registry);
        Metrics {
            quota_charges,
            quota_conflicts,
            handles: Handles {
                requests: (0..REQUEST_SLOTS).map(|_| OnceLock::new()).collect(),
                latency: Default::default(),
            },
            registry,
            requests,
            latency,
            rejections,
            bad_requests,
            policy_reload_errors,
            policy_reloads,
            cert_reload_errors,
            cert_reloads,
            cert_not_after,
            shed,
            connections_closed,
        }
    }

    /// Records a reviewed request.
    pub fn observe(&self, route: Route, outcome: &Outcome, seconds: f64) {
        let count = |resource: &str| {
            self.requests
                .get_or_create(&RequestLabels {
                    webhook: route.kind(),
                    resource: resource.to_string(),
                    operation: outcome.operation,
                    verdict: outcome.verdict,
                })
                .clone()
        };
        match request_slot(route, &outcome.resource, outcome.operation, outcome.verdict) {
            Some(slot) => self.handles.requests[slot]
                .get_or_init(|| count(&outcome.resource))
                .inc(),
            None => count(&outcome.resource).inc(),
        };
        for rule in &outcome.rules {
            self.rejections.get_or_create(&RuleLabels { rule: rule.as_str() }).inc();
        }
        self.latency_of(route).observe(seconds);
    }

    /// The latency histogram of `route`.
    fn latency_of(&self, route: Route) -> &Histogram {
        self.handles.latency[route_index(route)]
            .get_or_init(|| self.latency.get_or_create(&RouteLabels { path: route.path() }).clone())
    }

    /// Records a connection closed before it was served: `connections`, `source_connections`,
    /// `handshakes` or `source_handshakes` (a cap was reached, in all or for its source
    /// address), `handshake_timeout`.
    pub fn observe_connection_closed(&self, reason: &'static str) {
        self.connections_closed.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Records a quota charge's result and the conflicts it met.
    pub fn observe_quota(&self, result: &'static str, conflicts: u32) {
        self.quota_charges.get_or_create(&ResultLabels { result }).inc();
        self.quota_conflicts.inc_by(u64::from(conflicts));
    }

    /// Records a request shed because every review slot was busy.
    pub fn observe_shed(&self, route: Route) {
        self.shed.get_or_create(&RouteLabels { path: route.path() }).inc();
    }

    /// Records a request answered with an HTTP error.
    pub fn observe_error(&self, route: Route, error: &RequestError, seconds: f64) {
        self.bad_requests
            .get_or_create(&ReasonLabels { reason: error.reason() })
            .inc();
        self.requests
            .get_or_create(&RequestLabels {
                webhook: route.kind(),
                resource: route.resource().to_string(),
                operation: "",
                verdict: "error",
            })
            .inc();
        self.latency_of(route).observe(seconds);
    }

    /// Records a policy reload.
    pub fn policy_reloaded(&self, ok: bool) {
        if ok {
            self.policy_reloads.inc();
        } else {
            self.policy_reload_errors.inc();
        }
    }

    /// Records a certificate reload: `Ok(not_after_unix)` or the error's reason.
    pub fn certificate_reloaded(&self, result: Result<i64, &'static str>) {
        match result {
            Ok(not_after) => {
                self.cert_reloads.inc();
                self.cert_not_after.set(not_after);
            }
            Err(reason) => {
                self.cert_reload_errors.get_or_create(&ReasonLabels { reason }).inc();
            }
        }
    }

    /// Sets the expiry gauge without counting a reload (initial load).
    pub fn set_certificate_not_after(&self, not_after_unix: i64) {
        self.cert_not_after.set(not_after_unix);
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        smolvm_kit::ops::encode_metrics(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(resource: &str, verdict: &'static str, rules: Vec<smolvm_api::validate::RuleId>) -> Outcome {
        Outcome {
            resource: resource.to_string(),
            operation: "CREATE",
            verdict,
            patched: false,
            rules,
            uid: "u".into(),
        }
    }

    /// Counting through the cached handles shows in the exposition exactly as counting through
    /// the families, known and unknown label values alike; nothing shows before it is counted.
    #[test]
    fn cached_handles_count_in_the_families() {
        let m = Metrics::new();
        let text = m.encode();
        assert!(!text.contains("smolvm_webhook_requests_total{"), "{text}");
        for _ in 0..3 {
            m.observe(Route::ValidateSmolVM, &outcome("smolvms", "allowed", vec![]), 0.0001);
        }
        m.observe(
            Route::ValidateSmolVM,
            &outcome("smolvms", "denied", vec![smolvm_api::validate::RuleId::V1]),
            0.0001,
        );
        m.observe(Route::MutateSmolVM, &outcome("pods", "denied", vec![]), 0.0001);
        m.observe(Route::MutateSmolVM, &outcome("pods", "denied", vec![]), 0.0001);
        m.observe_error(Route::ValidateSmolVMNode, &RequestError::MissingRequest, 0.0001);
        let text = m.encode();
        for line in [
            r#"smolvm_webhook_requests_total{webhook="validate",resource="smolvms",operation="CREATE",verdict="allowed"} 3"#,
            r#"smolvm_webhook_requests_total{webhook="validate",resource="smolvms",operation="CREATE",verdict="denied"} 1"#,
            r#"smolvm_webhook_requests_total{webhook="mutate",resource="pods",operation="CREATE",verdict="denied"} 2"#,
            r#"smolvm_webhook_requests_total{webhook="validate",resource="smolvmnodes",operation="",verdict="error"} 1"#,
            r#"smolvm_webhook_rejections_total{rule="V1"} 1"#,
            r#"smolvm_webhook_request_duration_seconds_count{path="/validate/smolvms"} 4"#,
            r#"smolvm_webhook_request_duration_seconds_count{path="/mutate/smolvms"} 2"#,
            r#"smolvm_webhook_request_duration_seconds_count{path="/validate/smolvmnodes"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
