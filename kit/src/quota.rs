//! Charging a namespace's ResourceQuotas for what SmolVMs take (SPEC 6.3, rule V15): the one
//! optimistic write that the webhook makes for a user's write and the controller for what it
//! starts on its own (a pool's source and slots, a wake).
//!
//! As kube-apiserver's own quota admission does it: every quota of the namespace that limits a
//! key the charge raises is judged first ([`smolvm_api::quota::judge`], every key exceeded named
//! at once); then each is updated, its `status.used` raised by the charge, with the
//! resourceVersion it was judged at as precondition. A conflict (someone charged it meanwhile)
//! reads that quota again and judges again, so concurrent charges never pass a limit together.
//! Charges in one namespace are made one at a time in this process, so that they do not
//! conflict with each other: only another process's charge (the other webhook replica's, the
//! controller's) costs a second read.
//!
//! A charge whose write later fails (the API server refuses the object after admission) is
//! given back by the controller's recount, as the quota controller does for Pods.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use smolvm_api::{
    NodeResources,
    quota::{Exceeded, Limits, judge, status_patch},
};

/// Why a charge was not made.
#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    /// A quota's limit would be exceeded: the refusal, in kube-apiserver's words.
    #[error(transparent)]
    Exceeded(#[from] Exceeded),
    /// Every attempt met a newer version of a quota (others charging it all the time).
    #[error(
        "cannot charge ResourceQuota {quota}: it changed under each of {attempts} attempts (others are charging it); try again"
    )]
    Busy {
        /// The quota.
        quota: String,
        /// How many times it was tried.
        attempts: u32,
    },
    /// The API server failed a read or write of a quota.
    #[error("cannot charge ResourceQuota {quota}: {source}")]
    Api {
        /// The quota.
        quota: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },
}

impl ChargeError {
    /// A stable reason string (metrics, logs).
    pub fn reason(&self) -> &'static str {
        match self {
            ChargeError::Exceeded(_) => "QuotaExceeded",
            ChargeError::Busy { .. } => "QuotaBusy",
            ChargeError::Api { .. } => "QuotaUnavailable",
        }
    }
}

/// What a charge did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Charged {
    /// The quotas raised (none: no quota limits what the charge asks for, or a dry run).
    pub quotas: Vec<String>,
    /// The conflicts met on the way (each cost a read of that quota).
    pub conflicts: u32,
}

/// How hard a charge tries before it gives up with [`ChargeError::Busy`].
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Attempts per quota.
    pub attempts: u32,
    /// The whole charge's deadline (the API server's webhook call gives the webhook 10 s).
    pub deadline: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            attempts: 16,
            deadline: Duration::from_secs(4),
        }
    }
}

/// Charges quotas through one client, one charge at a time per namespace.
pub struct Charger {
    client: Client,
    bounds: Bounds,
    /// Per namespace: the lock its charges take in turn.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per quota (`namespace/name`): the version this process's last write of it answered, with
    /// the version it was made from. Used instead of the cache while the cache still shows the
    /// older one, so that back-to-back charges do not each meet a conflict.
    written: Mutex<HashMap<String, Written>>,
}

/// A quota's version as this process's write left it: the version it was made from, and the
/// answer.
type Written = (Option<String>, Arc<ResourceQuota>);

fn key_of(quota: &ResourceQuota) -> String {
    format!(
        "{}/{}",
        quota.metadata.namespace.as_deref().unwrap_or(""),
        quota.metadata.name.as_deref().unwrap_or("")
    )
}

impl Charger {
    /// A charger writing through `client`.
    pub fn new(client: Client, bounds: Bounds) -> Self {
        Charger {
            client,
            bounds,
            locks: Mutex::default(),
            written: Mutex::default(),
        }
    }

    fn lock_of(&self, namespace: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(namespace.to_string()).or_default().clone()
    }

    /// The newest version of `cached` this process knows: its own last write's answer while the
    /// cache has not caught up with it.
    fn newest(&self, cached: Arc<ResourceQuota>) -> Arc<ResourceQuota> {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        match written.get(&key_of(&cached)) {
            Some((base, answer)) if *base == cached.metadata.resource_version => answer.clone(),
            _ => cached,
        }
    }

    fn remember(&self, base: Option<String>, answer: ResourceQuota) {
        let key = key_of(&answer);
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.insert(key, (base, Arc::new(answer)));
    }

    /// Forgets what this process wrote of quotas no longer in `live` (`namespace/name`).
    pub fn retain(&self, live: &HashSet<String>) {
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| live.contains(k));
    }

    /// Charges `requested` to `quotas` (the namespace's ResourceQuotas, from a cache). A dry run
    /// is judged the same and never written.
    pub async fn charge(
        &self,
        namespace: &str,
        quotas: Vec<Arc<ResourceQuota>>,
        requested: &NodeResources,
        dry_run: bool,
    ) -> Result<Charged, ChargeError> {
        let lock = self.lock_of(namespace);
        let _turn = lock.lock().await;
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), namespace);
        let started = Instant::now();
        let mut charged = Charged::default();
        // Each quota with its attempts so far; a quota charged (or found gone) leaves the list.
        let mut todo: Vec<(Arc<ResourceQuota>, u32)> = quotas.into_iter().map(|q| (self.newest(q), 0)).collect();
        let mut written: HashSet<String> = HashSet::new();
        loop {
            // Judge every quota still to charge before writing any: one exceeded refuses the
            // whole charge, as the API server's quota admission does.
            let mut plans = Vec::new();
            for (quota, _) in &todo {
                let Some(limits) = Limits::of(quota) else { continue };
                if let Some(after) = judge(&limits, requested)? {
                    plans.push((limits, after));
                }
            }
            if dry_run || plans.is_empty() {
                return Ok(charged);
            }
            let mut retry = Vec::new();
            for (limits, after) in plans {
                if written.contains(&limits.name) {
                    continue;
                }
                let patch = status_patch(&limits, &after, false);
                match api
                    .patch_status(&limits.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(answer) => {
                        self.remember(limits.resource_version.clone(), answer);
                        written.insert(limits.name.clone());
                        charged.quotas.push(limits.name);
                    }
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        written.insert(limits.name.clone());
                    }
                    Err(kube::Error::Api(status)) if status.code == 409 => {
                        charged.conflicts += 1;
                        retry.push(limits.name);
                    }
                    Err(source) => {
                        return Err(ChargeError::Api {
                            quota: limits.name,
                            source,
                        });
                    }
                }
            }
            if retry.is_empty() {
                return Ok(charged);
            }
            // Read each conflicting quota again, and judge again.
            let mut next = Vec::new();
            for name in retry {
                let attempts = todo
                    .iter()
                    .find(|(q, _)| q.metadata.name.as_deref() == Some(name.as_str()))
                    .map_or(0, |(_, a)| *a)
                    + 1;
                if attempts >= self.bounds.attempts || started.elapsed() >= self.bounds.deadline {
                    return Err(ChargeError::Busy { quota: name, attempts });
                }
                match api.get_opt(&name).await {
                    Ok(Some(fresh)) => next.push((Arc::new(fresh), attempts)),
                    Ok(None) => {}
                    Err(source) => return Err(ChargeError::Api { quota: name, source }),
                }
            }
            todo = next;
        }
    }
}
