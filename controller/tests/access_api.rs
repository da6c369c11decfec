//! The access API (`subresources.vm.smolvm.dev`) served over real TLS, with real mTLS on both
//! of its sides: the API server's front proxy (a client certificate from a requestheader CA
//! made here) calls it, and it calls the node's real agent router over the node API's mTLS.
//! Two TEST DOUBLES stand in for what cannot run here: the Kubernetes API server
//! (`smolvm_testkit::apiserver`, answering the SubjectAccessReviews, the SmolVM and its
//! SmolVMNode) and, behind the agent, the runtime (`FilesDouble`: no guest boots on these
//! machines, so no real file can be copied).
//!
//! The memory reproduction (`rss_of_uploads`, ignored: it prints figures, it asserts none) runs
//! the access API in a child process of its own and prints that process's RSS growth while
//! eight uploads are under way.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use serde_json::{Value, json};
use smolvm_certs::{CertificateAuthority, ReloadableResolver, Validity};
use smolvm_controller::{
    access::{self, AccessState, frontproxy::RequestHeaderConfig, limits::Limits},
    metrics::Metrics,
    nodeclient::{BearerToken, ClientSettings, ClientTls, Endpoints, NodeClient, client_tls},
};
use smolvm_runtime::{
    nodeapi::tls::MtlsServer,
    vmm::{
        DeleteOutcome, ExecOutput, ExecRequest, FileContent, LogQuery, LogStream, Machine, MachineSpec, MachineState,
        RegistryAuth, ResizeRequest, Vmm, VmmError, VmmHealth,
    },
};
use smolvm_testkit::node::{NODE, Pki, TOKEN};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const NS: &str = "team-a";
const VM: &str = "web";
/// The user every role is granted to.
const ALICE: &str = "alice";
/// A user the SubjectAccessReview refuses.
const MALLORY: &str = "mallory";
/// The front proxy's certificate name, the one the API server allows.
const PROXY: &str = "front-proxy-client";
/// The access API's serving name.
const SERVER_NAME: &str = "smolvm-access.smolvm-system.svc";

fn files_path(path: &str) -> String {
    format!("/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/{NS}/smolvms/{VM}/files?path={path}")
}

fn log_path(query: &str) -> String {
    format!("/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/{NS}/smolvms/{VM}/log?{query}")
}

// ---------------------------------------------------------------------------------------------
// The runtime's TEST DOUBLE behind the agent.

/// TEST DOUBLE of the runtime for the files, exec and log routes: every machine runs; a write is
/// counted (the agent hands it over whole); a read gives [`READ_BYTES`] zero bytes; a command
/// echoes its stdin and exits 0; a followed log stays open without a line until its caller goes.
#[derive(Default)]
struct FilesDouble {
    written: AtomicU64,
    writes: AtomicUsize,
}

const READ_BYTES: usize = 4 << 20;

#[async_trait]
impl Vmm for FilesDouble {
    async fn health(&self) -> Result<VmmHealth, VmmError> {
        Err(VmmError::Unavailable {
            message: "test double".into(),
        })
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
        not_here()
    }
    async fn start(&self, _: &str, _: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        not_here()
    }
    async fn stop(&self, _: &str) -> Result<Machine, VmmError> {
        not_here()
    }
    async fn delete(&self, _: &str) -> Result<DeleteOutcome, VmmError> {
        not_here()
    }
    async fn resize(&self, _: &str, _: &ResizeRequest) -> Result<Machine, VmmError> {
        not_here()
    }
    async fn logs(&self, _: &str, query: &LogQuery) -> Result<LogStream, VmmError> {
        let first = futures::stream::once(async { Ok(Bytes::from_static(b"booted\n")) });
        if query.follow {
            Ok(first.chain(futures::stream::pending()).boxed())
        } else {
            Ok(first.boxed())
        }
    }
    async fn exec(&self, _: &str, request: &ExecRequest) -> Result<ExecOutput, VmmError> {
        Ok(ExecOutput {
            exit_code: 0,
            stdout: request.stdin.clone().unwrap_or_default().into_bytes(),
            stderr: Vec::new(),
        })
    }
    async fn read_file(&self, _: &str, _: &str, _: u64) -> Result<FileContent, VmmError> {
        let chunk = Bytes::from(vec![0u8; 64 << 10]);
        let stream = futures::stream::iter((0..READ_BYTES / chunk.len()).map(move |_| Ok(chunk.clone())));
        Ok(FileContent {
            directory: false,
            stream: stream.boxed(),
        })
    }
    async fn write_file(&self, _: &str, _: &str, _: Option<u32>, content: Bytes) -> Result<(), VmmError> {
        self.written.fetch_add(content.len() as u64, Ordering::SeqCst);
        self.writes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn not_here<T>() -> Result<T, VmmError> {
    Err(VmmError::BadRequest {
        message: "not part of this test double".into(),
    })
}

// ---------------------------------------------------------------------------------------------
// Certificates and the agent.

/// Every certificate of a run, in PEM (so that a child process can be handed them).
#[derive(serde::Serialize, serde::Deserialize, Clone)]
struct Material {
    front_proxy_ca: String,
    proxy_cert: String,
    proxy_key: String,
    /// From the requestheader CA, with a name the API server does not allow.
    stranger_cert: String,
    stranger_key: String,
    serving_ca: String,
    serving_cert: String,
    serving_key: String,
    runtime_ca: String,
    client_cert: String,
    client_key: String,
    agent_port: u16,
}

fn day() -> Validity {
    Validity::from_now(Duration::from_secs(86_400))
}

/// The agent's real router over mTLS, the double behind it; and the certificates.
fn agent(pki: &Pki, runtime: Arc<FilesDouble>) -> (MtlsServer, Material) {
    let server = pki.serve(Pki::node_api_state(runtime));
    let front = CertificateAuthority::generate("front-proxy-ca", day()).expect("front-proxy CA");
    let proxy = front.issue_client(PROXY, day()).expect("proxy cert");
    let stranger = front.issue_client("someone-else", day()).expect("stranger cert");
    let serving_ca = CertificateAuthority::generate("smolvm-access-ca", day()).expect("serving CA");
    let serving = serving_ca
        .issue_server(&[SERVER_NAME.to_string()], &[], day())
        .expect("serving cert");
    let material = Material {
        front_proxy_ca: front.cert_pem().to_string(),
        proxy_cert: proxy.cert_pem,
        proxy_key: proxy.key_pem,
        stranger_cert: stranger.cert_pem,
        stranger_key: stranger.key_pem,
        serving_ca: serving_ca.cert_pem().to_string(),
        serving_cert: serving.cert_pem,
        serving_key: serving.key_pem,
        runtime_ca: pki.ca.cert_pem().to_string(),
        client_cert: pki.client_cert.clone(),
        client_key: pki.client_key.clone(),
        agent_port: server.local_addr().port(),
    };
    (server, material)
}

// ---------------------------------------------------------------------------------------------
// The API server's TEST DOUBLE.

/// What the API server double saw: the SubjectAccessReviews asked so far.
struct Seen {
    reviews: tokio::sync::watch::Sender<usize>,
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            reviews: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Seen {
    fn reviews(&self) -> usize {
        *self.reviews.borrow()
    }

    /// Waits until `n` reviews in all have been asked.
    async fn reviewed(&self, n: usize) {
        let mut seen = self.reviews.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(30), seen.wait_for(|r| *r >= n)).await;
        assert!(waited.is_ok(), "no SubjectAccessReview #{n} within 30 s");
    }
}

/// A kube client whose API server is the double: SubjectAccessReviews allow [`ALICE`] only, the
/// SmolVM is bound to [`NODE`], whose SmolVMNode advertises the agent's port.
fn kube(agent_port: u16, seen: Arc<Seen>) -> kube::Client {
    let (client, handle) = smolvm_testkit::apiserver::client("default");
    smolvm_testkit::apiserver::serve_with(handle, move |method, path, body| {
        let seen = seen.clone();
        async move {
            let vm = format!("/apis/vm.smolvm.dev/v1alpha1/namespaces/{NS}/smolvms/{VM}");
            let node = format!("/apis/vm.smolvm.dev/v1alpha1/smolvmnodes/{NODE}");
            match (method.as_str(), path.as_str()) {
                ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews") => {
                    seen.reviews.send_modify(|n| *n += 1);
                    let mut review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let allowed = review["spec"]["user"] == ALICE;
                    review["status"] = json!({"allowed": allowed});
                    (201, review)
                }
                ("GET", p) if p == vm => {
                    let mut object = smolvm_api::fixtures::alpine();
                    object["metadata"] = json!({"name": VM, "namespace": NS, "uid": "files-1"});
                    object["status"] = json!({"phase": "Running", "nodeName": NODE});
                    (200, object)
                }
                ("GET", p) if p == node => (
                    200,
                    json!({
                        "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode",
                        "metadata": {"name": NODE},
                        "spec": {},
                        "status": {"endpoint": {"address": "127.0.0.1", "port": agent_port}},
                    }),
                ),
                _ => (
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
                ),
            }
        }
    });
    client
}

// ---------------------------------------------------------------------------------------------
// The access API.

/// Serves the access API on `listener` with `limits` until the runtime ends.
async fn serve_access(listener: std::net::TcpListener, m: &Material, kube: kube::Client, limits: Limits) {
    let requestheader = RequestHeaderConfig::from_configmap(&BTreeMap::from([
        ("requestheader-client-ca-file".to_string(), m.front_proxy_ca.clone()),
        ("requestheader-allowed-names".to_string(), json!([PROXY]).to_string()),
        (
            "requestheader-username-headers".to_string(),
            r#"["X-Remote-User"]"#.to_string(),
        ),
        (
            "requestheader-group-headers".to_string(),
            r#"["X-Remote-Group"]"#.to_string(),
        ),
        (
            "requestheader-extra-headers-prefix".to_string(),
            r#"["X-Remote-Extra-"]"#.to_string(),
        ),
    ]))
    .expect("requestheader");
    let resolver = Arc::new(ReloadableResolver::from_pem(&m.serving_cert, &m.serving_key).expect("serving"));
    let cert = Arc::new(ReloadableResolver::from_pem(&m.client_cert, &m.client_key).expect("client cert"));
    let nodes = NodeClient::new(
        ClientSettings::standard(
            ClientTls::new(client_tls(&m.runtime_ca, cert).expect("client TLS")),
            BearerToken::new(TOKEN),
        ),
        Endpoints::default(),
    );
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(
        access::server::tls_config(&resolver, &requestheader).expect("TLS config"),
    );
    let state = Arc::new(AccessState::new(
        kube,
        nodes,
        Arc::new(std::sync::RwLock::new(Arc::new(requestheader))),
        Arc::new(Metrics::default()),
        limits,
    ));
    access::serve(listener, state, tls, std::future::pending())
        .await
        .expect("serving");
}

/// A whole access API stack in this process: the agent, the API server double, the server.
struct Stack {
    _agent: MtlsServer,
    material: Material,
    port: u16,
    runtime: Arc<FilesDouble>,
    seen: Arc<Seen>,
}

async fn stack(limits: Limits) -> Stack {
    smolvm_testkit::node::init();
    let pki = Pki::new();
    let runtime = Arc::new(FilesDouble::default());
    let (agent, material) = agent(&pki, runtime.clone());
    let seen = Arc::new(Seen::default());
    let client = kube(material.agent_port, seen.clone());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let served = material.clone();
    tokio::spawn(async move { serve_access(listener, &served, client, limits).await });
    Stack {
        _agent: agent,
        material,
        port,
        runtime,
        seen,
    }
}

// ---------------------------------------------------------------------------------------------
// Clients.

/// Who a client connects as.
#[derive(Clone, Copy, Debug)]
enum As {
    /// No client certificate.
    Nobody,
    /// A certificate of the requestheader CA with a name the API server does not allow.
    Stranger,
    /// The front proxy.
    Proxy,
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// A TLS connection to the access API as `who` (HTTP/1.1).
async fn connect(m: &Material, port: u16, who: As) -> std::io::Result<Tls> {
    connect_from(m, port, who, loopback(1)).await
}

fn loopback(last: u8) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, last))
}

/// A TCP connection from `source` (one of this host's loopback addresses) to the access API.
async fn tcp_from(source: std::net::IpAddr, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(source, 0))?;
    socket.connect(std::net::SocketAddr::new(loopback(1), port)).await
}

/// As [`connect`], from `source`.
async fn connect_from(m: &Material, port: u16, who: As, source: std::net::IpAddr) -> std::io::Result<Tls> {
    let identity = match who {
        As::Nobody => None,
        As::Stranger => Some((m.stranger_cert.as_str(), m.stranger_key.as_str())),
        As::Proxy => Some((m.proxy_cert.as_str(), m.proxy_key.as_str())),
    };
    let config = smolvm_certs::client_config(&m.serving_ca, identity, &[b"http/1.1"]).map_err(std::io::Error::other)?;
    let tcp = tcp_from(source, port).await?;
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).map_err(std::io::Error::other)?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// A request head (HTTP/1.1), the user named by the front proxy's headers.
fn head(method: &str, path: &str, user: Option<&str>, content_length: Option<usize>) -> String {
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: smolvm-access\r\n");
    if let Some(user) = user {
        text.push_str(&format!(
            "X-Remote-User: {user}\r\nX-Remote-Group: system:authenticated\r\n"
        ));
    }
    if let Some(length) = content_length {
        text.push_str(&format!(
            "Content-Length: {length}\r\nContent-Type: application/octet-stream\r\n"
        ));
    }
    text.push_str("\r\n");
    text
}

/// An answer: status, headers (lower-cased names) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Reads one answer (Content-Length or chunked body; a body is read to its end or to EOF).
async fn read_answer<R: tokio::io::AsyncRead + Unpin>(reader: &mut R) -> std::io::Result<Answer> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = reader.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed before an answer",
            ));
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let text = String::from_utf8_lossy(&buffer[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {text:?}")))?;
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = buffer[end + 4..].to_vec();
    if let Some(length) = headers.get("content-length").and_then(|l| l.parse::<usize>().ok()) {
        while body.len() < length {
            let n = reader.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        body.truncate(length);
    } else if headers.get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        while !body.ends_with(b"0\r\n\r\n") {
            let n = reader.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        body = dechunk(&body);
    }
    Ok(Answer { status, headers, body })
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(at) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&raw[..at])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 || raw.len() < at + 2 + size {
            break;
        }
        out.extend_from_slice(&raw[at + 2..at + 2 + size]);
        raw = &raw[(at + 4 + size).min(raw.len())..];
    }
    out
}

/// How an upload went.
struct Upload {
    /// The answer's status, if one came.
    status: Option<u16>,
    /// Body bytes the client got to send.
    sent: usize,
    /// Why it stopped, if it failed.
    error: Option<String>,
    /// An unfinished upload's connection, kept open while this lives.
    _open: Option<tokio::io::WriteHalf<Tls>>,
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {:?}, {} bytes sent, error {:?}",
            self.status, self.sent, self.error
        )
    }
}

/// Uploads `total` zero bytes to a file as `user` on a connection as `who`; `finish`: send all
/// of it and read the answer, else send one byte less (or until an answer comes) and return
/// with the connection open.
async fn upload(m: &Material, port: u16, who: As, user: &str, total: usize, finish: bool) -> Upload {
    let stream = match connect(m, port, who).await {
        Ok(stream) => stream,
        Err(e) => {
            return Upload {
                status: None,
                sent: 0,
                error: Some(format!("connect: {e}")),
                _open: None,
            };
        }
    };
    let (mut reader, mut writer) = tokio::io::split(stream);
    let answered = tokio::spawn(async move { read_answer(&mut reader).await.map(|a| a.status) });
    let mut sent = 0usize;
    let mut error = None;
    let chunk = vec![0u8; 256 << 10];
    let goal = if finish { total } else { total - 1 };
    let send = async {
        writer
            .write_all(head("POST", &files_path("/tmp/upload"), Some(user), Some(total)).as_bytes())
            .await?;
        while sent < goal && !answered.is_finished() {
            let n = chunk.len().min(goal - sent);
            writer.write_all(&chunk[..n]).await?;
            sent += n;
        }
        writer.flush().await
    };
    if let Err(e) = send.await {
        error = Some(format!("sending: {e}"));
    }
    if !finish && !answered.is_finished() {
        answered.abort();
        return Upload {
            status: None,
            sent,
            error,
            _open: Some(writer),
        };
    }
    let status = match answered.await {
        Ok(Ok(status)) => Some(status),
        Ok(Err(e)) => {
            error.get_or_insert(format!("reading: {e}"));
            None
        }
        Err(e) => {
            error.get_or_insert(e.to_string());
            None
        }
    };
    Upload {
        status,
        sent,
        error,
        _open: None,
    }
}

/// Sends `head` (and no body) on a connection as `who` and reads the answer.
async fn ask(stack: &Stack, who: As, head: &str) -> std::io::Result<Answer> {
    let mut stream = connect(&stack.material, stack.port, who).await?;
    stream.write_all(head.as_bytes()).await?;
    stream.flush().await?;
    read_answer(&mut stream).await
}

/// The TLS alert a refused connection ended with.
fn alert_of(error: &std::io::Error) -> Option<rustls::AlertDescription> {
    match error.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::AlertReceived(alert) => Some(*alert),
        _ => None,
    }
}

const SIXTY_MB: usize = 60_000_000;

#[tokio::test]
async fn callers_other_than_the_front_proxy_are_refused_at_the_handshake() {
    let stack = stack(Limits::default()).await;
    let upload = head("POST", &files_path("/tmp/x"), Some(ALICE), Some(SIXTY_MB));
    let table = [
        (
            "no client certificate",
            As::Nobody,
            rustls::AlertDescription::CertificateRequired,
        ),
        (
            "a certificate of the requestheader CA with a name the API server does not allow",
            As::Stranger,
            rustls::AlertDescription::AccessDenied,
        ),
    ];
    for (what, who, alert) in table {
        // Only the headers of a 60 MB upload go out; no HTTP answer comes, the TLS alert does.
        let error = ask(&stack, who, &upload).await.expect_err(what);
        assert_eq!(alert_of(&error), Some(alert), "{what}: {error}");
    }
    assert_eq!(stack.seen.reviews(), 0, "nobody was authorized: nothing was read");
    assert_eq!(stack.runtime.writes.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn uploads_are_answered_before_their_body_until_authorized() {
    let stack = stack(Limits::default()).await;
    // Each request sends the headers of a 60 MB upload and nothing of its body: the answer
    // comes all the same.
    let table = [
        ("the front proxy named no user", None, 401, "Unauthorized", 0),
        ("a user RBAC refuses", Some(MALLORY), 403, "Forbidden", 1),
    ];
    for (what, user, code, reason, reviews) in table {
        let answer = ask(
            &stack,
            As::Proxy,
            &head("POST", &files_path("/tmp/x"), user, Some(SIXTY_MB)),
        )
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(answer.status, code, "{what}");
        let status = answer.json();
        assert_eq!(
            (
                status["kind"].as_str(),
                status["code"].as_u64(),
                status["reason"].as_str()
            ),
            (Some("Status"), Some(u64::from(code)), Some(reason)),
            "{what}: {status}"
        );
        assert_eq!(stack.seen.reviews(), reviews, "{what}");
    }
    // Authorized, but declared larger than a file may be: refused before its body too.
    let answer = ask(
        &stack,
        As::Proxy,
        &head("POST", &files_path("/tmp/x"), Some(ALICE), Some((64 << 20) + 1)),
    )
    .await
    .expect("too large");
    assert_eq!(
        (answer.status, answer.json()["reason"].as_str()),
        (413, Some("RequestEntityTooLarge"))
    );
    assert_eq!(
        stack.runtime.writes.load(Ordering::SeqCst),
        0,
        "no file reached the agent"
    );
}

#[tokio::test]
async fn an_authorized_copy_streams_through_to_the_agent_and_back() {
    let stack = stack(Limits::default()).await;
    let size = 8 << 20;
    let sent = upload(&stack.material, stack.port, As::Proxy, ALICE, size, true).await;
    assert_eq!(sent.status, Some(200), "{sent:?}");
    assert_eq!(stack.runtime.written.load(Ordering::SeqCst), size as u64);
    let answer = ask(
        &stack,
        As::Proxy,
        &head("GET", &files_path("/etc/hostname"), Some(ALICE), None),
    )
    .await
    .expect("read");
    assert_eq!((answer.status, answer.body.len()), (200, READ_BYTES));
}

#[tokio::test]
async fn an_exec_request_is_read_after_authorization_within_the_body_budget() {
    let stack = stack(Limits {
        body_budget: 1000,
        ..Limits::default()
    })
    .await;
    let exec = format!("/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/{NS}/smolvms/{VM}/exec");
    let body = json!({"command": ["cat"], "stdin": "hello"}).to_string();
    let request = |user: &str, length: usize| {
        head("POST", &exec, Some(user), Some(length)).replace("application/octet-stream", "application/json")
    };
    // A user RBAC refuses: answered before the request is sent.
    let answer = ask(&stack, As::Proxy, &request(MALLORY, body.len()))
        .await
        .expect("refused");
    assert_eq!(answer.status, 403);
    // Alice: read, passed to the agent, answered.
    let mut stream = connect(&stack.material, stack.port, As::Proxy).await.expect("connect");
    stream
        .write_all(format!("{}{body}", request(ALICE, body.len())).as_bytes())
        .await
        .expect("send");
    let answer = read_answer(&mut stream).await.expect("answer");
    assert_eq!(
        (answer.status, answer.json()["exitCode"].as_i64()),
        (200, Some(0)),
        "{answer:?}"
    );
    // A request larger than the replica's buffering budget (1000 bytes here), yet within the
    // exec limit: 429, before its body is read.
    let answer = ask(&stack, As::Proxy, &request(ALICE, 2000)).await.expect("shed");
    assert_eq!(
        (answer.status, answer.json()["reason"].as_str()),
        (429, Some("TooManyRequests"))
    );
    // Beyond the exec limit: 413 at once.
    let answer = ask(&stack, As::Proxy, &request(ALICE, (64 << 10) + 1))
        .await
        .expect("too large");
    assert_eq!(answer.status, 413);
}

/// 64 sockets from 127.0.0.2 that never start their handshake, then the front proxy from
/// 127.0.0.3: it gets its handshake and its answer.
#[tokio::test]
async fn silent_sockets_from_one_source_leave_another_source_its_handshake() {
    let stack = stack(Limits::default()).await;
    let mut silent = Vec::new();
    for _ in 0..64 {
        silent.push(tcp_from(loopback(2), stack.port).await.expect("silent"));
    }
    // The listener accepts in order: the silent sockets are taken before the proxy's.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let read = head("GET", &files_path("/etc/hostname"), Some(ALICE), None);
    let answered = async {
        let mut stream = connect_from(&stack.material, stack.port, As::Proxy, loopback(3)).await?;
        stream.write_all(read.as_bytes()).await?;
        stream.flush().await?;
        read_answer(&mut stream).await
    }
    .await;
    println!(
        "64 silent sockets from 127.0.0.2; the front proxy from 127.0.0.3: {:?}",
        answered.as_ref().map(|a| a.status)
    );
    assert_eq!(answered.expect("the front proxy is served").status, 200);
    drop(silent);
}

#[tokio::test]
async fn connections_beyond_the_handshakes_in_progress_are_closed_at_once() {
    let stack = stack(Limits {
        accept: smolvm_kit::accept::AcceptBounds {
            max_handshakes: 2,
            ..Limits::default().accept
        },
        ..Limits::default()
    })
    .await;
    // Two connections that never start their handshake hold both slots (each up to the
    // handshake timeout); until the server has taken them, a third may still get through.
    let silent = [
        tokio::net::TcpStream::connect(("127.0.0.1", stack.port))
            .await
            .expect("silent 1"),
        tokio::net::TcpStream::connect(("127.0.0.1", stack.port))
            .await
            .expect("silent 2"),
    ];
    let read = head("GET", &files_path("/etc/hostname"), Some(ALICE), None);
    let mut refused = false;
    for _ in 0..50 {
        match ask(&stack, As::Proxy, &read).await {
            Err(_) => {
                refused = true;
                break;
            }
            Ok(answer) => assert_eq!(answer.status, 200),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "a connection beyond the handshakes in progress was served");
    drop(silent);
    // The slots come back: the front proxy is served again.
    let mut served = false;
    for _ in 0..50 {
        if let Ok(answer) = ask(&stack, As::Proxy, &read).await {
            assert_eq!(answer.status, 200);
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "no connection served once the silent ones went");
}

#[tokio::test]
async fn one_user_at_their_share_is_shed_while_others_are_served() {
    let stack = stack(Limits {
        max_calls_per_user: 1,
        ..Limits::default()
    })
    .await;
    // Alice holds her one call: an upload whose body is still coming.
    let mut first = connect(&stack.material, stack.port, As::Proxy).await.expect("connect");
    first
        .write_all(head("POST", &files_path("/tmp/x"), Some(ALICE), Some(2000)).as_bytes())
        .await
        .expect("head");
    first.flush().await.expect("flush");
    stack.seen.reviewed(1).await;
    let read = |user| head("GET", &files_path("/etc/hostname"), Some(user), None);
    let shed = ask(&stack, As::Proxy, &read(ALICE)).await.expect("alice again");
    assert_eq!(
        (
            shed.status,
            shed.json()["reason"].as_str(),
            shed.headers.get("retry-after").map(String::as_str)
        ),
        (429, Some("TooManyRequests"), Some("1"))
    );
    // Another user is not held back by Alice: their call goes on to be authorized (and refused
    // by RBAC, which is this test's double's answer for anyone but Alice).
    let other = ask(&stack, As::Proxy, &read(MALLORY)).await.expect("mallory");
    assert_eq!(other.status, 403);
    assert_eq!(stack.seen.reviews(), 2, "Alice's second call was never authorized");
    first.write_all(&[0u8; 2000]).await.expect("the body");
    first.flush().await.expect("flush");
    assert_eq!(read_answer(&mut first).await.expect("answer").status, 200);
    drop(first);
    let again = ask(&stack, As::Proxy, &read(ALICE)).await.expect("alice after");
    assert_eq!(again.status, 200, "her share came back");
}

#[tokio::test]
async fn a_body_that_stops_coming_is_answered_408() {
    let stack = stack(Limits {
        body_idle_timeout: Duration::from_secs(1),
        ..Limits::default()
    })
    .await;
    let mut stream = connect(&stack.material, stack.port, As::Proxy).await.expect("connect");
    stream
        .write_all(head("POST", &files_path("/tmp/x"), Some(ALICE), Some(1 << 20)).as_bytes())
        .await
        .expect("head");
    stream.write_all(&[0u8; 1000]).await.expect("some of the body");
    stream.flush().await.expect("flush");
    let answer = read_answer(&mut stream).await.expect("an answer");
    assert_eq!(
        (answer.status, answer.json()["reason"].as_str()),
        (408, Some("Timeout"))
    );
    assert_eq!(
        stack.runtime.writes.load(Ordering::SeqCst),
        0,
        "the agent got no half file"
    );
}

#[tokio::test]
async fn a_replica_at_its_limit_sheds_with_429_and_retry_after() {
    let stack = stack(Limits {
        max_calls: 1,
        max_streams: 1,
        ..Limits::default()
    })
    .await;
    let shed = |answer: &Answer, what: &str| {
        assert_eq!(answer.status, 429, "{what}");
        assert_eq!(
            answer.headers.get("retry-after").map(String::as_str),
            Some("1"),
            "{what}"
        );
        let status = answer.json();
        assert_eq!(
            (
                status["kind"].as_str(),
                status["reason"].as_str(),
                status["code"].as_u64(),
                status["details"]["retryAfterSeconds"].as_u64()
            ),
            (Some("Status"), Some("TooManyRequests"), Some(429), Some(1)),
            "{what}: {status}"
        );
    };
    // One call in flight: an upload whose body is still coming (it was authorized, so its
    // slot is taken).
    let mut first = connect(&stack.material, stack.port, As::Proxy).await.expect("connect");
    first
        .write_all(head("POST", &files_path("/tmp/x"), Some(ALICE), Some(2000)).as_bytes())
        .await
        .expect("head");
    first.write_all(&[0u8; 1000]).await.expect("half the body");
    first.flush().await.expect("flush");
    stack.seen.reviewed(1).await;
    let read = head("GET", &files_path("/etc/hostname"), Some(ALICE), None);
    shed(
        &ask(&stack, As::Proxy, &read).await.expect("a second call"),
        "a second call",
    );
    // Sessions have slots of their own.
    let mut follow = connect(&stack.material, stack.port, As::Proxy).await.expect("connect");
    follow
        .write_all(head("GET", &log_path("follow=true"), Some(ALICE), None).as_bytes())
        .await
        .expect("follow");
    let mut line = [0u8; 256];
    let n = follow.read(&mut line).await.expect("the followed log's first bytes");
    assert!(
        String::from_utf8_lossy(&line[..n]).starts_with("HTTP/1.1 200"),
        "a followed log is served"
    );
    let again = ask(
        &stack,
        As::Proxy,
        &head("GET", &log_path("follow=true"), Some(ALICE), None),
    )
    .await
    .expect("a second session");
    shed(&again, "a second followed log");
    assert_eq!(stack.seen.reviews(), 2, "a shed request is never authorized");
    // The upload ends: its slot comes back.
    first.write_all(&[0u8; 1000]).await.expect("the rest");
    first.flush().await.expect("flush");
    let done = read_answer(&mut first).await.expect("the upload's answer");
    assert_eq!(done.status, 200);
    drop(first);
    drop(follow);
    let answer = ask(&stack, As::Proxy, &read).await.expect("a call after");
    assert_eq!(answer.status, 200, "the slot came back");
}

// ---------------------------------------------------------------------------------------------
// The memory reproduction: the access API in a process of its own, its RSS read from /proc.

const CHILD_ENV: &str = "SMOLVM_ACCESS_RSS_CHILD";

/// The child's side of [`rss_of_uploads`]: with `SMOLVM_ACCESS_RSS_CHILD` naming a file of
/// [`Material`], serves the access API (the API server double in process) and prints its port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of rss_of_uploads"]
async fn access_api_process() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    smolvm_testkit::node::init();
    let material: Material = serde_json::from_slice(&std::fs::read(path).expect("material")).expect("material json");
    let client = kube(material.agent_port, Arc::new(Seen::default()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    println!("ACCESS_PORT={}", listener.local_addr().expect("address").port());
    serve_access(listener, &material, client, Limits::default()).await;
}

fn proc_status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resets the process's peak RSS (VmHWM) to its current RSS.
fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// The access API in a child process (this test binary again, running
/// [`access_api_process`]): the child, its pid and its port.
async fn access_api_child(material: &std::path::Path) -> (tokio::process::Child, u32, u16) {
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "access_api_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, material)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("child");
    let pid = child.id().expect("pid");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout"));
    let port = loop {
        let mut line = String::new();
        let n = tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut line)
            .await
            .expect("child output");
        assert!(n > 0, "the child ended without serving");
        // libtest prints the test's name on the same line first.
        if let Some((_, port)) = line.trim().split_once("ACCESS_PORT=") {
            break port.parse::<u16>().expect("port");
        }
    };
    (child, pid, port)
}

/// Prints the access API process's RSS growth (its peak during the scenario minus its RSS
/// before, each scenario in a fresh process after one warm-up copy) for eight unauthenticated
/// 60 MB uploads that never finish, eight 60 MB uploads of a user the SubjectAccessReview
/// refuses, and eight authorized 64 MiB copies at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a reproduction that prints memory figures: cargo test -p smolvm-controller --test access_api -- --ignored --nocapture rss_of_uploads"]
async fn rss_of_uploads() {
    smolvm_testkit::node::init();
    let pki = Pki::new();
    let runtime = Arc::new(FilesDouble::default());
    let (_agent, material) = agent(&pki, runtime.clone());
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("material.json");
    std::fs::write(&file, serde_json::to_vec(&material).expect("json")).expect("write");

    const UPLOADS: usize = 8;
    let scenarios: [(&str, As, &str, usize, bool); 3] = [
        (
            "unauthenticated 60 MB uploads (no client certificate), never finished",
            As::Nobody,
            ALICE,
            60_000_000,
            false,
        ),
        (
            "60 MB uploads of a user RBAC refuses (front proxy), never finished",
            As::Proxy,
            MALLORY,
            60_000_000,
            false,
        ),
        (
            "authorized 64 MiB copies at once (front proxy, alice)",
            As::Proxy,
            ALICE,
            64 << 20,
            true,
        ),
    ];
    println!("access API process RSS growth, {UPLOADS} clients at once:");
    for (what, who, user, size, finish) in scenarios {
        let (mut child, pid, port) = access_api_child(&file).await;
        // Warm up: one authorized copy, so that pools and caches exist before measuring.
        let warm = upload(&material, port, As::Proxy, ALICE, 1 << 20, true).await;
        assert_eq!(warm.status, Some(200), "warm-up copy: {warm:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        reset_peak(pid);
        let before = proc_status_kib(pid, "VmRSS:");
        let mut clients = Vec::new();
        for _ in 0..UPLOADS {
            let m = material.clone();
            clients.push(tokio::spawn(
                async move { upload(&m, port, who, user, size, finish).await },
            ));
        }
        // Every client has sent what it will send (unfinished ones keep their connection open):
        // whatever the server keeps of them is in its peak now.
        let mut outcomes = Vec::new();
        for client in clients {
            outcomes.push(client.await.expect("client"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let peak = proc_status_kib(pid, "VmHWM:");
        let answers: Vec<String> = outcomes
            .iter()
            .map(|o| match (o.status, &o.error) {
                (Some(status), _) => status.to_string(),
                (None, Some(error)) => format!("refused after {} bytes: {error}", o.sent),
                (None, None) => format!("none yet, {} bytes sent", o.sent),
            })
            .collect();
        println!(
            "  {what}: RSS {:.0} MiB, peak {:.0} MiB: growth {:.0} MiB",
            before as f64 / 1024.0,
            peak as f64 / 1024.0,
            peak.saturating_sub(before) as f64 / 1024.0,
        );
        println!("    answers: {answers:?}");
        drop(outcomes);
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    println!(
        "  (the agent's double received {} writes, {} MiB in all)",
        runtime.writes.load(Ordering::SeqCst),
        runtime.written.load(Ordering::SeqCst) >> 20
    );
}
