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
//! - here: the error type and the certificate lifetime.

mod handle;
mod judge;

pub use handle::{handle_csr, handle_csr_with_node_uid};
pub use judge::{ALLOWED_USAGES, Judgement, NodeLookup, claimed_node, judge, judge_with_node_uid};

/// Lifetime of the runtime serving certificates and of the controller's client certificate.
pub const LEAF_LIFETIME: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// Errors of the signer's I/O.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    /// The API server failed a call.
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    /// Certificate work failed.
    #[error("certificates: {0}")]
    Certs(#[from] smolvm_certs::Error),
    /// The stored CA Secret is incomplete.
    #[error("Secret {0} lacks {1}")]
    Incomplete(&'static str, &'static str),
    /// The node API token Secret is unusable.
    #[error("node API token: {0}")]
    BadToken(String),
    /// The OS random source failed.
    #[error("random source: {0}")]
    Random(String),
    /// The runtime CA Secret is gone while nodes exist: a new CA would cut every node off.
    #[error(
        "the runtime CA Secret {secret} is missing while {0} SmolVMNode(s) exist; a new CA would cut every node off until its agent reads the new CA and re-files its serving certificate. Restore the Secret from a backup (the controller retries every 30 s), or start over deliberately: run the controller once with --allow-new-runtime-ca (docs/operations.md, \"Certificate rotation\")",
        secret = crate::runtime_ca::CA_SECRET
    )]
    CaMissing(usize),
}

impl SignerError {
    /// Stable reason string.
    pub fn reason(&self) -> &'static str {
        match self {
            SignerError::Kube(_) => "KubeError",
            SignerError::Certs(e) => e.reason(),
            SignerError::Incomplete(..) => "CASecretIncomplete",
            SignerError::BadToken(_) => "TokenSecretInvalid",
            SignerError::Random(_) => "RandomSourceFailed",
            SignerError::CaMissing(_) => "RuntimeCAMissing",
        }
    }
}

#[cfg(test)]
mod tests;
