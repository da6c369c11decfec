//! The client's TLS: the config in force for new connections ([`ClientTls`]), trusting only the
//! runtime CAs ([`client_tls`]) and presenting the controller's client certificate
//! ([`ClientCert`]).

use std::sync::{Arc, RwLock};

use rustls::ClientConfig;

/// The node API client's TLS config, replaced as a whole when the runtime CAs change: each new
/// connection takes the config in force, open connections keep the one they were made with.
#[derive(Debug)]
pub struct ClientTls(RwLock<Arc<ClientConfig>>);

impl ClientTls {
    /// Starts with `config`.
    pub fn new(config: ClientConfig) -> Arc<Self> {
        Arc::new(ClientTls(RwLock::new(Arc::new(config))))
    }

    /// The config for the next connection.
    pub fn current(&self) -> Arc<ClientConfig> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `config` in force from the next connection on.
    pub fn replace(&self, config: ClientConfig) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }
}

/// Presents the controller's client certificate, swappable on rotation without a new client.
#[derive(Debug)]
pub struct ClientCert(pub Arc<smolvm_certs::ReloadableResolver>);

impl rustls::client::ResolvesClientCert for ClientCert {
    fn resolve(
        &self,
        _hints: &[&[u8]],
        _schemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.current_certified_key())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A client TLS config that trusts only the CAs in `ca_pem` (WebPKI: chain, validity, name) and
/// presents `cert`.
pub fn client_tls(
    ca_pem: &str,
    cert: Arc<smolvm_certs::ReloadableResolver>,
) -> Result<ClientConfig, smolvm_certs::Error> {
    let roots = smolvm_certs::root_store(ca_pem)?;
    let mut config = ClientConfig::builder_with_provider(smolvm_certs::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(smolvm_certs::Error::TlsConfig)?
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(ClientCert(cert)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
