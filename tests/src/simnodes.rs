//! Simulated nodes for the control-plane benchmarks (`make bench-e2e`, `make bench-pool`).
//!
//! TEST DOUBLE: each simulated node is the runtime agent's real node API server (mTLS with a
//! serving certificate from the runtime CA the controller made, the bearer token, the same
//! router, the same mapping of machines served from pools) backed by testkit's `MemoryVmm`, an
//! in-memory stand-in for `smolvm serve`; its SmolVMNode is written by [`heartbeat`], as the
//! agent's reporter would, with its pools. Fifty real smolvm servers cannot run on one machine,
//! and no guest boots on these machines.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use smolvm_api::{SmolVMNode, constants};
use smolvm_certs::{CertificateAuthority, ReloadableResolver, runtime_serving_sans};
use smolvm_runtime::{
    metrics::Metrics,
    nodeapi::{Identity, NodeApiState, auth::TokenAuth, router, tls::MtlsServer},
    pools::{LeasedVmm, PoolBook},
};
use smolvm_testkit::memory_vmm::MemoryVmm;

use crate::{
    assets,
    env::{Env, NAMESPACE, Options},
};

/// A benchmark's control plane without a runtime agent of its own, and one node whose agent runs
/// on testkit's smolvm double (TEST DOUBLE: no guest boots here), served in this process, with
/// room for 32 one-CPU VMs (`--cpu-allocation-ratio=16` on 2 cores, none reserved).
pub struct DoubleNode {
    /// The control plane.
    pub env: Env,
    /// The node's smolvm.
    pub double: smolvm_testkit::smolvm_double::DoubleHandle,
    /// The node's agent.
    pub agent: crate::process::Proc,
    /// The directory everything runs in (removed when dropped, after the rest).
    pub dir: tempfile::TempDir,
}

/// Starts [`DoubleNode`] with the node `node`, in a new directory named from `prefix`.
pub async fn double_node(assets: &assets::Assets, prefix: &str, node: &str) -> anyhow::Result<DoubleNode> {
    double_node_at(assets, prefix, node, None).await
}

/// [`double_node`] whose Node has the InternalIP `address` (where its agent publishes the
/// machines' ports: a forwarder of its own), or the documentation address (none).
pub async fn double_node_at(
    assets: &assets::Assets,
    prefix: &str,
    node: &str,
    address: Option<&str>,
) -> anyhow::Result<DoubleNode> {
    use anyhow::Context as _;
    let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
    let options = Options {
        runtime: false,
        ..Options::default()
    };
    let mut env = Env::start(assets, assets::operator_bins()?, dir.path(), options).await?;
    let socket = dir.path().join("double-smolvm.sock");
    let double = smolvm_testkit::smolvm_double::SmolvmDouble::start(&socket)
        .await
        .context("starting the smolvm double")?;
    let publish = address.map(|a| format!("--publish-address={a}"));
    let mut extra = vec!["--cpu-allocation-ratio=16", "--reserved-cpus=0"];
    extra.extend(publish.as_deref());
    let ip = address.unwrap_or(crate::env::DOUBLE_NODE_IP);
    let agent = env.start_double_node_at(node, &socket, ip, &extra).await?;
    Ok(DoubleNode {
        env,
        double,
        agent,
        dir,
    })
}

/// The value at `q` (0..=1) of `sorted` by nearest rank, in milliseconds (0 for none).
pub fn quantile_ms(sorted: &[std::time::Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Prints `{what}: p50 X ms, p99 Y ms (n=N, max Z ms)` for `samples`.
pub fn report_ms(what: &str, mut samples: Vec<std::time::Duration>) {
    samples.sort();
    let at = |q: f64| quantile_ms(&samples, q);
    println!(
        "{what}: p50 {:.1} ms, p99 {:.1} ms (n={}, max {:.1} ms)",
        at(0.50),
        at(0.99),
        samples.len(),
        at(1.0)
    );
}

/// A number from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The control plane of a benchmark on simulated nodes: a real kube-apiserver, etcd, webhook and
/// controller (no runtime agent of its own), and a heartbeat timeout the simulated nodes' 20 s
/// beats stay within.
pub struct ControlPlane {
    /// The running environment (dropped before its directory).
    pub env: Env,
    /// An admin client.
    pub admin: Client,
    /// The controller's process id, for its memory.
    pub controller_pid: u32,
    _dir: tempfile::TempDir,
}

/// Starts a [`ControlPlane`] in a new temporary directory named after `bench`.
pub async fn control_plane(assets: &assets::Assets, bench: &str) -> anyhow::Result<ControlPlane> {
    let bins = assets::operator_bins()?;
    let dir = tempfile::Builder::new().prefix(&format!("smolvm-{bench}-")).tempdir()?;
    let options = Options {
        runtime: false,
        heartbeat_timeout: Duration::from_secs(120),
        ..Options::default()
    };
    let env = Env::start(assets, bins, dir.path(), options).await?;
    let admin = env.admin().await?;
    let controller_pid = env
        .controller
        .as_ref()
        .and_then(|p| p.pid())
        .ok_or_else(|| anyhow!("no controller process"))?;
    Ok(ControlPlane {
        env,
        admin,
        controller_pid,
        _dir: dir,
    })
}

/// One simulated node.
pub struct SimNode {
    /// Its name (and its SmolVMNode's).
    pub name: String,
    /// Its Node UID.
    pub uid: String,
    /// Its node API port on 127.0.0.1.
    pub port: u16,
    /// Its runtime.
    pub vmm: Arc<MemoryVmm>,
}

/// Simulated nodes and their servers (they serve until dropped).
pub struct SimNodes {
    /// The nodes.
    pub nodes: Vec<SimNode>,
    _servers: Vec<MtlsServer>,
}

/// Starts `n` simulated nodes named `<prefix>-NN` and creates their SmolVMNodes, with the
/// runtime CA and token the controller made (read from their Secrets, as a kubelet mounts them).
pub async fn start(admin: &Client, prefix: &str, n: usize) -> anyhow::Result<SimNodes> {
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    let text = |s: &Secret, k: &str| -> anyhow::Result<String> {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| anyhow!("Secret lacks {k}"))
    };
    let ca_secret = secrets.get(constants::RUNTIME_CA).await.context("runtime CA Secret")?;
    let ca = CertificateAuthority::from_pem(&text(&ca_secret, "tls.crt")?, &text(&ca_secret, "tls.key")?)?;
    let token = text(&secrets.get(constants::RUNTIME_AUTH_SECRET).await?, "token")?;
    let node_api: Api<SmolVMNode> = Api::all(admin.clone());
    let mut servers = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}-{i:02}");
        let leaf = ca.issue_server(&runtime_serving_sans(&name), &[], Duration::from_secs(24 * 3600))?;
        let resolver = Arc::new(ReloadableResolver::from_pem(&leaf.cert_pem, &leaf.key_pem)?);
        let identity = Identity::new(name.clone());
        let uid = format!("sim-uid-{i:02}");
        identity.set_node_uid(Some(uid.clone()));
        identity.set_runtime_version(Some("memory-double".into()));
        let vmm = Arc::new(MemoryVmm::default());
        let book = Arc::new(PoolBook::in_memory());
        let state = NodeApiState::new(
            Arc::new(LeasedVmm::new(vmm.clone(), book.clone())),
            TokenAuth::fixed(token.clone())?,
            identity,
            Arc::new(Metrics::default()),
            None,
        )
        .with_pool_book(book);
        let listener = std::net::TcpListener::bind((IpAddr::V4(Ipv4Addr::LOCALHOST), 0))?;
        let port = listener.local_addr()?.port();
        servers.push(MtlsServer::start(listener, router(state), resolver, ca.cert_pem())?);
        let node: SmolVMNode = serde_json::from_value(json!({
            "apiVersion": constants::API_VERSION, "kind": "SmolVMNode",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {},
        }))?;
        match node_api.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        nodes.push(SimNode { name, uid, port, vmm });
    }
    Ok(SimNodes {
        nodes,
        _servers: servers,
    })
}

/// Writes each node's SmolVMNode status as its agent would: Ready, a fresh heartbeat, a large
/// allocatable, and the pools its runtime keeps.
pub async fn heartbeat(admin: &Client, nodes: &[SimNode]) {
    let api: Api<SmolVMNode> = Api::all(admin.clone());
    for node in nodes {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let pools: Vec<serde_json::Value> = node
            .vmm
            .pool_counts()
            .into_iter()
            .map(|(name, ready, slots, leased)| json!({"name": name, "ready": ready, "slots": slots, "leased": leased}))
            .collect();
        let status = json!({
            "apiVersion": constants::API_VERSION, "kind": "SmolVMNode",
            "status": {
                "nodeUID": node.uid,
                "endpoint": {"address": "127.0.0.1", "port": node.port},
                "runtimeVersion": "memory-double",
                "protocolVersion": constants::PROTOCOL_VERSION,
                "heartbeatTime": now,
                "capacity": {"cpus": 512, "memoryMiB": 262144, "storageGiB": 8192},
                "allocatable": {"cpus": 512, "memoryMiB": 262144, "storageGiB": 8192},
                "pools": pools,
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "RuntimeReady", "message": "simulated", "lastTransitionTime": now},
                    {"type": "RuntimeReady", "status": "True", "reason": "Serving", "message": "simulated", "lastTransitionTime": now},
                    {"type": "KVMAvailable", "status": "True", "reason": "Simulated", "message": "simulated", "lastTransitionTime": now},
                ],
            },
        });
        if let Err(e) = api
            .patch_status(
                &node.name,
                &PatchParams::apply("smolvm-sim-nodes").force(),
                &Patch::Apply(&status),
            )
            .await
        {
            eprintln!("heartbeat of {}: {e}", node.name);
        }
    }
}

/// The requests kube-apiserver has served, from its `apiserver_request_total`: writes (POST, PUT,
/// PATCH, APPLY, DELETE) that took effect (2xx) by resource (`smolvms`, `smolvms/status`, `events`,
/// …), and every write and read (GET, LIST; not WATCH, which stays open) by `<resource> <verb>
/// <code>`, for the breakdown.
pub async fn api_requests(admin: &Client) -> anyhow::Result<HashMap<String, f64>> {
    let text = metrics_text(admin).await?;
    let mut by_resource = HashMap::new();
    for (labels, value) in samples(&text, "apiserver_request_total") {
        // Server-side apply counts as its own verb, APPLY (the heartbeats' SmolVMNode writes).
        let verb = label(labels, "verb");
        let write = matches!(verb, "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE");
        if !write && !matches!(verb, "GET" | "LIST") {
            continue;
        }
        let key = resource_key(labels);
        let code = label(labels, "code");
        // Totals count the writes that took effect; refused ones show in the breakdown.
        if write && code.starts_with('2') {
            *by_resource.entry(key.clone()).or_insert(0.0) += value;
        }
        // The same by verb and code, for the breakdown (409s are retried binds).
        *by_resource.entry(format!("{key} {verb} {code}")).or_insert(0.0) += value;
    }
    Ok(by_resource)
}

/// The time kube-apiserver spent serving requests (`apiserver_request_duration_seconds`, watches
/// aside), by `<resource> <verb>`: the seconds in all and how many requests.
pub async fn api_request_seconds(admin: &Client) -> anyhow::Result<HashMap<String, (f64, f64)>> {
    let text = metrics_text(admin).await?;
    let mut by_request: HashMap<String, (f64, f64)> = HashMap::new();
    for (name, sum) in [
        ("apiserver_request_duration_seconds_sum", true),
        ("apiserver_request_duration_seconds_count", false),
    ] {
        for (labels, value) in samples(&text, name) {
            let key = format!("{} {}", resource_key(labels), label(labels, "verb"));
            let entry = by_request.entry(key).or_default();
            if sum {
                entry.0 += value;
            } else {
                entry.1 += value;
            }
        }
    }
    Ok(by_request)
}

/// kube-apiserver's metrics, as text.
async fn metrics_text(admin: &Client) -> anyhow::Result<String> {
    Ok(admin
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?)
}

/// The samples of metric `name` in `text`: each one's labels (what the braces hold) and value.
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = rest.rsplit_once(' ')?;
        Some((labels, value.parse::<f64>().unwrap_or(0.0)))
    })
}

/// The value of label `key` in a sample's `labels`, or "".
fn label<'a>(labels: &'a str, key: &str) -> &'a str {
    labels
        .split(&format!("{key}=\""))
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_default()
}

/// A request's resource, with its subresource if any (`smolvms/status`).
fn resource_key(labels: &str) -> String {
    match label(labels, "subresource") {
        "" => label(labels, "resource").to_string(),
        sub => format!("{}/{sub}", label(labels, "resource")),
    }
}

/// A field of `/proc/PID/status` in kB (`VmHWM:`, `VmRSS:`), as MiB.
fn status_mib(pid: u32, name: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
}

/// A process's current resident memory in MiB, as `/proc` reports it.
pub fn rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmRSS:")
}

/// A process's resident memory sampled every `every` while it runs (the benchmark's RSS over
/// time): the samples so far, in MiB.
#[derive(Debug, Clone, Default)]
pub struct RssSamples(std::sync::Arc<std::sync::Mutex<Vec<f64>>>);

impl RssSamples {
    /// Samples `pid` every `every` until the returned task is aborted.
    pub fn start(pid: u32, every: std::time::Duration) -> (Self, tokio::task::JoinHandle<()>) {
        let samples = RssSamples::default();
        let kept = samples.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                if let Some(mib) = rss_mib(pid) {
                    kept.0.lock().unwrap_or_else(|e| e.into_inner()).push(mib);
                }
            }
        });
        (samples, task)
    }

    /// The samples taken since the last call, as `40 52 81 …` (MiB, rounded), and forgets them.
    pub fn take_line(&self) -> String {
        let taken = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        taken.iter().map(|m| format!("{m:.0}")).collect::<Vec<_>>().join(" ")
    }
}

/// A process's peak and current resident memory, as `/proc` reports them.
pub fn peak_rss_mib(pid: u32) -> String {
    let field = |name: &str| status_mib(pid, name);
    match (field("VmHWM:"), field("VmRSS:")) {
        (Some(peak), Some(now)) => format!("peak RSS {peak:.1} MiB (now {now:.1} MiB)"),
        _ => "RSS unavailable".into(),
    }
}
