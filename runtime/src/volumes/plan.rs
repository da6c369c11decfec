//! The pure part of a machine's volumes: where things are (the kubelet's directories of a
//! holder Pod, the agent's stable mount points), what a request may name, whether a resolved
//! directory stays inside its holder, whether a create or a re-bind matches what a machine was
//! made with, and what to do with a stable mount point given what is mounted there. Every
//! function here is a function of its inputs; the file system is read in [`super`] and
//! mounted in [`super::mounts`].

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use smolvm_api::constants::MACHINE_NAME_PREFIX;
use smolvm_api::constants::volumes::IDENTITY_VOLUME;
use smolvm_api::nodeapi::{ErrorCode, NodeApiError, VolumeMount, VolumeMounts};

use super::record::VolumeRecord;

/// The kubelet's plugin directory of CSI volumes: a volume's files are in `<pv>/mount`.
pub const CSI_PLUGIN: &str = "kubernetes.io~csi";
/// The kubelet's plugin directory of downward-API volumes (the holder's identity volume).
pub const DOWNWARD_API_PLUGIN: &str = "kubernetes.io~downward-api";
/// Most volumes of one machine (the schema's most, `smolvm_api::volume::MAX_VOLUMES_SCHEMA`).
pub const MAX_MOUNTS: usize = smolvm_api::volume::MAX_VOLUMES_SCHEMA;
/// Fewest bytes of a release token (the controller makes 32 random bytes, 64 hex digits).
pub const MIN_TOKEN_BYTES: usize = 32;
/// Most bytes of a release token.
pub const MAX_TOKEN_BYTES: usize = 1024;
/// Most bytes of a holder UID (Kubernetes UIDs are 36-character UUIDs).
pub const MAX_HOLDER_UID_BYTES: usize = 128;
/// Most bytes of a guest path.
pub const MAX_TARGET_BYTES: usize = 4096;

/// A refusal of the node API: its stable code, a message and details.
pub fn refusal(code: ErrorCode, message: impl Into<String>, details: serde_json::Value) -> NodeApiError {
    NodeApiError {
        code,
        message: message.into(),
        details: Some(details),
    }
}

fn invalid(message: impl Into<String>) -> NodeApiError {
    NodeApiError {
        code: ErrorCode::InvalidRequest,
        message: message.into(),
        details: None,
    }
}

/// Where the agent finds a holder's volumes and keeps a machine's stable mount points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The kubelet's root directory (its `--root-dir`), as the agent sees it.
    pub kubelet_root: PathBuf,
    /// The directory of the stable mount points (`<state>/volumes`), its links resolved.
    pub stable_root: PathBuf,
}

impl Layout {
    /// `<kubelet-root>/pods/<holder>/volumes`: the holder Pod's volumes, one directory per
    /// volume plugin.
    pub fn holder_volumes(&self, holder_uid: &str) -> PathBuf {
        self.kubelet_root.join("pods").join(holder_uid).join("volumes")
    }

    /// The holder's identity volume (its downward-API files `namespace` and `smolvm-uid`).
    pub fn identity_dir(&self, holder_uid: &str) -> PathBuf {
        self.holder_volumes(holder_uid)
            .join(DOWNWARD_API_PLUGIN)
            .join(IDENTITY_VOLUME)
    }

    /// `<stable-root>/<machine>`: the directory of a machine's stable mount points.
    pub fn machine_dir(&self, machine: &str) -> PathBuf {
        self.stable_root.join(machine)
    }

    /// `<stable-root>/<machine>/<volume>`: the path smolvm is given for a volume, the same for
    /// the machine's whole life whichever holder serves it.
    pub fn stable_path(&self, machine: &str, volume: &str) -> PathBuf {
        self.machine_dir(machine).join(volume)
    }
}

/// The path of `directory` under one plugin directory of a holder's `volumes`: the kubelet
/// keeps a CSI volume's files in its `mount` subdirectory.
pub fn plugin_path(volumes: &Path, plugin: &str, directory: &str) -> PathBuf {
    let path = volumes.join(plugin).join(directory);
    if plugin == CSI_PLUGIN { path.join("mount") } else { path }
}

/// The SmolVM UID a machine name carries (`svm-<uid>`); `None` for a name the operator did not
/// make.
pub fn machine_uid(machine: &str) -> Option<&str> {
    machine.strip_prefix(MACHINE_NAME_PREFIX).filter(|uid| !uid.is_empty())
}

fn dns1123_label(name: &str) -> Result<(), String> {
    smolvm_api::syntax::check_dns1123_subdomain(name)?;
    if name.contains('.') || name.len() > 63 {
        return Err("is not a DNS-1123 label (at most 63 lower-case letters, digits and '-')".into());
    }
    Ok(())
}

/// A directory name that would leave the holder's plugin directory: a separator, `.` or
/// `..`, or a NUL.
fn leaves(directory: &str) -> bool {
    directory.is_empty() || directory == "." || directory == ".." || directory.contains(['/', '\0'])
}

/// Checks a guest path: absolute, not `/` alone, no `.` or `..` segment, no NUL, bounded.
fn check_target(target: &str) -> Result<(), String> {
    if !target.starts_with('/') || target.trim_matches('/').is_empty() {
        return Err("must be an absolute path other than /".into());
    }
    if target.len() > MAX_TARGET_BYTES || target.contains('\0') {
        return Err(format!("is longer than {MAX_TARGET_BYTES} bytes or holds a NUL"));
    }
    if target.split('/').any(|s| s == "." || s == "..") {
        return Err("has a `.` or `..` segment".into());
    }
    Ok(())
}

/// The guest path without trailing separators, to compare targets.
fn normal_target(target: &str) -> &str {
    target.trim_end_matches('/')
}

/// Checks what a create or a re-bind names before anything is read: the holder's UID (one path
/// segment), the namespace, the release token, and each mount (a DNS-1123 label, a directory
/// of one segment, an absolute guest path), names and guest paths unique, at most
/// [`MAX_MOUNTS`]. A directory that would leave the holder's plugin directory is 403
/// `VolumePathOutsideHolder`; anything else wrong is 400 `InvalidRequest`.
pub fn check_request(request: &VolumeMounts) -> Result<(), NodeApiError> {
    let uid = &request.holder_uid;
    if uid.is_empty()
        || uid.len() > MAX_HOLDER_UID_BYTES
        || !uid
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(invalid(format!(
            "volumes.holderUid {uid:?} is not a Pod UID (lower-case letters, digits and '-', at most {MAX_HOLDER_UID_BYTES})"
        )));
    }
    dns1123_label(&request.namespace).map_err(|why| invalid(format!("volumes.namespace {why}")))?;
    let token = request.release_token.expose();
    if !(MIN_TOKEN_BYTES..=MAX_TOKEN_BYTES).contains(&token.len()) || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(format!(
            "volumes.releaseToken must be {MIN_TOKEN_BYTES} to {MAX_TOKEN_BYTES} visible ASCII characters (the holder's preStop sends it as a header)"
        )));
    }
    if request.mounts.is_empty() {
        return Err(invalid(
            "volumes.mounts is empty: omit volumes for a machine without any",
        ));
    }
    if request.mounts.len() > MAX_MOUNTS {
        return Err(invalid(format!(
            "volumes.mounts has {} entries; at most {MAX_MOUNTS}",
            request.mounts.len()
        )));
    }
    let mut names = BTreeSet::new();
    let mut targets = BTreeSet::new();
    for (i, mount) in request.mounts.iter().enumerate() {
        let at = format!("volumes.mounts[{i}]");
        dns1123_label(&mount.name).map_err(|why| invalid(format!("{at}.name {:?} {why}", mount.name)))?;
        if leaves(&mount.directory) {
            return Err(refusal(
                ErrorCode::VolumePathOutsideHolder,
                format!(
                    "volume '{}': directory {:?} would leave the holder Pod's volumes directory",
                    mount.name, mount.directory
                ),
                serde_json::json!({ "volume": mount.name }),
            ));
        }
        smolvm_api::syntax::check_dns1123_subdomain(&mount.directory)
            .map_err(|why| invalid(format!("{at}.directory {:?} {why}", mount.directory)))?;
        if mount.directory == IDENTITY_VOLUME {
            return Err(invalid(format!(
                "{at}.directory names the holder's identity volume {IDENTITY_VOLUME}, which is the agent's"
            )));
        }
        check_target(&mount.target).map_err(|why| invalid(format!("{at}.target {:?} {why}", mount.target)))?;
        if !names.insert(mount.name.as_str()) {
            return Err(invalid(format!("{at}.name {:?} appears twice", mount.name)));
        }
        if !targets.insert(normal_target(&mount.target)) {
            return Err(invalid(format!("{at}.target {:?} appears twice", mount.target)));
        }
    }
    Ok(())
}

/// Checks a holder's identity files (as read, `None` when missing or unreadable) against the
/// machine: they must name `namespace` and the SmolVM UID of `machine`, else 403
/// `HolderNotOwned` naming the holder.
pub fn check_identity(
    holder_uid: &str,
    files: (Option<&str>, Option<&str>),
    namespace: &str,
    machine: &str,
) -> Result<(), NodeApiError> {
    let not_owned = |why: String| {
        refusal(
            ErrorCode::HolderNotOwned,
            format!("holder Pod {holder_uid} is not machine '{machine}''s holder: {why}"),
            serde_json::json!({ "holderUid": holder_uid }),
        )
    };
    let (Some(found_namespace), Some(found_uid)) = files else {
        return Err(not_owned(format!(
            "it has no readable identity files ({IDENTITY_VOLUME}/namespace and smolvm-uid)"
        )));
    };
    let Some(uid) = machine_uid(machine) else {
        return Err(not_owned(format!(
            "the machine's name does not carry a SmolVM UID ({MACHINE_NAME_PREFIX}<uid>)"
        )));
    };
    let (found_namespace, found_uid) = (found_namespace.trim(), found_uid.trim());
    if found_namespace != namespace || found_uid != uid {
        return Err(not_owned(format!(
            "its identity names namespace {found_namespace:?} and SmolVM UID {found_uid:?}, not {namespace:?} and {uid:?}"
        )));
    }
    Ok(())
}

/// The one plugin directory among `found` (those in which the holder has `mount`'s directory):
/// none is 409 `VolumeNotMounted`, more than one 409 `Conflict` naming them (the directory is
/// ambiguous).
pub fn choose_plugin<'a>(mount: &VolumeMount, found: &'a [String]) -> Result<&'a str, NodeApiError> {
    match found {
        [one] => Ok(one),
        [] => Err(not_mounted(
            &mount.name,
            format!(
                "the kubelet has not mounted directory {:?} in the holder Pod (yet)",
                mount.directory
            ),
        )),
        many => Err(refusal(
            ErrorCode::Conflict,
            format!(
                "volume '{}': the holder Pod has a directory {:?} under {} volume plugins ({}); it names no one volume",
                mount.name,
                mount.directory,
                many.len(),
                many.join(", ")
            ),
            serde_json::json!({ "volume": mount.name, "plugins": many }),
        )),
    }
}

/// 409 `VolumeNotMounted` for `volume`, saying why.
pub fn not_mounted(volume: &str, why: impl std::fmt::Display) -> NodeApiError {
    refusal(
        ErrorCode::VolumeNotMounted,
        format!("volume '{volume}': {why}"),
        serde_json::json!({ "volume": volume }),
    )
}

/// Whether `resolved` (a path with its links resolved) lies inside one plugin directory of
/// the holder's `volumes` (also resolved): a volume's directory, never `volumes` itself or a
/// plugin directory, never elsewhere. Else 403 `VolumePathOutsideHolder` naming the volume.
pub fn check_contained(volumes: &Path, resolved: &Path, volume: &str) -> Result<(), NodeApiError> {
    let inside = resolved
        .strip_prefix(volumes)
        .ok()
        .filter(|rest| rest.components().count() >= 2 && rest.components().all(|c| matches!(c, Component::Normal(_))))
        .is_some();
    if inside {
        Ok(())
    } else {
        Err(refusal(
            ErrorCode::VolumePathOutsideHolder,
            format!("volume '{volume}': its directory resolves outside the holder Pod's volumes directory"),
            serde_json::json!({ "volume": volume }),
        ))
    }
}

/// What a machine was made with that a create or a re-bind must match: each volume's name,
/// guest path and read-only flag (smolvm keeps them for the machine's life), and the
/// namespace. The holder, the directories and the release token may differ: that is the
/// binding, which BindVolumes changes.
fn fixed(
    namespace: &str,
    mounts: impl Iterator<Item = (String, String, bool)>,
) -> (String, BTreeSet<(String, String, bool)>) {
    (namespace.to_string(), mounts.collect())
}

/// The spec fields (`volumes`) in which a request's volumes differ from what `recorded` says
/// the machine was made with: a machine with volumes asked without, or the other way, or other
/// volume names, guest paths, read-only flags or namespace. Empty when they match.
pub fn differences(requested: Option<&VolumeMounts>, recorded: Option<&VolumeRecord>) -> Vec<&'static str> {
    let same = match (requested, recorded) {
        (None, None) => true,
        (Some(requested), Some(recorded)) => {
            fixed(
                &requested.namespace,
                requested
                    .mounts
                    .iter()
                    .map(|m| (m.name.clone(), normal_target(&m.target).to_string(), m.read_only)),
            ) == fixed(
                &recorded.namespace,
                recorded
                    .mounts
                    .iter()
                    .map(|m| (m.name.clone(), normal_target(&m.target).to_string(), m.read_only)),
            )
        }
        _ => false,
    };
    if same { Vec::new() } else { vec!["volumes"] }
}

/// What is mounted at a stable mount point now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindState {
    /// Nothing (an empty directory, or none): after an agent restart, or never bound.
    Unbound,
    /// A mount, of the wanted source directory or not, read-only or not.
    Bound {
        /// It is the wanted source's directory (same device and inode).
        same_source: bool,
        /// It is mounted read-only.
        read_only: bool,
    },
}

/// What to do with a stable mount point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindStep {
    /// It is the wanted bind already.
    Keep,
    /// Bind the source onto it.
    Bind,
    /// Unmount what is there, then bind the source.
    Rebind,
}

/// The step that makes a stable mount point a bind of the wanted source, `read_only` as asked.
pub fn plan_bind(state: BindState, read_only: bool) -> BindStep {
    match state {
        BindState::Unbound => BindStep::Bind,
        BindState::Bound {
            same_source: true,
            read_only: ro,
        } if ro == read_only => BindStep::Keep,
        BindState::Bound { .. } => BindStep::Rebind,
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::{token_digest, token_matches};
    use super::*;
    use smolvm_api::nodeapi::Sensitive;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn mount(name: &str, directory: &str, target: &str) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            directory: directory.into(),
            target: target.into(),
            read_only: false,
        }
    }

    fn request(mounts: Vec<VolumeMount>) -> VolumeMounts {
        VolumeMounts {
            holder_uid: "6f1c2a5e-0c1d-4a8e-9d52-1b2c3d4e5f60".into(),
            namespace: "team-a".into(),
            release_token: Sensitive(TOKEN.into()),
            mounts,
        }
    }

    fn code(result: Result<(), NodeApiError>) -> Option<String> {
        result.err().map(|e| e.code.as_str().to_string())
    }

    #[test]
    fn paths_are_derived_from_the_holder_and_the_machine() {
        let layout = Layout {
            kubelet_root: "/var/lib/kubelet".into(),
            stable_root: "/var/lib/smolvm/volumes".into(),
        };
        assert_eq!(
            layout.holder_volumes("u1"),
            Path::new("/var/lib/kubelet/pods/u1/volumes")
        );
        assert_eq!(
            layout.identity_dir("u1"),
            Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~downward-api/smolvm-holder-identity")
        );
        assert_eq!(
            layout.stable_path("svm-a", "data"),
            Path::new("/var/lib/smolvm/volumes/svm-a/data")
        );
        let volumes = Path::new("/k/pods/u1/volumes");
        let cases = [
            (
                "kubernetes.io~local-volume",
                "pv-1",
                "/k/pods/u1/volumes/kubernetes.io~local-volume/pv-1",
            ),
            (
                "kubernetes.io~csi",
                "pv-2",
                "/k/pods/u1/volumes/kubernetes.io~csi/pv-2/mount",
            ),
            (
                "kubernetes.io~configmap",
                "cfg",
                "/k/pods/u1/volumes/kubernetes.io~configmap/cfg",
            ),
            ("kubernetes.io~secret", "s", "/k/pods/u1/volumes/kubernetes.io~secret/s"),
        ];
        for (plugin, directory, want) in cases {
            assert_eq!(plugin_path(volumes, plugin, directory), Path::new(want), "{plugin}");
        }
        assert_eq!(machine_uid("svm-abc"), Some("abc"));
        assert_eq!(machine_uid("svm-"), None);
        assert_eq!(machine_uid("other"), None);
    }

    #[test]
    fn requests_are_checked_before_anything_is_read() {
        let ok = || request(vec![mount("data", "pv-1", "/data"), mount("cfg", "cfg", "/etc/app/")]);
        assert_eq!(code(check_request(&ok())), None);
        type Change = fn(&mut VolumeMounts);
        let cases: Vec<(&str, Change, &str)> = vec![
            (
                "holder uid with a separator",
                |r| r.holder_uid = "../x".into(),
                "InvalidRequest",
            ),
            ("empty holder uid", |r| r.holder_uid.clear(), "InvalidRequest"),
            (
                "upper-case namespace",
                |r| r.namespace = "Team".into(),
                "InvalidRequest",
            ),
            (
                "short token",
                |r| r.release_token = Sensitive("short".into()),
                "InvalidRequest",
            ),
            (
                "token with a space",
                |r| r.release_token = Sensitive(format!("{TOKEN} x")),
                "InvalidRequest",
            ),
            ("no mounts", |r| r.mounts.clear(), "InvalidRequest"),
            (
                "too many mounts",
                |r| {
                    r.mounts = (0..=MAX_MOUNTS)
                        .map(|i| mount(&format!("v{i}"), "d", &format!("/v{i}")))
                        .collect()
                },
                "InvalidRequest",
            ),
            (
                "directory ..",
                |r| r.mounts[0].directory = "..".into(),
                "VolumePathOutsideHolder",
            ),
            (
                "directory .",
                |r| r.mounts[0].directory = ".".into(),
                "VolumePathOutsideHolder",
            ),
            (
                "directory with a separator",
                |r| r.mounts[0].directory = "../../other/volumes/x".into(),
                "VolumePathOutsideHolder",
            ),
            (
                "directory /",
                |r| r.mounts[0].directory = "/".into(),
                "VolumePathOutsideHolder",
            ),
            (
                "empty directory",
                |r| r.mounts[0].directory.clear(),
                "VolumePathOutsideHolder",
            ),
            (
                "directory not a subdomain",
                |r| r.mounts[0].directory = "PV_1".into(),
                "InvalidRequest",
            ),
            (
                "the identity volume",
                |r| r.mounts[0].directory = IDENTITY_VOLUME.into(),
                "InvalidRequest",
            ),
            ("name with a dot", |r| r.mounts[0].name = "a.b".into(), "InvalidRequest"),
            (
                "relative target",
                |r| r.mounts[0].target = "data".into(),
                "InvalidRequest",
            ),
            ("target /", |r| r.mounts[0].target = "/".into(), "InvalidRequest"),
            (
                "target with ..",
                |r| r.mounts[0].target = "/a/../b".into(),
                "InvalidRequest",
            ),
            ("names twice", |r| r.mounts[1].name = "data".into(), "InvalidRequest"),
            (
                "targets twice",
                |r| r.mounts[1].target = "/data/".into(),
                "InvalidRequest",
            ),
        ];
        for (case, change, want) in cases {
            let mut r = ok();
            change(&mut r);
            assert_eq!(code(check_request(&r)).as_deref(), Some(want), "{case}");
        }
    }

    #[test]
    fn the_identity_must_name_the_namespace_and_the_smolvm() {
        let cases = [
            ((Some("team-a"), Some("abc")), None),
            ((Some("team-a\n"), Some("abc\n")), None),
            ((Some("team-b"), Some("abc")), Some("HolderNotOwned")),
            ((Some("team-a"), Some("abd")), Some("HolderNotOwned")),
            ((None, Some("abc")), Some("HolderNotOwned")),
            ((Some("team-a"), None), Some("HolderNotOwned")),
        ];
        for (files, want) in cases {
            let result = check_identity("u1", files, "team-a", "svm-abc");
            assert_eq!(code(result.clone()).as_deref(), want, "{files:?}");
            if let Err(error) = result {
                assert_eq!(error.details, Some(serde_json::json!({"holderUid": "u1"})));
            }
        }
        assert_eq!(
            code(check_identity("u1", (Some("team-a"), Some("abc")), "team-a", "m1")).as_deref(),
            Some("HolderNotOwned"),
            "a machine not named svm-<uid> has no holder"
        );
    }

    #[test]
    fn a_directory_is_found_under_exactly_one_plugin() {
        let m = mount("data", "pv-1", "/data");
        let one = vec!["kubernetes.io~local-volume".to_string()];
        assert_eq!(choose_plugin(&m, &one).ok(), Some("kubernetes.io~local-volume"));
        let none: Vec<String> = Vec::new();
        assert_eq!(
            choose_plugin(&m, &none).err().map(|e| e.code),
            Some(ErrorCode::VolumeNotMounted)
        );
        let two = vec![
            "kubernetes.io~configmap".to_string(),
            "kubernetes.io~secret".to_string(),
        ];
        assert_eq!(choose_plugin(&m, &two).err().map(|e| e.code), Some(ErrorCode::Conflict));
    }

    #[test]
    fn a_resolved_directory_stays_in_its_holder() {
        let volumes = Path::new("/k/pods/u1/volumes");
        let cases = [
            ("/k/pods/u1/volumes/kubernetes.io~local-volume/pv-1", true),
            ("/k/pods/u1/volumes/kubernetes.io~csi/pv-2/mount", true),
            ("/k/pods/u1/volumes/kubernetes.io~configmap/cfg/sub", true),
            ("/k/pods/u1/volumes/kubernetes.io~configmap", false),
            ("/k/pods/u1/volumes", false),
            ("/k/pods/u1", false),
            ("/k/pods/u2/volumes/kubernetes.io~local-volume/pv-1", false),
            ("/k/pods/u1/volumes-x/a/b", false),
            ("/etc", false),
            ("/", false),
        ];
        for (resolved, inside) in cases {
            let result = check_contained(volumes, Path::new(resolved), "data");
            assert_eq!(result.is_ok(), inside, "{resolved}");
            if let Err(error) = result {
                assert_eq!(error.code, ErrorCode::VolumePathOutsideHolder);
                assert_eq!(error.details, Some(serde_json::json!({"volume": "data"})));
            }
        }
    }

    #[test]
    fn a_create_matches_on_names_targets_and_read_only_not_on_the_holder() {
        let base = request(vec![mount("data", "pv-1", "/data"), mount("cfg", "cfg", "/etc/app")]);
        let recorded = VolumeRecord::of(&base);
        type Change = fn(&mut VolumeMounts);
        let same: Vec<(&str, Change)> = vec![
            ("as made", |_| {}),
            ("a new holder", |r| r.holder_uid = "other-uid".into()),
            ("a new token", |r| r.release_token = Sensitive(format!("{TOKEN}x"))),
            ("a new directory", |r| r.mounts[0].directory = "pv-9".into()),
            ("another order", |r| r.mounts.reverse()),
            ("a trailing separator", |r| r.mounts[0].target = "/data/".into()),
        ];
        for (case, change) in same {
            let mut r = base.clone();
            change(&mut r);
            assert!(differences(Some(&r), Some(&recorded)).is_empty(), "{case}");
        }
        let differ: Vec<(&str, Change)> = vec![
            ("another target", |r| r.mounts[0].target = "/srv".into()),
            ("read-only", |r| r.mounts[0].read_only = true),
            ("another name", |r| r.mounts[0].name = "disk".into()),
            ("one volume fewer", |r| {
                r.mounts.pop();
            }),
            ("another namespace", |r| r.namespace = "team-b".into()),
        ];
        for (case, change) in differ {
            let mut r = base.clone();
            change(&mut r);
            assert_eq!(differences(Some(&r), Some(&recorded)), vec!["volumes"], "{case}");
        }
        assert!(differences(None, None).is_empty());
        assert_eq!(differences(Some(&base), None), vec!["volumes"]);
        assert_eq!(differences(None, Some(&recorded)), vec!["volumes"]);
    }

    #[test]
    fn a_stable_mount_point_is_bound_kept_or_bound_again() {
        let bound = |same_source, read_only| BindState::Bound { same_source, read_only };
        let cases = [
            (BindState::Unbound, false, BindStep::Bind),
            (BindState::Unbound, true, BindStep::Bind),
            (bound(true, false), false, BindStep::Keep),
            (bound(true, true), true, BindStep::Keep),
            (bound(true, false), true, BindStep::Rebind),
            (bound(true, true), false, BindStep::Rebind),
            (bound(false, false), false, BindStep::Rebind),
            (bound(false, true), true, BindStep::Rebind),
        ];
        for (state, read_only, step) in cases {
            assert_eq!(plan_bind(state, read_only), step, "{state:?} read_only={read_only}");
        }
    }

    #[test]
    fn only_the_digest_of_a_token_is_kept_and_compared() {
        let digest = token_digest(TOKEN.as_bytes());
        assert_eq!(digest.len(), 64);
        assert!(!digest.contains(TOKEN));
        assert!(token_matches(&digest, TOKEN.as_bytes()));
        assert!(!token_matches(&digest, b"another token"));
        assert!(!token_matches(&digest, b""));
        assert!(!token_matches("", TOKEN.as_bytes()));
    }
}
