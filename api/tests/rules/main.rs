//! Table-driven accept and reject cases for every admission rule, M1-M2 and V1-V10, including the
//! update transitions: unbound or bound, not deleting or deleting, pinned or not.

use serde_json::{Value, json};
use smolvm_api::{
    SmolVMNode,
    constants::FORCE_DELETE_ANNOTATION,
    defaulting::default_smolvm,
    fixtures::{self, alpine, bound, controller, deleting, node, runtime_on, smolvm, user},
    policy::Policy,
    validate::{
        Context, Identity, Operation, RuleId, Verdict, validate_smolvm_json, validate_smolvm_node_json,
        validate_smolvm_status_json,
    },
};

#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Allowed, with no warning.
    Allow,
    /// Allowed, with a warning of this rule.
    Warn(RuleId),
    /// Rejected by this rule, at a path starting with this text.
    Reject(RuleId, &'static str),
}

#[derive(Clone, Copy)]
enum Kind {
    Vm,
    VmStatus,
    Node,
    NodeStatus,
}

struct Case {
    name: &'static str,
    kind: Kind,
    op: Operation,
    old: Option<Value>,
    new: Value,
    identity: Identity,
    expect: Expect,
}

fn case(name: &'static str, op: Operation, old: Option<Value>, new: Value, expect: Expect) -> Case {
    Case {
        name,
        kind: Kind::Vm,
        op,
        old,
        new,
        identity: user(),
        expect,
    }
}

/// The seed's alpine example with every default applied, as it is stored.
fn stored() -> Value {
    defaulted(alpine())
}

fn defaulted(object: Value) -> Value {
    let mut doc = object.clone();
    json_patch::patch(&mut doc, &default_smolvm(Operation::Create, &object)).unwrap();
    doc
}

fn with(mut object: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let target = if parent.is_empty() {
        &mut object
    } else {
        object.pointer_mut(parent).unwrap()
    };
    target[key] = value;
    object
}

fn without(mut object: Value, pointer: &str) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    object.pointer_mut(parent).unwrap().as_object_mut().unwrap().remove(key);
    object
}

fn annotated(object: Value, value: &str) -> Value {
    with(
        object,
        "/metadata/annotations",
        json!({ FORCE_DELETE_ANNOTATION: value }),
    )
}

fn nodes() -> Vec<SmolVMNode> {
    let mut cordoned = node("cordoned", 8, 16384, 500);
    cordoned.spec.unschedulable = Some(true);
    vec![node("node-a", 8, 16384, 500), node("small", 1, 256, 10), cordoned]
}

fn run(case: &Case, policy: &Policy, nodes: &Vec<SmolVMNode>) -> Verdict {
    let ctx = Context {
        policy,
        nodes,
        classes: &smolvm_api::class::NO_CLASSES,
        pools: &smolvm_api::pool::NO_POOLS,
        sources: &smolvm_api::branch::NO_SOURCES,
        identity: &case.identity,
    };
    match case.kind {
        Kind::Vm => validate_smolvm_json(case.op, case.old.as_ref(), &case.new, &ctx),
        Kind::VmStatus => validate_smolvm_status_json(case.op, case.old.as_ref(), &case.new, &ctx),
        Kind::Node => validate_smolvm_node_json(case.op, false, case.old.as_ref(), &case.new, &ctx),
        Kind::NodeStatus => validate_smolvm_node_json(case.op, true, case.old.as_ref(), &case.new, &ctx),
    }
}

fn check(cases: Vec<Case>) {
    check_with(cases, &Policy::default(), &nodes());
}

fn check_with(cases: Vec<Case>, policy: &Policy, nodes: &Vec<SmolVMNode>) {
    let mut failures = Vec::new();
    for case in &cases {
        let verdict = run(case, policy, nodes);
        let ok = match case.expect {
            Expect::Allow => verdict.allowed() && verdict.warnings.is_empty(),
            Expect::Warn(rule) => verdict.allowed() && verdict.warnings.iter().any(|w| w.rule == rule),
            Expect::Reject(rule, path) => verdict
                .violations
                .iter()
                .any(|v| v.rule == rule && v.path.starts_with(path)),
        };
        if !ok {
            failures.push(format!("{}: expected {:?}, got {:#?}", case.name, case.expect, verdict));
        }
        // Every finding's message names the path, the offending value and the rule.
        for v in verdict.violations.iter().chain(&verdict.warnings) {
            let text = v.to_string();
            assert!(text.starts_with(&v.path), "{}: {text}", case.name);
            assert!(text.ends_with(&format!("[{}]", v.rule)), "{}: {text}", case.name);
            if !text.contains(&v.value) {
                failures.push(format!(
                    "{}: the message does not show the value {}: {text}",
                    case.name, v.value
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

use Expect::*;
use Operation::{Create, Update};

fn ports(list: Value) -> Value {
    with(stored(), "/spec/network/ports", list)
}

/// The seed's example with a workload: command, args, workingDir, env from a value, a Secret and a
/// ConfigMap, a pull secret, a restart policy, a grace period and egress by host name.
fn workload() -> Value {
    let object = with(
        with(
            with(
                with(
                    with(
                        with(stored(), "/spec/command", json!(["/bin/app"])),
                        "/spec/args",
                        json!(["--port", "80"]),
                    ),
                    "/spec/workingDir",
                    json!("/srv"),
                ),
                "/spec/env",
                json!([
                    {"name": "MODE", "value": "prod"},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "app-secrets", "key": "token"}}},
                    {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "log.level", "optional": true}}}
                ]),
            ),
            "/spec/imagePullSecrets",
            json!([{"name": "regcred"}]),
        ),
        "/spec/restartPolicy",
        json!("OnFailure"),
    );
    with(
        object,
        "/spec/network/allowedHosts",
        json!(["api.example.com", "*.example.org"]),
    )
}

mod annotations;
mod binding;
mod lifecycle;
mod lifetimes;
mod nodes;
mod placement;
mod spec;
mod status;
mod suspend;
mod volumes;
mod workload;
