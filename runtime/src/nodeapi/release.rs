//! The release hook: what a holder Pod's preStop hook calls before the kubelet unmounts its
//! volumes, so that no volume is unmounted under a running guest (SPEC 2.5).
//!
//! Plain HTTP on `127.0.0.1:<--release-port>` (the kubelet runs on the host network, as the
//! agent does, and calls a preStop `httpGet` there): `GET /v1/holders/release` with the header
//! `x-smolvm-release-token`. Every machine whose volume record holds that token's digest
//! (compared in constant time) is stopped, gracefully as a StopMachine (all but a suspended
//! one: its process is stopped already and its saved state is kept), and its binds undone;
//! its record then says released, and no start is allowed until a BindVolumes points it at
//! another holder. 200 with what was done; 404 `MachineNotFound` when no machine is held by the
//! token; 401 `Unauthenticated` without a token. The kubelet does not read the answer (a hook
//! that answers at all has run): the answer is for logs and tests.
//!
//! The listener is bounded as every plain listener of the binaries ([`smolvm_kit::ops`]):
//! connections in all, the time to send a request's head, a connection's age. Its only client
//! is the kubelet on the loopback, so one source may hold all of them.

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

use super::failure::{self, ApiFailure};
use super::server::{ApiError, NodeApiState, method_not_allowed, route_not_found};
use super::types::{ErrorCode, MachineState};
use smolvm_api::constants::volumes::{RELEASE_PATH, RELEASE_TOKEN_HEADER};

/// What one client may hold on the release hook's listener: 64 connections (all may come from
/// the loopback: the kubelet runs every holder's preStop there at once during a drain), 10 s for
/// a request's head, and an hour for a connection (a release waits for the machines' graceful
/// stops).
pub const BOUNDS: smolvm_kit::ops::Bounds = smolvm_kit::ops::Bounds {
    max_connections: 64,
    max_per_source: 64,
    header_timeout: Duration::from_secs(10),
    max_connection_age: Duration::from_secs(3600),
};

/// The answer of a release that stopped what it held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseAnswer {
    /// Each machine the token held.
    pub released: Vec<ReleasedMachine>,
}

/// One machine a release stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleasedMachine {
    /// The machine.
    pub machine: String,
    /// The holder Pod it was bound to.
    pub holder_uid: String,
    /// Whether smolvm was asked to stop it and did (every machine but a suspended one).
    pub stopped: bool,
    /// Its state afterwards (`Stopped`, `Created`, `Suspended`, or `Missing` when smolvm no
    /// longer has it).
    pub state: String,
    /// The volumes whose binds were undone.
    pub unmounted: Vec<String>,
}

/// The release hook's router over the node API's state (its machines, locks and volumes).
pub fn router(state: NodeApiState) -> Router {
    Router::new()
        .route(RELEASE_PATH, get(release))
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// Whether a machine in `state` is stopped before its volumes go: every one whose guest may be
/// using them, or start using them (a stop of a stopped machine is one), but a suspended one,
/// whose process is stopped already and whose saved state a stop would throw away.
fn must_stop(state: MachineState) -> bool {
    state != MachineState::Suspended
}

async fn release(State(state): State<NodeApiState>, headers: HeaderMap) -> Response {
    let started = Instant::now();
    let token = headers
        .get(RELEASE_TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        state.metrics.inc_volume_release("Unauthenticated");
        return ApiError(ApiFailure::new(
            ErrorCode::Unauthenticated,
            format!("the release hook needs the holder's token in {RELEASE_TOKEN_HEADER}"),
        ))
        .into_response();
    };
    let machines = state.volumes.held_by(token);
    if machines.is_empty() {
        state.metrics.inc_volume_release("NoMatch");
        return ApiError(ApiFailure::new(
            ErrorCode::MachineNotFound,
            "no machine on this node is held by this token",
        ))
        .into_response();
    }
    let mut released = Vec::new();
    let mut failed = Vec::new();
    for machine in machines {
        match release_one(&state, &machine).await {
            Ok(done) => released.push(done),
            Err(error) => {
                tracing::error!(%machine, code = error.body.code.as_str(), message = %error.body.message, "release hook: the machine was not released; its volumes stay bound");
                failed.push((machine, error));
            }
        }
    }
    state.metrics.observe_volume_release(started.elapsed());
    let Some((_, first)) = failed.first() else {
        state.metrics.inc_volume_release("Released");
        return (StatusCode::OK, axum::Json(ReleaseAnswer { released })).into_response();
    };
    state.metrics.inc_volume_release("Failed");
    let failures: Vec<serde_json::Value> = failed
        .iter()
        .map(|(machine, e)| serde_json::json!({"machine": machine, "code": e.body.code.as_str(), "message": e.body.message}))
        .collect();
    ApiError(
        ApiFailure::new(
            first.body.code.clone(),
            format!("{} of the machines held by this token were not released", failed.len()),
        )
        .with_details(serde_json::json!({ "released": released, "failed": failures })),
    )
    .into_response()
}

/// Stops `name` (unless it is suspended), then undoes its binds (the record says released
/// first).
async fn release_one(state: &NodeApiState, name: &str) -> Result<ReleasedMachine, ApiFailure> {
    let _guard = state.lock(name).await;
    let holder_uid = state.volumes.record(name).map(|r| r.holder_uid).unwrap_or_default();
    let machine = state.vmm.get(name).await.map_err(|e| failure::map_vmm_error(&e))?;
    let mut stopped = false;
    let mut now = machine.as_ref().map(|m| state.status_of(m).state);
    if let Some(current) = now
        && must_stop(current)
    {
        let outcome = state.vmm.stop(name).await;
        state.poke_forwarder();
        let machine = outcome.map_err(|e| failure::map_vmm_error(&e))?;
        // As StopMachine: a suspension record beside a machine that was not suspended is stale.
        state.suspensions.remove(name);
        state.metrics.inc_volume_release_stop();
        tracing::info!(machine = %name, holder = %holder_uid, was = ?current, "release hook: stopped the machine before its holder's volumes go");
        stopped = true;
        now = Some(state.status_of(&machine).state);
    }
    let unmounted = state.volumes.release(name).map_err(ApiFailure::from)?;
    tracing::info!(machine = %name, holder = %holder_uid, unmounted = ?unmounted, "release hook: volumes released");
    Ok(ReleasedMachine {
        machine: name.to_string(),
        holder_uid,
        stopped,
        state: now.map_or_else(|| "Missing".to_string(), |s| format!("{s:?}")),
        unmounted,
    })
}
