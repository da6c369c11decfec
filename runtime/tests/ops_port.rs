//! The agent's ops port (plain HTTP on the node's network: /healthz, /readyz, /metrics) is the
//! bounded server every binary shares: silent clients from one address take at most their
//! share of the connections, the rest are closed at once, and the probes still answer.

use std::sync::Arc;
use std::time::Duration;

use smolvm_testkit::node::{self as common, Pki, TestAgent, http_get};
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn silent_clients_cannot_take_the_probes_slots() {
    common::init();
    let dir = tempfile::Builder::new()
        .prefix("smolvm-ops-")
        .tempdir()
        .expect("temp dir");
    let agent = TestAgent::without_smolvm(dir.path(), Arc::new(Pki::new())).await;
    let ops = agent.agent.ops_addr().expect("ops");
    assert_eq!(http_get(ops, "/healthz").await.0, 200);
    assert_eq!(http_get(ops, "/readyz").await.0, 503, "smolvm is absent here");

    // One address opens connections and says nothing: beyond its share they are closed at once.
    let bounds = smolvm_kit::ops::Bounds::default();
    let mut silent = Vec::new();
    for _ in 0..bounds.max_per_source {
        silent.push(tokio::net::TcpStream::connect(ops).await.expect("connect"));
    }
    let mut beyond = tokio::net::TcpStream::connect(ops).await.expect("connect");
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), beyond.read_to_end(&mut got)).await;
    assert!(read.is_ok() && got.is_empty(), "closed at once, unanswered");

    // The kubelet's probes, from another address, still answer.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.2:0".parse().expect("addr"))
        .expect("bind 127.0.0.2");
    let stream = socket.connect(ops).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, http_body_util::Empty<bytes::Bytes>>(
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::get("/healthz")
        .header("host", "ops")
        .body(http_body_util::Empty::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("answer");
    assert_eq!(response.status(), 200);
    drop(silent);
    agent.agent.shutdown().await;
}
