//! The `smolvm-webhook` binary speaks the shared flag vocabulary: its `--help` shows the shared
//! names and no retired spelling, and a retired spelling still works, with a warning.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_smolvm-webhook");

#[test]
fn help_uses_the_shared_flag_names() {
    let out = Command::new(BIN).arg("--help").output().expect("run --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let problems = smolvm_kit::cli::help_problems(&help, "SMOLVM_WEBHOOK_", smolvm_webhook::cli::RENAMED);
    assert!(problems.is_empty(), "{problems:?}\n{help}");
}

#[test]
fn an_old_flag_still_works_and_warns() {
    // The old spelling is taken (the run gets as far as the certificate files, which are
    // missing), and the log says which flag to use instead.
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args([
            "--ops-listen",
            "127.0.0.1:0",
            "--without-cluster",
            "--log-format",
            "json",
        ])
        .arg("--tls-cert")
        .arg(dir.path().join("missing.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("missing.key"))
        .env_remove("SMOLVM_WEBHOOK_OPS_ADDRESS")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    let warning = log
        .lines()
        .find(|l| l.contains("DeprecatedFlag"))
        .unwrap_or_else(|| panic!("no deprecation warning:\n{log}"));
    assert!(
        warning.contains("--ops-listen") && warning.contains("--ops-address"),
        "{warning}"
    );
    assert!(warning.contains("\"level\":\"WARN\""), "{warning}");
}
