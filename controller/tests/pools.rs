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
use smolvm_controller::pools::{
    node_pool_name, node_pool_name_at, orphans, plan, pool_holds, slot_vm, status, with_ready_slot,
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
    assert!(plan(&unsaved, &[], &|_| true).is_none());
}

#[test]
fn plan_table() {
    let current = "pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g2";
    let old = "pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g1";
    // (case, nodes, eligible nodes, apply, retire)
    type Case = (
        &'static str,
        Vec<Arc<SmolVMNode>>,
        Vec<&'static str>,
        Vec<&'static str>,
        Vec<(&'static str, &'static str)>,
    );
    let cases: Vec<Case> = vec![
        (
            "a new pool: every eligible node is asked",
            vec![node("a", &[]), node("b", &[])],
            vec!["a", "b"],
            vec!["a", "b"],
            vec![],
        ),
        (
            "an ineligible node is not",
            vec![node("a", &[]), node("b", &[])],
            vec!["b"],
            vec!["b"],
            vec![],
        ),
        (
            "a node that keeps it as asked is left alone",
            vec![node("a", &[(current, 1, 3)])],
            vec!["a"],
            vec![],
            vec![],
        ),
        (
            "other slots: asked again",
            vec![node("a", &[(current, 3, 5)])],
            vec!["a"],
            vec!["a"],
            vec![],
        ),
        (
            "a new template: the old node pool goes, the new one is asked",
            vec![node("a", &[(old, 3, 3)])],
            vec!["a"],
            vec!["a"],
            vec![("a", old)],
        ),
        (
            "a node it no longer matches: its node pool goes",
            vec![node("a", &[(current, 3, 3)]), node("b", &[])],
            vec!["b"],
            vec!["b"],
            vec![("a", current)],
        ),
        (
            "another pool's node pools are not its concern",
            vec![node("a", &[("pool-11111111-g1", 3, 3), (current, 3, 3)])],
            vec!["a"],
            vec![],
            vec![],
        ),
    ];
    let p = pool(3, 2);
    for (name, nodes, eligible, apply, retire) in cases {
        let got = plan(&p, &nodes, &|n: &SmolVMNode| {
            eligible.contains(&n.metadata.name.as_deref().unwrap_or(""))
        })
        .expect("a plan");
        assert_eq!(got.name, current, "{name}");
        assert_eq!(got.apply, apply, "{name}");
        let retire: Vec<(String, String)> = retire.iter().map(|(n, p)| (n.to_string(), p.to_string())).collect();
        assert_eq!(got.retire, retire, "{name}");
        assert_eq!(got.targets.len(), eligible.len(), "{name}");
    }
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
}

#[test]
fn status_table() {
    let current = "pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g2";
    let now = Timestamp::UNIX_EPOCH;
    let p = pool(3, 2);
    // (case, nodes, eligible, failures, ready, total, condition status, reason, message part)
    type Case = (
        &'static str,
        Vec<Arc<SmolVMNode>>,
        Vec<&'static str>,
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
            vec![node("a", &[])],
            vec![],
            vec![],
            0,
            0,
            "False",
            reason::NO_MATCHING_NODES,
            "nodeSelector",
        ),
        (
            "filling",
            vec![node("a", &[(current, 1, 3)]), node("b", &[])],
            vec!["a", "b"],
            vec![],
            1,
            6,
            "False",
            reason::SLOTS_FILLING,
            "1 of 6",
        ),
        (
            "ready",
            vec![node("a", &[(current, 3, 3)])],
            vec!["a"],
            vec![],
            3,
            3,
            "True",
            reason::SLOTS_READY,
            "3 slots ready on 1 node",
        ),
        (
            "a node fails: named, with its cause",
            vec![node("a", &[(current, 3, 3)]), node("b", &[])],
            vec!["a", "b"],
            vec![("b", "image not found")],
            3,
            6,
            "False",
            reason::SLOTS_FAILING,
            "b: image not found",
        ),
        (
            "an older generation's ready slots are not this one's",
            vec![node("a", &[("pool-0d7a3c9e-5f21-4b8e-a6c4-2e9f1b7d3a58-g1", 3, 3)])],
            vec!["a"],
            vec![],
            0,
            3,
            "False",
            reason::SLOTS_FILLING,
            "0 of 3",
        ),
    ];
    for (name, nodes, eligible, failures, ready, total, state, why, words) in cases {
        let plan = plan(&p, &nodes, &|n: &SmolVMNode| {
            eligible.contains(&n.metadata.name.as_deref().unwrap_or(""))
        })
        .expect("a plan");
        let failures: BTreeMap<String, String> = failures.iter().map(|(n, m)| (n.to_string(), m.to_string())).collect();
        let got = status(&p, &nodes, &plan, &failures, now);
        assert_eq!((got.ready_slots, got.total_slots), (Some(ready), Some(total)), "{name}");
        assert_eq!(got.observed_generation, Some(2), "{name}");
        let ready_condition = got
            .conditions
            .iter()
            .find(|c| c.type_ == condition::READY)
            .expect("Ready");
        assert_eq!(
            (ready_condition.status.as_str(), ready_condition.reason.as_str()),
            (state, why),
            "{name}"
        );
        assert!(
            ready_condition.message.contains(words),
            "{name}: {}",
            ready_condition.message
        );
        assert_eq!(
            got.nodes.len(),
            eligible.len(),
            "{name}: one entry per node that keeps slots"
        );
        for entry in &got.nodes {
            assert_eq!(entry.total, 3, "{name}");
            assert_eq!(
                entry.message.is_some(),
                failures.contains_key(&entry.node_name),
                "{name}"
            );
        }
    }
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
fn a_node_pool_holds_its_source_and_its_ready_slots() {
    let slot = NodeResources {
        cpus: 1,
        memory_mib: 128,
        storage_gib: 2,
    };
    for (slots, cpus, memory, storage) in [(0, 1, 128, 2), (3, 4, 512, 8), (-1, 1, 128, 2)] {
        assert_eq!(
            pool_holds(&slot, slots),
            NodeResources {
                cpus,
                memory_mib: memory,
                storage_gib: storage
            },
            "{slots} slots"
        );
    }
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
