//! Certificate authority: generation, reload from PEM, and leaf issuance.

use std::fmt;
use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use rustls::pki_types::CertificateDer;

use crate::csr::parse_csr_inner;
use crate::error::{Error, Result};
use crate::names::{distinguished_name, validate_dns_name};
use crate::pem::{cert_info_from_der, parse_pem_chain, parse_private_key_pem, parse_x509};
use crate::validity::Validity;

/// What a leaf certificate may be used for; the only extended key usage it will carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafUsage {
    /// TLS server: EKU serverAuth, KU digitalSignature + keyEncipherment.
    Server,
    /// TLS client: EKU clientAuth, KU digitalSignature.
    Client,
}

/// A freshly issued leaf certificate with its private key.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCert {
    /// Leaf certificate, PEM.
    pub cert_pem: String,
    /// Private key, PKCS#8 PEM.
    pub key_pem: String,
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A CA that can issue leaf certificates; can be persisted as PEM and reloaded.
pub struct CertificateAuthority {
    cert_pem: String,
    key_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl CertificateAuthority {
    /// Generates a new self-signed CA (ECDSA P-256, path length 0) valid for `validity`.
    pub fn generate(common_name: &str, validity: impl Into<Validity>) -> Result<Self> {
        if common_name.is_empty() {
            return Err(Error::InvalidName {
                name: String::new(),
                reason: "CA common name must not be empty".to_string(),
            });
        }
        let (not_before, not_after) = validity.into().to_offset()?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(common_name)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(random_serial()?);
        let cert = params.self_signed(&key)?;
        let key_pem = key.serialize_pem();
        Ok(CertificateAuthority {
            cert_pem: cert.pem(),
            key_pem,
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA from its certificate and private key PEM (as stored in a Secret).
    ///
    /// Fails if the certificate is not a CA or the key does not belong to it.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let chain = parse_pem_chain(cert_pem)?;
        let cert_der = chain
            .into_iter()
            .next()
            .ok_or(Error::EmptyPem { what: "certificate" })?;
        if !cert_info_from_der(&cert_der)?.is_ca {
            return Err(Error::NotACertificateAuthority);
        }
        let key_der = parse_private_key_pem(key_pem)?;
        let key = KeyPair::try_from(&key_der).map_err(|e| Error::InvalidPrivateKey(e.to_string()))?;
        {
            let cert = parse_x509(&cert_der)?;
            if cert.public_key().raw != key.subject_public_key_info().as_slice() {
                return Err(Error::KeyMismatch(
                    "CA private key does not belong to the CA certificate".to_string(),
                ));
            }
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)?;
        Ok(CertificateAuthority {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            cert_der,
            issuer,
        })
    }

    /// The CA certificate, PEM (also what goes into a caBundle).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, PEM.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Issues a server certificate (new key) for the given DNS names and IP addresses.
    ///
    /// The subject CN is the first DNS name (or IP). At least one SAN is required.
    pub fn issue_server(
        &self,
        dns_names: &[String],
        ip_addrs: &[IpAddr],
        validity: impl Into<Validity>,
    ) -> Result<IssuedCert> {
        let cn = dns_names
            .first()
            .cloned()
            .or_else(|| ip_addrs.first().map(ToString::to_string))
            .ok_or_else(|| Error::InvalidName {
                name: String::new(),
                reason: "a server certificate needs at least one DNS name or IP address".to_string(),
            })?;
        let params = leaf_params(Some(&cn), dns_names, ip_addrs, validity.into(), LeafUsage::Server)?;
        self.issue_with_new_key(params)
    }

    /// Issues a client certificate (new key) whose subject CN is `common_name`.
    pub fn issue_client(&self, common_name: &str, validity: impl Into<Validity>) -> Result<IssuedCert> {
        if common_name.is_empty() {
            return Err(Error::InvalidName {
                name: String::new(),
                reason: "a client certificate needs a common name".to_string(),
            });
        }
        let params = leaf_params(Some(common_name), &[], &[], validity.into(), LeafUsage::Client)?;
        self.issue_with_new_key(params)
    }

    /// Signs a PKCS#10 CSR (PEM or DER) after verifying its self-signature.
    ///
    /// Only the subject CN and the DNS / IP SANs are taken from the request; key usage,
    /// extended key usage (`usage`), validity and serial are ours, and every other requested
    /// extension or SAN type (URI, email, CA, …) is ignored. Policy checks on the requested
    /// names (e.g. [`crate::validate_runtime_serving_csr`]) are the caller's job, before this.
    pub fn sign_csr(&self, csr: impl AsRef<[u8]>, validity: impl Into<Validity>, usage: LeafUsage) -> Result<String> {
        let (info, spki_der) = parse_csr_inner(csr.as_ref())?;
        match usage {
            LeafUsage::Server if info.dns_names.is_empty() && info.ip_addrs.is_empty() => {
                return Err(Error::CsrRejected(
                    "a server certificate request needs a DNS or IP SAN".to_string(),
                ));
            }
            LeafUsage::Client if info.common_name.as_deref().unwrap_or("").is_empty() => {
                return Err(Error::CsrRejected(
                    "a client certificate request needs a subject common name".to_string(),
                ));
            }
            _ => {}
        }
        let public_key = rcgen::SubjectPublicKeyInfo::from_der(&spki_der)
            .map_err(|e| Error::InvalidCsr(format!("public key: {e}")))?;
        let params = leaf_params(
            info.common_name.as_deref(),
            &info.dns_names,
            &info.ip_addrs,
            validity.into(),
            usage,
        )?;
        let cert = params.signed_by(&public_key, &self.issuer)?;
        Ok(cert.pem())
    }

    fn issue_with_new_key(&self, params: CertificateParams) -> Result<IssuedCert> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn leaf_params(
    common_name: Option<&str>,
    dns_names: &[String],
    ip_addrs: &[IpAddr],
    validity: Validity,
    usage: LeafUsage,
) -> Result<CertificateParams> {
    let (not_before, not_after) = validity.to_offset()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = match common_name {
        Some(cn) if !cn.is_empty() => distinguished_name(cn)?,
        _ => DistinguishedName::new(),
    };
    for name in dns_names {
        validate_dns_name(name)?;
        let ia5 = name.as_str().try_into().map_err(|e: rcgen::Error| Error::InvalidName {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        params.subject_alt_names.push(SanType::DnsName(ia5));
    }
    params
        .subject_alt_names
        .extend(ip_addrs.iter().copied().map(SanType::IpAddress));
    params.is_ca = IsCa::ExplicitNoCa;
    match usage {
        LeafUsage::Server => {
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        }
        LeafUsage::Client => {
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
    }
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = not_after;
    params.serial_number = Some(random_serial()?);
    Ok(params)
}

/// A random positive 128-bit serial number (rcgen would otherwise derive it from the key).
fn random_serial() -> Result<SerialNumber> {
    let mut bytes = [0u8; 16];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| Error::Random)?;
    bytes[0] &= 0x7f; // positive
    bytes[0] |= 0x40; // no leading zero byte, so the encoding is always 16 bytes
    Ok(SerialNumber::from_slice(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pem::parse_cert_pem;
    use std::time::Duration;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn generate_reload_and_issue() {
        let ca = CertificateAuthority::generate("smolvm test CA", DAY).unwrap();
        let info = parse_cert_pem(ca.cert_pem()).unwrap();
        assert!(info.is_ca);
        assert_eq!(info.subject_cn.as_deref(), Some("smolvm test CA"));

        let reloaded = CertificateAuthority::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        let leaf = reloaded
            .issue_server(&["a.example".to_string()], &["127.0.0.1".parse().unwrap()], DAY)
            .unwrap();
        let leaf_info = parse_cert_pem(&leaf.cert_pem).unwrap();
        assert!(!leaf_info.is_ca);
        assert_eq!(leaf_info.dns_names, vec!["a.example"]);
        assert_eq!(leaf_info.ip_addrs, vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(leaf_info.subject_cn.as_deref(), Some("a.example"));
        assert!(leaf.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(!format!("{leaf:?}").contains("PRIVATE KEY"));
        assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn serials_are_random() {
        let ca = CertificateAuthority::generate("ca", DAY).unwrap();
        let a = ca.issue_client("c", DAY).unwrap();
        let b = ca.issue_client("c", DAY).unwrap();
        let (a, b) = (
            parse_cert_pem(&a.cert_pem).unwrap(),
            parse_cert_pem(&b.cert_pem).unwrap(),
        );
        assert_eq!(a.serial_hex.len(), 32);
        assert_ne!(a.serial_hex, b.serial_hex);
    }

    #[test]
    fn from_pem_rejects_bad_inputs() {
        let ca = CertificateAuthority::generate("ca", DAY).unwrap();
        let other = CertificateAuthority::generate("other", DAY).unwrap();
        let leaf = ca.issue_client("leaf", DAY).unwrap();
        let table: &[(&str, &str, &str)] = &[
            ("", ca.key_pem(), "EmptyPem"),
            ("garbage", ca.key_pem(), "EmptyPem"),
            (ca.cert_pem(), "", "EmptyPem"),
            (ca.cert_pem(), "garbage", "EmptyPem"),
            (ca.cert_pem(), other.key_pem(), "KeyMismatch"),
            (&leaf.cert_pem, &leaf.key_pem, "NotACertificateAuthority"),
        ];
        for (cert, key, reason) in table {
            let err = CertificateAuthority::from_pem(cert, key).unwrap_err();
            assert_eq!(err.reason(), *reason, "{err}");
        }
    }

    #[test]
    fn issue_rejects_bad_names() {
        let ca = CertificateAuthority::generate("ca", DAY).unwrap();
        let cases: Vec<(Vec<String>, &str)> = vec![
            (vec![], "InvalidName"),
            (vec!["bad name".into()], "InvalidName"),
            (vec!["".into()], "InvalidName"),
        ];
        for (names, reason) in cases {
            let err = ca.issue_server(&names, &[], DAY).unwrap_err();
            assert_eq!(err.reason(), reason, "{names:?}");
        }
        assert_eq!(ca.issue_client("", DAY).unwrap_err().reason(), "InvalidName");
        assert_eq!(
            ca.issue_client(&"x".repeat(65), DAY).unwrap_err().reason(),
            "InvalidName"
        );
        assert_eq!(
            CertificateAuthority::generate("", DAY).unwrap_err().reason(),
            "InvalidName"
        );
    }
}
