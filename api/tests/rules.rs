//! Table-driven accept and reject cases for every admission rule, M1-M2 and V1-V10, including the
//! update transitions: unbound or bound, not deleting or deleting, pinned or not.

use serde_json::{Value, json};
use smolvm_api::{
    SmolVMNode,
    constants::FORCE_DELETE_ANNOTATION,
    defaulting::default_smolvm,
    fixtures::{self, alpine, bound, controller, deleting, node, runtime_on, smolvm, user},
    policy::Policy,
    validate::{
        Context, Identity, Operation, RuleId, Verdict, validate_smolvm_json, validate_smolvm_node_json,
        validate_smolvm_status_json,
    },
};

#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Allowed, with no warning.
    Allow,
    /// Allowed, with a warning of this rule.
    Warn(RuleId),
    /// Rejected by this rule, at a path starting with this text.
    Reject(RuleId, &'static str),
}

#[derive(Clone, Copy)]
enum Kind {
    Vm,
    VmStatus,
    Node,
    NodeStatus,
}

struct Case {
    name: &'static str,
    kind: Kind,
    op: Operation,
    old: Option<Value>,
    new: Value,
    identity: Identity,
    expect: Expect,
}

fn case(name: &'static str, op: Operation, old: Option<Value>, new: Value, expect: Expect) -> Case {
    Case {
        name,
        kind: Kind::Vm,
        op,
        old,
        new,
        identity: user(),
        expect,
    }
}

/// The seed's alpine example with every default applied, as it is stored.
fn stored() -> Value {
    defaulted(alpine())
}

fn defaulted(object: Value) -> Value {
    let mut doc = object.clone();
    json_patch::patch(&mut doc, &default_smolvm(Operation::Create, &object)).unwrap();
    doc
}

fn with(mut object: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let target = if parent.is_empty() {
        &mut object
    } else {
        object.pointer_mut(parent).unwrap()
    };
    target[key] = value;
    object
}

fn without(mut object: Value, pointer: &str) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    object.pointer_mut(parent).unwrap().as_object_mut().unwrap().remove(key);
    object
}

fn annotated(object: Value, value: &str) -> Value {
    with(
        object,
        "/metadata/annotations",
        json!({ FORCE_DELETE_ANNOTATION: value }),
    )
}

fn nodes() -> Vec<SmolVMNode> {
    let mut cordoned = node("cordoned", 8, 16384, 500);
    cordoned.spec.unschedulable = Some(true);
    vec![node("node-a", 8, 16384, 500), node("small", 1, 256, 10), cordoned]
}

fn run(case: &Case, policy: &Policy, nodes: &Vec<SmolVMNode>) -> Verdict {
    let ctx = Context {
        policy,
        nodes,
        identity: &case.identity,
    };
    match case.kind {
        Kind::Vm => validate_smolvm_json(case.op, case.old.as_ref(), &case.new, &ctx),
        Kind::VmStatus => validate_smolvm_status_json(case.op, case.old.as_ref(), &case.new, &ctx),
        Kind::Node => validate_smolvm_node_json(case.op, false, case.old.as_ref(), &case.new, &ctx),
        Kind::NodeStatus => validate_smolvm_node_json(case.op, true, case.old.as_ref(), &case.new, &ctx),
    }
}

fn check(cases: Vec<Case>) {
    check_with(cases, &Policy::default(), &nodes());
}

fn check_with(cases: Vec<Case>, policy: &Policy, nodes: &Vec<SmolVMNode>) {
    let mut failures = Vec::new();
    for case in &cases {
        let verdict = run(case, policy, nodes);
        let ok = match case.expect {
            Expect::Allow => verdict.allowed() && verdict.warnings.is_empty(),
            Expect::Warn(rule) => verdict.allowed() && verdict.warnings.iter().any(|w| w.rule == rule),
            Expect::Reject(rule, path) => verdict
                .violations
                .iter()
                .any(|v| v.rule == rule && v.path.starts_with(path)),
        };
        if !ok {
            failures.push(format!("{}: expected {:?}, got {:#?}", case.name, case.expect, verdict));
        }
        // Every finding's message names the path, the offending value and the rule.
        for v in verdict.violations.iter().chain(&verdict.warnings) {
            let text = v.to_string();
            assert!(text.starts_with(&v.path), "{}: {text}", case.name);
            assert!(text.ends_with(&format!("[{}]", v.rule)), "{}: {text}", case.name);
            if !text.contains(&v.value) {
                failures.push(format!(
                    "{}: the message does not show the value {}: {text}",
                    case.name, v.value
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

use Expect::*;
use Operation::{Create, Update};

#[test]
fn v1_image() {
    check(vec![
        case("v1_oci_reference_accepted", Create, None, stored(), Allow),
        case(
            "v1_local_image_accepted",
            Create,
            None,
            with(stored(), "/spec/image", json!("local:alpine")),
            Allow,
        ),
        case(
            "v1_digest_accepted",
            Create,
            None,
            with(
                stored(),
                "/spec/image",
                json!(format!("registry.example.com/o/a@sha256:{}", "a".repeat(64))),
            ),
            Allow,
        ),
        case(
            "v1_missing_image_rejected",
            Create,
            None,
            without(stored(), "/spec/image"),
            Reject(RuleId::V1, "spec.image"),
        ),
        case(
            "v1_empty_image_rejected",
            Create,
            None,
            with(stored(), "/spec/image", json!("")),
            Reject(RuleId::V1, "spec.image"),
        ),
        case(
            "v1_whitespace_rejected",
            Create,
            None,
            with(stored(), "/spec/image", json!("alpine latest")),
            Reject(RuleId::V1, "spec.image"),
        ),
        case(
            "v1_uppercase_rejected",
            Create,
            None,
            with(stored(), "/spec/image", json!("Alpine")),
            Reject(RuleId::V1, "spec.image"),
        ),
        case(
            "v1_bad_local_name_rejected",
            Create,
            None,
            with(stored(), "/spec/image", json!("local:../x")),
            Reject(RuleId::V1, "spec.image"),
        ),
        case(
            "v1_image_of_wrong_type_rejected",
            Create,
            None,
            with(stored(), "/spec/image", json!(3)),
            Reject(RuleId::Schema, "spec.image"),
        ),
    ]);
}

#[test]
fn v2_bounds() {
    check(vec![
        case(
            "v2_within_bounds_accepted",
            Create,
            None,
            with(stored(), "/spec/resources/cpus", json!(8)),
            Allow,
        ),
        case(
            "v2_at_max_accepted_with_capacity_warning",
            Create,
            None,
            with(stored(), "/spec/resources/cpus", json!(32)),
            Warn(RuleId::V5),
        ),
        case(
            "v2_cpus_above_max_rejected",
            Create,
            None,
            with(stored(), "/spec/resources/cpus", json!(96)),
            Reject(RuleId::V2, "spec.resources.cpus"),
        ),
        case(
            "v2_cpus_below_min_rejected",
            Create,
            None,
            with(stored(), "/spec/resources/cpus", json!(0)),
            Reject(RuleId::V2, "spec.resources.cpus"),
        ),
        case(
            "v2_memory_below_min_rejected",
            Create,
            None,
            with(stored(), "/spec/resources/memoryMiB", json!(64)),
            Reject(RuleId::V2, "spec.resources.memoryMiB"),
        ),
        case(
            "v2_memory_above_max_rejected",
            Create,
            None,
            with(stored(), "/spec/resources/memoryMiB", json!(1 << 20)),
            Reject(RuleId::V2, "spec.resources.memoryMiB"),
        ),
        case(
            "v2_storage_above_max_rejected",
            Create,
            None,
            with(stored(), "/spec/storage/storageGiB", json!(4096)),
            Reject(RuleId::V2, "spec.storage.storageGiB"),
        ),
        case(
            "v2_overlay_below_min_rejected",
            Create,
            None,
            with(stored(), "/spec/storage/overlayGiB", json!(0)),
            Reject(RuleId::V2, "spec.storage.overlayGiB"),
        ),
        case(
            "v2_cpus_of_wrong_type_rejected",
            Create,
            None,
            with(stored(), "/spec/resources/cpus", json!("two")),
            Reject(RuleId::Schema, "spec.resources.cpus"),
        ),
    ]);
}

#[test]
fn v2_message_names_field_value_and_policy() {
    let policy = Policy::default();
    let nodes = nodes();
    let identity = user();
    let ctx = Context {
        policy: &policy,
        nodes: &nodes,
        identity: &identity,
    };
    let object = with(
        with(stored(), "/spec/resources/cpus", json!(96)),
        "/spec/storage/overlayGiB",
        json!(0),
    );
    let verdict = validate_smolvm_json(Create, None, &object, &ctx);
    assert_eq!(
        verdict.violations.len(),
        2,
        "all violations are reported together: {verdict:#?}"
    );
    assert_eq!(
        verdict.violations[0].to_string(),
        "spec.resources.cpus: 96 exceeds the maximum 32 (policy maxCpus) [V2]"
    );
    assert_eq!(verdict.violations[0].value, "96");
    assert!(
        verdict
            .message()
            .contains("spec.storage.overlayGiB: 0 is below the minimum 1 (policy minOverlayGiB) [V2]")
    );
}

#[test]
fn v2_default_outside_policy_names_the_default() {
    let policy = Policy {
        min_memory_mib: 1024,
        ..Policy::default()
    };
    let nodes = nodes();
    let identity = user();
    let ctx = Context {
        policy: &policy,
        nodes: &nodes,
        identity: &identity,
    };
    let object = smolvm("a", json!({"image": "alpine"}));
    let verdict = validate_smolvm_json(Create, None, &object, &ctx);
    assert_eq!(
        verdict.message(),
        "spec.resources.memoryMiB: 512 (the default) is below the minimum 1024 (policy minMemoryMiB) [V2]"
    );
}

fn ports(list: Value) -> Value {
    with(stored(), "/spec/network/ports", list)
}

#[test]
fn v3_ports_and_cidrs() {
    let many: Vec<Value> = (0..17)
        .map(|i| json!({"hostPort": 9000 + i, "guestPort": 80}))
        .collect();
    check(vec![
        case(
            "v3_tcp_and_udp_same_port_accepted",
            Create,
            None,
            ports(json!([{"hostPort": 8080, "guestPort": 80}, {"hostPort": 8080, "guestPort": 80, "protocol": "UDP"}])),
            Allow,
        ),
        case(
            "v3_duplicate_host_port_rejected",
            Create,
            None,
            ports(json!([{"hostPort": 8080, "guestPort": 80}, {"hostPort": 8080, "guestPort": 81}])),
            Reject(RuleId::V3, "spec.network.ports[1]"),
        ),
        case(
            "v3_host_port_below_policy_range_rejected",
            Create,
            None,
            ports(json!([{"hostPort": 80, "guestPort": 80}])),
            Reject(RuleId::V3, "spec.network.ports[0].hostPort"),
        ),
        case(
            "v3_host_port_zero_rejected",
            Create,
            None,
            ports(json!([{"hostPort": 0, "guestPort": 80}])),
            Reject(RuleId::V3, "spec.network.ports[0].hostPort"),
        ),
        case(
            "v3_guest_port_too_large_rejected",
            Create,
            None,
            ports(json!([{"hostPort": 8080, "guestPort": 70000}])),
            Reject(RuleId::V3, "spec.network.ports[0].guestPort"),
        ),
        case(
            "v3_too_many_ports_rejected",
            Create,
            None,
            ports(Value::Array(many)),
            Reject(RuleId::V3, "spec.network.ports"),
        ),
        case(
            "v3_bad_protocol_rejected",
            Create,
            None,
            ports(json!([{"hostPort": 8080, "guestPort": 80, "protocol": "SCTP"}])),
            Reject(RuleId::Schema, "spec.network.ports[0].protocol"),
        ),
        case(
            "v3_ports_need_network_enabled",
            Create,
            None,
            with(stored(), "/spec/network/enabled", json!(false)),
            Reject(RuleId::V3, "spec.network.ports"),
        ),
        case(
            "v3_cidrs_accepted",
            Create,
            None,
            with(
                stored(),
                "/spec/network/allowedCIDRs",
                json!(["10.0.0.0/8", "2001:db8::/32"]),
            ),
            Allow,
        ),
        case(
            "v3_bad_cidr_rejected",
            Create,
            None,
            with(
                stored(),
                "/spec/network/allowedCIDRs",
                json!(["10.0.0.0/8", "10.0.0.300/8"]),
            ),
            Reject(RuleId::V3, "spec.network.allowedCIDRs[1]"),
        ),
        case(
            "v3_cidrs_need_network_enabled",
            Create,
            None,
            with(
                smolvm("a", json!({"image": "alpine"})),
                "/spec/network",
                json!({"enabled": false, "allowedCIDRs": ["10.0.0.0/8"]}),
            ),
            Reject(RuleId::V3, "spec.network.allowedCIDRs"),
        ),
    ]);
}

fn exposed(object: Value) -> Value {
    with(object, "/spec/network/exposeService", json!(true))
}

#[test]
fn v3_expose_service() {
    check(vec![
        case("v3_expose_service_accepted", Create, None, exposed(stored()), Allow),
        case(
            "v3_expose_service_false_accepted",
            Create,
            None,
            with(stored(), "/spec/network/exposeService", json!(false)),
            Allow,
        ),
        case(
            "v3_expose_service_needs_a_service_name",
            Create,
            None,
            exposed(with(stored(), "/metadata/name", json!("web.v1"))),
            Reject(RuleId::V3, "spec.network.exposeService"),
        ),
        case(
            "v3_expose_service_name_over_63_rejected",
            Create,
            None,
            exposed(with(stored(), "/metadata/name", json!("w".repeat(64)))),
            Reject(RuleId::V3, "spec.network.exposeService"),
        ),
        case(
            "v3_dotted_name_without_expose_accepted",
            Create,
            None,
            with(stored(), "/metadata/name", json!("web.v1")),
            Allow,
        ),
        case(
            "v3_expose_service_without_ports_warned",
            Create,
            None,
            exposed(ports(json!([]))),
            Warn(RuleId::V3),
        ),
        case(
            "v3_expose_service_guest_port_twice_warned",
            Create,
            None,
            exposed(ports(
                json!([{"hostPort": 8080, "guestPort": 80}, {"hostPort": 8081, "guestPort": 80}]),
            )),
            Warn(RuleId::V3),
        ),
        // exposeService may change after binding: the Service comes and goes.
        case(
            "v3_expose_service_toggled_when_bound_accepted",
            Update,
            Some(bound(stored(), "node-a")),
            exposed(bound(stored(), "node-a")),
            Allow,
        ),
    ]);
}

#[test]
fn v4_node_name_and_selector() {
    check(vec![
        case(
            "v4_selector_accepted",
            Create,
            None,
            with(
                stored(),
                "/spec/nodeSelector",
                json!({"kubernetes.io/arch": "amd64", "tier": ""}),
            ),
            // V4 accepts the empty label value; no known node carries `tier: ""` (V5 warns).
            Warn(RuleId::V5),
        ),
        case(
            "v4_bad_node_name_rejected",
            Create,
            None,
            with(stored(), "/spec/nodeName", json!("Node_1")),
            Reject(RuleId::V4, "spec.nodeName"),
        ),
        case(
            "v4_bad_selector_key_rejected",
            Create,
            None,
            with(stored(), "/spec/nodeSelector", json!({"bad key": "x"})),
            Reject(RuleId::V4, "spec.nodeSelector"),
        ),
        case(
            "v4_bad_selector_value_rejected",
            Create,
            None,
            with(stored(), "/spec/nodeSelector", json!({"arch": "-amd64"})),
            Reject(RuleId::V4, "spec.nodeSelector"),
        ),
        case(
            "v4_long_selector_value_rejected",
            Create,
            None,
            with(stored(), "/spec/nodeSelector", json!({"arch": "a".repeat(64)})),
            Reject(RuleId::V4, "spec.nodeSelector"),
        ),
    ]);
}

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

#[test]
fn v6_immutable_after_binding() {
    let b = |o: Value| bound(o, "node-a");
    check(vec![
        case(
            "v6_unbound_image_change_accepted",
            Update,
            Some(stored()),
            with(stored(), "/spec/image", json!("alpine:3.20")),
            Allow,
        ),
        case(
            "v6_bound_image_change_rejected",
            Update,
            Some(b(stored())),
            b(with(stored(), "/spec/image", json!("alpine:3.20"))),
            Reject(RuleId::V6, "spec.image"),
        ),
        case(
            "v6_bound_network_disable_rejected",
            Update,
            Some(b(stored())),
            b(without(
                with(stored(), "/spec/network/enabled", json!(false)),
                "/spec/network/ports",
            )),
            Reject(RuleId::V6, "spec.network.enabled"),
        ),
        case(
            "v6_bound_port_change_rejected",
            Update,
            Some(b(stored())),
            b(ports(json!([{"hostPort": 8081, "guestPort": 80, "protocol": "TCP"}]))),
            Reject(RuleId::V6, "spec.network.ports"),
        ),
        case(
            "v6_bound_port_reorder_accepted",
            Update,
            Some(b(ports(
                json!([{"hostPort": 8080, "guestPort": 80, "protocol": "TCP"}, {"hostPort": 8081, "guestPort": 81, "protocol": "TCP"}]),
            ))),
            b(ports(
                json!([{"hostPort": 8081, "guestPort": 81, "protocol": "TCP"}, {"hostPort": 8080, "guestPort": 80, "protocol": "TCP"}]),
            )),
            Allow,
        ),
        case(
            "v6_bound_cidr_change_rejected",
            Update,
            Some(b(stored())),
            b(with(stored(), "/spec/network/allowedCIDRs", json!(["10.0.0.0/8"]))),
            Reject(RuleId::V6, "spec.network.allowedCIDRs"),
        ),
        case(
            "v6_bound_storage_grow_accepted",
            Update,
            Some(b(stored())),
            b(with(stored(), "/spec/storage/storageGiB", json!(40))),
            Allow,
        ),
        case(
            "v6_bound_storage_shrink_rejected",
            Update,
            Some(b(stored())),
            b(with(stored(), "/spec/storage/storageGiB", json!(10))),
            Reject(RuleId::V6, "spec.storage.storageGiB"),
        ),
        case(
            "v6_bound_overlay_shrink_rejected",
            Update,
            Some(b(stored())),
            b(with(stored(), "/spec/storage/overlayGiB", json!(5))),
            Reject(RuleId::V6, "spec.storage.overlayGiB"),
        ),
        case(
            "v6_bound_cpu_change_within_bounds_warns_resize",
            Update,
            Some(b(stored())),
            b(with(stored(), "/spec/resources/cpus", json!(4))),
            Warn(RuleId::V6),
        ),
        case(
            "v6_bound_cpu_change_beyond_bounds_rejected",
            Update,
            Some(b(stored())),
            b(with(stored(), "/spec/resources/cpus", json!(64))),
            Reject(RuleId::V2, "spec.resources.cpus"),
        ),
        case(
            "v6_bound_running_toggle_accepted",
            Update,
            Some(b(stored())),
            b(with(stored(), "/spec/running", json!(false))),
            Allow,
        ),
        case(
            "v6_bound_defaults_filled_in_accepted",
            Update,
            Some(b(smolvm("a", json!({"image": "alpine"})))),
            b(defaulted(smolvm("a", json!({"image": "alpine"})))),
            Allow,
        ),
    ]);
}

/// The seed's example with a workload: command, args, workingDir, env from a value, a Secret and a
/// ConfigMap, a pull secret, a restart policy, a grace period and egress by host name.
fn workload() -> Value {
    let object = with(
        with(
            with(
                with(
                    with(
                        with(stored(), "/spec/command", json!(["/bin/app"])),
                        "/spec/args",
                        json!(["--port", "80"]),
                    ),
                    "/spec/workingDir",
                    json!("/srv"),
                ),
                "/spec/env",
                json!([
                    {"name": "MODE", "value": "prod"},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "app-secrets", "key": "token"}}},
                    {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "log.level", "optional": true}}}
                ]),
            ),
            "/spec/imagePullSecrets",
            json!([{"name": "regcred"}]),
        ),
        "/spec/restartPolicy",
        json!("OnFailure"),
    );
    with(
        object,
        "/spec/network/allowedHosts",
        json!(["api.example.com", "*.example.org"]),
    )
}

#[test]
fn v11_workload() {
    let env = |list: Value| with(workload(), "/spec/env", list);
    let many = |n: usize| json!((0..n).map(|i| format!("a{i}")).collect::<Vec<_>>());
    check(vec![
        case("v11_full_workload_accepted", Create, None, workload(), Allow),
        case(
            "v11_relative_working_dir_rejected",
            Create,
            None,
            with(workload(), "/spec/workingDir", json!("srv")),
            Reject(RuleId::V11, "spec.workingDir"),
        ),
        case(
            "v11_duplicate_env_name_rejected",
            Create,
            None,
            env(json!([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}])),
            Reject(RuleId::V11, "spec.env[1].name"),
        ),
        case(
            "v11_env_name_with_equals_rejected",
            Create,
            None,
            env(json!([{"name": "A=B", "value": "1"}])),
            Reject(RuleId::V11, "spec.env[0].name"),
        ),
        case(
            "v11_empty_env_name_rejected",
            Create,
            None,
            env(json!([{"name": "", "value": "1"}])),
            Reject(RuleId::V11, "spec.env[0].name"),
        ),
        case(
            "v11_env_with_value_and_value_from_rejected",
            Create,
            None,
            env(json!([{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])),
            Reject(RuleId::V11, "spec.env[0]"),
        ),
        case(
            "v11_env_with_neither_rejected",
            Create,
            None,
            env(json!([{"name": "A"}])),
            Reject(RuleId::V11, "spec.env[0]"),
        ),
        case(
            "v11_value_from_both_refs_rejected",
            Create,
            None,
            env(
                json!([{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}, "configMapKeyRef": {"name": "c", "key": "k"}}}]),
            ),
            Reject(RuleId::V11, "spec.env[0].valueFrom"),
        ),
        case(
            "v11_value_from_no_ref_rejected",
            Create,
            None,
            env(json!([{"name": "A", "valueFrom": {}}])),
            Reject(RuleId::V11, "spec.env[0].valueFrom"),
        ),
        case(
            "v11_bad_secret_name_rejected",
            Create,
            None,
            env(json!([{"name": "A", "valueFrom": {"secretKeyRef": {"name": "Bad_Name", "key": "k"}}}])),
            Reject(RuleId::V11, "spec.env[0].valueFrom.secretKeyRef.name"),
        ),
        case(
            "v11_bad_config_map_key_rejected",
            Create,
            None,
            env(json!([{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "a/b"}}}])),
            Reject(RuleId::V11, "spec.env[0].valueFrom.configMapKeyRef.key"),
        ),
        case(
            "v11_dot_dot_key_rejected",
            Create,
            None,
            env(json!([{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "..x"}}}])),
            Reject(RuleId::V11, "spec.env[0].valueFrom.configMapKeyRef.key"),
        ),
        case(
            "v11_too_many_env_rejected",
            Create,
            None,
            env(json!(
                (0..65)
                    .map(|i| json!({"name": format!("V{i}"), "value": "x"}))
                    .collect::<Vec<_>>()
            )),
            Reject(RuleId::V11, "spec.env"),
        ),
        case(
            "v11_env_value_over_max_bytes_rejected",
            Create,
            None,
            env(json!([{"name": "A", "value": "x".repeat(16_385)}])),
            Reject(RuleId::V11, "spec.env[0].value"),
        ),
        case(
            "v11_too_many_args_rejected",
            Create,
            None,
            with(workload(), "/spec/args", many(65)),
            Reject(RuleId::V11, "spec.args"),
        ),
        case(
            "v11_too_many_command_entries_rejected",
            Create,
            None,
            with(workload(), "/spec/command", many(65)),
            Reject(RuleId::V11, "spec.command"),
        ),
        case(
            "v11_arg_over_max_bytes_rejected",
            Create,
            None,
            with(workload(), "/spec/args", json!(["x".repeat(16_385)])),
            Reject(RuleId::V11, "spec.args[0]"),
        ),
        case(
            "v11_bad_pull_secret_name_rejected",
            Create,
            None,
            with(workload(), "/spec/imagePullSecrets", json!([{"name": "-bad"}])),
            Reject(RuleId::V11, "spec.imagePullSecrets[0].name"),
        ),
        case(
            "v11_grace_period_over_300_rejected",
            Create,
            None,
            with(workload(), "/spec/terminationGracePeriodSeconds", json!(301)),
            Reject(RuleId::V11, "spec.terminationGracePeriodSeconds"),
        ),
        case(
            "v11_negative_grace_period_rejected",
            Create,
            None,
            with(workload(), "/spec/terminationGracePeriodSeconds", json!(-1)),
            Reject(RuleId::V11, "spec.terminationGracePeriodSeconds"),
        ),
        case(
            "v11_unknown_restart_policy_rejected",
            Create,
            None,
            with(workload(), "/spec/restartPolicy", json!("Sometimes")),
            Reject(RuleId::Schema, "spec"),
        ),
        case(
            "v11_bad_allowed_host_rejected",
            Create,
            None,
            with(workload(), "/spec/network/allowedHosts", json!(["Example.COM"])),
            Reject(RuleId::V11, "spec.network.allowedHosts[0]"),
        ),
        case(
            "v11_wildcard_in_the_middle_rejected",
            Create,
            None,
            with(workload(), "/spec/network/allowedHosts", json!(["api.*.example.com"])),
            Reject(RuleId::V11, "spec.network.allowedHosts[0]"),
        ),
        case(
            "v11_allowed_hosts_without_network_rejected",
            Create,
            None,
            without(
                with(workload(), "/spec/network/enabled", json!(false)),
                "/spec/network/ports",
            ),
            Reject(RuleId::V11, "spec.network.allowedHosts"),
        ),
        case(
            "v11_too_many_allowed_hosts_rejected",
            Create,
            None,
            with(
                workload(),
                "/spec/network/allowedHosts",
                json!((0..33).map(|i| format!("h{i}.example.com")).collect::<Vec<_>>()),
            ),
            Reject(RuleId::V11, "spec.network.allowedHosts"),
        ),
    ]);
}

#[test]
fn v11_every_violation_is_listed_and_no_value_is_echoed() {
    let object = with(
        with(workload(), "/spec/workingDir", json!("relative")),
        "/spec/env",
        json!([{"name": "A", "value": "s3cret-value".repeat(2000)}, {"name": "A", "value": "other-s3cret"}]),
    );
    let nodes = nodes();
    let ctx = Context {
        policy: &Policy::default(),
        nodes: &nodes,
        identity: &user(),
    };
    let verdict = validate_smolvm_json(Create, None, &object, &ctx);
    let paths: Vec<&str> = verdict.violations.iter().map(|v| v.path.as_str()).collect();
    for expected in ["spec.workingDir", "spec.env[0].value", "spec.env[1].name"] {
        assert!(paths.contains(&expected), "{expected} missing from {paths:?}");
    }
    let text = format!("{verdict:?}");
    assert!(!text.contains("s3cret"), "an env value was echoed: {text}");
}

#[test]
fn v6_workload_immutable_after_binding() {
    let b = |o: Value| bound(o, "node-a");
    let changed = |pointer: &str, value: Value| b(with(workload(), pointer, value));
    check(vec![
        case(
            "v6_unbound_command_change_accepted",
            Update,
            Some(workload()),
            with(workload(), "/spec/command", json!(["/bin/other"])),
            Allow,
        ),
        case(
            "v6_bound_same_workload_accepted",
            Update,
            Some(b(workload())),
            b(workload()),
            Allow,
        ),
        case(
            "v6_bound_command_change_rejected",
            Update,
            Some(b(workload())),
            changed("/spec/command", json!(["/bin/other"])),
            Reject(RuleId::V6, "spec.command"),
        ),
        case(
            "v6_bound_args_change_rejected",
            Update,
            Some(b(workload())),
            changed("/spec/args", json!([])),
            Reject(RuleId::V6, "spec.args"),
        ),
        case(
            "v6_bound_working_dir_change_rejected",
            Update,
            Some(b(workload())),
            changed("/spec/workingDir", json!("/tmp")),
            Reject(RuleId::V6, "spec.workingDir"),
        ),
        case(
            "v6_bound_env_change_rejected",
            Update,
            Some(b(workload())),
            changed("/spec/env", json!([{"name": "MODE", "value": "dev"}])),
            Reject(RuleId::V6, "spec.env"),
        ),
        case(
            "v6_bound_pull_secret_change_rejected",
            Update,
            Some(b(workload())),
            changed("/spec/imagePullSecrets", json!([{"name": "other"}])),
            Reject(RuleId::V6, "spec.imagePullSecrets"),
        ),
        case(
            "v6_bound_restart_policy_change_rejected",
            Update,
            Some(b(workload())),
            changed("/spec/restartPolicy", json!("Never")),
            Reject(RuleId::V6, "spec.restartPolicy"),
        ),
        case(
            "v6_bound_grace_change_rejected",
            Update,
            Some(b(workload())),
            changed("/spec/terminationGracePeriodSeconds", json!(30)),
            Reject(RuleId::V6, "spec.terminationGracePeriodSeconds"),
        ),
        case(
            "v6_bound_allowed_hosts_change_rejected",
            Update,
            Some(b(workload())),
            changed("/spec/network/allowedHosts", json!(["api.example.com"])),
            Reject(RuleId::V6, "spec.network.allowedHosts"),
        ),
        case(
            "v6_bound_restart_defaults_filled_in_accepted",
            Update,
            Some(b(without(
                without(workload(), "/spec/restartPolicy"),
                "/spec/terminationGracePeriodSeconds",
            ))),
            b(with(workload(), "/spec/restartPolicy", json!("Always"))),
            Allow,
        ),
    ]);
    // The message says what to do, and never shows the values.
    let nodes = nodes();
    let ctx = Context {
        policy: &Policy::default(),
        nodes: &nodes,
        identity: &user(),
    };
    let verdict = validate_smolvm_json(
        Update,
        Some(&b(workload())),
        &changed("/spec/env", json!([{"name": "MODE", "value": "n3w-s3cret"}])),
        &ctx,
    );
    let text = verdict
        .violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        text.contains("delete and recreate") && !text.contains("n3w-s3cret"),
        "{text}"
    );
}

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

#[test]
fn transition_matrix_unbound_bound_deleting_pinned() {
    // Every combination of (bound?, deleting?, pinned?): a metadata-only update is allowed, an
    // image change is rejected exactly when bound or deleting, the force-delete annotation is
    // accepted exactly when deleting, and becoming deleting is always accepted.
    for is_bound in [false, true] {
        for is_deleting in [false, true] {
            for is_pinned in [false, true] {
                let mut old = stored();
                if is_pinned {
                    old = with(old, "/spec/nodeName", json!("node-a"));
                }
                if is_bound {
                    old = bound(old, "node-a");
                }
                if is_deleting {
                    old = deleting(old);
                }
                let label = format!("bound={is_bound} deleting={is_deleting} pinned={is_pinned}");
                let meta = with(old.clone(), "/metadata/labels", json!({"team": "a"}));
                let image = with(old.clone(), "/spec/image", json!("alpine:3.20"));
                let policy = Policy::default();
                let nodes = nodes();
                let identity = user();
                let ctx = Context {
                    policy: &policy,
                    nodes: &nodes,
                    identity: &identity,
                };
                let v = validate_smolvm_json(Update, Some(&old), &meta, &ctx);
                assert!(v.allowed(), "metadata-only update must pass ({label}): {v:?}");
                let v = validate_smolvm_json(Update, Some(&old), &image, &ctx);
                let expected_rule = if is_deleting {
                    Some(RuleId::V8)
                } else if is_bound {
                    Some(RuleId::V6)
                } else {
                    None
                };
                assert_eq!(
                    v.violated_rules().first().copied(),
                    expected_rule,
                    "image change ({label}): {v:?}"
                );
                // The force-delete annotation: accepted (with a warning) exactly on an object
                // being deleted; otherwise V7 rejects it.
                let forced = annotated(old.clone(), "true");
                let v = validate_smolvm_json(Update, Some(&old), &forced, &ctx);
                if is_deleting {
                    assert!(v.allowed(), "force-delete while deleting ({label}): {v:?}");
                    assert_eq!(v.warnings.first().map(|w| w.rule), Some(RuleId::V7), "{label}");
                } else {
                    assert_eq!(
                        v.violated_rules(),
                        vec![RuleId::V7],
                        "force-delete, not deleting ({label}): {v:?}"
                    );
                }
                // The transition into deletion (the API server sets deletionTimestamp): the
                // update that only marks the object deleting is never refused.
                if !is_deleting {
                    let marked = deleting(old.clone());
                    let v = validate_smolvm_json(Update, Some(&old), &marked, &ctx);
                    assert!(v.allowed(), "not deleting -> deleting ({label}): {v:?}");
                }
            }
        }
    }
}

#[test]
fn m1_m2_defaults_then_validates() {
    let object = smolvm("a", json!({"image": "alpine"}));
    let patched = defaulted(object);
    assert_eq!(
        patched["metadata"]["finalizers"],
        json!([smolvm_api::constants::FINALIZER])
    );
    let policy = Policy::default();
    let nodes = nodes();
    let identity = user();
    let ctx = Context {
        policy: &policy,
        nodes: &nodes,
        identity: &identity,
    };
    let verdict = validate_smolvm_json(Create, None, &patched, &ctx);
    assert!(verdict.allowed(), "{verdict:?}");
}

#[test]
fn malformed_objects_are_schema_violations() {
    let policy = Policy::default();
    let identity = fixtures::user();
    let ctx = Context {
        policy: &policy,
        nodes: &Vec::<SmolVMNode>::new(),
        identity: &identity,
    };
    for bad in [
        json!(null),
        json!([]),
        json!({"spec": 1}),
        json!({"metadata": {"name": 3}, "spec": {"image": "a"}}),
    ] {
        let v = validate_smolvm_json(Create, None, &bad, &ctx);
        assert!(!v.allowed(), "{bad}");
        assert!(
            v.violations
                .iter()
                .all(|f| matches!(f.rule, RuleId::Schema | RuleId::V1)),
            "{v:?}"
        );
    }
}
