//! The access API's handlers: authenticate the front proxy's user, authorize the call with a
//! SubjectAccessReview, find the VM's node and machine, and pass the call to that node's agent
//! over the node API (mTLS + token), streaming what comes back.

use std::{sync::Arc, time::Duration};

use axum::{
    Extension,
    body::{Body, Bytes},
    extract::{Path, RawQuery, State},
    http::{HeaderMap, HeaderValue, Method, header},
    response::{IntoResponse, Response},
};
use futures::TryStreamExt;
use http_body_util::{BodyExt, StreamBody};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::{Api, api::PostParams};
use smolvm_api::{
    SmolVM, SmolVMNode,
    nodeapi::{EXEC_DEFAULT_TIMEOUT_SECONDS, ExecRequest, MAX_FILE_BYTES, Operation},
};

use super::{
    AccessError, AccessState,
    error::Outcome,
    frontproxy::{Peer, User},
    limits::Slot,
    request::{self, Subresource, Target},
};
use crate::nodeclient::StreamedBody;

/// Extra time an exec's answer may take beyond the command's own limit.
const EXEC_MARGIN: Duration = Duration::from_secs(30);

/// How long an exec or copy waits for a VM suspended for idleness to wake.
const WAKE_WAIT: Duration = Duration::from_secs(60);

/// Wakes a VM the controller suspended for idleness (SPEC 2.7): asks with the wake annotation,
/// then waits (at most [`WAKE_WAIT`]) until the controller reports it Running, instead of
/// answering 409.
async fn wake(vms: &Api<SmolVM>, vm: SmolVM, user: &User) -> Result<SmolVM, AccessError> {
    let name = vm.metadata.name.clone().unwrap_or_default();
    let at = k8s_openapi::jiff::Timestamp::now();
    let at = k8s_openapi::jiff::Timestamp::from_second(at.as_second()).unwrap_or(at);
    let patch = serde_json::json!({
        "metadata": { "annotations": { smolvm_api::constants::WAKE_ANNOTATION: at.to_string() } }
    });
    tracing::info!(user = %user.name, smolvm = %name, "waking the SmolVM suspended for idleness before the call");
    vms.patch(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    let deadline = tokio::time::Instant::now() + WAKE_WAIT;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(now) = vms.get_opt(&name).await?
            && request::woken(&now)
        {
            return Ok(now);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(AccessError::Unavailable(format!(
                "SmolVM {name} was suspended for idleness and did not run within {}s of the wake; its Suspended condition says why (ResumePending: no room on its node or in its quota)",
                WAKE_WAIT.as_secs()
            )));
        }
    }
}

/// The user, authorized, and where their VM's machine is.
struct Call {
    user: User,
    target: Target,
}

impl AccessState {
    /// Authenticates, authorizes and locates one call; every refusal is logged (naming the user
    /// and the VM) and answered as a Kubernetes `Status`.
    async fn begin(
        &self,
        peer: &Peer,
        headers: &HeaderMap,
        (namespace, name): (&str, &str),
        sub: Subresource,
        method: &Method,
    ) -> Result<Call, AccessError> {
        let verb = sub.verb(method).ok_or_else(|| {
            AccessError::MethodNotAllowed(format!("smolvms/{} does not serve {method}", sub.as_str()))
        })?;
        let user = self.requestheader().authenticate(peer, headers)?;
        let review = request::access_review(&user, namespace, name, sub, verb);
        let reviewed = Api::<SubjectAccessReview>::all(self.kube.clone())
            .create(&PostParams::default(), &review)
            .await?;
        if let Err(denied) = request::verdict(reviewed.status.as_ref(), &user, namespace, name, sub, verb) {
            tracing::info!(user = %user.name, %namespace, smolvm = %name, subresource = sub.as_str(), verb, "access denied by the SubjectAccessReview");
            return Err(denied);
        }
        let vms = Api::<SmolVM>::namespaced(self.kube.clone(), namespace);
        let vm = vms
            .get_opt(name)
            .await?
            .ok_or_else(|| AccessError::NotFound(format!("smolvms.vm.smolvm.dev {name:?} not found")))?;
        let vm = match request::wakes(&vm, sub) {
            true => wake(&vms, vm, &user).await?,
            false => vm,
        };
        let target = request::target(&vm)?;
        let node = Api::<SmolVMNode>::all(self.kube.clone()).get_opt(&target.node).await?;
        let endpoint = node
            .as_ref()
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.endpoint.as_ref())
            .and_then(|e| u16::try_from(e.port).ok().map(|port| (e.address.clone(), port)));
        match endpoint {
            Some((address, port)) => self.nodes.endpoints().set(&target.node, &address, port),
            None => {
                return Err(AccessError::Unavailable(format!(
                    "SmolVM {} runs on node {}, whose runtime agent has not reported where it listens{}",
                    target.vm,
                    target.node,
                    if node.is_none() {
                        " (no SmolVMNode of that name)"
                    } else {
                        ""
                    }
                )));
            }
        }
        tracing::info!(user = %user.name, %namespace, smolvm = %name, subresource = sub.as_str(), verb, node = %target.node, "access granted");
        Ok(Call { user, target })
    }

    /// Counts the outcome of a call and turns its error into the answer.
    fn finish(&self, sub: Subresource, result: Result<Response, AccessError>) -> Response {
        let response = result.unwrap_or_else(IntoResponse::into_response);
        let outcome = response.extensions().get::<Outcome>().map_or("ok", |o| o.0);
        if outcome != "ok" {
            tracing::info!(
                subresource = sub.as_str(),
                outcome,
                status = response.status().as_u16(),
                "access call not served"
            );
        }
        self.metrics.access_call(sub.as_str(), outcome);
        response
    }

    /// A streamed answer from the agent, counted as it passes.
    fn relay(
        &self,
        sub: Subresource,
        response: hyper::Response<hyper::body::Incoming>,
        content_type: &str,
    ) -> Response {
        let metrics = self.metrics.clone();
        let label = sub.as_str();
        let stream = response
            .into_body()
            .into_data_stream()
            .inspect_ok(move |chunk| metrics.access_streamed(label, "out", chunk.len() as u64));
        let mut out = Response::new(Body::from_stream(stream));
        if let Ok(value) = HeaderValue::from_str(content_type) {
            out.headers_mut().insert(header::CONTENT_TYPE, value);
        }
        out
    }
}

impl AccessState {
    /// One call of `operation` to `path` (the operation's path, with its query) on the agent of
    /// the call's node; its failure as the user reads it.
    async fn forward(
        &self,
        call: &Call,
        operation: Operation,
        path: &str,
        content_type: &'static str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<hyper::Response<hyper::body::Incoming>, AccessError> {
        self.nodes
            .open(&call.target.node, operation, path, content_type, body, timeout)
            .await
            .map_err(|e| request::from_call(e, &call.target))
    }
}

fn content_type_of(response: &hyper::Response<hyper::body::Incoming>, default: &'static str) -> String {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(default)
        .to_string()
}

/// `GET …/namespaces/{ns}/smolvms/{name}/log?follow=true&tailLines=N&source=console|workload`:
/// the log as text, streamed while the machine runs when followed.
pub async fn log(
    State(state): State<Arc<AccessState>>,
    Extension(peer): Extension<Peer>,
    Path((namespace, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let sub = Subresource::Log;
    let result = async {
        let node_query = request::node_log_query(query.as_deref())?;
        let call = state.begin(&peer, &headers, (&namespace, &name), sub, &method).await?;
        let operation = Operation::MachineLogs;
        let path = format!("{}?{node_query}", operation.path(&call.target.machine));
        let response = state
            .forward(
                &call,
                operation,
                &path,
                "application/json",
                Bytes::new(),
                state.call_timeout,
            )
            .await?;
        Ok(state.relay(sub, response, "text/plain; charset=utf-8"))
    }
    .await;
    state.finish(sub, result)
}

/// `POST …/smolvms/{name}/exec` with an exec request (`command`, `env`, `workingDir`, `stdin`,
/// `timeoutSeconds`): the exit code and the output, base64, byte-exact. The command and its
/// output are never logged. The request is read only once the call is authorized, into this
/// replica's body budget.
pub async fn exec(
    State(state): State<Arc<AccessState>>,
    Extension(peer): Extension<Peer>,
    Path((namespace, name)): Path<(String, String)>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let sub = Subresource::Exec;
    let result = async {
        let limit = super::MAX_EXEC_BODY;
        let declared = declared_length(&headers)?;
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(too_large(limit));
        }
        let call = state.begin(&peer, &headers, (&namespace, &name), sub, &method).await?;
        let reserve = declared.map_or(limit, |n| usize::try_from(n).unwrap_or(limit).min(limit));
        let _budget = state.gates.buffer(reserve)?;
        let body = read_small(body, limit, state.gates.limits().body_idle_timeout).await?;
        let exec: ExecRequest = serde_json::from_slice(&body)
            .map_err(|e| AccessError::BadRequest(format!("the exec request does not parse: {e}")))?;
        if exec.command.first().is_none_or(String::is_empty) {
            return Err(AccessError::BadRequest("command is required: the program and its arguments".into()));
        }
        tracing::info!(user = %call.user.name, %namespace, smolvm = %name, program = %exec.command[0], arguments = exec.command.len() - 1, "exec");
        let limit = Duration::from_secs(u64::from(exec.timeout_seconds.unwrap_or(EXEC_DEFAULT_TIMEOUT_SECONDS)));
        let operation = Operation::ExecInMachine;
        let path = operation.path(&call.target.machine);
        let response = state.forward(&call, operation, &path, "application/json", body, limit + EXEC_MARGIN).await?;
        Ok(state.relay(sub, response, "application/json"))
    }
    .await;
    state.finish(sub, result)
}

/// `GET …/smolvms/{name}/exec?command=…&stdin=…&stdout=…&stderr=…&tty=…`, a WebSocket upgrade
/// offering `v5.channel.k8s.io` (or v4): an interactive command, as `kubectl exec` runs one in
/// a pod. Authorized as `create smolvms/exec` by this server's own SubjectAccessReview (the API
/// server checks only `get` for a WebSocket). The upgrade goes on to the agent, which speaks
/// the protocol; once it switched, the two connections are joined byte for byte until either
/// side ends. Every refusal (400, 403, 404, 409, 503) is a `Status` before any upgrade. The
/// program and the argument count are logged, never the arguments or anything typed or shown.
pub async fn exec_stream(
    State(state): State<Arc<AccessState>>,
    Extension(peer): Extension<Peer>,
    Path((namespace, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    mut request: axum::extract::Request,
) -> Response {
    let sub = Subresource::Exec;
    let result = async {
        let headers = request.headers();
        let handshake = request::websocket_handshake(headers)?;
        let session = request::exec_stream_query(query.as_deref())?;
        let call = state
            .begin(&peer, headers, (&namespace, &name), sub, request.method())
            .await?;
        tracing::info!(user = %call.user.name, %namespace, smolvm = %name, program = %session.command[0], arguments = session.command.len() - 1, tty = session.tty, "interactive exec");
        let machine = Operation::ExecInteractive.path(&call.target.machine);
        let path = format!("{machine}?{}", session.to_query());
        let (agent_headers, agent) = state
            .nodes
            .upgrade(&call.target.node, &path, &handshake, state.call_timeout)
            .await
            .map_err(|e| request::from_call(e, &call.target))?;
        let client = hyper::upgrade::on(&mut request);
        // The session keeps its slot of this replica's sessions until it ends.
        let slot = request.extensions().get::<Slot>().cloned();
        let metrics = state.metrics.clone();
        let (user, started) = (call.user.name.clone(), std::time::Instant::now());
        tokio::spawn(async move {
            let _slot = slot;
            let client = match client.await {
                Ok(client) => client,
                Err(error) => {
                    tracing::info!(%error, %user, %namespace, smolvm = %name, "interactive exec: the client's upgrade failed");
                    return;
                }
            };
            let (mut client, mut agent) = (hyper_util::rt::TokioIo::new(client), hyper_util::rt::TokioIo::new(agent));
            let (sent, received, ended) = match tokio::io::copy_bidirectional(&mut client, &mut agent).await {
                Ok((sent, received)) => (sent, received, "closed".to_string()),
                Err(error) => (0, 0, error.to_string()),
            };
            metrics.access_streamed(sub.as_str(), "in", sent);
            metrics.access_streamed(sub.as_str(), "out", received);
            tracing::info!(%user, %namespace, smolvm = %name, seconds = started.elapsed().as_secs(), bytes_in = sent, bytes_out = received, %ended, "interactive exec ended");
        });
        Ok(request::switching_protocols(&agent_headers))
    }
    .await;
    state.finish(sub, result)
}

/// `GET …/smolvms/{name}/files?path=/abs/path`: the file, streamed (or a directory's listing as
/// JSON); `POST …/files?path=/abs/path&mode=0644` with the content: writes it. The content is
/// read only once the call is authorized, and then streamed to the node's agent as it comes
/// (at most [`MAX_FILE_BYTES`], with no pause longer than the body idle timeout): this replica
/// never holds a file whole.
pub async fn files(
    State(state): State<Arc<AccessState>>,
    Extension(peer): Extension<Peer>,
    Path((namespace, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let sub = Subresource::Files;
    let result = async {
        let files = request::files_query(query.as_deref())?;
        let writing = method == Method::POST;
        if writing && declared_length(&headers)?.is_some_and(|n| n > MAX_FILE_BYTES as u64) {
            return Err(too_large(MAX_FILE_BYTES));
        }
        let call = state.begin(&peer, &headers, (&namespace, &name), sub, &method).await?;
        let operation = if writing { Operation::WriteFile } else { Operation::ReadFile };
        let path = request::node_file_path(
            operation,
            &call.target.machine,
            &files.path,
            if writing { files.mode.as_deref().or(Some("0644")) } else { None },
        );
        tracing::info!(user = %call.user.name, %namespace, smolvm = %name, path = %files.path, direction = if writing { "in" } else { "out" }, "files");
        let response = if writing {
            let (upload, ended) = upload_body(body, &state, sub);
            state
                .nodes
                .open_streaming(
                    &call.target.node,
                    operation,
                    &path,
                    "application/octet-stream",
                    upload,
                    state.file_timeout,
                )
                .await
                .map_err(|e| ended.error().unwrap_or_else(|| request::from_call(e, &call.target)))
        } else {
            state.forward(&call, operation, &path, "application/json", Bytes::new(), state.call_timeout).await
        }?;
        let content_type = content_type_of(&response, "application/octet-stream");
        Ok(state.relay(sub, response, &content_type))
    }
    .await;
    state.finish(sub, result)
}

/// The `Content-Length` a request declares, if any.
fn declared_length(headers: &HeaderMap) -> Result<Option<u64>, AccessError> {
    headers
        .get(header::CONTENT_LENGTH)
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| AccessError::BadRequest("Content-Length is not a number".into()))
        })
        .transpose()
}

fn too_large(limit: usize) -> AccessError {
    AccessError::TooLarge(format!("the body exceeds {limit} bytes"))
}

/// Reads a small body whole (at most `limit` bytes, with no pause longer than `idle`).
async fn read_small(body: Body, limit: usize, idle: Duration) -> Result<Bytes, AccessError> {
    let mut body = body;
    let mut out = bytes::BytesMut::new();
    loop {
        let frame = tokio::time::timeout(idle, body.frame())
            .await
            .map_err(|_| idle_error(idle))?;
        let Some(frame) = frame else {
            return Ok(out.freeze());
        };
        let frame = frame.map_err(|e| AccessError::BadRequest(format!("reading the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(too_large(limit));
            }
            out.extend_from_slice(&data);
        }
    }
}

fn idle_error(idle: Duration) -> AccessError {
    AccessError::Timeout(format!("the request body paused for more than {}s", idle.as_secs()))
}

/// Why an upload ended before the agent answered, when the cause was on the caller's side.
#[derive(Debug, Default)]
struct UploadEnd(std::sync::Mutex<Option<AccessError>>);

impl UploadEnd {
    fn set(&self, error: AccessError) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(error);
    }

    /// The caller's side of a failed upload, if it was the cause.
    fn error(&self) -> Option<AccessError> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// A caller's file body on its way to the agent, frame by frame as it arrives: counted, held to
/// [`MAX_FILE_BYTES`] and to the idle timeout. A failure ends the node request, and is recorded
/// in the [`UploadEnd`] for the answer.
fn upload_body(body: Body, state: &AccessState, sub: Subresource) -> (StreamedBody, Arc<UploadEnd>) {
    let ended = Arc::new(UploadEnd::default());
    let idle = state.gates.limits().body_idle_timeout;
    let metrics = state.metrics.clone();
    let record = ended.clone();
    let frames = futures::stream::unfold(Some((body, 0usize)), move |next| {
        let (metrics, record) = (metrics.clone(), record.clone());
        async move {
            let (mut body, seen) = next?;
            let fail = |error: AccessError| {
                let message = error.to_string();
                record.set(error);
                Some((Err(message.into()), None))
            };
            let frame = match tokio::time::timeout(idle, body.frame()).await {
                Err(_) => return fail(idle_error(idle)),
                Ok(None) => return None,
                Ok(Some(Err(e))) => return fail(AccessError::BadRequest(format!("the upload broke off: {e}"))),
                Ok(Some(Ok(frame))) => frame,
            };
            let size = frame.data_ref().map_or(0, Bytes::len);
            let seen = seen + size;
            if seen > MAX_FILE_BYTES {
                return fail(too_large(MAX_FILE_BYTES));
            }
            metrics.access_streamed(sub.as_str(), "in", size as u64);
            Some((Ok(frame), Some((body, seen))))
        }
    });
    (StreamBody::new(frames).boxed_unsync(), ended)
}
