//! The choice of a node: [`place`] (beside every node's ready slots) and [`place_giving_back`]
//! (with some given back where a request fits only without them), or why none can take it
//! ([`Unplaceable`]).

use k8s_openapi::jiff::Timestamp;
use smolvm_api::{SmolVMNode, constants::condition};

use super::{
    eligibility::{Ineligible, Rejections, check_node_in},
    liveness::Config,
    request::Request,
    usage::{Slots, Usage, UsageView, free_of, slots_to_give_back},
};

/// A placement that found no node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplaceable {
    /// Stable reason: `NoNodes`, `PinnedNodeUnknown`, `PinnedNodeIneligible`,
    /// `SourceNodeIneligible` (a branch) or `NoEligibleNode`.
    pub reason: &'static str,
    /// For the Scheduled condition, in the style of the Kubernetes scheduler:
    /// `0/3 nodes can take it: 1 cordoned (spec.unschedulable), 2 insufficient memory`.
    pub message: String,
}

/// Why the node `pin` a request is pinned to (by `spec.nodeName`, or as a branch's source's)
/// cannot take it: the rejections' `summary`, and the node's own words where it explains itself
/// (why no guest boots).
fn pinned_ineligible(request: &Request, pin: &str, node: Option<&SmolVMNode>, summary: &str) -> Unplaceable {
    let detail = node
        .and_then(|node| node.status.as_ref())
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == condition::GUEST_BOOTABLE))
        .filter(|c| c.status != "True" && !c.message.is_empty())
        .map(|c| format!(" ({}: {})", c.reason, c.message))
        .unwrap_or_default();
    match &request.source {
        Some(source) => Unplaceable {
            reason: "SourceNodeIneligible",
            message: format!(
                "node {pin} of its branch source {source} cannot run this branch now (branches are node-local): {summary}{detail}"
            ),
        },
        None => Unplaceable {
            reason: "PinnedNodeIneligible",
            message: format!("pinned node {pin} cannot run this VM now: {summary}{detail}"),
        },
    }
}

/// Least-allocated score of placing `request` on `node`: the mean free fraction of CPU and memory
/// after placement, in parts per million (higher is emptier).
fn score(node: &SmolVMNode, request: &Request, usage: Option<&Usage>) -> i64 {
    let Some(allocatable) = node.status.as_ref().and_then(|s| s.allocatable) else {
        return 0;
    };
    let used = usage.map(|u| u.used).unwrap_or_default().plus(&request.resources);
    let fraction = |total: i64, used: i64| {
        if total <= 0 {
            0
        } else {
            (total - used).max(0).saturating_mul(1_000_000) / total
        }
    };
    (fraction(allocatable.cpus, used.cpus) + fraction(allocatable.memory_mib, used.memory_mib)) / 2
}

/// Chooses a node for `request`: an eligible node with the highest least-allocated score, ties
/// broken by name, beside the ready slots booked on each (never touching them). A pin restricts
/// the choice to that node and never falls back.
pub fn place<'n>(
    request: &Request,
    nodes: impl IntoIterator<Item = &'n SmolVMNode>,
    usage: &dyn UsageView,
    now: Timestamp,
    config: &Config,
) -> Result<&'n SmolVMNode, Unplaceable> {
    choose(request, nodes, usage, now, config, Slots::Kept).map(|placed| placed.node)
}

/// A node chosen for a request, and the ready slots there given back to make its room.
#[derive(Debug, Clone)]
pub struct Placement<'n> {
    /// The node.
    pub node: &'n SmolVMNode,
    /// `(node pool, slots)` given back on it ([`slots_to_give_back`]); empty where it fits
    /// beside them.
    pub give_back: Vec<(String, u32)>,
}

/// [`place`] first; where no node has room beside its ready slots, the node where it fits with
/// the fewest slots given back (then the highest score, then the name), so that no pool ever
/// makes a SmolVM unschedulable. A VM that fits nowhere even so says why with the slots counted
/// as free room.
pub fn place_giving_back<'n>(
    request: &Request,
    nodes: impl IntoIterator<Item = &'n SmolVMNode> + Clone,
    usage: &dyn UsageView,
    now: Timestamp,
    config: &Config,
) -> Result<Placement<'n>, Unplaceable> {
    match choose(request, nodes.clone(), usage, now, config, Slots::Kept) {
        Ok(placed) => Ok(placed),
        Err(_) => choose(request, nodes, usage, now, config, Slots::GivenBack),
    }
}

fn choose<'n>(
    request: &Request,
    nodes: impl IntoIterator<Item = &'n SmolVMNode>,
    usage: &dyn UsageView,
    now: Timestamp,
    config: &Config,
    slots: Slots,
) -> Result<Placement<'n>, Unplaceable> {
    // (node, slots given back, their count, score)
    type Best<'n> = (&'n SmolVMNode, Vec<(String, u32)>, u32, i64);
    let mut best: Option<Best<'n>> = None;
    let mut rejected = Rejections::default();
    let mut pinned_node: Option<&SmolVMNode> = None;
    let mut seen = 0usize;
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or("");
        if request.pin.as_deref().is_some_and(|pin| pin != name) {
            continue;
        }
        seen += 1;
        if request.pin.is_some() {
            pinned_node = Some(node);
        }
        let node_usage = usage.usage(name);
        if let Some(why) = check_node_in(node, request, node_usage, now, config, slots) {
            match why {
                Ineligible::VolumeUnreachable => rejected.add_unreachable(request, node),
                _ => rejected.add(why, why.resource(&free_of(node, node_usage, slots))),
            }
            continue;
        }
        let give_back = match (slots, node_usage) {
            (Slots::GivenBack, Some(u)) => {
                let allocatable = node.status.as_ref().and_then(|s| s.allocatable).unwrap_or_default();
                slots_to_give_back(&allocatable, u, &request.resources, None).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        let taken: u32 = give_back.iter().map(|(_, n)| *n).sum();
        let s = score(node, request, node_usage);
        let better = match &best {
            None => true,
            Some((b, _, bt, bs)) => {
                taken < *bt
                    || (taken == *bt && (s > *bs || (s == *bs && name < b.metadata.name.as_deref().unwrap_or(""))))
            }
        };
        if better {
            best = Some((node, give_back, taken, s));
        }
    }
    if let Some((node, give_back, _, _)) = best {
        return Ok(Placement { node, give_back });
    }
    let summary = rejected.summary(request);
    Err(match (&request.pin, seen) {
        (Some(pin), 0) => Unplaceable {
            reason: "PinnedNodeUnknown",
            message: format!("pinned node {pin} has no SmolVMNode; waiting for its runtime agent to register it"),
        },
        (Some(pin), _) => pinned_ineligible(request, pin, pinned_node, &summary),
        (None, 0) => Unplaceable {
            reason: "NoNodes",
            message: "no SmolVMNode is registered".into(),
        },
        (None, n) => Unplaceable {
            reason: "NoEligibleNode",
            message: rejected.message("run this VM", n, request),
        },
    })
}
