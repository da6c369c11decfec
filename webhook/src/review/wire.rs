//! The AdmissionReview v1 envelope as it travels: the wire types, [`parse`] (the reference
//! reading into `serde_json::Value`s), the envelope checks and the [`RequestError`]s a malformed
//! body gets.

use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::{GroupVersionResource, admission::Operation as WireOperation};
use serde::Deserialize;
use serde_json::Value;
use smolvm_api::validate::{Identity, Operation};

/// The only AdmissionReview version served.
pub const ADMISSION_API_VERSION: &str = "admission.k8s.io/v1";
/// The AdmissionReview kind.
pub const ADMISSION_KIND: &str = "AdmissionReview";

/// Why a request body could not be reviewed. Each has an HTTP status and a stable reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The body is not JSON.
    #[error("the request body is not JSON: {0}")]
    NotJson(String),
    /// The body is JSON but not an `admission.k8s.io/v1` AdmissionReview.
    #[error(
        "expected kind AdmissionReview of apiVersion admission.k8s.io/v1, got kind {kind:?} apiVersion {api_version:?}"
    )]
    WrongKind {
        /// The kind sent.
        kind: String,
        /// The apiVersion sent.
        api_version: String,
    },
    /// The AdmissionReview carries no `request`.
    #[error("the AdmissionReview has no request")]
    MissingRequest,
    /// The AdmissionReview (or the object in it) does not deserialize.
    #[error("the AdmissionReview does not deserialize: {0}")]
    Malformed(String),
    /// The body is larger than the limit.
    #[error("the request body is larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The Content-Type is not JSON.
    #[error("the content type must be application/json, got {0:?}")]
    UnsupportedMediaType(String),
    /// The body did not arrive in time.
    #[error("the request body did not arrive within {0:?}")]
    Timeout(std::time::Duration),
    /// No byte of the body came for the idle timeout.
    #[error("the request body stalled: no data for {0:?}")]
    Stalled(std::time::Duration),
    /// Reading the body failed.
    #[error("reading the request body failed: {0}")]
    Body(String),
    /// The request method is not POST.
    #[error("method {0} is not allowed; use POST")]
    MethodNotAllowed(String),
    /// A bug: the server caught a panic or could not encode its answer.
    #[error("internal error: {0}")]
    Internal(String),
    /// Every review slot is busy: the request is shed at once, with `Retry-After`, which the API
    /// server's webhook client honours by retrying (429 with Retry-After, up to 10 times, within
    /// the webhook's timeout).
    #[error("the webhook is answering {0} reviews already; retry shortly")]
    Overloaded(usize),
    /// Every reader slot for bodies still arriving is busy: the request is shed at once, with
    /// `Retry-After`, before its body is read.
    #[error("the webhook is reading {0} request bodies already; retry shortly")]
    BodiesBusy(usize),
    /// Every reader slot was taken and this body, still arriving, had held its slot longest:
    /// it gave the slot up to a newer request.
    #[error("the request body was arriving too slowly while others waited; send it at once")]
    Displaced,
}

impl RequestError {
    /// The HTTP status code to answer with.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::NotJson(_)
            | RequestError::WrongKind { .. }
            | RequestError::MissingRequest
            | RequestError::Malformed(_)
            | RequestError::Body(_) => 400,
            RequestError::MethodNotAllowed(_) => 405,
            RequestError::Timeout(_) | RequestError::Stalled(_) | RequestError::Displaced => 408,
            RequestError::TooLarge { .. } => 413,
            RequestError::UnsupportedMediaType(_) => 415,
            RequestError::Internal(_) => 500,
            RequestError::Overloaded(_) | RequestError::BodiesBusy(_) => 429,
        }
    }

    /// A stable, machine-readable name (also the `reason` of the JSON body).
    pub fn reason(&self) -> &'static str {
        match self {
            RequestError::NotJson(_) => "NotJSON",
            RequestError::WrongKind { .. } => "WrongKind",
            RequestError::MissingRequest => "MissingRequest",
            RequestError::Malformed(_) => "Malformed",
            RequestError::TooLarge { .. } => "RequestEntityTooLarge",
            RequestError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            RequestError::Timeout(_) => "Timeout",
            RequestError::Stalled(_) => "BodyStalled",
            RequestError::Body(_) => "BadBody",
            RequestError::MethodNotAllowed(_) => "MethodNotAllowed",
            RequestError::Internal(_) => "InternalError",
            RequestError::Overloaded(_) => "TooManyRequests",
            RequestError::BodiesBusy(_) => "TooManyBodies",
            RequestError::Displaced => "BodyDisplaced",
        }
    }

    /// The JSON body: a `metav1.Status` with code, reason and message.
    pub fn to_json(&self) -> Vec<u8> {
        let status = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "code": self.status(),
            "reason": self.reason(),
            "message": self.to_string(),
        });
        serde_json::to_vec(&status).unwrap_or_else(|_| b"{\"kind\":\"Status\",\"status\":\"Failure\"}".to_vec())
    }
}

/// An AdmissionReview as the API server sends it, read in one pass, with fields the webhook does
/// not use skipped. The objects are `serde_json::Value`s: the reference reading (the fast one,
/// [`parse_text`](super::scan::parse_text), reads what it reads).
#[derive(Deserialize)]
pub(super) struct WireReview {
    #[serde(rename = "apiVersion")]
    pub(super) api_version: String,
    pub(super) kind: String,
    #[serde(default = "none")]
    pub(super) request: Option<WireRequest>,
}

pub(super) fn none<T>() -> Option<T> {
    None
}

/// The `request` of an AdmissionReview, its objects as Values.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireRequest {
    /// Echoed in the response.
    pub uid: String,
    /// The resource the request is for.
    pub resource: GroupVersionResource,
    /// The subresource (`status`), if any.
    #[serde(default)]
    pub sub_resource: Option<String>,
    /// The operation.
    pub operation: WireOperation,
    /// The requester.
    #[serde(default)]
    pub user_info: UserInfo,
    /// The new object (CREATE, UPDATE).
    #[serde(default = "none")]
    pub object: Option<Value>,
    /// The stored object (UPDATE, DELETE).
    #[serde(default = "none")]
    pub old_object: Option<Value>,
}

/// Only what is needed to classify a body that failed to deserialize as an AdmissionReview.
#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    kind: Option<Value>,
    #[serde(default, rename = "apiVersion")]
    api_version: Option<Value>,
    #[serde(default)]
    request: Option<Value>,
}

fn as_text(value: &Option<Value>) -> String {
    match value {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// Parses an AdmissionReview v1 body and returns its request.
pub fn parse(body: &[u8]) -> Result<WireRequest, RequestError> {
    match serde_json::from_slice::<WireReview>(body) {
        Ok(review) => {
            if review.kind != ADMISSION_KIND || review.api_version != ADMISSION_API_VERSION {
                return Err(RequestError::WrongKind {
                    kind: review.kind,
                    api_version: review.api_version,
                });
            }
            let request = review.request.ok_or(RequestError::MissingRequest)?;
            for (field, object) in [("object", &request.object), ("oldObject", &request.old_object)] {
                check_envelope(field, object.as_ref())?;
            }
            Ok(request)
        }
        Err(e) if e.is_syntax() || e.is_eof() || e.is_io() => Err(RequestError::NotJson(e.to_string())),
        Err(e) => {
            // Valid JSON that is not a well-formed AdmissionReview: say which way it is wrong.
            let probe = serde_json::from_slice::<Probe>(body).ok();
            match probe {
                Some(p) => {
                    let kind = as_text(&p.kind);
                    let api_version = as_text(&p.api_version);
                    if kind != ADMISSION_KIND || api_version != ADMISSION_API_VERSION {
                        Err(RequestError::WrongKind { kind, api_version })
                    } else if matches!(p.request, None | Some(Value::Null)) {
                        Err(RequestError::MissingRequest)
                    } else {
                        Err(RequestError::Malformed(e.to_string()))
                    }
                }
                // Not even an object at the top level.
                None => Err(RequestError::WrongKind {
                    kind: String::new(),
                    api_version: String::new(),
                }),
            }
        }
    }
}

/// The requester, as the rules see it.
pub fn identity_of(user: &k8s_openapi::api::authentication::v1::UserInfo) -> Identity {
    Identity {
        username: user.username.clone().unwrap_or_default(),
        groups: user.groups.clone().unwrap_or_default(),
        extra: user.extra.clone().unwrap_or_default(),
    }
}

/// The rules' spelling of the operation.
pub fn operation_of(op: &WireOperation) -> Operation {
    match op {
        WireOperation::Create => Operation::Create,
        WireOperation::Update => Operation::Update,
        WireOperation::Delete => Operation::Delete,
        WireOperation::Connect => Operation::Connect,
    }
}

/// An object of a request must be a Kubernetes object: a JSON object whose `metadata`, if any, is
/// an object. Anything else is a malformed review, not a rule violation.
pub(super) fn check_envelope(field: &str, object: Option<&Value>) -> Result<(), RequestError> {
    match object {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(map)) => match map.get("metadata") {
            None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
            Some(other) => Err(RequestError::Malformed(format!(
                "request.{field}.metadata: expected an object, got {}",
                kind_of(other)
            ))),
        },
        Some(other) => Err(RequestError::Malformed(format!(
            "request.{field}: expected an object, got {}",
            kind_of(other)
        ))),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
