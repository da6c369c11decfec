//! The rules of a SmolVM status write (V9 and the machine name).

use crate::{admission::Operation, policy::Role, syntax, types::SmolVM};

use super::{context::*, verdict::*};

/// Validates a write to `smolvms/status` (rule V9).
pub fn validate_smolvm_status(op: Operation, old: Option<&SmolVM>, new: &SmolVM, ctx: &Context<'_>) -> Verdict {
    let mut v = Verdict::default();
    if op != Operation::Update {
        return v;
    }
    let empty = Default::default();
    let old_status = old.and_then(|o| o.status.as_ref()).unwrap_or(&empty);
    let new_status = new.status.as_ref().unwrap_or(&empty);
    let fields = [
        ("status.nodeName", &old_status.node_name, &new_status.node_name),
        ("status.nodeUID", &old_status.node_uid, &new_status.node_uid),
    ];
    let mut binding_written = false;
    for (path, before, after) in fields {
        match (before, after) {
            (Some(b), Some(a)) if a != b => v.violation(
                RuleId::V9,
                path,
                render(a),
                format!(
                    "{} cannot replace {}: the binding never changes; SmolVMs never move",
                    render(a),
                    render(b)
                ),
            ),
            (Some(b), None) => v.violation(
                RuleId::V9,
                path,
                String::new(),
                format!("cannot be cleared (was {}): the binding never changes", render(b)),
            ),
            (None, Some(_)) => binding_written = true,
            _ => {}
        }
    }
    if binding_written {
        if ctx.role() != Role::Controller {
            v.violation(
                RuleId::V9,
                "status.nodeName",
                render(&new_status.node_name),
                format!(
                    "{}: only the controller may write the binding fields; {} may not",
                    render(&new_status.node_name),
                    render(&ctx.identity.username)
                ),
            );
        }
        if new_status.node_name.is_none() || new_status.node_uid.is_none() {
            v.violation(
                RuleId::V9,
                "status.nodeName",
                render(&new_status.node_name),
                format!(
                    "{} with status.nodeUID {}: status.nodeName and status.nodeUID are written together",
                    render(&new_status.node_name),
                    render(&new_status.node_uid)
                ),
            );
        }
        if let Some(name) = &new_status.node_name
            && let Err(reason) = syntax::check_dns1123_subdomain(name)
        {
            v.violation(
                RuleId::V9,
                "status.nodeName",
                render(name),
                format!("{} {reason}", render(name)),
            );
        }
    }
    check_machine_name(old_status, new, ctx, &mut v);
    if let (Some(bound), Some(pin)) = (&new_status.node_name, &new.spec.node_name)
        && bound != pin
    {
        v.violation(
            RuleId::V9,
            "status.nodeName",
            render(bound),
            format!("{} must equal the pin spec.nodeName {}", render(bound), render(pin)),
        );
    }
    v
}

/// V9 for `status.machineName`: written once, by the controller, as `svm-<metadata.uid>`. The
/// controller never acts on this field (it derives the name from the UID), so the rule keeps the
/// report honest rather than guarding the machine; both hold even for a cluster admin.
fn check_machine_name(old_status: &crate::types::SmolVMStatus, new: &SmolVM, ctx: &Context<'_>, v: &mut Verdict) {
    const PATH: &str = "status.machineName";
    let after = new.status.as_ref().and_then(|s| s.machine_name.as_ref());
    match (&old_status.machine_name, after) {
        (Some(b), Some(a)) if a != b => v.violation(
            RuleId::V9,
            PATH,
            render(a),
            format!(
                "{} cannot replace {}: the machine name is written once and never changes",
                render(a),
                render(b)
            ),
        ),
        (Some(b), None) => v.violation(
            RuleId::V9,
            PATH,
            String::new(),
            format!("cannot be cleared (was {}): the machine name never changes", render(b)),
        ),
        (None, Some(a)) => {
            if ctx.role() != Role::Controller {
                v.violation(
                    RuleId::V9,
                    PATH,
                    render(a),
                    format!(
                        "{}: only the controller may write the machine name; {} may not",
                        render(a),
                        render(&ctx.identity.username)
                    ),
                );
            }
            match new.machine_name() {
                Some(expected) if *a != expected => v.violation(
                    RuleId::V9,
                    PATH,
                    render(a),
                    format!(
                        "{} must be {}: the machine name is svm-<metadata.uid>",
                        render(a),
                        render(&expected)
                    ),
                ),
                _ => {}
            }
        }
        _ => {}
    }
}
