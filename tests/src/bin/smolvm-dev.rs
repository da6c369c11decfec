//! `make dev`: the whole product on a local control plane (kube-apiserver + etcd, found as envtest
//! finds them), with the example SmolVM applied. Prints the kubeconfig and how to use kubectl,
//! then runs until Ctrl-C and stops everything cleanly.
//!
//! With KUBECONFIG set, `make dev` runs the operator against that cluster instead (see the
//! Makefile); this binary is the no-cluster half.

use std::{process::ExitCode, time::Duration};

use smolvm_api::{SmolVMNode, constants};
use smolvm_tests::{
    assets,
    env::{Env, Options, kubectl, repo_root},
};

fn main() -> ExitCode {
    smolvm_tests::install_crypto_provider();
    let assets = match assets::find() {
        Ok(a) => a,
        Err(reason) => {
            eprintln!("smolvm-dev: {reason}");
            eprintln!(
                "  kube-apiserver and etcd are found through TEST_ASSET_KUBE_APISERVER / TEST_ASSET_ETCD,\n  \
                 the directory KUBEBUILDER_ASSETS, or PATH. On a machine with internet access,\n  \
                 `make envtest` fetches pinned, checksummed binaries; or set KUBECONFIG to use a cluster."
            );
            return ExitCode::from(2);
        }
    };
    // Everything runs on this thread: the children die with it (PR_SET_PDEATHSIG).
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("smolvm-dev: cannot build the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(assets)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smolvm-dev: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The local node's name (the e2e tier's long, EKS-like name would only puzzle a newcomer).
const DEV_NODE: &str = "dev-node";

async fn run(assets: assets::Assets) -> anyhow::Result<()> {
    let bins = assets::operator_bins()?;
    let dir = tempfile::Builder::new().prefix("smolvm-dev-").tempdir()?;
    eprintln!("smolvm-dev: starting etcd, kube-apiserver, the webhook, the controller and a runtime agent…");
    // The guest boot check stays on, as in a real install: where no guest boots (these
    // development machines), the node takes no VM and the example waits, saying why.
    let options = Options {
        canary: true,
        node: DEV_NODE,
        ..Options::default()
    };
    let env = Env::start(&assets, bins, dir.path(), options).await?;
    let example = repo_root().join("deploy/examples/alpine.yaml");
    let out = kubectl(
        &env.plane.admin_kubeconfig,
        &["apply", "-f", &example.display().to_string()],
        None,
    )?;
    let applied = String::from_utf8_lossy(if out.status.success() { &out.stdout } else { &out.stderr });
    let kubeconfig = env.plane.admin_kubeconfig.display();
    println!(
        "\nsmolvm-operator is up on a local control plane ({}).\n\n\
         \x20 export KUBECONFIG={kubeconfig}\n\
         \x20 kubectl get smolvms,smolvmnodes        # short names: svm, svmn\n\
         \x20 kubectl describe svm alpine             # conditions and events explain every step\n\
         \x20 kubectl explain smolvm.spec\n\
         \x20 {} logs alpine    # its log through the access API; `make plugin` makes it `kubectl smolvm`\n\n\
         example: {}\
         logs:    {}/*.log\n\n\
         Ctrl-C stops everything and removes {}.",
        env.plane.url,
        env.bins.plugin.display(),
        applied.trim_end().to_string() + "\n",
        dir.path().display(),
        dir.path().display(),
    );
    tokio::select! {
        stopped = tokio::signal::ctrl_c() => stopped?,
        () = tell_guest_bootable(&env) => tokio::signal::ctrl_c().await?,
    }
    eprintln!("\nsmolvm-dev: stopping…");
    drop(env);
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

/// Waits for the node's guest boot check and says, in one line, what it found when no guest
/// boots here (the example then waits unplaced).
async fn tell_guest_bootable(env: &Env) {
    let Ok(client) = env.admin().await else { return };
    let nodes: kube::Api<SmolVMNode> = kube::Api::all(client);
    loop {
        let guest = nodes.get_opt(DEV_NODE).await.ok().flatten().and_then(|n| {
            n.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == constants::condition::GUEST_BOOTABLE && c.status != "Unknown")
        });
        match guest {
            Some(c) if c.status == "False" => {
                println!(
                    "\nnote: node {DEV_NODE} cannot boot guests ({}), so the example waits unplaced; `kubectl describe svmn {DEV_NODE}` says why, and docs/operations.md (\"Nodes that cannot boot guests\") how to fix it.",
                    c.reason
                );
                return;
            }
            Some(_) => {
                println!("\nnode {DEV_NODE}: a canary guest booted; VMs run here.");
                return;
            }
            None => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
}
