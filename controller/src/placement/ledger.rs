//! The reservation ledger ([`Ledger`]): everything committed on each node, by the VMs bound there,
//! the placements whose binding the caches may not show yet, the orphan machines and the pools'
//! sources and ready slots, each under its own key. [`Ledger::place_and_reserve`] and
//! [`Ledger::reserve`] place under its lock and record the choice before returning.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Mutex,
};

use k8s_openapi::jiff::Timestamp;
use smolvm_api::{NodeResources, SmolVM, SmolVMNode};

use super::{
    choose::{Unplaceable, place, place_giving_back},
    liveness::Config,
    request::Request,
    usage::{Hold, SlotHold, Usage, UsageView, fit_count, fits, less, slots_to_give_back},
};

/// Ledger keys of orphan machines ([`crate::tasks::orphans`]) start with this (never a UID), so the
/// pruning of gone SmolVMs leaves them alone.
pub const ORPHAN_KEY_PREFIX: &str = "orphan/";

/// The ledger key of an orphan machine on a node.
pub fn orphan_ledger_key(node: &str, machine: &str) -> String {
    format!("{ORPHAN_KEY_PREFIX}{node}/{machine}")
}

/// Ledger keys of the warm pools kept on nodes ([`crate::pools`]: a pool's source machine and
/// its ready slots) start with this (never a UID), so the pruning of gone SmolVMs leaves them
/// alone; the pools' pass books and releases them.
pub const POOL_KEY_PREFIX: &str = "pool/";

/// The ledger key of a node pool on a node.
pub fn pool_ledger_key(node: &str, pool: &str) -> String {
    format!("{POOL_KEY_PREFIX}{node}/{pool}")
}

/// The reservations whose VM is gone: in `reserved` but not in `live` (sorted). Reservations
/// leak when a VM vanishes without a reconcile seeing it deleted (someone else removed the
/// finalizer, or the watch missed the delete while disconnected).
pub fn gone_reservations(reserved: &[String], live: &HashSet<String>) -> Vec<String> {
    // Orphan machines and node pools are booked under their own keys and released by the
    // orphan collector and the pools' pass.
    let mut gone: Vec<String> = reserved
        .iter()
        .filter(|uid| !uid.starts_with(ORPHAN_KEY_PREFIX) && !uid.starts_with(POOL_KEY_PREFIX) && !live.contains(*uid))
        .cloned()
        .collect();
    gone.sort();
    gone.dedup();
    gone
}

/// A SmolVM's reservation ([`Ledger::reserve`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserved {
    /// Its node.
    pub node: String,
    /// `(node pool, slots)` whose ready slots there were given back to make its room: the node
    /// deletes them before the machine is created.
    pub give_back: Vec<(String, u32)>,
    /// Placed where its pool's ready slot serves it (that slot's room moved to it).
    pub warm: bool,
}

/// The ledger as the pools' pass reads it ([`Ledger::view`]): what is committed on each node,
/// and the node pools whose source is booked where.
#[derive(Debug, Clone, Default)]
pub struct LedgerView {
    /// Usage by node.
    pub by_node: HashMap<String, Usage>,
    /// `(node, node pool)` of every source booked.
    pub sources: HashSet<(String, String)>,
}

impl LedgerView {
    /// Whether the source of `pool` is booked on `node`.
    pub fn source_booked(&self, node: &str, pool: &str) -> bool {
        self.sources.contains(&(node.to_string(), pool.to_string()))
    }
}

impl UsageView for LedgerView {
    fn usage(&self, node: &str) -> Option<&Usage> {
        self.by_node.get(node)
    }
}

/// Everything committed on each node, by the VMs bound there and the reservations of placements
/// whose binding the caches may not show yet.
#[derive(Debug, Default)]
pub struct Ledger {
    inner: Mutex<LedgerState>,
}

#[derive(Debug, Default)]
struct LedgerState {
    by_node: HashMap<String, Usage>,
    /// VM uid -> (node, its request, what of it it holds there).
    by_vm: HashMap<String, (String, Request, Hold)>,
}

impl LedgerState {
    fn take_slots(&mut self, node: &str, pool: &str, n: u32) {
        if let Some(hold) = self.by_node.get_mut(node).and_then(|u| u.slots.get_mut(pool)) {
            hold.count = hold.count.saturating_sub(n);
            if hold.count == 0
                && let Some(u) = self.by_node.get_mut(node)
            {
                u.slots.remove(pool);
            }
        }
    }

    fn set_slots(&mut self, node: &str, pool: &str, hold: SlotHold) {
        if hold.count == 0 {
            if let Some(u) = self.by_node.get_mut(node) {
                u.slots.remove(pool);
            }
            return;
        }
        self.by_node
            .entry(node.to_string())
            .or_default()
            .slots
            .insert(pool.to_string(), hold);
    }

    /// Records what `uid` holds on `node`. A VM already held on that node keeps its [`Hold`]
    /// (the ledger's own, newer than `hint`, which comes from a cache).
    fn add(&mut self, uid: &str, node: &str, request: &Request, hint: Hold) {
        let mut hold = hint;
        if let Some((existing, held, kept)) = self.by_vm.get(uid) {
            if existing == node && held == request {
                return;
            }
            if existing == node {
                hold = *kept;
            }
            // Another node, or the same node with a changed request (a resize, rule V6): the new
            // reservation replaces the old one.
            self.remove(uid);
        }
        self.insert(uid, node, request.clone(), hold);
    }

    fn insert(&mut self, uid: &str, node: &str, request: Request, hold: Hold) {
        let usage = self.by_node.entry(node.to_string()).or_default();
        usage.used = usage.used.plus(&hold.of_request(&request.resources));
        for p in &request.host_ports {
            *usage.ports.entry(*p).or_default() += 1;
        }
        self.by_vm.insert(uid.to_string(), (node.to_string(), request, hold));
    }

    fn remove(&mut self, uid: &str) {
        let Some((node, request, hold)) = self.by_vm.remove(uid) else {
            return;
        };
        if let Some(usage) = self.by_node.get_mut(&node) {
            usage.used = usage.used.minus(&hold.of_request(&request.resources));
            for p in &request.host_ports {
                if let Some(count) = usage.ports.get_mut(p) {
                    *count -= 1;
                    if *count == 0 {
                        usage.ports.remove(p);
                    }
                }
            }
        }
    }
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Ledger::default()
    }

    /// Records a VM seen bound to `node` (idempotent; seeds the ledger from the cache). A changed
    /// request (a resize) replaces what the VM held there.
    pub fn observe_bound(&self, uid: &str, node: &str, request: &Request) {
        self.lock().add(uid, node, request, Hold::Full);
    }

    /// [`Ledger::observe_bound`] of a SmolVM: its request, and for a VM the ledger does not know
    /// yet, what its status says it holds ([`Hold::of`]).
    pub fn observe_vm(&self, uid: &str, node: &str, vm: &SmolVM) {
        self.lock().add(uid, node, &Request::of(vm), Hold::of(vm));
    }

    /// What a VM holds now, if the ledger knows it.
    pub fn hold_of(&self, uid: &str) -> Option<Hold> {
        self.lock().by_vm.get(uid).map(|(_, _, hold)| *hold)
    }

    /// Records that a VM now holds `hold` on its node (its node confirmed a suspend: its CPU and
    /// memory go back; it resumed or was stopped: they are its own again). A VM the ledger does
    /// not know is left alone.
    pub fn set_hold(&self, uid: &str, hold: Hold) {
        let mut state = self.lock();
        let Some((node, request, held)) = state.by_vm.get(uid).cloned() else {
            return;
        };
        if held != hold {
            state.remove(uid);
            state.insert(uid, &node, request, hold);
        }
    }

    /// Takes back a suspended VM's whole request on its node for a resume, atomically, if the
    /// node's `allocatable` minus what every other VM holds there has room for it; otherwise
    /// returns that free room and changes nothing. A VM that already holds its whole request
    /// (or that the ledger does not know) claims nothing.
    pub fn claim_resume(&self, uid: &str, allocatable: Option<&NodeResources>) -> Result<(), NodeResources> {
        let mut state = self.lock();
        let Some((node, request, Hold::Suspended)) = state.by_vm.get(uid).cloned() else {
            return Ok(());
        };
        if let Some(allocatable) = allocatable {
            let used = state.by_node.get(&node).map(|u| u.used).unwrap_or_default();
            let others = used.minus(&Hold::Suspended.of_request(&request.resources));
            let free = allocatable.minus(&others);
            if request.resources.cpus > free.cpus || request.resources.memory_mib > free.memory_mib {
                return Err(free);
            }
        }
        state.remove(uid);
        state.insert(uid, &node, request, Hold::Full);
        Ok(())
    }

    /// Forgets a VM (deleted, or a binding that failed).
    pub fn release(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// The node a VM holds resources on, if any.
    pub fn node_of(&self, uid: &str) -> Option<String> {
        self.lock().by_vm.get(uid).map(|(n, _, _)| n.clone())
    }

    /// Places `request` and reserves it on the chosen node, atomically. A VM that already holds
    /// a reservation gets that node again (a retried reconcile never binds twice elsewhere).
    pub fn place_and_reserve<'n>(
        &self,
        uid: &str,
        request: &Request,
        nodes: impl IntoIterator<Item = &'n SmolVMNode>,
        now: Timestamp,
        config: &Config,
    ) -> Result<String, Unplaceable> {
        let mut state = self.lock();
        if let Some((node, _, _)) = state.by_vm.get(uid) {
            return Ok(node.clone());
        }
        let node = place(request, nodes, &state.by_node, now, config)?;
        let name = node.metadata.name.clone().unwrap_or_default();
        state.add(uid, &name, request, Hold::Full);
        Ok(name)
    }

    /// Places a SmolVM and reserves it, atomically, with what that does to the pools' ready
    /// slots booked on its node. `warm` names the node pool whose ready slot may serve it and the
    /// nodes that report one: it goes there first where it fits with its room moved from one of
    /// those slots (soft) to it (hard), no other slot touched. Else anywhere, beside the ready
    /// slots of each node or, where it fits only without some, with those given back
    /// ([`place_giving_back`]; the caller has the node delete them before it creates the
    /// machine). A VM that already holds a reservation gets that node again.
    pub fn reserve<'n>(
        &self,
        uid: &str,
        request: &Request,
        nodes: impl IntoIterator<Item = &'n SmolVMNode> + Clone,
        warm: Option<(&str, &[&'n SmolVMNode])>,
        now: Timestamp,
        config: &Config,
    ) -> Result<Reserved, Unplaceable> {
        let mut state = self.lock();
        if let Some((node, _, _)) = state.by_vm.get(uid) {
            return Ok(Reserved {
                node: node.clone(),
                ..Reserved::default()
            });
        }
        if let Some((pool, candidates)) = warm {
            // Each candidate as it would be with one of the pool's slots given to this VM.
            let moved: HashMap<String, Usage> = candidates
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .filter_map(|name| {
                    let mut usage = state.by_node.get(&name)?.clone();
                    let hold = usage.slots.get_mut(pool).filter(|h| h.count > 0)?;
                    hold.count -= 1;
                    Some((name, usage))
                })
                .collect();
            let booked: Vec<&SmolVMNode> = candidates
                .iter()
                .copied()
                .filter(|n| n.metadata.name.as_ref().is_some_and(|name| moved.contains_key(name)))
                .collect();
            if let Ok(node) = place(request, booked, &moved, now, config) {
                let name = node.metadata.name.clone().unwrap_or_default();
                state.take_slots(&name, pool, 1);
                state.add(uid, &name, request, Hold::Full);
                return Ok(Reserved {
                    node: name,
                    give_back: Vec::new(),
                    warm: true,
                });
            }
            // A ready slot the ledger has not booked (the pools' pass has not seen it yet) serves
            // it all the same, beside every booked slot.
            if let Ok(node) = place(request, candidates.iter().copied(), &state.by_node, now, config) {
                let name = node.metadata.name.clone().unwrap_or_default();
                state.add(uid, &name, request, Hold::Full);
                return Ok(Reserved {
                    node: name,
                    give_back: Vec::new(),
                    warm: true,
                });
            }
        }
        let placed = place_giving_back(request, nodes, &state.by_node, now, config)?;
        let name = placed.node.metadata.name.clone().unwrap_or_default();
        for (pool, n) in &placed.give_back {
            state.take_slots(&name, pool, *n);
        }
        state.add(uid, &name, request, Hold::Full);
        Ok(Reserved {
            node: name,
            give_back: placed.give_back,
            warm: false,
        })
    }

    /// The ready slots of the node pool `pool` booked on `node`.
    pub fn slots(&self, node: &str, pool: &str) -> u32 {
        self.lock().by_node.get(node).map_or(0, |u| u.slots_of(pool))
    }

    /// The ready slots of `pool` booked on `node`, with what each takes.
    pub fn slot_hold(&self, node: &str, pool: &str) -> SlotHold {
        self.lock()
            .by_node
            .get(node)
            .and_then(|u| u.slots.get(pool))
            .copied()
            .unwrap_or_default()
    }

    /// Books `hold` as the ready slots of `pool` on `node` (what [`Ledger::slot_hold`] read, put
    /// back when what they were given back for was not booked after all).
    pub fn set_slot_hold(&self, node: &str, pool: &str, hold: SlotHold) {
        self.lock().set_slots(node, pool, hold);
    }

    /// Gives back ready slots on `node` until every hold fits its `allocatable` again (a resume
    /// or a resize took hard room that ready slots held): the fewest, as placement takes them
    /// ([`slots_to_give_back`]), all of them where even that is not enough. The slots taken, by
    /// node pool, for the node to delete before the machine grows.
    pub fn make_room(&self, node: &str, allocatable: &NodeResources) -> Vec<(String, u32)> {
        let mut state = self.lock();
        let Some(usage) = state.by_node.get(node).cloned() else {
            return Vec::new();
        };
        let taken = slots_to_give_back(allocatable, &usage, &NodeResources::default(), None).unwrap_or_else(|| {
            usage
                .slots
                .iter()
                .filter(|(_, hold)| hold.count > 0)
                .map(|(name, hold)| (name.clone(), hold.count))
                .collect()
        });
        for (pool, n) in &taken {
            state.take_slots(node, pool, *n);
        }
        taken
    }

    /// Gives back `n` of the ready slots of `pool` booked on `node` (to a SmolVM or another
    /// pool's source that takes their room); the slots left.
    pub fn take_slots(&self, node: &str, pool: &str, n: u32) -> u32 {
        let mut state = self.lock();
        state.take_slots(node, pool, n);
        state.by_node.get(node).map_or(0, |u| u.slots_of(pool))
    }

    /// Books a node pool on `node`, atomically: its source (a hard hold, `source` the source's
    /// request) where it is not booked yet and fits beside every hold but the pool's own slots
    /// (or is there already: `present`), then as many of `want` ready slots of `each` as fit
    /// beside every hard and soft hold (soft holds). `None` when the source does not fit (nothing
    /// is booked then); else the slots booked.
    #[allow(clippy::too_many_arguments)]
    pub fn book_pool(
        &self,
        node: &str,
        pool: &str,
        source: &Request,
        present: bool,
        each: &NodeResources,
        want: u32,
        allocatable: &NodeResources,
    ) -> Option<u32> {
        let mut state = self.lock();
        let key = pool_ledger_key(node, pool);
        let booked = state.by_vm.get(&key).is_some_and(|(n, _, _)| n == node);
        let usage = state.by_node.get(node).cloned().unwrap_or_default();
        let room = less(&less(allocatable, &usage.used), &usage.soft_except(pool));
        if !booked {
            if !present && !fits(&source.resources, &room) {
                return None;
            }
            state.add(&key, node, source, Hold::Full);
        }
        let usage = state.by_node.get(node).cloned().unwrap_or_default();
        let room = less(&less(allocatable, &usage.used), &usage.soft_except(pool));
        let count = want.min(fit_count(&room, each));
        state.set_slots(node, pool, SlotHold { each: *each, count });
        Some(count)
    }

    /// Forgets a node pool on `node`: its source and its ready slots.
    pub fn release_pool(&self, node: &str, pool: &str) {
        let mut state = self.lock();
        state.remove(&pool_ledger_key(node, pool));
        state.set_slots(node, pool, SlotHold::default());
    }

    /// What every node pool holds, summed over the nodes where it is booked: its source (a hard
    /// hold) and its ready slots (soft holds). By node pool name; what a quota counts of pools.
    pub fn pool_holdings(&self) -> BTreeMap<String, NodeResources> {
        let state = self.lock();
        let mut out: BTreeMap<String, NodeResources> = BTreeMap::new();
        for (key, (node, request, _)) in &state.by_vm {
            if let Some(name) = key
                .strip_prefix(POOL_KEY_PREFIX)
                .and_then(|rest| rest.strip_prefix(node.as_str()))
                .and_then(|rest| rest.strip_prefix('/'))
            {
                let total = out.entry(name.to_string()).or_default();
                *total = total.plus(&request.resources);
            }
        }
        for usage in state.by_node.values() {
            for (name, hold) in &usage.slots {
                let total = out.entry(name.clone()).or_default();
                *total = total.plus(&hold.total());
            }
        }
        out
    }

    /// What the pools' pass reads of the ledger: every node's usage and the sources booked.
    pub fn view(&self) -> LedgerView {
        let state = self.lock();
        LedgerView {
            by_node: state.by_node.clone(),
            sources: state
                .by_vm
                .iter()
                .filter(|(key, _)| key.starts_with(POOL_KEY_PREFIX))
                .map(|(key, (node, _, _))| (node.clone(), key[POOL_KEY_PREFIX.len() + node.len() + 1..].to_string()))
                .collect(),
        }
    }

    /// What every VM but `uid` holds on `node`: the node's allocatable minus this is the room
    /// `uid` may grow into.
    pub fn used_by_others(&self, node: &str, uid: &str) -> NodeResources {
        let state = self.lock();
        let used = state.by_node.get(node).map(|u| u.used).unwrap_or_default();
        match state.by_vm.get(uid) {
            Some((held_on, request, hold)) if held_on == node => used.minus(&hold.of_request(&request.resources)),
            _ => used,
        }
    }

    /// The UIDs of every VM holding a reservation.
    pub fn reserved_uids(&self) -> Vec<String> {
        self.lock().by_vm.keys().cloned().collect()
    }

    /// Releases the reservations of VMs that no longer exist: `live` holds the UIDs of every
    /// SmolVM in the cache. Read the reserved UIDs ([`Ledger::reserved_uids`]) *before* taking
    /// that snapshot, so a VM reserved in between is never mistaken for a gone one. Returns the
    /// UIDs released.
    pub fn release_gone(&self, reserved: &[String], live: &HashSet<String>) -> Vec<String> {
        let gone = gone_reservations(reserved, live);
        let mut state = self.lock();
        for uid in &gone {
            state.remove(uid);
        }
        gone
    }

    /// Usage of one node (for status and metrics).
    pub fn usage(&self, node: &str) -> Usage {
        self.lock().by_node.get(node).cloned().unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that matters
        // more than stopping placement altogether, so recover the guard.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
