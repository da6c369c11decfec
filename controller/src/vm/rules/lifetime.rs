//! Lifetimes (SPEC 2.7), as pure functions of the SmolVM, its status and the time: when it first
//! ran and when it finished ([`stamp`]), and whether one of its lifetimes passed ([`expiry`]):
//! `activeDeadlineSeconds` after `status.startedAt`, `ttlSecondsAfterFinished` after
//! `status.finishedAt`, as a Job's.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use smolvm_api::{Phase, SmolVMSpec, SmolVMStatus, constants::condition, constants::reason};

/// What a SmolVM's lifetimes decide now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expiry {
    /// No lifetime runs: none is set, or what it counts from has not happened.
    Never,
    /// The first lifetime to pass passes after this long.
    In(Duration),
    /// A lifetime passed: the SmolVM is deleted. `lifetime` names the field (a metric's label),
    /// `message` says when it passed.
    Now {
        /// `activeDeadlineSeconds` or `ttlSecondsAfterFinished`.
        lifetime: &'static str,
        /// What passed, for the event and the condition.
        message: String,
    },
}

/// Records in `status` (the one a pass is about to write) when the machine first ran and when it
/// finished. `startedAt` is written at the first Running phase and never again. `finishedAt` is
/// set while Ready says Exited (it stopped on its own and its restartPolicy keeps it stopped),
/// kept from the first pass that saw it, and cleared once the machine is anything else it can be
/// on a node it answers for; a node that cannot be reached (Unknown) changes neither.
pub fn stamp(status: &mut SmolVMStatus, now: Timestamp) {
    if status.phase == Some(Phase::Running) && status.started_at.is_none() {
        status.started_at = Some(Time(now));
    }
    let exited = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::READY && c.reason == reason::EXITED);
    if exited {
        status.finished_at.get_or_insert(Time(now));
    } else if !matches!(
        status.phase,
        None | Some(Phase::Unknown | Phase::Deleting | Phase::Pending)
    ) {
        status.finished_at = None;
    }
}

/// Decides the SmolVM's lifetimes at `now` from its spec and the status [`stamp`] left: the
/// first to pass (the deadline before the TTL at the same instant). Pure.
pub fn expiry(spec: &SmolVMSpec, status: &SmolVMStatus, now: Timestamp) -> Expiry {
    let lifetimes = [
        (
            "activeDeadlineSeconds",
            spec.active_deadline_seconds(),
            status.started_at.as_ref(),
            "first ran",
        ),
        (
            "ttlSecondsAfterFinished",
            spec.ttl_seconds_after_finished(),
            status.finished_at.as_ref(),
            "finished",
        ),
    ];
    let mut first: Option<(Timestamp, &'static str, i64, Timestamp, &str)> = None;
    for (lifetime, seconds, since, what) in lifetimes {
        let (Some(seconds), Some(Time(since))) = (seconds, since) else {
            continue;
        };
        // A lifetime past the end of time never passes (V18 bounds it to ten years).
        let Ok(due) = since.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds)) else {
            continue;
        };
        if first.is_none_or(|(earliest, ..)| due < earliest) {
            first = Some((due, lifetime, seconds, *since, what));
        }
    }
    let Some((due, lifetime, seconds, since, what)) = first else {
        return Expiry::Never;
    };
    if due <= now {
        let message = format!(
            "lifecycle.{lifetime} ({seconds} s) passed: it {what} at {}; the SmolVM is deleted, its machine with it",
            since.strftime("%Y-%m-%dT%H:%M:%SZ"),
        );
        return Expiry::Now { lifetime, message };
    }
    let left = due.duration_since(now).unsigned_abs();
    Expiry::In(left)
}
