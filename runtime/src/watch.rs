//! Re-reading files that change under a running agent (bearer token, client CA, TLS files).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// What identifies a file's version: modification time, length and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    ino: u64,
}

/// The current stamp of `path` (following symlinks, as Kubernetes volume mounts need), or
/// `None` when it cannot be read.
pub fn file_stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        ino: meta.ino(),
    })
}

/// Polls `paths` every `interval` and calls `on_change` with their contents whenever any
/// stamp changed and all files are readable. Runs until the task is aborted.
pub fn spawn_watch<F>(paths: Vec<PathBuf>, interval: Duration, mut on_change: F) -> tokio::task::JoinHandle<()>
where
    F: FnMut(Vec<Vec<u8>>) + Send + 'static,
{
    tokio::spawn(async move {
        let mut last: Vec<Option<FileStamp>> = paths.iter().map(|p| file_stamp(p)).collect();
        loop {
            tokio::time::sleep(interval).await;
            let now: Vec<Option<FileStamp>> = paths.iter().map(|p| file_stamp(p)).collect();
            if now == last {
                continue;
            }
            let mut contents = Vec::with_capacity(paths.len());
            for path in &paths {
                match std::fs::read(path) {
                    Ok(bytes) => contents.push(bytes),
                    Err(error) => {
                        tracing::warn!(path = %path.display(), %error, "changed file is unreadable; keeping the previous version");
                        break;
                    }
                }
            }
            if contents.len() == paths.len() {
                last = now;
                on_change(contents);
            }
        }
    })
}
