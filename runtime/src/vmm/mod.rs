//! The VMM abstraction the runtime agent drives: one machine runtime on this node.
//!
//! [`Vmm`] is what the agent's node API calls; [`SmolvmClient`] implements it against
//! `smolvm serve` over its Unix socket. The trait is object safe (`Arc<dyn Vmm>`), so tests
//! and other runtimes can stand in for smolvm.
//!
//! Semantics follow smolvm's own (see `docs/smolvm-api.md`): `create` of an existing name is a
//! [`VmmError::Conflict`], `stop` of a stopped machine succeeds, `delete` of a missing machine
//! reports [`DeleteOutcome::Missing`], `get` of a missing machine is `None`, `pause` needs a
//! running machine and `resume` a paused one (a paused machine reads `stopped`). Errors keep smolvm's
//! own message text and carry a stable [`VmmError::code`].

use smolvm_api::Protocol;

use async_trait::async_trait;
/// A machine's lifecycle state: the node API's own type. smolvm's state words are read into it
/// in one place, [`smolvm::state_from_word`].
pub use smolvm_api::nodeapi::MachineState;
pub use smolvm_api::nodeapi::{RegistryAuth, Sensitive};

pub mod interactive;
pub mod smolvm;
pub mod sse;

pub use interactive::{InteractiveRequest, Session, SessionInput, SessionOutput};
pub use smolvm::{SmolvmClient, SmolvmConfig};

/// A machine runtime on this node (smolvm, or a stand-in in tests).
#[async_trait]
pub trait Vmm: Send + Sync {
    /// Liveness and version of the runtime.
    async fn health(&self) -> Result<VmmHealth, VmmError>;

    /// Every machine the runtime knows, in the runtime's order.
    async fn list(&self) -> Result<Vec<Machine>, VmmError>;

    /// What the runtime says of this host: its serve process's boot id and its devices.
    async fn capacity(&self) -> Result<VmmCapacity, VmmError> {
        Err(unsupported("capacity"))
    }

    /// One machine, or `None` when the runtime has no machine of that name.
    async fn get(&self, name: &str) -> Result<Option<Machine>, VmmError>;

    /// Creates a machine (not started). An existing name is a [`VmmError::Conflict`].
    async fn create(&self, spec: &MachineSpec) -> Result<Machine, VmmError>;

    /// Boots a machine and returns it as the runtime then reports it, with registry credentials
    /// for this start only (never stored). A boot that fails is a [`VmmError::StartFailed`]
    /// carrying the runtime's message.
    async fn start(&self, name: &str, registry_auth: Option<&RegistryAuth>) -> Result<Machine, VmmError>;

    /// Stops a machine; stopping a stopped (or never started) machine succeeds.
    async fn stop(&self, name: &str) -> Result<Machine, VmmError>;

    /// Deletes a machine and its disks; a machine that is already gone is `Missing`, not an error.
    async fn delete(&self, name: &str) -> Result<DeleteOutcome, VmmError>;

    /// Grows disks (any state) or changes CPUs / memory live (running machines only, as smolvm
    /// allows). Asking for the current size again succeeds.
    async fn resize(&self, name: &str, request: &ResizeRequest) -> Result<Machine, VmmError>;

    /// Pauses a running machine: its memory and disks saved durably, then its process stopped
    /// (smolvm then reports it `stopped`). A machine that is not running is a
    /// [`VmmError::NotRunning`].
    async fn pause(&self, name: &str) -> Result<Machine, VmmError> {
        let _ = name;
        Err(unsupported("pause"))
    }

    /// Resumes a paused machine with its processes as they were. A machine that was not
    /// paused is a [`VmmError::NotPaused`] (a fresh boot is [`Vmm::start`]).
    async fn resume(&self, name: &str) -> Result<Machine, VmmError> {
        let _ = name;
        Err(unsupported("resume"))
    }

    /// Starts a machine as a branch source (smolvm's `branchable` start: its memory can be
    /// forked), the source of a pool.
    async fn start_branchable(&self, name: &str, registry_auth: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        let _ = (name, registry_auth);
        Err(unsupported("branchable starts"))
    }

    /// Makes `request.name` a copy-on-write branch of the running branchable machine `source`
    /// (smolvm's branches route): its memory and disks are the source's at this moment, its
    /// environment the source's plus `request.env`, its published ports `request.ports` only.
    /// A missing source is a [`VmmError::NotFound`]; one that is not branchable, or a name
    /// that is taken, a [`VmmError::Conflict`].
    async fn branch(&self, source: &str, request: &BranchRequest<'_>) -> Result<Machine, VmmError> {
        let _ = (source, request);
        Err(unsupported("branches"))
    }

    /// The pools the runtime keeps.
    async fn pools(&self) -> Result<Vec<PoolInfo>, VmmError> {
        Err(unsupported("pools"))
    }

    /// Creates a pool of ready machines forked from a running branch source. A source that is
    /// not running is a [`VmmError::Conflict`]; a missing one a [`VmmError::NotFound`].
    async fn create_pool(&self, request: &PoolRequest<'_>) -> Result<PoolInfo, VmmError> {
        let _ = request;
        Err(unsupported("pools"))
    }

    /// Sets how many ready machines a pool keeps.
    async fn resize_pool(&self, name: &str, ready: u32) -> Result<PoolInfo, VmmError> {
        let _ = (name, ready);
        Err(unsupported("pools"))
    }

    /// Deletes a pool and its ready machines, never its leased ones: a pool with active leases
    /// is a [`VmmError::Conflict`]; a missing one [`DeleteOutcome::Missing`].
    async fn delete_pool(&self, name: &str) -> Result<DeleteOutcome, VmmError> {
        let _ = name;
        Err(unsupported("pools"))
    }

    /// Takes one ready machine of a pool; the same key again answers the same lease. A pool
    /// with no ready machine is a [`VmmError::NoReadySlot`].
    async fn acquire_lease(&self, pool: &str, request: &LeaseRequest<'_>) -> Result<LeaseInfo, VmmError> {
        let _ = (pool, request);
        Err(unsupported("leases"))
    }

    /// Keeps a lease alive for its time to live again.
    async fn heartbeat_lease(&self, pool: &str, lease: &str) -> Result<LeaseInfo, VmmError> {
        let _ = (pool, lease);
        Err(unsupported("leases"))
    }

    /// Ends a lease; the runtime retires its machine.
    async fn complete_lease(&self, pool: &str, lease: &str) -> Result<LeaseInfo, VmmError> {
        let _ = (pool, lease);
        Err(unsupported("leases"))
    }

    /// A machine's log as plain text lines. A log that does not exist yet (a machine never
    /// started) is empty; with `follow` the stream stays open for new lines.
    async fn logs(&self, name: &str, query: &LogQuery) -> Result<LogStream, VmmError> {
        let _ = (name, query);
        Err(unsupported("logs"))
    }

    /// Runs one command in a running machine and waits for it. Never boots a stopped machine:
    /// that is a [`VmmError::Conflict`].
    async fn exec(&self, name: &str, request: &ExecRequest) -> Result<ExecOutput, VmmError> {
        let _ = (name, request);
        Err(unsupported("exec"))
    }

    /// Starts a command in a running machine, attached: its stdin, stdout and stderr stream
    /// while it runs (on a terminal when asked), then how it ended. Never boots a stopped
    /// machine: callers check first.
    async fn exec_interactive(&self, name: &str, request: &InteractiveRequest) -> Result<Session, VmmError> {
        let _ = (name, request);
        Err(unsupported("interactive exec"))
    }

    /// A file of a running machine, streamed (at most `limit` bytes: the stream fails beyond),
    /// or a directory's listing as JSON. Never boots a stopped machine: callers check first.
    async fn read_file(&self, name: &str, path: &str, limit: u64) -> Result<FileContent, VmmError> {
        let _ = (name, path, limit);
        Err(unsupported("reading files"))
    }

    /// Writes a file into a running machine (parents made), with `mode` when given.
    async fn write_file(
        &self,
        name: &str,
        path: &str,
        mode: Option<u32>,
        content: bytes::Bytes,
    ) -> Result<(), VmmError> {
        let _ = (name, path, mode, content);
        Err(unsupported("writing files"))
    }
}

/// What reading a path of a machine gives.
pub struct FileContent {
    /// Whether the path is a directory (the stream is then its JSON listing).
    pub directory: bool,
    /// The bytes.
    pub stream: LogStream,
}

fn unsupported(what: &str) -> VmmError {
    VmmError::BadRequest {
        message: format!("this runtime does not support {what}"),
    }
}

/// A pool of ready machines forked from one branch source, as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolInfo {
    /// The pool's name.
    pub name: String,
    /// Its source machine.
    pub source: String,
    /// Ready machines wanted.
    pub desired: u32,
    /// Ready machines now.
    pub ready: u32,
    /// Machines being forked and booted.
    pub provisioning: u32,
    /// Machines held by active leases.
    pub active: u32,
}

/// What a new pool is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRequest<'a> {
    /// The pool's name.
    pub name: &'a str,
    /// The running branch source its machines are forked from.
    pub source: &'a str,
    /// Ready machines to keep.
    pub ready: u32,
    /// Seconds a leased machine lives without a heartbeat.
    pub lease_ttl_secs: u64,
}

/// What a lease asks for.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest<'a> {
    /// The retry key: the same key answers the same lease.
    pub key: &'a str,
    /// Environment installed in the machine before its workload runs.
    pub env: &'a [(String, Sensitive)],
    /// Seconds it lives without a heartbeat.
    pub ttl_secs: u64,
}

/// What a branch of a running machine is made with.
#[derive(Debug, Clone, Copy)]
pub struct BranchRequest<'a> {
    /// The new machine's name.
    pub name: &'a str,
    /// Environment added to the source's, delivered before the branch's workload goes on.
    pub env: &'a [(String, Sensitive)],
    /// The branch's own published ports (none when empty).
    pub ports: &'a [PortMapping],
}

/// One lease on a pool's machine, as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseInfo {
    /// The lease's id (for heartbeats and completion).
    pub id: String,
    /// The pool.
    pub pool: String,
    /// The machine it holds.
    pub machine: String,
    /// `activating`, `active`, `completed`, `expired`, `failed` or `cancelled`.
    pub state: String,
}

/// Which log of a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogSource {
    /// The guest agent's and kernel's console (smolvm's default).
    #[default]
    Console,
    /// The workload's standard output and error (kept while the machine is stopped).
    Workload,
}

impl LogSource {
    /// Reads `console` or `workload`.
    pub fn parse(source: &str) -> Option<Self> {
        match source {
            "console" => Some(Self::Console),
            "workload" => Some(Self::Workload),
            _ => None,
        }
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Console => "console",
            Self::Workload => "workload",
        }
    }
}

/// What part of a log to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogQuery {
    /// Which log.
    pub source: LogSource,
    /// Only the last this many lines.
    pub tail: Option<u32>,
    /// Keep the stream open for new lines.
    pub follow: bool,
}

/// A stream of bytes from the runtime: a log (chunks of whole lines) or a file.
pub type LogStream = futures::stream::BoxStream<'static, Result<bytes::Bytes, VmmError>>;

/// One command to run in a machine.
pub type ExecRequest = smolvm_api::nodeapi::ExecRequest;

/// What a command left: its exit code and its output, byte-exact.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecOutput {
    /// Exit code.
    pub exit_code: i32,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
}

/// What the runtime says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmmHealth {
    /// The runtime's own status word (`"ok"` for smolvm).
    pub status: String,
    /// The runtime's version, e.g. `"1.32.2"`.
    pub version: String,
    /// Whether the runtime runs nested-virtualization machines.
    pub nested_virt: bool,
    /// Machines the runtime knows, when it says.
    pub machines_total: Option<u64>,
    /// Machines currently running, when it says.
    pub machines_running: Option<u64>,
    /// Seconds since the runtime server started, when it says.
    pub uptime_seconds: Option<u64>,
}

/// What the runtime says of this host (smolvm's `/capacity`), the parts the agent uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VmmCapacity {
    /// An opaque id minted once per runtime server process: it changes exactly when the runtime
    /// restarts.
    pub boot_id: Option<String>,
    /// CUDA devices the runtime sees (0 when it reports none).
    pub gpu_count: u32,
}

/// A host port published to a guest port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortMapping {
    /// Port on the host (smolvm binds it on 127.0.0.1).
    pub host_port: u16,
    /// Port inside the machine.
    pub guest_port: u16,
    /// Transport.
    pub protocol: Protocol,
}

/// A machine as the runtime reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// Machine name (unique on the node).
    pub name: String,
    /// Lifecycle state, read from the runtime's word ([`Machine::runtime_state`]).
    pub state: MachineState,
    /// vCPUs.
    pub cpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Storage disk size in GiB, when reported.
    pub storage_gib: Option<u64>,
    /// Overlay disk size in GiB, when reported.
    pub overlay_gib: Option<u64>,
    /// The image as the runtime reports it: an OCI reference as given, `local-dir:<path>` for a
    /// local rootfs directory, `local:<sha256>` for a local image archive; `None` without image.
    pub image: Option<String>,
    /// Published ports.
    pub ports: Vec<PortMapping>,
    /// Whether outbound networking is enabled.
    pub network: bool,
    /// Host PID of the machine's VMM process while running.
    pub pid: Option<u32>,
    /// The runtime's whole JSON object for this machine, for fields not modelled here.
    pub raw: serde_json::Value,
}

/// What to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSpec {
    /// Machine name: letters, digits, `-` and `_`, starting with a letter or digit.
    pub name: String,
    /// OCI reference (pulled on first start, not on create), or `local:<name>` for an archive or
    /// rootfs directory in the runtime's local image directory; `None` boots smolvm's own
    /// minimal agent rootfs.
    pub image: Option<String>,
    /// vCPUs (smolvm: 1–255).
    pub cpus: u32,
    /// Memory in MiB (smolvm: at least 64).
    pub memory_mib: u32,
    /// Storage disk in GiB (smolvm default 20).
    pub storage_gib: Option<u64>,
    /// Overlay disk in GiB (smolvm default 10).
    pub overlay_gib: Option<u64>,
    /// Outbound network access.
    pub network: bool,
    /// Published ports.
    pub ports: Vec<PortMapping>,
    /// Egress allow-list; `None` leaves egress unrestricted, an empty list denies all.
    pub allowed_cidrs: Option<Vec<String>>,
    /// Egress allow-list by host name (and subdomains); `None` when not restricted by name.
    pub allowed_hosts: Option<Vec<String>>,
    /// What runs inside.
    pub workload: Workload,
    /// Host directories served to the guest (smolvm's `mounts`, virtiofs), fixed for the
    /// machine's life.
    pub mounts: Vec<HostMount>,
}

/// A host directory a machine's guest sees (smolvm's `MountSpec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMount {
    /// The host directory (absolute; smolvm needs it to exist and records it with its links
    /// resolved).
    pub source: std::path::PathBuf,
    /// Where the guest sees it (absolute).
    pub target: String,
    /// Read-only for the guest.
    pub read_only: bool,
}

/// What runs inside a machine, in smolvm's terms; empty fields keep the image's defaults.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Workload {
    /// smolvm `entrypoint` (a Pod's `command`).
    pub entrypoint: Vec<String>,
    /// smolvm `cmd` (a Pod's `args`).
    pub cmd: Vec<String>,
    /// smolvm `workdir`.
    pub workdir: Option<String>,
    /// smolvm `env`: names and values (values may be secret; never logged).
    pub env: Vec<(String, Sensitive)>,
    /// smolvm restart policy word (`always`, `on-failure`, `never`); `None` keeps smolvm's.
    pub restart: Option<&'static str>,
    /// smolvm `stopTimeoutSecs`; `None` keeps smolvm's default.
    pub stop_timeout_secs: Option<u64>,
}

impl Machine {
    /// The runtime's own word for the machine's state, verbatim as it reported it (smolvm's
    /// `state`); for a machine no runtime reported (a test double's), the word of its state.
    pub fn runtime_state(&self) -> String {
        smolvm::state_word_of(&self.raw).map_or_else(|| smolvm::state_word(self.state).to_string(), str::to_string)
    }

    /// The machine this one was branched from, as the runtime records it (smolvm's
    /// `parentMachine`); `None` for a machine created on its own.
    pub fn parent(&self) -> Option<&str> {
        self.raw.get("parentMachine").and_then(serde_json::Value::as_str)
    }

    /// Whether the machine runs as a branch source (smolvm's `branchable`).
    pub fn branchable(&self) -> bool {
        self.raw
            .get("branchable")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    }

    /// The machine a runtime reports right after creating `spec`: state created, the spec's
    /// size, image, ports and network, no process yet.
    pub fn created_from(spec: &MachineSpec) -> Self {
        Machine {
            name: spec.name.clone(),
            state: MachineState::Created,
            cpus: spec.cpus,
            memory_mib: u64::from(spec.memory_mib),
            storage_gib: spec.storage_gib,
            overlay_gib: spec.overlay_gib,
            image: spec.image.clone(),
            ports: spec.ports.clone(),
            network: spec.network,
            pid: None,
            raw: serde_json::Value::Null,
        }
    }

    /// A machine in `state` of 1 vCPU and 512 MiB that publishes `ports` (each to guest port
    /// 80), with its network on: what the forwarder reads of a machine, for its tests and doubles.
    pub fn publishing(name: &str, state: MachineState, ports: &[(u16, smolvm_api::Protocol)]) -> Self {
        let mut spec = MachineSpec::new(name, 1, 512);
        spec.network = true;
        spec.ports = ports
            .iter()
            .map(|&(host_port, protocol)| PortMapping {
                host_port,
                guest_port: 80,
                protocol,
            })
            .collect();
        Machine {
            state,
            ..Machine::created_from(&spec)
        }
    }
}

impl MachineSpec {
    /// A spec with the given name and size, no image, no disks sizes, no network.
    pub fn new(name: impl Into<String>, cpus: u32, memory_mib: u32) -> Self {
        Self {
            name: name.into(),
            image: None,
            cpus,
            memory_mib,
            storage_gib: None,
            overlay_gib: None,
            network: false,
            ports: Vec::new(),
            allowed_cidrs: None,
            allowed_hosts: None,
            workload: Workload::default(),
            mounts: Vec::new(),
        }
    }
}

/// A resize; fields left `None` are unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResizeRequest {
    /// Target online vCPUs (live; running machines only).
    pub cpus: Option<u32>,
    /// Target memory in MiB (live growth; running machines only).
    pub memory_mib: Option<u32>,
    /// Storage disk in GiB (grow only).
    pub storage_gib: Option<u64>,
    /// Overlay disk in GiB (grow only).
    pub overlay_gib: Option<u64>,
}

/// Result of a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The machine existed and is now deleted.
    Deleted,
    /// There was no machine of that name.
    Missing,
}

/// A runtime failure, with smolvm's own message text where smolvm gave one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmmError {
    /// The machine does not exist (smolvm 404 `NOT_FOUND`).
    #[error("{message}")]
    NotFound { message: String },
    /// The request conflicts with existing state: the name is taken, a host port is in use
    /// (smolvm 409 `CONFLICT` / `PORT_IN_USE`).
    #[error("{message}")]
    Conflict { message: String },
    /// A pause of a machine that is not running (smolvm 409 `CONFLICT` on pause).
    #[error("{message}")]
    NotRunning { message: String },
    /// A resume of a machine that was not paused: there is no saved state (smolvm 409
    /// `CONFLICT` on resume).
    #[error("{message}")]
    NotPaused { message: String },
    /// The runtime refused the request as invalid (smolvm 400, 403, 415, 422), or the request
    /// could not be expressed for it (for example `local:` without a local image directory).
    #[error("{message}")]
    BadRequest { message: String },
    /// A start failed: boot failure, image pull failure (smolvm 5xx on start).
    #[error("{message}")]
    StartFailed { message: String },
    /// The runtime cannot be reached: socket missing, connection refused or dropped, or smolvm
    /// answered 503.
    #[error("smolvm is unavailable: {message}")]
    Unavailable { message: String },
    /// The runtime did not answer within the call's time limit; the operation may still finish.
    #[error("{message}")]
    Timeout { message: String },
    /// A pool had no ready machine to lease (smolvm 503 on a lease).
    #[error("{message}")]
    NoReadySlot { message: String },
    /// The runtime failed the request (smolvm 5xx other than on start, or an unexpected status).
    #[error("smolvm failed (HTTP {status}): {message}")]
    Internal { status: u16, message: String },
    /// The runtime answered something this client cannot read (unknown route, bad JSON).
    #[error("unexpected answer from smolvm: {0}")]
    Protocol(String),
}

impl VmmError {
    /// Stable code for node API errors and conditions.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "NotFound",
            Self::Conflict { .. } => "Conflict",
            Self::NotRunning { .. } => "NotRunning",
            Self::NotPaused { .. } => "NotPaused",
            Self::BadRequest { .. } => "InvalidRequest",
            Self::StartFailed { .. } => "StartFailed",
            Self::Unavailable { .. } => "RuntimeUnavailable",
            Self::Timeout { .. } => "RuntimeTimeout",
            Self::NoReadySlot { .. } => "NoReadySlot",
            Self::Internal { .. } => "RuntimeError",
            Self::Protocol(_) => "RuntimeProtocolError",
        }
    }

    /// The message alone, without the variant's prefix.
    pub fn message(&self) -> &str {
        match self {
            Self::NotFound { message }
            | Self::Conflict { message }
            | Self::NotRunning { message }
            | Self::NotPaused { message }
            | Self::BadRequest { message }
            | Self::StartFailed { message }
            | Self::Unavailable { message }
            | Self::Timeout { message }
            | Self::NoReadySlot { message }
            | Self::Internal { message, .. } => message,
            Self::Protocol(message) => message,
        }
    }

    /// Whether the same call may succeed later without a change of request.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable { .. } | Self::Timeout { .. } | Self::Internal { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable() {
        let m = || "m".to_string();
        let cases = [
            (VmmError::NotFound { message: m() }, "NotFound"),
            (VmmError::Conflict { message: m() }, "Conflict"),
            (VmmError::NotRunning { message: m() }, "NotRunning"),
            (VmmError::NotPaused { message: m() }, "NotPaused"),
            (VmmError::BadRequest { message: m() }, "InvalidRequest"),
            (VmmError::StartFailed { message: m() }, "StartFailed"),
            (VmmError::Unavailable { message: m() }, "RuntimeUnavailable"),
            (VmmError::Timeout { message: m() }, "RuntimeTimeout"),
            (
                VmmError::Internal {
                    status: 500,
                    message: m(),
                },
                "RuntimeError",
            ),
            (VmmError::Protocol(m()), "RuntimeProtocolError"),
        ];
        for (error, code) in cases {
            assert_eq!(error.code(), code);
            assert_eq!(error.message(), "m");
        }
    }

    #[test]
    fn vmm_is_object_safe() {
        fn takes(_: Option<std::sync::Arc<dyn Vmm>>) {}
        takes(None);
    }
}
