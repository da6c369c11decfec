//! What validation knows besides the objects: who sent the request ([`Identity`]), the known
//! SmolVMNodes ([`NodeCatalog`]), SmolVMClasses ([`ClassCatalog`]) and SmolVMPools
//! ([`PoolCatalog`]) and the policy, gathered
//! in [`Context`].

use std::{borrow::Borrow, collections::BTreeMap};

use crate::{
    branch::SourceCatalog,
    class::ClassCatalog,
    constants::{EXTRA_NODE_NAME, EXTRA_NODE_UID},
    policy::{Policy, Role},
    pool::PoolCatalog,
    types::{NodeResources, SmolVMNode},
};

/// Who sent the request, as the API server authenticated them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// Username, such as `system:serviceaccount:smolvm-system:smolvm-runtime`.
    pub username: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes; a pod-bound ServiceAccount token carries the node name and UID here.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// An identity with only a username.
    pub fn user(username: impl Into<String>) -> Self {
        Identity {
            username: username.into(),
            ..Default::default()
        }
    }

    /// The node named in the token (`authentication.kubernetes.io/node-name`), if exactly one.
    pub fn node_name(&self) -> Option<&str> {
        single(self.extra.get(EXTRA_NODE_NAME))
    }

    /// The node UID named in the token (`authentication.kubernetes.io/node-uid`), if exactly one.
    pub fn node_uid(&self) -> Option<&str> {
        single(self.extra.get(EXTRA_NODE_UID))
    }
}

fn single(values: Option<&Vec<String>>) -> Option<&str> {
    match values.map(Vec::as_slice) {
        Some([one]) => Some(one.as_str()),
        _ => None,
    }
}

/// The known SmolVMNodes, as the webhook's cache sees them.
pub trait NodeCatalog {
    /// `None` when no SmolVMNode of that name is known; otherwise its facts.
    fn node(&self, name: &str) -> Option<NodeFacts>;
    /// Whether any known node satisfies `pred`.
    fn any_node(&self, pred: &mut dyn FnMut(&SmolVMNode) -> bool) -> bool;
    /// Whether no node is known at all.
    fn is_empty(&self) -> bool;
}

/// What the rules need to know of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// Allocatable resources, if the runtime reported them.
    pub allocatable: Option<NodeResources>,
    /// Whether the node is cordoned for VMs.
    pub unschedulable: bool,
}

impl NodeFacts {
    /// Facts of a SmolVMNode object.
    pub fn of(node: &SmolVMNode) -> Self {
        NodeFacts {
            allocatable: node.status.as_ref().and_then(|s| s.allocatable),
            unschedulable: node.spec.unschedulable.unwrap_or(false),
        }
    }
}

pub(super) fn name_of(node: &SmolVMNode) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

/// A list of nodes, owned or shared (`Vec<SmolVMNode>`, `Vec<Arc<SmolVMNode>>`).
impl<T: Borrow<SmolVMNode>> NodeCatalog for Vec<T> {
    fn node(&self, name: &str) -> Option<NodeFacts> {
        self.iter()
            .map(Borrow::borrow)
            .find(|n| name_of(n) == name)
            .map(NodeFacts::of)
    }
    fn any_node(&self, pred: &mut dyn FnMut(&SmolVMNode) -> bool) -> bool {
        self.iter().any(|n| pred(n.borrow()))
    }
    fn is_empty(&self) -> bool {
        Vec::is_empty(self)
    }
}

/// Everything validation depends on besides the objects.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    /// The admission policy.
    pub policy: &'a Policy,
    /// The known SmolVMNodes.
    pub nodes: &'a dyn NodeCatalog,
    /// The known SmolVMClasses (rule V12; [`crate::class::NO_CLASSES`] where there are none).
    pub classes: &'a dyn ClassCatalog,
    /// The known SmolVMPools (rule V14; [`crate::pool::NO_POOLS`] where there are none).
    pub pools: &'a dyn PoolCatalog,
    /// The known branch sources (rule V17; [`crate::branch::NO_SOURCES`] where there are none).
    pub sources: &'a dyn SourceCatalog,
    /// The requester.
    pub identity: &'a Identity,
}

impl Context<'_> {
    pub(super) fn role(&self) -> Role {
        self.policy.role_of(&self.identity.username)
    }
}
