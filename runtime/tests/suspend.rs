//! SuspendMachine and ResumeMachine through the agent's node API over mTLS.
//!
//! Against a real `smolvm serve` (found as the other tests find it; `skipped: …` without it):
//! every refusal reachable without a running guest, with smolvm's real error mapping. Against
//! the TEST DOUBLE of smolvm serve (`smolvm_testkit::smolvm_double`), whose machines "boot" at
//! once, behind the agent's real node API and its real smolvm client: the happy path, the
//! records across an agent restart, the metrics, and the port forwards. Tests assert codes and
//! meaning, never smolvm's wording.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use common::assert_error;
use common::{NodeClient, Pki, TestAgent};
use smolvm_runtime::vmm::{MachineSpec, SmolvmClient, SmolvmConfig, Vmm, VmmError};
use smolvm_testkit::node as common;
use smolvm_testkit::smolvm_double::SmolvmDouble;

fn tempdir() -> tempfile::TempDir {
    common::tempdir("smolvm-suspend-")
}

/// A refusal naming the machine's state in `details.state`.
fn assert_refusal(answer: &common::Answer, code: &str, state: &str) {
    assert_error(answer, 409, code);
    assert_eq!(answer.body["details"]["state"], state, "{answer:?}");
}

fn spec(port: u16) -> serde_json::Value {
    json!({"image": "alpine:3", "cpus": 1, "memoryMiB": 256, "storageGiB": 2, "overlayGiB": 1,
        "network": {"enabled": true, "ports": [{"hostPort": port, "guestPort": 80}]}})
}

/// Runs smolvm's exec with `autoStart` on `machine` straight on its socket: smolvm boots it to
/// run the command, and where no guest boots that leaves it stopped (the node API never asks
/// smolvm for that boot).
async fn boot_through_exec(socket: &std::path::Path, machine: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = json!({"command": ["true"], "autoStart": true, "timeoutSecs": 5}).to_string();
    let request = format!(
        "POST /api/v1/machines/{machine}/exec HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::UnixStream::connect(socket).await.expect("smolvm socket");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    let read = tokio::time::timeout(Duration::from_secs(120), stream.read_to_string(&mut answer)).await;
    assert!(read.is_ok(), "smolvm's exec did not answer within 120 s");
    answer.lines().next().unwrap_or_default().to_string()
}

/// Every refusal of suspend and resume a real smolvm reaches without a running guest: a machine
/// that never ran and a stopped one cannot be suspended (409 `MachineNotRunning`), neither has a
/// saved state to resume (409 `NoSavedState`), a missing machine is 404; and smolvm's own
/// refusals of pause and resume map to the same meaning in the client.
#[tokio::test]
async fn refusals_against_real_smolvm() {
    common::init();
    let dir = tempdir();
    let Some(agent) = TestAgent::with_smolvm("refusals_against_real_smolvm", dir.path(), Arc::new(Pki::new())).await
    else {
        return;
    };
    let mut c = agent.client().await;
    let created = c
        .call("PUT", "/v1/machines/never-ran", Some(spec(common::free_port())))
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    for _ in 0..2 {
        let answer = c.call("POST", "/v1/machines/never-ran/suspend", None).await;
        assert_refusal(&answer, "MachineNotRunning", "Created");
        let answer = c.call("POST", "/v1/machines/never-ran/resume", None).await;
        assert_refusal(&answer, "NoSavedState", "Created");
        for verb in ["suspend", "resume"] {
            let answer = c.call("POST", &format!("/v1/machines/nope/{verb}"), None).await;
            assert_error(&answer, 404, "MachineNotFound");
        }
    }

    // smolvm's own answers to pause and resume, through the client the agent uses.
    let vmm = agent.agent.vmm();
    let pause = vmm
        .pause("never-ran")
        .await
        .expect_err("a created machine is not paused");
    assert!(matches!(pause, VmmError::NotRunning { .. }), "{pause:?}");
    let resume = vmm.resume("never-ran").await.expect_err("nothing saved");
    assert!(matches!(resume, VmmError::NotPaused { .. }), "{resume:?}");
    for error in [vmm.pause("nope").await, vmm.resume("nope").await] {
        assert!(matches!(error, Err(VmmError::NotFound { .. })), "{error:?}");
    }

    // A stopped machine: smolvm's own agent rootfs (no image), booted by smolvm's exec.
    let mut own = MachineSpec::new("was-booted", 1, 256);
    own.storage_gib = Some(2);
    own.overlay_gib = Some(1);
    vmm.create(&own).await.expect("create");
    let started = c.call("POST", "/v1/machines/was-booted/ensure-running", None).await;
    let got = c.call("GET", "/v1/machines/was-booted", None).await;
    let mut state = got.body["state"].as_str().unwrap_or_default().to_string();
    println!("a start answered {}; the machine is {state}", started.status);
    if state == "Created" {
        let head = boot_through_exec(&common::smolvm_socket(&agent.dir), "was-booted").await;
        // The node API closes a connection left idle that long.
        c = agent.client().await;
        let got = c.call("GET", "/v1/machines/was-booted", None).await;
        state = got.body["state"].as_str().unwrap_or_default().to_string();
        println!("smolvm's exec with autoStart answered {head:?}; the machine is {state}");
    }
    if state == "Running" {
        println!("guests boot here: the stopped case is left to the double");
    } else {
        let answer = c.call("POST", "/v1/machines/was-booted/suspend", None).await;
        assert_refusal(&answer, "MachineNotRunning", &state);
        let answer = c.call("POST", "/v1/machines/was-booted/resume", None).await;
        assert_refusal(&answer, "NoSavedState", &state);
        if state == "Stopped" {
            let pause = vmm
                .pause("was-booted")
                .await
                .expect_err("a stopped machine is not paused");
            assert!(matches!(pause, VmmError::NotRunning { .. }), "{pause:?}");
            let resume = vmm.resume("was-booted").await.expect_err("nothing saved");
            assert!(matches!(resume, VmmError::NotPaused { .. }), "{resume:?}");
        } else {
            println!("stopped case not reached: smolvm left the machine {state} after the failed boot");
        }
    }
    for name in ["never-ran", "was-booted"] {
        let deleted = c.call("DELETE", &format!("/v1/machines/{name}"), None).await;
        assert_eq!(deleted.status, 200, "{deleted:?}");
    }
    agent.agent.shutdown().await;
}

async fn call_twice(c: &mut NodeClient, method: &str, path: &str, body: Option<serde_json::Value>) -> common::Answer {
    let first = c.call(method, path, body.clone()).await;
    let second = c.call(method, path, body).await;
    assert_eq!(
        (first.status, &first.body),
        (second.status, &second.body),
        "{method} {path}"
    );
    first
}

/// The happy path against the double: suspend, the refusals a suspended machine gives, resume,
/// each twice with the same answer; the metrics count the durations.
#[tokio::test]
async fn suspend_and_resume_against_the_double() {
    common::init();
    let dir = tempdir();
    let (double, agent) = TestAgent::on_double(dir.path()).await;
    let mut c = agent.client().await;
    let m = "/v1/machines/vm-a";
    assert_eq!(c.call("PUT", m, Some(spec(common::free_port()))).await.status, 201);
    let running = call_twice(&mut c, "POST", &format!("{m}/ensure-running"), None).await;
    assert_eq!((running.status, running.body["state"].clone()), (200, json!("Running")));

    // A running machine without the file asked for: 404 FileNotFound naming the path, not
    // MachineNotFound (smolvm answers both with 404 NOT_FOUND).
    let missing = c.call("GET", &format!("{m}/files/etc/none"), None).await;
    assert_error(&missing, 404, "FileNotFound");
    assert_eq!(missing.body["details"]["path"], "/etc/none", "{missing:?}");

    let suspended = call_twice(&mut c, "POST", &format!("{m}/suspend"), None).await;
    assert_eq!(suspended.status, 200, "{suspended:?}");
    assert_eq!(suspended.body["state"], "Suspended");
    assert_eq!(suspended.body["runtimeState"], "stopped");
    let since = suspended.body["suspended"]["since"].as_str().unwrap_or_default();
    assert!(since.parse::<k8s_openapi::jiff::Timestamp>().is_ok(), "{suspended:?}");
    assert!(suspended.body["suspended"].get("savedStateMiB").is_none());
    assert_eq!(c.call("GET", m, None).await.body, suspended.body);
    assert!(double.is_paused("vm-a"));
    assert_eq!(
        double.calls_of("pause_machine").len(),
        1,
        "a second suspend asks nothing"
    );

    let refused = call_twice(&mut c, "POST", &format!("{m}/ensure-running"), None).await;
    assert_refusal(&refused, "AlreadySuspended", "Suspended");
    let resize = json!({"cpus": 2});
    let refused = call_twice(&mut c, "POST", &format!("{m}/resize"), Some(resize)).await;
    assert_refusal(&refused, "AlreadySuspended", "Suspended");
    let exec = json!({"command": ["true"]});
    let refused = c.call("POST", &format!("{m}/exec"), Some(exec)).await;
    assert_refusal(&refused, "MachineNotRunning", "Suspended");
    let refused = c.call("GET", &format!("{m}/files/etc/hostname"), None).await;
    assert_refusal(&refused, "MachineNotRunning", "Suspended");
    assert_eq!(
        double.calls_of("start_machine").len(),
        1,
        "a suspended machine is never started"
    );

    let resumed = call_twice(&mut c, "POST", &format!("{m}/resume"), None).await;
    assert_eq!((resumed.status, resumed.body["state"].clone()), (200, json!("Running")));
    assert!(resumed.body.get("suspended").is_none(), "{resumed:?}");
    assert_eq!(
        double.calls_of("resume_machine").len(),
        1,
        "a second resume asks nothing"
    );

    let text = agent.agent.metrics().encode();
    for line in [
        "smolvm_runtime_suspend_duration_seconds_count 1",
        "smolvm_runtime_resume_duration_seconds_count 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
    agent.agent.shutdown().await;
}

/// Stop and delete discard a suspension; a stopped machine was never suspended; the records
/// survive an agent restart, and the node reports the suspended machines.
#[tokio::test]
async fn stop_delete_and_restart_against_the_double() {
    common::init();
    let dir = tempdir();
    let (double, agent) = TestAgent::on_double(dir.path()).await;
    let state = dir.path().join("agent");
    let mut c = agent.client().await;
    for name in ["vm-stop", "vm-delete", "vm-kept"] {
        let path = format!("/v1/machines/{name}");
        assert_eq!(c.call("PUT", &path, Some(spec(common::free_port()))).await.status, 201);
        assert_eq!(
            c.call("POST", &format!("{path}/ensure-running"), None).await.status,
            200
        );
        let suspended = c.call("POST", &format!("{path}/suspend"), None).await;
        assert_eq!(suspended.body["state"], "Suspended", "{suspended:?}");
    }

    let stopped = call_twice(&mut c, "POST", "/v1/machines/vm-stop/stop", None).await;
    assert_eq!((stopped.status, stopped.body["state"].clone()), (200, json!("Stopped")));
    assert!(
        agent.agent.suspensions().read("vm-stop").is_none(),
        "the record is gone"
    );
    let refused = c.call("POST", "/v1/machines/vm-stop/resume", None).await;
    assert_refusal(&refused, "NoSavedState", "Stopped");
    let refused = c.call("POST", "/v1/machines/vm-stop/suspend", None).await;
    assert_refusal(&refused, "MachineNotRunning", "Stopped");
    let started = c.call("POST", "/v1/machines/vm-stop/ensure-running", None).await;
    assert_eq!((started.status, started.body["state"].clone()), (200, json!("Running")));

    let deleted = c.call("DELETE", "/v1/machines/vm-delete", None).await;
    assert_eq!(deleted.body, json!({"deleted": true}));
    assert!(
        agent.agent.suspensions().read("vm-delete").is_none(),
        "the record is gone"
    );
    assert_error(
        &c.call("POST", "/v1/machines/vm-delete/resume", None).await,
        404,
        "MachineNotFound",
    );

    // The supervisor's next listing reports the suspended machines and counts them.
    let status = wait_for_suspended(&agent, &["vm-kept"]).await;
    assert_eq!(status.machines, vec!["vm-kept".to_string(), "vm-stop".to_string()]);
    let text = agent.agent.metrics().encode();
    assert!(
        text.lines().any(|l| l == "smolvm_runtime_machines_suspended 1"),
        "{text}"
    );

    // A new agent on the same state directory knows what the first suspended.
    agent.agent.shutdown().await;
    let agent = TestAgent::attached(&state, Arc::new(Pki::new()), double.socket()).await;
    let mut c = agent.client().await;
    let kept = c.call("GET", "/v1/machines/vm-kept", None).await;
    assert_eq!(kept.body["state"], "Suspended", "{kept:?}");
    wait_for_suspended(&agent, &["vm-kept"]).await;
    let resumed = c.call("POST", "/v1/machines/vm-kept/resume", None).await;
    assert_eq!((resumed.status, resumed.body["state"].clone()), (200, json!("Running")));
    wait_for_suspended(&agent, &[]).await;
    agent.agent.shutdown().await;
}

async fn wait_for_suspended(agent: &TestAgent, names: &[&str]) -> smolvm_runtime::supervisor::RuntimeStatus {
    let mut status = agent.agent.supervisor().status();
    let want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let waited = tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.suspended == want))
        .await
        .map(|got| got.map(|s| s.clone()));
    match waited {
        Ok(Ok(got)) => got,
        _ => panic!(
            "the supervisor never listed {want:?} as suspended: {:?}",
            status.borrow()
        ),
    }
}

/// A suspended machine's published port is not forwarded (smolvm reports it stopped), and is
/// forwarded again once it is resumed: the forwarder's sync fed smolvm's list, as the agent's.
#[tokio::test]
async fn ports_close_while_suspended() {
    common::init();
    let dir = tempdir();
    let double = SmolvmDouble::start(dir.path().join("double.sock"))
        .await
        .expect("double");
    let vmm = SmolvmClient::new(SmolvmConfig::new(double.socket()));
    let port = common::free_port();
    let mut machine = MachineSpec::new("vm-ports", 1, 256);
    machine.ports = vec![smolvm_runtime::vmm::PortMapping {
        host_port: port,
        guest_port: 80,
        protocol: smolvm_api::Protocol::Tcp,
    }];
    vmm.create(&machine).await.expect("create");
    let metrics = Arc::new(smolvm_runtime::metrics::Metrics::default());
    let forwarder = smolvm_runtime::forward::Forwarder::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), metrics);
    vmm.start("vm-ports", None).await.expect("start");
    assert_eq!(forwarded(&forwarder, &vmm).await, vec![port]);
    vmm.pause("vm-ports").await.expect("pause");
    assert_eq!(
        forwarded(&forwarder, &vmm).await,
        Vec::<u16>::new(),
        "closed while suspended"
    );
    vmm.resume("vm-ports").await.expect("resume");
    // The port was free while the machine was suspended, and a test beside this one may have
    // held it a moment: a port that cannot be bound is tried again on the forwarder's next sync
    // (the agent syncs on every change and every few seconds), so this syncs as the agent would.
    let mut open = Vec::new();
    for _ in 0..50 {
        open = forwarded(&forwarder, &vmm).await;
        if !open.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(open, vec![port], "open again once resumed");
}

/// The host ports forwarded once the forwarder synced with smolvm's list.
async fn forwarded(forwarder: &smolvm_runtime::forward::Forwarder, vmm: &SmolvmClient) -> Vec<u16> {
    forwarder.sync(&vmm.list().await.expect("list")).await;
    forwarder.open_forwards().keys().map(|k| k.port).collect()
}
