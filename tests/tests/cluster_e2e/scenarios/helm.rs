//! The Helm chart on the real node (issue 58, SPEC section 10): the kustomize install is removed
//! as a user removes it (`make undeploy`), then `helm install` of deploy/helm/smolvm-operator with
//! the images the tier built brings every pod Ready and the example SmolVM through the webhook;
//! `helm upgrade` with webhook.replicas 2 → 3 rolls out without losing the example; after the
//! SmolVMs are deleted, `helm uninstall` removes every object of the release but the CRDs.
//!
//! Last in the tier: it replaces the kustomize install the other scenarios use. Helm is the one
//! `make cluster-e2e` installs (.ci/install-helm.sh: `SMOLVM_HELM`), or a `helm` on PATH.
//!
//! Uninstalling and installing again on one kube-apiserver process meets kubernetes/kubernetes
//! issue 130887 (seen here on 1.36.2): once no ValidatingAdmissionPolicyBinding of a policy with
//! a ConfigMap `paramKind` is left, even for a second, the API server's ConfigMap param informer
//! stops for good and its store freezes, so the holder image policy's param (the ConfigMap
//! smolvm-holder-policy) a new install creates is never found: `no params found for policy
//! binding with Deny parameterNotFoundAction`, and every Pod the policy matches is refused until
//! kube-apiserver restarts (every Pod in the cluster, before that policy was matched to holder
//! Pods only). The scenario keeps one such binding of its own for its whole run
//! (keep_param_informer_alive), so the switch from kustomize to Helm never empties the set; it
//! checks that a plain Pod is admitted after the install, which is how it was found.

use std::process::Command;

use super::*;

const RELEASE: &str = "smolvm-operator";
const CHART: &str = "deploy/helm/smolvm-operator";

/// The tier's images as chart values (repository and tag), and the guest boot check off as the
/// kustomize scenarios turn it off (no guest boots on this machine; VMs must still be placed).
fn install_values() -> anyhow::Result<Vec<String>> {
    let split = |image: &str| -> anyhow::Result<(String, String)> {
        let (repository, tag) = image.rsplit_once(':').with_context(|| format!("{image}: no tag"))?;
        Ok((repository.to_string(), tag.to_string()))
    };
    let (operator, operator_tag) = split(OPERATOR_IMAGE)?;
    let (runtime, runtime_tag) = split(RUNTIME_IMAGE)?;
    Ok(vec![
        format!("images.operator.repository={operator}"),
        format!("images.operator.tag={operator_tag}"),
        format!("images.runtime.repository={runtime}"),
        format!("images.runtime.tag={runtime_tag}"),
        "runtime.extraEnv[0].name=SMOLVM_RUNTIME_CANARY".to_string(),
        "runtime.extraEnv[0].value=off".to_string(),
    ])
}

fn helm_binary() -> anyhow::Result<PathBuf> {
    std::env::var_os("SMOLVM_HELM")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| assets::on_path("helm"))
        .context("no helm: `make cluster-e2e` installs it (eval \"$(bash .ci/install-helm.sh)\")")
}

/// Runs helm against the node's cluster, its caches and configuration in the node's directory
/// (nothing written under the host's home).
fn helm(ctx: &Ctx, args: &[&str]) -> anyhow::Result<String> {
    let dir = ctx.node.dir.join("helm");
    let out = Command::new(helm_binary()?)
        .current_dir(repo_root())
        .args(args)
        .env("KUBECONFIG", &ctx.node.admin_kubeconfig)
        .env("HELM_CACHE_HOME", dir.join("cache"))
        .env("HELM_CONFIG_HOME", dir.join("config"))
        .env("HELM_DATA_HOME", dir.join("data"))
        .output()
        .context("running helm")?;
    if !out.status.success() {
        bail!(
            "helm {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `make undeploy`, as a user removes the kustomize install: every SmolVM deleted (each once its
/// node confirmed), then all that deploy/default installed, CRDs and namespace included.
fn undeploy_kustomize(ctx: &Ctx) -> anyhow::Result<()> {
    let out = Command::new("make")
        .current_dir(repo_root())
        .args(["--no-print-directory", "undeploy", "UNDEPLOY_TIMEOUT=4m"])
        .env("KUBECONFIG", &ctx.node.admin_kubeconfig)
        .env(
            "KUBECACHEDIR",
            smolvm_tests::env::kube_cache_dir(&ctx.node.admin_kubeconfig),
        )
        .output()
        .context("running make undeploy")?;
    if !out.status.success() {
        bail!(
            "make undeploy failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A policy with a ConfigMap `paramKind` that judges nothing (it matches only LimitRange creates
/// and admits them) and its binding, so that the API server keeps its ConfigMap param informer
/// while the product's own holder binding is gone between the two installs (module header).
fn keep_param_informer_alive(ctx: &Ctx) -> anyhow::Result<()> {
    let objects = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: cluster-e2e-configmap-params}
spec:
  failurePolicy: Ignore
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules:
      - {apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["limitranges"]}
  validations:
    - expression: "true"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: cluster-e2e-configmap-params}
spec:
  policyName: cluster-e2e-configmap-params
  paramRef: {name: cluster-e2e-configmap-params, namespace: default, parameterNotFoundAction: Allow}
  validationActions: ["Deny"]
"#;
    kubectl_ok(ctx, &["apply", "--server-side", "-f", "-"], Some(objects))?;
    Ok(())
}

/// The release's objects as `helm get manifest` lists them: (kind, namespace, name).
fn release_objects(ctx: &Ctx) -> anyhow::Result<Vec<(String, String, String)>> {
    let manifest = helm(ctx, &["get", "manifest", RELEASE, "-n", NS])?;
    let mut objects = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&manifest) {
        let value = <Value as serde::Deserialize>::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        let field = |p: &str| value.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
        objects.push((field("/kind"), field("/metadata/namespace"), field("/metadata/name")));
    }
    Ok(objects)
}

/// Whether kubectl finds the object (`kubectl get KIND NAME`).
fn exists(ctx: &Ctx, (kind, namespace, name): &(String, String, String)) -> anyhow::Result<bool> {
    let mut args = vec!["get", kind.as_str(), name.as_str(), "--ignore-not-found", "-o", "name"];
    if !namespace.is_empty() {
        args.extend(["-n", namespace.as_str()]);
    }
    Ok(!kubectl_ok(ctx, &args, None)?.trim().is_empty())
}

async fn webhook_ready(ctx: &Ctx, replicas: i32) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), NS);
    eventually(
        &format!("{replicas} ready and updated webhook replicas"),
        Duration::from_secs(180),
        || async {
            let d = deployments.get("smolvm-webhook").await?;
            let status = d.status.clone().unwrap_or_default();
            Ok((ready_replicas(&d) == replicas
                && status.updated_replicas == Some(replicas)
                && status.replicas == Some(replicas))
            .then_some(()))
        },
    )
    .await
}

pub(super) async fn the_helm_chart_installs_upgrades_and_uninstalls(ctx: &mut Ctx) -> anyhow::Result<()> {
    let helm_version = helm(ctx, &["version", "--short"])?;
    keep_param_informer_alive(ctx)?;
    let started = Instant::now();
    undeploy_kustomize(ctx)?;
    println!(
        "    make undeploy removed the kustomize install in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    // Install, as the README says, with the tier's images.
    let values = install_values()?;
    let mut args = vec!["install", RELEASE, CHART, "-n", NS, "--create-namespace"];
    for v in &values {
        args.extend(["--set", v.as_str()]);
    }
    let started = Instant::now();
    let notes = helm(ctx, &args)?;
    ensure!(
        notes.contains("kubectl get svmn") && notes.contains("kind: SmolVM"),
        "helm install printed no NOTES with the check and the first SmolVM:\n{notes}"
    );
    all_pods_ready(ctx).await?;
    let all = Api::<Pod>::namespaced(ctx.client.clone(), NS)
        .list(&ListParams::default())
        .await?
        .items;
    ensure!(
        all.len() == 5 && all.iter().all(pod_ready),
        "not every pod of the release is Ready: {}",
        pod_summary_blocking(ctx)
    );
    for pod in &all {
        let image = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone())
            .unwrap_or_default();
        let app = pod.labels().get("app.kubernetes.io/name").cloned().unwrap_or_default();
        let want = if app == "smolvm-runtime" {
            RUNTIME_IMAGE
        } else {
            OPERATOR_IMAGE
        };
        ensure!(image == want, "{} runs {image}, not {want}", pod.name_any());
    }
    let node = eventually(
        "the SmolVMNode Ready under the chart",
        Duration::from_secs(180),
        || async {
            Ok(smolvm_node(ctx).await?.filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| condition(&s.conditions, "Ready"))
                    .is_some_and(|c| c.status == "True")
            }))
        },
    )
    .await?;
    println!(
        "    {} installed the chart: 5 pods Ready and the SmolVMNode Ready in {:.1}s (endpoint {:?})",
        helm_version.trim(),
        started.elapsed().as_secs_f64(),
        node.status.and_then(|s| s.endpoint).map(|e| e.address)
    );

    // Pods anyone else makes are still admitted: the holder policy (its param the chart's
    // ConfigMap smolvm-holder-policy) judges only the controller's writes.
    let param = kubectl_ok(
        ctx,
        &[
            "get",
            "configmap",
            "smolvm-holder-policy",
            "-n",
            NS,
            "-o",
            "jsonpath={.data.holderImage}",
        ],
        None,
    )?;
    ensure!(param == RUNTIME_IMAGE, "the holder policy's param names {param:?}");
    let pod = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"after-helm","namespace":"default"}},
        "spec":{{"containers":[{{"name":"probe","image":"{PROBE_IMAGE}","imagePullPolicy":"Never"}}]}}}}"#
    );
    kubectl_ok(ctx, &["create", "--dry-run=server", "-f", "-"], Some(&pod))
        .context("a plain Pod after helm install (kubernetes/kubernetes#130887: see the module header)")?;

    // The example through the webhook, as in the kustomize scenario.
    super::the_example_is_defaulted_validated_placed_and_created(ctx).await?;
    let vms: Api<SmolVM> = Api::namespaced(ctx.client.clone(), "default");
    let example = vms.get("alpine").await?;
    let uid = example.uid().context("no uid")?;
    let binding = example
        .status
        .as_ref()
        .map(|s| (s.node_name.clone(), s.node_uid.clone()));
    let machine = format!("svm-{uid}");
    let runtime_pod = pods(ctx, "smolvm-runtime")
        .await?
        .first()
        .and_then(|p| p.uid())
        .context("no runtime pod")?;

    // Upgrade with a changed value.
    let started = Instant::now();
    helm(
        ctx,
        &[
            "upgrade",
            RELEASE,
            CHART,
            "-n",
            NS,
            "--reuse-values",
            "--set",
            "webhook.replicas=3",
        ],
    )?;
    webhook_ready(ctx, 3).await?;
    let probe = r#"{"apiVersion":"vm.smolvm.dev/v1alpha1","kind":"SmolVM","metadata":{"name":"dry-run","namespace":"default"},"spec":{"image":"alpine:3.20"}}"#;
    for _ in 0..5 {
        kubectl_ok(ctx, &["apply", "--dry-run=server", "-f", "-"], Some(probe))?;
    }
    let after = vms.get("alpine").await?;
    ensure!(after.uid().as_deref() == Some(uid.as_str()), "the example was replaced");
    ensure!(
        after.status.as_ref().map(|s| (s.node_name.clone(), s.node_uid.clone())) == binding,
        "the example's binding moved"
    );
    machine_listed(
        ctx,
        &machine,
        "the example's machine still on the node",
        Duration::from_secs(30),
    )
    .await?;
    let runtime_after = pods(ctx, "smolvm-runtime").await?.first().and_then(|p| p.uid());
    ensure!(
        runtime_after.as_deref() == Some(runtime_pod.as_str()),
        "the upgrade replaced the runtime pod (its VMs with it)"
    );
    let revision = helm(ctx, &["status", RELEASE, "-n", NS, "-o", "json"])?;
    let revision: Value = serde_json::from_str(&revision)?;
    ensure!(revision["version"] == 2, "release revision {}", revision["version"]);
    println!(
        "    helm upgrade --set webhook.replicas=3: 3 webhook replicas Ready in {:.1}s, applies through them, the example {} kept on its node with its machine, the runtime pod untouched",
        started.elapsed().as_secs_f64(),
        machine
    );

    // Uninstall, after the SmolVMs, as docs/operations.md says.
    let objects = release_objects(ctx)?;
    ensure!(objects.len() > 40, "the release holds {} objects", objects.len());
    kubectl_ok(
        ctx,
        &[
            "delete",
            "smolvms",
            "--all",
            "--all-namespaces",
            "--wait",
            "--timeout=180s",
        ],
        None,
    )?;
    let started = Instant::now();
    helm(ctx, &["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "5m"])?;
    let mut kept = Vec::new();
    let mut left = Vec::new();
    for object in &objects {
        let present = exists(ctx, object)?;
        match (object.0.as_str(), present) {
            ("CustomResourceDefinition", true) => kept.push(object.2.clone()),
            ("CustomResourceDefinition", false) => bail!("helm uninstall removed the CRD {}", object.2),
            (_, true) => left.push(format!("{} {}/{}", object.0, object.1, object.2)),
            (_, false) => {}
        }
    }
    ensure!(left.is_empty(), "helm uninstall left: {left:?}");
    ensure!(kept.len() == 4, "CRDs kept: {kept:?}");
    eventually("every pod of smolvm-system gone", Duration::from_secs(180), || async {
        let left = Api::<Pod>::namespaced(ctx.client.clone(), NS)
            .list(&ListParams::default())
            .await?
            .items;
        Ok(left.is_empty().then_some(()))
    })
    .await?;
    println!(
        "    helm uninstall removed the {} objects of the release but the CRDs in {:.1}s; kept: {}",
        objects.len() - kept.len(),
        started.elapsed().as_secs_f64(),
        kept.join(", ")
    );
    Ok(())
}
