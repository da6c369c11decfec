//! Bounds on the connections of a TLS listener (the webhook's, the node API's, the access API's;
//! served by [`crate::serve`] or, the webhook's, by its own loop), before a byte of HTTP is read:
//! anyone who reaches the port can open a TCP connection, so [`Bounded`] wraps the listener's
//! acceptor and
//!
//! - closes a connection at once when [`AcceptBounds::max_connections`] are open, or its source
//!   address holds [`AcceptBounds::max_connections_per_source`] of them (the slot is held for the
//!   connection's life, TLS and HTTP),
//! - closes it at once when [`AcceptBounds::max_handshakes`] handshakes are in progress, or its
//!   source has [`AcceptBounds::max_handshakes_per_source`] in progress (the slot is held only
//!   while the handshake runs),
//! - closes it when its handshake has not finished within [`AcceptBounds::handshake_timeout`]
//!   (or the inner acceptor's own timeout, an error of kind `TimedOut`, came first),
//!
//! and tells the listener's owner each time ([`Closed`]), for its metrics. So one address that
//! opens sockets and sends nothing holds at most its share of the handshakes, for at most the
//! handshake timeout each, and another address still gets its handshake ([`crate::shares`]).

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum_server::accept::Accept;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::backoff::{Backoff, Schedule};
use crate::shares::{Refused, Share, Shares};

/// Waits after failed accepts (out of file descriptors, mostly): 5 ms doubling to 1 s, as Go's
/// `net/http` server does (the ops server, the port forwarder), back to nothing after a
/// success. Retrying at once would spin a core while the descriptors stay gone. The accept
/// loop's [`Backoff`], with one key.
#[derive(Debug, Clone)]
pub struct AcceptBackoff(Backoff<()>);

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff(Backoff::new(Self::SCHEDULE))
    }
}

impl AcceptBackoff {
    const SCHEDULE: Schedule = Schedule::new(Duration::from_millis(5), Duration::from_secs(1));

    /// How long to wait after one more failure.
    pub fn failed(&mut self) -> Duration {
        self.0.failed((), std::time::Instant::now(), ())
    }

    /// An accept succeeded.
    pub fn succeeded(&mut self) {
        self.0.succeeded(&());
    }

    /// Whether the last accept failed.
    pub fn failing(&self) -> bool {
        !self.0.is_empty()
    }
}

/// What a listener's connections may hold before and while they are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptBounds {
    /// Connections open at once (handshaking or served); more are closed at once.
    pub max_connections: usize,
    /// Connections open at once from one source address; more from it are closed at once.
    pub max_connections_per_source: usize,
    /// TLS handshakes in progress at once; more are closed at once.
    pub max_handshakes: usize,
    /// TLS handshakes in progress at once from one source address; more from it are closed at
    /// once.
    pub max_handshakes_per_source: usize,
    /// Time for a handshake to finish; then the connection is closed.
    pub handshake_timeout: Duration,
}

impl Default for AcceptBounds {
    /// 256 connections (128 from one address), 64 handshakes at once (16 from one address), 5 s
    /// for each.
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_connections_per_source: 128,
            max_handshakes: 64,
            max_handshakes_per_source: 16,
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

/// Why [`Bounded`] closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// At once: [`AcceptBounds::max_connections`] were open.
    Connections,
    /// At once: its source had [`AcceptBounds::max_connections_per_source`] open.
    SourceConnections,
    /// At once: [`AcceptBounds::max_handshakes`] were in progress.
    Handshakes,
    /// At once: its source had [`AcceptBounds::max_handshakes_per_source`] in progress.
    SourceHandshakes,
    /// Its handshake did not finish within [`AcceptBounds::handshake_timeout`].
    HandshakeTimeout,
}

impl Closed {
    /// A stable label (`connections`, `source_connections`, `handshakes`, `source_handshakes`,
    /// `handshake_timeout`).
    pub fn as_str(self) -> &'static str {
        match self {
            Closed::Connections => "connections",
            Closed::SourceConnections => "source_connections",
            Closed::Handshakes => "handshakes",
            Closed::SourceHandshakes => "source_handshakes",
            Closed::HandshakeTimeout => "handshake_timeout",
        }
    }
}

/// A connection's source address, by which its share of a listener's slots is counted.
pub trait PeerSource {
    /// The peer's address; an error when the connection is already gone.
    fn peer_source(&self) -> io::Result<IpAddr>;
}

impl PeerSource for tokio::net::TcpStream {
    fn peer_source(&self) -> io::Result<IpAddr> {
        self.peer_addr().map(|a| a.ip())
    }
}

/// Told each connection [`Bounded`] closes.
pub type OnClosed = Arc<dyn Fn(Closed) + Send + Sync>;

/// An acceptor (rustls's, or one that wraps it) within [`AcceptBounds`].
#[derive(Clone)]
pub struct Bounded<A> {
    inner: A,
    connections: Arc<Shares>,
    handshakes: Arc<Shares>,
    handshake_timeout: Duration,
    on_closed: Option<OnClosed>,
}

impl<A> Bounded<A> {
    /// `inner` within `bounds`.
    pub fn new(inner: A, bounds: AcceptBounds) -> Self {
        Self {
            inner,
            connections: Shares::new(bounds.max_connections, bounds.max_connections_per_source),
            handshakes: Shares::new(bounds.max_handshakes, bounds.max_handshakes_per_source),
            handshake_timeout: bounds.handshake_timeout,
            on_closed: None,
        }
    }

    /// Tells `on_closed` each connection closed by a bound.
    pub fn on_closed(mut self, on_closed: OnClosed) -> Self {
        self.on_closed = Some(on_closed);
        self
    }
}

impl<A, I, S> Accept<I, S> for Bounded<A>
where
    A: Accept<I, S>,
    A::Future: Send + 'static,
    A::Stream: Send + 'static,
    A::Service: Send + 'static,
    I: PeerSource + Send + 'static,
{
    type Stream = Held<A::Stream>;
    type Service = A::Service;
    type Future = Pin<Box<dyn Future<Output = io::Result<(Self::Stream, Self::Service)>> + Send>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let on_closed = self.on_closed.clone();
        let close = move |why: Closed| {
            tracing::debug!(reason = why.as_str(), "a connection closed by the listener's bounds");
            if let Some(on_closed) = &on_closed {
                on_closed(why);
            }
            io::Error::other(format!("connection closed: {}", why.as_str()))
        };
        // Dropping `stream` closes the connection.
        let source = match stream.peer_source() {
            Ok(source) => source,
            // The peer is gone already: nothing to serve, nothing to count.
            Err(error) => return Box::pin(std::future::ready(Err(error))),
        };
        let connection = match self.connections.take(source) {
            Ok(share) => share,
            Err(Refused::Full) => return Box::pin(std::future::ready(Err(close(Closed::Connections)))),
            Err(Refused::Source) => return Box::pin(std::future::ready(Err(close(Closed::SourceConnections)))),
        };
        let handshaking = match self.handshakes.take(source) {
            Ok(share) => share,
            Err(Refused::Full) => return Box::pin(std::future::ready(Err(close(Closed::Handshakes)))),
            Err(Refused::Source) => return Box::pin(std::future::ready(Err(close(Closed::SourceHandshakes)))),
        };
        let handshake = self.inner.accept(stream, service);
        let timeout = self.handshake_timeout;
        Box::pin(async move {
            let accepted = tokio::time::timeout(timeout, handshake).await;
            drop(handshaking);
            match accepted {
                Ok(Ok((stream, service))) => Ok((
                    Held {
                        inner: stream,
                        _slot: connection,
                    },
                    service,
                )),
                // The inner acceptor's own timeout (rustls's) counts as this one.
                Ok(Err(error)) if error.kind() == io::ErrorKind::TimedOut => Err(close(Closed::HandshakeTimeout)),
                Ok(Err(error)) => Err(error),
                Err(_) => Err(close(Closed::HandshakeTimeout)),
            }
        })
    }
}

/// A connection's stream with its slot among [`AcceptBounds::max_connections`], freed when the
/// connection is dropped.
pub struct Held<S> {
    inner: S,
    _slot: Share,
}

impl<S> Held<S> {
    /// The stream (for instance to read the TLS session's peer certificate).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Held<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Held<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum_server::accept::DefaultAcceptor;

    #[test]
    fn accept_backoff_doubles_to_a_second_and_resets() {
        let mut backoff = AcceptBackoff::default();
        assert!(!backoff.failing());
        let waits: Vec<u64> = (0..10).map(|_| backoff.failed().as_millis() as u64).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.succeeded();
        assert!(!backoff.failing());
        assert_eq!(backoff.failed(), Duration::from_millis(5));
    }

    /// A connection's stand-in: only its source address.
    struct From(IpAddr);

    impl PeerSource for From {
        fn peer_source(&self) -> io::Result<IpAddr> {
            Ok(self.0)
        }
    }

    fn from(last: u8) -> From {
        From(IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, last)))
    }

    /// An acceptor whose handshake never finishes.
    #[derive(Clone)]
    struct Stuck;

    impl<I: Send + 'static, S: Send + 'static> Accept<I, S> for Stuck {
        type Stream = I;
        type Service = S;
        type Future = Pin<Box<dyn Future<Output = io::Result<(I, S)>> + Send>>;

        fn accept(&self, _stream: I, _service: S) -> Self::Future {
            Box::pin(std::future::pending())
        }
    }

    fn recorder() -> (OnClosed, Arc<std::sync::Mutex<Vec<Closed>>>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = seen.clone();
        let on_closed: OnClosed = Arc::new(move |why| into.lock().unwrap_or_else(|p| p.into_inner()).push(why));
        (on_closed, seen)
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_until_one_goes() {
        let (on_closed, seen) = recorder();
        let bounds = AcceptBounds {
            max_connections: 2,
            ..AcceptBounds::default()
        };
        let acceptor = Bounded::new(DefaultAcceptor, bounds).on_closed(on_closed);
        let first = acceptor.accept(from(2), ()).await.expect("first");
        let _second = acceptor.accept(from(3), ()).await.expect("second");
        assert!(acceptor.accept(from(4), ()).await.is_err());
        drop(first);
        assert!(acceptor.accept(from(4), ()).await.is_ok());
        assert_eq!(*seen.lock().expect("seen"), vec![Closed::Connections]);
    }

    #[tokio::test]
    async fn a_source_beyond_its_share_of_connections_is_closed_while_others_get_in() {
        let (on_closed, seen) = recorder();
        let bounds = AcceptBounds {
            max_connections: 4,
            max_connections_per_source: 2,
            ..AcceptBounds::default()
        };
        let acceptor = Bounded::new(DefaultAcceptor, bounds).on_closed(on_closed);
        let first = acceptor.accept(from(2), ()).await.expect("first");
        let _second = acceptor.accept(from(2), ()).await.expect("second");
        assert!(acceptor.accept(from(2), ()).await.is_err(), "beyond the source's share");
        let _other = acceptor.accept(from(3), ()).await.expect("another source");
        drop(first);
        assert!(acceptor.accept(from(2), ()).await.is_ok(), "the share came back");
        assert_eq!(*seen.lock().expect("seen"), vec![Closed::SourceConnections]);
    }

    #[tokio::test(start_paused = true)]
    async fn handshakes_in_progress_are_capped_and_timed_out() {
        let (on_closed, seen) = recorder();
        let bounds = AcceptBounds {
            max_connections: 8,
            max_handshakes: 1,
            handshake_timeout: Duration::from_secs(5),
            ..AcceptBounds::default()
        };
        let acceptor = Bounded::new(Stuck, bounds).on_closed(on_closed);
        let stuck = acceptor.accept(from(2), ());
        assert!(acceptor.accept(from(3), ()).await.is_err());
        assert!(stuck.await.is_err());
        assert_eq!(
            *seen.lock().expect("seen"),
            vec![Closed::Handshakes, Closed::HandshakeTimeout]
        );
        // The slot came back with the timeout: the next connection gets to its handshake.
        assert!(acceptor.accept(from(3), ()).await.is_err());
        assert_eq!(seen.lock().expect("seen").last(), Some(&Closed::HandshakeTimeout));
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_beyond_its_share_of_handshakes_leaves_others_theirs() {
        let (on_closed, seen) = recorder();
        let bounds = AcceptBounds {
            max_handshakes: 4,
            max_handshakes_per_source: 2,
            ..AcceptBounds::default()
        };
        let acceptor = Bounded::new(Stuck, bounds).on_closed(on_closed);
        // Two of 127.0.0.2's handshakes in progress; its third is closed at once.
        let held = [acceptor.accept(from(2), ()), acceptor.accept(from(2), ())];
        assert!(acceptor.accept(from(2), ()).await.is_err());
        assert_eq!(*seen.lock().expect("seen"), vec![Closed::SourceHandshakes]);
        // 127.0.0.3 gets its handshake started (it then times out: the acceptor is stuck).
        let other = acceptor.accept(from(3), ());
        assert!(other.await.is_err());
        assert_eq!(seen.lock().expect("seen").last(), Some(&Closed::HandshakeTimeout));
        drop(held);
    }
}
