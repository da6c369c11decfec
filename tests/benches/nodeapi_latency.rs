//! Added latency of the node API over calling smolvm directly, for GetMachine.
//!
//! `cargo bench -p smolvm-tests --bench nodeapi_latency` (optionally `-- <iterations>`). It lives
//! here, beside the other benchmarks that drive a whole agent, since it needs testkit's agent
//! (testkit depends on the runtime, so the runtime's own benches cannot use it).
//! Starts a real `smolvm serve` under an in-process agent, creates one machine, then times
//! alternately (a) `SmolvmClient::get` straight to smolvm's Unix socket (what the agent does
//! per request) and (b) `GET /v1/machines/{name}` over mTLS + bearer token on a keep-alive
//! HTTP/1.1 connection. Prints p50/p90/p99 of both and the difference. Figures, not asserts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use smolvm_api::nodeapi::Operation;
use smolvm_testkit::node as common;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    common::init();
    // 3,000 under `cargo bench` (it passes `--bench`); 50 when `cargo test` runs the bench once
    // to check that it still works.
    let measuring = std::env::args().any(|a| a == "--bench");
    let iterations: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(if measuring { 3000 } else { 50 });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot build a tokio runtime: {error}");
            std::process::exit(1);
        }
    };
    runtime.block_on(run(iterations));
}

async fn run(iterations: usize) {
    let dir = match tempfile::Builder::new().prefix("smolvm-bench-").tempdir() {
        Ok(dir) => dir,
        Err(error) => {
            eprintln!("cannot create a temp dir: {error}");
            return;
        }
    };
    let pki = Arc::new(common::Pki::new());
    let Some(agent) = common::TestAgent::with_smolvm("nodeapi_latency", dir.path(), pki).await else {
        return;
    };
    let mut client = agent.client().await;
    let spec = serde_json::json!({"image": "localhost:1/none:latest", "cpus": 1, "memoryMiB": 256,
        "storageGiB": 2, "overlayGiB": 1});
    let path = Operation::GetMachine.path("bench1");
    let created = client.call("PUT", &path, Some(spec)).await;
    assert_eq!(created.status, 201, "{created:?}");
    let vmm = agent.agent.vmm().clone();

    for _ in 0..200 {
        let _ = vmm.get("bench1").await;
        let _ = client.call("GET", &path, None).await;
    }
    let mut direct = Vec::with_capacity(iterations);
    let mut via_api = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let machine = vmm.get("bench1").await;
        direct.push(started.elapsed());
        assert!(matches!(machine, Ok(Some(_))));
        let started = Instant::now();
        let answer = client.call("GET", &path, None).await;
        via_api.push(started.elapsed());
        assert_eq!(answer.status, 200);
    }
    direct.sort();
    via_api.sort();
    println!("GetMachine latency over {iterations} alternating calls (release build, one keep-alive mTLS connection)");
    println!("{:<28} {:>10} {:>10} {:>10}", "", "p50 µs", "p90 µs", "p99 µs");
    for (label, samples) in [
        ("smolvm direct (Unix socket)", &direct),
        ("node API (mTLS + token)", &via_api),
    ] {
        println!(
            "{:<28} {:>10.1} {:>10.1} {:>10.1}",
            label,
            micros(percentile(samples, 50.0)),
            micros(percentile(samples, 90.0)),
            micros(percentile(samples, 99.0))
        );
    }
    let added = |p: f64| micros(percentile(&via_api, p)) - micros(percentile(&direct, p));
    println!(
        "{:<28} {:>10.1} {:>10.1} {:>10.1}   (target: added p99 <= 2000 µs)",
        "added by the node API",
        added(50.0),
        added(90.0),
        added(99.0)
    );
    let _ = client.call("DELETE", &path, None).await;
    drop(client);
    agent.agent.shutdown().await;
}
