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
/// the schemas of the request body it reads and of its success answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// HTTP method.
    pub method: &'static str,
    /// Path template, as smolvm's OpenAPI document writes it.
    pub path: &'static str,
    /// smolvm's `operationId`.
    pub operation: &'static str,
    /// The schema of the request body read, if any.
    pub request: Option<&'static str>,
    /// The schema of the success answer.
    pub response: &'static str,
}

const fn route(
    method: &'static str,
    path: &'static str,
    operation: &'static str,
    request: Option<&'static str>,
    response: &'static str,
) -> Route {
    Route {
        method,
        path,
        operation,
        request,
        response,
    }
}

/// Every route the double serves.
pub const ROUTES: [Route; 11] = [
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
];

/// The field names of a wire type, as serde reads them.
pub type Fields = fn() -> &'static [&'static str];

/// Every wire type of the double, by the name of smolvm's schema it plays, with its fields: the
/// answers it writes, the request bodies it reads, and the objects inside them.
pub const SCHEMAS: [(&str, Fields); 14] = [
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
    ("MountInfo", fields_of::<NoFields>),
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
    mounts: Vec<NoFields>,
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
    disk_used_mb: u64,
    created_at: u64,
}

/// An object the double never fills (a machine's mounts).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NoFields {}

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

/// One call the double received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// smolvm's operation id of the route ([`ROUTES`]).
    pub operation: &'static str,
    /// The machine named in the path, if any.
    pub machine: Option<String>,
    /// When the request arrived (its head read).
    pub at: SystemTime,
}

/// A machine as the double keeps it.
#[derive(Debug, Clone)]
struct Machine {
    info: MachineInfo,
    /// Paused: its state saved, resumable.
    paused: bool,
}

#[derive(Debug)]
struct Inner {
    machines: Mutex<BTreeMap<String, Machine>>,
    calls: Mutex<Vec<Call>>,
    delays: Mutex<BTreeMap<&'static str, Duration>>,
    started: Instant,
    boot_id: String,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let inner = Arc::new(Inner {
            machines: Mutex::default(),
            calls: Mutex::default(),
            delays: Mutex::default(),
            started: Instant::now(),
            boot_id: format!("double-{}-{nanos}", std::process::id()),
        });
        let app = axum::Router::new().fallback(dispatch).with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(DoubleHandle { socket, inner, task })
    }
}

/// A running double: it serves until dropped.
pub struct DoubleHandle {
    socket: PathBuf,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DoubleHandle {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl DoubleHandle {
    /// The socket it serves on (what `--attach-socket` takes).
    pub fn socket(&self) -> &Path {
        &self.socket
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

    /// smolvm's state word of a machine (`created`, `running`, `stopped`), if it exists.
    pub fn state(&self, name: &str) -> Option<String> {
        locked(&self.inner.machines).get(name).map(|m| m.info.state.clone())
    }

    /// Whether a machine is paused (its state saved).
    pub fn is_paused(&self, name: &str) -> bool {
        locked(&self.inner.machines).get(name).is_some_and(|m| m.paused)
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

fn bad_request(message: String) -> Response {
    error(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
}

/// The route of a request and the machine name in its path; `Err` is the status of a path
/// served with another method (405) or not at all (404).
fn find_route(method: &Method, path: &str) -> Result<(&'static Route, Option<String>), StatusCode> {
    let segments: Vec<&str> = path.split('/').collect();
    let mut path_known = false;
    for route in &ROUTES {
        let template: Vec<&str> = route.path.split('/').collect();
        if template.len() != segments.len() {
            continue;
        }
        let mut name = None;
        let matches = template.iter().zip(&segments).all(|(t, s)| {
            if *t == "{name}" {
                name = percent_decode(s);
                name.as_ref().is_some_and(|n| !n.is_empty())
            } else {
                t == s
            }
        });
        if !matches {
            continue;
        }
        path_known = true;
        if route.method == method.as_str() {
            return Ok((route, name));
        }
    }
    Err(if path_known {
        StatusCode::METHOD_NOT_ALLOWED
    } else {
        StatusCode::NOT_FOUND
    })
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
    let (route, name) = match find_route(request.method(), request.uri().path()) {
        Ok(found) => found,
        Err(status) => return empty(status),
    };
    locked(&inner.calls).push(Call {
        operation: route.operation,
        machine: name.clone(),
        at,
    });
    let delay = locked(&inner.delays).get(route.operation).copied();
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let json_body = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let body = match axum::body::to_bytes(request.into_body(), 1024 * 1024).await {
        Ok(body) => body,
        Err(_) => return text(StatusCode::BAD_REQUEST, "Failed to buffer the request body".into()),
    };
    let name = name.unwrap_or_default();
    match route.operation {
        "health" => health(&inner),
        "capacity" => capacity(&inner),
        "list_machines" => {
            let machines = locked(&inner.machines).values().map(|m| m.info.clone()).collect();
            json(StatusCode::OK, &ListMachines { machines })
        }
        "create_machine" => match read_body::<CreateMachine>(&body, json_body, true) {
            Ok(Some(request)) => create(&inner, request),
            Ok(None) => text(
                StatusCode::BAD_REQUEST,
                "Failed to parse the request body as JSON".into(),
            ),
            Err(refusal) => *refusal,
        },
        "get_machine" => with_machine(&inner, &name, |m| json(StatusCode::OK, &m.info)),
        "delete_machine" => match locked(&inner.machines).remove(&name) {
            Some(_) => json(StatusCode::OK, &DeleteResponse { deleted: name }),
            None => not_found(&name),
        },
        "start_machine" => match read_body::<StartMachine>(&body, json_body, false) {
            Ok(_) => with_machine(&inner, &name, start),
            Err(refusal) => *refusal,
        },
        "stop_machine" => with_machine(&inner, &name, stop),
        "pause_machine" => with_machine(&inner, &name, pause),
        "resume_machine" => with_machine(&inner, &name, resume),
        "resize_machine" => match read_body::<ResizeMachine>(&body, json_body, true) {
            Ok(Some(request)) => with_machine(&inner, &name, |m| resize(m, &request)),
            Ok(None) => text(
                StatusCode::BAD_REQUEST,
                "Failed to parse the request body as JSON".into(),
            ),
            Err(refusal) => *refusal,
        },
        _ => empty(StatusCode::NOT_FOUND),
    }
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

fn with_machine(inner: &Inner, name: &str, act: impl FnOnce(&mut Machine) -> Response) -> Response {
    let mut machines = locked(&inner.machines);
    match machines.get_mut(name) {
        Some(machine) => act(machine),
        None => not_found(name),
    }
}

fn health(inner: &Inner) -> Response {
    let machines = locked(&inner.machines);
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
            uptime_seconds: Some(inner.started.elapsed().as_secs()),
            nested_virt: false,
        },
    )
}

fn capacity(inner: &Inner) -> Response {
    let machines = locked(&inner.machines);
    let running = machines.values().filter(|m| m.info.state == "running");
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
            boot_id: inner.boot_id.clone(),
        },
    )
}

/// smolvm's name rule: letters, digits, `-` and `_`, starting with a letter or digit.
fn check_name(name: &str) -> Result<(), String> {
    let Some(first) = name.chars().next() else {
        return Err("machine name cannot be empty".into());
    };
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(format!("machine name contains invalid character: '{bad}'"));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(format!(
            "machine name must start with a letter or digit (got: {name:?})"
        ));
    }
    Ok(())
}

fn create(inner: &Inner, request: CreateMachine) -> Response {
    let name = request.name.clone().unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        format!("vm-{nanos:08x}")
    });
    if let Err(message) = check_name(&name) {
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
    let mut machines = locked(&inner.machines);
    if machines.contains_key(&name) {
        return error(
            StatusCode::CONFLICT,
            "CONFLICT",
            format!("machine '{name}' already exists"),
        );
    }
    let info = machine_info(name.clone(), request, cpus, u64::from(memory_mb));
    machines.insert(
        name,
        Machine {
            info: info.clone(),
            paused: false,
        },
    );
    json(StatusCode::OK, &info)
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
        disk_used_mb: 0,
        created_at: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    }
}

/// Start boots at once. A paused machine boots afresh: its saved state is discarded.
fn start(machine: &mut Machine) -> Response {
    machine.info.state = "running".into();
    machine.paused = false;
    json(StatusCode::OK, &machine.info)
}

/// Stop: a never-started machine stays `created`; a paused one's saved state is discarded.
fn stop(machine: &mut Machine) -> Response {
    if machine.info.state == "running" {
        machine.info.state = "stopped".into();
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

#[cfg(test)]
mod tests {
    use super::*;

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
            let answer = &operation["responses"]["200"]["content"]["application/json"]["schema"];
            assert_eq!(schema_name(answer).as_deref(), Some(route.response), "{served}: answer");
            let body = &operation["requestBody"]["content"]["application/json"]["schema"];
            assert_eq!(schema_name(body).as_deref(), route.request, "{served}: request body");
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
            for schema in route.request.into_iter().chain([route.response, "ApiErrorResponse"]) {
                assert!(SCHEMAS.iter().any(|(name, _)| *name == schema), "{schema}");
            }
        }
        // What the double requires of itself are smolvm's required properties, all written.
        for (schema, fields) in [
            ("MachineInfo", fields_of::<MachineInfo>()),
            ("HealthResponse", fields_of::<HealthResponse>()),
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

    #[test]
    fn fields_are_read_under_their_wire_names() {
        assert_eq!(fields_of::<PortSpec>(), ["host", "guest", "protocol"]);
        assert!(fields_of::<MachineInfo>().contains(&"memoryMb"));
        assert!(fields_of::<HealthResponse>().contains(&"nested_virt"));
        assert!(fields_of::<String>().is_empty());
    }

    #[test]
    fn paths_find_their_route() {
        let cases = [
            ("GET", "/health", Ok(("health", None))),
            ("POST", "/api/v1/machines/m1/pause", Ok(("pause_machine", Some("m1")))),
            ("DELETE", "/api/v1/machines/a%2Eb", Ok(("delete_machine", Some("a.b")))),
            ("PATCH", "/api/v1/machines/m1", Err(StatusCode::METHOD_NOT_ALLOWED)),
            ("GET", "/version", Err(StatusCode::NOT_FOUND)),
            ("POST", "/api/v1/machines//pause", Err(StatusCode::NOT_FOUND)),
        ];
        for (method, path, want) in cases {
            let method = Method::from_bytes(method.as_bytes()).expect("method");
            let got = find_route(&method, path).map(|(r, name)| (r.operation, name));
            let want = want.map(|(op, name)| (op, name.map(str::to_string)));
            assert_eq!(got, want, "{method} {path}");
        }
    }
}
