//! The one crypto provider: every rustls config, key check and signature in this crate uses ring.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// The crypto provider every config in this crate uses: rustls' ring provider.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
