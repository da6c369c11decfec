//! The committed CRD YAML matches the Rust types, and the CRDs are structural.

use std::path::PathBuf;

use serde_json::Value;
use smolvm_api::crd;

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds")
}

#[test]
fn committed_crds_match_the_generated_ones() {
    let rendered = crd::render().unwrap();
    assert_eq!(rendered.len(), 4);
    for (name, body) in rendered {
        let path = crds_dir().join(&name);
        let committed =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}; run `make generate`", path.display()));
        assert!(
            committed == body,
            "{} differs from the generated CRD; run `make generate` and commit the result",
            path.display()
        );
    }
}

/// Structural schema rules (apiextensions v1): every node has a type (or x-kubernetes-int-or-string /
/// preserve-unknown-fields), no `$ref`, and no forbidden keywords outside their allowed places.
fn assert_structural(schema: &Value, path: &str) {
    let obj = schema
        .as_object()
        .unwrap_or_else(|| panic!("{path}: schema is not an object"));
    assert!(!obj.contains_key("$ref"), "{path}: $ref is not allowed");
    for forbidden in ["anyOf", "oneOf", "allOf", "not", "definitions", "$schema"] {
        // Allowed in value validations only when they do not set types; the generator never needs them.
        assert!(
            !obj.contains_key(forbidden),
            "{path}: {forbidden} makes the schema non-structural here"
        );
    }
    let has_type = obj.contains_key("type")
        || obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    assert!(has_type, "{path}: every schema node needs a type");
    assert!(
        obj.contains_key("description") || path.ends_with("[*]") || path.is_empty() || path.contains("conditions"),
        "{path}: every field needs a description for kubectl explain"
    );
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            if path.is_empty() && (k == "apiVersion" || k == "kind" || k == "metadata") {
                continue;
            }
            assert_structural(v, &format!("{path}.{k}"));
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = obj.get(key).filter(|v| v.is_object()) {
            assert_structural(v, &format!("{path}[*]"));
        }
    }
}

#[test]
fn crds_are_structural_and_documented() {
    let crds = crd::crds();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        assert_eq!(crd.spec.versions.len(), 1, "{name}");
        let version = &crd.spec.versions[0];
        // A SmolVMClass is pure configuration: no status.
        let has_status = version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some();
        assert_eq!(
            has_status,
            crd.spec.names.kind != "SmolVMClass",
            "{name}: status subresource"
        );
        let schema =
            serde_json::to_value(version.schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap();
        assert_structural(&schema, "");
        assert!(
            crd.spec.names.short_names.as_ref().is_some_and(|s| !s.is_empty()),
            "{name}: short name"
        );
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["smolvm-all".to_string()][..]),
            "{name}: category"
        );
        // kubectl expands a category before it resolves a resource name: a category spelled like
        // a singular, plural or short name makes `kubectl delete smolvm x` fail with "you must
        // specify only one resource" (seen on a real API server).
        for category in crd.spec.names.categories.iter().flatten() {
            for crd2 in &crds {
                let n = &crd2.spec.names;
                let names = [Some(&n.plural), n.singular.as_ref()]
                    .into_iter()
                    .flatten()
                    .chain(n.short_names.iter().flatten());
                for taken in names {
                    assert_ne!(category, taken, "{name}: category {category} shadows a resource name");
                }
            }
        }
        let columns: Vec<String> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .filter(|c| c.priority.is_none())
            .map(|c| c.name.clone())
            .collect();
        let expected: &[&str] = match name.split('.').next().unwrap_or_default() {
            "smolvms" => &["Phase", "Node", "CPUs", "Memory", "Suspended", "Age"],
            "smolvmclasses" => &["CPUs", "Memory", "Storage", "Default", "Age"],
            "smolvmpools" => &["Slots/Node", "Ready", "Total", "When Empty", "Age"],
            _ => &[
                "Ready",
                "Endpoint",
                "Bootable",
                "Boot-ms",
                "CPUs",
                "Memory",
                "Runtime",
                "Heartbeat",
                "Age",
            ],
        };
        assert_eq!(columns, expected, "{name}: printer columns");
    }
}
