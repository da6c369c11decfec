//! Connections are bounded before a byte of TLS is read (issue 30): a client that connects and
//! never starts its handshake is closed once the handshake time is up, counted in the metric,
//! while a real client is answered meanwhile.

mod common;

use common::*;
use serde_json::json;
use smolvm_api::fixtures;
use smolvm_webhook::client::Version;
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn a_silent_connection_is_closed_and_counted_while_reviews_are_answered() {
    let h = Harness::start(vec![fixtures::node("node-a", 8, 16_384, 500)]).await;
    let mut silent = ok(tokio::net::TcpStream::connect(h.addr).await);
    // A real review meanwhile.
    let mut conn = h.connect(Version::Http2).await;
    let object = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
        "metadata": {"name": "a", "namespace": "default"}, "spec": {"image": "alpine:3.20"}});
    let (status, _) = post(
        &mut conn,
        "/validate/smolvms",
        &review("smolvms", "", "CREATE", &fixtures::user(), &object, None),
    )
    .await;
    assert_eq!(status, 200, "a real client is answered while another sits silent");
    // The silent client is closed by the server (end of stream or a reset), within a generous
    // bound well past the handshake time.
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(std::time::Duration::from_secs(60), silent.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the server closed the silent connection: {closed:?}"
    );
    let (_, metrics) = h.ops_get("/metrics").await;
    assert!(
        metrics.contains("smolvm_webhook_connections_closed_total{reason=\"handshake_timeout\"} 1"),
        "counted: {}",
        metrics
            .lines()
            .filter(|l| l.contains("connections_closed"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
