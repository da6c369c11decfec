//! Which SmolVMNode changes concern the VMs ([`NodeTracker`]): a node's fingerprint
//! ([`NodeFingerprint`], what placement and node health read, the heartbeat aside) and whether
//! its heartbeat is fresh.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::jiff::Timestamp;
use smolvm_api::{NodeResources, SmolVMNode};

use super::liveness::Config;

/// What placement and node health read from a SmolVMNode, minus the heartbeat: two nodes with
/// the same fingerprint place and judge VMs alike (as long as both heartbeats are fresh, or both
/// stale). Condition timestamps and the heartbeat time are left out, so the runtime's periodic
/// heartbeat does not look like a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFingerprint {
    /// (type, status, reason, message) of each condition, sorted by type.
    conditions: Vec<(String, String, String, String)>,
    node_uid: Option<String>,
    protocol_version: Option<String>,
    endpoint: Option<(String, i32)>,
    capacity: Option<NodeResources>,
    allocatable: Option<NodeResources>,
    unschedulable: bool,
    labels: BTreeMap<String, String>,
}

/// The fingerprint of a node (see [`NodeFingerprint`]).
pub fn node_fingerprint(node: &SmolVMNode) -> NodeFingerprint {
    let status = node.status.as_ref();
    let mut conditions: Vec<_> = status
        .map(|s| {
            s.conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone(), c.message.clone()))
                .collect()
        })
        .unwrap_or_default();
    conditions.sort();
    NodeFingerprint {
        conditions,
        node_uid: status.and_then(|s| s.node_uid.clone()),
        protocol_version: status.and_then(|s| s.protocol_version.clone()),
        endpoint: status.and_then(|s| s.endpoint.as_ref().map(|e| (e.address.clone(), e.port))),
        capacity: status.and_then(|s| s.capacity),
        allocatable: status.and_then(|s| s.allocatable),
        unschedulable: node.spec.unschedulable.unwrap_or(false),
        labels: node.metadata.labels.clone().unwrap_or_default(),
    }
}

/// Which SmolVMNode changes concern the VMs: the last fingerprint and heartbeat freshness seen
/// of each node. The runtime heartbeats every few seconds; only a change of the fingerprint, of
/// freshness (a heartbeat that went stale, or came back), or a node appearing or vanishing wakes
/// the VMs bound there and the VMs waiting for a node.
#[derive(Debug, Default)]
pub struct NodeTracker {
    seen: HashMap<String, (NodeFingerprint, bool)>,
}

impl NodeTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        NodeTracker::default()
    }

    /// A node was added or changed: whether its VMs must look again.
    pub fn applied(&mut self, node: &SmolVMNode, now: Timestamp, config: &Config) -> bool {
        let name = node.metadata.name.clone().unwrap_or_default();
        let now_seen = (node_fingerprint(node), config.fresh(node, now));
        let changed = self.seen.get(&name) != Some(&now_seen);
        self.seen.insert(name, now_seen);
        changed
    }

    /// A node was deleted: whether it was known (its VMs must look again).
    pub fn deleted(&mut self, name: &str) -> bool {
        self.seen.remove(name).is_some()
    }

    /// The periodic look at every node (the whole cache): the names of the nodes whose heartbeat
    /// went stale or fresh since the last look, or that vanished without a delete event (sorted).
    /// A dead runtime sends no events; this is how its VMs learn of it soon after the timeout.
    pub fn tick<'n>(
        &mut self,
        nodes: impl IntoIterator<Item = &'n SmolVMNode>,
        now: Timestamp,
        config: &Config,
    ) -> Vec<String> {
        let mut changed = Vec::new();
        let mut present = HashSet::new();
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let fresh = config.fresh(node, now);
            match self.seen.get_mut(&name) {
                Some((_, was)) if *was != fresh => {
                    *was = fresh;
                    changed.push(name.clone());
                }
                Some(_) => {}
                None => {
                    self.seen.insert(name.clone(), (node_fingerprint(node), fresh));
                    changed.push(name.clone());
                }
            }
            present.insert(name);
        }
        let vanished: Vec<String> = self.seen.keys().filter(|n| !present.contains(*n)).cloned().collect();
        for name in vanished {
            self.seen.remove(&name);
            changed.push(name);
        }
        changed.sort();
        changed
    }
}
