//! Volumes (SPEC 2.5): what a SmolVM with `spec.volumes` needs besides its machine, decided as
//! data from what a pass observed ([`Seen`]), as the rest of the lifecycle core is:
//!
//! - before placement ([`before_placement`]): the claims to make from templates, whether the VM
//!   must wait (a claim missing or another's), and where bound claims' data can be reached;
//! - once bound ([`judge`]): the claims, the holder Pod to make ([`holder::holder_pod`]) or to
//!   delete, the VolumesReady condition, the machine's [`VolumeMounts`], and whether the holder
//!   the machine's mounts point at was evicted; [`step`] says what that means for the machine's
//!   next call (wait, point its mounts at the new holder with BindVolumes, stop it);
//! - at delete ([`on_delete`]): the holder Pod, then the claims whose policy is `Delete`.
//!
//! Pure; the reads and writes are [`kube`]'s.

pub mod claims;
pub mod holder;
pub mod kube;

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{
    api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod},
    jiff::Timestamp,
};
use smolvm_api::{
    Phase, SmolVM, SmolVMStatus,
    constants::{condition, reason, volumes::DEFAULT_RELEASE_PORT},
    nodeapi::{MachineState, MachineStatus, Sensitive, VolumeMount, VolumeMounts},
    volume::Source as VolumeSource,
};

use self::claims::{Claim, ClaimState};
use self::holder::HolderState;
use super::rules::{self, MachineAction};
use super::workload::Source;
use crate::placement::VolumeReach;

/// The controller's settings for holder Pods (`--holder-image`, `--release-hook-port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The holders' image (the runtime image); without it no holder is made.
    pub holder_image: Option<String>,
    /// The port of the agents' release hook on their node's loopback.
    pub release_port: u16,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            holder_image: None,
            release_port: DEFAULT_RELEASE_PORT,
        }
    }
}

/// Whether a ConfigMap or Secret a volume names exists, as far as the controller may tell (it
/// reads existence only, never the contents).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// It exists.
    Found,
    /// It does not.
    Missing,
    /// The controller may not read it (without the workload-secrets component).
    Forbidden,
}

/// What a pass observed of a SmolVM's volumes: from the caches where the controller watches
/// (claims, PersistentVolumes, holder Pods), from GETs where it does not (ConfigMaps, Secrets,
/// the kubelet's events about a holder).
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// The holders' settings.
    pub settings: Settings,
    /// Every claim the volumes use, by name: `None` where none exists.
    pub claims: BTreeMap<String, Option<Arc<PersistentVolumeClaim>>>,
    /// The PersistentVolumes those claims are bound to, by name.
    pub bound: BTreeMap<String, Arc<PersistentVolume>>,
    /// The ConfigMaps and Secrets the volumes name (not read before placement).
    pub sources: BTreeMap<(Source, String), Presence>,
    /// The Pod of the holder's name, whoever owns it (not read before placement).
    pub holder: Option<Arc<Pod>>,
    /// The kubelet's Warning events about the holder, newest first, cleaned (read only while it
    /// mounts).
    pub holder_events: Vec<String>,
    /// A fresh release token (32 random bytes, hex), for a holder this pass makes.
    pub token: String,
}

/// A write of the objects a SmolVM's volumes need, decided as data and carried out by
/// [`kube::write`].
#[derive(Debug, Clone, PartialEq)]
pub enum VolumeWrite {
    /// Create a claim from its template.
    MakeClaim(Box<PersistentVolumeClaim>),
    /// Add the SmolVM's owner reference to a retained claim it adopts (server-side apply of the
    /// reference alone).
    AdoptClaim(Box<PersistentVolumeClaim>),
    /// Create the holder Pod.
    MakeHolder(Box<Pod>),
    /// Delete the holder Pod of this UID (one that ended, or at the SmolVM's delete).
    DeleteHolder {
        /// Its UID (the delete's precondition).
        uid: String,
    },
    /// Delete a claim of this name and UID (at the SmolVM's delete, policy `Delete`).
    DeleteClaim {
        /// Its name.
        name: String,
        /// Its UID (the delete's precondition).
        uid: String,
    },
}

impl VolumeWrite {
    /// The VolumesReady reason and message when this write failed with `error`.
    pub fn failed(&self, error: &str) -> (&'static str, String) {
        match self {
            VolumeWrite::MakeClaim(c) | VolumeWrite::AdoptClaim(c) => (
                reason::CLAIM_MISSING,
                format!(
                    "claim {} could not be made or adopted: {error}",
                    c.metadata.name.as_deref().unwrap_or_default()
                ),
            ),
            VolumeWrite::MakeHolder(p) => (
                reason::HOLDER_PENDING,
                format!(
                    "holder Pod {} could not be made: {error}",
                    p.metadata.name.as_deref().unwrap_or_default()
                ),
            ),
            VolumeWrite::DeleteHolder { .. } => (
                reason::HOLDER_EVICTED,
                format!("the ended holder Pod could not be deleted: {error}"),
            ),
            VolumeWrite::DeleteClaim { name, .. } => (
                reason::CLAIM_CONFLICT,
                format!("claim {name} could not be deleted: {error}"),
            ),
        }
    }
}

/// A condition as (status, reason, message).
pub type ConditionParts = (&'static str, &'static str, String);

/// What a pass over a bound SmolVM with volumes decided about them.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// VolumesReady.
    pub condition: ConditionParts,
    /// The claims and holder writes.
    pub writes: Vec<VolumeWrite>,
    /// The machine's volumes, once the holder has mounted them and every claim is bound.
    pub mounts: Option<VolumeMounts>,
    /// The holder the machine's mounts point at was evicted, deleted or replaced: its machine
    /// starts only once a new holder has mounted them.
    pub evicted: bool,
    /// The machine runs and its holder is gone: it is stopped (the agent's release hook stops it
    /// while a holder is being deleted; this is for a holder that went without it).
    pub stop: bool,
    /// The node reports the machine's mounts pointing at another holder than the mounted one:
    /// BindVolumes before it starts.
    pub rebind: bool,
}

impl Verdict {
    /// Whether VolumesReady is True.
    pub fn ready(&self) -> bool {
        self.condition.0 == "True"
    }
}

/// Before a SmolVM with volumes is placed: the claims to make first, whether it must wait (and
/// why, for VolumesReady), and where bound claims' data can be reached.
#[derive(Debug, Clone, PartialEq)]
pub struct Prelude {
    /// The claims to make or adopt, before placement.
    pub writes: Vec<VolumeWrite>,
    /// Why it is not placed yet (VolumesReady False): a claim missing or another's.
    pub wait: Option<(&'static str, String)>,
    /// The placement's restriction by the volumes' data.
    pub reach: Vec<VolumeReach>,
}

/// What a SmolVM not placed yet does about its volumes.
pub fn before_placement(vm: &SmolVM, seen: &Seen) -> Prelude {
    let namespace = vm.metadata.namespace.as_deref().unwrap_or_default();
    let claims = claims::classify(vm, seen);
    Prelude {
        writes: claims::writes(vm, &claims),
        wait: claims::before_placement(&claims, namespace),
        reach: claims::reach(&claims),
    }
}

/// The volume decisions of a pass over `vm`, bound to `node`, whose machine the node reports as
/// `machine` (`None`: not read; `Some(None)`: the node has none).
pub fn judge(vm: &SmolVM, node: &str, seen: &Seen, machine: Option<Option<&MachineStatus>>) -> Verdict {
    let namespace = vm.metadata.namespace.as_deref().unwrap_or_default();
    let uid = vm.metadata.uid.as_deref().unwrap_or_default();
    let claims = claims::classify(vm, seen);
    let holder = HolderState::of(seen.holder.as_deref(), uid);
    let source = source_problem(vm, seen, namespace);
    let blocked = claims::block_holder(&claims)
        || source
            .as_ref()
            .is_some_and(|(why, _)| *why == reason::SECRET_ACCESS_DENIED);
    let mut writes = claims::writes(vm, &claims);
    let image = seen.settings.holder_image.as_deref();
    match holder {
        HolderState::Absent if !blocked && !seen.token.is_empty() => {
            let pod =
                image.and_then(|image| holder::holder_pod(vm, node, image, seen.settings.release_port, &seen.token));
            writes.extend(pod.map(|p| VolumeWrite::MakeHolder(Box::new(p))));
        }
        HolderState::Ended(pod) => writes.push(VolumeWrite::DeleteHolder {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }),
        _ => {}
    }
    let machine_now = machine.flatten();
    let recorded = machine_now
        .and_then(|m| m.volumes.as_ref())
        .map(|v| v.holder_uid.as_str());
    let live = holder.live_uid();
    let replaced = recorded.is_some_and(|r| live.is_some_and(|l| l != r));
    let gone = matches!(
        holder,
        HolderState::Absent | HolderState::Ended(_) | HolderState::Foreign(_)
    );
    let evicted = machine_now.is_some()
        && !matches!(holder, HolderState::Foreign(_))
        && (gone || replaced || matches!(holder, HolderState::Deleting(_)));
    let running = machine_now.is_some_and(|m| m.state == MachineState::Running);
    let mounts = match holder {
        HolderState::Mounted(pod) => mounts(vm, pod, &claims),
        _ => None,
    };
    let condition = condition_of(Judged {
        vm,
        node,
        claims: &claims,
        holder,
        source,
        evicted,
        image,
        mounted: mounts.is_some(),
        events: &seen.holder_events,
    });
    Verdict {
        condition,
        writes,
        rebind: mounts.is_some() && recorded.is_some_and(|r| Some(r) != live),
        mounts,
        evicted,
        stop: running && (gone || replaced),
    }
}

/// What [`condition_of`] words VolumesReady from.
struct Judged<'a> {
    vm: &'a SmolVM,
    node: &'a str,
    claims: &'a [Claim<'a>],
    holder: HolderState<'a>,
    source: Option<(&'static str, String)>,
    evicted: bool,
    image: Option<&'a str>,
    mounted: bool,
    events: &'a [String],
}

/// VolumesReady: the first reason that holds, in order HolderEvicted (the machine exists and its
/// holder is going, gone or replaced), ClaimMissing, ClaimPending, ClaimConflict,
/// VolumeSourceMissing (or SecretAccessDenied), HolderConflict, HolderPending; else True.
fn condition_of(j: Judged) -> ConditionParts {
    let namespace = j.vm.metadata.namespace.as_deref().unwrap_or_default();
    let holder_name = smolvm_api::volume::holder_name(j.vm.metadata.name.as_deref().unwrap_or_default());
    let holder = format!("holder Pod {namespace}/{holder_name}");
    let machine = rules::machine_name(j.vm).unwrap_or_default();
    if j.evicted {
        let what = match j.holder {
            HolderState::Deleting(_) => "is being deleted (evicted, drained or deleted)".to_string(),
            HolderState::Ended(pod) => format!("ended ({})", holder::ended_words(pod)),
            HolderState::Absent => "is gone".to_string(),
            _ => "was replaced by a new one".to_string(),
        };
        let message = format!(
            "{holder}, whose volumes machine {machine} on node {} uses, {what}: the machine is stopped before its volumes are unmounted, and starts again once a new holder has mounted them",
            j.node
        );
        return ("False", reason::HOLDER_EVICTED, message);
    }
    let unscheduled = matches!(
        j.holder,
        HolderState::Absent | HolderState::Unscheduled(_) | HolderState::Deleting(_) | HolderState::Ended(_)
    );
    if let Some((why, message)) = claims::problem(j.claims, namespace, unscheduled) {
        return ("False", why, message);
    }
    if let Some((why, message)) = j.source {
        return ("False", why, message);
    }
    let message = match j.holder {
        HolderState::Foreign(_) => {
            let message = format!(
                "a Pod named {namespace}/{holder_name} exists that this SmolVM does not control; it is left untouched: delete or rename it"
            );
            return ("False", reason::HOLDER_CONFLICT, message);
        }
        HolderState::Absent if j.image.is_none() => format!(
            "the controller has no holder image configured (--holder-image, SMOLVM_CONTROLLER_HOLDER_IMAGE): no {holder} can be made to mount the volumes"
        ),
        HolderState::Absent => format!("{holder} is being made on node {}", j.node),
        HolderState::Deleting(_) | HolderState::Ended(_) => {
            format!("{holder} is being replaced: a new one is made once the old one is gone")
        }
        HolderState::Unscheduled(pod) | HolderState::Mounting(pod) => {
            format!("{holder} {}", holder::pending_words(pod, j.node, j.events))
        }
        HolderState::Mounted(_) if !j.mounted => format!("{holder} runs, but a claim is not bound to a volume"),
        HolderState::Mounted(_) => {
            let message = format!("every volume is mounted in {holder} on node {}", j.node);
            return ("True", reason::VOLUMES_MOUNTED, message);
        }
    };
    ("False", reason::HOLDER_PENDING, message)
}

/// The first ConfigMap or Secret volume whose object is missing (and not `optional`), or a
/// Secret the controller may not read (the workload-secrets component is off: it makes no holder
/// that would mount it). A ConfigMap it may not read is left to the kubelet, which reports it.
fn source_problem(vm: &SmolVM, seen: &Seen, namespace: &str) -> Option<(&'static str, String)> {
    vm.spec.volumes.iter().flatten().find_map(|v| {
        let (kind, name, optional) = match v.source()? {
            VolumeSource::ConfigMap(c) => (Source::ConfigMap, c.name.as_str(), c.optional.unwrap_or(false)),
            VolumeSource::Secret(s) => (Source::Secret, s.secret_name.as_str(), s.optional.unwrap_or(false)),
            _ => return None,
        };
        match seen.sources.get(&(kind, name.to_string()))? {
            Presence::Missing if !optional => Some((
                reason::VOLUME_SOURCE_MISSING,
                format!(
                    "{} {namespace}/{name} (volume {}) does not exist: the VM waits for it",
                    kind.kind(),
                    v.name
                ),
            )),
            Presence::Forbidden if kind == Source::Secret => Some((
                reason::SECRET_ACCESS_DENIED,
                format!(
                    "the controller may not get secrets in namespace {namespace} (volume {}, Secret {name}); grant it with the deploy/components/workload-secrets component: no holder Pod mounts the Secret until this is fixed",
                    v.name
                ),
            )),
            _ => None,
        }
    })
}

/// The machine's volumes from its mounted holder: the holder's UID, the namespace, the release
/// token read back from its preStop header, and each volume with its directory (the volume's
/// name, or for a claim its bound PV's name). `None` while a claim is not bound.
fn mounts(vm: &SmolVM, pod: &Pod, claims: &[Claim]) -> Option<VolumeMounts> {
    let token = holder::release_token(pod)?;
    let pvs: BTreeMap<&str, &str> = claims
        .iter()
        .map(|c| match c.state {
            ClaimState::Bound { pv, .. } => Some((c.volume.name.as_str(), pv)),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let mounts = vm
        .spec
        .volumes
        .iter()
        .flatten()
        .map(|v| VolumeMount {
            name: v.name.clone(),
            directory: pvs
                .get(v.name.as_str())
                .map_or_else(|| v.name.clone(), |pv| pv.to_string()),
            target: v.mount_path.clone(),
            read_only: v.is_read_only(),
        })
        .collect();
    Some(VolumeMounts {
        holder_uid: pod.metadata.uid.clone()?,
        namespace: vm.metadata.namespace.clone()?,
        release_token: Sensitive(token.to_string()),
        mounts,
    })
}

/// What the volumes mean for the machine's next call.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Go on as the machine's own rules say.
    Proceed,
    /// Point the stopped machine's mounts at the mounted holder first (BindVolumes).
    Bind(Box<VolumeMounts>),
    /// Stop the running machine: its holder is gone.
    Stop,
    /// Not now: the machine is not created or started until its volumes are mounted.
    Wait,
}

/// What `verdict` means for `action`, the machine's next call by its own rules; `bound`: this
/// pass pointed the mounts at the holder already.
pub fn step(verdict: &Verdict, action: &MachineAction, bound: bool) -> Step {
    if verdict.stop {
        return match action {
            MachineAction::Stop => Step::Proceed,
            _ => Step::Stop,
        };
    }
    match action {
        MachineAction::Create(_) if verdict.ready() && verdict.mounts.is_some() => Step::Proceed,
        MachineAction::Create(_) => Step::Wait,
        MachineAction::EnsureRunning | MachineAction::Resume => match &verdict.mounts {
            None => Step::Wait,
            Some(m) if verdict.rebind && !bound => Step::Bind(Box::new(m.clone())),
            Some(_) if verdict.rebind => Step::Wait,
            Some(_) => Step::Proceed,
        },
        _ => Step::Proceed,
    }
}

/// A machine whose create or start waits for its volumes: its phase (Scheduled before it exists,
/// else Stopped, or Suspended) and Ready False with VolumesReady's reason.
pub fn hold_ready(
    status: &mut SmolVMStatus,
    verdict: &Verdict,
    machine: Option<&MachineStatus>,
    generation: Option<i64>,
    now: Timestamp,
) {
    status.phase = Some(match machine.map(|m| m.state) {
        None => Phase::Scheduled,
        Some(MachineState::Suspended) => Phase::Suspended,
        Some(_) => Phase::Stopped,
    });
    let (_, why, message) = &verdict.condition;
    let message = format!("the machine waits for its volumes: {message}");
    rules::set_condition(
        &mut status.conditions,
        condition::READY,
        "False",
        why,
        &message,
        generation,
        now,
    );
}

/// Whether VolumesReady's arrival at `why` is told by an event, and how: `Some(true)` a
/// Warning, for what a user must act on or should know (an eviction); `Some(false)` Normal, for
/// the volumes mounted; `None` for the reasons that pass on their own (ClaimPending,
/// HolderPending).
pub fn notable(why: &str) -> Option<bool> {
    match why {
        reason::VOLUMES_MOUNTED => Some(false),
        reason::CLAIM_PENDING | reason::HOLDER_PENDING => None,
        _ => Some(true),
    }
}

/// The writes at a SmolVM's delete, once its machine is gone: the holder Pod (this SmolVM's,
/// not being deleted already), then the claims whose policy is `Delete`.
pub fn on_delete(vm: &SmolVM, seen: &Seen) -> Vec<VolumeWrite> {
    let uid = vm.metadata.uid.as_deref().unwrap_or_default();
    let mut writes: Vec<VolumeWrite> = match HolderState::of(seen.holder.as_deref(), uid) {
        HolderState::Absent | HolderState::Foreign(_) | HolderState::Deleting(_) => Vec::new(),
        state => state
            .pod()
            .and_then(|p| p.metadata.uid.clone())
            .map(|uid| VolumeWrite::DeleteHolder { uid })
            .into_iter()
            .collect(),
    };
    writes.extend(claims::on_delete(vm, seen));
    writes
}

/// For a machine lost from its node: the sentence naming the volumes whose data stays there.
pub fn lost_data(vm: &SmolVM, seen: &Seen) -> Option<String> {
    let namespace = vm.metadata.namespace.as_deref().unwrap_or_default();
    let claims = claims::classify(vm, seen);
    claims::lost_data(&claims, namespace)
        .map(|d| format!(" Its volume data stays on that node and is not re-created elsewhere: {d}."))
}
