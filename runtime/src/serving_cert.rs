//! The node API's serving certificate through a `certificates.k8s.io/v1`
//! CertificateSigningRequest (signer [`RUNTIME_SIGNER`]): the key is generated here and never
//! leaves the node; renewal at [`RENEWAL_FRACTION`] of the lifetime swaps the certificate in
//! the resolver without a restart.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use kube::api::{Api, ObjectMeta, PostParams};
use smolvm_api::constants::RUNTIME_SIGNER;
use smolvm_certs::{
    RENEWAL_FRACTION, ReloadableResolver, build_csr, generate_key_pair, needs_renewal, parse_cert_pem,
    runtime_serving_sans,
};

use crate::error::{Error, Result};

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

/// Renews the resolver's certificate once [`RENEWAL_FRACTION`] of its lifetime passed,
/// checking every `check`; swaps it in place (no restart). Runs until aborted.
pub fn spawn_renewal(
    client: kube::Client,
    node_name: String,
    resolver: Arc<ReloadableResolver>,
    check: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(check).await;
            if !needs_renewal(&resolver.current_cert_info(), SystemTime::now(), RENEWAL_FRACTION) {
                continue;
            }
            tracing::info!("serving certificate due for renewal");
            match request_serving_cert(
                client.clone(),
                &node_name,
                Duration::from_secs(2),
                Duration::from_secs(300),
            )
            .await
            .and_then(|pair| Ok(resolver.swap_pem(&pair.cert_pem, &pair.key_pem)?))
            {
                Ok(()) => tracing::info!("serving certificate renewed"),
                Err(error) => tracing::warn!(%error, reason = error.reason(), "renewal failed; will retry"),
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
}
