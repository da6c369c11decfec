//! SmolVM API types, constants, policy, and the pure admission rules.
//!
//! - [`types`]: the `SmolVM` and `SmolVMNode` custom resources.
//! - [`class`]: the `SmolVMClass` custom resource (instance types) and the catalogue of classes.
//! - [`pool`]: the `SmolVMPool` custom resource (warm pools) and the catalogue of pools.
//! - [`branch`]: branches of a running SmolVM: the fields a branch sets, and the catalogue of
//!   branch sources.
//! - [`constants`]: finalizer, annotations, labels, condition types and reasons.
//! - [`policy`]: the admission policy (bounds, port range, identities) and its loader.
//! - [`admission`]: the admission operation, which defaulting and validation both read.
//! - [`defaulting`]: rules M1 to M3, as a minimal JSON Patch.
//! - [`validate`]: rules V1 to V14, returning every violation and warning at once.
//! - [`crd`]: the generated CustomResourceDefinitions.
//! - [`nodeapi`]: the node API between the controller and the runtime agents: its table of
//!   operations, its wire types and the interactive exec channel ([`channel`], re-exported).
//! - [`quota`]: what SmolVMs and pools count against a ResourceQuota's product keys, and the
//!   judgement of a charge (V15), pure.
//! - [`volume`]: a SmolVM's volumes (claims, claim templates, ConfigMaps, Secrets) and the
//!   names of the holder Pod and claims they get.
//! - [`text`]: cleaning of other programs' messages before they reach users.

pub mod admission;
pub mod branch;
pub mod class;
pub mod constants;
pub mod crd;
pub mod defaulting;
pub mod error;
#[cfg(feature = "test-fixtures")]
pub mod fixtures;
pub mod nodeapi;
pub mod policy;
pub mod pool;
pub mod quota;
pub mod syntax;
pub mod text;
pub mod types;
pub mod validate;
pub mod volume;

pub use class::{SmolVMClass, SmolVMClassSpec};
pub use error::Error;
pub use nodeapi::channel;
pub use policy::Policy;
pub use pool::{SmolVMPool, SmolVMPoolSpec};
pub use types::*;
