//! The fault injector's schedule: which fault falls when, on what, for how long. A pure function
//! of the seed, the run's length and the parameters (whose defaults are the tier's), so a seed
//! names the faults of a run on every machine.
//!
//! The rules it keeps ([`Schedule::rule_breaks`] checks them):
//! - a warm-up before the first fault, so operations are in flight when faults begin, and a
//!   cool-down after the last has ended, so the end state can settle and be checked;
//! - every kind of fault at least once (the default 3-minute run included), then one fault per
//!   `mean_gap` of the fault window on average: longer runs hold more;
//! - no two control-plane faults (etcd and kube-apiserver restarts) overlap: each begins at least
//!   `settle` after the previous one ended. Every other fault may overlap anything (the bugs
//!   that lose data live in the overlaps);
//! - a fault that lasts (a partition, a clock set off) never overlaps another of its kind on the
//!   same node, and ends before the cool-down;
//! - a clock set behind is set further behind than the run is old, by `behind_past`: every
//!   certificate issued since the run began is then not valid yet on that node;
//! - a kill of `smolvm serve` falls while its node's agent runs: not during a clock fault on that
//!   node or within `agent_down` of its end (the agent is restarted at both ends, and one with
//!   its clock set behind cannot obtain its serving certificate and runs no smolvm), nor within
//!   `agent_down` of an agent kill there. Otherwise it kills
//!   nothing, and the run would count a fault that did not fall.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::rng::{Rng, Stream};
use crate::{Error, Result};

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultKind {
    /// SIGKILL of the leading controller replica.
    Controller,
    /// SIGKILL of one webhook replica.
    Webhook,
    /// SIGKILL of a node's runtime agent.
    Agent,
    /// SIGKILL of a node's `smolvm serve`.
    Smolvm,
    /// A restart of etcd.
    Etcd,
    /// A restart of kube-apiserver.
    Apiserver,
    /// A simulated node cut off from the controller (for `partition`, a minute by default).
    Partition,
    /// An agent's clock set minutes off (libfaketime), for `clock`.
    Clock,
}

impl FaultKind {
    /// Every kind, in the report's order.
    pub const ALL: [FaultKind; 8] = [
        FaultKind::Controller,
        FaultKind::Webhook,
        FaultKind::Agent,
        FaultKind::Smolvm,
        FaultKind::Etcd,
        FaultKind::Apiserver,
        FaultKind::Partition,
        FaultKind::Clock,
    ];

    /// The name the report and the logs use.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Controller => "controller",
            FaultKind::Webhook => "webhook",
            FaultKind::Agent => "agent",
            FaultKind::Smolvm => "smolvm",
            FaultKind::Etcd => "etcd",
            FaultKind::Apiserver => "apiserver",
            FaultKind::Partition => "partition",
            FaultKind::Clock => "clock",
        }
    }

    /// A restart of the control plane: the faults that must never overlap each other.
    pub fn is_control_plane(self) -> bool {
        matches!(self, FaultKind::Etcd | FaultKind::Apiserver)
    }

    /// A fault that lasts a while on one node (and then is undone).
    pub fn lasts_on_a_node(self) -> bool {
        matches!(self, FaultKind::Partition | FaultKind::Clock)
    }

    /// The node roles this kind can fall on (none: it does not fall on a node).
    fn node_roles(self) -> &'static [NodeRole] {
        match self {
            FaultKind::Agent | FaultKind::Clock => &[NodeRole::Smolvm, NodeRole::Double],
            FaultKind::Smolvm => &[NodeRole::Smolvm],
            FaultKind::Partition => &[NodeRole::Simulated],
            _ => &[],
        }
    }

    /// How often a fault beyond the first of each kind is of this kind (kills are cheap and
    /// frequent in real fleets; restarts and cuts rarer).
    fn weight(self) -> u64 {
        match self {
            FaultKind::Controller => 3,
            FaultKind::Webhook | FaultKind::Agent | FaultKind::Smolvm => 2,
            _ => 1,
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a fault falls on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    /// Whichever controller replica holds the Lease when the fault falls.
    Leader,
    /// A webhook replica, by index.
    Replica(u32),
    /// A node of the topology, by index.
    Node(u32),
    /// The only instance (etcd, kube-apiserver).
    Only,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Leader => f.write_str("leader"),
            Target::Replica(i) => write!(f, "replica {i}"),
            Target::Node(i) => write!(f, "node {i}"),
            Target::Only => f.write_str("the only instance"),
        }
    }
}

/// What a node of the soak is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeRole {
    /// The real agent over the real `smolvm serve`.
    Smolvm,
    /// The real agent over the smolvm double (suspend, resume and pools run there).
    Double,
    /// A simulated node (testkit's in-memory smolvm).
    Simulated,
}

/// The processes and nodes faults can fall on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Webhook replicas.
    pub webhook_replicas: u32,
    /// Controller replicas (leader election among them).
    pub controller_replicas: u32,
    /// The nodes, by index.
    pub nodes: Vec<NodeRole>,
}

impl Default for Topology {
    fn default() -> Self {
        Topology {
            webhook_replicas: 2,
            controller_replicas: 2,
            nodes: vec![
                NodeRole::Smolvm,
                NodeRole::Double,
                NodeRole::Simulated,
                NodeRole::Simulated,
                NodeRole::Simulated,
            ],
        }
    }
}

impl Topology {
    /// The indices of the nodes `kind` can fall on.
    fn nodes_for(&self, kind: FaultKind) -> Vec<u32> {
        let roles = kind.node_roles();
        (0u32..)
            .zip(&self.nodes)
            .filter(|(_, role)| roles.contains(role))
            .map(|(i, _)| i)
            .collect()
    }

    /// Whether every kind of fault has something to fall on.
    fn check(&self) -> Result<()> {
        let missing = |kind: FaultKind, why| Err(Error::NoTarget { kind: kind.name(), why });
        if self.controller_replicas < 2 {
            return missing(
                FaultKind::Controller,
                "a leader's kill needs a second controller replica",
            );
        }
        if self.webhook_replicas == 0 {
            return missing(FaultKind::Webhook, "no webhook replica");
        }
        for kind in [
            FaultKind::Agent,
            FaultKind::Smolvm,
            FaultKind::Partition,
            FaultKind::Clock,
        ] {
            if self.nodes_for(kind).is_empty() {
                return missing(kind, "no node of a role it falls on");
            }
        }
        Ok(())
    }
}

/// The schedule's parameters; the defaults are the tier's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleParams {
    /// No fault before this: operations are in flight first.
    pub warmup: Duration,
    /// Every fault has ended this long before the end of the run.
    pub cooldown: Duration,
    /// One fault per this much of the fault window, on average (every kind at least once).
    pub mean_gap: Duration,
    /// A control-plane fault begins at least this long after the previous one ended.
    pub settle: Duration,
    /// How long etcd or kube-apiserver stays down in a restart: from the first to the second.
    pub restart_down: (Duration, Duration),
    /// How long a node stays cut off.
    pub partition: Duration,
    /// How long an agent's clock stays off.
    pub clock: Duration,
    /// How far off the clock is set, in minutes (either way): from the first to the second.
    pub clock_skew_minutes: (u32, u32),
    /// How long a killed agent is down, with its `smolvm serve`, until it runs again.
    pub agent_down: Duration,
    /// A clock set behind is set at least this much further behind than the run is old when it
    /// falls, so that every certificate issued since the run (and its set-up) began starts in
    /// that node's future: the product's certificates start 5 minutes early, and a clock merely
    /// minutes behind late in a run would break nothing, testing nothing.
    pub behind_past: Duration,
    /// What faults fall on.
    pub topology: Topology,
}

impl Default for ScheduleParams {
    fn default() -> Self {
        ScheduleParams {
            warmup: Duration::from_secs(30),
            cooldown: Duration::from_secs(30),
            mean_gap: Duration::from_secs(15),
            settle: Duration::from_secs(15),
            restart_down: (Duration::from_secs(3), Duration::from_secs(10)),
            partition: Duration::from_secs(60),
            clock: Duration::from_secs(60),
            clock_skew_minutes: (2, 10),
            agent_down: Duration::from_secs(20),
            behind_past: Duration::from_secs(7 * 60),
            topology: Topology::default(),
        }
    }
}

/// One fault of the schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    /// When it falls, from the start of the run.
    pub at: Duration,
    /// What it is.
    pub kind: FaultKind,
    /// What it falls on.
    pub target: Target,
    /// How long it lasts, for the faults that last (a restart's downtime, a partition, a clock).
    pub duration: Option<Duration>,
    /// How far the clock is set off, in minutes (negative: behind), for a clock fault.
    pub skew_minutes: Option<i64>,
}

impl Fault {
    /// When it is over (when it falls, for a kill).
    pub fn end(&self) -> Duration {
        self.at + self.duration.unwrap_or_default()
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1}s {} ({})", self.at.as_secs_f64(), self.kind, self.target)?;
        if let Some(duration) = self.duration {
            write!(f, " for {:.1}s", duration.as_secs_f64())?;
        }
        if let Some(skew) = self.skew_minutes {
            write!(f, ", clock {skew:+} min")?;
        }
        Ok(())
    }
}

/// A run's faults, in the order they fall.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// The seed it came from.
    pub seed: u64,
    /// The run's length.
    pub length: Duration,
    /// The faults, by time.
    pub faults: Vec<Fault>,
}

impl Schedule {
    /// How many faults of `kind` it holds.
    pub fn count(&self, kind: FaultKind) -> usize {
        self.faults.iter().filter(|f| f.kind == kind).count()
    }

    /// The module's rules this schedule breaks, one line each (none for a schedule from
    /// [`schedule`] with the same parameters).
    pub fn rule_breaks(&self, params: &ScheduleParams) -> Vec<String> {
        let mut breaks = Vec::new();
        let end = self.length.saturating_sub(params.cooldown);
        for kind in FaultKind::ALL {
            if self.count(kind) == 0 {
                breaks.push(format!("no {kind} fault"));
            }
        }
        for (i, fault) in self.faults.iter().enumerate() {
            if fault.at < params.warmup {
                breaks.push(format!("{fault}: within the warm-up"));
            }
            if fault.end() > end {
                breaks.push(format!("{fault}: not over before the cool-down"));
            }
            if let Some(why) = target_break(fault, &params.topology) {
                breaks.push(format!("{fault}: {why}"));
            }
            if fault
                .skew_minutes
                .is_some_and(|m| m < 0 && -m < behind_minutes(fault.at, params))
            {
                breaks.push(format!("{fault}: not far enough behind for the run's certificates"));
            }
            if let Some(down) = agent_down_at(fault, &self.faults, params) {
                breaks.push(format!("{fault}: while its agent is down ({down})"));
            }
            let next = self.faults.get(i + 1..).unwrap_or_default();
            if next.first().is_some_and(|n| n.at < fault.at) {
                breaks.push(format!("{fault}: out of order"));
            }
            for later in next {
                if fault.kind.is_control_plane()
                    && later.kind.is_control_plane()
                    && later.at < fault.end() + params.settle
                {
                    breaks.push(format!("{later}: within {:?} of {fault}", params.settle));
                }
                if fault.kind.lasts_on_a_node()
                    && later.kind == fault.kind
                    && later.target == fault.target
                    && later.at < fault.end()
                {
                    breaks.push(format!("{later}: overlaps {fault}"));
                }
            }
        }
        breaks
    }
}

/// What is wrong with a fault's target, duration or skew for its kind, if anything.
fn target_break(fault: &Fault, topology: &Topology) -> Option<&'static str> {
    let target_ok = match (fault.kind, fault.target) {
        (FaultKind::Controller, Target::Leader) => true,
        (FaultKind::Webhook, Target::Replica(i)) => i < topology.webhook_replicas,
        (FaultKind::Etcd | FaultKind::Apiserver, Target::Only) => true,
        (kind, Target::Node(i)) => topology.nodes_for(kind).contains(&i),
        _ => false,
    };
    let lasts = fault.kind.is_control_plane() || fault.kind.lasts_on_a_node();
    if !target_ok {
        Some("a target this kind cannot fall on")
    } else if fault.duration.is_some() != lasts {
        Some("a duration where the kind has none, or none where it has one")
    } else if fault.skew_minutes.is_some() != (fault.kind == FaultKind::Clock) {
        Some("a clock skew on a fault that is not a clock's")
    } else {
        None
    }
}

/// For a kill of `smolvm serve`, the fault in `faults` that has its node's agent down when it
/// falls (a clock fault there in progress or ended less than `agent_down` before, or an agent
/// kill there less than `agent_down` before).
fn agent_down_at<'f>(fault: &Fault, faults: &'f [Fault], params: &ScheduleParams) -> Option<&'f Fault> {
    if fault.kind != FaultKind::Smolvm {
        return None;
    }
    faults.iter().find(|other| {
        other.target == fault.target
            && match other.kind {
                // The agent is restarted when the clock is set off and again when it is set
                // right: down from the start until `agent_down` after the end.
                FaultKind::Clock => other.at <= fault.at && fault.at <= other.end() + params.agent_down,
                FaultKind::Agent => other.at <= fault.at && fault.at <= other.at + params.agent_down,
                _ => false,
            }
    })
}

/// Moves each kill of `smolvm serve` that would fall while its agent is down to the nearest
/// time in `[start, end]` when it runs: a second before or after each fault that has it down.
/// One with no such time becomes a controller kill (as a fault with nothing to fall on does).
fn keep_smolvm_kills_clear(faults: &mut [Fault], (start, end): (Duration, Duration), params: &ScheduleParams) {
    let second = Duration::from_secs(1);
    for i in 0..faults.len() {
        let Some(fault) = faults.get(i) else { continue };
        if agent_down_at(fault, faults, params).is_none() {
            continue;
        }
        let mut candidates: Vec<Duration> = faults
            .iter()
            .filter(|other| other.target == fault.target)
            .flat_map(|other| {
                let over = match other.kind {
                    FaultKind::Agent => other.at + params.agent_down,
                    _ => other.end() + params.agent_down,
                };
                [other.at.checked_sub(second), Some(over + second)]
            })
            .flatten()
            .filter(|at| start <= *at && *at <= end)
            .collect();
        let from = fault.at;
        candidates.sort_by_key(|at| (at.abs_diff(from), *at));
        let clear = candidates.into_iter().find(|at| {
            let moved = Fault {
                at: *at,
                ..fault.clone()
            };
            agent_down_at(&moved, faults, params).is_none()
        });
        let Some(fault) = faults.get_mut(i) else { continue };
        match clear {
            Some(at) => fault.at = at,
            None => {
                fault.kind = FaultKind::Controller;
                fault.target = Target::Leader;
            }
        }
    }
}

/// The schedule of a run of `length` with `seed`.
pub fn schedule(seed: u64, length: Duration, params: &ScheduleParams) -> Result<Schedule> {
    params.topology.check()?;
    let too_short = |why: String| Error::TooShort { length, why };
    let start = params.warmup;
    let end = length.saturating_sub(params.cooldown);
    let window = end.saturating_sub(start);
    let cp_room = params.restart_down.1.max(params.restart_down.0) + params.settle;
    let cp_cap = ratio(window, cp_room);
    if cp_cap < 2 {
        return Err(too_short(format!(
            "the fault window ({:?} after the warm-up, before the cool-down) must hold two control-plane restarts of {cp_room:?} each",
            window
        )));
    }
    let mut rng = Rng::stream(seed, Stream::Schedule);
    let total = ratio(window, params.mean_gap).max(FaultKind::ALL.len() as u64);
    let kinds = kinds(&mut rng, total, cp_cap);
    let (control_plane, others): (Vec<FaultKind>, Vec<FaultKind>) =
        kinds.into_iter().partition(|k| k.is_control_plane());
    let mut faults = place_control_plane(&mut rng, &control_plane, start, window, params);
    faults.extend(place_others(&mut rng, others, start, window, params));
    keep_smolvm_kills_clear(&mut faults, (start, end), params);
    faults.sort_by_key(|f| (f.at, f.kind));
    let schedule = Schedule { seed, length, faults };
    if let Some(kind) = FaultKind::ALL.into_iter().find(|k| schedule.count(*k) == 0) {
        return Err(too_short(format!(
            "a {kind} fault does not fit in a fault window of {window:?}"
        )));
    }
    Ok(schedule)
}

/// How many whole `part`s fit in `whole` (0 for a zero `part`).
fn ratio(whole: Duration, part: Duration) -> u64 {
    u64::try_from(whole.as_millis().checked_div(part.as_millis()).unwrap_or(0)).unwrap_or(u64::MAX)
}

/// A random duration from zero to `max`, by milliseconds.
fn jitter(rng: &mut Rng, max: Duration) -> Duration {
    Duration::from_millis(rng.below(u64::try_from(max.as_millis()).unwrap_or(u64::MAX).saturating_add(1)))
}

/// `total` kinds: each once, then drawn by weight, at most `cp_cap` of them control-plane
/// restarts; shuffled.
fn kinds(rng: &mut Rng, total: u64, cp_cap: u64) -> Vec<FaultKind> {
    let mut kinds = FaultKind::ALL.to_vec();
    let mut control_plane = 2;
    let weights: Vec<u64> = FaultKind::ALL.iter().map(|k| k.weight()).collect();
    for _ in FaultKind::ALL.len() as u64..total {
        let mut kind = rng
            .weighted(&weights)
            .and_then(|i| FaultKind::ALL.get(i).copied())
            .unwrap_or(FaultKind::Controller);
        if kind.is_control_plane() {
            if control_plane >= cp_cap {
                kind = FaultKind::Controller;
            } else {
                control_plane += 1;
            }
        }
        kinds.push(kind);
    }
    rng.shuffle(&mut kinds);
    kinds
}

/// The restarts, one per equal slot of the window, each early enough in its slot that it is down
/// and settled again before the next slot begins.
fn place_control_plane(
    rng: &mut Rng,
    kinds: &[FaultKind],
    start: Duration,
    window: Duration,
    params: &ScheduleParams,
) -> Vec<Fault> {
    let slots = u32::try_from(kinds.len()).unwrap_or(u32::MAX).max(1);
    let slot = window / slots;
    let (least, most) = (
        params.restart_down.0.min(params.restart_down.1),
        params.restart_down.1.max(params.restart_down.0),
    );
    (0u32..)
        .zip(kinds)
        .map(|(i, kind)| {
            let down = least + jitter(rng, most - least);
            let slack = slot.saturating_sub(down + params.settle);
            Fault {
                at: start + slot * i + jitter(rng, slack),
                kind: *kind,
                target: Target::Only,
                duration: Some(down),
                skew_minutes: None,
            }
        })
        .collect()
}

/// Every other fault, one per equal slot of the window, somewhere in the first three quarters of
/// its slot. A fault that lasts takes an early enough slot (swapped with a kill) to end in the
/// window, on a node where no fault of its kind is still going on; one that finds neither
/// becomes a controller kill.
fn place_others(
    rng: &mut Rng,
    mut kinds: Vec<FaultKind>,
    start: Duration,
    window: Duration,
    params: &ScheduleParams,
) -> Vec<Fault> {
    let slots = u32::try_from(kinds.len()).unwrap_or(u32::MAX).max(1);
    let slot = window / slots;
    let slot_start = |i: usize| slot * u32::try_from(i).unwrap_or(u32::MAX);
    let lasting = |kind: FaultKind| match kind {
        FaultKind::Partition => params.partition,
        FaultKind::Clock => params.clock,
        _ => Duration::ZERO,
    };
    for i in (0..kinds.len()).rev() {
        let need = lasting(kinds[i]);
        if slot_start(i) + need > window
            && let Some(j) = (0..i)
                .rev()
                .find(|&j| !kinds[j].lasts_on_a_node() && slot_start(j) + need <= window)
        {
            kinds.swap(i, j);
        }
    }
    let mut faults: Vec<Fault> = Vec::with_capacity(kinds.len());
    for (i, kind) in kinds.into_iter().enumerate() {
        let lasts = lasting(kind);
        let room = window.saturating_sub(slot_start(i) + lasts).min(slot * 3 / 4);
        let at = start + slot_start(i) + jitter(rng, room);
        let fits = slot_start(i) + lasts <= window;
        let fault = match (fits, pick_target(rng, kind, at, lasts, &faults, &params.topology)) {
            (true, Some(target)) => Fault {
                at,
                kind,
                target,
                duration: kind.lasts_on_a_node().then_some(lasts),
                skew_minutes: (kind == FaultKind::Clock)
                    .then(|| far_enough(skew(rng, params.clock_skew_minutes), at, params)),
            },
            _ => Fault {
                at,
                kind: FaultKind::Controller,
                target: Target::Leader,
                duration: None,
                skew_minutes: None,
            },
        };
        faults.push(fault);
    }
    faults
}

/// A target for `kind` at `at` lasting `lasts`, free of another fault of its kind then.
fn pick_target(
    rng: &mut Rng,
    kind: FaultKind,
    at: Duration,
    lasts: Duration,
    placed: &[Fault],
    topology: &Topology,
) -> Option<Target> {
    match kind {
        FaultKind::Controller => Some(Target::Leader),
        FaultKind::Webhook => Some(Target::Replica(
            u32::try_from(rng.below(u64::from(topology.webhook_replicas))).ok()?,
        )),
        FaultKind::Etcd | FaultKind::Apiserver => Some(Target::Only),
        _ => {
            let busy = |node: u32| {
                placed
                    .iter()
                    .any(|f| f.kind == kind && f.target == Target::Node(node) && f.at < at + lasts && at < f.end())
            };
            let free: Vec<u32> = topology
                .nodes_for(kind)
                .into_iter()
                .filter(|n| !kind.lasts_on_a_node() || !busy(*n))
                .collect();
            rng.pick(&free).map(|n| Target::Node(*n))
        }
    }
}

/// `minutes`, or for a clock set behind at `at`, at least [`ScheduleParams::behind_past`] more
/// than `at` behind (whole minutes, rounded up).
fn far_enough(minutes: i64, at: Duration, params: &ScheduleParams) -> i64 {
    if minutes >= 0 {
        return minutes;
    }
    -minutes.abs().max(behind_minutes(at, params))
}

/// The fewest whole minutes behind a clock set behind at `at` may be.
fn behind_minutes(at: Duration, params: &ScheduleParams) -> i64 {
    i64::try_from((at + params.behind_past).as_secs().div_ceil(60)).unwrap_or(i64::MAX)
}

/// A clock offset in minutes within `(least, most)`, behind or ahead.
fn skew(rng: &mut Rng, (least, most): (u32, u32)) -> i64 {
    let minutes = i64::try_from(rng.between(u64::from(least.min(most)), u64::from(most.max(least)))).unwrap_or(0);
    if rng.chance(1, 2) { -minutes } else { minutes }
}

#[cfg(test)]
mod tests;
