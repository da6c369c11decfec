//! The `SmolVM` and `SmolVMNode` custom resources (`SmolVMClass` is in [`crate::class`]) (group `vm.smolvm.dev`, version `v1alpha1`).
//!
//! Doc comments become the `kubectl explain` descriptions; `#[x_kube(validation)]` rules become
//! the CRD's `x-kubernetes-validations` (CEL), which keep the API safe even while the webhook is
//! down. Rules that CEL cannot express (identities, policy, cross-object checks) live in
//! [`crate::validate`].
//!
//! One file per part of the API, every type re-exported here (and from the crate's root):
//! - `smolvm`: the `SmolVM` resource and its spec, with the defaults of rule M1;
//! - `network`: a SmolVM's network and ports;
//! - `workload`: a SmolVM's workload (environment, pull secrets, restart policy);
//! - `lifecycle`: how long a SmolVM lives (SPEC 2.7);
//! - `status`: a SmolVM's status;
//! - `node`: the `SmolVMNode` resource, its spec and status.

mod lifecycle;
mod network;
mod node;
mod smolvm;
mod status;
mod workload;

pub use lifecycle::*;
pub use network::*;
pub use node::*;
pub use smolvm::*;
pub use status::*;
pub use workload::*;
