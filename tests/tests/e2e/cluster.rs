//! Real-cluster conditions: admission that tells everything at once, identity rules that hold
//! without the webhook, a webhook outage that stalls no heartbeat or status write, a machine lost
//! behind the operator's back, the webhook's own ServiceAccount kept to its caBundle, the
//! controller's kept to the Services and EndpointSlices of SmolVMs, and a runtime CA rotation
//! under a running agent.

use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use serde_json::{Value, json};
use smolvm_api::{SmolVMNode, constants};
use smolvm_tests::env::{self, Env, NODE};

use crate::{
    Scenario, annotate_vm, condition, create_bound, delete_and_wait, expect_event, expect_rejected, patch_vm,
    patch_vm_status, small, vm, vms, wait_vm,
};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![
        every_violation_is_told_in_one_apply,
        machine_name_retarget_is_rejected_even_for_a_cluster_admin,
        webhook_outage_stalls_no_heartbeat_or_status_write_and_a_lost_machine_is_told,
        webhook_service_account_can_patch_only_its_ca_bundle,
        controller_service_account_writes_only_the_services_of_smolvms,
        runtime_ca_rotation_with_a_running_agent_cuts_no_node_off,
    ]
}

/// Issue 12's two examples: each `kubectl apply` answers with every violation at once, the ones
/// the CRD schema would also have caught (after mutating admission, stopping at the first) among
/// them.
pub(crate) async fn every_violation_is_told_in_one_apply(env: &mut Env) -> anyhow::Result<()> {
    let big = vm(
        "all-at-once-1",
        json!({"image": "alpine:3.20", "resources": {"cpus": 64, "memoryMiB": 100000},
            "network": {"enabled": true, "ports": [
                {"hostPort": 80, "guestPort": 80},
                {"hostPort": 8080, "guestPort": 8080},
                {"hostPort": 8080, "guestPort": 8081}]}}),
    );
    expect_rejected(
        env,
        &big,
        &[
            "spec.resources.cpus",
            "spec.network.ports[0].hostPort",
            "spec.network.ports[2]",
            "[V2]",
            "[V3]",
        ],
    )?;
    let tiny = vm(
        "all-at-once-2",
        json!({"image": "alpine:3.20", "resources": {"cpus": 4096, "memoryMiB": 1},
            "network": {"enabled": true, "ports": [{"hostPort": 22, "guestPort": 22}]}}),
    );
    expect_rejected(
        env,
        &tiny,
        &[
            "spec.resources.cpus",
            "spec.resources.memoryMiB",
            "spec.network.ports[0].hostPort",
        ],
    )?;
    Ok(())
}

/// V9: `status.machineName` is written once; a cluster admin pointing it at another VM's machine
/// is refused (by the CRD's rules, so also while the webhook is down), and the controller never
/// acts on it anyway: both machines stay.
pub(crate) async fn machine_name_retarget_is_rejected_even_for_a_cluster_admin(env: &mut Env) -> anyhow::Result<()> {
    let mine = create_bound(env, "tamper-mine", small(false)).await?;
    let theirs = create_bound(env, "tamper-theirs", small(false)).await?;
    let their_machine = theirs
        .status
        .as_ref()
        .and_then(|s| s.machine_name.clone())
        .ok_or_else(|| anyhow!("tamper-theirs has no machine name"))?;
    let patch = json!({"status": {"machineName": their_machine}}).to_string();
    let out = patch_vm_status(env, "tamper-mine", &patch)?;
    ensure!(!out.status.success(), "a cluster admin retargeted status.machineName");
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("machineName") && stderr.contains("V9"), "{stderr}");
    let now = vms(env).await?.get("tamper-mine").await?;
    ensure!(
        now.status.as_ref().and_then(|s| s.machine_name.clone()) == mine.status.and_then(|s| s.machine_name),
        "the machine name changed"
    );
    delete_and_wait(env, "tamper-mine").await?;
    ensure!(
        crate::smolvm_machine(env, &their_machine).await?.is_some(),
        "deleting tamper-mine removed tamper-theirs's machine"
    );
    delete_and_wait(env, "tamper-theirs").await
}

/// The webhook hung (SIGSTOP) for 60 s: heartbeats keep landing, the controller keeps writing
/// status (a machine removed behind its back is reported MachineLost meanwhile), a cluster admin's
/// change of the binding and a runtime writing another node's SmolVMNode are still refused, a
/// spec change is refused (fail closed), and no VM flips to Unknown. After SIGCONT the
/// recreate-lost-machine annotation is admitted and the controller makes a fresh machine.
pub(crate) async fn webhook_outage_stalls_no_heartbeat_or_status_write_and_a_lost_machine_is_told(
    env: &mut Env,
) -> anyhow::Result<()> {
    let name = "outage-lost";
    let created = create_bound(env, name, small(false)).await?;
    let machine = created
        .status
        .as_ref()
        .and_then(|s| s.machine_name.clone())
        .ok_or_else(|| anyhow!("{name} has no machine name"))?;
    wait_vm(
        env,
        name,
        "phase Stopped with effective resources",
        Duration::from_secs(90),
        |v| {
            v.status
                .as_ref()
                .is_some_and(|s| s.phase == Some(smolvm_api::Phase::Stopped) && s.effective.is_some())
        },
    )
    .await?;
    let admin = env.admin().await?;
    let nodes: Api<SmolVMNode> = Api::all(admin.clone());
    let api = vms(env).await?;
    let interval = env.options.heartbeat;

    let webhook = env.webhook.as_ref().ok_or_else(|| anyhow!("no webhook running"))?;
    webhook.pause();
    let outage = Duration::from_secs(60);
    let started = Instant::now();
    let result: anyhow::Result<(f64, bool)> = async {
        // The machine vanishes from its node (state wiped), behind the operator's back.
        crate::smolvm_delete(&env.smolvm_socket(), &machine).await?;
        // Fail closed: a spec change is refused (the API server's 5 s webhook timeout).
        let out = patch_vm(env, name, r#"{"spec":{"running":true}}"#)?;
        ensure!(!out.status.success(), "a spec change was admitted without the webhook");
        // Identity rules hold: an admin's binding change, a runtime writing another node.
        let out = patch_vm_status(env, name, r#"{"status":{"nodeName":"elsewhere"}}"#)?;
        ensure!(
            !out.status.success(),
            "an admin moved the binding while the webhook was down"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(stderr.contains("V9"), "{stderr}");
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), env::NAMESPACE);
        let pod = pods.get(&format!("smolvm-runtime-{NODE}")).await?;
        let token = env::token_for(&admin, env::SA_RUNTIME, Some(&pod)).await?;
        let kubeconfig = env.plane.kubeconfig_for("runtime-outage", &token)?;
        let other = json!({"apiVersion": constants::API_VERSION, "kind": "SmolVMNode",
            "metadata": {"name": "someone-elses-node"}, "spec": {}});
        let out = env::kubectl(&kubeconfig, &["create", "-f", "-"], Some(&other.to_string()))?;
        ensure!(!out.status.success(), "a runtime created another node's SmolVMNode");
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(stderr.contains("[V10]"), "{stderr}");

        // Sample heartbeat ages and every VM's Ready condition until the outage ends.
        let (mut worst_age, mut lost_seen) = (0.0f64, false);
        while started.elapsed() < outage {
            let node = nodes.get(NODE).await?;
            let beat = node
                .status
                .as_ref()
                .and_then(|s| s.heartbeat_time.clone())
                .ok_or_else(|| anyhow!("the SmolVMNode has no heartbeat"))?;
            let age = Timestamp::now().duration_since(beat.0).as_secs_f64();
            worst_age = worst_age.max(age);
            for v in api.list(&Default::default()).await? {
                let ready = condition(&v, constants::condition::READY);
                ensure!(
                    ready.is_none_or(|c| c.status != "Unknown"),
                    "{} flipped to Unknown during the outage: {:?}",
                    v.metadata.name.clone().unwrap_or_default(),
                    ready
                );
                if v.metadata.name.as_deref() == Some(name)
                    && ready.is_some_and(|c| c.reason == constants::reason::MACHINE_LOST)
                {
                    lost_seen = true;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Ok((worst_age, lost_seen))
    }
    .await;
    webhook.resume();
    let (worst_age, lost_seen) = result?;
    println!(
        "    webhook stopped {:.0}s: oldest heartbeat seen {worst_age:.1}s (interval {}s); MachineLost written during the outage: {lost_seen}",
        started.elapsed().as_secs_f64(),
        interval.as_secs()
    );
    ensure!(
        worst_age < 2.0 * interval.as_secs_f64() + 1.0,
        "heartbeats stalled: {worst_age:.1}s old with a {}s interval",
        interval.as_secs()
    );
    ensure!(lost_seen, "the controller wrote no MachineLost during the outage");
    let lost = api.get(name).await?;
    ensure!(lost.status.as_ref().and_then(|s| s.phase) == Some(smolvm_api::Phase::Failed));
    ensure!(
        crate::smolvm_machine(env, &machine).await?.is_none(),
        "the lost machine was re-created empty behind the user's back"
    );
    expect_event(env, name, constants::reason::MACHINE_LOST).await?;

    // After the outage: the annotation asks for a fresh machine; it is admitted with a warning,
    // acted on and removed.
    let annotation = format!("{}=true", constants::RECREATE_LOST_MACHINE_ANNOTATION);
    let out = annotate_vm(env, name, &annotation)?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    ensure!(
        String::from_utf8_lossy(&out.stderr).contains("[V7]"),
        "no admission warning: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_vm(
        env,
        name,
        "a fresh machine, annotation removed",
        Duration::from_secs(90),
        |v| {
            v.status.as_ref().and_then(|s| s.phase) == Some(smolvm_api::Phase::Stopped)
                && !v
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(constants::RECREATE_LOST_MACHINE_ANNOTATION))
        },
    )
    .await?;
    ensure!(
        crate::smolvm_machine(env, &machine).await?.is_some(),
        "no machine after the recreate request"
    );
    expect_event(env, name, "Recreated").await?;
    // On a VM whose machine is not lost, the annotation is refused.
    let out = annotate_vm(env, name, &annotation)?;
    ensure!(!out.status.success(), "recreate-lost-machine admitted on a healthy VM");
    delete_and_wait(env, name).await
}

/// The webhook's own ServiceAccount (self-signed mode) may patch the caBundle of its two
/// configurations, and nothing else: adding a rule for Pods is refused by a
/// ValidatingAdmissionPolicy.
pub(crate) async fn webhook_service_account_can_patch_only_its_ca_bundle(env: &mut Env) -> anyhow::Result<()> {
    let (_, kubeconfig) = env.service_account_client(env::SA_WEBHOOK).await?;
    let current = env.kubectl(
        &[
            "get",
            "validatingwebhookconfiguration",
            "smolvm-webhook",
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ],
        None,
    )?;
    let bundle = String::from_utf8_lossy(&current.stdout).into_owned();
    ensure!(!bundle.is_empty(), "no caBundle to patch");
    let as_webhook = |patch: Value| {
        env::kubectl(
            &kubeconfig,
            &[
                "patch",
                "validatingwebhookconfiguration",
                "smolvm-webhook",
                "--type=json",
                "-p",
                &patch.to_string(),
            ],
            None,
        )
    };
    let out = as_webhook(json!([
        {"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}
    ]))?;
    ensure!(
        out.status.success(),
        "the webhook could not patch its caBundle: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = as_webhook(json!([
        {"op": "add", "path": "/webhooks/0/rules/-", "value": {
            "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}}
    ]))?;
    ensure!(
        !out.status.success(),
        "the webhook's ServiceAccount added a rule for Pods"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("caBundle"), "{stderr}");
    let out = as_webhook(json!([
        {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}
    ]))?;
    ensure!(
        !out.status.success(),
        "the webhook's ServiceAccount relaxed its failure policy"
    );
    Ok(())
}

/// The controller's ServiceAccount may create, patch and delete Services and EndpointSlices
/// anywhere (RBAC), but the ValidatingAdmissionPolicy smolvm-controller-own-services keeps it to
/// those it makes for a SmolVM (its managed-by label and a SmolVM controller owner reference):
/// it cannot create another, take over a Service it did not make, or delete one.
pub(crate) async fn controller_service_account_writes_only_the_services_of_smolvms(
    env: &mut Env,
) -> anyhow::Result<()> {
    const POLICY: &str = "smolvm-controller-own-services";
    let (_, kubeconfig) = env.service_account_client(env::SA_CONTROLLER).await?;
    let ns = crate::NS;
    let owner = json!([{
        "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM", "name": "vap-owner",
        "uid": "6f1c0a52-0000-4000-8000-00000000c0de", "controller": true,
    }]);
    let managed = json!({"app.kubernetes.io/managed-by": "smolvm-controller"});
    let service = |name: &str, labels: &Value, owners: &Value| {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": owners},
            "spec": {"ports": [{"port": 80, "protocol": "TCP"}]},
        })
        .to_string()
    };
    let as_controller = |args: &[&str], stdin: Option<&str>| env::kubectl(&kubeconfig, args, stdin);
    let refused = |out: std::process::Output, what: &str| -> anyhow::Result<()> {
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "the controller's ServiceAccount could {what}");
        ensure!(
            stderr.contains(POLICY),
            "{what}: refused, but not by {POLICY}: {stderr}"
        );
        Ok(())
    };
    let succeeded = |out: std::process::Output, what: &str| -> anyhow::Result<()> {
        ensure!(
            out.status.success(),
            "the controller's ServiceAccount could not {what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };

    // Objects that are not a SmolVM's: refused, a Service and an EndpointSlice alike.
    let out = as_controller(
        &["create", "-f", "-"],
        Some(&service("vap-plain", &json!({}), &json!([]))),
    )?;
    refused(out, "create a Service that is not a SmolVM's")?;
    let out = as_controller(
        &["create", "-f", "-"],
        Some(&service("vap-label-only", &managed, &json!([]))),
    )?;
    refused(out, "create a Service with the label but no SmolVM owner")?;
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "vap-slice", "namespace": ns, "labels": {"kubernetes.io/service-name": "vap-plain"}},
        "addressType": "IPv4", "endpoints": [],
    });
    let out = as_controller(&["create", "-f", "-"], Some(&slice.to_string()))?;
    refused(out, "create an EndpointSlice that is not a SmolVM's")?;

    // One it makes for a SmolVM: created, changed and deleted.
    let out = as_controller(&["create", "-f", "-"], Some(&service("vap-own", &managed, &owner)))?;
    succeeded(out, "create a SmolVM's Service")?;
    let out = as_controller(
        &[
            "label",
            "service",
            "vap-own",
            "-n",
            ns,
            "vm.smolvm.dev/smolvm=vap-owner",
        ],
        None,
    )?;
    succeeded(out, "change a SmolVM's Service")?;
    let out = as_controller(
        &["label", "service", "vap-own", "-n", ns, "app.kubernetes.io/managed-by-"],
        None,
    )?;
    refused(out, "strip its own Service of the managed-by label")?;
    let out = as_controller(&["delete", "service", "vap-own", "-n", ns], None)?;
    succeeded(out, "delete a SmolVM's Service")?;

    // Someone else's Service: neither taken over nor deleted.
    let out = env.kubectl(
        &["create", "-f", "-"],
        Some(&service("vap-foreign", &json!({}), &json!([]))),
    )?;
    ensure!(
        out.status.success(),
        "the admin's Service: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let takeover = json!({"metadata": {"labels": managed, "ownerReferences": owner}}).to_string();
    let out = as_controller(
        &[
            "patch",
            "service",
            "vap-foreign",
            "-n",
            ns,
            "--type=merge",
            "-p",
            &takeover,
        ],
        None,
    )?;
    refused(out, "take over another's Service")?;
    let out = as_controller(&["delete", "service", "vap-foreign", "-n", ns], None)?;
    refused(out, "delete another's Service")?;
    let out = env.kubectl(&["delete", "service", "vap-foreign", "-n", ns], None)?;
    ensure!(
        out.status.success(),
        "cleaning up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The CA fingerprint in a PEM bundle's first certificate, and how many certificates it holds.
fn first_fingerprint(pem: &str) -> anyhow::Result<(String, usize)> {
    let chain = smolvm_certs::parse_pem_chain(pem)?;
    let first = chain.first().ok_or_else(|| anyhow!("empty bundle"))?;
    Ok((smolvm_certs::fingerprint(first), chain.len()))
}

/// The runtime CA Secret's signing CA fingerprint and whether a rotation is under way.
async fn runtime_ca_state(env: &Env) -> anyhow::Result<(String, bool)> {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(env.admin().await?, env::NAMESPACE);
    let secret = secrets.get(constants::RUNTIME_CA).await?;
    let data = secret.data.unwrap_or_default();
    let crt = data
        .get("tls.crt")
        .ok_or_else(|| anyhow!("the CA Secret has no tls.crt"))?;
    let (fingerprint, _) = first_fingerprint(&String::from_utf8_lossy(&crt.0))?;
    Ok((fingerprint, data.contains_key("previous.crt")))
}

async fn node_ca_fingerprint(env: &Env) -> anyhow::Result<Option<String>> {
    let nodes: Api<SmolVMNode> = Api::all(env.admin().await?);
    Ok(nodes
        .get(NODE)
        .await?
        .status
        .and_then(|s| s.serving_certificate)
        .and_then(|c| c.ca_fingerprint))
}

/// A runtime CA rotation asked for with the Secret's annotation, while the agent runs and VMs are
/// created: the agent re-files its serving certificate as soon as it trusts the new bundle, the
/// controller drops the old CA only after the node reports the new one, no VM is ever told its
/// node is unreachable, and the node API works with the new CA alone afterwards (a VM created and
/// deleted through it).
pub(crate) async fn runtime_ca_rotation_with_a_running_agent_cuts_no_node_off(env: &mut Env) -> anyhow::Result<()> {
    let (old, rotating) = runtime_ca_state(env).await?;
    ensure!(!rotating, "a rotation is already under way");
    let reported = env::eventually("the node to report its CA", Duration::from_secs(30), || async {
        node_ca_fingerprint(env).await
    })
    .await?;
    ensure!(
        reported == old,
        "the node reports CA {reported}, the Secret holds {old}"
    );
    create_bound(env, "ca-before", small(false)).await?;

    let out = env.kubectl(
        &[
            "annotate",
            "secret",
            "-n",
            env::NAMESPACE,
            constants::RUNTIME_CA,
            &format!("{}=true", constants::ROTATE_RUNTIME_CA_ANNOTATION),
        ],
        None,
    )?;
    ensure!(
        out.status.success(),
        "annotate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started = Instant::now();
    // A VM created while the rotation runs: its calls cross the rotation.
    create_bound(env, "ca-during", small(false)).await?;
    let api = vms(env).await?;
    let mut saw_rotation = false;
    let new = loop {
        ensure!(
            started.elapsed() < Duration::from_secs(120),
            "the rotation did not finish within 120 s (rotation seen: {saw_rotation})"
        );
        for name in ["ca-before", "ca-during"] {
            let vm = api.get(name).await?;
            let ready = condition(&vm, constants::condition::READY);
            ensure!(
                ready.is_none_or(|c| c.reason != constants::reason::NODE_UNREACHABLE),
                "{name} was told its node is unreachable during the rotation: {ready:?}"
            );
        }
        let (current, rotating) = runtime_ca_state(env).await?;
        saw_rotation |= rotating;
        if current != old && !rotating {
            break current;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "    runtime CA rotated in {:.1}s (under way seen: {saw_rotation})",
        started.elapsed().as_secs_f64()
    );
    ensure!(
        node_ca_fingerprint(env).await?.as_deref() == Some(new.as_str()),
        "the rotation finished before the node reported the new CA"
    );
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(env.admin().await?, env::NAMESPACE);
    let bundle = configmaps
        .get(constants::RUNTIME_CA)
        .await?
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .unwrap_or_default();
    ensure!(
        first_fingerprint(&bundle)? == (new.clone(), 1),
        "the published bundle is not the new CA alone"
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(env.admin().await?, env::NAMESPACE);
    let annotations = secrets
        .get(constants::RUNTIME_CA)
        .await?
        .metadata
        .annotations
        .unwrap_or_default();
    ensure!(
        !annotations.contains_key(constants::ROTATE_RUNTIME_CA_ANNOTATION),
        "the rotation request was not cleared"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.admin().await?, env::NAMESPACE);
    let reasons: Vec<String> = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(constants::RUNTIME_CA))
        .filter_map(|e| e.reason)
        .collect();
    for reason in ["RuntimeCARotationStarted", "RuntimeCARotated"] {
        ensure!(
            reasons.iter().any(|r| r == reason),
            "no {reason} event; events: {reasons:?}"
        );
    }
    // The node API with the new CA alone: a machine created and deleted through it.
    create_bound(env, "ca-after", small(false)).await?;
    for name in ["ca-before", "ca-during", "ca-after"] {
        delete_and_wait(env, name).await?;
    }
    Ok(())
}
