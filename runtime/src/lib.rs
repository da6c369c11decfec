//! The node-local runtime agent: supervises smolvm serve and serves the node API over mTLS.

pub mod activity;
pub mod agent;
pub mod canary;
pub mod cli;
pub mod error;
pub mod forward;
pub mod guards;
pub mod hold;
pub mod host;
pub mod images;
pub mod limits;
pub mod metrics;
pub mod nodeapi;
pub mod ops_port;
pub mod pools;
pub mod serving_cert;
pub mod smolvm_node;
pub mod state_files;
pub mod supervisor;
pub mod suspensions;
pub mod vmm;
pub mod volumes;
pub mod workload_records;

pub use error::{Error, Result};

/// Installs ring as rustls' process-wide crypto provider (ignored when one is installed).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
