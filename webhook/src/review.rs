//! The pure core of the webhook: an AdmissionReview v1 body in, an AdmissionReview v1 body out.
//!
//! No I/O happens here. [`review`] parses the body, checks that it is an
//! `admission.k8s.io/v1` `AdmissionReview` with a request for the resource the route serves,
//! runs the rules of `smolvm-api` (defaulting M1–M2 on the mutating route, validation V1–V10 on
//! the validating routes) and encodes the response, echoing the request's uid.
//!
//! Malformed input is a [`RequestError`] with the HTTP status the server answers with and a
//! `metav1.Status`-shaped JSON body ([`RequestError::to_json`]).
//!
//! Denials: `allowed: false` with `status.code` 422 and reason `Invalid`, except when every
//! violation is of rule V9 or V10 (who may write binding fields and SmolVMNodes), which is
//! 403 `Forbidden`. The message lists every violation ([`Verdict::message`]); every warning
//! finding becomes one entry of `warnings`.

use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::{
    GroupVersionResource, Status, TypeMeta,
    admission::{AdmissionResponse, Operation as WireOperation},
};
use serde::Deserialize;
use serde_json::Value;
use smolvm_api::{
    Policy,
    constants::{GROUP, RESOURCE_SMOLVMNODES, RESOURCE_SMOLVMS},
    defaulting::default_smolvm,
    validate::{
        Context, Identity, NodeCatalog, Operation, RuleId, Verdict, validate_smolvm_json, validate_smolvm_node_json,
        validate_smolvm_status_json,
    },
};

/// The only AdmissionReview version served.
pub const ADMISSION_API_VERSION: &str = "admission.k8s.io/v1";
/// The AdmissionReview kind.
pub const ADMISSION_KIND: &str = "AdmissionReview";

/// One of the webhook's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /mutate/smolvms`: defaulting (M1, M2) of SmolVMs.
    MutateSmolVM,
    /// `POST /validate/smolvms`: V1–V9 on SmolVMs and their status.
    ValidateSmolVM,
    /// `POST /validate/smolvmnodes`: V10 on SmolVMNodes and their status.
    ValidateSmolVMNode,
}

impl Route {
    /// Every route.
    pub const ALL: [Route; 3] = [Route::MutateSmolVM, Route::ValidateSmolVM, Route::ValidateSmolVMNode];

    /// The URL path.
    pub fn path(self) -> &'static str {
        match self {
            Route::MutateSmolVM => "/mutate/smolvms",
            Route::ValidateSmolVM => "/validate/smolvms",
            Route::ValidateSmolVMNode => "/validate/smolvmnodes",
        }
    }

    /// The plural resource name the route serves.
    pub fn resource(self) -> &'static str {
        match self {
            Route::MutateSmolVM | Route::ValidateSmolVM => RESOURCE_SMOLVMS,
            Route::ValidateSmolVMNode => RESOURCE_SMOLVMNODES,
        }
    }

    /// `mutate` or `validate` (a metrics label).
    pub fn kind(self) -> &'static str {
        match self {
            Route::MutateSmolVM => "mutate",
            Route::ValidateSmolVM | Route::ValidateSmolVMNode => "validate",
        }
    }
}

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
    /// Reading the body failed.
    #[error("reading the request body failed: {0}")]
    Body(String),
    /// The request method is not POST.
    #[error("method {0} is not allowed; use POST")]
    MethodNotAllowed(String),
    /// A bug: the server caught a panic or could not encode its answer.
    #[error("internal error: {0}")]
    Internal(String),
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
            RequestError::Timeout(_) => 408,
            RequestError::TooLarge { .. } => 413,
            RequestError::UnsupportedMediaType(_) => 415,
            RequestError::Internal(_) => 500,
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
            RequestError::Body(_) => "BadBody",
            RequestError::MethodNotAllowed(_) => "MethodNotAllowed",
            RequestError::Internal(_) => "InternalError",
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

/// What happened to a request, for metrics and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `smolvms`, `smolvms/status`, `smolvmnodes` or `smolvmnodes/status`.
    pub resource: String,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: &'static str,
    /// `allowed` or `denied`.
    pub verdict: &'static str,
    /// Whether a non-empty patch was returned.
    pub patched: bool,
    /// The rules of the violations (empty when allowed).
    pub rules: Vec<RuleId>,
    /// The uid of the request.
    pub uid: String,
}

/// The result of reviewing one body: the encoded AdmissionReview and what it decided.
#[derive(Debug, Clone)]
pub struct Reviewed {
    /// The response body (an `admission.k8s.io/v1` AdmissionReview carrying `response`).
    pub body: Vec<u8>,
    /// What was decided.
    pub outcome: Outcome,
}

/// An AdmissionReview as the API server sends it, read in one pass: the objects stay raw JSON
/// (the rules decode them once, into the typed SmolVM or SmolVMNode), and fields the webhook does
/// not use are skipped.
#[derive(Deserialize)]
struct WireReview {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    #[serde(default)]
    request: Option<WireRequest>,
}

/// The `request` of an AdmissionReview.
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
    #[serde(default)]
    pub object: Option<Value>,
    /// The stored object (UPDATE, DELETE).
    #[serde(default)]
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
fn check_envelope(field: &str, object: Option<&Value>) -> Result<(), RequestError> {
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

/// The response skeleton for `request`: allowed, uid echoed.
fn response_to(request: &WireRequest) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid("");
    response.types = TypeMeta {
        api_version: ADMISSION_API_VERSION.into(),
        kind: ADMISSION_KIND.into(),
    };
    response.uid = request.uid.clone();
    response.allowed = true;
    response.result = Status::default();
    response
}

/// The status code and reason of a denial: 403 `Forbidden` when every violation is an
/// identity-and-binding rule (V9, V10), 422 `Invalid` otherwise.
pub fn denial_code(verdict: &Verdict) -> (u16, &'static str) {
    let forbidden = !verdict.violations.is_empty()
        && verdict
            .violations
            .iter()
            .all(|v| matches!(v.rule, RuleId::V9 | RuleId::V10));
    if forbidden {
        (403, "Forbidden")
    } else {
        (422, "Invalid")
    }
}

fn deny(mut response: AdmissionResponse, code: u16, reason: &str, message: &str) -> AdmissionResponse {
    response.allowed = false;
    response.result = Status::failure(message, reason).with_code(code);
    response
}

fn encode(response: AdmissionResponse) -> Result<Vec<u8>, RequestError> {
    serde_json::to_vec(&response.into_review())
        .map_err(|e| RequestError::Internal(format!("encoding the response: {e}")))
}

/// Reviews one AdmissionReview body for `route` under `policy`, with `nodes` the known
/// SmolVMNodes.
pub fn review(route: Route, body: &[u8], policy: &Policy, nodes: &dyn NodeCatalog) -> Result<Reviewed, RequestError> {
    let request = parse(body)?;
    let operation = operation_of(&request.operation);
    let sub = request.sub_resource.clone().filter(|s| !s.is_empty());
    let mut outcome = Outcome {
        resource: match &sub {
            Some(s) => format!("{}/{s}", request.resource.resource),
            None => request.resource.resource.clone(),
        },
        operation: operation.as_str(),
        verdict: "allowed",
        patched: false,
        rules: Vec::new(),
        uid: request.uid.clone(),
    };
    let base = response_to(&request);

    // A request for another resource (a misconfigured webhook rule) is denied, not guessed at.
    if request.resource.group != GROUP || request.resource.resource != route.resource() {
        outcome.verdict = "denied";
        let message = format!(
            "{} serves {GROUP}/{}, not {}/{}",
            route.path(),
            route.resource(),
            request.resource.group,
            request.resource.resource
        );
        return Ok(Reviewed {
            body: encode(deny(base, 400, "BadRequest", &message))?,
            outcome,
        });
    }
    let status = match sub.as_deref() {
        None => false,
        Some("status") => true,
        Some(other) => {
            outcome.verdict = "denied";
            let message = format!("subresource {other:?} is not served by this webhook");
            return Ok(Reviewed {
                body: encode(deny(base, 400, "BadRequest", &message))?,
                outcome,
            });
        }
    };
    // DELETE and CONNECT never reach the webhook through the shipped configuration; admit them.
    if !matches!(operation, Operation::Create | Operation::Update) {
        return Ok(Reviewed {
            body: encode(base)?,
            outcome,
        });
    }
    let identity = identity_of(&request.user_info);
    let new = request
        .object
        .filter(|o| !o.is_null())
        .ok_or_else(|| RequestError::Malformed(format!("request.object is required for {}", operation.as_str())))?;
    let old = request.old_object.filter(|o| !o.is_null());

    let response = match route {
        Route::MutateSmolVM => {
            if status {
                base
            } else {
                let patch = default_smolvm(operation, &new);
                if patch.0.is_empty() {
                    base
                } else {
                    outcome.patched = true;
                    base.with_patch(patch)
                        .map_err(|e| RequestError::Internal(format!("encoding the patch: {e}")))?
                }
            }
        }
        Route::ValidateSmolVM | Route::ValidateSmolVMNode => {
            let ctx = Context {
                policy,
                nodes,
                identity: &identity,
            };
            let verdict = match (route, status) {
                (Route::ValidateSmolVM, false) => validate_smolvm_json(operation, old.as_ref(), &new, &ctx),
                (Route::ValidateSmolVM, true) => validate_smolvm_status_json(operation, old.as_ref(), &new, &ctx),
                _ => validate_smolvm_node_json(operation, status, old.as_ref(), &new, &ctx),
            };
            let mut response = base;
            if !verdict.warnings.is_empty() {
                response.warnings = Some(verdict.warnings.iter().map(ToString::to_string).collect());
            }
            if verdict.allowed() {
                response
            } else {
                outcome.verdict = "denied";
                outcome.rules = verdict.violated_rules();
                let (code, reason) = denial_code(&verdict);
                deny(response, code, reason, &verdict.message())
            }
        }
    };
    Ok(Reviewed {
        body: encode(response)?,
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use smolvm_api::fixtures;

    fn body(route_resource: &str, sub: Option<&str>, op: &str, object: Value, old: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": GROUP, "version": "v1alpha1", "kind": "SmolVM"},
                "resource": {"group": GROUP, "version": "v1alpha1", "resource": route_resource},
                "subResource": sub,
                "name": "alpine", "namespace": "default",
                "operation": op,
                "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
                "object": object, "oldObject": old, "dryRun": false
            }
        }))
        .unwrap_or_default()
    }

    #[test]
    fn parse_classifies_malformed_bodies() {
        let table: &[(&[u8], &str)] = &[
            (b"", "NotJSON"),
            (b"{", "NotJSON"),
            (b"not json", "NotJSON"),
            (b"[]", "WrongKind"),
            (b"42", "WrongKind"),
            (b"{}", "WrongKind"),
            (
                br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#,
                "WrongKind",
            ),
            (br#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#, "WrongKind"),
            (
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
                "MissingRequest",
            ),
            (
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}"#,
                "MissingRequest",
            ),
            (
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":5}}"#,
                "Malformed",
            ),
        ];
        for (input, reason) in table {
            let got = parse(input).err().map(|e| e.reason());
            assert_eq!(got, Some(*reason), "{}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn denial_codes() {
        let policy = fixtures::policy();
        let nodes: Vec<smolvm_api::SmolVMNode> = Vec::new();
        let mut bad = fixtures::alpine();
        bad["spec"]["image"] = json!("Not An Image");
        let out = review(
            Route::ValidateSmolVM,
            &body("smolvms", None, "CREATE", bad, Value::Null),
            &policy,
            &nodes,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let v: Value = serde_json::from_slice(&out.body).unwrap_or_default();
        assert_eq!(v["response"]["status"]["code"], 422);
        assert_eq!(v["response"]["status"]["reason"], "Invalid");
        assert_eq!(out.outcome.rules, vec![RuleId::V1]);
    }

    #[test]
    fn wrong_resource_and_subresource_are_denied() {
        let policy = fixtures::policy();
        let nodes: Vec<smolvm_api::SmolVMNode> = Vec::new();
        let table: &[(Route, &str, Option<&str>)] = &[
            (Route::ValidateSmolVMNode, "smolvms", None),
            (Route::MutateSmolVM, "pods", None),
            (Route::ValidateSmolVM, "smolvms", Some("scale")),
        ];
        for (route, resource, sub) in table {
            let out = review(
                *route,
                &body(resource, *sub, "CREATE", fixtures::alpine(), Value::Null),
                &policy,
                &nodes,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let v: Value = serde_json::from_slice(&out.body).unwrap_or_default();
            assert_eq!(v["response"]["allowed"], false, "{route:?} {resource}");
            assert_eq!(v["response"]["status"]["code"], 400);
        }
    }
}
