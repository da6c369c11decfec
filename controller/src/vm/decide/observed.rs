//! What a pass over a bound SmolVM observed before acting ([`Observed`], read by
//! [`crate::vm::observe`]), and the room its node has for it ([`Room`]).

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    jiff::Timestamp,
};
use smolvm_api::{NodeResources, SmolVM, SmolVMNode};

use crate::vm::rules::{self, BranchSource, NodeHealth, PoolOf};
use crate::vm::volumes;

/// What a pass over a bound SmolVM observed before acting, from the caches.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The SmolVM as the cache holds it.
    pub vm: &'a SmolVM,
    /// The node it is bound to.
    pub node: &'a str,
    /// Its machine's name on that node.
    pub machine: &'a str,
    /// The node's SmolVMNode, if there is one.
    pub node_object: Option<&'a SmolVMNode>,
    /// The node's health as the controller judges it ([`crate::vm::rules::node_health`]).
    pub health: NodeHealth,
    /// The Service of the SmolVM's name, if one exists (whoever owns it).
    pub service: Option<&'a Service>,
    /// The EndpointSlice of the SmolVM's name, if one exists (whoever owns it).
    pub slice: Option<&'a EndpointSlice>,
    /// What the node has for this VM, for a resize.
    pub room: Room,
    /// The controller's clock.
    pub now: Timestamp,
    /// How long the machine's next start waits: its last start failed that recently (the
    /// backoff of [`crate::vm::StartFailures`], as the kubelet's CrashLoopBackOff).
    pub start_backoff: Option<std::time::Duration>,
    /// What was observed of its volumes; `None` for a SmolVM without volumes.
    pub volumes: Option<&'a volumes::Seen>,
    /// The pool it names, as its create would take it ([`PoolOf::None`] when it names none, or
    /// was made already).
    pub pool: &'a PoolOf,
    /// The source it is a branch of, as its create would branch it ([`BranchSource::None`] when
    /// it is no branch, or was made already).
    pub source: &'a BranchSource,
    /// What the controller saw of its machine's use, for its idle suspension (SPEC 2.7).
    pub seen: rules::Use,
    /// Why its namespace's quota refused the charge of its wake, when the act step tried it
    /// (the wake then waits as ResumePending, saying so).
    pub quota_refused: Option<String>,
}

/// What a node has for one VM: its allocatable (when it reports one) and what every other VM
/// bound there holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Room {
    /// The node's allocatable.
    pub allocatable: Option<NodeResources>,
    /// What the other VMs bound there hold.
    pub others: NodeResources,
}
