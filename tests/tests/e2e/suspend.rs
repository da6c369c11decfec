//! Suspend and resume (SPEC 2.3) through kube-apiserver, on a node whose runtime is a TEST
//! DOUBLE of `smolvm serve` (testkit's `SmolvmDouble`, served in this process): no guest boots
//! on these machines, so a machine never runs on the real smolvm here and there is nothing to
//! suspend. Everything else is real: the webhook, the controller, and the runtime agent binary
//! attached to the double's socket, over mTLS.
//!
//! The node holds 2 CPUs for VMs. A VM of 2 CPUs runs there and is suspended: its CPUs go back
//! to the node, and a second VM of 2 CPUs is placed in that room. The first is resumed: it waits,
//! saying what its node lacks; the second is deleted, and it resumes with its state as it was.
//! Then a suspended VM with `running: false` is stopped and its saved memory discarded.

use std::time::Duration;

use anyhow::{Context as _, anyhow, ensure};
use kube::{Api, api::DeleteParams};
use smolvm_api::{Phase, SmolVM, SmolVMNode, constants};
use smolvm_testkit::smolvm_double::SmolvmDouble;
use smolvm_tests::env::{Env, eventually};

use crate::{Scenario, condition, delete_and_wait, expect_event, kubectl_apply, patch_vm, vm, vms, wait_vm};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![a_suspended_vm_gives_its_room_to_another_and_resumes_when_room_frees]
}

/// The double-backed node.
const DOUBLE_NODE: &str = "double-node";

/// A VM pinned to the double's node, taking all of its 2 CPUs.
fn whole_node(running: bool) -> serde_json::Value {
    serde_json::json!({
        "image": "alpine:3.20", "running": running, "nodeName": DOUBLE_NODE,
        "resources": {"cpus": 2, "memoryMiB": 256}, "storage": {"storageGiB": 1, "overlayGiB": 1},
    })
}

fn phase(vm: &SmolVM) -> Option<Phase> {
    vm.status.as_ref().and_then(|s| s.phase)
}

fn suspended_reason(vm: &SmolVM) -> Option<String> {
    condition(vm, constants::condition::SUSPENDED).map(|c| c.reason.clone())
}

fn machine_of(vm: &SmolVM) -> anyhow::Result<String> {
    vm.status
        .as_ref()
        .and_then(|s| s.machine_name.clone())
        .ok_or_else(|| anyhow!("no machine name in the status"))
}

/// The issue's walk: suspend, the room given back and taken, a resume that waits, then resumes.
pub(crate) async fn a_suspended_vm_gives_its_room_to_another_and_resumes_when_room_frees(
    env: &mut Env,
) -> anyhow::Result<()> {
    let socket = env.dir().join("double-smolvm.sock");
    let double = SmolvmDouble::start(&socket)
        .await
        .context("starting the smolvm double")?;
    // Two CPUs for VMs, whatever this machine has: no reservation, one vCPU per CPU.
    let extra = ["--cpu-allocation-ratio=1", "--reserved-cpus=0"];
    let mut agent = env.start_double_node(DOUBLE_NODE, &socket, &extra).await?;
    let outcome = walk(env, &double).await;
    for name in ["sleeper", "tenant"] {
        let _ = delete_and_wait(env, name).await;
    }
    agent.terminate(Duration::from_secs(10));
    let admin = env.admin().await?;
    let _ = Api::<SmolVMNode>::all(admin)
        .delete(DOUBLE_NODE, &DeleteParams::default())
        .await;
    outcome
}

async fn walk(env: &mut Env, double: &smolvm_testkit::smolvm_double::DoubleHandle) -> anyhow::Result<()> {
    let admin = env.admin().await?;
    let nodes: Api<SmolVMNode> = Api::all(admin);
    let allocatable = nodes
        .get(DOUBLE_NODE)
        .await?
        .status
        .and_then(|s| s.allocatable)
        .ok_or_else(|| anyhow!("the double's node reports no allocatable"))?;
    ensure!(allocatable.cpus == 2, "the node holds 2 CPUs for VMs: {allocatable:?}");

    kubectl_apply(env, &vm("sleeper", whole_node(true)))?.map_err(|e| anyhow!("applying sleeper: {e}"))?;
    let running = wait_vm(env, "sleeper", "sleeper running", Duration::from_secs(60), |v| {
        phase(v) == Some(Phase::Running)
    })
    .await?;
    let machine = machine_of(&running)?;

    // Suspend: paused through the node, its CPUs given back.
    patch_vm(env, "sleeper", r#"{"spec":{"suspended":true}}"#)?;
    let suspended = wait_vm(env, "sleeper", "sleeper suspended", Duration::from_secs(60), |v| {
        phase(v) == Some(Phase::Suspended) && suspended_reason(v).as_deref() == Some(constants::reason::SUSPENDED)
    })
    .await?;
    ensure!(double.is_paused(&machine), "smolvm paused machine {machine}");
    let message = condition(&suspended, constants::condition::SUSPENDED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    ensure!(
        message.contains("since") && message.contains("GiB"),
        "the condition says since when and how large: {message}"
    );
    let ready = condition(&suspended, constants::condition::READY).map(|c| (c.status.clone(), c.reason.clone()));
    ensure!(
        ready == Some(("False".into(), constants::reason::SUSPENDED.into())),
        "Ready says Suspended: {ready:?}"
    );
    eventually(
        "the node to report the machine suspended",
        Duration::from_secs(30),
        || {
            let nodes = nodes.clone();
            let machine = machine.clone();
            async move {
                let node = nodes.get(DOUBLE_NODE).await?;
                let listed = node
                    .status
                    .and_then(|s| s.suspended_machines)
                    .is_some_and(|m| m.contains(&machine));
                Ok(listed.then_some(()))
            }
        },
    )
    .await?;

    // Its room taken by another VM.
    kubectl_apply(env, &vm("tenant", whole_node(true)))?.map_err(|e| anyhow!("applying tenant: {e}"))?;
    wait_vm(
        env,
        "tenant",
        "tenant placed in the room",
        Duration::from_secs(60),
        |v| phase(v) == Some(Phase::Running),
    )
    .await?;

    // The resume waits, saying what the node lacks; the machine stays paused.
    patch_vm(env, "sleeper", r#"{"spec":{"suspended":false}}"#)?;
    let pending = wait_vm(env, "sleeper", "the resume to wait", Duration::from_secs(60), |v| {
        suspended_reason(v).as_deref() == Some(constants::reason::RESUME_PENDING)
    })
    .await?;
    let why = condition(&pending, constants::condition::SUSPENDED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    ensure!(
        why.contains("2 CPUs (0 free)") && why.contains(DOUBLE_NODE),
        "the condition names what is missing: {why}"
    );
    ensure!(
        phase(&pending) == Some(Phase::Suspended),
        "still suspended: {:?}",
        phase(&pending)
    );
    ensure!(
        double.is_paused(&machine),
        "the machine stays paused while the resume waits"
    );
    expect_event(env, "sleeper", constants::reason::RESUME_PENDING).await?;

    // Room freed: it resumes where it was bound.
    delete_and_wait(env, "tenant").await?;
    let resumed = wait_vm(env, "sleeper", "sleeper resumed", Duration::from_secs(60), |v| {
        phase(v) == Some(Phase::Running) && suspended_reason(v).is_none()
    })
    .await?;
    ensure!(
        resumed.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(DOUBLE_NODE),
        "bound VMs never move"
    );
    ensure!(!double.is_paused(&machine), "smolvm resumed machine {machine}");
    ensure!(!double.calls_of("resume_machine").is_empty(), "a resume reached smolvm");
    for want in [constants::reason::SUSPENDED, constants::reason::RESUMED] {
        expect_event(env, "sleeper", want).await?;
    }

    // Suspended, then running false: stopped, and the saved memory discarded, with an event.
    patch_vm(env, "sleeper", r#"{"spec":{"suspended":true}}"#)?;
    wait_vm(
        env,
        "sleeper",
        "sleeper suspended again",
        Duration::from_secs(60),
        |v| phase(v) == Some(Phase::Suspended),
    )
    .await?;
    patch_vm(env, "sleeper", r#"{"spec":{"running":false}}"#)?;
    wait_vm(env, "sleeper", "sleeper stopped", Duration::from_secs(60), |v| {
        phase(v) == Some(Phase::Stopped) && suspended_reason(v).is_none()
    })
    .await?;
    ensure!(!double.is_paused(&machine), "the saved state is gone");
    expect_event(env, "sleeper", constants::reason::SAVED_STATE_DISCARDED).await?;
    let api = vms(env).await?;
    ensure!(
        api.get("sleeper").await?.spec.suspended == Some(true),
        "the spec is kept"
    );
    Ok(())
}
