//! The invariant checker over a history: SPEC section 4's promises and issue 62's, checked as
//! each observation arrives ([`Checker::observe`] reports a violation as soon as the history
//! shows it) and at the end ([`Checker::finish`]: what only the end can tell, and every
//! violation again with the faults on both sides of it).
//!
//! The checks are written so that a correct product never fails them whatever the runner's
//! lag: a machine breaks a promise only when a listing asked for *after* the fact still shows it
//! (see [`crate::history`] for how the runner stamps its observations).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use crate::Config;
use crate::history::{Ack, Event, NodeSeen, Observation, Phase, VmSeen};
use crate::schedule::{FaultKind, Target};
use crate::workload::{OpKind, Outcome, VmRef};

/// The finalizer the controller keeps on a SmolVM until its node confirmed the machine gone
/// (`smolvm_api::FINALIZER`; this crate stays free of the API's dependencies).
pub const FINALIZER: &str = "vm.smolvm.dev/node-cleanup";
/// The reason a SmolVM ended by its lifecycle carries (SPEC section 2.7).
pub const EXPIRED: &str = "Expired";
/// The reason of a start that failed.
pub const START_FAILED: &str = "StartFailed";
/// What every machine of a SmolVM is named, before its uid.
const MACHINE_PREFIX: &str = "svm-";

/// A promise the checker holds the product to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    /// A SmolVM's binding (nodeName, nodeUID) never changes or clears once set.
    BindingNeverChanges,
    /// No node's booked CPU, memory or storage, by the controller's ledger, exceeds its
    /// allocatable.
    LedgerWithinAllocatable,
    /// No node's booked CPU, memory or storage, as the node reports it, exceeds its allocatable.
    ReportWithinAllocatable,
    /// No machine stays on a node without a live SmolVM of its uid beyond the orphan grace.
    NoOrphanBeyondGrace,
    /// A SmolVM's finalizer goes only after its node confirmed the machine gone (or with the
    /// force annotation while the node is unreachable): no listing of its bound node asked for
    /// after the finalizer went shows the machine.
    FinalizerAfterMachineGone,
    /// Saved (suspended) state is discarded only after `running: false`, the SmolVM's deletion,
    /// its expiry (or consumed by a resume).
    SavedStateKept,
    /// Every SmolVM the generator wrote ends as its last operation expects, or says why not.
    EndsAsExpected,
    /// Every SmolVM the generator was told exists still exists at the end, or it deleted it.
    NoWriteLost,
}

impl Invariant {
    /// Every invariant.
    pub const ALL: [Invariant; 8] = [
        Invariant::BindingNeverChanges,
        Invariant::LedgerWithinAllocatable,
        Invariant::ReportWithinAllocatable,
        Invariant::NoOrphanBeyondGrace,
        Invariant::FinalizerAfterMachineGone,
        Invariant::SavedStateKept,
        Invariant::EndsAsExpected,
        Invariant::NoWriteLost,
    ];

    /// The invariant's stable id.
    pub fn id(self) -> &'static str {
        match self {
            Invariant::BindingNeverChanges => "binding-never-changes",
            Invariant::LedgerWithinAllocatable => "ledger-within-allocatable",
            Invariant::ReportWithinAllocatable => "node-report-within-allocatable",
            Invariant::NoOrphanBeyondGrace => "no-orphan-beyond-grace",
            Invariant::FinalizerAfterMachineGone => "finalizer-after-machine-gone",
            Invariant::SavedStateKept => "saved-state-kept",
            Invariant::EndsAsExpected => "ends-as-expected",
            Invariant::NoWriteLost => "no-write-lost",
        }
    }
}

/// The checker's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckParams {
    /// How long a machine may stay on a node without its SmolVM (the controller's default).
    pub orphan_grace: Duration,
    /// A violation names the faults this close to it, before or after.
    pub fault_window: Duration,
}

impl Default for CheckParams {
    fn default() -> Self {
        CheckParams {
            orphan_grace: Duration::from_secs(600),
            fault_window: Duration::from_secs(60),
        }
    }
}

/// A fault in a history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultSeen {
    /// When it was injected.
    pub at: Duration,
    /// Its kind.
    pub kind: FaultKind,
    /// What it fell on.
    pub target: Target,
}

/// A promise broken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which.
    pub invariant: Invariant,
    /// The object that breaks it (`smolvm NS/NAME (uid U)`, `node N`, `machine M on node N`).
    pub object: String,
    /// When the history showed it.
    pub at: Duration,
    /// What was seen.
    pub detail: String,
    /// The faults within the window around it.
    pub faults: Vec<FaultSeen>,
    /// The run that reproduces it.
    pub config: Config,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.at.as_secs_f64();
        write!(
            f,
            "violation of {} at {at:.1}s: {}: {}; faults around it: ",
            self.invariant.id(),
            self.object,
            self.detail
        )?;
        if self.faults.is_empty() {
            f.write_str("none")?;
        }
        for (i, fault) in self.faults.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(
                f,
                "{sep}{} ({}) at {:.1}s",
                fault.kind,
                fault.target,
                fault.at.as_secs_f64()
            )?;
        }
        write!(
            f,
            "; seed {}, reproduce with {}",
            self.config.seed,
            self.config.reproduce()
        )
    }
}

/// When a SmolVM's finalizer went, from which node, and whether the force annotation allowed
/// it to go without that node.
#[derive(Clone, Debug)]
struct Cleanup {
    at: Duration,
    node: Option<String>,
    forced: bool,
}

/// What the checker knows of one SmolVM (by uid).
#[derive(Clone, Debug, Default)]
struct VmTrack {
    vm: Option<VmRef>,
    binding: Option<(Option<String>, Option<String>)>,
    last: Option<VmSeen>,
    gone: bool,
    cleanup: Option<Cleanup>,
    cleanup_broken: bool,
    saved: bool,
    excused: bool,
}

impl VmTrack {
    fn node(&self) -> Option<String> {
        self.binding.as_ref().and_then(|(name, _)| name.clone())
    }

    fn object(&self, uid: &str) -> String {
        match &self.vm {
            Some(vm) => format!("smolvm {vm} (uid {uid})"),
            None => format!("smolvm uid {uid}"),
        }
    }
}

/// What the checker knows of one node.
#[derive(Clone, Copy, Debug, Default)]
struct NodeTrack {
    unreachable: bool,
    ledger_over: bool,
    reported_over: bool,
}

/// What the generator wrote to one SmolVM.
#[derive(Clone, Debug)]
struct Written {
    created: bool,
    deleted: bool,
    last: Ack,
}

/// A promise broken, before it is stamped.
type Found = (Invariant, String, String);

/// The invariant checker of one run.
#[derive(Clone, Debug)]
pub struct Checker {
    config: Config,
    params: CheckParams,
    vms: BTreeMap<String, VmTrack>,
    uids: BTreeMap<VmRef, String>,
    nodes: BTreeMap<String, NodeTrack>,
    orphans: BTreeMap<(String, String), (Duration, bool)>,
    written: BTreeMap<VmRef, Written>,
    faults: Vec<FaultSeen>,
    violations: Vec<Violation>,
    now: Duration,
}

impl Checker {
    /// A checker for the run `config` names.
    pub fn new(config: Config, params: CheckParams) -> Self {
        Checker {
            config,
            params,
            vms: BTreeMap::new(),
            uids: BTreeMap::new(),
            nodes: BTreeMap::new(),
            orphans: BTreeMap::new(),
            written: BTreeMap::new(),
            faults: Vec::new(),
            violations: Vec::new(),
            now: Duration::ZERO,
        }
    }

    /// Takes the next observation; returns the violations it shows (kept for
    /// [`Checker::finish`] too).
    pub fn observe(&mut self, observation: &Observation) -> Vec<Violation> {
        let at = observation.at;
        self.now = self.now.max(at);
        let found = match &observation.event {
            Event::Vm(seen) => self.on_vm(at, seen),
            Event::VmGone { uid, vm } => self.on_vm_gone(at, uid, vm),
            Event::Node(seen) => self.on_node(seen),
            Event::Machines { node, machines } => self.on_machines(at, node, machines),
            Event::Ack(ack) => self.on_ack(ack),
            Event::Fault { kind, target } => {
                self.faults.push(FaultSeen {
                    at,
                    kind: *kind,
                    target: *target,
                });
                Vec::new()
            }
        };
        let new: Vec<Violation> = found.into_iter().map(|f| self.stamp(at, f)).collect();
        self.violations.extend(new.iter().cloned());
        new
    }

    /// Every violation of the history, those only its end shows included, each with the faults
    /// on both sides of it.
    pub fn finish(mut self) -> Vec<Violation> {
        let end = self.now;
        let found = self.at_the_end();
        let new: Vec<Violation> = found.into_iter().map(|f| self.stamp(end, f)).collect();
        self.violations.extend(new);
        let mut violations = std::mem::take(&mut self.violations);
        for violation in &mut violations {
            violation.faults = self.faults_near(violation.at);
        }
        violations
    }

    fn stamp(&self, at: Duration, (invariant, object, detail): Found) -> Violation {
        Violation {
            invariant,
            object,
            at,
            detail,
            faults: self.faults_near(at),
            config: self.config,
        }
    }

    fn faults_near(&self, at: Duration) -> Vec<FaultSeen> {
        let window = self.params.fault_window;
        self.faults
            .iter()
            .filter(|f| f.at + window >= at && f.at <= at + window)
            .copied()
            .collect()
    }

    fn on_vm(&mut self, at: Duration, seen: &VmSeen) -> Vec<Found> {
        self.uids.insert(seen.vm.clone(), seen.uid.clone());
        let nodes = &self.nodes;
        let track = self.vms.entry(seen.uid.clone()).or_default();
        track.vm = Some(seen.vm.clone());
        let object = track.object(&seen.uid);
        let mut found = Vec::new();
        let binding = (seen.node_name.clone(), seen.node_uid.clone());
        match &track.binding {
            Some(first) if *first != binding => {
                let detail = format!("binding {} became {}", describe(first), describe(&binding));
                found.push((Invariant::BindingNeverChanges, object.clone(), detail));
                track.binding = Some(binding);
            }
            None if binding.0.is_some() || binding.1.is_some() => track.binding = Some(binding),
            _ => {}
        }
        if track.cleanup.is_none() && seen.deletion_requested && !seen.finalizers.iter().any(|f| f == FINALIZER) {
            let node = track.node();
            let unreachable = node
                .as_ref()
                .is_some_and(|n| nodes.get(n).is_some_and(|t| t.unreachable));
            track.cleanup = Some(Cleanup {
                at,
                node,
                forced: seen.force_delete && unreachable,
            });
        }
        let excused_now =
            !seen.running || !seen.suspended || seen.deletion_requested || seen.reason.as_deref() == Some(EXPIRED);
        if track.saved && !seen.saved_state && !track.excused && !excused_now {
            let detail =
                "saved state discarded while spec.running and spec.suspended were true, with no deletion or expiry";
            found.push((Invariant::SavedStateKept, object, detail.to_string()));
        }
        track.excused = seen.saved_state && ((track.saved && track.excused) || excused_now);
        track.saved = seen.saved_state;
        track.last = Some(seen.clone());
        found
    }

    fn on_vm_gone(&mut self, at: Duration, uid: &str, vm: &VmRef) -> Vec<Found> {
        let nodes = &self.nodes;
        let track = self.vms.entry(uid.to_string()).or_default();
        track.vm = Some(vm.clone());
        if track.cleanup.is_none() {
            let node = track.node();
            let unreachable = node
                .as_ref()
                .is_some_and(|n| nodes.get(n).is_some_and(|t| t.unreachable));
            let force = track.last.as_ref().is_some_and(|l| l.force_delete);
            track.cleanup = Some(Cleanup {
                at,
                node,
                forced: force && unreachable,
            });
        }
        track.gone = true;
        let object = track.object(uid);
        match self.written.get(vm) {
            Some(w) if w.created && !w.deleted => {
                let detail = format!(
                    "deleted from the API though the generator never deleted it (created by #{})",
                    w.last.seq
                );
                vec![(Invariant::NoWriteLost, object, detail)]
            }
            _ => Vec::new(),
        }
    }

    fn on_node(&mut self, seen: &NodeSeen) -> Vec<Found> {
        let track = self.nodes.entry(seen.node.clone()).or_default();
        track.unreachable = !seen.reachable;
        let object = format!("node {}", seen.node);
        let mut found = Vec::new();
        let sources = [
            (
                Invariant::LedgerWithinAllocatable,
                "the ledger books",
                seen.ledger,
                &mut track.ledger_over,
            ),
            (
                Invariant::ReportWithinAllocatable,
                "the node reports",
                seen.reported,
                &mut track.reported_over,
            ),
        ];
        for (invariant, who, booked, over) in sources {
            let Some(booked) = booked else { continue };
            let beyond = booked.beyond(&seen.allocatable);
            if !beyond.is_empty() && !*over {
                let mut detail = format!("{who} more than allocatable: {}", beyond.join(", "));
                if invariant == Invariant::LedgerWithinAllocatable && !seen.booked_by.is_empty() {
                    detail.push_str(&format!(" (booked by {})", seen.booked_by.join(", ")));
                }
                found.push((invariant, object.clone(), detail));
            }
            *over = !beyond.is_empty();
        }
        found
    }

    fn on_machines(&mut self, at: Duration, node: &str, machines: &[String]) -> Vec<Found> {
        let grace = self.params.orphan_grace;
        let mut found = Vec::new();
        let listed: BTreeSet<&str> = machines.iter().map(String::as_str).collect();
        for machine in &listed {
            let Some(uid) = machine.strip_prefix(MACHINE_PREFIX) else {
                continue;
            };
            let object = format!("machine {machine} on node {node}");
            let track = self.vms.get_mut(uid);
            let live = track.as_ref().is_some_and(|t| !t.gone);
            if let Some(track) = track
                && let Some(cleanup) = &track.cleanup
                && at > cleanup.at
                && !track.cleanup_broken
                && cleanup.node.as_deref() == Some(node)
                && !cleanup.forced
            {
                let detail = format!(
                    "still on its node {:.1}s after the finalizer of {} went",
                    (at - cleanup.at).as_secs_f64(),
                    track.object(uid)
                );
                track.cleanup_broken = true;
                found.push((Invariant::FinalizerAfterMachineGone, object.clone(), detail));
            }
            let key = (node.to_string(), machine.to_string());
            if live {
                self.orphans.remove(&key);
                continue;
            }
            let (since, reported) = self.orphans.entry(key).or_insert((at, false));
            if at.saturating_sub(*since) > grace && !*reported {
                *reported = true;
                let detail = format!(
                    "no live SmolVM of its uid for {:.1}s (grace {:.0}s)",
                    (at - *since).as_secs_f64(),
                    grace.as_secs_f64()
                );
                found.push((Invariant::NoOrphanBeyondGrace, object, detail));
            }
        }
        self.orphans
            .retain(|(n, m), _| n != node || listed.contains(m.as_str()));
        found
    }

    fn on_ack(&mut self, ack: &Ack) -> Vec<Found> {
        let written = self.written.entry(ack.vm.clone()).or_insert_with(|| Written {
            created: false,
            deleted: false,
            last: ack.clone(),
        });
        match ack.kind {
            OpKind::Create | OpKind::Claim => written.created = true,
            OpKind::Delete => written.deleted = true,
            _ => {}
        }
        written.last = ack.clone();
        // The generator's own `running: false`, resume or delete excuses a discard that the
        // history may never show on the object (a re-list after a restart skips what came
        // between).
        if matches!(ack.kind, OpKind::Stop | OpKind::Resume | OpKind::Delete)
            && let Some(track) = self.uids.get(&ack.vm).and_then(|uid| self.vms.get_mut(uid))
            && track.saved
        {
            track.excused = true;
        }
        Vec::new()
    }

    /// What only the end of the history shows: how each written SmolVM ended.
    fn at_the_end(&self) -> Vec<Found> {
        let mut found = Vec::new();
        for (vm, written) in &self.written {
            let uid = self.uids.get(vm);
            let track = uid.and_then(|uid| self.vms.get(uid).map(|t| (uid, t)));
            let last = &written.last;
            let after = format!("#{} {}", last.seq, last.kind);
            match (last.expect, track) {
                (Outcome::Gone, None) => {}
                // Gone as expected, or (unless deleted) reported when it went.
                (_, Some((_, t))) if t.gone => {}
                (_, Some((uid, t))) => {
                    let Some(seen) = &t.last else { continue };
                    if !ends_as(last.expect, seen) && seen.reason.is_none() {
                        let phase = seen.phase.map_or("with no phase".to_string(), |p| format!("{p:?}"));
                        let detail = format!(
                            "ends {phase} with no reason, after {after} expected {}",
                            last.expect.name()
                        );
                        found.push((Invariant::EndsAsExpected, t.object(uid), detail));
                    }
                }
                (_, None) if written.created => {
                    let detail = format!("acknowledged ({after}) but never seen");
                    found.push((Invariant::NoWriteLost, format!("smolvm {vm}"), detail));
                }
                (_, None) => {}
            }
        }
        found
    }
}

/// Whether `seen` is the outcome `expect` names.
fn ends_as(expect: Outcome, seen: &VmSeen) -> bool {
    match expect {
        Outcome::Running => seen.phase == Some(Phase::Running),
        Outcome::StartFailed => seen.phase == Some(Phase::Failed) && seen.reason.as_deref() == Some(START_FAILED),
        Outcome::Suspended => seen.phase == Some(Phase::Suspended),
        Outcome::Stopped => seen.phase == Some(Phase::Stopped),
        Outcome::Gone => false,
    }
}

fn describe((name, uid): &(Option<String>, Option<String>)) -> String {
    match (name, uid) {
        (None, None) => "(none)".to_string(),
        (name, uid) => format!(
            "{} (uid {})",
            name.as_deref().unwrap_or("-"),
            uid.as_deref().unwrap_or("-")
        ),
    }
}

/// Every violation of a whole history.
pub fn check(config: Config, params: CheckParams, history: &[Observation]) -> Vec<Violation> {
    let mut checker = Checker::new(config, params);
    for observation in history {
        checker.observe(observation);
    }
    checker.finish()
}

#[cfg(test)]
mod tests;
