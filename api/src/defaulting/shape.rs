//! What rules M1 and M2 read of a SmolVM, as data: for each field they default, whether it is
//! set, and the shape of the objects around it.
//!
//! Defaulting decides from a [`Shape`] alone ([`super::additions`]). A shape is read from a
//! `serde_json::Value` ([`Shape::of_value`]) or, in the webhook, from the spec's JSON text
//! ([`SpecText`] reads it without building a Value). Both readings give the same shape for the
//! same JSON: a field is unset when it is missing or null, an object is an object, and anything
//! else is "other", which defaulting leaves to validation. A repeated key counts as its last
//! occurrence, as in a Value.

use std::{borrow::Cow, fmt, marker::PhantomData};

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::constants::FINALIZER;

/// What defaulting reads of a whole SmolVM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// The spec, when it is an object.
    pub spec: Option<SpecShape>,
    /// Whether `metadata` is an object.
    pub metadata: bool,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.finalizers`.
    pub finalizers: Finalizers,
}

/// `metadata.finalizers` as defaulting reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Finalizers {
    /// Missing or null.
    #[default]
    Unset,
    /// A list; whether it holds [`FINALIZER`].
    List {
        /// Whether [`FINALIZER`] is in the list.
        ours: bool,
    },
    /// Anything else (left to validation).
    Other,
}

/// What defaulting reads of a spec that is an object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecShape {
    /// `running` is set.
    pub running: bool,
    /// `suspended` is set.
    pub suspended: bool,
    /// `restartPolicy` is set.
    pub restart_policy: bool,
    /// `terminationGracePeriodSeconds` is set.
    pub termination_grace_period_seconds: bool,
    /// `resources`: whether `cpus` and `memoryMiB` are set.
    pub resources: Members,
    /// `storage`: whether `storageGiB` and `overlayGiB` are set.
    pub storage: Members,
    /// `network`: whether `enabled` and `exposeService` are set.
    pub network: Members,
    /// `lifecycle`: whether `suspendAfterIdle` and `wakeOnTraffic` are set (M6).
    pub lifecycle: Members,
    /// The indices of `network.ports` entries that are objects without a `protocol` (none
    /// unless `network` is an object and `ports` a list).
    pub ports_without_protocol: Vec<usize>,
    /// `className`, when it is a string.
    pub class_name: Option<String>,
    /// `poolRef` is set.
    pub pool_ref: bool,
    /// `branchOf` is set.
    pub branch_of: bool,
    /// `branchable` is set.
    pub branchable: bool,
}

/// A member of the spec that is an object with two defaulted members of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Members {
    /// Missing or null.
    #[default]
    Unset,
    /// An object; whether its first and its second defaulted member are set.
    Object(bool, bool),
    /// Anything else (left to validation).
    Other,
}

/// The two defaulted members of `resources`, `storage` and `network`, in that order; then the
/// two members of `lifecycle` M6 reads (it defaults the second where the first is set).
pub(super) const MEMBERS: [[&str; 2]; 4] = [
    ["cpus", "memoryMiB"],
    ["storageGiB", "overlayGiB"],
    ["enabled", "exposeService"],
    ["suspendAfterIdle", "wakeOnTraffic"],
];

/// Whether a value is set: present and not null.
fn is_set(value: Option<&Value>) -> bool {
    !matches!(value, None | Some(Value::Null))
}

impl Members {
    fn of_value(value: Option<&Value>, [first, second]: [&str; 2]) -> Members {
        match value {
            None | Some(Value::Null) => Members::Unset,
            Some(Value::Object(map)) => Members::Object(is_set(map.get(first)), is_set(map.get(second))),
            Some(_) => Members::Other,
        }
    }
}

impl Shape {
    /// The shape of a SmolVM given as a Value.
    pub fn of_value(object: &Value) -> Shape {
        let metadata = object.get("metadata");
        let member = |key: &str| metadata.and_then(|m| m.get(key));
        Shape {
            spec: object.get("spec").and_then(Value::as_object).map(SpecShape::of_map),
            metadata: metadata.is_some_and(Value::is_object),
            deleting: is_set(member("deletionTimestamp")),
            finalizers: Finalizers::of_value(member("finalizers")),
        }
    }
}

impl Finalizers {
    /// `metadata.finalizers` given as a Value (`None`: missing).
    pub fn of_value(value: Option<&Value>) -> Finalizers {
        match value {
            None | Some(Value::Null) => Finalizers::Unset,
            Some(Value::Array(list)) => Finalizers::List {
                ours: list.iter().any(|f| f.as_str() == Some(FINALIZER)),
            },
            Some(_) => Finalizers::Other,
        }
    }
}

impl SpecShape {
    fn of_map(spec: &serde_json::Map<String, Value>) -> SpecShape {
        let network = spec.get("network");
        let ports_without_protocol = match network.and_then(Value::as_object).and_then(|n| n.get("ports")) {
            Some(Value::Array(ports)) => ports
                .iter()
                .enumerate()
                .filter(|(_, port)| port.as_object().is_some_and(|p| !is_set(p.get("protocol"))))
                .map(|(i, _)| i)
                .collect(),
            _ => Vec::new(),
        };
        SpecShape {
            running: is_set(spec.get("running")),
            suspended: is_set(spec.get("suspended")),
            restart_policy: is_set(spec.get("restartPolicy")),
            termination_grace_period_seconds: is_set(spec.get("terminationGracePeriodSeconds")),
            resources: Members::of_value(spec.get("resources"), MEMBERS[0]),
            storage: Members::of_value(spec.get("storage"), MEMBERS[1]),
            network: Members::of_value(network, MEMBERS[2]),
            lifecycle: Members::of_value(spec.get("lifecycle"), MEMBERS[3]),
            ports_without_protocol,
            class_name: spec.get("className").and_then(Value::as_str).map(str::to_string),
            pool_ref: is_set(spec.get("poolRef")),
            branch_of: is_set(spec.get("branchOf")),
            branchable: is_set(spec.get("branchable")),
        }
    }
}

/// A spec's shape read from its JSON text: `None` when the spec is not an object.
///
/// `serde_json::from_str::<SpecText>(text)` reads the text once and builds nothing for the
/// members defaulting does not read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecText(pub Option<SpecShape>);

/// How a JSON value of each kind reads as `Self`: null as [`FromKind::unset`], an object member
/// by member, a list element by element, anything else as [`FromKind::other`].
trait FromKind: Sized {
    fn unset() -> Self;
    fn other() -> Self;
    fn object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Self::other())
    }
    fn list<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Self::other())
    }
}

/// Reads a value as `T` by its kind.
struct ByKind<T>(PhantomData<T>);

macro_rules! other {
    ($($name:ident: $t:ty),*) => {$(
        fn $name<E>(self, _: $t) -> Result<T, E> {
            Ok(T::other())
        }
    )*};
}

impl<'de, T: FromKind> Visitor<'de> for ByKind<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    other!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str);
    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::unset())
    }
    fn visit_none<E>(self) -> Result<T, E> {
        Ok(T::unset())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::list(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::object(map)
    }
}

/// Each reader below is read by its kind.
macro_rules! by_kind {
    ($($t:ty),*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(ByKind(PhantomData))
            }
        }
    )*};
}

by_kind!(
    Set,
    MembersText<0>,
    MembersText<1>,
    MembersText<3>,
    NetworkText,
    PortsText,
    PortText,
    SpecText
);

/// A key of an object, borrowed where the text has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(v.to_owned().into()))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// A value that is a string; anything else is skipped and read as `None`.
struct Text(Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<Text, E> {
                Ok(Text(Some(v.to_string())))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Text, E> {
                Ok(Text(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Text, E> {
                Ok(Text(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Text, E> {
                Ok(Text(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Text, E> {
                Ok(Text(None))
            }
            fn visit_unit<E>(self) -> Result<Text, E> {
                Ok(Text(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Text, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }
        }
        d.deserialize_any(TextVisitor)
    }
}

/// Whether a value is set (not null); its content is skipped.
struct Set(bool);

impl FromKind for Set {
    fn unset() -> Self {
        Set(false)
    }
    fn other() -> Self {
        Set(true)
    }
}

/// Reads the members of an object: whether each of `names` is set, and `other` called with any
/// other key to read its value.
fn members<'de, A: MapAccess<'de>>(
    mut map: A,
    names: [&str; 2],
    mut other: impl FnMut(&str, &mut A) -> Result<(), A::Error>,
) -> Result<(bool, bool), A::Error> {
    let (mut first, mut second) = (false, false);
    while let Some(Key(key)) = map.next_key::<Key<'_>>()? {
        if key == names[0] {
            first = map.next_value::<Set>()?.0;
        } else if key == names[1] {
            second = map.next_value::<Set>()?.0;
        } else {
            other(&key, &mut map)?;
        }
    }
    Ok((first, second))
}

/// Skips a member's value.
fn skip<'de, A: MapAccess<'de>>(_: &str, map: &mut A) -> Result<(), A::Error> {
    map.next_value::<IgnoredAny>().map(|_| ())
}

/// [`Members`] of `resources` (`N` = 0), `storage` (1) or `lifecycle` (3).
struct MembersText<const N: usize>(Members);

impl<const N: usize> FromKind for MembersText<N> {
    fn unset() -> Self {
        MembersText(Members::Unset)
    }
    fn other() -> Self {
        MembersText(Members::Other)
    }
    fn object<'de, A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let (first, second) = members(map, MEMBERS[N], skip)?;
        Ok(MembersText(Members::Object(first, second)))
    }
}

/// `network`: its members, and the ports without a protocol.
struct NetworkText(Members, Vec<usize>);

impl FromKind for NetworkText {
    fn unset() -> Self {
        NetworkText(Members::Unset, Vec::new())
    }
    fn other() -> Self {
        NetworkText(Members::Other, Vec::new())
    }
    fn object<'de, A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let mut ports = Vec::new();
        let (first, second) = members(map, MEMBERS[2], |key, map| {
            if key == "ports" {
                ports = map.next_value::<PortsText>()?.0;
                Ok(())
            } else {
                skip(key, map)
            }
        })?;
        Ok(NetworkText(Members::Object(first, second), ports))
    }
}

/// `network.ports`: the indices of entries that are objects without a protocol.
struct PortsText(Vec<usize>);

impl FromKind for PortsText {
    fn unset() -> Self {
        PortsText(Vec::new())
    }
    fn other() -> Self {
        PortsText(Vec::new())
    }
    fn list<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut without = Vec::new();
        let mut index = 0;
        while let Some(PortText(protocol)) = seq.next_element()? {
            if protocol == Some(false) {
                without.push(index);
            }
            index += 1;
        }
        Ok(PortsText(without))
    }
}

/// A port entry: `Some(whether protocol is set)` when it is an object.
struct PortText(Option<bool>);

impl FromKind for PortText {
    fn unset() -> Self {
        PortText(None)
    }
    fn other() -> Self {
        PortText(None)
    }
    fn object<'de, A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let (protocol, _) = members(map, ["protocol", ""], skip)?;
        Ok(PortText(Some(protocol)))
    }
}

impl FromKind for SpecText {
    fn unset() -> Self {
        SpecText(None)
    }
    fn other() -> Self {
        SpecText(None)
    }
    fn object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut spec = SpecShape::default();
        while let Some(Key(key)) = map.next_key::<Key<'_>>()? {
            match &*key {
                "resources" => spec.resources = map.next_value::<MembersText<0>>()?.0,
                "storage" => spec.storage = map.next_value::<MembersText<1>>()?.0,
                "lifecycle" => spec.lifecycle = map.next_value::<MembersText<3>>()?.0,
                "network" => {
                    let NetworkText(members, ports) = map.next_value()?;
                    spec.network = members;
                    spec.ports_without_protocol = ports;
                }
                "className" => spec.class_name = map.next_value::<Text>()?.0,
                other => {
                    let set = map.next_value::<Set>()?.0;
                    match other {
                        "running" => spec.running = set,
                        "suspended" => spec.suspended = set,
                        "restartPolicy" => spec.restart_policy = set,
                        "terminationGracePeriodSeconds" => spec.termination_grace_period_seconds = set,
                        "poolRef" => spec.pool_ref = set,
                        "branchOf" => spec.branch_of = set,
                        "branchable" => spec.branchable = set,
                        _ => {}
                    }
                }
            }
        }
        Ok(SpecText(Some(spec)))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Each spec's shape is the same read from its Value and from its text.
    #[test]
    fn text_and_value_read_the_same_shape() {
        let specs = [
            json!({}),
            json!(null),
            json!([1, 2]),
            json!("x"),
            json!({"running": null, "suspended": false, "restartPolicy": "Always", "terminationGracePeriodSeconds": 0}),
            json!({"resources": null, "storage": [1], "network": "x"}),
            json!({"resources": {"cpus": 1}, "storage": {"overlayGiB": null, "storageGiB": {"a": [1]}}}),
            json!({"network": {"enabled": true, "ports": [{"hostPort": 1}, {"protocol": "UDP"}, 3, null, {"protocol": null}]}}),
            json!({"network": {"exposeService": false, "ports": {"a": 1}}}),
            json!({"network": {"ports": null}, "image": "a\"b\u{e9}", "env": [{"name": "x", "value": "y"}]}),
            json!({"r\u{e9}sources": {"cpus": 1}, "resources": {"memoryMiB": 1}}),
            json!({"resources": {"": 1, "cpus": [], "memoryMiB": {}}}),
            json!({"className": "small", "poolRef": {"name": "p"}}),
            json!({"className": 3, "poolRef": null}),
            json!({"className": ["a"], "poolRef": false}),
            json!({"lifecycle": {"suspendAfterIdle": "5m"}}),
            json!({"lifecycle": {"suspendAfterIdle": null, "wakeOnTraffic": false}}),
            json!({"lifecycle": [1], "resources": {}}),
        ];
        for spec in specs {
            let from_value = Shape::of_value(&json!({ "spec": spec })).spec;
            let from_text = serde_json::from_str::<SpecText>(&spec.to_string()).map(|s| s.0);
            assert_eq!(from_text.ok(), Some(from_value), "{spec}");
        }
    }

    /// A repeated key counts as its last occurrence, as in a Value; an escaped key reads as
    /// its unescaped name.
    #[test]
    fn repeated_and_escaped_keys_read_as_in_a_value() {
        for text in [
            r#"{"running": true, "running": null, "resources": {"cpus": 1}, "resources": {}}"#,
            r#"{"runn\u0069ng": true, "network": {"ports": [{"proto\u0063ol": "TCP"}]}}"#,
        ] {
            let shape = serde_json::from_str::<SpecText>(text).map(|s| s.0);
            let value: Value = serde_json::from_str(text).unwrap_or_default();
            assert_eq!(
                shape.ok(),
                Some(Shape::of_value(&json!({ "spec": value })).spec),
                "{text}"
            );
        }
    }
}
