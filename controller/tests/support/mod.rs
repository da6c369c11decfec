//! Shared helpers of the reconcile tests: a tower-test double of the API server that serves an
//! expected sequence of calls, and fixtures.
#![allow(dead_code)]

use std::{sync::Arc, time::Duration};

use http::{Method, Request, Response};
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Client,
    client::Body,
    runtime::{
        events::Reporter,
        reflector::{self, store::Writer},
        watcher,
    },
};
use serde_json::{Value, json};
use smolvm_api::{
    SmolVM, SmolVMNode,
    constants::{FINALIZER, condition},
    fixtures,
};
use smolvm_controller::{
    nodeclient::{ClientSettings, Endpoints, NodeClient},
    placement::{self, Ledger},
    reconcile::{Context, Timing, reconcile},
};
use tower_test::mock;

pub type Handle = mock::Handle<Request<Body>, Response<Body>>;

/// One expected call: method, path (without query), and a check of the JSON body.
pub struct Expect {
    pub method: Method,
    pub path: &'static str,
    pub check: Box<dyn Fn(&Value) + Send>,
    /// The answer's status and body; `None`: 200 with the object (SmolVM writes) or the request
    /// body echoed.
    pub answer: Option<(u16, Value)>,
}

pub fn expect(method: Method, path: &'static str, check: impl Fn(&Value) + Send + 'static) -> Expect {
    Expect {
        method,
        path,
        check: Box::new(check),
        answer: None,
    }
}

/// An expected call answered with `status` and `body`.
pub fn expect_answer(method: Method, path: &'static str, status: u16, body: Value) -> Expect {
    Expect {
        method,
        path,
        check: Box::new(|_| {}),
        answer: Some((status, body)),
    }
}

/// The API server's 404 Status for `kind` `name`.
pub fn not_found(kind: &str, name: &str) -> Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{kind} \"{name}\" not found"), "reason": "NotFound", "code": 404})
}

pub const SERVICE_PATH: &str = "/api/v1/namespaces/default/services/alpine";
pub const SLICE_PATH: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/alpine";

pub const VM_PATH: &str = "/apis/vm.smolvm.dev/v1alpha1/namespaces/default/smolvms/alpine";
pub const VM_STATUS_PATH: &str = "/apis/vm.smolvm.dev/v1alpha1/namespaces/default/smolvms/alpine/status";
pub const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// Serves the expected calls in order, answering each with the object (for SmolVM writes) or the
/// request body echoed, and fails on any unexpected call.
pub async fn serve(mut handle: Handle, calls: Vec<Expect>, object: Value, object_path: &str) -> usize {
    let mut served = 0;
    for e in calls {
        let next = tokio::time::timeout(Duration::from_secs(5), handle.next_request()).await;
        let Ok(Some((request, send))) = next else {
            panic!("expected {} {}, got no request", e.method, e.path)
        };
        assert_eq!(
            request.method(),
            &e.method,
            "method of call {served}: {}",
            request.uri()
        );
        assert_eq!(request.uri().path(), e.path, "path of call {served}");
        let bytes = http_body_util::BodyExt::collect(request.into_body())
            .await
            .unwrap()
            .to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (e.check)(&body);
        // Writes to the SmolVM answer with the object; anything else (events) echoes the body.
        let (status, reply) = match e.answer {
            Some(answer) => answer,
            None if e.path.starts_with(object_path) => (200, object.clone()),
            None => (200, body.clone()),
        };
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap(),
        );
        served += 1;
    }
    // Nothing else may be called.
    if let Ok(Some((request, _))) = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await {
        panic!("unexpected call {} {}", request.method(), request.uri());
    }
    served
}

pub fn context(client: Client, nodes: Vec<SmolVMNode>, node_client: Option<NodeClient>) -> Arc<Context> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (store, mut writer): (_, Writer<SmolVMNode>) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for n in nodes {
        writer.apply_watcher_event(&watcher::Event::InitApply(n));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let node_client = node_client.unwrap_or_else(unreachable_nodes);
    Arc::new(Context {
        client: client.clone(),
        nodes: store,
        ledger: Ledger::new(),
        node_client,
        recorder: smolvm_controller::events::EventSink::new(
            client,
            Reporter {
                controller: "smolvm-controller".into(),
                instance: None,
            },
        ),
        timing: Timing::default(),
        placement: placement::Config::default(),
        metrics: Arc::new(smolvm_controller::metrics::Metrics::default()),
        unsettled: Default::default(),
    })
}

/// A node client whose CA nobody serves with; every node is reached at the endpoints its
/// SmolVMNode advertises (closed ports in these tests).
pub fn unreachable_nodes() -> NodeClient {
    let ca = smolvm_certs::CertificateAuthority::generate("test-runtime-ca", Duration::from_secs(3600)).unwrap();
    let tls = smolvm_certs::client_config(ca.cert_pem(), None, &[b"h2"]).unwrap();
    NodeClient::new(
        ClientSettings {
            tls: smolvm_controller::nodeclient::ClientTls::new(tls),
            token: smolvm_controller::nodeclient::BearerToken::new("t"),
            connect_timeout: Duration::from_millis(500),
            call_timeout: Duration::from_secs(2),
            start_timeout: Duration::from_secs(2),
        },
        Endpoints::default(),
    )
}

pub fn ready_node(name: &str, uid: &str, heartbeat_age_secs: i64) -> SmolVMNode {
    let mut node = fixtures::node(name, 8, 16384, 500);
    let status = node.status.as_mut().unwrap();
    status.node_uid = Some(uid.into());
    status.protocol_version = Some("v1".into());
    // An endpoint nobody listens on: a closed loopback port.
    status.endpoint = Some(smolvm_api::Endpoint {
        address: "127.0.0.1".into(),
        port: 1,
    });
    status.heartbeat_time = Some(Time(
        Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(heartbeat_age_secs),
    ));
    status.conditions = vec![Condition {
        type_: condition::READY.into(),
        status: "True".into(),
        reason: "AsExpected".into(),
        message: String::new(),
        last_transition_time: Time(Timestamp::now()),
        observed_generation: None,
    }];
    node.metadata.labels = Some([("kubernetes.io/arch".to_string(), "amd64".to_string())].into());
    node
}

pub fn vm(object: Value) -> SmolVM {
    let mut object = object;
    object["metadata"]["resourceVersion"] = json!("7");
    object["metadata"]["generation"] = json!(1);
    serde_json::from_value(object).unwrap()
}

pub fn with_finalizer(mut object: Value) -> Value {
    object["metadata"]["finalizers"] = json!([FINALIZER]);
    object
}

pub async fn run_case(object: SmolVM, nodes: Vec<SmolVMNode>, calls: Vec<Expect>) {
    run_case_with(object, nodes, None, calls).await
}

pub async fn run_case_with(
    object: SmolVM,
    nodes: Vec<SmolVMNode>,
    node_client: Option<NodeClient>,
    calls: Vec<Expect>,
) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let ctx = context(client, nodes, node_client);
    let expected = calls.len();
    let server = tokio::spawn(serve(handle, calls, serde_json::to_value(&object).unwrap(), VM_PATH));
    let result = reconcile(Arc::new(object), ctx).await;
    assert!(result.is_ok(), "reconcile failed: {result:?}");
    assert_eq!(server.await.unwrap(), expected);
}

pub fn condition_of<'a>(body: &'a Value, type_: &str) -> &'a Value {
    body["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {body}"))
}
