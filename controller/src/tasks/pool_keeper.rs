//! The pool keeper: a kube-runtime `Controller` over the SmolVMPools ([`run`]). Each pool's
//! pass plans it as data ([`crate::pools`]), acts, then reports:
//! - the ledger books its source (a hard hold, never taken) and each node's ready slots (soft
//!   holds: spare room) before the node is asked ([`crate::placement::Ledger::book_pool`]); then
//!   the node API's ResizePool (slots given back), ApplyPool and DeletePool run, each node's calls
//!   in order and one batch at a time, different nodes at once, each call within
//!   `--pool-call-timeout`, so a node that hangs delays only its own pools (a node whose calls
//!   still run is left out of a pass; when they end, the pools are woken);
//! - the pool's status ([`status`]) is written by server-side apply when it says something new.
//!
//! A pool's pass runs when the pool changes, when a SmolVMClass its template may take changes
//! (the classes' cache's watch), when the pools are woken ([`crate::vm::PoolsWake`]: a node
//! reports other pool counts, a claim took a slot, a node's calls ended), and at least every
//! [`EVERY`]; never more often than every [`MIN_GAP`]. Pools are kept one at a time, so their
//! bookings in the ledger are made in order, as one pass over them all made them.
//!
//! A deleted pool is never reconciled: the node pools no SmolVMPool names any more
//! ([`crate::pools::orphans`]) are deleted by a sweep ([`sweeps`]), run at each wake-up and pool
//! change and at least every [`EVERY`]. The sweep and the passes take turns and share which
//! nodes' calls still run, so each node's calls stay in order.
//!
//! A node whose ApplyPool failed is asked again after a backoff (10 s doubling to 5 minutes),
//! as a failed start is: a source that does not boot takes smolvm tens of seconds each time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    api::Patch,
    runtime::{
        Controller,
        controller::{Action, Config},
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use smolvm_api::{
    NodeResources, SmolVM, SmolVMClass, SmolVMNode, SmolVMPool,
    nodeapi::{ErrorCode, PoolSpec},
    pool::SmolVMPoolStatus,
};

use crate::placement::{self, Request, reported_pools as reported, times};
use crate::pools::{Keep, Plan, Start, orphans, plan, slot_vm, status};
use crate::status_apply;
use crate::vm::{Context, Error};

/// The longest a pool waits for a pass when nothing wakes it; the longest between two sweeps.
pub const EVERY: Duration = Duration::from_secs(30);

/// The shortest time between two passes of a pool (and two sweeps): a burst of wake-ups
/// (claims, every node's report) makes one pass, and a pool's status is written at most this
/// often.
pub const MIN_GAP: Duration = Duration::from_secs(1);

/// The default of `--pool-call-timeout`: how long one pool call to a node may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// The first wait after a failed ApplyPool on a node.
pub const RETRY_FIRST: Duration = Duration::from_secs(10);
/// The longest wait.
pub const RETRY_MAX: Duration = Duration::from_secs(300);

/// The wait before a pass whose status write failed is run again.
const RETRY_PASS: Duration = Duration::from_secs(5);

/// The retries of ApplyPool, per `(node, node pool)`, each with its last failure's message.
#[derive(Debug)]
struct Backoff(smolvm_kit::backoff::Backoff<(String, String), String>);

impl Default for Backoff {
    fn default() -> Self {
        Backoff(smolvm_kit::backoff::Backoff::new(smolvm_kit::backoff::Schedule::new(
            RETRY_FIRST,
            RETRY_MAX,
        )))
    }
}

impl Backoff {
    /// Whether `key` may be tried at `now`.
    fn due(&self, key: &(String, String), now: Instant) -> bool {
        self.0.due(key, now)
    }

    fn failed(&mut self, key: (String, String), message: String, now: Instant) {
        self.0.failed(key, now, message);
    }

    fn succeeded(&mut self, key: &(String, String)) {
        self.0.succeeded(key);
    }

    /// Keeps the retries of the `(node, node pool)`s `keep` says.
    fn retain(&mut self, mut keep: impl FnMut(&str, &str) -> bool) {
        self.0.retain(|(node, pool)| keep(node, pool));
    }

    /// The last failure's message on each node, for the node pool `name`.
    fn failures(&self, name: &str) -> BTreeMap<String, String> {
        self.0
            .iter()
            .filter(|((_, pool), _)| pool == name)
            .map(|((node, _), failures)| (node.clone(), failures.last.clone()))
            .collect()
    }
}

/// The pool keeper's tunables.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The longest wait between two passes of a pool, and between two sweeps ([`EVERY`]).
    pub every: Duration,
    /// How long one pool call to a node may take (`--pool-call-timeout`, [`CALL_TIMEOUT`]).
    pub call_timeout: Duration,
    /// The shortest time between two passes of a pool, and between two sweeps ([`MIN_GAP`]).
    pub min_gap: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            every: EVERY,
            call_timeout: CALL_TIMEOUT,
            min_gap: MIN_GAP,
        }
    }
}

/// The pools' Controller's context: what the passes and the sweep share with the nodes' calls
/// they start.
struct Keeper {
    ctx: Arc<Context>,
    settings: Settings,
    /// Held by a pass and by the sweep: they take turns, so a node left out of a pass (its
    /// calls run) is still left out when the pass starts its calls.
    turn: tokio::sync::Mutex<()>,
    backoff: Mutex<Backoff>,
    /// The nodes whose calls still run: a pass and the sweep leave them out.
    busy: Mutex<HashSet<String>>,
    /// The slots each node was last told to keep (ApplyPool answered), and when.
    applied: Mutex<HashMap<(String, String), (u32, Instant)>>,
    /// The pools (by UID) whose status this process has applied: the previous release's status
    /// fields are taken over before the first ([`crate::status_apply`]).
    applied_status: Mutex<HashSet<String>>,
    /// When each pool's (by UID) last pass ended: the next waits for `settings.min_gap`.
    passed: Mutex<HashMap<String, Instant>>,
}

impl Keeper {
    fn new(ctx: Arc<Context>, settings: Settings) -> Self {
        Keeper {
            ctx,
            settings,
            turn: Default::default(),
            backoff: Default::default(),
            busy: Default::default(),
            applied: Default::default(),
            applied_status: Default::default(),
            passed: Default::default(),
        }
    }

    /// How long the pool `uid` still waits before its next pass, if its last one ended less
    /// than `settings.min_gap` ago.
    fn too_soon(&self, uid: &str) -> Option<Duration> {
        let ended = *lock(&self.passed).get(uid)?;
        Some(self.settings.min_gap.saturating_sub(ended.elapsed())).filter(|wait| !wait.is_zero())
    }

    /// Starts each node's `calls`, but on the nodes whose calls still run.
    fn start_calls(self: &Arc<Self>, calls: BTreeMap<String, Vec<NodeCall>>) {
        for (node, calls) in calls {
            if !lock(&self.busy).insert(node.clone()) {
                continue;
            }
            tokio::spawn(call_node(self.clone(), node, calls));
        }
    }
}

/// A lock of the keeper's state: what it guards stays whole if a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// One call of a pass (or of the sweep) to a node.
#[derive(Debug, Clone)]
enum NodeCall {
    /// Gives back ready slots of the node pool: it keeps `slots`.
    Resize { pool: String, slots: u32 },
    /// Keeps the node pool as `spec` says.
    Apply { pool: String, spec: Arc<PoolSpec> },
    /// Deletes the node pool.
    Delete { pool: String },
}

/// Keeps the warm pools until the task is dropped: a `Controller` over `pools` (their watch,
/// reflected into `ctx.pools`), one pool at a time, woken by `classes` (their watch, reflected
/// into `ctx.classes`) and by [`crate::vm::PoolsWake`]; beside it, the sweep of the node pools
/// no pool names.
pub async fn run(
    ctx: Arc<Context>,
    settings: Settings,
    pools: impl Stream<Item = Result<SmolVMPool, watcher::Error>> + Send + 'static,
    classes: impl Stream<Item = Result<SmolVMClass, watcher::Error>> + Send + 'static,
) {
    let keeper = Arc::new(Keeper::new(ctx.clone(), settings));
    // A pool that changes (or goes) wakes the sweep too: a deleted one's node pools go.
    let changed = Arc::new(tokio::sync::Notify::new());
    let pools = pools.inspect({
        let changed = changed.clone();
        move |_| changed.notify_one()
    });
    let users = ctx.pools.clone();
    let controller = Controller::for_stream(pools, ctx.pools.clone())
        .with_config(Config::default().concurrency(1))
        .watches_stream(classes, move |class: SmolVMClass| {
            class_users(&users, &class.name_any())
        })
        .reconcile_all_on(ctx.pools_wake.pokes())
        .run(reconcile, error_policy, keeper.clone())
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "pool keeper");
            }
        });
    // One task for both: both wait for the pools' cache to fill, and a cache's readiness wakes
    // one waiter only (see crate::store_ready).
    futures::future::join(controller, sweeps(keeper, changed)).await;
}

/// The pools a change of the SmolVMClass `class` concerns: those whose template names it, and
/// those that name none (they take the newest default class, which any class may become or
/// stop being).
fn class_users(pools: &Store<SmolVMPool>, class: &str) -> Vec<ObjectRef<SmolVMPool>> {
    pools
        .state()
        .iter()
        .filter(|p| p.spec.template.class_name.as_deref().is_none_or(|name| name == class))
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// One pool's pass (none within `min_gap` of its last, none for a pool being deleted), then
/// the next after `every`.
async fn reconcile(pool: Arc<SmolVMPool>, keeper: Arc<Keeper>) -> Result<Action, Error> {
    let uid = pool.uid().ok_or(Error::MissingField("metadata.uid"))?;
    if let Some(wait) = keeper.too_soon(&uid) {
        return Ok(Action::requeue(wait));
    }
    if pool.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    // A template's class is read from the cache: not before it is filled.
    if !crate::store_ready(&keeper.ctx.classes).await {
        return Ok(Action::requeue(keeper.settings.every));
    }
    let kept = {
        let _turn = keeper.turn.lock().await;
        keep(&keeper, &pool).await
    };
    lock(&keeper.passed).insert(uid, Instant::now());
    kept.map(|()| Action::requeue(keeper.settings.every))
}

/// A pass that failed (its status was not written) runs again after [`RETRY_PASS`].
fn error_policy(pool: Arc<SmolVMPool>, error: &Error, _: Arc<Keeper>) -> Action {
    tracing::debug!(pool = %pool.name_any(), namespace = pool.namespace(), reason = error.reason(), %error, "the pool's pass failed; run again soon");
    Action::requeue(RETRY_PASS)
}

/// The sweeps of node pools no SmolVMPool names any more, once the pools' cache is filled (until
/// then every node pool would look orphaned): at each wake-up of the pools and each pool change,
/// at least every `every` and at most every `min_gap`.
async fn sweeps(keeper: Arc<Keeper>, changed: Arc<tokio::sync::Notify>) {
    if !crate::store_ready(&keeper.ctx.pools).await {
        return;
    }
    let Settings { every, min_gap, .. } = keeper.settings;
    let mut pokes = keeper.ctx.pools_wake.pokes().boxed();
    loop {
        let started = tokio::time::Instant::now();
        {
            let _turn = keeper.turn.lock().await;
            sweep(&keeper);
        }
        tokio::time::sleep_until(started + min_gap).await;
        tokio::select! {
            _ = pokes.next() => {}
            _ = changed.notified() => {}
            _ = tokio::time::sleep(every.saturating_sub(min_gap)) => {}
        }
    }
}

/// One sweep: DeletePool for each node pool of a pool that is gone, on the nodes whose calls do
/// not run; and what was kept of gone pools forgotten.
fn sweep(keeper: &Arc<Keeper>) {
    let pools = keeper.ctx.pools.state();
    let nodes = keeper.ctx.nodes.state();
    let mut calls: BTreeMap<String, Vec<NodeCall>> = BTreeMap::new();
    for (node, name) in orphans(&nodes, pools.iter().map(AsRef::as_ref)) {
        calls.entry(node).or_default().push(NodeCall::Delete { pool: name });
    }
    keeper.start_calls(calls);
    let live: HashSet<String> = pools.iter().filter_map(|p| p.uid()).collect();
    lock(&keeper.passed).retain(|uid, _| live.contains(uid));
    lock(&keeper.applied_status).retain(|uid| live.contains(uid));
    // The retries of node pools of gone pools, or on gone nodes, would otherwise stay for good.
    let live_pools = crate::pools::LivePools::of(pools.iter().map(AsRef::as_ref));
    let node_names: HashSet<String> = nodes.iter().map(|n| n.name_any()).collect();
    lock(&keeper.backoff).retain(|node, name| node_names.contains(node) && live_pools.holds(name));
}

/// The budget of `pool`: the room its namespace's ResourceQuotas still leave (SPEC 6.3), in the
/// ledger's units; `None` is unlimited (no quota names the product's keys there).
fn quota_budget(ctx: &Context, pool: &SmolVMPool) -> Option<NodeResources> {
    ctx.quotas.as_ref()?.room(pool.namespace())
}

/// What `keeps` start, summed (each slot `each`): what the namespace's quota is charged for.
fn started(keeps: &[&Keep], each: &NodeResources) -> NodeResources {
    keeps
        .iter()
        .flat_map(|k| k.starts(each))
        .fold(NodeResources::default(), |sum, start| match start {
            Start::Source(source) => sum.plus(&source),
            Start::Slots(n, each) => sum.plus(&times(&each, n)),
        })
}

/// Charges what `keeps` start to `pool`'s namespace's quotas before its nodes are asked: `None`
/// when that was done (or nothing is to be charged), else why not, for the pool's condition (the
/// pass then starts nothing new for it).
async fn charge_starts(ctx: &Context, pool: &SmolVMPool, keeps: &[&Keep], each: &NodeResources) -> Option<String> {
    let charging = ctx.quotas.as_ref()?;
    let amount = started(keeps, each);
    if amount == NodeResources::default() {
        return None;
    }
    match charging.charge(pool.namespace(), &amount).await {
        Ok(_) => None,
        Err(error) => {
            tracing::info!(pool = %pool.name_any(), namespace = pool.namespace(), reason = error.reason(), %error, "the pool's new machines were not charged: none is started this pass");
            Some(match error {
                smolvm_kit::quota::ChargeError::Exceeded(exceeded) => format!(
                    "the namespace's ResourceQuota has no room for the machines this pool would start ({amount}): {exceeded}"
                ),
                other => other.to_string(),
            })
        }
    }
}

/// How long a node's report may lag behind what it was told (its agent reports every 10 s by
/// default): a node told its slots within this is not asked again for a report that says other.
const REPORT_LAG: Duration = Duration::from_secs(15);

/// One pool's pass: the plan, the bookings and the node calls it needs (started on the nodes
/// whose calls do not run), its status written when it says something new.
async fn keep(keeper: &Arc<Keeper>, pool: &SmolVMPool) -> Result<(), Error> {
    let ctx = keeper.ctx.as_ref();
    let now = Timestamp::now();
    let (pools, nodes) = (ctx.pools.state(), ctx.nodes.state());
    // The slot's machine: what ApplyPool sends and what the ledger books.
    let slot = slot_vm(pool, &ctx.classes.state());
    let resources = slot.as_ref().map(|vm| Request::of(vm).resources).unwrap_or_default();
    let Some(mut plan) = plan(
        pool,
        &nodes,
        &ctx.ledger.view(),
        &resources,
        now,
        &ctx.placement,
        quota_budget(ctx, pool),
    ) else {
        return Ok(());
    };
    let busy: HashSet<String> = lock(&keeper.busy).clone();
    let applying = asked_nodes(ctx, keeper, &plan, &busy);
    let spec = match (&slot, applying.is_empty()) {
        (_, true) => None,
        (Ok(vm), false) => Some(source_spec(ctx, pool, vm).await),
        (Err(message), false) => Some(Err(message.clone())),
    };
    // SPEC 6.3: what the pass starts on the nodes it asks is charged to the namespace's quotas
    // before they are asked; refused (another charge took the room since the budget was read),
    // nothing new starts this pass and the pool's condition says why.
    let refused = match &spec {
        Some(Ok(_)) => charge_starts(ctx, pool, &applying, &plan.slot).await,
        _ => None,
    };
    let by_name: HashMap<String, &Arc<SmolVMNode>> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let this = PoolPass {
        ctx,
        keeper,
        pool,
        pools: &pools,
        plan: &plan,
    };
    let mut calls: BTreeMap<String, Vec<NodeCall>> = BTreeMap::new();
    for keep in &plan.keep {
        let Some(node) = by_name.get(&keep.node).filter(|_| !busy.contains(&keep.node)) else {
            continue;
        };
        let ask = match (&spec, applying.iter().any(|k| k.node == keep.node)) {
            (Some(Ok(spec)), true) => Ask::Yes {
                spec,
                charged: refused.is_none(),
            },
            (Some(Err(message)), true) => Ask::Failed(message),
            _ => Ask::No,
        };
        this.book_node(keep, node, ask, &mut calls).await;
    }
    for (node, name) in &plan.retire {
        calls
            .entry(node.clone())
            .or_default()
            .push(NodeCall::Delete { pool: name.clone() });
    }
    keeper.start_calls(calls);
    if refused.is_some() {
        plan.quota = refused;
    }
    write_status(keeper, pool, &nodes, &plan, now).await
}

/// The nodes of `plan` a pass asks to keep the pool: those with something to do whose backoff
/// is over and whose calls do not run, but a node asked only because its report still says
/// other slots when it was told these slots moments ago.
fn asked_nodes<'p>(ctx: &Context, keeper: &Keeper, plan: &'p Plan, busy: &HashSet<String>) -> Vec<&'p Keep> {
    plan.keep
        .iter()
        .filter(|k| !busy.contains(&k.node))
        .filter(|k| {
            let key = (k.node.clone(), plan.name.clone());
            let due = lock(&keeper.backoff).due(&key, Instant::now());
            let booked = ctx.ledger.slots(&k.node, &plan.name);
            let told = lock(&keeper.applied)
                .get(&key)
                .is_some_and(|(slots, at)| *slots == k.slots && at.elapsed() < REPORT_LAG);
            let only_the_report = k.source.is_none() && k.slots == booked;
            k.apply && due && !(only_the_report && told)
        })
        .collect()
}

/// Whether a pass asks a node to keep a pool, and with what.
enum Ask<'a> {
    /// Not asked in this pass (its backoff runs, or nothing changed there).
    No,
    /// Asked with `spec`; `charged`: what it starts was charged to the quota (or nothing is).
    Yes { spec: &'a PoolSpec, charged: bool },
    /// Asked, but the spec could not be made: why.
    Failed(&'a str),
}

/// One pool's pass, as its nodes' bookings read it.
struct PoolPass<'a> {
    ctx: &'a Context,
    keeper: &'a Keeper,
    pool: &'a SmolVMPool,
    pools: &'a [Arc<SmolVMPool>],
    plan: &'a Plan,
}

impl PoolPass<'_> {
    /// Books what `keep` holds on `node` (other pools' slots given back first, then the source
    /// and the slots that fit) and adds the node's calls: ResizePool for the slots given back,
    /// ApplyPool where it is asked. A source not asked for, or not charged, is not booked.
    async fn book_node(
        &self,
        keep: &Keep,
        node: &SmolVMNode,
        ask: Ask<'_>,
        calls: &mut BTreeMap<String, Vec<NodeCall>>,
    ) {
        let (ctx, plan, name) = (self.ctx, self.plan, &keep.node);
        let (asked, charged, spec) = match ask {
            Ask::No => (false, true, None),
            Ask::Yes { spec, charged } => (true, charged, Some(spec)),
            Ask::Failed(message) => {
                let key = (name.clone(), plan.name.clone());
                lock(&self.keeper.backoff).failed(key, message.to_string(), Instant::now());
                return;
            }
        };
        if keep.source.is_some() && !(asked && charged) {
            return;
        }
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable).unwrap_or_default();
        let present = reported(node).contains_key(plan.name.as_str());
        // Other pools' ready slots first: booked as given back (put back should the source not
        // be booked after all), then deleted on the node.
        let mut given: Vec<(String, placement::SlotHold, u32)> = Vec::new();
        for (other, n) in &keep.give_back {
            let before = ctx.ledger.slot_hold(name, other);
            let left = ctx.ledger.take_slots(name, other, *n);
            given.push((other.clone(), before, left));
        }
        let source = Request {
            resources: plan.slot,
            host_ports: Vec::new(),
            node_selector: Default::default(),
            pin: None,
            source: None,
            volumes: Vec::new(),
        };
        // Slots are booked up only where the node is asked for them in this pass, and charged.
        let want = match (asked, charged) {
            (true, true) => keep.slots,
            (true, false) => keep.slots.saturating_sub(keep.new_slots),
            (false, _) => keep.slots.min(ctx.ledger.slots(name, &plan.name)),
        };
        let Some(slots) = ctx
            .ledger
            .book_pool(name, &plan.name, &source, present, &plan.slot, want, &allocatable)
        else {
            for (other, before, _) in given {
                ctx.ledger.set_slot_hold(name, &other, before);
            }
            return;
        };
        let taker = format!("the source of pool {}/{}", self.pool.namespace(), self.pool.name_any());
        for (other, before, left) in given {
            calls.entry(name.clone()).or_default().push(NodeCall::Resize {
                pool: other.clone(),
                slots: left,
            });
            if let Some(owner) = placement::owner_of(self.pools.iter().map(AsRef::as_ref), &other) {
                crate::vm::events::slots_given_back(ctx, owner, name, before.count.saturating_sub(left), &taker).await;
            }
        }
        if let Some(spec) = spec {
            let mut spec = spec.clone();
            spec.slots = slots;
            calls.entry(name.clone()).or_default().push(NodeCall::Apply {
                pool: plan.name.clone(),
                spec: Arc::new(spec),
            });
        }
    }
}

/// The pool's status after `plan`, written by server-side apply when it says something new.
async fn write_status(
    keeper: &Keeper,
    pool: &SmolVMPool,
    nodes: &[Arc<SmolVMNode>],
    plan: &Plan,
    now: Timestamp,
) -> Result<(), Error> {
    let mut failures = lock(&keeper.backoff).failures(&plan.name);
    failures.retain(|node, _| plan.targets.contains(node));
    let next = status(pool, nodes, plan, &failures, now);
    if same(pool.status.as_ref(), &next) {
        return Ok(());
    }
    let api: Api<SmolVMPool> = Api::namespaced(keeper.ctx.client.clone(), pool.namespace());
    let uid = pool.uid().unwrap_or_default();
    let first = !lock(&keeper.applied_status).contains(&uid);
    if first && let Err(error) = status_apply::take_over_status(&api, &pool.name_any()).await {
        // Applied all the same: the previous release's fields stay co-owned until a later
        // process takes them over.
        tracing::info!(pool = %pool.name_any(), %error, "taking over the previous release's status fields of the pool failed; applying its status all the same");
    }
    // The whole status by server-side apply: a field no longer set leaves the stored status.
    let body = status_apply::apply_body::<SmolVMPool>(&pool.name_any(), None, &next);
    api.patch_status(&pool.name_any(), &status_apply::apply_params(), &Patch::Apply(&body))
        .await?;
    lock(&keeper.applied_status).insert(uid);
    Ok(())
}

/// Whether two statuses say the same, transition times aside.
fn same(a: Option<&SmolVMPoolStatus>, b: &SmolVMPoolStatus) -> bool {
    let Some(a) = a else { return false };
    let strip = |s: &SmolVMPoolStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}

/// A node's calls, in order, each within `--pool-call-timeout`; when they end the node is free
/// for the next pass or sweep, and the pools are woken.
async fn call_node(keeper: Arc<Keeper>, node: String, calls: Vec<NodeCall>) {
    crate::vm::act::sync_endpoint(&keeper.ctx, &node);
    for call in calls {
        match call {
            NodeCall::Resize { pool, slots } => resize(&keeper, &node, &pool, slots).await,
            NodeCall::Apply { pool, spec } => apply(&keeper, &node, pool, &spec).await,
            NodeCall::Delete { pool } => delete(&keeper, &node, &pool).await,
        }
    }
    lock(&keeper.busy).remove(&node);
    keeper.ctx.pools_wake.poke();
}

/// ResizePool: the node pool keeps `slots` (the others were given back).
async fn resize(keeper: &Keeper, node: &str, pool: &str, slots: u32) {
    let timeout = keeper.settings.call_timeout;
    match tokio::time::timeout(timeout, keeper.ctx.node_client.resize_pool(node, pool, slots)).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => {
            tracing::info!(%node, %pool, code = ?error.code(), message = error.message(), "ResizePool failed")
        }
        Err(_) => tracing::info!(%node, %pool, ?timeout, "ResizePool took too long"),
    }
}

/// ApplyPool: the node keeps the node pool as `spec` says. Refused or unanswered, the node is
/// asked again after its backoff, and what the ledger booked for it goes unless the node
/// reports the pool.
async fn apply(keeper: &Keeper, node: &str, pool: String, spec: &PoolSpec) {
    let (ctx, timeout) = (&keeper.ctx, keeper.settings.call_timeout);
    let key = (node.to_string(), pool.clone());
    let outcome = match tokio::time::timeout(timeout, ctx.node_client.apply_pool(node, &pool, spec)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => {
            tracing::info!(%node, %pool, code = ?error.code(), message = error.message(), "ApplyPool failed");
            Err(error.message().to_string())
        }
        Err(_) => Err(format!(
            "the node did not answer ApplyPool within {}s (--pool-call-timeout); asked again",
            timeout.as_secs()
        )),
    };
    match outcome {
        Ok(()) => {
            lock(&keeper.applied).insert(key.clone(), (spec.slots, Instant::now()));
            lock(&keeper.backoff).succeeded(&key);
        }
        Err(message) => {
            lock(&keeper.backoff).failed(key, message, Instant::now());
            // Nothing of it is on the node unless the node reports it.
            let reported = ctx
                .nodes
                .get(&ObjectRef::new(node))
                .is_some_and(|n| reported(&n).contains_key(pool.as_str()));
            if !reported {
                ctx.ledger.release_pool(node, &pool);
            }
        }
    }
}

/// DeletePool. A node pool whose machines still run gives its ready slots back; its source
/// stays until they go (asked again at a later pass or sweep).
async fn delete(keeper: &Keeper, node: &str, pool: &str) {
    let (ctx, timeout) = (&keeper.ctx, keeper.settings.call_timeout);
    match tokio::time::timeout(timeout, ctx.node_client.delete_pool(node, pool)).await {
        Ok(Ok(_)) => {
            tracing::info!(%node, %pool, "node pool deleted");
            ctx.ledger.release_pool(node, pool);
        }
        Ok(Err(error)) if error.code() == Some(&ErrorCode::PoolInUse) => {
            let left = ctx.ledger.slots(node, pool);
            ctx.ledger.take_slots(node, pool, left);
        }
        Ok(Err(error)) => {
            tracing::debug!(%node, %pool, %error, "deleting a node pool failed; retried next round")
        }
        Err(_) => tracing::debug!(%node, %pool, "deleting a node pool took too long; retried next round"),
    }
}

/// What ApplyPool sends for `pool`: its slot's machine `vm`, env values and registry credential
/// resolved in its namespace (its slots are set per node).
async fn source_spec(ctx: &Context, pool: &SmolVMPool, vm: &SmolVM) -> Result<PoolSpec, String> {
    let mut source = crate::vm::rules::machine_spec(vm)?;
    let (env, registry_auth) = crate::vm::act::secrets_of(ctx, vm).await.map_err(|e| e.to_string())??;
    source.workload.env = env;
    Ok(PoolSpec {
        source,
        slots: u32::try_from(pool.spec.slots_per_node).unwrap_or(0),
        registry_auth,
    })
}
