//! The workload's clients: each operation of the generator's stream issued at its time, by its
//! own task, which retries the write until the API acknowledges it (the API server, etcd or
//! the webhook may be down), records the acknowledgement (a delete: before it is sent), then
//! waits for the outcome it expects within its deadline. Writes to one SmolVM go in the
//! stream's order; a later operation on the same SmolVM ends the earlier one's wait.
//!
//! Where a VM runs: one the plan ever suspends is pinned to the double-backed node (the
//! simulated nodes' in-memory runtime cannot pause a machine); every sixth other create is pinned
//! to the real node, where no guest boots, so its start is expected to fail (StartFailed);
//! the rest go where the controller places them. Claims go where their pool's slots are.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use smolvm_api::{SmolVM, constants};
use smolvm_soak::{
    history::{Ack, Event},
    workload::{OpKind, Operation, Outcome, VmRef},
};

use crate::recorder::{History, seen};

/// The prefix of the soak's namespaces.
const NAMESPACE_PREFIX: &str = "soak-";
/// How often a client retries a write or looks at its SmolVM again.
const POLL: Duration = Duration::from_secs(1);

/// Whether `namespace` is one the workload writes to.
pub fn is_soak_namespace(namespace: &str) -> bool {
    namespace.starts_with(NAMESPACE_PREFIX)
}

/// Where created VMs are pinned (see the module's doc), by VM.
pub fn pins(operations: &[Operation], real_node: &str, double_node: &str) -> BTreeMap<VmRef, String> {
    let mut pins = BTreeMap::new();
    let mut plain = 0u32;
    for op in operations.iter().filter(|o| o.kind == OpKind::Create) {
        let suspended = operations
            .iter()
            .any(|later| later.vm == op.vm && later.kind == OpKind::Suspend);
        if suspended {
            pins.insert(op.vm.clone(), double_node.to_string());
            continue;
        }
        if plain % 6 == 0 {
            pins.insert(op.vm.clone(), real_node.to_string());
        }
        plain += 1;
    }
    pins
}

/// How the clients' waits ended.
#[derive(Debug, Default)]
pub struct Tally {
    /// The expected outcome seen.
    pub met: usize,
    /// A later operation on the same SmolVM came first.
    pub superseded: usize,
    /// Not seen within the deadline, or the write was refused: one line each.
    pub missed: Vec<String>,
}

/// The workload's clients.
pub struct Clients {
    client: Client,
    history: Arc<History>,
    pins: BTreeMap<VmRef, String>,
    real_node: String,
    /// Writes to one SmolVM go in order.
    order: Mutex<BTreeMap<VmRef, Arc<tokio::sync::Mutex<()>>>>,
    /// The last operation issued per SmolVM.
    latest: Mutex<BTreeMap<VmRef, u32>>,
    /// How the waits ended.
    pub tally: Mutex<Tally>,
}

impl Clients {
    /// Clients writing as `client` (the admin), recording into `history`.
    pub fn new(client: Client, history: Arc<History>, pins: BTreeMap<VmRef, String>, real_node: &str) -> Arc<Self> {
        Arc::new(Clients {
            client,
            history,
            pins,
            real_node: real_node.to_string(),
            order: Mutex::default(),
            latest: Mutex::default(),
            tally: Mutex::default(),
        })
    }

    /// Issues every operation at its time; returns when every client is done.
    pub async fn run(self: Arc<Self>, operations: Vec<Operation>) {
        let mut tasks = Vec::new();
        for op in operations {
            tokio::time::sleep_until(self.history.instant(op.at).into()).await;
            lock(&self.latest).insert(op.vm.clone(), op.seq);
            let turn = lock(&self.order).entry(op.vm.clone()).or_default().clone();
            let clients = self.clone();
            tasks.push(tokio::spawn(async move { clients.execute(op, turn).await }));
        }
        for task in tasks {
            let _ = task.await;
        }
    }

    async fn execute(self: Arc<Self>, op: Operation, turn: Arc<tokio::sync::Mutex<()>>) {
        let deadline = self.history.instant(op.at + op.deadline);
        let written = {
            let _turn = turn.lock().await;
            self.write(&op, deadline).await
        };
        let missed = match written {
            Ok(()) => self.wait(&op, deadline).await,
            Err(why) => Some(why),
        };
        let mut tally = lock(&self.tally);
        match missed {
            None => tally.met += 1,
            Some(why) if why == SUPERSEDED => tally.superseded += 1,
            Some(why) => tally.missed.push(format!("#{} {} {}: {why}", op.seq, op.kind, op.vm)),
        }
    }

    fn api(&self, vm: &VmRef) -> Api<SmolVM> {
        Api::namespaced(self.client.clone(), &vm.namespace)
    }

    fn ack(&self, op: &Operation, uid: Option<String>) {
        self.history.record(Event::Ack(Ack {
            seq: op.seq,
            kind: op.kind,
            vm: op.vm.clone(),
            expect: op.expect,
            uid,
        }));
    }

    /// Sends the operation's write until the API acknowledges it; `Err` says why it never did.
    async fn write(&self, op: &Operation, deadline: std::time::Instant) -> Result<(), String> {
        let api = self.api(&op.vm);
        if op.kind == OpKind::Delete {
            self.ack(op, None);
        }
        loop {
            let answer = match op.kind {
                OpKind::Create | OpKind::Claim => {
                    let body: SmolVM = serde_json::from_value(self.body(op)).map_err(|e| e.to_string())?;
                    api.create(&PostParams::default(), &body).await.map(Some)
                }
                OpKind::Delete => api.delete(&op.vm.name, &DeleteParams::default()).await.map(|_| None),
                _ => {
                    let patch = Patch::Merge(change(op));
                    api.patch(&op.vm.name, &PatchParams::default(), &patch).await.map(Some)
                }
            };
            match answer {
                Ok(stored) => {
                    if op.kind != OpKind::Delete {
                        self.ack(op, stored.and_then(|vm| vm.uid()));
                    }
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.code == 404 && op.kind == OpKind::Delete => return Ok(()),
                // A create whose answer was lost (the API server went down) and then retried.
                Err(kube::Error::Api(s)) if s.code == 409 && matches!(op.kind, OpKind::Create | OpKind::Claim) => {
                    if let Ok(Some(vm)) = api.get_opt(&op.vm.name).await {
                        self.ack(op, vm.uid());
                        return Ok(());
                    }
                }
                Err(kube::Error::Api(s)) if refused(s.code) => {
                    return Err(format!("refused ({} {}): {}", s.code, s.reason, s.message));
                }
                Err(_) => {}
            }
            if std::time::Instant::now() > deadline {
                return Err("never acknowledged before the deadline".to_string());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A create's or a claim's SmolVM.
    fn body(&self, op: &Operation) -> Value {
        let mut spec = match (&op.pool, op.size) {
            (Some(pool), _) => json!({"poolRef": {"name": pool}}),
            (None, size) => json!({
                "image": "alpine:3.20",
                "resources": size.map(|s| json!({"cpus": s.cpus, "memoryMiB": s.memory_mib})),
                "storage": {"storageGiB": 1, "overlayGiB": 1},
            }),
        };
        if let Some(node) = self.pins.get(&op.vm) {
            spec["nodeName"] = json!(node);
        }
        json!({
            "apiVersion": constants::API_VERSION, "kind": "SmolVM",
            "metadata": {"name": op.vm.name, "namespace": op.vm.namespace},
            "spec": spec,
        })
    }

    /// Waits for the outcome; `None` when seen, else why not ([`SUPERSEDED`] included).
    async fn wait(&self, op: &Operation, deadline: std::time::Instant) -> Option<String> {
        let api = self.api(&op.vm);
        loop {
            if lock(&self.latest).get(&op.vm) != Some(&op.seq) {
                return Some(SUPERSEDED.to_string());
            }
            let last = match api.get_opt(&op.vm.name).await {
                Ok(None) if op.expect == Outcome::Gone => return None,
                Ok(None) => "gone".to_string(),
                Ok(Some(vm)) => {
                    let seen = seen(&vm);
                    let expect = self.expected(op.expect, seen.node_name.as_deref());
                    if reached(expect, &seen) {
                        return None;
                    }
                    format!("{:?} {:?} (expected {})", seen.phase, seen.reason, expect.name())
                }
                Err(e) => format!("reading it: {e}"),
            };
            if std::time::Instant::now() > deadline {
                return Some(format!("not reached within the deadline; last seen {last}"));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The outcome to wait for on `node`: on the real node, where no guest boots, a start fails.
    fn expected(&self, expect: Outcome, node: Option<&str>) -> Outcome {
        match (expect, node == Some(self.real_node.as_str())) {
            (Outcome::Running | Outcome::Suspended, true) => Outcome::StartFailed,
            (expect, _) => expect,
        }
    }
}

/// What a wait ends with when a later operation on its SmolVM came first.
const SUPERSEDED: &str = "superseded";

/// The merge patch of a spec change.
fn change(op: &Operation) -> Value {
    match op.kind {
        OpKind::Resize => {
            let size = op.size.map(|s| json!({"cpus": s.cpus, "memoryMiB": s.memory_mib}));
            json!({"spec": {"resources": size}})
        }
        OpKind::Stop | OpKind::Start => json!({"spec": {"running": op.kind == OpKind::Start}}),
        OpKind::Suspend | OpKind::Resume => json!({"spec": {"suspended": op.kind == OpKind::Suspend}}),
        _ => json!({}),
    }
}

/// A refusal that retrying does not change (validation, a forbidden write); a missing object
/// may come (its create is being retried), a conflict or a throttle passes.
fn refused(code: u16) -> bool {
    (400..500).contains(&code) && !matches!(code, 404 | 409 | 429)
}

/// Whether `seen` is the outcome `expect` names.
fn reached(expect: Outcome, seen: &smolvm_soak::history::VmSeen) -> bool {
    use smolvm_soak::history::Phase;
    match expect {
        Outcome::Running => seen.phase == Some(Phase::Running),
        Outcome::StartFailed => {
            seen.phase == Some(Phase::Failed) && seen.reason.as_deref() == Some(smolvm_soak::check::START_FAILED)
        }
        Outcome::Suspended => seen.phase == Some(Phase::Suspended),
        Outcome::Stopped => seen.phase == Some(Phase::Stopped),
        Outcome::Gone => false,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
