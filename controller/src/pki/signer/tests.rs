//! The judgement table-tested, and the signing flow against an API-server double.

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestSpec, CertificateSigningRequestStatus,
    },
};

use super::judge::*;
use super::*;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use smolvm_api::{
    constants::{EXTRA_NODE_NAME, EXTRA_NODE_UID, RUNTIME_SIGNER},
    policy::Policy,
};

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

/// The signing flow against the scripted API-server double of `smolvm_testkit::apiserver`: the
/// expected calls in order (method, path, answer status, check of the JSON body), 2xx answered
/// with the CSR, anything else with a Conflict; any other call fails.
mod api {
    use std::time::Duration;

    use http::Method;
    use kube::Api;
    use serde_json::Value;
    use smolvm_testkit::apiserver::{self, Expect};

    use super::*;

    pub const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests/runtime-node-a";

    pub fn call(method: Method, subresource: &str, status: u16, check: impl Fn(&Value) + Send + 'static) -> Expect {
        Expect {
            method,
            path: format!("{CSR_PATH}/{subresource}"),
            check: Box::new(check),
            answer: (status >= 300).then(|| (status, apiserver::conflict())),
        }
    }

    pub async fn handle(
        object: CertificateSigningRequest,
        node_uid: impl Fn(&str) -> Option<String>,
        calls: Vec<Expect>,
    ) -> Judgement {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (client, handle) = apiserver::client("default");
        let expected = calls.len();
        let reply = serde_json::to_value(&object).unwrap();
        let server = tokio::spawn(apiserver::serve(handle, calls, reply, CSR_PATH));
        let judgement = {
            let api: Api<CertificateSigningRequest> = Api::all(client);
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
