//! The crate's single error type.

/// Result alias used throughout this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while issuing, parsing or serving certificates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input held no PEM section of the expected kind (empty or garbage input).
    #[error("no {what} found in PEM input")]
    EmptyPem {
        /// What was looked for, e.g. "certificate" or "private key".
        what: &'static str,
    },
    /// A PEM section could not be decoded.
    #[error("invalid PEM {what}: {detail}")]
    InvalidPem {
        /// What was being decoded.
        what: &'static str,
        /// Decoder message.
        detail: String,
    },
    /// A certificate could not be parsed as X.509.
    #[error("invalid certificate: {0}")]
    InvalidCertificate(String),
    /// A private key could not be parsed or loaded.
    #[error("invalid private key: {0}")]
    InvalidPrivateKey(String),
    /// The private key does not belong to the certificate.
    #[error("private key does not match certificate: {0}")]
    KeyMismatch(String),
    /// The certificate given as a CA is not a CA certificate.
    #[error("certificate is not a CA certificate")]
    NotACertificateAuthority,
    /// A certificate signing request could not be parsed.
    #[error("invalid certificate signing request: {0}")]
    InvalidCsr(String),
    /// The certificate signing request's self-signature does not verify.
    #[error("certificate signing request signature does not verify")]
    CsrSignatureInvalid,
    /// A certificate signing request was well formed but asks for something we do not sign.
    #[error("certificate signing request rejected: {0}")]
    CsrRejected(String),
    /// A DNS name or common name is not acceptable.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The offending name.
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A validity window is empty, inverted or out of range.
    #[error("invalid validity window: {0}")]
    InvalidValidity(String),
    /// The system random number generator failed.
    #[error("random number generation failed")]
    Random,
    /// rcgen failed to generate a key or certificate.
    #[error("certificate generation failed: {0}")]
    Generation(#[from] rcgen::Error),
    /// A rustls configuration could not be built.
    #[error("TLS configuration failed: {0}")]
    TlsConfig(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client certificate verifier failed: {0}")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
}

impl Error {
    /// Stable CamelCase reason for conditions, events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::EmptyPem { .. } => "EmptyPem",
            Error::InvalidPem { .. } => "InvalidPem",
            Error::InvalidCertificate(_) => "InvalidCertificate",
            Error::InvalidPrivateKey(_) => "InvalidPrivateKey",
            Error::KeyMismatch(_) => "KeyMismatch",
            Error::NotACertificateAuthority => "NotACertificateAuthority",
            Error::InvalidCsr(_) => "InvalidCsr",
            Error::CsrSignatureInvalid => "CsrSignatureInvalid",
            Error::CsrRejected(_) => "CsrRejected",
            Error::InvalidName { .. } => "InvalidName",
            Error::InvalidValidity(_) => "InvalidValidity",
            Error::Random => "RandomFailed",
            Error::Generation(_) => "CertificateGenerationFailed",
            Error::TlsConfig(_) => "TlsConfigFailed",
            Error::ClientVerifier(_) => "ClientVerifierFailed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_camel_case_and_distinct() {
        let errors = [
            Error::EmptyPem { what: "x" },
            Error::InvalidPem {
                what: "x",
                detail: String::new(),
            },
            Error::InvalidCertificate(String::new()),
            Error::InvalidPrivateKey(String::new()),
            Error::KeyMismatch(String::new()),
            Error::NotACertificateAuthority,
            Error::InvalidCsr(String::new()),
            Error::CsrSignatureInvalid,
            Error::CsrRejected(String::new()),
            Error::InvalidName {
                name: String::new(),
                reason: String::new(),
            },
            Error::InvalidValidity(String::new()),
            Error::Random,
            Error::Generation(rcgen::Error::CouldNotParseCertificate),
            Error::TlsConfig(rustls::Error::NoCertificatesPresented),
        ];
        let mut seen = std::collections::HashSet::new();
        for e in &errors {
            let r = e.reason();
            assert!(r.chars().next().unwrap().is_ascii_uppercase(), "{r}");
            assert!(r.chars().all(|c| c.is_ascii_alphanumeric()), "{r}");
            assert!(seen.insert(r), "duplicate reason {r}");
        }
    }
}
