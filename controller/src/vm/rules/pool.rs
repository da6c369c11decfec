//! A SmolVM that names a pool, at its create: which of its pool's node pools may serve it
//! ([`serving`]), and what its create is ([`create_call`]): a lease of a ready slot, a cold
//! create from the spec it holds, or a wait for a slot, as the pool's `whenEmpty` says. Pure:
//! the pool is observed once per pass ([`crate::vm::pooled::pool_of`]), the lease made by act,
//! and the `PoolEmpty` event and the waiting reason come back in the pass's outcome.

use kube::ResourceExt;
use smolvm_api::{
    SmolVM, SmolVMPool,
    constants::{ANNOTATION_POOL_GENERATION, ANNOTATION_POOL_UID},
    pool::WhenEmpty,
};

/// What a SmolVM that names a pool finds of it.
#[derive(Debug, Clone)]
pub enum PoolOf {
    /// It names no pool, or its pool is gone: created cold from the spec it holds.
    None,
    /// Its pool was deleted and made again under the same name after it was admitted (the pool's
    /// UID is not the one recorded at admission): slots of the new template never serve it.
    Replaced(SmolVMPool),
    /// Its pool, and the name on its nodes of the node pool whose slots may serve it.
    Current(SmolVMPool, String),
}

impl PoolOf {
    /// The node pool whose ready slots may serve the SmolVM, if any.
    pub fn node_pool(&self) -> Option<&str> {
        match self {
            PoolOf::Current(_, name) => Some(name),
            _ => None,
        }
    }
}

/// Which of `pool`'s node pools may serve `vm`, which names it: the one of the template `vm`
/// was filled from (its `vm.smolvm.dev/pool-generation`), and only if `pool` is the pool it
/// was admitted for (its `vm.smolvm.dev/pool-uid`; a SmolVM admitted before the UID was
/// recorded is the pool's only if the pool is not newer than the SmolVM). Pure.
pub fn serving(vm: &SmolVM, pool: SmolVMPool) -> PoolOf {
    let annotations = vm.annotations();
    let same = match annotations.get(ANNOTATION_POOL_UID) {
        Some(uid) => pool.metadata.uid.as_deref() == Some(uid.as_str()),
        None => match (&vm.metadata.creation_timestamp, &pool.metadata.creation_timestamp) {
            (Some(vm_made), Some(pool_made)) => pool_made.0 <= vm_made.0,
            _ => true,
        },
    };
    if !same {
        return PoolOf::Replaced(pool);
    }
    let generation = annotations
        .get(ANNOTATION_POOL_GENERATION)
        .and_then(|g| g.parse::<i64>().ok())
        .or(pool.metadata.generation);
    match crate::placement::node_pool_name_at(&pool, generation) {
        Some(name) => PoolOf::Current(pool, name),
        None => PoolOf::None,
    }
}

/// How a SmolVM's create goes, once its pool was observed and (when it names a current one) a
/// lease tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PooledCreate {
    /// A lease of a ready slot of node pool `node_pool` of SmolVMPool `pool`.
    Lease {
        /// The node pool on the node.
        node_pool: String,
        /// The SmolVMPool's name.
        pool: String,
    },
    /// Created cold from the spec it holds; `why` is the PoolEmpty event's message when the pool
    /// had no slot for it or was replaced (`None` for a SmolVM its pool has nothing to do with).
    Cold {
        /// Why a SmolVM that names a pool was created cold.
        why: Option<String>,
    },
    /// Not created: it waits for a slot (`whenEmpty: Wait`), saying why.
    Wait(String),
}

/// What a SmolVM's create is, from its pool as observed and whether a lease this pass found no
/// ready slot (`empty`) on `node`. Pure.
pub fn create_call(pool: &PoolOf, empty: bool, node: &str) -> PooledCreate {
    match pool {
        PoolOf::None => PooledCreate::Cold { why: None },
        PoolOf::Current(pool, node_pool) if !empty => PooledCreate::Lease {
            node_pool: node_pool.clone(),
            pool: pool.name_any(),
        },
        PoolOf::Current(pool, _) => {
            let empty = format!("pool {} has no ready slot on node {node}", pool.name_any());
            match pool.when_empty() {
                WhenEmpty::Wait => {
                    PooledCreate::Wait(format!("{empty}; whenEmpty is Wait: it is served once one is ready"))
                }
                WhenEmpty::Cold => PooledCreate::Cold {
                    why: Some(format!("{empty}: created cold from its template (whenEmpty: Cold)")),
                },
            }
        }
        PoolOf::Replaced(pool) => {
            let why = format!(
                "pool {} was deleted and made again after this SmolVM was admitted: the new pool's slots never serve it",
                pool.name_any()
            );
            match pool.when_empty() {
                WhenEmpty::Wait => PooledCreate::Wait(format!(
                    "{why}; whenEmpty is Wait, so it is not created cold either: delete it and create it again to take the new template"
                )),
                WhenEmpty::Cold => PooledCreate::Cold {
                    why: Some(format!("{why}: created cold from the spec it holds")),
                },
            }
        }
    }
}
