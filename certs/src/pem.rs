//! PEM parsing, certificate inspection and expiry checks.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::X509Certificate;

use crate::error::{Error, Result};
use crate::provider::crypto_provider;
use crate::validity::system_time_from_unix;

/// What callers need to know about a certificate: identity, names and validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Subject common name, if present.
    pub subject_cn: Option<String>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// IP subject alternative names.
    pub ip_addrs: Vec<IpAddr>,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// Whether basicConstraints marks it as a CA.
    pub is_ca: bool,
    /// Serial number as lowercase hex (no separators).
    pub serial_hex: String,
}

/// Parses every `CERTIFICATE` section of `pem` (leaf first, as written), checking each is X.509.
///
/// Sections of other kinds (e.g. keys) are skipped; no certificate at all is [`Error::EmptyPem`].
pub fn parse_pem_chain(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    let mut chain = Vec::new();
    for item in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let der = item.map_err(|e| Error::InvalidPem {
            what: "certificate",
            detail: e.to_string(),
        })?;
        parse_x509(&der)?;
        chain.push(der);
    }
    if chain.is_empty() {
        return Err(Error::EmptyPem { what: "certificate" });
    }
    Ok(chain)
}

/// Parses the first private key (PKCS#8, PKCS#1 or SEC1) found in `pem`, checking that the
/// crypto provider can load it (so garbage inside a valid PEM frame is an error here).
pub fn parse_private_key_pem(pem: &str) -> Result<PrivateKeyDer<'static>> {
    let key = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => Error::EmptyPem { what: "private key" },
        other => Error::InvalidPem {
            what: "private key",
            detail: other.to_string(),
        },
    })?;
    crypto_provider()
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| Error::InvalidPrivateKey(e.to_string()))?;
    Ok(key)
}

/// Parses the first certificate in `pem` and returns its [`CertInfo`].
pub fn parse_cert_pem(pem: &str) -> Result<CertInfo> {
    let chain = parse_pem_chain(pem)?;
    let leaf = chain.first().ok_or(Error::EmptyPem { what: "certificate" })?;
    cert_info_from_der(leaf)
}

/// Returns the [`CertInfo`] of a DER certificate.
pub fn cert_info_from_der(der: &CertificateDer<'_>) -> Result<CertInfo> {
    let cert = parse_x509(der)?;
    let validity = cert.validity();
    let not_before = system_time_from_unix(validity.not_before.timestamp())
        .ok_or_else(|| Error::InvalidCertificate("notBefore out of range".to_string()))?;
    let not_after = system_time_from_unix(validity.not_after.timestamp())
        .ok_or_else(|| Error::InvalidCertificate("notAfter out of range".to_string()))?;
    let subject_cn = match cert.subject().iter_common_name().next() {
        Some(attr) => Some(
            attr.as_str()
                .map_err(|e| Error::InvalidCertificate(format!("subject CN: {e}")))?
                .to_string(),
        ),
        None => None,
    };
    let mut dns_names = Vec::new();
    let mut ip_addrs = Vec::new();
    let san = cert
        .subject_alternative_name()
        .map_err(|e| Error::InvalidCertificate(format!("subjectAltName: {e}")))?;
    if let Some(san) = san {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns_names.push((*d).to_string()),
                GeneralName::IPAddress(bytes) => {
                    if let Some(ip) = ip_from_bytes(bytes) {
                        ip_addrs.push(ip);
                    }
                }
                _ => {}
            }
        }
    }
    let is_ca = cert
        .basic_constraints()
        .map_err(|e| Error::InvalidCertificate(format!("basicConstraints: {e}")))?
        .is_some_and(|bc| bc.value.ca);
    let serial_hex = cert.raw_serial().iter().map(|b| format!("{b:02x}")).collect();
    Ok(CertInfo {
        subject_cn,
        dns_names,
        ip_addrs,
        not_before,
        not_after,
        is_ca,
        serial_hex,
    })
}

/// True when `now` is past `not_after` (a certificate is valid through its `not_after` second).
pub fn is_expired(info: &CertInfo, now: SystemTime) -> bool {
    now > info.not_after
}

/// True when the certificate should be renewed: it is expired, or `now` has reached
/// `not_before + fraction × lifetime` (use `2.0 / 3.0` for "renew at two thirds").
///
/// `fraction` is clamped to `[0, 1]`; NaN counts as 0 (always renew).
pub fn needs_renewal(info: &CertInfo, now: SystemTime, fraction: f64) -> bool {
    if is_expired(info, now) {
        return true;
    }
    let Ok(lifetime) = info.not_after.duration_since(info.not_before) else {
        return true;
    };
    let fraction = if fraction.is_nan() {
        0.0
    } else {
        fraction.clamp(0.0, 1.0)
    };
    let threshold = info
        .not_before
        .checked_add(lifetime.mul_f64(fraction))
        .unwrap_or(info.not_after);
    now >= threshold
}

/// Time left until `not_after` (zero when expired).
pub fn remaining(info: &CertInfo, now: SystemTime) -> Duration {
    info.not_after.duration_since(now).unwrap_or(Duration::ZERO)
}

pub(crate) fn parse_x509<'a>(der: &'a CertificateDer<'_>) -> Result<X509Certificate<'a>> {
    let (rest, cert) =
        x509_parser::parse_x509_certificate(der.as_ref()).map_err(|e| Error::InvalidCertificate(e.to_string()))?;
    if !rest.is_empty() {
        return Err(Error::InvalidCertificate(
            "trailing bytes after certificate".to_string(),
        ));
    }
    Ok(cert)
}

pub(crate) fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(not_before: SystemTime, lifetime_secs: u64) -> CertInfo {
        CertInfo {
            subject_cn: None,
            dns_names: vec![],
            ip_addrs: vec![],
            not_before,
            not_after: not_before + Duration::from_secs(lifetime_secs),
            is_ca: false,
            serial_hex: String::new(),
        }
    }

    #[test]
    fn renewal_table() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let c = info(t0, 300); // two thirds = 200 s
        let two_thirds = 2.0 / 3.0;
        let s = Duration::from_secs;
        // (offset from not_before, fraction, renew?, expired?)
        let table: &[(Duration, f64, bool, bool)] = &[
            (s(0), two_thirds, false, false),
            (s(199), two_thirds, false, false),
            (s(200), two_thirds, true, false),
            (s(299), two_thirds, true, false),
            (s(300), two_thirds, true, false),
            (s(301), two_thirds, true, true),
            (s(10), 0.0, true, false),
            (s(299), 1.0, false, false),
            (s(301), 1.0, true, true),
            (s(10), f64::NAN, true, false),
            (s(10), -5.0, true, false),
            (s(299), 7.0, false, false),
        ];
        for &(off, fraction, renew, expired) in table {
            let now = t0 + off;
            assert_eq!(needs_renewal(&c, now, fraction), renew, "{off:?} {fraction}");
            assert_eq!(is_expired(&c, now), expired, "{off:?}");
        }
        assert_eq!(remaining(&c, t0 + s(100)), s(200));
        assert_eq!(remaining(&c, t0 + s(1000)), Duration::ZERO);
    }

    #[test]
    fn garbage_inputs_are_errors() {
        let garbage_cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let bad_base64 = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        let unterminated = "-----BEGIN CERTIFICATE-----\nAAAA\n";
        let table: &[(&str, &str)] = &[
            ("", "EmptyPem"),
            ("hello world", "EmptyPem"),
            ("\u{0}\u{1}\u{ff}", "EmptyPem"),
            (garbage_cert, "InvalidCertificate"),
            (bad_base64, "InvalidPem"),
            (unterminated, "InvalidPem"),
        ];
        for (input, reason) in table {
            assert_eq!(parse_pem_chain(input).unwrap_err().reason(), *reason, "{input:?}");
            assert_eq!(parse_cert_pem(input).unwrap_err().reason(), *reason, "{input:?}");
        }
        for input in ["", "nope", garbage_cert] {
            assert_eq!(parse_private_key_pem(input).unwrap_err().reason(), "EmptyPem");
        }
        let bad_key = "-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n";
        assert_eq!(parse_private_key_pem(bad_key).unwrap_err().reason(), "InvalidPem");
        let junk_key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert_eq!(
            parse_private_key_pem(junk_key).unwrap_err().reason(),
            "InvalidPrivateKey"
        );
    }
}
