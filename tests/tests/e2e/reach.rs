//! Reach by name: a SmolVM with `network.exposeService` gets a Service named like it and an
//! EndpointSlice at its node's InternalIP and host ports, ready only while the VM runs; a Service
//! of that name it does not own is left untouched; turning exposeService off, or deleting the
//! SmolVM, removes them (the controller deletes them itself: this control plane has no garbage
//! collector).

use std::time::Duration;

use anyhow::{anyhow, ensure};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use smolvm_api::{SmolVM, constants};
use smolvm_tests::{
    env::{Env, NODE_INTERNAL_IP, eventually},
    process::free_port,
};

use crate::{
    NS, Scenario, condition, delete_and_wait, expect_event, kubectl_apply, vm, vms, wait_started_or_failed, wait_vm,
};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![
        expose_service_routes_to_the_node_and_goes_with_the_vm,
        a_vm_whose_start_failed_keeps_its_service_and_a_deleted_one_comes_back
    ]
}

fn exposed(v: &SmolVM) -> Option<(String, String, String)> {
    condition(v, constants::condition::SERVICE_EXPOSED).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn set_expose(env: &Env, name: &str, on: bool) -> anyhow::Result<()> {
    let patch = json!({"spec": {"network": {"exposeService": on}}});
    vms(env)
        .await?
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// The EndpointSlice's one endpoint: (addresses, ready).
async fn endpoint(slices: &Api<EndpointSlice>, name: &str) -> anyhow::Result<Option<(Vec<String>, Option<bool>)>> {
    Ok(slices.get_opt(name).await?.and_then(|s| {
        s.endpoints
            .first()
            .map(|e| (e.addresses.clone(), e.conditions.as_ref().and_then(|c| c.ready)))
    }))
}

pub(crate) async fn expose_service_routes_to_the_node_and_goes_with_the_vm(env: &mut Env) -> anyhow::Result<()> {
    let admin = env.admin().await?;
    let services: Api<Service> = Api::namespaced(admin.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), NS);
    let (tcp, udp) = (free_port()?, free_port()?);
    let name = "reach-web";
    let spec_on = |tcp: u16, udp: u16, running: bool, expose: bool| {
        json!({"image": "alpine:3.20", "running": running, "resources": {"memoryMiB": 128},
            "storage": {"storageGiB": 1, "overlayGiB": 1},
            "network": {"enabled": true, "exposeService": expose, "ports": [
                {"hostPort": tcp, "guestPort": 80},
                {"hostPort": udp, "guestPort": 53, "protocol": "UDP"}]}})
    };
    let spec = |running: bool, expose: bool| spec_on(tcp, udp, running, expose);
    kubectl_apply(env, &vm(name, spec(false, true)))?.map_err(|e| anyhow!(e))?;
    let v = wait_vm(env, name, "ServiceExposed=True", Duration::from_secs(60), |v| {
        exposed(v).is_some_and(|(s, _, _)| s == "True")
    })
    .await?;
    let uid = v.metadata.uid.clone().unwrap_or_default();
    let status = v.status.clone().unwrap_or_default();
    ensure!(
        status.node_address.as_deref() == Some(NODE_INTERNAL_IP),
        "status.nodeAddress: {status:?}"
    );
    ensure!(
        status.ports.as_deref() == Some(format!("{tcp}->80/TCP,{udp}->53/UDP").as_str()),
        "status.ports: {:?}",
        status.ports
    );

    // The Service: ClusterIP, selector-less, one port per published port, owned by the SmolVM.
    let svc = services.get(name).await?;
    let owner = svc.metadata.owner_references.clone().unwrap_or_default();
    ensure!(
        owner
            .iter()
            .any(|o| o.uid == uid && o.kind == "SmolVM" && o.controller == Some(true)),
        "owner: {owner:?}"
    );
    let svc_spec = svc.spec.clone().unwrap_or_default();
    ensure!(
        svc_spec.type_.as_deref() == Some("ClusterIP"),
        "type: {:?}",
        svc_spec.type_
    );
    ensure!(
        svc_spec
            .cluster_ip
            .as_deref()
            .is_some_and(|ip| !ip.is_empty() && ip != "None")
    );
    ensure!(svc_spec.selector.is_none_or(|s| s.is_empty()), "selector-less");
    let ports: Vec<_> = svc_spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            (
                p.name.unwrap_or_default(),
                p.port,
                p.target_port,
                p.protocol.unwrap_or_default(),
            )
        })
        .collect();
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int;
    ensure!(
        ports
            == vec![
                ("tcp-80".to_string(), 80, Some(Int(i32::from(tcp))), "TCP".to_string()),
                ("udp-53".to_string(), 53, Some(Int(i32::from(udp))), "UDP".to_string()),
            ],
        "Service ports: {ports:?}"
    );

    // Its EndpointSlice: the node's InternalIP, the host ports, not ready while the VM is stopped.
    let slice = slices.get(name).await?;
    ensure!(
        slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
            .map(String::as_str)
            == Some(name),
        "service-name label: {:?}",
        slice.metadata.labels
    );
    let slice_ports: Vec<_> = slice
        .ports
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.port, p.protocol))
        .collect();
    ensure!(
        slice_ports
            == vec![
                (Some(i32::from(tcp)), Some("TCP".to_string())),
                (Some(i32::from(udp)), Some("UDP".to_string()))
            ],
        "slice ports: {slice_ports:?}"
    );
    ensure!(
        endpoint(&slices, name).await? == Some((vec![NODE_INTERNAL_IP.to_string()], Some(false))),
        "stopped: the endpoint is not ready: {:?}",
        slice.endpoints
    );

    // `kubectl get -o wide` shows where the ports are published.
    let out = env.kubectl(&["get", "smolvm", name, "-n", NS, "-o", "wide"], None)?;
    let table = String::from_utf8_lossy(&out.stdout);
    ensure!(
        table.contains("ADDRESS") && table.contains(NODE_INTERNAL_IP) && table.contains(&format!("{tcp}->80/TCP")),
        "kubectl get -o wide:\n{table}"
    );

    // Asked to run: the endpoint is ready exactly when the machine runs (here the start fails, as
    // guests cannot boot; where they boot it runs). Stopped again: not ready.
    kubectl_apply(env, &vm(name, spec(true, true)))?.map_err(|e| anyhow!(e))?;
    let v = wait_vm(env, name, "the start to settle", Duration::from_secs(120), |v| {
        condition(v, constants::condition::READY)
            .is_some_and(|c| c.reason == constants::reason::RUNNING || c.reason == constants::reason::START_FAILED)
    })
    .await?;
    let runs = v.status.as_ref().and_then(|s| s.phase) == Some(smolvm_api::Phase::Running);
    let want = Some((vec![NODE_INTERNAL_IP.to_string()], Some(runs)));
    eventually("the endpoint to follow the machine", Duration::from_secs(30), || {
        let slices = slices.clone();
        let want = want.clone();
        async move { Ok((endpoint(&slices, name).await? == want).then_some(())) }
    })
    .await?;
    println!("    endpoint ready: {runs} (the machine runs: {runs})");
    kubectl_apply(env, &vm(name, spec(false, true)))?.map_err(|e| anyhow!(e))?;
    eventually("the endpoint to go unready on stop", Duration::from_secs(60), || {
        let slices = slices.clone();
        async move {
            Ok(
                (endpoint(&slices, name).await? == Some((vec![NODE_INTERNAL_IP.to_string()], Some(false))))
                    .then_some(()),
            )
        }
    })
    .await?;

    // A Service of the name that someone else made is never touched.
    let foreign = "reach-foreign";
    let theirs: Service = serde_json::from_value(json!({
        "metadata": {"name": foreign, "namespace": NS, "labels": {"owner": "someone-else"}},
        "spec": {"ports": [{"port": 9999, "protocol": "TCP"}], "selector": {"app": "theirs"}},
    }))?;
    let before = services.create(&PostParams::default(), &theirs).await?;
    // (Other host ports: a node publishes each host port once.)
    let other_ports = spec_on(free_port()?, free_port()?, false, true);
    kubectl_apply(env, &vm(foreign, other_ports))?.map_err(|e| anyhow!(e))?;
    let v = wait_vm(env, foreign, "ServiceExposed=False", Duration::from_secs(60), |v| {
        exposed(v).is_some_and(|(s, _, _)| s == "False")
    })
    .await?;
    let (_, why, message) = exposed(&v).unwrap_or_default();
    ensure!(why == constants::reason::SERVICE_NOT_OWNED, "reason {why}: {message}");
    ensure!(message.contains(foreign), "the message names the Service: {message}");
    let after = services.get(foreign).await?;
    ensure!(
        after.metadata.resource_version == before.metadata.resource_version,
        "the foreign Service was written"
    );
    expect_event(env, foreign, constants::reason::SERVICE_NOT_OWNED).await?;
    delete_and_wait(env, foreign).await?;
    ensure!(
        services.get_opt(foreign).await?.is_some(),
        "deleting the SmolVM left the Service it does not own"
    );
    services.delete(foreign, &Default::default()).await?;

    // exposeService off: the Service and its EndpointSlice go, and so does the condition.
    set_expose(env, name, false).await?;
    eventually(
        "the Service to go with exposeService off",
        Duration::from_secs(60),
        || {
            let (services, slices) = (services.clone(), slices.clone());
            async move {
                Ok((services.get_opt(name).await?.is_none() && slices.get_opt(name).await?.is_none()).then_some(()))
            }
        },
    )
    .await?;
    wait_vm(
        env,
        name,
        "ServiceExposed to be cleared",
        Duration::from_secs(30),
        |v| exposed(v).is_none(),
    )
    .await?;

    // On again, then the SmolVM is deleted: both go with it.
    set_expose(env, name, true).await?;
    wait_vm(env, name, "ServiceExposed=True again", Duration::from_secs(60), |v| {
        exposed(v).is_some_and(|(s, _, _)| s == "True")
    })
    .await?;
    ensure!(services.get_opt(name).await?.is_some(), "the Service is back");
    delete_and_wait(env, name).await?;
    ensure!(
        services.get_opt(name).await?.is_none(),
        "the Service went with the SmolVM"
    );
    ensure!(
        slices.get_opt(name).await?.is_none(),
        "the EndpointSlice went with the SmolVM"
    );
    Ok(())
}

/// Exposure is decided on every pass, whatever the machine calls did: a SmolVM whose start failed
/// (as every start does on these machines) has its Service, with its endpoint not ready, as a
/// Pod in CrashLoopBackOff keeps its Service. The controller watches the Services it makes, so
/// one deleted by hand is back within seconds, not at the next resync.
pub(crate) async fn a_vm_whose_start_failed_keeps_its_service_and_a_deleted_one_comes_back(
    env: &mut Env,
) -> anyhow::Result<()> {
    let admin = env.admin().await?;
    let services: Api<Service> = Api::namespaced(admin.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), NS);
    let name = "reach-failed";
    let spec = json!({"image": "alpine:3.20", "running": true, "resources": {"memoryMiB": 128},
        "storage": {"storageGiB": 1, "overlayGiB": 1},
        "network": {"enabled": true, "exposeService": true, "ports": [{"hostPort": free_port()?, "guestPort": 80}]}});
    kubectl_apply(env, &vm(name, spec))?.map_err(|e| anyhow!(e))?;
    let v = wait_started_or_failed(env, name).await?;
    let ready = condition(&v, constants::condition::READY)
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default();
    let runs = ready.0 == "True";
    if runs {
        println!("guests boot on this machine: the VM runs, so its endpoint is ready");
    }
    let v = wait_vm(env, name, "ServiceExposed=True", Duration::from_secs(30), |v| {
        exposed(v).is_some_and(|(s, _, _)| s == "True")
    })
    .await?;
    ensure!(
        services.get_opt(name).await?.is_some(),
        "the Service exists whatever the start did: {:?}",
        v.status
    );
    let (addresses, endpoint_ready) = endpoint(&slices, name)
        .await?
        .ok_or_else(|| anyhow!("no endpoint in the EndpointSlice"))?;
    ensure!(
        addresses == vec![NODE_INTERNAL_IP.to_string()],
        "addresses: {addresses:?}"
    );
    ensure!(
        endpoint_ready == Some(runs),
        "the endpoint is ready only while the machine runs (Ready {}/{}): {endpoint_ready:?}",
        ready.0,
        ready.1
    );

    // Deleted by hand: the watch of the controller's own Services brings it back. Without the
    // watch the next pass would come with the retry or the resync, 30 s on here: the bound of
    // 10 s tells the two apart (the time it took is printed).
    let deleted_at = std::time::Instant::now();
    services.delete(name, &Default::default()).await?;
    eventually("the deleted Service to be back", Duration::from_secs(10), || {
        let services = services.clone();
        async move {
            Ok(services
                .get_opt(name)
                .await?
                .filter(|s| s.metadata.deletion_timestamp.is_none())
                .map(|_| ()))
        }
    })
    .await?;
    println!("the deleted Service was back in {:?}", deleted_at.elapsed());
    delete_and_wait(env, name).await?;
    Ok(())
}
