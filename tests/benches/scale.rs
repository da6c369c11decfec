//! `make bench-e2e`: 1,000 SmolVMs placed on 50 simulated nodes, then 10,000, on a real
//! kube-apiserver with the real webhook and controller (separate processes, as in e2e).
//!
//! TEST DOUBLE: each simulated node is the runtime agent's real node API server (mTLS, bearer
//! token, the same router) backed by testkit's `MemoryVmm`, an in-memory machine table standing
//! in for `smolvm serve`. It is used only here: fifty real smolvm servers cannot run on one machine, and
//! guests cannot boot on these machines anyway.
//!
//! Prints: the time until every VM is bound and created (phase Running, seen by a watch), API writes per VM
//! (from kube-apiserver's own request counters), the controller's peak RSS at 1,000 and at
//! 10,000 VMs, and its RSS over each stage (sampled every 5 s). Figures are printed, never
//! asserted. Environment: SCALE_NODES (50), SCALE_FIRST (1000), SCALE_TOTAL (10000; 0 skips the
//! second stage), SCALE_CONCURRENCY (32).

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::anyhow;
use futures::{StreamExt, stream};
use kube::{
    Api,
    api::PostParams,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use smolvm_api::{SmolVM, constants};
use smolvm_tests::{
    assets,
    simnodes::{self, RssSamples, api_requests as writes, env_usize, peak_rss_mib},
};

/// How often the controller's RSS is sampled for its line over time.
const RSS_EVERY: Duration = Duration::from_secs(5);

fn main() -> anyhow::Result<()> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(2);
    assets::bench_main("scale", runtime, run)
}

async fn run(assets: assets::Assets) -> anyhow::Result<()> {
    let nodes_n = env_usize("SCALE_NODES", 50);
    let first = env_usize("SCALE_FIRST", 1000);
    let total = env_usize("SCALE_TOTAL", 10_000);
    let concurrency = env_usize("SCALE_CONCURRENCY", 32);
    let plane = simnodes::control_plane(&assets, "scale").await?;
    let (admin, controller_pid) = (plane.admin.clone(), plane.controller_pid);

    // Simulated nodes (testkit's MemoryVmm behind the real node API) and their heartbeats.
    let sim = simnodes::start(&admin, "sim-node", nodes_n).await?;
    simnodes::heartbeat(&admin, &sim.nodes).await;
    let sim = Arc::new(sim);
    let beat = tokio::spawn({
        let (admin, sim) = (admin.clone(), sim.clone());
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(20)).await;
                simnodes::heartbeat(&admin, &sim.nodes).await;
            }
        }
    });
    // Let the controller's node cache see the nodes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "scale: {nodes_n} simulated nodes up; controller idle: {}",
        peak_rss_mib(controller_pid)
    );

    let vms: Api<SmolVM> = Api::namespaced(admin.clone(), "default");
    let (running, watch) = watch_running(vms.clone());
    // The controller's RSS over time, printed after each stage.
    let (rss, sampler) = RssSamples::start(controller_pid, RSS_EVERY);
    rss.take_line();
    let mut created = 0usize;
    for target in [first, total] {
        if target <= created {
            continue;
        }
        let before = writes(&admin).await?;
        let started = Instant::now();
        let failures = stream::iter(created..target)
            .map(|i| {
                let vms = vms.clone();
                async move {
                    let vm: SmolVM = serde_json::from_value(json!({
                        "apiVersion": constants::API_VERSION, "kind": "SmolVM",
                        "metadata": {"name": format!("scale-{i:05}")},
                        "spec": {"image": "alpine:3.20", "resources": {"cpus": 1, "memoryMiB": 128},
                                 "storage": {"storageGiB": 1, "overlayGiB": 1}},
                    }))?;
                    vms.create(&PostParams::default(), &vm)
                        .await
                        .map(|_| ())
                        .map_err(anyhow::Error::from)
                }
            })
            .buffer_unordered(concurrency)
            .filter_map(|r| async move { r.err() })
            .collect::<Vec<_>>()
            .await;
        if let Some(e) = failures.first() {
            return Err(anyhow!("{} creates failed; first: {e:#}", failures.len()));
        }
        let created_in = started.elapsed();
        let new = target - created;
        created = target;
        loop {
            let done = running.lock().unwrap_or_else(|e| e.into_inner()).len();
            if done >= created {
                break;
            }
            if started.elapsed() > Duration::from_secs(1800) {
                return Err(anyhow!("only {done}/{created} VMs Running after 30 min"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let all_done = started.elapsed();
        let after = writes(&admin).await?;
        let delta = |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
        let object_writes = delta("smolvms") - new as f64; // minus the benchmark's own creates
        let status_writes = delta("smolvms/status");
        let events = delta("events");
        println!(
            "scale: {new} new VMs ({created} in all) on {nodes_n} nodes: created in {:.1}s; all bound, created and Running after {:.1}s",
            created_in.as_secs_f64(),
            all_done.as_secs_f64()
        );
        println!(
            "scale:   API writes per VM by the operator (2xx): {:.2} (smolvms {:.2} + smolvms/status {:.2}); events writes per VM {:.2}",
            (object_writes + status_writes) / new as f64,
            object_writes / new as f64,
            status_writes / new as f64,
            events / new as f64
        );
        let mut breakdown: Vec<String> = after
            .keys()
            .filter(|k| (k.starts_with("smolvms") || k.starts_with("events")) && k.contains(' '))
            .map(|k| (k, delta(k)))
            .filter(|(_, d)| *d > 0.0)
            .map(|(k, d)| format!("{k}: {d:.0}"))
            .collect();
        breakdown.sort();
        println!("scale:   by verb and code: {}", breakdown.join(", "));
        println!("scale:   controller at {created} VMs: {}", peak_rss_mib(controller_pid));
        println!(
            "scale:   controller RSS over this stage (MiB, every {} s): {}",
            RSS_EVERY.as_secs(),
            rss.take_line()
        );
    }
    sampler.abort();
    watch.abort();
    beat.abort();
    drop(sim);
    drop(plane);
    Ok(())
}

/// The names of the VMs seen Running with a machine, kept from a watch. The benchmark waits on
/// this set: a list of every VM twice a second (as it once did) made the API server serialise up
/// to 10,000 objects each time, a load it added to the very phase it measured.
fn watch_running(vms: Api<SmolVM>) -> (Arc<Mutex<HashSet<String>>>, tokio::task::JoinHandle<()>) {
    let running = Arc::new(Mutex::new(HashSet::new()));
    let task = tokio::spawn({
        let running = running.clone();
        async move {
            let events = watcher(vms, watcher::Config::default()).default_backoff();
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                let mut set = running.lock().unwrap_or_else(|e| e.into_inner());
                match event {
                    Ok(watcher::Event::Apply(vm) | watcher::Event::InitApply(vm)) => {
                        let name = vm.metadata.name.clone().unwrap_or_default();
                        let is_running = vm.status.as_ref().is_some_and(|s| {
                            s.machine_name.is_some() && s.phase.as_ref().is_some_and(|p| format!("{p:?}") == "Running")
                        });
                        if is_running {
                            set.insert(name);
                        } else {
                            set.remove(&name);
                        }
                    }
                    Ok(watcher::Event::Delete(vm)) => {
                        set.remove(&vm.metadata.name.clone().unwrap_or_default());
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                    Err(error) => println!("scale: watch error (retried): {error}"),
                }
            }
        }
    });
    (running, task)
}
