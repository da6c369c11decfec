//! The error type of the API crate.

/// Errors of the API crate: policy loading and CRD rendering.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The policy file could not be read.
    #[error("cannot read policy file {path}: {source}")]
    PolicyRead {
        /// File path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The policy file is not valid YAML of the policy's shape.
    #[error("invalid policy: {field}: {message}")]
    PolicyInvalid {
        /// The offending field, as a dotted path (`.` for the document itself).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A CRD could not be serialized.
    #[error("cannot render CRD: {0}")]
    Render(String),
}

impl Error {
    /// A stable CamelCase reason, for conditions, events and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::PolicyRead { .. } => "PolicyUnreadable",
            Error::PolicyInvalid { .. } => "PolicyInvalid",
            Error::Render(_) => "RenderFailed",
        }
    }
}
