//! What can go wrong with an access call, as the Kubernetes `Status` the caller sees.

use axum::{
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

/// A refused or failed access call. Each variant has an HTTP status, a Kubernetes `Status`
/// reason (what `kubectl` prints as `Error from server (Reason)`) and a stable [`reason`] for
/// metrics and logs.
///
/// [`reason`]: AccessError::reason
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// No front-proxy client certificate, a certificate from a name the API server's
    /// configuration does not allow, or no user header.
    #[error("{0}")]
    Unauthenticated(String),
    /// The SubjectAccessReview said no.
    #[error("{0}")]
    Forbidden(String),
    /// No such SmolVM, or its machine is gone from its node.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed (a bad query parameter, a bad path).
    #[error("{0}")]
    BadRequest(String),
    /// The method is not served on this subresource.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The VM is not in a state that allows the call (not placed yet, not running).
    #[error("{0}")]
    Conflict(String),
    /// A body beyond the limit.
    #[error("{0}")]
    TooLarge(String),
    /// This replica is at its limit of calls, streams or buffered bytes: try again shortly
    /// (answered with `Retry-After`).
    #[error("{0}")]
    TooManyRequests(String),
    /// The caller sent nothing for too long while its body was expected.
    #[error("{0}")]
    Timeout(String),
    /// The VM's node, its agent or its runtime cannot be reached now.
    #[error("{0}")]
    Unavailable(String),
    /// The node's agent answered something this server does not understand.
    #[error("{0}")]
    BadGateway(String),
    /// Not configured to serve yet (the API server's front-proxy settings not read).
    #[error("{0}")]
    NotReady(String),
    /// A call to the Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl AccessError {
    /// A stable, machine-readable name of the outcome.
    pub fn reason(&self) -> &'static str {
        match self {
            AccessError::Unauthenticated(_) => "Unauthenticated",
            AccessError::Forbidden(_) => "Forbidden",
            AccessError::NotFound(_) => "NotFound",
            AccessError::BadRequest(_) => "BadRequest",
            AccessError::MethodNotAllowed(_) => "MethodNotAllowed",
            AccessError::Conflict(_) => "Conflict",
            AccessError::TooLarge(_) => "TooLarge",
            AccessError::TooManyRequests(_) => "TooManyRequests",
            AccessError::Timeout(_) => "Timeout",
            AccessError::Unavailable(_) => "Unavailable",
            AccessError::BadGateway(_) => "BadGateway",
            AccessError::NotReady(_) => "NotReady",
            AccessError::Kube(_) => "KubeError",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            AccessError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            AccessError::Forbidden(_) => StatusCode::FORBIDDEN,
            AccessError::NotFound(_) => StatusCode::NOT_FOUND,
            AccessError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AccessError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            AccessError::Conflict(_) => StatusCode::CONFLICT,
            AccessError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            AccessError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            AccessError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            AccessError::Unavailable(_) | AccessError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            AccessError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            AccessError::Kube(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `reason` of the Kubernetes `Status` (a `metav1.StatusReason`).
    pub fn status_reason(&self) -> &'static str {
        match self {
            AccessError::Unauthenticated(_) => "Unauthorized",
            AccessError::Forbidden(_) => "Forbidden",
            AccessError::NotFound(_) => "NotFound",
            AccessError::BadRequest(_) => "BadRequest",
            AccessError::MethodNotAllowed(_) => "MethodNotAllowed",
            AccessError::Conflict(_) => "Conflict",
            AccessError::TooLarge(_) => "RequestEntityTooLarge",
            AccessError::TooManyRequests(_) => "TooManyRequests",
            AccessError::Timeout(_) => "Timeout",
            AccessError::Unavailable(_) | AccessError::NotReady(_) => "ServiceUnavailable",
            AccessError::BadGateway(_) | AccessError::Kube(_) => "InternalError",
        }
    }

    /// The error as a Kubernetes `Status` object; a 429 says when to retry in its details, as
    /// the API server's own do.
    pub fn to_status(&self) -> serde_json::Value {
        let mut status = status_object(self.status().as_u16(), self.status_reason(), &self.to_string());
        if let AccessError::TooManyRequests(_) = self {
            status["details"] = serde_json::json!({ "retryAfterSeconds": RETRY_AFTER_SECONDS });
        }
        status
    }
}

/// When a caller shed with 429 is told to retry (`Retry-After`, `details.retryAfterSeconds`).
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// A failure `Status` object (`kind: Status`, `apiVersion: v1`), as the API server writes them.
pub fn status_object(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

impl IntoResponse for AccessError {
    fn into_response(self) -> Response {
        let body = self.to_status().to_string();
        let mut response = (self.status(), body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        if let AccessError::TooManyRequests(_) = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response.extensions_mut().insert(Outcome(self.reason()));
        response
    }
}

/// The outcome of a call, left on the response for the metrics layer.
#[derive(Debug, Clone, Copy)]
pub struct Outcome(pub &'static str);
