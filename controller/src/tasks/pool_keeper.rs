//! The pool keeper: the warm pools' passes. Each pass plans every pool as data
//! ([`crate::pools`]), acts, then reports:
//! - the ledger books each source (a hard hold, never taken) and each node's ready slots (soft
//!   holds: spare room) before the node is asked ([`crate::placement::Ledger::book_pool`]); then
//!   the node API's ResizePool (slots given back), ApplyPool and DeletePool run, each node's calls
//!   in order, different nodes at once, each call within `--pool-call-timeout`, so a node that
//!   hangs delays only its own pools (a node whose calls still run is left out of a pass);
//! - the pool's status ([`status`]) is written when it says something new.
//!
//! Passes run when a node reports other pool counts, a pool or a SmolVMClass changes (their
//! caches' watches), a claim took a slot or a node's calls ended ([`crate::vm::PoolsWake`]), and
//! at least every [`EVERY`]; never more often than every [`MIN_GAP`].
//!
//! A node whose ApplyPool failed is asked again after a backoff (10 s doubling to 5 minutes),
//! as a failed start is: a source that does not boot takes smolvm tens of seconds each time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch},
};
use smolvm_api::{
    NodeResources, SmolVM, SmolVMClass, SmolVMNode, SmolVMPool,
    nodeapi::{ErrorCode, PoolSpec},
    pool::SmolVMPoolStatus,
};

use crate::placement::{self, Request, reported_pools as reported, times};
use crate::pools::{Keep, Plan, Start, orphans, plan, slot_vm, status};
use crate::status_apply;
use crate::vm::Context;

/// The longest a pool waits for a pass when nothing wakes the keeper.
pub const EVERY: Duration = Duration::from_secs(30);

/// The shortest time between two passes: a burst of wake-ups (claims, every node's report) makes
/// one pass, and a pool's status is written at most this often.
pub const MIN_GAP: Duration = Duration::from_secs(1);

/// The default of `--pool-call-timeout`: how long one pool call to a node may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// The first wait after a failed ApplyPool on a node.
pub const RETRY_FIRST: Duration = Duration::from_secs(10);
/// The longest wait.
pub const RETRY_MAX: Duration = Duration::from_secs(300);

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

    /// The last failure's message on each node, for the node pool `name`.
    fn failures(&self, name: &str) -> BTreeMap<String, String> {
        self.0
            .iter()
            .filter(|((_, pool), _)| pool == name)
            .map(|((node, _), failures)| (node.clone(), failures.last.clone()))
            .collect()
    }
}

/// The pools' passes' tunables.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The longest wait between passes ([`EVERY`]).
    pub every: Duration,
    /// How long one pool call to a node may take (`--pool-call-timeout`, [`CALL_TIMEOUT`]).
    pub call_timeout: Duration,
    /// The shortest time between two passes ([`MIN_GAP`]).
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

/// What the passes share with the nodes' calls they start.
#[derive(Debug, Default)]
struct Keeper {
    backoff: Mutex<Backoff>,
    /// The nodes whose calls still run: a pass leaves them out.
    busy: Mutex<HashSet<String>>,
    /// The slots each node was last told to keep (ApplyPool answered), and when.
    applied: Mutex<HashMap<(String, String), (u32, Instant)>>,
    /// The SmolVMClasses last read, and when ([`classes`]).
    classes: Mutex<Option<(Instant, Arc<Vec<SmolVMClass>>)>>,
    /// The pools (by UID) whose status this process has applied: the previous release's status
    /// fields are taken over before the first ([`crate::status_apply`]).
    applied_status: Mutex<HashSet<String>>,
}

/// One call of a pass to a node.
#[derive(Debug, Clone)]
enum NodeCall {
    /// Gives back ready slots of the node pool: it keeps `slots`.
    Resize { pool: String, slots: u32 },
    /// Keeps the node pool as `spec` says.
    Apply { pool: String, spec: Arc<PoolSpec> },
    /// Deletes the node pool.
    Delete { pool: String },
}

/// Runs the pools' passes until the task is dropped: when woken, and at least every
/// `settings.every`.
pub async fn run(ctx: Arc<Context>, settings: Settings) {
    let keeper = Arc::new(Keeper::default());
    loop {
        let started = tokio::time::Instant::now();
        if let Err(error) = pass(&ctx, &keeper, settings).await {
            tracing::debug!(%error, "pools pass failed; retried next round");
        }
        tokio::time::sleep_until(started + settings.min_gap).await;
        ctx.pools_wake
            .wait(settings.every.saturating_sub(settings.min_gap))
            .await;
    }
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

/// One pass over every pool: plans, books, starts the nodes' calls, writes the statuses.
async fn pass(ctx: &Arc<Context>, keeper: &Arc<Keeper>, settings: Settings) -> Result<(), kube::Error> {
    let mut pools: Vec<SmolVMPool> = match &ctx.pools {
        Some(store) if crate::store_ready(store).await => store.state().iter().map(|p| (**p).clone()).collect(),
        _ => {
            Api::<SmolVMPool>::all(ctx.client.clone())
                .list(&ListParams::default())
                .await?
                .items
        }
    };
    pools.sort_by_key(|p| (ResourceExt::namespace(p), p.name_any()));
    let nodes = ctx.nodes.state();
    let busy: HashSet<String> = keeper.busy.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut calls: BTreeMap<String, Vec<NodeCall>> = BTreeMap::new();
    for (node, name) in orphans(&nodes, &pools) {
        calls.entry(node).or_default().push(NodeCall::Delete { pool: name });
    }
    let classes = classes(ctx, keeper, &pools).await?;
    for pool in &pools {
        if pool.metadata.deletion_timestamp.is_some() {
            continue;
        }
        keep(ctx, keeper, pool, &pools, &nodes, &classes, &busy, &mut calls).await;
    }
    for (node, calls) in calls {
        if busy.contains(&node) {
            continue;
        }
        keeper
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.clone());
        tokio::spawn(call_node(
            ctx.clone(),
            keeper.clone(),
            node,
            calls,
            settings.call_timeout,
        ));
    }
    Ok(())
}

/// Without a cache: how long the SmolVMClasses read for the pools' templates are used before
/// they are read again (sooner when a pool names a class they lack).
const CLASSES_KEPT: Duration = Duration::from_secs(10);

/// How long a node's report may lag behind what it was told (its agent reports every 10 s by
/// default): a node told its slots within this is not asked again for a report that says other.
const REPORT_LAG: Duration = Duration::from_secs(15);

/// The SmolVMClasses: from the cache (its watch wakes the pass when one changes), or, without
/// one, read at most every [`CLASSES_KEPT`] (passes run up to once a second).
async fn classes(ctx: &Context, keeper: &Keeper, pools: &[SmolVMPool]) -> Result<Arc<Vec<SmolVMClass>>, kube::Error> {
    if pools.is_empty() {
        return Ok(Arc::default());
    }
    if let Some(store) = &ctx.classes
        && crate::store_ready(store).await
    {
        return Ok(Arc::new(store.state().iter().map(|c| (**c).clone()).collect()));
    }
    let cached = keeper.classes.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some((at, classes)) = cached {
        let known = |name: &String| classes.iter().any(|c| c.metadata.name.as_ref() == Some(name));
        let all_known = pools
            .iter()
            .filter_map(|p| p.spec.template.class_name.as_ref())
            .all(known);
        if at.elapsed() < CLASSES_KEPT && all_known {
            return Ok(classes);
        }
    }
    let read = Arc::new(
        Api::<SmolVMClass>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await?
            .items,
    );
    *keeper.classes.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), read.clone()));
    Ok(read)
}

/// One pool: the plan, the bookings and the node calls it needs (added to `calls`), its status
/// written when it says something new.
#[allow(clippy::too_many_arguments)]
async fn keep(
    ctx: &Context,
    keeper: &Keeper,
    pool: &SmolVMPool,
    pools: &[SmolVMPool],
    nodes: &[Arc<SmolVMNode>],
    classes: &Vec<SmolVMClass>,
    busy: &HashSet<String>,
    calls: &mut BTreeMap<String, Vec<NodeCall>>,
) {
    let now = Timestamp::now();
    // The slot's machine: what ApplyPool sends and what the ledger books.
    let slot = slot_vm(pool, classes);
    let resources = slot.as_ref().map(|vm| Request::of(vm).resources).unwrap_or_default();
    let Some(mut plan) = plan(
        pool,
        nodes,
        &ctx.ledger.view(),
        &resources,
        now,
        &ctx.placement,
        quota_budget(ctx, pool),
    ) else {
        return;
    };
    let applying = asked_nodes(ctx, keeper, &plan, busy);
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
        pools,
        plan: &plan,
    };
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
        this.book_node(keep, node, ask, calls).await;
    }
    for (node, name) in &plan.retire {
        calls
            .entry(node.clone())
            .or_default()
            .push(NodeCall::Delete { pool: name.clone() });
    }
    if refused.is_some() {
        plan.quota = refused;
    }
    write_status(ctx, keeper, pool, nodes, &plan, now).await;
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
            let due = keeper
                .backoff
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .due(&key, Instant::now());
            let booked = ctx.ledger.slots(&k.node, &plan.name);
            let told = keeper
                .applied
                .lock()
                .unwrap_or_else(|e| e.into_inner())
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
    pools: &'a [SmolVMPool],
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
                self.keeper.backoff.lock().unwrap_or_else(|e| e.into_inner()).failed(
                    key,
                    message.to_string(),
                    Instant::now(),
                );
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
            if let Some(owner) = placement::owner_of(self.pools, &other) {
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

/// The pool's status after `plan`, written when it says something new.
async fn write_status(
    ctx: &Context,
    keeper: &Keeper,
    pool: &SmolVMPool,
    nodes: &[Arc<SmolVMNode>],
    plan: &Plan,
    now: Timestamp,
) {
    let mut failures = keeper
        .backoff
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .failures(&plan.name);
    failures.retain(|node, _| plan.targets.contains(node));
    let next = status(pool, nodes, plan, &failures, now);
    if same(pool.status.as_ref(), &next) {
        return;
    }
    let api: Api<SmolVMPool> = Api::namespaced(ctx.client.clone(), pool.namespace());
    let uid = pool.uid().unwrap_or_default();
    let first = !keeper
        .applied_status
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&uid);
    if first && let Err(error) = status_apply::take_over_status(&api, &pool.name_any()).await {
        // Applied all the same: the previous release's fields stay co-owned until a later
        // process takes them over.
        tracing::info!(pool = %pool.name_any(), %error, "taking over the previous release's status fields of the pool failed; applying its status all the same");
    }
    // The whole status by server-side apply: a field no longer set leaves the stored status.
    let body = status_apply::apply_body::<SmolVMPool>(&pool.name_any(), None, &next);
    match api
        .patch_status(&pool.name_any(), &status_apply::apply_params(), &Patch::Apply(&body))
        .await
    {
        Ok(_) => {
            keeper
                .applied_status
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid);
        }
        Err(error) => {
            tracing::debug!(pool = %pool.name_any(), %error, "writing the pool's status failed; retried next round");
        }
    }
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

/// A node's calls of a pass, in order, each within `timeout`; the node is free for the next
/// pass when they end, and one is asked for.
async fn call_node(ctx: Arc<Context>, keeper: Arc<Keeper>, node: String, calls: Vec<NodeCall>, timeout: Duration) {
    crate::vm::act::sync_endpoint(&ctx, &node);
    for call in calls {
        match call {
            NodeCall::Resize { pool, slots } => {
                match tokio::time::timeout(timeout, ctx.node_client.resize_pool(&node, &pool, slots)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => {
                        tracing::info!(%node, %pool, code = ?error.code(), message = error.message(), "ResizePool failed")
                    }
                    Err(_) => tracing::info!(%node, %pool, ?timeout, "ResizePool took too long"),
                }
            }
            NodeCall::Apply { pool, spec } => {
                let key = (node.clone(), pool.clone());
                let outcome = match tokio::time::timeout(timeout, ctx.node_client.apply_pool(&node, &pool, &spec)).await
                {
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
                if outcome.is_ok() {
                    let told = (spec.slots, Instant::now());
                    keeper
                        .applied
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key.clone(), told);
                }
                let mut backoff = keeper.backoff.lock().unwrap_or_else(|e| e.into_inner());
                match outcome {
                    Ok(()) => backoff.succeeded(&key),
                    Err(message) => {
                        backoff.failed(key, message, Instant::now());
                        drop(backoff);
                        // Nothing of it is on the node unless the node reports it.
                        let reported = ctx
                            .nodes
                            .get(&kube::runtime::reflector::ObjectRef::new(&node))
                            .is_some_and(|n| reported(&n).contains_key(pool.as_str()));
                        if !reported {
                            ctx.ledger.release_pool(&node, &pool);
                        }
                    }
                }
            }
            NodeCall::Delete { pool } => {
                match tokio::time::timeout(timeout, ctx.node_client.delete_pool(&node, &pool)).await {
                    Ok(Ok(_)) => {
                        tracing::info!(%node, %pool, "node pool deleted");
                        ctx.ledger.release_pool(&node, &pool);
                    }
                    Ok(Err(error)) if error.code() == Some(&ErrorCode::PoolInUse) => {
                        // Its ready slots were given back; its source stays until its machines go.
                        let left = ctx.ledger.slots(&node, &pool);
                        ctx.ledger.take_slots(&node, &pool, left);
                    }
                    Ok(Err(error)) => {
                        tracing::debug!(%node, %pool, %error, "deleting a node pool failed; retried next round")
                    }
                    Err(_) => tracing::debug!(%node, %pool, "deleting a node pool took too long; retried next round"),
                }
            }
        }
    }
    keeper.busy.lock().unwrap_or_else(|e| e.into_inner()).remove(&node);
    ctx.pools_wake.poke();
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
