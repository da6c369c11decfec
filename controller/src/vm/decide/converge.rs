//! The decision of a pass over a bound SmolVM ([`converge`]): the node read, the restart's stop,
//! the volumes' steps and the machine steps, one call at a time, until the pass reports.

use smolvm_api::{
    Phase,
    constants::{RECREATE_LOST_MACHINE_ANNOTATION, condition, reason},
    nodeapi::{ErrorCode, MachineSpec, MachineState, MachineStatus},
};

use super::exposing::{address_of, exposing};
use super::observed::Observed;
use super::outcome::{Note, Outcome, Requeue};
use super::pass::{Call, Course, Decision, Failure, Progress};
use super::problems::unhealthy;
use crate::vm::rules::{self, MachineAction, MissingMachine, PooledCreate, Restart, RunGoal, Want};
use crate::vm::volumes::{self, Verdict};

/// Machine steps one pass may take (create, start, suspend, and one spare), besides a restart's
/// stop.
pub const MAX_STEPS_PER_PASS: usize = 4;

/// How soon a resume that waits for room on its node looks again (room frees up without any
/// change to this SmolVM or its node: another VM is deleted, stopped or suspended).
pub const RESUME_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// Decides the next step of a pass over a bound SmolVM. A SmolVM with volumes has them judged
/// on every decision ([`volumes::judge`], from the machine as the pass left it): what they mean
/// for the next machine call, then VolumesReady and the claim and holder writes on its outcome.
/// Its lifetimes are judged on the status the outcome writes ([`Outcome::lifetimes`]).
pub fn converge(o: &Observed, p: &Progress) -> Decision {
    let machine = p.observed.as_ref().map(|_| p.machine.as_ref());
    let verdict = o.volumes.map(|seen| volumes::judge(o.vm, o.node, seen, machine));
    match converge_with(o, p, verdict.as_ref()) {
        Decision::Report(mut out) => {
            out.volumes(o.vm, verdict.as_ref(), o.now);
            out.lifetimes(o);
            out.idle(sleep_of(o, p));
            Decision::Report(out)
        }
        act => act,
    }
}

/// [`converge`], the volumes judged.
fn converge_with(o: &Observed, p: &Progress, verdict: Option<&Verdict>) -> Decision {
    let vm = o.vm;
    let mut out = Outcome::of(vm);
    if let Some((status, why, message)) = unhealthy(o) {
        out.expose(o, p, false);
        out.problem(o, Phase::Unknown, status, why, message, why, "Observe", None);
        return Decision::Report(Box::new(out));
    }
    if let Some((Call::Get, failure)) = &p.failed {
        out.expose(o, p, false);
        out.failed(o, &Call::Get, failure, None);
        return Decision::Report(Box::new(out));
    }
    let Some(observed) = &p.observed else {
        return Decision::Act {
            call: Call::Get,
            record_first: None,
            expose_first: Vec::new(),
        };
    };
    let desired = match rules::machine_spec(vm) {
        Ok(mut desired) => {
            desired.volumes = verdict.and_then(|v| v.mounts.clone());
            desired
        }
        Err(message) => {
            out.status.phase = Some(Phase::Failed);
            out.set(o, condition::READY, "False", "InvalidSpec", &message);
            out.expose(o, p, false);
            out.requeue = Requeue::AwaitChange;
            return Decision::Report(Box::new(out));
        }
    };
    let recreating = observed.is_none() && rules::missing_machine(vm) == MissingMachine::Recreate;
    if observed.is_none() && rules::missing_machine(vm) == MissingMachine::Lost {
        let message = format!(
            "machine {} existed on node {} and is gone (its state there was removed); it is not re-created empty.{} To start over with a fresh, empty machine, annotate the SmolVM with {RECREATE_LOST_MACHINE_ANNOTATION}=true",
            o.machine,
            o.node,
            o.volumes
                .and_then(|seen| volumes::lost_data(vm, seen))
                .unwrap_or_default(),
        );
        out.expose(o, p, false);
        let why = reason::MACHINE_LOST;
        out.problem(o, Phase::Failed, "False", why, message, why, "Observe", None);
        return Decision::Report(Box::new(out));
    }
    // A restart request (`kubectl smolvm restart`): a running machine is stopped and started
    // again whatever the restart policy. The request is recorded in `status.restartHandled`
    // (before the stop, so a failure after it never restarts twice) and its annotation is
    // dropped by the next pass, which sees it handled.
    let restart = rules::restart(vm, observed.as_ref());
    let goal = goal_of(o, p, restart, verdict);
    let requested = rules::restart_request(vm);
    if matches!(restart, Restart::StopThenRun | Restart::Run) {
        out.status.restart_handled = requested.map(str::to_string);
    }
    let restart_stop_done = p.did(|a| matches!(a, MachineAction::Stop));
    if restart == Restart::StopThenRun && !restart_stop_done && p.failed.is_none() {
        return machine_call(o, p, Call::Stop, requested.map(str::to_string));
    }
    proceed(
        o,
        p,
        out,
        &desired,
        Course {
            goal,
            recreating,
            restart,
            volumes: verdict,
        },
    )
}

/// The run goal of the machine the node reported first in this pass, as a restart request,
/// `spec.running` and the restart policy have it. A machine its holder's eviction stopped did
/// not exit on its own: it runs again once a new holder has mounted its volumes (and this pass
/// pointed it at them), whatever its restart policy.
fn goal_of(o: &Observed, p: &Progress, restart: Restart, verdict: Option<&Verdict>) -> RunGoal {
    let observed = p.observed.as_ref().and_then(|m| m.as_ref());
    let goal = match restart {
        Restart::StopThenRun | Restart::Run => RunGoal::Run,
        Restart::None | Restart::Skip | Restart::Done => rules::run_goal(o.vm, observed),
    };
    let evicted = verdict.is_some_and(|v| v.evicted) || p.did(|a| matches!(a, MachineAction::BindVolumes(_)));
    match goal {
        RunGoal::Exited | RunGoal::Restart if evicted => RunGoal::Run,
        goal => goal,
    }
}

/// The machine steps after the read: the next call, or the report of a pass that failed, is held
/// back, or went as far as it should.
fn proceed(o: &Observed, p: &Progress, mut out: Outcome, desired: &MachineSpec, course: Course) -> Decision {
    let Course {
        goal,
        recreating,
        restart,
        ..
    } = course;
    let mut settled = false;
    let mut warnings = Vec::new();
    let mut resume_pending = None;
    let mut waits = None;
    match &p.failed {
        Some((_, Failure::Call(e))) if e.code() == Some(&ErrorCode::ResizeRequiresRunning) => {
            out.set(
                o,
                condition::RESIZE_PENDING,
                "True",
                reason::RESIZE_NOT_APPLIED,
                e.message(),
            );
            settled = true;
        }
        Some((call, failure)) => {
            out.after_failure(o, p, goal, recreating, restart);
            out.failed(o, call, failure, p.machine.as_ref());
            return Decision::Report(Box::new(out));
        }
        None if start_held(o, p, desired, goal, restart) => {
            // A start that failed moments ago is not made again at once (a pass follows each
            // status write): the status stays as the failure left it, the exposure is kept, and
            // the start is made when the backoff ends.
            let runs = p.machine.as_ref().is_some_and(|m| m.state == MachineState::Running);
            out.expose(o, p, runs);
            out.requeue = Requeue::After(o.start_backoff.unwrap_or_default());
            return Decision::Report(Box::new(out));
        }
        None => {
            let budget = MAX_STEPS_PER_PASS + usize::from(restart == Restart::StopThenRun);
            let want = want_of(o, p, goal);
            let action = rules::machine_action(desired, want, p.machine.as_ref());
            let bound = p.did(|a| matches!(a, MachineAction::BindVolumes(_)));
            // The volumes first: a machine is created or started only once they are mounted.
            match course.volumes.map(|v| volumes::step(v, &action, bound)) {
                _ if p.done.len() >= budget => {}
                Some(volumes::Step::Bind(mounts)) => return machine_call(o, p, Call::BindVolumes(mounts), None),
                Some(volumes::Step::Stop) => return machine_call(o, p, Call::Stop, None),
                Some(volumes::Step::Wait) => waits = course.volumes,
                Some(volumes::Step::Proceed) | None => {
                    let step = next_machine_step(
                        o,
                        desired,
                        want,
                        p.machine.as_ref(),
                        &mut out,
                        &mut warnings,
                        &mut resume_pending,
                    );
                    match step.map(|call| pooled(o, p, call)) {
                        Some(Ok(call)) => return machine_call(o, p, call, None),
                        Some(Err(waits)) => {
                            let (call, waits) = *waits;
                            out.after_failure(o, p, goal, recreating, restart);
                            out.failed(o, &call, &waits, p.machine.as_ref());
                            return Decision::Report(Box::new(out));
                        }
                        None => settled = true,
                    }
                }
            }
        }
    }
    out.settle(o, p, course, warnings, waits);
    out.suspension(o, p, goal, resume_pending.as_deref());
    if resume_pending.is_some() {
        out.requeue = Requeue::After(RESUME_RECHECK);
    } else if settled {
        out.requeue = Requeue::Settled;
    }
    Decision::Report(Box::new(out))
}

/// A create of a SmolVM that names a pool, as its pool says ([`rules::create_call`]): a lease
/// of a ready slot, the cold create, or (`Err`) a wait for a slot, as the failure it reports;
/// that of a branch, as its source says ([`branched`]). Any other call is left as it is.
fn pooled(o: &Observed, p: &Progress, call: Call) -> Result<Call, Box<(Call, Failure)>> {
    let Call::Create(spec) = call else { return Ok(call) };
    if o.source.is_branch() {
        return branched(o, spec);
    }
    match rules::create_call(o.pool, p.pool_empty, o.node) {
        PooledCreate::Lease { node_pool, pool } => Ok(Call::Lease { spec, node_pool, pool }),
        PooledCreate::Cold { .. } => Ok(Call::Create(spec)),
        PooledCreate::Wait(message) => Err(Box::new((
            Call::Create(spec),
            Failure::Config {
                reason: reason::WAITING_FOR_SLOT,
                message,
            },
        ))),
    }
}

/// A branch's create ([`rules::branch_call`]): the branch of its running source's machine on its
/// node, or (`Err`) a wait for the source to run, as the failure it reports (`BranchPending`).
fn branched(o: &Observed, spec: Box<MachineSpec>) -> Result<Call, Box<(Call, Failure)>> {
    match rules::branch_call(o.source, o.node) {
        Ok((source, from)) => Ok(Call::Branch {
            spec,
            source: source.to_string(),
            from: from.clone(),
        }),
        Err(message) => Err(Box::new((
            Call::Create(spec),
            Failure::Config {
                reason: reason::BRANCH_PENDING,
                message,
            },
        ))),
    }
}

/// Whether the pass's next step is a start that the start backoff holds back (never a restart
/// the user asked for).
fn start_held(o: &Observed, p: &Progress, desired: &MachineSpec, goal: RunGoal, restart: Restart) -> bool {
    o.start_backoff.is_some()
        && p.done.is_empty()
        && restart == Restart::None
        && rules::machine_action(desired, want_of(o, p, goal), p.machine.as_ref()) == MachineAction::EnsureRunning
}

/// What idleness decides in this pass (SPEC 2.7), from the machine as the pass has it: a machine
/// this pass started or resumed was quiet for no time yet.
pub(super) fn sleep_of(o: &Observed, p: &Progress) -> rules::Sleep {
    let mut seen = o.seen;
    if p.started() {
        seen.quiet_since = o.now;
    }
    rules::sleep(o.vm, p.machine.as_ref(), &seen, o.now)
}

/// What the pass wants of the machine: the run goal, `spec.suspended`, and its idleness.
pub(super) fn want_of(o: &Observed, p: &Progress, goal: RunGoal) -> Want {
    Want::with_sleep(o.vm, goal, sleep_of(o, p))
}

/// A machine call, with the exposure of the machine as it is written first on the pass's first
/// machine call.
fn machine_call(o: &Observed, p: &Progress, call: Call, record_first: Option<String>) -> Decision {
    let expose_first = if p.exposed.is_none() {
        let runs = p.machine.as_ref().is_some_and(|m| m.state == MachineState::Running);
        exposing(o, address_of(o).as_deref(), runs).writes
    } else {
        Vec::new()
    };
    Decision::Act {
        call,
        record_first,
        expose_first,
    }
}

/// The machine call that brings the machine in line, or `None` when it is (with the
/// ResizePending condition set or cleared on `out`).
fn next_machine_step(
    o: &Observed,
    desired: &MachineSpec,
    want: Want,
    machine: Option<&MachineStatus>,
    out: &mut Outcome,
    warnings: &mut Vec<Note>,
    resume_pending: &mut Option<String>,
) -> Option<Call> {
    match rules::machine_action(desired, want, machine) {
        MachineAction::Create(spec) => Some(Call::Create(spec)),
        MachineAction::EnsureRunning => Some(Call::EnsureRunning),
        MachineAction::Stop => Some(Call::Stop),
        MachineAction::Suspend => Some(Call::Suspend),
        MachineAction::Discard => Some(Call::Discard),
        MachineAction::Resume => {
            // A resume takes the VM's CPU and memory back: it needs them free on its node (its
            // allocatable minus what the other VMs bound there hold). Without room it waits
            // there, saying what is missing; a bound VM never moves.
            let request = o.vm.spec.request();
            match rules::resume_shortfall(&request, o.room.allocatable.as_ref(), &o.room.others, o.node) {
                // A wake the namespace's quota cannot hold waits as well (the controller charges
                // it: no user's write did).
                None => match &o.quota_refused {
                    Some(refused) if rules::idle_suspended(machine) => {
                        *resume_pending = Some(refused.clone());
                        None
                    }
                    _ => Some(Call::Resume),
                },
                Some(message) => {
                    *resume_pending = Some(message);
                    None
                }
            }
        }
        MachineAction::Resize(spec) => {
            // A resize up needs room on the node: its allocatable minus what the other VMs bound
            // there hold. Without it the node is not asked; the VM reports why.
            let current = machine.map(rules::machine_resources).unwrap_or_default();
            let short = rules::resize_shortfall(
                &spec,
                &o.vm.spec.request(),
                &current,
                o.room.allocatable.as_ref(),
                &o.room.others,
            );
            let Some(short) = short else {
                return Some(Call::Resize(spec));
            };
            let message = short.message(o.node);
            if out.set(
                o,
                condition::RESIZE_PENDING,
                "True",
                reason::INSUFFICIENT_CAPACITY,
                &message,
            ) {
                warnings.push(Note::warning(reason::INSUFFICIENT_CAPACITY, "Resize", message));
            }
            None
        }
        MachineAction::ResizePending(message) => {
            out.set(
                o,
                condition::RESIZE_PENDING,
                "True",
                reason::RESIZE_NOT_APPLIED,
                &message,
            );
            None
        }
        MachineAction::None | MachineAction::BindVolumes(_) => {
            rules::clear_condition(&mut out.status.conditions, condition::RESIZE_PENDING);
            None
        }
    }
}
