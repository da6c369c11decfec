//! Reconcile tests against a tower-test mock of the API server (a test double: the unit tier has
//! no kube-apiserver; the e2e tier repeats these on a real one). Each case asserts the exact API
//! calls the reconcile makes, in order.

use smolvm_testkit::node as common;
mod support;

use std::time::Duration;

use http::Method;
use serde_json::json;
use smolvm_api::{
    constants::{FINALIZER, FORCE_DELETE_ANNOTATION},
    fixtures,
};
use support::*;

#[tokio::test]
async fn add_finalizer() {
    run_case(
        vm(fixtures::alpine()),
        vec![],
        vec![expect(Method::PATCH, VM_PATH, |body| {
            // The test that the list is still absent keeps a finalizer another client added
            // meanwhile from being overwritten (the patch fails and the reconcile retries).
            assert_eq!(
                body,
                &json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": null},
                    {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
                ])
            );
        })],
    )
    .await;
}

#[tokio::test]
async fn add_finalizer_appends_to_other_finalizers() {
    let mut object = fixtures::alpine();
    object["metadata"]["finalizers"] = json!(["example.com/other"]);
    run_case(
        vm(object),
        vec![],
        vec![expect(Method::PATCH, VM_PATH, |body| {
            assert_eq!(
                body,
                &json!([{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}])
            );
        })],
    )
    .await;
}

#[test]
fn runtime_failures_are_named_after_the_call() {
    use smolvm_api::{Phase, nodeapi::ErrorCode};
    use smolvm_controller::vm::decide::{Call, call_failure};
    let spec = smolvm_controller::vm::rules::machine_spec(&vm(fixtures::alpine())).unwrap();
    let create = || Call::Create(Box::new(spec.clone()));
    let cases = [
        (
            "get",
            Call::Get,
            Some(&ErrorCode::RuntimeError),
            (Some(Phase::Unknown), "RuntimeError"),
        ),
        (
            "create",
            create(),
            Some(&ErrorCode::RuntimeError),
            (Some(Phase::Failed), "CreateFailed"),
        ),
        // A taken host port is its own reason, on create and on start.
        (
            "create_port_taken",
            create(),
            Some(&ErrorCode::HostPortInUse),
            (Some(Phase::Failed), "HostPortInUse"),
        ),
        (
            "start_port_taken",
            Call::EnsureRunning,
            Some(&ErrorCode::HostPortInUse),
            (Some(Phase::Failed), "HostPortInUse"),
        ),
        (
            "start",
            Call::EnsureRunning,
            Some(&ErrorCode::RuntimeError),
            (Some(Phase::Failed), "StartFailed"),
        ),
        (
            "start_failed",
            Call::EnsureRunning,
            Some(&ErrorCode::StartFailed),
            (Some(Phase::Failed), "StartFailed"),
        ),
        ("stop", Call::Stop, Some(&ErrorCode::RuntimeError), (None, "StopFailed")),
        ("stop_no_code", Call::Stop, None, (None, "StopFailed")),
        (
            "resize",
            Call::Resize(Default::default()),
            Some(&ErrorCode::InvalidRequest),
            (None, "ResizeFailed"),
        ),
        // The agent's refusals whatever admission did, each its own reason.
        (
            "create_port_excluded",
            create(),
            Some(&ErrorCode::HostPortExcluded),
            (Some(Phase::Failed), "HostPortExcluded"),
        ),
        (
            "start_private_image_without_credentials",
            Call::EnsureRunning,
            Some(&ErrorCode::ImagePullCredentialsRequired),
            (Some(Phase::Failed), "ImagePullCredentialsRequired"),
        ),
        // smolvm's start failure is a start failure whatever call met it.
        (
            "create_then_start_failed",
            create(),
            Some(&ErrorCode::StartFailed),
            (Some(Phase::Failed), "StartFailed"),
        ),
    ];
    for (name, call, code, expected) in cases {
        assert_eq!(call_failure(&call, code), expected, "{name}");
    }
}

#[test]
fn force_delete_gives_up_only_when_the_agent_itself_is_unreachable() {
    use smolvm_api::nodeapi::ErrorCode;
    use smolvm_controller::{
        nodeclient::CallError,
        vm::decide::{DeleteFailure, delete_failure},
    };
    let unreachable = CallError::Unreachable {
        node: "node-a".into(),
        message: "connection refused".into(),
    };
    let answered = |status: u16, code: ErrorCode| CallError::Api {
        node: "node-a".into(),
        status,
        code,
        message: "smolvm serve is not answering".into(),
        details: None,
    };
    let protocol = CallError::Protocol {
        node: "node-a".into(),
        message: "500 without an error body".into(),
    };
    let cases = [
        ("unreachable_forced", true, unreachable.clone(), DeleteFailure::GiveUp),
        ("unreachable_waits", false, unreachable, DeleteFailure::AgentUnreachable),
        (
            "runtime_unavailable_is_never_forced",
            true,
            answered(503, ErrorCode::RuntimeUnavailable),
            DeleteFailure::RuntimeUnavailable,
        ),
        (
            "runtime_timeout_is_never_forced",
            true,
            answered(504, ErrorCode::RuntimeTimeout),
            DeleteFailure::RuntimeUnavailable,
        ),
        (
            "node_error_is_retried",
            true,
            answered(500, ErrorCode::RuntimeError),
            DeleteFailure::Failed,
        ),
        ("unreadable_answer_is_retried", true, protocol, DeleteFailure::Failed),
    ];
    for (name, force, error, expected) in cases {
        assert_eq!(delete_failure(force, &error), expected, "{name}");
    }
}

/// What the API server answers to the binding: the object as bound, at a newer resourceVersion.
fn bound_answer(object: &serde_json::Value) -> serde_json::Value {
    let mut bound = fixtures::bound(object.clone(), "node-a");
    bound["status"]["nodeUID"] = json!("uid-a");
    bound["status"]["phase"] = json!("Scheduled");
    bound["metadata"]["resourceVersion"] = json!("8");
    bound
}

/// The calls of a pass that binds to node-a and then goes on to that node, which does not answer
/// (its endpoint is a closed port): the binding with its precondition, its event, then the status
/// that says the node cannot be reached, and that event. Both status writes are server-side
/// applies (PATCH) of the whole status; the binding's carries the version read.
fn bind_then_unreachable(object: &serde_json::Value) -> Vec<Expect> {
    let mut put = expect_answer(Method::PATCH, VM_STATUS_PATH, 200, bound_answer(object));
    put.check = Box::new(|body| {
        assert_eq!(body["kind"], "SmolVM", "an apply names its object: {body}");
        assert_eq!(body["metadata"]["resourceVersion"], "7", "optimistic concurrency");
        assert_eq!(body["status"]["nodeName"], "node-a");
        assert_eq!(body["status"]["nodeUID"], "uid-a");
        assert_eq!(body["status"]["phase"], "Scheduled");
        assert_eq!(condition_of(body, "Scheduled")["status"], "True");
    });
    vec![
        put,
        expect(Method::POST, EVENTS_PATH, |body| {
            assert_eq!(body["reason"], "Scheduled")
        }),
        expect(Method::PATCH, VM_STATUS_PATH, |body| {
            assert_eq!(body["status"]["nodeName"], "node-a", "the binding stays: {body}");
            assert_eq!(condition_of(body, "Ready")["reason"], "NodeUnreachable", "{body}");
        }),
        expect(Method::POST, EVENTS_PATH, |body| {
            assert_eq!(body["reason"], "NodeUnreachable", "{body}")
        }),
    ]
}

#[tokio::test]
async fn bind_writes_the_binding_once_with_a_precondition_then_goes_on_to_the_node() {
    let object = with_finalizer(fixtures::alpine());
    run_case(
        vm(object.clone()),
        vec![ready_node("node-a", "uid-a", 5)],
        bind_then_unreachable(&serde_json::to_value(vm(object)).unwrap()),
    )
    .await;
}

#[tokio::test]
async fn a_stale_cache_right_after_a_bind_does_not_bind_again() {
    let (client, handle) = smolvm_testkit::apiserver::client("default");
    let ctx = context(client, vec![ready_node("node-a", "uid-a", 5)], None);
    let object = vm(with_finalizer(fixtures::alpine()));
    let value = serde_json::to_value(&object).unwrap();
    let calls = bind_then_unreachable(&value);
    let expected = calls.len();
    let server = tokio::spawn(serve(handle, calls, value, VM_PATH));
    let first = smolvm_controller::vm::reconcile(std::sync::Arc::new(object.clone()), ctx.clone()).await;
    assert!(first.is_ok(), "{first:?}");
    // The cache still shows the object from before the pass's own writes: no second bind (it
    // would meet a 409 and drop the reservation the real binding holds) and no node call; the
    // watch brings the newer version.
    let again = smolvm_controller::vm::reconcile(std::sync::Arc::new(object), ctx).await;
    assert_eq!(again.unwrap(), kube::runtime::controller::Action::await_change());
    assert_eq!(server.await.unwrap(), expected, "one bind, one status, their events");
}

#[tokio::test]
async fn unplaceable_vm_stays_pending_with_the_reason() {
    run_case(
        vm(with_finalizer(fixtures::alpine())),
        vec![ready_node("node-a", "uid-a", 600)],
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                assert_eq!(body["status"]["phase"], "Pending");
                let c = condition_of(body, "Scheduled");
                assert_eq!(c["reason"], "Unschedulable");
                assert_eq!(c["message"], "0/1 nodes can run this VM: 1 has a stale heartbeat");
            }),
            expect(Method::POST, EVENTS_PATH, |body| {
                assert_eq!(body["reason"], "FailedScheduling")
            }),
        ],
    )
    .await;
}

#[tokio::test]
async fn unbound_delete_removes_the_finalizer_at_once() {
    run_case(
        vm(fixtures::deleting(fixtures::alpine())),
        vec![],
        vec![expect(Method::PATCH, VM_PATH, |body| {
            assert_eq!(body[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
            assert_eq!(body[0]["op"], "test");
        })],
    )
    .await;
}

#[tokio::test]
async fn blocked_delete_names_the_node_and_the_annotation() {
    run_case(
        vm(fixtures::deleting(fixtures::bound(fixtures::alpine(), "node-a"))),
        vec![ready_node("node-a", "uid-node-a", 5)],
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                assert_eq!(body["status"]["phase"], "Deleting");
                let c = condition_of(body, "DeletionBlocked");
                assert_eq!(c["status"], "True");
                assert_eq!(c["reason"], "RuntimeUnreachable");
                let message = c["message"].as_str().unwrap();
                assert!(
                    message.contains("node-a") && message.contains(FORCE_DELETE_ANNOTATION),
                    "{message}"
                );
            }),
            expect(Method::POST, EVENTS_PATH, |body| {
                assert_eq!(body["reason"], "DeletionBlocked")
            }),
        ],
    )
    .await;
}

#[tokio::test]
async fn force_delete_removes_the_finalizer_and_warns_of_orphans() {
    let mut object = fixtures::deleting(fixtures::bound(fixtures::alpine(), "node-a"));
    object["metadata"]["annotations"] = json!({ FORCE_DELETE_ANNOTATION: "true" });
    run_case(
        vm(object),
        vec![ready_node("node-a", "uid-node-a", 5)],
        vec![
            expect(Method::PATCH, VM_PATH, |body| assert_eq!(body[1]["op"], "remove")),
            expect(Method::POST, EVENTS_PATH, |body| {
                assert_eq!(body["type"], "Warning");
                assert_eq!(body["reason"], "ForceDeleted");
                assert!(body["note"].as_str().unwrap().contains("orphaned"));
            }),
        ],
    )
    .await;
}

#[tokio::test]
async fn node_unreachable_keeps_the_binding() {
    run_case(
        vm(with_finalizer(fixtures::bound(fixtures::alpine(), "node-a"))),
        vec![ready_node("node-a", "uid-node-a", 600)],
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                assert_eq!(body["status"]["phase"], "Unknown");
                assert_eq!(body["status"]["nodeName"], "node-a", "the binding stays");
                let c = condition_of(body, "Ready");
                assert_eq!(
                    (c["status"].as_str(), c["reason"].as_str()),
                    (Some("Unknown"), Some("NodeUnreachable"))
                );
            }),
            expect(Method::POST, EVENTS_PATH, |body| {
                assert_eq!(body["reason"], "NodeUnreachable")
            }),
        ],
    )
    .await;
}

#[tokio::test]
async fn node_replaced_is_reported_not_adopted() {
    run_case(
        vm(with_finalizer(fixtures::bound(fixtures::alpine(), "node-a"))),
        vec![ready_node("node-a", "uid-new", 5)],
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                assert_eq!(body["status"]["nodeUID"], "uid-node-a", "the binding stays");
                let c = condition_of(body, "Ready");
                assert_eq!(
                    (c["status"].as_str(), c["reason"].as_str()),
                    (Some("False"), Some("NodeReplaced"))
                );
            }),
            expect(Method::POST, EVENTS_PATH, |body| {
                assert_eq!(body["reason"], "NodeReplaced")
            }),
        ],
    )
    .await;
}

#[tokio::test]
async fn runtime_unreachable_while_node_looks_healthy() {
    // Fresh heartbeat, but the node API port is closed: NodeUnreachable from the call itself.
    run_case(
        vm(with_finalizer(fixtures::bound(fixtures::alpine(), "node-a"))),
        vec![ready_node("node-a", "uid-node-a", 5)],
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                let c = condition_of(body, "Ready");
                assert_eq!(c["reason"], "NodeUnreachable");
                assert!(c["message"].as_str().unwrap().contains("node-a"));
            }),
            expect(Method::POST, EVENTS_PATH, |body| {
                assert_eq!(body["reason"], "NodeUnreachable")
            }),
        ],
    )
    .await;
}

/// A resize up that the bound node has no room for is not sent to the node: ResizePending=True
/// with InsufficientCapacity naming the resource, the amounts, and a Warning event; once the room
/// is there, the resize goes through. Against the real runtime and `smolvm serve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_up_without_room_is_reported_not_sent() {
    use std::sync::Arc;

    use common::{NODE, Pki, TOKEN, TestAgent};
    use smolvm_certs::ReloadableResolver;
    use smolvm_controller::nodeclient::{BearerToken, ClientSettings, ClientTls, Endpoints, NodeClient, client_tls};

    common::init();
    let dir = tempfile::tempdir().unwrap();
    let pki = Arc::new(Pki::new());
    let Some(agent) = TestAgent::with_smolvm("resize_without_room", dir.path(), pki.clone()).await else {
        return;
    };
    let addr = agent.agent.node_api_addr();
    let node_client = || {
        let cert = Arc::new(ReloadableResolver::from_pem(&pki.client_cert, &pki.client_key).unwrap());
        let endpoints = Endpoints::default();
        endpoints.set(NODE, &addr.ip().to_string(), addr.port());
        NodeClient::new(
            ClientSettings {
                tls: ClientTls::new(client_tls(pki.ca.cert_pem(), cert).unwrap()),
                token: BearerToken::new(TOKEN.to_string()),
                connect_timeout: Duration::from_secs(5),
                call_timeout: Duration::from_secs(60),
                start_timeout: Duration::from_secs(180),
            },
            endpoints,
        )
    };
    // The node has 8 GiB of disk for VMs: 2 + 1 fit, 10 + 1 do not.
    let node = || {
        let mut node = ready_node(NODE, &format!("uid-{NODE}"), 5);
        let status = node.status.as_mut().unwrap();
        status.endpoint = Some(smolvm_api::Endpoint {
            address: addr.ip().to_string(),
            port: i32::from(addr.port()),
        });
        status.allocatable.as_mut().unwrap().storage_gib = 8;
        node
    };
    let uid = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d";
    let object = |storage_gib: i64| {
        let mut object = fixtures::bound(fixtures::alpine(), NODE);
        object["metadata"]["uid"] = json!(uid);
        object["spec"]["image"] = json!("localhost:1/none:latest");
        object["spec"]["running"] = json!(false);
        object["spec"]["network"] = json!({"enabled": false});
        object["spec"]["storage"] = json!({"storageGiB": storage_gib, "overlayGiB": 1});
        vm(with_finalizer(object))
    };
    run_case_with(
        object(2),
        vec![node()],
        Some(node_client()),
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                assert_eq!(body["status"]["effective"]["storageGiB"], 2)
            }),
            expect(Method::POST, EVENTS_PATH, |body| assert_eq!(body["reason"], "Created")),
        ],
    )
    .await;
    run_case_with(
        object(10),
        vec![node()],
        Some(node_client()),
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                assert_eq!(body["status"]["effective"]["storageGiB"], 2, "not resized");
                let c = condition_of(body, "ResizePending");
                assert_eq!(
                    (c["status"].as_str(), c["reason"].as_str()),
                    (Some("True"), Some("InsufficientCapacity"))
                );
                let message = c["message"].as_str().unwrap();
                assert!(
                    message.contains("11 storageGiB requested") && message.contains("8 free"),
                    "{message}"
                );
            }),
            expect(Method::POST, EVENTS_PATH, |body| {
                assert_eq!(body["type"], "Warning");
                assert_eq!(body["reason"], "InsufficientCapacity");
            }),
        ],
    )
    .await;
    let machine = agent.agent.vmm().get(&format!("svm-{uid}")).await.unwrap().unwrap();
    assert_eq!(machine.storage_gib, Some(2), "the node was not asked");
    // Room enough for 5 + 1: the resize goes through.
    run_case_with(
        object(5),
        vec![node()],
        Some(node_client()),
        vec![
            expect(Method::PATCH, VM_STATUS_PATH, |body| {
                assert_eq!(body["status"]["effective"]["storageGiB"], 5);
            }),
            expect(Method::POST, EVENTS_PATH, |body| assert_eq!(body["reason"], "Resized")),
        ],
    )
    .await;
    agent.agent.shutdown().await;
}

mod csr {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        ByteString,
        api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
    };
    use kube::Api;
    use smolvm_api::{
        constants::{EXTRA_NODE_NAME, EXTRA_NODE_UID, RUNTIME_SIGNER},
        policy::Policy,
    };
    use smolvm_controller::pki::signer::{Judgement, handle_csr};

    use super::*;

    const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests/runtime-node-a";

    fn csr(node_claim: &str) -> CertificateSigningRequest {
        let key = smolvm_certs::generate_key_pair().unwrap();
        let sans = smolvm_certs::runtime_serving_sans("node-a");
        let pem = smolvm_certs::build_csr(&key, &sans[0], &sans).unwrap();
        CertificateSigningRequest {
            metadata: kube::api::ObjectMeta {
                name: Some("runtime-node-a".into()),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                signer_name: RUNTIME_SIGNER.into(),
                request: ByteString(pem.into_bytes()),
                username: Some("system:serviceaccount:smolvm-system:smolvm-runtime".into()),
                // A pod-bound token carries both node claims (SPEC section 8).
                extra: Some(BTreeMap::from([
                    (EXTRA_NODE_NAME.to_string(), vec![node_claim.to_string()]),
                    (EXTRA_NODE_UID.to_string(), vec![TOKEN_NODE_UID.to_string()]),
                ])),
                usages: Some(vec![
                    "digital signature".into(),
                    "key encipherment".into(),
                    "server auth".into(),
                ]),
                ..Default::default()
            },
            status: None,
        }
    }

    const TOKEN_NODE_UID: &str = "6f1c2a9e-3b4d-4e5f-8a7b-9c0d1e2f3a4b";

    /// A test double of the API server's Node endpoint: one GET of the node the token names,
    /// answered with a Node of `uid`, or 404 when `None`.
    fn nodes(node: &'static str, uid: Option<&'static str>) -> Api<k8s_openapi::api::core::v1::Node> {
        let (client, mut handle) = smolvm_testkit::apiserver::client("default");
        tokio::spawn(async move {
            let Some(call) = smolvm_testkit::apiserver::next_call_within(&mut handle, Duration::from_secs(5)).await
            else {
                return;
            };
            assert_eq!(call.method, Method::GET);
            assert_eq!(call.path, format!("/api/v1/nodes/{node}"));
            let (status, body) = match uid {
                Some(uid) => (
                    200,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": uid}}),
                ),
                None => (404, smolvm_testkit::apiserver::not_found("nodes", node)),
            };
            call.answer(status, &body);
        });
        Api::all(client)
    }

    async fn run(object: CertificateSigningRequest, calls: Vec<Expect>) -> Judgement {
        let node = match object.spec.extra.as_ref().and_then(|e| e.get(EXTRA_NODE_NAME)) {
            Some(names) if names[0] == "node-b" => "node-b",
            _ => "node-a",
        };
        run_with_node(object, nodes(node, Some(TOKEN_NODE_UID)), calls).await
    }

    async fn run_with_node(
        object: CertificateSigningRequest,
        nodes: Api<k8s_openapi::api::core::v1::Node>,
        calls: Vec<Expect>,
    ) -> Judgement {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (client, handle) = smolvm_testkit::apiserver::client("default");
        let api: Api<CertificateSigningRequest> = Api::all(client);
        let expected = calls.len();
        let server = tokio::spawn(serve(handle, calls, serde_json::to_value(&object).unwrap(), CSR_PATH));
        let ca = smolvm_certs::CertificateAuthority::generate("ca", Duration::from_secs(3600)).unwrap();
        let judgement = handle_csr(&api, &nodes, &object, &ca, &Policy::default())
            .await
            .unwrap();
        assert_eq!(server.await.unwrap(), expected);
        judgement
    }

    fn denied_as_uid_mismatch() -> Vec<Expect> {
        vec![expect(
            Method::PATCH,
            "/apis/certificates.k8s.io/v1/certificatesigningrequests/runtime-node-a/approval",
            |body| {
                assert_eq!(body["status"]["conditions"][0]["type"], "Denied");
                assert_eq!(body["status"]["conditions"][0]["reason"], "NodeUIDMismatch");
            },
        )]
    }

    #[tokio::test]
    async fn csr_denied_when_the_node_has_another_uid_than_the_token() {
        let other = nodes("node-a", Some("0b7c5d2e-91aa-4c1e-8f00-5e4f3a2b1c0d"));
        let judgement = run_with_node(csr("node-a"), other, denied_as_uid_mismatch()).await;
        assert!(matches!(
            judgement,
            Judgement::Deny {
                reason: "NodeUIDMismatch",
                ..
            }
        ));
    }

    #[tokio::test]
    async fn csr_denied_when_the_tokens_node_is_gone() {
        let judgement = run_with_node(csr("node-a"), nodes("node-a", None), denied_as_uid_mismatch()).await;
        assert!(matches!(
            judgement,
            Judgement::Deny {
                reason: "NodeUIDMismatch",
                ..
            }
        ));
    }

    #[tokio::test]
    async fn csr_approved_and_signed_for_the_requesters_own_node() {
        let judgement = run(
            csr("node-a"),
            vec![
                expect(
                    Method::PATCH,
                    "/apis/certificates.k8s.io/v1/certificatesigningrequests/runtime-node-a/approval",
                    |body| {
                        assert_eq!(body["status"]["conditions"][0]["type"], "Approved");
                    },
                ),
                expect(
                    Method::PATCH,
                    "/apis/certificates.k8s.io/v1/certificatesigningrequests/runtime-node-a/status",
                    |body| {
                        let cert = body["status"]["certificate"].as_str().unwrap();
                        assert!(!cert.is_empty());
                    },
                ),
            ],
        )
        .await;
        assert_eq!(judgement, Judgement::Approve { node: "node-a".into() });
    }

    #[tokio::test]
    async fn csr_denied_when_the_token_names_another_node() {
        let judgement = run(
            csr("node-b"),
            vec![expect(
                Method::PATCH,
                "/apis/certificates.k8s.io/v1/certificatesigningrequests/runtime-node-a/approval",
                |body| {
                    assert_eq!(body["status"]["conditions"][0]["type"], "Denied");
                    assert_eq!(body["status"]["conditions"][0]["reason"], "NamesNotAllowed");
                },
            )],
        )
        .await;
        assert!(matches!(
            judgement,
            Judgement::Deny {
                reason: "NamesNotAllowed",
                ..
            }
        ));
    }
}
