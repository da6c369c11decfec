//! Branches (SPEC 2.6): a SmolVM that names a running branchable SmolVM in `spec.branchOf` is
//! made as a copy-on-write clone of its machine, on its node.
//!
//! At CREATE a branch takes its spec from its source (rule M5, [`crate::defaulting`]), except
//! what a clone cannot share: `branchable`, `volumes`, `nodeName` and the published ports. Rule
//! V17 ([`crate::validate`]) keeps a branch to what it may set itself ([`BRANCH_FIELDS`]) and a
//! source to what can be branched. [`SourceCatalog`] is what admission knows of the sources.

use std::borrow::Borrow;

use crate::types::SmolVM;

/// The fields a branch may set besides `branchOf`'s own: its own environment, its lifecycle and
/// (inside `network`) its own published ports. Everything else comes from its source (V17).
pub const BRANCH_FIELDS: [&str; 6] = ["branchOf", "env", "running", "suspended", "lifecycle", "network"];

/// The members of `network` a branch may set: its own published ports.
pub const BRANCH_NETWORK_FIELDS: [&str; 1] = ["ports"];

/// The top-level spec fields a branch never takes from its source: what it sets itself, what a
/// clone cannot share (its source's volumes, its pin, its being a source), and a pool it was
/// served from (a branch is made from its source, never from a slot).
pub const NOT_INHERITED: [&str; 9] = [
    "branchOf",
    "branchable",
    "env",
    "running",
    "suspended",
    "volumes",
    "nodeName",
    "poolRef",
    "network",
];

/// The known branch sources (branchable SmolVMs), as admission sees them: the webhook's cache,
/// with a source it does not hold yet read from the API server.
pub trait SourceCatalog {
    /// The SmolVM of that name in that namespace, if known.
    fn source(&self, namespace: &str, name: &str) -> Option<SmolVM>;
    /// The names of the known branchable SmolVMs of a namespace, sorted.
    fn branchable_in(&self, namespace: &str) -> Vec<String>;
}

/// No sources at all (a [`SourceCatalog`] for contexts that have none).
pub static NO_SOURCES: Vec<SmolVM> = Vec::new();

/// A list of SmolVMs, owned or shared (`Vec<SmolVM>`, `Vec<Arc<SmolVM>>`).
impl<T: Borrow<SmolVM>> SourceCatalog for Vec<T> {
    fn source(&self, namespace: &str, name: &str) -> Option<SmolVM> {
        self.iter()
            .map(Borrow::borrow)
            .find(|vm| vm.metadata.namespace.as_deref() == Some(namespace) && vm.metadata.name.as_deref() == Some(name))
            .cloned()
    }
    fn branchable_in(&self, namespace: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .iter()
            .map(Borrow::borrow)
            .filter(|vm| vm.metadata.namespace.as_deref() == Some(namespace) && vm.spec.branchable())
            .filter_map(|vm| vm.metadata.name.clone())
            .collect();
        names.sort();
        names
    }
}

/// One source read on its own (the webhook's read of a source its cache did not hold yet), in
/// front of the cache's catalogue.
pub struct WithSource<'a> {
    /// The source read.
    pub read: Option<&'a SmolVM>,
    /// The cache.
    pub cache: &'a dyn SourceCatalog,
}

impl SourceCatalog for WithSource<'_> {
    fn source(&self, namespace: &str, name: &str) -> Option<SmolVM> {
        self.read
            .filter(|vm| {
                vm.metadata.namespace.as_deref() == Some(namespace) && vm.metadata.name.as_deref() == Some(name)
            })
            .cloned()
            .or_else(|| self.cache.source(namespace, name))
    }
    fn branchable_in(&self, namespace: &str) -> Vec<String> {
        let mut names = self.cache.branchable_in(namespace);
        if let Some(name) = self
            .read
            .filter(|vm| vm.metadata.namespace.as_deref() == Some(namespace) && vm.spec.branchable())
            .and_then(|vm| vm.metadata.name.clone())
            && !names.contains(&name)
        {
            names.push(name);
            names.sort();
        }
        names
    }
}

/// The name of the source a SmolVM's JSON names in `spec.branchOf.name`, if any.
pub fn source_named(object: &serde_json::Value) -> Option<&str> {
    object
        .pointer("/spec/branchOf/name")
        .and_then(serde_json::Value::as_str)
}
