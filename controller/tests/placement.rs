//! Placement tables (capacity, host ports, selectors, pins, cordons, stale heartbeats, ties) and the
//! concurrency guarantee: concurrent placements never over-commit a node.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};
use smolvm_api::{NodeResources, Protocol, SmolVMNode, fixtures};
use smolvm_controller::placement::{
    Config, Hold, Ledger, NodeTracker, Request, Usage, check_node, gone_reservations, node_fingerprint, place,
    saved_state_gib,
};

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn node(name: &str, cpus: i64, memory_mib: i64) -> SmolVMNode {
    let resources = NodeResources {
        cpus,
        memory_mib,
        storage_gib: 4000,
    };
    fixtures::ready_node(name, resources, now() - SignedDuration::from_secs(5))
}

fn request(cpus: i64, memory_mib: i64) -> Request {
    Request {
        resources: NodeResources {
            cpus,
            memory_mib,
            storage_gib: 30,
        },
        host_ports: vec![],
        node_selector: BTreeMap::new(),
        pin: None,
        source: None,
        volumes: Vec::new(),
    }
}

fn edit(mut n: SmolVMNode, f: impl FnOnce(&mut SmolVMNode)) -> SmolVMNode {
    f(&mut n);
    n
}

#[test]
fn eligibility_table() {
    let cfg = Config::default();
    let mut used = Usage {
        used: NodeResources {
            cpus: 7,
            memory_mib: 1024,
            storage_gib: 0,
        },
        ..Usage::default()
    };
    used.ports.insert((8080, Protocol::Tcp), 1);
    let with_port = Request {
        host_ports: vec![(8080, Protocol::Tcp)],
        ..request(1, 512)
    };
    let udp_port = Request {
        host_ports: vec![(8080, Protocol::Udp)],
        ..request(1, 512)
    };
    let selector = |k: &str, v: &str| Request {
        node_selector: BTreeMap::from([(k.to_string(), v.to_string())]),
        ..request(1, 512)
    };
    type Case<'a> = (&'a str, SmolVMNode, Request, Option<&'a Usage>, Option<&'a str>);
    let cases: Vec<Case> = vec![
        ("fits", node("a", 8, 8192), request(1, 512), None, None),
        ("exactly_fits", node("a", 8, 8192), request(8, 8192), None, None),
        (
            "insufficient_cpu",
            node("a", 8, 8192),
            request(9, 512),
            None,
            Some("InsufficientCpu"),
        ),
        (
            "insufficient_memory",
            node("a", 8, 8192),
            request(1, 9000),
            None,
            Some("InsufficientMemory"),
        ),
        (
            "insufficient_disk",
            node("a", 8, 8192),
            Request {
                resources: NodeResources {
                    cpus: 1,
                    memory_mib: 1,
                    storage_gib: 5000,
                },
                ..request(1, 1)
            },
            None,
            Some("InsufficientStorage"),
        ),
        (
            "used_capacity_counts",
            node("a", 8, 8192),
            request(2, 512),
            Some(&used),
            Some("InsufficientCpu"),
        ),
        (
            "host_port_taken",
            node("a", 8, 8192),
            with_port,
            Some(&used),
            Some("HostPortConflict"),
        ),
        ("other_protocol_free", node("a", 8, 8192), udp_port, Some(&used), None),
        (
            "selector_matches",
            node("a", 8, 8192),
            selector("kubernetes.io/arch", "amd64"),
            None,
            None,
        ),
        (
            "selector_mismatch",
            node("a", 8, 8192),
            selector("kubernetes.io/arch", "arm64"),
            None,
            Some("SelectorMismatch"),
        ),
        (
            "cordoned",
            edit(node("a", 8, 8192), |n| n.spec.unschedulable = Some(true)),
            request(1, 1),
            None,
            Some("Cordoned"),
        ),
        (
            "not_ready",
            edit(node("a", 8, 8192), |n| {
                n.status.as_mut().unwrap().conditions[0].status = "False".into()
            }),
            request(1, 1),
            None,
            Some("NotReady"),
        ),
        (
            "stale_heartbeat",
            edit(node("a", 8, 8192), |n| {
                n.status.as_mut().unwrap().heartbeat_time = Some(Time(now() - SignedDuration::from_secs(120)))
            }),
            request(1, 1),
            None,
            Some("StaleHeartbeat"),
        ),
        (
            "no_heartbeat",
            edit(node("a", 8, 8192), |n| n.status.as_mut().unwrap().heartbeat_time = None),
            request(1, 1),
            None,
            Some("StaleHeartbeat"),
        ),
        (
            "protocol_mismatch",
            edit(node("a", 8, 8192), |n| {
                n.status.as_mut().unwrap().protocol_version = Some("v0".into())
            }),
            request(1, 1),
            None,
            Some("ProtocolMismatch"),
        ),
        (
            "guest_boot_failed",
            guest_bootable(node("a", 8, 8192), "False", "CanaryFailed"),
            request(1, 1),
            None,
            Some("CannotBootGuests"),
        ),
        (
            "guest_boot_pending",
            guest_bootable(node("a", 8, 8192), "Unknown", "CanaryPending"),
            request(1, 1),
            None,
            Some("GuestBootPending"),
        ),
        (
            "guest_booted",
            guest_bootable(node("a", 8, 8192), "True", "CanaryBooted"),
            request(1, 1),
            None,
            None,
        ),
        (
            "no_endpoint",
            edit(node("a", 8, 8192), |n| n.status.as_mut().unwrap().endpoint = None),
            request(1, 1),
            None,
            Some("NotReported"),
        ),
        (
            "no_status",
            edit(node("a", 8, 8192), |n| n.status = None),
            request(1, 1),
            None,
            Some("NotReported"),
        ),
    ];
    for (name, node, req, usage, expected) in cases {
        let got = check_node(&node, &req, usage, now(), &cfg).map(|i| i.reason());
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn placement_table() {
    let cfg = Config::default();
    let empty: HashMap<String, Usage> = HashMap::new();
    let nodes = vec![node("b", 8, 8192), node("a", 8, 8192), node("c", 4, 4096)];
    // Ties break by name: a and b are equal and emptier than c.
    assert_eq!(
        place(&request(1, 512), &nodes, &empty, now(), &cfg)
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("a")
    );
    // Least allocated: with a half full, b wins.
    let mut usage = HashMap::new();
    usage.insert(
        "a".to_string(),
        Usage {
            used: NodeResources {
                cpus: 4,
                memory_mib: 4096,
                storage_gib: 0,
            },
            ..Usage::default()
        },
    );
    assert_eq!(
        place(&request(1, 512), &nodes, &usage, now(), &cfg)
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("b")
    );
    // A pin goes only to its pin, even when others are emptier.
    let pinned = Request {
        pin: Some("c".into()),
        ..request(1, 512)
    };
    assert_eq!(
        place(&pinned, &nodes, &empty, now(), &cfg)
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("c")
    );
    // A pin never falls back.
    let pinned_too_big = Request {
        pin: Some("c".into()),
        ..request(6, 512)
    };
    let err = place(&pinned_too_big, &nodes, &empty, now(), &cfg).unwrap_err();
    assert_eq!(err.reason, "PinnedNodeIneligible");
    assert_eq!(
        err.message,
        "pinned node c cannot run this VM now: 1 has too few CPUs (needs 6, 4 free)"
    );
    // A branch goes only to its source's node, even when others are emptier, and never falls
    // back; when that node is full it says so, naming the node and the source.
    let branch = |cpus| Request {
        pin: Some("c".into()),
        source: Some("prepared".into()),
        ..request(cpus, 512)
    };
    assert_eq!(
        place(&branch(1), &nodes, &empty, now(), &cfg)
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("c")
    );
    let err = place(&branch(6), &nodes, &empty, now(), &cfg).unwrap_err();
    assert_eq!(err.reason, "SourceNodeIneligible");
    assert_eq!(
        err.message,
        "node c of its branch source prepared cannot run this branch now (branches are node-local): 1 has too few CPUs (needs 6, 4 free)"
    );
    let ghost = Request {
        pin: Some("ghost".into()),
        ..request(1, 512)
    };
    assert_eq!(
        place(&ghost, &nodes, &empty, now(), &cfg).unwrap_err().reason,
        "PinnedNodeUnknown"
    );
    // Nothing fits: the message counts the reasons.
    let err = place(&request(16, 512), &nodes, &empty, now(), &cfg).unwrap_err();
    assert_eq!(err.reason, "NoEligibleNode");
    assert_eq!(
        err.message,
        "0/3 nodes can run this VM: 3 have too few CPUs (needs 16, at most 8 free)"
    );
    let none: Vec<SmolVMNode> = vec![];
    assert_eq!(
        place(&request(1, 1), &none, &empty, now(), &cfg).unwrap_err().reason,
        "NoNodes"
    );
    // Deterministic: the same input gives the same node whatever the order.
    let reversed: Vec<SmolVMNode> = nodes.iter().rev().cloned().collect();
    assert_eq!(
        place(&request(1, 512), &reversed, &empty, now(), &cfg)
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("a")
    );
}

#[test]
fn ledger_reservations_and_release() {
    let cfg = Config::default();
    let ledger = Ledger::new();
    let nodes = vec![node("a", 2, 2048)];
    let vm = Request {
        host_ports: vec![(8080, Protocol::Tcp)],
        ..request(1, 1024)
    };
    assert_eq!(
        ledger.place_and_reserve("uid-1", &vm, &nodes, now(), &cfg).unwrap(),
        "a"
    );
    // Retrying the same VM returns the same node without reserving twice.
    assert_eq!(
        ledger.place_and_reserve("uid-1", &vm, &nodes, now(), &cfg).unwrap(),
        "a"
    );
    assert_eq!(ledger.usage("a").used.cpus, 1);
    // The port is taken for another VM.
    let err = ledger.place_and_reserve("uid-2", &vm, &nodes, now(), &cfg).unwrap_err();
    assert!(err.message.contains("host port taken"), "{}", err.message);
    ledger.release("uid-1");
    assert_eq!(ledger.usage("a"), Usage::default());
    assert_eq!(
        ledger.place_and_reserve("uid-2", &vm, &nodes, now(), &cfg).unwrap(),
        "a"
    );
    // Seeding from the cache is idempotent.
    ledger.observe_bound("uid-2", "a", &vm);
    ledger.observe_bound("uid-3", "a", &request(1, 512));
    assert_eq!(ledger.usage("a").used.cpus, 2);
    assert_eq!(ledger.node_of("uid-3").as_deref(), Some("a"));
}

#[test]
fn concurrent_placements_never_over_commit() {
    // 100 VMs placed concurrently on 2 nodes with room for 50 each: exactly 50 go on each.
    let cfg = Config::default();
    let ledger = Arc::new(Ledger::new());
    let nodes = Arc::new(vec![node("node-1", 50, 50 * 512), node("node-2", 50, 50 * 512)]);
    let handles: Vec<_> = (0..100)
        .map(|i| {
            let ledger = ledger.clone();
            let nodes = nodes.clone();
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                ledger
                    .place_and_reserve(&format!("uid-{i}"), &request(1, 512), nodes.iter(), now(), &cfg)
                    .unwrap()
            })
        })
        .collect();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for h in handles {
        *counts.entry(h.join().unwrap()).or_default() += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([("node-1".to_string(), 50), ("node-2".to_string(), 50)])
    );
    // The 101st has nowhere to go.
    let err = ledger
        .place_and_reserve("uid-100", &request(1, 512), nodes.iter(), now(), &cfg)
        .unwrap_err();
    assert_eq!(err.reason, "NoEligibleNode");
    for n in ["node-1", "node-2"] {
        let usage = ledger.usage(n);
        assert_eq!(usage.used.cpus, 50, "{n}");
        assert_eq!(usage.used.memory_mib, 50 * 512, "{n}");
    }
}

#[test]
fn ledger_records_a_resize_of_a_bound_vm() {
    let ledger = Ledger::new();
    ledger.observe_bound("vm-1", "a", &request(2, 1024));
    ledger.observe_bound("vm-2", "a", &request(1, 512));
    assert_eq!(ledger.usage("a").used.cpus, 3);
    // Same node, same request: idempotent.
    ledger.observe_bound("vm-1", "a", &request(2, 1024));
    assert_eq!(ledger.usage("a").used.cpus, 3);
    // Same node, a changed request (rule V6): the new reservation replaces the old one.
    ledger.observe_bound("vm-1", "a", &request(4, 4096));
    let used = ledger.usage("a").used;
    assert_eq!((used.cpus, used.memory_mib, used.storage_gib), (5, 4608, 60));
    // Shrinking is recorded too.
    ledger.observe_bound("vm-1", "a", &request(1, 256));
    assert_eq!(ledger.usage("a").used.cpus, 2);
    // What the others hold, for the room a resize may grow into.
    let others = ledger.used_by_others("a", "vm-1");
    assert_eq!((others.cpus, others.memory_mib, others.storage_gib), (1, 512, 30));
    assert_eq!(ledger.used_by_others("a", "vm-9").cpus, 2, "a VM holding nothing there");
    assert_eq!(ledger.used_by_others("b", "vm-1").cpus, 0, "another node");
}

/// Suspend (SPEC 2.3): a suspended VM gives its CPU and memory back to its node and keeps its
/// disks, its saved memory (counted as disk) and its host ports; a resume takes them back only
/// where the node has room, atomically, and another VM can be placed in the room meanwhile.
#[test]
fn a_suspended_vm_gives_back_cpu_and_memory_and_keeps_disk_and_ports() {
    assert_eq!(
        [
            saved_state_gib(0),
            saved_state_gib(1),
            saved_state_gib(1024),
            saved_state_gib(1536)
        ],
        [0, 1, 1, 2]
    );
    let node_a = node("a", 4, 4096);
    let cfg = Config::default();
    let ledger = Ledger::new();
    let mut suspended = request(4, 4096);
    suspended.host_ports = vec![(8080, Protocol::Tcp)];
    ledger.observe_bound("sleeper", "a", &suspended);
    // Full: nothing else fits.
    assert!(
        ledger
            .place_and_reserve("late", &request(1, 512), [&node_a], now(), &cfg)
            .is_err()
    );
    // Suspended: CPU and memory back; disk plus 4 GiB of saved memory kept; the port kept.
    ledger.set_hold("sleeper", Hold::Suspended);
    assert_eq!(ledger.hold_of("sleeper"), Some(Hold::Suspended));
    let usage = ledger.usage("a");
    assert_eq!(
        (usage.used.cpus, usage.used.memory_mib, usage.used.storage_gib),
        (0, 0, 34)
    );
    assert_eq!(
        usage.ports.get(&(8080, Protocol::Tcp)),
        Some(&1),
        "its host port stays reserved"
    );
    let mut same_port = request(1, 512);
    same_port.host_ports = vec![(8080, Protocol::Tcp)];
    assert!(
        ledger
            .place_and_reserve("clash", &same_port, [&node_a], now(), &cfg)
            .is_err(),
        "no other VM takes its port"
    );
    // Another VM placed in the room it gave back.
    assert_eq!(
        ledger.place_and_reserve("tenant", &request(2, 2048), [&node_a], now(), &cfg),
        Ok("a".to_string())
    );
    // The cache's view (a status not yet written) never undoes the ledger's own hold.
    ledger.observe_bound("sleeper", "a", &suspended);
    assert_eq!(ledger.hold_of("sleeper"), Some(Hold::Suspended));
    // The resume lacks room: refused, nothing changes, and the free room is told.
    let allocatable = node_a.status.as_ref().and_then(|s| s.allocatable);
    let free = ledger
        .claim_resume("sleeper", allocatable.as_ref())
        .expect_err("no room");
    assert_eq!((free.cpus, free.memory_mib), (2, 2048));
    assert_eq!(ledger.hold_of("sleeper"), Some(Hold::Suspended));
    // Room freed: the resume claims the whole request back, and nothing else fits then.
    ledger.release("tenant");
    assert_eq!(ledger.claim_resume("sleeper", allocatable.as_ref()), Ok(()));
    assert_eq!(ledger.hold_of("sleeper"), Some(Hold::Full));
    assert_eq!(ledger.usage("a").used.cpus, 4);
    assert!(
        ledger
            .place_and_reserve("late", &request(1, 512), [&node_a], now(), &cfg)
            .is_err()
    );
    // Claiming again is a no-op.
    assert_eq!(ledger.claim_resume("sleeper", allocatable.as_ref()), Ok(()));
    assert_eq!(ledger.usage("a").used.cpus, 4);
}

/// Two suspended VMs on a node with room for one: concurrent resumes never both win.
#[test]
fn concurrent_resumes_never_overcommit_a_node() {
    let ledger = Arc::new(Ledger::new());
    let allocatable = NodeResources {
        cpus: 4,
        memory_mib: 4096,
        storage_gib: 4000,
    };
    for uid in ["one", "two"] {
        ledger.observe_bound(uid, "a", &request(3, 3072));
        ledger.set_hold(uid, Hold::Suspended);
    }
    let handles: Vec<_> = ["one", "two"]
        .into_iter()
        .map(|uid| {
            let ledger = ledger.clone();
            std::thread::spawn(move || ledger.claim_resume(uid, Some(&allocatable)).is_ok())
        })
        .collect();
    let won = handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .filter(|&won| won)
        .count();
    assert_eq!(won, 1, "one resume wins, the other waits");
    let used = ledger.usage("a").used;
    assert_eq!((used.cpus, used.memory_mib), (3, 3072), "exactly one resumed");
}

#[test]
fn gone_reservations_table() {
    let reserved = |uids: &[&str]| uids.iter().map(|u| u.to_string()).collect::<Vec<_>>();
    let live = |uids: &[&str]| {
        uids.iter()
            .map(|u| u.to_string())
            .collect::<std::collections::HashSet<_>>()
    };
    type Case<'a> = (&'a str, Vec<String>, std::collections::HashSet<String>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        ("nothing_reserved", reserved(&[]), live(&["a"]), vec![]),
        ("all_live", reserved(&["a", "b"]), live(&["a", "b", "c"]), vec![]),
        ("one_gone", reserved(&["a", "b"]), live(&["a"]), vec!["b"]),
        ("cache_empty", reserved(&["b", "a"]), live(&[]), vec!["a", "b"]),
        (
            "node_pools_and_orphans_are_not_vms",
            reserved(&["pool/node-a/pool-0d7a3c9e-g1", "orphan/node-a/svm-x", "a"]),
            live(&[]),
            vec!["a"],
        ),
    ];
    for (name, reserved, live, expected) in cases {
        assert_eq!(gone_reservations(&reserved, &live), expected, "{name}");
    }
}

#[test]
fn ledger_releases_reservations_of_vanished_vms() {
    let ledger = Ledger::new();
    ledger.observe_bound("kept", "a", &request(1, 512));
    ledger.observe_bound("stripped", "a", &request(2, 1024));
    let reserved = ledger.reserved_uids();
    // A VM reserved after the UIDs were read is not in `reserved`, so it is never released.
    ledger.observe_bound("new", "a", &request(1, 512));
    let live = ["kept".to_string()].into_iter().collect();
    assert_eq!(ledger.release_gone(&reserved, &live), vec!["stripped".to_string()]);
    assert_eq!(ledger.usage("a").used.cpus, 2, "kept + new");
    assert_eq!(ledger.node_of("stripped"), None);
    assert_eq!(ledger.node_of("new").as_deref(), Some("a"));
}

#[test]
fn node_fingerprint_ignores_the_heartbeat_only() {
    let base = node("a", 8, 8192);
    let fp = node_fingerprint(&base);
    type Case = (&'static str, SmolVMNode, bool);
    let cases: Vec<Case> = vec![
        ("same", base.clone(), false),
        (
            "heartbeat_only",
            edit(base.clone(), |n| {
                n.status.as_mut().unwrap().heartbeat_time = Some(Time(now() + SignedDuration::from_secs(10)))
            }),
            false,
        ),
        (
            "condition_transition_time_only",
            edit(base.clone(), |n| {
                n.status.as_mut().unwrap().conditions[0].last_transition_time = Time(now())
            }),
            false,
        ),
        (
            "ready_false",
            edit(base.clone(), |n| {
                n.status.as_mut().unwrap().conditions[0].status = "False".into()
            }),
            true,
        ),
        (
            "ready_reason",
            edit(base.clone(), |n| {
                n.status.as_mut().unwrap().conditions[0].reason = "RuntimeDown".into()
            }),
            true,
        ),
        (
            "node_uid",
            edit(base.clone(), |n| {
                n.status.as_mut().unwrap().node_uid = Some("uid-new".into())
            }),
            true,
        ),
        (
            "allocatable",
            edit(base.clone(), |n| {
                n.status.as_mut().unwrap().allocatable.as_mut().unwrap().cpus = 4
            }),
            true,
        ),
        (
            "capacity",
            edit(base.clone(), |n| {
                n.status.as_mut().unwrap().capacity.as_mut().unwrap().memory_mib = 1
            }),
            true,
        ),
        (
            "cordoned",
            edit(base.clone(), |n| n.spec.unschedulable = Some(true)),
            true,
        ),
        (
            "uncordoned_explicitly_is_the_same",
            edit(base.clone(), |n| n.spec.unschedulable = Some(false)),
            false,
        ),
        (
            "labels",
            edit(base.clone(), |n| {
                n.metadata.labels.as_mut().unwrap().insert("zone".into(), "b".into());
            }),
            true,
        ),
        (
            "endpoint",
            edit(base.clone(), |n| {
                n.status.as_mut().unwrap().endpoint.as_mut().unwrap().port = 1
            }),
            true,
        ),
        (
            "protocol",
            edit(base.clone(), |n| {
                n.status.as_mut().unwrap().protocol_version = Some("v2".into())
            }),
            true,
        ),
        ("no_status", edit(base.clone(), |n| n.status = None), true),
    ];
    for (name, node, changed) in cases {
        assert_eq!(node_fingerprint(&node) != fp, changed, "{name}");
    }
}

#[test]
fn node_tracker_wakes_on_changes_and_freshness_flips_only() {
    let timeout = &Config {
        heartbeat_timeout: SignedDuration::from_secs(40),
        clock: None,
    };
    let at = |secs: i64| now() + SignedDuration::from_secs(secs);
    // Heartbeat at now() - 5 s (see `node`).
    let mut tracker = NodeTracker::new();
    let a = node("a", 8, 8192);
    assert!(tracker.applied(&a, at(0), timeout), "a new node wakes");
    assert!(!tracker.applied(&a, at(1), timeout), "the same node again does not");
    let beat = |secs: i64| {
        edit(a.clone(), |n| {
            n.status.as_mut().unwrap().heartbeat_time = Some(Time(at(secs)))
        })
    };
    assert!(
        !tracker.applied(&beat(10), at(10), timeout),
        "a heartbeat alone does not"
    );
    assert!(tracker.applied(&edit(beat(20), |n| n.spec.unschedulable = Some(true)), at(20), timeout));
    assert!(!tracker.applied(&edit(beat(30), |n| n.spec.unschedulable = Some(true)), at(30), timeout));
    // The runtime dies: no events; the periodic look finds the heartbeat stale after the timeout.
    let dead = edit(beat(30), |n| n.spec.unschedulable = Some(true));
    assert!(tracker.tick([&dead], at(60), timeout).is_empty(), "still fresh at 30 s");
    assert!(
        tracker.tick([&dead], at(70), timeout).is_empty(),
        "exactly at the timeout: fresh"
    );
    assert_eq!(tracker.tick([&dead], at(71), timeout), vec!["a".to_string()], "stale");
    assert!(tracker.tick([&dead], at(80), timeout).is_empty(), "once");
    // It comes back: the first heartbeat wakes (fresh again) even though nothing else changed.
    let back = edit(dead.clone(), |n| {
        n.status.as_mut().unwrap().heartbeat_time = Some(Time(at(90)))
    });
    assert!(tracker.applied(&back, at(90), timeout), "fresh again");
    assert!(tracker.tick([&back], at(91), timeout).is_empty());
    // A node the tracker never saw, and one that vanished without a delete event.
    let b = node("b", 8, 8192);
    let b = edit(b, |n| n.status.as_mut().unwrap().heartbeat_time = Some(Time(at(90))));
    assert_eq!(
        tracker.tick([&b], at(92), timeout),
        vec!["a".to_string(), "b".to_string()]
    );
    assert!(tracker.deleted("b"));
    assert!(!tracker.deleted("b"), "deleting an unknown node wakes nobody");
}

/// A leader hand-off, modelled on the ledger: the old leader's bindings, written before it stepped
/// down, reach the new leader either in its seeding list or later through the watch, in any
/// order with its own placements. Whatever the interleaving, every placement the new leader makes
/// respects every binding it has seen: a node's committed resources never exceed its allocatable
/// and no host port is booked twice, counting the old leader's bindings.
mod hand_off {
    use proptest::prelude::*;
    use smolvm_api::types::Protocol;

    use super::*;

    #[derive(Debug, Clone)]
    enum Step {
        /// The old leader's binding of VM `i` to node `n` arrives (seeding list or watch).
        OldBinding {
            i: usize,
            n: usize,
            cpus: i64,
            port: Option<i32>,
        },
        /// The new leader places VM `i`.
        Place { i: usize, cpus: i64, port: Option<i32> },
    }

    fn step() -> impl Strategy<Value = Step> {
        let port = prop::option::of(prop::sample::select(vec![8080, 8081, 8082]));
        prop_oneof![
            (0usize..40, 0usize..3, 1i64..4, port.clone()).prop_map(|(i, n, cpus, port)| Step::OldBinding {
                i,
                n,
                cpus,
                port
            }),
            (0usize..40, 1i64..4, port).prop_map(|(i, cpus, port)| Step::Place { i, cpus, port }),
        ]
    }

    fn req(cpus: i64, port: Option<i32>) -> Request {
        let mut r = request(cpus, 256 * cpus);
        r.host_ports = port.map(|p| (p, Protocol::Tcp)).into_iter().collect();
        r
    }

    proptest! {
        #[test]
        fn placements_after_seeing_a_binding_never_over_commit(steps in prop::collection::vec(step(), 1..60)) {
            let cfg = Config::default();
            let nodes = [node("n0", 8, 8 * 256), node("n1", 8, 8 * 256), node("n2", 8, 8 * 256)];
            let ledger = Ledger::new();
            // What the new leader has seen, per node: (cpus, ports), bookings by the old leader
            // included (even ones that already over-commit: the old leader's doing, not ours).
            for step in steps {
                match step {
                    Step::OldBinding { i, n, cpus, port } => {
                        let uid = format!("old-{i}");
                        if ledger.node_of(&uid).is_none() {
                            ledger.observe_bound(&uid, &format!("n{n}"), &req(cpus, port));
                        }
                    }
                    Step::Place { i, cpus, port } => {
                        let uid = format!("new-{i}");
                        if ledger.node_of(&uid).is_some() {
                            continue;
                        }
                        let before: Vec<_> = (0..3).map(|n| ledger.usage(&format!("n{n}"))).collect();
                        if let Ok(chosen) = ledger.place_and_reserve(&uid, &req(cpus, port), nodes.iter(), now(), &cfg) {
                            let n: usize = chosen[1..].parse().unwrap();
                            let seen = &before[n];
                            prop_assert!(
                                seen.used.cpus + cpus <= 8,
                                "placed {cpus} CPUs on {chosen} holding {} of 8", seen.used.cpus
                            );
                            if let Some(p) = port {
                                prop_assert!(
                                    !seen.ports.contains_key(&(p, Protocol::Tcp)),
                                    "host port {p} booked twice on {chosen}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `node` with the GuestBootable condition its agent's canary reports.
fn guest_bootable(node: SmolVMNode, status: &str, reason: &str) -> SmolVMNode {
    edit(node, |n| {
        n.status
            .as_mut()
            .unwrap()
            .conditions
            .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: smolvm_api::constants::condition::GUEST_BOOTABLE.into(),
                status: status.into(),
                reason: reason.into(),
                message: format!("{reason}: the canary's words"),
                last_transition_time: Time(now()),
                observed_generation: None,
            })
    })
}

#[test]
fn unplaced_vms_say_why_as_the_scheduler_does() {
    let cfg = Config::default();
    let empty: HashMap<String, Usage> = HashMap::new();
    let big = |name: &str| node(name, 8, 8192);
    let arm = |name: &str| {
        edit(node(name, 8, 8192), |n| {
            n.metadata.labels = Some([("kubernetes.io/arch".to_string(), "arm64".to_string())].into())
        })
    };
    let wants = |cpus: i64, memory: i64| Request {
        node_selector: [("kubernetes.io/arch".to_string(), "amd64".to_string())].into(),
        ..request(cpus, memory)
    };
    let cases: Vec<(&str, Vec<SmolVMNode>, Request, &str)> = vec![
        (
            "the issue's example",
            vec![
                guest_bootable(big("a"), "False", "CanaryFailed"),
                node("b", 8, 1024),
                arm("c"),
            ],
            wants(1, 2048),
            "0/3 nodes can run this VM: 1 cannot boot guests (CanaryFailed), 1 has too little memory (needs 2048 MiB, 1024 free), 1 does not match nodeSelector",
        ),
        (
            "waiting for the first check",
            vec![
                guest_bootable(big("a"), "Unknown", "CanaryPending"),
                guest_bootable(big("b"), "Unknown", "CanaryPending"),
            ],
            request(1, 512),
            "0/2 nodes can run this VM: 2 are still checking that a guest boots (CanaryPending)",
        ),
        (
            "every node refuses guests",
            vec![
                guest_bootable(big("a"), "False", "CanaryFailed"),
                guest_bootable(big("b"), "False", "CanaryFailed"),
            ],
            request(1, 512),
            "0/2 nodes can run this VM: 2 cannot boot guests (CanaryFailed)",
        ),
        (
            "plural resources name the most any has free",
            vec![
                node("a", 8, 1024),
                node("b", 8, 3072),
                edit(big("c"), |n| n.spec.unschedulable = Some(true)),
            ],
            request(1, 4096),
            "0/3 nodes can run this VM: 1 is cordoned (spec.unschedulable), 2 have too little memory (needs 4096 MiB, at most 3072 free)",
        ),
    ];
    for (name, nodes, req, want) in cases {
        let err = place(&req, &nodes, &empty, now(), &cfg).unwrap_err();
        assert_eq!(err.message, want, "{name}");
        assert_eq!(err.reason, "NoEligibleNode", "{name}");
    }
    // False excludes, True and absent (the check off) admit: the VM goes to the node that boots.
    let mixed = vec![
        guest_bootable(big("a"), "False", "CanaryFailed"),
        guest_bootable(big("b"), "True", "CanaryBooted"),
    ];
    let chosen = place(&request(1, 512), &mixed, &empty, now(), &cfg).unwrap();
    assert_eq!(chosen.metadata.name.as_deref(), Some("b"));
    // A pinned VM names its node's reason, in the node's own words.
    let pinned = Request {
        pin: Some("a".into()),
        ..request(1, 512)
    };
    let err = place(&pinned, &mixed, &empty, now(), &cfg).unwrap_err();
    assert_eq!(err.reason, "PinnedNodeIneligible");
    assert_eq!(
        err.message,
        "pinned node a cannot run this VM now: 1 cannot boot guests (CanaryFailed) (CanaryFailed: CanaryFailed: the canary's words)"
    );
}

#[test]
fn a_heartbeat_from_the_future_is_judged_by_the_controllers_clock() {
    let clock = std::sync::Arc::new(smolvm_controller::heartbeat::HeartbeatClock::new());
    let cfg = Config::observed(SignedDuration::from_secs(40), clock);
    let fast = edit(node("a", 8, 8192), |n| {
        n.status.as_mut().unwrap().heartbeat_time = Some(Time(now() + SignedDuration::from_secs(365 * 86_400)))
    });
    assert_eq!(
        check_node(&fast, &request(1, 1), None, now(), &cfg),
        None,
        "fresh when first seen"
    );
    let later = now() + SignedDuration::from_secs(41);
    assert_eq!(
        check_node(&fast, &request(1, 1), None, later, &cfg).map(|i| i.reason()),
        Some("StaleHeartbeat"),
        "stale once it stops changing, although its timestamp is a year ahead"
    );
    // Without the clock (tables that set heartbeats), a far-future timestamp is not fresh either.
    let by_timestamp = Config::default();
    assert_eq!(
        check_node(&fast, &request(1, 1), None, now(), &by_timestamp).map(|i| i.reason()),
        Some("StaleHeartbeat")
    );
}

/// What a pool's source and each of its slots take in the tables below.
const SLOT: NodeResources = NodeResources {
    cpus: 4,
    memory_mib: 4096,
    storage_gib: 10,
};

#[test]
fn which_ready_slots_make_room() {
    use smolvm_controller::placement::{SlotHold, slots_to_give_back};
    let allocatable = NodeResources {
        cpus: 16,
        memory_mib: 1 << 20,
        storage_gib: 1 << 14,
    };
    let usage = |used: i64, slots: &[(&str, u32)]| Usage {
        used: NodeResources {
            cpus: used,
            ..NodeResources::default()
        },
        slots: slots
            .iter()
            .map(|(p, n)| (p.to_string(), SlotHold { each: SLOT, count: *n }))
            .collect(),
        ..Usage::default()
    };
    let cpus = |n: i64| NodeResources {
        cpus: n,
        ..NodeResources::default()
    };
    // (case, usage, want, spare, slots given back)
    type Case = (
        &'static str,
        Usage,
        NodeResources,
        Option<&'static str>,
        Option<Vec<(&'static str, u32)>>,
    );
    let cases: Vec<Case> = vec![
        (
            "fits beside them: none",
            usage(4, &[("p", 2)]),
            cpus(4),
            None,
            Some(vec![]),
        ),
        (
            "the fewest that make room",
            usage(4, &[("p", 3)]),
            cpus(8),
            None,
            Some(vec![("p", 2)]),
        ),
        (
            "taken from the pool with the most first, ties by name",
            usage(0, &[("p", 2), ("q", 2)]),
            cpus(8),
            None,
            Some(vec![("p", 1), ("q", 1)]),
        ),
        (
            "never the spare pool's",
            usage(0, &[("p", 2), ("q", 2)]),
            cpus(8),
            Some("q"),
            Some(vec![("p", 2)]),
        ),
        (
            "not even with all but the spare pool's",
            usage(0, &[("p", 2), ("q", 2)]),
            cpus(12),
            Some("q"),
            None,
        ),
        (
            "not enough even without all",
            usage(8, &[("p", 2)]),
            cpus(12),
            None,
            None,
        ),
        (
            "an overcommitted node stays so",
            usage(20, &[("p", 1)]),
            cpus(1),
            None,
            None,
        ),
    ];
    for (name, usage, want, spare, expected) in cases {
        let got = slots_to_give_back(&allocatable, &usage, &want, spare);
        let expected: Option<Vec<(String, u32)>> =
            expected.map(|v| v.into_iter().map(|(p, n)| (p.to_string(), n)).collect());
        assert_eq!(got, expected, "{name}");
    }
}

/// The reproduction: a pool with a 4-CPU template and 16 slots per node on a 16-CPU node
/// fills only the spare room (its source and 3 slots); another tenant's SmolVM that needs most of
/// the node is placed by taking ready slots' room (which the node deletes first); a pool never
/// makes a SmolVM unschedulable; a warm claim moves its own slot's room only.
#[test]
fn a_smolvm_takes_the_room_of_ready_slots_and_a_warm_claim_its_own_slot() {
    let ledger = Ledger::new();
    let cfg = Config::default();
    let a = node("a", 16, 1 << 20);
    let pool = "pool-p";
    let allocatable = a.status.as_ref().and_then(|s| s.allocatable).unwrap_or_default();
    let source = Request {
        resources: SLOT,
        host_ports: vec![],
        node_selector: BTreeMap::new(),
        pin: None,
        source: None,
        volumes: Vec::new(),
    };
    assert_eq!(
        ledger.book_pool("a", pool, &source, false, &SLOT, 16, &allocatable),
        Some(3),
        "the source and the 3 slots that fit beside it, of 16 asked"
    );
    let usage = ledger.usage("a");
    assert_eq!((usage.used.cpus, usage.soft().cpus), (4, 12), "a hard and a soft hold");

    // Beside the slots: nothing is free, so a VM of 12 CPUs takes 3 slots' room.
    let big = Request {
        resources: NodeResources {
            cpus: 12,
            memory_mib: 1024,
            storage_gib: 10,
        },
        host_ports: vec![],
        node_selector: BTreeMap::new(),
        pin: None,
        source: None,
        volumes: Vec::new(),
    };
    assert!(
        place(
            &big,
            [&a],
            &HashMap::from([("a".to_string(), usage.clone())]),
            now(),
            &cfg
        )
        .is_err()
    );
    let reserved = ledger
        .reserve("tenant-b", &big, [&a], None, now(), &cfg)
        .expect("placed");
    assert_eq!(reserved.node, "a");
    assert_eq!(
        reserved.give_back,
        vec![(pool.to_string(), 3)],
        "the slots it takes, for the node to delete"
    );
    assert!(!reserved.warm);
    assert_eq!(ledger.slots("a", pool), 0);
    assert_eq!(ledger.usage("a").used.cpus, 16, "the VM and the source, both in full");
    // The source is never taken: a VM that fits only without it is unschedulable, and says so
    // with the room the slots would give counted as free.
    let more = Request {
        resources: NodeResources {
            cpus: 1,
            ..big.resources
        },
        ..big.clone()
    };
    let refused = ledger.reserve("tenant-c", &more, [&a], None, now(), &cfg).unwrap_err();
    assert_eq!(
        refused.message,
        "0/1 nodes can run this VM: 1 has too few CPUs (needs 1, 0 free)"
    );

    // The pool books room again (the VM went): a warm claim moves one of its own slots, no
    // other slot touched.
    ledger.release("tenant-b");
    assert_eq!(
        ledger.book_pool("a", pool, &source, true, &SLOT, 16, &allocatable),
        Some(3)
    );
    let claim = source.clone();
    let warm = ledger
        .reserve("claim", &claim, [&a], Some((pool, &[&a][..])), now(), &cfg)
        .expect("served warm");
    assert!(warm.warm && warm.give_back.is_empty(), "{warm:?}");
    assert_eq!(ledger.slots("a", pool), 2, "its own slot's room moved to it");
    assert_eq!(ledger.usage("a").used.cpus, 8, "the source and the claim");

    // Where another node has room beside its slots, it goes there rather than taking any.
    let b = node("b", 16, 1 << 20);
    let four = Request {
        resources: NodeResources {
            cpus: 4,
            ..big.resources
        },
        ..big.clone()
    };
    let reserved = ledger
        .reserve("tenant-d", &four, [&a, &b], None, now(), &cfg)
        .expect("placed");
    assert_eq!((reserved.node.as_str(), reserved.give_back.len()), ("b", 0));
}

/// A resume (or a resize) takes hard room that ready slots may hold: the ledger gives back the
/// fewest slots that make every hold fit the node again, for the node to delete first, and none
/// where they fit beside it.
#[test]
fn a_resume_takes_the_room_of_ready_slots_first() {
    let ledger = Ledger::new();
    let a = node("a", 16, 1 << 20);
    let allocatable = a.status.as_ref().and_then(|s| s.allocatable).unwrap_or_default();
    let pool = "pool-p";
    let source = Request {
        resources: SLOT,
        host_ports: vec![],
        node_selector: BTreeMap::new(),
        pin: None,
        source: None,
        volumes: Vec::new(),
    };
    // A suspended VM of 4 CPUs holds none of them: the source and 3 slots fill the node.
    ledger.observe_bound("sleeper", "a", &request(4, 1024));
    ledger.set_hold("sleeper", Hold::Suspended);
    assert_eq!(
        ledger.book_pool("a", pool, &source, false, &SLOT, 16, &allocatable),
        Some(3)
    );
    assert!(
        ledger.make_room("a", &allocatable).is_empty(),
        "every hold fits: nothing given back"
    );
    // Its resume takes its 4 CPUs again (hard room, which the slots hold).
    assert_eq!(ledger.claim_resume("sleeper", Some(&allocatable)), Ok(()));
    assert_eq!(
        ledger.make_room("a", &allocatable),
        vec![(pool.to_string(), 1)],
        "one slot's room makes the resume fit"
    );
    assert_eq!(ledger.slots("a", pool), 2);
    let usage = ledger.usage("a");
    assert_eq!((usage.used.cpus, usage.soft().cpus), (8, 8));
}

/// A PV with a node affinity: the nodes its terms do not select cannot take the VM, said in the
/// scheduler's form with the PV and where it is pinned; the pinned node without room says both.
#[test]
fn a_vm_goes_only_where_its_volume_data_can_be_reached() {
    use smolvm_controller::placement::VolumeReach;
    let cfg = Config::default();
    let empty: HashMap<String, Usage> = HashMap::new();
    let hostname = |n: SmolVMNode, host: &str| {
        edit(n, |n| {
            n.metadata.labels = Some([("kubernetes.io/hostname".to_string(), host.to_string())].into())
        })
    };
    let terms = |value: serde_json::Value| serde_json::from_value(value).expect("terms");
    let by_hostname = |pv: &str, host: &str| VolumeReach {
        pv: pv.into(),
        terms: terms(serde_json::json!([
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}
        ])),
    };
    let by_name = |pv: &str, node: &str| VolumeReach {
        pv: pv.into(),
        terms: terms(serde_json::json!([
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ])),
    };
    let by_zone = VolumeReach {
        pv: "zonal".into(),
        terms: terms(serde_json::json!([
            {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["z1"]}]}
        ])),
    };
    let with = |volumes: Vec<VolumeReach>, cpus: i64| Request {
        volumes,
        ..request(cpus, 512)
    };
    let nodes = vec![
        hostname(node("node-a", 8, 8192), "node-a"),
        hostname(node("node-b", 2, 8192), "node-b"),
        hostname(node("node-c", 8, 8192), "node-c"),
    ];
    // (name, request, the node chosen or the message)
    let rows: Vec<(&str, Request, Result<&str, &str>)> = vec![
        ("no volume: the emptiest node", with(vec![], 1), Ok("node-a")),
        (
            "pinned by hostname",
            with(vec![by_hostname("local-3", "node-b")], 1),
            Ok("node-b"),
        ),
        (
            "pinned by name",
            with(vec![by_name("local-7", "node-c")], 1),
            Ok("node-c"),
        ),
        (
            "pinned to the one node that has no room: both said",
            with(vec![by_hostname("local-3", "node-b")], 4),
            Err(
                "0/3 nodes can run this VM: 1 has too few CPUs (needs 4, 2 free), 2 cannot reach volume data (PV local-3 is pinned to node-b)",
            ),
        ),
        (
            "two PVs pinned apart",
            with(vec![by_hostname("local-3", "node-b"), by_name("local-7", "node-c")], 1),
            Err(
                "0/3 nodes can run this VM: 3 cannot reach volume data (PV local-3 is pinned to node-b; PV local-7 is pinned to node-c)",
            ),
        ),
        (
            "an affinity on labels the nodes lack selects none of them",
            with(vec![by_zone.clone()], 1),
            Ok("node-a"),
        ),
    ];
    for (name, req, want) in rows {
        let got = place(&req, &nodes, &empty, now(), &cfg)
            .map(|n| n.metadata.name.clone().unwrap_or_default())
            .map_err(|e| e.message);
        assert_eq!(got.as_deref().map_err(String::as_str), want, "{name}");
    }
    // NotIn on a label a node carries excludes it; the message says the PV is limited by its
    // affinity where its terms name no node.
    let zoned = edit(hostname(node("node-z", 8, 8192), "node-z"), |n| {
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("topology.kubernetes.io/zone".into(), "z1".into());
    });
    let err = place(&with(vec![by_zone], 1), &[zoned], &empty, now(), &cfg).unwrap_err();
    assert_eq!(
        err.message,
        "0/1 nodes can run this VM: 1 cannot reach volume data (PV zonal is limited by its node affinity)"
    );
    // A pin and a PV pinned elsewhere: the pinned node says why.
    let pinned = Request {
        pin: Some("node-a".into()),
        ..with(vec![by_hostname("local-3", "node-b")], 1)
    };
    let err = place(&pinned, &nodes, &empty, now(), &cfg).unwrap_err();
    assert_eq!(
        err.message,
        "pinned node node-a cannot run this VM now: 1 cannot reach volume data (PV local-3 is pinned to node-b)"
    );
}
