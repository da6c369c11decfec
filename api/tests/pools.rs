//! Warm pool rules: M4 (a pooled SmolVM filled from its pool's template at CREATE, before M3 and
//! M1) and V14 (a pool's template passes every SmolVM rule; a pooled SmolVM names a known pool,
//! never changes it and sets only what a lease carries), table-driven.

use serde_json::{Value, json};
use smolvm_api::{
    SmolVMClass, SmolVMPool,
    constants::{ANNOTATION_POOL_GENERATION, ANNOTATION_POOL_UID, LABEL_CLASS, LABEL_POOL},
    defaulting::{default_pooled_smolvm, default_smolvm},
    fixtures::{self, assert_violations, assert_well_formed, bound, class, pool, pool_json, smolvm, violations},
    policy::Policy,
    validate::{Context, Operation, Raw, RuleId, Target, validate_pooled_request, validate_raw, validate_smolvm_json},
};

/// The template every case starts from: a sandbox image with a class and an env entry.
fn template() -> Value {
    json!({
        "image": "python:3.12-slim",
        "className": "medium",
        "command": ["python", "-m", "http.server"],
        "env": [{"name": "MODE", "value": "pool"}, {"name": "LEVEL", "value": "info"}],
        "network": {"enabled": true, "allowedHosts": ["pypi.org"]},
        "restartPolicy": "Never"
    })
}

fn sandboxes() -> SmolVMPool {
    pool(
        "sandboxes",
        json!({"template": template(), "slotsPerNode": 3, "nodeSelector": {"vm.smolvm.dev/pool": "yes"}}),
    )
}

fn classes() -> Vec<SmolVMClass> {
    vec![class(
        "medium",
        json!({"resources": {"cpus": 2, "memoryMiB": 2048}, "terminationGracePeriodSeconds": 5}),
        false,
    )]
}

fn with_ctx<T>(pools: &Vec<SmolVMPool>, f: impl FnOnce(&Context<'_>) -> T) -> T {
    let policy = Policy {
        max_slots_per_node: 8,
        ..Policy::default()
    };
    let nodes = vec![fixtures::node("node-a", 64, 1 << 20, 1 << 14)];
    let classes = classes();
    let identity = fixtures::user();
    f(&Context {
        policy: &policy,
        nodes: &nodes,
        classes: &classes,
        pools,
        sources: &smolvm_api::branch::NO_SOURCES,
        identity: &identity,
    })
}

/// The violations a case expects: each rule with the path it is at (or under).
type Expected = Vec<(RuleId, &'static str)>;

#[test]
fn v14_a_pools_template_passes_every_smolvm_rule_all_at_once() {
    let t = template();
    let with = |pointer: &str, value: Value| {
        let mut spec = json!({"template": t.clone(), "slotsPerNode": 2});
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        spec.pointer_mut(parent).unwrap()[key] = value;
        spec
    };
    let cases: Vec<(&str, Value, Expected)> = vec![
        (
            "the template as it is",
            json!({"template": t.clone(), "slotsPerNode": 3}),
            vec![],
        ),
        ("no slots: kept, served cold", with("/slotsPerNode", json!(0)), vec![]),
        (
            "a bad image",
            with("/template/image", json!("Alpine Latest")),
            vec![(RuleId::V1, "spec.template.image")],
        ),
        (
            "CPUs beyond the policy",
            with("/template/resources", json!({"cpus": 99})),
            vec![(RuleId::V2, "spec.template.resources.cpus")],
        ),
        (
            "a host port: several slots cannot publish it",
            with(
                "/template/network",
                json!({"enabled": true, "ports": [{"hostPort": 8080, "guestPort": 80}]}),
            ),
            vec![(RuleId::V14, "spec.template.network.ports")],
        ),
        (
            "an unknown class",
            with("/template/className", json!("huge")),
            vec![(RuleId::V14, "spec.template.className")],
        ),
        (
            "slots beyond the policy",
            with("/slotsPerNode", json!(9)),
            vec![(RuleId::V14, "spec.slotsPerNode")],
        ),
        (
            "negative slots",
            with("/slotsPerNode", json!(-1)),
            vec![(RuleId::V14, "spec.slotsPerNode")],
        ),
        (
            "a bad nodeSelector key",
            with("/nodeSelector", json!({"bad key": "x"})),
            vec![(RuleId::V4, "spec.nodeSelector")],
        ),
        (
            "a duplicate env name",
            with(
                "/template/env",
                json!([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
            ),
            vec![(RuleId::V11, "spec.template.env[1].name")],
        ),
        (
            "everything wrong at once",
            json!({"template": {"image": "Bad Image", "className": "huge", "resources": {"memoryMiB": 1}}, "slotsPerNode": 100}),
            vec![
                (RuleId::V1, "spec.template.image"),
                (RuleId::V2, "spec.template.resources.memoryMiB"),
                (RuleId::V14, "spec.template.className"),
                (RuleId::V14, "spec.slotsPerNode"),
            ],
        ),
    ];
    let pools = Vec::new();
    for (name, spec, expected) in cases {
        let object = pool_json("p", spec);
        let verdict = with_ctx(&pools, |ctx| {
            validate_raw(Target::SmolVMPool, Operation::Create, None, Raw::Value(&object), ctx)
        });
        assert_well_formed(name, &verdict);
        let got = violations(&verdict);
        for (rule, path) in &expected {
            assert!(
                got.iter().any(|(r, p)| r == rule && p.starts_with(path)),
                "{name}: no {rule} at {path} in {got:#?}"
            );
        }
        if expected.is_empty() {
            assert!(verdict.allowed(), "{name}: {got:#?}");
        }
        // The same at UPDATE.
        let update = with_ctx(&pools, |ctx| {
            validate_raw(
                Target::SmolVMPool,
                Operation::Update,
                Some(Raw::Value(&object)),
                Raw::Value(&object),
                ctx,
            )
        });
        assert_eq!(violations(&update), got, "{name}: UPDATE judges as CREATE");
    }
}

#[test]
fn v14_a_pooled_smolvm_names_a_known_pool_and_never_changes_it() {
    let pools = vec![sandboxes()];
    let filled = filled(&smolvm("vm", json!({"poolRef": {"name": "sandboxes"}})), &pools);
    let mut resized = filled.clone();
    resized["spec"]["resources"]["cpus"] = json!(4);
    let mut moved = filled.clone();
    moved["spec"]["poolRef"]["name"] = json!("other");
    let mut stopped = filled.clone();
    stopped["spec"]["running"] = json!(false);
    stopped["spec"]["suspended"] = json!(true);
    let mut retagged = filled.clone();
    retagged["spec"]["image"] = json!("python:3.13-slim");
    let cases: Vec<(&str, Operation, Option<Value>, Value, Expected)> = vec![
        (
            "filled from a known pool",
            Operation::Create,
            None,
            filled.clone(),
            vec![],
        ),
        (
            "an unknown pool: named, with the namespace's pools; no image finding",
            Operation::Create,
            None,
            smolvm("vm", json!({"poolRef": {"name": "nope"}})),
            vec![(RuleId::V14, "spec.poolRef.name")],
        ),
        (
            "stopped and suspended",
            Operation::Update,
            Some(filled.clone()),
            stopped,
            vec![],
        ),
        (
            "resized",
            Operation::Update,
            Some(filled.clone()),
            resized,
            vec![(RuleId::V14, "spec.resources")],
        ),
        (
            "a new image, bound: V6 and V14 both say so",
            Operation::Update,
            Some(bound(filled.clone(), "node-a")),
            bound(retagged, "node-a"),
            vec![(RuleId::V14, "spec.image"), (RuleId::V6, "spec.image")],
        ),
        (
            "another pool",
            Operation::Update,
            Some(filled.clone()),
            moved,
            vec![(RuleId::V14, "spec.poolRef")],
        ),
    ];
    for (name, op, old, new, expected) in cases {
        let verdict = with_ctx(&pools, |ctx| validate_smolvm_json(op, old.as_ref(), &new, ctx));
        assert_violations(name, &verdict, &expected);
    }
    let unknown = with_ctx(&pools, |ctx| {
        validate_smolvm_json(
            Operation::Create,
            None,
            &smolvm("vm", json!({"poolRef": {"name": "nope"}})),
            ctx,
        )
    });
    assert!(
        unknown.violations[0].message.contains("sandboxes"),
        "the namespace's pools are listed: {}",
        unknown.message()
    );
}

#[test]
fn v14_a_pooled_smolvm_sets_only_what_a_lease_carries() {
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "no pool: not this rule's",
            json!({"image": "alpine", "cpus": 1}),
            vec![],
        ),
        (
            "poolRef, env, running and suspended",
            json!({"poolRef": {"name": "p"}, "env": [{"name": "JOB", "value": "7"}], "running": true, "suspended": false}),
            vec![],
        ),
        (
            "a null field is no field",
            json!({"poolRef": {"name": "p"}, "image": null}),
            vec![],
        ),
        (
            "an image, a size and a pin: each named",
            json!({"poolRef": {"name": "p"}, "image": "alpine", "resources": {"cpus": 2}, "nodeName": "node-a"}),
            vec!["spec.image", "spec.nodeName", "spec.resources"],
        ),
    ];
    for (name, spec, expected) in cases {
        let verdict = validate_pooled_request(&smolvm("vm", spec));
        assert_well_formed(name, &verdict);
        let mut got: Vec<String> = verdict.violations.iter().map(|f| f.path.clone()).collect();
        got.sort();
        assert_eq!(got, expected, "{name}");
        assert!(verdict.violations.iter().all(|f| f.rule == RuleId::V14), "{name}");
    }
}

/// A SmolVM at CREATE with every default, the pool's template first.
fn filled(object: &Value, pools: &[SmolVMPool]) -> Value {
    let name = object
        .pointer("/spec/poolRef/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let pool = pools.iter().find(|p| p.metadata.name.as_deref() == Some(name));
    let patch = match pool {
        Some(pool) => default_pooled_smolvm(Operation::Create, object, pool, &classes()),
        None => default_smolvm(Operation::Create, object),
    };
    let mut out = object.clone();
    json_patch::patch(&mut out, &patch).unwrap_or_else(|e| panic!("the patch applies: {e}"));
    out
}

#[test]
fn m4_fills_a_pooled_smolvm_from_the_template_then_m3_and_m1() {
    let pools = vec![sandboxes()];
    let sent = smolvm(
        "vm",
        json!({"poolRef": {"name": "sandboxes"}, "env": [{"name": "LEVEL", "value": "debug"}, {"name": "JOB", "value": "7"}]}),
    );
    let out = filled(&sent, &pools);
    for (pointer, want) in [
        ("/spec/image", json!("python:3.12-slim")),
        ("/spec/command", json!(["python", "-m", "http.server"])),
        ("/spec/network/allowedHosts", json!(["pypi.org"])),
        ("/spec/restartPolicy", json!("Never")),
        ("/spec/nodeSelector", json!({"vm.smolvm.dev/pool": "yes"})),
        // The template's env, then the SmolVM's own, which wins by name.
        (
            "/spec/env",
            json!([{"name": "MODE", "value": "pool"}, {"name": "LEVEL", "value": "debug"}, {"name": "JOB", "value": "7"}]),
        ),
        // M3 from the template's class, then M1.
        ("/spec/className", json!("medium")),
        ("/spec/resources", json!({"cpus": 2, "memoryMiB": 2048})),
        ("/spec/terminationGracePeriodSeconds", json!(5)),
        ("/spec/storage", json!({"storageGiB": 20, "overlayGiB": 10})),
        ("/spec/running", json!(true)),
        ("/spec/suspended", json!(false)),
        ("/spec/poolRef", json!({"name": "sandboxes"})),
    ] {
        assert_eq!(out.pointer(pointer), Some(&want), "{pointer} in {out:#}");
    }
    let labels = &out["metadata"]["labels"];
    assert_eq!(labels[LABEL_POOL], json!("sandboxes"));
    assert_eq!(labels[LABEL_CLASS], json!("medium"));
    assert_eq!(out["metadata"]["annotations"][ANNOTATION_POOL_GENERATION], json!("3"));
    // The pool's whole UID, so that a pool made again under the same name never serves it.
    assert_eq!(
        out["metadata"]["annotations"][ANNOTATION_POOL_UID],
        json!(sandboxes().metadata.uid),
        "the pool's UID is recorded"
    );
    assert!(out["metadata"]["finalizers"].is_array(), "M2 still adds the finalizer");

    // The filled SmolVM passes every rule, and filling it again changes nothing.
    let verdict = with_ctx(&pools, |ctx| validate_smolvm_json(Operation::Create, None, &out, ctx));
    assert!(verdict.allowed(), "{}", verdict.message());
    assert_eq!(filled(&out, &pools), out, "M4 is idempotent");

    // Without env of its own, the template's list is taken as it is.
    let plain = filled(&smolvm("vm", json!({"poolRef": {"name": "sandboxes"}})), &pools);
    assert_eq!(plain["spec"]["env"], template()["env"]);

    // An UPDATE is never filled from the pool.
    let update = default_pooled_smolvm(Operation::Update, &out, &pools[0], &classes());
    assert!(update.0.is_empty(), "{update:?}");
}
