//! Serving a router over mTLS (or plain HTTP for the ops port) on a TCP listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum_server::Handle;
use axum_server::tls_rustls::RustlsConfig;
use smolvm_certs::{ReloadableResolver, mtls_server_config};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};

/// A running HTTPS (mTLS) server.
pub struct MtlsServer {
    addr: SocketAddr,
    handle: Handle<SocketAddr>,
    rustls: RustlsConfig,
    resolver: Arc<ReloadableResolver>,
    task: JoinHandle<std::io::Result<()>>,
    watchers: Vec<JoinHandle<()>>,
}

impl MtlsServer {
    /// Serves `router` on `listener` with the resolver's certificate; clients must present a
    /// certificate chaining to `client_ca_pem`.
    pub fn start(
        listener: std::net::TcpListener,
        router: Router,
        resolver: Arc<ReloadableResolver>,
        client_ca_pem: &str,
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
        let server = axum_server::from_tcp_rustls(listener, rustls.clone())
            .map_err(|e| Error::Serve {
                what: "node API",
                message: e.to_string(),
            })?
            .handle(handle.clone());
        let task = tokio::spawn(server.serve(router.into_make_service()));
        Ok(Self {
            addr,
            handle,
            rustls,
            resolver,
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

    /// Replaces the trusted client CA for new connections.
    pub fn reload_client_ca(&self, client_ca_pem: &str) -> Result<()> {
        let config = mtls_server_config(self.resolver.clone(), client_ca_pem)?;
        self.rustls.reload_from_config(Arc::new(config));
        Ok(())
    }

    /// Re-reads the client CA file whenever it changes.
    pub fn watch_client_ca(&mut self, path: PathBuf, interval: Duration) {
        let rustls = self.rustls.clone();
        let resolver = self.resolver.clone();
        let shown = path.display().to_string();
        self.watchers
            .push(crate::watch::spawn_watch(vec![path], interval, move |contents| {
                let pem = String::from_utf8_lossy(&contents[0]).into_owned();
                match mtls_server_config(resolver.clone(), &pem) {
                    Ok(config) => {
                        rustls.reload_from_config(Arc::new(config));
                        tracing::info!(path = %shown, "client CA reloaded");
                    }
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
            .push(crate::watch::spawn_watch(vec![cert, key], interval, move |contents| {
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

/// A running plain-HTTP server (ops port).
pub struct PlainServer {
    addr: SocketAddr,
    handle: Handle<SocketAddr>,
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
        let handle = Handle::new();
        let server = axum_server::from_tcp(listener).map_err(err)?.handle(handle.clone());
        let task = tokio::spawn(server.serve(router.into_make_service()));
        Ok(Self { addr, handle, task })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server.
    pub async fn shutdown(self, grace: Duration) {
        self.handle.graceful_shutdown(Some(grace));
        let _ = tokio::time::timeout(grace + Duration::from_secs(1), self.task).await;
    }
}
