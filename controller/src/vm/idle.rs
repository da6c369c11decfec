//! What the controller saw of each machine's use (SPEC 2.7), for the pure idle rule
//! ([`super::rules::sleep`]): when, by the controller's own clock, each machine's activity as its
//! node reports it last changed, or the controller last started or resumed it; and which
//! machines their nodes ask to wake.
//!
//! The node's clock is never compared with the controller's: a reported `lastActiveTime` is a
//! marker whose changes are noted when the watch brings them, as the heartbeat's freshness is
//! judged. A controller that starts (or takes over the lease) has seen nothing yet: each running
//! machine's quiet time starts when it first looks, so it never suspends a VM sooner than its
//! `suspendAfterIdle` after that.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use smolvm_api::SmolVMNode;

use super::rules;

/// One machine's use as the controller saw it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// The `lastActiveTime` its node last reported (`None`: none reported).
    marker: Option<Timestamp>,
    /// When the controller last saw it change, or started or resumed the machine.
    at: Timestamp,
}

#[derive(Debug, Default)]
struct Inner {
    machines: HashMap<String, Seen>,
    /// The wakes each node asks for now, and when the controller first saw each asked.
    wakes: HashMap<String, BTreeMap<String, Instant>>,
}

/// What the controller saw of the machines' use, fed by the SmolVMNode watch and by the
/// controller's own starts and resumes.
#[derive(Debug, Default)]
pub struct UseSeen(Mutex<Inner>);

impl UseSeen {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `node` as the watch brought it at `now`: notes the machines whose reported activity
    /// changed, and returns those whose wake it newly asks for (their SmolVMs want a pass now).
    pub fn node_seen(&self, node: &SmolVMNode, now: Timestamp) -> Vec<String> {
        let status = node.status.as_ref();
        let mut inner = self.lock();
        for reported in status.and_then(|s| s.activity.as_deref()).unwrap_or_default() {
            let marker = Some(reported.last_active_time.0);
            let seen = inner
                .machines
                .entry(reported.name.clone())
                .or_insert(Seen { marker, at: now });
            if seen.marker != marker {
                *seen = Seen { marker, at: now };
            }
        }
        let before = inner.wakes.remove(&node.name_any()).unwrap_or_default();
        let asked: BTreeMap<String, Instant> = status
            .and_then(|s| s.wake_requests.as_deref())
            .unwrap_or_default()
            .iter()
            .map(|m| (m.clone(), before.get(m).copied().unwrap_or_else(Instant::now)))
            .collect();
        let new = asked.keys().filter(|m| !before.contains_key(*m)).cloned().collect();
        inner.wakes.insert(node.name_any(), asked);
        new
    }

    /// How long ago the controller first saw `node` ask to wake `machine`, while it asks.
    pub fn wake_waited(&self, node: &str, machine: &str) -> Option<Duration> {
        let inner = self.lock();
        inner.wakes.get(node)?.get(machine).map(Instant::elapsed)
    }

    /// What was seen of `machine` on `node` at `now`: a machine not seen yet is quiet from now.
    pub fn use_of(&self, node: &str, machine: &str, now: Timestamp) -> rules::Use {
        let mut inner = self.lock();
        let quiet_since = inner
            .machines
            .entry(machine.to_string())
            .or_insert(Seen { marker: None, at: now })
            .at;
        let wake_asked = inner.wakes.get(node).is_some_and(|w| w.contains_key(machine));
        rules::Use {
            quiet_since,
            wake_asked,
        }
    }

    /// The controller started or resumed `machine` at `now`: it is quiet from then.
    pub fn started(&self, machine: &str, now: Timestamp) {
        let mut inner = self.lock();
        let seen = inner
            .machines
            .entry(machine.to_string())
            .or_insert(Seen { marker: None, at: now });
        seen.at = now;
    }

    /// Forgets `machine` (its SmolVM is gone).
    pub fn forget(&self, machine: &str) {
        self.lock().machines.remove(machine);
    }

    /// Forgets a node that is gone.
    pub fn forget_node(&self, node: &str) {
        self.lock().wakes.remove(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use smolvm_api::{MachineActivity, SmolVMNodeSpec, SmolVMNodeStatus};

    fn node(activity: &[(&str, i64)], wakes: &[&str]) -> SmolVMNode {
        let mut node = SmolVMNode::new("n1", SmolVMNodeSpec::default());
        node.status = Some(SmolVMNodeStatus {
            activity: Some(
                activity
                    .iter()
                    .map(|(name, at)| MachineActivity {
                        name: name.to_string(),
                        last_active_time: Time(Timestamp::from_second(*at).unwrap_or_default()),
                    })
                    .collect(),
            ),
            wake_requests: Some(wakes.iter().map(|w| w.to_string()).collect()),
            ..SmolVMNodeStatus::default()
        });
        node
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap_or_default()
    }

    #[test]
    fn quiet_time_counts_from_the_last_change_the_controller_saw() {
        let seen = UseSeen::default();
        // Nothing seen: quiet from the first look.
        assert_eq!(seen.use_of("n1", "svm-a", at(100)).quiet_since, at(100));
        assert_eq!(seen.use_of("n1", "svm-a", at(150)).quiet_since, at(100));
        // A reported activity: quiet from when the controller saw it, whatever the node's clock.
        seen.node_seen(&node(&[("svm-a", 5)], &[]), at(200));
        assert_eq!(seen.use_of("n1", "svm-a", at(210)).quiet_since, at(200));
        // The same marker again changes nothing; a new one does.
        seen.node_seen(&node(&[("svm-a", 5)], &[]), at(300));
        assert_eq!(seen.use_of("n1", "svm-a", at(310)).quiet_since, at(200));
        seen.node_seen(&node(&[("svm-a", 6)], &[]), at(400));
        assert_eq!(seen.use_of("n1", "svm-a", at(410)).quiet_since, at(400));
        // A start or resume by the controller restarts the quiet time.
        seen.started("svm-a", at(500));
        assert_eq!(seen.use_of("n1", "svm-a", at(510)).quiet_since, at(500));
        seen.forget("svm-a");
        assert_eq!(seen.use_of("n1", "svm-a", at(600)).quiet_since, at(600));
    }

    #[test]
    fn a_wake_is_new_once_and_asked_while_the_node_says_so() {
        let seen = UseSeen::default();
        assert_eq!(seen.node_seen(&node(&[], &["svm-a"]), at(1)), ["svm-a"]);
        assert!(seen.node_seen(&node(&[], &["svm-a"]), at(2)).is_empty(), "not new");
        assert!(seen.use_of("n1", "svm-a", at(3)).wake_asked);
        assert!(!seen.use_of("n2", "svm-a", at(3)).wake_asked, "another node's machine");
        assert!(seen.node_seen(&node(&[], &[]), at(4)).is_empty());
        assert!(!seen.use_of("n1", "svm-a", at(5)).wake_asked);
    }
}
