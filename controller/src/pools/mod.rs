//! Warm pools: every SmolVMPool's source and slots kept on the nodes it matches, where they fit,
//! and its status, decided as data. The pool keeper ([`crate::tasks::pool_keeper`]), a
//! kube-runtime `Controller` over the SmolVMPools, runs each pool's pass, and its sweep deletes
//! the [`orphans`].
//!
//! Each pass decides as data, acts, then reports:
//! - [`plan`] (pure: the pool, the nodes, the ledger's view, the time and the quota's budget):
//!   on each eligible node its nodeSelector matches, whether its source is there or can be
//!   placed (by the same placement as a SmolVM: [`placement::check_node_in`](crate::placement::check_node_in), giving back other
//!   pools' ready slots where it fits only without them), how many ready slots fit beside every
//!   hard and soft hold (never more than `slotsPerNode`), what that starts (a source, new slots,
//!   each with its resources: what a quota charges), and which of the pool's node pools go (an
//!   older generation of its template, or a node it no longer matches); [`orphans`]: node pools
//!   of pools that are gone (every pool a node has a record of, started or not).
//! - act, by the pool keeper: the ledger books each source and each node's ready slots before
//!   the node is asked; then the node API's ResizePool, ApplyPool and DeletePool run.
//! - [`status`]: ready and wanted slots per node, and the Ready condition: why the source fits
//!   nowhere (in the scheduler's form), the quota that stopped the filling, the node's cause
//!   (already cleaned by the agent) when its slots fail.
//!
//! A pool's name on its nodes is `pool-<uid>-g<generation>` ([`node_pool_name`]): a new template
//! is a new node pool, so slots made from the old one are replaced, and machines served from
//! them are never touched (the agent deletes a node pool only once none of its machines
//! remains). Refills are the controller's: the agent lowers a pool's wanted slots by one at each
//! lease, and the next pass books the replacement before it asks for it. A slot's machine is its
//! template filled as admission fills a SmolVM naming the pool ([`slot_vm`]).

mod node_pools;
mod plan;
mod slot;
mod status;

pub use crate::placement::{node_pool_name_at, with_ready_slot};
pub use node_pools::{LivePools, is_node_pool_name, node_pool_name, orphans};
pub use plan::{Keep, Plan, Start, plan};
pub use slot::slot_vm;
pub use status::status;
