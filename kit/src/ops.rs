//! The plain-HTTP ops server every binary runs: `/healthz` (the process answers), `/readyz`
//! (what the binary needs before it serves, with the missing piece named in a 503), and
//! `/metrics` (OpenMetrics text from prometheus-client).
//!
//! The port is plain HTTP and reachable by whoever reaches the pod (the agent's, by whoever
//! reaches the node), so [`serve`] bounds what one client may hold ([`Bounds`]): connections
//! at once in all and per source address (more are closed at once, [`crate::shares`]), the time to send a
//! request's headers (and to start the next request on a kept-alive connection), and a
//! connection's age. Failed accepts (out of descriptors) back off instead of spinning.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

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

/// A metric registered so that its `# HELP` and `# TYPE` lines are written even before it has a
/// sample. prometheus-client leaves a family with no series out of the exposition altogether;
/// wrapped in this, every metric a binary has is declared on `/metrics` from the start (valid
/// OpenMetrics: a family may have no samples), so a scraper's metadata, and the tests that check
/// the monitoring component's queries against `/metrics`, see it before its first event.
#[derive(Debug, Clone, Default)]
pub struct Declared<M>(pub M);

impl<M: prometheus_client::encoding::EncodeMetric> prometheus_client::encoding::EncodeMetric for Declared<M> {
    fn encode(&self, encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        false
    }
}

/// What one client may hold on an ops port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Connections open at once; more are closed at once.
    pub max_connections: usize,
    /// Connections open at once from one address (so that one client cannot take the slots
    /// the kubelet's probes and Prometheus need).
    pub max_per_source: usize,
    /// Time to send a request's headers, and to start the next request on a kept-alive
    /// connection; then the connection is closed.
    pub header_timeout: Duration,
    /// A connection older than this is closed once its request in flight is answered.
    pub max_connection_age: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_per_source: 16,
            header_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(600),
        }
    }
}

/// How long a connection's request in flight may take once it is asked to close.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Serves `router` on `listener` until `shutdown` resolves, within the default [`Bounds`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_bounded(listener, router, shutdown, Bounds::default()).await
}

/// Serves `router` on `listener` (HTTP/1.1) within `bounds` until `shutdown` resolves; then
/// stops accepting and lets each connection finish its request in flight.
pub async fn serve_bounded(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    bounds: Bounds,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let open = crate::shares::Shares::new(bounds.max_connections, bounds.max_per_source);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = crate::accept::AcceptBackoff::default();
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    if !backoff.failing() {
                        tracing::warn!(%error, "ops port: accepting a connection failed; backing off");
                    }
                    tokio::time::sleep(backoff.failed()).await;
                    continue;
                }
            },
        };
        backoff.succeeded();
        while connections.try_join_next().is_some() {}
        let slot = match open.take(peer.ip()) {
            Ok(slot) => slot,
            Err(refused) => {
                tracing::debug!(%peer, ?refused, "ops port: at its connection cap; closed");
                continue;
            }
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut stopping = stopping.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(bounds.header_timeout);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                () = tokio::time::sleep(bounds.max_connection_age) => {}
                _ = stopping.wait_for(|stop| *stop) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(CLOSE_GRACE, connection).await;
        });
    }
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
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

    /// An empty family is declared (`# HELP`, `# TYPE`) only when wrapped in [`Declared`].
    #[test]
    fn declared_families_show_before_their_first_sample() {
        use prometheus_client::metrics::{counter::Counter, family::Family};
        let mut registry = prometheus_client::registry::Registry::with_prefix("x");
        let bare = Family::<Vec<(String, String)>, Counter>::default();
        let declared = Family::<Vec<(String, String)>, Counter>::default();
        registry.register("bare", "Not declared while empty", bare.clone());
        registry.register("declared", "Declared while empty", Declared(declared.clone()));
        let text = encode_metrics(&registry);
        assert!(text.lines().any(|l| l == "# TYPE x_declared counter"), "{text}");
        assert!(!text.contains("x_bare"), "{text}");
        declared.get_or_create(&vec![("k".into(), "v".into())]).inc();
        assert!(encode_metrics(&registry).contains("x_declared_total{k=\"v\"} 1"));
    }

    /// Reads until the server closes the connection (`Ok` with what came, if anything).
    async fn closed(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(30), stream.read_to_end(&mut got)).await;
        assert!(read.is_ok(), "the server closes the connection");
        got
    }

    #[tokio::test]
    async fn silent_and_slow_clients_are_capped_and_timed_out() {
        use tokio::io::AsyncWriteExt;
        let bounds = Bounds {
            max_connections: 3,
            max_per_source: 2,
            header_timeout: Duration::from_millis(300),
            max_connection_age: Duration::from_secs(600),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let probe = Arc::new(Flag(AtomicBool::new(true)));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_bounded(
            listener,
            router(probe),
            async {
                let _ = stopped.await;
            },
            bounds,
        ));
        // Two clients from one address hold its slots: one silent, one trickling its headers.
        let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut slow = tokio::net::TcpStream::connect(addr).await.expect("connect");
        slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            .await
            .expect("write");
        // A third from the same address is closed at once, unanswered.
        let mut third = tokio::net::TcpStream::connect(addr).await.expect("connect");
        assert!(closed(&mut third).await.is_empty(), "no answer beyond the cap");
        // Another address still gets in.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.2:0".parse().expect("addr"))
            .expect("bind 127.0.0.2");
        let mut other = socket.connect(addr).await.expect("connect");
        other
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let answer = String::from_utf8_lossy(&closed(&mut other).await).to_string();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // The silent and the slow one are closed once the header timeout passes.
        closed(&mut silent).await;
        let _ = closed(&mut slow).await;
        // Their slots are free again.
        assert_eq!(get(addr, "/healthz").await.0, 200);
        let _ = stop.send(());
        assert!(server.await.expect("join").is_ok());
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
