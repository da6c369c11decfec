//! Re-reading mounted files (policy, certificates, tokens, CA bundles) when they change.
//!
//! One change rule for every binary: a file set changed when the SHA-256 of its contents did.
//! Modification times and inodes are no guide under Kubernetes: a Secret or ConfigMap volume
//! updates by swapping a `..data` symlink, which leaves the visible names' own metadata alone,
//! and a rewrite with the same bytes is no change at all. A set is only taken when every file in
//! it reads, so a certificate and its key are never taken half-updated from a failed read.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A file of the set that could not be read; the previous contents stay in force.
#[derive(Debug)]
pub struct Unreadable {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub error: std::io::Error,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot read {}: {}", self.path.display(), self.error)
    }
}

impl std::error::Error for Unreadable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Files watched together.
#[derive(Debug)]
pub struct FileSet {
    paths: Vec<PathBuf>,
    last: Option<[u8; 32]>,
}

impl FileSet {
    /// Watches `paths`; the first [`poll`](Self::poll) reports their contents.
    pub fn new(paths: Vec<PathBuf>) -> Self {
        FileSet { paths, last: None }
    }

    /// Watches `paths` from their contents now: only later changes are reported. (Unreadable
    /// now: the first readable contents count as a change.)
    pub fn primed(paths: Vec<PathBuf>) -> Self {
        let mut set = FileSet::new(paths);
        let _ = set.poll();
        set
    }

    /// The watched paths.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Reads the files: `Ok(Some(contents))`, in the order of the paths, when they differ from
    /// the last contents taken, `Ok(None)` when they do not, `Err` when one cannot be read.
    pub fn poll(&mut self) -> Result<Option<Vec<Vec<u8>>>, Unreadable> {
        let contents = self
            .paths
            .iter()
            .map(|path| read(path))
            .collect::<Result<Vec<_>, _>>()?;
        let digest = digest(&contents);
        if self.last == Some(digest) {
            return Ok(None);
        }
        self.last = Some(digest);
        Ok(Some(contents))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, Unreadable> {
    std::fs::read(path).map_err(|error| Unreadable {
        path: path.to_path_buf(),
        error,
    })
}

/// SHA-256 over the files, each prefixed with its length (so moving bytes from one file to the
/// next is a change).
fn digest(contents: &[Vec<u8>]) -> [u8; 32] {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for bytes in contents {
        context.update(&(bytes.len() as u64).to_be_bytes());
        context.update(bytes);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(context.finish().as_ref());
    out
}

/// Polls `paths` every `interval` (from their contents now) and calls `on_change` with the new
/// contents whenever they change and all read. An unreadable file is logged once per episode.
/// Runs until the task is aborted.
pub fn spawn<F>(paths: Vec<PathBuf>, interval: Duration, mut on_change: F) -> tokio::task::JoinHandle<()>
where
    F: FnMut(Vec<Vec<u8>>) + Send + 'static,
{
    let mut set = FileSet::primed(paths);
    tokio::spawn(async move {
        let mut unreadable = false;
        loop {
            tokio::time::sleep(interval).await;
            match set.poll() {
                Ok(Some(contents)) => {
                    unreadable = false;
                    on_change(contents);
                }
                Ok(None) => unreadable = false,
                Err(error) => {
                    if !unreadable {
                        tracing::warn!(path = %error.path.display(), error = %error.error, "a watched file is unreadable; keeping the previous version");
                    }
                    unreadable = true;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_decide_not_metadata() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "one").expect("write");
        std::fs::write(&b, "two").expect("write");
        let mut set = FileSet::new(vec![a.clone(), b.clone()]);
        assert_eq!(set.poll().expect("poll"), Some(vec![b"one".to_vec(), b"two".to_vec()]));
        assert_eq!(set.poll().expect("poll"), None);
        // The same bytes written again: no change.
        std::fs::write(&a, "one").expect("write");
        assert_eq!(set.poll().expect("poll"), None);
        // Bytes moved from one file to the other: a change.
        std::fs::write(&a, "onet").expect("write");
        std::fs::write(&b, "wo").expect("write");
        assert!(set.poll().expect("poll").is_some());
        // An unreadable file keeps the last contents; coming back unchanged is no change.
        std::fs::remove_file(&b).expect("remove");
        assert!(set.poll().is_err());
        std::fs::write(&b, "wo").expect("write");
        assert_eq!(set.poll().expect("poll"), None);
    }

    #[test]
    fn a_data_symlink_swap_is_seen() {
        // A Secret volume: `tls.crt -> ..data/tls.crt`, `..data -> ..<timestamp>`; an update
        // writes a new timestamped directory and swaps `..data`.
        let dir = tempfile::tempdir().expect("tempdir");
        let first = dir.path().join("..2026_01");
        let second = dir.path().join("..2026_02");
        std::fs::create_dir(&first).expect("mkdir");
        std::fs::create_dir(&second).expect("mkdir");
        std::fs::write(first.join("tls.crt"), "old").expect("write");
        std::fs::write(second.join("tls.crt"), "new").expect("write");
        let data = dir.path().join("..data");
        std::os::unix::fs::symlink(&first, &data).expect("symlink");
        let visible = dir.path().join("tls.crt");
        std::os::unix::fs::symlink("..data/tls.crt", &visible).expect("symlink");
        let mut set = FileSet::primed(vec![visible]);
        assert_eq!(set.poll().expect("poll"), None);
        let swap = dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&second, &swap).expect("symlink");
        std::fs::rename(&swap, &data).expect("swap");
        assert_eq!(set.poll().expect("poll"), Some(vec![b"new".to_vec()]));
    }

    #[tokio::test(start_paused = true)]
    async fn spawn_calls_back_on_change_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "a").expect("write");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = spawn(vec![path.clone()], Duration::from_secs(1), move |c| {
            let _ = tx.send(c);
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(rx.try_recv().is_err(), "unchanged contents were reported");
        std::fs::write(&path, "b").expect("write");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(rx.try_recv().ok(), Some(vec![b"b".to_vec()]));
        task.abort();
    }
}
