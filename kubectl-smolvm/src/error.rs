//! The plugin's one error type, and how an error is told on stderr.
//!
//! Every failure ends the command with exit code 1 and one line on stderr: `error: …` for what
//! went wrong on this side, `Error from server (Reason): …` for a Kubernetes `Status` the server
//! answered, as kubectl prints them. Text that came from elsewhere (a server message, an I/O
//! error) passes through [`clean`] first, so it can neither break the line nor move the cursor.

use std::path::PathBuf;
use std::time::Duration;

use kube::core::Status;

use crate::duration;

/// The longest piece of foreign text (in bytes) an error line carries.
const MAX_FOREIGN_TEXT: usize = 1_000;

/// Everything that can make a `kubectl smolvm` command fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag or argument is not usable (a bad name, `KEY=VALUE`, cp spec, mode or duration).
    #[error("{0}")]
    InvalidArgument(String),

    /// No kubeconfig could be found and this is not running inside a cluster.
    #[error(
        "no configuration: no kubeconfig at $KUBECONFIG or ~/.kube/config and not running in a cluster ({0}); \
         pass --kubeconfig"
    )]
    NoConfiguration(String),

    /// The kubeconfig could not be read or does not name a usable context, cluster or user.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),

    /// The API server answered with a `Status` (403, 404, 409, 503, …).
    #[error("{}", status_message(.0))]
    Api(Box<Status>),

    /// The request did not reach the API server, or its answer could not be read.
    #[error("request failed: {0}")]
    Request(String),

    /// The API server did not answer within `--request-timeout`.
    #[error("the server did not answer within {}s (--request-timeout)", .0.as_secs_f64())]
    Timeout(Duration),

    /// The API server answered something that is not what this version of the plugin expects.
    #[error("unexpected answer from the server: {0}")]
    UnexpectedResponse(String),

    /// `exec -t`: the session failed without an exit code of the command (the server says why).
    #[error("the session failed: {0}")]
    SessionFailed(String),

    /// `exec -i`: what was read from stdin is not UTF-8 text.
    #[error("stdin is not UTF-8 text; exec -i sends stdin as text (to copy binary data, use kubectl smolvm cp)")]
    StdinNotUtf8,

    /// A file (or stdin) to send is larger than the server takes.
    #[error("{what} is larger than {limit} bytes, the most that can be sent to a SmolVM")]
    TooLarge {
        /// What was too large (`file "x"`, `stdin`).
        what: String,
        /// The limit in bytes.
        limit: u64,
    },

    /// `cp` out of a path that is a directory in the SmolVM.
    #[error("{path} is a directory in the SmolVM; cp copies single files")]
    IsDirectory {
        /// The `NAME:/path` that was asked for.
        path: String,
    },

    /// `restart` of a SmolVM whose `spec.running` is false.
    #[error("SmolVM {namespace}/{name} is stopped (spec.running is false); start it with: kubectl smolvm start {name}")]
    NotRunning {
        /// The SmolVM's namespace.
        namespace: String,
        /// The SmolVM's name.
        name: String,
    },

    /// `branch` of a SmolVM that is not a branch source.
    #[error(
        "SmolVM {namespace}/{name} is not branchable (spec.branchable is not true): branches are made only of a SmolVM \
         created with spec.branchable: true, which cannot be set later; create a SmolVM with it and branch that"
    )]
    NotBranchable {
        /// The source's namespace.
        namespace: String,
        /// The source's name.
        name: String,
    },

    /// `branch`: some of the branches did not run, or some creates were refused (the table on
    /// stdout says which and why).
    #[error("{}", not_running_message(self))]
    BranchesNotRunning {
        /// The source's namespace.
        namespace: String,
        /// The source's name.
        source_name: String,
        /// How many branches were asked for.
        asked: usize,
        /// How many were Failed, or deleted before they ran.
        failed: usize,
        /// How many were not Running when `--timeout` ran out.
        waiting: usize,
        /// The `--timeout`.
        timeout: Duration,
        /// How many creates the server refused.
        refused: usize,
        /// The first refusal, as it would be printed on its own.
        refusal: Option<String>,
    },

    /// Reading or writing a local file failed.
    #[error("{action} {}: {source}", .path.display())]
    LocalIo {
        /// What was being done (`read`, `create`, `write`).
        action: &'static str,
        /// The local path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },

    /// Reading stdin or writing stdout/stderr failed.
    #[error("{0}: {1}")]
    Stdio(&'static str, std::io::Error),
}

impl Error {
    /// A stable, machine-readable name for the kind of failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::InvalidArgument(_) => "InvalidArgument",
            Error::NoConfiguration(_) => "NoConfiguration",
            Error::Kubeconfig(_) => "KubeconfigInvalid",
            Error::Api(_) => "ServerError",
            Error::Request(_) => "RequestFailed",
            Error::Timeout(_) => "RequestTimeout",
            Error::UnexpectedResponse(_) => "UnexpectedResponse",
            Error::SessionFailed(_) => "SessionFailed",
            Error::StdinNotUtf8 => "StdinNotUtf8",
            Error::TooLarge { .. } => "TooLarge",
            Error::IsDirectory { .. } => "IsDirectory",
            Error::NotRunning { .. } => "NotRunning",
            Error::NotBranchable { .. } => "NotBranchable",
            Error::BranchesNotRunning { .. } => "BranchesNotRunning",
            Error::LocalIo { .. } => "LocalIo",
            Error::Stdio(..) => "StdioFailed",
        }
    }

    /// The one line printed on stderr for this error (without the newline).
    pub fn render(&self) -> String {
        match self {
            Error::Api(status) => match status_reason(status) {
                Some(reason) => format!("Error from server ({reason}): {}", status_message(status)),
                None => format!("Error from server: {}", status_message(status)),
            },
            other => format!("error: {}", clean(&other.to_string())),
        }
    }
}

impl From<kube::Error> for Error {
    fn from(err: kube::Error) -> Self {
        match err {
            kube::Error::Api(status) => Error::Api(status),
            other => Error::Request(clean(&other.to_string())),
        }
    }
}

/// The reason kubectl would show for a `Status`: its own `reason` when that is a reason word
/// (`Conflict`), else the one its HTTP code stands for; `None` when neither says anything.
fn status_reason(status: &Status) -> Option<&str> {
    let own = status.reason.as_str();
    if !own.is_empty() && own.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Some(own);
    }
    let by_code = match status.code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => return None,
    };
    Some(by_code)
}

/// A `Status`'s message, cleaned; its HTTP code when it carries none.
fn status_message(status: &Status) -> String {
    let message = clean(&status.message);
    if message.is_empty() {
        format!("the server answered HTTP {} with no message", status.code)
    } else {
        message
    }
}

/// The line for [`Error::BranchesNotRunning`]: `2 of 3 branches of shop/web did not run (1
/// Failed or deleted, 1 not Running within 2m); …`.
fn not_running_message(error: &Error) -> String {
    let Error::BranchesNotRunning {
        namespace,
        source_name,
        asked,
        failed,
        waiting,
        timeout,
        refused,
        refusal,
    } = error
    else {
        return String::new();
    };
    let mut why = Vec::new();
    if *failed > 0 {
        why.push(format!("{failed} Failed or deleted"));
    }
    if *waiting > 0 {
        why.push(format!(
            "{waiting} not Running within {} (--timeout)",
            duration::display(*timeout)
        ));
    }
    if *refused > 0 {
        let first = refusal.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        why.push(format!("{refused} not created{first}"));
    }
    let branches = if *asked == 1 { "branch" } else { "branches" };
    let table = if failed + waiting > 0 {
        "; the table says why"
    } else {
        ""
    };
    format!(
        "{} of {asked} {branches} of {namespace}/{source_name} did not run ({}){table}. \
         The SmolVMs created are left in place: kubectl smolvm get-branches {source_name} lists them",
        failed + waiting + refused,
        why.join(", ")
    )
}

/// Makes foreign text (the API server's messages, kube's errors) safe for one line of a
/// terminal, as the operator cleans every other program's text: `smolvm_api::text::clean_external`
/// (escape sequences and control characters gone, whitespace collapsed, bounded).
pub fn clean(text: &str) -> String {
    smolvm_api::text::clean_external_bounded(text, MAX_FOREIGN_TEXT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str, message: &str) -> Error {
        let mut status = Status::failure(message, reason).with_code(code);
        status.reason = reason.to_string();
        Error::Api(status.boxed())
    }

    #[test]
    fn renders_like_kubectl() {
        let cases = [
            (
                status(
                    409,
                    "Conflict",
                    "SmolVM default/web is not running (phase Failed): boom",
                ),
                "Error from server (Conflict): SmolVM default/web is not running (phase Failed): boom",
            ),
            (
                status(404, "NotFound", "smolvms.vm.smolvm.dev \"web\" not found"),
                "Error from server (NotFound): smolvms.vm.smolvm.dev \"web\" not found",
            ),
            // kube's stand-in for a body that is not a Status: the code names the reason.
            (
                status(503, "Failed to parse error data", "service unavailable\n"),
                "Error from server (ServiceUnavailable): service unavailable",
            ),
            (status(418, "", "teapot"), "Error from server: teapot"),
            (
                status(403, "Forbidden", ""),
                "Error from server (Forbidden): the server answered HTTP 403 with no message",
            ),
            (
                Error::SessionFailed("the runtime could not run the command".into()),
                "error: the session failed: the runtime could not run the command",
            ),
            (Error::InvalidArgument("bad\nflag".into()), "error: bad flag"),
            (
                Error::NotBranchable {
                    namespace: "shop".into(),
                    name: "web".into(),
                },
                "error: SmolVM shop/web is not branchable (spec.branchable is not true): branches are made only of a \
                 SmolVM created with spec.branchable: true, which cannot be set later; create a SmolVM with it and branch that",
            ),
            (
                Error::BranchesNotRunning {
                    namespace: "shop".into(),
                    source_name: "base".into(),
                    asked: 3,
                    failed: 1,
                    waiting: 1,
                    timeout: Duration::from_secs(120),
                    refused: 0,
                    refusal: None,
                },
                "error: 2 of 3 branches of shop/base did not run (1 Failed or deleted, 1 not Running within 2m \
                 (--timeout)); the table says why. The SmolVMs created are left in place: kubectl smolvm get-branches \
                 base lists them",
            ),
            (
                Error::BranchesNotRunning {
                    namespace: "shop".into(),
                    source_name: "base".into(),
                    asked: 1,
                    failed: 0,
                    waiting: 0,
                    timeout: Duration::from_secs(120),
                    refused: 1,
                    refusal: Some("Error from server (Forbidden): exceeded quota".into()),
                },
                "error: 1 of 1 branch of shop/base did not run (1 not created: Error from server (Forbidden): exceeded \
                 quota). The SmolVMs created are left in place: kubectl smolvm get-branches base lists them",
            ),
        ];
        for (error, want) in cases {
            assert_eq!(error.render(), want);
        }
    }

    #[test]
    fn reasons_are_stable() {
        assert_eq!(status(409, "Conflict", "x").reason(), "ServerError");
        assert_eq!(Error::SessionFailed(String::new()).reason(), "SessionFailed");
        assert_eq!(Error::StdinNotUtf8.reason(), "StdinNotUtf8");
        assert_eq!(
            Error::IsDirectory {
                path: "web:/etc".into()
            }
            .reason(),
            "IsDirectory"
        );
        assert_eq!(
            Error::TooLarge {
                what: "stdin".into(),
                limit: 1
            }
            .reason(),
            "TooLarge"
        );
        assert_eq!(Error::Timeout(Duration::from_secs(1)).reason(), "RequestTimeout");
        assert_eq!(
            Error::NotBranchable {
                namespace: "shop".into(),
                name: "web".into()
            }
            .reason(),
            "NotBranchable"
        );
    }

    #[test]
    fn kube_api_errors_keep_their_status() {
        let err: Error = kube::Error::Api(Status::failure("gone", "NotFound").with_code(404).boxed()).into();
        assert_eq!(err.reason(), "ServerError");
    }

    #[test]
    fn clean_makes_one_safe_line() {
        let cases = [
            ("plain", "plain"),
            ("two\nlines\r\n", "two lines"),
            ("\x1b[31mred\x1b[0m", "red"),
            ("  tabs\t\tand  spaces ", "tabs and spaces"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(clean(input), want, "{input:?}");
        }
        let long = "x".repeat(MAX_FOREIGN_TEXT + 50);
        assert!(clean(&long).len() <= MAX_FOREIGN_TEXT + '…'.len_utf8());
    }
}
