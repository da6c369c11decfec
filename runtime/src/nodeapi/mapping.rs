//! Pure mapping between the node API's machine types and the VMM's: a spec to the runtime's
//! create request, a machine to its status, a spec compared with an existing machine (its
//! workload by the digests recorded at create), resize planning, an exec's answer. No I/O here.

use std::collections::BTreeSet;
use std::path::Path;

use smolvm_api::nodeapi::{EnvVar, MachineState, RestartPolicy, Sensitive, SuspendedState, WorkloadSpec};

use super::types::{MachineSpec, MachineStatus, NetworkSpec, PortSpec, ResizeSpec};
use crate::suspensions::{Suspension, is_suspended};
use crate::vmm::{self, Machine, PortMapping, ResizeRequest};
use crate::workload_records::WorkloadDigests;

/// The workload field names as [`WorkloadDigests`] keys and conflict details use them.
pub const WORKLOAD_FIELDS: [&str; 6] = [
    "workload.command",
    "workload.args",
    "workload.workingDir",
    "workload.env",
    "workload.restartPolicy",
    "workload.terminationGracePeriodSeconds",
];

fn sha256_hex(value: &impl serde::Serialize) -> String {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Pure: the digests of a workload's fields.
pub fn workload_digests(workload: &WorkloadSpec) -> WorkloadDigests {
    let values = [
        sha256_hex(&workload.command),
        sha256_hex(&workload.args),
        sha256_hex(&workload.working_dir),
        sha256_hex(&workload.env),
        sha256_hex(&workload.restart_policy),
        sha256_hex(&workload.termination_grace_period_seconds),
    ];
    WORKLOAD_FIELDS
        .iter()
        .zip(values)
        .map(|(field, digest)| (field.to_string(), digest))
        .collect()
}

/// smolvm's restart policy word. `Always` is smolvm's `never`: the controller already starts
/// again every machine that is not running while `spec.running` is true, and smolvm's own
/// `always` (or `unless-stopped`) also restarts a machine whose start failed, even after a stop
/// was asked for, so it would fight the controller over `spec.running: false` and disk resizes.
pub fn restart_word(policy: RestartPolicy) -> &'static str {
    match policy {
        RestartPolicy::Always => "never",
        RestartPolicy::OnFailure => "on-failure",
        RestartPolicy::Never => "never",
    }
}

pub fn to_vmm_port(port: &PortSpec) -> PortMapping {
    PortMapping {
        host_port: port.host_port,
        guest_port: port.guest_port,
        protocol: port.protocol,
    }
}

fn from_vmm_port(port: &PortMapping) -> PortSpec {
    PortSpec {
        host_port: port.host_port,
        guest_port: port.guest_port,
        protocol: port.protocol,
    }
}

/// Environment entries as the runtime takes them (a create's, or a lease's).
pub fn to_vmm_env(env: &[EnvVar]) -> Vec<(String, Sensitive)> {
    env.iter().map(|e| (e.name.clone(), e.value.clone())).collect()
}

/// The VMM create request for a node API spec. An empty allow-list means unrestricted egress.
pub fn to_vmm_spec(name: &str, spec: &MachineSpec) -> vmm::MachineSpec {
    let mut out = vmm::MachineSpec::new(name, spec.cpus, spec.memory_mib);
    out.image = Some(spec.image.clone());
    out.storage_gib = Some(spec.storage_gib);
    out.overlay_gib = Some(spec.overlay_gib);
    out.network = spec.network.enabled;
    out.ports = spec.network.ports.iter().map(to_vmm_port).collect();
    out.allowed_cidrs = non_empty(&spec.network.allowed_cidrs);
    out.allowed_hosts = non_empty(&spec.network.allowed_hosts);
    let workload = &spec.workload;
    out.workload = vmm::Workload {
        entrypoint: workload.command.clone(),
        cmd: workload.args.clone(),
        workdir: workload.working_dir.clone(),
        env: to_vmm_env(&workload.env),
        restart: Some(restart_word(workload.restart_policy)),
        stop_timeout_secs: Some(u64::from(workload.termination_grace_period_seconds)),
    };
    out
}

/// A list of strings smolvm reports for the machine under `key` (`allowedCidrs`,
/// `allowedHosts`); empty when absent.
fn reported_list(machine: &Machine, key: &str) -> Vec<String> {
    machine
        .raw
        .get(key)
        .and_then(|v| v.as_array())
        .map(|list| list.iter().filter_map(|c| c.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Whether `wanted` and `have` hold the same entries, in any order.
fn same_entries(wanted: &[String], have: &[String]) -> bool {
    wanted.iter().collect::<BTreeSet<_>>() == have.iter().collect::<BTreeSet<_>>()
}

/// `None` for an empty list (smolvm's default), else the list.
fn non_empty(list: &[String]) -> Option<Vec<String>> {
    (!list.is_empty()).then(|| list.to_vec())
}

/// A machine as the node API reports it, with no suspension record.
pub fn to_status(machine: &Machine) -> MachineStatus {
    to_status_with(machine, None)
}

/// A machine as the node API reports it, given the agent's suspension record of it: a stopped
/// machine the agent suspended is `Suspended`, since the record's time (smolvm reports no
/// saved-state size).
pub fn to_status_with(machine: &Machine, record: Option<&Suspension>) -> MachineStatus {
    let suspended = is_suspended(machine, record);
    MachineStatus {
        name: machine.name.clone(),
        state: if suspended {
            MachineState::Suspended
        } else {
            machine.state
        },
        runtime_state: machine.runtime_state(),
        image: machine.image.clone(),
        cpus: machine.cpus,
        memory_mib: machine.memory_mib,
        storage_gib: machine.storage_gib,
        overlay_gib: machine.overlay_gib,
        network: NetworkSpec {
            enabled: machine.network,
            ports: machine.ports.iter().map(from_vmm_port).collect(),
            allowed_cidrs: reported_list(machine, "allowedCidrs"),
            allowed_hosts: reported_list(machine, "allowedHosts"),
        },
        pid: machine.pid,
        suspended: record.filter(|_| suspended).map(|record| SuspendedState {
            since: record.since.clone(),
            saved_state_mib: None,
            idle: record.idle,
            wake_on_traffic: record.wake_on_traffic,
        }),
        pool: None,
        volumes: None,
    }
}

/// Whether the image smolvm reports matches the requested one. `local:<name>` is reported as
/// `local-dir:<dir>/<name>` (a rootfs directory) or `local:<sha256>` (an archive at that path).
pub fn image_matches(requested: &str, reported: Option<&str>, local_image_dir: Option<&Path>) -> bool {
    let Some(reported) = reported else {
        return false;
    };
    match (requested.strip_prefix("local:"), local_image_dir) {
        (Some(name), Some(dir)) => {
            let path = dir.join(name);
            match reported.strip_prefix("local-dir:") {
                Some(reported_path) => Path::new(reported_path) == path,
                // An archive is reported by its digest; the name cannot be compared.
                None => reported.starts_with("local:") && path.is_file(),
            }
        }
        _ => requested == reported,
    }
}

/// The spec fields (wire names) in which an existing machine differs from the requested spec.
/// The workload is compared with the digests recorded when the machine was created; without a
/// record (a machine made before records were kept) it cannot be compared and is not.
pub fn spec_differences(
    spec: &MachineSpec,
    machine: &Machine,
    local_image_dir: Option<&Path>,
    recorded: Option<&WorkloadDigests>,
) -> Vec<&'static str> {
    let mut fields = Vec::new();
    if !image_matches(&spec.image, machine.image.as_deref(), local_image_dir) {
        fields.push("image");
    }
    if spec.cpus != machine.cpus {
        fields.push("cpus");
    }
    if u64::from(spec.memory_mib) != machine.memory_mib {
        fields.push("memoryMiB");
    }
    if machine.storage_gib.is_some_and(|s| s != spec.storage_gib) {
        fields.push("storageGiB");
    }
    if machine.overlay_gib.is_some_and(|s| s != spec.overlay_gib) {
        fields.push("overlayGiB");
    }
    if spec.network.enabled != machine.network {
        fields.push("network.enabled");
    }
    let wanted: BTreeSet<PortSpec> = spec.network.ports.iter().copied().collect();
    let have: BTreeSet<PortSpec> = machine.ports.iter().map(from_vmm_port).collect();
    if wanted != have {
        fields.push("network.ports");
    }
    if !same_entries(&spec.network.allowed_cidrs, &reported_list(machine, "allowedCidrs")) {
        fields.push("network.allowedCIDRs");
    }
    if !same_entries(&spec.network.allowed_hosts, &reported_list(machine, "allowedHosts")) {
        fields.push("network.allowedHosts");
    }
    if let Some(recorded) = recorded {
        let requested = workload_digests(&spec.workload);
        for field in WORKLOAD_FIELDS {
            if recorded.get(field) != requested.get(field) {
                fields.push(field);
            }
        }
    }
    fields
}

/// What a resize has to do against a machine's current sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResizePlan {
    /// Disk changes to send (any state); `None` when the disks already have the asked sizes.
    pub disks: Option<ResizeRequest>,
    /// CPU / memory changes to send (running machines only); `None` when already so.
    pub live: Option<ResizeRequest>,
}

/// Plans a resize: only fields that differ from the machine are sent.
pub fn plan_resize(request: &ResizeSpec, machine: &Machine) -> ResizePlan {
    let storage = request.storage_gib.filter(|s| machine.storage_gib != Some(*s));
    let overlay = request.overlay_gib.filter(|s| machine.overlay_gib != Some(*s));
    let cpus = request.cpus.filter(|c| *c != machine.cpus);
    let memory = request.memory_mib.filter(|m| u64::from(*m) != machine.memory_mib);
    let disks = (storage.is_some() || overlay.is_some()).then_some(ResizeRequest {
        storage_gib: storage,
        overlay_gib: overlay,
        ..ResizeRequest::default()
    });
    let live = (cpus.is_some() || memory.is_some()).then_some(ResizeRequest {
        cpus,
        memory_mib: memory,
        ..ResizeRequest::default()
    });
    ResizePlan { disks, live }
}

/// Wire names of the live fields a plan could not apply.
pub fn pending_live_fields(live: &ResizeRequest) -> Vec<&'static str> {
    let mut out = Vec::new();
    if live.cpus.is_some() {
        out.push("cpus");
    }
    if live.memory_mib.is_some() {
        out.push("memoryMiB");
    }
    out
}

/// The wire answer of an exec.
pub fn exec_response(output: &vmm::ExecOutput) -> super::types::ExecResponse {
    use base64::Engine as _;
    let engine = base64::engine::general_purpose::STANDARD;
    super::types::ExecResponse {
        exit_code: output.exit_code,
        stdout_base64: engine.encode(&output.stdout),
        stderr_base64: engine.encode(&output.stderr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodeapi::failure::{already_suspended, cannot_suspend, no_saved_state, not_running};
    use crate::nodeapi::types::ErrorCode;
    use crate::vmm::MachineState;
    use smolvm_api::Protocol;

    fn machine() -> Machine {
        let raw = serde_json::json!({"name":"m","image":"alpine:3","state":"created","cpus":1,"memoryMb":512,
            "ports":[{"host":8080,"guest":80}],"network":true,"allowedCidrs":["10.0.0.0/8"],"allowedHosts":["example.com"],"storageGb":20,"overlayGb":10});
        crate::vmm::smolvm::machine_from_json(raw).expect("machine")
    }

    fn spec() -> MachineSpec {
        MachineSpec {
            image: "alpine:3".into(),
            cpus: 1,
            memory_mib: 512,
            storage_gib: 20,
            overlay_gib: 10,
            network: NetworkSpec {
                enabled: true,
                ports: vec![PortSpec {
                    host_port: 8080,
                    guest_port: 80,
                    protocol: Protocol::Tcp,
                }],
                allowed_cidrs: vec!["10.0.0.0/8".into()],
                allowed_hosts: vec!["example.com".into()],
            },
            workload: WorkloadSpec {
                command: vec!["/bin/app".into()],
                args: vec!["--port".into(), "80".into()],
                working_dir: Some("/srv".into()),
                env: vec![smolvm_api::nodeapi::EnvVar {
                    name: "TOKEN".into(),
                    value: smolvm_api::nodeapi::Sensitive("s3cret".into()),
                }],
                restart_policy: RestartPolicy::OnFailure,
                termination_grace_period_seconds: 30,
            },
            volumes: None,
        }
    }

    #[test]
    fn spec_differences_name_each_field() {
        type Edit = fn(&mut MachineSpec);
        let cases: Vec<(Edit, Vec<&str>)> = vec![
            (|_| {}, vec![]),
            (|s| s.image = "alpine:4".into(), vec!["image"]),
            (|s| s.cpus = 2, vec!["cpus"]),
            (|s| s.memory_mib = 1024, vec!["memoryMiB"]),
            (|s| s.storage_gib = 30, vec!["storageGiB"]),
            (|s| s.overlay_gib = 11, vec!["overlayGiB"]),
            (|s| s.network.enabled = false, vec!["network.enabled"]),
            (|s| s.network.ports[0].guest_port = 81, vec!["network.ports"]),
            (|s| s.network.ports[0].protocol = Protocol::Udp, vec!["network.ports"]),
            (|s| s.network.allowed_cidrs.clear(), vec!["network.allowedCIDRs"]),
            (
                |s| s.network.allowed_hosts = vec!["other.example".into()],
                vec!["network.allowedHosts"],
            ),
            (|s| s.workload.command.clear(), vec!["workload.command"]),
            (|s| s.workload.args.push("-v".into()), vec!["workload.args"]),
            (|s| s.workload.working_dir = None, vec!["workload.workingDir"]),
            (|s| s.workload.env[0].value.0.push('!'), vec!["workload.env"]),
            (
                |s| s.workload.restart_policy = RestartPolicy::Never,
                vec!["workload.restartPolicy"],
            ),
            (
                |s| s.workload.termination_grace_period_seconds = 10,
                vec!["workload.terminationGracePeriodSeconds"],
            ),
            (
                |s| {
                    s.cpus = 4;
                    s.image = "x".into()
                },
                vec!["image", "cpus"],
            ),
        ];
        let recorded = workload_digests(&spec().workload);
        for (edit, expected) in cases {
            let mut s = spec();
            edit(&mut s);
            assert_eq!(
                spec_differences(&s, &machine(), None, Some(&recorded)),
                expected,
                "{s:?}"
            );
        }
        // Without a record the workload cannot be compared (a machine from before records).
        let mut changed = spec();
        changed.workload.command.clear();
        assert!(spec_differences(&changed, &machine(), None, None).is_empty());
        // Digests never carry a value in the clear.
        let digests = format!("{recorded:?}");
        assert!(!digests.contains("s3cret") && !format!("{:?}", spec()).contains("s3cret"));
    }

    #[test]
    fn workload_maps_onto_smolvm() {
        let out = to_vmm_spec("svm-1", &spec());
        assert_eq!(out.workload.entrypoint, vec!["/bin/app".to_string()]);
        assert_eq!(out.workload.cmd, vec!["--port".to_string(), "80".to_string()]);
        assert_eq!(out.workload.workdir.as_deref(), Some("/srv"));
        assert_eq!(out.workload.env[0].0, "TOKEN");
        assert_eq!(out.workload.env[0].1.expose(), "s3cret");
        assert_eq!(out.workload.restart, Some("on-failure"));
        assert_eq!(out.workload.stop_timeout_secs, Some(30));
        assert_eq!(out.allowed_hosts, Some(vec!["example.com".to_string()]));
        let empty = to_vmm_spec(
            "svm-1",
            &MachineSpec {
                workload: WorkloadSpec::default(),
                ..spec()
            },
        );
        assert!(empty.workload.entrypoint.is_empty() && empty.workload.env.is_empty());
        assert_eq!(empty.workload.restart, Some("never"));
        assert_eq!(empty.workload.stop_timeout_secs, Some(10));
        for (policy, word) in [
            (RestartPolicy::Always, "never"),
            (RestartPolicy::OnFailure, "on-failure"),
            (RestartPolicy::Never, "never"),
        ] {
            assert_eq!(restart_word(policy), word);
        }
    }

    #[test]
    fn local_images_compare_by_path() {
        let dir = Path::new("/images");
        let cases = [
            ("local:tiny", Some("local-dir:/images/tiny"), true),
            ("local:tiny", Some("local-dir:/images/other"), false),
            ("alpine:3", Some("alpine:3"), true),
            ("alpine:3", Some("alpine:4"), false),
            ("alpine:3", None, false),
            // An archive's digest cannot be compared with a name that is not a file here.
            ("local:none", Some("local:abc"), false),
        ];
        for (requested, reported, ok) in cases {
            assert_eq!(
                image_matches(requested, reported, Some(dir)),
                ok,
                "{requested} {reported:?}"
            );
        }
    }

    #[test]
    fn resize_plans_only_differences() {
        let m = machine();
        let cases = [
            (ResizeSpec::default(), None, None),
            (
                ResizeSpec {
                    storage_gib: Some(20),
                    cpus: Some(1),
                    ..ResizeSpec::default()
                },
                None,
                None,
            ),
            (
                ResizeSpec {
                    storage_gib: Some(30),
                    ..ResizeSpec::default()
                },
                Some(ResizeRequest {
                    storage_gib: Some(30),
                    ..ResizeRequest::default()
                }),
                None,
            ),
            (
                ResizeSpec {
                    overlay_gib: Some(12),
                    memory_mib: Some(1024),
                    ..ResizeSpec::default()
                },
                Some(ResizeRequest {
                    overlay_gib: Some(12),
                    ..ResizeRequest::default()
                }),
                Some(ResizeRequest {
                    memory_mib: Some(1024),
                    ..ResizeRequest::default()
                }),
            ),
        ];
        for (request, disks, live) in cases {
            assert_eq!(plan_resize(&request, &m), ResizePlan { disks, live }, "{request:?}");
        }
    }

    #[test]
    fn a_stopped_machine_the_agent_suspended_is_suspended() {
        let record = Suspension {
            since: "2026-11-26T16:00:00Z".into(),
            idle: true,
            wake_on_traffic: true,
        };
        // (smolvm's state, a record, the state on the wire, since)
        let cases = [
            (
                MachineState::Stopped,
                true,
                MachineState::Suspended,
                Some("2026-11-26T16:00:00Z"),
            ),
            (MachineState::Stopped, false, MachineState::Stopped, None),
            (MachineState::Running, true, MachineState::Running, None),
            (MachineState::Created, true, MachineState::Created, None),
        ];
        for (state, recorded, wire, since) in cases {
            let mut m = machine();
            m.state = state;
            m.raw = serde_json::Value::Null;
            let status = to_status_with(&m, recorded.then_some(&record));
            assert_eq!(status.state, wire, "{state:?} {recorded}");
            assert_eq!(
                status.suspended.as_ref().map(|s| s.since.as_str()),
                since,
                "{state:?} {recorded}"
            );
            assert_eq!(
                status.suspended.as_ref().map(|s| (s.idle, s.wake_on_traffic)),
                since.map(|_| (true, true)),
                "why it was suspended is carried"
            );
            assert_eq!(status.suspended.and_then(|s| s.saved_state_mib), None);
            // smolvm's own word stays what smolvm said.
            assert_eq!(status.runtime_state, crate::vmm::smolvm::state_word(state));
        }
        let suspended = MachineStatus {
            state: MachineState::Suspended,
            ..to_status(&machine())
        };
        for (failure, code) in [
            (
                cannot_suspend("m", &to_status(&machine())),
                ErrorCode::MachineNotRunning,
            ),
            (no_saved_state("m", &to_status(&machine())), ErrorCode::NoSavedState),
            (already_suspended("m", "a start"), ErrorCode::AlreadySuspended),
            (not_running("m", &suspended, "exec"), ErrorCode::MachineNotRunning),
        ] {
            assert_eq!((failure.status, &failure.body.code), (409, &code));
            let state = failure.body.details.map(|d| d["state"].clone());
            assert!(
                matches!(state.as_ref().and_then(|s| s.as_str()), Some("Created" | "Suspended")),
                "{state:?}"
            );
        }
    }

    #[test]
    fn spec_converts_to_smolvm_create() {
        let converted = to_vmm_spec("m", &spec());
        assert_eq!(converted.image.as_deref(), Some("alpine:3"));
        assert_eq!((converted.storage_gib, converted.overlay_gib), (Some(20), Some(10)));
        assert_eq!(converted.allowed_cidrs, Some(vec!["10.0.0.0/8".to_string()]));
        let mut open = spec();
        open.network.allowed_cidrs.clear();
        assert_eq!(to_vmm_spec("m", &open).allowed_cidrs, None);
        let status = to_status(&machine());
        assert_eq!(status.state, MachineState::Created);
        assert_eq!(status.network, spec().network);
    }
}
