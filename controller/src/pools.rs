//! Warm pools: every SmolVMPool's slots kept on the nodes it matches, and its status.
//!
//! Each pass ([`EVERY`]) decides as data, acts, then reports:
//! - [`plan`]: which eligible, matching nodes must be asked to keep the pool (their report lacks
//!   it, or with other slots), and which of the pool's node pools must go (an older generation
//!   of its template, or a node it no longer matches); [`orphans`]: node pools of pools that
//!   are gone.
//! - the node API's ApplyPool and DeletePool do it. A pool's name on its nodes is
//!   `pool-<uid>-g<generation>` ([`node_pool_name`], the whole UID): a new template is a new node pool,
//!   so slots made from the old one are replaced, and machines served from them are never
//!   touched (the agent deletes a node pool only once none of its machines remains).
//! - [`status`]: ready and wanted slots per node, and the Ready condition, with the node's
//!   cause (already cleaned by the agent) when its slots fail.
//!
//! What a node pool holds (its source and its ready slots, each the size of the template's
//! machine) is booked in the ledger under its own key ([`pool_ledger_key`]) on every node that
//! keeps it, so placement never puts a VM into the room the slots take; machines served from it
//! are SmolVMs, booked as theirs.
//!
//! A node whose ApplyPool failed is asked again after a backoff (10 s doubling to 5 minutes),
//! as a failed start is: a source that does not boot takes smolvm tens of seconds each time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;
use smolvm_api::{
    NodeResources, SmolVM, SmolVMClass, SmolVMNode, SmolVMPool,
    constants::{condition, reason},
    defaulting::default_pooled_smolvm,
    nodeapi::{ErrorCode, PoolSpec},
    pool::{PoolNodeStatus, SmolVMPoolStatus},
    validate::Operation,
};

use crate::placement::{Request, check_node, pool_ledger_key, pool_prefix as prefix, reported_pools as reported};
pub use crate::placement::{node_pool_name_at, with_ready_slot};
use crate::vm::{Context, rules::set_condition};

/// How often the pools are looked at.
pub const EVERY: Duration = Duration::from_secs(5);

/// The first wait after a failed ApplyPool on a node.
pub const RETRY_FIRST: Duration = Duration::from_secs(10);
/// The longest wait.
pub const RETRY_MAX: Duration = Duration::from_secs(300);

/// The pool's name on its nodes for its current template: `pool-<uid>-g<generation>`
/// (also its source machine's name; never `svm-…`, so orphan collection leaves it alone).
pub fn node_pool_name(pool: &SmolVMPool) -> Option<String> {
    node_pool_name_at(pool, pool.metadata.generation)
}

/// What one pass does for one pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The pool's name on its nodes.
    pub name: String,
    /// The nodes that keep its slots: eligible, matching its nodeSelector; sorted.
    pub targets: Vec<String>,
    /// The targets to ask to keep it (their report lacks it, or with other slots).
    pub apply: Vec<String>,
    /// `(node, node pool)` to delete: an older generation's, or on a node it no longer matches.
    pub retire: Vec<(String, String)>,
}

/// The plan for `pool` over `nodes`, `eligible` telling the nodes that can take VMs and match
/// its nodeSelector. `None` for a pool without a UID (not stored yet).
pub fn plan(pool: &SmolVMPool, nodes: &[Arc<SmolVMNode>], eligible: &dyn Fn(&SmolVMNode) -> bool) -> Option<Plan> {
    let prefix = prefix(pool)?;
    let name = node_pool_name(pool)?;
    let slots = pool.spec.slots_per_node;
    let mut plan = Plan {
        name: name.clone(),
        ..Default::default()
    };
    let mut sorted: Vec<&Arc<SmolVMNode>> = nodes.iter().collect();
    sorted.sort_by_key(|n| n.name_any());
    for node in sorted {
        let node_name = node.name_any();
        let target = eligible(node);
        let pools = reported(node);
        if target {
            plan.targets.push(node_name.clone());
            if pools.get(name.as_str()).map(|(_, wanted)| *wanted) != Some(slots) {
                plan.apply.push(node_name.clone());
            }
        }
        for held in pools.keys().filter(|p| p.starts_with(&prefix)) {
            if *held != name || !target {
                plan.retire.push((node_name.clone(), (*held).to_string()));
            }
        }
    }
    Some(plan)
}

/// Whether `name` is a node pool's as [`node_pool_name`] makes them (`pool-<uid>-g<digits>`, the
/// UID a UUID), or as releases before whole UIDs made them (`pool-<8 of [0-9a-z]>-g<digits>`):
/// only those are ever deleted as orphans, never a pool made on the node by other means.
pub fn is_node_pool_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("pool-") else {
        return false;
    };
    let Some((uid, generation)) = rest.rsplit_once("-g") else {
        return false;
    };
    let lower_alnum = |b: u8| b.is_ascii_digit() || b.is_ascii_lowercase();
    let uuid = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit() && !b.is_ascii_uppercase(),
        });
    let legacy = uid.len() == 8 && uid.bytes().all(lower_alnum);
    (uuid || legacy) && !generation.is_empty() && generation.bytes().all(|b| b.is_ascii_digit())
}

/// `(node, node pool)` of every node pool of a pool that no longer exists: named as a pool's
/// (`pool-…-g…`) with a UID no live pool has (compared whole: the prefix ends with `-g`).
pub fn orphans(nodes: &[Arc<SmolVMNode>], live: &[SmolVMPool]) -> Vec<(String, String)> {
    let prefixes: Vec<String> = live.iter().filter_map(prefix).collect();
    let mut out = Vec::new();
    for node in nodes {
        for held in reported(node).keys() {
            if is_node_pool_name(held) && !prefixes.iter().any(|p| held.starts_with(p.as_str())) {
                out.push((node.name_any(), (*held).to_string()));
            }
        }
    }
    out.sort();
    out
}

/// The pool's status after `plan`, given the failures of ApplyPool by node (the agent's
/// message, cleaned), keeping each condition's transition time where its status holds.
pub fn status(
    pool: &SmolVMPool,
    nodes: &[Arc<SmolVMNode>],
    plan: &Plan,
    failures: &BTreeMap<String, String>,
    now: Timestamp,
) -> SmolVMPoolStatus {
    let slots = pool.spec.slots_per_node;
    let by_name: HashMap<String, &Arc<SmolVMNode>> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let per_node: Vec<PoolNodeStatus> = plan
        .targets
        .iter()
        .map(|node| PoolNodeStatus {
            node_name: node.clone(),
            ready: by_name
                .get(node)
                .and_then(|n| reported(n).get(plan.name.as_str()).map(|(ready, _)| *ready))
                .unwrap_or(0)
                .min(slots),
            total: slots,
            message: failures.get(node).cloned(),
        })
        .collect();
    let ready: i32 = per_node.iter().map(|n| n.ready).sum();
    let total = slots.saturating_mul(i32::try_from(per_node.len()).unwrap_or(i32::MAX));
    let mut conditions = pool.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let (state, why, message) = if plan.targets.is_empty() {
        (
            "False",
            reason::NO_MATCHING_NODES,
            "no SmolVMNode that can take VMs matches the pool's nodeSelector".to_string(),
        )
    } else if let Some((node, cause)) = failures.iter().next() {
        let more = match failures.len() {
            1 => String::new(),
            n => format!(" (and {} more node(s))", n - 1),
        };
        ("False", reason::SLOTS_FAILING, format!("{node}: {cause}{more}"))
    } else if ready < total {
        (
            "False",
            reason::SLOTS_FILLING,
            format!("{ready} of {total} slots ready on {} node(s)", per_node.len()),
        )
    } else {
        (
            "True",
            reason::SLOTS_READY,
            format!("{total} slots ready on {} node(s)", per_node.len()),
        )
    };
    set_condition(
        &mut conditions,
        condition::READY,
        state,
        why,
        &message,
        pool.metadata.generation,
        now,
    );
    SmolVMPoolStatus {
        observed_generation: pool.metadata.generation,
        ready_slots: Some(ready),
        total_slots: Some(total),
        nodes: per_node,
        conditions,
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

/// The SmolVM a slot of `pool` is: the template, its class's defaults and the built-in ones, as
/// admission fills a SmolVM that names the pool (M4, M3, M1). `Err` says why it cannot be built.
pub fn slot_vm(pool: &SmolVMPool, classes: &Vec<SmolVMClass>) -> Result<SmolVM, String> {
    let object = json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1",
        "kind": "SmolVM",
        "metadata": {"name": pool.name_any(), "namespace": pool.namespace()},
        "spec": {"poolRef": {"name": pool.name_any()}}
    });
    let patch = default_pooled_smolvm(Operation::Create, &object, pool, classes);
    let mut filled = object;
    json_patch::patch(&mut filled, &patch).map_err(|e| format!("the template does not apply: {e}"))?;
    serde_json::from_value(filled).map_err(|e| format!("the template does not make a SmolVM: {e}"))
}

/// The retries of ApplyPool, per `(node, node pool)`.
#[derive(Debug, Default)]
struct Backoff(HashMap<(String, String), (u32, Instant, String)>);

impl Backoff {
    /// Whether `key` may be tried at `now`.
    fn due(&self, key: &(String, String), now: Instant) -> bool {
        self.0.get(key).is_none_or(|(count, at, _)| {
            let wait = RETRY_FIRST
                .saturating_mul(1 << (*count).saturating_sub(1).min(5))
                .min(RETRY_MAX);
            now.duration_since(*at) >= wait
        })
    }

    fn failed(&mut self, key: (String, String), message: String, now: Instant) {
        let count = self.0.get(&key).map_or(1, |(c, _, _)| c.saturating_add(1));
        self.0.insert(key, (count, now, message));
    }

    fn succeeded(&mut self, key: &(String, String)) {
        self.0.remove(key);
    }

    /// The last failure's message on each node, for the node pool `name`.
    fn failures(&self, name: &str) -> BTreeMap<String, String> {
        self.0
            .iter()
            .filter(|((_, pool), _)| pool == name)
            .map(|((node, _), (_, _, message))| (node.clone(), message.clone()))
            .collect()
    }
}

/// Runs the pools' passes every `every` until the task is dropped.
pub async fn run(ctx: Arc<Context>, every: Duration) {
    let mut backoff = Backoff::default();
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if let Err(error) = pass(&ctx, &mut backoff).await {
            tracing::debug!(%error, "pools pass failed; retried next round");
        }
    }
}

/// One pass over every pool.
async fn pass(ctx: &Context, backoff: &mut Backoff) -> Result<(), kube::Error> {
    let pools: Vec<SmolVMPool> = match &ctx.pools {
        Some(store) if crate::store_ready(store).await => store.state().iter().map(|p| (**p).clone()).collect(),
        _ => {
            Api::<SmolVMPool>::all(ctx.client.clone())
                .list(&ListParams::default())
                .await?
                .items
        }
    };
    let nodes = ctx.nodes.state();
    for (node, name) in orphans(&nodes, &pools) {
        retire(ctx, &node, &name).await;
    }
    if pools.is_empty() {
        return Ok(());
    }
    let classes = Api::<SmolVMClass>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    for pool in &pools {
        keep(ctx, pool, &nodes, &classes, backoff).await;
    }
    Ok(())
}

/// One pool: the plan carried out, then the status written when it says something new.
async fn keep(
    ctx: &Context,
    pool: &SmolVMPool,
    nodes: &[Arc<SmolVMNode>],
    classes: &Vec<SmolVMClass>,
    backoff: &mut Backoff,
) {
    if pool.metadata.deletion_timestamp.is_some() {
        return;
    }
    let now = Timestamp::now();
    let request = Request {
        resources: NodeResources::default(),
        host_ports: Vec::new(),
        node_selector: pool.spec.node_selector.clone().unwrap_or_default(),
        pin: None,
    };
    let eligible = |node: &SmolVMNode| check_node(node, &request, None, now, &ctx.placement).is_none();
    let Some(plan) = plan(pool, nodes, &eligible) else {
        return;
    };
    // The slot's machine, made once per pass: what ApplyPool sends and what the ledger books.
    let slot = slot_vm(pool, classes);
    let kept = match (&slot, plan.apply.is_empty()) {
        (_, true) => Vec::new(),
        (Ok(slot), false) => match source_spec(ctx, pool, slot).await {
            Ok(spec) => apply(ctx, pool, &plan, &spec, backoff).await,
            Err(message) => fail_all(&plan, &message, backoff),
        },
        (Err(message), false) => fail_all(&plan, message, backoff),
    };
    if let Ok(slot) = &slot {
        book(ctx, pool, &plan, nodes, &kept, &Request::of(slot).resources);
    }
    for (node, name) in &plan.retire {
        retire(ctx, node, name).await;
    }
    let mut failures = backoff.failures(&plan.name);
    failures.retain(|node, _| plan.targets.contains(node));
    let next = status(pool, nodes, &plan, &failures, now);
    if same(pool.status.as_ref(), &next) {
        return;
    }
    let api: Api<SmolVMPool> = Api::namespaced(ctx.client.clone(), pool.namespace());
    let patch = json!({ "status": next });
    if let Err(error) = api
        .patch_status(&pool.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::debug!(pool = %pool.name_any(), %error, "writing the pool's status failed; retried next round");
    }
}

/// ApplyPool on each node of `plan.apply` whose backoff is over; the nodes that took it.
async fn apply(ctx: &Context, pool: &SmolVMPool, plan: &Plan, spec: &PoolSpec, backoff: &mut Backoff) -> Vec<String> {
    let mut kept = Vec::new();
    for node in &plan.apply {
        let key = (node.clone(), plan.name.clone());
        if !backoff.due(&key, Instant::now()) {
            continue;
        }
        crate::vm::act::sync_endpoint(ctx, node);
        match ctx.node_client.apply_pool(node, &plan.name, spec).await {
            Ok(_) => {
                backoff.succeeded(&key);
                kept.push(node.clone());
            }
            Err(error) => {
                tracing::info!(pool = %pool.name_any(), %node, code = ?error.code(), message = error.message(), "ApplyPool failed");
                backoff.failed(key, error.message().to_string(), Instant::now());
            }
        }
    }
    kept
}

/// Every node of `plan.apply` failed for `message` (the spec could not be made); none took it.
fn fail_all(plan: &Plan, message: &str, backoff: &mut Backoff) -> Vec<String> {
    for node in &plan.apply {
        backoff.failed((node.clone(), plan.name.clone()), message.to_string(), Instant::now());
    }
    Vec::new()
}

/// The node pool `name` deleted on `node`; one still serving machines stays (asked again later).
async fn retire(ctx: &Context, node: &str, name: &str) {
    crate::vm::act::sync_endpoint(ctx, node);
    match ctx.node_client.delete_pool(node, name).await {
        Ok(_) => {
            tracing::info!(%node, pool = %name, "node pool deleted");
            ctx.ledger.release(&pool_ledger_key(node, name));
        }
        Err(error) if error.code() == Some(&ErrorCode::PoolInUse) => {}
        Err(error) => tracing::debug!(%node, pool = %name, %error, "deleting a node pool failed; retried next round"),
    }
}

/// What a node pool holds on its node: its source machine and its ready slots, each a slot's
/// machine (the machines served from it are SmolVMs, booked as theirs).
pub fn pool_holds(slot: &NodeResources, slots: i32) -> NodeResources {
    let n = i64::from(slots.max(0)).saturating_add(1);
    NodeResources {
        cpus: slot.cpus.saturating_mul(n),
        memory_mib: slot.memory_mib.saturating_mul(n),
        storage_gib: slot.storage_gib.saturating_mul(n),
    }
}

/// Books what the pool holds on each target node where it is kept (reported by the node, or
/// applied in this pass), and releases it where it is not.
fn book(
    ctx: &Context,
    pool: &SmolVMPool,
    plan: &Plan,
    nodes: &[Arc<SmolVMNode>],
    kept: &[String],
    slot: &NodeResources,
) {
    let holds = Request {
        resources: pool_holds(slot, pool.spec.slots_per_node),
        host_ports: Vec::new(),
        node_selector: Default::default(),
        pin: None,
    };
    for node in &plan.targets {
        let key = pool_ledger_key(node, &plan.name);
        let reported = nodes
            .iter()
            .find(|n| &n.name_any() == node)
            .is_some_and(|n| reported(n).contains_key(plan.name.as_str()));
        if reported || kept.contains(node) {
            ctx.ledger.observe_bound(&key, node, &holds);
        } else {
            ctx.ledger.release(&key);
        }
    }
}

/// What ApplyPool sends for `pool`: its slot's machine `vm`, env values and registry credential
/// resolved in its namespace.
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
