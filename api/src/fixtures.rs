//! Test fixtures shared by the crates' tests and benchmarks: typical objects and identities.
//!
//! Not used by the product code paths.

use serde_json::{Value, json};

use crate::{
    policy::{DEFAULT_NAMESPACE, Policy, service_account},
    types::{NodeResources, SmolVMNode, SmolVMNodeSpec, SmolVMNodeStatus},
    validate::Identity,
};

/// The seed's example SmolVM, as a user would apply it (no defaults yet).
pub fn alpine() -> Value {
    json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1",
        "kind": "SmolVM",
        "metadata": {"name": "alpine", "namespace": "default", "uid": "6f1c0a52-3b0e-4a57-9d0c-1f2e3d4c5b6a"},
        "spec": {
            "running": true,
            "image": "alpine:latest",
            "nodeSelector": {"kubernetes.io/arch": "amd64"},
            "resources": {"cpus": 1, "memoryMiB": 512},
            "storage": {"storageGiB": 20, "overlayGiB": 10},
            "network": {"enabled": true, "ports": [{"hostPort": 8080, "guestPort": 80}]}
        }
    })
}

/// [`alpine`] as the API server stores it: defaulted as at CREATE. `None` if defaulting's patch
/// does not apply (a bug the tests then name).
pub fn stored_alpine() -> Option<Value> {
    let object = alpine();
    let mut doc = object.clone();
    let patch = crate::defaulting::default_smolvm(crate::admission::Operation::Create, &object);
    json_patch::patch(&mut doc, &patch).ok()?;
    Some(doc)
}

/// `object` with the value at the JSON pointer `pointer` (an object's member or an array's
/// element) set to `value`; `None` if the parent is missing or the index is not a number.
pub fn with(mut object: Value, pointer: &str, value: Value) -> Option<Value> {
    let (parent, key) = pointer.rsplit_once('/')?;
    match object.pointer_mut(parent)? {
        Value::Array(items) => *items.get_mut(key.parse::<usize>().ok()?)? = value,
        Value::Object(members) => {
            members.insert(key.to_string(), value);
        }
        _ => return None,
    }
    Some(object)
}

/// A SmolVM with the given spec.
pub fn smolvm(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1",
        "kind": "SmolVM",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec
    })
}

/// A SmolVMClass as JSON: `name`, generation 1, the default class when `default`.
pub fn class_json(name: &str, spec: Value, default: bool) -> Value {
    let mut object = json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1",
        "kind": "SmolVMClass",
        "metadata": {"name": name, "generation": 1},
        "spec": spec
    });
    if default {
        object["metadata"]["annotations"] = json!({crate::constants::ANNOTATION_IS_DEFAULT_CLASS: "true"});
    }
    object
}

/// A SmolVMClass, as [`class_json`] makes it.
pub fn class(name: &str, spec: Value, default: bool) -> crate::SmolVMClass {
    serde_json::from_value(class_json(name, spec, default)).unwrap_or_else(|e| panic!("class fixture {name}: {e}"))
}

/// A SmolVMPool as JSON: `name` in `default`, generation 3, with the given spec.
pub fn pool_json(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1",
        "kind": "SmolVMPool",
        "metadata": {"name": name, "namespace": "default", "generation": 3, "uid": "0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58"},
        "spec": spec
    })
}

/// A SmolVMPool, as [`pool_json`] makes it.
pub fn pool(name: &str, spec: Value) -> crate::SmolVMPool {
    serde_json::from_value(pool_json(name, spec)).unwrap_or_else(|e| panic!("pool fixture {name}: {e}"))
}

/// `object` bound to `node` (status.nodeName and status.nodeUID set).
pub fn bound(mut object: Value, node: &str) -> Value {
    let machine = object["metadata"]["uid"]
        .as_str()
        .map(|uid| format!("{}{}", crate::constants::MACHINE_NAME_PREFIX, uid.to_ascii_lowercase()));
    object["status"] = json!({"nodeName": node, "nodeUID": format!("uid-{node}"), "phase": "Running"});
    if let Some(machine) = machine {
        object["status"]["machineName"] = json!(machine);
    }
    object
}

/// `object` with a deletion timestamp.
pub fn deleting(mut object: Value) -> Value {
    object["metadata"]["deletionTimestamp"] = json!("2026-11-21T10:00:00Z");
    object["metadata"]["finalizers"] = json!([crate::constants::FINALIZER]);
    object
}

/// A Ready SmolVMNode with the given allocatable resources, labelled as it is on a typical
/// linux/amd64 Node (the Node's labels mirrored by the controller, plus `vm.smolvm.dev/node`).
pub fn node(name: &str, cpus: i64, memory_mib: i64, storage_gib: i64) -> SmolVMNode {
    let resources = NodeResources {
        cpus,
        memory_mib,
        storage_gib,
    };
    let mut node = SmolVMNode::new(name, SmolVMNodeSpec::default());
    node.metadata.labels = Some(
        [
            ("kubernetes.io/arch", "amd64"),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/hostname", name),
            (crate::constants::LABEL_NODE, name),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    node.status = Some(SmolVMNodeStatus {
        node_uid: Some(format!("uid-{name}")),
        capacity: Some(resources),
        allocatable: Some(resources),
        ..Default::default()
    });
    node
}

/// The controller's identity under the default policy.
pub fn controller() -> Identity {
    Identity::user(service_account(DEFAULT_NAMESPACE, "smolvm-controller"))
}

/// A runtime agent's identity on `node` (a pod-bound token with the node claims).
pub fn runtime_on(node: &str) -> Identity {
    let mut identity = Identity::user(service_account(DEFAULT_NAMESPACE, "smolvm-runtime"));
    identity
        .extra
        .insert(crate::constants::EXTRA_NODE_NAME.into(), vec![node.into()]);
    identity
        .extra
        .insert(crate::constants::EXTRA_NODE_UID.into(), vec![format!("uid-{node}")]);
    identity
}

/// A human user.
pub fn user() -> Identity {
    Identity::user("alice@example.com")
}

/// The default policy.
pub fn policy() -> Policy {
    Policy::default()
}

/// A SmolVMNode as a healthy runtime agent reports it: Ready, heartbeat at `heartbeat`, the
/// current protocol, an endpoint, the node UID `uid-<name>`, the label `kubernetes.io/arch: amd64`
/// and `resources` as capacity and allocatable.
pub fn ready_node(name: &str, resources: NodeResources, heartbeat: k8s_openapi::jiff::Timestamp) -> SmolVMNode {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    let mut node = SmolVMNode::new(name, SmolVMNodeSpec::default());
    node.metadata.labels = Some([("kubernetes.io/arch".to_string(), "amd64".to_string())].into());
    node.status = Some(SmolVMNodeStatus {
        node_uid: Some(format!("uid-{name}")),
        endpoint: Some(crate::types::Endpoint {
            address: "10.0.0.1".into(),
            port: 10443,
        }),
        internal_ip: Some("10.0.0.1".into()),
        runtime_version: Some("1.32.2".into()),
        protocol_version: Some(crate::constants::PROTOCOL_VERSION.into()),
        heartbeat_time: Some(Time(heartbeat)),
        capacity: Some(resources),
        allocatable: Some(resources),
        machines: None,
        suspended_machines: None,
        activity: None,
        wake_requests: None,
        pools: None,
        serving_certificate: None,
        canary: None,
        conditions: vec![Condition {
            type_: crate::constants::condition::READY.into(),
            status: "True".into(),
            reason: crate::constants::reason::AS_EXPECTED.into(),
            message: String::new(),
            last_transition_time: Time(heartbeat),
            observed_generation: None,
        }],
    });
    node
}

/// `(rule, path)` of every violation of a verdict.
pub fn violations(verdict: &crate::validate::Verdict) -> Vec<(crate::validate::RuleId, String)> {
    verdict.violations.iter().map(|f| (f.rule, f.path.clone())).collect()
}

/// Asserts that every finding of a verdict names its path, its value and its rule.
pub fn assert_well_formed(name: &str, verdict: &crate::validate::Verdict) {
    for f in verdict.violations.iter().chain(&verdict.warnings) {
        let text = f.to_string();
        assert!(text.starts_with(&f.path), "{name}: {text}");
        assert!(text.ends_with(&format!("[{}]", f.rule)), "{name}: {text}");
        assert!(text.contains(&f.value), "{name}: {text} does not show {}", f.value);
    }
}

/// Asserts that a verdict's violations are exactly `expected`, as `(rule, path)` in any order,
/// each finding well formed.
pub fn assert_violations(name: &str, verdict: &crate::validate::Verdict, expected: &[(crate::validate::RuleId, &str)]) {
    assert_well_formed(name, verdict);
    let got = violations(verdict);
    assert_eq!(got.len(), expected.len(), "{name}: {got:#?}");
    for (rule, path) in expected {
        assert!(
            got.iter().any(|(r, p)| r == rule && p == path),
            "{name}: no {rule} at {path} in {got:#?}"
        );
    }
}
