//! The rules of a SmolVMNode write (V10): a runtime writes only its own node, and the status
//! it reports must be coherent.

use crate::{constants::EXTRA_NODE_NAME, policy::Role, syntax, types::SmolVMNode};

use super::{context::*, verdict::*};

/// Validates a write to a SmolVMNode (rule V10).
pub fn validate_smolvm_node(op: Operation, old: Option<&SmolVMNode>, new: &SmolVMNode, ctx: &Context<'_>) -> Verdict {
    let mut v = Verdict::default();
    if !matches!(op, Operation::Create | Operation::Update) {
        return v;
    }
    check_own_node(new, ctx, &mut v);
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
pub fn validate_smolvm_node_status(
    op: Operation,
    _old: Option<&SmolVMNode>,
    new: &SmolVMNode,
    ctx: &Context<'_>,
) -> Verdict {
    let mut v = Verdict::default();
    if !matches!(op, Operation::Create | Operation::Update) {
        return v;
    }
    check_own_node(new, ctx, &mut v);
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
