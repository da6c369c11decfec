//! smolvm-webhook: the admission webhook server.

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::{
    Api, Client, Resource,
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, reflector, watcher},
};
use smolvm_api::{
    SmolVM, SmolVMClass, SmolVMNode, SmolVMPool,
    constants::{BRANCHABLE_VALUE, LABEL_BRANCHABLE, LABEL_CLASS},
};
use smolvm_certs::ReloadableResolver;
use smolvm_kit::selfsigned;
use smolvm_webhook::{
    Error, Result,
    cli::{Args, RENAMED, TlsMode},
    listener::serve_tls,
    quota::Quotas,
    reload,
    server::{self, admission_service, serve_ops},
    state::{AppState, ClassStore, PolicyHandle, PoolStore, Sources, StoreCatalog},
};

/// mimalloc, not glibc's malloc: on /mutate under load, 27-28 µs of CPU per review instead of
/// 31-39 µs here (`webhook/bench`), as each review allocates and frees many small strings.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (args, deprecated) = smolvm_kit::cli::parse::<Args>(RENAMED);
    smolvm_kit::log::init(args.log_format);
    smolvm_kit::cli::warn_deprecated(&deprecated);
    // One worker: a current-thread runtime, in which a task woken by its socket is run by the
    // thread that polled the socket, with no hand-off between threads or work-stealing queues.
    let mut builder = match args.workers {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if n > 0 {
                builder.worker_threads(n);
            }
            builder
        }
    };
    builder.enable_all();
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

/// Keeps `writer`'s store current from a watch `stream` (retrying with backoff) and calls
/// `synced` once the first full list is in.
fn reflect<K>(
    what: &'static str,
    stream: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    writer: reflector::store::Writer<K>,
    synced: impl FnOnce() + Send + 'static,
) where
    K: Resource + Clone + Send + Sync + std::fmt::Debug + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let reader = writer.as_reader();
    let reflect = stream
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .for_each(move |event| async move {
            if let Err(e) = event {
                tracing::warn!(cache = what, error = %e, "watch error; retrying");
            }
        });
    tokio::spawn(reflect);
    tokio::spawn(async move {
        if reader.wait_until_ready().await.is_ok() {
            synced();
            tracing::info!(cache = what, "cache synced");
        }
    });
}

/// The writers of the caches the rules read.
struct Writers {
    nodes: reflector::store::Writer<SmolVMNode>,
    classes: reflector::store::Writer<SmolVMClass>,
    members: reflector::store::Writer<PartialObjectMeta<SmolVM>>,
    pools: reflector::store::Writer<SmolVMPool>,
    sources: reflector::store::Writer<SmolVM>,
    quotas: reflector::store::Writer<ResourceQuota>,
}

/// The caches the rules read, all reflectors: SmolVMNodes (rule V5), SmolVMClasses (M3, V12)
/// and SmolVMPools (M4, V14), on which /readyz waits, and the class-labelled SmolVMs' metadata
/// (counted when a class is deleted).
fn start_caches(client: &Client, writers: Writers, state: &AppState) {
    let readiness = state.readiness.clone();
    reflect(
        "smolvmnodes",
        watcher(Api::<SmolVMNode>::all(client.clone()), watcher::Config::default()),
        writers.nodes,
        move || readiness.set_nodes_synced(),
    );
    let readiness = state.readiness.clone();
    reflect(
        "smolvmclasses",
        watcher(Api::<SmolVMClass>::all(client.clone()), watcher::Config::default()),
        writers.classes,
        move || readiness.set_classes_synced(),
    );
    let readiness = state.readiness.clone();
    reflect(
        "smolvmpools",
        watcher(Api::<SmolVMPool>::all(client.clone()), watcher::Config::default()),
        writers.pools,
        move || readiness.set_pools_synced(),
    );
    let readiness = state.readiness.clone();
    reflect(
        "smolvm-branch-sources",
        watcher(
            Api::<SmolVM>::all(client.clone()),
            watcher::Config::default().labels(&format!("{LABEL_BRANCHABLE}={BRANCHABLE_VALUE}")),
        ),
        writers.sources,
        move || readiness.set_sources_synced(),
    );
    if let Some(quotas) = state.quotas.clone() {
        reflect_quotas(client, writers.quotas, quotas, state.readiness.clone());
    }
    reflect(
        "smolvm-class-labels",
        // An Api of PartialObjectMeta asks for metadata only.
        watcher(
            Api::<PartialObjectMeta<SmolVM>>::all(client.clone()),
            watcher::Config::default().labels(LABEL_CLASS),
        ),
        writers.members,
        || {},
    );
}

/// The ResourceQuotas of every namespace (rule V15), on which /readyz waits: which namespaces
/// limit the product's keys is worked out again at each change.
fn reflect_quotas(
    client: &Client,
    writer: reflector::store::Writer<ResourceQuota>,
    quotas: Arc<Quotas>,
    readiness: Arc<smolvm_webhook::state::Readiness>,
) {
    let reader = writer.as_reader();
    let stream = watcher(Api::<ResourceQuota>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(|q| q.metadata.managed_fields = None)
        .reflect(writer);
    let refreshing = quotas.clone();
    tokio::spawn(stream.for_each(move |event| {
        match &event {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => refreshing.refresh(),
            Ok(_) => {}
            Err(e) => tracing::warn!(cache = "resourcequotas", error = %e, "watch error; retrying"),
        }
        std::future::ready(())
    }));
    tokio::spawn(async move {
        if reader.wait_until_ready().await.is_ok() {
            quotas.refresh();
            readiness.set_quotas_synced();
            tracing::info!(cache = "resourcequotas", "cache synced");
        }
    });
}

/// The serving certificate, as --tls-mode says: from files (re-read when they change), or
/// self-signed through the cluster (rotated before it expires).
async fn serving_certificate(
    args: &Args,
    client: Option<Client>,
    state: &AppState,
    interval: Duration,
) -> Result<Arc<ReloadableResolver>> {
    Ok(match args.tls_mode {
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
            let first = selfsigned::bootstrap(&client, &cfg).await?;
            let material = &first.material;
            let resolver = Arc::new(ReloadableResolver::from_pem(&material.cert_pem, &material.key_pem)?);
            let metrics = state.metrics.clone();
            tokio::spawn(selfsigned::rotate_forever(
                client.clone(),
                cfg,
                resolver.clone(),
                move |swapped| metrics.certificate_reloaded(swapped),
                first,
                args.rotation_check_interval.max(Duration::from_secs(10)),
            ));
            resolver
        }
    })
}

/// The server's state under `args` and `policy`: with a cluster, the caches the rules read
/// (started here, /readyz waiting for each) and the quotas' charger; without, none, and ready.
fn app_state(args: &Args, policy: &PolicyHandle, client: Option<&Client>) -> AppState {
    let (nodes, nodes_writer) = reflector::store::<SmolVMNode>();
    let (classes, classes_writer) = reflector::store::<SmolVMClass>();
    let (members, members_writer) = reflector::store::<PartialObjectMeta<SmolVM>>();
    let (pools, pools_writer) = reflector::store::<SmolVMPool>();
    let (sources, sources_writer) = reflector::store::<SmolVM>();
    let (quota_store, quotas_writer) = reflector::store::<ResourceQuota>();
    let state = match client {
        Some(client) => AppState::new(policy.clone(), Arc::new(StoreCatalog(nodes)))
            .with_classes(Arc::new(ClassStore { classes, members }))
            .with_pools(Arc::new(PoolStore(pools)))
            .with_sources(Arc::new(Sources {
                store: Some(sources),
                client: Some(client.clone()),
            }))
            .with_quotas(Arc::new(Quotas::new(
                quota_store,
                smolvm_kit::quota::Charger::new(client.clone(), smolvm_kit::quota::Bounds::default()),
            ))),
        // Without a cluster no class or pool is known: a SmolVM naming one is refused (V12, V14).
        None => AppState::new(policy.clone(), Arc::new(Vec::<SmolVMNode>::new())),
    };
    let mut state = state
        .with_max_concurrent_reviews(args.max_concurrent_reviews)
        .with_max_concurrent_bodies(args.max_concurrent_bodies);
    state.body_limit = args.body_limit;
    state.body_timeout = args.body_timeout.clamp(Duration::from_secs(1), server::REQUEST_TIMEOUT);
    state.body_idle_timeout = args.body_idle_timeout.max(Duration::from_millis(100));
    match client {
        Some(client) => {
            let writers = Writers {
                nodes: nodes_writer,
                classes: classes_writer,
                members: members_writer,
                pools: pools_writer,
                sources: sources_writer,
                quotas: quotas_writer,
            };
            start_caches(client, writers, &state);
        }
        None => {
            state.readiness.set_nodes_synced();
            state.readiness.set_classes_synced();
            state.readiness.set_pools_synced();
            state.readiness.set_sources_synced();
            state.readiness.set_quotas_synced();
        }
    }
    state
}

async fn run(args: Args) -> Result<()> {
    args.check()?;
    // Streams per HTTP/2 connection: as many as reviews at once.
    let streams = u32::try_from(args.max_concurrent_reviews.max(1)).unwrap_or(u32::MAX);
    let listening = args.listening(streams)?;
    let interval = args.reload_interval.max(Duration::from_secs(1));
    let policy = PolicyHandle::new(reload::load_policy(args.policy.as_deref())?);
    let client = if args.without_cluster {
        tracing::warn!(
            "running without a cluster: no SmolVMNode, SmolVMClass or SmolVMPool cache; V5 capacity checks only warn, no class or pool is known"
        );
        None
    } else {
        Some(smolvm_kit::client::client("smolvm-webhook", env!("CARGO_PKG_VERSION")).await?)
    };
    let state = app_state(&args, &policy, client.as_ref());

    if let Some(path) = args.policy.clone() {
        tokio::spawn(reload::watch_policy(path, policy, state.metrics.clone(), interval));
    }

    let resolver = serving_certificate(&args, client, &state, interval).await?;
    state
        .metrics
        .set_certificate_not_after(selfsigned::unix_seconds(resolver.current_not_after()));
    state.readiness.set_tls_loaded();

    let listener = std::net::TcpListener::bind(args.listen).map_err(|source| Error::Serve {
        what: "webhook",
        source,
    })?;
    let ops_listener = tokio::net::TcpListener::bind(args.ops_address)
        .await
        .map_err(|source| Error::Serve { what: "ops", source })?;
    tracing::info!(listen = %args.listen, ops = %args.ops_address, mode = ?args.tls_mode, "serving");

    // A signal stops both listeners; the webhook's then drains its connections.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        smolvm_kit::shutdown::signal().await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let ops = tokio::spawn(serve_ops(ops_listener, state.clone(), stopped(stop_rx.clone())));
    let metrics = state.metrics.clone();
    let result = serve_tls(
        listener,
        admission_service(state),
        resolver,
        stopped(stop_rx),
        listening,
        metrics,
    )
    .await;
    let _ = ops.await;
    result
}
