//! `smolvm-controller`: places SmolVMs on nodes, binds them, drives the node runtimes, and keeps
//! the finalizers honest. One replica leads at a time (a coordination.k8s.io Lease). The tasks
//! and their wiring are in [`smolvm_controller::app`].

use smolvm_controller::{
    app,
    cli::{Flags, RENAMED},
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (flags, deprecated) = smolvm_kit::cli::parse::<Flags>(RENAMED);
    smolvm_kit::log::init(flags.log_format);
    smolvm_kit::cli::warn_deprecated(&deprecated);
    app::run(flags).await
}
