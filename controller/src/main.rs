//! `smolvm-controller`: places SmolVMs on nodes, binds them, drives the node runtimes, and keeps
//! the finalizers honest. One replica leads at a time (a coordination.k8s.io Lease).

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::{certificates::v1::CertificateSigningRequest, core::v1::Secret};
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        events::Reporter,
        reflector::{self, ObjectRef},
        watcher,
    },
};
use smolvm_api::{SmolVM, SmolVMNode, constants::FIELD_MANAGER_CONTROLLER};
use smolvm_api::{constants::RUNTIME_SIGNER, policy::Policy};
use smolvm_controller::{
    lease::{self, LeaseConfig},
    metrics::Metrics,
    nodeclient::{self, ClientSettings, Endpoints, NodeClient},
    placement::{self, Ledger, Request},
    reconcile::{self, Context, Timing},
    runtime_auth,
    runtime_ca::{self, RuntimeTrust},
    signer,
};
use tokio::sync::watch;

/// Flags (each also read from the environment).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Flags {
    /// The node API bearer token from a file instead of the Secret (local runs and tests). Without
    /// it the token is read from --runtime-auth-secret, which is created with a random token when
    /// absent and re-read every 30 s, so a replaced token takes effect without a restart.
    #[arg(long, env = "RUNTIME_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// The Secret (in --namespace) holding the node API bearer token under the key `token`.
    #[arg(long, env = "RUNTIME_AUTH_SECRET", default_value = smolvm_api::constants::RUNTIME_AUTH_SECRET)]
    runtime_auth_secret: String,
    /// The admission policy file (its runtimeUsernames name who may request runtime certificates).
    #[arg(long, env = "POLICY_FILE")]
    policy_file: Option<PathBuf>,
    /// Address of /healthz and /readyz.
    #[arg(long, env = "OPS_ADDR", default_value = "0.0.0.0:8080")]
    ops_addr: SocketAddr,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "smolvm-system")]
    namespace: String,
    /// This replica's identity.
    #[arg(long, env = "POD_NAME", default_value = "smolvm-controller")]
    identity: String,
    /// Heartbeat age after which a node counts as unreachable, in seconds.
    #[arg(long, default_value_t = 40)]
    heartbeat_timeout_secs: u64,
    /// Slow resync of runtime state, in seconds.
    #[arg(long, default_value_t = 300)]
    resync_secs: u64,
    /// How long a machine no SmolVM owns (its SmolVM force-deleted while the node was away) is
    /// kept, counted as used, before it is deleted, in seconds.
    #[arg(long, env = "SMOLVM_CONTROLLER_ORPHAN_GRACE_SECS", default_value_t = 600)]
    orphan_grace_secs: u64,
    /// Make a new runtime CA even though SmolVMNodes exist (the recovery after losing the CA
    /// Secret without a backup; each agent re-files its serving certificate when it reads the new
    /// CA). Without it, a missing Secret with nodes present holds the controller, retrying every
    /// 30 s, with a RuntimeCAMissing event on every SmolVMNode.
    #[arg(long, env = "SMOLVM_CONTROLLER_ALLOW_NEW_RUNTIME_CA", default_value_t = false)]
    allow_new_runtime_ca: bool,
    /// How often the runtime CA Secret is looked at for a rotation request and a rotation's
    /// progress, in seconds.
    #[arg(long, env = "SMOLVM_CONTROLLER_RUNTIME_CA_CHECK_SECS", default_value_t = 30)]
    runtime_ca_check_secs: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let flags = Flags::parse();
    let client = Client::try_default().await.context("connecting to the API server")?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (leader_tx, mut leader_rx) = watch::channel(false);
    let lease_task = tokio::spawn(lease::run(
        client.clone(),
        LeaseConfig {
            namespace: flags.namespace.clone(),
            name: "smolvm-controller".into(),
            identity: flags.identity.clone(),
            duration: Duration::from_secs(15),
            renew: Duration::from_secs(5),
        },
        leader_tx,
        shutdown_rx.clone(),
    ));
    let metrics = Arc::new(Metrics::default());
    let vm_store_slot: VmStoreSlot = Arc::new(std::sync::RwLock::new(None));
    tokio::spawn(serve_ops(
        flags.ops_addr,
        leader_rx.clone(),
        metrics.clone(),
        vm_store_slot.clone(),
    ));
    // SIGTERM (a Pod being stopped) or Ctrl-C: stop reconciling and release the Lease, so a
    // standby replica takes over at once instead of waiting for the Lease to expire.
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = shutdown_tx.send(true);
    });

    // Wait for leadership before acting.
    while !*leader_rx.borrow() {
        if *shutdown_rx.borrow() {
            return Ok(());
        }
        let mut s = shutdown_rx.clone();
        tokio::select! {
            _ = leader_rx.changed() => {}
            _ = s.changed() => {}
        }
    }
    tracing::info!(identity = %flags.identity, "leading; starting the controller");

    // The runtime CA (created once, shared by every replica; rotated with an overlap, see
    // runtime_ca), the controller's client certificate for the node API (re-issued at 2/3 of its
    // life), and the CSR signer.
    let events = smolvm_controller::events::EventSink::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER_CONTROLLER.into(),
            instance: Some(flags.identity.clone()),
        },
    );
    let cas = loop {
        match runtime_ca::ensure_runtime_ca(client.clone(), &flags.namespace, flags.allow_new_runtime_ca).await {
            Ok(cas) => break cas,
            Err(error @ signer::SignerError::CaMissing(_)) => {
                // Held, not crash-looping: every node hears why, and restoring the Secret is
                // enough to go on.
                tracing::error!(%error, reason = error.reason(), "runtime CA");
                runtime_ca::report_missing_ca(&client, &events, &error).await;
                let mut stop = shutdown_rx.clone();
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                    _ = stop.changed() => return Ok(()),
                }
            }
            Err(error) => return Err(anyhow::Error::new(error).context("runtime CA")),
        }
    };
    let trust = RuntimeTrust::new(cas)?;
    tokio::spawn(trust.clone().keep_client_cert_fresh());
    let policy = Arc::new(std::sync::RwLock::new(match &flags.policy_file {
        Some(path) => Policy::from_file(path)?,
        None => Policy::default(),
    }));
    if let Some(path) = flags.policy_file.clone() {
        tokio::spawn(reload_policy(path, policy.clone()));
    }
    tokio::spawn(run_signer(client.clone(), trust.clone(), policy));
    let token = nodeclient::BearerToken::new(node_api_token(&client, &flags).await?);
    if flags.token_file.is_none() {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &flags.namespace);
        tokio::spawn(runtime_auth::refresh(
            secrets,
            flags.runtime_auth_secret.clone(),
            token.clone(),
        ));
    }
    let node_client = NodeClient::new(
        ClientSettings {
            tls: trust.client_tls(),
            token,
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(300),
        },
        Endpoints::default(),
    );

    let vms: Api<SmolVM> = Api::all(client.clone());
    let nodes_api: Api<SmolVMNode> = Api::all(client.clone());
    let ledger = Ledger::new();
    for vm in vms
        .list(&Default::default())
        .await
        .context("listing SmolVMs to seed the ledger")?
    {
        if let (Some(uid), Some(node)) = (vm.uid(), vm.bound_node()) {
            ledger.observe_bound(&uid, node, &Request::of(&vm));
        }
    }
    let heartbeat_timeout =
        k8s_openapi::jiff::SignedDuration::from_secs(i64::try_from(flags.heartbeat_timeout_secs).unwrap_or(40));
    let (node_store, node_writer) = reflector::store::<SmolVMNode>();
    // The SmolVM cache (filled once the controller runs, below); the node watch reads it to know
    // which VMs a node change concerns.
    let (vm_store, vm_writer) = reflector::store::<SmolVM>();
    // One node watch feeds both the placement cache and the wake-ups of the VMs a node change
    // concerns: only changes placement or health depends on (not the periodic heartbeat), plus
    // heartbeats going stale or coming back, found by a periodic look at the cache.
    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded::<ObjectRef<SmolVM>>();
    let node_events = watcher(nodes_api, watcher::Config::default())
        .default_backoff()
        .reflect(node_writer);
    tokio::spawn(watch_nodes(
        node_events,
        node_store.clone(),
        vm_store.clone(),
        wake_tx,
        heartbeat_timeout,
    ));
    anyhow::ensure!(
        smolvm_controller::store_ready(&node_store).await,
        "the SmolVMNode cache stopped before it was filled"
    );
    tokio::spawn(runtime_ca::run_rotation(
        runtime_ca::RotationContext {
            client: client.clone(),
            namespace: flags.namespace.clone(),
            trust: trust.clone(),
            nodes: node_store.clone(),
            heartbeat_timeout,
            events: events.clone(),
        },
        Duration::from_secs(flags.runtime_ca_check_secs.max(1)),
    ));
    let ctx = Arc::new(Context {
        client: client.clone(),
        nodes: node_store.clone(),
        ledger,
        node_client,
        recorder: events,
        timing: Timing {
            heartbeat_timeout,
            resync: Duration::from_secs(flags.resync_secs),
            retry: Duration::from_secs(30),
        },
        placement: placement::Config { heartbeat_timeout },
        metrics: metrics.clone(),
        unsettled: Default::default(),
    });
    // The SmolVM cache drops managedFields as objects arrive: the controller never reads them,
    // and as JSON trees they were most of each cached object's memory. (A status update built
    // from a cached object then carries no managedFields, which leaves the server's untouched.)
    // A VM that vanishes is never reconciled again (the controller finds nothing in the cache to
    // hand over), so its reservation is released here, from the delete event; a periodic
    // comparison with the cache catches deletes the watch missed while disconnected.
    let on_delete = ctx.clone();
    let vm_events = watcher(vms, watcher::Config::default())
        .default_backoff()
        .modify(|vm| vm.metadata.managed_fields = None)
        .reflect(vm_writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::Delete(vm)) => {
                if let Some(uid) = vm.uid() {
                    on_delete.forget(&uid);
                }
            }
            // Placement counts every bound VM the watch has seen, at once: a binding written by
            // a previous leader (or any writer) after the seeding list is booked before this
            // replica places anything else on that node, not only once its reconcile runs.
            Ok(watcher::Event::Apply(vm) | watcher::Event::InitApply(vm)) => {
                if let (Some(uid), Some(node)) = (vm.uid(), vm.bound_node()) {
                    on_delete.ledger.observe_bound(&uid, node, &Request::of(vm));
                }
            }
            _ => {}
        })
        .touched_objects();
    tokio::spawn(prune_ledger(ctx.clone(), vm_store.clone(), Duration::from_secs(60)));
    tokio::spawn(smolvm_controller::orphans::run(
        ctx.clone(),
        vm_store.clone(),
        Duration::from_secs(10),
        Duration::from_secs(flags.orphan_grace_secs),
    ));
    let controller = Controller::for_stream(vm_events, vm_store.clone());
    *vm_store_slot.write().unwrap_or_else(|e| e.into_inner()) = Some(vm_store.clone());
    let mut stop = shutdown_rx.clone();
    let running = controller
        // The VMs that node changes concern (see watch_nodes).
        .reconcile_on(wake_rx)
        // SIGTERM: let in-flight reconciles finish while the lease is still ours.
        .graceful_shutdown_on(async move {
            let _ = stop.changed().await;
        })
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile error");
            }
        });
    // Lost the lease: cancel every in-flight reconcile and node call now, and leave; returning
    // ends the signer, the ledger and the watch tasks with the process, before a standby can
    // take over. The pod restarts as a standby.
    if lease::while_leading(running, leader_rx.clone()).await.is_none() {
        tracing::warn!(identity = %flags.identity, "lost the lease: in-flight reconciles, the CSR signer and the ledger tasks are cancelled");
        return Ok(());
    }
    tracing::info!("controller stopped");
    // Give the election a moment to release the Lease it holds.
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    Ok(())
}

/// Keeps the SmolVMNode cache and wakes the VMs a node change concerns: the VMs bound to the
/// node and the VMs still waiting for one. The runtime heartbeats every few seconds; a heartbeat
/// alone changes nothing placement or health reads, so it wakes nobody (the slow resync checks
/// the runtimes). A dead runtime sends nothing; the look at the cache every 2 s finds its
/// heartbeat gone stale soon after the timeout, and its VMs then report the node unreachable.
async fn watch_nodes(
    events: impl futures::Stream<Item = Result<watcher::Event<SmolVMNode>, watcher::Error>> + Send,
    nodes: reflector::Store<SmolVMNode>,
    vms: reflector::Store<SmolVM>,
    wake: futures::channel::mpsc::UnboundedSender<ObjectRef<SmolVM>>,
    heartbeat_timeout: k8s_openapi::jiff::SignedDuration,
) {
    let wake_for = |node: &str| {
        for vm in vms.state() {
            if vm.bound_node().is_none_or(|b| b == node) {
                // The receiver is gone only when the controller stopped.
                let _ = wake.unbounded_send(ObjectRef::from_obj(vm.as_ref()));
            }
        }
    };
    let mut tracker = placement::NodeTracker::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events = std::pin::pin!(events);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node))) => {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    if tracker.applied(&node, now, heartbeat_timeout) {
                        wake_for(&node.name_any());
                    }
                }
                Some(Ok(watcher::Event::Delete(node))) => {
                    if tracker.deleted(&node.name_any()) {
                        wake_for(&node.name_any());
                    }
                }
                Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "SmolVMNode watch error"),
                None => return,
            },
            _ = tick.tick() => {
                let now = k8s_openapi::jiff::Timestamp::now();
                let state = nodes.state();
                for name in tracker.tick(state.iter().map(|n| n.as_ref()), now, heartbeat_timeout) {
                    wake_for(&name);
                }
            }
        }
    }
}

/// Every `every`, releases the reservations of VMs no longer in the cache.
async fn prune_ledger(ctx: Arc<reconcile::Context>, vms: reflector::Store<SmolVM>, every: Duration) {
    if !smolvm_controller::store_ready(&vms).await {
        return;
    }
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        // The reserved UIDs first, then the cache: a VM reserved in between is in the cache.
        let reserved = ctx.ledger.reserved_uids();
        let live: std::collections::HashSet<String> = vms.state().iter().filter_map(|vm| vm.uid()).collect();
        for uid in ctx.ledger.release_gone(&reserved, &live) {
            ctx.unsettled.reset(&uid);
            tracing::info!(uid = %uid, "released the reservation of a SmolVM that is gone");
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: shutting down"),
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops the controller gracefully");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The node API token: from --token-file when given, else from the Secret (created when absent).
async fn node_api_token(client: &Client, flags: &Flags) -> anyhow::Result<String> {
    if let Some(path) = &flags.token_file {
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("reading the node API token {}", path.display()))?
            .trim()
            .to_string();
        if token.is_empty() {
            anyhow::bail!("the node API token file {} is empty", path.display());
        }
        return Ok(token);
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &flags.namespace);
    runtime_auth::ensure_token(&secrets, &flags.runtime_auth_secret)
        .await
        .with_context(|| {
            format!(
                "node API token Secret {}/{}",
                flags.namespace, flags.runtime_auth_secret
            )
        })
}

/// Re-reads the policy file every 10 s and swaps in a changed, valid policy; a broken file keeps
/// the previous policy and logs the error, which names the field.
async fn reload_policy(path: PathBuf, slot: Arc<std::sync::RwLock<Policy>>) {
    let mut last = std::fs::read(&path).ok();
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tick.tick().await;
        let Ok(bytes) = std::fs::read(&path) else { continue };
        if last.as_ref() == Some(&bytes) {
            continue;
        }
        last = Some(bytes);
        match Policy::from_file(&path) {
            Ok(policy) => {
                *slot.write().unwrap_or_else(|e| e.into_inner()) = policy;
                tracing::info!(path = %path.display(), "policy reloaded");
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "policy file rejected; keeping the previous policy")
            }
        }
    }
}

/// Approves and signs (or denies) the runtime agents' serving-certificate CSRs, with the CA
/// signing now.
async fn run_signer(client: Client, trust: Arc<RuntimeTrust>, policy: Arc<std::sync::RwLock<Policy>>) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.signerName={RUNTIME_SIGNER}"));
    let mut stream = watcher(api.clone(), config).default_backoff().applied_objects().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(csr) => {
                let policy = policy.read().unwrap_or_else(|e| e.into_inner()).clone();
                if let Err(e) = signer::handle_csr(&api, &nodes, &csr, &trust.signing(), &policy).await {
                    tracing::warn!(csr = %csr.name_any(), error = %e, reason = e.reason(), "CSR handling failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "CSR watch error"),
        }
    }
}

type VmStoreSlot = Arc<std::sync::RwLock<Option<reflector::Store<SmolVM>>>>;

async fn serve_ops(addr: SocketAddr, leader: watch::Receiver<bool>, metrics: Arc<Metrics>, vms: VmStoreSlot) {
    use axum::{Router, http::StatusCode, routing::get};
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let leader = *leader.borrow();
                // Standby replicas are ready too: they serve health and wait for the lease.
                async move { (StatusCode::OK, if leader { "ok (leader)" } else { "ok (standby)" }) }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let store = vms.read().unwrap_or_else(|e| e.into_inner()).clone();
                if let Some(store) = store {
                    let mut counts: std::collections::BTreeMap<&'static str, i64> = Default::default();
                    for vm in store.state() {
                        let phase = vm.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
                        *counts.entry(phase.as_str()).or_default() += 1;
                    }
                    metrics.set_phases(counts);
                }
                let body = metrics.encode();
                async move {
                    (
                        [(
                            "content-type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    )
                }
            }),
        );
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "ops server failed");
            }
        }
        Err(e) => tracing::error!(error = %e, %addr, "cannot bind the ops port"),
    }
}
