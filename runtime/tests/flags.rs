//! The `smolvm-runtime` binary speaks the shared flag vocabulary: its `--help` shows the shared
//! names and no retired spelling, and a retired variable still works, with a warning.

use std::process::Command;

use smolvm_testkit::flags::{assert_help_speaks_the_vocabulary, deprecation_warnings};

const BIN: &str = env!("CARGO_BIN_EXE_smolvm-runtime");

#[test]
fn help_uses_the_shared_flag_names() {
    assert_help_speaks_the_vocabulary(BIN, "SMOLVM_RUNTIME_", smolvm_runtime::cli::RENAMED);
}

#[test]
fn an_old_variable_still_works_and_warns() {
    // Taken (the run stops at the missing TLS files of --standalone), and the log says which
    // variable to use instead.
    let mut command = Command::new(BIN);
    command
        .args(["--node-name", "n1", "--standalone"])
        .env("SMOLVM_GUEST_ROLLOUT_PORT", "10099")
        .env_remove("SMOLVM_RUNTIME_GUEST_ROLLOUT_PORT");
    let warnings = deprecation_warnings(command);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("SMOLVM_GUEST_ROLLOUT_PORT") && w.contains("SMOLVM_RUNTIME_GUEST_ROLLOUT_PORT")),
        "{warnings:?}"
    );
}
