//! Re-reading the policy file (its `runtimeUsernames` decide who may request runtime
//! certificates).

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use smolvm_api::policy::Policy;

/// The policy in force, swapped in place when the file changes.
pub type PolicySlot = Arc<RwLock<Policy>>;

/// How often the policy file is looked at.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Watches the policy file (by content, see [`smolvm_kit::watch`]) and swaps in a changed,
/// valid policy; a broken file keeps the previous policy and logs the error, which names the
/// field. Runs until the task is aborted.
pub fn spawn_reload(path: PathBuf, slot: PolicySlot) -> tokio::task::JoinHandle<()> {
    let shown = path.display().to_string();
    smolvm_kit::watch::spawn(vec![path], INTERVAL, move |contents| {
        let text = contents
            .first()
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
            .unwrap_or_default();
        match Policy::from_yaml(&text) {
            Ok(policy) => {
                *slot.write().unwrap_or_else(|e| e.into_inner()) = policy;
                tracing::info!(path = %shown, "policy reloaded");
            }
            Err(error) => {
                tracing::warn!(path = %shown, %error, "policy file rejected; keeping the previous policy")
            }
        }
    })
}
