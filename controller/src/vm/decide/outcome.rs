//! What a pass reports ([`Outcome`]): the status, the Service and EndpointSlice writes
//! ([`Exposing`], [`ExposureWrite`]), the events ([`Note`]), the annotations it drops
//! ([`AnnotationDrop`]), when to look again ([`Requeue`]), what the VM holds on its node and its
//! volumes' writes; and the few ways of starting one that the other parts of decide share.

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    jiff::Timestamp,
};
use smolvm_api::{
    Phase, SmolVM, SmolVMStatus,
    constants::{condition, reason},
};

use super::observed::Observed;
use crate::placement::Hold;
use crate::vm::rules;
use crate::vm::volumes::VolumeWrite;

/// What a pass reports: one status write, the exposure writes before it, then events and the
/// annotations it drops.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The status to write (not written when it equals the stored one).
    pub status: SmolVMStatus,
    /// The Service and EndpointSlice writes, and the ServiceExposed condition they give.
    pub exposure: Exposing,
    /// Events, in order.
    pub events: Vec<Note>,
    /// Annotations to drop after the status write.
    pub drops: Vec<AnnotationDrop>,
    /// When to look again.
    pub requeue: Requeue,
    /// What the VM holds on its node now, as the machine the pass left says (its CPU and memory
    /// given back while suspended); `None` when the pass did not learn the machine's state.
    pub hold: Option<Hold>,
    /// The writes of the claims and the holder Pod its volumes need, before the status write.
    pub volumes: Vec<VolumeWrite>,
    /// A lifetime of `spec.lifecycle` passed (its field's name): the SmolVM is deleted after
    /// the status write and the events (SPEC 2.7).
    pub expire: Option<&'static str>,
    /// Look again no later than this, whatever `requeue` says: when the next lifetime passes.
    pub due: Option<std::time::Duration>,
}

impl Outcome {
    /// Whether the pass's own events tell where the VM was bound, so that a binding written with
    /// this outcome needs no Scheduled event of its own: a warm claim's ServedFromPool names the
    /// node, the machine and the pool, a branch's Branched the node, the machine and the source
    /// (one event per claim or branch, not two).
    pub fn tells_binding(&self) -> bool {
        self.events
            .iter()
            .any(|e| e.reason == reason::SERVED_FROM_POOL || e.reason == reason::BRANCHED)
    }
}

/// An event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Warning rather than Normal.
    pub warning: bool,
    /// Reason.
    pub reason: String,
    /// Action.
    pub action: &'static str,
    /// Note.
    pub note: String,
}

impl Note {
    /// A SmolVM bound to a node.
    pub fn bound(note: String) -> Self {
        Note::normal("Scheduled", "Bind", note)
    }

    pub(crate) fn normal(reason: impl Into<String>, action: &'static str, note: String) -> Self {
        Note {
            warning: false,
            reason: reason.into(),
            action,
            note,
        }
    }

    pub(super) fn warning(reason: impl Into<String>, action: &'static str, note: String) -> Self {
        Note {
            warning: true,
            reason: reason.into(),
            action,
            note,
        }
    }
}

/// An annotation the pass is done with, dropped only while it still holds `value` (a JSON patch
/// `test`), with the event that tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationDrop {
    /// The annotation.
    pub key: &'static str,
    /// The value acted on.
    pub value: String,
    /// A newer value written meanwhile (the test fails) is left for the next pass, silently.
    pub newer_may_replace: bool,
    /// The event, once dropped.
    pub then: Note,
}

/// When to look at the SmolVM again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// On its next change only.
    AwaitChange,
    /// After the retry interval (a node or call problem).
    Retry,
    /// Settled: after the slow resync.
    Settled,
    /// Still on its way: soon, with a backoff that grows while it does not settle.
    Unsettled,
    /// After this long (a start held back after a failed one).
    After(std::time::Duration),
}

/// The exposure writes of a pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exposing {
    /// The writes, in order.
    pub writes: Vec<ExposureWrite>,
    /// The ServiceExposed condition once they succeed: `None` removes it.
    pub condition: Option<(&'static str, &'static str, String)>,
    /// Whether a failed write is a removal (for its message).
    pub removing: bool,
}

/// One write of a Service or EndpointSlice.
#[derive(Debug, Clone, PartialEq)]
pub enum ExposureWrite {
    /// Server-side apply of the Service.
    ApplyService(Box<Service>),
    /// Server-side apply of the EndpointSlice.
    ApplySlice(Box<EndpointSlice>),
    /// Delete the EndpointSlice: exposure is off, or, before its apply, the node's address
    /// changed family (addressType is immutable).
    DeleteSlice,
    /// Delete the Service.
    DeleteService,
}

impl Outcome {
    /// An outcome that changes nothing yet: the stored status with this generation observed.
    pub(super) fn of(vm: &SmolVM) -> Self {
        let mut status = vm.status.clone().unwrap_or_default();
        status.observed_generation = vm.metadata.generation;
        Outcome {
            status,
            exposure: Exposing::default(),
            events: Vec::new(),
            drops: Vec::new(),
            requeue: Requeue::Retry,
            hold: None,
            volumes: Vec::new(),
            expire: None,
            due: None,
        }
    }

    /// The lifetimes of `spec.lifecycle` on the status this outcome writes (SPEC 2.7): when the
    /// machine first ran and when it finished are recorded, and a lifetime that passed deletes
    /// the SmolVM (condition and event Expired); otherwise the pass looks again when the next
    /// one passes.
    pub(super) fn lifetimes(&mut self, o: &Observed) {
        rules::stamp(&mut self.status, o.now);
        match rules::expiry(&o.vm.spec, &self.status, o.now) {
            rules::Expiry::Never => {}
            rules::Expiry::In(left) => self.due = Some(left),
            rules::Expiry::Now { lifetime, message } => {
                self.set(o, condition::EXPIRED, "True", reason::EXPIRED, &message);
                self.events.push(Note::normal(reason::EXPIRED, "Delete", message));
                self.expire = Some(lifetime);
            }
        }
    }

    /// What idleness decides for when to look again: a quiet machine is looked at when its
    /// `suspendAfterIdle` would pass (the earlier of that and a lifetime's end).
    pub(super) fn idle(&mut self, sleep: rules::Sleep) {
        if let rules::Sleep::Due(left) = sleep {
            self.due = Some(self.due.map_or(left, |due| due.min(left)));
        }
    }

    /// Sets a condition at the SmolVM's generation; whether it changed.
    pub(super) fn set(&mut self, o: &Observed, type_: &str, status: &str, why: &str, message: &str) -> bool {
        let generation = o.vm.metadata.generation;
        rules::set_condition(
            &mut self.status.conditions,
            type_,
            status,
            why,
            message,
            generation,
            o.now,
        )
    }
}

/// The stored status with `phase` and one condition (type, status, reason) set to `message`, and
/// a Warning event (reason, action) when the condition changed: the outcome of a placement or a
/// deletion, which observe no machine.
pub(super) fn warned(
    vm: &SmolVM,
    phase: Phase,
    [type_, status, why]: [&str; 3],
    message: String,
    (event_reason, action): (&str, &'static str),
    now: Timestamp,
) -> Outcome {
    let mut out = Outcome::of(vm);
    out.status = vm.status.clone().unwrap_or_default();
    out.status.phase = Some(phase);
    let generation = vm.metadata.generation;
    if rules::set_condition(
        &mut out.status.conditions,
        type_,
        status,
        why,
        &message,
        generation,
        now,
    ) {
        out.events.push(Note::warning(event_reason, action, message));
    }
    out
}
