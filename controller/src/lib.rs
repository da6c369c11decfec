//! The SmolVM controller: placement, binding, lifecycle, node-aware finalizers and runtime
//! certificate signing.
//!
//! - [`placement`]: the pure placement function and the reservation ledger.

pub mod nodeclient;
pub mod placement;
