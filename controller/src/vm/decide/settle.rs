//! What a pass reports of the machine it left, whether it went as far as it should
//! ([`Outcome::settle`]) or failed part-way ([`Outcome::after_failure`]): phase and Ready, the
//! Suspended condition, the steps' events, and the annotations it is done with.

use smolvm_api::{
    constants::{RECREATE_LOST_MACHINE_ANNOTATION, RESTART_ANNOTATION, WAKE_ANNOTATION, condition, reason},
    nodeapi::MachineState,
};

use super::observed::Observed;
use super::outcome::{AnnotationDrop, Note, Outcome, Requeue};
use super::pass::{Call, Course, Progress};
use crate::placement::Hold;
use crate::vm::rules::{self, MachineAction, Restart, RunGoal};
use crate::vm::volumes::{self, Verdict};

impl Outcome {
    /// What a pass that failed part-way still reports: the events of the steps it took, the
    /// annotations it is done with, the machine it made, and the exposure of what it left.
    pub(super) fn after_failure(
        &mut self,
        o: &Observed,
        p: &Progress,
        goal: RunGoal,
        recreating: bool,
        restart: Restart,
    ) {
        self.events.extend(step_notes(o, p, goal));
        self.drop_annotations(o, p, recreating, restart);
        // The machine exists (it may have been made in this pass): recorded, so that its later
        // loss is told as MachineLost rather than re-created empty.
        if let Some(m) = &p.machine {
            self.status.effective = Some(rules::effective_of(m));
        }
        let runs = p.machine.as_ref().is_some_and(|m| m.state == MachineState::Running);
        self.expose(o, p, runs);
        self.suspension(o, p, goal, None);
    }

    /// The Suspended condition of the machine the pass left, its event when a resume starts to
    /// wait, and what the VM holds on its node.
    pub(super) fn suspension(&mut self, o: &Observed, p: &Progress, goal: RunGoal, resume_pending: Option<&str>) {
        let want = super::converge::want_of(o, p, goal);
        let machine = p.machine.as_ref();
        let condition =
            rules::suspended_condition(o.vm, machine, want, o.node, resume_pending).map(|(status, why, message)| {
                match why == reason::SUSPENDED && rules::idle_suspended(machine) {
                    true => (status, reason::IDLE_SUSPENDED, rules::idle_message(o.vm, o.node)),
                    false => (status, why, message),
                }
            });
        match condition {
            Some((status, why, message)) => {
                let changed = self.set(o, condition::SUSPENDED, status, why, &message);
                if changed && why == reason::RESUME_PENDING {
                    self.events.push(Note::warning(why, "Resume", message));
                }
            }
            None => {
                rules::clear_condition(&mut self.status.conditions, condition::SUSPENDED);
            }
        }
        if let Some(m) = machine {
            self.hold = Some(if m.state == MachineState::Suspended {
                Hold::Suspended
            } else {
                Hold::Full
            });
        }
    }

    /// The report of a pass that went as far as it should: the steps' events, phase and Ready
    /// from the machine (or, where its create or start `waits` for its volumes, from them), the
    /// exposure, the annotations it is done with, and an event for a transition no step told.
    pub(super) fn settle(
        &mut self,
        o: &Observed,
        p: &Progress,
        course: Course,
        warnings: Vec<Note>,
        waits: Option<&Verdict>,
    ) {
        let Course {
            goal,
            recreating,
            restart,
            ..
        } = course;
        let steps = step_notes(o, p, goal);
        let steps_reported = !steps.is_empty();
        self.events.extend(steps);
        // Written once, with the branch's first machine.
        if let Some((from, _)) = &p.branched {
            self.status.branched_from = Some(from.clone());
        }
        rules::apply_machine(
            &mut self.status,
            p.machine.as_ref(),
            goal,
            o.vm.spec.restart_policy(),
            o.vm.metadata.generation,
            o.now,
        );
        if let Some(verdict) = waits {
            volumes::hold_ready(
                &mut self.status,
                verdict,
                p.machine.as_ref(),
                o.vm.metadata.generation,
                o.now,
            );
        }
        rules::clear_condition(&mut self.status.conditions, condition::DELETION_BLOCKED);
        let runs = p.machine.as_ref().is_some_and(|m| m.state == MachineState::Running);
        self.expose(o, p, runs);
        self.drop_annotations(o, p, recreating, restart);
        // Waiting for its volumes is told by VolumesReady's own events.
        let told = steps_reported || waits.is_some();
        if let Some(t) = rules::transition_event(o.vm.status.as_ref(), &self.status, told) {
            self.events.push(Note {
                warning: t.warning,
                reason: t.reason,
                action: "Observe",
                note: t.note,
            });
        }
        self.events.extend(warnings);
        self.requeue = Requeue::Unsettled;
    }

    /// The recreate-lost-machine annotation once a fresh machine was made, and a restart request
    /// that is handled or skipped.
    fn drop_annotations(&mut self, o: &Observed, p: &Progress, recreating: bool, restart: Restart) {
        let (machine, node) = (o.machine, o.node);
        if recreating && p.did(|a| matches!(a, MachineAction::Create(_))) {
            self.drops.push(AnnotationDrop {
                key: RECREATE_LOST_MACHINE_ANNOTATION,
                value: smolvm_api::constants::RECREATE_LOST_MACHINE_VALUE.into(),
                newer_may_replace: false,
                then: Note::normal(
                    "Recreated",
                    "Create",
                    format!(
                        "created a fresh, empty machine {machine} on node {node} in place of the lost one, as {RECREATE_LOST_MACHINE_ANNOTATION} asked"
                    ),
                ),
            });
        }
        // The wake annotation, once the machine runs (or when nothing sleeps for it to wake).
        if let Some(at) = o.vm.metadata.annotations.as_ref().and_then(|a| a.get(WAKE_ANNOTATION))
            && !rules::idle_suspended(p.machine.as_ref())
        {
            let woke = p.did(|a| matches!(a, MachineAction::Resume));
            self.drops.push(AnnotationDrop {
                key: WAKE_ANNOTATION,
                value: at.clone(),
                newer_may_replace: true,
                then: Note::normal(
                    if woke { reason::WOKEN_BY_TRAFFIC } else { "WakeSkipped" },
                    "Resume",
                    if woke {
                        format!("machine {machine} on node {node} woke as asked at {at}")
                    } else {
                        format!("wake asked at {at} not needed: machine {machine} was not suspended for idleness")
                    },
                ),
            });
        }
        let Some(requested) = rules::restart_request(o.vm) else {
            return;
        };
        let (why, note) = match restart {
            Restart::Skip if requested.len() > rules::MAX_RESTART_REQUEST => (
                "RestartSkipped",
                format!(
                    "restart request not done: its value is longer than {} characters (kubectl smolvm restart writes the time of the request)",
                    rules::MAX_RESTART_REQUEST
                ),
            ),
            Restart::Skip if o.vm.spec.suspended() => (
                "RestartSkipped",
                format!(
                    "restart requested at {requested} not done: the SmolVM is suspended; resume it (spec.suspended: false), then restart it"
                ),
            ),
            Restart::Skip => (
                "RestartSkipped",
                format!("restart requested at {requested} not done: spec.running is false, nothing runs to restart"),
            ),
            Restart::Done => (
                "Restarted",
                format!("machine {machine} on node {node} restarted as requested at {requested}"),
            ),
            Restart::None | Restart::Run | Restart::StopThenRun => return,
        };
        self.drops.push(AnnotationDrop {
            key: RESTART_ANNOTATION,
            value: requested.to_string(),
            newer_may_replace: true,
            then: Note::normal(why, "Restart", note),
        });
    }
}

/// The Normal events of the machine actions a pass took.
/// A create of a SmolVM that names a pool which went cold (its pool had no slot there, or was
/// replaced) is told first, as `PoolEmpty`.
fn step_notes(o: &Observed, p: &Progress, goal: RunGoal) -> Vec<Note> {
    let created = p.did(|a| matches!(a, MachineAction::Create(_))) || matches!(&p.failed, Some((Call::Create(_), _)));
    let cold = match rules::create_call(o.pool, p.pool_empty, o.node) {
        rules::PooledCreate::Cold { why: Some(why) } if created && p.served_from.is_none() => {
            Some(Note::normal(reason::POOL_EMPTY, "Create", why))
        }
        _ => None,
    };
    let made = match (&p.branched, &p.served_from) {
        (Some((from, took)), _) => Some(rules::Made::Branched {
            source: &from.name,
            millis: took.as_millis(),
        }),
        (None, Some(pool)) => Some(rules::Made::Served(pool)),
        (None, None) => None,
    };
    let first = p.observed.as_ref().and_then(Option::as_ref);
    let woken = match rules::sleep(o.vm, first, &o.seen, o.now) {
        rules::Sleep::Wake(by) => Some(by),
        _ => None,
    };
    cold.into_iter()
        .chain(
            rules::step_events(&p.done, made, goal, o.machine, o.node)
                .into_iter()
                .map(|e| idle_note(o, e, woken)),
        )
        .collect()
}

/// A step's event, told as the idle suspension or the wake it was (SPEC 2.7).
fn idle_note(o: &Observed, e: rules::StepEvent, woken: Option<rules::WakeBy>) -> Note {
    let (machine, node) = (o.machine, o.node);
    match (e.action, woken) {
        ("Suspend", _) if rules::suspend_request(o.vm).idle => Note::normal(
            reason::IDLE_SUSPENDED,
            "Suspend",
            format!(
                "suspended machine {machine} on node {node}: no traffic on its published ports and no exec, log or copy session for {}; its CPU and memory are given back to the node{}",
                o.vm.spec
                    .lifecycle
                    .as_ref()
                    .and_then(|l| l.suspend_after_idle.as_deref())
                    .unwrap_or_default(),
                if o.vm.spec.wakes_on_traffic() {
                    ", and the next connection wakes it"
                } else {
                    ""
                },
            ),
        ),
        ("Resume", Some(by)) => Note::normal(
            reason::WOKEN_BY_TRAFFIC,
            "Resume",
            format!(
                "woke machine {machine} on node {node}, suspended for idleness, with its processes as they were: {}",
                match by {
                    rules::WakeBy::Traffic =>
                        "a connection arrived at one of its published ports, held there until it ran",
                    rules::WakeBy::Request => "an exec, a copy or kubectl smolvm resume asked for it",
                    rules::WakeBy::Unset => "lifecycle.suspendAfterIdle was removed",
                }
            ),
        ),
        _ => Note::normal(e.reason, e.action, e.note),
    }
}
