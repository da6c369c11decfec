//! Observe: what a pass reads before it decides. The SmolVM's node, its Service and EndpointSlice
//! and its volumes ([`super::volumes::kube::observe`]), from the caches (the API server only for
//! what a cache does not hold), gathered into [`Observed`] with the node's health, the room the
//! ledger leaves it and its start backoff.

use std::sync::Arc;

use k8s_openapi::{
    NamespaceResourceScope,
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    jiff::Timestamp,
};
use kube::{
    Api, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use smolvm_api::{SmolVM, SmolVMNode, constants::condition};

use super::decide::{Observed, Room};
use super::rules;
use super::volumes::{self, kube::Look};
use super::{Context, Error};

/// What the binding pass of a SmolVM read already, which the rest of the pass does not read
/// again: its pool and its branch source (`None`: not read).
#[derive(Debug, Default)]
pub(super) struct Prior {
    /// Its pool.
    pub(super) pool: Option<rules::PoolOf>,
    /// Its branch source.
    pub(super) source: Option<rules::BranchSource>,
}

/// What is around a bound SmolVM, as a pass read it: its node's SmolVMNode, its Service and
/// EndpointSlice, its volumes. [`Observed`] borrows from it.
pub(super) struct Around {
    node_object: Option<Arc<SmolVMNode>>,
    service: Option<Arc<Service>>,
    slice: Option<Arc<EndpointSlice>>,
    volumes: Option<volumes::Seen>,
    pool: rules::PoolOf,
    source: rules::BranchSource,
}

impl Around {
    /// Reads what is around `vm`, bound to `node`; its pool as `pool` says (the binding pass
    /// of a warm claim read it already), or, for a SmolVM whose machine was never made, read
    /// now ([`super::pooled::pool_of`]). A SmolVM takes its pool's template once, at its create:
    /// one made already (whose machine is lost and made again, say) is made cold. A branch's
    /// source likewise: as `source` says (the binding pass read it), or read now
    /// ([`super::branched::source_of`]) for a branch whose machine was never made.
    pub(super) async fn read(ctx: &Context, vm: &SmolVM, node: &str, prior: Prior) -> Result<Around, Error> {
        let Prior { pool, source } = prior;
        let node_object = ctx.nodes.get(&ObjectRef::new(node));
        let (service, slice) = owned_objects(ctx, vm, vm.spec.expose_service()).await?;
        let volumes = volumes::kube::observe(ctx, vm, Look::Bound).await?;
        let never_made = vm.status.as_ref().is_none_or(|s| s.effective.is_none());
        let pool = match pool {
            Some(pool) => pool,
            None if never_made => super::pooled::pool_of(ctx, vm).await?,
            None => rules::PoolOf::None,
        };
        let source = match source {
            Some(source) => source,
            None if never_made => super::branched::source_of(ctx, vm).await?,
            None => rules::BranchSource::None,
        };
        Ok(Around {
            node_object,
            service,
            slice,
            volumes,
            pool,
            source,
        })
    }

    /// What decide works from: what was read, the node's health at `now`, the room the ledger
    /// leaves the VM (`uid`) on its node, and how long its next start waits.
    pub(super) fn observed<'a>(
        &'a self,
        ctx: &Context,
        vm: &'a SmolVM,
        (node, machine): (&'a str, &'a str),
        uid: &str,
        now: Timestamp,
    ) -> Observed<'a> {
        let node_object = self.node_object.as_deref();
        Observed {
            vm,
            node,
            machine,
            node_object,
            health: rules::node_health(vm, node_object, now, &ctx.placement),
            service: self.service.as_deref(),
            slice: self.slice.as_deref(),
            room: Room {
                allocatable: node_object.and_then(|n| n.status.as_ref()).and_then(|s| s.allocatable),
                others: ctx.ledger.used_by_others(node, uid),
            },
            now,
            start_backoff: ctx
                .start_failures
                .hold(uid, vm.metadata.generation, std::time::Instant::now()),
            volumes: self.volumes.as_ref(),
            pool: &self.pool,
            source: &self.source,
            seen: ctx.use_seen.use_of(node, machine, now),
            quota_refused: None,
        }
    }
}

/// The Service and EndpointSlice of the SmolVM's name: from the caches, or read from the API
/// server when a cache does not hold one and `wanted` (a foreign object of that name is not in
/// the caches, which hold only the controller's own). Without caches, a SmolVM that had its
/// Service (its status has the ServiceExposed condition) has them read too, to remove them.
pub(super) async fn owned_objects(
    ctx: &Context,
    vm: &SmolVM,
    wanted: bool,
) -> Result<(Option<Arc<Service>>, Option<Arc<EndpointSlice>>), Error> {
    let had = vm
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == condition::SERVICE_EXPOSED));
    let service = cached_or_read(ctx, ctx.owned.services.as_ref(), vm, wanted, had).await?;
    let slice = cached_or_read(ctx, ctx.owned.slices.as_ref(), vm, wanted, had).await?;
    Ok((service, slice))
}

/// One object of the SmolVM's name and namespace: from `cache`, else read when it is `wanted`,
/// or when there is no cache and the SmolVM `had` one.
async fn cached_or_read<K>(
    ctx: &Context,
    cache: Option<&Store<K>>,
    vm: &SmolVM,
    wanted: bool,
    had: bool,
) -> Result<Option<Arc<K>>, Error>
where
    K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + 'static,
{
    let (name, namespace) = (vm.name_any(), vm.namespace().unwrap_or_default());
    if let Some(cached) = cache.and_then(|c| c.get(&ObjectRef::new(&name).within(&namespace))) {
        return Ok(Some(cached));
    }
    if wanted || (had && cache.is_none()) {
        let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
        return Ok(api.get_opt(&name).await?.map(Arc::new));
    }
    Ok(None)
}
