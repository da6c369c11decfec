//! Interactive exec on the node API: Kubernetes' channel protocol over a real WebSocket (the
//! agent's real router, served on 127.0.0.1), bridged to `smolvm_testkit::runtime_double`'s
//! `ScriptedRuntime`, a TEST DOUBLE of the runtime. No guest boots on these machines, so a
//! command cannot really run here (the 409 and the refusals against real smolvm are in
//! `node_api.rs`). The double echoes stdin to stdout, answers a resize with the size, writes
//! `err` to stderr, and exits with N on `exit N`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use smolvm_api::channel;
use smolvm_runtime::metrics::Metrics;
use smolvm_runtime::nodeapi::auth::TokenAuth;
use smolvm_runtime::nodeapi::stream::StreamLimits;
use smolvm_runtime::nodeapi::{Identity, NodeApiState, router};
use smolvm_testkit::runtime_double::ScriptedRuntime;
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest};

const TOKEN: &str = "stream-test-token";

async fn serve(runtime: Arc<ScriptedRuntime>) -> std::net::SocketAddr {
    serve_with(runtime, StreamLimits::default()).await
}

async fn serve_with(runtime: Arc<ScriptedRuntime>, limits: StreamLimits) -> std::net::SocketAddr {
    let state = NodeApiState::new(
        runtime,
        TokenAuth::fixed(TOKEN).expect("token"),
        Identity::new("node-a"),
        Arc::new(Metrics::default()),
        None,
    )
    .with_stream_limits(limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    addr
}

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Opens a session; `Err` is the answer before the upgrade: its status and JSON body.
async fn open(
    addr: std::net::SocketAddr,
    path: &str,
    protocols: Option<&str>,
    token: Option<&str>,
) -> Result<(Socket, Option<String>), (u16, serde_json::Value)> {
    let mut request = format!("ws://{addr}{path}").into_client_request().expect("request");
    if let Some(protocols) = protocols {
        request
            .headers_mut()
            .insert("sec-websocket-protocol", protocols.parse().expect("header"));
    }
    if let Some(token) = token {
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().expect("header"));
    }
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    match tokio_tungstenite::client_async(request, tcp).await {
        Ok((socket, response)) => {
            let protocol = response
                .headers()
                .get("sec-websocket-protocol")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            Ok((socket, protocol))
        }
        Err(tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().unwrap_or_default();
            Err((
                response.status().as_u16(),
                serde_json::from_slice(body).unwrap_or(serde_json::Value::Null),
            ))
        }
        Err(other) => panic!("{path}: {other}"),
    }
}

async fn send(socket: &mut Socket, channel: u8, data: &[u8]) {
    socket
        .send(Message::binary(channel::frame(channel, data)))
        .await
        .expect("send");
}

/// The next frame from the server: its channel and data (`None`: the socket closed).
async fn next(socket: &mut Socket) -> Option<(u8, Vec<u8>)> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("the server answers within 10 s");
        match message {
            Some(Ok(Message::Binary(bytes))) => {
                let (channel, data) = bytes.split_first().expect("a frame has a channel");
                return Some((*channel, data.to_vec()));
            }
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => {}
        }
    }
}

async fn final_status(socket: &mut Socket) -> serde_json::Value {
    let (channel, data) = next(socket).await.expect("a status frame");
    assert_eq!(channel, channel::STATUS, "{}", String::from_utf8_lossy(&data));
    let status = serde_json::from_slice(&data).expect("status JSON");
    assert!(next(socket).await.is_none(), "the server closes after the status");
    status
}

const PROTOCOLS: &str = "v5.channel.k8s.io, v4.channel.k8s.io";

#[tokio::test]
async fn a_terminal_session_echoes_resizes_and_exits() {
    let runtime = Arc::new(ScriptedRuntime::default());
    let addr = serve(runtime.clone()).await;
    let path = "/v1/machines/running/exec?command=play&command=-x&stdin=true&stdout=true&tty=true";
    let (mut socket, protocol) = open(addr, path, Some(PROTOCOLS), Some(TOKEN)).await.expect("upgrade");
    assert_eq!(protocol.as_deref(), Some("v5.channel.k8s.io"), "v5 preferred");
    send(&mut socket, channel::RESIZE, br#"{"Width":120,"Height":40}"#).await;
    assert_eq!(
        next(&mut socket).await,
        Some((channel::STDOUT, b"size 120x40".to_vec()))
    );
    send(&mut socket, channel::STDIN, b"hello \x00\xff bytes").await;
    assert_eq!(
        next(&mut socket).await,
        Some((channel::STDOUT, b"hello \x00\xff bytes".to_vec())),
        "stdin and stdout byte for byte"
    );
    send(&mut socket, channel::STDIN, b"exit 0").await;
    let status = final_status(&mut socket).await;
    assert_eq!(status["status"], "Success", "{status}");
    assert_eq!(
        runtime.commands.lock().map(|c| c.clone()).unwrap_or_default(),
        [["play", "-x"]],
        "the command reaches the runtime"
    );
    assert_eq!(channel::exit_code_of(&status), Some(0));
}

#[tokio::test]
async fn without_a_terminal_stderr_is_apart_and_the_exit_code_travels() {
    let runtime = Arc::new(ScriptedRuntime::default());
    let addr = serve(runtime.clone()).await;
    // Only v4 offered (older clients): the same framing, no close messages.
    let path = "/v1/machines/running/exec?command=play&stdin=true&stdout=true&stderr=true";
    let (mut socket, protocol) = open(addr, path, Some("v4.channel.k8s.io"), Some(TOKEN))
        .await
        .expect("upgrade");
    assert_eq!(protocol.as_deref(), Some("v4.channel.k8s.io"));
    send(&mut socket, channel::STDIN, b"err").await;
    assert_eq!(next(&mut socket).await, Some((channel::STDERR, b"err".to_vec())));
    // A resize without a terminal is not passed on; the v5 end of stdin needs no action.
    send(&mut socket, channel::RESIZE, br#"{"Width":1,"Height":1}"#).await;
    send(&mut socket, channel::CLOSE, &[channel::STDIN]).await;
    send(&mut socket, channel::STDIN, b"exit 3").await;
    let status = final_status(&mut socket).await;
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(channel::exit_code_of(&status), Some(3));
}

#[tokio::test]
async fn the_client_leaving_ends_the_command_and_bad_frames_end_the_session() {
    let runtime = Arc::new(ScriptedRuntime::default());
    let addr = serve(runtime.clone()).await;
    let path = "/v1/machines/running/exec?command=play&stdin=true&stdout=true&tty=true";
    let (mut socket, _) = open(addr, path, Some(PROTOCOLS), Some(TOKEN)).await.expect("upgrade");
    send(&mut socket, channel::STDIN, b"x").await;
    assert_eq!(next(&mut socket).await, Some((channel::STDOUT, b"x".to_vec())));
    socket.close(None).await.expect("close");
    let mut waited = 0;
    while !runtime.input_ended.load(Ordering::SeqCst) && waited < 100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    assert!(
        runtime.input_ended.load(Ordering::SeqCst),
        "the runtime's session (and its command) ends when the client goes"
    );

    for (what, message) in [
        ("a text frame", Message::text("ls")),
        (
            "a frame on stdout",
            Message::binary(channel::frame(channel::STDOUT, b"x")),
        ),
        ("a bad resize", Message::binary(channel::frame(channel::RESIZE, b"{}"))),
    ] {
        let (mut socket, _) = open(addr, path, Some(PROTOCOLS), Some(TOKEN)).await.expect("upgrade");
        socket.send(message).await.expect("send");
        let status = final_status(&mut socket).await;
        assert_eq!(status["reason"], "InternalError", "{what}: {status}");
        assert!(
            status["message"].as_str().is_some_and(|m| m.contains("protocol error")),
            "{what}: {status}"
        );
        assert_eq!(channel::exit_code_of(&status), None, "{what}");
    }
}

#[tokio::test]
async fn refusals_come_before_the_upgrade_as_json() {
    let runtime = Arc::new(ScriptedRuntime::default());
    let addr = serve(runtime.clone()).await;
    let ok = "command=play&stdin=true&tty=true";
    let cases = [
        (
            "stopped machine",
            format!("/v1/machines/stopped/exec?{ok}"),
            Some(PROTOCOLS),
            Some(TOKEN),
            409,
            "MachineNotRunning",
        ),
        (
            "unknown machine",
            format!("/v1/machines/nope/exec?{ok}"),
            Some(PROTOCOLS),
            Some(TOKEN),
            404,
            "MachineNotFound",
        ),
        (
            "no subprotocol",
            format!("/v1/machines/running/exec?{ok}"),
            None,
            Some(TOKEN),
            400,
            "InvalidRequest",
        ),
        (
            "another subprotocol",
            format!("/v1/machines/running/exec?{ok}"),
            Some("channel.k8s.io"),
            Some(TOKEN),
            400,
            "InvalidRequest",
        ),
        (
            "no command",
            "/v1/machines/running/exec?tty=true".to_string(),
            Some(PROTOCOLS),
            Some(TOKEN),
            400,
            "InvalidRequest",
        ),
        (
            "tty with stderr",
            format!("/v1/machines/running/exec?{ok}&stderr=true"),
            Some(PROTOCOLS),
            Some(TOKEN),
            400,
            "InvalidRequest",
        ),
        (
            "no token",
            format!("/v1/machines/running/exec?{ok}"),
            Some(PROTOCOLS),
            None,
            401,
            "Unauthenticated",
        ),
    ];
    for (what, path, protocols, token, status, code) in cases {
        let (got, body) = match open(addr, &path, protocols, token).await {
            Ok(_) => panic!("{what}: upgraded"),
            Err(refused) => refused,
        };
        assert_eq!((got, body["code"].as_str()), (status, Some(code)), "{what}: {body}");
        println!("{what}: {status} {}", body["message"]);
    }
    assert_eq!(
        runtime.opened.load(Ordering::SeqCst),
        0,
        "no refused request reaches the runtime (a stopped machine is never booted)"
    );

    // A plain GET (no upgrade) is a 400 saying what to do.
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::get(format!("/v1/machines/running/exec?{ok}"))
        .header("host", "node")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(http_body_util::Empty::<Bytes>::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("answer");
    assert_eq!(response.status(), 400);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("body")
        .to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("WebSocket upgrade")),
        "{body}"
    );
}

/// Generous bound on the waits below, only so that a broken test fails instead of hanging.
const WAIT: Duration = Duration::from_secs(30);

type Reader = futures::stream::SplitStream<Socket>;

/// The next data frame on the read half (`None`: the socket closed).
async fn next_on(stream: &mut Reader) -> Option<(u8, Vec<u8>)> {
    loop {
        let message = tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("the stream moves (no stall)");
        match message {
            Some(Ok(Message::Binary(bytes))) => {
                let (channel, data) = bytes.split_first().expect("a frame has a channel");
                return Some((*channel, data.to_vec()));
            }
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_megabytes_through_a_slow_reader_while_input_keeps_coming() {
    const TOTAL: usize = 10 << 20;
    const CHUNK: usize = 4 << 10;
    let runtime = Arc::new(ScriptedRuntime::default());
    let addr = serve(runtime.clone()).await;
    let path = "/v1/machines/running/exec?command=cat&stdin=true&stdout=true&stderr=true";
    let (socket, _) = open(addr, path, Some(PROTOCOLS), Some(TOKEN)).await.expect("upgrade");
    let (mut sink, mut stream) = socket.split();
    let started = std::time::Instant::now();
    // A writer that never waits for the output, and a reader that dawdles after every frame.
    let writer = tokio::spawn(async move {
        let chunk = vec![b'a'; CHUNK];
        for _ in 0..TOTAL / CHUNK {
            sink.send(Message::binary(channel::frame(channel::STDIN, &chunk)))
                .await
                .expect("input is taken");
        }
        sink
    });
    let mut received = 0;
    let mut frames = 0u64;
    while received < TOTAL {
        let (channel, data) = next_on(&mut stream).await.expect("output until all came back");
        assert_eq!(channel, channel::STDOUT);
        assert!(data.iter().all(|&b| b == b'a'), "the bytes are the ones sent");
        received += data.len();
        frames += 1;
        if frames.is_multiple_of(8) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    assert_eq!(received, TOTAL, "every byte came back once");
    let mut sink = tokio::time::timeout(WAIT, writer)
        .await
        .expect("the writer finishes")
        .expect("join");
    println!(
        "{} MiB echoed through a slow reader while input kept coming: {:?}",
        TOTAL >> 20,
        started.elapsed()
    );
    sink.send(Message::binary(channel::frame(channel::STDIN, b"exit 0")))
        .await
        .expect("send");
    let (channel, data) = next_on(&mut stream).await.expect("the status");
    assert_eq!(channel, channel::STATUS, "{}", String::from_utf8_lossy(&data));
    let status: serde_json::Value = serde_json::from_slice(&data).expect("status JSON");
    assert_eq!(status["status"], "Success", "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_the_stream_is_jammed_ends_the_command() {
    let runtime = Arc::new(ScriptedRuntime::default());
    let addr = serve(runtime.clone()).await;
    let path = "/v1/machines/running/exec?command=cat&stdin=true&stdout=true&tty=true";
    let (socket, _) = open(addr, path, Some(PROTOCOLS), Some(TOKEN)).await.expect("upgrade");
    let (mut sink, stream) = socket.split();
    // Input the client never reads the echo of, until nothing more is taken: every buffer
    // between the client and the command is full.
    let chunk = vec![b'b'; 4 << 10];
    let mut taken = 0usize;
    loop {
        let frame = Message::binary(channel::frame(channel::STDIN, &chunk));
        match tokio::time::timeout(Duration::from_secs(1), sink.send(frame)).await {
            Ok(Ok(())) => taken += 1,
            Ok(Err(error)) => panic!("the server refused input: {error}"),
            Err(_) => break,
        }
        assert!(taken < 100_000, "the stream never filled");
    }
    println!("jammed after {} KiB of input", taken * 4);
    // The client goes without a word (its connection closes with unread data).
    drop((sink, stream));
    let mut waited = Duration::ZERO;
    while !runtime.input_ended.load(Ordering::SeqCst) && waited < WAIT {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    assert!(
        runtime.input_ended.load(Ordering::SeqCst),
        "the runtime's session (and its command) ends when the client goes"
    );
}

#[tokio::test]
async fn streams_beyond_the_caps_are_answered_429_too_many_streams() {
    let runtime = Arc::new(ScriptedRuntime::default());
    let addr = serve_with(
        runtime.clone(),
        StreamLimits {
            per_machine: 2,
            per_node: 3,
        },
    )
    .await;
    let path = |machine: &str| format!("/v1/machines/{machine}/exec?command=sh&stdin=true&stdout=true&tty=true");
    let refused = |answer: Result<(Socket, Option<String>), (u16, serde_json::Value)>| match answer {
        Ok(_) => panic!("upgraded beyond the cap"),
        Err(refused) => refused,
    };
    let (first, _) = open(addr, &path("running"), Some(PROTOCOLS), Some(TOKEN))
        .await
        .expect("first");
    let (_second, _) = open(addr, &path("running"), Some(PROTOCOLS), Some(TOKEN))
        .await
        .expect("second");

    let (status, body) = refused(open(addr, &path("running"), Some(PROTOCOLS), Some(TOKEN)).await);
    assert_eq!((status, body["code"].as_str()), (429, Some("TooManyStreams")), "{body}");
    assert_eq!(body["details"]["scope"], "machine", "{body}");
    assert_eq!(body["details"]["limit"], 2, "{body}");

    // One-shot exec and a followed log count against the same caps.
    for (method, route, body) in [
        ("POST", "/v1/machines/running/exec", r#"{"command":["true"]}"#),
        ("GET", "/v1/machines/running/logs?follow=true", ""),
    ] {
        let (status, answer) = call(addr, method, route, body).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (429, Some("TooManyStreams")),
            "{method} {route}: {answer}"
        );
    }

    let (_third, _) = open(addr, &path("running-2"), Some(PROTOCOLS), Some(TOKEN))
        .await
        .expect("another machine");
    let (status, body) = refused(open(addr, &path("running-2"), Some(PROTOCOLS), Some(TOKEN)).await);
    assert_eq!((status, body["code"].as_str()), (429, Some("TooManyStreams")), "{body}");
    assert_eq!(body["details"]["scope"], "node", "{body}");
    assert_eq!(
        runtime.opened.load(Ordering::SeqCst),
        3,
        "no refused stream reaches the runtime"
    );

    // A session that ends gives its slot back.
    drop(first);
    let mut reopened = false;
    for _ in 0..300 {
        if open(addr, &path("running-2"), Some(PROTOCOLS), Some(TOKEN))
            .await
            .is_ok()
        {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reopened, "a slot freed by a session that ended is taken again");
}

/// A plain HTTP call with the token: its status and JSON body.
async fn call(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "node")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let response = sender.send_request(request).await.expect("answer");
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").cloned();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("body")
        .to_bytes();
    if status == 429 {
        assert!(retry_after.is_some(), "a 429 says when to retry");
    }
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}
