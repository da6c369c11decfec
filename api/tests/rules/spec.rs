//! V1 to V4: the image, the policy bounds, ports, CIDRs and the Service, node names and selectors.

use super::*;

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
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
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
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
        identity: &identity,
    };
    let object = smolvm("a", json!({"image": "alpine"}));
    let verdict = validate_smolvm_json(Create, None, &object, &ctx);
    assert_eq!(
        verdict.message(),
        "spec.resources.memoryMiB: 512 (the default) is below the minimum 1024 (policy minMemoryMiB) [V2]"
    );
}

/// V3 and V6: a VM bound to a host port the policy excludes later keeps it (its ports cannot
/// change after binding); its updates are admitted with a warning naming the rule.
#[test]
fn v3_a_bound_vm_keeps_a_port_excluded_later() {
    let old = smolvm_api::fixtures::bound(ports(json!([{"hostPort": 10250, "guestPort": 80}])), "node-a");
    check(vec![
        case(
            "v3_excluded_port_predating_the_policy_is_a_warning",
            Update,
            Some(old.clone()),
            with(old.clone(), "/spec/running", json!(false)),
            Warn(RuleId::V3),
        ),
        case(
            "v3_moving_an_unbound_vm_onto_an_excluded_port_is_rejected",
            Update,
            Some(ports(json!([{"hostPort": 8080, "guestPort": 80}]))),
            ports(json!([{"hostPort": 30000, "guestPort": 80}])),
            Reject(RuleId::V3, "spec.network.ports[0].hostPort"),
        ),
    ]);
    // The message names the field, the value and the rule.
    let policy = Policy::default();
    let nodes = nodes();
    let identity = user();
    let ctx = Context {
        policy: &policy,
        nodes: &nodes,
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
        identity: &identity,
    };
    let verdict = validate_smolvm_json(
        Create,
        None,
        &ports(json!([{"hostPort": 31000, "guestPort": 80}])),
        &ctx,
    );
    assert_eq!(verdict.violations.len(), 1, "{verdict:#?}");
    let text = verdict.violations[0].to_string();
    for part in [
        "spec.network.ports[0].hostPort",
        "31000",
        "30000-32767",
        "excludedHostPorts",
        "[V3]",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
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
            "v3_kubelet_port_excluded",
            Create,
            None,
            ports(json!([{"hostPort": 10250, "guestPort": 80}])),
            Reject(RuleId::V3, "spec.network.ports[0].hostPort"),
        ),
        case(
            "v3_kube_proxy_ports_excluded",
            Create,
            None,
            ports(
                json!([{"hostPort": 8080, "guestPort": 80}, {"hostPort": 10256, "guestPort": 81, "protocol": "UDP"}]),
            ),
            Reject(RuleId::V3, "spec.network.ports[1].hostPort"),
        ),
        case(
            "v3_node_port_range_excluded",
            Create,
            None,
            ports(json!([{"hostPort": 30080, "guestPort": 80}])),
            Reject(RuleId::V3, "spec.network.ports[0].hostPort"),
        ),
        case(
            "v3_agent_node_api_port_excluded",
            Create,
            None,
            ports(json!([{"hostPort": 10443, "guestPort": 443}])),
            Reject(RuleId::V3, "spec.network.ports[0].hostPort"),
        ),
        case(
            "v3_agent_ops_port_excluded",
            Create,
            None,
            ports(json!([{"hostPort": 9090, "guestPort": 80}])),
            Reject(RuleId::V3, "spec.network.ports[0].hostPort"),
        ),
        case(
            "v3_next_to_the_node_port_range_accepted",
            Create,
            None,
            ports(json!([{"hostPort": 29999, "guestPort": 80}, {"hostPort": 32768, "guestPort": 81}])),
            Allow,
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
