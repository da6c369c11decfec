//! Validation (the validating half of admission): rules V1 to V10.
//!
//! Every function here is pure: it takes the operation, the old and new objects and a
//! [`Context`] (policy, known SmolVMNodes, requester identity), and returns a [`Verdict`] with
//! every violation and every warning at once. Each [`Finding`] names the field path, the value and
//! the rule, so the message a user reads tells them what to fix.

use std::{borrow::Borrow, collections::BTreeMap, fmt};

use serde::{Deserialize, de::DeserializeOwned};
use serde_json::Value;

use crate::{
    constants::{
        EXTRA_NODE_NAME, EXTRA_NODE_UID, FORCE_DELETE_ANNOTATION, FORCE_DELETE_VALUE, RECREATE_LOST_MACHINE_ANNOTATION,
        RECREATE_LOST_MACHINE_VALUE, condition, reason,
    },
    policy::{Policy, Role},
    syntax,
    types::{
        DEFAULT_CPUS, DEFAULT_MEMORY_MIB, DEFAULT_OVERLAY_GIB, DEFAULT_STORAGE_GIB, MAX_SELECTOR_ENTRIES,
        NodeResources, SmolVM, SmolVMNode, SmolVMSpec,
    },
};

/// The admission operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// CREATE.
    Create,
    /// UPDATE.
    Update,
    /// DELETE (never routed to the webhook, but handled).
    Delete,
    /// CONNECT.
    Connect,
}

impl Operation {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// The rule a finding comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuleId {
    /// The object does not have the API's shape.
    Schema,
    /// V1: image.
    V1,
    /// V2: resource and storage bounds.
    V2,
    /// V3: ports and CIDRs.
    V3,
    /// V4: node name and selector syntax.
    V4,
    /// V5: pin rules.
    V5,
    /// V6: immutability after binding.
    V6,
    /// V7: force-delete annotation.
    V7,
    /// V8: objects being deleted.
    V8,
    /// V9: status binding fields.
    V9,
    /// V10: SmolVMNode writes.
    V10,
    /// V11: the workload (command, args, env, pull secrets, restart, egress by host name).
    V11,
}

impl RuleId {
    /// The rule id as written in the spec and in metrics (`V1` ... `V10`, `schema`).
    pub fn as_str(self) -> &'static str {
        match self {
            RuleId::Schema => "schema",
            RuleId::V1 => "V1",
            RuleId::V2 => "V2",
            RuleId::V3 => "V3",
            RuleId::V4 => "V4",
            RuleId::V5 => "V5",
            RuleId::V6 => "V6",
            RuleId::V7 => "V7",
            RuleId::V8 => "V8",
            RuleId::V9 => "V9",
            RuleId::V10 => "V10",
            RuleId::V11 => "V11",
        }
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One violation or warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The rule.
    pub rule: RuleId,
    /// Field path, such as `spec.resources.cpus` or `spec.network.ports[1].hostPort`.
    pub path: String,
    /// The offending value, rendered as JSON (`96`, `"alpine latest"`), or empty when absent.
    pub value: String,
    /// What is wrong, naming the value and the bound or rule it breaks.
    pub message: String,
    /// JSON pointer of the field, used to tell new violations from pre-existing ones.
    pointer: String,
}

impl Finding {
    fn new(rule: RuleId, path: impl Into<String>, pointer: impl Into<String>, value: String, message: String) -> Self {
        Finding {
            rule,
            path: path.into(),
            value,
            message,
            pointer: pointer.into(),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} [{}]", self.path, self.message, self.rule)
    }
}

/// The outcome of validation: allowed when there is no violation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Reasons to reject, all of them.
    pub violations: Vec<Finding>,
    /// Things the requester should know; they never reject.
    pub warnings: Vec<Finding>,
}

impl Verdict {
    /// Whether the request may proceed.
    pub fn allowed(&self) -> bool {
        self.violations.is_empty()
    }

    /// Every violation, one per line, for the admission response message.
    pub fn message(&self) -> String {
        let mut out = String::new();
        for (i, v) in self.violations.iter().enumerate() {
            if i > 0 {
                out.push_str("; ");
            }
            out.push_str(&v.to_string());
        }
        out
    }

    /// The rule ids of the violations, deduplicated and sorted (for metrics).
    pub fn violated_rules(&self) -> Vec<RuleId> {
        let mut rules: Vec<RuleId> = self.violations.iter().map(|v| v.rule).collect();
        rules.sort();
        rules.dedup();
        rules
    }

    fn violation(&mut self, rule: RuleId, path: &str, pointer: &str, value: String, message: String) {
        self.violations.push(Finding::new(rule, path, pointer, value, message));
    }

    fn warning(&mut self, rule: RuleId, path: &str, pointer: &str, value: String, message: String) {
        self.warnings.push(Finding::new(rule, path, pointer, value, message));
    }

    /// A violation at `path`, its JSON pointer derived from it.
    fn violation_at(&mut self, rule: RuleId, path: &str, value: String, message: String) {
        self.violation(rule, path, &pointer_of(path), value, message);
    }

    /// A list at `path` with more `noun` than the policy field `limit` (value `max`) allows.
    fn too_many(&mut self, rule: RuleId, path: &str, noun: &str, count: usize, max: i64, limit: &str) {
        if count as i64 > max {
            self.violation_at(
                rule,
                path,
                format!("{count} {noun}"),
                format!("{count} {noun} exceed the maximum {max} (policy {limit})"),
            );
        }
    }

    /// A value at `path` longer than `max` bytes (policy maxValueBytes). Never echoes the value.
    fn too_long(&mut self, rule: RuleId, path: &str, len: usize, max: usize) {
        if len > max {
            self.violation_at(
                rule,
                path,
                format!("{len} bytes"),
                format!("{len} bytes exceed the maximum {max} (policy maxValueBytes)"),
            );
        }
    }

    /// `value` at `path`, when `check` refuses it, shown with the reason.
    fn invalid(&mut self, rule: RuleId, path: &str, value: &str, check: fn(&str) -> Result<(), String>) {
        if let Err(reason) = check(value) {
            self.violation_at(rule, path, render(value), format!("{} {reason}", render(value)));
        }
    }

    /// Each entry of the list at `path` that `check` refuses, shown with the reason.
    fn each_invalid(&mut self, rule: RuleId, path: &str, entries: &[String], check: fn(&str) -> Result<(), String>) {
        for (i, entry) in entries.iter().enumerate() {
            self.invalid(rule, &format!("{path}[{i}]"), entry, check);
        }
    }
}

/// A field path as a JSON pointer: `spec.env[2].name` is `/spec/env/2/name`.
fn pointer_of(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 1);
    for part in path.split('.') {
        let (name, indices) = part.split_once('[').unwrap_or((part, ""));
        out.push('/');
        out.push_str(name);
        for index in indices.split('[').filter(|x| !x.is_empty()) {
            out.push('/');
            out.push_str(index.trim_end_matches(']'));
        }
    }
    out
}

/// Who sent the request, as the API server authenticated them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// Username, such as `system:serviceaccount:smolvm-system:smolvm-runtime`.
    pub username: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes; a pod-bound ServiceAccount token carries the node name and UID here.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// An identity with only a username.
    pub fn user(username: impl Into<String>) -> Self {
        Identity {
            username: username.into(),
            ..Default::default()
        }
    }

    /// The node named in the token (`authentication.kubernetes.io/node-name`), if exactly one.
    pub fn node_name(&self) -> Option<&str> {
        single(self.extra.get(EXTRA_NODE_NAME))
    }

    /// The node UID named in the token (`authentication.kubernetes.io/node-uid`), if exactly one.
    pub fn node_uid(&self) -> Option<&str> {
        single(self.extra.get(EXTRA_NODE_UID))
    }
}

fn single(values: Option<&Vec<String>>) -> Option<&str> {
    match values.map(Vec::as_slice) {
        Some([one]) => Some(one.as_str()),
        _ => None,
    }
}

/// The known SmolVMNodes, as the webhook's cache sees them.
pub trait NodeCatalog {
    /// `None` when no SmolVMNode of that name is known; otherwise its facts.
    fn node(&self, name: &str) -> Option<NodeFacts>;
    /// Whether any known node satisfies `pred`.
    fn any_node(&self, pred: &mut dyn FnMut(&SmolVMNode) -> bool) -> bool;
    /// Whether no node is known at all.
    fn is_empty(&self) -> bool;
}

/// What the rules need to know of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// Allocatable resources, if the runtime reported them.
    pub allocatable: Option<NodeResources>,
    /// Whether the node is cordoned for VMs.
    pub unschedulable: bool,
}

impl NodeFacts {
    /// Facts of a SmolVMNode object.
    pub fn of(node: &SmolVMNode) -> Self {
        NodeFacts {
            allocatable: node.status.as_ref().and_then(|s| s.allocatable),
            unschedulable: node.spec.unschedulable.unwrap_or(false),
        }
    }
}

fn name_of(node: &SmolVMNode) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

/// A list of nodes, owned or shared (`Vec<SmolVMNode>`, `Vec<Arc<SmolVMNode>>`).
impl<T: Borrow<SmolVMNode>> NodeCatalog for Vec<T> {
    fn node(&self, name: &str) -> Option<NodeFacts> {
        self.iter()
            .map(Borrow::borrow)
            .find(|n| name_of(n) == name)
            .map(NodeFacts::of)
    }
    fn any_node(&self, pred: &mut dyn FnMut(&SmolVMNode) -> bool) -> bool {
        self.iter().any(|n| pred(n.borrow()))
    }
    fn is_empty(&self) -> bool {
        Vec::is_empty(self)
    }
}

/// Everything validation depends on besides the objects.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    /// The admission policy.
    pub policy: &'a Policy,
    /// The known SmolVMNodes.
    pub nodes: &'a dyn NodeCatalog,
    /// The requester.
    pub identity: &'a Identity,
}

impl Context<'_> {
    fn role(&self) -> Role {
        self.policy.role_of(&self.identity.username)
    }
}

fn render<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

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
                "/spec/image",
                String::new(),
                "is required: an OCI reference such as alpine:latest, or local:<name>".into(),
            );
        }
        let path = if path == "." { "object".to_string() } else { path };
        let pointer = format!("/{}", path.replace('.', "/"));
        Finding::new(
            RuleId::Schema,
            path,
            pointer,
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
            "/object",
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

/// Validates a SmolVM write on the main resource (rules V1 to V8).
pub fn validate_smolvm(op: Operation, old: Option<&SmolVM>, new: &SmolVM, ctx: &Context<'_>) -> Verdict {
    let mut verdict = Verdict::default();
    if !matches!(op, Operation::Create | Operation::Update) {
        return verdict;
    }
    let old = if op == Operation::Update { old } else { None };
    check_force_delete(op, old, new, &mut verdict);
    check_recreate_lost(op, old, new, &mut verdict);

    // V8: an object being deleted accepts metadata changes only, and nothing else is checked, so
    // that removing a finalizer is never blocked.
    if let Some(old) = old
        && (old.is_deleting() || new.is_deleting())
    {
        if old.spec != new.spec {
            verdict.violation(
                RuleId::V8,
                "spec",
                "/spec",
                String::new(),
                "cannot change while the SmolVM is being deleted; only metadata (such as finalizers and annotations) may change".into(),
            );
        }
        return verdict;
    }

    let mut spec_checks = Verdict::default();
    check_spec(&new.spec, ctx.policy, &mut spec_checks);
    match old {
        // Ratcheting: a violation the stored object already had, under the current policy, is
        // not this update's doing (the policy may have tightened since); it is reported as a
        // warning so the object stays updatable, for example to fix it. A violation the update
        // brings about (also through another field: disabling the network under existing ports,
        // a port changed into a duplicate of an untouched one) stays a violation.
        Some(old) => {
            let mut before = Verdict::default();
            if !spec_checks.violations.is_empty() {
                check_spec(&old.spec, ctx.policy, &mut before);
            }
            for finding in spec_checks.violations {
                let predates = before
                    .violations
                    .iter()
                    .any(|b| b.rule == finding.rule && b.pointer == finding.pointer && b.message == finding.message);
                if predates {
                    verdict.warnings.push(Finding {
                        message: format!(
                            "{} (unchanged by this update; it predates the current policy)",
                            finding.message
                        ),
                        ..finding
                    });
                } else {
                    verdict.violations.push(finding);
                }
            }
        }
        None => verdict.violations.extend(spec_checks.violations),
    }
    verdict.warnings.extend(spec_checks.warnings);
    check_expose(new, &mut verdict);

    match old.and_then(SmolVM::bound_node) {
        Some(bound) => {
            if let Some(old) = old {
                check_bound(bound, &old.spec, &new.spec, &mut verdict);
                if old.spec.request() != new.spec.request() {
                    check_bound_capacity(bound, &new.spec, ctx, &mut verdict);
                }
            }
        }
        None => {
            let placement_changed =
                old.is_none_or(|o| o.spec.node_name != new.spec.node_name || o.spec.request() != new.spec.request());
            if placement_changed {
                check_placement(&new.spec, ctx, &mut verdict);
            }
        }
    }
    verdict
}

/// V3, `network.exposeService`: the Service takes the SmolVM's name, so the name must be able to
/// name a Service; a Service without ports, or with two published ports on one guest port and
/// protocol, is warned about.
fn check_expose(vm: &SmolVM, v: &mut Verdict) {
    if !vm.spec.expose_service() {
        return;
    }
    let name = vm.metadata.name.as_deref().unwrap_or_default();
    // A generateName object has no name yet at admission; the controller reports a bad one.
    if !name.is_empty()
        && let Err(why) = syntax::check_dns1035_label(name)
    {
        v.violation(
            RuleId::V3,
            "spec.network.exposeService",
            "/spec/network/exposeService",
            "true".into(),
            format!("true needs a SmolVM name that can name its Service, and metadata.name {name:?} {why}"),
        );
    }
    let ports = vm.spec.ports();
    if ports.is_empty() {
        v.warning(
            RuleId::V3,
            "spec.network.exposeService",
            "/spec/network/exposeService",
            "true".into(),
            "is true but spec.network.ports is empty: no Service is made until the SmolVM publishes a port".into(),
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        if !seen.insert((p.guest_port, p.protocol)) {
            v.warning(
                RuleId::V3,
                &format!("spec.network.ports[{i}]"),
                &format!("/spec/network/ports/{i}"),
                format!("{}->{}/{}", p.host_port, p.guest_port, p.protocol.as_str()),
                format!(
                    "{}->{}/{} publishes guest port {} a second time; the Service carries the first only",
                    p.host_port,
                    p.guest_port,
                    p.protocol.as_str(),
                    p.guest_port
                ),
            );
        }
    }
}

/// V1 to V4 and V11: the spec on its own, against the policy.
fn check_spec(spec: &SmolVMSpec, policy: &Policy, v: &mut Verdict) {
    // V1
    if let Err(reason) = syntax::parse_image(&spec.image) {
        v.violation(
            RuleId::V1,
            "spec.image",
            "/spec/image",
            render(&spec.image),
            format!("{} {reason}", render(&spec.image)),
        );
    }

    // V2
    let resources = spec.resources.as_ref();
    let storage = spec.storage.as_ref();
    struct Bound<'a> {
        path: &'a str,
        value: Option<i64>,
        default: i64,
        min: (&'a str, i64),
        max: (&'a str, i64),
    }
    let bounds = [
        Bound {
            path: "resources/cpus",
            value: resources.and_then(|r| r.cpus).map(i64::from),
            default: i64::from(DEFAULT_CPUS),
            min: ("minCpus", policy.min_cpus),
            max: ("maxCpus", policy.max_cpus),
        },
        Bound {
            path: "resources/memoryMiB",
            value: resources.and_then(|r| r.memory_mib),
            default: DEFAULT_MEMORY_MIB,
            min: ("minMemoryMiB", policy.min_memory_mib),
            max: ("maxMemoryMiB", policy.max_memory_mib),
        },
        Bound {
            path: "storage/storageGiB",
            value: storage.and_then(|s| s.storage_gib),
            default: DEFAULT_STORAGE_GIB,
            min: ("minStorageGiB", policy.min_storage_gib),
            max: ("maxStorageGiB", policy.max_storage_gib),
        },
        Bound {
            path: "storage/overlayGiB",
            value: storage.and_then(|s| s.overlay_gib),
            default: DEFAULT_OVERLAY_GIB,
            min: ("minOverlayGiB", policy.min_overlay_gib),
            max: ("maxOverlayGiB", policy.max_overlay_gib),
        },
    ];
    for b in bounds {
        let actual = b.value.unwrap_or(b.default);
        let ((min_name, min), (max_name, max)) = (b.min, b.max);
        if (min..=max).contains(&actual) {
            continue; // the common case: nothing to report, nothing to format
        }
        let path = format!("spec.{}", b.path.replace('/', "."));
        let pointer = format!("/spec/{}", b.path);
        let shown = match b.value {
            Some(x) => x.to_string(),
            None => format!("{} (the default)", b.default),
        };
        if actual < min {
            let message = format!("{shown} is below the minimum {min} (policy {min_name})");
            v.violation(RuleId::V2, &path, &pointer, actual.to_string(), message);
        } else if actual > max {
            let message = format!("{shown} exceeds the maximum {max} (policy {max_name})");
            v.violation(RuleId::V2, &path, &pointer, actual.to_string(), message);
        }
    }

    // V3
    let ports = spec.ports();
    let cidrs = spec.allowed_cidrs();
    if !spec.network_enabled() {
        if !ports.is_empty() {
            v.violation(
                RuleId::V3,
                "spec.network.ports",
                "/spec/network/ports",
                format!("{} port(s)", ports.len()),
                format!("{} port(s) need spec.network.enabled: true", ports.len()),
            );
        }
        if !cidrs.is_empty() {
            v.violation(
                RuleId::V3,
                "spec.network.allowedCIDRs",
                "/spec/network/allowedCIDRs",
                format!("{} CIDR(s)", cidrs.len()),
                format!("{} CIDR(s) need spec.network.enabled: true", cidrs.len()),
            );
        }
    }
    v.too_many(
        RuleId::V3,
        "spec.network.ports",
        "ports",
        ports.len(),
        policy.max_ports,
        "maxPorts",
    );
    let mut seen: BTreeMap<(i32, crate::types::Protocol), usize> = BTreeMap::new();
    for (i, port) in ports.iter().enumerate() {
        for (field, value) in [("hostPort", port.host_port), ("guestPort", port.guest_port)] {
            if !(1..=65535).contains(&value) {
                v.violation(
                    RuleId::V3,
                    &format!("spec.network.ports[{i}].{field}"),
                    &format!("/spec/network/ports/{i}/{field}"),
                    value.to_string(),
                    format!("{value} is not a port number (1-65535)"),
                );
            }
        }
        let host = i64::from(port.host_port);
        if (1..=65535).contains(&host) && !(policy.host_port_min..=policy.host_port_max).contains(&host) {
            v.violation(
                RuleId::V3,
                &format!("spec.network.ports[{i}].hostPort"),
                &format!("/spec/network/ports/{i}/hostPort"),
                host.to_string(),
                format!(
                    "{host} is outside the allowed host port range {}-{} (policy hostPortMin, hostPortMax)",
                    policy.host_port_min, policy.host_port_max
                ),
            );
        }
        if let Some(first) = seen.insert((port.host_port, port.protocol), i) {
            v.violation(
                RuleId::V3,
                &format!("spec.network.ports[{i}]"),
                &format!("/spec/network/ports/{i}"),
                format!("{}/{}", port.host_port, port.protocol),
                format!(
                    "{}/{} duplicates ports[{first}]: a host port and protocol may be used once",
                    port.host_port, port.protocol
                ),
            );
        }
    }
    v.too_many(
        RuleId::V3,
        "spec.network.allowedCIDRs",
        "entries",
        cidrs.len(),
        policy.max_allowed_cidrs,
        "maxAllowedCIDRs",
    );
    v.each_invalid(RuleId::V3, "spec.network.allowedCIDRs", cidrs, syntax::check_cidr);

    // V4
    if let Some(node) = &spec.node_name
        && let Err(reason) = syntax::check_dns1123_subdomain(node)
    {
        v.violation(
            RuleId::V4,
            "spec.nodeName",
            "/spec/nodeName",
            render(node),
            format!("{} {reason}", render(node)),
        );
    }
    if let Some(selector) = &spec.node_selector {
        if selector.len() > MAX_SELECTOR_ENTRIES {
            v.violation(
                RuleId::V4,
                "spec.nodeSelector",
                "/spec/nodeSelector",
                format!("{} entries", selector.len()),
                format!("{} entries exceed the maximum {MAX_SELECTOR_ENTRIES}", selector.len()),
            );
        }
        for (key, value) in selector {
            let pointer = || format!("/spec/nodeSelector/{}", key.replace('~', "~0").replace('/', "~1"));
            if let Err(reason) = syntax::check_label_key(key) {
                v.violation(
                    RuleId::V4,
                    &format!("spec.nodeSelector[{}]", render(key)),
                    &pointer(),
                    render(key),
                    format!("key {} {reason}", render(key)),
                );
            }
            if let Err(reason) = syntax::check_label_value(value) {
                v.violation(
                    RuleId::V4,
                    &format!("spec.nodeSelector[{}]", render(key)),
                    &pointer(),
                    render(value),
                    format!("value {} {reason}", render(value)),
                );
            }
        }
    }
    // V11
    check_workload(spec, policy, v);
}

/// V11: the workload, against the policy's maxima. Values are never echoed (an env value or an
/// argument may be a secret): a finding names the entry and its size.
fn check_workload(spec: &SmolVMSpec, policy: &Policy, v: &mut Verdict) {
    let max_bytes = usize::try_from(policy.max_value_bytes).unwrap_or(usize::MAX);
    for (field, list) in [("command", &spec.command), ("args", &spec.args)] {
        let Some(list) = list else { continue };
        let path = format!("spec.{field}");
        v.too_many(RuleId::V11, &path, "entries", list.len(), policy.max_args, "maxArgs");
        for (i, entry) in list.iter().enumerate() {
            v.too_long(RuleId::V11, &format!("{path}[{i}]"), entry.len(), max_bytes);
        }
    }
    if let Some(dir) = &spec.working_dir {
        if !dir.starts_with('/') {
            v.violation(
                RuleId::V11,
                "spec.workingDir",
                "/spec/workingDir",
                render(dir),
                format!("{} is not an absolute path (it must start with '/')", render(dir)),
            );
        } else if dir.len() > max_bytes.min(4096) {
            v.violation(
                RuleId::V11,
                "spec.workingDir",
                "/spec/workingDir",
                format!("{} bytes", dir.len()),
                format!("{} bytes exceed the maximum {}", dir.len(), max_bytes.min(4096)),
            );
        }
    }
    if let Some(env) = &spec.env {
        v.too_many(RuleId::V11, "spec.env", "entries", env.len(), policy.max_env, "maxEnv");
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, var) in env.iter().enumerate() {
            let at = |field: &str| format!("spec.env[{i}]{field}");
            if var.name.is_empty() || var.name.contains('=') {
                v.violation_at(
                    RuleId::V11,
                    &at(".name"),
                    render(&var.name),
                    format!(
                        "{} is not a variable name: it must be non-empty and have no '='",
                        render(&var.name)
                    ),
                );
            } else if let Some(first) = seen.insert(var.name.as_str(), i) {
                seen.insert(var.name.as_str(), first);
                v.violation_at(
                    RuleId::V11,
                    &at(".name"),
                    render(&var.name),
                    format!("{} duplicates env[{first}]: names are unique", render(&var.name)),
                );
            }
            match (&var.value, &var.value_from) {
                (Some(_), Some(_)) | (None, None) => v.violation_at(
                    RuleId::V11,
                    &at(""),
                    render(&var.name),
                    format!(
                        "{} has {}: an env entry has exactly one of value and valueFrom",
                        render(&var.name),
                        if var.value.is_some() {
                            "both value and valueFrom"
                        } else {
                            "neither value nor valueFrom"
                        }
                    ),
                ),
                (Some(value), None) => v.too_long(RuleId::V11, &at(".value"), value.len(), max_bytes),
                (None, Some(from)) => {
                    let refs = [
                        ("secretKeyRef", from.secret_key_ref.as_ref()),
                        ("configMapKeyRef", from.config_map_key_ref.as_ref()),
                    ];
                    let given = refs.iter().filter(|(_, r)| r.is_some()).count();
                    if given != 1 {
                        v.violation_at(
                            RuleId::V11,
                            &at(".valueFrom"),
                            format!("{given} references"),
                            format!(
                                "{given} references: valueFrom has exactly one of secretKeyRef and configMapKeyRef"
                            ),
                        );
                    }
                    for (kind, selector) in refs {
                        let Some(selector) = selector else { continue };
                        let name_path = at(&format!(".valueFrom.{kind}.name"));
                        v.invalid(RuleId::V11, &name_path, &selector.name, syntax::check_dns1123_subdomain);
                        let key_path = at(&format!(".valueFrom.{kind}.key"));
                        v.invalid(RuleId::V11, &key_path, &selector.key, syntax::check_config_key);
                    }
                }
            }
        }
    }
    for (i, secret) in spec.image_pull_secrets.iter().flatten().enumerate() {
        let path = format!("spec.imagePullSecrets[{i}].name");
        v.invalid(RuleId::V11, &path, &secret.name, syntax::check_dns1123_subdomain);
    }
    if let Some(grace) = spec.termination_grace_period_seconds
        && !(0..=300).contains(&grace)
    {
        v.violation(
            RuleId::V11,
            "spec.terminationGracePeriodSeconds",
            "/spec/terminationGracePeriodSeconds",
            grace.to_string(),
            format!("{grace} is outside 0 to 300 seconds"),
        );
    }
    let hosts = spec.allowed_hosts();
    if !hosts.is_empty() && !spec.network_enabled() {
        v.violation(
            RuleId::V11,
            "spec.network.allowedHosts",
            "/spec/network/allowedHosts",
            format!("{} entries", hosts.len()),
            format!("{} entries need network.enabled: true", hosts.len()),
        );
    }
    v.too_many(
        RuleId::V11,
        "spec.network.allowedHosts",
        "entries",
        hosts.len(),
        policy.max_allowed_hosts,
        "maxAllowedHosts",
    );
    v.each_invalid(
        RuleId::V11,
        "spec.network.allowedHosts",
        hosts,
        syntax::check_allowed_host,
    );
}

/// V5 and V6 for a SmolVM already bound to `bound`.
fn check_bound(bound: &str, old: &SmolVMSpec, new: &SmolVMSpec, v: &mut Verdict) {
    // V5
    if let Some(pin) = &new.node_name
        && pin != bound
    {
        v.violation(
            RuleId::V5,
            "spec.nodeName",
            "/spec/nodeName",
            render(pin),
            format!(
                "{} cannot be set: the SmolVM is bound to {}; SmolVMs never move; delete and recreate it",
                render(pin),
                render(bound)
            ),
        );
    }

    // V6
    let immutable = "is immutable once the SmolVM is bound to a node; delete and recreate it to change it";
    if old.image != new.image {
        v.violation(
            RuleId::V6,
            "spec.image",
            "/spec/image",
            render(&new.image),
            format!("{} (was {}) {immutable}", render(&new.image), render(&old.image)),
        );
    }
    if old.network_enabled() != new.network_enabled() {
        v.violation(
            RuleId::V6,
            "spec.network.enabled",
            "/spec/network/enabled",
            new.network_enabled().to_string(),
            format!("{} (was {}) {immutable}", new.network_enabled(), old.network_enabled()),
        );
    }
    if !same_ports(old, new) {
        v.violation(
            RuleId::V6,
            "spec.network.ports",
            "/spec/network/ports",
            render(new.ports()),
            format!("{} (was {}) {immutable}", render(new.ports()), render(old.ports())),
        );
    }
    if old.allowed_cidrs() != new.allowed_cidrs() {
        v.violation(
            RuleId::V6,
            "spec.network.allowedCIDRs",
            "/spec/network/allowedCIDRs",
            render(new.allowed_cidrs()),
            format!(
                "{} (was {}) {immutable}",
                render(new.allowed_cidrs()),
                render(old.allowed_cidrs())
            ),
        );
    }
    if old.allowed_hosts() != new.allowed_hosts() {
        v.violation(
            RuleId::V6,
            "spec.network.allowedHosts",
            "/spec/network/allowedHosts",
            render(new.allowed_hosts()),
            format!(
                "{} (was {}) {immutable}",
                render(new.allowed_hosts()),
                render(old.allowed_hosts())
            ),
        );
    }
    // The workload: values are not echoed (an argument or env value may be a secret).
    let empty = Vec::new();
    let workload_changes: [(&str, bool); 7] = [
        (
            "command",
            old.command.as_ref().unwrap_or(&empty) != new.command.as_ref().unwrap_or(&empty),
        ),
        (
            "args",
            old.args.as_ref().unwrap_or(&empty) != new.args.as_ref().unwrap_or(&empty),
        ),
        ("workingDir", old.working_dir != new.working_dir),
        (
            "env",
            old.env.as_deref().unwrap_or(&[]) != new.env.as_deref().unwrap_or(&[]),
        ),
        (
            "imagePullSecrets",
            old.image_pull_secrets.as_deref().unwrap_or(&[]) != new.image_pull_secrets.as_deref().unwrap_or(&[]),
        ),
        ("restartPolicy", old.restart_policy() != new.restart_policy()),
        (
            "terminationGracePeriodSeconds",
            old.termination_grace_period_seconds() != new.termination_grace_period_seconds(),
        ),
    ];
    for (field, changed) in workload_changes {
        if changed {
            v.violation(
                RuleId::V6,
                &format!("spec.{field}"),
                &format!("/spec/{field}"),
                "(changed)".into(),
                format!("(changed) {immutable}"),
            );
        }
    }
    let (o, n) = (old.effective(), new.effective());
    for (path, pointer, before, after) in [
        (
            "spec.storage.storageGiB",
            "/spec/storage/storageGiB",
            o.storage_gib,
            n.storage_gib,
        ),
        (
            "spec.storage.overlayGiB",
            "/spec/storage/overlayGiB",
            o.overlay_gib,
            n.overlay_gib,
        ),
    ] {
        if after < before {
            v.violation(
                RuleId::V6,
                path,
                pointer,
                after.to_string(),
                format!("{after} is smaller than {before}: storage may only grow once bound"),
            );
        }
    }
    if (o.cpus, o.memory_mib) != (n.cpus, n.memory_mib) {
        v.warning(
            RuleId::V6,
            "spec.resources",
            "/spec/resources",
            format!("{} CPUs, {} MiB", n.cpus, n.memory_mib),
            format!(
                "resize from {} CPUs, {} MiB to {} CPUs, {} MiB on node {bound} is applied live where the runtime supports it, otherwise shown as ResizePending",
                o.cpus, o.memory_mib, n.cpus, n.memory_mib
            ),
        );
    }
}

fn same_ports(old: &SmolVMSpec, new: &SmolVMSpec) -> bool {
    let mut a = old.ports().to_vec();
    let mut b = new.ports().to_vec();
    let key = |p: &crate::types::Port| (p.host_port, p.protocol, p.guest_port);
    a.sort_by_key(key);
    b.sort_by_key(key);
    a == b
}

/// V5 for an unbound SmolVM: pins and capacity against the known nodes.
/// V5 for a bound SmolVM whose request changes: its node is now its pin, so a request the
/// node's allocatable can never hold is rejected (it would stay ResizePending forever). Room
/// that other SmolVMs hold now is the controller's concern, not admission's.
fn check_bound_capacity(bound: &str, spec: &SmolVMSpec, ctx: &Context<'_>, v: &mut Verdict) {
    let Some(allocatable) = ctx.nodes.node(bound).and_then(|facts| facts.allocatable) else {
        return;
    };
    let request = spec.request();
    let dimensions = [
        (
            "spec.resources.cpus",
            "/spec/resources/cpus",
            request.cpus,
            allocatable.cpus,
            "CPUs",
        ),
        (
            "spec.resources.memoryMiB",
            "/spec/resources/memoryMiB",
            request.memory_mib,
            allocatable.memory_mib,
            "MiB of memory",
        ),
        (
            "spec.storage",
            "/spec/storage",
            request.storage_gib,
            allocatable.storage_gib,
            "GiB of disk (storage plus overlay)",
        ),
    ];
    for (path, pointer, wanted, available, unit) in dimensions {
        if wanted > available {
            v.violation(
                RuleId::V5,
                path,
                pointer,
                wanted.to_string(),
                format!(
                    "{wanted} {unit} can never fit on node {}, whose allocatable is {available}; a bound SmolVM never moves: ask for less, or delete and recreate it to place it elsewhere",
                    render(bound)
                ),
            );
        }
    }
}

fn check_placement(spec: &SmolVMSpec, ctx: &Context<'_>, v: &mut Verdict) {
    let request = spec.request();
    match &spec.node_name {
        Some(pin) => {
            match ctx.nodes.node(pin) {
                None => v.warning(
                    RuleId::V5,
                    "spec.nodeName",
                    "/spec/nodeName",
                    render(pin),
                    format!(
                        "no SmolVMNode {} is known; the SmolVM stays Pending until a runtime registers that node",
                        render(pin)
                    ),
                ),
                Some(facts) => {
                    if let Some(allocatable) = facts.allocatable
                        && !allocatable.holds(&request)
                    {
                        v.violation(
                        RuleId::V5,
                        "spec.nodeName",
                        "/spec/nodeName",
                        render(pin),
                        format!(
                            "pinned node {} can never hold this SmolVM: it needs {request}, the node's allocatable is {allocatable}",
                            render(pin)
                        ),
                    );
                    }
                    if facts.unschedulable {
                        v.warning(
                        RuleId::V5,
                        "spec.nodeName",
                        "/spec/nodeName",
                        render(pin),
                        format!("node {} is cordoned (spec.unschedulable); the SmolVM stays Pending until it is uncordoned", render(pin)),
                    );
                    }
                }
            }
        }
        None => {
            if ctx.nodes.is_empty() {
                v.warning(
                    RuleId::V5,
                    "spec",
                    "/spec",
                    String::new(),
                    "no SmolVMNode is registered yet; the SmolVM stays Pending until a runtime agent reports a node"
                        .into(),
                );
            } else if !ctx.nodes.any_node(&mut |node| could_ever_hold(node, spec, &request)) {
                v.warning(
                    RuleId::V5,
                    "spec.resources",
                    "/spec/resources",
                    request.to_string(),
                    format!(
                        "no known node can hold {request}{}; the SmolVM stays Pending until one can",
                        if spec.node_selector.as_ref().is_some_and(|s| !s.is_empty()) {
                            " and carries the spec.nodeSelector labels, uncordoned"
                        } else {
                            " uncordoned"
                        }
                    ),
                );
            }
        }
    }
}

/// Whether `node` could ever hold a SmolVM with `spec` (placement may still wait for room):
/// uncordoned, carrying every `spec.nodeSelector` label, with an allocatable that holds
/// `request`.
fn could_ever_hold(node: &SmolVMNode, spec: &SmolVMSpec, request: &NodeResources) -> bool {
    let facts = NodeFacts::of(node);
    let labels = node.metadata.labels.as_ref();
    let selected = spec.node_selector.as_ref().is_none_or(|selector| {
        selector
            .iter()
            .all(|(key, value)| labels.and_then(|l| l.get(key)) == Some(value))
    });
    !facts.unschedulable && selected && facts.allocatable.is_some_and(|a| a.holds(request))
}

/// V7: the force-delete annotation.
fn check_force_delete(op: Operation, old: Option<&SmolVM>, new: &SmolVM, v: &mut Verdict) {
    let annotation = |vm: &SmolVM| {
        vm.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FORCE_DELETE_ANNOTATION))
            .cloned()
    };
    let Some(value) = annotation(new) else { return };
    let path = format!("metadata.annotations[{FORCE_DELETE_ANNOTATION}]");
    let pointer = format!("/metadata/annotations/{}", FORCE_DELETE_ANNOTATION.replace('/', "~1"));
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
            v.violation(RuleId::V7, &path, &pointer, shown.clone(), message);
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
    v.warning(RuleId::V7, &path, &pointer, shown, message);
}

/// V7 for the recreate-lost-machine annotation: exactly `"true"`, only on a SmolVM whose machine
/// is lost (Ready=False, reason MachineLost), never on create; when admitted, the answer warns that
/// the new machine starts empty.
fn check_recreate_lost(op: Operation, old: Option<&SmolVM>, new: &SmolVM, v: &mut Verdict) {
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
    let pointer = format!(
        "/metadata/annotations/{}",
        RECREATE_LOST_MACHINE_ANNOTATION.replace('/', "~1")
    );
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
            v.violation(RuleId::V7, &path, &pointer, shown.clone(), message);
        }
        return;
    }
    let node = new.bound_node().unwrap_or("its node");
    v.warning(
        RuleId::V7,
        &path,
        &pointer,
        shown.clone(),
        format!("{shown}: a fresh, empty machine is created on {node}; the lost machine's disks are not recovered"),
    );
}

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
        (
            "status.nodeName",
            "/status/nodeName",
            &old_status.node_name,
            &new_status.node_name,
        ),
        (
            "status.nodeUID",
            "/status/nodeUID",
            &old_status.node_uid,
            &new_status.node_uid,
        ),
    ];
    let mut binding_written = false;
    for (path, pointer, before, after) in fields {
        match (before, after) {
            (Some(b), Some(a)) if a != b => v.violation(
                RuleId::V9,
                path,
                pointer,
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
                pointer,
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
                "/status/nodeName",
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
                "/status/nodeName",
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
                "/status/nodeName",
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
            "/status/nodeName",
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
    const POINTER: &str = "/status/machineName";
    let after = new.status.as_ref().and_then(|s| s.machine_name.as_ref());
    match (&old_status.machine_name, after) {
        (Some(b), Some(a)) if a != b => v.violation(
            RuleId::V9,
            PATH,
            POINTER,
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
            POINTER,
            String::new(),
            format!("cannot be cleared (was {}): the machine name never changes", render(b)),
        ),
        (None, Some(a)) => {
            if ctx.role() != Role::Controller {
                v.violation(
                    RuleId::V9,
                    PATH,
                    POINTER,
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
                    POINTER,
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
                "/spec/unschedulable",
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
            "/status/nodeUID",
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
            "/metadata/name",
            render(name),
            format!(
                "{} is not this runtime agent's node: a runtime agent may only write the SmolVMNode of its own node; {} runs on {}",
                render(name),
                render(&ctx.identity.username),
                render(own)
            ),
        ),
        None => v.violation(
            RuleId::V10,
            "metadata.name",
            "/metadata/name",
            render(name),
            format!(
                "{} cannot be written by the runtime identity {}: it carries no node claim ({EXTRA_NODE_NAME}); use a pod-bound ServiceAccount token",
                render(name),
                render(&ctx.identity.username)
            ),
        ),
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
            "/status/endpoint/address",
            render(&endpoint.address),
            format!("{} {reason}", render(&endpoint.address)),
        );
    }
    if !(1..=65535).contains(&endpoint.port) {
        v.violation(
            RuleId::V10,
            "status.endpoint.port",
            "/status/endpoint/port",
            endpoint.port.to_string(),
            format!("{} is not a port number (1-65535)", endpoint.port),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::pointer_of;

    #[test]
    fn field_paths_become_json_pointers() {
        for (path, pointer) in [
            ("spec.env", "/spec/env"),
            ("spec.env[2].name", "/spec/env/2/name"),
            ("spec.network.allowedHosts[0]", "/spec/network/allowedHosts/0"),
            ("spec.command[12]", "/spec/command/12"),
        ] {
            assert_eq!(pointer_of(path), pointer, "{path}");
        }
    }
}
