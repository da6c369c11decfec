//! The PKI's one error type, with a stable reason for each variant.

/// Errors of the PKI's I/O: the runtime CA's Secret, the node API token, the CSR signer.
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
        secret = smolvm_api::constants::RUNTIME_CA
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
