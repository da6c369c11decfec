//! What one replica of the access API holds at most, and the gate every request passes first.
//!
//! The TLS handshake lets only the API server's front proxy in ([`super::server::tls_config`]);
//! behind it, every user of the cluster shares this replica. So, before any body is read:
//!
//! - [`guard`] checks the connection's front-proxy certificate again (a connection made before
//!   the API server's allowed names changed) and takes a slot: one of
//!   [`Limits::max_calls`] for a call (a copy, a one-shot exec, a log read to its end) or of
//!   [`Limits::max_streams`] for a session that lasts as long as its user wants (a followed
//!   log, an interactive exec). The slot is held until the answer's body has gone out (or the
//!   session ended). None free: 429 with `Retry-After`, as a Kubernetes `Status`, at once.
//! - The handlers authorize the call (SubjectAccessReview) before they read a body, stream file
//!   bodies to the node's agent without buffering them, and take what they do buffer (an exec
//!   request, at most [`super::MAX_EXEC_BODY`]) from a per-replica [`Limits::body_budget`]
//!   first: 429 beyond it.
//! - A request's headers must arrive within [`Limits::header_timeout`]; a body must keep
//!   coming, [`Limits::body_idle_timeout`] at most between two pieces.
//! - Before all that, the listener's bounds ([`Limits::accept`], [`smolvm_kit::accept::Bounded`]):
//!   at most so many connections and TLS handshakes in progress, in all and from one source
//!   address (a connection beyond is closed at once), each handshake within its timeout; an
//!   HTTP/2 connection holds at most [`Limits::http2_window`] of unread request data and is
//!   closed once no request has been in flight for [`Limits::http2_idle_timeout`]
//!   ([`smolvm_kit::serve`]).

use std::{collections::HashMap, sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::{Request, State},
    http::Method,
    middleware::Next,
    response::{IntoResponse, Response},
};
use http_body_util::BodyExt;
use smolvm_kit::accept::AcceptBounds;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{AccessError, AccessState, frontproxy::Peer, request::Subresource};

/// The bounds of one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Calls at once (copies, one-shot execs, logs not followed), each until its answer is out.
    pub max_calls: usize,
    /// Sessions at once (followed logs, interactive execs), each until it ends.
    pub max_streams: usize,
    /// Calls of one user at once (the user the front proxy names), so that one user's slow or
    /// many calls leave the others room.
    pub max_calls_per_user: usize,
    /// Sessions of one user at once.
    pub max_streams_per_user: usize,
    /// Bytes of request bodies buffered at once (exec requests; file bodies are streamed).
    pub body_budget: usize,
    /// Connections and TLS handshakes in progress, in all and per source address (a connection
    /// beyond is closed at once), and the time for a handshake.
    pub accept: AcceptBounds,
    /// The flow-control window of each HTTP/2 stream and connection: `--http2-buffer-budget`
    /// over `--max-connections` ([`smolvm_kit::http2::window`]).
    pub http2_window: u32,
    /// An HTTP/2 connection with no request in flight this long is closed (GOAWAY).
    pub http2_idle_timeout: Duration,
    /// Time for a request's headers to arrive.
    pub header_timeout: Duration,
    /// Longest pause in a request body.
    pub body_idle_timeout: Duration,
}

/// The bytes all the access API's HTTP/2 connections may hold unread by default (64 MiB: a
/// 64 KiB window for each of 1,024 connections).
pub const DEFAULT_HTTP2_BUFFER_BUDGET: usize = 64 << 20;

impl Default for Limits {
    /// 64 calls (16 of one user; each holding at most a few hundred KiB of stream buffers), 256
    /// sessions (64 of one user), 4 MiB of buffered bodies (64 exec requests of the largest
    /// size); 1,024 connections (512 from one address: every connection comes from the API
    /// servers, an interactive exec holding one of its own), 64 handshakes at once (16 from one
    /// address) of 5 s at most, 64 KiB HTTP/2 windows, HTTP/2 connections closed after 2 minutes
    /// without a request; 10 s for headers, 30 s of silence in a body.
    fn default() -> Self {
        let accept = AcceptBounds {
            max_connections: 1024,
            max_connections_per_source: 512,
            max_handshakes: 64,
            max_handshakes_per_source: 16,
            handshake_timeout: Duration::from_secs(5),
        };
        Limits {
            max_calls: 64,
            max_streams: 256,
            max_calls_per_user: 16,
            max_streams_per_user: 64,
            body_budget: 4 << 20,
            accept,
            http2_window: (DEFAULT_HTTP2_BUFFER_BUDGET / accept.max_connections) as u32,
            http2_idle_timeout: Duration::from_secs(120),
            header_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
        }
    }
}

impl Limits {
    /// The default limits with the listener's bounds from the flags.
    pub fn with_listener(listener: smolvm_kit::limits::ListenerBounds) -> Self {
        Limits {
            accept: listener.accept,
            http2_window: listener.http2_window,
            http2_idle_timeout: listener.http2_idle_timeout,
            ..Limits::default()
        }
    }
}

/// Which slot a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A call: done once its answer has gone out.
    Call,
    /// A session: lasts as long as its user keeps it.
    Stream,
}

/// The subresource a request is for and the slot it takes; `None` for discovery, health and
/// unknown paths (no body is read there, and they answer at once).
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> Option<(Subresource, Kind)> {
    let rest = path.strip_prefix("/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let [_namespace, "smolvms", _name, sub] = parts.as_slice() else {
        return None;
    };
    let followed = || {
        query.unwrap_or_default().split('&').any(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            key == "follow" && matches!(value, "true" | "1" | "")
        })
    };
    match *sub {
        "log" if followed() => Some((Subresource::Log, Kind::Stream)),
        "log" => Some((Subresource::Log, Kind::Call)),
        "exec" if method == Method::GET => Some((Subresource::Exec, Kind::Stream)),
        "exec" => Some((Subresource::Exec, Kind::Call)),
        "files" => Some((Subresource::Files, Kind::Call)),
        _ => None,
    }
}

/// The slot a request holds, on its extensions: a handler that outlives its answer (an
/// interactive exec's session) keeps a clone. The last clone gone gives the slot back, the
/// replica's and its user's.
#[derive(Debug, Clone)]
pub struct Slot(#[allow(dead_code)] Arc<Held>);

/// Slots taken, per kind and user.
type PerUser = Arc<std::sync::Mutex<HashMap<(Kind, String), usize>>>;

/// A replica's slot and its user's share, given back when dropped.
#[derive(Debug)]
struct Held {
    _permit: OwnedSemaphorePermit,
    users: PerUser,
    key: (Kind, String),
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = users.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                users.remove(&self.key);
            }
        }
    }
}

/// The semaphores behind [`Limits`].
#[derive(Debug)]
pub struct Gates {
    calls: Arc<Semaphore>,
    streams: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    users: PerUser,
    limits: Limits,
}

impl Gates {
    /// Gates for `limits`.
    pub fn new(limits: Limits) -> Self {
        Gates {
            calls: Arc::new(Semaphore::new(limits.max_calls)),
            streams: Arc::new(Semaphore::new(limits.max_streams)),
            bytes: Arc::new(Semaphore::new(limits.body_budget)),
            users: PerUser::default(),
            limits,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A slot of `kind` for `user`, or the 429 saying this replica, or this user's share of
    /// it, is full.
    pub fn slot(&self, kind: Kind, user: &str) -> Result<Slot, AccessError> {
        let (gate, limit, per_user, what) = match kind {
            Kind::Call => (
                &self.calls,
                self.limits.max_calls,
                self.limits.max_calls_per_user,
                "calls",
            ),
            Kind::Stream => (
                &self.streams,
                self.limits.max_streams,
                self.limits.max_streams_per_user,
                "sessions (followed logs, interactive execs)",
            ),
        };
        let key = (kind, user.to_string());
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        let taken = users.get(&key).copied().unwrap_or(0);
        if taken >= per_user {
            return Err(AccessError::TooManyRequests(format!(
                "user {user:?} has its limit of {per_user} {what} open on this replica of the access API; retry shortly"
            )));
        }
        let permit = gate.clone().try_acquire_owned().map_err(|_| {
            AccessError::TooManyRequests(format!(
                "this replica of the access API is serving its limit of {limit} {what}; retry shortly"
            ))
        })?;
        users.insert(key.clone(), taken + 1);
        drop(users);
        Ok(Slot(Arc::new(Held {
            _permit: permit,
            users: self.users.clone(),
            key,
        })))
    }

    /// `bytes` of the buffered-body budget, held while the permit lives, or the 429.
    pub fn buffer(&self, bytes: usize) -> Result<OwnedSemaphorePermit, AccessError> {
        let refused = || {
            AccessError::TooManyRequests(format!(
                "this replica of the access API is buffering its limit of {} bytes of request bodies; retry shortly",
                self.limits.body_budget
            ))
        };
        let count = u32::try_from(bytes).map_err(|_| refused())?;
        self.bytes.clone().try_acquire_many_owned(count).map_err(|_| refused())
    }
}

/// The gate in front of every route (see the module's doc): the front proxy, then a slot held
/// until the answer's body has gone out. Nothing here reads a body.
pub async fn guard(State(state): State<Arc<AccessState>>, mut request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<Peer>().cloned().unwrap_or_default();
    if let Err(refused) = state.requestheader().check_proxy(&peer) {
        return refused.into_response();
    }
    let Some((sub, kind)) = classify(request.method(), request.uri().path(), request.uri().query()) else {
        return next.run(request).await;
    };
    let user = state.requestheader().named_user(request.headers()).unwrap_or_default();
    let slot = match state.gates.slot(kind, &user) {
        Ok(slot) => slot,
        Err(full) => {
            tracing::debug!(
                subresource = sub.as_str(),
                ?kind,
                "access call shed: this replica is full"
            );
            state.metrics.access_call(sub.as_str(), full.reason());
            return full.into_response();
        }
    };
    request.extensions_mut().insert(slot.clone());
    let (parts, body) = next.run(request).await.into_parts();
    // The slot goes when the answer's body is done with (sent, or dropped with its connection).
    let body = body.map_frame(move |frame| {
        let _held = &slot;
        frame
    });
    Response::from_parts(parts, Body::new(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Row = (Method, String, Option<&'static str>, Option<(Subresource, Kind)>);

    #[test]
    fn classes_of_requests() {
        let base = "/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/ns/smolvms/web";
        let table: [Row; 12] = [
            (
                Method::GET,
                format!("{base}/log"),
                None,
                Some((Subresource::Log, Kind::Call)),
            ),
            (
                Method::GET,
                format!("{base}/log"),
                Some("tailLines=5&follow=true"),
                Some((Subresource::Log, Kind::Stream)),
            ),
            (
                Method::GET,
                format!("{base}/log"),
                Some("follow"),
                Some((Subresource::Log, Kind::Stream)),
            ),
            (
                Method::GET,
                format!("{base}/log"),
                Some("follow=false"),
                Some((Subresource::Log, Kind::Call)),
            ),
            (
                Method::POST,
                format!("{base}/exec"),
                None,
                Some((Subresource::Exec, Kind::Call)),
            ),
            // A WebSocket upgrade: an interactive session.
            (
                Method::GET,
                format!("{base}/exec"),
                Some("command=sh"),
                Some((Subresource::Exec, Kind::Stream)),
            ),
            (
                Method::POST,
                format!("{base}/files"),
                Some("path=/x"),
                Some((Subresource::Files, Kind::Call)),
            ),
            (
                Method::GET,
                format!("{base}/files"),
                Some("path=/x"),
                Some((Subresource::Files, Kind::Call)),
            ),
            (
                Method::GET,
                "/apis/subresources.vm.smolvm.dev/v1alpha1".into(),
                None,
                None,
            ),
            (Method::GET, "/healthz".into(), None, None),
            (Method::GET, format!("{base}/status"), None, None),
            (Method::GET, format!("{base}/log/extra"), None, None),
        ];
        for (method, path, query, want) in table {
            assert_eq!(classify(&method, &path, query), want, "{method} {path} {query:?}");
        }
    }

    #[test]
    fn slots_and_budget_shed_with_429() {
        let gates = Gates::new(Limits {
            max_calls: 1,
            max_streams: 1,
            body_budget: 100,
            ..Limits::default()
        });
        let call = gates.slot(Kind::Call, "alice").expect("the first call");
        let refused = gates.slot(Kind::Call, "bob").expect_err("a second call");
        assert_eq!((refused.status().as_u16(), refused.reason()), (429, "TooManyRequests"));
        assert_eq!(refused.to_status()["details"]["retryAfterSeconds"], 1);
        let stream = gates.slot(Kind::Stream, "alice").expect("a session has its own slots");
        assert!(gates.slot(Kind::Stream, "alice").is_err());
        drop(call);
        drop(stream);
        assert!(gates.slot(Kind::Call, "bob").is_ok(), "a slot comes back");

        let sixty = gates.buffer(60).expect("60 of 100 bytes");
        assert_eq!(
            gates.buffer(41).map(|_| ()).map_err(|e| e.reason()),
            Err("TooManyRequests")
        );
        let forty = gates.buffer(40).expect("the rest");
        drop((sixty, forty));
        assert!(gates.buffer(100).is_ok());
        assert!(gates.buffer(usize::MAX).is_err(), "beyond any budget");
    }

    #[test]
    fn one_user_cannot_take_every_slot() {
        let gates = Gates::new(Limits {
            max_calls: 3,
            max_calls_per_user: 2,
            ..Limits::default()
        });
        let first = gates.slot(Kind::Call, "alice").expect("alice's first");
        let second = gates.slot(Kind::Call, "alice").expect("alice's second");
        let third = gates.slot(Kind::Call, "alice").expect_err("alice's third");
        assert_eq!(third.reason(), "TooManyRequests");
        assert!(third.to_string().contains("alice"), "{third}");
        let bob = gates.slot(Kind::Call, "bob").expect("bob still has room");
        assert!(
            gates.slot(Kind::Stream, "alice").is_ok(),
            "sessions are counted apart from calls"
        );
        // A clone kept by a session's task holds the slot until the last one goes.
        let kept = first.clone();
        drop(first);
        assert!(gates.slot(Kind::Call, "alice").is_err(), "still held by the clone");
        drop(kept);
        assert!(gates.slot(Kind::Call, "alice").is_ok(), "given back");
        drop((second, bob));
        assert!(
            gates.users.lock().map(|u| u.is_empty()).unwrap_or(false),
            "no count left behind"
        );
    }
}
