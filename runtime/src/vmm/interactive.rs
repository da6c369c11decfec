//! Interactive exec sessions: a command attached to its caller while it runs.
//!
//! [`Session`] is what a [`super::Vmm`] hands the node API: input in, output out, then how it
//! ended. [`open`] makes one against `smolvm serve`'s `GET /api/v1/machines/{id}/exec/interactive`
//! WebSocket (smolvm's own framing: the command in the query string as `cmd` and repeated
//! `arg`; binary frames are stdin and output; text frames carry `{"type":"resize"}`,
//! `{"type":"stderr"}` and the final `{"type":"exit","code":N}`). The translation is pure
//! ([`to_smolvm`], [`from_smolvm`]) and table-tested; [`open`] only moves frames.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use smolvm_api::channel::Ending;
use smolvm_api::text::clean_external;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{self, Message};

use super::VmmError;
use super::smolvm::errors::{Operation, map_error};

/// How many messages wait in each direction before the sender waits (back-pressure).
const SESSION_BUFFER: usize = 16;

/// How long the pump waits, once the caller went, for smolvm to take the close (then it drops
/// the connection, which smolvm takes the same way: it kills the command); and how long, once
/// input could not be sent, for smolvm's exit message still on its way.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How often a pump whose input smolvm does not take looks whether the caller went.
const CALLER_CHECK: Duration = Duration::from_millis(250);

/// What an interactive exec runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InteractiveRequest {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// On a terminal (stderr merged into stdout, resizes honoured).
    pub tty: bool,
}

/// Input for a running command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionInput {
    /// Bytes for its stdin.
    Stdin(Bytes),
    /// Its terminal's new size.
    Resize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
}

/// What a running command gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionOutput {
    /// Bytes of its stdout (and stderr, on a terminal).
    Stdout(Bytes),
    /// Bytes of its stderr (without a terminal).
    Stderr(Bytes),
    /// How it ended; nothing follows.
    Ended(Ending),
}

/// An interactive command. Dropping `input` ends the session and the command with it.
#[derive(Debug)]
pub struct Session {
    /// Input for the command.
    pub input: mpsc::Sender<SessionInput>,
    /// The command's output, then [`SessionOutput::Ended`].
    pub output: mpsc::Receiver<SessionOutput>,
}

impl Session {
    /// A session's two ends: the [`Session`] for the caller, and the runtime's side (`input`
    /// to read, `output` to write).
    pub fn pair() -> (Session, mpsc::Receiver<SessionInput>, mpsc::Sender<SessionOutput>) {
        let (input_tx, input_rx) = mpsc::channel(SESSION_BUFFER);
        let (output_tx, output_rx) = mpsc::channel(SESSION_BUFFER);
        (
            Session {
                input: input_tx,
                output: output_rx,
            },
            input_rx,
            output_tx,
        )
    }
}

/// The request path (and query) of smolvm's interactive exec for `machine_path`
/// (`/api/v1/machines/<encoded name>`): `cmd` is the program, each argument one `arg`, in order.
pub fn smolvm_path(machine_path: &str, request: &InteractiveRequest) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    let mut parts = request.command.iter();
    if let Some(program) = parts.next() {
        query.append_pair("cmd", program);
    }
    for arg in parts {
        query.append_pair("arg", arg);
    }
    query.append_pair("tty", if request.tty { "true" } else { "false" });
    format!("{machine_path}/exec/interactive?{}", query.finish())
}

/// An input as smolvm's frame.
pub fn to_smolvm(input: SessionInput) -> Message {
    match input {
        SessionInput::Stdin(bytes) => Message::Binary(bytes),
        SessionInput::Resize { cols, rows } => {
            Message::text(serde_json::json!({"type": "resize", "cols": cols, "rows": rows}).to_string())
        }
    }
}

/// What one of smolvm's frames means: output, the end, or nothing (pings, unknown messages).
pub fn from_smolvm(message: &Message) -> Option<SessionOutput> {
    match message {
        Message::Binary(bytes) => Some(SessionOutput::Stdout(bytes.clone())),
        Message::Text(text) => {
            let value: serde_json::Value = serde_json::from_str(text.as_str()).ok()?;
            match value.get("type")?.as_str()? {
                "exit" => Some(SessionOutput::Ended(match value.get("code").and_then(|c| c.as_i64()) {
                    // smolvm's -1: the session failed inside smolvm (agent, pull or run).
                    Some(-1) | None => Ending::Failed("the runtime could not run the command".into()),
                    Some(code) => Ending::Exited(i32::try_from(code).unwrap_or(i32::MAX)),
                })),
                "stderr" => Some(SessionOutput::Stderr(Bytes::from(
                    value.get("data")?.as_str()?.as_bytes().to_vec(),
                ))),
                _ => None,
            }
        }
        Message::Close(_) => Some(SessionOutput::Ended(Ending::Failed(
            "the runtime closed the session without an exit code".into(),
        ))),
        _ => None,
    }
}

/// Opens an interactive exec on smolvm's socket (the WebSocket handshake within `timeout`) and
/// pumps it on a task of its own until either side ends. A refusal before the upgrade is the
/// [`VmmError`] smolvm's answer maps to.
pub async fn open(
    socket: &Path,
    machine_path: &str,
    request: &InteractiveRequest,
    timeout: Duration,
) -> Result<Session, VmmError> {
    let unavailable = |message: String| VmmError::Unavailable { message };
    let path = smolvm_path(machine_path, request);
    let handshake = async {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|e| unavailable(format!("cannot connect to {}: {e}", socket.display())))?;
        tokio_tungstenite::client_async(format!("ws://localhost{path}"), stream)
            .await
            .map_err(|error| match error {
                tungstenite::Error::Http(response) => map_error(
                    Operation::Exec,
                    response.status(),
                    response.body().as_deref().unwrap_or_default(),
                ),
                other => unavailable(format!(
                    "interactive exec: WebSocket handshake with smolvm failed: {}",
                    clean_external(&other.to_string())
                )),
            })
    };
    let (socket, _) = tokio::time::timeout(timeout, handshake).await.map_err(|_| {
        unavailable(format!(
            "interactive exec: smolvm did not answer within {}s",
            timeout.as_secs()
        ))
    })??;
    let (session, input, output) = Session::pair();
    tokio::spawn(pump(socket, input, output));
    Ok(session)
}

/// Moves one session's frames between the caller and smolvm's socket until either side ends.
/// Each direction moves on its own, through the session's bounded buffers: a caller slow to
/// read slows the command's output only (smolvm then stops reading the command's output, as a
/// full pipe would), input keeps going, and the caller's going (its input dropped) closes
/// smolvm's socket at once, whatever the output direction waits for.
async fn pump<S>(
    socket: tokio_tungstenite::WebSocketStream<S>,
    mut input: mpsc::Receiver<SessionInput>,
    output: mpsc::Sender<SessionOutput>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut to_runtime, mut from_runtime) = socket.split();
    // Caller → smolvm. Ends when the caller went (`None`) or smolvm's side broke.
    let inbound = async {
        while let Some(message) = input.recv().await {
            // smolvm may take no input for a long time (a command that reads none, with its
            // output unread): the caller's going is watched meanwhile, not only between sends.
            let sent = tokio::select! {
                sent = to_runtime.send(to_smolvm(message)) => sent,
                () = caller_gone(&input, &output) => return None,
            };
            if sent.is_err() {
                // smolvm's exit message may still be on its way in the other direction.
                tokio::time::sleep(CLOSE_GRACE).await;
                return Some(SessionOutput::Ended(Ending::Failed(
                    "the runtime's session broke while sending input".into(),
                )));
            }
        }
        None
    };
    // smolvm → caller. Ends with the command's end (passed on) or when the caller went.
    let outbound = async {
        loop {
            let out = match from_runtime.next().await {
                Some(Ok(message)) => from_smolvm(&message),
                Some(Err(error)) => Some(SessionOutput::Ended(Ending::Failed(format!(
                    "the runtime's session broke: {}",
                    clean_external(&error.to_string())
                )))),
                None => Some(SessionOutput::Ended(Ending::Failed(
                    "the runtime closed the session without an exit code".into(),
                ))),
            };
            let Some(out) = out else { continue };
            let ended = matches!(out, SessionOutput::Ended(_));
            if output.send(out).await.is_err() || ended {
                return None;
            }
        }
    };
    let last = tokio::select! {
        last = inbound => last,
        last = outbound => last,
    };
    if let Some(last) = last {
        let _ = tokio::time::timeout(CLOSE_GRACE, output.send(last)).await;
    }
    // Closing the socket ends the command if it still runs (smolvm kills it); a smolvm that
    // does not take the close in time gets the connection dropped, which it takes the same way.
    let _ = tokio::time::timeout(CLOSE_GRACE, to_runtime.close()).await;
}

/// Resolves once the caller dropped its input (every sender gone, queued input or not) or its
/// output.
async fn caller_gone(input: &mpsc::Receiver<SessionInput>, output: &mpsc::Sender<SessionOutput>) {
    let mut check = tokio::time::interval(CALLER_CHECK);
    loop {
        tokio::select! {
            () = output.closed() => return,
            _ = check.tick() => {
                if input.is_closed() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_carry_the_command_in_order() {
        let cases = [
            (vec!["sh"], true, "/m/a/exec/interactive?cmd=sh&tty=true"),
            (
                vec!["ls", "-l", "/tmp dir", ""],
                false,
                "/m/a/exec/interactive?cmd=ls&arg=-l&arg=%2Ftmp+dir&arg=&tty=false",
            ),
            (vec!["a&b=c"], true, "/m/a/exec/interactive?cmd=a%26b%3Dc&tty=true"),
        ];
        for (command, tty, want) in cases {
            let request = InteractiveRequest {
                command: command.iter().map(|s| s.to_string()).collect(),
                tty,
            };
            assert_eq!(smolvm_path("/m/a", &request), want);
        }
    }

    #[test]
    fn inputs_become_smolvm_frames() {
        assert_eq!(
            to_smolvm(SessionInput::Stdin(Bytes::from_static(b"ls\n"))),
            Message::Binary(Bytes::from_static(b"ls\n"))
        );
        let Message::Text(text) = to_smolvm(SessionInput::Resize { cols: 120, rows: 40 }) else {
            panic!("a resize is a text frame");
        };
        let value: serde_json::Value = serde_json::from_str(text.as_str()).expect("JSON");
        assert_eq!(value, serde_json::json!({"type": "resize", "cols": 120, "rows": 40}));
    }

    #[test]
    fn smolvm_frames_become_outputs() {
        let failed = |m: &str| Some(SessionOutput::Ended(Ending::Failed(m.into())));
        let cases = [
            (
                Message::binary(b"out".to_vec()),
                Some(SessionOutput::Stdout(Bytes::from_static(b"out"))),
            ),
            (
                Message::text(r#"{"type":"stderr","data":"oops\n"}"#),
                Some(SessionOutput::Stderr(Bytes::from_static(b"oops\n"))),
            ),
            (
                Message::text(r#"{"type":"exit","code":0}"#),
                Some(SessionOutput::Ended(Ending::Exited(0))),
            ),
            (
                Message::text(r#"{"type":"exit","code":130}"#),
                Some(SessionOutput::Ended(Ending::Exited(130))),
            ),
            (
                Message::text(r#"{"type":"exit","code":-1}"#),
                failed("the runtime could not run the command"),
            ),
            (
                Message::text(r#"{"type":"exit"}"#),
                failed("the runtime could not run the command"),
            ),
            (Message::text(r#"{"type":"hello"}"#), None),
            (Message::text("not json"), None),
            (Message::Ping(Bytes::new()), None),
            (
                Message::Close(None),
                failed("the runtime closed the session without an exit code"),
            ),
        ];
        for (message, want) in cases {
            assert_eq!(from_smolvm(&message), want, "{message:?}");
        }
    }
}
