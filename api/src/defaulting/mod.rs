//! Defaulting (the mutating half of admission): rules M1 to M6.
//!
//! Works on the raw JSON of the object, so that it never fails on input the typed structs would
//! reject (validation reports those). The patch is minimal: it only adds what is missing, and a
//! second pass over the patched object yields an empty patch.
//!
//! M1 and M2 decide as data: from what they read of the object ([`Shape`], from its Value or,
//! in the webhook, from its text) to a list of [`Addition`]s, which become the patch
//! ([`default_smolvm`]), are written out as its JSON, or are applied to the decoded object for
//! validation, without building a JSON value.
//!
//! M3 (the class) comes before M1 (the built-in defaults): [`default_smolvm_with_class`] fills
//! from the class first, then computes M1 and M2 on the object as the class left it.
//!
//! M4 (the pool) comes first of all: [`default_pooled_smolvm`] fills a SmolVM that names a pool
//! from the pool's template, then applies M3, M1 and M2 to the object as the template left it.
//! M5 (the branch) does the same from a branch's source ([`default_branch_smolvm`]), and labels
//! a branch source ([`default_branch_source`]).

mod branch;
mod shape;

use json_patch::{AddOperation, Patch, PatchOperation, jsonptr::PointerBuf};
use serde_json::{Value, json};

pub use branch::{branch_patch, default_branch_smolvm, default_branch_source};
pub use shape::{Finalizers, Members, Shape, SpecShape, SpecText};

use crate::{
    admission::Operation,
    class::{ClassCatalog, SmolVMClass, class_for},
    constants::{
        ANNOTATION_CLASS, ANNOTATION_CLASS_GENERATION, ANNOTATION_POOL_GENERATION, ANNOTATION_POOL_UID, FINALIZER,
        LABEL_CLASS, LABEL_POOL,
    },
    pool::SmolVMPool,
    types::{
        DEFAULT_CPUS, DEFAULT_EXPOSE_SERVICE, DEFAULT_MEMORY_MIB, DEFAULT_NETWORK_ENABLED, DEFAULT_OVERLAY_GIB,
        DEFAULT_RESTART_POLICY, DEFAULT_RUNNING, DEFAULT_STORAGE_GIB, DEFAULT_SUSPENDED,
        DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS, Network, Resources, SmolVM, Storage,
    },
};

/// Computes the defaulting patch for a SmolVM (rules M1 and M2).
///
/// - M1 (CREATE and UPDATE): `running`, `suspended`, `resources`, `storage`, `network.enabled`, each port's
///   `protocol`, `restartPolicy` and `terminationGracePeriodSeconds` get their defaults when
///   absent or null. Skipped for an object being deleted, whose
///   spec may no longer change (rule V8).
/// - M2 (CREATE): the finalizer `vm.smolvm.dev/node-cleanup` is added.
pub fn default_smolvm(op: Operation, object: &Value) -> Patch {
    Patch(
        additions(op, &Shape::of_value(object))
            .into_iter()
            .map(Addition::to_patch)
            .collect(),
    )
}

/// The additions of [`default_smolvm`], decided from what it reads of the SmolVM ([`Shape`]):
/// the same, in the same order, for the shape of the same object however it was read.
pub fn additions(op: Operation, shape: &Shape) -> Vec<Addition> {
    let mut out = Vec::new();
    if matches!(op, Operation::Create | Operation::Update)
        && !shape.deleting
        && let Some(spec) = &shape.spec
    {
        let scalars = [
            (spec.running, Addition::Running),
            (spec.suspended, Addition::Suspended),
            (spec.restart_policy, Addition::RestartPolicy),
            (
                spec.termination_grace_period_seconds,
                Addition::TerminationGracePeriodSeconds,
            ),
        ];
        out.extend(
            scalars
                .into_iter()
                .filter(|(set, _)| !set)
                .map(|(_, addition)| addition),
        );
        for (group, members) in [
            (Group::Resources, spec.resources),
            (Group::Storage, spec.storage),
            (Group::Network, spec.network),
        ] {
            match members {
                Members::Unset => out.push(Addition::Group(group)),
                Members::Object(first, second) => {
                    out.extend((!first).then_some(Addition::Member(group, 0)));
                    out.extend((!second).then_some(Addition::Member(group, 1)));
                }
                Members::Other => {}
            }
        }
        out.extend(spec.ports_without_protocol.iter().map(|&i| Addition::PortProtocol(i)));
        // M6: a VM that sleeps when idle wakes on traffic unless it says otherwise.
        if spec.lifecycle == Members::Object(true, false) {
            out.push(Addition::WakeOnTraffic);
        }
    }
    if op == Operation::Create {
        match shape.finalizers {
            Finalizers::Unset if shape.metadata => out.push(Addition::Finalizers),
            Finalizers::List { ours: false } => out.push(Addition::Finalizer),
            _ => {}
        }
    }
    out
}

/// An object of the spec that M1 defaults member by member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// `spec.resources` (`cpus`, `memoryMiB`).
    Resources,
    /// `spec.storage` (`storageGiB`, `overlayGiB`).
    Storage,
    /// `spec.network` (`enabled`, `exposeService`).
    Network,
}

impl Group {
    fn field(self) -> &'static str {
        match self {
            Group::Resources => "resources",
            Group::Storage => "storage",
            Group::Network => "network",
        }
    }

    fn members(self) -> [&'static str; 2] {
        shape::MEMBERS[self as usize]
    }

    /// The defaults of its two members.
    fn defaults(self) -> [Value; 2] {
        match self {
            Group::Resources => [json!(DEFAULT_CPUS), json!(DEFAULT_MEMORY_MIB)],
            Group::Storage => [json!(DEFAULT_STORAGE_GIB), json!(DEFAULT_OVERLAY_GIB)],
            Group::Network => [json!(DEFAULT_NETWORK_ENABLED), json!(DEFAULT_EXPOSE_SERVICE)],
        }
    }
}

/// One addition of rules M1 and M2: a JSON patch `add` known by what it adds, so that it can be
/// written out ([`Addition::write_json`]) and applied to a decoded SmolVM ([`Addition::apply`])
/// without a JSON value being built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addition {
    /// `spec.running`.
    Running,
    /// `spec.suspended`.
    Suspended,
    /// `spec.restartPolicy`.
    RestartPolicy,
    /// `spec.terminationGracePeriodSeconds`.
    TerminationGracePeriodSeconds,
    /// A whole object of the spec.
    Group(Group),
    /// The first (0) or second (1) member of an object of the spec.
    Member(Group, usize),
    /// `spec.network.ports[i].protocol`.
    PortProtocol(usize),
    /// `spec.lifecycle.wakeOnTraffic`, true (M6).
    WakeOnTraffic,
    /// `metadata.finalizers`, holding [`FINALIZER`].
    Finalizers,
    /// [`FINALIZER`] appended to `metadata.finalizers`.
    Finalizer,
}

impl Addition {
    /// The value added.
    pub fn value(self) -> Value {
        match self {
            Addition::Running => json!(DEFAULT_RUNNING),
            Addition::Suspended => json!(DEFAULT_SUSPENDED),
            Addition::RestartPolicy => json!(DEFAULT_RESTART_POLICY.as_str()),
            Addition::TerminationGracePeriodSeconds => json!(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS),
            Addition::Group(group) => {
                let [first, second] = group.members();
                let [a, b] = group.defaults();
                let map: serde_json::Map<String, Value> =
                    [(first.to_string(), a), (second.to_string(), b)].into_iter().collect();
                Value::Object(map)
            }
            Addition::Member(group, i) => {
                let [a, b] = group.defaults();
                if i == 0 { a } else { b }
            }
            Addition::PortProtocol(_) => json!("TCP"),
            Addition::WakeOnTraffic => json!(true),
            Addition::Finalizers => json!([FINALIZER]),
            Addition::Finalizer => json!(FINALIZER),
        }
    }

    /// Where it is added (a JSON pointer).
    pub fn path(self) -> String {
        let mut path = Vec::new();
        self.write_path(&mut path);
        String::from_utf8(path).unwrap_or_default()
    }

    /// Writes [`Addition::path`] to `out`.
    fn write_path(self, out: &mut Vec<u8>) {
        use std::io::Write;
        // Writing to a Vec cannot fail.
        let _ = match self {
            Addition::Running => out.write_all(b"/spec/running"),
            Addition::Suspended => out.write_all(b"/spec/suspended"),
            Addition::RestartPolicy => out.write_all(b"/spec/restartPolicy"),
            Addition::TerminationGracePeriodSeconds => out.write_all(b"/spec/terminationGracePeriodSeconds"),
            Addition::Group(group) => write!(out, "/spec/{}", group.field()),
            Addition::Member(group, i) => write!(out, "/spec/{}/{}", group.field(), group.members()[i.min(1)]),
            Addition::PortProtocol(i) => write!(out, "/spec/network/ports/{i}/protocol"),
            Addition::WakeOnTraffic => out.write_all(b"/spec/lifecycle/wakeOnTraffic"),
            Addition::Finalizers => out.write_all(b"/metadata/finalizers"),
            Addition::Finalizer => out.write_all(b"/metadata/finalizers/-"),
        };
    }

    /// The `add` operation.
    pub fn to_patch(self) -> PatchOperation {
        let path = self.path();
        PatchOperation::Add(AddOperation {
            path: PointerBuf::parse(&path).unwrap_or_default(),
            value: self.value(),
        })
    }

    /// Writes the `add` operation's JSON, as serde_json writes [`Addition::to_patch`]'s.
    pub fn write_json(self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"op":"add","path":""#);
        self.write_path(out);
        out.extend_from_slice(br#"","value":"#);
        out.extend_from_slice(self.value_json().as_bytes());
        out.push(b'}');
    }

    /// The value's JSON text: the same for every addition of a kind, so written once.
    fn value_json(self) -> &'static str {
        use std::sync::OnceLock;
        /// Every kind but [`Addition::PortProtocol`], in the order of [`Addition::kind`].
        const KINDS: [Addition; 14] = [
            Addition::Running,
            Addition::Suspended,
            Addition::RestartPolicy,
            Addition::TerminationGracePeriodSeconds,
            Addition::Group(Group::Resources),
            Addition::Group(Group::Storage),
            Addition::Group(Group::Network),
            Addition::Member(Group::Resources, 0),
            Addition::Member(Group::Resources, 1),
            Addition::Member(Group::Storage, 0),
            Addition::Member(Group::Storage, 1),
            Addition::Member(Group::Network, 0),
            Addition::Member(Group::Network, 1),
            Addition::Finalizers,
        ];
        static TEXTS: OnceLock<Vec<String>> = OnceLock::new();
        let texts = TEXTS.get_or_init(|| KINDS.iter().map(|k| k.value().to_string()).collect());
        let kind = match self {
            Addition::Running => 0,
            Addition::Suspended => 1,
            Addition::RestartPolicy => 2,
            Addition::TerminationGracePeriodSeconds => 3,
            Addition::Group(group) => 4 + group as usize,
            Addition::Member(group, i) => 7 + 2 * group as usize + i.min(1),
            Addition::Finalizers => 13,
            Addition::PortProtocol(_) => return "\"TCP\"",
            Addition::WakeOnTraffic => return "true",
            Addition::Finalizer => return concat!("\"", "vm.smolvm.dev/node-cleanup", "\""),
        };
        texts.get(kind).map(String::as_str).unwrap_or("null")
    }

    /// Applies it to `vm`, decoded: `vm` becomes what decoding the object with the addition gives.
    /// `false` where the decoded object lacks what the addition goes into (it was computed for
    /// another object).
    pub fn apply(self, vm: &mut SmolVM) -> bool {
        let spec = &mut vm.spec;
        match self {
            Addition::Running => spec.running = Some(DEFAULT_RUNNING),
            Addition::Suspended => spec.suspended = Some(DEFAULT_SUSPENDED),
            Addition::RestartPolicy => spec.restart_policy = Some(DEFAULT_RESTART_POLICY),
            Addition::TerminationGracePeriodSeconds => {
                spec.termination_grace_period_seconds = Some(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
            }
            Addition::Group(Group::Resources) => {
                spec.resources = Some(Resources {
                    cpus: Some(DEFAULT_CPUS),
                    memory_mib: Some(DEFAULT_MEMORY_MIB),
                })
            }
            Addition::Group(Group::Storage) => {
                spec.storage = Some(Storage {
                    storage_gib: Some(DEFAULT_STORAGE_GIB),
                    overlay_gib: Some(DEFAULT_OVERLAY_GIB),
                })
            }
            Addition::Group(Group::Network) => {
                spec.network = Some(Network {
                    enabled: Some(DEFAULT_NETWORK_ENABLED),
                    expose_service: Some(DEFAULT_EXPOSE_SERVICE),
                    ..Network::default()
                })
            }
            Addition::Member(group, i) => {
                let set = match (group, i, spec) {
                    (Group::Resources, 0, s) => s.resources.as_mut().map(|r| r.cpus = Some(DEFAULT_CPUS)),
                    (Group::Resources, _, s) => s.resources.as_mut().map(|r| r.memory_mib = Some(DEFAULT_MEMORY_MIB)),
                    (Group::Storage, 0, s) => s.storage.as_mut().map(|r| r.storage_gib = Some(DEFAULT_STORAGE_GIB)),
                    (Group::Storage, _, s) => s.storage.as_mut().map(|r| r.overlay_gib = Some(DEFAULT_OVERLAY_GIB)),
                    (Group::Network, 0, s) => s.network.as_mut().map(|n| n.enabled = Some(DEFAULT_NETWORK_ENABLED)),
                    (Group::Network, _, s) => s
                        .network
                        .as_mut()
                        .map(|n| n.expose_service = Some(DEFAULT_EXPOSE_SERVICE)),
                };
                return set.is_some();
            }
            Addition::PortProtocol(i) => {
                let port = spec
                    .network
                    .as_mut()
                    .and_then(|n| n.ports.as_mut())
                    .and_then(|p| p.get_mut(i));
                return port.map(|p| p.protocol = crate::types::Protocol::Tcp).is_some();
            }
            Addition::WakeOnTraffic => {
                return spec
                    .lifecycle
                    .as_mut()
                    .map(|l| l.wake_on_traffic = Some(true))
                    .is_some();
            }
            Addition::Finalizers => vm.metadata.finalizers = Some(vec![FINALIZER.to_string()]),
            Addition::Finalizer => {
                return vm
                    .metadata
                    .finalizers
                    .as_mut()
                    .map(|f| f.push(FINALIZER.to_string()))
                    .is_some();
            }
        }
        true
    }
}

/// Computes the defaulting patch for a SmolVM with its class (rules M3, M1 and M2).
///
/// - M3 (CREATE, when `class` is given): every field the SmolVM leaves unset that the class sets
///   is taken from the class: `resources` and `storage` member by member, `network.enabled`,
///   `network.allowedCIDRs` and `network.allowedHosts` (the lists only where the network ends up
///   enabled), `nodeSelector` as a whole, `restartPolicy`, `terminationGracePeriodSeconds`,
///   `lifecycle` member by member. A SmolVM that named no class gets `spec.className` (the default class's name). The class's
///   name and generation are recorded in the annotations `vm.smolvm.dev/class` and
///   `vm.smolvm.dev/class-generation`, and its name in the label `vm.smolvm.dev/class`.
/// - then M1 and M2 as [`default_smolvm`] computes them on the object M3 left.
///
/// Without a class, or on any other operation, this is [`default_smolvm`].
pub fn default_smolvm_with_class(op: Operation, object: &Value, class: Option<&SmolVMClass>) -> Patch {
    let Some(class) = class.filter(|_| op == Operation::Create && !is_deleting(object)) else {
        return default_smolvm(op, object);
    };
    let class_ops = class_patch(object, class);
    if class_ops.is_empty() {
        return default_smolvm(op, object);
    }
    let mut patched = object.clone();
    if json_patch::patch(&mut patched, &class_ops).is_err() {
        // The class's additions only go where the object has room (objects it checked for); an
        // object of some other shape is left to validation, with the built-in defaults alone.
        return default_smolvm(op, object);
    }
    let mut ops = class_ops;
    ops.extend(default_smolvm(op, &patched).0);
    Patch(ops)
}

/// The members of a field a class may set, each `None` where it does not.
type ClassMembers = Vec<(&'static str, Option<Value>)>;

/// The members of `resources`, `storage` and `lifecycle` a class sets, by field, as JSON (M3
/// fills them member by member).
fn class_members(c: &crate::class::SmolVMClassSpec) -> [(&'static str, ClassMembers); 3] {
    let (resources, storage, lifecycle) = (c.resources.as_ref(), c.storage.as_ref(), c.lifecycle.as_ref());
    let value = |v: Option<i64>| v.map(|v| json!(v));
    [
        (
            "resources",
            vec![
                ("cpus", resources.and_then(|r| r.cpus).map(|v| json!(v))),
                ("memoryMiB", value(resources.and_then(|r| r.memory_mib))),
            ],
        ),
        (
            "storage",
            vec![
                ("storageGiB", value(storage.and_then(|s| s.storage_gib))),
                ("overlayGiB", value(storage.and_then(|s| s.overlay_gib))),
            ],
        ),
        (
            "lifecycle",
            vec![
                (
                    "suspendAfterIdle",
                    lifecycle.and_then(|l| l.suspend_after_idle.as_ref()).map(|v| json!(v)),
                ),
                (
                    "wakeOnTraffic",
                    lifecycle.and_then(|l| l.wake_on_traffic).map(|v| json!(v)),
                ),
                (
                    "ttlSecondsAfterFinished",
                    value(lifecycle.and_then(|l| l.ttl_seconds_after_finished)),
                ),
                (
                    "activeDeadlineSeconds",
                    value(lifecycle.and_then(|l| l.active_deadline_seconds)),
                ),
            ],
        ),
    ]
}

/// Rule M3's additions for `object` from `class` (empty when the object has everything).
pub fn class_patch(object: &Value, class: &SmolVMClass) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    let Some(spec) = object.get("spec").and_then(Value::as_object) else {
        return ops;
    };
    let c = &class.spec;
    if is_absent(spec.get("className")) {
        ops.push(add(&["spec", "className"], json!(class.name())));
    }
    // The members the class sets, added where the SmolVM lacks them.
    let fill = |field: &str, pairs: &[(&str, Option<Value>)], ops: &mut Vec<PatchOperation>| {
        let members: Vec<(&str, Value)> = pairs.iter().filter_map(|(k, v)| v.clone().map(|v| (*k, v))).collect();
        if !members.is_empty() {
            default_object(spec, field, &members, ops);
        }
    };
    for (field, pairs) in class_members(c) {
        fill(field, &pairs, &mut ops);
    }
    if let Some(network) = &c.network {
        let own_enabled = spec
            .get("network")
            .and_then(|n| n.get("enabled"))
            .and_then(Value::as_bool);
        // The egress lists only where the network ends up enabled.
        let enabled = own_enabled.or(network.enabled).unwrap_or(false);
        let list = |l: &Option<Vec<String>>| l.as_ref().filter(|_| enabled).map(|v| json!(v));
        let pairs = [
            ("enabled", network.enabled.map(|v| json!(v))),
            ("allowedCIDRs", list(&network.allowed_cidrs)),
            ("allowedHosts", list(&network.allowed_hosts)),
        ];
        fill("network", &pairs, &mut ops);
    }
    if is_absent(spec.get("nodeSelector"))
        && let Some(selector) = &c.node_selector
    {
        ops.push(add(&["spec", "nodeSelector"], json!(selector)));
    }
    if is_absent(spec.get("restartPolicy"))
        && let Some(policy) = c.restart_policy
    {
        ops.push(add(&["spec", "restartPolicy"], json!(policy.as_str())));
    }
    if is_absent(spec.get("terminationGracePeriodSeconds"))
        && let Some(seconds) = c.termination_grace_period_seconds
    {
        ops.push(add(&["spec", "terminationGracePeriodSeconds"], json!(seconds)));
    }
    let generation = class.metadata.generation.unwrap_or(0).to_string();
    record(
        object,
        "annotations",
        &[
            (ANNOTATION_CLASS, class.name()),
            (ANNOTATION_CLASS_GENERATION, &generation),
        ],
        &mut ops,
    );
    record(object, "labels", &[(LABEL_CLASS, class.name())], &mut ops);
    ops
}

/// Computes the defaulting patch for a SmolVM at CREATE that names `pool` in `spec.poolRef`
/// (rule M4, then M3, M1 and M2):
///
/// - M4: every field of the pool's template the SmolVM lacks is added whole (a pooled SmolVM
///   sets none of them: rule V14 refuses it), and so is the pool's `nodeSelector`. The
///   template's `env` comes first and the SmolVM's own entries after it, one of the same name
///   replacing the template's. The pool's name is recorded in the label `vm.smolvm.dev/pool`,
///   its generation in the annotation `vm.smolvm.dev/pool-generation` and its UID in
///   `vm.smolvm.dev/pool-uid` (a pool made again under the same name never serves it).
/// - then M3 from the class the filled object names (the template's), or the default class, and
///   M1 and M2, as [`default_smolvm_with_class`] computes them on the object M4 left.
///
/// On any other operation this is [`default_smolvm`].
pub fn default_pooled_smolvm(op: Operation, object: &Value, pool: &SmolVMPool, classes: &dyn ClassCatalog) -> Patch {
    if op != Operation::Create || is_deleting(object) {
        return default_smolvm(op, object);
    }
    let mut ops = pool_patch(object, pool);
    let mut filled = object.clone();
    if json_patch::patch(&mut filled, &ops).is_err() {
        // The template's fields only go where the object has room; an object of another shape
        // is left to validation, with the other rules' defaults alone.
        ops.clear();
        filled = object.clone();
    }
    let class_name = filled
        .get("spec")
        .and_then(|s| s.get("className"))
        .and_then(Value::as_str);
    let class = class_for(class_name, classes).ok().flatten();
    ops.extend(default_smolvm_with_class(op, &filled, class.as_ref()).0);
    Patch(ops)
}

/// Rule M4's additions for `object` from `pool`'s template (empty for an object without a spec).
pub fn pool_patch(object: &Value, pool: &SmolVMPool) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    let Some(spec) = object.get("spec").and_then(Value::as_object) else {
        return ops;
    };
    let template = match serde_json::to_value(&pool.spec.template) {
        Ok(Value::Object(template)) => template,
        _ => return ops,
    };
    for (field, value) in template {
        if field == "env" {
            continue;
        }
        if is_absent(spec.get(&field)) {
            ops.push(add(&["spec", &field], value));
        }
    }
    if is_absent(spec.get("nodeSelector"))
        && let Some(selector) = &pool.spec.node_selector
    {
        ops.push(add(&["spec", "nodeSelector"], json!(selector)));
    }
    if let Some(env) = merged_env(spec.get("env"), pool) {
        ops.push(add(&["spec", "env"], env));
    }
    let generation = pool.metadata.generation.unwrap_or(0).to_string();
    let mut annotations = vec![(ANNOTATION_POOL_GENERATION, generation.as_str())];
    if let Some(uid) = pool.metadata.uid.as_deref() {
        annotations.push((ANNOTATION_POOL_UID, uid));
    }
    record(object, "annotations", &annotations, &mut ops);
    record(object, "labels", &[(LABEL_POOL, pool.name())], &mut ops);
    ops
}

/// The template's env entries, then the SmolVM's own (`own`), one of the same name replacing
/// the template's; `None` where the template has none (the SmolVM's own list stays as it is).
fn merged_env(own: Option<&Value>, pool: &SmolVMPool) -> Option<Value> {
    let template = pool.spec.template.env.as_ref().filter(|e| !e.is_empty())?;
    let own: &[Value] = match own {
        Some(Value::Array(own)) => own,
        None | Some(Value::Null) => &[],
        // Not a list: left to validation, which names it.
        Some(_) => return None,
    };
    let own_names: Vec<&str> = own
        .iter()
        .filter_map(|e| e.get("name").and_then(Value::as_str))
        .collect();
    let mut merged: Vec<Value> = template
        .iter()
        .filter(|e| !own_names.contains(&e.name.as_str()))
        .filter_map(|e| serde_json::to_value(e).ok())
        .collect();
    merged.extend(own.iter().cloned());
    Some(Value::Array(merged))
}

/// Sets `metadata.<map>.<key>` to each value (a value a user wrote there is corrected: the
/// record tells where the defaults came from).
fn record(object: &Value, map: &str, entries: &[(&str, &str)], ops: &mut Vec<PatchOperation>) {
    let Some(metadata) = object.get("metadata").and_then(Value::as_object) else {
        return;
    };
    match metadata.get(map) {
        None | Some(Value::Null) => {
            let value: serde_json::Map<String, Value> =
                entries.iter().map(|(k, v)| ((*k).to_string(), json!(v))).collect();
            ops.push(add(&["metadata", map], Value::Object(value)));
        }
        Some(Value::Object(existing)) => {
            for (key, value) in entries {
                if existing.get(*key).and_then(Value::as_str) != Some(value) {
                    ops.push(add(&["metadata", map, key], json!(value)));
                }
            }
        }
        Some(_) => {}
    }
}

/// Defaults `spec.<field>` as a whole when absent, or each missing member when it is an object.
fn default_object(
    spec: &serde_json::Map<String, Value>,
    field: &str,
    members: &[(&str, Value)],
    ops: &mut Vec<PatchOperation>,
) {
    match spec.get(field) {
        None | Some(Value::Null) => {
            let value: serde_json::Map<String, Value> =
                members.iter().map(|(k, v)| ((*k).to_string(), v.clone())).collect();
            ops.push(add(&["spec", field], Value::Object(value)));
        }
        Some(Value::Object(existing)) => {
            for (member, value) in members {
                if is_absent(existing.get(*member)) {
                    ops.push(add(&["spec", field, member], value.clone()));
                }
            }
        }
        Some(_) => {}
    }
}

/// Whether the object carries a `metadata.deletionTimestamp` (read member by member: a JSON
/// pointer would be parsed again on every call).
fn is_deleting(object: &Value) -> bool {
    metadata_member(object, "deletionTimestamp").is_some_and(|v| !v.is_null())
}

/// `metadata.<key>` of the object, as `Value::pointer` finds it.
fn metadata_member<'a>(object: &'a Value, key: &str) -> Option<&'a Value> {
    object.get("metadata").and_then(|m| m.get(key))
}

fn is_absent(value: Option<&Value>) -> bool {
    matches!(value, None | Some(Value::Null))
}

/// An `add` of `value` at the path of `tokens`. The path is written out directly: every token
/// here is a field name, a list index, `-` or a label key, and only a key holding `~` or `/`
/// (a prefixed label key) needs the escaping that `PointerBuf::from_tokens` applies to all.
fn add(tokens: &[&str], value: Value) -> PatchOperation {
    let mut path = String::with_capacity(tokens.iter().map(|t| t.len() + 1).sum());
    for token in tokens {
        path.push('/');
        if token.contains(['~', '/']) {
            path.push_str(&token.replace('~', "~0").replace('/', "~1"));
        } else {
            path.push_str(token);
        }
    }
    PatchOperation::Add(AddOperation {
        path: PointerBuf::parse(path).unwrap_or_else(|_| PointerBuf::from_tokens(tokens.iter().copied())),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of addition: written out as serde_json writes its patch operation, and applied
    /// to a decoded SmolVM as decoding the patched JSON gives.
    #[test]
    fn additions_write_and_apply_as_their_patch() {
        let groups = [Group::Resources, Group::Storage, Group::Network];
        let mut all = vec![
            Addition::Running,
            Addition::Suspended,
            Addition::RestartPolicy,
            Addition::TerminationGracePeriodSeconds,
            Addition::PortProtocol(0),
            Addition::PortProtocol(1),
            Addition::Finalizers,
            Addition::Finalizer,
            Addition::WakeOnTraffic,
        ];
        for group in groups {
            all.extend([
                Addition::Group(group),
                Addition::Member(group, 0),
                Addition::Member(group, 1),
            ]);
        }
        // An object that every addition applies to: each group an empty object, two ports, an
        // empty finalizer list (the whole-field additions replace them).
        let object = json!({"metadata": {"name": "a", "finalizers": []},
            "spec": {"image": "alpine", "resources": {}, "storage": {}, "lifecycle": {"suspendAfterIdle": "5m"}, "network": {"ports": [
                {"hostPort": 8080, "guestPort": 80}, {"hostPort": 8081, "guestPort": 81}]}}});
        for addition in all {
            let mut written = Vec::new();
            addition.write_json(&mut written);
            let reference = serde_json::to_vec(&addition.to_patch()).unwrap_or_default();
            assert_eq!(
                String::from_utf8_lossy(&written),
                String::from_utf8_lossy(&reference),
                "{addition:?}"
            );

            let patched = apply(&object, &Patch(vec![addition.to_patch()]));
            let want: SmolVM = serde_json::from_value(patched).unwrap_or_else(|e| panic!("{addition:?}: {e}"));
            let mut got: SmolVM = serde_json::from_value(object.clone()).unwrap_or_else(|e| panic!("{e}"));
            assert!(addition.apply(&mut got), "{addition:?} applies");
            assert_eq!((got.metadata, got.spec), (want.metadata, want.spec), "{addition:?}");
        }
        // Where the decoded object lacks what an addition goes into, it says so.
        let mut bare: SmolVM =
            serde_json::from_value(json!({"metadata": {}, "spec": {"image": "a"}})).unwrap_or_else(|e| panic!("{e}"));
        for addition in [
            Addition::Member(Group::Storage, 1),
            Addition::PortProtocol(0),
            Addition::Finalizer,
        ] {
            assert!(!addition.apply(&mut bare), "{addition:?}");
        }
    }

    fn apply(object: &Value, patch: &Patch) -> Value {
        let mut doc = object.clone();
        json_patch::patch(&mut doc, patch).unwrap();
        doc
    }

    fn paths(patch: &Patch) -> Vec<String> {
        patch
            .0
            .iter()
            .map(|op| match op {
                PatchOperation::Add(a) => a.path.to_string(),
                other => panic!("defaulting only adds, got {other:?}"),
            })
            .collect()
    }

    fn vm(spec: Value) -> Value {
        json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
               "metadata": {"name": "a", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn m1_m2_defaults_on_create_table() {
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            (
                "m1_m2_empty_spec_gets_every_default",
                vm(json!({"image": "alpine"})),
                vec![
                    "/spec/running",
                    "/spec/suspended",
                    "/spec/restartPolicy",
                    "/spec/terminationGracePeriodSeconds",
                    "/spec/resources",
                    "/spec/storage",
                    "/spec/network",
                    "/metadata/finalizers",
                ],
            ),
            (
                "m1_partial_resources_only_missing_members",
                vm(json!({"image": "alpine", "running": false, "resources": {"cpus": 4},
                          "storage": {"overlayGiB": 5}, "network": {"enabled": true}})),
                vec![
                    "/spec/suspended",
                    "/spec/restartPolicy",
                    "/spec/terminationGracePeriodSeconds",
                    "/spec/resources/memoryMiB",
                    "/spec/storage/storageGiB",
                    "/spec/network/exposeService",
                    "/metadata/finalizers",
                ],
            ),
            (
                "m1_null_fields_are_defaulted",
                vm(
                    json!({"image": "alpine", "running": null, "resources": null, "storage": {"storageGiB": null, "overlayGiB": 1},
                          "network": {"enabled": null}}),
                ),
                vec![
                    "/spec/running",
                    "/spec/suspended",
                    "/spec/restartPolicy",
                    "/spec/terminationGracePeriodSeconds",
                    "/spec/resources",
                    "/spec/storage/storageGiB",
                    "/spec/network/enabled",
                    "/spec/network/exposeService",
                    "/metadata/finalizers",
                ],
            ),
            (
                "m1_port_protocol_defaults_to_tcp",
                vm(
                    json!({"image": "alpine", "running": true, "resources": {"cpus": 1, "memoryMiB": 512},
                          "storage": {"storageGiB": 20, "overlayGiB": 10},
                          "restartPolicy": "Always", "terminationGracePeriodSeconds": 10,
                          "network": {"enabled": true, "exposeService": false, "ports": [{"hostPort": 8080, "guestPort": 80},
                                                                   {"hostPort": 8081, "guestPort": 81, "protocol": "UDP"}]}}),
                ),
                vec![
                    "/spec/suspended",
                    "/spec/network/ports/0/protocol",
                    "/metadata/finalizers",
                ],
            ),
            (
                "m2_finalizer_appended_to_existing_list",
                {
                    let mut o = vm(
                        json!({"image": "alpine", "running": true, "suspended": false, "resources": {"cpus": 1, "memoryMiB": 512},
                        "storage": {"storageGiB": 20, "overlayGiB": 10}, "network": {"enabled": false, "exposeService": false},
                        "restartPolicy": "Never", "terminationGracePeriodSeconds": 0}),
                    );
                    o["metadata"]["finalizers"] = json!(["example.com/other"]);
                    o
                },
                vec!["/metadata/finalizers/-"],
            ),
            (
                "m1_spec_of_wrong_type_is_left_to_validation",
                vm(json!("nonsense")),
                vec!["/metadata/finalizers"],
            ),
            (
                "m1_missing_spec_is_left_to_validation",
                json!({"metadata": {"name": "a"}}),
                vec!["/metadata/finalizers"],
            ),
            ("m2_no_metadata_no_patch", json!({"spec": 3}), vec![]),
        ];
        for (name, object, expected) in cases {
            let patch = default_smolvm(Operation::Create, &object);
            assert_eq!(paths(&patch), expected, "{name}");
            let patched = apply(&object, &patch);
            assert!(
                default_smolvm(Operation::Create, &patched).0.is_empty(),
                "{name}: second pass not empty"
            );
        }
    }

    #[test]
    fn m6_wake_on_traffic_defaults_with_suspend_after_idle() {
        let wake = "/spec/lifecycle/wakeOnTraffic".to_string();
        // (name, lifecycle, whether M6 adds wakeOnTraffic)
        let cases = [
            ("idle set: defaulted", json!({"suspendAfterIdle": "5m"}), true),
            (
                "idle set, wake false: kept",
                json!({"suspendAfterIdle": "5m", "wakeOnTraffic": false}),
                false,
            ),
            ("idle null: nothing", json!({"suspendAfterIdle": null}), false),
            ("lifetimes only: nothing", json!({"ttlSecondsAfterFinished": 5}), false),
            ("not an object: left to validation", json!("5m"), false),
        ];
        for (name, lifecycle, added) in cases {
            let object = vm(json!({"image": "alpine", "lifecycle": lifecycle}));
            for op in [Operation::Create, Operation::Update] {
                let patch = default_smolvm(op, &object);
                assert_eq!(paths(&patch).contains(&wake), added, "{name} {op:?}");
                let patched = apply(&object, &patch);
                assert!(
                    default_smolvm(op, &patched).0.is_empty(),
                    "{name}: second pass not empty"
                );
                if added {
                    assert_eq!(patched["spec"]["lifecycle"]["wakeOnTraffic"], json!(true), "{name}");
                }
            }
        }
    }

    #[test]
    fn m1_defaulted_values() {
        let object = vm(
            json!({"image": "alpine", "network": {"enabled": true, "ports": [{"hostPort": 8080, "guestPort": 80}]}}),
        );
        let patched = apply(&object, &default_smolvm(Operation::Create, &object));
        assert_eq!(patched["spec"]["running"], json!(true));
        assert_eq!(patched["spec"]["suspended"], json!(false));
        assert_eq!(patched["spec"]["resources"], json!({"cpus": 1, "memoryMiB": 512}));
        assert_eq!(patched["spec"]["storage"], json!({"storageGiB": 20, "overlayGiB": 10}));
        assert_eq!(patched["spec"]["network"]["enabled"], json!(true));
        assert_eq!(patched["spec"]["network"]["ports"][0]["protocol"], json!("TCP"));
        assert_eq!(patched["spec"]["restartPolicy"], json!("Always"));
        assert_eq!(patched["spec"]["terminationGracePeriodSeconds"], json!(10));
        assert_eq!(patched["metadata"]["finalizers"], json!([FINALIZER]));
    }

    #[test]
    fn m1_update_defaults_but_m2_does_not_add_finalizer() {
        let object = vm(json!({"image": "alpine"}));
        let p = paths(&default_smolvm(Operation::Update, &object));
        assert_eq!(
            p,
            vec![
                "/spec/running",
                "/spec/suspended",
                "/spec/restartPolicy",
                "/spec/terminationGracePeriodSeconds",
                "/spec/resources",
                "/spec/storage",
                "/spec/network"
            ]
        );
    }

    #[test]
    fn m1_deleting_object_gets_no_spec_defaults() {
        let mut object = vm(json!({"image": "alpine"}));
        object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(default_smolvm(Operation::Update, &object).0.is_empty());
    }

    #[test]
    fn m1_delete_and_connect_are_never_patched() {
        let object = vm(json!({"image": "alpine"}));
        assert!(default_smolvm(Operation::Delete, &object).0.is_empty());
        assert!(default_smolvm(Operation::Connect, &object).0.is_empty());
    }
}
