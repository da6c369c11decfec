//! Default plus validate of a typical SmolVM (the seed's alpine example), as the webhook does it
//! per request. Target: median 20 µs or less.
//!
//! Run: `cargo bench -p smolvm-api --bench admission`

use criterion::{Criterion, criterion_group, criterion_main};
use smolvm_api::{
    defaulting::default_smolvm,
    fixtures,
    policy::Policy,
    validate::{Context, Operation, validate_smolvm_json},
};

fn admission(c: &mut Criterion) {
    let object = fixtures::alpine();
    let bytes = serde_json::to_vec(&object).unwrap();
    let policy = Policy::default();
    let nodes: Vec<_> = (0..100)
        .map(|i| fixtures::node(&format!("node-{i}"), 16, 65536, 1000))
        .collect();
    let identity = fixtures::user();
    let ctx = Context {
        policy: &policy,
        nodes: &nodes,
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
        identity: &identity,
    };

    c.bench_function("default+validate alpine (create, 100 nodes)", |b| {
        b.iter(|| {
            let patch = default_smolvm(Operation::Create, std::hint::black_box(&object));
            let mut defaulted = object.clone();
            json_patch::patch(&mut defaulted, &patch).unwrap();
            let verdict = validate_smolvm_json(Operation::Create, None, &defaulted, &ctx);
            assert!(verdict.allowed());
            verdict
        })
    });

    c.bench_function("parse+default+validate alpine (create, 100 nodes)", |b| {
        b.iter(|| {
            let object: serde_json::Value = serde_json::from_slice(std::hint::black_box(&bytes)).unwrap();
            let patch = default_smolvm(Operation::Create, &object);
            let mut defaulted = object;
            json_patch::patch(&mut defaulted, &patch).unwrap();
            validate_smolvm_json(Operation::Create, None, &defaulted, &ctx)
        })
    });

    let old = fixtures::bound(object.clone(), "node-a");
    let mut new = old.clone();
    new["spec"]["resources"]["cpus"] = serde_json::json!(2);
    c.bench_function("validate bound update (resize)", |b| {
        b.iter(|| validate_smolvm_json(Operation::Update, Some(&old), std::hint::black_box(&new), &ctx))
    });
}

criterion_group!(benches, admission);
criterion_main!(benches);
