//! The kit's error type. Every variant has a stable [`Error::reason`] string for logs, metrics
//! and conditions.

/// Errors of the shared plumbing (today: the self-signed TLS bootstrap).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting that cannot work.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Certificate generation, parsing or TLS configuration failed.
    #[error("certificates: {0}")]
    Certs(#[from] smolvm_certs::Error),
    /// A call to the Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The self-signed Secret exists but does not hold a usable CA and serving pair.
    #[error("secret {name}: {message}")]
    BadSecret {
        /// The Secret's name.
        name: String,
        /// What is wrong with it.
        message: String,
    },
}

impl Error {
    /// A stable, machine-readable name of the error kind.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Config(_) => "Config",
            Error::Certs(_) => "Certs",
            Error::Kube(_) => "Kube",
            Error::BadSecret { .. } => "BadSecret",
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
