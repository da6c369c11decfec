//! How heartbeats are judged ([`Config`]): by the controller's own clock, or by the node's
//! timestamp for tables and benchmarks.

use std::sync::Arc;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use smolvm_api::SmolVMNode;

use crate::heartbeat::HeartbeatClock;

/// Tunables of placement, and how heartbeats are judged.
#[derive(Debug, Clone)]
pub struct Config {
    /// A heartbeat older than this makes a node ineligible.
    pub heartbeat_timeout: SignedDuration,
    /// The controller's own record of heartbeats ([`crate::heartbeat`]): age is the time since
    /// the controller saw a node's heartbeat change. `None` compares the node's timestamp with
    /// `now` instead, for tables and benchmarks whose nodes carry their heartbeat; even then a
    /// timestamp further in the future than the timeout is not fresh.
    pub clock: Option<Arc<HeartbeatClock>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_timeout: SignedDuration::from_secs(40),
            clock: None,
        }
    }
}

impl Config {
    /// Judged by the controller's own clock, with `timeout`.
    pub fn observed(heartbeat_timeout: SignedDuration, clock: Arc<HeartbeatClock>) -> Self {
        Config {
            heartbeat_timeout,
            clock: Some(clock),
        }
    }

    /// How old `node`'s heartbeat is at `now`; `None` when it never sent one.
    pub fn heartbeat_age(&self, node: &SmolVMNode, now: Timestamp) -> Option<SignedDuration> {
        match &self.clock {
            Some(clock) => clock.look(node, now).age,
            None => node
                .status
                .as_ref()
                .and_then(|s| s.heartbeat_time.as_ref())
                .map(|t| now.duration_since(t.0).abs()),
        }
    }

    /// Whether `node`'s heartbeat is fresh at `now`.
    pub fn fresh(&self, node: &SmolVMNode, now: Timestamp) -> bool {
        self.heartbeat_age(node, now)
            .is_some_and(|age| age <= self.heartbeat_timeout)
    }
}
