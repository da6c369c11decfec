//! Interactive exec on the node API: a WebSocket in Kubernetes' channel protocol
//! ([`smolvm_api::channel`]) bridged to a runtime [`Session`]. The access API passes the
//! client's upgrade through to here unchanged, so this is where the protocol is spoken, as the
//! kubelet speaks it for `pods/exec`.

use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use smolvm_api::channel::{self, Ending, ExecStreamQuery, Inbound};

use crate::vmm::{Session, SessionInput, SessionOutput};

/// Moves one session's frames both ways until it ends: the command's output on channels 1
/// and 2, then its status on channel 3 and a normal close. The client going away (or sending
/// what the protocol does not allow) ends the session, and the command with it.
pub async fn bridge(mut socket: WebSocket, session: Session, query: ExecStreamQuery) {
    let Session { input, mut output } = session;
    let ending = loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Binary(bytes))) => match channel::decode(&bytes) {
                    Ok(Inbound::Stdin(data)) if query.stdin => {
                        let data = bytes::Bytes::copy_from_slice(data);
                        if input.send(SessionInput::Stdin(data)).await.is_err() {
                            break None;
                        }
                    }
                    Ok(Inbound::Resize { cols, rows }) if query.tty => {
                        if input.send(SessionInput::Resize { cols, rows }).await.is_err() {
                            break None;
                        }
                    }
                    // The runtime has no way to close a command's stdin alone; on a terminal the
                    // user's end-of-file travels as a key. Anything else needs no action.
                    Ok(_) => {}
                    Err(why) => break Some(Ending::Failed(format!("protocol error: {why}"))),
                },
                Some(Ok(Message::Text(_))) => {
                    break Some(Ending::Failed(
                        "protocol error: text frames are not part of v5.channel.k8s.io; send binary frames".into(),
                    ));
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break None,
                Some(Ok(_)) => {}
            },
            out = output.recv() => match out {
                Some(SessionOutput::Stdout(bytes)) if query.stdout => {
                    if socket.send(Message::Binary(channel::frame(channel::STDOUT, &bytes).into())).await.is_err() {
                        break None;
                    }
                }
                Some(SessionOutput::Stderr(bytes)) if query.stderr => {
                    if socket.send(Message::Binary(channel::frame(channel::STDERR, &bytes).into())).await.is_err() {
                        break None;
                    }
                }
                Some(SessionOutput::Stdout(_) | SessionOutput::Stderr(_)) => {}
                Some(SessionOutput::Ended(ending)) => break Some(ending),
                None => break Some(Ending::Failed("the runtime ended the session without an exit code".into())),
            },
        }
    };
    // Ends the command if it still runs (smolvm kills it when its socket closes).
    drop(input);
    if let Some(ending) = ending {
        match &ending {
            Ending::Exited(code) => tracing::info!(code, "interactive exec ended"),
            Ending::Failed(why) => tracing::info!(%why, "interactive exec failed"),
        }
        let status = channel::status(&ending).to_string();
        let _ = socket
            .send(Message::Binary(
                channel::frame(channel::STATUS, status.as_bytes()).into(),
            ))
            .await;
        let _ = socket
            .send(Message::Close(Some(CloseFrame {
                code: close_code::NORMAL,
                reason: "".into(),
            })))
            .await;
    } else {
        tracing::info!("interactive exec ended by the client");
    }
}
