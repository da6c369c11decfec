//! What a VM asks of a node ([`Request`]), and where its volumes' data can be reached
//! ([`VolumeReach`]): a PersistentVolume's node affinity, matched as the scheduler matches it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};
use smolvm_api::{NodeResources, Port, Protocol, SmolVM, SmolVMNode};

/// What a VM asks of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// CPUs, memory and disk (storage plus overlay).
    pub resources: NodeResources,
    /// Host ports it forwards, with their protocols.
    pub host_ports: Vec<(i32, Protocol)>,
    /// Labels the node must carry.
    pub node_selector: BTreeMap<String, String>,
    /// Hard pin, if any.
    pub pin: Option<String>,
    /// The branch source whose node the pin is (SPEC 2.6), for a branch.
    pub source: Option<String>,
    /// Where its volumes' data can be reached: one entry per claim bound to a PersistentVolume
    /// with a node affinity (a local PV), which restricts the nodes (SPEC 2.5).
    pub volumes: Vec<VolumeReach>,
}

impl Request {
    /// The request of a SmolVM, defaults applied.
    pub fn of(vm: &SmolVM) -> Self {
        Request {
            resources: vm.spec.request(),
            host_ports: host_ports(vm.spec.ports()),
            node_selector: vm.spec.node_selector.clone().unwrap_or_default(),
            pin: vm.spec.node_name.clone(),
            source: None,
            volumes: Vec::new(),
        }
    }
}

/// A PersistentVolume a VM's claim is bound to whose node affinity restricts where its data can
/// be reached: only the nodes its terms select may take the VM.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeReach {
    /// The PersistentVolume's name, for the message.
    pub pv: String,
    /// Its `nodeAffinity.required.nodeSelectorTerms`: a node is reached when any term selects it.
    pub terms: Vec<NodeSelectorTerm>,
}

impl VolumeReach {
    /// Whether `node` can reach the data: some term selects it by its labels
    /// (`matchExpressions`) and its name (`matchFields` on `metadata.name`), as the scheduler
    /// matches a PV's node affinity. No terms: every node.
    pub fn reaches(&self, node: &SmolVMNode) -> bool {
        self.terms.is_empty() || self.terms.iter().any(|term| term_selects(term, node))
    }

    /// Where the PV's terms pin it, in words: the node names (or hostnames) they list,
    /// `pinned to node-b`; `limited by its node affinity` where they list none.
    pub fn pinned(&self) -> String {
        let mut named: Vec<&str> = self
            .terms
            .iter()
            .flat_map(|t| {
                let fields = t.match_fields.iter().flatten().filter(|r| r.key == "metadata.name");
                let labels = t.match_expressions.iter().flatten().filter(|r| r.key == HOSTNAME_LABEL);
                fields.chain(labels)
            })
            .filter(|r| r.operator == "In")
            .flat_map(|r| r.values.iter().flatten().map(String::as_str))
            .collect();
        named.sort_unstable();
        named.dedup();
        if named.is_empty() {
            format!("PV {} is limited by its node affinity", self.pv)
        } else {
            format!("PV {} is pinned to {}", self.pv, named.join(", "))
        }
    }
}

/// The label that names a node's host, which local PVs are pinned by.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Whether one node selector term selects `node`: every expression on its labels and every field
/// requirement (only `metadata.name` is defined) holds. An empty term selects nothing, as the
/// scheduler has it.
fn term_selects(term: &NodeSelectorTerm, node: &SmolVMNode) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = node.metadata.labels.as_ref();
    let name = node.metadata.name.as_deref();
    expressions
        .iter()
        .all(|r| requirement_holds(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_holds(r, name))
}

/// One node selector requirement against the value the node has for its key (`None`: absent).
fn requirement_holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let listed = value.is_some_and(|v| values.iter().any(|w| w == v));
    let number = |v: Option<&str>| v.and_then(|v| v.parse::<i64>().ok());
    let bound = values.first().and_then(|v| v.parse::<i64>().ok());
    match r.operator.as_str() {
        "In" => listed,
        "NotIn" => !listed,
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => matches!((number(value), bound), (Some(v), Some(b)) if v > b),
        "Lt" => matches!((number(value), bound), (Some(v), Some(b)) if v < b),
        _ => false,
    }
}

fn host_ports(ports: &[Port]) -> Vec<(i32, Protocol)> {
    ports.iter().map(|p| (p.host_port, p.protocol)).collect()
}
