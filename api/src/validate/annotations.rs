//! The annotations a SmolVM is asked something with (V7): force-delete, for a SmolVM whose node
//! cannot confirm cleanup, and recreate-lost-machine, for one whose machine its node lost.

use crate::{
    admission::Operation,
    constants::{
        FORCE_DELETE_ANNOTATION, FORCE_DELETE_VALUE, RECREATE_LOST_MACHINE_ANNOTATION, RECREATE_LOST_MACHINE_VALUE,
        condition, reason,
    },
    types::SmolVM,
};

use super::verdict::*;

/// V7: the force-delete annotation.
pub(super) fn check_force_delete(op: Operation, old: Option<&SmolVM>, new: &SmolVM, v: &mut Verdict) {
    let annotation = |vm: &SmolVM| {
        vm.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FORCE_DELETE_ANNOTATION))
            .cloned()
    };
    let Some(value) = annotation(new) else { return };
    let path = format!("metadata.annotations[{FORCE_DELETE_ANNOTATION}]");
    if op == Operation::Update && old.and_then(annotation).as_deref() == Some(value.as_str()) {
        return; // unchanged: judged when it was set
    }
    // Every misuse is reported, not only the first.
    let shown = render(&value);
    let mut misuse = Vec::new();
    if value != FORCE_DELETE_VALUE {
        misuse.push(format!("{shown} must be exactly \"true\""));
    }
    if op == Operation::Create {
        misuse.push(format!(
            "{shown} cannot be set on create: it is an escape hatch for deleting a SmolVM whose node cannot confirm cleanup"
        ));
    } else if !new.is_deleting() {
        misuse.push(format!(
            "{shown} can only be set on a SmolVM that is being deleted: run kubectl delete first, then annotate if deletion stays blocked"
        ));
    }
    if !misuse.is_empty() {
        for message in misuse {
            v.violation(RuleId::V7, &path, shown.clone(), message);
        }
        return;
    }
    let node = new.bound_node().or_else(|| old.and_then(SmolVM::bound_node));
    let message = match node {
        Some(node) => format!(
            "{shown}: if node {node} stays unreachable, the finalizer is removed and the machine's local state on {node} (/var/lib/smolvm) may be orphaned"
        ),
        None => format!("{shown}: the SmolVM is not bound to a node; nothing can be orphaned"),
    };
    v.warning(RuleId::V7, &path, shown, message);
}

/// V7 for the recreate-lost-machine annotation: exactly `"true"`, only on a SmolVM whose machine
/// is lost (Ready=False, reason MachineLost), never on create; when admitted, the answer warns that
/// the new machine starts empty.
pub(super) fn check_recreate_lost(op: Operation, old: Option<&SmolVM>, new: &SmolVM, v: &mut Verdict) {
    let annotation = |vm: &SmolVM| {
        vm.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RECREATE_LOST_MACHINE_ANNOTATION))
            .cloned()
    };
    let Some(value) = annotation(new) else { return };
    if op == Operation::Update && old.and_then(annotation).as_deref() == Some(value.as_str()) {
        return; // unchanged: judged when it was set
    }
    let path = format!("metadata.annotations[{RECREATE_LOST_MACHINE_ANNOTATION}]");
    let shown = render(&value);
    let mut misuse = Vec::new();
    if value != RECREATE_LOST_MACHINE_VALUE {
        misuse.push(format!("{shown} must be exactly \"true\""));
    }
    let lost = |vm: &SmolVM| {
        vm.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == condition::READY && c.status == "False" && c.reason == reason::MACHINE_LOST)
        })
    };
    if op == Operation::Create {
        misuse.push(format!(
            "{shown} cannot be set on create: it asks for a fresh machine in place of one its node lost"
        ));
    } else if !old.is_some_and(lost) {
        misuse.push(format!(
            "{shown} can only be set on a SmolVM whose machine is lost (Ready=False, reason {})",
            reason::MACHINE_LOST
        ));
    }
    if !misuse.is_empty() {
        for message in misuse {
            v.violation(RuleId::V7, &path, shown.clone(), message);
        }
        return;
    }
    let node = new.bound_node().unwrap_or("its node");
    v.warning(
        RuleId::V7,
        &path,
        shown.clone(),
        format!("{shown}: a fresh, empty machine is created on {node}; the lost machine's disks are not recovered"),
    );
}
