//! HTTP/2 admission connections, served straight on the `h2` crate.
//!
//! The API server keeps a few HTTP/2 connections to a webhook and sends every review over them,
//! so HTTP/2 carries nearly all admission traffic. hyper's HTTP/2 server wraps each stream in
//! layers the webhook does not use (a service future, a body pipe, a Date header, keep-alive
//! bookkeeping on every frame); measured at 2,000 reviews/s in turns on one pinned core, they
//! put its p99 1.2 to 1.3 times nginx's, against 1.06 times for `h2` driven directly (issue 34).
//! So the webhook drives `h2` itself:
//!
//! - one task per connection accepts streams, pings the client, closes the connection once it
//!   has been idle and drains on shutdown ([`serve`]);
//! - one task per stream reads the body within [`crate::server`]'s bounds of bodies in flight,
//!   reviews it, and answers with one HEADERS and one DATA frame; the client resetting the
//!   stream cancels it at once.
//!
//! What hyper bounded, this bounds the same way: at most `max_streams` streams open per
//! connection, 16 KiB of request headers, 400 KiB of answers buffered per stream, and at most
//! 1,024 streams reset for a client's protocol errors before its connection is closed. It also
//! bounds what hyper left open:
//!
//! - A client that completes TLS but sends no HTTP/2 preface within
//!   [`crate::server::HEADER_READ_TIMEOUT`] is closed.
//! - A connection with no stream in flight for [`Settings::idle_timeout`] is told GOAWAY
//!   ([`smolvm_kit::http2::Idle`]); one told to close (idle, or shutdown) that has not finished
//!   within [`Settings::close_grace`] (a client that does not read its answers) is dropped.
//! - The flow-control windows ([`Settings::window`]) come from the listener's memory budget
//!   ([`smolvm_kit::http2::window`]: 64 KiB for 1,024 connections and 64 MiB). What `h2` holds
//!   for a connection is at most one window: a request's DATA is given back to the client's
//!   window ([`Body`]) only once its stream holds a reader slot or has its whole body, never
//!   while it waits for a slot, so streams waiting for a reader cannot make a connection hold
//!   more than its window. All connections together then hold at most the budget, and the
//!   bodies being read under reader slots at most `--max-concurrent-bodies` x `--body-limit`.

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

use smolvm_kit::{
    http2::{Idle, InFlight, Streams},
    serve::drained,
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
    /// The flow-control window of each stream and of the connection.
    pub window: u32,
    /// A connection with no stream in flight this long is told GOAWAY and closed.
    pub idle_timeout: Duration,
    /// How long a connection told to close (idle, or shutdown) may take to answer the streams it
    /// holds; then it is dropped.
    pub close_grace: Duration,
}

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
/// fails, its keep-alive PING goes unanswered, it has been idle for the idle timeout, or `drain`
/// turns true: then a GOAWAY tells the client to open no more streams, and those open are
/// answered (within the close grace) before the connection closes.
pub async fn serve<T>(io: T, service: Admission, settings: Settings, mut drain: watch::Receiver<bool>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handshake = h2::server::Builder::new()
        .initial_window_size(settings.window)
        .initial_connection_window_size(settings.window)
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
    let streams = Streams::new();
    let mut idle = Idle::new(streams.clone(), settings.idle_timeout);
    // Once the connection was told to close: when it is dropped if still open.
    let close_by = tokio::time::sleep(Duration::MAX);
    tokio::pin!(close_by);
    let mut closing = false;
    loop {
        tokio::select! {
            biased;
            () = drained(&mut drain), if !closing => {
                connection.graceful_shutdown();
                closing = true;
                close_by.as_mut().reset(Instant::now() + settings.close_grace);
            }
            next = connection.accept() => match next {
                Some(Ok((request, respond))) => {
                    tokio::spawn(answer(service.clone(), request, respond, streams.open()));
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
            () = idle.expired(), if !closing => {
                tracing::debug!("an HTTP/2 connection idle for {:?}; GOAWAY", settings.idle_timeout);
                connection.graceful_shutdown();
                closing = true;
                close_by.as_mut().reset(Instant::now() + settings.close_grace);
            }
            () = &mut close_by, if closing => {
                tracing::debug!("an HTTP/2 connection still open {:?} after it was told to close; dropped", settings.close_grace);
                return;
            }
        }
    }
}

/// Answers one stream: the body read within its bounds, the review, and the answer in one
/// HEADERS and one DATA frame. The stream counts as in flight on its connection until its answer
/// is queued (`in_flight`). The client resetting the stream cancels the answer at once (its
/// reader slot, or its wait for one, given up): a reset stream keeps no slot from a real reader.
async fn answer(
    service: Admission,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    in_flight: InFlight,
) {
    let answering = service.answer_with(request.map(Body::new), Body::release_as_read);
    tokio::pin!(answering);
    // The answer first: a review whose body is all here is answered in that first poll, and the
    // reset is never looked at.
    let reply = tokio::select! {
        biased;
        reply = &mut answering => reply,
        reset = std::future::poll_fn(|cx| respond.poll_reset(cx)) => {
            tracing::debug!(reset = ?reset.ok(), "an HTTP/2 stream was reset by its client; its answer cancelled");
            return;
        }
    };
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
    drop(in_flight);
}

/// A request's body as [`hyper::body::Body`]. The flow-control capacity of the DATA taken is
/// held back (the client may not send more in its place) until [`Body::release_as_read`], which
/// the body's reader calls once it holds a reader slot, or until the body's end: a stream waiting
/// for a reader slot thus holds at most its window, shared with its connection's other streams.
/// From then on, each chunk's capacity is given back as it is taken, so the client may send the
/// next (the body is bounded where it is collected). What is held when the stream goes, `h2`
/// gives back itself.
struct Body {
    stream: RecvStream,
    /// Bytes taken whose capacity is held back.
    held: usize,
    releasing: bool,
}

impl Body {
    fn new(stream: RecvStream) -> Self {
        Body {
            stream,
            held: 0,
            releasing: false,
        }
    }

    /// From now on, capacity is given back as DATA is taken; what was held back, at once.
    fn release_as_read(&mut self) {
        self.releasing = true;
        self.release_held();
    }

    fn release_held(&mut self) {
        if self.held > 0 {
            // Fails only when the stream is already gone, which the next poll reports.
            let _ = self
                .stream
                .flow_control()
                .release_capacity(std::mem::take(&mut self.held));
        }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        match ready!(self.stream.poll_data(cx)) {
            Some(Ok(data)) => {
                if self.releasing {
                    // Fails only when the stream is already gone, which the next poll reports.
                    let _ = self.stream.flow_control().release_capacity(data.len());
                } else {
                    self.held += data.len();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            // The client reset the stream: `answer` sees the reset beside this body and cancels
            // the answer, so the reader is left waiting rather than told of an error it would
            // answer (and count) to nobody.
            Some(Err(error)) if error.is_reset() && error.is_remote() => Poll::Pending,
            Some(Err(error)) => Poll::Ready(Some(Err(error))),
            None => {
                // The whole body is in: nothing more can come in the held capacity's place.
                self.release_held();
                Poll::Ready(match ready!(self.stream.poll_trailers(cx)) {
                    Ok(Some(trailers)) => Some(Ok(Frame::trailers(trailers))),
                    Ok(None) => None,
                    Err(error) => Some(Err(error)),
                })
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_end_stream()
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

    /// Connections that never go idle, unless a test says otherwise.
    fn settings() -> Settings {
        Settings {
            max_streams: 8,
            keep_alive_interval: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(10),
            window: smolvm_kit::http2::MIN_WINDOW,
            idle_timeout: Duration::from_secs(24 * 3600),
            close_grace: Duration::from_secs(20),
        }
    }

    /// The server side served in a task; the client's end of the pipe, and the drain switch.
    fn start() -> (DuplexStream, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        start_with(settings())
    }

    fn start_with(settings: Settings) -> (DuplexStream, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let state = AppState::new(
            PolicyHandle::new(smolvm_api::Policy::default()),
            Arc::new(Vec::<smolvm_api::SmolVMNode>::new()),
        );
        let (drain, draining) = watch::channel(false);
        let served = tokio::spawn(serve(
            server,
            crate::server::admission_service(state),
            settings,
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

    /// A client that answers every PING but opens no stream is told GOAWAY once the idle
    /// timeout has passed, and closed.
    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_told_goaway_and_closed() {
        let (mut client, _drain, served) = start_with(Settings {
            idle_timeout: Duration::from_secs(60),
            ..settings()
        });
        open(&mut client).await;
        let (mut pongs, mut goaway) = (0, false);
        while let Some((kind, flags, payload)) = next_frame(&mut client).await {
            goaway |= kind == GOAWAY;
            if kind == PING && flags & ACK == 0 {
                let _ = client.write_all(&frame(PING, ACK, 0, &payload)).await;
                pongs += 1;
            }
        }
        assert!(goaway, "a GOAWAY before the close");
        assert!(pongs >= 1, "the client answered PINGs all along");
        assert!(served.await.is_ok(), "the connection's task ended");
    }

    /// A connection told to close whose client never lets it finish (it reads nothing: the
    /// server's GOAWAY waits in the pipe) is dropped after the close grace.
    #[tokio::test(start_paused = true)]
    async fn a_connection_that_does_not_finish_closing_is_dropped_after_the_grace() {
        let (mut client, drain, served) = start_with(Settings {
            close_grace: Duration::from_secs(5),
            // No keep-alive PING closes it first.
            keep_alive_interval: Duration::from_secs(24 * 3600),
            ..settings()
        });
        open(&mut client).await;
        let first = next_frame(&mut client).await;
        assert!(matches!(first, Some((SETTINGS, _, _))), "{first:?}");
        assert!(drain.send(true).is_ok());
        // The client neither reads nor answers the shutdown's PING.
        assert!(served.await.is_ok(), "the connection's task ended");
        drop(client);
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

    /// A SmolVM CREATE review, as the API server sends it.
    fn review_body() -> Vec<u8> {
        let gvk = serde_json::json!({"group": "vm.smolvm.dev", "version": "v1alpha1", "kind": "SmolVM"});
        let gvr = serde_json::json!({"group": "vm.smolvm.dev", "version": "v1alpha1", "resource": "smolvms"});
        let review = serde_json::json!({
            "kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
            "request": {
                "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
                "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
                "name": "alpine", "namespace": "default", "operation": "CREATE",
                "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
                "object": smolvm_api::fixtures::alpine(), "oldObject": null, "dryRun": false,
                "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
            }
        });
        serde_json::to_vec(&review).unwrap_or_default()
    }

    /// A stream its client resets while it waits for a reader slot is cancelled: it takes no
    /// slot and answers nothing (before, it waited on, took the slot once it freed, and counted
    /// a bad request), while the stream that held the only slot completes.
    #[tokio::test(start_paused = true)]
    async fn a_reset_stream_is_cancelled_while_it_waits_for_a_reader_slot() {
        let (client, server) = tokio::io::duplex(256 * 1024);
        let state = AppState::new(
            PolicyHandle::new(smolvm_api::Policy::default()),
            Arc::new(Vec::<smolvm_api::SmolVMNode>::new()),
        )
        .with_max_concurrent_bodies(1);
        let metrics = state.metrics.clone();
        let (_drain, draining) = watch::channel(false);
        tokio::spawn(serve(
            server,
            crate::server::admission_service(state),
            settings(),
            draining,
        ));
        let Ok((mut sender, connection)) = h2::client::handshake(client).await else {
            panic!("the client's handshake")
        };
        tokio::spawn(connection);
        let body = review_body();
        let (first, rest) = body.split_at(body.len() / 2);
        let post = || {
            Request::post("https://smolvm-webhook/validate/smolvms")
                .header("content-type", "application/json")
                .body(())
        };
        // A holds the only reader slot: half its body now, the rest later.
        let Ok((answer_a, mut a)) = sender.send_request(post().expect("request"), false) else {
            panic!("A's stream")
        };
        assert!(a.send_data(Bytes::copy_from_slice(first), false).is_ok());
        tokio::time::sleep(Duration::from_millis(10)).await;
        // B waits for a slot (A is too young to be displaced); then its client resets it.
        let Ok((answer_b, mut b)) = sender.send_request(post().expect("request"), false) else {
            panic!("B's stream")
        };
        assert!(b.send_data(Bytes::copy_from_slice(first), false).is_ok());
        tokio::time::sleep(Duration::from_millis(10)).await;
        b.send_reset(h2::Reason::CANCEL);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(a.send_data(Bytes::copy_from_slice(rest), true).is_ok());
        let status = answer_a.await.map(|r| r.status().as_u16());
        // Well past the longest B could have waited for a slot (the 2 s idle timeout).
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(status.ok(), Some(200), "A answered");
        assert!(answer_b.await.is_err(), "B was reset");
        let text = metrics.encode();
        let counted: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("smolvm_webhook_bad_requests_total{")
                    || l.starts_with("smolvm_webhook_shed_requests_total{")
            })
            .collect();
        assert!(counted.is_empty(), "the reset stream was answered: {counted:?}");
    }
}
