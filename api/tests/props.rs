//! Property tests: defaulting is idempotent (M1, M2, and M3 with any class), every defaulted
//! object that obeys the policy validates (with any in-policy class too), no input (arbitrary JSON, arbitrary old/new pairs) makes the rules panic, and JSON
//! text gets the verdict its parsed Value gets.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use smolvm_api::{
    SmolVMClass, SmolVMNode,
    defaulting::{default_smolvm, default_smolvm_with_class},
    fixtures,
    policy::Policy,
    validate::{
        Context, Identity, Operation, Raw, Target, validate_raw, validate_smolvm_json, validate_smolvm_node_json,
        validate_smolvm_status_json,
    },
};

const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "uid",
    "annotations",
    "finalizers",
    "deletionTimestamp",
    "spec",
    "status",
    "running",
    "image",
    "nodeName",
    "nodeSelector",
    "resources",
    "cpus",
    "memoryMiB",
    "storage",
    "storageGiB",
    "overlayGiB",
    "network",
    "enabled",
    "ports",
    "hostPort",
    "guestPort",
    "protocol",
    "allowedCIDRs",
    "nodeUID",
    "phase",
    "endpoint",
    "address",
    "port",
    "unschedulable",
    "allocatable",
    "vm.smolvm.dev/force-delete-local-state",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-70000i64..70000).prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[a-zA-Z0-9:/._@ -]{0,24}".prop_map(Value::String),
        prop::sample::select(vec![
            "alpine",
            "local:x",
            "true",
            "TCP",
            "UDP",
            "10.0.0.0/8",
            "node-a",
            "2026-01-01T00:00:00Z"
        ])
        .prop_map(|s| Value::String(s.to_string())),
    ]
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|entries| {
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect::<Map<String, Value>>(),
                )
            }),
        ]
    })
}

/// SmolVM-shaped objects whose fields may be absent, null, or of any type.
fn smolvm_like() -> impl Strategy<Value = Value> {
    let field = || prop::option::of(arbitrary_json());
    (
        (field(), field(), field(), field(), field(), field(), any::<bool>()),
        workload_like(),
    )
        .prop_map(
            |((running, image, resources, storage, network, selector, deleting), workload)| {
                let mut spec = Map::new();
                for (key, value) in [
                    ("running", running),
                    ("image", image),
                    ("resources", resources),
                    ("storage", storage),
                    ("network", network),
                    ("nodeSelector", selector),
                ] {
                    if let Some(v) = value {
                        spec.insert(key.to_string(), v);
                    }
                }
                spec.extend(workload);
                let mut object = fixtures::smolvm("p", Value::Object(spec));
                if deleting {
                    object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                }
                object
            },
        )
}

/// The workload's fields (V11), each absent, of any JSON, or of roughly the right shape with
/// arbitrary contents (so the checks behind the shape are reached too).
fn workload_like() -> impl Strategy<Value = Map<String, Value>> {
    let any_or = |shaped: BoxedStrategy<Value>| prop::option::of(prop_oneof![arbitrary_json(), shaped]);
    let text = || prop_oneof![".{0,12}", "/[a-z/]{0,8}", Just(String::new())].prop_map(Value::from);
    let strings = move || prop::collection::vec(text(), 0..4).prop_map(Value::from).boxed();
    let key_ref = move || {
        (text(), text(), prop::option::of(any::<bool>()))
            .prop_map(|(name, key, optional)| json!({"name": name, "key": key, "optional": optional}))
    };
    let env_entry = (
        text(),
        prop::option::of(text()),
        prop::option::of(prop::option::of(key_ref())),
        prop::option::of(prop::option::of(key_ref())),
    )
        .prop_map(|(name, value, secret, config_map)| {
            let mut e = json!({"name": name});
            if let Some(v) = value {
                e["value"] = v;
            }
            if secret.is_some() || config_map.is_some() {
                e["valueFrom"] = json!({"secretKeyRef": secret.flatten(), "configMapKeyRef": config_map.flatten()});
            }
            e
        });
    let env = prop::collection::vec(env_entry, 0..4).prop_map(Value::from).boxed();
    let pull = prop::collection::vec(text().prop_map(|n| json!({"name": n})), 0..3)
        .prop_map(Value::from)
        .boxed();
    let policy = prop_oneof![Just("Always"), Just("OnFailure"), Just("Never"), Just("always")]
        .prop_map(Value::from)
        .boxed();
    let grace = prop_oneof![-1i64..=301, Just(i64::MAX), Just(i64::MIN)]
        .prop_map(Value::from)
        .boxed();
    (
        any_or(strings()),
        any_or(strings()),
        any_or(text().boxed()),
        any_or(env),
        any_or(pull),
        any_or(policy),
        any_or(grace),
    )
        .prop_map(|(command, args, dir, env, pull, policy, grace)| {
            [
                ("command", command),
                ("args", args),
                ("workingDir", dir),
                ("env", env),
                ("imagePullSecrets", pull),
                ("restartPolicy", policy),
                ("terminationGracePeriodSeconds", grace),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
            .collect()
        })
}

/// Specs that obey the default policy, with any subset of fields left for defaulting.
fn valid_spec() -> impl Strategy<Value = Value> {
    let image = prop::sample::select(vec![
        "alpine",
        "alpine:3.20",
        "registry.example.com/org/app:v1",
        "localhost:5000/a/b",
        "local:img",
    ]);
    // Outside the default policy's excluded host ports (the node's services, NodePorts, the agent's).
    let host_port = (1024i32..65535).prop_filter("an excluded host port", |p| {
        smolvm_api::Policy::default()
            .excluded_host_port(i64::from(*p))
            .is_none()
    });
    let ports = prop::collection::btree_set((host_port, any::<bool>()), 0..=16).prop_map(|set| {
        set.into_iter()
            .enumerate()
            .map(|(i, (host, udp))| {
                let mut p = json!({"hostPort": host, "guestPort": 1 + i as i32});
                if udp {
                    p["protocol"] = json!("UDP");
                }
                p
            })
            .collect::<Vec<_>>()
    });
    (
        image,
        prop::option::of(any::<bool>()),
        prop::option::of((prop::option::of(1i32..=32), prop::option::of(128i64..=131072))),
        prop::option::of((prop::option::of(1i64..=2048), prop::option::of(1i64..=1024))),
        prop::option::of((any::<bool>(), ports, prop::collection::vec((0u8..=255, 0u8..=32), 0..4))),
        valid_workload(),
    )
        .prop_map(|(image, running, resources, storage, network, workload)| {
            let mut spec = json!({"image": image});
            if let Some(map) = spec.as_object_mut() {
                map.extend(workload);
            }
            if let Some(r) = running {
                spec["running"] = json!(r);
            }
            if let Some((cpus, memory)) = resources {
                let mut r = json!({});
                if let Some(c) = cpus {
                    r["cpus"] = json!(c);
                }
                if let Some(m) = memory {
                    r["memoryMiB"] = json!(m);
                }
                spec["resources"] = r;
            }
            if let Some((size, overlay)) = storage {
                let mut s = json!({});
                if let Some(x) = size {
                    s["storageGiB"] = json!(x);
                }
                if let Some(x) = overlay {
                    s["overlayGiB"] = json!(x);
                }
                spec["storage"] = s;
            }
            if let Some((enabled, ports, cidrs)) = network {
                let mut n = json!({"enabled": enabled});
                if enabled {
                    n["ports"] = json!(ports);
                    n["allowedCIDRs"] = json!(
                        cidrs
                            .iter()
                            .map(|(a, len)| format!("10.{a}.0.0/{len}"))
                            .collect::<Vec<_>>()
                    );
                }
                spec["network"] = n;
            }
            fixtures::smolvm("valid", spec)
        })
}

/// Workload fields within the default policy, any subset of them.
fn valid_workload() -> impl Strategy<Value = Map<String, Value>> {
    let strings = prop::collection::vec("[ -~]{0,40}", 0..8);
    let env = prop::collection::btree_map("[A-Za-z_][A-Za-z0-9_.-]{0,20}", (0u8..3, "[ -~]{0,40}"), 0..8).prop_map(
        |vars| {
            vars.into_iter()
                .map(|(name, (kind, text))| match kind {
                    0 => json!({"name": name, "value": text}),
                    1 => json!({"name": name, "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}),
                    _ => json!({"name": name, "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "mode", "optional": true}}}),
                })
                .collect::<Vec<_>>()
        },
    );
    (
        prop::option::of(strings.clone()),
        prop::option::of(strings),
        prop::option::of("/[a-z0-9/]{0,30}"),
        prop::option::of(env),
        prop::option::of(prop::sample::select(vec!["Always", "OnFailure", "Never"])),
        prop::option::of(0i64..=300),
    )
        .prop_map(|(command, args, dir, env, policy, grace)| {
            let mut out = Map::new();
            if let Some(v) = command {
                out.insert("command".into(), json!(v));
            }
            if let Some(v) = args {
                out.insert("args".into(), json!(v));
            }
            if let Some(v) = dir {
                out.insert("workingDir".into(), json!(v));
            }
            if let Some(v) = env {
                out.insert("env".into(), json!(v));
            }
            if let Some(v) = policy {
                out.insert("restartPolicy".into(), json!(v));
            }
            if let Some(v) = grace {
                out.insert("terminationGracePeriodSeconds".into(), json!(v));
            }
            out
        })
}

fn patched(object: &Value, op: Operation) -> Value {
    let mut doc = object.clone();
    json_patch::patch(&mut doc, &default_smolvm(op, object)).expect("a defaulting patch always applies");
    doc
}

/// A SmolVMClass within the default policy: any subset of its fields, the default or not.
fn valid_class() -> impl Strategy<Value = SmolVMClass> {
    (
        prop::option::of((prop::option::of(1i32..=32), prop::option::of(128i64..=131072))),
        prop::option::of((prop::option::of(1i64..=2048), prop::option::of(1i64..=1024))),
        prop::option::of((prop::option::of(any::<bool>()), 0usize..3, 0usize..3)),
        prop::option::of(prop::sample::select(vec!["Always", "OnFailure", "Never"])),
        prop::option::of(0i64..=300),
        any::<bool>(),
    )
        .prop_map(|(resources, storage, network, restart, grace, default)| {
            let mut spec = json!({});
            if let Some((cpus, memory)) = resources {
                spec["resources"] = json!({});
                if let Some(c) = cpus {
                    spec["resources"]["cpus"] = json!(c);
                }
                if let Some(m) = memory {
                    spec["resources"]["memoryMiB"] = json!(m);
                }
            }
            if let Some((size, overlay)) = storage {
                spec["storage"] = json!({});
                if let Some(x) = size {
                    spec["storage"]["storageGiB"] = json!(x);
                }
                if let Some(x) = overlay {
                    spec["storage"]["overlayGiB"] = json!(x);
                }
            }
            if let Some((enabled, cidrs, hosts)) = network {
                spec["network"] = json!({});
                if let Some(e) = enabled {
                    spec["network"]["enabled"] = json!(e);
                }
                // Egress lists need an enabled network (V3, V11).
                if enabled == Some(true) {
                    let cidrs: Vec<String> = (0..cidrs).map(|i| format!("10.{i}.0.0/16")).collect();
                    let hosts: Vec<String> = (0..hosts).map(|i| format!("h{i}.example.com")).collect();
                    spec["network"]["allowedCIDRs"] = json!(cidrs);
                    spec["network"]["allowedHosts"] = json!(hosts);
                }
            }
            if let Some(r) = restart {
                spec["restartPolicy"] = json!(r);
            }
            if let Some(g) = grace {
                spec["terminationGracePeriodSeconds"] = json!(g);
            }
            fixtures::class("c", spec, default)
        })
}

fn patched_with(object: &Value, class: &SmolVMClass) -> Value {
    let mut doc = object.clone();
    json_patch::patch(
        &mut doc,
        &default_smolvm_with_class(Operation::Create, object, Some(class)),
    )
    .expect("a defaulting patch always applies");
    doc
}

fn identities() -> impl Strategy<Value = Identity> {
    prop::sample::select(vec![
        fixtures::user(),
        fixtures::controller(),
        fixtures::runtime_on("node-a"),
        Identity::default(),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn m1_m2_defaulting_is_idempotent(object in smolvm_like(), create in any::<bool>()) {
        let op = if create { Operation::Create } else { Operation::Update };
        let once = patched(&object, op);
        let again = default_smolvm(op, &once);
        prop_assert!(again.0.is_empty(), "second pass added {:?}", again);
    }

    #[test]
    fn m3_defaulting_with_any_class_is_idempotent(object in smolvm_like(), class in valid_class()) {
        let once = patched_with(&object, &class);
        let again = default_smolvm_with_class(Operation::Create, &once, Some(&class));
        prop_assert!(again.0.is_empty(), "second pass added {:?}", again);
        prop_assert!(default_smolvm(Operation::Update, &once).0.is_empty());
    }

    #[test]
    fn defaulted_objects_within_policy_validate_with_any_class(object in valid_spec(), class in valid_class()) {
        let policy = Policy::default();
        let nodes = vec![fixtures::node("node-a", 64, 1 << 20, 1 << 14)];
        let identity = fixtures::user();
        let classes = vec![class.clone()];
        let ctx = Context { policy: &policy, nodes: &nodes, classes: &classes, pools: &smolvm_api::pool::NO_POOLS, sources: &smolvm_api::branch::NO_SOURCES, identity: &identity };
        let defaulted = patched_with(&object, &class);
        let verdict = validate_smolvm_json(Operation::Create, None, &defaulted, &ctx);
        prop_assert!(verdict.allowed(), "{}\n{}", defaulted, verdict.message());
        let class_verdict = validate_raw(
            Target::SmolVMClass,
            Operation::Create,
            None,
            Raw::Value(&serde_json::to_value(&class).unwrap_or_default()),
            &ctx,
        );
        prop_assert!(class_verdict.allowed(), "{}", class_verdict.message());
    }

    #[test]
    fn defaulted_objects_within_policy_validate(object in valid_spec()) {
        let policy = Policy::default();
        let nodes = vec![fixtures::node("node-a", 64, 1 << 20, 1 << 14)];
        let identity = fixtures::user();
        let ctx = Context { policy: &policy, nodes: &nodes, classes: &smolvm_api::class::NO_CLASSES, pools: &smolvm_api::pool::NO_POOLS, sources: &smolvm_api::branch::NO_SOURCES, identity: &identity };
        let defaulted = patched(&object, Operation::Create);
        let verdict = validate_smolvm_json(Operation::Create, None, &defaulted, &ctx);
        prop_assert!(verdict.allowed(), "{}\n{}", defaulted, verdict.message());
        prop_assert!(verdict.warnings.is_empty(), "{:?}", verdict.warnings);
    }

    #[test]
    fn no_input_panics(old in prop::option::of(arbitrary_json()), new in arbitrary_json(), identity in identities()) {
        let policy = Policy::default();
        let nodes: Vec<SmolVMNode> = vec![fixtures::node("node-a", 4, 4096, 100)];
        let ctx = Context { policy: &policy, nodes: &nodes, classes: &smolvm_api::class::NO_CLASSES, pools: &smolvm_api::pool::NO_POOLS, sources: &smolvm_api::branch::NO_SOURCES, identity: &identity };
        for op in [Operation::Create, Operation::Update, Operation::Delete, Operation::Connect] {
            let _ = default_smolvm(op, &new);
            let _ = validate_smolvm_json(op, old.as_ref(), &new, &ctx);
            let _ = validate_smolvm_status_json(op, old.as_ref(), &new, &ctx);
            let _ = validate_smolvm_node_json(op, false, old.as_ref(), &new, &ctx);
            let _ = validate_smolvm_node_json(op, true, old.as_ref(), &new, &ctx);
        }
    }

    #[test]
    fn no_old_new_pair_of_smolvms_panics(old in smolvm_like(), new in smolvm_like(), bind in any::<bool>(), identity in identities()) {
        let policy = Policy::default();
        let nodes: Vec<SmolVMNode> = vec![fixtures::node("node-a", 4, 4096, 100)];
        let ctx = Context { policy: &policy, nodes: &nodes, classes: &smolvm_api::class::NO_CLASSES, pools: &smolvm_api::pool::NO_POOLS, sources: &smolvm_api::branch::NO_SOURCES, identity: &identity };
        let old = if bind { fixtures::bound(old, "node-a") } else { old };
        let new_defaulted = patched(&new, Operation::Update);
        for candidate in [&new, &new_defaulted] {
            let verdict = validate_smolvm_json(Operation::Update, Some(&old), candidate, &ctx);
            // Every violation names a path and a rule.
            for v in &verdict.violations {
                prop_assert!(!v.path.is_empty());
                prop_assert!(v.to_string().ends_with(']'));
            }
            let _ = validate_smolvm_status_json(Operation::Update, Some(&old), candidate, &ctx);
        }
    }

    #[test]
    fn text_and_value_inputs_get_the_same_verdict(
        old in prop::option::of(smolvm_like()),
        new in prop_oneof![smolvm_like(), arbitrary_json()],
        bind in any::<bool>(),
        identity in identities(),
    ) {
        let policy = Policy::default();
        let nodes: Vec<SmolVMNode> = vec![fixtures::node("node-a", 4, 4096, 100)];
        let ctx = Context { policy: &policy, nodes: &nodes, classes: &smolvm_api::class::NO_CLASSES, pools: &smolvm_api::pool::NO_POOLS, sources: &smolvm_api::branch::NO_SOURCES, identity: &identity };
        let old = old.map(|o| if bind { fixtures::bound(o, "node-a") } else { o });
        // The Values compared with are those the texts parse to (a float need not survive
        // printing and parsing to the same bits).
        let (old_text, new_text) = (old.as_ref().map(Value::to_string), new.to_string());
        let reparse = |text: &str| serde_json::from_str::<Value>(text);
        let new = reparse(&new_text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let old = old_text.as_deref().map(reparse).transpose().map_err(|e| TestCaseError::fail(e.to_string()))?;
        for target in [Target::SmolVM, Target::SmolVMStatus, Target::SmolVMNode, Target::SmolVMNodeStatus] {
            for op in [Operation::Create, Operation::Update] {
                let by_value = validate_raw(target, op, old.as_ref().map(Raw::Value), Raw::Value(&new), &ctx);
                let by_text = validate_raw(target, op, old_text.as_deref().map(Raw::Text), Raw::Text(&new_text), &ctx);
                prop_assert_eq!(by_value.message(), by_text.message(), "{:?} {:?} {}", target, op, new);
                prop_assert_eq!(by_value.allowed(), by_text.allowed());
                prop_assert_eq!(format!("{:?}", by_value.warnings), format!("{:?}", by_text.warnings));
            }
        }
    }
}
