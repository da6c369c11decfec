//! The mutating and validating admission webhook server (hyper, h2, rustls).
//!
//! - [`review`]: pure AdmissionReview v1 handling (parse, rules, encode), no I/O.
//! - [`bodies`]: reader slots for request bodies still arriving (the longest-held displaced).
//! - [`server`]: the admission service and the plain ops router.
//! - [`listener`]: the admission service's TLS listener, its connections' bounds, HTTP/1.1 by
//!   hyper, and the drain on shutdown.
//! - [`http2`]: HTTP/2 admission connections, served on the `h2` crate.
//! - [`quota`]: the charge of a SmolVM's write to its namespace's ResourceQuotas (V15).
//! - [`state`]: policy handle, SmolVMNode catalog over a reflector store, readiness.
//! - [`reload`]: policy and certificate file reloading.
//! - [`metrics`]: Prometheus metrics.
//! - [`cli`]: the command-line flags.
//!
//! The benchmark tools and the tests' HTTPS client are in `smolvm-webhook-bench`, never shipped.

pub mod bodies;
pub mod cli;
pub mod error;
pub mod http2;
pub mod listener;
pub mod metrics;
pub mod quota;
pub mod reload;
pub mod review;
pub mod server;
pub mod state;

pub use error::{Error, Result};
