//! The SmolVM controller: placement, binding, lifecycle, node-aware finalizers and runtime
//! certificate signing.
//!
//! - [`placement`]: the pure placement function and the reservation ledger.
//! - [`plan`]: what to do next for a SmolVM, as pure functions of what was observed.
//! - [`nodeclient`]: the mTLS client of the runtime agents' node API.

pub mod events;
pub mod lease;
pub mod metrics;
pub mod nodeclient;
pub mod placement;
pub mod plan;
pub mod reconcile;
pub mod runtime_auth;
pub mod signer;
