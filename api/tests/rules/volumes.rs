//! V16: a SmolVM's volumes (SPEC 2.5).

use super::*;

/// A claim, a claim template, a ConfigMap and a Secret, each where the guest reads it.
fn volumes() -> Value {
    json!([
        {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "db-data"}},
        {"name": "scratch", "mountPath": "/scratch", "claimTemplate": {
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
            "whenDeleted": "Delete"}},
        {"name": "config", "mountPath": "/etc/app", "configMap": {"name": "app-config"}},
        {"name": "tls", "mountPath": "/etc/tls", "readOnly": true, "secret": {"secretName": "app-tls", "optional": true}}
    ])
}

fn with_volumes(list: Value) -> Value {
    with(stored(), "/spec/volumes", list)
}

fn one(volume: Value) -> Value {
    with_volumes(json!([volume]))
}

fn template(spec: Value) -> Value {
    one(json!({"name": "scratch", "mountPath": "/scratch", "claimTemplate": {"spec": spec}}))
}

#[test]
fn v16_volumes() {
    let rwo = json!(["ReadWriteOnce"]);
    let ten = json!({"requests": {"storage": "10Gi"}});
    check(vec![
        case(
            "v16_four_sources_accepted",
            Create,
            None,
            with_volumes(volumes()),
            Allow,
        ),
        case(
            "v16_no_source_rejected",
            Create,
            None,
            one(json!({"name": "data", "mountPath": "/data"})),
            Reject(RuleId::V16, "spec.volumes[0]"),
        ),
        case(
            "v16_two_sources_rejected",
            Create,
            None,
            one(json!({"name": "data", "mountPath": "/data",
                "persistentVolumeClaim": {"claimName": "a"}, "configMap": {"name": "b"}})),
            Reject(RuleId::V16, "spec.volumes[0]"),
        ),
        case(
            "v16_bad_name_rejected",
            Create,
            None,
            one(json!({"name": "Data_1", "mountPath": "/data", "configMap": {"name": "b"}})),
            Reject(RuleId::V16, "spec.volumes[0].name"),
        ),
        case(
            "v16_duplicate_name_rejected",
            Create,
            None,
            with_volumes(json!([
                {"name": "a", "mountPath": "/a", "configMap": {"name": "b"}},
                {"name": "a", "mountPath": "/b", "configMap": {"name": "c"}}
            ])),
            Reject(RuleId::V16, "spec.volumes[1].name"),
        ),
        case(
            "v16_duplicate_mount_path_rejected",
            Create,
            None,
            with_volumes(json!([
                {"name": "a", "mountPath": "/data", "configMap": {"name": "b"}},
                {"name": "b", "mountPath": "/data/", "configMap": {"name": "c"}}
            ])),
            Reject(RuleId::V16, "spec.volumes[1].mountPath"),
        ),
        case(
            "v16_relative_mount_path_rejected",
            Create,
            None,
            one(json!({"name": "a", "mountPath": "data", "configMap": {"name": "b"}})),
            Reject(RuleId::V16, "spec.volumes[0].mountPath"),
        ),
        case(
            "v16_root_mount_path_rejected",
            Create,
            None,
            one(json!({"name": "a", "mountPath": "/", "configMap": {"name": "b"}})),
            Reject(RuleId::V16, "spec.volumes[0].mountPath"),
        ),
        case(
            "v16_dot_dot_mount_path_rejected",
            Create,
            None,
            one(json!({"name": "a", "mountPath": "/data/../etc", "configMap": {"name": "b"}})),
            Reject(RuleId::V16, "spec.volumes[0].mountPath"),
        ),
        case(
            "v16_bad_claim_name_rejected",
            Create,
            None,
            one(json!({"name": "a", "mountPath": "/a", "persistentVolumeClaim": {"claimName": "Bad_Claim"}})),
            Reject(RuleId::V16, "spec.volumes[0].persistentVolumeClaim.claimName"),
        ),
        case(
            "v16_bad_config_map_name_rejected",
            Create,
            None,
            one(json!({"name": "a", "mountPath": "/a", "configMap": {"name": "-x"}})),
            Reject(RuleId::V16, "spec.volumes[0].configMap.name"),
        ),
        case(
            "v16_bad_secret_name_rejected",
            Create,
            None,
            one(json!({"name": "a", "mountPath": "/a", "secret": {"secretName": "x_y"}})),
            Reject(RuleId::V16, "spec.volumes[0].secret.secretName"),
        ),
        case(
            "v16_template_without_access_modes_rejected",
            Create,
            None,
            template(json!({"resources": ten})),
            Reject(RuleId::V16, "spec.volumes[0].claimTemplate.spec.accessModes"),
        ),
        case(
            "v16_template_with_unknown_access_mode_rejected",
            Create,
            None,
            template(json!({"accessModes": ["ReadWriteSometimes"], "resources": ten})),
            Reject(RuleId::V16, "spec.volumes[0].claimTemplate.spec.accessModes[0]"),
        ),
        case(
            "v16_template_without_storage_rejected",
            Create,
            None,
            template(json!({"accessModes": rwo})),
            Reject(
                RuleId::V16,
                "spec.volumes[0].claimTemplate.spec.resources.requests.storage",
            ),
        ),
        case(
            "v16_template_with_zero_storage_rejected",
            Create,
            None,
            template(json!({"accessModes": rwo, "resources": {"requests": {"storage": "0"}}})),
            Reject(
                RuleId::V16,
                "spec.volumes[0].claimTemplate.spec.resources.requests.storage",
            ),
        ),
        case(
            "v16_block_template_rejected",
            Create,
            None,
            template(json!({"accessModes": rwo, "resources": ten, "volumeMode": "Block"})),
            Reject(RuleId::V16, "spec.volumes[0].claimTemplate.spec.volumeMode"),
        ),
        case(
            "v16_filesystem_template_accepted",
            Create,
            None,
            template(
                json!({"accessModes": rwo, "resources": ten, "volumeMode": "Filesystem", "storageClassName": "local"}),
            ),
            Allow,
        ),
        case(
            "v16_volumes_may_change_before_binding",
            Update,
            Some(with_volumes(volumes())),
            one(json!({"name": "a", "mountPath": "/a", "configMap": {"name": "b"}})),
            Allow,
        ),
        case(
            "v16_volumes_immutable_once_bound",
            Update,
            Some(fixtures::bound(with_volumes(volumes()), "node-a")),
            fixtures::bound(
                one(json!({"name": "a", "mountPath": "/a", "configMap": {"name": "b"}})),
                "node-a",
            ),
            Reject(RuleId::V16, "spec.volumes"),
        ),
        case(
            "v16_unchanged_volumes_pass_once_bound",
            Update,
            Some(fixtures::bound(with_volumes(volumes()), "node-a")),
            fixtures::bound(with(with_volumes(volumes()), "/spec/running", json!(false)), "node-a"),
            Allow,
        ),
        case(
            "v16_the_holders_identity_volume_name_rejected",
            Create,
            None,
            one(json!({"name": "smolvm-holder-identity", "mountPath": "/a", "configMap": {"name": "b"}})),
            Reject(RuleId::V16, "spec.volumes[0].name"),
        ),
        case(
            "v16_long_name_with_volumes_rejected",
            Create,
            None,
            with(with_volumes(volumes()), "/metadata/name", json!("a".repeat(64))),
            Reject(RuleId::V16, "metadata.name"),
        ),
    ]);
}

#[test]
fn v16_at_most_the_policy_maximum_of_volumes() {
    let many: Vec<Value> = (0..3)
        .map(|i| json!({"name": format!("v{i}"), "mountPath": format!("/v{i}"), "configMap": {"name": "c"}}))
        .collect();
    let policy = Policy {
        max_volumes: 2,
        ..Policy::default()
    };
    check_with(
        vec![case(
            "v16_more_volumes_than_the_policy_allows_rejected",
            Create,
            None,
            with_volumes(json!(many)),
            Reject(RuleId::V16, "spec.volumes"),
        )],
        &policy,
        &nodes(),
    );
}

#[test]
fn v16_every_volume_violation_in_one_answer() {
    let object = with_volumes(json!([
        {"name": "Bad", "mountPath": "rel", "configMap": {"name": "c"}, "secret": {"secretName": "s"}},
        {"name": "b", "mountPath": "/b", "claimTemplate": {"spec": {"volumeMode": "Block"}}}
    ]));
    let ctx_policy = Policy::default();
    let verdict = run(&case("all", Create, None, object, Allow), &ctx_policy, &nodes());
    let paths: Vec<&str> = verdict.violations.iter().map(|v| v.path.as_str()).collect();
    for expected in [
        "spec.volumes[0].name",
        "spec.volumes[0].mountPath",
        "spec.volumes[0]",
        "spec.volumes[1].claimTemplate.spec.accessModes",
        "spec.volumes[1].claimTemplate.spec.resources.requests.storage",
        "spec.volumes[1].claimTemplate.spec.volumeMode",
    ] {
        assert!(paths.contains(&expected), "{expected} missing from {paths:?}");
    }
    assert!(verdict.violations.iter().all(|v| v.rule == RuleId::V16), "{verdict:#?}");
}

#[test]
fn v14_a_pooled_smolvm_sets_no_volumes() {
    let request = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
        "metadata": {"name": "a", "namespace": "default"},
        "spec": {"poolRef": {"name": "web"}, "volumes": [{"name": "a", "mountPath": "/a", "configMap": {"name": "b"}}]}});
    let verdict = smolvm_api::validate::validate_pooled_request(&request);
    assert!(
        verdict
            .violations
            .iter()
            .any(|v| v.rule == RuleId::V14 && v.path == "spec.volumes"),
        "{verdict:#?}"
    );
}
