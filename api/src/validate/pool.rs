//! The rules of warm pools (V14): a SmolVMPool's template passes every SmolVM rule and its
//! slots stay within the policy; a SmolVM names a known pool, never changes it, and sets only
//! what a lease carries.

use serde_json::Value;

use crate::{
    admission::Operation,
    pool::{POOLED_FIELDS, SmolVMPool},
    types::{SmolVM, SmolVMSpec},
};

use super::{
    context::*,
    fields::{Unset, check_node_fields, check_spec_fields},
    verdict::*,
};

/// Validates a SmolVMPool write. At CREATE and UPDATE the template is judged by every SmolVM
/// rule on its fields (V1 to V4, V11, with paths under `spec.template`), all at once; its class,
/// if it names one, must be known; it publishes no host port; the pool's `nodeSelector` is
/// judged as a SmolVM's (V4) and `slotsPerNode` lies within the policy (V14).
pub fn validate_smolvm_pool(op: Operation, _old: Option<&SmolVMPool>, new: &SmolVMPool, ctx: &Context<'_>) -> Verdict {
    let mut verdict = Verdict::default();
    if !matches!(op, Operation::Create | Operation::Update) {
        return verdict;
    }
    let template = &new.spec.template;
    let spec = SmolVMSpec {
        node_selector: None,
        ..new.as_smolvm_spec()
    };
    // A class fills what the template leaves unset; without one the built-in defaults do.
    let unset = match template.class_name {
        Some(_) => Unset::Skipped,
        None => Unset::Defaulted,
    };
    let mut fields = Verdict::default();
    check_spec_fields(&spec, ctx.policy, unset, &mut fields);
    verdict.extend(fields.moved("spec.", "spec.template."));
    if let Some(class) = template.class_name.as_deref()
        && ctx.classes.class(class).is_none()
    {
        verdict.violation(
            RuleId::V14,
            "spec.template.className",
            render(class),
            format!(
                "no SmolVMClass {} exists; {}",
                render(class),
                match ctx.classes.names().as_slice() {
                    [] => "no classes are known (kubectl get smolvmclasses)".to_string(),
                    names => format!("known classes: {}", names.join(", ")),
                }
            ),
        );
    }
    if let Some(ports) = template
        .network
        .as_ref()
        .and_then(|n| n.ports.as_ref())
        .filter(|p| !p.is_empty())
    {
        let count = format!("{} port(s)", ports.len());
        verdict.violation(
            RuleId::V14,
            "spec.template.network.ports",
            count.clone(),
            format!("{count}: a pool's template publishes no host port; a host port is published by one machine per node, and a node holds several slots"),
        );
    }
    let selector = SmolVMSpec {
        node_selector: new.spec.node_selector.clone(),
        ..Default::default()
    };
    check_node_fields(&selector, &mut verdict);
    let slots = i64::from(new.spec.slots_per_node);
    if slots < 0 || slots > ctx.policy.max_slots_per_node {
        verdict.violation(
            RuleId::V14,
            "spec.slotsPerNode",
            slots.to_string(),
            format!(
                "{slots} is outside 0..={} (policy maxSlotsPerNode)",
                ctx.policy.max_slots_per_node
            ),
        );
    }
    verdict
}

/// V14 on a SmolVM: at CREATE `spec.poolRef` names a pool of its namespace (the mutating webhook
/// has then filled the SmolVM from the template); it never changes afterwards; and a SmolVM
/// served from a pool changes nothing but `running` and `suspended`.
pub(super) fn check_pool_ref(op: Operation, old: Option<&SmolVM>, new: &SmolVM, ctx: &Context<'_>, v: &mut Verdict) {
    let name = new.spec.pool_ref.as_ref().map(|r| r.name.as_str());
    match (op, old) {
        (Operation::Update, Some(old)) => {
            let old_name = old.spec.pool_ref.as_ref().map(|r| r.name.as_str());
            if old_name != name {
                v.violation(
                    RuleId::V14,
                    "spec.poolRef",
                    shown_name(name),
                    format!(
                        "cannot change from {} to {}: a SmolVM takes its pool's template once, at CREATE; delete and recreate to change it",
                        shown_name(old_name),
                        shown_name(name)
                    ),
                );
            } else if old_name.is_some() && !new.is_deleting() {
                for field in changed_fields(&old.spec, &new.spec, &POOLED_FIELDS) {
                    v.violation(
                        RuleId::V14,
                        &format!("spec.{field}"),
                        String::new(),
                        format!(
                            "a SmolVM served from a pool changes only running and suspended; its {field} is the pool's template's: delete and recreate"
                        ),
                    );
                }
            }
        }
        (Operation::Create, _) => {
            let Some(name) = name else { return };
            let namespace = new.metadata.namespace.as_deref().unwrap_or("");
            if ctx.pools.pool(namespace, name).is_none() {
                v.violation(
                    RuleId::V14,
                    "spec.poolRef.name",
                    render(name),
                    format!(
                        "no SmolVMPool {} exists in namespace {}; {}",
                        render(name),
                        render(namespace),
                        match ctx.pools.names_in(namespace).as_slice() {
                            [] => "it has none (kubectl get smolvmpools)".to_string(),
                            names => format!("its pools: {}", names.join(", ")),
                        }
                    ),
                );
            }
        }
        _ => {}
    }
}

/// V14 on a SmolVM at CREATE as it was sent, before the pool's template fills it: a SmolVM that
/// names a pool sets only `poolRef`, `env`, `running` and `suspended`; each other field it sets
/// is one violation naming it. Empty for a SmolVM that names no pool.
pub fn validate_pooled_request(object: &Value) -> Verdict {
    let mut verdict = Verdict::default();
    let Some(spec) = object.get("spec").and_then(Value::as_object) else {
        return verdict;
    };
    let Some(pool) = spec.get("poolRef").and_then(|r| r.get("name")).and_then(Value::as_str) else {
        return verdict;
    };
    for (field, value) in spec {
        if POOLED_FIELDS.contains(&field.as_str()) || value.is_null() {
            continue;
        }
        let shown = shown_value(value);
        verdict.violation(
            RuleId::V14,
            &format!("spec.{field}"),
            shown.clone(),
            format!(
                "is set ({shown}), but a SmolVM served from the pool {} sets only poolRef, env, running and suspended, and takes the rest from the pool: remove {field}, or change the pool",
                render(pool)
            ),
        );
    }
    verdict
}
