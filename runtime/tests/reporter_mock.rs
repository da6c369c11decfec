//! SmolVMNode reporting against the TEST DOUBLE of the Kubernetes API server
//! (`smolvm_testkit::apiserver`: a `tower-test` mock service behind a real `kube::Client`). No API server runs here; the double answers each
//! expected call and the test asserts the exact method, path, query, content type and body.

use http::{Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::client::Body;
use serde_json::{Value, json};
use smolvm_api::types::{Endpoint, NodeResources};
use smolvm_runtime::smolvm_node::{Observation, Reporter};

use smolvm_testkit::apiserver::{self, Handle};

fn double() -> (kube::Client, Handle) {
    apiserver::client("default")
}

/// Takes the next request; asserts method, path and query; returns content type and JSON body.
async fn expect(
    handle: &mut Handle,
    method: &str,
    path_and_query: &str,
    answer: (StatusCode, Value),
) -> (Option<String>, Value) {
    let call = apiserver::next_call(handle).await;
    assert_eq!(call.method.as_str(), method, "{}", call.path_and_query);
    assert_eq!(call.path_and_query, path_and_query, "{method}");
    let (content_type, body) = (call.content_type.clone(), call.body.clone());
    call.answer(answer.0.as_u16(), &answer.1);
    (content_type, body)
}

fn node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "uid": "uid-node-a",
            "labels": {"kubernetes.io/hostname": "node-a", "zone": "z1"}},
        "status": {"addresses": [{"type": "Hostname", "address": "node-a"},
            {"type": "InternalIP", "address": "192.168.50.7"}]}})
}

fn not_found() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "smolvmnodes.vm.smolvm.dev \"node-a\" not found", "reason": "NotFound", "code": 404})
}

fn observation(uid: &str) -> Observation {
    Observation {
        node_uid: uid.to_string(),
        endpoint: Endpoint {
            address: "10.0.0.5".into(),
            port: 10443,
        },
        internal_ip: None,
        runtime_version: Some("1.32.2".into()),
        runtime_ready: true,
        runtime_message: String::new(),
        kvm_available: false,
        kvm_message: "cannot open /dev/kvm".into(),
        capacity: NodeResources {
            cpus: 8,
            memory_mib: 16384,
            storage_gib: 100,
        },
        allocatable: NodeResources {
            cpus: 7,
            memory_mib: 15360,
            storage_gib: 90,
        },
        machines: Some(vec!["svm-a".into()]),
        suspended_machines: Some(Vec::new()),
        pools: None,
        activity: Vec::new(),
        wake_requests: Vec::new(),
        serving_certificate: None,
        boot_check: None,
    }
}

fn at(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("time"))
}

const SVMN: &str = "/apis/vm.smolvm.dev/v1alpha1/smolvmnodes";

/// Takes the agent's server-side apply of node-a's status, answers it, and returns its content
/// type and body.
async fn expect_status_apply(handle: &mut Handle) -> (Option<String>, Value) {
    expect(
        handle,
        "PATCH",
        &format!("{SVMN}/node-a/status?&force=true&fieldManager=smolvm-runtime"),
        (
            StatusCode::OK,
            json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode",
            "metadata": {"name": "node-a"}, "spec": {}}),
        ),
    )
    .await
}

#[tokio::test]
async fn creates_the_smolvmnode_owned_by_the_node_then_applies_status() {
    smolvm_runtime::install_crypto_provider();
    let (client, mut handle) = double();
    let reporter = Reporter::new(client, "node-a");
    let task = tokio::spawn(async move { reporter.report_once(at(1_800_000_000), observation).await });

    expect(&mut handle, "GET", "/api/v1/nodes/node-a", (StatusCode::OK, node())).await;
    expect(
        &mut handle,
        "GET",
        &format!("{SVMN}/node-a"),
        (StatusCode::NOT_FOUND, not_found()),
    )
    .await;
    let created = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode",
        "metadata": {"name": "node-a", "uid": "svmn-uid", "resourceVersion": "1",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-node-a"}]},
        "spec": {}});
    let (content_type, body) = expect(&mut handle, "POST", &format!("{SVMN}?"), (StatusCode::CREATED, created)).await;
    assert_eq!(content_type.as_deref(), Some("application/json"));
    // Its name and its Node as owner, nothing else (V10): the Node's labels are the controller's
    // to mirror.
    assert_eq!(
        body["metadata"],
        json!({"name": "node-a",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-node-a"}]})
    );
    // None of its own labels holds yet (no boot check): no label patch; next is the server-side
    // apply of the status.
    let (content_type, body) = expect_status_apply(&mut handle).await;
    assert_eq!(content_type.as_deref(), Some("application/apply-patch+yaml"));
    assert_eq!(body["apiVersion"], "vm.smolvm.dev/v1alpha1");
    assert_eq!(body["kind"], "SmolVMNode");
    assert_eq!(body["metadata"], json!({"name": "node-a"}));
    let status = &body["status"];
    assert_eq!(status["nodeUID"], "uid-node-a");
    assert_eq!(status["endpoint"], json!({"address": "10.0.0.5", "port": 10443}));
    assert_eq!(
        status["internalIP"], "192.168.50.7",
        "the Node's InternalIP, where ports are published"
    );
    assert_eq!(status["runtimeVersion"], "1.32.2");
    assert_eq!(status["protocolVersion"], "v1");
    assert_eq!(status["heartbeatTime"], "2027-01-15T08:00:00Z");
    assert_eq!(
        status["capacity"],
        json!({"cpus": 8, "memoryMiB": 16384, "storageGiB": 100})
    );
    assert_eq!(
        status["allocatable"],
        json!({"cpus": 7, "memoryMiB": 15360, "storageGiB": 90})
    );
    let conditions: Vec<(String, String, String)> = status["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap_or("").to_string(),
                c["status"].as_str().unwrap_or("").to_string(),
                c["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        conditions,
        vec![
            ("Ready".into(), "False".into(), "KVMUnavailable".into()),
            ("KVMAvailable".into(), "False".into(), "KVMUnavailable".into()),
            ("RuntimeReady".into(), "True".into(), "AsExpected".into()),
        ]
    );
    task.await.expect("task").expect("report succeeded");
}

/// Issue 56: the agent never writes the Node's labels (the controller mirrors them): a SmolVMNode
/// whose labels differ from the Node's gets no label patch from it, only its status.
#[tokio::test]
async fn leaves_the_nodes_labels_to_the_controller_and_keeps_transition_times() {
    smolvm_runtime::install_crypto_provider();
    let (client, mut handle) = double();
    let reporter = Reporter::new(client, "node-a");
    let task = tokio::spawn(async move { reporter.report_once(at(1_800_000_100), observation).await });

    expect(&mut handle, "GET", "/api/v1/nodes/node-a", (StatusCode::OK, node())).await;
    let existing = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode",
        "metadata": {"name": "node-a", "resourceVersion": "7",
            "labels": {"kubernetes.io/hostname": "node-a", "zone": "z0", "gpu": "yes",
                "team": "admins", "vm.smolvm.dev/node": "node-a"},
            "annotations": {"vm.smolvm.dev/mirrored-labels": "gpu,kubernetes.io/hostname,zone"}},
        "spec": {},
        "status": {"conditions": [
            {"type": "RuntimeReady", "status": "True", "reason": "AsExpected", "message": "",
             "lastTransitionTime": "2027-01-01T00:00:00Z"},
            {"type": "KVMAvailable", "status": "True", "reason": "AsExpected", "message": "",
             "lastTransitionTime": "2027-01-01T00:00:00Z"}]}});
    expect(
        &mut handle,
        "GET",
        &format!("{SVMN}/node-a"),
        (StatusCode::OK, existing.clone()),
    )
    .await;
    // `zone` differs from the Node's and `gpu` left it: the agent sends no label patch; the
    // next call is the status apply.
    let (_, body) = expect_status_apply(&mut handle).await;
    let conditions = body["status"]["conditions"].as_array().expect("conditions").clone();
    let find = |t: &str| conditions.iter().find(|c| c["type"] == t).cloned().expect("condition");
    // Unchanged status keeps its time; a changed one (KVM now False) and a new one get `now`.
    assert_eq!(find("RuntimeReady")["lastTransitionTime"], "2027-01-01T00:00:00Z");
    assert_eq!(find("KVMAvailable")["lastTransitionTime"], "2027-01-15T08:01:40Z");
    assert_eq!(find("Ready")["lastTransitionTime"], "2027-01-15T08:01:40Z");
    task.await.expect("task").expect("report succeeded");
}

/// The recheck annotation on the SmolVMNode: the reporter wakes the guest boot check and removes
/// the annotation; the status then carries GuestBootable and the capability labels follow it.
#[tokio::test]
async fn the_recheck_annotation_wakes_the_guest_boot_check_and_is_removed() {
    use smolvm_runtime::canary::{BootCheck, CheckState, Outcome};
    smolvm_runtime::install_crypto_provider();
    let (client, mut handle) = double();
    let recheck = std::sync::Arc::new(tokio::sync::Notify::new());
    let reporter = Reporter::new(client, "node-a").with_recheck(recheck.clone());
    let booted = BootCheck {
        state: CheckState::Done(Outcome::Booted { millis: 640 }),
        last_run: Some(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("time")),
        smolvm_version: Some("1.32.2".into()),
        nested_virt: Some(false),
        gpu_count: Some(0),
    };
    let task = tokio::spawn(async move {
        reporter
            .report_once(at(1_800_000_100), move |uid| Observation {
                boot_check: Some(booted),
                ..observation(uid)
            })
            .await
    });
    expect(&mut handle, "GET", "/api/v1/nodes/node-a", (StatusCode::OK, node())).await;
    let existing = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode",
        "metadata": {"name": "node-a", "resourceVersion": "7",
            "labels": {"kubernetes.io/hostname": "node-a", "zone": "z1", "vm.smolvm.dev/node": "node-a"},
            "annotations": {"vm.smolvm.dev/mirrored-labels": "kubernetes.io/hostname,zone",
                "vm.smolvm.dev/recheck-boot": "true"}},
        "spec": {}});
    expect(
        &mut handle,
        "GET",
        &format!("{SVMN}/node-a"),
        (StatusCode::OK, existing.clone()),
    )
    .await;
    let (content_type, body) = expect(
        &mut handle,
        "PATCH",
        &format!("{SVMN}/node-a?&fieldManager=smolvm-runtime"),
        (StatusCode::OK, existing.clone()),
    )
    .await;
    assert_eq!(content_type.as_deref(), Some("application/merge-patch+json"));
    assert_eq!(
        body,
        json!({"metadata": {"annotations": {"vm.smolvm.dev/recheck-boot": null}}})
    );
    // The check was asked for: the notification is stored for the canary's loop.
    tokio::time::timeout(std::time::Duration::from_secs(5), recheck.notified())
        .await
        .expect("the guest boot check was woken");
    let (_, body) = expect(
        &mut handle,
        "PATCH",
        &format!("{SVMN}/node-a?&fieldManager=smolvm-runtime"),
        (StatusCode::OK, existing),
    )
    .await;
    // Its own label, and nothing else (V10).
    assert_eq!(
        body,
        json!({"metadata": {"labels": {"vm.smolvm.dev/guest-bootable": "true"}}})
    );
    let (_, body) = expect_status_apply(&mut handle).await;
    let guest = body["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "GuestBootable"))
        .cloned()
        .expect("GuestBootable");
    assert_eq!(
        (guest["status"].as_str(), guest["reason"].as_str()),
        (Some("True"), Some("CanaryBooted"))
    );
    assert_eq!(body["status"]["canary"]["bootMillis"], 640);
    assert_eq!(body["status"]["canary"]["smolvmVersion"], "1.32.2");
    task.await.expect("task").expect("report succeeded");
}

const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

fn csr_answer(name: &str, status: Value) -> Value {
    json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": "", "signerName": "vm.smolvm.dev/runtime-serving"},
        "status": status})
}

/// Takes the agent's CSR create from the double, answers it (201, pending) and returns the
/// CSR object's JSON as the agent sent it.
async fn accept_csr_create(handle: &mut Handle) -> Value {
    let (request, respond) = handle.next_request().await.expect("create CSR");
    assert_eq!((request.method().as_str(), request.uri().path()), ("POST", CSRS));
    let bytes = request.into_body().collect().await.expect("body").to_bytes();
    let body: Value = serde_json::from_slice(&bytes).expect("json");
    let name = body["metadata"]["name"].as_str().expect("name").to_string();
    respond.send_response(
        Response::builder()
            .status(StatusCode::CREATED)
            .body(Body::from(
                serde_json::to_vec(&csr_answer(&name, json!({}))).expect("json"),
            ))
            .expect("response"),
    );
    body
}

/// Signs the CSR in `body` with `ca` (standing in for the controller's signer): the certificate
/// PEM and the CSR status that carries it.
fn issue(ca: &smolvm_certs::CertificateAuthority, body: &Value) -> (String, Value) {
    let csr: k8s_openapi::ByteString = serde_json::from_value(body["spec"]["request"].clone()).expect("base64");
    let cert = ca
        .sign_csr(
            &csr.0,
            smolvm_certs::Validity::from_now(std::time::Duration::from_secs(3600)),
            smolvm_certs::LeafUsage::Server,
        )
        .expect("sign");
    let status = json!({"certificate": serde_json::to_value(k8s_openapi::ByteString(cert.clone().into_bytes())).expect("b64"),
        "conditions": [{"type": "Approved", "status": "True", "reason": "NodeMatches", "message": ""}]});
    (cert, status)
}

/// The serving key is generated by the agent, the CSR filed with the runtime signer, and the
/// certificate (signed here with smolvm-certs, standing in for the controller's signer) used.
#[tokio::test]
async fn files_a_csr_and_uses_the_signed_certificate() {
    smolvm_runtime::install_crypto_provider();
    let ca = smolvm_certs::CertificateAuthority::generate(
        "runtime-ca",
        smolvm_certs::Validity::from_now(std::time::Duration::from_secs(3600)),
    )
    .expect("ca");
    let (client, mut handle) = double();
    let task = tokio::spawn(async move {
        smolvm_runtime::serving_cert::request_serving_cert(
            client,
            "node-a",
            std::time::Duration::from_millis(10),
            std::time::Duration::from_secs(10),
        )
        .await
    });
    let body = accept_csr_create(&mut handle).await;
    let name = body["metadata"]["name"].as_str().expect("name").to_string();
    assert!(name.starts_with("smolvm-runtime-node-a-"), "{name}");
    assert_eq!(body["spec"]["signerName"], "vm.smolvm.dev/runtime-serving");
    assert_eq!(
        body["spec"]["usages"],
        json!(["digital signature", "key encipherment", "server auth"])
    );
    let csr: k8s_openapi::ByteString = serde_json::from_value(body["spec"]["request"].clone()).expect("base64");
    let info = smolvm_certs::parse_csr(&csr.0).expect("csr");
    smolvm_certs::validate_runtime_serving_csr(&info, "node-a").expect("names the node");
    let path = format!("{CSRS}/{name}");
    expect(
        &mut handle,
        "GET",
        &path,
        (StatusCode::OK, csr_answer(&name, json!({}))),
    )
    .await;
    let (cert, issued) = issue(&ca, &body);
    expect(&mut handle, "GET", &path, (StatusCode::OK, csr_answer(&name, issued))).await;
    let pair = task.await.expect("task").expect("certificate issued");
    assert_eq!(pair.cert_pem, cert);
    // The key stayed with the agent and matches the certificate.
    smolvm_certs::ReloadableResolver::from_pem(&pair.cert_pem, &pair.key_pem).expect("key matches");
}

#[tokio::test]
async fn a_denied_csr_is_an_error_naming_it() {
    smolvm_runtime::install_crypto_provider();
    let (client, mut handle) = double();
    let task = tokio::spawn(async move {
        smolvm_runtime::serving_cert::request_serving_cert(
            client,
            "node-a",
            std::time::Duration::from_millis(10),
            std::time::Duration::from_secs(10),
        )
        .await
    });
    let body = accept_csr_create(&mut handle).await;
    let name = body["metadata"]["name"].as_str().expect("name").to_string();
    let denied = json!({"conditions": [{"type": "Denied", "status": "True", "reason": "WrongNode", "message": "node mismatch"}]});
    expect(
        &mut handle,
        "GET",
        &format!("{CSRS}/{name}"),
        (StatusCode::OK, csr_answer(&name, denied)),
    )
    .await;
    let error = task.await.expect("task").expect_err("denied");
    assert_eq!(error.reason(), "CsrRejected");
    assert!(
        error.to_string().contains(&name) && error.to_string().contains("WrongNode"),
        "{error}"
    );
}

/// A serving certificate past two thirds of its lifetime is renewed through a new CSR and
/// swapped into the live resolver (no restart).
#[tokio::test]
async fn renews_a_certificate_past_two_thirds_of_its_life_without_restart() {
    smolvm_runtime::install_crypto_provider();
    let ca = smolvm_certs::CertificateAuthority::generate(
        "runtime-ca",
        smolvm_certs::Validity::from_now(std::time::Duration::from_secs(3600)),
    )
    .expect("ca");
    let now = std::time::SystemTime::now();
    let minute = std::time::Duration::from_secs(60);
    let old = ca
        .issue_server(
            &["node-a".to_string()],
            &[],
            smolvm_certs::Validity::between(now - 50 * minute, now + 10 * minute),
        )
        .expect("old certificate");
    let resolver =
        std::sync::Arc::new(smolvm_certs::ReloadableResolver::from_pem(&old.cert_pem, &old.key_pem).expect("resolver"));
    let old_serial = resolver.current_cert_info().serial_hex;
    let (client, mut handle) = double();
    let task = smolvm_runtime::serving_cert::spawn_renewal(
        client,
        "node-a".to_string(),
        resolver.clone(),
        smolvm_runtime::nodeapi::tls::ClientCaInForce::new(ca.cert_pem()),
        std::time::Duration::from_millis(10),
        std::time::Duration::from_millis(10),
    );
    let body = accept_csr_create(&mut handle).await;
    let name = body["metadata"]["name"].as_str().expect("name").to_string();
    let (_, issued) = issue(&ca, &body);
    expect(
        &mut handle,
        "GET",
        &format!("{CSRS}/{name}"),
        (StatusCode::OK, csr_answer(&name, issued)),
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while resolver.current_cert_info().serial_hex == old_serial {
        assert!(
            std::time::Instant::now() < deadline,
            "the renewed certificate was never swapped in"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let info = resolver.current_cert_info();
    assert!(
        info.not_after > now + 50 * minute,
        "the new certificate is the renewed one: {info:?}"
    );
    task.abort();
}

/// A fresh certificate from a CA that is no longer the signing one (the runtime CA rotated: the
/// bundle in force lists the new CA first) is replaced at once through a new CSR.
#[tokio::test]
async fn replaces_a_certificate_from_the_old_ca_as_soon_as_the_new_one_is_trusted() {
    smolvm_runtime::install_crypto_provider();
    let hour = std::time::Duration::from_secs(3600);
    let old_ca = smolvm_certs::CertificateAuthority::generate("runtime-ca", hour).expect("old CA");
    let new_ca = smolvm_certs::CertificateAuthority::generate("runtime-ca", hour).expect("new CA");
    let fresh = old_ca
        .issue_server(&["node-a".to_string()], &[], hour)
        .expect("certificate from the old CA");
    let resolver = std::sync::Arc::new(
        smolvm_certs::ReloadableResolver::from_pem(&fresh.cert_pem, &fresh.key_pem).expect("resolver"),
    );
    let in_force = smolvm_runtime::nodeapi::tls::ClientCaInForce::new(old_ca.cert_pem());
    let (client, mut handle) = double();
    let task = smolvm_runtime::serving_cert::spawn_renewal(
        client,
        "node-a".to_string(),
        resolver.clone(),
        in_force.clone(),
        std::time::Duration::from_millis(10),
        std::time::Duration::from_millis(10),
    );
    // Nothing to do while the old CA is the signing one: no CSR is filed.
    let quiet = tokio::time::timeout(std::time::Duration::from_millis(200), handle.next_request()).await;
    assert!(quiet.is_err(), "a CSR was filed while the certificate was current");
    let report = smolvm_runtime::serving_cert::report_current(&resolver, &in_force);
    assert_eq!(
        report.ca_fingerprint,
        Some(smolvm_certs::fingerprint(old_ca.cert_der()))
    );
    // The rotation's bundle comes into force: new CA first, old one still trusted.
    in_force.set(&format!("{}{}", new_ca.cert_pem(), old_ca.cert_pem()));
    let body = accept_csr_create(&mut handle).await;
    let name = body["metadata"]["name"].as_str().expect("name").to_string();
    let (_, issued) = issue(&new_ca, &body);
    expect(
        &mut handle,
        "GET",
        &format!("{CSRS}/{name}"),
        (StatusCode::OK, csr_answer(&name, issued)),
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let new_fingerprint = Some(smolvm_certs::fingerprint(new_ca.cert_der()));
    while smolvm_runtime::serving_cert::report_current(&resolver, &in_force).ca_fingerprint != new_fingerprint {
        assert!(
            std::time::Instant::now() < deadline,
            "the new CA's certificate was never swapped in"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    task.abort();
}
