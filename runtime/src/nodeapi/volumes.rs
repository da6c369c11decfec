//! The node API's side of a machine's volumes ([`crate::volumes`]): the binds of a create, and
//! BindVolumes, which points a machine that is not running at a new holder Pod.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;

use super::answer::{ApiError, ApiResult, MachineName, answer, body_of, not_found};
use super::failure::ApiFailure;
use super::state::NodeApiState;
use super::types::{ErrorCode, MachineState, VolumeMounts, calls};
use crate::vmm::HostMount;
use crate::volumes::plan;

/// A create's volumes (checked by [`plan::check_request`]): the holder's identity and each
/// directory checked, the record written and each volume bound onto its stable mount point.
/// Answers the host mounts smolvm is given; on a failure nothing is left bound.
pub(super) fn bind_for_create(
    state: &NodeApiState,
    name: &str,
    volumes: &VolumeMounts,
) -> Result<Vec<HostMount>, ApiError> {
    let prepared = state.volumes.prepare(name, volumes).map_err(ApiFailure::from)?;
    state.volumes.bind(name, &prepared).map_err(|error| {
        undo(state, name);
        ApiError(ApiFailure::from(error))
    })
}

/// Undoes the binds and the record of a create that did not happen.
pub(super) fn undo(state: &NodeApiState, name: &str) {
    if let Err(error) = state.volumes.remove(name) {
        tracing::warn!(machine = %name, code = error.code.as_str(), message = %error.message, "cannot undo the volume binds of a create that failed; a delete of the machine tries again");
    }
}

/// Whether a machine in `state` may have its binds pointed elsewhere: its guest must not be
/// using them.
fn may_rebind(state: MachineState) -> bool {
    matches!(
        state,
        MachineState::Created | MachineState::Stopped | MachineState::Suspended | MachineState::Failed
    )
}

/// `PUT /v1/machines/{name}/volumes`: the machine's stable mount points bound to another holder
/// Pod's volumes (after its holder was evicted and made again), with the same checks as a
/// create's: 403 `HolderNotOwned` or `VolumePathOutsideHolder`, 409 `VolumeNotMounted`. The
/// machine must not run (409 `MachineRunning` naming its state) and must have been made with
/// the same volume names, guest paths and read-only flags (409 `MachineSpecConflict`: smolvm
/// keeps a machine's mounts for its life). Idempotent: the same holder again answers as it is.
pub(super) async fn bind_volumes(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let request = body_of::<calls::BindVolumes>(body)?;
    plan::check_request(&request).map_err(ApiFailure::from)?;
    let _guard = state.lock(&name).await;
    let Some(machine) = state.vmm.get(&name).await? else {
        return Err(not_found(&name));
    };
    let status = state.status_of(&machine);
    if !may_rebind(status.state) {
        return Err(ApiFailure::new(
            ErrorCode::MachineRunning,
            format!(
                "machine '{name}' is {:?}: its volumes are pointed at another holder only while it does not run; stop it first",
                status.state
            ),
        )
        .with_details(serde_json::json!({ "state": status.state }))
        .into());
    }
    let fields = plan::differences(Some(&request), state.volumes.record(&name).as_ref());
    if !fields.is_empty() {
        return Err(ApiFailure::new(
            ErrorCode::MachineSpecConflict,
            format!(
                "machine '{name}' was made with other volumes (names, guest paths, read-only, namespace), or none: smolvm keeps a machine's mounts for its life"
            ),
        )
        .with_details(serde_json::json!({ "fields": fields }))
        .into());
    }
    let prepared = state.volumes.prepare(&name, &request).map_err(ApiFailure::from)?;
    state.volumes.bind(&name, &prepared).map_err(ApiFailure::from)?;
    tracing::info!(machine = %name, holder = %request.holder_uid, "volumes pointed at the holder");
    Ok(answer::<calls::BindVolumes>(StatusCode::OK, &state.status_of(&machine)))
}
