//! `kubectl smolvm exec`: one command, run to its end in the machine; its stdout and stderr
//! written here byte for byte, its exit code made ours. With `-t` and a terminal, [`crate::run`]
//! opens an interactive session instead ([`crate::session`]).

use std::io::Write;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::cli::{EnvVar, ExecArgs, GlobalArgs};
use crate::client::{Cluster, build_request};
use crate::duration::whole_seconds_up;
use crate::error::Error;
use crate::paths::{check_name, exec_url};

/// The most of local stdin `exec -i` sends.
pub const MAX_STDIN_BYTES: u64 = 64 * 1024 * 1024;

/// The body of an exec request; absent parts are left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecRequest {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Environment variables.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// The working directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Text for the command's stdin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// How long the command may run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

/// The answer to an exec request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResponse {
    /// The command's exit code.
    pub exit_code: i64,
    /// Its stdout, standard base64.
    #[serde(default)]
    pub stdout_base64: String,
    /// Its stderr, standard base64.
    #[serde(default)]
    pub stderr_base64: String,
}

/// Builds the request from the flags; `stdin` is what `-i` read.
pub fn request_from(args: &ExecArgs, stdin: Option<String>) -> Result<ExecRequest, Error> {
    let timeout_seconds = match args.timeout {
        Some(d) if d.is_zero() => {
            return Err(Error::InvalidArgument(
                "--timeout must be more than zero (for example 30s or 2m)".into(),
            ));
        }
        Some(d) => Some(whole_seconds_up(d)),
        None => None,
    };
    Ok(ExecRequest {
        command: args.command.clone(),
        env: args.env.clone(),
        working_dir: args.workdir.clone(),
        stdin,
        timeout_seconds,
    })
}

/// The exit code this process ends with for the command's `code`: itself within 0..=255, and a
/// failure (255) for anything outside, so that no failure ever reads as success.
pub fn exit_code_for(code: i64) -> u8 {
    u8::try_from(code).unwrap_or(u8::MAX)
}

/// Runs the command one-shot and returns the exit code to end with.
pub async fn run(global: &GlobalArgs, args: &ExecArgs) -> Result<u8, Error> {
    check_name(&args.name)?;
    let stdin = if args.stdin {
        Some(read_stdin_text().await?)
    } else {
        None
    };
    let body = request_from(args, stdin)?;
    let body =
        serde_json::to_vec(&body).map_err(|e| Error::InvalidArgument(format!("cannot encode the request: {e}")))?;

    let cluster = Cluster::connect(global).await?;
    let url = exec_url(cluster.namespace(), &args.name);
    let request = build_request(http::Method::POST, &url, Some("application/json"), body)?;
    let answer: ExecResponse = cluster.request_json(request).await?;

    let stdout = decode(&answer.stdout_base64, "stdoutBase64")?;
    let stderr = decode(&answer.stderr_base64, "stderrBase64")?;
    write_all_or_gone(&mut std::io::stdout().lock(), &stdout, "write stdout")?;
    write_all_or_gone(&mut std::io::stderr().lock(), &stderr, "write stderr")?;
    Ok(exit_code_for(answer.exit_code))
}

/// Reads local stdin to its end, as UTF-8 text of at most [`MAX_STDIN_BYTES`].
async fn read_stdin_text() -> Result<String, Error> {
    let mut bytes = Vec::new();
    tokio::io::stdin()
        .take(MAX_STDIN_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| Error::Stdio("read stdin", e))?;
    if bytes.len() as u64 > MAX_STDIN_BYTES {
        return Err(Error::TooLarge {
            what: "stdin".into(),
            limit: MAX_STDIN_BYTES,
        });
    }
    String::from_utf8(bytes).map_err(|_| Error::StdinNotUtf8)
}

fn decode(text: &str, field: &str) -> Result<Vec<u8>, Error> {
    STANDARD
        .decode(text)
        .map_err(|e| Error::UnexpectedResponse(format!("{field} is not standard base64: {e}")))
}

/// Writes `bytes` and flushes; a reader that went away is not an error.
fn write_all_or_gone(out: &mut impl Write, bytes: &[u8], what: &'static str) -> Result<(), Error> {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::Stdio(what, e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn args(command: &[&str]) -> ExecArgs {
        ExecArgs {
            name: "web".into(),
            stdin: false,
            tty: false,
            timeout: None,
            env: Vec::new(),
            workdir: None,
            command: command.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn exit_codes_stay_failures() {
        let cases = [
            (0, 0),
            (1, 1),
            (42, 42),
            (255, 255),
            (256, 255),
            (-1, 255),
            (i64::MIN, 255),
            (i64::MAX, 255),
        ];
        for (code, want) in cases {
            assert_eq!(exit_code_for(code), want, "{code}");
        }
    }

    #[test]
    fn request_leaves_out_what_was_not_given() {
        let body = serde_json::to_value(request_from(&args(&["ls", "-l"]), None).expect("valid")).expect("json");
        assert_eq!(body, serde_json::json!({"command": ["ls", "-l"]}));

        let mut full = args(&["sh", "-c", "cat"]);
        full.env = vec![EnvVar {
            name: "A".into(),
            value: "b".into(),
        }];
        full.workdir = Some("/x".into());
        full.timeout = Some(Duration::from_millis(1_500));
        let body = serde_json::to_value(request_from(&full, Some("text".into())).expect("valid")).expect("json");
        assert_eq!(
            body,
            serde_json::json!({
                "command": ["sh", "-c", "cat"],
                "env": [{"name": "A", "value": "b"}],
                "workingDir": "/x",
                "stdin": "text",
                "timeoutSeconds": 2
            })
        );

        let mut zero = args(&["ls"]);
        zero.timeout = Some(Duration::ZERO);
        assert_eq!(
            request_from(&zero, None).map_err(|e| e.reason()),
            Err("InvalidArgument")
        );
    }

    #[test]
    fn answers_decode() {
        let answer: ExecResponse =
            serde_json::from_str(r#"{"exitCode":3,"stdoutBase64":"aGk=","stderrBase64":"","extra":1}"#)
                .expect("decodes");
        assert_eq!(answer.exit_code, 3);
        assert_eq!(decode(&answer.stdout_base64, "stdoutBase64").expect("base64"), b"hi");
        assert_eq!(decode(&answer.stderr_base64, "stderrBase64").expect("base64"), b"");
        assert_eq!(
            decode("not base64!", "stdoutBase64").map_err(|e| e.reason()),
            Err("UnexpectedResponse")
        );

        let bare: ExecResponse = serde_json::from_str(r#"{"exitCode":0}"#).expect("decodes");
        assert!(bare.stdout_base64.is_empty());
    }

    #[test]
    fn output_is_written_exactly() {
        let mut out = Vec::new();
        write_all_or_gone(&mut out, b"\x00\xff\r\n", "write stdout").expect("writes");
        assert_eq!(out, b"\x00\xff\r\n");
    }
}
