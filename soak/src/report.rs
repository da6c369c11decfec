//! The lines a soak run ends with, printed as the benchmarks print theirs: for each kind of
//! fault, the time until every SmolVM it affected was reconciled again (p50 and p99 of the
//! runner's samples), then, last, three lines in a fixed form:
//!
//! ```text
//! operations: create=N resize=N suspend=N resume=N claim=N delete=N
//! faults injected: controller=N webhook=N agent=N smolvm=N etcd=N apiserver=N partition=N clock=N
//! invariant violations: N
//! ```
//!
//! The operations line names the kinds issue 62 fixed; stops and starts are counted on the line
//! before it.

use std::time::Duration;

use crate::Plan;
use crate::history::{Event, Observation};
use crate::schedule::FaultKind;
use crate::workload::OpKind;

/// One recovery: after a fault of `kind`, how long until every SmolVM it affected was
/// reconciled again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// The fault's kind.
    pub kind: FaultKind,
    /// From the fault to the last affected SmolVM reconciled.
    pub took: Duration,
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Operations done, by kind, in [`OpKind::ALL`]'s order.
    pub operations: [usize; 8],
    /// Faults injected, by kind, in [`FaultKind::ALL`]'s order.
    pub faults: [usize; 8],
    /// The recoveries measured.
    pub recoveries: Vec<Recovery>,
    /// Invariant violations found.
    pub violations: usize,
}

impl Summary {
    /// The summary of a recorded history: the generator's acknowledged writes and the faults
    /// injected, with the recoveries and the violation count from elsewhere.
    pub fn from_history(history: &[Observation], recoveries: Vec<Recovery>, violations: usize) -> Self {
        let mut summary = Summary {
            recoveries,
            violations,
            ..Summary::default()
        };
        for observation in history {
            match &observation.event {
                Event::Ack(ack) => add(&mut summary.operations, &OpKind::ALL, ack.kind),
                Event::Fault { kind, .. } => add(&mut summary.faults, &FaultKind::ALL, *kind),
                _ => {}
            }
        }
        summary
    }

    /// What a plan does if every operation and every fault goes as planned.
    pub fn planned(plan: &Plan) -> Self {
        let mut summary = Summary::default();
        for operation in &plan.operations {
            add(&mut summary.operations, &OpKind::ALL, operation.kind);
        }
        for fault in &plan.schedule.faults {
            add(&mut summary.faults, &FaultKind::ALL, fault.kind);
        }
        summary
    }

    /// How many operations of `kind`.
    pub fn operations_of(&self, kind: OpKind) -> usize {
        position(&OpKind::ALL, kind)
            .and_then(|i| self.operations.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// The lines to print, in order: a recovery line per fault kind, the stops and starts, then
    /// the three fixed lines.
    pub fn lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = FaultKind::ALL
            .into_iter()
            .map(|kind| {
                let samples: Vec<Duration> = self
                    .recoveries
                    .iter()
                    .filter(|r| r.kind == kind)
                    .map(|r| r.took)
                    .collect();
                recovery_line(kind, &samples)
            })
            .collect();
        lines.push(format!(
            "operations also: stop={} start={}",
            self.operations_of(OpKind::Stop),
            self.operations_of(OpKind::Start)
        ));
        let shown = [
            OpKind::Create,
            OpKind::Resize,
            OpKind::Suspend,
            OpKind::Resume,
            OpKind::Claim,
            OpKind::Delete,
        ];
        let operations: Vec<String> = shown
            .iter()
            .map(|k| format!("{}={}", k.name(), self.operations_of(*k)))
            .collect();
        lines.push(format!("operations: {}", operations.join(" ")));
        let faults: Vec<String> = FaultKind::ALL
            .iter()
            .zip(self.faults)
            .map(|(k, n)| format!("{}={n}", k.name()))
            .collect();
        lines.push(format!("faults injected: {}", faults.join(" ")));
        lines.push(format!("invariant violations: {}", self.violations));
        lines
    }
}

fn position<T: PartialEq>(all: &[T], item: T) -> Option<usize> {
    all.iter().position(|k| *k == item)
}

fn add<T: PartialEq>(counts: &mut [usize; 8], all: &[T], item: T) {
    if let Some(count) = position(all, item).and_then(|i| counts.get_mut(i)) {
        *count += 1;
    }
}

/// The `percent`-th percentile of `samples` by nearest rank (the smallest sample with at least
/// that share of the samples at or below it); None for no samples.
pub fn percentile(samples: &[Duration], percent: u32) -> Option<Duration> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    let rank = (n * usize::try_from(percent.min(100)).ok()?).div_ceil(100).max(1);
    sorted.get(rank.min(n).checked_sub(1)?).copied()
}

/// `recovery after KIND: n=N p50 X s, p99 Y s` (or `n=0` with nothing to say).
pub fn recovery_line(kind: FaultKind, samples: &[Duration]) -> String {
    match (percentile(samples, 50), percentile(samples, 99)) {
        (Some(p50), Some(p99)) => format!(
            "recovery after {kind}: n={} p50 {:.2} s, p99 {:.2} s",
            samples.len(),
            p50.as_secs_f64(),
            p99.as_secs_f64()
        ),
        _ => format!("recovery after {kind}: n=0"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Ack;
    use crate::schedule::Target;
    use crate::workload::{Outcome, VmRef};

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().copied().map(Duration::from_millis).collect()
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let hundred: Vec<u64> = (1..=100).collect();
        let cases: [(Vec<Duration>, u32, Option<u64>); 10] = [
            (vec![], 50, None),
            (ms(&[7]), 50, Some(7)),
            (ms(&[7]), 99, Some(7)),
            (ms(&[4, 1, 3, 2]), 50, Some(2)),
            (ms(&[4, 1, 3, 2]), 99, Some(4)),
            (ms(&[4, 1, 3, 2]), 0, Some(1)),
            (ms(&hundred), 50, Some(50)),
            (ms(&hundred), 99, Some(99)),
            (ms(&hundred), 100, Some(100)),
            (ms(&hundred), 250, Some(100)),
        ];
        for (samples, percent, expected) in cases {
            assert_eq!(
                percentile(&samples, percent),
                expected.map(Duration::from_millis),
                "p{percent} of {samples:?}"
            );
        }
    }

    #[test]
    fn recovery_lines() {
        let cases = [
            (FaultKind::Etcd, ms(&[]), "recovery after etcd: n=0"),
            (
                FaultKind::Controller,
                ms(&[1200]),
                "recovery after controller: n=1 p50 1.20 s, p99 1.20 s",
            ),
            (
                FaultKind::Partition,
                ms(&[61_000, 2_500, 3_000]),
                "recovery after partition: n=3 p50 3.00 s, p99 61.00 s",
            ),
        ];
        for (kind, samples, expected) in cases {
            assert_eq!(recovery_line(kind, &samples), expected);
        }
    }

    #[test]
    fn the_run_ends_with_three_fixed_lines() {
        let summary = Summary {
            operations: [29, 24, 10, 7, 24, 16, 16, 24],
            faults: [1, 2, 3, 4, 5, 6, 7, 8],
            recoveries: vec![Recovery {
                kind: FaultKind::Webhook,
                took: Duration::from_millis(450),
            }],
            violations: 0,
        };
        let lines = summary.lines();
        assert_eq!(lines.len(), FaultKind::ALL.len() + 4);
        assert_eq!(lines[1], "recovery after webhook: n=1 p50 0.45 s, p99 0.45 s");
        assert_eq!(
            lines[FaultKind::ALL.len()..],
            [
                "operations also: stop=10 start=7",
                "operations: create=29 resize=24 suspend=24 resume=16 claim=16 delete=24",
                "faults injected: controller=1 webhook=2 agent=3 smolvm=4 etcd=5 apiserver=6 partition=7 clock=8",
                "invariant violations: 0",
            ]
        );
    }

    #[test]
    fn a_history_counts_its_writes_and_faults() {
        let at = |s| Duration::from_secs(s);
        let write = |kind| {
            Event::Ack(Ack {
                seq: 0,
                kind,
                vm: VmRef::new("soak-a", "vm-0000"),
                expect: Outcome::Running,
                uid: None,
            })
        };
        let history = [
            Observation::new(at(1), write(OpKind::Create)),
            Observation::new(at(2), write(OpKind::Claim)),
            Observation::new(at(3), write(OpKind::Create)),
            Observation::new(
                at(4),
                Event::Fault {
                    kind: FaultKind::Clock,
                    target: Target::Node(1),
                },
            ),
            Observation::new(
                at(5),
                Event::Machines {
                    node: "node-0".into(),
                    machines: vec![],
                },
            ),
        ];
        let summary = Summary::from_history(&history, vec![], 2);
        assert_eq!(summary.operations, [2, 0, 0, 0, 0, 0, 1, 0]);
        assert_eq!(summary.faults, [0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(
            summary.lines().last().map(String::as_str),
            Some("invariant violations: 2")
        );
    }

    #[test]
    fn the_default_plan_summarised() {
        let plan = crate::plan(crate::Config::default(), &Default::default(), &Default::default()).expect("plan");
        let lines = Summary::planned(&plan).lines();
        for line in &lines {
            println!("{line}");
        }
        let fixed = &lines[lines.len() - 3..];
        assert!(fixed[0].starts_with("operations: create="), "{fixed:?}");
        assert_eq!(
            fixed[1],
            "faults injected: controller=1 webhook=1 agent=1 smolvm=1 etcd=1 apiserver=1 partition=1 clock=1"
        );
        assert_eq!(fixed[2], "invariant violations: 0");
    }
}
