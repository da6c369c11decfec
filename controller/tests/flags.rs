//! The `smolvm-controller` binary speaks the shared flag vocabulary: its `--help` shows the
//! shared names and no retired spelling, and a retired spelling still works, with a warning.

use std::process::Command;

use smolvm_testkit::flags::{assert_help_speaks_the_vocabulary, deprecation_warnings};

const BIN: &str = env!("CARGO_BIN_EXE_smolvm-controller");

#[test]
fn help_uses_the_shared_flag_names() {
    assert_help_speaks_the_vocabulary(BIN, "SMOLVM_CONTROLLER_", smolvm_controller::cli::RENAMED);
}

#[test]
fn an_old_flag_and_variable_still_work_and_warn() {
    // Taken (the run gets as far as looking for an API server, which is not there), and the log
    // says what to use instead.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(BIN);
    command
        .args(["--ops-addr", "127.0.0.1:0"])
        .env("OPS_ADDR", "127.0.0.1:0")
        .env("KUBECONFIG", dir.path().join("missing"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("SMOLVM_CONTROLLER_OPS_ADDRESS")
        .env("POLICY_FILE", dir.path().join("missing-policy.yaml"))
        .env_remove("SMOLVM_CONTROLLER_POLICY");
    let warnings = deprecation_warnings(command);
    let says = |a: &str, b: &str| warnings.iter().any(|w| w.contains(a) && w.contains(b));
    assert!(says("--ops-addr", "--ops-address"), "{warnings:?}");
    assert!(says("POLICY_FILE", "SMOLVM_CONTROLLER_POLICY"), "{warnings:?}");
    // OPS_ADDR is ignored beside the flag, and says so.
    assert!(says("OPS_ADDR", "ignored"), "{warnings:?}");
}
