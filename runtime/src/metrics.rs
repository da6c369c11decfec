//! Prometheus metrics of the agent, rendered by hand in the text exposition format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the request latency histogram.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0, 60.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// All metrics of one agent.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
    smolvm_restarts: AtomicU64,
    runtime_ready: AtomicBool,
    serving_cert_loaded: AtomicBool,
    forwarded_connections: Mutex<BTreeMap<&'static str, u64>>,
    forwarded_bytes: Mutex<BTreeMap<&'static str, u64>>,
    open_forwards: AtomicU64,
}

impl Metrics {
    /// Records one node API request.
    pub fn observe_request(&self, operation: &str, code: &str, elapsed: Duration) {
        if let Ok(mut requests) = self.requests.lock() {
            *requests.entry((operation.to_string(), code.to_string())).or_default() += 1;
        }
        if let Ok(mut latency) = self.latency.lock() {
            let histogram = latency.entry(operation.to_string()).or_default();
            let seconds = elapsed.as_secs_f64();
            for (bucket, bound) in histogram.buckets.iter_mut().zip(LATENCY_BUCKETS) {
                if seconds <= bound {
                    *bucket += 1;
                }
            }
            histogram.count += 1;
            histogram.sum += seconds;
        }
    }

    /// Counts one forwarded TCP connection or UDP session (`protocol`: `tcp` or `udp`).
    pub fn inc_forwarded_connections(&self, protocol: &'static str) {
        if let Ok(mut map) = self.forwarded_connections.lock() {
            *map.entry(protocol).or_default() += 1;
        }
    }

    /// Adds bytes carried by the port forwards, both directions.
    pub fn add_forwarded_bytes(&self, protocol: &'static str, bytes: u64) {
        if let Ok(mut map) = self.forwarded_bytes.lock() {
            *map.entry(protocol).or_default() += bytes;
        }
    }

    /// Sets how many port forwards are open.
    pub fn set_open_forwards(&self, n: u64) {
        self.open_forwards.store(n, Ordering::Relaxed);
    }

    /// Counts one restart of `smolvm serve`.
    pub fn inc_smolvm_restarts(&self) {
        self.smolvm_restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Restarts of `smolvm serve` so far.
    pub fn smolvm_restarts(&self) -> u64 {
        self.smolvm_restarts.load(Ordering::Relaxed)
    }

    /// Sets the runtime-ready gauge.
    pub fn set_runtime_ready(&self, ready: bool) {
        self.runtime_ready.store(ready, Ordering::Relaxed);
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
            .lock()
            .ok()
            .and_then(|r| r.get(&(operation.to_string(), code.to_string())).copied())
            .unwrap_or(0)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP smolvm_runtime_node_api_requests_total Node API requests by operation and code.\n");
        out.push_str("# TYPE smolvm_runtime_node_api_requests_total counter\n");
        if let Ok(requests) = self.requests.lock() {
            for ((op, code), n) in requests.iter() {
                let _ = writeln!(
                    out,
                    "smolvm_runtime_node_api_requests_total{{operation=\"{op}\",code=\"{code}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP smolvm_runtime_node_api_request_duration_seconds Node API request latency.\n");
        out.push_str("# TYPE smolvm_runtime_node_api_request_duration_seconds histogram\n");
        if let Ok(latency) = self.latency.lock() {
            for (op, h) in latency.iter() {
                for (bound, n) in LATENCY_BUCKETS.iter().zip(h.buckets) {
                    let _ = writeln!(
                        out,
                        "smolvm_runtime_node_api_request_duration_seconds_bucket{{operation=\"{op}\",le=\"{bound}\"}} {n}"
                    );
                }
                let _ = writeln!(
                    out,
                    "smolvm_runtime_node_api_request_duration_seconds_bucket{{operation=\"{op}\",le=\"+Inf\"}} {}",
                    h.count
                );
                let _ = writeln!(
                    out,
                    "smolvm_runtime_node_api_request_duration_seconds_sum{{operation=\"{op}\"}} {}",
                    h.sum
                );
                let _ = writeln!(
                    out,
                    "smolvm_runtime_node_api_request_duration_seconds_count{{operation=\"{op}\"}} {}",
                    h.count
                );
            }
        }
        out.push_str("# HELP smolvm_runtime_smolvm_restarts_total Restarts of the supervised smolvm serve.\n");
        out.push_str("# TYPE smolvm_runtime_smolvm_restarts_total counter\n");
        let _ = writeln!(out, "smolvm_runtime_smolvm_restarts_total {}", self.smolvm_restarts());
        out.push_str("# HELP smolvm_runtime_forwarded_connections_total Connections (TCP) and client sessions (UDP) forwarded to published ports.\n");
        out.push_str("# TYPE smolvm_runtime_forwarded_connections_total counter\n");
        if let Ok(map) = self.forwarded_connections.lock() {
            for (protocol, n) in map.iter() {
                let _ = writeln!(
                    out,
                    "smolvm_runtime_forwarded_connections_total{{protocol=\"{protocol}\"}} {n}"
                );
            }
        }
        out.push_str(
            "# HELP smolvm_runtime_forwarded_bytes_total Bytes carried by the port forwards, both directions.\n",
        );
        out.push_str("# TYPE smolvm_runtime_forwarded_bytes_total counter\n");
        if let Ok(map) = self.forwarded_bytes.lock() {
            for (protocol, n) in map.iter() {
                let _ = writeln!(
                    out,
                    "smolvm_runtime_forwarded_bytes_total{{protocol=\"{protocol}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP smolvm_runtime_open_forwards Published ports forwarded from the node's address now.\n");
        out.push_str("# TYPE smolvm_runtime_open_forwards gauge\n");
        let _ = writeln!(
            out,
            "smolvm_runtime_open_forwards {}",
            self.open_forwards.load(Ordering::Relaxed)
        );
        out.push_str("# HELP smolvm_runtime_runtime_ready Whether smolvm serve answers its health check.\n");
        out.push_str("# TYPE smolvm_runtime_runtime_ready gauge\n");
        let _ = writeln!(
            out,
            "smolvm_runtime_runtime_ready {}",
            u8::from(self.runtime_ready.load(Ordering::Relaxed))
        );
        out
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
        let text = metrics.render();
        for line in [
            "smolvm_runtime_node_api_requests_total{operation=\"GetMachine\",code=\"OK\"} 1",
            "smolvm_runtime_node_api_requests_total{operation=\"GetMachine\",code=\"MachineNotFound\"} 1",
            "smolvm_runtime_node_api_request_duration_seconds_bucket{operation=\"GetMachine\",le=\"0.0005\"} 0",
            "smolvm_runtime_node_api_request_duration_seconds_bucket{operation=\"GetMachine\",le=\"0.001\"} 1",
            "smolvm_runtime_node_api_request_duration_seconds_bucket{operation=\"GetMachine\",le=\"0.025\"} 2",
            "smolvm_runtime_node_api_request_duration_seconds_count{operation=\"GetMachine\"} 2",
            "smolvm_runtime_smolvm_restarts_total 1",
            "smolvm_runtime_runtime_ready 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }
}
