//! Quotas where kube-controller-manager runs (SPEC 6.3, section 8): its quota controller enforces
//! the native `count/smolvms.vm.smolvm.dev` (through kube-apiserver's own quota admission, after
//! the webhook), copies `spec.hard` into `status.hard`, and leaves the `vm.smolvm.dev/*` figures
//! the webhook charged and the controller recounted as they are.

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube::api::PostParams;
use serde_json::json;

use super::*;

const QUOTA_NS: &str = "quota-tier";

fn vm(name: &str) -> anyhow::Result<SmolVM> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
        "metadata": {"name": name, "namespace": QUOTA_NS},
        // Pinned to no node: a quota counts a SmolVM from its spec, placed or not.
        "spec": {"image": "alpine:3.20", "running": false, "nodeName": "quota-tier-nowhere",
                 "resources": {"cpus": 2, "memoryMiB": 256},
                 "storage": {"storageGiB": 1, "overlayGiB": 1}}
    }))?)
}

/// The quota's `status.used` and `status.hard` of `key`.
async fn figures(quotas: &Api<ResourceQuota>, key: &str) -> anyhow::Result<(Option<String>, Option<String>)> {
    let q = quotas.get("vms").await?;
    let status = q.status.unwrap_or_default();
    let get = |list: Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| { list.and_then(|l| l.get(key).map(|q| q.0.clone())) };
    Ok((get(status.used), get(status.hard)))
}

pub(super) async fn quota_counts_are_enforced_natively_and_the_products_figures_survive_the_quota_controller(
    ctx: &mut Ctx,
) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": QUOTA_NS}}))?;
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let quotas: Api<ResourceQuota> = Api::namespaced(ctx.client.clone(), QUOTA_NS);
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "vms", "namespace": QUOTA_NS},
        "spec": {"hard": {"count/smolvms.vm.smolvm.dev": "1", "vm.smolvm.dev/cpus": "8"}}
    }))?;
    quotas.create(&PostParams::default(), &quota).await?;
    // The quota controller computes the native count and copies spec.hard.
    eventually(
        "the quota controller to count the quota",
        Duration::from_secs(60),
        || async {
            let (used, hard) = figures(&quotas, "count/smolvms.vm.smolvm.dev").await?;
            Ok((used.as_deref() == Some("0") && hard.as_deref() == Some("1")).then_some(()))
        },
    )
    .await?;
    let vms: Api<SmolVM> = Api::namespaced(ctx.client.clone(), QUOTA_NS);
    // The webhook's quota cache follows within moments: retry the first create until it is
    // charged (a create before would pass uncharged, and the recount would count it anyway).
    eventually("the first SmolVM admitted", Duration::from_secs(30), || async {
        match vms.create(&PostParams::default(), &vm("first")?).await {
            Ok(_) => Ok(Some(())),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Some(())),
            Err(e) => {
                println!("    first create: {e}");
                Ok(None)
            }
        }
    })
    .await?;
    eventually("2 CPUs counted", Duration::from_secs(60), || async {
        let (used, _) = figures(&quotas, "vm.smolvm.dev/cpus").await?;
        Ok((used.as_deref() == Some("2")).then_some(()))
    })
    .await?;
    // The second passes the webhook's quota (4 of 8 CPUs) and is refused by kube-apiserver's own
    // quota admission on the native count.
    match vms.create(&PostParams::default(), &vm("second")?).await {
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("count/smolvms.vm.smolvm.dev") => {
            println!("    refused natively: {}", s.message);
        }
        other => bail!("a second SmolVM against count/smolvms.vm.smolvm.dev=1: {other:?}"),
    }
    // The quota controller syncs the quota again (on each create and delete it sees, and at its
    // resync); the product's figure stays what the caches count, the refused second's charge
    // given back by the recount after its grace.
    tokio::time::sleep(Duration::from_secs(40)).await;
    let (cpus, cpus_hard) = figures(&quotas, "vm.smolvm.dev/cpus").await?;
    let (count, _) = figures(&quotas, "count/smolvms.vm.smolvm.dev").await?;
    ensure!(
        cpus.as_deref() == Some("2") && cpus_hard.as_deref() == Some("8") && count.as_deref() == Some("1"),
        "after the quota controller's syncs: vm.smolvm.dev/cpus used {cpus:?} hard {cpus_hard:?}, count {count:?}"
    );
    println!("    40 s on, the quota controller's figures and the product's agree: 1 SmolVM, 2 of 8 CPUs");
    vms.delete("first", &DeleteParams::default()).await?;
    eventually("the deleted SmolVM's CPUs freed", Duration::from_secs(60), || async {
        let (used, _) = figures(&quotas, "vm.smolvm.dev/cpus").await?;
        Ok((used.as_deref() == Some("0")).then_some(()))
    })
    .await?;
    Ok(())
}
