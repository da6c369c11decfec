//! Thin I/O: the admission service (reading a request's body within its bounds, the review, the
//! answer) and the plain ops router. [`crate::listener`] serves the admission service over TLS.

use std::{sync::Arc, time::Duration, time::Instant};

use axum::{
    Router,
    body::HttpBody,
    http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header},
};
use bytes::Bytes;
use futures::FutureExt;
use http_body_util::{BodyExt, Full};
use tower_http::catch_panic::CatchPanicLayer;

use crate::{
    error::{Error, Result},
    review::{Catalogs, RequestError, Route, review},
    state::AppState,
};

/// How long an HTTP/1.1 connection may take to send a request's head (also how long a
/// kept-alive connection may stay idle between requests), and an HTTP/2 connection its preface.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a request's body may take to arrive, whatever `--body-timeout` says: the flag is
/// capped at it where it becomes the server's state (the API server gives up after at most
/// 30 s, and the shipped configuration after 5 s). Every other wait of a request is bounded by
/// the body's own timeouts, and the review itself does not wait.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// An admission answer: a whole JSON body, sent as one frame.
pub type Reply = Response<Bytes>;

fn json_response(status: StatusCode, body: Vec<u8>) -> Reply {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error_response(error: &RequestError) -> Reply {
    let status = StatusCode::from_u16(error.status()).unwrap_or(StatusCode::BAD_REQUEST);
    json_response(status, error.to_json())
}

/// Whether a Content-Type header names JSON (`application/json`, parameters allowed).
pub fn is_json_content_type(value: Option<&HeaderValue>) -> std::result::Result<(), RequestError> {
    let text = value.and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = text.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(RequestError::UnsupportedMediaType(text.to_string()))
    }
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Reads a request's whole body within the bounds of bodies in flight, holding no review slot.
///
/// A body that is all here when the handler first looks (the API server sends a review at once)
/// is taken without a timer or a reader slot. Otherwise the rest is read holding one of
/// `max_concurrent_bodies` reader slots ([`crate::bodies`]: none free, the longest-held is
/// displaced, answered 408; none freeing in time, this request is shed with 429), and given up
/// with 408 when no byte comes for `body_idle_timeout` or the whole body is not in within
/// `body_timeout` (which the binary caps at [`REQUEST_TIMEOUT`]) of the request's start. A slow client so ties up
/// a reader slot for a bounded time, loses it first to a body that is arriving, and never holds
/// a review slot. `on_reader` is called with the body once it holds a reader slot (HTTP/2 gives
/// the client its flow-control window back only from then on, [`crate::http2`]).
async fn read_body<B>(
    state: &AppState,
    request: Request<B>,
    start: Instant,
    on_reader: impl FnOnce(&mut B),
) -> std::result::Result<Bytes, RequestError>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    if request.method() != Method::POST {
        return Err(RequestError::MethodNotAllowed(request.method().to_string()));
    }
    is_json_content_type(request.headers().get(header::CONTENT_TYPE))?;
    let limit = state.body_limit;
    let declared = declared_length(request.headers());
    if declared.is_some_and(|n| n > (limit + DRAIN_LIMIT) as u64) {
        // Too large to be worth reading: refuse at once (the connection closes after the answer).
        return Err(RequestError::TooLarge { limit });
    }
    let mut body = request.into_body();
    let mut collected = Collected::new(limit);
    // What is here already, without waiting. The body's end is known from its length (HTTP/1.1)
    // or its END_STREAM flag (HTTP/2) as soon as its last byte is taken: a body all here then
    // ends without another look, which over HTTP/1.1 would find the end not yet told.
    loop {
        match body.frame().now_or_never() {
            Some(Some(frame)) => {
                if !collected.push(frame)? || body.is_end_stream() {
                    return collected.finish();
                }
            }
            Some(None) => return collected.finish(),
            None => break,
        }
    }
    // The rest is in flight: a reader slot (when none is free, a short grace for a body a moment
    // behind its head, then the longest-held slot is displaced), the idle timeout and the
    // deadline.
    let idle = state.body_idle_timeout;
    let reader = match state.bodies.try_take() {
        Some(reader) => reader,
        None => {
            if read_in_grace(&mut body, &mut collected).await? {
                return collected.finish();
            }
            match state.bodies.take_displacing(idle).await {
                Some(reader) => reader,
                None => return Err(RequestError::BodiesBusy(state.max_concurrent_bodies)),
            }
        }
    };
    on_reader(&mut body);
    let deadline = tokio::time::Instant::from_std(start) + state.body_timeout;
    let mut progress = tokio::time::Instant::now();
    // One timer, moved on only when it fires (not at every chunk): at the idle timeout after the
    // last progress, or the deadline if sooner.
    let timer = tokio::time::sleep_until((progress + idle).min(deadline));
    tokio::pin!(timer);
    loop {
        tokio::select! {
            biased;
            frame = body.frame() => match frame {
                Some(frame) => {
                    if !collected.push(frame)? || body.is_end_stream() {
                        return collected.finish();
                    }
                    progress = tokio::time::Instant::now();
                }
                None => return collected.finish(),
            },
            () = reader.displaced() => return Err(RequestError::Displaced),
            () = &mut timer => {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return Err(RequestError::Timeout(state.body_timeout));
                }
                if now >= progress + idle {
                    return Err(RequestError::Stalled(idle));
                }
                timer.as_mut().reset((progress + idle).min(deadline));
            }
        }
    }
}

/// How long a body a moment behind its head (over HTTP/2, the DATA frame after the HEADERS) is
/// read without a reader slot when none is free, and how much of it: a review's body comes whole
/// in milliseconds and so never queues behind trickling bodies for a slot, while a trickle gets
/// no more than this before it must hold one.
const GRACE: Duration = Duration::from_millis(200);

/// At most this much of a body is read in [`GRACE`]: HTTP/2's smallest window, so a connection
/// in grace holds no more than one held for a reader slot does.
const GRACE_BYTES: usize = smolvm_kit::http2::MIN_WINDOW as usize;

/// Reads `body` for at most [`GRACE`] and [`GRACE_BYTES`], holding no reader slot. Whether the
/// body is now whole.
async fn read_in_grace<B>(body: &mut B, collected: &mut Collected) -> std::result::Result<bool, RequestError>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let deadline = tokio::time::Instant::now() + GRACE;
    while collected.seen <= GRACE_BYTES {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(frame)) => {
                if !collected.push(frame)? || body.is_end_stream() {
                    return Ok(true);
                }
            }
            Ok(None) => return Ok(true),
            Err(_) => return Ok(false),
        }
    }
    Ok(false)
}

/// A body being read: at most `limit` bytes kept; a longer one is read on (and dropped) up to
/// [`DRAIN_LIMIT`] bytes more, then refused with [`RequestError::TooLarge`].
struct Collected {
    chunks: Vec<Bytes>,
    seen: usize,
    limit: usize,
}

impl Collected {
    fn new(limit: usize) -> Self {
        Collected {
            chunks: Vec::new(),
            seen: 0,
            limit,
        }
    }

    /// Takes one frame; `Ok(false)` when reading on is pointless (over the limit and the drain).
    fn push<E: std::fmt::Display>(
        &mut self,
        frame: std::result::Result<hyper::body::Frame<Bytes>, E>,
    ) -> std::result::Result<bool, RequestError> {
        let frame = frame.map_err(|e| RequestError::Body(e.to_string()))?;
        let Ok(data) = frame.into_data() else { return Ok(true) };
        self.seen = self.seen.saturating_add(data.len());
        if self.seen <= self.limit {
            self.chunks.push(data);
        }
        Ok(self.seen <= self.limit.saturating_add(DRAIN_LIMIT))
    }

    /// The body, or [`RequestError::TooLarge`].
    fn finish(mut self) -> std::result::Result<Bytes, RequestError> {
        if self.seen > self.limit {
            return Err(RequestError::TooLarge { limit: self.limit });
        }
        Ok(match self.chunks.len() {
            0 => Bytes::new(),
            1 => self.chunks.swap_remove(0),
            _ => self.chunks.concat().into(),
        })
    }
}

/// How much of a body over the limit is still read (and dropped) before the 413 goes out, so
/// that a client still sending it reads the answer rather than a reset connection. A larger
/// body, by its declared length, is refused without reading.
const DRAIN_LIMIT: usize = 1024 * 1024;

/// A refusal with `Retry-After: 1`, which the API server's webhook client honours by retrying.
fn shed_response(error: &RequestError) -> Reply {
    let mut response = error_response(error);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

async fn admit<B>(state: &AppState, route: Route, request: Request<B>, on_reader: impl FnOnce(&mut B)) -> Reply
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let start = Instant::now();
    // The whole body first, under the bounds of bodies in flight: a slow body holds no review
    // slot.
    let body = match read_body(state, request, start, on_reader).await {
        Ok(body) => body,
        Err(error) => {
            state
                .metrics
                .observe_error(route, &error, start.elapsed().as_secs_f64());
            match error {
                RequestError::BodiesBusy(_) => {
                    state.metrics.observe_shed(route);
                    return shed_response(&error);
                }
                // A slow client's, counted by reason; at debug, so that many of them do not
                // flood the log.
                RequestError::Timeout(_) | RequestError::Stalled(_) | RequestError::Displaced => {
                    tracing::debug!(path = route.path(), reason = error.reason(), error = %error, "slow request body")
                }
                _ => {
                    tracing::info!(path = route.path(), reason = error.reason(), error = %error, "bad admission request")
                }
            }
            return error_response(&error);
        }
    };
    // A review slot for the review itself. None free: shed at once, never queue.
    let Ok(_slot) = state.reviews.try_acquire() else {
        let error = RequestError::Overloaded(state.max_concurrent_reviews);
        state.metrics.observe_shed(route);
        state
            .metrics
            .observe_error(route, &error, start.elapsed().as_secs_f64());
        return shed_response(&error);
    };
    let policy = state.policy.current();
    // A branch's source the cache does not hold yet is read now (rules M5 and V17).
    let read = state.sources.resolve(route, &body).await;
    let result = {
        let sources = smolvm_api::branch::WithSource {
            read: read.as_ref(),
            cache: state.sources.as_ref(),
        };
        review(
            route,
            &body,
            &policy,
            Catalogs {
                nodes: state.nodes.as_ref(),
                classes: state.classes.as_ref(),
                pools: state.pools.as_ref(),
                sources: &sources,
            },
        )
    };
    // Rule V15: an admitted SmolVM write that raises its namespace's usage is charged to its
    // quotas before it is admitted (a namespace without one costs one atomic load here).
    let result = match (result, state.quotas.as_deref()) {
        (Ok(reviewed), Some(quotas)) if quotas.any() && crate::quota::charges(route, &reviewed.outcome) => {
            Ok(crate::quota::settle(quotas, state.pools.as_ref(), &state.metrics, &body, reviewed).await)
        }
        (result, _) => result,
    };
    let seconds = start.elapsed().as_secs_f64();
    match result {
        Ok(reviewed) => {
            state.metrics.observe(route, &reviewed.outcome, seconds);
            tracing::debug!(
                uid = %reviewed.outcome.uid,
                path = route.path(),
                resource = %reviewed.outcome.resource,
                operation = reviewed.outcome.operation,
                verdict = reviewed.outcome.verdict,
                patched = reviewed.outcome.patched,
                "admission review"
            );
            json_response(StatusCode::OK, reviewed.body)
        }
        Err(error) => {
            state.metrics.observe_error(route, &error, seconds);
            tracing::info!(path = route.path(), reason = error.reason(), error = %error, "bad admission request");
            error_response(&error)
        }
    }
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Reply {
    tracing::error!("a request handler panicked; answered 500");
    error_response(&RequestError::Internal("the handler panicked".into()))
}

fn not_found() -> Reply {
    json_response(
        StatusCode::NOT_FOUND,
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound",
            "message": "no such endpoint; use /mutate/smolvms, /validate/smolvms, /validate/smolvmnodes, /validate/smolvmclasses or /validate/smolvmpools"
        }))
        .unwrap_or_default(),
    )
}

/// The admission endpoints, over HTTP/2 ([`crate::http2`]) and HTTP/1.1 (hyper): `/mutate/smolvms`,
/// `/validate/smolvms`, `/validate/smolvmnodes`, `/validate/smolvmclasses`,
/// `/validate/smolvmpools` (any method reaches them, and is answered 405 unless POST); any other
/// path is answered 404.
///
/// Built for speed, as the `handler` bench and `webhook/bench/run.sh` measure: a request is
/// matched by comparing its path with five strings and goes through no router, method router,
/// handler adapter, boxed route or middleware; the answer is a whole body in one frame. What a
/// router's layers gave is done here: a panic while answering is caught and answered 500
/// (`panic_response`), and no request waits unbounded (every wait is the body's, bounded by
/// its timeouts and [`REQUEST_TIMEOUT`]; the review itself does not wait).
#[derive(Clone)]
pub struct Admission(Arc<AppState>);

impl Admission {
    /// The answer to one request, whichever protocol brought it.
    pub async fn answer<B>(&self, request: Request<B>) -> Reply
    where
        B: HttpBody<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        self.answer_with(request, |_| {}).await
    }

    /// As [`Admission::answer`], calling `on_reader` with the body if it takes a reader slot
    /// (its rest still arriving when first looked at).
    pub async fn answer_with<B>(&self, request: Request<B>, on_reader: impl FnOnce(&mut B)) -> Reply
    where
        B: HttpBody<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        match Route::ALL.into_iter().find(|r| r.path() == request.uri().path()) {
            Some(route) => std::panic::AssertUnwindSafe(admit(&self.0, route, request, on_reader))
                .catch_unwind()
                .await
                .unwrap_or_else(panic_response),
            None => not_found(),
        }
    }
}

/// The service hyper's HTTP/1.1 connections call (and the in-process `handler` bench).
impl<B> tower::Service<Request<B>> for Admission
where
    B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    type Response = Response<Full<Bytes>>;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, std::result::Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let admission = self.clone();
        Box::pin(async move { Ok(admission.answer(request).await.map(Full::new)) })
    }
}

/// The admission service over `state`.
pub fn admission_service(state: AppState) -> Admission {
    Admission(Arc::new(state))
}

/// What the shared ops server asks the webhook.
struct OpsProbe(AppState);

impl smolvm_kit::ops::Probe for OpsProbe {
    fn readiness(&self) -> std::result::Result<String, String> {
        let missing = self.0.readiness.missing();
        if missing.is_empty() {
            Ok("ok".into())
        } else {
            Err(format!("not ready: {}", missing.join(", ")))
        }
    }

    fn metrics(&self) -> String {
        self.0.metrics.encode()
    }
}

/// The plain-HTTP ops router: `/healthz`, `/readyz`, `/metrics`.
pub fn ops_router(state: AppState) -> Router {
    smolvm_kit::ops::router(Arc::new(OpsProbe(state))).layer(CatchPanicLayer::new())
}

/// Serves the ops router over plain HTTP on `listener` until `shutdown` resolves.
pub async fn serve_ops(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    smolvm_kit::ops::serve(listener, ops_router(state), shutdown)
        .await
        .map_err(|source| Error::Serve { what: "ops", source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        let table: &[(Option<&str>, bool)] = &[
            (Some("application/json"), true),
            (Some("application/json; charset=utf-8"), true),
            (Some("Application/JSON"), true),
            (Some("text/plain"), false),
            (Some("application/yaml"), false),
            (Some(""), false),
            (None, false),
        ];
        for (value, ok) in table {
            let header = value.map(|v| HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static("x")));
            assert_eq!(is_json_content_type(header.as_ref()).is_ok(), *ok, "{value:?}");
        }
    }
}
