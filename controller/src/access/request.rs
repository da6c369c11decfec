//! The pure part of an access call: which subresource and verb, the SubjectAccessReview that
//! authorizes it, the node API request it becomes, and how the node's answers read to a user.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, HeaderValue};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use smolvm_api::{
    SmolVM,
    nodeapi::{ErrorCode, Operation},
};

use super::{AccessError, GROUP, frontproxy::User};
use crate::nodeclient::CallError;

/// The subresources of a SmolVM this API serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subresource {
    /// The machine's console or workload log.
    Log,
    /// A command in the machine.
    Exec,
    /// Files copied out of and into the machine.
    Files,
}

impl Subresource {
    /// Its name, as in `smolvms/<name>`.
    pub fn as_str(self) -> &'static str {
        match self {
            Subresource::Log => "log",
            Subresource::Exec => "exec",
            Subresource::Files => "files",
        }
    }

    /// The verb authorized for `method` on this subresource (SPEC 6.1): reading a log or a file
    /// is `get`; running a command or writing a file is `create`. `None`: not served.
    pub fn verb(self, method: &axum::http::Method) -> Option<&'static str> {
        use axum::http::Method;
        match (self, method) {
            (Subresource::Log, &Method::GET) => Some("get"),
            // GET is an interactive exec (a WebSocket upgrade): a command all the same.
            (Subresource::Exec, &Method::POST | &Method::GET) => Some("create"),
            (Subresource::Files, &Method::GET) => Some("get"),
            (Subresource::Files, &Method::POST) => Some("create"),
            _ => None,
        }
    }
}

/// The SubjectAccessReview asking whether `user` may `verb` the subresource of SmolVM
/// `namespace/name` (in this API's group, as the API server authorized the request itself).
pub fn access_review(user: &User, namespace: &str, name: &str, sub: Subresource, verb: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: user.uid.clone(),
            groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect::<BTreeMap<_, _>>()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(GROUP.to_string()),
                resource: Some("smolvms".to_string()),
                subresource: Some(sub.as_str().to_string()),
                verb: Some(verb.to_string()),
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The verdict of a SubjectAccessReview: `Ok` when allowed, else the `Forbidden` a user reads
/// (worded as the API server words its own).
pub fn verdict(
    status: Option<&SubjectAccessReviewStatus>,
    user: &User,
    namespace: &str,
    name: &str,
    sub: Subresource,
    verb: &str,
) -> Result<(), AccessError> {
    if status.is_some_and(|s| s.allowed && s.denied != Some(true)) {
        return Ok(());
    }
    let why = status
        .and_then(|s| s.reason.as_deref())
        .filter(|r| !r.is_empty())
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    Err(AccessError::Forbidden(format!(
        "smolvms.{GROUP} {name:?} is forbidden: User {:?} cannot {verb} resource \"smolvms/{}\" in API group \
         {GROUP:?} in the namespace {namespace:?}{why}",
        user.name,
        sub.as_str()
    )))
}

/// Translates the log query of this API (`follow`, `tailLines`, `source`, as `kubectl logs`
/// names them) into the node API's (`follow`, `tail`, `source`).
pub fn node_log_query(query: Option<&str>) -> Result<String, AccessError> {
    let bad = |m: String| AccessError::BadRequest(m);
    let mut out = Vec::new();
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "follow" => match value {
                "true" | "1" | "" => out.push("follow=true".to_string()),
                "false" | "0" => {}
                _ => return Err(bad(format!("follow={value:?}: must be true or false"))),
            },
            "tailLines" => {
                let lines: u32 = value
                    .parse()
                    .map_err(|_| bad(format!("tailLines={value:?}: must be a count of lines (0 or more)")))?;
                out.push(format!("tail={lines}"));
            }
            "source" => match value {
                "console" | "workload" => out.push(format!("source={value}")),
                _ => return Err(bad(format!("source={value:?}: must be console or workload"))),
            },
            other => {
                return Err(bad(format!(
                    "unknown query parameter {other:?} for smolvms/log; known: follow, tailLines, source"
                )));
            }
        }
    }
    Ok(out.join("&"))
}

/// The WebSocket handshake headers of an upgrade request, to pass on to the agent (which
/// answers the handshake): `Connection`, `Upgrade`, `Sec-WebSocket-Key`, `-Version` and
/// `-Protocol`. A request that is no WebSocket upgrade is a 400 saying what to send instead.
pub fn websocket_handshake(headers: &HeaderMap) -> Result<HeaderMap, AccessError> {
    use axum::http::header::{CONNECTION, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL, SEC_WEBSOCKET_VERSION, UPGRADE};
    let has = |name, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if !(has(UPGRADE, "websocket") && has(CONNECTION, "upgrade") && headers.contains_key(SEC_WEBSOCKET_KEY)) {
        return Err(AccessError::BadRequest(format!(
            "GET smolvms/exec is an interactive session: send a WebSocket upgrade offering {} \
             (as kubectl exec does), or POST to run one command",
            smolvm_api::channel::PROTOCOLS.join(" or ")
        )));
    }
    let mut out = HeaderMap::new();
    out.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    out.insert(UPGRADE, HeaderValue::from_static("websocket"));
    for name in [SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION, SEC_WEBSOCKET_PROTOCOL] {
        for value in headers.get_all(&name) {
            out.append(name.clone(), value.clone());
        }
    }
    Ok(out)
}

/// The query of an interactive exec, checked (see [`smolvm_api::channel::ExecStreamQuery`]).
pub fn exec_stream_query(query: Option<&str>) -> Result<smolvm_api::channel::ExecStreamQuery, AccessError> {
    smolvm_api::channel::ExecStreamQuery::parse(query.unwrap_or_default()).map_err(AccessError::BadRequest)
}

/// The `101 Switching Protocols` answered to the client, with the agent's handshake answer
/// (`Sec-WebSocket-Accept`, the subprotocol it chose).
pub fn switching_protocols(agent: &HeaderMap) -> axum::response::Response {
    use axum::http::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_PROTOCOL, UPGRADE};
    let mut response = axum::response::Response::new(axum::body::Body::empty());
    *response.status_mut() = axum::http::StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    for name in [SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_PROTOCOL] {
        if let Some(value) = agent.get(&name) {
            headers.insert(name, value.clone());
        }
    }
    response
}

/// What a files call names: the path in the machine, and (for a write) the mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesQuery {
    /// Absolute path in the machine.
    pub path: String,
    /// File mode of a write (octal digits as given, e.g. `0644`).
    pub mode: Option<String>,
}

/// Parses `path=/abs/path[&mode=0644]` (the path percent-encoded).
pub fn files_query(query: Option<&str>) -> Result<FilesQuery, AccessError> {
    let bad = |m: String| AccessError::BadRequest(m);
    let mut path = None;
    let mut mode = None;
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = super::frontproxy::percent_decode(&value.replace('+', " "));
        match key {
            "path" => path = Some(value),
            "mode" => {
                if value.is_empty() || value.len() > 4 || !value.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
                    return Err(bad(format!(
                        "mode={value:?}: must be octal permission bits such as 0644"
                    )));
                }
                mode = Some(value);
            }
            other => {
                return Err(bad(format!(
                    "unknown query parameter {other:?} for smolvms/files; known: path, mode"
                )));
            }
        }
    }
    let path = path.ok_or_else(|| bad("path is required: the absolute path of the file in the machine".into()))?;
    if !path.starts_with('/') {
        return Err(bad(format!("path={path:?}: must be absolute")));
    }
    Ok(FilesQuery { path, mode })
}

/// The node API path of a file for `operation` ([`Operation::ReadFile`] or
/// [`Operation::WriteFile`]): the contract's [`Operation::file_path`] (each segment
/// percent-encoded; the agent checks the segments themselves), and the mode of a write.
pub fn node_file_path(operation: Operation, machine: &str, path: &str, mode: Option<&str>) -> String {
    let mut out = operation.file_path(machine, path);
    if let Some(mode) = mode {
        out.push_str("?mode=");
        out.push_str(mode);
    }
    out
}

/// Where a SmolVM's machine is: its node and machine name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `namespace/name`, for messages.
    pub vm: String,
    /// The node it is bound to.
    pub node: String,
    /// Its machine there.
    pub machine: String,
    /// Its phase, for messages.
    pub phase: String,
}

/// The node and machine of `vm`, or the conflict a user reads when it has none yet.
pub fn target(vm: &SmolVM) -> Result<Target, AccessError> {
    let id = format!(
        "{}/{}",
        vm.metadata.namespace.as_deref().unwrap_or_default(),
        vm.metadata.name.as_deref().unwrap_or_default()
    );
    let phase = vm
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .map(|p| format!("{p:?}"))
        .unwrap_or_else(|| "Pending".into());
    let Some(node) = vm.bound_node() else {
        return Err(AccessError::Conflict(format!(
            "SmolVM {id} is not placed on a node yet (phase {phase}); nothing runs to reach"
        )));
    };
    let machine = vm
        .machine_name()
        .ok_or_else(|| AccessError::Conflict(format!("SmolVM {id} has no UID yet")))?;
    Ok(Target {
        vm: id,
        node: node.to_string(),
        machine,
        phase,
    })
}

/// Whether a call on `sub` wakes `vm` first (SPEC 2.7): an exec or a copy to a VM the controller
/// suspended for idleness whose traffic wakes it (a log is read as it is, asleep or not).
pub fn wakes(vm: &SmolVM, sub: Subresource) -> bool {
    vm.idle_suspended() && vm.spec.wakes_on_traffic() && matches!(sub, Subresource::Exec | Subresource::Files)
}

/// Whether a woken VM runs again: the controller reported it Running since the wake was asked.
pub fn woken(vm: &SmolVM) -> bool {
    vm.status.as_ref().and_then(|s| s.phase) == Some(smolvm_api::Phase::Running)
}

/// How a failed node API call reads to the user of `target`.
pub fn from_call(error: CallError, target: &Target) -> AccessError {
    let Target { vm, node, phase, .. } = target;
    match error {
        CallError::Unreachable { message, .. } => AccessError::Unavailable(format!(
            "SmolVM {vm} runs on node {node}, whose runtime agent cannot be reached now: {message}"
        )),
        CallError::Protocol { message, .. } => AccessError::BadGateway(format!(
            "the runtime agent of node {node} answered unreadably: {message}"
        )),
        CallError::Api {
            code, message, details, ..
        } => match code {
            ErrorCode::MachineNotRunning => {
                AccessError::Conflict(format!("SmolVM {vm} is not running (phase {phase}): {message}"))
            }
            ErrorCode::MachineNotFound => AccessError::NotFound(format!(
                "the machine of SmolVM {vm} is not on node {node} (phase {phase})"
            )),
            ErrorCode::FileNotFound => match details.as_ref().and_then(|d| d.get("path")).and_then(|p| p.as_str()) {
                Some(path) => AccessError::NotFound(format!("SmolVM {vm} has no file or directory {path}")),
                None => AccessError::NotFound(format!("SmolVM {vm}: {message}")),
            },
            ErrorCode::InvalidRequest => AccessError::BadRequest(message),
            ErrorCode::PayloadTooLarge => AccessError::TooLarge(message),
            ErrorCode::TooManyStreams | ErrorCode::TooManyBytes => {
                AccessError::TooManyRequests(format!("SmolVM {vm}: {message}"))
            }
            ErrorCode::Conflict => AccessError::Conflict(format!("SmolVM {vm}: {message}")),
            code if code.is_runtime_unreachable() => AccessError::Unavailable(format!(
                "SmolVM {vm}: the runtime on node {node} is not available now ({}): {message}",
                code.as_str()
            )),
            code => AccessError::BadGateway(format!(
                "the runtime agent of node {node} answered {}: {message}",
                code.as_str()
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use axum::http::Method;
    use smolvm_api::{Phase, SmolVMStatus};

    use super::*;

    #[test]
    fn verbs() {
        let table = [
            (Subresource::Log, Method::GET, Some("get")),
            (Subresource::Log, Method::POST, None),
            (Subresource::Exec, Method::POST, Some("create")),
            // A WebSocket exec is a GET, authorized as create: `get` must never give a shell.
            (Subresource::Exec, Method::GET, Some("create")),
            (Subresource::Exec, Method::PUT, None),
            (Subresource::Files, Method::GET, Some("get")),
            (Subresource::Files, Method::POST, Some("create")),
            (Subresource::Files, Method::PUT, None),
            (Subresource::Files, Method::DELETE, None),
        ];
        for (sub, method, want) in table {
            assert_eq!(sub.verb(&method), want, "{sub:?} {method}");
        }
    }

    #[test]
    fn websocket_handshakes() {
        let headers = |pairs: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(
                    axum::http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                    HeaderValue::from_str(value).expect("value"),
                );
            }
            map
        };
        let good = [
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-version", "13"),
            ("sec-websocket-protocol", "v5.channel.k8s.io, v4.channel.k8s.io"),
            ("x-remote-user", "alice"),
            ("authorization", "Bearer secret"),
        ];
        let passed = websocket_handshake(&headers(&good)).expect("a handshake");
        let mut names: Vec<_> = passed.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "connection",
                "sec-websocket-key",
                "sec-websocket-protocol",
                "sec-websocket-version",
                "upgrade"
            ],
            "only the handshake goes on: never the user's headers or credentials"
        );
        assert_eq!(passed["sec-websocket-protocol"], "v5.channel.k8s.io, v4.channel.k8s.io");
        // Token lists and case, as proxies write them.
        assert!(
            websocket_handshake(&headers(&[
                ("connection", "keep-alive, upgrade"),
                ("upgrade", "WebSocket"),
                ("sec-websocket-key", "k"),
            ]))
            .is_ok()
        );
        for (what, pairs) in [
            ("no headers", &[][..]),
            ("no upgrade", &good[..1]),
            (
                "h2c upgrade",
                &[
                    ("connection", "Upgrade"),
                    ("upgrade", "h2c"),
                    ("sec-websocket-key", "k"),
                ][..],
            ),
            ("no key", &[("connection", "Upgrade"), ("upgrade", "websocket")][..]),
        ] {
            match websocket_handshake(&headers(pairs)) {
                Err(AccessError::BadRequest(message)) => {
                    assert!(
                        message.contains("WebSocket upgrade") && message.contains("POST"),
                        "{what}: {message}"
                    )
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn interactive_exec_answers() {
        assert!(matches!(exec_stream_query(Some("command=sh&tty=true&stdin=true")), Ok(q) if q.tty && q.stdin));
        assert!(
            matches!(exec_stream_query(None), Err(AccessError::BadRequest(m)) if m.contains("command is required"))
        );
        let mut agent = HeaderMap::new();
        agent.insert(
            "sec-websocket-accept",
            HeaderValue::from_static("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        );
        agent.insert("sec-websocket-protocol", HeaderValue::from_static("v5.channel.k8s.io"));
        agent.insert("x-other", HeaderValue::from_static("x"));
        let response = switching_protocols(&agent);
        assert_eq!(response.status(), 101);
        let h = response.headers();
        assert_eq!(h["sec-websocket-accept"], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(h["sec-websocket-protocol"], "v5.channel.k8s.io");
        assert_eq!(
            (&h["upgrade"], &h["connection"]),
            (
                &HeaderValue::from_static("websocket"),
                &HeaderValue::from_static("Upgrade")
            )
        );
        assert!(!h.contains_key("x-other"));
    }

    #[test]
    fn review_names_the_subresource_in_this_group() {
        let user = User {
            name: "alice".into(),
            uid: Some("u1".into()),
            groups: vec!["dev".into()],
            extra: BTreeMap::from([("scopes".into(), vec!["a".into()])]),
        };
        let review = access_review(&user, "team-a", "web", Subresource::Exec, "create");
        let attrs = review.spec.resource_attributes.expect("attributes");
        assert_eq!(
            (
                attrs.group.as_deref(),
                attrs.resource.as_deref(),
                attrs.subresource.as_deref(),
                attrs.verb.as_deref(),
                attrs.namespace.as_deref(),
                attrs.name.as_deref()
            ),
            (
                Some(GROUP),
                Some("smolvms"),
                Some("exec"),
                Some("create"),
                Some("team-a"),
                Some("web")
            )
        );
        assert_eq!(review.spec.user.as_deref(), Some("alice"));
        assert_eq!(review.spec.groups, Some(vec!["dev".to_string()]));
        assert!(review.spec.extra.is_some_and(|e| e.contains_key("scopes")));
    }

    #[test]
    fn verdicts() {
        let user = User {
            name: "bob".into(),
            ..Default::default()
        };
        let status = |allowed: bool, denied: Option<bool>, reason: Option<&str>| SubjectAccessReviewStatus {
            allowed,
            denied,
            reason: reason.map(str::to_string),
            ..Default::default()
        };
        let table = [
            ("allowed", Some(status(true, None, None)), true),
            ("no opinion", Some(status(false, None, None)), false),
            ("denied", Some(status(false, Some(true), Some("no"))), false),
            ("no status", None, false),
        ];
        for (what, status, ok) in table {
            let got = verdict(status.as_ref(), &user, "ns", "web", Subresource::Log, "get");
            assert_eq!(got.is_ok(), ok, "{what}");
            if let Err(e) = got {
                assert_eq!(e.status_reason(), "Forbidden");
                let text = e.to_string();
                assert!(
                    text.contains("\"bob\"") && text.contains("smolvms/log") && text.contains("\"ns\""),
                    "{what}: {text}"
                );
            }
        }
    }

    #[test]
    fn log_queries() {
        let table: [(Option<&str>, Result<&str, ()>); 8] = [
            (None, Ok("")),
            (Some("follow=true&tailLines=20"), Ok("follow=true&tail=20")),
            (Some("follow=false&source=workload"), Ok("source=workload")),
            (Some("source=console"), Ok("source=console")),
            (Some("tailLines=-1"), Err(())),
            (Some("source=kernel"), Err(())),
            (Some("follow=maybe"), Err(())),
            (Some("container=x"), Err(())),
        ];
        for (query, want) in table {
            let got = node_log_query(query);
            match want {
                Ok(q) => assert_eq!(got.ok().as_deref(), Some(q), "{query:?}"),
                Err(()) => assert_eq!(got.err().map(|e| e.reason()), Some("BadRequest"), "{query:?}"),
            }
        }
    }

    #[test]
    fn files_queries_and_node_paths() {
        let q = files_query(Some("path=%2Fetc%2Fmy%20file&mode=0600")).expect("query");
        assert_eq!(
            q,
            FilesQuery {
                path: "/etc/my file".into(),
                mode: Some("0600".into())
            }
        );
        assert_eq!(
            node_file_path(Operation::WriteFile, "svm-1", &q.path, q.mode.as_deref()),
            "/v1/machines/svm-1/files/etc/my%20file?mode=0600"
        );
        assert_eq!(
            node_file_path(Operation::ReadFile, "svm-1", "/a/b.txt", None),
            "/v1/machines/svm-1/files/a/b.txt"
        );
        for bad in [
            None,
            Some("path=relative"),
            Some("path=/x&mode=999"),
            Some("path=/x&mode="),
            Some("path=/x&owner=root"),
        ] {
            assert_eq!(
                files_query(bad).err().map(|e| e.reason()),
                Some("BadRequest"),
                "{bad:?}"
            );
        }
    }

    fn vm(bound: Option<&str>, phase: Option<Phase>) -> SmolVM {
        let mut vm: SmolVM = serde_json::from_value(smolvm_api::fixtures::alpine()).expect("fixture");
        vm.metadata.namespace = Some("team-a".into());
        vm.metadata.name = Some("web".into());
        vm.metadata.uid = Some("ABC".into());
        vm.status = Some(SmolVMStatus {
            node_name: bound.map(str::to_string),
            phase,
            ..Default::default()
        });
        vm
    }

    #[test]
    fn targets_and_node_answers() {
        let unplaced = target(&vm(None, Some(Phase::Pending))).expect_err("not placed");
        assert_eq!(unplaced.status().as_u16(), 409);
        assert!(unplaced.to_string().contains("team-a/web"), "{unplaced}");
        let t = target(&vm(Some("node-1"), Some(Phase::Failed))).expect("bound");
        assert_eq!((t.node.as_str(), t.machine.as_str()), ("node-1", "svm-abc"));

        let api = |code: ErrorCode| CallError::Api {
            node: "node-1".into(),
            status: code.status(),
            code,
            message: "said so".into(),
            details: None,
        };
        let table: Vec<(&str, CallError, u16, &str)> = vec![
            (
                "unreachable agent",
                CallError::Unreachable {
                    node: "node-1".into(),
                    message: "connection refused".into(),
                },
                503,
                "cannot be reached",
            ),
            ("not running", api(ErrorCode::MachineNotRunning), 409, "phase Failed"),
            ("machine gone", api(ErrorCode::MachineNotFound), 404, "node-1"),
            (
                "file missing",
                CallError::Api {
                    node: "node-1".into(),
                    status: 404,
                    code: ErrorCode::FileNotFound,
                    message: "said so".into(),
                    details: Some(serde_json::json!({"path": "/etc/none"})),
                },
                404,
                "has no file or directory /etc/none",
            ),
            ("file missing, no details", api(ErrorCode::FileNotFound), 404, "said so"),
            ("bad request", api(ErrorCode::InvalidRequest), 400, "said so"),
            ("too large", api(ErrorCode::PayloadTooLarge), 413, "said so"),
            ("too many streams", api(ErrorCode::TooManyStreams), 429, "said so"),
            ("too many upload bytes", api(ErrorCode::TooManyBytes), 429, "said so"),
            ("runtime down", api(ErrorCode::RuntimeUnavailable), 503, "node-1"),
            (
                "unreadable",
                CallError::Protocol {
                    node: "node-1".into(),
                    message: "garbage".into(),
                },
                502,
                "garbage",
            ),
        ];
        for (what, error, code, mentions) in table {
            let e = from_call(error, &t);
            assert_eq!(e.status().as_u16(), code, "{what}");
            assert!(e.to_string().contains(mentions), "{what}: {e}");
        }
    }
}
