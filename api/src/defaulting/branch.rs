//! Rule M5: a branch takes its spec from its source at CREATE (SPEC 2.6)
//! ([`default_branch_smolvm`]), and a branch source carries the label that the webhook's cache
//! of sources selects ([`default_branch_source`]).

use json_patch::{Patch, PatchOperation};
use serde_json::{Map, Value};

use super::{add, default_smolvm, default_smolvm_with_class, is_absent, is_deleting, record};
use crate::{
    admission::Operation,
    branch::NOT_INHERITED,
    class::{ClassCatalog, class_for},
    constants::{ANNOTATION_BRANCH_OF_UID, BRANCHABLE_VALUE, LABEL_BRANCH_OF, LABEL_BRANCHABLE},
    types::SmolVM,
};

/// Computes the defaulting patch for a SmolVM at CREATE that names `source` in `spec.branchOf`
/// (rule M5, then M3, M1 and M2):
///
/// - M5: every field of the source's spec the branch lacks is added whole, except those it never
///   takes ([`NOT_INHERITED`]: its own `env`, `running` and `suspended`; the source's
///   `branchable`, `volumes`, `nodeName` and `poolRef`). Its `network` is the source's without
///   the published ports: the branch's own `network.ports`, if it sets any, are its only ones,
///   and the source's `exposeService` is taken only with them. The source's name is recorded in
///   the label `vm.smolvm.dev/branch-of` and its UID in the annotation
///   `vm.smolvm.dev/branch-of-uid` (a source made again under the same name is never branched
///   for it).
/// - then M3 from the class the filled object names (the source's), and M1 and M2, as
///   [`default_smolvm_with_class`] computes them on the object M5 left.
///
/// On any other operation this is [`default_smolvm`].
pub fn default_branch_smolvm(op: Operation, object: &Value, source: &SmolVM, classes: &dyn ClassCatalog) -> Patch {
    if op != Operation::Create || is_deleting(object) {
        return default_smolvm(op, object);
    }
    let mut ops = branch_patch(object, source);
    let mut filled = object.clone();
    if json_patch::patch(&mut filled, &ops).is_err() {
        // The source's fields only go where the object has room; an object of another shape is
        // left to validation, with the other rules' defaults alone.
        ops.clear();
        filled = object.clone();
    }
    let class_name = filled.pointer("/spec/className").and_then(Value::as_str);
    let class = class_for(class_name, classes).ok().flatten();
    ops.extend(default_smolvm_with_class(op, &filled, class.as_ref()).0);
    Patch(ops)
}

/// Rule M5's additions for `object` from `source` (empty for an object without a spec).
pub fn branch_patch(object: &Value, source: &SmolVM) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    let Some(spec) = object.get("spec").and_then(Value::as_object) else {
        return ops;
    };
    let Ok(Value::Object(inherited)) = serde_json::to_value(&source.spec) else {
        return ops;
    };
    for (field, value) in &inherited {
        if !NOT_INHERITED.contains(&field.as_str()) && is_absent(spec.get(field)) {
            ops.push(add(&["spec", field], value.clone()));
        }
    }
    network_ops(spec, inherited.get("network"), &mut ops);
    let name = source.metadata.name.as_deref().unwrap_or("");
    record(object, "labels", &[(LABEL_BRANCH_OF, name)], &mut ops);
    if let Some(uid) = source.metadata.uid.as_deref() {
        record(object, "annotations", &[(ANNOTATION_BRANCH_OF_UID, uid)], &mut ops);
    }
    ops
}

/// The branch's `network`: the source's members without `ports` (and without `exposeService`
/// unless the branch publishes ports of its own), added where the branch lacks them.
fn network_ops(spec: &Map<String, Value>, source: Option<&Value>, ops: &mut Vec<PatchOperation>) {
    let Some(Value::Object(source)) = source else { return };
    let own = spec.get("network");
    let own_ports = own
        .and_then(|n| n.get("ports"))
        .and_then(Value::as_array)
        .is_some_and(|p| !p.is_empty());
    let members: Map<String, Value> = source
        .iter()
        .filter(|(k, _)| k.as_str() != "ports" && (own_ports || k.as_str() != "exposeService"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    match own {
        None | Some(Value::Null) => {
            if !members.is_empty() {
                ops.push(add(&["spec", "network"], Value::Object(members)));
            }
        }
        Some(Value::Object(own)) => {
            for (member, value) in members {
                if is_absent(own.get(&member)) {
                    ops.push(add(&["spec", "network", &member], value));
                }
            }
        }
        // Not an object: left to validation, which names it.
        Some(_) => {}
    }
}

/// Computes the defaulting patch for a branch source (`spec.branchable: true`) at CREATE: the
/// label `vm.smolvm.dev/branchable: "true"`, which the webhook's cache of sources selects (M5),
/// then M3, M1 and M2 as for any SmolVM. On any other operation this is [`default_smolvm`].
pub fn default_branch_source(op: Operation, object: &Value, classes: &dyn ClassCatalog) -> Patch {
    if op != Operation::Create || is_deleting(object) {
        return default_smolvm(op, object);
    }
    let mut ops = Vec::new();
    if object.pointer("/spec/branchable").and_then(Value::as_bool) == Some(true) {
        record(object, "labels", &[(LABEL_BRANCHABLE, BRANCHABLE_VALUE)], &mut ops);
    }
    let mut labelled = object.clone();
    if json_patch::patch(&mut labelled, &ops).is_err() {
        ops.clear();
        labelled = object.clone();
    }
    let class_name = labelled.pointer("/spec/className").and_then(Value::as_str);
    let class = class_for(class_name, classes).ok().flatten();
    ops.extend(default_smolvm_with_class(op, &labelled, class.as_ref()).0);
    Patch(ops)
}
