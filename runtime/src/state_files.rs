//! Files the agent keeps in its state directory (workload digests, image credential records):
//! written whole, owner-only, and renamed into place.

/// Writes `bytes` to `path` through a new owner-only file (`<path>.tmp`, synced) renamed into
/// place, so a reader sees the old content or the new, never a part.
pub fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(tmp, path)
}
