//! The node API's serving certificate through a `certificates.k8s.io/v1`
//! CertificateSigningRequest (signer [`RUNTIME_SIGNER`]): the key is generated here and never
//! leaves the node; renewal at [`RENEWAL_FRACTION`] of the lifetime swaps the certificate in
//! the resolver without a restart.
//!
//! The runtime CA can rotate: the controller then publishes a bundle with the new CA first and
//! the old one after it. As soon as the node API trusts that bundle, a certificate from any CA
//! but the first is replaced at once, and the agent reports which CA signed its certificate
//! (`status.servingCertificate`), which is how the controller knows when the old CA can go.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ObjectMeta, PostParams};
use rustls::pki_types::CertificateDer;
use smolvm_api::ServingCertificate;
use smolvm_api::constants::RUNTIME_SIGNER;
use smolvm_certs::{
    CertInfo, RENEWAL_FRACTION, ReloadableResolver, build_csr, fingerprint, generate_key_pair, issuer_in,
    needs_renewal, parse_cert_pem, parse_pem_chain, runtime_serving_sans,
};

use crate::error::{Error, Result};
use crate::nodeapi::tls::ClientCaInForce;

/// Why the serving certificate is replaced now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Two thirds of its lifetime have passed.
    Expiring,
    /// The runtime CA changed: the CA now signing (first in the trusted bundle) did not sign it.
    CaChanged,
}

/// Pure: whether (and why) to replace the serving certificate `leaf` (with `info`) at `now`,
/// given the client CA bundle in force (the runtime CA's published bundle, signing CA first). An
/// empty bundle (unreadable) leaves only the expiry rule.
pub fn renewal_due(
    leaf: &CertificateDer<'_>,
    info: &CertInfo,
    bundle: &[CertificateDer<'_>],
    now: SystemTime,
) -> Option<Renewal> {
    if needs_renewal(info, now, RENEWAL_FRACTION) {
        Some(Renewal::Expiring)
    } else if !bundle.is_empty() && issuer_in(leaf, bundle) != Some(0) {
        Some(Renewal::CaChanged)
    } else {
        None
    }
}

/// Pure: what the agent reports about its serving certificate: the fingerprint of the CA in the
/// bundle that signed it (absent when none did) and its expiry.
pub fn report(leaf: &CertificateDer<'_>, info: &CertInfo, bundle: &[CertificateDer<'_>]) -> ServingCertificate {
    let not_after = info
        .not_after
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_secs()).ok())
        .and_then(|secs| k8s_openapi::jiff::Timestamp::from_second(secs).ok())
        .map(Time);
    ServingCertificate {
        ca_fingerprint: issuer_in(leaf, bundle).and_then(|i| bundle.get(i)).map(fingerprint),
        not_after,
    }
}

/// The resolver's leaf and the bundle in force, parsed (an unparsable bundle reads as empty).
fn current(
    resolver: &ReloadableResolver,
    client_ca: &ClientCaInForce,
) -> (CertificateDer<'static>, Vec<CertificateDer<'static>>) {
    let leaf = resolver
        .current_certified_key()
        .cert
        .first()
        .cloned()
        .unwrap_or_else(|| CertificateDer::from(Vec::new()));
    (leaf, parse_pem_chain(&client_ca.pem()).unwrap_or_default())
}

/// [`report`] for the certificate being served now.
pub fn report_current(resolver: &ReloadableResolver, client_ca: &ClientCaInForce) -> ServingCertificate {
    let (leaf, bundle) = current(resolver, client_ca);
    report(&leaf, &resolver.current_cert_info(), &bundle)
}

/// Usages requested for the serving certificate.
pub const USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];

/// A CSR name for this node at this time (at most 253 characters).
pub fn csr_name(node_name: &str, unix_secs: u64) -> String {
    let node: String = node_name.chars().take(200).collect();
    format!("smolvm-runtime-{node}-{unix_secs}")
}

/// The CertificateSigningRequest object for a PEM CSR.
pub fn csr_object(name: &str, csr_pem: &str) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: RUNTIME_SIGNER.to_string(),
            usages: Some(USAGES.iter().map(|u| u.to_string()).collect()),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    }
}

/// Where a CSR stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsrOutcome {
    /// Not yet signed.
    Pending,
    /// Signed: the certificate chain, PEM.
    Issued(String),
    /// Denied or failed, with the condition's type, reason and message.
    Rejected(String),
}

/// Reads a CSR's status.
pub fn csr_outcome(csr: &CertificateSigningRequest) -> CsrOutcome {
    let Some(status) = &csr.status else {
        return CsrOutcome::Pending;
    };
    for condition in status.conditions.iter().flatten() {
        if (condition.type_ == "Denied" || condition.type_ == "Failed") && condition.status == "True" {
            return CsrOutcome::Rejected(format!(
                "{}: {} {}",
                condition.type_,
                condition.reason.as_deref().unwrap_or(""),
                condition.message.as_deref().unwrap_or("")
            ));
        }
    }
    match &status.certificate {
        Some(cert) if !cert.0.is_empty() => match String::from_utf8(cert.0.clone()) {
            Ok(pem) => CsrOutcome::Issued(pem),
            Err(_) => CsrOutcome::Rejected("status.certificate is not PEM text".into()),
        },
        _ => CsrOutcome::Pending,
    }
}

/// A fresh key and the certificate issued for it.
#[derive(Debug, Clone)]
pub struct ServingPair {
    /// Certificate chain, PEM.
    pub cert_pem: String,
    /// Private key, PKCS#8 PEM (never leaves the node).
    pub key_pem: String,
}

/// Generates a key, files a CSR for `node_name`'s serving names and waits for the certificate.
pub async fn request_serving_cert(
    client: kube::Client,
    node_name: &str,
    poll: Duration,
    limit: Duration,
) -> Result<ServingPair> {
    let key_pem = generate_key_pair()?;
    // No common name: a CN is capped at 64 characters and node names run to 253; the SAN (in
    // a form that always fits) is what the signer checks and the controller verifies.
    let csr_pem = build_csr(&key_pem, "", &runtime_serving_sans(node_name))?;
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = csr_name(node_name, secs);
    api.create(&PostParams::default(), &csr_object(&name, &csr_pem)).await?;
    tracing::info!(csr = %name, signer = RUNTIME_SIGNER, "filed serving certificate request");
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let csr = api.get(&name).await?;
        match csr_outcome(&csr) {
            CsrOutcome::Issued(cert_pem) => {
                parse_cert_pem(&cert_pem)?;
                tracing::info!(csr = %name, "serving certificate issued");
                return Ok(ServingPair { cert_pem, key_pem });
            }
            CsrOutcome::Rejected(message) => return Err(Error::CsrRejected { name, message }),
            CsrOutcome::Pending => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout(format!(
                "certificate signing request {name} not signed within {}s",
                limit.as_secs()
            )));
        }
        tokio::time::sleep(poll).await;
    }
}

/// Replaces the resolver's certificate when [`renewal_due`] says so (two thirds of its life
/// passed, or the runtime CA changed), checking every `check`; swaps it in place (no restart).
/// After a failed attempt it waits `retry` before the next. Runs until aborted.
pub fn spawn_renewal(
    client: kube::Client,
    node_name: String,
    resolver: Arc<ReloadableResolver>,
    client_ca: ClientCaInForce,
    check: Duration,
    retry: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(check).await;
            let (leaf, bundle) = current(&resolver, &client_ca);
            let Some(why) = renewal_due(&leaf, &resolver.current_cert_info(), &bundle, SystemTime::now()) else {
                continue;
            };
            match why {
                Renewal::Expiring => tracing::info!("serving certificate due for renewal"),
                Renewal::CaChanged => {
                    tracing::info!("the runtime CA changed; requesting a serving certificate from the new CA")
                }
            }
            match request_serving_cert(
                client.clone(),
                &node_name,
                Duration::from_secs(1),
                Duration::from_secs(300),
            )
            .await
            .and_then(|pair| Ok(resolver.swap_pem(&pair.cert_pem, &pair.key_pem)?))
            {
                Ok(()) => tracing::info!(?why, "serving certificate replaced"),
                Err(error) => {
                    tracing::warn!(%error, reason = error.reason(), "replacing the serving certificate failed; will retry");
                    tokio::time::sleep(retry).await;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};

    fn with_status(conditions: Vec<(&str, &str)>, cert: Option<&str>) -> CertificateSigningRequest {
        let mut csr = csr_object("x", "pem");
        csr.status = Some(CertificateSigningRequestStatus {
            certificate: cert.map(|c| ByteString(c.as_bytes().to_vec())),
            conditions: Some(
                conditions
                    .into_iter()
                    .map(|(t, s)| CertificateSigningRequestCondition {
                        type_: t.into(),
                        status: s.into(),
                        reason: Some("R".into()),
                        message: Some("m".into()),
                        ..CertificateSigningRequestCondition::default()
                    })
                    .collect(),
            ),
        });
        csr
    }

    #[test]
    fn outcomes() {
        let cases = [
            (csr_object("x", "pem"), CsrOutcome::Pending),
            (with_status(vec![("Approved", "True")], None), CsrOutcome::Pending),
            (with_status(vec![("Approved", "True")], Some("")), CsrOutcome::Pending),
            (
                with_status(vec![("Approved", "True")], Some("CERT")),
                CsrOutcome::Issued("CERT".into()),
            ),
            (
                with_status(vec![("Denied", "True")], None),
                CsrOutcome::Rejected("Denied: R m".into()),
            ),
            (
                with_status(vec![("Failed", "True")], Some("CERT")),
                CsrOutcome::Rejected("Failed: R m".into()),
            ),
        ];
        for (csr, outcome) in cases {
            assert_eq!(csr_outcome(&csr), outcome);
        }
    }

    #[test]
    fn csr_object_fields() {
        let csr = csr_object("n", "PEM");
        assert_eq!(csr.spec.signer_name, "vm.smolvm.dev/runtime-serving");
        assert_eq!(
            csr.spec.usages,
            Some(vec![
                "digital signature".into(),
                "key encipherment".into(),
                "server auth".into()
            ])
        );
        assert_eq!(csr.spec.request.0, b"PEM");
        assert!(csr_name(&"n".repeat(300), 1).len() <= 253);
    }

    #[test]
    fn renewal_follows_expiry_and_the_signing_ca() {
        use smolvm_certs::{CertificateAuthority, cert_info_from_der};
        let day = Duration::from_secs(86_400);
        let old = CertificateAuthority::generate("smolvm-runtime-ca", 30 * day).expect("old CA");
        let new = CertificateAuthority::generate("smolvm-runtime-ca", 30 * day).expect("new CA");
        let leaf_of = |ca: &CertificateAuthority| {
            let issued = ca.issue_server(&["n.example".into()], &[], 3 * day).expect("leaf");
            parse_pem_chain(&issued.cert_pem).expect("parse")[0].clone()
        };
        let (from_old, from_new) = (leaf_of(&old), leaf_of(&new));
        let info = cert_info_from_der(&from_old).expect("info");
        let now = SystemTime::now();
        let late = info.not_after - Duration::from_secs(3600);
        let before = vec![old.cert_der().clone()];
        let during = vec![new.cert_der().clone(), old.cert_der().clone()];
        let after = vec![new.cert_der().clone()];
        // (name, leaf, bundle in force, now, expected)
        type Case<'a> = (
            &'a str,
            &'a CertificateDer<'a>,
            &'a [CertificateDer<'a>],
            SystemTime,
            Option<Renewal>,
        );
        let cases: [Case<'_>; 8] = [
            ("old CA only, fresh", &from_old, &before, now, None),
            (
                "rotation started: old leaf",
                &from_old,
                &during,
                now,
                Some(Renewal::CaChanged),
            ),
            ("rotation started: new leaf", &from_new, &during, now, None),
            (
                "rotation finished: old leaf",
                &from_old,
                &after,
                now,
                Some(Renewal::CaChanged),
            ),
            (
                "CA replaced by another",
                &from_new,
                &before,
                now,
                Some(Renewal::CaChanged),
            ),
            ("bundle unreadable: expiry only", &from_old, &[], now, None),
            ("expiring wins", &from_old, &during, late, Some(Renewal::Expiring)),
            ("expiring, new leaf", &from_new, &during, late, Some(Renewal::Expiring)),
        ];
        for (name, leaf, bundle, at, expected) in cases {
            let info = cert_info_from_der(leaf).expect("info");
            assert_eq!(renewal_due(leaf, &info, bundle, at), expected, "{name}");
        }
        let reported = report(&from_old, &cert_info_from_der(&from_old).expect("info"), &during);
        assert_eq!(reported.ca_fingerprint, Some(fingerprint(old.cert_der())));
        assert!(reported.not_after.is_some());
        let unknown = report(&from_old, &cert_info_from_der(&from_old).expect("info"), &after);
        assert_eq!(unknown.ca_fingerprint, None, "no CA of the bundle signed it");
    }
}
