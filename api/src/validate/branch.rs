//! The rules of branches (V17): a branch names a branchable SmolVM of its namespace, never
//! changes it, and sets only what a clone carries of its own; a branch source has no volumes, is
//! no branch itself and stays a source; the delete-branches annotation.

use serde_json::Value;

use crate::{
    admission::Operation,
    branch::{BRANCH_FIELDS, BRANCH_NETWORK_FIELDS},
    constants::{DELETE_BRANCHES_ANNOTATION, DELETE_BRANCHES_VALUE},
    types::SmolVM,
};

use super::{context::*, verdict::*};

/// V17 on a SmolVM write, on the object as defaulting left it: at CREATE its `branchOf` names a
/// branchable SmolVM of its namespace that is not being deleted; `branchable` and `branchOf`
/// never change after CREATE; a branch changes nothing but `running` and `suspended`; a
/// branchable SmolVM has no volumes and is no branch.
pub(super) fn check_branch(op: Operation, old: Option<&SmolVM>, new: &SmolVM, ctx: &Context<'_>, v: &mut Verdict) {
    let spec = &new.spec;
    if spec.branchable() && spec.branch_of.is_some() {
        v.violation(
            RuleId::V17,
            "spec.branchable",
            "true".into(),
            "true on a branch (spec.branchOf is set): a branch cannot be a branch source itself; branch its source instead".into(),
        );
    }
    if spec.branchable()
        && let Some(volumes) = spec.volumes.as_ref().filter(|v| !v.is_empty())
    {
        let count = format!("{} volume(s)", volumes.len());
        v.violation(
            RuleId::V17,
            "spec.volumes",
            count.clone(),
            format!("{count} on a branchable SmolVM: a branch would share its volumes with its source; a branch source carries none"),
        );
    }
    match (op, old) {
        (Operation::Update, Some(old)) => check_unchanged(old, new, v),
        (Operation::Create, _) => check_source(new, ctx, v),
        _ => {}
    }
}

/// At CREATE: the source a branch names exists in its namespace, is branchable, and is not being
/// deleted.
fn check_source(new: &SmolVM, ctx: &Context<'_>, v: &mut Verdict) {
    let Some(name) = new.spec.source() else { return };
    let namespace = new.metadata.namespace.as_deref().unwrap_or("");
    let path = "spec.branchOf.name";
    let known = || match ctx.sources.branchable_in(namespace).as_slice() {
        [] => "it has no branchable SmolVM (one sets spec.branchable: true)".to_string(),
        names => format!("its branchable SmolVMs: {}", names.join(", ")),
    };
    match ctx.sources.source(namespace, name) {
        None => v.violation(
            RuleId::V17,
            path,
            render(name),
            format!(
                "no SmolVM {} exists in namespace {}; {}",
                render(name),
                render(namespace),
                known()
            ),
        ),
        Some(source) if !source.spec.branchable() => v.violation(
            RuleId::V17,
            path,
            render(name),
            format!(
                "SmolVM {} is not branchable (its spec.branchable is not true, and never changes after its create); {}",
                render(name),
                known()
            ),
        ),
        Some(source) if source.is_deleting() => v.violation(
            RuleId::V17,
            path,
            render(name),
            format!("SmolVM {} is being deleted: it can no longer be branched", render(name)),
        ),
        Some(_) => {}
    }
}

/// At UPDATE: `branchable` and `branchOf` as they were; a branch's other fields as its source
/// gave them.
fn check_unchanged(old: &SmolVM, new: &SmolVM, v: &mut Verdict) {
    if old.spec.branchable() != new.spec.branchable() {
        v.violation(
            RuleId::V17,
            "spec.branchable",
            new.spec.branchable().to_string(),
            format!(
                "cannot change from {} to {}: a machine is started as a branch source or not at its create; delete and recreate to change it",
                old.spec.branchable(),
                new.spec.branchable()
            ),
        );
    }
    let (before, after) = (old.spec.source(), new.spec.source());
    if before != after {
        v.violation(
            RuleId::V17,
            "spec.branchOf",
            shown_name(after),
            format!(
                "cannot change from {} to {}: a SmolVM is a branch of one source, from its create; delete and recreate to change it",
                shown_name(before),
                shown_name(after)
            ),
        );
    } else if before.is_some() && !new.is_deleting() {
        for field in changed_fields(&old.spec, &new.spec, &["running", "suspended", "lifecycle"]) {
            v.violation(
                RuleId::V17,
                &format!("spec.{field}"),
                String::new(),
                format!(
                    "a branch changes only running, suspended and lifecycle; its {field} is its source's, or its own from its create: delete and recreate"
                ),
            );
        }
    }
}

/// V17 on a SmolVM at CREATE as it was sent, before its source fills it: a branch sets only
/// `branchOf`, `env`, `running`, `suspended` and, in `network`, `ports`; each other field it sets
/// is one violation naming it. Empty for a SmolVM that names no source.
pub fn validate_branch_request(object: &Value) -> Verdict {
    let mut verdict = Verdict::default();
    let Some(spec) = object.get("spec").and_then(Value::as_object) else {
        return verdict;
    };
    let Some(source) = crate::branch::source_named(object) else {
        return verdict;
    };
    let mut refuse = |path: String, value: &Value| {
        let shown = shown_value(value);
        verdict.violation(
            RuleId::V17,
            &path,
            shown.clone(),
            format!(
                "is set ({shown}), but a branch of {} sets only branchOf, env, running, suspended, lifecycle and network.ports, and takes the rest from its source: remove it",
                render(source)
            ),
        );
    };
    for (field, value) in spec {
        if value.is_null() {
            continue;
        }
        if field == "network"
            && let Value::Object(network) = value
        {
            for (member, value) in network {
                if !BRANCH_NETWORK_FIELDS.contains(&member.as_str()) && !value.is_null() {
                    refuse(format!("spec.network.{member}"), value);
                }
            }
            continue;
        }
        if !BRANCH_FIELDS.contains(&field.as_str()) {
            refuse(format!("spec.{field}"), value);
        }
    }
    verdict
}

/// V17: the delete-branches annotation, like the force-delete annotation (V7): exactly `"true"`,
/// on a branchable SmolVM that is being deleted.
pub(super) fn check_delete_branches(op: Operation, old: Option<&SmolVM>, new: &SmolVM, v: &mut Verdict) {
    let annotation = |vm: &SmolVM| {
        vm.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DELETE_BRANCHES_ANNOTATION))
            .cloned()
    };
    let Some(value) = annotation(new) else { return };
    if op == Operation::Update && old.and_then(annotation).as_deref() == Some(value.as_str()) {
        return; // unchanged: judged when it was set
    }
    let path = format!("metadata.annotations[{DELETE_BRANCHES_ANNOTATION}]");
    let shown = render(&value);
    let mut misuse = Vec::new();
    if value != DELETE_BRANCHES_VALUE {
        misuse.push(format!("{shown} must be exactly \"true\""));
    }
    if !new.spec.branchable() {
        misuse.push(format!(
            "{shown} is set on a SmolVM that is not branchable: it has no branches"
        ));
    }
    if op == Operation::Create {
        misuse.push(format!(
            "{shown} cannot be set on create: it lets the deletion of a branch source delete its branches"
        ));
    } else if !new.is_deleting() {
        misuse.push(format!(
            "{shown} can only be set on a SmolVM that is being deleted: run kubectl delete first, then annotate if its deletion waits for its branches (DeletionBlocked, LiveBranches)"
        ));
    }
    if misuse.is_empty() {
        v.warning(
            RuleId::V17,
            &path,
            shown.clone(),
            format!("{shown}: every branch of this SmolVM is deleted before it"),
        );
    }
    for message in misuse {
        v.violation(RuleId::V17, &path, shown.clone(), message);
    }
}
