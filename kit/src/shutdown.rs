//! The signal that stops a binary: SIGTERM (the kubelet stopping the pod) or Ctrl-C.

/// Resolves on SIGTERM or Ctrl-C, and logs which.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: shutting down"),
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot watch SIGTERM; only Ctrl-C stops this process gracefully");
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("interrupted: shutting down");
        }
    }
}
