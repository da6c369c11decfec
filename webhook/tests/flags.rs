//! The `smolvm-webhook` binary speaks the shared flag vocabulary: its `--help` shows the shared
//! names and no retired spelling, and a retired spelling still works, with a warning.

use std::process::Command;

use smolvm_testkit::flags::{assert_help_speaks_the_vocabulary, deprecation_warnings};

const BIN: &str = env!("CARGO_BIN_EXE_smolvm-webhook");

#[test]
fn help_uses_the_shared_flag_names() {
    assert_help_speaks_the_vocabulary(BIN, "SMOLVM_WEBHOOK_", smolvm_webhook::cli::RENAMED);
}

#[test]
fn an_old_flag_still_works_and_warns() {
    // The old spelling is taken (the run gets as far as the certificate files, which are
    // missing), and the log says which flag to use instead.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(BIN);
    command
        .args(["--ops-listen", "127.0.0.1:0", "--without-cluster"])
        .arg("--tls-cert")
        .arg(dir.path().join("missing.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("missing.key"))
        .env_remove("SMOLVM_WEBHOOK_OPS_ADDRESS");
    let warnings = deprecation_warnings(command);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("--ops-listen") && w.contains("--ops-address")),
        "{warnings:?}"
    );
}
