//! Warm pools on this node: the agent's records of the pools it keeps and of the machines it
//! served from them, and the keeper that holds both to smolvm.
//!
//! A pool is smolvm's fork pool: a source machine made from the pool's template, started as a
//! branch source, and `slots` ready machines forked from it. A machine served from a pool keeps
//! its node API name (`svm-<uid>`); the agent leased one of the pool's ready machines (the
//! worker) for it and maps the name to the worker in every call ([`LeasedVmm`]). Both
//! records live in the state directory beside the workload records, so they survive an agent
//! restart:
//! - `pools/<pool>.json`: the pool's spec, to make the pool again after smolvm restarts (smolvm's
//!   pools and ready machines do not survive a restart of `smolvm serve`);
//! - `leases/<machine>.json`: the pool, the lease and the worker of a served machine, written
//!   once the lease is granted (the lease's idempotency key is the machine's name, so a lease
//!   granted but not recorded is granted again on the retry).
//!
//! The keeper ([`keep`]) runs every [`KEEP_INTERVAL`]: it heartbeats every recorded lease (a
//! controller outage never retires a user's machine: the agent keeps it alive, with a time to
//! live of [`LEASE_TTL_SECS`], far beyond the interval) and makes again every recorded pool
//! smolvm no longer has.

mod leased;

pub use leased::LeasedVmm;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use smolvm_api::nodeapi::{MachineSpec, PoolStatus};

use crate::state_files::Records;
use crate::vmm::{PoolRequest, Vmm, VmmError};

/// Seconds a leased machine lives without a heartbeat: far beyond [`KEEP_INTERVAL`], so only
/// an agent gone for half an hour lets smolvm retire it.
pub const LEASE_TTL_SECS: u64 = 1800;

/// How often the keeper heartbeats the leases and checks the pools.
pub const KEEP_INTERVAL: Duration = Duration::from_secs(30);

/// What the agent records of a machine served from a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRecord {
    /// The pool.
    pub pool: String,
    /// smolvm's lease id.
    pub lease: String,
    /// The pool's machine that serves it (smolvm's name).
    pub worker: String,
}

/// What the agent records of a pool it keeps: what `PUT /v1/pools/{name}` asked for (without
/// registry credentials, which are never stored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRecord {
    /// The source machine's spec.
    pub source: MachineSpec,
    /// Ready slots wanted. Lowered by one at each lease it grants (the controller books each
    /// refill before it asks for it, so smolvm never starts a machine nobody booked).
    pub slots: u32,
    /// A DeletePool began: the keeper no longer makes it again, and the record stays (and the
    /// node keeps reporting the pool) until smolvm's pool and the source are both gone, so the
    /// controller asks again after a delete that failed half-way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

/// The agent's records of its pools and of the machines served from them.
#[derive(Debug)]
pub struct PoolBook {
    /// By machine name (`svm-<uid>`).
    pub leases: Records<LeaseRecord>,
    /// By pool name.
    pub pools: Records<PoolRecord>,
}

impl PoolBook {
    /// Records in this process's memory only.
    pub fn in_memory() -> Self {
        Self {
            leases: Records::in_memory(),
            pools: Records::in_memory(),
        }
    }

    /// Records beside the workload records in `workload_dir`: `leases` and `pools` in the same
    /// parent directory.
    pub fn beside(workload_dir: &Path) -> Self {
        Self {
            leases: Records::in_dir(workload_dir.with_file_name("leases")),
            pools: Records::in_dir(workload_dir.with_file_name("pools")),
        }
    }
}

/// The smolvm pool request for the pool `name` with `slots` ready machines: the pool's source
/// machine has the pool's name.
pub fn pool_request(name: &str, slots: u32) -> PoolRequest<'_> {
    PoolRequest {
        name,
        source: name,
        ready: slots,
        lease_ttl_secs: LEASE_TTL_SECS,
    }
}

/// The pools the node reports: those smolvm lists, and every pool the agent has a record of that
/// smolvm does not list (one whose source never started, or being deleted), with its wanted
/// slots and none ready, so the controller sees every pool it may have to retire. Sorted.
pub fn with_records(mut listed: Vec<PoolStatus>, book: &PoolBook) -> Vec<PoolStatus> {
    for (name, record) in book.pools.all() {
        if let Some(pool) = listed.iter_mut().find(|p| p.name == name) {
            if record.deleting {
                pool.slots = 0;
            }
            continue;
        }
        listed.push(PoolStatus {
            name,
            slots: if record.deleting { 0 } else { record.slots },
            ..PoolStatus::default()
        });
    }
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    listed
}

/// One round of the keeper: heartbeats every recorded lease, then makes again (through
/// `remake`, which holds the pool's lock and reads its record again) every recorded pool smolvm
/// does not list, but those being deleted. Returns how many leases smolvm no longer
/// knows (their machines are lost, and reported so by their absence).
pub async fn keep_once<F, Fut>(vmm: &Arc<dyn Vmm>, book: &PoolBook, remake: F) -> usize
where
    F: Fn(String, PoolRecord) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut gone = 0;
    for (machine, record) in book.leases.all() {
        match vmm.heartbeat_lease(&record.pool, &record.lease).await {
            Ok(_) => {}
            Err(VmmError::NotFound { message }) | Err(VmmError::Conflict { message }) => {
                gone += 1;
                tracing::warn!(%machine, pool = %record.pool, %message, "the lease of a served machine is gone");
            }
            Err(error) => tracing::debug!(%machine, %error, "lease heartbeat failed; retried next round"),
        }
    }
    let listed = match vmm.pools().await {
        Ok(pools) => pools.into_iter().map(|p| p.name).collect::<Vec<_>>(),
        Err(error) => {
            tracing::debug!(%error, "cannot list smolvm's pools; retried next round");
            return gone;
        }
    };
    for (name, record) in book.pools.all() {
        if !listed.contains(&name) && !record.deleting {
            tracing::info!(pool = %name, "smolvm does not have the pool (restarted?): making it again");
            remake(name, record).await;
        }
    }
    gone
}
