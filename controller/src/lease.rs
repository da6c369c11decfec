//! Leader election on a coordination.k8s.io Lease: one controller replica acts at a time.
//!
//! The holder renews the lease every `renew` interval; another replica takes it over only after
//! `duration` has passed without renewal. Writes use the lease's resourceVersion, so two
//! candidates can never both believe they won.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::sync::watch;

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

/// Pure decision on a lease spec.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else { return Decision::Acquire };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == identity {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::Acquire;
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    match spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) {
        Some(MicroTime(t)) if now.duration_since(*t) <= duration => Decision::Wait { holder },
        _ => Decision::Acquire,
    }
}

/// Runs the election until `shutdown` fires; `leader` tells whether this replica leads. On
/// shutdown a held lease is released so a successor takes over at once.
pub async fn run(
    client: Client,
    config: LeaseConfig,
    leader: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    loop {
        let held = match step(&api, &config).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, lease = %config.name, "lease update failed");
                false
            }
        };
        if *leader.borrow() != held {
            tracing::info!(leader = held, identity = %config.identity, "leadership changed");
        }
        leader.send_replace(held);
        tokio::select! {
            _ = tokio::time::sleep(config.renew) => {}
            _ = shutdown.changed() => break,
        }
    }
    if *leader.borrow() {
        leader.send_replace(false);
        if let Ok(mut lease) = api.get(&config.name).await
            && let Some(spec) = lease.spec.as_mut()
            && spec.holder_identity.as_deref() == Some(config.identity.as_str())
        {
            spec.holder_identity = None;
            let _ = api.replace(&config.name, &PostParams::default(), &lease).await;
        }
    }
}

async fn step(api: &Api<Lease>, config: &LeaseConfig) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let existing = api.get_opt(&config.name).await?;
    let decision = decide(existing.as_ref().and_then(|l| l.spec.as_ref()), &config.identity, now);
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
        assert_eq!(decide(None, "me", now), Decision::Acquire);
        assert_eq!(
            decide(Some(&spec(Some("me"), Some(1), now)), "me", now),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&spec(Some("other"), Some(5), now)), "me", now),
            Decision::Wait { holder: "other".into() }
        );
        assert_eq!(
            decide(Some(&spec(Some("other"), Some(30), now)), "me", now),
            Decision::Acquire
        );
        assert_eq!(decide(Some(&spec(None, Some(1), now)), "me", now), Decision::Acquire);
        assert_eq!(
            decide(Some(&spec(Some("other"), None, now)), "me", now),
            Decision::Acquire
        );
    }
}
