//! The lifecycle core's decision, as tables: for each path a pass over a bound SmolVM can take,
//! the node calls it asks for in order, then its one outcome (phase, the Ready reason, the
//! exposure it writes, the events, the annotations it drops and when it looks again).
//!
//! Every row's SmolVM asks for a Service (`exposeService` with one port), so every row shows its
//! exposure: whatever the machine calls did, the Service and its EndpointSlice are written, with
//! the endpoint ready only while the machine runs. No I/O: `decide::converge` is pure.

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    jiff::Timestamp,
};
use serde_json::json;
use smolvm_api::NodeResources;
use smolvm_api::{
    Phase, SmolVM, SmolVMNode,
    constants::{RECREATE_LOST_MACHINE_ANNOTATION, RESTART_ANNOTATION, condition},
    fixtures,
    nodeapi::{ErrorCode, MachineState, MachineStatus, NetworkSpec, SuspendedState},
};
use smolvm_controller::nodeclient::CallError;
use smolvm_controller::placement::Hold;
use smolvm_controller::vm::decide::{
    Decision, ExposureWrite, Failure, Observed, Outcome, Progress, RESUME_RECHECK, Requeue, Room, converge,
};
use smolvm_controller::vm::rules::{BranchSource, NodeHealth, PoolOf, machine_spec};
use smolvm_controller::vm::volumes::{Presence, Seen, Settings, VolumeWrite, holder::holder_pod};
use smolvm_controller::vm::workload::Source;

const UID: &str = "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d";
const NODE: &str = "node-a";
const ADDRESS: &str = "192.0.2.10";

fn exposed(edit: impl FnOnce(&mut serde_json::Value)) -> SmolVM {
    let mut object = fixtures::bound(fixtures::alpine(), NODE);
    object["metadata"]["uid"] = json!(UID);
    object["metadata"]["finalizers"] = json!([smolvm_api::constants::FINALIZER]);
    object["spec"]["network"] =
        json!({"enabled": true, "exposeService": true, "ports": [{"hostPort": 8080, "guestPort": 80}]});
    edit(&mut object);
    serde_json::from_value(object).expect("a SmolVM")
}

fn node() -> SmolVMNode {
    let mut node = fixtures::node(NODE, 8, 16384, 500);
    node.status.as_mut().expect("status").internal_ip = Some(ADDRESS.into());
    node
}

/// The machine the node reports: the sizes the SmolVM asks for, in `state`.
fn machine(state: MachineState) -> MachineStatus {
    let spec = machine_spec(&exposed(|_| {})).expect("a spec");
    MachineStatus {
        name: format!("svm-{UID}"),
        state,
        runtime_state: "whatever smolvm says".into(),
        image: None,
        cpus: spec.cpus,
        memory_mib: u64::from(spec.memory_mib),
        storage_gib: Some(spec.storage_gib),
        overlay_gib: Some(spec.overlay_gib),
        network: NetworkSpec::default(),
        pid: None,
        suspended: (state == MachineState::Suspended).then(|| SuspendedState {
            since: "2026-11-26T10:00:00Z".into(),
            saved_state_mib: None,
            idle: false,
            wake_on_traffic: false,
        }),
        pool: None,
        volumes: None,
    }
}

/// What a pass saw of a machine's use when idleness plays no part: quiet from now, no wake.
fn unused_idle() -> smolvm_controller::vm::rules::Use {
    smolvm_controller::vm::rules::Use {
        quiet_since: Timestamp::now(),
        wake_asked: false,
    }
}

fn answered(code: ErrorCode) -> CallError {
    CallError::Api {
        node: NODE.into(),
        status: 500,
        code,
        message: "the node's message".into(),
        details: None,
    }
}

fn unreachable() -> CallError {
    CallError::Unreachable {
        node: NODE.into(),
        message: "connection refused".into(),
    }
}

/// Runs a pass against scripted node answers: each call decide asks for is answered by the next
/// entry (`Ok(machine)` or a failure). Returns the calls made, the outcome (its exposure writes:
/// all the pass made, those before its first machine call included) and the restart request
/// recorded first.
fn pass(
    vm: &SmolVM,
    health: NodeHealth,
    answers: Vec<Result<Option<MachineStatus>, Failure>>,
) -> (Vec<&'static str>, Outcome, Option<String>) {
    pass_in(vm, health, Room::default(), answers)
}

/// [`pass`] with what the node has for the VM (its allocatable and what the others hold).
fn pass_in(
    vm: &SmolVM,
    health: NodeHealth,
    room: Room,
    answers: Vec<Result<Option<MachineStatus>, Failure>>,
) -> (Vec<&'static str>, Outcome, Option<String>) {
    pass_from(vm, health, room, Progress::default(), answers)
}

/// [`pass_in`] from `progress` (a warm claim's, whose create a pool's ready slot serves).
fn pass_from(
    vm: &SmolVM,
    health: NodeHealth,
    room: Room,
    progress: Progress,
    answers: Vec<Result<Option<MachineStatus>, Failure>>,
) -> (Vec<&'static str>, Outcome, Option<String>) {
    pass_seen(vm, health, room, progress, None, answers)
}

/// [`pass_from`] with what the pass saw of the SmolVM's volumes.
fn pass_seen(
    vm: &SmolVM,
    health: NodeHealth,
    room: Room,
    progress: Progress,
    volumes: Option<&Seen>,
    answers: Vec<Result<Option<MachineStatus>, Failure>>,
) -> (Vec<&'static str>, Outcome, Option<String>) {
    pass_pooled(vm, health, room, progress, volumes, &PoolOf::None, answers)
}

/// [`pass_seen`] with the pool the SmolVM names, as the pass observed it.
fn pass_pooled(
    vm: &SmolVM,
    health: NodeHealth,
    room: Room,
    progress: Progress,
    volumes: Option<&Seen>,
    pool: &PoolOf,
    answers: Vec<Result<Option<MachineStatus>, Failure>>,
) -> (Vec<&'static str>, Outcome, Option<String>) {
    pass_made(
        vm,
        (health, room),
        progress,
        volumes,
        (pool, &BranchSource::None),
        answers,
    )
}

/// [`pass_seen`] with the pool the SmolVM names and the branch source it names, as the pass
/// observed them.
fn pass_made(
    vm: &SmolVM,
    around: (NodeHealth, Room),
    progress: Progress,
    volumes: Option<&Seen>,
    made: (&PoolOf, &BranchSource),
    answers: Vec<Result<Option<MachineStatus>, Failure>>,
) -> (Vec<&'static str>, Outcome, Option<String>) {
    pass_used(vm, around, progress, volumes, made, (unused_idle(), None), answers)
}

/// [`pass_made`] with what the controller saw of the machine's use and why its quota refused a
/// wake (SPEC 2.7).
fn pass_used(
    vm: &SmolVM,
    (health, room): (NodeHealth, Room),
    mut progress: Progress,
    volumes: Option<&Seen>,
    (pool, source): (&PoolOf, &BranchSource),
    (seen, quota_refused): (smolvm_controller::vm::rules::Use, Option<String>),
    answers: Vec<Result<Option<MachineStatus>, Failure>>,
) -> (Vec<&'static str>, Outcome, Option<String>) {
    let node = node();
    let observed = Observed {
        vm,
        node: NODE,
        machine: "svm-machine",
        node_object: Some(&node),
        health,
        service: None,
        slice: None,
        room,
        now: Timestamp::now(),
        start_backoff: None,
        volumes,
        pool,
        source,
        seen,
        quota_refused,
    };
    let mut answers = answers.into_iter();
    let mut calls = Vec::new();
    let mut recorded = None;
    let mut early = Vec::new();
    for _ in 0..10 {
        match converge(&observed, &progress) {
            Decision::Report(mut outcome) => {
                // What the pass wrote in all: before its first machine call, then at the end.
                early.append(&mut outcome.exposure.writes);
                outcome.exposure.writes = early;
                return (calls, *outcome, recorded);
            }
            Decision::Act {
                call,
                record_first,
                expose_first,
            } => {
                if call != smolvm_controller::vm::decide::Call::Get && progress.exposed.is_none() {
                    early = expose_first.clone();
                    progress.exposed = Some(expose_first);
                }
                calls.push(call.operation().name());
                if record_first.is_some() {
                    recorded = record_first;
                }
                let answer = answers
                    .next()
                    .unwrap_or_else(|| panic!("no scripted answer for {call:?}"));
                progress.record(call, answer);
            }
        }
    }
    panic!("the pass did not end: {calls:?}");
}

/// A warm claim's one event, ServedFromPool, names its node, machine and pool, so its binding
/// (written in the same status write) publishes no Scheduled event of its own; a create that no
/// pool served leaves the binding's event to tell where the VM went.
#[test]
fn only_a_create_a_pool_served_tells_its_binding() {
    let vm = exposed(|_| {});
    let running = machine(MachineState::Running);
    for (served_from, tells) in [(Some("p"), true), (None, false)] {
        let progress = Progress {
            served_from: served_from.map(String::from),
            ..Progress::default()
        };
        let answers = vec![Ok(None), Ok(Some(running.clone())), Ok(Some(running.clone()))];
        let (calls, outcome, _) = pass_from(&vm, NodeHealth::Healthy, Room::default(), progress, answers);
        assert_eq!(calls.first(), Some(&"GetMachine"), "{served_from:?}");
        assert_eq!(
            outcome.tells_binding(),
            tells,
            "{served_from:?}: {:?}",
            reasons(&outcome)
        );
        if tells {
            assert_eq!(reasons(&outcome), ["ServedFromPool"]);
            let note = &outcome.events[0].note;
            assert!(note.contains(NODE) && note.contains("pool p"), "{note}");
        }
    }
}

/// The endpoint's readiness in the last EndpointSlice the pass writes; `None` without one.
fn endpoint_ready(outcome: &Outcome) -> Option<bool> {
    outcome.exposure.writes.iter().rev().find_map(|w| match w {
        ExposureWrite::ApplySlice(slice) => slice
            .endpoints
            .first()
            .and_then(|e| e.conditions.as_ref())
            .and_then(|c| c.ready),
        _ => None,
    })
}

fn writes_service(outcome: &Outcome) -> bool {
    outcome
        .exposure
        .writes
        .iter()
        .any(|w| matches!(w, ExposureWrite::ApplyService(_)))
}

fn ready(outcome: &Outcome) -> (String, String) {
    let c = outcome
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .expect("a Ready condition");
    (c.status.clone(), c.reason.clone())
}

fn reasons(outcome: &Outcome) -> Vec<String> {
    outcome.events.iter().map(|e| e.reason.clone()).collect()
}

#[test]
fn every_path_reports_once_with_its_exposure() {
    let plain = exposed(|_| {});
    let stale = NodeHealth::Unreachable {
        why: "its heartbeat has not changed for 90s".into(),
    };
    let replaced = NodeHealth::Replaced {
        bound: "uid-node-a".into(),
        reported: "uid-other".into(),
    };
    let lost = exposed(|o| {
        o["status"]["effective"] = json!({"cpus": 1, "memoryMiB": 512, "storageGiB": 20, "overlayGiB": 10})
    });
    let secret_env = exposed(|o| {
        o["spec"]["env"] = json!([{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])
    });
    let config = || Failure::Config {
        reason: "SecretNotFound",
        message: "secret s is missing".into(),
    };
    // (name, vm, health, the node's answers, the calls, phase, Ready (status, reason), the event
    // reasons, the endpoint's readiness, the requeue)
    type Row<'a> = (
        &'a str,
        &'a SmolVM,
        NodeHealth,
        Vec<Result<Option<MachineStatus>, Failure>>,
        &'a [&'a str],
        Phase,
        (&'a str, &'a str),
        &'a [&'a str],
        bool,
        Requeue,
    );
    let rows: Vec<Row> = vec![
        (
            "node missing: no call",
            &plain,
            NodeHealth::Missing,
            vec![],
            &[],
            Phase::Unknown,
            ("Unknown", "NodeMissing"),
            &["NodeMissing"],
            false,
            Requeue::Retry,
        ),
        (
            "node replaced: no call",
            &plain,
            replaced,
            vec![],
            &[],
            Phase::Unknown,
            ("False", "NodeReplaced"),
            &["NodeReplaced"],
            false,
            Requeue::Retry,
        ),
        (
            "node stale: no call",
            &plain,
            stale,
            vec![],
            &[],
            Phase::Unknown,
            ("Unknown", "NodeUnreachable"),
            &["NodeUnreachable"],
            false,
            Requeue::Retry,
        ),
        (
            "the read meets a closed port",
            &plain,
            NodeHealth::Healthy,
            vec![Err(Failure::Call(unreachable()))],
            &["GetMachine"],
            Phase::Unknown,
            ("Unknown", "NodeUnreachable"),
            &["NodeUnreachable"],
            false,
            Requeue::Retry,
        ),
        (
            "the read fails on the node",
            &plain,
            NodeHealth::Healthy,
            vec![Err(Failure::Call(answered(ErrorCode::RuntimeError)))],
            &["GetMachine"],
            Phase::Unknown,
            ("False", "RuntimeError"),
            &["RuntimeError"],
            false,
            Requeue::Retry,
        ),
        (
            "the machine is lost",
            &lost,
            NodeHealth::Healthy,
            vec![Ok(None)],
            &["GetMachine"],
            Phase::Failed,
            ("False", "MachineLost"),
            &["MachineLost"],
            false,
            Requeue::Retry,
        ),
        (
            "the create fails",
            &plain,
            NodeHealth::Healthy,
            vec![Ok(None), Err(Failure::Call(answered(ErrorCode::RuntimeError)))],
            &["GetMachine", "CreateMachine"],
            Phase::Failed,
            ("False", "CreateFailed"),
            &["CreateFailed"],
            false,
            Requeue::Retry,
        ),
        (
            "the workload's Secret is missing at create",
            &secret_env,
            NodeHealth::Healthy,
            vec![Ok(None), Err(config())],
            &["GetMachine", "CreateMachine"],
            Phase::Scheduled,
            ("False", "SecretNotFound"),
            &["SecretNotFound"],
            false,
            Requeue::Unsettled,
        ),
        (
            "created, then the start fails (as on these machines)",
            &plain,
            NodeHealth::Healthy,
            vec![
                Ok(None),
                Ok(Some(machine(MachineState::Created))),
                Err(Failure::Call(answered(ErrorCode::StartFailed))),
            ],
            &["GetMachine", "CreateMachine", "EnsureMachineRunning"],
            Phase::Failed,
            ("False", "StartFailed"),
            &["Created", "StartFailed"],
            false,
            Requeue::Retry,
        ),
        (
            "created and started",
            &plain,
            NodeHealth::Healthy,
            vec![
                Ok(None),
                Ok(Some(machine(MachineState::Created))),
                Ok(Some(machine(MachineState::Running))),
            ],
            &["GetMachine", "CreateMachine", "EnsureMachineRunning"],
            Phase::Running,
            ("True", "Running"),
            &["Started"],
            true,
            Requeue::Settled,
        ),
        (
            "a steady running machine: a read only",
            &plain,
            NodeHealth::Healthy,
            vec![Ok(Some(machine(MachineState::Running)))],
            &["GetMachine"],
            Phase::Running,
            ("True", "Running"),
            &[],
            true,
            Requeue::Settled,
        ),
    ];
    for (name, vm, health, answers, want_calls, phase, (status, why), events, endpoint, requeue) in rows {
        let (calls, outcome, recorded) = pass(vm, health, answers);
        assert_eq!(calls, want_calls, "{name}: the calls");
        assert_eq!(outcome.status.phase, Some(phase), "{name}: the phase");
        assert_eq!(ready(&outcome), (status.to_string(), why.to_string()), "{name}: Ready");
        assert_eq!(reasons(&outcome), events, "{name}: the events");
        assert!(writes_service(&outcome), "{name}: the Service is written");
        assert_eq!(
            endpoint_ready(&outcome),
            Some(endpoint),
            "{name}: the endpoint's readiness"
        );
        let exposed = outcome
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::SERVICE_EXPOSED)
            .map(|c| (c.status.as_str(), c.reason.as_str()));
        assert_eq!(exposed, Some(("True", "ServiceReady")), "{name}: ServiceExposed");
        assert_eq!(
            outcome.status.node_address.as_deref(),
            Some(ADDRESS),
            "{name}: nodeAddress"
        );
        assert_eq!(outcome.requeue, requeue, "{name}: the requeue");
        assert_eq!(recorded, None, "{name}: nothing is written before the calls");
        assert!(outcome.drops.is_empty(), "{name}: no annotation dropped");
    }
}

#[test]
fn a_spec_the_node_api_cannot_carry_is_failed_without_a_call() {
    // The webhook and the schema keep such a port out; a SmolVM stored before them is told.
    let vm = exposed(|o| o["spec"]["network"]["ports"][0]["hostPort"] = json!(70000));
    assert!(machine_spec(&vm).is_err());
    let (calls, outcome, _) = pass(&vm, NodeHealth::Healthy, vec![Ok(None)]);
    assert_eq!(calls, ["GetMachine"]);
    assert_eq!(outcome.status.phase, Some(Phase::Failed));
    assert_eq!(ready(&outcome), ("False".into(), "InvalidSpec".into()));
    assert_eq!(outcome.requeue, Requeue::AwaitChange);
}

#[test]
fn a_restart_is_recorded_before_its_stop_and_its_annotation_dropped_by_the_next_pass() {
    const REQUESTED: &str = "2026-11-25T15:00:00Z";
    let running = |handled: Option<&str>| {
        let mut vm = exposed(|o| o["metadata"]["annotations"] = json!({ RESTART_ANNOTATION: REQUESTED }));
        vm.status.get_or_insert_with(Default::default).restart_handled = handled.map(str::to_string);
        vm
    };
    let vm = running(None);
    let (calls, outcome, recorded) = pass(
        &vm,
        NodeHealth::Healthy,
        vec![
            Ok(Some(machine(MachineState::Running))),
            Ok(Some(machine(MachineState::Stopped))),
            Ok(Some(machine(MachineState::Running))),
        ],
    );
    assert_eq!(calls, ["GetMachine", "StopMachine", "EnsureMachineRunning"]);
    assert_eq!(recorded.as_deref(), Some(REQUESTED), "recorded before the stop");
    assert_eq!(outcome.status.restart_handled.as_deref(), Some(REQUESTED));
    assert!(outcome.drops.is_empty(), "the annotation is the next pass's");
    assert_eq!(endpoint_ready(&outcome), Some(true));

    // The next pass: handled; the annotation goes, with its event, and nothing is restarted.
    let vm = running(Some(REQUESTED));
    let (calls, outcome, recorded) = pass(&vm, NodeHealth::Healthy, vec![Ok(Some(machine(MachineState::Running)))]);
    assert_eq!(calls, ["GetMachine"]);
    assert_eq!(recorded, None);
    let drops: Vec<_> = outcome
        .drops
        .iter()
        .map(|d| (d.key, d.value.as_str(), d.then.reason.as_str()))
        .collect();
    assert_eq!(drops, [(RESTART_ANNOTATION, REQUESTED, "Restarted")]);
}

#[test]
fn a_recreated_machine_drops_its_annotation_in_the_same_pass() {
    let vm = exposed(|o| {
        o["status"]["effective"] = json!({"cpus": 1, "memoryMiB": 512, "storageGiB": 20, "overlayGiB": 10});
        o["metadata"]["annotations"] = json!({ RECREATE_LOST_MACHINE_ANNOTATION: "true" });
    });
    let (calls, outcome, _) = pass(
        &vm,
        NodeHealth::Healthy,
        vec![
            Ok(None),
            Ok(Some(machine(MachineState::Created))),
            Ok(Some(machine(MachineState::Running))),
        ],
    );
    assert_eq!(calls, ["GetMachine", "CreateMachine", "EnsureMachineRunning"]);
    let drops: Vec<_> = outcome.drops.iter().map(|d| (d.key, d.then.reason.as_str())).collect();
    assert_eq!(drops, [(RECREATE_LOST_MACHINE_ANNOTATION, "Recreated")]);
}

#[test]
fn a_service_it_does_not_own_is_never_written() {
    let vm = exposed(|_| {});
    let theirs: Service = serde_json::from_value(json!({
        "metadata": {"name": "alpine", "namespace": "default",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "d-1", "controller": true}]},
        "spec": {"ports": [{"port": 80}]}
    }))
    .expect("a Service");
    let node = node();
    let no_pool = PoolOf::None;
    let observed = Observed {
        vm: &vm,
        node: NODE,
        machine: "svm-machine",
        node_object: Some(&node),
        health: NodeHealth::Missing,
        service: Some(&theirs),
        slice: None::<&EndpointSlice>,
        room: Room::default(),
        now: Timestamp::now(),
        start_backoff: None,
        volumes: None,
        pool: &no_pool,
        source: &BranchSource::None,
        seen: unused_idle(),
        quota_refused: None,
    };
    let Decision::Report(outcome) = converge(&observed, &Progress::default()) else {
        panic!("a missing node is reported at once");
    };
    assert!(outcome.exposure.writes.is_empty(), "{:?}", outcome.exposure.writes);
    let exposed = outcome
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::SERVICE_EXPOSED)
        .expect("ServiceExposed");
    assert_eq!(
        (exposed.status.as_str(), exposed.reason.as_str()),
        ("False", "ServiceNotOwned")
    );
    assert!(exposed.message.contains("Deployment web"), "{}", exposed.message);
}

#[test]
fn exposure_off_removes_only_what_it_owns() {
    let vm = exposed(|o| o["spec"]["network"]["exposeService"] = json!(false));
    let owner = json!([{"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM", "name": "alpine", "uid": UID, "controller": true}]);
    let ours: Service = serde_json::from_value(json!({
        "metadata": {"name": "alpine", "namespace": "default", "ownerReferences": owner},
    }))
    .expect("a Service");
    let slice: EndpointSlice = serde_json::from_value(json!({
        "addressType": "IPv4", "endpoints": [],
        "metadata": {"name": "alpine", "namespace": "default",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "alpine", "uid": "s-1"}]},
    }))
    .expect("an EndpointSlice");
    let writes = smolvm_controller::vm::decide::removal(&vm, Some(&ours), Some(&slice));
    assert_eq!(writes, [ExposureWrite::DeleteService], "the slice another owns stays");
}

#[test]
fn a_start_that_failed_moments_ago_is_held_and_the_service_kept() {
    let mut vm = exposed(|_| {});
    vm.status.get_or_insert_with(Default::default).phase = Some(Phase::Failed);
    let node = node();
    let failed = machine(MachineState::Stopped);
    for (name, backoff, restart, want_calls) in [
        (
            "held",
            Some(std::time::Duration::from_secs(7)),
            false,
            vec!["GetMachine"],
        ),
        (
            "the backoff is over",
            None,
            false,
            vec!["GetMachine", "EnsureMachineRunning"],
        ),
        // A restart the user asks for is made at once.
        (
            "restart asked",
            Some(std::time::Duration::from_secs(7)),
            true,
            vec!["GetMachine", "EnsureMachineRunning"],
        ),
    ] {
        let mut vm = vm.clone();
        if restart {
            vm.metadata.annotations =
                Some([(RESTART_ANNOTATION.to_string(), "2026-11-25T15:00:00Z".to_string())].into());
        }
        let no_pool = PoolOf::None;
        let observed = Observed {
            vm: &vm,
            node: NODE,
            machine: "svm-machine",
            node_object: Some(&node),
            health: NodeHealth::Healthy,
            service: None,
            slice: None,
            room: Room::default(),
            now: Timestamp::now(),
            start_backoff: backoff,
            volumes: None,
            pool: &no_pool,
            source: &BranchSource::None,
            seen: unused_idle(),
            quota_refused: None,
        };
        let mut progress = Progress::default();
        let mut calls = Vec::new();
        let outcome = loop {
            match converge(&observed, &progress) {
                Decision::Report(outcome) => break outcome,
                Decision::Act { call, .. } => {
                    calls.push(call.operation().name());
                    let answer = match &call {
                        smolvm_controller::vm::decide::Call::Get => Ok(Some(failed.clone())),
                        _ => Err(Failure::Call(answered(ErrorCode::StartFailed))),
                    };
                    progress.record(call, answer);
                }
            }
        };
        assert_eq!(calls, want_calls, "{name}");
        assert!(writes_service(&outcome), "{name}: the Service is written");
        if name == "held" {
            assert_eq!(
                outcome.requeue,
                Requeue::After(std::time::Duration::from_secs(7)),
                "{name}"
            );
            assert_eq!(outcome.status.phase, Some(Phase::Failed), "{name}: the status stays");
            assert!(outcome.events.is_empty(), "{name}: nothing to tell");
        }
    }
}

#[test]
fn failed_starts_back_off_from_10_seconds_to_5_minutes_and_a_new_generation_goes_at_once() {
    use smolvm_controller::vm::StartFailures;
    use std::time::{Duration, Instant};
    let failures = StartFailures::default();
    let at = Instant::now();
    assert_eq!(failures.hold("a", Some(1), at), None, "never failed");
    let mut holds = Vec::new();
    for _ in 0..7 {
        failures.failed("a", Some(1), at);
        holds.push(failures.hold("a", Some(1), at).map(|d| d.as_secs()));
    }
    assert_eq!(
        holds,
        [Some(10), Some(20), Some(40), Some(80), Some(160), Some(300), Some(300)]
    );
    assert_eq!(
        failures.hold("a", Some(1), at + Duration::from_secs(301)),
        None,
        "waited out"
    );
    assert_eq!(failures.hold("a", Some(2), at), None, "the spec changed");
    failures.failed("a", Some(2), at);
    assert_eq!(
        failures.hold("a", Some(2), at).map(|d| d.as_secs()),
        Some(10),
        "counted anew"
    );
    failures.reset("a");
    assert_eq!(failures.hold("a", Some(2), at), None, "it ran");
}

#[test]
fn a_version_the_controller_wrote_over_is_stale_until_the_watch_brings_a_newer_one() {
    use smolvm_controller::vm::Superseded;
    let superseded = Superseded::default();
    assert!(!superseded.is_stale("a", Some("10")), "nothing written");
    // A pass over version 10 binds (11) and then writes the status (12).
    superseded.replaced("a", Some("10"));
    superseded.replaced("a", Some("11"));
    let table = [
        ("b", Some("11"), false, "another VM"),
        ("a", Some("10"), true, "the version the pass started from"),
        (
            "a",
            Some("11"),
            true,
            "the binding, brought by the watch after the pass",
        ),
        ("a", None, false, "no version: acted on"),
    ];
    for (uid, version, stale, why) in table {
        assert_eq!(superseded.is_stale(uid, version), stale, "{why}");
    }
    // `None` was not stale, so it cleared the record: put it back and see the watch catch up.
    superseded.replaced("a", Some("10"));
    assert!(!superseded.is_stale("a", Some("12")), "the status write itself");
    assert!(
        !superseded.is_stale("a", Some("10")),
        "forgotten once a newer version was seen (the watch delivers in order)"
    );
    superseded.replaced("a", Some("12"));
    superseded.forget("a");
    assert!(!superseded.is_stale("a", Some("12")), "the VM is gone");
    for v in 0..20 {
        superseded.replaced("a", Some(&v.to_string()));
    }
    assert!(superseded.is_stale("a", Some("19")), "the newest are kept");
    assert!(
        !superseded.is_stale("a", Some("0")),
        "a bounded record: the oldest go first"
    );
}

/// The Suspended condition's (status, reason, message), if the outcome has one.
fn suspended(outcome: &Outcome) -> Option<(String, String, String)> {
    outcome
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::SUSPENDED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[test]
fn suspend_and_resume_rows() {
    use MachineState::{Created, Running, Stopped, Suspended};
    let want = |suspended: bool, running: bool| {
        exposed(|o| {
            o["spec"]["suspended"] = json!(suspended);
            o["spec"]["running"] = json!(running);
        })
    };
    let (suspend, resume, stop) = (want(true, true), want(false, true), want(true, false));
    // The node holds 8 CPUs and 16 GiB for VMs; the others bound there hold all its CPUs.
    let full = Room {
        allocatable: Some(NodeResources {
            cpus: 8,
            memory_mib: 16384,
            storage_gib: 500,
        }),
        others: NodeResources {
            cpus: 8,
            memory_mib: 4096,
            storage_gib: 100,
        },
    };
    let room = Room {
        others: NodeResources::default(),
        ..full.clone()
    };
    let ok = |state| Ok(Some(machine(state)));
    // (name, vm, room, answers, calls, phase, Suspended (status, reason), events, endpoint
    // ready, what the VM holds on the node, requeue)
    type Row<'a> = (
        &'a str,
        &'a SmolVM,
        Room,
        Vec<Result<Option<MachineStatus>, Failure>>,
        &'a [&'a str],
        Phase,
        Option<(&'a str, &'a str)>,
        &'a [&'a str],
        bool,
        Hold,
        Requeue,
    );
    let rows: Vec<Row> = vec![
        (
            "a running machine is suspended",
            &suspend,
            room.clone(),
            vec![ok(Running), ok(Suspended)],
            &["GetMachine", "SuspendMachine"],
            Phase::Suspended,
            Some(("True", "Suspended")),
            &["Suspended"],
            false,
            Hold::Suspended,
            Requeue::Settled,
        ),
        (
            "nothing saved yet: created, started, then suspended",
            &suspend,
            room.clone(),
            vec![Ok(None), ok(Created), ok(Running), ok(Suspended)],
            &["GetMachine", "CreateMachine", "EnsureMachineRunning", "SuspendMachine"],
            Phase::Suspended,
            Some(("True", "Suspended")),
            &["Started", "Suspended"],
            false,
            Hold::Suspended,
            Requeue::Settled,
        ),
        (
            "a stopped machine is started before its suspend",
            &suspend,
            room.clone(),
            vec![ok(Stopped), ok(Running), ok(Suspended)],
            &["GetMachine", "EnsureMachineRunning", "SuspendMachine"],
            Phase::Suspended,
            Some(("True", "Suspended")),
            &["Started", "Suspended"],
            false,
            Hold::Suspended,
            Requeue::Settled,
        ),
        (
            "a suspended machine stays: a read only",
            &suspend,
            full.clone(),
            vec![ok(Suspended)],
            &["GetMachine"],
            Phase::Suspended,
            Some(("True", "Suspended")),
            &[],
            false,
            Hold::Suspended,
            Requeue::Settled,
        ),
        (
            "resumed where the node has room",
            &resume,
            room.clone(),
            vec![ok(Suspended), ok(Running)],
            &["GetMachine", "ResumeMachine"],
            Phase::Running,
            None,
            &["Resumed"],
            true,
            Hold::Full,
            Requeue::Settled,
        ),
        (
            "a resume on a full node waits there, saying why",
            &resume,
            full.clone(),
            vec![ok(Suspended)],
            &["GetMachine"],
            Phase::Suspended,
            Some(("True", "ResumePending")),
            &["ResumePending"],
            false,
            Hold::Suspended,
            Requeue::After(RESUME_RECHECK),
        ),
        (
            "running false discards the saved memory",
            &stop,
            full.clone(),
            vec![ok(Suspended), ok(Stopped)],
            &["GetMachine", "StopMachine"],
            Phase::Stopped,
            None,
            &["SavedStateDiscarded"],
            false,
            Hold::Full,
            Requeue::Settled,
        ),
        (
            "the suspend fails: the machine runs on, and says so",
            &suspend,
            room.clone(),
            vec![ok(Running), Err(Failure::Call(answered(ErrorCode::RuntimeError)))],
            &["GetMachine", "SuspendMachine"],
            Phase::Running,
            Some(("False", "Suspending")),
            &["SuspendFailed"],
            true,
            Hold::Full,
            Requeue::Retry,
        ),
    ];
    for (name, vm, room, answers, want_calls, phase, condition, events, endpoint, hold, requeue) in rows {
        let (calls, outcome, _) = pass_in(vm, NodeHealth::Healthy, room, answers);
        assert_eq!(calls, want_calls, "{name}: the calls");
        assert_eq!(outcome.status.phase, Some(phase), "{name}: the phase");
        let got = suspended(&outcome);
        assert_eq!(
            got.as_ref().map(|(s, r, _)| (s.as_str(), r.as_str())),
            condition,
            "{name}: Suspended"
        );
        assert_eq!(reasons(&outcome), events, "{name}: the events");
        assert_eq!(
            endpoint_ready(&outcome),
            Some(endpoint),
            "{name}: the endpoint's readiness"
        );
        assert_eq!(outcome.hold, Some(hold), "{name}: what the VM holds on its node");
        assert_eq!(outcome.requeue, requeue, "{name}: the requeue");
    }
}

#[test]
fn the_suspended_condition_says_since_when_how_large_and_what_a_resume_lacks() {
    let vm = exposed(|o| o["spec"]["suspended"] = json!(true));
    let (_, outcome, _) = pass(
        &vm,
        NodeHealth::Healthy,
        vec![Ok(Some(machine(MachineState::Suspended)))],
    );
    let (_, _, message) = suspended(&outcome).expect("a Suspended condition");
    for part in [
        "since 2026-11-26T10:00:00Z",
        "1 GiB",
        "smolvm reports no saved-state size",
        "node-a",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    let vm = exposed(|o| o["spec"]["suspended"] = json!(false));
    let full = Room {
        allocatable: Some(NodeResources {
            cpus: 2,
            memory_mib: 1024,
            storage_gib: 500,
        }),
        others: NodeResources {
            cpus: 2,
            memory_mib: 768,
            storage_gib: 0,
        },
    };
    let (_, outcome, _) = pass_in(
        &vm,
        NodeHealth::Healthy,
        full,
        vec![Ok(Some(machine(MachineState::Suspended)))],
    );
    let (_, why, message) = suspended(&outcome).expect("a Suspended condition");
    assert_eq!(why, "ResumePending");
    // Both short dimensions are named with what is free; a bound VM never moves.
    for part in [
        "1 CPUs (0 free)",
        "512 MiB of memory (256 free)",
        "node-a",
        "never moves",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    let event = outcome
        .events
        .iter()
        .find(|e| e.reason == "ResumePending")
        .expect("an event");
    assert!(event.warning);
}

#[test]
fn a_restart_of_a_suspended_vm_is_skipped_and_says_why() {
    let vm = exposed(|o| {
        o["spec"]["suspended"] = json!(true);
        o["metadata"]["annotations"] = json!({ RESTART_ANNOTATION: "2026-11-26T10:00:00Z" });
    });
    let (calls, outcome, recorded) = pass(
        &vm,
        NodeHealth::Healthy,
        vec![Ok(Some(machine(MachineState::Suspended)))],
    );
    assert_eq!(calls, ["GetMachine"], "the machine is neither stopped nor started");
    assert_eq!(recorded, None);
    let drop = outcome.drops.first().expect("the annotation is dropped");
    assert_eq!(drop.then.reason, "RestartSkipped");
    assert!(drop.then.note.contains("suspended"), "{}", drop.then.note);
}

/// A SmolVM with one ConfigMap volume and a claim `db-claim` bound to the PV `local-3`, pinned
/// to this node; `edit` changes its JSON.
fn with_volumes(edit: impl FnOnce(&mut serde_json::Value)) -> SmolVM {
    exposed(|o| {
        o["spec"]["volumes"] = json!([
            {"name": "config", "mountPath": "/etc/app", "configMap": {"name": "app-config"}},
            {"name": "db", "mountPath": "/db", "persistentVolumeClaim": {"claimName": "db-claim"}}
        ]);
        edit(o);
    })
}

const HOLDER: &str = "11111111-2222-3333-4444-555555555555";
const OLD_HOLDER: &str = "99999999-2222-3333-4444-555555555555";

/// What a pass saw of [`with_volumes`]' volumes: the ConfigMap there, the claim bound, and the
/// holder `HOLDER` in `phase` (ready when Running), being deleted when `deleting`, or none.
fn seen_with(vm: &SmolVM, holder: Option<(&str, bool)>) -> Seen {
    let claim = serde_json::from_value(
        json!({"metadata": {"name": "db-claim", "namespace": "default", "uid": "c1"},
        "spec": {"volumeName": "local-3"}, "status": {"phase": "Bound"}}),
    )
    .expect("a claim");
    let pv = serde_json::from_value(
        json!({"metadata": {"name": "local-3"}, "spec": {"nodeAffinity": {"required":
        {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}}}),
    )
    .expect("a PV");
    let holder = holder.map(|(phase, deleting)| {
        let mut pod = holder_pod(vm, NODE, "smolvm-runtime", 10262, "token").expect("a holder");
        pod.metadata.uid = Some(HOLDER.into());
        if deleting {
            pod.metadata.deletion_timestamp = serde_json::from_value(json!("2026-12-01T10:00:00Z")).ok();
        }
        pod.spec.as_mut().expect("spec").node_name = Some(NODE.into());
        pod.status = serde_json::from_value(json!({"phase": phase, "containerStatuses": [{"name": "hold",
            "ready": phase == "Running", "restartCount": 0, "image": "i", "imageID": ""}]}))
        .ok();
        std::sync::Arc::new(pod)
    });
    Seen {
        settings: Settings {
            holder_image: Some("smolvm-runtime".into()),
            release_port: 10262,
        },
        claims: [("db-claim".to_string(), Some(std::sync::Arc::new(claim)))].into(),
        bound: [("local-3".to_string(), std::sync::Arc::new(pv))].into(),
        sources: [((Source::ConfigMap, "app-config".to_string()), Presence::Found)].into(),
        holder,
        holder_events: Vec::new(),
        token: "fresh".into(),
    }
}

/// The machine in `state`, its mounts those of the holder `holder`.
fn on_holder(state: MachineState, holder: &str) -> MachineStatus {
    MachineStatus {
        volumes: Some(smolvm_api::nodeapi::MachineVolumes {
            holder_uid: holder.into(),
            mounts: Vec::new(),
        }),
        ..machine(state)
    }
}

fn volumes_ready(outcome: &Outcome) -> Option<(String, String)> {
    outcome
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::VOLUMES_READY)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// A SmolVM with volumes: its machine is created (with its mounts) and started only once its
/// holder has mounted them; an evicted holder's machine stays stopped (stopped by the node API
/// when its holder went without the release hook), whatever its restart policy, until a new
/// holder has mounted them and BindVolumes pointed the machine at it.
#[test]
fn a_vm_with_volumes_runs_only_on_mounted_volumes() {
    let plain = with_volumes(|_| {});
    // It ran, and restartPolicy Never keeps a workload that exits stopped.
    let ran = with_volumes(|o| {
        o["spec"]["restartPolicy"] = json!("Never");
        o["status"] = json!({"phase": "Running", "nodeName": NODE, "conditions": [{"type": "Ready", "status": "True",
            "reason": "Running", "message": "", "lastTransitionTime": "2026-12-01T09:00:00Z"}]});
    });
    // (name, vm, holder (phase, deleting), answers, calls, phase, Ready (status, reason),
    // VolumesReady reason, events, writes)
    type Row<'a> = (
        &'a str,
        &'a SmolVM,
        Option<(&'a str, bool)>,
        Vec<Result<Option<MachineStatus>, Failure>>,
        &'a [&'a str],
        Phase,
        (&'a str, &'a str),
        &'a str,
        &'a [&'a str],
        usize,
    );
    let rows: Vec<Row> = vec![
        (
            "the holder mounts: no create yet",
            &plain,
            Some(("Pending", false)),
            vec![Ok(None)],
            &["GetMachine"],
            Phase::Scheduled,
            ("False", "HolderPending"),
            "HolderPending",
            &[],
            0,
        ),
        (
            "no holder: it is made, no create",
            &plain,
            None,
            vec![Ok(None)],
            &["GetMachine"],
            Phase::Scheduled,
            ("False", "HolderPending"),
            "HolderPending",
            &[],
            1,
        ),
        (
            "mounted: created with its mounts, started",
            &plain,
            Some(("Running", false)),
            vec![
                Ok(None),
                Ok(Some(on_holder(MachineState::Created, HOLDER))),
                Ok(Some(on_holder(MachineState::Running, HOLDER))),
            ],
            &["GetMachine", "CreateMachine", "EnsureMachineRunning"],
            Phase::Running,
            ("True", "Running"),
            "VolumesMounted",
            &["Started", "VolumesMounted"],
            0,
        ),
        (
            "its holder gone while it runs: stopped, a new holder made",
            &plain,
            None,
            vec![
                Ok(Some(on_holder(MachineState::Running, OLD_HOLDER))),
                Ok(Some(on_holder(MachineState::Stopped, OLD_HOLDER))),
            ],
            &["GetMachine", "StopMachine"],
            Phase::Stopped,
            ("False", "HolderEvicted"),
            "HolderEvicted",
            &["Stopped", "HolderEvicted"],
            1,
        ),
        (
            "the release hook stopped it: no exit, so no restart policy keeps it stopped; it waits",
            &ran,
            Some(("Running", true)),
            vec![Ok(Some(on_holder(MachineState::Stopped, HOLDER)))],
            &["GetMachine"],
            Phase::Stopped,
            ("False", "HolderEvicted"),
            "HolderEvicted",
            &["HolderEvicted"],
            0,
        ),
        (
            "a new holder mounted: bound to it, then started",
            &ran,
            Some(("Running", false)),
            vec![
                Ok(Some(on_holder(MachineState::Stopped, OLD_HOLDER))),
                Ok(Some(on_holder(MachineState::Stopped, HOLDER))),
                Ok(Some(on_holder(MachineState::Running, HOLDER))),
            ],
            &["GetMachine", "BindVolumes", "EnsureMachineRunning"],
            Phase::Running,
            ("True", "Running"),
            "VolumesMounted",
            &["VolumesBound", "Started", "VolumesMounted"],
            0,
        ),
    ];
    for (name, vm, holder, answers, want_calls, phase, (status, why), volumes, events, writes) in rows {
        let seen = seen_with(vm, holder);
        let (calls, outcome, _) = pass_seen(
            vm,
            NodeHealth::Healthy,
            Room::default(),
            Progress::default(),
            Some(&seen),
            answers,
        );
        assert_eq!(calls, want_calls, "{name}: the calls");
        assert_eq!(outcome.status.phase, Some(phase), "{name}: the phase");
        assert_eq!(ready(&outcome), (status.to_string(), why.to_string()), "{name}: Ready");
        assert_eq!(
            volumes_ready(&outcome).map(|(_, r)| r).as_deref(),
            Some(volumes),
            "{name}: VolumesReady"
        );
        assert_eq!(reasons(&outcome), events, "{name}: the events");
        assert_eq!(
            outcome.volumes.len(),
            writes,
            "{name}: the writes {:?}",
            outcome.volumes
        );
        assert!(
            outcome.volumes.iter().all(|w| matches!(w, VolumeWrite::MakeHolder(_))),
            "{name}"
        );
    }
    // The create carries the mounts: the holder's UID and each directory (the claim's its PV's).
    let seen = seen_with(&plain, Some(("Running", false)));
    let node = node();
    let no_pool = PoolOf::None;
    let observed = Observed {
        vm: &plain,
        node: NODE,
        machine: "svm-machine",
        node_object: Some(&node),
        health: NodeHealth::Healthy,
        service: None,
        slice: None,
        room: Room::default(),
        now: Timestamp::now(),
        start_backoff: None,
        volumes: Some(&seen),
        pool: &no_pool,
        source: &BranchSource::None,
        seen: unused_idle(),
        quota_refused: None,
    };
    let mut progress = Progress::default();
    progress.record(smolvm_controller::vm::decide::Call::Get, Ok(None));
    let Decision::Act {
        call: smolvm_controller::vm::decide::Call::Create(spec),
        ..
    } = converge(&observed, &progress)
    else {
        panic!("a create");
    };
    let mounts = spec.volumes.expect("the mounts");
    assert_eq!(mounts.holder_uid, HOLDER);
    let dirs: Vec<&str> = mounts.mounts.iter().map(|m| m.directory.as_str()).collect();
    assert_eq!(dirs, ["config", "local-3"]);
}

/// A machine lost from its node whose claim is bound to a node-pinned PV: MachineLost, as
/// without volumes, naming the volume and the PV; it is not re-created elsewhere.
#[test]
fn a_lost_machine_with_pinned_volume_data_names_it() {
    let lost = with_volumes(|o| {
        o["status"]["effective"] = json!({"cpus": 1, "memoryMiB": 512, "storageGiB": 20, "overlayGiB": 10})
    });
    let seen = seen_with(&lost, Some(("Running", false)));
    let (calls, outcome, _) = pass_seen(
        &lost,
        NodeHealth::Healthy,
        Room::default(),
        Progress::default(),
        Some(&seen),
        vec![Ok(None)],
    );
    assert_eq!(calls, ["GetMachine"]);
    assert_eq!(ready(&outcome), ("False".to_string(), "MachineLost".to_string()));
    let message = &outcome
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .expect("Ready")
        .message;
    assert!(
        message.contains("volume db (claim default/db-claim, PV local-3 is pinned to node-a)"),
        "{message}"
    );
}

/// A SmolVM that names a pool, at its create, through the core: decide asks for a lease when its
/// pool is current and, should the node have no ready slot (or the pool was replaced), for the
/// cold create or the wait its pool's `whenEmpty` says; the PoolEmpty event and the waiting
/// reason come back in the outcome, never published beside it.
#[test]
fn a_pooled_create_leases_goes_cold_or_waits_as_its_pool_says() {
    let vm = exposed(|_| {});
    let running = machine(MachineState::Running);
    let stopped = machine(MachineState::Stopped);
    let template = json!({"template": {"image": "alpine:3.20"}, "slotsPerNode": 1});
    let pool_with = |when_empty: &str| {
        let mut spec = template.clone();
        spec["whenEmpty"] = json!(when_empty);
        fixtures::pool("p", spec)
    };
    let current = |when_empty: &str| PoolOf::Current(pool_with(when_empty), "p-node-pool".into());
    let empty = || Err(Failure::Call(answered(ErrorCode::NoReadySlot)));
    let gone = || Err(Failure::Call(answered(ErrorCode::PoolNotFound)));
    // (case, the pool as observed, the node's answers, the calls, the Ready reason, the events)
    type Row = (
        &'static str,
        PoolOf,
        Vec<Result<Option<MachineStatus>, Failure>>,
        Vec<&'static str>,
        &'static str,
        Vec<&'static str>,
    );
    let rows: Vec<Row> = vec![
        (
            "no pool: created cold, no PoolEmpty",
            PoolOf::None,
            vec![Ok(None), Ok(Some(stopped.clone())), Ok(Some(running.clone()))],
            vec!["GetMachine", "CreateMachine", "EnsureMachineRunning"],
            "Running",
            vec!["Started"],
        ),
        (
            "a ready slot: one lease, the machine runs",
            current("Cold"),
            vec![Ok(None), Ok(Some(running.clone()))],
            vec!["GetMachine", "LeaseMachine"],
            "Running",
            vec!["ServedFromPool"],
        ),
        (
            "no ready slot, whenEmpty Cold: the cold create, told as PoolEmpty",
            current("Cold"),
            vec![Ok(None), empty(), Ok(Some(stopped.clone())), Ok(Some(running.clone()))],
            vec!["GetMachine", "LeaseMachine", "CreateMachine", "EnsureMachineRunning"],
            "Running",
            vec!["PoolEmpty", "Started"],
        ),
        (
            "no node pool there, whenEmpty Cold: as with no ready slot",
            current("Cold"),
            vec![Ok(None), gone(), Ok(Some(stopped.clone())), Ok(Some(running.clone()))],
            vec!["GetMachine", "LeaseMachine", "CreateMachine", "EnsureMachineRunning"],
            "Running",
            vec!["PoolEmpty", "Started"],
        ),
        (
            "no ready slot, whenEmpty Wait: nothing created, it waits saying why",
            current("Wait"),
            vec![Ok(None), empty()],
            vec!["GetMachine", "LeaseMachine"],
            "WaitingForSlot",
            vec!["WaitingForSlot"],
        ),
        (
            "its pool replaced, whenEmpty Cold: created cold from the spec it holds",
            PoolOf::Replaced(pool_with("Cold")),
            vec![Ok(None), Ok(Some(stopped.clone())), Ok(Some(running.clone()))],
            vec!["GetMachine", "CreateMachine", "EnsureMachineRunning"],
            "Running",
            vec!["PoolEmpty", "Started"],
        ),
        (
            "its pool replaced, whenEmpty Wait: not created, never leased",
            PoolOf::Replaced(pool_with("Wait")),
            vec![Ok(None)],
            vec!["GetMachine"],
            "WaitingForSlot",
            vec!["WaitingForSlot"],
        ),
    ];
    for (case, pool, answers, want_calls, want_ready, want_events) in rows {
        let (calls, outcome, _) = pass_pooled(
            &vm,
            NodeHealth::Healthy,
            Room::default(),
            Progress::default(),
            None,
            &pool,
            answers,
        );
        assert_eq!(calls, want_calls, "{case}");
        assert_eq!(ready(&outcome).1, want_ready, "{case}: {:?}", ready(&outcome));
        let events = reasons(&outcome);
        let pooled: Vec<&str> = events
            .iter()
            .map(String::as_str)
            .filter(|r| ["PoolEmpty", "Started", "ServedFromPool", "WaitingForSlot"].contains(r))
            .collect();
        assert_eq!(pooled, want_events, "{case}: {events:?}");
        if let Some(note) = outcome.events.iter().find(|e| e.reason == "PoolEmpty") {
            assert!(note.note.contains("pool p"), "{case}: {}", note.note);
        }
    }
}

/// A branch, at its create, through the core: decide asks for the branch of its running source's
/// machine on its node, or, while the source does not run there (or stopped since), waits with
/// BranchPending and creates nothing; a branch made publishes one Branched event, which tells
/// its binding, and records its source in `status.branchedFrom`.
#[test]
fn a_branch_is_branched_from_its_running_source_or_waits() {
    let vm = exposed(|_| {});
    let running = machine(MachineState::Running);
    let from = smolvm_api::BranchedFrom {
        name: "prepared".into(),
        uid: "5b0c6a1e-8d2f-4c3b-9a7e-1f0d2c3b4a59".into(),
    };
    let source = |node: &str, runs: bool| BranchSource::Bound {
        from: from.clone(),
        node: node.into(),
        machine: "svm-source".into(),
        running: runs,
    };
    let not_running = || Err(Failure::Call(answered(ErrorCode::SourceNotRunning)));
    // (case, the source as observed, the node's answers, the calls, the Ready reason, branched)
    type Row = (
        &'static str,
        BranchSource,
        Vec<Result<Option<MachineStatus>, Failure>>,
        Vec<&'static str>,
        &'static str,
        bool,
    );
    let rows: Vec<Row> = vec![
        (
            "its source runs on its node: one branch call, the machine runs",
            source(NODE, true),
            vec![Ok(None), Ok(Some(running.clone()))],
            vec!["GetMachine", "BranchMachine"],
            "Running",
            true,
        ),
        (
            "its source does not run: nothing created, it waits",
            source(NODE, false),
            vec![Ok(None)],
            vec!["GetMachine"],
            "BranchPending",
            false,
        ),
        (
            "its source stopped since the pass looked: the node says so, it waits",
            source(NODE, true),
            vec![Ok(None), not_running()],
            vec!["GetMachine", "BranchMachine"],
            "BranchPending",
            false,
        ),
        (
            "its source is on another node: never branched across nodes",
            source("node-b", true),
            vec![Ok(None)],
            vec!["GetMachine"],
            "BranchPending",
            false,
        ),
        (
            "its source is gone: nothing created",
            BranchSource::Lost("its source SmolVM prepared is gone".into()),
            vec![Ok(None)],
            vec!["GetMachine"],
            "BranchPending",
            false,
        ),
    ];
    for (case, source, answers, want_calls, want_ready, branched) in rows {
        let progress = Progress {
            took: std::time::Duration::from_millis(42),
            ..Progress::default()
        };
        let health = (NodeHealth::Healthy, Room::default());
        let (calls, outcome, _) = pass_made(&vm, health, progress, None, (&PoolOf::None, &source), answers);
        assert_eq!(calls, want_calls, "{case}");
        assert_eq!(ready(&outcome).1, want_ready, "{case}: {:?}", ready(&outcome));
        let events = reasons(&outcome);
        assert_eq!(events.iter().any(|r| r == "Branched"), branched, "{case}: {events:?}");
        assert_eq!(outcome.tells_binding(), branched, "{case}");
        assert!(
            !events.iter().any(|r| r == "Started" || r == "Created"),
            "{case}: {events:?}"
        );
        let recorded = outcome.status.branched_from.as_ref();
        assert_eq!(recorded, branched.then_some(&from), "{case}");
        if let Some(note) = outcome.events.iter().find(|e| e.reason == "Branched") {
            assert!(
                note.note.contains("prepared") && note.note.contains("42 ms"),
                "{case}: {}",
                note.note
            );
        }
    }
}

/// A branch source being deleted while branches of it live: its machine is not deleted; the
/// deletion waits naming them and the annotation, or, with the annotation, deletes them first.
#[test]
fn a_branch_source_goes_after_its_branches() {
    let source = exposed(|o| {
        o["spec"]["branchable"] = json!(true);
    });
    let branches = vec!["prepared-a".to_string(), "prepared-b".to_string()];
    let mut annotated = source.clone();
    annotated.metadata.annotations = Some(
        [("vm.smolvm.dev/delete-branches".to_string(), "true".to_string())]
            .into_iter()
            .collect(),
    );
    for (case, vm, deletes, event) in [
        ("no annotation: waits", &source, false, "DeletionBlocked"),
        (
            "the annotation: its branches first",
            &annotated,
            true,
            "DeletingBranches",
        ),
    ] {
        let (delete, outcome) = smolvm_controller::vm::decide::branches_first(vm, NODE, &branches, Timestamp::now());
        assert_eq!(delete, deletes, "{case}");
        let blocked = outcome
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "DeletionBlocked")
            .unwrap_or_else(|| panic!("{case}: DeletionBlocked is set"));
        assert_eq!(
            (blocked.status.as_str(), blocked.reason.as_str()),
            ("True", "LiveBranches"),
            "{case}"
        );
        assert!(
            blocked.message.contains("prepared-a, prepared-b") && blocked.message.contains(NODE),
            "{case}: {}",
            blocked.message
        );
        assert!(
            blocked.message.contains("vm.smolvm.dev/delete-branches"),
            "{case}: names the annotation: {}",
            blocked.message
        );
        assert_eq!(reasons(&outcome), [event], "{case}");
        assert_eq!(outcome.requeue, Requeue::Unsettled, "{case}");
    }
}

/// Lifetimes (SPEC 2.7) in a pass: the status records when the machine first ran and when it
/// finished, and a lifetime that passed expires the SmolVM (condition and event Expired, the
/// deletion after the status write); one still to pass brings the next look no later than it.
/// A restart policy that runs a finished machine again keeps it from finishing, so it never
/// expires after its TTL.
#[test]
fn lifetimes_are_stamped_and_expire_the_vm_in_the_pass() {
    use smolvm_api::constants::reason;
    let ago = |seconds: i64| {
        let at = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(seconds);
        at.to_string()
    };
    // A SmolVM that ran (phase Running, Ready True Running) with this lifecycle and policy.
    let ran = |lifecycle: serde_json::Value, policy: &str, started: Option<i64>, finished: Option<i64>| {
        exposed(|o| {
            o["spec"]["lifecycle"] = lifecycle;
            o["spec"]["restartPolicy"] = json!(policy);
            o["status"]["phase"] = json!("Running");
            o["status"]["conditions"] = json!([{"type": "Ready", "status": "True", "reason": "Running",
                "message": "", "lastTransitionTime": ago(300)}]);
            if let Some(s) = started {
                o["status"]["startedAt"] = json!(ago(s));
            }
            if let Some(f) = finished {
                o["status"]["phase"] = json!("Stopped");
                o["status"]["conditions"] = json!([{"type": "Ready", "status": "False", "reason": "Exited",
                    "message": "", "lastTransitionTime": ago(f)}]);
                o["status"]["finishedAt"] = json!(ago(f));
            }
        })
    };
    let get = |state| vec![Ok(Some(machine(state)))];
    let started = vec![
        Ok(Some(machine(MachineState::Stopped))),
        Ok(Some(machine(MachineState::Running))),
    ];
    // (name, vm, the node's answers, the calls, expired by, startedAt and finishedAt set, the
    // next look due within (seconds, low and high))
    type Row = (
        &'static str,
        SmolVM,
        Vec<Result<Option<MachineStatus>, Failure>>,
        &'static [&'static str],
        Option<&'static str>,
        (bool, bool),
        Option<(u64, u64)>,
    );
    let rows: Vec<Row> = vec![
        (
            "first Running: startedAt recorded, the deadline an hour off",
            exposed(|o| o["spec"]["lifecycle"] = json!({"activeDeadlineSeconds": 3600})),
            vec![
                Ok(None),
                Ok(Some(machine(MachineState::Stopped))),
                Ok(Some(machine(MachineState::Running))),
            ],
            &["GetMachine", "CreateMachine", "EnsureMachineRunning"],
            None,
            (true, false),
            Some((3590, 3600)),
        ),
        (
            "the deadline passed while it runs",
            ran(json!({"activeDeadlineSeconds": 60}), "Always", Some(120), None),
            get(MachineState::Running),
            &["GetMachine"],
            Some("activeDeadlineSeconds"),
            (true, false),
            None,
        ),
        (
            "no lifecycle: nothing recorded but when it first ran",
            ran(serde_json::Value::Null, "Always", None, None),
            get(MachineState::Running),
            &["GetMachine"],
            None,
            (true, false),
            None,
        ),
        (
            "it finished (Never) with a TTL of 0: finishedAt now, and it expires",
            ran(json!({"ttlSecondsAfterFinished": 0}), "Never", Some(60), None),
            get(MachineState::Stopped),
            &["GetMachine"],
            Some("ttlSecondsAfterFinished"),
            (true, true),
            None,
        ),
        (
            "finished a minute ago with a TTL of 10 minutes: due in 9",
            ran(json!({"ttlSecondsAfterFinished": 600}), "Never", Some(120), Some(60)),
            get(MachineState::Stopped),
            &["GetMachine"],
            None,
            (true, true),
            Some((530, 540)),
        ),
        (
            "Always runs a stopped machine again: it never finishes, so the TTL never passes",
            ran(json!({"ttlSecondsAfterFinished": 0}), "Always", Some(60), None),
            started,
            &["GetMachine", "EnsureMachineRunning"],
            None,
            (true, false),
            None,
        ),
        (
            "both set: the deadline that passed expires it though the TTL has not",
            ran(
                json!({"ttlSecondsAfterFinished": 3600, "activeDeadlineSeconds": 100}),
                "Never",
                Some(200),
                Some(10),
            ),
            get(MachineState::Stopped),
            &["GetMachine"],
            Some("activeDeadlineSeconds"),
            (true, true),
            None,
        ),
    ];
    for (name, vm, answers, want_calls, expired, (started_at, finished_at), due) in rows {
        let (calls, outcome, _) = pass(&vm, NodeHealth::Healthy, answers);
        assert_eq!(calls, want_calls, "{name}: calls");
        assert_eq!(outcome.expire, expired, "{name}: expiry");
        assert_eq!(outcome.status.started_at.is_some(), started_at, "{name}: startedAt");
        assert_eq!(outcome.status.finished_at.is_some(), finished_at, "{name}: finishedAt");
        let condition = outcome.status.conditions.iter().find(|c| c.type_ == condition::EXPIRED);
        let expired_event = reasons(&outcome).iter().any(|r| r == reason::EXPIRED);
        assert_eq!(condition.is_some(), expired.is_some(), "{name}: the Expired condition");
        assert_eq!(expired_event, expired.is_some(), "{name}: the Expired event");
        if let (Some(lifetime), Some(c)) = (expired, condition) {
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("True", reason::EXPIRED),
                "{name}"
            );
            assert!(c.message.contains(lifetime), "{name}: the message names {lifetime}");
        }
        let due_secs = outcome.due.map(|d| d.as_secs());
        match due {
            Some((low, high)) => assert!(
                due_secs.is_some_and(|d| (low..=high).contains(&d)),
                "{name}: due in {due_secs:?}, expected {low} to {high} s"
            ),
            None => assert_eq!(due_secs, None, "{name}: no lifetime to wait for"),
        }
    }
}

/// A machine the controller suspended for idleness (its node's record says so).
fn idle_machine() -> MachineStatus {
    let mut m = machine(MachineState::Suspended);
    if let Some(s) = m.suspended.as_mut() {
        s.idle = true;
        s.wake_on_traffic = true;
    }
    m
}

/// SPEC 2.7: a running VM quiet for `suspendAfterIdle` is suspended by the controller (reason
/// IdleSuspended, `spec.suspended` untouched); one the controller suspended stays asleep until a
/// held connection or the wake annotation wakes it, as any resume (room on its node, and its
/// quota's charge), and a user's suspension is never the controller's to wake.
#[test]
fn idle_vms_sleep_and_wake_rows() {
    use smolvm_api::constants::{WAKE_ANNOTATION, reason};
    use smolvm_controller::vm::rules::Use;
    let idle = |lifecycle: serde_json::Value, edit: fn(&mut serde_json::Value)| {
        exposed(|o| {
            o["spec"]["lifecycle"] = lifecycle;
            o["status"]["phase"] = json!("Running");
            edit(o);
        })
    };
    let wakes = json!({"suspendAfterIdle": "30s", "wakeOnTraffic": true});
    let sleeps = json!({"suspendAfterIdle": "30s", "wakeOnTraffic": false});
    let quiet = |seconds: i64, wake_asked: bool| Use {
        quiet_since: Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(seconds),
        wake_asked,
    };
    let running = || Ok(Some(machine(MachineState::Running)));
    let asleep = || Ok(Some(idle_machine()));
    let roomy = Room {
        allocatable: Some(NodeResources {
            cpus: 8,
            memory_mib: 16384,
            storage_gib: 500,
        }),
        others: NodeResources::default(),
    };
    let full = Room {
        others: NodeResources {
            cpus: 8,
            memory_mib: 16384,
            storage_gib: 0,
        },
        ..roomy.clone()
    };
    // (name, vm, what was seen, the quota's refusal, the node's room, its answers, the calls,
    // the Suspended condition's reason, the event told, the next look due within (s))
    type Row = (
        &'static str,
        SmolVM,
        Use,
        Option<String>,
        Room,
        Vec<Result<Option<MachineStatus>, Failure>>,
        &'static [&'static str],
        Option<&'static str>,
        Option<&'static str>,
        Option<(u64, u64)>,
    );
    let rows: Vec<Row> = vec![
        (
            "quiet for suspendAfterIdle: suspended for idleness",
            idle(wakes.clone(), |_| {}),
            quiet(45, false),
            None,
            roomy.clone(),
            vec![running(), asleep()],
            &["GetMachine", "SuspendMachine"],
            Some(reason::IDLE_SUSPENDED),
            Some(reason::IDLE_SUSPENDED),
            None,
        ),
        (
            "quiet for less: stays awake, looked at when it would be idle",
            idle(wakes.clone(), |_| {}),
            quiet(10, false),
            None,
            roomy.clone(),
            vec![running()],
            &["GetMachine"],
            None,
            None,
            Some((19, 20)),
        ),
        (
            "no suspendAfterIdle: never suspended, however quiet",
            idle(serde_json::Value::Null, |_| {}),
            quiet(86_400, false),
            None,
            roomy.clone(),
            vec![running()],
            &["GetMachine"],
            None,
            None,
            None,
        ),
        (
            "asleep, nothing asks: stays asleep, spec.suspended untouched",
            idle(wakes.clone(), |_| {}),
            quiet(600, false),
            None,
            roomy.clone(),
            vec![asleep()],
            &["GetMachine"],
            Some(reason::IDLE_SUSPENDED),
            None,
            None,
        ),
        (
            "a held connection asks: woken",
            idle(wakes.clone(), |_| {}),
            quiet(600, true),
            None,
            roomy.clone(),
            vec![asleep(), running()],
            &["GetMachine", "ResumeMachine"],
            None,
            Some(reason::WOKEN_BY_TRAFFIC),
            Some((29, 30)),
        ),
        (
            "a wake the node has no room for waits as any resume",
            idle(wakes.clone(), |_| {}),
            quiet(600, true),
            None,
            full,
            vec![asleep()],
            &["GetMachine"],
            Some(reason::RESUME_PENDING),
            Some(reason::RESUME_PENDING),
            None,
        ),
        (
            "a wake the namespace's quota refuses waits, saying so",
            idle(wakes.clone(), |_| {}),
            quiet(600, true),
            Some("waits to wake: the namespace's ResourceQuota has no room".into()),
            roomy.clone(),
            vec![asleep()],
            &["GetMachine"],
            Some(reason::RESUME_PENDING),
            Some(reason::RESUME_PENDING),
            None,
        ),
        (
            "wakeOnTraffic false: a connection does not wake it",
            idle(sleeps, |_| {}),
            quiet(600, true),
            None,
            roomy.clone(),
            vec![asleep()],
            &["GetMachine"],
            Some(reason::IDLE_SUSPENDED),
            None,
            None,
        ),
        (
            "the wake annotation (kubectl smolvm resume, an exec) wakes it",
            idle(wakes.clone(), |o| {
                o["metadata"]["annotations"] = json!({ WAKE_ANNOTATION: "2026-12-04T10:00:00Z" });
            }),
            quiet(600, false),
            None,
            roomy.clone(),
            vec![asleep(), running()],
            &["GetMachine", "ResumeMachine"],
            None,
            Some(reason::WOKEN_BY_TRAFFIC),
            Some((29, 30)),
        ),
        (
            "a user's suspension is not the controller's to wake",
            idle(wakes.clone(), |o| o["spec"]["suspended"] = json!(true)),
            quiet(600, true),
            None,
            roomy.clone(),
            vec![Ok(Some(machine(MachineState::Suspended)))],
            &["GetMachine"],
            Some(reason::SUSPENDED),
            None,
            None,
        ),
        (
            "suspendAfterIdle removed while asleep: woken",
            idle(serde_json::Value::Null, |_| {}),
            quiet(600, false),
            None,
            roomy,
            vec![asleep(), running()],
            &["GetMachine", "ResumeMachine"],
            None,
            Some(reason::WOKEN_BY_TRAFFIC),
            None,
        ),
    ];
    for (name, vm, seen, refused, room, answers, want_calls, want_reason, want_event, due) in rows {
        let made = (&PoolOf::None, &BranchSource::None);
        let (calls, outcome, _) = pass_used(
            &vm,
            (NodeHealth::Healthy, room),
            Progress::default(),
            None,
            made,
            (seen, refused.clone()),
            answers,
        );
        assert_eq!(calls, want_calls, "{name}: calls");
        let condition = suspended(&outcome);
        assert_eq!(
            condition.as_ref().map(|c| c.1.as_str()),
            want_reason,
            "{name}: Suspended"
        );
        let events = reasons(&outcome);
        match want_event {
            Some(event) => assert!(events.iter().any(|e| e == event), "{name}: {events:?}"),
            None => assert!(
                !events
                    .iter()
                    .any(|e| e == reason::IDLE_SUSPENDED || e == reason::WOKEN_BY_TRAFFIC),
                "{name}: {events:?}"
            ),
        }
        if let (Some(refused), Some((_, _, message))) = (&refused, &condition) {
            assert!(
                message.contains(refused.as_str()),
                "{name}: the quota's refusal is told: {message}"
            );
        }
        if want_reason == Some(reason::IDLE_SUSPENDED) {
            let message = condition.map(|c| c.2).unwrap_or_default();
            assert!(message.contains("spec.suspended stays false"), "{name}: {message}");
        }
        let due_secs = outcome.due.map(|d| d.as_secs());
        match due {
            Some((low, high)) => assert!(
                due_secs.is_some_and(|d| (low..=high).contains(&d)),
                "{name}: due in {due_secs:?}, expected {low} to {high} s"
            ),
            None => assert_eq!(due_secs, None, "{name}: nothing due"),
        }
    }
}
