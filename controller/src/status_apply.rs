//! Status written by server-side apply, with the controller's field manager, as the Service and
//! EndpointSlice already are: the status a pass decided is the whole of what the controller
//! owns there, so a field it no longer sets leaves the stored status (a JSON merge patch of a
//! status whose empty fields are skipped never removed them).
//!
//! The previous release wrote status with merge patches and the binding with a replace, which
//! the API server records as an `Update` by the same manager on the `status` subresource. Fields
//! in such an entry stay co-owned, and an apply that omits them leaves them. So before its first
//! apply to an object that still has such an entry, the controller takes the fields over once,
//! as client-go's `csaupgrade` does: the entry's fields join the controller's `Apply` entry and
//! the `Update` entry goes, in one JSON patch of `metadata.managedFields` that holds only while
//! the object is the version read. The watch keeps just those entries of each cached object
//! ([`keep_legacy_status_entries`]), so no object costs a read to find out.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time};
use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};
use smolvm_api::constants::FIELD_MANAGER_CONTROLLER;

/// Whether `entry` is the previous release's status writes: an `Update` of the `status`
/// subresource by the controller's manager.
pub fn is_legacy_status_entry(entry: &ManagedFieldsEntry) -> bool {
    is_controller_status_entry(entry, "Update")
}

/// Whether `entry` is the controller's manager's `operation` on the `status` subresource.
fn is_controller_status_entry(entry: &ManagedFieldsEntry, operation: &str) -> bool {
    entry.manager.as_deref() == Some(FIELD_MANAGER_CONTROLLER)
        && entry.operation.as_deref() == Some(operation)
        && entry.subresource.as_deref() == Some("status")
}

/// Keeps of an object's managedFields only the previous release's status entries (none, for an
/// object the controller has applied to since): what the cache needs to know, and little memory.
pub fn keep_legacy_status_entries(meta: &mut ObjectMeta) {
    meta.managed_fields = meta
        .managed_fields
        .take()
        .map(|entries| entries.into_iter().filter(is_legacy_status_entry).collect::<Vec<_>>())
        .filter(|entries| !entries.is_empty());
}

/// Whether the cached object still has a status entry of the previous release.
pub fn has_legacy_status(meta: &ObjectMeta) -> bool {
    meta.managed_fields
        .as_ref()
        .is_some_and(|entries| entries.iter().any(is_legacy_status_entry))
}

/// `entries` with the previous release's status fields moved into the controller's `Apply`
/// entry of the status (made when there is none, stamped `now`), and its `Update` entries gone;
/// `None` when there is nothing to take over.
pub fn take_over(entries: &[ManagedFieldsEntry], api_version: &str, now: Time) -> Option<Vec<ManagedFieldsEntry>> {
    if !entries.iter().any(is_legacy_status_entry) {
        return None;
    }
    let is_apply = |e: &ManagedFieldsEntry| is_controller_status_entry(e, "Apply");
    let mut fields = Value::Object(Default::default());
    for entry in entries.iter().filter(|e| is_legacy_status_entry(e) || is_apply(e)) {
        if let Some(owned) = &entry.fields_v1 {
            union(&mut fields, &owned.0);
        }
    }
    let mut kept: Vec<ManagedFieldsEntry> = entries
        .iter()
        .filter(|e| !is_legacy_status_entry(e) && !is_apply(e))
        .cloned()
        .collect();
    kept.push(ManagedFieldsEntry {
        api_version: Some(api_version.to_string()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(fields)),
        manager: Some(FIELD_MANAGER_CONTROLLER.into()),
        operation: Some("Apply".into()),
        subresource: Some("status".into()),
        time: Some(now),
    });
    Some(kept)
}

/// Adds the field set `from` to `into` (FieldsV1 trees: objects of objects).
fn union(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                match into.get_mut(key) {
                    Some(existing) => union(existing, value),
                    None => {
                        into.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (into, from) => *into = from.clone(),
    }
}

/// What a take-over read and wrote: the version it read, and the version it wrote in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenOver {
    pub read: Option<String>,
    pub written: Option<String>,
}

/// Takes the previous release's status fields of `name` over (one read, one JSON patch that
/// holds only while the object is the version read); `None` when there was nothing to take
/// over.
pub async fn take_over_status<K>(api: &Api<K>, name: &str) -> Result<Option<TakenOver>, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let current = api.get(name).await?;
    let meta = current.meta();
    let entries = meta.managed_fields.clone().unwrap_or_default();
    let api_version = K::api_version(&()).to_string();
    let Some(entries) = take_over(&entries, &api_version, Time(k8s_openapi::jiff::Timestamp::now())) else {
        return Ok(None);
    };
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta.resource_version},
        {"op": "replace", "path": "/metadata/managedFields", "value": entries},
    ]))
    .map_err(kube::Error::SerdeError)?;
    let written = api
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await?;
    tracing::info!(
        name,
        "took over the status fields the previous release wrote (its Update entry now the controller's Apply entry)"
    );
    Ok(Some(TakenOver {
        read: meta.resource_version.clone(),
        written: written.meta().resource_version.clone(),
    }))
}

/// The body of a status apply: the object's identity, `status`, and, for a write that must meet
/// the version read (the binding), its resourceVersion.
pub fn apply_body<K: Resource<DynamicType = ()>>(
    name: &str,
    resource_version: Option<&str>,
    status: &impl Serialize,
) -> Value {
    let mut metadata = json!({ "name": name });
    if let Some(version) = resource_version {
        metadata["resourceVersion"] = json!(version);
    }
    json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": metadata,
        "status": status,
    })
}

/// The parameters of every status apply: the controller's field manager, forced (the status is
/// the controller's alone; another writer's field is taken over, as the Service's are).
pub fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER_CONTROLLER).force()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;

    fn entry(manager: &str, operation: &str, subresource: Option<&str>, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            api_version: Some("vm.smolvm.dev/v1alpha1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            subresource: subresource.map(str::to_string),
            time: None,
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn the_previous_release_status_fields_move_into_the_apply_entry() {
        let c = FIELD_MANAGER_CONTROLLER;
        let kubectl = entry(
            "kubectl-client-side-apply",
            "Update",
            None,
            json!({"f:spec": {"f:image": {}}}),
        );
        let finalizer = entry(c, "Update", None, json!({"f:metadata": {"f:finalizers": {}}}));
        let legacy = entry(
            c,
            "Update",
            Some("status"),
            json!({"f:status": {"f:ports": {}, "f:phase": {}}}),
        );
        let applied = entry(
            c,
            "Apply",
            Some("status"),
            json!({"f:status": {"f:phase": {}, "f:nodeName": {}}}),
        );
        let other_status = entry("someone", "Update", Some("status"), json!({"f:status": {"f:x": {}}}));
        let apply_of = |fields: Value| {
            let mut e = entry(c, "Apply", Some("status"), fields);
            e.time = Some(now());
            e
        };
        type Entries = Vec<ManagedFieldsEntry>;
        let table: Vec<(&str, Entries, Option<Entries>)> = vec![
            (
                "nothing of the previous release",
                vec![kubectl.clone(), applied.clone()],
                None,
            ),
            (
                "another manager's status update is not ours to take",
                vec![other_status.clone()],
                None,
            ),
            (
                "the main resource's update (finalizers) is not status",
                vec![finalizer.clone()],
                None,
            ),
            (
                "an update only: an apply entry with its fields",
                vec![kubectl.clone(), legacy.clone(), finalizer.clone()],
                Some(vec![
                    kubectl.clone(),
                    finalizer.clone(),
                    apply_of(json!({"f:status": {"f:ports": {}, "f:phase": {}}})),
                ]),
            ),
            (
                "an update and an apply: one apply entry with both",
                vec![legacy.clone(), applied.clone(), other_status.clone()],
                Some(vec![
                    other_status.clone(),
                    apply_of(json!({"f:status": {"f:ports": {}, "f:phase": {}, "f:nodeName": {}}})),
                ]),
            ),
        ];
        for (name, entries, want) in table {
            assert_eq!(take_over(&entries, "vm.smolvm.dev/v1alpha1", now()), want, "{name}");
        }
    }

    #[test]
    fn the_cache_keeps_only_the_previous_release_status_entries() {
        let c = FIELD_MANAGER_CONTROLLER;
        let legacy = entry(c, "Update", Some("status"), json!({"f:status": {}}));
        let table = vec![
            (vec![entry("kubectl", "Update", None, json!({}))], None),
            (
                vec![entry(c, "Apply", Some("status"), json!({})), legacy.clone()],
                Some(vec![legacy.clone()]),
            ),
        ];
        for (entries, want) in table {
            let mut meta = ObjectMeta {
                managed_fields: Some(entries),
                ..ObjectMeta::default()
            };
            keep_legacy_status_entries(&mut meta);
            assert_eq!(meta.managed_fields, want);
            assert_eq!(has_legacy_status(&meta), want.is_some());
        }
    }

    #[test]
    fn an_apply_body_names_the_object_and_carries_a_version_only_when_asked() {
        let body = apply_body::<smolvm_api::SmolVM>("a", None, &json!({"phase": "Pending"}));
        assert_eq!(
            body,
            json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM", "metadata": {"name": "a"},
                "status": {"phase": "Pending"}})
        );
        let body = apply_body::<smolvm_api::SmolVM>("a", Some("42"), &json!({}));
        assert_eq!(body["metadata"]["resourceVersion"], "42");
    }
}
