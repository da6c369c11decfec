//! A machine's volumes through the agent's node API over mTLS (SPEC 2.5): a fake kubelet pods
//! directory in a temp dir, laid out as the kubelet lays out a holder Pod's volumes
//! (`smolvm_testkit::volumes::FakeKubelet`), real bind mounts (the tests run as root; they say
//! `skipped: …` where this process cannot mount), and every mount a test made unmounted when it
//! ends, failed or not.
//!
//! Against a real `smolvm serve`: the boundary (a directory outside its holder, under another
//! Pod, a link out, a holder that is another SmolVM's), the `mounts` smolvm records (read back
//! from its own machine), a file of the volume seen at the stable path, BindVolumes pointing the
//! stable paths at a new holder, the binds made again before a start after they were lost, the
//! release hook, and delete. smolvm's start fails here (no guest boots), so what needs a running
//! machine (the release hook's stop, BindVolumes refused while running) runs against the TEST
//! DOUBLE of smolvm serve, whose machines "boot" at once. Over the in-memory vmm with the
//! recording double of the mounts, the same node API as the controller's tests drive it, with no
//! mount privileges. Tests assert codes and state, never smolvm's wording.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use common::assert_error;
use common::{Pki, TestAgent};
use smolvm_runtime::volumes::MountBinder;
use smolvm_testkit::node as common;
use smolvm_testkit::smolvm_double::SmolvmDouble;
use smolvm_testkit::volumes::{
    CONFIG_MAP, CSI, FakeKubelet, LOCAL_VOLUME, TOKEN, UnmountOnDrop, can_mount, mounts_json, recording_volumes,
    serve_release, volume_options,
};

/// The SmolVM's UID, and so its machine's name `svm-<uid>`.
const SMOLVM_UID: &str = "3f2a1c9e-8b7d-4e6f-9a0b-1c2d3e4f5a6b";
const MACHINE: &str = "svm-3f2a1c9e-8b7d-4e6f-9a0b-1c2d3e4f5a6b";
const NAMESPACE: &str = "team-a";
const OTHER_TOKEN: &str = "0ther0ther0ther0ther0ther0ther0ther0ther0ther0ther0ther0ther0the";

fn tempdir() -> tempfile::TempDir {
    common::tempdir("smolvm-volumes-")
}

/// A machine spec with `volumes`.
fn spec(volumes: serde_json::Value) -> serde_json::Value {
    json!({"image": "localhost:1/none:latest", "cpus": 1, "memoryMiB": 256, "storageGiB": 2,
        "overlayGiB": 1, "volumes": volumes})
}

/// The three volumes of the tests: a local PV, a ConfigMap (read-only) and a CSI volume.
fn three(holder: &str, data_pv: &str, token: Option<&str>) -> serde_json::Value {
    mounts_json(
        holder,
        NAMESPACE,
        token,
        &[
            ("data", data_pv, "/data", false),
            ("config", "config", "/etc/app", true),
            ("scratch", "pv-csi", "/scratch", false),
        ],
    )
}

/// A holder with the three volumes, a file `name` in each.
fn holder_with_files(kubelet: &FakeKubelet, uid: &str, data_pv: &str, file: &str) {
    let holder = kubelet.holder(uid, NAMESPACE, SMOLVM_UID);
    std::fs::write(holder.volume(LOCAL_VOLUME, data_pv).join(file), file).expect("data file");
    std::fs::write(holder.volume(CONFIG_MAP, "config").join(file), file).expect("config file");
    std::fs::write(holder.volume(CSI, "pv-csi").join(file), file).expect("csi file");
}

/// Where the agent's stable mount point of `volume` is.
fn stable(volumes_root: &Path, volume: &str) -> PathBuf {
    volumes_root.join(MACHINE).join(volume)
}

/// Whether `guard`'s directory has a mount at `path`.
fn mounted(guard: &UnmountOnDrop, path: &Path) -> bool {
    guard.mounts().iter().any(|p| p == path)
}

/// Every refusal at the boundary, the mounts smolvm records, BindVolumes, the binds made again
/// before a start, the release hook and delete, against a real smolvm serve.
#[tokio::test]
async fn volumes_reach_real_smolvm_through_stable_binds() {
    let test = "volumes_reach_real_smolvm_through_stable_binds";
    common::init();
    let dir = tempdir();
    if let Err(reason) = can_mount(dir.path()) {
        println!("skipped: {test}: {reason}");
        return;
    }
    let guard = UnmountOnDrop(dir.path().to_path_buf());
    let kubelet = FakeKubelet::new(dir.path().join("kubelet"));
    let options = volume_options(&kubelet, dir.path(), Arc::new(MountBinder));
    let Some(agent) = TestAgent::with_smolvm_volumes(test, dir.path(), Arc::new(Pki::new()), options).await else {
        return;
    };
    let root = std::fs::canonicalize(dir.path().join("volumes")).expect("the stable root");
    let mut c = agent.client().await;
    let path = format!("/v1/machines/{MACHINE}");

    holder_with_files(&kubelet, "holder-a", "pv-data", "hello");
    // Another Pod on the node, and one whose identity names another SmolVM.
    let other = kubelet.holder("holder-b", NAMESPACE, SMOLVM_UID);
    let elsewhere = other.volume(LOCAL_VOLUME, "pv-b");
    let impostor = kubelet.holder("holder-x", NAMESPACE, "another-smolvm-uid");
    impostor.volume(LOCAL_VOLUME, "pv-data");
    let wrong_namespace = kubelet.holder("holder-n", "team-b", SMOLVM_UID);
    wrong_namespace.volume(LOCAL_VOLUME, "pv-data");
    let a = kubelet.holder("holder-a", NAMESPACE, SMOLVM_UID);
    a.link(LOCAL_VOLUME, "pv-out", Path::new("/etc"));
    a.link(LOCAL_VOLUME, "pv-other", &elsewhere);

    let one = |holder: &str, directory: &str| {
        spec(mounts_json(
            holder,
            NAMESPACE,
            None,
            &[("data", directory, "/data", false)],
        ))
    };
    let refusals = [
        (
            "a directory with ..",
            one("holder-a", "../../holder-b/volumes"),
            403,
            "VolumePathOutsideHolder",
        ),
        ("a directory ..", one("holder-a", ".."), 403, "VolumePathOutsideHolder"),
        (
            "a link out of the pods directory",
            one("holder-a", "pv-out"),
            403,
            "VolumePathOutsideHolder",
        ),
        (
            "a link into another Pod's volume",
            one("holder-a", "pv-other"),
            403,
            "VolumePathOutsideHolder",
        ),
        (
            "a holder of another SmolVM",
            one("holder-x", "pv-data"),
            403,
            "HolderNotOwned",
        ),
        (
            "a holder in another namespace",
            one("holder-n", "pv-data"),
            403,
            "HolderNotOwned",
        ),
        (
            "a directory not mounted",
            one("holder-a", "pv-missing"),
            409,
            "VolumeNotMounted",
        ),
        (
            "a holder not on this node",
            one("holder-gone", "pv-data"),
            409,
            "VolumeNotMounted",
        ),
    ];
    for (case, body, status, code) in refusals {
        let answer = c.call("PUT", &path, Some(body)).await;
        assert_error(&answer, status, code);
        println!("{case}: {status} {code}");
        assert_eq!(c.call("GET", &path, None).await.status, 404, "{case}: no machine made");
        assert!(
            guard.mounts().is_empty(),
            "{case}: nothing left mounted: {:?}",
            guard.mounts()
        );
    }

    // A valid create: 201, and smolvm records the stable paths.
    let first = c
        .call("PUT", &path, Some(spec(three("holder-a", "pv-data", None))))
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    let sources: Vec<String> = ["data", "config", "scratch"]
        .iter()
        .map(|v| stable(&root, v).display().to_string())
        .collect();
    assert_eq!(
        first.body["volumes"],
        json!({"holderUid": "holder-a", "mounts": [
            {"name": "data", "source": sources[0], "target": "/data", "readOnly": false},
            {"name": "config", "source": sources[1], "target": "/etc/app", "readOnly": true},
            {"name": "scratch", "source": sources[2], "target": "/scratch", "readOnly": false},
        ]})
    );
    let recorded = agent.agent.vmm().get(MACHINE).await.expect("get").expect("the machine");
    let smolvm_mounts: Vec<(String, String, bool)> = recorded.raw["mounts"]
        .as_array()
        .expect("smolvm reports mounts")
        .iter()
        .map(|m| {
            (
                m["source"].as_str().unwrap_or_default().to_string(),
                m["target"].as_str().unwrap_or_default().to_string(),
                m["readonly"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        smolvm_mounts,
        vec![
            (sources[0].clone(), "/data".into(), false),
            (sources[1].clone(), "/etc/app".into(), true),
            (sources[2].clone(), "/scratch".into(), false),
        ]
    );
    // The volume's files at the stable path, a file written later too; read-only stays so.
    for volume in ["data", "config", "scratch"] {
        assert!(mounted(&guard, &stable(&root, volume)), "{volume} is bound");
        assert_eq!(
            std::fs::read_to_string(stable(&root, volume).join("hello"))
                .ok()
                .as_deref(),
            Some("hello"),
            "{volume}"
        );
    }
    std::fs::write(
        kubelet
            .root()
            .join("pods/holder-a/volumes")
            .join(LOCAL_VOLUME)
            .join("pv-data/later"),
        "later",
    )
    .expect("write");
    assert_eq!(
        std::fs::read_to_string(stable(&root, "data").join("later"))
            .ok()
            .as_deref(),
        Some("later")
    );
    let refused = std::fs::write(stable(&root, "config").join("x"), "x").expect_err("read-only");
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");

    // The same create again: 200; from another holder too (BindVolumes points it there); other
    // volumes: a conflict.
    let again = c
        .call("PUT", &path, Some(spec(three("holder-a", "pv-data", None))))
        .await;
    assert_eq!((again.status, &again.body), (200, &first.body), "{again:?}");
    holder_with_files(&kubelet, "holder-c", "pv-data-2", "new");
    let from_c = c
        .call(
            "PUT",
            &path,
            Some(spec(three("holder-c", "pv-data-2", Some(OTHER_TOKEN)))),
        )
        .await;
    assert_eq!(from_c.status, 200, "{from_c:?}");
    assert_eq!(from_c.body["volumes"]["holderUid"], "holder-a");
    let mut moved = three("holder-a", "pv-data", None);
    moved["mounts"][0]["target"] = json!("/srv");
    let conflict = c.call("PUT", &path, Some(spec(moved))).await;
    assert_error(&conflict, 409, "MachineSpecConflict");
    assert_eq!(conflict.body["details"]["fields"], json!(["volumes"]));

    // BindVolumes to holder C: the stable paths show C's files, no longer A's.
    let volumes_path = format!("{path}/volumes");
    for _ in 0..2 {
        let bound = c
            .call(
                "PUT",
                &volumes_path,
                Some(three("holder-c", "pv-data-2", Some(OTHER_TOKEN))),
            )
            .await;
        assert_eq!(bound.status, 200, "{bound:?}");
        assert_eq!(bound.body["volumes"]["holderUid"], "holder-c");
        assert_eq!(bound.body["volumes"]["mounts"], first.body["volumes"]["mounts"]);
    }
    for volume in ["data", "config", "scratch"] {
        assert!(
            stable(&root, volume).join("new").exists(),
            "{volume}: the new holder's file"
        );
        assert!(
            !stable(&root, volume).join("hello").exists(),
            "{volume}: not the old one's"
        );
    }
    assert_eq!(
        guard.mounts().len(),
        3,
        "one bind each, none stacked: {:?}",
        guard.mounts()
    );
    // Its refusals: another SmolVM's holder, other volumes.
    let refused = c
        .call("PUT", &volumes_path, Some(three("holder-x", "pv-data", None)))
        .await;
    assert_error(&refused, 403, "HolderNotOwned");
    let mut fewer = three("holder-c", "pv-data-2", None);
    fewer["mounts"].as_array_mut().expect("mounts").pop();
    assert_error(
        &c.call("PUT", &volumes_path, Some(fewer)).await,
        409,
        "MachineSpecConflict",
    );
    assert_error(
        &c.call(
            "PUT",
            "/v1/machines/svm-nope/volumes",
            Some(three("holder-c", "pv-data-2", None)),
        )
        .await,
        404,
        "MachineNotFound",
    );

    // The binds lost (as an agent restart loses its mount namespace): a start binds them again
    // before smolvm is asked (whose start then fails here, as no guest boots).
    for point in guard.mounts() {
        smolvm_runtime::volumes::Binder::unbind(&MountBinder, &point).expect("unmount");
    }
    assert!(guard.mounts().is_empty());
    let start = c.call("POST", &format!("{path}/ensure-running"), None).await;
    // No guest boots here (and the image is never pulled): smolvm's start fails, after the binds.
    assert_error(&start, 500, "StartFailed");
    common::assert_cleaned_cause(start.body["message"].as_str().unwrap_or_default());
    assert_eq!(
        guard.mounts().len(),
        3,
        "bound again before the start: {:?}",
        guard.mounts()
    );
    assert!(stable(&root, "data").join("new").exists());

    // The release hook: no token 401, another token 404, the holder's token 200 and unmounted.
    assert_eq!(agent.release(None).await.0, 401);
    let (status, body) = agent.release(Some(TOKEN)).await;
    assert_eq!((status, &body["code"]), (404, &json!("MachineNotFound")), "{body}");
    assert_eq!(guard.mounts().len(), 3, "a wrong token releases nothing");
    let (status, released) = agent.release(Some(OTHER_TOKEN)).await;
    assert_eq!(status, 200, "{released}");
    let entry = &released["released"][0];
    assert_eq!(entry["machine"], MACHINE);
    assert_eq!(entry["holderUid"], "holder-c");
    assert_eq!(entry["unmounted"], json!(["data", "config", "scratch"]));
    // smolvm was asked to stop it (after its failed start it did not run: stopped, or still
    // created where the start failed before a boot).
    assert_eq!(entry["stopped"], true);
    assert!(entry["state"] == "Stopped" || entry["state"] == "Created", "{entry}");
    assert_eq!(agent.agent.metrics().volume_release_stops(), 1);
    assert!(guard.mounts().is_empty(), "released: {:?}", guard.mounts());
    // Released: no start until BindVolumes; the volume data is untouched.
    let start = c.call("POST", &format!("{path}/ensure-running"), None).await;
    assert_error(&start, 409, "VolumeNotMounted");
    assert!(guard.mounts().is_empty());
    assert!(
        kubelet
            .root()
            .join("pods/holder-c/volumes")
            .join(LOCAL_VOLUME)
            .join("pv-data-2/new")
            .exists()
    );
    let metrics = agent.agent.metrics();
    assert_eq!(
        (metrics.volume_releases("Released"), metrics.volume_releases("NoMatch")),
        (1, 1)
    );
    let bound = c
        .call(
            "PUT",
            &volumes_path,
            Some(three("holder-c", "pv-data-2", Some(OTHER_TOKEN))),
        )
        .await;
    assert_eq!(bound.status, 200, "{bound:?}");
    assert_eq!(guard.mounts().len(), 3);

    // Delete: unmounted, the mount points gone, the volumes' files kept.
    let deleted = c.call("DELETE", &path, None).await;
    assert_eq!(
        (deleted.status, &deleted.body["deleted"]),
        (200, &json!(true)),
        "{deleted:?}"
    );
    assert!(guard.mounts().is_empty(), "{:?}", guard.mounts());
    assert!(!root.join(MACHINE).exists(), "the machine's mount points are removed");
    assert!(
        kubelet
            .root()
            .join("pods/holder-c/volumes")
            .join(LOCAL_VOLUME)
            .join("pv-data-2/new")
            .exists()
    );
    assert_eq!(agent.release(Some(OTHER_TOKEN)).await.0, 404, "nothing held any more");
    let again = c.call("DELETE", &path, None).await;
    assert_eq!((again.status, &again.body["missing"]), (200, &json!(true)));
    agent.agent.shutdown().await;
    drop(guard);
}

/// The release hook stops a running machine before anything is unmounted, and BindVolumes is
/// refused while a machine runs: against the TEST DOUBLE of smolvm serve, whose machines run.
#[tokio::test]
async fn the_release_hook_stops_a_running_machine_first() {
    let test = "the_release_hook_stops_a_running_machine_first";
    common::init();
    let dir = tempdir();
    if let Err(reason) = can_mount(dir.path()) {
        println!("skipped: {test}: {reason}");
        return;
    }
    let guard = UnmountOnDrop(dir.path().to_path_buf());
    let double = SmolvmDouble::start(dir.path().join("double.sock"))
        .await
        .expect("double");
    let kubelet = FakeKubelet::new(dir.path().join("kubelet"));
    let state = dir.path().join("agent");
    let options = volume_options(&kubelet, &state, Arc::new(MountBinder));
    let agent = TestAgent::attached_with_volumes(&state, Arc::new(Pki::new()), double.socket(), options).await;
    let root = std::fs::canonicalize(state.join("volumes")).expect("the stable root");
    let mut c = agent.client().await;
    let path = format!("/v1/machines/{MACHINE}");
    holder_with_files(&kubelet, "holder-a", "pv-data", "hello");

    let created = c
        .call("PUT", &path, Some(spec(three("holder-a", "pv-data", None))))
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let sources: Vec<(String, String, bool)> = ["data", "config", "scratch"]
        .iter()
        .zip(["/data", "/etc/app", "/scratch"])
        .zip([false, true, false])
        .map(|((v, t), ro)| (stable(&root, v).display().to_string(), t.to_string(), ro))
        .collect();
    assert_eq!(double.mounts(MACHINE), Some(sources));
    let running = c.call("POST", &format!("{path}/ensure-running"), None).await;
    assert_eq!(
        (running.status, &running.body["state"]),
        (200, &json!("Running")),
        "{running:?}"
    );

    // Running: BindVolumes is refused, naming the state.
    holder_with_files(&kubelet, "holder-b", "pv-data", "new");
    let volumes_path = format!("{path}/volumes");
    let refused = c
        .call(
            "PUT",
            &volumes_path,
            Some(three("holder-b", "pv-data", Some(OTHER_TOKEN))),
        )
        .await;
    assert_error(&refused, 409, "MachineRunning");
    assert_eq!(refused.body["details"]["state"], "Running");

    // A wrong token stops nothing.
    assert_eq!(agent.release(Some(OTHER_TOKEN)).await.0, 404);
    assert!(double.calls_of("stop_machine").is_empty());
    assert_eq!(double.state(MACHINE).as_deref(), Some("running"));
    assert_eq!(guard.mounts().len(), 3);

    // The holder's token: stopped first, then unmounted.
    double.clear_calls();
    let (status, released) = agent.release(Some(TOKEN)).await;
    assert_eq!(status, 200, "{released}");
    assert_eq!(
        released,
        json!({"released": [{"machine": MACHINE, "holderUid": "holder-a", "stopped": true,
            "state": "Stopped", "unmounted": ["data", "config", "scratch"]}]})
    );
    let stops = double.calls_of("stop_machine");
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(stops[0].machine.as_deref(), Some(MACHINE));
    assert_eq!(double.state(MACHINE).as_deref(), Some("stopped"));
    assert!(guard.mounts().is_empty(), "{:?}", guard.mounts());
    assert_eq!(agent.agent.metrics().volume_release_stops(), 1);
    // Again: stopped as it is, nothing left to unmount.
    let (status, again) = agent.release(Some(TOKEN)).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["released"][0]["state"], "Stopped");
    assert_eq!(again["released"][0]["unmounted"], json!([]));

    // No start until BindVolumes: refused, and smolvm is not asked.
    double.clear_calls();
    let start = c.call("POST", &format!("{path}/ensure-running"), None).await;
    assert_error(&start, 409, "VolumeNotMounted");
    assert!(double.calls_of("start_machine").is_empty());

    // The new holder: bound, started, its files at the stable paths.
    let bound = c
        .call(
            "PUT",
            &volumes_path,
            Some(three("holder-b", "pv-data", Some(OTHER_TOKEN))),
        )
        .await;
    assert_eq!(bound.status, 200, "{bound:?}");
    let running = c.call("POST", &format!("{path}/ensure-running"), None).await;
    assert_eq!(
        (running.status, &running.body["state"]),
        (200, &json!("Running")),
        "{running:?}"
    );
    assert!(stable(&root, "data").join("new").exists());

    // A directory the kubelet no longer has: the start is refused rather than made over an
    // empty mount point (the binds lost, as after an agent restart).
    assert_eq!(c.call("POST", &format!("{path}/stop"), None).await.status, 200);
    for point in guard.mounts() {
        smolvm_runtime::volumes::Binder::unbind(&MountBinder, &point).expect("unmount");
    }
    let gone = kubelet.root().join("pods/holder-b/volumes").join(CSI).join("pv-csi");
    std::fs::remove_dir_all(&gone).expect("remove");
    double.clear_calls();
    let start = c.call("POST", &format!("{path}/ensure-running"), None).await;
    assert_error(&start, 409, "VolumeNotMounted");
    assert_eq!(start.body["details"]["volume"], "scratch");
    assert!(double.calls_of("start_machine").is_empty());

    assert_eq!(c.call("DELETE", &path, None).await.status, 200);
    assert!(guard.mounts().is_empty());
    assert!(!root.join(MACHINE).exists());
    agent.agent.shutdown().await;
    drop(guard);
}

/// The node API's volumes over the in-memory vmm with the recording double of the mounts, as
/// the controller's tests run them (no mount privileges needed): what smolvm is given, what is
/// bound where, binds made again after they were lost, the release hook.
#[tokio::test]
async fn volumes_on_the_memory_vmm_with_recorded_binds() {
    common::init();
    let dir = tempdir();
    let kubelet = FakeKubelet::new(dir.path().join("kubelet"));
    holder_with_files(&kubelet, "holder-a", "pv-data", "hello");
    let (volumes, binder) = recording_volumes(&kubelet, dir.path());
    let vmm = Arc::new(smolvm_testkit::memory_vmm::MemoryVmm::default());
    let pki = Pki::new();
    let state = Pki::node_api_state(vmm.clone()).with_volumes(volumes);
    let server = pki.serve(state.clone());
    let release = serve_release(state);
    let mut c = common::NodeClient::connect(
        server.local_addr(),
        &smolvm_certs::runtime_server_name(common::NODE),
        pki.client_tls(),
        Some(common::TOKEN),
    )
    .await
    .expect("connect");
    let path = format!("/v1/machines/{MACHINE}");
    let root = std::fs::canonicalize(dir.path().join("volumes")).expect("the stable root");
    let holder = std::fs::canonicalize(kubelet.root().join("pods/holder-a/volumes")).expect("holder");

    let created = c
        .call("PUT", &path, Some(spec(three("holder-a", "pv-data", None))))
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let given: Vec<(PathBuf, String, bool)> = vmm
        .mounts(MACHINE)
        .expect("the machine")
        .into_iter()
        .map(|m| (m.source, m.target, m.read_only))
        .collect();
    assert_eq!(
        given,
        vec![
            (stable(&root, "data"), "/data".into(), false),
            (stable(&root, "config"), "/etc/app".into(), true),
            (stable(&root, "scratch"), "/scratch".into(), false),
        ]
    );
    let want = [
        ("data", holder.join(LOCAL_VOLUME).join("pv-data"), false),
        ("config", holder.join(CONFIG_MAP).join("config"), true),
        ("scratch", holder.join(CSI).join("pv-csi/mount"), false),
    ];
    for (volume, source, read_only) in &want {
        assert_eq!(
            binder.bound(&stable(&root, volume)),
            Some((source.clone(), *read_only)),
            "{volume}"
        );
    }
    let refused = c
        .call(
            "PUT",
            &path,
            Some(spec(mounts_json(
                "holder-a",
                NAMESPACE,
                None,
                &[("data", "..", "/data", false)],
            ))),
        )
        .await;
    assert_error(&refused, 403, "VolumePathOutsideHolder");

    // Running: the binds lost (an agent restart) are made again first.
    binder.forget_all();
    let running = c.call("POST", &format!("{path}/ensure-running"), None).await;
    assert_eq!(
        (running.status, &running.body["state"]),
        (200, &json!("Running")),
        "{running:?}"
    );
    assert_eq!(binder.count(), 3);

    let (status, released) = common::release_call(release.local_addr(), Some(TOKEN)).await;
    assert_eq!(status, 200, "{released}");
    assert_eq!(released["released"][0]["stopped"], true);
    assert_eq!(binder.count(), 0);
    let got = c.call("GET", &path, None).await;
    assert_eq!(got.body["state"], "Stopped");
    assert_eq!(got.body["volumes"]["holderUid"], "holder-a");
    assert_error(
        &c.call("POST", &format!("{path}/ensure-running"), None).await,
        409,
        "VolumeNotMounted",
    );

    assert_eq!(c.call("DELETE", &path, None).await.status, 200);
    assert_eq!(vmm.mounts(MACHINE), None);
    assert!(!root.join(MACHINE).exists());
    release.shutdown(std::time::Duration::from_secs(1)).await;
    server.shutdown(std::time::Duration::from_secs(1)).await;
}
