//! V7 and V8: the force-delete and recreate annotations, objects being deleted, and ratcheting.

use super::*;

#[test]
fn v7_force_delete_annotation() {
    let b = |o: Value| bound(o, "node-a");
    check(vec![
        case(
            "v7_on_create_rejected",
            Create,
            None,
            annotated(stored(), "true"),
            Reject(RuleId::V7, "metadata.annotations"),
        ),
        case(
            "v7_not_deleting_rejected",
            Update,
            Some(b(stored())),
            annotated(b(stored()), "true"),
            Reject(RuleId::V7, "metadata.annotations"),
        ),
        case(
            "v7_value_not_exactly_true_rejected",
            Update,
            Some(deleting(b(stored()))),
            annotated(deleting(b(stored())), "True"),
            Reject(RuleId::V7, "metadata.annotations"),
        ),
        case(
            "v7_deleting_bound_accepted_with_orphan_warning",
            Update,
            Some(deleting(b(stored()))),
            annotated(deleting(b(stored())), "true"),
            Warn(RuleId::V7),
        ),
        case(
            "v7_deleting_unbound_accepted_with_warning",
            Update,
            Some(deleting(stored())),
            annotated(deleting(stored()), "true"),
            Warn(RuleId::V7),
        ),
    ]);
    let policy = Policy::default();
    let identity = user();
    let ctx = Context {
        policy: &policy,
        nodes: &Vec::<SmolVMNode>::new(),
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
        identity: &identity,
    };
    let old = deleting(bound(stored(), "node-a"));
    let verdict = validate_smolvm_json(Update, Some(&old), &annotated(old.clone(), "true"), &ctx);
    assert!(
        verdict.warnings[0].message.contains("node-a"),
        "the warning names the node: {verdict:?}"
    );
}

#[test]
fn v8_deleting_objects_accept_metadata_only() {
    let policy_tight = Policy {
        max_cpus: 1,
        ..Policy::default()
    };
    let old = deleting(bound(with(stored(), "/spec/resources/cpus", json!(8)), "node-a"));
    let finalizer_removed = with(old.clone(), "/metadata/finalizers", json!([]));
    let cases = vec![
        case(
            "v8_finalizer_removal_accepted_even_when_spec_breaks_policy",
            Update,
            Some(old.clone()),
            finalizer_removed,
            Allow,
        ),
        case(
            "v8_label_change_accepted",
            Update,
            Some(old.clone()),
            with(old.clone(), "/metadata/labels", json!({"a": "b"})),
            Allow,
        ),
        case(
            "v8_spec_change_rejected",
            Update,
            Some(old.clone()),
            with(old.clone(), "/spec/running", json!(false)),
            Reject(RuleId::V8, "spec"),
        ),
        case(
            "v8_unbound_spec_change_rejected",
            Update,
            Some(deleting(stored())),
            with(deleting(stored()), "/spec/image", json!("x")),
            Reject(RuleId::V8, "spec"),
        ),
    ];
    check_with(cases, &policy_tight, &nodes());
}

#[test]
fn ratcheting_keeps_objects_updatable_when_the_policy_tightens() {
    let tight = Policy {
        max_cpus: 2,
        ..Policy::default()
    };
    let old = bound(with(stored(), "/spec/resources/cpus", json!(8)), "node-a");
    check_with(
        vec![
            case(
                "v2_unchanged_violation_is_a_warning",
                Update,
                Some(old.clone()),
                with(old.clone(), "/spec/running", json!(false)),
                Warn(RuleId::V2),
            ),
            case(
                "v2_changed_violation_is_rejected",
                Update,
                Some(old.clone()),
                with(old.clone(), "/spec/resources/cpus", json!(9)),
                Reject(RuleId::V2, "spec.resources.cpus"),
            ),
        ],
        &tight,
        &nodes(),
    );
}

/// Ratcheting forgives only what the stored object already broke: a violation this update
/// causes through another field is still rejected.
#[test]
fn ratcheting_never_forgives_what_the_update_causes() {
    let two = json!([
        {"hostPort": 8080, "guestPort": 80, "protocol": "TCP"},
        {"hostPort": 8081, "guestPort": 81, "protocol": "TCP"},
    ]);
    let old = ports(two);
    check(vec![
        case(
            "v3_network_disabled_under_untouched_ports_rejected",
            Update,
            Some(old.clone()),
            with(old.clone(), "/spec/network/enabled", json!(false)),
            Reject(RuleId::V3, "spec.network.ports"),
        ),
        case(
            "v3_port_changed_into_a_duplicate_of_an_untouched_one_rejected",
            Update,
            Some(old.clone()),
            with(old.clone(), "/spec/network/ports/0/hostPort", json!(8081)),
            Reject(RuleId::V3, "spec.network.ports[1]"),
        ),
    ]);
    // Under a policy that now excludes 8080, the untouched port stays a warning while another
    // field changes, and a change to that port is rejected.
    let tight = Policy {
        host_port_min: 8081,
        ..Policy::default()
    };
    check_with(
        vec![
            case(
                "v3_port_outside_a_tightened_range_unchanged_warns",
                Update,
                Some(old.clone()),
                with(old.clone(), "/spec/running", json!(false)),
                Warn(RuleId::V3),
            ),
            case(
                "v3_port_outside_a_tightened_range_changed_rejected",
                Update,
                Some(old.clone()),
                with(old.clone(), "/spec/network/ports/0/hostPort", json!(8079)),
                Reject(RuleId::V3, "spec.network.ports[0]"),
            ),
        ],
        &tight,
        &nodes(),
    );
}

#[test]
fn v7_recreate_lost_machine_annotation() {
    use smolvm_api::constants::RECREATE_LOST_MACHINE_ANNOTATION;
    let recreate = |mut o: Value, value: &str| {
        o["metadata"]["annotations"] = json!({ RECREATE_LOST_MACHINE_ANNOTATION: value });
        o
    };
    let lost = |mut o: Value| {
        o["status"]["phase"] = json!("Failed");
        o["status"]["conditions"] = json!([{
            "type": "Ready", "status": "False", "reason": "MachineLost", "message": "gone",
            "lastTransitionTime": "2026-11-22T10:00:00Z"
        }]);
        o
    };
    let b = |o: Value| bound(o, "node-a");
    check(vec![
        case(
            "recreate_on_create_rejected",
            Create,
            None,
            recreate(stored(), "true"),
            Reject(RuleId::V7, "metadata.annotations"),
        ),
        case(
            "recreate_on_a_running_vm_rejected",
            Update,
            Some(b(stored())),
            recreate(b(stored()), "true"),
            Reject(RuleId::V7, "metadata.annotations"),
        ),
        case(
            "recreate_value_not_exactly_true_rejected",
            Update,
            Some(lost(b(stored()))),
            recreate(lost(b(stored())), "yes"),
            Reject(RuleId::V7, "metadata.annotations"),
        ),
        case(
            "recreate_on_a_lost_machine_accepted_with_warning",
            Update,
            Some(lost(b(stored()))),
            recreate(lost(b(stored())), "true"),
            Warn(RuleId::V7),
        ),
        case(
            "recreate_unchanged_is_not_judged_again",
            Update,
            Some(recreate(b(stored()), "true")),
            recreate(with(b(stored()), "/spec/running", json!(false)), "true"),
            Allow,
        ),
    ]);
}

#[test]
fn v7_every_misuse_is_reported() {
    let policy = Policy::default();
    let nodes = nodes();
    let identity = fixtures::user();
    let ctx = Context {
        policy: &policy,
        nodes: &nodes,
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
        identity: &identity,
    };
    let new = annotated(alpine(), "yes");
    let verdict = validate_smolvm_json(Create, None, &new, &ctx);
    let messages: Vec<String> = verdict.violations.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 2, "{messages:#?}");
    assert!(
        messages[0].contains("\"yes\" must be exactly \"true\""),
        "{messages:#?}"
    );
    assert!(messages[1].contains("\"yes\" cannot be set on create"), "{messages:#?}");
}
