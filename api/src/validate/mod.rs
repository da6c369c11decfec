//! Validation (the validating half of admission): rules V1 to V14, V16 and V17 (V15, the quota, is
//! judged by [`crate::quota`]).
//!
//! Every function here is pure: it takes the operation, the old and new objects and a
//! [`Context`] (policy, known SmolVMNodes, requester identity), and returns a [`Verdict`] with
//! every violation and every warning at once. Each [`Finding`] names the field path, the value and
//! the rule, so the message a user reads tells them what to fix.
//!
//! One file per target, as linkerd2's policy controller has a `Validate` per type:
//! - `verdict`: the answer ([`Verdict`], [`Finding`], [`RuleId`]);
//! - `context`: what the rules know besides the objects;
//! - `decode`: from the request's JSON to the rules, per [`Target`];
//! - `smolvm`, `bound`, `status`, `node`, `class`, `pool`: the rules of each target;
//! - `fields`: the rules of a spec's own fields (V1 to V4, V11), which a SmolVM, a class and a
//!   pool's template share;
//! - `annotations`: a SmolVM's force-delete and recreate annotations (V7);
//! - `volume`: a SmolVM's volumes (V16);
//! - `branch`: branches and their sources (V17).

mod annotations;
mod bound;
mod branch;
mod class;
mod context;
mod decode;
mod fields;
mod node;
mod pool;
mod smolvm;
mod status;
mod verdict;
mod volume;

pub use branch::validate_branch_request;
pub use class::validate_smolvm_class;
pub use context::{Context, Identity, NodeCatalog, NodeFacts};
pub use decode::{
    Raw, Target, decode, validate_raw, validate_smolvm_json, validate_smolvm_node_json, validate_smolvm_status_json,
    validate_smolvm_with,
};
pub use node::{validate_smolvm_node, validate_smolvm_node_status};
pub use pool::{validate_pooled_request, validate_smolvm_pool};
pub use smolvm::validate_smolvm;
pub use status::validate_smolvm_status;
pub use verdict::{Finding, RuleId, Verdict};

pub use crate::admission::Operation;
