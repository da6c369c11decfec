//! What the agent refuses on its own, whatever admission did: a new machine on a host port the
//! policy excludes (SPEC V3: the node's own services and the agent's ports), and a private image
//! started without its credentials ([`crate::images`]).
//!
//! The host port half reads the same policy file the webhook reads (the `smolvm-policy`
//! ConfigMap, mounted into the DaemonSet), with the built-in defaults when there is none, and
//! re-reads it when its contents change. The ports the agent itself listens on are always
//! excluded, whatever the file says.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use smolvm_api::Policy;
use smolvm_api::policy::PortRange;

use crate::error::{Error, Result};

/// Where the guards read and keep their state; the default keeps both off except the built-in
/// host port policy.
#[derive(Debug, Clone, Default)]
pub struct GuardOptions {
    /// The policy file (the webhook's, from the `smolvm-policy` ConfigMap); `None` enforces the
    /// built-in default policy.
    pub policy_file: Option<PathBuf>,
    /// Directory of the private-image records ([`crate::images`]); `None` keeps none (and so
    /// refuses nothing on that ground).
    pub image_records: Option<PathBuf>,
}

/// The host ports no new machine may publish on this node: the policy's `excludedHostPorts`
/// and the agent's own listening ports. Swapped in place when the policy file changes.
#[derive(Debug)]
pub struct HostPortGuard {
    own: Vec<PortRange>,
    excluded: RwLock<Vec<PortRange>>,
}

impl HostPortGuard {
    /// The guard for `policy`, with the agent's own `ports` (0s are ignored) always excluded.
    pub fn new(policy: &Policy, own_ports: &[u16]) -> Arc<Self> {
        let own = own_ports
            .iter()
            .filter(|p| **p != 0)
            .map(|p| PortRange::one(*p))
            .collect();
        let guard = Arc::new(Self {
            own,
            excluded: RwLock::new(Vec::new()),
        });
        guard.replace(policy);
        guard
    }

    /// Reads the policy file (the built-in defaults without one); a file that does not parse is
    /// an error naming the field, as it is for the webhook.
    pub fn load(file: Option<&Path>, own_ports: &[u16]) -> Result<Arc<Self>> {
        let policy = match file {
            Some(path) => Policy::from_file(path).map_err(|e| Error::Config(format!("the policy file: {e}")))?,
            None => Policy::default(),
        };
        Ok(Self::new(&policy, own_ports))
    }

    /// Applies a new policy.
    pub fn replace(&self, policy: &Policy) {
        let mut list = policy.excluded_host_ports.clone();
        list.extend(self.own.iter().copied());
        list.sort();
        list.dedup();
        *self.excluded.write().unwrap_or_else(std::sync::PoisonError::into_inner) = list;
    }

    /// Applies a policy file's text; a text that does not parse changes nothing.
    pub fn apply_text(&self, text: &str) -> std::result::Result<(), smolvm_api::Error> {
        let policy = Policy::from_yaml(text)?;
        self.replace(&policy);
        Ok(())
    }

    /// The excluded ports now.
    pub fn excluded(&self) -> Vec<PortRange> {
        self.excluded
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Re-reads `path` every `interval` when its contents change (kit's watcher, by content);
    /// a broken file keeps the policy in force and is logged with the field it names.
    pub fn spawn_reload(self: &Arc<Self>, path: PathBuf, interval: Duration) -> tokio::task::JoinHandle<()> {
        let guard = self.clone();
        let shown = path.display().to_string();
        smolvm_kit::watch::spawn(vec![path], interval, move |contents| {
            let text = contents
                .first()
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
                .unwrap_or_default();
            match guard.apply_text(&text) {
                Ok(()) => {
                    tracing::info!(path = %shown, excluded = ?guard.excluded().iter().map(ToString::to_string).collect::<Vec<_>>(), "host port policy reloaded");
                }
                Err(error) => {
                    tracing::warn!(path = %shown, reason = error.reason(), %error, "policy file rejected; keeping the previous host port policy")
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_ports_stay_excluded_whatever_the_policy() {
        let guard = HostPortGuard::new(&Policy::default(), &[10443, 9090, 0, 12345]);
        let excluded = guard.excluded();
        for port in [10249, 10250, 10256, 30000, 32767, 9090, 10081, 10443, 12345] {
            assert!(excluded.iter().any(|r| r.contains(port)), "{port}");
        }
        assert!(!excluded.iter().any(|r| r.contains(8080)));
        let open = Policy::from_yaml("excludedHostPorts: ['8000-8099']\n").expect("policy");
        guard.replace(&open);
        let excluded = guard.excluded();
        for (port, refused) in [(8050, true), (12345, true), (10443, true), (10250, false)] {
            assert_eq!(excluded.iter().any(|r| r.contains(port)), refused, "{port}");
        }
    }

    #[tokio::test]
    async fn the_policy_file_is_reloaded_and_a_broken_one_keeps_the_last() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, "excludedHostPorts: [22]\n").expect("write");
        let guard = HostPortGuard::load(Some(&path), &[]).expect("loads");
        assert_eq!(guard.excluded(), vec![PortRange::one(22)]);
        let task = guard.spawn_reload(path.clone(), Duration::from_millis(20));
        std::fs::write(&path, "excludedHostPorts: [22, '8000-8001']\n").expect("write");
        let reloaded = vec![
            PortRange::one(22),
            PortRange {
                first: 8000,
                last: 8001,
            },
        ];
        let mut waited = 0;
        while guard.excluded() != reloaded && waited < 500 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            waited += 1;
        }
        assert_eq!(guard.excluded(), reloaded);
        task.abort();
        // A broken file changes nothing: the last good policy stays.
        assert!(guard.apply_text("excludedHostPorts: [0]\n").is_err());
        assert_eq!(guard.excluded(), reloaded);
        assert!(HostPortGuard::load(Some(&dir.path().join("absent.yaml")), &[]).is_err());
    }
}
