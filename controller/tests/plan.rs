//! Reconcile planning tables: next step per object state, node health, machine actions, conditions.

use std::collections::BTreeMap;

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::{SignedDuration, Timestamp},
};
use smolvm_api::{
    SmolVM, SmolVMNode,
    constants::{FINALIZER, FORCE_DELETE_ANNOTATION, condition},
    fixtures,
    nodeapi::{MachineState, MachineStatus, NetworkSpec, ResizeSpec},
};
use smolvm_controller::plan::{
    MachineAction, NodeHealth, Step, machine_action, machine_name, machine_spec, next_step, node_health, set_condition,
};

const UID: &str = "6f1c0a52-3b0e-4a57-9d0c-1f2e3d4c5b6a";

fn vm(bound: bool, deleting: bool, finalizer: bool, force: Option<&str>) -> SmolVM {
    let mut object = fixtures::alpine();
    if bound {
        object = fixtures::bound(object, "node-a");
    }
    let mut vm: SmolVM = serde_json::from_value(object).unwrap();
    if deleting {
        vm.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    }
    if finalizer {
        vm.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    }
    if let Some(value) = force {
        vm.metadata.annotations = Some(BTreeMap::from([(
            FORCE_DELETE_ANNOTATION.to_string(),
            value.to_string(),
        )]));
    }
    vm
}

#[test]
fn next_step_table() {
    let machine = format!("svm-{UID}");
    let del = |force| Step::DeleteMachine {
        node: "node-a".into(),
        machine: machine.clone(),
        force,
    };
    let cases = [
        (
            "new_object_gets_finalizer",
            vm(false, false, false, None),
            Step::AddFinalizer,
        ),
        ("unbound_is_placed", vm(false, false, true, None), Step::Place),
        (
            "bound_converges",
            vm(true, false, true, None),
            Step::Converge {
                node: "node-a".into(),
                machine: machine.clone(),
            },
        ),
        (
            "bound_without_finalizer_gets_it_first",
            vm(true, false, false, None),
            Step::AddFinalizer,
        ),
        (
            "deleting_unbound_loses_finalizer_at_once",
            vm(false, true, true, None),
            Step::RemoveFinalizer,
        ),
        ("deleting_bound_deletes_machine", vm(true, true, true, None), del(false)),
        (
            "deleting_bound_with_force_annotation",
            vm(true, true, true, Some("true")),
            del(true),
        ),
        (
            "deleting_bound_with_bad_force_value_is_not_forced",
            vm(true, true, true, Some("yes")),
            del(false),
        ),
        (
            "deleting_without_finalizer_is_forgotten",
            vm(true, true, false, None),
            Step::Forget,
        ),
    ];
    for (name, vm, expected) in cases {
        assert_eq!(next_step(&vm), expected, "{name}");
    }
}

#[test]
fn machine_names_derive_from_uid() {
    let vm = vm(false, false, true, None);
    assert_eq!(machine_name(&vm).as_deref(), Some(format!("svm-{UID}").as_str()));
    assert!(machine_name(&vm).unwrap().len() <= 63);
    let mut no_uid = vm.clone();
    no_uid.metadata.uid = None;
    assert_eq!(machine_name(&no_uid), None);
}

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn ready_node(uid: &str, heartbeat_age: Option<i64>, ready: &str) -> SmolVMNode {
    let mut node = fixtures::node("node-a", 8, 8192, 100);
    let status = node.status.as_mut().unwrap();
    status.node_uid = Some(uid.into());
    status.heartbeat_time = heartbeat_age.map(|s| Time(now() - SignedDuration::from_secs(s)));
    status.conditions = vec![Condition {
        type_: condition::READY.into(),
        status: ready.into(),
        reason: "AsExpected".into(),
        message: "m".into(),
        last_transition_time: Time(now()),
        observed_generation: None,
    }];
    node
}

#[test]
fn node_health_table() {
    let vm = vm(true, false, true, None); // bound to node-a with nodeUID uid-node-a
    let timeout = SignedDuration::from_secs(40);
    let healthy = ready_node("uid-node-a", Some(5), "True");
    assert_eq!(node_health(&vm, Some(&healthy), now(), timeout), NodeHealth::Healthy);
    assert_eq!(node_health(&vm, None, now(), timeout), NodeHealth::Missing);
    assert_eq!(
        node_health(&vm, Some(&ready_node("uid-new", Some(5), "True")), now(), timeout),
        NodeHealth::Replaced {
            bound: "uid-node-a".into(),
            reported: "uid-new".into()
        }
    );
    for (name, node) in [
        ("stale", ready_node("uid-node-a", Some(120), "True")),
        ("never", ready_node("uid-node-a", None, "True")),
        ("not_ready", ready_node("uid-node-a", Some(5), "False")),
    ] {
        assert!(
            matches!(
                node_health(&vm, Some(&node), now(), timeout),
                NodeHealth::Unreachable { .. }
            ),
            "{name}"
        );
    }
}

fn machine(state: MachineState, cpus: u32, memory: u64, storage: u64) -> MachineStatus {
    MachineStatus {
        name: "m".into(),
        state,
        runtime_state: "x".into(),
        image: None,
        cpus,
        memory_mib: memory,
        storage_gib: Some(storage),
        overlay_gib: Some(10),
        network: NetworkSpec::default(),
        pid: None,
    }
}

#[test]
fn machine_action_table() {
    let desired = machine_spec(&vm(true, false, true, None)).unwrap();
    assert_eq!(
        (
            desired.cpus,
            desired.memory_mib,
            desired.storage_gib,
            desired.overlay_gib
        ),
        (1, 512, 20, 10)
    );
    assert_eq!(desired.network.ports.len(), 1);
    use MachineState::*;
    let cases = [
        ("missing_is_created", true, None, MachineAction::Create(desired.clone())),
        (
            "created_is_started",
            true,
            Some(machine(Created, 1, 512, 20)),
            MachineAction::EnsureRunning,
        ),
        (
            "stopped_is_started",
            true,
            Some(machine(Stopped, 1, 512, 20)),
            MachineAction::EnsureRunning,
        ),
        (
            "running_is_stopped",
            false,
            Some(machine(Running, 1, 512, 20)),
            MachineAction::Stop,
        ),
        (
            "stopped_stays",
            false,
            Some(machine(Stopped, 1, 512, 20)),
            MachineAction::None,
        ),
        (
            "running_steady",
            true,
            Some(machine(Running, 1, 512, 20)),
            MachineAction::None,
        ),
        (
            "running_cpu_change_resized_live",
            true,
            Some(machine(Running, 2, 512, 20)),
            MachineAction::Resize(ResizeSpec {
                cpus: Some(1),
                memory_mib: Some(512),
                ..Default::default()
            }),
        ),
        (
            "disk_growth_applies_while_stopped",
            false,
            Some(machine(Stopped, 1, 512, 10)),
            MachineAction::Resize(ResizeSpec {
                storage_gib: Some(20),
                ..Default::default()
            }),
        ),
        (
            "stopped_cpu_change_is_pending",
            false,
            Some(machine(Stopped, 2, 512, 20)),
            MachineAction::ResizePending(String::new()),
        ),
    ];
    for (name, running, observed, expected) in cases {
        let got = machine_action(&desired, running, observed.as_ref());
        match (&got, &expected) {
            (MachineAction::ResizePending(message), MachineAction::ResizePending(_)) => {
                assert!(message.contains("1 CPUs"), "{name}: {message}")
            }
            _ => assert_eq!(got, expected, "{name}"),
        }
    }
}

#[test]
fn conditions_keep_transition_time_when_status_is_unchanged() {
    let mut list = Vec::new();
    let t0 = now();
    let t1 = t0 + SignedDuration::from_secs(60);
    assert!(set_condition(
        &mut list,
        "Ready",
        "False",
        "StartFailed",
        "boom",
        Some(1),
        t0
    ));
    assert!(set_condition(
        &mut list,
        "Ready",
        "False",
        "StartFailed",
        "boom again",
        Some(2),
        t1
    ));
    assert_eq!(list[0].last_transition_time, Time(t0));
    assert!(!set_condition(
        &mut list,
        "Ready",
        "False",
        "StartFailed",
        "boom again",
        Some(2),
        t1
    ));
    assert!(set_condition(&mut list, "Ready", "True", "Running", "", Some(2), t1));
    assert_eq!(list[0].last_transition_time, Time(t1));
    assert_eq!(list.len(), 1);
}
