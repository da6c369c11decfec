//! Shared helpers of the reconcile tests: fixtures and a reconcile run against the scripted
//! API-server double of `smolvm_testkit::apiserver` (re-exported here).
#![allow(dead_code)]

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Client,
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
    vm::{Context, Timing, reconcile},
};
// Each test binary uses some of them.
#[allow(unused_imports)]
pub use smolvm_testkit::apiserver::{Expect, Handle, expect, expect_answer, not_found, serve};

pub const SERVICE_PATH: &str = "/api/v1/namespaces/default/services/alpine";
pub const SLICE_PATH: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/alpine";

pub const VM_PATH: &str = "/apis/vm.smolvm.dev/v1alpha1/namespaces/default/smolvms/alpine";
pub const VM_STATUS_PATH: &str = "/apis/vm.smolvm.dev/v1alpha1/namespaces/default/smolvms/alpine/status";
pub const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

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
        // An empty cache whose watch never runs: a branch's source is read from the API server.
        vms: reflector::store().0,
        owned: Default::default(),
        // Empty caches whose watches never run: a pool a SmolVM names is read from the API server.
        pools: reflector::store().0,
        classes: reflector::store().0,
        ledger: Ledger::new(),
        node_client,
        holders: Default::default(),
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
        start_failures: Default::default(),
        use_seen: Default::default(),
        superseded: Default::default(),
        pools_wake: Default::default(),
        quotas: None,
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
    let (client, handle) = smolvm_testkit::apiserver::client("default");
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

/// The agent's real node API router over real mTLS on 127.0.0.1, in front of `runtime` (a
/// test double of the runtime), the server's token `TOKEN`; and a node client of the
/// controller for it that sends `token`.
pub fn agent_and_client(
    pki: &smolvm_testkit::node::Pki,
    runtime: Arc<dyn smolvm_runtime::vmm::Vmm>,
    token: &str,
) -> (smolvm_runtime::nodeapi::tls::MtlsServer, NodeClient) {
    use smolvm_certs::ReloadableResolver;
    use smolvm_testkit::node::NODE;
    let server = pki.serve(smolvm_testkit::node::Pki::node_api_state(runtime));
    let endpoints = Endpoints::default();
    endpoints.set(NODE, "127.0.0.1", server.local_addr().port());
    let cert = Arc::new(ReloadableResolver::from_pem(&pki.client_cert, &pki.client_key).expect("client cert"));
    let client = NodeClient::new(
        ClientSettings::standard(
            smolvm_controller::nodeclient::ClientTls::new(
                smolvm_controller::nodeclient::client_tls(pki.ca.cert_pem(), cert).expect("client TLS"),
            ),
            smolvm_controller::nodeclient::BearerToken::new(token.to_string()),
        ),
        endpoints,
    );
    (server, client)
}
