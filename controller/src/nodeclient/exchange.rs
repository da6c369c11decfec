//! One exchange with an agent: a request of the contract's table sent with the bearer token (the
//! replaced one retried on a 401), its answer read within its timeout, a refusal read as the
//! [`CallError`] its body carries; streamed bodies and upgraded sessions too.

use std::{future::Future, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode, Uri};
use smolvm_api::nodeapi::{self, ErrorCode, NodeApiError, Operation};

use super::{MAX_BODY, NodeClient, StreamedBody, error::CallError};

impl NodeClient {
    /// Sends one request of `operation` (at its method) to `path` (the operation's path, with
    /// its query) on `node`'s agent and returns its answer once the headers arrive (within
    /// `timeout`), its body still to be read: for streamed answers (logs, files). An answer that
    /// is not a success is read and returned as the [`CallError`] it carries.
    pub async fn open(
        &self,
        node: &str,
        operation: Operation,
        path: &str,
        content_type: &'static str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<hyper::Response<hyper::body::Incoming>, CallError> {
        let uri = request_uri(node, path)?;
        let method = http_method(operation.method());
        let response = self
            .with_token(|token| {
                let request = Request::builder()
                    .method(method.clone())
                    .uri(uri.clone())
                    .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
                    .header(hyper::header::CONTENT_TYPE, content_type)
                    .header(hyper::header::ACCEPT, "application/json")
                    .body(Full::new(body.clone()))
                    .map_err(|e| CallError::protocol(node, e.to_string()));
                async move {
                    tokio::time::timeout(timeout, self.client.request(request?))
                        .await
                        .map_err(|_| CallError::unreachable(node, format!("no answer within {timeout:?}")))?
                        .map_err(|e| CallError::unreachable(node, smolvm_kit::causes::explained(&e)))
                }
            })
            .await?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(refusal(node, response, timeout).await)
    }

    /// Sends one request of `operation` whose body streams to `node`'s agent as `body` yields it, and returns
    /// the answer once its headers arrive (within `timeout`, the body's sending included), as
    /// [`NodeClient::open`] does. A body that fails ends the request: the agent never sees a
    /// whole one. Since a body cannot be sent twice, during a token replacement the token the
    /// agent takes is found first with a bodiless call.
    pub async fn open_streaming(
        &self,
        node: &str,
        operation: Operation,
        path: &str,
        content_type: &'static str,
        body: StreamedBody,
        timeout: Duration,
    ) -> Result<hyper::Response<hyper::body::Incoming>, CallError> {
        let uri = request_uri(node, path)?;
        let token = self.token_taken_by(node, timeout).await?;
        let request = Request::builder()
            .method(http_method(operation.method()))
            .uri(uri)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(hyper::header::CONTENT_TYPE, content_type)
            .header(hyper::header::ACCEPT, "application/json")
            .body(body)
            .map_err(|e| CallError::protocol(node, e.to_string()))?;
        let response = tokio::time::timeout(timeout, self.streaming.request(request))
            .await
            .map_err(|_| CallError::unreachable(node, format!("no answer within {timeout:?}")))?
            .map_err(|e| CallError::unreachable(node, smolvm_kit::causes::explained(&e)))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(refusal(node, response, timeout).await)
    }

    /// The token `node`'s agent takes: the one in force, or, while a replaced one is still
    /// offered and the agent refuses the new one, the replaced one.
    async fn token_taken_by(&self, node: &str, timeout: Duration) -> Result<String, CallError> {
        let current = self.settings.token.current();
        let Some(previous) = self.settings.token.previous() else {
            return Ok(current);
        };
        let probe = Request::get(request_uri(node, &Operation::Identity.path(""))?)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {current}"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| CallError::protocol(node, e.to_string()))?;
        let response = tokio::time::timeout(timeout, self.client.request(probe))
            .await
            .map_err(|_| CallError::unreachable(node, format!("no answer within {timeout:?}")))?
            .map_err(|e| CallError::unreachable(node, smolvm_kit::causes::explained(&e)))?;
        Ok(if response.status() == StatusCode::UNAUTHORIZED {
            previous
        } else {
            current
        })
    }

    /// Opens an interactive session on `node`'s agent ([`Operation::ExecInteractive`]): `GET path`
    /// (the operation's path and its query) upgraded (a WebSocket), with
    /// the client's handshake `headers` passed through and the token added, on a connection of
    /// its own that offers HTTP/1.1 only (an upgrade cannot ride HTTP/2). `Ok`: the agent's
    /// `101 Switching Protocols` headers and the upgraded connection; a refusal is the
    /// [`CallError`] its body carries, as for [`NodeClient::open`].
    pub async fn upgrade(
        &self,
        node: &str,
        path: &str,
        headers: &hyper::HeaderMap,
        timeout: Duration,
    ) -> Result<(hyper::HeaderMap, hyper::upgrade::Upgraded), CallError> {
        let uri = request_uri(node, path)?;
        let mut config = (*self.settings.tls.current()).clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut response = self
            .with_token(|token| {
                let mut request = Request::get(uri.clone()).header(hyper::header::HOST, node);
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                let request = request
                    .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
                    .body(http_body_util::Empty::<Bytes>::new())
                    .map_err(|e| CallError::protocol(node, e.to_string()));
                let config = config.clone();
                let exchange = async move {
                    let unreachable = |message| CallError::unreachable(node, message);
                    let stream = self
                        .connector
                        .dial(node, config)
                        .await
                        .map_err(|e| unreachable(smolvm_kit::causes::explained(e.as_ref())))?;
                    let (mut sender, connection) = hyper::client::conn::http1::handshake(stream)
                        .await
                        .map_err(|e| unreachable(smolvm_kit::causes::explained(&e)))?;
                    tokio::spawn(async move {
                        if let Err(error) = connection.with_upgrades().await {
                            tracing::debug!(%error, "upgraded node API connection ended");
                        }
                    });
                    sender
                        .send_request(request?)
                        .await
                        .map_err(|e| unreachable(smolvm_kit::causes::explained(&e)))
                };
                async move {
                    tokio::time::timeout(timeout, exchange)
                        .await
                        .map_err(|_| CallError::unreachable(node, format!("no answer within {timeout:?}")))?
                }
            })
            .await?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            if response.status().is_success() {
                return Err(CallError::protocol(
                    node,
                    format!(
                        "the agent answered {} instead of switching protocols",
                        response.status()
                    ),
                ));
            }
            return Err(refusal(node, response, timeout).await);
        }
        let upgraded = tokio::time::timeout(timeout, hyper::upgrade::on(&mut response))
            .await
            .map_err(|_| CallError::unreachable(node, format!("the upgrade did not complete within {timeout:?}")))?
            .map_err(|e| CallError::protocol(node, format!("the upgrade failed: {e}")))?;
        Ok((response.headers().clone(), upgraded))
    }

    /// Sends with the token in force; during a token replacement a runtime may still hold the
    /// old one for a minute, so a 401 is retried once with the token it replaced.
    async fn with_token<F, Fut>(&self, mut send: F) -> Result<hyper::Response<hyper::body::Incoming>, CallError>
    where
        F: FnMut(String) -> Fut,
        Fut: Future<Output = Result<hyper::Response<hyper::body::Incoming>, CallError>>,
    {
        let response = send(self.settings.token.current()).await?;
        match self.settings.token.previous() {
            Some(previous) if response.status() == StatusCode::UNAUTHORIZED => send(previous).await,
            _ => Ok(response),
        }
    }
}

/// The HTTP method of a method of the contract.
fn http_method(method: nodeapi::Method) -> Method {
    match method {
        nodeapi::Method::Get => Method::GET,
        nodeapi::Method::Put => Method::PUT,
        nodeapi::Method::Post => Method::POST,
        nodeapi::Method::Delete => Method::DELETE,
    }
}

/// `https://<node><path>`, which the connector resolves to the node's endpoint.
fn request_uri(node: &str, path: &str) -> Result<Uri, CallError> {
    format!("https://{node}{path}")
        .parse()
        .map_err(|e| CallError::protocol(node, format!("bad request URI: {e}")))
}

/// The [`CallError`] a node's refusal (an answer that is not a success) carries: its JSON
/// error body read (within `timeout`), or what its status says when it has none.
async fn refusal(node: &str, response: hyper::Response<hyper::body::Incoming>, timeout: Duration) -> CallError {
    let status = response.status();
    let collected = match tokio::time::timeout(timeout, Limited::new(response.into_body(), MAX_BODY).collect()).await {
        Err(_) => return CallError::unreachable(node, format!("body not received within {timeout:?}")),
        Ok(Err(e)) => return CallError::protocol(node, format!("reading the body: {e}")),
        Ok(Ok(body)) => body.to_bytes(),
    };
    match serde_json::from_slice::<NodeApiError>(&collected) {
        // The agent cleans smolvm's text already; cleaning again bounds what any agent
        // (an older one, a misbehaving one) can put into conditions and events.
        Ok(err) => CallError::Api {
            node: node.to_string(),
            status: status.as_u16(),
            code: err.code,
            message: smolvm_api::text::clean_external(&err.message),
            details: err.details,
        },
        // The agent answered, so it is reachable; its runtime is not.
        Err(_) if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::GATEWAY_TIMEOUT => {
            CallError::Api {
                node: node.to_string(),
                status: status.as_u16(),
                code: if status == StatusCode::SERVICE_UNAVAILABLE {
                    ErrorCode::RuntimeUnavailable
                } else {
                    ErrorCode::RuntimeTimeout
                },
                message: format!("the agent answered {status} without an error body"),
                details: None,
            }
        }
        Err(_) => CallError::protocol(node, format!("{status} without an error body")),
    }
}
