//! Slow request bodies never take review capacity (issue 30): the real server on 127.0.0.1 over
//! TLS, clients that trickle their bodies one byte at a time over raw HTTP/1.1 on verified TLS,
//! and reviews as kube-apiserver sends them over HTTP/2 and HTTP/1.1 meanwhile.
//!
//! Nothing here asserts a duration: a trickling body is shed by its status code, and the
//! reviews sent meanwhile are judged by their answers.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use smolvm_api::fixtures;
use smolvm_webhook_bench::client::{self, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

fn nodes() -> Vec<smolvm_api::SmolVMNode> {
    vec![fixtures::node("node-a", 8, 16_384, 500)]
}

/// Raw HTTP/1.1 over TLS that verifies the server against the test CA.
async fn raw_tls(h: &Harness) -> Tls {
    let config = ok(client::tls_config(h.ca.cert_pem(), Version::Http1));
    let tcp = ok(tokio::net::TcpStream::connect(h.addr).await);
    let name = ok(rustls::pki_types::ServerName::try_from(SERVER_NAME));
    ok(tokio_rustls::TlsConnector::from(config).connect(name, tcp).await)
}

/// A review request's head announcing `length` body bytes.
fn head(path: &str, length: usize) -> String {
    format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n")
}

fn review_bytes(object: &Value) -> Vec<u8> {
    ok(serde_json::to_vec(&review(
        "smolvms",
        "",
        "CREATE",
        &fixtures::user(),
        object,
        None,
    )))
}

fn reason_of(response: &[u8]) -> String {
    let text = String::from_utf8_lossy(response);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    let status: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    status["reason"].as_str().unwrap_or("").to_string()
}

fn status_of(response: &[u8]) -> u16 {
    String::from_utf8_lossy(response)
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Reads an HTTP/1.1 answer until the server closes the connection or 30 s pass; a hang fails.
async fn answer(tls: &mut Tls) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "no answer: the server hung");
    String::from_utf8_lossy(&out).to_string()
}

/// Forty clients trickling their bodies one byte at a time hold no review slot: with only four
/// review slots, every review sent meanwhile, over HTTP/2 and HTTP/1.1, is answered 200 with the
/// right verdict. With 64 reader slots (the default) the trickles go on undisturbed; with 8, the
/// reviews displace the trickles that have held their slots longest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_bodies_leave_reviews_answered() {
    for readers in [64, 8] {
        let h = Harness::start_with(nodes(), |s| {
            *s = s
                .clone()
                .with_max_concurrent_reviews(4)
                .with_max_concurrent_bodies(readers);
        })
        .await;
        let trickled = review_bytes(&fixtures::alpine());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut clients = Vec::new();
        for n in 0..40 {
            let h = HarnessRef::of(&h, n);
            let body = trickled.clone();
            let stop = stop_rx.clone();
            clients.push(tokio::spawn(async move {
                trickle_to(&h, body, Duration::from_millis(100), stop).await
            }));
        }
        // Let every trickling client get its head and first bytes in.
        tokio::time::sleep(Duration::from_millis(500)).await;

        let allowed = review("smolvms", "", "CREATE", &fixtures::user(), &fixtures::alpine(), None);
        let denied = review(
            "smolvms",
            "",
            "CREATE",
            &fixtures::user(),
            &fixtures::smolvm("bad", json!({"image": "alpine:latest", "resources": {"cpus": 4096}})),
            None,
        );
        let mut answered = 0;
        for round in 0..10 {
            for version in [Version::Http2, Version::Http1] {
                let mut conn = h.connect(version).await;
                for path in ["/validate/smolvms", "/mutate/smolvms"] {
                    let at = format!("{readers} readers, round {round} {version:?} {path}");
                    let (status, body) = post(&mut conn, path, &allowed).await;
                    assert_eq!(status, 200, "{at}: {body}");
                    assert_eq!(body["response"]["allowed"], true, "{at}: {body}");
                    let (status, body) = post(&mut conn, path, &denied).await;
                    assert_eq!(status, 200, "{at}: {body}");
                    assert_eq!(body["response"]["allowed"], false, "{at}: {body}");
                    assert_eq!(body["response"]["status"]["code"], 422, "{at}: {body}");
                    answered += 2;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = stop_tx.send(true);
        let mut shed = Vec::new();
        for client in clients {
            shed.extend(ok(client.await));
        }
        let mut reasons: std::collections::BTreeMap<String, usize> = Default::default();
        for (status, reason) in &shed {
            assert!([408, 429].contains(status), "{readers} readers: {shed:?}");
            *reasons.entry(format!("{status} {reason}")).or_default() += 1;
        }
        println!(
            "{readers} reader slots: {answered} reviews answered 200 while 40 clients trickled; trickles answered early: {reasons:?}"
        );
        if readers == 64 {
            assert!(
                shed.is_empty(),
                "a trickle that makes progress is not shed early: {shed:?}"
            );
        }
    }
}

/// What a trickling client needs of the harness, to move into a task, and the loopback address
/// it connects from (each client its own, as separate clients would: the listener bounds the
/// handshakes of one address).
struct HarnessRef {
    addr: std::net::SocketAddr,
    ca_pem: String,
    source: std::net::IpAddr,
}

impl HarnessRef {
    /// The `n`th client's, from 127.0.0.(10 + n).
    fn of(h: &Harness, n: u8) -> Self {
        HarnessRef {
            addr: h.addr,
            ca_pem: h.ca.cert_pem().to_string(),
            source: std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 10 + n)),
        }
    }

    async fn raw_tls(&self) -> Tls {
        let config = ok(client::tls_config(&self.ca_pem, Version::Http1));
        let tcp = ok(client::tcp_from(self.source, self.addr).await);
        let name = ok(rustls::pki_types::ServerName::try_from(SERVER_NAME));
        ok(tokio_rustls::TlsConnector::from(config).connect(name, tcp).await)
    }
}

/// A client that sends a review's head, then its body one byte every `every`, until `stop`;
/// it reconnects when the server answers or closes its connection. Returns the status and
/// reason of each answer it got before its body was all sent (the server shed it).
async fn trickle_to(
    h: &HarnessRef,
    body: Vec<u8>,
    every: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<(u16, String)> {
    let mut answers = Vec::new();
    while !*stop.borrow() {
        let mut tls = h.raw_tls().await;
        if tls
            .write_all(head("/validate/smolvms", body.len()).as_bytes())
            .await
            .is_err()
        {
            continue;
        }
        let mut buf = vec![0u8; 4096];
        for byte in &body {
            if *stop.borrow() {
                return answers;
            }
            if tls.write_all(std::slice::from_ref(byte)).await.is_err() || tls.flush().await.is_err() {
                break;
            }
            if let Ok(Ok(n)) = tokio::time::timeout(every, tls.read(&mut buf)).await {
                if n > 0 {
                    answers.push((status_of(&buf[..n]), reason_of(&buf[..n])));
                }
                break;
            }
        }
    }
    answers
}

/// A body that stops arriving is answered 408 (`BodyStalled`) after the idle timeout, one that
/// keeps trickling is answered 408 (`Timeout`) at the body deadline, and with every reader slot
/// held by trickles, a review whose body is arriving displaces the one held longest (408
/// `BodyDisplaced`); none of them takes a review slot. (A newcomer refused because no slot
/// frees, 429 `TooManyBodies`, is tested with the slots themselves, in `bodies`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_are_shed_with_a_clear_answer() {
    let h = Harness::start_with(nodes(), |s| {
        *s = s.clone().with_max_concurrent_bodies(2);
        s.body_idle_timeout = Duration::from_millis(300);
        s.body_timeout = Duration::from_secs(3);
    })
    .await;
    let body = review_bytes(&fixtures::alpine());

    // Stalled: a head and a few bytes, then nothing.
    let mut stalled = raw_tls(&h).await;
    ok(stalled
        .write_all(head("/validate/smolvms", body.len()).as_bytes())
        .await);
    ok(stalled.write_all(&body[..10]).await);
    let text = answer(&mut stalled).await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"reason\":\"BodyStalled\""), "{text}");
    assert!(text.contains("\"code\":408"), "{text}");

    // Two trickling bodies hold both reader slots. Reviews are answered all the same: one whose
    // body is all there when read needs no slot, and one whose body is still arriving (over
    // HTTP/2, often the DATA frame after the head) displaces the trickle that has held its slot
    // longest, which is answered 408 BodyDisplaced.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut holders = Vec::new();
    for n in 0..2 {
        let h_ref = HarnessRef::of(&h, n);
        let body = body.clone();
        let stop = stop_rx.clone();
        holders.push(tokio::spawn(async move {
            trickle_to(&h_ref, body, Duration::from_millis(50), stop).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let good = review("smolvms", "", "CREATE", &fixtures::user(), &fixtures::alpine(), None);
    for version in [Version::Http1, Version::Http2] {
        let mut conn = h.connect(version).await;
        for _ in 0..20 {
            let (status, body) = post(&mut conn, "/validate/smolvms", &good).await;
            assert_eq!(status, 200, "{version:?}: {body}");
            assert_eq!(body["response"]["allowed"], true, "{version:?}: {body}");
        }
    }
    // Those reviews' bodies are all there when read, or come whole within the grace a body a
    // moment behind its head is read in without a slot (200 ms), so they never need a slot. One
    // whose body is still arriving past that grace (its head and half its body, the rest 300 ms
    // later) needs one, and displaces the trickle that has held its slot longest. It is answered
    // 200, or 408 BodyDisplaced when the displaced trickles reconnect before its body is in and
    // one of them displaces it in turn (it then holds its slot longest).
    let mut arriving = raw_tls(&h).await;
    ok(arriving
        .write_all(head("/validate/smolvms", body.len()).as_bytes())
        .await);
    let (first, rest) = body.split_at(body.len() / 2);
    ok(arriving.write_all(first).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    ok(arriving.write_all(rest).await);
    let text = answer(&mut arriving).await;
    assert!(
        text.starts_with("HTTP/1.1 200") || text.contains("\"reason\":\"BodyDisplaced\""),
        "{text}"
    );
    // Trickling past the deadline: 408 Timeout (the holders are answered so).
    let _ = stop_tx.send(true);
    let mut answers = Vec::new();
    for holder in holders {
        answers.extend(ok(holder.await));
    }
    assert!(answers.iter().all(|(s, _)| *s == 408), "{answers:?}");
    assert!(
        answers.iter().any(|(_, reason)| reason == "BodyDisplaced"),
        "no trickle was displaced: {answers:?}"
    );
    let mut slow = raw_tls(&h).await;
    ok(slow.write_all(head("/validate/smolvms", body.len()).as_bytes()).await);
    let mut text = String::new();
    let mut buf = vec![0u8; 4096];
    for byte in &body {
        if slow.write_all(std::slice::from_ref(byte)).await.is_err() || slow.flush().await.is_err() {
            break;
        }
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(100), slow.read(&mut buf)).await {
            text = String::from_utf8_lossy(&buf[..n]).to_string();
            break;
        }
    }
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"reason\":\"Timeout\""), "{text}");

    // The slots are free again: reviews are answered.
    let mut answered = false;
    for _ in 0..100 {
        let mut conn = h.connect(Version::Http2).await;
        let (status, body) = post(&mut conn, "/validate/smolvms", &good).await;
        if status == 200 {
            assert_eq!(body["response"]["allowed"], true, "{body}");
            answered = true;
            break;
        }
        assert_eq!(status, 429);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answered, "the reader slots never came back");
    let (_, metrics) = h.ops_get("/metrics").await;
    for reason in ["BodyStalled", "Timeout", "BodyDisplaced"] {
        assert!(
            metrics.contains(&format!("smolvm_webhook_bad_requests_total{{reason=\"{reason}\"}}")),
            "{reason}\n{metrics}"
        );
    }
}
