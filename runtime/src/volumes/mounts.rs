//! The mount syscalls, kept thin: a bind of a holder's volume directory onto a stable mount
//! point (read-only when asked, never set-uid or device files on the host side), its undoing,
//! and what is mounted at a stable mount point now (from `/proc/self/mountinfo`). Behind the
//! [`Binder`] trait so that tests without mount privileges can stand in a recording double.

use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::plan::BindState;

/// What the agent does to stable mount points.
pub trait Binder: Send + Sync + std::fmt::Debug {
    /// Bind-mounts the directory `source` (its links resolved, checked inside its holder) onto
    /// `target`, read-only when `read_only`. A `source` that is no longer the checked path
    /// when opened fails.
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> io::Result<()>;
    /// Unmounts every mount at `target`; `false` when there was none.
    fn unbind(&self, target: &Path) -> io::Result<bool>;
    /// What is mounted at `target`, compared with `source`.
    fn state(&self, target: &Path, source: &Path) -> io::Result<BindState>;
}

/// The real [`Binder`]: mount(2) in the agent's mount namespace (which `smolvm serve`, its
/// child, shares).
#[derive(Debug, Clone, Copy, Default)]
pub struct MountBinder;

/// Most mounts stacked at one stable mount point that [`MountBinder::unbind`] undoes.
const MAX_STACKED: usize = 16;

fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::other("a path holds a NUL"))
}

/// mount(2) with no file system type and no data.
fn mount(source: Option<&Path>, target: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let source = source.map(c_path).transpose()?;
    let target = c_path(target)?;
    // SAFETY: the paths are NUL-terminated strings that outlive the call; a null file system
    // type and data are what a bind and a remount of a bind take.
    let done = unsafe {
        libc::mount(
            source.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn umount(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let target = c_path(target)?;
    // SAFETY: `target` is a NUL-terminated string that outlives the call.
    let done = unsafe { libc::umount2(target.as_ptr(), flags) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The mount flags a remount of the bind at `target` must keep (those its file system was
/// mounted with: a remount that dropped one would be refused where they are locked).
fn kept_flags(target: &Path) -> io::Result<libc::c_ulong> {
    let path = c_path(target)?;
    // SAFETY: statvfs only writes the struct it is given, which lives on this stack.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `stat` is valid for writes.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let pairs = [
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    Ok(pairs
        .iter()
        .filter(|(st, _)| stat.f_flag & *st != 0)
        .fold(0, |flags, (_, ms)| flags | ms))
}

impl Binder for MountBinder {
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt as _;
        // Opened first, then bound through the descriptor: what is mounted is the directory
        // that was checked, even if a link is put in its path meanwhile.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(source)?;
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", opened.as_raw_fd()));
        if std::fs::read_link(&by_fd)? != source {
            return Err(io::Error::other("the directory moved while it was opened"));
        }
        mount(Some(&by_fd), target, libc::MS_BIND)?;
        let flags = libc::MS_REMOUNT
            | libc::MS_BIND
            | libc::MS_NOSUID
            | libc::MS_NODEV
            | if read_only { libc::MS_RDONLY } else { 0 };
        let remounted = kept_flags(target).and_then(|kept| mount(None, target, flags | kept));
        if let Err(error) = remounted {
            // Never left writable (or with device files) when that was not asked for.
            let _ = umount(target, libc::MNT_DETACH);
            return Err(error);
        }
        Ok(())
    }

    fn unbind(&self, target: &Path) -> io::Result<bool> {
        let mut any = false;
        for _ in 0..MAX_STACKED {
            let done = umount(target, 0).or_else(|error| match error.raw_os_error() {
                // Still used (smolvm's file server finishing): detached now, gone once unused.
                Some(libc::EBUSY) => umount(target, libc::MNT_DETACH),
                _ => Err(error),
            });
            match done {
                Ok(()) => any = true,
                Err(error) if matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => return Ok(any),
                Err(error) => return Err(error),
            }
        }
        Ok(any)
    }

    fn state(&self, target: &Path, source: &Path) -> io::Result<BindState> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
        let Some(read_only) = mounted_at(&mountinfo, target) else {
            return Ok(BindState::Unbound);
        };
        let (at, wanted) = (std::fs::metadata(target)?, std::fs::metadata(source)?);
        Ok(BindState::Bound {
            same_source: at.dev() == wanted.dev() && at.ino() == wanted.ino(),
            read_only,
        })
    }
}

/// Reads a path as `/proc/self/mountinfo` writes it (space, tab, newline and backslash as
/// three octal digits after a backslash).
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(digits)) => {
                out.push(digits.iter().fold(0u8, |n, d| n.wrapping_mul(8).wrapping_add(d - b'0')));
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

/// Pure: whether `mountinfo` (the text of `/proc/self/mountinfo`) has a mount at `target`,
/// and then whether the topmost one (the last listed) is read-only.
pub fn mounted_at(mountinfo: &str, target: &Path) -> Option<bool> {
    let wanted = target.as_os_str().as_bytes();
    mountinfo
        .lines()
        .rev()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let point = fields.nth(4)?;
            let options = fields.next()?;
            (unescape(point) == wanted).then(|| options.split(',').any(|o| o == "ro"))
        })
        .next()
}

/// Pure: the mount points in `mountinfo` at or under `dir`, deepest first (the order to
/// unmount them in).
pub fn mount_points_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| {
            PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(
                unescape(field),
            ))
        })
        .filter(|point| point.starts_with(dir))
        .collect();
    points.sort_by(|a, b| {
        b.components()
            .count()
            .cmp(&a.components().count())
            .then_with(|| a.cmp(b))
    });
    points.dedup();
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
80 22 252:0 /srv/pv1 /var/lib/smolvm/volumes/svm-a/data rw,nosuid,nodev,relatime shared:1 - ext4 /dev/vda rw
81 22 0:50 / /var/lib/smolvm/volumes/svm-a/cfg ro,nosuid,nodev,relatime shared:40 - tmpfs tmpfs rw
82 22 252:0 /srv/my\\040dir /var/lib/smolvm/volumes/svm-a/with\\040space rw,relatime - ext4 /dev/vda rw
83 80 252:0 /srv/pv2 /var/lib/smolvm/volumes/svm-a/data ro,relatime - ext4 /dev/vda rw
";

    #[test]
    fn the_topmost_mount_at_a_path_is_read_from_mountinfo() {
        let cases = [
            ("/var/lib/smolvm/volumes/svm-a/data", Some(true)),
            ("/var/lib/smolvm/volumes/svm-a/cfg", Some(true)),
            ("/var/lib/smolvm/volumes/svm-a/with space", Some(false)),
            ("/var/lib/smolvm/volumes/svm-a", None),
            ("/var/lib/smolvm/volumes/svm-a/other", None),
            ("/", Some(false)),
        ];
        for (target, want) in cases {
            assert_eq!(mounted_at(MOUNTINFO, Path::new(target)), want, "{target}");
        }
        assert_eq!(mounted_at("garbage\n\n", Path::new("/")), None);
        assert_eq!(
            mount_points_under(MOUNTINFO, Path::new("/var/lib/smolvm/volumes")),
            [
                "/var/lib/smolvm/volumes/svm-a/cfg",
                "/var/lib/smolvm/volumes/svm-a/data",
                "/var/lib/smolvm/volumes/svm-a/with space",
            ]
            .map(PathBuf::from)
        );
        assert_eq!(unescape("a\\040b\\134c\\011"), b"a b\\c\t");
        assert_eq!(unescape("trailing\\04"), b"trailing\\04");
    }
}
