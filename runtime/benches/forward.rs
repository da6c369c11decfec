//! What the port forwarder adds: TCP throughput and round trips, and UDP round trips, through a
//! forward (node address 127.0.0.2 → smolvm's side on 127.0.0.1, same port) against the same
//! traffic sent straight to 127.0.0.1, and (TCP) against a bare relay without the forwarder's
//! bounds (`copy_bidirectional` alone, on 127.0.0.3), which shows what the caps, the idle
//! timeout and the byte accounting cost.
//!
//! `cargo bench -p smolvm-runtime --bench forward`. The far end is a plain TCP sink/echo and a UDP
//! echo on 127.0.0.1:<port>, as smolvm's listener would be. Figures, not asserts; where 127.0.0.2
//! cannot be bound it prints `skipped: …`.

use smolvm_api::Protocol;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smolvm_runtime::forward::Forwarder;
use smolvm_runtime::metrics::Metrics;
use smolvm_runtime::vmm::{Machine, MachineState, PortMapping};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

const NODE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const BARE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

/// A relay without bounds: every connection accepted and copied both ways, nothing counted.
async fn bare_relay(listener: TcpListener, upstream: SocketAddr) {
    while let Ok((mut client, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Ok(mut server) = TcpStream::connect(upstream).await {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            }
        });
    }
}
/// Bytes per stream and round trips per path under `cargo bench`; a sixteenth and a twentieth of
/// them when `cargo test` runs the bench once to check that it still works (no `--bench`).
fn volume() -> usize {
    if measuring() { 256 << 20 } else { 16 << 20 }
}

fn round_trips() -> usize {
    if measuring() { 2000 } else { 100 }
}

/// Whether `cargo bench` runs this (it passes `--bench`), not `cargo test`.
fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * (sorted.len().saturating_sub(1)) as f64).round() as usize;
    sorted.get(rank).copied().unwrap_or_default()
}

fn running(port: u16) -> Machine {
    Machine {
        name: "svm-bench".into(),
        state: MachineState::Running,
        cpus: 1,
        memory_mib: 512,
        storage_gib: None,
        overlay_gib: None,
        image: None,
        ports: [Protocol::Tcp, Protocol::Udp]
            .into_iter()
            .map(|protocol| PortMapping {
                host_port: port,
                guest_port: 80,
                protocol,
            })
            .collect(),
        network: true,
        pid: None,
        raw: serde_json::Value::Null,
    }
}

/// Sends [`volume`] bytes and reads the sink's 8-byte count back: MiB/s.
async fn throughput(at: SocketAddr) -> std::io::Result<f64> {
    let mut s = TcpStream::connect(at).await?;
    let chunk = vec![7u8; 1 << 20];
    let started = Instant::now();
    for _ in 0..volume() / chunk.len() {
        s.write_all(&chunk).await?;
    }
    s.shutdown().await?;
    let mut count = [0u8; 8];
    s.read_exact(&mut count).await?;
    let secs = started.elapsed().as_secs_f64();
    Ok(u64::from_be_bytes(count) as f64 / (1 << 20) as f64 / secs)
}

/// One connection per round trip: connect, 64 bytes there, 64 back.
async fn tcp_round_trips(at: SocketAddr) -> std::io::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(round_trips());
    let mut buf = [0u8; 64];
    for _ in 0..round_trips() {
        let started = Instant::now();
        let mut s = TcpStream::connect(at).await?;
        s.write_all(&[1u8; 64]).await?;
        s.read_exact(&mut buf).await?;
        out.push(started.elapsed());
    }
    out.sort();
    Ok(out)
}

async fn udp_round_trips(at: SocketAddr) -> std::io::Result<Vec<Duration>> {
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let mut out = Vec::with_capacity(round_trips());
    let mut buf = [0u8; 64];
    for _ in 0..round_trips() {
        let started = Instant::now();
        socket.send_to(&[1u8; 64], at).await?;
        tokio::time::timeout(Duration::from_secs(2), socket.recv_from(&mut buf))
            .await
            .map_err(|_| std::io::Error::other("no UDP reply"))??;
        out.push(started.elapsed());
    }
    out.sort();
    Ok(out)
}

async fn run() -> std::io::Result<()> {
    // smolvm's side: a TCP listener that counts a stream (answering the count after the
    // half-close) or echoes 64 bytes, and a UDP echo, on 127.0.0.1:<port>.
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let port = tcp.local_addr()?.port();
    let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).await?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 20];
                let mut total = 0u64;
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            total += n as u64;
                            if total == 64 {
                                let _ = s.write_all(&buf[..64]).await;
                                return;
                            }
                        }
                    }
                }
                let _ = s.write_all(&total.to_be_bytes()).await;
            });
        }
    });
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let _ = udp.send_to(&buf[..n], from).await;
        }
    });

    let forwarder = Forwarder::new(NODE, Arc::new(Metrics::default()));
    forwarder.sync(&[running(port)]).await;
    if forwarder.open_forwards().len() != 2 {
        println!("skipped: cannot listen on {NODE}:{port} here");
        return Ok(());
    }
    let direct = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let forwarded = SocketAddr::new(NODE, port);
    println!(
        "forwarder: {} MiB per stream, {} round trips each",
        volume() >> 20,
        round_trips()
    );
    for (what, at) in [("direct   ", direct), ("forwarded", forwarded)] {
        let mib_s = throughput(at).await?;
        let tcp = tcp_round_trips(at).await?;
        let udp = udp_round_trips(at).await?;
        println!(
            "  {what}: TCP {mib_s:8.0} MiB/s; TCP connect+64 B echo p50 {:6.1} µs p99 {:6.1} µs; UDP 64 B echo p50 {:6.1} µs p99 {:6.1} µs",
            percentile(&tcp, 50.0).as_secs_f64() * 1e6,
            percentile(&tcp, 99.0).as_secs_f64() * 1e6,
            percentile(&udp, 50.0).as_secs_f64() * 1e6,
            percentile(&udp, 99.0).as_secs_f64() * 1e6,
        );
    }
    match TcpListener::bind((BARE, port)).await {
        Ok(listener) => {
            tokio::spawn(bare_relay(listener, direct));
            let at = SocketAddr::new(BARE, port);
            let mib_s = throughput(at).await?;
            let tcp = tcp_round_trips(at).await?;
            println!(
                "  bare relay: TCP {mib_s:8.0} MiB/s; TCP connect+64 B echo p50 {:6.1} µs p99 {:6.1} µs (no bounds, for comparison)",
                percentile(&tcp, 50.0).as_secs_f64() * 1e6,
                percentile(&tcp, 99.0).as_secs_f64() * 1e6,
            );
        }
        Err(error) => println!("  bare relay: skipped: cannot listen on {BARE}:{port}: {error}"),
    }
    Ok(())
}

fn main() {
    smolvm_runtime::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot build a tokio runtime: {error}");
            std::process::exit(1);
        }
    };
    if let Err(error) = runtime.block_on(run()) {
        eprintln!("forward bench failed: {error}");
        std::process::exit(1);
    }
}
