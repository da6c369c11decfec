//! The review flow against the reference types: kube-core's `AdmissionReview` reads what the
//! encoder writes, and the fast scanner answers as the reference reading does.

use super::*;
use proptest::prelude::{Just, Strategy, prop, prop_oneof};
use serde_json::json;
use smolvm_api::fixtures;

fn body(route_resource: &str, sub: Option<&str>, op: &str, object: Value, old: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": GROUP, "version": "v1alpha1", "kind": "SmolVM"},
            "resource": {"group": GROUP, "version": "v1alpha1", "resource": route_resource},
            "subResource": sub,
            "name": "alpine", "namespace": "default",
            "operation": op,
            "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
            "object": object, "oldObject": old, "dryRun": false
        }
    }))
    .unwrap_or_default()
}

/// The body of `body()` with `object` spliced in as raw text.
fn body_with_object_text(route_resource: &str, op: &str, object: &str, old: &str) -> Vec<u8> {
    let template = body(route_resource, None, op, json!("OBJECT"), json!("OLD"));
    let text = String::from_utf8(template).unwrap_or_default();
    text.replace("\"OBJECT\"", object).replace("\"OLD\"", old).into_bytes()
}

fn nested(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
}

/// Reading the objects as text answers exactly as reading them as Values does, for
/// well-formed reviews and for every kind of malformed object.
#[test]
fn text_objects_answer_like_values() {
    let policy = fixtures::policy();
    let nodes = vec![fixtures::node("node-a", 4, 4096, 100)];
    let alpine = serde_json::to_string(&fixtures::alpine()).unwrap_or_default();
    let bound = serde_json::to_string(&fixtures::bound(fixtures::alpine(), "node-a")).unwrap_or_default();
    let mut bodies: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut texts: Vec<(&str, String, String)> = vec![
        ("alpine", alpine.clone(), "null".into()),
        ("update", bound.replace("\"cpus\":1", "\"cpus\":2"), bound.clone()),
        ("bad image", alpine.replace("alpine:latest", "Not An Image"), "null".into()),
        ("no spec", r#"{"metadata":{"name":"a"}}"#.into(), "null".into()),
        ("spec string", r#"{"metadata":{"name":"a"},"spec":"x"}"#.into(), "null".into()),
        ("metadata string", r#"{"metadata":"x","spec":{}}"#.into(), "null".into()),
        ("metadata array", r#"{"metadata":[],"spec":{"image":"a"}}"#.into(), "null".into()),
        ("metadata null", r#"{"metadata":null,"spec":{"image":"a"}}"#.into(), "null".into()),
        ("object array", "[1]".into(), "null".into()),
        ("object string", r#""x""#.into(), "null".into()),
        ("old object number", alpine.clone(), "5".into()),
        ("old does not decode", alpine.clone(), r#"{"spec":{"image":5}}"#.into()),
        (
            "repeated metadata, last is a string",
            r#"{"metadata":{},"metadata":"x","spec":{"image":"a"}}"#.into(),
            "null".into(),
        ),
        (
            "repeated metadata, last is an object",
            r#"{"metadata":"x","metadata":{"name":"a"},"spec":{"image":"alpine"}}"#.into(),
            "null".into(),
        ),
        (
            "repeated spec",
            r#"{"metadata":{"name":"a"},"spec":{"image":"Bad Image"},"spec":{"image":"alpine"}}"#.into(),
            "null".into(),
        ),
        (
            "repeated finalizers",
            r#"{"metadata":{"name":"a","finalizers":["vm.smolvm.dev/node-cleanup"],"finalizers":[]},"spec":{"image":"alpine"}}"#.into(),
            "null".into(),
        ),
        (
            "repeated labels",
            r#"{"metadata":{"name":"a","labels":{"a":"1","a":"2"}},"spec":{"image":"alpine","nodeSelector":{"k":"v","k":"Bad Value!"}}}"#.into(),
            "null".into(),
        ),
        (
            "escaped keys",
            r#"{"meta\u0064ata":{"name":"a"},"sp\u0065c":{"image":"alpin\u0065","running":null}}"#.into(),
            "null".into(),
        ),
        (
            "number out of range in an unread field",
            r#"{"metadata":{"name":"a"},"spec":{"image":"alpine"},"x":1e999}"#.into(),
            "null".into(),
        ),
        (
            "lone surrogate in an unread field",
            r#"{"metadata":{"name":"a"},"spec":{"image":"alpine"},"x":"\ud800"}"#.into(),
            "null".into(),
        ),
        (
            "float where an integer goes",
            r#"{"metadata":{"name":"a"},"spec":{"image":"alpine","resources":{"cpus":1.0}}}"#.into(),
            "null".into(),
        ),
        (
            "deleting",
            serde_json::to_string(&fixtures::deleting(fixtures::alpine())).unwrap_or_default(),
            "null".into(),
        ),
        // What the rules are given without (`Scanned::slimmed`) and what keeps it in.
        (
            "kubectl's annotation and managed fields",
            alpine.replacen(
                r#""metadata":{"#,
                r#""metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"spec\":{\"image\":\"x\"}}\n"},"managedFields":[{"manager":"kubectl","fieldsV1":{"f:spec":{}}}],"#,
                1,
            ),
            "null".into(),
        ),
        (
            "an annotation that is not a string",
            alpine.replacen(r#""metadata":{"#, r#""metadata":{"annotations":{"a":"x","b":5},"#, 1),
            "null".into(),
        ),
        (
            "a rule's annotation",
            alpine.replacen(
                r#""metadata":{"#,
                r#""metadata":{"annotations":{"a":"x","vm.smolvm.dev/class":"medium"},"#,
                1,
            ),
            "null".into(),
        ),
        (
            "an escaped key that is a rule's annotation",
            alpine.replacen(
                r#""metadata":{"#,
                r#""metadata":{"annotations":{"a":"x","vm.smolvm.dev\/class":5},"#,
                1,
            ),
            "null".into(),
        ),
        (
            "annotations not an object, managed fields not a list",
            alpine.replacen(r#""metadata":{"#, r#""metadata":{"annotations":"x","managedFields":7,"#, 1),
            "null".into(),
        ),
        (
            "kubectl's annotation and managed fields in both objects",
            bound.replacen(
                r#""metadata":{"#,
                r#""metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}"},"managedFields":[],"#,
                1,
            ),
            bound.replacen(
                r#""metadata":{"#,
                r#""metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}"},"managedFields":[],"#,
                1,
            ),
        ),
        (
            "repeated annotations",
            alpine.replacen(
                r#""metadata":{"#,
                r#""metadata":{"annotations":{"a":5},"annotations":{"a":"x"},"#,
                1,
            ),
            "null".into(),
        ),
    ];
    // Nesting around serde_json's limit, in a field the rules do not read.
    for depth in 120..=128 {
        let object = format!(
            r#"{{"metadata":{{"name":"a"}},"spec":{{"image":"alpine"}},"x":{}}}"#,
            nested(depth, "1")
        );
        texts.push(("nested", object, "null".into()));
    }
    for (name, object, old) in &texts {
        for op in ["CREATE", "UPDATE"] {
            bodies.push((name, body_with_object_text("smolvms", op, object, old)));
        }
    }
    // Whole bodies that are not well-formed reviews.
    let mut wrong_kind = body("smolvms", None, "CREATE", fixtures::alpine(), Value::Null);
    wrong_kind = String::from_utf8(wrong_kind)
        .unwrap_or_default()
        .replace("AdmissionReview", "Pod")
        .into_bytes();
    bodies.push(("wrong kind", wrong_kind));
    bodies.push(("not json", b"{".to_vec()));
    bodies.push((
        "no request",
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
    ));
    bodies.push((
        "status",
        body(
            "smolvms",
            Some("status"),
            "UPDATE",
            fixtures::bound(fixtures::alpine(), "node-a"),
            fixtures::bound(fixtures::alpine(), "node-a"),
        ),
    ));
    bodies.push((
        "node",
        body(
            "smolvmnodes",
            None,
            "CREATE",
            json!({"metadata": {"name": "n"}, "spec": {}}),
            Value::Null,
        ),
    ));
    bodies.push((
        "node status",
        body(
            "smolvmnodes",
            Some("status"),
            "UPDATE",
            json!({"metadata": {"name": "n"}, "spec": {}, "status": {"endpoint": {"address": "nope", "port": 0}}}),
            Value::Null,
        ),
    ));
    bodies.push((
        "delete",
        body("smolvms", None, "DELETE", Value::Null, fixtures::alpine()),
    ));
    bodies.push((
        "class delete",
        body(
            "smolvmclasses",
            None,
            "DELETE",
            Value::Null,
            json!({
                "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMClass",
                "metadata": {"name": "large", "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
                "spec": {"resources": {"cpus": 2, "memoryMiB": 4096}, "default": false}
            }),
        ),
    ));
    bodies.push((
        "create without object",
        body("smolvms", None, "CREATE", Value::Null, Value::Null),
    ));

    let mut fast = 0;
    for (name, body) in &bodies {
        if parse_text(body).is_some() {
            fast += 1;
        }
        for route in Route::ALL {
            let got = review(route, body, &policy, Catalogs::nodes(&nodes));
            let want = review_parsed(route, body, &policy, Catalogs::nodes(&nodes));
            match (&got, &want) {
                (Ok(g), Ok(w)) => {
                    assert_eq!(g.outcome, w.outcome, "{name} {route:?}");
                    assert_eq!(
                        String::from_utf8_lossy(&g.body),
                        String::from_utf8_lossy(&w.body),
                        "{name} {route:?}"
                    );
                }
                _ => assert_eq!(got.as_ref().err(), want.as_ref().err(), "{name} {route:?}"),
            }
        }
    }
    // The fast path is actually taken for most of them.
    assert!(fast > bodies.len() / 2, "{fast} of {}", bodies.len());
}

/// What the rules are given of an object: without kubectl's annotation and the managed fields,
/// with the annotations that a rule reads or that are not strings.
#[test]
fn slimmed_objects_leave_out_only_what_the_rules_never_read() {
    let table: &[(&str, Option<&str>)] = &[
        (
            r#"{"metadata":{"name":"a","annotations":{"k":"{\"x\":1}"},"managedFields":[{"m":1}]},"spec":{}}"#,
            Some(r#"{"metadata":{"name":"a","annotations":{},"managedFields":null},"spec":{}}"#),
        ),
        (
            r#"{"metadata":{"annotations":{"k":"v","vm.smolvm.dev/class":"c"}},"spec":{}}"#,
            None,
        ),
        (r#"{"metadata":{"annotations":{"k":"v","n":1}},"spec":{}}"#, None),
        (r#"{"metadata":{"annotations":{"k\u0020":"v"}},"spec":{}}"#, None),
        (
            r#"{"metadata":{"labels":{"k":"v"},"annotations":{"k":"v"}},"annotations":{"k":1}}"#,
            Some(r#"{"metadata":{"labels":{"k":"v"},"annotations":{}},"annotations":{"k":1}}"#),
        ),
        (r#"{"metadata":{"name":"a"},"spec":{"annotations":{"k":"v"}}}"#, None),
    ];
    for (text, want) in table {
        let scan = scan_object(text).unwrap_or_else(|| panic!("{text} scans"));
        assert_eq!(scan.slimmed(text).as_deref(), *want, "{text}");
    }
}

/// JSON text for property tests: values with the escapes, numbers and nesting where a
/// `serde_json::Value` read is stricter than the syntax.
fn json_text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let string = prop::collection::vec(
        prop_oneof![
            Just("a".to_string()),
            Just("metadata".to_string()),
            Just("spec".to_string()),
            Just("finalizers".to_string()),
            Just("deletionTimestamp".to_string()),
            Just("vm.smolvm.dev/node-cleanup".to_string()),
            Just("\\\"".to_string()),
            Just("\\\\".to_string()),
            Just("\\n".to_string()),
            Just("\\u0041".to_string()),
            Just("\\ud800".to_string()),
            Just("\\udc00".to_string()),
            Just("\\ud83d\\ude00".to_string()),
            Just("\\ud83d\\u0041".to_string()),
            Just("\\ud83d\\n".to_string()),
            Just("é".to_string()),
        ],
        0..4,
    )
    .prop_map(|parts| format!("\"{}\"", parts.concat()));
    let number = prop_oneof![
        Just("0".to_string()),
        Just("-0".to_string()),
        Just("1.5".to_string()),
        Just("-2e3".to_string()),
        Just("1e400".to_string()),
        Just("-1E400".to_string()),
        Just("1e-400".to_string()),
        Just("18446744073709551616".to_string()),
        Just("-9223372036854775809".to_string()),
        Just("9".repeat(320)),
        Just("1".to_string()),
    ];
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        number,
        string.clone(),
    ];
    leaf.prop_recursive(4, 24, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((string.clone(), inner), 0..4).prop_map(|v| {
                let members: Vec<String> = v.into_iter().map(|(k, v)| format!("{k} : {v}")).collect();
                format!("{{ {} }}", members.join(" , "))
            }),
        ]
    })
}

proptest::proptest! {
    /// The text path accepts an object only if the Value path does, and then answers alike.
    #[test]
    fn text_path_is_sound(
        metadata in json_text(),
        extra in json_text(),
        depth in 0usize..130,
        which in 0usize..6,
    ) {
        let object = match which {
            0 => format!(r#"{{"metadata":{metadata},"spec":{{"image":"alpine"}},"x":{extra}}}"#),
            1 => format!(r#"{{"metadata":{{"name":"a","annotations":{{"k":{extra}}}}},"spec":{{"image":"alpine"}}}}"#),
            2 => format!(r#"{{"spec":{{"image":"alpine"}},"x":{}}}"#, nested(depth, &extra)),
            3 => extra.clone(),
            4 => format!(
                r#"{{"metadata":{{"name":"a","finalizers":{extra},"deletionTimestamp":{metadata}}},"spec":{{"image":"alpine","network":{extra}}}}}"#
            ),
            _ => format!(
                r#"{{"spec":{extra},"metadata":{{"finalizers":["vm.smolvm.dev/node-cleanup"],"deletionTimestamp":"t"}},"spec":{{"image":"alpine","resources":{metadata}}},"metadata":{{"name":"b","finalizers":{extra}}}}}"#
            ),
        };
        let body = body_with_object_text("smolvms", "CREATE", &object, "null");
        let fast = parse_text(&body).is_some();
        let slow = parse(&body);
        proptest::prop_assert!(!fast || slow.is_ok(), "{object}: text path accepted, Value path: {:?}", slow.err());
        // Where the Value path accepts a plain object, the text path does too (it only
        // leaves escaped keys of the object and of its metadata to the Value path).
        if slow.is_ok() && which != 3 && !(matches!(which, 0 | 4) && metadata.contains('\\')) {
            proptest::prop_assert!(fast, "{object}: text path refused what the Value path accepts");
        }
        answers_as_values(&body, &Route::ALL)?;
    }
}

/// Whether [`review`] answers `body` on each of `routes` as the Value path does, byte for byte.
fn answers_as_values(body: &[u8], routes: &[Route]) -> Result<(), proptest::test_runner::TestCaseError> {
    let policy = fixtures::policy();
    let nodes: Vec<smolvm_api::SmolVMNode> = Vec::new();
    for &route in routes {
        let got = review(route, body, &policy, Catalogs::nodes(&nodes));
        let want = review_parsed(route, body, &policy, Catalogs::nodes(&nodes));
        match (&got, &want) {
            (Ok(g), Ok(w)) => {
                proptest::prop_assert_eq!(&g.outcome, &w.outcome);
                proptest::prop_assert_eq!(&g.body, &w.body);
            }
            _ => proptest::prop_assert_eq!(got.as_ref().err(), want.as_ref().err()),
        }
    }
    Ok(())
}

/// A member of a spec for [`text_and_value_default_alike`]: absent, null, or one of `values`.
fn member(name: &'static str, values: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(format!(r#""{name}":null,"#)),
        prop::sample::select(values).prop_map(move |v| format!(r#""{name}":{v},"#)),
    ]
}

proptest::proptest! {
    /// SmolVMs with every defaulted field absent, null or set (some set wrongly) get the same
    /// answer from their text (the shape read from the spec's text) as from their Value, on both
    /// SmolVM routes.
    #[test]
    fn text_and_value_default_alike(
        running in member("running", &["true", "false", "1"]),
        resources in member("resources", &["{}", r#"{"cpus":2}"#, r#"{"memoryMiB":null,"cpus":1}"#, "[2]"]),
        storage in member("storage", &["{}", r#"{"overlayGiB":5}"#, r#"{"storageGiB":20,"overlayGiB":10}"#]),
        network in member("network", &[
            "{}",
            r#"{"enabled":true}"#,
            r#"{"ports":[{"hostPort":8080,"guestPort":80},{"hostPort":8081,"guestPort":81,"protocol":"UDP"}]}"#,
            r#"{"exposeService":true,"ports":[{"hostPort":8080,"guestPort":80,"protocol":null}]}"#,
            r#"{"ports":null}"#,
        ]),
        restart in member("restartPolicy", &[r#""Always""#, r#""Never""#, r#""Sometimes""#]),
        grace in member("terminationGracePeriodSeconds", &["0", "30", "-1"]),
        class in member("className", &[r#""small""#, "3"]),
        finalizers in prop_oneof![
            Just(String::new()),
            Just(r#","finalizers":null"#.to_string()),
            Just(r#","finalizers":["a"]"#.to_string()),
            Just(r#","finalizers":["vm.smolvm.dev/node-cleanup"]"#.to_string()),
        ],
        deleting in proptest::bool::ANY,
        operation in prop::sample::select(&["CREATE", "UPDATE"]),
    ) {
        let deleted = if deleting { r#","deletionTimestamp":"2026-11-26T00:00:00Z""# } else { "" };
        let object = format!(
            r#"{{"metadata":{{"name":"a","namespace":"default"{finalizers}{deleted}}},"spec":{{{running}{resources}{storage}{network}{restart}{grace}{class}"image":"alpine"}}}}"#
        );
        let old = if operation == "UPDATE" { object.as_str() } else { "null" };
        let body = body_with_object_text("smolvms", operation, &object, old);
        proptest::prop_assert!(parse_text(&body).is_some(), "{object}: the text path reads it");
        answers_as_values(&body, &[Route::MutateSmolVM, Route::ValidateSmolVM])?;
    }
}

/// The additions' patch is written as serde_json writes the patch of `default_smolvm`.
#[test]
fn additions_are_written_as_their_patch() {
    let objects = [
        json!({"metadata": {}, "spec": {}}),
        json!({"metadata": {"finalizers": ["x"]}, "spec": {"resources": {"cpus": 2},
            "network": {"ports": [{"hostPort": 1, "guestPort": 2}, {"protocol": "UDP"}, {}]}}}),
        fixtures::alpine(),
    ];
    for object in objects {
        for op in [Operation::Create, Operation::Update] {
            let list = additions(op, &Shape::of_value(&object));
            let reference = patch_json(&default_smolvm(op, &object)).unwrap_or_default();
            assert_eq!(
                String::from_utf8_lossy(&additions_json(&list)),
                String::from_utf8_lossy(&reference)
            );
        }
    }
}

/// kube-core's encoding of the same answer: the reference for [`encode`].
fn encode_with_kube(answer: &Answer) -> Vec<u8> {
    use kube::core::{Status, TypeMeta, admission::AdmissionResponse};
    let mut response = AdmissionResponse::invalid("");
    response.types = TypeMeta {
        api_version: ADMISSION_API_VERSION.into(),
        kind: ADMISSION_KIND.into(),
    };
    response.uid = answer.uid.clone();
    response.allowed = true;
    response.result = Status::default();
    if let Some(patch) = &answer.patch {
        let ops: json_patch::Patch = serde_json::from_slice(patch).unwrap_or_else(|e| panic!("{e}"));
        response = response.with_patch(ops).unwrap_or_else(|e| panic!("{e}"));
    }
    response.warnings = answer.warnings.clone();
    if let Some((code, reason, message)) = &answer.denial {
        response.allowed = false;
        response.result = Status::failure(message, reason).with_code(*code);
    }
    serde_json::to_vec(&response.into_review()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn finding_text_is_its_display() {
    let mut bad = fixtures::alpine();
    bad["spec"]["image"] = json!("Not An Image");
    bad["spec"]["resources"]["cpus"] = json!(4096);
    bad["spec"]["network"]["ports"][0]["hostPort"] = json!(80);
    let policy = fixtures::policy();
    let nodes: Vec<smolvm_api::SmolVMNode> = Vec::new();
    let identity = fixtures::user();
    let ctx = Context {
        policy: &policy,
        nodes: &nodes,
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
        identity: &identity,
    };
    let verdict = smolvm_api::validate::validate_smolvm_json(Operation::Create, None, &bad, &ctx);
    let findings: Vec<_> = verdict.violations.iter().chain(&verdict.warnings).collect();
    assert!(findings.len() >= 3, "{findings:?}");
    for finding in findings {
        assert_eq!(finding_text(finding), finding.to_string());
    }
}

#[test]
fn patches_are_written_as_serde_json_writes_them() {
    use json_patch::{AddOperation, PatchOperation, RemoveOperation, jsonptr::PointerBuf};
    let class: smolvm_api::SmolVMClass = serde_json::from_value(json!({
        "metadata": {"name": "medium", "generation": 3},
        "spec": {"resources": {"cpus": 2}, "nodeSelector": {"kubernetes.io/arch": "amd64"}, "network": {"enabled": true, "allowedHosts": ["a.example.com"]}}
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let objects = [
        fixtures::alpine(),
        json!({"metadata": {"finalizers": ["x"]}, "spec": {"network": {"ports": [{"hostPort": 1}, 5, {"protocol": null}]}}}),
        json!({"metadata": {}, "spec": {}}),
    ];
    let mut patches: Vec<json_patch::Patch> = objects
        .iter()
        .flat_map(|o| {
            [
                default_smolvm(Operation::Create, o),
                default_smolvm_with_class(Operation::Create, o, Some(&class)),
            ]
        })
        .collect();
    patches.push(json_patch::Patch(Vec::new()));
    patches.push(json_patch::Patch(vec![
        PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["a~b", "c/d", "\"e\""]),
            value: json!({"x": [1.5, "\u{1}", null]}),
        }),
        PatchOperation::Remove(RemoveOperation {
            path: PointerBuf::from_tokens(["spec"]),
        }),
    ]));
    for patch in &patches {
        let want = serde_json::to_vec(patch).unwrap_or_else(|e| panic!("{e}"));
        let got = patch_json(patch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&want));
    }
}

#[test]
fn byte_arrays_as_serde_json_writes_them() {
    let every: Vec<u8> = (0..=255u8).rev().chain(0..=255).collect();
    let cases: [&[u8]; 5] = [&[], &[0], &[255], b"[{\"op\":\"add\"}]", &every];
    for bytes in cases {
        // After something already written, as in an answer.
        let mut out = b"x[".to_vec();
        put_decimals(&mut out, bytes);
        out.push(b']');
        let want = [b"x".as_slice(), &serde_json::to_vec(bytes).unwrap_or_default()].concat();
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&want),
            "{bytes:?}"
        );
    }
}

#[test]
fn encoding_matches_kube_core() {
    let patch = serde_json::to_vec(&default_smolvm(Operation::Create, &json!({"metadata": {}, "spec": {}})))
        .unwrap_or_default();
    let uids = ["", "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4", "quote\" back\\ \u{1} ünï €"];
    let denials = [
        None,
        Some((
            422,
            "Invalid",
            "spec.image: \"x y\" contains the character ' ' [V1]; tab\there".to_string(),
        )),
        Some((403, "Forbidden", String::new())),
        Some((400, "BadRequest", "é\u{7f}\u{2028}".to_string())),
        Some((0, "Invalid", "m".to_string())),
    ];
    let warnings = [
        None,
        Some(vec![]),
        Some(vec!["one \"quoted\"".to_string(), "two\n".to_string()]),
    ];
    for uid in uids {
        for denial in &denials {
            for patch in [None, Some(patch.clone()), Some(b"[]".to_vec())] {
                for warnings in &warnings {
                    let answer = Answer {
                        uid: uid.to_string(),
                        denial: denial.clone(),
                        patch: patch.clone(),
                        warnings: warnings.clone(),
                    };
                    let ours = encode(answer.clone()).unwrap_or_default();
                    assert_eq!(
                        String::from_utf8_lossy(&ours),
                        String::from_utf8_lossy(&encode_with_kube(&answer)),
                        "{answer:?}"
                    );
                }
            }
        }
    }
}

/// The nesting limit of the text path is serde_json's, at the objects' depth in a review.
#[test]
fn nesting_limit_matches_serde_json() {
    for depth in 118..=130 {
        let object = format!(r#"{{"spec":{}}}"#, nested(depth, "1"));
        let body = body_with_object_text("smolvms", "CREATE", &object, "null");
        assert_eq!(
            parse_text(&body).is_some(),
            parse(&body).is_ok(),
            "depth {depth}: {:?}",
            parse(&body).err()
        );
    }
}

#[test]
fn parse_classifies_malformed_bodies() {
    let table: &[(&[u8], &str)] = &[
        (b"", "NotJSON"),
        (b"{", "NotJSON"),
        (b"not json", "NotJSON"),
        (b"[]", "WrongKind"),
        (b"42", "WrongKind"),
        (b"{}", "WrongKind"),
        (
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#,
            "WrongKind",
        ),
        (br#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#, "WrongKind"),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            "MissingRequest",
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}"#,
            "MissingRequest",
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":5}}"#,
            "Malformed",
        ),
    ];
    for (input, reason) in table {
        let got = parse(input).err().map(|e| e.reason());
        assert_eq!(got, Some(*reason), "{}", String::from_utf8_lossy(input));
    }
}

#[test]
fn denial_codes() {
    let policy = fixtures::policy();
    let nodes: Vec<smolvm_api::SmolVMNode> = Vec::new();
    let mut bad = fixtures::alpine();
    bad["spec"]["image"] = json!("Not An Image");
    let out = review(
        Route::ValidateSmolVM,
        &body("smolvms", None, "CREATE", bad, Value::Null),
        &policy,
        Catalogs::nodes(&nodes),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let v: Value = serde_json::from_slice(&out.body).unwrap_or_default();
    assert_eq!(v["response"]["status"]["code"], 422);
    assert_eq!(v["response"]["status"]["reason"], "Invalid");
    assert_eq!(out.outcome.rules, vec![RuleId::V1]);
}

#[test]
fn wrong_resource_and_subresource_are_denied() {
    let policy = fixtures::policy();
    let nodes: Vec<smolvm_api::SmolVMNode> = Vec::new();
    let table: &[(Route, &str, Option<&str>)] = &[
        (Route::ValidateSmolVMNode, "smolvms", None),
        (Route::MutateSmolVM, "pods", None),
        (Route::ValidateSmolVM, "smolvms", Some("scale")),
    ];
    for (route, resource, sub) in table {
        let out = review(
            *route,
            &body(resource, *sub, "CREATE", fixtures::alpine(), Value::Null),
            &policy,
            Catalogs::nodes(&nodes),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let v: Value = serde_json::from_slice(&out.body).unwrap_or_default();
        assert_eq!(v["response"]["allowed"], false, "{route:?} {resource}");
        assert_eq!(v["response"]["status"]["code"], 400);
    }
}

/// A review of `alpine` whose request has `members` (the rest of the envelope as the API
/// server writes it).
fn review_with(members: &str) -> String {
    format!(r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{{members}}}}}"#)
}

/// The request members of a plain CREATE of `alpine`, then `more`.
fn create_members(more: &str) -> String {
    let object = serde_json::to_string(&fixtures::alpine()).unwrap_or_default();
    format!(
        r#""uid":"u-1","resource":{{"group":"vm.smolvm.dev","version":"v1alpha1","resource":"smolvms"}},"operation":"CREATE","userInfo":{{"username":"alice"}},"object":{object}{more}"#
    )
}

/// The fast reading of the envelope takes the bodies it should, leaves the others to the
/// reference reading, and answers whatever it takes as the reference answers it.
#[test]
fn envelopes_read_as_parse_reads_them() {
    let plain = create_members("");
    let resource = r#""resource":{"group":"vm.smolvm.dev","version":"v1alpha1","resource":"smolvms"}"#;
    let object = serde_json::to_string(&fixtures::alpine()).unwrap_or_default();
    let spaced = serde_json::to_string_pretty(&serde_json::from_str::<Value>(&review_with(&plain)).unwrap_or_default())
        .unwrap_or_default();
    let table: Vec<(&str, String, bool)> = vec![
        ("plain", review_with(&plain), true),
        ("whitespace everywhere", spaced.replace('\n', "\r\n\t "), true),
        (
            "members in another order",
            format!(
                r#"{{"request":{{"object":{object},"userInfo":{{}},"operation":"UPDATE","oldObject":{object},{resource},"uid":"u"}},"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}}"#
            ),
            true,
        ),
        (
            "unknown members of every kind skipped",
            review_with(&create_members(
                r#","kind":{"group":"g","kind":"K"},"options":{"a":[1,0,-0,2.5,-3e2,1E+2,true,false,null,"x\n\u00e9\"",{}],"b":{"c":[[]]}},"dryRun":false"#,
            )),
            true,
        ),
        ("subResource null", review_with(&create_members(r#","subResource":null"#)), true),
        ("subResource status", review_with(&create_members(r#","subResource":"status""#)), true),
        ("oldObject null", review_with(&create_members(r#","oldObject":null"#)), true),
        ("an escaped uid", review_with(&plain.replace(r#""u-1""#, r#""u\u002d1\/""#)), true),
        (
            "userInfo with every member, repeats and nulls",
            review_with(&plain.replace(
                r#""userInfo":{"username":"alice"}"#,
                r#""userInfo":{"username":"bob","uid":null,"groups":["system:authenticated","a\u0026b"],"extra":{"k":["1"],"k":["2","3"],"e":[]},"username":"al\u0069ce","other":{"x":1}}"#,
            )),
            true,
        ),
        ("userInfo members null", review_with(&plain.replace(r#""userInfo":{"username":"alice"}"#, r#""userInfo":{"username":null,"groups":null,"extra":null}"#)), true),
        // Left to the reference reading.
        ("uid twice", review_with(&create_members(r#","uid":"u-2""#)), false),
        ("object twice", review_with(&create_members(&format!(r#","object":{object}"#))), false),
        ("apiVersion twice", review_with(&plain).replacen("{", r#"{"apiVersion":"admission.k8s.io/v1","#, 1), false),
        ("an escaped key", review_with(&plain.replace(r#""uid""#, r#""u\u0069d""#)), false),
        ("userInfo null", review_with(&plain.replace(r#""userInfo":{"username":"alice"}"#, r#""userInfo":null"#)), false),
        ("no uid", review_with(&plain.replace(r#""uid":"u-1","#, "")), false),
        ("uid a number", review_with(&plain.replace(r#""u-1""#, "1")), false),
        ("resource with another member", review_with(&plain.replace(r#""resource":"smolvms""#, r#""resource":"smolvms","api_version":"x""#)), false),
        ("resource without version", review_with(&plain.replace(r#""version":"v1alpha1","#, "")), false),
        ("an unknown operation", review_with(&plain.replace("CREATE", "PATCH")), false),
        ("request null", review_with("").replace("{}", "null"), false),
        ("request an array", review_with("").replace("{}", "[]"), false),
        ("the review an array", "[]".into(), false),
        ("trailing text", review_with(&plain) + " x", false),
        ("trailing whitespace", review_with(&plain) + " \n", true),
        ("a trailing comma in a skipped member", review_with(&create_members(r#","options":{"a":1,}"#)), false),
        ("a trailing comma in a skipped array", review_with(&create_members(r#","options":[1,]"#)), false),
        ("a missing colon in a skipped member", review_with(&create_members(r#","options":{"a" 1}"#)), false),
        ("a missing comma in a skipped array", review_with(&create_members(r#","options":[1 2]"#)), false),
        ("a control character in a skipped string", review_with(&create_members(",\"options\":\"a\u{1}b\"")), false),
        ("an unknown escape in a skipped string", review_with(&create_members(r#","options":"a\xb""#)), false),
        ("a short \\u escape", review_with(&create_members(r#","options":"\u00g0""#)), false),
        ("a signed \\u escape", review_with(&create_members(r#","options":"\u+abc""#)), false),
        ("a leading zero", review_with(&create_members(r#","options":01"#)), false),
        ("a bare point", review_with(&create_members(r#","options":1."#)), false),
        ("a bare minus", review_with(&create_members(r#","options":-"#)), false),
        ("a bare exponent", review_with(&create_members(r#","options":1e"#)), false),
        ("a leading point", review_with(&create_members(r#","options":.5"#)), false),
        ("a plus sign", review_with(&create_members(r#","options":+1"#)), false),
        ("a misspelt literal", review_with(&create_members(r#","options":tru"#)), false),
        ("mismatched brackets", review_with(&create_members(r#","options":[1}"#)), false),
        ("an unterminated string", review_with(&create_members(r#","options":"abc"#)), false),
        ("deep nesting in a skipped member", review_with(&create_members(&format!(r#","options":{}"#, nested(200, "1")))), false),
        ("groups with a number", review_with(&plain.replace(r#""username":"alice""#, r#""groups":[1]"#)), false),
        ("an extra value null", review_with(&plain.replace(r#""username":"alice""#, r#""extra":{"k":null}"#)), false),
    ];
    for (name, body, fast) in &table {
        assert_eq!(parse_text(body.as_bytes()).is_some(), *fast, "{name}: {body}");
        answers_as_values(body.as_bytes(), &Route::ALL).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let invalid_utf8 = [review_with(&create_members(r#","options":""#)).as_bytes(), b"\xff\"}}"].concat();
    assert!(parse_text(&invalid_utf8).is_none());
    answers_as_values(&invalid_utf8, &Route::ALL).unwrap_or_else(|e| panic!("invalid UTF-8: {e}"));
}

proptest::proptest! {
    /// A review broken or changed a few bytes at a time is read by the fast reading only when
    /// the reference reading accepts it too, and then answered alike.
    #[test]
    fn edited_reviews_are_read_soundly(
        edits in prop::collection::vec(
            (0usize..4096, 0u8..3, prop::sample::select(b"{}[],:\" \\\n0a-.eEu\x01\xff".to_vec())),
            1..4,
        ),
        update in proptest::bool::ANY,
    ) {
        let mut object = fixtures::alpine();
        object["metadata"]["annotations"] =
            json!({"kubectl.kubernetes.io/last-applied-configuration": r#"{"spec":{"image":"alpine"}}"#});
        let old = if update { object.clone() } else { Value::Null };
        let mut body = body("smolvms", None, if update { "UPDATE" } else { "CREATE" }, object, old);
        for (at, op, byte) in edits {
            let at = at % (body.len() + 1);
            match op {
                0 if at < body.len() => { body.remove(at); }
                1 => body.insert(at, byte),
                _ if at < body.len() => body[at] = byte,
                _ => body.push(byte),
            }
        }
        if parse_text(&body).is_some() {
            proptest::prop_assert!(parse(&body).is_ok(), "{}", String::from_utf8_lossy(&body));
        }
        answers_as_values(&body, &[Route::ValidateSmolVM, Route::MutateSmolVM])?;
    }
}
