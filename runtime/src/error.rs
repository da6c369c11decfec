//! The crate's single error type for everything outside the VMM client (which keeps its own
//! [`crate::vmm::VmmError`], wrapped here as [`Error::Vmm`]).

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the runtime agent can fail at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A flag, environment variable or file holds an unusable value.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Reading or writing a local file failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done, e.g. "reading the token file".
        what: &'static str,
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Certificates or TLS configuration.
    #[error("certificates: {0}")]
    Certs(#[from] smolvm_certs::Error),
    /// The machine runtime (smolvm) failed.
    #[error("runtime: {0}")]
    Vmm(#[from] crate::vmm::VmmError),
    /// `smolvm serve` could not be started or supervised.
    #[error("supervising smolvm serve: {0}")]
    Supervisor(String),
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The serving-certificate CSR was denied or failed.
    #[error("certificate signing request {name}: {message}")]
    CsrRejected {
        /// The CertificateSigningRequest's name.
        name: String,
        /// Why (condition type and message).
        message: String,
    },
    /// Waiting for something took longer than allowed.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A server could not bind or serve.
    #[error("serving {what}: {message}")]
    Serve {
        /// Which server.
        what: &'static str,
        /// The failure.
        message: String,
    },
    /// JSON (de)serialization of our own data failed.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    /// Stable CamelCase reason for conditions, events, logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Config(_) => "InvalidConfiguration",
            Error::Io { .. } => "IoError",
            Error::Certs(_) => "CertificateError",
            Error::Vmm(_) => "RuntimeError",
            Error::Supervisor(_) => "SupervisorError",
            // A clock far off fails every TLS handshake with the API server: say so, not only
            // that the API failed.
            Error::Kube(error) => smolvm_kit::causes::clock_trouble(error).map_or("KubernetesApiError", |t| t.reason()),
            Error::CsrRejected { .. } => "CsrRejected",
            Error::Timeout(_) => "Timeout",
            Error::Serve { .. } => "ServeError",
            Error::Json(_) => "JsonError",
        }
    }

    /// Stable code: the VMM's own code for runtime errors, the reason otherwise.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Vmm(error) => error.code(),
            other => other.reason(),
        }
    }

    /// Builds an [`Error::Io`].
    pub fn io(what: &'static str, path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        Error::Io {
            what,
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_and_codes_are_stable() {
        let cases: Vec<(Error, &str, &str)> = vec![
            (
                Error::Config("x".into()),
                "InvalidConfiguration",
                "InvalidConfiguration",
            ),
            (
                Error::io("reading", "/x", std::io::Error::other("boom")),
                "IoError",
                "IoError",
            ),
            (
                Error::Vmm(crate::vmm::VmmError::StartFailed { message: "m".into() }),
                "RuntimeError",
                "StartFailed",
            ),
            (Error::Supervisor("x".into()), "SupervisorError", "SupervisorError"),
            (
                Error::CsrRejected {
                    name: "n".into(),
                    message: "Denied".into(),
                },
                "CsrRejected",
                "CsrRejected",
            ),
            (Error::Timeout("x".into()), "Timeout", "Timeout"),
            (
                Error::Serve {
                    what: "node API",
                    message: "m".into(),
                },
                "ServeError",
                "ServeError",
            ),
        ];
        for (error, reason, code) in cases {
            assert_eq!(error.reason(), reason, "{error}");
            assert_eq!(error.code(), code, "{error}");
        }
    }
}
