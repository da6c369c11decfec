//! Trust during a CA rotation: which CA signed a certificate, and certificate fingerprints.
//!
//! A rotation publishes a bundle, the new CA first and the old one after it, and keeps both
//! trusted until every holder of an old-CA certificate has a new one. [`issuer_in`] tells a
//! certificate's holder which CA of the bundle signed it (the first entry is the one signing
//! now).

use rustls::pki_types::CertificateDer;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CertificateAuthority, parse_pem_chain};
    use std::time::Duration;

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
}
