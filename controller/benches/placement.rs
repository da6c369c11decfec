//! One placement decision among 1,000 nodes with 10,000 bound VMs. Target: 1 ms or less.
//!
//! Run: `cargo bench -p smolvm-controller --bench placement`

use std::collections::BTreeMap;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::jiff::Timestamp;
use smolvm_api::{NodeResources, Protocol, SmolVMNode, fixtures};
use smolvm_controller::placement::{Config, Ledger, Request};

fn node(i: usize, now: Timestamp) -> SmolVMNode {
    let resources = NodeResources {
        cpus: 64,
        memory_mib: 256 * 1024,
        storage_gib: 4000,
    };
    let mut node = fixtures::ready_node(&format!("node-{i:04}"), resources, now);
    if let Some(labels) = node.metadata.labels.as_mut() {
        labels.insert("topology.kubernetes.io/zone".to_string(), format!("zone-{}", i % 3));
    }
    node
}

fn bench(c: &mut Criterion) {
    let now = Timestamp::now();
    let cfg = Config::default();
    let nodes: Vec<SmolVMNode> = (0..1000).map(|i| node(i, now)).collect();
    let ledger = Ledger::new();
    for vm in 0..10_000i32 {
        let request = Request {
            resources: NodeResources {
                cpus: 2,
                memory_mib: 4096,
                storage_gib: 30,
            },
            host_ports: vec![(10_000 + vm / 1000, Protocol::Tcp)],
            node_selector: BTreeMap::new(),
            pin: None,
            source: None,
            volumes: Vec::new(),
        };
        ledger.observe_bound(&format!("vm-{vm}"), &format!("node-{:04}", vm % 1000), &request);
    }
    let request = Request {
        resources: NodeResources {
            cpus: 2,
            memory_mib: 4096,
            storage_gib: 30,
        },
        host_ports: vec![(8080, Protocol::Tcp)],
        node_selector: BTreeMap::from([("kubernetes.io/arch".to_string(), "amd64".to_string())]),
        pin: None,
        source: None,
        volumes: Vec::new(),
    };
    c.bench_function("place among 1000 nodes with 10000 bound VMs", |b| {
        b.iter(|| {
            let node = ledger.place_and_reserve("new-vm", &request, &nodes, now, &cfg).unwrap();
            ledger.release("new-vm");
            node
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
