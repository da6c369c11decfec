//! The built binary against a TEST DOUBLE of the API server (plain HTTP on loopback, from a
//! kubeconfig written for the test): the requests it makes, what it prints, and its exit codes.
//!
//! The double stands in for what cannot run here: a booted guest behind the access API (guests
//! do not boot on these machines), so exec's exit code and bytes and cp in both directions are
//! checked against recorded answers. The plugin against the real kube-apiserver, its aggregator
//! and the controller's access API is `tests/tests/e2e/access.rs`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

const SUB: &str = "/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/shop/smolvms";
const CRD: &str = "/apis/vm.smolvm.dev/v1alpha1/namespaces/shop/smolvms";

/// One request the stand-in server saw.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    uri: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

#[derive(Clone, Default)]
struct Server {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// The SmolVMs created through the stand-in, as it stored them, in the order they arrived.
    created: Arc<Mutex<Vec<Value>>>,
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code.as_u16(), "reason": reason, "message": message});
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// A branch source of the stand-in: branchable, in `phase`.
fn branch_source(name: &str, phase: &str) -> Response {
    let body = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM", "metadata": {"name": name, "namespace": "shop"}, "spec": {"running": true, "branchable": true}, "status": {"phase": phase}});
    json_response(StatusCode::OK, &body)
}

/// A status with `phase` and a Ready condition of `reason` and `message`.
fn vm_status(phase: &str, reason: &str, message: &str) -> Value {
    let ready = if phase == "Running" { "True" } else { "False" };
    json!({"phase": phase, "nodeName": "node-a", "conditions": [{"type": "Ready", "status": ready, "reason": reason, "message": message}]})
}

/// What the stand-in's controller says of the `nth` branch of `source` created: on the first
/// list of its branches, or `later` (in watch events and later lists).
///
/// - `base`, `nowatch`: Creating, then Running;
/// - `flaky`: its first branch Creating, then Failed; the others as `base`'s;
/// - `stuck` (a source that does not run): Pending for good, waiting for it.
fn branch_status(source: &str, nth: usize, later: bool) -> Value {
    match (source, nth, later) {
        ("stuck", _, _) => vm_status(
            "Pending",
            "BranchPending",
            "waiting for its source shop/stuck to run on node-a",
        ),
        (_, _, false) => vm_status("Creating", "Creating", "the node is creating the machine"),
        ("flaky", 0, true) => vm_status(
            "Failed",
            "CreateFailed",
            "smolvm could not branch svm-uid-src: out of memory on node-a",
        ),
        _ => vm_status("Running", "Running", "the machine runs"),
    }
}

/// `POST …/smolvms`: stores the SmolVM, named from its generateName as the API server would
/// (five characters more) and labelled as the webhook labels a branch; refuses every branch of
/// `readonly` (no permission) and those of `quota` past two (a ResourceQuota's count).
fn create_smolvm(server: &Server, body: &[u8]) -> Response {
    let Ok(mut object) = serde_json::from_slice::<Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "the body is not JSON");
    };
    let source = object
        .pointer("/spec/branchOf/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let prefix = object
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut created = server.created.lock().expect("lock");
    let of_source = created
        .iter()
        .filter(|o| o.pointer("/spec/branchOf/name").and_then(Value::as_str) == Some(source.as_str()))
        .count();
    if source == "readonly" || (source == "quota" && of_source >= 2) {
        let why = if source == "readonly" {
            "User \"jane\" cannot create resource \"smolvms\" in API group \"vm.smolvm.dev\" in the namespace \"shop\""
                .to_string()
        } else {
            "exceeded quota: shop-vms, requested: count/smolvms.vm.smolvm.dev=1, used: count/smolvms.vm.smolvm.dev=2, limited: count/smolvms.vm.smolvm.dev=2".to_string()
        };
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!("smolvms.vm.smolvm.dev is forbidden: {why}"),
        );
    }
    let n = created.len();
    object["metadata"] = json!({
        "name": format!("{prefix}{n:05}"),
        "namespace": "shop",
        "uid": format!("uid-{n}"),
        "resourceVersion": (10 + n).to_string(),
        "creationTimestamp": jiff::Timestamp::now().to_string(),
        "labels": {"vm.smolvm.dev/branch-of": source},
    });
    created.push(object.clone());
    json_response(StatusCode::CREATED, &object)
}

/// The value of `key` in a URL query, percent-decoded.
fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| {
            let bytes = v.replace('+', " ").into_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < bytes.len() {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
                    (b'%', Some(byte)) => {
                        out.push(byte);
                        i += 3;
                    }
                    (byte, _) => {
                        out.push(byte);
                        i += 1;
                    }
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        })
    })
}

/// `GET …/smolvms?labelSelector=vm.smolvm.dev/branch-of=SOURCE`, with `watch=true` or without:
/// the branches created through the stand-in, `fleet`'s two standing ones, or a refusal
/// (`secret`'s branches may not be listed, `nowatch`'s not watched).
fn list_or_watch(server: &Server, query: &str) -> Response {
    let selector = query_value(query, "labelSelector").unwrap_or_default();
    let Some(source) = selector.strip_prefix("vm.smolvm.dev/branch-of=") else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the stand-in lists branches only",
        );
    };
    let watch = query_value(query, "watch").as_deref() == Some("true");
    let forbidden = |verb: &str| {
        status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!(
                "smolvms.vm.smolvm.dev is forbidden: User \"jane\" cannot {verb} resource \"smolvms\" in API group \"vm.smolvm.dev\" in the namespace \"shop\""
            ),
        )
    };
    if source == "secret" {
        return forbidden("list");
    }
    if watch && source == "nowatch" {
        return forbidden("watch");
    }
    // The lists of this source's branches before this one (this request is already seen).
    let lists_before = server
        .seen()
        .iter()
        .filter(|s| s.method == Method::GET && s.uri.contains("labelSelector") && !s.uri.contains("watch=true"))
        .filter(|s| {
            let q = s.uri.split_once('?').map(|(_, q)| q).unwrap_or_default();
            query_value(q, "labelSelector").as_deref() == Some(selector.as_str())
        })
        .count()
        .saturating_sub(1);
    let later = watch || lists_before > 0;
    let mut items: Vec<Value> = Vec::new();
    let created = server.created.lock().expect("lock").clone();
    for (nth, mut object) in created
        .into_iter()
        .filter(|o| o.pointer("/spec/branchOf/name").and_then(Value::as_str) == Some(source))
        .enumerate()
    {
        object["status"] = branch_status(source, nth, later);
        items.push(object);
    }
    if source == "fleet" {
        let ago = |minutes: i64| (jiff::Timestamp::now() - jiff::SignedDuration::from_mins(minutes)).to_string();
        let branch = |name: &str, minutes: i64, status: Value| {
            json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
                   "metadata": {"name": name, "namespace": "shop", "creationTimestamp": ago(minutes), "labels": {"vm.smolvm.dev/branch-of": "fleet"}},
                   "spec": {"branchOf": {"name": "fleet"}}, "status": status})
        };
        let mut pending = vm_status("Pending", "BranchPending", "waiting for fleet");
        pending["nodeName"] = json!("node-b");
        items.push(branch("fleet-zzzzz", 180, vm_status("Running", "Running", "")));
        items.push(branch("fleet-aaaaa", 30, pending));
    }
    if watch {
        let lines: String = items
            .iter()
            .map(|object| format!("{}\n", json!({"type": "MODIFIED", "object": object})))
            .collect();
        return ([(header::CONTENT_TYPE, "application/json")], lines).into_response();
    }
    let list = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMList", "metadata": {"resourceVersion": "100"}, "items": items});
    json_response(StatusCode::OK, &list)
}

fn smolvm(name: &str, running: bool) -> Response {
    let body = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM", "metadata": {"name": name, "namespace": "shop"}, "spec": {"running": running}});
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn answer(State(server): State<Server>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let seen = Seen {
        method: method.clone(),
        uri: uri.to_string(),
        headers,
        body: body.to_vec(),
    };
    if let Ok(mut all) = server.seen.lock() {
        all.push(seen);
    }
    let path = uri.path();
    let query = uri.query().unwrap_or("");
    match (method, path) {
        (Method::GET, p) if p == format!("{SUB}/web/log") => "boot ok\nworkload up\n".into_response(),
        (Method::POST, p) if p == format!("{SUB}/web/exec") => {
            let echo = STANDARD.encode(&body);
            let body = json!({"exitCode": 7, "stdoutBase64": echo, "stderrBase64": STANDARD.encode(b"warn\n")});
            ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        (Method::POST, p) if p == format!("{SUB}/broken/exec") => status(
            StatusCode::CONFLICT,
            "Conflict",
            "SmolVM shop/broken is not running (phase Failed): disk lost",
        ),
        (Method::GET, p) if p == format!("{SUB}/web/files") && query == "path=/etc" => {
            ([(header::CONTENT_TYPE, "application/json")], r#"{"entries":[]}"#).into_response()
        }
        (Method::GET, p) if p == format!("{SUB}/web/files") => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            &b"\x00bytes\xff"[..],
        )
            .into_response(),
        (Method::POST, p) if p == format!("{SUB}/web/files") => {
            let body = json!({"path": "/x", "bytes": body.len()});
            ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        (Method::GET, p) if p == CRD => list_or_watch(&server, query),
        (Method::POST, p) if p == CRD => create_smolvm(&server, &body),
        (Method::GET, p) if p == format!("{CRD}/base") => branch_source("base", "Running"),
        (Method::GET, p) if p == format!("{CRD}/flaky") => branch_source("flaky", "Running"),
        (Method::GET, p) if p == format!("{CRD}/nowatch") => branch_source("nowatch", "Running"),
        (Method::GET, p) if p == format!("{CRD}/stuck") => branch_source("stuck", "Stopped"),
        (Method::GET, p) if p == format!("{CRD}/quota") => branch_source("quota", "Running"),
        (Method::GET, p) if p == format!("{CRD}/readonly") => branch_source("readonly", "Running"),
        (Method::GET, p) if p == format!("{CRD}/web") => smolvm("web", true),
        (Method::GET, p) if p == format!("{CRD}/idle") => smolvm("idle", false),
        (Method::PATCH, p) if p.starts_with(CRD) => smolvm("web", true),
        _ => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("smolvms.vm.smolvm.dev {path:?} not found"),
        ),
    }
}

/// `GET …/smolvms/{name}/exec` upgraded: plays a command in Kubernetes' channel protocol, as
/// the access API relays it from a node: `out` on stdout, `err` on stderr, exit code 3.
/// `broken` is refused before the upgrade, as a VM that is not running is.
async fn session(
    State(server): State<Server>,
    axum::extract::Path(name): axum::extract::Path<String>,
    uri: Uri,
    headers: HeaderMap,
    upgrade: axum::extract::ws::WebSocketUpgrade,
) -> Response {
    use axum::extract::ws::Message;
    use smolvm_api::channel::{self, Ending};
    if let Ok(mut all) = server.seen.lock() {
        all.push(Seen {
            method: Method::GET,
            uri: uri.to_string(),
            headers,
            body: Vec::new(),
        });
    }
    if name == "broken" {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            "SmolVM shop/broken is not running (phase Failed): disk lost",
        );
    }
    if name == "term" {
        // A terminal session: answers the first resize with the size, then exits 5.
        return upgrade
            .protocols(channel::PROTOCOLS)
            .on_upgrade(|mut socket| async move {
                while let Some(Ok(message)) = socket.recv().await {
                    let Message::Binary(bytes) = message else { continue };
                    if let Ok(channel::Inbound::Resize { cols, rows }) = channel::decode(&bytes) {
                        let text = format!("size {cols}x{rows}\r\n");
                        let _ = socket
                            .send(Message::Binary(channel::frame(channel::STDOUT, text.as_bytes()).into()))
                            .await;
                        break;
                    }
                }
                let status = channel::status(&Ending::Exited(5)).to_string();
                let _ = socket
                    .send(Message::Binary(
                        channel::frame(channel::STATUS, status.as_bytes()).into(),
                    ))
                    .await;
                let _ = socket.send(Message::Close(None)).await;
            });
    }
    upgrade
        .protocols(channel::PROTOCOLS)
        .on_upgrade(|mut socket| async move {
            for (ch, data) in [
                (channel::STDOUT, b"out\x00\xff\n".to_vec()),
                (channel::STDERR, b"err\n".to_vec()),
                (
                    channel::STATUS,
                    channel::status(&Ending::Exited(3)).to_string().into_bytes(),
                ),
            ] {
                let _ = socket.send(Message::Binary(channel::frame(ch, &data).into())).await;
            }
            let _ = socket.send(Message::Close(None)).await;
        })
}

/// Starts the stand-in server and writes a kubeconfig for it (namespace `shop`).
async fn start() -> (Server, tempfile::TempDir, PathBuf) {
    let server = Server::default();
    let app = axum::Router::new()
        .route(
            "/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/shop/smolvms/{name}/exec",
            axum::routing::get(session).post(answer),
        )
        .fallback(answer)
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: test\n  cluster:\n    server: http://{addr}\n\
         contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: shop\n\
         users:\n- name: test\n  user:\n    token: secret-token\n"
    );
    std::fs::write(&kubeconfig, text).expect("write kubeconfig");
    (server, dir, kubeconfig)
}

struct Run {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

async fn kubectl_smolvm(kubeconfig: &Path, args: &[&str], stdin: &[u8]) -> Run {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-smolvm"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin).await.expect("write stdin");
    }
    let out = child.wait_with_output().await.expect("run");
    Run {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_stream_with_the_query_asked_for() {
    let (server, _dir, kubeconfig) = start().await;
    let run = kubectl_smolvm(
        &kubeconfig,
        &["logs", "web", "-f", "--tail", "5", "--source", "workload"],
        b"",
    )
    .await;
    assert_eq!((run.code, run.stderr.as_str()), (Some(0), ""));
    assert_eq!(run.stdout, b"boot ok\nworkload up\n");
    let seen = server.seen();
    assert_eq!(
        seen[0].uri,
        format!("{SUB}/web/log?follow=true&tailLines=5&source=workload")
    );
    assert_eq!(
        seen[0].headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()),
        Some("Bearer secret-token")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_sends_the_request_and_takes_the_exit_code() {
    let (server, _dir, kubeconfig) = start().await;
    let args = [
        "exec",
        "web",
        "-i",
        "-e",
        "A=b",
        "-w",
        "/srv",
        "--timeout",
        "2m",
        "--as",
        "jane",
        "--as-group",
        "ops",
        "--",
        "cat",
        "-n",
    ];
    let run = kubectl_smolvm(&kubeconfig, &args, b"hello").await;
    assert_eq!(run.code, Some(7), "{}", run.stderr);
    assert_eq!(run.stderr, "warn\n");
    let sent: Value = serde_json::from_slice(&run.stdout).expect("the echoed request");
    assert_eq!(
        sent,
        json!({"command": ["cat", "-n"], "env": [{"name": "A", "value": "b"}], "workingDir": "/srv", "stdin": "hello", "timeoutSeconds": 120})
    );
    let seen = server.seen();
    assert_eq!(
        seen[0].headers.get("impersonate-user").and_then(|v| v.to_str().ok()),
        Some("jane")
    );
    assert_eq!(
        seen[0].headers.get("impersonate-group").and_then(|v| v.to_str().ok()),
        Some("ops")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_failures_read_like_kubectl() {
    let (server, _dir, kubeconfig) = start().await;
    let run = kubectl_smolvm(&kubeconfig, &["exec", "broken", "--", "true"], b"").await;
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.stderr,
        "Error from server (Conflict): SmolVM shop/broken is not running (phase Failed): disk lost\n"
    );

    // A session refused before the upgrade reads as the one-shot refusal does.
    let run = kubectl_smolvm(&kubeconfig, &["exec", "broken", "-t", "--", "sh"], b"").await;
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr
            .ends_with("Error from server (Conflict): SmolVM shop/broken is not running (phase Failed): disk lost\n"),
        "{}",
        run.stderr
    );
    let run = kubectl_smolvm(&kubeconfig, &["exec", "web", "-t", "-e", "A=b", "--", "sh"], b"").await;
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("apply to one-shot commands"), "{}", run.stderr);

    let run = kubectl_smolvm(&kubeconfig, &["exec", "web", "-i", "--", "cat"], b"\xff\xfe").await;
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.starts_with("error: stdin is not UTF-8"), "{}", run.stderr);
    assert_eq!(
        server.seen().len(),
        2,
        "the two refused execs were sent; nothing is sent for local errors"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cp_copies_both_ways() {
    let (server, dir, kubeconfig) = start().await;
    let out = dir.path().join("out.bin");
    let out_arg = out.to_string_lossy().into_owned();
    let run = kubectl_smolvm(&kubeconfig, &["cp", "web:/var/a b", &out_arg], b"").await;
    assert_eq!((run.code, run.stderr.as_str()), (Some(0), ""));
    assert_eq!(std::fs::read(&out).expect("copied"), b"\x00bytes\xff");

    let run = kubectl_smolvm(&kubeconfig, &["cp", "web:/etc", "-"], b"").await;
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.stderr,
        "error: web:/etc is a directory in the SmolVM; cp copies single files\n"
    );

    let run = kubectl_smolvm(&kubeconfig, &["cp", &out_arg, "web:/tmp/", "--mode", "755"], b"").await;
    assert_eq!((run.code, run.stderr.as_str()), (Some(0), ""));
    let run = kubectl_smolvm(&kubeconfig, &["cp", "-", "web:/tmp/in.txt"], b"from stdin").await;
    assert_eq!((run.code, run.stderr.as_str()), (Some(0), ""));

    let seen = server.seen();
    let uris: Vec<&str> = seen.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(
        uris,
        [
            format!("{SUB}/web/files?path=/var/a%20b"),
            format!("{SUB}/web/files?path=/etc"),
            format!("{SUB}/web/files?path=/tmp/out.bin&mode=0755"),
            format!("{SUB}/web/files?path=/tmp/in.txt&mode=0644"),
        ]
    );
    assert_eq!(seen[2].body, b"\x00bytes\xff");
    assert_eq!(seen[3].body, b"from stdin");
    assert_eq!(
        seen[3].headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
        Some("application/octet-stream")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn start_stop_restart_patch_the_smolvm() {
    let (server, _dir, kubeconfig) = start().await;
    let run = kubectl_smolvm(&kubeconfig, &["start", "web"], b"").await;
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "smolvm.vm.smolvm.dev/web started (no change)\n"
    );
    let run = kubectl_smolvm(&kubeconfig, &["stop", "web"], b"").await;
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "smolvm.vm.smolvm.dev/web stopped\n"
    );
    let run = kubectl_smolvm(&kubeconfig, &["restart", "web"], b"").await;
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "smolvm.vm.smolvm.dev/web restart requested\n"
    );
    let run = kubectl_smolvm(&kubeconfig, &["restart", "idle"], b"").await;
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr
            .starts_with("error: SmolVM shop/idle is stopped (spec.running is false)"),
        "{}",
        run.stderr
    );
    let run = kubectl_smolvm(&kubeconfig, &["start", "gone"], b"").await;
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.starts_with("Error from server (NotFound): "),
        "{}",
        run.stderr
    );

    let patches: Vec<Seen> = server
        .seen()
        .into_iter()
        .filter(|s| s.method == Method::PATCH)
        .collect();
    assert_eq!(patches.len(), 2, "no patch for no change, none for a stopped SmolVM");
    assert_eq!(patches[0].body, br#"{"spec":{"running":false}}"#);
    assert_eq!(
        patches[0]
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("application/merge-patch+json")
    );
    let restart: Value = serde_json::from_slice(&patches[1].body).expect("json");
    let at = restart
        .pointer("/metadata/annotations/vm.smolvm.dev~1restart-requested-at")
        .and_then(Value::as_str);
    assert!(at.is_some_and(|at| at.len() == 20 && at.ends_with('Z')), "{restart}");
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_errors_fail_with_one() {
    let (_server, _dir, kubeconfig) = start().await;
    let run = kubectl_smolvm(&kubeconfig, &["cp", "a", "b"], b"").await;
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.stderr,
        "error: cp: both SRC and DST are local; one of them must be a SmolVM path, NAME:/abs/path\n"
    );
    let run = kubectl_smolvm(&kubeconfig, &["logs", "Bad_Name"], b"").await;
    assert_eq!(run.code, Some(1));
    let run = kubectl_smolvm(&kubeconfig, &["frobnicate"], b"").await;
    assert_eq!(run.code, Some(1));
    let run = kubectl_smolvm(&kubeconfig, &["--help"], b"").await;
    assert_eq!(run.code, Some(0));
    assert!(String::from_utf8_lossy(&run.stdout).contains("Examples:"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_without_a_terminal_streams_output_and_ends_with_the_exit_code() {
    let (server, _dir, kubeconfig) = start().await;
    // -t with stdin not a terminal and no -i: a session over the channel protocol, no terminal.
    let run = kubectl_smolvm(&kubeconfig, &["exec", "web", "-t", "--", "play", "a b"], b"").await;
    assert_eq!(run.code, Some(3), "the command's exit code; stderr: {}", run.stderr);
    assert_eq!(run.stdout, b"out\x00\xff\n", "stdout byte for byte");
    assert!(run.stderr.starts_with("Unable to use a TTY"), "{}", run.stderr);
    assert!(run.stderr.ends_with("err\n"), "stderr apart: {}", run.stderr);
    let seen = server.seen();
    let request = seen.last().expect("a request");
    assert_eq!(request.method, Method::GET);
    let uri: Uri = request.uri.parse().expect("uri");
    assert_eq!(uri.path(), format!("{SUB}/web/exec"));
    let mut query: Vec<(String, String)> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    query.sort();
    let want = [
        ("command", "a+b"),
        ("command", "play"),
        ("stderr", "true"),
        ("stdout", "true"),
    ];
    assert_eq!(
        query,
        want.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>(),
        "the command in order, no stdin and no terminal asked for"
    );
    let protocols = request
        .headers
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(protocols.contains("v5.channel.k8s.io"), "{protocols}");

    // -it with stdin not a terminal: one-shot, stdin read to its end.
    let run = kubectl_smolvm(&kubeconfig, &["exec", "web", "-it", "--", "cat"], b"piped").await;
    assert_eq!(run.code, Some(7), "{}", run.stderr);
    let seen = server.seen();
    let request = seen.last().expect("a request");
    assert_eq!(
        (request.method.clone(), request.uri.as_str()),
        (Method::POST, format!("{SUB}/web/exec").as_str())
    );
    let sent: Value = serde_json::from_slice(&request.body).expect("JSON");
    assert_eq!(sent["stdin"], "piped");
}

/// `exec -it` on a real pseudo-terminal (util-linux `script` provides one): the session asks
/// for a terminal, sends the terminal's size, puts the terminal in raw mode and restores it,
/// and ends with the remote exit code.
#[tokio::test(flavor = "multi_thread")]
async fn a_terminal_session_sends_its_size_and_restores_the_terminal() {
    if std::process::Command::new("script").arg("--version").output().is_err() {
        println!("skipped: no `script` (util-linux) to give the plugin a pseudo-terminal");
        return;
    }
    let (server, _dir, kubeconfig) = start().await;
    let shell = format!(
        "stty rows 40 cols 120; before=$(stty -g); '{}' --kubeconfig '{}' exec term -it -- sh; code=$?; \
         [ \"$before\" = \"$(stty -g)\" ] && echo terminal-restored; echo exit=$code",
        env!("CARGO_BIN_EXE_kubectl-smolvm"),
        kubeconfig.display()
    );
    let out = tokio::process::Command::new("script")
        .args(["-qec", &shell, "/dev/null"])
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("size 120x40"),
        "the terminal's size reaches the session: {text}"
    );
    assert!(text.contains("terminal-restored"), "raw mode undone: {text}");
    assert!(text.contains("exit=5"), "the remote exit code: {text}");
    let seen = server.seen();
    let request = seen.last().expect("a request");
    let query = request.uri.split_once('?').map(|(_, q)| q).unwrap_or_default();
    for part in ["stdin=true", "stdout=true", "tty=true", "command=sh"] {
        assert!(query.split('&').any(|p| p == part), "{part} in {query}");
    }
    assert!(!query.contains("stderr"), "a terminal merges stderr: {query}");
}

/// The requests of `method` to the SmolVMs collection itself (creates, lists, watches).
fn collection_requests(server: &Server, method: Method) -> Vec<Seen> {
    server
        .seen()
        .into_iter()
        .filter(|s| s.method == method && s.uri.split('?').next() == Some(CRD))
        .collect()
}

/// The column names of a printed table.
fn header(stdout: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(stdout);
    text.lines()
        .next()
        .map(|line| line.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The rows of a printed table (the header left out), each split on its runs of spaces.
fn rows(stdout: &[u8]) -> Vec<Vec<String>> {
    let text = String::from_utf8_lossy(stdout);
    text.lines()
        .skip(1)
        .map(|line| {
            line.split("   ")
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn branch_refuses_a_source_that_is_not_branchable_before_creating_anything() {
    let (server, _dir, kubeconfig) = start().await;
    let run = kubectl_smolvm(&kubeconfig, &["branch", "web", "--count", "3"], b"").await;
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.stderr,
        "error: SmolVM shop/web is not branchable (spec.branchable is not true): branches are made only of a SmolVM \
         created with spec.branchable: true, which cannot be set later; create a SmolVM with it and branch that\n"
    );
    assert!(run.stdout.is_empty());

    let run = kubectl_smolvm(&kubeconfig, &["branch", "gone"], b"").await;
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.starts_with("Error from server (NotFound): "),
        "{}",
        run.stderr
    );
    let uris: Vec<String> = server.seen().into_iter().map(|s| s.uri).collect();
    assert_eq!(
        uris,
        [format!("{CRD}/web"), format!("{CRD}/gone")],
        "the sources were read, nothing was created"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn branch_refuses_bad_flags_before_any_request() {
    let (server, _dir, kubeconfig) = start().await;
    let cases: [(&[&str], &str); 6] = [
        (&["branch", "base", "--env", "=x"], "the name before '=' is empty"),
        (&["branch", "base", "--count", "2", "--env", "NOEQUALS"], "no '='"),
        (
            &["branch", "base", "--env", "A=1", "--env", "A=2"],
            "error: --env A is given twice: give each name once\n",
        ),
        (&["branch", "base", "--count", "101"], "from 1 to 100"),
        (&["branch", "base", "--name", "Worker"], "invalid --name \"Worker\""),
        (&["branch", "base", "--timeout", "0"], "must be more than zero"),
    ];
    for (args, want) in cases {
        let run = kubectl_smolvm(&kubeconfig, args, b"").await;
        assert_eq!(run.code, Some(1), "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(want), "{args:?}: {}", run.stderr);
    }
    assert!(server.seen().is_empty(), "nothing was sent: {:?}", server.seen());
}

#[tokio::test(flavor = "multi_thread")]
async fn branch_creates_the_count_and_waits_until_they_run() {
    let (server, _dir, kubeconfig) = start().await;
    let args = [
        "branch",
        "base",
        "--count",
        "3",
        "--name",
        "worker",
        "-e",
        "ROLE=worker",
        "--env",
        "MODE=a=b",
    ];
    let run = kubectl_smolvm(&kubeconfig, &args, b"").await;
    assert_eq!((run.code, run.stderr.as_str()), (Some(0), ""));

    let creates = collection_requests(&server, Method::POST);
    assert_eq!(creates.len(), 3, "{creates:?}");
    for create in &creates {
        let body: Value = serde_json::from_slice(&create.body).expect("JSON");
        assert_eq!(
            body,
            json!({
                "apiVersion": "vm.smolvm.dev/v1alpha1",
                "kind": "SmolVM",
                "metadata": {"generateName": "worker-"},
                "spec": {
                    "branchOf": {"name": "base"},
                    "env": [{"name": "ROLE", "value": "worker"}, {"name": "MODE", "value": "a=b"}]
                }
            })
        );
    }

    let text = String::from_utf8_lossy(&run.stdout).into_owned();
    assert_eq!(header(&run.stdout), ["NAME", "PHASE", "TOOK"], "{text}");
    let rows = rows(&run.stdout);
    let mut names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    names.sort();
    assert_eq!(names, ["worker-00000", "worker-00001", "worker-00002"], "{text}");
    for row in &rows {
        assert_eq!((row.len(), row[1].as_str()), (3, "Running"), "{text}");
        let millis = row[2].strip_suffix(" ms").and_then(|n| n.parse::<u64>().ok());
        assert!(millis.is_some_and(|ms| ms < 10_000), "TOOK in ms: {text}");
    }

    // Listed, then watched from the list's version: the Running came in a watch event.
    let lists = collection_requests(&server, Method::GET);
    assert_eq!(lists.len(), 2, "{lists:?}");
    let query = |s: &Seen| s.uri.split_once('?').map(|(_, q)| q.to_string()).unwrap_or_default();
    assert_eq!(
        query_value(&query(&lists[0]), "labelSelector").as_deref(),
        Some("vm.smolvm.dev/branch-of=base")
    );
    assert_eq!(query_value(&query(&lists[0]), "watch"), None);
    assert_eq!(query_value(&query(&lists[1]), "watch").as_deref(), Some("true"));
    assert_eq!(
        query_value(&query(&lists[1]), "resourceVersion").as_deref(),
        Some("100")
    );
    assert!(
        collection_requests(&server, Method::DELETE).is_empty(),
        "nothing is deleted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_branch_fails_the_command_with_its_reason() {
    let (server, _dir, kubeconfig) = start().await;
    let run = kubectl_smolvm(&kubeconfig, &["branch", "flaky", "--count", "2"], b"").await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(
        run.stderr,
        "error: 1 of 2 branches of shop/flaky did not run (1 Failed or deleted); the table says why. The SmolVMs \
         created are left in place: kubectl smolvm get-branches flaky lists them\n"
    );
    let text = String::from_utf8_lossy(&run.stdout).into_owned();
    assert_eq!(
        header(&run.stdout),
        ["NAME", "PHASE", "TOOK", "REASON", "MESSAGE"],
        "{text}"
    );
    let mut rows = rows(&run.stdout);
    rows.sort();
    assert_eq!(rows[0][..2], ["flaky-00000", "Failed"], "{text}");
    assert_eq!(
        rows[0][2..],
        [
            "-",
            "CreateFailed",
            "smolvm could not branch svm-uid-src: out of memory on node-a"
        ],
        "{text}"
    );
    assert_eq!(rows[1][..2], ["flaky-00001", "Running"], "{text}");
    assert!(rows[1][2].ends_with(" ms"), "{text}");
    assert_eq!(collection_requests(&server, Method::POST).len(), 2);
    assert!(
        server.seen().iter().all(|s| s.method != Method::DELETE),
        "nothing is deleted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_branch_that_does_not_run_in_time_fails_the_command() {
    let (server, _dir, kubeconfig) = start().await;
    let began = std::time::Instant::now();
    let run = kubectl_smolvm(&kubeconfig, &["branch", "stuck", "--timeout", "300ms"], b"").await;
    assert!(
        began.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(
        run.stderr,
        "note: SmolVM shop/stuck is not running (phase Stopped): its branches wait (BranchPending) until it runs\n\
         error: 1 of 1 branch of shop/stuck did not run (1 not Running within 300ms (--timeout)); the table says \
         why. The SmolVMs created are left in place: kubectl smolvm get-branches stuck lists them\n"
    );
    assert_eq!(
        rows(&run.stdout),
        [[
            "stuck-00000",
            "Pending",
            "-",
            "BranchPending",
            "waiting for its source shop/stuck to run on node-a"
        ]]
    );
    assert_eq!(collection_requests(&server, Method::POST).len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn branch_lists_again_where_it_may_not_watch() {
    let (server, _dir, kubeconfig) = start().await;
    let args = ["branch", "nowatch", "--count", "2", "--poll-interval", "50ms"];
    let run = kubectl_smolvm(&kubeconfig, &args, b"").await;
    assert_eq!((run.code, run.stderr.as_str()), (Some(0), ""));
    let rows = rows(&run.stdout);
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r[1] == "Running"), "{rows:?}");
    let gets = collection_requests(&server, Method::GET);
    let watches = gets.iter().filter(|s| s.uri.contains("watch=true")).count();
    assert_eq!(watches, 1, "refused once, not asked again: {gets:?}");
    assert_eq!(gets.len() - watches, 2, "the second list saw them Running: {gets:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn get_branches_prints_a_table_sorted_by_name() {
    let (server, _dir, kubeconfig) = start().await;
    let run = kubectl_smolvm(&kubeconfig, &["get-branches", "fleet"], b"").await;
    assert_eq!((run.code, run.stderr.as_str()), (Some(0), ""));
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "NAME          PHASE     NODE     READY           AGE\n\
         fleet-aaaaa   Pending   node-b   BranchPending   30m\n\
         fleet-zzzzz   Running   node-a   Running         3h\n"
    );
    let seen = server.seen();
    let query = seen[0].uri.split_once('?').map(|(_, q)| q).unwrap_or_default();
    assert_eq!(
        query_value(query, "labelSelector").as_deref(),
        Some("vm.smolvm.dev/branch-of=fleet")
    );

    let run = kubectl_smolvm(&kubeconfig, &["get-branches", "lonely"], b"").await;
    assert_eq!(run.code, Some(0));
    assert!(run.stdout.is_empty());
    assert_eq!(run.stderr, "No branches of lonely in namespace shop.\n");

    let run = kubectl_smolvm(&kubeconfig, &["get-branches", "secret"], b"").await;
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.stderr,
        "Error from server (Forbidden): smolvms.vm.smolvm.dev is forbidden: User \"jane\" cannot list resource \
         \"smolvms\" in API group \"vm.smolvm.dev\" in the namespace \"shop\"\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_creates_read_like_kubectl() {
    let (server, _dir, kubeconfig) = start().await;
    // Every create refused: the refusal, as kubectl prints it.
    let run = kubectl_smolvm(&kubeconfig, &["branch", "readonly", "--count", "2"], b"").await;
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.stderr,
        "Error from server (Forbidden): smolvms.vm.smolvm.dev is forbidden: User \"jane\" cannot create resource \
         \"smolvms\" in API group \"vm.smolvm.dev\" in the namespace \"shop\"\n"
    );
    assert!(run.stdout.is_empty());

    // Some refused: the others are waited for and shown; the refusal is told, and the exit is 1.
    let run = kubectl_smolvm(&kubeconfig, &["branch", "quota", "--count", "3"], b"").await;
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.stderr,
        "error: 1 of 3 branches of shop/quota did not run (1 not created: Error from server (Forbidden): \
         smolvms.vm.smolvm.dev is forbidden: exceeded quota: shop-vms, requested: count/smolvms.vm.smolvm.dev=1, \
         used: count/smolvms.vm.smolvm.dev=2, limited: count/smolvms.vm.smolvm.dev=2). The SmolVMs created are left \
         in place: kubectl smolvm get-branches quota lists them\n"
    );
    let rows = rows(&run.stdout);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r[1] == "Running"), "{rows:?}");
    assert_eq!(collection_requests(&server, Method::POST).len(), 5);
}
