//! The port forwarder under a flood: its caps close what is beyond them at once and count it,
//! and its file-descriptor budget leaves the node API answering.
//!
//! The forwarder listens on 127.0.0.2 (a loopback address of its own, standing for the node's)
//! and relays to 127.0.0.1:<port>, where smolvm's listener would be. The flood's clients and the
//! echo listeners run in a child process (python3), so that this process holds only what the agent
//! would: the forwarder's two descriptors per connection and the node API's. Its open-files
//! limit is lowered to a few hundred, so a forwarder without a budget runs out of descriptors
//! and the node API with it (the failure this test reproduces). Prints `skipped: …` without
//! python3 or where 127.0.0.2 cannot be bound. Alone in its binary: it changes the process's
//! open-files limit.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use smolvm_api::Protocol;
use smolvm_runtime::forward::{ForwardLimits, Forwarder, connection_budget};
use smolvm_runtime::metrics::Metrics;
use smolvm_runtime::nodeapi::auth::TokenAuth;
use smolvm_runtime::nodeapi::{Identity, NodeApiState, router};
use smolvm_runtime::vmm::{Machine, MachineState};
use smolvm_testkit::runtime_double::ScriptedRuntime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const TOKEN: &str = "forward-limits-token";
/// Generous bound on each wait, only so that a broken test fails instead of hanging.
const WAIT: Duration = Duration::from_secs(60);

fn running(name: &str, ports: &[u16]) -> Machine {
    let ports: Vec<(u16, Protocol)> = ports.iter().map(|&port| (port, Protocol::Tcp)).collect();
    Machine::publishing(name, MachineState::Running, &ports)
}

/// The child: echo listeners on 127.0.0.1 for each port, then (on `go`) `attempts` connections
/// to each port in turn on the node's address, each held if its one byte comes back, closed if
/// the forwarder closed it; prints `{port: [held, closed]}` and holds until stdin ends.
const FLOOD: &str = r#"
import asyncio, json, sys
node, plan = sys.argv[1], json.loads(sys.argv[2])

async def echo(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except BaseException:
        pass
    writer.close()

async def main():
    servers = [await asyncio.start_server(echo, "127.0.0.1", port, backlog=1024) for port, _ in plan]
    print("listening", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    held, result = [], {}
    for port, attempts in plan:
        ok = closed = 0
        for _ in range(attempts):
            reader, writer = await asyncio.open_connection(node, port)
            try:
                writer.write(b"x")
                await writer.drain()
                data = await asyncio.wait_for(reader.read(1), 30)
            except Exception:
                data = b""
            if data == b"x":
                ok += 1
                held.append(writer)
            else:
                closed += 1
                writer.close()
        result[str(port)] = [ok, closed]
    print(json.dumps(result), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)

asyncio.run(main())
"#;

fn set_open_files_limit(soft: u64) -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both calls only read or write the struct on this stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return false;
        }
        limit.rlim_cur = soft.min(limit.rlim_max);
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0
    }
}

/// GET `path` on the node API (plain HTTP here; the router is the agent's).
async fn node_api_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request =
        format!("GET {path} HTTP/1.1\r\nhost: node\r\nauthorization: Bearer {TOKEN}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    Ok(text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_is_capped_counted_and_the_node_api_still_answers() {
    smolvm_runtime::install_crypto_provider();
    if Command::new("python3").arg("-V").output().is_err() {
        println!("skipped: no python3 for the flood's clients");
        return;
    }
    if std::net::TcpListener::bind((NODE, 0)).is_err() {
        println!("skipped: cannot listen on {NODE} here");
        return;
    }
    let (a, b) = (smolvm_testkit::node::free_port(), smolvm_testkit::node::free_port());
    // The child starts with this process's limit, before it is lowered.
    let plan = serde_json::json!([[a, 120], [b, 80]]).to_string();
    let mut child = Command::new("python3")
        .args(["-c", FLOOD, &NODE.to_string(), &plan])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut to_child = child.stdin.take().expect("stdin");
    let mut from_child = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    from_child.read_line(&mut line).expect("the child starts");
    assert_eq!(line.trim(), "listening");

    // 300 open files, 100 kept back: the forwarder may hold 100 connections (200 descriptors).
    const NOFILE: u64 = 300;
    assert!(set_open_files_limit(NOFILE), "lowering the open-files limit");
    let limits = ForwardLimits {
        connections_per_port: 70,
        connections: connection_budget(10_000, Some(NOFILE), 100),
        ..ForwardLimits::default()
    };
    assert_eq!(limits.connections, 100);
    let metrics = Arc::new(Metrics::default());
    let forwarder = Forwarder::with_limits(NODE, metrics.clone(), limits);
    forwarder.sync(&[running("svm-a", &[a]), running("svm-b", &[b])]).await;
    assert_eq!(forwarder.open_forwards().len(), 2, "both ports forwarded");

    // The node API, the agent's router in front of a TEST DOUBLE of the runtime.
    let state = NodeApiState::new(
        Arc::new(ScriptedRuntime::default()),
        TokenAuth::fixed(TOKEN).expect("token"),
        Identity::new("node-a"),
        metrics.clone(),
        None,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let node_api = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router(state)).await });

    // The flood: 120 connections to port a, then 80 to port b, each held.
    writeln!(to_child, "go").expect("go");
    let (result, from_child) = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        from_child.read_line(&mut line).map(|_| (line, from_child))
    })
    .await
    .expect("join")
    .expect("the flood's result");
    let result: serde_json::Value = serde_json::from_str(&result).expect("JSON");
    println!("flood (held, closed at once) by port: {result}");
    assert_eq!(
        result[a.to_string()],
        serde_json::json!([70, 50]),
        "port a: its own cap"
    );
    assert_eq!(
        result[b.to_string()],
        serde_json::json!([30, 50]),
        "port b: the agent's cap"
    );
    assert_eq!(metrics.forward_refused("tcp", "port"), 50);
    assert_eq!(metrics.forward_refused("tcp", "agent"), 50);
    let rendered = metrics.encode();
    assert!(
        rendered.contains("smolvm_runtime_forward_refused_total{protocol=\"tcp\",reason=\"agent\"} 50"),
        "{rendered}"
    );

    // While the flood holds every slot, the node API still answers.
    let status = tokio::time::timeout(WAIT, node_api_get(node_api, "/v1/identity"))
        .await
        .expect("the node API answers in time")
        .expect("the node API answers");
    assert_eq!(status, 200);

    // The flood goes: its slots are free again, and a new connection is carried.
    drop(to_child);
    let _ = child.wait();
    drop(from_child);
    let echo = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, b))
        .await
        .expect("echo");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let mut carried = false;
    for _ in 0..600 {
        if let Ok(mut s) = tokio::net::TcpStream::connect((NODE, b)).await {
            let mut byte = [0u8; 1];
            if s.write_all(b"y").await.is_ok() && matches!(s.read(&mut byte).await, Ok(1)) {
                carried = byte == *b"y";
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        carried,
        "the forwarder carries connections again once the flood is gone"
    );
}
