//! Benchmark-only load generator for `webhook/bench/run.sh`.
//!
//! - `gen DIR`: writes a test CA, a serving pair for the Service name and `localhost`, and a
//!   realistic ~1.8 KB AdmissionReview (`review.json`).
//! - `run`: keep-alive TLS load over HTTP/1.1 or HTTP/2 with N connections, then prints
//!   reviews/s and p50/p99/p99.9 latency. Either closed loop (`--rate 0`: each connection sends
//!   as soon as its previous answer is in; latency from send to answer), or open loop at a fixed
//!   offered rate on one global schedule, where latency runs from when a request was *due*, so a
//!   stall shows up in every request it delays (no coordinated omission). The schedule is kept
//!   by a thread that sleeps until each due time (tens of microseconds late, where tokio's timer
//!   would round up to the next millisecond); over HTTP/2 each request is its own stream, so a slow answer
//!   does not hold back the next request on that connection; over HTTP/1.1 a request waits for
//!   its connection, and that wait counts. `send-late` reports how late requests went out.
//!   Every non-200 answer counts as an error.
//!
//! - `compare`: the load of `run` (open loop at `--rate`, or closed loop with `--rate 0`)
//!   against several targets in turn, cut into slices, every target taking its turn in every
//!   slice (in rotating order), each target's figures pooled over its slices. A stall of the
//!   machine (these are VMs, where one of milliseconds comes every few seconds) then falls on
//!   every target alike, instead of on whichever target ran at that moment, so the targets'
//!   tails can be compared within one run; and so does a slow spell of the host (here the same
//!   server's maximum throughput differed by up to 2x between runs seconds apart), so their
//!   throughputs can be too. In the closed loop each target's line also gives its turns'
//!   lowest, median and highest reviews/s. With `--steal-cpus`, each line gives the host steal
//!   time of those CPUs over the target's turns (`host-steal`): what the hypervisor took from
//!   them, which shows whose turns a stall of the host fell on. At a fixed rate it also gives
//!   the p99 over the quiet slices alone (`quiet-slices=N/M p99-quiet=`): the slices in which
//!   the host took less than a `/proc/stat` tick from those CPUs in every target's turn, the
//!   same slices for every target. The pooled p99 stays the figure of record; the quiet one
//!   tells the server's own tail from the host's.
//!
//! - `trickle`: clients that send their bodies one byte at a time while reviews are sent; prints
//!   the reviews' answers and latency (issue 30's reproduction).
//!
//! - `hold`: HTTP/2 connections from many loopback addresses that each send a body's DATA on a
//!   stream they never end; prints the server's memory (issue 56's reproduction).
//!
//! It verifies the server certificate against the generated CA, like every client here.

use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use smolvm_webhook_bench::client::{self, Connection, Version};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write ca.crt, tls.crt, tls.key and review.json into DIR.
    Gen { dir: PathBuf },
    /// Generate load.
    Run(RunArgs),
    /// Load at `--rate` (0: closed loop) against each `--target` in turn, slice by slice;
    /// prints each target's figures pooled over its slices, as `run` prints them.
    Compare(CompareArgs),
    /// Flood: N clients, each on its own connection, send maximum-size reviews back to back;
    /// prints the answers by status and the server's peak resident memory (`--pid`).
    Flood(FloodArgs),
    /// Trickle (issue 30): N clients send a review's head, then its body one byte every
    /// `--interval-ms` (reconnecting when answered or dropped), while one client sends reviews
    /// at `--rate` per second; prints the reviews' answers by status and their latency, and how
    /// the trickles were answered.
    Trickle(TrickleArgs),
    /// Hold (issue 56): N HTTP/2 connections from many loopback addresses, each sending
    /// `--body-bytes` of DATA on a stream it never ends (a new one when answered), for
    /// `--seconds`; prints the connections served and refused, the streams' answers by status
    /// and the server's resident memory (`--pid`).
    Hold(HoldArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    #[arg(long)]
    addr: SocketAddr,
    #[arg(long)]
    path: String,
    #[command(flatten)]
    client: ClientArgs,
    /// Offered reviews/s across all connections; 0 means closed loop (maximum throughput).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    #[arg(long, default_value_t = 2)]
    warmup_seconds: u64,
    /// A label printed with the results.
    #[arg(long, default_value = "")]
    label: String,
}

#[derive(clap::Args)]
struct CompareArgs {
    /// `LABEL=ADDR/PATH`, e.g. `nginx=127.0.0.1:19445/answer`; one per target.
    #[arg(long = "target", required = true)]
    targets: Vec<Target>,
    #[command(flatten)]
    client: ClientArgs,
    /// Offered reviews/s across all connections, during each target's turn; 0 means closed
    /// loop (maximum throughput).
    #[arg(long)]
    rate: u64,
    /// Measured seconds per target, over all its slices.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// How many turns each target gets (each turn lasts `--seconds` / `--slices`).
    #[arg(long, default_value_t = 40)]
    slices: u32,
    /// Each target's connections are made and run at the load this long before its first turn.
    #[arg(long, default_value_t = 1000)]
    warmup_ms: u64,
    /// Each turn runs at the load this long before it is measured.
    #[arg(long, default_value_t = 100)]
    turn_warmup_ms: u64,
    /// CPUs whose host steal time (`/proc/stat`) is added up over each target's turns and
    /// printed with it (`host-steal`): the time the hypervisor ran something else on the
    /// servers' and the load's cores, which no server can answer in.
    #[arg(long, value_delimiter = ',')]
    steal_cpus: Vec<usize>,
}

/// How `run` and `compare` connect and what they send.
#[derive(clap::Args)]
struct ClientArgs {
    /// 1 or 2.
    #[arg(long, default_value_t = 1)]
    http: u8,
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// The CA the server's certificate is verified against.
    #[arg(long)]
    ca: PathBuf,
    /// The review to send.
    #[arg(long)]
    body: PathBuf,
    #[arg(long, default_value = "localhost")]
    server_name: String,
}

/// One target of `compare`: a label, the server's address and the request path.
#[derive(Clone)]
struct Target {
    label: String,
    addr: SocketAddr,
    path: String,
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let shape = || format!("{s:?}: expected LABEL=ADDR/PATH");
        let (label, rest) = s.split_once('=').ok_or_else(shape)?;
        let slash = rest.find('/').ok_or_else(shape)?;
        let addr = rest[..slash].parse().map_err(|e| format!("{s:?}: the address: {e}"))?;
        Ok(Target {
            label: label.to_string(),
            addr,
            path: rest[slash..].to_string(),
        })
    }
}

#[derive(clap::Args)]
struct FloodArgs {
    #[arg(long)]
    addr: SocketAddr,
    #[arg(long, default_value = "/mutate/smolvms")]
    path: String,
    /// 1 or 2.
    #[arg(long, default_value_t = 2)]
    http: u8,
    #[arg(long, default_value_t = 128)]
    clients: usize,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Size of each review body, bytes (the server's `--body-limit` is the maximum).
    #[arg(long, default_value_t = 1024 * 1024)]
    body_bytes: usize,
    /// `string`: a padded annotation (cheap to parse); `objects`: managedFields made of many
    /// small JSON objects (the most memory per byte a review can cost).
    #[arg(long, default_value = "objects")]
    shape: String,
    /// The server's process id, for its peak resident memory (VmHWM).
    #[arg(long)]
    pid: u32,
    #[arg(long)]
    ca: PathBuf,
    #[arg(long, default_value = "localhost")]
    server_name: String,
}

#[derive(clap::Args)]
struct TrickleArgs {
    #[arg(long)]
    addr: SocketAddr,
    #[arg(long, default_value = "/validate/smolvms")]
    path: String,
    /// The reviews' protocol, 1 or 2 (the API server uses 2); the trickles use HTTP/1.1.
    #[arg(long, default_value_t = 2)]
    http: u8,
    #[arg(long, default_value_t = 40)]
    tricklers: usize,
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Reviews per second.
    #[arg(long, default_value_t = 20)]
    rate: u64,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    #[arg(long)]
    ca: PathBuf,
    #[arg(long)]
    body: PathBuf,
    #[arg(long, default_value = "localhost")]
    server_name: String,
}

#[derive(clap::Args)]
struct HoldArgs {
    #[arg(long)]
    addr: SocketAddr,
    #[arg(long, default_value = "/validate/smolvms")]
    path: String,
    #[arg(long, default_value_t = 1024)]
    connections: usize,
    /// Loopback addresses the connections come from (127.0.0.2 on), spread evenly; each opens
    /// one connection at a time, so this many handshakes run at once at most.
    #[arg(long, default_value_t = 16)]
    sources: usize,
    /// Streams each connection keeps open at once (each a body never ended).
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// DATA sent on each stream before it waits (never ended).
    #[arg(long, default_value_t = 1024 * 1024)]
    body_bytes: usize,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// The server's process id, for its resident memory (VmRSS sampled, VmHWM).
    #[arg(long)]
    pid: u32,
    #[arg(long)]
    ca: PathBuf,
    #[arg(long, default_value = "localhost")]
    server_name: String,
}

/// One connection of `hold`: TLS and HTTP/2 from `source`; `None` when the server refused it.
async fn hold_connect(
    source: std::net::IpAddr,
    args: &(SocketAddr, String, String, std::sync::Arc<rustls::ClientConfig>),
) -> Option<h2::client::SendRequest<Bytes>> {
    let (addr, _, server_name, config) = args;
    let tcp = client::tcp_from(source, *addr).await.ok()?;
    let name = rustls::pki_types::ServerName::try_from(server_name.clone()).ok()?;
    let tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await
        .ok()?;
    let (sender, connection) = h2::client::handshake(tls).await.ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// Streams on one connection of `hold` that each send `body` and never end, one after another
/// (the next when the server answers or resets the last), until `end`; their answers by status.
async fn hold_streams(
    mut sender: h2::client::SendRequest<Bytes>,
    args: std::sync::Arc<(SocketAddr, String, String, std::sync::Arc<rustls::ClientConfig>)>,
    body: Bytes,
    end: Instant,
) -> std::collections::BTreeMap<u16, u64> {
    let (_, path, server_name, _) = &*args;
    let mut answers = std::collections::BTreeMap::new();
    while Instant::now() < end {
        let Ok(ready) = sender.ready().await else { break };
        sender = ready;
        let request = http::Request::post(format!("https://{server_name}{path}"))
            .header("content-type", "application/json")
            .body(());
        let Ok(request) = request else { break };
        let Ok((response, mut stream)) = sender.send_request(request, false) else {
            break;
        };
        // Queued whole; h2 sends it as the server's windows allow. Never ended.
        if stream.send_data(body.clone(), false).is_err() {
            break;
        }
        let status = match tokio::time::timeout(end.saturating_duration_since(Instant::now()), response).await {
            Ok(Ok(response)) => response.status().as_u16(),
            Ok(Err(_)) => 0,
            Err(_) => break,
        };
        *answers.entry(status).or_default() += 1;
        drop(stream);
    }
    answers
}

async fn hold(args: HoldArgs) -> Result<(), String> {
    let ca_pem = std::fs::read_to_string(&args.ca).map_err(|e| format!("{}: {e}", args.ca.display()))?;
    let config = client::tls_config(&ca_pem, Version::Http2).map_err(|e| e.to_string())?;
    let shared = std::sync::Arc::new((args.addr, args.path.clone(), args.server_name.clone(), config));
    let body = Bytes::from(vec![b' '; args.body_bytes]);
    let rss_before = vm_kib(args.pid, "VmRSS:").unwrap_or(0);
    let start = Instant::now();
    let end = start + Duration::from_secs(args.seconds);
    let sources = args.sources.clamp(1, 250);
    let streams = args.streams.max(1);
    // Each source opens its connections one after another (each once the last is up), the
    // sources side by side: at most one handshake per source in progress.
    let mut per_source = Vec::new();
    for s in 0..sources {
        let source = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2 + s as u8));
        let count = args.connections / sources + usize::from(s < args.connections % sources);
        let (shared, body) = (shared.clone(), body.clone());
        per_source.push(tokio::spawn(async move {
            let mut holders = Vec::new();
            for _ in 0..count {
                if let Some(sender) = hold_connect(source, &shared).await {
                    let streams = (0..streams)
                        .map(|_| tokio::spawn(hold_streams(sender.clone(), shared.clone(), body.clone(), end)))
                        .collect::<Vec<_>>();
                    holders.push(streams);
                }
            }
            holders
        }));
    }
    let mut peak_rss = rss_before;
    while Instant::now() < end {
        peak_rss = peak_rss.max(vm_kib(args.pid, "VmRSS:").unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut served = 0;
    let mut answers: std::collections::BTreeMap<u16, u64> = Default::default();
    for source in per_source {
        for streams in source.await.map_err(|e| e.to_string())? {
            served += 1;
            for held in streams {
                for (status, n) in held.await.map_err(|e| e.to_string())? {
                    *answers.entry(status).or_default() += n;
                }
            }
        }
    }
    println!(
        "hold {} HTTP/2: {} connections from {sources} sources, {served} served, {} refused; {streams} stream(s) on each, each {} KiB of DATA, never ended, for {}s; streams answered {{{}}}; server RSS before {} MiB, peak sampled {} MiB, high-water mark {} MiB",
        args.path,
        args.connections,
        args.connections.saturating_sub(served),
        args.body_bytes / 1024,
        args.seconds,
        by_status(&answers),
        rss_before / 1024,
        peak_rss / 1024,
        vm_kib(args.pid, "VmHWM:").unwrap_or(0) / 1024,
    );
    Ok(())
}

/// One trickling client: a review's head, then its body a byte at a time, reconnecting when
/// answered or dropped, until `end`. Returns its answers by status.
async fn trickler(
    addr: SocketAddr,
    config: std::sync::Arc<rustls::ClientConfig>,
    name: rustls::pki_types::ServerName<'static>,
    body: Bytes,
    interval: Duration,
    end: Instant,
) -> std::collections::BTreeMap<u16, u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut answers: std::collections::BTreeMap<u16, u64> = Default::default();
    while Instant::now() < end {
        let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(mut tls) = tokio_rustls::TlsConnector::from(config.clone())
            .connect(name.clone(), tcp)
            .await
        else {
            continue;
        };
        let head = format!(
            "POST /validate/smolvms HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if tls.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; 4096];
        for byte in body.iter() {
            if Instant::now() >= end {
                return answers;
            }
            if tls.write_all(std::slice::from_ref(byte)).await.is_err() || tls.flush().await.is_err() {
                break;
            }
            match tokio::time::timeout(interval, tls.read(&mut buf)).await {
                Err(_) => continue,
                Ok(Ok(n)) if n > 0 => {
                    let status = String::from_utf8_lossy(&buf[..n])
                        .split(' ')
                        .nth(1)
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(0);
                    *answers.entry(status).or_default() += 1;
                    break;
                }
                Ok(_) => {
                    *answers.entry(0).or_default() += 1;
                    break;
                }
            }
        }
    }
    answers
}

async fn trickle(args: TrickleArgs) -> Result<(), String> {
    let TrickleArgs {
        addr,
        path,
        http,
        tricklers,
        interval_ms,
        rate,
        seconds,
        ca,
        body,
        server_name,
    } = args;
    let version = version_of(http);
    let interval = Duration::from_millis(interval_ms.max(1));
    let ca_pem = std::fs::read_to_string(&ca).map_err(|e| format!("{}: {e}", ca.display()))?;
    let body = Bytes::from(std::fs::read(&body).map_err(|e| e.to_string())?);
    let raw_config = client::tls_config(&ca_pem, Version::Http1).map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from(server_name.clone()).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds) + Duration::from_secs(2);
    let mut trickles = Vec::new();
    for _ in 0..tricklers {
        trickles.push(tokio::spawn(trickler(
            addr,
            raw_config.clone(),
            name.clone(),
            body.clone(),
            interval,
            end,
        )));
    }
    // The trickles get their heads in first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let config = client::tls_config(&ca_pem, version).map_err(|e| e.to_string())?;
    let mut conn = client::connect(addr, &server_name, config.clone(), version)
        .await
        .map_err(|e| e.to_string())?;
    let mut statuses: std::collections::BTreeMap<u16, u64> = Default::default();
    let mut latency = Vec::new();
    let every = Duration::from_micros(1_000_000 / rate.max(1));
    let mut due = Instant::now();
    let stop = due + Duration::from_secs(seconds);
    while due < stop {
        tokio::time::sleep_until(due.into()).await;
        let sent = Instant::now();
        // The API server gives a call 5 s (the shipped timeoutSeconds).
        match tokio::time::timeout(Duration::from_secs(5), conn.post_json(&path, body.clone())).await {
            Ok(Ok((status, _))) => {
                *statuses.entry(status).or_default() += 1;
                if status == 200 {
                    latency.push(sent.elapsed().as_micros() as u64);
                }
            }
            Ok(Err(_)) | Err(_) => {
                *statuses.entry(0).or_default() += 1;
                conn = client::connect(addr, &server_name, config.clone(), version)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        due += every;
    }
    let mut shed: std::collections::BTreeMap<u16, u64> = Default::default();
    for t in trickles {
        for (status, n) in t.await.map_err(|e| e.to_string())? {
            *shed.entry(status).or_default() += n;
        }
    }
    latency.sort_unstable();
    let show = by_status;
    println!(
        "trickle {path} HTTP/{}: {tricklers} clients at 1 byte/{}ms; {} reviews at {rate}/s answered {{{}}} p50={:.3}ms p99={:.3}ms; trickles answered early {{{}}}",
        if version == Version::Http2 { 2 } else { 1 },
        interval.as_millis(),
        statuses.values().sum::<u64>(),
        show(&statuses),
        percentile(&latency, 0.50),
        percentile(&latency, 0.99),
        show(&shed),
    );
    Ok(())
}

/// Answers counted by status, as text (`200: 12, no answer: 1`).
fn by_status(m: &std::collections::BTreeMap<u16, u64>) -> String {
    let shown = |status: u16| {
        if status == 0 {
            "no answer".to_string()
        } else {
            status.to_string()
        }
    };
    m.iter()
        .map(|(s, n)| format!("{}: {n}", shown(*s)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A review of exactly `bytes` bytes (or the smallest one over the realistic review), padded
/// with an annotation string or with managedFields made of small JSON objects.
fn max_size_review(bytes: usize, shape: &str) -> Result<Vec<u8>, String> {
    let mut review = smolvm_webhook_bench::support::review_json();
    let base = serde_json::to_vec(&review).map_err(|e| e.to_string())?.len();
    let room = bytes.saturating_sub(base + 64);
    match shape {
        "string" => {
            review["request"]["object"]["metadata"]["annotations"]["bench.smolvm.dev/padding"] =
                serde_json::Value::String("x".repeat(room));
        }
        "objects" => {
            // {"f:aNNNNNN":{}} per entry: a map per 16 bytes or so.
            let mut fields = serde_json::Map::new();
            let mut used = 0;
            let mut i = 0u64;
            while used + 16 < room {
                let key = format!("f:a{i:06}");
                used += key.len() + 6;
                fields.insert(key, serde_json::json!({}));
                i += 1;
            }
            review["request"]["object"]["metadata"]["managedFields"][0]["fieldsV1"] = serde_json::Value::Object(fields);
        }
        other => return Err(format!("unknown shape {other:?}: use string or objects")),
    }
    serde_json::to_vec(&review).map_err(|e| e.to_string())
}

fn vm_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

async fn flood(args: FloodArgs) -> Result<(), String> {
    let FloodArgs {
        addr,
        path,
        http,
        clients,
        seconds,
        body_bytes,
        shape,
        pid,
        ca,
        server_name,
    } = args;
    let version = version_of(http);
    let ca_pem = std::fs::read_to_string(&ca).map_err(|e| format!("{}: {e}", ca.display()))?;
    let body = Bytes::from(max_size_review(body_bytes, &shape)?);
    let config = client::tls_config(&ca_pem, version).map_err(|e| e.to_string())?;
    let rss_before = vm_kib(pid, "VmRSS:").unwrap_or(0);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (config, path, body, name) = (config.clone(), path.clone(), body.clone(), server_name.clone());
        tasks.push(tokio::spawn(async move {
            // (answers by status, transport errors)
            let mut counts: std::collections::BTreeMap<u16, u64> = Default::default();
            let mut errors = 0u64;
            let mut conn = None;
            while Instant::now() < end {
                if conn.is_none() {
                    conn = client::connect(addr, &name, config.clone(), version).await.ok();
                }
                let Some(c) = conn.as_mut() else {
                    errors += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                match c.post_json(&path, body.clone()).await {
                    Ok((status, _)) => *counts.entry(status).or_default() += 1,
                    Err(_) => {
                        errors += 1;
                        conn = None;
                    }
                }
            }
            (counts, errors)
        }));
    }
    let mut peak_rss = rss_before;
    while Instant::now() < end {
        peak_rss = peak_rss.max(vm_kib(pid, "VmRSS:").unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut counts: std::collections::BTreeMap<u16, u64> = Default::default();
    let mut errors = 0;
    for t in tasks {
        let (c, e) = t.await.map_err(|e| e.to_string())?;
        for (status, n) in c {
            *counts.entry(status).or_default() += n;
        }
        errors += e;
    }
    let hwm = vm_kib(pid, "VmHWM:").unwrap_or(0);
    let answered: u64 = counts.values().sum();
    let by_status: Vec<String> = counts.iter().map(|(s, n)| format!("{s}: {n}")).collect();
    println!(
        "flood {path} HTTP/{} {clients} clients x {} KiB ({shape}) for {seconds}s: {answered} answered ({}), {errors} transport errors; server RSS before {} MiB, peak sampled {} MiB, high-water mark {} MiB",
        if version == Version::Http2 { 2 } else { 1 },
        body.len() / 1024,
        by_status.join(", "),
        rss_before / 1024,
        peak_rss / 1024,
        hwm / 1024,
    );
    Ok(())
}

fn generate(dir: &std::path::Path) -> Result<(), String> {
    let year = Duration::from_secs(365 * 86_400);
    let ca =
        smolvm_certs::CertificateAuthority::generate("smolvm-webhook-bench-ca", year).map_err(|e| e.to_string())?;
    let mut names = smolvm_certs::webhook_service_dns_names("smolvm-webhook", "smolvm-system");
    names.push("localhost".into());
    let leaf = ca.issue_server(&names, &[], year).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let body = serde_json::to_vec(&smolvm_webhook_bench::support::review_json()).map_err(|e| e.to_string())?;
    for (name, content) in [
        ("ca.crt", ca.cert_pem().as_bytes()),
        ("tls.crt", leaf.cert_pem.as_bytes()),
        ("tls.key", leaf.key_pem.as_bytes()),
        ("review.json", body.as_slice()),
    ] {
        std::fs::write(dir.join(name), content).map_err(|e| format!("{name}: {e}"))?;
    }
    println!("wrote {} (review.json: {} bytes)", dir.display(), body.len());
    Ok(())
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)] as f64 / 1000.0
}

/// One finished request: when it was due (open loop) or sent (closed loop), when it was sent,
/// when its answer was complete, and whether that answer was a 200.
#[derive(Clone, Copy)]
struct Sample {
    due: Instant,
    sent: Instant,
    done: Instant,
    ok: bool,
}

/// What a run measures.
struct Window {
    start: Instant,
    measure_from: Instant,
    end: Instant,
}

/// What is sent to one target: the review to a path, over a protocol, at an offered rate (0:
/// closed loop).
struct Load {
    version: Version,
    rate: u64,
    path: String,
    body: Bytes,
}

impl Load {
    /// Runs the load over `conns` for the window `w`; gives the samples measured, and the
    /// connections back for another turn.
    async fn run(&self, conns: Vec<Connection>, w: Window) -> Result<(Vec<Sample>, Vec<Connection>), String> {
        if self.rate == 0 {
            closed_loop(conns, self, w).await
        } else {
            open_loop(conns, self, w).await
        }
    }
}

/// Closed loop: each connection sends its next request as soon as the previous answer is in.
async fn closed_loop(conns: Vec<Connection>, load: &Load, w: Window) -> Result<(Vec<Sample>, Vec<Connection>), String> {
    let mut tasks = Vec::new();
    for mut conn in conns {
        let (path, body) = (load.path.clone(), load.body.clone());
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(1 << 12);
            tokio::time::sleep_until(w.start.into()).await;
            loop {
                let sent = Instant::now();
                if sent >= w.end {
                    break;
                }
                let ok = matches!(conn.post_json(&path, body.clone()).await, Ok((200, _)));
                if sent >= w.measure_from {
                    let done = Instant::now();
                    samples.push(Sample {
                        due: sent,
                        sent,
                        done,
                        ok,
                    });
                }
            }
            (samples, conn)
        }));
    }
    let (mut all, mut back) = (Vec::new(), Vec::new());
    for t in tasks {
        let (samples, conn) = t.await.map_err(|e| e.to_string())?;
        all.extend(samples);
        back.push(conn);
    }
    Ok((all, back))
}

/// Open loop at `rate` requests/s across all connections, on one global schedule (request k is
/// due at `start + k / rate`, on connection k mod n). A request is never held back by a slow
/// earlier answer: over HTTP/2 each goes out on its own stream at once; over HTTP/1.1 it waits
/// for its connection to be free, and that wait counts. Latency is measured from when the
/// request was due, so stalls are not hidden (no coordinated omission).
async fn open_loop(conns: Vec<Connection>, load: &Load, w: Window) -> Result<(Vec<Sample>, Vec<Connection>), String> {
    let Load {
        version,
        rate,
        ref path,
        ref body,
    } = *load;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Sample>();
    let n = conns.len();
    // HTTP/1.1: one worker per connection, fed in schedule order.
    let mut queues = Vec::new();
    let mut workers = Vec::new();
    let mut h2 = Vec::new();
    for mut conn in conns {
        if version == Version::Http2 {
            h2.push(conn);
            continue;
        }
        let (qtx, mut qrx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
        queues.push(qtx);
        let (tx, path, body) = (tx.clone(), path.clone(), body.clone());
        workers.push(tokio::spawn(async move {
            while let Some(due) = qrx.recv().await {
                let sent = Instant::now();
                let ok = matches!(conn.post_json(&path, body.clone()).await, Ok((200, _)));
                let done = Instant::now();
                let _ = tx.send(Sample { due, sent, done, ok });
            }
            conn
        }));
    }
    // The schedule runs on its own thread: tokio's timer rounds deadlines up to the next
    // millisecond, while a thread sleeping until each due time wakes within tens of
    // microseconds. It does not spin: it shares the load core with the connections' tasks.
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let (due_tx, mut due_rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    let end = w.end;
    let clock = std::thread::spawn(move || {
        for k in 0u32.. {
            let due = w.start + period * k;
            if due >= end {
                break;
            }
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if due_tx.send((k as usize, due)).is_err() {
                break;
            }
        }
    });
    while let Some((k, due)) = due_rx.recv().await {
        let i = k % n;
        if version == Version::Http2 {
            let Some(mut stream) = h2[i].try_clone() else {
                return Err("an HTTP/2 connection could not be shared".into());
            };
            let (tx, path, body) = (tx.clone(), path.clone(), body.clone());
            tokio::spawn(async move {
                let sent = Instant::now();
                let ok = matches!(stream.post_json(&path, body).await, Ok((200, _)));
                let done = Instant::now();
                let _ = tx.send(Sample { due, sent, done, ok });
            });
        } else if queues[i].send(due).is_err() {
            return Err("a connection worker stopped".into());
        }
    }
    clock.join().map_err(|_| "the schedule thread panicked".to_string())?;
    drop(queues);
    drop(tx);
    let mut conns = h2;
    for worker in workers {
        conns.push(worker.await.map_err(|e| e.to_string())?);
    }
    let mut all = Vec::new();
    while let Some(sample) = rx.recv().await {
        if sample.due >= w.measure_from {
            all.push(sample);
        }
    }
    Ok((all, conns))
}

async fn run(args: RunArgs) -> Result<(), String> {
    let RunArgs {
        addr,
        path,
        client,
        rate,
        seconds,
        warmup_seconds: warmup,
        label,
    } = args;
    let (version, config, body) = client.setup()?;
    let conns = client.connect(addr, &config).await?;
    let start = Instant::now() + Duration::from_millis(200);
    let measure_from = start + Duration::from_secs(warmup);
    let w = Window {
        start,
        measure_from,
        end: measure_from + Duration::from_secs(seconds),
    };
    let load = Load {
        version,
        rate,
        path,
        body,
    };
    let samples = load.run(conns, w).await?.0;
    report(&label, version, client.connections, rate, seconds as f64, &samples, "");
    Ok(())
}

async fn compare(args: CompareArgs) -> Result<(), String> {
    let CompareArgs {
        targets,
        client,
        rate,
        seconds,
        slices,
        warmup_ms,
        turn_warmup_ms,
        steal_cpus,
    } = args;
    let (version, config, body) = client.setup()?;
    let slices = slices.max(1);
    let turn_length = Duration::from_secs(seconds) / slices;
    // Every target's connections are made and warmed up first; they stay open, so that a turn
    // measures answers, never handshakes. A target waits less than the servers' idle timeouts
    // between its turns (the webhook's is 5 s) when turns are short.
    let loads: Vec<Load> = targets
        .iter()
        .map(|t| Load {
            version,
            rate,
            path: t.path.clone(),
            body: body.clone(),
        })
        .collect();
    let mut conns = Vec::new();
    for (t, load) in targets.iter().zip(&loads) {
        let fresh = client.connect(t.addr, &config).await?;
        let start = Instant::now() + Duration::from_millis(20);
        let w = Window {
            start,
            measure_from: start + Duration::from_millis(warmup_ms),
            end: start + Duration::from_millis(warmup_ms),
        };
        conns.push(load.run(fresh, w).await?.1);
    }
    // Each target's samples, turn by turn (one turn a slice).
    let mut samples: Vec<Vec<Vec<Sample>>> = vec![Vec::new(); targets.len()];
    // The host steal of each slice's turns, by target (`None` without `--steal-cpus` or where
    // `/proc/stat` cannot be read). One reading ends a turn and starts the next.
    let mut stolen: Vec<Vec<Option<u64>>> = Vec::with_capacity(slices as usize);
    let mut steal_at = steal_ticks(&steal_cpus);
    for slice in 0..slices as usize {
        let mut slice_stolen = vec![None; targets.len()];
        for k in 0..targets.len() {
            let i = (slice + k) % targets.len();
            let start = Instant::now() + Duration::from_millis(5);
            let measure_from = start + Duration::from_millis(turn_warmup_ms);
            let w = Window {
                start,
                measure_from,
                end: measure_from + turn_length,
            };
            let held = std::mem::take(&mut conns[i]);
            let (got, back) = loads[i].run(held, w).await?;
            let steal_now = steal_ticks(&steal_cpus);
            slice_stolen[i] = steal_at.zip(steal_now).map(|(b, a)| a.saturating_sub(b));
            steal_at = steal_now;
            samples[i].push(got);
            conns[i] = back;
        }
        stolen.push(slice_stolen);
    }
    let measured = turn_length.as_secs_f64() * f64::from(slices);
    let quiet = quiet_slices(&stolen);
    for (i, t) in targets.iter().enumerate() {
        let mut extra = if rate == 0 {
            // Each turn's answered reviews/s.
            let mut turns: Vec<f64> = samples[i]
                .iter()
                .map(|turn| turn.iter().filter(|s| s.ok).count() as f64 / turn_length.as_secs_f64())
                .collect();
            turns.sort_by(f64::total_cmp);
            spread(&turns)
        } else {
            String::new()
        };
        if let Some(ticks) = stolen.iter().map(|s| s[i]).sum::<Option<u64>>() {
            extra.push_str(&format!(" host-steal={}ms", ticks * MS_PER_TICK));
            if rate != 0 {
                extra.push_str(&quiet_figure(&samples[i], &quiet));
            }
        }
        let pooled: Vec<Sample> = samples[i].concat();
        report(&t.label, version, client.connections, rate, measured, &pooled, &extra);
    }
    Ok(())
}

impl ClientArgs {
    /// The protocol, the TLS configuration (trusting only the CA in `--ca`) and the review.
    fn setup(&self) -> Result<(Version, std::sync::Arc<rustls::ClientConfig>, Bytes), String> {
        let version = version_of(self.http);
        let ca_pem = std::fs::read_to_string(&self.ca).map_err(|e| format!("{}: {e}", self.ca.display()))?;
        let body = std::fs::read(&self.body).map_err(|e| format!("{}: {e}", self.body.display()))?;
        let config = client::tls_config(&ca_pem, version).map_err(|e| e.to_string())?;
        Ok((version, config, Bytes::from(body)))
    }

    /// `--connections` (at least one) connections to `addr`, each through its TLS handshake.
    async fn connect(
        &self,
        addr: SocketAddr,
        config: &std::sync::Arc<rustls::ClientConfig>,
    ) -> Result<Vec<Connection>, String> {
        let mut conns = Vec::new();
        for _ in 0..self.connections.max(1) {
            conns.push(
                client::connect(addr, &self.server_name, config.clone(), version_of(self.http))
                    .await
                    .map_err(|e| format!("{addr}: {e}"))?,
            );
        }
        Ok(conns)
    }
}

/// `/proc/stat` counts in USER_HZ ticks, 100 a second on Linux.
const MS_PER_TICK: u64 = 10;

/// The host steal time of `cpus` so far, in `/proc/stat` ticks; `None` where it cannot be
/// read (not Linux) or without CPUs.
fn steal_ticks(cpus: &[usize]) -> Option<u64> {
    if cpus.is_empty() {
        return None;
    }
    steal_of(&std::fs::read_to_string("/proc/stat").ok()?, cpus)
}

/// The steal column (the eighth number) of the `cpuN` lines of `/proc/stat` text for `cpus`,
/// added up; `None` when one of them is missing or malformed.
fn steal_of(stat: &str, cpus: &[usize]) -> Option<u64> {
    cpus.iter()
        .map(|cpu| {
            let name = format!("cpu{cpu}");
            let line = stat
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
            line.split_whitespace().nth(8)?.parse::<u64>().ok()
        })
        .sum()
}

/// Which slices of `compare` the host took no time from, in any target's turn: `stolen` holds
/// each slice's steal ticks by target. A slice with a turn whose steal is unknown is not quiet.
///
/// `/proc/stat` counts steal in 10 ms ticks, so a quiet slice is one where less than a tick was
/// taken from each CPU in each turn: short stalls still fall in it, and on every target alike.
fn quiet_slices(stolen: &[Vec<Option<u64>>]) -> Vec<bool> {
    stolen
        .iter()
        .map(|slice| slice.iter().all(|ticks| *ticks == Some(0)))
        .collect()
}

/// ` quiet-slices=N/M p99-quiet=…ms`: the p99 of a target's `turns` (one a slice) in the quiet
/// slices alone, which are the same slices for every target. It shows the server's own tail
/// where the pooled p99 shows whichever turns a burst of the host's stalls fell on; the pooled
/// p99 stays the figure of record.
fn quiet_figure(turns: &[Vec<Sample>], quiet: &[bool]) -> String {
    let count = quiet.iter().filter(|q| **q).count();
    let mut figure = format!(" quiet-slices={count}/{}", quiet.len());
    if count > 0 {
        let kept: Vec<Sample> = turns
            .iter()
            .zip(quiet)
            .filter(|(_, q)| **q)
            .flat_map(|(t, _)| t.iter().copied())
            .collect();
        figure.push_str(&format!(" p99-quiet={:.3}ms", percentile(&latencies(&kept), 0.99)));
    }
    figure
}

/// The latencies (µs, from when each request was due to its answer) of the answered `samples`,
/// sorted.
fn latencies(samples: &[Sample]) -> Vec<u64> {
    let mut latency: Vec<u64> = samples
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.done.duration_since(s.due).as_micros() as u64)
        .collect();
    latency.sort_unstable();
    latency
}

/// The lowest, median and highest of `compare`'s turns' reviews/s (`turns` sorted).
fn spread(turns: &[f64]) -> String {
    match turns {
        [first, .., last] => format!(
            " turns={} turn-reviews/s={first:.0}/{:.0}/{last:.0}",
            turns.len(),
            turns[turns.len() / 2]
        ),
        _ => String::new(),
    }
}

/// Prints one line of figures for `samples`, measured over `seconds`, then `extra`.
fn report(label: &str, version: Version, connections: usize, rate: u64, seconds: f64, samples: &[Sample], extra: &str) {
    let errors = samples.iter().filter(|s| !s.ok).count();
    let micros = |d: Duration| d.as_micros() as u64;
    let latency = latencies(samples);
    let throughput = latency.len() as f64 / seconds;
    // How late requests went out against the schedule (open loop): the generator's own precision
    // plus any wait for a busy HTTP/1.1 connection.
    let late = if rate == 0 {
        String::new()
    } else {
        let mut late: Vec<u64> = samples.iter().map(|s| micros(s.sent.duration_since(s.due))).collect();
        late.sort_unstable();
        format!(" send-late p99={:.3}ms", percentile(&late, 0.99))
    };
    println!(
        "{label:<28} http/{} conns={connections:<3} offered={:<6} reviews/s={throughput:>9.0} p50={:.3}ms p99={:.3}ms p99.9={:.3}ms errors={errors}{late}{extra}",
        if version == Version::Http2 { "2  " } else { "1.1" },
        if rate == 0 { "max".to_string() } else { rate.to_string() },
        percentile(&latency, 0.50),
        percentile(&latency, 0.99),
        percentile(&latency, 0.999),
    );
}

/// The protocol of `--http`: 2 for HTTP/2, anything else HTTP/1.1.
fn version_of(http: u8) -> Version {
    if http == 2 { Version::Http2 } else { Version::Http1 }
}

/// Runs `task` on a runtime of one thread (the load's core, for `run`) or of tokio's default.
fn block_on(multi_thread: bool, task: impl std::future::Future<Output = Result<(), String>>) -> Result<(), String> {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let rt = builder.enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(task)
}

fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let result = match args.command {
        Command::Gen { dir } => generate(&dir),
        Command::Run(args) => block_on(false, run(args)),
        Command::Compare(args) => block_on(false, compare(args)),
        Command::Flood(args) => block_on(true, flood(args)),
        Command::Trickle(args) => block_on(true, trickle(args)),
        Command::Hold(args) => block_on(true, hold(args)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("webhook-bench-load: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two CPUs' lines of a real `/proc/stat`, the steal column last but two.
    const STAT: &str = "cpu  403319 0 58819 95377 1216 0 19627 3183 0 0
cpu0 202775 0 25622 51622 139 0 9552 1554 0 0
cpu1 201544 0 33197 43755 1077 0 10075 1629 0 0
intr 1 2 3
";

    #[test]
    fn steal_is_the_eighth_column_of_each_cpu_added_up() {
        let cases: [(&[usize], Option<u64>); 5] = [
            (&[0], Some(1554)),
            (&[1], Some(1629)),
            (&[0, 1], Some(3183)),
            (&[2], None),
            (&[0, 2], None),
        ];
        for (cpus, want) in cases {
            assert_eq!(steal_of(STAT, cpus), want, "cpus {cpus:?}");
        }
        assert_eq!(steal_of("cpu0 1 2 3\n", &[0]), None, "a line without a steal column");
        assert_eq!(steal_ticks(&[]), None, "no CPUs, no reading");
    }

    #[test]
    fn a_slice_is_quiet_when_no_turn_of_it_lost_a_tick() {
        // Each slice's steal ticks by target, and which slices are quiet.
        type Case<'a> = (&'a [&'a [Option<u64>]], &'a [bool]);
        let cases: [Case; 5] = [
            (&[&[Some(0), Some(0)], &[Some(0), Some(1)]], &[true, false]),
            (&[&[Some(2), Some(0)]], &[false]),
            (&[&[Some(0), None]], &[false]),
            (&[&[None]], &[false]),
            (&[], &[]),
        ];
        for (stolen, want) in cases {
            let stolen: Vec<Vec<Option<u64>>> = stolen.iter().map(|s| s.to_vec()).collect();
            assert_eq!(quiet_slices(&stolen), want, "{stolen:?}");
        }
    }

    #[test]
    fn the_quiet_p99_is_taken_over_the_quiet_slices_alone() {
        let due = Instant::now();
        let answered = |micros: u64, ok: bool| Sample {
            due,
            sent: due,
            done: due + Duration::from_micros(micros),
            ok,
        };
        // Slice 0 quiet and fast, slice 1 stolen and slow, slice 2 quiet, a little slower, with one
        // failure (not a latency). The top 1% of the quiet slices' 105 answers is slice 2's.
        let turns = vec![
            vec![answered(300, true); 100],
            vec![answered(9_000, true); 100],
            [vec![answered(400, true); 5], vec![answered(50_000, false)]].concat(),
        ];
        let quiet = [true, false, true];
        assert_eq!(quiet_figure(&turns, &quiet), " quiet-slices=2/3 p99-quiet=0.400ms");
        assert_eq!(
            quiet_figure(&turns, &[false; 3]),
            " quiet-slices=0/3",
            "no quiet slice, no figure"
        );
    }
}
