//! `make bench-pool`: warm pools at scale. 20 simulated nodes keep 50 slots each of one
//! SmolVMPool; 1,000 SmolVMs naming the pool are claimed 20 at a time, on a real kube-apiserver
//! with the real webhook and controller (separate processes, as in e2e). 20 at a time means 20
//! claims in progress: each of 20 clients creates a SmolVM and waits until it runs before it
//! creates the next, as a sandbox user waits for a usable VM (agent-sandbox's "20 in parallel").
//! `POOL_WAIT=0` instead keeps 20 creates in flight without waiting for any to run: the claims then
//! arrive as fast as the API server takes them, and queue behind one another.
//!
//! TEST DOUBLE: the simulated nodes of `smolvm_tests::simnodes` (the runtime's real node API
//! over testkit's `MemoryVmm`, whose pools and leases stand in for smolvm's and refill at once).
//!
//! Prints: creation→Running p50 and p99 (from the answer to each create to the moment a watch sees
//! the SmolVM Running), how many were served warm, SmolVM writes and events per claim by the
//! operator (kube-apiserver's own request counters), the mean time kube-apiserver took for each
//! kind of request the claims made, the refill time (from the last claim Running
//! until the pool's status counts every slot ready again), and the controller's peak RSS.
//! Then the floor (unless POOL_FLOOR=0): the same number of creates, by the same clients, each
//! followed at once by the one status write a warm claim costs, made by the benchmark itself as the
//! controller's identity (the controller stopped): what the API server alone gives, which no
//! operator goes below on this machine.
//! Figures are printed, never asserted. Environment: POOL_NODES (20), POOL_SLOTS (50),
//! POOL_CLAIMS (1000), POOL_CONCURRENCY (20), POOL_WAIT (1), POOL_HEARTBEAT_SECS (10, the
//! agent's default heartbeat interval: the simulated nodes report their pools that often),
//! POOL_QUOTA (0; 1 puts a ResourceQuota naming the product's keys in the namespace first, with
//! limits far above what the run takes, so that the charges are measured and never refuse:
//! `make bench-pool` runs without, then with).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::anyhow;
use futures::{StreamExt, TryStreamExt, stream};
use kube::{
    Api, ResourceExt,
    api::PostParams,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use smolvm_api::{Phase, SmolVM, SmolVMPool, SmolVMStatus, constants};
use smolvm_tests::{
    assets,
    env::{Env, SA_CONTROLLER},
    simnodes::{self, api_request_seconds, api_requests, env_usize, peak_rss_mib},
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

/// From each create's answer (`created`) to its SmolVM first seen Running, sorted.
fn since_created(created: &HashMap<String, Instant>, running: &Mutex<HashMap<String, Instant>>) -> Vec<Duration> {
    let running = running.lock().unwrap_or_else(|e| e.into_inner());
    let mut latencies: Vec<Duration> = created
        .iter()
        .filter_map(|(name, at)| running.get(name).map(|r| r.saturating_duration_since(*at)))
        .collect();
    latencies.sort();
    latencies
}

/// The clients waiting for their SmolVM to run, by name.
type Waiting = Arc<Mutex<HashMap<String, tokio::sync::oneshot::Sender<()>>>>;

/// The benchmark's clients: each makes SmolVMs naming the pool, one after another.
struct Clients<'a> {
    vms: &'a Api<SmolVM>,
    waiting: &'a Waiting,
    /// How many clients.
    concurrency: usize,
    /// Whether each waits for its SmolVM to run before it makes the next.
    wait: bool,
}

/// The floor's status write: the status of a SmolVM the controller served, written as the
/// controller's identity (`api`), with the new SmolVM's own machine name.
struct Floor {
    api: Api<SmolVM>,
    status: SmolVMStatus,
}

impl Clients<'_> {
    /// Makes `claims` SmolVMs named `<prefix>-NNNNN` naming the pool; returns when each create
    /// was answered. With `floor`, each client writes its SmolVM's status itself, at once, as
    /// the controller would after its pass.
    async fn claim(
        &self,
        prefix: &str,
        claims: usize,
        floor: Option<&Floor>,
    ) -> anyhow::Result<HashMap<String, Instant>> {
        let created: Vec<anyhow::Result<(String, Instant)>> = stream::iter(0..claims)
            .map(|i| async move {
                let name = format!("{prefix}-{i:05}");
                let vm: SmolVM = serde_json::from_value(json!({
                    "apiVersion": constants::API_VERSION, "kind": "SmolVM",
                    "metadata": {"name": name},
                    "spec": {"poolRef": {"name": "bench"}, "env": [{"name": "JOB", "value": i.to_string()}]},
                }))?;
                let (tx, ran) = tokio::sync::oneshot::channel();
                if self.wait {
                    self.waiting
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(name.clone(), tx);
                }
                let mut vm = self.vms.create(&PostParams::default(), &vm).await?;
                let at = Instant::now();
                if let Some(floor) = floor {
                    let mut status = floor.status.clone();
                    status.machine_name = vm.uid().map(|uid| format!("svm-{uid}"));
                    vm.status = Some(status);
                    vm.metadata.managed_fields = None;
                    floor.api.replace_status(&name, &PostParams::default(), &vm).await?;
                }
                if self.wait && tokio::time::timeout(Duration::from_secs(120), ran).await.is_err() {
                    return Err(anyhow!("{name} not Running 120 s after its create"));
                }
                Ok((name, at))
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        created.into_iter().collect()
    }
}

/// When each SmolVM was first seen bound to a node, and first seen Running, by name.
#[derive(Default)]
struct Seen {
    running: Mutex<HashMap<String, Instant>>,
    bound: Mutex<HashMap<String, Instant>>,
}

impl Seen {
    /// Watches the namespace's SmolVMs, noting what [`Seen`] holds and telling each waiting
    /// client when its SmolVM runs.
    fn watch(vms: &Api<SmolVM>, waiting: &Waiting) -> (Arc<Seen>, tokio::task::JoinHandle<()>) {
        let seen = Arc::new(Seen::default());
        let task = tokio::spawn({
            let (vms, seen, waiting) = (vms.clone(), seen.clone(), waiting.clone());
            async move {
                let mut events = watcher(vms, watcher::Config::default()).applied_objects().boxed();
                while let Ok(Some(vm)) = events.try_next().await {
                    let name = vm.metadata.name.clone().unwrap_or_default();
                    let status = vm.status.as_ref();
                    if status.and_then(|s| s.node_name.as_ref()).is_some() {
                        let mut bound = seen.bound.lock().unwrap_or_else(|e| e.into_inner());
                        bound.entry(name.clone()).or_insert_with(Instant::now);
                    }
                    if status.and_then(|s| s.phase) == Some(Phase::Running) {
                        let mut running = seen.running.lock().unwrap_or_else(|e| e.into_inner());
                        running.entry(name.clone()).or_insert_with(Instant::now);
                        if let Some(client) = waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&name) {
                            let _ = client.send(());
                        }
                    }
                }
            }
        });
        (seen, task)
    }
}

/// Seconds kube-apiserver spent on each kind of request, and how many ([`api_request_seconds`]).
type Seconds = HashMap<String, (f64, f64)>;

/// Every request the API server took during the claims (`before` and `after` them), by
/// resource, verb and code, and each kind's mean time there: its CPU is what a claim waits for
/// on a machine this small, with everyone's events.
fn print_requests(
    claims: usize,
    (before, after): (&HashMap<String, f64>, &HashMap<String, f64>),
    (seconds_before, seconds_after): (&Seconds, &Seconds),
) {
    let delta = |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let mut breakdown: Vec<(&String, f64)> = after
        .keys()
        .filter(|k| k.contains(' '))
        .map(|k| (k, delta(k)))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    breakdown.sort_by(|a, b| a.0.cmp(b.0));
    let shown: Vec<String> = breakdown.iter().map(|(k, n)| format!("{k}: {n:.0}")).collect();
    println!(
        "pool:   API requests during the claims (everyone's, watches aside): {}",
        shown.join(", ")
    );
    let mut times: Vec<String> = seconds_after
        .iter()
        .filter_map(|(k, (sum, count))| {
            let (sum0, count0) = seconds_before.get(k).copied().unwrap_or_default();
            let n = count - count0;
            (n >= claims as f64 / 2.0).then(|| format!("{k} {:.1} ms", (sum - sum0) / n * 1000.0))
        })
        .collect();
    times.sort();
    println!("pool:   mean time in kube-apiserver by request: {}", times.join(", "));
}

/// The floor: what the same API server gives the same creates when each is followed at once by
/// the one status write a warm claim costs, made by the benchmark as the controller's identity
/// from a served claim's status (the controller stopped first); no controller pass, node call or
/// event. What the controller adds is the difference; no operator that writes once per claim
/// goes below the floor on this machine.
async fn floor(
    env: &mut Env,
    clients: &Clients<'_>,
    running: &Mutex<HashMap<String, Instant>>,
    claims: usize,
) -> anyhow::Result<()> {
    env.kill_controller();
    let served = clients.vms.get("claim-00000").await?;
    let status = served.status.ok_or_else(|| anyhow!("claim-00000 has no status"))?;
    let (controller, _) = env.service_account_client(SA_CONTROLLER).await?;
    let floor = Floor {
        api: Api::namespaced(controller, "default"),
        status,
    };
    let started = Instant::now();
    let created = clients.claim("floor", claims, Some(&floor)).await?;
    let latencies = since_created(&created, running);
    println!(
        "pool:   floor, {claims} creates each followed by its one status write by the benchmark (no controller, node call or event): all Running after {:.1}s; creation->Running p50 {:.1} ms, p99 {:.1} ms",
        started.elapsed().as_secs_f64(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
    );
    Ok(())
}

/// POOL_APISERVER_PROFILE=FILE: kube-apiserver's CPU profile (pprof) of 5 s of the claims,
/// from 2 s after they start.
fn apiserver_profile(admin: &kube::Client, file: std::ffi::OsString) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let admin = admin.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let request = http::Request::get("/debug/pprof/profile?seconds=5").body(Vec::new())?;
        let mut bytes = admin.request_stream(request).await?;
        let mut out = Vec::new();
        futures::AsyncReadExt::read_to_end(&mut bytes, &mut out).await?;
        std::fs::write(&file, out)?;
        Ok(())
    })
}

/// The two halves of each claim, sorted: from its create to its binding, and from its binding
/// to Running.
fn halves(created: &HashMap<String, Instant>, seen: &Seen) -> (Vec<Duration>, Vec<Duration>) {
    let (running, bound) = (
        seen.running.lock().unwrap_or_else(|e| e.into_inner()),
        seen.bound.lock().unwrap_or_else(|e| e.into_inner()),
    );
    let (mut to_bound, mut to_running): (Vec<Duration>, Vec<Duration>) = created
        .iter()
        .filter_map(|(name, at)| {
            let (b, r) = (bound.get(name)?, running.get(name)?);
            Some((b.saturating_duration_since(*at), r.saturating_duration_since(*b)))
        })
        .unzip();
    to_bound.sort();
    to_running.sort();
    (to_bound, to_running)
}

async fn run(assets: assets::Assets) -> anyhow::Result<()> {
    let nodes_n = env_usize("POOL_NODES", 20);
    let slots = env_usize("POOL_SLOTS", 50);
    let claims = env_usize("POOL_CLAIMS", 1000);
    let concurrency = env_usize("POOL_CONCURRENCY", 20);
    let wait = env_usize("POOL_WAIT", 1) != 0;
    let quota = env_usize("POOL_QUOTA", 0) != 0;
    println!(
        "pool: {} (POOL_QUOTA={})",
        if quota {
            "with a ResourceQuota limiting vm.smolvm.dev/cpus, memory and storage in the namespace: the pool keeper charges its sources and slots"
        } else {
            "without a quota"
        },
        u8::from(quota)
    );
    let mut plane = simnodes::control_plane(&assets, "pool").await?;
    let (admin, controller_pid) = (plane.admin.clone(), plane.controller_pid);

    // The simulated nodes report their pools with their heartbeats, at the agent's default
    // interval (`--heartbeat-interval`, 10 s), unless POOL_HEARTBEAT_SECS says otherwise.
    let heartbeat = Duration::from_secs(env_usize("POOL_HEARTBEAT_SECS", 10).max(1) as u64);
    let sim = Arc::new(simnodes::start(&admin, "pool-node", nodes_n).await?);
    simnodes::heartbeat(&admin, &sim.nodes).await;
    let beat = tokio::spawn({
        let (admin, sim) = (admin.clone(), sim.clone());
        async move {
            loop {
                tokio::time::sleep(heartbeat).await;
                simnodes::heartbeat(&admin, &sim.nodes).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;

    if quota {
        // Limits far above what the run takes: the charges are measured, never a refusal.
        let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> = Api::namespaced(admin.clone(), "default");
        let q = serde_json::from_value(json!({
            "metadata": {"name": "bench"},
            "spec": {"hard": {"vm.smolvm.dev/cpus": "1000000", "vm.smolvm.dev/memory": "1000Ti",
                              "vm.smolvm.dev/storage": "1000Ti"}},
        }))?;
        quotas.create(&PostParams::default(), &q).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
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

    let vms: Api<SmolVM> = Api::namespaced(admin.clone(), "default");
    // The clients waiting for their SmolVM to run.
    let waiting: Waiting = Arc::default();
    let (seen, watch) = Seen::watch(&vms, &waiting);
    let running = &seen.running;

    let before = api_requests(&admin).await?;
    let seconds_before = api_request_seconds(&admin).await?;
    let profile = std::env::var_os("POOL_APISERVER_PROFILE").map(|file| apiserver_profile(&admin, file));
    let started = Instant::now();
    let clients = Clients {
        vms: &vms,
        waiting: &waiting,
        concurrency,
        wait,
    };
    let created = clients.claim("claim", claims, None).await?;
    let all_created = started.elapsed();
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
    if let Some(profile) = profile {
        profile.await??;
    }
    let peak_at_claims = peak_rss_mib(controller_pid);
    let after = api_requests(&admin).await?;
    let seconds_after = api_request_seconds(&admin).await?;
    let latencies = since_created(&created, running);
    let (to_bound, to_running) = halves(&created, &seen);
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
        "pool: {claims} claims, {concurrency} {}: all created after {:.1}s, all Running after {:.1}s; served warm {warm}, cold {}",
        if wait {
            "in progress at a time"
        } else {
            "creates in flight at a time (POOL_WAIT=0)"
        },
        all_created.as_secs_f64(),
        all_running.duration_since(started).as_secs_f64(),
        claims as u32 - warm.min(claims as u32)
    );
    println!(
        "pool:   creation->bound p50 {:.1} ms, p99 {:.1} ms; bound->Running p50 {:.1} ms, p99 {:.1} ms (0 for a warm claim, bound and Running in one write)",
        percentile(&to_bound, 0.5),
        percentile(&to_bound, 0.99),
        percentile(&to_running, 0.5),
        percentile(&to_running, 0.99)
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
    print_requests(claims, (&before, &after), (&seconds_before, &seconds_after));
    while ready_slots().await? != Some(total) {
        if all_running.elapsed() > Duration::from_secs(300) {
            return Err(anyhow!("the pool not refilled after 5 minutes"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "pool:   refill: every slot ready again {:.1}s after the last claim ran (the double refills a slot as it is leased, so the nodes' reports, every {}s, never dip: this reads the pool's status; a real node's refill is smolvm's fork of a worker, shown at its next report)",
        all_running.elapsed().as_secs_f64(),
        heartbeat.as_secs()
    );
    println!("pool:   controller at {claims} claims: {peak_at_claims} (target <= 100 MiB)");

    if env_usize("POOL_FLOOR", 1) != 0 {
        floor(&mut plane.env, &clients, running, claims).await?;
    }
    watch.abort();
    beat.abort();
    drop(sim);
    drop(plane);
    Ok(())
}
