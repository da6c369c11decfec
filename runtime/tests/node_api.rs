//! The node API over real mTLS on 127.0.0.1, in front of a real `smolvm serve` supervised by
//! the agent. Tests that need smolvm print `skipped: <reason>` when it cannot be had.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use common::assert_error;
use common::{NODE, NodeClient, Pki, TOKEN, TestAgent, http_get};
use smolvm_testkit::node as common;

fn tempdir() -> tempfile::TempDir {
    common::tempdir("smolvm-agent-")
}

fn small_spec(image: &str) -> serde_json::Value {
    json!({"image": image, "cpus": 1, "memoryMiB": 256, "storageGiB": 2, "overlayGiB": 1})
}

/// The mTLS and token matrix, each case over a real handshake.
#[tokio::test]
async fn mtls_and_token_matrix() {
    common::init();
    let dir = tempdir();
    let pki = Arc::new(Pki::new());
    let agent = TestAgent::without_smolvm(dir.path(), pki.clone()).await;
    let addr = agent.agent.node_api_addr();
    let name = smolvm_certs::runtime_server_name(NODE);

    // No client certificate: the server refuses during the handshake (TLS 1.3 reports the
    // alert on the first read), and no HTTP answer ever arrives.
    let anonymous = Arc::new(smolvm_certs::client_config(pki.ca.cert_pem(), None, &[b"http/1.1"]).expect("config"));
    // A client certificate from another CA.
    let other_ca = smolvm_certs::CertificateAuthority::generate(
        "other-ca",
        smolvm_certs::Validity::from_now(Duration::from_secs(3600)),
    )
    .expect("ca");
    let stranger = other_ca
        .issue_client(
            "smolvm-controller",
            smolvm_certs::Validity::from_now(Duration::from_secs(3600)),
        )
        .expect("cert");
    let foreign = Arc::new(
        smolvm_certs::client_config(
            pki.ca.cert_pem(),
            Some((&stranger.cert_pem, &stranger.key_pem)),
            &[b"http/1.1"],
        )
        .expect("config"),
    );
    for (case, tls) in [
        ("no client certificate", anonymous),
        ("certificate from another CA", foreign),
    ] {
        let outcome = match NodeClient::connect(addr, &name, tls, Some(TOKEN)).await {
            Err(error) => Err(error),
            Ok(mut client) => client.send_raw("GET", "/v1/identity", None).await.map(|a| a.status),
        };
        let error = outcome.expect_err(case);
        println!("{case}: refused: {error}");
        assert!(
            error.contains("CertificateRequired") || error.contains("UnknownCA") || error.contains("alert"),
            "{case}: {error}"
        );
    }

    // The client never skips verification: a different server name fails on the client.
    let wrong_name = NodeClient::connect(addr, "other.runtime.vm.smolvm.dev", pki.client_tls(), Some(TOKEN)).await;
    assert!(
        wrong_name.is_err(),
        "server certificate for another node must be refused"
    );

    // Right certificate, wrong or missing token: 401 with a JSON body.
    for token in [Some("wrong-token"), None, Some("")] {
        let mut client = NodeClient::connect(addr, &name, pki.client_tls(), token)
            .await
            .expect("connect");
        for path in ["/v1/identity", "/v1/machines/m1", "/v1/nope"] {
            let answer = client.call("GET", path, None).await;
            assert_error(&answer, 401, "Unauthenticated");
        }
    }

    // Both right: 200.
    let mut client = agent.client().await;
    for _ in 0..2 {
        let answer = client.call("GET", "/v1/identity", None).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.body["nodeName"], NODE);
        assert_eq!(answer.body["protocolVersion"], "v1");
    }
    // smolvm is absent here: health is 503 RuntimeUnavailable, with JSON.
    let answer = client.call("GET", "/v1/health", None).await;
    assert_error(&answer, 503, "RuntimeUnavailable");
    let answer = client.call("GET", "/v1/machines/m1", None).await;
    assert_error(&answer, 503, "RuntimeUnavailable");
    agent.agent.shutdown().await;
}

/// Malformed requests get 400 (or 404/405/413) with a JSON body, never plain text.
#[tokio::test]
async fn malformed_requests_get_json_errors() {
    common::init();
    let dir = tempdir();
    let agent = TestAgent::without_smolvm(dir.path(), Arc::new(Pki::new())).await;
    let mut client = agent.client().await;
    let big = vec![b' '; 70 * 1024];
    let long_name = format!("/v1/machines/{}", "a".repeat(64));
    type Case<'a> = (&'a str, &'a str, Option<Vec<u8>>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "PUT",
            "/v1/machines/m1",
            Some(b"not json".to_vec()),
            400,
            "InvalidRequest",
        ),
        ("PUT", "/v1/machines/m1", Some(b"".to_vec()), 400, "InvalidRequest"),
        ("PUT", "/v1/machines/m1", None, 400, "InvalidRequest"),
        (
            "PUT",
            "/v1/machines/m1",
            Some(br#"{"image":"a"}"#.to_vec()),
            400,
            "InvalidRequest",
        ),
        (
            "PUT",
            "/v1/machines/m1",
            Some(br#"{"image":"a","cpus":1,"memoryMiB":256,"storageGiB":1,"overlayGiB":1,"bogus":1}"#.to_vec()),
            400,
            "InvalidRequest",
        ),
        (
            "PUT",
            "/v1/machines/m1",
            Some(br#"{"image":"a","cpus":-1,"memoryMiB":256,"storageGiB":1,"overlayGiB":1}"#.to_vec()),
            400,
            "InvalidRequest",
        ),
        (
            "PUT",
            "/v1/machines/Bad_Name",
            Some(serde_json::to_vec(&small_spec("a")).expect("json")),
            400,
            "InvalidRequest",
        ),
        ("GET", long_name.as_str(), None, 400, "InvalidRequest"),
        ("GET", "/v1/machines/-x", None, 400, "InvalidRequest"),
        // Not UTF-8 once percent-decoded: axum's own rejection would be plain text.
        ("GET", "/v1/machines/%FF", None, 400, "InvalidRequest"),
        ("POST", "/v1/machines/%C3%28/stop", None, 400, "InvalidRequest"),
        ("DELETE", "/v1/machines/a%2Fb", None, 400, "InvalidRequest"),
        (
            "POST",
            "/v1/machines/m1/resize",
            Some(b"[1,2]".to_vec()),
            400,
            "InvalidRequest",
        ),
        (
            "POST",
            "/v1/machines/m1/resize",
            Some(br#"{"cpus":"two"}"#.to_vec()),
            400,
            "InvalidRequest",
        ),
        ("PUT", "/v1/machines/m1", Some(big), 413, "PayloadTooLarge"),
        ("GET", "/v1/nothing", None, 404, "RouteNotFound"),
        ("GET", "/", None, 404, "RouteNotFound"),
        ("PATCH", "/v1/machines/m1", None, 405, "MethodNotAllowed"),
        ("GET", "/v1/machines/m1/stop", None, 405, "MethodNotAllowed"),
    ];
    for (method, path, body, status, code) in cases {
        for _ in 0..2 {
            let answer = client.send_raw(method, path, body.clone()).await.expect("answer");
            assert_eq!(answer.status, status, "{method} {path}: {answer:?}");
            assert_error(&answer, status, code);
        }
    }
    agent.agent.shutdown().await;
}

/// The token file is re-read on change: the old token stops working, the new one works.
#[tokio::test]
async fn token_file_is_reloaded() {
    common::init();
    let dir = tempdir();
    let pki = Arc::new(Pki::new());
    let agent = TestAgent::without_smolvm(dir.path(), pki.clone()).await;
    let mut old = agent.client().await;
    assert_eq!(old.call("GET", "/v1/identity", None).await.status, 200);
    std::fs::write(&agent.token_file, "rotated-token-xyz\n").expect("rotate");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = old.call("GET", "/v1/identity", None).await;
        if answer.status == 401 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "token never reloaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let name = smolvm_certs::runtime_server_name(NODE);
    let mut new = NodeClient::connect(
        agent.agent.node_api_addr(),
        &name,
        pki.client_tls(),
        Some("rotated-token-xyz"),
    )
    .await
    .expect("connect");
    assert_eq!(new.call("GET", "/v1/identity", None).await.status, 200);
    agent.agent.shutdown().await;
}

/// A renewed serving certificate is used by new connections without a restart; a new
/// client CA is trusted after reload.
#[tokio::test]
async fn serving_certificate_and_client_ca_swap_without_restart() {
    common::init();
    let dir = tempdir();
    let pki = Arc::new(Pki::new());
    let agent = TestAgent::without_smolvm(dir.path(), pki.clone()).await;
    let (cert, key) = Pki::serving_pair(&pki.ca, NODE);
    let before = agent.agent.node_api().resolver().current_cert_info();
    agent.agent.node_api().resolver().swap_pem(&cert, &key).expect("swap");
    let after = agent.agent.node_api().resolver().current_cert_info();
    assert_ne!(before, after);
    let mut client = agent.client().await;
    assert_eq!(client.call("GET", "/v1/identity", None).await.status, 200);

    // Trust a new CA: clients of the old CA are refused, clients of the new one accepted.
    let new_pki = Pki::new();
    agent
        .agent
        .node_api()
        .reload_client_ca(new_pki.ca.cert_pem())
        .expect("reload CA");
    let name = smolvm_certs::runtime_server_name(NODE);
    let old = match NodeClient::connect(agent.agent.node_api_addr(), &name, pki.client_tls(), Some(TOKEN)).await {
        Err(e) => Err(e),
        Ok(mut c) => c.send_raw("GET", "/v1/identity", None).await.map(|a| a.status),
    };
    assert!(old.is_err(), "old CA must be refused: {old:?}");
    let tls = Arc::new(
        smolvm_certs::client_config(
            pki.ca.cert_pem(),
            Some((&new_pki.client_cert, &new_pki.client_key)),
            &[b"http/1.1"],
        )
        .expect("config"),
    );
    let mut fresh = NodeClient::connect(agent.agent.node_api_addr(), &name, tls, Some(TOKEN))
        .await
        .expect("connect");
    assert_eq!(fresh.call("GET", "/v1/identity", None).await.status, 200);
    agent.agent.shutdown().await;
}

/// Every operation against a real smolvm through the node API, each twice.
#[tokio::test]
async fn every_operation_against_real_smolvm_twice() {
    common::init();
    let dir = tempdir();
    let Some(agent) = TestAgent::with_smolvm(
        "every_operation_against_real_smolvm_twice",
        dir.path(),
        Arc::new(Pki::new()),
    )
    .await
    else {
        return;
    };
    let mut c = agent.client().await;

    for _ in 0..2 {
        let health = c.call("GET", "/v1/health", None).await;
        assert_eq!(health.status, 200, "{health:?}");
        assert_eq!(health.body["runtimeVersion"], "1.32.2");
        assert_eq!(health.body["protocolVersion"], "v1");
        let identity = c.call("GET", "/v1/identity", None).await;
        assert_eq!(identity.body["runtimeVersion"], "1.32.2");
    }

    // Create: 201, then 200 with the same machine (idempotent).
    let name = "vm-3f2a1c9e-8b7d-4e6f-9a0b-1c2d3e4f5a6b";
    let port = common::free_port();
    let mut spec = small_spec("localhost:1/none:latest");
    spec["network"] =
        json!({"enabled": true, "ports": [{"hostPort": port, "guestPort": 80}], "allowedCIDRs": ["10.0.0.0/8"]});
    let path = format!("/v1/machines/{name}");
    let first = c.call("PUT", &path, Some(spec.clone())).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.body["state"], "Created");
    assert_eq!(first.body["runtimeState"], "created");
    assert_eq!(first.body["network"]["ports"][0]["protocol"], "TCP");
    assert_eq!(first.body["network"]["allowedCIDRs"][0], "10.0.0.0/8");
    let second = c.call("PUT", &path, Some(spec.clone())).await;
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.body, first.body);

    // A conflicting spec: 409 naming the fields.
    let mut other = spec.clone();
    other["cpus"] = json!(2);
    other["image"] = json!("alpine:3");
    for _ in 0..2 {
        let answer = c.call("PUT", &path, Some(other.clone())).await;
        assert_error(&answer, 409, "MachineSpecConflict");
        assert_eq!(answer.body["details"]["fields"], json!(["image", "cpus"]));
    }

    for _ in 0..2 {
        let got = c.call("GET", &path, None).await;
        assert_eq!(got.status, 200);
        assert_eq!(got.body["name"], name);
        let missing = c.call("GET", "/v1/machines/no-such-machine", None).await;
        assert_error(&missing, 404, "MachineNotFound");
        assert_eq!(missing.body["message"], "machine 'no-such-machine' not found");
    }

    // Stop: idempotent.
    for _ in 0..2 {
        let stopped = c.call("POST", &format!("{path}/stop"), None).await;
        assert_eq!(stopped.status, 200, "{stopped:?}");
        assert_eq!(stopped.body["state"], "Created");
        assert_error(
            &c.call("POST", "/v1/machines/nope/stop", None).await,
            404,
            "MachineNotFound",
        );
    }

    // Resize: disks grow (repeat is a no-op 200); CPU on a stopped machine is 409
    // ResizeRequiresRunning; shrinking is 400 with smolvm's message.
    for _ in 0..2 {
        let grown = c
            .call(
                "POST",
                &format!("{path}/resize"),
                Some(json!({"storageGiB": 3, "overlayGiB": 2})),
            )
            .await;
        assert_eq!(grown.status, 200, "{grown:?}");
        assert_eq!(
            (grown.body["storageGiB"].as_u64(), grown.body["overlayGiB"].as_u64()),
            (Some(3), Some(2))
        );
        let live = c
            .call(
                "POST",
                &format!("{path}/resize"),
                Some(json!({"cpus": 2, "memoryMiB": 512})),
            )
            .await;
        assert_error(&live, 409, "ResizeRequiresRunning");
        assert_eq!(live.body["details"]["pending"], json!(["cpus", "memoryMiB"]));
        let shrink = c
            .call("POST", &format!("{path}/resize"), Some(json!({"storageGiB": 2})))
            .await;
        assert_error(&shrink, 400, "InvalidRequest");
        assert_eq!(
            shrink.body["message"],
            "storageGb cannot be smaller than current size (3 GiB)"
        );
        let noop = c.call("POST", &format!("{path}/resize"), Some(json!({}))).await;
        assert_eq!(noop.status, 200);
        assert_error(
            &c.call("POST", "/v1/machines/nope/resize", Some(json!({"cpus": 1})))
                .await,
            404,
            "MachineNotFound",
        );
    }

    // Ensure running: the image pull fails at once (nothing on localhost:1): 500 StartFailed
    // carrying smolvm's own message.
    for _ in 0..2 {
        let answer = c.call("POST", &format!("{path}/ensure-running"), None).await;
        assert_error(&answer, 500, "StartFailed");
        let message = answer.body["message"].as_str().unwrap_or_default();
        assert!(message.contains("localhost:1/v2/none/manifests/latest"), "{message}");
        println!("StartFailed carried smolvm's message: {message}");
        assert_error(
            &c.call("POST", "/v1/machines/nope/ensure-running", None).await,
            404,
            "MachineNotFound",
        );
    }

    // Delete: deleted, then missing.
    let deleted = c.call("DELETE", &path, None).await;
    assert_eq!((deleted.status, deleted.body.clone()), (200, json!({"deleted": true})));
    let again = c.call("DELETE", &path, None).await;
    assert_eq!((again.status, again.body.clone()), (200, json!({"missing": true})));
    assert_error(&c.call("GET", &path, None).await, 404, "MachineNotFound");

    // Local rootfs directory images compare by path: a repeated PUT is 200.
    let rootfs = agent.dir.join("images/tiny");
    std::fs::create_dir_all(rootfs.join("etc")).expect("mkdir");
    std::fs::write(rootfs.join("etc/hostname"), "tiny\n").expect("write");
    let local = small_spec("local:tiny");
    assert_eq!(
        c.call("PUT", "/v1/machines/local1", Some(local.clone())).await.status,
        201
    );
    assert_eq!(c.call("PUT", "/v1/machines/local1", Some(local)).await.status, 200);
    let bad = c
        .call("PUT", "/v1/machines/local2", Some(small_spec("local:missing")))
        .await;
    assert_error(&bad, 400, "InvalidRequest");
    assert_eq!(
        c.call("DELETE", "/v1/machines/local1", None).await.body,
        json!({"deleted": true})
    );

    // Metrics counted by operation and code.
    let ops = agent.agent.ops_addr().expect("ops");
    let (status, text) = http_get(ops, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "smolvm_runtime_node_api_requests_total{operation=\"CreateMachine\",code=\"MachineSpecConflict\"} 2",
        "smolvm_runtime_node_api_requests_total{operation=\"EnsureMachineRunning\",code=\"StartFailed\"} 2",
        "smolvm_runtime_smolvm_ready 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
    }
    assert_eq!(http_get(ops, "/readyz").await.0, 200);
    assert_eq!(http_get(ops, "/healthz").await.0, 200);
    agent.agent.shutdown().await;
}

/// Boot probe through the node API: where guests boot, the running lifecycle; where they
/// cannot (nested KVM), the 500 StartFailed carrying smolvm's message (about 30 s per start).
#[tokio::test]
async fn ensure_running_boot_probe() {
    common::init();
    let dir = tempdir();
    let Some(agent) = TestAgent::with_smolvm("ensure_running_boot_probe", dir.path(), Arc::new(Pki::new())).await
    else {
        return;
    };
    // A machine on smolvm's own agent rootfs (no image) is the plainest boot there is; the node
    // API always asks for an image, so this one is created on smolvm directly.
    let mut spec = smolvm_runtime::vmm::MachineSpec::new("boot1", 1, 256);
    spec.storage_gib = Some(2);
    spec.overlay_gib = Some(1);
    agent.agent.vmm().create(&spec).await.expect("create");
    let mut c = agent.client().await;
    let first = c.call("POST", "/v1/machines/boot1/ensure-running", None).await;
    if first.status == 200 {
        println!("guests boot here: running the happy path");
        assert_eq!(first.body["state"], "Running");
        let again = c.call("POST", "/v1/machines/boot1/ensure-running", None).await;
        assert_eq!((again.status, again.body["state"].clone()), (200, json!("Running")));
        // Live resize of a running machine, twice (the second is a no-op with the same answer).
        for _ in 0..2 {
            let live = c
                .call(
                    "POST",
                    "/v1/machines/boot1/resize",
                    Some(json!({"cpus": 2, "memoryMiB": 512})),
                )
                .await;
            assert_eq!(live.status, 200, "{live:?}");
            assert_eq!(
                (live.body["cpus"].as_u64(), live.body["memoryMiB"].as_u64()),
                (Some(2), Some(512)),
                "{live:?}"
            );
        }
        for _ in 0..2 {
            let stopped = c.call("POST", "/v1/machines/boot1/stop", None).await;
            assert_eq!((stopped.status, stopped.body["state"].clone()), (200, json!("Stopped")));
        }
    } else {
        assert_error(&first, 500, "StartFailed");
        // The code and a cleaned cause, never smolvm's wording: it fails fast here and times out
        // after 30 s elsewhere, and its text differs between the two.
        let message = first.body["message"].as_str().unwrap_or_default().to_string();
        common::assert_cleaned_cause(&message);
        let second = c.call("POST", "/v1/machines/boot1/ensure-running", None).await;
        assert_error(&second, 500, "StartFailed");
        common::assert_cleaned_cause(second.body["message"].as_str().unwrap_or_default());
        println!("happy start path skipped: guests cannot boot on this machine; smolvm said: {message}");
    }
    assert_eq!(
        c.call("DELETE", "/v1/machines/boot1", None).await.body,
        json!({"deleted": true})
    );
    agent.agent.shutdown().await;
}

/// Kill `smolvm serve`: the agent restarts it and the machines are still there; restart the
/// agent on the same state: the same machines.
#[tokio::test]
async fn smolvm_restart_and_agent_restart_keep_machines() {
    common::init();
    let dir = tempdir();
    let pki = Arc::new(Pki::new());
    let test = "smolvm_restart_and_agent_restart_keep_machines";
    let Some(agent) = TestAgent::with_smolvm(test, dir.path(), pki.clone()).await else {
        return;
    };
    let mut c = agent.client().await;
    for name in ["keep-1", "keep-2"] {
        let created = c
            .call(
                "PUT",
                &format!("/v1/machines/{name}"),
                Some(small_spec("localhost:1/none:latest")),
            )
            .await;
        assert_eq!(created.status, 201, "{created:?}");
    }
    let status = agent.agent.supervisor().status().borrow().clone();
    let pid = status.pid.expect("child pid");
    assert_eq!(status.generation, 1);
    // SAFETY: SIGKILL to the smolvm serve child this test's agent started.
    let killed = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert_eq!(killed, 0);
    let restarted = agent
        .agent
        .supervisor()
        .wait_ready(2, Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("smolvm serve was not restarted; log:\n{}", agent.log()));
    assert_ne!(restarted.pid, Some(pid));
    assert_eq!(restarted.restarts, 1);
    assert_eq!(restarted.machines, vec!["keep-1".to_string(), "keep-2".to_string()]);
    assert_eq!(agent.agent.metrics().smolvm_restarts(), 1);
    let mut c = agent.client().await;
    for name in ["keep-1", "keep-2"] {
        assert_eq!(c.call("GET", &format!("/v1/machines/{name}"), None).await.status, 200);
    }
    agent.agent.shutdown().await;
    // The child is gone after shutdown.
    let alive = unsafe { libc::kill(restarted.pid.expect("pid") as i32, 0) };
    assert_ne!(alive, 0, "smolvm serve still running after agent shutdown");

    let Some(agent) = TestAgent::with_smolvm(test, dir.path(), pki).await else {
        return;
    };
    let status = agent.agent.supervisor().status().borrow().clone();
    assert_eq!(status.machines, vec!["keep-1".to_string(), "keep-2".to_string()]);
    let mut c = agent.client().await;
    for name in ["keep-1", "keep-2"] {
        let got = c.call("GET", &format!("/v1/machines/{name}"), None).await;
        assert_eq!(got.status, 200, "{got:?}");
        assert_eq!(
            c.call("DELETE", &format!("/v1/machines/{name}"), None).await.body,
            json!({"deleted": true})
        );
    }
    agent.agent.shutdown().await;
}

/// A `smolvm serve` left running on the socket (its agent was SIGKILLed, so nothing stopped it)
/// is supervised by the next agent, not doubled by a second server on the same state.
#[tokio::test]
async fn a_server_left_running_is_supervised_not_doubled() {
    use smolvm_runtime::vmm::Vmm;
    common::init();
    let dir = tempdir();
    let test = "a_server_left_running_is_supervised_not_doubled";
    let Some(spawn) = common::smolvm_spawn_config(test, dir.path()) else {
        return;
    };
    let socket = common::smolvm_socket(dir.path());
    let mut left = smolvm_runtime::supervisor::spawn_child(&spawn, &socket).expect("start smolvm serve");
    let probe = smolvm_runtime::vmm::SmolvmClient::new(smolvm_runtime::vmm::SmolvmConfig::new(&socket));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while probe.health().await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the left-over server never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let agent = common::TestAgent::with_spawn(test, dir.path(), Arc::new(Pki::new()), spawn).await;
    let status = agent.agent.supervisor().status().borrow().clone();
    assert_eq!(status.pid, None, "the agent started a second server: {status:?}");
    assert!(matches!(left.try_wait(), Ok(None)), "the left-over server was stopped");
    let mut c = agent.client().await;
    let created = c
        .call(
            "PUT",
            "/v1/machines/adopted-1",
            Some(small_spec("localhost:1/none:latest")),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(
        probe
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|m| m.name)
            .collect::<Vec<_>>(),
        vec!["adopted-1".to_string()],
        "the machine is on the server that was left running"
    );
    agent.agent.shutdown().await;
    smolvm_runtime::supervisor::terminate(&mut left, Duration::from_secs(5)).await;
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                stack.push(entry.path());
            }
        } else if meta.is_file()
            && let Ok(bytes) = std::fs::read(&path)
            && memchr::memmem::find(&bytes, needle).is_some()
        {
            found.push(path);
        }
    }
    found
}

/// smolvm's own record of machine `name`: the JSON object it keeps in its database under the
/// state directory (found by scanning the files, so no SQLite reader is needed).
fn smolvm_record(state: &std::path::Path, name: &str) -> Option<serde_json::Value> {
    let needle = format!("{{\"name\":\"{name}\"");
    for file in files_containing(state, needle.as_bytes()) {
        let bytes = std::fs::read(&file).ok()?;
        let mut at = 0;
        while let Some(offset) = memchr::memmem::find(&bytes[at..], needle.as_bytes()) {
            let start = at + offset;
            let mut stream = serde_json::Deserializer::from_slice(&bytes[start..]).into_iter::<serde_json::Value>();
            if let Some(Ok(record)) = stream.next()
                && record.get("entrypoint").is_some()
            {
                return Some(record);
            }
            at = start + 1;
        }
    }
    None
}

/// The workload reaches smolvm's machine record (entrypoint, cmd, workdir, env, restart, stop
/// timeout, egress hosts); a repeated create is idempotent and a different workload is a 409
/// naming the fields; a start's registry credential is never written under the state directory
/// or to the agent's log.
#[tokio::test]
async fn workload_reaches_smolvm_and_the_registry_credential_never_touches_disk() {
    common::init();
    let dir = tempdir();
    let Some(agent) = TestAgent::with_smolvm(
        "workload_reaches_smolvm_and_the_registry_credential_never_touches_disk",
        dir.path(),
        Arc::new(Pki::new()),
    )
    .await
    else {
        return;
    };
    let mut c = agent.client().await;
    let name = "svm-0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
    let path = format!("/v1/machines/{name}");
    let mut spec = small_spec("localhost:1/private/app:1");
    spec["network"] = json!({"enabled": true, "allowedHosts": ["api.example.com", "*.example.org"]});
    spec["workload"] = json!({
        "command": ["/bin/app"],
        "args": ["--port", "8080"],
        "workingDir": "/srv",
        "env": [{"name": "MODE", "value": "production"}, {"name": "DB_PASSWORD", "value": "env-value-7Qx"}],
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": 25,
    });
    let t = std::time::Instant::now();
    let created = c.call("PUT", &path, Some(spec.clone())).await;
    println!("create answered in {:?}", t.elapsed());
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(
        created.body["network"]["allowedHosts"],
        json!(["api.example.com", "*.example.org"])
    );
    // The node API's answer carries no env value.
    assert!(!created.body.to_string().contains("env-value-7Qx"), "{created:?}");

    let state = dir.path().join("state");
    let record = smolvm_record(&state, name).expect("smolvm's machine record under its state directory");
    assert_eq!(record["entrypoint"], json!(["/bin/app"]), "{record}");
    assert_eq!(record["cmd"], json!(["--port", "8080"]), "{record}");
    assert_eq!(record["workdir"], "/srv", "{record}");
    let env = record["env"].to_string();
    for part in ["MODE", "production", "DB_PASSWORD", "env-value-7Qx"] {
        assert!(env.contains(part), "env {part} in smolvm's record: {record}");
    }
    assert_eq!(record["restart"]["policy"], "on-failure", "{record}");
    assert_eq!(record["stop_timeout_secs"], 25, "{record}");
    assert!(record.to_string().contains("api.example.com"), "{record}");

    // Idempotent create: the same workload is the same machine; another is a conflict.
    // (Its state may have moved on: smolvm's restart supervision may have tried to run it.)
    let again = c.call("PUT", &path, Some(spec.clone())).await;
    let without_state = |body: &serde_json::Value| {
        let mut body = body.clone();
        if let Some(map) = body.as_object_mut() {
            map.remove("state");
            map.remove("runtimeState");
        }
        body
    };
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(without_state(&again.body), without_state(&created.body), "{again:?}");
    let mut other = spec.clone();
    other["workload"]["command"] = json!(["/bin/other"]);
    other["workload"]["env"][1]["value"] = json!("env-value-changed");
    let conflict = c.call("PUT", &path, Some(other)).await;
    assert_error(&conflict, 409, "MachineSpecConflict");
    assert_eq!(
        conflict.body["details"]["fields"],
        json!(["workload.command", "workload.env"]),
        "{conflict:?}"
    );
    assert!(!conflict.body.to_string().contains("env-value"), "{conflict:?}");

    // A start with registry credentials: whatever the start's outcome here (the registry does not
    // exist; guests may not boot), the credential went to smolvm in that request only.
    let password = "registry-pa55-Zr8w";
    let t = std::time::Instant::now();
    let start = c
        .call(
            "POST",
            &format!("{path}/ensure-running"),
            Some(json!({"registryAuth": {"username": "robot", "password": password}})),
        )
        .await;
    println!("start answered {} in {:?}", start.status, t.elapsed());
    assert!(
        matches!(start.status, 200 | 500 | 502),
        "a start is answered: {start:?}"
    );
    assert!(!start.body.to_string().contains(password), "{start:?}");
    let leaked = files_containing(dir.path(), password.as_bytes());
    assert!(leaked.is_empty(), "the registry credential was written to {leaked:?}");
    assert!(!agent.log().contains(password), "the agent logged the credential");
    // A malformed start body is refused, naming the field, never echoing it.
    let bad = c
        .call(
            "POST",
            &format!("{path}/ensure-running"),
            Some(json!({"registryAuth": {"username": "robot", "pasword": password}})),
        )
        .await;
    assert_error(&bad, 400, "InvalidRequest");
    assert!(!bad.body.to_string().contains(password), "{bad:?}");

    assert_eq!(c.call("DELETE", &path, None).await.body, json!({"deleted": true}));
    // The workload's record goes with the machine.
    assert!(files_containing(&state.join("operator"), b"workload.command").is_empty());
    agent.agent.shutdown().await;
}

/// A published host port that is taken on the node is refused before smolvm is asked: 409
/// HostPortInUse naming the port and protocol, and smolvm never gets the machine. Freed, the
/// same create goes through.
#[tokio::test]
async fn a_taken_host_port_is_refused_before_smolvm_is_asked() {
    common::init();
    let dir = tempdir();
    let Some(agent) = TestAgent::with_smolvm(
        "a_taken_host_port_is_refused_before_smolvm_is_asked",
        dir.path(),
        Arc::new(Pki::new()),
    )
    .await
    else {
        return;
    };
    let mut c = agent.client().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let name = "svm-7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d";
    let path = format!("/v1/machines/{name}");
    let mut spec = small_spec("localhost:1/app:1");
    spec["network"] = json!({"enabled": true, "ports": [{"hostPort": port, "guestPort": 80, "protocol": "TCP"}]});

    let refused = c.call("PUT", &path, Some(spec.clone())).await;
    assert_error(&refused, 409, "HostPortInUse");
    assert_eq!(
        refused.body["details"],
        json!({"hostPort": port, "protocol": "TCP"}),
        "{refused:?}"
    );
    assert!(
        refused.body["message"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("{port}/TCP")),
        "{refused:?}"
    );
    assert!(
        agent.agent.vmm().get(name).await.expect("smolvm answers").is_none(),
        "smolvm never got it"
    );

    drop(taken);
    let created = c.call("PUT", &path, Some(spec)).await;
    assert_eq!(created.status, 201, "{created:?}");
    let deleted = c.call("DELETE", &path, None).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    agent.agent.shutdown().await;
}

/// Logs, exec and files against real smolvm. A machine never started has an empty log (200; with
/// `follow` too, and the stream ends); exec on it is 409 `MachineNotRunning` naming its state,
/// and smolvm is never asked (it would boot the machine: its state stays `created`). After a
/// start, the log reads whatever smolvm kept and ends; where guests boot, exec runs and answers
/// the exit code and the output byte-exact. Unknown machines are 404, bad queries 400.
#[tokio::test]
async fn logs_exec_and_files_against_real_smolvm() {
    common::init();
    let dir = tempdir();
    let Some(agent) = TestAgent::with_smolvm(
        "logs_exec_and_files_against_real_smolvm",
        dir.path(),
        Arc::new(Pki::new()),
    )
    .await
    else {
        return;
    };
    let mut c = agent.client().await;
    let name = "logs-1";
    let created = c
        .call(
            "PUT",
            &format!("/v1/machines/{name}"),
            Some(small_spec("localhost:1/none:latest")),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");

    // Never started: an empty log, followed or not, that ends.
    for query in [
        "",
        "?follow=true",
        "?source=workload&tail=10",
        "?source=console&follow=true&tail=5",
    ] {
        let path = format!("/v1/machines/{name}/logs{query}");
        let answer = tokio::time::timeout(Duration::from_secs(30), c.call("GET", &path, None))
            .await
            .unwrap_or_else(|_| panic!("GET {path} hung"));
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
        assert_eq!(
            answer.content_type.as_deref(),
            Some("text/plain; charset=utf-8"),
            "{path}"
        );
        assert!(answer.raw.is_empty(), "{path}: a machine never started has no log yet");
    }

    // exec needs a running machine; smolvm is not asked (it would boot this one).
    let exec = json!({"command": ["echo", "hi"]});
    let answer = c
        .call("POST", &format!("/v1/machines/{name}/exec"), Some(exec.clone()))
        .await;
    assert_error(&answer, 409, "MachineNotRunning");
    assert_eq!(answer.body["details"]["state"], "Created", "{answer:?}");
    // Interactive exec too: refused before the upgrade, smolvm never asked.
    let interactive = format!("/v1/machines/{name}/exec?command=sh&stdin=true&tty=true");
    let (status, body) = agent.exec_session(&interactive).await.expect_err("refused");
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("MachineNotRunning")),
        "{body}"
    );
    assert_eq!(body["details"]["state"], "Created", "{body}");
    let machine = c.call("GET", &format!("/v1/machines/{name}"), None).await;
    assert_eq!(
        machine.body["runtimeState"], "created",
        "exec must not boot the machine"
    );

    // Bad requests, answered before any machine is asked.
    for (path, body) in [
        (format!("/v1/machines/{name}/exec"), json!({"command": []})),
        (
            format!("/v1/machines/{name}/exec"),
            json!({"command": ["true"], "timeoutSeconds": 0}),
        ),
        (
            format!("/v1/machines/{name}/exec"),
            json!({"command": ["true"], "bogus": 1}),
        ),
    ] {
        assert_error(&c.call("POST", &path, Some(body)).await, 400, "InvalidRequest");
    }
    for query in ["?source=kernel", "?tail=many", "?follow=maybe", "?since=1h"] {
        let answer = c.call("GET", &format!("/v1/machines/{name}/logs{query}"), None).await;
        assert_error(&answer, 400, "InvalidRequest");
    }
    assert_error(
        &c.call("GET", "/v1/machines/nope/logs", None).await,
        404,
        "MachineNotFound",
    );
    assert_error(
        &c.call("POST", "/v1/machines/nope/exec", Some(exec.clone())).await,
        404,
        "MachineNotFound",
    );

    // After a start (failed here: the image's registry does not exist), the log reads and ends.
    let started = c
        .call("POST", &format!("/v1/machines/{name}/ensure-running"), None)
        .await;
    assert_error(&started, 500, "StartFailed");
    for query in ["", "?follow=true", "?source=workload"] {
        let path = format!("/v1/machines/{name}/logs{query}");
        let answer = tokio::time::timeout(Duration::from_secs(30), c.call("GET", &path, None))
            .await
            .unwrap_or_else(|_| panic!("GET {path} hung after a failed start"));
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
        println!(
            "log of a machine whose start failed ({path}): {} bytes",
            answer.raw.len()
        );
    }
    let answer = c
        .call("POST", &format!("/v1/machines/{name}/exec"), Some(exec.clone()))
        .await;
    assert_error(&answer, 409, "MachineNotRunning");
    let (status, body) = agent.exec_session(&interactive).await.expect_err("refused");
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("MachineNotRunning")),
        "{body}"
    );

    // Files too need a running machine (smolvm would boot it), and a plain path.
    for method in ["GET", "PUT"] {
        let answer = c
            .call(method, &format!("/v1/machines/{name}/files/etc/hostname"), None)
            .await;
        assert_error(&answer, 409, "MachineNotRunning");
        // After a failed start smolvm reports the machine created or stopped (both seen).
        let state = answer.body["details"]["state"].as_str().unwrap_or_default();
        assert!(["Created", "Stopped"].contains(&state), "{answer:?}");
        let answer = c
            .call(method, &format!("/v1/machines/{name}/files/a/%2E%2E/b"), None)
            .await;
        assert_error(&answer, 400, "InvalidRequest");
        assert_error(
            &c.call(method, "/v1/machines/nope/files/etc/hostname", None).await,
            404,
            "MachineNotFound",
        );
    }
    let answer = c
        .call("PUT", &format!("/v1/machines/{name}/files/tmp/x?mode=999"), None)
        .await;
    assert_error(&answer, 400, "InvalidRequest");

    // The happy path needs a guest that boots: smolvm's own agent rootfs, as the boot probe.
    let mut spec = smolvm_runtime::vmm::MachineSpec::new("exec-1", 1, 256);
    spec.storage_gib = Some(2);
    spec.overlay_gib = Some(1);
    agent.agent.vmm().create(&spec).await.expect("create");
    let boot = c.call("POST", "/v1/machines/exec-1/ensure-running", None).await;
    if boot.status == 200 {
        let answer = c
            .call(
                "POST",
                "/v1/machines/exec-1/exec",
                Some(json!({"command": ["sh", "-c", "printf 'a\\000b'; echo err >&2; exit 3"]})),
            )
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.body["exitCode"], 3);
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::STANDARD;
        let stdout = engine
            .decode(answer.body["stdoutBase64"].as_str().unwrap_or_default())
            .unwrap_or_default();
        assert_eq!(stdout, b"a\0b", "byte-exact");
        let logs = c.call("GET", "/v1/machines/exec-1/logs?tail=20", None).await;
        assert_eq!(logs.status, 200);
        // A file in and out, byte-exact.
        let content: Vec<u8> = (0..=255u8).collect();
        let put = c
            .send_raw(
                "PUT",
                "/v1/machines/exec-1/files/tmp/copied?mode=0600",
                Some(content.clone()),
            )
            .await
            .unwrap_or_else(|e| panic!("PUT: {e}"));
        assert_eq!(put.status, 200, "{put:?}");
        let got = c.call("GET", "/v1/machines/exec-1/files/tmp/copied", None).await;
        assert_eq!((got.status, got.raw.to_vec()), (200, content));
        // Interactive, without a terminal (a PTY may rewrite bytes): output, then the exit code.
        use futures::StreamExt as _;
        use smolvm_api::channel;
        let path = "/v1/machines/exec-1/exec?command=sh&command=-c&command=echo%20out%3B%20echo%20err%20%3E%262%3B%20exit%205&stdout=true&stderr=true";
        let mut socket = agent.exec_session(path).await.expect("interactive exec upgrades");
        let (mut stdout, mut stderr, mut status) = (Vec::new(), Vec::new(), None);
        while let Ok(Some(Ok(message))) = tokio::time::timeout(Duration::from_secs(30), socket.next()).await {
            if let tokio_tungstenite::tungstenite::Message::Binary(bytes) = message {
                match bytes.split_first() {
                    Some((&channel::STDOUT, data)) => stdout.extend_from_slice(data),
                    Some((&channel::STDERR, data)) => stderr.extend_from_slice(data),
                    Some((&channel::STATUS, data)) => status = serde_json::from_slice::<serde_json::Value>(data).ok(),
                    _ => {}
                }
            }
        }
        let _ = socket.close(None).await;
        assert_eq!((stdout.as_slice(), stderr.as_slice()), (&b"out\n"[..], &b"err\n"[..]));
        assert_eq!(status.as_ref().and_then(channel::exit_code_of), Some(5), "{status:?}");
        println!(
            "guests boot here: exec ran (one-shot and interactive), console log {} bytes",
            logs.raw.len()
        );
    } else {
        assert_error(&boot, 500, "StartFailed");
        // The console of the boot that failed, as plain lines (the SSE framing taken off).
        let logs = c.call("GET", "/v1/machines/exec-1/logs?tail=50", None).await;
        assert_eq!(logs.status, 200, "{logs:?}");
        let text = String::from_utf8_lossy(&logs.raw);
        assert!(!text.lines().any(|l| l.starts_with("data:")), "{text}");
        println!("console of a failed boot: {} lines", text.lines().count());
        let answer = c.call("POST", "/v1/machines/exec-1/exec", Some(exec)).await;
        assert_error(&answer, 409, "MachineNotRunning");
        println!("exec (one-shot and interactive) and files happy paths skipped: guests cannot boot on this machine");
    }
    for machine in [name, "exec-1"] {
        c.call("DELETE", &format!("/v1/machines/{machine}"), None).await;
    }
    agent.agent.shutdown().await;
}

/// A host port the policy excludes (the built-in defaults here: the kubelet's 10250, the
/// NodePort range, ...) or one the agent itself listens on is refused at create with 403
/// HostPortExcluded naming the port, its protocol and the rule, and smolvm never gets the
/// machine. A machine that already has such a port (made before the policy excluded it) keeps
/// it: its repeated create is answered as the same machine and its start is not refused for it.
#[tokio::test]
async fn excluded_host_ports_are_refused_at_create_and_kept_by_existing_machines() {
    common::init();
    let dir = tempdir();
    let Some(agent) = TestAgent::with_smolvm(
        "excluded_host_ports_are_refused_at_create_and_kept_by_existing_machines",
        dir.path(),
        Arc::new(Pki::new()),
    )
    .await
    else {
        return;
    };
    let mut c = agent.client().await;
    let own = agent.agent.node_api_addr().port();
    let free = common::free_port();
    let spec_on = |port: u16, protocol: &str| {
        let mut spec = small_spec("localhost:1/app:1");
        spec["network"] = json!({"enabled": true, "ports": [{"hostPort": free, "guestPort": 8080}, {"hostPort": port, "guestPort": 80, "protocol": protocol}]});
        spec
    };
    let cases = [
        (10250, "TCP", "10250".to_string()),
        (10249, "UDP", "10249".to_string()),
        (30080, "TCP", "30000-32767".to_string()),
        (own, "TCP", own.to_string()),
    ];
    for (i, (port, protocol, rule)) in cases.into_iter().enumerate() {
        let name = format!("svm-excluded-{i}");
        let refused = c
            .call("PUT", &format!("/v1/machines/{name}"), Some(spec_on(port, protocol)))
            .await;
        assert_error(&refused, 403, "HostPortExcluded");
        assert_eq!(
            refused.body["details"],
            json!({"hostPort": port, "protocol": protocol, "rule": rule}),
            "{refused:?}"
        );
        assert!(
            agent.agent.vmm().get(&name).await.expect("smolvm answers").is_none(),
            "smolvm never got {name}"
        );
    }

    // A machine made before the policy excluded its port (here: straight through smolvm).
    let name = "svm-bound-before-the-policy";
    let mut existing = smolvm_runtime::vmm::MachineSpec::new(name, 1, 256);
    existing.image = Some("localhost:1/app:1".into());
    existing.storage_gib = Some(2);
    existing.overlay_gib = Some(1);
    existing.network = true;
    existing.ports = vec![
        smolvm_runtime::vmm::PortMapping {
            host_port: free,
            guest_port: 8080,
            protocol: smolvm_api::Protocol::Tcp,
        },
        smolvm_runtime::vmm::PortMapping {
            host_port: 10250,
            guest_port: 80,
            protocol: smolvm_api::Protocol::Tcp,
        },
    ];
    agent.agent.vmm().create(&existing).await.expect("smolvm creates it");
    let path = format!("/v1/machines/{name}");
    let again = c.call("PUT", &path, Some(spec_on(10250, "TCP"))).await;
    assert_eq!(again.status, 200, "the existing machine is answered: {again:?}");
    let start = c.call("POST", &format!("{path}/ensure-running"), None).await;
    assert_ne!(start.body["code"], "HostPortExcluded", "{start:?}");
    // The image's registry does not exist: smolvm's start fails, after the agent let it through.
    assert_error(&start, 500, "StartFailed");
    assert_eq!(c.call("DELETE", &path, None).await.status, 200);
    agent.agent.shutdown().await;
}
