//! The quota recount as data (controller/src/quota/recount.rs): charges seen before their objects
//! are never undone, charges whose objects never come are given back after the grace, and
//! shrinks and deletes are given back at once.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec, ResourceQuotaStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use smolvm_api::NodeResources;
use smolvm_api::quota::{Key, Limits};
use smolvm_controller::quota::recount::{Book, Write};

const GRACE: Duration = Duration::from_secs(30);

fn quota(rv: &str, cpus_used: Option<&str>, status_hard: bool) -> Limits {
    let list = |pairs: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), Quantity((*v).to_string())))
            .collect()
    };
    let hard = list(&[("vm.smolvm.dev/cpus", "10"), ("pods", "5")]);
    let q = ResourceQuota {
        metadata: ObjectMeta {
            name: Some("vms".into()),
            namespace: Some("team-a".into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard.clone()),
            ..Default::default()
        }),
        status: Some(ResourceQuotaStatus {
            hard: status_hard.then_some(hard),
            used: cpus_used.map(|c| list(&[("vm.smolvm.dev/cpus", c), ("pods", "1")])),
        }),
    };
    Limits::of(&q).expect("names a product key")
}

fn cpus(n: i64) -> HashMap<String, NodeResources> {
    HashMap::from([(
        "team-a".to_string(),
        NodeResources {
            cpus: n,
            memory_mib: 0,
            storage_gib: 0,
        },
    )])
}

fn write_of(book: &Book) -> Option<i128> {
    let plans = book.plan_all();
    assert!(plans.len() <= 1);
    plans.first().map(|(_, w): &(Limits, Write)| w.used[&Key::Cpus] / 1000)
}

/// One step of a story: a quota version seen, a count, or time passing; then what the book
/// would write (the CPUs figure), if anything.
enum Step {
    Seen(&'static str, &'static str),
    Count(i64),
    After(u64),
}

fn story(name: &str, steps: &[(Step, Option<i128>)]) {
    let start = Instant::now();
    let mut now = start;
    let mut book = Book::new(GRACE);
    for (i, (step, want)) in steps.iter().enumerate() {
        match step {
            Step::Seen(rv, used) => book.observe(&quota(rv, Some(used), true), now),
            Step::Count(n) => book.count_all(&cpus(*n), now),
            Step::After(secs) => now += Duration::from_secs(*secs),
        }
        book.expire(now);
        assert_eq!(write_of(&book), *want, "{name}: after step {i}");
    }
}

#[test]
fn the_recount_never_undoes_a_charge_its_caches_have_not_caught_up_with() {
    use Step::*;
    story(
        "a charge, then its object",
        &[
            (Seen("1", "2"), None),
            (Count(2), None),
            (Seen("2", "4"), None), // the webhook charged 2 CPUs
            (Count(2), None),       // its SmolVM is not in the cache yet: the charge waits
            (After(5), None),
            (Count(4), None), // it appeared
            (After(60), None),
        ],
    );
    story(
        "the object before its charge (two watches)",
        &[
            (Seen("1", "2"), None),
            (Count(2), None),
            (Count(4), Some(4)), // the cache saw the SmolVM first: the quota says 2 for now
            (Seen("2", "4"), None),
            (After(60), None),
        ],
    );
    story(
        "a charge whose write was refused after admission",
        &[
            (Seen("1", "2"), None),
            (Count(2), None),
            (Seen("2", "4"), None),
            (After(29), None),
            (After(2), Some(2)), // past the grace: given back
        ],
    );
    story(
        "a deleted SmolVM frees its share at once",
        &[(Seen("1", "6"), None), (Count(6), None), (Count(4), Some(4))],
    );
    story(
        "a delete while another charge waits keeps the waiting charge",
        &[
            (Seen("1", "6"), None),
            (Count(6), None),
            (Seen("2", "8"), None),
            (Count(4), Some(6)),
            (After(31), Some(4)),
        ],
    );
    story(
        "two charges, one object",
        &[
            (Seen("1", "0"), None),
            (Count(0), None),
            (Seen("2", "1"), None),
            (Seen("3", "2"), None),
            (Count(1), None),
            (After(31), Some(1)),
        ],
    );
    story(
        "at the first look, what the quota says beyond the count waits as a charge",
        &[(Seen("1", "5"), None), (Count(3), None), (After(31), Some(3))],
    );
    story(
        "a count beyond the quota is written at once",
        &[(Seen("1", "1"), None), (Count(3), Some(3))],
    );
}

#[test]
fn the_recounts_own_write_is_not_a_charge() {
    let now = Instant::now();
    let mut book = Book::new(GRACE);
    book.observe(&quota("1", Some("6"), true), now);
    book.count_all(&cpus(4), now);
    book.expire(now + GRACE);
    let plans = book.plan_all();
    let (_, write) = plans.first().expect("a write");
    assert_eq!(write.used[&Key::Cpus], 4000);
    book.wrote(&write.quota, Some("2".into()), &write.used);
    // The watch brings the write back: no raise, nothing more to write.
    book.observe(&quota("2", Some("4"), true), now + GRACE);
    assert!(book.plan_all().is_empty());
    // A later raise by someone else is a charge again.
    book.observe(&quota("3", Some("5"), true), now + GRACE);
    assert!(book.plan_all().is_empty());
}

#[test]
fn where_no_quota_controller_runs_the_recount_writes_the_limits_too() {
    let now = Instant::now();
    let mut book = Book::new(GRACE);
    book.observe(&quota("1", None, false), now);
    book.count_all(&cpus(0), now);
    let plans = book.plan_all();
    let (_, write) = plans.first().expect("status.hard is missing");
    assert!(write.hard);
    assert_eq!(write.used[&Key::Cpus], 0);
    assert_eq!(write.used.len(), 1, "only the keys the quota limits");
}
