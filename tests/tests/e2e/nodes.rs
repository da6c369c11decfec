//! Truthful nodes: the real agent on this machine runs its guest boot check (a canary boot); no
//! guest boots here, so its SmolVMNode reports GuestBootable=False and takes no VM. A second,
//! simulated node (a SmolVMNode written by the test, as an agent whose guests boot would report
//! it, with a heartbeat the test keeps changing) takes the VMs. Cordoned, no node can run a new
//! VM: it waits, saying why in the scheduler's form, and is placed once the node is uncordoned.
//!
//! Node identity: a node's agent may set on its SmolVMNode only its own labels (V10); the
//! Node's labels reach the SmolVMNode through the controller, and a label an admin set there
//! stays.

use std::time::Duration;

use anyhow::{anyhow, ensure};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use smolvm_api::{SmolVMNode, constants};
use smolvm_tests::env::{self, Env, NODE, NODE_HOSTNAME, eventually};

use crate::{Scenario, condition, expect_event, kubectl_apply, small, vm, vms, wait_vm};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![
        a_node_that_cannot_boot_guests_takes_no_vm_and_an_unplaced_vm_says_why,
        a_node_sets_only_its_own_labels_and_the_controller_mirrors_the_nodes,
        a_node_whose_heartbeat_stops_is_told_lost_and_then_resumed,
    ]
}

/// A stopped agent cannot write its SmolVMNode (its `Ready` stays its last report), so the
/// controller tells it there: `HeartbeatLost` (Warning) once the heartbeat is stale past the
/// timeout (12 s here), `HeartbeatResumed` (Normal) once the agent beats again.
pub(crate) async fn a_node_whose_heartbeat_stops_is_told_lost_and_then_resumed(env: &mut Env) -> anyhow::Result<()> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.admin().await?);
    let since = k8s_openapi::jiff::Timestamp::now();
    let told = |reason: &'static str| {
        let events = events.clone();
        async move {
            let found = events.list(&Default::default()).await?.items.into_iter().find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NODE)
                    && e.reason.as_deref() == Some(reason)
                    && e.event_time.as_ref().is_some_and(|t| t.0 >= since)
            });
            Ok(found)
        }
    };
    env.stop_runtime();
    let outcome = async {
        let lost = eventually("HeartbeatLost on the SmolVMNode", Duration::from_secs(60), || {
            told(constants::reason::HEARTBEAT_LOST)
        })
        .await?;
        ensure!(
            lost.type_.as_deref() == Some("Warning"),
            "HeartbeatLost is a {:?} event",
            lost.type_
        );
        Ok(())
    }
    .await;
    env.start_runtime().await?;
    outcome?;
    let resumed = eventually("HeartbeatResumed on the SmolVMNode", Duration::from_secs(60), || {
        told(constants::reason::HEARTBEAT_RESUMED)
    })
    .await?;
    ensure!(
        resumed.type_.as_deref() == Some("Normal"),
        "HeartbeatResumed is a {:?} event",
        resumed.type_
    );
    Ok(())
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

/// The manager of the label `key` on `node`, from its managedFields (`None` when none owns it).
fn label_manager(node: &SmolVMNode, key: &str) -> Option<String> {
    node.metadata.managed_fields.iter().flatten().find_map(|entry| {
        let fields = entry.fields_v1.as_ref()?;
        fields.0["f:metadata"]["f:labels"]
            .get(format!("f:{key}"))
            .and(entry.manager.clone())
    })
}

fn label_of(node: &SmolVMNode, key: &str) -> Option<String> {
    node.metadata.labels.as_ref().and_then(|l| l.get(key).cloned())
}

/// Issue 56: a node's agent labels its own SmolVMNode `tenant: a` (to be handed tenant a's pools
/// and their Secrets) and is refused, naming the label and [V10], at UPDATE and at CREATE; its own
/// label `vm.smolvm.dev/guest-bootable` is admitted. A label put on the Node appears on the
/// SmolVMNode, written by the controller (its field manager owns it); a label an admin set on the
/// SmolVMNode survives, also when the Node gets the same key, and when the Node's labels go.
pub(crate) async fn a_node_sets_only_its_own_labels_and_the_controller_mirrors_the_nodes(
    env: &mut Env,
) -> anyhow::Result<()> {
    let admin = env.admin().await?;
    let smolvm_nodes: Api<SmolVMNode> = Api::all(admin.clone());
    let kube_nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    // The agent's identity: the runtime's ServiceAccount with a token bound to its Pod on NODE.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), env::NAMESPACE);
    let pod = pods.get(&format!("smolvm-runtime-{NODE}")).await?;
    let token = env::token_for(&admin, env::SA_RUNTIME, Some(&pod)).await?;
    let kubeconfig = env.plane.kubeconfig_for("runtime-own-labels", &token)?;

    // The Node's labels were mirrored by the controller when the agent registered.
    let mirrored = eventually(
        "the Node's hostname label on its SmolVMNode",
        Duration::from_secs(30),
        || {
            let smolvm_nodes = smolvm_nodes.clone();
            async move {
                let node = smolvm_nodes.get(NODE).await?;
                Ok((label_of(&node, "kubernetes.io/hostname").as_deref() == Some(NODE_HOSTNAME)).then_some(node))
            }
        },
    )
    .await?;
    ensure!(
        label_manager(&mirrored, "kubernetes.io/hostname").as_deref() == Some(constants::FIELD_MANAGER_CONTROLLER),
        "the Node's labels were not mirrored by the controller: {:?}",
        mirrored.metadata.managed_fields
    );

    // A tenant label on its own SmolVMNode: refused, naming the label, its value and the rule.
    let out = env::kubectl(&kubeconfig, &["label", "smolvmnode", NODE, "tenant=a"], None)?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(!out.status.success(), "a node labelled its own SmolVMNode tenant=a");
    ensure!(
        stderr.contains(r#"metadata.labels["tenant"]: "a""#) && stderr.contains("[V10]"),
        "{stderr}"
    );
    println!("    tenant=a by the node refused: {}", stderr.trim());
    ensure!(
        label_of(&smolvm_nodes.get(NODE).await?, "tenant").is_none(),
        "the refused label was stored"
    );
    // The same at CREATE (a server-side dry run: admission runs, nothing is stored).
    let labelled = json!({"apiVersion": constants::API_VERSION, "kind": constants::KIND_SMOLVM_NODE,
        "metadata": {"name": NODE, "labels": {"tenant": "a"}}, "spec": {}});
    let out = env::kubectl(
        &kubeconfig,
        &["create", "--dry-run=server", "-f", "-"],
        Some(&labelled.to_string()),
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(!out.status.success(), "a node created its SmolVMNode labelled tenant=a");
    ensure!(
        stderr.contains(r#"metadata.labels["tenant"]"#) && stderr.contains("[V10]"),
        "{stderr}"
    );

    // Its own label: admitted (the agent withdraws it at its next report: its check is off here).
    let own = format!("{}=true", constants::LABEL_GUEST_BOOTABLE);
    let out = env::kubectl(&kubeconfig, &["label", "--overwrite", "smolvmnode", NODE, &own], None)?;
    ensure!(
        out.status.success(),
        "the node's own label was refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let result = mirroring(&smolvm_nodes, &kube_nodes).await;
    // Leave the labels as they were, whatever happened.
    let cleared = json!({"metadata": {"labels": {TEAM: null, TENANT: null}}});
    let _ = kube_nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&cleared))
        .await;
    let _ = smolvm_nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&cleared))
        .await;
    result
}

const TEAM: &str = "e2e.smolvm.dev/team";
const TENANT: &str = "e2e.smolvm.dev/tenant";

async fn mirroring(
    smolvm_nodes: &Api<SmolVMNode>,
    kube_nodes: &Api<k8s_openapi::api::core::v1::Node>,
) -> anyhow::Result<()> {
    let label_node = |labels: serde_json::Value| async move {
        kube_nodes
            .patch(
                NODE,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .map(drop)
    };
    let wait_label = |key: &'static str, want: Option<&'static str>, what: &'static str| async move {
        eventually(what, Duration::from_secs(30), || async move {
            let node = smolvm_nodes.get(NODE).await?;
            Ok((label_of(&node, key).as_deref() == want).then_some(node))
        })
        .await
    };

    // A label put on the Node appears on its SmolVMNode, written by the controller.
    let started = std::time::Instant::now();
    label_node(json!({TEAM: "blue"})).await?;
    let node = wait_label(TEAM, Some("blue"), "the Node's new label on its SmolVMNode").await?;
    println!(
        "    the Node's label mirrored within {:.1}s",
        started.elapsed().as_secs_f64()
    );
    ensure!(
        label_manager(&node, TEAM).as_deref() == Some(constants::FIELD_MANAGER_CONTROLLER),
        "mirrored by another manager: {:?}",
        node.metadata.managed_fields
    );

    // An admin's label on the SmolVMNode stays, and wins when the Node gets the same key.
    smolvm_nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {TENANT: "admin-set"}}})),
        )
        .await?;
    label_node(json!({TENANT: "from-node", TEAM: "green"})).await?;
    let node = wait_label(TEAM, Some("green"), "the Node's changed label on its SmolVMNode").await?;
    ensure!(
        label_of(&node, TENANT).as_deref() == Some("admin-set"),
        "the admin's label was overwritten: {:?}",
        node.metadata.labels
    );

    // The Node's labels go: the mirrored one goes with them, the admin's stays.
    label_node(json!({TENANT: null, TEAM: null})).await?;
    let node = wait_label(TEAM, None, "the Node's removed label gone from its SmolVMNode").await?;
    ensure!(
        label_of(&node, TENANT).as_deref() == Some("admin-set"),
        "the admin's label went with the Node's: {:?}",
        node.metadata.labels
    );
    ensure!(
        label_of(&node, "kubernetes.io/hostname").as_deref() == Some(NODE_HOSTNAME),
        "an unrelated mirrored label went: {:?}",
        node.metadata.labels
    );
    Ok(())
}
