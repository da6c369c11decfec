//! The SmolVM controller: placement, binding, lifecycle, node-aware finalizers and runtime
//! certificate signing.
//!
//! - [`placement`]: the pure placement function and the reservation ledger.
//! - [`vm`]: the lifecycle of a SmolVM: observe, decide (pure), act, report.
//! - [`nodeclient`]: the mTLS client of the runtime agents' node API.
//! - [`pki`]: the runtime CA, the CSR signer and the node API token.
//! - [`quota`]: the recount of the `vm.smolvm.dev/*` figures of ResourceQuotas.
//! - [`access`]: the aggregated access API (logs, exec, files), served by every replica.
//! - [`pools`]: the warm pools' plan and status, as data.
//! - [`tasks`]: the long-running tasks (the lease, the node watch, the pool keeper, the orphan
//!   collector, …), one per file.
//! - [`app`]: the process: one spawn per task, and the SmolVM controller's wiring ([`app::vms`]).

pub mod access;
pub mod app;
pub mod cli;
pub mod events;
pub mod heartbeat;
pub mod metrics;
pub mod nodeclient;
pub mod pki;
pub mod placement;
pub mod pools;
pub mod quota;
pub mod status_apply;
pub mod tasks;
pub mod vm;

/// Waits until a reflector store has its first complete list; `false` if its writer is gone.
///
/// Safe for many waiters at once. `Store::wait_until_ready` keeps one waker only (a oneshot
/// receiver behind a mutex), so of several tasks awaiting it concurrently only the last to poll
/// is woken and the others wait forever; polling it again each second re-registers, and once any
/// poll has seen it ready, every later poll returns at once.
pub async fn store_ready<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(1), store.wait_until_ready()).await {
            Ok(result) => return result.is_ok(),
            Err(_) => continue,
        }
    }
}
