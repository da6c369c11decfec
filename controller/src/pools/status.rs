//! The pool's status after a pass ([`status`]): ready and wanted slots per node, and the Ready
//! condition.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use smolvm_api::{
    SmolVMNode, SmolVMPool,
    constants::{condition, reason},
    pool::{PoolNodeStatus, SmolVMPoolStatus},
};

use super::plan::Plan;
use crate::{placement::reported_pools as reported, vm::rules::set_condition};

/// The pool's status after `plan`, given the failures of ApplyPool by node (the agent's
/// message, cleaned), keeping each condition's transition time where its status holds.
pub fn status(
    pool: &SmolVMPool,
    nodes: &[Arc<SmolVMNode>],
    plan: &Plan,
    failures: &BTreeMap<String, String>,
    now: Timestamp,
) -> SmolVMPoolStatus {
    let per_node = per_node(nodes, plan, failures);
    let ready: i32 = per_node.iter().map(|n| n.ready).fold(0, i32::saturating_add);
    let total: i32 = per_node.iter().map(|n| n.total).fold(0, i32::saturating_add);
    let (state, why, message) = ready_condition(plan, failures, ready, total);
    let mut conditions = pool.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    set_condition(
        &mut conditions,
        condition::READY,
        state,
        why,
        &message,
        pool.metadata.generation,
        now,
    );
    SmolVMPoolStatus {
        observed_generation: pool.metadata.generation,
        ready_slots: Some(ready),
        total_slots: Some(total),
        nodes: per_node,
        conditions,
    }
}

/// Each target's ready and wanted slots, with why it has none where it says (its ApplyPool's
/// failure, or no room for the source).
fn per_node(nodes: &[Arc<SmolVMNode>], plan: &Plan, failures: &BTreeMap<String, String>) -> Vec<PoolNodeStatus> {
    let by_name: HashMap<String, &Arc<SmolVMNode>> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let count = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    plan.targets
        .iter()
        .map(|node| {
            let total = plan.keep.iter().find(|k| &k.node == node).map_or(0, |k| count(k.slots));
            PoolNodeStatus {
                node_name: node.clone(),
                ready: by_name
                    .get(node)
                    .and_then(|n| reported(n).get(plan.name.as_str()).map(|(ready, _)| *ready))
                    .unwrap_or(0)
                    .clamp(0, total),
                total,
                message: failures.get(node).or_else(|| plan.waiting.get(node)).cloned(),
            }
        })
        .collect()
}

/// The Ready condition's status, reason and message, with `ready` of `total` slots ready on the
/// nodes that keep the pool.
fn ready_condition(
    plan: &Plan,
    failures: &BTreeMap<String, String>,
    ready: i32,
    total: i32,
) -> (&'static str, &'static str, String) {
    let keeping = plan.keep.len();
    let mut room = String::new();
    if plan.short_of_room > 0 {
        room.push_str(&format!(
            "; {} more that slotsPerNode asks for have no room (ready slots take spare room only)",
            plan.short_of_room
        ));
    }
    if !plan.waiting.is_empty() && keeping > 0 {
        room.push_str(&format!("; {} node(s) have no room for its source", plan.waiting.len()));
    }
    if plan.targets.is_empty() {
        let detail = plan.unplaced.as_deref().unwrap_or("no SmolVMNode");
        (
            "False",
            reason::NO_MATCHING_NODES,
            format!("no SmolVMNode that can take VMs matches the pool's nodeSelector: {detail}"),
        )
    } else if keeping == 0 && plan.quota.is_none() {
        (
            "False",
            reason::UNSCHEDULABLE,
            plan.unplaced.clone().unwrap_or_default(),
        )
    } else if let Some((node, cause)) = failures.iter().next() {
        let more = match failures.len() {
            1 => String::new(),
            n => format!(" (and {} more node(s))", n - 1),
        };
        ("False", reason::SLOTS_FAILING, format!("{node}: {cause}{more}"))
    } else if let Some(quota) = &plan.quota {
        ("False", reason::QUOTA_EXCEEDED, quota.clone())
    } else if ready < total {
        (
            "False",
            reason::SLOTS_FILLING,
            format!("{ready} of {total} slots ready on {keeping} node(s){room}"),
        )
    } else {
        (
            "True",
            reason::SLOTS_READY,
            format!("{total} slots ready on {keeping} node(s){room}"),
        )
    }
}
