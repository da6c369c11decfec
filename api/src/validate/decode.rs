//! From the request's JSON to the rules: decoding only what the rules read (a failure becomes
//! the single violation, naming the path) and dispatching each [`Target`] to its rules.

use std::collections::BTreeMap;

use serde::{Deserialize, de::DeserializeOwned};
use serde_json::Value;

use crate::{
    class::SmolVMClass,
    types::{SmolVM, SmolVMNode},
};

use super::{class::*, context::*, node::*, smolvm::*, status::*, verdict::*};

/// Deserializes an object, turning a failure into a finding that names the path.
pub fn decode<T: DeserializeOwned>(object: &Value) -> Result<T, Finding> {
    // The common case, valid input, takes the fast path; only a failure is decoded again with
    // path tracking, to name the field.
    if let Ok(value) = T::deserialize(object) {
        return Ok(value);
    }
    serde_path_to_error::deserialize::<_, T>(object).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if inner.contains("missing field `image`") {
            return Finding::new(
                RuleId::V1,
                "spec.image",
                String::new(),
                "is required: an OCI reference such as alpine:latest, or local:<name>".into(),
            );
        }
        let path = if path == "." { "object".to_string() } else { path };
        Finding::new(
            RuleId::Schema,
            path,
            String::new(),
            format!("does not match the API schema: {inner}"),
        )
    })
}

/// The metadata the rules read. Decoding only these skips what they never look at (notably
/// `managedFields`, often the largest part of an object).
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RuleMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    finalizers: Option<Vec<String>>,
    deletion_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// An object as the rules see it.
#[derive(serde::Deserialize)]
struct RuleObject<S, T> {
    #[serde(default)]
    metadata: RuleMeta,
    spec: S,
    #[serde(default = "none")]
    status: Option<T>,
}

fn none<T>() -> Option<T> {
    None
}

impl RuleMeta {
    fn into_object_meta(self) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            generation: self.generation,
            labels: self.labels,
            annotations: self.annotations,
            finalizers: self.finalizers,
            deletion_timestamp: self.deletion_timestamp,
            ..Default::default()
        }
    }
}

/// Objects the rules decode through [`RuleObject`]: each kind names its spec and status types
/// and how a decoded [`RuleObject`] becomes the kind; both decode paths are shared.
trait RuleDecode: Sized {
    type Spec: DeserializeOwned;
    type Status: DeserializeOwned;

    fn assemble(object: RuleObject<Self::Spec, Self::Status>) -> Self;

    fn decode_for_rules(object: &Value) -> Result<Self, Finding> {
        decode::<RuleObject<Self::Spec, Self::Status>>(object).map(Self::assemble)
    }

    /// The same as [`RuleDecode::decode_for_rules`] on the `serde_json::Value` that `text`
    /// parses to, without building that Value when the text decodes directly.
    ///
    /// A direct decode that succeeds yields what decoding the Value yields: both run the same
    /// visitors over the same tokens, and the Value's last-wins handling of repeated keys only
    /// matters where the direct decode fails (serde rejects a repeated struct field). Any
    /// failure goes through the Value, so findings (paths, messages) are those of the Value path.
    fn decode_for_rules_text(text: &str) -> Result<Self, Finding> {
        match serde_json::from_str::<RuleObject<Self::Spec, Self::Status>>(text) {
            Ok(object) => Ok(Self::assemble(object)),
            Err(_) => decode_text_via_value(text),
        }
    }
}

/// The Value path of [`RuleDecode::decode_for_rules_text`]: parse, then decode the Value.
fn decode_text_via_value<T: RuleDecode>(text: &str) -> Result<T, Finding> {
    match serde_json::from_str::<Value>(text) {
        Ok(value) => T::decode_for_rules(&value),
        // Callers pass text that parses as a Value; anything else does not match the schema.
        Err(e) => Err(Finding::new(
            RuleId::Schema,
            "object",
            String::new(),
            format!("does not match the API schema: {e}"),
        )),
    }
}

impl RuleDecode for SmolVM {
    type Spec = crate::types::SmolVMSpec;
    type Status = crate::types::SmolVMStatus;

    fn assemble(o: RuleObject<Self::Spec, Self::Status>) -> Self {
        SmolVM {
            metadata: o.metadata.into_object_meta(),
            spec: o.spec,
            status: o.status,
        }
    }
}

impl RuleDecode for SmolVMClass {
    type Spec = crate::class::SmolVMClassSpec;
    // A class has no status; whatever a request carries there is not read.
    type Status = serde::de::IgnoredAny;

    fn assemble(o: RuleObject<Self::Spec, Self::Status>) -> Self {
        SmolVMClass {
            metadata: o.metadata.into_object_meta(),
            spec: o.spec,
        }
    }
}

impl RuleDecode for SmolVMNode {
    type Spec = crate::types::SmolVMNodeSpec;
    type Status = crate::types::SmolVMNodeStatus;

    fn assemble(o: RuleObject<Self::Spec, Self::Status>) -> Self {
        SmolVMNode {
            metadata: o.metadata.into_object_meta(),
            spec: o.spec,
            status: o.status,
        }
    }
}

/// A reviewed object as a request carries it: an already parsed Value, or its JSON text (as in
/// an AdmissionReview). Both give the same verdict; text that decodes directly never builds the
/// intermediate Value. Text must parse as one `serde_json::Value` (the webhook checks that while
/// reading the review).
#[derive(Clone, Copy, Debug)]
pub enum Raw<'a> {
    Value(&'a Value),
    Text(&'a str),
}

/// Which rules a write is checked against: the resource and, for status writes, its
/// subresource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A SmolVM (V1 to V8).
    SmolVM,
    /// The status subresource of a SmolVM (V9).
    SmolVMStatus,
    /// A SmolVMNode (V10).
    SmolVMNode,
    /// The status subresource of a SmolVMNode (V10).
    SmolVMNodeStatus,
    /// A SmolVMClass (V12, and V2, V3, V4, V11 on its fields).
    SmolVMClass,
}

fn decode_raw<T: RuleDecode>(raw: Raw<'_>) -> Result<T, Finding> {
    match raw {
        Raw::Value(value) => T::decode_for_rules(value),
        Raw::Text(text) => T::decode_for_rules_text(text),
    }
}

/// Decodes the new and old objects of a request; a failure becomes the single violation.
fn decode_pair<T: RuleDecode>(old: Option<Raw<'_>>, new: Raw<'_>) -> Result<(Option<T>, T), Finding> {
    let new = decode_raw(new)?;
    let old = old.map(decode_raw).transpose().map_err(|finding| Finding {
        message: format!(
            "the stored object does not decode ({}); refusing a transition that cannot be checked",
            finding.message
        ),
        ..finding
    })?;
    Ok((old, new))
}

/// Runs `rule` on a decoded pair, or rejects with the decoding finding.
fn on_decoded<T: RuleDecode>(
    old: Option<Raw<'_>>,
    new: Raw<'_>,
    rule: impl FnOnce(Option<&T>, &T) -> Verdict,
) -> Verdict {
    match decode_pair::<T>(old, new) {
        Ok((old, new)) => rule(old.as_ref(), &new),
        Err(finding) => rejected(finding),
    }
}

fn rejected(finding: Finding) -> Verdict {
    Verdict {
        violations: vec![finding],
        warnings: Vec::new(),
    }
}

/// Validates a write of `target` given as JSON (a Value or text), as the webhook receives it:
/// decodes the objects (a failure is the single violation) and runs the target's rules.
pub fn validate_raw(target: Target, op: Operation, old: Option<Raw<'_>>, new: Raw<'_>, ctx: &Context<'_>) -> Verdict {
    match target {
        Target::SmolVM => on_decoded(old, new, |o, n| validate_smolvm(op, o, n, ctx)),
        Target::SmolVMStatus => on_decoded(old, new, |o, n| validate_smolvm_status(op, o, n, ctx)),
        Target::SmolVMNode => on_decoded(old, new, |o, n| validate_smolvm_node(op, o, n, ctx)),
        Target::SmolVMNodeStatus => on_decoded(old, new, |o, n| validate_smolvm_node_status(op, o, n, ctx)),
        Target::SmolVMClass => on_decoded(old, new, |o, n| validate_smolvm_class(op, o, n, ctx)),
    }
}

/// Validates a SmolVM as defaulting leaves it, without building the whole object as a Value:
/// the object is decoded as given (text decodes directly), then its spec is replaced by
/// `defaulted_spec`, the given spec with the defaulting patch applied (a small Value). What
/// defaulting changes besides the spec (the finalizer) no rule reads. A `defaulted_spec` that
/// does not decode (defaulting never makes one) leaves the spec as given.
pub fn validate_smolvm_defaulted(
    op: Operation,
    old: Option<Raw<'_>>,
    new: Raw<'_>,
    defaulted_spec: Option<&Value>,
    ctx: &Context<'_>,
) -> Verdict {
    on_decoded(old, new, |o, n: &SmolVM| {
        let spec = defaulted_spec.and_then(|s| crate::types::SmolVMSpec::deserialize(s).ok());
        match spec {
            Some(spec) => {
                let defaulted = SmolVM {
                    metadata: n.metadata.clone(),
                    spec,
                    status: n.status.clone(),
                };
                validate_smolvm(op, o, &defaulted, ctx)
            }
            None => validate_smolvm(op, o, n, ctx),
        }
    })
}

/// Validates a SmolVM given as a JSON Value; see [`validate_raw`].
pub fn validate_smolvm_json(op: Operation, old: Option<&Value>, new: &Value, ctx: &Context<'_>) -> Verdict {
    validate_raw(Target::SmolVM, op, old.map(Raw::Value), Raw::Value(new), ctx)
}

/// Validates a SmolVM status write given as a JSON Value; see [`validate_raw`].
pub fn validate_smolvm_status_json(op: Operation, old: Option<&Value>, new: &Value, ctx: &Context<'_>) -> Verdict {
    validate_raw(Target::SmolVMStatus, op, old.map(Raw::Value), Raw::Value(new), ctx)
}

/// Validates a SmolVMNode given as a JSON Value, for the main resource or (with `status`) its
/// status; see [`validate_raw`].
pub fn validate_smolvm_node_json(
    op: Operation,
    status: bool,
    old: Option<&Value>,
    new: &Value,
    ctx: &Context<'_>,
) -> Verdict {
    let target = if status {
        Target::SmolVMNodeStatus
    } else {
        Target::SmolVMNode
    };
    validate_raw(target, op, old.map(Raw::Value), Raw::Value(new), ctx)
}
