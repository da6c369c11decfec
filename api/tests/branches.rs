//! Branch rules: M5 (a branch filled from its source at CREATE, before M3 and M1; a branch source
//! labelled) and V17 (a branch names a branchable SmolVM of its namespace, never changes it and
//! sets only what a clone carries of its own; a source has no volumes and is no branch; the
//! delete-branches annotation), table-driven.

use serde_json::{Value, json};
use smolvm_api::{
    SmolVM,
    constants::{ANNOTATION_BRANCH_OF_UID, DELETE_BRANCHES_ANNOTATION, LABEL_BRANCH_OF, LABEL_BRANCHABLE},
    defaulting::{default_branch_smolvm, default_branch_source, default_smolvm},
    fixtures::{self, assert_violations, assert_well_formed, bound, deleting, smolvm},
    policy::Policy,
    validate::{Context, Operation, RuleId, validate_branch_request, validate_smolvm_json},
};

const SOURCE_UID: &str = "5b0c6a1e-8d2f-4c3b-9a7e-1f0d2c3b4a59";

/// The source every case branches: a prepared sandbox, branchable, bound to node-a, with a
/// published port and a Service.
fn source_json() -> Value {
    let mut source = smolvm(
        "prepared",
        json!({
            "image": "python:3.12-slim",
            "branchable": true,
            "resources": {"cpus": 2, "memoryMiB": 2048},
            "command": ["python", "-m", "http.server"],
            "env": [{"name": "MODE", "value": "source"}],
            "network": {"enabled": true, "allowedHosts": ["pypi.org"], "exposeService": true,
                         "ports": [{"hostPort": 18080, "guestPort": 8000, "protocol": "TCP"}]},
            "nodeName": "node-a",
            "restartPolicy": "Never",
            "running": true,
            "suspended": false
        }),
    );
    source["metadata"]["uid"] = json!(SOURCE_UID);
    bound(source, "node-a")
}

fn source() -> SmolVM {
    serde_json::from_value(source_json()).unwrap_or_else(|e| panic!("the source decodes: {e}"))
}

/// A SmolVM of the namespace that is not branchable.
fn plain() -> SmolVM {
    serde_json::from_value(smolvm("plain", json!({"image": "alpine"}))).unwrap_or_else(|e| panic!("decodes: {e}"))
}

fn with_ctx<T>(sources: &Vec<SmolVM>, f: impl FnOnce(&Context<'_>) -> T) -> T {
    let policy = Policy::default();
    let nodes = vec![fixtures::node("node-a", 64, 1 << 20, 1 << 14)];
    let identity = fixtures::user();
    f(&Context {
        policy: &policy,
        nodes: &nodes,
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources,
        identity: &identity,
    })
}

/// A SmolVM at CREATE with every default, its source's spec first.
fn filled(object: &Value, sources: &[SmolVM]) -> Value {
    let name = smolvm_api::branch::source_named(object).unwrap_or("");
    let source = sources.iter().find(|s| s.metadata.name.as_deref() == Some(name));
    let patch = match source {
        Some(source) => default_branch_smolvm(Operation::Create, object, source, &smolvm_api::class::NO_CLASSES),
        None => default_smolvm(Operation::Create, object),
    };
    let mut out = object.clone();
    json_patch::patch(&mut out, &patch).unwrap_or_else(|e| panic!("the patch applies: {e}"));
    out
}

#[test]
fn m5_fills_a_branch_from_its_source_but_not_what_a_clone_cannot_share() {
    let sources = vec![source()];
    let own_ports = json!([{"hostPort": 19080, "guestPort": 8000}]);
    let cases: Vec<(&str, Value, Pointers)> = vec![
        (
            "env only: no published port, no Service",
            json!({"branchOf": {"name": "prepared"}, "env": [{"name": "TASK", "value": "7"}]}),
            vec![
                ("/spec/image", Some(json!("python:3.12-slim"))),
                ("/spec/resources", Some(json!({"cpus": 2, "memoryMiB": 2048}))),
                ("/spec/command", Some(json!(["python", "-m", "http.server"]))),
                ("/spec/restartPolicy", Some(json!("Never"))),
                (
                    "/spec/network",
                    Some(json!({"enabled": true, "allowedHosts": ["pypi.org"], "exposeService": false})),
                ),
                // Its own env only: the source's is in the clone's memory already.
                ("/spec/env", Some(json!([{"name": "TASK", "value": "7"}]))),
                ("/spec/branchable", None),
                ("/spec/nodeName", None),
                ("/spec/volumes", None),
                // M1 on what M5 left.
                ("/spec/running", Some(json!(true))),
                ("/spec/storage", Some(json!({"storageGiB": 20, "overlayGiB": 10}))),
            ],
        ),
        (
            "ports of its own: those, and the source's Service setting with them",
            json!({"branchOf": {"name": "prepared"}, "network": {"ports": own_ports.clone()}}),
            vec![
                ("/spec/network/ports/0/hostPort", Some(json!(19080))),
                ("/spec/network/ports/0/protocol", Some(json!("TCP"))),
                ("/spec/network/ports/1", None),
                ("/spec/network/exposeService", Some(json!(true))),
                ("/spec/network/enabled", Some(json!(true))),
                ("/spec/env", None),
            ],
        ),
        (
            "its own running and suspended stay its own",
            json!({"branchOf": {"name": "prepared"}, "running": false, "suspended": true}),
            vec![
                ("/spec/running", Some(json!(false))),
                ("/spec/suspended", Some(json!(true))),
            ],
        ),
    ];
    for (name, spec, expected) in cases {
        let out = filled(&smolvm("task", spec), &sources);
        for (pointer, want) in expected {
            assert_eq!(out.pointer(pointer), want.as_ref(), "{name}: {pointer} in {out:#}");
        }
        assert_eq!(out["metadata"]["labels"][LABEL_BRANCH_OF], json!("prepared"), "{name}");
        assert_eq!(
            out["metadata"]["annotations"][ANNOTATION_BRANCH_OF_UID],
            json!(SOURCE_UID),
            "{name}: the source's UID is recorded"
        );
        assert!(
            out["metadata"]["finalizers"].is_array(),
            "{name}: M2 still adds the finalizer"
        );
        let verdict = with_ctx(&sources, |ctx| validate_smolvm_json(Operation::Create, None, &out, ctx));
        assert!(verdict.allowed(), "{name}: {}", verdict.message());
        assert_eq!(filled(&out, &sources), out, "{name}: M5 is idempotent");
    }
    // An UPDATE is never filled from the source.
    let out = filled(&smolvm("task", json!({"branchOf": {"name": "prepared"}})), &sources);
    let update = default_branch_smolvm(Operation::Update, &out, &sources[0], &smolvm_api::class::NO_CLASSES);
    assert!(update.0.is_empty(), "{update:?}");
}

#[test]
fn m5_labels_a_branch_source_at_create_only() {
    let cases = [
        (
            "branchable",
            json!({"image": "alpine", "branchable": true}),
            Operation::Create,
            true,
        ),
        (
            "not branchable",
            json!({"image": "alpine", "branchable": false}),
            Operation::Create,
            false,
        ),
        ("no field", json!({"image": "alpine"}), Operation::Create, false),
        (
            "an update",
            json!({"image": "alpine", "branchable": true}),
            Operation::Update,
            false,
        ),
    ];
    for (name, spec, op, labelled) in cases {
        let object = smolvm("src", spec);
        let patch = default_branch_source(op, &object, &smolvm_api::class::NO_CLASSES);
        let mut out = object.clone();
        json_patch::patch(&mut out, &patch).unwrap_or_else(|e| panic!("{name}: the patch applies: {e}"));
        let label = out.pointer(&format!("/metadata/labels/{}", LABEL_BRANCHABLE.replace('/', "~1")));
        assert_eq!(label.is_some(), labelled, "{name}: {out:#}");
        assert_eq!(out["spec"]["running"], json!(true), "{name}: M1 still applies");
    }
}

#[test]
fn v17_a_branch_sets_only_what_a_clone_carries_of_its_own() {
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "no source: not this rule's",
            json!({"image": "alpine", "cpus": 1}),
            vec![],
        ),
        (
            "branchOf, env, running, suspended, lifecycle and its own ports",
            json!({"branchOf": {"name": "p"}, "env": [{"name": "A", "value": "1"}], "running": true,
                   "suspended": false, "lifecycle": {"activeDeadlineSeconds": 600},
                   "network": {"ports": [{"hostPort": 19080, "guestPort": 80}]}}),
            vec![],
        ),
        (
            "a null field is no field",
            json!({"branchOf": {"name": "p"}, "image": null}),
            vec![],
        ),
        (
            "an image, a size, a pin and a Service: each named",
            json!({"branchOf": {"name": "p"}, "image": "alpine", "resources": {"cpus": 2}, "nodeName": "node-a",
                   "network": {"exposeService": true, "enabled": true}}),
            vec![
                "spec.image",
                "spec.network.enabled",
                "spec.network.exposeService",
                "spec.nodeName",
                "spec.resources",
            ],
        ),
        (
            "volumes and branchable",
            json!({"branchOf": {"name": "p"}, "branchable": true, "volumes": []}),
            vec!["spec.branchable", "spec.volumes"],
        ),
    ];
    for (name, spec, expected) in cases {
        let verdict = validate_branch_request(&smolvm("vm", spec));
        assert_well_formed(name, &verdict);
        let mut got: Vec<String> = verdict.violations.iter().map(|f| f.path.clone()).collect();
        got.sort();
        assert_eq!(got, expected, "{name}");
        assert!(verdict.violations.iter().all(|f| f.rule == RuleId::V17), "{name}");
    }
}

type Expected = Vec<(RuleId, &'static str)>;

/// `(pointer, value)` of a filled object; `None` for a pointer that must be absent.
type Pointers = Vec<(&'static str, Option<Value>)>;

/// `(name, sources, operation, old, new, expected violations)`.
type Case<'a> = (&'static str, &'a Vec<SmolVM>, Operation, Option<Value>, Value, Expected);

/// `(name, operation, old, new, V17 violations, V17 warnings)`.
type AnnotationCase = (&'static str, Operation, Option<Value>, Value, usize, usize);

#[test]
fn v17_a_branch_names_a_branchable_source_and_never_changes_it() {
    let sources = vec![source(), plain()];
    let branch = filled(&smolvm("task", json!({"branchOf": {"name": "prepared"}})), &sources);
    let with = |mut object: Value, pointer: &str, value: Value| {
        if let Some(slot) = object.pointer_mut(pointer) {
            *slot = value;
        }
        object
    };
    let mut gone = sources.clone();
    gone[0].metadata.deletion_timestamp = serde_json::from_value(json!("2026-12-03T10:00:00Z")).ok();
    let volume = json!([{"name": "data", "mountPath": "/data", "claimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}]);
    let mut source_with_volume = source_json();
    source_with_volume["spec"]["volumes"] = volume;
    let cases: Vec<Case<'_>> = vec![
        (
            "filled from a known source",
            &sources,
            Operation::Create,
            None,
            branch.clone(),
            vec![],
        ),
        (
            "an unknown source: named, with the namespace's sources; no image finding",
            &sources,
            Operation::Create,
            None,
            smolvm("task", json!({"branchOf": {"name": "nope"}})),
            vec![(RuleId::V17, "spec.branchOf.name")],
        ),
        (
            "a source that is not branchable",
            &sources,
            Operation::Create,
            None,
            smolvm("task", json!({"branchOf": {"name": "plain"}})),
            vec![(RuleId::V17, "spec.branchOf.name")],
        ),
        (
            "a source being deleted",
            &gone,
            Operation::Create,
            None,
            branch.clone(),
            vec![(RuleId::V17, "spec.branchOf.name")],
        ),
        (
            "a branchable SmolVM with a volume",
            &sources,
            Operation::Create,
            None,
            source_with_volume,
            vec![(RuleId::V17, "spec.volumes")],
        ),
        (
            "a branch that is branchable",
            &sources,
            Operation::Create,
            None,
            set_spec(branch.clone(), "branchable", json!(true)),
            vec![(RuleId::V17, "spec.branchable")],
        ),
        (
            "stopped and suspended",
            &sources,
            Operation::Update,
            Some(branch.clone()),
            with(
                with(branch.clone(), "/spec/running", json!(false)),
                "/spec/suspended",
                json!(true),
            ),
            vec![],
        ),
        (
            "resized",
            &sources,
            Operation::Update,
            Some(branch.clone()),
            with(branch.clone(), "/spec/resources/cpus", json!(4)),
            vec![(RuleId::V17, "spec.resources")],
        ),
        (
            "another source",
            &sources,
            Operation::Update,
            Some(branch.clone()),
            with(branch.clone(), "/spec/branchOf/name", json!("other")),
            vec![(RuleId::V17, "spec.branchOf")],
        ),
        (
            "a source that stops being branchable",
            &sources,
            Operation::Update,
            Some(source_json()),
            with(source_json(), "/spec/branchable", json!(false)),
            vec![(RuleId::V17, "spec.branchable")],
        ),
    ];
    for (name, sources, op, old, new, expected) in cases {
        let verdict = with_ctx(sources, |ctx| validate_smolvm_json(op, old.as_ref(), &new, ctx));
        assert_violations(name, &verdict, &expected);
    }
    let unknown = with_ctx(&sources, |ctx| {
        validate_smolvm_json(
            Operation::Create,
            None,
            &smolvm("task", json!({"branchOf": {"name": "nope"}})),
            ctx,
        )
    });
    let message = unknown.message();
    assert!(
        message.contains("prepared"),
        "the namespace's sources are listed: {message}"
    );
    assert!(!message.contains("plain"), "only branchable ones: {message}");
}

/// `object` with `spec.<field>` set to `value`.
fn set_spec(mut object: Value, field: &str, value: Value) -> Value {
    object["spec"][field] = value;
    object
}

#[test]
fn v17_the_delete_branches_annotation_is_exactly_true_on_a_source_being_deleted() {
    let sources = vec![source()];
    let annotated = |object: Value, value: &str| {
        let mut object = object;
        object["metadata"]["annotations"] = json!({DELETE_BRANCHES_ANNOTATION: value});
        object
    };
    let plain_vm = bound(smolvm("plain", json!({"image": "alpine"})), "node-a");
    let cases: Vec<AnnotationCase> = vec![
        (
            "set on a source being deleted: a warning",
            Operation::Update,
            Some(deleting(source_json())),
            annotated(deleting(source_json()), "true"),
            0,
            1,
        ),
        (
            "another value",
            Operation::Update,
            Some(deleting(source_json())),
            annotated(deleting(source_json()), "yes"),
            1,
            0,
        ),
        (
            "before the delete",
            Operation::Update,
            Some(source_json()),
            annotated(source_json(), "true"),
            1,
            0,
        ),
        (
            "at create",
            Operation::Create,
            None,
            annotated(smolvm("src", json!({"image": "alpine", "branchable": true})), "true"),
            1,
            0,
        ),
        (
            "on a SmolVM that is not branchable",
            Operation::Update,
            Some(deleting(plain_vm.clone())),
            annotated(deleting(plain_vm), "true"),
            1,
            0,
        ),
    ];
    for (name, op, old, new, violations_n, warnings_n) in cases {
        let verdict = with_ctx(&sources, |ctx| validate_smolvm_json(op, old.as_ref(), &new, ctx));
        assert_well_formed(name, &verdict);
        let v17 = |list: &[smolvm_api::validate::Finding]| list.iter().filter(|f| f.rule == RuleId::V17).count();
        assert_eq!(v17(&verdict.violations), violations_n, "{name}: {}", verdict.message());
        assert_eq!(v17(&verdict.warnings), warnings_n, "{name}: {:?}", verdict.warnings);
    }
}

/// `deploy/examples/branches.yaml`: its source passes every rule, and its branch, filled from the
/// source, too.
#[test]
fn the_example_source_and_branch_are_admitted() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/branches.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut objects = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let mut value = <Value as serde::Deserialize>::deserialize(doc).unwrap_or_else(|e| panic!("YAML: {e}"));
        if !value.is_null() {
            value["metadata"]["namespace"] = json!("default");
            objects.push(value);
        }
    }
    let [source, branch] = objects.as_slice() else {
        panic!("a source and a branch: {objects:?}")
    };
    let source = {
        let mut out = source.clone();
        let patch = default_branch_source(Operation::Create, source, &smolvm_api::class::NO_CLASSES);
        json_patch::patch(&mut out, &patch).unwrap_or_else(|e| panic!("the patch applies: {e}"));
        out
    };
    let verdict = with_ctx(&vec![], |ctx| {
        validate_smolvm_json(Operation::Create, None, &source, ctx)
    });
    assert!(verdict.allowed(), "the source: {}", verdict.message());
    let mut stored = source.clone();
    stored["metadata"]["uid"] = json!(SOURCE_UID);
    let sources: Vec<SmolVM> = vec![serde_json::from_value(stored).unwrap_or_else(|e| panic!("decodes: {e}"))];
    assert!(validate_branch_request(branch).allowed());
    let filled = filled(branch, &sources);
    let verdict = with_ctx(&sources, |ctx| {
        validate_smolvm_json(Operation::Create, None, &filled, ctx)
    });
    assert!(verdict.allowed(), "the branch: {}", verdict.message());
    assert_eq!(filled["spec"]["image"], json!("python:3.12-slim"));
}

/// A branch's className is its source's (M5): a class deleted since the source was made does not
/// keep it from being branched (V12 judges a class a SmolVM takes its defaults from), while a
/// SmolVM that is no branch still may not name it.
#[test]
fn a_branch_of_a_source_whose_class_is_gone_is_admitted() {
    let mut stored = source_json();
    stored["spec"]["className"] = json!("retired");
    let sources: Vec<SmolVM> = vec![serde_json::from_value(stored).unwrap_or_else(|e| panic!("decodes: {e}"))];
    let branch = smolvm("task", json!({"branchOf": {"name": "prepared"}}));
    let filled = filled(&branch, &sources);
    assert_eq!(
        filled["spec"]["className"],
        json!("retired"),
        "the source's class name is copied"
    );
    let verdict = with_ctx(&sources, |ctx| {
        validate_smolvm_json(Operation::Create, None, &filled, ctx)
    });
    assert!(verdict.allowed(), "the branch: {}", verdict.message());
    let plain = smolvm("plain", json!({"image": "alpine", "className": "retired"}));
    let verdict = with_ctx(&sources, |ctx| {
        validate_smolvm_json(Operation::Create, None, &plain, ctx)
    });
    assert!(
        verdict.violations.iter().any(|f| f.rule == RuleId::V12),
        "a SmolVM that is no branch names no missing class: {}",
        verdict.message()
    );
}
