//! `make bench-pool`: warm pools at scale. 20 simulated nodes keep 50 slots each of one
//! SmolVMPool; 1,000 SmolVMs naming the pool are created 20 at a time, on a real kube-apiserver
//! with the real webhook and controller (separate processes, as in e2e).
//!
//! TEST DOUBLE: the simulated nodes of `smolvm_tests::simnodes` (the runtime's real node API
//! over testkit's `MemoryVmm`, whose pools and leases stand in for smolvm's and refill at once).
//!
//! Prints: creation→Running p50 and p99 (from the answer to each create to the moment a watch sees
//! the SmolVM Running), how many were served warm, SmolVM writes and events per claim by the
//! operator (kube-apiserver's own request counters), the refill time (from the last claim Running
//! until the pool's status counts every slot ready again), and the controller's peak RSS.
//! Figures are printed, never asserted. Environment: POOL_NODES (20), POOL_SLOTS (50),
//! POOL_CLAIMS (1000), POOL_CONCURRENCY (20).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::anyhow;
use futures::{StreamExt, TryStreamExt, stream};
use kube::{
    Api,
    api::PostParams,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use smolvm_api::{Phase, SmolVM, SmolVMPool, constants};
use smolvm_tests::{
    assets,
    simnodes::{self, api_writes, env_usize, peak_rss_mib},
};

fn main() -> anyhow::Result<()> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(2);
    assets::bench_main("pool", runtime, run)
}

/// The value at `q` (0..=1) of sorted `values`, in milliseconds.
fn percentile(values: &[Duration], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let index = ((values.len() as f64 - 1.0) * q).round() as usize;
    values[index.min(values.len() - 1)].as_secs_f64() * 1000.0
}

async fn run(assets: assets::Assets) -> anyhow::Result<()> {
    let nodes_n = env_usize("POOL_NODES", 20);
    let slots = env_usize("POOL_SLOTS", 50);
    let claims = env_usize("POOL_CLAIMS", 1000);
    let concurrency = env_usize("POOL_CONCURRENCY", 20);
    let plane = simnodes::control_plane(&assets, "pool").await?;
    let (admin, controller_pid) = (plane.admin.clone(), plane.controller_pid);

    // The simulated nodes report their pools every second, as agents report within seconds.
    let sim = Arc::new(simnodes::start(&admin, "pool-node", nodes_n).await?);
    simnodes::heartbeat(&admin, &sim.nodes).await;
    let beat = tokio::spawn({
        let (admin, sim) = (admin.clone(), sim.clone());
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                simnodes::heartbeat(&admin, &sim.nodes).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;

    let pools: Api<SmolVMPool> = Api::namespaced(admin.clone(), "default");
    let pool: SmolVMPool = serde_json::from_value(json!({
        "apiVersion": constants::API_VERSION, "kind": "SmolVMPool",
        "metadata": {"name": "bench"},
        "spec": {"slotsPerNode": slots, "whenEmpty": "Cold",
                 "template": {"image": "alpine:3.20", "resources": {"cpus": 1, "memoryMiB": 128},
                              "storage": {"storageGiB": 1, "overlayGiB": 1}}},
    }))?;
    // The webhook's pool cache and the controller's pass follow within moments.
    let started = Instant::now();
    pools.create(&PostParams::default(), &pool).await?;
    let total = (nodes_n * slots) as i32;
    let ready_slots = || async { Ok::<_, anyhow::Error>(pools.get("bench").await?.status.and_then(|s| s.ready_slots)) };
    while ready_slots().await? != Some(total) {
        if started.elapsed() > Duration::from_secs(300) {
            return Err(anyhow!("the pool's {total} slots not ready after 5 minutes"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "pool: {nodes_n} nodes x {slots} slots ready {:.1}s after the pool was created; controller: {}",
        started.elapsed().as_secs_f64(),
        peak_rss_mib(controller_pid)
    );

    // A watch notes when each SmolVM is first seen Running.
    let vms: Api<SmolVM> = Api::namespaced(admin.clone(), "default");
    let running: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch = tokio::spawn({
        let (vms, running) = (vms.clone(), running.clone());
        async move {
            let mut events = watcher(vms, watcher::Config::default()).applied_objects().boxed();
            while let Ok(Some(vm)) = events.try_next().await {
                if vm.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running) {
                    let name = vm.metadata.name.clone().unwrap_or_default();
                    running
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(name)
                        .or_insert_with(Instant::now);
                }
            }
        }
    });

    let before = api_writes(&admin).await?;
    let started = Instant::now();
    let created: Vec<anyhow::Result<(String, Instant)>> = stream::iter(0..claims)
        .map(|i| {
            let vms = vms.clone();
            async move {
                let name = format!("claim-{i:05}");
                let vm: SmolVM = serde_json::from_value(json!({
                    "apiVersion": constants::API_VERSION, "kind": "SmolVM",
                    "metadata": {"name": name},
                    "spec": {"poolRef": {"name": "bench"}, "env": [{"name": "JOB", "value": i.to_string()}]},
                }))?;
                vms.create(&PostParams::default(), &vm).await?;
                Ok((name, Instant::now()))
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let created: HashMap<String, Instant> = created.into_iter().collect::<anyhow::Result<_>>()?;
    loop {
        let done = running.lock().unwrap_or_else(|e| e.into_inner()).len();
        if done >= claims {
            break;
        }
        if started.elapsed() > Duration::from_secs(1800) {
            return Err(anyhow!("only {done}/{claims} claims Running after 30 min"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_running = Instant::now();
    let peak_at_claims = peak_rss_mib(controller_pid);
    let after = api_writes(&admin).await?;
    let mut latencies: Vec<Duration> = {
        let running = running.lock().unwrap_or_else(|e| e.into_inner());
        created
            .iter()
            .filter_map(|(name, at)| running.get(name).map(|r| r.saturating_duration_since(*at)))
            .collect()
    };
    latencies.sort();
    let warm: u32 = sim
        .nodes
        .iter()
        .flat_map(|n| n.vmm.pool_counts())
        .map(|(_, _, _, active)| active)
        .sum();
    let delta = |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let per = |v: f64| v / claims as f64;
    let object_writes = delta("smolvms") - claims as f64; // minus the benchmark's own creates
    let status_writes = delta("smolvms/status");
    println!(
        "pool: {claims} claims, {concurrency} at a time: all Running after {:.1}s; served warm {warm}, cold {}",
        all_running.duration_since(started).as_secs_f64(),
        claims as u32 - warm.min(claims as u32)
    );
    println!(
        "pool:   creation->Running p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (target p99 <= 100 ms)",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0)
    );
    println!(
        "pool:   SmolVM writes per claim by the operator (2xx): {:.2} (smolvms {:.2} + smolvms/status {:.2}; target <= 3); events per claim {:.2}",
        per(object_writes + status_writes),
        per(object_writes),
        per(status_writes),
        per(delta("events"))
    );
    while ready_slots().await? != Some(total) {
        if all_running.elapsed() > Duration::from_secs(300) {
            return Err(anyhow!("the pool not refilled after 5 minutes"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "pool:   refill: every slot ready again {:.1}s after the last claim ran (smolvm's refill is instant in the double: this is the report and the controller's pass)",
        all_running.elapsed().as_secs_f64()
    );
    println!("pool:   controller at {claims} claims: {peak_at_claims} (target <= 100 MiB)");
    watch.abort();
    beat.abort();
    drop(sim);
    drop(plane);
    Ok(())
}
