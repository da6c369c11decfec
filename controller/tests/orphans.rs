//! Orphan machines: which machines no SmolVM owns, and the grace period before they go.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use smolvm_api::{
    nodeapi::{MachineState, MachineStatus, NetworkSpec, PortSpec},
    types::Protocol,
};
use smolvm_controller::{
    placement::{Ledger, gone_reservations, orphan_ledger_key},
    tasks::orphans::{Change, Tracker, find, request_of},
};

fn owned(pairs: &[(&str, &str)]) -> HashSet<(String, String)> {
    pairs.iter().map(|(n, m)| (n.to_string(), m.to_string())).collect()
}

fn reported(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(n, ms)| (n.to_string(), ms.iter().map(|m| m.to_string()).collect()))
        .collect()
}

#[test]
fn orphans_are_operator_machines_no_smolvm_bound_there_owns() {
    let cases = [
        (
            "all owned",
            reported(&[("a", &["svm-1", "svm-2"])]),
            owned(&[("a", "svm-1"), ("a", "svm-2")]),
            reported(&[]),
        ),
        (
            "force-deleted VM's machine",
            reported(&[("a", &["svm-1", "svm-gone"])]),
            owned(&[("a", "svm-1")]),
            reported(&[("a", &["svm-gone"])]),
        ),
        (
            "not the operator's: never touched",
            reported(&[("a", &["build-cache", "svm-1"])]),
            owned(&[("a", "svm-1")]),
            reported(&[]),
        ),
        // The VM is bound elsewhere: this copy is nobody's.
        (
            "owned on another node only",
            reported(&[("b", &["svm-1"])]),
            owned(&[("a", "svm-1")]),
            reported(&[("b", &["svm-1"])]),
        ),
        ("empty list", reported(&[("a", &[])]), owned(&[]), reported(&[])),
    ];
    for (name, reported, owned, expected) in cases {
        assert_eq!(find(&reported, &owned), expected, "{name}");
    }
}

#[test]
fn an_orphan_is_found_once_due_after_the_grace_period_and_released_when_gone() {
    let t0 = Timestamp::from_second(1_800_000_000).unwrap();
    let grace = SignedDuration::from_secs(600);
    let at = |s: i64| t0 + SignedDuration::from_secs(s);
    let known: HashSet<String> = ["a".to_string()].into();
    let orphan = reported(&[("a", &["svm-gone"])]);
    let change = |kind: fn(String, String) -> Change| kind("a".into(), "svm-gone".into());
    let found = |node, machine| Change::Found { node, machine };
    let due = |node, machine| Change::Due { node, machine };
    let gone = |node, machine| Change::Gone { node, machine };
    let mut t = Tracker::default();
    assert_eq!(t.observe(&orphan, &known, at(0), grace), vec![change(found)]);
    assert_eq!(
        t.observe(&orphan, &known, at(300), grace),
        vec![],
        "within the grace period"
    );
    assert_eq!(t.per_node().get("a"), Some(&1));
    assert_eq!(t.observe(&orphan, &known, at(600), grace), vec![change(due)]);
    assert_eq!(
        t.observe(&orphan, &known, at(630), grace),
        vec![change(due)],
        "a failed delete is retried"
    );
    // The node's list is unknown this pass (its agent is away): nothing changes.
    assert_eq!(
        t.observe(&reported(&[]), &HashSet::new(), at(640), grace),
        Vec::<Change>::new()
    );
    assert_eq!(t.observe(&reported(&[]), &known, at(660), grace), vec![change(gone)]);
    assert_eq!(t.per_node().get("a"), None);
    // A SmolVM that owns it again (its UID came back) ends the orphanhood early, with no delete.
    let mut t = Tracker::default();
    t.observe(&orphan, &known, at(0), grace);
    assert_eq!(
        t.observe(&reported(&[("a", &[])]), &known, at(10), grace),
        vec![change(gone)]
    );
}

#[test]
fn an_orphan_holds_its_resources_and_ports_in_placement() {
    let machine = MachineStatus {
        name: "svm-gone".into(),
        state: MachineState::Running,
        runtime_state: "running".into(),
        image: None,
        cpus: 2,
        memory_mib: 2048,
        storage_gib: Some(5),
        overlay_gib: Some(2),
        network: NetworkSpec {
            enabled: true,
            ports: vec![PortSpec {
                host_port: 8080,
                guest_port: 80,
                protocol: Protocol::Tcp,
            }],
            allowed_cidrs: vec![],
            allowed_hosts: vec![],
        },
        pid: None,
        suspended: None,
        pool: None,
        volumes: None,
    };
    let request = request_of(&machine);
    assert_eq!(
        (
            request.resources.cpus,
            request.resources.memory_mib,
            request.resources.storage_gib
        ),
        (2, 2048, 7)
    );
    assert_eq!(request.host_ports, vec![(8080, Protocol::Tcp)]);
    let ledger = Ledger::new();
    let key = orphan_ledger_key("a", "svm-gone");
    ledger.observe_bound(&key, "a", &request);
    assert_eq!(ledger.usage("a").used.cpus, 2);
    // The pruning of gone SmolVMs leaves orphan bookings to the collector.
    let reserved = ledger.reserved_uids();
    assert_eq!(gone_reservations(&reserved, &HashSet::new()), Vec::<String>::new());
}
