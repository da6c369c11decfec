//! The runtime certificate signer (`vm.smolvm.dev/runtime-serving`).
//!
//! Each runtime agent generates its serving key on its node and files a
//! CertificateSigningRequest. [`judge`] approves it only when the requester is the runtime
//! ServiceAccount, its pod-bound token names the node the CSR asks for, and the CSR asks only for
//! that node's serving name and the serving usages. Anything else is denied with a reason.
//!
//! The token must carry both the node name and the node UID
//! (`authentication.kubernetes.io/node-uid`, a well-formed UUID); when the caller knows the UID of
//! the named node ([`judge_with_node_uid`]), the two must agree.
//!
//! A CSR that is Approved but carries no certificate (signing failed after the approval) is still
//! to sign: it is judged again by the same checks and signed, or marked Failed.

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
fn has_condition(csr: &CertificateSigningRequest, type_: &str) -> bool {
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
fn settled(csr: &CertificateSigningRequest) -> bool {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        ByteString,
        api::certificates::v1::{
            CertificateSigningRequestCondition, CertificateSigningRequestSpec, CertificateSigningRequestStatus,
        },
    };

    use super::*;

    const NODE_A_UID: &str = "6a1f1e0c-3b8e-4a53-9a35-0d6f2f3c9b11";
    const OTHER_UID: &str = "0b7c5d2e-91aa-4c1e-8f00-5e4f3a2b1c0d";

    /// A CSR from `username`, whose token names `node_claim` with `uid_claim` (each an extra key
    /// only when given), asking for `sans` and `usages`.
    fn csr_with(
        username: &str,
        node_claim: Option<&str>,
        uid_claim: Option<&[&str]>,
        sans: &[String],
        usages: &[&str],
    ) -> CertificateSigningRequest {
        let key = smolvm_certs::generate_key_pair().unwrap();
        let cn = sans.first().cloned().unwrap_or_default();
        let pem = smolvm_certs::build_csr(&key, &cn, sans).unwrap();
        let mut extra = BTreeMap::new();
        if let Some(n) = node_claim {
            extra.insert(EXTRA_NODE_NAME.to_string(), vec![n.to_string()]);
        }
        if let Some(uids) = uid_claim {
            extra.insert(EXTRA_NODE_UID.to_string(), uids.iter().map(|u| u.to_string()).collect());
        }
        CertificateSigningRequest {
            metadata: kube::api::ObjectMeta {
                name: Some("runtime-node-a".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                signer_name: RUNTIME_SIGNER.into(),
                request: ByteString(pem.into_bytes()),
                username: Some(username.into()),
                extra: (!extra.is_empty()).then_some(extra),
                usages: Some(usages.iter().map(|u| u.to_string()).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// A CSR whose token names `node_claim` with node-a's UID.
    fn csr(username: &str, node_claim: Option<&str>, sans: &[String], usages: &[&str]) -> CertificateSigningRequest {
        csr_with(
            username,
            node_claim,
            node_claim.map(|_| &[NODE_A_UID][..]),
            sans,
            usages,
        )
    }

    /// `csr` with these True conditions and certificate.
    fn with_status(
        mut csr: CertificateSigningRequest,
        conditions: &[&str],
        certificate: Option<&str>,
    ) -> CertificateSigningRequest {
        csr.status = Some(CertificateSigningRequestStatus {
            conditions: Some(
                conditions
                    .iter()
                    .map(|t| CertificateSigningRequestCondition {
                        type_: t.to_string(),
                        status: "True".into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            certificate: certificate.map(|c| ByteString(c.as_bytes().to_vec())),
        });
        csr
    }

    const RUNTIME: &str = "system:serviceaccount:smolvm-system:smolvm-runtime";
    const SERVING: [&str; 3] = ["digital signature", "key encipherment", "server auth"];

    fn reason(j: Judgement) -> &'static str {
        match j {
            Judgement::Deny { reason, .. } => reason,
            Judgement::Approve { .. } => "Approve",
            Judgement::Ignore => "Ignore",
        }
    }

    #[test]
    fn csr_judgements() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let policy = Policy::default();
        let own = smolvm_certs::runtime_serving_sans("node-a");
        let other = smolvm_certs::runtime_serving_sans("node-b");
        let serving = SERVING;
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
    }

    #[test]
    fn csr_node_uid_judgements() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let policy = Policy::default();
        let own = smolvm_certs::runtime_serving_sans("node-a");
        let uid = |uids: &[&str]| csr_with(RUNTIME, Some("node-a"), Some(uids), &own, &SERVING);
        let known = |node: &str| (node == "node-a").then(|| NODE_A_UID.to_string());
        let unknown = |_: &str| None;
        let upper = NODE_A_UID.to_ascii_uppercase();
        // (name, CSR, the node UIDs the judge knows, expected)
        type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;
        let cases: [(&str, CertificateSigningRequest, Lookup, &str); 10] = [
            ("matching UID", uid(&[NODE_A_UID]), &known, "Approve"),
            (
                "UID not known to the judge: form only",
                uid(&[NODE_A_UID]),
                &unknown,
                "Approve",
            ),
            ("another node's UID", uid(&[OTHER_UID]), &known, "NodeUIDMismatch"),
            (
                "another UID, not known to the judge",
                uid(&[OTHER_UID]),
                &unknown,
                "Approve",
            ),
            (
                "no node-uid claim",
                csr_with(RUNTIME, Some("node-a"), None, &own, &SERVING),
                &known,
                "NoNodeClaim",
            ),
            ("empty node-uid claim", uid(&[]), &known, "NoNodeClaim"),
            (
                "two node-uid claims",
                uid(&[NODE_A_UID, OTHER_UID]),
                &known,
                "NoNodeClaim",
            ),
            ("malformed node-uid", uid(&["uid-node-a"]), &unknown, "NodeUIDInvalid"),
            ("empty node-uid", uid(&[""]), &unknown, "NodeUIDInvalid"),
            (
                "UUID with a stray group",
                uid(&["6a1f1e0c-3b8e-4a53-9a35-0d6f2f3c9b11-00"]),
                &unknown,
                "NodeUIDInvalid",
            ),
        ];
        for (name, csr, lookup, expected) in cases {
            assert_eq!(reason(judge_with_node_uid(&csr, &policy, lookup)), expected, "{name}");
        }
        assert_eq!(
            reason(judge_with_node_uid(&uid(&[upper.as_str()]), &policy, known)),
            "Approve",
            "UUIDs compare case-insensitively"
        );
        match judge_with_node_uid(&uid(&[OTHER_UID]), &policy, known) {
            Judgement::Deny { message, .. } => {
                assert!(message.contains(OTHER_UID) && message.contains(NODE_A_UID), "{message}");
            }
            j => panic!("expected a denial, got {j:?}"),
        }
    }

    #[test]
    fn csr_status_judgements() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let policy = Policy::default();
        let own = smolvm_certs::runtime_serving_sans("node-a");
        let other = smolvm_certs::runtime_serving_sans("node-b");
        let good = || csr(RUNTIME, Some("node-a"), &own, &SERVING);
        let cases = [
            ("pending", with_status(good(), &[], None), "Approve"),
            (
                "approved, never signed: sign it",
                with_status(good(), &["Approved"], None),
                "Approve",
            ),
            (
                "approved, empty certificate: sign it",
                with_status(good(), &["Approved"], Some("")),
                "Approve",
            ),
            (
                "approved and signed",
                with_status(good(), &["Approved"], Some("-----BEGIN CERTIFICATE-----")),
                "Ignore",
            ),
            ("denied", with_status(good(), &["Denied"], None), "Ignore"),
            (
                "approved, then failed",
                with_status(good(), &["Approved", "Failed"], None),
                "Ignore",
            ),
            (
                "approved but unsigned: the checks still apply (requester)",
                with_status(csr("alice", Some("node-a"), &own, &SERVING), &["Approved"], None),
                "RequesterNotRuntime",
            ),
            (
                "approved but unsigned: the checks still apply (names)",
                with_status(csr(RUNTIME, Some("node-a"), &other, &SERVING), &["Approved"], None),
                "NamesNotAllowed",
            ),
        ];
        for (name, csr, expected) in cases {
            assert_eq!(reason(judge(&csr, &policy)), expected, "{name}");
        }
    }

    /// The API server as a tower-test double: serves the expected calls in order (method, path,
    /// answer status, check of the JSON body), answering 2xx with `object`, and fails on any other
    /// call. Returns how many calls it served once the client is gone.
    mod api {
        use std::time::Duration;

        use http::{Method, Request, Response};
        use kube::{Api, Client, client::Body};
        use serde_json::Value;
        use tower_test::mock;

        use super::*;

        pub const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests/runtime-node-a";

        pub type Check = Box<dyn Fn(&Value) + Send>;

        pub fn call(
            method: Method,
            subresource: &str,
            status: u16,
            check: impl Fn(&Value) + Send + 'static,
        ) -> (Method, String, u16, Check) {
            (method, format!("{CSR_PATH}/{subresource}"), status, Box::new(check))
        }

        pub async fn handle(
            object: CertificateSigningRequest,
            node_uid: impl Fn(&str) -> Option<String>,
            calls: Vec<(Method, String, u16, Check)>,
        ) -> Judgement {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
            let reply = serde_json::to_vec(&object).unwrap();
            let expected = calls.len();
            let server = tokio::spawn(async move {
                let mut served = 0;
                let mut calls = calls.into_iter();
                loop {
                    let next = tokio::time::timeout(Duration::from_secs(5), handle.next_request()).await;
                    let Ok(Some((request, send))) = next else { break };
                    let Some((method, path, status, check)) = calls.next() else {
                        panic!("unexpected call {} {}", request.method(), request.uri())
                    };
                    assert_eq!(request.method(), method, "method of call {served}");
                    assert_eq!(request.uri().path(), path, "path of call {served}");
                    let bytes = http_body_util::BodyExt::collect(request.into_body())
                        .await
                        .unwrap()
                        .to_bytes();
                    check(&serde_json::from_slice(&bytes).unwrap_or(Value::Null));
                    let body = if status < 300 {
                        reply.clone()
                    } else {
                        serde_json::to_vec(&serde_json::json!({
                            "kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "Conflict", "code": status, "message": "the object has been modified"
                        }))
                        .unwrap()
                    };
                    send.send_response(Response::builder().status(status).body(Body::from(body)).unwrap());
                    served += 1;
                }
                served
            });
            let judgement = {
                let api: Api<CertificateSigningRequest> = Api::all(Client::new(service, "default"));
                let ca = smolvm_certs::CertificateAuthority::generate("ca", Duration::from_secs(3600)).unwrap();
                handle_csr_with_node_uid(&api, &object, &ca, &Policy::default(), node_uid)
                    .await
                    .unwrap()
            };
            assert_eq!(server.await.unwrap(), expected, "calls served");
            judgement
        }
    }

    use http::Method;

    #[tokio::test]
    async fn csr_approved_but_unsigned_is_signed_on_retry() {
        let own = smolvm_certs::runtime_serving_sans("node-a");
        let object = with_status(csr(RUNTIME, Some("node-a"), &own, &SERVING), &["Approved"], None);
        // No second approval: straight to the certificate, on the version judged.
        let judgement = api::handle(
            object,
            |_| None,
            vec![api::call(Method::PATCH, "status", 200, |body| {
                assert_eq!(body["metadata"]["resourceVersion"], "42", "precondition");
                assert!(!body["status"]["certificate"].as_str().unwrap_or("").is_empty());
                assert!(body["status"].get("conditions").is_none());
            })],
        )
        .await;
        assert_eq!(judgement, Judgement::Approve { node: "node-a".into() });
    }

    #[tokio::test]
    async fn csr_approved_but_unsigned_that_fails_the_checks_is_marked_failed() {
        let other = smolvm_certs::runtime_serving_sans("node-b");
        let object = with_status(csr(RUNTIME, Some("node-a"), &other, &SERVING), &["Approved"], None);
        let judgement = api::handle(
            object,
            |_| None,
            vec![api::call(Method::PATCH, "status", 200, |body| {
                assert_eq!(body["metadata"]["resourceVersion"], "42", "precondition");
                assert_eq!(body["status"]["conditions"][0]["type"], "Failed");
                assert_eq!(body["status"]["conditions"][0]["reason"], "NamesNotAllowed");
                assert!(body["status"].get("certificate").is_none(), "never signed");
            })],
        )
        .await;
        assert_eq!(reason(judgement), "NamesNotAllowed");
    }

    #[tokio::test]
    async fn csr_retry_on_a_stale_event_signs_nothing_twice() {
        let own = smolvm_certs::runtime_serving_sans("node-a");
        let object = with_status(csr(RUNTIME, Some("node-a"), &own, &SERVING), &["Approved"], None);
        // The certificate was written since this event's version: the server answers 409.
        let judgement = api::handle(object, |_| None, vec![api::call(Method::PATCH, "status", 409, |_| {})]).await;
        assert_eq!(judgement, Judgement::Ignore);
    }

    #[tokio::test]
    async fn csr_approved_and_signed_when_the_node_uid_matches() {
        let own = smolvm_certs::runtime_serving_sans("node-a");
        let judgement = api::handle(
            csr(RUNTIME, Some("node-a"), &own, &SERVING),
            |n| (n == "node-a").then(|| NODE_A_UID.to_string()),
            vec![
                api::call(Method::PATCH, "approval", 200, |body| {
                    assert_eq!(body["status"]["conditions"][0]["type"], "Approved");
                }),
                api::call(Method::PATCH, "status", 200, |body| {
                    assert!(!body["status"]["certificate"].as_str().unwrap_or("").is_empty());
                }),
            ],
        )
        .await;
        assert_eq!(judgement, Judgement::Approve { node: "node-a".into() });
    }

    #[tokio::test]
    async fn csr_denied_when_the_token_names_another_node_uid() {
        let own = smolvm_certs::runtime_serving_sans("node-a");
        let judgement = api::handle(
            csr_with(RUNTIME, Some("node-a"), Some(&[OTHER_UID]), &own, &SERVING),
            |n| (n == "node-a").then(|| NODE_A_UID.to_string()),
            vec![api::call(Method::PATCH, "approval", 200, |body| {
                let condition = &body["status"]["conditions"][0];
                assert_eq!(condition["type"], "Denied");
                assert_eq!(condition["reason"], "NodeUIDMismatch");
                let message = condition["message"].as_str().unwrap_or("");
                assert!(message.contains(OTHER_UID) && message.contains(NODE_A_UID), "{message}");
            })],
        )
        .await;
        assert_eq!(reason(judgement), "NodeUIDMismatch");
    }
}

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
    /// The runtime CA Secret is gone while nodes exist: a new CA would cut every node off.
    #[error(
        "the runtime CA Secret {secret} is missing while {0} SmolVMNode(s) exist; a new CA would cut every node off until its agent reads the new CA and re-files its serving certificate. Restore the Secret from a backup (the controller retries every 30 s), or start over deliberately: run the controller once with --allow-new-runtime-ca (docs/operations.md, \"Certificate rotation\")",
        secret = crate::runtime_ca::CA_SECRET
    )]
    CaMissing(usize),
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
            SignerError::CaMissing(_) => "RuntimeCAMissing",
        }
    }
}

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
