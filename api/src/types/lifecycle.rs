//! How long a SmolVM lives (SPEC 2.7): as a Job's lifetimes, a SmolVM can be deleted a while
//! after its machine finished (`ttlSecondsAfterFinished`) or a while after it first ran
//! (`activeDeadlineSeconds`). The controller decides the expiry from `status.startedAt` and
//! `status.finishedAt`, and deletes the SmolVM through its normal node-aware finalizer.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The longest lifetime either field accepts: ten years, in seconds (V18). Longer ones are no
/// lifetime at all, and a bound keeps the deadline's arithmetic in range.
pub const MAX_LIFETIME_SECONDS: i64 = 10 * 366 * 24 * 3600;

/// How long a SmolVM lives (SPEC 2.7).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Seconds after the machine finished (stopped on its own, and its restartPolicy keeps it stopped: Never, or OnFailure after a clean exit) after which the SmolVM is deleted, as a Job's `ttlSecondsAfterFinished`. 0 deletes it as soon as it finishes. Counted from `status.finishedAt`; a machine run again (spec.running false, then true) before then starts over. Unset: a finished SmolVM stays. 0 to 316224000 (ten years).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 316_224_000))]
    pub ttl_seconds_after_finished: Option<i64>,

    /// Seconds after the machine first ran (`status.startedAt`) after which the SmolVM is deleted, whatever it is doing then, as a Job's `activeDeadlineSeconds`: a bound on how long it may live, stopped and suspended time included. Unset: no bound. 0 to 316224000 (ten years).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 316_224_000))]
    pub active_deadline_seconds: Option<i64>,
}
