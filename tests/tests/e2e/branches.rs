//! Branches (SPEC 2.6) on the real API server, on a node backed by the smolvm double (its
//! machines "boot" at once): a branchable SmolVM runs; `kubectl smolvm branch` fans it out into
//! 20 branches, each Running with its own env, made by 20 branch calls and no create; V17
//! refuses a branch that sets what it takes from its source, and an unknown source; the source's
//! deletion waits for its branches (DeletionBlocked, LiveBranches) until the delete-branches
//! annotation deletes them first.

use std::{process::Output, time::Duration};

use anyhow::{Context as _, anyhow, ensure};
use kube::{Api, api::DeleteParams};
use serde_json::json;
use smolvm_api::{Phase, SmolVM, constants};
use smolvm_testkit::smolvm_double::DoubleHandle;
use smolvm_tests::env::{Env, eventually};

use crate::{NS, Scenario, delete_and_wait, expect_rejected, kubectl_apply, vm, vms};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![branches_fan_out_through_the_plugin_and_the_source_goes_after_them]
}

/// The node of the scenario, backed by its own double.
const NODE: &str = "branch-double-node";
/// The branch source.
const SOURCE: &str = "prepared";
/// Branches made by each of the two plugin runs.
const EACH: usize = 10;

/// Runs `kubectl-smolvm` as the admin, off the test's runtime: the double serves on it, and the
/// plugin waits for what the double answers.
async fn plugin(env: &Env, args: &[&str]) -> anyhow::Result<Output> {
    let kubeconfig = env.plane.admin_kubeconfig.display().to_string();
    let mut all: Vec<String> = vec!["--kubeconfig".into(), kubeconfig, "-n".into(), NS.into()];
    all.extend(args.iter().map(|a| a.to_string()));
    let bin = env.bins.plugin.clone();
    let shown = bin.display().to_string();
    tokio::task::spawn_blocking(move || std::process::Command::new(&bin).args(&all).output())
        .await
        .context("the plugin's thread")?
        .with_context(|| format!("running {shown}"))
}

async fn branches_fan_out_through_the_plugin_and_the_source_goes_after_them(env: &mut Env) -> anyhow::Result<()> {
    // Room for the source and its 20 branches, one CPU each, whatever this machine has.
    let node = env
        .start_on_double(NODE, &["--cpu-allocation-ratio=16", "--reserved-cpus=0"])
        .await?;
    let outcome = fan_out(env, &node.double).await;
    let selector = format!("{}={SOURCE}", constants::LABEL_BRANCH_OF);
    let _ = env.kubectl(&["delete", "svm", "-n", NS, "-l", &selector, "--wait=false"], None);
    let _ = delete_and_wait(env, SOURCE).await;
    node.stop(env).await;
    outcome
}

async fn fan_out(env: &mut Env, double: &DoubleHandle) -> anyhow::Result<()> {
    let source = vm(
        SOURCE,
        json!({"image": "alpine:3.20", "branchable": true, "resources": {"memoryMiB": 128},
               "storage": {"storageGiB": 1, "overlayGiB": 1},
               "nodeSelector": {"kubernetes.io/hostname": NODE},
               "env": [{"name": "MODE", "value": "source"}]}),
    );
    kubectl_apply(env, &source)?.map_err(|e| anyhow!("applying the source: {e}"))?;
    let running = crate::wait_vm(env, SOURCE, "the source running", Duration::from_secs(60), |v| {
        v.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running)
    })
    .await?;
    let source_machine = running.machine_name().unwrap_or_default();
    ensure!(
        double.state(&source_machine).as_deref() == Some("running"),
        "the source's machine runs in smolvm"
    );
    println!("    the branchable source runs on {NODE}");

    // V17 through the real API server: every violation at once, naming the field.
    let greedy = vm(
        "greedy",
        json!({"branchOf": {"name": SOURCE}, "image": "busybox", "resources": {"cpus": 2}}),
    );
    expect_rejected(env, &greedy, &["spec.image", "spec.resources", "V17"])?;
    let orphan = vm("orphan", json!({"branchOf": {"name": "nowhere"}}));
    expect_rejected(env, &orphan, &["spec.branchOf.name", "nowhere", SOURCE])?;
    println!("    V17 refuses a branch that sets its source's fields, and an unknown source, naming them");

    double.clear_calls();
    for task in ["a", "b"] {
        let prefix = format!("task-{task}");
        let env_arg = format!("TASK={task}");
        let count = EACH.to_string();
        let out = plugin(
            env,
            &[
                "branch", SOURCE, "--name", &prefix, "--count", &count, "--env", &env_arg,
            ],
        )
        .await?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "kubectl smolvm branch --count {EACH} succeeds: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows = stdout
            .lines()
            .filter(|l| l.starts_with(&prefix) && l.contains("Running"))
            .count();
        ensure!(rows == EACH, "{EACH} rows, each Running: {stdout}");
    }
    let selector = format!("{}={SOURCE}", constants::LABEL_BRANCH_OF);
    let branches = vms(env)
        .await?
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?
        .items;
    ensure!(branches.len() == 2 * EACH, "20 branches: {}", branches.len());
    let mut machines = Vec::new();
    for branch in &branches {
        let name = branch.metadata.name.clone().unwrap_or_default();
        let status = branch.status.clone().unwrap_or_default();
        ensure!(status.phase == Some(Phase::Running), "{name} runs: {:?}", status.phase);
        ensure!(
            status.node_name.as_deref() == Some(NODE),
            "{name} is on its source's node"
        );
        ensure!(
            status.branched_from.as_ref().map(|f| f.name.as_str()) == Some(SOURCE)
                && status.branched_from.as_ref().map(|f| f.uid.as_str()) == running.metadata.uid.as_deref(),
            "{name} records its source: {:?}",
            status.branched_from
        );
        let machine = branch.machine_name().unwrap_or_default();
        let own = double.env(&machine).unwrap_or_default();
        let task = if name.starts_with("task-a") { "TASK=a" } else { "TASK=b" };
        ensure!(
            own.iter().any(|e| e == task) && own.iter().any(|e| e == "MODE=source"),
            "{name}'s machine has its own env and its source's: {own:?}"
        );
        machines.push(machine);
    }
    let branched = double.calls_of("branch_machine");
    let created = double
        .calls_of("create_machine")
        .into_iter()
        .filter(|c| c.machine.as_ref().is_some_and(|m| machines.contains(m)))
        .count();
    ensure!(
        branched.len() == 2 * EACH && created == 0,
        "20 branch calls and no create: {} branch calls, {created} creates",
        branched.len()
    );
    let first = branches[0].metadata.name.clone().unwrap_or_default();
    let event = crate::expect_event(env, &first, constants::reason::BRANCHED).await?;
    let note = event.note.unwrap_or_default();
    ensure!(
        note.contains(SOURCE) && note.contains(NODE) && note.contains(" ms"),
        "the Branched event names the source, the node and the time: {note}"
    );
    println!("    kubectl smolvm branch made 20 branches, each Running with its own env: 20 branch calls, no create");

    let out = plugin(env, &["get-branches", SOURCE]).await?;
    let listed = String::from_utf8_lossy(&out.stdout);
    let rows = listed.lines().filter(|l| l.starts_with("task-")).count();
    ensure!(
        out.status.success() && rows == 2 * EACH,
        "get-branches lists 20: {listed}"
    );

    // The source goes after its branches: its deletion waits, naming them, until the annotation
    // deletes them first.
    let api: Api<SmolVM> = vms(env).await?;
    api.delete(SOURCE, &DeleteParams::default()).await?;
    let blocked = crate::wait_vm(
        env,
        SOURCE,
        "the source's deletion blocked",
        Duration::from_secs(30),
        |v| {
            v.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == constants::condition::DELETION_BLOCKED && c.reason == constants::reason::LIVE_BRANCHES
                })
            })
        },
    )
    .await?;
    let message = blocked
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == constants::condition::DELETION_BLOCKED)
        })
        .map(|c| c.message.clone())
        .unwrap_or_default();
    ensure!(
        message.contains(&first) && message.contains(constants::DELETE_BRANCHES_ANNOTATION),
        "DeletionBlocked names the branches and the annotation: {message}"
    );
    ensure!(
        double.state(&source_machine).as_deref() == Some("running"),
        "the source's machine is kept while its branches live"
    );
    println!("    the source's deletion waits for its 20 branches (DeletionBlocked, LiveBranches)");
    let annotation = format!("{}=true", constants::DELETE_BRANCHES_ANNOTATION);
    let out = env.kubectl(&["annotate", "svm", SOURCE, "-n", NS, &annotation], None)?;
    ensure!(
        out.status.success(),
        "annotating: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("the source and its branches gone", Duration::from_secs(90), || {
        let api = api.clone();
        let selector = selector.clone();
        async move {
            let left = api
                .list(&kube::api::ListParams::default().labels(&selector))
                .await?
                .items
                .len();
            let source = api.get_opt(SOURCE).await?;
            Ok((left == 0 && source.is_none()).then_some(()))
        }
    })
    .await?;
    ensure!(
        double.state(&source_machine).is_none() && machines.iter().all(|m| double.state(m).is_none()),
        "every machine is gone from smolvm"
    );
    println!("    with vm.smolvm.dev/delete-branches the branches went first, then the source");
    example(env).await
}

/// `deploy/examples/branches.yaml` applied at once: the branch is admitted though the webhook's
/// cache may not hold its source yet (read live), waits while its source boots, and runs once it
/// does (woken by the source, not at its next look).
async fn example(env: &Env) -> anyhow::Result<()> {
    let path = smolvm_tests::env::repo_root().join("deploy/examples/branches.yaml");
    let out = env.kubectl(&["apply", "-n", NS, "-f", &path.display().to_string()], None)?;
    ensure!(
        out.status.success(),
        "applying the example: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let branch = crate::wait_vm(
        env,
        "prepared-task-1",
        "the example's branch running",
        Duration::from_secs(30),
        |v| v.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running),
    )
    .await?;
    ensure!(
        branch.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE),
        "the example's branch runs on its source's node"
    );
    println!("    deploy/examples/branches.yaml applied at once: its branch runs on its source's node");
    delete_and_wait(env, "prepared-task-1").await?;
    delete_and_wait(env, SOURCE).await?;
    Ok(())
}
