//! rustls configurations (ring provider only) and a hot-swappable server certificate resolver.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::error::{Error, Result};
use crate::pem::{CertInfo, cert_info_from_der, parse_pem_chain, parse_private_key_pem};
use crate::provider::crypto_provider;

/// ALPN protocols offered by [`server_config`] and [`mtls_server_config`], in preference order.
pub const SERVER_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

struct Current {
    key: Arc<CertifiedKey>,
    info: CertInfo,
}

/// A [`ResolvesServerCert`] whose certificate can be replaced at run time.
///
/// Every new full handshake gets the certificate current at that moment; established
/// connections are untouched by a swap. (A TLS session resumed from before the swap keeps the
/// identity it was established with, as in any TLS server, until its ticket expires.)
pub struct ReloadableResolver {
    current: RwLock<Arc<Current>>,
}

impl fmt::Debug for ReloadableResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cur = self.load();
        f.debug_struct("ReloadableResolver")
            .field("subject_cn", &cur.info.subject_cn)
            .field("dns_names", &cur.info.dns_names)
            .field("not_after", &cur.info.not_after)
            .finish()
    }
}

impl ReloadableResolver {
    /// Creates a resolver serving `cert_pem` (leaf first, optional intermediates) with `key_pem`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        Ok(ReloadableResolver {
            current: RwLock::new(Arc::new(load_certified_key(cert_pem, key_pem)?)),
        })
    }

    /// Replaces the served certificate after checking that the pair parses and the key belongs
    /// to the leaf; on any error the current certificate stays in place.
    pub fn swap_pem(&self, cert_pem: &str, key_pem: &str) -> Result<()> {
        let next = Arc::new(load_certified_key(cert_pem, key_pem)?);
        let mut guard = self.current.write().unwrap_or_else(|p| p.into_inner());
        *guard = next;
        Ok(())
    }

    /// `not_after` of the certificate currently served.
    pub fn current_not_after(&self) -> SystemTime {
        self.load().info.not_after
    }

    /// Details of the certificate currently served.
    pub fn current_cert_info(&self) -> CertInfo {
        self.load().info.clone()
    }

    /// The certified key currently served.
    pub fn current_certified_key(&self) -> Arc<CertifiedKey> {
        self.load().key.clone()
    }

    fn load(&self) -> Arc<Current> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl ResolvesServerCert for ReloadableResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.load().key.clone())
    }
}

fn load_certified_key(cert_pem: &str, key_pem: &str) -> Result<Current> {
    let chain = parse_pem_chain(cert_pem)?;
    let leaf = chain.first().ok_or(Error::EmptyPem { what: "certificate" })?;
    let info = cert_info_from_der(leaf)?;
    let key_der = parse_private_key_pem(key_pem)?;
    let signing_key = crypto_provider()
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| Error::InvalidPrivateKey(e.to_string()))?;
    let certified = CertifiedKey::new(chain, signing_key);
    // Strict: an unknown consistency is treated as a mismatch too.
    certified.keys_match().map_err(|e| Error::KeyMismatch(e.to_string()))?;
    Ok(Current {
        key: Arc::new(certified),
        info,
    })
}

/// A root store holding exactly the certificates in `ca_pem`.
pub fn root_store(ca_pem: &str) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for der in parse_pem_chain(ca_pem)? {
        roots
            .add(der)
            .map_err(|e| Error::InvalidCertificate(format!("trust anchor: {e}")))?;
    }
    Ok(roots)
}

/// HTTPS server config (no client auth) serving the resolver's certificate; ALPN `h2`, `http/1.1`.
pub fn server_config(resolver: Arc<ReloadableResolver>) -> Result<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// mTLS server config: a client certificate chaining to `client_ca_pem` is mandatory.
pub fn mtls_server_config(resolver: Arc<ReloadableResolver>, client_ca_pem: &str) -> Result<ServerConfig> {
    client_verified_server_config(resolver, client_ca_pem, false)
}

fn client_verified_server_config(
    resolver: Arc<ReloadableResolver>,
    client_ca_pem: &str,
    optional: bool,
) -> Result<ServerConfig> {
    let provider = crypto_provider();
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(root_store(client_ca_pem)?), provider.clone());
    let verifier = if optional {
        builder.allow_unauthenticated().build()?
    } else {
        builder.build()?
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Server config that asks for a client certificate and, when one is presented, accepts it only
/// if it chains to `client_ca_pem`; a client without one still connects (the application then
/// decides, for instance answering 401). For the aggregated API, whose one legitimate caller,
/// the API server's front proxy, presents a certificate from the requestheader CA.
pub fn optional_client_cert_server_config(
    resolver: Arc<ReloadableResolver>,
    client_ca_pem: &str,
) -> Result<ServerConfig> {
    client_verified_server_config(resolver, client_ca_pem, true)
}

/// Client config that trusts only `ca_pem`, optionally presenting a client certificate.
///
/// Server identity is checked by rustls against the `ServerName` passed at connect time; for a
/// node's runtime use [`crate::runtime_server_name`]`(node)`.
pub fn client_config(ca_pem: &str, client_identity: Option<(&str, &str)>, alpn: &[&[u8]]) -> Result<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(root_store(ca_pem)?);
    let mut config = match client_identity {
        Some((cert_pem, key_pem)) => {
            // Validates the pair (including key/cert match) with clear errors first.
            load_certified_key(cert_pem, key_pem)?;
            builder.with_client_auth_cert(parse_pem_chain(cert_pem)?, parse_private_key_pem(key_pem)?)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CertificateAuthority;
    use std::time::Duration;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn builders_reject_bad_inputs() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = CertificateAuthority::generate("ca", DAY).unwrap();
        let other = CertificateAuthority::generate("other", DAY).unwrap();
        let leaf = ca.issue_server(&["a.example".into()], &[], DAY).unwrap();
        let client = ca.issue_client("c", DAY).unwrap();
        let other_client = other.issue_client("c", DAY).unwrap();

        let resolver = Arc::new(ReloadableResolver::from_pem(&leaf.cert_pem, &leaf.key_pem).unwrap());
        let cfg = server_config(resolver.clone()).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        mtls_server_config(resolver.clone(), ca.cert_pem()).unwrap();
        assert_eq!(
            mtls_server_config(resolver, "garbage").unwrap_err().reason(),
            "EmptyPem"
        );

        client_config(ca.cert_pem(), None, &[b"h2"]).unwrap();
        client_config(ca.cert_pem(), Some((&client.cert_pem, &client.key_pem)), &[]).unwrap();
        type Identity<'a> = Option<(&'a str, &'a str)>;
        let table: &[(&str, Identity, &str)] = &[
            ("", None, "EmptyPem"),
            ("junk", None, "EmptyPem"),
            (ca.cert_pem(), Some(("", &client.key_pem)), "EmptyPem"),
            (ca.cert_pem(), Some((&client.cert_pem, "")), "EmptyPem"),
            (
                ca.cert_pem(),
                Some((&client.cert_pem, &other_client.key_pem)),
                "KeyMismatch",
            ),
        ];
        for (ca_pem, identity, reason) in table {
            let err = client_config(ca_pem, *identity, &[]).unwrap_err();
            assert_eq!(err.reason(), *reason, "{err}");
        }
    }

    #[test]
    fn resolver_rejects_bad_pairs_and_keeps_old() {
        let ca = CertificateAuthority::generate("ca", DAY).unwrap();
        let a = ca.issue_server(&["a.example".into()], &[], DAY).unwrap();
        let b = ca.issue_server(&["b.example".into()], &[], DAY).unwrap();
        let r = ReloadableResolver::from_pem(&a.cert_pem, &a.key_pem).unwrap();
        let before = r.current_cert_info();
        let table: &[(&str, &str, &str)] = &[
            (&b.cert_pem, &a.key_pem, "KeyMismatch"),
            ("", &b.key_pem, "EmptyPem"),
            (&b.cert_pem, "", "EmptyPem"),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                &b.key_pem,
                "InvalidCertificate",
            ),
        ];
        for (c, k, reason) in table {
            assert_eq!(r.swap_pem(c, k).unwrap_err().reason(), *reason);
            assert_eq!(r.current_cert_info(), before);
        }
        r.swap_pem(&b.cert_pem, &b.key_pem).unwrap();
        assert_eq!(r.current_cert_info().dns_names, vec!["b.example"]);
        assert!(format!("{r:?}").contains("b.example"));
        assert_eq!(
            ReloadableResolver::from_pem(&a.cert_pem, &b.key_pem)
                .unwrap_err()
                .reason(),
            "KeyMismatch"
        );
    }
}
