//! The port forwarder carries bytes both ways, TCP (with a half-close) and UDP, from another
//! network namespace, as a separate host would: a veth pair joins this namespace (the node) to a
//! new one (the other host). smolvm's loopback listener is stood in for by plain TCP and UDP
//! echo sockets bound to 127.0.0.1:<hostPort>: that is what smolvm binds, not a double of smolvm.
//! The forward opens and closes with the machine state fed to the same sync the agent runs.
//! Needs root and iproute2; prints `skipped: …` otherwise.

use smolvm_api::Protocol;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::Arc;

use smolvm_runtime::forward::Forwarder;
use smolvm_runtime::metrics::Metrics;
use smolvm_runtime::vmm::{Machine, MachineState};
use smolvm_testkit::netns::OtherHost;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn why_skipped() -> Option<String> {
    if let Some(why) = smolvm_testkit::netns::why_not() {
        return Some(why);
    }
    if Command::new("python3").arg("-V").output().is_err() {
        return Some("no python3 for the client".into());
    }
    None
}

fn machine(state: MachineState, port: u16) -> Machine {
    Machine::publishing(
        "svm-forward-test",
        state,
        &[(port, Protocol::Tcp), (port, Protocol::Udp)],
    )
}

/// smolvm's loopback listeners, stood in for: TCP and UDP sockets on 127.0.0.1, on one port the
/// kernel chose that is also free on `also` (the node's address, where the forwarder listens).
/// They are held from the bind on: a port checked free and bound later may be taken in between
/// (a CI run lost one that way), and nothing else binds 127.0.0.1 on a port held here.
async fn smolvm_listeners(also: IpAddr) -> (tokio::net::TcpListener, tokio::net::UdpSocket, u16) {
    for _ in 0..100 {
        let tcp = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("a loopback TCP port");
        let port = tcp.local_addr().expect("its address").port();
        let Ok(udp) = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).await else {
            continue;
        };
        let free_on_node =
            std::net::TcpListener::bind((also, port)).is_ok() && std::net::UdpSocket::bind((also, port)).is_ok();
        if free_on_node {
            return (tcp, udp, port);
        }
    }
    panic!("no port free for TCP and UDP on 127.0.0.1 and on {also} in 100 draws");
}

fn client(host: &str, port: u16) -> String {
    format!(
        r#"
import socket
out = []
try:
    s = socket.create_connection(("{host}", {port}), timeout=5)
    s.sendall(b"ping over tcp")
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    out.append("tcp=" + data.decode())
except ConnectionRefusedError:
    out.append("tcp=refused")
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(2)
u.sendto(b"ping over udp", ("{host}", {port}))
try:
    data, _ = u.recvfrom(4096)
    out.append("udp=" + data.decode())
except (socket.timeout, ConnectionRefusedError):
    out.append("udp=none")
print(" ".join(out))
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_tcp_and_udp_from_another_host_and_follows_the_machine() {
    smolvm_runtime::install_crypto_provider();
    if let Some(why) = why_skipped() {
        println!("skipped: {why}");
        return;
    }
    let tag = format!("{}", std::process::id() % 100_000);
    let octet = std::process::id() % 250 + 1;
    let (host_ip, peer_ip) = (format!("10.231.{octet}.1"), format!("10.231.{octet}.2"));
    let other = match OtherHost::create("fwd", &tag, &host_ip, &peer_ip) {
        Ok(other) => other,
        Err(why) => {
            println!("skipped: cannot build a second network namespace here: {why}");
            return;
        }
    };
    let node: IpAddr = host_ip.parse().expect("ip");
    // smolvm's listeners, stood in for: TCP answers after the client's half-close (so the
    // half-close must cross), UDP echoes.
    let (tcp, udp, port) = smolvm_listeners(node).await;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                if s.read_to_end(&mut got).await.is_ok() {
                    let _ = s
                        .write_all(format!("echo: {}", String::from_utf8_lossy(&got)).as_bytes())
                        .await;
                }
            });
        }
    });
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let reply = format!("echo: {}", String::from_utf8_lossy(&buf[..n]));
            let _ = udp.send_to(reply.as_bytes(), from).await;
        }
    });

    let metrics = Arc::new(Metrics::default());
    let forwarder = Forwarder::new(node, metrics.clone());
    let script = client(&host_ip, port);
    // Not running: nothing listens on the node's address.
    forwarder.sync(&[machine(MachineState::Created, port)]).await;
    let before = run_blocking(&other, &script).await;
    assert_eq!(before, "tcp=refused udp=none", "no forward before the machine runs");

    // Running: both protocols cross, both ways.
    forwarder.sync(&[machine(MachineState::Running, port)]).await;
    assert_eq!(forwarder.open_forwards().len(), 2);
    let t = std::time::Instant::now();
    let running = run_blocking(&other, &script).await;
    println!("round trips from the other namespace in {:?}", t.elapsed());
    assert_eq!(running, "tcp=echo: ping over tcp udp=echo: ping over udp");
    let rendered = metrics.encode();
    assert!(
        rendered.contains("smolvm_runtime_forwarded_connections_total{protocol=\"tcp\"} 1"),
        "{rendered}"
    );
    assert!(rendered.contains("smolvm_runtime_open_forwards 2"), "{rendered}");

    // Stopped: closed (the port is free on the node's address again); running again: reopened.
    forwarder.sync(&[machine(MachineState::Stopped, port)]).await;
    assert!(forwarder.open_forwards().is_empty());
    assert_eq!(run_blocking(&other, &script).await, "tcp=refused udp=none");
    forwarder.sync(&[machine(MachineState::Running, port)]).await;
    assert_eq!(
        run_blocking(&other, &script).await,
        "tcp=echo: ping over tcp udp=echo: ping over udp"
    );
    // Deleted: closed.
    forwarder.sync(&[]).await;
    assert!(forwarder.open_forwards().is_empty());
    assert!(
        std::net::TcpListener::bind((node, port)).is_ok(),
        "the port is free again"
    );
}

fn run_in(ns: &str, script: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c", script])
        .output()
        .expect("ip netns exec");
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn run_blocking(other: &OtherHost, script: &str) -> String {
    let (ns, script) = (other.ns.clone(), script.to_string());
    tokio::task::spawn_blocking(move || run_in(&ns, &script))
        .await
        .expect("client")
}

/// A forwarded TCP connection that carries nothing either way for the idle timeout is closed
/// (and counted); one that keeps talking is not. On 127.0.0.2 (the node's address stood in for)
/// relayed to an echo on 127.0.0.1; prints `skipped: …` where 127.0.0.2 cannot be bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed() {
    smolvm_runtime::install_crypto_provider();
    let node = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    if std::net::TcpListener::bind((node, 0)).is_err() {
        println!("skipped: cannot listen on {node} here");
        return;
    }
    let (echo, _udp, port) = smolvm_listeners(node).await;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let metrics = Arc::new(Metrics::default());
    // 2 s, twenty times the busy connection's pace, so that a stall of this machine under load
    // closes neither connection early: with 500 ms, a CI run had a first echo reset (the relay
    // closed it idle before its byte was carried).
    let limits = smolvm_runtime::forward::ForwardLimits {
        idle_timeout: std::time::Duration::from_secs(2),
        ..Default::default()
    };
    let forwarder = Forwarder::with_limits(node, metrics.clone(), limits);
    forwarder.sync(&[machine(MachineState::Running, port)]).await;

    let mut idle = tokio::net::TcpStream::connect((node, port)).await.expect("connect");
    let mut busy = tokio::net::TcpStream::connect((node, port)).await.expect("connect");
    let mut byte = [0u8; 1];
    for s in [&mut idle, &mut busy] {
        s.write_all(b"x").await.expect("write");
        s.read_exact(&mut byte).await.expect("echo");
    }
    // The busy one talks more often than the timeout while the idle one says nothing.
    let wait = std::time::Duration::from_secs(30);
    let closed = async {
        let mut rest = Vec::new();
        idle.read_to_end(&mut rest).await
    };
    let talking = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            busy.write_all(b"y").await.expect("the busy connection stays open");
            busy.read_exact(&mut [0u8; 1]).await.expect("and carried");
        }
    };
    tokio::select! {
        ended = tokio::time::timeout(wait, closed) => {
            assert!(ended.is_ok(), "the idle connection is closed");
        }
        () = talking => {}
    }
    assert_eq!(metrics.forward_idle_closed("tcp"), 1, "only the idle one");
    busy.write_all(b"z").await.expect("write");
    busy.read_exact(&mut byte).await.expect("the busy one still carries");
    assert_eq!(&byte, b"z");
}
