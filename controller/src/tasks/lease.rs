//! Leader election on a coordination.k8s.io Lease: one controller replica acts at a time.
//!
//! The holder renews the lease every `renew` interval; another replica takes it over only after
//! `duration` has passed without renewal. Writes use the lease's resourceVersion, so two
//! candidates can never both believe they won.
//!
//! Every acquire/renew attempt is bounded by [`Timing::attempt`] (shorter than the renew
//! interval), so a hung API call cannot stall the loop. The holder keeps leading through failed
//! renewals only until [`Timing::deadline`] has passed since the start of its last successful
//! renewal (a monotonic clock); then it steps down, before any standby may take the lease over.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::{sync::watch, time::Instant};

/// Settings of the election.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// How long a lease lasts without renewal.
    pub duration: Duration,
    /// How often the holder renews, and candidates retry.
    pub renew: Duration,
}

/// What a candidate should do with a lease it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it.
    Acquire,
    /// Someone else holds a live lease.
    Wait {
        /// The holder.
        holder: String,
    },
}

/// Pure decision on a lease spec. `unchanged_for` is how long, on this replica's monotonic
/// clock, the lease's record (holder and renew time) has looked as it does now: a standby judges
/// expiry by its own clock from the moment it last saw the holder renew, as client-go does, never
/// by comparing the holder's `renewTime` with its own wall clock (a standby whose clock runs
/// ahead would take over early).
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> Decision {
    let Some(spec) = spec else { return Decision::Acquire };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == identity {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::Acquire;
    }
    let seconds = u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(0);
    if unchanged_for <= Duration::from_secs(seconds) {
        Decision::Wait { holder }
    } else {
        Decision::Acquire
    }
}

/// The lease's record as a standby watches it: who holds it and when they last renewed (their
/// clock's reading, compared only for change), and when this replica first saw it so.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    record: Option<(Option<String>, Option<MicroTime>)>,
    since: Option<Instant>,
}

impl Observed {
    /// Notes the record of `spec` and returns how long it has been unchanged.
    pub fn note(&mut self, spec: Option<&LeaseSpec>) -> Duration {
        let record = spec.map(|s| {
            (
                s.holder_identity.clone(),
                s.renew_time.clone().or_else(|| s.acquire_time.clone()),
            )
        });
        if self.since.is_none() || self.record != record {
            self.record = record;
            self.since = Some(Instant::now());
        }
        self.since.map(|t| t.elapsed()).unwrap_or_default()
    }
}

/// Outcome of one acquire/renew attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The lease was written with us as holder.
    Held,
    /// Someone else holds a live lease, or won a write race (409): the lease is lost.
    NotHeld,
    /// The API call failed or timed out: we do not know.
    Failed,
}

/// Time bounds of the election, derived from a [`LeaseConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Bound on one acquire/renew attempt (the GET and the write together): shorter than the
    /// renew interval.
    pub attempt: Duration,
    /// How long after the start of its last successful renewal the holder keeps leading through
    /// failed renewals: the lease duration less one renew interval (as client-go's renewDeadline
    /// sits below its leaseDuration), so the holder stops before a standby can take over even
    /// with some clock skew and time to stop in-flight work. At least half the lease duration,
    /// so a configuration with `renew >= duration` still leads between renewals.
    pub deadline: Duration,
    /// The renew interval.
    pub renew: Duration,
}

impl Timing {
    /// The bounds for `config`.
    pub fn new(config: &LeaseConfig) -> Self {
        Timing {
            attempt: config.renew.mul_f64(0.8),
            deadline: config.duration.saturating_sub(config.renew).max(config.duration / 2),
            renew: config.renew,
        }
    }

    /// Pure: whether this replica leads after an attempt. `since_renewed` is the monotonic time
    /// since the start of the last successful attempt (this one, if it succeeded); `None` if
    /// none succeeded since the lease was last lost.
    pub fn leads(&self, attempt: Attempt, since_renewed: Option<Duration>) -> bool {
        match attempt {
            Attempt::NotHeld => false,
            Attempt::Held | Attempt::Failed => since_renewed.is_some_and(|s| s < self.deadline),
        }
    }

    /// Pure: the bound on the next attempt. A holder's attempt also ends by its deadline, so a
    /// hung renewal cannot keep it leading past it.
    pub fn attempt_limit(&self, since_renewed: Option<Duration>) -> Duration {
        match since_renewed {
            Some(s) if s < self.deadline => self.attempt.min(self.deadline - s),
            _ => self.attempt,
        }
    }

    /// Pure: how long to wait before the next attempt. A holder wakes by its deadline at the
    /// latest, to step down on time.
    pub fn wait(&self, since_renewed: Option<Duration>) -> Duration {
        match since_renewed {
            Some(s) if s < self.deadline => self.renew.min(self.deadline - s),
            _ => self.renew,
        }
    }
}

/// Runs the election until `shutdown` fires; `leader` tells whether this replica leads. On
/// shutdown a held lease is released so a successor takes over at once.
///
/// Leadership is lost (`leader` set to false) when another replica holds the lease, or when no
/// renewal has succeeded within [`Timing::deadline`]; each API call is bounded by
/// [`Timing::attempt`].
pub async fn run(
    client: Client,
    config: LeaseConfig,
    leader: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let timing = Timing::new(&config);
    // Start of the last successful attempt, on the monotonic clock.
    let mut renewed: Option<Instant> = None;
    let mut observed = Observed::default();
    loop {
        let since = |renewed: Option<Instant>| renewed.map(|t| t.elapsed());
        // Past the deadline without a renewal: step down before trying again.
        if *leader.borrow() && !timing.leads(Attempt::Failed, since(renewed)) {
            tracing::warn!(identity = %config.identity, lease = %config.name, "no lease renewal within the deadline; stepping down");
            leader.send_replace(false);
        }
        let limit = timing.attempt_limit(since(renewed));
        let started = Instant::now();
        let attempt = match tokio::time::timeout(limit, step(&api, &config, &mut observed)).await {
            Ok(Ok(true)) => Attempt::Held,
            Ok(Ok(false)) => Attempt::NotHeld,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, lease = %config.name, "lease update failed");
                Attempt::Failed
            }
            Err(_) => {
                tracing::warn!(lease = %config.name, timeout_ms = limit.as_millis(), "lease update timed out");
                Attempt::Failed
            }
        };
        match attempt {
            Attempt::Held => renewed = Some(started),
            Attempt::NotHeld => renewed = None,
            Attempt::Failed => {}
        }
        let held = timing.leads(attempt, since(renewed));
        if *leader.borrow() != held {
            tracing::info!(leader = held, identity = %config.identity, "leadership changed");
        }
        leader.send_replace(held);
        tokio::select! {
            _ = tokio::time::sleep(timing.wait(since(renewed))) => {}
            _ = shutdown.changed() => break,
        }
    }
    if *leader.borrow() {
        leader.send_replace(false);
        let release = async {
            if let Ok(mut lease) = api.get(&config.name).await
                && let Some(spec) = lease.spec.as_mut()
                && spec.holder_identity.as_deref() == Some(config.identity.as_str())
            {
                spec.holder_identity = None;
                let _ = api.replace(&config.name, &PostParams::default(), &lease).await;
            }
        };
        if tokio::time::timeout(timing.attempt, release).await.is_err() {
            tracing::warn!(lease = %config.name, "releasing the lease timed out; it expires on its own");
        }
    }
}

/// Runs `work` while this replica leads. When leadership is lost, `work` is dropped at once:
/// every in-flight reconcile, node call and write it holds is cancelled, before any standby can
/// take the lease over (the holder steps down at [`Timing::deadline`], at least one renew
/// interval before a standby judges the lease expired). Returns `None` then, or `work`'s output
/// if it finished first.
pub async fn while_leading<F: std::future::Future>(work: F, mut leader: watch::Receiver<bool>) -> Option<F::Output> {
    let lost = async move {
        loop {
            if !*leader.borrow_and_update() {
                return;
            }
            if leader.changed().await.is_err() {
                // The election is gone: nothing vouches for the lease any more.
                return;
            }
        }
    };
    tokio::select! {
        output = work => Some(output),
        () = lost => None,
    }
}

async fn step(api: &Api<Lease>, config: &LeaseConfig, observed: &mut Observed) -> Result<bool, kube::Error> {
    // Written into the lease for humans and other tools; never compared with another clock here.
    let now = Timestamp::now();
    let existing = api.get_opt(&config.name).await?;
    let spec = existing.as_ref().and_then(|l| l.spec.as_ref());
    let unchanged_for = observed.note(spec);
    let decision = decide(spec, &config.identity, unchanged_for);
    let seconds = i32::try_from(config.duration.as_secs()).unwrap_or(i32::MAX);
    match (decision, existing) {
        (Decision::Wait { .. }, _) => Ok(false),
        (decision, Some(mut lease)) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if decision == Decision::Acquire {
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.holder_identity = Some(config.identity.clone());
            spec.lease_duration_seconds = Some(seconds);
            spec.renew_time = Some(MicroTime(now));
            match api.replace(&config.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        (_, None) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(config.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(config.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::SignedDuration;

    use super::*;

    fn spec(holder: Option<&str>, renewed_secs_ago: Option<i64>, now: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: renewed_secs_ago.map(|s| MicroTime(now - SignedDuration::from_secs(s))),
            ..Default::default()
        }
    }

    #[test]
    fn lease_decisions() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let s = Duration::from_secs;
        let wait = Decision::Wait { holder: "other".into() };
        // (case, lease, time the record has been unchanged here, decision)
        let cases = [
            ("no lease", None, s(0), Decision::Acquire),
            ("ours", Some(spec(Some("me"), Some(1), now)), s(100), Decision::Renew),
            (
                "held, renewal just seen",
                Some(spec(Some("other"), Some(5), now)),
                s(0),
                wait.clone(),
            ),
            (
                "held, unchanged within the duration",
                Some(spec(Some("other"), Some(5), now)),
                s(15),
                wait.clone(),
            ),
            (
                "held, unchanged past the duration",
                Some(spec(Some("other"), Some(5), now)),
                s(16),
                Decision::Acquire,
            ),
            // The holder's renewTime, however old or new by this replica's wall clock, only
            // marks change: a standby whose clock runs 60 s ahead still waits a full duration.
            (
                "renewTime far behind our clock",
                Some(spec(Some("other"), Some(3600), now)),
                s(1),
                wait.clone(),
            ),
            ("released", Some(spec(None, Some(1), now)), s(0), Decision::Acquire),
        ];
        for (name, lease, unchanged_for, expected) in cases {
            assert_eq!(decide(lease.as_ref(), "me", unchanged_for), expected, "{name}");
        }
    }

    #[tokio::test]
    async fn losing_the_lease_cancels_the_work_at_once() {
        use std::sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        };
        struct Guard(Arc<AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let (tx, rx) = watch::channel(true);
        let cancelled = Arc::new(AtomicBool::new(false));
        let guard = Guard(cancelled.clone());
        // A reconcile stuck in a 300 s node call.
        let work = async move {
            let _guard = guard;
            tokio::time::sleep(Duration::from_secs(300)).await;
        };
        let running = tokio::spawn(while_leading(work, rx));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!cancelled.load(Ordering::SeqCst), "cancelled while still leading");
        let t = std::time::Instant::now();
        tx.send_replace(false);
        let outcome = tokio::time::timeout(Duration::from_secs(1), running).await;
        assert!(matches!(outcome, Ok(Ok(None))), "{outcome:?}");
        assert!(cancelled.load(Ordering::SeqCst), "the in-flight work was not dropped");
        assert!(t.elapsed() < Duration::from_millis(500));
        // Work that finishes while leading returns its output; never leading returns at once.
        let (_tx, rx) = watch::channel(true);
        assert_eq!(while_leading(async { 7 }, rx).await, Some(7));
        let (_tx, rx) = watch::channel(false);
        assert_eq!(while_leading(std::future::pending::<()>(), rx).await, None);
    }

    #[test]
    fn a_standby_measures_expiry_from_the_last_change_it_saw() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut observed = Observed::default();
        let first = spec(Some("other"), Some(0), now);
        assert!(observed.note(Some(&first)) < Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            observed.note(Some(&first)) >= Duration::from_millis(60),
            "same record: time runs on"
        );
        let renewed = spec(Some("other"), Some(0), now + SignedDuration::from_secs(5));
        assert!(
            observed.note(Some(&renewed)) < Duration::from_millis(50),
            "a renewal restarts the clock"
        );
        let new_holder = spec(Some("third"), Some(0), now + SignedDuration::from_secs(5));
        assert!(
            observed.note(Some(&new_holder)) < Duration::from_millis(50),
            "a new holder restarts it"
        );
    }

    fn timing(duration_secs: u64, renew_secs: u64) -> Timing {
        Timing::new(&LeaseConfig {
            namespace: "ns".into(),
            name: "lease".into(),
            identity: "me".into(),
            duration: Duration::from_secs(duration_secs),
            renew: Duration::from_secs(renew_secs),
        })
    }

    #[test]
    fn renewal_timing_decisions() {
        let ms = Duration::from_millis;
        let t = timing(15, 5);
        assert_eq!(
            t,
            Timing {
                attempt: ms(4000),
                deadline: ms(10_000),
                renew: ms(5000)
            },
            "an attempt ends before the next renewal; the deadline sits below the lease duration"
        );
        assert_eq!(
            timing(5, 10).deadline,
            ms(2500),
            "renew >= duration still leads a while"
        );

        // (attempt, time since the start of the last successful renewal, leads?)
        let leads = [
            ("renewed", Attempt::Held, Some(ms(50)), true),
            (
                "renewed, but the call outlasted the deadline",
                Attempt::Held,
                Some(ms(10_000)),
                false,
            ),
            (
                "a failure soon after a renewal keeps the lease",
                Attempt::Failed,
                Some(ms(3000)),
                true,
            ),
            (
                "a failure just inside the deadline keeps it",
                Attempt::Failed,
                Some(ms(9999)),
                true,
            ),
            (
                "no renewal within the deadline steps down",
                Attempt::Failed,
                Some(ms(10_000)),
                false,
            ),
            ("long past the deadline", Attempt::Failed, Some(ms(60_000)), false),
            ("a failure without a renewal never leads", Attempt::Failed, None, false),
            (
                "a lost lease steps down at once",
                Attempt::NotHeld,
                Some(ms(1000)),
                false,
            ),
            ("a standby stays one", Attempt::NotHeld, None, false),
        ];
        for (name, attempt, since, expected) in leads {
            assert_eq!(t.leads(attempt, since), expected, "{name}");
        }

        // (time since the last renewal, attempt bound, wait before the next attempt)
        let bounds = [
            (None, ms(4000), ms(5000)),
            (Some(ms(0)), ms(4000), ms(5000)),
            (Some(ms(7000)), ms(3000), ms(3000)),
            (Some(ms(9500)), ms(500), ms(500)),
            (Some(ms(10_000)), ms(4000), ms(5000)),
            (Some(ms(30_000)), ms(4000), ms(5000)),
        ];
        for (since, limit, wait) in bounds {
            assert_eq!(t.attempt_limit(since), limit, "attempt bound at {since:?}");
            assert_eq!(t.wait(since), wait, "wait at {since:?}");
            assert!(limit < t.renew, "an attempt is shorter than the renew interval");
            if let Some(s) = since.filter(|s| *s < t.deadline) {
                assert!(s + limit <= t.deadline, "a holder's attempt ends by its deadline");
                assert!(s + wait <= t.deadline, "a holder wakes by its deadline");
            }
        }
    }

    /// The API server answers the first GET (404) and the create, then never answers again: the
    /// holder must step down before the lease duration has passed since it acquired the lease.
    #[tokio::test]
    async fn a_hung_renewal_steps_down_before_the_lease_expires() {
        use std::sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        };

        use http::Method;
        use smolvm_testkit::apiserver;

        let (client, mut handle) = apiserver::client("default");
        let config = LeaseConfig {
            namespace: "smolvm-system".into(),
            name: "smolvm-controller".into(),
            identity: "me".into(),
            duration: Duration::from_secs(3),
            renew: Duration::from_secs(1),
        };
        let (leader_tx, mut leader_rx) = watch::channel(false);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(run(client, config.clone(), leader_tx, shutdown_rx));

        let call = apiserver::next_call(&mut handle).await;
        assert_eq!(call.method, Method::GET);
        call.answer(404, &apiserver::not_found("leases", "smolvm-controller"));
        let call = apiserver::next_call(&mut handle).await;
        assert_eq!(call.method, Method::POST);
        let body = call.body.clone();
        call.answer(201, &body);

        tokio::time::timeout(Duration::from_secs(5), leader_rx.wait_for(|l| *l))
            .await
            .expect("acquires the lease")
            .unwrap();
        let led = Instant::now();

        // From now on every call hangs (the responders are kept, so nothing ever answers).
        let hung = Arc::new(AtomicUsize::new(0));
        let counter = hung.clone();
        let server = tokio::spawn(async move {
            let mut pending = Vec::new();
            while let Some((_request, send)) = handle.next_request().await {
                counter.fetch_add(1, Ordering::SeqCst);
                pending.push(send);
            }
        });

        tokio::time::timeout(Duration::from_secs(10), leader_rx.wait_for(|l| !*l))
            .await
            .expect("steps down")
            .unwrap();
        let stepped = led.elapsed();
        assert!(
            stepped < config.duration,
            "stepped down {stepped:?} after acquiring: at or after the lease duration {:?}, a standby could lead too",
            config.duration
        );
        assert!(
            stepped >= config.renew,
            "held through the first failed renewal, stepped down after {stepped:?}"
        );
        assert!(hung.load(Ordering::SeqCst) >= 1, "a renewal was attempted and hung");

        shutdown_tx.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the election ends on shutdown even with the API server hung")
            .unwrap();
        server.abort();
    }
}
