//! A SmolVM that names a pool: its pool observed ([`pool_of`], once per pass, from the cache)
//! for decide, which makes its create a lease of a ready slot of its pool on its node (node API
//! LeaseMachine), a cold create, or a wait, as the pool's `whenEmpty` says
//! ([`super::rules::create_call`]). Its machine is `svm-<uid>` either way.
//!
//! The slots that may serve it are those of the pool and template it was filled from at
//! admission (its `vm.smolvm.dev/pool-uid` and `vm.smolvm.dev/pool-generation`): after a template
//! change its node pool is retired and it is created cold, from the spec it holds; a pool
//! deleted and made again under the same name never serves it ([`serving`]).

pub use super::rules::{PoolOf, serving};

use kube::{Api, ResourceExt, runtime::reflector::ObjectRef};
use smolvm_api::{SmolVM, SmolVMPool};

use super::{Context, Error};

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
        .get(&ObjectRef::new(&pool_ref.name).within(&namespace))
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
