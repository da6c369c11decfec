//! Finding kube-apiserver and etcd the way envtest does: `TEST_ASSET_KUBE_APISERVER` and
//! `TEST_ASSET_ETCD` first, then the directory `KUBEBUILDER_ASSETS`, then `PATH`, then
//! `/usr/local/kubebuilder/bin`. And finding smolvm: its environment when exported, else what
//! `.ci/install-smolvm.sh` installs (or finds installed) and prints.

use std::path::{Path, PathBuf};

/// What every e2e test prints when there is no kube-apiserver to run against.
pub const SKIP_NO_APISERVER: &str = "skipped: no kube-apiserver (set KUBEBUILDER_ASSETS)";
/// What every e2e test prints when there is no etcd.
pub const SKIP_NO_ETCD: &str =
    "skipped: no etcd (set KUBEBUILDER_ASSETS or TEST_ASSET_ETCD, or install Debian's etcd-server)";

/// The control plane binaries.
#[derive(Debug, Clone)]
pub struct Assets {
    /// kube-apiserver.
    pub kube_apiserver: PathBuf,
    /// etcd.
    pub etcd: PathBuf,
}

/// Where a binary was looked for, in envtest's order.
fn locate(override_var: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(override_var).map(PathBuf::from) {
        return is_executable(&path).then_some(path);
    }
    if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from) {
        let path = dir.join(name);
        return is_executable(&path).then_some(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([Path::new("/usr/local/kubebuilder/bin").join(name)])
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The binaries of a whole node for the cluster tier (`make cluster-e2e`), found as envtest finds
/// its own: `TEST_ASSET_<NAME>` (upper case, `-` as `_`), then `KUBEBUILDER_ASSETS`, then `PATH`.
#[derive(Debug, Clone)]
pub struct ClusterAssets {
    /// kube-apiserver and etcd.
    pub plane: Assets,
    /// kube-controller-manager.
    pub controller_manager: PathBuf,
    /// kube-scheduler.
    pub scheduler: PathBuf,
    /// kubelet.
    pub kubelet: PathBuf,
    /// kube-proxy.
    pub kube_proxy: PathBuf,
}

/// Finds the node's Kubernetes binaries; `Err` is the line to print when skipping.
pub fn find_cluster() -> Result<ClusterAssets, String> {
    let plane = find().map_err(str::to_string)?;
    let one = |name: &str| {
        let var = format!("TEST_ASSET_{}", name.to_uppercase().replace('-', "_"));
        locate(&var, name).ok_or_else(|| {
            format!("skipped: no {name} (set KUBEBUILDER_ASSETS to a directory holding the Kubernetes node binaries, or {var})")
        })
    };
    Ok(ClusterAssets {
        controller_manager: one("kube-controller-manager")?,
        scheduler: one("kube-scheduler")?,
        kubelet: one("kubelet")?,
        kube_proxy: one("kube-proxy")?,
        plane,
    })
}

/// Finds `name` on `PATH` (and the system directories a root shell has).
pub fn on_path(name: &str) -> Option<PathBuf> {
    let dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    dirs.into_iter()
        .chain(
            [
                "/usr/local/sbin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/bin",
                "/sbin",
                "/bin",
            ]
            .map(PathBuf::from),
        )
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// Finds both binaries; `Err` is the line to print when skipping.
pub fn find() -> Result<Assets, &'static str> {
    let kube_apiserver = locate("TEST_ASSET_KUBE_APISERVER", "kube-apiserver").ok_or(SKIP_NO_APISERVER)?;
    let etcd = locate("TEST_ASSET_ETCD", "etcd").ok_or(SKIP_NO_ETCD)?;
    Ok(Assets { kube_apiserver, etcd })
}

/// The operator's own binaries, built by `cargo build --bins` next to the running executable.
#[derive(Debug, Clone)]
pub struct OperatorBins {
    /// smolvm-webhook.
    pub webhook: PathBuf,
    /// smolvm-controller.
    pub controller: PathBuf,
    /// smolvm-runtime.
    pub runtime: PathBuf,
    /// kubectl-smolvm, the kubectl plugin.
    pub plugin: PathBuf,
}

/// Finds the operator binaries in the target directory of the running test or dev binary.
pub fn operator_bins() -> anyhow::Result<OperatorBins> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    let mut dirs = Vec::new();
    if let Some(parent) = exe.parent() {
        dirs.push(parent.to_path_buf());
        if let Some(grand) = parent.parent() {
            dirs.push(grand.to_path_buf());
        }
    }
    let find = |name: &str| -> anyhow::Result<PathBuf> {
        dirs.iter()
            .map(|d| d.join(name))
            .find(|p| is_executable(p))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{name} is not built next to {}; run `cargo build --bins` first (`make e2e` and `make dev` do)",
                    exe.display()
                )
            })
    };
    Ok(OperatorBins {
        webhook: find("smolvm-webhook")?,
        controller: find("smolvm-controller")?,
        runtime: find("smolvm-runtime")?,
        plugin: find("kubectl-smolvm")?,
    })
}

/// smolvm's environment for the runtime: the `SMOLVM_*` variables of this process when
/// `SMOLVM_BIN` is among them (`make e2e` evaluates `.ci/install-smolvm.sh`), else the ones that
/// script prints, run once per test binary (it installs the pinned smolvm, or finds it
/// installed). The runtime's own settings (`SMOLVM_RUNTIME_*`) are never passed on.
pub fn smolvm_env() -> anyhow::Result<Vec<(String, String)>> {
    static INSTALLED: std::sync::OnceLock<Result<Vec<(String, String)>, String>> = std::sync::OnceLock::new();
    let exported: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("SMOLVM_") && !k.starts_with("SMOLVM_RUNTIME_"))
        .collect();
    let vars = if exported.iter().any(|(k, _)| k == "SMOLVM_BIN") {
        exported
    } else {
        let installed = INSTALLED
            .get_or_init(install_smolvm)
            .clone()
            .map_err(anyhow::Error::msg)?;
        // What the environment sets and the script does not print (SMOLVM_VM_UID_DROP…) stays.
        let mut vars = installed.clone();
        vars.extend(
            exported
                .into_iter()
                .filter(|(k, _)| !installed.iter().any(|(name, _)| name == k)),
        );
        vars
    };
    let bin = vars
        .iter()
        .find(|(k, _)| k == "SMOLVM_BIN")
        .map(|(_, v)| PathBuf::from(v))
        .ok_or_else(|| anyhow::anyhow!(".ci/install-smolvm.sh printed no SMOLVM_BIN"))?;
    if !bin.is_file() {
        anyhow::bail!("SMOLVM_BIN {} is not a file", bin.display());
    }
    Ok(vars)
}

/// Runs `.ci/install-smolvm.sh` and reads the `export NAME=VALUE` lines it prints.
fn install_smolvm() -> Result<Vec<(String, String)>, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/install-smolvm.sh");
    eprintln!(
        "SMOLVM_BIN is not set; finding or installing smolvm with {}",
        script.display()
    );
    let output = std::process::Command::new("bash")
        .arg(&script)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|error| format!("cannot run {}: {error}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}); set SMOLVM_BIN, or run `eval \"$(bash .ci/install-smolvm.sh)\"` to see why",
            script.display(),
            output.status
        ));
    }
    smolvm_testkit::node::parse_exports(&String::from_utf8_lossy(&output.stdout))
}

/// The `main` of a benchmark on a real control plane: installs the crypto provider, finds
/// kube-apiserver and etcd (else prints `<name> benchmark skipped: …` and ends well), and runs
/// `run` on `runtime` (built with every driver enabled) to its end. Children are spawned only
/// from the `block_on` future, which runs on this thread, so they die with it
/// (PR_SET_PDEATHSIG).
pub fn bench_main<F, Fut>(name: &str, mut runtime: tokio::runtime::Builder, run: F) -> anyhow::Result<()>
where
    F: FnOnce(Assets) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    crate::install_crypto_provider();
    let assets = match find() {
        Ok(a) => a,
        Err(reason) => {
            println!("{name} benchmark {reason}");
            return Ok(());
        }
    };
    runtime.enable_all().build()?.block_on(run(assets))
}
