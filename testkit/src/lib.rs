//! Test support shared by the workspace's tests and benchmarks (a dev-dependency only; nothing
//! here ships):
//!
//! - [`node`]: the node side, all real: smolvm, a test PKI, an mTLS node API client and an
//!   in-process runtime agent;
//! - [`apiserver`]: the one test double of the Kubernetes API server, for what a real one cannot
//!   drive deterministically (an exact call sequence, a hung answer, a race between replicas).
//!   The end-to-end tier runs a real kube-apiserver;
//! - [`flags`]: the shared flag vocabulary, checked on a built binary;
//! - [`memory_vmm`]: a test double of `smolvm serve` in memory (machines, pools, leases) behind
//!   the simulated nodes of the control-plane benchmarks;
//! - [`runtime_double`]: a test double of the runtime for interactive exec, which no guest here
//!   can serve;
//! - [`smolvm_double`]: a test double of `smolvm serve` itself (its HTTP API on a Unix socket),
//!   whose machines "boot" at once, for what needs a running machine (suspend and resume);
//!   checked against smolvm's OpenAPI document;
//! - [`volumes`]: a fake kubelet pods directory of holder Pods, a recording test double of the
//!   agent's mounts, and a guard that unmounts what a test mounted.

pub mod apiserver;
pub mod flags;
pub mod memory_vmm;
pub mod netns;
pub mod node;
pub mod runtime_double;
pub mod smolvm_double;
pub mod volumes;
