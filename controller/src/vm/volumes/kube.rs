//! The thin I/O of volumes: what [`super::judge`] needs, observed from the caches where the
//! controller watches (holder Pods, claims, PersistentVolumes: [`watches`]) and read where it
//! does not (a ConfigMap's or Secret's existence, the kubelet's events about a holder); the
//! [`VolumeWrite`]s carried out ([`write()`]); and which SmolVMs a claim or a PV concerns, so that
//! its change wakes them ([`claim_users`], [`volume_users`]).
//!
//! Nothing here reads a ConfigMap's or Secret's contents: existence only (a metadata GET).

use std::sync::Arc;

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::{ConfigMap, Event, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions},
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use smolvm_api::{SmolVM, constants::FIELD_MANAGER_CONTROLLER, volume::Source as VolumeSource};

use super::holder::HolderState;
use super::{Presence, Seen, VolumeWrite};
use crate::vm::workload::Source;
use crate::vm::{Context, Error};

/// The label selector of holder Pods.
pub const HOLDER_SELECTOR: &str = "vm.smolvm.dev/holder=true";

/// The most kubelet events about a holder read in one pass.
const EVENTS_READ: u32 = 20;

/// The caches of what SmolVMs' volumes use; empty ones make a pass read from the API server.
#[derive(Clone, Default)]
pub struct Caches {
    /// Holder Pods (labelled `vm.smolvm.dev/holder=true`), in every namespace.
    pub holders: Option<Store<Pod>>,
    /// PersistentVolumeClaims, in every namespace.
    pub claims: Option<Store<PersistentVolumeClaim>>,
    /// PersistentVolumes.
    pub volumes: Option<Store<PersistentVolume>>,
}

/// The watch streams of [`watches`], which wake the SmolVMs their objects concern.
pub struct Streams<H, C, V> {
    /// Holder Pods (each controlled by its SmolVM).
    pub holders: H,
    /// Claims.
    pub claims: C,
    /// PersistentVolumes.
    pub volumes: V,
}

/// A watch's events, boxed.
type Events<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// [`Streams`] boxed, as the SmolVM controller takes them.
pub type Boxed = Streams<Events<Pod>, Events<PersistentVolumeClaim>, Events<PersistentVolume>>;

/// The watches of holder Pods, claims and PersistentVolumes: their caches, and their streams.
pub fn watches(client: &Client) -> (Caches, Boxed) {
    let (holders, holder_writer) = reflector::store::<Pod>();
    let (claims, claim_writer) = reflector::store::<PersistentVolumeClaim>();
    let (volumes, volume_writer) = reflector::store::<PersistentVolume>();
    let holder_events = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels(HOLDER_SELECTOR),
    )
    .default_backoff()
    .modify(|p| p.metadata.managed_fields = None)
    .reflect(holder_writer)
    .touched_objects();
    let claim_events = watcher(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|c| c.metadata.managed_fields = None)
    .reflect(claim_writer)
    .touched_objects();
    let volume_events = watcher(Api::<PersistentVolume>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(|v| v.metadata.managed_fields = None)
        .reflect(volume_writer)
        .touched_objects();
    let caches = Caches {
        holders: Some(holders),
        claims: Some(claims),
        volumes: Some(volumes),
    };
    let streams = Streams {
        holders: holder_events.boxed(),
        claims: claim_events.boxed(),
        volumes: volume_events.boxed(),
    };
    (caches, streams)
}

/// The SmolVMs in `namespace` whose volumes use the claim `claim`.
pub fn claim_users(vms: &Store<SmolVM>, namespace: &str, claim: &str) -> Vec<ObjectRef<SmolVM>> {
    vms.state()
        .iter()
        .filter(|vm| vm.metadata.namespace.as_deref() == Some(namespace))
        .filter(|vm| {
            let name = vm.name_any();
            vm.spec
                .volumes
                .iter()
                .flatten()
                .any(|v| v.claim_name(&name).as_deref() == Some(claim))
        })
        .map(|vm| ObjectRef::from_obj(vm.as_ref()))
        .collect()
}

/// The SmolVMs whose claims a PersistentVolume is bound to (its `claimRef`).
pub fn volume_users(vms: &Store<SmolVM>, pv: &PersistentVolume) -> Vec<ObjectRef<SmolVM>> {
    let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    match claim.and_then(|c| Some((c.namespace.as_deref()?, c.name.as_deref()?))) {
        Some((namespace, name)) => claim_users(vms, namespace, name),
        None => Vec::new(),
    }
}

/// Which step of a SmolVM's life a pass observes its volumes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Its placement: its claims and the PVs they are bound to.
    Placement,
    /// A pass over it bound: its claims and their PVs, its ConfigMaps' and Secrets' existence,
    /// its holder Pod and, while the holder mounts, the kubelet's words about it.
    Bound,
    /// Its delete: its claims and its holder Pod.
    Delete,
}

/// What a pass over `vm` needs of its volumes for `look`; `None` for a SmolVM without volumes.
pub async fn observe(ctx: &Context, vm: &SmolVM, look: Look) -> Result<Option<Seen>, Error> {
    let volumes = vm.spec.volumes.as_deref().unwrap_or_default();
    if volumes.is_empty() {
        return Ok(None);
    }
    let (name, namespace) = (vm.name_any(), vm.namespace().unwrap_or_default());
    let mut seen = Seen {
        settings: ctx.holders.clone(),
        token: fresh_token(),
        ..Seen::default()
    };
    let caches = &ctx.owned.volumes;
    for claim in volumes.iter().filter_map(|v| v.claim_name(&name)) {
        let api = Api::namespaced(ctx.client.clone(), &namespace);
        let found = cached_or_get(api, caches.claims.as_ref(), Some(&namespace), &claim).await?;
        let pv = found
            .as_ref()
            .and_then(|c| c.spec.as_ref()?.volume_name.clone())
            .filter(|pv| !pv.is_empty());
        if let Some(pv) = pv.filter(|_| look != Look::Delete)
            && let Some(volume) =
                cached_or_get(Api::all(ctx.client.clone()), caches.volumes.as_ref(), None, &pv).await?
        {
            seen.bound.insert(pv, volume);
        }
        seen.claims.insert(claim, found);
    }
    if look == Look::Placement {
        return Ok(Some(seen));
    }
    for v in volumes.iter().filter(|_| look == Look::Bound) {
        let (kind, object) = match v.source() {
            Some(VolumeSource::ConfigMap(c)) => (Source::ConfigMap, c.name.clone()),
            Some(VolumeSource::Secret(s)) => (Source::Secret, s.secret_name.clone()),
            _ => continue,
        };
        let presence = presence(&ctx.client, &namespace, kind, &object).await?;
        seen.sources.insert((kind, object), presence);
    }
    let holder_name = smolvm_api::volume::holder_name(&name);
    let api = Api::namespaced(ctx.client.clone(), &namespace);
    seen.holder = cached_or_get(api, caches.holders.as_ref(), Some(&namespace), &holder_name).await?;
    let uid = vm.uid().unwrap_or_default();
    if let (Look::Bound, HolderState::Mounting(pod)) = (look, HolderState::of(seen.holder.as_deref(), &uid)) {
        seen.holder_events = kubelet_words(&ctx.client, pod).await;
    }
    Ok(Some(seen))
}

/// 32 random bytes, hex: a holder's release token. Empty should the system's randomness fail
/// (no holder is made with it; the next pass tries again).
pub fn fresh_token() -> String {
    let mut bytes = [0u8; 32];
    match getrandom::fill(&mut bytes) {
        Ok(()) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        Err(error) => {
            tracing::warn!(%error, "no randomness for a holder's release token; retried next pass");
            String::new()
        }
    }
}

/// One object of `name` (in `namespace`, or cluster-scoped): from `cache`, else read with `api`
/// (a cache that lacks it may not have caught up; a missing object is the rare case).
async fn cached_or_get<K>(
    api: Api<K>,
    cache: Option<&Store<K>>,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<Arc<K>>, Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + 'static,
{
    let key = match namespace {
        Some(ns) => ObjectRef::new(name).within(ns),
        None => ObjectRef::new(name),
    };
    if let Some(cached) = cache.and_then(|c| c.get(&key)) {
        return Ok(Some(cached));
    }
    Ok(api.get_opt(name).await?.map(Arc::new))
}

/// Whether a ConfigMap or Secret exists (a metadata GET: never its contents).
async fn presence(client: &Client, namespace: &str, kind: Source, name: &str) -> Result<Presence, Error> {
    let found = match kind {
        Source::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_metadata_opt(name)
            .await
            .map(|m| m.is_some()),
        Source::Secret => Api::<Secret>::namespaced(client.clone(), namespace)
            .get_metadata_opt(name)
            .await
            .map(|m| m.is_some()),
    };
    match found {
        Ok(true) => Ok(Presence::Found),
        Ok(false) => Ok(Presence::Missing),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(Presence::Forbidden),
        Err(e) => Err(e.into()),
    }
}

/// The kubelet's and scheduler's Warning events about `pod` (why its volumes are not mounted:
/// FailedMount, FailedAttachVolume, …), newest first. Best effort: a refusal or failure gives
/// none, and the holder's status still says what it can.
async fn kubelet_words(client: &Client, pod: &Pod) -> Vec<String> {
    let (Some(uid), Some(namespace)) = (pod.metadata.uid.as_deref(), pod.metadata.namespace.as_deref()) else {
        return Vec::new();
    };
    let params = ListParams::default()
        .fields(&format!("involvedObject.uid={uid},type=Warning"))
        .limit(EVENTS_READ);
    let listed = match Api::<Event>::namespaced(client.clone(), namespace).list(&params).await {
        Ok(listed) => listed.items,
        Err(error) => {
            tracing::debug!(%error, "the holder's events could not be read");
            return Vec::new();
        }
    };
    let mut events: Vec<(Option<k8s_openapi::jiff::Timestamp>, String)> = listed
        .into_iter()
        .filter_map(|e| {
            let at = e.last_timestamp.map(|t| t.0).or(e.event_time.map(|t| t.0));
            let words = [e.reason.as_deref(), e.message.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": ");
            (!words.is_empty()).then(|| (at, smolvm_api::text::clean_external(&words)))
        })
        .collect();
    events.sort_by_key(|e| std::cmp::Reverse(e.0));
    events.into_iter().map(|(_, words)| words).collect()
}

/// Carries out `writes` for `vm`, in order; the first failure stops them and comes back with the
/// write it was. A claim or holder that exists already was made (a pass that raced another);
/// one already gone was deleted.
pub async fn write(ctx: &Context, vm: &SmolVM, writes: &[VolumeWrite]) -> Result<(), (VolumeWrite, kube::Error)> {
    let namespace = vm.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    for w in writes {
        let done = match w {
            VolumeWrite::MakeClaim(claim) => claims.create(&PostParams::default(), claim).await.map(drop),
            VolumeWrite::AdoptClaim(claim) => {
                let params = PatchParams::apply(FIELD_MANAGER_CONTROLLER).force();
                let name = claim.name_any();
                claims
                    .patch(&name, &params, &Patch::Apply(claim.as_ref()))
                    .await
                    .map(drop)
            }
            VolumeWrite::MakeHolder(pod) => pods.create(&PostParams::default(), pod).await.map(drop),
            VolumeWrite::DeleteHolder { uid } => {
                let name = smolvm_api::volume::holder_name(&vm.name_any());
                pods.delete(&name, &precondition(uid)).await.map(drop)
            }
            VolumeWrite::DeleteClaim { name, uid } => claims.delete(name, &precondition(uid)).await.map(drop),
        };
        match done {
            Ok(()) => {}
            // Made already (create), gone already or replaced (delete, its UID the precondition).
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err((w.clone(), e)),
        }
    }
    Ok(())
}

/// A delete of exactly the object of `uid`.
fn precondition(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}
