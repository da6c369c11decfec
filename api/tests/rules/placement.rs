//! V5: pins and capacity against the known nodes, unbound and bound.

use super::*;

#[test]
fn v5_pins_and_capacity() {
    let pinned = |node: &str| with(stored(), "/spec/nodeName", json!(node));
    let big = with(stored(), "/spec/resources/cpus", json!(16));
    check(vec![
        case(
            "v5_unbound_pin_to_known_node_accepted",
            Create,
            None,
            pinned("node-a"),
            Allow,
        ),
        case(
            "v5_pin_to_unknown_node_warns",
            Create,
            None,
            pinned("ghost"),
            Warn(RuleId::V5),
        ),
        case(
            "v5_pin_to_node_that_can_never_hold_rejected",
            Create,
            None,
            pinned("small"),
            Reject(RuleId::V5, "spec.nodeName"),
        ),
        case(
            "v5_pin_to_cordoned_node_warns",
            Create,
            None,
            pinned("cordoned"),
            Warn(RuleId::V5),
        ),
        case(
            "v5_request_no_known_node_can_hold_warns",
            Create,
            None,
            big,
            Warn(RuleId::V5),
        ),
        case(
            "v5_bound_without_pin_accepted",
            Update,
            Some(bound(stored(), "node-a")),
            bound(stored(), "node-a"),
            Allow,
        ),
        case(
            "v5_bound_pin_equal_to_binding_accepted",
            Update,
            Some(bound(pinned("node-a"), "node-a")),
            bound(pinned("node-a"), "node-a"),
            Allow,
        ),
        case(
            "v5_bound_pin_removed_accepted",
            Update,
            Some(bound(pinned("node-a"), "node-a")),
            bound(stored(), "node-a"),
            Allow,
        ),
        case(
            "v5_bound_pin_added_equal_accepted",
            Update,
            Some(bound(stored(), "node-a")),
            bound(pinned("node-a"), "node-a"),
            Allow,
        ),
        case(
            "v5_bound_pin_to_other_node_rejected",
            Update,
            Some(bound(stored(), "node-a")),
            bound(pinned("node-b"), "node-a"),
            Reject(RuleId::V5, "spec.nodeName"),
        ),
        case(
            "v5_unbound_pin_change_accepted",
            Update,
            Some(pinned("node-a")),
            pinned("ghost"),
            Warn(RuleId::V5),
        ),
        case(
            "v5_unbound_unchanged_update_does_not_recheck_capacity",
            Update,
            Some(pinned("small")),
            pinned("small"),
            Allow,
        ),
    ]);
    // With no SmolVMNode at all, every create warns.
    check_with(
        vec![case(
            "v5_no_nodes_registered_warns",
            Create,
            None,
            stored(),
            Warn(RuleId::V5),
        )],
        &Policy::default(),
        &Vec::new(),
    );
}

#[test]
fn v5_bound_message_says_never_move() {
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
    let old = bound(stored(), "node-a");
    let new = with(old.clone(), "/spec/nodeName", json!("node-b"));
    let verdict = validate_smolvm_json(Update, Some(&old), &new, &ctx);
    assert_eq!(
        verdict.message(),
        "spec.nodeName: \"node-b\" cannot be set: the SmolVM is bound to \"node-a\"; SmolVMs never move; delete and recreate it [V5]"
    );
}

/// "No known node can hold it" counts only nodes the SmolVM could ever be placed on: uncordoned
/// and carrying its nodeSelector labels.
#[test]
fn v5_no_known_node_can_hold_respects_selectors_and_cordons() {
    let mut cordoned_big = node("cordoned-big", 32, 65_536, 1000);
    cordoned_big.spec.unschedulable = Some(true);
    let nodes = vec![node("node-a", 8, 16384, 500), cordoned_big];
    let selector = |labels: Value| with(stored(), "/spec/nodeSelector", labels);
    check_with(
        vec![
            case(
                "v5_selector_matching_a_node_accepted",
                Create,
                None,
                selector(json!({"kubernetes.io/arch": "amd64", "kubernetes.io/hostname": "node-a"})),
                Allow,
            ),
            case(
                "v5_selector_matching_no_node_warns",
                Create,
                None,
                selector(json!({"kubernetes.io/arch": "arm64"})),
                Warn(RuleId::V5),
            ),
            case(
                "v5_only_a_cordoned_node_can_hold_warns",
                Create,
                None,
                with(stored(), "/spec/resources/cpus", json!(16)),
                Warn(RuleId::V5),
            ),
        ],
        &Policy::default(),
        &nodes,
    );
}

/// A bound SmolVM's node is its pin: a resize that node can never hold is rejected (V5), one
/// it can is a V6 resize warning, and nothing is checked when the request is unchanged.
#[test]
fn v5_bound_resize_beyond_the_nodes_allocatable() {
    let old = bound(stored(), "node-a");
    check(vec![
        case(
            "v5_bound_cpus_beyond_allocatable_rejected",
            Update,
            Some(old.clone()),
            with(old.clone(), "/spec/resources/cpus", json!(16)),
            Reject(RuleId::V5, "spec.resources.cpus"),
        ),
        case(
            "v5_bound_storage_beyond_allocatable_rejected",
            Update,
            Some(old.clone()),
            with(old.clone(), "/spec/storage/storageGiB", json!(600)),
            Reject(RuleId::V5, "spec.storage"),
        ),
        case(
            "v5_bound_resize_that_fits_warns_v6",
            Update,
            Some(old.clone()),
            with(old.clone(), "/spec/resources/cpus", json!(8)),
            Warn(RuleId::V6),
        ),
        case(
            "v5_bound_to_an_unknown_node_resize_not_judged",
            Update,
            Some(bound(stored(), "node-gone")),
            with(bound(stored(), "node-gone"), "/spec/resources/cpus", json!(16)),
            Warn(RuleId::V6),
        ),
    ]);
}
