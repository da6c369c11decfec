//! Each invariant fed histories that break it and histories that keep it, one table.

use super::*;
use crate::history::Resources;

fn at(secs: u64, event: Event) -> Observation {
    Observation::new(Duration::from_secs(secs), event)
}

/// SmolVM `uid` (named `vm-<uid>` in soak-a), bound to node-0, Running, its finalizer on;
/// `change` makes it what the case needs.
fn vm(uid: &str, change: impl FnOnce(&mut VmSeen)) -> Event {
    let mut seen = VmSeen {
        uid: uid.into(),
        vm: name(uid),
        node_name: Some("node-0".into()),
        node_uid: Some("n0".into()),
        phase: Some(Phase::Running),
        reason: None,
        finalizers: vec![FINALIZER.into()],
        deletion_requested: false,
        force_delete: false,
        saved_state: false,
        running: true,
        suspended: false,
    };
    change(&mut seen);
    Event::Vm(seen)
}

fn name(uid: &str) -> VmRef {
    VmRef::new("soak-a", format!("vm-{uid}"))
}

fn gone(uid: &str) -> Event {
    Event::VmGone {
        uid: uid.into(),
        vm: name(uid),
    }
}

fn deleting(seen: &mut VmSeen) {
    seen.deletion_requested = true;
    seen.phase = Some(Phase::Deleting);
}

fn finalizer_gone(seen: &mut VmSeen) {
    deleting(seen);
    seen.finalizers.clear();
}

fn suspended(seen: &mut VmSeen) {
    seen.suspended = true;
    seen.saved_state = true;
    seen.phase = Some(Phase::Suspended);
}

fn machines(node: &str, names: &[&str]) -> Event {
    Event::Machines {
        node: node.into(),
        machines: names.iter().map(|m| m.to_string()).collect(),
    }
}

fn node(name: &str, reachable: bool, ledger: Option<Resources>, reported: Option<Resources>) -> Event {
    let allocatable = Resources {
        cpus: 4,
        memory_mib: 4096,
        storage_mib: 10240,
    };
    Event::Node(NodeSeen {
        node: name.into(),
        reachable,
        allocatable,
        ledger,
        reported,
        booked_by: Vec::new(),
    })
}

fn booked(cpus: u64, memory_mib: u64, storage_mib: u64) -> Option<Resources> {
    Some(Resources {
        cpus,
        memory_mib,
        storage_mib,
    })
}

fn ack(seq: u32, kind: OpKind, uid: &str, expect: Outcome) -> Event {
    Event::Ack(Ack {
        seq,
        kind,
        vm: name(uid),
        expect,
        uid: None,
    })
}

fn create(uid: &str) -> Event {
    ack(1, OpKind::Create, uid, Outcome::Running)
}

fn fault(kind: FaultKind, target: Target) -> Event {
    Event::Fault { kind, target }
}

/// Name, the invariants the history breaks (none: it keeps them all), the history.
type Case = (&'static str, Vec<Invariant>, Vec<Observation>);

fn binding_cases() -> Vec<Case> {
    use Invariant::BindingNeverChanges as I;
    let unbound = |s: &mut VmSeen| {
        s.node_name = None;
        s.node_uid = None;
        s.phase = Some(Phase::Pending);
    };
    vec![
        (
            "bound once, kept",
            vec![],
            vec![at(1, vm("a", unbound)), at(2, vm("a", |_| {})), at(3, vm("a", |_| {}))],
        ),
        (
            "moved to another node",
            vec![I],
            vec![
                at(1, vm("a", |_| {})),
                at(2, vm("a", |s| s.node_name = Some("node-1".into()))),
            ],
        ),
        (
            "cleared",
            vec![I],
            vec![at(1, vm("a", |_| {})), at(2, vm("a", unbound))],
        ),
        (
            "a replaced node adopted",
            vec![I],
            vec![
                at(1, vm("a", |_| {})),
                at(2, vm("a", |s| s.node_uid = Some("n9".into()))),
            ],
        ),
    ]
}

fn capacity_cases() -> Vec<Case> {
    use Invariant::{LedgerWithinAllocatable as L, ReportWithinAllocatable as R};
    vec![
        (
            "full to the brim",
            vec![],
            vec![at(
                1,
                node("node-0", true, booked(4, 4096, 10240), booked(4, 4096, 10240)),
            )],
        ),
        (
            "the ledger over-commits CPU",
            vec![L],
            vec![at(1, node("node-0", true, booked(5, 1024, 0), booked(2, 1024, 0)))],
        ),
        (
            "the ledger over-commits storage",
            vec![L],
            vec![at(1, node("node-0", true, booked(1, 1, 10241), None))],
        ),
        (
            "the node runs more memory",
            vec![R],
            vec![at(1, node("node-0", true, booked(2, 4096, 0), booked(2, 4097, 0)))],
        ),
        (
            "an over-commit seen twice, then gone, then again: two violations",
            vec![L, L],
            vec![
                at(1, node("node-0", true, booked(5, 0, 0), None)),
                at(2, node("node-0", true, booked(5, 0, 0), None)),
                at(3, node("node-0", true, booked(4, 0, 0), None)),
                at(4, node("node-0", true, booked(6, 0, 0), None)),
            ],
        ),
    ]
}

fn orphan_cases() -> Vec<Case> {
    use Invariant::NoOrphanBeyondGrace as I;
    let orphan = |times: &[u64]| {
        times
            .iter()
            .map(|t| at(*t, machines("node-0", &["svm-x"])))
            .collect::<Vec<_>>()
    };
    vec![
        (
            "its SmolVM lives",
            vec![],
            vec![
                at(1, vm("a", |_| {})),
                at(2, machines("node-0", &["svm-a"])),
                at(900, machines("node-0", &["svm-a"])),
            ],
        ),
        ("an orphan within the grace", vec![], orphan(&[100, 650, 700])),
        ("an orphan beyond the grace", vec![I], orphan(&[100, 400, 701, 800])),
        (
            "an orphan that went and came back: the grace starts again",
            vec![],
            [
                orphan(&[100]),
                vec![at(300, machines("node-0", &[]))],
                orphan(&[650, 1000]),
            ]
            .concat(),
        ),
        (
            "listed before its SmolVM was seen",
            vec![],
            vec![
                at(1, machines("node-0", &["svm-a"])),
                at(5, vm("a", |_| {})),
                at(700, machines("node-0", &["svm-a"])),
            ],
        ),
        (
            "left behind by a deleted SmolVM",
            vec![I],
            vec![
                at(1, vm("a", |_| {})),
                at(2, gone("a")),
                at(3, machines("node-1", &["svm-a"])),
                at(604, machines("node-1", &["svm-a"])),
            ],
        ),
        (
            "not a SmolVM's machine",
            vec![],
            vec![
                at(1, machines("node-0", &["pool-src"])),
                at(900, machines("node-0", &["pool-src"])),
            ],
        ),
    ]
}

fn finalizer_cases() -> Vec<Case> {
    use Invariant::FinalizerAfterMachineGone as I;
    vec![
        (
            "the node confirmed, then the finalizer went",
            vec![],
            vec![
                at(1, vm("a", |_| {})),
                at(2, machines("node-0", &["svm-a"])),
                at(3, vm("a", deleting)),
                at(4, machines("node-0", &[])),
                at(5, vm("a", finalizer_gone)),
                at(6, gone("a")),
                at(7, machines("node-0", &[])),
            ],
        ),
        (
            "the machine listed after the finalizer went",
            vec![I],
            vec![
                at(1, vm("a", |_| {})),
                at(3, vm("a", deleting)),
                at(5, gone("a")),
                at(6, machines("node-0", &["svm-a"])),
            ],
        ),
        (
            "seen without its finalizer while deleting, the machine still there",
            vec![I],
            vec![
                at(1, vm("a", |_| {})),
                at(5, vm("a", finalizer_gone)),
                at(6, machines("node-0", &["svm-a"])),
            ],
        ),
        (
            "a listing asked for before the finalizer went",
            vec![],
            vec![
                at(1, vm("a", |_| {})),
                at(5, machines("node-0", &["svm-a"])),
                at(5, gone("a")),
            ],
        ),
        (
            "forced while the node was unreachable",
            vec![],
            vec![
                at(1, vm("a", |_| {})),
                at(2, node("node-0", false, None, None)),
                at(
                    3,
                    vm("a", |s| {
                        deleting(s);
                        s.force_delete = true;
                    }),
                ),
                at(4, gone("a")),
                at(70, node("node-0", true, None, None)),
                at(71, machines("node-0", &["svm-a"])),
            ],
        ),
        (
            "forced while the node answered",
            vec![I],
            vec![
                at(1, vm("a", |_| {})),
                at(2, node("node-0", true, None, None)),
                at(
                    3,
                    vm("a", |s| {
                        deleting(s);
                        s.force_delete = true;
                    }),
                ),
                at(4, gone("a")),
                at(5, machines("node-0", &["svm-a"])),
            ],
        ),
    ]
}

fn saved_state_cases() -> Vec<Case> {
    use Invariant::SavedStateKept as I;
    let then = |change: fn(&mut VmSeen)| {
        vec![
            at(1, vm("a", suspended)),
            at(
                2,
                vm("a", |s| {
                    suspended(s);
                    change(s);
                }),
            ),
            at(
                3,
                vm("a", |s| {
                    suspended(s);
                    change(s);
                    s.saved_state = false;
                }),
            ),
        ]
    };
    vec![
        ("kept while suspended", vec![], then(|_| {})[..2].to_vec()),
        ("discarded after running: false", vec![], then(|s| s.running = false)),
        ("consumed by a resume", vec![], then(|s| s.suspended = false)),
        ("discarded with the deletion", vec![], then(deleting)),
        ("discarded at expiry", vec![], then(|s| s.reason = Some(EXPIRED.into()))),
        (
            "discarded between the generator's stop and start, which a re-list after a restart never showed",
            vec![],
            vec![
                at(1, vm("a", suspended)),
                at(2, ack(5, OpKind::Stop, "a", Outcome::Stopped)),
                at(12, ack(9, OpKind::Start, "a", Outcome::Suspended)),
                at(
                    20,
                    vm("a", |s| {
                        suspended(s);
                        s.saved_state = false;
                    }),
                ),
            ],
        ),
        (
            "discarded while still suspended",
            vec![I],
            then(|s| s.phase = Some(Phase::Running)),
        ),
        (
            "discarded by a restart",
            vec![I],
            vec![at(1, vm("a", suspended)), at(9, vm("a", |s| s.suspended = true))],
        ),
    ]
}

fn outcome_cases() -> Vec<Case> {
    use Invariant::EndsAsExpected as E;
    let failed = |s: &mut VmSeen| {
        s.phase = Some(Phase::Failed);
        s.reason = Some(START_FAILED.into());
    };
    vec![
        (
            "created, Running",
            vec![],
            vec![at(1, create("a")), at(9, vm("a", |_| {}))],
        ),
        (
            "created where no guest boots, StartFailed",
            vec![],
            vec![
                at(1, ack(1, OpKind::Create, "a", Outcome::StartFailed)),
                at(9, vm("a", failed)),
            ],
        ),
        (
            "created, unplaced with a reason",
            vec![],
            vec![
                at(1, create("a")),
                at(
                    9,
                    vm("a", |s| {
                        s.phase = Some(Phase::Pending);
                        s.reason = Some("Unschedulable".into());
                    }),
                ),
            ],
        ),
        (
            "created, stuck Creating, no reason",
            vec![E],
            vec![at(1, create("a")), at(9, vm("a", |s| s.phase = Some(Phase::Creating)))],
        ),
        (
            "suspended, ends Running with no reason",
            vec![E],
            vec![
                at(1, create("a")),
                at(2, ack(4, OpKind::Suspend, "a", Outcome::Suspended)),
                at(9, vm("a", |_| {})),
            ],
        ),
        (
            "deleted and gone",
            vec![],
            vec![
                at(1, create("a")),
                at(2, vm("a", |_| {})),
                at(3, ack(7, OpKind::Delete, "a", Outcome::Gone)),
                at(9, gone("a")),
            ],
        ),
        (
            "deleted, blocked with a reason",
            vec![],
            vec![
                at(1, create("a")),
                at(3, ack(7, OpKind::Delete, "a", Outcome::Gone)),
                at(
                    9,
                    vm("a", |s| {
                        deleting(s);
                        s.reason = Some("DeletionBlocked".into());
                    }),
                ),
            ],
        ),
        (
            "deleted, still Deleting with no reason",
            vec![E],
            vec![
                at(1, create("a")),
                at(3, ack(7, OpKind::Delete, "a", Outcome::Gone)),
                at(9, vm("a", deleting)),
            ],
        ),
    ]
}

fn write_cases() -> Vec<Case> {
    use Invariant::NoWriteLost as W;
    vec![
        (
            "a claim that still exists",
            vec![],
            vec![
                at(1, ack(2, OpKind::Claim, "c", Outcome::Running)),
                at(2, vm("c", |_| {})),
            ],
        ),
        (
            "a create that vanished",
            vec![W],
            vec![at(1, create("a")), at(2, vm("a", |_| {})), at(3, gone("a"))],
        ),
        ("a create never seen", vec![W], vec![at(1, create("a"))]),
        (
            "created and deleted by the generator",
            vec![],
            vec![
                at(1, create("a")),
                at(2, ack(3, OpKind::Delete, "a", Outcome::Gone)),
                at(3, gone("a")),
            ],
        ),
    ]
}

/// Every table, one case after another.
fn all_cases() -> Vec<Case> {
    [
        binding_cases(),
        capacity_cases(),
        orphan_cases(),
        finalizer_cases(),
        saved_state_cases(),
        outcome_cases(),
        write_cases(),
    ]
    .concat()
}

#[test]
fn each_invariant_broken_and_kept() {
    let mut broken = BTreeSet::new();
    for (name, expected, history) in all_cases() {
        let got: Vec<Invariant> = check(Config::default(), CheckParams::default(), &history)
            .iter()
            .map(|v| v.invariant)
            .collect();
        assert_eq!(got, expected, "{name}");
        broken.extend(expected);
    }
    assert_eq!(
        broken.into_iter().collect::<Vec<_>>(),
        Invariant::ALL,
        "every invariant has a history that breaks it"
    );
}

#[test]
fn incremental_and_whole_agree() {
    for (name, _, history) in all_cases() {
        let mut checker = Checker::new(Config::default(), CheckParams::default());
        let mut seen: Vec<Violation> = history.iter().flat_map(|o| checker.observe(o)).collect();
        for v in &seen {
            assert!(
                history.iter().any(|o| o.at == v.at),
                "{name}: reported at an observation's time"
            );
        }
        let all = checker.finish();
        // The end adds what only it shows; what was reported along the way comes first, in order.
        let mut along: Vec<Violation> = all.iter().take(seen.len()).cloned().collect();
        for v in along.iter_mut().chain(seen.iter_mut()) {
            v.faults.clear();
        }
        assert_eq!(along, seen, "{name}");
    }
}

#[test]
fn a_violation_names_object_invariant_faults_and_seed() {
    let config = Config { minutes: 15, seed: 7 };
    let history = [
        at(5, fault(FaultKind::Clock, Target::Node(1))),
        at(30, fault(FaultKind::Etcd, Target::Only)),
        at(40, vm("a", |_| {})),
        at(70, vm("a", |s| s.node_name = Some("node-1".into()))),
        at(100, fault(FaultKind::Controller, Target::Leader)),
        at(131, fault(FaultKind::Webhook, Target::Replica(0))),
    ];
    let mut checker = Checker::new(config, CheckParams::default());
    let along: Vec<Violation> = history.iter().flat_map(|o| checker.observe(o)).collect();
    // Along the way only the faults before it are known; at the end, those after it too.
    assert_eq!(along.len(), 1);
    assert_eq!(
        along[0].faults.iter().map(|f| f.kind).collect::<Vec<_>>(),
        [FaultKind::Etcd]
    );
    let all = checker.finish();
    assert_eq!(all.len(), 1);
    let v = &all[0];
    assert_eq!(
        (v.invariant.id(), v.object.as_str(), v.config.seed),
        ("binding-never-changes", "smolvm soak-a/vm-a (uid a)", 7)
    );
    assert_eq!(
        v.to_string(),
        "violation of binding-never-changes at 70.0s: smolvm soak-a/vm-a (uid a): binding node-0 (uid n0) became node-1 (uid n0); \
         faults around it: etcd (the only instance) at 30.0s, controller (leader) at 100.0s; \
         seed 7, reproduce with SOAK_MINUTES=15 SOAK_SEED=7 make soak"
    );
}

#[test]
fn invariant_ids_are_stable_and_distinct() {
    let ids: Vec<&str> = Invariant::ALL.iter().map(|i| i.id()).collect();
    assert_eq!(
        ids,
        [
            "binding-never-changes",
            "ledger-within-allocatable",
            "node-report-within-allocatable",
            "no-orphan-beyond-grace",
            "finalizer-after-machine-gone",
            "saved-state-kept",
            "ends-as-expected",
            "no-write-lost",
        ]
    );
}

#[test]
fn a_recorded_history_checks_the_same_after_json_lines() {
    let history: Vec<Observation> = finalizer_cases().into_iter().flat_map(|(_, _, h)| h).collect();
    let text: String = history.iter().map(|o| o.to_json_line().expect("json") + "\n").collect();
    let parsed = crate::history::parse(&text).expect("parse");
    assert_eq!(
        check(Config::default(), CheckParams::default(), &parsed),
        check(Config::default(), CheckParams::default(), &history)
    );
}
