//! Connections are bounded before a byte of TLS is read (issue 30): a client that connects and
//! never starts its handshake is closed once the handshake time is up, counted in the metric,
//! while a real client is answered meanwhile.

mod common;

use common::*;
use serde_json::json;
use smolvm_api::fixtures;
use smolvm_webhook_bench::client::Version;
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

/// A review's bytes, as the API server sends it.
fn review_body() -> Vec<u8> {
    let object = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
        "metadata": {"name": "a", "namespace": "default"}, "spec": {"image": "alpine:3.20"}});
    ok(serde_json::to_vec(&review(
        "smolvms",
        "",
        "CREATE",
        &fixtures::user(),
        &object,
        None,
    )))
}

async fn tls(h: &Harness, version: Version) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let config = ok(smolvm_webhook_bench::client::tls_config(h.ca.cert_pem(), version));
    let tcp = ok(tokio::net::TcpStream::connect(h.addr).await);
    let name = ok(rustls::pki_types::ServerName::try_from(SERVER_NAME));
    ok(tokio_rustls::TlsConnector::from(config).connect(name, tcp).await)
}

/// Whether the listener has closed: a new connection is refused (or closed before TLS), within
/// a generous bound.
async fn listener_closed(h: &Harness) -> bool {
    for _ in 0..200 {
        match tokio::net::TcpStream::connect(h.addr).await {
            Err(_) => return true,
            Ok(mut tcp) => {
                let mut buf = [0u8; 1];
                if matches!(
                    tokio::time::timeout(std::time::Duration::from_millis(50), tcp.read(&mut buf)).await,
                    Ok(Ok(0) | Err(_))
                ) {
                    return true;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

/// Shutdown closes the listener, but a review in flight over HTTP/2, its body half sent when
/// shutdown began, is still answered: the connection is told GOAWAY, answers the stream it
/// holds, refuses new ones, and closes.
#[tokio::test]
async fn shutdown_answers_the_http2_review_in_flight() {
    let h = Harness::start(vec![fixtures::node("node-a", 8, 16_384, 500)]).await;
    let (mut sender, connection) = ok(h2::client::handshake(tls(&h, Version::Http2).await).await);
    let connection = tokio::spawn(connection);
    let body = review_body();
    let (half, rest) = body.split_at(body.len() / 2);
    let request = ok(http::Request::post(format!("https://{SERVER_NAME}/validate/smolvms"))
        .header("content-type", "application/json")
        .body(()));
    let (response, mut stream) = ok(sender.send_request(request, false));
    ok(stream.send_data(bytes::Bytes::copy_from_slice(half), false));
    // Give the first half a moment to arrive (the test holds either way: the stream was
    // opened before shutdown began).
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    assert!(h.shutdown.send(true).is_ok());
    assert!(listener_closed(&h).await, "the listener closed");
    ok(stream.send_data(bytes::Bytes::copy_from_slice(rest), true));
    let response = ok(response.await);
    assert_eq!(response.status(), 200);
    let mut answer = response.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = answer.data().await {
        bytes.extend_from_slice(&ok(chunk));
    }
    let verdict: serde_json::Value = ok(serde_json::from_slice(&bytes));
    assert_eq!(verdict["response"]["allowed"], true, "{verdict}");

    // No new stream is taken on the draining connection, which then closes.
    let refused = match sender.ready().await {
        Ok(mut sender) => {
            match sender.send_request(ok(http::Request::get(format!("https://{SERVER_NAME}/")).body(())), true) {
                Ok((response, _)) => response.await.is_err(),
                Err(_) => true,
            }
        }
        Err(_) => true,
    };
    assert!(refused, "a new stream on a draining connection is refused");
    let closed = tokio::time::timeout(std::time::Duration::from_secs(30), connection).await;
    assert!(closed.is_ok(), "the draining connection closed");
}

/// The same over HTTP/1.1: the request in flight is answered, and the connection then closes.
#[tokio::test]
async fn shutdown_answers_the_http11_review_in_flight() {
    use tokio::io::AsyncWriteExt;
    let h = Harness::start(vec![fixtures::node("node-a", 8, 16_384, 500)]).await;
    let mut client = tls(&h, Version::Http1).await;
    let body = review_body();
    let (half, rest) = body.split_at(body.len() / 2);
    let head = format!(
        "POST /validate/smolvms HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    ok(client.write_all(head.as_bytes()).await);
    ok(client.write_all(half).await);
    ok(client.flush().await);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    assert!(h.shutdown.send(true).is_ok());
    assert!(listener_closed(&h).await, "the listener closed");
    ok(client.write_all(rest).await);
    ok(client.flush().await);
    let mut answer = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(30), client.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the connection closed after its answer");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"allowed\":true"), "{text}");
}
