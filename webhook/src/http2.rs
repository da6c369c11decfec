//! HTTP/2 admission connections, served straight on the `h2` crate.
//!
//! The API server keeps a few HTTP/2 connections to a webhook and sends every review over them,
//! so HTTP/2 carries nearly all admission traffic. hyper's HTTP/2 server wraps each stream in
//! layers the webhook does not use (a service future, a body pipe, a Date header, keep-alive
//! bookkeeping on every frame); measured at 2,000 reviews/s in turns on one pinned core, they
//! put its p99 1.2 to 1.3 times nginx's, against 1.06 times for `h2` driven directly (issue 34).
//! So the webhook drives `h2` itself:
//!
//! - one task per connection accepts streams, pings the client and drains on shutdown
//!   ([`serve`]);
//! - one task per stream reads the body within [`crate::server`]'s bounds of bodies in flight,
//!   reviews it, and answers with one HEADERS and one DATA frame.
//!
//! What hyper bounded, this bounds the same way: at most `max_streams` streams open per
//! connection, 16 KiB of request headers, 1 MiB flow-control windows (a client sends no more
//! than that ahead of the webhook reading it), 400 KiB of answers buffered per stream, and at
//! most 1,024 streams reset for a client's protocol errors before its connection is closed. It
//! also bounds what hyper left open: a client that completes TLS but sends no HTTP/2 preface
//! within [`crate::server::HEADER_READ_TIMEOUT`] is closed.

use std::{
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::Bytes;
use h2::{RecvStream, server::SendResponse};
use http::{HeaderValue, Request, Response, header};
use hyper::body::Frame;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::watch,
    time::{Instant, Sleep},
};

use crate::server::{Admission, HEADER_READ_TIMEOUT};

/// How one HTTP/2 connection is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Streams open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_streams: u32,
    /// A PING goes to the client this often.
    pub keep_alive_interval: Duration,
    /// The connection is closed when a PING's answer has not come within this.
    pub keep_alive_timeout: Duration,
}

/// The flow-control window of each stream and of the connection (hyper's default).
const WINDOW: u32 = 1024 * 1024;
/// The largest frame the webhook reads (the protocol's smallest maximum; hyper's default).
const MAX_FRAME_SIZE: u32 = 16 * 1024;
/// Request headers, decoded, per stream (hyper's default).
const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
/// Answer bytes buffered per stream while the client's window is shut (hyper's default).
const MAX_SEND_BUFFER: usize = 400 * 1024;
/// Streams reset for a client's protocol errors before its connection is closed (hyper's
/// default).
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// Serves one HTTP/2 connection (TLS done, `h2` negotiated) until the client closes it, it
/// fails, its keep-alive PING goes unanswered, or `drain` turns true: then a GOAWAY tells the
/// client to open no more streams, and those open are answered before the connection closes.
pub async fn serve<T>(io: T, service: Admission, settings: Settings, mut drain: watch::Receiver<bool>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handshake = h2::server::Builder::new()
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_header_list_size(MAX_HEADER_LIST_SIZE)
        .max_send_buffer_size(MAX_SEND_BUFFER)
        .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .max_concurrent_streams(settings.max_streams.max(1))
        .handshake::<T, Bytes>(io);
    let mut connection = match tokio::time::timeout(HEADER_READ_TIMEOUT, handshake).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => {
            tracing::debug!(%error, "an HTTP/2 handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!("no HTTP/2 preface in time; connection closed");
            return;
        }
    };
    let mut keep_alive = KeepAlive::new(connection.ping_pong(), settings);
    let mut draining = false;
    loop {
        tokio::select! {
            biased;
            () = drained(&mut drain), if !draining => {
                connection.graceful_shutdown();
                draining = true;
            }
            next = connection.accept() => match next {
                Some(Ok((request, respond))) => {
                    tokio::spawn(answer(service.clone(), request, respond));
                }
                Some(Err(error)) => {
                    tracing::debug!(%error, "an HTTP/2 connection failed");
                    return;
                }
                None => return,
            },
            () = std::future::poll_fn(|cx| keep_alive.poll_expired(cx)) => {
                tracing::debug!("an HTTP/2 client did not answer a PING in time; connection closed");
                return;
            }
        }
    }
}

/// Resolves once `drain` is true (or its sender is gone: nothing can start a drain then, and
/// the connection is served to its end).
pub(crate) async fn drained(drain: &mut watch::Receiver<bool>) {
    if drain.wait_for(|d| *d).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Answers one stream: the body read within its bounds, the review, and the answer in one
/// HEADERS and one DATA frame. The client resetting the stream ends the body's reading with an
/// error, and the answer then goes nowhere.
async fn answer(service: Admission, request: Request<RecvStream>, mut respond: SendResponse<Bytes>) {
    let reply = service.answer(request.map(Body)).await;
    let (parts, body) = reply.into_parts();
    let mut head = Response::from_parts(parts, ());
    head.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let sent = respond.send_response(head, body.is_empty()).and_then(|mut stream| {
        if body.is_empty() {
            Ok(())
        } else {
            stream.send_data(body, true)
        }
    });
    if let Err(error) = sent {
        tracing::debug!(%error, "an HTTP/2 answer could not be sent (the stream is gone)");
    }
}

/// A request's body as [`hyper::body::Body`]: each chunk's flow-control capacity is given back
/// as it is taken, so the client may send the next (the body is bounded where it is collected).
struct Body(RecvStream);

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        match ready!(self.0.poll_data(cx)) {
            Some(Ok(data)) => {
                // Fails only when the stream is already gone, which the next poll reports.
                let _ = self.0.flow_control().release_capacity(data.len());
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Some(Err(error)) => Poll::Ready(Some(Err(error))),
            None => Poll::Ready(match ready!(self.0.poll_trailers(cx)) {
                Ok(Some(trailers)) => Some(Ok(Frame::trailers(trailers))),
                Ok(None) => None,
                Err(error) => Some(Err(error)),
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

/// A PING every `keep_alive_interval`; expired when its PONG has not come within
/// `keep_alive_timeout`.
struct KeepAlive {
    ping_pong: Option<h2::PingPong>,
    settings: Settings,
    /// The next PING while none is out, the PONG's deadline while one is.
    timer: Pin<Box<Sleep>>,
    waiting: bool,
}

impl KeepAlive {
    fn new(ping_pong: Option<h2::PingPong>, settings: Settings) -> Self {
        KeepAlive {
            ping_pong,
            settings,
            timer: Box::pin(tokio::time::sleep(settings.keep_alive_interval)),
            waiting: false,
        }
    }

    /// Ready when the client has not answered a PING in time; never, when the connection no
    /// longer takes PINGs (it is closing, and the connection itself says so).
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(ping_pong) = self.ping_pong.as_mut() else {
            return Poll::Pending;
        };
        loop {
            if self.waiting {
                match ping_pong.poll_pong(cx) {
                    Poll::Ready(Ok(_)) => {
                        self.waiting = false;
                        let next = Instant::now() + self.settings.keep_alive_interval;
                        self.timer.as_mut().reset(next);
                    }
                    Poll::Ready(Err(_)) => {
                        self.ping_pong = None;
                        return Poll::Pending;
                    }
                    Poll::Pending => {}
                }
            }
            ready!(self.timer.as_mut().poll(cx));
            if self.waiting {
                return Poll::Ready(());
            }
            if ping_pong.send_ping(h2::Ping::opaque()).is_err() {
                self.ping_pong = None;
                return Poll::Pending;
            }
            self.waiting = true;
            let deadline = Instant::now() + self.settings.keep_alive_timeout;
            self.timer.as_mut().reset(deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    //! One connection served over an in-memory pipe, its client written frame by frame, on
    //! tokio's paused clock: the waits below are virtual, and nothing asserts a duration.

    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;
    use crate::state::{AppState, PolicyHandle};

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const SETTINGS: u8 = 0x4;
    const PING: u8 = 0x6;
    const GOAWAY: u8 = 0x7;
    const ACK: u8 = 0x1;

    fn settings() -> Settings {
        Settings {
            max_streams: 8,
            keep_alive_interval: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(10),
        }
    }

    /// The server side served in a task; the client's end of the pipe, and the drain switch.
    fn start() -> (DuplexStream, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let state = AppState::new(
            PolicyHandle::new(smolvm_api::Policy::default()),
            Arc::new(Vec::<smolvm_api::SmolVMNode>::new()),
        );
        let (drain, draining) = watch::channel(false);
        let served = tokio::spawn(serve(
            server,
            crate::server::admission_service(state),
            settings(),
            draining,
        ));
        (client, drain, served)
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let length = u32::try_from(payload.len()).unwrap_or(0).to_be_bytes();
        let mut out = vec![length[1], length[2], length[3], kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// The next frame's type, flags and payload; `None` once the server has closed.
    async fn next_frame(client: &mut DuplexStream) -> Option<(u8, u8, Vec<u8>)> {
        let mut head = [0u8; 9];
        client.read_exact(&mut head).await.ok()?;
        let length = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; length];
        client.read_exact(&mut payload).await.ok()?;
        Some((head[3], head[4], payload))
    }

    async fn open(client: &mut DuplexStream) {
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        assert!(client.write_all(&hello).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_answers_a_ping_is_closed() {
        let (mut client, _drain, served) = start();
        open(&mut client).await;
        let mut pinged = false;
        while let Some((kind, flags, _)) = next_frame(&mut client).await {
            pinged |= kind == PING && flags & ACK == 0;
        }
        assert!(pinged, "the server pinged before it closed");
        assert!(served.await.is_ok(), "the connection's task ended cleanly");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_answers_pings_stays_connected() {
        let (mut client, _drain, served) = start();
        open(&mut client).await;
        let mut pongs = 0;
        while pongs < 5 {
            let Some((kind, flags, payload)) = next_frame(&mut client).await else {
                panic!("the server closed a connection whose client answered every PING");
            };
            if kind == PING && flags & ACK == 0 {
                assert!(client.write_all(&frame(PING, ACK, 0, &payload)).await.is_ok());
                pongs += 1;
            }
        }
        assert!(!served.is_finished(), "still served after {pongs} PINGs answered");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_sends_no_preface_is_closed() {
        let (mut client, _drain, served) = start();
        let mut rest = Vec::new();
        // The server closes its end: the read ends (its SETTINGS may come first, or nothing).
        let _ = client.read_to_end(&mut rest).await;
        assert!(served.await.is_ok(), "the connection's task ended");
    }

    #[tokio::test(start_paused = true)]
    async fn draining_sends_goaway_and_closes() {
        let (mut client, drain, served) = start();
        open(&mut client).await;
        // The server's SETTINGS first: the connection is up.
        let first = next_frame(&mut client).await;
        assert!(matches!(first, Some((SETTINGS, _, _))), "{first:?}");
        assert!(drain.send(true).is_ok());
        let mut goaway = false;
        while let Some((kind, flags, payload)) = next_frame(&mut client).await {
            goaway |= kind == GOAWAY;
            if kind == PING && flags & ACK == 0 {
                // h2's graceful shutdown PINGs the client between its two GOAWAYs.
                let _ = client.write_all(&frame(PING, ACK, 0, &payload)).await;
            }
        }
        assert!(goaway, "a GOAWAY before the close");
        assert!(served.await.is_ok(), "the connection's task ended");
    }
}
