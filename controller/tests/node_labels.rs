//! The Node label mirror's pure decision (controller/src/tasks/node_labels.rs): which labels a
//! SmolVMNode carries after its Node's are mirrored, and the patch that gets it there.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;
use smolvm_api::constants::{ANNOTATION_MIRRORED_LABELS, LABEL_GPU_COUNT, LABEL_GUEST_BOOTABLE, LABEL_NODE};
use smolvm_controller::tasks::node_labels::{RETRY, label_patch, merge_labels, parse_mirrored, plan, render_mirrored};

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

#[test]
fn label_merge_keeps_admin_and_agent_labels() {
    struct Case {
        name: &'static str,
        current: BTreeMap<String, String>,
        mirrored: BTreeSet<String>,
        node: BTreeMap<String, String>,
        labels: BTreeMap<String, String>,
        now_mirrored: BTreeSet<String>,
    }
    let cases = [
        Case {
            name: "fresh",
            current: map(&[]),
            mirrored: set(&[]),
            node: map(&[("zone", "a")]),
            labels: map(&[("zone", "a"), (LABEL_NODE, "n1")]),
            now_mirrored: set(&["zone"]),
        },
        Case {
            name: "admin label kept, removed node label dropped",
            current: map(&[("zone", "a"), ("gpu", "yes"), ("team", "x"), (LABEL_NODE, "n1")]),
            mirrored: set(&["zone", "gpu"]),
            node: map(&[("zone", "b")]),
            labels: map(&[("zone", "b"), ("team", "x"), (LABEL_NODE, "n1")]),
            now_mirrored: set(&["zone"]),
        },
        Case {
            name: "an admin label whose key the node now has keeps the admin's value",
            current: map(&[("team", "x")]),
            mirrored: set(&[]),
            node: map(&[("team", "y")]),
            labels: map(&[("team", "x"), (LABEL_NODE, "n1")]),
            now_mirrored: set(&[]),
        },
        Case {
            name: "once the admin removes it, the node's value is mirrored",
            current: map(&[(LABEL_NODE, "n1")]),
            mirrored: set(&[]),
            node: map(&[("team", "y")]),
            labels: map(&[("team", "y"), (LABEL_NODE, "n1")]),
            now_mirrored: set(&["team"]),
        },
        Case {
            name: "node lost all labels",
            current: map(&[("zone", "a"), ("team", "x"), (LABEL_NODE, "n1")]),
            mirrored: set(&["zone"]),
            node: map(&[]),
            labels: map(&[("team", "x"), (LABEL_NODE, "n1")]),
            now_mirrored: set(&[]),
        },
        Case {
            name: "the agent's own labels are left to the agent",
            current: map(&[(LABEL_GUEST_BOOTABLE, "false"), (LABEL_GPU_COUNT, "2")]),
            mirrored: set(&[]),
            node: map(&[("zone", "a")]),
            labels: map(&[
                (LABEL_GUEST_BOOTABLE, "false"),
                (LABEL_GPU_COUNT, "2"),
                ("zone", "a"),
                (LABEL_NODE, "n1"),
            ]),
            now_mirrored: set(&["zone"]),
        },
        Case {
            name: "a Node label under vm.smolvm.dev/ is never mirrored over the operator's",
            current: map(&[(LABEL_GUEST_BOOTABLE, "false")]),
            mirrored: set(&[]),
            node: map(&[(LABEL_GUEST_BOOTABLE, "true"), (LABEL_NODE, "elsewhere"), ("zone", "a")]),
            labels: map(&[(LABEL_GUEST_BOOTABLE, "false"), ("zone", "a"), (LABEL_NODE, "n1")]),
            now_mirrored: set(&["zone"]),
        },
        Case {
            name: "an operator key the annotation lists is neither removed nor mirrored",
            current: map(&[(LABEL_GUEST_BOOTABLE, "true"), (LABEL_NODE, "n1")]),
            mirrored: set(&[LABEL_GUEST_BOOTABLE, LABEL_NODE]),
            node: map(&[]),
            labels: map(&[(LABEL_GUEST_BOOTABLE, "true"), (LABEL_NODE, "n1")]),
            now_mirrored: set(&[]),
        },
        Case {
            name: "a stale node-name label is corrected",
            current: map(&[(LABEL_NODE, "someone-else")]),
            mirrored: set(&[]),
            node: map(&[]),
            labels: map(&[(LABEL_NODE, "n1")]),
            now_mirrored: set(&[]),
        },
    ];
    for case in cases {
        let merged = merge_labels(&case.current, &case.mirrored, &case.node, "n1");
        assert_eq!(merged.labels, case.labels, "{}", case.name);
        assert_eq!(merged.mirrored, case.now_mirrored, "{}", case.name);
    }
}

#[test]
fn node_label_is_written_only_when_the_name_fits_a_label_value() {
    let short = "ip-10-0-0-1.ec2.internal";
    let long = "ip-192-168-101-202.ap-southeast-2.compute.internal.example-long-suffix";
    assert!(long.len() > 63);
    let merged = merge_labels(&map(&[]), &set(&[]), &map(&[("zone", "a")]), short);
    assert_eq!(merged.labels.get(LABEL_NODE).map(String::as_str), Some(short));
    let merged = merge_labels(&map(&[(LABEL_NODE, "stale")]), &set(&[]), &map(&[("zone", "a")]), long);
    assert_eq!(merged.labels.get(LABEL_NODE), None);
    assert_eq!(merged.labels.get("zone").map(String::as_str), Some("a"));
}

#[test]
fn label_patch_sets_removes_and_is_empty_when_equal() {
    let current = map(&[("zone", "a"), ("gpu", "yes"), (LABEL_NODE, "n1")]);
    let merged = merge_labels(&current, &set(&["zone", "gpu"]), &map(&[("zone", "b")]), "n1");
    let patch = label_patch(&current, Some("gpu,zone"), &merged, Some("42")).expect("patch");
    assert_eq!(
        patch,
        json!({"metadata": {"resourceVersion": "42", "labels": {"gpu": null, "zone": "b"},
            "annotations": {ANNOTATION_MIRRORED_LABELS: "zone"}}})
    );
    let after = merged.labels.clone();
    assert_eq!(label_patch(&after, Some("zone"), &merged, Some("43")), None);
    assert_eq!(parse_mirrored(Some("b, a,,")), set(&["a", "b"]));
    assert_eq!(render_mirrored(&set(&["b", "a"])), "a,b");
}

/// The decision on a SmolVMNode's metadata: what the agent creates gets the Node's labels and
/// the annotation, conditional on the version read; one already in step gets no write.
#[test]
fn plan_table() {
    let node = map(&[("kubernetes.io/hostname", "n1"), ("tenant", "a")]);
    let meta = |labels: &[(&str, &str)], annotation: Option<&str>| ObjectMeta {
        name: Some("n1".into()),
        resource_version: Some("7".into()),
        labels: (!labels.is_empty()).then(|| map(labels)),
        annotations: annotation.map(|a| map(&[(ANNOTATION_MIRRORED_LABELS, a)])),
        ..ObjectMeta::default()
    };
    let cases = [
        (
            "created by its agent: everything to mirror",
            meta(&[(LABEL_GUEST_BOOTABLE, "false")], None),
            Some(json!({"metadata": {"resourceVersion": "7",
                "labels": {"kubernetes.io/hostname": "n1", "tenant": "a", LABEL_NODE: "n1"},
                "annotations": {ANNOTATION_MIRRORED_LABELS: "kubernetes.io/hostname,tenant"}}})),
        ),
        (
            "in step: no write",
            meta(
                &[("kubernetes.io/hostname", "n1"), ("tenant", "a"), (LABEL_NODE, "n1")],
                Some("kubernetes.io/hostname,tenant"),
            ),
            None,
        ),
        (
            "an admin's tenant label wins over the Node's, and no write is needed for it",
            meta(
                &[("kubernetes.io/hostname", "n1"), ("tenant", "b"), (LABEL_NODE, "n1")],
                Some("kubernetes.io/hostname"),
            ),
            None,
        ),
        (
            "a mirrored label changed by someone else is put back",
            meta(
                &[("kubernetes.io/hostname", "n1"), ("tenant", "z"), (LABEL_NODE, "n1")],
                Some("kubernetes.io/hostname,tenant"),
            ),
            Some(json!({"metadata": {"resourceVersion": "7", "labels": {"tenant": "a"}}})),
        ),
    ];
    for (name, smolvm_node, want) in cases {
        assert_eq!(plan(&smolvm_node, &node, "n1"), want, "{name}");
    }
}

#[test]
fn retries_double_from_one_second_to_five_minutes() {
    let waits: Vec<u64> = [1, 2, 3, 4, 9, 10, 40, u32::MAX]
        .into_iter()
        .map(|n| RETRY.after(n).as_secs())
        .collect();
    assert_eq!(waits, [1, 2, 4, 8, 256, 300, 300, 300]);
}
