//! The controller process: which tasks run, and when. Every replica runs the lease, the ops
//! server and the access API; the replica holding the lease also runs the runtime CA and its
//! rotation, the CSR signer, the node watch, the Node label mirror, the ledger and orphan
//! collectors and the SmolVM controller ([`vms`]). Each task is one spawn here; what it does lives in its own module.

use std::{future::Future, sync::Arc, time::Duration};

use anyhow::Context as _;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, ResourceQuota, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        events::Reporter,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use smolvm_api::policy::Policy;
use smolvm_api::{SmolVM, SmolVMClass, SmolVMNode, SmolVMPool, constants::FIELD_MANAGER_CONTROLLER};
use tokio::{sync::watch, task::JoinHandle};

use crate::{
    cli::Flags,
    events::EventSink,
    heartbeat::HeartbeatClock,
    metrics::Metrics,
    nodeclient::{BearerToken, ClientSettings, Endpoints, NodeClient},
    pki::{
        SignerError, runtime_auth,
        runtime_ca::{self, CaSet, RuntimeTrust},
    },
    placement::{self, Ledger},
    tasks::{
        self,
        lease::{self, LeaseConfig},
    },
    vm::{self, Context, Timing},
};

/// Runs the controller until SIGTERM, or until this replica loses the lease.
pub async fn run(flags: Flags) -> anyhow::Result<()> {
    let client = smolvm_kit::client::client("smolvm-controller", env!("CARGO_PKG_VERSION"))
        .await
        .context("connecting to the API server")?;
    let (shutdown_tx, shutdown) = watch::channel(false);
    let (leader_tx, leader) = watch::channel(false);
    let lease_task = lease(&client, &flags, leader_tx, shutdown.clone());
    let metrics = Arc::new(Metrics::default());
    let vm_store_slot: tasks::probe::VmStoreSlot = Arc::default();
    let fleet_slot: tasks::probe::FleetSlot = Arc::default();
    ops_server(
        &flags,
        tasks::probe::Probe {
            leader: leader.clone(),
            metrics: metrics.clone(),
            vms: vm_store_slot.clone(),
            fleet: fleet_slot.clone(),
        },
    )
    .await?;
    access_api(&client, &flags, metrics.clone(), shutdown.clone())?;
    shutdown_on_signal(shutdown_tx);
    if !until_leading(leader.clone(), shutdown.clone()).await {
        return Ok(());
    }
    tracing::info!(identity = %flags.identity, "leading; starting the controller");
    let leading = Leading {
        client: client.clone(),
        metrics,
        vm_store_slot,
        fleet_slot,
        shutdown: shutdown.clone(),
    };
    match lead(&flags, leading, leader).await? {
        Ended::BeforeRunning => return Ok(()),
        // Returning ends the signer, the ledger and the watch tasks with the process, before a
        // standby can take over. The pod restarts as a standby.
        Ended::LostLease => {
            tracing::warn!(identity = %flags.identity, "lost the lease: in-flight reconciles, the CSR signer and the ledger tasks are cancelled");
            return Ok(());
        }
        Ended::Stopped => {}
    }
    // Stopping (SIGTERM): the election steps down first, which cancels what was still running
    // above, then releases the Lease. Returning before that write lands would leave the standby
    // waiting for the Lease to expire instead of taking over at once.
    tracing::info!("controller stopped; releasing the lease");
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    Ok(())
}

/// The leader election: `leader` says whether this replica holds the Lease; on shutdown the
/// task releases it.
fn lease(
    client: &Client,
    flags: &Flags,
    leader: watch::Sender<bool>,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(lease::run(
        client.clone(),
        LeaseConfig {
            namespace: flags.namespace.clone(),
            name: "smolvm-controller".into(),
            identity: flags.identity.clone(),
            duration: Duration::from_secs(15),
            renew: Duration::from_secs(5),
        },
        leader,
        shutdown,
    ))
}

/// The ops server (`/healthz`, `/readyz`, `/metrics`), on every replica.
async fn ops_server(flags: &Flags, probe: tasks::probe::Probe) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(flags.ops_address)
        .await
        .with_context(|| format!("binding the ops address {}", flags.ops_address))?;
    tokio::spawn(async move {
        let router = smolvm_kit::ops::router(Arc::new(probe));
        if let Err(error) = smolvm_kit::ops::serve(listener, router, std::future::pending()).await {
            tracing::error!(%error, "ops server failed");
        }
    });
    Ok(())
}

/// The access API, on every replica (the standby too): it waits for the leader's runtime CA.
fn access_api(
    client: &Client,
    flags: &Flags,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Some(access) = flags.access()? else {
        return Ok(());
    };
    let listener = std::net::TcpListener::bind(access.address)
        .with_context(|| format!("binding the access API address {}", access.address))?;
    let client = client.clone();
    tokio::spawn(async move {
        let stopped = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        if let Err(error) = crate::access::run(client, access, listener, metrics, stopped).await {
            tracing::error!(error = format!("{error:#}"), "access API stopped");
        }
    });
    Ok(())
}

/// SIGTERM (a Pod being stopped) or Ctrl-C: stop reconciling and release the Lease, so a
/// standby replica takes over at once instead of waiting for the Lease to expire.
fn shutdown_on_signal(shutdown: watch::Sender<bool>) {
    tokio::spawn(async move {
        smolvm_kit::shutdown::signal().await;
        let _ = shutdown.send(true);
    });
}

/// Waits for leadership; `false` when asked to stop first.
async fn until_leading(mut leader: watch::Receiver<bool>, shutdown: watch::Receiver<bool>) -> bool {
    while !*leader.borrow() {
        if *shutdown.borrow() {
            return false;
        }
        let mut s = shutdown.clone();
        tokio::select! {
            _ = leader.changed() => {}
            _ = s.changed() => {}
        }
    }
    true
}

/// What [`lead`] shares with the tasks every replica runs.
struct Leading {
    client: Client,
    metrics: Arc<Metrics>,
    vm_store_slot: tasks::probe::VmStoreSlot,
    fleet_slot: tasks::probe::FleetSlot,
    shutdown: watch::Receiver<bool>,
}

/// How the leader's work ended.
enum Ended {
    /// Asked to stop while waiting for the runtime CA, before the controller ran.
    BeforeRunning,
    /// The lease was lost: every in-flight reconcile and node call was cancelled at once.
    LostLease,
    /// Asked to stop: in-flight reconciles finished first.
    Stopped,
}

/// How long the leader's work waits, when it ends, for the events still queued to be delivered.
const EVENT_FLUSH: Duration = Duration::from_secs(5);

/// Starts what only the leader runs, then drives the SmolVM controller while this replica
/// holds the lease.
async fn lead(flags: &Flags, leading: Leading, leader: watch::Receiver<bool>) -> anyhow::Result<Ended> {
    let Leading {
        client,
        metrics,
        vm_store_slot,
        fleet_slot,
        shutdown,
    } = leading;
    let events = leader_events(&client, flags);
    let Some((trust, node_client)) = runtime_trust(&client, flags, &events, shutdown.clone()).await? else {
        return Ok(Ended::BeforeRunning);
    };
    let vms_api: Api<SmolVM> = Api::all(client.clone());
    let ledger = seeded_ledger(&vms_api).await?;
    let heartbeat_timeout = k8s_openapi::jiff::SignedDuration::try_from(flags.heartbeat_timeout)
        .context("--heartbeat-timeout is out of range")?;
    // Heartbeats are judged by this controller's clock, from when it saw each one change.
    let liveness = placement::Config::observed(heartbeat_timeout, Arc::new(HeartbeatClock::new()));
    // The SmolVM cache (filled once the controller runs); the node watch reads it to know which
    // VMs a node change concerns.
    let (vm_store, vm_writer) = reflector::store::<SmolVM>();
    // With the wakes of the pools' passes, and what the nodes report of their machines' use.
    let (node_store, wake, (pools_wake, use_seen)) =
        node_watch(&client, vm_store.clone(), liveness.clone(), events.clone()).await?;
    ca_rotation(&client, flags, &trust, &node_store, &liveness, &events);
    // The Nodes' labels onto their SmolVMNodes (a node's agent sets only its own there: V10).
    tokio::spawn(tasks::node_labels::run(client.clone()));
    *fleet_slot.write().unwrap_or_else(|e| e.into_inner()) = Some(tasks::probe::Fleet {
        nodes: node_store.clone(),
        liveness: liveness.clone(),
        trust,
    });
    let (owned, services, slices, volumes) = vm::owned_watches(&client);
    let quota_wake = Arc::new(tokio::sync::Notify::new());
    let (pool_store, class_store, pool_events, class_events) = pool_watches(&client, &quota_wake);
    let (charging, quota_events) = quota_charging(&client);
    // A VM's events are queued, so that its next step never waits for one to be written; one
    // lane per pass allowed in flight, so that delivering them keeps pace with the passes. With
    // 16 lanes, 10,000 VMs created at once filled every lane, and then each pass waited for a
    // lane: the controller ran no faster than its events were written, whatever its concurrency.
    let recorder = events.in_background(usize::from(flags.max_concurrent_reconciles));
    let ctx = Arc::new(Context {
        client,
        nodes: node_store,
        vms: vm_store.clone(),
        owned,
        pools: pool_store,
        classes: class_store,
        ledger,
        node_client,
        holders: flags.holders(),
        recorder: recorder.clone(),
        timing: Timing {
            heartbeat_timeout,
            resync: flags.resync_interval,
            retry: Duration::from_secs(30),
        },
        placement: liveness,
        metrics,
        unsettled: Default::default(),
        start_failures: Default::default(),
        use_seen,
        superseded: Default::default(),
        pools_wake,
        quotas: Some(charging),
    });
    // A branch waiting for its source looks again as soon as the source runs.
    let (branch_tx, branch_wakes) = futures::channel::mpsc::unbounded::<ObjectRef<SmolVM>>();
    let vm_events = vm_events(vms_api, vm_writer, (ctx.clone(), branch_tx), quota_wake.clone());
    quota_recount(&ctx, flags, vm_store.clone(), quota_events, quota_wake);
    keepers(&ctx, flags, &vm_store, pool_events, class_events);
    *vm_store_slot.write().unwrap_or_else(|e| e.into_inner()) = Some(vm_store.clone());
    let owned = OwnedEvents::new(services, slices, volumes);
    let running = vms(
        ctx,
        flags.max_concurrent_reconciles,
        vm_events,
        vm_store,
        futures::stream::select(wake, branch_wakes),
        owned,
        shutdown.clone(),
    );
    Ok(run_while_leading(running, leader, &shutdown, &recorder).await)
}

/// The events the leader publishes, as this replica.
fn leader_events(client: &Client, flags: &Flags) -> EventSink {
    EventSink::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER_CONTROLLER.into(),
            instance: Some(flags.identity.clone()),
        },
    )
}

/// The leader's trust in the runtime agents: the runtime CA (created once, shared by every
/// replica; rotated with an overlap, see runtime_ca), the controller's client certificate for the
/// node API (re-issued at 2/3 of its life), the CSR signer, and the node API client. `None` when
/// asked to stop while waiting for the runtime CA.
async fn runtime_trust(
    client: &Client,
    flags: &Flags,
    events: &EventSink,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Option<(Arc<RuntimeTrust>, NodeClient)>> {
    let Some(cas) = runtime_ca(client, flags, events, shutdown).await? else {
        return Ok(None);
    };
    let trust = RuntimeTrust::new(cas)?;
    tokio::spawn(trust.clone().keep_client_cert_fresh());
    csr_signer(client, flags, trust.clone())?;
    let node_client = node_client(client, flags, &trust).await?;
    Ok(Some((trust, node_client)))
}

/// Drives the SmolVM controller (`running`) while this replica holds the lease, then delivers the
/// events still queued: how the leader's work ended.
async fn run_while_leading(
    running: impl Future<Output = ()>,
    leader: watch::Receiver<bool>,
    shutdown: &watch::Receiver<bool>,
    recorder: &EventSink,
) -> Ended {
    // Lost the lease: cancel every in-flight reconcile and node call now.
    let stopped = lease::while_leading(running, leader).await;
    flush_events(recorder).await;
    if stopped.is_none() && !*shutdown.borrow() {
        Ended::LostLease
    } else {
        Ended::Stopped
    }
}

/// What the VMs' passes published is still true: the events still queued are delivered before
/// the leader's work ends (for at most [`EVENT_FLUSH`]).
async fn flush_events(recorder: &EventSink) {
    if !recorder.flush(EVENT_FLUSH).await {
        tracing::warn!(
            within = ?EVENT_FLUSH,
            "some queued events were not delivered before stopping (the API server did not answer in time)"
        );
    }
}

/// The SmolVMPools' and SmolVMClasses' watches, with their caches: the pool keeper runs on
/// them ([`tasks::pool_keeper`]), and a change to either wakes the quota recount (`quotas`).
#[allow(clippy::type_complexity)]
fn pool_watches(
    client: &Client,
    quotas: &Arc<tokio::sync::Notify>,
) -> (
    Store<SmolVMPool>,
    Store<SmolVMClass>,
    impl Stream<Item = Result<SmolVMPool, watcher::Error>> + Send + 'static + use<>,
    impl Stream<Item = Result<SmolVMClass, watcher::Error>> + Send + 'static + use<>,
) {
    let (pool_store, pools) = vm::pool_watch(client);
    let (class_store, classes) = vm::class_watch(client);
    let (on_pool, on_class) = (quotas.clone(), quotas.clone());
    let pools = pools.inspect(move |_| on_pool.notify_one());
    let classes = classes.inspect(move |_| on_class.notify_one());
    (pool_store, class_store, pools, classes)
}

/// The loops that keep what the SmolVMs' passes leave: the ledger's pruning of gone SmolVMs, the
/// orphan collector, and the pool keeper (the SmolVMPools' Controller).
fn keepers(
    ctx: &Arc<Context>,
    flags: &Flags,
    vms: &Store<SmolVM>,
    pools: impl Stream<Item = Result<SmolVMPool, watcher::Error>> + Send + 'static,
    classes: impl Stream<Item = Result<SmolVMClass, watcher::Error>> + Send + 'static,
) {
    tokio::spawn(tasks::ledger::prune(ctx.clone(), vms.clone(), Duration::from_secs(60)));
    tokio::spawn(tasks::orphans::run(
        ctx.clone(),
        vms.clone(),
        Duration::from_secs(10),
        flags.orphan_grace,
    ));
    tokio::spawn(tasks::pool_keeper::run(
        ctx.clone(),
        tasks::pool_keeper::Settings {
            call_timeout: flags.pool_call_timeout,
            ..Default::default()
        },
        pools,
        classes,
    ));
}

/// The ResourceQuotas' watch, reflected into the store the pool keeper charges against, and the
/// charger of what the controller starts on its own (SPEC 6.3).
fn quota_charging(
    client: &Client,
) -> (
    crate::quota::Charging,
    impl Stream<Item = Result<watcher::Event<ResourceQuota>, watcher::Error>> + Send + 'static + use<>,
) {
    let (quotas, writer) = reflector::store::<ResourceQuota>();
    let events = crate::quota::quota_watch(client, writer);
    let charger = smolvm_kit::quota::Charger::new(client.clone(), smolvm_kit::quota::Bounds::default());
    (crate::quota::Charging { quotas, charger }, events)
}

/// The quota recount (SPEC 6.3): the `vm.smolvm.dev/*` figures of every ResourceQuota naming
/// them, recounted from the SmolVM and pool caches when they change.
fn quota_recount(
    ctx: &Arc<Context>,
    flags: &Flags,
    vms: Store<SmolVM>,
    quotas: impl Stream<Item = Result<watcher::Event<ResourceQuota>, watcher::Error>> + Send + 'static,
    changed: Arc<tokio::sync::Notify>,
) {
    let context = ctx.clone();
    let pools = move || crate::quota::pool_usage(&context.pools.state(), &context.ledger.pool_holdings());
    tokio::spawn(crate::quota::run(
        ctx.client.clone(),
        quotas,
        crate::quota::Inputs {
            vms,
            pools: Box::new(pools),
            changed,
            grace: flags.quota_charge_grace,
        },
    ));
}

/// The runtime CA, made once and shared by every replica. While its Secret is missing with nodes
/// present it is held, not crash-looping: every node hears why, and restoring the Secret is
/// enough to go on. `None` when asked to stop meanwhile.
async fn runtime_ca(
    client: &Client,
    flags: &Flags,
    events: &EventSink,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Option<CaSet>> {
    loop {
        match runtime_ca::ensure_runtime_ca(client.clone(), &flags.namespace, flags.allow_new_runtime_ca).await {
            Ok(cas) => return Ok(Some(cas)),
            Err(error @ SignerError::CaMissing(_)) => {
                tracing::error!(%error, reason = error.reason(), "runtime CA");
                runtime_ca::report_missing_ca(client, events, &error).await;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                    _ = shutdown.changed() => return Ok(None),
                }
            }
            Err(error) => return Err(anyhow::Error::new(error).context("runtime CA")),
        }
    }
}

/// The runtime CA's rotation: begun when asked for or due, finished once every live node serves
/// a certificate from the new CA.
fn ca_rotation(
    client: &Client,
    flags: &Flags,
    trust: &Arc<RuntimeTrust>,
    nodes: &Store<SmolVMNode>,
    liveness: &placement::Config,
    events: &EventSink,
) {
    tokio::spawn(runtime_ca::run_rotation(
        runtime_ca::RotationContext {
            client: client.clone(),
            namespace: flags.namespace.clone(),
            trust: trust.clone(),
            nodes: nodes.clone(),
            liveness: liveness.clone(),
            events: events.clone(),
        },
        flags.runtime_ca_check_interval.max(Duration::from_secs(1)),
    ));
}

/// The CSR signer for the agents' serving certificates, judging with the policy (re-read when
/// its file changes).
fn csr_signer(client: &Client, flags: &Flags, trust: Arc<RuntimeTrust>) -> anyhow::Result<()> {
    let policy: tasks::policy::PolicySlot = Arc::new(std::sync::RwLock::new(match &flags.policy {
        Some(path) => Policy::from_file(path)?,
        None => Policy::default(),
    }));
    if let Some(path) = flags.policy.clone() {
        tasks::policy::spawn_reload(path, policy.clone());
    }
    tokio::spawn(tasks::csr::run(client.clone(), trust, policy));
    Ok(())
}

/// The node API client: the client certificate from the runtime CA, and the bearer token (from
/// its Secret, re-read for a replacement, unless --token-file gives it).
async fn node_client(client: &Client, flags: &Flags, trust: &RuntimeTrust) -> anyhow::Result<NodeClient> {
    let token = BearerToken::new(node_api_token(client, flags).await?);
    if flags.token_file.is_none() {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &flags.namespace);
        tokio::spawn(runtime_auth::refresh(
            secrets,
            flags.runtime_auth_secret.clone(),
            token.clone(),
        ));
    }
    Ok(NodeClient::new(
        ClientSettings::standard(trust.client_tls(), token),
        Endpoints::default(),
    ))
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

/// The placement ledger, seeded with every bound SmolVM before anything is placed.
async fn seeded_ledger(vms: &Api<SmolVM>) -> anyhow::Result<Ledger> {
    let ledger = Ledger::new();
    for vm in vms
        .list(&Default::default())
        .await
        .context("listing SmolVMs to seed the ledger")?
    {
        if let (Some(uid), Some(node)) = (vm.uid(), vm.bound_node()) {
            ledger.observe_vm(&uid, node, &vm);
        }
    }
    Ok(ledger)
}

/// One node watch feeds both the placement cache and the wake-ups of the VMs a node change
/// concerns: only changes placement or health depends on (not the periodic heartbeat), plus
/// heartbeats going stale or coming back, found by a periodic look at the cache. Returns once
/// the SmolVMNode cache is filled.
async fn node_watch(
    client: &Client,
    vm_store: Store<SmolVM>,
    liveness: placement::Config,
    events: EventSink,
) -> anyhow::Result<(
    Store<SmolVMNode>,
    impl Stream<Item = ObjectRef<SmolVM>> + Send + 'static + use<>,
    NodeWakes,
)> {
    // Wakes the pools' passes: a node reporting other pool counts, a claim, a node's calls ending.
    let pools_wake = Arc::new(crate::vm::PoolsWake::default());
    // What the nodes report of their machines' use, and the wakes they ask for (SPEC 2.7).
    let use_seen = Arc::new(crate::vm::idle::UseSeen::default());
    let wakes = (pools_wake.clone(), use_seen.clone());
    let (node_store, node_writer) = reflector::store::<SmolVMNode>();
    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded::<ObjectRef<SmolVM>>();
    let node_events = watcher(Api::<SmolVMNode>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .inspect(move |event| {
            if let Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) = event {
                pools_wake.node_seen(node);
            }
        });
    tokio::spawn(tasks::nodes::watch(
        node_events,
        node_store.clone(),
        vm_store,
        wake_tx,
        liveness,
        (Some(events), Some(use_seen)),
    ));
    anyhow::ensure!(
        crate::store_ready(&node_store).await,
        "the SmolVMNode cache stopped before it was filled"
    );
    Ok((node_store, wake_rx, wakes))
}

/// What the node watch feeds besides the node cache: the pools' passes' wakes, and the machines'
/// use as the controller saw it.
type NodeWakes = (Arc<crate::vm::PoolsWake>, Arc<crate::vm::idle::UseSeen>);

/// The SmolVM watch, feeding the controller's cache and the ledger.
///
/// The cache drops managedFields as objects arrive, but for the previous release's status entry
/// while it is there to take over (none once the controller applied the status): as JSON trees
/// they were most of each cached object's memory. (The controller writes patches and applies,
/// never a cached object whole, so what the cache keeps of them never reaches the server.) A VM that
/// vanishes is never reconciled again (the controller finds nothing in the cache to hand over),
/// so its reservation is released here, from the delete event; a periodic comparison with the
/// cache catches deletes the watch missed while disconnected.
fn vm_events(
    vms: Api<SmolVM>,
    writer: reflector::store::Writer<SmolVM>,
    (ctx, branch_wake): (Arc<Context>, futures::channel::mpsc::UnboundedSender<ObjectRef<SmolVM>>),
    changed: Arc<tokio::sync::Notify>,
) -> impl Stream<Item = Result<SmolVM, watcher::Error>> + Send + 'static {
    watcher(vms, watcher::Config::default())
        .default_backoff()
        // Of the managedFields, only what the status writer needs: whether the previous
        // release's status entry is still there to take over (crate::status_apply).
        .modify(|vm| crate::status_apply::keep_legacy_status_entries(&mut vm.metadata))
        .reflect(writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::Delete(vm)) => {
                if let Some(uid) = vm.uid() {
                    ctx.forget(&uid);
                }
                changed.notify_one();
            }
            // Placement counts every bound VM the watch has seen, at once: a binding written by
            // a previous leader (or any writer) after the seeding list is booked before this
            // replica places anything else on that node, not only once its reconcile runs.
            Ok(watcher::Event::Apply(vm) | watcher::Event::InitApply(vm)) => {
                if let (Some(uid), Some(node)) = (vm.uid(), vm.bound_node()) {
                    ctx.ledger.observe_vm(&uid, node, vm);
                }
                for branch in vm::branched::waiting_on(&ctx, vm) {
                    let _ = branch_wake.unbounded_send(branch);
                }
                changed.notify_one();
            }
            _ => {}
        })
        .touched_objects()
}

/// The watches of the objects SmolVMs own (their Services and EndpointSlices) and of what their
/// volumes use (holder Pods, claims, PersistentVolumes).
pub struct OwnedEvents<S, E> {
    /// The Services' watch events.
    pub services: S,
    /// The EndpointSlices' watch events.
    pub slices: E,
    /// The holder Pods', claims' and PersistentVolumes' watch events.
    pub volumes: VolumeEvents,
}

/// The holder Pods', claims' and PersistentVolumes' watch events.
pub type VolumeEvents = vm::volumes::kube::Boxed;

impl<S, E> OwnedEvents<S, E> {
    /// The watches' events, together.
    pub fn new(services: S, slices: E, volumes: VolumeEvents) -> Self {
        OwnedEvents {
            services,
            slices,
            volumes,
        }
    }
}

/// The SmolVM controller: reconciles each SmolVM on its own changes, on the node changes that
/// concern it and on changes to what it owns, at most `concurrency` at once, until `shutdown`
/// (in-flight reconciles finish while the lease is still ours).
pub fn vms<S, E>(
    ctx: Arc<Context>,
    concurrency: u16,
    vm_events: impl Stream<Item = Result<SmolVM, watcher::Error>> + Send + 'static,
    vm_store: Store<SmolVM>,
    wake: impl Stream<Item = ObjectRef<SmolVM>> + Send + 'static,
    owned: OwnedEvents<S, E>,
    mut shutdown: watch::Receiver<bool>,
) -> impl Future<Output = ()>
where
    S: Stream<Item = Result<Service, watcher::Error>> + Send + 'static,
    E: Stream<Item = Result<EndpointSlice, watcher::Error>> + Send + 'static,
{
    let (claim_vms, volume_vms) = (vm_store.clone(), vm_store.clone());
    Controller::for_stream(vm_events, vm_store)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        // The VMs that node changes concern (see tasks::nodes).
        .reconcile_on(wake)
        // A Service or EndpointSlice of a SmolVM changed or went: its pass puts it back.
        .owns_stream(owned.services)
        .owns_stream(owned.slices)
        // A holder Pod scheduled, mounted, evicted or gone; a claim that appears or binds; a PV
        // bound to a claim: the SmolVMs they concern look again.
        .owns_stream(owned.volumes.holders)
        .watches_stream(owned.volumes.claims, move |claim: PersistentVolumeClaim| {
            let (namespace, name) = (claim.namespace().unwrap_or_default(), claim.name_any());
            vm::volumes::kube::claim_users(&claim_vms, &namespace, &name)
        })
        .watches_stream(owned.volumes.volumes, move |pv: PersistentVolume| {
            vm::volumes::kube::volume_users(&volume_vms, &pv)
        })
        // SIGTERM: let in-flight reconciles finish while the lease is still ours.
        .graceful_shutdown_on(async move {
            let _ = shutdown.changed().await;
        })
        .run(vm::reconcile, vm::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile error");
            }
        })
}
