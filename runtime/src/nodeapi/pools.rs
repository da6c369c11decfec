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
//! - LeaseMachine lowers the pool's wanted slots by one (recorded, and in smolvm): the refill is
//!   the controller's, which books each slot before it asks for it.
//! - ResizePool sets the pool's wanted slots: the controller gives ready slots' room to a SmolVM
//!   so, before it creates the machine there.
//! - DeletePool gives the ready machines back at once; the pool and its source go once no
//!   served machine remains (`PoolInUse` until then). Served machines are never touched. The
//!   record goes last, once smolvm's pool and the source are both gone: until then the node
//!   reports the pool and the keeper leaves it alone, so a delete that failed half-way is asked
//!   again by the controller.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;

use super::answer::{ApiError, ApiResult, MachineName, answer, body_of, not_found};
use super::failure::ApiFailure;
use super::mapping;
use super::request_checks;
use super::state::NodeApiState;
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
    let env = mapping::to_vmm_env(&request.env);
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
    lower_after_lease(&state, &record.pool).await;
    match state.vmm.get(&name).await? {
        Some(machine) => Ok(answer::<calls::LeaseMachine>(
            StatusCode::OK,
            &state.status_of(&machine),
        )),
        None => Err(not_found(&name)),
    }
}

/// A lease was granted from `pool`: its wanted slots go down by one, recorded and in smolvm, so
/// smolvm does not fork a replacement on its own. The refill is the controller's: it books the
/// slot's room before it asks for it (ApplyPool). The pool's lock is taken after the machine's
/// (never the other way round), so no two calls wait on each other.
async fn lower_after_lease(state: &NodeApiState, pool: &str) {
    let _guard = state.lock(pool).await;
    let Some(mut record) = state.pools.pools.read(pool) else {
        return;
    };
    record.slots = record.slots.saturating_sub(1);
    if let Err(error) = state.pools.pools.write(pool, &record) {
        tracing::warn!(%pool, %error, "cannot record the pool's lowered slots");
    }
    if let Err(error) = state.vmm.resize_pool(pool, record.slots).await {
        tracing::warn!(%pool, %error, "cannot lower the pool's slots in smolvm after a lease; its refill may start a slot the controller did not book");
    }
}

/// `GET /v1/pools`: the pools smolvm keeps on this node, and those the agent has a record of
/// ([`crate::pools::with_records`]).
pub(super) async fn list_pools(State(state): State<NodeApiState>) -> ApiResult {
    let pools = state.vmm.pools().await?;
    let pools = crate::pools::with_records(pools.iter().map(to_status).collect(), &state.pools);
    Ok(answer::<calls::ListPools>(StatusCode::OK, &PoolList { pools }))
}

/// `POST /v1/pools/{name}/resize`: the pool's wanted slots set, recorded then in smolvm (which
/// deletes the ready machines beyond them at once). 404 `PoolNotFound` for a pool without a
/// record, or one being deleted.
pub(super) async fn resize_pool(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let resize = body_of::<calls::ResizePool>(body)?;
    let _guard = state.lock(&name).await;
    let Some(mut record) = state.pools.pools.read(&name).filter(|r| !r.deleting) else {
        return Err(pool_not_found(&name));
    };
    record.slots = resize.slots;
    state.pools.pools.write(&name, &record).map_err(|error| {
        ApiFailure::new(
            ErrorCode::RuntimeError,
            format!("cannot record the pool '{name}' on this node: {error}"),
        )
    })?;
    let status = match state.vmm.resize_pool(&name, resize.slots).await {
        Ok(info) => to_status(&info),
        // smolvm lost it (restarted, or its source never started): the keeper makes it again
        // with these slots.
        Err(VmmError::NotFound { .. }) => PoolStatus {
            name: name.clone(),
            slots: resize.slots,
            ..PoolStatus::default()
        },
        Err(error) => return Err(error.into()),
    };
    Ok(answer::<calls::ResizePool>(StatusCode::OK, &status))
}

/// The keeper's way back for the pool `name` after smolvm lost it: under the pool's lock, from
/// its record read again (a DeletePool that ran meanwhile removed it, or marked it deleting:
/// then nothing is made).
pub(crate) async fn remake_pool(state: &NodeApiState, name: &str) -> Result<(), ApiError> {
    let _guard = state.lock(name).await;
    match state.pools.pools.read(name) {
        Some(record) if !record.deleting => ensure_pool(state, name, &record, None).await.map(|_| ()),
        _ => Ok(()),
    }
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
        deleting: false,
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
                request_checks::check_excluded_ports(&record.source.network.ports, &guard.excluded())?;
            }
            match state.vmm.create(&mapping::to_vmm_spec(name, &record.source)).await {
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
    // Marked first: from now on the keeper leaves it alone and the node reports it with no
    // slots wanted, until both smolvm's pool and the source are gone.
    if let Some(mut record) = state.pools.pools.read(&name).filter(|r| !r.deleting) {
        record.deleting = true;
        record.slots = 0;
        state.pools.pools.write(&name, &record).map_err(|error| {
            ApiFailure::new(
                ErrorCode::RuntimeError,
                format!("cannot record the deletion of pool '{name}' on this node: {error}"),
            )
        })?;
    }
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
    // A failure of either leaves the record: the pool is still reported, and asked again.
    let pool = state.vmm.delete_pool(&name).await?;
    let source = state.vmm.delete(&name).await?;
    state.pools.pools.remove(&name);
    let deleted = pool == DeleteOutcome::Deleted || source == DeleteOutcome::Deleted;
    Ok(answer::<calls::DeletePool>(
        StatusCode::OK,
        &DeleteResponse {
            deleted,
            missing: !deleted,
        },
    ))
}
