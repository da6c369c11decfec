//! One request to `smolvm serve` on a connection of its own: connected within the connect
//! limit, answered within the call's time limit, its body read whole under the size cap; or a
//! streamed GET whose body the caller reads chunk by chunk while the connection lives.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

use super::SmolvmClient;
use super::errors::{Operation, map_error};
use crate::vmm::{LogStream, VmmError};

impl SmolvmClient {
    pub(super) fn timeout_for(&self, operation: Operation) -> Duration {
        match operation {
            Operation::Start => self.config.start_timeout,
            Operation::Stop => self.config.stop_timeout,
            Operation::Delete => self.config.delete_timeout,
            Operation::Pause => self.config.pause_timeout,
            // A branch restores the source's memory copy-on-write, as a resume restores its own.
            Operation::Resume | Operation::Branch => self.config.resume_timeout,
            _ => self.config.request_timeout,
        }
    }

    /// Sends one request and returns the status and body, or an error for transport failures
    /// and time-outs. HTTP error statuses are returned, not mapped.
    pub(super) async fn call(
        &self,
        operation: Operation,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), VmmError> {
        let body = body.map(|b| (Bytes::from(b), "application/json"));
        self.call_within(self.timeout_for(operation), operation, method, path, body)
            .await
    }

    /// [`Self::call`] with its own time limit and a body of any content type.
    pub(super) async fn call_within(
        &self,
        limit: Duration,
        operation: Operation,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> Result<(StatusCode, Bytes), VmmError> {
        let started = Instant::now();
        let result = tokio::time::timeout(limit, self.exchange(method.clone(), path, body)).await;
        let result = match result {
            Ok(result) => result,
            Err(_) => Err(VmmError::Timeout {
                message: format!("smolvm did not answer {method} {path} within {}s", limit.as_secs_f64()),
            }),
        };
        match &result {
            Ok((status, _)) => tracing::debug!(
                ?operation, %method, path, status = status.as_u16(),
                elapsed_ms = started.elapsed().as_millis() as u64, "smolvm call"
            ),
            Err(error) => tracing::debug!(
                ?operation, %method, path, code = error.code(), %error,
                elapsed_ms = started.elapsed().as_millis() as u64, "smolvm call failed"
            ),
        }
        result
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> Result<(StatusCode, Bytes), VmmError> {
        let (response, _connection) = self.send(method.clone(), path, body).await?;
        let status = response.status();
        let max = self.config.max_response_bytes;
        let body = Limited::new(response.into_body(), max)
            .collect()
            .await
            .map_err(|error| {
                if error.is::<http_body_util::LengthLimitError>() {
                    VmmError::Protocol(format!("answer to {method} {path} is larger than {max} bytes"))
                } else {
                    VmmError::Unavailable {
                        message: format!(
                            "{method} {path}: connection to smolvm broke while reading the answer: {error}"
                        ),
                    }
                }
            })?
            .to_bytes();
        Ok((status, body))
    }

    /// Opens a streamed GET: the head of a successful answer with its connection, whose body
    /// is still to be read; an error status is the mapped error.
    pub(super) async fn open_stream(
        &self,
        operation: Operation,
        path: &str,
    ) -> Result<(hyper::Response<hyper::body::Incoming>, AbortOnDrop), VmmError> {
        let limit = self.config.request_timeout;
        let (response, connection) = tokio::time::timeout(limit, self.send(Method::GET, path, None))
            .await
            .map_err(|_| VmmError::Timeout {
                message: format!("smolvm did not answer GET {path} within {}s", limit.as_secs_f64()),
            })??;
        let status = response.status();
        if status.is_success() {
            return Ok((response, connection));
        }
        let bytes = Limited::new(response.into_body(), self.config.max_response_bytes)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Err(map_error(operation, status, &bytes))
    }

    /// Sends one request on a new connection and returns the response head with its body still
    /// to be read, and the connection's task (the connection ends when it is dropped).
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> Result<(hyper::Response<hyper::body::Incoming>, AbortOnDrop), VmmError> {
        let socket = &self.config.socket_path;
        let unavailable = |what: String| VmmError::Unavailable { message: what };
        let stream = match tokio::time::timeout(self.config.connect_timeout, UnixStream::connect(socket)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                return Err(unavailable(format!("cannot connect to {}: {error}", socket.display())));
            }
            Err(_) => {
                return Err(unavailable(format!(
                    "connecting to {} took longer than {}s",
                    socket.display(),
                    self.config.connect_timeout.as_secs_f64()
                )));
            }
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(|error| unavailable(format!("HTTP handshake with smolvm: {error}")))?;
        let connection = AbortOnDrop(tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::trace!(%error, "smolvm connection ended with an error");
            }
        }));

        let builder = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(HOST, "localhost");
        let request = match body {
            Some((body, content_type)) => builder.header(CONTENT_TYPE, content_type).body(Full::new(body)),
            None => builder.body(Full::new(Bytes::new())),
        }
        .map_err(|error| VmmError::Protocol(format!("cannot build {method} {path}: {error}")))?;

        let response = sender
            .send_request(request)
            .await
            .map_err(|error| unavailable(format!("{method} {path}: connection to smolvm failed: {error}")))?;
        Ok((response, connection))
    }
}

/// The data of a streamed answer's body, chunk by chunk as smolvm sends them; the connection
/// lives as long as the stream. A broken connection is the stream's last item.
pub(super) fn chunks(
    response: hyper::Response<hyper::body::Incoming>,
    connection: AbortOnDrop,
    what: &'static str,
) -> LogStream {
    let state = (response.into_body(), Some(connection));
    futures::stream::unfold(state, move |(mut body, connection)| async move {
        let connection = connection?;
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Some((Ok(data), (body, Some(connection))));
                    }
                }
                Some(Err(error)) => {
                    let error = VmmError::Unavailable {
                        message: format!("{what} from smolvm broke: {error}"),
                    };
                    return Some((Err(error), (body, None)));
                }
                None => return None,
            }
        }
    })
    .boxed()
}

/// Aborts the connection task when the call ends (or is cancelled by its time limit).
pub(super) struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
