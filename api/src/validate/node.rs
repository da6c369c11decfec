//! The rules of a SmolVMNode write (V10): a runtime writes only its own node, sets on it only its
//! status and its own labels, and the status it reports must be coherent.
//!
//! The API server enforces the same with the ValidatingAdmissionPolicy `smolvm-runtime-own-node`
//! (deploy/base/admission-policies/identity.yaml), so that it holds while the webhook is down;
//! the two say the same.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::{
    admission::Operation,
    constants::{AGENT_LABELS, EXTRA_NODE_NAME, RECHECK_BOOT_ANNOTATION},
    policy::Role,
    syntax,
    types::SmolVMNode,
};

use super::{context::*, verdict::*};

/// Validates a write to a SmolVMNode (rule V10).
pub fn validate_smolvm_node(op: Operation, old: Option<&SmolVMNode>, new: &SmolVMNode, ctx: &Context<'_>) -> Verdict {
    let mut v = Verdict::default();
    if !matches!(op, Operation::Create | Operation::Update) {
        return v;
    }
    check_own_node(new, ctx, &mut v);
    check_runtime_metadata(op, old, new, ctx, &mut v);
    if ctx.role() == Role::Runtime {
        let before = old.and_then(|o| o.spec.unschedulable).unwrap_or(false);
        let after = new.spec.unschedulable.unwrap_or(false);
        if before != after {
            v.violation(
                RuleId::V10,
                "spec.unschedulable",
                after.to_string(),
                format!("{after} (was {before}): it is the cluster admin's cordon; a runtime agent may not change it"),
            );
        }
    }
    check_node_status(new, &mut v);
    v
}

/// Validates a write to `smolvmnodes/status` (rule V10).
///
/// The API server keeps a status write from changing metadata (it takes the stored object's),
/// so the metadata rules hold there trivially; they are checked all the same, as the policy does.
pub fn validate_smolvm_node_status(
    op: Operation,
    old: Option<&SmolVMNode>,
    new: &SmolVMNode,
    ctx: &Context<'_>,
) -> Verdict {
    let mut v = Verdict::default();
    if !matches!(op, Operation::Create | Operation::Update) {
        return v;
    }
    check_own_node(new, ctx, &mut v);
    check_runtime_metadata(op, old, new, ctx, &mut v);
    if ctx.role() == Role::Runtime
        && let (Some(claim), Some(uid)) = (
            ctx.identity.node_uid(),
            new.status.as_ref().and_then(|s| s.node_uid.as_deref()),
        )
        && claim != uid
    {
        v.violation(
            RuleId::V10,
            "status.nodeUID",
            render(uid),
            format!(
                "{} is not the UID of the requester's node ({})",
                render(uid),
                render(claim)
            ),
        );
    }
    check_node_status(new, &mut v);
    v
}

/// V10: a runtime identity writes only the SmolVMNode of its own node.
fn check_own_node(node: &SmolVMNode, ctx: &Context<'_>, v: &mut Verdict) {
    if ctx.role() != Role::Runtime {
        return;
    }
    let name = name_of(node);
    match ctx.identity.node_name() {
        Some(own) if own == name => {}
        Some(own) => v.violation(
            RuleId::V10,
            "metadata.name",
            render(name),
            format!(
                "{} is not this runtime agent's node: a runtime agent may only write the SmolVMNode of its own node; {} runs on {}",
                render(name),
                render(&ctx.identity.username),
                render(own)
            )),
        None => v.violation(
            RuleId::V10,
            "metadata.name",
            render(name),
            format!(
                "{} cannot be written by the runtime identity {}: it carries no node claim ({EXTRA_NODE_NAME}); use a pod-bound ServiceAccount token",
                render(name),
                render(&ctx.identity.username)
            )),
    }
}

/// What a runtime agent may not do with its labels, each violation's message after its value.
const LABEL_RULE: &str = "a runtime agent sets only its own labels on its SmolVMNode \
    (vm.smolvm.dev/guest-bootable, vm.smolvm.dev/nested-virt, vm.smolvm.dev/gpu-count); the others \
    are the cluster admin's or mirrored from the Node by the controller";

/// V10: the metadata a runtime agent writes on its SmolVMNode, as the kubelet's NodeRestriction
/// keeps a kubelet to its own Node's labels. At CREATE: labels only among [`AGENT_LABELS`], no
/// annotation, no finalizer, and no owner but its own Node. At UPDATE: every other label as it
/// was, the annotations as they were (but for removing [`RECHECK_BOOT_ANNOTATION`], which the
/// agent does once it acted on it), the finalizers and owner references as they were. A
/// node that could label itself `tenant: a` would be given tenant a's VMs and pools, with their
/// Secrets. Every offending key is one violation.
fn check_runtime_metadata(
    op: Operation,
    old: Option<&SmolVMNode>,
    new: &SmolVMNode,
    ctx: &Context<'_>,
    v: &mut Verdict,
) {
    if ctx.role() != Role::Runtime {
        return;
    }
    // At CREATE, everything the object carries is new: compared with nothing.
    let old = old.filter(|_| op == Operation::Update);
    let old_meta = old.map(|n| &n.metadata);
    check_runtime_labels(
        new.metadata.labels.as_ref(),
        old_meta.and_then(|m| m.labels.as_ref()),
        v,
    );
    check_runtime_annotations(
        new.metadata.annotations.as_ref(),
        old_meta.and_then(|m| m.annotations.as_ref()),
        v,
    );
    let finalizers = new.metadata.finalizers.as_deref().unwrap_or_default();
    let old_finalizers = old_meta.and_then(|m| m.finalizers.as_deref()).unwrap_or_default();
    if finalizers != old_finalizers {
        v.violation(
            RuleId::V10,
            "metadata.finalizers",
            render(finalizers),
            format!(
                "{} (was {}): a runtime agent may not set or change the finalizers of its SmolVMNode",
                render(finalizers),
                render(old_finalizers)
            ),
        );
    }
    check_runtime_owners(old, new, ctx, v);
}

/// V10 on the labels: every label but [`AGENT_LABELS`] as it was (none at CREATE).
fn check_runtime_labels(
    labels: Option<&BTreeMap<String, String>>,
    old_labels: Option<&BTreeMap<String, String>>,
    v: &mut Verdict,
) {
    let empty = BTreeMap::new();
    let (labels, old_labels) = (labels.unwrap_or(&empty), old_labels.unwrap_or(&empty));
    for (key, value) in labels {
        let was = old_labels.get(key);
        if AGENT_LABELS.contains(&key.as_str()) || was == Some(value) {
            continue;
        }
        let before = was.map(|w| format!(" (was {})", render(w))).unwrap_or_default();
        v.violation(
            RuleId::V10,
            &format!("metadata.labels[{}]", render(key)),
            render(value),
            format!("{}{before}: {LABEL_RULE}", render(value)),
        );
    }
    for (key, was) in old_labels {
        if AGENT_LABELS.contains(&key.as_str()) || labels.contains_key(key) {
            continue;
        }
        v.violation(
            RuleId::V10,
            &format!("metadata.labels[{}]", render(key)),
            String::new(),
            format!("removed (was {}): {LABEL_RULE}", render(was)),
        );
    }
}

/// V10 on the annotations: as they were (none at CREATE), but for removing
/// [`RECHECK_BOOT_ANNOTATION`].
fn check_runtime_annotations(
    annotations: Option<&BTreeMap<String, String>>,
    old_annotations: Option<&BTreeMap<String, String>>,
    v: &mut Verdict,
) {
    let empty = BTreeMap::new();
    let (annotations, old_annotations) = (annotations.unwrap_or(&empty), old_annotations.unwrap_or(&empty));
    let annotation_rule = "a runtime agent may not set, change or remove annotations on its SmolVMNode \
        (it only removes vm.smolvm.dev/recheck-boot once it acted on it)";
    for (key, value) in annotations {
        if old_annotations.get(key) != Some(value) {
            v.violation(
                RuleId::V10,
                &format!("metadata.annotations[{}]", render(key)),
                render(value),
                format!("{}: {annotation_rule}", render(value)),
            );
        }
    }
    for key in old_annotations.keys() {
        if key != RECHECK_BOOT_ANNOTATION && !annotations.contains_key(key) {
            v.violation(
                RuleId::V10,
                &format!("metadata.annotations[{}]", render(key)),
                String::new(),
                format!("removed: {annotation_rule}"),
            );
        }
    }
}

/// V10 on the owner references: as they were at UPDATE; at CREATE, only the agent's own Node.
fn check_runtime_owners(old: Option<&SmolVMNode>, new: &SmolVMNode, ctx: &Context<'_>, v: &mut Verdict) {
    let owners = new.metadata.owner_references.as_deref().unwrap_or_default();
    if let Some(old) = old {
        let old_owners = old.metadata.owner_references.as_deref().unwrap_or_default();
        if owners != old_owners {
            v.violation(
                RuleId::V10,
                "metadata.ownerReferences",
                render(owners),
                format!(
                    "{}: a runtime agent may not change the owner references of its SmolVMNode",
                    render(owners)
                ),
            );
        }
        return;
    }
    let name = name_of(new);
    let uid = ctx.identity.node_uid();
    for (i, owner) in owners.iter().enumerate() {
        if !is_own_node(owner, name, uid) {
            v.violation(
                RuleId::V10,
                &format!("metadata.ownerReferences[{i}]"),
                render(owner),
                format!(
                    "{}: a runtime agent's SmolVMNode is owned by its own Node only (v1 Node {}{})",
                    render(owner),
                    render(name),
                    uid.map(|u| format!(", uid {}", render(u))).unwrap_or_default()
                ),
            );
        }
    }
}

/// Whether `owner` is the Node `name` (of UID `uid`, when the token names one).
fn is_own_node(owner: &OwnerReference, name: &str, uid: Option<&str>) -> bool {
    owner.api_version == "v1" && owner.kind == "Node" && owner.name == name && uid.is_none_or(|u| owner.uid == u)
}

fn check_node_status(node: &SmolVMNode, v: &mut Verdict) {
    let Some(endpoint) = node.status.as_ref().and_then(|s| s.endpoint.as_ref()) else {
        return;
    };
    if let Err(reason) = syntax::check_address(&endpoint.address) {
        v.violation(
            RuleId::V10,
            "status.endpoint.address",
            render(&endpoint.address),
            format!("{} {reason}", render(&endpoint.address)),
        );
    }
    if !(1..=65535).contains(&endpoint.port) {
        v.violation(
            RuleId::V10,
            "status.endpoint.port",
            endpoint.port.to_string(),
            format!("{} is not a port number (1-65535)", endpoint.port),
        );
    }
}
