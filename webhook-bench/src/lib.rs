//! The webhook's benchmark tools, kept out of the shipped `smolvm-webhook` crate:
//!
//! - [`client`]: an HTTPS client (tokio-rustls + hyper) for the over-the-wire tests and the load
//!   generator; it verifies the server's certificate, with no way to skip it.
//! - [`support`]: the realistic AdmissionReview the benchmarks send, and the parse-and-echo floor
//!   server.
//!
//! The binaries `webhook-bench-load` and `webhook-bench-floor` are what `webhook/bench/*.sh` run;
//! `benches/handler.rs` measures the handler in process.

pub mod client;
pub mod support;
