//! Releasing the placement reservations of SmolVMs that are gone.

use std::{collections::HashSet, sync::Arc, time::Duration};

use kube::{ResourceExt, runtime::reflector};
use smolvm_api::SmolVM;

use crate::vm::Context;

/// Every `every`, releases the reservations of VMs no longer in the cache (a delete the watch
/// missed while it was disconnected; the watch's own delete events release at once).
pub async fn prune(ctx: Arc<Context>, vms: reflector::Store<SmolVM>, every: Duration) {
    if !crate::store_ready(&vms).await {
        return;
    }
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        // The reserved UIDs first, then the cache: a VM reserved in between is in the cache.
        let reserved = ctx.ledger.reserved_uids();
        let live: HashSet<String> = vms.state().iter().filter_map(|vm| vm.uid()).collect();
        for uid in ctx.ledger.release_gone(&reserved, &live) {
            ctx.unsettled.reset(&uid);
            tracing::info!(uid = %uid, "released the reservation of a SmolVM that is gone");
        }
    }
}
