//! V18: a SmolVM's lifetimes (`spec.lifecycle`, SPEC 2.7), 0 seconds to ten years each, both
//! reported in one answer; they may change after binding.

use super::*;

#[test]
fn v18_lifetimes() {
    let lifecycle = |value: Value| with(stored(), "/spec/lifecycle", value);
    let ten_years = smolvm_api::MAX_LIFETIME_SECONDS;
    check(vec![
        case(
            "v18_both_lifetimes_accepted",
            Create,
            None,
            lifecycle(json!({"ttlSecondsAfterFinished": 0, "activeDeadlineSeconds": 3600})),
            Allow,
        ),
        case(
            "v18_ten_years_accepted",
            Create,
            None,
            lifecycle(json!({"activeDeadlineSeconds": ten_years})),
            Allow,
        ),
        case(
            "v18_negative_ttl_rejected",
            Create,
            None,
            lifecycle(json!({"ttlSecondsAfterFinished": -1})),
            Reject(RuleId::V18, "spec.lifecycle.ttlSecondsAfterFinished"),
        ),
        case(
            "v18_deadline_past_ten_years_rejected",
            Create,
            None,
            lifecycle(json!({"activeDeadlineSeconds": ten_years + 1})),
            Reject(RuleId::V18, "spec.lifecycle.activeDeadlineSeconds"),
        ),
        case(
            "v18_a_lifetime_may_change_after_binding",
            Update,
            Some(bound(lifecycle(json!({"activeDeadlineSeconds": 60})), "node-a")),
            bound(lifecycle(json!({"activeDeadlineSeconds": 7200})), "node-a"),
            Allow,
        ),
    ]);
    // Both out of range: both named, in one answer.
    let both = lifecycle(json!({"ttlSecondsAfterFinished": -5, "activeDeadlineSeconds": -6}));
    let verdict = run(
        &case("v18_both", Create, None, both, Allow),
        &Policy::default(),
        &nodes(),
    );
    let paths: Vec<&str> = verdict
        .violations
        .iter()
        .filter(|f| f.rule == RuleId::V18)
        .map(|f| f.path.as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "spec.lifecycle.ttlSecondsAfterFinished",
            "spec.lifecycle.activeDeadlineSeconds"
        ]
    );
    assert!(
        verdict.violations.iter().all(|f| f.message.contains("ten years")),
        "each says the rule: {:?}",
        verdict.violations
    );
}
