//! SmolVM quotas on the real API server (SPEC 6.3, rule V15): ordinary ResourceQuotas with the
//! product's keys are charged by the webhook before a write is admitted, refuse beyond their
//! limits in kube-apiserver's own words, and are kept true by the controller's recount.
//!
//! The SmolVMs here are pinned to a node that does not exist (admitted with a warning, never
//! placed): a quota counts a SmolVM from its spec, whether or not it runs, so no node takes part.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};
use smolvm_api::{SmolVM, SmolVMPool, constants};
use smolvm_tests::env::{Env, eventually};

use crate::Scenario;

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![
        v15_a_quota_admits_within_its_limits_and_refuses_beyond_them,
        v15_concurrent_creates_never_pass_a_limit_together,
        v15_a_pools_source_and_slots_are_charged_and_stop_at_the_limit,
    ]
}

/// A SmolVM of `cpus` CPUs and `memory` MiB in `ns`, with 1 + 1 GiB of disk, pinned nowhere.
fn vm(ns: &str, name: &str, cpus: i32, memory: i64) -> SmolVM {
    serde_json::from_value(json!({
        "apiVersion": constants::API_VERSION, "kind": "SmolVM",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"image": "alpine:3.20", "running": false, "nodeName": "quota-e2e-nowhere",
                 "resources": {"cpus": cpus, "memoryMiB": memory},
                 "storage": {"storageGiB": 1, "overlayGiB": 1}}
    }))
    .expect("a SmolVM")
}

async fn namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn quota(client: &Client, ns: &str, name: &str, hard: Value) -> anyhow::Result<()> {
    let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
    let q: ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}, "spec": {"hard": hard}}))?;
    api.create(&PostParams::default(), &q).await?;
    Ok(())
}

/// The quota's `status.used` of the product's keys (and only those).
async fn used(client: &Client, ns: &str, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
    let q = api.get(name).await?;
    Ok(q.status
        .and_then(|s| s.used)
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with("vm.smolvm.dev/"))
        .map(|(k, v)| (k, v.0))
        .collect())
}

/// Waits until the quota's `vm.smolvm.dev/cpus` says `want`.
async fn used_cpus_become(client: &Client, ns: &str, name: &str, want: &str, what: &str) -> anyhow::Result<()> {
    eventually(what, Duration::from_secs(60), || async {
        let used = used(client, ns, name).await?;
        Ok((used.get("vm.smolvm.dev/cpus").map(String::as_str) == Some(want)).then_some(()))
    })
    .await
}

/// Waits until the webhook refuses `too_big` (a dry run): its quota cache has the namespace's
/// quota.
async fn webhook_knows(api: &Api<SmolVM>, too_big: &SmolVM) -> anyhow::Result<()> {
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually("the webhook to know the quota", Duration::from_secs(30), || async {
        match api.create(&dry_run, too_big).await {
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(Some(())),
            _ => Ok(None),
        }
    })
    .await
}

/// Creates `vm`: `Ok(())`, or the API server's refusal (code, message).
async fn create(api: &Api<SmolVM>, vm: &SmolVM) -> anyhow::Result<Result<(), (u16, String)>> {
    match api.create(&PostParams::default(), vm).await {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) => Ok(Err((s.code, s.message))),
        Err(e) => Err(e.into()),
    }
}

async fn v15_a_quota_admits_within_its_limits_and_refuses_beyond_them(env: &mut Env) -> anyhow::Result<()> {
    let ns = "quota-e2e";
    let admin = env.admin().await?;
    namespace(&admin, ns).await?;
    quota(
        &admin,
        ns,
        "vms",
        json!({"vm.smolvm.dev/cpus": "4", "vm.smolvm.dev/storage": "7Gi", "count/smolvms.vm.smolvm.dev": "10"}),
    )
    .await?;
    // No quota controller runs here: the recount writes status.hard of the product's keys (and
    // status.used), so the quota describes itself.
    eventually(
        "the recount to write the quota's limits",
        Duration::from_secs(30),
        || async {
            let api: Api<ResourceQuota> = Api::namespaced(admin.clone(), ns);
            let q = api.get("vms").await?;
            let hard = q.status.and_then(|s| s.hard).unwrap_or_default();
            Ok((hard.get("vm.smolvm.dev/cpus").map(|q| q.0.as_str()) == Some("4")).then_some(()))
        },
    )
    .await?;
    let describe = env.kubectl(&["describe", "quota", "vms", "-n", ns], None)?;
    let text = String::from_utf8_lossy(&describe.stdout);
    ensure!(
        text.contains("vm.smolvm.dev/cpus") && text.contains("vm.smolvm.dev/storage"),
        "kubectl describe quota does not show the product's keys:\n{text}"
    );
    println!(
        "    kubectl describe quota:\n      {}",
        text.trim_end().replace('\n', "\n      ")
    );

    let api: Api<SmolVM> = Api::namespaced(admin.clone(), ns);
    // The webhook's quota cache follows the watch within moments: until then a create passes
    // uncharged.
    webhook_knows(&api, &vm(ns, "too-big", 5, 512)).await?;

    // 2 + 2 CPUs pass; the third is refused with the quota's name and figures.
    for (name, memory) in [("one", 512), ("two", 4096)] {
        create(&api, &vm(ns, name, 2, memory))
            .await?
            .map_err(|(code, message)| anyhow!("creating {name}: {code} {message}"))?;
    }
    used_cpus_become(&admin, ns, "vms", "4", "4 CPUs charged").await?;
    match create(&api, &vm(ns, "three", 2, 512)).await? {
        Ok(()) => bail!("the third SmolVM passed a 4-CPU quota"),
        Err((code, message)) => {
            ensure!(code == 403, "refused with {code}, not 403: {message}");
            let words = "exceeded quota: vms, requested: vm.smolvm.dev/cpus=2, used: vm.smolvm.dev/cpus=4, limited: vm.smolvm.dev/cpus=4";
            ensure!(message.contains(words), "the refusal lacks {words:?}: {message}");
            println!("    refused: {message}");
        }
    }

    // A resize above the limit is refused; one within it passes.
    let resize = |cpus: i32| json!({"spec": {"resources": {"cpus": cpus}}});
    let patch = |cpus: i32| {
        let api = api.clone();
        async move {
            api.patch(
                "one",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&resize(cpus)),
            )
            .await
        }
    };
    match patch(3).await {
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("exceeded quota: vms") => {}
        other => bail!("a resize to 3 CPUs at the limit was not refused by the quota: {other:?}"),
    }
    patch(1).await.context("shrinking one to 1 CPU")?;
    used_cpus_become(&admin, ns, "vms", "3", "a shrink given back by the recount").await?;

    // A suspend adds the saved memory to storage: 2 + 2 GiB of disk, then two's 4 GiB of saved
    // memory is over 7Gi.
    let suspend = json!({"spec": {"running": true, "suspended": true}});
    match api
        .patch(
            "two",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&suspend),
        )
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("vm.smolvm.dev/storage") => {
            println!("    a suspend over the storage limit refused: {}", s.message);
        }
        other => bail!("a suspend that adds 4 GiB of saved memory over 7Gi was not refused: {other:?}"),
    }

    // A dry run is judged, never charged.
    let before = used(&admin, ns, "vms").await?;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api.create(&dry, &vm(ns, "dry", 1, 512))
        .await
        .context("a dry run within the limit")?;
    match api.create(&dry, &vm(ns, "dry", 2, 512)).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => bail!("a dry run over the limit was not refused: {other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        used(&admin, ns, "vms").await? == before,
        "a dry run changed the quota: {before:?} -> {:?}",
        used(&admin, ns, "vms").await?
    );

    // A create admitted (and charged) by the webhook, then refused by a later check: the name is
    // taken, which the API server finds only when it stores the object, after admission. The
    // recount gives the charge back once its grace passed (5 s here).
    match create(&api, &vm(ns, "two", 1, 512)).await? {
        Err((409, _)) => {}
        other => bail!("creating a second 'two': {other:?}"),
    }
    used_cpus_become(&admin, ns, "vms", "3", "the refused create's charge given back").await?;

    // A deleted SmolVM frees its share.
    api.delete("two", &DeleteParams::default()).await?;
    used_cpus_become(&admin, ns, "vms", "1", "the deleted SmolVM's CPUs freed").await?;
    create(&api, &vm(ns, "three", 2, 512))
        .await?
        .map_err(|(code, message)| anyhow!("creating three after the delete: {code} {message}"))?;
    used_cpus_become(&admin, ns, "vms", "3", "three charged").await?;

    // The webhook and the controller may patch every quota's status (RBAC cannot narrow it to
    // keys); the API server itself holds them to the product's keys (smolvm-quota-keys).
    for sa in [smolvm_tests::env::SA_WEBHOOK, smolvm_tests::env::SA_CONTROLLER] {
        let (client, _) = env.service_account_client(sa).await?;
        let quotas: Api<ResourceQuota> = Api::namespaced(client, ns);
        let patch = |key: &str| json!({"status": {"used": {key: "0"}}});
        match quotas
            .patch_status(
                "vms",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch("count/smolvms.vm.smolvm.dev")),
            )
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("[V15]") => {}
            other => bail!("{sa} wrote a key that is not the product's: {other:?}"),
        }
        quotas
            .patch_status(
                "vms",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch("vm.smolvm.dev/memory")),
            )
            .await
            .with_context(|| format!("{sa} writing a product key"))?;
    }
    println!("    the webhook's and the controller's identities may write only the vm.smolvm.dev/* keys");
    cleanup(&admin, ns).await
}

async fn v15_concurrent_creates_never_pass_a_limit_together(env: &mut Env) -> anyhow::Result<()> {
    let admin = env.admin().await?;
    let runs = 10;
    let mut conflicts_seen = Vec::new();
    for run in 0..runs {
        let ns = format!("quota-race-{run}");
        namespace(&admin, &ns).await?;
        quota(&admin, &ns, "vms", json!({"vm.smolvm.dev/cpus": "10"})).await?;
        let api: Api<SmolVM> = Api::namespaced(admin.clone(), &ns);
        webhook_knows(&api, &vm(&ns, "probe", 11, 512)).await?;
        let creates: Vec<SmolVM> = (0..20).map(|i| vm(&ns, &format!("vm-{i}"), 1, 128)).collect();
        let results = futures::future::join_all(creates.iter().map(|v| create(&api, v))).await;
        let mut admitted = 0;
        let mut refused = 0;
        for result in results {
            match result? {
                Ok(()) => admitted += 1,
                Err((403, m)) if m.contains("exceeded quota: vms") => refused += 1,
                Err((code, message)) => {
                    conflicts_seen.push(format!("{code} {message}"));
                }
            }
        }
        let stored = api.list(&ListParams::default()).await?.items.len();
        ensure!(
            admitted == 10 && stored == 10,
            "run {run}: {admitted} admitted, {refused} refused, {stored} stored of 20 concurrent 1-CPU creates against 10 CPUs (other answers: {conflicts_seen:?})"
        );
        used_cpus_become(&admin, &ns, "vms", "10", "10 CPUs charged").await?;
        cleanup(&admin, &ns).await?;
    }
    ensure!(
        conflicts_seen.is_empty(),
        "answers other than admitted or exceeded: {conflicts_seen:?}"
    );
    println!("    {runs} runs of 20 concurrent 1-CPU creates against 10 CPUs: exactly 10 admitted in each");
    Ok(())
}

/// Deletes the namespace's SmolVMs and the namespace (not waited for).
async fn cleanup(admin: &Client, ns: &str) -> anyhow::Result<()> {
    let api: Api<SmolVM> = Api::namespaced(admin.clone(), ns);
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .map_err(|e| anyhow!("deleting the SmolVMs of {ns}: {e}"))?;
    Ok(())
}

const POOL_NODE: &str = "quota-double-node";
const POOL_NS: &str = "quota-pools";

async fn v15_a_pools_source_and_slots_are_charged_and_stop_at_the_limit(env: &mut Env) -> anyhow::Result<()> {
    // Room for many 1-CPU machines: the quota, not the node, is what stops the pool.
    let node = env
        .start_on_double(POOL_NODE, &["--cpu-allocation-ratio=8", "--reserved-cpus=0"])
        .await?;
    let outcome = pool_quota(env).await;
    let admin = env.admin().await?;
    let _ = cleanup(&admin, POOL_NS).await;
    let _ = Api::<SmolVMPool>::namespaced(admin.clone(), POOL_NS)
        .delete("warm", &DeleteParams::default())
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    node.stop(env).await;
    outcome
}

async fn pool_quota(env: &mut Env) -> anyhow::Result<()> {
    let admin = env.admin().await?;
    namespace(&admin, POOL_NS).await?;
    quota(&admin, POOL_NS, "vms", json!({"vm.smolvm.dev/cpus": "4"})).await?;
    eventually("the recount to see the quota", Duration::from_secs(30), || async {
        Ok(used(&admin, POOL_NS, "vms")
            .await?
            .contains_key("vm.smolvm.dev/cpus")
            .then_some(()))
    })
    .await?;
    let pools: Api<SmolVMPool> = Api::namespaced(admin.clone(), POOL_NS);
    let pool: SmolVMPool = serde_json::from_value(json!({
        "apiVersion": constants::API_VERSION, "kind": "SmolVMPool",
        "metadata": {"name": "warm", "namespace": POOL_NS},
        "spec": {"slotsPerNode": 8, "whenEmpty": "Cold", "nodeSelector": {"kubernetes.io/hostname": POOL_NODE},
                 "template": {"image": "alpine:3.20", "resources": {"cpus": 1, "memoryMiB": 128},
                              "storage": {"storageGiB": 1, "overlayGiB": 1}}}
    }))?;
    pools.create(&PostParams::default(), &pool).await?;
    // The source and 3 slots (4 CPUs) are charged before they start; the rest wait, saying why.
    let capped = |want: i32| {
        let pools = pools.clone();
        async move {
            let p = pools.get("warm").await?;
            let status = p.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .find(|c| c.type_ == constants::condition::READY)
                .cloned();
            Ok((status.ready_slots == Some(want)
                && ready
                    .as_ref()
                    .is_some_and(|c| c.reason == constants::reason::QUOTA_EXCEEDED))
            .then_some(ready))
        }
    };
    let condition = eventually(
        "3 slots ready and the pool stopped at the quota",
        Duration::from_secs(60),
        || capped(3),
    )
    .await?
    .context("a Ready condition")?;
    println!("    the pool at the quota: {}: {}", condition.reason, condition.message);
    used_cpus_become(&admin, POOL_NS, "vms", "4", "the source and 3 slots charged").await?;

    // A claim: the slot's charge moves to the SmolVM (nothing more is charged), and the keeper
    // does not refill beyond the limit.
    let claim: SmolVM = serde_json::from_value(json!({
        "apiVersion": constants::API_VERSION, "kind": "SmolVM",
        "metadata": {"name": "claim", "namespace": POOL_NS},
        "spec": {"poolRef": {"name": "warm"}}
    }))?;
    let vms: Api<SmolVM> = Api::namespaced(admin.clone(), POOL_NS);
    vms.create(&PostParams::default(), &claim)
        .await
        .context("a pooled SmolVM while its pool holds a ready slot (charged nothing)")?;
    eventually("the claim served warm", Duration::from_secs(60), || async {
        let vm = vms.get("claim").await?;
        Ok(vm
            .status
            .and_then(|s| s.phase)
            .filter(|p| *p == smolvm_api::Phase::Running)
            .map(|_| ()))
    })
    .await?;
    eventually(
        "2 slots left, the refill held at the quota",
        Duration::from_secs(60),
        || capped(2),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    used_cpus_become(&admin, POOL_NS, "vms", "4", "the VM, the source and 2 slots").await?;

    // More room: the keeper fills it, charging each slot.
    let quotas: Api<ResourceQuota> = Api::namespaced(admin.clone(), POOL_NS);
    quotas
        .patch(
            "vms",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"spec": {"hard": {"vm.smolvm.dev/cpus": "6"}}})),
        )
        .await?;
    eventually("the pool refilled into the new room", Duration::from_secs(60), || {
        capped(4)
    })
    .await?;
    used_cpus_become(&admin, POOL_NS, "vms", "6", "two more slots charged").await?;
    println!(
        "    source and slots charged before they start; a claim moves its slot's charge; the keeper fills only the room the quota leaves"
    );
    Ok(())
}
