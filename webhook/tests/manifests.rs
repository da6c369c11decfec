//! The webhook configuration manifests (deploy/base/webhook): their shape, and their
//! matchConditions CEL evaluated offline with kube's `cel` feature (kube-cel). A real API server
//! remains the final judge of the CEL; this checks the logic on the cases that matter.

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::core::cel::{AdmissionRequest, VapEvaluator, VapExpression};
use serde::Deserialize;
use serde_json::{Value, json};
use smolvm_api::fixtures;

fn manifests() -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/webhook/webhook-configurations.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut docs = serde_yaml::Deserializer::from_str(&text);
    let m = MutatingWebhookConfiguration::deserialize(docs.next().unwrap_or_else(|| panic!("no document")))
        .unwrap_or_else(|e| panic!("mutating: {e}"));
    let v = ValidatingWebhookConfiguration::deserialize(docs.next().unwrap_or_else(|| panic!("no document")))
        .unwrap_or_else(|e| panic!("validating: {e}"));
    (m, v)
}

#[test]
fn webhook_configurations_have_the_required_shape() {
    let (m, v) = manifests();
    let mut resources = Vec::new();
    let mutating = m.webhooks.unwrap_or_default();
    let validating = v.webhooks.unwrap_or_default();
    assert_eq!(mutating.len(), 1);
    assert_eq!(validating.len(), 2);
    for w in &mutating {
        assert_eq!(w.reinvocation_policy.as_deref(), Some("IfNeeded"), "{}", w.name);
    }
    let all = mutating
        .iter()
        .map(|w| {
            (
                &w.name,
                &w.failure_policy,
                &w.side_effects,
                w.timeout_seconds,
                &w.admission_review_versions,
                &w.rules,
                &w.match_conditions,
                &w.client_config,
            )
        })
        .chain(validating.iter().map(|w| {
            (
                &w.name,
                &w.failure_policy,
                &w.side_effects,
                w.timeout_seconds,
                &w.admission_review_versions,
                &w.rules,
                &w.match_conditions,
                &w.client_config,
            )
        }));
    for (name, failure, side_effects, timeout, versions, rules, conditions, client) in all {
        assert_eq!(failure.as_deref(), Some("Fail"), "{name}");
        assert_eq!(side_effects, "None", "{name}");
        assert!(timeout.is_some_and(|t| (1..=5).contains(&t)), "{name}");
        assert_eq!(versions, &vec!["v1".to_string()], "{name}");
        assert_eq!(
            conditions.as_ref().map(Vec::len),
            Some(1),
            "{name}: the finalizer exemption"
        );
        let service = client.service.as_ref().unwrap_or_else(|| panic!("{name}: service"));
        assert_eq!(
            (service.name.as_str(), service.namespace.as_str(), service.port),
            ("smolvm-webhook", "smolvm-system", Some(443))
        );
        for rule in rules.iter().flatten() {
            let ops = rule.operations.clone().unwrap_or_default();
            assert!(!ops.iter().any(|o| o == "DELETE" || o == "*"), "{name}: {ops:?}");
            assert!(ops.contains(&"CREATE".to_string()) && ops.contains(&"UPDATE".to_string()));
            resources.extend(rule.resources.clone().unwrap_or_default());
        }
    }
    for r in ["smolvms", "smolvms/status", "smolvmnodes", "smolvmnodes/status"] {
        assert!(resources.iter().any(|x| x == r), "{r} not covered");
    }
    let paths: Vec<_> = mutating
        .iter()
        .map(|w| w.client_config.service.as_ref().and_then(|s| s.path.clone()))
        .chain(
            validating
                .iter()
                .map(|w| w.client_config.service.as_ref().and_then(|s| s.path.clone())),
        )
        .collect();
    assert_eq!(
        paths,
        vec![
            Some("/mutate/smolvms".into()),
            Some("/validate/smolvms".into()),
            Some("/validate/smolvmnodes".into())
        ]
    );
}

fn calls_webhook(expression: &str, op: &str, object: &Value, old: Option<&Value>) -> bool {
    let mut builder = VapEvaluator::builder()
        .object(object.clone())
        .request(AdmissionRequest {
            operation: op.into(),
            ..Default::default()
        });
    if let Some(old) = old {
        builder = builder.old_object(old.clone());
    }
    let results = builder.build().evaluate(&[VapExpression {
        expression: expression.to_string(),
        message: None,
        message_expression: None,
    }]);
    assert_eq!(results.len(), 1);
    if let Some(message) = &results[0].message {
        assert!(!message.contains("rror"), "evaluation error: {message}");
    }
    results[0].passed
}

#[test]
fn match_condition_never_sends_finalizer_removal() {
    let (m, v) = manifests();
    let mut expressions: Vec<String> = m
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .flat_map(|w| w.match_conditions.unwrap_or_default())
        .chain(
            v.webhooks
                .unwrap_or_default()
                .into_iter()
                .flat_map(|w| w.match_conditions.unwrap_or_default()),
        )
        .map(|c| c.expression)
        .collect();
    expressions.dedup();
    assert_eq!(expressions.len(), 1, "the same exemption everywhere");
    let expr = &expressions[0];

    let live = fixtures::bound(fixtures::alpine(), "node-a");
    let deleting = fixtures::deleting(live.clone());
    let mut released = deleting.clone();
    released["metadata"]["finalizers"] = json!([]);
    let mut released_absent = deleting.clone();
    if let Some(meta) = released_absent["metadata"].as_object_mut() {
        meta.remove("finalizers");
    }
    let mut released_and_spec = released.clone();
    released_and_spec["spec"]["image"] = json!("evil:latest");
    let mut released_and_annotated = released.clone();
    released_and_annotated["metadata"]["annotations"] = json!({"vm.smolvm.dev/force-delete-local-state": "true"});
    let mut live_finalizer_removed = live.clone();
    live_finalizer_removed["metadata"]["finalizers"] = json!([]);
    let mut live_with_finalizer = live.clone();
    live_with_finalizer["metadata"]["finalizers"] = json!(["vm.smolvm.dev/node-cleanup"]);
    let node = serde_json::to_value(fixtures::node("node-a", 4, 4096, 100)).unwrap_or_default();

    // (case, operation, object, oldObject, webhook called?)
    let table: Vec<(&str, &str, &Value, Option<&Value>, bool)> = vec![
        ("create", "CREATE", &live, None, true),
        ("ordinary update", "UPDATE", &live, Some(&live), true),
        (
            "finalizer removal while deleting: exempt",
            "UPDATE",
            &released,
            Some(&deleting),
            false,
        ),
        (
            "finalizers field dropped while deleting: exempt",
            "UPDATE",
            &released_absent,
            Some(&deleting),
            false,
        ),
        (
            "finalizer removal plus spec change: checked",
            "UPDATE",
            &released_and_spec,
            Some(&deleting),
            true,
        ),
        (
            "finalizer removal plus annotation: checked",
            "UPDATE",
            &released_and_annotated,
            Some(&deleting),
            true,
        ),
        (
            "other update while deleting: checked",
            "UPDATE",
            &deleting,
            Some(&deleting),
            true,
        ),
        (
            "finalizer removal on a live object: checked",
            "UPDATE",
            &live_finalizer_removed,
            Some(&live_with_finalizer),
            true,
        ),
        ("smolvmnode update", "UPDATE", &node, Some(&node), true),
    ];
    for (case, op, object, old, want) in table {
        assert_eq!(calls_webhook(expr, op, object, old), want, "{case}");
    }
}
