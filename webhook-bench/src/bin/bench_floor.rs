//! Benchmark-only: the parse-and-echo floor (SPEC section 9). An axum + axum-server + rustls
//! server (hyper for both protocols, as an axum webhook would be), with smolvm-webhook's TLS
//! (same `server_config`, ALPN h2 and http/1.1, TCP_NODELAY on HTTP/2 connections), whose
//! handler only parses the AdmissionReview JSON and echoes the uid. Unlike smolvm-webhook it
//! serves HTTP/2 through hyper rather than on `h2` directly, and sets no header-read, request or
//! body timeouts. Not deployed; used by `webhook/bench/run.sh`.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use clap::Parser;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:9444")]
    listen: SocketAddr,
    #[arg(long)]
    cert: PathBuf,
    #[arg(long)]
    key: PathBuf,
    #[arg(long, default_value_t = 1)]
    workers: usize,
}

fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let run = async {
        let cert = std::fs::read_to_string(&args.cert).map_err(|e| e.to_string())?;
        let key = std::fs::read_to_string(&args.key).map_err(|e| e.to_string())?;
        let resolver = Arc::new(smolvm_certs::ReloadableResolver::from_pem(&cert, &key).map_err(|e| e.to_string())?);
        let config = smolvm_certs::server_config(resolver).map_err(|e| e.to_string())?;
        let app = smolvm_webhook_bench::support::floor_router();
        // TCP_NODELAY on HTTP/2 connections, as smolvm-webhook sets it.
        axum_server::bind_rustls(
            args.listen,
            axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config)),
        )
        .map(smolvm_webhook_bench::support::H2NoDelay)
        .serve(app.into_make_service())
        .await
        .map_err(|e| e.to_string())
    };
    // As smolvm-webhook builds its runtime: one worker is a current-thread runtime.
    let runtime = match args.workers {
        0 | 1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    match runtime.map_err(|e| e.to_string()).and_then(|r| r.block_on(run)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("webhook-bench-floor: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
