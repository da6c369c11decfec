//! End-to-end scenarios on a real kube-apiserver and etcd, with the real webhook, controller and
//! runtime agent (over the real `smolvm serve`), each its own process. One control plane serves
//! every scenario; they run in order, each printed like libtest prints a test. Arguments filter
//! scenarios by substring (`cargo test -p smolvm-tests --test e2e -- v9`).
//!
//! Without kube-apiserver every scenario prints `skipped: no kube-apiserver (set
//! KUBEBUILDER_ASSETS)` and the run reports them as skipped, never as passed.

use std::{
    future::Future,
    path::Path,
    pin::Pin,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail, ensure};
use k8s_openapi::api::events::v1::Event;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use smolvm_api::{SmolVM, SmolVMNode, constants};
use smolvm_tests::{
    assets,
    env::{self, Env, NODE, Options, eventually},
};

pub(crate) type Outcome<'a> = Pin<Box<dyn Future<Output = anyhow::Result<()>> + 'a>>;
pub(crate) type Scenario = for<'a> fn(&'a mut Env) -> Outcome<'a>;

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), (|e| Box::pin($name(e))) as Scenario)),*]
    };
}

// Scenario families added beside the core list live in their own files; each exports
// `scenarios()`, appended to the run in this order.
mod access;
mod branches;
mod classes;
mod cluster;
mod hostile;
mod idle;
mod lifetimes;
mod monitoring;
mod nodes;
mod pools;
mod quota;
mod reach;
mod status_apply;
mod suspend;
mod volumes;
mod workload;

fn main() -> ExitCode {
    smolvm_tests::install_crypto_provider();
    let mut all = scenarios![
        crds_install_and_explain_teaches_the_api,
        m1_m2_defaults_are_visible_after_apply,
        v1_bad_image_is_rejected,
        v2_cpus_over_the_policy_maximum_are_rejected,
        v3_host_port_below_the_policy_range_is_rejected,
        v4_bad_node_name_is_rejected,
        v5_pin_to_a_node_that_can_never_hold_the_vm_is_rejected,
        v16_volumes_are_validated_with_every_violation_and_explained,
        cel_rules_reject_without_the_webhook,
        vm_is_placed_bound_and_created_on_the_runtime,
        v6_image_change_of_a_bound_vm_is_rejected,
        v9_status_node_name_change_is_rejected_even_for_a_cluster_admin,
        v7_force_delete_annotation_misuse_is_rejected,
        v8_spec_change_of_a_vm_being_deleted_is_rejected,
        v10_runtime_writing_another_nodes_smolvmnode_is_rejected,
        running_false_stops_the_machine,
        resize_reaches_smolvm,
        delete_removes_the_machine_then_the_object,
        webhook_certificate_rotation_during_applies_loses_no_request,
        controller_killed_mid_reconcile_leaves_no_duplicate_and_no_leaked_finalizer,
        runtime_stopped_blocks_delete_until_the_force_annotation,
        node_replaced_is_reported_and_the_binding_kept,
        two_webhook_replicas_bootstrapping_at_once_converge_on_one_ca,
    ];
    all.extend(extra_scenarios());
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    if std::env::args().any(|a| a == "--list") {
        for (name, _) in &all {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let selected: Vec<_> = all
        .into_iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} e2e scenarios", selected.len());
    let assets = match assets::find() {
        Ok(a) => a,
        Err(reason) => {
            for (name, _) in &selected {
                println!("test {name} ... {reason}");
            }
            println!(
                "\ntest result: skipped. 0 passed; 0 failed; {} skipped ({reason})\n",
                selected.len()
            );
            return ExitCode::SUCCESS;
        }
    };
    let runtime = match smolvm_tests::this_thread_runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    runtime.block_on(run(assets, selected))
}

async fn run(assets: assets::Assets, selected: Vec<(&'static str, Scenario)>) -> ExitCode {
    let keep = std::env::var_os("SMOLVM_E2E_KEEP").is_some();
    let tmp = match tempfile::Builder::new().prefix("smolvm-e2e-").tempdir() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot create a work directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = tmp.path().to_path_buf();
    let started = Instant::now();
    let bins = match assets::operator_bins() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut env = match Env::start(&assets, bins, &dir, Options::default()).await {
        Ok(env) => env,
        Err(e) => {
            eprintln!(
                "error: the e2e environment did not come up: {e:#}\n(logs in {})",
                dir.display()
            );
            let _ = tmp.keep();
            return ExitCode::FAILURE;
        }
    };
    println!(
        "environment up in {:.1}s (logs in {})",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    let (mut passed, mut failed) = (0, Vec::new());
    for (name, scenario) in selected {
        let t = Instant::now();
        match scenario(&mut env).await {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:.1}s)", t.elapsed().as_secs_f64());
            }
            Err(e) => {
                println!("test {name} ... FAILED ({:.1}s)\n    {e:#}", t.elapsed().as_secs_f64());
                failed.push(name);
            }
        }
    }
    drop(env);
    if keep || !failed.is_empty() {
        let _ = tmp.keep();
        println!("logs kept in {}", dir.display());
    }
    let verdict = if failed.is_empty() { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {} failed; 0 skipped; finished in {:.1}s\n",
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    for name in &failed {
        println!("    {name}");
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The scenario families kept in their own files, in run order.
fn extra_scenarios() -> Vec<(&'static str, Scenario)> {
    let mut all = cluster::scenarios();
    all.extend(workload::scenarios());
    all.extend(reach::scenarios());
    all.extend(classes::scenarios());
    all.extend(pools::scenarios());
    all.extend(branches::scenarios());
    all.extend(lifetimes::scenarios());
    all.extend(idle::scenarios());
    all.extend(access::scenarios());
    all.extend(nodes::scenarios());
    all.extend(hostile::scenarios());
    all.extend(monitoring::scenarios());
    all.extend(suspend::scenarios());
    all.extend(quota::scenarios());
    all.extend(volumes::scenarios());
    all.extend(status_apply::scenarios());
    all
}

// ---- helpers ----------------------------------------------------------------------------------

pub(crate) const NS: &str = "default";

pub(crate) fn vm(name: &str, spec: Value) -> Value {
    json!({"apiVersion": constants::API_VERSION, "kind": "SmolVM", "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

/// A small VM spec (the node's disk is the machine's real one: 30 GiB defaults add up fast).
pub(crate) fn small(running: bool) -> Value {
    json!({"image": "alpine:3.20", "running": running, "resources": {"memoryMiB": 128}, "storage": {"storageGiB": 1, "overlayGiB": 1}})
}

/// `kubectl apply` of one object; `Ok(stdout)` or `Err(stderr)`.
pub(crate) fn kubectl_apply(env: &Env, object: &Value) -> anyhow::Result<Result<String, String>> {
    let out = env.kubectl(&["apply", "-f", "-"], Some(&serde_json::to_string(object)?))?;
    Ok(if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

/// Applies `object` with kubectl and expects a rejection whose message contains every `needle`.
pub(crate) fn expect_rejected(env: &Env, object: &Value, needles: &[&str]) -> anyhow::Result<String> {
    match kubectl_apply(env, object)? {
        Ok(out) => bail!("expected a rejection, but kubectl applied it: {out}"),
        Err(stderr) => {
            for n in needles {
                ensure!(stderr.contains(n), "the rejection lacks {n:?}: {stderr}");
            }
            Ok(stderr)
        }
    }
}

/// `object` as the API server would store it, from `kubectl apply --dry-run=server` (admission
/// runs; nothing is stored), retried for 30 s while the webhook's caches catch up with an object
/// it depends on (a class, a pool) applied just before.
pub(crate) async fn dry_run_until_admitted(env: &Env, object: &Value, what: &str) -> anyhow::Result<Value> {
    let text = serde_json::to_string(object)?;
    eventually(what, Duration::from_secs(30), || async {
        let out = env.kubectl(&["apply", "--dry-run=server", "-o", "json", "-f", "-"], Some(&text))?;
        Ok(out
            .status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).ok())
            .flatten())
    })
    .await
}

/// `kubectl patch smolvm NAME --type=merge -p PATCH`.
pub(crate) fn patch_vm(env: &Env, name: &str, patch: &str) -> anyhow::Result<std::process::Output> {
    env.kubectl(&["patch", "smolvm", name, "-n", NS, "--type=merge", "-p", patch], None)
}

/// The same on the status subresource.
pub(crate) fn patch_vm_status(env: &Env, name: &str, patch: &str) -> anyhow::Result<std::process::Output> {
    env.kubectl(
        &[
            "patch",
            "smolvm",
            name,
            "-n",
            NS,
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
        ],
        None,
    )
}

/// `kubectl annotate smolvm NAME KEY=VALUE`.
pub(crate) fn annotate_vm(env: &Env, name: &str, annotation: &str) -> anyhow::Result<std::process::Output> {
    env.kubectl(&["annotate", "smolvm", name, "-n", NS, annotation], None)
}

pub(crate) async fn vms(env: &Env) -> anyhow::Result<Api<SmolVM>> {
    Ok(Api::namespaced(env.admin().await?, NS))
}

pub(crate) fn condition<'a>(
    vm: &'a SmolVM,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    vm.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

/// Waits until the VM satisfies `pred`; the error shows its last status.
pub(crate) async fn wait_vm(
    env: &Env,
    name: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&SmolVM) -> bool,
) -> anyhow::Result<SmolVM> {
    let api = vms(env).await?;
    let last = std::cell::RefCell::new(None::<Value>);
    let result = eventually(what, timeout, || {
        let api = api.clone();
        let pred = &pred;
        let last = &last;
        async move {
            let got = api.get_opt(name).await?;
            *last.borrow_mut() = got.as_ref().and_then(|v| serde_json::to_value(&v.status).ok());
            Ok(got.filter(|v| pred(v)))
        }
    })
    .await;
    result.map_err(|e| {
        anyhow!(
            "{e:#}; last status of {name}: {}",
            last.borrow().clone().unwrap_or(Value::Null)
        )
    })
}

/// Waits until the VM's start settled: Ready=False StartFailed (guests cannot boot on these
/// machines) or Ready=True (where they can).
pub(crate) async fn wait_started_or_failed(env: &Env, name: &str) -> anyhow::Result<SmolVM> {
    wait_vm(
        env,
        name,
        "Ready=False StartFailed (or Running)",
        Duration::from_secs(120),
        |v| {
            condition(v, constants::condition::READY).is_some_and(|c| {
                (c.status == "False" && c.reason == constants::reason::START_FAILED) || c.status == "True"
            })
        },
    )
    .await
}

/// Waits until the VM is gone.
pub(crate) async fn wait_gone(env: &Env, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let api = vms(env).await?;
    eventually(&format!("SmolVM {name} to be gone"), timeout, || {
        let api = api.clone();
        async move { Ok(api.get_opt(name).await?.is_none().then_some(())) }
    })
    .await
}

/// smolvm's own machine list, read from its socket (`GET /api/v1/machines`).
pub(crate) async fn smolvm_machines(socket: &Path) -> anyhow::Result<Vec<Value>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    stream
        .write_all(b"GET /api/v1/machines HTTP/1.0\r\nHost: smolvm\r\n\r\n")
        .await?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP body from smolvm"))?;
    ensure!(
        head.starts_with("HTTP/1.") && head.contains(" 200"),
        "smolvm answered {head}"
    );
    let parsed: Value = serde_json::from_str(body).with_context(|| format!("smolvm's machine list: {body}"))?;
    Ok(parsed["machines"].as_array().cloned().unwrap_or_default())
}

/// Deletes a machine through smolvm's own API, behind the operator's back.
pub(crate) async fn smolvm_delete(socket: &Path, name: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let request = format!("DELETE /api/v1/machines/{name} HTTP/1.0\r\nHost: smolvm\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf);
    ensure!(
        text.starts_with("HTTP/1.") && text.split(' ').nth(1).is_some_and(|code| code.starts_with('2')),
        "smolvm answered {}",
        text.lines().next().unwrap_or_default()
    );
    Ok(())
}

pub(crate) async fn smolvm_machine(env: &Env, name: &str) -> anyhow::Result<Option<Value>> {
    Ok(smolvm_machines(&env.smolvm_socket())
        .await?
        .into_iter()
        .find(|m| m["name"] == name))
}

/// The VM has a node and a machine name: bound, and its machine created on the node.
/// Bound, and its machine created on the node: `status.machineName` is written with the binding,
/// `status.effective` once the node has reported the machine it made.
pub(crate) fn bound_and_created(v: &SmolVM) -> bool {
    v.status
        .as_ref()
        .is_some_and(|s| s.node_name.is_some() && s.machine_name.is_some() && s.effective.is_some())
}

/// Creates a VM with kubectl and waits until it is bound and its machine exists on the node.
pub(crate) async fn create_bound(env: &Env, name: &str, spec: Value) -> anyhow::Result<SmolVM> {
    kubectl_apply(env, &vm(name, spec))?.map_err(|e| anyhow!("applying {name}: {e}"))?;
    let bound = wait_vm(
        env,
        name,
        "binding and machine creation",
        Duration::from_secs(60),
        bound_and_created,
    )
    .await?;
    Ok(bound)
}

pub(crate) async fn delete_and_wait(env: &Env, name: &str) -> anyhow::Result<()> {
    let api = vms(env).await?;
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    wait_gone(env, name, Duration::from_secs(60)).await
}

pub(crate) async fn events_for(env: &Env, name: &str) -> anyhow::Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(env.admin().await?, NS);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect())
}

/// How long a scenario looks for an event the controller tells of: events are written in the
/// background, just after the status that reports the same transition, so a scenario that has
/// just seen the status may not see the event yet.
const EVENT_WAIT: Duration = Duration::from_secs(15);

/// The first event with `reason` about `name`, looked for up to [`EVENT_WAIT`]; the error lists
/// the reasons seen.
pub(crate) async fn expect_event(env: &Env, name: &str, reason: &str) -> anyhow::Result<Event> {
    let seen = eventually(&format!("a {reason} event about {name}"), EVENT_WAIT, || async {
        Ok(events_for(env, name)
            .await?
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason)))
    })
    .await;
    match seen {
        Ok(event) => Ok(event),
        Err(e) => {
            let reasons: Vec<String> = events_for(env, name)
                .await?
                .into_iter()
                .filter_map(|e| e.reason)
                .collect();
            bail!("{e:#}; events about {name}: {reasons:?}")
        }
    }
}

// ---- scenarios --------------------------------------------------------------------------------

/// `kubectl explain PATH` succeeds for each path and its text holds each of the words.
fn explains(env: &Env, cases: &[(&str, &[&str])]) -> anyhow::Result<()> {
    for (path, words) in cases {
        let out = env.kubectl(&["explain", path], None)?;
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "kubectl explain {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for word in *words {
            ensure!(text.contains(word), "kubectl explain {path} lacks {word}:\n{text}");
        }
    }
    Ok(())
}

pub(crate) async fn crds_install_and_explain_teaches_the_api(env: &mut Env) -> anyhow::Result<()> {
    let out = env.kubectl(&["explain", "smolvm.spec.resources"], None)?;
    ensure!(
        out.status.success(),
        "kubectl explain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for field in ["cpus", "memoryMiB", "DESCRIPTION"] {
        ensure!(text.contains(field), "kubectl explain lacks {field}:\n{text}");
    }
    let described = text
        .lines()
        .skip_while(|l| !l.starts_with("DESCRIPTION"))
        .nth(1)
        .unwrap_or_default();
    ensure!(
        !described.trim().is_empty(),
        "spec.resources has no description:\n{text}"
    );
    // The workload's fields teach themselves too.
    explains(
        env,
        &[
            ("smolvm.spec.env.valueFrom", &["secretKeyRef", "configMapKeyRef"][..]),
            ("smolvm.spec.restartPolicy", &["OnFailure", "Always"][..]),
            ("smolvm.spec.imagePullSecrets", &["registry"][..]),
            // Classes: what a class fills, and how a SmolVM names one.
            ("smolvm.spec.className", &["SmolVMClass", "CREATE"][..]),
            ("smolvmclass", &["instance type", "is-default-class"][..]),
            ("smolvmclass.spec.resources", &["cpus", "memoryMiB"][..]),
        ],
    )?;
    let out = env.kubectl(
        &[
            "get",
            "crd",
            "smolvms.vm.smolvm.dev",
            "-o",
            "jsonpath={.spec.names.shortNames}",
        ],
        None,
    )?;
    ensure!(
        String::from_utf8_lossy(&out.stdout).contains("svm"),
        "short name svm missing"
    );
    Ok(())
}

pub(crate) async fn m1_m2_defaults_are_visible_after_apply(env: &mut Env) -> anyhow::Result<()> {
    let name = "defaults";
    kubectl_apply(env, &vm(name, json!({"image": "alpine:3.20", "running": false})))?.map_err(|e| anyhow!(e))?;
    let got = vms(env).await?.get(name).await?;
    let spec = serde_json::to_value(&got.spec)?;
    ensure!(spec["resources"]["cpus"] == 1, "M1 cpus default missing: {spec}");
    ensure!(
        spec["resources"]["memoryMiB"] == 512,
        "M1 memory default missing: {spec}"
    );
    ensure!(
        spec["storage"]["storageGiB"] == 20,
        "M1 storage default missing: {spec}"
    );
    ensure!(
        spec["storage"]["overlayGiB"] == 10,
        "M1 overlay default missing: {spec}"
    );
    ensure!(
        spec["network"]["enabled"] == false,
        "M1 network default missing: {spec}"
    );
    ensure!(
        got.finalizers().iter().any(|f| f == constants::FINALIZER),
        "M2 finalizer missing: {:?}",
        got.finalizers()
    );
    delete_and_wait(env, name).await
}

pub(crate) async fn v1_bad_image_is_rejected(env: &mut Env) -> anyhow::Result<()> {
    expect_rejected(
        env,
        &vm("v1-bad", json!({"image": "UPPER/Case:tag"})),
        &["spec.image", "UPPER/Case:tag"],
    )?;
    Ok(())
}

pub(crate) async fn v2_cpus_over_the_policy_maximum_are_rejected(env: &mut Env) -> anyhow::Result<()> {
    expect_rejected(
        env,
        &vm("v2-bad", json!({"image": "alpine:3.20", "resources": {"cpus": 48}})),
        &["spec.resources.cpus", "48", "maxCpus", "[V2]"],
    )?;
    Ok(())
}

pub(crate) async fn v3_host_port_below_the_policy_range_is_rejected(env: &mut Env) -> anyhow::Result<()> {
    expect_rejected(
        env,
        &vm(
            "v3-bad",
            json!({"image": "alpine:3.20", "network": {"enabled": true, "ports": [{"hostPort": 80, "guestPort": 80}]}}),
        ),
        &["spec.network.ports[0].hostPort", "80", "[V3]"],
    )?;
    Ok(())
}

pub(crate) async fn v4_bad_node_name_is_rejected(env: &mut Env) -> anyhow::Result<()> {
    expect_rejected(
        env,
        &vm("v4-bad", json!({"image": "alpine:3.20", "nodeName": "Bad_Node"})),
        &["spec.nodeName", "Bad_Node"],
    )?;
    Ok(())
}

pub(crate) async fn v16_volumes_are_validated_with_every_violation_and_explained(env: &mut Env) -> anyhow::Result<()> {
    // Every violation in one answer, each naming its field (the schema's CEL rules and the
    // webhook's V16 alike).
    expect_rejected(
        env,
        &vm(
            "v16-bad",
            json!({"image": "alpine:3.20", "volumes": [
                {"name": "data", "mountPath": "/", "persistentVolumeClaim": {"claimName": "db"}},
                {"name": "both", "mountPath": "/a", "configMap": {"name": "c"}, "secret": {"secretName": "s"}},
                {"name": "blk", "mountPath": "/b", "claimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                    "volumeMode": "Block"}}}
            ]}),
        ),
        &[
            "spec.volumes[0].mountPath",
            "spec.volumes[1]",
            "spec.volumes[2].claimTemplate",
            "Block",
            "[V16]",
        ],
    )?;
    explains(
        env,
        &[
            ("smolvm.spec.volumes", &["holder Pod", "VolumesReady"][..]),
            (
                "smolvm.spec.volumes.claimTemplate.whenDeleted",
                &["Retain", "Delete"][..],
            ),
            (
                "smolvm.spec.volumes.claimTemplate.spec.accessModes",
                &["DESCRIPTION"][..],
            ),
        ],
    )?;
    Ok(())
}

pub(crate) async fn v5_pin_to_a_node_that_can_never_hold_the_vm_is_rejected(env: &mut Env) -> anyhow::Result<()> {
    let nodes: Api<SmolVMNode> = Api::all(env.admin().await?);
    let node = nodes.get(NODE).await?;
    let cpus = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| a.cpus)
        .ok_or_else(|| anyhow!("the SmolVMNode reports no allocatable"))?;
    let too_many = cpus + 1;
    ensure!(
        too_many <= 32,
        "this machine has too many CPUs ({cpus}) for the policy-bounded check"
    );
    expect_rejected(
        env,
        &vm(
            "v5-bad",
            json!({"image": "alpine:3.20", "nodeName": NODE, "resources": {"cpus": too_many}}),
        ),
        &["[V5]", NODE],
    )?;
    Ok(())
}

pub(crate) async fn cel_rules_reject_without_the_webhook(env: &mut Env) -> anyhow::Result<()> {
    env.unregister_webhooks()?;
    // The API server may still hold the registration for a moment; poll until CEL alone answers.
    let bad = vm("cel-bad", json!({"image": "alpine:3.20", "resources": {"cpus": 0}}));
    let result = eventually(
        "the CRD's rules to reject without the webhook",
        Duration::from_secs(20),
        || {
            let bad = bad.clone();
            let env = &*env;
            async move {
                match kubectl_apply(env, &bad)? {
                    Ok(out) => bail!("admitted without the webhook: {out}"),
                    Err(stderr) if !stderr.contains("[V") => Ok(Some(stderr)),
                    Err(_) => Ok(None),
                }
            }
        },
    )
    .await;
    env.register_webhooks()?;
    let stderr = result?;
    ensure!(
        stderr.contains("spec.resources.cpus"),
        "the CEL/schema rejection names no field: {stderr}"
    );
    Ok(())
}

pub(crate) async fn vm_is_placed_bound_and_created_on_the_runtime(env: &mut Env) -> anyhow::Result<()> {
    let name = "web";
    let bound = create_bound(env, name, json!({"image": "alpine:3.20"})).await?;
    let status = bound.status.clone().unwrap_or_default();
    ensure!(
        status.node_name.as_deref() == Some(NODE),
        "bound to {:?}",
        status.node_name
    );
    let machine = status.machine_name.clone().unwrap_or_default();
    let socket = env.smolvm_socket();
    eventually(
        &format!("machine {machine} in smolvm's own list"),
        Duration::from_secs(60),
        || {
            let (socket, machine) = (socket.clone(), machine.clone());
            async move {
                Ok(smolvm_machines(&socket)
                    .await?
                    .into_iter()
                    .find(|m| m["name"] == machine.as_str()))
            }
        },
    )
    .await?;
    // Guests cannot boot on these machines: the start failure must surface honestly.
    let failed = wait_started_or_failed(env, name).await?;
    if let Some(c) = condition(&failed, constants::condition::READY)
        && c.status == "False"
    {
        ensure!(!c.message.is_empty(), "StartFailed without the runtime's message");
        println!(
            "    (start failed as expected on this machine: {})",
            c.message.chars().take(160).collect::<String>()
        );
    }
    Ok(())
}

pub(crate) async fn v6_image_change_of_a_bound_vm_is_rejected(env: &mut Env) -> anyhow::Result<()> {
    expect_rejected(env, &vm("web", json!({"image": "alpine:3.21"})), &["spec.image", "V6"])?;
    Ok(())
}

pub(crate) async fn v9_status_node_name_change_is_rejected_even_for_a_cluster_admin(
    env: &mut Env,
) -> anyhow::Result<()> {
    let out = patch_vm_status(env, "web", r#"{"status":{"nodeName":"elsewhere"}}"#)?;
    ensure!(!out.status.success(), "an admin moved the binding");
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("status.nodeName") && stderr.contains("V9"), "{stderr}");
    Ok(())
}

pub(crate) async fn v7_force_delete_annotation_misuse_is_rejected(env: &mut Env) -> anyhow::Result<()> {
    let mut obj = vm("v7-bad", json!({"image": "alpine:3.20"}));
    obj["metadata"]["annotations"] = json!({(constants::FORCE_DELETE_ANNOTATION): "true"});
    expect_rejected(env, &obj, &[constants::FORCE_DELETE_ANNOTATION, "[V7]"])?;
    let out = annotate_vm(env, "web", &format!("{}=yes", constants::FORCE_DELETE_ANNOTATION))?;
    ensure!(
        !out.status.success(),
        "a force-delete annotation on a live VM was admitted"
    );
    ensure!(
        String::from_utf8_lossy(&out.stderr).contains("[V7]"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

pub(crate) async fn v8_spec_change_of_a_vm_being_deleted_is_rejected(env: &mut Env) -> anyhow::Result<()> {
    let name = "v8-held";
    let hold = "e2e.smolvm.dev/hold";
    let mut obj = vm(name, json!({"image": "alpine:3.20", "running": false}));
    obj["metadata"]["finalizers"] = json!([hold]);
    kubectl_apply(env, &obj)?.map_err(|e| anyhow!(e))?;
    let api = vms(env).await?;
    api.delete(name, &DeleteParams::default()).await?;
    let out = patch_vm(env, name, r#"{"spec":{"running":true}}"#)?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // Release the hold whatever happened (removing a finalizer is never blocked: V8).
    let current = api.get(name).await?;
    let rest: Vec<String> = current.finalizers().iter().filter(|f| *f != hold).cloned().collect();
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": rest}})),
    )
    .await
    .context("removing the hold finalizer")?;
    ensure!(
        !out.status.success(),
        "a spec change of a VM being deleted was admitted"
    );
    ensure!(stderr.contains("[V8]"), "{stderr}");
    wait_gone(env, name, Duration::from_secs(60)).await
}

pub(crate) async fn v10_runtime_writing_another_nodes_smolvmnode_is_rejected(env: &mut Env) -> anyhow::Result<()> {
    let admin = env.admin().await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), env::NAMESPACE);
    let pod = pods.get(&format!("smolvm-runtime-{NODE}")).await?;
    let token = env::token_for(&admin, env::SA_RUNTIME, Some(&pod)).await?;
    let kubeconfig = env.plane.kubeconfig_for("runtime-v10", &token)?;
    let other = json!({
        "apiVersion": constants::API_VERSION, "kind": "SmolVMNode",
        "metadata": {"name": "someone-elses-node"},
        "spec": {},
    });
    let out = env::kubectl(&kubeconfig, &["create", "-f", "-"], Some(&other.to_string()))?;
    ensure!(!out.status.success(), "a runtime created another node's SmolVMNode");
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("[V10]") && stderr.contains(NODE), "{stderr}");
    Ok(())
}

pub(crate) async fn running_false_stops_the_machine(env: &mut Env) -> anyhow::Result<()> {
    let out = patch_vm(env, "web", r#"{"spec":{"running":false}}"#)?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stopped = wait_vm(env, "web", "phase Stopped", Duration::from_secs(90), |v| {
        v.status
            .as_ref()
            .and_then(|s| s.phase.as_ref())
            .map(|p| format!("{p:?}"))
            == Some("Stopped".into())
    })
    .await?;
    let machine = stopped.status.and_then(|s| s.machine_name).unwrap_or_default();
    let m = smolvm_machine(env, &machine)
        .await?
        .ok_or_else(|| anyhow!("machine {machine} gone"))?;
    ensure!(m["state"] != "running", "smolvm still runs {machine}: {m}");
    Ok(())
}

pub(crate) async fn resize_reaches_smolvm(env: &mut Env) -> anyhow::Result<()> {
    let out = patch_vm(
        env,
        "web",
        r#"{"spec":{"resources":{"cpus":2,"memoryMiB":1024},"storage":{"storageGiB":24}}}"#,
    )?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let api = vms(env).await?;
    let machine = api
        .get("web")
        .await?
        .status
        .and_then(|s| s.machine_name)
        .unwrap_or_default();
    let socket = env.smolvm_socket();
    // Storage grows on a stopped machine; CPUs and memory change live only on a running one,
    // so here they either reach smolvm or wait visibly as ResizePending.
    let seen = eventually("smolvm to show the grown storage", Duration::from_secs(60), || {
        let socket = socket.clone();
        let machine = machine.clone();
        async move {
            let m = smolvm_machines(&socket)
                .await?
                .into_iter()
                .find(|m| m["name"] == machine.as_str());
            Ok(m.filter(|m| m["storageGb"] == 24))
        }
    })
    .await?;
    let vm = wait_vm(
        env,
        "web",
        "effective sizes or ResizePending",
        Duration::from_secs(60),
        |v| {
            let effective = v.status.as_ref().and_then(|s| s.effective.as_ref());
            let applied = seen["cpus"] == 2 && effective.is_some_and(|e| e.cpus == 2 && e.storage_gib == 24);
            let pending = condition(v, constants::condition::RESIZE_PENDING).is_some_and(|c| c.status == "True");
            applied || pending
        },
    )
    .await?;
    println!(
        "    smolvm: cpus {} memoryMb {} storageGb {}; ResizePending: {}",
        seen["cpus"],
        seen["memoryMb"],
        seen["storageGb"],
        condition(&vm, constants::condition::RESIZE_PENDING)
            .map(|c| format!("{} ({})", c.status, c.message))
            .unwrap_or_else(|| "absent".into())
    );
    Ok(())
}

pub(crate) async fn delete_removes_the_machine_then_the_object(env: &mut Env) -> anyhow::Result<()> {
    let api = vms(env).await?;
    let machine = api
        .get("web")
        .await?
        .status
        .and_then(|s| s.machine_name)
        .unwrap_or_default();
    api.delete("web", &DeleteParams::default()).await?;
    wait_gone(env, "web", Duration::from_secs(90)).await?;
    ensure!(
        smolvm_machine(env, &machine).await?.is_none(),
        "the object is gone but smolvm still has {machine}"
    );
    Ok(())
}

pub(crate) async fn webhook_certificate_rotation_during_applies_loses_no_request(env: &mut Env) -> anyhow::Result<()> {
    let client = env.admin().await?;
    let api: Api<SmolVM> = Api::namespaced(client, NS);
    let requests = 400usize;
    let rotate_every = 40usize;
    let mut errors = Vec::new();
    let mut rotations = 0;
    let started = Instant::now();
    for i in 0..requests {
        if i % rotate_every == rotate_every / 2 {
            env.webhook_tls.rotate()?;
            rotations += 1;
        }
        // A dry-run create goes through both webhooks and is never stored.
        let obj: SmolVM = serde_json::from_value(vm(
            &format!("stream-{i}"),
            json!({"image": "alpine:3.20", "running": false}),
        ))?;
        let pp = PostParams {
            dry_run: true,
            ..Default::default()
        };
        if let Err(e) = api.create(&pp, &obj).await {
            errors.push(format!("request {i}: {e}"));
        }
    }
    println!(
        "    {requests} dry-run creates through both webhooks, {rotations} certificate rotations, {} errors, {:.0} req/s",
        errors.len(),
        requests as f64 / started.elapsed().as_secs_f64()
    );
    ensure!(
        errors.is_empty(),
        "{} requests failed: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    ensure!(
        env.log_tail("smolvm-webhook", 400).contains("reload"),
        "the webhook never logged a certificate reload"
    );
    Ok(())
}

pub(crate) async fn controller_killed_mid_reconcile_leaves_no_duplicate_and_no_leaked_finalizer(
    env: &mut Env,
) -> anyhow::Result<()> {
    let count = 20;
    let api = vms(env).await?;
    for i in 0..count {
        let obj: SmolVM = serde_json::from_value(vm(&format!("crash-{i}"), small(false)))?;
        api.create(&PostParams::default(), &obj).await?;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    env.kill_controller();
    env.start_controller().await?;
    let mut machines = Vec::new();
    for i in 0..count {
        let v = wait_vm(
            env,
            &format!("crash-{i}"),
            "bound and created",
            Duration::from_secs(120),
            bound_and_created,
        )
        .await?;
        machines.push(v.status.and_then(|s| s.machine_name).unwrap_or_default());
    }
    let listed: Vec<String> = smolvm_machines(&env.smolvm_socket())
        .await?
        .into_iter()
        .filter_map(|m| m["name"].as_str().map(str::to_string))
        .collect();
    for m in &machines {
        let n = listed.iter().filter(|l| *l == m).count();
        ensure!(n == 1, "machine {m} appears {n} times in smolvm's list");
    }
    ensure!(
        listed.len() == machines.len(),
        "smolvm has {} machines for {} VMs: {listed:?}",
        listed.len(),
        machines.len()
    );
    // No over-commit: what every VM bound to the node asks for fits its allocatable.
    let node: SmolVMNode = Api::<SmolVMNode>::all(env.admin().await?).get(NODE).await?;
    let allocatable = node
        .status
        .and_then(|s| s.allocatable)
        .ok_or_else(|| anyhow!("the SmolVMNode reports no allocatable"))?;
    let (mut cpus, mut memory) = (0, 0);
    for v in api.list(&ListParams::default()).await? {
        if v.bound_node() == Some(NODE) {
            let r = v.spec.request();
            cpus += r.cpus;
            memory += r.memory_mib;
        }
    }
    ensure!(
        cpus <= allocatable.cpus && memory <= allocatable.memory_mib,
        "over-committed: {cpus} CPUs and {memory} MiB bound on a node with {} and {}",
        allocatable.cpus,
        allocatable.memory_mib
    );
    // Kill again in the middle of the deletes: every finalizer must still go, every machine too.
    for i in 0..count {
        api.delete(&format!("crash-{i}"), &DeleteParams::default()).await?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.kill_controller();
    env.start_controller().await?;
    for i in 0..count {
        wait_gone(env, &format!("crash-{i}"), Duration::from_secs(120)).await?;
    }
    let left = smolvm_machines(&env.smolvm_socket()).await?;
    ensure!(left.is_empty(), "machines left behind: {left:?}");
    Ok(())
}

pub(crate) async fn runtime_stopped_blocks_delete_until_the_force_annotation(env: &mut Env) -> anyhow::Result<()> {
    let name = "orphan";
    let created = create_bound(env, name, small(false)).await?;
    let machine = created
        .status
        .as_ref()
        .and_then(|s| s.machine_name.clone())
        .ok_or_else(|| anyhow!("{name} has no machine name"))?;
    // The binding is written before the machine is created: wait for the machine itself.
    let socket = env.smolvm_socket();
    eventually("the machine on the node", Duration::from_secs(60), || {
        let (machine, socket) = (machine.clone(), socket.clone());
        async move {
            let listed = smolvm_machines(&socket).await?;
            Ok(listed.iter().any(|m| m["name"] == machine.as_str()).then_some(()))
        }
    })
    .await?;
    env.stop_runtime();
    let api = vms(env).await?;
    api.delete(name, &DeleteParams::default()).await?;
    let blocked = wait_vm(env, name, "DeletionBlocked=True", Duration::from_secs(90), |v| {
        condition(v, constants::condition::DELETION_BLOCKED).is_some_and(|c| c.status == "True")
    })
    .await?;
    let message = condition(&blocked, constants::condition::DELETION_BLOCKED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    ensure!(
        message.contains(NODE) && message.contains(constants::FORCE_DELETE_ANNOTATION),
        "DeletionBlocked names neither the node nor the annotation: {message}"
    );
    let out = annotate_vm(env, name, &format!("{}=true", constants::FORCE_DELETE_ANNOTATION))?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    ensure!(
        String::from_utf8_lossy(&out.stderr).contains(NODE),
        "no admission warning naming the node: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_gone(env, name, Duration::from_secs(60)).await?;
    // The event is recorded just after the finalizer goes.
    let forced = expect_event(env, name, constants::reason::FORCE_DELETED).await?;
    ensure!(
        forced.type_.as_deref() == Some("Warning"),
        "ForceDeleted is a {:?} event",
        forced.type_
    );
    // Bring the runtime back: it still holds the orphaned machine, which the note warned of. The
    // agent reports it, the controller books it and, after the grace period (10 s here), deletes
    // it and says so on the node's SmolVMNode.
    env.start_runtime().await?;
    let nodes: Api<SmolVMNode> = Api::all(env.admin().await?);
    eventually(
        "the agent reports the orphaned machine",
        Duration::from_secs(60),
        || {
            let (nodes, machine) = (nodes.clone(), machine.clone());
            async move {
                let node = nodes.get(NODE).await?;
                let listed = node.status.and_then(|s| s.machines).unwrap_or_default();
                Ok(listed.contains(&machine).then_some(()))
            }
        },
    )
    .await?;
    eventually("the orphan is collected", Duration::from_secs(90), || {
        let (machine, socket) = (machine.clone(), socket.clone());
        async move {
            let listed = smolvm_machines(&socket).await?;
            Ok((!listed.iter().any(|m| m["name"] == machine.as_str())).then_some(()))
        }
    })
    .await?;
    // The collector tells the deletion once the node has answered it: the event may land just
    // after the machine left smolvm's list.
    let events: Api<Event> = Api::all(env.admin().await?);
    eventually(
        "OrphanMachine and OrphanDeleted events on the SmolVMNode",
        Duration::from_secs(30),
        || {
            let events = events.clone();
            async move {
                let on_node: Vec<String> = events
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NODE))
                    .filter_map(|e| e.reason)
                    .collect();
                let both = on_node.iter().any(|r| r == "OrphanMachine") && on_node.iter().any(|r| r == "OrphanDeleted");
                Ok(both.then_some(()))
            }
        },
    )
    .await?;
    Ok(())
}

pub(crate) async fn node_replaced_is_reported_and_the_binding_kept(env: &mut Env) -> anyhow::Result<()> {
    let name = "survivor";
    let bound = create_bound(env, name, small(false)).await?;
    let old_uid = bound
        .status
        .as_ref()
        .and_then(|s| s.node_uid.clone())
        .unwrap_or_default();
    // A reinstalled machine: the runtime stops, the Node comes back with a new UID, the runtime's
    // Pod is re-created there and the runtime starts again with a fresh bound token.
    env.stop_runtime();
    let admin = env.admin().await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), env::NAMESPACE);
    pods.delete(
        &format!("smolvm-runtime-{NODE}"),
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await?;
    let new_uid = env.replace_node().await?;
    env.start_runtime().await?;
    let replaced = wait_vm(env, name, "Ready=False NodeReplaced", Duration::from_secs(90), |v| {
        condition(v, constants::condition::READY)
            .is_some_and(|c| c.status == "False" && c.reason == constants::reason::NODE_REPLACED)
    })
    .await?;
    let status = replaced.status.unwrap_or_default();
    ensure!(
        status.node_name.as_deref() == Some(NODE),
        "binding moved: {:?}",
        status.node_name
    );
    ensure!(
        status.node_uid.as_deref() == Some(old_uid.as_str()),
        "nodeUID rewritten to {:?} (new node {new_uid})",
        status.node_uid
    );
    // Cleanup: the replaced node's machine cannot be trusted; force the delete.
    let api = vms(env).await?;
    api.delete(name, &DeleteParams::default()).await?;
    let _ = annotate_vm(env, name, &format!("{}=true", constants::FORCE_DELETE_ANNOTATION))?;
    wait_gone(env, name, Duration::from_secs(90)).await
}

pub(crate) async fn two_webhook_replicas_bootstrapping_at_once_converge_on_one_ca(env: &mut Env) -> anyhow::Result<()> {
    let (_, kubeconfig) = env.service_account_client(env::SA_WEBHOOK).await?;
    let dir = tempfile::tempdir()?;
    let mut replicas = Vec::new();
    let mut ports = Vec::new();
    for i in 0..2 {
        let (port, ops) = (smolvm_tests::process::free_port()?, smolvm_tests::process::free_port()?);
        ports.push(port);
        replicas.push(smolvm_tests::process::Proc::spawn(
            &format!("webhook-replica-{i}"),
            &env.bins.webhook,
            [
                format!("--listen=127.0.0.1:{port}"),
                format!("--ops-address=127.0.0.1:{ops}"),
                "--tls-mode=self-signed".to_string(),
                format!("--policy={}", env.policy_file.display()),
                format!("--namespace={}", env::NAMESPACE),
            ],
            &[("KUBECONFIG".into(), kubeconfig.display().to_string())],
            &dir.path().join(format!("replica-{i}.log")),
        )?);
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(env.admin().await?, env::NAMESPACE);
    // The install created the Secret empty (deploy/default), and the webhook may not create
    // Secrets: the replicas race to fill that one.
    let ca = eventually(
        "a replica to fill the shared webhook TLS Secret",
        Duration::from_secs(60),
        || {
            let secrets = secrets.clone();
            async move {
                let secret = secrets
                    .get_opt("smolvm-webhook-tls")
                    .await?
                    .ok_or_else(|| anyhow!("the install's webhook TLS Secret is gone"))?;
                Ok(secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get("ca.crt"))
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned()))
            }
        },
    )
    .await?;
    // Both replicas must serve a certificate that the one CA verifies for the Service's name.
    let config = std::sync::Arc::new(smolvm_certs::client_config(&ca, None, &[])?);
    for (i, port) in ports.iter().enumerate() {
        let config = config.clone();
        let replica = &mut replicas[i];
        eventually(
            &format!("replica {i} to serve a certificate from the shared CA"),
            Duration::from_secs(60),
            || {
                let config = config.clone();
                let exited = replica.exited().map(|s| (s, replica.log_tail(20)));
                async move {
                    if let Some((s, log)) = exited {
                        bail!("replica {i} exited ({s}):\n{log}");
                    }
                    let Ok(tcp) = tokio::net::TcpStream::connect(("127.0.0.1", *port)).await else {
                        return Ok(None);
                    };
                    let name =
                        rustls::pki_types::ServerName::try_from(format!("smolvm-webhook.{}.svc", env::NAMESPACE))?;
                    match tokio_rustls::TlsConnector::from(config).connect(name, tcp).await {
                        Ok(_) => Ok(Some(())),
                        Err(e) => Err(anyhow!("TLS handshake with replica {i}: {e}")),
                    }
                }
            },
        )
        .await?;
    }
    drop(replicas);
    // The replicas injected their CA into the registrations; point them back at the test webhook.
    env.register_webhooks()
}
