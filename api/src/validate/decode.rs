//! From the request's JSON to the rules: decoding only what the rules read and dispatching each
//! [`Target`] to its rules. A field of the new object whose value does not decode becomes one
//! violation at its path, and the rules still run on the rest ([`decode_leniently`]), so every
//! violation is in one answer.

use std::collections::BTreeMap;

use serde::{Deserialize, de::DeserializeOwned};
use serde_json::Value;

use crate::{
    admission::Operation,
    class::SmolVMClass,
    pool::SmolVMPool,
    types::{SmolVM, SmolVMNode},
};

use super::{class::*, context::*, node::*, pool::*, smolvm::*, status::*, verdict::*};

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
        let path = if path == "." { "object".to_string() } else { path };
        Finding::new(
            RuleId::Schema,
            path,
            String::new(),
            format!("does not match the API schema: {inner}"),
        )
    })
}

/// Most fields of one object that [`decode_leniently`] replaces; past them it stops, reporting
/// those it found and that more do not decode. Each repair decodes the object again, so this
/// bounds the work a request with many bad fields can cause.
const MAX_REPAIRS: usize = 16;

/// One step of a field path: a member of an object or an entry of a list.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

/// The field path of `steps` as the rules write it: `spec.network.ports[1].protocol`; a key that
/// is not a plain name is a quoted JSON string in brackets (`spec.nodeSelector["a/b"]`).
fn path_text(steps: &[Step]) -> String {
    if steps.is_empty() {
        return "object".into();
    }
    let mut out = String::new();
    for step in steps {
        match step {
            Step::Index(i) => out.push_str(&format!("[{i}]")),
            Step::Key(key) if !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Step::Key(key) => out.push_str(&format!("[{}]", render(key))),
        }
    }
    out
}

/// The value at `steps` in `value`.
fn at_mut<'a>(value: &'a mut Value, steps: &[Step]) -> Option<&'a mut Value> {
    steps.iter().try_fold(value, |v, step| match (v, step) {
        (Value::Object(map), Step::Key(key)) => map.get_mut(key),
        (Value::Array(list), Step::Index(i)) => list.get_mut(*i),
        _ => None,
    })
}

/// Sets the value at `steps` (a member is added to its object); false when there is no parent.
fn put(value: &mut Value, steps: &[Step], new: Value) -> bool {
    let Some((last, parent)) = steps.split_last() else {
        return false;
    };
    match (at_mut(value, parent), last) {
        (Some(Value::Object(map)), Step::Key(key)) => {
            map.insert(key.clone(), new);
            true
        }
        (Some(Value::Array(list)), Step::Index(i)) => match list.get_mut(*i) {
            Some(slot) => {
                *slot = new;
                true
            }
            None => false,
        },
        _ => false,
    }
}

/// Removes a member of an object (an optional field then reads as absent); false for an entry
/// of a list (removing it would move the entries after it) or a path that is not there.
fn remove_member(value: &mut Value, steps: &[Step]) -> bool {
    let Some((Step::Key(key), parent)) = steps.split_last() else {
        return false;
    };
    match at_mut(value, parent) {
        Some(Value::Object(map)) => map.remove(key).is_some(),
        _ => false,
    }
}

/// The names between backquotes in `text` (serde's list of expected variants).
fn quoted_names(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// What serde's message says the field should have been, and a neutral value of that kind (the
/// first supported value of an enum, zero, an empty string, list or object, false).
struct Expected {
    /// "must be ..." text, or the supported values of an enum.
    what: Expectation,
    neutral: Option<Value>,
}

enum Expectation {
    OneOf(Vec<String>),
    Kind(String),
}

fn expected_of(message: &str) -> Expected {
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let after = rest.split_once('`').map(|(_, after)| after).unwrap_or("");
        let names: Vec<String> = quoted_names(after).into_iter().map(str::to_string).collect();
        return Expected {
            neutral: names.first().map(|n| Value::String(n.clone())),
            what: Expectation::OneOf(names),
        };
    }
    let expected = message.rsplit_once(", expected ").map(|(_, e)| e).unwrap_or("");
    let (kind, neutral) = match expected {
        "i32" => ("an integer (int32)".to_string(), Some(Value::from(0))),
        "i64" => ("an integer (int64)".to_string(), Some(Value::from(0))),
        "i8" | "i16" | "u8" | "u16" | "u32" | "u64" | "usize" | "isize" | "i128" | "u128" => {
            (format!("an integer ({expected})"), Some(Value::from(0)))
        }
        "f32" | "f64" => ("a number".to_string(), Some(Value::from(0))),
        "a string" | "string or map" => ("a string".to_string(), Some(Value::String(String::new()))),
        "a boolean" => ("a boolean".to_string(), Some(Value::Bool(false))),
        "a sequence" => ("a list".to_string(), Some(Value::Array(Vec::new()))),
        "a map" => ("an object".to_string(), Some(Value::Object(serde_json::Map::new()))),
        e if e.starts_with("struct ") => ("an object".to_string(), Some(Value::Object(serde_json::Map::new()))),
        "" => ("of the type the API defines".to_string(), None),
        e => (e.to_string(), None),
    };
    Expected {
        what: Expectation::Kind(kind),
        neutral,
    }
}

/// How a finding shows a value that did not decode: scalars as JSON (at most 64 bytes of it),
/// lists and objects by their kind, and an env entry's value never (it may be a secret).
fn shown(steps: &[Step], value: Option<&Value>) -> String {
    let secret = matches!(steps, [Step::Key(spec), Step::Key(env), Step::Index(_), Step::Key(field)]
        if spec == "spec" && env == "env" && field == "value");
    match value {
        None => "null".into(),
        Some(Value::Array(_)) => "a list".into(),
        Some(Value::Object(_)) => "an object".into(),
        Some(Value::String(_)) if secret => "a string".into(),
        Some(Value::Number(_)) if secret => "a number".into(),
        Some(Value::Bool(_)) if secret => "a boolean".into(),
        Some(scalar) => {
            let text = render(scalar);
            if text.len() <= 64 {
                text
            } else {
                let mut end = 60;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{}...", &text[..end])
            }
        }
    }
}

/// The finding for a field whose value does not decode: its path, its value and what the API
/// accepts there, in the words of Kubernetes' own field errors (`Unsupported value`,
/// `Invalid value`).
fn undecodable(steps: &[Step], value: Option<&Value>, expected: &Expected, serde_message: &str) -> Finding {
    let shown = shown(steps, value);
    let message = match &expected.what {
        Expectation::OneOf(names) if !names.is_empty() => {
            let names: Vec<String> = names.iter().map(render).collect();
            format!("Unsupported value: {shown}: supported values: {}", names.join(", "))
        }
        Expectation::Kind(kind) if expected.neutral.is_some() => format!("Invalid value: {shown}: must be {kind}"),
        _ => format!("Invalid value: {shown}: does not match the API schema: {serde_message}"),
    };
    Finding::new(RuleId::Schema, path_text(steps), shown, message)
}

/// The finding for a required field that is absent.
fn required(steps: &[Step]) -> Finding {
    Finding::new(RuleId::Schema, path_text(steps), String::new(), "Required value".into())
}

/// A finding for what the lenient decode cannot repair, at `path`.
fn schema_finding(path: &str, serde_message: &str) -> Finding {
    Finding::new(
        RuleId::Schema,
        if path.is_empty() { "object" } else { path },
        String::new(),
        format!("does not match the API schema: {serde_message}"),
    )
}

/// The steps of a serde path, when every one is a member or an entry.
fn steps_of(path: &serde_path_to_error::Path) -> Option<Vec<Step>> {
    path.iter()
        .map(|segment| match segment {
            serde_path_to_error::Segment::Map { key } => Some(Step::Key(key.clone())),
            serde_path_to_error::Segment::Seq { index } => Some(Step::Index(*index)),
            _ => None,
        })
        .collect()
}

/// Decodes `object` as `T` whatever its fields hold: each field whose value does not decode (an
/// unknown enum value, a wrong type, a required field absent) becomes one finding at its path,
/// and is read as absent or, where the type needs a value, as a neutral one of its type (the
/// first supported value, zero, empty). The rules then run on what decoded, so that every
/// violation is reported in one answer, those of the fields that did not decode included.
///
/// `Err` with the findings when the object cannot be read (not an object, a field that cannot
/// be repaired, or more than [`MAX_REPAIRS`] fields). Called only after the strict decode failed:
/// a valid object never pays for it.
fn decode_leniently<T: DeserializeOwned>(object: &Value) -> Result<(T, Vec<Finding>), Vec<Finding>> {
    let mut value = object.clone();
    let mut findings: Vec<Finding> = Vec::new();
    // The fields repaired so far, each with the neutral value of its type when known.
    let mut repaired: Vec<(Vec<Step>, Option<Value>)> = Vec::new();
    // A field takes at most three decodes (removed, null, then the neutral value).
    for _ in 0..3 * MAX_REPAIRS + 1 {
        let error = match serde_path_to_error::deserialize::<_, T>(&value) {
            Ok(decoded) => return Ok((decoded, findings)),
            Err(error) => error,
        };
        let steps = steps_of(error.path());
        let message = error.into_inner().to_string();
        let Some(mut steps) = steps else {
            findings.push(schema_finding("", &message));
            return Err(findings);
        };
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split_once('`'))
            .map(|(field, _)| field.to_string());
        if let Some(field) = &missing {
            steps.push(Step::Key(field.clone()));
        }
        // One finding per field; none for what lies inside a field already reported.
        let inside_reported = repaired.iter().any(|(p, _)| steps.starts_with(p));
        if steps.is_empty() || (!inside_reported && repaired.len() >= MAX_REPAIRS) {
            findings.push(schema_finding(&path_text(&steps), &message));
            return Err(findings);
        }
        let expected = expected_of(&message);
        if !inside_reported {
            findings.push(match &missing {
                Some(_) => required(&steps),
                None => undecodable(&steps, at_mut(&mut value, &steps).map(|v| &*v), &expected, &message),
            });
        }
        let known = repaired.iter().position(|(p, _)| *p == steps);
        let fixed = match (known, missing.is_some()) {
            // Absent, or removed by an earlier step: the neutral value, or null to learn the
            // type from the next error.
            (Some(i), true) => {
                let neutral = repaired[i].1.clone().unwrap_or(Value::Null);
                put(&mut value, &steps, neutral)
            }
            (None, true) => {
                repaired.push((steps.clone(), None));
                put(&mut value, &steps, Value::Null)
            }
            // What was put in does not decode either: the value this error asks for.
            (Some(i), false) => match expected.neutral {
                Some(neutral) if at_mut(&mut value, &steps).is_some_and(|v| *v != neutral) => {
                    repaired[i].1 = Some(neutral.clone());
                    put(&mut value, &steps, neutral)
                }
                _ => false,
            },
            // First seen: the neutral value of its type (present, as the user's value was), else
            // absent where it may be, else null to learn the type from the next error.
            (None, false) => {
                let neutral = expected.neutral;
                repaired.push((steps.clone(), neutral.clone()));
                match neutral {
                    Some(neutral) => put(&mut value, &steps, neutral),
                    None => remove_member(&mut value, &steps) || put(&mut value, &steps, Value::Null),
                }
            }
        };
        if !fixed {
            if inside_reported {
                // The finding of the field around it stands; this is not the user's to fix.
                return Err(findings);
            }
            findings.push(schema_finding(&path_text(&steps), &message));
            return Err(findings);
        }
    }
    findings.push(schema_finding("object", "too many fields do not decode"));
    Err(findings)
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
    annotations: Option<RuleAnnotations>,
    finalizers: Option<Vec<String>>,
    deletion_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// `metadata.annotations` as the rules read it: this project's annotations (keys under
/// `vm.smolvm.dev/`), the only ones a rule looks at. Every other value is checked to be a
/// string, as a map of strings checks it (same error, same path), and dropped without being
/// copied: `kubectl apply`'s annotation holds the whole object again, often the longest string
/// of a review.
#[derive(Default)]
struct RuleAnnotations(BTreeMap<String, String>);

/// The key prefix of the annotations [`RuleAnnotations`] keeps.
const RULE_ANNOTATION_PREFIX: &str = "vm.smolvm.dev/";

impl<'de> Deserialize<'de> for RuleAnnotations {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Annotations;
        impl<'de> serde::de::Visitor<'de> for Annotations {
            type Value = RuleAnnotations;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut kept = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key.starts_with(RULE_ANNOTATION_PREFIX) {
                        kept.insert(key, map.next_value::<String>()?);
                    } else {
                        map.next_value::<AnyString>()?;
                    }
                }
                Ok(RuleAnnotations(kept))
            }
        }
        deserializer.deserialize_map(Annotations)
    }
}

/// A string, read and dropped (its value is not kept).
struct AnyString;

impl<'de> Deserialize<'de> for AnyString {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Str;
        impl serde::de::Visitor<'_> for Str {
            type Value = AnyString;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(AnyString)
            }
        }
        deserializer.deserialize_str(Str)
    }
}

/// An object as the rules see it.
#[derive(serde::Deserialize)]
struct RuleObject<S, T, M> {
    #[serde(default)]
    metadata: M,
    spec: S,
    #[serde(default = "none")]
    status: Option<T>,
}

/// The [`RuleObject`] a kind decodes through.
type RuleObjectOf<K> = RuleObject<<K as RuleDecode>::Spec, <K as RuleDecode>::Status, <K as RuleDecode>::Meta>;

/// The metadata of a SmolVMNode as rule V10 reads it: besides what [`RuleMeta`] reads, every
/// annotation (not only the project's) and the owner references, since a runtime agent may
/// change none of them ([`crate::validate::validate_smolvm_node`]). SmolVMNode writes through
/// the webhook are few (labels, a cordon), so the whole map costs nothing that matters.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NodeMeta {
    name: Option<String>,
    uid: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    finalizers: Option<Vec<String>>,
    owner_references: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
    deletion_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// Metadata as decoded for the rules, turned into the kind's `ObjectMeta`.
trait IntoObjectMeta {
    fn into_object_meta(self) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
}

impl IntoObjectMeta for NodeMeta {
    fn into_object_meta(self) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: self.name,
            uid: self.uid,
            generation: self.generation,
            labels: self.labels,
            annotations: self.annotations,
            finalizers: self.finalizers,
            owner_references: self.owner_references,
            deletion_timestamp: self.deletion_timestamp,
            ..Default::default()
        }
    }
}

fn none<T>() -> Option<T> {
    None
}

impl IntoObjectMeta for RuleMeta {
    fn into_object_meta(self) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            generation: self.generation,
            labels: self.labels,
            annotations: self.annotations.map(|a| a.0),
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
    type Meta: DeserializeOwned + Default + IntoObjectMeta;

    fn assemble(object: RuleObjectOf<Self>) -> Self;

    fn decode_for_rules(object: &Value) -> Result<Self, Finding> {
        decode::<RuleObjectOf<Self>>(object).map(Self::assemble)
    }

    /// Decodes `object` for the rules whatever its fields hold: every field that does not
    /// decode is one finding, and is read as absent or neutral ([`decode_leniently`]). The
    /// strict decode first: only an object that fails it takes the lenient path.
    fn decode_for_rules_leniently(object: &Value) -> Result<Lenient<Self>, Vec<Finding>> {
        match RuleObjectOf::<Self>::deserialize(object) {
            Ok(o) => Ok((Self::assemble(o), Vec::new())),
            Err(_) => decode_leniently::<RuleObjectOf<Self>>(object).map(|(o, findings)| (Self::assemble(o), findings)),
        }
    }

    /// The same as [`RuleDecode::decode_for_rules`] on the `serde_json::Value` that `text`
    /// parses to, without building that Value when the text decodes directly.
    ///
    /// A direct decode that succeeds yields what decoding the Value yields: both run the same
    /// visitors over the same tokens, and the Value's last-wins handling of repeated keys only
    /// matters where the direct decode fails (serde rejects a repeated struct field). Any
    /// failure goes through the Value, so findings (paths, messages) are those of the Value path.
    fn decode_for_rules_text(text: &str) -> Result<Self, Finding> {
        match serde_json::from_str::<RuleObjectOf<Self>>(text) {
            Ok(object) => Ok(Self::assemble(object)),
            Err(_) => parse_text(text).and_then(|value| Self::decode_for_rules(&value)),
        }
    }

    /// [`RuleDecode::decode_for_rules_leniently`] on the text, which decodes directly when it can.
    fn decode_for_rules_text_leniently(text: &str) -> Result<Lenient<Self>, Vec<Finding>> {
        match serde_json::from_str::<RuleObjectOf<Self>>(text) {
            Ok(object) => Ok((Self::assemble(object), Vec::new())),
            Err(_) => match parse_text(text) {
                Ok(value) => Self::decode_for_rules_leniently(&value),
                Err(finding) => Err(vec![finding]),
            },
        }
    }
}

/// An object decoded for the rules, with a finding for each field that did not decode.
type Lenient<T> = (T, Vec<Finding>);

/// The Value that `text` parses to, for the Value path of the text decodes.
fn parse_text(text: &str) -> Result<Value, Finding> {
    // Callers pass text that parses as a Value; anything else does not match the schema.
    serde_json::from_str::<Value>(text).map_err(|e| {
        Finding::new(
            RuleId::Schema,
            "object",
            String::new(),
            format!("does not match the API schema: {e}"),
        )
    })
}

impl RuleDecode for SmolVM {
    type Spec = crate::types::SmolVMSpec;
    type Status = crate::types::SmolVMStatus;
    type Meta = RuleMeta;

    fn assemble(o: RuleObjectOf<Self>) -> Self {
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
    type Meta = RuleMeta;

    fn assemble(o: RuleObjectOf<Self>) -> Self {
        SmolVMClass {
            metadata: o.metadata.into_object_meta(),
            spec: o.spec,
        }
    }
}

impl RuleDecode for SmolVMPool {
    type Spec = crate::pool::SmolVMPoolSpec;
    // The controller writes the status through its subresource, which no rule reads.
    type Status = serde::de::IgnoredAny;
    type Meta = RuleMeta;

    fn assemble(o: RuleObjectOf<Self>) -> Self {
        SmolVMPool {
            metadata: o.metadata.into_object_meta(),
            spec: o.spec,
            status: None,
        }
    }
}

impl RuleDecode for SmolVMNode {
    type Spec = crate::types::SmolVMNodeSpec;
    type Status = crate::types::SmolVMNodeStatus;
    type Meta = NodeMeta;

    fn assemble(o: RuleObjectOf<Self>) -> Self {
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
    /// A SmolVMPool (V14, and V1 to V4, V11 on its template).
    SmolVMPool,
}

fn decode_raw<T: RuleDecode>(raw: Raw<'_>) -> Result<T, Finding> {
    match raw {
        Raw::Value(value) => T::decode_for_rules(value),
        Raw::Text(text) => T::decode_for_rules_text(text),
    }
}

/// Decodes the new object of a request for the rules, leniently (see [`decode_leniently`]).
fn decode_new<T: RuleDecode>(raw: Raw<'_>) -> Result<Lenient<T>, Vec<Finding>> {
    match raw {
        Raw::Value(value) => T::decode_for_rules_leniently(value),
        Raw::Text(text) => T::decode_for_rules_text_leniently(text),
    }
}

/// Runs `rule` on the decoded pair. A field of the new object that does not decode is one
/// violation, listed with every violation the rules find in the rest; a stored object that does
/// not decode refuses the transition, which cannot be checked.
fn on_decoded<T: RuleDecode>(
    old: Option<Raw<'_>>,
    new: Raw<'_>,
    rule: impl FnOnce(Option<&T>, &T) -> Verdict,
) -> Verdict {
    let (new, undecodable) = match decode_new::<T>(new) {
        Ok(decoded) => decoded,
        Err(findings) => return rejected(findings),
    };
    let old = match old.map(decode_raw::<T>).transpose() {
        Ok(old) => old,
        Err(finding) => {
            let mut findings = undecodable;
            findings.push(Finding {
                message: format!(
                    "the stored object does not decode ({}); refusing a transition that cannot be checked",
                    finding.message
                ),
                ..finding
            });
            return rejected(findings);
        }
    };
    with_undecodable(rule(old.as_ref(), &new), undecodable)
}

/// The list entry (`spec.network.ports[2]`) whose member `path` is, if it is one.
fn entry_of(path: &str) -> Option<&str> {
    let parent = match path.strip_suffix(']') {
        Some(_) => &path[..path.rfind('[')?],
        None => &path[..path.rfind('.')?],
    };
    let index = &parent[parent.rfind('[')? + 1..parent.len().checked_sub(1)?];
    (parent.ends_with(']') && !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit())).then_some(parent)
}

/// The rules' verdict with the findings of the fields that did not decode first. What the rules
/// found at or inside such a field is left out, and so is what they found about the whole list
/// entry holding it (a duplicate port, an env entry's value and valueFrom): it is about the
/// neutral value read in its place, not the user's.
fn with_undecodable(mut verdict: Verdict, undecodable: Vec<Finding>) -> Verdict {
    if undecodable.is_empty() {
        return verdict;
    }
    let entries: Vec<String> = undecodable
        .iter()
        .filter_map(|u| entry_of(&u.path))
        .map(pointer_of)
        .collect();
    let about_neutral = |finding: &Finding| {
        entries.contains(&finding.pointer)
            || undecodable.iter().any(|u| {
                finding.pointer == u.pointer
                    || (finding.pointer.starts_with(&u.pointer) && finding.pointer[u.pointer.len()..].starts_with('/'))
            })
    };
    verdict.violations.retain(|f| !about_neutral(f));
    verdict.warnings.retain(|f| !about_neutral(f));
    let mut violations = undecodable;
    violations.append(&mut verdict.violations);
    verdict.violations = violations;
    verdict
}

fn rejected(violations: Vec<Finding>) -> Verdict {
    Verdict {
        violations,
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
        Target::SmolVMPool => on_decoded(old, new, |o, n| validate_smolvm_pool(op, o, n, ctx)),
    }
}

/// Validates a SmolVM as its defaults leave it, decoding the object once: the object as given
/// is decoded, the [`Addition`]s of [`crate::defaulting::additions`] are applied to the decoded
/// object ([`Addition::apply`]) and the rules run on the result, which is what [`validate_raw`]
/// finds on the patched JSON. `None` where this route does not apply: the new or the stored
/// object does not decode as it stands (the findings are worded on the JSON), or an addition
/// does not fit the decoded object; the caller then validates the patched JSON with
/// [`validate_raw`].
///
/// [`Addition`]: crate::defaulting::Addition
/// [`Addition::apply`]: crate::defaulting::Addition::apply
pub fn validate_smolvm_with(
    op: Operation,
    old: Option<Raw<'_>>,
    new: Raw<'_>,
    additions: &[crate::defaulting::Addition],
    ctx: &Context<'_>,
) -> Option<Verdict> {
    let mut new = decode_strictly::<SmolVM>(new)?;
    let old = match old {
        Some(old) => Some(decode_strictly::<SmolVM>(old)?),
        None => None,
    };
    if !additions.iter().all(|a| a.apply(&mut new)) {
        return None;
    }
    Some(validate_smolvm(op, old.as_ref(), &new, ctx))
}

/// The object decoded for the rules when it decodes as it stands (text directly); `None`
/// otherwise, without wording why.
fn decode_strictly<T: RuleDecode>(raw: Raw<'_>) -> Option<T> {
    let object = match raw {
        Raw::Value(value) => RuleObjectOf::<T>::deserialize(value).ok()?,
        Raw::Text(text) => serde_json::from_str::<RuleObjectOf<T>>(text).ok()?,
    };
    Some(T::assemble(object))
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn verdict_of(spec: Value) -> Verdict {
        let policy = crate::policy::Policy::default();
        let identity = Identity::user("alice@example.com");
        let ctx = Context {
            policy: &policy,
            nodes: &Vec::<SmolVMNode>::new(),
            classes: &crate::class::NO_CLASSES,
            pools: &crate::pool::NO_POOLS,
            sources: &crate::branch::NO_SOURCES,
            identity: &identity,
        };
        let object = json!({
            "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
            "metadata": {"name": "x", "namespace": "default"},
            "spec": spec,
        });
        let by_value = validate_smolvm_json(Operation::Create, None, &object, &ctx);
        let text = object.to_string();
        let by_text = validate_raw(Target::SmolVM, Operation::Create, None, Raw::Text(&text), &ctx);
        assert_eq!(by_value, by_text, "text and value agree");
        by_value
    }

    /// (rule, path, message) of each violation.
    fn listed(v: &Verdict) -> Vec<(RuleId, String, String)> {
        v.violations
            .iter()
            .map(|f| (f.rule, f.path.clone(), f.message.clone()))
            .collect()
    }

    #[test]
    fn undecodable_fields_are_listed_with_every_other_violation() {
        type Case = (&'static str, Value, &'static [(RuleId, &'static str, &'static str)]);
        let table: &[Case] = &[
            (
                "unknown enum value with a relative workingDir and a duplicate env name",
                json!({"image": "alpine:latest", "restartPolicy": "Sometimes", "workingDir": "rel",
                    "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
                &[
                    (
                        RuleId::Schema,
                        "spec.restartPolicy",
                        r#"Unsupported value: "Sometimes": supported values: "Always", "OnFailure", "Never""#,
                    ),
                    (RuleId::V11, "spec.workingDir", "not an absolute path"),
                    (RuleId::V11, "spec.env[1].name", "duplicates env[0]"),
                ],
            ),
            (
                "wrong types beside bounds",
                json!({"image": "alpine:latest", "resources": {"cpus": "two", "memoryMiB": 1},
                    "running": "yes"}),
                &[
                    (
                        RuleId::Schema,
                        "spec.resources.cpus",
                        r#"Invalid value: "two": must be an integer (int32)"#,
                    ),
                    (
                        RuleId::Schema,
                        "spec.running",
                        r#"Invalid value: "yes": must be a boolean"#,
                    ),
                    (RuleId::V2, "spec.resources.memoryMiB", ""),
                ],
            ),
            (
                "in list entries, a required field absent",
                json!({"image": "alpine:latest", "network": {"enabled": true, "ports": [
                    {"hostPort": 8080, "guestPort": 80, "protocol": "SCTP"},
                    {"hostPort": "x", "guestPort": 81},
                    {"guestPort": 82},
                    {"hostPort": 22, "guestPort": 22}]}, "command": ["sh", 5]}),
                &[
                    (
                        RuleId::Schema,
                        "spec.network.ports[0].protocol",
                        r#"Unsupported value: "SCTP": supported values: "TCP", "UDP""#,
                    ),
                    (
                        RuleId::Schema,
                        "spec.network.ports[1].hostPort",
                        r#"Invalid value: "x""#,
                    ),
                    (RuleId::Schema, "spec.network.ports[2].hostPort", "Required value"),
                    (RuleId::Schema, "spec.command[1]", "Invalid value: 5: must be a string"),
                    (RuleId::V3, "spec.network.ports[3].hostPort", ""),
                ],
            ),
            (
                "an out-of-range integer and a map value of the wrong type",
                json!({"image": "Bad Image", "resources": {"cpus": 5_000_000_000i64},
                    "nodeSelector": {"kubernetes.io/arch": 5}}),
                &[
                    (RuleId::Schema, "spec.resources.cpus", "Invalid value: 5000000000"),
                    (
                        RuleId::Schema,
                        r#"spec.nodeSelector["kubernetes.io/arch"]"#,
                        "must be a string",
                    ),
                    (RuleId::V1, "spec.image", ""),
                ],
            ),
            (
                "image absent and of the wrong type elsewhere",
                json!({"restartPolicy": 7}),
                &[
                    (RuleId::Schema, "spec.restartPolicy", "Invalid value: 7"),
                    (RuleId::V1, "spec.image", "is required"),
                ],
            ),
            (
                "a spec that is not an object",
                json!(1),
                &[(RuleId::Schema, "spec", "must be an object")],
            ),
        ];
        for (name, spec, expected) in table {
            let verdict = verdict_of(spec.clone());
            let got = listed(&verdict);
            for (rule, path, text) in *expected {
                assert!(
                    got.iter().any(|(r, p, m)| r == rule && p == path && m.contains(text)),
                    "{name}: no {rule} at {path} saying {text:?} in {got:#?}"
                );
            }
            // Nothing is said twice about one field, and nothing about the neutral values.
            let mut paths: Vec<&String> = got.iter().map(|(_, p, _)| p).collect();
            paths.sort();
            paths.dedup();
            assert_eq!(paths.len(), got.len(), "{name}: {got:#?}");
            assert_eq!(got.len(), expected.len(), "{name}: {got:#?}");
            for finding in &verdict.violations {
                assert!(finding.to_string().contains(&finding.value), "{name}: {finding}");
            }
        }
    }

    /// The defaulting patch applied to the decoded object gives what decoding the patched JSON
    /// gives, for objects of every shape defaulting meets; where it cannot tell, it says so.
    #[test]
    fn defaults_applied_to_the_decoded_object_match_the_patched_json() {
        use crate::defaulting::{Shape, additions, default_smolvm};
        let objects = [
            json!({"metadata": {"name": "a"}, "spec": {"image": "alpine"}}),
            json!({"metadata": {"name": "a", "finalizers": ["x"]}, "spec": {"image": "alpine", "running": null,
                "resources": {"cpus": 2}, "storage": {"overlayGiB": null}, "network": {"enabled": true,
                "ports": [{"hostPort": 1, "guestPort": 2}, {"hostPort": 3, "guestPort": 4, "protocol": "UDP"},
                          [7, 8]]}}}),
            json!({"metadata": {"name": "a", "finalizers": null}, "spec": {"image": "alpine", "resources": null,
                "storage": {}, "network": {"exposeService": true}, "restartPolicy": "Never"}}),
            json!({"metadata": {"name": "a", "finalizers": ["vm.smolvm.dev/node-cleanup"]},
                "spec": {"image": "alpine", "resources": [2, 1024], "network": {"ports": [[7, 8]]}}}),
            json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"image": "alpine"}}),
            json!({"spec": {"image": "alpine", "storage": [20]}}),
            json!({"spec": {"image": "alpine", "terminationGracePeriodSeconds": 30}}),
            // These two do not decode as they stand (a null protocol, a null metadata): the
            // patched JSON is validated instead.
            json!({"metadata": {"name": "a"}, "spec": {"image": "alpine", "network": {"enabled": true,
                "ports": [{"hostPort": 5, "guestPort": 6, "protocol": null}]}}}),
            json!({"metadata": null, "spec": {"image": "alpine"}}),
        ];
        let mut applied = 0;
        for object in &objects {
            for op in [Operation::Create, Operation::Update] {
                let patch = default_smolvm(op, object);
                let mut patched = object.clone();
                json_patch::patch(&mut patched, &patch).unwrap_or_else(|e| panic!("{object}: {e}"));
                let want = decode_strictly::<SmolVM>(Raw::Value(&patched));
                let text = object.to_string();
                let added = additions(op, &Shape::of_value(object));
                let got = decode_strictly::<SmolVM>(Raw::Text(&text))
                    .and_then(|mut vm| added.iter().all(|a| a.apply(&mut vm)).then_some(vm));
                match (&got, &want) {
                    (Some(got), Some(want)) => {
                        assert_eq!(got.spec, want.spec, "{object} {op:?}");
                        assert_eq!(got.metadata.finalizers, want.metadata.finalizers, "{object} {op:?}");
                        assert_eq!(got.metadata.deletion_timestamp, want.metadata.deletion_timestamp);
                        applied += 1;
                    }
                    // Not decodable as it stands: the caller patches the JSON.
                    (None, _) => {}
                    (Some(_), None) => panic!("{object} {op:?}: applied where the patched JSON does not decode"),
                }
            }
        }
        assert_eq!(
            applied,
            2 * (objects.len() - 2),
            "all but the last two decode as they stand"
        );
    }

    #[test]
    fn list_entries_of_paths() {
        for (path, entry) in [
            ("spec.network.ports[2].hostPort", Some("spec.network.ports[2]")),
            ("spec.env[0].valueFrom", Some("spec.env[0]")),
            ("spec.command[1]", None),
            ("spec.restartPolicy", None),
            ("spec", None),
            ("object", None),
            (r#"spec.nodeSelector["a[1]"]"#, None),
            ("spec.x[].y", None),
        ] {
            assert_eq!(entry_of(path), entry, "{path}");
        }
    }

    /// Only this project's annotations are kept for the rules; any other must still be a
    /// string, reported at its path as a map of strings reports it.
    #[test]
    fn annotations_kept_for_the_rules() {
        let object = json!({"metadata": {"name": "a", "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{\"a\":\"\\u00e9\"}",
            "vm.smolvm.dev/force-delete-local-state": "true", "other": "x"}},
            "spec": {"image": "alpine"}});
        let text = object.to_string();
        for raw in [Raw::Value(&object), Raw::Text(&text)] {
            let vm = decode_strictly::<SmolVM>(raw).unwrap_or_else(|| panic!("{object}"));
            let kept: Vec<&String> = vm.metadata.annotations.iter().flatten().map(|(k, _)| k).collect();
            assert_eq!(kept, ["vm.smolvm.dev/force-delete-local-state"]);
        }
        let policy = crate::policy::Policy::default();
        let identity = Identity::user("alice@example.com");
        let ctx = Context {
            policy: &policy,
            nodes: &Vec::<SmolVMNode>::new(),
            classes: &crate::class::NO_CLASSES,
            pools: &crate::pool::NO_POOLS,
            sources: &crate::branch::NO_SOURCES,
            identity: &identity,
        };
        let bad = json!({"metadata": {"name": "a", "annotations": {"example.com/n": 5, "vm.smolvm.dev/x": [1]}},
            "spec": {"image": "alpine"}});
        let text = bad.to_string();
        for raw in [Raw::Value(&bad), Raw::Text(&text)] {
            let verdict = validate_raw(Target::SmolVM, Operation::Create, None, raw, &ctx);
            let got = listed(&verdict);
            for (path, message) in [
                (
                    r#"metadata.annotations["example.com/n"]"#,
                    "Invalid value: 5: must be a string",
                ),
                (
                    r#"metadata.annotations["vm.smolvm.dev/x"]"#,
                    "Invalid value: a list: must be a string",
                ),
            ] {
                assert!(
                    got.iter()
                        .any(|(r, p, m)| *r == RuleId::Schema && p == path && m == message),
                    "{path} {message:?} in {got:#?}"
                );
            }
        }
    }

    #[test]
    fn env_values_are_never_echoed() {
        let verdict = verdict_of(json!({"image": "alpine:latest", "env": [{"name": "PASSWORD", "value": 12345678}]}));
        assert_eq!(verdict.violations.len(), 1, "{verdict:?}");
        let text = verdict.violations[0].to_string();
        assert!(text.starts_with("spec.env[0].value"), "{text}");
        assert!(!text.contains("12345678"), "{text}");
    }

    #[test]
    fn unreadable_objects_and_many_bad_fields_stay_bounded() {
        // Not an object: one finding at the object.
        let bad: Vec<u32> = Vec::new();
        let found = decode_leniently::<RuleObjectOf<SmolVM>>(&json!(bad));
        assert!(matches!(&found, Err(f) if f.len() == 1 && f[0].path == "object"));
        // A hundred bad entries: at most MAX_REPAIRS of them, and a finding that more do not decode.
        let command: Vec<u32> = (0..100).collect();
        let verdict = verdict_of(json!({"image": "alpine:latest", "command": command}));
        assert!(verdict.violations.len() <= MAX_REPAIRS + 1, "{verdict:?}");
        assert!(
            verdict
                .violations
                .iter()
                .any(|f| f.message.contains("does not match the API schema"))
        );
    }
}
