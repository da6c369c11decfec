//! V6: what may change once a SmolVM is bound, its workload included.

use super::*;

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
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
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
