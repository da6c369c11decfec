//! `make bench-suspend`: the operator's own time from a `spec.suspended` write to the node call
//! it makes (smolvm's pause or resume), on loopback, with a real kube-apiserver, the real webhook
//! and controller, and the real agent binary.
//!
//! TEST DOUBLE: the node's runtime is testkit's `SmolvmDouble` (smolvm 1.32.2's routes and
//! schemas, served in this process), since no guest boots on these machines and only a running
//! machine can be suspended. The double records when each call arrived. Two figures per call:
//! the operator's own time, from the API server's answer to the write (the object is stored and
//! its watch event on its way) to the call; and the whole path, from before the write was sent
//! (the webhook's two reviews and etcd's write included). Both clocks are this machine's.
//!
//! Prints p50, p99 and the slowest for suspends and for resumes, one VM at a time (each settled
//! before the next), against the target p99 <= 50 ms. Figures are printed, never asserted.
//! Environment: SUSPEND_BENCH_VMS (30: the node holds 32 CPUs).

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, anyhow};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use smolvm_api::{Phase, SmolVM};
use smolvm_testkit::smolvm_double::DoubleHandle;
use smolvm_tests::{
    assets,
    env::eventually,
    simnodes::{DoubleNode, double_node, report_ms},
};

const NODE: &str = "bench-double-node";
const NS: &str = "default";

fn main() -> anyhow::Result<()> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(2);
    assets::bench_main("suspend", runtime, run)
}

async fn run(assets: assets::Assets) -> anyhow::Result<()> {
    let count = smolvm_tests::simnodes::env_usize("SUSPEND_BENCH_VMS", 30);
    // The directory is bound first, so it goes last, after the processes that use it.
    let DoubleNode {
        dir: _dir,
        mut env,
        double,
        agent: _agent,
    } = double_node(&assets, "smolvm-suspend-", NODE).await?;
    let api: Api<SmolVM> = Api::namespaced(env.admin().await?, NS);
    let mut machines = Vec::new();
    for i in 0..count {
        let name = format!("bench-{i}");
        let vm: SmolVM = serde_json::from_value(json!({
            "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"image": "alpine:3.20", "nodeName": NODE, "resources": {"cpus": 1, "memoryMiB": 128},
                     "storage": {"storageGiB": 1, "overlayGiB": 1}},
        }))?;
        api.create(&PostParams::default(), &vm).await?;
        machines.push(name);
    }
    let mut names = Vec::new();
    for name in &machines {
        let vm = wait_phase(&api, name, Phase::Running).await?;
        let machine = vm
            .status
            .and_then(|s| s.machine_name)
            .ok_or_else(|| anyhow!("{name} has no machine name"))?;
        names.push((name.clone(), machine));
    }
    println!("{count} VMs running on a double-backed node; one at a time:");
    let (suspend, suspend_whole) = samples(&api, &double, &names, true).await?;
    let (resume, resume_whole) = samples(&api, &double, &names, false).await?;
    report_ms(
        "suspend, the operator's own time (write stored -> smolvm pause called)",
        suspend,
    );
    report_ms("the whole path (write sent -> smolvm pause called)", suspend_whole);
    report_ms(
        "resume, the operator's own time (write stored -> smolvm resume called)",
        resume,
    );
    report_ms("the whole path (write sent -> smolvm resume called)", resume_whole);
    println!("target: p99 <= 50 ms (SPEC: the operator's own time, on loopback)");
    env.stop_runtime();
    Ok(())
}

/// For each VM in turn: write `spec.suspended`, time until the double receives its call, then
/// wait for the status to settle before the next.
async fn samples(
    api: &Api<SmolVM>,
    double: &DoubleHandle,
    names: &[(String, String)],
    suspend: bool,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let operation = if suspend { "pause_machine" } else { "resume_machine" };
    let settled = if suspend { Phase::Suspended } else { Phase::Running };
    let (mut own, mut whole) = (Vec::new(), Vec::new());
    for (name, machine) in names {
        let before = double.calls_of(operation).len();
        let sent = SystemTime::now();
        let patch = json!({"spec": {"suspended": suspend}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        let stored = SystemTime::now();
        let call = eventually(&format!("{operation} of {name}"), Duration::from_secs(30), || async {
            Ok(double
                .calls_of(operation)
                .into_iter()
                .skip(before)
                .find(|c| c.machine.as_deref() == Some(machine.as_str())))
        })
        .await?;
        // A call that came before the answer reached this process counts as no time at all.
        own.push(call.at.duration_since(stored).unwrap_or_default());
        whole.push(call.at.duration_since(sent).unwrap_or_default());
        wait_phase(api, name, settled).await?;
    }
    Ok((own, whole))
}

async fn wait_phase(api: &Api<SmolVM>, name: &str, phase: Phase) -> anyhow::Result<SmolVM> {
    let started = Instant::now();
    eventually(
        &format!("{name} {}", phase.as_str()),
        Duration::from_secs(60),
        || async {
            let vm = api.get(name).await?;
            Ok((vm.status.as_ref().and_then(|s| s.phase) == Some(phase)).then_some(vm))
        },
    )
    .await
    .with_context(|| format!("after {:?}", started.elapsed()))
}
