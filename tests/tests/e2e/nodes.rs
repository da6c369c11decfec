//! Truthful nodes: the real agent on this machine runs its guest boot check (a canary boot); no
//! guest boots here, so its SmolVMNode reports GuestBootable=False and takes no VM. A second,
//! simulated node (a SmolVMNode written by the test, as an agent whose guests boot would report
//! it, with a heartbeat the test keeps changing) takes the VMs. Cordoned, no node can run a new
//! VM: it waits, saying why in the scheduler's form, and is placed once the node is uncordoned.

use std::time::Duration;

use anyhow::{anyhow, ensure};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use smolvm_api::{SmolVMNode, constants};
use smolvm_tests::env::{Env, NODE, eventually};

use crate::{Scenario, condition, expect_event, kubectl_apply, small, vm, vms, wait_vm};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![a_node_that_cannot_boot_guests_takes_no_vm_and_an_unplaced_vm_says_why]
}

const SIM: &str = "sim-bootable-node";

/// The simulated node's status, as an agent whose canary booted would apply it.
fn sim_status(heartbeat: &str) -> serde_json::Value {
    let condition = |type_: &str, reason: &str| {
        json!({"type": type_, "status": "True", "reason": reason, "message": "simulated",
            "lastTransitionTime": heartbeat})
    };
    json!({"status": {
        "nodeUID": "uid-sim-bootable-node",
        // Nothing listens here: the VMs placed on this node are never started, only bound.
        "endpoint": {"address": "127.0.0.1", "port": 1},
        "protocolVersion": constants::PROTOCOL_VERSION,
        "runtimeVersion": "1.32.2",
        "heartbeatTime": heartbeat,
        "capacity": {"cpus": 64, "memoryMiB": 65536, "storageGiB": 500},
        "allocatable": {"cpus": 64, "memoryMiB": 65536, "storageGiB": 500},
        "canary": {"lastRun": heartbeat, "bootMillis": 640, "smolvmVersion": "1.32.2"},
        "conditions": [
            condition("Ready", "AsExpected"),
            condition("KVMAvailable", "AsExpected"),
            condition("RuntimeReady", "AsExpected"),
            condition("GuestBootable", "CanaryBooted"),
        ],
    }})
}

async fn set_cordon(nodes: &Api<SmolVMNode>, on: bool) -> anyhow::Result<()> {
    nodes
        .patch(
            SIM,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": on}})),
        )
        .await?;
    Ok(())
}

/// Issue 31: a VM goes only to a node where a guest booted; with none eligible it waits, told why.
pub(crate) async fn a_node_that_cannot_boot_guests_takes_no_vm_and_an_unplaced_vm_says_why(
    env: &mut Env,
) -> anyhow::Result<()> {
    // The real agent, with its guest boot check on.
    env.stop_runtime();
    env.options.canary = true;
    let outcome = scenario(env).await;
    // Leave the agent as the other scenarios expect it, whatever happened.
    env.stop_runtime();
    env.options.canary = false;
    env.start_runtime().await?;
    outcome
}

async fn scenario(env: &mut Env) -> anyhow::Result<()> {
    env.start_runtime().await?;
    let admin = env.admin().await?;
    let nodes: Api<SmolVMNode> = Api::all(admin.clone());
    let started = std::time::Instant::now();
    let real = eventually("the real node's guest boot check", Duration::from_secs(240), || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(NODE).await?;
            let guest = node
                .status
                .as_ref()
                .and_then(|s| {
                    s.conditions
                        .iter()
                        .find(|c| c.type_ == constants::condition::GUEST_BOOTABLE)
                })
                .filter(|c| c.status != "Unknown")
                .cloned();
            Ok(guest.map(|c| (c, node)))
        }
    })
    .await?;
    let (guest, real_node) = real;
    println!(
        "    the real node's check took {:.1}s: GuestBootable={} {}: {}",
        started.elapsed().as_secs_f64(),
        guest.status,
        guest.reason,
        guest.message
    );
    let real_bootable = guest.status == "True";
    ensure!(
        real_node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(constants::LABEL_GUEST_BOOTABLE))
            .map(String::as_str)
            == Some(if real_bootable { "true" } else { "false" }),
        "the guest-bootable label follows the check: {:?}",
        real_node.metadata.labels
    );
    ensure!(
        real_node.status.as_ref().and_then(|s| s.canary.as_ref()).is_some(),
        "status.canary is reported"
    );
    if !real_bootable {
        ensure!(guest.reason == constants::reason::CANARY_FAILED, "{guest:?}");
        ensure!(
            !guest.message.contains('\u{1b}'),
            "the cause is cleaned: {}",
            guest.message
        );
    }

    // The simulated node whose guests boot, its heartbeat kept changing.
    let _ = nodes.delete(SIM, &DeleteParams::default()).await;
    let sim: SmolVMNode = serde_json::from_value(json!({
        "apiVersion": constants::API_VERSION, "kind": constants::KIND_SMOLVM_NODE,
        "metadata": {"name": SIM, "labels": {"kubernetes.io/arch": "amd64"}},
        "spec": {},
    }))?;
    nodes.create(&PostParams::default(), &sim).await?;
    let beat = {
        let nodes = nodes.clone();
        tokio::spawn(async move {
            loop {
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                if let Err(e) = nodes
                    .patch_status(SIM, &PatchParams::default(), &Patch::Merge(sim_status(&now)))
                    .await
                {
                    eprintln!("    simulated heartbeat failed: {e}");
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        })
    };
    let result = placements(env, &nodes, real_bootable).await;
    beat.abort();
    // Clean up: the VMs on the simulated node cannot be cleaned on a node (nothing listens);
    // the force-delete annotation lets them go, as for a node that is gone.
    let api = vms(env).await?;
    for name in ["truthful-a", "truthful-b", "truthful-c"] {
        let _ = api.delete(name, &DeleteParams::default()).await;
        let _ = api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {constants::FORCE_DELETE_ANNOTATION: "true"}}})),
            )
            .await;
    }
    for name in ["truthful-a", "truthful-b", "truthful-c"] {
        crate::wait_gone(env, name, Duration::from_secs(90)).await?;
    }
    nodes.delete(SIM, &DeleteParams::default()).await?;
    result
}

async fn placements(env: &mut Env, nodes: &Api<SmolVMNode>, real_bootable: bool) -> anyhow::Result<()> {
    // Two VMs: both go to the simulated node (the real one cannot boot guests here).
    for name in ["truthful-a", "truthful-b"] {
        kubectl_apply(env, &vm(name, small(false)))?.map_err(|e| anyhow!("applying {name}: {e}"))?;
    }
    for name in ["truthful-a", "truthful-b"] {
        let bound = wait_vm(env, name, "a binding", Duration::from_secs(60), |v| {
            v.status.as_ref().and_then(|s| s.node_name.as_deref()).is_some()
        })
        .await?;
        let node = bound
            .status
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if real_bootable {
            println!("    guests boot on this machine: {name} went to {node}");
        } else {
            ensure!(node == SIM, "{name} went to {node}, a node that cannot boot guests");
        }
    }
    // Cordoned: no node can run a new VM; it waits with the explanation.
    set_cordon(nodes, true).await?;
    kubectl_apply(env, &vm("truthful-c", small(false)))?.map_err(|e| anyhow!("applying truthful-c: {e}"))?;
    if !real_bootable {
        let waiting = wait_vm(
            env,
            "truthful-c",
            "Scheduled=False Unschedulable",
            Duration::from_secs(60),
            |v| {
                condition(v, constants::condition::SCHEDULED)
                    .is_some_and(|c| c.status == "False" && c.reason == constants::reason::UNSCHEDULABLE)
            },
        )
        .await?;
        let message = condition(&waiting, constants::condition::SCHEDULED)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        println!("    truthful-c waits: {message}");
        ensure!(message.starts_with("0/2 nodes can run this VM: "), "{message}");
        ensure!(message.contains("1 cannot boot guests (CanaryFailed)"), "{message}");
        ensure!(message.contains("1 is cordoned (spec.unschedulable)"), "{message}");
        ensure!(
            waiting.status.as_ref().and_then(|s| s.node_name.as_deref()).is_none(),
            "not bound while it waits"
        );
        expect_event(env, "truthful-c", "FailedScheduling").await?;
    }
    // Uncordoned: the decision is taken again and the VM is placed.
    set_cordon(nodes, false).await?;
    let placed = wait_vm(
        env,
        "truthful-c",
        "a binding after the uncordon",
        Duration::from_secs(60),
        |v| v.status.as_ref().and_then(|s| s.node_name.as_deref()).is_some(),
    )
    .await?;
    let node = placed
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    ensure!(real_bootable || node == SIM, "truthful-c went to {node}");
    Ok(())
}
