//! V9: who may write the binding in status, and the machine name.

use super::*;

fn status_case(name: &'static str, old: Value, new: Value, identity: Identity, expect: Expect) -> Case {
    Case {
        name,
        kind: Kind::VmStatus,
        op: Update,
        old: Some(old),
        new,
        identity,
        expect,
    }
}

#[test]
fn v9_status_binding() {
    let unbound = stored();
    let bound_a = bound(stored(), "node-a");
    let pinned = with(stored(), "/spec/nodeName", json!("node-a"));
    check(vec![
        status_case(
            "v9_controller_binds",
            unbound.clone(),
            bound_a.clone(),
            controller(),
            Allow,
        ),
        status_case(
            "v9_user_cannot_bind",
            unbound.clone(),
            bound_a.clone(),
            user(),
            Reject(RuleId::V9, "status.nodeName"),
        ),
        status_case(
            "v9_runtime_cannot_bind",
            unbound.clone(),
            bound_a.clone(),
            runtime_on("node-a"),
            Reject(RuleId::V9, "status.nodeName"),
        ),
        status_case(
            "v9_node_name_change_rejected_even_for_controller",
            bound_a.clone(),
            bound(stored(), "node-b"),
            controller(),
            Reject(RuleId::V9, "status.nodeName"),
        ),
        status_case(
            "v9_node_name_change_rejected_for_admin",
            bound_a.clone(),
            with(bound_a.clone(), "/status/nodeName", json!("node-b")),
            Identity::user("kubernetes-admin"),
            Reject(RuleId::V9, "status.nodeName"),
        ),
        status_case(
            "v9_node_name_clear_rejected",
            bound_a.clone(),
            without(bound_a.clone(), "/status/nodeName"),
            controller(),
            Reject(RuleId::V9, "status.nodeName"),
        ),
        status_case(
            "v9_node_uid_change_rejected",
            bound_a.clone(),
            with(bound_a.clone(), "/status/nodeUID", json!("other")),
            controller(),
            Reject(RuleId::V9, "status.nodeUID"),
        ),
        status_case(
            "v9_binding_must_set_both_fields",
            unbound.clone(),
            without(bound_a.clone(), "/status/nodeUID"),
            controller(),
            Reject(RuleId::V9, "status.nodeName"),
        ),
        status_case(
            "v9_binding_must_match_pin",
            pinned.clone(),
            bound(pinned.clone(), "node-b"),
            controller(),
            Reject(RuleId::V9, "status.nodeName"),
        ),
        status_case(
            "v9_binding_matching_pin_accepted",
            pinned.clone(),
            bound(pinned, "node-a"),
            controller(),
            Allow,
        ),
        status_case(
            "v9_machine_name_retarget_rejected_for_admin",
            bound_a.clone(),
            with(bound_a.clone(), "/status/machineName", json!("svm-someone-else")),
            Identity::user("kubernetes-admin"),
            Reject(RuleId::V9, "status.machineName"),
        ),
        status_case(
            "v9_machine_name_retarget_rejected_for_controller",
            bound_a.clone(),
            with(bound_a.clone(), "/status/machineName", json!("svm-someone-else")),
            controller(),
            Reject(RuleId::V9, "status.machineName"),
        ),
        status_case(
            "v9_machine_name_clear_rejected",
            bound_a.clone(),
            without(bound_a.clone(), "/status/machineName"),
            controller(),
            Reject(RuleId::V9, "status.machineName"),
        ),
        status_case(
            "v9_machine_name_first_write_by_user_rejected",
            without(bound_a.clone(), "/status/machineName"),
            bound_a.clone(),
            user(),
            Reject(RuleId::V9, "status.machineName"),
        ),
        status_case(
            "v9_machine_name_must_derive_from_uid",
            without(bound_a.clone(), "/status/machineName"),
            with(bound_a.clone(), "/status/machineName", json!("svm-someone-else")),
            controller(),
            Reject(RuleId::V9, "status.machineName"),
        ),
        status_case(
            "v9_machine_name_first_write_by_controller_accepted",
            without(bound_a.clone(), "/status/machineName"),
            bound_a.clone(),
            controller(),
            Allow,
        ),
        status_case(
            "v9_other_status_fields_by_anyone_accepted",
            bound_a.clone(),
            with(bound_a.clone(), "/status/phase", json!("Stopped")),
            user(),
            Allow,
        ),
    ]);
}
