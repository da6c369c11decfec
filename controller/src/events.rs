//! Kubernetes events for SmolVM transitions, written straight to `events.k8s.io/v1`.
//!
//! kube's `Recorder` keeps every event it published in a cache (for series aggregation) and
//! scans that cache on every publish. The controller publishes one event per transition and
//! never repeats one (a Warning is published only when its condition changes), so the cache
//! bought nothing and cost memory and time that grew with the number of VMs (at 10,000 VMs it
//! held 20,000 events). This sink keeps nothing.

use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as K8sEvent},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::PostParams,
    runtime::events::{Event, EventType, Reporter},
};

/// The longest note events.k8s.io accepts, in bytes.
const MAX_NOTE: usize = 1024;

/// The reference of a SmolVMNode, for an event about it.
pub fn node_reference(name: Option<String>, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some(smolvm_api::constants::API_VERSION.into()),
        kind: Some(smolvm_api::constants::KIND_SMOLVM_NODE.into()),
        name,
        uid,
        ..Default::default()
    }
}

/// Publishes events as one reporter (controller name and instance).
#[derive(Clone)]
pub struct EventSink {
    client: Client,
    reporter: Reporter,
}

impl EventSink {
    /// A sink for `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self { client, reporter }
    }

    /// Creates one event about `regarding`.
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".to_string());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let record = K8sEvent {
            metadata: ObjectMeta {
                name: Some(event_name(
                    regarding.name.as_deref().unwrap_or("object"),
                    Timestamp::now(),
                )),
                namespace: Some(namespace),
                ..Default::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.as_deref().map(truncate),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_string(),
            ),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            event_time: Some(MicroTime(Timestamp::now())),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..Default::default()
        };
        api.create(&PostParams::default(), &record).await.map(|_| ())
    }
}

/// A unique event name, `<object>.<hex nanoseconds><hex sequence>`, as kubectl shows them. The API
/// server rejects a `generateName` ending in a dot, so the name is made here; the object part is
/// cut so the whole stays within the 253 characters of a DNS subdomain.
fn event_name(object: &str, now: Timestamp) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQUENCE: AtomicU32 = AtomicU32::new(0);
    let suffix = format!(
        "{:x}{:04x}",
        now.as_nanosecond(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed) & 0xffff
    );
    let room = 253 - 1 - suffix.len();
    let object = object
        .get(..room.min(object.len()))
        .unwrap_or(object)
        .trim_end_matches(['.', '-']);
    format!("{object}.{suffix}")
}

/// A note cut to [`MAX_NOTE`] bytes on a character boundary.
fn truncate(note: &str) -> String {
    if note.len() <= MAX_NOTE {
        return note.to_string();
    }
    let mut end = MAX_NOTE;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_unique_valid_subdomains() {
        let now = Timestamp::now();
        let a = event_name("web", now);
        let b = event_name("web", now);
        assert_ne!(a, b, "same object, same instant");
        assert!(a.starts_with("web."), "{a}");
        let long = event_name(&"x".repeat(253), now);
        assert!(long.len() <= 253, "{}", long.len());
        for name in [a, b, long] {
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-'),
                "{name}"
            );
            assert!(!name.ends_with('.') && !name.contains(".."), "{name}");
        }
    }

    #[test]
    fn notes_are_cut_to_the_api_limit_on_a_character_boundary() {
        assert_eq!(truncate("short"), "short");
        let long = "é".repeat(600); // 1,200 bytes
        let cut = truncate(&long);
        assert!(cut.len() <= MAX_NOTE && cut.len() >= MAX_NOTE - 1, "{}", cut.len());
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
