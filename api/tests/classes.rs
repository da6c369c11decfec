//! SmolVMClass rules: M3 (a class's defaults at CREATE, before M1's) and V12 (a known, unchanging
//! className; classes within the policy; one default), table-driven.

use serde_json::{Value, json};
use smolvm_api::{
    SmolVMClass,
    class::{ClassCatalog, class_for},
    constants::{ANNOTATION_CLASS, ANNOTATION_CLASS_GENERATION, LABEL_CLASS},
    defaulting::{default_smolvm, default_smolvm_with_class},
    fixtures::{self, class, class_json, smolvm},
    policy::Policy,
    validate::{Context, Operation, Raw, RuleId, Target, Verdict, validate_raw, validate_smolvm_json},
};

/// The seed's three sizes, `small` the default.
fn catalog() -> Vec<SmolVMClass> {
    vec![
        class(
            "small",
            json!({"resources": {"cpus": 1, "memoryMiB": 512}, "storage": {"storageGiB": 10, "overlayGiB": 5}}),
            true,
        ),
        class(
            "medium",
            json!({"resources": {"cpus": 2, "memoryMiB": 2048}, "storage": {"storageGiB": 20, "overlayGiB": 10}}),
            false,
        ),
        class(
            "large",
            json!({
                "resources": {"cpus": 4, "memoryMiB": 8192},
                "storage": {"storageGiB": 50, "overlayGiB": 20},
                "network": {"enabled": true, "allowedCIDRs": ["10.0.0.0/8"], "allowedHosts": ["*.example.com"]},
                "nodeSelector": {"vm.smolvm.dev/size": "large"},
                "restartPolicy": "OnFailure",
                "terminationGracePeriodSeconds": 30,
                "lifecycle": {"ttlSecondsAfterFinished": 300, "activeDeadlineSeconds": 86400}
            }),
            false,
        ),
    ]
}

fn defaulted(object: &Value, classes: &dyn ClassCatalog) -> Value {
    let name = object.pointer("/spec/className").and_then(Value::as_str);
    let chosen = class_for(name, classes).ok().flatten();
    let patch = default_smolvm_with_class(Operation::Create, object, chosen.as_ref());
    let mut out = object.clone();
    json_patch::patch(&mut out, &patch).unwrap_or_else(|e| panic!("the patch applies: {e}"));
    out
}

fn with_ctx<T>(classes: &dyn ClassCatalog, f: impl FnOnce(&Context<'_>) -> T) -> T {
    let policy = Policy::default();
    let nodes = vec![fixtures::node("node-a", 64, 1 << 20, 1 << 14)];
    let identity = fixtures::user();
    f(&Context {
        policy: &policy,
        nodes: &nodes,
        classes,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
        identity: &identity,
    })
}

#[test]
fn m3_takes_what_the_smolvm_leaves_unset_from_its_class_then_m1() {
    let classes = catalog();
    struct Case {
        name: &'static str,
        spec: Value,
        want: Vec<(&'static str, Value)>,
    }
    let cases = [
        Case {
            name: "only image and className: the class's sizes",
            spec: json!({"image": "alpine", "className": "large"}),
            want: vec![
                ("/spec/resources", json!({"cpus": 4, "memoryMiB": 8192})),
                ("/spec/storage", json!({"storageGiB": 50, "overlayGiB": 20})),
                ("/spec/network/enabled", json!(true)),
                ("/spec/network/allowedCIDRs", json!(["10.0.0.0/8"])),
                ("/spec/network/allowedHosts", json!(["*.example.com"])),
                ("/spec/nodeSelector", json!({"vm.smolvm.dev/size": "large"})),
                ("/spec/restartPolicy", json!("OnFailure")),
                ("/spec/terminationGracePeriodSeconds", json!(30)),
                (
                    "/spec/lifecycle",
                    json!({"ttlSecondsAfterFinished": 300, "activeDeadlineSeconds": 86400}),
                ),
                // M1 still fills what neither set.
                ("/spec/running", json!(true)),
                ("/spec/network/exposeService", json!(false)),
            ],
        },
        Case {
            name: "a field the user set wins, member by member",
            spec: json!({"image": "alpine", "className": "large", "resources": {"cpus": 8}, "storage": {"overlayGiB": 40}}),
            want: vec![
                ("/spec/resources", json!({"cpus": 8, "memoryMiB": 8192})),
                ("/spec/storage", json!({"storageGiB": 50, "overlayGiB": 40})),
            ],
        },
        Case {
            name: "a lifetime of the user's own wins; the class fills the other",
            spec: json!({"image": "alpine", "className": "large", "lifecycle": {"activeDeadlineSeconds": 60}}),
            want: vec![(
                "/spec/lifecycle",
                json!({"ttlSecondsAfterFinished": 300, "activeDeadlineSeconds": 60}),
            )],
        },
        Case {
            name: "a network the user disabled gets no egress lists",
            spec: json!({"image": "alpine", "className": "large", "network": {"enabled": false}}),
            want: vec![("/spec/network", json!({"enabled": false, "exposeService": false}))],
        },
        Case {
            name: "a nodeSelector of the user's own is taken whole, never merged",
            spec: json!({"image": "alpine", "className": "large", "nodeSelector": {"zone": "a"}}),
            want: vec![("/spec/nodeSelector", json!({"zone": "a"}))],
        },
        Case {
            name: "no className: the default class, whose name is written",
            spec: json!({"image": "alpine"}),
            want: vec![
                ("/spec/className", json!("small")),
                ("/spec/resources", json!({"cpus": 1, "memoryMiB": 512})),
                ("/spec/storage", json!({"storageGiB": 10, "overlayGiB": 5})),
            ],
        },
        Case {
            name: "a class without a field leaves it to M1",
            spec: json!({"image": "alpine", "className": "medium"}),
            want: vec![
                ("/spec/restartPolicy", json!("Always")),
                ("/spec/terminationGracePeriodSeconds", json!(10)),
                ("/spec/network", json!({"enabled": false, "exposeService": false})),
            ],
        },
    ];
    for case in cases {
        let out = defaulted(&smolvm("vm", case.spec.clone()), &classes);
        for (pointer, value) in &case.want {
            assert_eq!(out.pointer(pointer), Some(value), "{}: {pointer} in {out}", case.name);
        }
        let class = out
            .pointer("/spec/className")
            .and_then(Value::as_str)
            .unwrap_or_default();
        assert_eq!(
            out.pointer(&format!(
                "/metadata/annotations/{}",
                ANNOTATION_CLASS.replace('/', "~1")
            )),
            Some(&json!(class)),
            "{}",
            case.name
        );
        assert_eq!(
            out.pointer(&format!(
                "/metadata/annotations/{}",
                ANNOTATION_CLASS_GENERATION.replace('/', "~1")
            )),
            Some(&json!("1")),
            "{}",
            case.name
        );
        assert_eq!(
            out.pointer(&format!("/metadata/labels/{}", LABEL_CLASS.replace('/', "~1"))),
            Some(&json!(class)),
            "{}",
            case.name
        );
        // A second pass adds nothing, with the class or as M1 alone on UPDATE.
        let again = class_for(Some(class), &classes).ok().flatten();
        assert!(
            default_smolvm_with_class(Operation::Create, &out, again.as_ref())
                .0
                .is_empty(),
            "{}: second pass",
            case.name
        );
        assert!(default_smolvm(Operation::Update, &out).0.is_empty(), "{}", case.name);
        let verdict = with_ctx(&classes, |ctx| validate_smolvm_json(Operation::Create, None, &out, ctx));
        assert!(verdict.allowed(), "{}: {}", case.name, verdict.message());
    }
}

#[test]
fn m3_keeps_existing_annotations_and_labels_and_corrects_a_forged_record() {
    let classes = catalog();
    let mut object = smolvm("vm", json!({"image": "alpine", "className": "medium"}));
    object["metadata"]["annotations"] = json!({"team": "a", ANNOTATION_CLASS: "large"});
    object["metadata"]["labels"] = json!({"app": "x"});
    let out = defaulted(&object, &classes);
    assert_eq!(out["metadata"]["annotations"]["team"], json!("a"));
    assert_eq!(out["metadata"]["annotations"][ANNOTATION_CLASS], json!("medium"));
    assert_eq!(out["metadata"]["labels"], json!({"app": "x", LABEL_CLASS: "medium"}));
}

#[test]
fn m3_only_at_create() {
    let classes = catalog();
    let object = smolvm("vm", json!({"image": "alpine", "className": "large"}));
    let class = class_for(Some("large"), &classes).ok().flatten();
    for op in [Operation::Update, Operation::Delete] {
        assert_eq!(
            default_smolvm_with_class(op, &object, class.as_ref()),
            default_smolvm(op, &object),
            "{op:?}"
        );
    }
}

#[test]
fn several_defaults_the_newest_wins_and_none_is_no_class() {
    let mut older = class_json("older", json!({}), true);
    older["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    let mut newer = class_json("newer", json!({}), true);
    newer["metadata"]["creationTimestamp"] = json!("2026-02-01T00:00:00Z");
    let classes: Vec<SmolVMClass> = [older, newer]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    assert_eq!(
        class_for(None, &classes)
            .ok()
            .flatten()
            .map(|c| c.name().to_string())
            .as_deref(),
        Some("newer")
    );
    assert!(class_for(None, &Vec::<SmolVMClass>::new()).ok().flatten().is_none());
    assert_eq!(class_for(Some("nope"), &classes).err().as_deref(), Some("nope"));
}

fn rules(verdict: &Verdict) -> Vec<(RuleId, String)> {
    verdict.violations.iter().map(|f| (f.rule, f.path.clone())).collect()
}

#[test]
fn v12_class_name_is_known_at_create_and_never_changes() {
    let classes = catalog();
    let unknown = smolvm("vm", json!({"image": "alpine", "className": "huge"}));
    let verdict = with_ctx(&classes, |ctx| {
        validate_smolvm_json(Operation::Create, None, &unknown, ctx)
    });
    assert_eq!(rules(&verdict), [(RuleId::V12, "spec.className".to_string())]);
    let message = verdict.message();
    for known in ["small", "medium", "large"] {
        assert!(message.contains(known), "the known classes are listed: {message}");
    }
    let none_known = with_ctx(&smolvm_api::class::NO_CLASSES, |ctx| {
        validate_smolvm_json(Operation::Create, None, &unknown, ctx)
    });
    assert_eq!(rules(&none_known), [(RuleId::V12, "spec.className".to_string())]);

    let old = smolvm("vm", json!({"image": "alpine", "className": "small"}));
    for (name, new) in [
        ("changed", json!({"image": "alpine", "className": "large"})),
        ("removed", json!({"image": "alpine"})),
    ] {
        let new = smolvm("vm", new);
        let verdict = with_ctx(&classes, |ctx| {
            validate_smolvm_json(Operation::Update, Some(&old), &new, ctx)
        });
        assert_eq!(rules(&verdict), [(RuleId::V12, "spec.className".to_string())], "{name}");
    }
    // A class deleted since CREATE does not concern the SmolVM's updates.
    let mut update = old.clone();
    update["spec"]["running"] = json!(false);
    let verdict = with_ctx(&smolvm_api::class::NO_CLASSES, |ctx| {
        validate_smolvm_json(Operation::Update, Some(&old), &update, ctx)
    });
    assert!(verdict.allowed(), "{}", verdict.message());
}

fn validate_class(op: Operation, old: Option<&Value>, new: &Value, classes: &dyn ClassCatalog) -> Verdict {
    with_ctx(classes, |ctx| {
        validate_raw(Target::SmolVMClass, op, old.map(Raw::Value), Raw::Value(new), ctx)
    })
}

#[test]
fn v12_classes_are_validated_against_the_policy() {
    let classes = catalog();
    struct Case {
        name: &'static str,
        spec: Value,
        want: &'static [(RuleId, &'static str)],
    }
    let cases = [
        Case {
            name: "the seed's sizes",
            spec: json!({"resources": {"cpus": 2, "memoryMiB": 2048}}),
            want: &[],
        },
        Case {
            name: "an empty class (unset fields are not checked against the bounds)",
            spec: json!({}),
            want: &[],
        },
        Case {
            name: "V2: cpus and storage out of the policy's bounds",
            spec: json!({"resources": {"cpus": 1000}, "storage": {"storageGiB": 1_000_000}}),
            want: &[
                (RuleId::V2, "spec.resources.cpus"),
                (RuleId::V2, "spec.storage.storageGiB"),
            ],
        },
        Case {
            name: "V3: egress without a network, and a CIDR that is none",
            spec: json!({"network": {"allowedCIDRs": ["10.0.0.0/33"]}}),
            want: &[
                (RuleId::V3, "spec.network.allowedCIDRs"),
                (RuleId::V3, "spec.network.allowedCIDRs[0]"),
            ],
        },
        Case {
            name: "V4: a selector key that is no label key",
            spec: json!({"nodeSelector": {"bad key": "x"}}),
            want: &[(RuleId::V4, "spec.nodeSelector")],
        },
        Case {
            name: "V11: a host name that is none",
            spec: json!({"network": {"enabled": true, "allowedHosts": ["not a host"]}}),
            want: &[(RuleId::V11, "spec.network.allowedHosts")],
        },
    ];
    for case in cases {
        let new = class_json("c", case.spec.clone(), false);
        let verdict = validate_class(Operation::Create, None, &new, &classes);
        let got = rules(&verdict);
        assert_eq!(got.len(), case.want.len(), "{}: {}", case.name, verdict.message());
        for ((rule, path), (want_rule, want_path)) in got.iter().zip(case.want) {
            assert_eq!(rule, want_rule, "{}", case.name);
            assert!(path.starts_with(want_path), "{}: {path}", case.name);
        }
    }
}

#[test]
fn v12_at_most_one_default_class() {
    let classes = catalog();
    let second = class_json("xl", json!({}), true);
    let verdict = validate_class(Operation::Create, None, &second, &classes);
    assert_eq!(verdict.violations.len(), 1, "{}", verdict.message());
    assert_eq!(verdict.violations[0].rule, RuleId::V12);
    assert!(
        verdict.message().contains("small"),
        "names the default: {}",
        verdict.message()
    );
    // The default itself stays updatable; another class may become the default once none is.
    let small = class_json("small", json!({"resources": {"cpus": 1}}), true);
    assert!(validate_class(Operation::Update, Some(&small), &small, &classes).allowed());
    let others: Vec<SmolVMClass> = classes.into_iter().filter(|c| !c.is_default()).collect();
    assert!(validate_class(Operation::Create, None, &second, &others).allowed());
}

#[test]
fn v12_deleting_a_class_is_allowed() {
    let classes = catalog();
    let large = class_json("large", json!({}), false);
    let verdict = validate_class(Operation::Delete, None, &large, &classes);
    assert!(
        verdict.allowed() && verdict.warnings.is_empty(),
        "{}",
        verdict.message()
    );
}
