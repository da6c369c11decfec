//! Thin I/O: the HTTPS admission router, the plain ops router, and serving them.

use std::{net::SocketAddr, sync::Arc, time::Duration, time::Instant};

use axum::{
    Router,
    body::Body,
    http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header},
    response::Response,
    routing::any,
};
use http_body_util::BodyExt;
use hyper_util::rt::TokioTimer;
use smolvm_certs::ReloadableResolver;
use tower_http::{catch_panic::CatchPanicLayer, timeout::TimeoutLayer};

use crate::{
    error::{Error, Result},
    review::{Catalogs, RequestError, Route, review},
    state::AppState,
};

/// The whole-request deadline of the admission router (the API server gives up after at most
/// 30 s, and the shipped configuration after 5 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error_response(error: &RequestError) -> Response {
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

async fn read_body(state: &AppState, request: Request<Body>) -> std::result::Result<bytes::Bytes, RequestError> {
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
    match tokio::time::timeout(state.body_timeout, collect_limited(request.into_body(), limit)).await {
        Err(_) => Err(RequestError::Timeout(state.body_timeout)),
        Ok(result) => result,
    }
}

/// Reads a body of at most `limit` bytes. A longer one is read on (and dropped) up to
/// [`DRAIN_LIMIT`] bytes more, then refused with [`RequestError::TooLarge`].
async fn collect_limited(mut body: Body, limit: usize) -> std::result::Result<bytes::Bytes, RequestError> {
    let mut chunks: Vec<bytes::Bytes> = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| RequestError::Body(e.to_string()))?;
        let Ok(data) = frame.into_data() else { continue };
        seen = seen.saturating_add(data.len());
        if seen <= limit {
            chunks.push(data);
        } else if seen > limit.saturating_add(DRAIN_LIMIT) {
            break;
        }
    }
    if seen > limit {
        return Err(RequestError::TooLarge { limit });
    }
    Ok(match chunks.len() {
        0 => bytes::Bytes::new(),
        1 => chunks.swap_remove(0),
        _ => chunks.concat().into(),
    })
}

/// How much of a body over the limit is still read (and dropped) before the 413 goes out, so
/// that a client still sending it reads the answer rather than a reset connection. A larger
/// body, by its declared length, is refused without reading.
const DRAIN_LIMIT: usize = 1024 * 1024;

async fn admit(state: AppState, route: Route, request: Request<Body>) -> Response {
    let start = Instant::now();
    // A slot before the body is read, held until the answer is made: at most
    // `max_concurrent_reviews` bodies are in memory. None free: shed at once, never queue.
    let Ok(_slot) = state.reviews.clone().try_acquire_owned() else {
        let error = RequestError::Overloaded(state.max_concurrent_reviews);
        state.metrics.observe_shed(route);
        state
            .metrics
            .observe_error(route, &error, start.elapsed().as_secs_f64());
        let mut response = error_response(&error);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    };
    let result = match read_body(&state, request).await {
        Ok(body) => {
            let policy = state.policy.current();
            review(
                route,
                &body,
                &policy,
                Catalogs {
                    nodes: state.nodes.as_ref(),
                    classes: state.classes.as_ref(),
                },
            )
        }
        Err(e) => Err(e),
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

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("a request handler panicked; answered 500");
    error_response(&RequestError::Internal("the handler panicked".into()))
}

async fn not_found() -> Response {
    json_response(
        StatusCode::NOT_FOUND,
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound",
            "message": "no such endpoint; use /mutate/smolvms, /validate/smolvms, /validate/smolvmnodes or /validate/smolvmclasses"
        }))
        .unwrap_or_default(),
    )
}

/// The admission router: `/mutate/smolvms`, `/validate/smolvms`, `/validate/smolvmnodes`,
/// `/validate/smolvmclasses`.
pub fn admission_router(state: AppState) -> Router {
    let mut router = Router::new();
    for route in Route::ALL {
        let state = state.clone();
        router = router.route(
            route.path(),
            any(move |request: Request<Body>| admit(state.clone(), route, request)),
        );
    }
    router
        .fallback(not_found)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            REQUEST_TIMEOUT,
        ))
        .layer(CatchPanicLayer::custom(panic_response))
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

/// Wraps a TLS acceptor: sets TCP_NODELAY on connections that negotiated HTTP/2.
///
/// An HTTP/2 answer often follows a small frame the connection flushed just before (a
/// WINDOW_UPDATE for the request body), and Nagle's algorithm then holds the answer until the
/// client's delayed ACK, up to 40 ms later. An HTTP/1.1 answer goes out in one write, and
/// HTTP/1.1 connections keep the default (with TCP_NODELAY, a client still sending a body the
/// server refused early, as with a 413, more often sees its write fail before it reads the
/// answer).
#[derive(Clone, Copy, Debug)]
pub struct H2NoDelay<A>(pub A);

impl<A, S> axum_server::accept::Accept<tokio::net::TcpStream, S> for H2NoDelay<A>
where
    A: axum_server::accept::Accept<
            tokio::net::TcpStream,
            S,
            Stream = tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        >,
    A::Future: Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future = futures::future::BoxFuture<'static, std::io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        let accepted = self.0.accept(stream, service);
        Box::pin(async move {
            let (tls, service) = accepted.await?;
            let (tcp, session) = tls.get_ref();
            if session.alpn_protocol() == Some(b"h2") {
                // Best effort: a socket that refuses the option still serves, only slower.
                let _ = tcp.set_nodelay(true);
            }
            Ok((tls, service))
        })
    }
}

/// Serves `router` over TLS (HTTP/2 and HTTP/1.1 by ALPN) on `listener`, with the certificate
/// from `resolver` (swapped in place on rotation), until `handle` shuts it down.
pub async fn serve_tls(
    listener: std::net::TcpListener,
    router: Router,
    resolver: Arc<ReloadableResolver>,
    handle: axum_server::Handle<SocketAddr>,
    max_streams: u32,
) -> Result<()> {
    listener.set_nonblocking(true).map_err(|source| Error::Serve {
        what: "webhook",
        source,
    })?;
    let config = smolvm_certs::server_config(resolver)?;
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config));
    let mut server = axum_server::from_tcp_rustls(listener, tls)
        .map_err(|source| Error::Serve {
            what: "webhook",
            source,
        })?
        .map(H2NoDelay)
        .handle(handle);
    {
        let builder = server.http_builder();
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10));
        // At most as many streams per connection as there are review slots: more could only
        // be shed, and each open stream may buffer up to a window of body.
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(max_streams.max(1))
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10));
    }
    server
        .serve(router.into_make_service())
        .await
        .map_err(|source| Error::Serve {
            what: "webhook",
            source,
        })
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
