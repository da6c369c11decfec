//! The connections to the agents: where each node's API listens ([`Endpoints`]), and the
//! connector ([`NodeConnector`]) that dials `https://<node>` at that endpoint and verifies that
//! the server's certificate names that node's runtime.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Arc, RwLock},
    task::{Context, Poll},
    time::Duration,
};

use hyper::Uri;
use hyper_util::{
    client::legacy::connect::{Connected, Connection},
    rt::TokioIo,
};
use rustls::{ClientConfig, pki_types::ServerName};
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};

use super::tls::ClientTls;

/// Where each node's API listens: node name -> (address, port).
#[derive(Debug, Clone, Default)]
pub struct Endpoints(Arc<RwLock<HashMap<String, (String, u16)>>>);

impl Endpoints {
    /// Records (or replaces) a node's endpoint.
    pub fn set(&self, node: &str, address: &str, port: u16) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.insert(node.to_string(), (address.to_string(), port));
    }

    /// Forgets a node.
    pub fn remove(&self, node: &str) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).remove(node);
    }

    fn get(&self, node: &str) -> Option<(String, u16)> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).get(node).cloned()
    }
}

/// A TLS stream to a node, as the pooled client sees it.
pub struct NodeStream(TokioIo<TlsStream<TcpStream>>);

impl Connection for NodeStream {
    fn connected(&self) -> Connected {
        let (_, session) = self.0.inner().get_ref();
        if session.alpn_protocol() == Some(b"h2") {
            Connected::new().negotiated_h2()
        } else {
            Connected::new()
        }
    }
}

impl hyper::rt::Read for NodeStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for NodeStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Connects `https://<node>` to the node's advertised endpoint, verifying the node's identity.
#[derive(Clone)]
pub struct NodeConnector {
    pub(super) endpoints: Endpoints,
    pub(super) tls: Arc<ClientTls>,
    pub(super) connect_timeout: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Uri> for NodeConnector {
    type Response = NodeStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<NodeStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let node = uri.host().ok_or("request has no node name")?;
            this.dial(node, this.tls.current()).await
        })
    }
}

impl NodeConnector {
    /// A TLS connection to `node`'s advertised endpoint with `config`, the node's identity
    /// verified (each step within the connect timeout).
    pub(super) async fn dial(&self, node: &str, config: Arc<ClientConfig>) -> Result<NodeStream, BoxError> {
        let (address, port) = self
            .endpoints
            .get(node)
            .ok_or_else(|| format!("node {node} advertises no endpoint"))?;
        let server_name = ServerName::try_from(smolvm_certs::runtime_server_name(node))
            .map_err(|e| format!("node name {node:?} makes no valid TLS server name: {e}"))?;
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect((address.as_str(), port)))
            .await
            .map_err(|_| format!("connect to {address}:{port} timed out"))??;
        tcp.set_nodelay(true)?;
        let tls = tokio::time::timeout(
            self.connect_timeout,
            TlsConnector::from(config).connect(server_name, tcp),
        )
        .await
        .map_err(|_| format!("TLS handshake with {address}:{port} timed out"))??;
        Ok(NodeStream(TokioIo::new(tls)))
    }
}
