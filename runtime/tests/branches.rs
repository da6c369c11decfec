//! Branches through the agent's node API over mTLS (SPEC 2.6): BranchMachine, and a start as a
//! branch source (`branchable` in EnsureMachineRunning's body).
//!
//! Against the TEST DOUBLE of smolvm serve (`smolvm_testkit::smolvm_double`), whose machines
//! "boot" at once, behind the agent's real node API and smolvm client: a source started
//! branchable, a branch of it with its own env and ports (and none of the source's), a repeat
//! that answers the same without a second call to smolvm, and every refusal with its code (a
//! missing source, one not running, one not branchable, a name taken by another machine, a
//! branch of itself, a bad body). The double's record shows one branch call per branch and no
//! create for them. Against a real `smolvm serve` (found as the other tests find it; `skipped:
//! …` without it): the refusals reachable without a running guest. Tests assert codes and
//! meaning, never smolvm's wording.

use std::sync::Arc;

use serde_json::json;

use common::assert_error;
use common::{Pki, TestAgent};
use smolvm_testkit::node as common;

fn tempdir() -> tempfile::TempDir {
    common::tempdir("smolvm-branches-")
}

/// A small machine with `BASE=1` in its env, publishing `ports` (`[host, guest]`).
fn machine(ports: &[[u16; 2]]) -> serde_json::Value {
    let ports: Vec<_> = ports
        .iter()
        .map(|[host, guest]| json!({"hostPort": host, "guestPort": guest}))
        .collect();
    json!({"image": "alpine:3", "cpus": 1, "memoryMiB": 256, "storageGiB": 2, "overlayGiB": 1,
        "network": {"enabled": true, "ports": ports},
        "workload": {"env": [{"name": "BASE", "value": "1"}]}})
}

/// Creates `src` (see [`machine`]) and starts it as a branch source.
async fn branchable_source(c: &mut common::NodeClient, ports: &[[u16; 2]]) {
    let created = c.call("PUT", "/v1/machines/src", Some(machine(ports))).await;
    assert_eq!(created.status, 201, "{created:?}");
    let started = c
        .call(
            "POST",
            "/v1/machines/src/ensure-running",
            Some(json!({"branchable": true})),
        )
        .await;
    assert_eq!(
        (started.status, started.body["state"].clone()),
        (200, json!("Running")),
        "{started:?}"
    );
}

fn branch_of(source: &str, role: &str) -> serde_json::Value {
    json!({"source": source, "env": [{"name": "ROLE", "value": role}]})
}

#[tokio::test]
async fn branches_against_the_double() {
    common::init();
    let dir = tempdir();
    let (double, agent) = TestAgent::on_double(dir.path()).await;
    let mut c = agent.client().await;
    let source_port = common::free_port();

    branchable_source(&mut c, &[[source_port, 80]]).await;

    // A branch with its own env and no ports: none of the source's are published.
    let branched = c
        .call("POST", "/v1/machines/b1/branch", Some(branch_of("src", "b1")))
        .await;
    assert_eq!(branched.status, 200, "{branched:?}");
    assert_eq!(branched.body["name"], json!("b1"));
    assert_eq!(branched.body["state"], json!("Running"));
    assert_eq!(branched.body["network"]["ports"], json!([]), "{branched:?}");
    let env = double.env("b1").unwrap_or_default();
    assert!(env.contains(&"BASE=1".to_string()), "the source's env: {env:?}");
    assert!(env.contains(&"ROLE=b1".to_string()), "the branch's own env: {env:?}");

    // A repeat answers the same, and smolvm is not asked again.
    let again = c
        .call("POST", "/v1/machines/b1/branch", Some(branch_of("src", "b1")))
        .await;
    assert_eq!(
        (again.status, again.body["name"].clone()),
        (200, json!("b1")),
        "{again:?}"
    );

    // A branch with its own port.
    let branch_port = common::free_port();
    let with_port = json!({"source": "src", "ports": [{"hostPort": branch_port, "guestPort": 80}]});
    let b2 = c.call("POST", "/v1/machines/b2/branch", Some(with_port)).await;
    assert_eq!(b2.status, 200, "{b2:?}");
    assert_eq!(b2.body["network"]["ports"][0]["hostPort"], json!(branch_port), "{b2:?}");
    assert_eq!(double.env("b2").unwrap_or_default(), vec!["BASE=1".to_string()]);

    assert_eq!(double.calls_of("branch_machine").len(), 2, "one branch call per branch");
    // smolvm's create names no machine in its path: the source's is the only one.
    let creates = double.calls_of("create_machine");
    assert_eq!(creates.len(), 1, "a branch is never created: {creates:?}");
    agent.agent.shutdown().await;
}

#[tokio::test]
async fn branch_refusals_against_the_double() {
    common::init();
    let dir = tempdir();
    let (double, agent) = TestAgent::on_double(dir.path()).await;
    let mut c = agent.client().await;
    branchable_source(&mut c, &[]).await;
    for name in ["plain", "cold"] {
        let created = c.call("PUT", &format!("/v1/machines/{name}"), Some(machine(&[]))).await;
        assert_eq!(created.status, 201, "{created:?}");
    }
    let started = c.call("POST", "/v1/machines/plain/ensure-running", None).await;
    assert_eq!(started.status, 200, "{started:?}");

    // (machine, body, HTTP status, code, details.state)
    let cases: [(&str, serde_json::Value, u16, &str, Option<&str>); 7] = [
        ("b", branch_of("nope", "x"), 404, "SourceNotFound", None),
        ("b", branch_of("cold", "x"), 409, "SourceNotRunning", Some("Created")),
        ("b", branch_of("plain", "x"), 409, "SourceNotBranchable", None),
        // A name taken by a machine that is no branch of the source.
        ("cold", branch_of("src", "x"), 409, "Conflict", None),
        ("src", branch_of("src", "x"), 400, "InvalidRequest", None),
        ("b", json!({"source": "bad name"}), 400, "InvalidRequest", None),
        (
            "b",
            json!({"source": "src", "freezeSource": true}),
            400,
            "InvalidRequest",
            None,
        ),
    ];
    for (name, body, status, code, state) in cases {
        let refused = c
            .call("POST", &format!("/v1/machines/{name}/branch"), Some(body.clone()))
            .await;
        assert_error(&refused, status, code);
        if let Some(state) = state {
            assert_eq!(refused.body["details"]["state"], json!(state), "{body}");
        }
    }
    // Every refusal is answered before smolvm is asked to branch.
    assert!(double.calls_of("branch_machine").is_empty());
    agent.agent.shutdown().await;
}

/// Against the real smolvm: a source that does not exist, and one created but never started
/// (no guest boots here, so none runs), are refused before smolvm is asked to branch.
#[tokio::test]
async fn branch_refusals_against_real_smolvm() {
    common::init();
    let dir = tempdir();
    let Some(agent) =
        TestAgent::with_smolvm("branch_refusals_against_real_smolvm", dir.path(), Arc::new(Pki::new())).await
    else {
        return;
    };
    let mut c = agent.client().await;
    let refused = c
        .call("POST", "/v1/machines/b/branch", Some(branch_of("nope", "x")))
        .await;
    assert_error(&refused, 404, "SourceNotFound");
    let created = c.call("PUT", "/v1/machines/src", Some(machine(&[]))).await;
    assert_eq!(created.status, 201, "{created:?}");
    let refused = c
        .call("POST", "/v1/machines/b/branch", Some(branch_of("src", "x")))
        .await;
    assert_error(&refused, 409, "SourceNotRunning");
    assert_eq!(refused.body["details"]["state"], json!("Created"));
    let gone = c.call("GET", "/v1/machines/b", None).await;
    assert_error(&gone, 404, "MachineNotFound");
    agent.agent.shutdown().await;
}
