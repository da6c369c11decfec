//! Volumes without a kubelet: a fake kubelet pods directory laid out as the kubelet lays out a
//! holder Pod's volumes, a recording TEST DOUBLE of the agent's mounts (for tests that may not
//! mount), a guard that unmounts what a test mounted, and the node API's volume requests.
//!
//! The layout the kubelet makes, and [`FakeKubelet`] copies: `<root>/pods/<pod-uid>/volumes/
//! <plugin>/<directory>`, the plugin `kubernetes.io~local-volume` (a local PV, under its PV's
//! name), `kubernetes.io~csi` (`<pv>/mount`), `kubernetes.io~configmap` and
//! `kubernetes.io~secret` (under the volume's name), and the holder's identity in
//! `kubernetes.io~downward-api/smolvm-holder-identity/{namespace,smolvm-uid}`, each file a link
//! into a `..data` link to a timestamped directory (the kubelet's atomic writer).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use smolvm_api::constants::volumes::{IDENTITY_NAMESPACE_FILE, IDENTITY_SMOLVM_UID_FILE, IDENTITY_VOLUME};
use smolvm_runtime::volumes::mounts::{Binder, MountBinder, mount_points_under};
use smolvm_runtime::volumes::plan::BindState;
use smolvm_runtime::volumes::{VolumeOptions, Volumes};

/// The kubelet's plugin directory of local PVs.
pub const LOCAL_VOLUME: &str = "kubernetes.io~local-volume";
/// The kubelet's plugin directory of CSI volumes.
pub const CSI: &str = "kubernetes.io~csi";
/// The kubelet's plugin directory of ConfigMap volumes.
pub const CONFIG_MAP: &str = "kubernetes.io~configmap";
/// The kubelet's plugin directory of Secret volumes.
pub const SECRET: &str = "kubernetes.io~secret";
/// The kubelet's plugin directory of downward-API volumes.
pub const DOWNWARD_API: &str = "kubernetes.io~downward-api";

/// A release token as the controller makes one (64 hex digits).
pub const TOKEN: &str = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";

/// A kubelet root directory with holder Pods laid out as the kubelet lays them out.
#[derive(Debug, Clone)]
pub struct FakeKubelet {
    root: PathBuf,
}

/// One holder Pod in a [`FakeKubelet`].
#[derive(Debug, Clone)]
pub struct FakeHolder {
    /// The Pod's UID.
    pub uid: String,
    volumes: PathBuf,
}

impl FakeKubelet {
    /// A kubelet root at `root` (made).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        std::fs::create_dir_all(root.join("pods")).expect("the kubelet's pods directory");
        Self { root }
    }

    /// The root directory (the agent's `--kubelet-root-dir`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A holder Pod `uid` whose identity names `namespace` and `smolvm_uid`.
    pub fn holder(&self, uid: &str, namespace: &str, smolvm_uid: &str) -> FakeHolder {
        let holder = FakeHolder {
            uid: uid.to_string(),
            volumes: self.root.join("pods").join(uid).join("volumes"),
        };
        holder.write_identity(namespace, smolvm_uid);
        holder
    }
}

impl FakeHolder {
    /// The Pod's `volumes` directory.
    pub fn volumes(&self) -> &Path {
        &self.volumes
    }

    /// A volume's directory under `plugin` (made): where its files are (`…/mount` for CSI).
    pub fn volume(&self, plugin: &str, directory: &str) -> PathBuf {
        let mut dir = self.volumes.join(plugin).join(directory);
        if plugin == CSI {
            dir.push("mount");
        }
        std::fs::create_dir_all(&dir).expect("a volume directory");
        dir
    }

    /// Writes the identity files as the kubelet's atomic writer does.
    pub fn write_identity(&self, namespace: &str, smolvm_uid: &str) {
        let dir = self.volumes.join(DOWNWARD_API).join(IDENTITY_VOLUME);
        let _ = std::fs::remove_dir_all(&dir);
        let data = dir.join("..2026_12_02_00_00_00.000000001");
        std::fs::create_dir_all(&data).expect("identity directory");
        std::fs::write(data.join(IDENTITY_NAMESPACE_FILE), namespace).expect("namespace file");
        std::fs::write(data.join(IDENTITY_SMOLVM_UID_FILE), smolvm_uid).expect("uid file");
        std::os::unix::fs::symlink("..2026_12_02_00_00_00.000000001", dir.join("..data")).expect("..data");
        for file in [IDENTITY_NAMESPACE_FILE, IDENTITY_SMOLVM_UID_FILE] {
            std::os::unix::fs::symlink(format!("..data/{file}"), dir.join(file)).expect("identity link");
        }
    }

    /// A link named `directory` under `plugin` that points at `to`.
    pub fn link(&self, plugin: &str, directory: &str, to: &Path) {
        let dir = self.volumes.join(plugin);
        std::fs::create_dir_all(&dir).expect("plugin directory");
        std::os::unix::fs::symlink(to, dir.join(directory)).expect("link");
    }
}

/// The node API's `VolumeMounts` (JSON) for `holder`: each mount `(name, directory, target,
/// readOnly)`, with [`TOKEN`] unless another token is given.
pub fn mounts_json(
    holder: &str,
    namespace: &str,
    token: Option<&str>,
    mounts: &[(&str, &str, &str, bool)],
) -> serde_json::Value {
    serde_json::json!({
        "holderUid": holder,
        "namespace": namespace,
        "releaseToken": token.unwrap_or(TOKEN),
        "mounts": mounts
            .iter()
            .map(|(name, directory, target, read_only)| serde_json::json!({
                "name": name, "directory": directory, "target": target, "readOnly": read_only
            }))
            .collect::<Vec<_>>(),
    })
}

/// TEST DOUBLE of the agent's mounts: binds are recorded, not made (for tests that may not
/// mount: a stable mount point then stays an empty directory). What is bound where, and read-only
/// or not, is what [`RecordingBinder::bound`] says.
#[derive(Debug, Default)]
pub struct RecordingBinder {
    binds: Mutex<HashMap<PathBuf, (PathBuf, bool)>>,
}

impl RecordingBinder {
    /// The source and read-only flag bound at `target`, if any.
    pub fn bound(&self, target: &Path) -> Option<(PathBuf, bool)> {
        self.binds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(target)
            .cloned()
    }

    /// How many binds are held now.
    pub fn count(&self) -> usize {
        self.binds.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Forgets every bind (what an agent restart does to its mount namespace).
    pub fn forget_all(&self) {
        self.binds.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl Binder for RecordingBinder {
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> std::io::Result<()> {
        if !source.is_dir() {
            return Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        }
        self.binds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(target.to_path_buf(), (source.to_path_buf(), read_only));
        Ok(())
    }

    fn unbind(&self, target: &Path) -> std::io::Result<bool> {
        Ok(self
            .binds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(target)
            .is_some())
    }

    fn state(&self, target: &Path, source: &Path) -> std::io::Result<BindState> {
        Ok(match self.bound(target) {
            None => BindState::Unbound,
            Some((bound, read_only)) => BindState::Bound {
                same_source: bound == source,
                read_only,
            },
        })
    }
}

/// Volumes found in `kubelet`'s pods directory, their stable mount points and records under
/// `state_dir`, bound by `binder`.
pub fn volume_options(kubelet: &FakeKubelet, state_dir: &Path, binder: Arc<dyn Binder>) -> VolumeOptions {
    VolumeOptions {
        kubelet_root: kubelet.root().to_path_buf(),
        stable_root: Some(state_dir.join("volumes")),
        records: Some(state_dir.join("volume-records")),
        release_listener: Some(std::net::TcpListener::bind("127.0.0.1:0").expect("bind the release hook")),
        binder,
    }
}

/// A node API's [`Volumes`] over `kubelet`, recording its binds in the returned double (for a
/// [`smolvm_runtime::nodeapi::NodeApiState::with_volumes`] without mount privileges).
pub fn recording_volumes(kubelet: &FakeKubelet, state_dir: &Path) -> (Arc<Volumes>, Arc<RecordingBinder>) {
    let binder = Arc::new(RecordingBinder::default());
    let mut options = volume_options(kubelet, state_dir, binder.clone());
    options.release_listener = None;
    let volumes = Volumes::new(&options).expect("the volumes' directories");
    (Arc::new(volumes), binder)
}

/// The release hook over `state` (the node API's), on a free loopback port, as the agent
/// serves it; [`crate::node::release_call`] calls it.
pub fn serve_release(state: smolvm_runtime::nodeapi::NodeApiState) -> smolvm_runtime::nodeapi::tls::PlainServer {
    smolvm_runtime::nodeapi::tls::PlainServer::start_bounded(
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind the release hook"),
        smolvm_runtime::nodeapi::release::router(state),
        smolvm_runtime::nodeapi::release::BOUNDS,
        "release hook",
    )
    .expect("serve the release hook")
}

/// Unmounts, when dropped, every mount at or under its directory (deepest first), so that a
/// test that really mounts leaves nothing mounted, even when it fails.
#[derive(Debug)]
pub struct UnmountOnDrop(pub PathBuf);

impl UnmountOnDrop {
    /// The mounts at or under the directory now.
    pub fn mounts(&self) -> Vec<PathBuf> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let dir = std::fs::canonicalize(&self.0).unwrap_or_else(|_| self.0.clone());
        mount_points_under(&mountinfo, &dir)
    }
}

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        for point in self.mounts() {
            if let Err(error) = MountBinder.unbind(&point) {
                eprintln!("cannot unmount {}: {error}", point.display());
            }
        }
    }
}

/// Whether this process may bind-mount (root with mount privileges in its namespace): tried
/// on a scratch directory under `dir`. `Err` is the reason to skip.
pub fn can_mount(dir: &Path) -> Result<(), String> {
    let (source, target) = (dir.join("can-mount-source"), dir.join("can-mount-target"));
    std::fs::create_dir_all(&source).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&target).map_err(|e| e.to_string())?;
    let source = std::fs::canonicalize(&source).map_err(|e| e.to_string())?;
    let target = std::fs::canonicalize(&target).map_err(|e| e.to_string())?;
    let _guard = UnmountOnDrop(target.clone());
    MountBinder
        .bind(&source, &target, true)
        .map_err(|e| format!("this process cannot bind-mount ({e}): run as root"))?;
    MountBinder.unbind(&target).map_err(|e| e.to_string())?;
    Ok(())
}
