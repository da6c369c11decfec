//! The node side, all real: finding smolvm, a test PKI, an mTLS node API client and an
//! in-process runtime agent running a real `smolvm serve`. Used by the runtime's and the
//! controller's integration tests and the node API benchmark.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use smolvm_certs::{CertificateAuthority, LeafUsage, ReloadableResolver, Validity};
use smolvm_runtime::agent::{Agent, AgentOptions, ClientCa};
use smolvm_runtime::nodeapi::auth::TokenAuth;
use smolvm_runtime::supervisor::{SpawnConfig, SupervisorConfig};
use tokio_rustls::TlsConnector;

pub const NODE: &str = "node-a";
pub const TOKEN: &str = "test-token-0123456789";

/// The smolvm binary and the environment `smolvm serve` needs.
#[derive(Debug, Clone)]
pub struct SmolvmInstall {
    pub bin: PathBuf,
    pub env: Vec<(String, String)>,
}

/// Finds (or installs, once per test binary) smolvm. `Err` is the reason to skip.
///
/// With `SMOLVM_REQUIRE_SMOLVM` set (CI sets it), smolvm missing fails the test that asks, as
/// promtool's tests do with `SMOLVM_REQUIRE_PROMTOOL`: a CI run whose smolvm install failed is
/// never green with its smolvm tests skipped.
pub fn smolvm_install() -> Result<SmolvmInstall, String> {
    static INSTALL: OnceLock<Result<SmolvmInstall, String>> = OnceLock::new();
    let install = INSTALL.get_or_init(locate_smolvm).clone();
    if let Err(reason) = &install {
        assert!(
            std::env::var_os("SMOLVM_REQUIRE_SMOLVM").is_none(),
            "SMOLVM_REQUIRE_SMOLVM is set and smolvm is unavailable: {reason} (.ci/install-smolvm.sh installs it)"
        );
    }
    install
}

fn locate_smolvm() -> Result<SmolvmInstall, String> {
    const VARS: [&str; 4] = [
        "SMOLVM_BIN",
        "SMOLVM_LIB_DIR",
        "SMOLVM_AGENT_ROOTFS_TAR",
        "SMOLVM_BOOT_BINARY",
    ];
    let mut vars: Vec<(String, String)> = VARS
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|value| (name.to_string(), value)))
        .collect();
    if !vars.iter().any(|(name, _)| name == "SMOLVM_BIN") {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/install-smolvm.sh");
        if !script.exists() {
            return Err(format!("SMOLVM_BIN is unset and {} is missing", script.display()));
        }
        eprintln!("SMOLVM_BIN unset; running {}", script.display());
        let output = std::process::Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .output()
            .map_err(|error| format!("cannot run {}: {error}", script.display()))?;
        if !output.status.success() {
            return Err(format!(
                "{} failed ({}): {}",
                script.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        vars = parse_exports(&String::from_utf8_lossy(&output.stdout))?;
    }
    let bin = vars
        .iter()
        .find(|(name, _)| name == "SMOLVM_BIN")
        .map(|(_, value)| PathBuf::from(value))
        .ok_or("the install script printed no SMOLVM_BIN")?;
    if !bin.is_file() {
        return Err(format!("SMOLVM_BIN {} is not a file", bin.display()));
    }
    let env = vars
        .into_iter()
        .filter(|(name, _)| VARS[1..].contains(&name.as_str()))
        .collect();
    Ok(SmolvmInstall { bin, env })
}

/// Reads `export NAME=VALUE` lines (values as bash's `printf %q` writes plain paths).
pub fn parse_exports(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut vars = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("export ") else {
            continue;
        };
        let Some((name, value)) = rest.split_once('=') else {
            return Err(format!("unreadable line from the install script: {line}"));
        };
        if value.starts_with("$'") {
            return Err(format!("cannot read the quoted value in: {line}"));
        }
        let mut unquoted = String::new();
        let mut chars = value.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => unquoted.extend(chars.next()),
                '\'' | '"' => {}
                c => unquoted.push(c),
            }
        }
        vars.push((name.to_string(), unquoted));
    }
    Ok(vars)
}

pub fn free_port() -> u16 {
    match listen_port() {
        Ok(port) => port,
        Err(error) => panic!("no free port: {error}"),
    }
}

/// A loopback TCP port for a test's server to listen on later, free now, chosen below the
/// kernel's ephemeral range and outside the default policy's excluded host ports.
///
/// A port the kernel hands out for `bind(:0)` comes from the ephemeral range, which outgoing
/// connections draw their source ports from as well: between this function letting it go and
/// the server binding it, any connection may take it (a CI run once lost smolvm's guest rollout
/// port that way). Below the range only another listener can, and ports handed out here are
/// never handed out twice in one process.
pub fn listen_port() -> std::io::Result<u16> {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    static DRAW: AtomicU64 = AtomicU64::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|l| l.parse::<u16>().ok()))
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    let random = std::collections::hash_map::RandomState::new();
    for _ in 0..1000 {
        let draw = random.hash_one(DRAW.fetch_add(1, Ordering::Relaxed));
        let port = low + u16::try_from(draw % u64::from(high - low)).unwrap_or(0);
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
        // Never a port the default policy excludes (the node's services, the NodePort range,
        // the agent's own): an agent or webhook would refuse a VM that publishes it.
        if handed_out.contains(&port) || smolvm_api::Policy::default().excluded_host_port(port.into()).is_some() {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.push(port);
            return Ok(port);
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
}

pub fn init() {
    smolvm_runtime::install_crypto_provider();
}

/// A runtime CA with a serving certificate for [`NODE`] obtained the way the agent does (key
/// generated here, CSR signed by the CA) and a controller client certificate.
pub struct Pki {
    pub ca: CertificateAuthority,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl Pki {
    pub fn new() -> Self {
        let day = Validity::from_now(Duration::from_secs(86_400));
        let ca = CertificateAuthority::generate("smolvm-runtime-ca", day).expect("CA");
        let (server_cert, server_key) = Self::serving_pair(&ca, NODE);
        let client = ca.issue_client("smolvm-controller", day).expect("client cert");
        Self {
            ca,
            server_cert,
            server_key,
            client_cert: client.cert_pem.clone(),
            client_key: client.key_pem.clone(),
        }
    }

    /// A serving pair through a CSR, as the agent obtains it (the controller's signer comes later).
    pub fn serving_pair(ca: &CertificateAuthority, node: &str) -> (String, String) {
        let key = smolvm_certs::generate_key_pair().expect("key");
        let csr = smolvm_certs::build_csr(
            &key,
            &smolvm_certs::runtime_server_name(node),
            &smolvm_certs::runtime_serving_sans(node),
        )
        .expect("csr");
        let cert = ca
            .sign_csr(csr, Validity::from_now(Duration::from_secs(86_400)), LeafUsage::Server)
            .expect("sign");
        (cert, key)
    }

    /// The node API state of a test agent on [`NODE`] with [`TOKEN`], in front of `runtime`.
    pub fn node_api_state(runtime: Arc<dyn smolvm_runtime::vmm::Vmm>) -> smolvm_runtime::nodeapi::NodeApiState {
        smolvm_runtime::nodeapi::NodeApiState::new(
            runtime,
            TokenAuth::fixed(TOKEN).expect("token"),
            smolvm_runtime::nodeapi::Identity::new(NODE),
            Arc::new(smolvm_runtime::metrics::Metrics::default()),
            None,
        )
    }

    /// The agent's real router for `state`, over mTLS with this PKI's serving pair, on a free
    /// loopback port.
    pub fn serve(&self, state: smolvm_runtime::nodeapi::NodeApiState) -> smolvm_runtime::nodeapi::tls::MtlsServer {
        let resolver = Arc::new(ReloadableResolver::from_pem(&self.server_cert, &self.server_key).expect("resolver"));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        smolvm_runtime::nodeapi::tls::MtlsServer::start(
            listener,
            smolvm_runtime::nodeapi::router(state),
            resolver,
            self.ca.cert_pem(),
        )
        .expect("serve")
    }

    pub fn client_tls(&self) -> Arc<rustls::ClientConfig> {
        Arc::new(
            smolvm_certs::client_config(
                self.ca.cert_pem(),
                Some((&self.client_cert, &self.client_key)),
                &[b"http/1.1"],
            )
            .expect("client config"),
        )
    }
}

/// An error with its sources, `: `-separated.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// An HTTP/1.1 keep-alive connection to the node API over mTLS.
pub struct NodeClient {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    task: tokio::task::JoinHandle<()>,
    pub token: Option<String>,
}

impl Drop for NodeClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A temporary directory for one test, its name starting with `prefix`.
pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().expect("temp dir")
}

/// `answer` is the node API's JSON error of `status` with the stable `code` and a message.
pub fn assert_error(answer: &Answer, status: u16, code: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    assert_eq!(answer.content_type.as_deref(), Some("application/json"), "{answer:?}");
    assert_eq!(answer.body["code"], code, "{answer:?}");
    assert!(
        answer.body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{answer:?}"
    );
}

/// What a node API call answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: serde_json::Value,
    pub raw: Bytes,
}

impl NodeClient {
    /// Connects and completes the TLS handshake; `Err` carries the TLS or I/O error text.
    pub async fn connect(
        addr: SocketAddr,
        server_name: &str,
        tls: Arc<rustls::ClientConfig>,
        token: Option<&str>,
    ) -> Result<Self, String> {
        let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).map_err(|e| e.to_string())?;
        let stream = TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self {
            sender,
            task,
            token: token.map(str::to_string),
        })
    }

    /// Sends raw bytes; `Err` is the transport error text.
    pub async fn send_raw(&mut self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Answer, String> {
        let mut builder = Request::builder().method(method).uri(path).header("host", "node");
        if let Some(token) = &self.token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        if body.is_some() {
            builder = builder.header("content-type", "application/json");
        }
        let request = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let response = self.sender.send_request(request).await.map_err(|e| error_chain(&e))?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let raw = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let body = serde_json::from_slice(&raw).unwrap_or(serde_json::Value::Null);
        Ok(Answer {
            status,
            content_type,
            body,
            raw,
        })
    }

    pub async fn call(&mut self, method: &str, path: &str, body: Option<serde_json::Value>) -> Answer {
        let bytes = body.map(|b| serde_json::to_vec(&b).expect("json"));
        match self.send_raw(method, path, bytes).await {
            Ok(answer) => answer,
            Err(error) => panic!("{method} {path}: {error}"),
        }
    }
}

/// The agent under test with its private directories.
pub struct TestAgent {
    pub agent: Agent,
    pub pki: Arc<Pki>,
    pub dir: PathBuf,
    pub token_file: PathBuf,
}

impl TestAgent {
    /// Starts an agent supervising a real `smolvm serve` with state under `dir`, or `None`
    /// (after printing `skipped: …`) when smolvm is unavailable.
    pub async fn with_smolvm(test: &str, dir: &Path, pki: Arc<Pki>) -> Option<Self> {
        let spawn = smolvm_spawn_config(test, dir)?;
        Some(Self::with_spawn(test, dir, pki, spawn).await)
    }

    /// As [`TestAgent::with_smolvm`], with machines' volumes as `volumes` says (the release
    /// hook on its listener).
    pub async fn with_smolvm_volumes(
        test: &str,
        dir: &Path,
        pki: Arc<Pki>,
        volumes: smolvm_runtime::volumes::VolumeOptions,
    ) -> Option<Self> {
        let spawn = smolvm_spawn_config(test, dir)?;
        Some(Self::spawned(test, dir, pki, spawn, volumes).await)
    }

    /// Starts an agent that supervises `smolvm serve` as `spawn` says, on `dir/run/smolvm.sock`.
    pub async fn with_spawn(test: &str, dir: &Path, pki: Arc<Pki>, spawn: SpawnConfig) -> Self {
        Self::spawned(test, dir, pki, spawn, Default::default()).await
    }

    async fn spawned(
        test: &str,
        dir: &Path,
        pki: Arc<Pki>,
        spawn: SpawnConfig,
        volumes: smolvm_runtime::volumes::VolumeOptions,
    ) -> Self {
        let mut supervisor = SupervisorConfig::new(smolvm_socket(dir), Some(spawn));
        supervisor.health_interval = Duration::from_millis(300);
        supervisor.backoff_initial = Duration::from_millis(200);
        supervisor.stop_grace = Duration::from_secs(5);
        let agent = Self::start(dir, pki, supervisor, Some(dir.join("images")), volumes).await;
        if agent
            .agent
            .supervisor()
            .wait_ready(1, Duration::from_secs(60))
            .await
            .is_none()
        {
            panic!("{test}: smolvm serve never became ready; log:\n{}", agent.log());
        }
        agent
    }

    /// A [`crate::smolvm_double::SmolvmDouble`] on a socket under `dir` and an agent attached to
    /// it, its state under `dir/agent`, with a test PKI of its own.
    pub async fn on_double(dir: &Path) -> (crate::smolvm_double::DoubleHandle, Self) {
        let double = crate::smolvm_double::SmolvmDouble::start(dir.join("double.sock"))
            .await
            .expect("double");
        let agent = Self::attached(&dir.join("agent"), Arc::new(Pki::new()), double.socket()).await;
        (double, agent)
    }

    /// Starts an agent attached to a runtime already serving on `socket` (such as
    /// [`crate::smolvm_double::SmolvmDouble`]), as `--attach-socket` does, with its state under
    /// `dir`; waits until the runtime answered.
    pub async fn attached(dir: &Path, pki: Arc<Pki>, socket: &Path) -> Self {
        Self::attached_with_volumes(dir, pki, socket, Default::default()).await
    }

    /// As [`TestAgent::attached`], with machines' volumes as `volumes` says (the release hook
    /// on its listener).
    pub async fn attached_with_volumes(
        dir: &Path,
        pki: Arc<Pki>,
        socket: &Path,
        volumes: smolvm_runtime::volumes::VolumeOptions,
    ) -> Self {
        std::fs::create_dir_all(dir).expect("agent dir");
        let mut supervisor = SupervisorConfig::new(socket.to_path_buf(), None);
        supervisor.health_interval = Duration::from_millis(100);
        let agent = Self::start(dir, pki, supervisor, None, volumes).await;
        if agent
            .agent
            .supervisor()
            .wait_ready(1, Duration::from_secs(10))
            .await
            .is_none()
        {
            panic!("the runtime on {} never answered", socket.display());
        }
        agent
    }

    /// Starts an agent attached to a socket nobody serves (for tests that need no smolvm).
    pub async fn without_smolvm(dir: &Path, pki: Arc<Pki>) -> Self {
        let mut supervisor = SupervisorConfig::new(dir.join("absent.sock"), None);
        supervisor.health_interval = Duration::from_millis(200);
        Self::start(dir, pki, supervisor, None, Default::default()).await
    }

    async fn start(
        dir: &Path,
        pki: Arc<Pki>,
        supervisor: SupervisorConfig,
        images: Option<PathBuf>,
        volumes: smolvm_runtime::volumes::VolumeOptions,
    ) -> Self {
        let token_file = dir.join("token");
        if !token_file.exists() {
            std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
        }
        let (auth, _watch) = TokenAuth::from_file(token_file.clone(), Duration::from_millis(100)).expect("token");
        let resolver = Arc::new(ReloadableResolver::from_pem(&pki.server_cert, &pki.server_key).expect("resolver"));
        let agent = Agent::start_with(
            AgentOptions {
                node_name: NODE.into(),
                supervisor,
                local_image_dir: images,
                node_api_listener: std::net::TcpListener::bind("127.0.0.1:0").expect("bind"),
                ops_listener: Some(std::net::TcpListener::bind("127.0.0.1:0").expect("bind")),
                resolver,
                serving_files: None,
                client_ca: ClientCa::Pem(pki.ca.cert_pem().to_string()),
                auth,
                file_poll_interval: Duration::from_millis(100),
                pool_keep_interval: Duration::from_millis(500),
                workload_records: Some(dir.join("workloads")),
                publish_address: None,
                guards: smolvm_runtime::guards::GuardOptions {
                    image_records: Some(dir.join("image-records")),
                    ..Default::default()
                },
                limits: Default::default(),
            },
            volumes,
        )
        .await
        .expect("agent starts");
        Self {
            agent,
            pki,
            dir: dir.to_path_buf(),
            token_file,
        }
    }

    pub async fn client(&self) -> NodeClient {
        NodeClient::connect(
            self.agent.node_api_addr(),
            &smolvm_certs::runtime_server_name(NODE),
            self.pki.client_tls(),
            Some(TOKEN),
        )
        .await
        .expect("connect to the node API")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// `GET /v1/holders/release` on the agent's release hook with `token` in its header (none
    /// when `None`): the status and the JSON body.
    pub async fn release(&self, token: Option<&str>) -> (u16, serde_json::Value) {
        let addr = self.agent.release_addr().expect("the agent serves a release hook");
        release_call(addr, token).await
    }

    /// Opens an interactive exec (`GET path` upgraded to a WebSocket, offering the channel
    /// subprotocols) over mTLS with the token. `Err`: the answer before any upgrade, its status
    /// and JSON body.
    pub async fn exec_session(&self, path: &str) -> Result<ExecSocket, (u16, serde_json::Value)> {
        use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};
        let server_name = smolvm_certs::runtime_server_name(NODE);
        let mut request = format!("wss://{server_name}{path}")
            .into_client_request()
            .expect("request");
        let headers = request.headers_mut();
        headers.insert(
            "sec-websocket-protocol",
            http::HeaderValue::from_static("v5.channel.k8s.io, v4.channel.k8s.io"),
        );
        headers.insert(
            "authorization",
            http::HeaderValue::from_str(&format!("Bearer {TOKEN}")).expect("header"),
        );
        let tcp = tokio::net::TcpStream::connect(self.agent.node_api_addr())
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from(server_name).expect("server name");
        let tls = TlsConnector::from(self.pki.client_tls())
            .connect(name, tcp)
            .await
            .expect("TLS handshake");
        match tokio_tungstenite::client_async(request, tls).await {
            Ok((socket, _)) => Ok(socket),
            Err(tungstenite::Error::Http(response)) => {
                let body = response.body().as_deref().unwrap_or_default();
                Err((
                    response.status().as_u16(),
                    serde_json::from_slice(body).unwrap_or(serde_json::Value::Null),
                ))
            }
            Err(other) => panic!("interactive exec {path}: {other}"),
        }
    }
}

/// An interactive exec session on the node API.
pub type ExecSocket = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// A plain HTTP GET (ops port); returns status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
        .await
        .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = Request::builder()
        .uri(path)
        .header("host", "ops")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let response = sender.send_request(request).await.expect("send");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.expect("body").to_bytes();
    task.abort();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `GET /v1/holders/release` on a release hook at `addr`, with `token` in its header (none when
/// `None`), as a holder's preStop hook calls it: the status and the JSON body.
pub async fn release_call(addr: SocketAddr, token: Option<&str>) -> (u16, serde_json::Value) {
    use smolvm_api::constants::volumes::{RELEASE_PATH, RELEASE_TOKEN_HEADER};
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the release hook");
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
        .await
        .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = Request::builder().uri(RELEASE_PATH).header("host", "127.0.0.1");
    if let Some(token) = token {
        request = request.header(RELEASE_TOKEN_HEADER, token);
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::new())).expect("request"))
        .await
        .expect("send");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.expect("body").to_bytes();
    task.abort();
    (status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
}

/// The socket the test agents' `smolvm serve` listens on.
pub fn smolvm_socket(dir: &Path) -> PathBuf {
    dir.join("run/smolvm.sock")
}

/// How the test agents start `smolvm serve` under `dir`; `None` (after printing why) when smolvm
/// is not installed.
pub fn smolvm_spawn_config(test: &str, dir: &Path) -> Option<SpawnConfig> {
    let install = match smolvm_install() {
        Ok(install) => install,
        Err(reason) => {
            println!("skipped: {test}: smolvm unavailable: {reason}");
            return None;
        }
    };
    let mut env = install.env.clone();
    // Tests run as root and /dev/kvm is 0600: VMs cannot run under per-VM uids.
    env.push(("SMOLVM_VM_UID_DROP".into(), "off".into()));
    Some(SpawnConfig {
        bin: install.bin.clone(),
        state_dir: dir.join("state"),
        local_image_dir: dir.join("images"),
        guest_rollout_port: free_port(),
        env,
        log_file: Some(dir.join("serve.log")),
    })
}

/// A start failure's message as it leaves the agent: smolvm's cause is there, with no escape or
/// control characters and no log timestamp.
pub fn assert_cleaned_cause(message: &str) {
    assert!(!message.trim().is_empty(), "the cause is carried: {message:?}");
    assert!(
        !message.chars().any(char::is_control),
        "no control characters: {message:?}"
    );
    assert!(
        !message
            .split_whitespace()
            .any(|w| w.len() >= 19 && w.as_bytes()[4] == b'-' && w.as_bytes()[10] == b'T'),
        "no log timestamp: {message:?}"
    );
}
