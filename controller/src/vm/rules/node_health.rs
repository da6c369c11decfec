//! The health of the node a SmolVM is bound to ([`NodeHealth`]), as far as the API server shows
//! it: its SmolVMNode, the node UID it reports, its heartbeat and its Ready condition.

use k8s_openapi::jiff::Timestamp;
use smolvm_api::{SmolVM, SmolVMNode, constants::condition};

/// The health of the node a SmolVM is bound to, as far as the API server shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeHealth {
    /// Ready with a fresh heartbeat and the bound UID.
    Healthy,
    /// No SmolVMNode of that name.
    Missing,
    /// The SmolVMNode reports another node UID than the binding: the node was replaced.
    Replaced {
        /// UID in the binding.
        bound: String,
        /// UID the node reports now.
        reported: String,
    },
    /// The heartbeat is stale or missing, or Ready is not True.
    Unreachable {
        /// Why, for the condition message.
        why: String,
    },
}

/// Judges the bound node; its heartbeat's age as `liveness` judges it (the controller's clock).
pub fn node_health(
    vm: &SmolVM,
    node: Option<&SmolVMNode>,
    now: Timestamp,
    liveness: &crate::placement::Config,
) -> NodeHealth {
    let Some(node) = node else { return NodeHealth::Missing };
    let Some(status) = &node.status else {
        return NodeHealth::Unreachable {
            why: "the node reports no status".into(),
        };
    };
    let bound_uid = vm.status.as_ref().and_then(|s| s.node_uid.as_deref());
    if let (Some(bound), Some(reported)) = (bound_uid, status.node_uid.as_deref())
        && bound != reported
    {
        return NodeHealth::Replaced {
            bound: bound.into(),
            reported: reported.into(),
        };
    }
    match liveness.heartbeat_age(node, now) {
        Some(age) if age <= liveness.heartbeat_timeout => {}
        Some(age) => {
            return NodeHealth::Unreachable {
                why: format!("its heartbeat has not changed for {}s", age.as_secs()),
            };
        }
        None => {
            return NodeHealth::Unreachable {
                why: "it never sent a heartbeat".into(),
            };
        }
    }
    let ready = status.conditions.iter().find(|c| c.type_ == condition::READY);
    match ready {
        Some(c) if c.status == "True" => NodeHealth::Healthy,
        Some(c) => NodeHealth::Unreachable {
            why: format!("its runtime is not Ready ({}: {})", c.reason, c.message),
        },
        None => NodeHealth::Unreachable {
            why: "its runtime reports no Ready condition".into(),
        },
    }
}
