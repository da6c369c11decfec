//! How long a SmolVM lives and when it sleeps (SPEC 2.7). As a Job's lifetimes, a SmolVM can be
//! deleted a while after its machine finished (`ttlSecondsAfterFinished`) or a while after it
//! first ran (`activeDeadlineSeconds`): the controller decides the expiry from `status.startedAt`
//! and `status.finishedAt`, and deletes the SmolVM through its normal node-aware finalizer. As a
//! Fly.io Machine's auto-stop, a running VM whose published ports and access sessions were quiet
//! for `suspendAfterIdle` is suspended by the controller, and (`wakeOnTraffic`) resumed by the
//! next connection to one of its ports, which its node's forwarder holds until it runs.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The longest lifetime either field accepts: ten years, in seconds (V18). Longer ones are no
/// lifetime at all, and a bound keeps the deadline's arithmetic in range.
pub const MAX_LIFETIME_SECONDS: i64 = 10 * 366 * 24 * 3600;

/// The shortest `suspendAfterIdle` (V18): idleness is seen at the heartbeat's grain (10 s by
/// default), so a shorter one would suspend VMs between two looks.
pub const MIN_SUSPEND_AFTER_IDLE_SECONDS: u64 = 30;

/// How long a SmolVM lives, and when it sleeps (SPEC 2.7).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Suspend the VM once its published ports carried no byte either way, and no exec, log-follow or copy session was open, for this long: a duration as Kubernetes writes one (`30s`, `5m`, `1h30m`), at least 30s and at most the policy's maxSuspendAfterIdleSeconds (7 days by default). The suspension is the controller's: spec.suspended stays false, and the Suspended condition says IdleSuspended. Unset: never suspended for idleness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub suspend_after_idle: Option<String>,

    /// Resume a VM suspended for idleness when a connection arrives at one of its published ports (the node holds the connection until the VM runs, then relays it, so the first client is served) or an exec or copy is asked for through `kubectl smolvm`. Defaulted to true when suspendAfterIdle is set (rule M6); needs suspendAfterIdle. False: only `kubectl smolvm resume` wakes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_on_traffic: Option<bool>,

    /// Seconds after the machine finished (stopped on its own, and its restartPolicy keeps it stopped: Never, or OnFailure after a clean exit) after which the SmolVM is deleted, as a Job's `ttlSecondsAfterFinished`. 0 deletes it as soon as it finishes. Counted from `status.finishedAt`; a machine run again (spec.running false, then true) before then starts over. Unset: a finished SmolVM stays. 0 to 316224000 (ten years).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 316_224_000))]
    pub ttl_seconds_after_finished: Option<i64>,

    /// Seconds after the machine first ran (`status.startedAt`) after which the SmolVM is deleted, whatever it is doing then, as a Job's `activeDeadlineSeconds`: a bound on how long it may live, stopped and suspended time included. Unset: no bound. 0 to 316224000 (ten years).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 316_224_000))]
    pub active_deadline_seconds: Option<i64>,
}

impl Lifecycle {
    /// `suspendAfterIdle` as a duration, when it is set and valid (V18 reports the rest).
    pub fn idle_after(&self) -> Option<std::time::Duration> {
        crate::syntax::parse_duration(self.suspend_after_idle.as_deref()?).ok()
    }

    /// Whether traffic wakes it: `wakeOnTraffic`, true by default with `suspendAfterIdle` (M6).
    pub fn wakes_on_traffic(&self) -> bool {
        self.suspend_after_idle.is_some() && self.wake_on_traffic.unwrap_or(true)
    }
}
