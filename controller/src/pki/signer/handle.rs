//! Acting on a CSR through the API server: look up the node the token names, approve and sign,
//! or deny, as [`judge_with_node_uid`] decides.

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use smolvm_api::{constants::RUNTIME_SIGNER, policy::Policy};

use super::judge::*;
use crate::pki::{SignerError, runtime_ca::LEAF_LIFETIME};

/// Acts on one CSR: approves and signs, or denies, as [`judge_with_node_uid`] decides, with the
/// Node the requester's token names looked up through `nodes` (its UID must match the token's).
/// An Approved CSR without a certificate (signing failed after the approval) is judged again and
/// signed, or marked Failed if it no longer passes. A failed lookup is an error (retried), never a
/// verdict.
pub async fn handle_csr(
    api: &kube::Api<CertificateSigningRequest>,
    nodes: &kube::Api<k8s_openapi::api::core::v1::Node>,
    csr: &CertificateSigningRequest,
    ca: &smolvm_certs::CertificateAuthority,
    policy: &Policy,
) -> Result<Judgement, SignerError> {
    let lookup = match claimed_node(csr) {
        // Only CSRs this signer would judge cost a lookup.
        Some(node) if csr.spec.signer_name == RUNTIME_SIGNER && !settled(csr) => match nodes.get_opt(node).await? {
            Some(n) => n.metadata.uid.map_or(NodeLookup::Missing, NodeLookup::Uid),
            None => NodeLookup::Missing,
        },
        _ => NodeLookup::NotLooked,
    };
    handle_csr_with_node_uid(api, csr, ca, policy, |_| lookup.clone()).await
}

/// [`handle_csr`] with the UIDs of the nodes as the caller knows them (see
/// [`judge_with_node_uid`]).
///
/// For a CSR already Approved (the retry of a failed signing), the writes carry the CSR's
/// resourceVersion as a precondition: if the CSR changed since (most often: the certificate was
/// written meanwhile and this is a stale event), the API server answers 409, nothing is signed
/// twice, and the result is [`Judgement::Ignore`]; the newer version arrives as its own event.
pub async fn handle_csr_with_node_uid<L: Into<NodeLookup>>(
    api: &kube::Api<CertificateSigningRequest>,
    csr: &CertificateSigningRequest,
    ca: &smolvm_certs::CertificateAuthority,
    policy: &Policy,
    node_uid: impl Fn(&str) -> L,
) -> Result<Judgement, SignerError> {
    use kube::api::{Patch, PatchParams};
    let judgement = judge_with_node_uid(csr, policy, node_uid);
    // Only an unsettled CSR gets here with a verdict, so Approved means: approved, not signed.
    let approved = has_condition(csr, "Approved");
    let name = csr.metadata.name.clone().unwrap_or_default();
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let condition = |type_: &str, reason: &str, message: &str| {
        serde_json::json!({"status": {"conditions": [{
            "type": type_, "status": "True", "reason": reason, "message": message,
            "lastUpdateTime": now, "lastTransitionTime": now
        }]}})
    };
    // The retry's precondition: the version this verdict was made on.
    let precondition = |mut patch: serde_json::Value| {
        if let Some(rv) = &csr.metadata.resource_version {
            patch["metadata"] = serde_json::json!({"resourceVersion": rv});
        }
        patch
    };
    let stale = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 409);
    match &judgement {
        Judgement::Ignore => {}
        Judgement::Deny { reason, message } if approved => {
            // Approved by someone, but it does not pass: never sign it. Approved and Denied are
            // exclusive, so the signer's verdict is the Failed condition (status subresource).
            let patch = precondition(condition("Failed", reason, message));
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Err(e) if stale(&e) => {
                    tracing::debug!(csr = %name, "CSR changed since this event; acting on the newer one");
                    return Ok(Judgement::Ignore);
                }
                result => {
                    result?;
                }
            }
            tracing::warn!(csr = %name, reason, message = %message, "approved runtime CSR fails the checks; marked Failed, not signed");
        }
        Judgement::Deny { reason, message } => {
            let patch = condition("Denied", reason, message);
            api.patch_subresource("approval", &name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            tracing::warn!(csr = %name, reason, message = %message, "denied runtime CSR");
        }
        Judgement::Approve { node } => {
            if approved {
                tracing::info!(csr = %name, node = %node, "approved runtime CSR has no certificate yet; signing it");
            } else {
                let message = format!("runtime serving certificate for node {node}, requested by its own agent");
                let patch = condition("Approved", "RuntimeNodeVerified", &message);
                api.patch_subresource("approval", &name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            let cert = ca.sign_csr(&csr.spec.request.0, LEAF_LIFETIME, smolvm_certs::LeafUsage::Server)?;
            let patch = serde_json::json!({"status": {"certificate": k8s_openapi::ByteString(cert.into_bytes())}});
            let patch = if approved { precondition(patch) } else { patch };
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Err(e) if approved && stale(&e) => {
                    tracing::debug!(csr = %name, "CSR changed since this event; acting on the newer one");
                    return Ok(Judgement::Ignore);
                }
                result => {
                    result?;
                }
            }
            tracing::info!(csr = %name, node = %node, "signed runtime serving certificate");
        }
    }
    Ok(judgement)
}
