//! The runtime certificate signer (`vm.smolvm.dev/runtime-serving`).
//!
//! Each runtime agent generates its serving key on its node and files a
//! CertificateSigningRequest. [`judge`] approves it only when the requester is the runtime
//! ServiceAccount, its pod-bound token names the node the CSR asks for, and the CSR asks only for
//! that node's serving name and the serving usages. Anything else is denied with a reason.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use smolvm_api::{
    constants::{EXTRA_NODE_NAME, RUNTIME_SIGNER},
    policy::Policy,
};

/// Usages a runtime serving certificate may carry.
pub const ALLOWED_USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];

/// The signer's verdict on a CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// Not addressed to this signer, or already decided: leave it alone.
    Ignore,
    /// Approve and sign for this node.
    Approve {
        /// The node the certificate is for.
        node: String,
    },
    /// Deny.
    Deny {
        /// Stable reason (condition reason).
        reason: &'static str,
        /// What is wrong, for the requester.
        message: String,
    },
}

fn deny(reason: &'static str, message: String) -> Judgement {
    Judgement::Deny { reason, message }
}

/// Judges a CSR. Pure: no clock, no I/O.
pub fn judge(csr: &CertificateSigningRequest, policy: &Policy) -> Judgement {
    let spec = &csr.spec;
    if spec.signer_name != RUNTIME_SIGNER {
        return Judgement::Ignore;
    }
    let decided = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed") && c.status == "True")
        });
    if decided {
        return Judgement::Ignore;
    }
    let username = spec.username.as_deref().unwrap_or("");
    if !policy.runtime_usernames.iter().any(|u| u == username) {
        return deny(
            "RequesterNotRuntime",
            format!("{username:?} is not the runtime ServiceAccount"),
        );
    }
    let node = match spec
        .extra
        .as_ref()
        .and_then(|e| e.get(EXTRA_NODE_NAME))
        .map(Vec::as_slice)
    {
        Some([node]) => node.clone(),
        _ => {
            return deny(
                "NoNodeClaim",
                format!(
                    "the requester's token carries no single {EXTRA_NODE_NAME}; use a pod-bound ServiceAccount token"
                ),
            );
        }
    };
    let usages: BTreeSet<&str> = spec.usages.iter().flatten().map(String::as_str).collect();
    if let Some(bad) = usages.iter().find(|u| !ALLOWED_USAGES.contains(u)) {
        return deny(
            "UsageNotAllowed",
            format!("usage {bad:?} is not allowed; allowed: {ALLOWED_USAGES:?}"),
        );
    }
    if !usages.contains("server auth") {
        return deny("UsageNotAllowed", "the certificate must be for \"server auth\"".into());
    }
    let info = match smolvm_certs::parse_csr(&spec.request.0) {
        Ok(info) => info,
        Err(e) => return deny("InvalidRequest", format!("the request does not parse: {e}")),
    };
    if let Err(e) = smolvm_certs::validate_runtime_serving_csr(&info, &node) {
        return deny(
            "NamesNotAllowed",
            format!(
                "the request must name only {:?} for node {node}: {e}",
                smolvm_certs::runtime_serving_sans(&node)
            ),
        );
    }
    Judgement::Approve { node }
}

#[cfg(test)]
mod tests {

    use k8s_openapi::{
        ByteString,
        api::certificates::v1::{CertificateSigningRequestSpec, CertificateSigningRequestStatus},
    };

    use super::*;

    fn csr(username: &str, node_claim: Option<&str>, sans: &[String], usages: &[&str]) -> CertificateSigningRequest {
        let key = smolvm_certs::generate_key_pair().unwrap();
        let cn = sans.first().cloned().unwrap_or_default();
        let pem = smolvm_certs::build_csr(&key, &cn, sans).unwrap();
        CertificateSigningRequest {
            spec: CertificateSigningRequestSpec {
                signer_name: RUNTIME_SIGNER.into(),
                request: ByteString(pem.into_bytes()),
                username: Some(username.into()),
                extra: node_claim.map(|n| BTreeMap::from([(EXTRA_NODE_NAME.to_string(), vec![n.to_string()])])),
                usages: Some(usages.iter().map(|u| u.to_string()).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    const RUNTIME: &str = "system:serviceaccount:smolvm-system:smolvm-runtime";

    #[test]
    fn csr_judgements() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let policy = Policy::default();
        let own = smolvm_certs::runtime_serving_sans("node-a");
        let other = smolvm_certs::runtime_serving_sans("node-b");
        let serving = ["digital signature", "key encipherment", "server auth"];
        let reason = |j: Judgement| match j {
            Judgement::Deny { reason, .. } => reason,
            Judgement::Approve { .. } => "Approve",
            Judgement::Ignore => "Ignore",
        };
        let cases = [
            (
                "csr_approved_for_own_node",
                csr(RUNTIME, Some("node-a"), &own, &serving),
                "Approve",
            ),
            (
                "csr_denied_other_requester",
                csr("alice", Some("node-a"), &own, &serving),
                "RequesterNotRuntime",
            ),
            (
                "csr_denied_without_node_claim",
                csr(RUNTIME, None, &own, &serving),
                "NoNodeClaim",
            ),
            (
                "csr_denied_for_other_node",
                csr(RUNTIME, Some("node-a"), &other, &serving),
                "NamesNotAllowed",
            ),
            (
                "csr_denied_extra_san",
                csr(
                    RUNTIME,
                    Some("node-a"),
                    &[own[0].clone(), "evil.example.com".into()],
                    &serving,
                ),
                "NamesNotAllowed",
            ),
            (
                "csr_denied_client_auth",
                csr(RUNTIME, Some("node-a"), &own, &["client auth", "server auth"]),
                "UsageNotAllowed",
            ),
            (
                "csr_denied_without_server_auth",
                csr(RUNTIME, Some("node-a"), &own, &["digital signature"]),
                "UsageNotAllowed",
            ),
        ];
        for (name, csr, expected) in cases {
            assert_eq!(reason(judge(&csr, &policy)), expected, "{name}");
        }
        let mut garbage = csr(RUNTIME, Some("node-a"), &own, &serving);
        garbage.spec.request = ByteString(b"not a csr".to_vec());
        assert_eq!(reason(judge(&garbage, &policy)), "InvalidRequest");
        let mut foreign = csr(RUNTIME, Some("node-a"), &own, &serving);
        foreign.spec.signer_name = "kubernetes.io/kubelet-serving".into();
        assert_eq!(judge(&foreign, &policy), Judgement::Ignore);
        let mut decided = csr(RUNTIME, Some("node-a"), &own, &serving);
        decided.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![
                k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition {
                    type_: "Approved".into(),
                    status: "True".into(),
                    ..Default::default()
                },
            ]),
            certificate: None,
        });
        assert_eq!(judge(&decided, &policy), Judgement::Ignore);
    }
}

/// Name of the Secret holding the runtime CA (certificate and key); only the controller reads it.
pub const CA_SECRET: &str = "smolvm-runtime-ca";
/// Name of the ConfigMap publishing the runtime CA certificate (`ca.crt`) to the runtime agents.
pub const CA_CONFIGMAP: &str = "smolvm-runtime-ca";
/// Lifetime of the runtime CA.
pub const CA_LIFETIME: std::time::Duration = std::time::Duration::from_secs(10 * 365 * 24 * 3600);
/// Lifetime of the runtime serving certificates and of the controller's client certificate.
pub const LEAF_LIFETIME: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// Errors of the signer's I/O.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    /// The API server failed a call.
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    /// Certificate work failed.
    #[error("certificates: {0}")]
    Certs(#[from] smolvm_certs::Error),
    /// The stored CA Secret is incomplete.
    #[error("Secret {0} lacks {1}")]
    Incomplete(&'static str, &'static str),
    /// The node API token Secret is unusable.
    #[error("node API token: {0}")]
    BadToken(String),
    /// The OS random source failed.
    #[error("random source: {0}")]
    Random(String),
}

impl SignerError {
    /// Stable reason string.
    pub fn reason(&self) -> &'static str {
        match self {
            SignerError::Kube(_) => "KubeError",
            SignerError::Certs(e) => e.reason(),
            SignerError::Incomplete(..) => "CASecretIncomplete",
            SignerError::BadToken(_) => "TokenSecretInvalid",
            SignerError::Random(_) => "RandomSourceFailed",
        }
    }
}

fn secret_text(secret: &k8s_openapi::api::core::v1::Secret, key: &'static str) -> Result<String, SignerError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .ok_or(SignerError::Incomplete(CA_SECRET, key))
}

/// Loads the runtime CA from its Secret, creating it once if absent. When two replicas race, the
/// one whose create loses (409) loads the winner's, so every replica converges on one CA. Then
/// publishes the CA certificate in the ConfigMap the runtimes read.
pub async fn ensure_runtime_ca(
    client: kube::Client,
    namespace: &str,
) -> Result<smolvm_certs::CertificateAuthority, SignerError> {
    use k8s_openapi::{
        ByteString,
        api::core::v1::{ConfigMap, Secret},
    };
    use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = match secrets.get_opt(CA_SECRET).await? {
        Some(s) => s,
        None => {
            let ca = smolvm_certs::CertificateAuthority::generate("smolvm-runtime-ca", CA_LIFETIME)?;
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(CA_SECRET.into()),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/tls".into()),
                data: Some(BTreeMap::from([
                    ("tls.crt".to_string(), ByteString(ca.cert_pem().as_bytes().to_vec())),
                    ("tls.key".to_string(), ByteString(ca.key_pem().as_bytes().to_vec())),
                ])),
                ..Default::default()
            };
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(created) => created,
                Err(kube::Error::Api(s)) if s.code == 409 => secrets.get(CA_SECRET).await?,
                Err(e) => return Err(e.into()),
            }
        }
    };
    let ca = smolvm_certs::CertificateAuthority::from_pem(
        &secret_text(&secret, "tls.crt")?,
        &secret_text(&secret, "tls.key")?,
    )?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client, namespace);
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CA_CONFIGMAP},
        "data": {"ca.crt": ca.cert_pem()}
    });
    configmaps
        .patch(
            CA_CONFIGMAP,
            &PatchParams::apply(smolvm_api::constants::FIELD_MANAGER_CONTROLLER).force(),
            &Patch::Apply(&cm),
        )
        .await?;
    Ok(ca)
}

/// Acts on one CSR: approves and signs, or denies, as [`judge`] decides.
pub async fn handle_csr(
    api: &kube::Api<CertificateSigningRequest>,
    csr: &CertificateSigningRequest,
    ca: &smolvm_certs::CertificateAuthority,
    policy: &Policy,
) -> Result<Judgement, SignerError> {
    use kube::api::{Patch, PatchParams};
    let judgement = judge(csr, policy);
    let name = csr.metadata.name.clone().unwrap_or_default();
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let condition = |type_: &str, reason: &str, message: &str| {
        serde_json::json!({"status": {"conditions": [{
            "type": type_, "status": "True", "reason": reason, "message": message,
            "lastUpdateTime": now, "lastTransitionTime": now
        }]}})
    };
    match &judgement {
        Judgement::Ignore => {}
        Judgement::Deny { reason, message } => {
            let patch = condition("Denied", reason, message);
            api.patch_subresource("approval", &name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            tracing::warn!(csr = %name, reason, message = %message, "denied runtime CSR");
        }
        Judgement::Approve { node } => {
            let message = format!("runtime serving certificate for node {node}, requested by its own agent");
            let patch = condition("Approved", "RuntimeNodeVerified", &message);
            api.patch_subresource("approval", &name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let cert = ca.sign_csr(&csr.spec.request.0, LEAF_LIFETIME, smolvm_certs::LeafUsage::Server)?;
            let patch = serde_json::json!({"status": {"certificate": k8s_openapi::ByteString(cert.into_bytes())}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            tracing::info!(csr = %name, node = %node, "signed runtime serving certificate");
        }
    }
    Ok(judgement)
}
