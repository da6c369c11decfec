//! Command-line flags (each with an environment variable fallback).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Parser, ValueEnum};
use smolvm_kit::cli::{LogFormat, Renamed, parse_duration};

use smolvm_kit::selfsigned::{CaBundleTarget, SelfSignedConfig};

use crate::error::{Error, Result};

/// Where the serving certificate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TlsMode {
    /// `--tls-cert` and `--tls-key` files (a cert-manager Certificate's Secret mounted as a
    /// volume); reloaded when they change.
    Files,
    /// A CA and serving certificate generated once into a shared Secret, caBundle injected,
    /// rotated before expiry.
    SelfSigned,
}

/// The smolvm admission webhook: defaults and validates SmolVMs, and validates SmolVMNodes, for
/// the API server, over TLS.
#[derive(Debug, Clone, Parser)]
#[command(name = "smolvm-webhook", version)]
pub struct Args {
    /// HTTPS address of the admission endpoints.
    #[arg(long, env = "SMOLVM_WEBHOOK_LISTEN", default_value = "0.0.0.0:9443")]
    pub listen: SocketAddr,
    /// Plain-HTTP address of /healthz, /readyz and /metrics.
    #[arg(long, env = "SMOLVM_WEBHOOK_OPS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub ops_address: SocketAddr,
    /// Log line format.
    #[arg(long, env = "SMOLVM_WEBHOOK_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Where the serving certificate comes from.
    #[arg(long, env = "SMOLVM_WEBHOOK_TLS_MODE", value_enum, default_value = "files")]
    pub tls_mode: TlsMode,
    /// PEM certificate chain (files mode).
    #[arg(long, env = "SMOLVM_WEBHOOK_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (files mode).
    #[arg(long, env = "SMOLVM_WEBHOOK_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Policy file (YAML); built-in defaults when absent. Reloaded when it changes.
    #[arg(long, env = "SMOLVM_WEBHOOK_POLICY")]
    pub policy: Option<PathBuf>,
    /// How often the policy and certificate files are checked (10s, 1m, ...).
    #[arg(long, env = "SMOLVM_WEBHOOK_RELOAD_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub reload_interval: Duration,
    /// Namespace of the Service and the self-signed Secret.
    #[arg(long, env = "POD_NAMESPACE", default_value = "smolvm-system")]
    pub namespace: String,
    /// The webhook's Service name (its DNS names go into the self-signed certificate).
    #[arg(long, env = "SMOLVM_WEBHOOK_SERVICE", default_value = "smolvm-webhook")]
    pub service_name: String,
    /// Secret holding the self-signed CA and serving pair.
    #[arg(long, env = "SMOLVM_WEBHOOK_SECRET", default_value = "smolvm-webhook-tls")]
    pub secret_name: String,
    /// MutatingWebhookConfiguration to inject the caBundle into (self-signed mode).
    #[arg(
        long,
        env = "SMOLVM_WEBHOOK_MUTATING_CONFIGURATION",
        default_value = "smolvm-webhook"
    )]
    pub mutating_configuration: String,
    /// ValidatingWebhookConfiguration to inject the caBundle into (self-signed mode).
    #[arg(
        long,
        env = "SMOLVM_WEBHOOK_VALIDATING_CONFIGURATION",
        default_value = "smolvm-webhook"
    )]
    pub validating_configuration: String,
    /// Self-signed CA lifetime (at least a day).
    #[arg(long, env = "SMOLVM_WEBHOOK_CA_LIFETIME", default_value = "3650d", value_parser = parse_duration)]
    pub ca_lifetime: Duration,
    /// Self-signed serving certificate lifetime (at least a day; renewed after two thirds).
    #[arg(long, env = "SMOLVM_WEBHOOK_CERT_LIFETIME", default_value = "90d", value_parser = parse_duration)]
    pub cert_lifetime: Duration,
    /// How often the self-signed Secret is re-checked for renewal (at least 10s).
    #[arg(long, env = "SMOLVM_WEBHOOK_ROTATION_CHECK_INTERVAL", default_value = "1h", value_parser = parse_duration)]
    pub rotation_check_interval: Duration,
    /// Largest accepted request body, in bytes.
    #[arg(long, env = "SMOLVM_WEBHOOK_BODY_LIMIT", default_value_t = 1024 * 1024)]
    pub body_limit: usize,
    /// Reviews answered at once (also the HTTP/2 streams per connection); a request beyond them
    /// is shed with 429 and Retry-After, which the API server retries. With `--body-limit`, it
    /// bounds the memory bodies take: keep their product well inside the pod's memory limit.
    #[arg(long, env = "SMOLVM_WEBHOOK_MAX_CONCURRENT_REVIEWS", default_value_t = crate::state::DEFAULT_MAX_CONCURRENT_REVIEWS)]
    pub max_concurrent_reviews: usize,
    /// How long a request body may take to arrive, from the request's start (at least 1s, at
    /// most 15s).
    #[arg(long, env = "SMOLVM_WEBHOOK_BODY_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub body_timeout: Duration,
    /// How long a request body still arriving may go without a byte before the request is
    /// answered 408 (at least 100ms).
    #[arg(long, env = "SMOLVM_WEBHOOK_BODY_IDLE_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub body_idle_timeout: Duration,
    /// Request bodies read at once while they are still arriving (a body all there when read
    /// takes none); a request beyond them is shed with 429 and Retry-After before its body is
    /// read. With `--body-limit`, it bounds the memory slow clients can make the webhook hold.
    #[arg(long, env = "SMOLVM_WEBHOOK_MAX_CONCURRENT_BODIES", default_value_t = crate::state::DEFAULT_MAX_CONCURRENT_BODIES)]
    pub max_concurrent_bodies: usize,
    /// Run without a Kubernetes API server: no SmolVMNode cache (rule V5's capacity checks then
    /// only warn), no SmolVMClasses (a SmolVM naming one is refused), `files` TLS mode only. For
    /// local testing and benchmarks, not for clusters.
    #[arg(long, env = "SMOLVM_WEBHOOK_WITHOUT_CLUSTER", default_value_t = false)]
    pub without_cluster: bool,
    /// Connections the webhook holds at once, TLS handshakes and served ones; more are closed
    /// at once, before a byte of TLS is read.
    #[arg(long, env = "SMOLVM_WEBHOOK_MAX_CONNECTIONS", default_value_t = crate::listener::MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Connections the webhook holds at once from one source address (an API server holds a
    /// few, more only when each has --max-concurrent-reviews streams open).
    #[arg(long, env = "SMOLVM_WEBHOOK_MAX_CONNECTIONS_PER_SOURCE", default_value_t = crate::listener::MAX_CONNECTIONS_PER_SOURCE as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_source: u32,
    /// TLS handshakes the webhook runs at once; more are closed at once.
    #[arg(long, env = "SMOLVM_WEBHOOK_MAX_HANDSHAKES", default_value_t = crate::listener::MAX_HANDSHAKES as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_handshakes: u32,
    /// TLS handshakes the webhook runs at once for one source address, so that sockets from one
    /// address that never finish theirs leave others room.
    #[arg(long, env = "SMOLVM_WEBHOOK_MAX_HANDSHAKES_PER_SOURCE", default_value_t = crate::listener::MAX_HANDSHAKES_PER_SOURCE as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_handshakes_per_source: u32,
    /// Time for a TLS handshake (at least 100ms).
    #[arg(long, env = "SMOLVM_WEBHOOK_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// An HTTP/2 connection with no review in flight this long is closed with a GOAWAY (at
    /// least 1s); the API server opens a new one when it next calls, and closes its own idle
    /// connections after 90s.
    #[arg(long, env = "SMOLVM_WEBHOOK_HTTP2_IDLE_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub http2_idle_timeout: Duration,
    /// Bytes of request data all HTTP/2 connections together may hold unread: each
    /// connection's flow-control window is this over --max-connections (at least 65535 bytes
    /// each, or the webhook refuses to start). With --max-concurrent-bodies x --body-limit, it
    /// bounds the memory clients can make the webhook hold: keep their sum well inside the pod's
    /// memory limit.
    #[arg(long, env = "SMOLVM_WEBHOOK_HTTP2_BUFFER_BUDGET", default_value_t = crate::listener::HTTP2_BUFFER_BUDGET as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub http2_buffer_budget: u64,
    /// Worker threads of the async runtime (0: one per core; 1: a single-threaded runtime).
    #[arg(long, env = "SMOLVM_WEBHOOK_WORKERS", default_value_t = 0)]
    pub workers: usize,
}

const DAY: Duration = Duration::from_secs(86_400);

/// The flags and variables renamed when the three binaries took one vocabulary; the old
/// spellings work, with a warning, until the next minor release.
pub const RENAMED: &[Renamed] = &[
    Renamed::new("ops-address", "SMOLVM_WEBHOOK_OPS_ADDRESS")
        .was_flag("ops-listen")
        .was_env("SMOLVM_WEBHOOK_OPS_LISTEN"),
    Renamed::new("reload-interval", "SMOLVM_WEBHOOK_RELOAD_INTERVAL")
        .was_flag("reload-interval-seconds")
        .was_env("SMOLVM_WEBHOOK_RELOAD_INTERVAL_SECONDS"),
    Renamed::new("ca-lifetime", "SMOLVM_WEBHOOK_CA_LIFETIME")
        .was_flag("ca-days")
        .was_env("SMOLVM_WEBHOOK_CA_DAYS")
        .counting("d"),
    Renamed::new("cert-lifetime", "SMOLVM_WEBHOOK_CERT_LIFETIME")
        .was_flag("cert-days")
        .was_env("SMOLVM_WEBHOOK_CERT_DAYS")
        .counting("d"),
    Renamed::new("rotation-check-interval", "SMOLVM_WEBHOOK_ROTATION_CHECK_INTERVAL")
        .was_flag("rotation-check-seconds")
        .was_env("SMOLVM_WEBHOOK_ROTATION_CHECK_SECONDS"),
    Renamed::new("body-timeout", "SMOLVM_WEBHOOK_BODY_TIMEOUT")
        .was_flag("body-timeout-seconds")
        .was_env("SMOLVM_WEBHOOK_BODY_TIMEOUT_SECONDS"),
];

impl Args {
    /// The certificate and key paths of files mode, checked.
    pub fn tls_files(&self) -> Result<(PathBuf, PathBuf)> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Ok((c.clone(), k.clone())),
            _ => Err(Error::Config("--tls-mode files needs --tls-cert and --tls-key".into())),
        }
    }

    /// Checks flag combinations that cannot work.
    pub fn check(&self) -> Result<()> {
        if self.without_cluster && self.tls_mode == TlsMode::SelfSigned {
            return Err(Error::Config("--without-cluster needs --tls-mode files".into()));
        }
        if self.tls_mode == TlsMode::Files {
            self.tls_files()?;
        }
        Ok(())
    }

    /// The listener's bounds, or the flag that cannot work; `max_streams` streams per HTTP/2
    /// connection.
    pub fn listening(&self, max_streams: u32) -> Result<crate::listener::Listening> {
        let bounds = smolvm_kit::limits::ListenerLimits {
            max_connections: self.max_connections as usize,
            max_connections_per_source: self.max_connections_per_source as usize,
            max_handshakes: self.max_handshakes as usize,
            max_handshakes_per_source: self.max_handshakes_per_source as usize,
            handshake_timeout: self.handshake_timeout,
            http2_idle_timeout: self.http2_idle_timeout,
            http2_buffer_budget: usize::try_from(self.http2_buffer_budget).unwrap_or(usize::MAX),
        }
        .bounds()
        .map_err(|e| match e {
            smolvm_kit::Error::Config(message) => Error::Config(message),
            other => Error::Config(other.to_string()),
        })?;
        Ok(crate::listener::Listening { bounds, max_streams })
    }

    /// The self-signed mode's settings.
    pub fn self_signed(&self) -> SelfSignedConfig {
        SelfSignedConfig {
            namespace: self.namespace.clone(),
            secret_name: self.secret_name.clone(),
            service_name: self.service_name.clone(),
            targets: vec![
                CaBundleTarget::MutatingWebhooks(self.mutating_configuration.clone()),
                CaBundleTarget::ValidatingWebhooks(self.validating_configuration.clone()),
            ],
            manager: "smolvm-webhook",
            ca_lifetime: self.ca_lifetime.max(DAY),
            cert_lifetime: self.cert_lifetime.max(DAY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn help_speaks_the_shared_vocabulary() {
        let help = Args::command().render_long_help().to_string();
        assert_eq!(
            smolvm_kit::cli::help_problems(&help, "SMOLVM_WEBHOOK_", RENAMED),
            Vec::<String>::new()
        );
    }

    #[test]
    fn old_spellings_still_parse() {
        let argv = [
            "w",
            "--ops-listen=127.0.0.1:1",
            "--reload-interval-seconds",
            "2",
            "--ca-days=30",
            "--cert-days=7",
            "--rotation-check-seconds=60",
            "--body-timeout-seconds=3",
        ];
        let upgraded = smolvm_kit::cli::upgrade_args(argv.map(Into::into), RENAMED, |_| None);
        assert_eq!(upgraded.warnings.len(), 6, "{:?}", upgraded.warnings);
        let a = Args::try_parse_from(upgraded.args).expect("flags");
        assert_eq!(a.ops_address, "127.0.0.1:1".parse().expect("addr"));
        assert_eq!(a.reload_interval, Duration::from_secs(2));
        assert_eq!(a.ca_lifetime, 30 * DAY);
        assert_eq!(a.cert_lifetime, 7 * DAY);
        assert_eq!(a.rotation_check_interval, Duration::from_secs(60));
        assert_eq!(a.body_timeout, Duration::from_secs(3));
    }

    #[test]
    fn listener_flags() {
        let a = Args::try_parse_from(["w"]).expect("flags");
        assert_eq!(
            a.listening(32).expect("the defaults work"),
            crate::listener::Listening::defaults(32)
        );
        let a = Args::try_parse_from([
            "w",
            "--max-connections=256",
            "--max-handshakes-per-source=4",
            "--handshake-timeout=2s",
            "--http2-idle-timeout=30s",
        ])
        .expect("flags");
        let listening = a.listening(8).expect("bounds");
        assert_eq!(listening.bounds.accept.max_connections, 256);
        assert_eq!(listening.bounds.accept.max_handshakes_per_source, 4);
        assert_eq!(listening.bounds.accept.handshake_timeout, Duration::from_secs(2));
        assert_eq!(listening.bounds.http2_window, (64 << 20) / 256);
        assert_eq!(listening.bounds.http2_idle_timeout, Duration::from_secs(30));
        let tight = Args::try_parse_from(["w", "--http2-buffer-budget=1048576"]).expect("flags");
        let refused = tight.listening(8).map(|_| ()).map_err(|e| e.to_string());
        assert!(
            refused.as_ref().is_err_and(|e| e.contains("--http2-buffer-budget")),
            "{refused:?}"
        );
        assert!(Args::try_parse_from(["w", "--max-connections=0"]).is_err());
    }

    #[test]
    fn flags() {
        let table: &[(&[&str], Option<TlsMode>, bool)] = &[
            (&["w", "--tls-cert", "c", "--tls-key", "k"], Some(TlsMode::Files), true),
            (&["w"], Some(TlsMode::Files), false),
            (&["w", "--tls-mode", "self-signed"], Some(TlsMode::SelfSigned), false),
            (&["w", "--tls-mode", "cert-manager"], None, false),
            (
                &["w", "--tls-mode", "self-signed", "--without-cluster"],
                Some(TlsMode::SelfSigned),
                false,
            ),
        ];
        for (argv, mode, files_ok) in table {
            let parsed = Args::try_parse_from(*argv);
            assert_eq!(parsed.as_ref().ok().map(|a| a.tls_mode), *mode, "{argv:?}");
            if let Ok(a) = parsed {
                assert_eq!(a.tls_files().is_ok(), *files_ok, "{argv:?}");
                let valid = match a.tls_mode {
                    TlsMode::Files => *files_ok,
                    TlsMode::SelfSigned => !a.without_cluster,
                };
                assert_eq!(a.check().is_ok(), valid, "{argv:?}");
                assert_eq!(a.self_signed().dns_names()[0], "smolvm-webhook");
            }
        }
    }
}
