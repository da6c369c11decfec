//! The shared flag vocabulary, checked on a built binary: its `--help`, and what it logs when
//! started with a retired spelling.

use std::process::Command;

use smolvm_kit::cli::{Renamed, help_problems};

/// Fails the test when `bin --help` breaks the shared vocabulary (see
/// [`smolvm_kit::cli::help_problems`]).
pub fn assert_help_speaks_the_vocabulary(bin: &str, prefix: &str, renamed: &[Renamed]) {
    let out = Command::new(bin).arg("--help").output().expect("run --help");
    assert!(out.status.success(), "{bin} --help failed");
    let help = String::from_utf8_lossy(&out.stdout);
    let problems = help_problems(&help, prefix, renamed);
    assert!(problems.is_empty(), "{problems:?}\n{help}");
}

/// Runs `command` (which is expected to stop on its own, short of what it needs) and returns
/// the `DeprecatedFlag` warnings of its JSON log.
pub fn deprecation_warnings(mut command: Command) -> Vec<String> {
    let out = command.arg("--log-format=json").output().expect("run");
    assert!(!out.status.success(), "the run was expected to stop short");
    let log = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<String> = log
        .lines()
        .filter(|l| l.contains("DeprecatedFlag"))
        .map(str::to_string)
        .collect();
    for warning in &warnings {
        assert!(warning.contains("\"level\":\"WARN\""), "{warning}");
    }
    warnings
}
