//! `SmolvmDouble`: a TEST DOUBLE of `smolvm serve` 1.32.2, speaking its HTTP/JSON API on a Unix
//! socket. It exists because no guest boots on these development machines: the real smolvm's
//! start fails, so a machine never runs, and nothing that needs a running machine (suspend and
//! resume first of all) can be exercised against it. The double's start "boots" at once.
//!
//! It serves the routes the agent uses ([`ROUTES`], smolvm's paths and OpenAPI operation ids)
//! with smolvm's semantics as observed (see `docs/smolvm-api.md`): create refuses an existing
//! name (409 `CONFLICT`) and unknown fields (422, plain text, as smolvm's request layer); a
//! never-started machine stays `created` through a stop; pause needs a running machine (409
//! `CONFLICT` "must be running") and leaves it `stopped` with its state saved; resume needs a
//! paused one (409 `CONFLICT` "not paused"); live CPU or memory resize needs a running machine
//! (400); unknown routes answer 404 and wrong methods 405 with an empty body. Its wire types
//! ([`SCHEMAS`]) are checked against smolvm's OpenAPI document, kept in `testkit/data/`.
//!
//! What smolvm 1.32.2 does that no machine here could show, the double assumes: a stop or a
//! start of a paused machine discards its saved state (smolvm says "use start for a fresh
//! boot"). It binds no published port and runs no process (no `pid`).
//!
//! Fork pools and leases (smolvm's `/api/v1/pools` routes) are played at once, without a guest.
//! A pool keeps `desiredReady` ready workers: machines `{pool}-w{n}` (`n` counts up and is never
//! reused) that run with `branchpointHeld` and the pool's source as `parentMachine`. The refill
//! forks them synchronously at the end of every request that changes something, unless a test
//! holds it ([`DoubleHandle::hold_refill`]); releasing the hold refills at once. A lease takes a
//! ready worker (its `branchpointHeld` clears and its environment gets the lease's `env`);
//! completing the lease deletes the worker. [`DoubleHandle::restart`] plays a restart of `smolvm
//! serve`: pools and their ready workers do not survive it, every lease is forgotten, leased
//! workers stay as ordinary machines, and the boot id changes. Observed on smolvm 1.32.2: the list
//! with no pool is `{"pools":[]}`; a missing source is 404 `NOT_FOUND` "machine 'X' not found", a
//! source not running 409 `CONFLICT` "golden machine 'X' is not running"; every pool and lease
//! route on an unknown pool is 404 "fork pool 'X' not found"; an unknown lease is 404 "lease 'L'
//! not found in fork pool 'P'" (get) or "fork lease 'L' not found" (heartbeat, complete).
//!
//! Assumed of pools, as no worker could be forked here:
//! - a source running but not started `branchable` is 409 `CONFLICT`, so is a pool name taken;
//!   a pool name follows the machine name rule (400);
//! - `leaseTtlSecs` defaults to 300, `autoAdmission` to false (no CUDA); `freezeSource`,
//!   `shareWeights` and `maxActive` are echoed but not played, `readyTimeoutSecs` is read only;
//! - the refill forks only from a source that exists and runs; a worker has its image, CPUs,
//!   memory, disk sizes, network and environment, but no published port;
//! - a resize below the ready count deletes the newest ready workers at once (even while the
//!   refill is held);
//! - acquire with no ready worker is 503 `UNAVAILABLE` "no ready worker in fork pool 'P'" at
//!   once (`waitSecs` is not played: a client must judge by the status); an `env` entry without
//!   `=` is 400; the oldest ready worker is taken; the lease is `active` at once
//!   (`awaitWorkerReady` is not played) and `files` are not staged; an `idempotencyKey` seen
//!   before returns that lease, whatever its state;
//! - heartbeat or complete of a lease not `active` is 409 `CONFLICT`;
//! - leases never expire by time (`expiresAt` is written, never enforced);
//! - delete of a pool with active leases is 409 `CONFLICT` without `?force=true`; with it their
//!   workers are deleted and the leases `cancelled`; the deletion is over when the answer comes
//!   (`deleting` is never true) and the source is left alone; a leased worker deleted with
//!   `delete_machine` leaves its lease as it was;
//! - a start with `branchable` in its body sets it (and its alias `forkable`), a start without
//!   leaves it as it was; the `forkable` query parameter is not read.
//!
//! A branch of a machine (`branch_machine`, smolvm's `ForkRequest`) is played at once, as its
//! document describes it: a missing source is 404 `NOT_FOUND`; a source not running, or not
//! started `branchable`, and a child name taken are 409 `CONFLICT` (the document's statuses;
//! the wordings are the pools' observed ones); a child name that breaks the machine name rule,
//! or an `env` entry without `=`, is 400. The child runs at once with the source's image, size,
//! network, environment (and the request's `env` after it) and files, `parentMachine` naming
//! the source, `branchable` as asked; it publishes the request's `ports`, or without them the
//! source's guest ports on fresh host ports from 42000 (smolvm remaps them; its choice of ports
//! is its own). Assumed, as no source runs here: a source with live branches is deleted as any
//! machine (smolvm's document refuses a fork base with live clones, 409; not played yet).
//!
//! A machine's one-shot exec, logs and files (`exec_command`, `stream_logs`, `download_file`,
//! `upload_file`) are played without a guest, as the agent's client calls them:
//! - exec answers at once with exit code 0 and the standard output `ran in {machine}: {command}`
//!   (the command's words joined by spaces, then a newline), so a test sees where it ran. A
//!   machine not running is booted first, as smolvm does (observed), unless `autoStart` is
//!   false: then 409 `CONFLICT` "machine 'X' is not running" (the status is smolvm's document's;
//!   the wording is assumed). An empty command is 400 `BAD_REQUEST` (assumed); `env`, `workdir`,
//!   `stdin`, `timeoutSecs`, `background`, `secrets` and `user` are read (and so checked) but not
//!   played.
//! - every machine keeps a console and a workload log of what the double did to it, one line
//!   per event naming the machine (`machine 'X' booted`, `forked from 'S'`, `stopped`, `paused`,
//!   `resumed`; the workload log `workload of 'X' started`), served as server-sent events, a
//!   `data:` line each; `source` is `console` (the default) or `workload` (another is 400
//!   `BAD_REQUEST`, assumed), `tail` keeps the last lines. A machine never booted has no log yet
//!   (404 `NOT_FOUND`, as observed). `follow` keeps the stream open after the lines, with nothing
//!   more (as observed of a machine not running; lines logged later are not sent).
//! - files are kept per machine (a forked worker starts with its source's): a write takes the
//!   body's bytes and `?mode=` in octal (default `0644`; another value is 400 `BAD_REQUEST`,
//!   assumed) and answers the path and size; a read gives the bytes back. Both boot a machine
//!   not running, as smolvm's do (observed). A path never written is 404 `NOT_FOUND` (wording
//!   assumed). A directory's listing is not played: smolvm describes its entries in prose only,
//!   with no schema to check the double against. A path is `/` and its segments, each decoded.
//!
//! A machine's host mounts (`mounts` at create, `MountSpec`) are kept and reported as smolvm
//! 1.32.2 does (observed): each `source` must be an absolute path (400 `BAD_REQUEST` "mount
//! operation failed: validate source: path must be absolute"), exist ("mount source not found")
//! and be a directory ("source path on host must be a directory"), each `target` absolute
//! ("target path on guest should be an absolute directory") and given once ("duplicate mount
//! target"); the machine reports them (`MountInfo`) with their links resolved, tagged
//! `smolvm0`, `smolvm1`, … in order, `staged` as asked. Nothing is served to a guest.
//!
//! Any agent can use it: in-process, or the `smolvm-runtime` binary with `--attach-socket
//! <socket>`. It records the calls it received ([`Call`]) with the time each arrived, so a
//! bench can measure from a spec write to the node's call.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// The smolvm version the double plays.
pub const VERSION: &str = "1.32.2";

/// smolvm's OpenAPI document for [`VERSION`], as `smol-vmm serve openapi` prints it (test data).
pub const OPENAPI_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/smolvm-1.32.2-openapi.json");

/// One route the double serves: smolvm's method, path template and OpenAPI operation id, and
/// what the request body it reads and its success answer are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// HTTP method.
    pub method: &'static str,
    /// Path template, as smolvm's OpenAPI document writes it.
    pub path: &'static str,
    /// smolvm's `operationId`.
    pub operation: &'static str,
    /// The request body read, if any.
    pub request: Option<Content>,
    /// The success answer.
    pub response: Content,
}

/// A body as smolvm's OpenAPI document describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// JSON of the named schema.
    Json(&'static str),
    /// Bytes as they are (`application/octet-stream`).
    Octets,
    /// Server-sent events (`text/event-stream`).
    EventStream,
    /// A body whose media type the document leaves to the answer's description (a file read:
    /// its bytes, or a directory's listing as JSON).
    Described,
}

impl Content {
    /// The schema, for JSON.
    pub fn schema(self) -> Option<&'static str> {
        match self {
            Self::Json(schema) => Some(schema),
            _ => None,
        }
    }
}

const fn route(
    method: &'static str,
    path: &'static str,
    operation: &'static str,
    request: Option<&'static str>,
    response: &'static str,
) -> Route {
    let request = match request {
        Some(schema) => Some(Content::Json(schema)),
        None => None,
    };
    Route {
        method,
        path,
        operation,
        request,
        response: Content::Json(response),
    }
}

/// Every route the double serves.
pub const ROUTES: [Route; 25] = [
    route("GET", "/health", "health", None, "HealthResponse"),
    route("GET", "/capacity", "capacity", None, "CapacityResponse"),
    route("GET", "/api/v1/machines", "list_machines", None, "ListMachinesResponse"),
    route(
        "POST",
        "/api/v1/machines",
        "create_machine",
        Some("CreateMachineRequest"),
        "MachineInfo",
    ),
    route("GET", "/api/v1/machines/{name}", "get_machine", None, "MachineInfo"),
    route(
        "DELETE",
        "/api/v1/machines/{name}",
        "delete_machine",
        None,
        "DeleteResponse",
    ),
    route(
        "POST",
        "/api/v1/machines/{name}/start",
        "start_machine",
        Some("StartMachineRequest"),
        "MachineInfo",
    ),
    route(
        "POST",
        "/api/v1/machines/{name}/stop",
        "stop_machine",
        None,
        "MachineInfo",
    ),
    route(
        "POST",
        "/api/v1/machines/{name}/pause",
        "pause_machine",
        None,
        "MachineInfo",
    ),
    route(
        "POST",
        "/api/v1/machines/{name}/resume",
        "resume_machine",
        None,
        "MachineInfo",
    ),
    route(
        "POST",
        "/api/v1/machines/{name}/resize",
        "resize_machine",
        Some("ResizeMachineRequest"),
        "MachineInfo",
    ),
    route(
        "POST",
        "/api/v1/machines/{name}/branches",
        "branch_machine",
        Some("ForkRequest"),
        "MachineInfo",
    ),
    route("GET", "/api/v1/pools", "list_pools", None, "ListForkPoolsResponse"),
    route(
        "POST",
        "/api/v1/pools",
        "create_pool",
        Some("CreateForkPoolRequest"),
        "ForkPoolInfo",
    ),
    route("GET", "/api/v1/pools/{name}", "get_pool", None, "ForkPoolInfo"),
    route("DELETE", "/api/v1/pools/{name}", "delete_pool", None, "DeleteResponse"),
    route(
        "PUT",
        "/api/v1/pools/{name}/size",
        "resize_pool",
        Some("ResizeForkPoolRequest"),
        "ForkPoolInfo",
    ),
    route(
        "POST",
        "/api/v1/pools/{name}/leases",
        "acquire_lease",
        Some("AcquireForkLeaseRequest"),
        "ForkLeaseInfo",
    ),
    route(
        "GET",
        "/api/v1/pools/{name}/leases/{lease}",
        "get_lease",
        None,
        "ForkLeaseInfo",
    ),
    route(
        "POST",
        "/api/v1/pools/{name}/leases/{lease}/heartbeat",
        "heartbeat_lease",
        None,
        "ForkLeaseInfo",
    ),
    route(
        "POST",
        "/api/v1/pools/{name}/leases/{lease}/complete",
        "complete_lease",
        None,
        "ForkLeaseInfo",
    ),
    route(
        "POST",
        "/api/v1/machines/{id}/exec",
        "exec_command",
        Some("ExecRequest"),
        "ExecResponse",
    ),
    Route {
        method: "GET",
        path: "/api/v1/machines/{id}/logs",
        operation: "stream_logs",
        request: None,
        response: Content::EventStream,
    },
    Route {
        method: "GET",
        path: "/api/v1/machines/{id}/files/{path}",
        operation: "download_file",
        request: None,
        response: Content::Described,
    },
    Route {
        method: "PUT",
        path: "/api/v1/machines/{id}/files/{path}",
        operation: "upload_file",
        request: Some(Content::Octets),
        response: Content::Json("FileUploadResponse"),
    },
];

/// The largest JSON request body read (a larger one is refused in plain text).
const MAX_JSON_BYTES: usize = 1024 * 1024;

/// The largest file written (the node API's own limit on a copy).
const MAX_FILE_BYTES: usize = smolvm_api::nodeapi::MAX_FILE_BYTES;

/// The query parameters the double reads, by operation id: any other is ignored.
pub const QUERY_PARAMETERS: [(&str, &str); 5] = [
    ("delete_pool", "force"),
    ("stream_logs", "source"),
    ("stream_logs", "tail"),
    ("stream_logs", "follow"),
    ("upload_file", "mode"),
];

/// The field names of a wire type, as serde reads them.
pub type Fields = fn() -> &'static [&'static str];

/// Every wire type of the double, by the name of smolvm's schema it plays, with its fields: the
/// answers it writes, the request bodies it reads, and the objects inside them.
pub const SCHEMAS: [(&str, Fields); 26] = [
    ("HealthResponse", fields_of::<HealthResponse>),
    ("MachineCountsResponse", fields_of::<MachineCounts>),
    ("CapacityResponse", fields_of::<CapacityResponse>),
    ("ListMachinesResponse", fields_of::<ListMachines>),
    ("MachineInfo", fields_of::<MachineInfo>),
    ("PortSpec", fields_of::<PortSpec>),
    ("CreateMachineRequest", fields_of::<CreateMachine>),
    ("EnvVar", fields_of::<EnvVar>),
    ("RestartSpec", fields_of::<RestartSpec>),
    ("StartMachineRequest", fields_of::<StartMachine>),
    ("ResizeMachineRequest", fields_of::<ResizeMachine>),
    ("DeleteResponse", fields_of::<DeleteResponse>),
    ("ApiErrorResponse", fields_of::<ApiError>),
    ("MountInfo", fields_of::<MountInfo>),
    ("MountSpec", fields_of::<MountSpec>),
    ("ForkRequest", fields_of::<ForkMachine>),
    ("CreateForkPoolRequest", fields_of::<CreateForkPool>),
    ("ForkPoolInfo", fields_of::<ForkPoolInfo>),
    ("ListForkPoolsResponse", fields_of::<ListForkPools>),
    ("ResizeForkPoolRequest", fields_of::<ResizeForkPool>),
    ("AcquireForkLeaseRequest", fields_of::<AcquireForkLease>),
    ("ForkLeaseInfo", fields_of::<ForkLeaseInfo>),
    ("ForkLeasePayloadFile", fields_of::<ForkLeasePayloadFile>),
    ("ExecRequest", fields_of::<ExecCommand>),
    ("ExecResponse", fields_of::<ExecAnswer>),
    ("FileUploadResponse", fields_of::<FileUpload>),
];

/// The fields of a struct that derives `Deserialize`, under their wire names (serde hands them
/// to `deserialize_struct`; nothing is read).
pub fn fields_of<T: de::DeserializeOwned>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("fields read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

// smolvm's wire types, as far as the double writes or reads them.

#[derive(Debug, Clone, Serialize, Deserialize)]
struct HealthResponse {
    status: String,
    version: String,
    machines: Option<MachineCounts>,
    uptime_seconds: Option<u64>,
    nested_virt: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct MachineCounts {
    total: u64,
    running: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CapacityResponse {
    allocated_cpus: u32,
    allocated_memory_mb: u64,
    used_cpus: f64,
    used_memory_mb: u64,
    used_disk_gb: u64,
    boot_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ListMachines {
    machines: Vec<MachineInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MachineInfo {
    name: String,
    state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    cpus: u32,
    memory_mb: u64,
    mounts: Vec<MountInfo>,
    ports: Vec<PortSpec>,
    network: bool,
    gpu: bool,
    cuda: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_cidrs: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_hosts: Option<Vec<String>>,
    storage_gb: u64,
    overlay_gb: u64,
    block_io: String,
    disk_durability: String,
    branchable: bool,
    forkable: bool,
    branchpoint_held: bool,
    forkpoint_held: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent_machine: Option<String>,
    disk_used_mb: u64,
    created_at: u64,
}

/// A host mount as a machine reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct MountInfo {
    tag: String,
    source: String,
    target: String,
    readonly: bool,
    staged: bool,
}

/// A host mount as a create asks for it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct MountSpec {
    source: String,
    target: String,
    #[serde(default)]
    readonly: bool,
    #[serde(default)]
    staged: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortSpec {
    host: u16,
    guest: u16,
    // smolvm echoes the protocol only when it is `udp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    protocol: Option<String>,
}

/// The workload's fields are read (and so checked, as smolvm's) but not played.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct CreateMachine {
    name: Option<String>,
    image: Option<String>,
    // smolvm reads a u8: 1000 is a 422, as there.
    cpus: Option<u8>,
    memory_mb: Option<u32>,
    storage_gb: Option<u64>,
    overlay_gb: Option<u64>,
    #[serde(default)]
    network: bool,
    #[serde(default)]
    ports: Vec<PortSpec>,
    allowed_cidrs: Option<Vec<String>>,
    allowed_hosts: Option<Vec<String>>,
    #[serde(default)]
    entrypoint: Vec<String>,
    #[serde(default)]
    cmd: Vec<String>,
    workdir: Option<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    restart: Option<RestartSpec>,
    stop_timeout_secs: Option<u64>,
    #[serde(default)]
    mounts: Vec<MountSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct EnvVar {
    name: String,
    value: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct RestartSpec {
    policy: Option<String>,
    max_retries: Option<u32>,
}

/// Not `deny_unknown_fields`, as smolvm's: any other field means no credentials.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartMachine {
    #[allow(dead_code)]
    registry_auth: Option<serde_json::Value>,
    /// Start as a branch source (a fork pool's source must be).
    branchable: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResizeMachine {
    cpus: Option<u32>,
    memory_mb: Option<u32>,
    storage_gb: Option<u64>,
    overlay_gb: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeleteResponse {
    deleted: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ApiError {
    error: String,
    code: String,
}

/// `deny_unknown_fields`, as smolvm's document says (`additionalProperties: false`). Labels,
/// freezing, holding, readiness, secrets and CUDA weights are read (and so checked) but not
/// played.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct ForkMachine {
    name: String,
    #[serde(default)]
    env: Vec<String>,
    ports: Option<Vec<PortSpec>>,
    labels: Option<BTreeMap<String, String>>,
    branchable: Option<bool>,
    freeze_source: Option<bool>,
    hold: Option<bool>,
    wait_ready: Option<bool>,
    ready_timeout_secs: Option<u64>,
    secrets: Option<serde_json::Value>,
    share_weights: Option<bool>,
}

/// The CUDA and readiness options are read (and so checked) but not played.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateForkPool {
    name: String,
    source: String,
    desired_ready: u32,
    auto_admission: Option<bool>,
    #[serde(default)]
    freeze_source: bool,
    lease_ttl_secs: Option<u64>,
    max_active: Option<u32>,
    #[allow(dead_code)]
    ready_timeout_secs: Option<u64>,
    #[serde(default)]
    share_weights: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ForkPoolInfo {
    name: String,
    source: String,
    golden: String,
    desired_ready: u32,
    freeze_source: bool,
    auto_admission: bool,
    share_weights: bool,
    lease_ttl_secs: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_active: Option<u32>,
    provisioning: u32,
    ready: u32,
    activating: u32,
    active: u32,
    retiring: u32,
    deleting: bool,
    created_at: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ListForkPools {
    pools: Vec<ForkPoolInfo>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResizeForkPool {
    desired_ready: u32,
}

/// Not `deny_unknown_fields`, as smolvm's schema. Waiting, readiness, files and rollout access
/// are read (and so checked) but not played.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct AcquireForkLease {
    idempotency_key: String,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    files: Vec<ForkLeasePayloadFile>,
    ttl_secs: Option<u64>,
    wait_secs: Option<u64>,
    #[serde(default)]
    await_worker_ready: bool,
    worker_ready_timeout_secs: Option<u64>,
    rollout_access: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct ForkLeasePayloadFile {
    path: String,
    data_base64: String,
    mode: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ForkLeaseInfo {
    id: String,
    pool: String,
    machine: String,
    state: String,
    created_at: u64,
    expires_at: u64,
}

/// `deny_unknown_fields`, as smolvm's (its document says so). What is not played is read, and
/// so checked.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct ExecCommand {
    command: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    workdir: Option<String>,
    stdin: Option<String>,
    timeout_secs: Option<u64>,
    auto_start: Option<bool>,
    background: Option<bool>,
    secrets: Option<serde_json::Value>,
    user: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecAnswer {
    exit_code: i32,
    stdout: String,
    stderr: String,
    #[serde(rename = "stdoutB64")]
    stdout_b64: String,
    #[serde(rename = "stderrB64")]
    stderr_b64: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FileUpload {
    path: String,
    size: u64,
}

/// One call the double received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// smolvm's operation id of the route ([`ROUTES`]).
    pub operation: &'static str,
    /// The `{name}` in the path, if any: a machine's name, or a fork pool's.
    pub machine: Option<String>,
    /// The `{lease}` in the path, if any (a lease id).
    pub lease: Option<String>,
    /// The `{path}` in the path, if any: a file's path inside the machine (`/` and its
    /// segments, each decoded).
    pub path: Option<String>,
    /// When the request arrived (its head read).
    pub at: SystemTime,
}

/// A branch the double made ([`DoubleHandle::branched`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchView {
    /// The child machine.
    pub child: String,
    /// The machine it was branched from.
    pub source: String,
    /// When it was made (its request's body read).
    pub at: SystemTime,
}

/// A fork pool as a test sees it ([`DoubleHandle::pool`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    /// Its `desiredReady`: the ready workers it keeps.
    pub desired: u32,
    /// Its ready workers (booted, held at the branch point, not leased).
    pub ready: u32,
    /// Its active leases.
    pub active: u32,
}

/// A lease as a test sees it ([`DoubleHandle::leases`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// Its id (`lease-{n}`).
    pub id: String,
    /// The pool it was acquired from.
    pub pool: String,
    /// The worker machine it holds.
    pub machine: String,
    /// smolvm's state word: `active`, `completed` or `cancelled`.
    pub state: String,
    /// The `idempotencyKey` it was acquired with.
    pub key: String,
}

/// A machine as the double keeps it.
#[derive(Debug, Clone)]
struct Machine {
    info: MachineInfo,
    /// Paused: its state saved, resumable.
    paused: bool,
    /// Its environment, `KEY=VALUE` (which `MachineInfo` does not show).
    env: Vec<String>,
    /// The pool it is a worker of (ready or leased), until a restart.
    worker: Option<Worker>,
    /// Its console log, one line per event (see the module's doc).
    console: Vec<String>,
    /// Its workload's log.
    workload: Vec<String>,
    /// Its files, by path (`/a/b`).
    files: BTreeMap<String, File>,
}

/// A file in a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// Its bytes.
    pub content: Vec<u8>,
    /// Its permission bits.
    pub mode: u32,
}

impl Machine {
    /// Boots it: running, any saved state discarded, and its logs say so.
    fn boot(&mut self) {
        self.info.state = "running".into();
        self.paused = false;
        self.log(format!("machine '{}' booted", self.info.name));
        self.workload.push(format!("workload of '{}' started", self.info.name));
    }

    /// A line in its console log.
    fn log(&mut self, line: String) {
        self.console.push(line);
    }
}

/// A pool worker: its pool (by [`Pool::uid`]) and its number in the name `{pool}-w{n}`.
#[derive(Debug, Clone, Copy)]
struct Worker {
    pool: u64,
    n: u64,
}

/// A fork pool as the double keeps it.
#[derive(Debug, Clone)]
struct Pool {
    /// Tells this pool from an earlier one of the same name (its workers and leases).
    uid: u64,
    name: String,
    source: String,
    desired_ready: u32,
    lease_ttl_secs: u64,
    freeze_source: bool,
    auto_admission: bool,
    share_weights: bool,
    max_active: Option<u32>,
    created_at: u64,
}

/// A lease as the double keeps it.
#[derive(Debug, Clone)]
struct Lease {
    id: String,
    pool: String,
    /// The [`Pool::uid`] of its pool.
    pool_uid: u64,
    machine: String,
    state: String,
    key: String,
    ttl_secs: u64,
    created_at: u64,
    expires_at: u64,
}

/// Everything smolvm keeps, under one lock.
#[derive(Debug)]
struct World {
    machines: BTreeMap<String, Machine>,
    pools: BTreeMap<String, Pool>,
    /// Every lease since the last restart, those of deleted pools too.
    leases: Vec<Lease>,
    /// The last pool uid and lease number given.
    last_pool: u64,
    last_lease: u64,
    /// The last worker number given, by pool name (kept through deletes and restarts, so a
    /// worker name is never reused).
    last_worker: BTreeMap<String, u64>,
    /// The refill waits (a test's [`DoubleHandle::hold_refill`]).
    refill_held: bool,
    /// Every branch made, in order: the child, its source, and when it was made.
    branched: Vec<BranchView>,
    /// When `smolvm serve` (last) started.
    started: Instant,
    boot_id: String,
    restarts: u64,
}

#[derive(Debug)]
struct Inner {
    world: Mutex<World>,
    calls: Mutex<Vec<Call>>,
    delays: Mutex<BTreeMap<&'static str, Duration>>,
    /// Failures to answer, by operation and machine: how many calls are still to fail.
    failures: Mutex<BTreeMap<(&'static str, String), u32>>,
    /// Told after each call that may change what the machines publish.
    ports_changed: tokio::sync::Notify,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A boot id no earlier boot of any double had.
fn boot_id(restarts: u64) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("double-{}-{nanos}-{restarts}", std::process::id())
}

/// The TEST DOUBLE of `smolvm serve`; see the module's doc.
pub struct SmolvmDouble;

impl SmolvmDouble {
    /// Serves the double on a Unix socket at `socket` (a stale file there is replaced) until
    /// the handle drops.
    pub async fn start(socket: impl AsRef<Path>) -> std::io::Result<DoubleHandle> {
        let socket = socket.as_ref().to_path_buf();
        if socket.exists() {
            std::fs::remove_file(&socket)?;
        }
        let listener = tokio::net::UnixListener::bind(&socket)?;
        let inner = Arc::new(Inner {
            world: Mutex::new(World {
                machines: BTreeMap::new(),
                pools: BTreeMap::new(),
                leases: Vec::new(),
                last_pool: 0,
                last_lease: 0,
                last_worker: BTreeMap::new(),
                refill_held: false,
                branched: Vec::new(),
                started: Instant::now(),
                boot_id: boot_id(0),
                restarts: 0,
            }),
            calls: Mutex::default(),
            delays: Mutex::default(),
            failures: Mutex::default(),
            ports_changed: tokio::sync::Notify::new(),
        });
        let app = axum::Router::new().fallback(dispatch).with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(DoubleHandle {
            socket,
            inner,
            task,
            ports: Mutex::new(None),
        })
    }
}

/// A running double: it serves until dropped.
pub struct DoubleHandle {
    socket: PathBuf,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
    ports: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for DoubleHandle {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(ports) = locked(&self.ports).take() {
            ports.abort();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl DoubleHandle {
    /// The socket it serves on (what `--attach-socket` takes).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// From now on, serves the TCP ports each running machine publishes on 127.0.0.1 with an
    /// echo, as smolvm binds a guest's published ports there (the guest's service is the echo):
    /// bound when it runs, released when it stops, is paused or deleted. A port another
    /// program holds is left alone. Off by default, so that doubles of other tests bind nothing.
    pub fn serve_ports(&self) {
        let mut ports = locked(&self.ports);
        if ports.is_none() {
            *ports = Some(tokio::spawn(serve_ports(self.inner.clone())));
        }
    }

    /// The calls received so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        locked(&self.inner.calls).clone()
    }

    /// The calls of one operation (smolvm's operation id, e.g. `pause_machine`).
    pub fn calls_of(&self, operation: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.operation == operation).collect()
    }

    /// Forgets the calls received so far.
    pub fn clear_calls(&self) {
        locked(&self.inner.calls).clear();
    }

    /// Makes every later call of `operation` take at least `delay` (as a pause of a large
    /// machine would).
    pub fn set_delay(&self, operation: &'static str, delay: Duration) {
        locked(&self.inner.delays).insert(operation, delay);
    }

    /// Makes the next `times` calls of `operation` on the machine (or pool) `name` (`*`: any)
    /// fail with 500 `INTERNAL_ERROR`, changing nothing (as smolvm answers a failure of its own, say a
    /// disk it cannot remove); later calls are played as usual.
    pub fn fail_next(&self, operation: &'static str, name: &str, times: u32) {
        locked(&self.inner.failures).insert((operation, name.to_string()), times);
    }

    /// smolvm's state word of a machine (`created`, `running`, `stopped`), if it exists.
    pub fn state(&self, name: &str) -> Option<String> {
        locked(&self.inner.world)
            .machines
            .get(name)
            .map(|m| m.info.state.clone())
    }

    /// Stops a running machine as its workload exiting on its own would (smolvm then reports it
    /// `stopped`, as after a stop); whether it ran.
    pub fn exit(&self, name: &str) -> bool {
        let mut world = locked(&self.inner.world);
        match world.machines.get_mut(name) {
            Some(machine) if machine.info.state == "running" => {
                machine.info.state = "stopped".into();
                machine.log(format!("machine '{name}' exited"));
                true
            }
            _ => false,
        }
    }

    /// Whether a machine is paused (its state saved).
    pub fn is_paused(&self, name: &str) -> bool {
        locked(&self.inner.world).machines.get(name).is_some_and(|m| m.paused)
    }

    /// A machine's host mounts as it reports them, `(source, target, readonly)` each in order,
    /// if it exists.
    pub fn mounts(&self, name: &str) -> Option<Vec<(String, String, bool)>> {
        locked(&self.inner.world).machines.get(name).map(|m| {
            m.info
                .mounts
                .iter()
                .map(|mount| (mount.source.clone(), mount.target.clone(), mount.readonly))
                .collect()
        })
    }

    /// A machine's environment (`KEY=VALUE`: its create's `env`, then its leases'), if it exists.
    pub fn env(&self, name: &str) -> Option<Vec<String>> {
        locked(&self.inner.world).machines.get(name).map(|m| m.env.clone())
    }

    /// A file in a machine (its path `/a/b`), if both exist.
    pub fn file(&self, machine: &str, path: &str) -> Option<File> {
        let world = locked(&self.inner.world);
        world.machines.get(machine)?.files.get(path).cloned()
    }

    /// A machine's console log, one line per event, if it exists.
    pub fn console(&self, machine: &str) -> Option<Vec<String>> {
        locked(&self.inner.world)
            .machines
            .get(machine)
            .map(|m| m.console.clone())
    }

    /// Holds the pools' refill (`true`): no worker is forked until it is released (`false`),
    /// which refills every pool at once. A test sets the pace of the refill so.
    pub fn hold_refill(&self, held: bool) {
        let mut world = locked(&self.inner.world);
        world.refill_held = held;
        refill(&mut world);
    }

    /// A fork pool's counts, if it exists.
    pub fn pool(&self, name: &str) -> Option<PoolView> {
        let world = locked(&self.inner.world);
        let pool = world.pools.get(name)?;
        Some(PoolView {
            desired: pool.desired_ready,
            ready: ready_workers(&world, pool.uid).len() as u32,
            active: active_leases(&world, pool.uid),
        })
    }

    /// Every branch made, in order (its child's name is in the request's body, which a
    /// [`Call`] does not show).
    pub fn branched(&self) -> Vec<BranchView> {
        locked(&self.inner.world).branched.clone()
    }

    /// Every lease since the last restart, in the order acquired (those of deleted pools too).
    pub fn leases(&self) -> Vec<LeaseView> {
        locked(&self.inner.world)
            .leases
            .iter()
            .map(|l| LeaseView {
                id: l.id.clone(),
                pool: l.pool.clone(),
                machine: l.machine.clone(),
                state: l.state.clone(),
                key: l.key.clone(),
            })
            .collect()
    }

    /// Plays a restart of `smolvm serve`: the pools and their ready workers vanish, every lease
    /// is forgotten, leased workers stay as ordinary machines, and the boot id (health's
    /// uptime too) starts again. Other machines are left as they are.
    pub fn restart(&self) {
        let mut world = locked(&self.inner.world);
        world.pools.clear();
        world.leases.clear();
        world
            .machines
            .retain(|_, m| !(m.worker.is_some() && m.info.branchpoint_held));
        for machine in world.machines.values_mut() {
            machine.worker = None;
        }
        world.restarts += 1;
        world.boot_id = boot_id(world.restarts);
        world.started = Instant::now();
    }
}

/// An answer: a status and a JSON body, or a plain-text one (smolvm's request layer), or none.
fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn text(status: StatusCode, message: String) -> Response {
    let mut response = Response::new(Body::from(message));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn empty(status: StatusCode) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    response
}

fn error(status: StatusCode, code: &str, message: String) -> Response {
    json(
        status,
        &ApiError {
            error: message,
            code: code.into(),
        },
    )
}

fn not_found(name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        format!("machine '{name}' not found"),
    )
}

fn pool_not_found(name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        format!("fork pool '{name}' not found"),
    )
}

fn conflict(message: String) -> Response {
    error(StatusCode::CONFLICT, "CONFLICT", message)
}

fn bad_request(message: String) -> Response {
    error(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
}

/// A request's route and the `{name}` (or `{id}`), `{lease}` and `{path}` of its path.
type Found = (&'static Route, Option<String>, Option<String>, Option<String>);

/// The route of a request and the name (a machine's or a pool's), lease id and file path in
/// its path; `Err` is the status of a path served with another method (405) or not at all
/// (404). `{path}`, last in a template, takes the rest of the path (one segment or more).
fn find_route(method: &Method, path: &str) -> Result<Found, StatusCode> {
    let segments: Vec<&str> = path.split('/').collect();
    let mut path_known = false;
    for route in &ROUTES {
        let template: Vec<&str> = route.path.split('/').collect();
        let rest = template.last() == Some(&"{path}");
        if segments.len() != template.len() && !(rest && segments.len() > template.len()) {
            continue;
        }
        let (mut name, mut lease, mut file) = (None, None, None);
        let matches = template.iter().zip(&segments).enumerate().all(|(at, (t, s))| {
            let parameter = match *t {
                "{name}" | "{id}" => &mut name,
                "{lease}" => &mut lease,
                "{path}" => {
                    file = file_path(&segments[at..]);
                    return file.is_some();
                }
                _ => return t == s,
            };
            *parameter = percent_decode(s);
            parameter.as_ref().is_some_and(|p| !p.is_empty())
        });
        if !matches {
            continue;
        }
        path_known = true;
        if route.method == method.as_str() {
            return Ok((route, name, lease, file));
        }
    }
    Err(if path_known {
        StatusCode::METHOD_NOT_ALLOWED
    } else {
        StatusCode::NOT_FOUND
    })
}

/// A file's path from the segments that name it: `/` and each, decoded; `None` when one is
/// empty or does not decode.
fn file_path(segments: &[&str]) -> Option<String> {
    let mut path = String::new();
    for segment in segments {
        let decoded = percent_decode(segment).filter(|d| !d.is_empty())?;
        path.push('/');
        path.push_str(&decoded);
    }
    Some(path)
}

fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

async fn dispatch(State(inner): State<Arc<Inner>>, request: Request) -> Response {
    let at = SystemTime::now();
    let (route, name, lease, file) = match find_route(request.method(), request.uri().path()) {
        Ok(found) => found,
        Err(status) => return empty(status),
    };
    locked(&inner.calls).push(Call {
        operation: route.operation,
        machine: name.clone(),
        lease: lease.clone(),
        path: file.clone(),
        at,
    });
    let delay = locked(&inner.delays).get(route.operation).copied();
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    {
        let mut failures = locked(&inner.failures);
        let mut key = (route.operation, name.clone().unwrap_or_default());
        if failures.get(&key).is_none_or(|left| *left == 0) {
            key.1 = "*".into();
        }
        if let Some(left) = failures.get_mut(&key).filter(|left| **left > 0) {
            *left -= 1;
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "INTERNAL_ERROR",
                format!("injected failure of {} on '{}'", key.0, key.1),
            );
        }
    }
    let query = request.uri().query().unwrap_or_default().to_string();
    let json_body = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let limit = if route.request == Some(Content::Octets) {
        MAX_FILE_BYTES
    } else {
        MAX_JSON_BYTES
    };
    let body = match axum::body::to_bytes(request.into_body(), limit).await {
        Ok(body) => body,
        Err(_) => return text(StatusCode::BAD_REQUEST, "Failed to buffer the request body".into()),
    };
    let name = name.unwrap_or_default();
    let lease = lease.unwrap_or_default();
    let file = file.unwrap_or_default();
    let mut world = locked(&inner.world);
    let world = &mut *world;
    let response = match route.operation {
        "health" => health(world),
        "capacity" => capacity(world),
        "list_machines" => {
            let machines = world.machines.values().map(|m| m.info.clone()).collect();
            json(StatusCode::OK, &ListMachines { machines })
        }
        "create_machine" => match read_required::<CreateMachine>(&body, json_body) {
            Ok(request) => create(world, request),
            Err(refusal) => *refusal,
        },
        "get_machine" => with_machine(world, &name, |m| json(StatusCode::OK, &m.info)),
        // smolvm keeps a machine while branches of it live (a fork base with live clones): its
        // delete is refused unless it cascades, which the agent never asks for. (A pool's
        // source goes with its pool, through the pool's own route.)
        "delete_machine" if has_live_branches(world, &name) => conflict(format!(
            "machine '{name}' is a fork base with live clones (use cascade)"
        )),
        "delete_machine" => match world.machines.remove(&name) {
            Some(_) => json(StatusCode::OK, &DeleteResponse { deleted: name }),
            None => not_found(&name),
        },
        "start_machine" => match read_body::<StartMachine>(&body, json_body, false) {
            Ok(request) => {
                let branchable = request.and_then(|r| r.branchable);
                with_machine(world, &name, |m| start(m, branchable))
            }
            Err(refusal) => *refusal,
        },
        "stop_machine" => with_machine(world, &name, stop),
        "pause_machine" => with_machine(world, &name, pause),
        "resume_machine" => with_machine(world, &name, resume),
        "resize_machine" => match read_required::<ResizeMachine>(&body, json_body) {
            Ok(request) => with_machine(world, &name, |m| resize(m, &request)),
            Err(refusal) => *refusal,
        },
        "branch_machine" => match read_required::<ForkMachine>(&body, json_body) {
            Ok(request) => branch(world, &name, request),
            Err(refusal) => *refusal,
        },
        "list_pools" => {
            let pools = world.pools.values().map(|p| pool_info(world, p)).collect();
            json(StatusCode::OK, &ListForkPools { pools })
        }
        "create_pool" => match read_required::<CreateForkPool>(&body, json_body) {
            Ok(request) => create_pool(world, request),
            Err(refusal) => *refusal,
        },
        "get_pool" => match world.pools.get(&name) {
            Some(pool) => json(StatusCode::OK, &pool_info(world, pool)),
            None => pool_not_found(&name),
        },
        "delete_pool" => match query_flag(&query, "force") {
            Ok(force) => delete_pool(world, &name, force),
            Err(refusal) => *refusal,
        },
        "resize_pool" => match read_required::<ResizeForkPool>(&body, json_body) {
            Ok(request) => resize_pool(world, &name, request.desired_ready),
            Err(refusal) => *refusal,
        },
        "acquire_lease" => match read_required::<AcquireForkLease>(&body, json_body) {
            Ok(request) => acquire(world, &name, request),
            Err(refusal) => *refusal,
        },
        "get_lease" => match find_lease(world, &name, &lease) {
            Ok(Some(at)) => json(StatusCode::OK, &lease_info(&world.leases[at])),
            Ok(None) => error(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                format!("lease '{lease}' not found in fork pool '{name}'"),
            ),
            Err(refusal) => *refusal,
        },
        "heartbeat_lease" => with_active_lease(world, &name, &lease, heartbeat),
        "complete_lease" => with_active_lease(world, &name, &lease, complete),
        "exec_command" => match read_required::<ExecCommand>(&body, json_body) {
            Ok(request) => with_machine(world, &name, |m| exec(m, &request)),
            Err(refusal) => *refusal,
        },
        "stream_logs" => match log_read(&query) {
            Ok(read) => with_machine(world, &name, |m| logs(m, &read)),
            Err(refusal) => *refusal,
        },
        "download_file" => with_machine(world, &name, |m| download(m, &file)),
        "upload_file" => match query_mode(&query) {
            Ok(mode) => with_machine(world, &name, |m| upload(m, &file, mode, &body)),
            Err(refusal) => *refusal,
        },
        _ => empty(StatusCode::NOT_FOUND),
    };
    if route.method != "GET" {
        refill(world);
        inner.ports_changed.notify_one();
    }
    response
}

/// The TCP ports the running machines publish: host port → machine.
fn published(world: &World) -> BTreeMap<u16, String> {
    world
        .machines
        .values()
        .filter(|m| m.info.state == "running")
        .flat_map(|m| {
            m.info
                .ports
                .iter()
                .filter(|p| p.protocol.as_deref() != Some("udp"))
                .map(|p| (p.host, m.info.name.clone()))
        })
        .collect()
}

/// Serves the running machines' published TCP ports on 127.0.0.1 with an echo, as smolvm binds
/// a guest's ports there (see [`DoubleHandle::serve_ports`]), until aborted.
async fn serve_ports(inner: Arc<Inner>) {
    let mut open: BTreeMap<u16, (String, tokio::task::JoinHandle<()>)> = BTreeMap::new();
    loop {
        let want = published(&locked(&inner.world));
        open.retain(|port, (machine, task)| {
            let kept = want.get(port) == Some(machine);
            if !kept {
                task.abort();
            }
            kept
        });
        for (port, machine) in want {
            if open.contains_key(&port) {
                continue;
            }
            match std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(tokio::net::TcpListener::from_std)
            {
                Ok(listener) => {
                    open.insert(port, (machine, tokio::spawn(echo(listener))));
                }
                // Taken (another test's): tried again at the next change.
                Err(_) => continue,
            }
        }
        tokio::select! {
            () = inner.ports_changed.notified() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Echoes what each connection sends, until the listener's task is aborted (its connections go
/// with it, as a paused guest's would stop answering): the guest's service behind a published
/// port, for the double and for tests that stand in for smolvm's loopback listener.
pub async fn echo(listener: tokio::net::TcpListener) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((mut conn, _)) = listener.accept().await {
        while connections.try_join_next().is_some() {}
        connections.spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = conn.read(&mut buf).await {
                if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
    }
}

/// A required body, as [`read_body`] reads it.
fn read_required<T: de::DeserializeOwned>(body: &Bytes, json_type: bool) -> Result<T, Box<Response>> {
    read_body(body, json_type, true)?.ok_or_else(|| {
        Box::new(text(
            StatusCode::BAD_REQUEST,
            "Failed to parse the request body as JSON".into(),
        ))
    })
}

/// A boolean query parameter (absent: false); another value than `true` or `false` is refused
/// in plain text, as smolvm's query layer.
fn query_flag(query: &str, name: &str) -> Result<bool, Box<Response>> {
    let mut flag = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == name {
            flag = match value {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(Box::new(text(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "Failed to deserialize query string: {name}: provided string was not `true` or `false`"
                        ),
                    )));
                }
            };
        }
    }
    Ok(flag)
}

/// The value of a query parameter (the last one given), as it is written.
fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .filter(|(key, _)| *key == name)
        .map(|(_, value)| value)
        .next_back()
}

/// A request body as smolvm's request layer reads it: a required body needs the JSON content
/// type (415), parses (400) and has only known fields (422), each refusal in plain text. An
/// optional body may be empty (`Ok(None)`).
fn read_body<T: de::DeserializeOwned>(
    body: &Bytes,
    json_type: bool,
    required: bool,
) -> Result<Option<T>, Box<Response>> {
    if body.is_empty() && !required {
        return Ok(None);
    }
    if !json_type {
        return Err(Box::new(text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Expected request with `Content-Type: application/json`".into(),
        )));
    }
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        Box::new(text(
            StatusCode::BAD_REQUEST,
            format!("Failed to parse the request body as JSON: {e}"),
        ))
    })?;
    serde_json::from_value(value).map(Some).map_err(|e| {
        Box::new(text(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("Failed to deserialize the JSON body into the target type: {e}"),
        ))
    })
}

fn with_machine(world: &mut World, name: &str, act: impl FnOnce(&mut Machine) -> Response) -> Response {
    match world.machines.get_mut(name) {
        Some(machine) => act(machine),
        None => not_found(name),
    }
}

fn health(world: &World) -> Response {
    let machines = &world.machines;
    let running = machines.values().filter(|m| m.info.state == "running").count();
    json(
        StatusCode::OK,
        &HealthResponse {
            status: "ok".into(),
            version: VERSION.into(),
            machines: Some(MachineCounts {
                total: machines.len() as u64,
                running: running as u64,
            }),
            uptime_seconds: Some(world.started.elapsed().as_secs()),
            nested_virt: false,
        },
    )
}

fn capacity(world: &World) -> Response {
    let running = world.machines.values().filter(|m| m.info.state == "running");
    let (cpus, memory) = running.fold((0, 0), |(c, m), machine| {
        (c + machine.info.cpus, m + machine.info.memory_mb)
    });
    json(
        StatusCode::OK,
        &CapacityResponse {
            allocated_cpus: cpus,
            allocated_memory_mb: memory,
            used_cpus: 0.0,
            used_memory_mb: 0,
            used_disk_gb: 0,
            boot_id: world.boot_id.clone(),
        },
    )
}

/// smolvm's name rule: letters, digits, `-` and `_`, starting with a letter or digit. `kind`
/// names what is named (`machine`; `pool`, assumed to follow the same rule).
fn check_name(kind: &str, name: &str) -> Result<(), String> {
    let Some(first) = name.chars().next() else {
        return Err(format!("{kind} name cannot be empty"));
    };
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(format!("{kind} name contains invalid character: '{bad}'"));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(format!("{kind} name must start with a letter or digit (got: {name:?})"));
    }
    Ok(())
}

fn create(world: &mut World, request: CreateMachine) -> Response {
    let name = request.name.clone().unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        format!("vm-{nanos:08x}")
    });
    if let Err(message) = check_name("machine", &name) {
        return bad_request(message);
    }
    let cpus = request.cpus.map_or(4, u32::from);
    let memory_mb = request.memory_mb.unwrap_or(8192);
    if cpus == 0 {
        return bad_request("config operation failed: validate resources: CPU count must be at least 1".into());
    }
    if memory_mb < 64 {
        return bad_request(format!(
            "config operation failed: validate resources: memory must be at least 64 MiB (got {memory_mb} MiB)"
        ));
    }
    if let Some(port) = request.ports.iter().find(|p| p.host == 0 || p.guest == 0) {
        let zero = if port.host == 0 { port.host } else { port.guest };
        return bad_request(format!("port {zero} is not valid for VM port forwarding"));
    }
    let mounts = match host_mounts(&request.mounts) {
        Ok(mounts) => mounts,
        Err(message) => return bad_request(message),
    };
    if world.machines.contains_key(&name) {
        return error(
            StatusCode::CONFLICT,
            "CONFLICT",
            format!("machine '{name}' already exists"),
        );
    }
    let env = request.env.iter().map(|v| format!("{}={}", v.name, v.value)).collect();
    let mut info = machine_info(name.clone(), request, cpus, u64::from(memory_mb));
    info.mounts = mounts;
    world.machines.insert(
        name,
        Machine {
            info: info.clone(),
            paused: false,
            env,
            worker: None,
            console: Vec::new(),
            workload: Vec::new(),
            files: BTreeMap::new(),
        },
    );
    json(StatusCode::OK, &info)
}

/// A create's host mounts as smolvm checks and reports them (see the module's doc).
fn host_mounts(requested: &[MountSpec]) -> Result<Vec<MountInfo>, String> {
    let mut mounts: Vec<MountInfo> = Vec::new();
    for (i, mount) in requested.iter().enumerate() {
        let source = Path::new(&mount.source);
        if !source.is_absolute() {
            return Err(format!(
                "mount operation failed: validate source: path must be absolute: {}",
                mount.source
            ));
        }
        let resolved =
            std::fs::canonicalize(source).map_err(|_| format!("mount source not found: {}", mount.source))?;
        if !resolved.is_dir() {
            return Err(format!(
                "mount operation failed: validate host path: source path on host must be a directory (virtiofs limitation): {}",
                mount.source
            ));
        }
        if !mount.target.starts_with('/') {
            return Err(format!(
                "mount operation failed: validate guest path: target path on guest should be an absolute directory: {}",
                mount.target
            ));
        }
        if mounts.iter().any(|m| m.target == mount.target) {
            return Err(format!(
                "mount operation failed: validate mounts: duplicate mount target: {} is specified more than once",
                mount.target
            ));
        }
        mounts.push(MountInfo {
            tag: format!("smolvm{i}"),
            source: resolved.display().to_string(),
            target: mount.target.clone(),
            readonly: mount.readonly,
            staged: mount.staged,
        });
    }
    Ok(mounts)
}

fn machine_info(name: String, request: CreateMachine, cpus: u32, memory_mb: u64) -> MachineInfo {
    MachineInfo {
        name,
        state: "created".into(),
        image: request.image,
        cpus,
        memory_mb,
        mounts: Vec::new(),
        ports: request
            .ports
            .into_iter()
            .map(|p| PortSpec {
                protocol: p.protocol.filter(|proto| proto == "udp"),
                ..p
            })
            .collect(),
        network: request.network,
        gpu: false,
        cuda: false,
        allowed_cidrs: request.allowed_cidrs,
        allowed_hosts: request.allowed_hosts,
        storage_gb: request.storage_gb.unwrap_or(20),
        overlay_gb: request.overlay_gb.unwrap_or(10),
        block_io: "sync".into(),
        disk_durability: "full".into(),
        branchable: false,
        forkable: false,
        branchpoint_held: false,
        forkpoint_held: false,
        parent_machine: None,
        disk_used_mb: 0,
        created_at: now_secs(),
    }
}

/// Start boots at once. A paused machine boots afresh: its saved state is discarded. A start
/// with `branchable` sets it (and its legacy alias `forkable`); one without leaves it as it was.
fn start(machine: &mut Machine, branchable: Option<bool>) -> Response {
    if let Some(branchable) = branchable {
        machine.info.branchable = branchable;
        machine.info.forkable = branchable;
    }
    if machine.info.state != "running" {
        machine.boot();
    }
    json(StatusCode::OK, &machine.info)
}

/// Stop: a never-started machine stays `created`; a paused one's saved state is discarded.
fn stop(machine: &mut Machine) -> Response {
    if machine.info.state == "running" {
        machine.info.state = "stopped".into();
        machine.log(format!("machine '{}' stopped", machine.info.name));
    }
    machine.paused = false;
    json(StatusCode::OK, &machine.info)
}

fn pause(machine: &mut Machine) -> Response {
    if machine.info.state != "running" {
        return error(
            StatusCode::CONFLICT,
            "CONFLICT",
            format!("machine '{}' must be running", machine.info.name),
        );
    }
    machine.info.state = "stopped".into();
    machine.paused = true;
    machine.log(format!("machine '{}' paused", machine.info.name));
    json(StatusCode::OK, &machine.info)
}

fn resume(machine: &mut Machine) -> Response {
    if !machine.paused {
        return error(
            StatusCode::CONFLICT,
            "CONFLICT",
            "machine is not paused; use start for a fresh boot".into(),
        );
    }
    machine.info.state = "running".into();
    machine.paused = false;
    machine.log(format!("machine '{}' resumed", machine.info.name));
    json(StatusCode::OK, &machine.info)
}

fn resize(machine: &mut Machine, request: &ResizeMachine) -> Response {
    let live = request.cpus.is_some() || request.memory_mb.is_some();
    if !live && request.storage_gb.is_none() && request.overlay_gb.is_none() {
        return bad_request("at least one of storageGb or overlayGb must be specified".into());
    }
    if live && machine.info.state != "running" {
        return bad_request("live CPU/RAM resize requires a running machine; use update for a stopped machine".into());
    }
    for (field, asked, now) in [
        ("storageGb", request.storage_gb, machine.info.storage_gb),
        ("overlayGb", request.overlay_gb, machine.info.overlay_gb),
    ] {
        if asked.is_some_and(|asked| asked < now) {
            return bad_request(format!("{field} cannot be smaller than current size ({now} GiB)"));
        }
    }
    let info = &mut machine.info;
    info.storage_gb = request.storage_gb.unwrap_or(info.storage_gb);
    info.overlay_gb = request.overlay_gb.unwrap_or(info.overlay_gb);
    info.cpus = request.cpus.unwrap_or(info.cpus);
    info.memory_mb = request.memory_mb.map_or(info.memory_mb, u64::from);
    json(StatusCode::OK, &machine.info)
}

/// Runs a command at once: exit code 0, its words echoed with the machine's name. A machine
/// not running boots first, unless `autoStart` is false.
fn exec(machine: &mut Machine, request: &ExecCommand) -> Response {
    if request.command.is_empty() {
        return bad_request("command must not be empty".into());
    }
    if machine.info.state != "running" {
        if request.auto_start == Some(false) {
            return conflict(format!("machine '{}' is not running", machine.info.name));
        }
        machine.boot();
    }
    let stdout = format!("ran in {}: {}\n", machine.info.name, request.command.join(" "));
    json(
        StatusCode::OK,
        &ExecAnswer {
            exit_code: 0,
            stdout_b64: base64(stdout.as_bytes()),
            stdout,
            stderr: String::new(),
            stderr_b64: String::new(),
        },
    )
}

/// What a log read asks.
struct LogRead {
    /// The workload's log (else the console).
    workload: bool,
    /// Only the last this many lines.
    tail: Option<usize>,
    /// Keep the stream open after the lines.
    follow: bool,
}

/// A log read's query: `follow` and `tail` as smolvm's query layer reads them (plain-text
/// refusals), `source` as its handler does.
fn log_read(query: &str) -> Result<LogRead, Box<Response>> {
    let follow = query_flag(query, "follow")?;
    let tail = match query_value(query, "tail") {
        None => None,
        Some(value) => Some(value.parse::<usize>().map_err(|e| {
            Box::new(text(
                StatusCode::BAD_REQUEST,
                format!("Failed to deserialize query string: tail: {e}"),
            ))
        })?),
    };
    let workload = match query_value(query, "source") {
        None | Some("console") => false,
        Some("workload") => true,
        Some(other) => {
            return Err(Box::new(bad_request(format!(
                "unknown log source '{other}': use console or workload"
            ))));
        }
    };
    Ok(LogRead { workload, tail, follow })
}

/// A machine's log as server-sent events, a `data:` line each.
fn logs(machine: &Machine, read: &LogRead) -> Response {
    if machine.console.is_empty() {
        return error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!(
                "machine '{}' has no logs yet — it may not have been started",
                machine.info.name
            ),
        );
    }
    let lines = if read.workload {
        &machine.workload
    } else {
        &machine.console
    };
    let first = read.tail.map_or(0, |tail| lines.len().saturating_sub(tail));
    let events: String = lines[first..].iter().map(|line| format!("data: {line}\n\n")).collect();
    let body = if read.follow {
        Body::new(Followed(Some(Bytes::from(events))))
    } else {
        Body::from(events)
    };
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

/// A followed log's body: the lines kept, then open with nothing more, as smolvm's was seen.
struct Followed(Option<Bytes>);

impl hyper::body::Body for Followed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        match self.0.take() {
            Some(lines) => std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(lines)))),
            None => std::task::Poll::Pending,
        }
    }
}

/// A file's `?mode=`: permission bits in octal (`0755`, `644`).
fn query_mode(query: &str) -> Result<Option<u32>, Box<Response>> {
    let Some(value) = query_value(query, "mode") else {
        return Ok(None);
    };
    let mode = u32::from_str_radix(value, 8).ok().filter(|mode| *mode <= 0o7777);
    match mode {
        Some(mode) => Ok(Some(mode)),
        None => Err(Box::new(bad_request(format!(
            "mode '{value}' is not permission bits in octal"
        )))),
    }
}

/// A file's bytes, the machine booted first if it does not run.
fn download(machine: &mut Machine, path: &str) -> Response {
    if machine.info.state != "running" {
        machine.boot();
    }
    let Some(file) = machine.files.get(path) else {
        return error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("file '{path}' not found in machine '{}'", machine.info.name),
        );
    };
    let mut response = Response::new(Body::from(file.content.clone()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    response
}

/// Writes a file (mode `0644` unless given), the machine booted first if it does not run.
fn upload(machine: &mut Machine, path: &str, mode: Option<u32>, content: &Bytes) -> Response {
    if machine.info.state != "running" {
        machine.boot();
    }
    let file = File {
        content: content.to_vec(),
        mode: mode.unwrap_or(0o644),
    };
    machine.files.insert(path.to_string(), file);
    let size = content.len() as u64;
    json(
        StatusCode::OK,
        &FileUpload {
            path: path.to_string(),
            size,
        },
    )
}

/// Standard base64 with padding, as smolvm writes `stdoutB64`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let byte = |at: usize| u32::from(chunk.get(at).copied().unwrap_or(0));
        let group = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        for at in 0..4 {
            if at <= chunk.len() {
                out.push(char::from(ALPHABET[(group >> (18 - 6 * at)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The lease time of a pool created without `leaseTtlSecs` (assumed).
const DEFAULT_LEASE_TTL_SECS: u64 = 300;

/// A pool's ready workers, oldest first: running, held at the branch point, not leased.
fn ready_workers(world: &World, pool: u64) -> Vec<(u64, String)> {
    let mut ready: Vec<(u64, String)> = world
        .machines
        .iter()
        .filter(|(_, m)| m.info.branchpoint_held && m.info.state == "running")
        .filter_map(|(name, m)| m.worker.filter(|w| w.pool == pool).map(|w| (w.n, name.clone())))
        .collect();
    ready.sort();
    ready
}

fn active_leases(world: &World, pool: u64) -> u32 {
    let active = world
        .leases
        .iter()
        .filter(|l| l.pool_uid == pool && l.state == "active");
    active.count() as u32
}

fn pool_info(world: &World, pool: &Pool) -> ForkPoolInfo {
    ForkPoolInfo {
        name: pool.name.clone(),
        source: pool.source.clone(),
        golden: pool.source.clone(),
        desired_ready: pool.desired_ready,
        freeze_source: pool.freeze_source,
        auto_admission: pool.auto_admission,
        share_weights: pool.share_weights,
        lease_ttl_secs: pool.lease_ttl_secs,
        max_active: pool.max_active,
        provisioning: 0,
        ready: ready_workers(world, pool.uid).len() as u32,
        activating: 0,
        active: active_leases(world, pool.uid),
        retiring: 0,
        deleting: false,
        created_at: pool.created_at,
    }
}

fn answer_pool(world: &World, name: &str) -> Response {
    match world.pools.get(name) {
        Some(pool) => json(StatusCode::OK, &pool_info(world, pool)),
        None => pool_not_found(name),
    }
}

fn lease_info(lease: &Lease) -> ForkLeaseInfo {
    ForkLeaseInfo {
        id: lease.id.clone(),
        pool: lease.pool.clone(),
        machine: lease.machine.clone(),
        state: lease.state.clone(),
        created_at: lease.created_at,
        expires_at: lease.expires_at,
    }
}

/// Forks every pool's missing ready workers from its source, unless the refill is held or the
/// source is gone, not running or not branchable.
fn refill(world: &mut World) {
    if world.refill_held {
        return;
    }
    let pools: Vec<Pool> = world.pools.values().cloned().collect();
    for pool in pools {
        let source = world.machines.get(&pool.source);
        let Some(source) = source.filter(|m| m.info.state == "running" && m.info.branchable) else {
            continue;
        };
        let (template, env, files) = (source.info.clone(), source.env.clone(), source.files.clone());
        let ready = ready_workers(world, pool.uid).len();
        for _ in ready..pool.desired_ready as usize {
            let (name, n) = loop {
                let n = world.last_worker.entry(pool.name.clone()).or_insert(0);
                *n += 1;
                let name = format!("{}-w{n}", pool.name);
                if !world.machines.contains_key(&name) {
                    break (name, *n);
                }
            };
            let info = MachineInfo {
                name: name.clone(),
                state: "running".into(),
                ports: Vec::new(),
                branchable: false,
                forkable: false,
                branchpoint_held: true,
                forkpoint_held: true,
                parent_machine: Some(pool.source.clone()),
                disk_used_mb: 0,
                created_at: now_secs(),
                ..template.clone()
            };
            let worker = Some(Worker { pool: pool.uid, n });
            let console = vec![format!("machine '{name}' forked from '{}'", pool.source)];
            let workload = vec![format!("workload of '{name}' started")];
            let (env, files) = (env.clone(), files.clone());
            world.machines.insert(
                name,
                Machine {
                    info,
                    paused: false,
                    env,
                    worker,
                    console,
                    workload,
                    files,
                },
            );
        }
    }
}

/// Whether an `env` entry is `KEY=VALUE` with a key.
fn assignment(entry: &str) -> bool {
    entry.split_once('=').is_some_and(|(key, _)| !key.is_empty())
}

/// The running branchable machine `source` that a branch or a pool is made from, or smolvm's
/// refusal: 404 when it does not exist, 409 when it does not run or is not branchable.
fn golden<'w>(world: &'w World, source: &str) -> Result<&'w Machine, Box<Response>> {
    let Some(golden) = world.machines.get(source) else {
        return Err(Box::new(not_found(source)));
    };
    if golden.info.state != "running" {
        return Err(Box::new(conflict(format!("golden machine '{source}' is not running"))));
    }
    if !golden.info.branchable {
        return Err(Box::new(conflict(format!(
            "golden machine '{source}' is not branchable; start it with branchable"
        ))));
    }
    Ok(golden)
}

/// Whether branches of `name` (machines branched from it, not a pool's workers) live.
fn has_live_branches(world: &World, name: &str) -> bool {
    world
        .machines
        .values()
        .any(|m| m.worker.is_none() && m.info.parent_machine.as_deref() == Some(name))
}

/// The first host port the double gives a branch that pins none (smolvm remaps the source's
/// forwards to fresh ports; which ones is its own choice).
const FIRST_REMAPPED_PORT: u16 = 42000;

/// A branch of a running branchable source: a new running machine with the source's image,
/// size, network, environment and files, `request.env` added, and `request.ports` published
/// (without them, the source's guest ports on fresh host ports).
fn branch(world: &mut World, source: &str, request: ForkMachine) -> Response {
    if let Err(message) = check_name("machine", &request.name) {
        return bad_request(message);
    }
    if let Some(bad) = request.env.iter().find(|entry| !assignment(entry)) {
        return bad_request(format!("env entry '{bad}' is not KEY=VALUE"));
    }
    let golden = match golden(world, source) {
        Ok(golden) => golden,
        Err(refusal) => return *refusal,
    };
    if world.machines.contains_key(&request.name) {
        return conflict(format!("machine '{}' already exists", request.name));
    }
    let ports = request.ports.unwrap_or_else(|| {
        let taken: Vec<u16> = world
            .machines
            .values()
            .flat_map(|m| m.info.ports.iter().map(|p| p.host))
            .collect();
        let mut free = (FIRST_REMAPPED_PORT..).filter(|port| !taken.contains(port));
        golden
            .info
            .ports
            .iter()
            .map(|port| PortSpec {
                host: free.next().unwrap_or(port.host),
                ..port.clone()
            })
            .collect()
    });
    let name = request.name;
    let info = MachineInfo {
        name: name.clone(),
        state: "running".into(),
        ports,
        branchable: request.branchable.unwrap_or(false),
        forkable: request.branchable.unwrap_or(false),
        branchpoint_held: false,
        forkpoint_held: false,
        parent_machine: Some(source.to_string()),
        disk_used_mb: 0,
        created_at: now_secs(),
        ..golden.info.clone()
    };
    let mut env = golden.env.clone();
    env.extend(request.env);
    let machine = Machine {
        info,
        paused: false,
        env,
        worker: None,
        console: vec![format!("machine '{name}' branched from '{source}'")],
        workload: vec![format!("workload of '{name}' goes on from '{source}'")],
        files: golden.files.clone(),
    };
    let answer = json(StatusCode::OK, &machine.info);
    world.branched.push(BranchView {
        child: name.clone(),
        source: source.to_string(),
        at: SystemTime::now(),
    });
    world.machines.insert(name, machine);
    answer
}

fn create_pool(world: &mut World, request: CreateForkPool) -> Response {
    if let Err(message) = check_name("pool", &request.name) {
        return bad_request(message);
    }
    if let Err(refusal) = golden(world, &request.source) {
        return *refusal;
    }
    if world.pools.contains_key(&request.name) {
        return conflict(format!("fork pool '{}' already exists", request.name));
    }
    world.last_pool += 1;
    let pool = Pool {
        uid: world.last_pool,
        name: request.name.clone(),
        source: request.source,
        desired_ready: request.desired_ready,
        lease_ttl_secs: request.lease_ttl_secs.unwrap_or(DEFAULT_LEASE_TTL_SECS),
        freeze_source: request.freeze_source,
        auto_admission: request.auto_admission.unwrap_or(false),
        share_weights: request.share_weights,
        max_active: request.max_active,
        created_at: now_secs(),
    };
    world.pools.insert(request.name.clone(), pool);
    refill(world);
    answer_pool(world, &request.name)
}

/// Sets a pool's target: its newest ready workers beyond it are deleted at once, and the refill
/// forks the missing ones.
fn resize_pool(world: &mut World, name: &str, desired_ready: u32) -> Response {
    let Some(pool) = world.pools.get_mut(name) else {
        return pool_not_found(name);
    };
    pool.desired_ready = desired_ready;
    let uid = pool.uid;
    for (_, worker) in ready_workers(world, uid).into_iter().skip(desired_ready as usize) {
        world.machines.remove(&worker);
    }
    refill(world);
    answer_pool(world, name)
}

/// Deletes a pool and its ready workers; with `force`, its leased workers too (their leases
/// `cancelled`), else active leases refuse it. The source is left alone.
fn delete_pool(world: &mut World, name: &str, force: bool) -> Response {
    let Some(pool) = world.pools.get(name) else {
        return pool_not_found(name);
    };
    let uid = pool.uid;
    let active = active_leases(world, uid);
    if active > 0 && !force {
        return conflict(format!(
            "fork pool '{name}' has {active} active lease(s); delete with force=true to cancel them"
        ));
    }
    for lease in world.leases.iter_mut() {
        if lease.pool_uid == uid && lease.state == "active" {
            lease.state = "cancelled".into();
        }
    }
    world.machines.retain(|_, m| m.worker.is_none_or(|w| w.pool != uid));
    world.pools.remove(name);
    json(StatusCode::OK, &DeleteResponse { deleted: name.into() })
}

/// Leases the oldest ready worker: it leaves the branch point with the lease's environment. A
/// key seen before in this pool answers its lease again.
fn acquire(world: &mut World, name: &str, request: AcquireForkLease) -> Response {
    let Some(pool) = world.pools.get(name) else {
        return pool_not_found(name);
    };
    let (uid, default_ttl) = (pool.uid, pool.lease_ttl_secs);
    let key = request.idempotency_key;
    if let Some(lease) = world.leases.iter().find(|l| l.pool_uid == uid && l.key == key) {
        return json(StatusCode::OK, &lease_info(lease));
    }
    if let Some(bad) = request.env.iter().find(|entry| !assignment(entry)) {
        return bad_request(format!("env entry '{bad}' is not KEY=VALUE"));
    }
    let ready = ready_workers(world, uid).into_iter().next();
    let Some(machine) = ready.and_then(|(_, worker)| world.machines.get_mut(&worker)) else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            format!("no ready worker in fork pool '{name}'"),
        );
    };
    machine.info.branchpoint_held = false;
    machine.info.forkpoint_held = false;
    machine.env.extend(request.env);
    let worker = machine.info.name.clone();
    world.last_lease += 1;
    let now = now_secs();
    let ttl_secs = request.ttl_secs.unwrap_or(default_ttl);
    let lease = Lease {
        id: format!("lease-{}", world.last_lease),
        pool: name.into(),
        pool_uid: uid,
        machine: worker,
        state: "active".into(),
        key,
        ttl_secs,
        created_at: now,
        expires_at: now.saturating_add(ttl_secs),
    };
    let info = lease_info(&lease);
    world.leases.push(lease);
    refill(world);
    json(StatusCode::OK, &info)
}

/// Where a pool's lease is in [`World::leases`] (`None`: no such lease); `Err` refuses an
/// unknown pool.
fn find_lease(world: &World, pool: &str, lease: &str) -> Result<Option<usize>, Box<Response>> {
    let Some(pool) = world.pools.get(pool) else {
        return Err(Box::new(pool_not_found(pool)));
    };
    Ok(world
        .leases
        .iter()
        .position(|l| l.pool_uid == pool.uid && l.id == lease))
}

/// Acts on an active lease of a pool (heartbeat, complete); an unknown one is 404, one no
/// longer active 409.
fn with_active_lease(world: &mut World, pool: &str, lease: &str, act: fn(&mut World, usize) -> Response) -> Response {
    let at = match find_lease(world, pool, lease) {
        Ok(Some(at)) => at,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                format!("fork lease '{lease}' not found"),
            );
        }
        Err(refusal) => return *refusal,
    };
    let state = &world.leases[at].state;
    if state != "active" {
        return conflict(format!("fork lease '{lease}' is not active (state: {state})"));
    }
    act(world, at)
}

/// Extends an active lease by its time.
fn heartbeat(world: &mut World, at: usize) -> Response {
    let lease = &mut world.leases[at];
    lease.expires_at = now_secs().saturating_add(lease.ttl_secs);
    json(StatusCode::OK, &lease_info(lease))
}

/// Completes an active lease and deletes its worker (the refill replaces it).
fn complete(world: &mut World, at: usize) -> Response {
    let lease = &mut world.leases[at];
    lease.state = "completed".into();
    let (worker, uid, info) = (lease.machine.clone(), lease.pool_uid, lease_info(lease));
    let ours = |m: &Machine| m.worker.is_some_and(|w| w.pool == uid);
    if world.machines.get(&worker).is_some_and(ours) {
        world.machines.remove(&worker);
    }
    json(StatusCode::OK, &info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;
    use serde_json::{Value, json};

    /// Routes smolvm serves outside its OpenAPI document, by name, with the reason. The double
    /// serves none of them.
    const OUTSIDE_OPENAPI: [(&str, &str); 1] = [(
        "GET /api/v1/machines/{name}/exec/interactive",
        "interactive exec is a WebSocket upgrade, which OpenAPI 3.1 cannot describe; the agent's \
         client for it is tested with its own double (runtime_double)",
    )];

    fn openapi() -> serde_json::Value {
        let text = std::fs::read_to_string(OPENAPI_PATH).expect("smolvm's OpenAPI document");
        serde_json::from_str(&text).expect("JSON")
    }

    /// The schema a `$ref` (or a `oneOf` with null and one `$ref`) names.
    fn schema_name(schema: &serde_json::Value) -> Option<String> {
        if let Some(reference) = schema["$ref"].as_str() {
            return reference.rsplit('/').next().map(str::to_string);
        }
        schema["oneOf"].as_array()?.iter().find_map(schema_name)
    }

    #[test]
    fn every_route_and_field_is_in_smolvms_openapi_document() {
        let doc = openapi();
        assert_eq!(doc["openapi"], "3.1.0");
        for route in ROUTES {
            let served = format!("{} {}", route.method, route.path);
            assert!(
                !OUTSIDE_OPENAPI.iter().any(|(name, _)| *name == served),
                "{served} is listed outside the document"
            );
            let operation = &doc["paths"][route.path][route.method.to_ascii_lowercase()];
            assert!(operation.is_object(), "{served} is not in smolvm's OpenAPI document");
            assert_eq!(operation["operationId"], route.operation, "{served}");
            let answer = &operation["responses"]["200"];
            assert!(answer.is_object(), "{served}: no success answer");
            assert!(describes(answer, route.response), "{served}: answer {answer}");
            let body = &operation["requestBody"];
            match route.request {
                Some(request) => assert!(describes(body, request), "{served}: request body {body}"),
                None => assert!(body.is_null(), "{served}: a request body the double does not read"),
            }
        }
        for (schema, fields) in SCHEMAS {
            let properties = &doc["components"]["schemas"][schema]["properties"];
            assert!(properties.is_object(), "{schema} is not in smolvm's OpenAPI document");
            for field in fields() {
                assert!(properties.get(field).is_some(), "{schema} has no property {field}");
            }
        }
        // Every schema a route names has its wire type here.
        for route in ROUTES {
            let named = route
                .request
                .into_iter()
                .chain([route.response])
                .filter_map(Content::schema);
            for schema in named.chain(["ApiErrorResponse"]) {
                assert!(SCHEMAS.iter().any(|(name, _)| *name == schema), "{schema}");
            }
        }
        // A path's parameters are the operation's, and the query parameters the double reads.
        for route in ROUTES {
            let operation = &doc["paths"][route.path][route.method.to_ascii_lowercase()];
            let parameters = operation["parameters"].as_array().cloned().unwrap_or_default();
            let declared = |name: &str, place: &str| parameters.iter().any(|p| p["name"] == name && p["in"] == place);
            let served = format!("{} {}", route.method, route.path);
            for segment in route.path.split('/').filter(|s| s.starts_with('{')) {
                assert!(
                    ["{name}", "{id}", "{lease}", "{path}"].contains(&segment),
                    "{served}: find_route does not read {segment}"
                );
                assert!(
                    declared(segment.trim_matches(['{', '}']), "path"),
                    "{served}: {segment}"
                );
            }
            for (_, query) in QUERY_PARAMETERS.iter().filter(|(op, _)| *op == route.operation) {
                assert!(declared(query, "query"), "{served}: query {query}");
            }
        }
        for (operation, _) in QUERY_PARAMETERS {
            assert!(ROUTES.iter().any(|r| r.operation == operation), "{operation}");
        }
        // What the double requires of itself are smolvm's required properties, all written.
        for (schema, fields) in [
            ("MachineInfo", fields_of::<MachineInfo>()),
            ("MountInfo", fields_of::<MountInfo>()),
            ("MountSpec", fields_of::<MountSpec>()),
            ("HealthResponse", fields_of::<HealthResponse>()),
            ("ForkPoolInfo", fields_of::<ForkPoolInfo>()),
            ("ListForkPoolsResponse", fields_of::<ListForkPools>()),
            ("ForkLeaseInfo", fields_of::<ForkLeaseInfo>()),
            ("DeleteResponse", fields_of::<DeleteResponse>()),
            ("ExecResponse", fields_of::<ExecAnswer>()),
            ("FileUploadResponse", fields_of::<FileUpload>()),
            ("ExecRequest", fields_of::<ExecCommand>()),
        ] {
            let required = doc["components"]["schemas"][schema]["required"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for name in required.iter().filter_map(|r| r.as_str()) {
                assert!(fields.contains(&name), "{schema}: the double does not write {name}");
            }
        }
    }

    /// Whether an answer or a request body of smolvm's document (`content` by media type) is
    /// `content`: JSON of that schema, bytes, events, or left to the description (no `content`).
    fn describes(body: &Value, content: Content) -> bool {
        let media = &body["content"];
        match content {
            Content::Json(schema) => schema_name(&media["application/json"]["schema"]).as_deref() == Some(schema),
            Content::Octets => media.get("application/octet-stream").is_some(),
            Content::EventStream => media.get("text/event-stream").is_some(),
            Content::Described => media.is_null() && body["description"].is_string(),
        }
    }

    #[test]
    fn fields_are_read_under_their_wire_names() {
        assert_eq!(fields_of::<PortSpec>(), ["host", "guest", "protocol"]);
        assert!(fields_of::<MachineInfo>().contains(&"memoryMb"));
        assert!(fields_of::<HealthResponse>().contains(&"nested_virt"));
        assert!(fields_of::<String>().is_empty());
        assert!(fields_of::<ExecAnswer>().contains(&"stdoutB64"));
        assert!(fields_of::<ExecCommand>().contains(&"autoStart"));
    }

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        for (bytes, want) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"hello\n", "aGVsbG8K"),
            (&[0xfb, 0xff, 0xfe], "+//+"),
        ] {
            assert_eq!(base64(bytes), want, "{bytes:?}");
        }
    }

    #[test]
    fn paths_find_their_route() {
        let lease = "/api/v1/pools/p/leases/lease-1";
        let file = "/api/v1/machines/m1/files/tmp/a%20b/c";
        let cases = [
            ("GET", "/health", Ok(("health", None, None, None))),
            (
                "POST",
                "/api/v1/machines/m1/pause",
                Ok(("pause_machine", Some("m1"), None, None)),
            ),
            (
                "DELETE",
                "/api/v1/machines/a%2Eb",
                Ok(("delete_machine", Some("a.b"), None, None)),
            ),
            ("PATCH", "/api/v1/machines/m1", Err(StatusCode::METHOD_NOT_ALLOWED)),
            ("GET", "/version", Err(StatusCode::NOT_FOUND)),
            ("POST", "/api/v1/machines//pause", Err(StatusCode::NOT_FOUND)),
            (
                "PUT",
                "/api/v1/pools/p/size",
                Ok(("resize_pool", Some("p"), None, None)),
            ),
            ("GET", lease, Ok(("get_lease", Some("p"), Some("lease-1"), None))),
            (
                "POST",
                "/api/v1/pools/p/leases/l%2D2/complete",
                Ok(("complete_lease", Some("p"), Some("l-2"), None)),
            ),
            ("POST", lease, Err(StatusCode::METHOD_NOT_ALLOWED)),
            ("POST", "/api/v1/pools/p/leases//heartbeat", Err(StatusCode::NOT_FOUND)),
            (
                "POST",
                "/api/v1/machines/m1/exec",
                Ok(("exec_command", Some("m1"), None, None)),
            ),
            (
                "GET",
                "/api/v1/machines/m1/logs",
                Ok(("stream_logs", Some("m1"), None, None)),
            ),
            ("GET", file, Ok(("download_file", Some("m1"), None, Some("/tmp/a b/c")))),
            ("PUT", file, Ok(("upload_file", Some("m1"), None, Some("/tmp/a b/c")))),
            ("POST", file, Err(StatusCode::METHOD_NOT_ALLOWED)),
            ("GET", "/api/v1/machines/m1/files", Err(StatusCode::NOT_FOUND)),
            ("GET", "/api/v1/machines/m1/files/", Err(StatusCode::NOT_FOUND)),
            ("GET", "/api/v1/machines/m1/files/a//b", Err(StatusCode::NOT_FOUND)),
        ];
        for (method, path, want) in cases {
            let method = Method::from_bytes(method.as_bytes()).expect("method");
            let got = find_route(&method, path).map(|(r, name, lease, file)| (r.operation, name, lease, file));
            let owned = |text: Option<&str>| text.map(str::to_string);
            let want = want.map(|(op, name, lease, file)| (op, owned(name), owned(lease), owned(file)));
            assert_eq!(got, want, "{method} {path}");
        }
    }

    #[test]
    fn force_is_read_from_the_query() {
        assert_eq!(query_flag("", "force").ok(), Some(false));
        assert_eq!(query_flag("force=true", "force").ok(), Some(true));
        assert_eq!(query_flag("a=b&force=false", "force").ok(), Some(false));
        let refused = query_flag("force=yes", "force").err().map(|r| r.status());
        assert_eq!(refused, Some(StatusCode::BAD_REQUEST));
    }

    /// A socket path of its own for one test.
    fn socket_path(test: &str) -> PathBuf {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        std::env::temp_dir().join(format!("smolvm-double-{test}-{}-{nanos}.sock", std::process::id()))
    }

    /// One request over the double's socket: the status and the body (JSON, or else its text as
    /// a JSON string).
    async fn call(socket: &Path, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| (Bytes::from(b.to_string()), "application/json"));
        let response = send(socket, method, path, body).await;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, body)
    }

    /// One request over the double's socket with a body of any type: the status, the content
    /// type and the body's bytes.
    async fn call_bytes(
        socket: &Path,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> (u16, Option<String>, Vec<u8>) {
        let body = body.map(|b| (Bytes::from(b), "application/octet-stream"));
        let response = send(socket, method, path, body).await;
        let status = response.status().as_u16();
        let content_type = response.headers().get(header::CONTENT_TYPE);
        let content_type = content_type.and_then(|v| v.to_str().ok()).map(str::to_string);
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        (status, content_type, bytes.to_vec())
    }

    /// Sends one request on a connection of its own; the answer's body is still to be read.
    async fn send(
        socket: &Path,
        method: &str,
        path: &str,
        body: Option<(Bytes, &str)>,
    ) -> http::Response<hyper::body::Incoming> {
        let stream = tokio::net::UnixStream::connect(socket).await.expect("connect");
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(connection);
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "localhost");
        if let Some((_, content_type)) = &body {
            request = request.header(header::CONTENT_TYPE, *content_type);
        }
        let body = body.map(|(b, _)| b).unwrap_or_default();
        let request = request.body(Full::new(body)).expect("request");
        sender.send_request(request).await.expect("answer")
    }

    fn refusal(status: u16, code: &str, error: &str) -> (u16, Value) {
        (status, json!({"error": error, "code": code}))
    }

    /// The names of the machines branched from `source`, in smolvm's order.
    async fn workers_of(socket: &Path, source: &str) -> Vec<Value> {
        let (_, list) = call(socket, "GET", "/api/v1/machines", None).await;
        let machines = list["machines"].as_array().cloned().unwrap_or_default();
        machines.into_iter().filter(|m| m["parentMachine"] == source).collect()
    }

    /// A running branchable source `src` (2 CPUs, 1 GiB, `BASE=1`).
    async fn branchable_source(socket: &Path) {
        let source = json!({
            "name": "src", "image": "alpine", "cpus": 2, "memoryMb": 1024,
            "env": [{"name": "BASE", "value": "1"}],
        });
        assert_eq!(call(socket, "POST", "/api/v1/machines", Some(source)).await.0, 200);
        let branchable = Some(json!({"branchable": true}));
        let (status, started) = call(socket, "POST", "/api/v1/machines/src/start", branchable).await;
        assert_eq!(status, 200, "{started}");
        assert_eq!(
            (&started["state"], &started["branchable"]),
            (&json!("running"), &json!(true))
        );
    }

    #[tokio::test]
    async fn a_running_machine_s_published_ports_echo_on_loopback_until_it_pauses() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let double = SmolvmDouble::start(socket_path("ports")).await.expect("double");
        double.serve_ports();
        let s = double.socket();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let create = json!({"name": "m1", "cpus": 1, "memoryMb": 256, "network": true,
            "ports": [{"host": port, "guest": 80}]});
        assert_eq!(call(s, "POST", "/api/v1/machines", Some(create)).await.0, 200);
        let refused = || tokio::net::TcpStream::connect(("127.0.0.1", port));
        assert!(refused().await.is_err(), "nothing published before it runs");
        assert_eq!(call(s, "POST", "/api/v1/machines/m1/start", None).await.0, 200);
        let mut conn = None;
        for _ in 0..100 {
            if let Ok(c) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                conn = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut conn = conn.expect("the running machine's port answers");
        conn.write_all(b"ping").await.expect("write");
        let mut back = [0u8; 4];
        conn.read_exact(&mut back).await.expect("echo");
        assert_eq!(&back, b"ping");
        assert_eq!(call(s, "POST", "/api/v1/machines/m1/pause", None).await.0, 200);
        let mut closed = false;
        for _ in 0..100 {
            if refused().await.is_err() {
                closed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(closed, "a paused machine's port is released");
    }

    #[tokio::test]
    async fn a_create_keeps_and_reports_its_host_mounts() {
        let double = SmolvmDouble::start(socket_path("mounts")).await.expect("double");
        let s = double.socket();
        let dir = std::env::temp_dir().join(format!("smolvm-double-mounts-{}", std::process::id()));
        let real = dir.join("real");
        std::fs::create_dir_all(&real).expect("dir");
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).expect("link");
        std::fs::write(dir.join("file"), b"x").expect("file");
        let path = |p: &std::path::Path| p.display().to_string();
        let create = |name: &str, mounts: Value| json!({"name": name, "cpus": 1, "memoryMb": 256, "mounts": mounts});
        let (status, made) = call(
            s,
            "POST",
            "/api/v1/machines",
            Some(create(
                "m1",
                json!([{"source": path(&link), "target": "/data", "readonly": true}, {"source": path(&real), "target": "/b"}]),
            )),
        )
        .await;
        assert_eq!(status, 200, "{made}");
        let resolved = path(&std::fs::canonicalize(&real).expect("canonical"));
        let want = json!([
            {"tag": "smolvm0", "source": resolved, "target": "/data", "readonly": true, "staged": false},
            {"tag": "smolvm1", "source": resolved, "target": "/b", "readonly": false, "staged": false},
        ]);
        assert_eq!(made["mounts"], want);
        assert_eq!(call(s, "GET", "/api/v1/machines/m1", None).await.1["mounts"], want);
        assert_eq!(
            double.mounts("m1"),
            Some(vec![
                (resolved.clone(), "/data".into(), true),
                (resolved, "/b".into(), false)
            ])
        );
        for (case, mounts, status) in [
            ("relative source", json!([{"source": "rel", "target": "/a"}]), 400),
            (
                "missing source",
                json!([{"source": path(&dir.join("nope")), "target": "/a"}]),
                400,
            ),
            (
                "a file",
                json!([{"source": path(&dir.join("file")), "target": "/a"}]),
                400,
            ),
            ("relative target", json!([{"source": path(&real), "target": "a"}]), 400),
            (
                "a target twice",
                json!([{"source": path(&real), "target": "/a"}, {"source": path(&real), "target": "/a"}]),
                400,
            ),
            (
                "an unknown field",
                json!([{"source": path(&real), "target": "/a", "ro": true}]),
                422,
            ),
        ] {
            let (got, body) = call(s, "POST", "/api/v1/machines", Some(create("m2", mounts))).await;
            assert_eq!(got, status, "{case}: {body}");
        }
        assert_eq!(double.mounts("m2"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn exec_logs_and_files_of_a_machine() {
        let double = SmolvmDouble::start(socket_path("access")).await.expect("double");
        let s = double.socket();
        let machine = json!({"name": "m1", "image": "alpine", "cpus": 1, "memoryMb": 256});
        assert_eq!(call(s, "POST", "/api/v1/machines", Some(machine)).await.0, 200);
        let exec = "/api/v1/machines/m1/exec";
        let logs = "/api/v1/machines/m1/logs";

        // Never booted: no log yet; exec without autoStart is refused and boots nothing.
        let (status, refused) = call(s, "GET", logs, None).await;
        assert_eq!((status, &refused["code"]), (404, &json!("NOT_FOUND")), "{refused}");
        let stay = json!({"command": ["echo", "hello"], "autoStart": false});
        let not_running = refusal(409, "CONFLICT", "machine 'm1' is not running");
        assert_eq!(call(s, "POST", exec, Some(stay.clone())).await, not_running);
        assert_eq!(double.state("m1").as_deref(), Some("created"));
        for (body, status) in [
            (json!({"command": []}), 400),
            (json!({"command": ["true"], "timeout_secs": 1}), 422),
            (json!({"cmd": ["true"]}), 422),
        ] {
            assert_eq!(call(s, "POST", exec, Some(body.clone())).await.0, status, "{body}");
        }

        // With autoStart (smolvm's default) it boots the machine, then runs.
        let (status, ran) = call(s, "POST", exec, Some(json!({"command": ["echo", "hello"]}))).await;
        assert_eq!(status, 200, "{ran}");
        let stdout = "ran in m1: echo hello\n";
        let want = json!({"exitCode": 0, "stdout": stdout, "stderr": "",
            "stdoutB64": base64(stdout.as_bytes()), "stderrB64": ""});
        assert_eq!(ran, want);
        assert_eq!(double.state("m1").as_deref(), Some("running"));
        assert_eq!(call(s, "POST", exec, Some(stay)).await, (200, want));

        // The logs, as server-sent events: the console's and the workload's, the last lines.
        let stopped = call(s, "POST", "/api/v1/machines/m1/stop", None).await;
        assert_eq!(stopped.0, 200);
        let events = |lines: &[&str]| lines.iter().map(|l| format!("data: {l}\n\n")).collect::<String>();
        for (query, lines) in [
            ("", &["machine 'm1' booted", "machine 'm1' stopped"][..]),
            ("?source=console&follow=false&tail=1", &["machine 'm1' stopped"]),
            ("?source=workload", &["workload of 'm1' started"]),
            ("?tail=0", &[]),
        ] {
            let (status, content_type, body) = call_bytes(s, "GET", &format!("{logs}{query}"), None).await;
            assert_eq!(status, 200, "{query}");
            assert_eq!(content_type.as_deref(), Some("text/event-stream"), "{query}");
            assert_eq!(String::from_utf8_lossy(&body), events(lines), "{query}");
        }
        let (status, refused) = call(s, "GET", &format!("{logs}?source=kernel"), None).await;
        assert_eq!((status, &refused["code"]), (400, &json!("BAD_REQUEST")));
        for query in ["?tail=many", "?follow=maybe"] {
            let (status, refused) = call(s, "GET", &format!("{logs}{query}"), None).await;
            assert!(status == 400 && refused.is_string(), "{query}: {status} {refused}");
        }
        // Followed: the lines, then the stream stays open with nothing more.
        let mut body = send(s, "GET", &format!("{logs}?follow=true&tail=1"), None)
            .await
            .into_body();
        let first = body.frame().await.and_then(|f| f.ok()).and_then(|f| f.into_data().ok());
        assert_eq!(first, Some(Bytes::from(events(&["machine 'm1' stopped"]))));
        let more = tokio::time::timeout(Duration::from_millis(200), body.frame()).await;
        assert!(more.is_err(), "a followed log stays open");

        // Files: written (booting the stopped machine), read back byte-exact, with their mode.
        let path = "/api/v1/machines/m1/files/tmp/a%20b/c.bin";
        let content: Vec<u8> = (0..=255u8).collect();
        let written = call_bytes(s, "PUT", &format!("{path}?mode=0600"), Some(content.clone())).await;
        let answer = json!({"path": "/tmp/a b/c.bin", "size": 256});
        assert_eq!(
            (written.0, serde_json::from_slice::<Value>(&written.2).ok()),
            (200, Some(answer))
        );
        assert_eq!(
            double.state("m1").as_deref(),
            Some("running"),
            "a copy boots the machine"
        );
        let file = File {
            content: content.clone(),
            mode: 0o600,
        };
        assert_eq!(double.file("m1", "/tmp/a b/c.bin"), Some(file));
        let read = call_bytes(s, "GET", path, None).await;
        let octets = Some("application/octet-stream".to_string());
        assert_eq!(read, (200, octets, content));
        assert_eq!(call_bytes(s, "PUT", path, Some(b"x".to_vec())).await.0, 200);
        assert_eq!(double.file("m1", "/tmp/a b/c.bin").map(|f| f.mode), Some(0o644));
        let (status, refused) = call(s, "PUT", &format!("{path}?mode=999"), None).await;
        assert_eq!((status, &refused["code"]), (400, &json!("BAD_REQUEST")));
        let missing = refusal(404, "NOT_FOUND", "file '/tmp/none' not found in machine 'm1'");
        assert_eq!(
            call(s, "GET", "/api/v1/machines/m1/files/tmp/none", None).await,
            missing
        );
        let calls = double.calls_of("upload_file");
        let paths: Vec<_> = calls
            .iter()
            .map(|c| (c.machine.as_deref(), c.path.as_deref()))
            .collect();
        assert_eq!(paths[0], (Some("m1"), Some("/tmp/a b/c.bin")));

        // An unknown machine, on every route.
        let unknown = refusal(404, "NOT_FOUND", "machine 'nope' not found");
        let one = Some(json!({"command": ["true"]}));
        assert_eq!(call(s, "POST", "/api/v1/machines/nope/exec", one).await, unknown);
        assert_eq!(call(s, "GET", "/api/v1/machines/nope/logs", None).await, unknown);
        for method in ["GET", "PUT"] {
            let answer = call(s, method, "/api/v1/machines/nope/files/tmp/x", None).await;
            assert_eq!(answer, unknown, "{method}");
        }

        // A worker forked from a source starts with its files and a log of its own.
        branchable_source(s).await;
        let seeded = call_bytes(s, "PUT", "/api/v1/machines/src/files/etc/seed", Some(b"seed".to_vec())).await;
        assert_eq!(seeded.0, 200);
        let pool = json!({"name": "p", "source": "src", "desiredReady": 1});
        assert_eq!(call(s, "POST", "/api/v1/pools", Some(pool)).await.0, 200);
        assert_eq!(
            double.file("p-w1", "/etc/seed").map(|f| f.content),
            Some(b"seed".to_vec())
        );
        let console = double.console("p-w1").unwrap_or_default();
        assert_eq!(console, ["machine 'p-w1' forked from 'src'"]);
        let (status, ran) = call(
            s,
            "POST",
            "/api/v1/machines/p-w1/exec",
            Some(json!({"command": ["id"]})),
        )
        .await;
        assert_eq!((status, &ran["stdout"]), (200, &json!("ran in p-w1: id\n")));
    }

    #[tokio::test]
    async fn a_pool_keeps_its_ready_workers_and_leases_each_once() {
        let double = SmolvmDouble::start(socket_path("pool")).await.expect("double");
        let s = double.socket();
        let pools = "/api/v1/pools";
        let leases = "/api/v1/pools/p/leases";
        assert_eq!(call(s, "GET", pools, None).await, (200, json!({"pools": []})));

        // The refusals of a create.
        let source = json!({"name": "src", "image": "alpine", "cpus": 2, "memoryMb": 1024,
            "env": [{"name": "BASE", "value": "1"}]});
        assert_eq!(call(s, "POST", "/api/v1/machines", Some(source)).await.0, 200);
        let pool = json!({"name": "p", "source": "src", "desiredReady": 3});
        let missing = json!({"name": "p", "source": "nope", "desiredReady": 3});
        let not_found = refusal(404, "NOT_FOUND", "machine 'nope' not found");
        assert_eq!(call(s, "POST", pools, Some(missing)).await, not_found);
        let not_running = refusal(409, "CONFLICT", "golden machine 'src' is not running");
        assert_eq!(call(s, "POST", pools, Some(pool.clone())).await, not_running);
        let (status, started) = call(s, "POST", "/api/v1/machines/src/start", None).await;
        assert_eq!((status, &started["branchable"]), (200, &json!(false)));
        let (status, refused) = call(s, "POST", pools, Some(pool.clone())).await;
        assert_eq!((status, &refused["code"]), (409, &json!("CONFLICT")), "not branchable");
        let branchable = Some(json!({"branchable": true}));
        let (status, started) = call(s, "POST", "/api/v1/machines/src/start", branchable).await;
        assert_eq!((status, &started["branchable"]), (200, &json!(true)));
        let unknown = json!({"name": "p", "source": "src", "desiredReady": 3, "size": 3});
        let (status, refused) = call(s, "POST", pools, Some(unknown)).await;
        assert!(status == 422 && refused.is_string(), "{status} {refused}");

        // Created and filled.
        let (status, info) = call(s, "POST", pools, Some(pool.clone())).await;
        assert_eq!(status, 200, "{info}");
        for (field, want) in [
            ("name", json!("p")),
            ("source", json!("src")),
            ("golden", json!("src")),
            ("desiredReady", json!(3)),
            ("ready", json!(3)),
            ("active", json!(0)),
            ("leaseTtlSecs", json!(300)),
            ("deleting", json!(false)),
        ] {
            assert_eq!(info[field], want, "{field}");
        }
        let (status, taken) = call(s, "POST", pools, Some(pool)).await;
        assert_eq!((status, &taken["code"]), (409, &json!("CONFLICT")));
        assert_eq!(call(s, "GET", "/api/v1/pools/p", None).await, (200, info));
        let workers = workers_of(s, "src").await;
        let names: Vec<&Value> = workers.iter().map(|w| &w["name"]).collect();
        assert_eq!(names, [&json!("p-w1"), &json!("p-w2"), &json!("p-w3")]);
        for worker in &workers {
            assert_eq!(
                (
                    &worker["state"],
                    &worker["branchpointHeld"],
                    &worker["cpus"],
                    &worker["memoryMb"]
                ),
                (&json!("running"), &json!(true), &json!(2), &json!(1024)),
                "{worker}"
            );
            assert_eq!(worker["image"], "alpine");
        }

        // Three leases empty it while the refill is held; a fourth waits for it.
        double.hold_refill(true);
        let mut acquired = Vec::new();
        for key in ["k1", "k2", "k3"] {
            let request = json!({"idempotencyKey": key, "env": [format!("JOB={key}")]});
            let (status, lease) = call(s, "POST", leases, Some(request)).await;
            assert_eq!(status, 200, "{lease}");
            assert_eq!((&lease["pool"], &lease["state"]), (&json!("p"), &json!("active")));
            let machine = lease["machine"].as_str().unwrap_or_default().to_string();
            let (_, worker) = call(s, "GET", &format!("/api/v1/machines/{machine}"), None).await;
            assert_eq!(worker["branchpointHeld"], false, "{worker}");
            assert_eq!(double.env(&machine), Some(vec!["BASE=1".into(), format!("JOB={key}")]));
            acquired.push(lease);
        }
        let machines = acquired.iter().filter_map(|l| l["machine"].as_str());
        let machines: std::collections::BTreeSet<&str> = machines.collect();
        assert_eq!(machines.len(), 3, "{acquired:?}");
        let (status, empty) = call(s, "POST", leases, Some(json!({"idempotencyKey": "k4"}))).await;
        assert_eq!((status, &empty["code"]), (503, &json!("UNAVAILABLE")), "{empty}");
        let again = call(s, "POST", leases, Some(json!({"idempotencyKey": "k1"}))).await;
        assert_eq!(again, (200, acquired[0].clone()));
        let (status, refused) = call(s, "POST", leases, Some(json!({"env": []}))).await;
        assert!(status == 422 && refused.is_string(), "{status} {refused}");
        let unknown = call(
            s,
            "POST",
            "/api/v1/pools/nope/leases",
            Some(json!({"idempotencyKey": "k"})),
        )
        .await;
        assert_eq!(unknown, refusal(404, "NOT_FOUND", "fork pool 'nope' not found"));
        let view = |ready, active| {
            Some(PoolView {
                desired: 3,
                ready,
                active,
            })
        };
        assert_eq!(double.pool("p"), view(0, 3));
        double.hold_refill(false);
        assert_eq!(double.pool("p"), view(3, 3));
        assert_eq!(workers_of(s, "src").await.len(), 6);

        // Heartbeat and complete.
        let (id, machine) = (acquired[0]["id"].as_str().unwrap_or_default(), &acquired[0]["machine"]);
        let lease = format!("{leases}/{id}");
        assert_eq!(call(s, "GET", &lease, None).await, (200, acquired[0].clone()));
        let unknown = refusal(404, "NOT_FOUND", "lease 'lease-99' not found in fork pool 'p'");
        assert_eq!(call(s, "GET", &format!("{leases}/lease-99"), None).await, unknown);
        let (status, beaten) = call(s, "POST", &format!("{lease}/heartbeat"), None).await;
        assert_eq!((status, &beaten["state"]), (200, &json!("active")));
        let (created, expires) = (beaten["createdAt"].as_u64(), beaten["expiresAt"].as_u64());
        assert!(expires >= created.map(|c| c + 300), "{beaten}");
        let unknown = refusal(404, "NOT_FOUND", "fork lease 'lease-99' not found");
        assert_eq!(
            call(s, "POST", &format!("{leases}/lease-99/heartbeat"), None).await,
            unknown
        );
        assert_eq!(
            call(s, "POST", &format!("{leases}/lease-99/complete"), None).await,
            unknown
        );
        let (status, completed) = call(s, "POST", &format!("{lease}/complete"), None).await;
        assert_eq!((status, &completed["state"]), (200, &json!("completed")));
        assert_eq!(
            double.state(machine.as_str().unwrap_or_default()),
            None,
            "its worker is deleted"
        );
        assert_eq!(double.pool("p"), view(3, 2));
        for then in ["heartbeat", "complete"] {
            let (status, refused) = call(s, "POST", &format!("{lease}/{then}"), None).await;
            assert_eq!((status, &refused["code"]), (409, &json!("CONFLICT")), "{then}");
        }
        let calls = double.calls_of("heartbeat_lease");
        assert_eq!(
            (calls[0].machine.as_deref(), calls[0].lease.as_deref()),
            (Some("p"), Some(id))
        );

        // Resize.
        let (status, info) = call(s, "PUT", "/api/v1/pools/p/size", Some(json!({"desiredReady": 1}))).await;
        assert_eq!((status, &info["ready"], &info["active"]), (200, &json!(1), &json!(2)));
        let (status, info) = call(s, "PUT", "/api/v1/pools/p/size", Some(json!({"desiredReady": 2}))).await;
        assert_eq!((status, &info["ready"]), (200, &json!(2)));
        let unknown = call(s, "PUT", "/api/v1/pools/nope/size", Some(json!({"desiredReady": 2}))).await;
        assert_eq!(unknown, refusal(404, "NOT_FOUND", "fork pool 'nope' not found"));

        // Delete: refused with active leases, forced then.
        let (status, refused) = call(s, "DELETE", "/api/v1/pools/p", None).await;
        assert_eq!((status, &refused["code"]), (409, &json!("CONFLICT")), "{refused}");
        let deleted = call(s, "DELETE", "/api/v1/pools/p?force=true", None).await;
        assert_eq!(deleted, (200, json!({"deleted": "p"})));
        let states: Vec<(String, String)> = double.leases().into_iter().map(|l| (l.key, l.state)).collect();
        let want = [("k1", "completed"), ("k2", "cancelled"), ("k3", "cancelled")];
        assert_eq!(states, want.map(|(k, s)| (k.to_string(), s.to_string())));
        assert_eq!(workers_of(s, "src").await, Vec::<Value>::new());
        assert_eq!(
            double.state("src").as_deref(),
            Some("running"),
            "the source is left alone"
        );
        let gone = refusal(404, "NOT_FOUND", "fork pool 'p' not found");
        assert_eq!(call(s, "GET", "/api/v1/pools/p", None).await, gone);
        assert_eq!(call(s, "GET", &lease, None).await, gone);
        assert_eq!(call(s, "DELETE", "/api/v1/pools/p", None).await, gone);
        assert_eq!(call(s, "GET", pools, None).await, (200, json!({"pools": []})));
    }

    #[tokio::test]
    async fn a_restart_forgets_pools_leases_and_ready_workers() {
        let double = SmolvmDouble::start(socket_path("restart")).await.expect("double");
        let s = double.socket();
        branchable_source(s).await;
        let pool = json!({"name": "q", "source": "src", "desiredReady": 2});
        assert_eq!(call(s, "POST", "/api/v1/pools", Some(pool)).await.0, 200);
        let (status, lease) = call(
            s,
            "POST",
            "/api/v1/pools/q/leases",
            Some(json!({"idempotencyKey": "a"})),
        )
        .await;
        assert_eq!(status, 200, "{lease}");
        let leased = lease["machine"].as_str().unwrap_or_default().to_string();
        let (_, before) = call(s, "GET", "/capacity", None).await;

        double.restart();
        assert_eq!(call(s, "GET", "/api/v1/pools", None).await, (200, json!({"pools": []})));
        let gone = refusal(404, "NOT_FOUND", "fork pool 'q' not found");
        let id = lease["id"].as_str().unwrap_or_default();
        assert_eq!(
            call(s, "GET", &format!("/api/v1/pools/q/leases/{id}"), None).await,
            gone
        );
        assert_eq!(double.leases(), Vec::new());
        assert_eq!(double.pool("q"), None);
        let workers = workers_of(s, "src").await;
        assert_eq!(workers.len(), 1, "only the leased worker stays: {workers:?}");
        assert_eq!(
            (&workers[0]["name"], &workers[0]["state"]),
            (&json!(leased), &json!("running"))
        );
        assert_eq!(double.state("src").as_deref(), Some("running"));
        let (_, after) = call(s, "GET", "/capacity", None).await;
        assert!(before["boot_id"].is_string());
        assert_ne!(before["boot_id"], after["boot_id"]);

        // A pool made again names new workers and forgets the old keys.
        let pool = json!({"name": "q", "source": "src", "desiredReady": 1});
        let (status, info) = call(s, "POST", "/api/v1/pools", Some(pool)).await;
        assert_eq!((status, &info["ready"]), (200, &json!(1)), "{info}");
        let (status, again) = call(
            s,
            "POST",
            "/api/v1/pools/q/leases",
            Some(json!({"idempotencyKey": "a"})),
        )
        .await;
        assert_eq!(status, 200, "{again}");
        assert_ne!((&again["id"], &again["machine"]), (&lease["id"], &lease["machine"]));
        assert_eq!(
            double.state(&leased).as_deref(),
            Some("running"),
            "not a worker of the new pool"
        );
    }
}
