//! The SmolVMNode watch: keeps the node cache and wakes the SmolVMs a node change concerns.

use std::time::Duration;

use futures::StreamExt;
use kube::runtime::events::{Event, EventType};
use kube::{
    ResourceExt,
    runtime::{
        reflector::{self, ObjectRef},
        watcher,
    },
};
use smolvm_api::{SmolVM, SmolVMNode, constants::reason};

use crate::events::EventSink;
use crate::heartbeat::SKEW_REPORTED;
use crate::placement;

/// Keeps the SmolVMNode cache and wakes the VMs a node change concerns: the VMs bound to the
/// node and the VMs still waiting for one. The runtime heartbeats every few seconds; a heartbeat
/// alone changes nothing placement or health reads, so it wakes nobody (the slow resync checks
/// the runtimes). A dead runtime sends nothing; the look at the cache every 2 s finds its
/// heartbeat gone stale soon after the timeout, and its VMs then report the node unreachable.
/// Freshness is judged by `liveness` (the controller's own clock, which this watch feeds); a
/// node whose clock is far from the controller's gets a ClockSkew event (`sink`), and one whose
/// heartbeat goes stale a HeartbeatLost event (HeartbeatResumed when it is back): its agent
/// cannot write its own status then, so this is where `kubectl describe svmn` learns of it.
pub async fn watch(
    events: impl futures::Stream<Item = Result<watcher::Event<SmolVMNode>, watcher::Error>> + Send,
    nodes: reflector::Store<SmolVMNode>,
    vms: reflector::Store<SmolVM>,
    wake: futures::channel::mpsc::UnboundedSender<ObjectRef<SmolVM>>,
    liveness: placement::Config,
    (sink, use_seen): (Option<EventSink>, Option<std::sync::Arc<crate::vm::idle::UseSeen>>),
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
    let mut lost = std::collections::HashSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events = std::pin::pin!(events);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node))) => {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    // A wake a node newly asks for wants its VM's pass now (SPEC 2.7).
                    for machine in use_seen.as_ref().map(|s| s.node_seen(&node, now)).unwrap_or_default() {
                        if let Some(vm) = vms.state().into_iter().find(|vm| vm.machine_name().as_ref() == Some(&machine)) {
                            let _ = wake.unbounded_send(ObjectRef::from_obj(vm.as_ref()));
                        }
                    }
                    if let Some(clock) = &liveness.clock
                        && let Some(skew) = clock.look(&node, now).skew
                        && skew.abs() > SKEW_REPORTED
                    {
                        report_skew(sink.as_ref(), &node, skew).await;
                    }
                    if tracker.applied(&node, now, &liveness) {
                        wake_for(&node.name_any());
                        // A heartbeat that comes back arrives here, not at the tick.
                        judge_heartbeat(&mut lost, &node, now, &liveness, sink.as_ref()).await;
                    }
                }
                Some(Ok(watcher::Event::Delete(node))) => {
                    if let Some(seen) = &use_seen {
                        seen.forget_node(&node.name_any());
                    }
                    if let Some(clock) = &liveness.clock {
                        clock.forget(&node.name_any());
                    }
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
                for name in tracker.tick(state.iter().map(|n| n.as_ref()), now, &liveness) {
                    wake_for(&name);
                    match state.iter().find(|n| n.name_any() == name) {
                        Some(node) => judge_heartbeat(&mut lost, node, now, &liveness, sink.as_ref()).await,
                        None => {
                            lost.remove(&name);
                        }
                    }
                }
            }
        }
    }
}

/// Publishes HeartbeatLost or HeartbeatResumed for `node` if its freshness turned since the
/// last event (`lost` holds the nodes reported lost and not yet back).
async fn judge_heartbeat(
    lost: &mut std::collections::HashSet<String>,
    node: &SmolVMNode,
    now: k8s_openapi::jiff::Timestamp,
    liveness: &placement::Config,
    sink: Option<&EventSink>,
) {
    let name = node.name_any();
    match heartbeat_turn(lost.contains(&name), heartbeat_seen(node), liveness.fresh(node, now)) {
        Some(Turn::Lost) => {
            lost.insert(name);
            report_heartbeat(sink, node, Turn::Lost, liveness.heartbeat_age(node, now), liveness).await;
        }
        Some(Turn::Resumed) => {
            lost.remove(&name);
            report_heartbeat(sink, node, Turn::Resumed, None, liveness).await;
        }
        None => {}
    }
}

/// What a change of a node's heartbeat freshness is worth an event for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    /// It went stale.
    Lost,
    /// It is fresh again after it was reported lost.
    Resumed,
}

/// Whether the node ever reported a heartbeat (a node its agent has not yet reported is not
/// "lost": it never came).
fn heartbeat_seen(node: &SmolVMNode) -> bool {
    node.status.as_ref().and_then(|s| s.heartbeat_time.as_ref()).is_some()
}

/// The event a freshness change is worth: `reported_lost` is whether a HeartbeatLost was
/// published for the node and not yet answered by a HeartbeatResumed.
fn heartbeat_turn(reported_lost: bool, seen: bool, fresh: bool) -> Option<Turn> {
    match (reported_lost, seen, fresh) {
        (false, true, false) => Some(Turn::Lost),
        (true, _, true) => Some(Turn::Resumed),
        _ => None,
    }
}

/// A Warning event on the node when its heartbeat went stale (`age` old), a Normal one when it
/// is back.
async fn report_heartbeat(
    sink: Option<&EventSink>,
    node: &SmolVMNode,
    turn: Turn,
    age: Option<k8s_openapi::jiff::SignedDuration>,
    liveness: &placement::Config,
) {
    let timeout = liveness.heartbeat_timeout.as_secs();
    let (type_, reason, note) = match turn {
        Turn::Lost => (
            EventType::Warning,
            reason::HEARTBEAT_LOST,
            format!(
                "no heartbeat from the node's runtime agent for {}s (the timeout is {timeout}s): the agent is down, cut off from the API server, or cannot verify it (a clock set far behind sees the API server's certificate as not yet valid; the agent's log names the cause). Its VMs report the node unreachable, and no VM is placed here",
                age.map_or(timeout, |a| a.as_secs().abs())
            ),
        ),
        Turn::Resumed => (
            EventType::Normal,
            reason::HEARTBEAT_RESUMED,
            "the node's runtime agent heartbeats again".to_string(),
        ),
    };
    tracing::warn!(node = %node.name_any(), reason, "node heartbeat {}", if turn == Turn::Lost { "lost" } else { "resumed" });
    publish(sink, node, type_, reason, note).await;
}

/// Publishes a JudgeHeartbeat event on `node` (nothing without a sink).
async fn publish(sink: Option<&EventSink>, node: &SmolVMNode, type_: EventType, reason: &str, note: String) {
    let Some(sink) = sink else { return };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "JudgeHeartbeat".into(),
        secondary: None,
    };
    let regarding = crate::events::node_reference(node.metadata.name.clone(), node.metadata.uid.clone());
    if let Err(error) = sink.publish(&event, &regarding).await {
        tracing::warn!(%error, reason, "could not publish the node's event");
    }
}

/// A Warning event on the node: its clock is `skew` away from the controller's. Freshness never
/// depends on it (it is judged by the controller's clock), but certificates, logs and anything
/// else that compares times on that node will be off.
async fn report_skew(sink: Option<&EventSink>, node: &SmolVMNode, skew: k8s_openapi::jiff::SignedDuration) {
    let direction = if skew.is_positive() { "ahead of" } else { "behind" };
    let note = format!(
        "the node's clock is about {}s {direction} the controller's (seen from its heartbeat); freshness is judged by the controller's clock, but certificates and logs on that node read wrong times: run an NTP client there",
        skew.as_secs().abs()
    );
    tracing::warn!(node = %node.name_any(), skew_secs = skew.as_secs(), "node clock skew");
    publish(sink, node, EventType::Warning, reason::CLOCK_SKEW, note).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_turn_is_reported_once_each_way() {
        // (name, reported lost, ever seen, fresh now, event)
        let cases = [
            ("went stale", false, true, false, Some(Turn::Lost)),
            ("stale again: already reported", true, true, false, None),
            ("fresh after a report", true, true, true, Some(Turn::Resumed)),
            ("fresh, never lost", false, true, true, None),
            ("never reported a heartbeat", false, false, false, None),
        ];
        for (name, reported, seen, fresh, want) in cases {
            assert_eq!(heartbeat_turn(reported, seen, fresh), want, "{name}");
        }
    }
}
