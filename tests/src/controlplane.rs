//! A real control plane on loopback: etcd and kube-apiserver on free ports, with certificates
//! made by rcgen, a static admin token, ServiceAccount token signing, and RBAC authorization.
//! Nothing here is a double: the API server is the one a cluster runs.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};
use smolvm_certs::CertificateAuthority;

use crate::{
    assets::Assets,
    process::{Proc, free_port},
};

/// How long the API server may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The common name of the API server's front-proxy client certificate (its key and the
/// certificate are `pki/front-proxy-client.{crt,key}` under the plane's directory; tests of the
/// access API present it to prove that only the API server may speak for a user).
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// A part of the control plane, for [`ControlPlane::kill`] and [`ControlPlane::start_again`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// etcd.
    Etcd,
    /// kube-apiserver.
    ApiServer,
}

/// etcd plus kube-apiserver, stopped when dropped.
pub struct ControlPlane {
    /// The API server's URL.
    pub url: String,
    /// The cluster CA (PEM) that signed the API server's serving certificate.
    pub ca_pem: String,
    /// A kubeconfig for a cluster admin (system:masters).
    pub admin_kubeconfig: PathBuf,
    dir: PathBuf,
    /// The admin client, built once (a Client is a cheap handle onto one connection pool).
    admin: tokio::sync::OnceCell<Client>,
    // Field order is drop order: the API server stops before etcd.
    apiserver: Proc,
    etcd: Proc,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("url", &self.url)
            .field("admin_kubeconfig", &self.admin_kubeconfig)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver under `dir` and waits until the API server is ready.
    pub async fn start(assets: &Assets, dir: &Path) -> anyhow::Result<Self> {
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki)?;
        let ca = CertificateAuthority::generate("smolvm-e2e-cluster-ca", Duration::from_secs(7 * 24 * 3600))?;
        let serving = ca.issue_server(
            &["localhost".to_string(), "kubernetes.default.svc".to_string()],
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            Duration::from_secs(7 * 24 * 3600),
        )?;
        // Aggregation (the access API): the front proxy's CA and the client certificate the API
        // server presents to aggregated API servers, as kubeadm makes them.
        let front_proxy_ca =
            CertificateAuthority::generate("smolvm-e2e-front-proxy-ca", Duration::from_secs(7 * 24 * 3600))?;
        let front_proxy_client = front_proxy_ca.issue_client(FRONT_PROXY_CLIENT, Duration::from_secs(7 * 24 * 3600))?;
        write(&pki.join("front-proxy-ca.crt"), front_proxy_ca.cert_pem())?;
        write(&pki.join("front-proxy-client.crt"), &front_proxy_client.cert_pem)?;
        write_private(&pki.join("front-proxy-client.key"), &front_proxy_client.key_pem)?;
        let sa_key = rcgen::KeyPair::generate().context("ServiceAccount signing key")?;
        let admin_token = hex_token()?;
        write(&pki.join("ca.crt"), ca.cert_pem())?;
        write(&pki.join("apiserver.crt"), &serving.cert_pem)?;
        write(&pki.join("apiserver.key"), &serving.key_pem)?;
        write(&pki.join("sa.key"), &sa_key.serialize_pem())?;
        write(&pki.join("sa.pub"), &sa_key.public_key_pem())?;
        write(
            &pki.join("tokens.csv"),
            &format!("{admin_token},e2e-admin,e2e-admin,system:masters\n"),
        )?;

        let (etcd_port, peer_port, metrics_port, api_port) = (free_port()?, free_port()?, free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = Proc::spawn(
            "etcd",
            &assets.etcd,
            [
                "--name=e2e".to_string(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=e2e={peer_url}"),
                format!("--listen-metrics-urls=http://127.0.0.1:{metrics_port}"),
                "--log-level=warn".to_string(),
                "--logger=zap".to_string(),
            ],
            &[("ETCD_UNSUPPORTED_ARCH".to_string(), std::env::consts::ARCH.to_string())],
            &dir.join("etcd.log"),
        )?;
        let apiserver = Proc::spawn(
            "kube-apiserver",
            &assets.kube_apiserver,
            [
                "--bind-address=127.0.0.1".to_string(),
                "--advertise-address=127.0.0.1".to_string(),
                format!("--secure-port={api_port}"),
                format!("--etcd-servers={etcd_url}"),
                format!("--cert-dir={}", dir.join("apiserver-certs").display()),
                format!("--tls-cert-file={}", pki.join("apiserver.crt").display()),
                format!("--tls-private-key-file={}", pki.join("apiserver.key").display()),
                format!("--client-ca-file={}", pki.join("ca.crt").display()),
                format!("--token-auth-file={}", pki.join("tokens.csv").display()),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
                format!("--service-account-key-file={}", pki.join("sa.pub").display()),
                format!("--service-account-signing-key-file={}", pki.join("sa.key").display()),
                "--service-cluster-ip-range=10.0.0.0/24".to_string(),
                "--authorization-mode=RBAC".to_string(),
                // No kube-controller-manager runs: no endpoint reconciler, and the harness creates
                // the ServiceAccounts it needs itself.
                "--endpoint-reconciler-type=none".to_string(),
                "--disable-admission-plugins=ServiceAccount".to_string(),
                format!(
                    "--requestheader-client-ca-file={}",
                    pki.join("front-proxy-ca.crt").display()
                ),
                format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
                "--requestheader-username-headers=X-Remote-User".to_string(),
                "--requestheader-group-headers=X-Remote-Group".to_string(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
                format!(
                    "--proxy-client-cert-file={}",
                    pki.join("front-proxy-client.crt").display()
                ),
                format!(
                    "--proxy-client-key-file={}",
                    pki.join("front-proxy-client.key").display()
                ),
            ],
            &[],
            &dir.join("kube-apiserver.log"),
        )?;
        let url = format!("https://127.0.0.1:{api_port}");
        let admin_kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(&admin_kubeconfig, &url, ca.cert_pem(), "e2e-admin", &admin_token)?;
        let mut plane = Self {
            url,
            ca_pem: ca.cert_pem().to_string(),
            admin_kubeconfig,
            dir: dir.to_path_buf(),
            admin: tokio::sync::OnceCell::new(),
            apiserver,
            etcd,
        };
        plane.wait_ready().await?;
        Ok(plane)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let client = self.admin().await?;
        let started = Instant::now();
        loop {
            let req = http::Request::get("/readyz").body(Vec::new())?;
            match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                _ => {}
            }
            for proc in [&mut self.etcd, &mut self.apiserver] {
                if let Some(status) = proc.exited() {
                    bail!("{} exited ({status}):\n{}", proc.name(), proc.log_tail(30));
                }
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!(
                    "kube-apiserver not ready after {READY_TIMEOUT:?}:\n{}",
                    self.apiserver.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// SIGKILLs one part of the plane, as a crash would (the fault tier's restarts).
    pub fn kill(&mut self, part: Part) {
        match part {
            Part::Etcd => self.etcd.kill(),
            Part::ApiServer => self.apiserver.kill(),
        }
    }

    /// Starts a part killed by [`ControlPlane::kill`] again, on the same ports and data
    /// directory, and waits until the API server is ready.
    pub async fn start_again(&mut self, part: Part) -> anyhow::Result<()> {
        match part {
            Part::Etcd => self.etcd.respawn(&[])?,
            Part::ApiServer => self.apiserver.respawn(&[])?,
        }
        self.wait_ready().await
    }

    /// A client acting as the cluster admin.
    pub async fn admin(&self) -> anyhow::Result<Client> {
        self.admin
            .get_or_try_init(|| client_from(&self.admin_kubeconfig))
            .await
            .cloned()
    }

    /// Writes a kubeconfig for a bearer token (a ServiceAccount's) and returns its path.
    pub fn kubeconfig_for(&self, name: &str, token: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(format!("kubeconfig-{name}"));
        write_kubeconfig(&path, &self.url, &self.ca_pem, name, token)?;
        Ok(path)
    }

    /// The directory holding the logs and state.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// A client from a kubeconfig file.
pub async fn client_from(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Writes a kubeconfig for `url` (trusting `ca_pem`) that authenticates with a bearer token.
pub fn write_kubeconfig(path: &Path, url: &str, ca_pem: &str, user: &str, token: &str) -> anyhow::Result<()> {
    let ca_file = path.with_extension("ca.crt");
    write(&ca_file, ca_pem)?;
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": url, "certificate-authority": ca_file}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    });
    write(path, &serde_norway::to_string(&doc)?)
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// A random 32-byte hex token.
pub fn hex_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes a file readable only by its owner.
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    write(path, text)
}
