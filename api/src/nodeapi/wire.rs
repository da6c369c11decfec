//! The node API's wire types (JSON over HTTPS with mTLS, version [`API_PREFIX`]): the bodies of
//! the operations of [`super::Operation`], and the error body with its stable [`ErrorCode`].
//!
//! Self-contained (serde only) so the controller's client and the agent share them. All field
//! names are camelCase; unknown request fields are rejected (400 `InvalidRequest`).

use serde::{Deserialize, Serialize};

use crate::types::Protocol;

/// Path prefix of this protocol version.
pub const API_PREFIX: &str = "/v1";

/// Longest machine name accepted.
pub const MAX_MACHINE_NAME_LEN: usize = 63;

/// The stable code of every [`NodeApiError`], with its HTTP status. On the wire it is the
/// variant's name (`"MachineNotFound"`); a code this build does not know (from a newer agent)
/// decodes as [`ErrorCode::Other`], never as an error.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum ErrorCode {
    /// 400: malformed JSON, unknown fields, invalid machine name, or smolvm refused the values.
    InvalidRequest,
    /// 401: missing or wrong bearer token.
    Unauthenticated,
    /// 403: authenticated but not allowed.
    Forbidden,
    /// 404: no machine of that name on this node.
    MachineNotFound,
    /// 404: the machine exists and runs, and has no file or directory at the path a files call
    /// reads; `details.path` names it.
    FileNotFound,
    /// 404: no pool of that name on this node.
    PoolNotFound,
    /// 404: no such route.
    RouteNotFound,
    /// 404: the machine a branch is asked of is not on this node (SPEC 2.6); `details.source`
    /// names it.
    SourceNotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 403: a published host port is one the policy excludes (`excludedHostPorts`: the node's
    /// own services and the agent's ports); `details` names the port, protocol and rule. Only a
    /// new machine is refused: an existing machine keeps its ports.
    HostPortExcluded,
    /// 403: the image was pulled on this node with registry credentials and this start
    /// presents none for its registry; `details.registry` names it. Another tenant's private
    /// image is never started without credentials (as the kubelet's KEP-2535 verification).
    ImagePullCredentialsRequired,
    /// 409: a machine of that name exists with a different spec; `details.fields` names them.
    MachineSpecConflict,
    /// 409: CPU/memory can change only on a running machine; `details.pending` names the
    /// fields not applied (disk growth in the same request was applied).
    ResizeRequiresRunning,
    /// 409: a published host port is taken on the node (smolvm's message is kept).
    HostPortInUse,
    /// 409: the call needs a running machine (exec, files); `details.state` names its state.
    /// The agent answers it before asking smolvm, which would boot a stopped machine instead.
    MachineNotRunning,
    /// 409: the machine was not suspended, so there is nothing to resume (smolvm keeps no saved
    /// state for it); `details.state` names its state.
    NoSavedState,
    /// 409: the machine is suspended and the call would throw its saved state away (a fresh
    /// start) or cannot apply to it (a live resize); resume it first. `details.state` is
    /// `Suspended`.
    AlreadySuspended,
    /// 409: the pool has no ready slot now (smolvm refills it as slots are taken); the
    /// SmolVM is created cold or waits, as its pool's `whenEmpty` says.
    NoReadySlot,
    /// 409: the pool still serves leased machines, so it is not deleted; its ready slots were
    /// given back. `details.leased` counts the machines. Retry once they are gone.
    PoolInUse,
    /// 409: the machine a branch is asked of does not run, and only a running machine can be
    /// branched; `details.source` and `details.state` name it and its state.
    SourceNotRunning,
    /// 409: the machine a branch is asked of was not started as a branch source (`branchable`);
    /// `details.source` names it.
    SourceNotBranchable,
    /// 409: another conflict reported by smolvm.
    Conflict,
    /// 413: request body larger than the limit.
    PayloadTooLarge,
    /// 500: the machine did not start; the message is smolvm's, verbatim.
    StartFailed,
    /// 500: smolvm failed the request otherwise.
    RuntimeError,
    /// 502: smolvm answered something the agent cannot read.
    RuntimeProtocolError,
    /// 503: smolvm is down or restarting.
    RuntimeUnavailable,
    /// 504: smolvm did not answer in time; the operation may still complete.
    RuntimeTimeout,
    /// 429: the machine or the node has as many exec and log-follow streams open as it allows;
    /// `details.scope` (`machine` or `node`) and `details.limit` say which. Retry when one ends.
    TooManyStreams,
    /// 429: the node holds as many bytes of file uploads at once as it allows (the files
    /// route keeps an upload in memory until smolvm has it); `details.limit` is that budget in
    /// bytes and `details.requested` what this upload asked for. Answered before the body is
    /// read when its length is declared. Retry when another upload ends.
    TooManyBytes,
    /// 403: the holder Pod named for a machine's volumes is not that machine's: its identity
    /// files (written by the kubelet from the Pod) do not name the SmolVM's namespace and UID,
    /// or are missing. `details.holderUid` names the Pod.
    HolderNotOwned,
    /// 403: a volume's directory would leave the holder Pod's own volumes directory (a `..`,
    /// a `/`, or a link that points elsewhere); `details.volume` names it.
    VolumePathOutsideHolder,
    /// 409: the kubelet has not mounted a volume in the holder Pod (yet); `details.volume`
    /// names it.
    VolumeNotMounted,
    /// 409: the call needs a machine that is not running (pointing its mounts at a new
    /// holder); `details.state` names its state.
    MachineRunning,
    /// A code this build does not know, as sent.
    Other(String),
}

impl ErrorCode {
    /// Every code this build knows.
    pub const KNOWN: [ErrorCode; 34] = [
        ErrorCode::InvalidRequest,
        ErrorCode::Unauthenticated,
        ErrorCode::Forbidden,
        ErrorCode::MachineNotFound,
        ErrorCode::FileNotFound,
        ErrorCode::PoolNotFound,
        ErrorCode::RouteNotFound,
        ErrorCode::SourceNotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::HostPortExcluded,
        ErrorCode::ImagePullCredentialsRequired,
        ErrorCode::MachineSpecConflict,
        ErrorCode::ResizeRequiresRunning,
        ErrorCode::HostPortInUse,
        ErrorCode::MachineNotRunning,
        ErrorCode::NoSavedState,
        ErrorCode::AlreadySuspended,
        ErrorCode::NoReadySlot,
        ErrorCode::PoolInUse,
        ErrorCode::SourceNotRunning,
        ErrorCode::SourceNotBranchable,
        ErrorCode::Conflict,
        ErrorCode::PayloadTooLarge,
        ErrorCode::StartFailed,
        ErrorCode::RuntimeError,
        ErrorCode::RuntimeProtocolError,
        ErrorCode::RuntimeUnavailable,
        ErrorCode::RuntimeTimeout,
        ErrorCode::TooManyStreams,
        ErrorCode::TooManyBytes,
        ErrorCode::HolderNotOwned,
        ErrorCode::VolumePathOutsideHolder,
        ErrorCode::VolumeNotMounted,
        ErrorCode::MachineRunning,
    ];

    /// The wire spelling of a code this build knows.
    fn known(&self) -> Option<&'static str> {
        Some(match self {
            ErrorCode::InvalidRequest => "InvalidRequest",
            ErrorCode::Unauthenticated => "Unauthenticated",
            ErrorCode::Forbidden => "Forbidden",
            ErrorCode::MachineNotFound => "MachineNotFound",
            ErrorCode::FileNotFound => "FileNotFound",
            ErrorCode::PoolNotFound => "PoolNotFound",
            ErrorCode::RouteNotFound => "RouteNotFound",
            ErrorCode::SourceNotFound => "SourceNotFound",
            ErrorCode::MethodNotAllowed => "MethodNotAllowed",
            ErrorCode::HostPortExcluded => "HostPortExcluded",
            ErrorCode::ImagePullCredentialsRequired => "ImagePullCredentialsRequired",
            ErrorCode::MachineSpecConflict => "MachineSpecConflict",
            ErrorCode::ResizeRequiresRunning => "ResizeRequiresRunning",
            ErrorCode::HostPortInUse => "HostPortInUse",
            ErrorCode::MachineNotRunning => "MachineNotRunning",
            ErrorCode::NoSavedState => "NoSavedState",
            ErrorCode::AlreadySuspended => "AlreadySuspended",
            ErrorCode::NoReadySlot => "NoReadySlot",
            ErrorCode::PoolInUse => "PoolInUse",
            ErrorCode::SourceNotRunning => "SourceNotRunning",
            ErrorCode::SourceNotBranchable => "SourceNotBranchable",
            ErrorCode::Conflict => "Conflict",
            ErrorCode::PayloadTooLarge => "PayloadTooLarge",
            ErrorCode::StartFailed => "StartFailed",
            ErrorCode::RuntimeError => "RuntimeError",
            ErrorCode::RuntimeProtocolError => "RuntimeProtocolError",
            ErrorCode::RuntimeUnavailable => "RuntimeUnavailable",
            ErrorCode::RuntimeTimeout => "RuntimeTimeout",
            ErrorCode::TooManyStreams => "TooManyStreams",
            ErrorCode::TooManyBytes => "TooManyBytes",
            ErrorCode::HolderNotOwned => "HolderNotOwned",
            ErrorCode::VolumePathOutsideHolder => "VolumePathOutsideHolder",
            ErrorCode::VolumeNotMounted => "VolumeNotMounted",
            ErrorCode::MachineRunning => "MachineRunning",
            ErrorCode::Other(_) => return None,
        })
    }

    /// The wire spelling.
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::Other(code) => code,
            known => known.known().unwrap_or_default(),
        }
    }

    /// A label for metrics: the code, or `Other` for one this build does not know (so a peer
    /// cannot grow the label set).
    pub fn label(&self) -> &'static str {
        self.known().unwrap_or("Other")
    }

    /// The HTTP status that goes with the code (500 for one this build does not know).
    pub fn status(&self) -> u16 {
        match self {
            ErrorCode::InvalidRequest => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden
            | ErrorCode::HostPortExcluded
            | ErrorCode::ImagePullCredentialsRequired
            | ErrorCode::HolderNotOwned
            | ErrorCode::VolumePathOutsideHolder => 403,
            ErrorCode::MachineNotFound
            | ErrorCode::FileNotFound
            | ErrorCode::PoolNotFound
            | ErrorCode::RouteNotFound
            | ErrorCode::SourceNotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::MachineSpecConflict
            | ErrorCode::ResizeRequiresRunning
            | ErrorCode::HostPortInUse
            | ErrorCode::MachineNotRunning
            | ErrorCode::NoSavedState
            | ErrorCode::AlreadySuspended
            | ErrorCode::NoReadySlot
            | ErrorCode::PoolInUse
            | ErrorCode::SourceNotRunning
            | ErrorCode::SourceNotBranchable
            | ErrorCode::VolumeNotMounted
            | ErrorCode::MachineRunning
            | ErrorCode::Conflict => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::TooManyStreams | ErrorCode::TooManyBytes => 429,
            ErrorCode::StartFailed | ErrorCode::RuntimeError => 500,
            ErrorCode::RuntimeProtocolError => 502,
            ErrorCode::RuntimeUnavailable => 503,
            ErrorCode::RuntimeTimeout => 504,
            ErrorCode::Other(_) => 500,
        }
    }

    /// Whether the code says the node's runtime could not be reached (down, restarting or too
    /// slow), as opposed to a refusal.
    pub fn is_runtime_unreachable(&self) -> bool {
        matches!(self, ErrorCode::RuntimeUnavailable | ErrorCode::RuntimeTimeout)
    }
}

impl From<&str> for ErrorCode {
    fn from(code: &str) -> Self {
        ErrorCode::KNOWN
            .into_iter()
            .find(|known| known.as_str() == code)
            .unwrap_or_else(|| ErrorCode::Other(code.to_string()))
    }
}

impl From<String> for ErrorCode {
    fn from(code: String) -> Self {
        ErrorCode::from(code.as_str())
    }
}

impl From<ErrorCode> for String {
    fn from(code: ErrorCode) -> Self {
        match code {
            ErrorCode::Other(code) => code,
            known => known.as_str().to_string(),
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Body of every error answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeApiError {
    /// The stable code.
    pub code: ErrorCode,
    /// Human-readable message; for runtime failures smolvm's own text, verbatim.
    pub message: String,
    /// Structured extras (e.g. `{"fields": [...]}` for a spec conflict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

/// A host port published to a guest port (smolvm binds it on the node's 127.0.0.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortSpec {
    /// Port on the node, 1–65535.
    pub host_port: u16,
    /// Port in the machine, 1–65535.
    pub guest_port: u16,
    /// Transport; TCP when omitted.
    #[serde(default)]
    pub protocol: Protocol,
}

/// Network settings of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkSpec {
    /// Outbound networking.
    #[serde(default)]
    pub enabled: bool,
    /// Published ports.
    #[serde(default)]
    pub ports: Vec<PortSpec>,
    /// Egress allow-list (CIDRs); empty means unrestricted egress when `enabled`.
    #[serde(default, rename = "allowedCIDRs")]
    pub allowed_cidrs: Vec<String>,
    /// Egress allow-list by host name: these names and their subdomains (smolvm `allowedHosts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
}

/// A value that may be secret (an environment value resolved from a Secret, a registry
/// password): serialized as the plain string on the wire, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Sensitive(pub String);

impl std::fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Sensitive {
    /// The value.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// One environment variable of the workload, its value resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvVar {
    /// Name.
    pub name: String,
    /// Value (may come from a Secret: never logged).
    pub value: Sensitive,
}

/// When smolvm restarts the workload's machine (smolvm's restart policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum RestartPolicy {
    /// Always (the default).
    #[default]
    Always,
    /// Only after a failure.
    OnFailure,
    /// Never.
    Never,
}

/// What runs inside the machine. Empty fields leave the image's own defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Entrypoint (a Pod's `command`); empty keeps the image's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments (a Pod's `args`); empty keeps the image's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Working directory (absolute); absent keeps the image's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Environment, values resolved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Restart policy.
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// Seconds the workload gets to exit after its stop signal (0–300).
    #[serde(default = "default_grace")]
    pub termination_grace_period_seconds: u32,
}

fn default_grace() -> u32 {
    10
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            command: Vec::new(),
            args: Vec::new(),
            working_dir: None,
            env: Vec::new(),
            restart_policy: RestartPolicy::default(),
            termination_grace_period_seconds: default_grace(),
        }
    }
}

/// Registry credentials for one start (smolvm's per-start `registryAuth`): sent with every
/// start, never stored by the agent or logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryAuth {
    /// Registry user name.
    pub username: Sensitive,
    /// Password or token.
    pub password: Sensitive,
}

/// Optional body of `POST /v1/machines/{name}/ensure-running`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartRequest {
    /// Credentials for the image's registry, for this start only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_auth: Option<RegistryAuth>,
    /// Start the machine as a branch source (SPEC 2.6): smolvm keeps it ready to be branched.
    /// Applies to a start from stopped; a running machine keeps how it was started.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub branchable: bool,
}

/// Optional body of `POST /v1/machines/{name}/suspend`: why the machine is suspended. A suspend
/// without one is a user's (`spec.suspended`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SuspendRequest {
    /// The controller suspends it for idleness (SPEC 2.7): recorded with the suspension and
    /// reported in [`SuspendedState::idle`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
    /// While it sleeps, its forwards keep listening: a connection that arrives is held, a wake
    /// is asked for, and the connection is relayed once the machine runs again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wake_on_traffic: bool,
}

/// What `PUT /v1/machines/{name}` creates. All sizes are required (no hidden defaults).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineSpec {
    /// OCI reference, or `local:<name>` for an image in the node's local image directory.
    pub image: String,
    /// vCPUs (1–255).
    pub cpus: u32,
    /// Memory in MiB (at least 64).
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u32,
    /// Storage disk in GiB.
    #[serde(rename = "storageGiB")]
    pub storage_gib: u64,
    /// Overlay disk in GiB.
    #[serde(rename = "overlayGiB")]
    pub overlay_gib: u64,
    /// Network settings.
    #[serde(default)]
    pub network: NetworkSpec,
    /// What runs inside; the image's defaults when omitted.
    #[serde(default)]
    pub workload: WorkloadSpec,
    /// The volumes the kubelet mounted for the machine in its holder Pod (SPEC 2.5); none when
    /// omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<VolumeMounts>,
}

/// A machine's volumes: the holder Pod on this node whose kubelet-mounted volumes the machine
/// gets, and where the guest sees each. It names the holder and the volumes, never a host path:
/// the agent finds each volume under the kubelet's pods directory, in that Pod's own volumes
/// directory only, after checking that the Pod's identity files name the SmolVM's namespace
/// and UID. Body of `PUT /v1/machines/{name}/volumes` too, which points a stopped machine at a
/// new holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeMounts {
    /// `metadata.uid` of the holder Pod (the kubelet's `pods/<uid>` directory).
    pub holder_uid: String,
    /// The SmolVM's namespace, which the holder's identity files must name.
    pub namespace: String,
    /// The token the holder's preStop hook presents to the agent's release hook; the agent
    /// keeps only its digest.
    pub release_token: Sensitive,
    /// Each volume, in the SmolVM's order.
    pub mounts: Vec<VolumeMount>,
}

/// One volume of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume's name in the SmolVM and in its holder Pod (a DNS-1123 label).
    pub name: String,
    /// The name the kubelet gives the volume's directory under the holder's volumes: the
    /// volume's name, or for a claim the name of its bound PersistentVolume (a DNS-1123
    /// subdomain, one path segment).
    pub directory: String,
    /// Where the guest sees it (absolute).
    pub target: String,
    /// Read-only for the guest.
    #[serde(default)]
    pub read_only: bool,
}

/// A machine's volumes as its agent mounted them (in [`MachineStatus::volumes`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineVolumes {
    /// The holder Pod whose volumes the machine's mounts point at now.
    pub holder_uid: String,
    /// Each mount: the host path smolvm was given (the agent's stable path for the volume),
    /// where the guest sees it, read-only or not.
    pub mounts: Vec<MountedVolume>,
}

/// One mounted volume of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountedVolume {
    /// The volume's name.
    pub name: String,
    /// The host path passed to smolvm.
    pub source: String,
    /// Where the guest sees it.
    pub target: String,
    /// Read-only for the guest.
    #[serde(default)]
    pub read_only: bool,
}

/// A machine's lifecycle state: the one state type of the node API, the agent's runtime layer
/// and the controller. The agent reads smolvm's state words into it in one place (the runtime's
/// `vmm::smolvm`); smolvm's own word travels beside it ([`MachineStatus::runtime_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MachineState {
    /// Created, never started.
    Created,
    /// Running: its VMM process is up.
    Running,
    /// Stopped (also after a failed start).
    Stopped,
    /// Suspended: paused by the agent through smolvm, its memory and disks saved durably and its
    /// process stopped (smolvm itself says `stopped`); resumed with its processes as they were.
    Suspended,
    /// Failed.
    Failed,
    /// A state word this protocol does not know (smolvm's word is in `runtimeState`).
    Unknown,
}

/// A machine as the node reports it (answer of get, create, ensure-running, stop, resize).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Machine name.
    pub name: String,
    /// Lifecycle state.
    pub state: MachineState,
    /// smolvm's own state word, verbatim.
    pub runtime_state: String,
    /// Image as smolvm reports it (`local-dir:<path>` / `local:<sha256>` for local images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// vCPUs.
    pub cpus: u32,
    /// Memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Storage disk in GiB, when known.
    #[serde(default, rename = "storageGiB", skip_serializing_if = "Option::is_none")]
    pub storage_gib: Option<u64>,
    /// Overlay disk in GiB, when known.
    #[serde(default, rename = "overlayGiB", skip_serializing_if = "Option::is_none")]
    pub overlay_gib: Option<u64>,
    /// Network settings as applied.
    pub network: NetworkSpec,
    /// Host PID of the VMM while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// While suspended: when the agent suspended it, and the size of its saved state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<SuspendedState>,
    /// For a machine served from a pool's ready slot: the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// For a machine with volumes: its holder and mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<MachineVolumes>,
}

/// A suspended machine's saved state, as its agent records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SuspendedState {
    /// When the machine was suspended (RFC 3339, the agent's clock).
    pub since: String,
    /// The saved state's size in MiB as the runtime reports it; absent when it does not
    /// (smolvm 1.32.2 reports none: count the machine's memory, the worst case).
    #[serde(default, rename = "savedStateMiB", skip_serializing_if = "Option::is_none")]
    pub saved_state_mib: Option<u64>,
    /// Suspended by the controller for idleness ([`SuspendRequest::idle`]), not by a user.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
    /// Its published ports wake it ([`SuspendRequest::wake_on_traffic`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wake_on_traffic: bool,
}

/// Body of `PUT /v1/pools/{name}`: a warm pool on this node. The agent keeps its source
/// machine (made from the pool's template, named as the pool, started as a branch source) and
/// has smolvm keep `slots` ready machines forked from it. Applying the same pool again changes
/// only its slots; a pool of another template is another pool (another name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolSpec {
    /// The source machine, as `PUT /v1/machines/{name}` takes it.
    pub source: MachineSpec,
    /// Ready slots to keep.
    pub slots: u32,
    /// Credentials for the source's image registry, for its start only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_auth: Option<RegistryAuth>,
}

/// Body of `POST /v1/pools/{name}/resize`: the ready slots the pool keeps on this node from now
/// on (its record too, so the keeper makes it again with these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolResize {
    /// Ready slots to keep.
    pub slots: u32,
}

/// A pool on this node, as `PUT /v1/pools/{name}` and `GET /v1/pools` answer it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    /// The pool's name (also its source machine's).
    pub name: String,
    /// Ready slots wanted.
    pub slots: u32,
    /// Slots ready to serve now.
    pub ready: u32,
    /// Slots being forked and booted.
    pub provisioning: u32,
    /// Machines served from the pool and still leased.
    pub leased: u32,
}

/// Answer of `GET /v1/pools`: the pools the agent keeps, by name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolList {
    /// The pools.
    pub pools: Vec<PoolStatus>,
}

/// Body of `POST /v1/machines/{name}/lease`: serve the machine `{name}` from a ready slot of
/// `pool`. The slot's machine takes the name `{name}` on the node API from then on; the agent
/// keeps the lease alive while the machine exists and ends it when it is deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseRequest {
    /// The pool on this node.
    pub pool: String,
    /// The machine's own environment, values resolved, installed before its workload runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

/// Body of `POST /v1/machines/{name}/branch`: make the machine `{name}` a copy-on-write branch
/// of the running branchable machine `source` on this node (SPEC 2.6). Its size, image and
/// workload are the source's; `env` is added to the source's environment and `ports` are the
/// branch's own (none published when empty). Idempotent by `{name}`: a branch of `source` that
/// exists already answers as it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BranchRequest {
    /// The source machine on this node.
    pub source: String,
    /// The branch's own environment, values resolved, delivered before its workload goes on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// The branch's published ports; none when empty (the source's are never shared).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortSpec>,
}

/// Answer of `DELETE /v1/machines/{name}`: exactly one of the two is true.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteResponse {
    /// The machine existed and was deleted now.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// There was no such machine (already deleted): cleanup is confirmed all the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub missing: bool,
}

/// Body of `POST /v1/machines/{name}/exec`: one command in the running machine, waited for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    /// The program and its arguments (not run through a shell).
    pub command: Vec<String>,
    /// Extra environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Working directory inside the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Text piped to the command's standard input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Seconds the command may run (1 to [`EXEC_MAX_TIMEOUT_SECONDS`]; default
    /// [`EXEC_DEFAULT_TIMEOUT_SECONDS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
}

/// Largest file copied into or out of a machine (64 MiB), by the node API and the access API.
pub const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;

/// Default time limit of an exec.
pub const EXEC_DEFAULT_TIMEOUT_SECONDS: u32 = 30;
/// Longest time limit an exec may ask for.
pub const EXEC_MAX_TIMEOUT_SECONDS: u32 = 3600;

/// Answer of `POST /v1/machines/{name}/exec`: the exit code and the output, byte-exact (base64).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResponse {
    /// The command's exit code.
    pub exit_code: i32,
    /// Standard output, base64.
    pub stdout_base64: String,
    /// Standard error, base64.
    pub stderr_base64: String,
}

/// Body of `POST /v1/machines/{name}/resize`: target sizes; omitted fields stay. Disks only
/// grow; CPUs and memory change only while running (else 409 `ResizeRequiresRunning`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResizeSpec {
    /// Target vCPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Target memory in MiB.
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// Target storage disk in GiB.
    #[serde(default, rename = "storageGiB", skip_serializing_if = "Option::is_none")]
    pub storage_gib: Option<u64>,
    /// Target overlay disk in GiB.
    #[serde(default, rename = "overlayGiB", skip_serializing_if = "Option::is_none")]
    pub overlay_gib: Option<u64>,
}

/// Answer of `GET /v1/health` (smolvm answered its health check).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthResponse {
    /// `"ok"`.
    pub status: String,
    /// smolvm's version.
    pub runtime_version: String,
    /// Node API protocol version (`v1`).
    pub protocol_version: String,
    /// Machines smolvm knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machines_total: Option<u64>,
    /// Machines running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machines_running: Option<u64>,
}

/// Answer of `GET /v1/identity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityResponse {
    /// Kubernetes Node name this agent serves.
    pub node_name: String,
    /// Kubernetes Node UID, when known.
    #[serde(default, rename = "nodeUID", skip_serializing_if = "Option::is_none")]
    pub node_uid: Option<String>,
    /// smolvm version, when smolvm answered at least once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_version: Option<String>,
    /// Node API protocol version (`v1`).
    pub protocol_version: String,
    /// Version of the agent binary.
    pub agent_version: String,
}

/// Whether `name` is an acceptable machine name: 1–63 characters of lower-case letters, digits
/// and `-`, starting and ending with a letter or digit (a DNS label).
pub fn validate_machine_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("machine name must not be empty".to_string());
    }
    if name.len() > MAX_MACHINE_NAME_LEN {
        return Err(format!(
            "machine name must be at most {MAX_MACHINE_NAME_LEN} characters (got {})",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "machine name {name:?} contains {bad:?}; only a-z, 0-9 and '-' are allowed"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(format!(
            "machine name {name:?} must start and end with a letter or digit"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_names() {
        let long = "a".repeat(64);
        let max = "a".repeat(63);
        let cases: [(&str, bool); 10] = [
            ("vm-3f2a1c9e-8b7d-4e6f-9a0b-1c2d3e4f5a6b", true),
            ("a", true),
            (max.as_str(), true),
            ("", false),
            (long.as_str(), false),
            ("-a", false),
            ("a-", false),
            ("A", false),
            ("a.b", false),
            ("a_b", false),
        ];
        for (name, ok) in cases {
            assert_eq!(validate_machine_name(name).is_ok(), ok, "{name:?}");
        }
    }

    #[test]
    fn spec_wire_format() {
        let json = r#"{"image":"alpine:3","cpus":1,"memoryMiB":512,"storageGiB":20,"overlayGiB":10,
            "network":{"enabled":true,"ports":[{"hostPort":8080,"guestPort":80}],"allowedCIDRs":["10.0.0.0/8"]}}"#;
        let spec: MachineSpec = serde_json::from_str(json).expect("parses");
        assert_eq!(spec.network.ports[0].protocol, Protocol::Tcp);
        assert_eq!(spec.network.allowed_cidrs, vec!["10.0.0.0/8".to_string()]);
        let back = serde_json::to_value(&spec).expect("serializes");
        assert_eq!(back["memoryMiB"], 512);
        assert_eq!(back["network"]["ports"][0]["protocol"], "TCP");
        let unknown = r#"{"image":"a","cpus":1,"memoryMiB":1,"storageGiB":1,"overlayGiB":1,"bogus":1}"#;
        assert!(serde_json::from_str::<MachineSpec>(unknown).is_err());
        let missing = r#"{"image":"a","cpus":1}"#;
        assert!(serde_json::from_str::<MachineSpec>(missing).is_err());
    }

    #[test]
    fn delete_response_wire_format() {
        let cases = [
            (
                DeleteResponse {
                    deleted: true,
                    missing: false,
                },
                r#"{"deleted":true}"#,
            ),
            (
                DeleteResponse {
                    deleted: false,
                    missing: true,
                },
                r#"{"missing":true}"#,
            ),
        ];
        for (value, text) in cases {
            assert_eq!(serde_json::to_string(&value).expect("json"), text);
            assert_eq!(serde_json::from_str::<DeleteResponse>(text).expect("parse"), value);
        }
    }

    #[test]
    fn error_codes_round_trip_and_unknown_ones_decode() {
        for code in ErrorCode::KNOWN {
            let text = serde_json::to_string(&code).expect("encode");
            assert_eq!(text, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&text).expect("decode"), code);
            assert_eq!(code.label(), code.as_str());
            assert!((400..600).contains(&code.status()), "{code}");
        }
        let body: NodeApiError =
            serde_json::from_str(r#"{"code":"SomethingNew","message":"m"}"#).expect("a newer agent's code decodes");
        assert_eq!(body.code, ErrorCode::Other("SomethingNew".into()));
        assert_eq!((body.code.label(), body.code.status()), ("Other", 500));
        assert_eq!(serde_json::to_value(&body).expect("encode")["code"], "SomethingNew");
    }
}
