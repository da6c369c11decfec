//! The agent's record of the machines it suspended. smolvm's machine state is only `created`,
//! `running` or `stopped`, and a machine it paused reads `stopped`; the agent tells a suspended
//! machine from a stopped one by this record, kept as it keeps its workload records: one small
//! file per machine in the state directory, so it survives an agent restart.
//!
//! The record is the intent: it is written before smolvm is asked to pause, so a crash between
//! the two never loses track of a saved state. What a machine is follows from the record and
//! what smolvm reports ([`is_suspended`]): a stopped machine with a record is suspended; a
//! running one is running whatever the record says (a pause that never happened, or a resume
//! whose record was not yet dropped). A resume that finds nothing saved drops the record.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::state_files::Records;
use crate::vmm::{Machine, MachineState};

/// What the agent records of one suspension.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspension {
    /// When the agent suspended the machine (RFC 3339, the agent's clock, whole seconds).
    pub since: String,
    /// The controller suspended it for idleness (SPEC 2.7), not a user.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
    /// Its published ports keep listening while it sleeps, and a connection wakes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wake_on_traffic: bool,
}

impl Suspension {
    /// A suspension from now.
    pub fn now() -> Self {
        let now = k8s_openapi::jiff::Timestamp::now();
        let since = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
        Self {
            since: since.to_string(),
            idle: false,
            wake_on_traffic: false,
        }
    }

    /// A suspension from now, as `request` asks.
    pub fn asked(request: &smolvm_api::nodeapi::SuspendRequest) -> Self {
        Self {
            idle: request.idle,
            wake_on_traffic: request.idle && request.wake_on_traffic,
            ..Self::now()
        }
    }
}

/// Whether `machine` is suspended, given its record: smolvm reports it stopped and the agent
/// paused it.
pub fn is_suspended(machine: &Machine, record: Option<&Suspension>) -> bool {
    record.is_some() && machine.state == MachineState::Stopped
}

/// Where the records live: a directory under the agent's state directory, or (an agent with no
/// state directory, as some tests run it) this process's memory.
#[derive(Debug)]
pub struct SuspendRecords {
    records: Records<Suspension>,
}

impl SuspendRecords {
    /// Records kept in `dir` (created when first needed).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            records: Records::in_dir(dir),
        }
    }

    /// Records kept in this process's memory only: they go with it.
    pub fn in_memory() -> Self {
        Self {
            records: Records::in_memory(),
        }
    }

    /// The records kept beside the workload records in `workload_dir`: `suspended` in the same
    /// parent directory.
    pub fn beside(workload_dir: &Path) -> Self {
        Self::new(workload_dir.with_file_name("suspended"))
    }

    /// The record of `machine`; `None` when there is none. A record that cannot be read still
    /// says the machine was suspended (its time unknown): losing track of a saved state is
    /// worse than a resume that finds nothing.
    pub fn read(&self, machine: &str) -> Option<Suspension> {
        match self.records.read(machine) {
            Some(record) => Some(record),
            None if self.records.exists(machine) => Some(Suspension {
                since: String::new(),
                idle: false,
                wake_on_traffic: false,
            }),
            None => None,
        }
    }

    /// Writes the record of `machine` (a new file renamed into place, owner-only, synced).
    pub fn write(&self, machine: &str, suspension: &Suspension) -> std::io::Result<()> {
        self.records.write(machine, suspension)
    }

    /// Forgets `machine` (nothing to do when there is no record).
    pub fn remove(&self, machine: &str) {
        self.records.remove(machine);
    }

    /// Of `machines` as smolvm lists them, the names of those suspended for idleness whose
    /// traffic wakes them: their forwards keep listening while they sleep.
    pub fn wakeable_among(&self, machines: &[Machine]) -> std::collections::BTreeSet<String> {
        machines
            .iter()
            .filter(|m| m.state == MachineState::Stopped)
            .filter(|m| self.read(&m.name).is_some_and(|r| r.wake_on_traffic))
            .map(|m| m.name.clone())
            .collect()
    }

    /// The names of the machines with a record, sorted.
    pub fn names(&self) -> Vec<String> {
        self.records.names()
    }

    /// Of `machines` as smolvm lists them, the names of those suspended ([`is_suspended`]),
    /// sorted.
    pub fn suspended_among(&self, machines: &[Machine]) -> Vec<String> {
        let recorded = self.names();
        let mut names: Vec<String> = machines
            .iter()
            .filter(|m| m.state == MachineState::Stopped && recorded.binary_search(&m.name).is_ok())
            .map(|m| m.name.clone())
            .collect();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, state: MachineState) -> Machine {
        let mut m = Machine::created_from(&crate::vmm::MachineSpec::new(name, 1, 256));
        m.state = state;
        m
    }

    #[test]
    fn records_round_trip_and_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = SuspendRecords::beside(&dir.path().join("workloads"));
        assert_eq!(records.read("svm-a"), None);
        assert!(records.names().is_empty());
        let record = Suspension::now();
        assert!(record.since.ends_with('Z') && !record.since.contains('.'), "{record:?}");
        records.write("svm-a", &record).expect("write");
        records.write("svm-b", &record).expect("write");
        assert_eq!(records.read("svm-a"), Some(record));
        assert_eq!(records.names(), vec!["svm-a".to_string(), "svm-b".to_string()]);
        let mode = std::fs::metadata(dir.path().join("suspended/svm-a.json"))
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .expect("metadata");
        assert_eq!(mode, 0o600);
        records.remove("svm-a");
        assert_eq!(records.read("svm-a"), None);
        records.remove("svm-a");
        // An unreadable record still says suspended.
        std::fs::write(dir.path().join("suspended/svm-c.json"), b"{").expect("write");
        assert!(records.read("svm-c").is_some());
    }

    #[test]
    fn suspended_is_stopped_with_a_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        for records in [SuspendRecords::new(dir.path()), SuspendRecords::in_memory()] {
            for name in ["running", "stopped", "created"] {
                records.write(name, &Suspension::now()).expect("write");
            }
            let machines = [
                machine("running", MachineState::Running),
                machine("stopped", MachineState::Stopped),
                machine("created", MachineState::Created),
                machine("plain", MachineState::Stopped),
            ];
            assert_eq!(records.suspended_among(&machines), vec!["stopped".to_string()]);
            records.remove("stopped");
            assert_eq!(records.names(), vec!["created".to_string(), "running".to_string()]);
        }
        let record = Suspension::now();
        let cases = [
            (MachineState::Stopped, true, true),
            (MachineState::Stopped, false, false),
            (MachineState::Running, true, false),
            (MachineState::Created, true, false),
        ];
        for (state, recorded, suspended) in cases {
            let m = machine("m", state);
            assert_eq!(
                is_suspended(&m, recorded.then_some(&record)),
                suspended,
                "{state:?} {recorded}"
            );
        }
    }
}
