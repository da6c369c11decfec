//! How smolvm's refusals read: which call an answer belongs to ([`Operation`]) and the
//! [`VmmError`] a non-success answer maps to ([`map_error`]), smolvm's message cleaned and kept.
//!
//! The JSON calls use it, and so does the interactive exec's WebSocket handshake
//! ([`crate::vmm::interactive`]), which is why it stands apart from the client.

use hyper::StatusCode;
use serde::Deserialize;
use smolvm_api::text::clean_external;

use crate::vmm::VmmError;

/// Which API call a response belongs to; error mapping depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Health,
    Capacity,
    List,
    Get,
    Create,
    Start,
    Stop,
    Delete,
    Resize,
    Pause,
    Resume,
    Logs,
    Exec,
    Files,
    /// The pool calls: list, create, resize, delete.
    Pools,
    /// A lease's acquisition.
    Lease,
    /// A lease's heartbeat or completion.
    LeaseUpdate,
    /// A branch of a running machine.
    Branch,
}

/// Maps a non-success answer to a [`VmmError`], keeping smolvm's message.
///
/// smolvm's own errors are `{"error": "<message>", "code": "<CODE>"}`; its request-parsing
/// layer answers 400/415/422 with plain text; unknown routes answer 404 or 405 with no body.
pub fn map_error(operation: Operation, status: StatusCode, body: &[u8]) -> VmmError {
    let api_error = serde_json::from_slice::<ErrorWire>(body).ok();
    // smolvm's text embeds its log lines (ANSI colours, timestamps, levels): cleaned here, at
    // the one place it enters the agent, so node API answers, conditions and events carry the
    // cause and nothing that changes between two retries of the same failure.
    let message = match &api_error {
        Some(error) => clean_external(&error.error),
        None => {
            let text = clean_external(&String::from_utf8_lossy(body));
            if text.is_empty() {
                format!(
                    "HTTP {status} with an empty body ({operation:?})",
                    status = status.as_u16()
                )
            } else {
                text
            }
        }
    };
    let code = api_error.as_ref().map(|error| error.code.as_str());
    match status.as_u16() {
        404 if api_error.is_some() => VmmError::NotFound { message },
        404 | 405 => VmmError::Protocol(format!(
            "smolvm has no such route for {operation:?} (HTTP {}): {message}",
            status.as_u16()
        )),
        // smolvm 1.32.2 refuses a pause of a machine that is not running, and a resume of one
        // that was not paused, with 409 `CONFLICT`: the operation tells which.
        409 if operation == Operation::Pause && code == Some("CONFLICT") => VmmError::NotRunning { message },
        409 if operation == Operation::Resume && code == Some("CONFLICT") => VmmError::NotPaused { message },
        409 => VmmError::Conflict { message },
        400 | 403 | 413 | 415 | 422 => VmmError::BadRequest { message },
        // A live smolvm's 503 on a lease: the pool has no ready machine now.
        503 if operation == Operation::Lease && api_error.is_some() => VmmError::NoReadySlot { message },
        503 => VmmError::Unavailable { message },
        500..=599 if operation == Operation::Start => VmmError::StartFailed { message },
        _ => {
            if code == Some("NOT_FOUND") {
                VmmError::NotFound { message }
            } else {
                VmmError::Internal {
                    status: status.as_u16(),
                    message,
                }
            }
        }
    }
}

#[derive(Debug, Deserialize)]
struct ErrorWire {
    error: String,
    code: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    // Bodies below were observed from smolvm 1.32.2 (see docs/smolvm-api.md).

    #[test]
    fn api_errors_keep_smolvm_messages() {
        let cases: &[(Operation, u16, &str, &str)] = &[
            (
                Operation::Get,
                404,
                r#"{"error":"machine 'nope' not found","code":"NOT_FOUND"}"#,
                "NotFound",
            ),
            (
                Operation::Create,
                409,
                r#"{"error":"machine 'm1' already exists","code":"CONFLICT"}"#,
                "Conflict",
            ),
            (
                Operation::Create,
                400,
                r#"{"error":"machine name contains invalid character: '.'","code":"BAD_REQUEST"}"#,
                "InvalidRequest",
            ),
            (
                Operation::Start,
                500,
                r#"{"error":"failed to start machine: agent operation failed: wait for ready: agent did not become ready within 30 seconds: no boot progress for 30 seconds","code":"INTERNAL_ERROR"}"#,
                "StartFailed",
            ),
            (
                Operation::Start,
                409,
                r#"{"error":"failed to start machine: ... Address already in use (os error 98) (boot process exited (code 1) before the agent was ready)","code":"PORT_IN_USE"}"#,
                "Conflict",
            ),
            (
                Operation::Delete,
                500,
                r#"{"error":"failed to delete","code":"INTERNAL_ERROR"}"#,
                "RuntimeError",
            ),
            (
                Operation::Pause,
                409,
                r#"{"error":"machine 'm1' must be running","code":"CONFLICT"}"#,
                "NotRunning",
            ),
            (
                Operation::Resume,
                409,
                r#"{"error":"machine is not paused; use start for a fresh boot","code":"CONFLICT"}"#,
                "NotPaused",
            ),
            (
                Operation::Pause,
                404,
                r#"{"error":"machine 'nope' not found","code":"NOT_FOUND"}"#,
                "NotFound",
            ),
            (
                Operation::Resume,
                404,
                r#"{"error":"machine 'nope' not found","code":"NOT_FOUND"}"#,
                "NotFound",
            ),
        ];
        for (operation, status, body, code) in cases {
            let status = StatusCode::from_u16(*status).expect("valid status");
            let error = map_error(*operation, status, body.as_bytes());
            assert_eq!(error.code(), *code, "{operation:?} {status}: {error:?}");
            let expected: ErrorWire = serde_json::from_str(body).expect("valid body");
            assert_eq!(error.message(), expected.error);
        }
    }

    #[test]
    fn smolvm_log_lines_in_errors_are_cleaned() {
        // As smolvm 1.32.2 answers a start whose guest cannot boot on these machines: its log
        // line, with colours and a timestamp, inside the error text.
        let at = |when: &str| {
            let error = format!(
                "failed to start machine: \u{1b}[2m{when}\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m \u{1b}[2msmolvm::agent\u{1b}[0m\u{1b}[2m:\u{1b}[0m boot process exited (code 1) before the agent was ready"
            );
            let body = serde_json::json!({"error": error, "code": "INTERNAL_ERROR"}).to_string();
            map_error(Operation::Start, StatusCode::INTERNAL_SERVER_ERROR, body.as_bytes())
        };
        let first = at("2026-11-22T12:42:15Z");
        let second = at("2026-11-22T12:43:02.518Z");
        assert_eq!(first.code(), "StartFailed");
        assert!(!first.message().chars().any(char::is_control), "{first:?}");
        assert!(!first.message().contains("2026-11-22"), "{first:?}");
        assert!(
            first.message().contains("boot process exited (code 1)"),
            "the cause is kept: {first:?}"
        );
        assert_eq!(
            first.message(),
            second.message(),
            "a retry of the same failure reads the same"
        );
    }

    #[test]
    fn plain_text_and_empty_bodies() {
        let error = map_error(
            Operation::Create,
            StatusCode::UNPROCESSABLE_ENTITY,
            b"Failed to deserialize the JSON body into the target type: cpus: invalid value: integer `1000`, expected u8 at line 1 column 24",
        );
        assert!(matches!(error, VmmError::BadRequest { .. }));
        assert!(error.message().contains("expected u8"));

        let error = map_error(Operation::Get, StatusCode::NOT_FOUND, b"");
        assert_eq!(error.code(), "RuntimeProtocolError");
        let error = map_error(Operation::Create, StatusCode::METHOD_NOT_ALLOWED, b"");
        assert_eq!(error.code(), "RuntimeProtocolError");
        let error = map_error(Operation::List, StatusCode::INTERNAL_SERVER_ERROR, b"boom");
        assert_eq!(
            error,
            VmmError::Internal {
                status: 500,
                message: "boom".into()
            }
        );
        let error = map_error(Operation::Start, StatusCode::SERVICE_UNAVAILABLE, b"");
        assert_eq!(error.code(), "RuntimeUnavailable");
    }
}
