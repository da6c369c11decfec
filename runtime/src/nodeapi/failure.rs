//! A node API failure as data ([`ApiFailure`]: the HTTP status and the JSON error body), a
//! runtime failure mapped to one ([`map_vmm_error`], smolvm's message kept), and the refusals
//! of a call that meets a machine in the wrong state. Pure; [`super::answer`] renders them.

use smolvm_api::nodeapi::MachineState;

use super::types::{ErrorCode, MachineStatus, NodeApiError};
use crate::vmm::VmmError;

/// An HTTP status and the JSON error body that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiFailure {
    /// HTTP status code.
    pub status: u16,
    /// The body.
    pub body: NodeApiError,
}

impl ApiFailure {
    /// A failure without details, with the code's HTTP status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: code.status(),
            body: NodeApiError {
                code,
                message: message.into(),
                details: None,
            },
        }
    }

    /// Adds details.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.body.details = Some(details);
        self
    }
}

impl From<NodeApiError> for ApiFailure {
    /// A refusal with its code's HTTP status.
    fn from(body: NodeApiError) -> Self {
        Self {
            status: body.code.status(),
            body,
        }
    }
}

/// Maps a runtime failure to the node API's status and code; smolvm's message is kept verbatim.
pub fn map_vmm_error(error: &VmmError) -> ApiFailure {
    let message = error.message().to_string();
    match error {
        VmmError::NotFound { .. } => ApiFailure::new(ErrorCode::MachineNotFound, message),
        VmmError::Conflict { message } if message.contains("Address already in use") => {
            ApiFailure::new(ErrorCode::HostPortInUse, message.clone())
        }
        VmmError::Conflict { .. } => ApiFailure::new(ErrorCode::Conflict, message),
        VmmError::NotRunning { .. } => ApiFailure::new(ErrorCode::MachineNotRunning, message),
        VmmError::NotPaused { .. } => ApiFailure::new(ErrorCode::NoSavedState, message),
        VmmError::BadRequest { message } if message.contains("requires a running machine") => {
            ApiFailure::new(ErrorCode::ResizeRequiresRunning, message.clone())
        }
        VmmError::BadRequest { .. } => ApiFailure::new(ErrorCode::InvalidRequest, message),
        VmmError::StartFailed { .. } => ApiFailure::new(ErrorCode::StartFailed, message),
        VmmError::Unavailable { .. } => ApiFailure::new(ErrorCode::RuntimeUnavailable, error.to_string()),
        VmmError::Timeout { .. } => ApiFailure::new(ErrorCode::RuntimeTimeout, message),
        VmmError::NoReadySlot { .. } => ApiFailure::new(ErrorCode::NoReadySlot, message),
        VmmError::Internal { .. } => ApiFailure::new(ErrorCode::RuntimeError, message),
        VmmError::Protocol(_) => ApiFailure::new(ErrorCode::RuntimeProtocolError, message),
    }
}

/// 409 `MachineNotRunning` for a call that needs a running machine.
pub fn not_running(name: &str, status: &MachineStatus, what: &str) -> ApiFailure {
    in_state(
        ErrorCode::MachineNotRunning,
        name,
        status.state,
        &format!(": {what} needs a running machine"),
    )
}

/// 404 `FileNotFound`: machine `name` runs and has nothing at `path`, which a files read asked
/// for; `details.path` names it.
pub fn file_not_found(name: &str, path: &str) -> ApiFailure {
    ApiFailure::new(
        ErrorCode::FileNotFound,
        format!("machine '{name}' has no file or directory '{path}'"),
    )
    .with_details(serde_json::json!({ "path": path }))
}

/// The wire word of a machine state (`Running`, `Suspended`, …).
fn state_value(state: MachineState) -> serde_json::Value {
    serde_json::to_value(state).unwrap_or_default()
}

/// A refusal of `code` because machine `name` is in `state`: the message says so and `why`,
/// `details.state` names the state.
fn in_state(code: ErrorCode, name: &str, state: MachineState, why: &str) -> ApiFailure {
    let state = state_value(state);
    ApiFailure::new(
        code,
        format!(
            "machine '{name}' is {}{why}",
            state.as_str().unwrap_or("in another state")
        ),
    )
    .with_details(serde_json::json!({ "state": state }))
}

/// 409 `MachineNotRunning` for a suspend of a machine that does not run: only a running
/// machine has a memory to save.
pub fn cannot_suspend(name: &str, status: &MachineStatus) -> ApiFailure {
    in_state(
        ErrorCode::MachineNotRunning,
        name,
        status.state,
        ": only a running machine can be suspended (start it first)",
    )
}

/// 409 `NoSavedState` for a resume of a machine that was not suspended.
pub fn no_saved_state(name: &str, status: &MachineStatus) -> ApiFailure {
    in_state(
        ErrorCode::NoSavedState,
        name,
        status.state,
        " and has no saved state to resume: start it instead",
    )
}

/// 409 `AlreadySuspended` for `what` (a start, a resize) on a suspended machine: it would throw
/// the saved memory away or cannot apply to it; resume it first.
pub fn already_suspended(name: &str, what: &str) -> ApiFailure {
    ApiFailure::new(
        ErrorCode::AlreadySuspended,
        format!("machine '{name}' is suspended: {what} would discard or bypass its saved state; resume it first"),
    )
    .with_details(serde_json::json!({ "state": state_value(MachineState::Suspended) }))
}

/// 404 `SourceNotFound`: no machine `source` on this node to branch.
pub fn source_not_found(source: &str) -> ApiFailure {
    ApiFailure::new(
        ErrorCode::SourceNotFound,
        format!("no machine '{source}' on this node to branch"),
    )
    .with_details(serde_json::json!({ "source": source }))
}

/// 409 `SourceNotRunning`: `source` is in another state than running, and only a running
/// machine can be branched (its memory is what a branch copies); `details` name it and its
/// state.
pub fn source_not_running(source: &str, status: &MachineStatus) -> ApiFailure {
    let mut failure = in_state(
        ErrorCode::SourceNotRunning,
        source,
        status.state,
        ": only a running machine can be branched",
    );
    if let Some(serde_json::Value::Object(details)) = failure.body.details.as_mut() {
        details.insert("source".into(), source.into());
    }
    failure
}

/// 409 `SourceNotBranchable`: `source` runs but was not started as a branch source; `message`
/// is smolvm's when it refused.
pub fn source_not_branchable(source: &str, message: Option<&str>) -> ApiFailure {
    let message = message.map_or_else(
        || format!("machine '{source}' was not started as a branch source (branchable)"),
        str::to_string,
    );
    ApiFailure::new(ErrorCode::SourceNotBranchable, message).with_details(serde_json::json!({ "source": source }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmm_errors_map_to_statuses_and_codes() {
        let m = |s: &str| s.to_string();
        let cases = [
            (
                VmmError::NotFound {
                    message: m("machine 'x' not found"),
                },
                404,
                "MachineNotFound",
            ),
            (
                VmmError::Conflict {
                    message: m("machine 'x' already exists"),
                },
                409,
                "Conflict",
            ),
            (
                VmmError::Conflict {
                    message: m("cannot publish host TCP 127.0.0.1:1: Address already in use (os error 98)"),
                },
                409,
                "HostPortInUse",
            ),
            (
                VmmError::BadRequest {
                    message: m("live CPU/RAM resize requires a running machine; use update"),
                },
                409,
                "ResizeRequiresRunning",
            ),
            (
                VmmError::BadRequest {
                    message: m("port 0 is not valid"),
                },
                400,
                "InvalidRequest",
            ),
            (
                VmmError::StartFailed {
                    message: m("failed to start machine: x"),
                },
                500,
                "StartFailed",
            ),
            (VmmError::Unavailable { message: m("gone") }, 503, "RuntimeUnavailable"),
            (VmmError::Timeout { message: m("slow") }, 504, "RuntimeTimeout"),
            (
                VmmError::Internal {
                    status: 500,
                    message: m("boom"),
                },
                500,
                "RuntimeError",
            ),
            (VmmError::Protocol(m("garbage")), 502, "RuntimeProtocolError"),
            (
                VmmError::NotRunning {
                    message: m("machine 'x' must be running"),
                },
                409,
                "MachineNotRunning",
            ),
            (
                VmmError::NotPaused {
                    message: m("machine is not paused"),
                },
                409,
                "NoSavedState",
            ),
        ];
        for (error, status, code) in cases {
            let failure = map_vmm_error(&error);
            assert_eq!(
                (failure.status, failure.body.code.as_str()),
                (status, code),
                "{error:?}"
            );
            assert!(failure.body.message.contains(error.message()));
        }
    }

    #[test]
    fn branch_refusals_name_the_source_and_its_state() {
        let status = |state| MachineStatus {
            state,
            ..crate::nodeapi::mapping::to_status(&crate::vmm::Machine::created_from(&crate::vmm::MachineSpec::new(
                "src", 1, 64,
            )))
        };
        // (failure, HTTP status, code, details)
        let cases = [
            (
                source_not_found("src"),
                404,
                "SourceNotFound",
                serde_json::json!({"source": "src"}),
            ),
            (
                source_not_running("src", &status(MachineState::Stopped)),
                409,
                "SourceNotRunning",
                serde_json::json!({"source": "src", "state": "Stopped"}),
            ),
            (
                source_not_running("src", &status(MachineState::Suspended)),
                409,
                "SourceNotRunning",
                serde_json::json!({"source": "src", "state": "Suspended"}),
            ),
            (
                source_not_branchable("src", None),
                409,
                "SourceNotBranchable",
                serde_json::json!({"source": "src"}),
            ),
        ];
        for (failure, http, code, details) in cases {
            assert_eq!((failure.status, failure.body.code.as_str()), (http, code));
            assert_eq!(failure.body.details, Some(details), "{code}");
            assert!(failure.body.message.contains("'src'"), "{}", failure.body.message);
        }
    }
}
