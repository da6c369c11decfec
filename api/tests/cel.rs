//! The CRDs' CEL rules (x-kubernetes-validations), evaluated offline with kube's `cel` feature.
//!
//! These are the rules that keep the API safe while the webhook is down. A real API server is the
//! final judge of a CRD (its cost estimator is stricter); the e2e tier installs these CRDs there.

use kube::{
    CustomResourceExt,
    core::cel::{Validator, WarningKind, compile_schema, estimate_rule_cost},
};
use serde_json::{Value, json};
use smolvm_api::{SmolVM, SmolVMNode, fixtures};

fn schema_of<K: CustomResourceExt>() -> Value {
    let crd = K::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

/// Every (rule, schema it is attached to) pair in a schema.
fn rules(schema: &Value, path: String, out: &mut Vec<(String, String, Value)>) {
    if let Some(list) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
        for rule in list {
            out.push((path.clone(), rule["rule"].as_str().unwrap().to_string(), schema.clone()));
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            rules(v, format!("{path}.{k}"), out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = schema.get(key).filter(|v| v.is_object()) {
            rules(v, format!("{path}[*]"), out);
        }
    }
}

#[test]
fn cel_rules_compile_and_stay_within_the_cost_budget() {
    for (kind, schema) in [
        ("SmolVM", schema_of::<SmolVM>()),
        ("SmolVMNode", schema_of::<SmolVMNode>()),
        ("SmolVMPool", schema_of::<smolvm_api::SmolVMPool>()),
    ] {
        let compiled = compile_schema(&schema);
        assert!(!compiled.has_errors(), "{kind}: {:?}", compiled.compilation_errors());
        let mut found = Vec::new();
        rules(&schema, String::new(), &mut found);
        for (path, rule, sub) in &found {
            let compiled = compile_schema(sub);
            let warnings = estimate_rule_cost(rule, &compiled);
            let bad: Vec<_> = warnings
                .iter()
                .filter(|w| matches!(w.kind, WarningKind::CostExceeded | WarningKind::MissingBounds))
                .collect();
            assert!(bad.is_empty(), "{kind}{path}: rule {rule:?}: {bad:?}");
        }
        println!(
            "{kind}: {} CEL rules compile, none over budget or unbounded",
            found.len()
        );
    }
    // Guard against the rules silently disappearing from the generated schema.
    let mut found = Vec::new();
    rules(&schema_of::<SmolVM>(), String::new(), &mut found);
    assert!(
        found.len() >= 14,
        "expected every SmolVM CEL rule, found {}",
        found.len()
    );
}

fn stored() -> Value {
    fixtures::stored_alpine().expect("the fixture defaults")
}

fn set(v: Value, pointer: &str, value: Value) -> Value {
    fixtures::with(v, pointer, value).unwrap_or_else(|| panic!("no {pointer}"))
}

fn check(schema: &Value, object: &Value, old: Option<&Value>) -> Result<(), Vec<String>> {
    Validator::new().validate(schema, object, old).map_err(|errors| {
        errors
            .into_vec()
            .into_iter()
            .map(|e| format!("{}: {}", e.field_path, e.message))
            .collect()
    })
}

#[test]
fn cel_create_rules_table() {
    let schema = schema_of::<SmolVM>();
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        ("v1_cel_oci_image_ok", stored(), None),
        (
            "v1_cel_local_image_ok",
            set(stored(), "/spec/image", json!("local:alpine")),
            None,
        ),
        (
            "v1_cel_bad_local_image",
            set(stored(), "/spec/image", json!("local:../etc")),
            Some("(V1)"),
        ),
        (
            "v1_cel_whitespace_image",
            set(stored(), "/spec/image", json!("alpine latest")),
            Some("(V1)"),
        ),
        (
            "v1_cel_full_oci_reference_ok",
            set(
                stored(),
                "/spec/image",
                json!(format!(
                    "registry.example.com:5000/org/app_x:v1.2@sha256:{}",
                    "a".repeat(64)
                )),
            ),
            None,
        ),
        (
            "v1_cel_image_absent",
            {
                let mut v = stored();
                v["spec"].as_object_mut().unwrap().remove("image");
                v
            },
            Some("spec.image is required"),
        ),
        (
            "v1_cel_registry_with_port_ok",
            set(stored(), "/spec/image", json!("localhost:1/none:latest")),
            None,
        ),
        (
            "v1_cel_upper_case_path",
            set(stored(), "/spec/image", json!("Alpine")),
            Some("an image is an OCI reference"),
        ),
        (
            "v1_cel_empty_tag",
            set(stored(), "/spec/image", json!("alpine:")),
            Some("an image is an OCI reference"),
        ),
        (
            "v1_cel_empty_path_component",
            set(stored(), "/spec/image", json!("a//b")),
            Some("an image is an OCI reference"),
        ),
        (
            "v3_cel_ports_need_network",
            set(stored(), "/spec/network/enabled", json!(false)),
            Some("ports need network.enabled"),
        ),
        (
            "v3_cel_cidrs_need_network",
            set(
                set(
                    stored(),
                    "/spec/network",
                    json!({"enabled": false, "allowedCIDRs": ["10.0.0.0/8"]}),
                ),
                "/spec/running",
                json!(true),
            ),
            Some("allowedCIDRs need network.enabled"),
        ),
        (
            "v3_cel_bad_cidr",
            set(stored(), "/spec/network/allowedCIDRs", json!(["10.0.0.0/33"])),
            Some("(V3)"),
        ),
        (
            "v3_cel_good_cidr",
            set(
                stored(),
                "/spec/network/allowedCIDRs",
                json!(["10.0.0.0/8", "2001:db8::/32"]),
            ),
            None,
        ),
        (
            "v4_cel_bad_node_name",
            set(stored(), "/spec/nodeName", json!("Node_1")),
            Some("(V4)"),
        ),
        (
            "v4_cel_good_node_name",
            set(stored(), "/spec/nodeName", json!("node-1.example")),
            None,
        ),
        (
            "v4_cel_bad_selector_key",
            set(stored(), "/spec/nodeSelector", json!({"bad key": "x"})),
            Some("(V4)"),
        ),
        (
            "v4_cel_bad_selector_value",
            set(stored(), "/spec/nodeSelector", json!({"arch": "-x"})),
            Some("(V4)"),
        ),
        (
            "v11_cel_relative_working_dir",
            set(stored(), "/spec/workingDir", json!("srv")),
            Some("workingDir must be an absolute path (V11)"),
        ),
        (
            "v11_cel_absolute_working_dir_ok",
            set(stored(), "/spec/workingDir", json!("/srv")),
            None,
        ),
        (
            "v11_cel_env_value_and_value_from",
            set(
                stored(),
                "/spec/env",
                json!([{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
            ),
            Some("exactly one of value and valueFrom (V11)"),
        ),
        (
            "v11_cel_env_neither_value_nor_value_from",
            set(stored(), "/spec/env", json!([{"name": "A"}])),
            Some("exactly one of value and valueFrom (V11)"),
        ),
        (
            "v11_cel_value_from_two_refs",
            set(
                stored(),
                "/spec/env",
                json!([{"name": "A", "valueFrom": {
                    "secretKeyRef": {"name": "s", "key": "k"},
                    "configMapKeyRef": {"name": "c", "key": "k"}}}]),
            ),
            Some("exactly one of secretKeyRef and configMapKeyRef (V11)"),
        ),
        (
            "v11_cel_env_name_with_equals",
            set(stored(), "/spec/env", json!([{"name": "A=B", "value": "1"}])),
            Some("must not contain '=' (V11)"),
        ),
        (
            "v11_cel_bad_key",
            set(
                stored(),
                "/spec/env",
                json!([{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "a/b"}}}]),
            ),
            Some("a key is made of letters, digits"),
        ),
        (
            "v11_cel_env_from_secret_and_config_map_ok",
            set(
                stored(),
                "/spec/env",
                json!([
                    {"name": "A", "value": ""},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token.txt", "optional": true}}},
                    {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "mode"}}},
                ]),
            ),
            None,
        ),
        (
            "v11_cel_allowed_hosts_need_network",
            set(
                stored(),
                "/spec/network",
                json!({"enabled": false, "allowedHosts": ["example.com"]}),
            ),
            Some("allowedHosts need network.enabled: true (V11)"),
        ),
        (
            "v11_cel_allowed_hosts_with_network_ok",
            set(
                stored(),
                "/spec/network",
                json!({"enabled": true, "allowedHosts": ["example.com"]}),
            ),
            None,
        ),
        (
            "v5_cel_pin_must_equal_binding",
            set(fixtures::bound(stored(), "node-a"), "/spec/nodeName", json!("node-b")),
            Some("(V5)"),
        ),
        (
            "v5_cel_pin_equal_to_binding_ok",
            set(fixtures::bound(stored(), "node-a"), "/spec/nodeName", json!("node-a")),
            None,
        ),
        (
            "v16_cel_four_sources_ok",
            set(
                stored(),
                "/spec/volumes",
                json!([
                    {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "db"}},
                    {"name": "scratch", "mountPath": "/scratch", "claimTemplate": {"spec": {
                        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}},
                    {"name": "config", "mountPath": "/etc/app", "configMap": {"name": "c"}},
                    {"name": "tls", "mountPath": "/etc/tls", "secret": {"secretName": "s"}}
                ]),
            ),
            None,
        ),
        (
            "v16_cel_two_sources",
            set(
                stored(),
                "/spec/volumes",
                json!([{"name": "a", "mountPath": "/a", "configMap": {"name": "c"}, "secret": {"secretName": "s"}}]),
            ),
            Some("exactly one of persistentVolumeClaim"),
        ),
        (
            "v16_cel_no_source",
            set(stored(), "/spec/volumes", json!([{"name": "a", "mountPath": "/a"}])),
            Some("exactly one of persistentVolumeClaim"),
        ),
        (
            "v16_cel_root_mount_path",
            set(
                stored(),
                "/spec/volumes",
                json!([{"name": "a", "mountPath": "/", "configMap": {"name": "c"}}]),
            ),
            Some("other than / (V16)"),
        ),
        (
            "v16_cel_bad_volume_name",
            set(
                stored(),
                "/spec/volumes",
                json!([{"name": "A_b", "mountPath": "/a", "configMap": {"name": "c"}}]),
            ),
            Some("DNS-1123 label"),
        ),
        (
            "v16_cel_same_mount_path",
            set(
                stored(),
                "/spec/volumes",
                json!([
                    {"name": "a", "mountPath": "/a", "configMap": {"name": "c"}},
                    {"name": "b", "mountPath": "/a", "configMap": {"name": "d"}}
                ]),
            ),
            Some("its own mountPath (V16)"),
        ),
        (
            "v16_cel_block_template",
            set(
                stored(),
                "/spec/volumes",
                json!([{"name": "a", "mountPath": "/a", "claimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Block"}}}]),
            ),
            Some("volumeMode Block is refused (V16)"),
        ),
        (
            "v16_cel_template_without_access_modes_or_storage",
            set(
                stored(),
                "/spec/volumes",
                json!([{"name": "a", "mountPath": "/a", "claimTemplate": {"spec": {}}}]),
            ),
            Some("names its access modes"),
        ),
        (
            "v16_cel_template_without_storage",
            set(
                stored(),
                "/spec/volumes",
                json!([{"name": "a", "mountPath": "/a", "claimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}]),
            ),
            Some("names a storage request"),
        ),
    ];
    let mut failures = Vec::new();
    for (name, object, expected) in cases {
        let result = check(&schema, &object, None);
        match (expected, &result) {
            (None, Ok(())) => {}
            (Some(text), Err(errors)) if errors.iter().any(|e| e.contains(text)) => {}
            _ => failures.push(format!("{name}: expected {expected:?}, got {result:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cel_transition_rules_table() {
    let schema = schema_of::<SmolVM>();
    let bound = fixtures::bound(stored(), "node-a");
    let unbound = stored();
    let cases: Vec<(&str, Value, Value, Option<&str>)> = vec![
        (
            "v9_cel_node_name_change",
            bound.clone(),
            set(bound.clone(), "/status/nodeName", json!("node-b")),
            Some("(V9)"),
        ),
        (
            "v9_cel_node_uid_change",
            bound.clone(),
            set(bound.clone(), "/status/nodeUID", json!("x")),
            Some("(V9)"),
        ),
        (
            "v9_cel_binding_without_node_uid",
            unbound.clone(),
            {
                let mut v = bound.clone();
                v["status"].as_object_mut().unwrap().remove("nodeUID");
                v
            },
            Some("written together (V9)"),
        ),
        (
            "v9_cel_binding_to_a_bad_node_name",
            unbound.clone(),
            set(bound.clone(), "/status/nodeName", json!("Node_A")),
            Some("DNS-1123 subdomain (V9)"),
        ),
        (
            "v9_cel_machine_name_retargeted",
            bound.clone(),
            set(bound.clone(), "/status/machineName", json!("svm-someone-else")),
            Some("machineName never changes or clears once set (V9)"),
        ),
        (
            "v9_cel_machine_name_cleared",
            bound.clone(),
            {
                let mut v = bound.clone();
                v["status"].as_object_mut().unwrap().remove("machineName");
                v
            },
            Some("machineName never changes or clears once set (V9)"),
        ),
        (
            "v9_cel_machine_name_without_prefix",
            unbound.clone(),
            {
                let mut v = bound.clone();
                v["status"]["machineName"] = json!("other-machine");
                v
            },
            Some("svm-<metadata.uid> (V9)"),
        ),
        (
            "v9_cel_node_name_cleared",
            bound.clone(),
            {
                let mut v = bound.clone();
                v["status"].as_object_mut().unwrap().remove("nodeName");
                v
            },
            Some("(V9)"),
        ),
        // Spec transitions (V6, V12, V14) are the ValidatingAdmissionPolicy
        // smolvm-spec-transitions (webhook/tests/manifests.rs judges it), off the CRD so that the
        // API server does not evaluate them on every status write: the CRD lets them through.
        (
            "v6_is_the_policys_not_the_crds",
            bound.clone(),
            set(bound.clone(), "/spec/image", json!("alpine:3")),
            None,
        ),
    ];
    let mut failures = Vec::new();
    for (name, old, new, expected) in cases {
        let result = check(&schema, &new, Some(&old));
        match (expected, &result) {
            (None, Ok(())) => {}
            (Some(text), Err(errors)) if errors.iter().any(|e| e.contains(text)) => {}
            _ => failures.push(format!("{name}: expected {expected:?}, got {result:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn v10_cel_endpoint_address() {
    let schema = schema_of::<SmolVMNode>();
    let node = |address: &str| {
        json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode", "metadata": {"name": "n"}, "spec": {},
               "status": {"endpoint": {"address": address, "port": 9443}}})
    };
    assert!(check(&schema, &node("10.0.0.1"), None).is_ok());
    assert!(check(&schema, &node("fd00::1"), None).is_ok());
    assert!(check(&schema, &node("node-1.example.com"), None).is_ok());
    let err = check(&schema, &node("not an address"), None).unwrap_err();
    assert!(err.iter().any(|e| e.contains("(V10)")), "{err:?}");
}

mod never_stricter_than_the_webhook {
    //! The CEL image rule is a coarse net for when the webhook is down; it must never refuse an
    //! image the webhook's V1 check accepts.

    use proptest::prelude::*;
    use serde_json::json;
    use smolvm_api::{SmolVM, syntax::parse_image};

    use super::{check, schema_of, set, stored};

    static SCHEMA: std::sync::LazyLock<serde_json::Value> = std::sync::LazyLock::new(schema_of::<SmolVM>);

    fn component() -> impl Strategy<Value = String> {
        "[a-z0-9]{1,4}((\\.|_|__|-{1,2})[a-z0-9]{1,4}){0,2}"
    }

    fn reference() -> impl Strategy<Value = String> {
        let domain = prop_oneof![
            Just(String::new()),
            Just("localhost/".to_string()),
            "[A-Za-z0-9]{1,6}(\\.[a-z0-9-]{0,4}[a-z0-9]){1,2}(:[0-9]{1,5})?/",
            "localhost:[0-9]{1,5}/",
        ];
        let tag = prop_oneof![Just(String::new()), ":[A-Za-z0-9_][A-Za-z0-9_.-]{0,10}"];
        let digest = prop_oneof![
            Just(String::new()),
            "@sha256:[0-9a-f]{64}",
            "@[a-z][a-z0-9+._-]{0,4}:[0-9a-f]{32,40}"
        ];
        (domain, prop::collection::vec(component(), 1..4), tag, digest)
            .prop_map(|(d, path, t, g)| format!("{d}{}{t}{g}", path.join("/")))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn v1_cel_accepts_every_image_the_webhook_accepts(image in reference()) {
            prop_assume!(parse_image(&image).is_ok());
            let object = set(stored(), "/spec/image", json!(image));
            let verdict = check(&SCHEMA, &object, None);
            prop_assert!(verdict.is_ok(), "{image}: {verdict:?}");
        }
    }
}
