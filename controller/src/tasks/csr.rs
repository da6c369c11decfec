//! The CSR signer loop: approves and signs (or denies) the runtime agents' serving-certificate
//! requests. The judgement is [`crate::pki::signer`]'s; this is the watch around it.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::{certificates::v1::CertificateSigningRequest, core::v1::Node};
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use smolvm_api::constants::RUNTIME_SIGNER;

use crate::{
    pki::{runtime_ca::RuntimeTrust, signer},
    tasks::policy::PolicySlot,
};

/// Watches the CSRs for the runtime signer and handles each, with the CA signing now and the
/// policy in force now.
pub async fn run(client: Client, trust: Arc<RuntimeTrust>, policy: PolicySlot) {
    let nodes: Api<Node> = Api::all(client.clone());
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.signerName={RUNTIME_SIGNER}"));
    let mut stream = watcher(api.clone(), config).default_backoff().applied_objects().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(csr) => {
                let policy = policy.read().unwrap_or_else(|e| e.into_inner()).clone();
                if let Err(e) = signer::handle_csr(&api, &nodes, &csr, &trust.signing(), &policy).await {
                    tracing::warn!(csr = %csr.name_any(), error = %e, reason = e.reason(), "CSR handling failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "CSR watch error"),
        }
    }
}
