//! Interactive exec on the node API: a WebSocket in Kubernetes' channel protocol
//! ([`smolvm_api::channel`]) bridged to a runtime [`Session`]. The access API passes the
//! client's upgrade through to here unchanged, so this is where the protocol is spoken, as the
//! kubelet speaks it for `pods/exec`.
//!
//! Each direction moves on its own: the caller's frames go to the command while the command's
//! output goes to the caller, each through a bounded buffer. A slow reader slows only the
//! command's output (as a full pipe would); input keeps flowing and the caller's going is seen
//! at once. A ping every [`PING_INTERVAL`] makes a vanished caller visible even when nothing
//! else moves.
//!
//! [`Streams`] caps the exec (one-shot and interactive) and log-follow streams open at once, per
//! machine and per node; beyond a cap the node API answers 429 `TooManyStreams`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt as _, Stream, StreamExt as _};
use smolvm_api::channel::{self, Ending, ExecStreamQuery, Inbound};
use tokio::sync::mpsc;

use super::failure::ApiFailure;
use super::types::ErrorCode;
use crate::vmm::{Session, SessionInput, SessionOutput};

/// How often the bridge pings the caller, so that a caller gone without a word is noticed by
/// the failed write even while the command is silent.
pub const PING_INTERVAL: Duration = Duration::from_secs(2);

/// How long the final status and close may take to reach a caller who does not read.
const FINAL_SEND: Duration = Duration::from_secs(5);

/// Moves one session's frames both ways until it ends: the command's output on channels 1
/// and 2, then its status on channel 3 and a normal close. The client going away (or sending
/// what the protocol does not allow) ends the session, and the command with it.
pub async fn bridge(socket: WebSocket, session: Session, query: ExecStreamQuery) {
    let Session { input, mut output } = session;
    let (mut sink, mut stream) = socket.split();
    let ending = tokio::select! {
        ending = caller_to_command(&mut stream, &input, &query) => ending,
        ending = command_to_caller(&mut sink, &mut output, &query) => ending,
    };
    // Ends the command if it still runs (the runtime closes smolvm's socket and smolvm kills
    // it), whichever side ended first.
    drop(input);
    drop(output);
    match ending {
        Some(ending) => send_status(&mut sink, &ending).await,
        None => tracing::info!("interactive exec ended by the client"),
    }
}

/// Caller → command: stdin and resizes, as far as the query allows them. Waiting for room in
/// the input buffer holds only this direction. `None` when the caller went; how the session
/// failed when the caller broke the protocol.
async fn caller_to_command(
    stream: &mut SplitStream<WebSocket>,
    input: &mpsc::Sender<SessionInput>,
    query: &ExecStreamQuery,
) -> Option<Ending> {
    while let Some(incoming) = stream.next().await {
        let sent = match incoming {
            Ok(Message::Binary(bytes)) => match channel::decode(&bytes) {
                Ok(Inbound::Stdin(data)) if query.stdin => {
                    let data = bytes::Bytes::copy_from_slice(data);
                    input.send(SessionInput::Stdin(data)).await
                }
                Ok(Inbound::Resize { cols, rows }) if query.tty => {
                    input.send(SessionInput::Resize { cols, rows }).await
                }
                // The runtime has no way to close a command's stdin alone; on a terminal the
                // user's end-of-file travels as a key. Anything else needs no action.
                Ok(_) => Ok(()),
                Err(why) => return Some(Ending::Failed(format!("protocol error: {why}"))),
            },
            Ok(Message::Text(_)) => {
                return Some(Ending::Failed(
                    "protocol error: text frames are not part of v5.channel.k8s.io; send binary frames".into(),
                ));
            }
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => Ok(()),
        };
        if sent.is_err() {
            // The runtime's side is gone; the output direction brings how it ended.
            std::future::pending::<()>().await;
        }
    }
    None
}

/// Command → caller: its output on the channels the query asked for, a ping every
/// [`PING_INTERVAL`] meanwhile. Waiting for a slow caller holds only this direction. How the
/// command ended, or `None` when the caller could not be written to.
async fn command_to_caller(
    sink: &mut SplitSink<WebSocket, Message>,
    output: &mut mpsc::Receiver<SessionOutput>,
    query: &ExecStreamQuery,
) -> Option<Ending> {
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_INTERVAL, PING_INTERVAL);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let frame = tokio::select! {
            out = output.recv() => match out {
                Some(SessionOutput::Stdout(bytes)) if query.stdout => channel::frame(channel::STDOUT, &bytes),
                Some(SessionOutput::Stderr(bytes)) if query.stderr => channel::frame(channel::STDERR, &bytes),
                Some(SessionOutput::Stdout(_) | SessionOutput::Stderr(_)) => continue,
                Some(SessionOutput::Ended(ending)) => return Some(ending),
                None => {
                    return Some(Ending::Failed(
                        "the runtime ended the session without an exit code".into(),
                    ));
                }
            },
            _ = ping.tick() => {
                if sink.send(Message::Ping(bytes::Bytes::new())).await.is_err() {
                    return None;
                }
                continue;
            }
        };
        if sink.send(Message::Binary(frame.into())).await.is_err() {
            return None;
        }
    }
}

/// How the command ended, on channel 3, then a normal close: within [`FINAL_SEND`], for a
/// caller who does not read.
async fn send_status(sink: &mut SplitSink<WebSocket, Message>, ending: &Ending) {
    match ending {
        Ending::Exited(code) => tracing::info!(code, "interactive exec ended"),
        Ending::Failed(why) => tracing::info!(%why, "interactive exec failed"),
    }
    let status = channel::status(ending).to_string();
    let goodbye = async {
        sink.send(Message::Binary(
            channel::frame(channel::STATUS, status.as_bytes()).into(),
        ))
        .await?;
        sink.send(Message::Close(Some(CloseFrame {
            code: close_code::NORMAL,
            reason: "".into(),
        })))
        .await
    };
    let _ = tokio::time::timeout(FINAL_SEND, goodbye).await;
}

/// How many exec and log-follow streams may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// On one machine.
    pub per_machine: usize,
    /// On the node, all machines together.
    pub per_node: usize,
}

impl Default for StreamLimits {
    /// The flags' defaults (`smolvm-runtime --help`).
    fn default() -> Self {
        Self {
            per_machine: 8,
            per_node: 64,
        }
    }
}

/// Which cap a stream met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamCap {
    /// The machine's.
    Machine,
    /// The node's.
    Node,
}

/// Whether one more stream may open on a machine with `of_machine` open, `open` on the node.
pub fn admit(open: usize, of_machine: usize, limits: &StreamLimits) -> Result<(), StreamCap> {
    if of_machine >= limits.per_machine {
        Err(StreamCap::Machine)
    } else if open >= limits.per_node {
        Err(StreamCap::Node)
    } else {
        Ok(())
    }
}

/// The 429 `TooManyStreams` for `machine` at `cap`; `details` name the scope and the limit.
pub fn too_many_streams(machine: &str, cap: StreamCap, limits: &StreamLimits) -> ApiFailure {
    let (scope, limit, message) = match cap {
        StreamCap::Machine => (
            "machine",
            limits.per_machine,
            format!(
                "machine '{machine}' has {} exec and log streams open, the most allowed per machine; retry when one ends",
                limits.per_machine
            ),
        ),
        StreamCap::Node => (
            "node",
            limits.per_node,
            format!(
                "this node has {} exec and log streams open, the most it allows; retry when one ends",
                limits.per_node
            ),
        ),
    };
    ApiFailure::new(ErrorCode::TooManyStreams, message)
        .with_details(serde_json::json!({ "scope": scope, "limit": limit }))
}

#[derive(Debug, Default)]
struct OpenStreams {
    total: usize,
    by_machine: HashMap<String, usize>,
}

/// The exec and log-follow streams open now; [`Streams::open`] admits one more or says which
/// cap it met.
#[derive(Debug)]
pub struct Streams {
    limits: StreamLimits,
    open: Mutex<OpenStreams>,
}

impl Streams {
    /// No stream open yet.
    pub fn new(limits: StreamLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            open: Mutex::default(),
        })
    }

    /// The caps.
    pub fn limits(&self) -> StreamLimits {
        self.limits
    }

    /// Streams open now, on the node.
    pub fn open_now(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OpenStreams> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more stream on `machine`, held until the permit drops.
    pub fn open(self: &Arc<Self>, machine: &str) -> Result<StreamPermit, StreamCap> {
        let mut open = self.lock();
        let of_machine = open.by_machine.get(machine).copied().unwrap_or(0);
        admit(open.total, of_machine, &self.limits)?;
        open.total += 1;
        *open.by_machine.entry(machine.to_string()).or_default() += 1;
        Ok(StreamPermit {
            streams: self.clone(),
            machine: machine.to_string(),
            session: None,
        })
    }
}

/// One open stream; dropping it closes the slot (and ends its session of use).
#[derive(Debug)]
pub struct StreamPermit {
    streams: Arc<Streams>,
    machine: String,
    session: Option<crate::activity::Session>,
}

impl StreamPermit {
    /// The permit, holding `session` (the machine is in use while the stream is open).
    pub fn in_use(mut self, session: crate::activity::Session) -> Self {
        self.session = Some(session);
        self
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.streams.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_machine.get_mut(&self.machine) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.by_machine.remove(&self.machine);
            }
        }
    }
}

/// A stream that holds a [`StreamPermit`] for as long as it lives (a response body, which the
/// server drops when the client goes).
pub struct Held<S> {
    inner: S,
    _permit: StreamPermit,
}

impl<S> Held<S> {
    /// `inner`, holding `permit`.
    pub fn new(inner: S, permit: StreamPermit) -> Self {
        Self { inner, _permit: permit }
    }
}

impl<S: Stream + Unpin> Stream for Held<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_table() {
        let limits = StreamLimits {
            per_machine: 2,
            per_node: 3,
        };
        // (open on the node, open on the machine, answer)
        let cases = [
            (0, 0, Ok(())),
            (2, 1, Ok(())),
            (2, 2, Err(StreamCap::Machine)),
            (3, 0, Err(StreamCap::Node)),
            (3, 2, Err(StreamCap::Machine)),
        ];
        for (open, of_machine, want) in cases {
            assert_eq!(admit(open, of_machine, &limits), want, "{open} {of_machine}");
        }
    }

    #[test]
    fn permits_count_per_machine_and_node_and_free_on_drop() {
        let streams = Streams::new(StreamLimits {
            per_machine: 2,
            per_node: 3,
        });
        let a1 = streams.open("a").expect("a1");
        let a2 = streams.open("a").expect("a2");
        assert_eq!(streams.open("a").map(drop), Err(StreamCap::Machine));
        let b1 = streams.open("b").expect("b1");
        assert_eq!(streams.open("b").map(drop), Err(StreamCap::Node));
        assert_eq!(streams.open_now(), 3);
        drop(a1);
        let b2 = streams.open("b").expect("b2 once a slot is free");
        drop((a2, b1, b2));
        assert_eq!(streams.open_now(), 0);
        assert!(streams.lock().by_machine.is_empty(), "no entry outlives its streams");
    }

    #[test]
    fn the_refusal_names_scope_and_limit() {
        let limits = StreamLimits::default();
        for (cap, scope, limit) in [(StreamCap::Machine, "machine", 8), (StreamCap::Node, "node", 64)] {
            let failure = too_many_streams("web", cap, &limits);
            assert_eq!(failure.status, 429);
            assert_eq!(failure.body.code, ErrorCode::TooManyStreams);
            let details = failure.body.details.expect("details");
            assert_eq!(details["scope"], scope);
            assert_eq!(details["limit"], limit);
        }
    }
}
