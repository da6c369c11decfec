//! The volumes' part of a pass's outcome: the VolumesReady condition and its events, the claim
//! and holder writes ([`Outcome::volumes`]), and a placement that waits for its volumes
//! ([`waiting_for_volumes`]).

use k8s_openapi::jiff::Timestamp;
use smolvm_api::{
    Phase, SmolVM,
    constants::{condition, reason},
};

use super::outcome::{Note, Outcome};
use crate::vm::rules;
use crate::vm::volumes::{self, Verdict, VolumeWrite};

impl Outcome {
    /// The volumes' part of a pass's outcome: VolumesReady (removed from a SmolVM without
    /// volumes), its event when its reason changed, and the claim and holder writes.
    pub fn volumes(&mut self, vm: &SmolVM, verdict: Option<&Verdict>, now: Timestamp) {
        let Some(v) = verdict else {
            rules::clear_condition(&mut self.status.conditions, condition::VOLUMES_READY);
            return;
        };
        self.volume_condition(vm, v.condition.clone(), now);
        self.volumes = v.writes.clone();
    }

    /// A claim or holder write failed with `error`: VolumesReady says so.
    pub fn volume_write_failed(&mut self, vm: &SmolVM, write: &VolumeWrite, error: &str, now: Timestamp) {
        let (why, message) = write.failed(error);
        self.volume_condition(vm, ("False", why, message), now);
    }

    /// Sets VolumesReady, with an event when its reason changed to one that is told
    /// ([`volumes::notable`]).
    fn volume_condition(&mut self, vm: &SmolVM, (status, why, message): volumes::ConditionParts, now: Timestamp) {
        let conditions = &mut self.status.conditions;
        let before = conditions.iter().find(|c| c.type_ == condition::VOLUMES_READY);
        let changed = before.is_none_or(|c| c.reason != why);
        let generation = vm.metadata.generation;
        rules::set_condition(
            conditions,
            condition::VOLUMES_READY,
            status,
            why,
            &message,
            generation,
            now,
        );
        if let Some(warning) = volumes::notable(why).filter(|_| changed) {
            let action = if why == reason::HOLDER_EVICTED {
                "Evict"
            } else {
                "Mount"
            };
            let note = if warning { Note::warning } else { Note::normal };
            self.events.push(note(why, action, message));
        }
    }
}

/// A SmolVM that is not placed because of its volumes (a claim missing or another's): Pending,
/// VolumesReady False with `why` and `message`, and its event when the reason changed.
pub fn waiting_for_volumes(vm: &SmolVM, why: &'static str, message: String, now: Timestamp) -> Outcome {
    let mut out = Outcome::of(vm);
    out.status.phase = Some(Phase::Pending);
    out.volume_condition(vm, ("False", why, message), now);
    out
}
