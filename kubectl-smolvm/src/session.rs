//! `kubectl smolvm exec -t` (and `-it`): an interactive command over Kubernetes' WebSocket
//! channel protocol (`v5.channel.k8s.io`), the same protocol `kubectl exec` speaks to a pod,
//! through the API server to the SmolVM's node. Local keys go to the remote terminal in raw
//! mode, its output comes back as it is written, a local resize follows, and the remote
//! command's exit code becomes ours.

use std::borrow::Cow;
use std::io::Read as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Status};
use kube::api::{Api, AttachParams, Execute, TerminalSize};
use serde::Deserialize;
use tokio::io::{AsyncWrite, AsyncWriteExt as _};

use crate::cli::{ExecArgs, GlobalArgs};
use crate::client::Cluster;
use crate::error::{Error, clean};
use crate::exec::exit_code_for;
use crate::paths::{self, check_name};
use crate::terminal;

/// A SmolVM as the subresource API sees it: only its address (`…/smolvms/NAME`), so kube's
/// `exec` can open `…/smolvms/NAME/exec` in `subresources.vm.smolvm.dev`.
#[derive(Clone, Debug, Deserialize)]
pub struct SmolVMSubresources {
    /// Unused; the API is only ever asked for `exec`.
    pub metadata: ObjectMeta,
}

impl kube::Resource for SmolVMSubresources {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        paths::KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        paths::SUBRESOURCE_GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        paths::SUBRESOURCE_VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        paths::PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Execute for SmolVMSubresources {}

/// What the session asks the server for: stdin when it is sent, a terminal when there is one,
/// stderr apart only without a terminal.
pub fn attach_params(stdin: bool, tty: bool) -> AttachParams {
    AttachParams::default().stdin(stdin).stdout(true).stderr(!tty).tty(tty)
}

/// The exit code a session's final status gives: the command's own (0 for `Success`, the
/// `ExitCode` cause of `NonZeroExitCode`, 255 for one outside 0..=255), or why the session
/// failed without one.
pub fn exit_code_of(status: Option<&Status>) -> Result<u8, String> {
    let Some(status) = status else {
        return Err("the session ended without a status from the server".into());
    };
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    let reason = status.reason.as_deref().unwrap_or_default();
    if reason == "NonZeroExitCode"
        && let Some(code) = status
            .details
            .as_ref()
            .and_then(|d| d.causes.as_ref())
            .and_then(|causes| causes.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
            .and_then(|c| c.message.as_deref())
            .and_then(|m| m.parse::<i64>().ok())
    {
        return Ok(exit_code_for(code));
    }
    Err(match status.message.as_deref() {
        Some(message) if !message.is_empty() => message.to_string(),
        _ => format!("the session failed ({reason})"),
    })
}

/// Runs the command attached and returns the exit code to end with: on a terminal (`tty`, stdin
/// sent as typed with `-i`), or without one (output only: stdin's end could not reach the
/// command, so piped input takes the one-shot path instead; see [`crate::exec::run`]).
pub async fn run(global: &GlobalArgs, args: &ExecArgs, tty: bool) -> Result<u8, Error> {
    check_name(&args.name)?;
    if !args.env.is_empty() || args.workdir.is_some() || args.timeout.is_some() {
        return Err(Error::InvalidArgument(
            "-e/--env, -w/--workdir and --timeout apply to one-shot commands; an interactive session (-t) \
             runs the command as given (set variables in it: kubectl smolvm exec -it NAME -- env KEY=VALUE sh)"
                .into(),
        ));
    }
    let cluster = Cluster::connect(global).await?;
    let api: Api<SmolVMSubresources> = Api::namespaced(cluster.client(), cluster.namespace());
    let params = attach_params(args.stdin && tty, tty);
    let mut process = cluster
        .bounded(async {
            api.exec(&args.name, args.command.clone(), &params)
                .await
                .map_err(Error::from)
        })
        .await?;

    // Raw mode from here on; restored when `_raw` drops, whatever happens next.
    let _raw = if tty {
        Some(terminal::RawMode::enable().map_err(|e| Error::Stdio("set the terminal to raw mode", e))?)
    } else {
        None
    };
    if tty && let Some(mut sizes) = process.terminal_size() {
        // The size now, then after each change of the local terminal (SIGWINCH).
        tokio::spawn(async move {
            let mut changes = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
            loop {
                if let Some((width, height)) = terminal::size()
                    && futures::SinkExt::send(&mut sizes, TerminalSize { width, height })
                        .await
                        .is_err()
                {
                    return;
                }
                let Some(changes) = changes.as_mut() else { return };
                if changes.recv().await.is_none() {
                    return;
                }
            }
        });
    }
    if let Some(mut remote_stdin) = process.stdin() {
        // A thread of its own: a blocked read of stdin must never hold up the exit.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(8);
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin();
            let mut buffer = vec![0u8; 8192];
            while let Ok(n) = stdin.read(&mut buffer) {
                if n == 0 || tx.blocking_send(buffer[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        tokio::spawn(async move {
            while let Some(chunk) = rx.recv().await {
                if remote_stdin.write_all(&chunk).await.is_err() || remote_stdin.flush().await.is_err() {
                    return;
                }
            }
            let _ = remote_stdin.shutdown().await;
        });
    }
    let stdout = process
        .stdout()
        .map(|out| tokio::spawn(copy_out(out, tokio::io::stdout())));
    let stderr = process
        .stderr()
        .map(|err| tokio::spawn(copy_out(err, tokio::io::stderr())));
    let status = match process.take_status() {
        Some(status) => status.await,
        None => None,
    };
    for copy in [stdout, stderr].into_iter().flatten() {
        let _ = copy.await;
    }
    let _ = process.join().await;
    drop(_raw);
    exit_code_of(status.as_ref()).map_err(|why| Error::SessionFailed(clean(&why)))
}

/// Copies one remote stream to a local one as it arrives; a local reader that went away ends it.
async fn copy_out(mut from: impl tokio::io::AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match tokio::io::AsyncReadExt::read(&mut from, &mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buffer[..n]).await.is_err() || to.flush().await.is_err() {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    use super::*;

    #[test]
    fn sessions_ask_for_what_the_flags_say() {
        let cases = [
            // (-i, terminal) → (stdin, stdout, stderr, tty)
            ((true, true), (true, true, false, true)),
            ((false, true), (false, true, false, true)),
            ((true, false), (true, true, true, false)),
            ((false, false), (false, true, true, false)),
        ];
        for ((stdin, tty), want) in cases {
            let p = attach_params(stdin, tty);
            assert_eq!((p.stdin, p.stdout, p.stderr, p.tty), want, "-i {stdin} tty {tty}");
        }
    }

    #[test]
    fn exit_codes_come_from_the_status() {
        let status = |state: &str, reason: &str, causes: &[(&str, &str)], message: &str| Status {
            status: Some(state.into()),
            reason: (!reason.is_empty()).then(|| reason.into()),
            message: (!message.is_empty()).then(|| message.into()),
            details: Some(StatusDetails {
                causes: Some(
                    causes
                        .iter()
                        .map(|(reason, message)| StatusCause {
                            reason: Some(reason.to_string()),
                            message: Some(message.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let exit = |code| status("Failure", "NonZeroExitCode", &[("ExitCode", code)], "");
        let cases = [
            (Some(status("Success", "", &[], "")), Ok(0)),
            (Some(exit("3")), Ok(3)),
            (Some(exit("300")), Ok(255)),
            (Some(exit("-1")), Ok(255)),
            (
                Some(status("Failure", "NonZeroExitCode", &[], "command terminated")),
                Err("command terminated".to_string()),
            ),
            (
                Some(status(
                    "Failure",
                    "InternalError",
                    &[],
                    "the runtime could not run the command",
                )),
                Err("the runtime could not run the command".to_string()),
            ),
            (
                Some(status("Failure", "InternalError", &[], "")),
                Err("the session failed (InternalError)".to_string()),
            ),
            (
                None,
                Err("the session ended without a status from the server".to_string()),
            ),
        ];
        for (status, want) in cases {
            assert_eq!(exit_code_of(status.as_ref()), want, "{status:?}");
        }
    }

    #[test]
    fn the_session_opens_the_exec_subresource() {
        let url = <SmolVMSubresources as kube::Resource>::url_path(&(), Some("team-a"));
        assert_eq!(
            url,
            "/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/team-a/smolvms"
        );
    }
}
