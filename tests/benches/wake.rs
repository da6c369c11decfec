//! `make bench-wake`: the operator's own time to wake a VM suspended for idleness (SPEC 2.7), on
//! loopback, with a real kube-apiserver, the real webhook and controller, and the real agent
//! binary, whose forwarder listens on an address of its own (the host end of a veth pair).
//!
//! TEST DOUBLE: the node's runtime is testkit's `SmolvmDouble` (smolvm 1.32.2's routes and
//! schemas, served in this process), since no guest boots on these machines; it serves each
//! running machine's published port on 127.0.0.1 with an echo, as smolvm binds a guest's, and
//! takes WAKE_BENCH_RESUME_MS (250) to answer each resume, standing for smolvm's own resume.
//!
//! WAKE_BENCH_COUNT (20) VMs with `suspendAfterIdle: 30s` are left quiet until the controller
//! suspends them all; then each is woken by a TCP connection to its published port, one at a
//! time, and (after they sleep again) all at once. A wake's time runs from the client's connect
//! (the forwarder holds the connection; its agent asks for the wake, the controller resumes the
//! VM, the forwarder relays) to its first echoed byte; the operator's part is that less the
//! resume's time in smolvm. Prints `wake operator time (one at a time): p50 X ms, p99 Y ms` and
//! the same for all at once, against the target p99 <= 100 ms; figures are printed, never
//! asserted. Needs root for the veth pair; prints why it did not run otherwise.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure};
use kube::{Api, api::PostParams};
use serde_json::json;
use smolvm_api::{Phase, SmolVM};
use smolvm_testkit::netns::{OtherHost, why_not};
use smolvm_tests::{
    assets,
    env::eventually,
    simnodes::{DoubleNode, double_node_at, env_usize, report_ms},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODE: &str = "bench-wake-node";
const NS: &str = "default";
const NODE_IP: &str = "10.251.8.1";
const PEER_IP: &str = "10.251.8.2";
/// The first published port; VM `i` publishes `BASE_PORT + i`.
const BASE_PORT: u16 = 24_100;

fn main() -> anyhow::Result<()> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(2);
    assets::bench_main("wake", runtime, run)
}

async fn run(assets: assets::Assets) -> anyhow::Result<()> {
    if let Some(why) = why_not() {
        println!("wake benchmark skipped: {why}; the forwarder needs a node address of its own");
        return Ok(());
    }
    let count = env_usize("WAKE_BENCH_COUNT", 20);
    let resume = Duration::from_millis(env_usize("WAKE_BENCH_RESUME_MS", 250) as u64);
    let _host = OtherHost::create("bench", "wake", NODE_IP, PEER_IP).map_err(|e| anyhow!(e))?;
    // The directory is bound first, so it goes last, after the processes that use it.
    let DoubleNode {
        dir: _dir,
        mut env,
        double,
        agent: _agent,
    } = double_node_at(&assets, "smolvm-wake-", NODE, Some(NODE_IP)).await?;
    double.serve_ports();
    double.set_delay("resume_machine", resume);
    let api: Api<SmolVM> = Api::namespaced(env.admin().await?, NS);
    let ports: Vec<SocketAddr> = (0..count)
        .map(|i| SocketAddr::new(NODE_IP.parse().expect("an address"), BASE_PORT + i as u16))
        .collect();
    for (i, at) in ports.iter().enumerate() {
        api.create(&PostParams::default(), &object(&format!("wake-{i}"), at.port())?)
            .await?;
    }
    for i in 0..count {
        wait_for(&api, &format!("wake-{i}"), "Running", |vm| {
            phase(vm) == Some(Phase::Running)
        })
        .await?;
    }
    println!(
        "{count} VMs with suspendAfterIdle 30s on a double-backed node (smolvm's resume taken as {} ms):",
        resume.as_millis()
    );

    asleep(&api, count).await?;
    let mut one_at_a_time = Vec::new();
    for (i, at) in ports.iter().enumerate() {
        one_at_a_time.push(wake(*at).await?);
        wait_for(&api, &format!("wake-{i}"), "Running", |vm| {
            phase(vm) == Some(Phase::Running)
        })
        .await?;
    }

    asleep(&api, count).await?;
    let wakes = ports.iter().map(|at| wake(*at));
    let at_once = futures::future::try_join_all(wakes).await?;

    let operator =
        |samples: &[Duration]| -> Vec<Duration> { samples.iter().map(|d| d.saturating_sub(resume)).collect() };
    report_ms("wake operator time (one at a time)", operator(&one_at_a_time));
    report_ms(&format!("wake operator time ({count} at once)"), operator(&at_once));
    report_ms("wake time, smolvm's resume included (one at a time)", one_at_a_time);
    println!(
        "target: wake operator time p99 <= 100 ms (from a held connection's arrival to its first relayed byte, less smolvm's resume)"
    );
    env.stop_runtime();
    Ok(())
}

fn object(name: &str, port: u16) -> anyhow::Result<SmolVM> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"image": "alpine:3.20", "nodeName": NODE, "resources": {"cpus": 1, "memoryMiB": 128},
            "storage": {"storageGiB": 1, "overlayGiB": 1},
            "lifecycle": {"suspendAfterIdle": "30s"},
            "network": {"enabled": true, "ports": [{"hostPort": port, "guestPort": 80}]}},
    }))?)
}

fn phase(vm: &SmolVM) -> Option<Phase> {
    vm.status.as_ref().and_then(|s| s.phase)
}

/// Waits until every VM is suspended for idleness (30 s of quiet, and a heartbeat).
async fn asleep(api: &Api<SmolVM>, count: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    for i in 0..count {
        wait_for(api, &format!("wake-{i}"), "IdleSuspended", SmolVM::idle_suspended).await?;
    }
    println!(
        "  all {count} suspended for idleness {:.1} s after the last traffic",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn wait_for(api: &Api<SmolVM>, name: &str, what: &str, pred: fn(&SmolVM) -> bool) -> anyhow::Result<SmolVM> {
    eventually(&format!("{name} {what}"), Duration::from_secs(120), || async {
        let vm = api.get(name).await?;
        Ok(pred(&vm).then_some(vm))
    })
    .await
}

/// One wake: a connection to a sleeping VM's port and a byte sent; the time until it comes back.
async fn wake(at: SocketAddr) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut conn = tokio::net::TcpStream::connect(at).await?;
    conn.write_all(b"w").await?;
    let mut back = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(60), conn.read_exact(&mut back))
        .await
        .map_err(|_| anyhow!("no echo from {at} within 60 s"))??;
    ensure!(&back == b"w", "the echo from {at}");
    Ok(started.elapsed())
}
