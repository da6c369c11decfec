//! What the agent's ops port (the shared [`smolvm_kit::ops`] server) reports: ready once a
//! serving certificate is loaded and smolvm answers; metrics from [`Metrics`].

use std::sync::Arc;

use axum::Router;
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

impl smolvm_kit::ops::Probe for OpsState {
    fn readiness(&self) -> Result<String, String> {
        let runtime = self.runtime.borrow().clone();
        readiness(self.metrics.serving_cert_loaded(), &runtime).map(|()| "ok".to_string())
    }

    fn metrics(&self) -> String {
        self.metrics.encode()
    }
}

/// The ops router.
pub fn router(state: OpsState) -> Router {
    smolvm_kit::ops::router(Arc::new(state))
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
