//! Benchmark-only load generator for `webhook/bench/run.sh`.
//!
//! - `gen DIR`: writes a test CA, a serving pair for the Service name and `localhost`, and a
//!   realistic ~1.8 KB AdmissionReview (`review.json`).
//! - `run`: keep-alive TLS load over HTTP/1.1 or HTTP/2 with N connections, either closed-loop
//!   (`--rate 0`: as fast as the server answers) or open-loop at a fixed offered rate, then prints
//!   reviews/s and p50/p99/p99.9 latency. Latency is measured from the moment a request is sent
//!   (tokio's timer has 1 ms granularity, so the schedule itself is not used as the start; at the
//!   offered rates used the interval per connection is far above the latency, so requests do not
//!   queue behind each other). Every non-200 answer counts as an error.
//!
//! It verifies the server certificate against the generated CA, like every client here.

use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use serde_json::json;
use smolvm_webhook::client::{self, Version};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write ca.crt, tls.crt, tls.key and review.json into DIR.
    Gen { dir: PathBuf },
    /// Generate load.
    Run {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long)]
        path: String,
        /// 1 or 2.
        #[arg(long, default_value_t = 1)]
        http: u8,
        #[arg(long, default_value_t = 16)]
        connections: usize,
        /// Offered reviews/s across all connections; 0 means closed loop (maximum throughput).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 2)]
        warmup_seconds: u64,
        #[arg(long)]
        ca: PathBuf,
        #[arg(long)]
        body: PathBuf,
        #[arg(long, default_value = "localhost")]
        server_name: String,
        /// A label printed with the results.
        #[arg(long, default_value = "")]
        label: String,
    },
}

/// A realistic SmolVM CREATE review, as `kubectl apply` makes the API server send it.
fn review_json() -> serde_json::Value {
    let mut object = smolvm_api::fixtures::alpine();
    let applied = serde_json::to_string(&object).unwrap_or_default();
    object["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/last-applied-configuration": applied});
    object["metadata"]["creationTimestamp"] = json!("2026-11-22T00:00:00Z");
    object["metadata"]["generation"] = json!(1);
    object["metadata"]["managedFields"] = json!([{
        "apiVersion": "vm.smolvm.dev/v1alpha1", "fieldsType": "FieldsV1", "manager": "kubectl-client-side-apply",
        "operation": "Update", "time": "2026-11-22T00:00:00Z",
        "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}},
                     "f:spec": {".": {}, "f:image": {}, "f:network": {".": {}, "f:enabled": {}, "f:ports": {}}, "f:nodeSelector": {}, "f:resources": {}, "f:running": {}, "f:storage": {}}}
    }]);
    let gvk = json!({"group": "vm.smolvm.dev", "version": "v1alpha1", "kind": "SmolVM"});
    let gvr = json!({"group": "vm.smolvm.dev", "version": "v1alpha1", "resource": "smolvms"});
    json!({
        "kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": "alpine", "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": "alice@example.com", "uid": "f3a1c2d4-0000-4000-8000-000000000001", "groups": ["system:authenticated"]},
            "object": object, "oldObject": null, "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

fn generate(dir: &std::path::Path) -> Result<(), String> {
    let year = Duration::from_secs(365 * 86_400);
    let ca =
        smolvm_certs::CertificateAuthority::generate("smolvm-webhook-bench-ca", year).map_err(|e| e.to_string())?;
    let mut names = smolvm_certs::webhook_service_dns_names("smolvm-webhook", "smolvm-system");
    names.push("localhost".into());
    let leaf = ca.issue_server(&names, &[], year).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let body = serde_json::to_vec(&review_json()).map_err(|e| e.to_string())?;
    for (name, content) in [
        ("ca.crt", ca.cert_pem().as_bytes()),
        ("tls.crt", leaf.cert_pem.as_bytes()),
        ("tls.key", leaf.key_pem.as_bytes()),
        ("review.json", body.as_slice()),
    ] {
        std::fs::write(dir.join(name), content).map_err(|e| format!("{name}: {e}"))?;
    }
    println!("wrote {} (review.json: {} bytes)", dir.display(), body.len());
    Ok(())
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)] as f64 / 1000.0
}

#[allow(clippy::too_many_arguments)]
async fn run(
    addr: SocketAddr,
    path: String,
    version: Version,
    connections: usize,
    rate: u64,
    seconds: u64,
    warmup: u64,
    ca: PathBuf,
    body: PathBuf,
    server_name: String,
    label: String,
) -> Result<(), String> {
    let ca_pem = std::fs::read_to_string(&ca).map_err(|e| e.to_string())?;
    let body = Bytes::from(std::fs::read(&body).map_err(|e| e.to_string())?);
    let config = client::tls_config(&ca_pem, version).map_err(|e| e.to_string())?;
    let start = Instant::now() + Duration::from_millis(200);
    let measure_from = start + Duration::from_secs(warmup);
    let end = measure_from + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for i in 0..connections.max(1) {
        let mut conn = client::connect(addr, &server_name, config.clone(), version)
            .await
            .map_err(|e| e.to_string())?;
        let (path, body) = (path.clone(), body.clone());
        let interval = if rate == 0 {
            None
        } else {
            Some(Duration::from_secs_f64(connections as f64 / rate as f64))
        };
        tasks.push(tokio::spawn(async move {
            let mut latencies: Vec<u64> = Vec::with_capacity(1 << 16);
            let mut errors = 0u64;
            // Spread the connections' schedules over one interval.
            let mut next = match interval {
                Some(iv) => start + iv.mul_f64(i as f64 / connections as f64),
                None => start,
            };
            tokio::time::sleep_until(next.into()).await;
            loop {
                if let Some(iv) = interval {
                    tokio::time::sleep_until(next.into()).await;
                    next += iv;
                }
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let ok = matches!(conn.post_json(&path, body.clone()).await, Ok((200, _)));
                let done = Instant::now();
                if sent >= measure_from {
                    if ok {
                        latencies.push(done.duration_since(sent).as_micros() as u64);
                    } else {
                        errors += 1;
                    }
                }
            }
            (latencies, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.map_err(|e| e.to_string())?;
        all.extend(l);
        errors += e;
    }
    all.sort_unstable();
    let throughput = all.len() as f64 / seconds as f64;
    println!(
        "{label:<28} http/{} conns={connections:<3} offered={:<6} reviews/s={throughput:>9.0} p50={:.3}ms p99={:.3}ms p99.9={:.3}ms errors={errors}",
        if version == Version::Http2 { "2  " } else { "1.1" },
        if rate == 0 { "max".to_string() } else { rate.to_string() },
        percentile(&all, 0.50),
        percentile(&all, 0.99),
        percentile(&all, 0.999),
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let result = match args.command {
        Command::Gen { dir } => generate(&dir),
        Command::Run {
            addr,
            path,
            http,
            connections,
            rate,
            seconds,
            warmup_seconds,
            ca,
            body,
            server_name,
            label,
        } => {
            let version = if http == 2 { Version::Http2 } else { Version::Http1 };
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
                .and_then(|rt| {
                    rt.block_on(run(
                        addr,
                        path,
                        version,
                        connections,
                        rate,
                        seconds,
                        warmup_seconds,
                        ca,
                        body,
                        server_name,
                        label,
                    ))
                })
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("webhook-bench-load: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
