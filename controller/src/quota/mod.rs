//! SmolVM quotas (SPEC 6.3): the `vm.smolvm.dev/*` figures of every ResourceQuota that names
//! them, kept true by a recount from the controller's caches.
//!
//! The webhook charges a user's write before it is admitted (`smolvm_webhook::quota`); the pool
//! keeper charges each source and slot before it starts it. Both raise `status.used` with an
//! optimistic write ([`smolvm_kit::quota::Charger`]). This task keeps the figures honest after
//! that: a charge whose write later failed is given back, a deleted SmolVM's share is freed, a
//! shrink or a suspend gives back what it no longer takes, and a charge newer than what the
//! caches have seen is never undone ([`recount`]: it waits for its object, or for the grace).
//!
//! Observe (the quota watch, and the SmolVM and pool caches), decide ([`recount::Book`], pure),
//! act (one merge patch of `status` per quota that differs, with the resourceVersion seen as
//! precondition). A cluster without a quota naming the product's keys costs nothing beyond the
//! watch: nothing is counted.

pub mod recount;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{reflector::Store, watcher},
};
use smolvm_api::{
    NodeResources, SmolVM, SmolVMPool,
    quota::{Limits, status_patch, usage},
};
use smolvm_kit::quota::{ChargeError, Charged, Charger};
use tokio::sync::Notify;

use recount::{Book, Write};

/// The least time between two recounts woken by cache changes: a burst of SmolVM events is
/// counted once.
pub const SETTLE: Duration = Duration::from_millis(200);

/// How often the book is looked at without a change (charges past their grace are given back).
pub const TICK: Duration = Duration::from_secs(5);

/// What each namespace of `namespaces` uses: its SmolVMs' [`usage`] (every SmolVM the cache
/// holds, also while it is being deleted, until it is gone) and its pools' holdings, `pools`.
pub fn usage_by_namespace<'a>(
    vms: impl IntoIterator<Item = &'a SmolVM>,
    pools: &HashMap<String, NodeResources>,
    namespaces: &HashSet<String>,
) -> HashMap<String, NodeResources> {
    let mut out: HashMap<String, NodeResources> = namespaces
        .iter()
        .map(|ns| (ns.clone(), pools.get(ns).copied().unwrap_or_default()))
        .collect();
    for vm in vms {
        let Some(ns) = vm.metadata.namespace.as_deref() else {
            continue;
        };
        if let Some(total) = out.get_mut(ns) {
            *total = total.plus(&usage(&vm.spec));
        }
    }
    out
}

/// What each namespace's warm pools hold on their nodes: `holdings` (what the ledger books for
/// each node pool: its sources and ready slots, [`crate::placement::Ledger::pool_holdings`])
/// summed by the namespace of the pool each node pool is of (every generation of its template).
pub fn pool_usage(
    pools: &[Arc<SmolVMPool>],
    holdings: &BTreeMap<String, NodeResources>,
) -> HashMap<String, NodeResources> {
    let mut out: HashMap<String, NodeResources> = HashMap::new();
    for pool in pools {
        let (Some(ns), Some(prefix)) = (pool.metadata.namespace.clone(), crate::placement::pool_prefix(pool)) else {
            continue;
        };
        for (_, held) in holdings.iter().filter(|(name, _)| name.starts_with(&prefix)) {
            let total = out.entry(ns.clone()).or_default();
            *total = total.plus(held);
        }
    }
    out
}

/// What the controller charges its own starts with (a pool's source and slots, SPEC 6.3): the
/// namespaces' ResourceQuotas, from the watch the recount reads, and the charger.
pub struct Charging {
    /// The ResourceQuotas of every namespace.
    pub quotas: Store<ResourceQuota>,
    /// The optimistic writer of their `status.used`.
    pub charger: Charger,
}

impl Charging {
    /// The quotas of `namespace` that name a product key.
    fn in_namespace(&self, namespace: &str) -> Vec<Arc<ResourceQuota>> {
        self.quotas
            .state()
            .into_iter()
            .filter(|q| q.metadata.namespace.as_deref() == Some(namespace) && Limits::of(q).is_some())
            .collect()
    }

    /// The room `namespace`'s quotas still leave ([`smolvm_api::quota::room`]); `None` where
    /// none limits anything.
    pub fn room(&self, namespace: &str) -> Option<NodeResources> {
        let limits: Vec<Limits> = self
            .in_namespace(namespace)
            .iter()
            .filter_map(|q| Limits::of(q))
            .collect();
        smolvm_api::quota::room(&limits)
    }

    /// Charges `amount` to `namespace`'s quotas, before what it is for starts.
    pub async fn charge(&self, namespace: &str, amount: &NodeResources) -> Result<Charged, ChargeError> {
        let quotas = self.in_namespace(namespace);
        if quotas.is_empty() {
            return Ok(Charged::default());
        }
        self.charger.charge(namespace, quotas, amount, false).await
    }
}

/// What the recount reads besides the quotas.
pub struct Inputs {
    /// The SmolVMs, from the controller's cache.
    pub vms: Store<SmolVM>,
    /// What each namespace's warm pools hold on their nodes (their sources and slots).
    pub pools: Box<dyn Fn() -> HashMap<String, NodeResources> + Send + Sync>,
    /// Woken when the SmolVMs or the pools change.
    pub changed: Arc<Notify>,
    /// How long a charge may wait for its object ([`recount::DEFAULT_GRACE`]).
    pub grace: Duration,
}

/// Runs the recount until `events` (the ResourceQuota watch) ends.
pub async fn run(
    client: Client,
    events: impl Stream<Item = Result<watcher::Event<ResourceQuota>, watcher::Error>> + Send,
    inputs: Inputs,
) {
    if !crate::store_ready(&inputs.vms).await {
        return;
    }
    let mut book = Book::new(inputs.grace);
    let mut events = std::pin::pin!(events);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut synced = false;
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(event) => synced |= take(&mut book, event),
                None => return,
            },
            () = inputs.changed.notified() => tokio::time::sleep(SETTLE).await,
            _ = tick.tick() => {}
        }
        // Every version already delivered is seen before planning: a write is only ever planned
        // from a version the book has judged the raises of.
        while let Some(Some(event)) = events.next().now_or_never() {
            synced |= take(&mut book, event);
        }
        if synced {
            recount(&client, &mut book, &inputs).await;
        }
    }
}

/// One watch event into the book; `true` once the first full list is in.
fn take(book: &mut Book, event: Result<watcher::Event<ResourceQuota>, watcher::Error>) -> bool {
    let now = Instant::now();
    match event {
        Ok(watcher::Event::Apply(quota) | watcher::Event::InitApply(quota)) => {
            match Limits::of(&quota) {
                Some(limits) => book.observe(&limits, now),
                None => book.forget(&format!(
                    "{}/{}",
                    quota.namespace().unwrap_or_default(),
                    quota.name_any()
                )),
            }
            false
        }
        Ok(watcher::Event::Delete(quota)) => {
            book.forget(&format!(
                "{}/{}",
                quota.namespace().unwrap_or_default(),
                quota.name_any()
            ));
            false
        }
        Ok(watcher::Event::Init) => false,
        Ok(watcher::Event::InitDone) => true,
        Err(error) => {
            tracing::debug!(%error, "ResourceQuota watch error; retried");
            false
        }
    }
}

/// Counts the namespaces with quotas, then writes what differs.
async fn recount(client: &Client, book: &mut Book, inputs: &Inputs) {
    let namespaces = book.namespaces();
    if namespaces.is_empty() {
        return;
    }
    let now = Instant::now();
    let vms = inputs.vms.state();
    let counted = usage_by_namespace(vms.iter().map(|v| v.as_ref()), &(inputs.pools)(), &namespaces);
    book.count_all(&counted, now);
    book.expire(now);
    for (limits, write) in book.plan_all() {
        apply(client, book, &limits, &write).await;
    }
}

/// Writes `write` of `limits`, with the version seen as precondition.
async fn apply(client: &Client, book: &mut Book, limits: &Limits, write: &Write) {
    let api: Api<ResourceQuota> = Api::namespaced(client.clone(), &limits.namespace);
    let patch = status_patch(limits, &write.used, write.hard);
    match api
        .patch_status(&limits.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(answer) => {
            tracing::info!(quota = %write.quota, used = %patch["status"]["used"], "recounted the quota's SmolVM usage");
            book.wrote(&write.quota, answer.metadata.resource_version.clone(), &write.used);
        }
        // Charged meanwhile, or gone: the watch brings what happened, and the next look plans
        // from it.
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {}
        Err(error) => {
            tracing::warn!(quota = %write.quota, %error, "writing a quota's recount failed; retried at the next look")
        }
    }
}

/// The quotas' watch, as the recount reads it (managedFields dropped), reflected into `writer`
/// (the store [`Charging`] reads).
pub fn quota_watch(
    client: &Client,
    writer: kube::runtime::reflector::store::Writer<ResourceQuota>,
) -> impl Stream<Item = Result<watcher::Event<ResourceQuota>, watcher::Error>> + Send + 'static + use<> {
    use kube::runtime::WatchStreamExt;
    watcher(Api::<ResourceQuota>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(|q| q.metadata.managed_fields = None)
        .reflect(writer)
}
