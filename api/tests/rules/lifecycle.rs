//! Across the rules: the unbound/bound/deleting/pinned transitions, M1/M2 then validation, malformed objects.

use super::*;

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
                    classes: &smolvm_api::class::NO_CLASSES,
                    pools: &smolvm_api::pool::NO_POOLS,
                    sources: &smolvm_api::branch::NO_SOURCES,
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
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
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
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
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
