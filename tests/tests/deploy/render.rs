//! Rendering and strict typing.

use super::*;

/// The object as its k8s-openapi type, strictly; cert-manager objects structurally.
pub(super) fn check_typed(object: &Value) -> Result<(), String> {
    let api_version = str_at(object, "/apiVersion");
    let kind = str_at(object, "/kind");
    match (api_version, kind) {
        ("v1", "Namespace") => strict::<Namespace>(object).map(drop),
        ("v1", "ServiceAccount") => strict::<ServiceAccount>(object).map(drop),
        ("v1", "ConfigMap") => strict::<ConfigMap>(object).map(drop),
        ("v1", "Secret") => strict::<Secret>(object).map(drop),
        ("v1", "Service") => strict::<Service>(object).map(drop),
        ("apiregistration.k8s.io/v1", "APIService") => strict::<APIService>(object).map(drop),
        ("apps/v1", "Deployment") => strict::<Deployment>(object).map(drop),
        ("apps/v1", "DaemonSet") => strict::<DaemonSet>(object).map(drop),
        ("policy/v1", "PodDisruptionBudget") => strict::<PodDisruptionBudget>(object).map(drop),
        ("scheduling.k8s.io/v1", "PriorityClass") => strict::<PriorityClass>(object).map(drop),
        ("networking.k8s.io/v1", "NetworkPolicy") => strict::<NetworkPolicy>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => strict::<ClusterRole>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => strict::<ClusterRoleBinding>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "Role") => strict::<Role>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => strict::<RoleBinding>(object).map(drop),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            strict::<MutatingWebhookConfiguration>(object).map(drop)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            strict::<ValidatingAdmissionPolicy>(object).map(drop)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            strict::<ValidatingAdmissionPolicyBinding>(object).map(drop)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            strict::<ValidatingWebhookConfiguration>(object).map(drop)
        }
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => strict::<CustomResourceDefinition>(object).map(drop),
        ("cert-manager.io/v1", "Issuer") => check_shape(object, &issuer_shape(), &describe(object)),
        ("cert-manager.io/v1", "Certificate") => check_shape(object, &certificate_shape(), &describe(object)),
        _ => Err(format!(
            "{}: no type known for {api_version} {kind}; add one to check_typed",
            describe(object)
        )),
    }
}

pub(super) fn metadata_shape() -> Value {
    json!({"name": "string", "namespace": "string", "labels": "map", "annotations": "map"})
}

/// The cert-manager.io/v1 Issuer fields these manifests may use.
pub(super) fn issuer_shape() -> Value {
    json!({
        "apiVersion": "string", "kind": "string", "metadata": metadata_shape(),
        "spec": {"selfSigned": {"crlDistributionPoints": "strings"}, "ca": {"secretName": "string"}}
    })
}

/// The cert-manager.io/v1 Certificate fields these manifests may use.
pub(super) fn certificate_shape() -> Value {
    json!({
        "apiVersion": "string", "kind": "string", "metadata": metadata_shape(),
        "spec": {
            "secretName": "string", "commonName": "string", "isCA": "bool",
            "duration": "duration", "renewBefore": "duration",
            "dnsNames": "strings", "ipAddresses": "strings",
            "usages": ["signing", "digital signature", "content commitment", "key encipherment",
                       "key agreement", "data encipherment", "cert sign", "crl sign",
                       "encipher only", "decipher only", "any", "server auth", "client auth",
                       "code signing", "email protection", "s/mime", "ipsec end system",
                       "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
                       "microsoft sgc", "netscape sgc"],
            "privateKey": {
                "algorithm": ["RSA", "ECDSA", "Ed25519"], "size": "int",
                "rotationPolicy": ["Never", "Always"], "encoding": ["PKCS1", "PKCS8"]
            },
            "issuerRef": {"name": "string", "kind": ["Issuer", "ClusterIssuer"], "group": ["cert-manager.io"]}
        }
    })
}

/// Checks `value` against `shape`: an object lists the allowed keys; "string", "bool", "int",
/// "map" (of strings), "strings" (list of strings) and "duration" (Go, hours/minutes/seconds)
/// are leaf types; an array lists the allowed strings (a list value must use only those).
pub(super) fn check_shape(value: &Value, shape: &Value, path: &str) -> Result<(), String> {
    let fail = |what: &str| Err(format!("{path}: {what}, got {value}"));
    match shape {
        Value::Object(fields) => {
            let Some(map) = value.as_object() else {
                return fail("expected an object");
            };
            for (k, v) in map {
                let Some(s) = fields.get(k) else {
                    return Err(format!("{path}: unknown field {k:?}"));
                };
                check_shape(v, s, &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        Value::Array(allowed) => {
            let values: Vec<&Value> = match value {
                Value::Array(items) => items.iter().collect(),
                other => vec![other],
            };
            for v in values {
                if !allowed.contains(v) {
                    return Err(format!("{path}: {v} is not one of {shape}"));
                }
            }
            Ok(())
        }
        Value::String(leaf) => {
            let ok = match leaf.as_str() {
                "string" => value.is_string(),
                "bool" => value.is_boolean(),
                "int" => value.is_i64(),
                "map" => value.as_object().is_some_and(|m| m.values().all(Value::is_string)),
                "strings" => value.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
                "duration" => value.as_str().is_some_and(is_go_duration),
                other => panic!("bad shape leaf {other}"),
            };
            if ok { Ok(()) } else { fail(&format!("expected {leaf}")) }
        }
        other => panic!("bad shape {other}"),
    }
}

pub(super) fn is_go_duration(s: &str) -> bool {
    let mut digits = false;
    let mut any = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits = true;
        } else if matches!(c, 'h' | 'm' | 's') && digits {
            digits = false;
            any = true;
        } else {
            return false;
        }
    }
    any && !digits
}

#[test]
pub(super) fn every_kustomization_renders_and_every_object_is_strictly_typed() {
    require_kubectl!();
    let all = kustomizations();
    for overlay in OVERLAYS {
        assert!(all.iter().any(|k| k == overlay), "deploy/{overlay} is missing");
    }
    let mut failures = Vec::new();
    for name in &all {
        let objects = rendered(name);
        assert!(!objects.is_empty(), "deploy/{name} renders nothing");
        let mut seen = BTreeSet::new();
        for object in objects {
            if let Err(e) = check_typed(object) {
                failures.push(format!("deploy/{name}: {e}"));
            }
            assert!(
                seen.insert(describe(object)),
                "deploy/{name}: {} appears twice",
                describe(object)
            );
        }
        println!("deploy/{name}: {} objects, all strictly typed", objects.len());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
pub(super) fn strict_typing_names_an_unknown_field() {
    let mut deployment: Value = serde_json::to_value(Deployment::default()).expect("json");
    deployment["apiVersion"] = json!("apps/v1");
    deployment["kind"] = json!("Deployment");
    deployment["metadata"] = json!({"name": "x", "namespace": "ns"});
    deployment["spec"] = json!({
        "selector": {},
        "template": {"spec": {"containers": [{"name": "c", "imagePullPolicyy": "Always"}]}}
    });
    let error = check_typed(&deployment).expect_err("a misspelled field must fail");
    assert!(
        error.contains("Deployment ns/x") && error.contains("spec.template.spec.containers.0.imagePullPolicyy"),
        "{error}"
    );
    let mut certificate = json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"secretName": "s", "issuerRef": {"name": "i", "kind": "Issuer"}, "dnsName": ["x"]}
    });
    let error = check_typed(&certificate).expect_err("a misspelled cert-manager field must fail");
    assert!(error.contains("spec") && error.contains("dnsName"), "{error}");
    certificate["spec"] = json!({"secretName": "s", "duration": "90d"});
    assert!(check_typed(&certificate).is_err(), "90d is not a Go duration");
    let unknown = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
    assert!(check_typed(&unknown).is_err());
}

#[test]
pub(super) fn every_object_is_labelled_and_namespaced_in_smolvm_system() {
    require_kubectl!();
    for overlay in OVERLAYS {
        for object in rendered(overlay) {
            assert_eq!(
                str_at(object, "/metadata/labels/app.kubernetes.io~1part-of"),
                "smolvm-operator",
                "deploy/{overlay}: {} lacks app.kubernetes.io/part-of",
                describe(object)
            );
            let ns = str_at(object, "/metadata/namespace");
            // The one exception: reading the API server's front-proxy settings, which live in
            // kube-system, takes a Role and RoleBinding there (for that ConfigMap only).
            let reader = ns == "kube-system"
                && str_at(object, "/metadata/name") == "smolvm-controller-authentication-reader"
                && matches!(str_at(object, "/kind"), "Role" | "RoleBinding");
            assert!(
                ns.is_empty() || ns == NAMESPACE || reader,
                "deploy/{overlay}: {} is in namespace {ns}",
                describe(object)
            );
        }
    }
}

#[test]
pub(super) fn crds_in_the_install_are_the_generated_ones() {
    let kustomization: Value =
        serde_norway::from_str(&read("deploy/crds/kustomization.yaml")).expect("deploy/crds/kustomization.yaml");
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("a file name").to_string())
        .collect();
    let generated: BTreeSet<String> = smolvm_api::crd::render()
        .expect("render the CRDs")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        listed, generated,
        "deploy/crds/kustomization.yaml must list every generated CRD"
    );
    require_kubectl!();
    let want: BTreeSet<String> = smolvm_api::crd::crds()
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    for overlay in OVERLAYS {
        let got: BTreeSet<String> = objects(rendered(overlay), "CustomResourceDefinition")
            .map(|o| str_at(o, "/metadata/name").to_string())
            .collect();
        assert_eq!(got, want, "deploy/{overlay}");
    }
}
