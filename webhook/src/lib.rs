//! The mutating and validating admission webhook server (axum, axum-server, rustls).
//!
//! - [`review`]: pure AdmissionReview v1 handling (parse, rules, encode), no I/O.
//! - [`bodies`]: reader slots for request bodies still arriving (the longest-held displaced).
//! - [`server`]: the HTTPS admission router and the plain ops router.
//! - [`state`]: policy handle, SmolVMNode catalog over a reflector store, readiness.
//! - [`reload`]: policy and certificate file reloading.
//! - [`metrics`]: Prometheus metrics.
//! - [`cli`]: the command-line flags.
//! - [`client`]: an HTTPS client for tests and the benchmark (verifies certificates).

#[doc(hidden)]
#[cfg(feature = "bench")]
pub mod bench_support;
pub mod bodies;
pub mod cli;
pub mod client;
pub mod error;
pub mod metrics;
pub mod reload;
pub mod review;
pub mod server;
pub mod state;

pub use error::{Error, Result};
