//! `kubectl-smolvm`: on the PATH, kubectl runs it for `kubectl smolvm …`.

use std::process::ExitCode;

use clap::Parser;
use kubectl_smolvm::{Cli, run};

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // Help and --version go to stdout and succeed; usage errors fail with 1, as kubectl's do.
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("{}", err.render());
            ExitCode::FAILURE
        }
    }
}
