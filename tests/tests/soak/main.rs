//! The fault tier's live run (`make soak`, SPEC section 7, issue 62): the whole product on a real
//! kube-apiserver and etcd while smolvm-soak's seeded workload runs and its seeded schedule of
//! faults falls, every observation checked against SPEC section 4's promises as it comes and at
//! the end. `SOAK_MINUTES` (default 3) and `SOAK_SEED` (default 62) name the run.
//!
//! - [`runner`]: the topology, the run, the verdict and the report;
//! - [`clients`]: the workload's operations, each waiting for its outcome;
//! - [`faults`]: the injector, and the time to recover from each fault;
//! - [`recorder`]: the history (watch and poll), fed to the checker;
//! - [`relay`]: the TCP relay in front of the webhook replicas and of each simulated node.
//!
//! Without kube-apiserver it prints `skipped: no kube-apiserver (set KUBEBUILDER_ASSETS)` and
//! exits 0, as the e2e tier does; it never fakes a pass.

use std::process::ExitCode;

use smolvm_soak::Config;
use smolvm_tests::assets;

mod clients;
mod faults;
mod recorder;
mod relay;
mod runner;

fn main() -> ExitCode {
    smolvm_tests::install_crypto_provider();
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e} ({})", e.reason());
            return ExitCode::FAILURE;
        }
    };
    // The plan first: a seed whose plan cannot be made is an error with or without an API server.
    if let Err(e) = runner::plan(config) {
        eprintln!("error: no plan for {}: {e} ({})", config.reproduce(), e.reason());
        return ExitCode::FAILURE;
    }
    let assets = match assets::find() {
        Ok(a) => a,
        Err(reason) => {
            println!("{reason}");
            return ExitCode::SUCCESS;
        }
    };
    let runtime = match smolvm_tests::this_thread_runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    runtime.block_on(runner::run(assets, config))
}
