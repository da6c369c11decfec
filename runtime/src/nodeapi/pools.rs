//! LeaseMachine, ListPools, ApplyPool and DeletePool: warm pools on this node, through smolvm's
//! fork pools and leases, with the agent's records of them ([`crate::pools`]).
//!
//! - ApplyPool keeps the pool's source machine (created from the spec, started as a branch
//!   source) and has smolvm keep `slots` ready machines forked from it. The pool is recorded
//!   first, so the keeper makes it again after smolvm restarts. A source that does not boot is
//!   `StartFailed` with smolvm's cause, cleaned: the pool's condition says it.
//! - LeaseMachine serves the machine `{name}` from a ready machine of the pool. The lease's
//!   idempotency key is the name, so a retry answers the same machine; the lease is recorded
//!   once granted and from then the worker answers to `{name}` ([`crate::pools::LeasedVmm`]).
//! - DeletePool gives the ready machines back at once; the pool and its source go once no
//!   served machine remains (`PoolInUse` until then). Served machines are never touched.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;

use super::logic::{self, ApiFailure};
use super::server::{ApiError, ApiResult, MachineName, NodeApiState, answer, body_of, not_found};
use super::types::{DeleteResponse, ErrorCode, MachineState, PoolList, PoolStatus, calls};
use crate::pools::{LEASE_TTL_SECS, LeaseRecord, PoolRecord, pool_request};
use crate::vmm::{DeleteOutcome, LeaseRequest, PoolInfo, VmmError};

fn pool_not_found(pool: &str) -> ApiError {
    ApiError(ApiFailure::new(
        ErrorCode::PoolNotFound,
        format!("pool '{pool}' not found on this node"),
    ))
}

fn to_status(info: &PoolInfo) -> PoolStatus {
    PoolStatus {
        name: info.name.clone(),
        slots: info.desired,
        ready: info.ready,
        provisioning: info.provisioning,
        leased: info.active,
    }
}

/// `POST /v1/machines/{name}/lease`: the machine served from a ready machine of the pool.
/// 404 `PoolNotFound`; 409 `NoReadySlot` when the pool has none ready, `Conflict` when a machine
/// of that name exists that no pool served.
pub(super) async fn lease_machine(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let request = body_of::<calls::LeaseMachine>(body)?;
    let _guard = state.lock(&name).await;
    if let Some(record) = state.pools.leases.read(&name) {
        if record.pool != request.pool {
            return Err(ApiFailure::new(
                ErrorCode::Conflict,
                format!(
                    "machine '{name}' is served from the pool '{}', not '{}'",
                    record.pool, request.pool
                ),
            )
            .into());
        }
        return match state.vmm.get(&name).await? {
            Some(machine) => Ok(answer::<calls::LeaseMachine>(
                StatusCode::OK,
                &state.status_of(&machine),
            )),
            None => Err(not_found(&name)),
        };
    }
    if state.vmm.get(&name).await?.is_some() {
        return Err(ApiFailure::new(
            ErrorCode::Conflict,
            format!("machine '{name}' exists and was not served from a pool"),
        )
        .into());
    }
    let env = logic::to_vmm_env(&request.env);
    let lease = LeaseRequest {
        key: &name,
        env: &env,
        ttl_secs: LEASE_TTL_SECS,
    };
    let granted = match state.vmm.acquire_lease(&request.pool, &lease).await {
        Ok(granted) => granted,
        Err(VmmError::NotFound { .. }) => return Err(pool_not_found(&request.pool)),
        Err(error) => return Err(error.into()),
    };
    let record = LeaseRecord {
        pool: request.pool.clone(),
        lease: granted.id,
        worker: granted.machine,
    };
    state.pools.leases.write(&name, &record).map_err(|error| {
        ApiFailure::new(
            ErrorCode::RuntimeError,
            format!("cannot record the lease of machine '{name}' on this node: {error}"),
        )
    })?;
    tracing::info!(machine = %name, pool = %record.pool, worker = %record.worker, "served from a ready slot");
    match state.vmm.get(&name).await? {
        Some(machine) => Ok(answer::<calls::LeaseMachine>(
            StatusCode::OK,
            &state.status_of(&machine),
        )),
        None => Err(not_found(&name)),
    }
}

/// `GET /v1/pools`: the pools smolvm keeps on this node.
pub(super) async fn list_pools(State(state): State<NodeApiState>) -> ApiResult {
    let pools = state.vmm.pools().await?;
    Ok(answer::<calls::ListPools>(
        StatusCode::OK,
        &PoolList {
            pools: pools.iter().map(to_status).collect(),
        },
    ))
}

/// `PUT /v1/pools/{name}`: the pool's source machine created and started as a branch source
/// where it is not, then smolvm's pool made or resized to `slots`.
pub(super) async fn apply_pool(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let spec = body_of::<calls::ApplyPool>(body)?;
    let _guard = state.lock(&name).await;
    let record = PoolRecord {
        source: spec.source.clone(),
        slots: spec.slots,
    };
    state.pools.pools.write(&name, &record).map_err(|error| {
        ApiFailure::new(
            ErrorCode::RuntimeError,
            format!("cannot record the pool '{name}' on this node: {error}"),
        )
    })?;
    let info = ensure_pool(&state, &name, &record, spec.registry_auth.as_ref()).await?;
    Ok(answer::<calls::ApplyPool>(StatusCode::OK, &to_status(&info)))
}

/// The pool `name` as `record` says, made where smolvm lacks any part of it: the keeper's way
/// back after smolvm restarts, and ApplyPool's.
pub(crate) async fn ensure_pool(
    state: &NodeApiState,
    name: &str,
    record: &PoolRecord,
    registry_auth: Option<&super::types::RegistryAuth>,
) -> Result<PoolInfo, ApiError> {
    let source = match state.vmm.get(name).await? {
        Some(machine) => machine,
        None => {
            if let Some(guard) = &state.host_ports {
                logic::check_excluded_ports(&record.source.network.ports, &guard.excluded())?;
            }
            match state.vmm.create(&logic::to_vmm_spec(name, &record.source)).await {
                Ok(machine) => machine,
                Err(VmmError::Conflict { .. }) => state.vmm.get(name).await?.ok_or_else(|| not_found(name))?,
                Err(error) => return Err(error.into()),
            }
        }
    };
    if source.state != MachineState::Running {
        state.check_image(name, source.image.as_deref(), registry_auth)?;
        state.vmm.start_branchable(name, registry_auth).await?;
        state.remember_image(name, source.image.as_deref(), registry_auth);
    }
    let pools = state.vmm.pools().await?;
    match pools.into_iter().find(|p| p.name == name) {
        Some(pool) if pool.desired == record.slots => Ok(pool),
        Some(_) => Ok(state.vmm.resize_pool(name, record.slots).await?),
        None => Ok(state.vmm.create_pool(&pool_request(name, record.slots)).await?),
    }
}

/// `DELETE /v1/pools/{name}`: the ready machines go at once; the pool and its source once no
/// machine served from it remains (409 `PoolInUse` until then, naming how many).
pub(super) async fn delete_pool(State(state): State<NodeApiState>, MachineName(name): MachineName) -> ApiResult {
    let _guard = state.lock(&name).await;
    let leased = state
        .pools
        .leases
        .all()
        .into_iter()
        .filter(|(_, record)| record.pool == name)
        .count();
    if leased > 0 {
        match state.vmm.resize_pool(&name, 0).await {
            Ok(_) | Err(VmmError::NotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        return Err(ApiFailure::new(
            ErrorCode::PoolInUse,
            format!("pool '{name}' still serves {leased} machine(s); its ready slots were given back"),
        )
        .with_details(serde_json::json!({ "leased": leased }))
        .into());
    }
    state.pools.pools.remove(&name);
    let pool = state.vmm.delete_pool(&name).await?;
    let source = state.vmm.delete(&name).await?;
    let deleted = pool == DeleteOutcome::Deleted || source == DeleteOutcome::Deleted;
    Ok(answer::<calls::DeletePool>(
        StatusCode::OK,
        &DeleteResponse {
            deleted,
            missing: !deleted,
        },
    ))
}
