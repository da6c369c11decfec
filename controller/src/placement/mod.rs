//! Placement: which SmolVMNode a SmolVM goes to.
//!
//! [`place`] is a pure function of the VM's request, the nodes, the ledger's view of what is
//! already committed on each node, and the time. [`Ledger::place_and_reserve`] runs it under the
//! ledger's lock and records the choice before returning, so concurrent reconciles never
//! over-commit a node even while the informer caches lag behind the bindings just written.
//!
//! - `request`: what a VM asks of a node ([`Request`]) and where its volumes reach
//!   ([`VolumeReach`]);
//! - `liveness`: how heartbeats are judged ([`Config`]);
//! - `eligibility`: whether a node can take a request, and why not ([`Ineligible`],
//!   [`Rejections`]);
//! - `usage`: what is committed on a node ([`Usage`], [`Hold`], [`SlotHold`]) and the room
//!   arithmetic;
//! - `choose`: the choice of a node ([`place`], [`place_giving_back`]);
//! - `ledger`: the reservations, under one lock ([`Ledger`]), and their keys;
//! - `node_pools`: warm pools' names on their nodes and the slots nodes report;
//! - `node_changes`: which SmolVMNode changes concern the VMs ([`NodeTracker`]).

mod choose;
mod eligibility;
mod ledger;
mod liveness;
mod node_changes;
mod node_pools;
mod request;
mod usage;

pub use choose::{Placement, Unplaceable, place, place_giving_back};
pub use eligibility::{Ineligible, Rejections, check_node, check_node_in};
pub use ledger::{
    Ledger, LedgerView, ORPHAN_KEY_PREFIX, POOL_KEY_PREFIX, Reserved, gone_reservations, orphan_ledger_key,
    pool_ledger_key,
};
pub use liveness::Config;
pub use node_changes::{NodeFingerprint, NodeTracker, node_fingerprint};
pub use node_pools::{POOL_UID_MAX_LEN, node_pool_name_at, owner_of, with_ready_slot};
pub(crate) use node_pools::{pool_prefix, reported_pools};
pub use request::{Request, VolumeReach};
pub use usage::{
    Hold, SlotHold, Slots, Usage, UsageView, fit_count, fits, free_of, less, saved_state_gib, slots_to_give_back, times,
};
