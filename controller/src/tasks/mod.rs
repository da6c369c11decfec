//! The long-running tasks [`crate::app`] wires together, one per file. Each is a thin loop around
//! pure decisions: those of the lease, the orphans and the label mirror sit beside their loop;
//! the others live elsewhere (placement's `NodeTracker`, the ledger, the pools' plan, the signer's
//! judgement).
//!
//! - [`lease`]: the leader election on a coordination.k8s.io Lease;
//! - [`nodes`]: the SmolVMNode watch that wakes the SmolVMs a node change concerns;
//! - [`node_labels`]: the Node's labels mirrored onto its SmolVMNode;
//! - [`ledger`]: releasing the reservations of SmolVMs that are gone;
//! - [`orphans`]: the machines no SmolVM owns, booked in the ledger and deleted after a grace;
//! - [`pool_keeper`]: the SmolVMPools' Controller, each pool's pass (its plan is [`crate::pools`]),
//!   and the sweep of node pools no pool names;
//! - [`policy`]: re-reading the policy file;
//! - [`csr`]: approving and signing the runtime agents' certificate requests;
//! - [`probe`]: what the ops server reports (readiness as leader or standby, metrics).

pub mod csr;
pub mod lease;
pub mod ledger;
pub mod node_labels;
pub mod nodes;
pub mod orphans;
pub mod policy;
pub mod pool_keeper;
pub mod probe;
