//! V18: a SmolVM's lifetimes (`spec.lifecycle`, SPEC 2.7), 0 seconds to ten years each, both
//! reported in one answer; they may change after binding. Its idle suspension: a duration of at
//! least 30 s and at most the policy's maximum; `wakeOnTraffic` only with it.

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
    check(vec![
        case(
            "v18_idle_five_minutes_accepted",
            Create,
            None,
            lifecycle(json!({"suspendAfterIdle": "5m", "wakeOnTraffic": true})),
            Allow,
        ),
        case(
            "v18_idle_go_duration_accepted",
            Create,
            None,
            lifecycle(json!({"suspendAfterIdle": "1h30m", "wakeOnTraffic": false})),
            Allow,
        ),
        case(
            "v18_idle_thirty_seconds_accepted",
            Create,
            None,
            lifecycle(json!({"suspendAfterIdle": "30s"})),
            Allow,
        ),
        case(
            "v18_idle_below_thirty_seconds_rejected",
            Create,
            None,
            lifecycle(json!({"suspendAfterIdle": "29s"})),
            Reject(RuleId::V18, "spec.lifecycle.suspendAfterIdle"),
        ),
        case(
            "v18_idle_past_the_policy_rejected",
            Create,
            None,
            lifecycle(json!({"suspendAfterIdle": "169h"})),
            Reject(RuleId::V18, "spec.lifecycle.suspendAfterIdle"),
        ),
        case(
            "v18_idle_not_a_duration_rejected",
            Create,
            None,
            lifecycle(json!({"suspendAfterIdle": "5 minutes"})),
            Reject(RuleId::V18, "spec.lifecycle.suspendAfterIdle"),
        ),
        case(
            "v18_idle_without_unit_rejected",
            Create,
            None,
            lifecycle(json!({"suspendAfterIdle": "300"})),
            Reject(RuleId::V18, "spec.lifecycle.suspendAfterIdle"),
        ),
        case(
            "v18_wake_without_idle_rejected",
            Create,
            None,
            lifecycle(json!({"wakeOnTraffic": true})),
            Reject(RuleId::V18, "spec.lifecycle.wakeOnTraffic"),
        ),
        case(
            "v18_idle_may_change_after_binding",
            Update,
            Some(bound(
                lifecycle(json!({"suspendAfterIdle": "5m", "wakeOnTraffic": true})),
                "node-a",
            )),
            bound(
                lifecycle(json!({"suspendAfterIdle": "10m", "wakeOnTraffic": true})),
                "node-a",
            ),
            Allow,
        ),
    ]);
    // The message names the value and the rule.
    let short = lifecycle(json!({"suspendAfterIdle": "10s"}));
    let verdict = run(
        &case("v18_short", Create, None, short, Allow),
        &Policy::default(),
        &nodes(),
    );
    let idle = verdict
        .violations
        .iter()
        .find(|f| f.rule == RuleId::V18)
        .expect("a V18 violation");
    assert_eq!(idle.path, "spec.lifecycle.suspendAfterIdle");
    assert!(
        idle.message.contains("10s") && idle.message.contains("30s"),
        "{}",
        idle.message
    );
    // A policy may lower the maximum.
    let policy = Policy {
        max_suspend_after_idle_seconds: 600,
        ..Policy::default()
    };
    let long = lifecycle(json!({"suspendAfterIdle": "11m"}));
    let verdict = run(&case("v18_policy", Create, None, long, Allow), &policy, &nodes());
    assert!(
        verdict
            .violations
            .iter()
            .any(|f| f.rule == RuleId::V18 && f.message.contains("maxSuspendAfterIdleSeconds")),
        "{:?}",
        verdict.violations
    );
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
