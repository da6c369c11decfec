//! Kubernetes events for SmolVM transitions, written straight to `events.k8s.io/v1`.
//!
//! kube's `Recorder` keeps every event it published in a cache (for series aggregation) and
//! scans that cache on every publish. The controller publishes one event per transition and
//! never repeats one (a Warning is published only when its condition changes), so the cache
//! bought nothing and cost memory and time that grew with the number of VMs (at 10,000 VMs it
//! held 20,000 events). This sink keeps nothing.
//!
//! Delivered in the background ([`EventSink::in_background`]), an event is queued at once, so a
//! transition's next step never waits for its event's round trip to the API server (on a busy
//! API server, tens of milliseconds each): a claim from a warm pool publishes two events on its
//! way to Running. The events of one object keep their order (one lane per object, by a hash of
//! its reference); a full lane holds the publisher back instead of dropping the event. On stop,
//! [`EventSink::flush`] delivers what is still queued, within a deadline.

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

/// How many events may wait in one lane of a background sink before a publisher waits (with the
/// default 64 lanes, 4,096 events in all: about 4 MiB at most).
const LANE_DEPTH: usize = 64;

/// Publishes events as one reporter (controller name and instance).
#[derive(Clone)]
pub struct EventSink {
    client: Client,
    reporter: Reporter,
    /// Background delivery: one queue per lane, each drained in order by its own task.
    lanes: Option<std::sync::Arc<[tokio::sync::mpsc::Sender<Queued>]>>,
}

/// What a lane holds: an event to create, or a flush's mark, answered once every event queued
/// before it has been created (or has failed).
enum Queued {
    Event(Box<K8sEvent>),
    Flushed(tokio::sync::oneshot::Sender<()>),
}

impl EventSink {
    /// A sink for `reporter` that creates each event before `publish` returns.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            lanes: None,
        }
    }

    /// This sink, delivering in the background from now on over `lanes` lanes (at least one),
    /// each a task that creates its events one after another. `publish` then returns once the
    /// event is queued; a failed create is logged by the lane. Before the process stops,
    /// [`EventSink::flush`] delivers what is still queued.
    pub fn in_background(self, lanes: usize) -> Self {
        let senders: Vec<_> = (0..lanes.max(1))
            .map(|_| {
                let (tx, mut rx) = tokio::sync::mpsc::channel::<Queued>(LANE_DEPTH);
                let client = self.client.clone();
                tokio::spawn(async move {
                    while let Some(queued) = rx.recv().await {
                        match queued {
                            Queued::Event(record) => {
                                if let Err(e) = create(&client, &record).await {
                                    tracing::warn!(error = %e, reason = record.reason.as_deref().unwrap_or_default(), "could not record event");
                                }
                            }
                            Queued::Flushed(done) => {
                                let _ = done.send(());
                            }
                        }
                    }
                });
                tx
            })
            .collect();
        Self {
            lanes: Some(senders.into()),
            ..self
        }
    }

    /// Publishes one event about `regarding`: created before this returns, or queued on the
    /// lane of `regarding` when the sink delivers in the background.
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let record = self.record(event, regarding);
        let Some(lanes) = &self.lanes else {
            return create(&self.client, &record).await;
        };
        let lane = &lanes[lane_of(regarding, lanes.len())];
        if let Err(tokio::sync::mpsc::error::SendError(Queued::Event(record))) =
            lane.send(Queued::Event(Box::new(record))).await
        {
            // The lane's task is gone (the runtime is shutting down): deliver it here.
            return create(&self.client, &record).await;
        }
        Ok(())
    }

    /// Waits until every event queued before this call has been delivered (created, or its
    /// failure logged), for at most `within`. `true` when all were; `false` when the deadline
    /// came first (the API server slow or gone), leaving the rest queued. A sink that does not
    /// deliver in the background has nothing queued.
    pub async fn flush(&self, within: std::time::Duration) -> bool {
        let Some(lanes) = &self.lanes else { return true };
        let marks = async {
            let mut pending = Vec::with_capacity(lanes.len());
            for lane in lanes.iter() {
                let (done, delivered) = tokio::sync::oneshot::channel();
                if lane.send(Queued::Flushed(done)).await.is_ok() {
                    pending.push(delivered);
                }
            }
            // A lane whose task is gone answers no mark; it holds nothing either.
            futures::future::join_all(pending).await;
        };
        tokio::time::timeout(within, marks).await.is_ok()
    }

    /// The event, stamped now.
    fn record(&self, event: &Event, regarding: &ObjectReference) -> K8sEvent {
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".to_string());
        K8sEvent {
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
        }
    }
}

/// Creates `record` in its namespace.
async fn create(client: &Client, record: &K8sEvent) -> Result<(), kube::Error> {
    let namespace = record.metadata.namespace.as_deref().unwrap_or("default");
    let api: Api<K8sEvent> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), record).await.map(|_| ())
}

/// The lane of the object `regarding` among `lanes`: the same object, the same lane.
fn lane_of(regarding: &ObjectReference, lanes: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&regarding.kind, &regarding.namespace, &regarding.name, &regarding.uid).hash(&mut hasher);
    (hasher.finish() % lanes.max(1) as u64) as usize
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
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    /// A sink that delivers as it publishes.
    fn direct(client: Client) -> EventSink {
        EventSink::new(
            client,
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        )
    }

    fn sink(client: Client) -> EventSink {
        direct(client).in_background(4)
    }

    fn numbered(i: usize) -> Event {
        Event {
            type_: EventType::Normal,
            reason: "Numbered".into(),
            note: Some(i.to_string()),
            action: "Test".into(),
            secondary: None,
        }
    }

    fn vm_ref(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("SmolVM".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn flush_returns_once_every_queued_event_is_created_in_order_per_object() {
        let (client, handle) = smolvm_testkit::apiserver::client("default");
        let created: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
        let seen = created.clone();
        smolvm_testkit::apiserver::serve_with(handle, move |_, _, body| {
            let seen = seen.clone();
            async move {
                // A slow API server: every create takes a while.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let name = event["regarding"]["name"].as_str().unwrap_or_default().to_string();
                let number = event["note"]
                    .as_str()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(usize::MAX);
                seen.lock().unwrap_or_else(|e| e.into_inner()).push((name, number));
                (201, event)
            }
        });
        let events = sink(client);
        for i in 0..12 {
            let regarding = vm_ref(["a", "b", "c"][i % 3]);
            events.publish(&numbered(i), &regarding).await.expect("queued");
        }
        assert!(
            events.flush(Duration::from_secs(10)).await,
            "every event delivered in time"
        );
        let created = created.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(created.len(), 12, "{created:?}");
        for name in ["a", "b", "c"] {
            let order: Vec<usize> = created.iter().filter(|(n, _)| n == name).map(|(_, i)| *i).collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(order, sorted, "{name}'s events in the order published");
        }
    }

    #[tokio::test]
    async fn flush_gives_up_at_its_deadline_when_the_api_server_does_not_answer() {
        // The double takes no call: every create hangs.
        let (client, _handle) = smolvm_testkit::apiserver::client("default");
        let events = sink(client);
        events.publish(&numbered(0), &vm_ref("a")).await.expect("queued");
        let flushed = tokio::time::timeout(Duration::from_secs(30), events.flush(Duration::from_millis(200)))
            .await
            .expect("flush returns at its deadline, not when the API server answers");
        assert!(!flushed, "not delivered");
        // A sink that delivers as it publishes has nothing queued.
        let (client, _handle) = smolvm_testkit::apiserver::client("default");
        assert!(direct(client).flush(Duration::from_millis(1)).await);
    }

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
    fn an_object_keeps_its_lane_and_objects_spread_over_lanes() {
        let vm = |name: &str| ObjectReference {
            kind: Some("SmolVM".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        };
        let lanes = 16;
        for name in ["a", "web", "claim-00017"] {
            assert_eq!(lane_of(&vm(name), lanes), lane_of(&vm(name), lanes), "{name}");
            assert!(lane_of(&vm(name), lanes) < lanes);
        }
        let used: std::collections::HashSet<usize> = (0..200)
            .map(|i| lane_of(&vm(&format!("claim-{i:05}")), lanes))
            .collect();
        assert!(
            used.len() >= lanes / 2,
            "200 objects on {} of {lanes} lanes",
            used.len()
        );
        assert_eq!(lane_of(&vm("a"), 0), 0, "no lanes is one lane");
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
