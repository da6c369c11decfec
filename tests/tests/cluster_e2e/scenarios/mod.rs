//! The inner process: the node, the deployment through `make deploy`, and the scenarios.

use std::{
    future::Future,
    path::PathBuf,
    pin::Pin,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail, ensure};
use k8s_openapi::api::{
    admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
    apps::v1::{DaemonSet, Deployment},
    certificates::v1::CertificateSigningRequest,
    coordination::v1::Lease,
    core::v1::{Node as KubeNode, Pod, Secret},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, EvictParams, ListParams},
};
use serde_json::Value;
use smolvm_api::{SmolVM, SmolVMNode};
use smolvm_tests::{
    assets,
    cluster::{NODE_IP, NODE_NAME, OPERATOR_IMAGE, PROBE_IMAGE, RUNTIME_IMAGE, node::Node},
    env::{eventually, repo_root},
};

use crate::{DONE_MARKER, InnerSettings};

mod helm;
mod monitoring;
mod quota;
mod volumes;
use helm::the_helm_chart_installs_upgrades_and_uninstalls;
use monitoring::prometheus_scrapes_the_pods_and_fires_webhook_down_when_the_webhook_stops;
use quota::quota_counts_are_enforced_natively_and_the_products_figures_survive_the_quota_controller;
use volumes::volumes_are_mounted_by_the_kubelet_and_passed_to_smolvm;

const NS: &str = "smolvm-system";

/// What each scenario gets.
pub struct Ctx {
    node: Node,
    client: Client,
}

type Outcome<'a> = Pin<Box<dyn Future<Output = anyhow::Result<()>> + 'a>>;
type Scenario = for<'a> fn(&'a mut Ctx) -> Outcome<'a>;

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), (|c| Box::pin($name(c))) as Scenario)),*]
    };
}

fn all() -> Vec<(&'static str, Scenario)> {
    scenarios![
        every_pod_of_deploy_default_becomes_ready,
        the_example_is_defaulted_validated_placed_and_created,
        quota_counts_are_enforced_natively_and_the_products_figures_survive_the_quota_controller,
        kubectl_smolvm_follows_the_built_in_roles,
        one_webhook_pod_evicted_applies_keep_working,
        the_runtime_pod_deleted_comes_back_and_loses_nothing,
        // The node has room for one 1-CPU VM (2 CPUs, 1 kept for the host by
        // `--reserved-cpus=auto`): the scenarios below need the example gone first.
        delete_waits_for_the_node_then_the_object_goes,
        volumes_are_mounted_by_the_kubelet_and_passed_to_smolvm,
        a_pod_on_the_bridge_reaches_the_node_address,
        the_controller_pod_deleted_hands_the_lease_over,
        // It stops the webhook (and brings it back).
        prometheus_scrapes_the_pods_and_fires_webhook_down_when_the_webhook_stops,
        // Last: it replaces the kustomize install with the Helm chart's, then uninstalls it.
        the_helm_chart_installs_upgrades_and_uninstalls,
    ]
}

/// The scenarios' names, in order.
pub fn names() -> Vec<&'static str> {
    all().into_iter().map(|(n, _)| n).collect()
}

/// The inner process's whole run.
pub async fn inner(dir: PathBuf, settings: InnerSettings, selected: Vec<&'static str>, dev: bool) -> ExitCode {
    let result = async {
        let assets = assets::find_cluster().map_err(|e| anyhow!(e))?;
        std::fs::create_dir_all(&dir)?;
        let started = Instant::now();
        let node = Node::start(&assets, &dir, &settings.cgroup_root, &settings.images).await?;
        println!(
            "node {NODE_NAME} Ready in {:.1}s (Kubernetes {}; logs in {})",
            started.elapsed().as_secs_f64(),
            server_version(&node).await.unwrap_or_default(),
            dir.display()
        );
        let started = Instant::now();
        deploy(&node)?;
        println!(
            "make deploy applied deploy/default in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        let client = node.admin().await?;
        anyhow::Ok(Ctx { node, client })
    }
    .await;
    let mut ctx = match result {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("error: the node did not come up: {e:#}");
            for name in selected.iter().filter(|n| **n != crate::TEARDOWN_SCENARIO) {
                println!("test {name} ... FAILED (no node)");
            }
            return ExitCode::FAILURE;
        }
    };
    if dev {
        return dev_mode(ctx).await;
    }
    let mut failed = 0;
    for (name, scenario) in all().into_iter().filter(|(n, _)| selected.contains(n)) {
        let started = Instant::now();
        match scenario(&mut ctx).await {
            Ok(()) => println!("test {name} ... ok ({:.1}s)", started.elapsed().as_secs_f64()),
            Err(e) => {
                failed += 1;
                println!(
                    "test {name} ... FAILED ({:.1}s)\n    {e:#}",
                    started.elapsed().as_secs_f64()
                );
                for component in ["kubelet", "containerd"] {
                    println!(
                        "    --- {component} (last lines)\n{}",
                        indent(&ctx.node.log_tail(component, 8))
                    );
                }
            }
        }
    }
    println!("{DONE_MARKER}");
    // The outer process interrupts us as Ctrl-C would; give up waiting after a while.
    let _ = tokio::time::timeout(Duration::from_secs(120), tokio::signal::ctrl_c()).await;
    drop(ctx);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn dev_mode(ctx: Ctx) -> ExitCode {
    // The example goes through the webhook: apply it once the webhook's pods serve.
    let example = repo_root().join("deploy/examples/alpine.yaml");
    let applied = match all_pods_ready(&ctx).await {
        Ok(()) => ctx.node.kubectl(&["apply", "-f", &example.display().to_string()], None),
        Err(e) => Err(e),
    };
    let netns = format!("smolvm-ce2e-{}", std::os::unix::process::parent_id());
    println!(
        "\nsmolvm-operator runs as pods on the node {NODE_NAME} ({}).\n\
         The node lives in the network namespace {netns}; reach it from this machine with\n\n\
         \x20 ip netns exec {netns} env KUBECONFIG={} kubectl get pods -n smolvm-system\n\
         \x20 ip netns exec {netns} env KUBECONFIG={} kubectl get svm,svmn\n\n\
         example: {}\n\
         logs:    {}/*.log\n\n\
         Ctrl-C stops the node and removes everything it made.",
        ctx.node.url,
        ctx.node.admin_kubeconfig.display(),
        ctx.node.admin_kubeconfig.display(),
        applied
            .map(
                |o| String::from_utf8_lossy(if o.status.success() { &o.stdout } else { &o.stderr })
                    .trim()
                    .to_string()
            )
            .unwrap_or_else(|e| format!("{e:#}")),
        ctx.node.dir.display(),
    );
    let _ = tokio::signal::ctrl_c().await;
    drop(ctx);
    ExitCode::SUCCESS
}

/// `make deploy IMG=… RUNTIME_IMG=…`, exactly as a user runs it.
fn deploy(node: &Node) -> anyhow::Result<()> {
    let out = std::process::Command::new("make")
        .current_dir(repo_root())
        .args([
            "--no-print-directory",
            "deploy",
            &format!("IMG={OPERATOR_IMAGE}"),
            &format!("RUNTIME_IMG={RUNTIME_IMAGE}"),
        ])
        .env("KUBECONFIG", &node.admin_kubeconfig)
        .env(
            "KUBECACHEDIR",
            smolvm_tests::env::kube_cache_dir(&node.admin_kubeconfig),
        )
        .output()
        .context("running make deploy")?;
    if !out.status.success() {
        bail!(
            "make deploy failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

async fn server_version(node: &Node) -> anyhow::Result<String> {
    Ok(node.admin().await?.apiserver_version().await?.git_version)
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("      {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn kubectl_ok(ctx: &Ctx, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    let out = ctx.node.kubectl(args, stdin)?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ready_replicas(d: &Deployment) -> i32 {
    d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0)
}

fn condition<'a>(
    conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    kind: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions.iter().find(|c| c.type_ == kind)
}

async fn pods(ctx: &Ctx, app: &str) -> anyhow::Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), NS);
    Ok(api
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
        .await?
        .items)
}

fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn lease_holder(ctx: &Ctx) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), NS);
    Ok(leases
        .get_opt("smolvm-controller")
        .await?
        .and_then(|l| l.spec.and_then(|s| s.holder_identity)))
}

async fn smolvm_node(ctx: &Ctx) -> anyhow::Result<Option<SmolVMNode>> {
    Ok(Api::<SmolVMNode>::all(ctx.client.clone()).get_opt(NODE_NAME).await?)
}

fn machines(node: &SmolVMNode) -> Vec<String> {
    node.status
        .as_ref()
        .and_then(|s| s.machines.clone())
        .unwrap_or_default()
}

/// Waits until the two webhook and two controller replicas and the runtime pod are Ready.
async fn all_pods_ready(ctx: &Ctx) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), NS);
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), NS);
    eventually(
        "two ready webhook and two ready controller replicas, one ready runtime pod",
        Duration::from_secs(300),
        || async {
            let webhook = deployments.get("smolvm-webhook").await?;
            let controller = deployments.get("smolvm-controller").await?;
            let runtime = daemonsets.get("smolvm-runtime").await?;
            let runtime_ready = runtime.status.as_ref().map_or(0, |s| s.number_ready);
            Ok((ready_replicas(&webhook) == 2 && ready_replicas(&controller) == 2 && runtime_ready == 1).then_some(()))
        },
    )
    .await
    .map_err(|e| e.context(pod_summary_blocking(ctx)))
}

/// Every pod of `deploy/default` becomes Ready; the runtime's serving certificate came from a
/// real CSR filed with its kubelet-projected, pod-bound token; its SmolVMNode turns Ready.
async fn every_pod_of_deploy_default_becomes_ready(ctx: &mut Ctx) -> anyhow::Result<()> {
    let started = Instant::now();
    all_pods_ready(ctx).await?;
    println!(
        "    all pods Ready {:.1}s after deploy",
        started.elapsed().as_secs_f64()
    );
    for pod in pods(ctx, "smolvm-webhook")
        .await?
        .iter()
        .chain(&pods(ctx, "smolvm-controller").await?)
    {
        let image = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone());
        ensure!(
            image.as_deref() == Some(OPERATOR_IMAGE),
            "{} runs {image:?}",
            pod.name_any()
        );
    }
    let holder = eventually("a controller holding the Lease", Duration::from_secs(60), || async {
        lease_holder(ctx).await
    })
    .await?;
    let controllers: Vec<String> = pods(ctx, "smolvm-controller")
        .await?
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    ensure!(
        controllers.contains(&holder),
        "the Lease is held by {holder}, not by a controller pod ({controllers:?})"
    );
    println!("    leader {holder}");

    let csrs: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let csr = csrs
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|c| c.spec.signer_name == "vm.smolvm.dev/runtime-serving")
        .context("no CSR for the runtime-serving signer")?;
    ensure!(
        csr.spec.username.as_deref() == Some("system:serviceaccount:smolvm-system:smolvm-runtime"),
        "the runtime CSR was filed by {:?}",
        csr.spec.username
    );
    let node_claim = csr
        .spec
        .extra
        .as_ref()
        .and_then(|e| e.get("authentication.kubernetes.io/node-name"))
        .and_then(|v| v.first().cloned());
    ensure!(
        node_claim.as_deref() == Some(NODE_NAME),
        "the runtime's token carries node-name {node_claim:?}: not a kubelet-projected, pod-bound token"
    );
    let pod_claim = csr
        .spec
        .extra
        .as_ref()
        .and_then(|e| e.get("authentication.kubernetes.io/pod-name"));
    ensure!(pod_claim.is_some(), "the runtime's token is not bound to its pod");
    ensure!(
        csr.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some(),
        "the runtime CSR {} has no certificate",
        csr.name_any()
    );
    let node = eventually("SmolVMNode Ready", Duration::from_secs(120), || async {
        Ok(smolvm_node(ctx).await?.filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| condition(&s.conditions, "Ready"))
                .is_some_and(|c| c.status == "True")
        }))
    })
    .await?;
    let kube_node = Api::<KubeNode>::all(ctx.client.clone()).get(NODE_NAME).await?;
    let status = node.status.as_ref().context("no SmolVMNode status")?;
    ensure!(
        status.node_uid == kube_node.uid(),
        "SmolVMNode nodeUID {:?} is not the Node's {:?}",
        status.node_uid,
        kube_node.uid()
    );
    let endpoint = status.endpoint.as_ref().context("no endpoint")?;
    ensure!(
        endpoint.address == NODE_IP,
        "the runtime reports endpoint {}, not the node's address",
        endpoint.address
    );
    println!(
        "    CSR {} signed for {node_claim:?}; SmolVMNode Ready, endpoint {}:{}, smolvm {}",
        csr.name_any(),
        endpoint.address,
        endpoint.port,
        status.runtime_version.as_deref().unwrap_or("?")
    );
    node_labels_are_mirrored_by_the_controller(ctx, &kube_node).await?;
    guest_boot_check_reports_then_is_turned_off(ctx).await
}

/// The labels the kubelet gave its Node reach the SmolVMNode through the controller (its field
/// manager owns them), with `vm.smolvm.dev/node` naming the node: the agent sets only its own
/// labels there (V10, issue 56).
async fn node_labels_are_mirrored_by_the_controller(ctx: &Ctx, kube_node: &KubeNode) -> anyhow::Result<()> {
    let want: Vec<(String, String)> = kube_node
        .labels()
        .iter()
        .filter(|(k, _)| !k.starts_with("vm.smolvm.dev/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ensure!(
        want.iter().any(|(k, _)| k == "kubernetes.io/hostname"),
        "the kubelet set no hostname label: {want:?}"
    );
    let node = eventually(
        "the Node's labels on its SmolVMNode",
        Duration::from_secs(60),
        || async {
            Ok(smolvm_node(ctx).await?.filter(|n| {
                let labels = n.labels();
                want.iter().all(|(k, v)| labels.get(k) == Some(v))
                    && labels.get("vm.smolvm.dev/node").map(String::as_str) == Some(NODE_NAME)
            }))
        },
    )
    .await?;
    let by_controller = node.managed_fields().iter().any(|entry| {
        entry.manager.as_deref() == Some("smolvm-controller")
            && entry
                .fields_v1
                .as_ref()
                .is_some_and(|f| f.0["f:metadata"]["f:labels"].get("f:kubernetes.io/hostname").is_some())
    });
    ensure!(
        by_controller,
        "the SmolVMNode's labels were not written by the controller: {:?}",
        node.managed_fields()
    );
    println!(
        "    {} Node labels mirrored onto the SmolVMNode by the controller",
        want.len()
    );
    Ok(())
}

/// deploy/default runs the guest boot check: the node reports GuestBootable (False here, where
/// no guest boots, with the cleaned cause). The scenarios after this one place VMs on this node,
/// so the harness then turns the check off (`SMOLVM_RUNTIME_CANARY=off`, as a harness on such a
/// machine must) and waits until the condition is withdrawn.
async fn guest_boot_check_reports_then_is_turned_off(ctx: &mut Ctx) -> anyhow::Result<()> {
    let started = Instant::now();
    let guest = eventually("the guest boot check's result", Duration::from_secs(240), || async {
        Ok(smolvm_node(ctx).await?.and_then(|n| {
            n.status
                .as_ref()
                .and_then(|s| condition(&s.conditions, "GuestBootable"))
                .filter(|c| c.status != "Unknown")
                .cloned()
        }))
    })
    .await?;
    println!(
        "    guest boot check: GuestBootable={} {} after {:.1}s: {}",
        guest.status,
        guest.reason,
        started.elapsed().as_secs_f64(),
        guest.message
    );
    ensure!(
        guest.status == "True" || guest.reason == "CanaryFailed",
        "GuestBootable {}/{}",
        guest.status,
        guest.reason
    );
    ensure!(
        !guest.message.contains('\u{1b}'),
        "the cause is cleaned: {}",
        guest.message
    );
    if guest.status == "True" {
        return Ok(());
    }
    kubectl_ok(
        ctx,
        &[
            "-n",
            "smolvm-system",
            "set",
            "env",
            "daemonset/smolvm-runtime",
            "SMOLVM_RUNTIME_CANARY=off",
        ],
        None,
    )?;
    // The DaemonSet updates OnDelete (replacing an agent pod ends its VMs): the pod is replaced
    // by hand, as docs/operations.md's upgrade says; no VM runs yet.
    kubectl_ok(
        ctx,
        &[
            "-n",
            "smolvm-system",
            "delete",
            "pod",
            "-l",
            "app.kubernetes.io/name=smolvm-runtime",
            "--wait=false",
        ],
        None,
    )?;
    eventually(
        "GuestBootable withdrawn (check off)",
        Duration::from_secs(180),
        || async {
            Ok(smolvm_node(ctx).await?.filter(|n| {
                n.status.as_ref().is_some_and(|s| {
                    condition(&s.conditions, "GuestBootable").is_none()
                        && condition(&s.conditions, "Ready").is_some_and(|c| c.status == "True")
                })
            }))
        },
    )
    .await?;
    all_pods_ready(ctx).await?;
    println!("    guest boot check turned off for the scenarios that place VMs on this node");
    Ok(())
}

fn pod_summary_blocking(ctx: &Ctx) -> String {
    ctx.node
        .kubectl(&["get", "pods", "-A", "-o", "wide"], None)
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The README's example goes through the webhook Service (defaulted, validated), an invalid one
/// is rejected with every violation, and the VM is placed, bound and created in smolvm inside the
/// DaemonSet pod, ending StartFailed with smolvm's cleaned message where guests cannot boot.
/// `kubectl smolvm` through the controller pods' access API, behind the real aggregator (pod
/// endpoints, `--enable-aggregator-routing`), with the built-in roles picking up the install's
/// roles by aggregation (kube-controller-manager runs here): `view` reads the log but may not
/// exec, `edit` may exec (409 on the example, which does not run here), no role is Forbidden.
async fn kubectl_smolvm_follows_the_built_in_roles(ctx: &mut Ctx) -> anyhow::Result<()> {
    let plugin = assets::operator_bins()?.plugin;
    let kubeconfig = ctx.node.admin_kubeconfig.display().to_string();
    let run = |user: &str, args: &[&str]| -> anyhow::Result<std::process::Output> {
        let mut all = vec!["--kubeconfig", kubeconfig.as_str(), "-n", "default", "--as", user];
        all.extend_from_slice(args);
        Ok(std::process::Command::new(&plugin).args(&all).output()?)
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    smolvm_tests::env::wait_api_service_available(
        &ctx.node.admin_kubeconfig,
        "v1alpha1.subresources.vm.smolvm.dev",
        Duration::from_secs(90),
    )
    .await?;
    for (user, role) in [("viewer", "view"), ("editor", "edit")] {
        kubectl_ok(
            ctx,
            &[
                "create",
                "rolebinding",
                &format!("{user}-{role}"),
                &format!("--clusterrole={role}"),
                &format!("--user={user}"),
                "-n",
                "default",
            ],
            None,
        )?;
    }
    let started = std::time::Instant::now();
    eventually(
        "view to read the log (the role aggregated)",
        Duration::from_secs(60),
        || async {
            let out = run("viewer", &["logs", "alpine", "--tail", "20"])?;
            Ok(out.status.success().then_some(()))
        },
    )
    .await?;
    println!(
        "    (kubectl smolvm logs as a `view` user: ok after {:.1}s)",
        started.elapsed().as_secs_f64()
    );
    let out = run("viewer", &["exec", "alpine", "--", "true"])?;
    ensure!(
        text(&out.stderr).contains("Forbidden"),
        "exec as a `view` user: {}",
        text(&out.stderr)
    );
    let out = run("nobody", &["logs", "alpine"])?;
    ensure!(
        text(&out.stderr).contains("Forbidden"),
        "logs with no role: {}",
        text(&out.stderr)
    );
    let out = run("editor", &["exec", "alpine", "--", "true"])?;
    ensure!(
        out.status.success() || text(&out.stderr).contains("Conflict"),
        "exec as an `edit` user: {}",
        text(&out.stderr)
    );
    Ok(())
}

async fn the_example_is_defaulted_validated_placed_and_created(ctx: &mut Ctx) -> anyhow::Result<()> {
    let example = repo_root().join("deploy/examples/alpine.yaml");
    kubectl_ok(ctx, &["apply", "-f", &example.display().to_string()], None)?;
    let vms: Api<SmolVM> = Api::namespaced(ctx.client.clone(), "default");
    let vm = vms.get("alpine").await?;
    ensure!(
        vm.finalizers().iter().any(|f| f == "vm.smolvm.dev/node-cleanup"),
        "M2: no finalizer"
    );
    let storage = serde_json::to_value(&vm.spec)?["storage"].clone();
    ensure!(
        storage["storageGiB"] == 20 && storage["overlayGiB"] == 10,
        "M1: storage defaults not applied: {storage}"
    );

    let invalid = r#"{"apiVersion":"vm.smolvm.dev/v1alpha1","kind":"SmolVM","metadata":{"name":"invalid","namespace":"default"},
        "spec":{"image":"Not A Reference!","resources":{"cpus":999},"network":{"enabled":true,"ports":[{"hostPort":80,"guestPort":80}]}}}"#;
    let out = ctx.node.kubectl(&["apply", "-f", "-"], Some(invalid))?;
    ensure!(!out.status.success(), "an invalid SmolVM was admitted");
    let err = String::from_utf8_lossy(&out.stderr);
    for rule in ["[V1]", "[V2]", "[V3]"] {
        ensure!(err.contains(rule), "the rejection does not list {rule}: {err}");
    }
    ensure!(
        err.contains("spec.image") && err.contains("spec.resources.cpus"),
        "the rejection does not name the fields: {err}"
    );
    println!("    invalid SmolVM rejected with V1, V2 and V3 in one answer");

    let kube_node = Api::<KubeNode>::all(ctx.client.clone()).get(NODE_NAME).await?;
    let started = Instant::now();
    let vm = eventually("the example bound to the node", Duration::from_secs(60), || async {
        Ok(vms.get("alpine").await?.status.filter(|s| s.node_name.is_some()))
    })
    .await?;
    ensure!(
        vm.node_name.as_deref() == Some(NODE_NAME),
        "bound to {:?}",
        vm.node_name
    );
    ensure!(
        vm.node_uid == kube_node.uid(),
        "bound to node UID {:?}, the Node's is {:?}",
        vm.node_uid,
        kube_node.uid()
    );
    let uid = vms.get("alpine").await?.uid().context("no uid")?;
    let machine = format!("svm-{uid}");
    ensure!(
        vm.machine_name.as_deref() == Some(machine.as_str()),
        "machineName {:?}",
        vm.machine_name
    );
    machine_listed(
        ctx,
        &machine,
        "the machine listed by the node's agent",
        Duration::from_secs(60),
    )
    .await?;
    // smolvm's start either runs the guest or fails (nested KVM): both are honest ends.
    let ready = eventually(
        "the example Running or StartFailed",
        Duration::from_secs(240),
        || async {
            let status = vms.get("alpine").await?.status.unwrap_or_default();
            Ok(condition(&status.conditions, "Ready")
                .filter(|c| c.reason == "Running" || c.reason == "StartFailed")
                .cloned())
        },
    )
    .await?;
    if ready.reason == "StartFailed" {
        ensure!(
            !ready.message.chars().any(|c| c.is_control()),
            "smolvm's message reached the condition uncleaned: {:?}",
            ready.message
        );
        ensure!(!ready.message.trim().is_empty(), "StartFailed without smolvm's cause");
    }
    println!(
        "    bound and created as {machine} in {:.1}s; Ready={} {} ({})",
        started.elapsed().as_secs_f64(),
        ready.status,
        ready.reason,
        ready.message.chars().take(160).collect::<String>()
    );
    Ok(())
}

/// A pod on the node's bridge reaches the node's address: the runtime's ops port (host network)
/// answers, and the example's published port is closed until its machine runs.
async fn a_pod_on_the_bridge_reaches_the_node_address(ctx: &mut Ctx) -> anyhow::Result<()> {
    let probe = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"probe","namespace":"default"}},
        "spec":{{"terminationGracePeriodSeconds":0,"containers":[{{"name":"probe","image":"{PROBE_IMAGE}","imagePullPolicy":"Never"}}]}}}}"#
    );
    kubectl_ok(ctx, &["apply", "-f", "-"], Some(&probe))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), "default");
    let pod = eventually("the probe pod Ready", Duration::from_secs(90), || async {
        Ok(pods.get("probe").await.ok().filter(pod_ready))
    })
    .await?;
    let pod_ip = pod.status.and_then(|s| s.pod_ip).unwrap_or_default();
    let get = format!(
        "exec 3<>/dev/tcp/{NODE_IP}/9090 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && timeout 5 cat <&3"
    );
    let healthz = kubectl_ok(ctx, &["exec", "probe", "--", "timeout", "10", "bash", "-c", &get], None)?;
    ensure!(
        healthz.starts_with("HTTP/1.") && healthz.contains(" 200 "),
        "the runtime's /healthz answered {healthz:?}"
    );
    println!("    pod {pod_ip} reached the runtime's ops port at {NODE_IP}:9090 through the bridge");
    // Through the kubernetes Service: kube-proxy's rules lead its ClusterIP to the API server.
    let said = kubectl_ok(
        ctx,
        &[
            "exec",
            "probe",
            "--",
            "bash",
            "-c",
            &port_state("$KUBERNETES_SERVICE_HOST", "$KUBERNETES_SERVICE_PORT"),
        ],
        None,
    )?;
    ensure!(
        said.trim() == "open",
        "the kubernetes Service's ClusterIP is {said:?} from a pod"
    );
    let vms: Api<SmolVM> = Api::namespaced(ctx.client.clone(), "default");
    let vm = r#"{"apiVersion":"vm.smolvm.dev/v1alpha1","kind":"SmolVM","metadata":{"name":"published","namespace":"default"},
        "spec":{"image":"alpine:3.20","network":{"enabled":true,"ports":[{"hostPort":18080,"guestPort":80}]}}}"#;
    kubectl_ok(ctx, &["apply", "-f", "-"], Some(vm))?;
    wait_bound(ctx, "published").await?;
    let ready = eventually(
        "the published VM Running or StartFailed",
        Duration::from_secs(240),
        || async {
            let status = vms.get("published").await?.status.unwrap_or_default();
            Ok(condition(&status.conditions, "Ready")
                .filter(|c| c.reason == "Running" || c.reason == "StartFailed")
                .cloned())
        },
    )
    .await?;
    let runs = ready.status == "True";
    let port_check = port_state(NODE_IP, "18080");
    let state = kubectl_ok(ctx, &["exec", "probe", "--", "bash", "-c", &port_check], None)?;
    if runs {
        ensure!(
            state.trim() == "open",
            "a running VM's published port is {state} from a pod"
        );
    } else {
        ensure!(
            state.trim() == "closed",
            "a VM that does not run has its published port {state}"
        );
        println!(
            "    the published port 18080 is closed while its machine does not run (guests cannot boot here; the forward opens when it runs)"
        );
    }
    let _ = kubectl_ok(
        ctx,
        &["delete", "smolvm", "published", "--wait=true", "--timeout=120s"],
        None,
    );
    Ok(())
}

/// Waits until the SmolVM `name` in `default` is bound; on timeout the error carries its
/// Scheduled condition (why nothing fits, say).
/// Waits until the node's SmolVMNode lists `machine`.
async fn machine_listed(ctx: &Ctx, machine: &str, what: &str, timeout: Duration) -> anyhow::Result<()> {
    eventually(what, timeout, || async {
        Ok(smolvm_node(ctx)
            .await?
            .filter(|n| machines(n).iter().any(|m| m == machine))
            .map(drop))
    })
    .await
}

async fn wait_bound(ctx: &Ctx, name: &str) -> anyhow::Result<()> {
    let vms: Api<SmolVM> = Api::namespaced(ctx.client.clone(), "default");
    let bound = eventually(&format!("SmolVM {name} bound"), Duration::from_secs(60), || async {
        Ok(vms.get(name).await?.status.and_then(|s| s.node_name).map(drop))
    })
    .await;
    if let Err(e) = bound {
        let why = vms
            .get(name)
            .await
            .ok()
            .and_then(|vm| vm.status)
            .and_then(|s| condition(&s.conditions, "Scheduled").map(|c| format!("{}: {}", c.reason, c.message)));
        return Err(e.context(format!("Scheduled: {why:?}")));
    }
    Ok(())
}

/// A bash line printing whether a TCP connection to `host:port` opens (`open`), is refused or
/// times out (`closed`).
fn port_state(host: &str, port: &str) -> String {
    format!("if timeout 3 bash -c '</dev/tcp/{host}/{port}' 2>/dev/null; then echo open; else echo closed; fi")
}

/// One webhook pod evicted, as a drain would: the PodDisruptionBudget refuses the second,
/// applies keep working through the other replica and while the replacement comes, and the
/// self-signed Secret and the caBundles stay one CA.
async fn one_webhook_pod_evicted_applies_keep_working(ctx: &mut Ctx) -> anyhow::Result<()> {
    let (secret_ca, bundles) = webhook_ca(ctx).await?;
    ensure!(
        bundles.iter().all(|b| *b == secret_ca),
        "the caBundles differ from the Secret's CA before the test"
    );
    // As `kubectl drain` does it: cordon the node, then evict through the Eviction API, which the
    // PodDisruptionBudget guards. The replacement stays Pending while the node is cordoned, so
    // the budget has one healthy replica left and must refuse to evict it.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), NS);
    let allowing = |n: i32| {
        let budgets = budgets.clone();
        async move {
            eventually(
                &format!("the webhook's PodDisruptionBudget allowing {n} disruption(s)"),
                Duration::from_secs(60),
                || async {
                    let pdb = budgets.get("smolvm-webhook").await?;
                    Ok(pdb.status.filter(|s| s.disruptions_allowed == n).map(drop))
                },
            )
            .await
        }
    };
    allowing(1).await?;
    let webhooks = pods(ctx, "smolvm-webhook").await?;
    let [victim, other] = webhooks.as_slice() else {
        bail!("{} webhook pods, not 2", webhooks.len());
    };
    let victim = victim.clone();
    let pods_api: Api<Pod> = Api::namespaced(ctx.node.admin_without_retries().await?, NS);
    kubectl_ok(ctx, &["cordon", NODE_NAME], None)?;
    let drained = async {
        pods_api.evict(&victim.name_any(), &EvictParams::default()).await?;
        allowing(0).await?;
        match pods_api.evict(&other.name_any(), &EvictParams::default()).await {
            Err(kube::Error::Api(status)) if status.code == 429 => {}
            outcome => bail!(
                "evicting the last ready webhook pod was not refused by the PodDisruptionBudget: {outcome:?}"
            ),
        }
        // Applies go through the one replica left.
        let probe = r#"{"apiVersion":"vm.smolvm.dev/v1alpha1","kind":"SmolVM","metadata":{"name":"dry-run","namespace":"default"},"spec":{"image":"alpine:3.20"}}"#;
        for _ in 0..10 {
            let out = ctx.node.kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(probe))?;
            ensure!(
                out.status.success(),
                "an apply failed with one webhook replica left: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        anyhow::Ok(())
    }
    .await;
    kubectl_ok(ctx, &["uncordon", NODE_NAME], None)?;
    drained?;
    println!(
        "    node cordoned, {} evicted; evicting {} as well was refused (429, the PodDisruptionBudget); 10 applies through the one replica left",
        victim.name_any(),
        other.name_any()
    );
    let probe = r#"{"apiVersion":"vm.smolvm.dev/v1alpha1","kind":"SmolVM","metadata":{"name":"dry-run","namespace":"default"},"spec":{"image":"alpine:3.20"}}"#;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), NS);
    let started = Instant::now();
    let (mut sent, mut failures) = (0, Vec::new());
    loop {
        let out = ctx
            .node
            .kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(probe))?;
        sent += 1;
        if !out.status.success() {
            failures.push(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        let replaced = pods(ctx, "smolvm-webhook")
            .await?
            .iter()
            .filter(|p| pod_ready(p))
            .count()
            == 2
            && !pods(ctx, "smolvm-webhook")
                .await?
                .iter()
                .any(|p| p.uid() == victim.uid())
            && ready_replicas(&deployments.get("smolvm-webhook").await?) == 2;
        if (replaced && started.elapsed() > Duration::from_secs(10)) || started.elapsed() > Duration::from_secs(180) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    ensure!(
        failures.is_empty(),
        "{} of {sent} applies failed while a webhook pod went: {:?}",
        failures.len(),
        failures.first()
    );
    let (after_ca, after_bundles) = webhook_ca(ctx).await?;
    ensure!(
        after_ca == secret_ca,
        "the self-signed CA changed when a replica was replaced"
    );
    ensure!(
        after_bundles.iter().all(|b| *b == after_ca),
        "a caBundle differs from the Secret's CA"
    );
    println!(
        "    {sent} server-side dry-run applies, 0 failed, over {:.1}s while {} went and its replacement became Ready",
        started.elapsed().as_secs_f64(),
        victim.name_any()
    );
    Ok(())
}

async fn webhook_ca(ctx: &Ctx) -> anyhow::Result<(Vec<u8>, Vec<Vec<u8>>)> {
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), NS)
        .get("smolvm-webhook-tls")
        .await?;
    let data = secret.data.unwrap_or_default();
    let ca = data
        .get("ca.crt")
        .context("the webhook Secret holds no ca.crt")?
        .0
        .clone();
    let mutating = Api::<MutatingWebhookConfiguration>::all(ctx.client.clone())
        .get("smolvm-webhook")
        .await?;
    let validating = Api::<ValidatingWebhookConfiguration>::all(ctx.client.clone())
        .get("smolvm-webhook")
        .await?;
    let bundles = mutating
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default())
        .chain(
            validating
                .webhooks
                .unwrap_or_default()
                .into_iter()
                .map(|w| w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default()),
        )
        .collect();
    Ok((ca, bundles))
}

/// The runtime pod deleted (OnDelete): the DaemonSet makes a new one, which lists the machines
/// smolvm still holds, heartbeats again, and nothing is lost.
async fn the_runtime_pod_deleted_comes_back_and_loses_nothing(ctx: &mut Ctx) -> anyhow::Result<()> {
    let before = smolvm_node(ctx).await?.context("no SmolVMNode")?;
    let held = machines(&before);
    ensure!(!held.is_empty(), "the node holds no machine to keep");
    let vms: Api<SmolVM> = Api::namespaced(ctx.client.clone(), "default");
    let binding = vms.get("alpine").await?.status.map(|s| (s.node_name, s.node_uid));
    let victim = pods(ctx, "smolvm-runtime")
        .await?
        .into_iter()
        .next()
        .context("no runtime pod")?;
    let deleted_at = k8s_openapi::jiff::Timestamp::now();
    let started = Instant::now();
    Api::<Pod>::namespaced(ctx.client.clone(), NS)
        .delete(&victim.name_any(), &DeleteParams::default())
        .await?;
    let fresh = eventually("a new runtime pod Ready", Duration::from_secs(300), || async {
        Ok(pods(ctx, "smolvm-runtime")
            .await?
            .into_iter()
            .find(|p| p.uid() != victim.uid() && pod_ready(p)))
    })
    .await?;
    let after = eventually("a heartbeat from the new agent", Duration::from_secs(120), || async {
        Ok(smolvm_node(ctx).await?.filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.heartbeat_time.as_ref())
                .is_some_and(|t| t.0 > deleted_at)
                && n.status
                    .as_ref()
                    .and_then(|s| condition(&s.conditions, "Ready"))
                    .is_some_and(|c| c.status == "True")
        }))
    })
    .await?;
    let now_held = machines(&after);
    for machine in &held {
        ensure!(
            now_held.contains(machine),
            "{machine} was lost with the runtime pod (now {now_held:?})"
        );
    }
    let binding_after = vms.get("alpine").await?.status.map(|s| (s.node_name, s.node_uid));
    ensure!(
        binding == binding_after,
        "the binding moved: {binding:?} → {binding_after:?}"
    );
    println!(
        "    {} replaced by {} and Ready again in {:.1}s; machines kept: {}",
        victim.name_any(),
        fresh.name_any(),
        started.elapsed().as_secs_f64(),
        now_held.join(", ")
    );
    Ok(())
}

/// The leading controller's pod deleted: the standby (or the replacement) takes the Lease and
/// carries on; a VM created afterwards is created once.
async fn the_controller_pod_deleted_hands_the_lease_over(ctx: &mut Ctx) -> anyhow::Result<()> {
    let leader = lease_holder(ctx).await?.context("nobody holds the Lease")?;
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), NS);
    let started = Instant::now();
    Api::<Pod>::namespaced(ctx.client.clone(), NS)
        .delete(&leader, &DeleteParams::default())
        .await?;
    // The Lease as the leader last renewed it, read after the pod's deletion began: it runs out
    // at renewTime + leaseDurationSeconds unless the leader releases it on SIGTERM.
    let last = leases
        .get("smolvm-controller")
        .await?
        .spec
        .context("a Lease without spec")?;
    let renewed = last.renew_time.context("a held Lease without renewTime")?.0;
    let duration = k8s_openapi::jiff::SignedDuration::from_secs(last.lease_duration_seconds.unwrap_or(15).into());
    let runs_out = renewed.checked_add(duration)?;
    let next = eventually(
        "another controller holding the Lease",
        Duration::from_secs(120),
        || async { Ok(lease_holder(ctx).await?.filter(|h| *h != leader)) },
    )
    .await?;
    let acquired = leases
        .get("smolvm-controller")
        .await?
        .spec
        .and_then(|s| s.acquire_time)
        .context("the new holder's Lease has no acquireTime")?
        .0;
    ensure!(
        acquired < runs_out,
        "the Lease ran out instead of being released: {leader} last renewed it at {renewed}, {next} acquired it at {acquired}"
    );
    println!(
        "    Lease released by {leader} on SIGTERM and taken by {next} {:.1}s after the pod's deletion",
        started.elapsed().as_secs_f64()
    );
    let vm = r#"{"apiVersion":"vm.smolvm.dev/v1alpha1","kind":"SmolVM","metadata":{"name":"after-handoff","namespace":"default"},"spec":{"image":"alpine:3.20","running":false}}"#;
    kubectl_ok(ctx, &["apply", "-f", "-"], Some(vm))?;
    let vms: Api<SmolVM> = Api::namespaced(ctx.client.clone(), "default");
    let uid = vms.get("after-handoff").await?.uid().context("no uid")?;
    let machine = format!("svm-{uid}");
    wait_bound(ctx, "after-handoff").await?;
    machine_listed(
        ctx,
        &machine,
        "the new leader creating the machine",
        Duration::from_secs(120),
    )
    .await?;
    let held = machines(&smolvm_node(ctx).await?.context("no SmolVMNode")?);
    let live: Vec<String> = vms
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|v| v.uid().map(|u| format!("svm-{u}")))
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for m in &held {
        ensure!(seen.insert(m), "machine {m} is listed twice");
        ensure!(live.contains(m), "machine {m} belongs to no live SmolVM");
    }
    let _ = kubectl_ok(
        ctx,
        &["delete", "smolvm", "after-handoff", "--wait=true", "--timeout=120s"],
        None,
    );
    Ok(())
}

/// Delete: the finalizer holds the object until the node's agent deleted the machine.
async fn delete_waits_for_the_node_then_the_object_goes(ctx: &mut Ctx) -> anyhow::Result<()> {
    let vms: Api<SmolVM> = Api::namespaced(ctx.client.clone(), "default");
    let uid = vms.get("alpine").await?.uid().context("no uid")?;
    let machine = format!("svm-{uid}");
    let started = Instant::now();
    vms.delete("alpine", &DeleteParams::default()).await?;
    eventually("the example gone", Duration::from_secs(180), || async {
        Ok(vms.get_opt("alpine").await?.is_none().then_some(()))
    })
    .await?;
    let held = eventually("the machine gone from the node", Duration::from_secs(60), || async {
        Ok(smolvm_node(ctx)
            .await?
            .map(|n| machines(&n))
            .filter(|m| !m.contains(&machine)))
    })
    .await?;
    let events = kubectl_ok(
        ctx,
        &[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            "involvedObject.name=alpine",
            "-o",
            "json",
        ],
        None,
    )?;
    let events: Value = serde_json::from_str(&events)?;
    let reasons: Vec<&str> = events["items"]
        .as_array()
        .map(|items| items.iter().filter_map(|e| e["reason"].as_str()).collect())
        .unwrap_or_default();
    ensure!(!reasons.is_empty(), "no events recorded for the example");
    println!(
        "    deleted in {:.1}s after the node removed {machine}; node now holds {held:?}; events: {}",
        started.elapsed().as_secs_f64(),
        reasons.join(", ")
    );
    Ok(())
}
