//! The `smolvm-runtime` binary speaks the shared flag vocabulary: its `--help` shows the shared
//! names and no retired spelling, and a retired variable still works, with a warning.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_smolvm-runtime");

#[test]
fn help_uses_the_shared_flag_names() {
    let out = Command::new(BIN).arg("--help").output().expect("run --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let problems = smolvm_kit::cli::help_problems(&help, "SMOLVM_RUNTIME_", smolvm_runtime::cli::RENAMED);
    assert!(problems.is_empty(), "{problems:?}\n{help}");
}

#[test]
fn an_old_variable_still_works_and_warns() {
    // Taken (the run stops at the missing TLS files of --standalone), and the log says which
    // variable to use instead.
    let out = Command::new(BIN)
        .args(["--node-name", "n1", "--standalone", "--log-format", "json"])
        .env("SMOLVM_GUEST_ROLLOUT_PORT", "10099")
        .env_remove("SMOLVM_RUNTIME_GUEST_ROLLOUT_PORT")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.lines().any(|l| l.contains("DeprecatedFlag")
            && l.contains("SMOLVM_GUEST_ROLLOUT_PORT")
            && l.contains("SMOLVM_RUNTIME_GUEST_ROLLOUT_PORT")),
        "{log}"
    );
}
