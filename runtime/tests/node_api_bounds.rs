//! The node API listener's bounds (SPEC 6), over real mTLS on 127.0.0.1 with the agent's real
//! router and `MtlsServer`: a caller that never finishes a TLS handshake is closed after the
//! handshake timeout and holds no slot another needs; connections and handshakes beyond their
//! caps are closed at once and counted; file uploads beyond the node's upload budget are
//! answered 429 `TooManyBytes` before their body is sent. The machine is `FilesDouble`, a TEST
//! DOUBLE of the runtime (no guest boots here) that keeps the files written to it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use smolvm_kit::accept::AcceptBounds;
use smolvm_runtime::metrics::Metrics;
use smolvm_runtime::nodeapi::auth::TokenAuth;
use smolvm_runtime::nodeapi::tls::{MtlsServer, NodeApiBounds};
use smolvm_runtime::nodeapi::uploads::UploadBudget;
use smolvm_runtime::nodeapi::{Identity, NodeApiState, router};
use smolvm_runtime::vmm::{
    DeleteOutcome, Machine, MachineSpec, MachineState, RegistryAuth, ResizeRequest, Vmm, VmmError, VmmHealth,
};
use smolvm_testkit::node::{NODE, NodeClient, Pki, TOKEN};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// TEST DOUBLE of the runtime: every machine runs; files written are kept (path, bytes).
#[derive(Default)]
struct FilesDouble {
    written: Mutex<Vec<(String, usize)>>,
}

fn unused() -> VmmError {
    VmmError::BadRequest {
        message: "not used by these tests".into(),
    }
}

#[async_trait]
impl Vmm for FilesDouble {
    async fn health(&self) -> Result<VmmHealth, VmmError> {
        Err(unused())
    }
    async fn list(&self) -> Result<Vec<Machine>, VmmError> {
        Ok(Vec::new())
    }
    async fn get(&self, name: &str) -> Result<Option<Machine>, VmmError> {
        Ok(Some(smolvm_testkit::runtime_double::machine(
            name,
            MachineState::Running,
        )))
    }
    async fn create(&self, _: &MachineSpec) -> Result<Machine, VmmError> {
        Err(unused())
    }
    async fn start(&self, _: &str, _: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        Err(unused())
    }
    async fn stop(&self, _: &str) -> Result<Machine, VmmError> {
        Err(unused())
    }
    async fn delete(&self, _: &str) -> Result<DeleteOutcome, VmmError> {
        Err(unused())
    }
    async fn resize(&self, _: &str, _: &ResizeRequest) -> Result<Machine, VmmError> {
        Err(unused())
    }
    async fn write_file(&self, _: &str, path: &str, _: Option<u32>, content: bytes::Bytes) -> Result<(), VmmError> {
        if let Ok(mut written) = self.written.lock() {
            written.push((path.to_string(), content.len()));
        }
        Ok(())
    }
}

struct Served {
    server: MtlsServer,
    metrics: Arc<Metrics>,
    uploads: UploadBudget,
    runtime: Arc<FilesDouble>,
    pki: Pki,
}

fn serve(bounds: NodeApiBounds, upload_bytes: usize) -> Served {
    let pki = Pki::new();
    let runtime = Arc::new(FilesDouble::default());
    let metrics = Arc::new(Metrics::default());
    let state = NodeApiState::new(
        runtime.clone(),
        TokenAuth::fixed(TOKEN).expect("token"),
        Identity::new(NODE),
        metrics.clone(),
        None,
    )
    .with_upload_budget(upload_bytes);
    let uploads = state.uploads.clone();
    let resolver =
        Arc::new(smolvm_certs::ReloadableResolver::from_pem(&pki.server_cert, &pki.server_key).expect("resolver"));
    let server = MtlsServer::start_bounded(
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind"),
        router(state),
        resolver,
        pki.ca.cert_pem(),
        bounds,
        Some(metrics.clone()),
    )
    .expect("serves");
    Served {
        server,
        metrics,
        uploads,
        runtime,
        pki,
    }
}

impl Served {
    /// A client over mTLS (HTTP/1.1, keep-alive); `Err` when the connection is refused.
    async fn client(&self) -> Result<NodeClient, String> {
        NodeClient::connect(
            self.server.local_addr(),
            &smolvm_certs::runtime_server_name(NODE),
            self.pki.client_tls(),
            Some(TOKEN),
        )
        .await
    }

    /// Whether a new client gets `GET /v1/identity` answered (200).
    async fn answers(&self) -> bool {
        match self.client().await {
            Ok(mut client) => client
                .send_raw("GET", "/v1/identity", None)
                .await
                .is_ok_and(|a| a.status == 200),
            Err(_) => false,
        }
    }

    /// A TLS connection of the controller's (the client certificate), for raw HTTP/1.1.
    async fn tls(&self) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.server.local_addr()).await.expect("connect");
        let name = rustls::pki_types::ServerName::try_from(smolvm_certs::runtime_server_name(NODE)).expect("name");
        TlsConnector::from(self.pki.client_tls())
            .connect(name, tcp)
            .await
            .expect("handshake")
    }
}

/// Waits (a generous bound, not a timing assertion) until `done` holds.
async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..300 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never: {what}");
}

/// Whether the server closed `stream` (EOF or an error on read), within a generous bound.
async fn closed_by_server(stream: &mut (impl AsyncRead + Unpin)) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(30), stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// The head of a `PUT` of a file, with `Content-Length: length` or chunked.
fn put_head(path: &str, length: Option<usize>) -> String {
    let framing = match length {
        Some(n) => format!("content-length: {n}"),
        None => "transfer-encoding: chunked".to_string(),
    };
    format!(
        "PUT /v1/machines/running/files/{path}?mode=0644 HTTP/1.1\r\nhost: node\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/octet-stream\r\n{framing}\r\n\r\n"
    )
}

/// An answer read off a raw connection.
#[derive(Debug)]
struct RawAnswer {
    status: u16,
    retry_after: Option<String>,
    body: serde_json::Value,
}

/// Reads one answer (head, then a `Content-Length` body) off `stream`.
async fn read_answer(stream: &mut (impl AsyncRead + Unpin)) -> RawAnswer {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut chunk))
            .await
            .expect("an answer within 30 s")
            .expect("read");
        assert!(n > 0, "closed before an answer: {}", String::from_utf8_lossy(&buffer));
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let header = |name: &str| {
        head.split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
    };
    let length: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let retry_after = header("retry-after");
    while buffer.len() < head_end + length {
        let n = stream.read(&mut chunk).await.expect("read body");
        assert!(n > 0, "closed inside the body");
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buffer[head_end..head_end + length]).unwrap_or(serde_json::Value::Null);
    RawAnswer {
        status,
        retry_after,
        body,
    }
}

fn bounds(accept: AcceptBounds) -> NodeApiBounds {
    NodeApiBounds {
        accept,
        ..NodeApiBounds::default()
    }
}

#[tokio::test]
async fn a_caller_that_never_handshakes_is_closed_while_a_client_is_answered() {
    let served = serve(
        bounds(AcceptBounds {
            handshake_timeout: Duration::from_secs(1),
            ..AcceptBounds::default()
        }),
        1 << 20,
    );
    let mut silent = TcpStream::connect(served.server.local_addr()).await.expect("connect");
    assert!(
        served.answers().await,
        "a client is answered while the silent one waits"
    );
    assert!(closed_by_server(&mut silent).await, "the silent connection is closed");
    assert_eq!(served.metrics.node_api_closed("handshake_timeout"), 1);
    assert!(served.answers().await);
    let text = served.metrics.encode();
    assert!(
        text.contains("smolvm_runtime_node_api_connections_closed_total{reason=\"handshake_timeout\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once_and_counted() {
    let served = serve(
        bounds(AcceptBounds {
            max_connections: 2,
            ..AcceptBounds::default()
        }),
        1 << 20,
    );
    // Two served connections (their handshakes finished) hold both slots.
    let mut first = served.client().await.expect("first");
    let mut second = served.client().await.expect("second");
    let mut third = TcpStream::connect(served.server.local_addr()).await.expect("tcp");
    assert!(
        closed_by_server(&mut third).await,
        "a third connection is closed at once"
    );
    assert!(!served.answers().await, "no handshake beyond the cap");
    assert_eq!(served.metrics.node_api_closed("connections"), 2);
    // Those two are still served.
    for client in [&mut first, &mut second] {
        let answer = client.call("GET", "/v1/identity", None).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    // A slot comes back when a connection goes.
    drop(first);
    eventually("a new connection is served once one went", async || {
        served.answers().await
    })
    .await;
}

#[tokio::test]
async fn handshakes_beyond_the_cap_are_closed_at_once_and_counted() {
    let served = serve(
        bounds(AcceptBounds {
            max_handshakes: 1,
            ..AcceptBounds::default()
        }),
        1 << 20,
    );
    // A connection that never starts its handshake holds the only handshake slot (up to the
    // timeout); until the server has taken it, a client may still get through.
    let silent = TcpStream::connect(served.server.local_addr()).await.expect("tcp");
    eventually("a client is refused while the silent one handshakes", async || {
        !served.answers().await
    })
    .await;
    assert!(served.metrics.node_api_closed("handshakes") >= 1);
    drop(silent);
    eventually("a client is served once the silent one went", async || {
        served.answers().await
    })
    .await;
}

/// A TCP connection from `source` (one of this host's loopback addresses) to `to`.
async fn tcp_from(source: std::net::IpAddr, to: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(source, 0))?;
    socket.connect(to).await
}

fn loopback(last: u8) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, last))
}

impl Served {
    /// The controller's client from `source`: mTLS, then `GET /v1/identity` over HTTP/1.1; its
    /// status, or why there was none.
    async fn identity_from(&self, source: std::net::IpAddr) -> Result<u16, String> {
        let tcp = tcp_from(source, self.server.local_addr())
            .await
            .map_err(|e| e.to_string())?;
        let name = rustls::pki_types::ServerName::try_from(smolvm_certs::runtime_server_name(NODE))
            .map_err(|e| e.to_string())?;
        let mut tls = TlsConnector::from(self.pki.client_tls())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let head = format!(
            "GET /v1/identity HTTP/1.1\r\nhost: node\r\nauthorization: Bearer {TOKEN}\r\nconnection: close\r\n\r\n"
        );
        tls.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
        Ok(read_answer(&mut tls).await.status)
    }
}

/// 64 sockets from 127.0.0.2 that never start their handshake, then the controller from
/// 127.0.0.3: it gets its handshake and its answer.
#[tokio::test]
async fn silent_sockets_from_one_source_leave_another_source_its_handshake() {
    let served = serve(NodeApiBounds::default(), 1 << 20);
    let mut silent = Vec::new();
    for _ in 0..64 {
        silent.push(tcp_from(loopback(2), served.server.local_addr()).await.expect("tcp"));
    }
    // The listener accepts in order: the silent sockets are taken before the controller's.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answered = served.identity_from(loopback(3)).await;
    println!(
        "64 silent sockets from 127.0.0.2; the controller from 127.0.0.3: {answered:?}; closed: handshakes {}, source_handshakes {}",
        served.metrics.node_api_closed("handshakes"),
        served.metrics.node_api_closed("source_handshakes"),
    );
    assert_eq!(answered, Ok(200), "the controller from another source is answered");
    drop(silent);
}

/// An HTTP/2 connection of the controller's that carries no request for the idle timeout (1 s
/// here; it answers every PING) is told GOAWAY and closed, its call before answered, while the
/// controller's other clients are served.
#[tokio::test]
async fn an_idle_http2_connection_is_closed_while_others_are_served() {
    let served = serve(
        NodeApiBounds {
            http2_idle_timeout: Duration::from_secs(1),
            ..NodeApiBounds::default()
        },
        1 << 20,
    );
    let config = smolvm_certs::client_config(
        served.pki.ca.cert_pem(),
        Some((&served.pki.client_cert, &served.pki.client_key)),
        &[b"h2"],
    )
    .expect("client config");
    let tcp = TcpStream::connect(served.server.local_addr()).await.expect("tcp");
    let name = rustls::pki_types::ServerName::try_from(smolvm_certs::runtime_server_name(NODE)).expect("name");
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, connection) = h2::client::handshake(tls).await.expect("HTTP/2");
    let opened = std::time::Instant::now();
    let connection = tokio::spawn(connection);
    let request = http::Request::get("https://node/v1/identity")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(())
        .expect("request");
    let (response, _) = sender.send_request(request, true).expect("a stream");
    assert_eq!(response.await.expect("an answer").status(), 200);
    // Idle from now: the server closes it (within a generous bound, not a timing assertion).
    let closed = tokio::time::timeout(Duration::from_secs(60), connection).await;
    println!(
        "an HTTP/2 connection idle after one call: closed by the node API {:?} after it opened (idle timeout 1 s)",
        opened.elapsed()
    );
    assert!(closed.is_ok(), "the idle connection was closed");
    assert!(served.answers().await, "a new connection is served");
}

#[tokio::test]
async fn uploads_beyond_the_byte_budget_are_answered_429_before_their_body_is_sent() {
    const BUDGET: usize = 1 << 20;
    let served = serve(NodeApiBounds::default(), BUDGET);

    // A declares 768 KiB and sends nothing yet: the agent takes them from the budget before
    // it reads a byte.
    let held = 768 << 10;
    let mut a = served.tls().await;
    a.write_all(put_head("tmp/a", Some(held)).as_bytes())
        .await
        .expect("head");
    eventually("A's bytes are taken", async || served.uploads.free() == BUDGET - held).await;

    // B declares 512 KiB: 429 TooManyBytes while its body is unsent.
    let mut b = served.tls().await;
    b.write_all(put_head("tmp/b", Some(512 << 10)).as_bytes())
        .await
        .expect("head");
    let answer = read_answer(&mut b).await;
    assert_eq!(
        (answer.status, answer.body["code"].as_str()),
        (429, Some("TooManyBytes")),
        "{answer:?}"
    );
    assert_eq!(answer.retry_after.as_deref(), Some("1"), "{answer:?}");
    assert_eq!(answer.body["details"]["limit"], BUDGET, "{answer:?}");
    assert_eq!(answer.body["details"]["requested"], 512 << 10, "{answer:?}");

    // C declares no length: its pieces are counted as they come; the one past the budget is
    // answered 429.
    let mut c = served.tls().await;
    c.write_all(put_head("tmp/c", None).as_bytes()).await.expect("head");
    let piece = vec![b'c'; 300 << 10];
    c.write_all(format!("{:x}\r\n", piece.len()).as_bytes())
        .await
        .expect("chunk");
    c.write_all(&piece).await.expect("chunk");
    c.write_all(b"\r\n").await.expect("chunk");
    let answer = read_answer(&mut c).await;
    assert_eq!(
        (answer.status, answer.body["code"].as_str()),
        (429, Some("TooManyBytes")),
        "{answer:?}"
    );

    // A declared more than the whole budget: 413, its body unsent too.
    let mut d = served.tls().await;
    d.write_all(put_head("tmp/d", Some(BUDGET + 1)).as_bytes())
        .await
        .expect("head");
    let answer = read_answer(&mut d).await;
    assert_eq!(
        (answer.status, answer.body["code"].as_str()),
        (413, Some("PayloadTooLarge")),
        "{answer:?}"
    );

    // A sends its body and is written; its bytes come back.
    a.write_all(&vec![b'a'; held]).await.expect("body");
    let answer = read_answer(&mut a).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["bytes"], held, "{answer:?}");
    eventually("A's bytes come back", async || served.uploads.free() == BUDGET).await;

    // B again, now within the budget.
    let mut b = served.tls().await;
    b.write_all(put_head("tmp/b", Some(512 << 10)).as_bytes())
        .await
        .expect("head");
    b.write_all(&vec![b'b'; 512 << 10]).await.expect("body");
    let answer = read_answer(&mut b).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let written = served.runtime.written.lock().map(|w| w.clone()).unwrap_or_default();
    assert_eq!(
        written,
        vec![("/tmp/a".to_string(), held), ("/tmp/b".to_string(), 512 << 10)]
    );
    assert_eq!(served.uploads.free(), BUDGET);
}

/// The agent's resident memory now (kB), from /proc.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// A reproduction that PRINTS figures (never asserts a size): eight callers each declare a
/// 64 MiB file and send 60 MB of it without finishing, against the default upload budget and
/// against one large enough for all eight (the agent before the budget). Run with
/// `cargo test -p smolvm-runtime --test node_api_bounds -- --ignored --nocapture rss_of_uploads`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints the agent's memory growth"]
async fn rss_of_uploads() {
    const DECLARED: usize = 64 << 20;
    const SENT: usize = 60_000_000;
    for (label, budget) in [
        ("no budget (before)", 16 * DECLARED),
        ("default budget", smolvm_runtime::nodeapi::uploads::DEFAULT_UPLOAD_BYTES),
    ] {
        let served = serve(NodeApiBounds::default(), budget);
        let before = rss_kib();
        let mut callers = Vec::new();
        for i in 0..8 {
            let mut stream = served.tls().await;
            callers.push(tokio::spawn(async move {
                let piece = vec![b'x'; 1 << 20];
                if stream
                    .write_all(put_head(&format!("tmp/big{i}"), Some(DECLARED)).as_bytes())
                    .await
                    .is_err()
                {
                    return (0, stream);
                }
                let mut sent = 0;
                while sent < SENT {
                    let n = piece.len().min(SENT - sent);
                    match tokio::time::timeout(Duration::from_secs(2), stream.write_all(&piece[..n])).await {
                        Ok(Ok(())) => sent += n,
                        _ => break,
                    }
                }
                (sent, stream)
            }));
        }
        let mut held = Vec::new();
        let mut delivered = 0;
        for caller in callers {
            let (sent, stream) = caller.await.expect("caller");
            if sent == SENT {
                delivered += 1;
            }
            held.push(stream);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let grown = rss_kib().saturating_sub(before) / 1024;
        println!(
            "{label}: {delivered} of 8 callers sent 60 MB; the process grew by {grown} MiB; budget free {} MiB",
            served.uploads.free() >> 20
        );
        drop(held);
        served.server.shutdown(Duration::from_secs(1)).await;
    }
}
