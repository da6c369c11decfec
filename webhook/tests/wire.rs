//! Over-the-wire tests: the real server on 127.0.0.1 over TLS (rustls, ring), a rustls client
//! that verifies the certificate against the test CA, and AdmissionReview v1 bodies shaped as
//! kube-apiserver sends them.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde_json::{Value, json};
use smolvm_api::{
    constants::{FINALIZER, FORCE_DELETE_ANNOTATION},
    fixtures,
    validate::Identity,
};
use smolvm_webhook_bench::client::{self, Version};

fn nodes() -> Vec<smolvm_api::SmolVMNode> {
    vec![
        fixtures::node("node-a", 8, 16_384, 500),
        fixtures::node("small", 1, 256, 5),
    ]
}

fn patch_of(response: &Value) -> Option<json_patch::Patch> {
    let bytes: Vec<u8> = serde_json::from_value(response["patch"].clone()).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn set(mut v: Value, pointer: &str, value: Value) -> Value {
    if let Some(slot) = v.pointer_mut(pointer) {
        *slot = value;
    } else {
        // Create the last segment inside an existing parent.
        let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", pointer));
        if let Some(Value::Object(map)) = v.pointer_mut(parent) {
            map.insert(key.to_string(), value);
        }
    }
    v
}

/// The object as the API server stores it after the mutating webhook ran.
async fn defaulted(conn: &mut smolvm_webhook_bench::client::Connection, object: &Value) -> Value {
    let (status, body) = post(
        conn,
        "/mutate/smolvms",
        &review("smolvms", "", "CREATE", &fixtures::user(), object, None),
    )
    .await;
    assert_eq!(status, 200);
    let mut out = object.clone();
    if let Some(p) = patch_of(&body["response"]) {
        ok(json_patch::patch(&mut out, &p));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_patch_yields_defaulted_object_m1_m2() {
    let h = Harness::start(nodes()).await;
    for version in [Version::Http1, Version::Http2] {
        let mut conn = h.connect(version).await;
        let minimal = fixtures::smolvm(
            "minimal",
            json!({"image": "alpine:latest", "network": {"enabled": true, "ports": [{"hostPort": 8080, "guestPort": 80}]}}),
        );
        let req = review("smolvms", "", "CREATE", &fixtures::user(), &minimal, None);
        let (status, body) = post(&mut conn, "/mutate/smolvms", &req).await;
        assert_eq!(status, 200);
        let response = &body["response"];
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(body["kind"], "AdmissionReview");
        assert_eq!(response["uid"], req["request"]["uid"], "uid echoed");
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        let patch = patch_of(response).unwrap_or_else(|| panic!("no patch in {response}"));
        let mut object = minimal.clone();
        ok(json_patch::patch(&mut object, &patch));
        // M1 defaults and M2 finalizer.
        assert_eq!(object["spec"]["running"], true);
        assert_eq!(object["spec"]["resources"], json!({"cpus": 1, "memoryMiB": 512}));
        assert_eq!(object["spec"]["storage"], json!({"storageGiB": 20, "overlayGiB": 10}));
        assert_eq!(object["spec"]["network"]["enabled"], true, "user's value kept");
        assert_eq!(object["spec"]["network"]["ports"][0]["protocol"], "TCP");
        assert_eq!(object["metadata"]["finalizers"], json!([FINALIZER]));
        // The same as the library's own defaulting.
        let mut expected = minimal.clone();
        ok(json_patch::patch(
            &mut expected,
            &smolvm_api::defaulting::default_smolvm(smolvm_api::validate::Operation::Create, &minimal),
        ));
        assert_eq!(object, expected);
        // A second pass (reinvocation) yields no patch.
        let again = review("smolvms", "", "UPDATE", &fixtures::user(), &object, Some(&object));
        let (_, body) = post(&mut conn, "/mutate/smolvms", &again).await;
        assert_eq!(body["response"]["allowed"], true);
        assert!(body["response"].get("patch").is_none(), "{body}");
        // Network default when absent (M1).
        let bare = fixtures::smolvm("bare", json!({"image": "alpine:latest"}));
        let object = defaulted(&mut conn, &bare).await;
        assert_eq!(
            object["spec"]["network"],
            json!({"enabled": false, "exposeService": false})
        );
        // Status subresource: allowed, no patch.
        let st = review(
            "smolvms",
            "status",
            "UPDATE",
            &fixtures::controller(),
            &object,
            Some(&object),
        );
        let (_, body) = post(&mut conn, "/mutate/smolvms", &st).await;
        assert_eq!(body["response"]["allowed"], true);
        assert!(body["response"].get("patch").is_none());
    }
}

/// Issue 12's two examples: objects that break schema-level bounds (which the API server checks
/// after mutating admission, stopping at the first) and policy together. `/mutate` answers with
/// every violation at once, and `/validate` gives the same object the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutate_denies_with_every_violation_and_validate_agrees() {
    let h = Harness::start(nodes()).await;
    let mut conn = h.connect(Version::Http2).await;
    let cases = [
        (
            "big_with_low_and_duplicate_ports",
            json!({"image": "alpine:latest", "resources": {"cpus": 64, "memoryMiB": 100000},
                "network": {"enabled": true, "ports": [
                    {"hostPort": 80, "guestPort": 80},
                    {"hostPort": 8080, "guestPort": 8080},
                    {"hostPort": 8080, "guestPort": 8081}]}}),
            &[
                "spec.resources.cpus",
                "spec.network.ports[0].hostPort",
                "spec.network.ports[2]",
            ][..],
        ),
        (
            "out_of_bounds_cpus_tiny_memory_ssh_port",
            json!({"image": "alpine:latest", "resources": {"cpus": 4096, "memoryMiB": 1},
                "network": {"enabled": true, "ports": [{"hostPort": 22, "guestPort": 22}]}}),
            &[
                "spec.resources.cpus",
                "spec.resources.memoryMiB",
                "spec.network.ports[0].hostPort",
            ][..],
        ),
    ];
    for (name, spec, paths) in cases {
        let object = fixtures::smolvm(name, spec);
        let req = review("smolvms", "", "CREATE", &fixtures::user(), &object, None);
        let (status, body) = post(&mut conn, "/mutate/smolvms", &req).await;
        assert_eq!(status, 200, "{name}");
        let mutate = &body["response"];
        assert_eq!(mutate["allowed"], false, "{name}: {mutate}");
        assert!(mutate.get("patch").is_none(), "{name}: a denial carries no patch");
        let message = mutate["status"]["message"].as_str().unwrap_or_default().to_string();
        for path in paths {
            assert!(
                message.contains(path),
                "{name}: {path} missing from the one answer:\n{message}"
            );
        }
        println!(
            "{name}: /mutate answered {} {}:\n{message}",
            mutate["status"]["code"], mutate["status"]["reason"]
        );

        // The same object, defaulted, at /validate: the same list, word for word.
        let mut final_object = object.clone();
        ok(json_patch::patch(
            &mut final_object,
            &smolvm_api::defaulting::default_smolvm(smolvm_api::validate::Operation::Create, &object),
        ));
        let req = review("smolvms", "", "CREATE", &fixtures::user(), &final_object, None);
        let (_, body) = post(&mut conn, "/validate/smolvms", &req).await;
        let validate = &body["response"];
        assert_eq!(validate["allowed"], false, "{name}");
        assert_eq!(
            validate["status"], mutate["status"],
            "{name}: both endpoints say the same"
        );
    }
    // A valid object is still defaulted, not denied.
    let fine = fixtures::smolvm("fine", json!({"image": "alpine:latest", "resources": {"cpus": 2}}));
    let (_, body) = post(
        &mut conn,
        "/mutate/smolvms",
        &review("smolvms", "", "CREATE", &fixtures::user(), &fine, None),
    )
    .await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    assert!(patch_of(&body["response"]).is_some());
}

enum Expect {
    Allowed,
    AllowedWarning(&'static str),
    Denied(u16, &'static str, &'static [&'static str]),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_over_the_wire() {
    let h = Harness::start(nodes()).await;
    let mut conn = h.connect(Version::Http2).await;
    let stored = defaulted(&mut conn, &fixtures::alpine()).await;
    let bound = fixtures::bound(stored.clone(), "node-a");
    let deleting = fixtures::deleting(bound.clone());
    let node_a = ok(serde_json::to_value(fixtures::node("node-a", 8, 16_384, 500)));
    let node_b = ok(serde_json::to_value(fixtures::node("node-b", 8, 16_384, 500)));
    let mut bad_endpoint = node_a.clone();
    bad_endpoint["status"]["endpoint"] = json!({"address": "not an address!", "port": 0});
    let user = fixtures::user();
    let controller = fixtures::controller();
    let runtime_a = fixtures::runtime_on("node-a");
    let mut finalizer_removed = deleting.clone();
    finalizer_removed["metadata"]["finalizers"] = json!([]);

    type Case<'a> = (
        &'a str,
        &'a str,
        &'a str,
        &'a str,
        &'a Identity,
        Value,
        Option<Value>,
        Expect,
    );
    let cases: Vec<Case> = vec![
        (
            "valid create",
            "smolvms",
            "",
            "CREATE",
            &user,
            stored.clone(),
            None,
            Expect::Allowed,
        ),
        (
            "V1 image",
            "smolvms",
            "",
            "CREATE",
            &user,
            set(stored.clone(), "/spec/image", json!("Not An Image")),
            None,
            Expect::Denied(422, "Invalid", &["spec.image", "[V1]"]),
        ),
        (
            "V2 cpus",
            "smolvms",
            "",
            "CREATE",
            &user,
            set(stored.clone(), "/spec/resources/cpus", json!(96)),
            None,
            Expect::Denied(422, "Invalid", &["spec.resources.cpus", "96", "[V2]"]),
        ),
        (
            "V3 host port",
            "smolvms",
            "",
            "CREATE",
            &user,
            set(stored.clone(), "/spec/network/ports/0/hostPort", json!(80)),
            None,
            Expect::Denied(422, "Invalid", &["hostPort", "[V3]"]),
        ),
        (
            "V4 node name",
            "smolvms",
            "",
            "CREATE",
            &user,
            set(stored.clone(), "/spec/nodeName", json!("Bad_Name")),
            None,
            Expect::Denied(422, "Invalid", &["spec.nodeName", "[V4]"]),
        ),
        (
            "V5 pin can never hold",
            "smolvms",
            "",
            "CREATE",
            &user,
            set(stored.clone(), "/spec/nodeName", json!("small")),
            None,
            Expect::Denied(422, "Invalid", &["spec.nodeName", "[V5]"]),
        ),
        (
            "V5 pin unknown warns",
            "smolvms",
            "",
            "CREATE",
            &user,
            set(stored.clone(), "/spec/nodeName", json!("ghost")),
            None,
            Expect::AllowedWarning("[V5]"),
        ),
        (
            "V5 bound never moves",
            "smolvms",
            "",
            "UPDATE",
            &user,
            set(bound.clone(), "/spec/nodeName", json!("node-b")),
            Some(bound.clone()),
            Expect::Denied(422, "Invalid", &["never move", "[V5]"]),
        ),
        (
            "V6 image immutable",
            "smolvms",
            "",
            "UPDATE",
            &user,
            set(bound.clone(), "/spec/image", json!("alpine:3.20")),
            Some(bound.clone()),
            Expect::Denied(422, "Invalid", &["spec.image", "[V6]"]),
        ),
        (
            "V7 force-delete on create",
            "smolvms",
            "",
            "CREATE",
            &user,
            set(
                stored.clone(),
                "/metadata/annotations",
                json!({FORCE_DELETE_ANNOTATION: "true"}),
            ),
            None,
            Expect::Denied(422, "Invalid", &["[V7]"]),
        ),
        (
            "V7 force-delete while deleting warns",
            "smolvms",
            "",
            "UPDATE",
            &user,
            set(
                deleting.clone(),
                "/metadata/annotations",
                json!({FORCE_DELETE_ANNOTATION: "true"}),
            ),
            Some(deleting.clone()),
            Expect::AllowedWarning("node-a"),
        ),
        (
            "V8 spec change while deleting",
            "smolvms",
            "",
            "UPDATE",
            &user,
            set(deleting.clone(), "/spec/running", json!(false)),
            Some(deleting.clone()),
            Expect::Denied(422, "Invalid", &["[V8]"]),
        ),
        (
            "V8 finalizer removal allowed",
            "smolvms",
            "",
            "UPDATE",
            &controller,
            finalizer_removed,
            Some(deleting.clone()),
            Expect::Allowed,
        ),
        (
            "V9 user writes binding",
            "smolvms",
            "status",
            "UPDATE",
            &user,
            bound.clone(),
            Some(stored.clone()),
            Expect::Denied(403, "Forbidden", &["only the controller", "[V9]"]),
        ),
        (
            "V9 controller writes binding",
            "smolvms",
            "status",
            "UPDATE",
            &controller,
            bound.clone(),
            Some(stored.clone()),
            Expect::Allowed,
        ),
        (
            "V9 binding never changes",
            "smolvms",
            "status",
            "UPDATE",
            &controller,
            fixtures::bound(stored.clone(), "node-b"),
            Some(bound.clone()),
            Expect::Denied(403, "Forbidden", &["status.nodeName", "[V9]"]),
        ),
        (
            "V10 runtime writes own node",
            "smolvmnodes",
            "status",
            "UPDATE",
            &runtime_a,
            node_a.clone(),
            Some(node_a.clone()),
            Expect::Allowed,
        ),
        (
            "V10 runtime writes other node",
            "smolvmnodes",
            "",
            "CREATE",
            &runtime_a,
            node_b.clone(),
            None,
            Expect::Denied(403, "Forbidden", &["own node", "[V10]"]),
        ),
        (
            "V10 runtime writes other node status",
            "smolvmnodes",
            "status",
            "UPDATE",
            &runtime_a,
            node_b.clone(),
            Some(node_b.clone()),
            Expect::Denied(403, "Forbidden", &["[V10]"]),
        ),
        (
            "V10 endpoint invalid",
            "smolvmnodes",
            "status",
            "UPDATE",
            &runtime_a,
            bad_endpoint,
            Some(node_a.clone()),
            Expect::Denied(403, "Forbidden", &["status.endpoint.address", "status.endpoint.port"]),
        ),
        (
            "every violation listed",
            "smolvms",
            "",
            "CREATE",
            &user,
            set(
                set(
                    set(stored.clone(), "/spec/image", json!("Bad Image")),
                    "/spec/resources/cpus",
                    json!(0),
                ),
                "/spec/nodeName",
                json!("Bad_Name"),
            ),
            None,
            Expect::Denied(422, "Invalid", &["[V1]", "[V2]", "[V4]"]),
        ),
        (
            "schema mismatch denied",
            "smolvms",
            "",
            "CREATE",
            &user,
            set(stored.clone(), "/spec/resources/cpus", json!("many")),
            None,
            Expect::Denied(422, "Invalid", &["schema"]),
        ),
    ];
    for (name, resource, sub, op, who, object, old, expect) in cases {
        let req = review(resource, sub, op, who, &object, old.as_ref());
        let path = format!("/validate/{resource}");
        let (status, body) = post(&mut conn, &path, &req).await;
        assert_eq!(status, 200, "{name}: {body}");
        let r = &body["response"];
        assert_eq!(r["uid"], req["request"]["uid"], "{name}");
        let warnings = r["warnings"].as_array().cloned().unwrap_or_default();
        match expect {
            Expect::Allowed => assert_eq!(r["allowed"], true, "{name}: {r}"),
            Expect::AllowedWarning(needle) => {
                assert_eq!(r["allowed"], true, "{name}: {r}");
                assert!(
                    warnings.iter().any(|w| w.as_str().is_some_and(|w| w.contains(needle))),
                    "{name}: warnings {warnings:?}"
                );
            }
            Expect::Denied(code, reason, needles) => {
                assert_eq!(r["allowed"], false, "{name}: {r}");
                assert_eq!(r["status"]["code"], code, "{name}: {r}");
                assert_eq!(r["status"]["reason"], reason, "{name}");
                assert_eq!(r["status"]["status"], "Failure", "{name}");
                let message = r["status"]["message"].as_str().unwrap_or("");
                for needle in needles {
                    assert!(message.contains(needle), "{name}: {needle:?} not in {message:?}");
                }
            }
        }
    }
    // Rejections are counted by rule.
    let (status, metrics) = h.ops_get("/metrics").await;
    assert_eq!(status, 200);
    for rule in ["V1", "V2", "V3", "V4", "V5", "V6", "V7", "V8", "V9", "V10"] {
        assert!(
            metrics.contains(&format!("smolvm_webhook_rejections_total{{rule=\"{rule}\"}}")),
            "{rule}\n{metrics}"
        );
    }
    assert!(metrics.contains("smolvm_webhook_request_duration_seconds_bucket"));
    assert!(metrics.contains("verdict=\"denied\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_inputs_get_json_errors() {
    let h = Harness::start_with(nodes(), |s| {
        s.body_limit = 64 * 1024;
        s.body_timeout = Duration::from_millis(300);
    })
    .await;
    let good = ok(serde_json::to_vec(&review(
        "smolvms",
        "",
        "CREATE",
        &fixtures::user(),
        &fixtures::alpine(),
        None,
    )));
    let no_object = {
        let mut r = review("smolvms", "", "CREATE", &fixtures::user(), &fixtures::alpine(), None);
        r["request"]["object"] = Value::Null;
        ok(serde_json::to_vec(&r))
    };
    let bad_object = {
        let mut r = review("smolvms", "", "CREATE", &fixtures::user(), &fixtures::alpine(), None);
        r["request"]["object"] = json!({"metadata": "not an object"});
        ok(serde_json::to_vec(&r))
    };
    let huge = {
        let mut o = fixtures::alpine();
        o["metadata"]["annotations"] = json!({"big": "x".repeat(100 * 1024)});
        ok(serde_json::to_vec(&review(
            "smolvms",
            "",
            "CREATE",
            &fixtures::user(),
            &o,
            None,
        )))
    };
    let v1beta1 = String::from_utf8_lossy(&good).replace("admission.k8s.io/v1", "admission.k8s.io/v1beta1");
    type Case<'a> = (&'a str, &'a str, &'a str, Option<&'a str>, Vec<u8>, u16, &'a str);
    let table: Vec<Case> = vec![
        (
            "not JSON",
            "POST",
            "/validate/smolvms",
            Some("application/json"),
            b"{not json".to_vec(),
            400,
            "NotJSON",
        ),
        (
            "empty body",
            "POST",
            "/validate/smolvms",
            Some("application/json"),
            Vec::new(),
            400,
            "NotJSON",
        ),
        (
            "wrong kind",
            "POST",
            "/validate/smolvms",
            Some("application/json"),
            br#"{"apiVersion":"v1","kind":"Pod"}"#.to_vec(),
            400,
            "WrongKind",
        ),
        (
            "wrong version",
            "POST",
            "/mutate/smolvms",
            Some("application/json"),
            v1beta1.into_bytes(),
            400,
            "WrongKind",
        ),
        (
            "missing request",
            "POST",
            "/validate/smolvms",
            Some("application/json"),
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            400,
            "MissingRequest",
        ),
        (
            "missing object",
            "POST",
            "/validate/smolvms",
            Some("application/json"),
            no_object,
            400,
            "Malformed",
        ),
        (
            "object does not deserialize",
            "POST",
            "/validate/smolvms",
            Some("application/json"),
            bad_object,
            400,
            "Malformed",
        ),
        (
            "body over limit",
            "POST",
            "/validate/smolvms",
            Some("application/json"),
            huge,
            413,
            "RequestEntityTooLarge",
        ),
        (
            "wrong content type",
            "POST",
            "/validate/smolvms",
            Some("text/plain"),
            good.clone(),
            415,
            "UnsupportedMediaType",
        ),
        (
            "no content type",
            "POST",
            "/mutate/smolvms",
            None,
            good.clone(),
            415,
            "UnsupportedMediaType",
        ),
        (
            "GET",
            "GET",
            "/validate/smolvms",
            None,
            Vec::new(),
            405,
            "MethodNotAllowed",
        ),
        (
            "unknown path",
            "POST",
            "/validate/pods",
            Some("application/json"),
            good.clone(),
            404,
            "NotFound",
        ),
    ];
    for version in [Version::Http1, Version::Http2] {
        for (name, method, path, ct, body, code, reason) in &table {
            // A fresh connection per case: after a 413 with an unread body an HTTP/1.1 server
            // must close the connection.
            let mut conn = h.connect(version).await;
            let (status, out) = ok(conn.send(method, path, *ct, Bytes::from(body.clone())).await);
            let v: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
            assert_eq!(status, *code, "{version:?} {name}: {v}");
            assert_eq!(v["reason"], *reason, "{version:?} {name}: {v}");
            assert_eq!(v["kind"], "Status", "{version:?} {name}");
        }
        // The server keeps serving after every error.
        let mut conn = h.connect(version).await;
        let (status, _) = ok(conn.post_json("/validate/smolvms", Bytes::from(good.clone())).await);
        assert_eq!(status, 200);
    }

    // A body that never finishes: 408 after the body timeout, not a hang.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let config = ok(client::tls_config(h.ca.cert_pem(), Version::Http1));
        let tcp = ok(tokio::net::TcpStream::connect(h.addr).await);
        let name = ok(rustls::pki_types::ServerName::try_from(SERVER_NAME));
        let mut tls = ok(tokio_rustls::TlsConnector::from(config).connect(name, tcp).await);
        ok(tls
            .write_all(b"POST /validate/smolvms HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"apiVersion\"")
            .await);
        let mut buf = vec![0u8; 4096];
        let n = ok(tokio::time::timeout(Duration::from_secs(30), tls.read(&mut buf))
            .await
            .map_err(|_| "hung"));
        let text = String::from_utf8_lossy(&buf[..n.unwrap_or(0)]).to_string();
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("\"reason\":\"Timeout\""), "{text}");
    }
    let (_, metrics) = h.ops_get("/metrics").await;
    assert!(
        metrics.contains("smolvm_webhook_bad_requests_total{reason=\"RequestEntityTooLarge\"}"),
        "{metrics}"
    );
}

/// Raw HTTP/1.1 over verified TLS, for what the client helper hides (headers, half-sent bodies).
async fn raw_tls(h: &Harness) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let config = ok(client::tls_config(h.ca.cert_pem(), Version::Http1));
    let tcp = ok(tokio::net::TcpStream::connect(h.addr).await);
    let name = ok(rustls::pki_types::ServerName::try_from(SERVER_NAME));
    ok(tokio_rustls::TlsConnector::from(config).connect(name, tcp).await)
}

/// With every review slot taken, a request is shed at once with 429, `Retry-After` (which the
/// API server's webhook client retries) and a Status body, counted in a metric; once the slot
/// frees, requests are answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_review_slots_are_shed_with_retry_after() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Harness::start_with(nodes(), |s| {
        *s = s.clone().with_max_concurrent_reviews(1);
        s.body_timeout = Duration::from_secs(5);
    })
    .await;
    let good = serde_json::to_vec(&review(
        "smolvms",
        "",
        "CREATE",
        &fixtures::user(),
        &fixtures::alpine(),
        None,
    ))
    .unwrap_or_default();
    // The holder: a review in progress holds the only slot (a body still arriving holds none;
    // see tests/slow_bodies.rs).
    let holder = h.state.reviews.clone().try_acquire_owned();
    assert!(holder.is_ok(), "the only slot was free");
    let mut shed = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut tls = raw_tls(&h).await;
        let head = format!(
            "POST /validate/smolvms HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            good.len()
        );
        ok(tls.write_all(head.as_bytes()).await);
        ok(tls.write_all(&good).await);
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out).to_string();
        if text.starts_with("HTTP/1.1 429") {
            shed = Some(text);
            break;
        }
    }
    let text = shed.unwrap_or_else(|| panic!("no request was shed while the only slot was held"));
    assert!(text.to_ascii_lowercase().contains("\r\nretry-after: 1\r\n"), "{text}");
    assert!(text.contains("\"reason\":\"TooManyRequests\""), "{text}");
    assert!(text.contains("\"code\":429"), "{text}");

    // The holder gives up: the slot frees and requests are answered again.
    drop(holder);
    let mut answered = false;
    for _ in 0..100 {
        let mut conn = h.connect(Version::Http2).await;
        let (status, _) = ok(conn.post_json("/validate/smolvms", Bytes::from(good.clone())).await);
        if status == 200 {
            answered = true;
            break;
        }
        assert_eq!(status, 429);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answered, "the slot never came back");
    let (_, metrics) = h.ops_get("/metrics").await;
    assert!(
        metrics.contains("smolvm_webhook_shed_requests_total{path=\"/validate/smolvms\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_http2_and_http11() {
    let h = Harness::start(nodes()).await;
    let req = review("smolvms", "", "CREATE", &fixtures::user(), &fixtures::alpine(), None);
    for (version, alpn) in [
        (Version::Http1, b"http/1.1".as_slice()),
        (Version::Http2, b"h2".as_slice()),
    ] {
        let mut conn = h.connect(version).await;
        assert_eq!(conn.negotiated.as_deref(), Some(alpn));
        for _ in 0..3 {
            let (status, body) = post(&mut conn, "/validate/smolvms", &req).await;
            assert_eq!(status, 200);
            assert_eq!(body["response"]["uid"], req["request"]["uid"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_verify_the_certificate() {
    let h = Harness::start(nodes()).await;
    let other_ca = ok(smolvm_certs::CertificateAuthority::generate("other", DAY));
    // Right CA and name: ok.
    let good = ok(client::tls_config(h.ca.cert_pem(), Version::Http2));
    assert!(
        client::connect(h.addr, SERVER_NAME, good.clone(), Version::Http2)
            .await
            .is_ok()
    );
    // Wrong CA: refused.
    let wrong = ok(client::tls_config(other_ca.cert_pem(), Version::Http2));
    let err = client::connect(h.addr, SERVER_NAME, wrong, Version::Http2)
        .await
        .err()
        .map(|e| e.to_string());
    assert!(err.as_deref().is_some_and(|e| e.contains("UnknownIssuer")), "{err:?}");
    // SAN mismatch: refused.
    let err = client::connect(h.addr, "evil.example.com", good.clone(), Version::Http2)
        .await
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("not valid for name")),
        "{err:?}"
    );
    // Expired certificate: refused.
    let now = std::time::SystemTime::now();
    let expired = ok(h.ca.issue_server(
        &[SERVER_NAME.to_string()],
        &[],
        smolvm_certs::Validity::between(now - 2 * DAY, now - DAY),
    ));
    ok(h.resolver.swap_pem(&expired.cert_pem, &expired.key_pem));
    // A fresh client config: the first one holds a session ticket, and a resumed TLS 1.3
    // session does not present a certificate at all.
    let fresh = ok(client::tls_config(h.ca.cert_pem(), Version::Http2));
    let err = client::connect(h.addr, SERVER_NAME, fresh, Version::Http2)
        .await
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.to_lowercase().contains("expired")),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rotation_under_load_drops_nothing() {
    let h = Harness::start(nodes()).await;
    let req = Bytes::from(ok(serde_json::to_vec(&review(
        "smolvms",
        "",
        "CREATE",
        &fixtures::user(),
        &fixtures::alpine(),
        None,
    ))));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for version in [Version::Http1, Version::Http2, Version::Http1, Version::Http2] {
        let config = ok(client::tls_config(h.ca.cert_pem(), version));
        let (addr, req, stop, ca_pem) = (h.addr, req.clone(), stop.clone(), h.ca.cert_pem().to_string());
        clients.push(tokio::spawn(async move {
            let (mut sent, mut failed, mut reconnects) = (0u32, 0u32, 0u32);
            let mut conn = ok(client::connect(addr, SERVER_NAME, config.clone(), version).await);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match conn.post_json("/validate/smolvms", req.clone()).await {
                    Ok((200, _)) => sent += 1,
                    _ => failed += 1,
                }
                // Every 20 requests also open a new connection with a fresh config (no session
                // resumption): a full handshake verifying the certificate current at that moment.
                if sent % 20 == 0 {
                    let fresh = ok(client::tls_config(&ca_pem, version));
                    match client::connect(addr, SERVER_NAME, fresh, version).await {
                        Ok(c) => {
                            conn = c;
                            reconnects += 1;
                        }
                        Err(_) => failed += 1,
                    }
                }
            }
            (sent, failed, reconnects)
        }));
    }
    let mut serials = std::collections::BTreeSet::new();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let next = ok(h.ca.issue_server(
            &smolvm_certs::webhook_service_dns_names("smolvm-webhook", "smolvm-system"),
            &[],
            DAY,
        ));
        ok(h.resolver.swap_pem(&next.cert_pem, &next.key_pem));
        serials.insert(h.resolver.current_cert_info().serial_hex);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut sent, mut failed, mut reconnects) = (0, 0, 0);
    for c in clients {
        let (s, f, r) = ok(c.await);
        sent += s;
        failed += f;
        reconnects += r;
    }
    println!(
        "rotation: {} certificates, {sent} requests, {reconnects} new connections, {failed} failed",
        serials.len()
    );
    assert_eq!(serials.len(), 10);
    assert!(sent > 0 && reconnects > 0);
    assert_eq!(failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_cache_sync() {
    let h = Harness::start(nodes()).await;
    assert_eq!(h.ops_get("/healthz").await.0, 200);
    let (status, body) = h.ops_get("/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("smolvmnode cache not synced"), "{body}");
    assert!(body.contains("smolvmclass cache not synced"), "{body}");
    assert!(body.contains("smolvmpool cache not synced"), "{body}");
    assert!(body.contains("resourcequota cache not synced"), "{body}");
    assert!(body.contains("branch source cache not synced"), "{body}");
    h.state.readiness.set_nodes_synced();
    assert_eq!(h.ops_get("/readyz").await.0, 503, "the class cache is not synced yet");
    h.state.readiness.set_classes_synced();
    assert_eq!(h.ops_get("/readyz").await.0, 503, "the pool cache is not synced yet");
    h.state.readiness.set_pools_synced();
    assert_eq!(h.ops_get("/readyz").await.0, 503, "the source cache is not synced yet");
    h.state.readiness.set_sources_synced();
    assert_eq!(h.ops_get("/readyz").await.0, 503, "the quota cache is not synced yet");
    h.state.readiness.set_quotas_synced();
    assert_eq!(h.ops_get("/readyz").await.0, 200);
    let (status, metrics) = h.ops_get("/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("# EOF"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_change_applies_without_restart() {
    let h = Harness::start(nodes()).await;
    let mut conn = h.connect(Version::Http2).await;
    let stored = defaulted(&mut conn, &fixtures::alpine()).await;
    let four = set(stored, "/spec/resources/cpus", json!(4));
    let req = review("smolvms", "", "CREATE", &fixtures::user(), &four, None);
    assert_eq!(
        post(&mut conn, "/validate/smolvms", &req).await.1["response"]["allowed"],
        true
    );
    let dir = ok(tempfile::tempdir());
    let path = dir.path().join("policy.yaml");
    ok(std::fs::write(&path, "maxCpus: 2\n"));
    let mut watched = smolvm_webhook::reload::Watched::new(vec![path]);
    assert!(smolvm_webhook::reload::apply_policy_poll(
        &mut watched,
        &h.state.policy,
        &h.state.metrics
    ));
    let (_, body) = post(&mut conn, "/validate/smolvms", &req).await;
    assert_eq!(body["response"]["allowed"], false);
    assert!(
        body["response"]["status"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("[V2]")
    );
}

/// A catalogue of classes that counts one SmolVM of `large` (as the webhook's label cache would).
struct CountingClasses(Vec<smolvm_api::SmolVMClass>);

impl smolvm_api::class::ClassCatalog for CountingClasses {
    fn class(&self, name: &str) -> Option<smolvm_api::SmolVMClass> {
        self.0.class(name)
    }
    fn names(&self) -> Vec<String> {
        self.0.names()
    }
    fn defaults(&self) -> Vec<smolvm_api::SmolVMClass> {
        self.0.defaults()
    }
    fn users(&self, name: &str) -> Option<usize> {
        Some(usize::from(name == "large"))
    }
}

/// M3 and V12 over the wire: a SmolVM naming a class comes back with the class's sizes and the
/// record of it; the default class applies to one naming none; an unknown class is refused with
/// the list; a second default class is refused naming the first; deleting a class in use is
/// allowed with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classes_over_the_wire() {
    let classes = vec![
        fixtures::class("small", json!({"resources": {"cpus": 1, "memoryMiB": 512}}), true),
        fixtures::class(
            "large",
            json!({"resources": {"cpus": 4, "memoryMiB": 8192}, "storage": {"storageGiB": 50}}),
            false,
        ),
    ];
    let catalog = std::sync::Arc::new(CountingClasses(classes));
    let h = Harness::start_with(nodes(), |state| state.classes = catalog).await;
    let mut conn = h.connect(Version::Http2).await;

    let large = fixtures::smolvm("big", json!({"image": "alpine:3.20", "className": "large"}));
    let object = defaulted(&mut conn, &large).await;
    assert_eq!(object["spec"]["resources"], json!({"cpus": 4, "memoryMiB": 8192}));
    assert_eq!(
        object["spec"]["storage"],
        json!({"storageGiB": 50, "overlayGiB": 10}),
        "M1 after M3"
    );
    assert_eq!(object["metadata"]["annotations"]["vm.smolvm.dev/class"], "large");
    assert_eq!(object["metadata"]["annotations"]["vm.smolvm.dev/class-generation"], "1");
    assert_eq!(object["metadata"]["labels"]["vm.smolvm.dev/class"], "large");
    assert_eq!(object["metadata"]["finalizers"], json!([FINALIZER]));
    let again = review("smolvms", "", "CREATE", &fixtures::user(), &object, None);
    let (_, body) = post(&mut conn, "/mutate/smolvms", &again).await;
    assert!(
        body["response"].get("patch").is_none(),
        "a second pass adds nothing: {body}"
    );

    let bare = defaulted(&mut conn, &fixtures::smolvm("bare", json!({"image": "alpine:3.20"}))).await;
    assert_eq!(bare["spec"]["className"], "small", "the default class");

    let unknown = fixtures::smolvm("odd", json!({"image": "alpine:3.20", "className": "huge"}));
    for path in ["/mutate/smolvms", "/validate/smolvms"] {
        let req = review("smolvms", "", "CREATE", &fixtures::user(), &unknown, None);
        let (_, body) = post(&mut conn, path, &req).await;
        assert_eq!(body["response"]["allowed"], false, "{path}");
        assert_eq!(body["response"]["status"]["code"], 422, "{path}");
        let message = body["response"]["status"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("spec.className") && message.contains("V12") && message.contains("large, small"),
            "{path}: {message}"
        );
    }

    let second = fixtures::class_json("xl", json!({}), true);
    let req = review("smolvmclasses", "", "CREATE", &fixtures::user(), &second, None);
    let (_, body) = post(&mut conn, "/validate/smolvmclasses", &req).await;
    assert_eq!(body["response"]["allowed"], false, "{body}");
    let message = body["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("\"small\"") && message.contains("V12"), "{message}");

    let out_of_policy = fixtures::class_json("huge", json!({"resources": {"cpus": 1000}}), false);
    let req = review("smolvmclasses", "", "CREATE", &fixtures::user(), &out_of_policy, None);
    let (_, body) = post(&mut conn, "/validate/smolvmclasses", &req).await;
    assert_eq!(body["response"]["allowed"], false);
    let message = body["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("spec.resources.cpus") && message.contains("V2"),
        "{message}"
    );

    let stored = serde_json::to_value(catalog_class(&h, "large")).unwrap_or_default();
    let mut req = review(
        "smolvmclasses",
        "",
        "DELETE",
        &fixtures::user(),
        &Value::Null,
        Some(&stored),
    );
    req["request"]["name"] = json!("large");
    let (_, body) = post(&mut conn, "/validate/smolvmclasses", &req).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    let warnings = body["response"]["warnings"].to_string();
    assert!(warnings.contains("1 SmolVM(s) name the class"), "{warnings}");
}

/// The mutating webhook's refusal of `object` at CREATE: 422, and its message.
async fn refused(conn: &mut smolvm_webhook_bench::client::Connection, object: &Value) -> String {
    let req = review("smolvms", "", "CREATE", &fixtures::user(), object, None);
    let (_, body) = post(conn, "/mutate/smolvms", &req).await;
    assert_eq!(body["response"]["allowed"], false, "{body}");
    assert_eq!(body["response"]["status"]["code"], 422, "{body}");
    body["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn catalog_class(h: &Harness, name: &str) -> Option<smolvm_api::SmolVMClass> {
    h.state.classes.class(name)
}

/// M4 and V14 over the wire: a SmolVM naming a pool comes back filled from the template (its
/// own env last), labelled with the pool; one that sets what a lease cannot carry is refused
/// naming every such field, with the filled object's own violations in the same answer; an
/// unknown pool is refused with the namespace's pools; a pool's template is judged by every
/// SmolVM rule at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_over_the_wire() {
    let pools = vec![fixtures::pool(
        "sandboxes",
        json!({
            "template": {"image": "python:3.12-slim", "resources": {"cpus": 2}, "env": [{"name": "MODE", "value": "pool"}]},
            "slotsPerNode": 3
        }),
    )];
    let h = Harness::start_with(nodes(), |state| state.pools = std::sync::Arc::new(pools)).await;
    let mut conn = h.connect(Version::Http1).await;

    let claim = fixtures::smolvm(
        "job-1",
        json!({"poolRef": {"name": "sandboxes"}, "env": [{"name": "JOB", "value": "1"}]}),
    );
    let object = defaulted(&mut conn, &claim).await;
    assert_eq!(object["spec"]["image"], "python:3.12-slim");
    assert_eq!(
        object["spec"]["resources"],
        json!({"cpus": 2, "memoryMiB": 512}),
        "M1 after M4"
    );
    assert_eq!(
        object["spec"]["env"],
        json!([{"name": "MODE", "value": "pool"}, {"name": "JOB", "value": "1"}])
    );
    assert_eq!(object["metadata"]["labels"]["vm.smolvm.dev/pool"], "sandboxes");
    let req = review("smolvms", "", "CREATE", &fixtures::user(), &object, None);
    let (_, body) = post(&mut conn, "/validate/smolvms", &req).await;
    assert_eq!(body["response"]["allowed"], true, "the filled SmolVM is valid: {body}");

    let greedy = fixtures::smolvm(
        "job-2",
        json!({"poolRef": {"name": "sandboxes"}, "image": "alpine", "resources": {"cpus": 999}}),
    );
    let message = refused(&mut conn, &greedy).await;
    for expected in [
        "spec.image: is set (\"alpine\")",
        "spec.resources: is set (1 field(s))",
        "[V14]",
        "[V2]",
    ] {
        assert!(message.contains(expected), "{expected:?} in {message}");
    }

    let unknown = fixtures::smolvm("job-3", json!({"poolRef": {"name": "gpus"}}));
    let message = refused(&mut conn, &unknown).await;
    assert!(
        message.contains("spec.poolRef.name") && message.contains("sandboxes") && !message.contains("spec.image"),
        "{message}"
    );

    let bad = fixtures::pool_json(
        "broken",
        json!({"template": {"image": "Not An Image", "resources": {"cpus": 999}}, "slotsPerNode": 1000}),
    );
    let req = review("smolvmpools", "", "CREATE", &fixtures::user(), &bad, None);
    let (_, body) = post(&mut conn, "/validate/smolvmpools", &req).await;
    assert_eq!(body["response"]["allowed"], false, "{body}");
    let message = body["response"]["status"]["message"].as_str().unwrap_or_default();
    for expected in [
        "spec.template.image",
        "spec.template.resources.cpus",
        "spec.slotsPerNode",
    ] {
        assert!(message.contains(expected), "{expected:?} in {message}");
    }
    let good = serde_json::to_value(fixtures::pool(
        "fine",
        json!({"template": {"image": "alpine"}, "slotsPerNode": 2}),
    ))
    .unwrap_or_default();
    let req = review("smolvmpools", "", "CREATE", &fixtures::user(), &good, None);
    let (_, body) = post(&mut conn, "/validate/smolvmpools", &req).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
}

/// M5 and V17 over the wire: a branch comes back filled from its source in the webhook's cache
/// (its own env and ports only, labelled with the source); one that sets what it takes from its
/// source is refused naming every such field; an unknown source is refused with the namespace's
/// branchable SmolVMs, and no image finding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_over_the_wire() {
    use kube::runtime::{reflector, watcher};
    let mut source = fixtures::smolvm(
        "prepared",
        json!({"image": "python:3.12-slim", "branchable": true, "resources": {"cpus": 2},
               "network": {"enabled": true, "exposeService": true,
                           "ports": [{"hostPort": 18080, "guestPort": 8000, "protocol": "TCP"}]}}),
    );
    source["metadata"]["uid"] = json!("5b0c6a1e-8d2f-4c3b-9a7e-1f0d2c3b4a59");
    let source: smolvm_api::SmolVM = serde_json::from_value(source).unwrap_or_else(|e| panic!("decodes: {e}"));
    let (store, mut writer) = reflector::store::<smolvm_api::SmolVM>();
    writer.apply_watcher_event(&watcher::Event::Apply(source));
    let h = Harness::start_with(nodes(), |state| {
        state.sources = std::sync::Arc::new(smolvm_webhook::state::Sources {
            store: Some(store),
            client: None,
        })
    })
    .await;
    let mut conn = h.connect(Version::Http1).await;

    let branch = fixtures::smolvm(
        "task-1",
        json!({"branchOf": {"name": "prepared"}, "env": [{"name": "TASK", "value": "1"}]}),
    );
    let object = defaulted(&mut conn, &branch).await;
    assert_eq!(object["spec"]["image"], "python:3.12-slim");
    assert_eq!(
        object["spec"]["resources"],
        json!({"cpus": 2, "memoryMiB": 512}),
        "M1 after M5"
    );
    assert_eq!(object["spec"]["env"], json!([{"name": "TASK", "value": "1"}]));
    assert_eq!(object["spec"]["network"].get("ports"), None, "no port of its own: none");
    assert_eq!(
        object["spec"]["network"]["exposeService"], false,
        "no Service without ports"
    );
    assert_eq!(object["spec"].get("branchable"), None);
    assert_eq!(object["metadata"]["labels"]["vm.smolvm.dev/branch-of"], "prepared");
    let req = review("smolvms", "", "CREATE", &fixtures::user(), &object, None);
    let (_, body) = post(&mut conn, "/validate/smolvms", &req).await;
    assert_eq!(body["response"]["allowed"], true, "the filled branch is valid: {body}");

    let greedy = fixtures::smolvm(
        "task-2",
        json!({"branchOf": {"name": "prepared"}, "image": "alpine", "resources": {"cpus": 999}}),
    );
    let message = refused(&mut conn, &greedy).await;
    for expected in [
        "spec.image: is set (\"alpine\")",
        "spec.resources: is set (1 field(s))",
        "[V17]",
        "[V2]",
    ] {
        assert!(message.contains(expected), "{expected:?} in {message}");
    }

    let unknown = fixtures::smolvm("task-3", json!({"branchOf": {"name": "gone"}}));
    let message = refused(&mut conn, &unknown).await;
    assert!(
        message.contains("spec.branchOf.name") && message.contains("prepared") && !message.contains("spec.image"),
        "{message}"
    );

    let labelled = defaulted(
        &mut conn,
        &fixtures::smolvm("source-2", json!({"image": "alpine", "branchable": true})),
    )
    .await;
    assert_eq!(labelled["metadata"]["labels"]["vm.smolvm.dev/branchable"], "true");
}
