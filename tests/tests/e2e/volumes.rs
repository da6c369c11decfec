//! Volumes on the real API server (SPEC 2.5, issue 57), where no kubelet and no scheduler run: a
//! SmolVM with volumes waits with VolumesReady=False naming why, rather than being created on
//! its node without its data. Its claim templates' claims are made before placement, labelled;
//! once its claims exist it is placed and its holder Pod is made, in the brief's shape, and stays
//! Pending (nothing schedules it here); deleting the SmolVM deletes the holder, keeps the
//! `Retain` claim and deletes the `Delete` one, and the finalizer goes.

use std::time::Duration;

use anyhow::{anyhow, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PostParams},
};
use serde_json::{Value, json};
use smolvm_api::{SmolVM, SmolVMNode, constants};
use smolvm_tests::env::{Env, NODE, eventually};

use crate::{
    NS, Scenario, condition, expect_event, kubectl_apply, small, smolvm_machines, vm, vms, wait_gone, wait_vm,
};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![volumes_wait_for_their_claims_and_holder_and_go_with_the_smolvm]
}

/// A claim of 1Gi that nothing binds (no provisioner runs here).
fn claim(name: &str) -> anyhow::Result<PersistentVolumeClaim> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))?)
}

fn template(when_deleted: &str) -> Value {
    json!({"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
           "whenDeleted": when_deleted})
}

/// Whether the node's agent reports a machine of `machine`, and smolvm holds one.
async fn on_node(env: &Env, machine: &str) -> anyhow::Result<bool> {
    let nodes: Api<SmolVMNode> = Api::all(env.admin().await?);
    let reported = nodes
        .get(NODE)
        .await?
        .status
        .and_then(|s| s.machines)
        .unwrap_or_default()
        .iter()
        .any(|m| m == machine);
    let held = smolvm_machines(&env.smolvm_socket())
        .await?
        .iter()
        .any(|m| m["name"] == machine);
    Ok(reported || held)
}

/// Waits until VolumesReady is False with `reason`; returns the SmolVM then.
async fn volumes_wait(env: &Env, name: &str, reason: &str) -> anyhow::Result<SmolVM> {
    wait_vm(
        env,
        name,
        &format!("VolumesReady=False {reason}"),
        Duration::from_secs(60),
        |v| {
            condition(v, constants::condition::VOLUMES_READY).is_some_and(|c| c.status == "False" && c.reason == reason)
        },
    )
    .await
}

async fn volumes_wait_for_their_claims_and_holder_and_go_with_the_smolvm(env: &mut Env) -> anyhow::Result<()> {
    let name = "vol-e2e";
    let admin = env.admin().await?;
    let configs: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let config: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "vol-e2e-config"}, "data": {"app.conf": "x=1"}}))?;
    match configs.create(&PostParams::default(), &config).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let mut spec = small(true);
    spec["volumes"] = json!([
        {"name": "db", "mountPath": "/var/lib/db", "persistentVolumeClaim": {"claimName": "vol-e2e-db"}},
        {"name": "config", "mountPath": "/etc/app", "configMap": {"name": "vol-e2e-config"}},
        {"name": "keep", "mountPath": "/keep", "claimTemplate": template("Retain")},
        {"name": "scratch", "mountPath": "/scratch", "claimTemplate": template("Delete")}
    ]);
    kubectl_apply(env, &vm(name, spec))?.map_err(|e| anyhow!("applying {name}: {e}"))?;

    // The claim does not exist: it waits, naming it, and nothing is created on the node.
    let waiting = volumes_wait(env, name, constants::reason::CLAIM_MISSING).await?;
    let said = condition(&waiting, constants::condition::VOLUMES_READY)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    ensure!(said.contains("vol-e2e-db"), "VolumesReady names the claim: {said}");
    println!("    VolumesReady=False ClaimMissing: {said}");
    let machine = waiting.machine_name().ok_or_else(|| anyhow!("no machine name"))?;
    ensure!(
        waiting.status.as_ref().and_then(|s| s.node_name.as_ref()).is_none(),
        "not placed while a claim is missing"
    );
    expect_event(env, name, constants::reason::CLAIM_MISSING).await?;

    // Its templates' claims were made before placement, labelled; the Delete one owned by it.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), NS);
    let uid = waiting.uid().unwrap_or_default();
    for (volume, owned) in [("keep", false), ("scratch", true)] {
        let made = claims.get(&format!("{name}-{volume}")).await?;
        let labels = made.labels();
        ensure!(
            labels.get(constants::volumes::LABEL_SMOLVM).map(String::as_str) == Some(name)
                && labels.get(constants::volumes::LABEL_VOLUME).map(String::as_str) == Some(volume),
            "claim {name}-{volume} labels: {labels:?}"
        );
        let is_owned = made.owner_references().iter().any(|r| r.uid == uid);
        ensure!(
            is_owned == owned,
            "claim {name}-{volume}: owned {is_owned}, wanted {owned}"
        );
    }
    println!("    claims {name}-keep (Retain) and {name}-scratch (Delete, owned) made before placement");

    // The claim appears: placed, and the holder is made, in the brief's shape; nothing schedules
    // it here, so it stays Pending and the VM waits for it.
    claims.create(&PostParams::default(), &claim("vol-e2e-db")?).await?;
    let pending = volumes_wait(env, name, constants::reason::HOLDER_PENDING).await?;
    let said = condition(&pending, constants::condition::VOLUMES_READY)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    println!("    VolumesReady=False HolderPending: {said}");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let holder = eventually("the holder Pod", Duration::from_secs(30), || async {
        Ok(pods.get_opt(&format!("{name}-holder")).await?)
    })
    .await?;
    check_holder(&holder, name, &uid)?;
    ensure!(
        said.contains(&format!("{NS}/{name}-holder")) && said.contains(NODE),
        "HolderPending names the holder and the node: {said}"
    );
    let ready = condition(&pending, constants::condition::READY);
    ensure!(
        ready.is_some_and(|c| c.status == "False" && c.reason == constants::reason::HOLDER_PENDING),
        "Ready waits for the volumes: {ready:?}"
    );
    ensure!(
        !on_node(env, &machine).await?,
        "machine {machine} exists on the node before its volumes are mounted"
    );
    println!("    holder Pod {name}-holder Pending (Guaranteed), machine {machine} not created on the node");

    // Deleted: the holder Pod goes, the Retain claim stays, the Delete claim goes, and the
    // finalizer is removed.
    vms(env).await?.delete(name, &DeleteParams::default()).await?;
    wait_gone(env, name, Duration::from_secs(60)).await?;
    ensure!(
        pods.get_opt(&format!("{name}-holder")).await?.is_none(),
        "the holder Pod is gone"
    );
    let kept = claims.get_opt(&format!("{name}-keep")).await?;
    ensure!(
        kept.as_ref().is_some_and(|c| c.metadata.deletion_timestamp.is_none()),
        "the Retain claim stays: {kept:?}"
    );
    // The API server's pvc-protection finalizer holds a deleted claim until the controller
    // manager (not run here) releases it: deleted is deletionTimestamp set, or gone.
    let scratch = claims.get_opt(&format!("{name}-scratch")).await?;
    ensure!(
        scratch.as_ref().is_none_or(|c| c.metadata.deletion_timestamp.is_some()),
        "the Delete claim is deleted: {scratch:?}"
    );
    println!("    deleted: holder gone, {name}-keep kept, {name}-scratch deleted, finalizer removed");

    for claim in ["vol-e2e-db", "vol-e2e-keep"] {
        let _ = claims.delete(claim, &DeleteParams::default()).await;
    }
    let _ = configs.delete("vol-e2e-config", &DeleteParams::default()).await;
    Ok(())
}

/// The holder Pod as the API server stored it: the brief's labels, annotation and owner, held to
/// the node by a required affinity (no nodeName), Guaranteed, the holders' priority, no token,
/// one `hold` container with the release hook, and every volume plus the identity volume.
fn check_holder(pod: &Pod, smolvm: &str, uid: &str) -> anyhow::Result<()> {
    let v = serde_json::to_value(pod)?;
    let labels = &v["metadata"]["labels"];
    ensure!(
        labels[constants::volumes::LABEL_SMOLVM] == smolvm && labels[constants::volumes::LABEL_HOLDER] == "true",
        "holder labels: {labels}"
    );
    ensure!(
        v["metadata"]["annotations"][constants::volumes::ANNOTATION_SMOLVM_UID] == uid,
        "holder annotation"
    );
    let owner = &v["metadata"]["ownerReferences"][0];
    ensure!(
        owner["uid"] == uid && owner["controller"] == true,
        "holder owner: {owner}"
    );
    let spec = &v["spec"];
    ensure!(
        spec.get("nodeName").is_none(),
        "a holder names no node: {}",
        spec["nodeName"]
    );
    ensure!(
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"]
            [0]
            == json!({"key": "metadata.name", "operator": "In", "values": [NODE]}),
        "holder affinity: {}",
        spec["affinity"]
    );
    ensure!(
        spec["priorityClassName"] == constants::volumes::PRIORITY_CLASS,
        "priority"
    );
    ensure!(spec["automountServiceAccountToken"] == false, "no token");
    let container = &spec["containers"][0];
    ensure!(
        container["name"] == "hold"
            && container["image"] == "smolvm-runtime"
            && container["command"] == json!(["/usr/local/bin/smolvm-runtime", "hold"]),
        "holder container: {container}"
    );
    let header = &container["lifecycle"]["preStop"]["httpGet"]["httpHeaders"][0];
    let token = header["value"].as_str().unwrap_or_default();
    ensure!(
        header["name"] == constants::volumes::RELEASE_TOKEN_HEADER
            && token.len() == 64
            && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "the release token: {header}"
    );
    let volumes: Vec<&str> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    ensure!(
        volumes == ["db", "config", "keep", "scratch", constants::volumes::IDENTITY_VOLUME],
        "holder volumes: {volumes:?}"
    );
    ensure!(
        v["status"]["qosClass"] == "Guaranteed" && v["status"]["phase"] == "Pending",
        "holder status: {}",
        v["status"]
    );
    Ok(())
}
