//! SuspendMachine and ResumeMachine: smolvm's pause and resume, with the agent's record of the
//! machines it suspended ([`crate::suspensions`]). Both are idempotent: a suspended machine
//! answers a suspend as it is, a running one a resume.
//!
//! The record is written before smolvm is asked to pause and dropped once a resume succeeded,
//! so a crash between the two never loses a saved state. A pause that failed for certain (smolvm
//! refused it) drops the record again; one whose outcome is unknown (a time-out, smolvm gone)
//! keeps it: a machine that then reads stopped is suspended, and a resume that finds nothing
//! saved answers `NoSavedState` and drops it.
//!
//! A suspended machine's published ports are closed (smolvm reports it stopped), except those of
//! a machine suspended for idleness that traffic wakes: the forwarder keeps listening for it and
//! holds what arrives ([`crate::forward`]). It is told at once after each call.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{State, rejection::BytesRejection};
use axum::http::StatusCode;

use super::answer::{ApiResult, MachineName, answer, not_found};
use super::failure::{self, ApiFailure};
use super::mapping;
use super::state::NodeApiState;
use super::types::{ErrorCode, MachineState, SuspendRequest, calls};
use crate::suspensions::Suspension;
use crate::vmm::VmmError;

/// Whether a failed pause certainly left the machine as it was (smolvm refused it), so the
/// record written before it can go.
fn refused(error: &VmmError) -> bool {
    matches!(
        error,
        VmmError::NotFound { .. }
            | VmmError::NotRunning { .. }
            | VmmError::NotPaused { .. }
            | VmmError::Conflict { .. }
            | VmmError::BadRequest { .. }
    )
}

/// `POST /v1/machines/{name}/suspend`, optionally with a [`SuspendRequest`] (an idle
/// suspension, which traffic may wake): a running machine is paused (smolvm saves its memory and
/// disks durably, then stops it) and answers `Suspended`; a suspended one answers as it is.
/// 404 `MachineNotFound`; 409 `MachineNotRunning` naming the state of any other machine.
pub(super) async fn suspend_machine(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let request: SuspendRequest = match &body {
        Ok(bytes) if bytes.is_empty() => SuspendRequest::default(),
        _ => super::answer::body_of::<calls::SuspendMachine>(body)?,
    };
    let _guard = state.lock(&name).await;
    let Some(machine) = state.vmm.get(&name).await? else {
        return Err(not_found(&name));
    };
    let status = state.status_of(&machine);
    match status.state {
        MachineState::Suspended => return Ok(answer::<calls::SuspendMachine>(StatusCode::OK, &status)),
        MachineState::Running => {}
        _ => return Err(failure::cannot_suspend(&name, &status).into()),
    }
    // The intent first: from here a crash never loses track of a saved state.
    state
        .suspensions
        .write(&name, &Suspension::asked(&request))
        .map_err(|error| {
            ApiFailure::new(
                ErrorCode::RuntimeError,
                format!("cannot record the suspension of machine '{name}' on this node: {error}"),
            )
        })?;
    let started = Instant::now();
    let paused = state.vmm.pause(&name).await;
    state.poke_forwarder();
    match paused {
        Ok(machine) => {
            state.metrics.observe_suspend(started.elapsed());
            tracing::info!(machine = %name, elapsed_ms = started.elapsed().as_millis() as u64, "suspended");
            Ok(answer::<calls::SuspendMachine>(
                StatusCode::OK,
                &state.status_of(&machine),
            ))
        }
        Err(error) if refused(&error) => {
            state.suspensions.remove(&name);
            match (&error, state.vmm.get(&name).await) {
                // It stopped between the look and the pause.
                (VmmError::NotRunning { .. }, Ok(Some(now))) => {
                    Err(failure::cannot_suspend(&name, &state.status_of(&now)).into())
                }
                _ => Err(error.into()),
            }
        }
        Err(error) => {
            tracing::warn!(machine = %name, code = error.code(), %error, "the pause's outcome is unknown; the machine counts as suspended once it reads stopped");
            Err(error.into())
        }
    }
}

/// `POST /v1/machines/{name}/resume`: a suspended machine is resumed with its processes as they
/// were and answers `Running`; a running one answers as it is. 404 `MachineNotFound`; 409
/// `NoSavedState` naming the state of any other machine, and of a suspended one whose saved
/// state smolvm no longer has (its record is dropped); 409 `HostPortInUse` when a published
/// port was taken meanwhile.
pub(super) async fn resume_machine(State(state): State<NodeApiState>, MachineName(name): MachineName) -> ApiResult {
    let _guard = state.lock(&name).await;
    let Some(machine) = state.vmm.get(&name).await? else {
        return Err(not_found(&name));
    };
    let status = state.status_of(&machine);
    match status.state {
        MachineState::Running => {
            // A record beside a running machine is stale (a resume whose record was kept).
            state.suspensions.remove(&name);
            return Ok(answer::<calls::ResumeMachine>(
                StatusCode::OK,
                &mapping::to_status(&machine),
            ));
        }
        MachineState::Suspended => {}
        _ => return Err(failure::no_saved_state(&name, &status).into()),
    }
    state.check_ports(&name, &machine.ports)?;
    // Never over an empty directory: each volume is a bind of its holder's, or no resume.
    state.volumes.ensure_bound(&name).map_err(ApiFailure::from)?;
    let started = Instant::now();
    let resumed = state.vmm.resume(&name).await;
    state.poke_forwarder();
    match resumed {
        Ok(machine) => {
            state.suspensions.remove(&name);
            state.metrics.observe_resume(started.elapsed());
            tracing::info!(machine = %name, elapsed_ms = started.elapsed().as_millis() as u64, "resumed");
            Ok(answer::<calls::ResumeMachine>(
                StatusCode::OK,
                &state.status_of(&machine),
            ))
        }
        Err(VmmError::NotPaused { .. }) => {
            // smolvm has nothing saved (the pause never happened): the record goes.
            state.suspensions.remove(&name);
            tracing::warn!(machine = %name, "resume: smolvm holds no saved state for this suspended machine; it is stopped");
            let now = match state.vmm.get(&name).await {
                Ok(Some(now)) => mapping::to_status(&now),
                _ => mapping::to_status(&machine),
            };
            Err(failure::no_saved_state(&name, &now).into())
        }
        Err(error) => Err(error.into()),
    }
}
