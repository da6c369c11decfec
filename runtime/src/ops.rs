//! The ops port (plain HTTP): `/healthz`, `/readyz`, `/metrics`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::supervisor::RuntimeStatus;

/// What the ops handlers read.
#[derive(Clone)]
pub struct OpsState {
    /// Metrics (also says whether a serving certificate is loaded).
    pub metrics: Arc<Metrics>,
    /// The supervisor's status.
    pub runtime: watch::Receiver<RuntimeStatus>,
}

/// Whether the agent is ready, and why not.
pub fn readiness(cert_loaded: bool, runtime: &RuntimeStatus) -> Result<(), String> {
    match (cert_loaded, runtime.ready) {
        (true, true) => Ok(()),
        (false, _) => Err("no serving certificate loaded".into()),
        (true, false) => Err(format!("smolvm not ready: {}", runtime.message)),
    }
}

/// The ops router.
pub fn router(state: OpsState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(state): State<OpsState>) -> impl IntoResponse {
    let runtime = state.runtime.borrow().clone();
    match readiness(state.metrics.serving_cert_loaded(), &runtime) {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn metrics(State(state): State<OpsState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_cert_and_runtime() {
        let up = RuntimeStatus {
            ready: true,
            ..RuntimeStatus::default()
        };
        let down = RuntimeStatus {
            message: "exited".into(),
            ..RuntimeStatus::default()
        };
        assert!(readiness(true, &up).is_ok());
        assert_eq!(readiness(false, &up), Err("no serving certificate loaded".into()));
        assert_eq!(readiness(true, &down), Err("smolvm not ready: exited".into()));
    }
}
