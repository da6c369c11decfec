//! `make bench-branch`: the operator's own time from a branch's create to smolvm's branch call,
//! on loopback, with a real kube-apiserver, the real webhook and controller, and the real agent
//! binary; and the SmolVM writes the operator makes per branch.
//!
//! TEST DOUBLE: the node's runtime is testkit's `SmolvmDouble` (smolvm 1.32.2's routes and
//! schemas, served in this process), since no guest boots on these machines and only a running
//! machine can be branched. The double records when it made each branch. The operator's own
//! time runs from the API server's answer to the branch's create (the object is stored and its
//! watch event on its way) to the double making the branch; both clocks are this machine's.
//!
//! Prints, for BRANCH_BENCH_COUNT (20) branches of one source, one at a time (each Running
//! before the next is created) and all at once, `own time (...): p50 X ms, p99 Y ms`, against
//! the target p99 <= 50 ms; and `writes per branch: N` (SmolVM and SmolVM status writes by the
//! operator, the benchmark's own creates aside; target <= 2), with the events per branch.
//! Figures are printed, never asserted.

use std::time::{Duration, SystemTime};

use anyhow::anyhow;
use kube::{Api, api::PostParams};
use serde_json::json;
use smolvm_api::{Phase, SmolVM};
use smolvm_testkit::smolvm_double::DoubleHandle;
use smolvm_tests::{
    assets,
    env::eventually,
    simnodes::{DoubleNode, api_requests, double_node, env_usize, report_ms},
};

const NODE: &str = "bench-branch-node";
const NS: &str = "default";
const SOURCE: &str = "bench-source";

fn main() -> anyhow::Result<()> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(2);
    assets::bench_main("branch", runtime, run)
}

async fn run(assets: assets::Assets) -> anyhow::Result<()> {
    let count = env_usize("BRANCH_BENCH_COUNT", 20);
    // The directory is bound first, so it goes last, after the processes that use it.
    let DoubleNode {
        dir: _dir,
        mut env,
        double,
        agent: _agent,
    } = double_node(&assets, "smolvm-branch-", NODE).await?;
    let admin = env.admin().await?;
    let api: Api<SmolVM> = Api::namespaced(admin.clone(), NS);
    let source = object(
        SOURCE,
        json!({"image": "alpine:3.20", "branchable": true, "nodeName": NODE, "resources": {"cpus": 1, "memoryMiB": 128},
               "storage": {"storageGiB": 1, "overlayGiB": 1}}),
    )?;
    api.create(&PostParams::default(), &source).await?;
    wait_running(&api, SOURCE).await?;
    // A webhook whose cache of sources has the source answers without reading it: wait for it,
    // so the first branch is timed as the others.
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!("{count} branches of one running source on a double-backed node:");

    let before = api_requests(&admin).await?;
    let mut one_at_a_time = Vec::new();
    for i in 0..count {
        let (name, machine, stored) = create_branch(&api, &format!("one-{i}")).await?;
        one_at_a_time.push(branched_after(&double, &machine, stored).await?);
        wait_running(&api, &name).await?;
    }
    let after = api_requests(&admin).await?;
    let delta = |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let per = |v: f64| v / count as f64;
    let object_writes = delta("smolvms") - count as f64; // minus the benchmark's own creates
    let status_writes = delta("smolvms/status");

    // The node holds the source and `count` branches (32 CPUs, one each): the first set goes
    // before the second is made.
    for i in 0..count {
        api.delete(&format!("one-{i}"), &Default::default()).await?;
    }
    for i in 0..count {
        let name = format!("one-{i}");
        eventually(&format!("{name} gone"), Duration::from_secs(60), || async {
            Ok(api.get_opt(&name).await?.is_none().then_some(()))
        })
        .await?;
    }
    let creates = (0..count).map(|i| {
        let api = api.clone();
        async move { create_branch(&api, &format!("all-{i}")).await }
    });
    let created: Vec<(String, String, SystemTime)> = futures::future::try_join_all(creates).await?;
    let mut at_once = Vec::new();
    for (name, machine, stored) in &created {
        at_once.push(branched_after(&double, machine, *stored).await?);
        wait_running(&api, name).await?;
    }

    report_ms("own time (one at a time)", one_at_a_time);
    report_ms(&format!("own time ({count} at once)"), at_once);
    println!(
        "writes per branch: {:.2} (smolvms {:.2} + smolvms/status {:.2}; target <= 2 besides the create); events per branch {:.2}",
        per(object_writes + status_writes),
        per(object_writes),
        per(status_writes),
        per(delta("events"))
    );
    println!("target: own time p99 <= 50 ms (the operator's time from the create's answer to smolvm's branch call)");
    env.stop_runtime();
    Ok(())
}

fn object(name: &str, spec: serde_json::Value) -> anyhow::Result<SmolVM> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }))?)
}

/// Creates the branch `name` of the source: its name, its machine's name and when the API
/// server's answer came.
async fn create_branch(api: &Api<SmolVM>, name: &str) -> anyhow::Result<(String, String, SystemTime)> {
    let branch = object(name, json!({"branchOf": {"name": SOURCE}}))?;
    let made = api.create(&PostParams::default(), &branch).await?;
    let stored = SystemTime::now();
    let machine = made.machine_name().ok_or_else(|| anyhow!("{name} has no UID"))?;
    Ok((name.to_string(), machine, stored))
}

/// The time from `stored` until the double made the branch `machine` (a branch made before the
/// answer reached this process counts as no time at all).
async fn branched_after(double: &DoubleHandle, machine: &str, stored: SystemTime) -> anyhow::Result<Duration> {
    let made = eventually(&format!("the branch {machine}"), Duration::from_secs(30), || async {
        Ok(double.branched().into_iter().find(|b| b.child == machine))
    })
    .await?;
    Ok(made.at.duration_since(stored).unwrap_or_default())
}

async fn wait_running(api: &Api<SmolVM>, name: &str) -> anyhow::Result<SmolVM> {
    eventually(&format!("{name} Running"), Duration::from_secs(60), || async {
        let vm = api.get(name).await?;
        Ok((vm.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running)).then_some(vm))
    })
    .await
}
