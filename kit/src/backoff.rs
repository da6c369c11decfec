//! The one retry backoff of the binaries: failures in a row per key, and how long the next try
//! waits, from a [`Schedule`] (a first wait, doubling, capped), as client-go's
//! `wait.Backoff` and the kubelet's CrashLoopBackOff do.
//!
//! Every retry loop uses it: the accept loops (one key, 5 ms to 1 s), the runtime's restarts of
//! `smolvm serve`, the controller's held starts (per SmolVM, 10 s to 5 minutes), its unsettled
//! passes (per SmolVM, 1 s to 30 s), its node-label mirror and its pool calls (per node and
//! node pool). The schedule is a pure function of the count; [`Backoff`] only keeps the counts
//! and when the last failure came, with what the caller wants to remember of it.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A first wait, doubled after each further failure, never over a most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// The wait after the first failure.
    pub first: Duration,
    /// The longest wait.
    pub most: Duration,
}

impl Schedule {
    /// `first`, doubling to `most`.
    pub const fn new(first: Duration, most: Duration) -> Self {
        Schedule { first, most }
    }

    /// The wait after `failures` failures in a row: none before the first, then `first`, doubled
    /// for each one after it, at most `most`.
    pub fn after(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        // 2^31 of anything is past any cap; the shift stays in range.
        let doublings = (failures - 1).min(31);
        self.first.saturating_mul(1u32 << doublings).min(self.most)
    }
}

/// One key's failures in a row, when the last came, and what the caller keeps of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failures<T> {
    /// Failures in a row.
    pub count: u32,
    /// When the last one came.
    pub at: Instant,
    /// What the caller keeps of the last one (its message, the generation it failed at).
    pub last: T,
}

/// Failures in a row per key, on one [`Schedule`].
#[derive(Debug, Clone)]
pub struct Backoff<K, T = ()> {
    schedule: Schedule,
    keys: HashMap<K, Failures<T>>,
}

impl<K: Hash + Eq, T> Backoff<K, T> {
    /// No failures yet.
    pub fn new(schedule: Schedule) -> Self {
        Backoff {
            schedule,
            keys: HashMap::new(),
        }
    }

    /// The schedule.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// One more failure of `key` at `at`, keeping `last`; the wait before its next try.
    pub fn failed(&mut self, key: K, at: Instant, last: T) -> Duration {
        let count = self.keys.get(&key).map_or(1, |f| f.count.saturating_add(1));
        self.keys.insert(key, Failures { count, at, last });
        self.schedule.after(count)
    }

    /// `key` succeeded (or is gone): its next failure is a first one again.
    pub fn succeeded<Q>(&mut self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.keys.remove(key);
    }

    /// How long `key` still waits at `now`; `None` when it may be tried.
    pub fn remaining<Q>(&self, key: &Q, now: Instant) -> Option<Duration>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let failures = self.keys.get(key)?;
        self.schedule
            .after(failures.count)
            .checked_sub(now.saturating_duration_since(failures.at))
            .filter(|wait| !wait.is_zero())
    }

    /// Whether `key` may be tried at `now`.
    pub fn due<Q>(&self, key: &Q, now: Instant) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remaining(key, now).is_none()
    }

    /// `key`'s failures, if it has any.
    pub fn get<Q>(&self, key: &Q) -> Option<&Failures<T>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.keys.get(key)
    }

    /// Every key with failures.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &Failures<T>)> {
        self.keys.iter()
    }

    /// Keeps only the keys `keep` says.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.keys.retain(|k, _| keep(k));
    }

    /// Whether no key has failures.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_schedule_doubles_from_its_first_wait_to_its_most() {
        let table: &[(Schedule, &[(u32, Duration)])] = &[
            // The accept loops.
            (
                Schedule::new(5 * MS, S),
                &[
                    (0, Duration::ZERO),
                    (1, 5 * MS),
                    (2, 10 * MS),
                    (3, 20 * MS),
                    (8, 640 * MS),
                    (9, S),
                    (50, S),
                ],
            ),
            // Held starts, pool calls.
            (
                Schedule::new(10 * S, 300 * S),
                &[
                    (1, 10 * S),
                    (2, 20 * S),
                    (5, 160 * S),
                    (6, 300 * S),
                    (u32::MAX, 300 * S),
                ],
            ),
            // Unsettled passes.
            (
                Schedule::new(S, 30 * S),
                &[(1, S), (2, 2 * S), (5, 16 * S), (6, 30 * S), (7, 30 * S)],
            ),
            // A first wait over the most is the most.
            (Schedule::new(10 * S, S), &[(1, S), (2, S)]),
        ];
        for (schedule, rows) in table {
            for (failures, wait) in *rows {
                assert_eq!(schedule.after(*failures), *wait, "{schedule:?} after {failures}");
            }
        }
    }

    #[test]
    fn a_key_waits_its_schedule_after_each_failure_and_not_after_a_success() {
        let t0 = Instant::now();
        let mut backoff: Backoff<String, &str> = Backoff::new(Schedule::new(10 * S, 300 * S));
        assert!(backoff.due("a", t0));
        assert_eq!(backoff.failed("a".into(), t0, "refused"), 10 * S);
        assert_eq!(backoff.remaining("a", t0 + 4 * S), Some(6 * S));
        assert!(!backoff.due("a", t0 + 9 * S));
        assert!(backoff.due("a", t0 + 10 * S));
        assert!(backoff.due("b", t0), "another key is not held");
        assert_eq!(backoff.failed("a".into(), t0 + 10 * S, "timed out"), 20 * S);
        let failures = backoff.get("a").map(|f| (f.count, f.last));
        assert_eq!(failures, Some((2, "timed out")));
        backoff.succeeded("a");
        assert!(backoff.due("a", t0 + 10 * S));
        assert_eq!(
            backoff.failed("a".into(), t0 + 11 * S, "refused"),
            10 * S,
            "a first failure again"
        );
        backoff.retain(|k| k != "a");
        assert!(backoff.is_empty());
    }
}
