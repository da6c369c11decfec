//! The whole product on a real control plane: the deployment's own CRDs, namespace,
//! ServiceAccounts, RBAC and policy (rendered from `deploy/default` by `kubectl kustomize`), the
//! webhook registered by `clientConfig.url` with a caBundle (as envtest does), the controller,
//! and a runtime agent over the real `smolvm serve`, each a separate process with its own
//! ServiceAccount token. The runtime's token is bound to a Pod on a Node, so its node claim is
//! genuine. With no kube-controller-manager, the harness creates the Node and that Pod itself.

use std::{
    future::Future,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    process::Output,
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{
            MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
        },
        authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
        core::v1::{ConfigMap, Node, Pod, Secret, ServiceAccount},
    },
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use smolvm_api::{SmolVMNode, constants};
use smolvm_certs::CertificateAuthority;

use crate::{
    assets::{Assets, OperatorBins},
    controlplane::{ControlPlane, client_from, write_private},
    process::{Proc, free_port},
};

/// The operator's namespace, as in the deployment.
pub const NAMESPACE: &str = "smolvm-system";
/// The simulated node the runtime agent claims: 69 characters, as EKS node names run, past what a
/// certificate common name (64) or a label value (63) holds, so every scenario runs on a long name.
pub const NODE: &str = "ip-192-168-101-202.ap-southeast-2.compute.internal.e2e-long-node-name";
/// The Node's `kubernetes.io/hostname` label (a label value holds at most 63 characters).
pub const NODE_HOSTNAME: &str = "ip-192-168-101-202";
/// The Node's InternalIP, as its kubelet would report it (a documentation address: nothing is
/// sent to it).
pub const NODE_INTERNAL_IP: &str = "192.0.2.202";
/// The InternalIP of a node backed by the smolvm double (a documentation address: nothing is
/// sent to it), unless its scenario gives one of its own.
pub const DOUBLE_NODE_IP: &str = "192.0.2.203";
/// The ServiceAccounts of the deployment.
pub const SA_WEBHOOK: &str = "smolvm-webhook";
/// The controller's ServiceAccount.
pub const SA_CONTROLLER: &str = "smolvm-controller";
/// The runtime's ServiceAccount.
pub const SA_RUNTIME: &str = "smolvm-runtime";

/// Knobs of a harness run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The runtime's heartbeat interval.
    pub heartbeat: Duration,
    /// The controller's heartbeat timeout (a node is unreachable after it).
    pub heartbeat_timeout: Duration,
    /// Start a runtime agent.
    pub runtime: bool,
    /// Run the agent's guest boot check. Off by default: no guest boots on these machines, so
    /// with it on the real agent's node takes no VM, and the scenarios that place VMs there
    /// need it to (the truthful-nodes scenario turns it on).
    pub canary: bool,
    /// The name of the Node the runtime agent runs on ([`NODE`] unless set).
    pub node: &'static str,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(2),
            heartbeat_timeout: Duration::from_secs(12),
            runtime: true,
            canary: false,
            node: NODE,
        }
    }
}

/// The webhook's files-mode serving certificate and its CA.
#[derive(Debug)]
pub struct WebhookTls {
    /// The CA that signed the serving certificate (the caBundle).
    pub ca: CertificateAuthority,
    /// The serving certificate file.
    pub cert: PathBuf,
    /// The serving key file.
    pub key: PathBuf,
}

impl WebhookTls {
    /// Issues a fresh serving certificate for 127.0.0.1 into the files (the webhook reloads them).
    pub fn rotate(&self) -> anyhow::Result<()> {
        let leaf = self.ca.issue_server(
            &["localhost".to_string()],
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            Duration::from_secs(24 * 3600),
        )?;
        // Key first, then the certificate: the reloader pairs them and rejects a mismatch, so a
        // half-written pair is skipped, never served.
        let tmp_key = self.key.with_extension("key.tmp");
        let tmp_cert = self.cert.with_extension("crt.tmp");
        write_private(&tmp_key, &leaf.key_pem)?;
        write_private(&tmp_cert, &leaf.cert_pem)?;
        std::fs::rename(&tmp_key, &self.key)?;
        std::fs::rename(&tmp_cert, &self.cert)?;
        Ok(())
    }
}

/// The running product.
#[derive(Debug)]
pub struct Env {
    /// The control plane.
    pub plane: ControlPlane,
    /// The operator binaries.
    pub bins: OperatorBins,
    /// Objects rendered from `deploy/default`.
    pub rendered: Vec<Value>,
    /// The webhook's TLS files.
    pub webhook_tls: WebhookTls,
    /// The webhook's HTTPS port.
    pub webhook_port: u16,
    /// The webhook process.
    pub webhook: Option<Proc>,
    /// The controller process.
    pub controller: Option<Proc>,
    /// Its leader-election identity (the Lease names the holder by it).
    pub controller_identity: Option<String>,
    /// Further controller replicas ([`Env::start_controller_replica`]), leader election among
    /// all of them and [`Env::controller`].
    pub replicas: Vec<Replica>,
    /// The runtime process.
    pub runtime: Option<Proc>,
    /// The runtime's node API port.
    pub runtime_port: u16,
    /// The controller's access API port (the APIService routes here through an ExternalName
    /// Service naming `localhost`, as nothing proxies Service addresses in this tier).
    pub access_port: u16,
    /// The policy file the webhook and controller read.
    pub policy_file: PathBuf,
    /// The options it started with.
    pub options: Options,
    smolvm_env: Vec<(String, String)>,
    controller_starts: u32,
    /// The kubelet's part for the runtime's CA volume: keeps the file in step with the ConfigMap.
    ca_sync: Option<tokio::task::JoinHandle<()>>,
    dir: PathBuf,
    /// Each component's ops address (metrics, probes), by process name.
    pub ops: std::collections::BTreeMap<&'static str, String>,
}

/// A controller replica beside [`Env::controller`].
#[derive(Debug)]
pub struct Replica {
    /// Its leader-election identity.
    pub identity: String,
    /// Its process.
    pub proc: Proc,
}

/// One runtime agent the harness runs.
struct Agent {
    /// Its node's name.
    node: String,
    /// The prefix of its state and run directories in the run's directory.
    dir: String,
    /// Its node API port.
    port: u16,
    /// The `smolvm serve` socket it attaches to instead of supervising its own.
    attach_socket: Option<PathBuf>,
    /// Further flags.
    extra: Vec<String>,
}

/// Creates a Node (kept when it exists) with the addresses a kubelet reports: the agent publishes
/// its InternalIP in its SmolVMNode.
async fn create_node_named(admin: &Client, name: &str, hostname: &str, internal_ip: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let hostname = &hostname[..hostname.len().min(63)];
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": hostname, "topology.kubernetes.io/zone": "e2e-a"}},
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let addresses = json!({"status": {"addresses": [
        {"type": "InternalIP", "address": internal_ip},
        {"type": "Hostname", "address": hostname},
    ]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&addresses))
        .await?;
    Ok(())
}

/// Copies one key of a ConfigMap to `file` whenever it changes (polled every second), writing a
/// new file and renaming it into place as the kubelet swaps a volume's contents.
async fn sync_configmap_key(
    configmaps: Api<ConfigMap>,
    name: &'static str,
    key: &'static str,
    file: PathBuf,
    mut last: String,
) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(Some(cm)) = configmaps.get_opt(name).await else {
            continue;
        };
        let Some(value) = cm.data.and_then(|mut d| d.remove(key)) else {
            continue;
        };
        if value == last {
            continue;
        }
        let tmp = file.with_extension("new");
        if write_private(&tmp, &value).is_ok() && std::fs::rename(&tmp, &file).is_ok() {
            last = value;
        }
    }
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// smolvm's environment, as `.ci/install-smolvm.sh` exports it ([`crate::assets::smolvm_env`]),
/// with the VM user drop turned off (the tests run smolvm as this user).
fn smolvm_env() -> anyhow::Result<Vec<(String, String)>> {
    Ok(crate::assets::smolvm_env()?
        .into_iter()
        .chain([("SMOLVM_VM_UID_DROP".to_string(), "off".to_string())])
        .collect())
}

/// Runs `kubectl` with a kubeconfig; returns its output whatever the exit status.
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
    use std::io::Write;
    let mut cmd = std::process::Command::new("kubectl");
    cmd.env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", kube_cache_dir(kubeconfig))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        });
    let mut child = cmd.spawn().context("running kubectl (is it installed?)")?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    Ok(child.wait_with_output()?)
}

/// Where kubectl keeps its discovery and HTTP caches for a run's kubeconfig (`KUBECACHEDIR`):
/// beside the kubeconfig, not in the user's `~/.kube/cache`.
pub fn kube_cache_dir(kubeconfig: &Path) -> PathBuf {
    kubeconfig.parent().unwrap_or_else(|| Path::new(".")).join("kube-cache")
}

/// Renders a kustomize directory with `kubectl kustomize` into JSON objects.
pub fn render(dir: &Path) -> anyhow::Result<Vec<Value>> {
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .context("running kubectl kustomize (is kubectl installed?)")?;
    if !out.status.success() {
        bail!(
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let mut objects = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(doc)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or_default()
}

/// Polls `check` until it yields a value, or fails naming `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let started = Instant::now();
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if started.elapsed() > timeout {
            return Err(match last_error {
                Some(e) => e.context(format!("timed out after {timeout:?} waiting for {what}")),
                None => anyhow!("timed out after {timeout:?} waiting for {what}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Env {
    /// Starts the control plane and the whole operator under `dir`.
    pub async fn start(assets: &Assets, bins: OperatorBins, dir: &Path, options: Options) -> anyhow::Result<Self> {
        let smolvm_env = if options.runtime { smolvm_env()? } else { Vec::new() };
        let plane = ControlPlane::start(assets, dir).await?;
        let admin = plane.admin().await?;
        let rendered = render(&repo_root().join("deploy/default"))?;

        // The deployment's CRDs, namespace, ServiceAccounts, RBAC, ConfigMaps, admission policies,
        // the holders' PriorityClass and the webhook's empty TLS Secret, as rendered.
        let install: Vec<Value> = rendered
            .iter()
            .filter(|o| {
                matches!(
                    kind(o),
                    "CustomResourceDefinition"
                        | "Namespace"
                        | "ServiceAccount"
                        | "Role"
                        | "ClusterRole"
                        | "RoleBinding"
                        | "ClusterRoleBinding"
                        | "ConfigMap"
                        | "Secret"
                        | "ValidatingAdmissionPolicy"
                        | "ValidatingAdmissionPolicyBinding"
                        | "PriorityClass"
                )
            })
            .cloned()
            .collect();
        apply(&plane.admin_kubeconfig, &install)?;
        let access_port = free_port()?;
        apply(&plane.admin_kubeconfig, &access_objects(&rendered, access_port)?)?;
        let out = kubectl(
            &plane.admin_kubeconfig,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/smolvms.vm.smolvm.dev",
                "crd/smolvmnodes.vm.smolvm.dev",
                "crd/smolvmclasses.vm.smolvm.dev",
                "crd/smolvmpools.vm.smolvm.dev",
            ],
            None,
        )?;
        if !out.status.success() {
            bail!("CRDs not established: {}", String::from_utf8_lossy(&out.stderr));
        }

        // The policy, from the deployment's ConfigMap, as the Pods would mount it.
        let policy_text = rendered
            .iter()
            .filter(|o| kind(o) == "ConfigMap")
            .find_map(|o| {
                o["data"]
                    .as_object()
                    .and_then(|d| d.iter().find(|(k, _)| k.ends_with(".yaml") && k.contains("policy")))
                    .and_then(|(_, v)| v.as_str().map(str::to_string))
            })
            .ok_or_else(|| anyhow!("deploy/default renders no ConfigMap with a policy*.yaml key"))?;
        let policy_file = dir.join("policy.yaml");
        write_private(&policy_file, &policy_text)?;

        // The webhook's serving certificate (files mode), for 127.0.0.1.
        let ca = CertificateAuthority::generate("smolvm-e2e-webhook-ca", Duration::from_secs(7 * 24 * 3600))?;
        let webhook_tls = WebhookTls {
            ca,
            cert: dir.join("webhook-tls.crt"),
            key: dir.join("webhook-tls.key"),
        };
        webhook_tls.rotate()?;

        let mut env = Self {
            plane,
            bins,
            rendered,
            webhook_tls,
            webhook_port: free_port()?,
            webhook: None,
            controller: None,
            runtime: None,
            runtime_port: free_port()?,
            access_port,
            policy_file,
            options,
            smolvm_env,
            controller_identity: None,
            replicas: Vec::new(),
            controller_starts: 0,
            ca_sync: None,
            dir: dir.to_path_buf(),
            ops: Default::default(),
        };
        env.start_webhook().await?;
        env.register_webhooks()?;
        env.start_controller().await?;
        if env.options.runtime {
            env.create_node(&admin).await?;
            env.start_runtime().await?;
        }
        Ok(env)
    }

    /// The admin client.
    pub async fn admin(&self) -> anyhow::Result<Client> {
        self.plane.admin().await
    }

    /// A client with a ServiceAccount's (unbound) token.
    pub async fn service_account_client(&self, sa: &str) -> anyhow::Result<(Client, PathBuf)> {
        let admin = self.admin().await?;
        let token = token_for(&admin, sa, None).await?;
        let path = self.plane.kubeconfig_for(sa, &token)?;
        Ok((client_from(&path).await?, path))
    }

    /// `kubectl` as the cluster admin.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
        kubectl(&self.plane.admin_kubeconfig, args, stdin)
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// Starts the webhook (files mode) and waits for /readyz.
    pub async fn start_webhook(&mut self) -> anyhow::Result<()> {
        let (proc, ops) = self.spawn_webhook(self.webhook_port).await?;
        self.webhook = Some(proc);
        self.ops.insert("smolvm-webhook", ops);
        Ok(())
    }

    /// Starts a further webhook replica serving on `port` (the same certificate files and
    /// policy) and waits for /readyz. The webhook configurations still name
    /// [`Env::webhook_port`]: something in front must spread calls over the replicas, as a
    /// Service does ([`Env::register_webhooks_at`]).
    pub async fn start_webhook_replica(&mut self, port: u16) -> anyhow::Result<Proc> {
        Ok(self.spawn_webhook(port).await?.0)
    }

    /// Starts a webhook process on `port`; returns it and its ops address once it is ready.
    async fn spawn_webhook(&mut self, port: u16) -> anyhow::Result<(Proc, String)> {
        let token = token_for(&self.admin().await?, SA_WEBHOOK, None).await?;
        let kubeconfig = self.plane.kubeconfig_for(SA_WEBHOOK, &token)?;
        let ops = free_port()?;
        let log = match port == self.webhook_port {
            true => self.log("smolvm-webhook"),
            false => self.log(&format!("smolvm-webhook-{port}")),
        };
        let mut proc = Proc::spawn(
            "smolvm-webhook",
            &self.bins.webhook,
            [
                "--listen".to_string(),
                format!("127.0.0.1:{port}"),
                "--ops-address".to_string(),
                format!("127.0.0.1:{ops}"),
                "--tls-mode=files".to_string(),
                format!("--tls-cert={}", self.webhook_tls.cert.display()),
                format!("--tls-key={}", self.webhook_tls.key.display()),
                format!("--policy={}", self.policy_file.display()),
                format!("--namespace={NAMESPACE}"),
                "--reload-interval=1s".to_string(),
            ],
            &[
                ("KUBECONFIG".into(), kubeconfig.display().to_string()),
                ("RUST_LOG".into(), "info".into()),
            ],
            &log,
        )?;
        let ops = format!("127.0.0.1:{ops}");
        wait_http_ok(&ops, "/readyz", Some(&mut proc), Duration::from_secs(60)).await?;
        Ok((proc, ops))
    }

    /// Registers the deployment's webhook configurations, pointed at the local webhook by URL.
    pub fn register_webhooks(&self) -> anyhow::Result<()> {
        self.register_webhooks_at(self.webhook_port)
    }

    /// Registers the webhook configurations pointed at `https://127.0.0.1:{port}` (a front
    /// spreading calls over several replicas, say).
    pub fn register_webhooks_at(&self, port: u16) -> anyhow::Result<()> {
        let bundle = ByteString(self.webhook_tls.ca.cert_pem().as_bytes().to_vec());
        let point = |config: &WebhookClientConfig| -> anyhow::Result<WebhookClientConfig> {
            let path = config
                .service
                .as_ref()
                .and_then(|s| s.path.clone())
                .ok_or_else(|| anyhow!("a rendered webhook has no service path"))?;
            Ok(WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{port}{path}")),
                ca_bundle: Some(bundle.clone()),
                service: None,
            })
        };
        let mut objects = Vec::new();
        for o in &self.rendered {
            match kind(o) {
                "MutatingWebhookConfiguration" => {
                    let mut m: MutatingWebhookConfiguration = serde_json::from_value(o.clone())?;
                    m.metadata.annotations = None;
                    for w in m.webhooks.iter_mut().flatten() {
                        w.client_config = point(&w.client_config)?;
                    }
                    objects.push(serde_json::to_value(&m)?);
                }
                "ValidatingWebhookConfiguration" => {
                    let mut v: ValidatingWebhookConfiguration = serde_json::from_value(o.clone())?;
                    v.metadata.annotations = None;
                    for w in v.webhooks.iter_mut().flatten() {
                        w.client_config = point(&w.client_config)?;
                    }
                    objects.push(serde_json::to_value(&v)?);
                }
                _ => {}
            }
        }
        if objects.len() != 2 {
            bail!(
                "deploy/default renders {} webhook configurations, expected 2",
                objects.len()
            );
        }
        apply(&self.plane.admin_kubeconfig, &objects)
    }

    /// Removes the webhook configurations (the API then relies on the CRDs' CEL rules alone).
    pub fn unregister_webhooks(&self) -> anyhow::Result<()> {
        for o in &self.rendered {
            let k = kind(o);
            if k.ends_with("WebhookConfiguration") {
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                let out = self.kubectl(&["delete", "--ignore-not-found", &k.to_lowercase(), name], None)?;
                if !out.status.success() {
                    bail!("deleting {k} {name}: {}", String::from_utf8_lossy(&out.stderr));
                }
            }
        }
        Ok(())
    }

    /// Starts the controller and waits until it serves /readyz.
    pub async fn start_controller(&mut self) -> anyhow::Result<()> {
        let (identity, proc, ops) = self.spawn_controller(self.access_port).await?;
        self.ops.insert("smolvm-controller", ops);
        self.controller = Some(proc);
        self.controller_identity = Some(identity);
        Ok(())
    }

    /// Starts a further controller replica (a standby while another holds the Lease) and waits
    /// until it serves /readyz; kept in [`Env::replicas`]. Returns its identity.
    pub async fn start_controller_replica(&mut self) -> anyhow::Result<String> {
        // Each replica serves the access API on its own port, as each Pod has its own address;
        // the APIService routes to the first one's.
        let (identity, proc, _) = self.spawn_controller(free_port()?).await?;
        self.replicas.push(Replica {
            identity: identity.clone(),
            proc,
        });
        Ok(identity)
    }

    /// The identity the controller's Lease names as its holder, if any.
    pub async fn leader(&self) -> anyhow::Result<Option<String>> {
        use k8s_openapi::api::coordination::v1::Lease;
        let leases: Api<Lease> = Api::namespaced(self.admin().await?, NAMESPACE);
        Ok(leases
            .get_opt(constants::FIELD_MANAGER_CONTROLLER)
            .await?
            .and_then(|l| l.spec.and_then(|s| s.holder_identity)))
    }

    /// The controller replica (the first or a further one) of `identity`.
    pub fn controller_of(&mut self, identity: &str) -> Option<&mut Proc> {
        if self.controller_identity.as_deref() == Some(identity) {
            return self.controller.as_mut();
        }
        self.replicas
            .iter_mut()
            .find(|r| r.identity == identity)
            .map(|r| &mut r.proc)
    }

    /// Starts a controller process (with a new identity) and waits until it serves /readyz (a
    /// standby is ready too; after a kill it leads once the previous holder's Lease expires).
    /// Its access API listens on `access_port`. Returns its identity, the process and its ops
    /// address.
    async fn spawn_controller(&mut self, access_port: u16) -> anyhow::Result<(String, Proc, String)> {
        let token = token_for(&self.admin().await?, SA_CONTROLLER, None).await?;
        let kubeconfig = self.plane.kubeconfig_for(SA_CONTROLLER, &token)?;
        let ops = free_port()?;
        self.controller_starts += 1;
        let identity = format!("e2e-controller-{}", self.controller_starts);
        let mut proc = Proc::spawn(
            "smolvm-controller",
            &self.bins.controller,
            [
                format!("--policy={}", self.policy_file.display()),
                format!("--ops-address=127.0.0.1:{ops}"),
                format!("--namespace={NAMESPACE}"),
                format!("--identity={identity}"),
                format!("--heartbeat-timeout={}s", self.options.heartbeat_timeout.as_secs()),
                "--resync-interval=30s".to_string(),
                // Orphan machines are collected after 10 s here (10 minutes by default).
                "--orphan-grace=10s".to_string(),
                // A quota charge whose SmolVM never comes is given back after 5 s here (30 s by
                // default).
                "--quota-charge-grace=5s".to_string(),
                // A runtime CA rotation's steps are looked at every 2 s here (30 s by default).
                "--runtime-ca-check-interval=2s".to_string(),
                format!("--access-address=127.0.0.1:{access_port}"),
                "--access-check-interval=10s".to_string(),
                // The holders' image: the placeholder the deployment's holder admission policy
                // names (deploy/base/holder), as `make deploy RUNTIME_IMG=…` would substitute it.
                "--holder-image=smolvm-runtime".to_string(),
            ],
            &[
                ("KUBECONFIG".into(), kubeconfig.display().to_string()),
                ("RUST_LOG".into(), "info,smolvm_controller=debug".into()),
            ],
            &self.log(&format!("smolvm-controller-{}", self.controller_starts)),
        )?;
        let ops = format!("127.0.0.1:{ops}");
        wait_http_ok(&ops, "/readyz", Some(&mut proc), Duration::from_secs(60)).await?;
        Ok((identity, proc, ops))
    }

    /// Kills the controller with SIGKILL (no graceful shutdown), as a crash would.
    pub fn kill_controller(&mut self) {
        if let Some(mut p) = self.controller.take() {
            p.kill();
        }
    }

    async fn create_node(&self, admin: &Client) -> anyhow::Result<()> {
        let node = self.options.node;
        // A label value holds at most 63 characters; NODE's hostname label is its first part.
        let hostname = if node == NODE { NODE_HOSTNAME } else { node };
        create_node_named(admin, node, hostname, NODE_INTERNAL_IP).await
    }

    /// Replaces the Node object with a new one of the same name (a new UID), as a reinstalled
    /// machine would appear.
    pub async fn replace_node(&self) -> anyhow::Result<String> {
        let admin = self.admin().await?;
        let nodes: Api<Node> = Api::all(admin.clone());
        let node = self.options.node;
        let old = nodes.get(node).await?.uid().unwrap_or_default();
        nodes.delete(node, &DeleteParams::default()).await?;
        eventually("the old Node to go", Duration::from_secs(30), || {
            let nodes = nodes.clone();
            async move { Ok(nodes.get_opt(node).await?.is_none().then_some(())) }
        })
        .await?;
        self.create_node(&admin).await?;
        let new = nodes.get(node).await?.uid().unwrap_or_default();
        if new == old {
            bail!("the re-created Node kept its UID {old}");
        }
        Ok(new)
    }

    /// Starts the runtime agent: a Pod on the Node for its bound token, the token and CA files
    /// (as the kubelet would mount them), then the agent; waits until its SmolVMNode is Ready.
    pub async fn start_runtime(&mut self) -> anyhow::Result<()> {
        let agent = Agent {
            node: self.options.node.to_string(),
            dir: "rt".into(),
            port: self.runtime_port,
            attach_socket: None,
            extra: vec!["--cpu-allocation-ratio=16".to_string()],
        };
        let proc = self.start_agent(&agent).await?;
        self.runtime = Some(proc);
        Ok(())
    }

    /// Starts a second node whose runtime is a TEST DOUBLE of `smolvm serve` listening on
    /// `socket` (a guest's happy path, which cannot run on these machines): its Node object,
    /// then the real agent attached to that socket with `extra` flags (its reservations, say),
    /// on a node API port of its own. Returns the agent's process (stopped when dropped); waits
    /// until its SmolVMNode is Ready.
    pub async fn start_double_node(&mut self, name: &str, socket: &Path, extra: &[&str]) -> anyhow::Result<Proc> {
        self.start_double_node_at(name, socket, DOUBLE_NODE_IP, extra).await
    }

    /// [`Env::start_double_node`] with `internal_ip` as the Node's InternalIP (where its
    /// published ports are reached: give the agent `--publish-address` with it).
    pub async fn start_double_node_at(
        &mut self,
        name: &str,
        socket: &Path,
        internal_ip: &str,
        extra: &[&str],
    ) -> anyhow::Result<Proc> {
        let admin = self.admin().await?;
        create_node_named(&admin, name, name, internal_ip).await?;
        let agent = Agent {
            node: name.to_string(),
            dir: format!("double-{name}"),
            port: free_port()?,
            attach_socket: Some(socket.to_path_buf()),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        self.start_agent(&agent).await
    }

    /// Starts testkit's smolvm double (TEST DOUBLE: no guest boots here) in this environment's
    /// directory and a node `name` whose agent runs on it with `extra` flags
    /// ([`Env::start_double_node`]); [`DoubleNodeRun::stop`] takes both down again.
    pub async fn start_on_double(&mut self, name: &str, extra: &[&str]) -> anyhow::Result<DoubleNodeRun> {
        self.start_on_double_at(name, DOUBLE_NODE_IP, extra).await
    }

    /// [`Env::start_on_double`] on a node whose InternalIP is `internal_ip`.
    pub async fn start_on_double_at(
        &mut self,
        name: &str,
        internal_ip: &str,
        extra: &[&str],
    ) -> anyhow::Result<DoubleNodeRun> {
        let socket = self.dir.join(format!("{name}.sock"));
        let double = smolvm_testkit::smolvm_double::SmolvmDouble::start(&socket)
            .await
            .context("starting the smolvm double")?;
        let agent = self.start_double_node_at(name, &socket, internal_ip, extra).await?;
        Ok(DoubleNodeRun {
            double,
            agent,
            node: name.to_string(),
        })
    }

    /// The token and runtime CA files an agent reads, as the kubelet mounts them (the CA kept in
    /// step with its ConfigMap).
    async fn agent_files(&mut self, admin: &Client) -> anyhow::Result<(PathBuf, PathBuf)> {
        // The kubelet's part: mount the token Secret (created by the controller) and the CA.
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
        let auth = eventually(
            "the controller to create the token Secret",
            Duration::from_secs(60),
            || {
                let secrets = secrets.clone();
                async move { Ok(secrets.get_opt(constants::RUNTIME_AUTH_SECRET).await?) }
            },
        )
        .await?;
        let token_bytes = auth
            .data
            .as_ref()
            .and_then(|d| d.get("token"))
            .ok_or_else(|| anyhow!("the token Secret has no `token` key"))?;
        let token_file = self.dir.join("runtime-auth-token");
        write_private(&token_file, &String::from_utf8_lossy(&token_bytes.0))?;
        let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
        let ca = eventually(
            "the controller to publish the runtime CA",
            Duration::from_secs(60),
            || {
                let configmaps = configmaps.clone();
                async move {
                    Ok(configmaps
                        .get_opt(constants::RUNTIME_CA)
                        .await?
                        .and_then(|c| c.data.and_then(|d| d.get("ca.crt").cloned())))
                }
            },
        )
        .await?;
        let ca_file = self.dir.join("runtime-client-ca.crt");
        write_private(&ca_file, &ca)?;
        // The kubelet keeps a ConfigMap volume current: a changed bundle (a CA rotation) reaches
        // the agent's file within a couple of seconds, swapped in whole.
        if let Some(task) = self.ca_sync.take() {
            task.abort();
        }
        self.ca_sync = Some(tokio::spawn(sync_configmap_key(
            configmaps.clone(),
            constants::RUNTIME_CA,
            "ca.crt",
            ca_file.clone(),
            ca,
        )));
        Ok((token_file, ca_file))
    }

    /// A kubeconfig for the runtime's ServiceAccount with a token bound to a Pod on `node`, as
    /// the DaemonSet's pod there would hold.
    async fn agent_kubeconfig(&self, admin: &Client, node: &str) -> anyhow::Result<PathBuf> {
        let pod_name = format!("smolvm-runtime-{node}");
        let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
        let pod = match pods.get_opt(&pod_name).await? {
            Some(p) => p,
            None => {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": pod_name, "labels": {"app.kubernetes.io/name": "smolvm-runtime"}},
                    "spec": {
                        "nodeName": node,
                        "serviceAccountName": SA_RUNTIME,
                        "automountServiceAccountToken": false,
                        "containers": [{"name": "runtime", "image": "smolvm-runtime"}],
                    },
                }))?;
                pods.create(&PostParams::default(), &pod).await?
            }
        };
        let token = token_for(admin, SA_RUNTIME, Some(&pod)).await?;
        // A file of its own per node: an agent restarted from its first flags (a respawn) must
        // read its own node's token, not the one the last agent started was given.
        self.plane.kubeconfig_for(&format!("{SA_RUNTIME}-{node}"), &token)
    }

    /// Starts one agent and waits until its SmolVMNode reports Ready from a heartbeat of its own.
    async fn start_agent(&mut self, agent: &Agent) -> anyhow::Result<Proc> {
        let admin = self.admin().await?;
        let kubeconfig = self.agent_kubeconfig(&admin, &agent.node).await?;
        let (token_file, ca_file) = self.agent_files(&admin).await?;
        let state = self.dir.join(format!("{}-state", agent.dir));
        let run = self.dir.join(format!("{}-run", agent.dir));
        let ops = free_port()?;
        let mut env = self.smolvm_env.clone();
        env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
        env.push(("RUST_LOG".into(), "info".into()));
        env.push(("POD_NAMESPACE".into(), NAMESPACE.into()));
        let smolvm_bin = env
            .iter()
            .find(|(k, _)| k == "SMOLVM_BIN")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let mut args = vec![
            format!("--node-name={}", agent.node),
            format!("--state-dir={}", state.display()),
            format!("--run-dir={}", run.display()),
            format!("--guest-rollout-port={}", free_port()?),
            "--listen-address=127.0.0.1".to_string(),
            format!("--port={}", agent.port),
            "--advertise-address=127.0.0.1".to_string(),
            format!("--ops-address=127.0.0.1:{ops}"),
            // Each agent of the run listens for holder Pods' release calls on its own port.
            format!("--release-port={}", free_port()?),
            format!("--token-file={}", token_file.display()),
            format!("--client-ca={}", ca_file.display()),
            // The webhook's policy, as the DaemonSet mounts it: excluded host ports are
            // refused on the node too.
            format!("--policy={}", self.policy_file.display()),
            format!("--heartbeat-interval={}s", self.options.heartbeat.as_secs().max(1)),
            format!("--canary={}", if self.options.canary { "on" } else { "off" }),
            "--log-format=text".to_string(),
        ];
        // An agent attached to a socket runs no smolvm of its own (and a harness without the
        // real runtime has none to give it).
        if !smolvm_bin.is_empty() {
            args.push(format!("--smolvm-bin={smolvm_bin}"));
        }
        if let Some(socket) = &agent.attach_socket {
            args.push(format!("--attach-socket={}", socket.display()));
        }
        // Sixteen vCPUs per host CPU for the real node: a 2-core machine then holds the
        // scenarios' VMs (20 created at once in one of them) beside the default host reservation.
        args.extend(agent.extra.iter().cloned());
        let name = if agent.attach_socket.is_some() {
            "smolvm-runtime-double"
        } else {
            "smolvm-runtime"
        };
        let mut proc = Proc::spawn(name, &self.bins.runtime, args, &env, &self.log(name))?;
        if agent.attach_socket.is_none() {
            self.ops.insert("smolvm-runtime", format!("127.0.0.1:{ops}"));
        }
        wait_http_ok(
            &format!("127.0.0.1:{ops}"),
            "/readyz",
            Some(&mut proc),
            Duration::from_secs(120),
        )
        .await?;
        // Ready from a heartbeat of this agent, not a stale one from before it started.
        let since = k8s_openapi::jiff::Timestamp::now();
        let nodes: Api<SmolVMNode> = Api::all(admin.clone());
        let node_name = agent.node.clone();
        let mut slot = Some(proc);
        eventually("the SmolVMNode to report Ready", Duration::from_secs(120), || {
            let nodes = nodes.clone();
            let node_name = node_name.clone();
            let exited = slot.as_mut().and_then(|p| p.exited().map(|s| (s, p.log_tail(30))));
            async move {
                if let Some((status, log)) = exited {
                    bail!("{name} exited ({status}):\n{log}");
                }
                let Some(node) = nodes.get_opt(&node_name).await? else {
                    return Ok(None);
                };
                let status = node.status.as_ref();
                let fresh = status
                    .and_then(|s| s.heartbeat_time.as_ref())
                    .is_some_and(|t| t.0 >= since);
                let ready = status
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == constants::condition::READY))
                    .is_some_and(|c| c.status == "True");
                Ok((fresh && ready).then_some(()))
            }
        })
        .await?;
        slot.ok_or_else(|| anyhow!("the agent's process went missing"))
    }

    /// Stops the runtime agent (SIGTERM; `smolvm serve` stops with it).
    pub fn stop_runtime(&mut self) {
        if let Some(task) = self.ca_sync.take() {
            task.abort();
        }
        if let Some(mut p) = self.runtime.take() {
            p.terminate(Duration::from_secs(10));
        }
    }

    /// The runtime's smolvm socket, for checking smolvm's own machine list.
    pub fn smolvm_socket(&self) -> PathBuf {
        self.dir.join("rt-run").join("smolvm.sock")
    }

    /// The run's directory: every component's log (`*.log`) and the runtime's state (`rt-state`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A log file of a component, for failure messages.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        crate::process::tail(&self.log(name), lines)
    }
}

/// Waits until the APIService `name` reports `Available=True`.
pub async fn wait_api_service_available(kubeconfig: &Path, name: &str, timeout: Duration) -> anyhow::Result<()> {
    eventually(&format!("APIService {name} Available=True"), timeout, || {
        let out = kubectl(
            kubeconfig,
            &[
                "get",
                "apiservice",
                name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
            ],
            None,
        );
        async move { Ok(out.ok().filter(|o| o.stdout == b"True").map(drop)) }
    })
    .await
}

/// The access API's APIService and Service as rendered, pointed at the controller on this
/// machine: the Service becomes an ExternalName naming `localhost` (the aggregator dials it with
/// the APIService's port, and still checks the certificate against the Service's DNS name), the
/// only kind of Service the API server reaches without a Service proxy or a routable endpoint.
fn access_objects(rendered: &[Value], port: u16) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for o in rendered {
        match (kind(o), o["metadata"]["name"].as_str()) {
            ("APIService", _) => {
                let mut api_service = o.clone();
                api_service["spec"]["service"]["port"] = Value::from(port);
                out.push(api_service);
            }
            ("Service", Some("smolvm-access")) => {
                let mut service = o.clone();
                service["spec"] = serde_json::json!({
                    "type": "ExternalName",
                    "externalName": "localhost",
                    "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                });
                out.push(service);
            }
            _ => {}
        }
    }
    if out.len() != 2 {
        bail!(
            "deploy/default renders {} of the access API's APIService and Service, expected both",
            out.len()
        );
    }
    Ok(out)
}

/// A ServiceAccount token from the TokenRequest API; bound to `pod` when given, so the API
/// server adds the node-name and node-uid extras of the Pod's Node.
pub async fn token_for(admin: &Client, sa: &str, pod: Option<&Pod>) -> anyhow::Result<String> {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(24 * 3600),
            bound_object_ref: pod.map(|p| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(p.name_any()),
                uid: p.uid(),
            }),
        },
        ..Default::default()
    };
    let response = sas
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for ServiceAccount {NAMESPACE}/{sa}"))?;
    response
        .status
        .map(|s| s.token)
        .ok_or_else(|| anyhow!("TokenRequest for {sa} returned no token"))
}

/// Server-side applies objects with kubectl as the given kubeconfig.
pub fn apply(kubeconfig: &Path, objects: &[Value]) -> anyhow::Result<()> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let out = kubectl(
        kubeconfig,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=smolvm-e2e",
            "-f",
            "-",
        ],
        Some(&serde_json::to_string(&list)?),
    )?;
    if !out.status.success() {
        bail!("kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Polls a plain-HTTP endpoint until it answers 200; fails early if `proc` exits.
/// `GET http://{addr}{path}` (HTTP/1.1, plain): the status line's code and the body.
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("no HTTP status from {addr}{path}"))?;
    Ok((code, body.to_string()))
}

async fn wait_http_ok(addr: &str, path: &str, mut proc: Option<&mut Proc>, timeout: Duration) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = Instant::now();
    loop {
        if let Some(p) = proc.as_deref_mut()
            && let Some(status) = p.exited()
        {
            bail!("{} exited ({status}):\n{}", p.name(), p.log_tail(40));
        }
        if let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await {
            let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            let mut buf = Vec::new();
            if stream.write_all(req.as_bytes()).await.is_ok()
                && stream.read_to_end(&mut buf).await.is_ok()
                && buf.starts_with(b"HTTP/1.1 200")
            {
                return Ok(());
            }
        }
        if started.elapsed() > timeout {
            let log = proc.map(|p| p.log_tail(40)).unwrap_or_default();
            bail!("http://{addr}{path} not 200 after {timeout:?}:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A node whose agent runs on testkit's smolvm double, in a scenario ([`Env::start_on_double`]).
pub struct DoubleNodeRun {
    /// The double: what smolvm was asked, and the machines it holds.
    pub double: smolvm_testkit::smolvm_double::DoubleHandle,
    agent: Proc,
    node: String,
}

impl DoubleNodeRun {
    /// Stops the node's agent and deletes its SmolVMNode (the double stops when dropped).
    pub async fn stop(mut self, env: &Env) {
        self.agent.terminate(Duration::from_secs(10));
        if let Ok(admin) = env.admin().await {
            let _ = Api::<SmolVMNode>::all(admin)
                .delete(&self.node, &kube::api::DeleteParams::default())
                .await;
        }
    }
}
