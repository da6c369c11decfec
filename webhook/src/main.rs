//! smolvm-webhook: the admission webhook server.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, reflector, watcher},
};
use smolvm_api::SmolVMNode;
use smolvm_certs::ReloadableResolver;
use smolvm_webhook::{
    Error, Result,
    cli::{Args, RENAMED, TlsMode},
    reload, selfsigned,
    server::{admission_router, serve_ops, serve_tls},
    state::{AppState, PolicyHandle, StoreCatalog},
};

fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (args, deprecated) = smolvm_kit::cli::parse::<Args>(RENAMED);
    smolvm_kit::log::init(args.log_format);
    smolvm_kit::cli::warn_deprecated(&deprecated);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if args.workers > 0 {
        builder.worker_threads(args.workers);
    }
    let runtime = match builder.build() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(reason = e.reason(), error = %e, "smolvm-webhook stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The SmolVMNode cache for rule V5: a reflector; /readyz waits for its first full list.
fn start_node_cache(
    client: Client,
    reader: reflector::Store<SmolVMNode>,
    writer: reflector::store::Writer<SmolVMNode>,
    state: &AppState,
) {
    let nodes: Api<SmolVMNode> = Api::all(client);
    let reflect = watcher(nodes, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .for_each(|event| async move {
            if let Err(e) = event {
                tracing::warn!(error = %e, "SmolVMNode watch error; retrying");
            }
        });
    tokio::spawn(reflect);
    let readiness = state.readiness.clone();
    tokio::spawn(async move {
        if reader.wait_until_ready().await.is_ok() {
            readiness.set_nodes_synced();
            tracing::info!("SmolVMNode cache synced");
        }
    });
}

async fn run(args: Args) -> Result<()> {
    args.check()?;
    let interval = args.reload_interval.max(Duration::from_secs(1));
    let policy = PolicyHandle::new(reload::load_policy(args.policy.as_deref())?);
    let client = if args.without_cluster {
        tracing::warn!("running without a cluster: no SmolVMNode cache; V5 capacity checks only warn");
        None
    } else {
        Some(Client::try_default().await?)
    };
    let (reader, writer) = reflector::store::<SmolVMNode>();
    let state = match client {
        Some(_) => AppState::new(policy.clone(), Arc::new(StoreCatalog(reader.clone()))),
        None => AppState::new(policy.clone(), Arc::new(Vec::<SmolVMNode>::new())),
    };
    let mut state = state.with_max_concurrent_reviews(args.max_concurrent_reviews);
    state.body_limit = args.body_limit;
    state.body_timeout = args.body_timeout.max(Duration::from_secs(1));
    match &client {
        Some(client) => start_node_cache(client.clone(), reader, writer, &state),
        None => state.readiness.set_nodes_synced(),
    }

    if let Some(path) = args.policy.clone() {
        tokio::spawn(reload::watch_policy(path, policy, state.metrics.clone(), interval));
    }

    let resolver = match args.tls_mode {
        TlsMode::Files => {
            let (cert, key) = args.tls_files()?;
            let (resolver, watched) = reload::resolver_from_files(&cert, &key)?;
            let resolver = Arc::new(resolver);
            tokio::spawn(reload::watch_cert_files(
                watched,
                resolver.clone(),
                state.metrics.clone(),
                interval,
            ));
            resolver
        }
        TlsMode::SelfSigned => {
            let client = client.ok_or_else(|| Error::Config("self-signed mode needs a cluster".into()))?;
            let cfg = args.self_signed();
            let material = selfsigned::bootstrap(&client, &cfg).await?;
            let resolver = Arc::new(ReloadableResolver::from_pem(&material.cert_pem, &material.key_pem)?);
            tokio::spawn(selfsigned::rotate_forever(
                client.clone(),
                cfg,
                resolver.clone(),
                state.metrics.clone(),
                material,
                args.rotation_check_interval.max(Duration::from_secs(10)),
            ));
            resolver
        }
    };
    state
        .metrics
        .set_certificate_not_after(reload::unix_seconds(resolver.current_not_after()));
    state.readiness.set_tls_loaded();

    let listener = std::net::TcpListener::bind(args.listen).map_err(|source| Error::Serve {
        what: "webhook",
        source,
    })?;
    let ops_listener = tokio::net::TcpListener::bind(args.ops_address)
        .await
        .map_err(|source| Error::Serve { what: "ops", source })?;
    tracing::info!(listen = %args.listen, ops = %args.ops_address, mode = ?args.tls_mode, "serving");

    let handle = axum_server::Handle::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    {
        let handle = handle.clone();
        tokio::spawn(async move {
            smolvm_kit::shutdown::signal().await;
            handle.graceful_shutdown(Some(Duration::from_secs(20)));
            let _ = stop_tx.send(true);
        });
    }
    let mut stop_rx2 = stop_rx.clone();
    let ops = tokio::spawn(serve_ops(ops_listener, state.clone(), async move {
        let _ = stop_rx2.wait_for(|s| *s).await;
    }));
    let streams = u32::try_from(state.max_concurrent_reviews).unwrap_or(u32::MAX);
    let result = serve_tls(listener, admission_router(state), resolver, handle, streams).await;
    let _ = ops.await;
    drop(stop_rx);
    result
}
