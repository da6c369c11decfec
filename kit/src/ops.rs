//! The plain-HTTP ops server every binary runs: `/healthz` (the process answers), `/readyz`
//! (what the binary needs before it serves, with the missing piece named in a 503), and
//! `/metrics` (OpenMetrics text from prometheus-client).

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The content type of prometheus-client's text encoding.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the ops endpoints ask a binary.
pub trait Probe: Send + Sync + 'static {
    /// `Ok(text)` when ready (200 with the text), `Err(why)` when not (503 naming what is missing).
    fn readiness(&self) -> Result<String, String>;
    /// The metrics, encoded as OpenMetrics text.
    fn metrics(&self) -> String;
}

/// The ops router over `probe`.
pub fn router(probe: Arc<dyn Probe>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(probe)
}

async fn readyz(State(probe): State<Arc<dyn Probe>>) -> Response {
    match probe.readiness() {
        Ok(text) => (StatusCode::OK, format!("{text}\n")).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn metrics(State(probe): State<Arc<dyn Probe>>) -> Response {
    ([(header::CONTENT_TYPE, OPENMETRICS)], probe.metrics()).into_response()
}

/// A prometheus-client registry as OpenMetrics text (empty if encoding fails, which only a
/// broken metric type can make happen).
pub fn encode_metrics(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}

/// Serves `router` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Flag(AtomicBool);

    impl Probe for Flag {
        fn readiness(&self) -> Result<String, String> {
            if self.0.load(Ordering::Relaxed) {
                Ok("ok".into())
            } else {
                Err("not ready: cache not synced".into())
            }
        }
        fn metrics(&self) -> String {
            "# EOF\n".into()
        }
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut text = String::new();
        stream.read_to_string(&mut text).await.expect("read");
        let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, text)
    }

    #[tokio::test]
    async fn health_readiness_and_metrics() {
        let probe = Arc::new(Flag(AtomicBool::new(false)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router(probe.clone()), async {
            let _ = stopped.await;
        }));
        assert_eq!(get(addr, "/healthz").await.0, 200);
        let (code, text) = get(addr, "/readyz").await;
        assert_eq!(code, 503);
        assert!(text.ends_with("not ready: cache not synced\n"), "{text}");
        probe.0.store(true, Ordering::Relaxed);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        let (code, text) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(text.contains("application/openmetrics-text"), "{text}");
        assert_eq!(get(addr, "/nope").await.0, 404);
        let _ = stop.send(());
        assert!(server.await.expect("join").is_ok());
    }
}
