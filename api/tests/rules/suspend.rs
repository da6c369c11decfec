//! V13 (SPEC 2.3): `suspended` with `running: false` is admitted with a warning; a bound SmolVM
//! that is suspended (by a user or, SPEC 2.7, by the controller for idleness), or becomes so in
//! the same update, keeps its CPUs and memory. M1 defaults
//! `suspended` to false.

use super::*;

#[test]
fn m1_defaults_suspended_to_false_and_a_second_pass_is_empty() {
    let object = alpine();
    let patched = defaulted(object);
    assert_eq!(patched.pointer("/spec/suspended"), Some(&json!(false)));
    assert!(
        default_smolvm(Update, &patched).0.is_empty(),
        "a second pass adds nothing"
    );
    let asked = defaulted(with(alpine(), "/spec/suspended", json!(true)));
    assert_eq!(
        asked.pointer("/spec/suspended"),
        Some(&json!(true)),
        "a set value is kept"
    );
}

/// `object` bound to node-a as the controller leaves a VM it suspended for idleness (SPEC 2.7):
/// `spec.suspended` false, the Suspended condition True with reason IdleSuspended.
fn idle(object: Value) -> Value {
    let conditions = json!([{"type": "Suspended", "status": "True", "reason": "IdleSuspended",
        "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z"}]);
    let object = with(
        object,
        "/spec/lifecycle",
        json!({"suspendAfterIdle": "5m", "wakeOnTraffic": true}),
    );
    let object = with(bound(object, "node-a"), "/status/phase", json!("Suspended"));
    with(object, "/status/conditions", conditions)
}

#[test]
fn v13_suspend() {
    let b = |o: Value| bound(o, "node-a");
    let suspended = || with(stored(), "/spec/suspended", json!(true));
    check(vec![
        case("v13_suspended_at_create_accepted", Create, None, suspended(), Allow),
        case(
            "v13_suspended_while_not_running_warns_nothing_to_save",
            Create,
            None,
            with(suspended(), "/spec/running", json!(false)),
            Warn(RuleId::V13),
        ),
        case(
            "v13_bound_suspend_accepted",
            Update,
            Some(b(stored())),
            b(suspended()),
            Allow,
        ),
        case(
            "v13_bound_resume_accepted",
            Update,
            Some(b(suspended())),
            b(stored()),
            Allow,
        ),
        case(
            "v13_cpu_resize_while_suspended_rejected",
            Update,
            Some(b(suspended())),
            b(with(suspended(), "/spec/resources/cpus", json!(2))),
            Reject(RuleId::V13, "spec.resources.cpus"),
        ),
        case(
            "v13_memory_resize_while_suspended_rejected",
            Update,
            Some(b(suspended())),
            b(with(suspended(), "/spec/resources/memoryMiB", json!(1024))),
            Reject(RuleId::V13, "spec.resources.memoryMiB"),
        ),
        case(
            "v13_resize_with_the_suspend_rejected",
            Update,
            Some(b(stored())),
            b(with(suspended(), "/spec/resources/cpus", json!(2))),
            Reject(RuleId::V13, "spec.resources.cpus"),
        ),
        case(
            "v13_resize_with_the_resume_rejected",
            Update,
            Some(b(suspended())),
            b(with(stored(), "/spec/resources/memoryMiB", json!(1024))),
            Reject(RuleId::V13, "spec.resources.memoryMiB"),
        ),
        case(
            "v13_storage_growth_while_suspended_accepted",
            Update,
            Some(b(suspended())),
            b(with(suspended(), "/spec/storage/storageGiB", json!(40))),
            Allow,
        ),
        case(
            "v13_unbound_resize_while_suspended_accepted",
            Update,
            Some(suspended()),
            with(suspended(), "/spec/resources/cpus", json!(2)),
            Allow,
        ),
        case(
            "v13_resize_while_suspended_for_idleness_rejected",
            Update,
            Some(idle(stored())),
            idle(with(stored(), "/spec/resources/cpus", json!(2))),
            Reject(RuleId::V13, "spec.resources.cpus"),
        ),
        case(
            "v13_storage_growth_while_suspended_for_idleness_accepted",
            Update,
            Some(idle(stored())),
            idle(with(stored(), "/spec/storage/storageGiB", json!(40))),
            Allow,
        ),
        case(
            "v13_resize_of_a_running_vm_that_may_sleep_accepted",
            Update,
            Some(b(with(stored(), "/spec/lifecycle", json!({"suspendAfterIdle": "5m"})))),
            b(with(
                with(stored(), "/spec/lifecycle", json!({"suspendAfterIdle": "5m"})),
                "/spec/resources/cpus",
                json!(2),
            )),
            Warn(RuleId::V6),
        ),
        case(
            "v13_resize_of_a_stopped_vm_that_asks_for_suspend_accepted",
            Update,
            Some(b(with(suspended(), "/spec/running", json!(false)))),
            b(with(
                with(suspended(), "/spec/running", json!(false)),
                "/spec/resources/cpus",
                json!(2),
            )),
            Warn(RuleId::V13),
        ),
    ]);
}

#[test]
fn v13_lists_every_violation_at_once_and_says_why() {
    let b = |o: Value| bound(o, "node-a");
    let suspended = with(stored(), "/spec/suspended", json!(true));
    let resized = with(
        with(suspended.clone(), "/spec/resources/cpus", json!(2)),
        "/spec/resources/memoryMiB",
        json!(2048),
    );
    // With an image change too: V6 and both V13 findings in one answer.
    let new = b(with(resized, "/spec/image", json!("alpine:3.20")));
    let case = case("all", Update, Some(b(suspended)), new, Allow);
    let verdict = run(&case, &Policy::default(), &nodes());
    let found: Vec<(RuleId, &str)> = verdict.violations.iter().map(|v| (v.rule, v.path.as_str())).collect();
    for want in [
        (RuleId::V6, "spec.image"),
        (RuleId::V13, "spec.resources.cpus"),
        (RuleId::V13, "spec.resources.memoryMiB"),
    ] {
        assert!(found.contains(&want), "{want:?} in {found:?}");
    }
    let cpus = verdict
        .violations
        .iter()
        .find(|v| v.path == "spec.resources.cpus")
        .expect("the cpus finding");
    let text = cpus.to_string();
    for part in ["2", "1 CPUs", "suspended", "resume it"] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
}
