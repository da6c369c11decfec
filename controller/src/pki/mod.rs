//! The controller's PKI: the runtime CA, the CSR signer for the agents' serving certificates, and
//! the node API bearer token.
//!
//! - [`runtime_ca`]: the CA, kept in a Secret, published as a bundle, rotated without cutting a
//!   node off; the controller's client certificate and the trust it gives the node API client.
//! - [`signer`]: judges and signs the agents' CSRs (`vm.smolvm.dev/runtime-serving`).
//! - [`runtime_auth`]: the node API bearer token's Secret.

mod error;
pub mod runtime_auth;
pub mod runtime_ca;
pub mod signer;

pub use error::SignerError;
