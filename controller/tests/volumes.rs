//! The volume decisions (SPEC 2.5) as tables: the holder Pod's shape, the claims made from
//! templates and adopted, VolumesReady's first reason that holds, the machine's mounts, what an
//! evicted holder means for the machine, placement's wait and restriction, and the delete's
//! writes. No I/O: `vm::volumes` is pure.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use serde_json::{Value, json};
use smolvm_api::{
    SmolVM,
    constants::reason,
    fixtures,
    nodeapi::{MachineState, MachineStatus, MachineVolumes, NetworkSpec},
};
use smolvm_controller::vm::{
    rules::MachineAction,
    volumes::{
        Presence, Seen, Settings, Step, Verdict, VolumeWrite, before_placement,
        holder::{self, holder_pod},
        judge, lost_data, on_delete, step,
    },
    workload::Source,
};

const UID: &str = "6f1c0a52-3b0e-4a57-9d0c-1f2e3d4c5b6a";
const NODE: &str = "node-a";
const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const HOLDER_UID: &str = "11111111-2222-3333-4444-555555555555";
const OLD_HOLDER_UID: &str = "99999999-2222-3333-4444-555555555555";

/// The seed's SmolVM bound to NODE with four volumes: an existing claim `db`, a claim template
/// `data` (`whenDeleted` as given), a ConfigMap `config` and a Secret `creds`.
fn vm_with(when_deleted: &str) -> SmolVM {
    let mut object = fixtures::bound(fixtures::alpine(), NODE);
    object["spec"]["terminationGracePeriodSeconds"] = json!(20);
    object["spec"]["volumes"] = json!([
        {"name": "db", "mountPath": "/var/lib/db", "persistentVolumeClaim": {"claimName": "db-claim"}},
        {"name": "data", "mountPath": "/data", "claimTemplate": {
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            "whenDeleted": when_deleted}},
        {"name": "config", "mountPath": "/etc/app", "configMap": {"name": "app-config"}},
        {"name": "creds", "mountPath": "/etc/creds", "readOnly": true, "secret": {"secretName": "app-creds"}}
    ]);
    serde_json::from_value(object).expect("a SmolVM")
}

fn vm() -> SmolVM {
    vm_with("Retain")
}

fn claim(name: &str, labels: Value, bound_to: Option<&str>) -> Arc<PersistentVolumeClaim> {
    let mut object = json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Pending"}
    });
    if let Some(pv) = bound_to {
        object["spec"]["volumeName"] = json!(pv);
        object["status"]["phase"] = json!("Bound");
    }
    Arc::new(serde_json::from_value(object).expect("a claim"))
}

fn ours() -> Value {
    json!({"vm.smolvm.dev/smolvm": "alpine", "vm.smolvm.dev/volume": "data"})
}

fn pinned_pv(name: &str, node: &str) -> Arc<PersistentVolume> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
            ]}}}
        }))
        .expect("a PV"),
    )
}

/// The holder Pod the controller would make, as the API server stores it (a UID), in `phase`,
/// scheduled or not, its container ready or not.
fn holder(uid: &str, scheduled: bool, phase: &str, ready: bool) -> Arc<Pod> {
    let mut pod = holder_pod(&vm(), NODE, "smolvm-runtime", 10262, TOKEN).expect("a holder");
    pod.metadata.uid = Some(uid.into());
    if scheduled {
        pod.spec.as_mut().expect("spec").node_name = Some(NODE.into());
    }
    pod.status = Some(
        serde_json::from_value(json!({
            "phase": phase,
            "containerStatuses": [{"name": "hold", "ready": ready, "restartCount": 0, "image": "i", "imageID": ""}]
        }))
        .expect("a status"),
    );
    Arc::new(pod)
}

/// Everything in place: both claims bound (data to a PV pinned to NODE), both sources there, the
/// holder mounted.
fn seen() -> Seen {
    Seen {
        settings: Settings {
            holder_image: Some("smolvm-runtime".into()),
            release_port: 10262,
        },
        claims: BTreeMap::from([
            (
                "db-claim".to_string(),
                Some(claim("db-claim", json!({}), Some("pv-db"))),
            ),
            (
                "alpine-data".to_string(),
                Some(claim("alpine-data", ours(), Some("local-3"))),
            ),
        ]),
        bound: BTreeMap::from([("local-3".to_string(), pinned_pv("local-3", NODE))]),
        sources: BTreeMap::from([
            ((Source::ConfigMap, "app-config".to_string()), Presence::Found),
            ((Source::Secret, "app-creds".to_string()), Presence::Found),
        ]),
        holder: Some(holder(HOLDER_UID, true, "Running", true)),
        holder_events: Vec::new(),
        token: "fresh".into(),
    }
}

fn machine(state: MachineState, holder_uid: Option<&str>) -> MachineStatus {
    MachineStatus {
        name: format!("svm-{UID}"),
        state,
        runtime_state: "whatever".into(),
        image: None,
        cpus: 1,
        memory_mib: 512,
        storage_gib: Some(20),
        overlay_gib: Some(10),
        network: NetworkSpec::default(),
        pid: None,
        suspended: None,
        pool: None,
        volumes: holder_uid.map(|uid| MachineVolumes {
            holder_uid: uid.into(),
            mounts: Vec::new(),
        }),
    }
}

fn kinds(writes: &[VolumeWrite]) -> Vec<&'static str> {
    writes
        .iter()
        .map(|w| match w {
            VolumeWrite::MakeClaim(_) => "MakeClaim",
            VolumeWrite::AdoptClaim(_) => "AdoptClaim",
            VolumeWrite::MakeHolder(_) => "MakeHolder",
            VolumeWrite::DeleteHolder { .. } => "DeleteHolder",
            VolumeWrite::DeleteClaim { .. } => "DeleteClaim",
        })
        .collect()
}

/// The holder Pod's shape, pinned: everything the holders' admission policy and the agent
/// depend on.
#[test]
fn the_holder_pod_has_the_briefs_shape() {
    let pod = holder_pod(&vm(), NODE, "registry.example/smolvm-runtime:1", 10262, TOKEN).expect("a holder");
    let v = serde_json::to_value(&pod).expect("json");
    let meta = &v["metadata"];
    assert_eq!(meta["name"], "alpine-holder");
    assert_eq!(meta["namespace"], "default");
    assert_eq!(
        meta["labels"],
        json!({"vm.smolvm.dev/smolvm": "alpine", "vm.smolvm.dev/holder": "true", "app.kubernetes.io/managed-by": "smolvm-controller"})
    );
    assert_eq!(meta["annotations"], json!({"vm.smolvm.dev/smolvm-uid": UID}));
    assert_eq!(
        meta["ownerReferences"],
        json!([{"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM", "name": "alpine", "uid": UID,
                "controller": true, "blockOwnerDeletion": true}])
    );
    let spec = &v["spec"];
    assert_eq!(
        spec["affinity"],
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}})
    );
    assert!(spec.get("nodeName").is_none(), "never nodeName: {spec}");
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(spec.get(host).is_none_or(|h| h == false), "{host}: {spec}");
    }
    assert_eq!(
        spec["tolerations"],
        json!([{"key": "vm.smolvm.dev/dedicated", "operator": "Exists", "effect": "NoSchedule"}])
    );
    assert_eq!(spec["priorityClassName"], "smolvm-holder");
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["enableServiceLinks"], false);
    assert_eq!(spec["terminationGracePeriodSeconds"], 50, "the VM's 20 s and 30");
    assert_eq!(
        spec["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}})
    );
    let containers = spec["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["name"], "hold");
    assert_eq!(c["image"], "registry.example/smolvm-runtime:1");
    assert_eq!(c["command"], json!(["/usr/local/bin/smolvm-runtime", "hold"]));
    assert!(c.get("args").is_none() && c.get("ports").is_none(), "{c}");
    // Guaranteed QoS: requests equal limits, CPU and memory.
    let size = json!({"cpu": "10m", "memory": "16Mi"});
    assert_eq!(c["resources"], json!({"requests": size, "limits": size}));
    assert_eq!(
        c["securityContext"],
        json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}})
    );
    assert_eq!(
        c["lifecycle"],
        json!({"preStop": {"httpGet": {"host": "127.0.0.1", "port": 10262, "path": "/v1/holders/release", "scheme": "HTTP",
               "httpHeaders": [{"name": "x-smolvm-release-token", "value": TOKEN}]}}})
    );
    let mounts: Vec<(&str, &str, bool)> = c["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| {
            let path = m["mountPath"].as_str().unwrap_or_default();
            (m["name"].as_str().unwrap_or_default(), path, m["readOnly"] == true)
        })
        .collect();
    assert_eq!(
        mounts,
        [
            ("db", "/volumes/db", true),
            ("data", "/volumes/data", true),
            ("config", "/volumes/config", true),
            ("creds", "/volumes/creds", true),
            ("smolvm-holder-identity", "/identity", true),
        ]
    );
    assert_eq!(
        spec["volumes"],
        json!([
            {"name": "db", "persistentVolumeClaim": {"claimName": "db-claim", "readOnly": false}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "alpine-data", "readOnly": false}},
            {"name": "config", "configMap": {"name": "app-config", "optional": false, "defaultMode": 0o444}},
            {"name": "creds", "secret": {"secretName": "app-creds", "optional": false, "defaultMode": 0o444}},
            {"name": "smolvm-holder-identity", "downwardAPI": {"items": [
                {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}},
                {"path": "smolvm-uid", "fieldRef": {"fieldPath": "metadata.annotations['vm.smolvm.dev/smolvm-uid']"}}
            ]}}
        ])
    );
    assert_eq!(
        holder::release_token(&pod),
        Some(TOKEN),
        "read back from the preStop header"
    );
}

/// VolumesReady: the first reason that holds, row by row, with the writes each pass makes.
#[test]
fn volumes_ready_names_the_first_reason_that_holds() {
    type Edit = fn(&mut Seen);
    let none: Edit = |_| {};
    // (name, what differs from all in place, VolumesReady status, reason, words, writes)
    type Row<'a> = (&'a str, Edit, &'a str, &'a str, &'a str, Vec<&'a str>);
    let rows: Vec<Row> = vec![
        (
            "all mounted",
            none,
            "True",
            reason::VOLUMES_MOUNTED,
            "every volume is mounted in holder Pod default/alpine-holder",
            vec![],
        ),
        (
            "a claim missing",
            |s| {
                s.claims.insert("db-claim".into(), None);
            },
            "False",
            reason::CLAIM_MISSING,
            "claim default/db-claim (volume db) does not exist",
            vec![],
        ),
        (
            "a template's claim missing is made",
            |s| {
                s.claims.insert("alpine-data".into(), None);
            },
            "False",
            reason::CLAIM_MISSING,
            "is being made from its template",
            vec!["MakeClaim"],
        ),
        (
            "a claim of the template's name that is another's",
            |s| {
                s.claims.insert(
                    "alpine-data".into(),
                    Some(claim("alpine-data", json!({"vm.smolvm.dev/smolvm": "other"}), None)),
                );
            },
            "False",
            reason::CLAIM_CONFLICT,
            "it carries vm.smolvm.dev/smolvm=other",
            vec![],
        ),
        (
            "a claim not bound once the holder is scheduled",
            |s| {
                s.claims
                    .insert("db-claim".into(), Some(claim("db-claim", json!({}), None)));
            },
            "False",
            reason::CLAIM_PENDING,
            "claim default/db-claim (volume db) is Pending",
            vec![],
        ),
        (
            "a claim not bound waits for the holder to be scheduled",
            |s| {
                s.claims
                    .insert("db-claim".into(), Some(claim("db-claim", json!({}), None)));
                s.holder = Some(holder(HOLDER_UID, false, "Pending", false));
            },
            "False",
            reason::HOLDER_PENDING,
            "waits to be scheduled to node node-a",
            vec![],
        ),
        (
            "a ConfigMap missing",
            |s| {
                s.sources
                    .insert((Source::ConfigMap, "app-config".into()), Presence::Missing);
            },
            "False",
            reason::VOLUME_SOURCE_MISSING,
            "ConfigMap default/app-config (volume config) does not exist",
            vec![],
        ),
        (
            "a ConfigMap the controller may not read is the kubelet's to check",
            |s| {
                s.sources
                    .insert((Source::ConfigMap, "app-config".into()), Presence::Forbidden);
            },
            "True",
            reason::VOLUMES_MOUNTED,
            "every volume is mounted",
            vec![],
        ),
        (
            "a Secret the controller may not read",
            |s| {
                s.sources
                    .insert((Source::Secret, "app-creds".into()), Presence::Forbidden);
                s.holder = None;
            },
            "False",
            reason::SECRET_ACCESS_DENIED,
            "workload-secrets",
            vec![],
        ),
        (
            "a Pod of the holder's name that is another's",
            |s| {
                let mut pod = (*holder(HOLDER_UID, true, "Running", true)).clone();
                pod.metadata.owner_references = None;
                s.holder = Some(Arc::new(pod));
            },
            "False",
            reason::HOLDER_CONFLICT,
            "does not control",
            vec![],
        ),
        (
            "no holder yet: it is made",
            |s| {
                s.holder = None;
            },
            "False",
            reason::HOLDER_PENDING,
            "holder Pod default/alpine-holder is being made on node node-a",
            vec!["MakeHolder"],
        ),
        (
            "no holder image",
            |s| {
                s.holder = None;
                s.settings.holder_image = None;
            },
            "False",
            reason::HOLDER_PENDING,
            "no holder image configured",
            vec![],
        ),
        (
            "a claim missing: no holder is made",
            |s| {
                s.holder = None;
                s.claims.insert("db-claim".into(), None);
            },
            "False",
            reason::CLAIM_MISSING,
            "does not exist",
            vec![],
        ),
        (
            "the kubelet's words while it mounts",
            |s| {
                let mut pod = (*holder(HOLDER_UID, true, "Pending", false)).clone();
                let status = pod.status.as_mut().expect("status");
                status.container_statuses.as_mut().expect("containers")[0].state = serde_json::from_value(
                    json!({"waiting": {"reason": "ContainerCreating", "message": "\u{1b}[31mwaiting\u{1b}[0m"}}),
                )
                .ok();
                s.holder = Some(Arc::new(pod));
                s.holder_events = vec!["FailedMount: MountVolume.SetUp failed for volume \"config\"".into()];
            },
            "False",
            reason::HOLDER_PENDING,
            "has not mounted every volume yet: ContainerCreating: waiting (FailedMount: MountVolume.SetUp failed",
            vec![],
        ),
        (
            "the scheduler's words",
            |s| {
                let mut pod = (*holder(HOLDER_UID, false, "Pending", false)).clone();
                pod.status = serde_json::from_value(json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/3 nodes are available: 1 node(s) had volume node affinity conflict."}]})).ok();
                s.holder = Some(Arc::new(pod));
            },
            "False",
            reason::HOLDER_PENDING,
            "not scheduled to node node-a yet: Unschedulable: 0/3 nodes are available",
            vec![],
        ),
        (
            "a holder that ended is deleted, to be made again",
            |s| {
                let mut pod = (*holder(HOLDER_UID, true, "Failed", false)).clone();
                pod.status.as_mut().expect("status").reason = Some("Evicted".into());
                s.holder = Some(Arc::new(pod));
            },
            "False",
            reason::HOLDER_PENDING,
            "being replaced",
            vec!["DeleteHolder"],
        ),
    ];
    for (name, edit, status, why, words, writes) in rows {
        let mut s = seen();
        edit(&mut s);
        let v = judge(&vm(), NODE, &s, Some(None));
        assert_eq!(
            (v.condition.0, v.condition.1),
            (status, why),
            "{name}: {}",
            v.condition.2
        );
        assert!(v.condition.2.contains(words), "{name}: {}", v.condition.2);
        assert!(!v.condition.2.contains('\u{1b}'), "{name}: cleaned: {}", v.condition.2);
        assert_eq!(kinds(&v.writes), writes, "{name}");
        assert!(!v.evicted && !v.stop, "{name}: no machine, nothing evicted");
    }
}

/// The machine's volumes from the mounted holder: its UID, the namespace, the token read back
/// from it, each volume's directory (a claim's is its bound PV's name) and target.
#[test]
fn the_machine_mounts_name_the_holder_and_each_directory() {
    let v = judge(&vm(), NODE, &seen(), Some(None));
    let mounts = v.mounts.expect("mounted");
    assert_eq!(mounts.holder_uid, HOLDER_UID);
    assert_eq!(mounts.namespace, "default");
    assert_eq!(mounts.release_token.expose(), TOKEN);
    let each: Vec<(&str, &str, &str, bool)> = mounts
        .mounts
        .iter()
        .map(|m| (m.name.as_str(), m.directory.as_str(), m.target.as_str(), m.read_only))
        .collect();
    assert_eq!(
        each,
        [
            ("db", "pv-db", "/var/lib/db", false),
            ("data", "local-3", "/data", false),
            ("config", "config", "/etc/app", true),
            ("creds", "creds", "/etc/creds", true),
        ]
    );
    // Not mounted yet: no mounts, so no create.
    let mut s = seen();
    s.holder = Some(holder(HOLDER_UID, true, "Running", false));
    assert_eq!(judge(&vm(), NODE, &s, Some(None)).mounts, None);
}

/// An evicted holder, for the machine: HolderEvicted while the holder the machine's mounts point
/// at is going, gone or replaced; a running machine whose holder is gone is stopped (a going one
/// is the release hook's to stop); a new mounted holder is bound before the start.
#[test]
fn an_evicted_holder_stops_the_machine_and_a_new_one_is_bound() {
    let deleting = {
        let mut pod = (*holder(HOLDER_UID, true, "Running", true)).clone();
        pod.metadata.deletion_timestamp = serde_json::from_value(json!("2026-12-01T10:00:00Z")).ok();
        Arc::new(pod)
    };
    // (name, holder, machine state, the holder the machine's mounts point at) ->
    // (reason, evicted, stop, rebind, writes)
    type Row<'a> = (
        &'a str,
        Option<Arc<Pod>>,
        MachineState,
        Option<&'a str>,
        &'a str,
        [bool; 3],
        Vec<&'a str>,
    );
    let rows: Vec<Row> = vec![
        (
            "steady",
            Some(holder(HOLDER_UID, true, "Running", true)),
            MachineState::Running,
            Some(HOLDER_UID),
            reason::VOLUMES_MOUNTED,
            [false, false, false],
            vec![],
        ),
        (
            "being deleted: the hook stops it",
            Some(deleting),
            MachineState::Running,
            Some(HOLDER_UID),
            reason::HOLDER_EVICTED,
            [true, false, false],
            vec![],
        ),
        (
            "gone while it runs: stopped, a new holder made",
            None,
            MachineState::Running,
            Some(HOLDER_UID),
            reason::HOLDER_EVICTED,
            [true, true, false],
            vec!["MakeHolder"],
        ),
        (
            "gone, stopped already",
            None,
            MachineState::Stopped,
            Some(HOLDER_UID),
            reason::HOLDER_EVICTED,
            [true, false, false],
            vec!["MakeHolder"],
        ),
        (
            "a new holder not mounted yet",
            Some(holder(HOLDER_UID, true, "Pending", false)),
            MachineState::Stopped,
            Some(OLD_HOLDER_UID),
            reason::HOLDER_EVICTED,
            [true, false, false],
            vec![],
        ),
        (
            "a new holder mounted: bind, then start",
            Some(holder(HOLDER_UID, true, "Running", true)),
            MachineState::Stopped,
            Some(OLD_HOLDER_UID),
            reason::HOLDER_EVICTED,
            [true, false, true],
            vec![],
        ),
        (
            "a new holder mounted while the old mounts still run: stopped first",
            Some(holder(HOLDER_UID, true, "Running", true)),
            MachineState::Running,
            Some(OLD_HOLDER_UID),
            reason::HOLDER_EVICTED,
            [true, true, true],
            vec![],
        ),
        (
            "a node that does not report the mounts' holder",
            Some(holder(HOLDER_UID, true, "Running", true)),
            MachineState::Stopped,
            None,
            reason::VOLUMES_MOUNTED,
            [false, false, false],
            vec![],
        ),
    ];
    for (name, pod, state, recorded, why, [evicted, stop, rebind], writes) in rows {
        let mut s = seen();
        s.holder = pod;
        let m = machine(state, recorded);
        let v = judge(&vm(), NODE, &s, Some(Some(&m)));
        assert_eq!(v.condition.1, why, "{name}: {}", v.condition.2);
        assert_eq!([v.evicted, v.stop, v.rebind], [evicted, stop, rebind], "{name}");
        assert_eq!(kinds(&v.writes), writes, "{name}");
        if why == reason::HOLDER_EVICTED {
            assert!(
                v.condition.2.contains("holder Pod default/alpine-holder"),
                "{name}: {}",
                v.condition.2
            );
            assert!(
                v.condition.2.contains(&format!("svm-{UID}")),
                "{name}: {}",
                v.condition.2
            );
        }
    }
}

/// What the volumes mean for the machine's next call by its own rules.
#[test]
fn the_machine_is_created_and_started_only_with_its_volumes_mounted() {
    let ready = judge(&vm(), NODE, &seen(), Some(None));
    let pending = {
        let mut s = seen();
        s.holder = Some(holder(HOLDER_UID, true, "Pending", false));
        judge(&vm(), NODE, &s, Some(None))
    };
    let evicted = |state, recorded: &str| {
        let m = machine(state, Some(recorded));
        judge(&vm(), NODE, &seen(), Some(Some(&m)))
    };
    let rebind = evicted(MachineState::Stopped, OLD_HOLDER_UID);
    let stop = evicted(MachineState::Running, OLD_HOLDER_UID);
    let create = MachineAction::Create(Box::new(
        smolvm_controller::vm::rules::machine_spec(&vm()).expect("spec"),
    ));
    let mounts = Box::new(ready.mounts.clone().expect("mounted"));
    let rows: Vec<(&str, &Verdict, MachineAction, bool, Step)> = vec![
        ("create once mounted", &ready, create.clone(), false, Step::Proceed),
        ("no create before", &pending, create, false, Step::Wait),
        (
            "no start before",
            &pending,
            MachineAction::EnsureRunning,
            false,
            Step::Wait,
        ),
        ("no resume before", &pending, MachineAction::Resume, false, Step::Wait),
        ("a stop goes on", &pending, MachineAction::Stop, false, Step::Proceed),
        (
            "start once mounted",
            &ready,
            MachineAction::EnsureRunning,
            false,
            Step::Proceed,
        ),
        (
            "a new holder: bind first",
            &rebind,
            MachineAction::EnsureRunning,
            false,
            Step::Bind(mounts.clone()),
        ),
        (
            "a resume too",
            &rebind,
            MachineAction::Resume,
            false,
            Step::Bind(mounts),
        ),
        (
            "bound and still another's: no start",
            &rebind,
            MachineAction::EnsureRunning,
            true,
            Step::Wait,
        ),
        (
            "running on the old holder's mounts: stop",
            &stop,
            MachineAction::None,
            false,
            Step::Stop,
        ),
        (
            "and the stop is the machine's own",
            &stop,
            MachineAction::Stop,
            false,
            Step::Proceed,
        ),
    ];
    for (name, verdict, action, bound, want) in rows {
        assert_eq!(step(verdict, &action, bound), want, "{name}");
    }
}

/// Before placement: a missing claim waits (a template's is made first), another's claim
/// waits, and a claim bound to a pinned PV restricts the nodes.
#[test]
fn placement_waits_for_claims_and_honours_pinned_volumes() {
    type Edit = fn(&mut Seen);
    // (name, what differs, the reason it waits, the writes, the PVs that restrict it)
    type Row<'a> = (&'a str, Edit, Option<&'a str>, Vec<&'a str>, Vec<&'a str>);
    let rows: Vec<Row> = vec![
        (
            "bound claims: placed where local-3 is",
            |_| {},
            None,
            vec![],
            vec!["local-3"],
        ),
        (
            "a claim missing waits",
            |s| {
                s.claims.insert("db-claim".into(), None);
            },
            Some(reason::CLAIM_MISSING),
            vec![],
            vec!["local-3"],
        ),
        (
            "a template's claim missing is made and placed",
            |s| {
                s.claims.insert("alpine-data".into(), None);
                s.bound.clear();
            },
            None,
            vec!["MakeClaim"],
            vec![],
        ),
        (
            "a Pending claim is placed anywhere",
            |s| {
                s.claims
                    .insert("db-claim".into(), Some(claim("db-claim", json!({}), None)));
                s.bound.clear();
            },
            None,
            vec![],
            vec![],
        ),
        (
            "another's claim waits",
            |s| {
                s.claims
                    .insert("alpine-data".into(), Some(claim("alpine-data", json!({}), None)));
            },
            Some(reason::CLAIM_CONFLICT),
            vec![],
            vec![],
        ),
    ];
    for (name, edit, wait, writes, reach) in rows {
        let mut s = seen();
        edit(&mut s);
        let prelude = before_placement(&vm(), &s);
        assert_eq!(
            prelude.wait.as_ref().map(|(why, _)| *why),
            wait,
            "{name}: {:?}",
            prelude.wait
        );
        assert_eq!(kinds(&prelude.writes), writes, "{name}");
        let pvs: Vec<&str> = prelude.reach.iter().map(|r| r.pv.as_str()).collect();
        assert_eq!(pvs, reach, "{name}");
    }
}

/// A template's claim: `<smolvm>-<volume>`, labelled, owned only for `whenDeleted: Delete`; a
/// retained claim carrying this SmolVM's name is adopted, with the owner reference where the
/// policy is `Delete`.
#[test]
fn template_claims_are_made_labelled_and_adopted() {
    for (policy, owned) in [("Retain", false), ("Delete", true)] {
        let mut s = seen();
        s.claims.insert("alpine-data".into(), None);
        let v = judge(&vm_with(policy), NODE, &s, Some(None));
        let Some(VolumeWrite::MakeClaim(made)) = v.writes.first() else {
            panic!("{policy}: {:?}", kinds(&v.writes));
        };
        let made = serde_json::to_value(made).expect("json");
        assert_eq!(made["metadata"]["name"], "alpine-data", "{policy}");
        assert_eq!(made["metadata"]["labels"], ours(), "{policy}");
        assert_eq!(made["spec"]["resources"]["requests"]["storage"], "1Gi", "{policy}");
        assert_eq!(
            made["metadata"]["ownerReferences"][0]["uid"] == UID,
            owned,
            "{policy}: {made}"
        );
    }
    // Retained from an earlier SmolVM of this name: used as it is, or adopted under Delete.
    let retain = judge(&vm_with("Retain"), NODE, &seen(), Some(None));
    assert_eq!(kinds(&retain.writes), Vec::<&str>::new());
    let delete = judge(&vm_with("Delete"), NODE, &seen(), Some(None));
    assert_eq!(kinds(&delete.writes), ["AdoptClaim"]);
    let VolumeWrite::AdoptClaim(adopted) = &delete.writes[0] else {
        unreachable!()
    };
    let adopted = serde_json::to_value(adopted).expect("json");
    assert_eq!(adopted["metadata"]["name"], "alpine-data");
    assert_eq!(adopted["metadata"]["ownerReferences"][0]["uid"], UID);
    assert!(
        adopted.get("spec").is_none(),
        "only the reference is applied: {adopted}"
    );
    // Owned by an earlier SmolVM of the same name that is still there: another's.
    let mut s = seen();
    let mut theirs = (*claim("alpine-data", ours(), Some("local-3"))).clone();
    theirs.metadata.owner_references = serde_json::from_value(json!([{"apiVersion": "vm.smolvm.dev/v1alpha1",
        "kind": "SmolVM", "name": "alpine", "uid": "an-older-uid", "controller": true}]))
    .ok();
    s.claims.insert("alpine-data".into(), Some(Arc::new(theirs)));
    let v = judge(&vm_with("Delete"), NODE, &s, Some(None));
    assert_eq!(v.condition.1, reason::CLAIM_CONFLICT, "{}", v.condition.2);
}

/// At delete, once the machine is gone: the holder Pod, then the claims whose policy is
/// `Delete` (this SmolVM's only); a retained claim stays.
#[test]
fn delete_takes_the_holder_then_the_delete_claims() {
    let writes = |policy: &str, edit: fn(&mut Seen)| {
        let mut s = seen();
        edit(&mut s);
        on_delete(&vm_with(policy), &s)
    };
    assert_eq!(
        writes("Delete", |_| {}),
        [
            VolumeWrite::DeleteHolder { uid: HOLDER_UID.into() },
            VolumeWrite::DeleteClaim {
                name: "alpine-data".into(),
                uid: "uid-alpine-data".into()
            }
        ]
    );
    assert_eq!(kinds(&writes("Retain", |_| {})), ["DeleteHolder"]);
    assert_eq!(kinds(&writes("Delete", |s| s.holder = None)), ["DeleteClaim"]);
    let foreign: fn(&mut Seen) = |s| {
        s.claims
            .insert("alpine-data".into(), Some(claim("alpine-data", json!({}), None)));
    };
    assert_eq!(
        kinds(&writes("Delete", foreign)),
        ["DeleteHolder"],
        "another's claim stays"
    );
}

/// A machine lost from a node whose data is on a node-pinned PV: the message names the volume,
/// its claim and the PV.
#[test]
fn a_lost_machine_names_its_pinned_volume_data() {
    let said = lost_data(&vm(), &seen()).expect("pinned data");
    assert!(
        said.contains("volume data (claim default/alpine-data, PV local-3 is pinned to node-a)"),
        "{said}"
    );
    let mut s = seen();
    s.bound.clear();
    assert_eq!(lost_data(&vm(), &s), None, "no pinned PV, nothing to say");
}
