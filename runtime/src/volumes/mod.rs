//! A machine's volumes (SPEC 2.5): the kubelet mounts them into the SmolVM's holder Pod, and
//! the agent passes them on to smolvm.
//!
//! The node API names a holder Pod by UID and each volume by its directory, never a host path.
//! The agent checks that the holder's identity files (a downward-API volume the kubelet writes
//! from the Pod) name the SmolVM's namespace and UID, finds each directory under
//! `<kubelet-root>/pods/<uid>/volumes/<plugin>/<directory>` (`…/mount` for CSI), checks that
//! its links resolve inside that Pod's own volumes directory, and bind-mounts it onto a stable
//! mount point `<state>/volumes/<machine>/<volume>`. smolvm is given the stable paths: it keeps
//! a machine's mounts for the machine's life, so a new holder (after an eviction) serves the
//! same machine once its binds are pointed at the new holder's directories (BindVolumes).
//!
//! The binds live in the agent's mount namespace, shared with the `smolvm serve` it runs; an
//! agent that restarts has none, so before every start or resume each stable mount point is
//! checked to be a bind of the recorded holder's directory and bound again, or the start is
//! refused (`VolumeNotMounted`): a machine never starts over an empty directory. The holder's
//! preStop hook (the release hook, [`crate::nodeapi::release`]) stops the machine and undoes the
//! binds before the kubelet unmounts anything; the record then says released, and no start is
//! allowed until a BindVolumes.
//!
//! [`plan`] holds the decisions (pure), [`mounts`] the syscalls, [`record`] what is kept.

pub mod mounts;
pub mod plan;
pub mod record;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use smolvm_api::nodeapi::{ErrorCode, MachineVolumes, MountedVolume, NodeApiError, VolumeMount, VolumeMounts};

use crate::state_files::Records;
use crate::vmm::HostMount;
pub use mounts::{Binder, MountBinder};
use plan::{BindStep, Layout, refusal};
pub use record::{RecordedMount, VolumeRecord};

/// The kubelet's default root directory.
pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";

/// Most bytes read of one identity file.
const MAX_IDENTITY_BYTES: u64 = 512;

/// How the agent serves volumes.
#[derive(Debug)]
pub struct VolumeOptions {
    /// The kubelet's root directory as the agent sees it (`--kubelet-root-dir`).
    pub kubelet_root: PathBuf,
    /// Where the stable mount points live (`<state>/volumes`); `None` refuses machines with
    /// volumes (an agent without a state directory).
    pub stable_root: Option<PathBuf>,
    /// Where the records are kept; `None` keeps them in memory (they go with the process).
    pub records: Option<PathBuf>,
    /// The listener of the release hook (`127.0.0.1:<--release-port>`), if any.
    pub release_listener: Option<std::net::TcpListener>,
    /// What mounts ([`MountBinder`] in production).
    pub binder: Arc<dyn Binder>,
}

impl Default for VolumeOptions {
    /// The kubelet's default root, no stable mount points (volumes refused), records in
    /// memory, no release hook, real mounts.
    fn default() -> Self {
        Self {
            kubelet_root: DEFAULT_KUBELET_ROOT.into(),
            stable_root: None,
            records: None,
            release_listener: None,
            binder: Arc::new(MountBinder),
        }
    }
}

/// A request's volumes, checked and found: what [`Volumes::bind`] mounts.
#[derive(Debug, Clone)]
pub struct Prepared {
    record: VolumeRecord,
    /// Each mount's directory, its links resolved, in the record's order.
    sources: Vec<PathBuf>,
}

/// The agent's volumes: where they are found and bound, and the records.
#[derive(Debug)]
pub struct Volumes {
    layout: Option<Layout>,
    records: Records<VolumeRecord>,
    binder: Arc<dyn Binder>,
}

/// 500 `RuntimeError` for a file system step of the agent's own that failed.
fn agent_failure(what: impl std::fmt::Display, error: &std::io::Error) -> NodeApiError {
    NodeApiError {
        code: ErrorCode::RuntimeError,
        message: format!("{what}: {error}"),
        details: None,
    }
}

/// Makes `dir` (and its parents) traversable by the uids smolvm drops its machines to, listable
/// by root only.
fn make_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().recursive(true).mode(0o711).create(dir)
}

impl Volumes {
    /// Volumes found under `options.kubelet_root`, bound under `options.stable_root` (made,
    /// and its links resolved, here), recorded in `options.records`.
    pub fn new(options: &VolumeOptions) -> std::io::Result<Self> {
        let layout = match &options.stable_root {
            Some(root) => {
                make_dir(root)?;
                Some(Layout {
                    kubelet_root: options.kubelet_root.clone(),
                    stable_root: std::fs::canonicalize(root)?,
                })
            }
            None => None,
        };
        Ok(Self {
            layout,
            records: match &options.records {
                Some(dir) => Records::in_dir(dir),
                None => Records::in_memory(),
            },
            binder: options.binder.clone(),
        })
    }

    /// Volumes that refuse every machine with volumes (no state directory).
    pub fn unconfigured() -> Self {
        Self {
            layout: None,
            records: Records::in_memory(),
            binder: Arc::new(MountBinder),
        }
    }

    fn layout(&self) -> Result<&Layout, NodeApiError> {
        self.layout.as_ref().ok_or_else(|| NodeApiError {
            code: ErrorCode::RuntimeError,
            message: "this agent keeps no state directory for volume mount points: it serves no machine with volumes"
                .into(),
            details: None,
        })
    }

    /// The record of `machine`'s volumes, if it has any.
    pub fn record(&self, machine: &str) -> Option<VolumeRecord> {
        self.records.read(machine)
    }

    /// The machines with a record of volumes, sorted.
    pub fn machines(&self) -> Vec<String> {
        self.records.names()
    }

    /// `machine`'s volumes as the node API reports them: the holder and, for each volume, the
    /// stable path smolvm was given.
    pub fn status(&self, machine: &str) -> Option<MachineVolumes> {
        let record = self.record(machine)?;
        let stable = |name: &str| {
            self.layout
                .as_ref()
                .map(|l| l.stable_path(machine, name).display().to_string())
                .unwrap_or_default()
        };
        Some(MachineVolumes {
            holder_uid: record.holder_uid.clone(),
            mounts: record
                .mounts
                .iter()
                .map(|m| MountedVolume {
                    name: m.name.clone(),
                    source: stable(&m.name),
                    target: m.target.clone(),
                    read_only: m.read_only,
                })
                .collect(),
        })
    }

    /// The host mounts smolvm is given for `machine`: each volume's stable path.
    pub fn host_mounts(&self, machine: &str, record: &VolumeRecord) -> Result<Vec<HostMount>, NodeApiError> {
        let layout = self.layout()?;
        Ok(record
            .mounts
            .iter()
            .map(|m| HostMount {
                source: layout.stable_path(machine, &m.name),
                target: m.target.clone(),
                read_only: m.read_only,
            })
            .collect())
    }

    /// The machines whose record holds the digest of `token` (each record compared in
    /// constant time).
    pub fn held_by(&self, token: &[u8]) -> Vec<String> {
        self.records
            .all()
            .into_iter()
            .filter(|(_, record)| record::token_matches(&record.token_sha256, token))
            .map(|(name, _)| name)
            .collect()
    }

    /// Checks a request for `machine` (it must already have passed [`plan::check_request`])
    /// against the kubelet's directories: the holder's identity, then each volume's directory
    /// found, resolved inside the holder, and a directory. Nothing is mounted.
    pub fn prepare(&self, machine: &str, request: &VolumeMounts) -> Result<Prepared, NodeApiError> {
        let layout = self.layout()?;
        let volumes = self.holder_volumes(layout, &request.holder_uid, request.mounts.first())?;
        self.check_identity(layout, &request.holder_uid, &request.namespace, machine)?;
        let sources = request
            .mounts
            .iter()
            .map(|mount| resolve(&volumes, mount))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Prepared {
            record: VolumeRecord::of(request),
            sources,
        })
    }

    /// The holder's volumes directory, its links resolved; 409 `VolumeNotMounted` (naming
    /// `first`) when the kubelet has none for it (the Pod is not on this node, not yet set up,
    /// or gone).
    fn holder_volumes(
        &self,
        layout: &Layout,
        holder_uid: &str,
        first: Option<&VolumeMount>,
    ) -> Result<PathBuf, NodeApiError> {
        std::fs::canonicalize(layout.holder_volumes(holder_uid)).map_err(|_| {
            plan::not_mounted(
                first.map_or("", |m| m.name.as_str()),
                format!("the kubelet has no volumes directory for holder Pod {holder_uid} on this node"),
            )
        })
    }

    fn check_identity(
        &self,
        layout: &Layout,
        holder: &str,
        namespace: &str,
        machine: &str,
    ) -> Result<(), NodeApiError> {
        let dir = layout.identity_dir(holder);
        let read = |file: &str| read_identity(&dir, file);
        let (found_namespace, found_uid) = (
            read(smolvm_api::constants::volumes::IDENTITY_NAMESPACE_FILE),
            read(smolvm_api::constants::volumes::IDENTITY_SMOLVM_UID_FILE),
        );
        plan::check_identity(
            holder,
            (found_namespace.as_deref(), found_uid.as_deref()),
            namespace,
            machine,
        )
    }

    /// Records `prepared` for `machine` (the intent first: a crash from here leaves a record a
    /// delete cleans up), then binds each volume onto its stable mount point. Answers the host
    /// mounts smolvm is given. A failure leaves what was bound: the caller undoes it
    /// ([`Volumes::remove`]) or the check before a start ([`Volumes::ensure_bound`]) finishes it.
    pub fn bind(&self, machine: &str, prepared: &Prepared) -> Result<Vec<HostMount>, NodeApiError> {
        let layout = self.layout()?;
        self.records
            .write(machine, &prepared.record)
            .map_err(|e| agent_failure(format!("cannot record the volumes of machine '{machine}'"), &e))?;
        for (mount, source) in prepared.record.mounts.iter().zip(&prepared.sources) {
            self.bind_one(layout, machine, mount, source)?;
        }
        self.host_mounts(machine, &prepared.record)
    }

    /// Makes `mount`'s stable mount point a bind of `source` ([`plan::plan_bind`]).
    fn bind_one(
        &self,
        layout: &Layout,
        machine: &str,
        mount: &RecordedMount,
        source: &Path,
    ) -> Result<(), NodeApiError> {
        let target = layout.stable_path(machine, &mount.name);
        make_dir(&target).map_err(|e| agent_failure(format!("cannot make {}", target.display()), &e))?;
        let state = self
            .binder
            .state(&target, source)
            .map_err(|e| agent_failure(format!("cannot read what is mounted at {}", target.display()), &e))?;
        let step = plan::plan_bind(state, mount.read_only);
        if step == BindStep::Rebind {
            self.binder
                .unbind(&target)
                .map_err(|e| agent_failure(format!("cannot unmount {}", target.display()), &e))?;
        }
        if step != BindStep::Keep {
            self.binder.bind(source, &target, mount.read_only).map_err(|error| {
                if error.kind() == std::io::ErrorKind::NotFound {
                    plan::not_mounted(&mount.name, "its directory went while it was being bound")
                } else {
                    agent_failure(
                        format!("volume '{}': cannot bind it onto {}", mount.name, target.display()),
                        &error,
                    )
                }
            })?;
            tracing::info!(%machine, volume = %mount.name, read_only = mount.read_only, rebound = (step == BindStep::Rebind), "volume bound");
        }
        Ok(())
    }

    /// Before a start or a resume of `machine`: each stable mount point is a bind of the
    /// recorded holder's directory, bound again where it is not (after an agent restart). A
    /// released holder, or a directory no longer there, is 409 `VolumeNotMounted`; a machine
    /// without volumes passes.
    pub fn ensure_bound(&self, machine: &str) -> Result<(), NodeApiError> {
        let Some(record) = self.record(machine) else {
            return Ok(());
        };
        let first = record.mounts.first().map(|m| m.name.as_str()).unwrap_or_default();
        if record.released {
            return Err(plan::not_mounted(
                first,
                format!(
                    "its holder Pod {} was released (it is stopping): point the machine at its new holder (BindVolumes) before it starts",
                    record.holder_uid
                ),
            ));
        }
        let layout = self.layout()?;
        let as_mount = |m: &RecordedMount| VolumeMount {
            name: m.name.clone(),
            directory: m.directory.clone(),
            target: m.target.clone(),
            read_only: m.read_only,
        };
        let first_mount = record.mounts.first().map(as_mount);
        let volumes = self.holder_volumes(layout, &record.holder_uid, first_mount.as_ref())?;
        self.check_identity(layout, &record.holder_uid, &record.namespace, machine)?;
        for mount in &record.mounts {
            let source = resolve(&volumes, &as_mount(mount))?;
            self.bind_one(layout, machine, mount, &source)?;
        }
        Ok(())
    }

    /// The holder's release: the record says released (no start until a BindVolumes), then
    /// every bind of `machine` is undone. Answers the volumes that were mounted.
    pub fn release(&self, machine: &str) -> Result<Vec<String>, NodeApiError> {
        let Some(record) = self.record(machine) else {
            return Ok(Vec::new());
        };
        if !record.released {
            let released = VolumeRecord {
                released: true,
                ..record.clone()
            };
            self.records
                .write(machine, &released)
                .map_err(|e| agent_failure(format!("cannot record the release of machine '{machine}'"), &e))?;
        }
        self.unbind_all(machine, &record)
    }

    fn unbind_all(&self, machine: &str, record: &VolumeRecord) -> Result<Vec<String>, NodeApiError> {
        let layout = self.layout()?;
        let mut unmounted = Vec::new();
        for mount in &record.mounts {
            let target = layout.stable_path(machine, &mount.name);
            let was = self
                .binder
                .unbind(&target)
                .map_err(|e| agent_failure(format!("cannot unmount {}", target.display()), &e))?;
            if was {
                unmounted.push(mount.name.clone());
            }
        }
        Ok(unmounted)
    }

    /// After `machine` is deleted: its binds undone, its stable mount points removed (only
    /// empty directories are: never a volume's files), its record dropped. A failure keeps the
    /// record, so that the next delete tries again.
    pub fn remove(&self, machine: &str) -> Result<(), NodeApiError> {
        let Some(record) = self.record(machine) else {
            return Ok(());
        };
        let layout = self.layout()?;
        self.unbind_all(machine, &record)?;
        for mount in &record.mounts {
            remove_empty_dir(&layout.stable_path(machine, &mount.name))?;
        }
        remove_empty_dir(&layout.machine_dir(machine))?;
        self.records.remove(machine);
        Ok(())
    }
}

/// Removes an empty directory (a missing one is fine); anything in it stays, and is an error.
fn remove_empty_dir(dir: &Path) -> Result<(), NodeApiError> {
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(agent_failure(
            format!("cannot remove the mount point {} (left as it is)", dir.display()),
            &error,
        )),
    }
}

/// One identity file of a holder (at most [`MAX_IDENTITY_BYTES`]), if it is readable and
/// resolves inside the identity volume.
fn read_identity(dir: &Path, file: &str) -> Option<String> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let path = std::fs::canonicalize(dir.join(file)).ok()?;
    if !path.starts_with(&dir) {
        return None;
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_IDENTITY_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// `mount`'s directory under the holder's `volumes` (its links resolved): found under exactly
/// one plugin directory ([`plan::choose_plugin`]), resolved inside the holder
/// ([`plan::check_contained`]), and a directory (else 409 `VolumeNotMounted`).
fn resolve(volumes: &Path, mount: &VolumeMount) -> Result<PathBuf, NodeApiError> {
    let plugins = std::fs::read_dir(volumes)
        .map_err(|e| agent_failure(format!("cannot list {}", volumes.display()), &e))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|plugin| plugin.starts_with(|c: char| c.is_ascii_alphanumeric()));
    let mut found: Vec<String> = plugins
        .filter(|plugin| std::fs::symlink_metadata(plan::plugin_path(volumes, plugin, &mount.directory)).is_ok())
        .collect();
    found.sort();
    let plugin = plan::choose_plugin(mount, &found)?;
    let path = plan::plugin_path(volumes, plugin, &mount.directory);
    let resolved = std::fs::canonicalize(&path)
        .map_err(|_| plan::not_mounted(&mount.name, "its directory leads nowhere (a link to nothing)"))?;
    plan::check_contained(volumes, &resolved, &mount.name)?;
    if !resolved.is_dir() {
        return Err(refusal(
            ErrorCode::VolumeNotMounted,
            format!("volume '{}': it is not a directory in the holder Pod", mount.name),
            serde_json::json!({ "volume": mount.name }),
        ));
    }
    Ok(resolved)
}
