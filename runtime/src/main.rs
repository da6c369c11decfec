//! `smolvm-runtime`: the node agent (DaemonSet). See `--help`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use smolvm_api::types::Endpoint;
use smolvm_certs::ReloadableResolver;
use smolvm_runtime::agent::{Agent, AgentOptions, ClientCa};
use smolvm_runtime::error::{Error, Result};
use smolvm_runtime::host;
use smolvm_runtime::nodeapi::auth::TokenAuth;
use smolvm_runtime::report::{Observation, Reporter, spawn_reporter};
use smolvm_runtime::serving_cert;
use smolvm_runtime::supervisor::{SpawnConfig, SupervisorConfig};

/// Parses `500ms`, `10s`, `2m`, `1h` or a bare number of seconds.
fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number.parse().map_err(|_| format!("invalid duration {text:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        "h" => Ok(Duration::from_secs(n.saturating_mul(3600))),
        _ => Err(format!("invalid duration unit in {text:?} (use ms, s, m or h)")),
    }
}

fn parse_env_pair(text: &str) -> std::result::Result<(String, String), String> {
    text.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {text:?}"))
}

/// The smolvm runtime agent: supervises `smolvm serve`, serves the node API over mTLS and
/// reports this node's SmolVMNode.
#[derive(Debug, Parser)]
#[command(name = "smolvm-runtime", version)]
struct Flags {
    /// Kubernetes Node name (downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Agent state directory; smolvm's state is `<dir>/state`.
    #[arg(long, env = "SMOLVM_RUNTIME_STATE_DIR", default_value = "/var/lib/smolvm")]
    state_dir: PathBuf,
    /// Runtime directory; smolvm's socket is `<dir>/smolvm.sock`.
    #[arg(long, env = "SMOLVM_RUNTIME_RUN_DIR", default_value = "/var/run/smolvm")]
    run_dir: PathBuf,
    /// smolvm's local image directory (for `local:<name>` images). Default `<state-dir>/images`.
    #[arg(long, env = "SMOLVM_RUNTIME_LOCAL_IMAGE_DIR")]
    local_image_dir: Option<PathBuf>,
    /// The smolvm binary.
    #[arg(long, env = "SMOLVM_BIN", default_value = "smolvm")]
    smolvm_bin: PathBuf,
    /// smolvm's `--guest-rollout-port` (loopback; distinct per server on a host).
    #[arg(long, env = "SMOLVM_GUEST_ROLLOUT_PORT", default_value_t = 10081)]
    guest_rollout_port: u16,
    /// Extra environment for `smolvm serve`, KEY=VALUE (repeatable); the agent's own
    /// environment is passed through as well.
    #[arg(long = "smolvm-env", value_parser = parse_env_pair)]
    smolvm_env: Vec<(String, String)>,
    /// Attach to an existing smolvm socket instead of starting `smolvm serve`.
    #[arg(long, env = "SMOLVM_RUNTIME_ATTACH_SOCKET")]
    attach_socket: Option<PathBuf>,
    /// Address the node API binds.
    #[arg(long, env = "SMOLVM_RUNTIME_LISTEN_ADDRESS", default_value = "0.0.0.0")]
    listen_address: IpAddr,
    /// Node API port.
    #[arg(long, env = "SMOLVM_RUNTIME_PORT", default_value_t = 10443)]
    port: u16,
    /// Address reported in the SmolVMNode endpoint (falls back to POD_IP, then NODE_IP).
    #[arg(long, env = "SMOLVM_RUNTIME_ADVERTISE_ADDRESS")]
    advertise_address: Option<String>,
    /// The node's address, where published ports are forwarded to smolvm's loopback listeners
    /// (falls back to NODE_IP; a loopback address turns forwarding off).
    #[arg(long, env = "SMOLVM_RUNTIME_PUBLISH_ADDRESS")]
    publish_address: Option<IpAddr>,
    /// Ops port address (plain HTTP: /healthz, /readyz, /metrics).
    #[arg(long, env = "SMOLVM_RUNTIME_OPS_ADDRESS", default_value = "0.0.0.0:9090")]
    ops_address: SocketAddr,
    /// Bearer token file (the `smolvm-runtime-auth` Secret), re-read on change.
    #[arg(
        long,
        env = "SMOLVM_RUNTIME_TOKEN_FILE",
        default_value = "/etc/smolvm-runtime/auth/token"
    )]
    token_file: PathBuf,
    /// Client CA bundle (the CA ConfigMap's `ca.crt`), re-read on change.
    #[arg(
        long,
        env = "SMOLVM_RUNTIME_CLIENT_CA",
        default_value = "/etc/smolvm-runtime/ca/ca.crt"
    )]
    client_ca: PathBuf,
    /// Serving certificate file (dev/test mode; otherwise a CSR is filed).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Serving key file (with --tls-cert).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Do not talk to Kubernetes (no SmolVMNode reporting; needs --tls-cert/--tls-key).
    #[arg(long)]
    standalone: bool,
    /// Interval of SmolVMNode heartbeats.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    /// CPUs kept back for the host (the kubelet, this agent, other pods), subtracted from the
    /// vCPUs the node offers: `auto` (1 on a host with 2 or more CPUs) or a number.
    #[arg(long, env = "SMOLVM_RUNTIME_RESERVED_CPUS", default_value = "auto", value_parser = host::parse_reserve)]
    reserved_cpus: host::Reserve,
    /// vCPUs the node offers per host CPU (1 to 16; 1 means no overcommit). Memory and storage
    /// are never overcommitted.
    #[arg(long, env = "SMOLVM_RUNTIME_CPU_ALLOCATION_RATIO", default_value = "1", value_parser = host::parse_cpu_allocation_ratio)]
    cpu_allocation_ratio: f64,
    /// Memory (MiB) kept back for the host: `auto` (25% of the first 4 GiB, 20% of the next 4,
    /// 10% of the next 8, 6% of the next 112, 2% of the rest) or a number.
    #[arg(long, env = "SMOLVM_RUNTIME_RESERVED_MEMORY_MIB", default_value = "auto", value_parser = host::parse_reserve)]
    reserved_memory_mib: host::Reserve,
    /// Storage (GiB) reserved for the host.
    #[arg(long, default_value_t = 0)]
    reserved_storage_gib: i64,
    /// The KVM device.
    #[arg(long, default_value = "/dev/kvm")]
    kvm_device: PathBuf,
    /// Log format.
    #[arg(long, default_value = "json", value_parser = ["json", "text"])]
    log_format: String,
}

fn advertise_address(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("POD_IP").ok())
        .or_else(|| std::env::var("NODE_IP").ok())
        .filter(|a| !a.is_empty())
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn bind(addr: SocketAddr, what: &'static str) -> Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr).map_err(|e| Error::Serve {
        what,
        message: format!("bind {addr}: {e}"),
    })
}

fn read(path: &Path, what: &'static str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(what, path, e))
}

async fn run(flags: Flags) -> Result<()> {
    let local_image_dir = flags
        .local_image_dir
        .clone()
        .unwrap_or_else(|| flags.state_dir.join("images"));
    let (socket, spawn) = match &flags.attach_socket {
        Some(socket) => (socket.clone(), None),
        None => (
            flags.run_dir.join("smolvm.sock"),
            Some(SpawnConfig {
                bin: flags.smolvm_bin.clone(),
                state_dir: flags.state_dir.join("state"),
                local_image_dir: local_image_dir.clone(),
                guest_rollout_port: flags.guest_rollout_port,
                env: flags.smolvm_env.clone(),
                log_file: None,
            }),
        ),
    };
    let client = if flags.standalone {
        None
    } else {
        Some(kube::Client::try_default().await?)
    };
    let (resolver, serving_files) = match (&flags.tls_cert, &flags.tls_key, &client) {
        (Some(cert), Some(key), _) => (
            Arc::new(ReloadableResolver::from_pem(
                &read(cert, "reading the serving certificate")?,
                &read(key, "reading the serving key")?,
            )?),
            Some((cert.clone(), key.clone())),
        ),
        (_, _, Some(client)) => {
            let pair = serving_cert::request_serving_cert(
                client.clone(),
                &flags.node_name,
                Duration::from_secs(2),
                Duration::from_secs(600),
            )
            .await?;
            (
                Arc::new(ReloadableResolver::from_pem(&pair.cert_pem, &pair.key_pem)?),
                None,
            )
        }
        _ => {
            return Err(Error::Config("--standalone needs --tls-cert and --tls-key".into()));
        }
    };
    let (auth, _token_watch) = TokenAuth::from_file(flags.token_file.clone(), Duration::from_secs(2))?;
    let agent = Agent::start(AgentOptions {
        node_name: flags.node_name.clone(),
        supervisor: SupervisorConfig::new(socket, spawn),
        local_image_dir: Some(local_image_dir),
        node_api_listener: bind(SocketAddr::new(flags.listen_address, flags.port), "node API")?,
        ops_listener: Some(bind(flags.ops_address, "ops port")?),
        resolver: resolver.clone(),
        serving_files,
        client_ca: ClientCa::File(flags.client_ca.clone()),
        auth,
        file_poll_interval: Duration::from_secs(2),
        workload_records: Some(flags.state_dir.join("operator").join("workloads")),
        publish_address: flags
            .publish_address
            .or_else(|| std::env::var("NODE_IP").ok().and_then(|ip| ip.parse().ok())),
    })
    .await?;

    let mut background = Vec::new();
    if let Some(client) = client {
        if flags.tls_cert.is_none() {
            // Checked every 5 s: a CA rotation waits for this agent's new certificate.
            background.push(serving_cert::spawn_renewal(
                client.clone(),
                flags.node_name.clone(),
                resolver.clone(),
                agent.node_api().client_ca().clone(),
                Duration::from_secs(5),
                Duration::from_secs(30),
            ));
        }
        let address = advertise_address(flags.advertise_address.clone())
            .ok_or_else(|| Error::Config("no endpoint address: set --advertise-address, POD_IP or NODE_IP".into()))?;
        let (reserve_cpus, reserve_memory, reserve_storage) = (
            flags.reserved_cpus,
            flags.reserved_memory_mib,
            flags.reserved_storage_gib,
        );
        let cpu_ratio = flags.cpu_allocation_ratio;
        let status = agent.supervisor().status();
        let identity = agent.identity().clone();
        let state_dir = flags.state_dir.clone();
        let kvm_device = flags.kvm_device.clone();
        let last_capacity = std::sync::Mutex::new(None);
        let port = i32::from(flags.port);
        let client_ca = agent.node_api().client_ca().clone();
        background.push(spawn_reporter(
            Reporter::new(client, flags.node_name.clone()),
            flags.heartbeat_interval,
            move |node_uid| {
                identity.set_node_uid(Some(node_uid.to_string()));
                let runtime = status.borrow().clone();
                let kvm = host::check_kvm(&kvm_device);
                let capacity = match host::host_capacity(&state_dir) {
                    Ok(capacity) => {
                        *last_capacity.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(capacity);
                        capacity
                    }
                    Err(error) => {
                        // Keep reporting the last reading rather than zero; without one, zero
                        // (nothing is placed here) is the safe answer.
                        let last = *last_capacity.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        tracing::warn!(reason = error.reason(), %error, kept_last = last.is_some(), "reading host capacity failed");
                        last.unwrap_or_default()
                    }
                };
                Observation {
                    node_uid: node_uid.to_string(),
                    endpoint: Endpoint {
                        address: address.clone(),
                        port,
                    },
                    internal_ip: None,
                    runtime_version: runtime.version.clone(),
                    runtime_ready: runtime.ready,
                    runtime_message: runtime.message.clone(),
                    kvm_available: kvm.available,
                    kvm_message: kvm.message,
                    capacity,
                    allocatable: host::allocatable(
                        capacity,
                        host::reservations(capacity, reserve_cpus, reserve_memory, reserve_storage),
                        cpu_ratio,
                    ),
                    machines: runtime.ready.then(|| runtime.machines.clone()),
                    serving_certificate: Some(serving_cert::report_current(&resolver, &client_ca)),
                }
            },
        ));
    }

    shutdown_signal().await;
    tracing::info!("shutting down");
    for task in background {
        task.abort();
    }
    agent.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    smolvm_runtime::install_crypto_provider();
    let flags = Flags::parse();
    init_logging(&flags.log_format);
    match run(flags).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, reason = error.reason(), "smolvm-runtime failed");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let cases = [
            ("500ms", Some(Duration::from_millis(500))),
            ("10s", Some(Duration::from_secs(10))),
            ("10", Some(Duration::from_secs(10))),
            ("2m", Some(Duration::from_secs(120))),
            ("1h", Some(Duration::from_secs(3600))),
            ("x", None),
            ("5d", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text).ok(), expected, "{text}");
        }
    }

    #[test]
    fn flags_parse_with_defaults() {
        let flags =
            Flags::try_parse_from(["smolvm-runtime", "--node-name", "n1", "--smolvm-env", "A=b"]).expect("flags");
        assert_eq!(flags.port, 10443);
        assert_eq!(flags.heartbeat_interval, Duration::from_secs(10));
        assert_eq!(flags.smolvm_env, vec![("A".to_string(), "b".to_string())]);
        assert!(Flags::try_parse_from(["smolvm-runtime", "--node-name", "n1", "--tls-cert", "c"]).is_err());
    }
}
