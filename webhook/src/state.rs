//! Shared server state: the current policy, the SmolVMNode, SmolVMClass and SmolVMPool
//! catalogues, readiness
//! and metrics.

use std::sync::{
    Arc, RwLock,
    atomic::{AtomicBool, Ordering},
};

use kube::{
    core::PartialObjectMeta,
    runtime::reflector::{ObjectRef, Store},
};
use smolvm_api::{
    Policy, SmolVM, SmolVMClass, SmolVMNode, SmolVMPool,
    branch::SourceCatalog,
    class::ClassCatalog,
    constants::LABEL_CLASS,
    pool::PoolCatalog,
    validate::{NodeCatalog, NodeFacts},
};

use crate::metrics::Metrics;

/// The policy in force; replaced atomically when the file changes.
#[derive(Clone, Default)]
pub struct PolicyHandle(Arc<RwLock<Arc<Policy>>>);

impl PolicyHandle {
    /// A handle holding `policy`.
    pub fn new(policy: Policy) -> Self {
        PolicyHandle(Arc::new(RwLock::new(Arc::new(policy))))
    }

    /// The current policy.
    pub fn current(&self) -> Arc<Policy> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the policy.
    pub fn replace(&self, policy: Policy) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
    }
}

/// The conditions of `/readyz`.
#[derive(Debug, Default)]
pub struct Readiness {
    nodes_synced: AtomicBool,
    classes_synced: AtomicBool,
    pools_synced: AtomicBool,
    sources_synced: AtomicBool,
    quotas_synced: AtomicBool,
    tls_loaded: AtomicBool,
}

impl Readiness {
    /// Marks the SmolVMNode cache as synced.
    pub fn set_nodes_synced(&self) {
        self.nodes_synced.store(true, Ordering::Release);
    }

    /// Marks the SmolVMClass cache as synced.
    pub fn set_classes_synced(&self) {
        self.classes_synced.store(true, Ordering::Release);
    }

    /// Marks the SmolVMPool cache as synced.
    pub fn set_pools_synced(&self) {
        self.pools_synced.store(true, Ordering::Release);
    }

    /// Marks the cache of branch sources as synced.
    pub fn set_sources_synced(&self) {
        self.sources_synced.store(true, Ordering::Release);
    }

    /// Marks the ResourceQuota cache as synced.
    pub fn set_quotas_synced(&self) {
        self.quotas_synced.store(true, Ordering::Release);
    }

    /// Marks the serving certificate as loaded.
    pub fn set_tls_loaded(&self) {
        self.tls_loaded.store(true, Ordering::Release);
    }

    /// What is still missing (empty when ready).
    pub fn missing(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if !self.nodes_synced.load(Ordering::Acquire) {
            out.push("smolvmnode cache not synced");
        }
        if !self.classes_synced.load(Ordering::Acquire) {
            out.push("smolvmclass cache not synced");
        }
        if !self.pools_synced.load(Ordering::Acquire) {
            out.push("smolvmpool cache not synced");
        }
        if !self.sources_synced.load(Ordering::Acquire) {
            out.push("branch source cache not synced");
        }
        if !self.quotas_synced.load(Ordering::Acquire) {
            out.push("resourcequota cache not synced");
        }
        if !self.tls_loaded.load(Ordering::Acquire) {
            out.push("serving certificate not loaded");
        }
        out
    }
}

/// The known SmolVMNodes as a kube reflector store sees them (hash lookups by name).
#[derive(Clone)]
pub struct StoreCatalog(pub Store<SmolVMNode>);

impl NodeCatalog for StoreCatalog {
    fn node(&self, name: &str) -> Option<NodeFacts> {
        self.0.get(&ObjectRef::new(name)).map(|n| NodeFacts::of(&n))
    }
    fn any_node(&self, pred: &mut dyn FnMut(&SmolVMNode) -> bool) -> bool {
        self.0.state().iter().any(|n| pred(n))
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The known SmolVMPools as a kube reflector store sees them (hash lookups by namespace and
/// name).
#[derive(Clone)]
pub struct PoolStore(pub Store<SmolVMPool>);

impl PoolCatalog for PoolStore {
    fn pool(&self, namespace: &str, name: &str) -> Option<SmolVMPool> {
        self.0
            .get(&ObjectRef::new(name).within(namespace))
            .map(|p| (*p).clone())
    }
    // The store's snapshot is a list of pools: the list's own catalogue answers this.
    fn names_in(&self, namespace: &str) -> Vec<String> {
        self.0.state().names_in(namespace)
    }
}

/// The known branch sources (rule V17): the SmolVMs labelled `vm.smolvm.dev/branchable`, as a
/// reflector store sees them, and the client that reads a source the store does not hold yet
/// (one made a moment before its branch, whose watch event has not come).
#[derive(Clone, Default)]
pub struct Sources {
    /// The branchable SmolVMs; `None` without a cluster.
    pub store: Option<Store<SmolVM>>,
    /// Reads a source on a miss; `None` without a cluster.
    pub client: Option<kube::Client>,
}

/// How long a source's read may take: the API server gives the whole review 5 s.
pub const SOURCE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl Sources {
    /// For a SmolVM review whose object names a source in `spec.branchOf` that the store does
    /// not hold, the source read from the API server now (`None` otherwise, or when it cannot
    /// be read: the rules then say it is unknown). Bodies that do not mention `branchOf` cost
    /// one byte search.
    pub async fn resolve(&self, route: crate::review::Route, body: &[u8]) -> Option<SmolVM> {
        use crate::review::Route;
        if !matches!(route, Route::MutateSmolVM | Route::ValidateSmolVM)
            || memchr::memmem::find(body, b"branchOf").is_none()
        {
            return None;
        }
        let client = self.client.as_ref()?;
        let review: serde_json::Value = serde_json::from_slice(body).ok()?;
        let object = review.pointer("/request/object")?;
        let name = smolvm_api::branch::source_named(object)?;
        let namespace = review
            .pointer("/request/namespace")
            .or_else(|| object.pointer("/metadata/namespace"))
            .and_then(serde_json::Value::as_str)?;
        if self.source(namespace, name).is_some() {
            return None;
        }
        let api: kube::Api<SmolVM> = kube::Api::namespaced(client.clone(), namespace);
        match tokio::time::timeout(SOURCE_READ_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => {
                tracing::warn!(namespace, source = name, error = %e, "cannot read a branch's source");
                None
            }
            Err(_) => {
                tracing::warn!(namespace, source = name, "reading a branch's source timed out");
                None
            }
        }
    }
}

impl SourceCatalog for Sources {
    fn source(&self, namespace: &str, name: &str) -> Option<SmolVM> {
        self.store
            .as_ref()?
            .get(&ObjectRef::new(name).within(namespace))
            .map(|vm| (*vm).clone())
    }
    // The store's snapshot is a list of SmolVMs: the list's own catalogue answers this.
    fn branchable_in(&self, namespace: &str) -> Vec<String> {
        self.store
            .as_ref()
            .map(|s| s.state().branchable_in(namespace))
            .unwrap_or_default()
    }
}

/// The known SmolVMClasses as a kube reflector store sees them, with the SmolVMs that carry the
/// class label (a metadata-only store) to count a class's SmolVMs when it is deleted.
#[derive(Clone)]
pub struct ClassStore {
    /// The classes.
    pub classes: Store<SmolVMClass>,
    /// The SmolVMs labelled `vm.smolvm.dev/class`, metadata only.
    pub members: Store<PartialObjectMeta<SmolVM>>,
}

impl ClassCatalog for ClassStore {
    fn class(&self, name: &str) -> Option<SmolVMClass> {
        self.classes.get(&ObjectRef::new(name)).map(|c| (*c).clone())
    }
    // The store's snapshot is a list of classes: the list's own catalogue answers these.
    fn names(&self) -> Vec<String> {
        self.classes.state().names()
    }
    fn defaults(&self) -> Vec<SmolVMClass> {
        self.classes.state().defaults()
    }
    fn users(&self, name: &str) -> Option<usize> {
        Some(
            self.members
                .state()
                .iter()
                .filter(|m| {
                    m.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(LABEL_CLASS))
                        .map(String::as_str)
                        == Some(name)
                })
                .count(),
        )
    }
}

/// Everything a request handler needs.
/// Review slots by default. Sized against the pod's memory limit (256 MiB): each slot holds at
/// most one body of `--body-limit` (1 MiB) plus its parsed form (about twice the text), so 32
/// slots bound review memory near 100 MiB, with the rest for the runtime, TLS and the SmolVMNode
/// cache.
pub const DEFAULT_MAX_CONCURRENT_REVIEWS: usize = 32;

/// Bodies read at once while they are still arriving, by default. Each holds at most one body
/// of `--body-limit` (1 MiB), so 64 bound what slow clients can make the webhook hold near
/// 64 MiB; a review's body that is all there when it is read (the API server's are) takes none.
pub const DEFAULT_MAX_CONCURRENT_BODIES: usize = 64;

/// How long a body still arriving may go without a byte, by default.
pub const DEFAULT_BODY_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The deadline for a whole body, from the request's start, by default: the shipped webhook
/// configurations give the API server's call 5 s in all.
pub const DEFAULT_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Clone)]
pub struct AppState {
    /// The policy in force.
    pub policy: PolicyHandle,
    /// The SmolVMNode catalog (a reflector store in production).
    pub nodes: Arc<dyn NodeCatalog + Send + Sync>,
    /// The SmolVMClass catalogue (reflector stores in production).
    pub classes: Arc<dyn ClassCatalog + Send + Sync>,
    /// The SmolVMPool catalogue (a reflector store in production).
    pub pools: Arc<dyn PoolCatalog + Send + Sync>,
    /// The branch sources (a reflector store and a client in production).
    pub sources: Arc<Sources>,
    /// Readiness conditions.
    pub readiness: Arc<Readiness>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Largest accepted body, bytes.
    pub body_limit: usize,
    /// How long a request body may take to arrive, from the request's start.
    pub body_timeout: std::time::Duration,
    /// How long a body still arriving may go without a byte.
    pub body_idle_timeout: std::time::Duration,
    /// Reader slots: a request whose body is still arriving holds one while it is read; a
    /// request finding none displaces the longest-held one, or is shed (429) before its body is
    /// read when none frees.
    pub bodies: Arc<crate::bodies::Readers>,
    /// The number of reader slots.
    pub max_concurrent_bodies: usize,
    /// Review slots: a request holds one once its whole body is in, until it is answered; a
    /// request finding none is shed (429).
    pub reviews: Arc<tokio::sync::Semaphore>,
    /// The number of review slots.
    pub max_concurrent_reviews: usize,
    /// The ResourceQuotas and their charger (rule V15); `None` without a cluster.
    pub quotas: Option<Arc<crate::quota::Quotas>>,
}

impl AppState {
    /// State with the given policy and node catalogue, no classes or pools, default limits (1 MiB,
    /// [`DEFAULT_BODY_TIMEOUT`], [`DEFAULT_BODY_IDLE_TIMEOUT`], [`DEFAULT_MAX_CONCURRENT_BODIES`]
    /// bodies and [`DEFAULT_MAX_CONCURRENT_REVIEWS`] reviews at once).
    pub fn new(policy: PolicyHandle, nodes: Arc<dyn NodeCatalog + Send + Sync>) -> Self {
        AppState {
            policy,
            nodes,
            classes: Arc::new(Vec::<SmolVMClass>::new()),
            pools: Arc::new(Vec::<SmolVMPool>::new()),
            sources: Arc::new(Sources::default()),
            readiness: Arc::new(Readiness::default()),
            metrics: Arc::new(Metrics::new()),
            body_limit: 1024 * 1024,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            body_idle_timeout: DEFAULT_BODY_IDLE_TIMEOUT,
            bodies: Arc::new(crate::bodies::Readers::new(DEFAULT_MAX_CONCURRENT_BODIES)),
            max_concurrent_bodies: DEFAULT_MAX_CONCURRENT_BODIES,
            reviews: Arc::new(tokio::sync::Semaphore::new(DEFAULT_MAX_CONCURRENT_REVIEWS)),
            max_concurrent_reviews: DEFAULT_MAX_CONCURRENT_REVIEWS,
            quotas: None,
        }
    }

    /// Sets the ResourceQuotas and their charger.
    pub fn with_quotas(mut self, quotas: Arc<crate::quota::Quotas>) -> Self {
        self.quotas = Some(quotas);
        self
    }

    /// Sets the SmolVMClass catalogue.
    pub fn with_classes(mut self, classes: Arc<dyn ClassCatalog + Send + Sync>) -> Self {
        self.classes = classes;
        self
    }

    /// Sets the SmolVMPool catalogue.
    pub fn with_pools(mut self, pools: Arc<dyn PoolCatalog + Send + Sync>) -> Self {
        self.pools = pools;
        self
    }

    /// Sets the branch sources.
    pub fn with_sources(mut self, sources: Arc<Sources>) -> Self {
        self.sources = sources;
        self
    }

    /// Sets the number of reader slots for bodies still arriving.
    pub fn with_max_concurrent_bodies(mut self, n: usize) -> Self {
        let n = n.max(1);
        self.bodies = Arc::new(crate::bodies::Readers::new(n));
        self.max_concurrent_bodies = n;
        self
    }

    /// Sets the number of review slots.
    pub fn with_max_concurrent_reviews(mut self, n: usize) -> Self {
        let n = n.max(1);
        self.reviews = Arc::new(tokio::sync::Semaphore::new(n));
        self.max_concurrent_reviews = n;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::{reflector, watcher};
    use smolvm_api::fixtures;

    #[test]
    fn store_catalog_matches_vec_catalog() {
        let (reader, mut writer) = reflector::store::<SmolVMNode>();
        let nodes = vec![fixtures::node("n1", 4, 4096, 100), fixtures::node("n2", 2, 1024, 10)];
        writer.apply_watcher_event(&watcher::Event::Init);
        for n in &nodes {
            writer.apply_watcher_event(&watcher::Event::InitApply(n.clone()));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let store = StoreCatalog(reader);
        for name in ["n1", "n2", "n3"] {
            assert_eq!(store.node(name), nodes.node(name), "{name}");
        }
        for cpus in [1, 4, 5] {
            assert_eq!(
                store.any_node(&mut |n| n
                    .status
                    .as_ref()
                    .and_then(|s| s.allocatable)
                    .is_some_and(|a| a.cpus >= cpus)),
                nodes.any_node(&mut |n| n
                    .status
                    .as_ref()
                    .and_then(|s| s.allocatable)
                    .is_some_and(|a| a.cpus >= cpus))
            );
        }
        assert!(!NodeCatalog::is_empty(&store));
    }

    #[test]
    fn readiness_needs_every_cache_and_the_certificate() {
        let r = Readiness::default();
        assert_eq!(r.missing().len(), 6);
        r.set_tls_loaded();
        r.set_quotas_synced();
        r.set_classes_synced();
        r.set_pools_synced();
        r.set_sources_synced();
        assert_eq!(r.missing(), vec!["smolvmnode cache not synced"]);
        r.set_nodes_synced();
        assert!(r.missing().is_empty());
    }
}
