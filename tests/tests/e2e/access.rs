//! The access API (`subresources.vm.smolvm.dev`) through the real API server's aggregator, and
//! `kubectl smolvm` on top of it: a user with the log role reads the log, a user with no role is
//! Forbidden, exec (one-shot and interactive, over the WebSocket channel protocol) on a VM that
//! does not run answers 409, a role that may only `get` smolvms/exec gets no shell, a call without the front proxy's
//! certificate is refused at the TLS handshake, the server asks RBAC itself, a VM whose node is away is a 503, and
//! `stop`, `start` and `restart` move the VM.
//!
//! This tier runs no kube-controller-manager, so the built-in `view`/`edit` roles do not pick up
//! the install's roles by aggregation here; users are bound to `smolvm-log-viewer` and
//! `smolvm-exec` directly (the cluster tier has the aggregation controller).

use std::{process::Output, sync::Arc, time::Duration};

use anyhow::{Context as _, anyhow, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;
use smolvm_tests::env::{Env, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{NS, Scenario, condition, expect_event, small, vm, vms, wait_gone, wait_started_or_failed, wait_vm};
use smolvm_api::constants;

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![
        access_api_is_served_through_the_aggregator,
        kubectl_smolvm_logs_and_exec_follow_rbac_and_the_vm_state,
        access_api_refuses_callers_other_than_the_front_proxy_and_asks_rbac_itself,
        access_to_a_vm_whose_node_is_away_is_a_clear_503,
        kubectl_smolvm_stop_and_start_move_the_vm,
    ]
}

const VM: &str = "acc";
/// A user with the log and exec roles (and the SmolVM roles, for start and stop).
const ALICE: &str = "alice";
/// A user with no role at all.
const MALLORY: &str = "mallory";
/// A user who may only `get` smolvms/exec (what the API server checks for a WebSocket).
const GETTER: &str = "getter";

/// Runs `kubectl-smolvm` as `user` (the admin impersonating them, as `kubectl --as` does).
fn plugin(env: &Env, user: &str, args: &[&str]) -> anyhow::Result<Output> {
    let kubeconfig = env.plane.admin_kubeconfig.display().to_string();
    let mut all = vec!["--kubeconfig", kubeconfig.as_str(), "-n", NS, "--as", user];
    all.extend_from_slice(args);
    std::process::Command::new(&env.bins.plugin)
        .args(&all)
        .output()
        .with_context(|| format!("running {}", env.bins.plugin.display()))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn access_api_is_served_through_the_aggregator(env: &mut Env) -> anyhow::Result<()> {
    // The APIService turns Available once the controller serves it with the injected caBundle.
    smolvm_tests::env::wait_api_service_available(
        &env.plane.admin_kubeconfig,
        "v1alpha1.subresources.vm.smolvm.dev",
        Duration::from_secs(60),
    )
    .await?;
    let out = env.kubectl(&["get", "--raw", "/apis/subresources.vm.smolvm.dev/v1alpha1"], None)?;
    ensure!(out.status.success(), "discovery: {}", text(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let names: Vec<&str> = list["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str())
        .collect();
    ensure!(
        names == ["smolvms/log", "smolvms/exec", "smolvms/files"],
        "discovery lists {names:?}"
    );
    // Alice may use the log, exec and files, and start and stop SmolVMs, in this namespace.
    let mut bindings = Vec::new();
    for role in ["smolvm-log-viewer", "smolvm-exec", "smolvm-viewer", "smolvm-editor"] {
        bindings.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("{ALICE}-{role}"), "namespace": NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": ALICE}],
        }));
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": bindings});
    let out = env.kubectl(&["apply", "-f", "-"], Some(&list.to_string()))?;
    ensure!(out.status.success(), "RoleBindings: {}", text(&out.stderr));
    Ok(())
}

async fn kubectl_smolvm_logs_and_exec_follow_rbac_and_the_vm_state(env: &mut Env) -> anyhow::Result<()> {
    let out = env.kubectl(&["apply", "-f", "-"], Some(&vm(VM, small(true)).to_string()))?;
    ensure!(out.status.success(), "{}", text(&out.stderr));
    let settled = wait_started_or_failed(env, VM).await?;
    let running = condition(&settled, constants::condition::READY).is_some_and(|c| c.status == "True");

    // The log: whatever smolvm kept of the failed start (empty is an answer; a hang is not).
    let started = std::time::Instant::now();
    let out = plugin(env, ALICE, &["logs", VM, "--tail", "50"])?;
    ensure!(out.status.success(), "logs as {ALICE}: {}", text(&out.stderr));
    println!(
        "    (kubectl smolvm logs as {ALICE}: {} bytes in {:.0} ms)",
        out.stdout.len(),
        started.elapsed().as_secs_f64() * 1000.0
    );
    let out = plugin(env, ALICE, &["logs", VM, "--source", "workload"])?;
    ensure!(out.status.success(), "workload log as {ALICE}: {}", text(&out.stderr));

    // No role: the API server itself refuses, before the access API is reached.
    let out = plugin(env, MALLORY, &["logs", VM])?;
    ensure!(!out.status.success(), "logs as {MALLORY} succeeded");
    ensure!(
        text(&out.stderr).contains("Forbidden"),
        "logs as {MALLORY}: {}",
        text(&out.stderr)
    );

    // Exec and cp on a VM that does not run: 409 naming its phase, through kubectl.
    let out = plugin(env, ALICE, &["exec", VM, "--", "cat", "/etc/hostname"])?;
    if running {
        ensure!(out.status.success(), "exec on a running VM: {}", text(&out.stderr));
        println!("    (the guest booted here: exec ran)");
    } else {
        let stderr = text(&out.stderr);
        ensure!(
            out.status.code() == Some(1),
            "exec on a VM that does not run exited {:?}",
            out.status.code()
        );
        ensure!(
            stderr.contains("Conflict") && stderr.contains("not running") && stderr.contains("phase"),
            "exec on a VM that does not run: {stderr}"
        );
        let out = plugin(env, ALICE, &["cp", &format!("{VM}:/etc/hostname"), "-"])?;
        ensure!(
            !out.status.success() && text(&out.stderr).contains("Conflict"),
            "cp out of a VM that does not run: {}",
            text(&out.stderr)
        );
        let out = plugin(env, MALLORY, &["exec", VM, "--", "true"])?;
        ensure!(
            text(&out.stderr).contains("Forbidden"),
            "exec as {MALLORY}: {}",
            text(&out.stderr)
        );
    }

    // Interactive exec: a WebSocket upgrade in Kubernetes' channel protocol, through the API
    // server's aggregator to the controller and on to the node's agent. (stdin is no terminal
    // here, so the session runs without one, output only, as kubectl does.)
    let out = plugin(env, ALICE, &["exec", VM, "-t", "--", "cat", "/etc/hostname"])?;
    let stderr = text(&out.stderr);
    if running {
        ensure!(out.status.success(), "interactive exec on a running VM: {stderr}");
        println!("    (the guest booted here: an interactive exec ran)");
    } else {
        ensure!(
            out.status.code() == Some(1)
                && stderr.contains("Conflict")
                && stderr.contains("not running")
                && stderr.contains("phase")
                && stderr.contains("needs a running machine"),
            "interactive exec on a VM that does not run (the node's agent refuses it): exit {:?}: {stderr}",
            out.status.code()
        );
    }
    let out = plugin(env, MALLORY, &["exec", VM, "-t", "--", "sh"])?;
    ensure!(
        out.status.code() == Some(1) && text(&out.stderr).contains("Forbidden"),
        "interactive exec as {MALLORY}: {}",
        text(&out.stderr)
    );
    // The API server authorizes a WebSocket GET as `get`; the access API asks for `create`
    // itself, so a role that may only read smolvms/exec never gives a shell.
    let getter = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "exec-get-only", "namespace": NS},
         "rules": [{"apiGroups": ["subresources.vm.smolvm.dev"], "resources": ["smolvms/exec"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "exec-get-only", "namespace": NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "exec-get-only"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": GETTER}]},
    ]});
    let out = env.kubectl(&["apply", "-f", "-"], Some(&getter.to_string()))?;
    ensure!(out.status.success(), "get-only role: {}", text(&out.stderr));
    // Until the binding reaches the API server's authorizer, it refuses `get` itself.
    let stderr = eventually(
        "the access API's own refusal of an interactive exec to a get-only user",
        Duration::from_secs(20),
        || async {
            let out = plugin(env, GETTER, &["exec", VM, "-t", "--", "sh"])?;
            let stderr = text(&out.stderr);
            ensure!(
                out.status.code() == Some(1),
                "exec as {GETTER} exited {:?}: {stderr}",
                out.status.code()
            );
            Ok(stderr.contains("cannot create resource").then_some(stderr))
        },
    )
    .await?;
    ensure!(
        stderr.contains("Forbidden") && stderr.contains("cannot create resource \"smolvms/exec\""),
        "interactive exec as {GETTER} (get only): {stderr}"
    );
    Ok(())
}

/// A TLS client of the access API on this machine, trusting its CA (from the self-signed
/// Secret), with or without the API server's front-proxy client certificate.
fn access_tls(env: &Env, ca_pem: &str, front_proxy: bool) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let identity = if front_proxy {
        let pki = env.plane.dir().join("pki");
        Some((
            std::fs::read_to_string(pki.join("front-proxy-client.crt"))?,
            std::fs::read_to_string(pki.join("front-proxy-client.key"))?,
        ))
    } else {
        None
    };
    let config = smolvm_certs::client_config(
        ca_pem,
        identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
        &[b"http/1.1"],
    )?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// One HTTP/1.1 GET; the status code.
async fn get_status(env: &Env, tls: &tokio_rustls::TlsConnector, path: &str, user: &str) -> anyhow::Result<u16> {
    head_status(env, tls, &format!("GET {path}"), user, "").await
}

/// The status answered to a request's head alone (`request_line` and `extra` headers), its body
/// never sent.
async fn head_status(
    env: &Env,
    tls: &tokio_rustls::TlsConnector,
    request_line: &str,
    user: &str,
    extra: &str,
) -> anyhow::Result<u16> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", env.access_port)).await?;
    let name = rustls::pki_types::ServerName::try_from("smolvm-access.smolvm-system.svc")?;
    let mut stream = tls.connect(name, tcp).await?;
    let request = format!(
        "{request_line} HTTP/1.1\r\nHost: smolvm-access\r\nX-Remote-User: {user}\r\nX-Remote-Group: system:authenticated\r\n{extra}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut head = vec![0u8; 64];
    let n = stream.read(&mut head).await?;
    let line = String::from_utf8_lossy(&head[..n]).into_owned();
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP answer: {line:?}"))
}

async fn access_api_refuses_callers_other_than_the_front_proxy_and_asks_rbac_itself(
    env: &mut Env,
) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(env.admin().await?, "smolvm-system");
    let secret = secrets.get("smolvm-access-tls").await?;
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .map(|b| text(&b.0))
        .ok_or_else(|| anyhow!("smolvm-access-tls has no ca.crt"))?;
    let path = format!("/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/{NS}/smolvms/{VM}/log");
    // Straight to the port, claiming to be the cluster admin, without the proxy's certificate:
    // the TLS handshake refuses the connection (alert certificate_required), so not even the
    // request's headers are read.
    match get_status(env, &access_tls(env, &ca, false)?, &path, "e2e-admin").await {
        Ok(code) => anyhow::bail!("a forged user header without the front-proxy certificate got {code}"),
        Err(error) => {
            let alert = error
                .downcast_ref::<std::io::Error>()
                .and_then(|e| e.get_ref())
                .and_then(|e| e.downcast_ref::<rustls::Error>())
                .cloned();
            ensure!(
                alert
                    == Some(rustls::Error::AlertReceived(
                        rustls::AlertDescription::CertificateRequired
                    )),
                "a caller without the front-proxy certificate: {error:#}"
            );
        }
    }
    // With the proxy's certificate, the access API still asks RBAC about the user named.
    let proxy = access_tls(env, &ca, true)?;
    let denied = get_status(env, &proxy, &path, MALLORY).await?;
    ensure!(denied == 403, "{MALLORY} through the front proxy got {denied}");
    let allowed = get_status(env, &proxy, &path, ALICE).await?;
    ensure!(allowed == 200, "{ALICE} through the front proxy got {allowed}");
    // An upload is authorized before its body is read: the head of a 60 MB copy by a user RBAC
    // refuses is answered 403 while none of its body has been sent.
    let files = format!("/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/{NS}/smolvms/{VM}/files?path=/tmp/x");
    let upload = head_status(
        env,
        &proxy,
        &format!("POST {files}"),
        MALLORY,
        "Content-Type: application/octet-stream\r\nContent-Length: 60000000\r\n",
    )
    .await?;
    ensure!(upload == 403, "a 60 MB upload of {MALLORY}, body unsent, got {upload}");
    Ok(())
}

async fn access_to_a_vm_whose_node_is_away_is_a_clear_503(env: &mut Env) -> anyhow::Result<()> {
    env.stop_runtime();
    let out = plugin(env, ALICE, &["logs", VM]);
    let restarted = env.start_runtime().await;
    let out = out?;
    restarted?;
    let stderr = text(&out.stderr);
    ensure!(!out.status.success(), "logs with the node's agent stopped succeeded");
    ensure!(
        stderr.contains("ServiceUnavailable") && stderr.contains("cannot be reached"),
        "logs with the node's agent stopped: {stderr}"
    );
    Ok(())
}

async fn kubectl_smolvm_stop_and_start_move_the_vm(env: &mut Env) -> anyhow::Result<()> {
    let phase = |v: &smolvm_api::SmolVM| v.status.as_ref().and_then(|s| s.phase).map(|p| format!("{p:?}"));
    let out = plugin(env, ALICE, &["stop", VM])?;
    ensure!(out.status.success(), "stop: {}", text(&out.stderr));
    ensure!(
        text(&out.stdout).contains("stopped"),
        "stop said: {}",
        text(&out.stdout)
    );
    wait_vm(env, VM, "phase Stopped", Duration::from_secs(90), |v| {
        phase(v).as_deref() == Some("Stopped")
    })
    .await?;
    let out = plugin(env, ALICE, &["start", VM])?;
    ensure!(out.status.success(), "start: {}", text(&out.stderr));
    let started = wait_vm(
        env,
        VM,
        "running again (phase no longer Stopped)",
        Duration::from_secs(90),
        |v| v.spec.running == Some(true) && phase(v).as_deref() != Some("Stopped"),
    )
    .await?;
    println!("    (after start: phase {:?})", phase(&started));
    // A restart is honoured once: the controller (re)starts the machine and drops the request.
    let out = plugin(env, ALICE, &["restart", VM])?;
    ensure!(out.status.success(), "restart: {}", text(&out.stderr));
    wait_vm(
        env,
        VM,
        "the restart request honoured and dropped",
        Duration::from_secs(90),
        |v| {
            v.metadata
                .annotations
                .as_ref()
                .is_none_or(|a| !a.contains_key(constants::RESTART_ANNOTATION))
        },
    )
    .await?;
    expect_event(env, VM, "Restarted").await?;
    let out = plugin(env, MALLORY, &["stop", VM])?;
    ensure!(
        text(&out.stderr).contains("Forbidden"),
        "stop as {MALLORY}: {}",
        text(&out.stderr)
    );
    vms(env).await?.delete(VM, &Default::default()).await?;
    wait_gone(env, VM, Duration::from_secs(120)).await
}
