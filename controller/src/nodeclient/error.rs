//! Why a node API call failed ([`CallError`]): the node unreachable, its refusal, or an answer
//! this client cannot read.

use smolvm_api::nodeapi::ErrorCode;

/// Why a node API call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The node could not be reached (no endpoint, connect or TLS failure, timeout).
    #[error("node {node} is unreachable: {message}")]
    Unreachable {
        /// Node name.
        node: String,
        /// What happened.
        message: String,
    },
    /// The node answered with an error body.
    #[error("node {node} answered {status} {code}: {message}")]
    Api {
        /// Node name.
        node: String,
        /// HTTP status.
        status: u16,
        /// The stable code.
        code: ErrorCode,
        /// The node's message (smolvm's own text for runtime failures).
        message: String,
        /// Structured details.
        details: Option<serde_json::Value>,
    },
    /// The node answered something this client cannot read.
    #[error("node {node} answered unreadably: {message}")]
    Protocol {
        /// Node name.
        node: String,
        /// What was wrong.
        message: String,
    },
}

impl CallError {
    /// [`CallError::Unreachable`] for `node`.
    pub(super) fn unreachable(node: &str, message: String) -> Self {
        CallError::Unreachable {
            node: node.to_string(),
            message,
        }
    }

    /// [`CallError::Protocol`] for `node`.
    pub(super) fn protocol(node: &str, message: String) -> Self {
        CallError::Protocol {
            node: node.to_string(),
            message,
        }
    }

    /// Whether the failure means the runtime could not be reached (as opposed to a refusal).
    pub fn is_unreachable(&self) -> bool {
        match self {
            CallError::Unreachable { .. } => true,
            CallError::Api { code, .. } => code.is_runtime_unreachable(),
            CallError::Protocol { .. } => false,
        }
    }

    /// Whether the agent itself could not be reached: no endpoint, connection refused, a TLS
    /// failure or a timeout talking to it. A reachable agent whose smolvm is unavailable is not:
    /// only this case may give up on a machine's local state (force-delete).
    pub fn agent_unreachable(&self) -> bool {
        matches!(self, CallError::Unreachable { .. })
    }

    /// The node API error code, if the node answered one.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            CallError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The message alone, without the node prefix.
    pub fn message(&self) -> &str {
        match self {
            CallError::Unreachable { message, .. }
            | CallError::Api { message, .. }
            | CallError::Protocol { message, .. } => message,
        }
    }
}
