//! Serving a router over mTLS (or plain HTTP for the ops port) on a TCP listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum_server::Handle;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use hyper_util::rt::TokioTimer;
use smolvm_certs::{ReloadableResolver, mtls_server_config};
use smolvm_kit::accept::{AcceptBounds, Bounded, OnClosed};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// What one client may hold on the node API's listener before and around its requests (SPEC
/// 6): anyone who reaches the port can open TCP connections, so the connections open at once,
/// the TLS handshakes in progress and a handshake's length are capped ([`AcceptBounds`]: a
/// connection beyond a cap is closed at once), and a request's headers must arrive in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeApiBounds {
    /// Connections, handshakes in progress, the time for one handshake.
    pub accept: AcceptBounds,
    /// Time for a request's headers to arrive (HTTP/1.1).
    pub header_timeout: Duration,
    /// Streams at once on one HTTP/2 connection.
    pub max_h2_streams: u32,
}

impl Default for NodeApiBounds {
    /// 256 connections, 64 handshakes at once of 5 s at most, 10 s for headers, 256 streams
    /// on an HTTP/2 connection.
    fn default() -> Self {
        Self {
            accept: AcceptBounds {
                max_connections: 256,
                max_handshakes: 64,
                handshake_timeout: Duration::from_secs(5),
            },
            header_timeout: Duration::from_secs(10),
            max_h2_streams: 256,
        }
    }
}

/// A running HTTPS (mTLS) server.
pub struct MtlsServer {
    addr: SocketAddr,
    handle: Handle<SocketAddr>,
    rustls: RustlsConfig,
    resolver: Arc<ReloadableResolver>,
    client_ca: ClientCaInForce,
    task: JoinHandle<std::io::Result<()>>,
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
        listener.set_nonblocking(true).map_err(|e| Error::Serve {
            what: "node API",
            message: e.to_string(),
        })?;
        let addr = listener.local_addr().map_err(|e| Error::Serve {
            what: "node API",
            message: e.to_string(),
        })?;
        let handle = Handle::new();
        let mut acceptor = Bounded::new(
            RustlsAcceptor::new(rustls.clone()).handshake_timeout(bounds.accept.handshake_timeout),
            bounds.accept,
        );
        if let Some(metrics) = metrics {
            let count: OnClosed = Arc::new(move |why| metrics.inc_node_api_closed(why.as_str()));
            acceptor = acceptor.on_closed(count);
        }
        let mut server = axum_server::from_tcp(listener)
            .map_err(|e| Error::Serve {
                what: "node API",
                message: e.to_string(),
            })?
            .acceptor(acceptor)
            .handle(handle.clone());
        let builder = server.http_builder();
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(bounds.header_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(bounds.max_h2_streams)
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10));
        let task = tokio::spawn(server.serve(router.into_make_service()));
        let client_ca = ClientCaInForce::new(client_ca_pem);
        Ok(Self {
            addr,
            handle,
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

    /// Stops accepting and closes connections (graceful up to `grace`).
    pub async fn shutdown(self, grace: Duration) {
        for watcher in &self.watchers {
            watcher.abort();
        }
        self.handle.graceful_shutdown(Some(grace));
        let _ = tokio::time::timeout(grace + Duration::from_secs(1), self.task).await;
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
    /// Serves `router` on `listener`.
    pub fn start(listener: std::net::TcpListener, router: Router) -> Result<Self> {
        let err = |e: std::io::Error| Error::Serve {
            what: "ops port",
            message: e.to_string(),
        };
        listener.set_nonblocking(true).map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(err)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(smolvm_kit::ops::serve(listener, router, async {
            let _ = stopped.await;
        }));
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
