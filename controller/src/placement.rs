//! Placement: which SmolVMNode a SmolVM goes to.
//!
//! [`place`] is a pure function of the VM's request, the nodes, the ledger's view of what is
//! already committed on each node, and the time. [`Ledger::place_and_reserve`] runs it under the
//! ledger's lock and records the choice before returning, so concurrent reconciles never
//! over-commit a node even while the informer caches lag behind the bindings just written.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex},
};

use k8s_openapi::{
    api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm},
    jiff::{SignedDuration, Timestamp},
};
use smolvm_api::{
    NodeResources, Port, Protocol, SmolVM, SmolVMNode, SmolVMPool,
    constants::{PROTOCOL_VERSION, condition},
};

use crate::heartbeat::HeartbeatClock;

/// What a VM asks of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// CPUs, memory and disk (storage plus overlay).
    pub resources: NodeResources,
    /// Host ports it forwards, with their protocols.
    pub host_ports: Vec<(i32, Protocol)>,
    /// Labels the node must carry.
    pub node_selector: BTreeMap<String, String>,
    /// Hard pin, if any.
    pub pin: Option<String>,
    /// Where its volumes' data can be reached: one entry per claim bound to a PersistentVolume
    /// with a node affinity (a local PV), which restricts the nodes (SPEC 2.5).
    pub volumes: Vec<VolumeReach>,
}

impl Request {
    /// The request of a SmolVM, defaults applied.
    pub fn of(vm: &SmolVM) -> Self {
        Request {
            resources: vm.spec.request(),
            host_ports: host_ports(vm.spec.ports()),
            node_selector: vm.spec.node_selector.clone().unwrap_or_default(),
            pin: vm.spec.node_name.clone(),
            volumes: Vec::new(),
        }
    }
}

/// A PersistentVolume a VM's claim is bound to whose node affinity restricts where its data can
/// be reached: only the nodes its terms select may take the VM.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeReach {
    /// The PersistentVolume's name, for the message.
    pub pv: String,
    /// Its `nodeAffinity.required.nodeSelectorTerms`: a node is reached when any term selects it.
    pub terms: Vec<NodeSelectorTerm>,
}

impl VolumeReach {
    /// Whether `node` can reach the data: some term selects it by its labels
    /// (`matchExpressions`) and its name (`matchFields` on `metadata.name`), as the scheduler
    /// matches a PV's node affinity. No terms: every node.
    pub fn reaches(&self, node: &SmolVMNode) -> bool {
        self.terms.is_empty() || self.terms.iter().any(|term| term_selects(term, node))
    }

    /// Where the PV's terms pin it, in words: the node names (or hostnames) they list,
    /// `pinned to node-b`; `limited by its node affinity` where they list none.
    pub fn pinned(&self) -> String {
        let mut named: Vec<&str> = self
            .terms
            .iter()
            .flat_map(|t| {
                let fields = t.match_fields.iter().flatten().filter(|r| r.key == "metadata.name");
                let labels = t.match_expressions.iter().flatten().filter(|r| r.key == HOSTNAME_LABEL);
                fields.chain(labels)
            })
            .filter(|r| r.operator == "In")
            .flat_map(|r| r.values.iter().flatten().map(String::as_str))
            .collect();
        named.sort_unstable();
        named.dedup();
        if named.is_empty() {
            format!("PV {} is limited by its node affinity", self.pv)
        } else {
            format!("PV {} is pinned to {}", self.pv, named.join(", "))
        }
    }
}

/// The label that names a node's host, which local PVs are pinned by.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Whether one node selector term selects `node`: every expression on its labels and every field
/// requirement (only `metadata.name` is defined) holds. An empty term selects nothing, as the
/// scheduler has it.
fn term_selects(term: &NodeSelectorTerm, node: &SmolVMNode) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = node.metadata.labels.as_ref();
    let name = node.metadata.name.as_deref();
    expressions
        .iter()
        .all(|r| requirement_holds(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_holds(r, name))
}

/// One node selector requirement against the value the node has for its key (`None`: absent).
fn requirement_holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let listed = value.is_some_and(|v| values.iter().any(|w| w == v));
    let number = |v: Option<&str>| v.and_then(|v| v.parse::<i64>().ok());
    let bound = values.first().and_then(|v| v.parse::<i64>().ok());
    match r.operator.as_str() {
        "In" => listed,
        "NotIn" => !listed,
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => matches!((number(value), bound), (Some(v), Some(b)) if v > b),
        "Lt" => matches!((number(value), bound), (Some(v), Some(b)) if v < b),
        _ => false,
    }
}

/// What a VM bound to a node holds there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hold {
    /// Its whole request (also while stopped: its room stays its own).
    #[default]
    Full,
    /// Suspended: its CPU and memory are given back to the node; its disks stay counted, and
    /// its saved memory is counted as disk (smolvm reports no saved-state size, so the whole
    /// memory, the worst case). Its host ports stay reserved, so a resume never waits on one.
    Suspended,
}

impl Hold {
    /// What a VM's stored status says it holds: `Suspended` in phase Suspended. Only a hint, for
    /// a VM the ledger does not know yet: the controller's own suspends and resumes are newer
    /// than any cache.
    pub fn of(vm: &SmolVM) -> Self {
        match vm.status.as_ref().and_then(|s| s.phase) {
            Some(smolvm_api::Phase::Suspended) => Hold::Suspended,
            _ => Hold::Full,
        }
    }

    /// What `request` takes of a node under this hold.
    pub fn of_request(self, request: &NodeResources) -> NodeResources {
        // The one rule, shared with what a quota counts (SPEC 6.3).
        smolvm_api::quota::held(request, self == Hold::Suspended)
    }
}

/// The disk a suspended VM's saved memory is counted as ([`smolvm_api::quota::saved_state_gib`]).
pub use smolvm_api::quota::saved_state_gib;

fn host_ports(ports: &[Port]) -> Vec<(i32, Protocol)> {
    ports.iter().map(|p| (p.host_port, p.protocol)).collect()
}

/// Tunables of placement, and how heartbeats are judged.
#[derive(Debug, Clone)]
pub struct Config {
    /// A heartbeat older than this makes a node ineligible.
    pub heartbeat_timeout: SignedDuration,
    /// The controller's own record of heartbeats ([`crate::heartbeat`]): age is the time since
    /// the controller saw a node's heartbeat change. `None` compares the node's timestamp with
    /// `now` instead, for tables and benchmarks whose nodes carry their heartbeat; even then a
    /// timestamp further in the future than the timeout is not fresh.
    pub clock: Option<Arc<HeartbeatClock>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_timeout: SignedDuration::from_secs(40),
            clock: None,
        }
    }
}

impl Config {
    /// Judged by the controller's own clock, with `timeout`.
    pub fn observed(heartbeat_timeout: SignedDuration, clock: Arc<HeartbeatClock>) -> Self {
        Config {
            heartbeat_timeout,
            clock: Some(clock),
        }
    }

    /// How old `node`'s heartbeat is at `now`; `None` when it never sent one.
    pub fn heartbeat_age(&self, node: &SmolVMNode, now: Timestamp) -> Option<SignedDuration> {
        match &self.clock {
            Some(clock) => clock.look(node, now).age,
            None => node
                .status
                .as_ref()
                .and_then(|s| s.heartbeat_time.as_ref())
                .map(|t| now.duration_since(t.0).abs()),
        }
    }

    /// Whether `node`'s heartbeat is fresh at `now`.
    pub fn fresh(&self, node: &SmolVMNode, now: Timestamp) -> bool {
        self.heartbeat_age(node, now)
            .is_some_and(|age| age <= self.heartbeat_timeout)
    }
}

/// Why a node cannot take a VM. The `reason` strings are stable (events, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ineligible {
    /// Ready is not True.
    NotReady,
    /// The heartbeat is older than the timeout (or missing).
    StaleHeartbeat,
    /// GuestBootable is False: the canary guest did not boot there.
    CannotBootGuests,
    /// GuestBootable is Unknown: the first canary boot has not finished.
    GuestBootPending,
    /// The runtime speaks another node API protocol.
    ProtocolMismatch,
    /// `spec.unschedulable` is true.
    Cordoned,
    /// No endpoint, node UID or allocatable reported yet.
    NotReported,
    /// Not enough free CPUs.
    InsufficientCpu,
    /// Not enough free memory.
    InsufficientMemory,
    /// Not enough free disk.
    InsufficientStorage,
    /// A requested host port is already taken there.
    HostPortConflict,
    /// The node's labels do not match the VM's nodeSelector.
    SelectorMismatch,
    /// A claim of the VM is bound to a PersistentVolume whose node affinity excludes the node.
    VolumeUnreachable,
}

impl Ineligible {
    /// Stable reason string.
    pub fn reason(self) -> &'static str {
        match self {
            Ineligible::NotReady => "NotReady",
            Ineligible::StaleHeartbeat => "StaleHeartbeat",
            Ineligible::CannotBootGuests => "CannotBootGuests",
            Ineligible::GuestBootPending => "GuestBootPending",
            Ineligible::ProtocolMismatch => "ProtocolMismatch",
            Ineligible::Cordoned => "Cordoned",
            Ineligible::SelectorMismatch => "SelectorMismatch",
            Ineligible::NotReported => "NotReported",
            Ineligible::InsufficientCpu => "InsufficientCpu",
            Ineligible::InsufficientMemory => "InsufficientMemory",
            Ineligible::InsufficientStorage => "InsufficientStorage",
            Ineligible::HostPortConflict => "HostPortConflict",
            Ineligible::VolumeUnreachable => "VolumeUnreachable",
        }
    }

    /// What `count` nodes rejected for this reason are, as the scheduler words it; `want` and
    /// `free` are the request and the most any of them has free, for the resource reasons.
    fn words(self, count: usize, want: i64, free: i64) -> String {
        let one = count == 1;
        let (is, has, does) = if one {
            ("is", "has", "does")
        } else {
            ("are", "have", "do")
        };
        let at_most = if one { "" } else { "at most " };
        match self {
            Ineligible::NotReady => format!("{count} {is} not Ready"),
            Ineligible::StaleHeartbeat => format!("{count} {has} a stale heartbeat"),
            Ineligible::CannotBootGuests => format!("{count} cannot boot guests (CanaryFailed)"),
            Ineligible::GuestBootPending => {
                format!("{count} {is} still checking that a guest boots (CanaryPending)")
            }
            Ineligible::ProtocolMismatch => format!("{count} {does} not speak node API {PROTOCOL_VERSION}"),
            Ineligible::Cordoned => format!("{count} {is} cordoned (spec.unschedulable)"),
            Ineligible::NotReported => format!("{count} {has} not reported yet"),
            Ineligible::InsufficientCpu => {
                format!("{count} {has} too few CPUs (needs {want}, {at_most}{free} free)")
            }
            Ineligible::InsufficientMemory => {
                format!("{count} {has} too little memory (needs {want} MiB, {at_most}{free} free)")
            }
            Ineligible::InsufficientStorage => {
                format!("{count} {has} too little disk (needs {want} GiB, {at_most}{free} free)")
            }
            Ineligible::HostPortConflict => format!("{count} {has} a requested host port taken"),
            Ineligible::SelectorMismatch => format!("{count} {does} not match nodeSelector"),
            Ineligible::VolumeUnreachable => format!("{count} cannot reach volume data"),
        }
    }

    /// For a resource reason, that resource's amount in `of` (0 for the other reasons).
    pub fn resource(self, of: &NodeResources) -> i64 {
        match self {
            Ineligible::InsufficientCpu => of.cpus,
            Ineligible::InsufficientMemory => of.memory_mib,
            Ineligible::InsufficientStorage => of.storage_gib,
            _ => 0,
        }
    }
}

/// The nodes rejected, by reason: how many, and for resource reasons the most any had free. The
/// one wording of "why not here" for VMs and pools' sources alike ([`Rejections::message`]).
#[derive(Debug, Default)]
pub struct Rejections {
    by_reason: BTreeMap<Ineligible, (usize, i64)>,
    /// For [`Ineligible::VolumeUnreachable`]: where the PVs that kept a node out are pinned.
    pinned: BTreeSet<String>,
}

impl Rejections {
    /// One node rejected for `why`, with `free` of the resource `why` names (any value for the
    /// other reasons).
    pub fn add(&mut self, why: Ineligible, free: i64) {
        let entry = self.by_reason.entry(why).or_insert((0, i64::MIN));
        entry.0 += 1;
        entry.1 = entry.1.max(free);
    }

    /// `node` rejected because it cannot reach the data of `request`'s volumes: counted, with the
    /// first PV that excludes it named.
    pub fn add_unreachable(&mut self, request: &Request, node: &SmolVMNode) {
        self.add(Ineligible::VolumeUnreachable, 0);
        if let Some(reach) = request.volumes.iter().find(|v| !v.reaches(node)) {
            self.pinned.insert(reach.pinned());
        }
    }

    /// Every reason with its count, as the scheduler words it: `2 have too few CPUs (needs 32,
    /// at most 8 free), 1 does not match nodeSelector, 1 cannot reach volume data (PV local-3 is
    /// pinned to node-b)`.
    pub fn summary(&self, request: &Request) -> String {
        self.by_reason
            .iter()
            .map(|(why, (count, free))| {
                let words = why.words(*count, why.resource(&request.resources), (*free).max(0));
                match why {
                    Ineligible::VolumeUnreachable if !self.pinned.is_empty() => {
                        let pinned: Vec<&str> = self.pinned.iter().map(String::as_str).collect();
                        format!("{words} ({})", pinned.join("; "))
                    }
                    _ => words,
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `0/<seen> nodes can <what>: <summary>`, the scheduler's form.
    pub fn message(&self, what: &str, seen: usize, request: &Request) -> String {
        format!("0/{seen} nodes can {what}: {}", self.summary(request))
    }

    /// Whether no node was rejected.
    pub fn is_empty(&self) -> bool {
        self.by_reason.is_empty()
    }
}

/// The status of `node`'s condition `type_`, when it reports one.
fn condition_status<'a>(node: &'a SmolVMNode, type_: &str) -> Option<&'a str> {
    node.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.as_str())
}

/// A placement that found no node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplaceable {
    /// Stable reason: `NoNodes`, `PinnedNodeUnknown`, `PinnedNodeIneligible` or `NoEligibleNode`.
    pub reason: &'static str,
    /// For the Scheduled condition, in the style of the Kubernetes scheduler:
    /// `0/3 nodes can take it: 1 cordoned (spec.unschedulable), 2 insufficient memory`.
    pub message: String,
}

/// The ready slots of one node pool booked on a node: soft holds, spare room that a SmolVM (or a
/// pool's source) that fits there only without them takes ([`slots_to_give_back`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotHold {
    /// What one slot takes (the template's machine).
    pub each: NodeResources,
    /// How many.
    pub count: u32,
}

impl SlotHold {
    /// What `count` slots take.
    pub fn total(&self) -> NodeResources {
        times(&self.each, self.count)
    }
}

/// `each` taken `n` times.
pub fn times(each: &NodeResources, n: u32) -> NodeResources {
    let n = i64::from(n);
    NodeResources {
        cpus: each.cpus.saturating_mul(n),
        memory_mib: each.memory_mib.saturating_mul(n),
        storage_gib: each.storage_gib.saturating_mul(n),
    }
}

/// `a` less `b`, below zero where `b` is more (unlike [`NodeResources::minus`], which stops at
/// zero): room that is overcommitted stays so through later additions.
pub fn less(a: &NodeResources, b: &NodeResources) -> NodeResources {
    NodeResources {
        cpus: a.cpus.saturating_sub(b.cpus),
        memory_mib: a.memory_mib.saturating_sub(b.memory_mib),
        storage_gib: a.storage_gib.saturating_sub(b.storage_gib),
    }
}

/// Whether `want` fits in `free`.
pub fn fits(want: &NodeResources, free: &NodeResources) -> bool {
    want.cpus <= free.cpus && want.memory_mib <= free.memory_mib && want.storage_gib <= free.storage_gib
}

/// How many of `each` fit in `room` (`u32::MAX` for a machine that takes nothing).
pub fn fit_count(room: &NodeResources, each: &NodeResources) -> u32 {
    [
        (room.cpus, each.cpus),
        (room.memory_mib, each.memory_mib),
        (room.storage_gib, each.storage_gib),
    ]
    .into_iter()
    .filter(|(_, each)| *each > 0)
    .map(|(room, each)| u32::try_from(room.max(0) / each).unwrap_or(u32::MAX))
    .min()
    .unwrap_or(u32::MAX)
}

/// What the ledger knows of one node: what is committed there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Sum of the requests of the VMs bound or reserved there, and of the pools' sources (hard
    /// holds).
    pub used: NodeResources,
    /// Host ports taken there, with how many VMs hold each (more than one only if bindings made
    /// elsewhere conflict).
    pub ports: HashMap<(i32, Protocol), u32>,
    /// The pools' ready slots booked there, by node pool (soft holds, not in `used`).
    pub slots: BTreeMap<String, SlotHold>,
}

impl Usage {
    /// What every pool's ready slots take there.
    pub fn soft(&self) -> NodeResources {
        self.slots
            .values()
            .fold(NodeResources::default(), |sum, hold| sum.plus(&hold.total()))
    }

    /// What the ready slots of every node pool but `pool` take there.
    pub fn soft_except(&self, pool: &str) -> NodeResources {
        self.slots
            .iter()
            .filter(|(name, _)| name.as_str() != pool)
            .fold(NodeResources::default(), |sum, (_, hold)| sum.plus(&hold.total()))
    }

    /// The booked ready slots of `pool` there.
    pub fn slots_of(&self, pool: &str) -> u32 {
        self.slots.get(pool).map_or(0, |hold| hold.count)
    }
}

/// Whether a placement keeps the ready slots of a node where they are, or may give them back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// Ready slots are room taken: free is allocatable less hard and soft holds.
    Kept,
    /// Ready slots are spare room: free is allocatable less hard holds.
    GivenBack,
}

/// Which ready slots on a node make room for `want`: none where it fits beside them; else the
/// fewest, taken one at a time from the node pool with the most booked (ties by name), never
/// those of `spare` (a pool's own, for its source); `None` where it does not fit even without
/// all of them. Sorted by node pool.
pub fn slots_to_give_back(
    allocatable: &NodeResources,
    usage: &Usage,
    want: &NodeResources,
    spare: Option<&str>,
) -> Option<Vec<(String, u32)>> {
    let mut free = less(&less(allocatable, &usage.used), &usage.soft());
    let mut left: BTreeMap<&str, (SlotHold, u32)> = usage
        .slots
        .iter()
        .filter(|(name, hold)| Some(name.as_str()) != spare && hold.count > 0)
        .map(|(name, hold)| (name.as_str(), (*hold, 0)))
        .collect();
    while !fits(want, &free) {
        let (_, (hold, taken)) = left
            .iter_mut()
            .filter(|(_, (hold, taken))| *taken < hold.count)
            .max_by(|(a, (ha, ta)), (b, (hb, tb))| (ha.count - ta).cmp(&(hb.count - tb)).then(b.cmp(a)))?;
        *taken += 1;
        free = free.plus(&hold.each);
    }
    Some(
        left.into_iter()
            .filter(|(_, (_, taken))| *taken > 0)
            .map(|(name, (_, taken))| (name.to_string(), taken))
            .collect(),
    )
}

/// Read access to per-node usage.
pub trait UsageView {
    /// Usage of a node (empty when none).
    fn usage(&self, node: &str) -> Option<&Usage>;
}

impl UsageView for HashMap<String, Usage> {
    fn usage(&self, node: &str) -> Option<&Usage> {
        self.get(node)
    }
}

/// Why `node` cannot take `request` now beside the ready slots booked there, or `None` when it
/// can.
pub fn check_node(
    node: &SmolVMNode,
    request: &Request,
    usage: Option<&Usage>,
    now: Timestamp,
    config: &Config,
) -> Option<Ineligible> {
    check_node_in(node, request, usage, now, config, Slots::Kept)
}

/// Why `node` cannot take `request` now, its ready slots counted as `slots` says, or `None` when
/// it can.
pub fn check_node_in(
    node: &SmolVMNode,
    request: &Request,
    usage: Option<&Usage>,
    now: Timestamp,
    config: &Config,
    slots: Slots,
) -> Option<Ineligible> {
    let status = match &node.status {
        Some(s) => s,
        None => return Some(Ineligible::NotReported),
    };
    if condition_status(node, condition::READY) != Some("True") {
        return Some(Ineligible::NotReady);
    }
    if !config.fresh(node, now) {
        return Some(Ineligible::StaleHeartbeat);
    }
    // Absent where the agent's check is off; Unknown waits for the first result.
    match condition_status(node, condition::GUEST_BOOTABLE) {
        None | Some("True") => {}
        Some("False") => return Some(Ineligible::CannotBootGuests),
        Some(_) => return Some(Ineligible::GuestBootPending),
    }
    if status.protocol_version.as_deref() != Some(PROTOCOL_VERSION) {
        return Some(Ineligible::ProtocolMismatch);
    }
    if node.spec.unschedulable.unwrap_or(false) {
        return Some(Ineligible::Cordoned);
    }
    if !request.node_selector.is_empty() {
        let labels = node.metadata.labels.as_ref();
        let matches = request
            .node_selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
        if !matches {
            return Some(Ineligible::SelectorMismatch);
        }
    }
    if !request.volumes.iter().all(|v| v.reaches(node)) {
        return Some(Ineligible::VolumeUnreachable);
    }
    if status.allocatable.is_none() || status.endpoint.is_none() || status.node_uid.is_none() {
        return Some(Ineligible::NotReported);
    }
    let free = free_of(node, usage, slots);
    let want = &request.resources;
    if want.cpus > free.cpus {
        return Some(Ineligible::InsufficientCpu);
    }
    if want.memory_mib > free.memory_mib {
        return Some(Ineligible::InsufficientMemory);
    }
    if want.storage_gib > free.storage_gib {
        return Some(Ineligible::InsufficientStorage);
    }
    if let Some(usage) = usage
        && request.host_ports.iter().any(|p| usage.ports.contains_key(p))
    {
        return Some(Ineligible::HostPortConflict);
    }
    None
}

/// Least-allocated score of placing `request` on `node`: the mean free fraction of CPU and memory
/// after placement, in parts per million (higher is emptier).
fn score(node: &SmolVMNode, request: &Request, usage: Option<&Usage>) -> i64 {
    let Some(allocatable) = node.status.as_ref().and_then(|s| s.allocatable) else {
        return 0;
    };
    let used = usage.map(|u| u.used).unwrap_or_default().plus(&request.resources);
    let fraction = |total: i64, used: i64| {
        if total <= 0 {
            0
        } else {
            (total - used).max(0).saturating_mul(1_000_000) / total
        }
    };
    (fraction(allocatable.cpus, used.cpus) + fraction(allocatable.memory_mib, used.memory_mib)) / 2
}

/// Chooses a node for `request`: an eligible node with the highest least-allocated score, ties
/// broken by name, beside the ready slots booked on each (never touching them). A pin restricts
/// the choice to that node and never falls back.
pub fn place<'n>(
    request: &Request,
    nodes: impl IntoIterator<Item = &'n SmolVMNode>,
    usage: &dyn UsageView,
    now: Timestamp,
    config: &Config,
) -> Result<&'n SmolVMNode, Unplaceable> {
    choose(request, nodes, usage, now, config, Slots::Kept).map(|placed| placed.node)
}

/// A node chosen for a request, and the ready slots there given back to make its room.
#[derive(Debug, Clone)]
pub struct Placement<'n> {
    /// The node.
    pub node: &'n SmolVMNode,
    /// `(node pool, slots)` given back on it ([`slots_to_give_back`]); empty where it fits
    /// beside them.
    pub give_back: Vec<(String, u32)>,
}

/// [`place`] first; where no node has room beside its ready slots, the node where it fits with
/// the fewest slots given back (then the highest score, then the name), so that no pool ever
/// makes a SmolVM unschedulable. A VM that fits nowhere even so says why with the slots counted
/// as free room.
pub fn place_giving_back<'n>(
    request: &Request,
    nodes: impl IntoIterator<Item = &'n SmolVMNode> + Clone,
    usage: &dyn UsageView,
    now: Timestamp,
    config: &Config,
) -> Result<Placement<'n>, Unplaceable> {
    match choose(request, nodes.clone(), usage, now, config, Slots::Kept) {
        Ok(placed) => Ok(placed),
        Err(_) => choose(request, nodes, usage, now, config, Slots::GivenBack),
    }
}

fn choose<'n>(
    request: &Request,
    nodes: impl IntoIterator<Item = &'n SmolVMNode>,
    usage: &dyn UsageView,
    now: Timestamp,
    config: &Config,
    slots: Slots,
) -> Result<Placement<'n>, Unplaceable> {
    // (node, slots given back, their count, score)
    type Best<'n> = (&'n SmolVMNode, Vec<(String, u32)>, u32, i64);
    let mut best: Option<Best<'n>> = None;
    let mut rejected = Rejections::default();
    let mut pinned_node: Option<&SmolVMNode> = None;
    let mut seen = 0usize;
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or("");
        if request.pin.as_deref().is_some_and(|pin| pin != name) {
            continue;
        }
        seen += 1;
        if request.pin.is_some() {
            pinned_node = Some(node);
        }
        let node_usage = usage.usage(name);
        if let Some(why) = check_node_in(node, request, node_usage, now, config, slots) {
            match why {
                Ineligible::VolumeUnreachable => rejected.add_unreachable(request, node),
                _ => rejected.add(why, why.resource(&free_of(node, node_usage, slots))),
            }
            continue;
        }
        let give_back = match (slots, node_usage) {
            (Slots::GivenBack, Some(u)) => {
                let allocatable = node.status.as_ref().and_then(|s| s.allocatable).unwrap_or_default();
                slots_to_give_back(&allocatable, u, &request.resources, None).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        let taken: u32 = give_back.iter().map(|(_, n)| *n).sum();
        let s = score(node, request, node_usage);
        let better = match &best {
            None => true,
            Some((b, _, bt, bs)) => {
                taken < *bt
                    || (taken == *bt && (s > *bs || (s == *bs && name < b.metadata.name.as_deref().unwrap_or(""))))
            }
        };
        if better {
            best = Some((node, give_back, taken, s));
        }
    }
    if let Some((node, give_back, _, _)) = best {
        return Ok(Placement { node, give_back });
    }
    let summary = rejected.summary(request);
    Err(match (&request.pin, seen) {
        (Some(pin), 0) => Unplaceable {
            reason: "PinnedNodeUnknown",
            message: format!("pinned node {pin} has no SmolVMNode; waiting for its runtime agent to register it"),
        },
        (Some(pin), _) => {
            // The pinned node's own words where it explains itself (why no guest boots).
            let detail = pinned_node
                .and_then(|node| node.status.as_ref())
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == condition::GUEST_BOOTABLE))
                .filter(|c| c.status != "True" && !c.message.is_empty())
                .map(|c| format!(" ({}: {})", c.reason, c.message))
                .unwrap_or_default();
            Unplaceable {
                reason: "PinnedNodeIneligible",
                message: format!("pinned node {pin} cannot run this VM now: {summary}{detail}"),
            }
        }
        (None, 0) => Unplaceable {
            reason: "NoNodes",
            message: "no SmolVMNode is registered".into(),
        },
        (None, n) => Unplaceable {
            reason: "NoEligibleNode",
            message: rejected.message("run this VM", n, request),
        },
    })
}

/// What `node` has free: its allocatable less what the ledger holds there (its ready slots
/// counted as `slots` says).
pub fn free_of(node: &SmolVMNode, usage: Option<&Usage>, slots: Slots) -> NodeResources {
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable).unwrap_or_default();
    match (usage, slots) {
        (Some(u), Slots::Kept) => allocatable.minus(&u.used).minus(&u.soft()),
        (Some(u), Slots::GivenBack) => allocatable.minus(&u.used),
        (None, _) => allocatable,
    }
}

/// Ledger keys of orphan machines ([`crate::orphans`]) start with this (never a UID), so the
/// pruning of gone SmolVMs leaves them alone.
pub const ORPHAN_KEY_PREFIX: &str = "orphan/";

/// The ledger key of an orphan machine on a node.
pub fn orphan_ledger_key(node: &str, machine: &str) -> String {
    format!("{ORPHAN_KEY_PREFIX}{node}/{machine}")
}

// Warm pools' names on their nodes, and their ready slots there: what placement and the pools'
// pass ([`crate::pools`]) both read.

/// The most characters of a pool's UID a node pool name holds: a UUID's 36, so that
/// `pool-<uid>-g<generation>` stays within a machine name's 63 for any generation.
pub const POOL_UID_MAX_LEN: usize = 36;

/// The prefix of every node pool of `pool`: `pool-<its whole UID>-g`. The whole UID, never a
/// prefix of it, so two pools never share a node pool. `None` for a pool not stored yet, or
/// whose UID is not of the characters and length a machine name can hold (Kubernetes gives
/// UUIDs).
pub(crate) fn pool_prefix(pool: &SmolVMPool) -> Option<String> {
    let uid = pool.metadata.uid.as_deref()?.to_ascii_lowercase();
    let valid = !uid.is_empty()
        && uid.len() <= POOL_UID_MAX_LEN
        && uid
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase() || b == b'-');
    valid.then(|| format!("pool-{uid}-g"))
}

/// The live pool whose node pool `name` is, if any.
pub fn owner_of<'p>(pools: impl IntoIterator<Item = &'p SmolVMPool>, name: &str) -> Option<&'p SmolVMPool> {
    pools
        .into_iter()
        .find(|p| pool_prefix(p).is_some_and(|prefix| name.starts_with(&prefix)))
}

/// The pool's name on its nodes for the template of `generation` (a SmolVM filled from an
/// older template is served only by slots of that one): `pool-<uid>-g<generation>`, at most 62
/// characters.
pub fn node_pool_name_at(pool: &SmolVMPool, generation: Option<i64>) -> Option<String> {
    Some(format!("{}{}", pool_prefix(pool)?, generation.unwrap_or(0).max(0)))
}

/// The pools a node reports, by name, with their ready and wanted slots.
pub(crate) fn reported_pools(node: &SmolVMNode) -> BTreeMap<&str, (i32, i32)> {
    node.status
        .as_ref()
        .and_then(|s| s.pools.as_ref())
        .into_iter()
        .flatten()
        .map(|p| (p.name.as_str(), (p.ready, p.slots)))
        .collect()
}

/// Of `nodes`, those that report a ready slot of the node pool `name`: where a SmolVM naming its
/// pool is placed first, so that it is served warm.
pub fn with_ready_slot<'n>(nodes: &'n [Arc<SmolVMNode>], name: &str) -> Vec<&'n SmolVMNode> {
    nodes
        .iter()
        .filter(|n| reported_pools(n).get(name).is_some_and(|(ready, _)| *ready > 0))
        .map(|n| n.as_ref())
        .collect()
}

/// Ledger keys of the warm pools kept on nodes ([`crate::pools`]: a pool's source machine and
/// its ready slots) start with this (never a UID), so the pruning of gone SmolVMs leaves them
/// alone; the pools' pass books and releases them.
pub const POOL_KEY_PREFIX: &str = "pool/";

/// The ledger key of a node pool on a node.
pub fn pool_ledger_key(node: &str, pool: &str) -> String {
    format!("{POOL_KEY_PREFIX}{node}/{pool}")
}

/// The reservations whose VM is gone: in `reserved` but not in `live` (sorted). Reservations
/// leak when a VM vanishes without a reconcile seeing it deleted (someone else removed the
/// finalizer, or the watch missed the delete while disconnected).
pub fn gone_reservations(reserved: &[String], live: &HashSet<String>) -> Vec<String> {
    // Orphan machines and node pools are booked under their own keys and released by the
    // orphan collector and the pools' pass.
    let mut gone: Vec<String> = reserved
        .iter()
        .filter(|uid| !uid.starts_with(ORPHAN_KEY_PREFIX) && !uid.starts_with(POOL_KEY_PREFIX) && !live.contains(*uid))
        .cloned()
        .collect();
    gone.sort();
    gone.dedup();
    gone
}

/// What placement and node health read from a SmolVMNode, minus the heartbeat: two nodes with
/// the same fingerprint place and judge VMs alike (as long as both heartbeats are fresh, or both
/// stale). Condition timestamps and the heartbeat time are left out, so the runtime's periodic
/// heartbeat does not look like a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFingerprint {
    /// (type, status, reason, message) of each condition, sorted by type.
    conditions: Vec<(String, String, String, String)>,
    node_uid: Option<String>,
    protocol_version: Option<String>,
    endpoint: Option<(String, i32)>,
    capacity: Option<NodeResources>,
    allocatable: Option<NodeResources>,
    unschedulable: bool,
    labels: BTreeMap<String, String>,
}

/// The fingerprint of a node (see [`NodeFingerprint`]).
pub fn node_fingerprint(node: &SmolVMNode) -> NodeFingerprint {
    let status = node.status.as_ref();
    let mut conditions: Vec<_> = status
        .map(|s| {
            s.conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone(), c.message.clone()))
                .collect()
        })
        .unwrap_or_default();
    conditions.sort();
    NodeFingerprint {
        conditions,
        node_uid: status.and_then(|s| s.node_uid.clone()),
        protocol_version: status.and_then(|s| s.protocol_version.clone()),
        endpoint: status.and_then(|s| s.endpoint.as_ref().map(|e| (e.address.clone(), e.port))),
        capacity: status.and_then(|s| s.capacity),
        allocatable: status.and_then(|s| s.allocatable),
        unschedulable: node.spec.unschedulable.unwrap_or(false),
        labels: node.metadata.labels.clone().unwrap_or_default(),
    }
}

/// Which SmolVMNode changes concern the VMs: the last fingerprint and heartbeat freshness seen
/// of each node. The runtime heartbeats every few seconds; only a change of the fingerprint, of
/// freshness (a heartbeat that went stale, or came back), or a node appearing or vanishing wakes
/// the VMs bound there and the VMs waiting for a node.
#[derive(Debug, Default)]
pub struct NodeTracker {
    seen: HashMap<String, (NodeFingerprint, bool)>,
}

impl NodeTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        NodeTracker::default()
    }

    /// A node was added or changed: whether its VMs must look again.
    pub fn applied(&mut self, node: &SmolVMNode, now: Timestamp, config: &Config) -> bool {
        let name = node.metadata.name.clone().unwrap_or_default();
        let now_seen = (node_fingerprint(node), config.fresh(node, now));
        let changed = self.seen.get(&name) != Some(&now_seen);
        self.seen.insert(name, now_seen);
        changed
    }

    /// A node was deleted: whether it was known (its VMs must look again).
    pub fn deleted(&mut self, name: &str) -> bool {
        self.seen.remove(name).is_some()
    }

    /// The periodic look at every node (the whole cache): the names of the nodes whose heartbeat
    /// went stale or fresh since the last look, or that vanished without a delete event (sorted).
    /// A dead runtime sends no events; this is how its VMs learn of it soon after the timeout.
    pub fn tick<'n>(
        &mut self,
        nodes: impl IntoIterator<Item = &'n SmolVMNode>,
        now: Timestamp,
        config: &Config,
    ) -> Vec<String> {
        let mut changed = Vec::new();
        let mut present = HashSet::new();
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let fresh = config.fresh(node, now);
            match self.seen.get_mut(&name) {
                Some((_, was)) if *was != fresh => {
                    *was = fresh;
                    changed.push(name.clone());
                }
                Some(_) => {}
                None => {
                    self.seen.insert(name.clone(), (node_fingerprint(node), fresh));
                    changed.push(name.clone());
                }
            }
            present.insert(name);
        }
        let vanished: Vec<String> = self.seen.keys().filter(|n| !present.contains(*n)).cloned().collect();
        for name in vanished {
            self.seen.remove(&name);
            changed.push(name);
        }
        changed.sort();
        changed
    }
}

/// A SmolVM's reservation ([`Ledger::reserve`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserved {
    /// Its node.
    pub node: String,
    /// `(node pool, slots)` whose ready slots there were given back to make its room: the node
    /// deletes them before the machine is created.
    pub give_back: Vec<(String, u32)>,
    /// Placed where its pool's ready slot serves it (that slot's room moved to it).
    pub warm: bool,
}

/// The ledger as the pools' pass reads it ([`Ledger::view`]): what is committed on each node,
/// and the node pools whose source is booked where.
#[derive(Debug, Clone, Default)]
pub struct LedgerView {
    /// Usage by node.
    pub by_node: HashMap<String, Usage>,
    /// `(node, node pool)` of every source booked.
    pub sources: HashSet<(String, String)>,
}

impl LedgerView {
    /// Whether the source of `pool` is booked on `node`.
    pub fn source_booked(&self, node: &str, pool: &str) -> bool {
        self.sources.contains(&(node.to_string(), pool.to_string()))
    }
}

impl UsageView for LedgerView {
    fn usage(&self, node: &str) -> Option<&Usage> {
        self.by_node.get(node)
    }
}

/// Everything committed on each node, by the VMs bound there and the reservations of placements
/// whose binding the caches may not show yet.
#[derive(Debug, Default)]
pub struct Ledger {
    inner: Mutex<LedgerState>,
}

#[derive(Debug, Default)]
struct LedgerState {
    by_node: HashMap<String, Usage>,
    /// VM uid -> (node, its request, what of it it holds there).
    by_vm: HashMap<String, (String, Request, Hold)>,
}

impl LedgerState {
    fn take_slots(&mut self, node: &str, pool: &str, n: u32) {
        if let Some(hold) = self.by_node.get_mut(node).and_then(|u| u.slots.get_mut(pool)) {
            hold.count = hold.count.saturating_sub(n);
            if hold.count == 0
                && let Some(u) = self.by_node.get_mut(node)
            {
                u.slots.remove(pool);
            }
        }
    }

    fn set_slots(&mut self, node: &str, pool: &str, hold: SlotHold) {
        if hold.count == 0 {
            if let Some(u) = self.by_node.get_mut(node) {
                u.slots.remove(pool);
            }
            return;
        }
        self.by_node
            .entry(node.to_string())
            .or_default()
            .slots
            .insert(pool.to_string(), hold);
    }

    /// Records what `uid` holds on `node`. A VM already held on that node keeps its [`Hold`]
    /// (the ledger's own, newer than `hint`, which comes from a cache).
    fn add(&mut self, uid: &str, node: &str, request: &Request, hint: Hold) {
        let mut hold = hint;
        if let Some((existing, held, kept)) = self.by_vm.get(uid) {
            if existing == node && held == request {
                return;
            }
            if existing == node {
                hold = *kept;
            }
            // Another node, or the same node with a changed request (a resize, rule V6): the new
            // reservation replaces the old one.
            self.remove(uid);
        }
        self.insert(uid, node, request.clone(), hold);
    }

    fn insert(&mut self, uid: &str, node: &str, request: Request, hold: Hold) {
        let usage = self.by_node.entry(node.to_string()).or_default();
        usage.used = usage.used.plus(&hold.of_request(&request.resources));
        for p in &request.host_ports {
            *usage.ports.entry(*p).or_default() += 1;
        }
        self.by_vm.insert(uid.to_string(), (node.to_string(), request, hold));
    }

    fn remove(&mut self, uid: &str) {
        let Some((node, request, hold)) = self.by_vm.remove(uid) else {
            return;
        };
        if let Some(usage) = self.by_node.get_mut(&node) {
            usage.used = usage.used.minus(&hold.of_request(&request.resources));
            for p in &request.host_ports {
                if let Some(count) = usage.ports.get_mut(p) {
                    *count -= 1;
                    if *count == 0 {
                        usage.ports.remove(p);
                    }
                }
            }
        }
    }
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Ledger::default()
    }

    /// Records a VM seen bound to `node` (idempotent; seeds the ledger from the cache). A changed
    /// request (a resize) replaces what the VM held there.
    pub fn observe_bound(&self, uid: &str, node: &str, request: &Request) {
        self.lock().add(uid, node, request, Hold::Full);
    }

    /// [`Ledger::observe_bound`] of a SmolVM: its request, and for a VM the ledger does not know
    /// yet, what its status says it holds ([`Hold::of`]).
    pub fn observe_vm(&self, uid: &str, node: &str, vm: &SmolVM) {
        self.lock().add(uid, node, &Request::of(vm), Hold::of(vm));
    }

    /// What a VM holds now, if the ledger knows it.
    pub fn hold_of(&self, uid: &str) -> Option<Hold> {
        self.lock().by_vm.get(uid).map(|(_, _, hold)| *hold)
    }

    /// Records that a VM now holds `hold` on its node (its node confirmed a suspend: its CPU and
    /// memory go back; it resumed or was stopped: they are its own again). A VM the ledger does
    /// not know is left alone.
    pub fn set_hold(&self, uid: &str, hold: Hold) {
        let mut state = self.lock();
        let Some((node, request, held)) = state.by_vm.get(uid).cloned() else {
            return;
        };
        if held != hold {
            state.remove(uid);
            state.insert(uid, &node, request, hold);
        }
    }

    /// Takes back a suspended VM's whole request on its node for a resume, atomically, if the
    /// node's `allocatable` minus what every other VM holds there has room for it; otherwise
    /// returns that free room and changes nothing. A VM that already holds its whole request
    /// (or that the ledger does not know) claims nothing.
    pub fn claim_resume(&self, uid: &str, allocatable: Option<&NodeResources>) -> Result<(), NodeResources> {
        let mut state = self.lock();
        let Some((node, request, Hold::Suspended)) = state.by_vm.get(uid).cloned() else {
            return Ok(());
        };
        if let Some(allocatable) = allocatable {
            let used = state.by_node.get(&node).map(|u| u.used).unwrap_or_default();
            let others = used.minus(&Hold::Suspended.of_request(&request.resources));
            let free = allocatable.minus(&others);
            if request.resources.cpus > free.cpus || request.resources.memory_mib > free.memory_mib {
                return Err(free);
            }
        }
        state.remove(uid);
        state.insert(uid, &node, request, Hold::Full);
        Ok(())
    }

    /// Forgets a VM (deleted, or a binding that failed).
    pub fn release(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// The node a VM holds resources on, if any.
    pub fn node_of(&self, uid: &str) -> Option<String> {
        self.lock().by_vm.get(uid).map(|(n, _, _)| n.clone())
    }

    /// Places `request` and reserves it on the chosen node, atomically. A VM that already holds
    /// a reservation gets that node again (a retried reconcile never binds twice elsewhere).
    pub fn place_and_reserve<'n>(
        &self,
        uid: &str,
        request: &Request,
        nodes: impl IntoIterator<Item = &'n SmolVMNode>,
        now: Timestamp,
        config: &Config,
    ) -> Result<String, Unplaceable> {
        let mut state = self.lock();
        if let Some((node, _, _)) = state.by_vm.get(uid) {
            return Ok(node.clone());
        }
        let node = place(request, nodes, &state.by_node, now, config)?;
        let name = node.metadata.name.clone().unwrap_or_default();
        state.add(uid, &name, request, Hold::Full);
        Ok(name)
    }

    /// Places a SmolVM and reserves it, atomically, with what that does to the pools' ready
    /// slots booked on its node. `warm` names the node pool whose ready slot may serve it and the
    /// nodes that report one: it goes there first where it fits with its room moved from one of
    /// those slots (soft) to it (hard), no other slot touched. Else anywhere, beside the ready
    /// slots of each node or, where it fits only without some, with those given back
    /// ([`place_giving_back`]; the caller has the node delete them before it creates the
    /// machine). A VM that already holds a reservation gets that node again.
    pub fn reserve<'n>(
        &self,
        uid: &str,
        request: &Request,
        nodes: impl IntoIterator<Item = &'n SmolVMNode> + Clone,
        warm: Option<(&str, &[&'n SmolVMNode])>,
        now: Timestamp,
        config: &Config,
    ) -> Result<Reserved, Unplaceable> {
        let mut state = self.lock();
        if let Some((node, _, _)) = state.by_vm.get(uid) {
            return Ok(Reserved {
                node: node.clone(),
                ..Reserved::default()
            });
        }
        if let Some((pool, candidates)) = warm {
            // Each candidate as it would be with one of the pool's slots given to this VM.
            let moved: HashMap<String, Usage> = candidates
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .filter_map(|name| {
                    let mut usage = state.by_node.get(&name)?.clone();
                    let hold = usage.slots.get_mut(pool).filter(|h| h.count > 0)?;
                    hold.count -= 1;
                    Some((name, usage))
                })
                .collect();
            let booked: Vec<&SmolVMNode> = candidates
                .iter()
                .copied()
                .filter(|n| n.metadata.name.as_ref().is_some_and(|name| moved.contains_key(name)))
                .collect();
            if let Ok(node) = place(request, booked, &moved, now, config) {
                let name = node.metadata.name.clone().unwrap_or_default();
                state.take_slots(&name, pool, 1);
                state.add(uid, &name, request, Hold::Full);
                return Ok(Reserved {
                    node: name,
                    give_back: Vec::new(),
                    warm: true,
                });
            }
            // A ready slot the ledger has not booked (the pools' pass has not seen it yet) serves
            // it all the same, beside every booked slot.
            if let Ok(node) = place(request, candidates.iter().copied(), &state.by_node, now, config) {
                let name = node.metadata.name.clone().unwrap_or_default();
                state.add(uid, &name, request, Hold::Full);
                return Ok(Reserved {
                    node: name,
                    give_back: Vec::new(),
                    warm: true,
                });
            }
        }
        let placed = place_giving_back(request, nodes, &state.by_node, now, config)?;
        let name = placed.node.metadata.name.clone().unwrap_or_default();
        for (pool, n) in &placed.give_back {
            state.take_slots(&name, pool, *n);
        }
        state.add(uid, &name, request, Hold::Full);
        Ok(Reserved {
            node: name,
            give_back: placed.give_back,
            warm: false,
        })
    }

    /// The ready slots of the node pool `pool` booked on `node`.
    pub fn slots(&self, node: &str, pool: &str) -> u32 {
        self.lock().by_node.get(node).map_or(0, |u| u.slots_of(pool))
    }

    /// The ready slots of `pool` booked on `node`, with what each takes.
    pub fn slot_hold(&self, node: &str, pool: &str) -> SlotHold {
        self.lock()
            .by_node
            .get(node)
            .and_then(|u| u.slots.get(pool))
            .copied()
            .unwrap_or_default()
    }

    /// Books `hold` as the ready slots of `pool` on `node` (what [`Ledger::slot_hold`] read, put
    /// back when what they were given back for was not booked after all).
    pub fn set_slot_hold(&self, node: &str, pool: &str, hold: SlotHold) {
        self.lock().set_slots(node, pool, hold);
    }

    /// Gives back ready slots on `node` until every hold fits its `allocatable` again (a resume
    /// or a resize took hard room that ready slots held): the fewest, as placement takes them
    /// ([`slots_to_give_back`]), all of them where even that is not enough. The slots taken, by
    /// node pool, for the node to delete before the machine grows.
    pub fn make_room(&self, node: &str, allocatable: &NodeResources) -> Vec<(String, u32)> {
        let mut state = self.lock();
        let Some(usage) = state.by_node.get(node).cloned() else {
            return Vec::new();
        };
        let taken = slots_to_give_back(allocatable, &usage, &NodeResources::default(), None).unwrap_or_else(|| {
            usage
                .slots
                .iter()
                .filter(|(_, hold)| hold.count > 0)
                .map(|(name, hold)| (name.clone(), hold.count))
                .collect()
        });
        for (pool, n) in &taken {
            state.take_slots(node, pool, *n);
        }
        taken
    }

    /// Gives back `n` of the ready slots of `pool` booked on `node` (to a SmolVM or another
    /// pool's source that takes their room); the slots left.
    pub fn take_slots(&self, node: &str, pool: &str, n: u32) -> u32 {
        let mut state = self.lock();
        state.take_slots(node, pool, n);
        state.by_node.get(node).map_or(0, |u| u.slots_of(pool))
    }

    /// Books a node pool on `node`, atomically: its source (a hard hold, `source` the source's
    /// request) where it is not booked yet and fits beside every hold but the pool's own slots
    /// (or is there already: `present`), then as many of `want` ready slots of `each` as fit
    /// beside every hard and soft hold (soft holds). `None` when the source does not fit (nothing
    /// is booked then); else the slots booked.
    #[allow(clippy::too_many_arguments)]
    pub fn book_pool(
        &self,
        node: &str,
        pool: &str,
        source: &Request,
        present: bool,
        each: &NodeResources,
        want: u32,
        allocatable: &NodeResources,
    ) -> Option<u32> {
        let mut state = self.lock();
        let key = pool_ledger_key(node, pool);
        let booked = state.by_vm.get(&key).is_some_and(|(n, _, _)| n == node);
        let usage = state.by_node.get(node).cloned().unwrap_or_default();
        let room = less(&less(allocatable, &usage.used), &usage.soft_except(pool));
        if !booked {
            if !present && !fits(&source.resources, &room) {
                return None;
            }
            state.add(&key, node, source, Hold::Full);
        }
        let usage = state.by_node.get(node).cloned().unwrap_or_default();
        let room = less(&less(allocatable, &usage.used), &usage.soft_except(pool));
        let count = want.min(fit_count(&room, each));
        state.set_slots(node, pool, SlotHold { each: *each, count });
        Some(count)
    }

    /// Forgets a node pool on `node`: its source and its ready slots.
    pub fn release_pool(&self, node: &str, pool: &str) {
        let mut state = self.lock();
        state.remove(&pool_ledger_key(node, pool));
        state.set_slots(node, pool, SlotHold::default());
    }

    /// What every node pool holds, summed over the nodes where it is booked: its source (a hard
    /// hold) and its ready slots (soft holds). By node pool name; what a quota counts of pools.
    pub fn pool_holdings(&self) -> BTreeMap<String, NodeResources> {
        let state = self.lock();
        let mut out: BTreeMap<String, NodeResources> = BTreeMap::new();
        for (key, (node, request, _)) in &state.by_vm {
            if let Some(name) = key
                .strip_prefix(POOL_KEY_PREFIX)
                .and_then(|rest| rest.strip_prefix(node.as_str()))
                .and_then(|rest| rest.strip_prefix('/'))
            {
                let total = out.entry(name.to_string()).or_default();
                *total = total.plus(&request.resources);
            }
        }
        for usage in state.by_node.values() {
            for (name, hold) in &usage.slots {
                let total = out.entry(name.clone()).or_default();
                *total = total.plus(&hold.total());
            }
        }
        out
    }

    /// What the pools' pass reads of the ledger: every node's usage and the sources booked.
    pub fn view(&self) -> LedgerView {
        let state = self.lock();
        LedgerView {
            by_node: state.by_node.clone(),
            sources: state
                .by_vm
                .iter()
                .filter(|(key, _)| key.starts_with(POOL_KEY_PREFIX))
                .map(|(key, (node, _, _))| (node.clone(), key[POOL_KEY_PREFIX.len() + node.len() + 1..].to_string()))
                .collect(),
        }
    }

    /// What every VM but `uid` holds on `node`: the node's allocatable minus this is the room
    /// `uid` may grow into.
    pub fn used_by_others(&self, node: &str, uid: &str) -> NodeResources {
        let state = self.lock();
        let used = state.by_node.get(node).map(|u| u.used).unwrap_or_default();
        match state.by_vm.get(uid) {
            Some((held_on, request, hold)) if held_on == node => used.minus(&hold.of_request(&request.resources)),
            _ => used,
        }
    }

    /// The UIDs of every VM holding a reservation.
    pub fn reserved_uids(&self) -> Vec<String> {
        self.lock().by_vm.keys().cloned().collect()
    }

    /// Releases the reservations of VMs that no longer exist: `live` holds the UIDs of every
    /// SmolVM in the cache. Read the reserved UIDs ([`Ledger::reserved_uids`]) *before* taking
    /// that snapshot, so a VM reserved in between is never mistaken for a gone one. Returns the
    /// UIDs released.
    pub fn release_gone(&self, reserved: &[String], live: &HashSet<String>) -> Vec<String> {
        let gone = gone_reservations(reserved, live);
        let mut state = self.lock();
        for uid in &gone {
            state.remove(uid);
        }
        gone
    }

    /// Usage of one node (for status and metrics).
    pub fn usage(&self, node: &str) -> Usage {
        self.lock().by_node.get(node).cloned().unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that matters
        // more than stopping placement altogether, so recover the guard.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
