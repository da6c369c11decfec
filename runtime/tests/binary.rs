//! The `smolvm-runtime` binary end to end in `--standalone` mode (no Kubernetes): flags,
//! serving certificate and client CA from files, a real `smolvm serve` child, the node API over
//! mTLS, the ops port, the release hook, and SIGTERM stopping the agent and its child; and the
//! `hold` subcommand (the holder Pod's container).

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{NODE, Pki, TOKEN, free_port, http_get, smolvm_install};
use smolvm_testkit::node as common;

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

#[tokio::test]
async fn standalone_binary_serves_and_stops_its_child_on_sigterm() {
    common::init();
    let install = match smolvm_install() {
        Ok(install) => install,
        Err(reason) => {
            println!("skipped: standalone_binary_serves_and_stops_its_child_on_sigterm: smolvm unavailable: {reason}");
            return;
        }
    };
    let dir = tempfile::Builder::new()
        .prefix("smolvm-bin-")
        .tempdir()
        .expect("temp dir");
    let path = |name: &str| dir.path().join(name);
    let pki = Arc::new(Pki::new());
    std::fs::write(path("tls.crt"), &pki.server_cert).expect("write");
    std::fs::write(path("tls.key"), &pki.server_key).expect("write");
    std::fs::write(path("ca.crt"), pki.ca.cert_pem()).expect("write");
    std::fs::write(path("token"), TOKEN).expect("write");
    let (api_port, ops_port, release_port) = (free_port(), free_port(), free_port());
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_smolvm-runtime"));
    command
        .args(["--standalone", "--node-name", NODE, "--listen-address", "127.0.0.1"])
        .args(["--port", &api_port.to_string()])
        .args(["--ops-address", &format!("127.0.0.1:{ops_port}")])
        .args(["--release-port", &release_port.to_string()])
        .arg("--kubelet-root-dir")
        .arg(path("kubelet"))
        .arg("--tls-cert")
        .arg(path("tls.crt"))
        .arg("--tls-key")
        .arg(path("tls.key"))
        .arg("--client-ca")
        .arg(path("ca.crt"))
        .arg("--token-file")
        .arg(path("token"))
        .arg("--state-dir")
        .arg(path("lib"))
        .arg("--run-dir")
        .arg(path("run"))
        .arg("--smolvm-bin")
        .arg(&install.bin)
        .args(["--guest-rollout-port", &free_port().to_string()])
        .args(["--smolvm-env", "SMOLVM_VM_UID_DROP=off"])
        .envs(install.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(path("agent.log")).expect("log"))
        .kill_on_drop(true);
    let mut agent = command.spawn().expect("spawn the agent");
    let log = || std::fs::read_to_string(path("agent.log")).unwrap_or_default();

    let ops = std::net::SocketAddr::from(([127, 0, 0, 1], ops_port));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ready = match tokio::net::TcpStream::connect(ops).await {
            Ok(_) => http_get(ops, "/readyz").await.0 == 200,
            Err(_) => false,
        };
        if ready {
            break;
        }
        if let Ok(Some(status)) = agent.try_wait() {
            panic!("agent exited ({status}):\n{}", log());
        }
        assert!(tokio::time::Instant::now() < deadline, "agent never ready:\n{}", log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let agent_pid = agent.id().expect("pid");
    let children: Vec<u32> = processes_mentioning(&path("lib").join("state").display().to_string())
        .into_iter()
        .filter(|p| *p != agent_pid)
        .collect();
    assert!(!children.is_empty(), "no smolvm serve child found");

    let mut client = common::NodeClient::connect(
        std::net::SocketAddr::from(([127, 0, 0, 1], api_port)),
        &smolvm_certs::runtime_server_name(NODE),
        pki.client_tls(),
        Some(TOKEN),
    )
    .await
    .expect("connect");
    let health = client.call("GET", "/v1/health", None).await;
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(health.body["runtimeVersion"], "1.32.2");
    let (_, metrics) = http_get(ops, "/metrics").await;
    assert!(metrics.contains("smolvm_runtime_smolvm_ready 1"), "{metrics}");
    // The release hook on the loopback: a token no machine is held by.
    let release = std::net::SocketAddr::from(([127, 0, 0, 1], release_port));
    let (status, body) = common::release_call(release, Some(&"f".repeat(64))).await;
    assert_eq!(
        (status, &body["code"]),
        (404, &serde_json::json!("MachineNotFound")),
        "{body}"
    );
    let (_, metrics) = http_get(ops, "/metrics").await;
    assert!(
        metrics.contains("smolvm_runtime_volume_releases_total{result=\"NoMatch\"} 1"),
        "{metrics}"
    );
    // JSON logs.
    assert!(
        log()
            .lines()
            .any(|l| l.starts_with('{') && l.contains("node API serving")),
        "{}",
        log()
    );
    drop(client);

    let pid = agent_pid as i32;
    // SAFETY: SIGTERM to the agent process this test started.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let status = tokio::time::timeout(Duration::from_secs(30), agent.wait())
        .await
        .expect("agent stops after SIGTERM")
        .expect("wait");
    assert!(status.success(), "{status}:\n{}", log());
    let left = processes_mentioning(&path("lib").display().to_string());
    assert!(left.is_empty(), "smolvm serve left running: {left:?}");
}

/// Resident memory of a process, in KiB: all of it (`VmRSS`), and its own (`RssAnon`; the rest
/// is the binary's pages, shared with every process that maps it).
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((field("VmRSS:")?, field("RssAnon:")?))
}

/// `smolvm-runtime hold` sleeps until SIGTERM (or SIGINT) and exits 0, within a fraction of the
/// holder's 16 MiB memory limit; it takes no other argument, and the agent's flags are not read.
#[tokio::test]
async fn hold_sleeps_until_sigterm_in_little_memory() {
    use tokio::io::AsyncBufReadExt as _;
    const BIN: &str = env!("CARGO_BIN_EXE_smolvm-runtime");
    for (signal, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let mut hold = tokio::process::Command::new(BIN)
            .arg("hold")
            // The agent's variables are not read: a bad one changes nothing.
            .env("SMOLVM_RUNTIME_PORT", "not a port")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn hold");
        let pid = hold.id().expect("pid");
        let mut said = tokio::io::BufReader::new(hold.stderr.take().expect("stderr")).lines();
        // Its first line comes once the signals are blocked: none is lost from there.
        let first = tokio::time::timeout(Duration::from_secs(10), said.next_line())
            .await
            .expect("hold says it holds")
            .expect("read");
        assert!(first.is_some_and(|l| l.contains("holding")), "{name}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(hold.try_wait().expect("wait").is_none(), "hold keeps running");
        let (rss, own) = rss_kib(pid).expect("VmRSS");
        println!(
            "smolvm-runtime hold: VmRSS {rss} KiB, of it its own (RssAnon) {own} KiB; the holder's limit is 16384 KiB"
        );
        assert!(
            rss < 16 * 1024 && own < 4 * 1024,
            "hold uses {rss} KiB ({own} KiB its own)"
        );
        // SAFETY: a signal to the process this test started.
        unsafe {
            libc::kill(pid as i32, signal);
        }
        let status = tokio::time::timeout(Duration::from_secs(10), hold.wait())
            .await
            .expect("hold exits after the signal")
            .expect("wait");
        assert_eq!(status.code(), Some(0), "{name}: {status}");
    }
    let usage = std::process::Command::new(BIN)
        .args(["hold", "--help"])
        .output()
        .expect("run");
    assert!(usage.status.success());
    assert!(String::from_utf8_lossy(&usage.stdout).contains("SIGTERM"));
    let wrong = std::process::Command::new(BIN)
        .args(["hold", "--node-name", "n1"])
        .output()
        .expect("run");
    assert_eq!(wrong.status.code(), Some(2));
    let help = std::process::Command::new(BIN).arg("--help").output().expect("run");
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    for shown in ["smolvm-runtime hold", "--kubelet-root-dir", "--release-port"] {
        assert!(help.contains(shown), "--help shows {shown}:\n{help}");
    }
}
