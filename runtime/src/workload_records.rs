//! The agent's record of each machine's workload, as digests ([`WorkloadDigests`]): smolvm does
//! not echo a machine's entrypoint, command, working directory, environment or restart policy,
//! so the agent keeps their SHA-256 digests to answer a repeated create: identical returns the
//! machine, different names the fields. One small file per machine, written after smolvm created
//! it and removed with it; a digest never carries a value in the clear.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::state_files::MachineFiles;

/// SHA-256 (hex) of each workload field, by its wire name. smolvm does not echo a machine's
/// workload, so the agent keeps these to keep create idempotent across its restarts.
pub type WorkloadDigests = BTreeMap<String, String>;

/// Where the records live (a directory under the agent's state directory).
#[derive(Debug, Clone)]
pub struct WorkloadRecords {
    files: MachineFiles,
}

impl WorkloadRecords {
    /// Records kept in `dir` (created when first needed).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            files: MachineFiles::new(dir),
        }
    }

    /// The record of `machine`; `None` when there is none or it cannot be read (then the
    /// workload is not compared).
    pub fn read(&self, machine: &str) -> Option<WorkloadDigests> {
        serde_json::from_slice(&self.files.read(machine)?).ok()
    }

    /// Writes the record of `machine` (a new file renamed into place, owner-only).
    pub fn write(&self, machine: &str, digests: &WorkloadDigests) -> std::io::Result<()> {
        self.files.write(machine, digests)
    }

    /// Forgets `machine` (nothing to do when there is no record).
    pub fn remove(&self, machine: &str) {
        self.files.remove(machine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = WorkloadRecords::new(dir.path().join("workloads"));
        assert_eq!(records.read("svm-a"), None);
        let digests: WorkloadDigests = [("workload.command".to_string(), "ab".to_string())].into();
        records.write("svm-a", &digests).expect("write");
        assert_eq!(records.read("svm-a"), Some(digests));
        let mode = std::fs::metadata(dir.path().join("workloads/svm-a.json"))
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .expect("metadata");
        assert_eq!(mode, 0o600);
        records.remove("svm-a");
        assert_eq!(records.read("svm-a"), None);
        records.remove("svm-a");
    }
}
