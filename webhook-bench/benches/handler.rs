//! The webhook's per-request work in process, without TLS or sockets: the pure review
//! (parse, rules, encode) and the whole admission service (routing, body read, review, metrics,
//! response), next to the parse-and-echo floor's router for comparison.
//!
//! Run: `cargo bench -p smolvm-webhook-bench --bench handler`
//!
//! For instruction counts, run one case a fixed number of times outside criterion, e.g.
//! `HANDLER_BENCH=service-validate:2000 valgrind --tool=callgrind <bench binary>` and subtract a
//! run with `:0` (the setup) to get instructions per request.
//!
//! The `-cold` cases time one review after [`EVICT_BYTES`] of other memory was written, so that
//! its code and data come from L3, as at a modest rate, where other work runs between two
//! reviews. Only the review is timed. Where the misses fall, per function:
//! `HANDLER_BENCH=review-validate:201 HANDLER_BENCH_EVICT=2097152 valgrind --tool=cachegrind
//! --cache-sim=yes --LL=524288,8,64 <bench binary>` (the last level set to one core's L2), then
//! `cg_annotate --sort=ILmr`, less a run with `:1`. Measured 2026-11-28: a validating review
//! reads about 1,250 lines (80 KB) of code from beyond L2, spread over serde's decoding of the
//! spec, the scan, the envelope and the rules, and takes 10-11 µs cold against 9 µs warm. Over the
//! network at 2,000 reviews/s the first review of a request costs more (about 25 µs, against 8
//! µs for a second one run straight after it), so most of that is not these misses.

use std::{hint::black_box, sync::Arc};

use axum::{
    Router,
    body::{Body, Bytes},
    http::{Request, header},
    response::IntoResponse,
};
use criterion::Criterion;
use http_body_util::BodyExt;
use smolvm_api::{Policy, SmolVMClass, SmolVMNode};
use smolvm_webhook::{
    review::{Catalogs, Route, review},
    server::{Admission, admission_service},
    state::{AppState, PolicyHandle},
};
use smolvm_webhook_bench::support::{floor_router, review_json};
use tower::ServiceExt;

struct Setup {
    body: Bytes,
    /// The same review, its SmolVM naming the class `medium` (M3 runs).
    class_body: Bytes,
    classes: Vec<SmolVMClass>,
    policy: Policy,
    nodes: Vec<SmolVMNode>,
    webhook: Admission,
    floor: Router,
    rt: tokio::runtime::Runtime,
}

fn setup() -> Setup {
    let body = Bytes::from(serde_json::to_vec(&review_json()).unwrap_or_default());
    let mut classed = review_json();
    classed["request"]["object"]["spec"]["className"] = serde_json::json!("medium");
    let class_body = Bytes::from(serde_json::to_vec(&classed).unwrap_or_default());
    // The three classes of deploy/examples/classes.yaml.
    let classes = [("small", 1, 2048, 20), ("medium", 2, 4096, 40), ("large", 4, 8192, 80)]
        .into_iter()
        .map(|(name, cpus, memory, storage)| {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMClass",
                "metadata": {"name": name, "generation": 1},
                "spec": {"resources": {"cpus": cpus, "memoryMiB": memory}, "storage": {"storageGiB": storage, "overlayGiB": 10}}
            }))
            .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    // As run by webhook/bench/run.sh: --without-cluster (no nodes), default policy.
    let state = AppState::new(PolicyHandle::new(Policy::default()), Arc::new(Vec::<SmolVMNode>::new()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    Setup {
        body,
        class_body,
        classes,
        policy: Policy::default(),
        nodes: Vec::new(),
        webhook: admission_service(state),
        floor: floor_router(),
        rt,
    }
}

fn call<S>(s: &Setup, service: &S, path: &str) -> usize
where
    S: tower::Service<Request<Body>, Error = std::convert::Infallible> + Clone,
    S::Response: IntoResponse,
{
    let request = Request::builder()
        .method("POST")
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, s.body.len())
        .body(Body::from(s.body.clone()))
        .unwrap_or_else(|e| panic!("{e}"));
    s.rt.block_on(async {
        let response = service
            .clone()
            .oneshot(request)
            .await
            .unwrap_or_else(|e| match e {})
            .into_response();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.map(|c| c.to_bytes());
        body.map(|b| b.len()).unwrap_or_default()
    })
}

fn review_once(s: &Setup, route: Route) -> usize {
    let out = review(route, black_box(&s.body), &s.policy, Catalogs::nodes(&s.nodes)).unwrap_or_else(|e| panic!("{e}"));
    out.body.len()
}

const CASES: [&str; 6] = [
    "review-validate",
    "review-mutate",
    "review-mutate-class",
    "service-validate",
    "service-mutate",
    "router-floor",
];

fn run_case(s: &Setup, case: &str) -> usize {
    match case {
        "review-validate" => review_once(s, Route::ValidateSmolVM),
        "review-mutate" => review_once(s, Route::MutateSmolVM),
        "review-mutate-class" => {
            let catalogs = Catalogs {
                nodes: &s.nodes,
                classes: &s.classes,
                pools: &smolvm_api::pool::NO_POOLS,
                sources: &smolvm_api::branch::NO_SOURCES,
            };
            let out = review(Route::MutateSmolVM, black_box(&s.class_body), &s.policy, catalogs)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                out.outcome.patched && out.outcome.verdict == "allowed",
                "{:?}",
                out.outcome
            );
            out.body.len()
        }
        "service-validate" => call(s, &s.webhook, "/validate/smolvms"),
        "service-mutate" => call(s, &s.webhook, "/mutate/smolvms"),
        "router-floor" => call(s, &s.floor, "/echo"),
        other => panic!("unknown case {other}; one of {CASES:?}"),
    }
}

/// What a `-cold` case writes between two reviews: more than a core's L2 cache (512 KiB on the
/// machines the SPEC's figures come from), so that the review meets its code and data in L3.
const EVICT_BYTES: usize = 2 * 1024 * 1024;

/// Writes one byte of every cache line of `junk`.
fn evict(junk: &mut [u8], round: u8) {
    for byte in junk.iter_mut().step_by(64) {
        *byte = byte.wrapping_add(round);
    }
    black_box(junk);
}

/// `iters` runs of `case`, each after [`evict`]; only the runs are timed.
fn cold(s: &Setup, case: &str, junk: &mut [u8], iters: u64) -> std::time::Duration {
    let mut timed = std::time::Duration::ZERO;
    for i in 0..iters {
        evict(junk, i as u8);
        let start = std::time::Instant::now();
        black_box(run_case(s, case));
        timed += start.elapsed();
    }
    timed
}

fn main() {
    // The webhook logs through a JSON subscriber filtered at info; do the same (to a sink).
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::sink)
        .init();
    let s = setup();
    if let Ok(spec) = std::env::var("HANDLER_BENCH") {
        let (case, iters) = spec.split_once(':').unwrap_or((spec.as_str(), "1000"));
        let iters: u64 = iters.parse().unwrap_or_else(|e| panic!("{e}"));
        // One untimed call first, so that lazily built state is not charged per request.
        if iters > 0 {
            black_box(run_case(&s, case));
        }
        // HANDLER_BENCH_EVICT=bytes: that much memory written before each call (see `evict`).
        let evict_bytes = std::env::var("HANDLER_BENCH_EVICT").map_or(0, |v| {
            v.parse()
                .unwrap_or_else(|e| panic!("HANDLER_BENCH_EVICT={v:?} is not a byte count: {e}"))
        });
        let mut junk = vec![0u8; evict_bytes];
        let mut total = 0;
        for i in 1..iters {
            evict(&mut junk, i as u8);
            total += run_case(&s, case);
        }
        println!("{case}: {iters} calls, {total} response bytes");
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    for case in CASES {
        c.bench_function(case, |b| b.iter(|| run_case(&s, case)));
    }
    let mut junk = vec![0u8; EVICT_BYTES];
    for case in ["review-validate", "review-mutate"] {
        c.bench_function(&format!("{case}-cold"), |b| {
            b.iter_custom(|iters| cold(&s, case, &mut junk, iters))
        });
    }
    c.final_summary();
}
