//! What the controller's ops server reports: every replica is ready (a standby serves health and
//! waits for the Lease); the body says which it is. Metrics count the SmolVMs by phase from the
//! leader's cache as they are scraped.

use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
};

use kube::runtime::reflector;
use smolvm_api::SmolVM;
use tokio::sync::watch;

use crate::metrics::Metrics;

/// The SmolVM cache, once the controller leads and runs.
pub type VmStoreSlot = Arc<RwLock<Option<reflector::Store<SmolVM>>>>;

/// The controller's [`smolvm_kit::ops::Probe`].
pub struct Probe {
    /// Whether this replica leads.
    pub leader: watch::Receiver<bool>,
    /// The controller's metrics.
    pub metrics: Arc<Metrics>,
    /// The SmolVM cache to count phases in.
    pub vms: VmStoreSlot,
}

impl smolvm_kit::ops::Probe for Probe {
    fn readiness(&self) -> Result<String, String> {
        Ok(if *self.leader.borrow() {
            "ok (leader)"
        } else {
            "ok (standby)"
        }
        .into())
    }

    fn metrics(&self) -> String {
        let store = self.vms.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(store) = store {
            let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
            for vm in store.state() {
                let phase = vm.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
                *counts.entry(phase.as_str()).or_default() += 1;
            }
            self.metrics.set_phases(counts);
        }
        self.metrics.encode()
    }
}
