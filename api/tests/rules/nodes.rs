//! V10: SmolVMNode writes.

use super::*;

fn node_json(name: &str, status: Value) -> Value {
    json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode", "metadata": {"name": name}, "spec": {}, "status": status})
}

fn node_case(
    name: &'static str,
    kind: Kind,
    op: Operation,
    old: Option<Value>,
    new: Value,
    identity: Identity,
    expect: Expect,
) -> Case {
    Case {
        name,
        kind,
        op,
        old,
        new,
        identity,
        expect,
    }
}

#[test]
fn v10_smolvm_nodes() {
    let good = json!({"nodeUID": "uid-node-a", "endpoint": {"address": "10.0.0.5", "port": 9443}});
    let a = node_json("node-a", good.clone());
    let b = node_json("node-b", json!({"nodeUID": "uid-node-b"}));
    let cordoned = with(a.clone(), "/spec/unschedulable", json!(true));
    check(vec![
        node_case(
            "v10_runtime_creates_own_node",
            Kind::Node,
            Create,
            None,
            a.clone(),
            runtime_on("node-a"),
            Allow,
        ),
        node_case(
            "v10_runtime_creates_other_node_rejected",
            Kind::Node,
            Create,
            None,
            b.clone(),
            runtime_on("node-a"),
            Reject(RuleId::V10, "metadata.name"),
        ),
        node_case(
            "v10_runtime_writes_own_status",
            Kind::NodeStatus,
            Update,
            Some(a.clone()),
            a.clone(),
            runtime_on("node-a"),
            Allow,
        ),
        node_case(
            "v10_runtime_writes_other_status_rejected",
            Kind::NodeStatus,
            Update,
            Some(b.clone()),
            b.clone(),
            runtime_on("node-a"),
            Reject(RuleId::V10, "metadata.name"),
        ),
        node_case(
            "v10_runtime_without_node_claim_rejected",
            Kind::NodeStatus,
            Update,
            Some(a.clone()),
            a.clone(),
            Identity::user("system:serviceaccount:smolvm-system:smolvm-runtime"),
            Reject(RuleId::V10, "metadata.name"),
        ),
        node_case(
            "v10_runtime_wrong_node_uid_rejected",
            Kind::NodeStatus,
            Update,
            Some(a.clone()),
            with(a.clone(), "/status/nodeUID", json!("forged")),
            runtime_on("node-a"),
            Reject(RuleId::V10, "status.nodeUID"),
        ),
        node_case(
            "v10_runtime_cannot_uncordon",
            Kind::Node,
            Update,
            Some(cordoned.clone()),
            a.clone(),
            runtime_on("node-a"),
            Reject(RuleId::V10, "spec.unschedulable"),
        ),
        node_case(
            "v10_admin_cordons_any_node",
            Kind::Node,
            Update,
            Some(a.clone()),
            cordoned,
            Identity::user("kubernetes-admin"),
            Allow,
        ),
        node_case(
            "v10_controller_unaffected",
            Kind::NodeStatus,
            Update,
            Some(b.clone()),
            b.clone(),
            controller(),
            Allow,
        ),
        node_case(
            "v10_bad_endpoint_address_rejected",
            Kind::NodeStatus,
            Update,
            Some(a.clone()),
            with(a.clone(), "/status/endpoint/address", json!("not an address")),
            runtime_on("node-a"),
            Reject(RuleId::V10, "status.endpoint.address"),
        ),
        node_case(
            "v10_bad_endpoint_port_rejected",
            Kind::NodeStatus,
            Update,
            Some(a.clone()),
            with(a.clone(), "/status/endpoint/port", json!(0)),
            runtime_on("node-a"),
            Reject(RuleId::V10, "status.endpoint.port"),
        ),
        node_case(
            "v10_dns_endpoint_accepted",
            Kind::NodeStatus,
            Update,
            Some(a.clone()),
            with(a.clone(), "/status/endpoint/address", json!("node-a.example.com")),
            runtime_on("node-a"),
            Allow,
        ),
    ]);
}

/// node-a as its agent finds it: the labels the controller mirrored from the Node and an admin's,
/// the mirrored-labels annotation, owned by its Node.
fn labelled() -> Value {
    json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode",
        "metadata": {"name": "node-a",
            "labels": {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": "z1",
                "team": "admins", "vm.smolvm.dev/node": "node-a", "vm.smolvm.dev/gpu-count": "1"},
            "annotations": {"vm.smolvm.dev/mirrored-labels": "kubernetes.io/hostname,topology.kubernetes.io/zone"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-node-a"}]},
        "spec": {}, "status": {"nodeUID": "uid-node-a"}})
}

/// What the agent creates: its name and its Node as owner, and at most its own labels.
fn created() -> Value {
    json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode",
        "metadata": {"name": "node-a",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-node-a"}]},
        "spec": {}})
}

fn label(object: Value, key: &str, value: Option<&str>) -> Value {
    let mut object = object;
    match value {
        Some(v) => object["metadata"]["labels"][key] = json!(v),
        None => {
            if let Some(labels) = object["metadata"]["labels"].as_object_mut() {
                labels.remove(key);
            }
        }
    }
    object
}

fn annotate(object: Value, key: &str, value: Option<&str>) -> Value {
    let mut object = object;
    match value {
        Some(v) => object["metadata"]["annotations"][key] = json!(v),
        None => {
            if let Some(annotations) = object["metadata"]["annotations"].as_object_mut() {
                annotations.remove(key);
            }
        }
    }
    object
}

/// Issue 56: a node may set on its SmolVMNode only its status and its own three labels; a label
/// such as `tenant: a`, which nodeSelectors of SmolVMs and pools match, is the cluster admin's or
/// the Node's (mirrored by the controller), never the node's own.
#[test]
fn v10_a_runtime_sets_only_its_own_labels() {
    let agent = runtime_on("node-a");
    let admin = Identity::user("kubernetes-admin");
    let recheck = annotate(labelled(), "vm.smolvm.dev/recheck-boot", Some("true"));
    let foreign_owner = with(
        created(),
        "/metadata/ownerReferences",
        json!([{"apiVersion": "v1", "kind": "Node", "name": "node-b", "uid": "uid-node-b"}]),
    );
    let forged_owner_uid = with(
        created(),
        "/metadata/ownerReferences",
        json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "forged"}]),
    );
    check(vec![
        // CREATE: only the owned labels, its Node as owner, nothing else.
        node_case(
            "v10_runtime_creates_with_owner_and_own_labels",
            Kind::Node,
            Create,
            None,
            label(created(), "vm.smolvm.dev/guest-bootable", Some("false")),
            agent.clone(),
            Allow,
        ),
        node_case(
            "v10_runtime_creates_with_tenant_label_rejected",
            Kind::Node,
            Create,
            None,
            label(created(), "tenant", Some("a")),
            agent.clone(),
            Reject(RuleId::V10, r#"metadata.labels["tenant"]"#),
        ),
        node_case(
            "v10_runtime_creates_with_node_name_label_rejected",
            Kind::Node,
            Create,
            None,
            label(created(), "vm.smolvm.dev/node", Some("node-b")),
            agent.clone(),
            Reject(RuleId::V10, r#"metadata.labels["vm.smolvm.dev/node"]"#),
        ),
        node_case(
            "v10_runtime_creates_with_annotation_rejected",
            Kind::Node,
            Create,
            None,
            annotate(created(), "vm.smolvm.dev/mirrored-labels", Some("tenant")),
            agent.clone(),
            Reject(RuleId::V10, r#"metadata.annotations["vm.smolvm.dev/mirrored-labels"]"#),
        ),
        node_case(
            "v10_runtime_creates_with_finalizer_rejected",
            Kind::Node,
            Create,
            None,
            with(created(), "/metadata/finalizers", json!(["example.com/keep"])),
            agent.clone(),
            Reject(RuleId::V10, "metadata.finalizers"),
        ),
        node_case(
            "v10_runtime_creates_owned_by_another_node_rejected",
            Kind::Node,
            Create,
            None,
            foreign_owner,
            agent.clone(),
            Reject(RuleId::V10, "metadata.ownerReferences[0]"),
        ),
        node_case(
            "v10_runtime_creates_owned_by_a_forged_node_uid_rejected",
            Kind::Node,
            Create,
            None,
            forged_owner_uid,
            agent.clone(),
            Reject(RuleId::V10, "metadata.ownerReferences[0]"),
        ),
        // UPDATE: its own labels come and go; every other label, annotation, finalizer and
        // owner stays as it was.
        node_case(
            "v10_runtime_sets_guest_bootable",
            Kind::Node,
            Update,
            Some(labelled()),
            label(labelled(), "vm.smolvm.dev/guest-bootable", Some("true")),
            agent.clone(),
            Allow,
        ),
        node_case(
            "v10_runtime_removes_gpu_count",
            Kind::Node,
            Update,
            Some(labelled()),
            label(labelled(), "vm.smolvm.dev/gpu-count", None),
            agent.clone(),
            Allow,
        ),
        node_case(
            "v10_runtime_adds_tenant_label_rejected",
            Kind::Node,
            Update,
            Some(labelled()),
            label(labelled(), "tenant", Some("a")),
            agent.clone(),
            Reject(RuleId::V10, r#"metadata.labels["tenant"]"#),
        ),
        node_case(
            "v10_runtime_changes_a_mirrored_label_rejected",
            Kind::Node,
            Update,
            Some(labelled()),
            label(labelled(), "topology.kubernetes.io/zone", Some("z2")),
            agent.clone(),
            Reject(RuleId::V10, r#"metadata.labels["topology.kubernetes.io/zone"]"#),
        ),
        node_case(
            "v10_runtime_removes_an_admin_label_rejected",
            Kind::Node,
            Update,
            Some(labelled()),
            label(labelled(), "team", None),
            agent.clone(),
            Reject(RuleId::V10, r#"metadata.labels["team"]"#),
        ),
        node_case(
            "v10_runtime_changes_the_node_name_label_rejected",
            Kind::Node,
            Update,
            Some(labelled()),
            label(labelled(), "vm.smolvm.dev/node", Some("node-b")),
            agent.clone(),
            Reject(RuleId::V10, r#"metadata.labels["vm.smolvm.dev/node"]"#),
        ),
        node_case(
            "v10_runtime_removes_the_recheck_annotation",
            Kind::Node,
            Update,
            Some(recheck.clone()),
            labelled(),
            agent.clone(),
            Allow,
        ),
        node_case(
            "v10_runtime_sets_the_recheck_annotation_rejected",
            Kind::Node,
            Update,
            Some(labelled()),
            recheck,
            agent.clone(),
            Reject(RuleId::V10, r#"metadata.annotations["vm.smolvm.dev/recheck-boot"]"#),
        ),
        node_case(
            "v10_runtime_rewrites_the_mirrored_labels_annotation_rejected",
            Kind::Node,
            Update,
            Some(labelled()),
            annotate(labelled(), "vm.smolvm.dev/mirrored-labels", Some("")),
            agent.clone(),
            Reject(RuleId::V10, r#"metadata.annotations["vm.smolvm.dev/mirrored-labels"]"#),
        ),
        node_case(
            "v10_runtime_removes_the_mirrored_labels_annotation_rejected",
            Kind::Node,
            Update,
            Some(labelled()),
            annotate(labelled(), "vm.smolvm.dev/mirrored-labels", None),
            agent.clone(),
            Reject(RuleId::V10, r#"metadata.annotations["vm.smolvm.dev/mirrored-labels"]"#),
        ),
        node_case(
            "v10_runtime_adds_a_finalizer_rejected",
            Kind::Node,
            Update,
            Some(labelled()),
            with(labelled(), "/metadata/finalizers", json!(["example.com/keep"])),
            agent.clone(),
            Reject(RuleId::V10, "metadata.finalizers"),
        ),
        node_case(
            "v10_runtime_drops_its_owner_rejected",
            Kind::Node,
            Update,
            Some(labelled()),
            without(labelled(), "/metadata/ownerReferences"),
            agent.clone(),
            Reject(RuleId::V10, "metadata.ownerReferences"),
        ),
        node_case(
            "v10_runtime_status_write_with_its_labels_unchanged",
            Kind::NodeStatus,
            Update,
            Some(labelled()),
            labelled(),
            agent.clone(),
            Allow,
        ),
        // The labels are the cluster admin's and the controller's to set.
        node_case(
            "v10_admin_sets_tenant_label",
            Kind::Node,
            Update,
            Some(labelled()),
            label(labelled(), "tenant", Some("a")),
            admin,
            Allow,
        ),
        node_case(
            "v10_controller_mirrors_a_node_label",
            Kind::Node,
            Update,
            Some(labelled()),
            annotate(
                label(labelled(), "tenant", Some("a")),
                "vm.smolvm.dev/mirrored-labels",
                Some("kubernetes.io/hostname,tenant,topology.kubernetes.io/zone"),
            ),
            controller(),
            Allow,
        ),
    ]);
}

/// Every offending key is its own violation, each naming the key, the value and [V10], in one
/// answer.
#[test]
fn v10_every_foreign_label_is_named_at_once() {
    let policy = fixtures::policy();
    let identity = runtime_on("node-a");
    let ctx = Context {
        policy: &policy,
        nodes: &Vec::<SmolVMNode>::new(),
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
        identity: &identity,
    };
    let new = annotate(
        label(
            label(
                label(labelled(), "tenant", Some("a")),
                "topology.kubernetes.io/zone",
                Some("z9"),
            ),
            "team",
            None,
        ),
        "example.com/note",
        Some("hi"),
    );
    let verdict = validate_smolvm_node_json(Update, false, Some(&labelled()), &new, &ctx);
    let lines: Vec<String> = verdict.violations.iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 4, "{lines:#?}");
    let expect = [
        r#"metadata.labels["tenant"]: "a": a runtime agent sets only its own labels"#,
        r#"metadata.labels["topology.kubernetes.io/zone"]: "z9" (was "z1"): a runtime agent sets only its own labels"#,
        r#"metadata.labels["team"]: removed (was "admins"): a runtime agent sets only its own labels"#,
        r#"metadata.annotations["example.com/note"]: "hi": a runtime agent may not set, change or remove annotations"#,
    ];
    for fragment in expect {
        assert!(
            lines.iter().any(|l| l.starts_with(fragment) && l.ends_with("[V10]")),
            "{fragment}\nnot in {lines:#?}"
        );
    }
}
