//! Volumes on a real node (SPEC 2.5): a StorageClass with `volumeBindingMode:
//! WaitForFirstConsumer` and no provisioner, local PVs made beforehand (directories on the node,
//! pinned to it), a claim with a file written by a plain Pod, a claim template and a ConfigMap.
//! The kubelet mounts them into the VM's holder Pod, the agent gives smolvm its stable paths, and
//! those paths hold the file and the ConfigMap's keys. A Retain claim outlives its SmolVM and is
//! adopted by the next of the same name; a Delete claim goes with it. The holder deleted under the
//! VM has the agent stop the VM before the kubelet unmounts, and a new holder serves the same
//! machine.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim};
use kube::api::PostParams;
use serde_json::json;

use super::*;

const VOL_NS: &str = "volumes-tier";
const CLASS: &str = "local-wffc";

/// Creates `object` with `api`, an existing one of the same name kept.
async fn create<K>(api: &Api<K>, object: K) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A local PV of 1Gi at `path` on the node, for claims of [`CLASS`].
fn local_pv(name: &str, path: &std::path::Path) -> anyhow::Result<PersistentVolume> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": CLASS,
            "volumeMode": "Filesystem",
            "local": {"path": path.display().to_string()},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}]}]}}
        }
    }))?)
}

/// The SmolVM `name` with a claim `data`, a claim template `scratch` (`when_deleted`) and the
/// ConfigMap `vm-config`.
fn vm(name: &str, when_deleted: &str) -> anyhow::Result<SmolVM> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
        "metadata": {"name": name, "namespace": VOL_NS},
        "spec": {"image": "alpine:3.20", "resources": {"cpus": 1, "memoryMiB": 256},
                 "storage": {"storageGiB": 1, "overlayGiB": 1},
                 "volumes": [
                     {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "data"}},
                     {"name": "scratch", "mountPath": "/scratch", "claimTemplate": {
                         "whenDeleted": when_deleted,
                         "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
                                  "resources": {"requests": {"storage": "1Gi"}}}}},
                     {"name": "config", "mountPath": "/etc/app", "configMap": {"name": "vm-config"}}
                 ]}
    }))?)
}

/// The runtime pod's name.
async fn runtime_pod(ctx: &Ctx) -> anyhow::Result<String> {
    pods(ctx, "smolvm-runtime")
        .await?
        .into_iter()
        .find(pod_ready)
        .map(|p| p.name_any())
        .context("no ready runtime pod")
}

/// `script` run by `sh -c` in the runtime pod (where the agent's mounts are).
fn in_runtime(ctx: &Ctx, pod: &str, script: &str) -> anyhow::Result<String> {
    kubectl_ok(ctx, &["exec", "-n", NS, pod, "--", "sh", "-c", script], None)
}

/// The VolumesReady condition of `name`: (status, reason, message).
async fn volumes_ready(vms: &Api<SmolVM>, name: &str) -> anyhow::Result<Option<(String, String, String)>> {
    let status = vms.get(name).await?.status.unwrap_or_default();
    Ok(condition(&status.conditions, "VolumesReady").map(|c| (c.status.clone(), c.reason.clone(), c.message.clone())))
}

/// Waits until `name`'s volumes are mounted, and returns its machine's name.
async fn mounted(ctx: &Ctx, vms: &Api<SmolVM>, name: &str) -> anyhow::Result<String> {
    let started = Instant::now();
    let ready = eventually(
        &format!("{name}: VolumesReady=True"),
        Duration::from_secs(180),
        || async {
            Ok(volumes_ready(vms, name)
                .await?
                .filter(|(status, _, _)| status == "True"))
        },
    )
    .await;
    if let Err(e) = ready {
        let seen = volumes_ready(vms, name).await.ok().flatten();
        return Err(e.context(format!("VolumesReady: {seen:?}")));
    }
    let uid = vms.get(name).await?.uid().context("no uid")?;
    let machine = format!("svm-{uid}");
    machine_listed(
        ctx,
        &machine,
        "the machine created on the node",
        Duration::from_secs(60),
    )
    .await?;
    println!(
        "    {name}: VolumesReady=True and {machine} created {:.1}s after apply",
        started.elapsed().as_secs_f64()
    );
    Ok(machine)
}

/// smolvm's API socket on the node, as the runtime DaemonSet's hostPath puts it (`/var/run`
/// is `/run`).
const SMOLVM_SOCKET: &str = "/run/smolvm/smolvm.sock";

/// Mounts as smolvm recorded them at create, from its own API on the node
/// (`GET /api/v1/machines/{name}`): `(source, target)` of `machine`.
async fn smolvm_mounts(machine: &str) -> anyhow::Result<Vec<(String, String)>> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::UnixStream::connect(SMOLVM_SOCKET)
        .await
        .with_context(|| format!("connecting to {SMOLVM_SOCKET}"))?;
    stream
        .write_all(format!("GET /api/v1/machines/{machine} HTTP/1.0\r\nHost: smolvm\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut buf))
        .await
        .context("smolvm did not answer in 30 s")??;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    ensure!(head.contains(" 200 "), "smolvm answered GET {machine}: {head}");
    let entry: Value = serde_json::from_str(body).with_context(|| format!("smolvm's machine: {body}"))?;
    Ok(entry["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["source"].as_str().unwrap_or_default().to_string(),
                m["target"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

pub(super) async fn volumes_are_mounted_by_the_kubelet_and_passed_to_smolvm(ctx: &mut Ctx) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    create(
        &namespaces,
        serde_json::from_value(json!({"metadata": {"name": VOL_NS}}))?,
    )
    .await?;
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(ctx.client.clone());
    create(
        &classes,
        serde_json::from_value(json!({"metadata": {"name": CLASS},
            "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"}))?,
    )
    .await?;
    // The local PVs' directories, on the node (this process shares its mount namespace). Mode
    // 0777: smolvm may run a VM's process under a uid of its own.
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    for name in ["local-a", "local-b", "local-c"] {
        let path = ctx.node.dir.join("local-pv").join(name);
        std::fs::create_dir_all(&path)?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
        create(&pvs, local_pv(name, &path)?).await?;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), VOL_NS);
    create(
        &claims,
        serde_json::from_value(json!({"metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
                     "resources": {"requests": {"storage": "1Gi"}}}}))?,
    )
    .await?;
    // A plain Pod writes a file into the claim (and so binds it to a PV on the node).
    let plain: Api<Pod> = Api::namespaced(ctx.client.clone(), VOL_NS);
    create(
        &plain,
        serde_json::from_value(json!({"metadata": {"name": "writer"},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
                "containers": [{"name": "w", "image": PROBE_IMAGE, "imagePullPolicy": "IfNotPresent",
                    "command": ["bash", "-c", "echo kept > /data/file"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}))?,
    )
    .await?;
    eventually("the writer Pod Succeeded", Duration::from_secs(120), || async {
        let phase = plain.get("writer").await?.status.and_then(|s| s.phase);
        ensure!(phase.as_deref() != Some("Failed"), "the writer Pod failed");
        Ok((phase.as_deref() == Some("Succeeded")).then_some(()))
    })
    .await?;
    plain.delete("writer", &DeleteParams::default()).await?;
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), VOL_NS);
    create(
        &maps,
        serde_json::from_value(json!({"metadata": {"name": "vm-config"}, "data": {"greeting": "hello"}}))?,
    )
    .await?;

    let vms: Api<SmolVM> = Api::namespaced(ctx.client.clone(), VOL_NS);
    vms.create(&PostParams::default(), &vm("db", "Retain")?).await?;
    let machine = mounted(ctx, &vms, "db").await?;
    let template_claim = claims.get("db-scratch").await?;
    ensure!(
        template_claim.labels().get("vm.smolvm.dev/smolvm").map(String::as_str) == Some("db"),
        "db-scratch is not labelled with its SmolVM: {:?}",
        template_claim.labels()
    );
    let holder = plain.get("db-holder").await?;
    ensure!(
        holder.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE_NAME),
        "the holder runs on {:?}",
        holder.spec.as_ref().and_then(|s| s.node_name.clone())
    );
    let holder_uid = holder.uid().context("holder without uid")?;

    // What smolvm was given at create: the agent's three stable paths, the guest's targets.
    let pod = runtime_pod(ctx).await?;
    let mounts = smolvm_mounts(&machine).await?;
    let targets: Vec<&str> = mounts.iter().map(|(_, t)| t.as_str()).collect();
    for target in ["/data", "/scratch", "/etc/app"] {
        ensure!(targets.contains(&target), "smolvm's mounts {mounts:?} lack {target}");
    }
    ensure!(
        mounts.iter().all(|(source, _)| source.contains(&machine)),
        "smolvm's mounts are not the agent's stable paths of {machine}: {mounts:?}"
    );
    let source_of = |target: &str| {
        mounts
            .iter()
            .find(|(_, t)| t == target)
            .map(|(s, _)| s.clone())
            .unwrap_or_default()
    };
    let file = in_runtime(ctx, &pod, &format!("cat {}/file", source_of("/data")))?;
    ensure!(
        file.trim() == "kept",
        "the claim's file reads {file:?} through smolvm's source"
    );
    let greeting = in_runtime(ctx, &pod, &format!("cat {}/greeting", source_of("/etc/app")))?;
    ensure!(greeting.trim() == "hello", "the ConfigMap's key reads {greeting:?}");
    in_runtime(ctx, &pod, &format!("echo scratch > {}/note", source_of("/scratch")))?;
    println!("    smolvm's mounts: {mounts:?}; the claim's file and the ConfigMap's key read through them");

    holder_deleted_stops_the_vm_first_then_a_new_holder_serves_it(ctx, &vms, &machine, &holder_uid).await?;

    // Delete: the Retain claim stays, and the next SmolVM of the name adopts it, with its file.
    vms.delete("db", &DeleteParams::default()).await?;
    eventually("db deleted", Duration::from_secs(120), || async {
        Ok(vms.get_opt("db").await?.is_none().then_some(()))
    })
    .await?;
    ensure!(
        plain
            .get_opt("db-holder")
            .await?
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "the holder outlived its SmolVM"
    );
    let kept = claims.get("db-scratch").await?;
    ensure!(
        kept.metadata.deletion_timestamp.is_none(),
        "the Retain claim is being deleted"
    );
    ensure!(
        claims.get_opt("data").await?.is_some(),
        "the claim the SmolVM named went with it"
    );
    eventually("the old holder gone", Duration::from_secs(120), || async {
        Ok(plain.get_opt("db-holder").await?.is_none().then_some(()))
    })
    .await?;
    vms.create(&PostParams::default(), &vm("db", "Retain")?).await?;
    let machine = mounted(ctx, &vms, "db").await?;
    let adopted = claims.get("db-scratch").await?;
    ensure!(adopted.uid() == kept.uid(), "db-scratch was made again, not adopted");
    let pod = runtime_pod(ctx).await?;
    let mounts = smolvm_mounts(&machine).await?;
    let scratch = mounts
        .iter()
        .find(|(_, t)| t == "/scratch")
        .map(|(s, _)| s.clone())
        .context("no /scratch mount")?;
    let note = in_runtime(ctx, &pod, &format!("cat {scratch}/note"))?;
    ensure!(note.trim() == "scratch", "the adopted claim lost its file: {note:?}");
    println!("    the Retain claim outlived db and was adopted, its file intact");

    // whenDeleted: Delete makes the SmolVM the claim's owner, and the claim goes with it.
    vms.delete("db", &DeleteParams::default()).await?;
    eventually("db deleted again", Duration::from_secs(120), || async {
        Ok(vms.get_opt("db").await?.is_none().then_some(()))
    })
    .await?;
    claims.delete("db-scratch", &DeleteParams::default()).await?;
    eventually("the old holder gone again", Duration::from_secs(120), || async {
        Ok(plain.get_opt("db-holder").await?.is_none().then_some(()))
    })
    .await?;
    vms.create(&PostParams::default(), &vm("db", "Delete")?).await?;
    mounted(ctx, &vms, "db").await?;
    vms.delete("db", &DeleteParams::default()).await?;
    eventually(
        "the Delete claim gone with its SmolVM",
        Duration::from_secs(120),
        || async {
            let gone = vms.get_opt("db").await?.is_none()
                && claims
                    .get_opt("db-scratch")
                    .await?
                    .is_none_or(|c| c.metadata.deletion_timestamp.is_some());
            Ok(gone.then_some(()))
        },
    )
    .await?;
    println!("    whenDeleted: Delete removed db-scratch with its SmolVM");
    // The node's room is free again for the scenarios after this one.
    let _ = claims.delete("data", &DeleteParams::default()).await;
    Ok(())
}

/// Releases the agent's hook answered by stopping machines and releasing their binds
/// (`smolvm_runtime_volume_releases_total{result="Released"}` on its ops port).
async fn releases() -> anyhow::Result<f64> {
    let (code, body) = super::monitoring::http10_get(&format!("{NODE_IP}:9090"), "/metrics").await?;
    ensure!(code == 200, "the agent's /metrics answered {code}");
    Ok(body
        .lines()
        .filter(|l| l.starts_with("smolvm_runtime_volume_releases_total") && l.contains("result=\"Released\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The holder deleted while the VM's machine exists: its preStop hook has the agent stop the
/// machine (and release its binds) before the kubelet unmounts, the SmolVM says why, and a new
/// holder, once mounted, serves the same machine.
async fn holder_deleted_stops_the_vm_first_then_a_new_holder_serves_it(
    ctx: &Ctx,
    vms: &Api<SmolVM>,
    machine: &str,
    old_holder: &str,
) -> anyhow::Result<()> {
    let holders: Api<Pod> = Api::namespaced(ctx.client.clone(), VOL_NS);
    let released_before = releases().await?;
    holders.delete("db-holder", &DeleteParams::default()).await?;
    // The holder's preStop hook is the kubelet's call to the agent's release hook, made before
    // the kubelet stops the holder's container and unmounts its volumes: the agent answered it
    // by stopping the machine and releasing its binds.
    eventually(
        "the agent's release hook answered the holder's preStop",
        Duration::from_secs(60),
        || async { Ok((releases().await? > released_before).then_some(())) },
    )
    .await?;
    let evicted = eventually("VolumesReady=False HolderEvicted", Duration::from_secs(60), || async {
        Ok(volumes_ready(vms, "db")
            .await?
            .filter(|(status, reason, _)| status == "False" && reason == "HolderEvicted"))
    })
    .await?;
    println!("    holder deleted: VolumesReady=False HolderEvicted ({})", evicted.2);
    let new_uid = eventually("a new holder Running", Duration::from_secs(180), || async {
        Ok(holders.get_opt("db-holder").await?.filter(|p| {
            p.uid().as_deref() != Some(old_holder)
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        }))
    })
    .await?
    .uid()
    .context("new holder without uid")?;
    let same = mounted(ctx, vms, "db").await?;
    ensure!(same == machine, "a new machine {same} was made instead of {machine}");
    let pod = runtime_pod(ctx).await?;
    let mounts = smolvm_mounts(machine).await?;
    let data = mounts
        .iter()
        .find(|(_, t)| t == "/data")
        .map(|(s, _)| s.clone())
        .context("no /data mount")?;
    let file = in_runtime(ctx, &pod, &format!("cat {data}/file"))?;
    ensure!(
        file.trim() == "kept",
        "after the new holder {new_uid} the claim reads {file:?}"
    );
    println!("    a new holder {new_uid} mounted and serves the same machine {machine}");
    Ok(())
}
