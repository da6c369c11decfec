//! A restart request is acted on once, even when dropping its annotation fails: the controller
//! records the request in `status.restartHandled` before it stops the machine, so the pass after
//! a failed annotation removal (a webhook outage, a 429) only retries the removal.
//!
//! The machine runs under `CountingRuntime`, a TEST DOUBLE of the runtime (no guest boots on
//! these machines, and a restart needs a running machine), behind the agent's real node API
//! router over real mTLS; the API server is the scripted double of `smolvm_testkit::apiserver`.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use http::Method;
use serde_json::{Value, json};
use smolvm_api::constants::RESTART_ANNOTATION;
use smolvm_api::{SmolVM, fixtures};
use smolvm_controller::nodeclient::NodeClient;
use smolvm_controller::vm::reconcile;
use smolvm_runtime::nodeapi::tls::MtlsServer;
use smolvm_runtime::vmm::{
    DeleteOutcome, Machine, MachineSpec, MachineState, RegistryAuth, ResizeRequest, Vmm, VmmError, VmmHealth,
};
use smolvm_testkit::node::{NODE, Pki, TOKEN};
use support::*;

/// TEST DOUBLE of the runtime: one machine, created as asked, that runs when started and stops
/// when stopped; it counts starts and stops.
#[derive(Default)]
struct CountingRuntime {
    machine: Mutex<Option<Machine>>,
    starts: AtomicUsize,
    stops: AtomicUsize,
}

impl CountingRuntime {
    fn set_state(&self, state: MachineState) -> Result<Machine, VmmError> {
        let mut slot = self.machine.lock().map_err(|_| VmmError::BadRequest {
            message: "poisoned".into(),
        })?;
        let machine = slot.as_mut().ok_or(VmmError::NotFound {
            message: "no machine".into(),
        })?;
        machine.state = state;
        Ok(machine.clone())
    }
}

#[async_trait]
impl Vmm for CountingRuntime {
    async fn health(&self) -> Result<VmmHealth, VmmError> {
        Ok(VmmHealth {
            status: "ok".into(),
            version: "test double".into(),
            nested_virt: false,
            machines_total: None,
            machines_running: None,
            uptime_seconds: None,
        })
    }
    async fn list(&self) -> Result<Vec<Machine>, VmmError> {
        Ok(self
            .machine
            .lock()
            .map(|m| m.iter().cloned().collect())
            .unwrap_or_default())
    }
    async fn get(&self, name: &str) -> Result<Option<Machine>, VmmError> {
        Ok(self
            .machine
            .lock()
            .ok()
            .and_then(|m| m.clone())
            .filter(|m| m.name == name))
    }
    async fn create(&self, spec: &MachineSpec) -> Result<Machine, VmmError> {
        let machine = Machine::created_from(spec);
        if let Ok(mut slot) = self.machine.lock() {
            *slot = Some(machine.clone());
        }
        Ok(machine)
    }
    async fn start(&self, _: &str, _: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        self.set_state(MachineState::Running)
    }
    async fn stop(&self, _: &str) -> Result<Machine, VmmError> {
        self.stops.fetch_add(1, Ordering::SeqCst);
        self.set_state(MachineState::Stopped)
    }
    async fn delete(&self, _: &str) -> Result<DeleteOutcome, VmmError> {
        Ok(DeleteOutcome::Missing)
    }
    async fn resize(&self, _: &str, _: &ResizeRequest) -> Result<Machine, VmmError> {
        Err(VmmError::BadRequest {
            message: "no resize in this test".into(),
        })
    }
}

const UID: &str = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a";
const REQUESTED: &str = "2026-11-25T15:00:00Z";

fn running_vm(annotation: Option<&str>, handled: Option<&str>) -> SmolVM {
    let mut object = fixtures::bound(fixtures::alpine(), NODE);
    object["metadata"]["uid"] = json!(UID);
    object["spec"]["running"] = json!(true);
    object["spec"]["network"] = json!({"enabled": false});
    if let Some(value) = annotation {
        object["metadata"]["annotations"] = json!({ RESTART_ANNOTATION: value });
    }
    let mut vm = vm(with_finalizer(object));
    let status = vm.status.get_or_insert_with(Default::default);
    status.restart_handled = handled.map(str::to_string);
    vm
}

/// Runs one reconcile; the API server answers every call 200 with the object, except the
/// annotation's removal (a JSON patch of the object), answered `removal`. Returns the calls made.
async fn pass(
    vm: SmolVM,
    node: smolvm_api::SmolVMNode,
    client: NodeClient,
    removal: u16,
) -> (bool, Vec<(Method, String, Value)>) {
    let (kube, handle) = smolvm_testkit::apiserver::client("default");
    let ctx = context(kube, vec![node], Some(client));
    let object = serde_json::to_value(&vm).expect("object");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    smolvm_testkit::apiserver::serve_with(handle, move |method: Method, path: String, body: Vec<u8>| {
        let object = object.clone();
        let seen = seen.clone();
        async move {
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let is_removal = method == Method::PATCH && path == VM_PATH && body.is_array();
            if let Ok(mut calls) = seen.lock() {
                calls.push((method.clone(), path.clone(), body));
            }
            if is_removal && removal != 200 {
                return (
                    removal,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "the admission webhook is down", "reason": "InternalError", "code": removal}),
                );
            }
            if path.starts_with(VM_PATH) {
                (200, object)
            } else {
                (
                    200,
                    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"}}),
                )
            }
        }
    });
    let ok = reconcile(Arc::new(vm), ctx).await.is_ok();
    let calls = calls.lock().map(|c| c.clone()).unwrap_or_default();
    (ok, calls)
}

fn node_at(server: &MtlsServer) -> smolvm_api::SmolVMNode {
    let mut node = ready_node(NODE, &format!("uid-{NODE}"), 5);
    node.status.as_mut().expect("status").endpoint = Some(smolvm_api::Endpoint {
        address: "127.0.0.1".into(),
        port: i32::from(server.local_addr().port()),
    });
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_annotation_removal_restarts_the_machine_once() {
    smolvm_testkit::node::init();
    let pki = Pki::new();
    let runtime = Arc::new(CountingRuntime::default());
    let (server, client) = agent_and_client(&pki, runtime.clone(), TOKEN);

    // The machine is created and started by an ordinary pass.
    let (ok, _) = pass(running_vm(None, None), node_at(&server), client.clone(), 200).await;
    assert!(ok, "the first pass creates and starts the machine");
    assert_eq!(runtime.starts.load(Ordering::SeqCst), 1);
    let before = (
        runtime.starts.load(Ordering::SeqCst),
        runtime.stops.load(Ordering::SeqCst),
    );

    // A restart is asked for; the pass records it, stops and starts the machine, and writes the
    // status. The annotation is the next pass's to drop: a pass writes the SmolVM at most twice.
    let (ok, calls) = pass(running_vm(Some(REQUESTED), None), node_at(&server), client.clone(), 500).await;
    assert!(ok, "the restart pass: {calls:?}");
    let recorded = calls
        .iter()
        .position(|(m, p, b)| *m == Method::PATCH && p == VM_STATUS_PATH && b["status"]["restartHandled"] == REQUESTED);
    let removal = calls
        .iter()
        .position(|(m, p, b)| *m == Method::PATCH && p == VM_PATH && b.is_array());
    assert_eq!(
        recorded,
        Some(0),
        "the request is recorded in status before anything else: {calls:?}"
    );
    assert_eq!(removal, None, "the annotation is left for the next pass: {calls:?}");
    let vm_writes = calls
        .iter()
        .filter(|(m, p, _)| *m == Method::PATCH && p.starts_with(VM_PATH))
        .count();
    assert_eq!(vm_writes, 2, "the record and the status: {calls:?}");
    assert_eq!(
        (
            runtime.starts.load(Ordering::SeqCst) - before.0,
            runtime.stops.load(Ordering::SeqCst) - before.1
        ),
        (1, 1),
        "one stop and one start"
    );

    // The next pass sees the request handled and drops the annotation; that fails (the API
    // server answers 500), which fails the pass, with no stop or start.
    let (ok, calls) = pass(
        running_vm(Some(REQUESTED), Some(REQUESTED)),
        node_at(&server),
        client.clone(),
        500,
    )
    .await;
    assert!(!ok, "the failed removal fails the pass (it is retried)");
    assert!(
        calls
            .iter()
            .any(|(m, p, b)| *m == Method::PATCH && p == VM_PATH && b.is_array()),
        "the removal was tried: {calls:?}"
    );
    assert_eq!(
        (
            runtime.starts.load(Ordering::SeqCst) - before.0,
            runtime.stops.load(Ordering::SeqCst) - before.1
        ),
        (1, 1),
        "still one stop and one start"
    );

    // The next pass sees the request handled: it only retries the removal, with no stop or start.
    let (ok, calls) = pass(
        running_vm(Some(REQUESTED), Some(REQUESTED)),
        node_at(&server),
        client.clone(),
        200,
    )
    .await;
    assert!(ok, "the retried removal succeeds");
    assert!(
        calls
            .iter()
            .any(|(m, p, b)| *m == Method::PATCH && p == VM_PATH && b.is_array()),
        "the annotation is dropped: {calls:?}"
    );
    assert_eq!(
        (
            runtime.starts.load(Ordering::SeqCst) - before.0,
            runtime.stops.load(Ordering::SeqCst) - before.1
        ),
        (1, 1),
        "still exactly one stop and one start"
    );

    // A newer request (another value) is a new restart.
    let (_, _) = pass(
        running_vm(Some("2026-11-25T16:00:00Z"), Some(REQUESTED)),
        node_at(&server),
        client,
        200,
    )
    .await;
    assert_eq!(
        (
            runtime.starts.load(Ordering::SeqCst) - before.0,
            runtime.stops.load(Ordering::SeqCst) - before.1
        ),
        (2, 2),
        "a new request restarts again"
    );
    server.shutdown(std::time::Duration::from_secs(1)).await;
}
