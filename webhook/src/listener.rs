//! The admission listener: TLS connections within their bounds, then HTTP/2 ([`crate::http2`])
//! or HTTP/1.1 (hyper) as ALPN chose, and their drain on shutdown.

use std::{sync::Arc, time::Duration};

use smolvm_certs::ReloadableResolver;

use crate::{
    error::{Error, Result},
    server::{Admission, HEADER_READ_TIMEOUT},
};

/// How long a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections the webhook holds at once (the API servers keep a few, multiplexed over HTTP/2);
/// more are closed at once, before a byte of TLS is read.
pub const MAX_CONNECTIONS: usize = 1024;
/// TLS handshakes in progress at once; more are closed at once.
pub const MAX_HANDSHAKES: usize = 64;
/// How often an HTTP/2 client is sent a PING.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long an HTTP/2 client may take to answer a PING before its connection is closed.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections are given, once shutdown begins, to answer the requests they hold; then
/// they are closed.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves `service` over TLS (HTTP/2 and HTTP/1.1 by ALPN) on `listener`, with the certificate
/// from `resolver` (swapped in place on rotation), until `shutdown` resolves: then the listener
/// closes, each connection answers what it holds (HTTP/2 with a GOAWAY, HTTP/1.1 closing after
/// its request), and those still open after [`DRAIN_TIMEOUT`] are closed.
///
/// Connections are bounded before they are read (`smolvm_kit::accept`): [`MAX_CONNECTIONS`]
/// open, [`MAX_HANDSHAKES`] handshaking, each handshake within [`HANDSHAKE_TIMEOUT`]; the
/// connections closed for it are counted in `metrics`. Then an HTTP/2 connection is served on
/// the `h2` crate ([`crate::http2`]) with at most `max_streams` streams open, pinged every
/// [`KEEP_ALIVE_INTERVAL`] and closed when a PING goes unanswered for [`KEEP_ALIVE_TIMEOUT`]; an
/// HTTP/1.1 connection by hyper, each request's head within [`HEADER_READ_TIMEOUT`].
pub async fn serve_tls(
    listener: std::net::TcpListener,
    service: Admission,
    resolver: Arc<ReloadableResolver>,
    shutdown: impl std::future::Future<Output = ()>,
    max_streams: u32,
    metrics: Arc<crate::metrics::Metrics>,
) -> Result<()> {
    let serve_error = |source| Error::Serve {
        what: "webhook",
        source,
    };
    listener.set_nonblocking(true).map_err(serve_error)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(serve_error)?;
    let config = smolvm_certs::server_config(resolver)?;
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config));
    let acceptor = smolvm_kit::accept::Bounded::new(
        axum_server::tls_rustls::RustlsAcceptor::new(tls).handshake_timeout(HANDSHAKE_TIMEOUT),
        smolvm_kit::accept::AcceptBounds {
            max_connections: MAX_CONNECTIONS,
            max_handshakes: MAX_HANDSHAKES,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        },
    )
    .on_closed(Arc::new(move |why| metrics.observe_connection_closed(why.as_str())));
    let http2 = crate::http2::Settings {
        max_streams,
        keep_alive_interval: KEEP_ALIVE_INTERVAL,
        keep_alive_timeout: KEEP_ALIVE_TIMEOUT,
    };
    let (drain, draining) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut backoff = smolvm_kit::accept::AcceptBackoff::default();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    backoff.succeeded();
                    // Finished connections, reaped as new ones come.
                    while connections.try_join_next().is_some() {}
                    let accepting = axum_server::accept::Accept::accept(&acceptor, tcp, ());
                    connections.spawn(serve_connection(accepting, service.clone(), http2, draining.clone()));
                }
                Err(error) => {
                    if !backoff.failing() {
                        tracing::warn!(%error, "accepting a webhook connection failed; backing off");
                    }
                    tokio::time::sleep(backoff.failed()).await;
                }
            },
        }
    }
    drop(listener);
    let _ = drain.send(true);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = connections.len(),
            "connections still open {DRAIN_TIMEOUT:?} after shutdown began; closing them"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// Whether the connection negotiated HTTP/2; if so, sets TCP_NODELAY on it.
///
/// An HTTP/2 answer often follows a small frame the connection flushed just before (a
/// WINDOW_UPDATE for the request body), and Nagle's algorithm would then hold the answer until
/// the client's delayed ACK, up to 40 ms later. An HTTP/1.1 answer goes out in one write, and
/// those connections keep the default (with TCP_NODELAY, a client still sending a body refused
/// early, as with a 413, more often sees its write fail before it reads the answer). Best
/// effort: a socket that refuses it still serves, only slower.
pub fn nodelay_if_http2(tls: &tokio_rustls::server::TlsStream<tokio::net::TcpStream>) -> bool {
    let (tcp, session) = tls.get_ref();
    let http2 = session.alpn_protocol() == Some(b"h2");
    if http2 {
        let _ = tcp.set_nodelay(true);
    }
    http2
}

/// A connection once its TLS handshake is done, holding its slot among [`MAX_CONNECTIONS`].
type Connection = smolvm_kit::accept::Held<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;

/// One connection: its TLS handshake (within the listener's bounds), then HTTP/2 or HTTP/1.1 as
/// ALPN chose, until it ends or, once `draining` turns true, has answered what it holds.
async fn serve_connection(
    accepting: impl std::future::Future<Output = std::io::Result<(Connection, ())>>,
    service: Admission,
    http2: crate::http2::Settings,
    mut draining: tokio::sync::watch::Receiver<bool>,
) {
    // A connection closed by a bound was counted and logged where it was closed.
    let Ok((stream, ())) = accepting.await else { return };
    if nodelay_if_http2(stream.get_ref()) {
        return crate::http2::serve(stream, service, http2, draining).await;
    }
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        // A request's head, and the next one on a kept-alive connection, within the header
        // timeout (the API server sends a head at once); then the body's own bounds (see
        // `read_body`).
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(service),
        );
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = crate::http2::drained(&mut draining) => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "an HTTP/1.1 connection failed");
    }
}
