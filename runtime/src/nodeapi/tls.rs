//! Serving a router over mTLS (or plain HTTP for the ops port) on a TCP listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use smolvm_certs::{ReloadableResolver, mtls_server_config};
use smolvm_kit::accept::{AcceptBounds, Bounded, OnClosed};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// What one client may hold on the node API's listener before and around its requests (SPEC
/// 6): anyone who reaches the port can open TCP connections, so the connections open at once,
/// the TLS handshakes in progress, both in all and per source address, and a handshake's length
/// are capped ([`AcceptBounds`]: a connection beyond a cap is closed at once), a request's
/// headers must arrive in time, an HTTP/2 connection holds at most a window of unread data and is
/// closed once idle ([`smolvm_kit::serve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeApiBounds {
    /// Connections and handshakes in progress, in all and per source; the time for one
    /// handshake.
    pub accept: AcceptBounds,
    /// Time for a request's headers to arrive (HTTP/1.1).
    pub header_timeout: Duration,
    /// Streams at once on one HTTP/2 connection.
    pub max_h2_streams: u32,
    /// The flow-control window of each HTTP/2 stream and connection: `--http2-buffer-budget`
    /// over `--max-connections` ([`smolvm_kit::http2::window`]).
    pub http2_window: u32,
    /// An HTTP/2 connection with no request in flight this long is closed (GOAWAY).
    pub http2_idle_timeout: Duration,
}

/// The bytes all the node API's HTTP/2 connections may hold unread by default (64 MiB: a
/// 256 KiB window for each of 256 connections).
pub const DEFAULT_HTTP2_BUFFER_BUDGET: usize = 64 << 20;

/// How long a connection told to close (idle, or the agent stopping) may take to finish what
/// it holds before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(10);

impl Default for NodeApiBounds {
    /// 256 connections (128 from one address), 64 handshakes at once (16 from one address) of
    /// 5 s at most, 10 s for headers, 256 streams on an HTTP/2 connection, 256 KiB windows (64
    /// MiB over 256 connections), HTTP/2 connections closed after 2 minutes without a request.
    fn default() -> Self {
        let accept = AcceptBounds {
            max_connections: 256,
            max_connections_per_source: 128,
            max_handshakes: 64,
            max_handshakes_per_source: 16,
            handshake_timeout: Duration::from_secs(5),
        };
        Self {
            accept,
            header_timeout: Duration::from_secs(10),
            max_h2_streams: 256,
            http2_window: (DEFAULT_HTTP2_BUFFER_BUDGET / accept.max_connections) as u32,
            http2_idle_timeout: Duration::from_secs(120),
        }
    }
}

/// A running HTTPS (mTLS) server.
pub struct MtlsServer {
    addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    rustls: RustlsConfig,
    resolver: Arc<ReloadableResolver>,
    client_ca: ClientCaInForce,
    task: JoinHandle<()>,
    watchers: Vec<JoinHandle<()>>,
}

/// The client CA bundle (PEM) the node API trusts at this moment: what new handshakes check the
/// controller's certificate against. Readers see a bundle only once it is in force.
#[derive(Clone, Debug, Default)]
pub struct ClientCaInForce(Arc<RwLock<String>>);

impl ClientCaInForce {
    /// A bundle in force from the start.
    pub fn new(pem: &str) -> Self {
        let this = Self::default();
        this.set(pem);
        this
    }

    /// The bundle in force.
    pub fn pem(&self) -> String {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records `pem` as in force (the server does on every reload of its client CA).
    pub fn set(&self, pem: &str) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = pem.to_string();
    }
}

/// Puts `pem` in force as the client CA: new handshakes check the client's certificate against
/// it, and `in_force` tells it; on an error nothing changes.
fn apply_client_ca(
    rustls: &RustlsConfig,
    resolver: &Arc<ReloadableResolver>,
    in_force: &ClientCaInForce,
    pem: &str,
) -> Result<()> {
    let config = mtls_server_config(resolver.clone(), pem)?;
    rustls.reload_from_config(Arc::new(config));
    in_force.set(pem);
    Ok(())
}

impl MtlsServer {
    /// Serves `router` on `listener` with the resolver's certificate; clients must present a
    /// certificate chaining to `client_ca_pem`. Within the default [`NodeApiBounds`].
    pub fn start(
        listener: std::net::TcpListener,
        router: Router,
        resolver: Arc<ReloadableResolver>,
        client_ca_pem: &str,
    ) -> Result<Self> {
        Self::start_bounded(
            listener,
            router,
            resolver,
            client_ca_pem,
            NodeApiBounds::default(),
            None,
        )
    }

    /// As [`MtlsServer::start`], within `bounds`; each connection a bound closes is counted in
    /// `metrics` (`node_api_connections_closed`).
    pub fn start_bounded(
        listener: std::net::TcpListener,
        router: Router,
        resolver: Arc<ReloadableResolver>,
        client_ca_pem: &str,
        bounds: NodeApiBounds,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<Self> {
        let config = mtls_server_config(resolver.clone(), client_ca_pem)?;
        let rustls = RustlsConfig::from_config(Arc::new(config));
        let serve_error = |e: std::io::Error| Error::Serve {
            what: "node API",
            message: e.to_string(),
        };
        listener.set_nonblocking(true).map_err(serve_error)?;
        let addr = listener.local_addr().map_err(serve_error)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(serve_error)?;
        let mut acceptor = Bounded::new(
            RustlsAcceptor::new(rustls.clone()).handshake_timeout(bounds.accept.handshake_timeout),
            bounds.accept,
        );
        if let Some(metrics) = metrics {
            let count: OnClosed = Arc::new(move |why| metrics.inc_node_api_closed(why.as_str()));
            acceptor = acceptor.on_closed(count);
        }
        let settings = smolvm_kit::serve::Settings {
            header_timeout: bounds.header_timeout,
            max_streams: bounds.max_h2_streams,
            window: bounds.http2_window,
            idle_timeout: bounds.http2_idle_timeout,
            keep_alive_interval: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(10),
            drain_timeout: CLOSE_GRACE,
        };
        let (stop, mut stopping) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(smolvm_kit::serve::serve(
            listener,
            acceptor,
            router,
            settings,
            async move {
                let _ = stopping.wait_for(|s| *s).await;
            },
            "node API",
        ));
        let client_ca = ClientCaInForce::new(client_ca_pem);
        Ok(Self {
            addr,
            stop,
            rustls,
            resolver,
            client_ca,
            task,
            watchers: Vec::new(),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The serving certificate resolver (swap to renew without restart).
    pub fn resolver(&self) -> &Arc<ReloadableResolver> {
        &self.resolver
    }

    /// The client CA bundle in force (follows every reload).
    pub fn client_ca(&self) -> &ClientCaInForce {
        &self.client_ca
    }

    /// Replaces the trusted client CA for new connections.
    pub fn reload_client_ca(&self, client_ca_pem: &str) -> Result<()> {
        apply_client_ca(&self.rustls, &self.resolver, &self.client_ca, client_ca_pem)
    }

    /// Re-reads the client CA file whenever it changes.
    pub fn watch_client_ca(&mut self, path: PathBuf, interval: Duration) {
        let rustls = self.rustls.clone();
        let resolver = self.resolver.clone();
        let in_force = self.client_ca.clone();
        let shown = path.display().to_string();
        self.watchers
            .push(smolvm_kit::watch::spawn(vec![path], interval, move |contents| {
                let pem = String::from_utf8_lossy(&contents[0]).into_owned();
                match apply_client_ca(&rustls, &resolver, &in_force, &pem) {
                    Ok(()) => tracing::info!(path = %shown, "client CA reloaded"),
                    Err(error) => {
                        tracing::warn!(path = %shown, %error, "client CA file is invalid; keeping the previous one")
                    }
                }
            }));
    }

    /// Re-reads a serving certificate and key from files whenever they change.
    pub fn watch_serving_files(&mut self, cert: PathBuf, key: PathBuf, interval: Duration) {
        let resolver = self.resolver.clone();
        self.watchers
            .push(smolvm_kit::watch::spawn(vec![cert, key], interval, move |contents| {
                let cert = String::from_utf8_lossy(&contents[0]).into_owned();
                let key = String::from_utf8_lossy(&contents[1]).into_owned();
                match resolver.swap_pem(&cert, &key) {
                    Ok(()) => tracing::info!("serving certificate reloaded from files"),
                    Err(error) => {
                        tracing::warn!(%error, "serving certificate files invalid; keeping the previous pair")
                    }
                }
            }));
    }

    /// Stops accepting and closes connections: each is asked to finish what it holds (HTTP/2
    /// with a GOAWAY) and those still open after `grace` are dropped.
    pub async fn shutdown(mut self, grace: Duration) {
        for watcher in &self.watchers {
            watcher.abort();
        }
        let _ = self.stop.send(true);
        if tokio::time::timeout(grace, &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

/// A running plain-HTTP server (ops port), bounded as every binary's ops port is
/// ([`smolvm_kit::ops::serve`]: connection caps, header timeout).
pub struct PlainServer {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl PlainServer {
    /// Serves `router` on `listener` (the ops port, within the default bounds).
    pub fn start(listener: std::net::TcpListener, router: Router) -> Result<Self> {
        Self::start_bounded(listener, router, smolvm_kit::ops::Bounds::default(), "ops port")
    }

    /// Serves `router` on `listener` within `bounds`; `what` names the listener in errors.
    pub fn start_bounded(
        listener: std::net::TcpListener,
        router: Router,
        bounds: smolvm_kit::ops::Bounds,
        what: &'static str,
    ) -> Result<Self> {
        let err = |e: std::io::Error| Error::Serve {
            what,
            message: e.to_string(),
        };
        listener.set_nonblocking(true).map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(err)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(smolvm_kit::ops::serve_bounded(
            listener,
            router,
            async {
                let _ = stopped.await;
            },
            bounds,
        ));
        Ok(Self { addr, stop, task })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(grace + Duration::from_secs(1), self.task).await;
    }
}
