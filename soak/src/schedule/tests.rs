//! The schedule's rules over many seeds and lengths, and the rule checker itself.

use super::*;

const SEEDS: std::ops::Range<u64> = 0..200;

fn minutes(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

fn default_run(seed: u64, length: Duration) -> Schedule {
    schedule(seed, length, &ScheduleParams::default()).expect("a schedule")
}

#[test]
fn the_same_seed_gives_the_same_schedule() {
    for seed in 0..50 {
        assert_eq!(
            default_run(seed, minutes(3)),
            default_run(seed, minutes(3)),
            "seed {seed}"
        );
    }
    let distinct: std::collections::BTreeSet<String> = SEEDS
        .map(|seed| format!("{:?}", default_run(seed, minutes(3)).faults))
        .collect();
    assert_eq!(distinct.len(), SEEDS.count(), "every seed its own schedule");
}

#[test]
fn every_kind_falls_in_the_default_run() {
    for seed in SEEDS {
        let schedule = default_run(seed, minutes(crate::DEFAULT_MINUTES.into()));
        for kind in FaultKind::ALL {
            assert!(
                schedule.count(kind) >= 1,
                "seed {seed}: no {kind}: {:?}",
                schedule.faults
            );
        }
    }
}

#[test]
fn the_rules_hold_for_many_seeds_and_lengths() {
    let params = ScheduleParams::default();
    for length in [3, 4, 7, 15, 60].map(minutes) {
        for seed in SEEDS {
            let schedule = default_run(seed, length);
            assert_eq!(
                schedule.rule_breaks(&params),
                Vec::<String>::new(),
                "seed {seed}, {length:?}"
            );
        }
    }
}

#[test]
fn smolvm_kills_fall_while_the_agent_runs() {
    let params = ScheduleParams::default();
    for length in [3, 15].map(minutes) {
        for seed in SEEDS {
            let schedule = default_run(seed, length);
            for fault in schedule.faults.iter().filter(|f| f.kind == FaultKind::Smolvm) {
                assert_eq!(
                    agent_down_at(fault, &schedule.faults, &params),
                    None,
                    "seed {seed}, {length:?}: {fault}"
                );
            }
        }
    }
}

#[test]
fn longer_runs_hold_more_faults() {
    let params = ScheduleParams::default();
    for seed in 0..20 {
        let counts: Vec<usize> = [3, 15, 60].map(|m| default_run(seed, minutes(m)).faults.len()).to_vec();
        assert_eq!(
            counts[0], 8,
            "seed {seed}: a 2-minute fault window holds one of each kind"
        );
        // One per 15 s of the window: 14 minutes hold 56, 59 minutes 236.
        assert_eq!(counts[1..], [56, 236], "seed {seed}");
        let long = default_run(seed, minutes(60));
        let control_plane = long.faults.iter().filter(|f| f.kind.is_control_plane()).count();
        assert!(control_plane > 2, "seed {seed}: restarts scale too");
        assert_eq!(long.rule_breaks(&params), Vec::<String>::new());
    }
}

#[test]
fn clock_faults_go_either_way_within_bounds() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in SEEDS {
        for fault in default_run(seed, minutes(3))
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::Clock)
        {
            let skew = fault.skew_minutes.expect("a clock fault has a skew");
            // Ahead: as drawn. Behind: past the run's age and the certificates' 5 minutes.
            let least_behind = i64::try_from((fault.at.as_secs() + 7 * 60).div_ceil(60)).expect("minutes");
            match skew.signum() {
                1 => assert!((2..=10).contains(&skew), "{fault}"),
                _ => assert!((least_behind..=least_behind.max(10)).contains(&-skew), "{fault}"),
            }
            seen.insert(skew.signum());
        }
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), [-1, 1]);
}

#[test]
fn what_cannot_be_scheduled_says_why() {
    let params = ScheduleParams::default();
    let topology = |f: fn(&mut Topology)| {
        let mut t = Topology::default();
        f(&mut t);
        ScheduleParams {
            topology: t,
            ..ScheduleParams::default()
        }
    };
    let cases: Vec<(&str, Duration, ScheduleParams, &str)> = vec![
        ("two minutes", minutes(2), params.clone(), "TooShort"),
        ("no window at all", Duration::from_secs(40), params.clone(), "TooShort"),
        (
            "no simulated node",
            minutes(3),
            topology(|t| t.nodes.retain(|r| *r != NodeRole::Simulated)),
            "NoTarget",
        ),
        (
            "no real smolvm",
            minutes(3),
            topology(|t| t.nodes.retain(|r| *r != NodeRole::Smolvm)),
            "NoTarget",
        ),
        (
            "one controller",
            minutes(3),
            topology(|t| t.controller_replicas = 1),
            "NoTarget",
        ),
        (
            "no webhook",
            minutes(3),
            topology(|t| t.webhook_replicas = 0),
            "NoTarget",
        ),
        (
            "only agents over the double",
            minutes(3),
            topology(|t| t.nodes = vec![NodeRole::Double, NodeRole::Simulated]),
            "NoTarget",
        ),
    ];
    for (name, length, params, reason) in cases {
        let error = schedule(1, length, &params).expect_err(name);
        assert_eq!(error.reason(), reason, "{name}: {error}");
    }
    let error = schedule(1, minutes(3), &topology(|t| t.nodes = vec![NodeRole::Smolvm])).expect_err("no partition");
    assert_eq!(
        error.to_string(),
        "no target for partition faults: no node of a role it falls on"
    );
}

fn fault(at: u64, kind: FaultKind, target: Target, duration: Option<u64>) -> Fault {
    Fault {
        at: Duration::from_secs(at),
        kind,
        target,
        duration: duration.map(Duration::from_secs),
        skew_minutes: (kind == FaultKind::Clock).then_some(-9),
    }
}

/// One of each kind, keeping every rule; each case changes one fault.
fn good() -> Vec<Fault> {
    vec![
        fault(30, FaultKind::Partition, Target::Node(2), Some(60)),
        fault(35, FaultKind::Etcd, Target::Only, Some(10)),
        fault(40, FaultKind::Controller, Target::Leader, None),
        fault(50, FaultKind::Clock, Target::Node(1), Some(60)),
        fault(60, FaultKind::Webhook, Target::Replica(1), None),
        fault(70, FaultKind::Apiserver, Target::Only, Some(5)),
        fault(80, FaultKind::Agent, Target::Node(1), None),
        fault(90, FaultKind::Smolvm, Target::Node(0), None),
    ]
}

#[test]
fn the_rule_checker_catches_each_rule() {
    let params = ScheduleParams::default();
    type Change = fn(&mut Vec<Fault>);
    let cases: [(&str, Change, &str); 15] = [
        ("kept", |_| {}, ""),
        (
            "a kind missing",
            |f| f.retain(|f| f.kind != FaultKind::Agent),
            "no agent fault",
        ),
        (
            "in the warm-up",
            |f| f[0].at = Duration::from_secs(29),
            "within the warm-up",
        ),
        (
            "into the cool-down",
            |f| f[3].at = Duration::from_secs(91),
            "not over before the cool-down",
        ),
        (
            "restarts too close",
            |f| f[5].at = Duration::from_secs(59),
            "within 15s of",
        ),
        (
            "restarts overlapping",
            |f| f[5].at = Duration::from_secs(40),
            "within 15s of",
        ),
        (
            "two cuts of one node",
            |f| f.push(fault(89, FaultKind::Partition, Target::Node(2), Some(1))),
            "overlaps",
        ),
        (
            "a kill on a simulated node's smolvm",
            |f| f[7].target = Target::Node(3),
            "cannot fall on",
        ),
        (
            "a third webhook",
            |f| f[4].target = Target::Replica(2),
            "cannot fall on",
        ),
        (
            "a kill that lasts",
            |f| f[2].duration = Some(Duration::from_secs(1)),
            "a duration where",
        ),
        ("out of order", |f| f.swap(1, 2), "out of order"),
        (
            "a clock not far enough behind",
            |f| f[3].skew_minutes = Some(-5),
            "not far enough behind",
        ),
        (
            "smolvm killed 10 s after its agent",
            |f| f[6].target = Target::Node(0),
            "while its agent is down",
        ),
        (
            "smolvm killed during a clock fault on its node",
            |f| f[3].target = Target::Node(0),
            "while its agent is down",
        ),
        (
            "smolvm killed as its agent restarts after a clock fault",
            |f| {
                f[3].target = Target::Node(0);
                f[3].at = Duration::from_secs(20);
                f.sort_by_key(|f| f.at);
            },
            "while its agent is down",
        ),
    ];
    for (name, change, expected) in cases {
        let mut faults = good();
        change(&mut faults);
        let breaks = Schedule {
            seed: 0,
            length: minutes(3),
            faults,
        }
        .rule_breaks(&params);
        if expected.is_empty() {
            assert_eq!(breaks, Vec::<String>::new(), "{name}");
        } else {
            assert!(breaks.iter().any(|b| b.contains(expected)), "{name}: {breaks:?}");
        }
    }
}

#[test]
fn faults_print_their_time_target_and_length() {
    let cases = [
        (
            fault(41, FaultKind::Controller, Target::Leader, None),
            "41.0s controller (leader)",
        ),
        (
            fault(50, FaultKind::Clock, Target::Node(1), Some(60)),
            "50.0s clock (node 1) for 60.0s, clock -9 min",
        ),
        (
            fault(35, FaultKind::Etcd, Target::Only, Some(4)),
            "35.0s etcd (the only instance) for 4.0s",
        ),
        (
            fault(60, FaultKind::Webhook, Target::Replica(1), None),
            "60.0s webhook (replica 1)",
        ),
    ];
    for (fault, expected) in cases {
        assert_eq!(fault.to_string(), expected);
    }
}
