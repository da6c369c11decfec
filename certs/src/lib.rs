//! rcgen-based CA and leaf issuance, PEM parsing and expiry checks, and rustls configs whose
//! certificates swap atomically.
//!
//! Used by the webhook's self-signed TLS bootstrap, the runtime agent's node API (mTLS server,
//! key generated on the node, certificate obtained through a CSR), the controller's node API
//! client and the controller's CSR signer. Every rustls config uses the ring provider
//! ([`crypto_provider`]); certificate verification is never skipped.

#![deny(missing_docs)]

mod ca;
mod csr;
mod error;
mod names;
mod pem;
mod provider;
mod tls;
mod trust;
mod validity;

pub use ca::{CertificateAuthority, IssuedCert, LeafUsage};
pub use csr::{CsrInfo, KeyAlgorithm, build_csr, generate_key_pair, parse_csr, validate_runtime_serving_csr};
pub use error::{Error, Result};
pub use names::{
    RUNTIME_SERVING_DNS_SUFFIX, RUNTIME_SERVING_SIGNER_NAME, runtime_server_name, runtime_serving_sans,
    validate_dns_name, webhook_service_dns_names,
};
pub use pem::{
    CertInfo, cert_info_from_der, is_expired, needs_renewal, parse_cert_pem, parse_pem_chain, parse_private_key_pem,
    remaining,
};
pub use provider::crypto_provider;
pub use tls::{
    ReloadableResolver, SERVER_ALPN, client_config, mtls_server_config, optional_client_cert_server_config, root_store,
    server_config,
};
pub use trust::{fingerprint, issuer_in, signed_by};
pub use validity::{CLOCK_SKEW_ALLOWANCE, Validity};

/// Renew when two thirds of a certificate's lifetime has passed (the `fraction` for
/// [`needs_renewal`] used across the operator).
pub const RENEWAL_FRACTION: f64 = 2.0 / 3.0;
