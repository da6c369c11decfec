//! Idle machines (SPEC 2.7), as a pure function of the SmolVM, the machine its node reports, what
//! the controller saw of the machine's use, and the time ([`sleep`]): whether a running VM with
//! `lifecycle.suspendAfterIdle` has been quiet long enough to be suspended, and whether one the
//! controller suspended for idleness is woken.
//!
//! Every time here is the controller's own: when it last saw the machine's reported activity
//! change, or when it started or resumed it ([`Use::quiet_since`]). The node's clock is never
//! compared with it.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use smolvm_api::{
    SmolVM,
    constants::WAKE_ANNOTATION,
    nodeapi::{MachineState, MachineStatus, SuspendRequest},
};

/// What the controller saw of a machine's use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    /// Since when (the controller's clock) nothing was seen of it: the last change of the
    /// activity its node reports, or its last start or resume by this controller, or (neither
    /// seen since this controller started) the first time it looked.
    pub quiet_since: Timestamp,
    /// Its node asks for its wake: a connection to one of its published ports is held there.
    pub wake_asked: bool,
}

/// Why a VM suspended for idleness is woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeBy {
    /// A connection arrived at one of its published ports (its node asks).
    Traffic,
    /// The wake annotation: `kubectl smolvm resume`, or an exec or copy through the access API.
    Request,
    /// `lifecycle.suspendAfterIdle` was removed: nothing keeps it asleep.
    Unset,
}

/// What idleness decides for a VM in this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sleep {
    /// Nothing: no idle suspension applies (none is set, it does not run, or a user suspended it).
    Awake,
    /// It runs and is quiet; it is suspended after this long unless something passes.
    Due(Duration),
    /// It was quiet for `suspendAfterIdle`: suspend it now.
    Doze,
    /// The controller suspended it for idleness and nothing wakes it.
    Asleep,
    /// The controller suspended it for idleness and it is woken now.
    Wake(WakeBy),
}

impl Sleep {
    /// Whether the machine should be suspended for idleness in this pass.
    pub fn suspends(self) -> bool {
        matches!(self, Sleep::Doze | Sleep::Asleep)
    }
}

/// Whether `machine` was suspended by the controller for idleness (its node's record says so).
pub fn idle_suspended(machine: Option<&MachineStatus>) -> bool {
    machine.is_some_and(|m| m.state == MachineState::Suspended && m.suspended.as_ref().is_some_and(|s| s.idle))
}

/// Decides [`Sleep`] at `now`. A user's suspension (`spec.suspended`) always wins: the VM is
/// neither suspended nor woken for idleness while it is set.
pub fn sleep(vm: &SmolVM, machine: Option<&MachineStatus>, seen: &Use, now: Timestamp) -> Sleep {
    if vm.spec.suspended() || !vm.spec.running() {
        return Sleep::Awake;
    }
    if idle_suspended(machine) {
        return match vm.spec.suspend_after_idle() {
            None => Sleep::Wake(WakeBy::Unset),
            Some(_) if wake_requested(vm) => Sleep::Wake(WakeBy::Request),
            Some(_) if seen.wake_asked && vm.spec.wakes_on_traffic() => Sleep::Wake(WakeBy::Traffic),
            Some(_) => Sleep::Asleep,
        };
    }
    let Some(after) = vm.spec.suspend_after_idle() else {
        return Sleep::Awake;
    };
    if machine.is_none_or(|m| m.state != MachineState::Running) {
        return Sleep::Awake;
    }
    let quiet = now.duration_since(seen.quiet_since);
    let after = SignedDuration::try_from(after).unwrap_or(SignedDuration::MAX);
    if quiet >= after {
        Sleep::Doze
    } else {
        Sleep::Due(Duration::try_from(after - quiet).unwrap_or_default())
    }
}

/// Whether the SmolVM carries the wake annotation ([`WAKE_ANNOTATION`]).
pub fn wake_requested(vm: &SmolVM) -> bool {
    vm.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(WAKE_ANNOTATION))
}

/// What a suspend of this VM tells its node: an idle suspension (and whether traffic wakes it)
/// unless a user asked for it.
pub fn suspend_request(vm: &SmolVM) -> SuspendRequest {
    let idle = !vm.spec.suspended();
    SuspendRequest {
        idle,
        wake_on_traffic: idle && vm.spec.wakes_on_traffic(),
    }
}

/// The message of the Suspended condition of a VM the controller suspended for idleness.
pub fn idle_message(vm: &SmolVM, node: &str) -> String {
    let after = vm
        .spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.suspend_after_idle.as_deref())
        .unwrap_or("its suspendAfterIdle");
    let wake = if vm.spec.wakes_on_traffic() {
        "the next connection to one of its published ports, an exec or a copy wakes it"
    } else {
        "wakeOnTraffic is false: `kubectl smolvm resume` wakes it"
    };
    let request = vm.spec.request();
    format!(
        "suspended on node {node} after {after} without traffic or sessions; its {} CPUs and {} MiB are given back to the node; {wake} (spec.suspended stays false)",
        request.cpus, request.memory_mib
    )
}
