//! V11: the workload fields (command, env, pull secrets, egress hosts).

use super::*;

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
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
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
