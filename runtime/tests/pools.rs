//! Warm pools through the agent's node API over mTLS: ApplyPool, ListPools, LeaseMachine and
//! DeletePool, and the access calls (exec, logs, files) of a machine served from a pool.
//!
//! Against a real `smolvm serve` (found as the other tests find it; `skipped: …` without it):
//! what is reachable without a running guest. A pool's source does not boot here, so ApplyPool
//! answers `StartFailed` with smolvm's cause cleaned (what the pool's condition will say); a
//! lease on a pool smolvm does not have is `PoolNotFound`; deleting it is idempotent. Against
//! the TEST DOUBLE of smolvm serve (`smolvm_testkit::smolvm_double`), whose machines "boot" at
//! once, behind the agent's real node API and smolvm client: the happy path, the machine served
//! under its own name in every call, the lease's env, `NoReadySlot` while refill is held, the
//! pool made again after smolvm restarts, and the lease ended on delete; exec, logs and a file
//! copied in and out of a served machine reach its worker, and exec on it once stopped is
//! refused. Tests assert codes and meaning, never smolvm's wording.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use common::assert_error;
use common::{Pki, TestAgent};
use smolvm_testkit::node as common;

fn tempdir() -> tempfile::TempDir {
    common::tempdir("smolvm-pools-")
}

/// A pool of `slots` ready machines from a small alpine source.
fn pool(slots: u32) -> serde_json::Value {
    json!({
        "source": {"image": "alpine:3", "cpus": 1, "memoryMiB": 256, "storageGiB": 2, "overlayGiB": 1,
            "workload": {"env": [{"name": "MODE", "value": "pool"}]}},
        "slots": slots
    })
}

fn lease(pool: &str, job: &str) -> serde_json::Value {
    json!({"pool": pool, "env": [{"name": "JOB", "value": job}]})
}

/// Against the real smolvm: a source that cannot boot is `StartFailed` with a cleaned cause
/// (no colour codes, no timestamps of smolvm's log lines); the pool is recorded all the same (the
/// keeper tries again); a lease on it is `PoolNotFound`; delete is answered, and again.
#[tokio::test]
async fn refusals_against_real_smolvm() {
    common::init();
    let dir = tempdir();
    let Some(agent) =
        TestAgent::with_smolvm("pools_refusals_against_real_smolvm", dir.path(), Arc::new(Pki::new())).await
    else {
        return;
    };
    let mut c = agent.client().await;
    let listed = c.call("GET", "/v1/pools", None).await;
    assert_eq!((listed.status, listed.body.clone()), (200, json!({"pools": []})));

    let applied = c.call("PUT", "/v1/pools/pool-real", Some(pool(2))).await;
    match applied.status {
        // No guest boots on this kind of machine: the cause is smolvm's, cleaned.
        500 => {
            assert_error(&applied, 500, "StartFailed");
            let message = applied.body["message"].as_str().unwrap_or_default();
            assert!(
                !message.contains('\u{1b}'),
                "colour codes reach the caller: {message:?}"
            );
            println!(
                "ApplyPool where no guest boots: StartFailed ({} bytes of cleaned cause)",
                message.len()
            );
        }
        // A machine where guests boot makes the pool.
        200 => println!("ApplyPool: a guest booted here; the pool was made"),
        other => panic!("ApplyPool answered {other}: {applied:?}"),
    }
    assert!(
        agent.agent.pools().pools.exists("pool-real"),
        "the pool is recorded before smolvm is asked"
    );
    let refused = c
        .call("POST", "/v1/machines/svm-a/lease", Some(lease("pool-none", "1")))
        .await;
    assert_error(&refused, 404, "PoolNotFound");
    let refused = c
        .call(
            "POST",
            "/v1/machines/svm-a/lease",
            Some(json!({"pool": "p", "files": []})),
        )
        .await;
    assert_error(&refused, 400, "InvalidRequest");
    for _ in 0..2 {
        let deleted = c.call("DELETE", "/v1/pools/pool-real", None).await;
        assert_eq!(deleted.status, 200, "{deleted:?}");
    }
    assert!(!agent.agent.pools().pools.exists("pool-real"));
    agent.agent.shutdown().await;
}

/// The happy path against the double: a pool of 2, two machines served from it under their own
/// names, their env from the lease; a third gets `NoReadySlot` while refill is held; every call
/// on a served machine reaches its worker; delete ends the lease; the pool is made again after
/// smolvm restarts; DeletePool waits for its served machines.
#[tokio::test]
async fn pools_and_leases_against_the_double() {
    common::init();
    let dir = tempdir();
    let (double, agent) = TestAgent::on_double(dir.path()).await;
    let mut c = agent.client().await;

    let applied = c.call("PUT", "/v1/pools/pool-a", Some(pool(2))).await;
    assert_eq!(applied.status, 200, "{applied:?}");
    assert_eq!(
        (applied.body["slots"].clone(), applied.body["ready"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(double.calls_of("start_machine").len(), 1, "the source started once");
    let again = c.call("PUT", "/v1/pools/pool-a", Some(pool(2))).await;
    assert_eq!(again.status, 200);
    assert_eq!(
        double.calls_of("create_pool").len(),
        1,
        "applying the same pool changes nothing"
    );

    double.hold_refill(true);
    for (name, job) in [("svm-one", "1"), ("svm-two", "2")] {
        let served = c
            .call(
                "POST",
                &format!("/v1/machines/{name}/lease"),
                Some(lease("pool-a", job)),
            )
            .await;
        assert_eq!(served.status, 200, "{served:?}");
        assert_eq!(served.body["name"], name, "the machine keeps its own name");
        assert_eq!(served.body["state"], "Running");
        assert_eq!(served.body["pool"], "pool-a");
        let retried = c
            .call(
                "POST",
                &format!("/v1/machines/{name}/lease"),
                Some(lease("pool-a", job)),
            )
            .await;
        assert_eq!(retried.body, served.body, "a retry answers the same machine");
    }
    let drained = c
        .call("POST", "/v1/machines/svm-three/lease", Some(lease("pool-a", "3")))
        .await;
    assert_error(&drained, 409, "NoReadySlot");
    let leases = double.leases();
    assert_eq!(leases.len(), 2, "{leases:?}");
    let worker = leases
        .iter()
        .find(|l| l.key == "svm-one")
        .map(|l| l.machine.clone())
        .unwrap_or_default();
    let env = double.env(&worker).unwrap_or_default();
    assert!(
        env.iter().any(|e| e == "JOB=1"),
        "the lease's env reached the worker: {env:?}"
    );

    // Every call on the served machine reaches its worker, under the machine's name.
    let got = c.call("GET", "/v1/machines/svm-one", None).await;
    assert_eq!((got.status, got.body["name"].clone()), (200, json!("svm-one")));
    let stopped = c.call("POST", "/v1/machines/svm-one/stop", None).await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    assert_eq!(double.state(&worker).as_deref(), Some("stopped"));
    let started = c.call("POST", "/v1/machines/svm-one/ensure-running", None).await;
    assert_eq!((started.status, started.body["state"].clone()), (200, json!("Running")));
    let suspended = c.call("POST", "/v1/machines/svm-one/suspend", None).await;
    assert_eq!(
        (suspended.status, suspended.body["state"].clone()),
        (200, json!("Suspended"))
    );
    assert!(double.is_paused(&worker));
    let resumed = c.call("POST", "/v1/machines/svm-one/resume", None).await;
    assert_eq!(resumed.body["state"], "Running");
    // The node's report names the served machines, never their workers, and the pool's slots.
    let mut status = agent.agent.supervisor().status();
    let reported = tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| {
            s.machines.iter().any(|m| m == "svm-one") && s.pools.iter().any(|p| p.name == "pool-a" && p.leased == 2)
        }),
    )
    .await
    .map(|s| s.map(|s| s.clone()));
    let Ok(Ok(reported)) = reported else {
        panic!(
            "the supervisor never listed the served machines and the pool: {:?}",
            status.borrow()
        );
    };
    assert!(!reported.machines.contains(&worker), "{reported:?}");
    assert_eq!(reported.pools[0].ready, 0, "refill is held");
    let listed = agent.agent.vmm().list().await.expect("list");
    assert!(listed.iter().any(|m| m.name == "svm-one"), "the list names it");
    assert!(!listed.iter().any(|m| m.name == worker), "and not its worker");
    let mut other = pool(0)["source"].clone();
    other["cpus"] = json!(2);
    let conflict = c.call("PUT", "/v1/machines/svm-one", Some(other)).await;
    assert_error(&conflict, 409, "MachineSpecConflict");

    // Each lease lowered the pool's wanted slots by one, recorded and in smolvm: no slot is
    // forked that the controller did not book (it asks for the refill).
    assert_eq!(double.pool("pool-a").map(|p| p.desired), Some(0), "two leases of 2");
    assert_eq!(agent.agent.pools().pools.read("pool-a").map(|r| r.slots), Some(0));
    let refill = c.call("PUT", "/v1/pools/pool-a", Some(pool(2))).await;
    assert_eq!(
        (refill.status, refill.body["slots"].clone()),
        (200, json!(2)),
        "{refill:?}"
    );

    // smolvm restarts: its pools are gone; the keeper makes them again, the leases stay recorded.
    double.restart();
    double.hold_refill(false);
    let back = wait_for(Duration::from_secs(10), || {
        double.pool("pool-a").is_some_and(|p| p.ready == 2)
    })
    .await;
    assert!(back, "the keeper made the pool again: {:?}", double.pool("pool-a"));

    // DeletePool waits for the served machines; a served machine's delete ends its lease.
    let busy = c.call("DELETE", "/v1/pools/pool-a", None).await;
    assert_error(&busy, 409, "PoolInUse");
    assert_eq!(busy.body["details"]["leased"], 2);
    for name in ["svm-one", "svm-two"] {
        let deleted = c.call("DELETE", &format!("/v1/machines/{name}"), None).await;
        assert_eq!(
            (deleted.status, deleted.body["deleted"].clone()),
            (200, json!(true)),
            "{deleted:?}"
        );
        let gone = c.call("GET", &format!("/v1/machines/{name}"), None).await;
        assert_error(&gone, 404, "MachineNotFound");
    }
    assert!(double.state(&worker).is_none(), "the worker is gone");
    let deleted = c.call("DELETE", "/v1/pools/pool-a", None).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    assert!(double.pool("pool-a").is_none());
    assert!(double.state("pool-a").is_none(), "the source went with the pool");
    agent.agent.shutdown().await;
}

/// Exec, logs and a file copied in and out of a machine served from a pool, against the double:
/// each reaches the pool's worker its lease holds (smolvm is never asked about `svm-<uid>`), the
/// worker's own output comes back as it is (it names the worker, as a guest's would), and what
/// the node API says of the machine names it `svm-<uid>`. Once the machine is stopped, exec is
/// 409 `MachineNotRunning` naming its state, and the worker is not booted by it.
#[tokio::test]
async fn exec_logs_and_files_of_a_served_machine_reach_its_worker() {
    use base64::Engine as _;
    common::init();
    let dir = tempdir();
    let (double, agent) = TestAgent::on_double(dir.path()).await;
    let mut c = agent.client().await;
    let applied = c.call("PUT", "/v1/pools/pool-x", Some(pool(1))).await;
    assert_eq!(applied.status, 200, "{applied:?}");
    let name = "svm-0b7e5d1c-6a0f-4c1e-9d2b-5f8e7a6c4d3b";
    let served = c
        .call(
            "POST",
            &format!("/v1/machines/{name}/lease"),
            Some(lease("pool-x", "7")),
        )
        .await;
    assert_eq!(
        (served.status, served.body["name"].clone()),
        (200, json!(name)),
        "{served:?}"
    );
    let worker = double
        .leases()
        .into_iter()
        .find(|l| l.key == name)
        .map(|l| l.machine)
        .expect("a lease keyed by the machine's name");
    assert_ne!(worker, name);
    double.clear_calls();
    let machine = format!("/v1/machines/{name}");
    let reached = |operation: &str| -> Vec<(Option<String>, Option<String>)> {
        let calls = double.calls_of(operation).into_iter();
        calls.map(|c| (c.machine, c.path)).collect()
    };

    // Exec: run in the worker; its output is the worker's, byte-exact.
    let exec = c
        .call(
            "POST",
            &format!("{machine}/exec"),
            Some(json!({"command": ["echo", "hello"]})),
        )
        .await;
    assert_eq!(
        (exec.status, exec.body["exitCode"].clone()),
        (200, json!(0)),
        "{exec:?}"
    );
    let engine = base64::engine::general_purpose::STANDARD;
    let stdout = engine
        .decode(exec.body["stdoutBase64"].as_str().unwrap_or_default())
        .unwrap_or_default();
    assert_eq!(
        String::from_utf8_lossy(&stdout),
        format!("ran in {worker}: echo hello\n")
    );
    assert_eq!(reached("exec_command"), [(Some(worker.clone()), None)]);

    // Logs: the worker's console and workload logs, as plain lines.
    for (query, want) in [
        ("", format!("machine '{worker}' forked from 'pool-x'\n")),
        ("?source=workload&tail=5", format!("workload of '{worker}' started\n")),
    ] {
        let logs = c.call("GET", &format!("{machine}/logs{query}"), None).await;
        assert_eq!(logs.status, 200, "{query}: {logs:?}");
        assert_eq!(logs.content_type.as_deref(), Some("text/plain; charset=utf-8"));
        assert_eq!(String::from_utf8_lossy(&logs.raw), want, "{query}");
    }
    let logged = reached("stream_logs");
    assert_eq!(logged, [(Some(worker.clone()), None), (Some(worker.clone()), None)]);

    // A file copied in, then out: the worker holds it, with its mode, and gives it back.
    let content: Vec<u8> = (0..=255u8).collect();
    let file = "/srv/job/input.bin";
    let put = c
        .send_raw(
            "PUT",
            &format!("{machine}/files{file}?mode=0600"),
            Some(content.clone()),
        )
        .await
        .unwrap_or_else(|e| panic!("PUT: {e}"));
    assert_eq!(
        (put.status, put.body.clone()),
        (200, json!({"path": file, "bytes": 256})),
        "{put:?}"
    );
    let held = double.file(&worker, file).map(|f| (f.content, f.mode));
    assert_eq!(held, Some((content.clone(), 0o600)), "the worker holds the file");
    let got = c.call("GET", &format!("{machine}/files{file}"), None).await;
    assert_eq!(got.content_type.as_deref(), Some("application/octet-stream"));
    assert_eq!((got.status, got.raw.to_vec()), (200, content), "byte-exact");
    let at_worker = (Some(worker.clone()), Some(file.to_string()));
    for operation in ["upload_file", "download_file"] {
        assert_eq!(reached(operation), std::slice::from_ref(&at_worker), "{operation}");
    }
    // A file that is not there: 404 FileNotFound naming the path (the machine is there), and
    // the answer names the machine, not its worker.
    let missing = c.call("GET", &format!("{machine}/files/srv/none"), None).await;
    assert_error(&missing, 404, "FileNotFound");
    assert_eq!(missing.body["details"]["path"], "/srv/none", "{missing:?}");
    let message = missing.body["message"].as_str().unwrap_or_default();
    assert!(message.contains(name) && !message.contains(&worker), "{missing:?}");

    // smolvm was never asked about the served machine's own name.
    let calls = double.calls();
    assert!(!calls.is_empty());
    assert!(calls.iter().all(|c| c.machine.as_deref() != Some(name)), "{calls:?}");
    let got = c.call("GET", &machine, None).await;
    assert_eq!((got.status, got.body["name"].clone()), (200, json!(name)));

    // Stopped: exec is refused by the node API, naming the machine and its state; the worker
    // is neither asked nor booted. A copy is refused the same way.
    let stopped = c.call("POST", &format!("{machine}/stop"), None).await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    assert_eq!(double.state(&worker).as_deref(), Some("stopped"));
    let execs = double.calls_of("exec_command").len();
    let refused = c
        .call("POST", &format!("{machine}/exec"), Some(json!({"command": ["true"]})))
        .await;
    assert_error(&refused, 409, "MachineNotRunning");
    assert_eq!(refused.body["details"]["state"], "Stopped", "{refused:?}");
    let message = refused.body["message"].as_str().unwrap_or_default();
    assert!(message.contains(name) && !message.contains(&worker), "{refused:?}");
    let copy = c.call("GET", &format!("{machine}/files{file}"), None).await;
    assert_error(&copy, 409, "MachineNotRunning");
    assert_eq!(double.calls_of("exec_command").len(), execs, "smolvm is not asked");
    assert_eq!(
        double.state(&worker).as_deref(),
        Some("stopped"),
        "nor the worker booted"
    );
    // Asked all the same (as when it stops between the node API's check and the call), smolvm
    // refuses it too: the agent's client sends no autoStart, and the refusal names the machine.
    let request: smolvm_runtime::vmm::ExecRequest =
        serde_json::from_value(json!({"command": ["true"]})).expect("an exec request");
    match agent.agent.vmm().exec(name, &request).await {
        Err(smolvm_runtime::vmm::VmmError::Conflict { message }) => {
            assert!(message.contains(name) && !message.contains(&worker), "{message}");
        }
        other => panic!("exec on the stopped worker: {other:?}"),
    }
    assert_eq!(reached("exec_command").last(), Some(&(Some(worker.clone()), None)));
    assert_eq!(double.state(&worker).as_deref(), Some("stopped"));

    let deleted = c.call("DELETE", &machine, None).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    assert!(double.state(&worker).is_none(), "the worker is gone");
    agent.agent.shutdown().await;
}

/// A ready slot given back (ResizePool): smolvm deletes the ready machines beyond the new count
/// at once, and the record keeps it (the keeper makes the pool again with it); a pool the node
/// does not keep is `PoolNotFound`.
#[tokio::test]
async fn resize_pool_gives_ready_slots_back_at_once() {
    common::init();
    let dir = tempdir();
    let (double, agent) = TestAgent::on_double(dir.path()).await;
    let mut c = agent.client().await;
    let applied = c.call("PUT", "/v1/pools/pool-r", Some(pool(4))).await;
    assert_eq!(applied.status, 200, "{applied:?}");
    let resized = c
        .call("POST", "/v1/pools/pool-r/resize", Some(json!({"slots": 1})))
        .await;
    assert_eq!(
        (
            resized.status,
            resized.body["slots"].clone(),
            resized.body["ready"].clone()
        ),
        (200, json!(1), json!(1)),
        "{resized:?}"
    );
    assert_eq!(double.pool("pool-r").map(|p| (p.desired, p.ready)), Some((1, 1)));
    assert_eq!(agent.agent.pools().pools.read("pool-r").map(|r| r.slots), Some(1));
    let unknown = c
        .call("POST", "/v1/pools/pool-none/resize", Some(json!({"slots": 1})))
        .await;
    assert_error(&unknown, 404, "PoolNotFound");
    let bad = c
        .call("POST", "/v1/pools/pool-r/resize", Some(json!({"slots": -1})))
        .await;
    assert_error(&bad, 400, "InvalidRequest");
    agent.agent.shutdown().await;
}

/// A DeletePool whose source delete fails once (smolvm's pool already gone) keeps the pool's
/// record, so the node still reports it and the keeper does not make it again; asked again, the
/// source goes and so does the record. A pool whose source never started is reported all the
/// same (with no slot ready), so the controller can retire it.
#[tokio::test]
async fn a_delete_that_fails_half_way_is_finished_when_asked_again() {
    common::init();
    let dir = tempdir();
    let (double, agent) = TestAgent::on_double(dir.path()).await;
    let mut c = agent.client().await;
    let applied = c.call("PUT", "/v1/pools/pool-d", Some(pool(1))).await;
    assert_eq!(applied.status, 200, "{applied:?}");
    double.fail_next("delete_machine", "pool-d", 1);
    let failed = c.call("DELETE", "/v1/pools/pool-d", None).await;
    assert_eq!(failed.status, 500, "{failed:?}");
    assert!(double.pool("pool-d").is_none(), "smolvm's pool went first");
    assert!(double.state("pool-d").is_some(), "the source is still there");
    let record = agent.agent.pools().pools.read("pool-d").expect("the record stays");
    assert!(record.deleting, "{record:?}");
    let listed = c.call("GET", "/v1/pools", None).await;
    assert_eq!(
        listed.body["pools"],
        json!([{"name": "pool-d", "slots": 0, "ready": 0, "provisioning": 0, "leased": 0}]),
        "still reported, wanting nothing: {listed:?}"
    );
    // The keeper leaves a pool being deleted alone (it runs every 500 ms here).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(double.pool("pool-d").is_none(), "not made again by the keeper");
    let deleted = c.call("DELETE", "/v1/pools/pool-d", None).await;
    assert_eq!(
        (deleted.status, deleted.body.clone()),
        (200, json!({"deleted": true})),
        "{deleted:?}"
    );
    assert!(double.state("pool-d").is_none(), "the source is gone");
    assert!(!agent.agent.pools().pools.exists("pool-d"), "and so is the record");

    // A source that never starts: the pool is recorded and reported, and deleted on request.
    double.fail_next("start_machine", "pool-s", 100);
    let refused = c.call("PUT", "/v1/pools/pool-s", Some(pool(2))).await;
    assert_eq!(refused.status, 500, "{refused:?}");
    let listed = c.call("GET", "/v1/pools", None).await;
    assert_eq!(
        listed.body["pools"],
        json!([{"name": "pool-s", "slots": 2, "ready": 0, "provisioning": 0, "leased": 0}]),
        "{listed:?}"
    );
    let deleted = c.call("DELETE", "/v1/pools/pool-s", None).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    let listed = c.call("GET", "/v1/pools", None).await;
    assert_eq!(listed.body["pools"], json!([]), "{listed:?}");
    assert!(double.state("pool-s").is_none());
    agent.agent.shutdown().await;
}

/// The keeper makes a lost pool again under the pool's lock, from its record read again: a
/// DeletePool that holds the lock (its source delete slow) and removes the record is never
/// undone by the keeper.
#[tokio::test]
async fn the_keeper_never_brings_back_a_pool_being_deleted() {
    common::init();
    let dir = tempdir();
    let (double, agent) = TestAgent::on_double(dir.path()).await;
    let mut c = agent.client().await;
    let applied = c.call("PUT", "/v1/pools/pool-k", Some(pool(1))).await;
    assert_eq!(applied.status, 200, "{applied:?}");
    // smolvm's pool goes at once; the source's delete takes 1.5 s, three rounds of the keeper.
    double.set_delay("delete_machine", Duration::from_millis(1500));
    let deleted = c.call("DELETE", "/v1/pools/pool-k", None).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(double.pool("pool-k").is_none(), "{:?}", double.pool("pool-k"));
    assert!(double.state("pool-k").is_none(), "the source stays deleted");
    assert!(double.calls_of("create_pool").len() == 1, "made once, never again");
    agent.agent.shutdown().await;
}

async fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
}
