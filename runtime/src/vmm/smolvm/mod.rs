//! [`Vmm`] over `smolvm serve`'s HTTP/1.1 JSON API on a Unix socket.
//!
//! Each call opens its own connection (a Unix socket connect is cheap, and no pooled
//! connection can go stale across a `smolvm serve` restart), sends one request, reads the
//! whole answer under a size cap, and runs under the call's time limit.
//!
//! Here: the client's configuration and the [`Vmm`] calls. `transport` sends one request and
//! reads its answer; `paths` spells where a machine's calls go; `errors` maps smolvm's refusals
//! (the interactive exec's handshake, [`super::interactive`], maps its own with it); `machine`
//! reads a machine's record and state words; `wire` holds the other calls' bodies; `pools` the
//! fork pools and their leases; `branches` a branch of a running machine.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::Method;
use hyper::header::CONTENT_TYPE;

use base64::Engine as _;
use futures::StreamExt as _;

use super::{
    BranchRequest, DeleteOutcome, ExecOutput, ExecRequest, FileContent, LeaseInfo, LeaseRequest, LogQuery, LogStream,
    Machine, MachineSpec, PoolInfo, PoolRequest, RegistryAuth, ResizeRequest, Vmm, VmmCapacity, VmmError, VmmHealth,
};
use machine::parse_machine_bytes;
use paths::{MACHINES, file_path, machine_path};
use transport::chunks;
use wire::{
    CapacityWire, EnvWire, ExecAnswerWire, ExecWire, HealthWire, ListWire, ResizeWire, StartWire, create_wire,
    parse_json, to_json,
};

mod branches;
pub(super) mod errors;
mod machine;
mod paths;
mod pools;
mod transport;
mod wire;

pub use errors::{Operation, map_error};
pub use machine::{machine_from_json, state_from_word, state_word, state_word_of};

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

    async fn branch(&self, source: &str, request: &BranchRequest<'_>) -> Result<Machine, VmmError> {
        self.branch_call(source, request).await
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
