//! Interactive exec: Kubernetes' streaming channel protocol (`v5.channel.k8s.io`, and
//! `v4.channel.k8s.io` for older clients), as the kubelet speaks it for `pods/exec` and the API
//! server relays it, so `kubectl`-style clients (client-go's WebSocket executor, kube-rs's
//! `AttachedProcess`) work unchanged against `smolvms/exec`.
//!
//! Every message is a binary WebSocket frame whose first byte names a channel: `0` stdin,
//! `1` stdout, `2` stderr, `3` the final status (a `metav1.Status`), `4` terminal resizes
//! (`{"Width":W,"Height":H}`), and in v5 `255` closes a channel (`[255, 0]`: end of stdin).
//!
//! The query names the session as `pods/exec` does: `command` (repeated: the program, then each
//! argument), `stdin`, `stdout`, `stderr`, `tty`. Pure: parsing, framing, the status; the I/O
//! is in the runtime agent and the access API.

/// The subprotocols served, preferred first.
pub const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// Channel of the command's standard input (client to server).
pub const STDIN: u8 = 0;
/// Channel of the command's standard output.
pub const STDOUT: u8 = 1;
/// Channel of the command's standard error (merged into stdout on a terminal).
pub const STDERR: u8 = 2;
/// Channel of the final status, written once when the session ends.
pub const STATUS: u8 = 3;
/// Channel of terminal resizes (client to server).
pub const RESIZE: u8 = 4;
/// v5: closes the channel named by the next byte.
pub const CLOSE: u8 = 255;

/// Longest command (program and arguments, bytes in all) an interactive exec takes.
pub const MAX_COMMAND_BYTES: usize = 32 * 1024;

/// What an interactive exec asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecStreamQuery {
    /// The program and its arguments (not run through a shell).
    pub command: Vec<String>,
    /// The client sends stdin.
    pub stdin: bool,
    /// The client wants stdout.
    pub stdout: bool,
    /// The client wants stderr apart (never with a terminal, which merges it into stdout).
    pub stderr: bool,
    /// Run the command on a terminal (raw keys in, resizes honoured).
    pub tty: bool,
}

impl ExecStreamQuery {
    /// Parses a query string (`command=sh&command=-c&command=ls&stdin=true&tty=true`). As for
    /// `pods/exec`, a flag left out is false (clients send only the true ones); a terminal with
    /// `stderr=true` is refused, as the kubelet refuses it, and so is a session with no stream
    /// at all. Errors name the parameter, the value and the rule.
    pub fn parse(query: &str) -> Result<Self, String> {
        let mut command = Vec::new();
        let (mut stdin, mut stdout, mut stderr, mut tty) = (None, None, None, None);
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            let flag = |slot: &mut Option<bool>| -> Result<(), String> {
                *slot = Some(match value.as_ref() {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    other => return Err(format!("{key}={other:?}: must be true or false")),
                });
                Ok(())
            };
            match key.as_ref() {
                "command" => command.push(value.into_owned()),
                "stdin" => flag(&mut stdin)?,
                "stdout" => flag(&mut stdout)?,
                "stderr" => flag(&mut stderr)?,
                "tty" => flag(&mut tty)?,
                "container" => {
                    return Err(format!(
                        "container={value:?}: a SmolVM has no containers; leave container out"
                    ));
                }
                other => {
                    return Err(format!(
                        "unknown query parameter {other:?} for smolvms/exec; known: command, stdin, stdout, stderr, tty"
                    ));
                }
            }
        }
        if command.first().is_none_or(String::is_empty) {
            return Err(
                "command is required: give the program, then each argument, as repeated command=… parameters".into(),
            );
        }
        let bytes: usize = command.iter().map(String::len).sum();
        if bytes > MAX_COMMAND_BYTES {
            return Err(format!(
                "command is {bytes} bytes long: at most {MAX_COMMAND_BYTES} bytes for the program and its arguments"
            ));
        }
        let parsed = Self {
            command,
            stdin: stdin.unwrap_or(false),
            stdout: stdout.unwrap_or(false),
            stderr: stderr.unwrap_or(false),
            tty: tty.unwrap_or(false),
        };
        if parsed.tty && parsed.stderr {
            return Err("stderr=true with tty=true: a terminal merges stderr into stdout; leave stderr out".into());
        }
        if !(parsed.stdin || parsed.stdout || parsed.stderr) {
            return Err("stdin, stdout and stderr are all false: at least one stream is required".into());
        }
        Ok(parsed)
    }

    /// The query string, every parameter explicit; [`ExecStreamQuery::parse`] reads it back.
    pub fn to_query(&self) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        for part in &self.command {
            out.append_pair("command", part);
        }
        for (key, on) in [
            ("stdin", self.stdin),
            ("stdout", self.stdout),
            ("stderr", self.stderr),
            ("tty", self.tty),
        ] {
            out.append_pair(key, if on { "true" } else { "false" });
        }
        out.finish()
    }
}

/// A message from the client, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound<'a> {
    /// Bytes for the command's stdin.
    Stdin(&'a [u8]),
    /// The client's terminal has this size.
    Resize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// The client's stdin ended (v5 `[255, 0]`).
    CloseStdin,
    /// Nothing to act on (an empty frame, or a v5 close of a channel the client does not write).
    Nothing,
}

/// Decodes one binary frame from the client. A frame on a channel only the server writes, on
/// an unknown channel, or a resize that is not `{"Width":W,"Height":H}` is an error naming it.
pub fn decode(frame: &[u8]) -> Result<Inbound<'_>, String> {
    let Some((&channel, data)) = frame.split_first() else {
        return Ok(Inbound::Nothing);
    };
    match channel {
        STDIN => Ok(if data.is_empty() {
            Inbound::Nothing
        } else {
            Inbound::Stdin(data)
        }),
        RESIZE => {
            #[derive(serde::Deserialize)]
            #[serde(rename_all = "PascalCase")]
            struct TerminalSize {
                width: u16,
                height: u16,
            }
            let size: TerminalSize = serde_json::from_slice(data)
                .map_err(|e| format!("resize message on channel 4 is not {{\"Width\":W,\"Height\":H}}: {e}"))?;
            Ok(Inbound::Resize {
                cols: size.width,
                rows: size.height,
            })
        }
        CLOSE => match data {
            [STDIN] => Ok(Inbound::CloseStdin),
            [_] => Ok(Inbound::Nothing),
            _ => Err(format!(
                "close message on channel 255 must name one channel; it has {} bytes",
                data.len()
            )),
        },
        STDOUT | STDERR | STATUS => Err(format!("channel {channel} is written by the server only")),
        other => Err(format!("unknown channel {other}")),
    }
}

/// `data` on `channel`: one binary frame.
pub fn frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 1);
    out.push(channel);
    out.extend_from_slice(data);
    out
}

/// How a session ended, for its final status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The command exited with this code.
    Exited(i32),
    /// The session failed (the message says why, for the user).
    Failed(String),
}

/// The final status (channel 3) of a session, as the kubelet writes it: `Success` for exit 0;
/// `NonZeroExitCode` with the code as the `ExitCode` cause for any other exit (what clients turn
/// into their own exit code); `InternalError` when the session failed without an exit.
pub fn status(ending: &Ending) -> serde_json::Value {
    let meta = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}});
    let mut status = match ending {
        Ending::Exited(0) => serde_json::json!({"status": "Success"}),
        Ending::Exited(code) => serde_json::json!({
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "message": format!("command terminated with non-zero exit code: {code}"),
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Ending::Failed(why) => serde_json::json!({
            "status": "Failure",
            "reason": "InternalError",
            "code": 500,
            "message": why,
        }),
    };
    if let (Some(status), Some(meta)) = (status.as_object_mut(), meta.as_object()) {
        status.extend(meta.clone());
    }
    status
}

/// The exit code a status from channel 3 carries: 0 for `Success`, the `ExitCode` cause for
/// `NonZeroExitCode`, `None` for anything else (a failed session). For clients and tests.
pub fn exit_code_of(status: &serde_json::Value) -> Option<i32> {
    match status.get("status").and_then(|s| s.as_str()) {
        Some("Success") => Some(0),
        _ if status.get("reason").and_then(|r| r.as_str()) == Some("NonZeroExitCode") => status
            .pointer("/details/causes")
            .and_then(|c| c.as_array())
            .and_then(|causes| {
                causes
                    .iter()
                    .find(|c| c.get("reason").and_then(|r| r.as_str()) == Some("ExitCode"))
            })
            .and_then(|c| c.get("message"))
            .and_then(|m| m.as_str())
            .and_then(|m| m.parse().ok()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        let q = |command: &[&str], stdin, stdout, stderr, tty| ExecStreamQuery {
            command: command.iter().map(|s| s.to_string()).collect(),
            stdin,
            stdout,
            stderr,
            tty,
        };
        let ok = [
            (
                "command=sh&stdin=true&stdout=true&tty=true",
                q(&["sh"], true, true, false, true),
            ),
            (
                "command=ls&command=-l&command=%2Ftmp&stdout=true&stderr=true",
                q(&["ls", "-l", "/tmp"], false, true, true, false),
            ),
            (
                "&stdout=true&command=echo&command=&command=a+b",
                q(&["echo", "", "a b"], false, true, false, false),
            ),
            (
                "command=sh&stdin=1&stdout=0&stderr=0",
                q(&["sh"], true, false, false, false),
            ),
            (
                "stdout=true&command=sh&tty=false&stderr=false",
                q(&["sh"], false, true, false, false),
            ),
        ];
        for (query, want) in ok {
            let got = ExecStreamQuery::parse(query).unwrap_or_else(|e| panic!("{query}: {e}"));
            assert_eq!(got, want, "{query}");
            assert_eq!(ExecStreamQuery::parse(&got.to_query()), Ok(got), "{query} round trip");
        }
        let long = format!("command={}", "a".repeat(MAX_COMMAND_BYTES + 1));
        let bad = [
            ("", "command is required"),
            ("stdin=true", "command is required"),
            ("command=&command=x", "command is required"),
            ("command=sh&tty=yes", "tty=\"yes\": must be true or false"),
            ("command=sh&tty=true&stderr=true", "stderr=true with tty=true"),
            ("command=sh&stdout=false&stderr=false", "at least one stream"),
            ("command=sh", "at least one stream"),
            ("command=sh&container=main", "no containers"),
            ("command=sh&shell=bash", "unknown query parameter \"shell\""),
            (long.as_str(), "at most 32768 bytes"),
        ];
        for (query, want) in bad {
            let err = ExecStreamQuery::parse(query).expect_err(query);
            assert!(err.contains(want), "{query}: {err}");
        }
    }

    #[test]
    fn frames_from_the_client() {
        let cases: [(&[u8], Result<Inbound<'_>, &str>); 10] = [
            (b"", Ok(Inbound::Nothing)),
            (b"\x00", Ok(Inbound::Nothing)),
            (b"\x00ls\n", Ok(Inbound::Stdin(b"ls\n"))),
            (
                b"\x04{\"Width\":120,\"Height\":40}",
                Ok(Inbound::Resize { cols: 120, rows: 40 }),
            ),
            (b"\x04{\"width\":1}", Err("resize message on channel 4")),
            (b"\xff\x00", Ok(Inbound::CloseStdin)),
            (b"\xff\x01", Ok(Inbound::Nothing)),
            (b"\xff\x00\x01", Err("must name one channel")),
            (b"\x01out", Err("channel 1 is written by the server only")),
            (b"\x07", Err("unknown channel 7")),
        ];
        for (bytes, want) in cases {
            match (decode(bytes), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{bytes:?}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{bytes:?}: {got}"),
                (got, want) => panic!("{bytes:?}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(frame(STDOUT, b"hi"), b"\x01hi");
    }

    #[test]
    fn statuses_carry_the_exit_code() {
        let cases = [
            (Ending::Exited(0), "Success", None, Some(0)),
            (Ending::Exited(3), "Failure", Some("NonZeroExitCode"), Some(3)),
            (Ending::Exited(-1), "Failure", Some("NonZeroExitCode"), Some(-1)),
            (
                Ending::Failed("agent went away".into()),
                "Failure",
                Some("InternalError"),
                None,
            ),
        ];
        for (ending, state, reason, code) in cases {
            let s = status(&ending);
            assert_eq!(s["kind"], "Status", "{ending:?}");
            assert_eq!(s["apiVersion"], "v1", "{ending:?}");
            assert_eq!(s["status"], state, "{ending:?}");
            assert_eq!(s.get("reason").and_then(|r| r.as_str()), reason, "{ending:?}");
            assert_eq!(exit_code_of(&s), code, "{ending:?}");
        }
    }
}
