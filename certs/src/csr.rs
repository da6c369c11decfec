//! Node-local key generation, CSR building and CSR inspection / policy.

use std::net::IpAddr;

use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType};
use rustls::pki_types::CertificateSigningRequestDer;
use rustls::pki_types::pem::PemObject;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use crate::error::{Error, Result};
use crate::names::{distinguished_name, runtime_server_name, runtime_serving_sans, validate_dns_name};
use crate::pem::{ip_from_bytes, parse_private_key_pem};

/// What a certificate signing request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrInfo {
    /// Subject common name, if present.
    pub common_name: Option<String>,
    /// Requested DNS SANs, in request order.
    pub dns_names: Vec<String>,
    /// Requested IP SANs, in request order.
    pub ip_addrs: Vec<IpAddr>,
    /// Requested SANs of any other type, described as `kind:value` (e.g. `uri:spiffe://x`,
    /// `email:a@b`).
    pub other_sans: Vec<String>,
    /// OIDs of requested extensions other than subjectAltName, keyUsage, extendedKeyUsage and
    /// basicConstraints, plus `attribute:<oid>` for CSR attributes other than extensionRequest.
    pub other_extensions: Vec<String>,
    /// Whether basicConstraints asks for a CA certificate.
    pub requests_ca: bool,
    /// The requester's SubjectPublicKeyInfo, DER.
    pub public_key_der: Vec<u8>,
    /// The kind of key the request is for.
    pub key_algorithm: KeyAlgorithm,
}

/// The kind of public key in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyAlgorithm {
    /// ECDSA on the NIST P-256 curve, what [`generate_key_pair`] makes.
    EcdsaP256,
    /// Anything else, described by its algorithm OID (and curve or key size where known).
    Other(String),
}

impl std::fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyAlgorithm::EcdsaP256 => f.write_str("ECDSA P-256"),
            KeyAlgorithm::Other(what) => f.write_str(what),
        }
    }
}

/// id-ecPublicKey.
const OID_EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
/// prime256v1 (secp256r1, NIST P-256).
const OID_P256: &str = "1.2.840.10045.3.1.7";
/// rsaEncryption.
const OID_RSA: &str = "1.2.840.113549.1.1.1";

fn key_algorithm(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> KeyAlgorithm {
    let algorithm = spki.algorithm.algorithm.to_id_string();
    let curve = spki
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .map(|o| o.to_id_string());
    match (algorithm.as_str(), curve.as_deref()) {
        (OID_EC_PUBLIC_KEY, Some(OID_P256)) => KeyAlgorithm::EcdsaP256,
        (OID_EC_PUBLIC_KEY, curve) => KeyAlgorithm::Other(format!("EC key on curve {}", curve.unwrap_or("(none)"))),
        (OID_RSA, _) => {
            let bits = match spki.parsed() {
                Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => rsa.key_size().to_string(),
                _ => "?".to_string(),
            };
            KeyAlgorithm::Other(format!("RSA-{bits}"))
        }
        (other, _) => KeyAlgorithm::Other(format!("key algorithm {other}")),
    }
}

impl CsrInfo {
    /// True when the request asks for anything beyond CN, DNS/IP SANs and ordinary usages.
    pub fn has_unexpected_requests(&self) -> bool {
        !self.other_sans.is_empty() || !self.other_extensions.is_empty() || self.requests_ca
    }
}

/// Generates a new ECDSA P-256 private key, returned as PKCS#8 PEM.
pub fn generate_key_pair() -> Result<String> {
    Ok(KeyPair::generate()?.serialize_pem())
}

/// Builds a PKCS#10 CSR (PEM) for `key_pem` with subject CN `common_name` (omitted when
/// empty) and the given DNS SANs. The private key never leaves the caller.
pub fn build_csr(key_pem: &str, common_name: &str, dns_names: &[String]) -> Result<String> {
    let key_der = parse_private_key_pem(key_pem)?;
    let key = KeyPair::try_from(&key_der).map_err(|e| Error::InvalidPrivateKey(e.to_string()))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = if common_name.is_empty() {
        DistinguishedName::new()
    } else {
        distinguished_name(common_name)?
    };
    for name in dns_names {
        validate_dns_name(name)?;
        let ia5 = name.as_str().try_into().map_err(|e: rcgen::Error| Error::InvalidName {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        params.subject_alt_names.push(SanType::DnsName(ia5));
    }
    Ok(params.serialize_request(&key)?.pem()?)
}

/// Parses a CSR (PEM or DER), verifies its self-signature and reports what it requests.
pub fn parse_csr(csr: impl AsRef<[u8]>) -> Result<CsrInfo> {
    parse_csr_inner(csr.as_ref()).map(|(info, _)| info)
}

/// Checks a parsed runtime serving CSR against the naming policy for `node_name`.
///
/// Accepted only when the key is ECDSA P-256, the DNS SANs are exactly [`runtime_serving_sans`]`(node_name)`, there are
/// no IP or other SANs, no CA request, no other extensions or attributes, and the subject CN
/// is absent or equal to [`runtime_server_name`]`(node_name)`. The controller's signer for
/// [`crate::RUNTIME_SERVING_SIGNER_NAME`] calls this (after checking the requester's node)
/// before [`crate::CertificateAuthority::sign_csr`] with [`crate::LeafUsage::Server`].
pub fn validate_runtime_serving_csr(info: &CsrInfo, node_name: &str) -> Result<()> {
    if info.key_algorithm != KeyAlgorithm::EcdsaP256 {
        return Err(Error::CsrRejected(format!(
            "the key must be ECDSA P-256, as the runtime generates; this request is for {}",
            info.key_algorithm
        )));
    }
    let allowed = runtime_serving_sans(node_name);
    for name in &allowed {
        validate_dns_name(name)?;
    }
    if info.dns_names != allowed {
        return Err(Error::CsrRejected(format!(
            "DNS SANs {:?} must be exactly {:?}",
            info.dns_names, allowed
        )));
    }
    if !info.ip_addrs.is_empty() {
        return Err(Error::CsrRejected(format!(
            "IP SANs are not allowed: {:?}",
            info.ip_addrs
        )));
    }
    if !info.other_sans.is_empty() {
        return Err(Error::CsrRejected(format!(
            "SAN types other than DNS are not allowed: {:?}",
            info.other_sans
        )));
    }
    if info.requests_ca {
        return Err(Error::CsrRejected("CA certificates are not signed".to_string()));
    }
    if !info.other_extensions.is_empty() {
        return Err(Error::CsrRejected(format!(
            "extensions not allowed: {:?}",
            info.other_extensions
        )));
    }
    let expected_cn = runtime_server_name(node_name);
    match info.common_name.as_deref() {
        None => {}
        Some(cn) if cn == expected_cn => {}
        Some(cn) => {
            return Err(Error::CsrRejected(format!(
                "subject CN {cn:?} must be {expected_cn:?} or absent"
            )));
        }
    }
    Ok(())
}

/// Parses and verifies a CSR; returns its info and SubjectPublicKeyInfo DER.
pub(crate) fn parse_csr_inner(input: &[u8]) -> Result<(CsrInfo, Vec<u8>)> {
    let der: Vec<u8> = if contains(input, b"-----BEGIN") {
        CertificateSigningRequestDer::from_pem_slice(input)
            .map_err(|e| match e {
                rustls::pki_types::pem::Error::NoItemsFound => Error::EmptyPem {
                    what: "certificate request",
                },
                other => Error::InvalidPem {
                    what: "certificate request",
                    detail: other.to_string(),
                },
            })?
            .as_ref()
            .to_vec()
    } else {
        input.to_vec()
    };
    if der.is_empty() {
        return Err(Error::EmptyPem {
            what: "certificate request",
        });
    }
    let (rest, csr) = X509CertificationRequest::from_der(&der).map_err(|e| Error::InvalidCsr(e.to_string()))?;
    if !rest.is_empty() {
        return Err(Error::InvalidCsr("trailing bytes after request".to_string()));
    }
    csr.verify_signature().map_err(|_| Error::CsrSignatureInvalid)?;

    let req = &csr.certification_request_info;
    let common_name = match req.subject.iter_common_name().next() {
        Some(attr) => Some(
            attr.as_str()
                .map_err(|e| Error::InvalidCsr(format!("subject CN: {e}")))?
                .to_string(),
        ),
        None => None,
    };
    let mut info = CsrInfo {
        common_name,
        dns_names: Vec::new(),
        ip_addrs: Vec::new(),
        other_sans: Vec::new(),
        other_extensions: Vec::new(),
        requests_ca: false,
        public_key_der: req.subject_pki.raw.to_vec(),
        key_algorithm: key_algorithm(&req.subject_pki),
    };
    for attr in req.iter_attributes() {
        let ParsedCriAttribute::ExtensionRequest(ext_req) = attr.parsed_attribute() else {
            info.other_extensions
                .push(format!("attribute:{}", attr.oid.to_id_string()));
            continue;
        };
        for ext in &ext_req.extensions {
            match ext.parsed_extension() {
                ParsedExtension::SubjectAlternativeName(san) => {
                    for name in &san.general_names {
                        classify_san(name, &mut info)?;
                    }
                }
                ParsedExtension::KeyUsage(_) | ParsedExtension::ExtendedKeyUsage(_) => {}
                ParsedExtension::BasicConstraints(bc) => info.requests_ca |= bc.ca,
                ParsedExtension::ParseError { error } => {
                    return Err(Error::InvalidCsr(format!(
                        "extension {}: {error}",
                        ext.oid.to_id_string()
                    )));
                }
                _ => info.other_extensions.push(ext.oid.to_id_string()),
            }
        }
    }
    let spki = info.public_key_der.clone();
    Ok((info, spki))
}

fn classify_san(name: &GeneralName<'_>, info: &mut CsrInfo) -> Result<()> {
    match name {
        GeneralName::DNSName(d) => info.dns_names.push((*d).to_string()),
        GeneralName::IPAddress(bytes) => match ip_from_bytes(bytes) {
            Some(ip) => info.ip_addrs.push(ip),
            None => info.other_sans.push(format!("ip:{}", hex(bytes))),
        },
        GeneralName::RFC822Name(e) => info.other_sans.push(format!("email:{e}")),
        GeneralName::URI(u) => info.other_sans.push(format!("uri:{u}")),
        GeneralName::OtherName(oid, _) => info.other_sans.push(format!("othername:{}", oid.to_id_string())),
        GeneralName::DirectoryName(n) => info.other_sans.push(format!("dirname:{n}")),
        GeneralName::RegisteredID(oid) => info.other_sans.push(format!("rid:{}", oid.to_id_string())),
        GeneralName::X400Address(_) => info.other_sans.push("x400address".to_string()),
        GeneralName::EDIPartyName(_) => info.other_sans.push("edipartyname".to_string()),
        GeneralName::Invalid(_, _) => {
            return Err(Error::InvalidCsr("malformed subjectAltName entry".to_string()));
        }
    }
    Ok(())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info_for(node: &str) -> CsrInfo {
        CsrInfo {
            common_name: Some(runtime_server_name(node)),
            dns_names: runtime_serving_sans(node),
            ip_addrs: vec![],
            other_sans: vec![],
            other_extensions: vec![],
            requests_ca: false,
            public_key_der: vec![],
            key_algorithm: KeyAlgorithm::EcdsaP256,
        }
    }

    #[test]
    fn runtime_policy_table() {
        type Mutate = fn(&mut CsrInfo);
        let cases: &[(&str, Mutate, bool)] = &[
            ("exact", |_| {}, true),
            ("no cn", |i| i.common_name = None, true),
            ("other cn", |i| i.common_name = Some("x".into()), false),
            ("other node", |i| i.dns_names = runtime_serving_sans("n2"), false),
            ("extra dns", |i| i.dns_names.push("evil.example".into()), false),
            ("dup dns", |i| i.dns_names.push(i.dns_names[0].clone()), false),
            ("no dns", |i| i.dns_names.clear(), false),
            ("ip", |i| i.ip_addrs.push("10.0.0.1".parse().unwrap()), false),
            ("uri", |i| i.other_sans.push("uri:spiffe://x".into()), false),
            ("ca", |i| i.requests_ca = true, false),
            ("ext", |i| i.other_extensions.push("1.2.3".into()), false),
            (
                "rsa",
                |i| i.key_algorithm = KeyAlgorithm::Other("RSA-1024".into()),
                false,
            ),
            (
                "p384",
                |i| i.key_algorithm = KeyAlgorithm::Other("EC key on curve 1.3.132.0.34".into()),
                false,
            ),
        ];
        for (name, mutate, ok) in cases {
            let mut info = info_for("n1");
            mutate(&mut info);
            let res = validate_runtime_serving_csr(&info, "n1");
            assert_eq!(res.is_ok(), *ok, "{name}: {res:?}");
            if let Err(e) = res {
                assert_eq!(e.reason(), "CsrRejected", "{name}");
            }
        }
    }

    #[test]
    fn build_and_parse_round_trip() {
        let key = generate_key_pair().unwrap();
        let sans = runtime_serving_sans("node-a");
        let csr = build_csr(&key, &runtime_server_name("node-a"), &sans).unwrap();
        assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        let info = parse_csr(&csr).unwrap();
        assert_eq!(info.dns_names, sans);
        assert_eq!(info.common_name, Some(runtime_server_name("node-a")));
        assert!(!info.has_unexpected_requests());
        validate_runtime_serving_csr(&info, "node-a").unwrap();
        assert!(validate_runtime_serving_csr(&info, "node-b").is_err());

        // DER input works too.
        let der = CertificateSigningRequestDer::from_pem_slice(csr.as_bytes()).unwrap();
        assert_eq!(parse_csr(der.as_ref()).unwrap(), info);
    }

    #[test]
    fn garbage_csr_inputs_are_errors() {
        let key = generate_key_pair().unwrap();
        let csr = build_csr(&key, "cn", &["a.example".to_string()]).unwrap();
        let mut der = CertificateSigningRequestDer::from_pem_slice(csr.as_bytes())
            .unwrap()
            .as_ref()
            .to_vec();
        // Flip a bit in the signature (last byte) -> signature must not verify.
        let last = der.len() - 1;
        der[last] ^= 0x01;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "EmptyPem"),
            (b"-----BEGIN CERTIFICATE REQUEST-----\n!!\n".to_vec(), "InvalidPem"),
            (
                b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec(),
                "EmptyPem",
            ),
            (b"not a csr".to_vec(), "InvalidCsr"),
            (vec![0x30, 0x03, 0x02, 0x01, 0x00], "InvalidCsr"),
            (der, "CsrSignatureInvalid"),
        ];
        for (input, reason) in cases {
            assert_eq!(
                parse_csr(&input).unwrap_err().reason(),
                reason,
                "{:?}",
                String::from_utf8_lossy(&input)
            );
        }
        assert_eq!(build_csr("garbage", "cn", &[]).unwrap_err().reason(), "EmptyPem");
        assert_eq!(
            build_csr(&key, "cn", &["bad name".to_string()]).unwrap_err().reason(),
            "InvalidName"
        );
    }
}
