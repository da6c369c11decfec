//! The webhook's per-request work in process, without TLS or sockets: the pure review
//! (parse, rules, encode) and the whole admission service (routing, body read, review, metrics,
//! response), next to the parse-and-echo floor's router for comparison.
//!
//! Run: `cargo bench -p smolvm-webhook --features bench --bench handler`
//!
//! For instruction counts, run one case a fixed number of times outside criterion, e.g.
//! `HANDLER_BENCH=service-validate:2000 valgrind --tool=callgrind <bench binary>` and subtract a
//! run with `:0` (the setup) to get instructions per request.

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
    bench_support::{floor_router, review_json},
    review::{Catalogs, Route, review},
    server::{Admission, admission_service},
    state::{AppState, PolicyHandle},
};
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
        let mut total = 0;
        for _ in 1..iters {
            total += run_case(&s, case);
        }
        println!("{case}: {iters} calls, {total} response bytes");
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    for case in CASES {
        c.bench_function(case, |b| b.iter(|| run_case(&s, case)));
    }
    c.final_summary();
}
