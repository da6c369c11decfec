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
