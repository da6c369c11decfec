//! The holder Pod of a SmolVM with volumes (SPEC 2.5): one small sleeping Pod on the VM's node
//! whose volumes the kubelet mounts, so that the node's agent can hand them to smolvm. Its shape
//! ([`holder_pod`]), what the controller reads back from it (its release token), and the state
//! a pass finds it in ([`HolderState`]). Pure.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Affinity, Capabilities, ConfigMapVolumeSource, Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource,
        HTTPGetAction, HTTPHeader, Lifecycle, LifecycleHandler, NodeAffinity, NodeSelector, NodeSelectorRequirement,
        NodeSelectorTerm, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
        ResourceRequirements, SeccompProfile, SecretVolumeSource, SecurityContext, Toleration, Volume as PodVolume,
        VolumeMount,
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use smolvm_api::{
    SmolVM,
    constants::{LABEL_MANAGED_BY, volumes as names},
    text::clean_external_bounded,
    volume::{Source, Volume},
};

/// The holder's command: a subcommand of the runtime binary that sleeps until SIGTERM.
pub const COMMAND: [&str; 2] = ["/usr/local/bin/smolvm-runtime", "hold"];
/// Where the holder's container mounts each volume (`/volumes/<name>`): the kubelet mounts only
/// the volumes a container mounts.
pub const VOLUMES_DIR: &str = "/volumes";
/// Where the holder's container mounts its identity volume.
pub const IDENTITY_DIR: &str = "/identity";
/// The taint of nodes kept for SmolVMs, which holders tolerate.
pub const DEDICATED_TAINT: &str = "vm.smolvm.dev/dedicated";
/// The holder's CPU, requested and limited alike (Guaranteed QoS).
pub const CPU: &str = "10m";
/// The holder's memory, requested and limited alike (Guaranteed QoS).
pub const MEMORY: &str = "16Mi";
/// The uid and gid the holder runs as (the runtime image's non-root user).
pub const RUN_AS: i64 = 65532;
/// What a holder's grace period adds to the VM's own: the release hook stops the VM (within its
/// grace period) before the kubelet may unmount anything.
pub const GRACE_MARGIN_SECONDS: i64 = 30;
/// The file mode of ConfigMap and Secret files (read-only for everyone).
const FILE_MODE: i32 = 0o444;
/// How much of the kubelet's or scheduler's words a condition carries.
const MAX_WORDS: usize = 300;

/// The holder Pod of `vm` on `node`: named `<smolvm>-holder`, labelled and owned as the brief
/// says, held to `node` by a required node affinity on `metadata.name` (never `nodeName`, so the
/// scheduler binds `WaitForFirstConsumer` claims there), Guaranteed QoS at the holders'
/// priority, no service account token, no host namespace, one `hold` container of `image`
/// mounting every volume read-only at `/volumes/<name>` and the identity volume at `/identity`,
/// with a preStop hook that asks the agent's release hook (loopback, `release_port`) to stop the
/// VM, presenting `token`. `None` for a SmolVM not stored yet (no name, namespace or UID).
pub fn holder_pod(vm: &SmolVM, node: &str, image: &str, release_port: u16, token: &str) -> Option<Pod> {
    let name = vm.metadata.name.clone()?;
    let uid = vm.metadata.uid.clone()?;
    let mut owner = crate::vm::exposure::owner_reference(vm)?;
    owner.block_owner_deletion = Some(true);
    let volumes = vm.spec.volumes.as_deref().unwrap_or_default();
    let metadata = ObjectMeta {
        name: Some(smolvm_api::volume::holder_name(&name)),
        namespace: vm.metadata.namespace.clone(),
        labels: Some(BTreeMap::from([
            (names::LABEL_SMOLVM.to_string(), name.clone()),
            (names::LABEL_HOLDER.to_string(), names::HOLDER_VALUE.to_string()),
            (
                LABEL_MANAGED_BY.to_string(),
                smolvm_api::constants::FIELD_MANAGER_CONTROLLER.to_string(),
            ),
        ])),
        annotations: Some(BTreeMap::from([(names::ANNOTATION_SMOLVM_UID.to_string(), uid)])),
        owner_references: Some(vec![owner]),
        ..Default::default()
    };
    let mut pod_volumes: Vec<PodVolume> = volumes.iter().filter_map(|v| pod_volume(&name, v)).collect();
    pod_volumes.push(identity_volume());
    let spec = PodSpec {
        affinity: Some(on_node(node)),
        tolerations: Some(vec![Toleration {
            key: Some(DEDICATED_TAINT.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]),
        priority_class_name: Some(names::PRIORITY_CLASS.into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(
            vm.spec
                .termination_grace_period_seconds()
                .saturating_add(GRACE_MARGIN_SECONDS),
        ),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        containers: vec![container(volumes, image, release_port, token)],
        volumes: Some(pod_volumes),
        ..Default::default()
    };
    Some(Pod {
        metadata,
        spec: Some(spec),
        status: None,
    })
}

/// The one `hold` container: its mounts, its Guaranteed resources, no privilege, and the preStop
/// hook that carries the release token.
fn container(volumes: &[Volume], image: &str, release_port: u16, token: &str) -> Container {
    let size = BTreeMap::from([
        ("cpu".to_string(), Quantity(CPU.into())),
        ("memory".to_string(), Quantity(MEMORY.into())),
    ]);
    let mut mounts: Vec<VolumeMount> = volumes
        .iter()
        .map(|v| VolumeMount {
            name: v.name.clone(),
            mount_path: format!("{VOLUMES_DIR}/{}", v.name),
            read_only: Some(true),
            ..Default::default()
        })
        .collect();
    mounts.push(VolumeMount {
        name: names::IDENTITY_VOLUME.into(),
        mount_path: IDENTITY_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    });
    Container {
        name: names::HOLDER_CONTAINER.into(),
        image: Some(image.into()),
        // As the runtime DaemonSet: the node has the image already where its agent runs.
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(COMMAND.iter().map(|s| s.to_string()).collect()),
        resources: Some(ResourceRequirements {
            requests: Some(size.clone()),
            limits: Some(size),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                http_get: Some(HTTPGetAction {
                    host: Some("127.0.0.1".into()),
                    port: IntOrString::Int(i32::from(release_port)),
                    path: Some(names::RELEASE_PATH.into()),
                    scheme: Some("HTTP".into()),
                    http_headers: Some(vec![HTTPHeader {
                        name: names::RELEASE_TOKEN_HEADER.into(),
                        value: token.into(),
                    }]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A required node affinity to exactly `node`, by its name (`matchFields`).
fn on_node(node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.to_string()]),
                    }]),
                    match_expressions: None,
                }],
            }),
            preferred_during_scheduling_ignored_during_execution: None,
        }),
        ..Default::default()
    }
}

/// The Pod volume of one SmolVM volume (of the SmolVM named `smolvm`), under the volume's name;
/// `None` for a volume with no single source (refused by V16).
fn pod_volume(smolvm: &str, v: &Volume) -> Option<PodVolume> {
    let mut out = PodVolume {
        name: v.name.clone(),
        ..Default::default()
    };
    match v.source()? {
        Source::Claim(_) | Source::Template(_) => {
            out.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
                claim_name: v.claim_name(smolvm)?,
                read_only: Some(v.is_read_only()),
            });
        }
        Source::ConfigMap(c) => {
            out.config_map = Some(ConfigMapVolumeSource {
                name: c.name.clone(),
                optional: Some(c.optional.unwrap_or(false)),
                default_mode: Some(FILE_MODE),
                items: None,
            });
        }
        Source::Secret(s) => {
            out.secret = Some(SecretVolumeSource {
                secret_name: Some(s.secret_name.clone()),
                optional: Some(s.optional.unwrap_or(false)),
                default_mode: Some(FILE_MODE),
                items: None,
            });
        }
    }
    Some(out)
}

/// The identity volume: the holder's namespace and its SmolVM's UID, written by the kubelet from
/// the Pod itself, which the agent checks against the machine it mounts the volumes for.
fn identity_volume() -> PodVolume {
    let file = |path: &str, field: String| DownwardAPIVolumeFile {
        path: path.into(),
        field_ref: Some(ObjectFieldSelector {
            field_path: field,
            api_version: None,
        }),
        ..Default::default()
    };
    PodVolume {
        name: names::IDENTITY_VOLUME.into(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(vec![
                file(names::IDENTITY_NAMESPACE_FILE, "metadata.namespace".into()),
                file(
                    names::IDENTITY_SMOLVM_UID_FILE,
                    format!("metadata.annotations['{}']", names::ANNOTATION_SMOLVM_UID),
                ),
            ]),
            default_mode: None,
        }),
        ..Default::default()
    }
}

/// The release token a holder presents to the agent: its preStop header's value, where the
/// controller put it when it made the holder.
pub fn release_token(pod: &Pod) -> Option<&str> {
    let container = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == names::HOLDER_CONTAINER)?;
    container
        .lifecycle
        .as_ref()?
        .pre_stop
        .as_ref()?
        .http_get
        .as_ref()?
        .http_headers
        .iter()
        .flatten()
        .find(|h| h.name.eq_ignore_ascii_case(names::RELEASE_TOKEN_HEADER))
        .map(|h| h.value.as_str())
        .filter(|t| !t.is_empty())
}

/// What a pass finds of the holder Pod.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HolderState<'a> {
    /// No Pod of the holder's name.
    Absent,
    /// A Pod of the holder's name that this SmolVM does not control (or that carries no release
    /// token): left untouched.
    Foreign(&'a Pod),
    /// The holder is being deleted (evicted, drained, deleted): its preStop hook has the agent
    /// stop the VM before the kubelet unmounts its volumes.
    Deleting(&'a Pod),
    /// The holder ended (phase Failed or Succeeded: evicted by its kubelet under node pressure,
    /// say): its volumes are unmounted; it is deleted so that a new one can be made.
    Ended(&'a Pod),
    /// Not scheduled to its node yet.
    Unscheduled(&'a Pod),
    /// Scheduled, its volumes not all mounted yet (the kubelet starts the container only after
    /// every volume is mounted), or its container not ready.
    Mounting(&'a Pod),
    /// Running with its container ready: every volume is mounted.
    Mounted(&'a Pod),
}

impl<'a> HolderState<'a> {
    /// The state of `pod` (the Pod of the holder's name, if any) for the SmolVM of UID `uid`.
    pub fn of(pod: Option<&'a Pod>, uid: &str) -> Self {
        let Some(pod) = pod else { return HolderState::Absent };
        let controlled = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.controller == Some(true) && r.uid == uid && !uid.is_empty());
        if !controlled || release_token(pod).is_none() {
            return HolderState::Foreign(pod);
        }
        if pod.metadata.deletion_timestamp.is_some() {
            return HolderState::Deleting(pod);
        }
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Failed" | "Succeeded")) {
            return HolderState::Ended(pod);
        }
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none() {
            return HolderState::Unscheduled(pod);
        }
        let ready = status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.name == names::HOLDER_CONTAINER && c.ready);
        if phase == Some("Running") && ready {
            HolderState::Mounted(pod)
        } else {
            HolderState::Mounting(pod)
        }
    }

    /// The Pod, when there is one.
    pub fn pod(&self) -> Option<&'a Pod> {
        match *self {
            HolderState::Absent => None,
            HolderState::Foreign(p)
            | HolderState::Deleting(p)
            | HolderState::Ended(p)
            | HolderState::Unscheduled(p)
            | HolderState::Mounting(p)
            | HolderState::Mounted(p) => Some(p),
        }
    }

    /// The UID of a holder that is this SmolVM's and neither going nor gone.
    pub fn live_uid(&self) -> Option<&'a str> {
        match *self {
            HolderState::Unscheduled(p) | HolderState::Mounting(p) | HolderState::Mounted(p) => {
                p.metadata.uid.as_deref()
            }
            _ => None,
        }
    }
}

/// Why a holder that is this SmolVM's is not mounted yet, in the scheduler's or the kubelet's
/// words (cleaned): its PodScheduled condition, its container's waiting reason, its phase's
/// reason, and the newest of the kubelet's Warning `events` about it. `node` is where it goes.
pub fn pending_words(pod: &Pod, node: &str, events: &[String]) -> String {
    let status = pod.status.as_ref();
    let said = |reason: Option<&str>, message: Option<&str>| {
        let text = [reason, message]
            .into_iter()
            .flatten()
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join(": ");
        (!text.is_empty()).then(|| clean_external_bounded(&text, MAX_WORDS))
    };
    let scheduled = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some();
    let mut words = if !scheduled {
        let condition = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False");
        match condition.and_then(|c| said(c.reason.as_deref(), c.message.as_deref())) {
            Some(why) => format!("not scheduled to node {node} yet: {why}"),
            None => format!("waits to be scheduled to node {node}"),
        }
    } else {
        let waiting = status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.name == names::HOLDER_CONTAINER)
            .and_then(|c| c.state.as_ref()?.waiting.as_ref())
            .and_then(|w| said(w.reason.as_deref(), w.message.as_deref()));
        let phase = status.and_then(|s| said(s.reason.as_deref(), s.message.as_deref()));
        match waiting.or(phase) {
            Some(why) => format!("on node {node} has not mounted every volume yet: {why}"),
            None => format!("on node {node} has not mounted every volume yet"),
        }
    };
    if let Some(event) = events.first() {
        words.push_str(&format!(" ({})", clean_external_bounded(event, MAX_WORDS)));
    }
    words
}

/// How a holder ended, in its kubelet's words (`Evicted: The node was low on resource: memory`).
pub fn ended_words(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Failed");
    let why = [
        status.and_then(|s| s.reason.as_deref()),
        status.and_then(|s| s.message.as_deref()),
    ]
    .into_iter()
    .flatten()
    .filter(|t| !t.is_empty())
    .collect::<Vec<_>>()
    .join(": ");
    if why.is_empty() {
        format!("phase {phase}")
    } else {
        format!("phase {phase}, {}", clean_external_bounded(&why, MAX_WORDS))
    }
}
