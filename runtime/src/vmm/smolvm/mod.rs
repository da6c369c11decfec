//! [`Vmm`] over `smolvm serve`'s HTTP/1.1 JSON API on a Unix socket.
//!
//! Each call opens its own connection (a Unix socket connect is cheap, and no pooled
//! connection can go stale across a `smolvm serve` restart), sends one request, reads the
//! whole answer under a size cap, and runs under the call's time limit.

use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use smolvm_api::Protocol;
use smolvm_api::text::clean_external;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

use base64::Engine as _;
use futures::StreamExt as _;

use super::{
    DeleteOutcome, ExecOutput, ExecRequest, FileContent, LeaseInfo, LeaseRequest, LogQuery, LogStream, Machine,
    MachineSpec, MachineState, PoolInfo, PoolRequest, PortMapping, RegistryAuth, ResizeRequest, Sensitive, Vmm,
    VmmCapacity, VmmError, VmmHealth,
};

mod pools;

/// Where smolvm listens and how long each kind of call may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmolvmConfig {
    /// The Unix socket `smolvm serve start --listen unix://<path>` listens on.
    pub socket_path: PathBuf,
    /// The `--local-image-dir` smolvm was started with; `local:<name>` images resolve inside
    /// it. `None`: `local:` images are refused.
    pub local_image_dir: Option<PathBuf>,
    /// Limit for connecting to the socket.
    pub connect_timeout: Duration,
    /// Limit for health, list, get, create and resize.
    pub request_timeout: Duration,
    /// Limit for start. smolvm serializes starts and waits up to 30 s (60 s for archive images)
    /// for the guest agent, so this is long.
    pub start_timeout: Duration,
    /// Limit for stop.
    pub stop_timeout: Duration,
    /// Limit for delete (stops the machine first when it runs).
    pub delete_timeout: Duration,
    /// Limit for pause: smolvm writes the machine's whole memory to disk durably before it
    /// stops it, which takes seconds per GiB.
    pub pause_timeout: Duration,
    /// Limit for resume: smolvm reads the saved memory back and starts the machine's process.
    pub resume_timeout: Duration,
    /// Largest answer body accepted.
    pub max_response_bytes: usize,
}

impl SmolvmConfig {
    /// Defaults for a socket path: 5 s connect, 30 s requests, 300 s start, 120 s stop and
    /// delete, 900 s pause (a large machine's memory at a few seconds per GiB), 300 s resume.
    pub fn new(socket_path: impl Into<PathBuf>) -> Self {
        Self {
            socket_path: socket_path.into(),
            local_image_dir: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(300),
            stop_timeout: Duration::from_secs(120),
            delete_timeout: Duration::from_secs(120),
            pause_timeout: Duration::from_secs(900),
            resume_timeout: Duration::from_secs(300),
            max_response_bytes: 16 * 1024 * 1024,
        }
    }

    /// Sets the local image directory.
    pub fn with_local_image_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.local_image_dir = Some(dir.into());
        self
    }
}

/// Client for one `smolvm serve`.
#[derive(Debug, Clone)]
pub struct SmolvmClient {
    config: SmolvmConfig,
}

/// Which API call a response belongs to; error mapping depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Health,
    Capacity,
    List,
    Get,
    Create,
    Start,
    Stop,
    Delete,
    Resize,
    Pause,
    Resume,
    Logs,
    Exec,
    Files,
    /// The pool calls: list, create, resize, delete.
    Pools,
    /// A lease's acquisition.
    Lease,
    /// A lease's heartbeat or completion.
    LeaseUpdate,
}

impl SmolvmClient {
    /// A client for the given configuration. Nothing is contacted until the first call.
    pub fn new(config: SmolvmConfig) -> Self {
        Self { config }
    }

    /// The configuration.
    pub fn config(&self) -> &SmolvmConfig {
        &self.config
    }

    /// Turns a spec image into what smolvm's `image` field takes: `local:<name>` becomes the
    /// absolute path `<local_image_dir>/<name>`; anything else is passed through unchanged.
    pub fn resolve_image(&self, image: &str) -> Result<String, VmmError> {
        let Some(name) = image.strip_prefix("local:") else {
            return Ok(image.to_string());
        };
        let bad = |why: &str| VmmError::BadRequest {
            message: format!("image {image:?}: {why}"),
        };
        let Some(dir) = &self.config.local_image_dir else {
            return Err(bad("this runtime has no local image directory"));
        };
        let mut components = Path::new(name).components();
        match (components.next(), components.next()) {
            (Some(Component::Normal(_)), None) if !name.contains('\0') => {}
            _ => return Err(bad("a local image name is one file or directory name")),
        }
        let path = dir.join(name);
        path.to_str()
            .map(str::to_string)
            .ok_or_else(|| bad("the local image path is not valid UTF-8"))
    }

    fn timeout_for(&self, operation: Operation) -> Duration {
        match operation {
            Operation::Start => self.config.start_timeout,
            Operation::Stop => self.config.stop_timeout,
            Operation::Delete => self.config.delete_timeout,
            Operation::Pause => self.config.pause_timeout,
            Operation::Resume => self.config.resume_timeout,
            _ => self.config.request_timeout,
        }
    }

    /// Sends one request and returns the status and body, or an error for transport failures
    /// and time-outs. HTTP error statuses are returned, not mapped.
    async fn call(
        &self,
        operation: Operation,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), VmmError> {
        let body = body.map(|b| (Bytes::from(b), "application/json"));
        self.call_within(self.timeout_for(operation), operation, method, path, body)
            .await
    }

    /// [`Self::call`] with its own time limit and a body of any content type.
    async fn call_within(
        &self,
        limit: Duration,
        operation: Operation,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> Result<(StatusCode, Bytes), VmmError> {
        let started = Instant::now();
        let result = tokio::time::timeout(limit, self.exchange(method.clone(), path, body)).await;
        let result = match result {
            Ok(result) => result,
            Err(_) => Err(VmmError::Timeout {
                message: format!("smolvm did not answer {method} {path} within {}s", limit.as_secs_f64()),
            }),
        };
        match &result {
            Ok((status, _)) => tracing::debug!(
                ?operation, %method, path, status = status.as_u16(),
                elapsed_ms = started.elapsed().as_millis() as u64, "smolvm call"
            ),
            Err(error) => tracing::debug!(
                ?operation, %method, path, code = error.code(), %error,
                elapsed_ms = started.elapsed().as_millis() as u64, "smolvm call failed"
            ),
        }
        result
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> Result<(StatusCode, Bytes), VmmError> {
        let (response, _connection) = self.send(method.clone(), path, body).await?;
        let status = response.status();
        let max = self.config.max_response_bytes;
        let body = Limited::new(response.into_body(), max)
            .collect()
            .await
            .map_err(|error| {
                if error.is::<http_body_util::LengthLimitError>() {
                    VmmError::Protocol(format!("answer to {method} {path} is larger than {max} bytes"))
                } else {
                    VmmError::Unavailable {
                        message: format!(
                            "{method} {path}: connection to smolvm broke while reading the answer: {error}"
                        ),
                    }
                }
            })?
            .to_bytes();
        Ok((status, body))
    }

    /// Opens a streamed GET: the head of a successful answer with its connection, whose body
    /// is still to be read; an error status is the mapped error.
    async fn open_stream(
        &self,
        operation: Operation,
        path: &str,
    ) -> Result<(hyper::Response<hyper::body::Incoming>, AbortOnDrop), VmmError> {
        let limit = self.config.request_timeout;
        let (response, connection) = tokio::time::timeout(limit, self.send(Method::GET, path, None))
            .await
            .map_err(|_| VmmError::Timeout {
                message: format!("smolvm did not answer GET {path} within {}s", limit.as_secs_f64()),
            })??;
        let status = response.status();
        if status.is_success() {
            return Ok((response, connection));
        }
        let bytes = Limited::new(response.into_body(), self.config.max_response_bytes)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Err(map_error(operation, status, &bytes))
    }

    /// Sends one request on a new connection and returns the response head with its body still
    /// to be read, and the connection's task (the connection ends when it is dropped).
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> Result<(hyper::Response<hyper::body::Incoming>, AbortOnDrop), VmmError> {
        let socket = &self.config.socket_path;
        let unavailable = |what: String| VmmError::Unavailable { message: what };
        let stream = match tokio::time::timeout(self.config.connect_timeout, UnixStream::connect(socket)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                return Err(unavailable(format!("cannot connect to {}: {error}", socket.display())));
            }
            Err(_) => {
                return Err(unavailable(format!(
                    "connecting to {} took longer than {}s",
                    socket.display(),
                    self.config.connect_timeout.as_secs_f64()
                )));
            }
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(|error| unavailable(format!("HTTP handshake with smolvm: {error}")))?;
        let connection = AbortOnDrop(tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::trace!(%error, "smolvm connection ended with an error");
            }
        }));

        let builder = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(HOST, "localhost");
        let request = match body {
            Some((body, content_type)) => builder.header(CONTENT_TYPE, content_type).body(Full::new(body)),
            None => builder.body(Full::new(Bytes::new())),
        }
        .map_err(|error| VmmError::Protocol(format!("cannot build {method} {path}: {error}")))?;

        let response = sender
            .send_request(request)
            .await
            .map_err(|error| unavailable(format!("{method} {path}: connection to smolvm failed: {error}")))?;
        Ok((response, connection))
    }

    /// A call whose success body is a machine.
    async fn machine_call(
        &self,
        operation: Operation,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Machine, VmmError> {
        let (status, bytes) = self.call(operation, method, path, body).await?;
        if !status.is_success() {
            return Err(map_error(operation, status, &bytes));
        }
        parse_machine_bytes(&bytes)
    }

    /// Start and stop: smolvm's stop answers with the machine; start is documented to answer
    /// `{"started": name}`. Either way the caller gets the machine.
    async fn lifecycle_call(
        &self,
        operation: Operation,
        name: &str,
        verb: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Machine, VmmError> {
        let path = format!("{}/{verb}", machine_path(name));
        let (status, bytes) = self.call(operation, Method::POST, &path, body).await?;
        if !status.is_success() {
            return Err(map_error(operation, status, &bytes));
        }
        if let Ok(machine) = parse_machine_bytes(&bytes) {
            return Ok(machine);
        }
        match self.get(name).await? {
            Some(machine) => Ok(machine),
            None => Err(VmmError::NotFound {
                message: format!("machine '{name}' not found after {verb}"),
            }),
        }
    }
}

#[async_trait]
impl Vmm for SmolvmClient {
    async fn health(&self) -> Result<VmmHealth, VmmError> {
        let (status, bytes) = self.call(Operation::Health, Method::GET, "/health", None).await?;
        if !status.is_success() {
            return Err(map_error(Operation::Health, status, &bytes));
        }
        let wire: HealthWire = parse_json(&bytes, "health")?;
        Ok(VmmHealth {
            status: wire.status,
            version: wire.version,
            nested_virt: wire.nested_virt,
            machines_total: wire.machines.as_ref().map(|m| m.total),
            machines_running: wire.machines.as_ref().map(|m| m.running),
            uptime_seconds: wire.uptime_seconds,
        })
    }

    async fn capacity(&self) -> Result<VmmCapacity, VmmError> {
        let (status, bytes) = self.call(Operation::Capacity, Method::GET, "/capacity", None).await?;
        if !status.is_success() {
            return Err(map_error(Operation::Capacity, status, &bytes));
        }
        let wire: CapacityWire = parse_json(&bytes, "capacity")?;
        Ok(VmmCapacity {
            boot_id: wire.boot_id,
            gpu_count: wire
                .cuda_devices
                .map_or(0, |devices| u32::try_from(devices.len()).unwrap_or(u32::MAX)),
        })
    }

    async fn list(&self) -> Result<Vec<Machine>, VmmError> {
        let (status, bytes) = self.call(Operation::List, Method::GET, MACHINES, None).await?;
        if !status.is_success() {
            return Err(map_error(Operation::List, status, &bytes));
        }
        let wire: ListWire = parse_json(&bytes, "machine list")?;
        wire.machines.into_iter().map(machine_from_json).collect()
    }

    async fn get(&self, name: &str) -> Result<Option<Machine>, VmmError> {
        match self
            .machine_call(Operation::Get, Method::GET, &machine_path(name), None)
            .await
        {
            Ok(machine) => Ok(Some(machine)),
            Err(VmmError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn create(&self, spec: &MachineSpec) -> Result<Machine, VmmError> {
        let image = spec
            .image
            .as_deref()
            .map(|image| self.resolve_image(image))
            .transpose()?;
        let wire = create_wire(spec, image);
        let body = to_json(&wire)?;
        self.machine_call(Operation::Create, Method::POST, MACHINES, Some(body))
            .await
    }

    async fn start(&self, name: &str, registry_auth: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        // smolvm's per-start credentials: in this request only, never in its machine record.
        let body = match registry_auth {
            Some(auth) => Some(to_json(&StartWire {
                registry_auth: Some(auth),
                branchable: false,
            })?),
            None => None,
        };
        self.lifecycle_call(Operation::Start, name, "start", body).await
    }

    async fn start_branchable(&self, name: &str, registry_auth: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        let body = to_json(&StartWire {
            registry_auth,
            branchable: true,
        })?;
        self.lifecycle_call(Operation::Start, name, "start", Some(body)).await
    }

    async fn pools(&self) -> Result<Vec<PoolInfo>, VmmError> {
        self.list_pools().await
    }

    async fn create_pool(&self, request: &PoolRequest<'_>) -> Result<PoolInfo, VmmError> {
        self.create_pool_call(request).await
    }

    async fn resize_pool(&self, name: &str, ready: u32) -> Result<PoolInfo, VmmError> {
        self.resize_pool_call(name, ready).await
    }

    async fn delete_pool(&self, name: &str) -> Result<DeleteOutcome, VmmError> {
        self.delete_pool_call(name).await
    }

    async fn acquire_lease(&self, pool: &str, request: &LeaseRequest<'_>) -> Result<LeaseInfo, VmmError> {
        self.acquire_lease_call(pool, request).await
    }

    async fn heartbeat_lease(&self, pool: &str, lease: &str) -> Result<LeaseInfo, VmmError> {
        self.lease_verb(pool, lease, "heartbeat").await
    }

    async fn complete_lease(&self, pool: &str, lease: &str) -> Result<LeaseInfo, VmmError> {
        self.lease_verb(pool, lease, "complete").await
    }

    async fn stop(&self, name: &str) -> Result<Machine, VmmError> {
        self.lifecycle_call(Operation::Stop, name, "stop", None).await
    }

    async fn delete(&self, name: &str) -> Result<DeleteOutcome, VmmError> {
        let (status, bytes) = self
            .call(Operation::Delete, Method::DELETE, &machine_path(name), None)
            .await?;
        if status.is_success() {
            return Ok(DeleteOutcome::Deleted);
        }
        match map_error(Operation::Delete, status, &bytes) {
            VmmError::NotFound { .. } => Ok(DeleteOutcome::Missing),
            error => Err(error),
        }
    }

    async fn resize(&self, name: &str, request: &ResizeRequest) -> Result<Machine, VmmError> {
        let wire = ResizeWire {
            cpus: request.cpus,
            memory_mb: request.memory_mib,
            storage_gb: request.storage_gib,
            overlay_gb: request.overlay_gib,
        };
        let body = to_json(&wire)?;
        let path = format!("{}/resize", machine_path(name));
        self.machine_call(Operation::Resize, Method::POST, &path, Some(body))
            .await
    }

    async fn pause(&self, name: &str) -> Result<Machine, VmmError> {
        let path = format!("{}/pause", machine_path(name));
        self.machine_call(Operation::Pause, Method::POST, &path, None).await
    }

    async fn resume(&self, name: &str) -> Result<Machine, VmmError> {
        let path = format!("{}/resume", machine_path(name));
        self.machine_call(Operation::Resume, Method::POST, &path, None).await
    }

    async fn logs(&self, name: &str, query: &LogQuery) -> Result<LogStream, VmmError> {
        let mut path = format!(
            "{}/logs?source={}&follow={}",
            machine_path(name),
            query.source.as_str(),
            query.follow
        );
        if let Some(tail) = query.tail {
            path.push_str(&format!("&tail={tail}"));
        }
        let (response, connection) = match self.open_stream(Operation::Logs, &path).await {
            Ok(opened) => opened,
            // smolvm answers 404 for a log not written yet (a machine never started) as for an
            // unknown machine: only the latter is an error.
            Err(VmmError::NotFound { .. }) if self.get(name).await?.is_some() => {
                return Ok(futures::stream::empty().boxed());
            }
            Err(error) => return Err(error),
        };
        let mut lines = super::sse::SseLines::default();
        Ok(chunks(response, connection, "the log stream")
            .map(move |chunk| chunk.map(|chunk| lines.push(&chunk)))
            .filter(|lines| futures::future::ready(lines.as_ref().map_or(true, |l| !l.is_empty())))
            .boxed())
    }

    async fn exec_interactive(
        &self,
        name: &str,
        request: &super::InteractiveRequest,
    ) -> Result<super::Session, VmmError> {
        super::interactive::open(
            &self.config.socket_path,
            &machine_path(name),
            request,
            self.config.connect_timeout + self.config.request_timeout,
        )
        .await
    }

    async fn exec(&self, name: &str, request: &ExecRequest) -> Result<ExecOutput, VmmError> {
        let seconds = request
            .timeout_seconds
            .unwrap_or(smolvm_api::nodeapi::EXEC_DEFAULT_TIMEOUT_SECONDS);
        let wire = ExecWire {
            command: &request.command,
            env: request
                .env
                .iter()
                .map(|e| EnvWire {
                    name: &e.name,
                    value: &e.value,
                })
                .collect(),
            workdir: request.working_dir.as_deref(),
            stdin: request.stdin.as_deref(),
            timeout_secs: seconds,
            // Never boot a stopped machine to run a command: that is a 409.
            auto_start: false,
        };
        let body = to_json(&wire)?;
        let path = format!("{}/exec", machine_path(name));
        let limit = Duration::from_secs(u64::from(seconds)) + self.config.request_timeout;
        let (status, bytes) = self
            .call_within(
                limit,
                Operation::Exec,
                Method::POST,
                &path,
                Some((Bytes::from(body), "application/json")),
            )
            .await?;
        if !status.is_success() {
            return Err(map_error(Operation::Exec, status, &bytes));
        }
        let wire: ExecAnswerWire = parse_json(&bytes, "exec answer")?;
        let decode = |field: &str, text: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| VmmError::Protocol(format!("exec answer: {field} is not base64: {e}")))
        };
        Ok(ExecOutput {
            exit_code: wire.exit_code,
            stdout: decode("stdoutB64", &wire.stdout_b64)?,
            stderr: decode("stderrB64", &wire.stderr_b64)?,
        })
    }

    async fn read_file(&self, name: &str, path: &str, limit: u64) -> Result<FileContent, VmmError> {
        let (response, connection) = self.open_stream(Operation::Files, &file_path(name, path)).await?;
        let directory = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        let mut sent = 0u64;
        let stream = chunks(response, connection, "the file").map(move |chunk| {
            let chunk = chunk?;
            sent += chunk.len() as u64;
            if sent > limit {
                return Err(VmmError::BadRequest {
                    message: format!("the file is larger than the limit of {limit} bytes"),
                });
            }
            Ok(chunk)
        });
        Ok(FileContent {
            directory,
            stream: stream.boxed(),
        })
    }

    async fn write_file(&self, name: &str, path: &str, mode: Option<u32>, content: Bytes) -> Result<(), VmmError> {
        let mut url = file_path(name, path);
        if let Some(mode) = mode {
            url.push_str(&format!("?mode={mode:o}"));
        }
        let (status, bytes) = self
            .call_within(
                self.timeout_for(Operation::Files),
                Operation::Files,
                Method::PUT,
                &url,
                Some((content, "application/octet-stream")),
            )
            .await?;
        if !status.is_success() {
            return Err(map_error(Operation::Files, status, &bytes));
        }
        Ok(())
    }
}

/// The data of a streamed answer's body, chunk by chunk as smolvm sends them; the connection
/// lives as long as the stream. A broken connection is the stream's last item.
fn chunks(response: hyper::Response<hyper::body::Incoming>, connection: AbortOnDrop, what: &'static str) -> LogStream {
    let state = (response.into_body(), Some(connection));
    futures::stream::unfold(state, move |(mut body, connection)| async move {
        let connection = connection?;
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Some((Ok(data), (body, Some(connection))));
                    }
                }
                Some(Err(error)) => {
                    let error = VmmError::Unavailable {
                        message: format!("{what} from smolvm broke: {error}"),
                    };
                    return Some((Err(error), (body, None)));
                }
                None => return None,
            }
        }
    })
    .boxed()
}

/// `/api/v1/machines/{name}/files/{path}`: each segment of `path` percent-encoded.
fn file_path(name: &str, path: &str) -> String {
    let segments: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(encode_segment).collect();
    format!("{}/files/{}", machine_path(name), segments.join("/"))
}

/// smolvm's exec request (`deny_unknown_fields` on its side).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExecWire<'a> {
    command: &'a [String],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<EnvWire<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workdir: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stdin: Option<&'a str>,
    timeout_secs: u32,
    auto_start: bool,
}

/// smolvm's exec answer: the byte-exact base64 fields are read, the lossy text ones are not.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecAnswerWire {
    exit_code: i32,
    #[serde(rename = "stdoutB64")]
    stdout_b64: String,
    #[serde(rename = "stderrB64")]
    stderr_b64: String,
}

const MACHINES: &str = "/api/v1/machines";

fn machine_path(name: &str) -> String {
    format!("{MACHINES}/{}", encode_segment(name))
}

/// Percent-encodes everything but letters, digits, `-`, `_` and `~` (dots too), so a name can
/// never add a path segment, a dot segment or a query.
fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Maps a non-success answer to a [`VmmError`], keeping smolvm's message.
///
/// smolvm's own errors are `{"error": "<message>", "code": "<CODE>"}`; its request-parsing
/// layer answers 400/415/422 with plain text; unknown routes answer 404 or 405 with no body.
pub fn map_error(operation: Operation, status: StatusCode, body: &[u8]) -> VmmError {
    let api_error = serde_json::from_slice::<ErrorWire>(body).ok();
    // smolvm's text embeds its log lines (ANSI colours, timestamps, levels): cleaned here, at
    // the one place it enters the agent, so node API answers, conditions and events carry the
    // cause and nothing that changes between two retries of the same failure.
    let message = match &api_error {
        Some(error) => clean_external(&error.error),
        None => {
            let text = clean_external(&String::from_utf8_lossy(body));
            if text.is_empty() {
                format!(
                    "HTTP {status} with an empty body ({operation:?})",
                    status = status.as_u16()
                )
            } else {
                text
            }
        }
    };
    let code = api_error.as_ref().map(|error| error.code.as_str());
    match status.as_u16() {
        404 if api_error.is_some() => VmmError::NotFound { message },
        404 | 405 => VmmError::Protocol(format!(
            "smolvm has no such route for {operation:?} (HTTP {}): {message}",
            status.as_u16()
        )),
        // smolvm 1.32.2 refuses a pause of a machine that is not running, and a resume of one
        // that was not paused, with 409 `CONFLICT`: the operation tells which.
        409 if operation == Operation::Pause && code == Some("CONFLICT") => VmmError::NotRunning { message },
        409 if operation == Operation::Resume && code == Some("CONFLICT") => VmmError::NotPaused { message },
        409 => VmmError::Conflict { message },
        400 | 403 | 413 | 415 | 422 => VmmError::BadRequest { message },
        // A live smolvm's 503 on a lease: the pool has no ready machine now.
        503 if operation == Operation::Lease && api_error.is_some() => VmmError::NoReadySlot { message },
        503 => VmmError::Unavailable { message },
        500..=599 if operation == Operation::Start => VmmError::StartFailed { message },
        _ => {
            if code == Some("NOT_FOUND") {
                VmmError::NotFound { message }
            } else {
                VmmError::Internal {
                    status: status.as_u16(),
                    message,
                }
            }
        }
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, VmmError> {
    serde_json::from_slice(bytes).map_err(|error| {
        VmmError::Protocol(format!(
            "cannot read the {what} smolvm sent ({error}): {}",
            snippet(bytes)
        ))
    })
}

fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>, VmmError> {
    serde_json::to_vec(value).map_err(|error| VmmError::Protocol(format!("cannot encode request: {error}")))
}

fn parse_machine_bytes(bytes: &[u8]) -> Result<Machine, VmmError> {
    let value: serde_json::Value = parse_json(bytes, "machine")?;
    machine_from_json(value)
}

/// Reads smolvm's state word (case-insensitive): the one place the agent reads smolvm's words
/// for a machine's state. A word this protocol does not know is [`MachineState::Unknown`]; the
/// word itself stays in the machine's raw JSON ([`Machine::runtime_state`]).
pub fn state_from_word(word: &str) -> MachineState {
    match word.to_ascii_lowercase().as_str() {
        "created" => MachineState::Created,
        "running" => MachineState::Running,
        "stopped" => MachineState::Stopped,
        "failed" | "error" => MachineState::Failed,
        _ => MachineState::Unknown,
    }
}

/// smolvm's word for `state` (for a machine no runtime reported; `unknown` for
/// [`MachineState::Unknown`]).
pub fn state_word(state: MachineState) -> &'static str {
    match state {
        MachineState::Created => "created",
        MachineState::Running => "running",
        // A suspended machine is one smolvm paused: it reads `stopped`.
        MachineState::Stopped | MachineState::Suspended => "stopped",
        MachineState::Failed => "failed",
        MachineState::Unknown => "unknown",
    }
}

/// The state word of a machine object smolvm reported (its `state`), verbatim.
pub fn state_word_of(raw: &serde_json::Value) -> Option<&str> {
    raw.get("state").and_then(serde_json::Value::as_str)
}

/// Reads one machine object as smolvm reports it (`MachineInfo`), keeping the raw JSON.
pub fn machine_from_json(value: serde_json::Value) -> Result<Machine, VmmError> {
    let wire: MachineWire = serde_json::from_value(value.clone())
        .map_err(|error| VmmError::Protocol(format!("cannot read a machine smolvm sent: {error}")))?;
    let ports = wire
        .ports
        .iter()
        .map(|port| {
            let host_port = u16::try_from(port.host).ok();
            let guest_port = u16::try_from(port.guest).ok();
            let protocol = protocol_from_smolvm(port.protocol.as_deref());
            match (host_port, guest_port, protocol) {
                (Some(host_port), Some(guest_port), Some(protocol)) => Ok(PortMapping {
                    host_port,
                    guest_port,
                    protocol,
                }),
                _ => Err(VmmError::Protocol(format!(
                    "machine '{}' has a port smolvm reports as {}:{}/{}",
                    wire.name,
                    port.host,
                    port.guest,
                    port.protocol.as_deref().unwrap_or("tcp")
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Machine {
        state: state_from_word(&wire.state),
        name: wire.name,
        cpus: wire.cpus,
        memory_mib: wire.memory_mb,
        storage_gib: wire.storage_gb,
        overlay_gib: wire.overlay_gb,
        image: wire.image,
        ports,
        network: wire.network,
        pid: wire.pid,
        raw: value,
    })
}

/// Aborts the connection task when the call ends (or is cancelled by its time limit).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Debug, Deserialize)]
struct ErrorWire {
    error: String,
    code: String,
}

#[derive(Debug, Deserialize)]
struct HealthWire {
    status: String,
    version: String,
    #[serde(default)]
    nested_virt: bool,
    #[serde(default)]
    machines: Option<CountsWire>,
    #[serde(default)]
    uptime_seconds: Option<u64>,
}

/// smolvm's `/capacity`, the fields the agent reads (`CapacityResponse` in its OpenAPI document).
#[derive(Debug, Deserialize)]
struct CapacityWire {
    #[serde(default)]
    boot_id: Option<String>,
    #[serde(default)]
    cuda_devices: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
struct CountsWire {
    total: u64,
    running: u64,
}

#[derive(Debug, Deserialize)]
struct ListWire {
    machines: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MachineWire {
    name: String,
    state: String,
    #[serde(default)]
    cpus: u32,
    #[serde(default)]
    memory_mb: u64,
    #[serde(default)]
    storage_gb: Option<u64>,
    #[serde(default)]
    overlay_gb: Option<u64>,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    ports: Vec<PortWireIn>,
    #[serde(default)]
    network: bool,
    #[serde(default)]
    pid: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct PortWireIn {
    host: u64,
    guest: u64,
    #[serde(default)]
    protocol: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct CreateWire<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    cpus: u32,
    memory_mb: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    storage_gb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    overlay_gb: Option<u64>,
    network: bool,
    ports: Vec<PortWireOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_cidrs: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_hosts: Option<&'a [String]>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    entrypoint: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    cmd: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    workdir: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<EnvWire<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restart: Option<RestartWire>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mounts: Vec<MountWire<'a>>,
}

/// A host mount as smolvm's create takes it (`MountSpec`).
#[derive(Debug, Serialize)]
struct MountWire<'a> {
    source: &'a std::path::Path,
    target: &'a str,
    readonly: bool,
}

/// smolvm's create request for `spec`, with its image resolved.
fn create_wire(spec: &MachineSpec, image: Option<String>) -> CreateWire<'_> {
    CreateWire {
        name: &spec.name,
        image,
        cpus: spec.cpus,
        memory_mb: spec.memory_mib,
        storage_gb: spec.storage_gib,
        overlay_gb: spec.overlay_gib,
        network: spec.network,
        ports: spec
            .ports
            .iter()
            .map(|port| PortWireOut {
                host: port.host_port,
                guest: port.guest_port,
                protocol: smolvm_protocol(port.protocol),
            })
            .collect(),
        allowed_cidrs: spec.allowed_cidrs.as_deref(),
        allowed_hosts: spec.allowed_hosts.as_deref(),
        entrypoint: &spec.workload.entrypoint,
        cmd: &spec.workload.cmd,
        workdir: spec.workload.workdir.as_deref(),
        env: spec
            .workload
            .env
            .iter()
            .map(|(name, value)| EnvWire { name, value })
            .collect(),
        restart: spec.workload.restart.map(|policy| RestartWire { policy }),
        stop_timeout_secs: spec.workload.stop_timeout_secs,
        mounts: spec
            .mounts
            .iter()
            .map(|mount| MountWire {
                source: &mount.source,
                target: &mount.target,
                readonly: mount.read_only,
            })
            .collect(),
    }
}

/// An environment variable as smolvm takes it (`Debug` hides the value).
#[derive(Debug, Serialize)]
struct EnvWire<'a> {
    name: &'a str,
    value: &'a Sensitive,
}

#[derive(Debug, Serialize)]
struct RestartWire {
    policy: &'static str,
}

/// The optional body of smolvm's start (`Debug` hides the credentials).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct StartWire<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    registry_auth: Option<&'a RegistryAuth>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    branchable: bool,
}

#[derive(Debug, Serialize)]
struct PortWireOut {
    host: u16,
    guest: u16,
    protocol: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ResizeWire {
    #[serde(skip_serializing_if = "Option::is_none")]
    cpus: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_mb: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    storage_gb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    overlay_gb: Option<u64>,
}

/// smolvm's spelling of a port protocol (lower case; the node API and the CRD write `TCP`).
fn smolvm_protocol(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

/// A port protocol as smolvm reports it (absent means TCP); `None` for one it does not name.
fn protocol_from_smolvm(text: Option<&str>) -> Option<Protocol> {
    match text {
        None | Some("tcp") => Some(Protocol::Tcp),
        Some("udp") => Some(Protocol::Udp),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Bodies below were observed from smolvm 1.32.2 (see docs/smolvm-api.md).

    #[test]
    fn state_words_are_read_in_one_place() {
        for (word, state) in [
            ("created", MachineState::Created),
            ("running", MachineState::Running),
            ("stopped", MachineState::Stopped),
            ("failed", MachineState::Failed),
            ("Running", MachineState::Running),
            ("error", MachineState::Failed),
            ("pausing", MachineState::Unknown),
        ] {
            assert_eq!(state_from_word(word), state, "{word}");
        }
        for state in [
            MachineState::Created,
            MachineState::Running,
            MachineState::Stopped,
            MachineState::Failed,
        ] {
            assert_eq!(state_from_word(state_word(state)), state);
        }
        // smolvm's own word is kept verbatim, a word this protocol does not know included.
        let raw = serde_json::json!({"name": "m1", "state": "pausing"});
        let machine = machine_from_json(raw).expect("a machine");
        assert_eq!(
            (machine.state, machine.runtime_state()),
            (MachineState::Unknown, "pausing".to_string())
        );
        let mut double = machine.clone();
        double.raw = serde_json::Value::Null;
        double.state = MachineState::Running;
        assert_eq!(double.runtime_state(), "running");
    }

    #[test]
    fn api_errors_keep_smolvm_messages() {
        let cases: &[(Operation, u16, &str, &str)] = &[
            (
                Operation::Get,
                404,
                r#"{"error":"machine 'nope' not found","code":"NOT_FOUND"}"#,
                "NotFound",
            ),
            (
                Operation::Create,
                409,
                r#"{"error":"machine 'm1' already exists","code":"CONFLICT"}"#,
                "Conflict",
            ),
            (
                Operation::Create,
                400,
                r#"{"error":"machine name contains invalid character: '.'","code":"BAD_REQUEST"}"#,
                "InvalidRequest",
            ),
            (
                Operation::Start,
                500,
                r#"{"error":"failed to start machine: agent operation failed: wait for ready: agent did not become ready within 30 seconds: no boot progress for 30 seconds","code":"INTERNAL_ERROR"}"#,
                "StartFailed",
            ),
            (
                Operation::Start,
                409,
                r#"{"error":"failed to start machine: ... Address already in use (os error 98) (boot process exited (code 1) before the agent was ready)","code":"PORT_IN_USE"}"#,
                "Conflict",
            ),
            (
                Operation::Delete,
                500,
                r#"{"error":"failed to delete","code":"INTERNAL_ERROR"}"#,
                "RuntimeError",
            ),
            (
                Operation::Pause,
                409,
                r#"{"error":"machine 'm1' must be running","code":"CONFLICT"}"#,
                "NotRunning",
            ),
            (
                Operation::Resume,
                409,
                r#"{"error":"machine is not paused; use start for a fresh boot","code":"CONFLICT"}"#,
                "NotPaused",
            ),
            (
                Operation::Pause,
                404,
                r#"{"error":"machine 'nope' not found","code":"NOT_FOUND"}"#,
                "NotFound",
            ),
            (
                Operation::Resume,
                404,
                r#"{"error":"machine 'nope' not found","code":"NOT_FOUND"}"#,
                "NotFound",
            ),
        ];
        for (operation, status, body, code) in cases {
            let status = StatusCode::from_u16(*status).expect("valid status");
            let error = map_error(*operation, status, body.as_bytes());
            assert_eq!(error.code(), *code, "{operation:?} {status}: {error:?}");
            let expected: ErrorWire = serde_json::from_str(body).expect("valid body");
            assert_eq!(error.message(), expected.error);
        }
    }

    #[test]
    fn smolvm_log_lines_in_errors_are_cleaned() {
        // As smolvm 1.32.2 answers a start whose guest cannot boot on these machines: its log
        // line, with colours and a timestamp, inside the error text.
        let at = |when: &str| {
            let error = format!(
                "failed to start machine: \u{1b}[2m{when}\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m \u{1b}[2msmolvm::agent\u{1b}[0m\u{1b}[2m:\u{1b}[0m boot process exited (code 1) before the agent was ready"
            );
            let body = serde_json::json!({"error": error, "code": "INTERNAL_ERROR"}).to_string();
            map_error(Operation::Start, StatusCode::INTERNAL_SERVER_ERROR, body.as_bytes())
        };
        let first = at("2026-11-22T12:42:15Z");
        let second = at("2026-11-22T12:43:02.518Z");
        assert_eq!(first.code(), "StartFailed");
        assert!(!first.message().chars().any(char::is_control), "{first:?}");
        assert!(!first.message().contains("2026-11-22"), "{first:?}");
        assert!(
            first.message().contains("boot process exited (code 1)"),
            "the cause is kept: {first:?}"
        );
        assert_eq!(
            first.message(),
            second.message(),
            "a retry of the same failure reads the same"
        );
    }

    #[test]
    fn plain_text_and_empty_bodies() {
        let error = map_error(
            Operation::Create,
            StatusCode::UNPROCESSABLE_ENTITY,
            b"Failed to deserialize the JSON body into the target type: cpus: invalid value: integer `1000`, expected u8 at line 1 column 24",
        );
        assert!(matches!(error, VmmError::BadRequest { .. }));
        assert!(error.message().contains("expected u8"));

        let error = map_error(Operation::Get, StatusCode::NOT_FOUND, b"");
        assert_eq!(error.code(), "RuntimeProtocolError");
        let error = map_error(Operation::Create, StatusCode::METHOD_NOT_ALLOWED, b"");
        assert_eq!(error.code(), "RuntimeProtocolError");
        let error = map_error(Operation::List, StatusCode::INTERNAL_SERVER_ERROR, b"boom");
        assert_eq!(
            error,
            VmmError::Internal {
                status: 500,
                message: "boom".into()
            }
        );
        let error = map_error(Operation::Start, StatusCode::SERVICE_UNAVAILABLE, b"");
        assert_eq!(error.code(), "RuntimeUnavailable");
    }

    #[test]
    fn reads_observed_machine() {
        let body = r#"{"diskChainDepth":1,"name":"m4","image":"local-dir:/tmp/x/images/mini","state":"created","cpus":1,"memoryMb":512,"mounts":[],"ports":[{"host":18081,"guest":80},{"host":18095,"guest":53,"protocol":"udp"}],"network":false,"gpu":false,"cuda":false,"storageGb":21,"overlayGb":10,"blockIo":"sync","diskDurability":"full","branchable":false,"forkable":false,"branchpointHeld":false,"forkpointHeld":false,"diskUsedMb":0,"createdAt":1795305169}"#;
        let machine = parse_machine_bytes(body.as_bytes()).expect("machine");
        assert_eq!(machine.name, "m4");
        assert_eq!(machine.state, MachineState::Created);
        assert_eq!((machine.cpus, machine.memory_mib), (1, 512));
        assert_eq!((machine.storage_gib, machine.overlay_gib), (Some(21), Some(10)));
        assert_eq!(machine.image.as_deref(), Some("local-dir:/tmp/x/images/mini"));
        assert_eq!(
            machine.ports,
            vec![
                PortMapping {
                    host_port: 18081,
                    guest_port: 80,
                    protocol: Protocol::Tcp
                },
                PortMapping {
                    host_port: 18095,
                    guest_port: 53,
                    protocol: Protocol::Udp
                }
            ]
        );
        assert_eq!(machine.raw["diskChainDepth"], 1);

        let started = parse_machine_bytes(br#"{"started":"m4"}"#);
        assert!(started.is_err());
        let bad_port = parse_machine_bytes(br#"{"name":"x","state":"running","ports":[{"host":70000,"guest":80}]}"#);
        assert!(matches!(bad_port, Err(VmmError::Protocol(_))));
    }

    #[test]
    fn local_images_resolve_inside_the_directory() {
        let client =
            SmolvmClient::new(SmolvmConfig::new("/run/smolvm.sock").with_local_image_dir("/var/lib/smolvm/images"));
        assert_eq!(
            client.resolve_image("local:tiny").expect("resolves"),
            "/var/lib/smolvm/images/tiny"
        );
        assert_eq!(client.resolve_image("alpine:latest").expect("passes"), "alpine:latest");
        for bad in ["local:", "local:../etc", "local:a/b", "local:.", "local:/etc"] {
            let error = client.resolve_image(bad).expect_err(bad);
            assert_eq!(error.code(), "InvalidRequest", "{bad}");
        }
        let without_dir = SmolvmClient::new(SmolvmConfig::new("/run/smolvm.sock"));
        assert!(without_dir.resolve_image("local:tiny").is_err());
    }

    #[test]
    fn names_cannot_escape_their_path_segment() {
        assert_eq!(machine_path("vm-1_a"), "/api/v1/machines/vm-1_a");
        assert_eq!(machine_path("../x?y=1"), "/api/v1/machines/%2E%2E%2Fx%3Fy%3D1");
    }

    #[test]
    fn create_body_matches_smolvm_fields() {
        let spec = MachineSpec {
            name: "m".into(),
            image: None,
            cpus: 1,
            memory_mib: 256,
            storage_gib: Some(20),
            overlay_gib: None,
            network: false,
            ports: vec![crate::vmm::PortMapping {
                host_port: 8080,
                guest_port: 80,
                protocol: crate::vmm::Protocol::Tcp,
            }],
            allowed_cidrs: None,
            allowed_hosts: None,
            workload: Default::default(),
            mounts: Vec::new(),
        };
        let json: serde_json::Value =
            serde_json::from_slice(&to_json(&create_wire(&spec, None)).expect("encodes")).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"name":"m","cpus":1,"memoryMb":256,"storageGb":20,"network":false,
                "ports":[{"host":8080,"guest":80,"protocol":"tcp"}]})
        );
        let spec = MachineSpec {
            network: true,
            allowed_hosts: Some(vec!["api.example.com".into()]),
            workload: crate::vmm::Workload {
                entrypoint: vec!["/bin/app".into()],
                cmd: vec!["--port".into(), "80".into()],
                workdir: Some("/srv".into()),
                env: vec![("TOKEN".into(), Sensitive("s3cret".into()))],
                restart: Some("on-failure"),
                stop_timeout_secs: Some(10),
            },
            ..spec
        };
        let json: serde_json::Value =
            serde_json::from_slice(&to_json(&create_wire(&spec, None)).expect("encodes")).expect("json");
        assert_eq!(json["entrypoint"], serde_json::json!(["/bin/app"]));
        assert_eq!(json["cmd"], serde_json::json!(["--port", "80"]));
        assert_eq!(json["workdir"], "/srv");
        assert_eq!(json["env"], serde_json::json!([{"name": "TOKEN", "value": "s3cret"}]));
        assert_eq!(json["restart"], serde_json::json!({"policy": "on-failure"}));
        assert_eq!(json["stopTimeoutSecs"], 10);
        assert_eq!(json["allowedHosts"], serde_json::json!(["api.example.com"]));
        assert!(json.get("mounts").is_none(), "no mounts, no field");
        let spec = MachineSpec {
            mounts: vec![crate::vmm::HostMount {
                source: "/var/lib/smolvm/volumes/svm-a/data".into(),
                target: "/data".into(),
                read_only: true,
            }],
            ..spec
        };
        let json: serde_json::Value =
            serde_json::from_slice(&to_json(&create_wire(&spec, None)).expect("encodes")).expect("json");
        assert_eq!(
            json["mounts"],
            serde_json::json!([{"source": "/var/lib/smolvm/volumes/svm-a/data", "target": "/data", "readonly": true}])
        );
        // The request's Debug form (what a log line could show) hides the value.
        assert!(!format!("{:?}", create_wire(&spec, None)).contains("s3cret"));
    }
}
