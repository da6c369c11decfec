//! What `cp SRC DST` means, decided without touching anything: which side is the SmolVM,
//! where the file lands, and the mode it gets.

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::paths::is_dns1123_subdomain;

/// The most bytes one file copied into a SmolVM may have (what the server takes).
pub const MAX_COPY_IN_BYTES: u64 = 64 * 1024 * 1024;

/// The mode of a file copied in from stdin, when `--mode` is not given.
pub const DEFAULT_MODE: u32 = 0o644;

/// One side of a copy, as written on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// `-`: stdin as a source, stdout as a destination.
    Stdio,
    /// A local path.
    Local(PathBuf),
    /// `NAME:/abs/path` in a SmolVM.
    Remote {
        /// The SmolVM.
        name: String,
        /// The absolute path in its machine.
        path: String,
    },
}

/// A copy to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transfer {
    /// Out of the SmolVM into `to` (never [`Spec::Remote`]).
    Out {
        /// The SmolVM.
        name: String,
        /// The path in its machine.
        path: String,
        /// Where to write.
        to: Spec,
    },
    /// Into the SmolVM from `from` (never [`Spec::Remote`]).
    In {
        /// Where to read.
        from: Spec,
        /// The SmolVM.
        name: String,
        /// The path in its machine (ending in `/` when the local name is to be kept).
        path: String,
    },
}

/// Reads one side: `-`, `NAME:/path` when NAME is a DNS-1123 subdomain and the path absolute,
/// anything else a local path (`./a:b`, `C:/x`, `notes:draft` stay local).
pub fn parse_spec(text: &str) -> Spec {
    if text == "-" {
        return Spec::Stdio;
    }
    match text.split_once(':') {
        Some((name, path)) if is_dns1123_subdomain(name) && path.starts_with('/') => Spec::Remote {
            name: name.to_string(),
            path: path.to_string(),
        },
        _ => Spec::Local(PathBuf::from(text)),
    }
}

/// Decides the copy `cp SRC DST` asks for: exactly one side must be in a SmolVM.
pub fn plan(src: &str, dst: &str) -> Result<Transfer, Error> {
    let (from, to) = (parse_spec(src), parse_spec(dst));
    for side in [&from, &to] {
        if let Spec::Local(path) = side
            && path.as_os_str().is_empty()
        {
            return Err(Error::InvalidArgument(
                "cp: an empty path; give a file, NAME:/abs/path or -".into(),
            ));
        }
        if let Spec::Remote { path, .. } = side
            && path.contains('\0')
        {
            return Err(Error::InvalidArgument(
                "cp: a path in the SmolVM cannot contain a NUL byte".into(),
            ));
        }
    }
    match (from, to) {
        (Spec::Remote { .. }, Spec::Remote { .. }) => Err(Error::InvalidArgument(
            "cp: both SRC and DST are in a SmolVM; one side must be local (a file or -)".into(),
        )),
        (Spec::Remote { name, path }, to) => Ok(Transfer::Out { name, path, to }),
        (from, Spec::Remote { name, path }) => Ok(Transfer::In { from, name, path }),
        _ => Err(Error::InvalidArgument(both_local_message(src, dst))),
    }
}

fn both_local_message(src: &str, dst: &str) -> String {
    let relative = [src, dst].into_iter().find(|text| {
        text.split_once(':')
            .is_some_and(|(name, path)| is_dns1123_subdomain(name) && !path.starts_with('/'))
    });
    match relative {
        Some(text) => {
            format!("cp: {text:?} is read as a local path: a path in a SmolVM must be absolute (NAME:/abs/path)")
        }
        None => "cp: both SRC and DST are local; one of them must be a SmolVM path, NAME:/abs/path".into(),
    }
}

/// The last segment of a path in the machine, if it names a file (`/etc/hosts` → `hosts`).
pub fn remote_file_name(path: &str) -> Option<&str> {
    path.rsplit('/')
        .next()
        .filter(|name| !name.is_empty() && *name != "." && *name != "..")
}

/// Where a copy out writes: `dst` itself, or, when `dst` is a directory, the remote file's
/// name inside it.
pub fn local_target(dst: &Path, dst_is_dir: bool, remote_path: &str) -> Result<PathBuf, Error> {
    let names_dir = dst_is_dir || dst.as_os_str().as_encoded_bytes().ends_with(b"/");
    if !names_dir {
        return Ok(dst.to_path_buf());
    }
    match remote_file_name(remote_path) {
        Some(name) => Ok(dst.join(name)),
        None => Err(Error::InvalidArgument(format!(
            "cp: {remote_path:?} does not end in a file name to copy into {}",
            dst.display()
        ))),
    }
}

/// Where a copy in writes: `remote_path` itself, or, when it ends in `/`, the local file's name
/// inside it.
pub fn remote_target(remote_path: &str, from: &Spec) -> Result<String, Error> {
    if !remote_path.ends_with('/') {
        return Ok(remote_path.to_string());
    }
    let name = match from {
        Spec::Local(path) => path.file_name().and_then(|n| n.to_str()),
        _ => None,
    };
    match name {
        Some(name) => Ok(format!("{remote_path}{name}")),
        None => Err(Error::InvalidArgument(format!(
            "cp: {remote_path:?} is a directory; give the file's name in the SmolVM (NAME:{remote_path}FILE)"
        ))),
    }
}

/// The mode as the server's query takes it: four octal digits (`0644`).
pub fn format_mode(mode: u32) -> String {
    format!("{:04o}", mode & 0o7777)
}

/// The mode a local file's permission bits give (the rwx bits only; 0644 off Unix).
pub fn mode_of(metadata: &std::fs::Metadata) -> u32 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        metadata.permissions().mode() & 0o777
    }
    #[cfg(not(unix))]
    {
        let _ = metadata;
        DEFAULT_MODE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(name: &str, path: &str) -> Spec {
        Spec::Remote {
            name: name.into(),
            path: path.into(),
        }
    }

    fn local(path: &str) -> Spec {
        Spec::Local(PathBuf::from(path))
    }

    #[test]
    fn specs() {
        let cases = [
            ("-", Spec::Stdio),
            ("web:/etc/hosts", remote("web", "/etc/hosts")),
            ("db.v2:/", remote("db.v2", "/")),
            ("web:/a:b", remote("web", "/a:b")),
            ("web:relative", local("web:relative")),
            ("web:", local("web:")),
            ("Web:/x", local("Web:/x")),
            ("C:/Users/x", local("C:/Users/x")),
            ("./web:/x", local("./web:/x")),
            ("ns/web:/x", local("ns/web:/x")),
            (":/x", local(":/x")),
            ("plain.txt", local("plain.txt")),
            ("/abs/file", local("/abs/file")),
        ];
        for (text, want) in cases {
            assert_eq!(parse_spec(text), want, "{text:?}");
        }
    }

    #[test]
    fn plans() {
        let ok = [
            (
                "web:/etc/hosts",
                "hosts",
                Transfer::Out {
                    name: "web".into(),
                    path: "/etc/hosts".into(),
                    to: local("hosts"),
                },
            ),
            (
                "web:/etc/hosts",
                "-",
                Transfer::Out {
                    name: "web".into(),
                    path: "/etc/hosts".into(),
                    to: Spec::Stdio,
                },
            ),
            (
                "app.conf",
                "web:/etc/",
                Transfer::In {
                    from: local("app.conf"),
                    name: "web".into(),
                    path: "/etc/".into(),
                },
            ),
            (
                "-",
                "web:/tmp/in",
                Transfer::In {
                    from: Spec::Stdio,
                    name: "web".into(),
                    path: "/tmp/in".into(),
                },
            ),
        ];
        for (src, dst, want) in ok {
            assert_eq!(plan(src, dst).expect("valid"), want, "{src} {dst}");
        }
        let bad = [
            ("web:/a", "db:/b", "both SRC and DST are in a SmolVM"),
            ("a", "b", "both SRC and DST are local"),
            ("-", "-", "both SRC and DST are local"),
            ("web:etc/hosts", "hosts", "must be absolute"),
            ("", "web:/x", "empty path"),
            ("web:/a\0b", "x", "NUL"),
        ];
        for (src, dst, want) in bad {
            let err = plan(src, dst).expect_err("invalid");
            assert_eq!(err.reason(), "InvalidArgument");
            assert!(err.to_string().contains(want), "{src} {dst}: {err}");
        }
    }

    #[test]
    fn targets() {
        let out = [
            ("out.txt", false, "/etc/hosts", Some("out.txt")),
            ("dir", true, "/etc/hosts", Some("dir/hosts")),
            ("dir/", false, "/etc/hosts", Some("dir/hosts")),
            ("dir", true, "/etc/", None),
            ("dir", true, "/", None),
            ("dir", true, "/a/..", None),
        ];
        for (dst, is_dir, remote_path, want) in out {
            let got = local_target(Path::new(dst), is_dir, remote_path).ok();
            assert_eq!(got, want.map(PathBuf::from), "{dst} {remote_path}");
        }
        let into = [
            ("/etc/app.conf", local("x.conf"), Some("/etc/app.conf")),
            ("/etc/", local("./conf/x.conf"), Some("/etc/x.conf")),
            ("/etc/", Spec::Stdio, None),
            ("/etc/", local(".."), None),
        ];
        for (remote_path, from, want) in into {
            assert_eq!(
                remote_target(remote_path, &from).ok().as_deref(),
                want,
                "{remote_path} {from:?}"
            );
        }
    }

    #[test]
    fn modes_format_as_four_octal_digits() {
        let formatted = [
            (0o644, "0644"),
            (0o7, "0007"),
            (0o4755, "4755"),
            (0, "0000"),
            (0o100644, "0644"),
        ];
        for (mode, want) in formatted {
            assert_eq!(format_mode(mode), want);
        }
    }
}
