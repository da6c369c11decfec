//! Serving HTTP over a bounded TLS acceptor on a TCP listener: the accept loop every TLS
//! listener runs ([`accept_loop`]: the webhook's with its own connections, the node API's and the
//! access API's through [`serve`]), and, for the latter two, each connection served by hyper as
//! ALPN chose:
//!
//! - HTTP/1.1 with upgrades (WebSockets), each request's head within
//!   [`Settings::header_timeout`] (also the wait for the next one on a kept-alive connection);
//! - HTTP/2 with at most [`Settings::max_streams`] streams, windows of [`Settings::window`]
//!   ([`crate::http2::window`]), a PING every [`Settings::keep_alive_interval`] that must be
//!   answered within [`Settings::keep_alive_timeout`], and closed (GOAWAY) once no request has
//!   been in flight for [`Settings::idle_timeout`] ([`crate::http2::Idle`]).
//!
//! A connection told to close (idle, or the listener shutting down) has
//! [`Settings::drain_timeout`] to finish what it holds; then it is dropped.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum_server::accept::Accept;
use hyper::{
    Request, Response,
    body::{Body, Frame, Incoming, SizeHint},
};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    sync::watch,
};

use crate::accept::{AcceptBackoff, Held};
use crate::http2::{Idle, InFlight, Streams};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How [`serve`] serves each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Time for an HTTP/1.1 request's head, and for the next one on a kept-alive connection.
    pub header_timeout: Duration,
    /// Streams open at once on one HTTP/2 connection.
    pub max_streams: u32,
    /// The flow-control window of each HTTP/2 stream and connection.
    pub window: u32,
    /// An HTTP/2 connection with no request in flight this long is closed.
    pub idle_timeout: Duration,
    /// An HTTP/2 client is sent a PING this often.
    pub keep_alive_interval: Duration,
    /// The connection is closed when a PING's answer has not come within this.
    pub keep_alive_timeout: Duration,
    /// How long a connection told to close may take to finish what it holds.
    pub drain_timeout: Duration,
}

/// Whether a connection negotiated HTTP/2 (ALPN `h2`).
pub trait Negotiated {
    /// `true` for HTTP/2.
    fn http2(&self) -> bool;
}

impl<I> Negotiated for tokio_rustls::server::TlsStream<I> {
    fn http2(&self) -> bool {
        self.get_ref().1.alpn_protocol() == Some(b"h2")
    }
}

impl<S: Negotiated> Negotiated for Held<S> {
    fn http2(&self) -> bool {
        self.get_ref().http2()
    }
}

/// Resolves once `drain` is true (or its sender is gone: nothing can start a drain then, and
/// the connection is served to its end).
pub async fn drained(drain: &mut watch::Receiver<bool>) {
    if drain.wait_for(|d| *d).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Accepts connections on `listener` until `shutdown` resolves, handing each to `connection`
/// (with the drain switch) in a task of its own; failed accepts (out of descriptors, mostly)
/// back off. Then the listener closes, the switch turns, and the connections still open after
/// `drain_timeout` (and a second's grace) are dropped. `what` names the listener in logs.
pub async fn accept_loop<F, Fut>(
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
    what: &'static str,
    mut connection: F,
) where
    F: FnMut(TcpStream, watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (drain, draining) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut backoff = AcceptBackoff::default();
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
                    connections.spawn(connection(tcp, draining.clone()));
                }
                Err(error) => {
                    if !backoff.failing() {
                        tracing::warn!(%error, listener = what, "accepting a connection failed; backing off");
                    }
                    tokio::time::sleep(backoff.failed()).await;
                }
            },
        }
    }
    drop(listener);
    let _ = drain.send(true);
    let drained = tokio::time::timeout(drain_timeout + Duration::from_secs(1), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            listener = what,
            connections = connections.len(),
            "connections still open {drain_timeout:?} after shutdown began; closing them"
        );
        connections.shutdown().await;
    }
}

/// Serves `service` over the connections `acceptor` accepts (its TLS handshake within its
/// bounds, [`crate::accept::Bounded`]) on `listener`, within `settings`, until `shutdown`
/// resolves; then as [`accept_loop`] drains.
pub async fn serve<A, S, B>(
    listener: tokio::net::TcpListener,
    acceptor: A,
    service: S,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
    what: &'static str,
) where
    A: Accept<TcpStream, S> + Clone + Send + Sync + 'static,
    A::Stream: AsyncRead + AsyncWrite + Negotiated + Unpin + Send + 'static,
    A::Future: Send + 'static,
    A::Service: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    <A::Service as tower_service::Service<Request<Incoming>>>::Future: Send + 'static,
    <A::Service as tower_service::Service<Request<Incoming>>>::Error: Into<BoxError>,
    S: Clone + Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    accept_loop(
        listener,
        shutdown,
        settings.drain_timeout,
        what,
        move |tcp, draining| {
            let accepting = acceptor.accept(tcp, service.clone());
            async move {
                // A connection closed by a bound was counted and logged where it was closed.
                let Ok((stream, service)) = accepting.await else { return };
                serve_connection(stream, service, settings, draining, what).await;
            }
        },
    )
    .await;
}

/// One connection, its TLS done: HTTP/2 or HTTP/1.1 as ALPN chose.
async fn serve_connection<I, S, B>(
    stream: I,
    service: S,
    settings: Settings,
    draining: watch::Receiver<bool>,
    what: &'static str,
) where
    I: AsyncRead + AsyncWrite + Negotiated + Unpin + Send + 'static,
    S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let http2 = stream.http2();
    let streams = Streams::new();
    let service = hyper_util::service::TowerToHyperService::new(Counted {
        inner: service,
        streams: streams.clone(),
    });
    let io = TokioIo::new(stream);
    let result = if http2 {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(settings.max_streams.max(1))
            .initial_stream_window_size(settings.window)
            .initial_connection_window_size(settings.window)
            .keep_alive_interval(settings.keep_alive_interval)
            .keep_alive_timeout(settings.keep_alive_timeout);
        let connection = builder.serve_connection(io, service);
        let idle = Idle::new(streams, settings.idle_timeout);
        drive(
            connection,
            |c| c.graceful_shutdown(),
            Some(idle),
            draining,
            settings.drain_timeout,
        )
        .await
    } else {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(settings.header_timeout);
        let connection = builder.serve_connection(io, service).with_upgrades();
        drive(
            connection,
            |c| c.graceful_shutdown(),
            None,
            draining,
            settings.drain_timeout,
        )
        .await
    };
    if let Err(error) = result {
        tracing::debug!(listener = what, error = %error, "a connection ended with an error");
    }
}

/// Polls `connection` to its end; once `draining` turns true or (HTTP/2) `idle` expires, asks it
/// to close with `close` and gives it `drain_timeout` more.
async fn drive<C, E>(
    connection: C,
    close: impl Fn(Pin<&mut C>),
    mut idle: Option<Idle>,
    mut draining: watch::Receiver<bool>,
    drain_timeout: Duration,
) -> Result<(), String>
where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    tokio::pin!(connection);
    let idle_or_drained = async {
        match idle.as_mut() {
            Some(idle) => tokio::select! {
                () = idle.expired() => "idle",
                () = drained(&mut draining) => "drain",
            },
            None => {
                drained(&mut draining).await;
                "drain"
            }
        }
    };
    let why = tokio::select! {
        result = connection.as_mut() => return result.map_err(|e| e.to_string()),
        why = idle_or_drained => why,
    };
    tracing::debug!(reason = why, "closing a connection (GOAWAY on HTTP/2)");
    close(connection.as_mut());
    match tokio::time::timeout(drain_timeout, connection).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "still open {drain_timeout:?} after it was asked to close ({why})"
        )),
    }
}

/// A service whose requests are counted in flight on their connection ([`Streams`]) from the
/// call until their answer's body is done with (sent, or dropped with its stream).
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    streams: Arc<Streams>,
}

impl<S, R, B> tower_service::Service<Request<R>> for Counted<S>
where
    S: tower_service::Service<Request<R>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<CountedBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<R>) -> Self::Future {
        let in_flight = self.streams.open();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| CountedBody {
                inner: body,
                _in_flight: in_flight,
            }))
        })
    }
}

/// An answer's body, its request in flight until it is dropped.
struct CountedBody<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B: Body + Unpin> Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
