//! The runtime certificate signer (`vm.smolvm.dev/runtime-serving`).
//!
//! Each runtime agent generates its serving key on its node and files a
//! CertificateSigningRequest. [`judge`] approves it only when the requester is the runtime
//! ServiceAccount, its pod-bound token names the node the CSR asks for, and the CSR asks only for
//! that node's serving name and the serving usages. Anything else is denied with a reason.
//!
//! The token must carry both the node name and the node UID
//! (`authentication.kubernetes.io/node-uid`, a well-formed UUID); when the caller knows the UID of
//! the named node ([`judge_with_node_uid`]), the two must agree.
//!
//! A CSR that is Approved but carries no certificate (signing failed after the approval) is still
//! to sign: it is judged again by the same checks and signed, or marked Failed.
//!
//! - `judge`: the judgement, pure and table-tested;
//! - `handle`: acting on a CSR through the API server;
//! - here: the outline (the error type is [`crate::pki::SignerError`], the certificates' lifetime
//!   [`crate::pki::runtime_ca::LEAF_LIFETIME`]).

mod handle;
mod judge;

pub use handle::{handle_csr, handle_csr_with_node_uid};
pub use judge::{ALLOWED_USAGES, Judgement, NodeLookup, claimed_node, judge, judge_with_node_uid};

#[cfg(test)]
mod tests;
