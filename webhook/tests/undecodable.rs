//! Every violation in one answer, also for values that do not decode (issue 30): the real
//! server over TLS, AdmissionReview v1 bodies as kube-apiserver sends them (HTTP/2), and objects
//! with unknown enum values and wrong types beside other violations. Each field that does not
//! decode is one violation at its path, listed with the others, at `/mutate` and `/validate`
//! alike.

mod common;

use common::*;
use serde_json::{Value, json};
use smolvm_api::fixtures;
use smolvm_webhook_bench::client::Version;

fn nodes() -> Vec<smolvm_api::SmolVMNode> {
    vec![fixtures::node("node-a", 8, 16_384, 500)]
}

/// A case: name, resource, object, and the (path, text) each violation of the answer must have.
type Case = (
    &'static str,
    &'static str,
    Value,
    &'static [(&'static str, &'static str)],
);

fn cases() -> Vec<Case> {
    vec![
        (
            "unknown restartPolicy, relative workingDir, duplicate env name",
            "smolvms",
            fixtures::smolvm(
                "issue-30",
                json!({"image": "alpine:latest", "restartPolicy": "Sometimes", "workingDir": "rel",
                    "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
            ),
            &[
                (
                    "spec.restartPolicy",
                    r#"Unsupported value: "Sometimes": supported values: "Always", "OnFailure", "Never" [schema]"#,
                ),
                ("spec.workingDir", "[V11]"),
                ("spec.env[1].name", "[V11]"),
            ],
        ),
        (
            "wrong types beside a bound and a bad image",
            "smolvms",
            fixtures::smolvm(
                "types",
                json!({"image": "Alpine Latest", "resources": {"cpus": "two", "memoryMiB": 1},
                    "network": {"enabled": true, "ports": [{"hostPort": 8080, "guestPort": 80, "protocol": "SCTP"}]},
                    "terminationGracePeriodSeconds": "ten"}),
            ),
            &[
                (
                    "spec.resources.cpus",
                    r#"Invalid value: "two": must be an integer (int32) [schema]"#,
                ),
                ("spec.resources.memoryMiB", "[V2]"),
                (
                    "spec.network.ports[0].protocol",
                    r#"Unsupported value: "SCTP": supported values: "TCP", "UDP" [schema]"#,
                ),
                (
                    "spec.terminationGracePeriodSeconds",
                    r#"Invalid value: "ten": must be an integer (int64) [schema]"#,
                ),
                ("spec.image", "[V1]"),
            ],
        ),
        (
            "a class with an unknown restartPolicy and a wrong type beside a bound",
            "smolvmclasses",
            fixtures::class_json(
                "odd",
                json!({"restartPolicy": "Sometimes", "resources": {"cpus": 4096, "memoryMiB": "lots"}}),
                false,
            ),
            &[
                ("spec.restartPolicy", "Unsupported value: \"Sometimes\""),
                ("spec.resources.memoryMiB", "Invalid value: \"lots\""),
                ("spec.resources.cpus", "[V2]"),
            ],
        ),
    ]
}

/// The violations of a denial's message (one per `; `-separated part), each checked against the
/// expected (path, text) pairs: every pair is there, and nothing else.
fn check_denial(name: &str, path: &str, body: &Value, expected: &[(&str, &str)]) {
    let response = &body["response"];
    assert_eq!(response["allowed"], false, "{name} {path}: {body}");
    assert!(
        response.get("patch").is_none(),
        "{name} {path}: a denial carries no patch"
    );
    assert_eq!(response["status"]["code"], 422, "{name} {path}: {body}");
    assert_eq!(response["status"]["reason"], "Invalid", "{name} {path}: {body}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    let parts: Vec<&str> = message.split("; ").collect();
    for (field, text) in expected {
        assert!(
            parts
                .iter()
                .any(|p| p.starts_with(&format!("{field}: ")) && p.contains(text)),
            "{name} {path}: no violation at {field} saying {text:?} in:\n{message}"
        );
    }
    assert_eq!(
        parts.len(),
        expected.len(),
        "{name} {path}: one violation per field:\n{message}"
    );
    println!("{name} at {path}:\n  {}", parts.join("\n  "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_values_are_listed_with_every_other_violation() {
    let h = Harness::start(nodes()).await;
    for version in [Version::Http2, Version::Http1] {
        let mut conn = h.connect(version).await;
        for (name, resource, object, expected) in cases() {
            let req = review(resource, "", "CREATE", &fixtures::user(), &object, None);
            let paths: &[&str] = match resource {
                "smolvms" => &["/mutate/smolvms", "/validate/smolvms"],
                _ => &["/validate/smolvmclasses"],
            };
            let mut answers = Vec::new();
            for path in paths {
                let (status, body) = post(&mut conn, path, &req).await;
                assert_eq!(status, 200, "{version:?} {name} {path}: {body}");
                check_denial(name, path, &body, expected);
                answers.push(body["response"]["status"].clone());
            }
            // /mutate and /validate say the same, word for word.
            assert!(answers.windows(2).all(|w| w[0] == w[1]), "{name}: {answers:?}");
        }
    }
    // Counted as rejections of the schema and the other rules.
    let (_, metrics) = h.ops_get("/metrics").await;
    for rule in ["schema", "V1", "V2", "V11"] {
        assert!(
            metrics.contains(&format!("smolvm_webhook_rejections_total{{rule=\"{rule}\"}}")),
            "{rule}\n{metrics}"
        );
    }
}
