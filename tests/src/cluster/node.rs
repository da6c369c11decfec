//! One real Kubernetes node, started by the harness's inner process inside the sandbox: etcd,
//! kube-apiserver (Node and RBAC authorization, NodeRestriction, aggregation configured),
//! kube-controller-manager, kube-scheduler, containerd (with runc and a CNI bridge), the kubelet
//! and kube-proxy (iptables). Certificates and keys are made by rcgen; components authenticate
//! with tokens from a static token file, the kubelet serves a certificate from the cluster CA that
//! the API server verifies. What CLUSTER.md records about these machines is applied here
//! (`restrict_oom_score_adj`, `failCgroupV1: false`, relaxed eviction, a non-loopback node IP).

use std::{
    net::{IpAddr, Ipv4Addr},
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use k8s_openapi::api::{core::v1::Node as KubeNode, rbac::v1::ClusterRoleBinding};
use kube::{Api, Client, api::PostParams};
use serde_json::json;
use smolvm_certs::CertificateAuthority;

use super::{
    CNI_BIN_DIR, HOST_PATHS, KUBELET_ROOT, NODE_IP, NODE_NAME, PAUSE_IMAGE, POD_CIDR, SERVICE_CIDR, host_tool,
};
use crate::{
    assets::ClusterAssets,
    controlplane::{client_from, hex_token, write_kubeconfig, write_private},
    process::Proc,
};

/// The API server's port on the node.
pub const APISERVER_PORT: u16 = 6443;
/// How long the node may take to report Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// The kubelet sets these kernel tunables when they differ from what it wants, and they are
/// global: inside the sandbox each one reads as the kubelet wants (a file bind-mounted over it),
/// so the host's values are never touched.
pub const KUBELET_TUNABLES: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// The node, stopped in reverse order of start when dropped.
pub struct Node {
    /// The work directory (logs, state, certificates, kubeconfigs).
    pub dir: PathBuf,
    /// The API server's URL.
    pub url: String,
    /// A cluster admin's kubeconfig.
    pub admin_kubeconfig: PathBuf,
    /// containerd's socket.
    pub containerd_socket: PathBuf,
    admin: tokio::sync::OnceCell<Client>,
    /// The components in the order they started; they stop in reverse.
    procs: Vec<Proc>,
}

impl Drop for Node {
    fn drop(&mut self) {
        while let Some(mut proc) = self.procs.pop() {
            proc.terminate(Duration::from_secs(10));
        }
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("dir", &self.dir)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts the whole node under `dir` (inside the sandbox), imports `images` (OCI archives)
    /// into containerd, and waits until the Node is Ready.
    pub async fn start(
        assets: &ClusterAssets,
        dir: &Path,
        cgroup_root: &str,
        images: &[PathBuf],
    ) -> anyhow::Result<Self> {
        isolate_host_paths(dir)?;
        sysctl("net/ipv4/ip_forward", "1")?;
        // Bridged pod traffic must pass kube-proxy's iptables rules (per network namespace).
        let _ = sysctl("net/bridge/bridge-nf-call-iptables", "1");

        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki)?;
        let ca = CertificateAuthority::generate("smolvm-cluster-e2e-ca", Duration::from_secs(7 * 24 * 3600))?;
        let node_ip: IpAddr = NODE_IP.parse()?;
        let service_ip = first_service_ip()?;
        let serving = ca.issue_server(
            &[
                "kubernetes".to_string(),
                "kubernetes.default".to_string(),
                "kubernetes.default.svc".to_string(),
                "kubernetes.default.svc.cluster.local".to_string(),
                "localhost".to_string(),
            ],
            &[node_ip, IpAddr::V4(Ipv4Addr::LOCALHOST), service_ip],
            Duration::from_secs(7 * 24 * 3600),
        )?;
        let kubelet_serving =
            ca.issue_server(&[NODE_NAME.to_string()], &[node_ip], Duration::from_secs(7 * 24 * 3600))?;
        let kubelet_client = ca.issue_client("kube-apiserver-kubelet-client", Duration::from_secs(7 * 24 * 3600))?;
        let front_proxy_ca =
            CertificateAuthority::generate("smolvm-cluster-e2e-front-proxy-ca", Duration::from_secs(7 * 24 * 3600))?;
        let front_proxy_client =
            front_proxy_ca.issue_client("front-proxy-client", Duration::from_secs(7 * 24 * 3600))?;
        let sa_key = rcgen::KeyPair::generate().context("ServiceAccount signing key")?;
        for (name, text) in [
            ("ca.crt", ca.cert_pem()),
            ("ca.key", ca.key_pem()),
            ("apiserver.crt", serving.cert_pem.as_str()),
            ("apiserver.key", serving.key_pem.as_str()),
            ("kubelet.crt", kubelet_serving.cert_pem.as_str()),
            ("kubelet.key", kubelet_serving.key_pem.as_str()),
            ("apiserver-kubelet-client.crt", kubelet_client.cert_pem.as_str()),
            ("apiserver-kubelet-client.key", kubelet_client.key_pem.as_str()),
            ("front-proxy-ca.crt", front_proxy_ca.cert_pem()),
            ("front-proxy-client.crt", front_proxy_client.cert_pem.as_str()),
            ("front-proxy-client.key", front_proxy_client.key_pem.as_str()),
        ] {
            write_private(&pki.join(name), text)?;
        }
        write_private(&pki.join("sa.key"), &sa_key.serialize_pem())?;
        write_private(&pki.join("sa.pub"), &sa_key.public_key_pem())?;

        // Every component authenticates with a token; the usernames and groups are the ones
        // Kubernetes' bootstrap RBAC and the Node authorizer expect.
        let url = format!("https://{NODE_IP}:{APISERVER_PORT}");
        let mut tokens = String::new();
        let mut kubeconfigs = std::collections::BTreeMap::new();
        for (file, user, groups) in [
            ("admin", "cluster-e2e-admin", "system:masters"),
            ("kubelet", &*format!("system:node:{NODE_NAME}"), "system:nodes"),
            ("controller-manager", "system:kube-controller-manager", ""),
            ("scheduler", "system:kube-scheduler", ""),
            ("kube-proxy", "system:kube-proxy", ""),
        ] {
            let token = hex_token()?;
            tokens.push_str(&format!("{token},{user},{file},\"{groups}\"\n"));
            let path = dir.join(format!("kubeconfig-{file}"));
            write_kubeconfig(&path, &url, ca.cert_pem(), user, &token)?;
            kubeconfigs.insert(file, path);
        }
        write_private(&pki.join("tokens.csv"), &tokens)?;
        let kubeconfig = |name: &str| kubeconfigs[name].display().to_string();

        let etcd = Proc::spawn(
            "etcd",
            &assets.plane.etcd,
            [
                "--name=node".to_string(),
                format!("--data-dir={}", dir.join("etcd").display()),
                "--listen-client-urls=http://127.0.0.1:2379".to_string(),
                "--advertise-client-urls=http://127.0.0.1:2379".to_string(),
                "--listen-peer-urls=http://127.0.0.1:2380".to_string(),
                "--initial-advertise-peer-urls=http://127.0.0.1:2380".to_string(),
                "--initial-cluster=node=http://127.0.0.1:2380".to_string(),
                "--listen-metrics-urls=http://127.0.0.1:2381".to_string(),
                "--log-level=warn".to_string(),
                "--logger=zap".to_string(),
            ],
            &[("ETCD_UNSUPPORTED_ARCH".to_string(), std::env::consts::ARCH.to_string())],
            &dir.join("etcd.log"),
        )?;
        let p = |name: &str| pki.join(name).display().to_string();
        let apiserver = Proc::spawn(
            "kube-apiserver",
            &assets.plane.kube_apiserver,
            [
                "--bind-address=0.0.0.0".to_string(),
                format!("--advertise-address={NODE_IP}"),
                format!("--secure-port={APISERVER_PORT}"),
                "--etcd-servers=http://127.0.0.1:2379".to_string(),
                format!("--cert-dir={}", dir.join("apiserver-certs").display()),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                format!("--token-auth-file={}", p("tokens.csv")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--authorization-mode=Node,RBAC".to_string(),
                "--enable-admission-plugins=NodeRestriction".to_string(),
                // The runtime DaemonSet is privileged (it opens /dev/kvm).
                "--allow-privileged=true".to_string(),
                format!("--kubelet-client-certificate={}", p("apiserver-kubelet-client.crt")),
                format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
                format!("--kubelet-certificate-authority={}", p("ca.crt")),
                "--kubelet-preferred-address-types=InternalIP".to_string(),
                // Aggregation (APIServices) and webhooks reach their Services through endpoints.
                "--enable-aggregator-routing=true".to_string(),
                format!("--requestheader-client-ca-file={}", p("front-proxy-ca.crt")),
                "--requestheader-allowed-names=front-proxy-client".to_string(),
                "--requestheader-username-headers=X-Remote-User".to_string(),
                "--requestheader-group-headers=X-Remote-Group".to_string(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
                format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
                format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
            ],
            &[],
            &dir.join("kube-apiserver.log"),
        )?;
        let admin_kubeconfig = kubeconfigs["admin"].clone();
        let mut etcd = etcd;
        let mut apiserver = apiserver;
        wait_apiserver(&admin_kubeconfig, &mut [&mut etcd, &mut apiserver]).await?;
        // The API server calls the kubelet (logs, exec) as this user; the kubelet asks the API
        // server whether it may (webhook authorization).
        let bindings: Api<ClusterRoleBinding> = Api::all(client_from(&admin_kubeconfig).await?);
        bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "cluster-e2e:apiserver-kubelet-client"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kube-apiserver-kubelet-client"}],
                }))?,
            )
            .await
            .context("binding the API server's kubelet client to system:kubelet-api-admin")?;

        let controller_manager = Proc::spawn(
            "kube-controller-manager",
            &assets.controller_manager,
            [
                format!("--kubeconfig={}", kubeconfig("controller-manager")),
                format!("--authentication-kubeconfig={}", kubeconfig("controller-manager")),
                format!("--authorization-kubeconfig={}", kubeconfig("controller-manager")),
                "--bind-address=127.0.0.1".to_string(),
                "--leader-elect=false".to_string(),
                "--use-service-account-credentials=true".to_string(),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                format!("--cluster-signing-cert-file={}", p("ca.crt")),
                format!("--cluster-signing-key-file={}", p("ca.key")),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            ],
            &[],
            &dir.join("kube-controller-manager.log"),
        )?;
        let scheduler = Proc::spawn(
            "kube-scheduler",
            &assets.scheduler,
            [
                format!("--kubeconfig={}", kubeconfig("scheduler")),
                format!("--authentication-kubeconfig={}", kubeconfig("scheduler")),
                format!("--authorization-kubeconfig={}", kubeconfig("scheduler")),
                "--bind-address=127.0.0.1".to_string(),
                "--leader-elect=false".to_string(),
            ],
            &[],
            &dir.join("kube-scheduler.log"),
        )?;

        let containerd_dir = dir.join("containerd");
        let cni_conf_dir = dir.join("cni/net.d");
        std::fs::create_dir_all(&cni_conf_dir)?;
        write_private(
            &cni_conf_dir.join("10-smolvm-e2e.conflist"),
            &serde_json::to_string_pretty(&cni_config(dir))?,
        )?;
        let containerd_socket = containerd_dir.join("containerd.sock");
        std::fs::create_dir_all(&containerd_dir)?;
        write_private(
            &containerd_dir.join("config.toml"),
            &containerd_config(&containerd_dir, &cni_conf_dir, &containerd_socket),
        )?;
        let containerd = Proc::spawn(
            "containerd",
            &host_tool("containerd").context("containerd is not installed")?,
            [format!("--config={}", containerd_dir.join("config.toml").display())],
            &[],
            &dir.join("containerd.log"),
        )?;
        let mut node = Self {
            dir: dir.to_path_buf(),
            url,
            admin_kubeconfig,
            containerd_socket,
            admin: tokio::sync::OnceCell::new(),
            procs: vec![etcd, apiserver, controller_manager, scheduler, containerd],
        };
        node.wait_containerd().await?;
        for image in images {
            node.import_image(image)?;
        }
        node.tag_pause()?;

        write_private(&dir.join("resolv.conf"), "")?;
        write_private(
            &dir.join("kubelet-config.yaml"),
            &serde_norway::to_string(&kubelet_config(dir, cgroup_root, &node.containerd_socket, &pki))?,
        )?;
        node.procs.push(Proc::spawn(
            "kubelet",
            &assets.kubelet,
            [
                format!("--config={}", dir.join("kubelet-config.yaml").display()),
                format!("--kubeconfig={}", kubeconfig("kubelet")),
                format!("--root-dir={KUBELET_ROOT}"),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={NODE_IP}"),
                "--v=2".to_string(),
            ],
            &[],
            &dir.join("kubelet.log"),
        )?);
        write_private(
            &dir.join("kube-proxy-config.yaml"),
            &serde_norway::to_string(&kube_proxy_config(&kubeconfigs["kube-proxy"]))?,
        )?;
        node.procs.push(Proc::spawn(
            "kube-proxy",
            &assets.kube_proxy,
            [
                format!("--config={}", dir.join("kube-proxy-config.yaml").display()),
                "--v=2".to_string(),
            ],
            &[],
            &dir.join("kube-proxy.log"),
        )?);
        node.wait_ready().await?;
        Ok(node)
    }

    /// A client acting as the cluster admin.
    pub async fn admin(&self) -> anyhow::Result<Client> {
        self.admin
            .get_or_try_init(|| client_from(&self.admin_kubeconfig))
            .await
            .cloned()
    }

    /// A cluster admin's client that answers a 429 or 503 at once: kube's clients retry those
    /// by default (up to 15 times, backing off for minutes), which hides a refusal such as a
    /// PodDisruptionBudget's.
    pub async fn admin_without_retries(&self) -> anyhow::Result<Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.admin_kubeconfig)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?;
        config.default_retry = false;
        Ok(Client::try_from(config)?)
    }

    /// Runs kubectl as the cluster admin; returns its output whatever the exit status.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
        crate::env::kubectl(&self.admin_kubeconfig, args, stdin)
    }

    /// The last lines of a component's log (`kubelet`, `containerd`, …).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        crate::process::tail(&self.dir.join(format!("{name}.log")), lines)
    }

    /// Runs `ctr` against the node's containerd, in the Kubernetes namespace.
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let bin = host_tool("ctr").context("ctr is not installed")?;
        let out = Command::new(bin)
            .arg(format!("--address={}", self.containerd_socket.display()))
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .context("running ctr")?;
        if !out.status.success() {
            bail!(
                "ctr {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn import_image(&self, archive: &Path) -> anyhow::Result<()> {
        let path = archive.display().to_string();
        self.ctr(&["images", "import", "--no-unpack=false", &path])
            .or_else(|_| self.ctr(&["images", "import", &path]))
            .map(drop)
            .with_context(|| format!("importing {path}"))
    }

    /// The pause image is referred to by name in containerd's configuration; make sure it is
    /// there under exactly that name.
    fn tag_pause(&self) -> anyhow::Result<()> {
        let images = self.ctr(&["images", "list", "--quiet"])?;
        if !images.lines().any(|l| l.trim() == PAUSE_IMAGE) {
            bail!("the pause image {PAUSE_IMAGE} is not in containerd after the import; it has:\n{images}");
        }
        Ok(())
    }

    /// The first component that exited, with the end of its log.
    fn exited(&mut self) -> Option<String> {
        self.procs.iter_mut().find_map(|p| {
            p.exited()
                .map(|status| format!("{} exited ({status}):\n{}", p.name(), p.log_tail(40)))
        })
    }

    async fn wait_containerd(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        while !self.containerd_socket.exists() || self.ctr(&["version"]).is_err() {
            if let Some(status) = self.exited() {
                bail!("{status}");
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!(
                    "containerd did not answer within 30 s:\n{}",
                    self.log_tail("containerd", 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let nodes: Api<KubeNode> = Api::all(self.admin().await?);
        let started = Instant::now();
        loop {
            if let Ok(Some(node)) = nodes.get_opt(NODE_NAME).await {
                let ready = node
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if ready {
                    return Ok(());
                }
            }
            if let Some(status) = self.exited() {
                bail!("{status}");
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!(
                    "node {NODE_NAME} not Ready after {READY_TIMEOUT:?}; kubelet log:\n{}",
                    self.log_tail("kubelet", 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

async fn wait_apiserver(kubeconfig: &Path, procs: &mut [&mut Proc]) -> anyhow::Result<()> {
    let client = client_from(kubeconfig).await?;
    let started = Instant::now();
    loop {
        let req = http::Request::get("/readyz").body(Vec::new())?;
        if let Ok(body) = client.request_text(req).await
            && body.trim() == "ok"
        {
            return Ok(());
        }
        for proc in procs.iter_mut() {
            if let Some(status) = proc.exited() {
                bail!("{} exited ({status}):\n{}", proc.name(), proc.log_tail(30));
            }
        }
        if started.elapsed() > Duration::from_secs(90) {
            bail!("kube-apiserver not ready after 90 s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The first address of the Service range: the `kubernetes` Service's ClusterIP.
pub fn first_service_ip() -> anyhow::Result<IpAddr> {
    let (base, _) = SERVICE_CIDR.split_once('/').context("SERVICE_CIDR has no prefix")?;
    let base: Ipv4Addr = base.parse()?;
    Ok(IpAddr::V4(Ipv4Addr::from(u32::from(base) + 1)))
}

/// Inside the sandbox's mount namespace: each of [`HOST_PATHS`] becomes a directory of the run,
/// and each kernel tunable the kubelet would set reads as it wants.
fn isolate_host_paths(dir: &Path) -> anyhow::Result<()> {
    let host = dir.join("host");
    for path in HOST_PATHS {
        let source = host.join(path.trim_start_matches('/').replace('/', "-"));
        std::fs::create_dir_all(&source)?;
        bind_mount(&source, Path::new(path))?;
    }
    make_shared(Path::new(KUBELET_ROOT))?;
    let tunables = dir.join("tunables");
    std::fs::create_dir_all(&tunables)?;
    for (name, wanted) in KUBELET_TUNABLES {
        let target = Path::new("/proc/sys").join(name);
        let current = std::fs::read_to_string(&target).unwrap_or_default();
        if current.trim() == *wanted {
            continue;
        }
        let file = tunables.join(name.replace('/', "."));
        std::fs::write(&file, format!("{wanted}\n"))?;
        bind_mount(&file, &target)?;
    }
    Ok(())
}

/// Makes the mount at `target` (and those below it) shared, so that mounts made under it later
/// propagate to its bind mounts with HostToContainer (CLUSTER.md). Inside the sandbox's mount
/// namespace only, whose root is a slave of the host's: nothing reaches the host.
fn make_shared(target: &Path) -> anyhow::Result<()> {
    let dst = std::ffi::CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: mount(2) changing propagation only, on a NUL-terminated path we own.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_SHARED | libc::MS_REC,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "making {} a shared mount: {}",
            target.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn bind_mount(source: &Path, target: &Path) -> anyhow::Result<()> {
    let src = std::ffi::CString::new(source.as_os_str().as_bytes())?;
    let dst = std::ffi::CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: mount(2) with NUL-terminated paths we own; only in the sandbox's mount namespace.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "bind-mounting {} on {}: {}",
            source.display(),
            target.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Sets a sysctl of the sandbox's network namespace (or fails).
fn sysctl(name: &str, value: &str) -> anyhow::Result<()> {
    std::fs::write(Path::new("/proc/sys").join(name), value).with_context(|| format!("setting {name}={value}"))
}

/// A bridge network with host-local addresses and portmap, as CLUSTER.md verified.
pub fn cni_config(dir: &Path) -> serde_json::Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "smolvm-e2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni-smolvm0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": dir.join("cni/ipam").display().to_string(),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
}

/// containerd 1.6's configuration: its own root, state and socket under the run's directory,
/// runc without systemd cgroups, and the OOM score restriction these machines need.
pub fn containerd_config(dir: &Path, cni_conf_dir: &Path, socket: &Path) -> String {
    let d = |name: &str| dir.join(name).display().to_string();
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # These machines withhold CAP_SYS_RESOURCE: the kubelet's negative OOM scores would fail
  # every sandbox (CLUSTER.md).
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"#,
        root = d("root"),
        state = d("state"),
        socket = socket.display(),
        opt = d("opt"),
        pause = PAUSE_IMAGE,
        runc = d("runc"),
        cni_bin = CNI_BIN_DIR,
        cni_conf = cni_conf_dir.display(),
    )
}

/// The kubelet's configuration, with what these machines need (CLUSTER.md).
pub fn kubelet_config(dir: &Path, cgroup_root: &str, containerd_socket: &Path, pki: &Path) -> serde_json::Value {
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": pki.join("ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": pki.join("kubelet.crt"),
        "tlsPrivateKeyFile": pki.join("kubelet.key"),
        "containerRuntimeEndpoint": format!("unix://{}", containerd_socket.display()),
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "cgroupsPerQOS": true,
        "failCgroupV1": false,
        "failSwapOn": false,
        "protectKernelDefaults": false,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "podLogsDir": dir.join("pod-logs"),
        "resolvConf": dir.join("resolv.conf"),
        "clusterDomain": "cluster.local",
        "serializeImagePulls": false,
        "registerNode": true,
        "staticPodPath": "",
        "makeIPTablesUtilChains": true,
    })
}

/// kube-proxy in iptables mode; it leaves the host's conntrack limits alone.
pub fn kube_proxy_config(kubeconfig: &Path) -> serde_json::Value {
    json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": kubeconfig},
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "clusterCIDR": POD_CIDR,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(cidr: &str) -> (u32, u32) {
        let (base, prefix) = cidr.split_once('/').expect("a CIDR");
        let base = u32::from(base.parse::<Ipv4Addr>().expect("an IPv4 address"));
        let mask = u32::MAX << (32 - prefix.parse::<u32>().expect("a prefix length"));
        (base & mask, mask)
    }

    #[test]
    fn the_node_pod_and_service_networks_do_not_overlap() {
        let node = format!("{NODE_IP}/{}", super::super::NODE_PREFIX);
        let nets = [net(&node), net(POD_CIDR), net(SERVICE_CIDR)];
        for (i, a) in nets.iter().enumerate() {
            for b in &nets[i + 1..] {
                let mask = a.1 & b.1;
                assert_ne!(a.0 & mask, b.0 & mask, "{a:?} overlaps {b:?}");
            }
        }
        assert_eq!(first_service_ip().ok(), Some(IpAddr::V4(Ipv4Addr::new(10, 242, 0, 1))));
    }

    #[test]
    fn the_node_is_configured_for_these_machines() {
        let dir = Path::new("/w");
        let kubelet = kubelet_config(dir, "/smolvm-ce2e-1", Path::new("/w/c.sock"), Path::new("/w/pki"));
        for (pointer, want) in [
            ("/failCgroupV1", json!(false)),
            ("/cgroupDriver", json!("cgroupfs")),
            ("/cgroupRoot", json!("/smolvm-ce2e-1")),
            ("/failSwapOn", json!(false)),
            ("/authentication/anonymous/enabled", json!(false)),
            ("/authorization/mode", json!("Webhook")),
            ("/readOnlyPort", json!(0)),
            ("/address", json!(NODE_IP)),
        ] {
            assert_eq!(kubelet.pointer(pointer), Some(&want), "kubelet {pointer}");
        }
        let containerd = containerd_config(dir, Path::new("/w/net.d"), Path::new("/w/c.sock"));
        for line in [
            "restrict_oom_score_adj = true",
            "SystemdCgroup = false",
            "address = \"/w/c.sock\"",
            "root = \"/w/root\"",
            "state = \"/w/state\"",
        ] {
            assert!(
                containerd.lines().any(|l| l.trim() == line),
                "containerd config lacks {line}"
            );
        }
        let cni = cni_config(dir);
        assert_eq!(cni.pointer("/plugins/0/ipam/dataDir"), Some(&json!("/w/cni/ipam")));
        assert_eq!(cni.pointer("/plugins/1/type"), Some(&json!("portmap")));
        let proxy = kube_proxy_config(Path::new("/w/kubeconfig"));
        assert_eq!(
            proxy.pointer("/conntrack/maxPerCore"),
            Some(&json!(0)),
            "kube-proxy leaves the host's conntrack limit alone"
        );
    }
}
