//! Room on a node: whether it can hold a resize ([`resize_shortfall`]) or a resume
//! ([`resume_shortfall`]) of a VM bound there, against its allocatable minus what the other VMs
//! there hold.

use smolvm_api::{NodeResources, nodeapi::ResizeSpec};

/// A resize the node has no room for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    /// `cpus`, `memoryMiB` or `storageGiB` (storage plus overlay), as the spec spells them.
    pub resource: &'static str,
    /// What the VM asks for in all, after the resize.
    pub requested: i64,
    /// What the node has for this VM: its allocatable minus what every other VM holds there.
    pub free: i64,
}

impl Shortfall {
    /// For the ResizePending condition and its event.
    pub fn message(&self, node: &str) -> String {
        format!(
            "node {node} has no room for the resize: {} {} requested, {} free for this VM (allocatable minus the other VMs bound there); it is applied when room frees up",
            self.requested, self.resource, self.free
        )
    }
}

/// Whether `node` can hold a resize of a machine from `current` to `request`. Only the
/// dimensions the resize touches (`resize`) and that grow are checked: shrinking always fits.
/// `others` is what every other VM holds on the node; without a reported allocatable nothing is
/// checked (the node itself then decides).
pub fn resize_shortfall(
    resize: &ResizeSpec,
    request: &NodeResources,
    current: &NodeResources,
    allocatable: Option<&NodeResources>,
    others: &NodeResources,
) -> Option<Shortfall> {
    let free = allocatable?.minus(others);
    let disk = resize.storage_gib.is_some() || resize.overlay_gib.is_some();
    [
        ("cpus", resize.cpus.is_some(), request.cpus, current.cpus, free.cpus),
        (
            "memoryMiB",
            resize.memory_mib.is_some(),
            request.memory_mib,
            current.memory_mib,
            free.memory_mib,
        ),
        (
            "storageGiB",
            disk,
            request.storage_gib,
            current.storage_gib,
            free.storage_gib,
        ),
    ]
    .into_iter()
    .find(|&(_, touched, want, have, room)| touched && want > have && want > room)
    .map(|(resource, _, requested, _, free)| Shortfall {
        resource,
        requested,
        free,
    })
}

/// Why a suspended VM cannot resume on its node now, or `None` when it can: its CPU and memory
/// against the node's `allocatable` minus what the `others` bound there hold (without a reported
/// allocatable the node itself decides).
pub fn resume_shortfall(
    request: &NodeResources,
    allocatable: Option<&NodeResources>,
    others: &NodeResources,
    node: &str,
) -> Option<String> {
    let free = allocatable?.minus(others);
    let short: Vec<String> = [
        (request.cpus, free.cpus, "CPUs"),
        (request.memory_mib, free.memory_mib, "MiB of memory"),
    ]
    .into_iter()
    .filter(|(want, room, _)| want > room)
    .map(|(want, room, unit)| format!("{want} {unit} ({} free)", room.max(0)))
    .collect();
    if short.is_empty() {
        return None;
    }
    Some(format!(
        "node {node} has too little room to resume it: it needs {} beyond what the other VMs bound there hold; it resumes when room frees up there (a bound SmolVM never moves)",
        short.join(" and ")
    ))
}
