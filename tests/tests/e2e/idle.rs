//! Idle VMs sleep and wake on traffic (SPEC 2.7), on the real API server, on a node backed by the
//! smolvm double (TEST DOUBLE: no guest boots here). The double serves each running machine's
//! published ports on 127.0.0.1 with an echo, as smolvm binds a guest's; the node has an address
//! of its own (the host end of a veth pair to another network namespace), so its agent's
//! forwarder is on, and the scenario connects where the VM's EndpointSlice says (this tier runs
//! no kube-proxy). A VM with `suspendAfterIdle: 30s` is suspended by the controller after it
//! (IdleSuspended, `spec.suspended` left false); one that keeps receiving traffic stays awake; a
//! TCP connection to the sleeping one is held by the forwarder, wakes it (WokenByTraffic), and
//! gets its echo. Prints `skipped: …` where another network namespace cannot be made.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use serde_json::json;
use smolvm_api::{Phase, SmolVM, constants::reason};
use smolvm_testkit::netns::{OtherHost, why_not};
use smolvm_tests::{env::Env, process::free_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{NS, Scenario, delete_and_wait, expect_event, kubectl_apply, vm, wait_vm};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![idle_vms_sleep_and_the_next_connection_wakes_them]
}

/// The node of the scenario, backed by its own double.
const NODE: &str = "idle-double-node";
/// The node's address (the host end of the veth pair) and the other host's.
const NODE_IP: &str = "10.251.7.1";
const PEER_IP: &str = "10.251.7.2";

async fn idle_vms_sleep_and_the_next_connection_wakes_them(env: &mut Env) -> anyhow::Result<()> {
    if let Some(why) = why_not() {
        println!("    skipped: {why}; the forwarder needs a node address that is not loopback");
        return Ok(());
    }
    let host = OtherHost::create("e2e", "idle", NODE_IP, PEER_IP).map_err(|e| anyhow!(e))?;
    let publish = format!("--publish-address={NODE_IP}");
    // Sixteen vCPUs per host CPU, as the real node: both VMs fit beside the host reservation.
    let node = env
        .start_on_double_at(NODE, NODE_IP, &[&publish, "--cpu-allocation-ratio=16"])
        .await?;
    node.double.serve_ports();
    let outcome = sleep_and_wake(env).await;
    for name in ["sleepy", "busy"] {
        let _ = delete_and_wait(env, name).await;
    }
    node.stop(env).await;
    drop(host);
    outcome
}

/// Applies a running SmolVM on the scenario's node that sleeps after 30 s of quiet, publishing
/// one TCP port through a Service; the address and port its EndpointSlice names.
async fn idle_vm(env: &Env, name: &str) -> anyhow::Result<SocketAddr> {
    let port = free_port()?;
    let spec = json!({"image": "alpine:3.20", "resources": {"memoryMiB": 128},
        "storage": {"storageGiB": 1, "overlayGiB": 1},
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "lifecycle": {"suspendAfterIdle": "30s"},
        "network": {"enabled": true, "exposeService": true, "ports": [{"hostPort": port, "guestPort": 80}]}});
    kubectl_apply(env, &vm(name, spec))?.map_err(|e| anyhow!("applying {name}: {e}"))?;
    let v = wait_vm(env, name, "running", Duration::from_secs(60), |v| {
        v.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running)
    })
    .await?;
    let lifecycle = v.spec.lifecycle.clone().unwrap_or_default();
    ensure!(
        lifecycle.wake_on_traffic == Some(true),
        "{name}: M6 defaults wakeOnTraffic to true: {lifecycle:?}"
    );
    let slices: Api<EndpointSlice> = Api::namespaced(env.admin().await?, NS);
    let slice = smolvm_tests::env::eventually(&format!("{name}'s EndpointSlice"), Duration::from_secs(30), || {
        let slices = slices.clone();
        async move { Ok(slices.get_opt(name).await?) }
    })
    .await?;
    let address = slice
        .endpoints
        .first()
        .and_then(|e| e.addresses.first())
        .ok_or_else(|| anyhow!("{name}'s EndpointSlice names no address"))?;
    let port = slice
        .ports
        .as_ref()
        .and_then(|p| p.first())
        .and_then(|p| p.port)
        .ok_or_else(|| anyhow!("{name}'s EndpointSlice names no port"))?;
    ensure!(
        address == NODE_IP,
        "{name}'s EndpointSlice points at its node: {address}"
    );
    Ok(SocketAddr::new(address.parse()?, u16::try_from(port)?))
}

/// One round trip through the forwarder: `word` sent, its echo read back.
async fn echo(at: SocketAddr, word: &[u8], within: Duration) -> anyhow::Result<()> {
    let round = async {
        let mut conn = TcpStream::connect(at).await?;
        conn.write_all(word).await?;
        let mut back = vec![0u8; word.len()];
        conn.read_exact(&mut back).await?;
        anyhow::Ok(back)
    };
    let back = tokio::time::timeout(within, round)
        .await
        .map_err(|_| anyhow!("no echo from {at} within {within:?}"))??;
    ensure!(back == word, "the echo from {at} is what was sent");
    Ok(())
}

async fn sleep_and_wake(env: &Env) -> anyhow::Result<()> {
    let sleepy = idle_vm(env, "sleepy").await?;
    let busy = idle_vm(env, "busy").await?;
    // The double serves the running machine's port where smolvm would, and the forwarder
    // relays the node's address to it.
    let loopback = SocketAddr::from(([127, 0, 0, 1], sleepy.port()));
    echo(loopback, b"direct", Duration::from_secs(10)).await?;
    echo(sleepy, b"first", Duration::from_secs(10))
        .await
        .map_err(|e| anyhow!("{e:#}; the agent's log:\n{}", env.log_tail("smolvm-runtime-double", 20)))?;
    let quiet_from = Instant::now();
    // `busy` gets a byte every 5 s; `sleepy` none.
    let keep_busy = tokio::spawn(async move {
        loop {
            let _ = echo(busy, b"tick", Duration::from_secs(5)).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    });
    let asleep = wait_vm(
        env,
        "sleepy",
        "IdleSuspended",
        Duration::from_secs(90),
        SmolVM::idle_suspended,
    )
    .await;
    let slept = quiet_from.elapsed();
    let busy_now = crate::vms(env).await?.get("busy").await?;
    keep_busy.abort();
    let asleep = asleep?;
    ensure!(
        slept >= Duration::from_secs(30),
        "suspended after {slept:?}: never before its 30 s of quiet"
    );
    ensure!(
        asleep.spec.suspended != Some(true),
        "an idle suspension is the controller's: spec.suspended stays false"
    );
    ensure!(
        asleep.status.as_ref().and_then(|s| s.phase) == Some(Phase::Suspended),
        "sleepy's phase is Suspended"
    );
    expect_event(env, "sleepy", reason::IDLE_SUSPENDED).await?;
    if busy_now.idle_suspended() || busy_now.status.as_ref().and_then(|s| s.phase) != Some(Phase::Running) {
        bail!("busy kept receiving traffic and was suspended: {:?}", busy_now.status);
    }
    println!(
        "    sleepy suspended {:.1} s after its last byte (suspendAfterIdle 30s); busy, with a byte every 5 s, runs",
        slept.as_secs_f64()
    );

    // The next connection wakes it: the forwarder holds it, and relays it once it runs.
    let knocked = Instant::now();
    echo(sleepy, b"wake up", Duration::from_secs(60)).await?;
    let served = knocked.elapsed();
    let woken = wait_vm(env, "sleepy", "Running again", Duration::from_secs(10), |v| {
        v.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running)
    })
    .await?;
    ensure!(!woken.idle_suspended(), "woken: the Suspended condition is gone");
    expect_event(env, "sleepy", reason::WOKEN_BY_TRAFFIC).await?;
    println!(
        "    a connection to the sleeping VM was held and served its echo {:.2} s after it arrived (WokenByTraffic)",
        served.as_secs_f64()
    );
    Ok(())
}
