//! Reloading files without a restart: the policy file and, in `files` TLS mode, the serving
//! certificate and key (as cert-manager's Secret mount updates them).
//!
//! Polling follows the shared change rule of [`smolvm_kit::watch`]: the contents' hash, not
//! mtimes (a Secret or ConfigMap volume updates by swapping a `..data` symlink).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use smolvm_api::Policy;
use smolvm_certs::ReloadableResolver;
use smolvm_kit::{selfsigned::unix_seconds, watch::FileSet};

use crate::{
    error::{Error, Result},
    metrics::Metrics,
    state::PolicyHandle,
};

/// A set of files watched together (the shared content-hash rule of [`FileSet`]), read as text.
#[derive(Debug)]
pub struct Watched(FileSet);

impl Watched {
    /// Watches `paths`; the first poll always reports a change.
    pub fn new(paths: Vec<PathBuf>) -> Self {
        Watched(FileSet::new(paths))
    }

    /// Reads the files. `Ok(Some(texts))` when their contents differ from the last poll,
    /// `Ok(None)` when unchanged, `Err` when one cannot be read (the last contents stay).
    pub fn poll(&mut self) -> Result<Option<Vec<String>>> {
        let Some(contents) = self.0.poll().map_err(|e| Error::Read {
            path: e.path.display().to_string(),
            source: e.error,
        })?
        else {
            return Ok(None);
        };
        contents
            .into_iter()
            .zip(self.0.paths())
            .map(|(bytes, path)| {
                String::from_utf8(bytes).map_err(|e| Error::Read {
                    path: path.display().to_string(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// Loads the policy: built-in defaults without a path, else the file.
pub fn load_policy(path: Option<&Path>) -> Result<Policy> {
    match path {
        None => Ok(Policy::default()),
        Some(path) => Ok(Policy::from_file(path)?),
    }
}

/// Applies one poll of the policy file to `handle`. Returns whether a new policy was applied.
/// On a bad file the last good policy stays, the error is logged and counted.
pub fn apply_policy_poll(watched: &mut Watched, handle: &PolicyHandle, metrics: &Metrics) -> bool {
    match watched.poll() {
        Ok(None) => false,
        Ok(Some(texts)) => match texts.first().map(|t| Policy::from_yaml(t)) {
            Some(Ok(policy)) => {
                handle.replace(policy);
                metrics.policy_reloaded(true);
                tracing::info!("policy reloaded");
                true
            }
            Some(Err(e)) => {
                metrics.policy_reloaded(false);
                tracing::error!(reason = e.reason(), error = %e, "policy file rejected; keeping the last good policy");
                false
            }
            None => false,
        },
        Err(e) => {
            metrics.policy_reloaded(false);
            tracing::error!(reason = e.reason(), error = %e, "policy file unreadable; keeping the last good policy");
            false
        }
    }
}

/// Polls the policy file every `interval`, forever.
pub async fn watch_policy(path: PathBuf, handle: PolicyHandle, metrics: Arc<Metrics>, interval: Duration) {
    let mut watched = Watched::new(vec![path]);
    // The first poll reads the file loaded at start-up; it must not count as a reload.
    let _ = watched.poll();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        apply_policy_poll(&mut watched, &handle, &metrics);
    }
}

/// Applies one poll of the certificate and key files to `resolver`. Returns whether a new
/// certificate was swapped in. A pair that does not load (mid-update, or broken) leaves the
/// current certificate serving.
pub fn apply_cert_poll(watched: &mut Watched, resolver: &ReloadableResolver, metrics: &Metrics) -> bool {
    match watched.poll() {
        Ok(None) => false,
        Ok(Some(texts)) => match texts.as_slice() {
            [cert, key] => match resolver.swap_pem(cert, key) {
                Ok(()) => {
                    let not_after = unix_seconds(resolver.current_not_after());
                    metrics.certificate_reloaded(Ok(not_after));
                    tracing::info!(not_after, "serving certificate reloaded from files");
                    true
                }
                Err(e) => {
                    metrics.certificate_reloaded(Err(e.reason()));
                    tracing::error!(reason = e.reason(), error = %e, "certificate files rejected; keeping the current certificate");
                    false
                }
            },
            _ => false,
        },
        Err(e) => {
            metrics.certificate_reloaded(Err(e.reason()));
            tracing::error!(reason = e.reason(), error = %e, "certificate files unreadable; keeping the current certificate");
            false
        }
    }
}

/// Loads a resolver from the certificate and key files.
pub fn resolver_from_files(cert: &Path, key: &Path) -> Result<(ReloadableResolver, Watched)> {
    let mut watched = Watched::new(vec![cert.to_path_buf(), key.to_path_buf()]);
    let texts = watched.poll()?.unwrap_or_default();
    match texts.as_slice() {
        [cert, key] => Ok((ReloadableResolver::from_pem(cert, key)?, watched)),
        _ => Err(Error::Config("certificate and key files".into())),
    }
}

/// Polls the certificate and key files every `interval`, forever.
pub async fn watch_cert_files(
    mut watched: Watched,
    resolver: Arc<ReloadableResolver>,
    metrics: Arc<Metrics>,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        apply_cert_poll(&mut watched, &resolver, &metrics);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_reload_keeps_last_good() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, "maxCpus: 8\n").unwrap_or_else(|e| panic!("{e}"));
        let handle = PolicyHandle::new(Policy::default());
        let metrics = Metrics::new();
        let mut watched = Watched::new(vec![path.clone()]);
        // (file content or None to delete, applied?, expected maxCpus after)
        let table: &[(Option<&str>, bool, i64)] = &[
            (None, true, 8),                   // first poll loads the file as written above
            (Some("maxCpus: 8\n"), false, 8),  // unchanged
            (Some("maxCpus: [\n"), false, 8),  // not YAML: keep
            (Some("maxCpu: 4\n"), false, 8),   // unknown field: keep
            (Some("maxCpus: 4\n"), true, 4),   // good
            (Some("minCpus: 64\n"), false, 4), // inconsistent bounds: keep
            (Some("maxCpus: 6\n"), true, 6),
        ];
        for (content, applied, max_cpus) in table {
            if let Some(c) = content {
                std::fs::write(&path, c).unwrap_or_else(|e| panic!("{e}"));
            }
            assert_eq!(
                apply_policy_poll(&mut watched, &handle, &metrics),
                *applied,
                "{content:?}"
            );
            assert_eq!(handle.current().max_cpus, *max_cpus, "{content:?}");
        }
        std::fs::remove_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!apply_policy_poll(&mut watched, &handle, &metrics));
        assert_eq!(handle.current().max_cpus, 6);
        let text = metrics.encode();
        assert!(text.contains("smolvm_webhook_policy_reload_errors_total 4"), "{text}");
    }

    #[test]
    fn cert_files_reload_and_reject_mismatch() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let day = Duration::from_secs(86_400);
        let ca = smolvm_certs::CertificateAuthority::generate("ca", day).unwrap_or_else(|e| panic!("{e}"));
        let a = ca
            .issue_server(&["a.example".into()], &[], day)
            .unwrap_or_else(|e| panic!("{e}"));
        let b = ca
            .issue_server(&["b.example".into()], &[], day)
            .unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, &a.cert_pem).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&key, &a.key_pem).unwrap_or_else(|e| panic!("{e}"));
        let (resolver, mut watched) = resolver_from_files(&cert, &key).unwrap_or_else(|e| panic!("{e}"));
        let metrics = Metrics::new();
        assert!(!apply_cert_poll(&mut watched, &resolver, &metrics));
        // Half-updated pair (new cert, old key): rejected, still serving a.
        std::fs::write(&cert, &b.cert_pem).unwrap_or_else(|e| panic!("{e}"));
        assert!(!apply_cert_poll(&mut watched, &resolver, &metrics));
        assert_eq!(resolver.current_cert_info().dns_names, vec!["a.example"]);
        std::fs::write(&key, &b.key_pem).unwrap_or_else(|e| panic!("{e}"));
        assert!(apply_cert_poll(&mut watched, &resolver, &metrics));
        assert_eq!(resolver.current_cert_info().dns_names, vec!["b.example"]);
    }
}
