//! The judgement, pure: whether a CSR is this signer's, settled, to approve or to deny, and why.

use std::collections::BTreeSet;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use smolvm_api::{
    constants::{EXTRA_NODE_NAME, EXTRA_NODE_UID, RUNTIME_SIGNER},
    policy::Policy,
};

/// Usages a runtime serving certificate may carry.
pub const ALLOWED_USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];

/// The signer's verdict on a CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// Not addressed to this signer, or already settled (Denied, Failed, or issued): leave it
    /// alone.
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

/// Whether the CSR carries a condition of this type with status True.
pub(super) fn has_condition(csr: &CertificateSigningRequest, type_: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// Whether the CSR already carries a (non-empty) certificate.
fn has_certificate(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
}

/// Whether this signer is done with the CSR: Denied, Failed, or issued. An Approved CSR without
/// a certificate is not done: signing failed after the approval, and is retried.
pub(super) fn settled(csr: &CertificateSigningRequest) -> bool {
    has_condition(csr, "Denied") || has_condition(csr, "Failed") || has_certificate(csr)
}

/// Whether `uid` is a Kubernetes object UID as the API server generates them: an RFC 4122 UUID in
/// its textual form (8-4-4-4-12 hexadecimal digits).
fn is_uuid(uid: &str) -> bool {
    let groups: Vec<&str> = uid.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The single value of a `spec.extra` key, if exactly one.
fn single_extra<'a>(csr: &'a CertificateSigningRequest, key: &str) -> Option<&'a str> {
    match csr.spec.extra.as_ref().and_then(|e| e.get(key)).map(Vec::as_slice) {
        Some([one]) => Some(one.as_str()),
        _ => None,
    }
}

/// Judges a CSR. Pure: no clock, no I/O. Without knowledge of the nodes' UIDs: the token's node
/// UID must be present and well-formed, but is not compared (see [`judge_with_node_uid`]).
pub fn judge(csr: &CertificateSigningRequest, policy: &Policy) -> Judgement {
    judge_with_node_uid(csr, policy, |_| None)
}

/// What the signer knows of the Node a token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLookup {
    /// Not looked up: the token's node UID is checked for presence and form only.
    NotLooked,
    /// There is no Node of that name: the token's node is gone (or never was).
    Missing,
    /// The Node's metadata.uid.
    Uid(String),
}

impl From<Option<String>> for NodeLookup {
    fn from(uid: Option<String>) -> Self {
        uid.map_or(NodeLookup::NotLooked, NodeLookup::Uid)
    }
}

/// The node a CSR's requester token names (its single `authentication.kubernetes.io/node-name`
/// extra), which the I/O layer looks up before [`judge_with_node_uid`].
pub fn claimed_node(csr: &CertificateSigningRequest) -> Option<&str> {
    single_extra(csr, EXTRA_NODE_NAME)
}

/// Judges a CSR, also comparing the token's node UID with `node_uid(name)`, the node the token
/// names as the caller knows it (see [`NodeLookup`]; an `Option<String>` of the UID converts).
/// Pure as long as `node_uid` is.
pub fn judge_with_node_uid<L: Into<NodeLookup>>(
    csr: &CertificateSigningRequest,
    policy: &Policy,
    node_uid: impl Fn(&str) -> L,
) -> Judgement {
    let spec = &csr.spec;
    if spec.signer_name != RUNTIME_SIGNER || settled(csr) {
        return Judgement::Ignore;
    }
    let username = spec.username.as_deref().unwrap_or("");
    if !policy.runtime_usernames.iter().any(|u| u == username) {
        return deny(
            "RequesterNotRuntime",
            format!("{username:?} is not the runtime ServiceAccount"),
        );
    }
    let Some(node) = single_extra(csr, EXTRA_NODE_NAME).map(str::to_string) else {
        return deny(
            "NoNodeClaim",
            format!("the requester's token carries no single {EXTRA_NODE_NAME}; use a pod-bound ServiceAccount token"),
        );
    };
    let Some(uid) = single_extra(csr, EXTRA_NODE_UID) else {
        return deny(
            "NoNodeClaim",
            format!(
                "the requester's token names node {node} but carries no single {EXTRA_NODE_UID}; use a pod-bound ServiceAccount token"
            ),
        );
    };
    if !is_uuid(uid) {
        return deny(
            "NodeUIDInvalid",
            format!("the requester's {EXTRA_NODE_UID} {uid:?} is not a UUID"),
        );
    }
    match node_uid(&node).into() {
        NodeLookup::NotLooked => {}
        NodeLookup::Missing => {
            return deny(
                "NodeUIDMismatch",
                format!("the requester's token names node {node} with UID {uid}, but there is no Node {node}"),
            );
        }
        NodeLookup::Uid(known) if !known.eq_ignore_ascii_case(uid) => {
            return deny(
                "NodeUIDMismatch",
                format!("the requester's token names node {node} with UID {uid}, but node {node} has UID {known}"),
            );
        }
        NodeLookup::Uid(_) => {}
    }
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
