//! The controller's flags (each also read from a `SMOLVM_CONTROLLER_` environment variable).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use smolvm_kit::cli::{LogFormat, Renamed, parse_duration};

/// The smolvm controller: places SmolVMs on nodes, binds them, drives the node runtimes. One
/// replica leads at a time (a coordination.k8s.io Lease); the others wait as standbys.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "smolvm-controller", version)]
pub struct Flags {
    /// The node API bearer token from a file instead of the Secret (local runs and tests). Without
    /// it the token is read from --runtime-auth-secret, which is created with a random token when
    /// absent and re-read every 30 s, so a replaced token takes effect without a restart.
    #[arg(long, env = "SMOLVM_CONTROLLER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The Secret (in --namespace) holding the node API bearer token under the key `token`.
    #[arg(long, env = "SMOLVM_CONTROLLER_RUNTIME_AUTH_SECRET", default_value = smolvm_api::constants::RUNTIME_AUTH_SECRET)]
    pub runtime_auth_secret: String,
    /// The admission policy file (its runtimeUsernames name who may request runtime
    /// certificates); re-read when it changes.
    #[arg(long, env = "SMOLVM_CONTROLLER_POLICY")]
    pub policy: Option<PathBuf>,
    /// Plain-HTTP address of /healthz, /readyz and /metrics.
    #[arg(long, env = "SMOLVM_CONTROLLER_OPS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub ops_address: SocketAddr,
    /// Log line format.
    #[arg(long, env = "SMOLVM_CONTROLLER_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Namespace of the leader-election Lease and the controller's Secrets.
    #[arg(long, env = "POD_NAMESPACE", default_value = "smolvm-system")]
    pub namespace: String,
    /// This replica's identity.
    #[arg(long, env = "POD_NAME", default_value = "smolvm-controller")]
    pub identity: String,
    /// Heartbeat age after which a node counts as unreachable (40s, 2m, ...).
    #[arg(long, env = "SMOLVM_CONTROLLER_HEARTBEAT_TIMEOUT", default_value = "40s", value_parser = parse_duration)]
    pub heartbeat_timeout: Duration,
    /// The most SmolVM passes in flight at once (controller-runtime's MaxConcurrentReconciles);
    /// passes beyond it wait in the queue, deduplicated. Unbounded, a burst of creates on a busy
    /// API server put every waiting pass in flight with its own request, and the controller's
    /// memory followed the backlog (docs/benchmarks.md).
    #[arg(long, env = "SMOLVM_CONTROLLER_MAX_CONCURRENT_RECONCILES", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,
    /// Slow resync of each SmolVM with its node's runtime.
    #[arg(long, env = "SMOLVM_CONTROLLER_RESYNC_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// How long a machine no SmolVM owns (its SmolVM force-deleted while the node was away) is
    /// kept, counted as used, before it is deleted.
    #[arg(long, env = "SMOLVM_CONTROLLER_ORPHAN_GRACE", default_value = "10m", value_parser = parse_duration)]
    pub orphan_grace: Duration,
    /// How long a ResourceQuota charge whose SmolVM (or pool slot) is not in the caches yet is
    /// kept by the quota recount before it is given back (the write it was made for was refused
    /// after admission, or never made). Longer than any admission chain takes.
    #[arg(long, env = "SMOLVM_CONTROLLER_QUOTA_CHARGE_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub quota_charge_grace: Duration,
    /// How long one warm-pool call to a node (ApplyPool, ResizePool, DeletePool) may take before
    /// it is given up and retried with a backoff. Calls to different nodes run at once, so a
    /// node that hangs delays only its own pools; a source that boots slower than this is
    /// asked again (its start goes on where the node left it).
    #[arg(long, env = "SMOLVM_CONTROLLER_POOL_CALL_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub pool_call_timeout: Duration,
    /// Make a new runtime CA even though SmolVMNodes exist (the recovery after losing the CA
    /// Secret without a backup; each agent re-files its serving certificate when it reads the new
    /// CA). Without it, a missing Secret with nodes present holds the controller, retrying every
    /// 30 s, with a RuntimeCAMissing event on every SmolVMNode.
    #[arg(long, env = "SMOLVM_CONTROLLER_ALLOW_NEW_RUNTIME_CA", default_value_t = false)]
    pub allow_new_runtime_ca: bool,
    /// How often the runtime CA Secret is looked at for a rotation request and a rotation's
    /// progress (at least 1s).
    #[arg(long, env = "SMOLVM_CONTROLLER_RUNTIME_CA_CHECK_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub runtime_ca_check_interval: Duration,
    /// The image of the holder Pods that keep a SmolVM's volumes mounted on its node (the runtime
    /// image, whose `smolvm-runtime hold` sleeps until stopped); read from SMOLVM_CONTROLLER_HOLDER_IMAGE,
    /// the name the deployment shares with the holders' admission policy. Without it a SmolVM
    /// with volumes reports VolumesReady=False and is not created.
    #[arg(long, env = "SMOLVM_CONTROLLER_HOLDER_IMAGE")]
    pub holder_image: Option<String>,
    /// The port of the agents' release hook on their node's loopback, which each holder's preStop
    /// hook calls so that the agent stops its VM before the kubelet unmounts the volumes (the
    /// agents' --release-port).
    #[arg(long, env = "SMOLVM_CONTROLLER_RELEASE_HOOK_PORT", default_value_t = smolvm_api::constants::volumes::DEFAULT_RELEASE_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    pub release_hook_port: u16,
    /// HTTPS address of the access API (subresources.vm.smolvm.dev: logs, exec, files), served
    /// by every replica to the API server's aggregator.
    #[arg(long, env = "SMOLVM_CONTROLLER_ACCESS_ADDRESS", default_value = "0.0.0.0:8443")]
    pub access_address: SocketAddr,
    /// Where the access API's serving certificate comes from; `off` serves no access API.
    #[arg(
        long,
        env = "SMOLVM_CONTROLLER_ACCESS_TLS_MODE",
        value_enum,
        default_value = "self-signed"
    )]
    pub access_tls_mode: AccessTlsMode,
    /// PEM certificate chain of the access API (files mode).
    #[arg(long, env = "SMOLVM_CONTROLLER_ACCESS_TLS_CERT")]
    pub access_tls_cert: Option<PathBuf>,
    /// PEM private key of the access API (files mode).
    #[arg(long, env = "SMOLVM_CONTROLLER_ACCESS_TLS_KEY")]
    pub access_tls_key: Option<PathBuf>,
    /// The Service in front of the access API (its DNS names go into the self-signed certificate).
    #[arg(long, env = "SMOLVM_CONTROLLER_ACCESS_SERVICE", default_value = "smolvm-access")]
    pub access_service: String,
    /// Secret (in --namespace) holding the access API's self-signed CA and serving pair.
    #[arg(long, env = "SMOLVM_CONTROLLER_ACCESS_SECRET", default_value = "smolvm-access-tls")]
    pub access_secret: String,
    /// The APIService whose caBundle gets the self-signed CA.
    #[arg(long, env = "SMOLVM_CONTROLLER_ACCESS_API_SERVICE", default_value = crate::access::API_SERVICE)]
    pub access_api_service: String,
    /// How often the access API's certificate and the API server's front-proxy settings are
    /// looked at again (at least 10s).
    #[arg(long, env = "SMOLVM_CONTROLLER_ACCESS_CHECK_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub access_check_interval: Duration,
    /// Connections the access API holds at once, TLS handshakes and served ones; more are
    /// closed at once, before a byte of TLS is read.
    #[arg(long, env = "SMOLVM_CONTROLLER_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Connections the access API holds at once from one source address (every caller is an API
    /// server, and an interactive exec holds a connection of its own).
    #[arg(long, env = "SMOLVM_CONTROLLER_MAX_CONNECTIONS_PER_SOURCE", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_source: u32,
    /// TLS handshakes the access API runs at once; more are closed at once.
    #[arg(long, env = "SMOLVM_CONTROLLER_MAX_HANDSHAKES", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_handshakes: u32,
    /// TLS handshakes the access API runs at once for one source address, so that sockets from
    /// one address that never finish theirs leave others room.
    #[arg(long, env = "SMOLVM_CONTROLLER_MAX_HANDSHAKES_PER_SOURCE", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_handshakes_per_source: u32,
    /// Time for a TLS handshake on the access API (at least 100ms).
    #[arg(long, env = "SMOLVM_CONTROLLER_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// An HTTP/2 connection to the access API with no request in flight this long is closed
    /// with a GOAWAY (at least 1s); the API server opens a new one when it next calls.
    #[arg(long, env = "SMOLVM_CONTROLLER_HTTP2_IDLE_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub http2_idle_timeout: Duration,
    /// Bytes of request data all the access API's HTTP/2 connections together may hold unread:
    /// each connection's flow-control window is this over --max-connections (at least 65535
    /// bytes each, or the controller refuses to start).
    #[arg(long, env = "SMOLVM_CONTROLLER_HTTP2_BUFFER_BUDGET", default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub http2_buffer_budget: u64,
}

/// Where the access API's serving certificate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AccessTlsMode {
    /// A CA and serving certificate generated once into --access-secret (shared by the
    /// replicas), the CA injected into the APIService, renewed before expiry.
    SelfSigned,
    /// --access-tls-cert and --access-tls-key (a cert-manager Certificate's Secret, with
    /// cert-manager injecting the CA into the APIService); reloaded when they change.
    Files,
    /// No access API.
    Off,
}

impl Flags {
    /// How holder Pods are made (`--holder-image`, empty meaning none, and `--release-hook-port`).
    pub fn holders(&self) -> crate::vm::volumes::Settings {
        crate::vm::volumes::Settings {
            holder_image: self.holder_image.clone().filter(|i| !i.is_empty()),
            release_port: self.release_hook_port,
        }
    }

    /// How the access API is served, or `None` when it is off.
    pub fn access(&self) -> anyhow::Result<Option<crate::access::AccessConfig>> {
        use crate::access::{AccessConfig, ServingTls};
        let tls = match self.access_tls_mode {
            AccessTlsMode::Off => return Ok(None),
            AccessTlsMode::Files => match (&self.access_tls_cert, &self.access_tls_key) {
                (Some(cert), Some(key)) => ServingTls::Files {
                    cert: cert.clone(),
                    key: key.clone(),
                },
                _ => anyhow::bail!("--access-tls-mode files needs --access-tls-cert and --access-tls-key"),
            },
            AccessTlsMode::SelfSigned => ServingTls::SelfSigned(smolvm_kit::selfsigned::SelfSignedConfig {
                namespace: self.namespace.clone(),
                secret_name: self.access_secret.clone(),
                service_name: self.access_service.clone(),
                targets: vec![smolvm_kit::selfsigned::CaBundleTarget::ApiService(
                    self.access_api_service.clone(),
                )],
                manager: smolvm_api::constants::FIELD_MANAGER_CONTROLLER,
                ca_lifetime: Duration::from_secs(10 * 365 * 86_400),
                cert_lifetime: Duration::from_secs(90 * 86_400),
            }),
        };
        let listener = smolvm_kit::limits::ListenerLimits {
            max_connections: self.max_connections as usize,
            max_connections_per_source: self.max_connections_per_source as usize,
            max_handshakes: self.max_handshakes as usize,
            max_handshakes_per_source: self.max_handshakes_per_source as usize,
            handshake_timeout: self.handshake_timeout,
            http2_idle_timeout: self.http2_idle_timeout,
            http2_buffer_budget: usize::try_from(self.http2_buffer_budget).unwrap_or(usize::MAX),
        }
        .bounds()?;
        Ok(Some(AccessConfig {
            address: self.access_address,
            namespace: self.namespace.clone(),
            tls,
            check_interval: self.access_check_interval.max(Duration::from_secs(10)),
            runtime_auth_secret: self.runtime_auth_secret.clone(),
            token_file: self.token_file.clone(),
            listener,
        }))
    }
}

/// The flags and variables renamed when the three binaries took one vocabulary; the old
/// spellings work, with a warning, until the next minor release.
pub const RENAMED: &[Renamed] = &[
    Renamed::new("token-file", "SMOLVM_CONTROLLER_TOKEN_FILE").was_env("RUNTIME_TOKEN_FILE"),
    Renamed::new("runtime-auth-secret", "SMOLVM_CONTROLLER_RUNTIME_AUTH_SECRET").was_env("RUNTIME_AUTH_SECRET"),
    Renamed::new("policy", "SMOLVM_CONTROLLER_POLICY")
        .was_flag("policy-file")
        .was_env("POLICY_FILE"),
    Renamed::new("ops-address", "SMOLVM_CONTROLLER_OPS_ADDRESS")
        .was_flag("ops-addr")
        .was_env("OPS_ADDR"),
    Renamed::new("heartbeat-timeout", "SMOLVM_CONTROLLER_HEARTBEAT_TIMEOUT").was_flag("heartbeat-timeout-secs"),
    Renamed::new("resync-interval", "SMOLVM_CONTROLLER_RESYNC_INTERVAL").was_flag("resync-secs"),
    Renamed::new("orphan-grace", "SMOLVM_CONTROLLER_ORPHAN_GRACE")
        .was_flag("orphan-grace-secs")
        .was_env("SMOLVM_CONTROLLER_ORPHAN_GRACE_SECS"),
    Renamed::new(
        "runtime-ca-check-interval",
        "SMOLVM_CONTROLLER_RUNTIME_CA_CHECK_INTERVAL",
    )
    .was_flag("runtime-ca-check-secs")
    .was_env("SMOLVM_CONTROLLER_RUNTIME_CA_CHECK_SECS"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};
    use smolvm_kit::cli::upgrade_args;

    #[test]
    fn defaults() {
        let flags = Flags::try_parse_from(["smolvm-controller"]).expect("flags");
        assert_eq!(flags.heartbeat_timeout, Duration::from_secs(40));
        assert_eq!(flags.resync_interval, Duration::from_secs(300));
        assert_eq!(flags.max_concurrent_reconciles, 64);
        assert_eq!(flags.orphan_grace, Duration::from_secs(600));
        assert_eq!(flags.quota_charge_grace, Duration::from_secs(30));
        assert_eq!(flags.pool_call_timeout, Duration::from_secs(20));
        assert_eq!(flags.runtime_ca_check_interval, Duration::from_secs(30));
        assert_eq!(flags.log_format, LogFormat::Json);
        assert_eq!(flags.release_hook_port, 10262);
    }

    #[test]
    fn the_access_listener_bounds_come_from_the_flags() {
        let flags = Flags::try_parse_from(["smolvm-controller", "--access-tls-mode", "self-signed"]).expect("flags");
        let access = flags.access().expect("access").expect("served");
        assert_eq!(
            crate::access::limits::Limits::with_listener(access.listener),
            crate::access::limits::Limits::default()
        );
        let flags = Flags::try_parse_from([
            "smolvm-controller",
            "--max-connections=10",
            "--max-handshakes-per-source=2",
            "--http2-idle-timeout=30s",
        ])
        .expect("flags");
        let listener = flags.access().expect("access").expect("served").listener;
        assert_eq!(listener.accept.max_connections, 10);
        assert_eq!(
            listener.accept.max_connections_per_source, 10,
            "a share is at most the whole"
        );
        assert_eq!(listener.accept.max_handshakes_per_source, 2);
        assert_eq!(listener.http2_window, (64 << 20) / 10);
        assert_eq!(listener.http2_idle_timeout, Duration::from_secs(30));
        let tight = Flags::try_parse_from(["smolvm-controller", "--http2-buffer-budget=65535"]).expect("flags");
        let refused = tight.access().map(|_| ()).map_err(|e| e.to_string());
        assert!(
            refused.as_ref().is_err_and(|e| e.contains("--http2-buffer-budget")),
            "{refused:?}"
        );
    }

    #[test]
    fn old_spellings_still_parse() {
        let argv = [
            "smolvm-controller",
            "--policy-file=/p",
            "--ops-addr",
            "127.0.0.1:1",
            "--heartbeat-timeout-secs=7",
            "--resync-secs=30",
            "--orphan-grace-secs=10",
            "--runtime-ca-check-secs=2",
        ];
        let upgraded = upgrade_args(argv.map(Into::into), RENAMED, |_| None);
        assert_eq!(upgraded.warnings.len(), 6, "{:?}", upgraded.warnings);
        let flags = Flags::try_parse_from(upgraded.args).expect("flags");
        assert_eq!(flags.policy, Some(PathBuf::from("/p")));
        assert_eq!(flags.ops_address, "127.0.0.1:1".parse().expect("addr"));
        assert_eq!(flags.heartbeat_timeout, Duration::from_secs(7));
        assert_eq!(flags.resync_interval, Duration::from_secs(30));
        assert_eq!(flags.orphan_grace, Duration::from_secs(10));
        assert_eq!(flags.runtime_ca_check_interval, Duration::from_secs(2));
    }

    #[test]
    fn help_speaks_the_shared_vocabulary() {
        let help = Flags::command().render_long_help().to_string();
        assert_eq!(
            smolvm_kit::cli::help_problems(&help, "SMOLVM_CONTROLLER_", RENAMED),
            Vec::<String>::new()
        );
    }
}
