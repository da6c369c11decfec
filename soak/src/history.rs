//! What the runner records and the checker reads: a history of timestamped observations, kept
//! as JSON lines (one [`Observation`] a line), so a run's history can be checked again offline
//! and a violation it holds turned into a test that needs no soak.
//!
//! How the runner records, so the checks hold what they claim:
//! - a SmolVM as its watch sees it ([`Event::Vm`]), and its deletion ([`Event::VmGone`]);
//! - a node's allocatable with what the controller's ledger books there and what the node
//!   reports it runs ([`Event::Node`]), and whether its agent answered;
//! - the full list of `svm-*` machines on a node ([`Event::Machines`]), stamped with the time the
//!   listing was *asked for*, so a machine in it was there at that time or later;
//! - each write of the generator once the API acknowledged it ([`Event::Ack`]), except a delete,
//!   recorded before it is sent (so the deletion's watch event never comes first);
//! - each fault as it is injected ([`Event::Fault`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::schedule::{FaultKind, Target};
use crate::workload::{OpKind, Outcome, VmRef};
use crate::{Error, Result};

/// A SmolVM's phase, as status spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Waiting for a node.
    Pending,
    /// Bound; the machine is not created yet.
    Scheduled,
    /// The node is creating the machine.
    Creating,
    /// The machine runs.
    Running,
    /// The machine exists and is stopped.
    Stopped,
    /// The machine is suspended.
    Suspended,
    /// The node could not create or start the machine.
    Failed,
    /// The node cannot be reached.
    Unknown,
    /// The machine is being removed.
    Deleting,
}

/// CPU, memory and storage on a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// CPUs.
    pub cpus: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Storage in MiB.
    pub storage_mib: u64,
}

impl Resources {
    /// The dimensions in which `self` is more than `limit`, as `cpus 5 > 4`.
    pub fn beyond(&self, limit: &Resources) -> Vec<String> {
        [
            ("cpus", self.cpus, limit.cpus),
            ("memory", self.memory_mib, limit.memory_mib),
            ("storage", self.storage_mib, limit.storage_mib),
        ]
        .into_iter()
        .filter(|(_, have, most)| have > most)
        .map(|(what, have, most)| format!("{what} {have} > {most}"))
        .collect()
    }
}

/// A SmolVM as seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmSeen {
    /// `metadata.uid`.
    pub uid: String,
    /// Namespace and name.
    pub vm: VmRef,
    /// `status.nodeName`.
    #[serde(default)]
    pub node_name: Option<String>,
    /// `status.nodeUID`.
    #[serde(default, rename = "nodeUID")]
    pub node_uid: Option<String>,
    /// `status.phase`.
    #[serde(default)]
    pub phase: Option<Phase>,
    /// Why it is not as its spec asks, where it says (the Ready condition's reason while Ready is
    /// not True, or the reason of the condition that blocks it: DeletionBlocked, Unschedulable).
    #[serde(default)]
    pub reason: Option<String>,
    /// `metadata.finalizers`.
    #[serde(default)]
    pub finalizers: Vec<String>,
    /// `metadata.deletionTimestamp` is set.
    #[serde(default)]
    pub deletion_requested: bool,
    /// The force annotation (`vm.smolvm.dev/force-delete-local-state: "true"`) is set.
    #[serde(default)]
    pub force_delete: bool,
    /// Its node holds saved (suspended) state for it, as status reports.
    #[serde(default)]
    pub saved_state: bool,
    /// `spec.running`, defaults applied.
    #[serde(default)]
    pub running: bool,
    /// `spec.suspended`, defaults applied.
    #[serde(default)]
    pub suspended: bool,
}

/// A node as seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSeen {
    /// The SmolVMNode's name.
    pub node: String,
    /// Its agent answered.
    pub reachable: bool,
    /// What it offers.
    pub allocatable: Resources,
    /// What the controller's ledger books there, where known.
    #[serde(default)]
    pub ledger: Option<Resources>,
    /// What the node reports its machines take, where it answered.
    #[serde(default)]
    pub reported: Option<Resources>,
    /// What makes up `ledger`, one entry a SmolVM (`namespace/name phase cpus/memory`), so a
    /// violation shows which SmolVMs booked what.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub booked_by: Vec<String>,
}

/// A write of the generator the API acknowledged (a delete: one it sent).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ack {
    /// The operation's place in the stream.
    pub seq: u32,
    /// What it did.
    pub kind: OpKind,
    /// The SmolVM it wrote.
    pub vm: VmRef,
    /// What its client waits for.
    pub expect: Outcome,
    /// The SmolVM's uid, from the answer to a create.
    #[serde(default)]
    pub uid: Option<String>,
}

/// What was observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Event {
    /// A SmolVM seen.
    Vm(VmSeen),
    /// A SmolVM deleted from the API (its finalizers gone).
    VmGone {
        /// Its uid.
        uid: String,
        /// Namespace and name.
        vm: VmRef,
    },
    /// A node seen.
    Node(NodeSeen),
    /// Every `svm-*` machine on a node.
    Machines {
        /// The SmolVMNode's name.
        node: String,
        /// The machines' names.
        machines: Vec<String>,
    },
    /// A write of the generator.
    Ack(Ack),
    /// A fault injected.
    Fault {
        /// Its kind.
        kind: FaultKind,
        /// What it fell on.
        target: Target,
    },
}

/// One entry of a history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// When, from the start of the run (as milliseconds in JSON: `atMs`).
    #[serde(rename = "atMs", with = "millis")]
    pub at: Duration,
    /// What.
    #[serde(flatten)]
    pub event: Event,
}

impl Observation {
    /// `event` at `at`.
    pub fn new(at: Duration, event: Event) -> Self {
        Observation { at, event }
    }

    /// This observation as one JSON line (no newline).
    pub fn to_json_line(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| Error::History {
            line: 0,
            message: e.to_string(),
        })
    }
}

/// The observations of a history in JSON lines (blank lines skipped).
pub fn parse(text: &str) -> Result<Vec<Observation>> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| Error::History {
                line: i + 1,
                message: e.to_string(),
            })
        })
        .collect()
}

/// A duration as whole milliseconds.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(at: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(at.as_millis()).unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen() -> VmSeen {
        VmSeen {
            uid: "u1".into(),
            vm: VmRef::new("soak-a", "vm-0001"),
            node_name: Some("node-0".into()),
            node_uid: Some("n0".into()),
            phase: Some(Phase::Running),
            reason: None,
            finalizers: vec!["vm.smolvm.dev/node-cleanup".into()],
            deletion_requested: false,
            force_delete: false,
            saved_state: false,
            running: true,
            suspended: false,
        }
    }

    #[test]
    fn every_event_survives_a_json_line() {
        let node = NodeSeen {
            node: "node-0".into(),
            reachable: true,
            allocatable: Resources {
                cpus: 4,
                memory_mib: 4096,
                storage_mib: 10240,
            },
            ledger: Some(Resources {
                cpus: 2,
                ..Resources::default()
            }),
            reported: None,
            booked_by: vec!["soak-a/vm-0001 Running 2/512".into()],
        };
        let ack = Ack {
            seq: 3,
            kind: OpKind::Claim,
            vm: VmRef::new("soak-b", "claim-0003"),
            expect: Outcome::Running,
            uid: None,
        };
        let events = [
            Event::Vm(seen()),
            Event::VmGone {
                uid: "u1".into(),
                vm: VmRef::new("soak-a", "vm-0001"),
            },
            Event::Node(node),
            Event::Machines {
                node: "node-0".into(),
                machines: vec!["svm-u1".into()],
            },
            Event::Ack(ack),
            Event::Fault {
                kind: FaultKind::Partition,
                target: Target::Node(3),
            },
        ];
        let history: Vec<Observation> = (1..)
            .zip(events)
            .map(|(ms, e)| Observation::new(Duration::from_millis(ms * 1500), e))
            .collect();
        let text: String = history.iter().map(|o| o.to_json_line().expect("json") + "\n").collect();
        assert_eq!(parse(&format!("{text}\n\n")).expect("parse"), history);
    }

    #[test]
    fn lines_read_as_written_by_hand() {
        let cases: [(&str, Result<Observation, &str>); 5] = [
            (
                r#"{"atMs":2500,"type":"fault","kind":"etcd","target":"only"}"#,
                Ok(Observation::new(
                    Duration::from_millis(2500),
                    Event::Fault {
                        kind: FaultKind::Etcd,
                        target: Target::Only,
                    },
                )),
            ),
            (
                r#"{"atMs":10,"type":"vm","uid":"u1","vm":{"namespace":"soak-a","name":"vm-0001"},"nodeName":"node-0","nodeUID":"n0","phase":"Running","finalizers":["vm.smolvm.dev/node-cleanup"],"running":true}"#,
                Ok(Observation::new(Duration::from_millis(10), Event::Vm(seen()))),
            ),
            (r#"{"atMs":1,"type":"weather"}"#, Err("unknown variant")),
            (
                r#"{"type":"fault","kind":"etcd","target":"only"}"#,
                Err("missing field `atMs`"),
            ),
            (r#"{"atMs":1,"type":"vm","uid":"u1"}"#, Err("missing field `vm`")),
        ];
        for (line, expected) in cases {
            match (parse(line), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, vec![want]),
                (Err(Error::History { line: 1, message }), Err(want)) => assert!(message.contains(want), "{message}"),
                (got, want) => panic!("{line}: {got:?}, expected {want:?}"),
            }
        }
        let error = parse("\n{}").expect_err("line 2");
        assert_eq!(
            (error.reason(), error.to_string().starts_with("history line 2:")),
            ("InvalidHistory", true)
        );
    }

    #[test]
    fn resources_say_where_they_are_beyond_a_limit() {
        let limit = Resources {
            cpus: 4,
            memory_mib: 1024,
            storage_mib: 100,
        };
        let cases = [
            (limit, vec![]),
            (Resources::default(), vec![]),
            (Resources { cpus: 5, ..limit }, vec!["cpus 5 > 4"]),
            (
                Resources {
                    memory_mib: 2048,
                    storage_mib: 101,
                    ..limit
                },
                vec!["memory 2048 > 1024", "storage 101 > 100"],
            ),
        ];
        for (have, expected) in cases {
            assert_eq!(have.beyond(&limit), expected, "{have:?}");
        }
    }
}
