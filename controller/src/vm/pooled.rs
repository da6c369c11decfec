//! A SmolVM that names a pool, at its create: served from a ready slot of its pool on its node
//! (node API LeaseMachine), or, when none is ready there, created cold from its template or
//! left waiting, as the pool's `whenEmpty` says. Its machine is `svm-<uid>` either way.
//!
//! The slots that may serve it are those of the template it was filled from at admission (its
//! `vm.smolvm.dev/pool-generation`): after a template change its node pool is retired and it is
//! created cold, from the spec it holds.

use kube::{Api, ResourceExt, runtime::reflector::ObjectRef};
use smolvm_api::{
    SmolVM, SmolVMPool,
    constants::{ANNOTATION_POOL_GENERATION, reason},
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
    Warm(MachineStatus, String),
    /// Created cold from its spec, as any SmolVM (it names no pool, its pool is gone or
    /// drained with `whenEmpty: Cold`).
    Cold,
    /// Not created: it waits for a slot (`whenEmpty: Wait`), or the lease failed.
    Not(Failure),
}

/// The pool `vm` names and the name on its nodes of the node pool whose slots may serve it (the
/// template it was filled from); `None` for a SmolVM that names no pool, or whose pool is gone.
pub async fn pool_of(ctx: &Context, vm: &SmolVM) -> Result<Option<(SmolVMPool, String)>, Error> {
    let Some(pool_ref) = &vm.spec.pool_ref else {
        return Ok(None);
    };
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
        return Ok(None);
    };
    let generation = vm
        .annotations()
        .get(ANNOTATION_POOL_GENERATION)
        .and_then(|g| g.parse::<i64>().ok())
        .or(pool.metadata.generation);
    Ok(crate::placement::node_pool_name_at(&pool, generation).map(|name| (pool, name)))
}

/// Serves `vm`'s machine `machine` on `node` from its pool when it names one; `env` is its
/// workload's environment, resolved, which the lease carries.
pub async fn serve(ctx: &Context, vm: &SmolVM, node: &str, machine: &str, env: &[EnvVar]) -> Result<Served, Error> {
    let Some((pool, node_pool)) = pool_of(ctx, vm).await? else {
        return Ok(Served::Cold);
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
        Ok(status) => Ok(Served::Warm(status, pool_name)),
        Err(error) if matches!(error.code(), Some(ErrorCode::NoReadySlot | ErrorCode::PoolNotFound)) => {
            let empty = format!("pool {pool_name} has no ready slot on node {node}");
            if pool.when_empty() == WhenEmpty::Wait {
                return Ok(Served::Not(Failure::Config {
                    reason: reason::WAITING_FOR_SLOT,
                    message: format!("{empty}; whenEmpty is Wait: it is served once one is ready"),
                }));
            }
            let note = format!("{empty}: created cold from its template (whenEmpty: Cold)");
            super::report::publish(ctx, vm, &Note::normal(reason::POOL_EMPTY, "Create", note)).await;
            Ok(Served::Cold)
        }
        Err(error) => Ok(Served::Not(Failure::Call(error))),
    }
}
