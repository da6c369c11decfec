//! The lifecycle rules' tables: next step per object state, node health, machine actions, conditions.

use std::collections::BTreeMap;

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::{SignedDuration, Timestamp},
};
use smolvm_api::{
    NodeResources, Phase, RestartPolicy, SmolVM, SmolVMNode, SmolVMStatus,
    constants::{FINALIZER, FORCE_DELETE_ANNOTATION, condition},
    fixtures,
    nodeapi::{MachineState, MachineStatus, NetworkSpec, ResizeSpec},
};
use smolvm_controller::vm::rules::{
    MachineAction, Made, NodeHealth, Restart, RunGoal, Step, Want, exited_message, machine_action, machine_name,
    machine_resources, machine_spec, next_step, node_health, resize_shortfall, restart, restart_request, run_goal,
    set_condition, step_events, transition_event,
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

/// The VM with `status.machineName` pointed at another VM's machine, as a tenant allowed to
/// write `smolvms/status` could try.
fn tampered(mut vm: SmolVM) -> SmolVM {
    vm.status.get_or_insert_with(Default::default).machine_name = Some("svm-someone-elses-machine".into());
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
        (
            "tampered_machine_name_is_ignored_on_converge",
            tampered(vm(true, false, true, None)),
            Step::Converge {
                node: "node-a".into(),
                machine: machine.clone(),
            },
        ),
        (
            "tampered_machine_name_is_ignored_on_delete",
            tampered(vm(true, true, true, None)),
            del(false),
        ),
    ];
    for (name, vm, expected) in cases {
        assert_eq!(next_step(&vm), expected, "{name}");
    }
}

#[test]
fn a_missing_machine_is_created_only_if_it_never_existed() {
    use smolvm_api::{
        EffectiveResources,
        constants::{RECREATE_LOST_MACHINE_ANNOTATION, RECREATE_LOST_MACHINE_VALUE},
    };
    use smolvm_controller::vm::rules::{MissingMachine, missing_machine};
    let seen = |mut vm: SmolVM| {
        vm.status.get_or_insert_with(Default::default).effective = Some(EffectiveResources::default());
        vm
    };
    let recreate = |mut vm: SmolVM, value: &str| {
        vm.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(RECREATE_LOST_MACHINE_ANNOTATION.into(), value.into());
        vm
    };
    let cases = [
        (
            "never_seen_is_created",
            vm(true, false, true, None),
            MissingMachine::Create,
        ),
        (
            "never_seen_with_annotation_is_created",
            recreate(vm(true, false, true, None), RECREATE_LOST_MACHINE_VALUE),
            MissingMachine::Create,
        ),
        (
            "seen_then_gone_is_lost",
            seen(vm(true, false, true, None)),
            MissingMachine::Lost,
        ),
        (
            "lost_with_annotation_is_recreated",
            recreate(seen(vm(true, false, true, None)), RECREATE_LOST_MACHINE_VALUE),
            MissingMachine::Recreate,
        ),
        (
            "lost_with_a_wrong_value_stays_lost",
            recreate(seen(vm(true, false, true, None)), "True"),
            MissingMachine::Lost,
        ),
    ];
    for (name, vm, expected) in cases {
        assert_eq!(missing_machine(&vm), expected, "{name}");
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
    let timeout = &smolvm_controller::placement::Config {
        heartbeat_timeout: SignedDuration::from_secs(40),
        clock: None,
    };
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
    // By the controller's own clock: a heartbeat an hour in the future is fresh when first seen,
    // and stale once it has not changed for longer than the timeout, whatever it says.
    let clock = smolvm_controller::placement::Config::observed(
        SignedDuration::from_secs(40),
        std::sync::Arc::new(smolvm_controller::heartbeat::HeartbeatClock::new()),
    );
    let fast = ready_node("uid-node-a", Some(-3600), "True");
    assert_eq!(node_health(&vm, Some(&fast), now(), &clock), NodeHealth::Healthy);
    let later = now() + SignedDuration::from_secs(41);
    assert!(
        matches!(
            node_health(&vm, Some(&fast), later, &clock),
            NodeHealth::Unreachable { .. }
        ),
        "a dead node with a fast clock goes stale"
    );
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
        suspended: None,
        pool: None,
        volumes: None,
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
        (
            "missing_is_created",
            Want::RUN,
            None,
            MachineAction::Create(Box::new(desired.clone())),
        ),
        (
            "created_is_started",
            Want::RUN,
            Some(machine(Created, 1, 512, 20)),
            MachineAction::EnsureRunning,
        ),
        (
            "stopped_is_started",
            Want::RUN,
            Some(machine(Stopped, 1, 512, 20)),
            MachineAction::EnsureRunning,
        ),
        (
            "running_is_stopped",
            Want::STOP,
            Some(machine(Running, 1, 512, 20)),
            MachineAction::Stop,
        ),
        (
            "stopped_stays",
            Want::STOP,
            Some(machine(Stopped, 1, 512, 20)),
            MachineAction::None,
        ),
        (
            "running_steady",
            Want::RUN,
            Some(machine(Running, 1, 512, 20)),
            MachineAction::None,
        ),
        (
            "running_cpu_change_resized_live",
            Want::RUN,
            Some(machine(Running, 2, 512, 20)),
            MachineAction::Resize(ResizeSpec {
                cpus: Some(1),
                memory_mib: Some(512),
                ..Default::default()
            }),
        ),
        (
            "disk_growth_applies_while_stopped",
            Want::STOP,
            Some(machine(Stopped, 1, 512, 10)),
            MachineAction::Resize(ResizeSpec {
                storage_gib: Some(20),
                ..Default::default()
            }),
        ),
        (
            "stopped_cpu_change_is_pending",
            Want::STOP,
            Some(machine(Stopped, 2, 512, 20)),
            MachineAction::ResizePending(String::new()),
        ),
        // Suspend (V13, SPEC 2.3): a running machine is suspended; one with nothing saved is
        // started first; a suspended one stays, is resumed, or is stopped with its saved
        // memory discarded when running is false.
        (
            "running_is_suspended",
            Want::SUSPEND,
            Some(machine(Running, 1, 512, 20)),
            MachineAction::Suspend,
        ),
        (
            "created_is_started_before_its_suspend",
            Want::SUSPEND,
            Some(machine(Created, 1, 512, 20)),
            MachineAction::EnsureRunning,
        ),
        (
            "stopped_is_started_before_its_suspend",
            Want::SUSPEND,
            Some(machine(Stopped, 1, 512, 20)),
            MachineAction::EnsureRunning,
        ),
        (
            "suspended_stays",
            Want::SUSPEND,
            Some(machine(Suspended, 1, 512, 20)),
            MachineAction::None,
        ),
        (
            "suspended_is_resumed",
            Want::RUN,
            Some(machine(Suspended, 1, 512, 20)),
            MachineAction::Resume,
        ),
        (
            "suspended_and_not_running_is_discarded",
            Want::STOP,
            Some(machine(Suspended, 1, 512, 20)),
            MachineAction::Discard,
        ),
        (
            "disk_growth_while_suspended_waits_for_the_resume",
            Want::SUSPEND,
            Some(machine(Suspended, 1, 512, 10)),
            MachineAction::ResizePending(String::new()),
        ),
    ];
    for (name, want, observed, expected) in cases {
        let got = machine_action(&desired, want, observed.as_ref());
        match (&got, &expected) {
            (MachineAction::ResizePending(message), MachineAction::ResizePending(_)) => {
                let says = if want.suspended {
                    "when the machine is resumed"
                } else {
                    "1 CPUs"
                };
                assert!(message.contains(says), "{name}: {message}")
            }
            _ => assert_eq!(got, expected, "{name}"),
        }
    }
}

/// A bound VM with `spec.running`, `spec.restartPolicy` and the status the last pass wrote.
fn vm_with(running: bool, policy: RestartPolicy, last: Option<SmolVMStatus>) -> SmolVM {
    let mut vm = vm(true, false, true, None);
    vm.spec.running = Some(running);
    vm.spec.restart_policy = Some(policy);
    if let Some(last) = last {
        let bound = vm.status.take().unwrap_or_default();
        vm.status = Some(SmolVMStatus {
            node_name: bound.node_name,
            node_uid: bound.node_uid,
            machine_name: bound.machine_name,
            ..last
        });
    }
    vm
}

#[test]
fn run_goal_table() {
    use MachineState::{Created, Failed, Running, Stopped};
    use RestartPolicy::{Always, Never, OnFailure};
    let ran = || status(Some(Phase::Running), Some(("True", "Running")));
    let exited = || status(Some(Phase::Stopped), Some(("False", "Exited")));
    let stopped = || status(Some(Phase::Stopped), Some(("True", "Stopped")));
    let stopping = || status(Some(Phase::Running), Some(("False", "Stopped")));
    let start_failed = || status(Some(Phase::Failed), Some(("False", "StartFailed")));
    let creating = || status(Some(Phase::Creating), Some(("False", "Creating")));
    // (name, spec.running, policy, last status, machine state now, goal)
    type Case = (
        &'static str,
        bool,
        RestartPolicy,
        Option<SmolVMStatus>,
        Option<MachineState>,
        RunGoal,
    );
    let cases: Vec<Case> = vec![
        (
            "not_running_is_stop",
            false,
            Never,
            Some(ran()),
            Some(Stopped),
            RunGoal::Stop,
        ),
        (
            "not_running_after_exit",
            false,
            Never,
            Some(exited()),
            Some(Stopped),
            RunGoal::Stop,
        ),
        ("missing_machine_is_created", true, Never, None, None, RunGoal::Run),
        ("never_started", true, Never, None, Some(Created), RunGoal::Run),
        (
            "creating_then_start",
            true,
            Never,
            Some(creating()),
            Some(Created),
            RunGoal::Run,
        ),
        ("running_stays", true, Never, Some(ran()), Some(Running), RunGoal::Run),
        // A failed start is retried whatever the policy, as a Pod's is.
        (
            "start_failure_retried_never",
            true,
            Never,
            Some(start_failed()),
            Some(Stopped),
            RunGoal::Run,
        ),
        (
            "start_failure_retried_on_failure",
            true,
            OnFailure,
            Some(start_failed()),
            Some(Failed),
            RunGoal::Run,
        ),
        // Stopped on purpose (spec.running was false), then running: true again.
        (
            "restarted_by_the_user",
            true,
            Never,
            Some(stopped()),
            Some(Stopped),
            RunGoal::Run,
        ),
        (
            "restarted_mid_stop",
            true,
            Never,
            Some(stopping()),
            Some(Stopped),
            RunGoal::Run,
        ),
        // Ran and stopped on its own.
        (
            "exit_always_restarts",
            true,
            Always,
            Some(ran()),
            Some(Stopped),
            RunGoal::Restart,
        ),
        (
            "exit_always_failed_restarts",
            true,
            Always,
            Some(ran()),
            Some(Failed),
            RunGoal::Restart,
        ),
        (
            "exit_never_stays",
            true,
            Never,
            Some(ran()),
            Some(Stopped),
            RunGoal::Exited,
        ),
        (
            "exit_never_failed_stays",
            true,
            Never,
            Some(ran()),
            Some(Failed),
            RunGoal::Exited,
        ),
        (
            "exit_on_failure_stays",
            true,
            OnFailure,
            Some(ran()),
            Some(Stopped),
            RunGoal::Exited,
        ),
        // The exit is remembered on later passes...
        (
            "exit_remembered_never",
            true,
            Never,
            Some(exited()),
            Some(Stopped),
            RunGoal::Exited,
        ),
        (
            "exit_remembered_on_failure",
            true,
            OnFailure,
            Some(exited()),
            Some(Stopped),
            RunGoal::Exited,
        ),
        // ...until the machine runs again (smolvm restarted a failed exit under OnFailure).
        (
            "exit_then_smolvm_restarted_it",
            true,
            OnFailure,
            Some(exited()),
            Some(Running),
            RunGoal::Run,
        ),
        (
            "always_never_remembers",
            true,
            Always,
            Some(exited()),
            Some(Stopped),
            RunGoal::Run,
        ),
    ];
    for (name, running, policy, last, state, expected) in cases {
        let vm = vm_with(running, policy, last);
        let observed = state.map(|s| machine(s, 1, 512, 20));
        let goal = run_goal(&vm, observed.as_ref());
        assert_eq!(goal, expected, "{name}");
        assert_eq!(
            goal.running(),
            matches!(expected, RunGoal::Run | RunGoal::Restart),
            "{name}"
        );
    }
}

#[test]
fn step_events_table() {
    let spec = machine_spec(&vm(true, false, true, None)).unwrap();
    let create = || MachineAction::Create(Box::new(spec.clone()));
    let grow = MachineAction::Resize(ResizeSpec {
        cpus: Some(2),
        storage_gib: Some(30),
        ..Default::default()
    });
    // (name, actions, goal, expected (reason, action, note contains))
    type Case = (
        &'static str,
        Vec<MachineAction>,
        RunGoal,
        Vec<(&'static str, &'static str, &'static str)>,
    );
    let cases: Vec<Case> = vec![
        ("nothing", vec![], RunGoal::Run, vec![]),
        (
            "create_only",
            vec![create()],
            RunGoal::Stop,
            vec![("Created", "Create", "created machine m")],
        ),
        (
            "create_and_start_is_one",
            vec![create(), MachineAction::EnsureRunning],
            RunGoal::Run,
            vec![("Started", "Start", "created and started machine m")],
        ),
        (
            "start",
            vec![MachineAction::EnsureRunning],
            RunGoal::Run,
            vec![("Started", "Start", "runs on node n")],
        ),
        (
            "restart_after_exit",
            vec![MachineAction::EnsureRunning],
            RunGoal::Restart,
            vec![("Restarted", "Start", "exited on its own; restartPolicy Always")],
        ),
        (
            "stop",
            vec![MachineAction::Stop],
            RunGoal::Stop,
            vec![("Stopped", "Stop", "stopped machine m")],
        ),
        (
            "resize_then_start",
            vec![grow.clone(), MachineAction::EnsureRunning],
            RunGoal::Run,
            vec![
                ("Resized", "Resize", "to 2 CPUs, 30 GiB storage"),
                ("Started", "Start", "machine m runs on node n"),
            ],
        ),
        (
            "pending_and_none_are_silent",
            vec![MachineAction::ResizePending("x".into()), MachineAction::None],
            RunGoal::Run,
            vec![],
        ),
    ];
    for (name, done, goal, expected) in cases {
        let got = step_events(&done, None, goal, "m", "n");
        assert_eq!(got.len(), expected.len(), "{name}: {got:?}");
        for (e, (reason, action, note)) in got.iter().zip(expected) {
            assert_eq!((e.reason, e.action), (reason, action), "{name}");
            assert!(e.note.contains(note), "{name}: {}", e.note);
        }
    }
    // A create served from a ready slot of a pool: one event, that it was served and runs.
    let served: Vec<Case> = vec![
        (
            "served_from_pool",
            vec![create()],
            RunGoal::Run,
            vec![(
                "ServedFromPool",
                "Create",
                "served machine m on node n from a ready slot of pool p: it runs",
            )],
        ),
        (
            "served_then_resized",
            vec![create(), grow],
            RunGoal::Run,
            vec![
                ("ServedFromPool", "Create", "from a ready slot of pool p"),
                ("Resized", "Resize", "to 2 CPUs"),
            ],
        ),
        (
            "no_create_no_served_event",
            vec![MachineAction::Stop],
            RunGoal::Stop,
            vec![("Stopped", "Stop", "stopped machine m")],
        ),
    ];
    for (name, done, goal, expected) in served {
        let got = step_events(&done, Some(Made::Served("p")), goal, "m", "n");
        assert_eq!(got.len(), expected.len(), "{name}: {got:?}");
        for (e, (reason, action, note)) in got.iter().zip(expected) {
            assert_eq!((e.reason, e.action), (reason, action), "{name}");
            assert!(e.note.contains(note), "{name}: {}", e.note);
        }
    }
    // A branch: one event names the source and the node's time, and that it runs.
    let branched = Made::Branched {
        source: "prepared",
        millis: 42,
    };
    let got = step_events(&[create()], Some(branched), RunGoal::Run, "m", "n");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].reason, got[0].action), ("Branched", "Create"));
    assert!(
        got[0]
            .note
            .contains("from the running SmolVM prepared in 42 ms: it runs"),
        "{}",
        got[0].note
    );
}

#[test]
fn exited_message_says_the_policy_and_the_way_back() {
    for (policy, says) in [
        (RestartPolicy::Never, "restartPolicy Never"),
        (RestartPolicy::OnFailure, "restartPolicy OnFailure"),
    ] {
        let message = exited_message(policy);
        assert!(message.contains(says), "{message}");
        assert!(message.contains("spec.running"), "{message}");
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

fn res(cpus: i64, memory_mib: i64, storage_gib: i64) -> NodeResources {
    NodeResources {
        cpus,
        memory_mib,
        storage_gib,
    }
}

#[test]
fn resize_shortfall_table() {
    let cpu_mem = ResizeSpec {
        cpus: Some(4),
        memory_mib: Some(4096),
        ..Default::default()
    };
    let disk = ResizeSpec {
        storage_gib: Some(40),
        ..Default::default()
    };
    let alloc = res(8, 8192, 100);
    type Case<'a> = (
        &'a str,
        &'a ResizeSpec,
        NodeResources, // request after the resize
        NodeResources, // machine now
        Option<NodeResources>,
        NodeResources, // others
        Option<(&'a str, i64, i64)>,
    );
    let cases: Vec<Case> = vec![
        (
            "fits",
            &cpu_mem,
            res(4, 4096, 30),
            res(2, 2048, 30),
            Some(alloc),
            res(4, 4096, 0),
            None,
        ),
        (
            "exactly_fits",
            &cpu_mem,
            res(4, 4096, 30),
            res(2, 2048, 30),
            Some(alloc),
            res(4, 4096, 70),
            None,
        ),
        (
            "cpu_short",
            &cpu_mem,
            res(4, 4096, 30),
            res(2, 2048, 30),
            Some(alloc),
            res(5, 1024, 0),
            Some(("cpus", 4, 3)),
        ),
        (
            "memory_short",
            &cpu_mem,
            res(4, 4096, 30),
            res(2, 2048, 30),
            Some(alloc),
            res(1, 6000, 0),
            Some(("memoryMiB", 4096, 2192)),
        ),
        (
            "shrinking_always_fits",
            &cpu_mem,
            res(1, 512, 30),
            res(2, 2048, 30),
            Some(alloc),
            res(8, 8192, 100),
            None,
        ),
        (
            "disk_short",
            &disk,
            res(1, 512, 50),
            res(1, 512, 30),
            Some(alloc),
            res(0, 0, 60),
            Some(("storageGiB", 50, 40)),
        ),
        (
            "cpu_not_in_a_disk_resize_is_not_checked",
            &disk,
            res(16, 512, 50),
            res(1, 512, 30),
            Some(alloc),
            res(0, 0, 0),
            None,
        ),
        (
            "no_allocatable_reported",
            &cpu_mem,
            res(64, 4096, 30),
            res(2, 2048, 30),
            None,
            res(0, 0, 0),
            None,
        ),
        (
            "over_committed_node_has_nothing_free",
            &cpu_mem,
            res(4, 4096, 30),
            res(2, 2048, 30),
            Some(alloc),
            res(10, 0, 0),
            Some(("cpus", 4, 0)),
        ),
    ];
    for (name, resize, request, current, allocatable, others, expected) in cases {
        let got = resize_shortfall(resize, &request, &current, allocatable.as_ref(), &others);
        assert_eq!(
            got.as_ref().map(|s| (s.resource, s.requested, s.free)),
            expected,
            "{name}"
        );
        if let Some(s) = got {
            let message = s.message("node-a");
            assert!(
                message.contains("node-a")
                    && message.contains(s.resource)
                    && message.contains(&format!("{} {} requested", s.requested, s.resource))
                    && message.contains(&format!("{} free", s.free)),
                "{name}: {message}"
            );
        }
    }
}

#[test]
fn machine_resources_add_storage_and_overlay() {
    let m = machine(MachineState::Running, 2, 1024, 20);
    assert_eq!(machine_resources(&m), res(2, 1024, 30));
}

fn status(phase: Option<Phase>, ready: Option<(&str, &str)>) -> SmolVMStatus {
    SmolVMStatus {
        node_name: Some("node-a".into()),
        phase,
        conditions: ready
            .map(|(status, reason)| Condition {
                type_: condition::READY.into(),
                status: status.into(),
                reason: reason.into(),
                message: format!("msg {reason}"),
                last_transition_time: Time(now()),
                observed_generation: None,
            })
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

#[test]
fn transition_event_table() {
    use Phase::*;
    let running = status(Some(Running), Some(("True", "Running")));
    let stopped = status(Some(Stopped), Some(("True", "Stopped")));
    let failed = status(Some(Failed), Some(("False", "MachineFailed")));
    let unreachable = status(Some(Unknown), Some(("Unknown", "NodeUnreachable")));
    let start_failed = status(Some(Failed), Some(("False", "StartFailed")));
    let creating = status(Some(Creating), Some(("False", "Creating")));
    let stopping = status(Some(Running), Some(("False", "Stopped")));
    let scheduled = status(Some(Scheduled), None);
    let exited = status(Some(Stopped), Some(("False", "Exited")));
    // (name, before, after, steps reported, expected (warning, reason))
    type Case<'a> = (
        &'a str,
        Option<&'a SmolVMStatus>,
        &'a SmolVMStatus,
        bool,
        Option<(bool, &'a str)>,
    );
    let cases: Vec<Case> = vec![
        ("steady_running", Some(&running), &running, false, None),
        ("crash", Some(&running), &failed, false, Some((true, "MachineFailed"))),
        (
            "node_back",
            Some(&unreachable),
            &running,
            false,
            Some((false, "Recovered")),
        ),
        (
            "crash_recovered",
            Some(&failed),
            &stopped,
            false,
            Some((false, "Recovered")),
        ),
        (
            "start_failure_then_runs",
            Some(&start_failed),
            &running,
            false,
            Some((false, "Recovered")),
        ),
        (
            "start_finished",
            Some(&creating),
            &running,
            false,
            Some((false, "Running")),
        ),
        (
            "stop_finished",
            Some(&stopping),
            &stopped,
            false,
            Some((false, "Stopped")),
        ),
        (
            "stopped_by_someone_else",
            Some(&running),
            &stopped,
            false,
            Some((false, "Stopped")),
        ),
        (
            "workload_exited",
            Some(&running),
            &exited,
            false,
            Some((false, "Exited")),
        ),
        // The actions of the pass have their own events (Created, Started, Stopped, Resized).
        ("told_by_the_action", Some(&running), &stopped, true, None),
        ("create_and_start", Some(&scheduled), &running, true, None),
        // Never converged: the first pass creates the machine, and that action has its event.
        ("first_observation", Some(&scheduled), &running, false, None),
        ("no_status", None, &running, false, None),
    ];
    for (name, before, after, steps, expected) in cases {
        let got = transition_event(before, after, steps);
        assert_eq!(got.as_ref().map(|t| (t.warning, t.reason.as_str())), expected, "{name}");
        if let Some(t) = got {
            assert!(t.note.contains("node-a"), "{name}: {}", t.note);
        }
    }
}

#[test]
fn unsettled_passes_back_off() {
    // The schedule itself is kit's, table-tested there; this is the one the controller uses.
    let schedule = smolvm_controller::vm::Unsettled::SCHEDULE;
    let delays: Vec<u64> = (1..=8).map(|n| schedule.after(n).as_secs()).collect();
    assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30, 30]);
    assert_eq!(schedule.after(u32::MAX).as_secs(), 30);
    let unsettled = smolvm_controller::vm::Unsettled::default();
    let waits: Vec<u64> = (0..3).map(|_| unsettled.bump("uid").as_secs()).collect();
    assert_eq!(waits, vec![1, 2, 4]);
    unsettled.reset("uid");
    assert_eq!(unsettled.bump("uid").as_secs(), 1);
}
#[test]
fn restart_request_table() {
    let with_request = |running: bool| {
        let mut vm = vm_with(running, RestartPolicy::Never, None);
        vm.metadata.annotations = Some(BTreeMap::from([(
            smolvm_api::constants::RESTART_ANNOTATION.to_string(),
            "2026-11-24T12:00:00Z".to_string(),
        )]));
        vm
    };
    let up = machine(MachineState::Running, 1, 512, 20);
    let down = machine(MachineState::Stopped, 1, 512, 20);
    let table: [(&str, SmolVM, Option<&MachineStatus>, Restart); 6] = [
        (
            "no request",
            vm_with(true, RestartPolicy::Always, None),
            Some(&up),
            Restart::None,
        ),
        (
            "running machine: stop, then run",
            with_request(true),
            Some(&up),
            Restart::StopThenRun,
        ),
        (
            "stopped machine: run (even with restartPolicy Never)",
            with_request(true),
            Some(&down),
            Restart::Run,
        ),
        ("no machine yet: run", with_request(true), None, Restart::Run),
        (
            "spec.running false: skipped",
            with_request(false),
            Some(&down),
            Restart::Skip,
        ),
        (
            "spec.running false, still running: skipped (the stop is spec.running's)",
            with_request(false),
            Some(&up),
            Restart::Skip,
        ),
    ];
    for (what, vm, machine, want) in table {
        assert_eq!(restart(&vm, machine), want, "{what}");
    }
    assert_eq!(restart_request(&with_request(true)), Some("2026-11-24T12:00:00Z"));
}

/// What a branch finds of its source: gone, made again, being deleted, not a source, not placed,
/// bound (running or not); a SmolVM that is no branch finds nothing. Its node is its source's.
#[test]
fn a_branch_finds_its_source_as_admission_recorded_it() {
    use smolvm_controller::vm::rules::{BranchSource, source_of};
    const SOURCE_UID: &str = "5b0c6a1e-8d2f-4c3b-9a7e-1f0d2c3b4a59";
    let source = |edit: &dyn Fn(&mut serde_json::Value)| -> SmolVM {
        let mut object = fixtures::smolvm("prepared", serde_json::json!({"image": "alpine", "branchable": true}));
        object["metadata"]["uid"] = serde_json::json!(SOURCE_UID);
        object = fixtures::bound(object, "node-a");
        edit(&mut object);
        serde_json::from_value(object).unwrap_or_else(|e| panic!("decodes: {e}"))
    };
    let mut branch_json = fixtures::smolvm(
        "task",
        serde_json::json!({"image": "alpine", "branchOf": {"name": "prepared"}}),
    );
    branch_json["metadata"]["annotations"] = serde_json::json!({"vm.smolvm.dev/branch-of-uid": SOURCE_UID});
    let branch: SmolVM = serde_json::from_value(branch_json).unwrap_or_else(|e| panic!("decodes: {e}"));
    let plain: SmolVM = serde_json::from_value(fixtures::smolvm("vm", serde_json::json!({"image": "alpine"})))
        .unwrap_or_else(|e| panic!("{e}"));
    let running = source(&|_| {});
    let stopped = source(&|o| o["status"]["phase"] = serde_json::json!("Stopped"));
    let unbound = source(&|o| o["status"] = serde_json::json!({}));
    let again = source(&|o| o["metadata"]["uid"] = serde_json::json!("another-uid"));
    let leaving = source(&|o| o["metadata"]["deletionTimestamp"] = serde_json::json!("2026-12-03T10:00:00Z"));
    let unbranchable = source(&|o| o["spec"]["branchable"] = serde_json::json!(false));
    // (case, the SmolVM, its source as read, what it finds: None, Lost, Unplaced, or Bound running?)
    let rows: Vec<(&str, &SmolVM, Option<&SmolVM>, &str)> = vec![
        ("no branch", &plain, Some(&running), "None"),
        ("running on its node", &branch, Some(&running), "Bound running"),
        ("stopped", &branch, Some(&stopped), "Bound"),
        ("not placed yet", &branch, Some(&unbound), "Unplaced"),
        ("gone", &branch, None, "Lost"),
        ("made again under its name", &branch, Some(&again), "Lost"),
        ("being deleted", &branch, Some(&leaving), "Lost"),
        ("no longer a source", &branch, Some(&unbranchable), "Lost"),
    ];
    for (case, vm, read, want) in rows {
        let found = source_of(vm, read);
        let got = match &found {
            BranchSource::None => "None",
            BranchSource::Lost(_) => "Lost",
            BranchSource::Unplaced(_) => "Unplaced",
            BranchSource::Bound { running: true, .. } => "Bound running",
            BranchSource::Bound { .. } => "Bound",
        };
        assert_eq!(got, want, "{case}: {found:?}");
        match &found {
            BranchSource::Bound {
                node, machine, from, ..
            } => {
                assert_eq!(found.node(), Ok(Some("node-a")), "{case}");
                assert_eq!(machine, &format!("svm-{SOURCE_UID}"), "{case}");
                assert_eq!(
                    (from.name.as_str(), from.uid.as_str()),
                    ("prepared", SOURCE_UID),
                    "{case}"
                );
                assert_eq!(node, "node-a");
            }
            BranchSource::None => assert_eq!(found.node(), Ok(None), "{case}"),
            BranchSource::Lost(why) | BranchSource::Unplaced(why) => {
                assert!(why.contains("prepared"), "{case}: {why}");
                assert!(found.node().is_err(), "{case}");
            }
        }
    }
}

/// A source that runs wakes the branches that wait for it: its own (by label and namespace),
/// not made yet; none while it does not run.
#[test]
fn a_running_source_wakes_the_branches_that_wait_for_it() {
    use smolvm_controller::vm::rules::waiting_on;
    let decode =
        |v: serde_json::Value| -> SmolVM { serde_json::from_value(v).unwrap_or_else(|e| panic!("decodes: {e}")) };
    let source = |phase: &str| {
        let mut o = fixtures::bound(
            fixtures::smolvm("prepared", serde_json::json!({"image": "alpine", "branchable": true})),
            "node-a",
        );
        o["status"]["phase"] = serde_json::json!(phase);
        decode(o)
    };
    let branch = |name: &str, namespace: &str, made: bool| {
        let mut o = fixtures::smolvm(
            name,
            serde_json::json!({"image": "alpine", "branchOf": {"name": "prepared"}}),
        );
        o["metadata"]["namespace"] = serde_json::json!(namespace);
        o["metadata"]["labels"] = serde_json::json!({"vm.smolvm.dev/branch-of": "prepared"});
        if made {
            o["status"] = serde_json::json!({"branchedFrom": {"name": "prepared", "uid": "u"}});
        }
        decode(o)
    };
    let vms = [
        branch("waits", "default", false),
        branch("made", "default", true),
        branch("elsewhere", "other", false),
        decode(fixtures::smolvm("plain", serde_json::json!({"image": "alpine"}))),
    ];
    let woken: Vec<String> = waiting_on(vms.iter(), &source("Running"))
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(woken, ["waits"]);
    assert!(
        waiting_on(vms.iter(), &source("Scheduled")).is_empty(),
        "not while it does not run"
    );
}

/// `stamp`: startedAt is written once; finishedAt is kept while Ready says Exited, kept while the
/// node cannot be reached (a flaky node never restarts a TTL), and cleared once the machine is
/// anything else. `expiry`: a lifetime with nothing to count from never passes.
#[test]
fn lifetimes_count_from_what_happened_on_the_node() {
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
    use smolvm_api::{Lifecycle, SmolVMSpec, SmolVMStatus};
    use smolvm_controller::vm::rules::{Expiry, expiry, stamp};
    let then = Time(Timestamp::UNIX_EPOCH);
    let now = Timestamp::now();
    let ready = |reason: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: "Ready".into(),
        status: if reason == "Running" { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: String::new(),
        last_transition_time: then.clone(),
        observed_generation: None,
    };
    // (name, phase, Ready reason, finishedAt before, startedAt before, startedAt after is `then`,
    // finishedAt after: None, `then` or now)
    let rows = [
        (
            "first Running",
            Phase::Running,
            "Running",
            false,
            false,
            Some(false),
            None,
        ),
        (
            "Running again keeps startedAt",
            Phase::Running,
            "Running",
            false,
            true,
            Some(true),
            None,
        ),
        (
            "exited: finishedAt now",
            Phase::Stopped,
            "Exited",
            false,
            true,
            Some(true),
            Some(false),
        ),
        (
            "still exited: kept",
            Phase::Stopped,
            "Exited",
            true,
            true,
            Some(true),
            Some(true),
        ),
        (
            "node unreachable: kept",
            Phase::Unknown,
            "NodeUnreachable",
            true,
            true,
            Some(true),
            Some(true),
        ),
        (
            "stopped on purpose: cleared",
            Phase::Stopped,
            "Stopped",
            true,
            true,
            Some(true),
            None,
        ),
        (
            "running again: cleared",
            Phase::Running,
            "Running",
            true,
            true,
            Some(true),
            None,
        ),
        (
            "never ran: nothing",
            Phase::Scheduled,
            "Creating",
            false,
            false,
            None,
            None,
        ),
    ];
    for (name, phase, reason, finished, started, started_after, finished_after) in rows {
        let mut status = SmolVMStatus {
            phase: Some(phase),
            conditions: vec![ready(reason)],
            started_at: started.then(|| then.clone()),
            finished_at: finished.then(|| then.clone()),
            ..Default::default()
        };
        stamp(&mut status, now);
        let at = |t: &Option<Time>| t.as_ref().map(|t| t.0 == then.0);
        assert_eq!(at(&status.started_at), started_after, "{name}: startedAt");
        assert_eq!(at(&status.finished_at), finished_after, "{name}: finishedAt");
    }
    let spec = SmolVMSpec {
        lifecycle: Some(Lifecycle {
            ttl_seconds_after_finished: Some(0),
            active_deadline_seconds: Some(0),
            ..Lifecycle::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        expiry(&spec, &SmolVMStatus::default(), now),
        Expiry::Never,
        "nothing to count from"
    );
    let ran = SmolVMStatus {
        started_at: Some(then.clone()),
        ..Default::default()
    };
    assert!(matches!(
        expiry(&spec, &ran, now),
        Expiry::Now {
            lifetime: "activeDeadlineSeconds",
            ..
        }
    ));
    assert_eq!(expiry(&SmolVMSpec::default(), &ran, now), Expiry::Never, "no lifecycle");
}
