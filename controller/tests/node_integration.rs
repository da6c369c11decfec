//! The controller's node client against the real runtime agent, supervising a real
//! `smolvm serve`, over mTLS on loopback. Nothing here is a double.

use smolvm_testkit::node as common;

use smolvm_api::Protocol;
use std::{sync::Arc, time::Duration};

use common::{NODE, Pki, TOKEN, TestAgent};
use smolvm_api::nodeapi::{ErrorCode, MachineSpec, MachineState, NetworkSpec, PortSpec, ResizeSpec};
use smolvm_certs::ReloadableResolver;
use smolvm_controller::nodeclient::{CallError, ClientSettings, ClientTls, Endpoints, NodeClient, client_tls};

fn client(pki: &Pki, token: &str, endpoints: Endpoints) -> NodeClient {
    let cert = Arc::new(ReloadableResolver::from_pem(&pki.client_cert, &pki.client_key).unwrap());
    NodeClient::new(
        ClientSettings {
            tls: ClientTls::new(client_tls(pki.ca.cert_pem(), cert).unwrap()),
            token: smolvm_controller::nodeclient::BearerToken::new(token.to_string()),
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(180),
        },
        endpoints,
    )
}

fn spec(image: &str, cpus: u32) -> MachineSpec {
    MachineSpec {
        image: image.into(),
        cpus,
        memory_mib: 256,
        storage_gib: 2,
        overlay_gib: 1,
        network: NetworkSpec {
            enabled: true,
            ports: vec![PortSpec {
                host_port: common::free_port(),
                guest_port: 80,
                protocol: Protocol::Tcp,
            }],
            allowed_cidrs: vec![],
            allowed_hosts: vec![],
        },
        workload: Default::default(),
        volumes: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_client_drives_the_real_runtime_over_mtls() {
    common::init();
    let dir = tempfile::tempdir().unwrap();
    let pki = Arc::new(Pki::new());
    let Some(agent) =
        TestAgent::with_smolvm("node_client_drives_the_real_runtime_over_mtls", dir.path(), pki.clone()).await
    else {
        return;
    };
    let addr = agent.agent.node_api_addr();
    let endpoints = Endpoints::default();
    endpoints.set(NODE, &addr.ip().to_string(), addr.port());
    let nodes = client(&pki, TOKEN, endpoints.clone());

    let health = nodes.health(NODE).await.unwrap();
    assert_eq!(health.protocol_version, smolvm_api::constants::PROTOCOL_VERSION);
    assert_eq!(nodes.identity(NODE).await.unwrap().node_name, NODE);

    let name = "svm-0b7e6a4c-1d2e-4f30-9a8b-7c6d5e4f3a2b";
    assert_eq!(nodes.get_machine(NODE, name).await.unwrap(), None, "not created yet");
    // An image that cannot be pulled here makes the start fail fast and honestly.
    let wanted = spec("localhost:1/none:latest", 1);
    for attempt in 0..2 {
        let created = nodes.create_machine(NODE, name, &wanted).await.unwrap();
        assert_eq!(created.name, name, "create attempt {attempt}");
        assert_eq!((created.cpus, created.memory_mib), (1, 256));
    }
    match nodes
        .create_machine(NODE, name, &spec("localhost:1/other:latest", 2))
        .await
    {
        Err(CallError::Api {
            status: 409,
            code,
            details,
            ..
        }) => {
            assert_eq!(code, ErrorCode::MachineSpecConflict);
            let fields = details.unwrap().to_string();
            assert!(fields.contains("image") && fields.contains("cpus"), "{fields}");
        }
        other => panic!("a conflicting create must be a 409 naming the fields, got {other:?}"),
    }
    for _ in 0..2 {
        let stopped = nodes.stop_machine(NODE, name).await.unwrap();
        assert_ne!(stopped.state, MachineState::Running);
    }
    let grown = nodes
        .resize_machine(
            NODE,
            name,
            &ResizeSpec {
                storage_gib: Some(3),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(grown.storage_gib, Some(3));
    match nodes
        .resize_machine(
            NODE,
            name,
            &ResizeSpec {
                cpus: Some(2),
                ..Default::default()
            },
        )
        .await
    {
        Err(e) => assert_eq!(e.code(), Some(&ErrorCode::ResizeRequiresRunning), "{e}"),
        Ok(m) => panic!("a live CPU resize of a stopped machine cannot succeed: {m:?}"),
    }
    match nodes.ensure_running(NODE, name, None, false).await {
        Err(e) => {
            assert_eq!(e.code(), Some(&ErrorCode::StartFailed), "{e}");
            assert!(!e.message().is_empty(), "the runtime's own message is carried");
            println!("start failed as expected here: {}", e.message());
        }
        Ok(m) => assert_eq!(m.state, MachineState::Running),
    }
    let first = nodes.delete_machine(NODE, name).await.unwrap();
    assert!(first.deleted && !first.missing);
    let second = nodes.delete_machine(NODE, name).await.unwrap();
    assert!(
        second.missing && !second.deleted,
        "a second delete reports the machine missing"
    );

    // A wrong token is refused by the agent.
    let wrong = client(&pki, "not-the-token", endpoints.clone());
    match wrong.health(NODE).await {
        Err(CallError::Api { status: 401, code, .. }) => assert_eq!(code, ErrorCode::Unauthenticated),
        other => panic!("expected 401, got {other:?}"),
    }
    // A token replaced in the Secret before this runtime saw it: the client retries with the
    // token it replaced, so nothing fails during the swap; a token the runtime never had still
    // fails once the old one is gone from the client too.
    let settings_token = smolvm_controller::nodeclient::BearerToken::new(TOKEN.to_string());
    let swapping = NodeClient::new(
        ClientSettings {
            tls: ClientTls::new(
                client_tls(
                    pki.ca.cert_pem(),
                    Arc::new(ReloadableResolver::from_pem(&pki.client_cert, &pki.client_key).unwrap()),
                )
                .unwrap(),
            ),
            token: settings_token.clone(),
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(180),
        },
        endpoints.clone(),
    );
    assert!(settings_token.replace("the-new-token".into()));
    assert_eq!(settings_token.previous().as_deref(), Some(TOKEN));
    swapping
        .health(NODE)
        .await
        .expect("the previous token is retried during the swap");
    assert!(settings_token.replace("a-third-token".into()));
    match swapping.health(NODE).await {
        Err(CallError::Api { status: 401, .. }) => {}
        other => panic!("neither current nor previous token is the runtime's: expected 401, got {other:?}"),
    }
    // The client verifies that the certificate names the node it meant to reach: the same
    // endpoint reached as another node is refused at the handshake.
    endpoints.set("node-b", &addr.ip().to_string(), addr.port());
    match nodes.health("node-b").await {
        Err(e @ CallError::Unreachable { .. }) => assert!(e.to_string().contains("node-b"), "{e}"),
        other => panic!("a certificate for {NODE} must not pass for node-b, got {other:?}"),
    }
    agent.agent.shutdown().await;
}
