//! The controller's client of the runtime agents' node API: mTLS with the controller's client
//! certificate, the bearer token, pooled connections per node, and per-call timeouts.
//!
//! Every path and method comes from the contract's table ([`Operation`]); requests are
//! addressed to `https://<node><path>`. The connector resolves `<node>` to the
//! endpoint its SmolVMNode advertises, and verifies that the server's certificate names that
//! node's runtime (`<node>.runtime.vm.smolvm.dev`, see [`smolvm_certs::runtime_server_name`]), so
//! a stale or hijacked endpoint can never impersonate another node.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Arc, RwLock},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::{
    client::legacy::{
        Client,
        connect::{Connected, Connection},
    },
    rt::{TokioExecutor, TokioIo},
};
use rustls::{ClientConfig, pki_types::ServerName};
use serde::{Serialize, de::DeserializeOwned};
use smolvm_api::nodeapi::{
    self, DeleteResponse, ErrorCode, HealthResponse, IdentityResponse, JsonCall, LeaseRequest, MachineSpec,
    MachineStatus, NodeApiError, Operation, PoolSpec, PoolStatus, RegistryAuth, ResizeSpec, StartRequest, VolumeMounts,
    calls,
};
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};

/// Largest response body read from a node.
const MAX_BODY: usize = 4 << 20;

/// Why a node API call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The node could not be reached (no endpoint, connect or TLS failure, timeout).
    #[error("node {node} is unreachable: {message}")]
    Unreachable {
        /// Node name.
        node: String,
        /// What happened.
        message: String,
    },
    /// The node answered with an error body.
    #[error("node {node} answered {status} {code}: {message}")]
    Api {
        /// Node name.
        node: String,
        /// HTTP status.
        status: u16,
        /// The stable code.
        code: ErrorCode,
        /// The node's message (smolvm's own text for runtime failures).
        message: String,
        /// Structured details.
        details: Option<serde_json::Value>,
    },
    /// The node answered something this client cannot read.
    #[error("node {node} answered unreadably: {message}")]
    Protocol {
        /// Node name.
        node: String,
        /// What was wrong.
        message: String,
    },
}

impl CallError {
    /// [`CallError::Unreachable`] for `node`.
    fn unreachable(node: &str, message: String) -> Self {
        CallError::Unreachable {
            node: node.to_string(),
            message,
        }
    }

    /// [`CallError::Protocol`] for `node`.
    fn protocol(node: &str, message: String) -> Self {
        CallError::Protocol {
            node: node.to_string(),
            message,
        }
    }

    /// Whether the failure means the runtime could not be reached (as opposed to a refusal).
    pub fn is_unreachable(&self) -> bool {
        match self {
            CallError::Unreachable { .. } => true,
            CallError::Api { code, .. } => code.is_runtime_unreachable(),
            CallError::Protocol { .. } => false,
        }
    }

    /// Whether the agent itself could not be reached: no endpoint, connection refused, a TLS
    /// failure or a timeout talking to it. A reachable agent whose smolvm is unavailable is not:
    /// only this case may give up on a machine's local state (force-delete).
    pub fn agent_unreachable(&self) -> bool {
        matches!(self, CallError::Unreachable { .. })
    }

    /// The node API error code, if the node answered one.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            CallError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The message alone, without the node prefix.
    pub fn message(&self) -> &str {
        match self {
            CallError::Unreachable { message, .. }
            | CallError::Api { message, .. }
            | CallError::Protocol { message, .. } => message,
        }
    }
}

/// Where each node's API listens: node name -> (address, port).
#[derive(Debug, Clone, Default)]
pub struct Endpoints(Arc<RwLock<HashMap<String, (String, u16)>>>);

impl Endpoints {
    /// Records (or replaces) a node's endpoint.
    pub fn set(&self, node: &str, address: &str, port: u16) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.insert(node.to_string(), (address.to_string(), port));
    }

    /// Forgets a node.
    pub fn remove(&self, node: &str) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).remove(node);
    }

    fn get(&self, node: &str) -> Option<(String, u16)> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).get(node).cloned()
    }
}

/// A TLS stream to a node, as the pooled client sees it.
pub struct NodeStream(TokioIo<TlsStream<TcpStream>>);

impl Connection for NodeStream {
    fn connected(&self) -> Connected {
        let (_, session) = self.0.inner().get_ref();
        if session.alpn_protocol() == Some(b"h2") {
            Connected::new().negotiated_h2()
        } else {
            Connected::new()
        }
    }
}

impl hyper::rt::Read for NodeStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for NodeStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The node API client's TLS config, replaced as a whole when the runtime CAs change: each new
/// connection takes the config in force, open connections keep the one they were made with.
#[derive(Debug)]
pub struct ClientTls(RwLock<Arc<ClientConfig>>);

impl ClientTls {
    /// Starts with `config`.
    pub fn new(config: ClientConfig) -> Arc<Self> {
        Arc::new(ClientTls(RwLock::new(Arc::new(config))))
    }

    /// The config for the next connection.
    pub fn current(&self) -> Arc<ClientConfig> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `config` in force from the next connection on.
    pub fn replace(&self, config: ClientConfig) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }
}

/// Connects `https://<node>` to the node's advertised endpoint, verifying the node's identity.
#[derive(Clone)]
pub struct NodeConnector {
    endpoints: Endpoints,
    tls: Arc<ClientTls>,
    connect_timeout: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Uri> for NodeConnector {
    type Response = NodeStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<NodeStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let node = uri.host().ok_or("request has no node name")?;
            this.dial(node, this.tls.current()).await
        })
    }
}

impl NodeConnector {
    /// A TLS connection to `node`'s advertised endpoint with `config`, the node's identity
    /// verified (each step within the connect timeout).
    async fn dial(&self, node: &str, config: Arc<ClientConfig>) -> Result<NodeStream, BoxError> {
        let (address, port) = self
            .endpoints
            .get(node)
            .ok_or_else(|| format!("node {node} advertises no endpoint"))?;
        let server_name = ServerName::try_from(smolvm_certs::runtime_server_name(node))
            .map_err(|e| format!("node name {node:?} makes no valid TLS server name: {e}"))?;
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect((address.as_str(), port)))
            .await
            .map_err(|_| format!("connect to {address}:{port} timed out"))??;
        tcp.set_nodelay(true)?;
        let tls = tokio::time::timeout(
            self.connect_timeout,
            TlsConnector::from(config).connect(server_name, tcp),
        )
        .await
        .map_err(|_| format!("TLS handshake with {address}:{port} timed out"))??;
        Ok(NodeStream(TokioIo::new(tls)))
    }
}

/// How long a replaced bearer token is still offered to runtimes that have not yet seen the new
/// one (the kubelet refreshes a mounted Secret within about a minute).
pub const PREVIOUS_TOKEN_GRACE: Duration = Duration::from_secs(600);

/// The node API bearer token, and the one it replaced while runtimes may still expect that one.
#[derive(Debug)]
pub struct BearerToken {
    inner: RwLock<(String, Option<(String, std::time::Instant)>)>,
}

impl BearerToken {
    /// A token with no predecessor.
    pub fn new(token: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            inner: RwLock::new((token.into(), None)),
        })
    }

    /// The token to send.
    pub fn current(&self) -> String {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// Replaces the token; the old one stays acceptable to retry with for
    /// [`PREVIOUS_TOKEN_GRACE`]. Returns whether it changed.
    pub fn replace(&self, token: String) -> bool {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if inner.0 == token {
            return false;
        }
        let old = std::mem::replace(&mut inner.0, token);
        inner.1 = Some((old, std::time::Instant::now() + PREVIOUS_TOKEN_GRACE));
        true
    }

    /// The replaced token, while its grace lasts.
    pub fn previous(&self) -> Option<String> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner
            .1
            .as_ref()
            .filter(|(_, until)| std::time::Instant::now() < *until)
            .map(|(t, _)| t.clone())
    }
}

/// Settings of a [`NodeClient`].
#[derive(Clone)]
pub struct ClientSettings {
    /// rustls config trusting only the runtime CAs, with the controller's client certificate.
    pub tls: Arc<ClientTls>,
    /// Bearer token of the `smolvm-runtime-auth` Secret.
    pub token: Arc<BearerToken>,
    /// Timeout of connect and handshake.
    pub connect_timeout: Duration,
    /// Timeout of quick calls (get, health, delete, stop, resize, create).
    pub call_timeout: Duration,
    /// Timeout of ensure-running, stop, suspend, resume and delete (a start can take minutes).
    pub start_timeout: Duration,
}

impl ClientSettings {
    /// The controller's settings: 5 s to connect, 30 s for quick calls, 5 minutes for a start.
    pub fn standard(tls: Arc<ClientTls>, token: Arc<BearerToken>) -> Self {
        ClientSettings {
            tls,
            token,
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(300),
        }
    }
}

/// A request body streamed to a node as it is produced (a file's content on its way from a
/// user of the access API), never held whole.
pub type StreamedBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// The node API client.
#[derive(Clone)]
pub struct NodeClient {
    client: Client<NodeConnector, Full<Bytes>>,
    /// The same connector, for requests whose body streams ([`NodeClient::open_streaming`]).
    streaming: Client<NodeConnector, StreamedBody>,
    connector: NodeConnector,
    endpoints: Endpoints,
    settings: ClientSettings,
}

impl NodeClient {
    /// A client with pooled connections per node.
    pub fn new(settings: ClientSettings, endpoints: Endpoints) -> Self {
        let connector = NodeConnector {
            endpoints: endpoints.clone(),
            tls: settings.tls.clone(),
            connect_timeout: settings.connect_timeout,
        };
        let builder = {
            let mut builder = Client::builder(TokioExecutor::new());
            builder
                .pool_idle_timeout(Duration::from_secs(60))
                .pool_max_idle_per_host(4);
            builder
        };
        let client = builder.build(connector.clone());
        let streaming = builder.build(connector.clone());
        NodeClient {
            client,
            streaming,
            connector,
            endpoints,
            settings,
        }
    }

    /// The endpoints this client resolves nodes with.
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// [`Operation::Health`].
    pub async fn health(&self, node: &str) -> Result<HealthResponse, CallError> {
        self.json::<calls::Health>(node, "", None, self.settings.call_timeout)
            .await
    }

    /// [`Operation::Identity`].
    pub async fn identity(&self, node: &str) -> Result<IdentityResponse, CallError> {
        self.json::<calls::Identity>(node, "", None, self.settings.call_timeout)
            .await
    }

    /// [`Operation::GetMachine`]; `Ok(None)` when the node has no such machine.
    pub async fn get_machine(&self, node: &str, name: &str) -> Result<Option<MachineStatus>, CallError> {
        match self
            .json::<calls::GetMachine>(node, name, None, self.settings.call_timeout)
            .await
        {
            Ok(m) => Ok(Some(m)),
            Err(CallError::Api {
                code: ErrorCode::MachineNotFound,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Operation::CreateMachine`] (idempotent create).
    pub async fn create_machine(&self, node: &str, name: &str, spec: &MachineSpec) -> Result<MachineStatus, CallError> {
        self.json::<calls::CreateMachine>(node, name, Some(spec), self.settings.call_timeout)
            .await
    }

    /// [`Operation::EnsureMachineRunning`], with the registry credential for this start (sent in
    /// the body only when there is one).
    pub async fn ensure_running(
        &self,
        node: &str,
        name: &str,
        registry_auth: Option<&RegistryAuth>,
    ) -> Result<MachineStatus, CallError> {
        let body = registry_auth.map(|auth| StartRequest {
            registry_auth: Some(auth.clone()),
        });
        self.json::<calls::EnsureMachineRunning>(node, name, body.as_ref(), self.settings.start_timeout)
            .await
    }

    /// [`Operation::StopMachine`].
    pub async fn stop_machine(&self, node: &str, name: &str) -> Result<MachineStatus, CallError> {
        self.json::<calls::StopMachine>(node, name, None, self.settings.start_timeout)
            .await
    }

    /// [`Operation::ResizeMachine`].
    pub async fn resize_machine(&self, node: &str, name: &str, spec: &ResizeSpec) -> Result<MachineStatus, CallError> {
        self.json::<calls::ResizeMachine>(node, name, Some(spec), self.settings.call_timeout)
            .await
    }

    /// [`Operation::SuspendMachine`] (saving memory takes seconds per GiB: the start's time limit).
    pub async fn suspend_machine(&self, node: &str, name: &str) -> Result<MachineStatus, CallError> {
        self.json::<calls::SuspendMachine>(node, name, None, self.settings.start_timeout)
            .await
    }

    /// [`Operation::ResumeMachine`].
    pub async fn resume_machine(&self, node: &str, name: &str) -> Result<MachineStatus, CallError> {
        self.json::<calls::ResumeMachine>(node, name, None, self.settings.start_timeout)
            .await
    }

    /// [`Operation::BindVolumes`]: the stopped machine's mounts pointed at the volumes of the
    /// holder Pod `mounts` names (a new holder, after its holder was evicted).
    pub async fn bind_volumes(
        &self,
        node: &str,
        name: &str,
        mounts: &VolumeMounts,
    ) -> Result<MachineStatus, CallError> {
        self.json::<calls::BindVolumes>(node, name, Some(mounts), self.settings.call_timeout)
            .await
    }

    /// [`Operation::DeleteMachine`].
    pub async fn delete_machine(&self, node: &str, name: &str) -> Result<DeleteResponse, CallError> {
        self.json::<calls::DeleteMachine>(node, name, None, self.settings.start_timeout)
            .await
    }

    /// [`Operation::ApplyPool`]: the node keeps the pool `name` (its source machine may take a
    /// start's time to boot).
    pub async fn apply_pool(&self, node: &str, name: &str, spec: &PoolSpec) -> Result<PoolStatus, CallError> {
        self.json::<calls::ApplyPool>(node, name, Some(spec), self.settings.start_timeout)
            .await
    }

    /// [`Operation::LeaseMachine`]: the machine served from a ready slot of the node pool.
    pub async fn lease_machine(
        &self,
        node: &str,
        name: &str,
        request: &LeaseRequest,
    ) -> Result<MachineStatus, CallError> {
        self.json::<calls::LeaseMachine>(node, name, Some(request), self.settings.start_timeout)
            .await
    }

    /// [`Operation::ResizePool`]: the node pool `name` keeps `slots` ready slots from now on (those
    /// beyond are deleted before the answer).
    pub async fn resize_pool(&self, node: &str, name: &str, slots: u32) -> Result<PoolStatus, CallError> {
        let body = smolvm_api::nodeapi::PoolResize { slots };
        self.json::<calls::ResizePool>(node, name, Some(&body), self.settings.call_timeout)
            .await
    }

    /// [`Operation::DeletePool`].
    pub async fn delete_pool(&self, node: &str, name: &str) -> Result<DeleteResponse, CallError> {
        self.json::<calls::DeletePool>(node, name, None, self.settings.start_timeout)
            .await
    }

    /// One JSON call of the contract's table on `machine` (ignored by node-wide calls): its
    /// method and path from the table, its body and answer typed by [`JsonCall`].
    async fn json<C: JsonCall>(
        &self,
        node: &str,
        machine: &str,
        body: Option<&C::Request>,
        timeout: Duration,
    ) -> Result<C::Response, CallError> {
        let operation = C::OPERATION;
        self.call(node, operation, &operation.path(machine), body, timeout)
            .await
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        node: &str,
        operation: Operation,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let bytes = match body {
            Some(b) => Bytes::from(serde_json::to_vec(b).map_err(|e| CallError::protocol(node, e.to_string()))?),
            None => Bytes::new(),
        };
        let response = self
            .open(node, operation, path, "application/json", bytes, timeout)
            .await?;
        let status = response.status();
        let collected = tokio::time::timeout(timeout, Limited::new(response.into_body(), MAX_BODY).collect())
            .await
            .map_err(|_| CallError::unreachable(node, format!("body not received within {timeout:?}")))?
            .map_err(|e| CallError::protocol(node, format!("reading the body: {e}")))?
            .to_bytes();
        serde_json::from_slice(&collected).map_err(|e| CallError::protocol(node, format!("{status}: {e}")))
    }

    /// Sends one request of `operation` (at its method) to `path` (the operation's path, with
    /// its query) on `node`'s agent and returns its answer once the headers arrive (within
    /// `timeout`), its body still to be read: for streamed answers (logs, files). An answer that
    /// is not a success is read and returned as the [`CallError`] it carries.
    pub async fn open(
        &self,
        node: &str,
        operation: Operation,
        path: &str,
        content_type: &'static str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<hyper::Response<hyper::body::Incoming>, CallError> {
        let uri = request_uri(node, path)?;
        let method = http_method(operation.method());
        let response = self
            .with_token(|token| {
                let request = Request::builder()
                    .method(method.clone())
                    .uri(uri.clone())
                    .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
                    .header(hyper::header::CONTENT_TYPE, content_type)
                    .header(hyper::header::ACCEPT, "application/json")
                    .body(Full::new(body.clone()))
                    .map_err(|e| CallError::protocol(node, e.to_string()));
                async move {
                    tokio::time::timeout(timeout, self.client.request(request?))
                        .await
                        .map_err(|_| CallError::unreachable(node, format!("no answer within {timeout:?}")))?
                        .map_err(|e| CallError::unreachable(node, error_chain(&e)))
                }
            })
            .await?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(refusal(node, response, timeout).await)
    }

    /// Sends one request of `operation` whose body streams to `node`'s agent as `body` yields it, and returns
    /// the answer once its headers arrive (within `timeout`, the body's sending included), as
    /// [`NodeClient::open`] does. A body that fails ends the request: the agent never sees a
    /// whole one. Since a body cannot be sent twice, during a token replacement the token the
    /// agent takes is found first with a bodiless call.
    pub async fn open_streaming(
        &self,
        node: &str,
        operation: Operation,
        path: &str,
        content_type: &'static str,
        body: StreamedBody,
        timeout: Duration,
    ) -> Result<hyper::Response<hyper::body::Incoming>, CallError> {
        let uri = request_uri(node, path)?;
        let token = self.token_taken_by(node, timeout).await?;
        let request = Request::builder()
            .method(http_method(operation.method()))
            .uri(uri)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(hyper::header::CONTENT_TYPE, content_type)
            .header(hyper::header::ACCEPT, "application/json")
            .body(body)
            .map_err(|e| CallError::protocol(node, e.to_string()))?;
        let response = tokio::time::timeout(timeout, self.streaming.request(request))
            .await
            .map_err(|_| CallError::unreachable(node, format!("no answer within {timeout:?}")))?
            .map_err(|e| CallError::unreachable(node, error_chain(&e)))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(refusal(node, response, timeout).await)
    }

    /// The token `node`'s agent takes: the one in force, or, while a replaced one is still
    /// offered and the agent refuses the new one, the replaced one.
    async fn token_taken_by(&self, node: &str, timeout: Duration) -> Result<String, CallError> {
        let current = self.settings.token.current();
        let Some(previous) = self.settings.token.previous() else {
            return Ok(current);
        };
        let probe = Request::get(request_uri(node, &Operation::Identity.path(""))?)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {current}"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| CallError::protocol(node, e.to_string()))?;
        let response = tokio::time::timeout(timeout, self.client.request(probe))
            .await
            .map_err(|_| CallError::unreachable(node, format!("no answer within {timeout:?}")))?
            .map_err(|e| CallError::unreachable(node, error_chain(&e)))?;
        Ok(if response.status() == StatusCode::UNAUTHORIZED {
            previous
        } else {
            current
        })
    }

    /// Opens an interactive session on `node`'s agent ([`Operation::ExecInteractive`]): `GET path`
    /// (the operation's path and its query) upgraded (a WebSocket), with
    /// the client's handshake `headers` passed through and the token added, on a connection of
    /// its own that offers HTTP/1.1 only (an upgrade cannot ride HTTP/2). `Ok`: the agent's
    /// `101 Switching Protocols` headers and the upgraded connection; a refusal is the
    /// [`CallError`] its body carries, as for [`NodeClient::open`].
    pub async fn upgrade(
        &self,
        node: &str,
        path: &str,
        headers: &hyper::HeaderMap,
        timeout: Duration,
    ) -> Result<(hyper::HeaderMap, hyper::upgrade::Upgraded), CallError> {
        let uri = request_uri(node, path)?;
        let mut config = (*self.settings.tls.current()).clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut response = self
            .with_token(|token| {
                let mut request = Request::get(uri.clone()).header(hyper::header::HOST, node);
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                let request = request
                    .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
                    .body(http_body_util::Empty::<Bytes>::new())
                    .map_err(|e| CallError::protocol(node, e.to_string()));
                let config = config.clone();
                let exchange = async move {
                    let unreachable = |message| CallError::unreachable(node, message);
                    let stream = self
                        .connector
                        .dial(node, config)
                        .await
                        .map_err(|e| unreachable(error_chain(e.as_ref())))?;
                    let (mut sender, connection) = hyper::client::conn::http1::handshake(stream)
                        .await
                        .map_err(|e| unreachable(error_chain(&e)))?;
                    tokio::spawn(async move {
                        if let Err(error) = connection.with_upgrades().await {
                            tracing::debug!(%error, "upgraded node API connection ended");
                        }
                    });
                    sender
                        .send_request(request?)
                        .await
                        .map_err(|e| unreachable(error_chain(&e)))
                };
                async move {
                    tokio::time::timeout(timeout, exchange)
                        .await
                        .map_err(|_| CallError::unreachable(node, format!("no answer within {timeout:?}")))?
                }
            })
            .await?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            if response.status().is_success() {
                return Err(CallError::protocol(
                    node,
                    format!(
                        "the agent answered {} instead of switching protocols",
                        response.status()
                    ),
                ));
            }
            return Err(refusal(node, response, timeout).await);
        }
        let upgraded = tokio::time::timeout(timeout, hyper::upgrade::on(&mut response))
            .await
            .map_err(|_| CallError::unreachable(node, format!("the upgrade did not complete within {timeout:?}")))?
            .map_err(|e| CallError::protocol(node, format!("the upgrade failed: {e}")))?;
        Ok((response.headers().clone(), upgraded))
    }

    /// Sends with the token in force; during a token replacement a runtime may still hold the
    /// old one for a minute, so a 401 is retried once with the token it replaced.
    async fn with_token<F, Fut>(&self, mut send: F) -> Result<hyper::Response<hyper::body::Incoming>, CallError>
    where
        F: FnMut(String) -> Fut,
        Fut: Future<Output = Result<hyper::Response<hyper::body::Incoming>, CallError>>,
    {
        let response = send(self.settings.token.current()).await?;
        match self.settings.token.previous() {
            Some(previous) if response.status() == StatusCode::UNAUTHORIZED => send(previous).await,
            _ => Ok(response),
        }
    }
}

/// The HTTP method of a method of the contract.
fn http_method(method: nodeapi::Method) -> Method {
    match method {
        nodeapi::Method::Get => Method::GET,
        nodeapi::Method::Put => Method::PUT,
        nodeapi::Method::Post => Method::POST,
        nodeapi::Method::Delete => Method::DELETE,
    }
}

/// `https://<node><path>`, which the connector resolves to the node's endpoint.
fn request_uri(node: &str, path: &str) -> Result<Uri, CallError> {
    format!("https://{node}{path}")
        .parse()
        .map_err(|e| CallError::protocol(node, format!("bad request URI: {e}")))
}

/// The [`CallError`] a node's refusal (an answer that is not a success) carries: its JSON
/// error body read (within `timeout`), or what its status says when it has none.
async fn refusal(node: &str, response: hyper::Response<hyper::body::Incoming>, timeout: Duration) -> CallError {
    let status = response.status();
    let collected = match tokio::time::timeout(timeout, Limited::new(response.into_body(), MAX_BODY).collect()).await {
        Err(_) => return CallError::unreachable(node, format!("body not received within {timeout:?}")),
        Ok(Err(e)) => return CallError::protocol(node, format!("reading the body: {e}")),
        Ok(Ok(body)) => body.to_bytes(),
    };
    match serde_json::from_slice::<NodeApiError>(&collected) {
        // The agent cleans smolvm's text already; cleaning again bounds what any agent
        // (an older one, a misbehaving one) can put into conditions and events.
        Ok(err) => CallError::Api {
            node: node.to_string(),
            status: status.as_u16(),
            code: err.code,
            message: smolvm_api::text::clean_external(&err.message),
            details: err.details,
        },
        // The agent answered, so it is reachable; its runtime is not.
        Err(_) if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::GATEWAY_TIMEOUT => {
            CallError::Api {
                node: node.to_string(),
                status: status.as_u16(),
                code: if status == StatusCode::SERVICE_UNAVAILABLE {
                    ErrorCode::RuntimeUnavailable
                } else {
                    ErrorCode::RuntimeTimeout
                },
                message: format!("the agent answered {status} without an error body"),
                details: None,
            }
        }
        Err(_) => CallError::protocol(node, format!("{status} without an error body")),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Presents the controller's client certificate, swappable on rotation without a new client.
#[derive(Debug)]
pub struct ClientCert(pub Arc<smolvm_certs::ReloadableResolver>);

impl rustls::client::ResolvesClientCert for ClientCert {
    fn resolve(
        &self,
        _hints: &[&[u8]],
        _schemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.current_certified_key())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A client TLS config that trusts only the CAs in `ca_pem` (WebPKI: chain, validity, name) and
/// presents `cert`.
pub fn client_tls(
    ca_pem: &str,
    cert: Arc<smolvm_certs::ReloadableResolver>,
) -> Result<ClientConfig, smolvm_certs::Error> {
    let roots = smolvm_certs::root_store(ca_pem)?;
    let mut config = ClientConfig::builder_with_provider(smolvm_certs::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(smolvm_certs::Error::TlsConfig)?
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(ClientCert(cert)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
