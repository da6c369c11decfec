//! Warm pools' names on their nodes, and their ready slots there: what placement and the pools'
//! pass ([`crate::pools`]) both read.

use std::{collections::BTreeMap, sync::Arc};

use smolvm_api::{SmolVMNode, SmolVMPool};

/// The most characters of a pool's UID a node pool name holds: a UUID's 36, so that
/// `pool-<uid>-g<generation>` stays within a machine name's 63 for any generation.
pub const POOL_UID_MAX_LEN: usize = 36;

/// The prefix of every node pool of `pool`: `pool-<its whole UID>-g`. The whole UID, never a
/// prefix of it, so two pools never share a node pool. `None` for a pool not stored yet, or
/// whose UID is not of the characters and length a machine name can hold (Kubernetes gives
/// UUIDs).
pub(crate) fn pool_prefix(pool: &SmolVMPool) -> Option<String> {
    let uid = pool.metadata.uid.as_deref()?.to_ascii_lowercase();
    let valid = !uid.is_empty()
        && uid.len() <= POOL_UID_MAX_LEN
        && uid
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase() || b == b'-');
    valid.then(|| format!("pool-{uid}-g"))
}

/// The live pool whose node pool `name` is, if any.
pub fn owner_of<'p>(pools: impl IntoIterator<Item = &'p SmolVMPool>, name: &str) -> Option<&'p SmolVMPool> {
    pools
        .into_iter()
        .find(|p| pool_prefix(p).is_some_and(|prefix| name.starts_with(&prefix)))
}

/// The pool's name on its nodes for the template of `generation` (a SmolVM filled from an
/// older template is served only by slots of that one): `pool-<uid>-g<generation>`, at most 62
/// characters.
pub fn node_pool_name_at(pool: &SmolVMPool, generation: Option<i64>) -> Option<String> {
    Some(format!("{}{}", pool_prefix(pool)?, generation.unwrap_or(0).max(0)))
}

/// The pools a node reports, by name, with their ready and wanted slots.
pub(crate) fn reported_pools(node: &SmolVMNode) -> BTreeMap<&str, (i32, i32)> {
    node.status
        .as_ref()
        .and_then(|s| s.pools.as_ref())
        .into_iter()
        .flatten()
        .map(|p| (p.name.as_str(), (p.ready, p.slots)))
        .collect()
}

/// Of `nodes`, those that report a ready slot of the node pool `name`: where a SmolVM naming its
/// pool is placed first, so that it is served warm.
pub fn with_ready_slot<'n>(nodes: &'n [Arc<SmolVMNode>], name: &str) -> Vec<&'n SmolVMNode> {
    nodes
        .iter()
        .filter(|n| reported_pools(n).get(name).is_some_and(|(ready, _)| *ready > 0))
        .map(|n| n.as_ref())
        .collect()
}
