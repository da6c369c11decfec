//! A pool's node pools: its name on its nodes ([`node_pool_name`]), the names only the controller
//! makes ([`is_node_pool_name`]), and the node pools of pools that are gone ([`orphans`]).

use std::sync::Arc;

use kube::ResourceExt;
use smolvm_api::{SmolVMNode, SmolVMPool};

use crate::placement::{node_pool_name_at, pool_prefix as prefix, reported_pools as reported};

/// The pool's name on its nodes for its current template: `pool-<uid>-g<generation>`
/// (also its source machine's name; never `svm-…`, so orphan collection leaves it alone).
pub fn node_pool_name(pool: &SmolVMPool) -> Option<String> {
    node_pool_name_at(pool, pool.metadata.generation)
}

/// Whether `name` is a node pool's as [`node_pool_name`] makes them (`pool-<uid>-g<digits>`, the
/// UID a UUID), or as releases before whole UIDs made them (`pool-<8 of [0-9a-z]>-g<digits>`):
/// only those are ever deleted as orphans, never a pool made on the node by other means.
pub fn is_node_pool_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("pool-") else {
        return false;
    };
    let Some((uid, generation)) = rest.rsplit_once("-g") else {
        return false;
    };
    let lower_alnum = |b: u8| b.is_ascii_digit() || b.is_ascii_lowercase();
    let uuid = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit() && !b.is_ascii_uppercase(),
        });
    let legacy = uid.len() == 8 && uid.bytes().all(lower_alnum);
    (uuid || legacy) && !generation.is_empty() && generation.bytes().all(|b| b.is_ascii_digit())
}

/// The node-pool name prefixes of the pools that exist: which node pools (of any generation)
/// are theirs.
pub struct LivePools(Vec<String>);

impl LivePools {
    /// The prefixes of `live`.
    pub fn of<'p>(live: impl IntoIterator<Item = &'p SmolVMPool>) -> Self {
        LivePools(live.into_iter().filter_map(prefix).collect())
    }

    /// Whether the node pool `name` is one of a pool that exists (compared whole: a prefix ends
    /// with `-g`).
    pub fn holds(&self, name: &str) -> bool {
        self.0.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// `(node, node pool)` of every node pool of a pool that no longer exists: named as a pool's
/// (`pool-…-g…`) with a UID no live pool has (compared whole: the prefix ends with `-g`).
pub fn orphans<'p>(nodes: &[Arc<SmolVMNode>], live: impl IntoIterator<Item = &'p SmolVMPool>) -> Vec<(String, String)> {
    let live = LivePools::of(live);
    let mut out = Vec::new();
    for node in nodes {
        for held in reported(node).keys() {
            if is_node_pool_name(held) && !live.holds(held) {
                out.push((node.name_any(), (*held).to_string()));
            }
        }
    }
    out.sort();
    out
}
