//! The `smolvm-controller` binary speaks the shared flag vocabulary: its `--help` shows the
//! shared names and no retired spelling, and a retired spelling still works, with a warning.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_smolvm-controller");

#[test]
fn help_uses_the_shared_flag_names() {
    let out = Command::new(BIN).arg("--help").output().expect("run --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let problems = smolvm_kit::cli::help_problems(&help, "SMOLVM_CONTROLLER_", smolvm_controller::cli::RENAMED);
    assert!(problems.is_empty(), "{problems:?}\n{help}");
}

#[test]
fn an_old_flag_and_variable_still_work_and_warn() {
    // Taken (the run gets as far as looking for an API server, which is not there), and the log
    // says what to use instead.
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["--ops-addr", "127.0.0.1:0", "--log-format", "json"])
        .env("OPS_ADDR", "127.0.0.1:0")
        .env("KUBECONFIG", dir.path().join("missing"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("SMOLVM_CONTROLLER_OPS_ADDRESS")
        .env("POLICY_FILE", dir.path().join("missing-policy.yaml"))
        .env_remove("SMOLVM_CONTROLLER_POLICY")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("DeprecatedFlag")).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("--ops-addr") && w.contains("--ops-address")),
        "{log}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("POLICY_FILE") && w.contains("SMOLVM_CONTROLLER_POLICY")),
        "{log}"
    );
    // OPS_ADDR is ignored beside the flag, and says so.
    assert!(
        warnings.iter().any(|w| w.contains("OPS_ADDR") && w.contains("ignored")),
        "{log}"
    );
}
