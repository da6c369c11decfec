//! `SmolvmClient::exec_interactive` against a TEST DOUBLE of smolvm 1.32.2's documented
//! interactive exec (no guest boots here, so the real smolvm cannot run a command on this
//! machine).
//!
//! The double is an axum server on a Unix socket in a temporary directory, serving
//! `GET /api/v1/machines/{name}/exec/interactive` with smolvm's framing:
//!
//! - the query carries the program as `cmd`, each argument as one repeated `arg` (in order) and
//!   `tty` (`true` when absent); the double records what it parsed;
//! - client to server: binary frames are stdin, the text frame `{"type":"resize","cols":N,"rows":N}`
//!   is a resize;
//! - server to client: binary frames are output; without a terminal stderr is the text frame
//!   `{"type":"stderr","data":"..."}`; the end is the text frame `{"type":"exit","code":N}`
//!   followed by a Close.
//!
//! The double's "command": it echoes each stdin frame; answers a resize with `size COLSxROWS`;
//! writes `err` to stderr on stdin `err`; exits with N on stdin `exit N`. Machine `missing` is
//! answered 404 and `busy` 409 (smolvm's JSON error bodies) before any upgrade; machine `vanish`
//! upgrades and then closes the WebSocket without an exit message; `vanish-abruptly` upgrades
//! and drops the connection without even a Close frame. The double records how each session's
//! socket ended, so a test can see that dropping the session's input closes the connection
//! (which is what makes smolvm kill the command).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use smolvm_api::channel::Ending;
use smolvm_runtime::vmm::{
    InteractiveRequest, Session, SessionInput, SessionOutput, SmolvmClient, SmolvmConfig, Vmm, VmmError,
};
use tokio::sync::watch;

/// Generous limit on each wait, only so that a broken test fails instead of hanging.
const WAIT: Duration = Duration::from_secs(20);

/// One request's query as the double parsed it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    machine: String,
    cmd: Option<String>,
    args: Vec<String>,
    tty: bool,
}

/// How a session's WebSocket ended, as the double saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SocketEnd {
    /// The client closed it (a Close frame or the connection going) while the command ran.
    ClosedByClient,
    /// The command exited: the double sent the exit message and its Close.
    AfterExit,
    /// The double went away without an exit message (`vanish`, `vanish-abruptly`).
    Vanished,
}

/// What the double shares with its handlers.
struct Recorder {
    seen: Mutex<Vec<Seen>>,
    ended: watch::Sender<Option<SocketEnd>>,
}

/// TEST DOUBLE of smolvm 1.32.2's documented interactive exec (no guest boots here), served on
/// a Unix socket in its own temporary directory; stops when dropped.
struct Double {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    recorder: Arc<Recorder>,
    server: tokio::task::JoinHandle<()>,
}

impl Double {
    async fn start() -> Double {
        let dir = tempfile::Builder::new()
            .prefix("smolvm-interactive-")
            .tempdir()
            .expect("temp dir");
        let socket = dir.path().join("smolvm.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind the double's socket");
        let recorder = Arc::new(Recorder {
            seen: Mutex::new(Vec::new()),
            ended: watch::channel(None).0,
        });
        let app = Router::new()
            .route("/api/v1/machines/{name}/exec/interactive", get(interactive))
            .with_state(recorder.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("the double serves");
        });
        Double {
            _dir: dir,
            socket,
            recorder,
            server,
        }
    }

    fn client(&self) -> SmolvmClient {
        SmolvmClient::new(SmolvmConfig::new(&self.socket))
    }

    fn seen(&self) -> Vec<Seen> {
        self.recorder.seen.lock().expect("recorder lock").clone()
    }

    /// Waits until the double's session socket has ended, and says how.
    async fn socket_end(&self) -> SocketEnd {
        let mut ended = self.recorder.ended.subscribe();
        let end = tokio::time::timeout(WAIT, ended.wait_for(Option::is_some))
            .await
            .expect("the double's socket ends in time")
            .expect("the recorder lives");
        end.expect("an end was recorded")
    }
}

impl Drop for Double {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The double's handler: refusals before the upgrade, then the scripted command.
async fn interactive(
    State(recorder): State<Arc<Recorder>>,
    Path(machine): Path<String>,
    RawQuery(query): RawQuery,
    ws: WebSocketUpgrade,
) -> Response {
    let mut seen = Seen {
        machine: machine.clone(),
        cmd: None,
        args: Vec::new(),
        tty: true,
    };
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "cmd" => seen.cmd = Some(value.into_owned()),
            "arg" => seen.args.push(value.into_owned()),
            "tty" => seen.tty = value != "false",
            _ => {}
        }
    }
    let tty = seen.tty;
    recorder.seen.lock().expect("recorder lock").push(seen);
    match machine.as_str() {
        "missing" => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({"error": "machine not found", "code": "NOT_FOUND"})),
        )
            .into_response(),
        "busy" => (
            StatusCode::CONFLICT,
            axum::Json(serde_json::json!({"error": "machine is stopped", "code": "CONFLICT"})),
        )
            .into_response(),
        _ => ws.on_upgrade(move |socket| run(socket, machine, tty, recorder)),
    }
}

/// The scripted command on an upgraded socket; records how the socket ended.
async fn run(mut socket: WebSocket, machine: String, tty: bool, recorder: Arc<Recorder>) {
    match machine.as_str() {
        "vanish" => {
            let _ = socket.send(Message::Close(None)).await;
            // Let the client answer the close handshake; whatever it sends is ignored.
            while let Some(Ok(_)) = socket.recv().await {}
            recorder.ended.send_replace(Some(SocketEnd::Vanished));
            return;
        }
        "vanish-abruptly" => {
            drop(socket);
            recorder.ended.send_replace(Some(SocketEnd::Vanished));
            return;
        }
        _ => {}
    }
    let mut exited = false;
    while let Some(Ok(message)) = socket.recv().await {
        let replies = match message {
            Message::Binary(stdin) if stdin.as_ref() == b"err" => {
                if tty {
                    vec![Message::Binary(stdin)]
                } else {
                    vec![Message::text(
                        serde_json::json!({"type": "stderr", "data": "err"}).to_string(),
                    )]
                }
            }
            Message::Binary(stdin) => match std::str::from_utf8(&stdin)
                .ok()
                .and_then(|text| text.strip_prefix("exit "))
                .and_then(|code| code.parse::<i32>().ok())
            {
                Some(code) => {
                    exited = true;
                    vec![
                        Message::text(serde_json::json!({"type": "exit", "code": code}).to_string()),
                        Message::Close(None),
                    ]
                }
                None => vec![Message::Binary(stdin)],
            },
            Message::Text(text) => {
                let value: serde_json::Value = serde_json::from_str(text.as_str()).expect("a JSON text frame");
                assert_eq!(value["type"], "resize", "the only text frame a client sends");
                vec![Message::binary(
                    format!("size {}x{}", value["cols"], value["rows"]).into_bytes(),
                )]
            }
            Message::Close(_) => break,
            _ => Vec::new(),
        };
        for reply in replies {
            if socket.send(reply).await.is_err() {
                break;
            }
        }
    }
    let end = if exited {
        SocketEnd::AfterExit
    } else {
        SocketEnd::ClosedByClient
    };
    recorder.ended.send_replace(Some(end));
}

fn request(command: &[&str], tty: bool) -> InteractiveRequest {
    InteractiveRequest {
        command: command.iter().map(|part| part.to_string()).collect(),
        tty,
    }
}

async fn open(double: &Double, machine: &str, command: &[&str], tty: bool) -> Session {
    double
        .client()
        .exec_interactive(machine, &request(command, tty))
        .await
        .expect("the session opens")
}

async fn send(session: &Session, input: SessionInput) {
    tokio::time::timeout(WAIT, session.input.send(input))
        .await
        .expect("input accepted in time")
        .expect("the session takes input");
}

async fn next(session: &mut Session) -> Option<SessionOutput> {
    tokio::time::timeout(WAIT, session.output.recv())
        .await
        .expect("output in time")
}

fn stdin(bytes: &'static [u8]) -> SessionInput {
    SessionInput::Stdin(Bytes::from_static(bytes))
}

#[tokio::test]
async fn a_terminal_session_carries_the_command_resizes_stdin_and_the_exit_code() {
    let double = Double::start().await;
    let mut session = open(&double, "web-1", &["sh", "-c", "echo a b"], true).await;

    assert_eq!(
        double.seen(),
        vec![Seen {
            machine: "web-1".into(),
            cmd: Some("sh".into()),
            args: vec!["-c".into(), "echo a b".into()],
            tty: true,
        }],
        "the program, then each argument in order, and the terminal flag"
    );

    send(&session, SessionInput::Resize { cols: 120, rows: 40 }).await;
    assert_eq!(
        next(&mut session).await,
        Some(SessionOutput::Stdout(Bytes::from_static(b"size 120x40")))
    );

    send(&session, stdin(b"hi\x00\xff")).await;
    assert_eq!(
        next(&mut session).await,
        Some(SessionOutput::Stdout(Bytes::from_static(b"hi\x00\xff"))),
        "stdin and output are byte-exact (NUL and non-UTF-8 bytes included)"
    );

    send(&session, stdin(b"exit 0")).await;
    assert_eq!(next(&mut session).await, Some(SessionOutput::Ended(Ending::Exited(0))));
    assert_eq!(next(&mut session).await, None, "nothing follows the end");
    assert_eq!(double.socket_end().await, SocketEnd::AfterExit);
}

#[tokio::test]
async fn without_a_terminal_stderr_is_apart_and_the_exit_code_is_kept() {
    let double = Double::start().await;
    let mut session = open(&double, "web-1", &["cat"], false).await;

    assert_eq!(
        double.seen(),
        vec![Seen {
            machine: "web-1".into(),
            cmd: Some("cat".into()),
            args: Vec::new(),
            tty: false,
        }]
    );

    send(&session, stdin(b"out")).await;
    assert_eq!(
        next(&mut session).await,
        Some(SessionOutput::Stdout(Bytes::from_static(b"out")))
    );
    send(&session, stdin(b"err")).await;
    assert_eq!(
        next(&mut session).await,
        Some(SessionOutput::Stderr(Bytes::from_static(b"err")))
    );
    send(&session, stdin(b"exit 3")).await;
    assert_eq!(next(&mut session).await, Some(SessionOutput::Ended(Ending::Exited(3))));
    assert_eq!(next(&mut session).await, None, "nothing follows the end");
}

#[tokio::test]
async fn arguments_that_need_encoding_arrive_verbatim() {
    let double = Double::start().await;
    let command = ["/bin/echo", "a&b=c", "", "x y/z?%", "ünï"];
    let mut session = open(&double, "web-1", &command, true).await;
    assert_eq!(
        double.seen(),
        vec![Seen {
            machine: "web-1".into(),
            cmd: Some("/bin/echo".into()),
            args: command[1..].iter().map(|part| part.to_string()).collect(),
            tty: true,
        }],
        "empty arguments and reserved characters survive the query string"
    );
    send(&session, stdin(b"exit 0")).await;
    assert_eq!(next(&mut session).await, Some(SessionOutput::Ended(Ending::Exited(0))));
}

#[tokio::test]
async fn refusals_before_the_upgrade_are_the_errors_smolvm_means() {
    let double = Double::start().await;
    let client = double.client();
    let ask = request(&["sh"], true);

    let missing = client
        .exec_interactive("missing", &ask)
        .await
        .expect_err("a missing machine is refused");
    assert_eq!(
        missing,
        VmmError::NotFound {
            message: "machine not found".into()
        },
        "smolvm's 404 NOT_FOUND, with its message"
    );

    let busy = client
        .exec_interactive("busy", &ask)
        .await
        .expect_err("a stopped machine is refused");
    assert_eq!(
        busy,
        VmmError::Conflict {
            message: "machine is stopped".into()
        },
        "smolvm's 409 CONFLICT, with its message"
    );
}

#[tokio::test]
async fn no_smolvm_listening_is_unavailable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ask = request(&["sh"], true);

    // No socket file at all.
    let absent = SmolvmClient::new(SmolvmConfig::new(dir.path().join("absent.sock")))
        .exec_interactive("web-1", &ask)
        .await
        .expect_err("nothing to connect to");
    assert!(
        matches!(absent, VmmError::Unavailable { .. }),
        "an absent socket is Unavailable: {absent:?}"
    );
    assert!(absent.is_retryable());

    // A socket file left behind by a server that is gone (connection refused).
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    let refused = SmolvmClient::new(SmolvmConfig::new(&stale))
        .exec_interactive("web-1", &ask)
        .await
        .expect_err("nobody listens");
    assert!(
        matches!(refused, VmmError::Unavailable { .. }),
        "a stale socket is Unavailable: {refused:?}"
    );
}

#[tokio::test]
async fn a_session_closed_without_an_exit_code_ends_as_failed() {
    let double = Double::start().await;
    let mut session = open(&double, "vanish", &["sh"], true).await;
    match next(&mut session).await {
        Some(SessionOutput::Ended(Ending::Failed(message))) => assert!(
            message.contains("without an exit code"),
            "the failure says no exit code came: {message:?}"
        ),
        other => panic!("a close without an exit message is a failure, got {other:?}"),
    }
    assert_eq!(next(&mut session).await, None, "nothing follows the end");
    assert_eq!(double.socket_end().await, SocketEnd::Vanished);
}

#[tokio::test]
async fn a_connection_dropped_without_a_close_ends_as_failed() {
    let double = Double::start().await;
    let mut session = open(&double, "vanish-abruptly", &["sh"], true).await;
    match next(&mut session).await {
        Some(SessionOutput::Ended(Ending::Failed(message))) => {
            eprintln!("ABRUPT: {message}");
            assert!(!message.is_empty(), "the failure says something")
        }
        other => panic!("a dropped connection is a failure, got {other:?}"),
    }
    assert_eq!(next(&mut session).await, None, "nothing follows the end");
}

#[tokio::test]
async fn dropping_the_input_closes_the_connection() {
    let double = Double::start().await;
    let mut session = open(&double, "web-1", &["sleep", "1000"], true).await;

    // The command runs: it still answers.
    send(&session, stdin(b"ping")).await;
    assert_eq!(
        next(&mut session).await,
        Some(SessionOutput::Stdout(Bytes::from_static(b"ping")))
    );

    drop(session.input);
    assert_eq!(
        double.socket_end().await,
        SocketEnd::ClosedByClient,
        "the caller going closes smolvm's socket (smolvm then kills the command)"
    );
    assert_eq!(
        tokio::time::timeout(WAIT, session.output.recv())
            .await
            .expect("output ends in time"),
        None,
        "and the session's output ends"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_megabytes_through_a_slow_reader_while_input_keeps_coming() {
    const TOTAL: usize = 10 << 20;
    const CHUNK: usize = 32 << 10;
    let double = Double::start().await;
    let mut session = open(&double, "web-1", &["cat"], false).await;
    let started = std::time::Instant::now();
    // A writer that never waits for the output, and a reader that dawdles after every frame.
    let input = session.input.clone();
    let writer = tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'a'; CHUNK]);
        for _ in 0..TOTAL / CHUNK {
            input
                .send(SessionInput::Stdin(chunk.clone()))
                .await
                .expect("input is taken");
        }
    });
    let mut received = 0;
    while received < TOTAL {
        match next(&mut session).await {
            Some(SessionOutput::Stdout(bytes)) => {
                assert!(bytes.iter().all(|&b| b == b'a'), "the bytes are the ones sent");
                received += bytes.len();
            }
            other => panic!("output until all came back, got {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(received, TOTAL, "every byte came back once");
    tokio::time::timeout(WAIT, writer)
        .await
        .expect("the writer finishes")
        .expect("join");
    println!(
        "{} MiB echoed by smolvm's double through a slow reader while input kept coming: {:?}",
        TOTAL >> 20,
        started.elapsed()
    );
    send(&session, stdin(b"exit 0")).await;
    assert_eq!(next(&mut session).await, Some(SessionOutput::Ended(Ending::Exited(0))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gone_while_its_output_is_jammed_closes_the_connection() {
    let double = Double::start().await;
    let session = open(&double, "web-1", &["cat"], true).await;
    // Input whose echo the caller never reads, until nothing more is taken: smolvm's socket
    // and the session's buffers are full both ways.
    let chunk = Bytes::from(vec![b'b'; 64 << 10]);
    let mut taken = 0usize;
    loop {
        let sent = tokio::time::timeout(
            Duration::from_secs(1),
            session.input.send(SessionInput::Stdin(chunk.clone())),
        )
        .await;
        match sent {
            Ok(Ok(())) => taken += 1,
            Ok(Err(_)) => panic!("the session ended on its own"),
            Err(_) => break,
        }
        assert!(taken < 100_000, "the session never filled");
    }
    println!("jammed after {} KiB of input", taken * 64);
    // The caller drops its input and keeps (but never reads) the output.
    let Session { input, output } = session;
    drop(input);
    assert_eq!(
        double.socket_end().await,
        SocketEnd::ClosedByClient,
        "the caller going closes smolvm's socket (smolvm then kills the command)"
    );
    drop(output);
}
