//! The events the lifecycle of a SmolVM publishes, through the controller's sink
//! ([`crate::events::EventSink`]): those a pass decided ([`super::decide::Note`]) on the SmolVM,
//! and the one on a SmolVMPool whose ready slots were given back to make room. A failed publish
//! is logged, never fails the pass.

use kube::{
    Resource,
    runtime::events::{Event, EventType},
};
use smolvm_api::{SmolVM, SmolVMPool, constants::reason};

use super::Context;
use super::decide::Note;

/// Publishes an event about `vm`; a failure is logged, never fails the pass.
pub async fn publish(ctx: &Context, vm: &SmolVM, note: &Note) {
    let event = Event {
        type_: if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: note.reason.clone(),
        note: Some(note.note.clone()),
        action: note.action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &vm.object_ref(&())).await {
        tracing::warn!(error = %e, "could not record event");
    }
}

/// The event on `pool` that `n` of its ready slots on `node` were given back to `taker` (a
/// SmolVM, or another pool's source, that fit there only with their room).
pub async fn slots_given_back(ctx: &Context, pool: &SmolVMPool, node: &str, n: u32, taker: &str) {
    let event = Event {
        type_: EventType::Normal,
        reason: reason::SLOTS_GIVEN_BACK.into(),
        note: Some(format!(
            "{n} ready slot(s) on node {node} given back to {taker}, which fits there only with their room"
        )),
        action: "GiveBack".into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &Resource::object_ref(pool, &())).await {
        tracing::warn!(%error, "could not record event");
    }
}
