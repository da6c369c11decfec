//! The pools' pass as data, table-driven: which nodes are asked to keep a pool and which node
//! pools go ([`plan`], [`orphans`]), the status it reports ([`status`]), and the slot's machine
//! made from the template as admission makes a SmolVM naming the pool ([`slot_vm`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use smolvm_api::{
    NodePool, NodeResources, SmolVMNode, SmolVMNodeSpec, SmolVMNodeStatus, SmolVMPool,
    constants::{condition, reason},
    fixtures,
};
use smolvm_controller::placement::{Config, LedgerView, SlotHold};
use smolvm_controller::pools::{
    Keep, Start, node_pool_name, node_pool_name_at, orphans, plan, slot_vm, status, with_ready_slot,
};

const UID: &str = "0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58";

fn pool(slots: i32, generation: i64) -> SmolVMPool {
    let mut pool = fixtures::pool(
        "sandboxes",
        json!({"template": {"image": "python:3.12-slim", "className": "medium"}, "slotsPerNode": slots}),
    );
    pool.metadata.uid = Some(UID.into());
    pool.metadata.generation = Some(generation);
    pool
}

/// A node reporting `pools` as `(name, ready, slots)`.
fn node(name: &str, pools: &[(&str, i32, i32)]) -> Arc<SmolVMNode> {
    let mut node = SmolVMNode::new(name, SmolVMNodeSpec::default());
    node.status = Some(SmolVMNodeStatus {
        pools: Some(
            pools
                .iter()
                .map(|(name, ready, slots)| NodePool {
                    name: (*name).into(),
                    ready: *ready,
                    slots: *slots,
                    leased: 0,
                })
                .collect(),
        ),
        ..Default::default()
    });
    Arc::new(node)
}

#[test]
fn the_node_pool_is_named_from_the_uid_and_the_generation() {
    assert_eq!(
        node_pool_name(&pool(3, 7)).as_deref(),
        Some("pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g7")
    );
    // A SmolVM filled from generation 5 is served only by that template's slots.
    assert_eq!(
        node_pool_name_at(&pool(3, 7), Some(5)).as_deref(),
        Some("pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g5")
    );
    // Two pools whose UIDs share their first characters never share a node pool.
    let mut twin = pool(3, 7);
    twin.metadata.uid = Some("0d7a3c9e-0000-4000-8000-000000000000".into());
    assert_ne!(node_pool_name(&twin), node_pool_name(&pool(3, 7)));
    assert_eq!(
        node_pool_name(&twin).as_deref(),
        Some("pool-0d7a3c9e-0000-4000-8000-000000000000-g7")
    );
    // Within a machine name's 63 characters for any generation.
    let longest = node_pool_name_at(&pool(3, 7), Some(i64::MAX)).expect("a name");
    assert!(longest.len() <= 63, "{longest}");
    smolvm_api::nodeapi::validate_machine_name(&longest).expect("a valid machine name");
    // A UID a machine name cannot hold makes no name.
    let mut odd = pool(3, 1);
    odd.metadata.uid = Some("Not A Uid/..".into());
    assert_eq!(node_pool_name(&odd), None);
    let mut unsaved = pool(3, 1);
    unsaved.metadata.uid = None;
    assert_eq!(node_pool_name(&unsaved), None, "a pool not stored yet has none");
    let view = LedgerView::default();
    assert!(plan(&unsaved, &[], &view, &SLOT, now(), &Config::default(), None).is_none());
}

/// What the pool's source and each of its slots take in these tables: 4 CPUs, 4 GiB, 10 GiB.
const SLOT: NodeResources = NodeResources {
    cpus: 4,
    memory_mib: 4096,
    storage_gib: 10,
};

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).expect("a time")
}

/// A Ready node with `cpus` CPUs (memory and disk to spare), labelled `pool=yes`, reporting
/// `pools` as `(name, ready, slots)`.
fn ready(name: &str, cpus: i64, pools: &[(&str, i32, i32)]) -> Arc<SmolVMNode> {
    let resources = NodeResources {
        cpus,
        memory_mib: 1 << 20,
        storage_gib: 1 << 14,
    };
    let mut node = fixtures::ready_node(name, resources, now() - k8s_openapi::jiff::SignedDuration::from_secs(5));
    node.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("pool".into(), "yes".into());
    if let Some(status) = node.status.as_mut() {
        status.pools = Some(
            pools
                .iter()
                .map(|(name, ready, slots)| NodePool {
                    name: (*name).into(),
                    ready: *ready,
                    slots: *slots,
                    leased: 0,
                })
                .collect(),
        );
    }
    Arc::new(node)
}

/// The same node without the label the pool selects.
fn unlabelled(name: &str, cpus: i64) -> Arc<SmolVMNode> {
    let mut node = (*ready(name, cpus, &[])).clone();
    if let Some(labels) = node.metadata.labels.as_mut() {
        labels.remove("pool");
    }
    Arc::new(node)
}

/// A ledger where `node` holds `used` CPUs of VMs, the source of `sources`, and `slots` as
/// `(node pool, count)` of `SLOT`.
/// `(node, CPUs of VMs, sources booked, (node pool, ready slots booked))`.
type Booked<'a> = (&'a str, i64, &'a [&'a str], &'a [(&'a str, u32)]);

fn ledger(entries: &[Booked<'_>]) -> LedgerView {
    let mut view = LedgerView::default();
    for (node, used, sources, slots) in entries {
        let usage = view.by_node.entry(node.to_string()).or_default();
        usage.used.cpus += used;
        for source in *sources {
            usage.used = usage.used.plus(&SLOT);
            view.sources.insert((node.to_string(), source.to_string()));
        }
        for (pool, count) in *slots {
            usage.slots.insert(
                pool.to_string(),
                SlotHold {
                    each: SLOT,
                    count: *count,
                },
            );
        }
    }
    view
}

fn selecting(slots: i32, generation: i64) -> SmolVMPool {
    let mut p = pool(slots, generation);
    p.spec.node_selector = Some([("pool".to_string(), "yes".to_string())].into());
    p
}

fn keep(node: &str, source: bool, give_back: &[(&str, u32)], slots: u32, new_slots: u32, apply: bool) -> Keep {
    Keep {
        node: node.into(),
        source: source.then_some(SLOT),
        give_back: give_back.iter().map(|(p, n)| (p.to_string(), *n)).collect(),
        slots,
        new_slots,
        apply,
    }
}

#[test]
fn plan_table() {
    let current = &format!("pool-{UID}-g2");
    let old = &format!("pool-{UID}-g1");
    let other = "pool-11111111-2222-4333-8444-555555555555-g1";
    struct Case {
        name: &'static str,
        nodes: Vec<Arc<SmolVMNode>>,
        ledger: LedgerView,
        slots_per_node: i32,
        budget: Option<NodeResources>,
        keep: Vec<Keep>,
        retire: Vec<(&'static str, String)>,
        unplaced: Option<&'static str>,
        quota: bool,
    }
    let cases = vec![
        Case {
            name: "a 16-CPU node keeps the source and the 3 slots that fit beside it, of 16 asked",
            nodes: vec![ready("a", 16, &[])],
            ledger: ledger(&[]),
            slots_per_node: 16,
            budget: None,
            keep: vec![keep("a", true, &[], 3, 3, true)],
            retire: vec![],
            unplaced: None,
            quota: false,
        },
        Case {
            name: "slotsPerNode 0: the source only",
            nodes: vec![ready("a", 16, &[])],
            ledger: ledger(&[]),
            slots_per_node: 0,
            budget: None,
            keep: vec![keep("a", true, &[], 0, 0, true)],
            retire: vec![],
            unplaced: None,
            quota: false,
        },
        Case {
            name: "kept as booked and reported: left alone",
            nodes: vec![ready("a", 64, &[(current, 3, 3)])],
            ledger: ledger(&[("a", 0, &[current], &[(current, 3)])]),
            slots_per_node: 3,
            budget: None,
            keep: vec![keep("a", false, &[], 3, 0, false)],
            retire: vec![],
            unplaced: None,
            quota: false,
        },
        Case {
            name: "a lease took a slot (the agent lowered it): the refill is booked and asked for",
            nodes: vec![ready("a", 64, &[(current, 2, 2)])],
            ledger: ledger(&[("a", 4, &[current], &[(current, 2)])]),
            slots_per_node: 3,
            budget: None,
            keep: vec![keep("a", false, &[], 3, 1, true)],
            retire: vec![],
            unplaced: None,
            quota: false,
        },
        Case {
            name: "a SmolVM took most of the node: the slots that no longer fit go",
            nodes: vec![ready("a", 16, &[(current, 3, 3)])],
            ledger: ledger(&[("a", 8, &[current], &[(current, 1)])]),
            slots_per_node: 16,
            budget: None,
            keep: vec![keep("a", false, &[], 1, 0, true)],
            retire: vec![],
            unplaced: None,
            quota: false,
        },
        Case {
            name: "the controller restarted: a reported pool is kept where it is, its slots booked again",
            nodes: vec![ready("a", 64, &[(current, 3, 3)])],
            ledger: ledger(&[]),
            slots_per_node: 3,
            budget: None,
            keep: vec![keep("a", false, &[], 3, 3, true)],
            retire: vec![],
            unplaced: None,
            quota: false,
        },
        Case {
            name: "another pool's ready slots are given back for the source, the fewest",
            nodes: vec![ready("a", 16, &[(other, 4, 4)])],
            ledger: ledger(&[("a", 0, &[], &[(other, 4)])]),
            slots_per_node: 3,
            budget: None,
            keep: vec![keep("a", true, &[(other, 1)], 0, 0, true)],
            retire: vec![],
            unplaced: None,
            quota: false,
        },
        Case {
            name: "a source that fits nowhere says why, in the scheduler's form",
            nodes: vec![ready("a", 2, &[]), ready("b", 3, &[]), unlabelled("c", 64)],
            ledger: ledger(&[]),
            slots_per_node: 3,
            budget: None,
            keep: vec![],
            retire: vec![],
            unplaced: Some(
                "0/3 nodes can keep this pool's source: 2 have too few CPUs (needs 4, at most 3 free), 1 does not match nodeSelector",
            ),
            quota: false,
        },
        Case {
            name: "sources first, then slots, within the budget: one source and one slot",
            nodes: vec![ready("a", 64, &[]), ready("b", 64, &[])],
            ledger: ledger(&[]),
            slots_per_node: 3,
            budget: Some(NodeResources {
                cpus: 12,
                memory_mib: 1 << 20,
                storage_gib: 1 << 14,
            }),
            keep: vec![keep("a", true, &[], 1, 1, true), keep("b", true, &[], 0, 0, true)],
            retire: vec![],
            unplaced: None,
            quota: true,
        },
        Case {
            name: "a budget with no room for a source starts nothing, and says so",
            nodes: vec![ready("a", 64, &[])],
            ledger: ledger(&[]),
            slots_per_node: 3,
            budget: Some(NodeResources {
                cpus: 2,
                memory_mib: 1 << 20,
                storage_gib: 1 << 14,
            }),
            keep: vec![],
            retire: vec![],
            unplaced: None,
            quota: true,
        },
        Case {
            name: "a new template: the old node pool goes, the new one is placed",
            nodes: vec![ready("a", 64, &[(old, 3, 3)])],
            ledger: ledger(&[("a", 0, &[old], &[(old, 3)])]),
            slots_per_node: 3,
            budget: None,
            keep: vec![keep("a", true, &[], 3, 3, true)],
            retire: vec![("a", old.clone())],
            unplaced: None,
            quota: false,
        },
        Case {
            name: "a node it no longer matches: its node pool goes",
            nodes: vec![unlabelled("a", 64).as_ref().clone().into(), ready("b", 64, &[])],
            ledger: ledger(&[]),
            slots_per_node: 3,
            budget: None,
            keep: vec![keep("b", true, &[], 3, 3, true)],
            retire: vec![],
            unplaced: None,
            quota: false,
        },
    ];
    for case in cases {
        let got = plan(
            &selecting(case.slots_per_node, 2),
            &case.nodes,
            &case.ledger,
            &SLOT,
            now(),
            &Config::default(),
            case.budget,
        )
        .expect("a plan");
        let name = case.name;
        assert_eq!(&got.name, current, "{name}");
        assert_eq!(got.keep, case.keep, "{name}");
        let retire: Vec<(String, String)> = case.retire.iter().map(|(n, p)| (n.to_string(), p.clone())).collect();
        assert_eq!(got.retire, retire, "{name}");
        assert_eq!(got.unplaced.as_deref(), case.unplaced, "{name}");
        assert_eq!(got.quota.is_some(), case.quota, "{name}: {:?}", got.quota);
    }
    // A node it no longer matches that still reports its node pool: retired.
    let moved = {
        let mut n = (*ready("a", 64, &[(current, 3, 3)])).clone();
        n.metadata.labels.as_mut().map(|l| l.remove("pool"));
        Arc::new(n)
    };
    let got = plan(
        &selecting(3, 2),
        &[moved],
        &ledger(&[]),
        &SLOT,
        now(),
        &Config::default(),
        None,
    )
    .expect("a plan");
    assert_eq!(got.retire, vec![("a".to_string(), current.clone())]);
    // What a node starts, as data: the source and its new slots, each with its resources.
    assert_eq!(
        keep("a", true, &[], 3, 2, true).starts(&SLOT),
        vec![Start::Source(SLOT), Start::Slots(2, SLOT)]
    );
}
#[test]
fn orphans_are_node_pools_of_pools_that_are_gone() {
    let nodes = vec![
        node(
            "a",
            &[
                ("pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g2", 3, 3),
                ("pool-deadbeef-g1", 1, 1),
            ],
        ),
        node(
            "b",
            &[
                ("pool-deadbeef-g4", 0, 2),
                ("something-else", 1, 1),
                ("pool-hand-made-g1", 1, 1),
                ("pool-deadbeef-gx", 1, 1),
            ],
        ),
    ];
    assert_eq!(
        orphans(&nodes, &[pool(3, 2)]),
        vec![
            ("a".to_string(), "pool-deadbeef-g1".to_string()),
            ("b".to_string(), "pool-deadbeef-g4".to_string())
        ]
    );
    assert_eq!(
        orphans(&nodes, &[]).len(),
        3,
        "with no pool left, every pool-named node pool goes"
    );
    // A pool whose UID shares its first characters with a live one's is still an orphan.
    let twin = "pool-0d7a3c9e-0000-4000-8000-000000000000-g1";
    assert_eq!(
        orphans(&[node("a", &[(twin, 1, 1)])], &[pool(3, 2)]),
        vec![("a".to_string(), twin.to_string())]
    );
    // What the sweep keeps the ApplyPool retries of: any generation of a live pool, no other.
    let live = smolvm_controller::pools::LivePools::of(&[pool(3, 2)]);
    for (name, held) in [
        ("pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g2", true),
        ("pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g7", true),
        (twin, false),
        ("pool-deadbeef-g1", false),
    ] {
        assert_eq!(live.holds(name), held, "{name}");
    }
}

#[test]
fn status_table() {
    let current = &format!("pool-{UID}-g2");
    let p = selecting(3, 2);
    // (case, nodes, ledger, failures, ready, total, condition status, reason, message part)
    type Case = (
        &'static str,
        Vec<Arc<SmolVMNode>>,
        LedgerView,
        Vec<(&'static str, &'static str)>,
        i32,
        i32,
        &'static str,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "no node matches",
            vec![unlabelled("a", 64)],
            ledger(&[]),
            vec![],
            0,
            0,
            "False",
            reason::NO_MATCHING_NODES,
            "nodeSelector",
        ),
        (
            "no room for the source anywhere",
            vec![ready("a", 2, &[])],
            ledger(&[]),
            vec![],
            0,
            0,
            "False",
            reason::UNSCHEDULABLE,
            "0/1 nodes can keep this pool's source: 1 has too few CPUs (needs 4, 2 free)",
        ),
        (
            "filling",
            vec![ready("a", 64, &[(current, 1, 3)]), ready("b", 64, &[])],
            ledger(&[("a", 0, &[current], &[(current, 3)])]),
            vec![],
            1,
            6,
            "False",
            reason::SLOTS_FILLING,
            "1 of 6",
        ),
        (
            "ready",
            vec![ready("a", 64, &[(current, 3, 3)])],
            ledger(&[("a", 0, &[current], &[(current, 3)])]),
            vec![],
            3,
            3,
            "True",
            reason::SLOTS_READY,
            "3 slots ready on 1 node",
        ),
        (
            "ready with the room there is: the slots it now has, and how many have no room",
            vec![ready("a", 16, &[(current, 1, 1)])],
            ledger(&[("a", 8, &[current], &[(current, 1)])]),
            vec![],
            1,
            1,
            "True",
            reason::SLOTS_READY,
            "1 slots ready on 1 node(s); 2 more that slotsPerNode asks for have no room",
        ),
        (
            "a node fails: named, with its cause",
            vec![ready("a", 64, &[(current, 3, 3)]), ready("b", 64, &[])],
            ledger(&[("a", 0, &[current], &[(current, 3)])]),
            vec![("b", "image not found")],
            3,
            6,
            "False",
            reason::SLOTS_FAILING,
            "b: image not found",
        ),
        (
            "an older generation's ready slots are not this one's",
            vec![ready(
                "a",
                64,
                &[("pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g1", 3, 3)],
            )],
            ledger(&[]),
            vec![],
            0,
            3,
            "False",
            reason::SLOTS_FILLING,
            "0 of 3",
        ),
    ];
    for (name, nodes, view, failures, ready_slots, total, state, why, words) in cases {
        let plan = plan(&p, &nodes, &view, &SLOT, now(), &Config::default(), None).expect("a plan");
        let failures: BTreeMap<String, String> = failures.iter().map(|(n, m)| (n.to_string(), m.to_string())).collect();
        let got = status(&p, &nodes, &plan, &failures, now());
        assert_eq!(
            (got.ready_slots, got.total_slots),
            (Some(ready_slots), Some(total)),
            "{name}"
        );
        assert_eq!(got.observed_generation, Some(2), "{name}");
        let ready_condition = got
            .conditions
            .iter()
            .find(|c| c.type_ == condition::READY)
            .expect("Ready");
        assert_eq!(
            (ready_condition.status.as_str(), ready_condition.reason.as_str()),
            (state, why),
            "{name}: {}",
            ready_condition.message
        );
        assert!(
            ready_condition.message.contains(words),
            "{name}: {}",
            ready_condition.message
        );
        for entry in &got.nodes {
            if failures.contains_key(&entry.node_name) {
                assert!(entry.message.is_some(), "{name}");
            }
        }
    }
    // The quota's word, once the budget stopped the filling.
    let nodes = vec![ready("a", 64, &[])];
    let budget = NodeResources {
        cpus: 6,
        memory_mib: 1 << 20,
        storage_gib: 1 << 14,
    };
    let held = plan(&p, &nodes, &ledger(&[]), &SLOT, now(), &Config::default(), Some(budget)).expect("a plan");
    let got = status(&p, &nodes, &held, &BTreeMap::new(), now());
    let ready_condition = got
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .expect("Ready");
    assert_eq!(
        ready_condition.reason,
        reason::QUOTA_EXCEEDED,
        "{}",
        ready_condition.message
    );
    assert!(
        ready_condition.message.contains("3 slots") && ready_condition.message.contains("leaves 2 CPUs"),
        "names what is missing: {}",
        ready_condition.message
    );
}
#[test]
fn a_slot_is_the_smolvm_admission_would_make_from_the_template() {
    let classes = vec![fixtures::class(
        "medium",
        json!({"resources": {"cpus": 2, "memoryMiB": 2048}}),
        false,
    )];
    let vm = slot_vm(&pool(3, 2), &classes).expect("a SmolVM");
    assert_eq!(vm.spec.image, "python:3.12-slim");
    let resources = vm.spec.resources.clone().unwrap_or_default();
    assert_eq!(
        (resources.cpus, resources.memory_mib),
        (Some(2), Some(2048)),
        "the class's sizes"
    );
    assert_eq!(vm.spec.running, Some(true), "M1 after M3");
    let spec = smolvm_controller::vm::rules::machine_spec(&vm).expect("a machine spec");
    assert_eq!((spec.cpus, spec.memory_mib), (2, 2048));
}

#[test]
fn a_pooled_smolvm_is_placed_first_where_its_slots_are_ready() {
    let nodes = vec![
        node("drained", &[("pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g2", 0, 3)]),
        node("warm", &[("pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g2", 2, 3)]),
        node("older", &[("pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g1", 3, 3)]),
        node("none", &[]),
    ];
    let names: Vec<String> = with_ready_slot(&nodes, "pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g2")
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert_eq!(names, vec!["warm".to_string()]);
    assert!(with_ready_slot(&nodes, "pool-ffffffff-g1").is_empty());
}

#[test]
fn a_pooled_smolvm_is_served_only_by_the_pool_it_was_admitted_for() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use smolvm_api::constants::{ANNOTATION_POOL_GENERATION, ANNOTATION_POOL_UID};
    use smolvm_controller::vm::pooled::{PoolOf, serving};
    let at = |secs: i64| Time(Timestamp::from_second(secs).expect("a time"));
    // (case, the VM's pool-uid annotation, its generation annotation, VM made at, pool made at,
    //  the node pool that may serve it, or None when the pool was replaced)
    type Case = (
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
        i64,
        i64,
        Option<String>,
    );
    let current = |g: i64| Some(format!("pool-{UID}-g{g}"));
    let cases: Vec<Case> = vec![
        ("admitted for this pool", Some(UID), Some("2"), 100, 50, current(2)),
        ("an older template of it", Some(UID), Some("1"), 100, 50, current(1)),
        (
            "the pool made again under the same name",
            Some("a1b2c3d4-0000-4000-8000-000000000000"),
            Some("2"),
            100,
            150,
            None,
        ),
        (
            "a UID sharing the first characters is another pool",
            Some("0d7a3c9e-0000-4000-8000-000000000000"),
            Some("2"),
            100,
            50,
            None,
        ),
        (
            "admitted before UIDs were recorded, pool older",
            None,
            Some("2"),
            100,
            50,
            current(2),
        ),
        (
            "admitted before UIDs were recorded, pool newer",
            None,
            Some("2"),
            100,
            150,
            None,
        ),
    ];
    for (name, uid, generation, vm_at, pool_at, want) in cases {
        let mut annotations = BTreeMap::new();
        if let Some(uid) = uid {
            annotations.insert(ANNOTATION_POOL_UID.to_string(), uid.to_string());
        }
        if let Some(g) = generation {
            annotations.insert(ANNOTATION_POOL_GENERATION.to_string(), g.to_string());
        }
        let mut vm: smolvm_api::SmolVM =
            serde_json::from_value(fixtures::smolvm("claim", json!({"poolRef": {"name": "sandboxes"}})))
                .expect("a SmolVM");
        vm.metadata.annotations = Some(annotations);
        vm.metadata.creation_timestamp = Some(at(vm_at));
        let mut p = pool(3, 2);
        p.metadata.creation_timestamp = Some(at(pool_at));
        let got = serving(&vm, p);
        match want {
            Some(node_pool) => assert_eq!(got.node_pool(), Some(node_pool.as_str()), "{name}"),
            None => assert!(matches!(got, PoolOf::Replaced(_)), "{name}: {got:?}"),
        }
    }
}

/// What wakes the pools' passes and the sweep: pokes that came before a waiter looked are one
/// wake-up for it (and for every other waiter), and a node report with the same pool counts
/// wakes nothing.
#[tokio::test]
async fn pokes_coalesce_and_wake_every_waiter() {
    use futures::{FutureExt, StreamExt};
    let wake = smolvm_controller::vm::PoolsWake::default();
    let (mut passes, mut sweeps) = (wake.pokes().boxed(), wake.pokes().boxed());
    assert_eq!(passes.next().now_or_never(), None, "no poke yet");
    wake.poke();
    wake.poke();
    wake.node_seen(&node("a", &[("pool-x-g1", 1, 2)]));
    assert_eq!(passes.next().now_or_never(), Some(Some(())));
    assert_eq!(passes.next().now_or_never(), None, "three pokes, one wake-up");
    assert_eq!(sweeps.next().now_or_never(), Some(Some(())), "the other waiter too");
    wake.node_seen(&node("a", &[("pool-x-g1", 1, 2)]));
    assert_eq!(passes.next().now_or_never(), None, "the same counts again");
    wake.node_seen(&node("a", &[("pool-x-g1", 2, 2)]));
    assert_eq!(passes.next().now_or_never(), Some(Some(())), "other counts");
}
