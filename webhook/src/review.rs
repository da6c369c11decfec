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
use kube::core::{GroupVersionResource, admission::Operation as WireOperation};
use serde::Deserialize;
use serde_json::{Value, value::RawValue};
use smolvm_api::{
    Policy,
    constants::{GROUP, RESOURCE_SMOLVMNODES, RESOURCE_SMOLVMS},
    defaulting::default_smolvm,
    validate::{Context, Identity, NodeCatalog, Operation, Raw, RuleId, Target, Verdict, validate_raw},
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
    /// Every review slot is busy: the request is shed at once, with `Retry-After`, which the API
    /// server's webhook client honours by retrying (429 with Retry-After, up to 10 times, within
    /// the webhook's timeout).
    #[error("the webhook is answering {0} reviews already; retry shortly")]
    Overloaded(usize),
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
            RequestError::Overloaded(_) => 429,
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
            RequestError::Overloaded(_) => "TooManyRequests",
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

/// An AdmissionReview as the API server sends it, read in one pass, with fields the webhook does
/// not use skipped. The objects are `serde_json::Value`s (`O = Value`, the reference reading), or
/// JSON text borrowed from the body ([`TextReview`], the fast one).
#[derive(Deserialize)]
struct WireReview<O = Value> {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    #[serde(default = "none")]
    request: Option<WireRequest<O>>,
}

/// The happy path of [`parse`]: the AdmissionReview with the objects left as JSON text (borrowed
/// from the body), so that no `Value` tree is built for them.
type TextReview<'a> = WireReview<&'a RawValue>;

/// [`WireRequest`] with the objects as JSON text.
type TextRequest<'a> = WireRequest<&'a RawValue>;

fn none<T>() -> Option<T> {
    None
}

/// The `request` of an AdmissionReview, its objects as `O`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireRequest<O = Value> {
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
    pub object: Option<O>,
    /// The stored object (UPDATE, DELETE).
    #[serde(default = "none")]
    pub old_object: Option<O>,
}

/// serde_json's nesting limit: reading a body fails on entering the 128th nested array or object.
const JSON_DEPTH_LIMIT: u32 = 128;
/// How deep `request.object` and `request.oldObject` sit in a review (the review's own object
/// and `request`).
const OBJECT_DEPTH: u32 = 2;

/// What kind of JSON value something is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Scalar,
    Array,
    Object,
}

fn kind_at(byte: u8) -> Kind {
    match byte {
        b'{' => Kind::Object,
        b'[' => Kind::Array,
        b'n' => Kind::Null,
        _ => Kind::Scalar,
    }
}

/// The four hex digits at `b[at..]`.
fn hex4(b: &[u8], at: usize) -> Option<u16> {
    let digits = std::str::from_utf8(b.get(at..at + 4)?).ok()?;
    u16::from_str_radix(digits, 16).ok()
}

/// The end (index of the closing quote) of the string whose content starts at `b[start..]`,
/// and whether it has escapes; `None` when `\u` escapes are not paired the way a
/// `serde_json::Value` read requires (a trailing surrogate alone, or a leading one not followed
/// by `\u` and a trailing one).
fn scan_string(b: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut i = start;
    let mut escaped = false;
    loop {
        i += memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
        if b[i] == b'"' {
            return Some((i, escaped));
        }
        escaped = true;
        if b.get(i + 1) != Some(&b'u') {
            i += 2;
            continue;
        }
        let n = hex4(b, i + 2)?;
        i += 6;
        if (0xDC00..=0xDFFF).contains(&n) {
            return None;
        }
        if (0xD800..=0xDBFF).contains(&n) {
            if b.get(i..i + 2) != Some(b"\\u") {
                return None;
            }
            let n2 = hex4(b, i + 2)?;
            if !(0xDC00..=0xDFFF).contains(&n2) {
                return None;
            }
            i += 6;
        }
    }
}

/// What [`scan_object`] learns about an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scanned<'a> {
    /// The kind of the whole value.
    kind: Kind,
    /// The kind of its last `metadata` member, if any.
    metadata: Option<Kind>,
    /// The text of its last `spec` member.
    spec: Option<&'a str>,
    /// The text of the last `deletionTimestamp` member of the last `metadata`, if an object.
    deletion_timestamp: Option<&'a str>,
    /// The text of the last `finalizers` member of the last `metadata`, if an object.
    finalizers: Option<&'a str>,
}

/// A member the scan keeps, by its key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Member {
    Spec,
    Metadata,
    DeletionTimestamp,
    Finalizers,
    Other,
}

/// Checks a request's object, given as text that is well-formed JSON (serde_json read it as a
/// `RawValue`, which checks the syntax), for what a `serde_json::Value` read checks beyond the
/// syntax: the nesting limit (at the object's depth in a review), `\u` surrogate pairs, and
/// numbers that do not fit an f64. On the way it notes where the members the rules read are
/// (later repeats of a key win, as in a Value). `None` when a Value read would fail, or when a
/// key of the object or of its `metadata` has escapes (not worth decoding here; the Value path
/// handles it).
fn scan_object(text: &str) -> Option<Scanned<'_>> {
    let b = text.as_bytes();
    let mut out = Scanned {
        kind: kind_at(*b.first()?),
        metadata: None,
        spec: None,
        deletion_timestamp: None,
        finalizers: None,
    };
    if out.kind != Kind::Object {
        return Some(out);
    }
    let mut depth = 0u32; // containers open around the current position
    let mut in_metadata = false; // inside the current `metadata` object
    let mut expect_key = false; // the next string is a key of the object or of its metadata
    let mut expect_value = false; // a key was just read: the next value is its member's
    let (mut key1, mut start1) = (Member::Other, None); // member at depth 1 and where it starts
    let (mut key2, mut start2) = (Member::Other, None); // member of metadata (depth 2)
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        // Where the value starting here ends (for a scalar), or that it opens a container.
        // (An if-chain in order of frequency: a `match` here compiles to a jump table whose
        // indirect branch mispredicts on almost every byte.)
        let (next, opens) = if c == b'"' {
            let (end, escaped) = scan_string(b, i + 1)?;
            if expect_key {
                if escaped {
                    return None;
                }
                let key = &b[i + 1..end];
                if depth == 1 {
                    key1 = match key {
                        b"spec" => Member::Spec,
                        b"metadata" => Member::Metadata,
                        _ => Member::Other,
                    };
                } else {
                    key2 = match key {
                        b"deletionTimestamp" => Member::DeletionTimestamp,
                        b"finalizers" => Member::Finalizers,
                        _ => Member::Other,
                    };
                }
                expect_key = false;
                expect_value = true;
                i = end + 1;
                continue;
            }
            (end + 1, false)
        } else if c == b':' {
            i += 1;
            continue;
        } else if c == b',' {
            expect_key = depth == 1 || (depth == 2 && in_metadata);
            i += 1;
            continue;
        } else if c == b'{' || c == b'[' {
            (i + 1, true)
        } else if c == b'}' || c == b']' {
            depth = depth.checked_sub(1)?;
            i += 1;
            close(
                &mut out,
                text,
                depth,
                i,
                (key1, &mut start1),
                (key2, &mut start2),
                &mut in_metadata,
            );
            continue;
        } else if c.is_ascii_digit() || c == b'-' {
            let len = b[i..]
                .iter()
                .position(|c| !matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                .unwrap_or(b.len() - i);
            let number = &text[i..i + len];
            // A plain integer of up to 19 digits is a u64 or an i64; anything else may be an
            // f64 out of range, which only serde_json itself can tell.
            let plain = len < 20 && !number.contains(['.', 'e', 'E']);
            if !plain && serde_json::from_str::<Value>(number).is_err() {
                return None;
            }
            (i + len, false)
        } else if c == b't' || c == b'n' {
            (i + 4, false)
        } else if c == b'f' {
            (i + 5, false)
        } else {
            i += 1; // whitespace
            continue;
        };
        if expect_value {
            expect_value = false;
            if depth == 1 {
                start1 = Some(i);
                if key1 == Member::Metadata {
                    // This metadata replaces any earlier one, members and all.
                    out.metadata = Some(kind_at(c));
                    out.deletion_timestamp = None;
                    out.finalizers = None;
                    in_metadata = c == b'{';
                }
            } else if depth == 2 && in_metadata {
                start2 = Some(i);
            }
        }
        if opens {
            depth += 1;
            if OBJECT_DEPTH + depth >= JSON_DEPTH_LIMIT {
                return None;
            }
            expect_key = c == b'{' && (depth == 1 || (depth == 2 && in_metadata));
        } else {
            close(
                &mut out,
                text,
                depth,
                next,
                (key1, &mut start1),
                (key2, &mut start2),
                &mut in_metadata,
            );
        }
        i = next;
    }
    Some(out)
}

/// A value at `depth` ended at `end`: note it if it is a member the scan keeps.
fn close<'a>(
    out: &mut Scanned<'a>,
    text: &'a str,
    depth: u32,
    end: usize,
    (key1, start1): (Member, &mut Option<usize>),
    (key2, start2): (Member, &mut Option<usize>),
    in_metadata: &mut bool,
) {
    if depth == 1
        && let Some(start) = start1.take()
    {
        match key1 {
            Member::Spec => out.spec = text.get(start..end),
            Member::Metadata => *in_metadata = false,
            _ => {}
        }
    } else if depth == 2
        && *in_metadata
        && let Some(start) = start2.take()
    {
        match key2 {
            Member::DeletionTimestamp => out.deletion_timestamp = text.get(start..end),
            Member::Finalizers => out.finalizers = text.get(start..end),
            _ => {}
        }
    }
}

/// The scan of `raw` (a request's object) when it is one [`parse`] accepts as a Value and that
/// passes [`check_envelope`]: it reads as a Value at its depth in the review, is an object, and
/// its `metadata` is absent, null or an object.
fn scan_text_object(raw: &RawValue) -> Option<Scanned<'_>> {
    scan_object(raw.get())
        .filter(|s| s.kind == Kind::Object && matches!(s.metadata, None | Some(Kind::Null | Kind::Object)))
}

/// The request of `body` with its objects as text, when [`parse`] would accept `body` and the
/// objects are well-formed; `None` for anything else (then [`parse`] decides).
fn parse_text(body: &[u8]) -> Option<(TextRequest<'_>, Option<Scanned<'_>>)> {
    let review = serde_json::from_slice::<TextReview<'_>>(body).ok()?;
    if review.kind != ADMISSION_KIND || review.api_version != ADMISSION_API_VERSION {
        return None;
    }
    let request = review.request?;
    let new = match request.object {
        Some(raw) => Some(scan_text_object(raw)?),
        None => None,
    };
    if let Some(raw) = request.old_object {
        scan_text_object(raw)?;
    }
    Some((request, new))
}

/// The part of a SmolVM that [`default_smolvm`] reads, as a Value it answers the same on: the
/// object's `spec`, and its `metadata` with only `deletionTimestamp` and `finalizers` (a
/// `metadata` that is not an object is null, which the rules treat alike).
fn defaulting_view(scan: &Scanned<'_>) -> Option<Value> {
    let mut object = serde_json::Map::new();
    if let Some(spec) = scan.spec {
        object.insert("spec".into(), serde_json::from_str(spec).ok()?);
    }
    match scan.metadata {
        None => {}
        Some(Kind::Object) => {
            let mut metadata = serde_json::Map::new();
            if let Some(v) = scan.deletion_timestamp {
                metadata.insert("deletionTimestamp".into(), serde_json::from_str(v).ok()?);
            }
            if let Some(v) = scan.finalizers {
                metadata.insert("finalizers".into(), serde_json::from_str(v).ok()?);
            }
            object.insert("metadata".into(), Value::Object(metadata));
        }
        Some(_) => {
            object.insert("metadata".into(), Value::Null);
        }
    }
    Some(Value::Object(object))
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

/// A finding as its `Display` writes it (`path: message [rule]`), built without the formatting
/// machinery.
fn finding_text(finding: &smolvm_api::validate::Finding) -> String {
    let rule = finding.rule.as_str();
    let mut text = String::with_capacity(finding.path.len() + finding.message.len() + rule.len() + 5);
    text.push_str(&finding.path);
    text.push_str(": ");
    text.push_str(&finding.message);
    text.push_str(" [");
    text.push_str(rule);
    text.push(']');
    text
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

/// The `response` of an AdmissionReview as this webhook fills it in: the uid, a denial (code,
/// reason, message) or none, a JSONPatch, warnings.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    uid: String,
    denial: Option<(u16, &'static str, String)>,
    patch: Option<Vec<u8>>,
    warnings: Option<Vec<String>>,
}

/// The response skeleton for a request: allowed, `uid` echoed.
fn response_to(uid: &str) -> Answer {
    Answer {
        uid: uid.to_string(),
        denial: None,
        patch: None,
        warnings: None,
    }
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

fn deny(mut response: Answer, code: u16, reason: &'static str, message: &str) -> Answer {
    response.denial = Some((code, reason, message.to_string()));
    response
}

/// `response` with `patch` (as JSON bytes, the encoding kube-core's `AdmissionResponse::with_patch`
/// uses).
fn with_patch(mut response: Answer, patch: &json_patch::Patch) -> Result<Answer, RequestError> {
    let bytes = serde_json::to_vec(patch)
        .map_err(|e| RequestError::Internal(format!("encoding the patch: failed to serialize patch: {e}")))?;
    response.patch = Some(bytes);
    Ok(response)
}

/// Appends `text` as a JSON string (serde_json's escaping).
fn put_str(out: &mut Vec<u8>, text: &str) -> Result<(), RequestError> {
    serde_json::to_writer(&mut *out, text).map_err(|e| RequestError::Internal(format!("encoding the response: {e}")))
}

/// Appends `n` in decimal.
fn put_u16(out: &mut Vec<u8>, n: u16) {
    let mut digits = [0u8; 5];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// `byte` in decimal (the patch is an array of byte values on the wire).
fn byte_decimal(byte: u8) -> &'static [u8] {
    static TABLE: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        // Three bytes per value: the digits, left-aligned; the length follows from the value.
        (0..=255u16)
            .flat_map(|n| {
                let digits = [(n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8].map(|d| b'0' + d);
                let skip = if n >= 100 {
                    0
                } else if n >= 10 {
                    1
                } else {
                    2
                };
                let mut out = [b' '; 3];
                out[..3 - skip].copy_from_slice(&digits[skip..]);
                out
            })
            .collect()
    });
    let len = if byte >= 100 {
        3
    } else if byte >= 10 {
        2
    } else {
        1
    };
    let at = 3 * usize::from(byte);
    &TABLE[at..at + len]
}

/// The AdmissionReview carrying `response`, byte for byte as serde_json writes kube-core's
/// `AdmissionResponse::into_review()` (fields in declaration order, empty ones left out, the
/// patch as an array of byte values), without building those types.
fn encode(response: Answer) -> Result<Vec<u8>, RequestError> {
    let Answer {
        uid,
        denial,
        patch,
        warnings,
    } = response;
    let mut out = Vec::with_capacity(160 + uid.len() + patch.as_ref().map_or(0, |p| 4 * p.len()));
    out.extend_from_slice(br#"{"apiVersion":"#);
    put_str(&mut out, ADMISSION_API_VERSION)?;
    out.extend_from_slice(br#","kind":"#);
    put_str(&mut out, ADMISSION_KIND)?;
    out.extend_from_slice(br#","response":{"uid":"#);
    put_str(&mut out, &uid)?;
    match &denial {
        None => out.extend_from_slice(br#","allowed":true,"status":{}"#),
        Some((code, reason, message)) => {
            out.extend_from_slice(br#","allowed":false,"status":{"status":"Failure""#);
            if *code != 0 {
                out.extend_from_slice(br#","code":"#);
                put_u16(&mut out, *code);
            }
            if !message.is_empty() {
                out.extend_from_slice(br#","message":"#);
                put_str(&mut out, message)?;
            }
            if !reason.is_empty() {
                out.extend_from_slice(br#","reason":"#);
                put_str(&mut out, reason)?;
            }
            out.push(b'}');
        }
    }
    if let Some(patch) = &patch {
        out.extend_from_slice(br#","patch":["#);
        for (i, byte) in patch.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(byte_decimal(*byte));
        }
        out.extend_from_slice(br#"],"patchType":"JSONPatch""#);
    }
    if let Some(warnings) = &warnings {
        out.extend_from_slice(br#","warnings":["#);
        for (i, warning) in warnings.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            put_str(&mut out, warning)?;
        }
        out.push(b']');
    }
    out.extend_from_slice(b"}}");
    Ok(out)
}

/// A request's objects: parsed (by [`parse`]) or as JSON text (by [`parse_text`]).
enum Objects<'a> {
    Parsed {
        new: Option<Value>,
        old: Option<Value>,
    },
    Text {
        new: Option<(&'a str, Scanned<'a>)>,
        old: Option<&'a str>,
    },
}

impl Objects<'_> {
    fn has_new(&self) -> bool {
        match self {
            Objects::Parsed { new, .. } => new.is_some(),
            Objects::Text { new, .. } => new.is_some(),
        }
    }

    fn default_patch(&self, operation: Operation) -> json_patch::Patch {
        match self {
            Objects::Parsed { new: Some(new), .. } => default_smolvm(operation, new),
            Objects::Text {
                new: Some((text, scan)),
                ..
            } => match defaulting_view(scan) {
                Some(view) => default_smolvm(operation, &view),
                None => default_smolvm(operation, &serde_json::from_str(text).unwrap_or(Value::Null)),
            },
            _ => json_patch::Patch(Vec::new()),
        }
    }

    /// Validates the new SmolVM as `patch` (its defaults) leaves it, against the old object as
    /// it came: the verdict the validating endpoint will reach on the same object, given before
    /// the API server's schema and CEL checks can stop the request at their first objection.
    fn validate_defaulted(&self, patch: &json_patch::Patch, operation: Operation, ctx: &Context<'_>) -> Verdict {
        // The fast path: the object decodes straight from its text; only the small defaulting
        // view (spec, finalizers) is patched as a Value.
        if let Objects::Text {
            new: Some((text, scan)),
            old,
        } = self
            && let Some(mut view) = defaulting_view(scan)
            && json_patch::patch(&mut view, patch).is_ok()
        {
            return smolvm_api::validate::validate_smolvm_defaulted(
                operation,
                old.map(Raw::Text),
                Raw::Text(text),
                view.get("spec"),
                ctx,
            );
        }
        let mut new = match self {
            Objects::Parsed { new: Some(new), .. } => new.clone(),
            Objects::Text {
                new: Some((text, _)), ..
            } => match serde_json::from_str(text) {
                Ok(value) => value,
                // Not JSON after all: the rules' own decoding reports it.
                Err(_) => return self.validate(Route::ValidateSmolVM, false, operation, ctx),
            },
            _ => return Verdict::default(),
        };
        if json_patch::patch(&mut new, patch).is_err() {
            // A patch that does not apply is a defaulting bug; judge the object as sent.
            return self.validate(Route::ValidateSmolVM, false, operation, ctx);
        }
        let old = match self {
            Objects::Parsed { old, .. } => old.as_ref().map(Raw::Value),
            Objects::Text { old, .. } => old.map(Raw::Text),
        };
        validate_raw(Target::SmolVM, operation, old, Raw::Value(&new), ctx)
    }

    fn validate(&self, route: Route, status: bool, operation: Operation, ctx: &Context<'_>) -> Verdict {
        let target = match (route, status) {
            (Route::ValidateSmolVMNode, true) => Target::SmolVMNodeStatus,
            (Route::ValidateSmolVMNode, false) => Target::SmolVMNode,
            (_, true) => Target::SmolVMStatus,
            (_, false) => Target::SmolVM,
        };
        match self {
            Objects::Parsed { new: Some(new), old } => {
                validate_raw(target, operation, old.as_ref().map(Raw::Value), Raw::Value(new), ctx)
            }
            Objects::Text {
                new: Some((new, _)),
                old,
            } => validate_raw(target, operation, old.map(Raw::Text), Raw::Text(new), ctx),
            _ => Verdict::default(),
        }
    }
}

/// The parts of a request that [`review`] uses.
struct Request<'a> {
    uid: String,
    resource: GroupVersionResource,
    sub_resource: Option<String>,
    operation: WireOperation,
    user_info: UserInfo,
    objects: Objects<'a>,
}

impl<O> WireRequest<O> {
    /// The request, its objects made into [`Objects`] by `objects(new, old)`.
    fn with_objects<'a>(self, objects: impl FnOnce(Option<O>, Option<O>) -> Objects<'a>) -> Request<'a> {
        Request {
            uid: self.uid,
            resource: self.resource,
            sub_resource: self.sub_resource,
            operation: self.operation,
            user_info: self.user_info,
            objects: objects(self.object, self.old_object),
        }
    }
}

impl From<WireRequest> for Request<'_> {
    fn from(r: WireRequest) -> Self {
        r.with_objects(|new, old| Objects::Parsed {
            new: new.filter(|o| !o.is_null()),
            old: old.filter(|o| !o.is_null()),
        })
    }
}

impl<'a> From<(TextRequest<'a>, Option<Scanned<'a>>)> for Request<'a> {
    fn from((r, scan): (TextRequest<'a>, Option<Scanned<'a>>)) -> Self {
        // JSON null is `None` already (serde reads `null` into an absent Option).
        r.with_objects(|new, old| Objects::Text {
            new: new.map(RawValue::get).zip(scan),
            old: old.map(RawValue::get),
        })
    }
}

/// Reviews one AdmissionReview body for `route` under `policy`, with `nodes` the known
/// SmolVMNodes.
///
/// A well-formed review is read with its objects left as JSON text, which the rules decode
/// straight into their types; anything else goes through [`parse`], whose errors are the
/// answer. Both give the same response.
pub fn review(route: Route, body: &[u8], policy: &Policy, nodes: &dyn NodeCatalog) -> Result<Reviewed, RequestError> {
    match parse_text(body) {
        Some(request) => review_request(route, request.into(), policy, nodes),
        None => review_request(route, parse(body)?.into(), policy, nodes),
    }
}

/// [`review`] through [`parse`] only (objects as Values): the reference the fast path is
/// checked against.
#[cfg(test)]
fn review_parsed(
    route: Route,
    body: &[u8],
    policy: &Policy,
    nodes: &dyn NodeCatalog,
) -> Result<Reviewed, RequestError> {
    review_request(route, parse(body)?.into(), policy, nodes)
}

fn review_request(
    route: Route,
    request: Request<'_>,
    policy: &Policy,
    nodes: &dyn NodeCatalog,
) -> Result<Reviewed, RequestError> {
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
    let base = response_to(&request.uid);

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
    let identity = Identity {
        username: request.user_info.username.unwrap_or_default(),
        groups: request.user_info.groups.unwrap_or_default(),
        extra: request.user_info.extra.unwrap_or_default(),
    };
    let objects = request.objects;
    if !objects.has_new() {
        return Err(RequestError::Malformed(format!(
            "request.object is required for {}",
            operation.as_str()
        )));
    }

    let ctx = Context {
        policy,
        nodes,
        identity: &identity,
    };
    let response = match route {
        Route::MutateSmolVM => {
            if status {
                base
            } else {
                let patch = objects.default_patch(operation);
                // Every violation in one answer: the API server checks the CRD schema and its CEL
                // rules after mutating admission and stops at their objection, so the complete
                // list is given here, on the defaulted object, with the validating endpoint's
                // text. Warnings are left to the validating endpoint (said once, not twice).
                let verdict = objects.validate_defaulted(&patch, operation, &ctx);
                if !verdict.allowed() {
                    outcome.verdict = "denied";
                    outcome.rules = verdict.violated_rules();
                    let (code, reason) = denial_code(&verdict);
                    deny(base, code, reason, &verdict.message())
                } else if patch.0.is_empty() {
                    base
                } else {
                    outcome.patched = true;
                    with_patch(base, &patch)?
                }
            }
        }
        Route::ValidateSmolVM | Route::ValidateSmolVMNode => {
            let verdict = objects.validate(route, status, operation, &ctx);
            let mut response = base;
            if !verdict.warnings.is_empty() {
                response.warnings = Some(verdict.warnings.iter().map(finding_text).collect());
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

    /// The body of `body()` with `object` spliced in as raw text.
    fn body_with_object_text(route_resource: &str, op: &str, object: &str, old: &str) -> Vec<u8> {
        let template = body(route_resource, None, op, json!("OBJECT"), json!("OLD"));
        let text = String::from_utf8(template).unwrap_or_default();
        text.replace("\"OBJECT\"", object).replace("\"OLD\"", old).into_bytes()
    }

    fn nested(depth: usize, inner: &str) -> String {
        format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
    }

    /// Reading the objects as text answers exactly as reading them as Values does, for
    /// well-formed reviews and for every kind of malformed object.
    #[test]
    fn text_objects_answer_like_values() {
        let policy = fixtures::policy();
        let nodes = vec![fixtures::node("node-a", 4, 4096, 100)];
        let alpine = serde_json::to_string(&fixtures::alpine()).unwrap_or_default();
        let bound = serde_json::to_string(&fixtures::bound(fixtures::alpine(), "node-a")).unwrap_or_default();
        let mut bodies: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut texts: Vec<(&str, String, String)> = vec![
            ("alpine", alpine.clone(), "null".into()),
            ("update", bound.replace("\"cpus\":1", "\"cpus\":2"), bound.clone()),
            ("bad image", alpine.replace("alpine:latest", "Not An Image"), "null".into()),
            ("no spec", r#"{"metadata":{"name":"a"}}"#.into(), "null".into()),
            ("spec string", r#"{"metadata":{"name":"a"},"spec":"x"}"#.into(), "null".into()),
            ("metadata string", r#"{"metadata":"x","spec":{}}"#.into(), "null".into()),
            ("metadata array", r#"{"metadata":[],"spec":{"image":"a"}}"#.into(), "null".into()),
            ("metadata null", r#"{"metadata":null,"spec":{"image":"a"}}"#.into(), "null".into()),
            ("object array", "[1]".into(), "null".into()),
            ("object string", r#""x""#.into(), "null".into()),
            ("old object number", alpine.clone(), "5".into()),
            ("old does not decode", alpine.clone(), r#"{"spec":{"image":5}}"#.into()),
            (
                "repeated metadata, last is a string",
                r#"{"metadata":{},"metadata":"x","spec":{"image":"a"}}"#.into(),
                "null".into(),
            ),
            (
                "repeated metadata, last is an object",
                r#"{"metadata":"x","metadata":{"name":"a"},"spec":{"image":"alpine"}}"#.into(),
                "null".into(),
            ),
            (
                "repeated spec",
                r#"{"metadata":{"name":"a"},"spec":{"image":"Bad Image"},"spec":{"image":"alpine"}}"#.into(),
                "null".into(),
            ),
            (
                "repeated finalizers",
                r#"{"metadata":{"name":"a","finalizers":["vm.smolvm.dev/node-cleanup"],"finalizers":[]},"spec":{"image":"alpine"}}"#.into(),
                "null".into(),
            ),
            (
                "repeated labels",
                r#"{"metadata":{"name":"a","labels":{"a":"1","a":"2"}},"spec":{"image":"alpine","nodeSelector":{"k":"v","k":"Bad Value!"}}}"#.into(),
                "null".into(),
            ),
            (
                "escaped keys",
                r#"{"meta\u0064ata":{"name":"a"},"sp\u0065c":{"image":"alpin\u0065","running":null}}"#.into(),
                "null".into(),
            ),
            (
                "number out of range in an unread field",
                r#"{"metadata":{"name":"a"},"spec":{"image":"alpine"},"x":1e999}"#.into(),
                "null".into(),
            ),
            (
                "lone surrogate in an unread field",
                r#"{"metadata":{"name":"a"},"spec":{"image":"alpine"},"x":"\ud800"}"#.into(),
                "null".into(),
            ),
            (
                "float where an integer goes",
                r#"{"metadata":{"name":"a"},"spec":{"image":"alpine","resources":{"cpus":1.0}}}"#.into(),
                "null".into(),
            ),
            (
                "deleting",
                serde_json::to_string(&fixtures::deleting(fixtures::alpine())).unwrap_or_default(),
                "null".into(),
            ),
        ];
        // Nesting around serde_json's limit, in a field the rules do not read.
        for depth in 120..=128 {
            let object = format!(
                r#"{{"metadata":{{"name":"a"}},"spec":{{"image":"alpine"}},"x":{}}}"#,
                nested(depth, "1")
            );
            texts.push(("nested", object, "null".into()));
        }
        for (name, object, old) in &texts {
            for op in ["CREATE", "UPDATE"] {
                bodies.push((name, body_with_object_text("smolvms", op, object, old)));
            }
        }
        // Whole bodies that are not well-formed reviews.
        let mut wrong_kind = body("smolvms", None, "CREATE", fixtures::alpine(), Value::Null);
        wrong_kind = String::from_utf8(wrong_kind)
            .unwrap_or_default()
            .replace("AdmissionReview", "Pod")
            .into_bytes();
        bodies.push(("wrong kind", wrong_kind));
        bodies.push(("not json", b"{".to_vec()));
        bodies.push((
            "no request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
        ));
        bodies.push((
            "status",
            body(
                "smolvms",
                Some("status"),
                "UPDATE",
                fixtures::bound(fixtures::alpine(), "node-a"),
                fixtures::bound(fixtures::alpine(), "node-a"),
            ),
        ));
        bodies.push((
            "node",
            body(
                "smolvmnodes",
                None,
                "CREATE",
                json!({"metadata": {"name": "n"}, "spec": {}}),
                Value::Null,
            ),
        ));
        bodies.push((
            "node status",
            body(
                "smolvmnodes",
                Some("status"),
                "UPDATE",
                json!({"metadata": {"name": "n"}, "spec": {}, "status": {"endpoint": {"address": "nope", "port": 0}}}),
                Value::Null,
            ),
        ));
        bodies.push((
            "delete",
            body("smolvms", None, "DELETE", Value::Null, fixtures::alpine()),
        ));
        bodies.push((
            "create without object",
            body("smolvms", None, "CREATE", Value::Null, Value::Null),
        ));

        let mut fast = 0;
        for (name, body) in &bodies {
            if parse_text(body).is_some() {
                fast += 1;
            }
            for route in Route::ALL {
                let got = review(route, body, &policy, &nodes);
                let want = review_parsed(route, body, &policy, &nodes);
                match (&got, &want) {
                    (Ok(g), Ok(w)) => {
                        assert_eq!(g.outcome, w.outcome, "{name} {route:?}");
                        assert_eq!(
                            String::from_utf8_lossy(&g.body),
                            String::from_utf8_lossy(&w.body),
                            "{name} {route:?}"
                        );
                    }
                    _ => assert_eq!(got.as_ref().err(), want.as_ref().err(), "{name} {route:?}"),
                }
            }
        }
        // The fast path is actually taken for most of them.
        assert!(fast > bodies.len() / 2, "{fast} of {}", bodies.len());
    }

    /// JSON text for property tests: values with the escapes, numbers and nesting where a
    /// `serde_json::Value` read is stricter than the syntax.
    fn json_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let string = prop::collection::vec(
            prop_oneof![
                Just("a".to_string()),
                Just("metadata".to_string()),
                Just("spec".to_string()),
                Just("finalizers".to_string()),
                Just("deletionTimestamp".to_string()),
                Just("vm.smolvm.dev/node-cleanup".to_string()),
                Just("\\\"".to_string()),
                Just("\\\\".to_string()),
                Just("\\n".to_string()),
                Just("\\u0041".to_string()),
                Just("\\ud800".to_string()),
                Just("\\udc00".to_string()),
                Just("\\ud83d\\ude00".to_string()),
                Just("\\ud83d\\u0041".to_string()),
                Just("\\ud83d\\n".to_string()),
                Just("é".to_string()),
            ],
            0..4,
        )
        .prop_map(|parts| format!("\"{}\"", parts.concat()));
        let number = prop_oneof![
            Just("0".to_string()),
            Just("-0".to_string()),
            Just("1.5".to_string()),
            Just("-2e3".to_string()),
            Just("1e400".to_string()),
            Just("-1E400".to_string()),
            Just("1e-400".to_string()),
            Just("18446744073709551616".to_string()),
            Just("-9223372036854775809".to_string()),
            Just("9".repeat(320)),
            Just("1".to_string()),
        ];
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            number,
            string.clone(),
        ];
        leaf.prop_recursive(4, 24, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((string.clone(), inner), 0..4).prop_map(|v| {
                    let members: Vec<String> = v.into_iter().map(|(k, v)| format!("{k} : {v}")).collect();
                    format!("{{ {} }}", members.join(" , "))
                }),
            ]
        })
    }

    proptest::proptest! {
        /// The text path accepts an object only if the Value path does, and then answers alike.
        #[test]
        fn text_path_is_sound(
            metadata in json_text(),
            extra in json_text(),
            depth in 0usize..130,
            which in 0usize..6,
        ) {
            let policy = fixtures::policy();
            let nodes: Vec<smolvm_api::SmolVMNode> = Vec::new();
            let object = match which {
                0 => format!(r#"{{"metadata":{metadata},"spec":{{"image":"alpine"}},"x":{extra}}}"#),
                1 => format!(r#"{{"metadata":{{"name":"a","annotations":{{"k":{extra}}}}},"spec":{{"image":"alpine"}}}}"#),
                2 => format!(r#"{{"spec":{{"image":"alpine"}},"x":{}}}"#, nested(depth, &extra)),
                3 => extra.clone(),
                4 => format!(
                    r#"{{"metadata":{{"name":"a","finalizers":{extra},"deletionTimestamp":{metadata}}},"spec":{{"image":"alpine","network":{extra}}}}}"#
                ),
                _ => format!(
                    r#"{{"spec":{extra},"metadata":{{"finalizers":["vm.smolvm.dev/node-cleanup"],"deletionTimestamp":"t"}},"spec":{{"image":"alpine","resources":{metadata}}},"metadata":{{"name":"b","finalizers":{extra}}}}}"#
                ),
            };
            let body = body_with_object_text("smolvms", "CREATE", &object, "null");
            let fast = parse_text(&body).is_some();
            let slow = parse(&body);
            proptest::prop_assert!(!fast || slow.is_ok(), "{object}: text path accepted, Value path: {:?}", slow.err());
            // Where the Value path accepts a plain object, the text path does too (it only
            // leaves escaped keys of the object and of its metadata to the Value path).
            if slow.is_ok() && which != 3 && !(matches!(which, 0 | 4) && metadata.contains('\\')) {
                proptest::prop_assert!(fast, "{object}: text path refused what the Value path accepts");
            }
            for route in Route::ALL {
                let got = review(route, &body, &policy, &nodes);
                let want = review_parsed(route, &body, &policy, &nodes);
                match (&got, &want) {
                    (Ok(g), Ok(w)) => {
                        proptest::prop_assert_eq!(&g.outcome, &w.outcome);
                        proptest::prop_assert_eq!(&g.body, &w.body);
                    }
                    _ => proptest::prop_assert_eq!(got.as_ref().err(), want.as_ref().err()),
                }
            }
        }
    }

    /// kube-core's encoding of the same answer: the reference for [`encode`].
    fn encode_with_kube(answer: &Answer) -> Vec<u8> {
        use kube::core::{Status, TypeMeta, admission::AdmissionResponse};
        let mut response = AdmissionResponse::invalid("");
        response.types = TypeMeta {
            api_version: ADMISSION_API_VERSION.into(),
            kind: ADMISSION_KIND.into(),
        };
        response.uid = answer.uid.clone();
        response.allowed = true;
        response.result = Status::default();
        if let Some(patch) = &answer.patch {
            let ops: json_patch::Patch = serde_json::from_slice(patch).unwrap_or_else(|e| panic!("{e}"));
            response = response.with_patch(ops).unwrap_or_else(|e| panic!("{e}"));
        }
        response.warnings = answer.warnings.clone();
        if let Some((code, reason, message)) = &answer.denial {
            response.allowed = false;
            response.result = Status::failure(message, reason).with_code(*code);
        }
        serde_json::to_vec(&response.into_review()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn finding_text_is_its_display() {
        let mut bad = fixtures::alpine();
        bad["spec"]["image"] = json!("Not An Image");
        bad["spec"]["resources"]["cpus"] = json!(4096);
        bad["spec"]["network"]["ports"][0]["hostPort"] = json!(80);
        let policy = fixtures::policy();
        let nodes: Vec<smolvm_api::SmolVMNode> = Vec::new();
        let identity = fixtures::user();
        let ctx = Context {
            policy: &policy,
            nodes: &nodes,
            identity: &identity,
        };
        let verdict = smolvm_api::validate::validate_smolvm_json(Operation::Create, None, &bad, &ctx);
        let findings: Vec<_> = verdict.violations.iter().chain(&verdict.warnings).collect();
        assert!(findings.len() >= 3, "{findings:?}");
        for finding in findings {
            assert_eq!(finding_text(finding), finding.to_string());
        }
    }

    #[test]
    fn byte_values_in_decimal() {
        for byte in 0..=255u8 {
            assert_eq!(byte_decimal(byte), byte.to_string().as_bytes());
        }
    }

    #[test]
    fn encoding_matches_kube_core() {
        let patch = serde_json::to_vec(&default_smolvm(Operation::Create, &json!({"metadata": {}, "spec": {}})))
            .unwrap_or_default();
        let uids = ["", "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4", "quote\" back\\ \u{1} ünï €"];
        let denials = [
            None,
            Some((
                422,
                "Invalid",
                "spec.image: \"x y\" contains the character ' ' [V1]; tab\there".to_string(),
            )),
            Some((403, "Forbidden", String::new())),
            Some((400, "BadRequest", "é\u{7f}\u{2028}".to_string())),
            Some((0, "Invalid", "m".to_string())),
        ];
        let warnings = [
            None,
            Some(vec![]),
            Some(vec!["one \"quoted\"".to_string(), "two\n".to_string()]),
        ];
        for uid in uids {
            for denial in &denials {
                for patch in [None, Some(patch.clone()), Some(b"[]".to_vec())] {
                    for warnings in &warnings {
                        let answer = Answer {
                            uid: uid.to_string(),
                            denial: denial.clone(),
                            patch: patch.clone(),
                            warnings: warnings.clone(),
                        };
                        let ours = encode(answer.clone()).unwrap_or_default();
                        assert_eq!(
                            String::from_utf8_lossy(&ours),
                            String::from_utf8_lossy(&encode_with_kube(&answer)),
                            "{answer:?}"
                        );
                    }
                }
            }
        }
    }

    /// The nesting limit of the text path is serde_json's, at the objects' depth in a review.
    #[test]
    fn nesting_limit_matches_serde_json() {
        for depth in 118..=130 {
            let object = format!(r#"{{"spec":{}}}"#, nested(depth, "1"));
            let body = body_with_object_text("smolvms", "CREATE", &object, "null");
            assert_eq!(
                parse_text(&body).is_some(),
                parse(&body).is_ok(),
                "depth {depth}: {:?}",
                parse(&body).err()
            );
        }
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
