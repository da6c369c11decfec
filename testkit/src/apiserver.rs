//! The one TEST DOUBLE of the Kubernetes API server: a `tower-test` mock service behind a real
//! `kube::Client`. No API server runs; the test sees every request the code makes and answers
//! it. Three ways to drive it, from the same plumbing:
//!
//! - call by call: [`next_call`], then [`Call::answer`] (or drop the call to leave it hanging);
//! - scripted: [`serve`] takes the expected calls in order ([`expect`], [`expect_answer`]) and
//!   fails on anything else;
//! - stateful: [`serve_with`] answers every request through a function, for a fake that keeps
//!   objects (concurrent replicas racing on one Secret, say).

use std::future::Future;
use std::time::Duration;

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::Value;

/// The test's end of the double.
pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// How long a test waits for a call it expects before failing.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A `kube::Client` (default namespace `namespace`) whose requests arrive at the handle.
pub fn client(namespace: &str) -> (kube::Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, namespace), handle)
}

/// One request as the double received it.
pub struct Call {
    /// The method.
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The path and the query.
    pub path_and_query: String,
    /// The request's content type.
    pub content_type: Option<String>,
    /// The JSON body (`Null` when empty or not JSON).
    pub body: Value,
    respond: tower_test::mock::SendResponse<Response<Body>>,
}

impl Call {
    /// Answers with `status` and `body` as JSON.
    pub fn answer(self, status: u16, body: &Value) {
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap_or_default()));
        if let Ok(response) = response {
            self.respond.send_response(response);
        }
    }
}

async fn read(request: Request<Body>, respond: tower_test::mock::SendResponse<Response<Body>>) -> Call {
    let (parts, body) = request.into_parts();
    let bytes = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    Call {
        method: parts.method,
        path: parts.uri.path().to_string(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default(),
        content_type: parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        respond,
    }
}

/// The next call, or `None` when none comes within `wait` (or the client is gone).
pub async fn next_call_within(handle: &mut Handle, wait: Duration) -> Option<Call> {
    match tokio::time::timeout(wait, handle.next_request()).await {
        Ok(Some((request, respond))) => Some(read(request, respond).await),
        _ => None,
    }
}

/// The next call; fails the test when none comes within [`CALL_TIMEOUT`].
pub async fn next_call(handle: &mut Handle) -> Call {
    match next_call_within(handle, CALL_TIMEOUT).await {
        Some(call) => call,
        None => panic!("expected a call to the API server within {CALL_TIMEOUT:?}, got none"),
    }
}

/// Answers every request with `respond(method, path, body bytes)` until the client is gone;
/// requests are answered concurrently, as a real API server does.
pub fn serve_with<F, Fut>(mut handle: Handle, respond: F)
where
    F: Fn(Method, String, Vec<u8>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = (u16, Value)> + Send + 'static,
{
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let respond = respond.clone();
            tokio::spawn(async move {
                let (parts, body) = request.into_parts();
                let bytes = body.collect().await.map(|c| c.to_bytes().to_vec()).unwrap_or_default();
                let (status, value) = respond(parts.method, parts.uri.path().to_string(), bytes).await;
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&value).unwrap_or_default()));
                if let Ok(response) = response {
                    send.send_response(response);
                }
            });
        }
    });
}

/// One expected call of a script: method, path (without query), and a check of the JSON body.
pub struct Expect {
    /// The method.
    pub method: Method,
    /// The path.
    pub path: String,
    /// A check of the request's JSON body.
    pub check: Box<dyn Fn(&Value) + Send>,
    /// The answer's status and body; `None`: 200 with the script's object (for a call under its
    /// path) or the request body echoed.
    pub answer: Option<(u16, Value)>,
}

/// An expected call answered 200 (see [`Expect::answer`]), its body checked by `check`.
pub fn expect(method: Method, path: impl Into<String>, check: impl Fn(&Value) + Send + 'static) -> Expect {
    Expect {
        method,
        path: path.into(),
        check: Box::new(check),
        answer: None,
    }
}

/// An expected call answered with `status` and `body`.
pub fn expect_answer(method: Method, path: impl Into<String>, status: u16, body: Value) -> Expect {
    Expect {
        method,
        path: path.into(),
        check: Box::new(|_| {}),
        answer: Some((status, body)),
    }
}

/// The API server's 404 Status for `kind` `name`.
pub fn not_found(kind: &str, name: &str) -> Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{kind} \"{name}\" not found"), "reason": "NotFound", "code": 404})
}

/// The API server's 409 Status for a write on a stale resourceVersion.
pub fn conflict() -> Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "reason": "Conflict", "code": 409, "message": "the object has been modified"})
}

/// Serves the expected calls in order, answering each as its [`Expect`] says (`object` for a
/// call under `object_path`), and fails on a missing, different or extra call. Returns how many
/// calls it served.
pub async fn serve(mut handle: Handle, calls: Vec<Expect>, object: Value, object_path: &str) -> usize {
    let mut served = 0;
    for expected in calls {
        let Some(call) = next_call_within(&mut handle, CALL_TIMEOUT).await else {
            panic!("expected {} {}, got no request", expected.method, expected.path)
        };
        assert_eq!(
            call.method, expected.method,
            "method of call {served}: {}",
            call.path_and_query
        );
        assert_eq!(call.path, expected.path, "path of call {served}");
        (expected.check)(&call.body);
        let (status, reply) = match expected.answer {
            Some(answer) => answer,
            None if expected.path.starts_with(object_path) => (200, object.clone()),
            None => (200, call.body.clone()),
        };
        call.answer(status, &reply);
        served += 1;
    }
    // Nothing else may be called.
    if let Some(call) = next_call_within(&mut handle, Duration::from_millis(300)).await {
        panic!("unexpected call {} {}", call.method, call.path_and_query);
    }
    served
}
