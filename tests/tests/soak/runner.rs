//! The run: the topology brought up, the recorders, the clients and the injector started, the
//! run's length waited out with its cool-down, then the checker's verdict and the report.
//!
//! The topology (smolvm-soak's `Topology::default()`, by node index): kube-apiserver and etcd;
//! two webhook replicas behind a relay that spreads the API server's calls over them; two
//! controller replicas electing a leader; node 0, the real agent over the real `smolvm serve`
//! (no guest boots here: its starts fail, StartFailed); node 1, the real agent over testkit's
//! smolvm double (suspend, resume and pools happen there); nodes 2 to 4, simulated nodes (the
//! runtime's real node API over testkit's in-memory smolvm), each behind a relay a partition
//! cuts. Each soak namespace has a SmolVMPool whose slots live on node 1.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, api::PostParams};
use serde_json::json;
use smolvm_runtime::vmm::{Machine, SmolvmClient, SmolvmConfig, Vmm};
use smolvm_soak::{
    Config, Plan,
    check::CheckParams,
    report::Summary,
    schedule::{FaultKind, ScheduleParams},
    workload::WorkloadParams,
};
use smolvm_testkit::{memory_vmm::MemoryVmm, smolvm_double::DoubleHandle};
use smolvm_tests::{
    assets::{self, Assets},
    env::{self, Env, Options},
    process::{Proc, free_port},
    simnodes::{self, SimNode, SimNodes},
};
use tokio_util::task::AbortOnDropHandle;

use crate::clients::{self, Clients};
use crate::faults::Injector;
use crate::recorder::{self, History, PolledNode};
use crate::relay::Relay;

/// The double-backed node's name.
const DOUBLE_NODE: &str = "soak-double";
/// The simulated nodes' name prefix.
const SIM_PREFIX: &str = "soak-sim";
/// How many simulated nodes (the schedule's default topology: nodes 2, 3, 4).
const SIM_NODES: usize = 3;
/// How long after the run's end the last clients and recoveries may take.
const SETTLE: Duration = Duration::from_secs(150);

/// How the recorder lists a node's machines.
pub enum NodeRuntime {
    /// Through a `smolvm serve` socket (the real one, or the double's).
    Smolvm(Box<SmolvmClient>),
    /// A simulated node's in-memory runtime, and the relay a partition cuts.
    Memory(Arc<MemoryVmm>, Arc<Relay>),
}

impl NodeRuntime {
    /// Its machines, if it answers.
    pub async fn machines(&self) -> Option<Vec<Machine>> {
        match self {
            NodeRuntime::Smolvm(client) => client.list().await.ok(),
            NodeRuntime::Memory(vmm, _) => vmm.list().await.ok(),
        }
    }

    /// Whether a partition cuts it off.
    pub fn is_cut(&self) -> bool {
        matches!(self, NodeRuntime::Memory(_, relay) if relay.is_cut())
    }
}

/// The running topology.
pub struct Soak {
    /// The control plane, the first webhook, the controllers, the real node.
    pub env: Env,
    /// An admin client.
    pub admin: Client,
    webhooks: Vec<Proc>,
    double_agent: Proc,
    /// Each agent's extra environment now (a clock fault's libfaketime), by node index.
    agent_env: [Vec<(String, String)>; 2],
    relays: Vec<Arc<Relay>>,
    sims: SimNodes,
    _double: DoubleHandle,
    _front: Relay,
    _heartbeats: AbortOnDropHandle<()>,
}

impl Soak {
    /// The node names, by index.
    pub fn node_name(&self, index: u32) -> Option<String> {
        match index {
            0 => Some(self.env.options.node.to_string()),
            1 => Some(DOUBLE_NODE.to_string()),
            i => self.sims.nodes.get(i as usize - 2).map(|n| n.name.clone()),
        }
    }

    /// Webhook replica `index`.
    pub fn webhook(&mut self, index: u32) -> anyhow::Result<&mut Proc> {
        self.webhooks
            .get_mut(index as usize)
            .ok_or_else(|| anyhow!("no webhook replica {index}"))
    }

    /// The agent of node `index` (0 real, 1 double-backed).
    pub fn agent(&mut self, index: u32) -> anyhow::Result<&mut Proc> {
        match index {
            0 => self.env.runtime.as_mut().ok_or_else(|| anyhow!("no real agent")),
            1 => Ok(&mut self.double_agent),
            i => Err(anyhow!("node {i} has no agent process")),
        }
    }

    /// SIGKILLs node `index`'s agent and the `smolvm serve` it supervises, as a container's
    /// processes all die with it (an agent killed alone would leave its smolvm running,
    /// orphaned, past the run).
    pub fn kill_agent(&mut self, index: u32) -> anyhow::Result<()> {
        self.agent(index)?.kill();
        if index == 0 {
            self.kill_smolvm_serves();
        }
        Ok(())
    }

    /// SIGKILLs every `smolvm serve` listening on the real node's socket (the one its agent
    /// runs, and any an agent that died on its own left behind).
    pub fn kill_smolvm_serves(&self) {
        for serve in crate::faults::smolvm_serves_on(&self.env.smolvm_socket()) {
            // SAFETY: plain kill(2) on a smolvm serve of this run's own socket.
            unsafe {
                libc::kill(serve, libc::SIGKILL);
            }
        }
    }

    /// Restarts node `index`'s agent (and its smolvm) with its current environment.
    pub fn restart_agent(&mut self, index: u32) -> anyhow::Result<()> {
        let extra = self.agent_env.get(index as usize).cloned().unwrap_or_default();
        self.kill_agent(index)?;
        self.agent(index)?.respawn(&extra)
    }

    /// Restarts node `index`'s agent with `extra` environment, kept for its later restarts.
    pub fn set_agent_env(&mut self, index: u32, extra: Vec<(String, String)>) -> anyhow::Result<()> {
        let slot = self
            .agent_env
            .get_mut(index as usize)
            .ok_or_else(|| anyhow!("node {index} has no agent process"))?;
        *slot = extra;
        self.restart_agent(index)
    }

    /// Restarts, as a kubelet would, each component (webhook, controller, agent) that exited on
    /// its own at least `backoff` ago; `crashed` holds when each was first seen exited. Returns
    /// what it saw and did, a line each.
    pub fn revive(&mut self, crashed: &mut BTreeMap<PathBuf, Instant>, backoff: Duration) -> Vec<String> {
        let mut lines = Vec::new();
        let [real_env, double_env] = self.agent_env.clone();
        let smolvm_socket = self.env.smolvm_socket();
        let mut procs: Vec<(&mut Proc, Vec<(String, String)>)> = Vec::new();
        procs.extend(self.webhooks.iter_mut().map(|p| (p, Vec::new())));
        procs.extend(self.env.controller.as_mut().map(|p| (p, Vec::new())));
        procs.extend(self.env.replicas.iter_mut().map(|r| (&mut r.proc, Vec::new())));
        procs.extend(self.env.runtime.as_mut().map(|p| (p, real_env)));
        procs.push((&mut self.double_agent, double_env));
        let now = Instant::now();
        for (proc, extra) in procs {
            let Some(status) = proc.exited() else { continue };
            let key = proc.log().to_path_buf();
            let since = *crashed.entry(key.clone()).or_insert_with(|| {
                lines.push(format!(
                    "{} ({}) exited on its own: {status}",
                    proc.name(),
                    key.display()
                ));
                now
            });
            if now.duration_since(since) >= backoff {
                crashed.remove(&key);
                // The real agent's orphaned smolvm goes first, as its container's would.
                if proc.name() == "smolvm-runtime" {
                    for serve in crate::faults::smolvm_serves_on(&smolvm_socket) {
                        // SAFETY: plain kill(2) on a smolvm serve of this run's own socket.
                        unsafe {
                            libc::kill(serve, libc::SIGKILL);
                        }
                    }
                }
                match proc.respawn(&extra) {
                    Ok(()) => lines.push(format!("{} restarted after it exited", proc.name())),
                    Err(e) => lines.push(format!("{} could not be restarted: {e:#}", proc.name())),
                }
            }
        }
        lines
    }

    /// The relay in front of simulated node `index`.
    pub fn relay(&self, index: u32) -> anyhow::Result<&Relay> {
        (index as usize)
            .checked_sub(2)
            .and_then(|i| self.relays.get(i))
            .map(|r| r.as_ref())
            .ok_or_else(|| anyhow!("node {index} is not a simulated node"))
    }

    /// What the recorder polls, node by node.
    fn polled(&self, dir: &Path) -> Vec<PolledNode> {
        let smolvm = |socket: &Path| NodeRuntime::Smolvm(Box::new(SmolvmClient::new(SmolvmConfig::new(socket))));
        let mut nodes = vec![
            PolledNode {
                name: self.env.options.node.to_string(),
                runtime: smolvm(&self.env.smolvm_socket()),
            },
            PolledNode {
                name: DOUBLE_NODE.to_string(),
                runtime: smolvm(&dir.join("double-smolvm.sock")),
            },
        ];
        for (node, relay) in self.sims.nodes.iter().zip(&self.relays) {
            nodes.push(PolledNode {
                name: node.name.clone(),
                runtime: NodeRuntime::Memory(node.vmm.clone(), relay.clone()),
            });
        }
        nodes
    }
}

/// Brings the topology up under `dir`.
async fn bring_up(assets: &Assets, dir: &Path) -> anyhow::Result<Soak> {
    let bins = assets::operator_bins()?;
    let mut env = Env::start(assets, bins, dir, Options::default()).await?;
    env.start_controller_replica()
        .await
        .context("a second controller replica")?;
    let second = free_port()?;
    let webhook2 = env
        .start_webhook_replica(second)
        .await
        .context("a second webhook replica")?;
    let front = Relay::start(vec![
        ([127, 0, 0, 1], env.webhook_port).into(),
        ([127, 0, 0, 1], second).into(),
    ])
    .await?;
    env.register_webhooks_at(front.port)?;
    let webhooks = vec![env.webhook.take().ok_or_else(|| anyhow!("no webhook"))?, webhook2];
    let socket = dir.join("double-smolvm.sock");
    let double = smolvm_testkit::smolvm_double::SmolvmDouble::start(&socket).await?;
    let extra = ["--cpu-allocation-ratio=16", "--reserved-cpus=0"];
    let double_agent = env.start_double_node(DOUBLE_NODE, &socket, &extra).await?;
    let admin = env.admin().await?;
    let mut sims = simnodes::start(&admin, SIM_PREFIX, SIM_NODES).await?;
    let mut relays = Vec::new();
    for node in &mut sims.nodes {
        let relay = Arc::new(Relay::start(vec![([127, 0, 0, 1], node.port).into()]).await?);
        // The node advertises the relay: the controller reaches it only through it.
        node.port = relay.port;
        relays.push(relay);
    }
    let beating: Vec<SimNode> = sims
        .nodes
        .iter()
        .map(|n| SimNode {
            name: n.name.clone(),
            uid: n.uid.clone(),
            port: n.port,
            vmm: n.vmm.clone(),
        })
        .collect();
    let heartbeats = AbortOnDropHandle::new(tokio::spawn(heartbeat(admin.clone(), beating)));
    create_namespaces_and_pools(&admin).await?;
    Ok(Soak {
        env,
        admin,
        webhooks,
        double_agent,
        agent_env: Default::default(),
        relays,
        sims,
        _double: double,
        _front: front,
        _heartbeats: heartbeats,
    })
}

/// The simulated nodes' heartbeats, every 2 s, as their agents would write them.
async fn heartbeat(admin: Client, nodes: Vec<SimNode>) {
    loop {
        simnodes::heartbeat(&admin, &nodes).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The workload's namespaces, each with its pool (2 slots on the double-backed node).
async fn create_namespaces_and_pools(admin: &Client) -> anyhow::Result<()> {
    let params = WorkloadParams::default();
    for namespace in &params.namespaces {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))?;
        create(&Api::all(admin.clone()), &ns).await?;
        let pool: smolvm_api::SmolVMPool = serde_json::from_value(json!({
            "apiVersion": smolvm_api::constants::API_VERSION, "kind": "SmolVMPool",
            "metadata": {"name": params.pool, "namespace": namespace},
            "spec": {
                "slotsPerNode": 2, "whenEmpty": "Cold",
                "nodeSelector": {"kubernetes.io/hostname": DOUBLE_NODE},
                "template": {"image": "alpine:3.20", "resources": {"cpus": 1, "memoryMiB": 256},
                    "storage": {"storageGiB": 1, "overlayGiB": 1}},
            },
        }))?;
        // The webhook's pool cache may lag its first moments: retried like a client's write.
        env::eventually("the soak pool stored", Duration::from_secs(30), || {
            let api = Api::namespaced(admin.clone(), namespace);
            let pool = pool.clone();
            async move { Ok(create(&api, &pool).await.ok()) }
        })
        .await?;
    }
    Ok(())
}

/// Creates `object`, an existing one kept.
async fn create<K>(api: &Api<K>, object: &K) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The plan of the run `config` names: the tier's parameters, every start expected to succeed
/// (the clients expect StartFailed on the real node, where no guest boots).
pub fn plan(config: Config) -> smolvm_soak::Result<Plan> {
    smolvm_soak::plan(config, &ScheduleParams::default(), &WorkloadParams::default())
}

/// The checker's parameters: the controllers run with a 10 s orphan grace (the harness's), and
/// collect orphans on their 30 s resync: a machine may stay 90 s.
fn check_params() -> CheckParams {
    CheckParams {
        orphan_grace: Duration::from_secs(90),
        ..CheckParams::default()
    }
}

/// The whole run; its exit code.
pub async fn run(assets: Assets, config: Config) -> ExitCode {
    let plan = match plan(config) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("error: no plan for {config:?}: {e} ({})", e.reason());
            return ExitCode::FAILURE;
        }
    };
    let dir = match tempfile::Builder::new().prefix("smolvm-soak-").tempdir() {
        Ok(t) => t.keep(),
        Err(e) => {
            eprintln!("cannot create a work directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "soak: {} minutes, seed {} ({} operations, {} faults planned); logs and history in {}",
        config.minutes,
        config.seed,
        plan.operations.len(),
        plan.schedule.faults.len(),
        dir.display()
    );
    let started = Instant::now();
    let mut soak = match bring_up(&assets, &dir).await {
        Ok(soak) => soak,
        Err(e) => {
            eprintln!(
                "error: the soak's topology did not come up: {e:#}\n(logs in {})",
                dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    println!("topology up in {:.1}s", started.elapsed().as_secs_f64());
    let code = match soak_run(&mut soak, &plan, &dir).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}\n(logs in {})", dir.display());
            ExitCode::FAILURE
        }
    };
    // Nothing of the run outlives it: its agents stop with the harness, their smolvm with them.
    soak.kill_agent(0).ok();
    code
}

/// The run on a topology that is up: recorders, clients, faults, the verdict.
async fn soak_run(soak: &mut Soak, plan: &Plan, dir: &Path) -> anyhow::Result<ExitCode> {
    let config = plan.config;
    let history = History::create(&dir.join("history.jsonl"), config, check_params())?;
    let watch = AbortOnDropHandle::new(tokio::spawn(recorder::watch_vms(soak.admin.clone(), history.clone())));
    let poll = AbortOnDropHandle::new(tokio::spawn(recorder::poll_nodes(
        soak.admin.clone(),
        soak.polled(dir),
        history.clone(),
        Duration::from_secs(3),
    )));
    let real = soak.env.options.node;
    let pins = clients::pins(&plan.operations, real, DOUBLE_NODE);
    let clients = Clients::new(soak.admin.clone(), history.clone(), pins, real);
    let workload = tokio::spawn(clients.clone().run(plan.operations.clone()));
    let end = history.instant(config.length());
    let mut injector = Injector::new(soak, history.clone(), end + SETTLE);
    injector.run(&plan.schedule, end).await;
    println!(
        "{:>6.1}s the run's length is up; waiting for the last clients and recoveries",
        history.now().as_secs_f64()
    );
    while (!workload.is_finished() || injector.recoveries.pending()) && Instant::now() < end + SETTLE {
        injector.supervise_until(Instant::now() + Duration::from_secs(1)).await;
    }
    // A last look at every node and SmolVM, then the recorders stop.
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop((watch, poll));
    let (violations, observations) = history.finish();
    let samples = std::mem::take(&mut *injector.recoveries.samples.lock().unwrap_or_else(|e| e.into_inner()));
    for line in injector
        .recoveries
        .missing
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        println!("recovery missing: {line}");
    }
    report_clients(&clients);
    for violation in &violations {
        println!("{violation}");
    }
    let summary = Summary::from_history(&observations, samples, violations.len());
    let lines = summary.lines();
    // The first lines are the recoveries, one per kind in FaultKind::ALL's order.
    for (kind, line) in FaultKind::ALL.iter().zip(&lines) {
        match injector.skipped.get(kind) {
            Some(why) => println!("recovery after {kind}: skipped: {why}"),
            None => println!("{line}"),
        }
    }
    for line in lines.iter().skip(FaultKind::ALL.len()) {
        println!("{line}");
    }
    Ok(if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("reproduce with: {}", config.reproduce());
        ExitCode::FAILURE
    })
}

/// How the clients' waits ended.
fn report_clients(clients: &Clients) {
    let tally = clients.tally.lock().unwrap_or_else(|e| e.into_inner());
    println!(
        "outcomes: met={} superseded={} missed={}",
        tally.met,
        tally.superseded,
        tally.missed.len()
    );
    for line in &tally.missed {
        println!("    missed {line}");
    }
}
