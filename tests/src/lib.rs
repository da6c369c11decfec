//! End-to-end harness against a real kube-apiserver and etcd, following envtest's conventions
//! (`KUBEBUILDER_ASSETS`, `TEST_ASSET_KUBE_APISERVER`, `TEST_ASSET_ETCD`), and the local dev mode
//! built on it.
//!
//! - [`assets`]: finding kube-apiserver, etcd and the operator's binaries.
//! - [`cluster`]: a real Kubernetes node (containerd, kubelet, kube-proxy) in a sandbox, for
//!   the cluster tier.
//! - [`controlplane`]: etcd plus kube-apiserver on free loopback ports, certificates by rcgen.
//! - [`env`]: the whole operator on that control plane, each component its own process.
//! - [`process`]: child processes that log to files and never outlive the harness.

pub mod assets;
pub mod cluster;
pub mod controlplane;
pub mod env;
pub mod monitoring;
pub mod process;
pub mod simnodes;

/// Installs rustls' ring provider; call first in every harness `main`.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The harnesses' async runtime, on this thread: the processes they start die with it
/// (PR_SET_PDEATHSIG). `Err` is the exit code when it cannot be built, said on stderr.
pub fn this_thread_runtime() -> Result<tokio::runtime::Runtime, std::process::ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("cannot build the async runtime: {e}");
            std::process::ExitCode::FAILURE
        })
}
