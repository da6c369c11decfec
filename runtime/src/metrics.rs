//! Prometheus metrics of the agent, through prometheus-client (as the webhook's and the
//! controller's), served as OpenMetrics text on the ops port.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Upper bounds (seconds) of the request latency histogram.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0, 60.0,
];

/// Labels: a node API operation and the stable code it answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    operation: String,
    code: String,
}

/// Label: a node API operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: String,
}

/// Label: `tcp` or `udp`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabel {
    protocol: &'static str,
}

/// Labels: `tcp` or `udp`, and which cap refused (`port`, `agent`, `source`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    protocol: &'static str,
    reason: &'static str,
}

/// Label: which bound of the node API's listener closed a connection (`connections`,
/// `source_connections`, `handshakes`, `source_handshakes`, `handshake_timeout`;
/// [`smolvm_kit::accept::Closed`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Label: how a guest boot check ended (`Booted`, or the cause it failed with).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// Upper bounds (seconds) of the canary boot histogram: a guest boots in well under a second
/// on a good host and smolvm gives up after 30 s.
pub const CANARY_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0];

/// Upper bounds (seconds) of the suspend and resume histograms: smolvm writes or reads a
/// machine's whole memory, a few seconds per GiB, so a large machine takes minutes.
pub const SUSPEND_BUCKETS: [f64; 12] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// The suspension metrics: suspend and resume durations, suspended machines.
#[derive(Debug)]
struct Suspensions {
    suspend: Histogram,
    resume: Histogram,
    suspended: Gauge,
}

impl Suspensions {
    fn register(registry: &mut Registry) -> Self {
        let suspend = Histogram::new(SUSPEND_BUCKETS);
        registry.register(
            "suspend_duration_seconds",
            "Time smolvm took to pause a machine for a suspend (its memory and disks saved durably, then its process stopped), of the suspends that succeeded",
            suspend.clone(),
        );
        let resume = Histogram::new(SUSPEND_BUCKETS);
        registry.register(
            "resume_duration_seconds",
            "Time smolvm took to resume a suspended machine from its saved state, of the resumes that succeeded",
            resume.clone(),
        );
        let suspended = Gauge::default();
        registry.register(
            "machines_suspended",
            "Machines on this node suspended by the agent now (smolvm reports them stopped; their saved state is kept)",
            suspended.clone(),
        );
        Self {
            suspend,
            resume,
            suspended,
        }
    }
}

/// The release hook's metrics: releases by result, machines stopped, how long releases took.
#[derive(Debug)]
struct Releases {
    results: Family<ResultLabel, Counter>,
    stops: Counter,
    duration: Histogram,
}

impl Releases {
    fn register(registry: &mut Registry) -> Self {
        let results = Family::<ResultLabel, Counter>::default();
        registry.register(
            "volume_releases",
            "Calls of the release hook (a holder Pod's preStop), by result: Released (every machine the token held was stopped and its volume binds undone), NoMatch (no machine held by the token), Unauthenticated (no token), Failed (a machine could not be stopped or unbound; its binds stay)",
            smolvm_kit::ops::Declared(results.clone()),
        );
        let stops = Counter::default();
        registry.register(
            "volume_release_stops",
            "Machines the release hook stopped (all it held but suspended ones) before their holder's volumes were unmounted",
            stops.clone(),
        );
        let duration = Histogram::new(SUSPEND_BUCKETS);
        registry.register(
            "volume_release_duration_seconds",
            "Time a release took (the graceful stops and the unmounts), of the releases that held a machine",
            duration.clone(),
        );
        Self {
            results,
            stops,
            duration,
        }
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The node API's request metrics: answers by operation and code, and their latency.
#[derive(Debug)]
struct Requests {
    answered: Family<RequestLabels, Counter>,
    latency: Family<OperationLabel, Histogram, fn() -> Histogram>,
}

impl Requests {
    fn register(registry: &mut Registry) -> Self {
        let answered = Family::<RequestLabels, Counter>::default();
        registry.register(
            "node_api_requests",
            "Node API requests answered, by operation and stable code (OK or the error code)",
            smolvm_kit::ops::Declared(answered.clone()),
        );
        let latency = Family::<OperationLabel, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        registry.register(
            "node_api_request_duration_seconds",
            "Time the node API took to answer a request, by operation",
            smolvm_kit::ops::Declared(latency.clone()),
        );
        Self { answered, latency }
    }
}

/// The port forwarder's metrics: connections and bytes carried, forwards open, refusals by a
/// cap, idle closures.
#[derive(Debug)]
struct Forwards {
    connections: Family<ProtocolLabel, Counter>,
    bytes: Family<ProtocolLabel, Counter>,
    open: Gauge,
    refused: Family<RefusedLabels, Counter>,
    idle_closed: Family<ProtocolLabel, Counter>,
    held: Counter,
    hold: Histogram,
}

/// Upper bounds (seconds) of the held-connection histogram: from the connection's arrival at a
/// sleeping machine's port to smolvm's port answering (the wake, smolvm's resume included).
pub const WAKE_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

impl Forwards {
    fn register(registry: &mut Registry) -> Self {
        let connections = Family::<ProtocolLabel, Counter>::default();
        registry.register(
            "forwarded_connections",
            "Connections (TCP) and client sessions (UDP) forwarded to published ports",
            smolvm_kit::ops::Declared(connections.clone()),
        );
        let bytes = Family::<ProtocolLabel, Counter>::default();
        registry.register(
            "forwarded_bytes",
            "Bytes carried by the port forwards, both directions",
            smolvm_kit::ops::Declared(bytes.clone()),
        );
        let open = Gauge::default();
        registry.register(
            "open_forwards",
            "Published ports of running VMs forwarded from the node's address now",
            open.clone(),
        );
        let refused = Family::<RefusedLabels, Counter>::default();
        registry.register(
            "forward_refused",
            "TCP connections closed and UDP datagrams dropped by the forwarder (reason: port, agent or source, a cap; wake_cap, too many held for a waking VM; wake_timeout, its VM did not wake in time; asleep, a UDP datagram to a sleeping VM, which asked for its wake)",
            smolvm_kit::ops::Declared(refused.clone()),
        );
        let idle_closed = Family::<ProtocolLabel, Counter>::default();
        registry.register(
            "forward_idle_closed",
            "Forwarded TCP connections closed after the idle timeout without a byte either way",
            smolvm_kit::ops::Declared(idle_closed.clone()),
        );
        let held = Counter::default();
        registry.register(
            "forward_held_connections",
            "TCP connections to a VM suspended for idleness held while it wakes",
            held.clone(),
        );
        let hold = Histogram::new(WAKE_BUCKETS);
        registry.register(
            "forward_hold_duration_seconds",
            "Time a held connection waited from its arrival until the woken VM's port answered",
            hold.clone(),
        );
        Self {
            connections,
            bytes,
            open,
            refused,
            idle_closed,
            held,
            hold,
        }
    }
}

/// The guest boot check's metrics: the last result, boot times, checks by result.
#[derive(Debug)]
struct BootChecks {
    guest_bootable: Gauge,
    boot: Histogram,
    checks: Family<ResultLabel, Counter>,
}

impl BootChecks {
    fn register(registry: &mut Registry) -> Self {
        let guest_bootable = Gauge::default();
        registry.register(
            "guest_bootable",
            "Result of the last guest boot check: 1 a canary guest booted, 0 none did, -1 no check finished yet",
            guest_bootable.clone(),
        );
        guest_bootable.set(-1);
        let boot = Histogram::new(CANARY_BUCKETS);
        registry.register(
            "canary_boot_duration_seconds",
            "Time a canary guest took to boot, of the guest boot checks where one booted",
            boot.clone(),
        );
        let checks = Family::<ResultLabel, Counter>::default();
        registry.register(
            "canary_checks",
            "Guest boot checks run, by result (Booted, or the cause: DeviceNotAccessible, HostCannotRunGuest, Timeout, InternalError)",
            smolvm_kit::ops::Declared(checks.clone()),
        );
        Self {
            guest_bootable,
            boot,
            checks,
        }
    }
}

/// All metrics of one agent.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Requests,
    smolvm_restarts: Counter,
    runtime_ready: Gauge,
    forwards: Forwards,
    node_api_closed: Family<ReasonLabel, Counter>,
    serving_cert_loaded: AtomicBool,
    boot_checks: BootChecks,
    suspensions: Suspensions,
    releases: Releases,
}

impl Default for Metrics {
    /// Every metric registered, in the order the exposition lists them.
    fn default() -> Self {
        let mut registry = Registry::with_prefix("smolvm_runtime");
        let requests = Requests::register(&mut registry);
        let smolvm_restarts = Counter::default();
        registry.register(
            "smolvm_restarts",
            "Restarts of the supervised smolvm serve after it exited or stopped answering (the first start is not counted)",
            smolvm_restarts.clone(),
        );
        let forwards = Forwards::register(&mut registry);
        let node_api_closed = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "node_api_connections_closed",
            "Node API connections closed by a bound of the listener before any request: at once when the open connections or the TLS handshakes in progress are at their cap, in all (reason connections, handshakes) or from one source address (source_connections, source_handshakes), or when a handshake did not finish in time (handshake_timeout)",
            smolvm_kit::ops::Declared(node_api_closed.clone()),
        );
        let boot_checks = BootChecks::register(&mut registry);
        let runtime_ready = Gauge::default();
        registry.register(
            "smolvm_ready",
            "1 while the supervised smolvm serve answers its health check (the RuntimeReady condition), 0 while not",
            runtime_ready.clone(),
        );
        Metrics {
            suspensions: Suspensions::register(&mut registry),
            releases: Releases::register(&mut registry),
            registry,
            requests,
            smolvm_restarts,
            runtime_ready,
            forwards,
            node_api_closed,
            serving_cert_loaded: AtomicBool::new(false),
            boot_checks,
        }
    }
}

impl Metrics {
    /// Records one node API request.
    pub fn observe_request(&self, operation: &str, code: &str, elapsed: Duration) {
        self.requests
            .answered
            .get_or_create(&RequestLabels {
                operation: operation.to_string(),
                code: code.to_string(),
            })
            .inc();
        self.requests
            .latency
            .get_or_create(&OperationLabel {
                operation: operation.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one forwarded TCP connection or UDP session (`protocol`: `tcp` or `udp`).
    pub fn inc_forwarded_connections(&self, protocol: &'static str) {
        self.forwards
            .connections
            .get_or_create(&ProtocolLabel { protocol })
            .inc();
    }

    /// Adds bytes carried by the port forwards, both directions.
    pub fn add_forwarded_bytes(&self, protocol: &'static str, bytes: u64) {
        self.forwards
            .bytes
            .get_or_create(&ProtocolLabel { protocol })
            .inc_by(bytes);
    }

    /// Sets how many port forwards are open.
    pub fn set_open_forwards(&self, n: u64) {
        self.forwards.open.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts one connection (TCP) or datagram (UDP) refused by a cap of the forwarder.
    pub fn inc_forward_refused(&self, protocol: &'static str, reason: &'static str) {
        self.forwards
            .refused
            .get_or_create(&RefusedLabels { protocol, reason })
            .inc();
    }

    /// Counts one connection held while its machine wakes.
    pub fn inc_wake_held(&self) {
        self.forwards.held.inc();
    }

    /// Records how long a held connection waited for its machine to wake.
    pub fn observe_wake_hold(&self, elapsed: Duration) {
        self.forwards.hold.observe(elapsed.as_secs_f64());
    }

    /// Refusals counted by [`Metrics::inc_forward_refused`].
    pub fn forward_refused(&self, protocol: &'static str, reason: &'static str) -> u64 {
        self.forwards
            .refused
            .get(&RefusedLabels { protocol, reason })
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// Counts one forwarded connection closed for idleness.
    pub fn inc_forward_idle_closed(&self, protocol: &'static str) {
        self.forwards
            .idle_closed
            .get_or_create(&ProtocolLabel { protocol })
            .inc();
    }

    /// Idle closures counted by [`Metrics::inc_forward_idle_closed`].
    pub fn forward_idle_closed(&self, protocol: &'static str) -> u64 {
        self.forwards
            .idle_closed
            .get(&ProtocolLabel { protocol })
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// Counts one node API connection closed by a bound of its listener (`reason`: see
    /// [`smolvm_kit::accept::Closed::as_str`]).
    pub fn inc_node_api_closed(&self, reason: &'static str) {
        self.node_api_closed.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Closures counted by [`Metrics::inc_node_api_closed`].
    pub fn node_api_closed(&self, reason: &'static str) -> u64 {
        self.node_api_closed.get(&ReasonLabel { reason }).map_or(0, |c| c.get())
    }

    /// Counts one restart of `smolvm serve`.
    pub fn inc_smolvm_restarts(&self) {
        self.smolvm_restarts.inc();
    }

    /// Restarts of `smolvm serve` so far.
    pub fn smolvm_restarts(&self) -> u64 {
        self.smolvm_restarts.get()
    }

    /// Records a finished guest boot check: whether a guest booted, how long it took, and the
    /// result label (`Booted` or the cause).
    pub fn observe_canary(&self, booted: bool, boot_time: Option<Duration>, result: &'static str) {
        self.boot_checks.guest_bootable.set(i64::from(booted));
        if let Some(time) = boot_time {
            self.boot_checks.boot.observe(time.as_secs_f64());
        }
        self.boot_checks.checks.get_or_create(&ResultLabel { result }).inc();
    }

    /// Guest boot checks counted with a result.
    pub fn canary_checks(&self, result: &'static str) -> u64 {
        self.boot_checks
            .checks
            .get(&ResultLabel { result })
            .map_or(0, |c| c.get())
    }

    /// Records a suspend that succeeded: the time smolvm took to pause the machine.
    pub fn observe_suspend(&self, elapsed: Duration) {
        self.suspensions.suspend.observe(elapsed.as_secs_f64());
    }

    /// Records a resume that succeeded: the time smolvm took to resume the machine.
    pub fn observe_resume(&self, elapsed: Duration) {
        self.suspensions.resume.observe(elapsed.as_secs_f64());
    }

    /// Sets how many machines on this node are suspended.
    pub fn set_machines_suspended(&self, n: usize) {
        self.suspensions.suspended.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts one call of the release hook by its result (`Released`, `NoMatch`,
    /// `Unauthenticated`, `Failed`).
    pub fn inc_volume_release(&self, result: &'static str) {
        self.releases.results.get_or_create(&ResultLabel { result }).inc();
    }

    /// Calls of the release hook counted with `result`.
    pub fn volume_releases(&self, result: &'static str) -> u64 {
        self.releases
            .results
            .get(&ResultLabel { result })
            .map_or(0, |c| c.get())
    }

    /// Counts one machine the release hook stopped.
    pub fn inc_volume_release_stop(&self) {
        self.releases.stops.inc();
    }

    /// Machines the release hook stopped so far.
    pub fn volume_release_stops(&self) -> u64 {
        self.releases.stops.get()
    }

    /// Records how long a release that held a machine took.
    pub fn observe_volume_release(&self, elapsed: Duration) {
        self.releases.duration.observe(elapsed.as_secs_f64());
    }

    /// Sets the runtime-ready gauge.
    pub fn set_runtime_ready(&self, ready: bool) {
        self.runtime_ready.set(i64::from(ready));
    }

    /// Sets whether a serving certificate is loaded.
    pub fn set_serving_cert_loaded(&self, loaded: bool) {
        self.serving_cert_loaded.store(loaded, Ordering::Relaxed);
    }

    /// Whether a serving certificate is loaded.
    pub fn serving_cert_loaded(&self) -> bool {
        self.serving_cert_loaded.load(Ordering::Relaxed)
    }

    /// Requests counted for an operation and code.
    pub fn request_count(&self, operation: &str, code: &str) -> u64 {
        self.requests
            .answered
            .get(&RequestLabels {
                operation: operation.to_string(),
                code: code.to_string(),
            })
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        smolvm_kit::ops::encode_metrics(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let metrics = Metrics::default();
        metrics.observe_request("GetMachine", "OK", Duration::from_micros(700));
        metrics.observe_request("GetMachine", "MachineNotFound", Duration::from_millis(20));
        metrics.inc_smolvm_restarts();
        metrics.set_runtime_ready(true);
        metrics.inc_forward_refused("tcp", "port");
        metrics.inc_forward_idle_closed("tcp");
        metrics.inc_node_api_closed("connections");
        metrics.observe_suspend(Duration::from_millis(1500));
        metrics.observe_resume(Duration::from_millis(300));
        metrics.set_machines_suspended(2);
        metrics.inc_volume_release("Released");
        metrics.inc_volume_release_stop();
        metrics.observe_volume_release(Duration::from_millis(800));
        let text = metrics.encode();
        for line in [
            "smolvm_runtime_node_api_requests_total{operation=\"GetMachine\",code=\"OK\"} 1",
            "smolvm_runtime_node_api_requests_total{operation=\"GetMachine\",code=\"MachineNotFound\"} 1",
            "smolvm_runtime_node_api_request_duration_seconds_bucket{le=\"0.0005\",operation=\"GetMachine\"} 0",
            "smolvm_runtime_node_api_request_duration_seconds_bucket{le=\"0.001\",operation=\"GetMachine\"} 1",
            "smolvm_runtime_node_api_request_duration_seconds_bucket{le=\"0.025\",operation=\"GetMachine\"} 2",
            "smolvm_runtime_node_api_request_duration_seconds_count{operation=\"GetMachine\"} 2",
            "smolvm_runtime_smolvm_restarts_total 1",
            "smolvm_runtime_smolvm_ready 1",
            "smolvm_runtime_forward_refused_total{protocol=\"tcp\",reason=\"port\"} 1",
            "smolvm_runtime_forward_idle_closed_total{protocol=\"tcp\"} 1",
            "smolvm_runtime_node_api_connections_closed_total{reason=\"connections\"} 1",
            "smolvm_runtime_suspend_duration_seconds_bucket{le=\"1.0\"} 0",
            "smolvm_runtime_suspend_duration_seconds_bucket{le=\"2.5\"} 1",
            "smolvm_runtime_suspend_duration_seconds_count 1",
            "smolvm_runtime_resume_duration_seconds_bucket{le=\"0.5\"} 1",
            "smolvm_runtime_resume_duration_seconds_count 1",
            "smolvm_runtime_machines_suspended 2",
            "smolvm_runtime_volume_releases_total{result=\"Released\"} 1",
            "smolvm_runtime_volume_release_stops_total 1",
            "smolvm_runtime_volume_release_duration_seconds_bucket{le=\"1.0\"} 1",
            "smolvm_runtime_volume_release_duration_seconds_count 1",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert_eq!(metrics.request_count("GetMachine", "OK"), 1);
        assert_eq!(metrics.request_count("GetMachine", "Nope"), 0);
    }
}
