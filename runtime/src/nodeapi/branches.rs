//! `POST /v1/machines/{name}/branch` (SPEC 2.6): the machine `{name}` made a copy-on-write
//! branch of a running branchable machine on this node, through smolvm's branches route.
//!
//! Idempotent by `{name}`: a machine of that name branched from the same source answers as it
//! is, any other machine of that name is 409 `Conflict`. The source is checked before smolvm is
//! asked, so each refusal has its stable code: 404 `SourceNotFound`, 409 `SourceNotRunning`
//! (naming its state) and 409 `SourceNotBranchable`. The branch's own ports are checked as a
//! create's are: excluded ones refused (403 `HostPortExcluded`), taken ones 409 `HostPortInUse`.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;

use super::answer::{ApiResult, MachineName, answer, body_of};
use super::failure::{self, ApiFailure};
use super::mapping;
use super::request_checks;
use super::state::NodeApiState;
use super::types::{ErrorCode, MachineState, calls, validate_machine_name};
use crate::vmm::{BranchRequest, Machine, VmmError};

pub(super) async fn branch_machine(
    State(state): State<NodeApiState>,
    MachineName(name): MachineName,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let request = body_of::<calls::BranchMachine>(body)?;
    let source = request.source.as_str();
    validate_machine_name(source).map_err(|reason| {
        ApiFailure::new(ErrorCode::InvalidRequest, format!("source: {reason}"))
            .with_details(serde_json::json!({ "source": source }))
    })?;
    if source == name {
        return Err(ApiFailure::new(
            ErrorCode::InvalidRequest,
            format!("machine '{name}' cannot be a branch of itself"),
        )
        .into());
    }
    let _guard = state.lock(&name).await;
    if let Some(existing) = state.vmm.get(&name).await? {
        return existing_branch(&state, &name, source, &existing);
    }
    let Some(golden) = state.vmm.get(source).await? else {
        return Err(failure::source_not_found(source).into());
    };
    let golden_status = state.status_of(&golden);
    if golden_status.state != MachineState::Running {
        return Err(failure::source_not_running(source, &golden_status).into());
    }
    if !golden.branchable() {
        return Err(failure::source_not_branchable(source, None).into());
    }
    if let Some(guard) = &state.host_ports {
        request_checks::check_excluded_ports(&request.ports, &guard.excluded())?;
    }
    let ports: Vec<_> = request.ports.iter().map(mapping::to_vmm_port).collect();
    state.check_ports(&name, &ports)?;
    let env = mapping::to_vmm_env(&request.env);
    let asked = BranchRequest {
        name: &name,
        env: &env,
        ports: &ports,
    };
    let branched = state.vmm.branch(source, &asked).await;
    state.poke_forwarder();
    match branched {
        Ok(machine) => {
            tracing::info!(machine = %name, %source, "branched");
            Ok(answer::<calls::BranchMachine>(
                StatusCode::OK,
                &state.status_of(&machine),
            ))
        }
        // The source went between our look and smolvm's.
        Err(VmmError::NotFound { .. }) => Err(failure::source_not_found(source).into()),
        // smolvm's 409 is "not branchable, or the child's name exists": which one, it tells
        // only in words, so the name is looked at again.
        Err(conflict @ VmmError::Conflict { .. }) => match state.vmm.get(&name).await? {
            Some(existing) => existing_branch(&state, &name, source, &existing),
            None => {
                // A host port taken meanwhile keeps its own code; any other is the source's.
                let mapped = failure::map_vmm_error(&conflict);
                if mapped.body.code == ErrorCode::Conflict {
                    Err(failure::source_not_branchable(source, Some(conflict.message())).into())
                } else {
                    Err(mapped.into())
                }
            }
        },
        Err(error) => Err(error.into()),
    }
}

/// A machine named `name` exists already: the answer of a repeat when it is a branch of
/// `source`, else a conflict naming what it is.
fn existing_branch(state: &NodeApiState, name: &str, source: &str, existing: &Machine) -> ApiResult {
    match existing.parent() {
        Some(parent) if parent == source => Ok(answer::<calls::BranchMachine>(
            StatusCode::OK,
            &state.status_of(existing),
        )),
        parent => {
            let what = parent.map_or_else(|| "was not branched".to_string(), |p| format!("is a branch of '{p}'"));
            Err(ApiFailure::new(
                ErrorCode::Conflict,
                format!("machine '{name}' exists and {what}, not a branch of '{source}'"),
            )
            .with_details(serde_json::json!({ "source": source, "parent": parent }))
            .into())
        }
    }
}
