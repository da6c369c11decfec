//! The workload generator: a seeded, bounded stream of SmolVM operations at a set rate across a
//! few namespaces, each with the outcome its client waits for within a deadline. A pure function
//! of the seed, the time it issues for and the parameters.
//!
//! The generator keeps a model of the VMs it made and their spec (running, suspended, pooled,
//! size), so every operation is one the API admits and targets a VM that exists at that point: a
//! resize only a VM that is not suspended nor pooled (V13, V14), a suspend only one that runs, a
//! resume only a suspended one, a start only a stopped one; a delete removes the VM from the
//! model, and no later operation names it. A VM is not targeted again within `busy` of its last
//! operation, so its client has that long to see the outcome before the spec changes again (a
//! later operation supersedes an earlier one's wait). Every run holds at least `minimum_each`
//! operations of every kind: when the operations left only just cover what is still missing, the
//! generator picks the missing kinds, or the operation that makes one possible (a suspend before
//! a resume, a create before a resize).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::rng::{Rng, Stream};
use crate::{Error, Result};

/// A kind of operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// Create a SmolVM (from a size).
    Create,
    /// Change a SmolVM's CPUs and memory.
    Resize,
    /// `spec.running: false`.
    Stop,
    /// `spec.running: true`.
    Start,
    /// `spec.suspended: true`.
    Suspend,
    /// `spec.suspended: false`.
    Resume,
    /// Create a SmolVM with `spec.poolRef` (a pool claim).
    Claim,
    /// Delete a SmolVM.
    Delete,
}

impl OpKind {
    /// Every kind.
    pub const ALL: [OpKind; 8] = [
        OpKind::Create,
        OpKind::Resize,
        OpKind::Stop,
        OpKind::Start,
        OpKind::Suspend,
        OpKind::Resume,
        OpKind::Claim,
        OpKind::Delete,
    ];

    /// The name the report uses.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Create => "create",
            OpKind::Resize => "resize",
            OpKind::Stop => "stop",
            OpKind::Start => "start",
            OpKind::Suspend => "suspend",
            OpKind::Resume => "resume",
            OpKind::Claim => "claim",
            OpKind::Delete => "delete",
        }
    }

    fn index(self) -> usize {
        OpKind::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }

    /// How often the generator picks this kind, where nothing is missing.
    fn weight(self) -> u64 {
        match self {
            OpKind::Create => 3,
            OpKind::Stop | OpKind::Start => 1,
            _ => 2,
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a client waits for after an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Outcome {
    /// Phase Running.
    Running,
    /// Phase Failed with reason StartFailed: where no guest boots (a flag of the run).
    StartFailed,
    /// Phase Suspended.
    Suspended,
    /// Phase Stopped.
    Stopped,
    /// The SmolVM no longer exists.
    Gone,
}

impl Outcome {
    /// The name as status spells it (`Gone` for a deleted object).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Running => "Running",
            Outcome::StartFailed => "StartFailed",
            Outcome::Suspended => "Suspended",
            Outcome::Stopped => "Stopped",
            Outcome::Gone => "Gone",
        }
    }
}

/// A SmolVM by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct VmRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl VmRef {
    /// The VM `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        VmRef {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for VmRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A VM's CPUs and memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Size {
    /// CPUs.
    pub cpus: u32,
    /// Memory in MiB.
    pub memory_mib: u32,
}

/// The sizes creates and resizes choose from (small: the simulated nodes hold many).
pub const SIZES: [Size; 4] = [
    Size {
        cpus: 1,
        memory_mib: 256,
    },
    Size {
        cpus: 1,
        memory_mib: 512,
    },
    Size {
        cpus: 2,
        memory_mib: 512,
    },
    Size {
        cpus: 2,
        memory_mib: 1024,
    },
];

/// One operation of the stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// Its place in the stream, from 0.
    pub seq: u32,
    /// When the generator issues it, from the start of the run.
    pub at: Duration,
    /// What it does.
    pub kind: OpKind,
    /// The SmolVM it creates or changes.
    pub vm: VmRef,
    /// The size, for a create or a resize.
    pub size: Option<Size>,
    /// The pool, for a claim.
    pub pool: Option<String>,
    /// What its client waits for.
    pub expect: Outcome,
    /// How long its client waits, from `at`.
    pub deadline: Duration,
}

/// The generator's parameters; the defaults are the tier's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadParams {
    /// Operations per minute.
    pub per_minute: u32,
    /// The namespaces VMs are created in.
    pub namespaces: Vec<String>,
    /// The SmolVMPool (in each namespace) claims name.
    pub pool: String,
    /// At most this many VMs exist at once.
    pub max_live: usize,
    /// At least this many operations of every kind.
    pub minimum_each: u32,
    /// A VM is not targeted again within this of its last operation.
    pub busy: Duration,
    /// How long a client waits for its outcome.
    pub deadline: Duration,
    /// Whether guests boot in this run (false: a start is expected to fail, StartFailed).
    pub guests_boot: bool,
}

impl Default for WorkloadParams {
    fn default() -> Self {
        WorkloadParams {
            per_minute: 60,
            namespaces: ["soak-a", "soak-b", "soak-c"].map(String::from).to_vec(),
            pool: "soak-pool".to_string(),
            max_live: 24,
            minimum_each: 3,
            busy: Duration::from_secs(10),
            deadline: Duration::from_secs(120),
            guests_boot: true,
        }
    }
}

/// The spec of a VM as the generator last wrote it.
#[derive(Clone, Copy, Debug)]
struct Vm {
    running: bool,
    suspended: bool,
    pooled: bool,
    size: Size,
    free_at: Duration,
}

impl Vm {
    /// What a client waits for, given this spec: `running: false` wins, then a start that fails
    /// where no guest boots, then suspension.
    fn outcome(&self, guests_boot: bool) -> Outcome {
        match (self.running, guests_boot, self.suspended) {
            (false, _, _) => Outcome::Stopped,
            (true, false, _) => Outcome::StartFailed,
            (true, true, true) => Outcome::Suspended,
            (true, true, false) => Outcome::Running,
        }
    }

    /// Whether an operation of `kind` may target this VM (a create or a claim targets none).
    fn admits(&self, kind: OpKind) -> bool {
        match kind {
            OpKind::Create | OpKind::Claim => false,
            OpKind::Resize => !self.pooled && !self.suspended,
            OpKind::Stop => self.running,
            OpKind::Start => !self.running,
            OpKind::Suspend => self.running && !self.suspended,
            OpKind::Resume => self.suspended,
            OpKind::Delete => true,
        }
    }
}

/// The generator's model: the VMs that exist and how many operations of each kind it made.
struct Model<'a> {
    params: &'a WorkloadParams,
    vms: BTreeMap<VmRef, Vm>,
    counts: [u32; 8],
}

impl Model<'_> {
    /// The VMs an operation of `kind` may target now.
    fn candidates(&self, kind: OpKind, now: Duration) -> Vec<&VmRef> {
        self.vms
            .iter()
            .filter(|(_, vm)| vm.free_at <= now && vm.admits(kind))
            .map(|(r, _)| r)
            .collect()
    }

    fn feasible(&self, kind: OpKind, now: Duration) -> bool {
        match kind {
            OpKind::Create | OpKind::Claim => self.vms.len() < self.params.max_live,
            _ => !self.candidates(kind, now).is_empty(),
        }
    }

    /// How many operations of each kind are still missing.
    fn missing(&self) -> Vec<(OpKind, u32)> {
        OpKind::ALL
            .into_iter()
            .map(|k| (k, self.params.minimum_each.saturating_sub(self.counts[k.index()])))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// The operation that brings `kind` closer to being possible.
    fn enabler(&self, kind: OpKind, now: Duration) -> Option<OpKind> {
        let first = match kind {
            OpKind::Start => Some(OpKind::Stop),
            OpKind::Resume => Some(OpKind::Suspend),
            _ => None,
        };
        [first, Some(OpKind::Create), Some(OpKind::Delete)]
            .into_iter()
            .flatten()
            .find(|k| *k != kind && self.feasible(*k, now))
    }

    /// The next kind: a missing one (or its enabler) when `catch_up`, else by weight.
    fn choose(&self, rng: &mut Rng, now: Duration, catch_up: bool) -> Option<OpKind> {
        if catch_up {
            let missing: Vec<OpKind> = self.missing().into_iter().map(|(k, _)| k).collect();
            let ready: Vec<OpKind> = missing.iter().copied().filter(|k| self.feasible(*k, now)).collect();
            if let Some(kind) = rng.pick(&ready) {
                return Some(*kind);
            }
            if let Some(kind) = missing.iter().find_map(|k| self.enabler(*k, now)) {
                return Some(kind);
            }
        }
        let weights: Vec<u64> = OpKind::ALL
            .iter()
            .map(|k| if self.feasible(*k, now) { k.weight() } else { 0 })
            .collect();
        rng.weighted(&weights).and_then(|i| OpKind::ALL.get(i).copied())
    }

    /// Makes one operation of `kind` at `now` (as `seq`), and applies it to the model.
    fn make(&mut self, rng: &mut Rng, kind: OpKind, seq: u32, now: Duration) -> Option<Operation> {
        let params = self.params;
        let free_at = now + params.busy;
        let (vm, size, pool) = match kind {
            OpKind::Create | OpKind::Claim => {
                let namespace = rng.pick(&params.namespaces)?.clone();
                let prefix = if kind == OpKind::Claim { "claim" } else { "vm" };
                let vm = VmRef::new(namespace, format!("{prefix}-{seq:04}"));
                let size = *rng.pick(&SIZES)?;
                let pooled = kind == OpKind::Claim;
                let model = Vm {
                    running: true,
                    suspended: false,
                    pooled,
                    size,
                    free_at,
                };
                self.vms.insert(vm.clone(), model);
                let pool = pooled.then(|| params.pool.clone());
                (vm, (!pooled).then_some(size), pool)
            }
            _ => {
                let vm = (*rng.pick(&self.candidates(kind, now))?).clone();
                let model = self.vms.get_mut(&vm)?;
                let mut size = None;
                match kind {
                    OpKind::Resize => {
                        let others: Vec<Size> = SIZES.into_iter().filter(|s| *s != model.size).collect();
                        model.size = *rng.pick(&others)?;
                        size = Some(model.size);
                    }
                    OpKind::Stop | OpKind::Start => model.running = kind == OpKind::Start,
                    OpKind::Suspend | OpKind::Resume => model.suspended = kind == OpKind::Suspend,
                    _ => {}
                }
                model.free_at = free_at;
                (vm, size, None)
            }
        };
        let expect = match kind {
            OpKind::Delete => {
                self.vms.remove(&vm);
                Outcome::Gone
            }
            _ => self.vms.get(&vm)?.outcome(params.guests_boot),
        };
        self.counts[kind.index()] += 1;
        Some(Operation {
            seq,
            at: now,
            kind,
            vm,
            size,
            pool,
            expect,
            deadline: params.deadline,
        })
    }
}

/// The operations of a run that issues them from its start until `until`.
pub fn workload(seed: u64, until: Duration, params: &WorkloadParams) -> Result<Vec<Operation>> {
    let bad = |why: &str| Err(Error::Workload(why.to_string()));
    if params.per_minute == 0 {
        return bad("per_minute must be at least 1");
    }
    if params.namespaces.is_empty() {
        return bad("no namespace to create VMs in");
    }
    if params.max_live < 2 {
        return bad("max_live must be at least 2 (a VM to change and one to create)");
    }
    let interval = Duration::from_secs(60) / params.per_minute;
    let total = u32::try_from(until.as_nanos() / interval.as_nanos().max(1)).unwrap_or(u32::MAX);
    let busy_ticks = u32::try_from(params.busy.as_nanos() / interval.as_nanos().max(1)).unwrap_or(u32::MAX);
    // Each missing operation takes at most four (a delete for room, a create, a suspend, the
    // resume), and a chain waits out `busy` between its steps.
    let need = |missing: u32| {
        missing
            .saturating_mul(4)
            .saturating_add(busy_ticks.saturating_mul(2))
            .saturating_add(8)
    };
    let all_missing = params.minimum_each.saturating_mul(OpKind::ALL.len() as u32);
    if total < need(all_missing) {
        return Err(Error::TooShort {
            length: until,
            why: format!(
                "{total} operations at {} a minute cannot hold {} of each of the {} kinds (that takes {})",
                params.per_minute,
                params.minimum_each,
                OpKind::ALL.len(),
                need(all_missing)
            ),
        });
    }
    let mut rng = Rng::stream(seed, Stream::Workload);
    let mut model = Model {
        params,
        vms: BTreeMap::new(),
        counts: [0; 8],
    };
    let mut operations = Vec::new();
    for seq in 0..total {
        let now = interval * seq;
        let missing: u32 = model.missing().iter().map(|(_, n)| n).sum();
        let catch_up = total - seq <= need(missing);
        if let Some(kind) = model.choose(&mut rng, now, catch_up)
            && let Some(operation) = model.make(&mut rng, kind, seq, now)
        {
            operations.push(operation);
        }
    }
    Ok(operations)
}

/// How many operations of each kind, in [`OpKind::ALL`]'s order.
pub fn counts(operations: &[Operation]) -> [usize; 8] {
    let mut counts = [0; 8];
    for operation in operations {
        counts[operation.kind.index()] += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The default run issues for 150 s (3 minutes less the 30 s cool-down).
    const DEFAULT_UNTIL: Duration = Duration::from_secs(150);

    fn run(seed: u64, until: Duration, params: &WorkloadParams) -> Vec<Operation> {
        workload(seed, until, params).expect("a workload")
    }

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        let params = WorkloadParams::default();
        for seed in 0..30 {
            assert_eq!(run(seed, DEFAULT_UNTIL, &params), run(seed, DEFAULT_UNTIL, &params));
        }
        assert_ne!(run(1, DEFAULT_UNTIL, &params), run(2, DEFAULT_UNTIL, &params));
    }

    #[test]
    fn every_kind_meets_its_minimum_for_many_seeds() {
        let params = WorkloadParams::default();
        let cases = [(DEFAULT_UNTIL, 300u64), (Duration::from_secs(870), 40)];
        for (until, seeds) in cases {
            for seed in 0..seeds {
                let counts = counts(&run(seed, until, &params));
                for (kind, n) in OpKind::ALL.iter().zip(counts) {
                    assert!(n >= 3, "seed {seed}, {until:?}: {n} {kind} ({counts:?})");
                }
            }
        }
        // A higher minimum is met too, where the run holds it.
        let strict = WorkloadParams {
            minimum_each: 10,
            ..WorkloadParams::default()
        };
        for seed in 0..50 {
            assert!(
                counts(&run(seed, Duration::from_secs(600), &strict))
                    .iter()
                    .all(|n| *n >= 10),
                "seed {seed}"
            );
        }
    }

    /// The spec a VM has after the operations so far, rebuilt from the stream alone:
    /// (running, suspended, pooled, last operation's time).
    type Spec = (bool, bool, bool, Duration);

    /// Replays `operations` and returns what is wrong with the first one that is not possible.
    fn replay(operations: &[Operation], params: &WorkloadParams) -> Result<(), String> {
        let mut vms: BTreeMap<VmRef, Spec> = BTreeMap::new();
        let mut ever: std::collections::BTreeSet<VmRef> = Default::default();
        for op in operations {
            let fail = |why: &str| Err(format!("#{} {} {}: {why}", op.seq, op.kind, op.vm));
            if matches!(op.kind, OpKind::Create | OpKind::Claim) {
                if !ever.insert(op.vm.clone()) {
                    return fail("a name used before");
                }
                if (op.kind == OpKind::Claim) != op.pool.is_some() || (op.kind == OpKind::Create) != op.size.is_some() {
                    return fail("a claim names its pool, a create its size");
                }
                vms.insert(op.vm.clone(), (true, false, op.kind == OpKind::Claim, op.at));
            } else {
                let Some(spec) = vms.get_mut(&op.vm) else {
                    return fail("a VM the model says does not exist");
                };
                if op.at < spec.3 + params.busy {
                    return fail("the VM is still busy with its last operation");
                }
                let (running, suspended, pooled, _) = *spec;
                let admitted = match op.kind {
                    OpKind::Resize => !pooled && !suspended && op.size.is_some(),
                    OpKind::Stop => running,
                    OpKind::Start => !running,
                    OpKind::Suspend => running && !suspended,
                    OpKind::Resume => suspended,
                    _ => true,
                };
                if !admitted {
                    return fail("not admitted on this VM's spec");
                }
                match op.kind {
                    OpKind::Stop | OpKind::Start => spec.0 = op.kind == OpKind::Start,
                    OpKind::Suspend | OpKind::Resume => spec.1 = op.kind == OpKind::Suspend,
                    _ => {}
                }
                spec.3 = op.at;
                if op.kind == OpKind::Delete {
                    vms.remove(&op.vm);
                }
            }
            let expect = match vms.get(&op.vm) {
                None => Outcome::Gone,
                Some((false, ..)) => Outcome::Stopped,
                Some(_) if !params.guests_boot => Outcome::StartFailed,
                Some((true, true, ..)) => Outcome::Suspended,
                Some(_) => Outcome::Running,
            };
            if op.expect != expect {
                return fail(&format!("expects {:?}, the spec gives {expect:?}", op.expect));
            }
            if vms.len() > params.max_live {
                return fail("more VMs than max_live");
            }
        }
        Ok(())
    }

    #[test]
    fn no_operation_targets_a_vm_the_model_says_is_gone() {
        let cases = [
            WorkloadParams::default(),
            WorkloadParams {
                guests_boot: false,
                ..WorkloadParams::default()
            },
            WorkloadParams {
                max_live: 2,
                busy: Duration::ZERO,
                minimum_each: 1,
                ..WorkloadParams::default()
            },
            WorkloadParams {
                per_minute: 600,
                max_live: 5,
                ..WorkloadParams::default()
            },
        ];
        for params in cases {
            for seed in 0..100 {
                let operations = run(seed, DEFAULT_UNTIL, &params);
                assert_eq!(replay(&operations, &params), Ok(()), "seed {seed}, {params:?}");
            }
        }
    }

    #[test]
    fn the_stream_keeps_its_rate_and_bounds() {
        let cases = [
            (DEFAULT_UNTIL, 60, 150),
            (Duration::from_secs(870), 60, 870),
            (DEFAULT_UNTIL, 120, 300),
        ];
        for (until, per_minute, expected) in cases {
            let params = WorkloadParams {
                per_minute,
                ..WorkloadParams::default()
            };
            for seed in 0..20 {
                let operations = run(seed, until, &params);
                assert_eq!(operations.len(), expected, "seed {seed}: one operation per tick");
                let interval = Duration::from_secs(60) / per_minute;
                for (i, op) in (0u32..).zip(&operations) {
                    assert_eq!((op.seq, op.at), (i, interval * i));
                    assert!(op.at < until);
                    assert_eq!(op.deadline, params.deadline);
                    assert!(params.namespaces.contains(&op.vm.namespace));
                }
            }
        }
    }

    #[test]
    fn where_no_guest_boots_a_start_is_expected_to_fail() {
        let params = WorkloadParams {
            guests_boot: false,
            ..WorkloadParams::default()
        };
        let operations = run(5, DEFAULT_UNTIL, &params);
        let expected = |kind: OpKind| -> std::collections::BTreeSet<Outcome> {
            operations
                .iter()
                .filter(|op| op.kind == kind)
                .map(|op| op.expect)
                .collect()
        };
        let cases = [
            (OpKind::Create, vec![Outcome::StartFailed]),
            (OpKind::Claim, vec![Outcome::StartFailed]),
            (OpKind::Stop, vec![Outcome::Stopped]),
            (OpKind::Delete, vec![Outcome::Gone]),
        ];
        for (kind, outcomes) in cases {
            assert_eq!(expected(kind), outcomes.into_iter().collect(), "{kind}");
        }
        let booting = run(5, DEFAULT_UNTIL, &WorkloadParams::default());
        assert!(booting.iter().any(|op| op.expect == Outcome::Suspended));
        assert!(
            booting
                .iter()
                .filter(|op| op.kind == OpKind::Create)
                .all(|op| op.expect == Outcome::Running)
        );
    }

    #[test]
    fn parameters_that_cannot_work_say_why() {
        let cases: [(&str, Duration, WorkloadParams, &str); 5] = [
            (
                "too short",
                Duration::from_secs(60),
                WorkloadParams::default(),
                "TooShort",
            ),
            (
                "too slow",
                DEFAULT_UNTIL,
                WorkloadParams {
                    per_minute: 20,
                    ..WorkloadParams::default()
                },
                "TooShort",
            ),
            (
                "no rate",
                DEFAULT_UNTIL,
                WorkloadParams {
                    per_minute: 0,
                    ..WorkloadParams::default()
                },
                "InvalidWorkload",
            ),
            (
                "no namespace",
                DEFAULT_UNTIL,
                WorkloadParams {
                    namespaces: vec![],
                    ..WorkloadParams::default()
                },
                "InvalidWorkload",
            ),
            (
                "no room",
                DEFAULT_UNTIL,
                WorkloadParams {
                    max_live: 1,
                    ..WorkloadParams::default()
                },
                "InvalidWorkload",
            ),
        ];
        for (name, until, params, reason) in cases {
            let error = workload(1, until, &params).expect_err(name);
            assert_eq!(error.reason(), reason, "{name}: {error}");
        }
    }
}
