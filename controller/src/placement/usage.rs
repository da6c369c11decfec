//! What is committed on a node: what a VM holds there ([`Hold`]), the pools' ready slots booked
//! there ([`SlotHold`]), their sum by node ([`Usage`]), and the room arithmetic placement and the
//! pools' pass share ([`fits`], [`fit_count`], [`slots_to_give_back`], [`free_of`]).

use std::collections::{BTreeMap, HashMap};

use smolvm_api::{NodeResources, Protocol, SmolVM, SmolVMNode};

/// What a VM bound to a node holds there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hold {
    /// Its whole request (also while stopped: its room stays its own).
    #[default]
    Full,
    /// Suspended: its CPU and memory are given back to the node; its disks stay counted, and
    /// its saved memory is counted as disk (smolvm reports no saved-state size, so the whole
    /// memory, the worst case). Its host ports stay reserved, so a resume never waits on one.
    Suspended,
}

impl Hold {
    /// What a VM's stored status says it holds ([`smolvm_api::quota::status_holds_suspended`]:
    /// phase Suspended, or last seen suspended on a node now unreachable). Only a hint, for a VM
    /// the ledger does not know yet (a new leader's): the controller's own suspends and resumes
    /// are newer than any cache.
    pub fn of(vm: &SmolVM) -> Self {
        match smolvm_api::quota::status_holds_suspended(vm.status.as_ref()) {
            true => Hold::Suspended,
            false => Hold::Full,
        }
    }

    /// What `request` takes of a node under this hold.
    pub fn of_request(self, request: &NodeResources) -> NodeResources {
        // The one rule, shared with what a quota counts (SPEC 6.3).
        smolvm_api::quota::held(request, self == Hold::Suspended)
    }
}

/// The disk a suspended VM's saved memory is counted as ([`smolvm_api::quota::saved_state_gib`]).
pub use smolvm_api::quota::saved_state_gib;

/// The ready slots of one node pool booked on a node: soft holds, spare room that a SmolVM (or a
/// pool's source) that fits there only without them takes ([`slots_to_give_back`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotHold {
    /// What one slot takes (the template's machine).
    pub each: NodeResources,
    /// How many.
    pub count: u32,
}

impl SlotHold {
    /// What `count` slots take.
    pub fn total(&self) -> NodeResources {
        times(&self.each, self.count)
    }
}

/// `each` taken `n` times.
pub fn times(each: &NodeResources, n: u32) -> NodeResources {
    let n = i64::from(n);
    NodeResources {
        cpus: each.cpus.saturating_mul(n),
        memory_mib: each.memory_mib.saturating_mul(n),
        storage_gib: each.storage_gib.saturating_mul(n),
    }
}

/// `a` less `b`, below zero where `b` is more (unlike [`NodeResources::minus`], which stops at
/// zero): room that is overcommitted stays so through later additions.
pub fn less(a: &NodeResources, b: &NodeResources) -> NodeResources {
    NodeResources {
        cpus: a.cpus.saturating_sub(b.cpus),
        memory_mib: a.memory_mib.saturating_sub(b.memory_mib),
        storage_gib: a.storage_gib.saturating_sub(b.storage_gib),
    }
}

/// Whether `want` fits in `free`.
pub fn fits(want: &NodeResources, free: &NodeResources) -> bool {
    want.cpus <= free.cpus && want.memory_mib <= free.memory_mib && want.storage_gib <= free.storage_gib
}

/// How many of `each` fit in `room` (`u32::MAX` for a machine that takes nothing).
pub fn fit_count(room: &NodeResources, each: &NodeResources) -> u32 {
    [
        (room.cpus, each.cpus),
        (room.memory_mib, each.memory_mib),
        (room.storage_gib, each.storage_gib),
    ]
    .into_iter()
    .filter(|(_, each)| *each > 0)
    .map(|(room, each)| u32::try_from(room.max(0) / each).unwrap_or(u32::MAX))
    .min()
    .unwrap_or(u32::MAX)
}

/// What the ledger knows of one node: what is committed there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Sum of the requests of the VMs bound or reserved there, and of the pools' sources (hard
    /// holds).
    pub used: NodeResources,
    /// Host ports taken there, with how many VMs hold each (more than one only if bindings made
    /// elsewhere conflict).
    pub ports: HashMap<(i32, Protocol), u32>,
    /// The pools' ready slots booked there, by node pool (soft holds, not in `used`).
    pub slots: BTreeMap<String, SlotHold>,
}

impl Usage {
    /// What every pool's ready slots take there.
    pub fn soft(&self) -> NodeResources {
        self.slots
            .values()
            .fold(NodeResources::default(), |sum, hold| sum.plus(&hold.total()))
    }

    /// What the ready slots of every node pool but `pool` take there.
    pub fn soft_except(&self, pool: &str) -> NodeResources {
        self.slots
            .iter()
            .filter(|(name, _)| name.as_str() != pool)
            .fold(NodeResources::default(), |sum, (_, hold)| sum.plus(&hold.total()))
    }

    /// The booked ready slots of `pool` there.
    pub fn slots_of(&self, pool: &str) -> u32 {
        self.slots.get(pool).map_or(0, |hold| hold.count)
    }
}

/// Whether a placement keeps the ready slots of a node where they are, or may give them back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// Ready slots are room taken: free is allocatable less hard and soft holds.
    Kept,
    /// Ready slots are spare room: free is allocatable less hard holds.
    GivenBack,
}

/// Which ready slots on a node make room for `want`: none where it fits beside them; else the
/// fewest, taken one at a time from the node pool with the most booked (ties by name), never
/// those of `spare` (a pool's own, for its source); `None` where it does not fit even without
/// all of them. Sorted by node pool.
pub fn slots_to_give_back(
    allocatable: &NodeResources,
    usage: &Usage,
    want: &NodeResources,
    spare: Option<&str>,
) -> Option<Vec<(String, u32)>> {
    let mut free = less(&less(allocatable, &usage.used), &usage.soft());
    let mut left: BTreeMap<&str, (SlotHold, u32)> = usage
        .slots
        .iter()
        .filter(|(name, hold)| Some(name.as_str()) != spare && hold.count > 0)
        .map(|(name, hold)| (name.as_str(), (*hold, 0)))
        .collect();
    while !fits(want, &free) {
        let (_, (hold, taken)) = left
            .iter_mut()
            .filter(|(_, (hold, taken))| *taken < hold.count)
            .max_by(|(a, (ha, ta)), (b, (hb, tb))| (ha.count - ta).cmp(&(hb.count - tb)).then(b.cmp(a)))?;
        *taken += 1;
        free = free.plus(&hold.each);
    }
    Some(
        left.into_iter()
            .filter(|(_, (_, taken))| *taken > 0)
            .map(|(name, (_, taken))| (name.to_string(), taken))
            .collect(),
    )
}

/// Read access to per-node usage.
pub trait UsageView {
    /// Usage of a node (empty when none).
    fn usage(&self, node: &str) -> Option<&Usage>;
}

impl UsageView for HashMap<String, Usage> {
    fn usage(&self, node: &str) -> Option<&Usage> {
        self.get(node)
    }
}

/// What `node` has free: its allocatable less what the ledger holds there (its ready slots
/// counted as `slots` says).
pub fn free_of(node: &SmolVMNode, usage: Option<&Usage>, slots: Slots) -> NodeResources {
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable).unwrap_or_default();
    match (usage, slots) {
        (Some(u), Slots::Kept) => allocatable.minus(&u.used).minus(&u.soft()),
        (Some(u), Slots::GivenBack) => allocatable.minus(&u.used),
        (None, _) => allocatable,
    }
}
