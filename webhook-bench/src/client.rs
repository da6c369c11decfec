//! A small HTTPS client (tokio-rustls + hyper) for the over-the-wire tests and the benchmark
//! load generator. It verifies the server's certificate with the given rustls config: there is
//! no way to skip verification.

use std::{net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{
    Request,
    client::conn::{http1, http2},
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::{ClientConfig, pki_types::ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use smolvm_webhook::{Error, Result};

/// The HTTP version to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.1 (ALPN `http/1.1`).
    Http1,
    /// HTTP/2 (ALPN `h2`).
    Http2,
}

impl Version {
    /// The ALPN protocol id.
    pub fn alpn(self) -> &'static [u8] {
        match self {
            Version::Http1 => b"http/1.1",
            Version::Http2 => b"h2",
        }
    }
}

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

/// One keep-alive TLS connection.
pub struct Connection {
    sender: Sender,
    authority: String,
    /// The ALPN protocol negotiated.
    pub negotiated: Option<Vec<u8>>,
}

fn client_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Client(format!("{what}: {e}"))
}

/// A client config trusting `ca_pem` and offering exactly `version`'s ALPN id.
pub fn tls_config(ca_pem: &str, version: Version) -> Result<Arc<ClientConfig>> {
    Ok(Arc::new(smolvm_certs::client_config(ca_pem, None, &[version.alpn()])?))
}

/// Connects to `addr`, verifying the certificate for `server_name`.
pub async fn connect(
    addr: SocketAddr,
    server_name: &str,
    config: Arc<ClientConfig>,
    version: Version,
) -> Result<Connection> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| client_err("connect", e))?;
    over(tcp, server_name, config, version).await
}

/// Connects from `source` (one of this host's addresses, such as `127.0.0.2`) to `addr`: what the
/// tests and the benchmarks use to stand in for many clients.
pub async fn connect_from(
    source: std::net::IpAddr,
    addr: SocketAddr,
    server_name: &str,
    config: Arc<ClientConfig>,
    version: Version,
) -> Result<Connection> {
    over(tcp_from(source, addr).await?, server_name, config, version).await
}

/// A TCP connection from `source` to `addr`.
pub async fn tcp_from(source: std::net::IpAddr, addr: SocketAddr) -> Result<TcpStream> {
    let socket = match source {
        std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .map_err(|e| client_err("socket", e))?;
    socket
        .bind(SocketAddr::new(source, 0))
        .map_err(|e| client_err("bind", e))?;
    socket.connect(addr).await.map_err(|e| client_err("connect", e))
}

/// TLS, verifying the certificate for `server_name`, then HTTP as `version`, over `tcp`.
pub async fn over(
    tcp: TcpStream,
    server_name: &str,
    config: Arc<ClientConfig>,
    version: Version,
) -> Result<Connection> {
    let addr = tcp.peer_addr().map_err(|e| client_err("connect", e))?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| client_err("server name", e))?;
    let tls = TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| client_err("tls handshake", e))?;
    let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let io = TokioIo::new(tls);
    let sender = match version {
        Version::Http1 => {
            let (sender, conn) = http1::handshake(io)
                .await
                .map_err(|e| client_err("http1 handshake", e))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Sender::H1(sender)
        }
        Version::Http2 => {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| client_err("http2 handshake", e))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Sender::H2(sender)
        }
    };
    Ok(Connection {
        sender,
        authority: format!("{server_name}:{}", addr.port()),
        negotiated,
    })
}

impl Connection {
    /// Another handle on the same HTTP/2 connection (requests on it are concurrent streams);
    /// `None` for HTTP/1.1, which has one request in flight per connection.
    pub fn try_clone(&self) -> Option<Connection> {
        match &self.sender {
            Sender::H1(_) => None,
            Sender::H2(s) => Some(Connection {
                sender: Sender::H2(s.clone()),
                authority: self.authority.clone(),
                negotiated: self.negotiated.clone(),
            }),
        }
    }

    /// Sends a request; returns the status code and the body.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<(u16, Bytes)> {
        let mut builder = Request::builder().method(method);
        builder = match self.sender {
            Sender::H1(_) => builder.uri(path).header("host", self.authority.as_str()),
            Sender::H2(_) => builder.uri(format!("https://{}{path}", self.authority)),
        };
        if let Some(ct) = content_type {
            builder = builder.header("content-type", ct);
        }
        let request = builder.body(Full::new(body)).map_err(|e| client_err("request", e))?;
        let response = match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await.map_err(|e| client_err("connection", e))?;
                s.send_request(request).await
            }
            Sender::H2(s) => {
                s.ready().await.map_err(|e| client_err("connection", e))?;
                s.send_request(request).await
            }
        }
        .map_err(|e| client_err("send", e))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| client_err("body", e))?
            .to_bytes();
        Ok((status, body))
    }

    /// POSTs a JSON body.
    pub async fn post_json(&mut self, path: &str, body: Bytes) -> Result<(u16, Bytes)> {
        self.send("POST", path, Some("application/json"), body).await
    }
}
