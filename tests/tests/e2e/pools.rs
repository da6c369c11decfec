//! SmolVMPools on the real API server: the example's pool goes in and reads well in `kubectl get
//! svmp`; the example's SmolVMs come back filled from the template, their own env after the
//! template's (M4); V14 refuses a pooled SmolVM that sets what a lease cannot carry (naming each
//! field), an unknown pool (listing the namespace's), a template out of the rules, and any change
//! to a stored pooled SmolVM but running and suspended.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, anyhow, ensure};
use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, ResourceExt,
    api::DeleteParams,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};
use smolvm_api::{SmolVM, SmolVMNode, SmolVMPool, constants, constants::LABEL_POOL};
use smolvm_testkit::smolvm_double::{DoubleHandle, SmolvmDouble};
use smolvm_tests::env::{Env, eventually, repo_root};

use crate::{NS, Scenario, delete_and_wait, dry_run_until_admitted, expect_rejected, kubectl_apply, patch_vm, vm, vms};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![
        pools_fill_a_smolvm_from_the_template_and_v14_guards_them,
        a_pool_keeps_its_slots_on_the_nodes_it_matches,
        a_drained_pool_serves_three_claims_warm_and_two_cold,
        a_pool_fills_only_spare_room_and_gives_it_back_to_another_tenant,
        a_hung_node_delays_only_its_own_pools,
        a_pool_whose_source_never_started_is_retired_with_it,
        a_pool_made_again_under_its_name_never_serves_a_smolvm_admitted_for_the_old_one
    ]
}

/// The objects of `deploy/examples/pool.yaml`, as JSON.
fn example() -> anyhow::Result<Vec<Value>> {
    let path = repo_root().join("deploy/examples/pool.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let mut value = <Value as serde::Deserialize>::deserialize(doc)?;
        if !value.is_null() {
            value["metadata"]["namespace"] = json!(NS);
            out.push(value);
        }
    }
    Ok(out)
}

fn pool(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMPool", "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

async fn pools_fill_a_smolvm_from_the_template_and_v14_guards_them(env: &mut Env) -> anyhow::Result<()> {
    let objects = example()?;
    let (pools, claims): (Vec<Value>, Vec<Value>) = objects.into_iter().partition(|o| o["kind"] == "SmolVMPool");
    ensure!(
        pools.len() == 1 && claims.len() == 2,
        "the example has a pool and two SmolVMs"
    );
    kubectl_apply(env, &pools[0])?.map_err(|e| anyhow!("applying the example's pool: {e}"))?;
    let out = env.kubectl(&["get", "svmp", "sandboxes", "-n", NS], None)?;
    let table = String::from_utf8_lossy(&out.stdout);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    ensure!(
        header == ["NAME", "SLOTS/NODE", "READY", "TOTAL", "WHEN", "EMPTY", "AGE"],
        "kubectl get svmp: {table}"
    );
    println!("    kubectl get svmp: {}", table.lines().nth(1).unwrap_or_default());

    // The webhook's pool cache follows the API within moments; the example's SmolVMs, checked
    // with a server-side dry run, come back filled from the template.
    for claim in &claims {
        let name = claim["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let out = dry_run_until_admitted(env, claim, &format!("{name} filled from its pool")).await?;
        ensure!(out["spec"]["image"] == "python:3.12-slim", "{name}: {}", out["spec"]);
        ensure!(
            out["spec"]["resources"] == json!({"cpus": 1, "memoryMiB": 1024}),
            "{name}: {}",
            out["spec"]
        );
        let env_names: Vec<&str> = out["spec"]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["name"].as_str())
            .collect();
        ensure!(env_names == ["PYTHONUNBUFFERED", "JOB_ID"], "{name}: env {env_names:?}");
        ensure!(
            out["metadata"]["labels"][LABEL_POOL] == "sandboxes",
            "{name}: {}",
            out["metadata"]
        );
    }
    println!("    the example's SmolVMs take the template's image, size and env, their JOB_ID after it");

    // V14: a pooled SmolVM sets only poolRef, env, running and suspended; each other field is
    // named, with the filled object's own violations in the same answer.
    let stderr = expect_rejected(
        env,
        &vm(
            "greedy",
            json!({"poolRef": {"name": "sandboxes"}, "image": "alpine:3.20", "nodeName": "elsewhere"}),
        ),
        &["spec.image", "spec.nodeName", "V14"],
    )?;
    println!(
        "    a pooled SmolVM setting its image and a pin: {}",
        first_line(&stderr)
    );
    expect_rejected(
        env,
        &vm("lost", json!({"poolRef": {"name": "gpus"}})),
        &["spec.poolRef.name", "V14", "sandboxes"],
    )?;
    // V14 on pools: a template out of the rules, all at once, and slots beyond the policy.
    let stderr = expect_rejected(
        env,
        &pool(
            "broken",
            json!({"slotsPerNode": 100, "template": {"image": "alpine:3.20", "resources": {"cpus": 99},
                "network": {"enabled": true, "ports": [{"hostPort": 8080, "guestPort": 80}]}}}),
        ),
        &[
            "spec.template.resources.cpus",
            "spec.template.network.ports",
            "spec.slotsPerNode",
            "V14",
        ],
    )?;
    println!("    a pool out of the rules: {}", first_line(&stderr));

    // A stored pooled SmolVM (a small pool of our own: the node's disk is the machine's real one).
    let tiny = pool(
        "e2e-tiny",
        json!({"slotsPerNode": 0, "template": {"image": "alpine:3.20", "resources": {"memoryMiB": 128},
            "storage": {"storageGiB": 1, "overlayGiB": 1}}}),
    );
    kubectl_apply(env, &tiny)?.map_err(|e| anyhow!("applying e2e-tiny: {e}"))?;
    let claim = vm("pooled", json!({"poolRef": {"name": "e2e-tiny"}, "running": false}));
    let text = serde_json::to_string(&claim)?;
    eventually("pooled stored", Duration::from_secs(30), || async {
        let out = env.kubectl(&["apply", "-f", "-"], Some(&text))?;
        Ok(out.status.success().then_some(()))
    })
    .await?;
    let stored = vms(env).await?.get("pooled").await?;
    ensure!(
        stored.spec.image == "alpine:3.20" && stored.spec.storage.as_ref().and_then(|s| s.storage_gib) == Some(1),
        "pooled: {:?}",
        stored.spec
    );
    for (patch, needle) in [
        (r#"{"spec":{"resources":{"cpus":2}}}"#, "spec.resources"),
        (r#"{"spec":{"poolRef":{"name":"sandboxes"}}}"#, "spec.poolRef"),
    ] {
        let out = patch_vm(env, "pooled", patch)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains(needle) && stderr.contains("V14"),
            "{patch}: {stderr}"
        );
    }
    let out = patch_vm(env, "pooled", r#"{"spec":{"suspended":true}}"#)?;
    ensure!(
        out.status.success(),
        "suspended may change: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("    a stored pooled SmolVM: resize and another pool refused (V14), suspended accepted");

    delete_and_wait(env, "pooled").await?;
    for name in ["e2e-tiny", "sandboxes"] {
        let out = env.kubectl(&["delete", "svmp", name, "-n", NS, "--wait=false"], None)?;
        ensure!(
            out.status.success(),
            "deleting {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The node backed by the smolvm double (its machines "boot" at once).
const DOUBLE_NODE: &str = "pool-double-node";

/// A pool's slots kept on a matching node: the controller asks the node's agent, which makes
/// the source and smolvm's pool; the pool's status counts the ready slots per node and says
/// Ready; a new template replaces the node pool; a deleted pool's node pool goes.
async fn a_pool_keeps_its_slots_on_the_nodes_it_matches(env: &mut Env) -> anyhow::Result<()> {
    // Room for the source and 2 slots of a CPU each, whatever this machine has: a pool fills
    // only the room there is.
    let node = env
        .start_on_double(DOUBLE_NODE, &["--cpu-allocation-ratio=8", "--reserved-cpus=0"])
        .await?;
    let outcome = keep_slots(env, &node.double).await;
    let _ = env.kubectl(&["delete", "svmp", "warm", "-n", NS, "--wait=false"], None);
    node.stop(env).await;
    outcome
}

async fn keep_slots(env: &mut Env, double: &DoubleHandle) -> anyhow::Result<()> {
    let warm = pool(
        "warm",
        json!({"slotsPerNode": 2, "nodeSelector": {"kubernetes.io/hostname": DOUBLE_NODE},
            "template": {"image": "alpine:3.20", "resources": {"memoryMiB": 128}, "storage": {"storageGiB": 1, "overlayGiB": 1}}}),
    );
    kubectl_apply(env, &warm)?.map_err(|e| anyhow!("applying the pool: {e}"))?;
    let pools: Api<SmolVMPool> = Api::namespaced(env.admin().await?, NS);
    let ready = |p: &SmolVMPool| {
        let status = p.status.as_ref();
        let condition = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == constants::condition::READY));
        status.and_then(|s| s.ready_slots) == Some(2)
            && condition.is_some_and(|c| c.reason == constants::reason::SLOTS_READY)
    };
    let got = eventually(
        "the pool's 2 slots ready on the double's node",
        Duration::from_secs(60),
        || {
            let pools = pools.clone();
            async move { Ok(pools.get("warm").await.ok().filter(|p| ready(p))) }
        },
    )
    .await?;
    let first = got.status.as_ref().map(|s| s.nodes.clone()).unwrap_or_default();
    ensure!(
        first.len() == 1 && first[0].node_name == DOUBLE_NODE && first[0].ready == 2,
        "{first:?}"
    );
    let name_of = |p: &SmolVMPool| {
        format!(
            "pool-{}-g{}",
            p.metadata.uid.clone().unwrap_or_default(),
            p.metadata.generation.unwrap_or(0)
        )
    };
    let node_pool = name_of(&got);
    ensure!(
        double.pool(&node_pool).is_some_and(|p| p.ready == 2),
        "smolvm keeps {node_pool}"
    );
    println!("    {node_pool}: 2 slots ready on {DOUBLE_NODE}, Ready=True SlotsReady");

    // A new template: a new node pool; the old one goes (it serves nothing).
    let out = env.kubectl(
        &[
            "patch",
            "svmp",
            "warm",
            "-n",
            NS,
            "--type=merge",
            "-p",
            r#"{"spec":{"template":{"args":["v2"]}}}"#,
        ],
        None,
    )?;
    ensure!(
        out.status.success(),
        "patching the template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let renewed = eventually(
        "the new template's slots ready, the old node pool gone",
        Duration::from_secs(60),
        || {
            let pools = pools.clone();
            let old = node_pool.clone();
            async move {
                let p = pools.get("warm").await?;
                let new = name_of(&p);
                Ok(
                    (new != old && double.pool(&new).is_some_and(|x| x.ready == 2) && double.pool(&old).is_none())
                        .then_some(new),
                )
            }
        },
    )
    .await?;
    println!("    a new template: {renewed} replaced {node_pool}");

    // The pool deleted: its node pool goes with it.
    let out = env.kubectl(&["delete", "svmp", "warm", "-n", NS], None)?;
    ensure!(
        out.status.success(),
        "deleting the pool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("the deleted pool's node pool gone", Duration::from_secs(60), || {
        let renewed = renewed.clone();
        async move { Ok(double.pool(&renewed).is_none().then_some(())) }
    })
    .await?;
    Ok(())
}

/// The node of the claims scenario, backed by its own double.
const CLAIMS_NODE: &str = "claims-double-node";

/// The issue's walk: a pool of 3 slots per node with `whenEmpty: Cold`; 5 SmolVMs claim while
/// refill is held: 3 are served warm from the slots (each with its own env), 2 are created cold;
/// once refill runs the pool is back to 3 ready; deleting the SmolVMs ends their leases.
async fn a_drained_pool_serves_three_claims_warm_and_two_cold(env: &mut Env) -> anyhow::Result<()> {
    let socket = env.dir().join("claims-double.sock");
    let double = SmolvmDouble::start(&socket)
        .await
        .context("starting the smolvm double")?;
    // Room for the pool (its source and 3 slots, booked by the controller) and the five claims,
    // one CPU each, whatever this machine has.
    let extra = ["--cpu-allocation-ratio=8", "--reserved-cpus=0"];
    let mut agent = env.start_double_node(CLAIMS_NODE, &socket, &extra).await?;
    let outcome = claims(env, &double).await;
    for i in 1..=5 {
        let _ = delete_and_wait(env, &format!("claim-{i}")).await;
    }
    let _ = env.kubectl(&["delete", "svmp", "claims", "-n", NS, "--wait=false"], None);
    agent.terminate(Duration::from_secs(10));
    let _ = Api::<SmolVMNode>::all(env.admin().await?)
        .delete(CLAIMS_NODE, &DeleteParams::default())
        .await;
    outcome
}

async fn claims(env: &mut Env, double: &DoubleHandle) -> anyhow::Result<()> {
    let claims_pool = pool(
        "claims",
        json!({"slotsPerNode": 3, "whenEmpty": "Cold", "nodeSelector": {"kubernetes.io/hostname": CLAIMS_NODE},
            "template": {"image": "alpine:3.20", "resources": {"memoryMiB": 128}, "storage": {"storageGiB": 1, "overlayGiB": 1}}}),
    );
    kubectl_apply(env, &claims_pool)?.map_err(|e| anyhow!("applying the pool: {e}"))?;
    let pools: Api<SmolVMPool> = Api::namespaced(env.admin().await?, NS);
    let ready_slots = |pools: Api<SmolVMPool>| async move {
        Ok::<_, anyhow::Error>(pools.get("claims").await?.status.and_then(|s| s.ready_slots))
    };
    eventually("the pool's 3 slots ready", Duration::from_secs(60), || {
        let pools = pools.clone();
        async move { Ok((ready_slots(pools).await? == Some(3)).then_some(())) }
    })
    .await?;
    double.hold_refill(true);
    let bound_versions = BoundVersions::watch(env).await?;
    for i in 1..=5 {
        let claim = vm(
            &format!("claim-{i}"),
            json!({"poolRef": {"name": "claims"}, "env": [{"name": "JOB", "value": i.to_string()}]}),
        );
        let text = serde_json::to_string(&claim)?;
        eventually(&format!("claim-{i} stored"), Duration::from_secs(30), || async {
            let out = env.kubectl(&["apply", "-f", "-"], Some(&text))?;
            Ok(out.status.success().then_some(()))
        })
        .await?;
    }
    let mut machines = Vec::new();
    for i in 1..=5 {
        let name = format!("claim-{i}");
        let running = crate::wait_vm(env, &name, &format!("{name} running"), Duration::from_secs(60), |v| {
            v.status.as_ref().and_then(|s| s.phase) == Some(smolvm_api::Phase::Running)
        })
        .await?;
        let machine = running.status.and_then(|s| s.machine_name).unwrap_or_default();
        machines.push((i, machine));
    }
    let leases = double.leases();
    let warm: Vec<&(i32, String)> = machines
        .iter()
        .filter(|(_, m)| leases.iter().any(|l| &l.key == m))
        .collect();
    // A cold one is a machine of its own name in smolvm; a warm one is a slot's worker.
    let cold: Vec<&(i32, String)> = machines
        .iter()
        .filter(|(_, m)| double.state(m).as_deref() == Some("running"))
        .collect();
    ensure!(
        warm.len() == 3 && cold.len() == 2,
        "3 warm and 2 cold: warm {warm:?}, cold {cold:?}, leases {leases:?}"
    );
    for (i, machine) in &warm {
        let worker = leases
            .iter()
            .find(|l| &l.key == machine)
            .map(|l| l.machine.clone())
            .unwrap_or_default();
        let env_of = double.env(&worker).unwrap_or_default();
        ensure!(
            env_of.contains(&format!("JOB={i}")),
            "claim-{i}'s lease carried its env: {env_of:?}"
        );
    }
    println!("    5 claims while refill was held: 3 served warm from the slots, 2 created cold");
    // A warm claim's binding rides on its one status write: none of its versions is bound
    // without running, and its one event, ServedFromPool, tells the binding (no Scheduled).
    for (i, _) in &warm {
        let name = format!("claim-{i}");
        let phases = bound_versions.phases(&name);
        ensure!(
            phases.first() == Some(&Some(smolvm_api::Phase::Running)),
            "{name} (served warm) was bound and Running in one write; its bound versions' phases: {phases:?}"
        );
        let served = crate::expect_event(env, &name, constants::reason::SERVED_FROM_POOL).await?;
        // The controller's client names itself, so its status write is attributed to it.
        let stored = Api::<SmolVM>::namespaced(env.admin().await?, NS).get(&name).await?;
        let node = stored.bound_node().unwrap_or_default().to_string();
        let note = served.note.unwrap_or_default();
        ensure!(
            !node.is_empty() && note.contains(&node),
            "{name}'s ServedFromPool event names its node {node:?}: {note}"
        );
        let reasons: Vec<String> = crate::events_for(env, &name)
            .await?
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        ensure!(
            !reasons.iter().any(|r| r == "Scheduled"),
            "{name} (served warm) has one event for its claim, not a Scheduled one too: {reasons:?}"
        );
        let managers: Vec<(Option<String>, Option<String>)> = stored
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .map(|m| (m.manager, m.subresource))
            .collect();
        ensure!(
            managers.contains(&(Some("smolvm-controller".into()), Some("status".into()))),
            "{name}'s status is managed by smolvm-controller: {managers:?}"
        );
    }
    println!("    each warm claim was bound and Running in one status write by smolvm-controller, with its events");

    double.hold_refill(false);
    eventually("the pool back to 3 ready slots", Duration::from_secs(60), || {
        let pools = pools.clone();
        async move { Ok((ready_slots(pools).await? == Some(3)).then_some(())) }
    })
    .await?;
    println!("    refill released: the pool is back to 3 ready slots");

    for i in 1..=5 {
        delete_and_wait(env, &format!("claim-{i}")).await?;
    }
    let active = double.leases().into_iter().filter(|l| l.state == "active").count();
    ensure!(
        active == 0,
        "deleting the claims ended their leases: {:?}",
        double.leases()
    );
    Ok(())
}

/// A SmolVM's name and phase in one of its versions.
type BoundVersion = (String, Option<smolvm_api::Phase>);

/// The phase of every version of the namespace's SmolVMs that the API server stored bound to a
/// node, in order, from a watch started before they were made. (A watch that restarted could
/// miss versions; it never invents one.)
struct BoundVersions {
    seen: Arc<Mutex<Vec<BoundVersion>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl BoundVersions {
    async fn watch(env: &Env) -> anyhow::Result<Self> {
        let api: Api<SmolVM> = Api::namespaced(env.admin().await?, NS);
        let seen: Arc<Mutex<Vec<BoundVersion>>> = Arc::default();
        let watch = tokio::spawn({
            let seen = seen.clone();
            async move {
                let mut events = watcher(api, watcher::Config::default()).applied_objects().boxed();
                while let Ok(Some(vm)) = events.try_next().await {
                    if let Some(status) = vm.status.as_ref().filter(|s| s.node_name.is_some()) {
                        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                        seen.push((vm.metadata.name.clone().unwrap_or_default(), status.phase));
                    }
                }
            }
        });
        Ok(BoundVersions { seen, watch })
    }

    /// The phases of `name`'s bound versions, oldest first.
    fn phases(&self, name: &str) -> Vec<Option<smolvm_api::Phase>> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter().filter(|(n, _)| n == name).map(|(_, p)| *p).collect()
    }
}

impl Drop for BoundVersions {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// The node of the capacity scenario, backed by its own double.
const SPARE_NODE: &str = "spare-double-node";
/// The namespace of the other tenant's SmolVM.
const OTHER_NS: &str = "e2e-other-tenant";

/// The issue's reproduction on the real API server: a pool whose template takes a quarter of a
/// node's CPUs and asks for 16 slots there keeps its source and the 3 slots that fit (the
/// spare room), saying the rest have no room; another namespace's SmolVM that needs the rest of
/// the node is placed there by taking the slots' room: the node deletes them before the VM's
/// machine is created, the pool's event names the slots, the node and the SmolVM, and its status
/// shows the slots it now has. Once the SmolVM goes, the pool fills the room again.
async fn a_pool_fills_only_spare_room_and_gives_it_back_to_another_tenant(env: &mut Env) -> anyhow::Result<()> {
    let socket = env.dir().join("spare-double.sock");
    let double = SmolvmDouble::start(&socket)
        .await
        .context("starting the smolvm double")?;
    let extra = ["--cpu-allocation-ratio=8", "--reserved-cpus=0"];
    let mut agent = env.start_double_node(SPARE_NODE, &socket, &extra).await?;
    let outcome = spare_room(env, &double).await;
    if let Ok(admin) = env.admin().await {
        let _ = Api::<SmolVM>::namespaced(admin.clone(), OTHER_NS)
            .delete("tenant-b", &DeleteParams::default())
            .await;
    }
    let _ = env.kubectl(&["delete", "svmp", "spare", "-n", NS, "--wait=false"], None);
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.terminate(Duration::from_secs(10));
    let _ = Api::<SmolVMNode>::all(env.admin().await?)
        .delete(SPARE_NODE, &DeleteParams::default())
        .await;
    outcome
}

async fn spare_room(env: &mut Env, double: &DoubleHandle) -> anyhow::Result<()> {
    let admin = env.admin().await?;
    let nodes: Api<SmolVMNode> = Api::all(admin.clone());
    let node = eventually(
        "the double's node reports its allocatable",
        Duration::from_secs(60),
        || {
            let nodes = nodes.clone();
            async move {
                Ok(nodes
                    .get_opt(SPARE_NODE)
                    .await?
                    .filter(|n| n.status.as_ref().and_then(|s| s.allocatable).is_some()))
            }
        },
    )
    .await?;
    let cpus = node.status.as_ref().and_then(|s| s.allocatable).map_or(0, |a| a.cpus);
    ensure!(
        cpus >= 8,
        "the double's node has {cpus} CPUs; the scenario needs 8 or more"
    );
    // A quarter of the node per machine: the source and 3 slots fill it.
    let each = cpus / 4;
    let fitting = (cpus - each) / each;
    let spare = pool(
        "spare",
        json!({"slotsPerNode": 16, "whenEmpty": "Cold", "nodeSelector": {"kubernetes.io/hostname": SPARE_NODE},
            "template": {"image": "alpine:3.20", "resources": {"cpus": each, "memoryMiB": 128},
                "storage": {"storageGiB": 1, "overlayGiB": 1}}}),
    );
    kubectl_apply(env, &spare)?.map_err(|e| anyhow!("applying the pool: {e}"))?;
    let pools: Api<SmolVMPool> = Api::namespaced(admin.clone(), NS);
    let filled = eventually(
        "the pool's source and the slots that fit ready",
        Duration::from_secs(60),
        || {
            let pools = pools.clone();
            async move {
                let p = pools.get("spare").await?;
                let ready = p.status.as_ref().and_then(|s| s.ready_slots);
                Ok((ready == Some(fitting as i32)).then_some(p))
            }
        },
    )
    .await?;
    let node_pool = format!(
        "pool-{}-g{}",
        filled.metadata.uid.clone().unwrap_or_default(),
        filled.metadata.generation.unwrap_or(0)
    );
    let status = filled.status.clone().unwrap_or_default();
    ensure!(
        status.total_slots == Some(fitting as i32) && status.nodes.first().is_some_and(|n| n.total == fitting as i32),
        "only the slots that fit are wanted: {status:?}"
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == constants::condition::READY);
    ensure!(
        ready.is_some_and(|c| c.reason == constants::reason::SLOTS_READY && c.message.contains("have no room")),
        "the pool says the rest have no room: {ready:?}"
    );
    ensure!(
        double.pool(&node_pool).is_some_and(|p| p.desired == fitting as u32),
        "smolvm keeps {fitting} of {node_pool}: {:?}",
        double.pool(&node_pool)
    );
    println!(
        "    {cpus} CPUs, {each} per machine: the source and {fitting} of 16 slots, the rest said to have no room"
    );

    // Another tenant's SmolVM that needs all but the source's room.
    let out = env.kubectl(&["create", "namespace", OTHER_NS], None)?;
    ensure!(
        out.status.success() || String::from_utf8_lossy(&out.stderr).contains("AlreadyExists"),
        "creating {OTHER_NS}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    double.clear_calls();
    let mut tenant = vm(
        "tenant-b",
        json!({"image": "alpine:3.20", "resources": {"cpus": cpus - each, "memoryMiB": 256},
            "storage": {"storageGiB": 1, "overlayGiB": 1}, "nodeSelector": {"kubernetes.io/hostname": SPARE_NODE}}),
    );
    tenant["metadata"]["namespace"] = json!(OTHER_NS);
    let text = serde_json::to_string(&tenant)?;
    eventually("tenant-b stored", Duration::from_secs(30), || async {
        let out = env.kubectl(&["apply", "-f", "-"], Some(&text))?;
        Ok(out.status.success().then_some(()))
    })
    .await?;
    let others: Api<SmolVM> = Api::namespaced(admin.clone(), OTHER_NS);
    let running = eventually("tenant-b running on the pool's node", Duration::from_secs(60), || {
        let others = others.clone();
        async move {
            Ok(others
                .get_opt("tenant-b")
                .await?
                .filter(|v| v.status.as_ref().and_then(|s| s.phase) == Some(smolvm_api::Phase::Running)))
        }
    })
    .await;
    let running = match running {
        Ok(vm) => vm,
        Err(e) => {
            let status = others.get_opt("tenant-b").await?.and_then(|v| v.status);
            return Err(anyhow!("{e:#}; tenant-b's status: {}", serde_json::to_string(&status)?));
        }
    };
    ensure!(
        running.bound_node() == Some(SPARE_NODE),
        "bound to {:?}",
        running.bound_node()
    );
    let machine = running
        .status
        .as_ref()
        .and_then(|s| s.machine_name.clone())
        .unwrap_or_default();
    let calls = double.calls();
    let resized = calls
        .iter()
        .position(|c| c.operation == "resize_pool" && c.machine.as_deref() == Some(node_pool.as_str()));
    let created = calls.iter().position(|c| c.operation == "create_machine").or_else(|| {
        calls
            .iter()
            .position(|c| c.machine.as_deref() == Some(machine.as_str()))
    });
    ensure!(
        matches!((resized, created), (Some(r), Some(c)) if r < c),
        "the node gave the slots back before it created the machine: resize at {resized:?}, create at {created:?}"
    );
    ensure!(
        double.pool(&node_pool).is_some_and(|p| p.desired == 0 && p.ready == 0),
        "smolvm keeps none of the pool's slots now: {:?}",
        double.pool(&node_pool)
    );
    let given = crate::expect_event(env, "spare", constants::reason::SLOTS_GIVEN_BACK).await?;
    let note = given.note.unwrap_or_default();
    ensure!(
        note.contains(SPARE_NODE) && note.contains(&fitting.to_string()) && note.contains("tenant-b"),
        "the event names the node, the slots and the SmolVM: {note}"
    );
    let now_has = eventually(
        "the pool's status shows the slots it now has",
        Duration::from_secs(60),
        || {
            let pools = pools.clone();
            async move {
                let p = pools.get("spare").await?;
                Ok(p.status
                    .filter(|s| s.total_slots == Some(0) && s.ready_slots == Some(0)))
            }
        },
    )
    .await?;
    println!(
        "    tenant-b ({} CPUs) took the room of {fitting} ready slots (deleted first); the pool now wants {:?}: {note}",
        cpus - each,
        now_has.total_slots
    );

    // The SmolVM goes: the pool fills the spare room again.
    others.delete("tenant-b", &DeleteParams::default()).await?;
    eventually(
        "the pool refilled once the room is back",
        Duration::from_secs(90),
        || {
            let pools = pools.clone();
            async move {
                let p = pools.get("spare").await?;
                Ok((p.status.and_then(|s| s.ready_slots) == Some(fitting as i32)).then_some(()))
            }
        },
    )
    .await?;
    println!("    tenant-b deleted: the pool's {fitting} slots are back");
    Ok(())
}

/// The nodes of the hung-node scenario, each backed by its own double.
const HUNG_NODE: &str = "hung-double-node";
const BUSY_NODE: &str = "busy-double-node";

/// One node whose smolvm never answers a start keeps only its own pool from filling: the other
/// node's pool fills, serves a claim and refills at once (its calls run beside the hung node's,
/// which are given up after the per-call timeout and retried with a backoff). The hung pool is
/// named to come first in a pass.
async fn a_hung_node_delays_only_its_own_pools(env: &mut Env) -> anyhow::Result<()> {
    let hung_socket = env.dir().join("hung-double.sock");
    let hung = SmolvmDouble::start(&hung_socket)
        .await
        .context("starting the hung double")?;
    hung.set_delay("start_machine", Duration::from_secs(3600));
    let busy_socket = env.dir().join("busy-double.sock");
    let busy = SmolvmDouble::start(&busy_socket)
        .await
        .context("starting the busy double")?;
    let extra = ["--cpu-allocation-ratio=8", "--reserved-cpus=0"];
    let mut hung_agent = env.start_double_node(HUNG_NODE, &hung_socket, &extra).await?;
    let mut busy_agent = env.start_double_node(BUSY_NODE, &busy_socket, &extra).await?;
    let outcome = hung_node(env, &busy).await;
    let _ = delete_and_wait(env, "hung-claim").await;
    for name in ["a-hung", "b-busy"] {
        let _ = env.kubectl(&["delete", "svmp", name, "-n", NS, "--wait=false"], None);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    hung_agent.terminate(Duration::from_secs(10));
    busy_agent.terminate(Duration::from_secs(10));
    let admin = env.admin().await?;
    for node in [HUNG_NODE, BUSY_NODE] {
        let _ = Api::<SmolVMNode>::all(admin.clone())
            .delete(node, &DeleteParams::default())
            .await;
    }
    outcome
}

async fn hung_node(env: &mut Env, busy: &DoubleHandle) -> anyhow::Result<()> {
    let template =
        json!({"image": "alpine:3.20", "resources": {"memoryMiB": 128}, "storage": {"storageGiB": 1, "overlayGiB": 1}});
    for (name, node) in [("a-hung", HUNG_NODE), ("b-busy", BUSY_NODE)] {
        let object = pool(
            name,
            json!({"slotsPerNode": 2, "whenEmpty": "Cold", "nodeSelector": {"kubernetes.io/hostname": node}, "template": template}),
        );
        kubectl_apply(env, &object)?.map_err(|e| anyhow!("applying {name}: {e}"))?;
    }
    let pools: Api<SmolVMPool> = Api::namespaced(env.admin().await?, NS);
    let ready_slots = |name: &'static str| {
        let pools = pools.clone();
        async move { Ok::<_, anyhow::Error>(pools.get(name).await?.status.and_then(|s| s.ready_slots)) }
    };
    let started = std::time::Instant::now();
    eventually(
        "b-busy's 2 slots ready while a-hung's node hangs",
        Duration::from_secs(60),
        || async { Ok((ready_slots("b-busy").await? == Some(2)).then_some(())) },
    )
    .await?;
    println!("    b-busy filled in {:?} while a-hung's node hangs", started.elapsed());
    let claim = vm("hung-claim", json!({"poolRef": {"name": "b-busy"}}));
    let text = serde_json::to_string(&claim)?;
    eventually("hung-claim stored", Duration::from_secs(30), || async {
        let out = env.kubectl(&["apply", "-f", "-"], Some(&text))?;
        Ok(out.status.success().then_some(()))
    })
    .await?;
    crate::wait_vm(env, "hung-claim", "hung-claim running", Duration::from_secs(60), |v| {
        v.status.as_ref().and_then(|s| s.phase) == Some(smolvm_api::Phase::Running)
    })
    .await?;
    ensure!(
        busy.leases().iter().any(|l| l.state == "active"),
        "hung-claim was served warm: {:?}",
        busy.leases()
    );
    let claimed = std::time::Instant::now();
    // The agent lowered the pool's slots at the lease; the controller's refill brings it back,
    // however long the hung node's calls take (far beyond this wait).
    let node_pool = {
        let p = pools.get("b-busy").await?;
        format!(
            "pool-{}-g{}",
            p.metadata.uid.clone().unwrap_or_default(),
            p.metadata.generation.unwrap_or(0)
        )
    };
    eventually(
        "b-busy refilled while a-hung's node still hangs",
        Duration::from_secs(30),
        || async {
            // The lease is the slot that went; the refill is a new ready worker beside it.
            Ok(busy
                .pool(&node_pool)
                .filter(|p| p.active == 1 && p.ready == 2 && p.desired == 2)
                .map(|_| ()))
        },
    )
    .await?;
    ensure!(
        busy.calls_of("resize_pool")
            .iter()
            .any(|c| c.machine.as_deref() == Some(node_pool.as_str())),
        "the agent lowered the pool's slots at the lease (the refill is the controller's)"
    );
    let hung = pools.get("a-hung").await?;
    let ready = hung
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == constants::condition::READY));
    ensure!(
        ready.is_some_and(|c| c.status == "False"),
        "a-hung is not ready: {ready:?}"
    );
    println!(
        "    b-busy refilled {:?} after the claim; a-hung still not ready ({})",
        claimed.elapsed(),
        ready.map(|c| c.reason.as_str()).unwrap_or_default()
    );
    Ok(())
}

/// The node of the never-started scenario, backed by its own double.
const NEVER_NODE: &str = "never-double-node";

/// A pool whose source never starts (smolvm fails every start) is reported by its node all the
/// same; deleting the SmolVMPool retires it there: the agent's record and the source go.
async fn a_pool_whose_source_never_started_is_retired_with_it(env: &mut Env) -> anyhow::Result<()> {
    let socket = env.dir().join("never-double.sock");
    let double = SmolvmDouble::start(&socket)
        .await
        .context("starting the smolvm double")?;
    double.fail_next("start_machine", "*", u32::MAX);
    let mut agent = env.start_double_node(NEVER_NODE, &socket, &[]).await?;
    let outcome = never_started(env, &double).await;
    let _ = env.kubectl(&["delete", "svmp", "never", "-n", NS, "--wait=false"], None);
    agent.terminate(Duration::from_secs(10));
    let _ = Api::<SmolVMNode>::all(env.admin().await?)
        .delete(NEVER_NODE, &DeleteParams::default())
        .await;
    outcome
}

async fn never_started(env: &mut Env, double: &DoubleHandle) -> anyhow::Result<()> {
    let never = pool(
        "never",
        json!({"slotsPerNode": 1, "nodeSelector": {"kubernetes.io/hostname": NEVER_NODE},
            "template": {"image": "alpine:3.20", "resources": {"memoryMiB": 128}, "storage": {"storageGiB": 1, "overlayGiB": 1}}}),
    );
    kubectl_apply(env, &never)?.map_err(|e| anyhow!("applying the pool: {e}"))?;
    let admin = env.admin().await?;
    let pools: Api<SmolVMPool> = Api::namespaced(admin.clone(), NS);
    let failing = eventually("the pool's slots failing on the node", Duration::from_secs(60), || {
        let pools = pools.clone();
        async move {
            let p = pools.get("never").await?;
            let failing = p.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == constants::condition::READY && c.reason == constants::reason::SLOTS_FAILING)
            });
            Ok(failing.then_some(p))
        }
    })
    .await?;
    let node_pool = format!(
        "pool-{}-g{}",
        failing.metadata.uid.clone().unwrap_or_default(),
        failing.metadata.generation.unwrap_or(0)
    );
    let nodes: Api<SmolVMNode> = Api::all(admin.clone());
    let reports = |nodes: Api<SmolVMNode>, name: String| async move {
        let node = nodes.get(NEVER_NODE).await?;
        Ok::<_, anyhow::Error>(
            node.status
                .and_then(|s| s.pools)
                .unwrap_or_default()
                .iter()
                .any(|p| p.name == name),
        )
    };
    eventually(
        "the node reports the pool it never started",
        Duration::from_secs(60),
        || {
            let (nodes, name) = (nodes.clone(), node_pool.clone());
            async move { Ok(reports(nodes, name).await?.then_some(())) }
        },
    )
    .await?;
    ensure!(
        double.state(&node_pool).is_some(),
        "the source was created, never started"
    );
    println!("    {node_pool}: its source never starts; the node reports the pool all the same");
    let out = env.kubectl(&["delete", "svmp", "never", "-n", NS], None)?;
    ensure!(
        out.status.success(),
        "deleting: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("the pool retired from the node", Duration::from_secs(60), || {
        let (nodes, name) = (nodes.clone(), node_pool.clone());
        async move { Ok((!reports(nodes, name.clone()).await? && double.state(&name).is_none()).then_some(())) }
    })
    .await?;
    println!("    the SmolVMPool deleted: the node's record and the source are gone");
    Ok(())
}

/// The node of the replaced-pool scenario, backed by its own double.
const AGAIN_NODE: &str = "again-double-node";

/// A SmolVM admitted for a pool (stopped, so not created yet) whose pool is then deleted and made
/// again under the same name, with another image: once it runs, it is created cold from the spec
/// it holds, never served from a slot of the new pool's template.
async fn a_pool_made_again_under_its_name_never_serves_a_smolvm_admitted_for_the_old_one(
    env: &mut Env,
) -> anyhow::Result<()> {
    let socket = env.dir().join("again-double.sock");
    let double = SmolvmDouble::start(&socket)
        .await
        .context("starting the smolvm double")?;
    let extra = ["--cpu-allocation-ratio=8", "--reserved-cpus=0"];
    let mut agent = env.start_double_node(AGAIN_NODE, &socket, &extra).await?;
    let outcome = made_again(env, &double).await;
    let _ = delete_and_wait(env, "old-claim").await;
    let _ = env.kubectl(&["delete", "svmp", "again", "-n", NS, "--wait=false"], None);
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.terminate(Duration::from_secs(10));
    let _ = Api::<SmolVMNode>::all(env.admin().await?)
        .delete(AGAIN_NODE, &DeleteParams::default())
        .await;
    outcome
}

async fn made_again(env: &mut Env, double: &DoubleHandle) -> anyhow::Result<()> {
    let with = |image: &str, slots: i32, when_empty: &str| {
        pool(
            "again",
            json!({"slotsPerNode": slots, "whenEmpty": when_empty, "nodeSelector": {"kubernetes.io/hostname": AGAIN_NODE},
                "template": {"image": image, "resources": {"memoryMiB": 128}, "storage": {"storageGiB": 1, "overlayGiB": 1}}}),
        )
    };
    let pools: Api<SmolVMPool> = Api::namespaced(env.admin().await?, NS);
    // The first pool keeps no slot and says Wait: a SmolVM admitted for it waits, bound.
    kubectl_apply(env, &with("alpine:3.20", 0, "Wait"))?.map_err(|e| anyhow!("applying the pool: {e}"))?;
    let first = eventually("the first pool stored", Duration::from_secs(30), || {
        let pools = pools.clone();
        async move { Ok(pools.get_opt("again").await?) }
    })
    .await?;
    let claim = vm("old-claim", json!({"poolRef": {"name": "again"}}));
    let text = serde_json::to_string(&claim)?;
    eventually("old-claim stored", Duration::from_secs(30), || async {
        let out = env.kubectl(&["apply", "-f", "-"], Some(&text))?;
        Ok(out.status.success().then_some(()))
    })
    .await?;
    let waiting = crate::wait_vm(
        env,
        "old-claim",
        "old-claim waiting for a slot",
        Duration::from_secs(60),
        |v| {
            crate::condition(v, constants::condition::READY)
                .is_some_and(|c| c.reason == constants::reason::WAITING_FOR_SLOT)
        },
    )
    .await?;
    ensure!(
        waiting.annotations().get(constants::ANNOTATION_POOL_UID) == first.metadata.uid.as_ref(),
        "admission recorded the pool's UID: {:?}",
        waiting.annotations()
    );
    // The pool deleted and made again under its name: another image, a ready slot, Cold.
    let out = env.kubectl(&["delete", "svmp", "again", "-n", NS], None)?;
    ensure!(
        out.status.success(),
        "deleting: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("the first pool gone", Duration::from_secs(30), || {
        let pools = pools.clone();
        async move { Ok(pools.get_opt("again").await?.is_none().then_some(())) }
    })
    .await?;
    kubectl_apply(env, &with("alpine:3.19", 1, "Cold"))?.map_err(|e| anyhow!("applying the pool again: {e}"))?;
    let second = eventually("the new pool's slot ready", Duration::from_secs(60), || {
        let pools = pools.clone();
        async move {
            Ok(pools
                .get_opt("again")
                .await?
                .filter(|p| p.status.as_ref().and_then(|s| s.ready_slots) == Some(1)))
        }
    })
    .await?;
    ensure!(second.metadata.uid != first.metadata.uid, "another pool");
    let running = crate::wait_vm(env, "old-claim", "old-claim running", Duration::from_secs(90), |v| {
        v.status.as_ref().and_then(|s| s.phase) == Some(smolvm_api::Phase::Running)
    })
    .await?;
    let machine = running.status.and_then(|s| s.machine_name).unwrap_or_default();
    ensure!(
        !double.leases().iter().any(|l| l.key == machine),
        "old-claim was not served from the new pool's slot: {:?}",
        double.leases()
    );
    ensure!(
        double.state(&machine).as_deref() == Some("running"),
        "old-claim runs as a machine of its own (created cold)"
    );
    ensure!(
        running.spec.image == "alpine:3.20",
        "from the spec it holds: {}",
        running.spec.image
    );
    crate::expect_event(env, "old-claim", constants::reason::POOL_EMPTY).await?;
    println!("    the pool made again under its name: old-claim created cold from the spec it holds (alpine:3.20)");
    Ok(())
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}
