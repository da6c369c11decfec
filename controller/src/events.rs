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
        let name = regarding.name.clone().unwrap_or_default();
        let record = K8sEvent {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.")),
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
    fn notes_are_cut_to_the_api_limit_on_a_character_boundary() {
        assert_eq!(truncate("short"), "short");
        let long = "é".repeat(600); // 1,200 bytes
        let cut = truncate(&long);
        assert!(cut.len() <= MAX_NOTE && cut.len() >= MAX_NOTE - 1, "{}", cut.len());
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
