//! A SmolVM that names a pool, at its create: served from a ready slot of its pool on its node
//! (node API LeaseMachine), or, when none is ready there, created cold from its template or
//! left waiting, as the pool's `whenEmpty` says. Its machine is `svm-<uid>` either way.
//!
//! The slots that may serve it are those of the pool and template it was filled from at
//! admission (its `vm.smolvm.dev/pool-uid` and `vm.smolvm.dev/pool-generation`): after a template
//! change its node pool is retired and it is created cold, from the spec it holds; a pool
//! deleted and made again under the same name never serves it ([`serving`]).

use kube::{Api, ResourceExt, runtime::reflector::ObjectRef};
use smolvm_api::{
    SmolVM, SmolVMPool,
    constants::{ANNOTATION_POOL_GENERATION, ANNOTATION_POOL_UID, reason},
    nodeapi::{EnvVar, ErrorCode, LeaseRequest, MachineStatus, Operation},
    pool::WhenEmpty,
};

use super::decide::{Failure, Note};
use super::{Context, Error};

/// How a pooled SmolVM's create goes.
#[derive(Debug)]
pub enum Served {
    /// From a ready slot of the named SmolVMPool: the machine runs. The pass's event says so
    /// (`ServedFromPool`, [`super::rules::step_events`]).
    Warm(Box<MachineStatus>, String),
    /// Created cold from its spec, as any SmolVM (it names no pool, its pool is gone or
    /// drained with `whenEmpty: Cold`).
    Cold,
    /// Not created: it waits for a slot (`whenEmpty: Wait`), or the lease failed.
    Not(Failure),
}

/// What a SmolVM that names a pool finds of it.
#[derive(Debug, Clone)]
pub enum PoolOf {
    /// It names no pool, or its pool is gone: created cold from the spec it holds.
    None,
    /// Its pool was deleted and made again under the same name after it was admitted (the pool's
    /// UID is not the one recorded at admission): slots of the new template never serve it.
    Replaced(SmolVMPool),
    /// Its pool, and the name on its nodes of the node pool whose slots may serve it.
    Current(SmolVMPool, String),
}

impl PoolOf {
    /// The node pool whose ready slots may serve the SmolVM, if any.
    pub fn node_pool(&self) -> Option<&str> {
        match self {
            PoolOf::Current(_, name) => Some(name),
            _ => None,
        }
    }
}

/// Which of `pool`'s node pools may serve `vm`, which names it: the one of the template `vm`
/// was filled from (its `vm.smolvm.dev/pool-generation`), and only if `pool` is the pool it
/// was admitted for (its `vm.smolvm.dev/pool-uid`; a SmolVM admitted before the UID was
/// recorded is the pool's only if the pool is not newer than the SmolVM). Pure.
pub fn serving(vm: &SmolVM, pool: SmolVMPool) -> PoolOf {
    let annotations = vm.annotations();
    let same = match annotations.get(ANNOTATION_POOL_UID) {
        Some(uid) => pool.metadata.uid.as_deref() == Some(uid.as_str()),
        None => match (&vm.metadata.creation_timestamp, &pool.metadata.creation_timestamp) {
            (Some(vm_made), Some(pool_made)) => pool_made.0 <= vm_made.0,
            _ => true,
        },
    };
    if !same {
        return PoolOf::Replaced(pool);
    }
    let generation = annotations
        .get(ANNOTATION_POOL_GENERATION)
        .and_then(|g| g.parse::<i64>().ok())
        .or(pool.metadata.generation);
    match crate::placement::node_pool_name_at(&pool, generation) {
        Some(name) => PoolOf::Current(pool, name),
        None => PoolOf::None,
    }
}

/// The pool `vm` names, as [`serving`] judges it (from the cache, or the API server for a pool
/// the cache does not hold yet).
pub async fn pool_of(ctx: &Context, vm: &SmolVM) -> Result<PoolOf, Error> {
    let Some(pool_ref) = &vm.spec.pool_ref else {
        return Ok(PoolOf::None);
    };
    // A lease takes no mounts (SPEC 2.5): a SmolVM with volumes is created cold, never warm.
    if vm.spec.volumes.as_ref().is_some_and(|v| !v.is_empty()) {
        return Ok(PoolOf::None);
    }
    let namespace = vm.namespace().unwrap_or_default();
    // The cache first; the API server for a pool it does not hold (yet).
    let cached = ctx
        .pools
        .as_ref()
        .and_then(|store| store.get(&ObjectRef::new(&pool_ref.name).within(&namespace)))
        .map(|pool| (*pool).clone());
    let pool = match cached {
        Some(pool) => Some(pool),
        None => {
            let api: Api<SmolVMPool> = Api::namespaced(ctx.client.clone(), &namespace);
            api.get_opt(&pool_ref.name).await?
        }
    };
    let Some(pool) = pool else {
        tracing::info!(vm = %vm.name_any(), pool = %pool_ref.name, "the pool is gone: created cold from the spec it holds");
        return Ok(PoolOf::None);
    };
    Ok(serving(vm, pool))
}

/// Serves `vm`'s machine `machine` on `node` from its pool when it names one; `env` is its
/// workload's environment, resolved, which the lease carries.
pub async fn serve(ctx: &Context, vm: &SmolVM, node: &str, machine: &str, env: &[EnvVar]) -> Result<Served, Error> {
    let (pool, node_pool) = match pool_of(ctx, vm).await? {
        PoolOf::None => return Ok(Served::Cold),
        PoolOf::Replaced(pool) => return Ok(replaced(ctx, vm, &pool).await),
        PoolOf::Current(pool, node_pool) => (pool, node_pool),
    };
    let pool_name = pool.name_any();
    let request = LeaseRequest {
        pool: node_pool.clone(),
        env: env.to_vec(),
    };
    let start = std::time::Instant::now();
    let leased = ctx.node_client.lease_machine(node, machine, &request).await;
    ctx.metrics
        .runtime_call(Operation::LeaseMachine.name(), start.elapsed());
    match leased {
        Ok(status) => Ok(Served::Warm(Box::new(status), pool_name)),
        Err(error) if matches!(error.code(), Some(ErrorCode::NoReadySlot | ErrorCode::PoolNotFound)) => {
            let empty = format!("pool {pool_name} has no ready slot on node {node}");
            if pool.when_empty() == WhenEmpty::Wait {
                return Ok(Served::Not(Failure::Config {
                    reason: reason::WAITING_FOR_SLOT,
                    message: format!("{empty}; whenEmpty is Wait: it is served once one is ready"),
                }));
            }
            let note = format!("{empty}: created cold from its template (whenEmpty: Cold)");
            super::events::publish(ctx, vm, &Note::normal(reason::POOL_EMPTY, "Create", note)).await;
            Ok(Served::Cold)
        }
        Err(error) => Ok(Served::Not(Failure::Call(error))),
    }
}

/// A SmolVM whose pool was replaced: created cold from the spec it holds (the old template's),
/// or, where the new pool's `whenEmpty` is Wait, left waiting with a message saying why.
async fn replaced(ctx: &Context, vm: &SmolVM, pool: &SmolVMPool) -> Served {
    let pool_name = pool.name_any();
    let why = format!(
        "pool {pool_name} was deleted and made again after this SmolVM was admitted: the new pool's slots never serve it"
    );
    if pool.when_empty() == WhenEmpty::Wait {
        return Served::Not(Failure::Config {
            reason: reason::WAITING_FOR_SLOT,
            message: format!(
                "{why}; whenEmpty is Wait, so it is not created cold either: delete it and create it again to take the new template"
            ),
        });
    }
    let note = format!("{why}: created cold from the spec it holds");
    super::events::publish(ctx, vm, &Note::normal(reason::POOL_EMPTY, "Create", note)).await;
    Served::Cold
}
