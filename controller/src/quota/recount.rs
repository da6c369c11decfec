//! The recount, as data: what each quota's `vm.smolvm.dev/*` figures should say, given what the
//! caches hold and the charges seen, and the write that makes them say it.
//!
//! A quota's `status.used` is raised by charges (the webhook's, for users' writes; the pool
//! keeper's) before what they were made for appears in the caches: a SmolVM is stored after its
//! admission, a pool's slot is reported by its node after it was asked for. A recount must not
//! undo such a charge, so [`Book`] keeps each raise it sees as *pending* until usage grows by as
//! much (the object appeared) or the grace passes (the write was refused after admission, or
//! never made: its charge is then given back). Growth seen before its raise (the two come
//! through different watches) is kept as *credit* for the raise to meet, for as long.
//!
//! The figure a quota should say is then what the caches count plus what is pending; where it
//! says otherwise, [`Book::plan`] gives the write: the figures of every product key the quota
//! limits, with the resourceVersion read as precondition (a charge made meanwhile makes it fail,
//! and the next look plans again). A deleted SmolVM's share is so given back at once. Where no
//! quota controller runs (it copies `spec.hard` into `status.hard`), the write carries
//! `status.hard` for the product's keys too, so `kubectl describe quota` shows them.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use smolvm_api::{
    NodeResources,
    quota::{Key, Limits},
};

/// How long a charge seen before its object may stay unmatched, by default: longer than any
/// admission chain takes (the API server gives each webhook at most 30 s).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// Amounts waiting to be matched, oldest first, each with when it was seen.
type Queue = VecDeque<(i128, Instant)>;

/// What the book knows of one quota.
#[derive(Debug, Default)]
struct Seen {
    /// The version last seen through the watch: what a write is planned from, and its
    /// precondition (a charge made since makes the write fail, and the next look plans again).
    limits: Option<Limits>,
    /// The figures last seen (or written) of each product key.
    used: BTreeMap<Key, i128>,
    /// What the caches counted in its namespace at the last look.
    counted: Option<NodeResources>,
    /// Raises not yet matched by growth.
    pending: BTreeMap<Key, Queue>,
    /// Growth not yet matched by a raise.
    credit: BTreeMap<Key, Queue>,
    /// The resourceVersions of the recount's own writes (not charges).
    own: HashSet<String>,
}

/// `amount` taken from the front of `queue`; what is left of it.
fn consume(queue: &mut Queue, mut amount: i128) -> i128 {
    while amount > 0 {
        let Some((front, _)) = queue.front_mut() else { break };
        let taken = amount.min(*front);
        *front -= taken;
        amount -= taken;
        if *front == 0 {
            queue.pop_front();
        }
    }
    amount
}

/// The write that makes a quota say what the recount found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// `namespace/name`.
    pub quota: String,
    /// The figures of every product key the quota limits.
    pub used: BTreeMap<Key, i128>,
    /// Whether `status.hard` of the product's keys must be written too.
    pub hard: bool,
}

/// The charges seen and matched, per quota (`namespace/name`).
#[derive(Debug)]
pub struct Book {
    grace: Duration,
    quotas: HashMap<String, Seen>,
}

/// `namespace/name` of a quota.
pub fn quota_key(limits: &Limits) -> String {
    format!("{}/{}", limits.namespace, limits.name)
}

impl Book {
    /// A book whose unmatched charges and growth last `grace`.
    pub fn new(grace: Duration) -> Self {
        Book {
            grace,
            quotas: HashMap::new(),
        }
    }

    /// A version of a quota seen through the watch: every raise of a product key that is not
    /// the recount's own write is a charge.
    pub fn observe(&mut self, limits: &Limits, now: Instant) {
        let seen = self.quotas.entry(quota_key(limits)).or_default();
        let figures: BTreeMap<Key, i128> = limits.hard.keys().map(|k| (*k, limits.used_milli(*k))).collect();
        let own = limits.resource_version.as_ref().is_some_and(|rv| seen.own.contains(rv));
        if seen.counted.is_some() && !own {
            for (key, figure) in &figures {
                let raise = figure - seen.used.get(key).copied().unwrap_or(0);
                if raise > 0 {
                    let left = consume(seen.credit.entry(*key).or_default(), raise);
                    if left > 0 {
                        seen.pending.entry(*key).or_default().push_back((left, now));
                    }
                }
            }
        }
        seen.used = figures;
        seen.limits = Some(limits.clone());
    }

    /// A quota deleted: forgotten.
    pub fn forget(&mut self, quota: &str) {
        self.quotas.remove(quota);
    }

    /// The namespaces of the quotas seen: those whose usage [`Book::count_all`] needs.
    pub fn namespaces(&self) -> HashSet<String> {
        self.quotas
            .values()
            .filter_map(|s| s.limits.as_ref().map(|l| l.namespace.clone()))
            .collect()
    }

    /// [`Book::count`] of every quota seen, with `counted` its namespace's usage (none: zero).
    pub fn count_all(&mut self, counted: &HashMap<String, NodeResources>, now: Instant) {
        let limits: Vec<Limits> = self.quotas.values().filter_map(|s| s.limits.clone()).collect();
        for l in limits {
            let usage = counted.get(&l.namespace).copied().unwrap_or_default();
            self.count(&l, &usage, now);
        }
    }

    /// Every write the quotas seen need ([`Book::plan`]), sorted by quota.
    pub fn plan_all(&self) -> Vec<(Limits, Write)> {
        let mut out: Vec<(Limits, Write)> = self
            .quotas
            .values()
            .filter_map(|s| s.limits.as_ref())
            .filter_map(|l| self.plan(l).map(|w| (l.clone(), w)))
            .collect();
        out.sort_by(|a, b| a.1.quota.cmp(&b.1.quota));
        out
    }

    /// What the caches count in the namespace of `limits` now: growth since the last look meets
    /// the pending charges first, and is kept as credit beyond them. At the first look, whatever
    /// the quota says beyond the count is taken as pending (charges made before this controller
    /// started whose objects the caches do not show yet).
    pub fn count(&mut self, limits: &Limits, counted: &NodeResources, now: Instant) {
        let seen = self.quotas.entry(quota_key(limits)).or_default();
        match seen.counted {
            None => {
                for key in limits.hard.keys() {
                    let beyond = seen.used.get(key).copied().unwrap_or(0) - key.milli(counted);
                    if beyond > 0 {
                        seen.pending.entry(*key).or_default().push_back((beyond, now));
                    }
                }
            }
            Some(before) => {
                for key in limits.hard.keys() {
                    let growth = key.milli(counted) - key.milli(&before);
                    if growth > 0 {
                        let left = consume(seen.pending.entry(*key).or_default(), growth);
                        if left > 0 {
                            seen.credit.entry(*key).or_default().push_back((left, now));
                        }
                    }
                }
            }
        }
        seen.counted = Some(*counted);
    }

    /// Forgets charges and growth older than the grace.
    pub fn expire(&mut self, now: Instant) {
        let grace = self.grace;
        for seen in self.quotas.values_mut() {
            for queue in seen.pending.values_mut().chain(seen.credit.values_mut()) {
                queue.retain(|(_, at)| now.saturating_duration_since(*at) < grace);
            }
        }
    }

    /// The write `limits` needs, if its figures are not what the count and the pending charges
    /// make them (or its `status.hard` lacks the product's limits); `None` before its
    /// namespace was counted.
    pub fn plan(&self, limits: &Limits) -> Option<Write> {
        let seen = self.quotas.get(&quota_key(limits))?;
        let counted = seen.counted?;
        let used: BTreeMap<Key, i128> = limits
            .hard
            .keys()
            .map(|key| {
                let pending: i128 = seen.pending.get(key).into_iter().flatten().map(|(a, _)| a).sum();
                (*key, key.milli(&counted) + pending)
            })
            .collect();
        let differs = used.iter().any(|(key, figure)| *figure != limits.used_milli(*key));
        let hard = !limits.status_hard_current();
        (differs || hard).then(|| Write {
            quota: quota_key(limits),
            used,
            hard,
        })
    }

    /// The recount's own write of `quota` was answered with `resource_version`: its figures are
    /// not a charge.
    pub fn wrote(&mut self, quota: &str, resource_version: Option<String>, used: &BTreeMap<Key, i128>) {
        let seen = self.quotas.entry(quota.to_string()).or_default();
        if let Some(rv) = resource_version {
            // A handful is enough: the watch brings each write back within moments.
            if seen.own.len() >= 16 {
                seen.own.clear();
            }
            seen.own.insert(rv);
        }
        for (key, figure) in used {
            seen.used.insert(*key, *figure);
        }
    }
}
