//! Machines no SmolVM owns: a SmolVM force-deleted while its node was away leaves its machine
//! there, running and holding memory and host ports, when the node comes back. The agents report
//! the machines they hold (`SmolVMNode.status.machines`); this finds the `svm-*` ones whose
//! SmolVM is gone, books their resources and ports in the placement ledger at once (so nothing is
//! placed onto room they still hold), and deletes them after a grace period, telling it in events
//! on the node's SmolVMNode and in a metric.
//!
//! [`find`] and [`Tracker`] are pure; [`run`] is the thin loop around them.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{
    Resource, ResourceExt,
    runtime::{
        events::{Event, EventType},
        reflector::Store,
    },
};
use smolvm_api::{NodeResources, SmolVM, SmolVMNode, constants::MACHINE_NAME_PREFIX, nodeapi::MachineStatus};

use crate::{
    placement::{Request, orphan_ledger_key},
    vm::Context,
};

/// Pure: the orphans on each node. `reported` maps a node to the machines its agent reports
/// (nodes whose list is unknown are absent); `owned` holds `(node, machine)` for every SmolVM in
/// the cache bound to that node (a SmolVM being deleted still owns its machine). Machines not
/// named `svm-*` are not the operator's and are never touched.
pub fn find(
    reported: &BTreeMap<String, Vec<String>>,
    owned: &HashSet<(String, String)>,
) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (node, machines) in reported {
        let orphans: Vec<String> = machines
            .iter()
            .filter(|m| m.starts_with(MACHINE_NAME_PREFIX))
            .filter(|m| !owned.contains(&(node.clone(), (*m).clone())))
            .cloned()
            .collect();
        if !orphans.is_empty() {
            out.insert(node.clone(), orphans);
        }
    }
    out
}

/// What changed for one orphan in a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// First seen: book it and tell it.
    Found {
        /// Node.
        node: String,
        /// Machine.
        machine: String,
    },
    /// Orphaned for the whole grace period: delete it.
    Due {
        /// Node.
        node: String,
        /// Machine.
        machine: String,
    },
    /// No longer an orphan (deleted, or a SmolVM owns it again): release its booking.
    Gone {
        /// Node.
        node: String,
        /// Machine.
        machine: String,
    },
}

/// Pure: remembers since when each orphan has been seen.
#[derive(Debug, Default)]
pub struct Tracker {
    since: HashMap<(String, String), Timestamp>,
}

impl Tracker {
    /// Notes this pass's orphans at `now`; returns the changes, in a stable order. An orphan
    /// stays `Due` on every pass after its grace period until it is gone (a failed delete is
    /// retried). Nodes absent from `known_nodes` (their list is unknown this pass) keep their
    /// orphans as they were.
    pub fn observe(
        &mut self,
        orphans: &BTreeMap<String, Vec<String>>,
        known_nodes: &HashSet<String>,
        now: Timestamp,
        grace: SignedDuration,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        let current: HashSet<(String, String)> = orphans
            .iter()
            .flat_map(|(n, ms)| ms.iter().map(move |m| (n.clone(), m.clone())))
            .collect();
        let mut gone: Vec<(String, String)> = self
            .since
            .keys()
            .filter(|key| known_nodes.contains(&key.0) && !current.contains(*key))
            .cloned()
            .collect();
        gone.sort();
        for key in gone {
            self.since.remove(&key);
            changes.push(Change::Gone {
                node: key.0,
                machine: key.1,
            });
        }
        let mut keys: Vec<&(String, String)> = current.iter().collect();
        keys.sort();
        for key in keys {
            match self.since.get(key) {
                None => {
                    self.since.insert(key.clone(), now);
                    changes.push(Change::Found {
                        node: key.0.clone(),
                        machine: key.1.clone(),
                    });
                }
                Some(first) if now.duration_since(*first) >= grace => changes.push(Change::Due {
                    node: key.0.clone(),
                    machine: key.1.clone(),
                }),
                Some(_) => {}
            }
        }
        changes
    }

    /// Orphans tracked per node, for the metric.
    pub fn per_node(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for (node, _) in self.since.keys() {
            *out.entry(node.clone()).or_insert(0) += 1;
        }
        out
    }
}

/// What an orphan machine holds, as a placement request (it stays on its node).
pub fn request_of(machine: &MachineStatus) -> Request {
    Request {
        resources: NodeResources {
            cpus: i64::from(machine.cpus),
            memory_mib: i64::try_from(machine.memory_mib).unwrap_or(i64::MAX),
            storage_gib: i64::try_from(
                machine
                    .storage_gib
                    .unwrap_or(0)
                    .saturating_add(machine.overlay_gib.unwrap_or(0)),
            )
            .unwrap_or(i64::MAX),
        },
        host_ports: machine
            .network
            .ports
            .iter()
            .map(|p| (i32::from(p.host_port), p.protocol))
            .collect(),
        node_selector: BTreeMap::new(),
        pin: None,
        source: None,
        volumes: Vec::new(),
    }
}

/// A request for a machine whose size is not known yet (its GetMachine failed): it is booked
/// with nothing, and looked at again next pass.
fn unknown() -> Request {
    Request {
        resources: NodeResources::default(),
        host_ports: Vec::new(),
        node_selector: BTreeMap::new(),
        pin: None,
        source: None,
        volumes: Vec::new(),
    }
}

/// Finds, books and collects orphan machines every `every`, deleting each after `grace`.
pub async fn run(ctx: Arc<Context>, vms: Store<SmolVM>, every: Duration, grace: Duration) {
    if !crate::store_ready(&vms).await {
        tracing::warn!("the SmolVM cache never became ready; orphan machines are not collected");
        return;
    }
    tracing::info!(grace_secs = grace.as_secs(), "collecting orphan machines");
    let grace = SignedDuration::try_from(grace).unwrap_or(SignedDuration::from_secs(600));
    let mut tracker = Tracker::default();
    let mut sized: HashSet<(String, String)> = HashSet::new();
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let now = Timestamp::now();
        // Only nodes that answer now: a stale list could name machines since deleted.
        let nodes = ctx.nodes.state();
        let mut reported = BTreeMap::new();
        for node in &nodes {
            let fresh = ctx.placement.fresh(node, now);
            if let (true, Some(machines)) = (fresh, node.status.as_ref().and_then(|s| s.machines.clone())) {
                reported.insert(node.name_any(), machines);
            }
        }
        let owned: HashSet<(String, String)> = vms
            .state()
            .iter()
            .filter_map(|vm| Some((vm.bound_node()?.to_string(), vm.machine_name()?)))
            .collect();
        let orphans = find(&reported, &owned);
        tracing::debug!(
            nodes = nodes.len(),
            reporting = reported.len(),
            orphans = orphans.values().map(Vec::len).sum::<usize>(),
            "orphan pass"
        );
        let known: HashSet<String> = reported.keys().cloned().collect();
        for change in tracker.observe(&orphans, &known, now, grace) {
            match change {
                Change::Found { node, machine } => {
                    let held = book(&ctx, &node, &machine).await;
                    if held.is_some() {
                        sized.insert((node.clone(), machine.clone()));
                    }
                    let note = format!(
                        "machine {machine} on node {node} belongs to no SmolVM (its SmolVM was deleted while the node could not confirm it); {} are counted as used, and it is deleted in {}s unless its SmolVM returns",
                        held.unwrap_or_else(|| "its resources (not yet known)".into()),
                        grace.as_secs()
                    );
                    tracing::warn!(node = %node, machine = %machine, "orphan machine found");
                    publish(&ctx, &nodes, &node, EventType::Warning, "OrphanMachine", note).await;
                }
                Change::Due { node, machine } => {
                    if !sized.contains(&(node.clone(), machine.clone())) && book(&ctx, &node, &machine).await.is_some()
                    {
                        sized.insert((node.clone(), machine.clone()));
                    }
                    match ctx.node_client.delete_machine(&node, &machine).await {
                        Ok(_) => {
                            ctx.ledger.release(&orphan_ledger_key(&node, &machine));
                            sized.remove(&(node.clone(), machine.clone()));
                            let note = format!(
                                "deleted machine {machine} on node {node}: no SmolVM owned it for {}s",
                                grace.as_secs()
                            );
                            tracing::info!(node = %node, machine = %machine, "orphan machine deleted");
                            publish(&ctx, &nodes, &node, EventType::Normal, "OrphanDeleted", note).await;
                        }
                        Err(e) => {
                            tracing::warn!(node = %node, machine = %machine, error = %e, "deleting an orphan machine failed; retrying next pass");
                        }
                    }
                }
                Change::Gone { node, machine } => {
                    ctx.ledger.release(&orphan_ledger_key(&node, &machine));
                    sized.remove(&(node, machine));
                }
            }
        }
        // Sizes that could not be read when found are read again.
        for (node, machines) in &orphans {
            for machine in machines {
                if !sized.contains(&(node.clone(), machine.clone())) && book(&ctx, node, machine).await.is_some() {
                    sized.insert((node.clone(), machine.clone()));
                }
            }
        }
        ctx.metrics.set_orphans(tracker.per_node());
    }
}

/// Books an orphan in the ledger: its real size when the node tells it (returns a description),
/// else nothing yet.
async fn book(ctx: &Context, node: &str, machine: &str) -> Option<String> {
    let key = orphan_ledger_key(node, machine);
    match ctx.node_client.get_machine(node, machine).await {
        Ok(Some(m)) => {
            let request = request_of(&m);
            let ports: Vec<String> = request
                .host_ports
                .iter()
                .map(|(p, proto)| format!("{p}/{}", proto.as_str()))
                .collect();
            ctx.ledger.observe_bound(&key, node, &request);
            Some(format!(
                "its {} CPUs, {} MiB{}",
                m.cpus,
                m.memory_mib,
                if ports.is_empty() {
                    String::new()
                } else {
                    format!(" and host ports {}", ports.join(", "))
                }
            ))
        }
        Ok(None) => None,
        Err(e) => {
            tracing::debug!(node = %node, machine = %machine, error = %e, "sizing an orphan machine failed");
            if ctx.ledger.node_of(&key).is_none() {
                ctx.ledger.observe_bound(&key, node, &unknown());
            }
            None
        }
    }
}

async fn publish(ctx: &Context, nodes: &[Arc<SmolVMNode>], node: &str, type_: EventType, reason: &str, note: String) {
    let Some(object) = nodes.iter().find(|n| n.name_any() == node) else {
        return;
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "CollectOrphans".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &object.object_ref(&())).await {
        tracing::warn!(error = %e, "could not record event");
    }
}
