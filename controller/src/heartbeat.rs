//! Heartbeat freshness by the controller's own clock.
//!
//! A SmolVMNode's `status.heartbeatTime` is written with its agent's clock. Comparing it with
//! the controller's clock trusts the agent's: a node whose clock runs fast stays fresh after it
//! died (a heartbeat from the future is never old), keeps its VMs Ready, keeps receiving
//! placements and blocks a runtime CA rotation from finishing. As the Lease already is, a
//! heartbeat is judged here by when the controller last saw it *change*: the value is only an
//! opaque token. A node first seen (a controller that starts, a node that registers) counts as
//! fresh for one heartbeat timeout from then, so a restarted controller rewrites no VM's status.
//!
//! [`advance`] and [`skew`] are the pure rules; [`HeartbeatClock`] keeps what was seen.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use smolvm_api::SmolVMNode;

/// The last heartbeat value seen of a node, and when (by the controller's clock) it was first
/// seen with that value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The heartbeat as the node wrote it (its clock).
    pub value: Timestamp,
    /// When the controller first saw this value (its clock).
    pub at: Timestamp,
}

/// What the controller knows of a node after looking at its heartbeat `heartbeat` at `now`:
/// the same value as before keeps its first sighting; a new value is seen now; no heartbeat at
/// all is nothing.
pub fn advance(previous: Option<&Seen>, heartbeat: Option<Timestamp>, now: Timestamp) -> Option<Seen> {
    let value = heartbeat?;
    match previous {
        Some(seen) if seen.value == value => Some(*seen),
        _ => Some(Seen { value, at: now }),
    }
}

/// How far a node's clock is ahead of the controller's (negative: behind), measured when a new
/// heartbeat value arrives while the controller watches (`previous` known and different): the
/// node wrote `heartbeat` a moment before the controller saw it at `now`. `None` when no change
/// was watched (a first sighting may show a heartbeat written long ago).
pub fn skew(previous: Option<&Seen>, heartbeat: Option<Timestamp>, now: Timestamp) -> Option<SignedDuration> {
    let value = heartbeat?;
    match previous {
        Some(seen) if seen.value != value => Some(value.duration_since(now)),
        _ => None,
    }
}

/// A clock offset past which a node is reported (an event): far beyond what the watch's delay
/// explains.
pub const SKEW_REPORTED: SignedDuration = SignedDuration::from_secs(30);

/// What was seen of every node. Shared by the node watch (which feeds it) and every reader of
/// freshness (placement, node health, orphan collection, the runtime CA rotation).
#[derive(Debug, Default)]
pub struct HeartbeatClock {
    seen: Mutex<HashMap<String, Seen>>,
}

/// What one look at a node found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Look {
    /// Time since the heartbeat last changed, by the controller's clock; `None`: never sent.
    pub age: Option<SignedDuration>,
    /// The node's clock offset, when a change was watched just now.
    pub skew: Option<SignedDuration>,
}

impl HeartbeatClock {
    /// An empty clock.
    pub fn new() -> Self {
        HeartbeatClock::default()
    }

    /// Looks at `node`'s heartbeat at `now` (the controller's clock), recording a new value.
    pub fn look(&self, node: &SmolVMNode, now: Timestamp) -> Look {
        let name = node.metadata.name.as_deref().unwrap_or("");
        let heartbeat = node
            .status
            .as_ref()
            .and_then(|s| s.heartbeat_time.as_ref())
            .map(|t| t.0);
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous = seen.get(name).copied();
        let skew = skew(previous.as_ref(), heartbeat, now);
        let next = advance(previous.as_ref(), heartbeat, now);
        match next {
            Some(next) if previous != Some(next) => {
                seen.insert(name.to_string(), next);
            }
            Some(_) => {}
            None => {
                seen.remove(name);
            }
        }
        Look {
            age: next.map(|s| now.duration_since(s.at)),
            skew,
        }
    }

    /// Forgets a node (deleted).
    pub fn forget(&self, name: &str) {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("time")
    }

    #[test]
    fn advance_table() {
        let seen = |value: i64, at_: i64| Seen {
            value: at(value),
            at: at(at_),
        };
        let cases = [
            ("never sent", None, None, 100, None),
            (
                "first sight counts from now",
                None,
                Some(at(5)),
                100,
                Some(seen(5, 100)),
            ),
            (
                "first sight of a future value counts from now",
                None,
                Some(at(100_000)),
                100,
                Some(seen(100_000, 100)),
            ),
            (
                "same value keeps its sighting",
                Some(seen(5, 100)),
                Some(at(5)),
                500,
                Some(seen(5, 100)),
            ),
            (
                "a new value is seen now",
                Some(seen(5, 100)),
                Some(at(15)),
                110,
                Some(seen(15, 110)),
            ),
            (
                "a new value in the past is seen now too",
                Some(seen(5, 100)),
                Some(at(-3000)),
                110,
                Some(seen(-3000, 110)),
            ),
            ("the heartbeat was removed", Some(seen(5, 100)), None, 110, None),
        ];
        for (name, previous, heartbeat, now, want) in cases {
            assert_eq!(advance(previous.as_ref(), heartbeat, at(now)), want, "{name}");
        }
    }

    #[test]
    fn skew_table() {
        let seen = Seen {
            value: at(5),
            at: at(100),
        };
        let cases = [
            ("first sight: no measure", None, Some(at(3600)), 110, None),
            ("no change: no measure", Some(seen), Some(at(5)), 110, None),
            ("in step", Some(seen), Some(at(110)), 110, Some(0)),
            ("an hour fast", Some(seen), Some(at(3710)), 110, Some(3600)),
            ("ten minutes slow", Some(seen), Some(at(-490)), 110, Some(-600)),
        ];
        for (name, previous, heartbeat, now, want) in cases {
            let got = skew(previous.as_ref(), heartbeat, at(now)).map(|d| d.as_secs());
            assert_eq!(got, want, "{name}");
        }
    }

    fn node(name: &str, heartbeat: Option<Timestamp>) -> SmolVMNode {
        let mut node = SmolVMNode::new(name, Default::default());
        node.status = Some(smolvm_api::SmolVMNodeStatus {
            heartbeat_time: heartbeat.map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time),
            ..Default::default()
        });
        node
    }

    #[test]
    fn a_fast_clock_goes_stale_once_it_stops_changing() {
        let clock = HeartbeatClock::new();
        let future = at(10 * 365 * 86_400);
        // The controller starts and sees a heartbeat ten years ahead: fresh for now…
        assert_eq!(
            clock.look(&node("a", Some(future)), at(0)).age,
            Some(SignedDuration::ZERO)
        );
        // …and, with no new heartbeat, its age grows by the controller's clock.
        let later = clock.look(&node("a", Some(future)), at(41));
        assert_eq!(later.age, Some(SignedDuration::from_secs(41)));
        assert_eq!(later.skew, None);
        // A new value resets the age and measures the offset.
        let next = clock.look(&node("a", Some(future + SignedDuration::from_secs(10))), at(50));
        assert_eq!(next.age, Some(SignedDuration::ZERO));
        assert!(next.skew.is_some_and(|s| s > SKEW_REPORTED));
        clock.forget("a");
        assert_eq!(
            clock.look(&node("a", Some(future)), at(60)).age,
            Some(SignedDuration::ZERO)
        );
        assert_eq!(clock.look(&node("b", None), at(60)).age, None, "never sent");
    }
}
