//! Lifetimes (SPEC 2.7) on the real API server, on a node backed by the smolvm double (its
//! machines "boot" at once, and a test can make one exit as its workload would): a SmolVM with
//! `activeDeadlineSeconds` is deleted that long after it first ran, one with
//! `ttlSecondsAfterFinished: 0` and restartPolicy Never as soon as its machine exits on its own;
//! each with an Expired event, and its machine removed from the node by the normal finalizer.

use std::time::Duration;

use anyhow::{anyhow, ensure};
use serde_json::json;
use smolvm_api::{Phase, constants::reason};
use smolvm_testkit::smolvm_double::DoubleHandle;
use smolvm_tests::env::{Env, eventually};

use crate::{Scenario, delete_and_wait, expect_event, kubectl_apply, vm};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![lifetimes_delete_a_vm_after_its_deadline_and_after_it_finished]
}

/// The node of the scenario, backed by its own double.
const NODE: &str = "lifetime-double-node";

async fn lifetimes_delete_a_vm_after_its_deadline_and_after_it_finished(env: &mut Env) -> anyhow::Result<()> {
    let node = env.start_on_double(NODE, &[]).await?;
    let outcome = expire(env, &node.double).await;
    for name in ["deadline", "finished"] {
        let _ = delete_and_wait(env, name).await;
    }
    node.stop(env).await;
    outcome
}

/// Applies a small SmolVM on the scenario's node with `extra` in its spec, and waits until it
/// runs; its machine's name.
async fn running(env: &Env, name: &str, extra: serde_json::Value) -> anyhow::Result<String> {
    let mut spec = json!({"image": "alpine:3.20", "resources": {"memoryMiB": 128},
        "storage": {"storageGiB": 1, "overlayGiB": 1},
        "nodeSelector": {"kubernetes.io/hostname": NODE}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    kubectl_apply(env, &vm(name, spec))?.map_err(|e| anyhow!("applying {name}: {e}"))?;
    let vm = crate::wait_vm(env, name, "running", Duration::from_secs(60), |v| {
        v.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running)
    })
    .await?;
    ensure!(
        vm.status.as_ref().and_then(|s| s.started_at.as_ref()).is_some(),
        "{name}: status.startedAt is recorded with its first Running"
    );
    Ok(vm.machine_name().unwrap_or_default())
}

/// Waits until `name` is gone and its machine with it; the Expired event names `lifetime`.
async fn expired(
    env: &Env,
    double: &DoubleHandle,
    name: &str,
    machine: &str,
    lifetime: &str,
    within: Duration,
) -> anyhow::Result<()> {
    crate::wait_gone(env, name, within).await?;
    let event = expect_event(env, name, reason::EXPIRED).await?;
    let note = event.note.unwrap_or_default();
    ensure!(note.contains(lifetime), "the Expired event names {lifetime}: {note}");
    eventually(
        &format!("{machine} gone from smolvm"),
        Duration::from_secs(10),
        || async { Ok(double.state(machine).is_none().then_some(())) },
    )
    .await
}

async fn expire(env: &Env, double: &DoubleHandle) -> anyhow::Result<()> {
    // activeDeadlineSeconds: counted from its first Running, whatever it does then.
    let deadline = running(env, "deadline", json!({"lifecycle": {"activeDeadlineSeconds": 5}})).await?;
    let started = std::time::Instant::now();
    expired(
        env,
        double,
        "deadline",
        &deadline,
        "activeDeadlineSeconds",
        Duration::from_secs(40),
    )
    .await?;
    println!(
        "    activeDeadlineSeconds 5: deleted {:.1} s after it ran, its machine removed, an Expired event",
        started.elapsed().as_secs_f64()
    );

    // ttlSecondsAfterFinished: its machine exits on its own and Never keeps it stopped. The
    // controller sees the exit at its next look at the machine (the tier's resync is 30 s).
    let finished = running(
        env,
        "finished",
        json!({"restartPolicy": "Never", "lifecycle": {"ttlSecondsAfterFinished": 0}}),
    )
    .await?;
    ensure!(double.exit(&finished), "the machine ran, and exits");
    let exited = std::time::Instant::now();
    expired(
        env,
        double,
        "finished",
        &finished,
        "ttlSecondsAfterFinished",
        Duration::from_secs(75),
    )
    .await?;
    println!(
        "    ttlSecondsAfterFinished 0 with restartPolicy Never: deleted {:.1} s after its machine exited",
        exited.elapsed().as_secs_f64()
    );
    Ok(())
}
