//! The node API's axum router: authentication, metrics, and one handler per operation.

use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use futures::StreamExt as _;

use super::failure::{self, ApiFailure};
use super::mapping;
use super::request_checks;
use super::types::{
    DeleteResponse, ErrorCode, HealthResponse, IdentityResponse, MachineState, Method, Operation, StartRequest, calls,
    validate_machine_name,
};
use crate::vmm::{DeleteOutcome, VmmError};

pub use super::answer::{ApiError, MAX_BODY_BYTES};
pub use super::state::{Identity, NodeApiState};
pub use smolvm_api::nodeapi::MAX_FILE_BYTES;

use super::answer::{ApiResult, MachineName, ResponseCode, answer, body_of, not_found, ok};

async fn metrics_layer(State(state): State<NodeApiState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    // The contract's name of the operation (or `Unknown`), for metrics and logs.
    let operation = Operation::name_of(request.method().as_str(), request.uri().path());
    let response = next.run(request).await;
    let code = response
        .extensions()
        .get::<ResponseCode>()
        .map(|c| c.0)
        .unwrap_or("Other");
    let elapsed = started.elapsed();
    state.metrics.observe_request(operation, code, elapsed);
    tracing::debug!(
        operation,
        code,
        status = response.status().as_u16(),
        elapsed_us = elapsed.as_micros() as u64,
        "node API request"
    );
    response
}

async fn auth_layer(State(state): State<NodeApiState>, request: Request, next: Next) -> Response {
    let header = request.headers().get(header::AUTHORIZATION).map(HeaderValue::as_bytes);
    if state.auth.check_header(header) {
        next.run(request).await
    } else {
        ApiError(ApiFailure::new(
            ErrorCode::Unauthenticated,
            "a valid bearer token is required",
        ))
        .into_response()
    }
}

/// The node API router (routes under `/v1`, JSON errors everywhere, bearer token on every call):
/// one route per operation of the contract's table, each at its template and method.
pub fn router(state: NodeApiState) -> Router {
    Operation::ALL
        .iter()
        .fold(Router::new(), |routes, &operation| {
            routes.route(&operation.template(), handler(operation))
        })
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), auth_layer))
        .layer(middleware::from_fn_with_state(state.clone(), metrics_layer))
        .with_state(state)
}

/// The handler of `operation`, at the operation's method.
fn handler(operation: Operation) -> MethodRouter<NodeApiState> {
    let method = match operation.method() {
        Method::Get => MethodFilter::GET,
        Method::Put => MethodFilter::PUT,
        Method::Post => MethodFilter::POST,
        Method::Delete => MethodFilter::DELETE,
    };
    match operation {
        Operation::Health => on(method, health),
        Operation::Identity => on(method, identity),
        Operation::GetMachine => on(method, get_machine),
        Operation::CreateMachine => on(method, create_machine),
        Operation::DeleteMachine => on(method, delete_machine),
        Operation::EnsureMachineRunning => on(method, ensure_running),
        Operation::StopMachine => on(method, stop_machine),
        Operation::ResizeMachine => on(method, resize_machine),
        Operation::SuspendMachine => on(method, super::suspend::suspend_machine),
        Operation::ResumeMachine => on(method, super::suspend::resume_machine),
        Operation::BindVolumes => on(method, super::volumes::bind_volumes),
        Operation::MachineLogs => on(method, machine_logs),
        Operation::ExecInMachine => on(method, exec_in_machine),
        Operation::ExecInteractive => on(method, exec_interactive),
        Operation::ReadFile => on(method, read_file),
        // write_file reads its body itself, within MAX_FILE_BYTES and the upload budget.
        Operation::WriteFile => on(method, write_file).layer(DefaultBodyLimit::disable()),
        Operation::LeaseMachine => on(method, super::pools::lease_machine),
        Operation::BranchMachine => on(method, super::branches::branch_machine),
        Operation::ListPools => on(method, super::pools::list_pools),
        Operation::ApplyPool => on(method, super::pools::apply_pool),
        Operation::DeletePool => on(method, super::pools::delete_pool),
        Operation::ResizePool => on(method, super::pools::resize_pool),
    }
}

pub(super) async fn route_not_found(request: Request) -> ApiError {
    ApiError(ApiFailure::new(
        ErrorCode::RouteNotFound,
        format!("no route {} {}", request.method(), request.uri().path()),
    ))
}

pub(super) async fn method_not_allowed(request: Request) -> ApiError {
    ApiError(ApiFailure::new(
        ErrorCode::MethodNotAllowed,
        format!("method {} is not allowed on {}", request.method(), request.uri().path()),
    ))
}

async fn health(State(state): State<NodeApiState>) -> ApiResult {
    let health = state.vmm.health().await?;
    state.identity.set_runtime_version(Some(health.version.clone()));
    Ok(answer::<calls::Health>(
        StatusCode::OK,
        &HealthResponse {
            status: health.status,
            runtime_version: health.version,
            protocol_version: smolvm_api::constants::PROTOCOL_VERSION.to_string(),
            machines_total: health.machines_total,
            machines_running: health.machines_running,
        },
    ))
}

async fn identity(State(state): State<NodeApiState>) -> ApiResult {
    let (node_uid, runtime_version) = state.identity.snapshot();
    Ok(answer::<calls::Identity>(
        StatusCode::OK,
        &IdentityResponse {
            node_name: state.identity.node_name.clone(),
            node_uid,
            runtime_version,
            protocol_version: smolvm_api::constants::PROTOCOL_VERSION.to_string(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
        },
    ))
}

async fn get_machine(State(state): State<NodeApiState>, MachineName(name): MachineName) -> ApiResult {
    match state.vmm.get(&name).await? {
        Some(machine) => Ok(answer::<calls::GetMachine>(StatusCode::OK, &state.status_of(&machine))),
        None => Err(not_found(&name)),
    }
}

async fn create_machine(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let spec = body_of::<calls::CreateMachine>(body)?;
    if let Some(volumes) = &spec.volumes {
        crate::volumes::plan::check_request(volumes).map_err(ApiFailure::from)?;
    }
    let _guard = state.lock(&name).await;
    let records = state.workload_records.as_ref();
    let compare = |machine: &crate::vmm::Machine| -> ApiResult {
        let recorded = records.and_then(|r| r.read(&name));
        let mut fields = mapping::spec_differences(&spec, machine, state.local_image_dir.as_deref(), recorded.as_ref());
        // The same volumes from another holder match: BindVolumes points the machine at it.
        fields.extend(crate::volumes::plan::differences(
            spec.volumes.as_ref(),
            state.volumes.record(&name).as_ref(),
        ));
        if fields.is_empty() {
            Ok(answer::<calls::CreateMachine>(
                StatusCode::OK,
                &state.status_of(machine),
            ))
        } else {
            Err(ApiFailure::new(
                ErrorCode::MachineSpecConflict,
                format!("machine '{name}' exists with a different spec: {}", fields.join(", ")),
            )
            .with_details(serde_json::json!({ "fields": fields }))
            .into())
        }
    };
    if let Some(existing) = state.vmm.get(&name).await? {
        return compare(&existing);
    }
    // Only a new machine is refused an excluded host port: an existing one (answered above, and
    // started by ensure-running) keeps the ports it was bound with (V6).
    if let Some(guard) = &state.host_ports {
        request_checks::check_excluded_ports(&spec.network.ports, &guard.excluded())?;
    }
    let mut vmm_spec = mapping::to_vmm_spec(&name, &spec);
    state.check_ports(&name, &vmm_spec.ports)?;
    if let Some(volumes) = &spec.volumes {
        vmm_spec.mounts = super::volumes::bind_for_create(&state, &name, volumes)?;
    }
    let created = state.vmm.create(&vmm_spec).await;
    if created.is_err() && spec.volumes.is_some() {
        super::volumes::undo(&state, &name);
    }
    match created {
        Ok(machine) => {
            if let Some(records) = records
                && let Err(error) = records.write(&name, &mapping::workload_digests(&spec.workload))
            {
                // The machine exists; only a later create's comparison of the workload is lost.
                tracing::warn!(machine = %name, %error, "could not record the workload's digests");
            }
            Ok(answer::<calls::CreateMachine>(
                StatusCode::CREATED,
                &state.status_of(&machine),
            ))
        }
        // Created between our get and create by someone else: compare with what is there.
        Err(VmmError::Conflict { message }) => match state.vmm.get(&name).await? {
            Some(existing) => compare(&existing),
            None => Err(VmmError::Conflict { message }.into()),
        },
        Err(error) => Err(error.into()),
    }
}

async fn ensure_running(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    // The body is optional (older controllers send none); it carries this start's registry
    // credentials, which go to smolvm's start and nowhere else.
    let request: StartRequest = match &body {
        Ok(bytes) if bytes.is_empty() => StartRequest::default(),
        _ => body_of::<calls::EnsureMachineRunning>(body)?,
    };
    let _guard = state.lock(&name).await;
    let Some(machine) = state.vmm.get(&name).await? else {
        return Err(not_found(&name));
    };
    if state.status_of(&machine).state == MachineState::Suspended {
        // A fresh start would throw the saved memory away.
        return Err(failure::already_suspended(&name, "a start").into());
    }
    if machine.state == MachineState::Running {
        // A record beside a running machine is stale (a pause that never happened).
        state.suspensions.remove(&name);
        return Ok(answer::<calls::EnsureMachineRunning>(
            StatusCode::OK,
            &state.status_of(&machine),
        ));
    }
    if request.registry_auth.is_some() {
        // Names the registry, never the credential: operators can see a credential was used.
        let registry = machine
            .image
            .as_deref()
            .and_then(smolvm_api::syntax::registry_of)
            .map_or_else(|| "unknown".into(), |(host, _)| host);
        tracing::info!(machine = %name, %registry, "starting with a registry credential (for this start only; not stored)");
    }
    if let Some(guard) = &state.host_ports
        && let Err(excluded) =
            request_checks::check_excluded_ports(&mapping::to_status(&machine).network.ports, &guard.excluded())
    {
        // Ports never change after binding (V6): the machine keeps them; operators are told.
        tracing::warn!(machine = %name, reason = %excluded.body.message, "starting a machine that publishes a host port the policy now excludes; it keeps the ports it was created with");
    }
    state.check_image(&name, machine.image.as_deref(), request.registry_auth.as_ref())?;
    state.check_ports(&name, &machine.ports)?;
    // Never over an empty directory: each volume is a bind of its holder's, or no start.
    state.volumes.ensure_bound(&name).map_err(ApiFailure::from)?;
    // A branch source is started so smolvm can branch it (SPEC 2.6).
    let started = if request.branchable {
        state.vmm.start_branchable(&name, request.registry_auth.as_ref()).await
    } else {
        state.vmm.start(&name, request.registry_auth.as_ref()).await
    };
    state.poke_forwarder();
    let started = started?;
    state.remember_image(&name, machine.image.as_deref(), request.registry_auth.as_ref());
    Ok(answer::<calls::EnsureMachineRunning>(
        StatusCode::OK,
        &state.status_of(&started),
    ))
}

/// `POST /v1/machines/{name}/stop`. A suspended machine's saved state is discarded: it is
/// stopped, and a start boots it afresh.
async fn stop_machine(State(state): State<NodeApiState>, MachineName(name): MachineName) -> ApiResult {
    let _guard = state.lock(&name).await;
    let stopped = state.vmm.stop(&name).await;
    state.poke_forwarder();
    let stopped = stopped?;
    if state.suspensions.read(&name).is_some() {
        state.suspensions.remove(&name);
        tracing::info!(machine = %name, "stopped: the saved state of its suspension is discarded");
    }
    Ok(answer::<calls::StopMachine>(StatusCode::OK, &state.status_of(&stopped)))
}

async fn delete_machine(State(state): State<NodeApiState>, MachineName(name): MachineName) -> ApiResult {
    let _guard = state.lock(&name).await;
    let outcome = state.vmm.delete(&name).await;
    state.poke_forwarder();
    let outcome = outcome?;
    if let Some(records) = &state.workload_records {
        records.remove(&name);
    }
    state.suspensions.remove(&name);
    // Gone from smolvm: its binds undone and its mount points removed (a failure keeps the
    // record, and the next delete tries again).
    state.volumes.remove(&name).map_err(ApiFailure::from)?;
    let body = match outcome {
        DeleteOutcome::Deleted => DeleteResponse {
            deleted: true,
            missing: false,
        },
        DeleteOutcome::Missing => DeleteResponse {
            deleted: false,
            missing: true,
        },
    };
    Ok(answer::<calls::DeleteMachine>(StatusCode::OK, &body))
}

/// How often a followed log checks that its machine still runs (the stream ends when it stops).
const FOLLOW_STATE_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /v1/machines/{name}/logs?source=console|workload&tail=N&follow=true`: the log as plain
/// text lines, streamed as smolvm sends them (the client's reading paces the stream). A log not
/// written yet is empty. `follow` keeps the stream open while the machine runs and ends it when
/// the machine stops or its runtime goes; on a machine that is not running it reads what is
/// there and ends, never hangs. A followed log counts against the stream caps (429
/// `TooManyStreams` beyond them).
async fn machine_logs(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> ApiResult {
    let mut query = request_checks::parse_log_query(query.as_deref().unwrap_or_default())?;
    let Some(machine) = state.vmm.get(&name).await? else {
        return Err(not_found(&name));
    };
    let running = mapping::to_status(&machine).state == MachineState::Running;
    query.follow &= running;
    let permit = if query.follow {
        Some(state.open_stream(&name)?)
    } else {
        None
    };
    let lines = state.vmm.logs(&name, &query).await?;
    let stream = if query.follow {
        let vmm = state.vmm.clone();
        let watched = name.clone();
        let stopped = async move {
            loop {
                tokio::time::sleep(FOLLOW_STATE_CHECK).await;
                match vmm.get(&watched).await {
                    Ok(Some(m)) if mapping::to_status(&m).state == MachineState::Running => {}
                    _ => return,
                }
            }
        };
        lines.take_until(Box::pin(stopped)).boxed()
    } else {
        lines
    };
    // A followed log holds its stream slot until the body is dropped (the client went).
    let stream = match permit {
        Some(permit) => super::stream::Held::new(stream, permit).boxed(),
        None => stream,
    };
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response.extensions_mut().insert(ResponseCode("OK"));
    Ok(response)
}

/// `POST /v1/machines/{name}/exec`: one command in a running machine, its exit code and output.
/// A machine that is not running is 409 `MachineNotRunning` naming its state (smolvm would boot
/// it instead, which a command must never do). Beyond the stream caps: 429 `TooManyStreams`.
async fn exec_in_machine(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let request = body_of::<calls::ExecInMachine>(body)?;
    request_checks::check_exec(&request)?;
    let _stream = state.open_stream(&name)?;
    let status = running(&state, &name, "exec").await?;
    let output = state
        .vmm
        .exec(&name, &request)
        .await
        .map_err(|error| stopped_meanwhile(error, &name, &status, "exec"))?;
    Ok(answer::<calls::ExecInMachine>(
        StatusCode::OK,
        &mapping::exec_response(&output),
    ))
}

/// `GET /v1/machines/{name}/exec?command=…&stdin=…&stdout=…&stderr=…&tty=…`, upgraded to a
/// WebSocket in Kubernetes' channel protocol (`v5.channel.k8s.io`, `v4.channel.k8s.io`; see
/// [`super::stream`]): a command in a running machine, attached while it runs. Every refusal
/// comes before the upgrade, as JSON: 400 for a bad query, a request that is no WebSocket
/// upgrade or offers no subprotocol served; 404; 409 `MachineNotRunning` naming the state
/// (smolvm would boot a stopped machine instead); 429 `TooManyStreams` beyond the stream caps
/// (the session holds its slot until it ends). The command is logged by its program and
/// argument count, never its arguments or output.
async fn exec_interactive(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    upgrade: Result<axum::extract::ws::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult {
    use smolvm_api::channel::{self, ExecStreamQuery};
    let invalid = |message: String| ApiError(ApiFailure::new(ErrorCode::InvalidRequest, message));
    let query = ExecStreamQuery::parse(query.as_deref().unwrap_or_default()).map_err(invalid)?;
    let upgrade = upgrade
        .map_err(|rejection| {
            invalid(format!(
                "GET exec is an interactive session and must be a WebSocket upgrade ({}); POST runs one command",
                rejection.body_text()
            ))
        })?
        .protocols(channel::PROTOCOLS);
    if upgrade.selected_protocol().is_none() {
        return Err(invalid(format!(
            "offer one of the WebSocket subprotocols {} (Sec-WebSocket-Protocol)",
            channel::PROTOCOLS.join(", ")
        )));
    }
    let permit = state.open_stream(&name)?;
    let status = running(&state, &name, "exec").await?;
    let request = crate::vmm::InteractiveRequest {
        command: query.command.clone(),
        tty: query.tty,
    };
    let session = state
        .vmm
        .exec_interactive(&name, &request)
        .await
        .map_err(|error| stopped_meanwhile(error, &name, &status, "exec"))?;
    tracing::info!(machine = %name, program = %query.command[0], arguments = query.command.len() - 1, tty = query.tty, "interactive exec");
    let mut response = upgrade
        .on_failed_upgrade(|error| tracing::info!(%error, "interactive exec: the WebSocket upgrade failed"))
        .on_upgrade(move |socket| async move {
            super::stream::bridge(socket, session, query).await;
            drop(permit);
        });
    response.extensions_mut().insert(ResponseCode("OK"));
    Ok(response)
}

/// The machine and the file path of a files call, both checked, and the machine's status, which
/// must be running (smolvm would boot a stopped machine to serve the call).
async fn running_machine_and_path(
    state: &NodeApiState,
    Path((name, path)): Path<(String, String)>,
    what: &str,
) -> Result<(String, String), ApiError> {
    validate_machine_name(&name).map_err(|message| ApiError(ApiFailure::new(ErrorCode::InvalidRequest, message)))?;
    let path = request_checks::check_file_path(&path)?;
    running(state, &name, what).await?;
    state.activity.touch(&name);
    Ok((name, path))
}

/// The status of machine `name`, which must be running for `what`: 404 when it does not exist,
/// 409 `MachineNotRunning` naming its state when it does not run (smolvm would boot it to serve
/// the call, which a command or a copy must never do).
async fn running(state: &NodeApiState, name: &str, what: &str) -> Result<super::types::MachineStatus, ApiError> {
    let Some(machine) = state.vmm.get(name).await? else {
        return Err(not_found(name));
    };
    let status = state.status_of(&machine);
    if status.state != MachineState::Running {
        return Err(failure::not_running(name, &status, what).into());
    }
    Ok(status)
}

/// A runtime error of a call [`running`] let through: a conflict means the machine stopped
/// between the check and the call (smolvm refused to boot it).
fn stopped_meanwhile(error: VmmError, name: &str, status: &super::types::MachineStatus, what: &str) -> ApiError {
    match error {
        VmmError::Conflict { .. } => ApiError(failure::not_running(name, status, what)),
        other => ApiError::from(other),
    }
}

/// `GET /v1/machines/{name}/files/{path}`: a file of a running machine, streamed (at most
/// [`MAX_FILE_BYTES`]), or a directory's listing as JSON.
async fn read_file(State(state): State<NodeApiState>, path: Path<(String, String)>) -> ApiResult {
    let (name, path) = running_machine_and_path(&state, path, "copying files").await?;
    let file = match state.vmm.read_file(&name, &path, MAX_FILE_BYTES as u64).await {
        Ok(file) => file,
        Err(VmmError::NotFound { .. }) => return Err(missing_file(&state, &name, &path).await),
        Err(error) => return Err(error.into()),
    };
    let mut response = Response::new(Body::from_stream(file.stream));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if file.directory {
            "application/json"
        } else {
            "application/octet-stream"
        }),
    );
    response.extensions_mut().insert(ResponseCode("OK"));
    Ok(response)
}

/// smolvm answered a file read with 404: the file is missing when the machine is still there
/// (404 `FileNotFound`, naming the path), else the machine went since [`running`] saw it.
async fn missing_file(state: &NodeApiState, name: &str, path: &str) -> ApiError {
    match state.vmm.get(name).await {
        Ok(Some(_)) => ApiError(failure::file_not_found(name, path)),
        Ok(None) => not_found(name),
        Err(error) => error.into(),
    }
}

/// `PUT /v1/machines/{name}/files/{path}?mode=0644`: writes the body (at most
/// [`MAX_FILE_BYTES`]) as a file in a running machine, its parent directories made.
///
/// The upload is held whole until smolvm has it, so it takes its bytes from the node's upload
/// budget first: its declared length before a byte of the body is read, or each piece as it
/// arrives when no length is declared. Beyond the budget: 429 `TooManyBytes` (with
/// Retry-After), the body left unread; a declared length over [`MAX_FILE_BYTES`] or over the
/// whole budget: 413 `PayloadTooLarge`, also unread.
async fn write_file(
    State(state): State<NodeApiState>,
    path: Path<(String, String)>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    request: Request,
) -> ApiResult {
    let mode = request_checks::parse_file_mode(query.as_deref().unwrap_or_default())?;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let largest = (MAX_FILE_BYTES as u64).min(state.uploads.limit() as u64);
    if declared.is_some_and(|n| n > largest) {
        return Err(file_too_large(largest).into());
    }
    let (name, path) = running_machine_and_path(&state, path, "copying files").await?;
    let mut hold = super::uploads::UploadHold::default();
    if let Some(declared) = declared
        && !state.uploads.take(&mut hold, declared)
    {
        return Err(too_many_bytes(&state.uploads, declared).into());
    }
    let mut content = bytes::BytesMut::with_capacity(hold.bytes());
    let mut body = request.into_body().into_data_stream();
    while let Some(piece) = body.next().await {
        let piece =
            piece.map_err(|_| ApiFailure::new(ErrorCode::InvalidRequest, "the file's content could not be read"))?;
        let total = (content.len() + piece.len()) as u64;
        if total > largest {
            return Err(file_too_large(largest).into());
        }
        let held = hold.bytes() as u64;
        if total > held && !state.uploads.take(&mut hold, total - held) {
            return Err(too_many_bytes(&state.uploads, total).into());
        }
        content.extend_from_slice(&piece);
    }
    let content = content.freeze();
    let written = content.len();
    state.vmm.write_file(&name, &path, mode, content).await?;
    drop(hold);
    Ok(ok(
        StatusCode::OK,
        &serde_json::json!({ "path": path, "bytes": written }),
    ))
}

/// 413 `PayloadTooLarge`: a file over `largest` bytes (the route's limit, or the whole upload
/// budget when that is smaller).
fn file_too_large(largest: u64) -> ApiFailure {
    ApiFailure::new(ErrorCode::PayloadTooLarge, format!("the file exceeds {largest} bytes"))
}

/// 429 `TooManyBytes`: `requested` bytes do not fit in what `budget` has free now.
fn too_many_bytes(budget: &super::uploads::UploadBudget, requested: u64) -> ApiFailure {
    ApiFailure::new(
        ErrorCode::TooManyBytes,
        format!(
            "this node holds {} bytes of file uploads at once, and other uploads hold them now; retry when one ends",
            budget.limit()
        ),
    )
    .with_details(serde_json::json!({ "limit": budget.limit(), "requested": requested }))
}

async fn resize_machine(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let request = body_of::<calls::ResizeMachine>(body)?;
    let _guard = state.lock(&name).await;
    let Some(mut machine) = state.vmm.get(&name).await? else {
        return Err(not_found(&name));
    };
    if state.status_of(&machine).state == MachineState::Suspended {
        return Err(failure::already_suspended(&name, "a resize").into());
    }
    let plan = mapping::plan_resize(&request, &machine);
    if let Some(disks) = plan.disks {
        machine = state.vmm.resize(&name, &disks).await?;
    }
    if let Some(live) = plan.live {
        if mapping::to_status(&machine).state != MachineState::Running {
            let pending = mapping::pending_live_fields(&live);
            return Err(ApiFailure::new(
                ErrorCode::ResizeRequiresRunning,
                format!(
                    "machine '{name}' is not running: {} can change only on a running machine{}",
                    pending.join(" and "),
                    if plan.disks.is_some() {
                        " (disk growth was applied)"
                    } else {
                        ""
                    }
                ),
            )
            .with_details(serde_json::json!({ "pending": pending, "machine": mapping::to_status(&machine) }))
            .into());
        }
        machine = state.vmm.resize(&name, &live).await?;
    }
    Ok(answer::<calls::ResizeMachine>(
        StatusCode::OK,
        &mapping::to_status(&machine),
    ))
}
