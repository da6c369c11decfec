//! The lifecycle of a SmolVM, in four steps per pass:
//!
//! 1. **Observe** ([`observe`], before the first call of [`act`]): the SmolVM, its node, its
//!    Service and EndpointSlice, from the caches; for a SmolVM with volumes, its claims, their PVs
//!    and its holder Pod, from the caches too, and its ConfigMaps' and Secrets' existence
//!    ([`volumes::kube::observe`]).
//! 2. **Decide** ([`decide`], pure): the next node call, or the whole outcome of the pass: the
//!    status, the exposure, the events, the annotations to drop and when to look again. Every
//!    phase and condition is chosen there, from [`rules`].
//! 3. **Act** ([`act`]): makes the node call, records its result, and decides again, a bounded
//!    number of times.
//! 4. **Report** ([`status`]): the exposure writes, the volumes' claim and holder writes
//!    ([`volumes::VolumeWrite`]), one status write, the events ([`events`]), the dropped
//!    annotations ([`metadata`], which adds and removes the finalizer too). A pass
//!    writes the SmolVM's status at most three times: the binding (a pass that places the VM goes
//!    on against its node from the object the API server answered), a restart's record before
//!    its stop, then the status. A warm claim (a SmolVM placed where its
//!    pool has a ready slot) is the exception: its one node call is an idempotent lease, so its
//!    binding goes in its status write ([`status::report_binding`]), one write per claim.
//!
//! A pass never acts on a version of the SmolVM that the controller's own writes replaced
//! ([`Superseded`]): the watch brings the newer one, and that one is acted on.
//!
//! A newcomer adding a state (suspend, say) adds its rule to [`rules`], its branch to
//! [`decide::converge`] with table rows in `controller/tests/decide.rs`, and, if it needs a new
//! node call, a [`decide::Call`] variant that [`act`] carries out.

pub mod act;
pub mod branched;
pub mod decide;
pub mod events;
pub mod exposure;
pub mod fetch;
pub mod idle;
pub mod metadata;
pub mod observe;
pub mod pooled;
pub mod rules;
pub mod status;
pub mod volumes;
pub mod workload;

use std::{sync::Arc, time::Duration};

use futures::Stream;
use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    jiff::SignedDuration,
};
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, controller::Action, reflector, reflector::Store, watcher},
};
use smolvm_api::{SmolVM, SmolVMNode};
use smolvm_kit::backoff::{Backoff, Schedule};

use crate::{nodeclient::NodeClient, placement};

/// Errors of a pass. `reason()` is stable, for metrics and conditions.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a call.
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    /// The object lacks something every stored object has.
    #[error("object has no {0}")]
    MissingField(&'static str),
    /// A status or patch could not be serialized.
    #[error("serialization: {0}")]
    Serialize(#[from] serde_json::Error),
}

impl Error {
    /// Stable reason string.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "Conflict",
            Error::Kube(_) => "KubeError",
            Error::MissingField(_) => "MissingField",
            Error::Serialize(_) => "SerializationError",
        }
    }
}

/// An API server error in words, for a condition: a refusal names the permission.
fn describe_kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) if status.code == 403 => format!(
            "the controller lacks a permission ({}); check its ClusterRole (deploy/base/controller/rbac.yaml)",
            status.message
        ),
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// Timings of the reconcile loop.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// A node heartbeat older than this makes the node unreachable.
    pub heartbeat_timeout: SignedDuration,
    /// Slow resync of runtime state for a steady VM.
    pub resync: Duration,
    /// Retry of a VM whose node cannot be reached or that failed to start.
    pub retry: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat_timeout: SignedDuration::from_secs(40),
            resync: Duration::from_secs(300),
            retry: Duration::from_secs(30),
        }
    }
}

/// The caches of the objects the controller makes for SmolVMs (the Services and EndpointSlices
/// labelled `app.kubernetes.io/managed-by=smolvm-controller`) and of what their volumes use
/// (holder Pods, claims, PersistentVolumes); empty ones make a pass read from the API server
/// instead.
#[derive(Clone, Default)]
pub struct Owned {
    /// Services.
    pub services: Option<Store<Service>>,
    /// EndpointSlices.
    pub slices: Option<Store<EndpointSlice>>,
    /// Holder Pods, claims and PersistentVolumes.
    pub volumes: volumes::kube::Caches,
}

/// The SmolVMPools' cache, and its watch to drive (a SmolVM naming a pool reads its pool at
/// placement and at create; the pool keeper's Controller runs on this watch and cache).
pub fn pool_watch(
    client: &Client,
) -> (
    Store<smolvm_api::SmolVMPool>,
    impl Stream<Item = Result<smolvm_api::SmolVMPool, watcher::Error>> + Send + 'static + use<>,
) {
    let (store, writer) = reflector::store::<smolvm_api::SmolVMPool>();
    let events = watcher(
        Api::<smolvm_api::SmolVMPool>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|p| p.metadata.managed_fields = None)
    .reflect(writer)
    .touched_objects();
    (store, events)
}

/// The SmolVMClasses' cache, and its watch to drive (a pool's template takes its class's
/// defaults: a class that changes changes the pool's slots, so its events wake the passes of the
/// pools that take it).
pub fn class_watch(
    client: &Client,
) -> (
    Store<smolvm_api::SmolVMClass>,
    impl Stream<Item = Result<smolvm_api::SmolVMClass, watcher::Error>> + Send + 'static + use<>,
) {
    let (store, writer) = reflector::store::<smolvm_api::SmolVMClass>();
    let events = watcher(
        Api::<smolvm_api::SmolVMClass>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|c| c.metadata.managed_fields = None)
    .reflect(writer)
    .touched_objects();
    (store, events)
}

/// The watches of the Services and EndpointSlices the controller makes for SmolVMs: their caches
/// and the streams that wake their SmolVM's pass when one changes or goes (`Controller::owns_stream`),
/// so a deleted or edited Service is put back within seconds rather than at the next resync; and
/// those of what their volumes use ([`volumes::kube::watches`]).
pub fn owned_watches(
    client: &Client,
) -> (
    Owned,
    impl Stream<Item = Result<Service, watcher::Error>> + Send + 'static,
    impl Stream<Item = Result<EndpointSlice, watcher::Error>> + Send + 'static,
    volumes::kube::Boxed,
) {
    let config = || watcher::Config::default().labels(exposure::OWNED_SELECTOR);
    let (services, service_writer) = reflector::store::<Service>();
    let (slices, slice_writer) = reflector::store::<EndpointSlice>();
    let service_events = watcher(Api::<Service>::all(client.clone()), config())
        .default_backoff()
        .modify(|s| s.metadata.managed_fields = None)
        .reflect(service_writer)
        .touched_objects();
    let slice_events = watcher(Api::<EndpointSlice>::all(client.clone()), config())
        .default_backoff()
        .modify(|s| s.metadata.managed_fields = None)
        .reflect(slice_writer)
        .touched_objects();
    let (volume_caches, volume_events) = volumes::kube::watches(client);
    let owned = Owned {
        services: Some(services),
        slices: Some(slices),
        volumes: volume_caches,
    };
    (owned, service_events, slice_events, volume_events)
}

/// What the reconciler needs.
pub struct Context {
    /// API client.
    pub client: Client,
    /// SmolVMNodes, from a reflector.
    pub nodes: Store<SmolVMNode>,
    /// The SmolVMs, from the controller's own reflector: a branch reads its source here, a
    /// source its branches.
    pub vms: Store<SmolVM>,
    /// The Services and EndpointSlices made for SmolVMs, from reflectors.
    pub owned: Owned,
    /// The SmolVMPools, from a reflector: the pool keeper's Controller is driven by its watch.
    pub pools: Store<smolvm_api::SmolVMPool>,
    /// The SmolVMClasses, from a reflector, for the pools' templates.
    pub classes: Store<smolvm_api::SmolVMClass>,
    /// What is committed on each node.
    pub ledger: placement::Ledger,
    /// Client of the node API.
    pub node_client: NodeClient,
    /// How holder Pods are made for SmolVMs with volumes.
    pub holders: volumes::Settings,
    /// Event sink.
    pub recorder: crate::events::EventSink,
    /// Timings.
    pub timing: Timing,
    /// Placement tunables.
    pub placement: placement::Config,
    /// Metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Consecutive unsettled passes per VM, for their backoff.
    pub unsettled: Unsettled,
    /// Failed starts per VM, for their backoff.
    pub start_failures: StartFailures,
    /// The versions of each VM that the controller's own writes replaced.
    pub superseded: Superseded,
    /// What the controller saw of each machine's use, for idle suspensions (SPEC 2.7); the
    /// SmolVMNode watch feeds it.
    pub use_seen: Arc<idle::UseSeen>,
    /// Wakes the pools' passes ([`PoolsWake`]): a claim that took a ready slot, a node
    /// reporting other pool counts, a node's pool calls ending.
    pub pools_wake: Arc<PoolsWake>,
    /// The namespaces' ResourceQuotas and their charger, for what the controller starts on its
    /// own (a pool's source and slots); `None`: nothing is charged.
    pub quotas: Option<crate::quota::Charging>,
}

/// A pool a node reports: `(name, ready, wanted)`.
type Reported = (String, i32, i32);

/// What wakes the pools' passes and the sweep of their node pools ([`crate::tasks::pool_keeper`]):
/// a node reporting other pool counts ([`PoolsWake::node_seen`]), a claim taking a slot, a node's
/// calls ending ([`PoolsWake::poke`]). Pokes that come before a waiter looks are one wake-up.
#[derive(Debug)]
pub struct PoolsWake {
    pokes: tokio::sync::watch::Sender<()>,
    /// The pools each node last reported.
    seen: std::sync::Mutex<std::collections::HashMap<String, Vec<Reported>>>,
}

impl Default for PoolsWake {
    fn default() -> Self {
        PoolsWake {
            pokes: tokio::sync::watch::Sender::new(()),
            seen: Default::default(),
        }
    }
}

impl PoolsWake {
    /// A pass is wanted soon.
    pub fn poke(&self) {
        self.pokes.send_replace(());
    }

    /// A SmolVMNode was seen: a pass is wanted if the pools it reports changed.
    pub fn node_seen(&self, node: &SmolVMNode) {
        let pools: Vec<Reported> = crate::placement::reported_pools(node)
            .into_iter()
            .map(|(name, (ready, wanted))| (name.to_string(), ready, wanted))
            .collect();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.get(&node.name_any()) != Some(&pools) {
            seen.insert(node.name_any(), pools);
            drop(seen);
            self.poke();
        }
    }

    /// The pokes from now on, one item for those that came since the last was taken.
    pub fn pokes(&self) -> impl futures::Stream<Item = ()> + Send + 'static + use<> {
        futures::stream::unfold(self.pokes.subscribe(), |mut pokes| async move {
            pokes.changed().await.ok()?;
            Some(((), pokes))
        })
    }
}

/// The passes of each VM (by UID) that did not settle in a row, and the wait before the next:
/// 1 s, doubling, at most 30 s, so a runtime that never settles (the machine still on its way,
/// e.g. a runtime that never reports Running) is not hammered.
#[derive(Debug)]
pub struct Unsettled(std::sync::Mutex<Backoff<String>>);

impl Default for Unsettled {
    fn default() -> Self {
        Unsettled(std::sync::Mutex::new(Backoff::new(Self::SCHEDULE)))
    }
}

impl Unsettled {
    /// 1 s doubling to 30 s.
    pub const SCHEDULE: Schedule = Schedule::new(Duration::from_secs(1), Duration::from_secs(30));

    /// One more pass of `uid` did not settle; the wait before the next.
    pub fn bump(&self, uid: &str) -> Duration {
        let mut backoff = self.0.lock().unwrap_or_else(|e| e.into_inner());
        backoff.failed(uid.to_string(), std::time::Instant::now(), ())
    }

    /// `uid` settled (or is gone): its count starts again.
    pub fn reset(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).succeeded(uid);
    }
}

/// The resourceVersions of each VM (by UID) that the controller's own writes replaced, until
/// the watch brings a version it has not replaced. A pass woken by one of them (the watch
/// delivering the binding after the same pass went on to start the machine and write its status,
/// say) would act on what the controller itself already changed: it waits for the newer version,
/// which the watch is bound to bring, since the write it comes from succeeded.
#[derive(Debug, Default)]
pub struct Superseded(std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>);

impl Superseded {
    /// The most versions kept per VM: a pass writes a VM at most three times.
    const KEPT: usize = 8;

    /// A write by the controller replaced version `replaced` of `uid`.
    pub fn replaced(&self, uid: &str, replaced: Option<&str>) {
        let Some(replaced) = replaced else { return };
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let versions = map.entry(uid.to_string()).or_default();
        if versions.len() >= Self::KEPT {
            versions.remove(0);
        }
        versions.push(replaced.to_string());
    }

    /// Whether a pass over version `version` of `uid` would act on a replaced version. A version
    /// not replaced is the newest the watch brought (it delivers in order): the older ones are
    /// forgotten then.
    pub fn is_stale(&self, uid: &str, version: Option<&str>) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(versions) = map.get(uid) else { return false };
        if version.is_some_and(|v| versions.iter().any(|r| r == v)) {
            return true;
        }
        map.remove(uid);
        false
    }

    /// `uid` is gone: nothing of it is kept.
    pub fn forget(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
}

impl Context {
    /// Forgets a VM that is gone or no longer holds a node: its reservation and its counters.
    pub fn forget(&self, uid: &str) {
        self.ledger.release(uid);
        self.unsettled.reset(uid);
        self.start_failures.reset(uid);
        self.superseded.forget(uid);
        self.use_seen
            .forget(&format!("{}{uid}", smolvm_api::constants::MACHINE_NAME_PREFIX));
    }
}

/// The starts that failed in a row, per VM UID and generation, and when the last one did: a
/// start is held back for 10 s after the first failure, doubling to 5 minutes, as the kubelet
/// backs off a crashing container. A new generation (the spec changed) starts again at once.
#[derive(Debug)]
pub struct StartFailures(std::sync::Mutex<Backoff<String, Option<i64>>>);

impl Default for StartFailures {
    fn default() -> Self {
        StartFailures(std::sync::Mutex::new(Backoff::new(Schedule::new(
            Self::FIRST,
            Self::MAX,
        ))))
    }
}

impl StartFailures {
    /// The first hold after a failed start.
    pub const FIRST: Duration = Duration::from_secs(10);
    /// The longest hold.
    pub const MAX: Duration = Duration::from_secs(300);

    /// A start of `uid` at `generation` failed at `at`.
    pub fn failed(&self, uid: &str, generation: Option<i64>, at: std::time::Instant) {
        let mut backoff = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if backoff.get(uid).is_some_and(|last| last.last != generation) {
            backoff.succeeded(uid);
        }
        backoff.failed(uid.to_string(), at, generation);
    }

    /// How long a start of `uid` at `generation` still waits at `now`; `None` when it may go.
    pub fn hold(&self, uid: &str, generation: Option<i64>, now: std::time::Instant) -> Option<Duration> {
        let backoff = self.0.lock().unwrap_or_else(|e| e.into_inner());
        backoff.get(uid).filter(|f| f.last == generation)?;
        backoff.remaining(uid, now)
    }

    /// `uid` ran (or is gone): its failures are forgotten.
    pub fn reset(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).succeeded(uid);
    }
}

/// Reconciles one SmolVM, recording the outcome and duration.
pub async fn reconcile(vm: Arc<SmolVM>, ctx: Arc<Context>) -> Result<Action, Error> {
    use tracing::Instrument;
    let span = tracing::info_span!("reconcile", namespace = %vm.namespace().unwrap_or_default(), name = %vm.name_any());
    let start = std::time::Instant::now();
    let result = act::pass(vm, ctx.clone()).instrument(span).await;
    let label = match &result {
        Ok(_) => "ok",
        Err(e) => e.reason(),
    };
    ctx.metrics.reconciled(label, start.elapsed());
    result
}

/// What the controller does after a failed reconcile.
pub fn error_policy(vm: Arc<SmolVM>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(
        namespace = %vm.namespace().unwrap_or_default(),
        name = %vm.name_any(),
        reason = error.reason(),
        error = %error,
        "reconcile failed"
    );
    match error.reason() {
        "Conflict" => Action::requeue(Duration::from_millis(500)),
        _ => Action::requeue(ctx.timing.retry),
    }
}
