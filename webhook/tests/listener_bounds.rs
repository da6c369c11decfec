//! The listener's bounds against strangers (issue 56), over real TLS on loopback addresses: one
//! source that fills the handshakes leaves another its own; idle HTTP/2 connections from many
//! sources are closed while a real client is served.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use smolvm_api::fixtures;
use smolvm_webhook_bench::client::{self, Version};

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

fn object() -> serde_json::Value {
    json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
        "metadata": {"name": "a", "namespace": "default"}, "spec": {"image": "alpine:3.20"}})
}

/// The lines of `/metrics` about closed connections.
async fn closed_lines(h: &Harness) -> String {
    let (_, metrics) = h.ops_get("/metrics").await;
    metrics
        .lines()
        .filter(|l| l.starts_with("smolvm_webhook_connections_closed_total"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// 64 sockets from 127.0.0.2 that never start their handshake, then a real client from
/// 127.0.0.3: it gets its handshake and its review answered.
#[tokio::test]
async fn silent_sockets_from_one_source_leave_another_source_its_handshake() {
    let h = Harness::start(vec![fixtures::node("node-a", 8, 16_384, 500)]).await;
    let mut silent = Vec::new();
    for _ in 0..64 {
        silent.push(ok(client::tcp_from(loopback(2), h.addr).await));
    }
    // The listener accepts in order: the silent sockets are taken before the client's.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let config = ok(client::tls_config(h.ca.cert_pem(), Version::Http2));
    let connected = client::connect_from(loopback(3), h.addr, SERVER_NAME, config, Version::Http2).await;
    let closed = closed_lines(&h).await;
    println!(
        "64 silent sockets from 127.0.0.2; a client from 127.0.0.3: connected={}; {closed}",
        connected.is_ok()
    );
    let mut conn = match connected {
        Ok(conn) => conn,
        Err(error) => panic!("the client from another source got no handshake: {error}; {closed}"),
    };
    let (status, _) = post(
        &mut conn,
        "/validate/smolvms",
        &review("smolvms", "", "CREATE", &fixtures::user(), &object(), None),
    )
    .await;
    assert_eq!(status, 200);
    drop(silent);
}

/// 1,100 HTTP/2 connections from 40 loopback addresses that open no stream (their client answers
/// every PING) are closed after the idle timeout (10 s here, longer than opening them takes), while
/// a client that was connected first (the API server's pooled connection) makes reviews all
/// along; afterwards new connections are served again.
#[tokio::test]
async fn idle_http2_connections_from_many_sources_are_closed_while_a_client_is_served() {
    let h = Harness::start_listening(
        vec![fixtures::node("node-a", 8, 16_384, 500)],
        |_| {},
        |l| l.bounds.http2_idle_timeout = Duration::from_secs(10),
    )
    .await;
    let config = ok(client::tls_config(h.ca.cert_pem(), Version::Http2));
    let mut real = ok(client::connect_from(loopback(200), h.addr, SERVER_NAME, config.clone(), Version::Http2).await);
    // The real client reviews every 100 ms from the start until told to stop.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let reviewer = tokio::spawn(async move {
        let mut reviews = std::collections::BTreeMap::<u16, u32>::new();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = &mut stopped => return reviews,
                _ = tick.tick() => {
                    let (status, _) = post(
                        &mut real,
                        "/validate/smolvms",
                        &review("smolvms", "", "CREATE", &fixtures::user(), &object(), None),
                    )
                    .await;
                    *reviews.entry(status).or_default() += 1;
                }
            }
        }
    });

    // The idle connections: TLS, the HTTP/2 handshake, and then nothing but PING answers (the
    // `h2` client answers them as it drives its connection).
    const IDLE: usize = 1_100;
    const SOURCES: usize = 40;
    let start = Instant::now();
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::unbounded_channel::<Duration>();
    let mut openers = tokio::task::JoinSet::new();
    for s in 0..SOURCES {
        let (config, closed_tx, addr) = (config.clone(), closed_tx.clone(), h.addr);
        let source = loopback(10 + s as u8);
        let count = IDLE / SOURCES + usize::from(s < IDLE % SOURCES);
        openers.spawn(async move {
            let mut open = 0usize;
            // One at a time per source: a real client does not open dozens of handshakes at once.
            for _ in 0..count {
                let Ok(tcp) = client::tcp_from(source, addr).await else {
                    continue;
                };
                let name = ok(rustls::pki_types::ServerName::try_from(SERVER_NAME));
                let Ok(tls) = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                else {
                    continue;
                };
                let Ok((sender, connection)) = h2::client::handshake(tls).await else {
                    continue;
                };
                open += 1;
                let closed_tx = closed_tx.clone();
                tokio::spawn(async move {
                    let _keep = sender;
                    let _ = connection.await;
                    let _ = closed_tx.send(start.elapsed());
                });
            }
            open
        });
    }
    drop(closed_tx);
    let opened: usize = openers.join_all().await.into_iter().sum();
    let opened_after = start.elapsed();

    // Until every idle connection is closed (or a generous bound passes).
    let mut closed = 0usize;
    let mut last_closed = Duration::ZERO;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while closed < opened {
        match tokio::time::timeout_at(deadline, closed_rx.recv()).await {
            Ok(Some(at)) => {
                closed += 1;
                last_closed = at;
            }
            Ok(None) | Err(_) => break,
        }
    }
    let _ = stop.send(());
    let reviews = ok(reviewer.await);
    let counted = closed_lines(&h).await;
    println!(
        "{IDLE} idle HTTP/2 connections from {SOURCES} sources: {opened} opened (in {opened_after:?}), {closed} closed by the server (the last {last_closed:?} after the first was opened); the real client's reviews by status: {reviews:?}; {counted}"
    );
    assert!(opened > 0, "some idle connections were opened");
    assert_eq!(closed, opened, "every idle connection was closed by the server");
    assert_eq!(
        reviews.keys().copied().collect::<Vec<_>>(),
        vec![200],
        "every review was answered 200"
    );

    // The slots came back: a new client, from a new source, is served.
    let mut after = ok(client::connect_from(loopback(201), h.addr, SERVER_NAME, config, Version::Http2).await);
    let (status, _) = post(
        &mut after,
        "/validate/smolvms",
        &review("smolvms", "", "CREATE", &fixtures::user(), &object(), None),
    )
    .await;
    assert_eq!(status, 200);
}
