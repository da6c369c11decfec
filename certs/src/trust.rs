//! Trust during a CA rotation: which CA signed a certificate, certificate fingerprints, and a
//! server-certificate verifier whose trust anchors swap at run time.
//!
//! A rotation publishes a bundle, the new CA first and the old one after it, and keeps both
//! trusted until every holder of an old-CA certificate has a new one. [`issuer_in`] tells a
//! certificate's holder which CA of the bundle signed it (the first entry is the one signing
//! now); [`ReloadableServerVerifier`] lets a client trust both, then only the new one, without
//! being rebuilt.

use std::fmt;
use std::sync::{Arc, RwLock};

use rustls::DigitallySignedStruct;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use crate::error::{Error, Result};
use crate::tls::{crypto_provider, root_store};

/// `sha256:<64 hex digits>` of a certificate's DER encoding: a short, stable name for a CA that
/// an agent reports and an operator can compare (`openssl x509 -fingerprint -sha256`).
pub fn fingerprint(der: &CertificateDer<'_>) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Whether `ca` signed `leaf`: the leaf's issuer is the CA's subject and the leaf's signature
/// verifies with the CA's public key. Anything that does not parse is "no".
pub fn signed_by(leaf: &CertificateDer<'_>, ca: &CertificateDer<'_>) -> bool {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (Ok((_, leaf)), Ok((_, ca))) = (
        X509Certificate::from_der(leaf.as_ref()),
        X509Certificate::from_der(ca.as_ref()),
    ) else {
        return false;
    };
    leaf.issuer().as_raw() == ca.subject().as_raw() && leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// The position in `bundle` of the CA that signed `leaf`, if any. In a published bundle the
/// first CA (position 0) is the one signing now; a certificate from a later one should be
/// replaced.
pub fn issuer_in(leaf: &CertificateDer<'_>, bundle: &[CertificateDer<'_>]) -> Option<usize> {
    bundle.iter().position(|ca| signed_by(leaf, ca))
}

/// A WebPKI [`ServerCertVerifier`] whose trust anchors can be replaced at run time (full
/// verification always: chain, validity, name; only the set of anchors changes).
pub struct ReloadableServerVerifier {
    inner: RwLock<Arc<WebPkiServerVerifier>>,
}

impl fmt::Debug for ReloadableServerVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadableServerVerifier").finish_non_exhaustive()
    }
}

fn webpki(ca_pem: &str) -> Result<Arc<WebPkiServerVerifier>> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(root_store(ca_pem)?), crypto_provider())
        .build()
        .map_err(|e| Error::InvalidCertificate(format!("trust anchors: {e}")))
}

impl ReloadableServerVerifier {
    /// Trusts exactly the certificates in `ca_pem`.
    pub fn new(ca_pem: &str) -> Result<Self> {
        Ok(ReloadableServerVerifier {
            inner: RwLock::new(webpki(ca_pem)?),
        })
    }

    /// From the next handshake on, trusts exactly the certificates in `ca_pem`; on an error the
    /// anchors stay as they were.
    pub fn set_roots(&self, ca_pem: &str) -> Result<()> {
        let next = webpki(ca_pem)?;
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = next;
        Ok(())
    }

    fn current(&self) -> Arc<WebPkiServerVerifier> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl ServerCertVerifier for ReloadableServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.current()
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CertificateAuthority, parse_pem_chain};
    use std::time::{Duration, SystemTime};

    const DAY: Duration = Duration::from_secs(86_400);

    fn leaf(ca: &CertificateAuthority, name: &str) -> CertificateDer<'static> {
        let issued = ca
            .issue_server(&[name.to_string()], &[], DAY)
            .expect("issue a server certificate");
        parse_pem_chain(&issued.cert_pem).expect("parse")[0].clone()
    }

    #[test]
    fn which_ca_signed_a_certificate() {
        // Two CAs with the same name, as before and after a rotation.
        let old = CertificateAuthority::generate("smolvm-runtime-ca", DAY).expect("old CA");
        let new = CertificateAuthority::generate("smolvm-runtime-ca", DAY).expect("new CA");
        let from_old = leaf(&old, "a.example");
        let from_new = leaf(&new, "a.example");
        let bundle = [new.cert_der().clone(), old.cert_der().clone()];
        let cases: [(&str, &CertificateDer<'_>, &[CertificateDer<'_>], Option<usize>); 6] = [
            ("new leaf, rotation bundle", &from_new, &bundle, Some(0)),
            ("old leaf, rotation bundle", &from_old, &bundle, Some(1)),
            ("old leaf, new-only bundle", &from_old, &bundle[..1], None),
            ("new leaf, old-only bundle", &from_new, &bundle[1..], None),
            ("empty bundle", &from_new, &[], None),
            ("a CA is not signed by another CA", new.cert_der(), &bundle[1..], None),
        ];
        for (name, leaf, bundle, expected) in cases {
            assert_eq!(issuer_in(leaf, bundle), expected, "{name}");
        }
        assert!(!signed_by(&CertificateDer::from(vec![1, 2, 3]), old.cert_der()));
    }

    #[test]
    fn fingerprints_name_one_certificate() {
        let a = CertificateAuthority::generate("a", DAY).expect("CA");
        let b = CertificateAuthority::generate("a", DAY).expect("CA");
        let fa = fingerprint(a.cert_der());
        assert!(fa.starts_with("sha256:") && fa.len() == 7 + 64, "{fa}");
        assert_eq!(fa, fingerprint(a.cert_der()));
        assert_ne!(fa, fingerprint(b.cert_der()));
    }

    #[test]
    fn verifier_follows_its_anchors() {
        let old = CertificateAuthority::generate("smolvm-runtime-ca", DAY).expect("old CA");
        let new = CertificateAuthority::generate("smolvm-runtime-ca", DAY).expect("new CA");
        let name = ServerName::try_from("a.example").expect("name");
        let now = UnixTime::since_unix_epoch(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock"));
        let verifier = ReloadableServerVerifier::new(old.cert_pem()).expect("verifier");
        let verify = |leaf: &CertificateDer<'_>| verifier.verify_server_cert(leaf, &[], &name, &[], now).is_ok();
        let (from_old, from_new) = (leaf(&old, "a.example"), leaf(&new, "a.example"));
        assert!(verify(&from_old) && !verify(&from_new), "before: old only");
        verifier
            .set_roots(&format!("{}{}", new.cert_pem(), old.cert_pem()))
            .expect("both");
        assert!(verify(&from_old) && verify(&from_new), "during: both");
        verifier.set_roots(new.cert_pem()).expect("new");
        assert!(!verify(&from_old) && verify(&from_new), "after: new only");
        assert!(verifier.set_roots("not pem").is_err());
        assert!(verify(&from_new), "a bad bundle leaves the anchors as they were");
        // The name is still checked.
        let other = ServerName::try_from("b.example").expect("name");
        assert!(verifier.verify_server_cert(&from_new, &[], &other, &[], now).is_err());
    }
}
