//! The SmolVMNode watch: keeps the node cache and wakes the SmolVMs a node change concerns.

use std::time::Duration;

use futures::StreamExt;
use kube::{
    ResourceExt,
    runtime::{
        reflector::{self, ObjectRef},
        watcher,
    },
};
use smolvm_api::{SmolVM, SmolVMNode};

use crate::placement;

/// Keeps the SmolVMNode cache and wakes the VMs a node change concerns: the VMs bound to the
/// node and the VMs still waiting for one. The runtime heartbeats every few seconds; a heartbeat
/// alone changes nothing placement or health reads, so it wakes nobody (the slow resync checks
/// the runtimes). A dead runtime sends nothing; the look at the cache every 2 s finds its
/// heartbeat gone stale soon after the timeout, and its VMs then report the node unreachable.
pub async fn watch(
    events: impl futures::Stream<Item = Result<watcher::Event<SmolVMNode>, watcher::Error>> + Send,
    nodes: reflector::Store<SmolVMNode>,
    vms: reflector::Store<SmolVM>,
    wake: futures::channel::mpsc::UnboundedSender<ObjectRef<SmolVM>>,
    heartbeat_timeout: k8s_openapi::jiff::SignedDuration,
) {
    let wake_for = |node: &str| {
        for vm in vms.state() {
            if vm.bound_node().is_none_or(|b| b == node) {
                // The receiver is gone only when the controller stopped.
                let _ = wake.unbounded_send(ObjectRef::from_obj(vm.as_ref()));
            }
        }
    };
    let mut tracker = placement::NodeTracker::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events = std::pin::pin!(events);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node))) => {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    if tracker.applied(&node, now, heartbeat_timeout) {
                        wake_for(&node.name_any());
                    }
                }
                Some(Ok(watcher::Event::Delete(node))) => {
                    if tracker.deleted(&node.name_any()) {
                        wake_for(&node.name_any());
                    }
                }
                Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "SmolVMNode watch error"),
                None => return,
            },
            _ = tick.tick() => {
                let now = k8s_openapi::jiff::Timestamp::now();
                let state = nodes.state();
                for name in tracker.tick(state.iter().map(|n| n.as_ref()), now, heartbeat_timeout) {
                    wake_for(&name);
                }
            }
        }
    }
}
