//! The admission listener: TLS connections within their bounds, then HTTP/2 ([`crate::http2`])
//! or HTTP/1.1 (hyper) as ALPN chose, and their drain on shutdown.

use std::{sync::Arc, time::Duration};

use smolvm_certs::ReloadableResolver;
use smolvm_kit::{accept::AcceptBounds, limits::ListenerBounds, serve::drained};

use crate::{
    error::{Error, Result},
    server::{Admission, HEADER_READ_TIMEOUT},
};

/// How long a client may take over its TLS handshake (`--handshake-timeout`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections the webhook holds at once (`--max-connections`; the API servers keep a few,
/// multiplexed over HTTP/2); more are closed at once, before a byte of TLS is read.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections from one source address (`--max-connections-per-source`): an API server at its
/// busiest holds a few (its HTTP/2 client opens another only when one has as many streams as
/// the webhook allows, `--max-concurrent-reviews`), so 64 leave room for several behind one
/// address while 16 addresses are needed to fill the listener.
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 64;
/// TLS handshakes in progress at once (`--max-handshakes`); more are closed at once.
pub const MAX_HANDSHAKES: usize = 64;
/// TLS handshakes in progress from one source address (`--max-handshakes-per-source`): an
/// address whose sockets never finish theirs leaves the others 48.
pub const MAX_HANDSHAKES_PER_SOURCE: usize = 16;
/// How long an HTTP/2 connection may hold no stream before it is told GOAWAY
/// (`--http2-idle-timeout`): above the 90 s after which the API server's client closes an idle
/// connection itself ([`smolvm_kit::http2`]).
pub const HTTP2_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Bytes all HTTP/2 connections may hold unread (`--http2-buffer-budget`): 64 MiB, a quarter of
/// the pod's 256 MiB memory limit, which gives each of the 1,024 connections a 64 KiB window
/// (HTTP/2's own initial window). With the bodies being read (at most `--max-concurrent-bodies`
/// x `--body-limit`, 64 MiB) that leaves half the limit for the process and its connections.
pub const HTTP2_BUFFER_BUDGET: usize = 64 << 20;
/// How often an HTTP/2 client is sent a PING.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long an HTTP/2 client may take to answer a PING before its connection is closed.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections are given, once shutdown begins (or, one by one, once idle), to answer
/// the requests they hold; then they are closed.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// What the listener bounds, from the flags ([`crate::cli::Args::listening`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    /// Connections and handshakes (in all and per source), HTTP/2 windows and idle timeout.
    pub bounds: ListenerBounds,
    /// Streams open at once on one HTTP/2 connection (the review slots).
    pub max_streams: u32,
}

impl Listening {
    /// The defaults, with `max_streams` streams per HTTP/2 connection.
    pub fn defaults(max_streams: u32) -> Self {
        Listening {
            bounds: ListenerBounds {
                accept: AcceptBounds {
                    max_connections: MAX_CONNECTIONS,
                    max_connections_per_source: MAX_CONNECTIONS_PER_SOURCE,
                    max_handshakes: MAX_HANDSHAKES,
                    max_handshakes_per_source: MAX_HANDSHAKES_PER_SOURCE,
                    handshake_timeout: HANDSHAKE_TIMEOUT,
                },
                http2_window: (HTTP2_BUFFER_BUDGET / MAX_CONNECTIONS) as u32,
                http2_idle_timeout: HTTP2_IDLE_TIMEOUT,
            },
            max_streams,
        }
    }
}

/// Serves `service` over TLS (HTTP/2 and HTTP/1.1 by ALPN) on `listener`, with the certificate
/// from `resolver` (swapped in place on rotation), until `shutdown` resolves: then the listener
/// closes, each connection answers what it holds (HTTP/2 with a GOAWAY, HTTP/1.1 closing after
/// its request), and those still open after [`DRAIN_TIMEOUT`] are closed.
///
/// Connections are bounded before they are read (`smolvm_kit::accept`, within
/// `listening.bounds.accept`): so many open and handshaking, in all and from one source address,
/// each handshake within its timeout; the connections closed for it are counted in `metrics`.
/// Then an HTTP/2 connection is served on the `h2` crate ([`crate::http2`]) with at most
/// `listening.max_streams` streams open, flow-control windows of `listening.bounds.http2_window`,
/// pinged every [`KEEP_ALIVE_INTERVAL`] and closed when a PING goes unanswered for
/// [`KEEP_ALIVE_TIMEOUT`] or when it has held no stream for the idle timeout; an HTTP/1.1
/// connection by hyper, each request's head within [`HEADER_READ_TIMEOUT`].
pub async fn serve_tls(
    listener: std::net::TcpListener,
    service: Admission,
    resolver: Arc<ReloadableResolver>,
    shutdown: impl std::future::Future<Output = ()>,
    listening: Listening,
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
    let bounds = listening.bounds;
    let acceptor = smolvm_kit::accept::Bounded::new(
        axum_server::tls_rustls::RustlsAcceptor::new(tls).handshake_timeout(bounds.accept.handshake_timeout),
        bounds.accept,
    )
    .on_closed(Arc::new(move |why| metrics.observe_connection_closed(why.as_str())));
    let http2 = crate::http2::Settings {
        max_streams: listening.max_streams,
        keep_alive_interval: KEEP_ALIVE_INTERVAL,
        keep_alive_timeout: KEEP_ALIVE_TIMEOUT,
        window: bounds.http2_window,
        idle_timeout: bounds.http2_idle_timeout,
        close_grace: DRAIN_TIMEOUT,
    };
    smolvm_kit::serve::accept_loop(listener, shutdown, DRAIN_TIMEOUT, "webhook", move |tcp, draining| {
        let accepting = axum_server::accept::Accept::accept(&acceptor, tcp, ());
        serve_connection(accepting, service.clone(), http2, draining)
    })
    .await;
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
        () = drained(&mut draining) => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "an HTTP/1.1 connection failed");
    }
}
