//! The webhook's error type. Every variant has a stable [`Error::reason`] string for logs and
//! metrics.

/// Errors of the webhook process (not admission verdicts: a denied request is not an error).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command-line flag combination that cannot work.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Reading a file (certificate, key, policy) failed.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The policy file did not parse or was inconsistent.
    #[error("policy: {0}")]
    Policy(#[from] smolvm_api::Error),
    /// Certificate generation, parsing or TLS configuration failed.
    #[error("certificates: {0}")]
    Certs(#[from] smolvm_certs::Error),
    /// A call to the Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Binding or serving a socket failed.
    #[error("serving {what}: {source}")]
    Serve {
        /// Which listener.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The self-signed TLS mode failed (see [`smolvm_kit::selfsigned`]).
    #[error(transparent)]
    SelfSigned(#[from] smolvm_kit::Error),
    /// A TLS or HTTP client error (used by the test and benchmark client).
    #[error("client: {0}")]
    Client(String),
}

impl Error {
    /// A stable, machine-readable name of the error kind.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Config(_) => "Config",
            Error::Read { .. } => "Read",
            Error::Policy(_) => "Policy",
            Error::Certs(_) => "Certs",
            Error::Kube(_) => "Kube",
            Error::Serve { .. } => "Serve",
            Error::SelfSigned(e) => e.reason(),
            Error::Client(_) => "Client",
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
