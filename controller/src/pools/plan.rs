//! What one pass does for one pool, as data ([`plan`]): on each eligible node its nodeSelector
//! matches, whether its source is there or can be placed (by the same placement as a SmolVM,
//! giving back other pools' ready slots where it fits only without them), how many ready slots fit
//! beside every hard and soft hold (never more than `slotsPerNode`), what that starts ([`Start`]:
//! what a quota charges), and which of the pool's node pools go.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use smolvm_api::{NodeResources, SmolVMNode, SmolVMPool};

use super::node_pools::node_pool_name;
use crate::placement::{
    self, LedgerView, Rejections, Request, Slots, check_node, check_node_in, fit_count, fits, free_of, less,
    pool_prefix as prefix, reported_pools as reported, slots_to_give_back, times,
};

/// What a pass does for a pool on one node that keeps (or is to keep) its source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keep {
    /// The node.
    pub node: String,
    /// The source to start here (booked in full, a hard hold, before ApplyPool); `None` where
    /// its source is booked or there already.
    pub source: Option<NodeResources>,
    /// `(node pool, slots)` of other pools whose ready slots are given back here to make the
    /// source's room (ResizePool before ApplyPool).
    pub give_back: Vec<(String, u32)>,
    /// The ready slots wanted here after this pass: as many of `slotsPerNode` as fit beside every
    /// hard and soft hold, and within the budget.
    pub slots: u32,
    /// Of `slots`, those new in this pass (beyond the ones booked): with `source`, what this
    /// pass starts here, and what a quota is charged for.
    pub new_slots: u32,
    /// Whether the node is asked (ApplyPool): a source to start, other slots than booked, or a
    /// node whose report says other slots.
    pub apply: bool,
}

/// A machine a pass starts on a node, with what it takes (the quota's and the ledger's units).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The pool's source machine.
    Source(NodeResources),
    /// `n` ready slots, each taking this.
    Slots(u32, NodeResources),
}

impl Keep {
    /// What this node starts in the pass, each slot the size `each`.
    pub fn starts(&self, each: &NodeResources) -> Vec<Start> {
        let mut out: Vec<Start> = self.source.iter().copied().map(Start::Source).collect();
        if self.new_slots > 0 {
            out.push(Start::Slots(self.new_slots, *each));
        }
        out
    }
}

/// What one pass does for one pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The pool's name on its nodes.
    pub name: String,
    /// What its source and each of its slots take (the template's machine).
    pub slot: NodeResources,
    /// The eligible nodes matching its nodeSelector; sorted.
    pub targets: Vec<String>,
    /// The targets that keep its source (booked, there, or placed in this pass); sorted.
    pub keep: Vec<Keep>,
    /// The targets whose room cannot take its source now, with why.
    pub waiting: BTreeMap<String, String>,
    /// Why no node keeps its source, in the scheduler's form; `None` while one does.
    pub unplaced: Option<String>,
    /// Slots `slotsPerNode` asks for on the nodes that keep it that have no room there.
    pub short_of_room: u32,
    /// What the budget (the namespace's quota) kept from starting, when it did.
    pub quota: Option<String>,
    /// `(node, node pool)` to delete: an older generation's, or on a node it no longer matches.
    pub retire: Vec<(String, String)>,
}

/// The plan for `pool` over `nodes`, given what the ledger holds (`ledger`), what its source and
/// each slot take (`slot`), the time and the placement's tunables, and `budget`: the room the
/// namespace's quota still allows (`None`: unlimited). Sources are placed first (node by node,
/// by name), then slots, each only within what is left of the budget. `None` for a pool without
/// a UID (not stored yet).
pub fn plan(
    pool: &SmolVMPool,
    nodes: &[Arc<SmolVMNode>],
    ledger: &LedgerView,
    slot: &NodeResources,
    now: Timestamp,
    config: &placement::Config,
    budget: Option<NodeResources>,
) -> Option<Plan> {
    let prefix = prefix(pool)?;
    let name = node_pool_name(pool)?;
    let eligible = Request {
        resources: NodeResources::default(),
        host_ports: Vec::new(),
        node_selector: pool.spec.node_selector.clone().unwrap_or_default(),
        pin: None,
        source: None,
        volumes: Vec::new(),
    };
    let mut planning = Planning {
        source: Request {
            resources: *slot,
            ..eligible.clone()
        },
        eligible,
        prefix,
        want: u32::try_from(pool.spec.slots_per_node.max(0)).unwrap_or(0),
        ledger,
        slot: *slot,
        now,
        config,
        budget,
        sources_held: 0,
        slots_held: 0,
        rejected: Rejections::default(),
        plan: Plan {
            name,
            slot: *slot,
            ..Default::default()
        },
    };
    let mut sorted: Vec<&Arc<SmolVMNode>> = nodes.iter().collect();
    sorted.sort_by_key(|n| n.name_any());
    // Sources first, node by node, then the slots that fit beside them.
    let kept: Vec<Kept> = sorted.into_iter().filter_map(|node| planning.source_on(node)).collect();
    for kept in kept {
        planning.slots_on(kept);
    }
    Some(planning.finish(nodes.len()))
}

/// A node that keeps the pool's source, as the slots' phase of [`plan`] reads it: its plan so
/// far, its usage, its allocatable, and the pool's `(ready, wanted)` it reports.
type Kept = (Keep, placement::Usage, NodeResources, Option<(i32, i32)>);

/// [`plan`] under way: what it reads, the budget left, what the budget and the nodes held back,
/// and the plan.
struct Planning<'a> {
    /// What a node must be to keep the pool (eligible, matching its nodeSelector).
    eligible: Request,
    /// The pool's source, as placement takes it.
    source: Request,
    /// The prefix of every node pool of the pool (every generation).
    prefix: String,
    /// `slotsPerNode`.
    want: u32,
    ledger: &'a LedgerView,
    slot: NodeResources,
    now: Timestamp,
    config: &'a placement::Config,
    budget: Option<NodeResources>,
    sources_held: u32,
    slots_held: u32,
    rejected: Rejections,
    plan: Plan,
}

impl Planning<'_> {
    /// `node` in the sources' phase: the node pools it must retire, and whether it keeps the
    /// source (booked, there, or placed now as a SmolVM is, beside every hold or with other
    /// pools' ready slots given back, and within the budget).
    fn source_on(&mut self, node: &SmolVMNode) -> Option<Kept> {
        let (now, config, slot) = (self.now, self.config, self.slot);
        let name = self.plan.name.clone();
        let node_name = node.name_any();
        let pools = reported(node);
        let ineligible = check_node(node, &self.eligible, None, now, config);
        for held in pools.keys().filter(|p| p.starts_with(&self.prefix)) {
            if *held != name || ineligible.is_some() {
                self.plan.retire.push((node_name.clone(), (*held).to_string()));
            }
        }
        if let Some(why) = ineligible {
            self.rejected.add(why, 0);
            return None;
        }
        self.plan.targets.push(node_name.clone());
        let here = pools.get(name.as_str()).copied();
        let usage = self.ledger.by_node.get(&node_name).cloned().unwrap_or_default();
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable).unwrap_or_default();
        let mut keep = Keep {
            node: node_name.clone(),
            ..Keep::default()
        };
        if here.is_none() && !self.ledger.source_booked(&node_name, &name) {
            // Placed as a SmolVM is: beside every hold, or with other pools' ready slots given
            // back (never its own: they would go with it).
            let mut others = usage.clone();
            others.slots.remove(&name);
            if let Some(why) = check_node_in(node, &self.source, Some(&others), now, config, Slots::GivenBack) {
                let free = why.resource(&free_of(node, Some(&others), Slots::GivenBack));
                self.rejected.add(why, free);
                let mut one = Rejections::default();
                one.add(why, free);
                let summary = one.summary(&self.source).replacen("1 ", "the node ", 1);
                self.plan
                    .waiting
                    .insert(node_name, format!("no room for the pool's source: {summary}"));
                return None;
            }
            if let Some(left) = &mut self.budget {
                if !fits(&slot, left) {
                    self.sources_held += 1;
                    self.plan.waiting.insert(
                        node_name,
                        "the namespace's quota has no room for the pool's source".into(),
                    );
                    return None;
                }
                *left = left.minus(&slot);
            }
            keep.source = Some(slot);
            keep.give_back = slots_to_give_back(&allocatable, &others, &slot, None).unwrap_or_default();
        }
        Some((keep, usage, allocatable, here))
    }

    /// A node that keeps the source, in the slots' phase: as many of `slotsPerNode` as fit
    /// beside every hard and soft hold (its own slots' room counted as its), within the budget.
    fn slots_on(&mut self, (mut keep, usage, allocatable, here): Kept) {
        let (slot, name) = (self.slot, &self.plan.name);
        let mut room = less(&less(&allocatable, &usage.used), &usage.soft_except(name));
        if let Some(source) = &keep.source {
            room = less(&room, source);
            for (other, n) in &keep.give_back {
                if let Some(hold) = usage.slots.get(other) {
                    room = room.plus(&times(&hold.each, *n));
                }
            }
        }
        let booked = usage.slots_of(name);
        let mut slots = self.want.min(fit_count(&room, &slot));
        self.plan.short_of_room = self.plan.short_of_room.saturating_add(self.want - slots);
        if slots > booked
            && let Some(left) = &mut self.budget
        {
            let allowed = booked.saturating_add(fit_count(left, &slot));
            if allowed < slots {
                self.slots_held = self.slots_held.saturating_add(slots - allowed);
                slots = allowed;
            }
            *left = left.minus(&times(&slot, slots.saturating_sub(booked)));
        }
        keep.slots = slots;
        keep.new_slots = slots.saturating_sub(booked);
        let reported_wanted = here.map(|(_, wanted)| i64::from(wanted));
        keep.apply = keep.source.is_some() || slots != booked || reported_wanted != Some(i64::from(slots));
        self.plan.keep.push(keep);
    }

    /// The plan, with why no node keeps the source (of `nodes` nodes) and what the quota held.
    fn finish(mut self, nodes: usize) -> Plan {
        if self.plan.keep.is_empty() && self.sources_held == 0 {
            self.plan.unplaced = Some(match nodes {
                0 => "no SmolVMNode is registered".to_string(),
                n => self.rejected.message("keep this pool's source", n, &self.source),
            });
        }
        if self.sources_held > 0 || self.slots_held > 0 {
            self.plan.quota = Some(quota_words(
                &self.budget.unwrap_or_default(),
                self.sources_held,
                self.slots_held,
                &self.slot,
            ));
        }
        self.plan
    }
}

/// Why the quota stops the pool: the room its ResourceQuotas leave (the keys they limit only:
/// `i64::MAX` is a key none limits) and what waits for room, e.g. `the namespace's
/// ResourceQuota leaves 0 CPUs: 5 slots of 1 CPUs, 128 MiB and 2 GiB each wait for room`.
fn quota_words(left: &NodeResources, sources: u32, slots: u32, each: &NodeResources) -> String {
    let limited: Vec<String> = [
        (left.cpus, "CPUs"),
        (left.memory_mib, "MiB of memory"),
        (left.storage_gib, "GiB of disk"),
    ]
    .into_iter()
    .filter(|(n, _)| *n != i64::MAX)
    .map(|(n, unit)| format!("{} {unit}", n.max(0)))
    .collect();
    let waiting: Vec<String> = [(sources, "source"), (slots, "slot")]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}{}", if n == 1 { "" } else { "s" }))
        .collect();
    format!(
        "the namespace's ResourceQuota leaves {}: {} of {} CPUs, {} MiB and {} GiB each wait for room",
        limited.join(", "),
        waiting.join(" and "),
        each.cpus,
        each.memory_mib,
        each.storage_gib
    )
}
