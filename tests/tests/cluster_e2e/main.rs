//! The real-cluster tier (`make cluster-e2e`): `deploy/default`, installed by `make deploy`, runs
//! as real pods on a real Kubernetes node (containerd, runc, a CNI bridge, the kubelet and
//! kube-proxy) inside a sandbox of its own (`smolvm_tests::cluster`). Scenarios run in order,
//! each printed like libtest prints a test; arguments filter them by substring.
//!
//! It skips, saying why, without the Kubernetes node binaries (found as envtest finds its own:
//! `KUBEBUILDER_ASSETS`, `TEST_ASSET_<NAME>`, `PATH`), without root, or without the Debian
//! packages `tests/scripts/cluster-deps.sh` installs.
//!
//! `--dev` (what `make dev CLUSTER=1` runs) brings the node up, deploys, applies the example
//! SmolVM and waits for Ctrl-C instead of running the scenarios.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use smolvm_tests::{
    assets,
    cluster::{self, images, sandbox::HostSnapshot},
};
use tokio::io::AsyncBufReadExt as _;

mod scenarios;

/// Set for the inner process: the run's work directory.
const INNER_DIR: &str = "SMOLVM_CLUSTER_E2E_DIR";
/// Set for the inner process: the kubelet's cgroup root.
const INNER_CGROUP_ROOT: &str = "SMOLVM_CLUSTER_E2E_CGROUP_ROOT";
/// Set for the inner process: the OCI archives to import, `:`-separated.
const INNER_IMAGES: &str = "SMOLVM_CLUSTER_E2E_IMAGES";
/// The inner process prints this when its scenarios are done and it waits for Ctrl-C.
const DONE_MARKER: &str = "cluster-e2e: scenarios done; waiting for Ctrl-C";
/// The scenario the outer process runs itself, after the inner one.
const TEARDOWN_SCENARIO: &str = "ctrl_c_tears_the_node_down_and_leaves_nothing_behind";

fn main() -> ExitCode {
    smolvm_tests::install_crypto_provider();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = args.iter().any(|a| a == "--dev");
    let filters: Vec<String> = args.iter().filter(|a| !a.starts_with('-')).cloned().collect();
    let selected: Vec<&'static str> = scenarios::names()
        .into_iter()
        .chain([TEARDOWN_SCENARIO])
        .filter(|name| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if args.iter().any(|a| a == "--list") {
        for name in &selected {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let runtime = match smolvm_tests::this_thread_runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    if let Some(dir) = std::env::var_os(INNER_DIR) {
        return runtime.block_on(scenarios::inner(PathBuf::from(dir), inner_settings(), selected, dev));
    }
    if !dev {
        println!("\nrunning {} cluster scenarios", selected.len());
    }
    let skip = |reason: &str| {
        for name in &selected {
            println!("test {name} ... {reason}");
        }
        println!(
            "\ntest result: skipped. 0 passed; 0 failed; {} skipped ({reason})\n",
            selected.len()
        );
        ExitCode::SUCCESS
    };
    if let Err(reason) = assets::find_cluster() {
        return skip(&reason);
    }
    if let Some(reason) = cluster::missing_prerequisite() {
        return skip(&reason);
    }
    if assets::on_path("kubectl").is_none() {
        return skip("skipped: no kubectl on PATH (`make deploy` applies with it)");
    }
    runtime.block_on(outer(selected, args, dev))
}

/// What the outer process hands the inner one.
pub struct InnerSettings {
    /// The kubelet's cgroup root.
    pub cgroup_root: String,
    /// OCI archives to import into containerd.
    pub images: Vec<PathBuf>,
}

fn inner_settings() -> InnerSettings {
    InnerSettings {
        cgroup_root: std::env::var(INNER_CGROUP_ROOT).unwrap_or_default(),
        images: std::env::var(INNER_IMAGES)
            .unwrap_or_default()
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect(),
    }
}

async fn outer(selected: Vec<&'static str>, args: Vec<String>, dev: bool) -> ExitCode {
    let keep = std::env::var_os("SMOLVM_E2E_KEEP").is_some();
    let tmp = match tempfile::Builder::new().prefix("smolvm-cluster-e2e-").tempdir() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot create a work directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = tmp.path().to_path_buf();
    let started = Instant::now();
    let archives = match build_images(&dir) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: the images could not be built: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "images built in {:.1}s (operator, runtime, pause, probe; in {})",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    let before = match HostSnapshot::take() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot read the host's state: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = run_sandboxed(&dir, &archives, &args, dev).await;
    let after = HostSnapshot::take();
    let (passed, failed) = match &outcome {
        Ok(counts) => *counts,
        Err(e) => {
            eprintln!("error: {e:#}");
            (0, 1)
        }
    };
    let (mut passed, mut failed) = (passed, failed);
    if selected.contains(&TEARDOWN_SCENARIO) && !dev {
        let left = match (&after, &outcome) {
            (Ok(after), Ok(_)) => before.left_behind(after),
            (Err(e), _) => vec![format!("cannot read the host's state: {e:#}")],
            (_, Err(_)) => vec!["the node did not run, so its teardown was not the Ctrl-C path".to_string()],
        };
        if left.is_empty() {
            println!("test {TEARDOWN_SCENARIO} ... ok");
            passed += 1;
        } else {
            println!(
                "test {TEARDOWN_SCENARIO} ... FAILED\n    left behind: {}",
                left.join("; ")
            );
            failed += 1;
        }
    }
    if keep || failed > 0 {
        let _ = tmp.keep();
        println!("logs kept in {}", dir.display());
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    if dev {
        return if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; 0 skipped; finished in {:.1}s\n",
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn build_images(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let repo = smolvm_tests::env::repo_root();
    let bins = assets::operator_bins()?;
    let images_dir = dir.join("images");
    std::fs::create_dir_all(&images_dir)?;
    let dist = images::smolvm_dist(&repo, &images_dir)?;
    let specs = [
        images::pause()?,
        images::probe(),
        images::operator(&bins),
        images::runtime(&bins, &dist, &repo.join("deploy/image/runtime-entrypoint.sh")),
    ];
    specs
        .iter()
        .map(|spec| images::build(spec, &images_dir).with_context(|| format!("building {}", spec.reference)))
        .collect()
}

/// Runs the inner process in the sandbox, relaying its output; returns its pass and fail counts.
/// Once the inner process says its scenarios are done, the harness interrupts itself as Ctrl-C
/// would, so every run goes down the Ctrl-C path.
async fn run_sandboxed(dir: &Path, archives: &[PathBuf], args: &[String], dev: bool) -> anyhow::Result<(u32, u32)> {
    let mut sandbox = cluster::sandbox::Sandbox::create().context("making the sandbox")?;
    let exe = std::env::current_exe()?;
    let images = archives
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let mut cmd = sandbox.command(&exe)?;
    cmd.args(args)
        .env(INNER_DIR, dir.join("node"))
        .env(INNER_CGROUP_ROOT, sandbox.cgroup_root())
        .env(INNER_IMAGES, images)
        .stdout(std::process::Stdio::piped());
    let mut child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .context("starting the node in its sandbox")?;
    let pid = child.id().and_then(|p| i32::try_from(p).ok());
    let stdout = child.stdout.take().context("no stdout from the inner process")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let (mut passed, mut failed) = (0, 0);
    let mut interrupted = false;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => {
                    println!("{line}");
                    if line.starts_with("test ") && line.contains(" ... ok") {
                        passed += 1;
                    } else if line.starts_with("test ") && line.contains(" ... FAILED") {
                        failed += 1;
                    }
                    if line == DONE_MARKER && !dev {
                        // What a terminal's Ctrl-C does: SIGINT to this process and to the node.
                        // SAFETY: kill(2) on our own pid and our child's.
                        unsafe {
                            libc::kill(libc::getpid(), libc::SIGINT);
                        }
                    }
                }
                _ => break,
            },
            _ = &mut ctrl_c, if !interrupted => {
                interrupted = true;
                eprintln!("cluster-e2e: interrupted; stopping the node");
                if let Some(pid) = pid {
                    // SAFETY: kill(2) on our own child.
                    unsafe {
                        libc::kill(pid, libc::SIGINT);
                    }
                }
            }
        }
    }
    let status = tokio::time::timeout(Duration::from_secs(90), child.wait()).await;
    if !matches!(status, Ok(Ok(_))) {
        let _ = child.kill().await;
    }
    let problems = sandbox.teardown();
    if !problems.is_empty() {
        anyhow::bail!("the sandbox's teardown: {}", problems.join("; "));
    }
    Ok((passed, failed))
}
