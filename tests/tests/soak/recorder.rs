//! The run's history (smolvm-soak's `history`): every observation stamped with the run's clock,
//! appended to `history.jsonl` in the run's directory and fed to the checker as it comes, a
//! violation printed at once. Two recorders feed it: a watch of every SmolVM (each version seen,
//! each deletion; objects a re-list no longer holds are recorded gone), and a poll of every node
//! (its SmolVMNode's allocatable, what the SmolVMs bound there book, what its runtime reports,
//! and its full list of `svm-*` machines, stamped with the time it was asked for).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use smolvm_api::{SmolVM, SmolVMNode, constants};
use smolvm_soak::{
    Config,
    check::{CheckParams, Checker, Violation},
    history::{Event, NodeSeen, Observation, Phase, Resources, VmSeen},
    workload::VmRef,
};

use crate::clients::is_soak_namespace;
use crate::runner::NodeRuntime;

/// The history of one run.
pub struct History {
    started: Instant,
    inner: Mutex<Inner>,
}

struct Inner {
    file: std::fs::File,
    checker: Option<Checker>,
    observations: Vec<Observation>,
}

impl History {
    /// A history written to `path`, checked for the run `config` names.
    pub fn create(path: &Path, config: Config, params: CheckParams) -> anyhow::Result<Arc<History>> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Arc::new(History {
            started: Instant::now(),
            inner: Mutex::new(Inner {
                file,
                checker: Some(Checker::new(config, params)),
                observations: Vec::new(),
            }),
        }))
    }

    /// The run's clock: the time since the history began.
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// The instant `at` into the run.
    pub fn instant(&self, at: Duration) -> Instant {
        self.started + at
    }

    /// Records `event` now.
    pub fn record(&self, event: Event) {
        self.record_at(self.now(), event);
    }

    /// Records `event` at `at` (a listing: when it was asked for).
    pub fn record_at(&self, at: Duration, event: Event) {
        let observation = Observation::new(at, event);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(line) = observation.to_json_line() {
            let _ = writeln!(inner.file, "{line}");
        }
        if let Some(checker) = inner.checker.as_mut() {
            for violation in checker.observe(&observation) {
                println!("VIOLATION {violation}");
            }
        }
        inner.observations.push(observation);
    }

    /// Every violation (those only the end shows too) and the whole history; the history takes
    /// nothing more after this.
    pub fn finish(&self) -> (Vec<Violation>, Vec<Observation>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let violations = inner.checker.take().map(Checker::finish).unwrap_or_default();
        (violations, std::mem::take(&mut inner.observations))
    }
}

/// A SmolVM as the history records it.
pub fn seen(vm: &SmolVM) -> VmSeen {
    let status = vm.status.as_ref();
    let condition = |type_: &str| status.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_));
    // Why it is not as its spec asks: a blocked deletion, a placement refused, a Ready not True.
    let blocked = condition(constants::condition::DELETION_BLOCKED).filter(|c| c.status == "True");
    let unscheduled = condition(constants::condition::SCHEDULED).filter(|c| c.status == "False");
    let not_ready = condition(constants::condition::READY).filter(|c| c.status != "True");
    let reason = blocked
        .or(unscheduled)
        .or(not_ready)
        .map(|c| c.reason.clone())
        .filter(|r| !r.is_empty());
    let phase = status
        .and_then(|s| s.phase)
        .and_then(|p| serde_json::from_value::<Phase>(serde_json::Value::from(p.as_str())).ok());
    VmSeen {
        uid: vm.uid().unwrap_or_default(),
        vm: VmRef::new(vm.namespace().unwrap_or_default(), vm.name_any()),
        node_name: status.and_then(|s| s.node_name.clone()),
        node_uid: status.and_then(|s| s.node_uid.clone()),
        phase,
        reason,
        finalizers: vm.finalizers().to_vec(),
        deletion_requested: vm.metadata.deletion_timestamp.is_some(),
        force_delete: vm
            .annotations()
            .get(constants::FORCE_DELETE_ANNOTATION)
            .map(String::as_str)
            == Some(constants::FORCE_DELETE_VALUE),
        saved_state: condition(constants::condition::SUSPENDED).is_some_and(|c| c.status == "True"),
        running: vm.spec.running.unwrap_or(true),
        suspended: vm.spec.suspended.unwrap_or(false),
    }
}

/// Records every version of every soak SmolVM the watch sees, and each deletion.
pub async fn watch_vms(client: Client, history: Arc<History>) {
    let api: Api<SmolVM> = Api::all(client);
    let mut known: BTreeMap<String, VmRef> = BTreeMap::new();
    let mut relisted: BTreeSet<String> = BTreeSet::new();
    let stream = watcher::watcher(api, watcher::Config::default());
    let mut stream = std::pin::pin!(stream.default_backoff());
    while let Some(event) = stream.next().await {
        let Ok(event) = event else { continue };
        match event {
            watcher::Event::Init => relisted.clear(),
            watcher::Event::InitApply(vm) | watcher::Event::Apply(vm) => {
                if !is_soak_namespace(&vm.namespace().unwrap_or_default()) {
                    continue;
                }
                let seen = seen(&vm);
                relisted.insert(seen.uid.clone());
                known.insert(seen.uid.clone(), seen.vm.clone());
                history.record(Event::Vm(seen));
            }
            watcher::Event::Delete(vm) => {
                if let Some(uid) = vm.uid()
                    && let Some(vm) = known.remove(&uid)
                {
                    history.record(Event::VmGone { uid, vm });
                }
            }
            watcher::Event::InitDone => {
                // Deleted while the watch was down: the re-list no longer holds them.
                let gone: Vec<String> = known.keys().filter(|u| !relisted.contains(*u)).cloned().collect();
                for uid in gone {
                    if let Some(vm) = known.remove(&uid) {
                        history.record(Event::VmGone { uid, vm });
                    }
                }
            }
        }
    }
}

/// A node the poller looks at.
pub struct PolledNode {
    /// Its SmolVMNode's name.
    pub name: String,
    /// How to list its machines.
    pub runtime: NodeRuntime,
}

/// Every `interval`, records each node (allocatable, the bindings' booking, the runtime's own
/// report) and its machines.
pub async fn poll_nodes(client: Client, nodes: Vec<PolledNode>, history: Arc<History>, interval: Duration) {
    let vms: Api<SmolVM> = Api::all(client.clone());
    let smolvm_nodes: Api<SmolVMNode> = Api::all(client);
    loop {
        tokio::time::sleep(interval).await;
        let Ok(list) = vms.list(&Default::default()).await else {
            continue;
        };
        for node in &nodes {
            let asked = history.now();
            let machines = node.runtime.machines().await;
            if let Some(machines) = &machines {
                let names = machines
                    .iter()
                    .map(|m| m.name.clone())
                    .filter(|n| n.starts_with("svm-"));
                history.record_at(
                    asked,
                    Event::Machines {
                        node: node.name.clone(),
                        machines: names.collect(),
                    },
                );
            }
            let Ok(Some(smolvm_node)) = smolvm_nodes.get_opt(&node.name).await else {
                continue;
            };
            let seen = node_seen(&smolvm_node, &list.items, machines.as_deref(), node.runtime.is_cut());
            history.record(Event::Node(seen));
        }
    }
}

/// A node as the history records it: `ledger` is what the SmolVMs bound there book (a suspended
/// one only its storage: its CPU and memory go back to the node; also one last seen suspended on
/// a node now unreachable, whose phase says Unknown); `reported` is what its
/// running machines take, by its runtime's own list.
fn node_seen(
    node: &SmolVMNode,
    vms: &[SmolVM],
    machines: Option<&[smolvm_runtime::vmm::Machine]>,
    cut: bool,
) -> NodeSeen {
    let status = node.status.as_ref();
    let allocatable = status.and_then(|s| s.allocatable).unwrap_or_default();
    let ready = status
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == constants::condition::READY))
        .is_some_and(|c| c.status == "True");
    let name = node.name_any();
    let mut ledger = Resources::default();
    let mut booked_by = Vec::new();
    for vm in vms.iter().filter(|v| v.bound_node() == Some(name.as_str())) {
        let (cpus, memory, disk) = booked(vm);
        let phase = vm.status.as_ref().and_then(|s| s.phase);
        // As the controller seeds its ledger: a VM last seen suspended on a node now
        // unreachable still holds only its disks.
        if !smolvm_api::quota::status_holds_suspended(vm.status.as_ref()) {
            ledger.cpus += cpus;
            ledger.memory_mib += memory;
            // The node's own word on the machine, beside the status's.
            let machine = vm.status.as_ref().and_then(|s| s.machine_name.as_deref());
            let on_node = machines
                .zip(machine)
                .map(|(list, machine)| {
                    list.iter()
                        .find(|m| m.name == machine)
                        .map_or_else(|| "absent".to_string(), |m| format!("{:?}", m.state))
                })
                .unwrap_or_else(|| "unknown".to_string());
            booked_by.push(format!(
                "{}/{} {phase:?} {cpus}/{memory} (spec running={} suspended={}; on the node {on_node})",
                vm.namespace().unwrap_or_default(),
                vm.name_any(),
                vm.spec.running.unwrap_or(true),
                vm.spec.suspended.unwrap_or(false)
            ));
        }
        ledger.storage_mib += disk * 1024;
    }
    let reported = machines.map(|machines| {
        let mut total = Resources::default();
        for m in machines {
            if m.state == smolvm_runtime::vmm::MachineState::Running {
                total.cpus += u64::from(m.cpus);
                total.memory_mib += m.memory_mib;
            }
            let disk = m.storage_gib.unwrap_or(0) + m.overlay_gib.unwrap_or(0);
            total.storage_mib += disk * 1024;
        }
        total
    });
    let positive = |v: i64| u64::try_from(v).unwrap_or(0);
    NodeSeen {
        node: name,
        reachable: ready && !cut,
        allocatable: Resources {
            cpus: positive(allocatable.cpus),
            memory_mib: positive(allocatable.memory_mib),
            storage_mib: positive(allocatable.storage_gib) * 1024,
        },
        ledger: Some(ledger),
        reported,
        booked_by,
    }
}

/// What a bound SmolVM books: CPUs, MiB of memory, GiB of disk (storage plus overlay); what is
/// in effect where the status says, else its spec.
fn booked(vm: &SmolVM) -> (u64, u64, u64) {
    let positive = |v: i64| u64::try_from(v).unwrap_or(0);
    if let Some(e) = vm.status.as_ref().and_then(|s| s.effective.as_ref()) {
        return (
            positive(i64::from(e.cpus)),
            positive(e.memory_mib),
            positive(e.storage_gib + e.overlay_gib),
        );
    }
    let resources = vm.spec.resources.as_ref();
    let storage = vm.spec.storage.as_ref();
    (
        positive(i64::from(resources.and_then(|r| r.cpus).unwrap_or(1))),
        positive(resources.and_then(|r| r.memory_mib).unwrap_or(0)),
        positive(storage.and_then(|s| s.storage_gib).unwrap_or(0) + storage.and_then(|s| s.overlay_gib).unwrap_or(0)),
    )
}
