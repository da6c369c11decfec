//! The runtime agent's flags (each also read from a `SMOLVM_RUNTIME_` environment variable, or
//! the downward API's `NODE_NAME`, and `SMOLVM_BIN` as smolvm's install layout exports it).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use smolvm_kit::cli::{LogFormat, Renamed, parse_duration};

use crate::host;

/// The smolvm runtime agent: supervises `smolvm serve`, serves the node API over mTLS and
/// reports this node's SmolVMNode.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "smolvm-runtime",
    version,
    after_help = "`smolvm-runtime hold` is the container of a SmolVM's holder Pod: it sleeps until SIGTERM or SIGINT and exits 0."
)]
pub struct Flags {
    /// Kubernetes Node name (downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Agent state directory; smolvm's state is `<dir>/state`.
    #[arg(long, env = "SMOLVM_RUNTIME_STATE_DIR", default_value = "/var/lib/smolvm")]
    pub state_dir: PathBuf,
    /// Runtime directory; smolvm's socket is `<dir>/smolvm.sock`.
    #[arg(long, env = "SMOLVM_RUNTIME_RUN_DIR", default_value = "/var/run/smolvm")]
    pub run_dir: PathBuf,
    /// smolvm's local image directory (for `local:<name>` images). Default `<state-dir>/images`.
    #[arg(long, env = "SMOLVM_RUNTIME_LOCAL_IMAGE_DIR")]
    pub local_image_dir: Option<PathBuf>,
    /// The smolvm binary.
    #[arg(long, env = "SMOLVM_BIN", default_value = "smolvm")]
    pub smolvm_bin: PathBuf,
    /// smolvm's `--guest-rollout-port` (loopback; distinct per server on a host).
    #[arg(long, env = "SMOLVM_RUNTIME_GUEST_ROLLOUT_PORT", default_value_t = 10081)]
    pub guest_rollout_port: u16,
    /// Extra environment for `smolvm serve`, KEY=VALUE (repeatable); the agent's own
    /// environment is passed through as well.
    #[arg(long = "smolvm-env", value_parser = parse_env_pair)]
    pub smolvm_env: Vec<(String, String)>,
    /// Attach to an existing smolvm socket instead of starting `smolvm serve`.
    #[arg(long, env = "SMOLVM_RUNTIME_ATTACH_SOCKET")]
    pub attach_socket: Option<PathBuf>,
    /// Address the node API binds.
    #[arg(long, env = "SMOLVM_RUNTIME_LISTEN_ADDRESS", default_value = "0.0.0.0")]
    pub listen_address: IpAddr,
    /// Node API port.
    #[arg(long, env = "SMOLVM_RUNTIME_PORT", default_value_t = 10443)]
    pub port: u16,
    /// Address reported in the SmolVMNode endpoint (falls back to POD_IP, then NODE_IP).
    #[arg(long, env = "SMOLVM_RUNTIME_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
    /// The node's address, where published ports are forwarded to smolvm's loopback listeners
    /// (falls back to NODE_IP; a loopback address turns forwarding off).
    #[arg(long, env = "SMOLVM_RUNTIME_PUBLISH_ADDRESS")]
    pub publish_address: Option<IpAddr>,
    /// Plain-HTTP address of /healthz, /readyz and /metrics.
    #[arg(long, env = "SMOLVM_RUNTIME_OPS_ADDRESS", default_value = "0.0.0.0:9090")]
    pub ops_address: SocketAddr,
    /// Most concurrent TCP connections per forwarded port; more are closed at once.
    #[arg(long, env = "SMOLVM_RUNTIME_FORWARD_MAX_CONNECTIONS_PER_PORT", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub forward_max_connections_per_port: u32,
    /// Most concurrent forwarded TCP connections and UDP sessions of the agent, all ports
    /// together; lowered to fit the open-files limit less --forward-fd-reserve.
    #[arg(long, env = "SMOLVM_RUNTIME_FORWARD_MAX_CONNECTIONS", default_value_t = 8192, value_parser = clap::value_parser!(u32).range(1..))]
    pub forward_max_connections: u32,
    /// File descriptors the forwarder never uses: kept for the node API, smolvm's socket and
    /// the agent's files (at most half the open-files limit).
    #[arg(long, env = "SMOLVM_RUNTIME_FORWARD_FD_RESERVE", default_value_t = 1024)]
    pub forward_fd_reserve: u64,
    /// A forwarded TCP connection that carries no byte either way for this long is closed.
    #[arg(long, env = "SMOLVM_RUNTIME_FORWARD_IDLE_TIMEOUT", default_value = "1h", value_parser = parse_duration)]
    pub forward_idle_timeout: Duration,
    /// Most TCP connections held per forwarded port while its VM, suspended for idleness, wakes;
    /// more are closed at once (counted as wake_cap).
    #[arg(long, env = "SMOLVM_RUNTIME_FORWARD_MAX_HELD_PER_PORT", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub forward_max_held_per_port: u32,
    /// How long a held connection waits for its VM to wake before it is closed (counted as
    /// wake_timeout).
    #[arg(long, env = "SMOLVM_RUNTIME_FORWARD_HOLD_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub forward_hold_timeout: Duration,
    /// Most concurrent UDP client sessions per forwarded port; datagrams of more are dropped.
    #[arg(long, env = "SMOLVM_RUNTIME_FORWARD_MAX_UDP_SESSIONS_PER_PORT", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub forward_max_udp_sessions_per_port: u32,
    /// Most concurrent UDP client sessions from one source address on a forwarded port.
    #[arg(long, env = "SMOLVM_RUNTIME_FORWARD_MAX_UDP_SESSIONS_PER_SOURCE", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub forward_max_udp_sessions_per_source: u32,
    /// Most exec (one-shot and interactive) and log-follow streams open at once on one machine;
    /// more are answered 429 TooManyStreams.
    #[arg(long, env = "SMOLVM_RUNTIME_MAX_STREAMS_PER_MACHINE", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams_per_machine: u32,
    /// Most exec and log-follow streams open at once on the node, all machines together.
    #[arg(long, env = "SMOLVM_RUNTIME_MAX_STREAMS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams: u32,
    /// Bytes of file uploads the node API holds at once, all callers together (an upload is
    /// held whole until smolvm has it); more are answered 429 TooManyBytes.
    #[arg(long, env = "SMOLVM_RUNTIME_MAX_UPLOAD_BYTES", default_value_t = 256 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_upload_bytes: u64,
    /// Connections the node API holds at once, TLS handshakes and served ones; more are closed
    /// at once, before a byte of TLS is read.
    #[arg(long, env = "SMOLVM_RUNTIME_MAX_CONNECTIONS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Connections the node API holds at once from one source address (the controller's
    /// replicas each hold several: calls, followed logs, interactive execs).
    #[arg(long, env = "SMOLVM_RUNTIME_MAX_CONNECTIONS_PER_SOURCE", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_source: u32,
    /// TLS handshakes the node API runs at once; more are closed at once.
    #[arg(long, env = "SMOLVM_RUNTIME_MAX_HANDSHAKES", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_handshakes: u32,
    /// TLS handshakes the node API runs at once for one source address, so that sockets from
    /// one address that never finish theirs leave others room.
    #[arg(long, env = "SMOLVM_RUNTIME_MAX_HANDSHAKES_PER_SOURCE", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_handshakes_per_source: u32,
    /// Time for a TLS handshake on the node API (at least 100ms).
    #[arg(long, env = "SMOLVM_RUNTIME_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// An HTTP/2 connection to the node API with no request in flight this long is closed with a
    /// GOAWAY (at least 1s); the controller opens a new one when it next calls.
    #[arg(long, env = "SMOLVM_RUNTIME_HTTP2_IDLE_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub http2_idle_timeout: Duration,
    /// Bytes of request data all the node API's HTTP/2 connections together may hold unread:
    /// each connection's flow-control window is this over --max-connections (at least 65535
    /// bytes each, or the agent refuses to start).
    #[arg(long, env = "SMOLVM_RUNTIME_HTTP2_BUFFER_BUDGET", default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub http2_buffer_budget: u64,
    /// Bearer token file (the `smolvm-runtime-auth` Secret), re-read on change.
    #[arg(
        long,
        env = "SMOLVM_RUNTIME_TOKEN_FILE",
        default_value = "/etc/smolvm-runtime/auth/token"
    )]
    pub token_file: PathBuf,
    /// Client CA bundle (the CA ConfigMap's `ca.crt`), re-read on change.
    #[arg(
        long,
        env = "SMOLVM_RUNTIME_CLIENT_CA",
        default_value = "/etc/smolvm-runtime/ca/ca.crt"
    )]
    pub client_ca: PathBuf,
    /// Serving certificate file (dev/test mode; otherwise a CSR is filed).
    #[arg(long, env = "SMOLVM_RUNTIME_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Serving key file (with --tls-cert).
    #[arg(long, env = "SMOLVM_RUNTIME_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Do not talk to Kubernetes (no SmolVMNode reporting; needs --tls-cert/--tls-key).
    #[arg(long, env = "SMOLVM_RUNTIME_STANDALONE")]
    pub standalone: bool,
    /// Interval of SmolVMNode heartbeats (10s, 1m, ...).
    #[arg(long, env = "SMOLVM_RUNTIME_HEARTBEAT_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// CPUs kept back for the host (the kubelet, this agent, other pods), subtracted from the
    /// vCPUs the node offers: `auto` (1 on a host with 2 or more CPUs) or a number.
    #[arg(long, env = "SMOLVM_RUNTIME_RESERVED_CPUS", default_value = "auto", value_parser = host::parse_reserve)]
    pub reserved_cpus: host::Reserve,
    /// vCPUs the node offers per host CPU (1 to 16; 1 means no overcommit). Memory and storage
    /// are never overcommitted.
    #[arg(long, env = "SMOLVM_RUNTIME_CPU_ALLOCATION_RATIO", default_value = "1", value_parser = host::parse_cpu_allocation_ratio)]
    pub cpu_allocation_ratio: f64,
    /// Memory (MiB) kept back for the host: `auto` (25% of the first 4 GiB, 20% of the next 4,
    /// 10% of the next 8, 6% of the next 112, 2% of the rest) or a number.
    #[arg(long, env = "SMOLVM_RUNTIME_RESERVED_MEMORY_MIB", default_value = "auto", value_parser = host::parse_reserve)]
    pub reserved_memory_mib: host::Reserve,
    /// Storage (GiB) reserved for the host.
    #[arg(long, env = "SMOLVM_RUNTIME_RESERVED_STORAGE_GIB", default_value_t = 0)]
    pub reserved_storage_gib: i64,
    /// The KVM device.
    #[arg(long, env = "SMOLVM_RUNTIME_KVM_DEVICE", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
    /// The guest boot check (a canary machine from smolvm's own guest, booted and deleted): `on`
    /// reports GuestBootable and keeps VMs off a node where no guest boots; `off` (for test
    /// harnesses on machines that boot no guest) reports no GuestBootable condition.
    #[arg(long, env = "SMOLVM_RUNTIME_CANARY", value_enum, default_value = "on")]
    pub canary: Switch,
    /// Time between guest boot checks when nothing changes (a host reboot, a smolvm restart or
    /// upgrade, and the annotation vm.smolvm.dev/recheck-boot=true check at once).
    #[arg(long, env = "SMOLVM_RUNTIME_CANARY_INTERVAL", default_value = "30m", value_parser = parse_duration)]
    pub canary_interval: Duration,
    /// Longest a canary boot may take before it counts as failed.
    #[arg(long, env = "SMOLVM_RUNTIME_CANARY_BOOT_TIMEOUT", default_value = "3m", value_parser = parse_duration)]
    pub canary_boot_timeout: Duration,
    /// The admission policy file (the `smolvm-policy` ConfigMap the webhook reads), re-read on
    /// change: the agent refuses to create a machine on a host port it excludes. Without it,
    /// the built-in defaults apply. The agent's own ports are always excluded.
    #[arg(long, env = "SMOLVM_RUNTIME_POLICY")]
    pub policy: Option<PathBuf>,
    /// The kubelet's root directory (its --root-dir) as the agent sees it: a SmolVM's volumes
    /// are found in its holder Pod's `<dir>/pods/<uid>/volumes`. Mount it into the agent with
    /// HostToContainer propagation, so that volumes the kubelet mounts later are seen.
    #[arg(long, env = "SMOLVM_RUNTIME_KUBELET_ROOT_DIR", default_value = crate::volumes::DEFAULT_KUBELET_ROOT)]
    pub kubelet_root_dir: PathBuf,
    /// Port of the release hook on 127.0.0.1, which holder Pods' preStop hooks call (the
    /// controller's --release-hook-port must name the same); no VM may publish it.
    #[arg(long, env = "SMOLVM_RUNTIME_RELEASE_PORT", default_value_t = smolvm_api::constants::volumes::DEFAULT_RELEASE_PORT)]
    pub release_port: u16,
    /// Log line format.
    #[arg(long, env = "SMOLVM_RUNTIME_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// The variables renamed when the three binaries took one vocabulary; the old spellings work,
/// with a warning, until the next minor release.
pub const RENAMED: &[Renamed] =
    &[Renamed::new("guest-rollout-port", "SMOLVM_RUNTIME_GUEST_ROLLOUT_PORT").was_env("SMOLVM_GUEST_ROLLOUT_PORT")];

/// Parses `KEY=VALUE`.
pub fn parse_env_pair(text: &str) -> std::result::Result<(String, String), String> {
    text.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {text:?}"))
}

/// The address reported in the SmolVMNode endpoint: the flag, else `POD_IP`, else `NODE_IP`.
pub fn advertise_address(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("POD_IP").ok())
        .or_else(|| std::env::var("NODE_IP").ok())
        .filter(|a| !a.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn flags_parse_with_defaults() {
        let flags =
            Flags::try_parse_from(["smolvm-runtime", "--node-name", "n1", "--smolvm-env", "A=b"]).expect("flags");
        assert_eq!(flags.port, 10443);
        assert_eq!(flags.heartbeat_interval, Duration::from_secs(10));
        assert_eq!(flags.smolvm_env, vec![("A".to_string(), "b".to_string())]);
        assert_eq!(flags.log_format, LogFormat::Json);
        assert_eq!(flags.kubelet_root_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(flags.release_port, 10262);
        let limits = crate::limits::Limits::from_flags(&flags, Some(1 << 20)).expect("the defaults work");
        assert_eq!(limits, crate::limits::Limits::default());
        let tight = Flags::try_parse_from([
            "smolvm-runtime",
            "--node-name",
            "n1",
            "--http2-buffer-budget",
            "1048576",
        ])
        .expect("flags");
        let refused = crate::limits::Limits::from_flags(&tight, Some(1 << 20)).map(|_| ());
        assert!(
            refused.is_err_and(|e| e.to_string().contains("--http2-buffer-budget")),
            "a budget too small for 256 connections is refused"
        );
        assert!(
            Flags::try_parse_from(["smolvm-runtime", "--node-name", "n1", "--forward-max-connections", "0"]).is_err()
        );
        assert!(Flags::try_parse_from(["smolvm-runtime", "--node-name", "n1", "--tls-cert", "c"]).is_err());
    }

    #[test]
    fn the_old_rollout_port_variable_still_works() {
        let upgraded =
            smolvm_kit::cli::upgrade_args(["smolvm-runtime", "--node-name=n1"].map(Into::into), RENAMED, |name| {
                (name == "SMOLVM_GUEST_ROLLOUT_PORT").then(|| "10099".to_string())
            });
        assert_eq!(upgraded.warnings.len(), 1);
        let flags = Flags::try_parse_from(upgraded.args).expect("flags");
        assert_eq!(flags.guest_rollout_port, 10099);
    }

    #[test]
    fn help_speaks_the_shared_vocabulary() {
        let help = Flags::command().render_long_help().to_string();
        assert_eq!(
            smolvm_kit::cli::help_problems(&help, "SMOLVM_RUNTIME_", RENAMED),
            Vec::<String>::new()
        );
    }
}
