//! Reconcile against the real runtime agent and real `smolvm serve` (over mTLS on loopback), with
//! the API server played by the tower-test double of `support` (the unit tier has no
//! kube-apiserver). Each case asserts the exact API writes: create, run (a start failure here,
//! where guests cannot boot), stop and resize.

use smolvm_testkit::node as common;
mod support;

use std::sync::Arc;

use common::{NODE, Pki, TOKEN, TestAgent};
use http::Method;
use serde_json::{Value, json};
use smolvm_api::{SmolVM, fixtures};
use smolvm_certs::ReloadableResolver;
use smolvm_controller::nodeclient::{ClientSettings, ClientTls, Endpoints, NodeClient, client_tls};
use support::*;

fn node_client(pki: &Pki, agent: &TestAgent) -> NodeClient {
    let cert = Arc::new(ReloadableResolver::from_pem(&pki.client_cert, &pki.client_key).unwrap());
    let endpoints = Endpoints::default();
    let addr = agent.agent.node_api_addr();
    endpoints.set(NODE, &addr.ip().to_string(), addr.port());
    NodeClient::new(
        ClientSettings {
            tls: ClientTls::new(client_tls(pki.ca.cert_pem(), cert).unwrap()),
            token: smolvm_controller::nodeclient::BearerToken::new(TOKEN.to_string()),
            connect_timeout: std::time::Duration::from_secs(5),
            call_timeout: std::time::Duration::from_secs(60),
            start_timeout: std::time::Duration::from_secs(180),
        },
        endpoints,
    )
}

/// A SmolVM bound to the agent's node, with the finalizer, and an image that cannot be pulled here.
fn bound_vm(uid: &str, running: bool, storage_gib: i64) -> SmolVM {
    let mut object = fixtures::bound(fixtures::alpine(), NODE);
    object["metadata"]["uid"] = json!(uid);
    object["spec"]["image"] = json!("localhost:1/none:latest");
    object["spec"]["running"] = json!(running);
    object["spec"]["network"] = json!({"enabled": false});
    object["spec"]["storage"] = json!({"storageGiB": storage_gib, "overlayGiB": 1});
    vm(with_finalizer(object))
}

fn node_for(agent: &TestAgent) -> smolvm_api::SmolVMNode {
    let mut node = ready_node(NODE, &format!("uid-{NODE}"), 5);
    let addr = agent.agent.node_api_addr();
    node.status.as_mut().unwrap().endpoint = Some(smolvm_api::Endpoint {
        address: addr.ip().to_string(),
        port: i32::from(addr.port()),
    });
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_run_stop_resize_against_the_real_runtime() {
    common::init();
    let dir = tempfile::tempdir().unwrap();
    let pki = Arc::new(Pki::new());
    let Some(agent) = TestAgent::with_smolvm("create_run_stop_resize", dir.path(), pki.clone()).await else {
        return;
    };
    let nodes = || vec![node_for(&agent)];
    let uid = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b9a";
    let machine = format!("svm-{uid}");

    // create: the machine does not exist; the controller creates it and, as it should not run,
    // reports it Stopped in the same pass: one event, one status write.
    run_case_with(
        bound_vm(uid, false, 2),
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                assert_eq!(body["status"]["phase"], "Stopped");
                assert_eq!(body["status"]["effective"]["storageGiB"], 2);
            }),
            expect(Method::POST, EVENTS_PATH, |body| assert_eq!(body["reason"], "Created")),
        ],
    )
    .await;
    let listed = agent.agent.vmm().get(&machine).await.unwrap();
    assert!(listed.is_some(), "the machine is in smolvm's own list");

    // stop: with running=false and the machine not running, the VM is Stopped and Ready.
    run_case_with(
        bound_vm(uid, false, 2),
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![expect(Method::PATCH, VM_STATUS_PATH, |body| {
            assert_eq!(body["status"]["phase"], "Stopped");
            let ready = condition_of(body, "Ready");
            assert_eq!(
                (ready["status"].as_str(), ready["reason"].as_str()),
                (Some("True"), Some("Stopped"))
            );
        })],
    )
    .await;

    // resize: storage grows on the node.
    run_case_with(
        bound_vm(uid, false, 3),
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                assert_eq!(body["status"]["effective"]["storageGiB"], 3)
            }),
            expect(Method::POST, EVENTS_PATH, |body| assert_eq!(body["reason"], "Resized")),
        ],
    )
    .await;
    let resized = agent.agent.vmm().get(&machine).await.unwrap().unwrap();
    assert_eq!(resized.storage_gib, Some(3), "the resize reached smolvm");

    // run: the start fails here (guests cannot boot); Ready=False, StartFailed, smolvm's message.
    run_case_with(
        bound_vm(uid, true, 3),
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body: &Value| {
                let ready = condition_of(body, "Ready");
                if ready["status"] == "True" {
                    println!("guests boot on this machine: the machine runs");
                    return;
                }
                assert_eq!(body["status"]["phase"], "Failed");
                assert_eq!(ready["reason"], "StartFailed");
                assert!(
                    !ready["message"].as_str().unwrap_or("").is_empty(),
                    "smolvm's message is carried: {ready}"
                );
                println!("start failed as expected here: {}", ready["message"]);
            }),
            expect(Method::POST, EVENTS_PATH, |body| {
                assert!(body["reason"] == "StartFailed" || body["reason"] == "Started", "{body}")
            }),
        ],
    )
    .await;

    // delete: the node deletes the machine, then the finalizer goes; a second pass finds it missing.
    for (attempt, note) in [(0, "deleted machine"), (1, "already gone")] {
        let mut deleting = bound_vm(uid, true, 3);
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        run_case_with(
            deleting,
            nodes(),
            Some(node_client(&pki, &agent)),
            vec![
                expect(Method::PATCH, VM_PATH, |body| assert_eq!(body[1]["op"], "remove")),
                expect(Method::POST, EVENTS_PATH, move |body| {
                    assert_eq!(body["reason"], "Deleted", "attempt {attempt}");
                    assert!(body["note"].as_str().unwrap_or("").contains(note), "{body}");
                }),
            ],
        )
        .await;
    }
    assert!(
        agent.agent.vmm().get(&machine).await.unwrap().is_none(),
        "the machine is gone from smolvm"
    );
    agent.agent.shutdown().await;
}

/// The status a pass wrote while the machine ran: phase Running, Ready True. It stands in for a
/// guest that boots and whose workload then exits, which cannot happen where guests do not boot;
/// the machine on the node is really not running.
fn ran(vm: &mut SmolVM) {
    let status = vm.status.get_or_insert_with(Default::default);
    status.phase = Some(smolvm_api::Phase::Running);
    status.conditions = vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "Running".into(),
        message: "the machine runs".into(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: None,
    }];
}

/// The calls of a pass that tries a start: the image cannot be pulled here, so StartFailed.
fn a_start_is_made() -> Vec<Expect> {
    vec![
        expect(Method::PATCH, VM_STATUS_PATH, |body| {
            assert_eq!(condition_of(body, "Ready")["reason"], "StartFailed", "a start was made")
        }),
        expect(Method::POST, EVENTS_PATH, |body| {
            assert_eq!(body["reason"], "StartFailed")
        }),
    ]
}

/// `vm` with `last` as the status the previous pass wrote (its binding kept).
fn with_last_status(mut vm: SmolVM, last: &smolvm_api::SmolVMStatus) -> SmolVM {
    let binding = vm.status.take().unwrap_or_default();
    vm.status = Some(smolvm_api::SmolVMStatus {
        node_name: binding.node_name,
        node_uid: binding.node_uid,
        machine_name: binding.machine_name,
        ..last.clone()
    });
    vm
}

/// restartPolicy Never: a machine that ran and stopped on its own is left stopped (Ready=False,
/// Exited, one event), the exit is remembered on the next pass with no call at all, and
/// `spec.running: false` then `true` starts it again. Always: the same exit is started again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exited_workload_follows_the_restart_policy() {
    common::init();
    let dir = tempfile::tempdir().unwrap();
    let pki = Arc::new(Pki::new());
    let Some(agent) = TestAgent::with_smolvm("exited_workload", dir.path(), pki.clone()).await else {
        return;
    };
    let nodes = || vec![node_for(&agent)];
    let uid = "7e6d5c4b-3a29-4180-9f7e-6d5c4b3a2918";
    let machine = format!("svm-{uid}");
    let with_policy = |running: bool, policy: &str| {
        let mut vm = bound_vm(uid, running, 2);
        vm.spec.restart_policy = Some(serde_json::from_value(json!(policy)).unwrap());
        vm
    };

    // The machine exists on the node and is not running.
    run_case_with(
        with_policy(false, "Never"),
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                assert_eq!(body["status"]["phase"], "Stopped")
            }),
            expect(Method::POST, EVENTS_PATH, |body| assert_eq!(body["reason"], "Created")),
        ],
    )
    .await;

    // It ran (last status) and is stopped now, while spec.running is true: it exited on its own.
    let written = Arc::new(std::sync::Mutex::new(Value::Null));
    let keep = written.clone();
    let mut exited = with_policy(true, "Never");
    ran(&mut exited);
    run_case_with(
        exited,
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, move |body| {
                assert_eq!(body["status"]["phase"], "Stopped");
                let ready = condition_of(body, "Ready");
                assert_eq!(
                    (ready["status"].as_str(), ready["reason"].as_str()),
                    (Some("False"), Some("Exited"))
                );
                let message = ready["message"].as_str().unwrap_or("");
                assert!(
                    message.contains("restartPolicy Never") && message.contains("spec.running"),
                    "{message}"
                );
                *keep.lock().unwrap() = body["status"].clone();
            }),
            expect(Method::POST, EVENTS_PATH, |body| {
                assert_eq!(body["reason"], "Exited");
                assert_eq!(body["type"], "Normal");
            }),
        ],
    )
    .await;
    let state = agent.agent.vmm().get(&machine).await.unwrap().unwrap().state;
    assert_ne!(state, smolvm_runtime::vmm::MachineState::Running, "not started");

    // The next pass remembers the exit: no start, no write, no event.
    let status: smolvm_api::SmolVMStatus = serde_json::from_value(written.lock().unwrap().clone()).unwrap();
    let remembered = with_last_status(with_policy(true, "Never"), &status);
    run_case_with(remembered, nodes(), Some(node_client(&pki, &agent)), vec![]).await;

    // The way back: spec.running false reports Stopped; true again starts it (the start fails
    // here: the image cannot be pulled).
    let paused = with_last_status(with_policy(false, "Never"), &status);
    run_case_with(
        paused,
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                let ready = condition_of(body, "Ready");
                assert_eq!(
                    (ready["status"].as_str(), ready["reason"].as_str()),
                    (Some("True"), Some("Stopped"))
                );
            }),
            expect(Method::POST, EVENTS_PATH, |body| assert_eq!(body["reason"], "Stopped")),
        ],
    )
    .await;
    let mut stopped_status = status.clone();
    stopped_status.conditions[0].status = "True".into();
    stopped_status.conditions[0].reason = "Stopped".into();
    let resumed = with_last_status(with_policy(true, "Never"), &stopped_status);
    run_case_with(resumed, nodes(), Some(node_client(&pki, &agent)), a_start_is_made()).await;

    // Always: the same exit is started again at once.
    let mut always = with_policy(true, "Always");
    ran(&mut always);
    run_case_with(always, nodes(), Some(node_client(&pki, &agent)), a_start_is_made()).await;
    agent.agent.shutdown().await;
}

/// `network.exposeService`: the first pass reads the Service and EndpointSlice (absent), applies
/// both (owned by the SmolVM; the endpoint at the node's InternalIP and the host port, not ready
/// while the machine does not run) and reports ServiceExposed; a steady pass only reads; a Service
/// of that name the SmolVM does not own is never written (condition and Warning event); deleting
/// the SmolVM deletes the owned Service and EndpointSlice before the finalizer goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exposed_vm_gets_its_service_and_loses_it_with_its_deletion() {
    use std::sync::Mutex;

    common::init();
    let dir = tempfile::tempdir().unwrap();
    let pki = Arc::new(Pki::new());
    let Some(agent) = TestAgent::with_smolvm("exposed_vm", dir.path(), pki.clone()).await else {
        return;
    };
    let nodes = || {
        let mut node = node_for(&agent);
        node.status.as_mut().unwrap().internal_ip = Some("192.0.2.10".into());
        vec![node]
    };
    let uid = "2b3c4d5e-6f70-4182-93a4-b5c6d7e8f901";
    let host_port = common::free_port();
    let exposed_vm = || {
        let mut vm = bound_vm(uid, false, 2);
        vm.spec.network = Some(
            serde_json::from_value(json!({"enabled": true, "exposeService": true,
                "ports": [{"hostPort": host_port, "guestPort": 80, "protocol": "TCP"}]}))
            .unwrap(),
        );
        vm
    };

    let service = Arc::new(Mutex::new(Value::Null));
    let slice = Arc::new(Mutex::new(Value::Null));
    let status = Arc::new(Mutex::new(Value::Null));
    let (keep_service, keep_slice, keep_status) = (service.clone(), slice.clone(), status.clone());
    run_case_with(
        exposed_vm(),
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![
            expect_answer(Method::GET, SERVICE_PATH, 404, not_found("services", "alpine")),
            expect_answer(Method::GET, SLICE_PATH, 404, not_found("endpointslices", "alpine")),
            expect(Method::PATCH, SERVICE_PATH, move |body| {
                assert_eq!(body["kind"], "Service");
                assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], uid);
                assert_eq!(
                    body["spec"]["ports"],
                    json!([{"name": "tcp-80", "port": 80, "targetPort": host_port, "protocol": "TCP"}])
                );
                *keep_service.lock().unwrap() = body.clone();
            }),
            expect(Method::PATCH, SLICE_PATH, move |body| {
                assert_eq!(body["kind"], "EndpointSlice");
                assert_eq!(body["metadata"]["labels"]["kubernetes.io/service-name"], "alpine");
                assert_eq!(body["endpoints"][0]["addresses"], json!(["192.0.2.10"]));
                assert_eq!(
                    body["endpoints"][0]["conditions"]["ready"], false,
                    "the machine does not run"
                );
                assert_eq!(body["ports"][0]["port"], host_port);
                *keep_slice.lock().unwrap() = body.clone();
            }),
            expect(Method::PATCH, VM_STATUS_PATH, move |body| {
                let exposed = condition_of(body, "ServiceExposed");
                assert_eq!(exposed["status"], "True");
                assert_eq!(exposed["reason"], "ServiceReady");
                assert_eq!(body["status"]["nodeAddress"], "192.0.2.10");
                assert_eq!(body["status"]["ports"], format!("{host_port}->80/TCP"));
                *keep_status.lock().unwrap() = body["status"].clone();
            }),
            expect(Method::POST, EVENTS_PATH, |body| assert_eq!(body["reason"], "Created")),
        ],
    )
    .await;

    // Steady: the stored objects match; two reads, no write.
    let written: smolvm_api::SmolVMStatus = serde_json::from_value(status.lock().unwrap().clone()).unwrap();
    let with_status = |vm: SmolVM| with_last_status(vm, &written);
    let stored_service = service.lock().unwrap().clone();
    let stored_slice = slice.lock().unwrap().clone();
    run_case_with(
        with_status(exposed_vm()),
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![
            expect_answer(Method::GET, SERVICE_PATH, 200, stored_service.clone()),
            expect_answer(Method::GET, SLICE_PATH, 200, stored_slice.clone()),
        ],
    )
    .await;

    // A Service of that name that another owner holds is never written.
    let mut foreign = stored_service.clone();
    foreign["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "alpine", "uid": "d-1", "controller": true}]);
    run_case_with(
        with_status(exposed_vm()),
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![
            expect_answer(Method::GET, SERVICE_PATH, 200, foreign),
            expect_answer(Method::GET, SLICE_PATH, 200, stored_slice.clone()),
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                let exposed = condition_of(body, "ServiceExposed");
                assert_eq!(
                    (exposed["status"].as_str(), exposed["reason"].as_str()),
                    (Some("False"), Some("ServiceNotOwned"))
                );
                assert!(
                    exposed["message"].as_str().unwrap_or("").contains("Deployment alpine"),
                    "{exposed}"
                );
            }),
            expect(Method::POST, EVENTS_PATH, |body| {
                assert_eq!(body["reason"], "ServiceNotOwned");
                assert_eq!(body["type"], "Warning");
            }),
        ],
    )
    .await;

    // Deletion: the machine, then the owned EndpointSlice and Service (read, as no cache holds
    // them here), then the finalizer.
    let mut deleting = with_status(exposed_vm());
    deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    run_case_with(
        deleting,
        nodes(),
        Some(node_client(&pki, &agent)),
        vec![
            expect_answer(Method::GET, SERVICE_PATH, 200, stored_service),
            expect_answer(Method::GET, SLICE_PATH, 200, stored_slice),
            expect_answer(
                Method::DELETE,
                SLICE_PATH,
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            ),
            expect_answer(
                Method::DELETE,
                SERVICE_PATH,
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            ),
            expect(Method::PATCH, VM_PATH, |body| assert_eq!(body[1]["op"], "remove")),
            expect(Method::POST, EVENTS_PATH, |body| assert_eq!(body["reason"], "Deleted")),
        ],
    )
    .await;
    agent.agent.shutdown().await;
}
