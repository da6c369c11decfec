//! Whether a node can take a request ([`check_node`], [`check_node_in`]), why not
//! ([`Ineligible`], with a stable reason), and the nodes rejected, worded as the scheduler words
//! them ([`Rejections`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use smolvm_api::{
    NodeResources, SmolVMNode,
    constants::{PROTOCOL_VERSION, condition},
};

use super::{
    liveness::Config,
    request::Request,
    usage::{Slots, Usage, free_of},
};

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
