//! The agent assembled: supervised smolvm, node API over mTLS, ops port, and the holders'
//! release hook. Used by `main` and by the integration tests (which run it in-process against a
//! real `smolvm serve`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use smolvm_certs::ReloadableResolver;

use crate::error::{Error, Result};
use crate::forward::Forwarder;
use crate::metrics::Metrics;
use crate::nodeapi::auth::TokenAuth;
use crate::nodeapi::tls::{MtlsServer, PlainServer};
use crate::nodeapi::{Identity, NodeApiState, router};
use crate::pools::{LeasedVmm, PoolBook};
use crate::supervisor::{Supervisor, SupervisorConfig};
use crate::suspensions::SuspendRecords;
use crate::vmm::{SmolvmClient, SmolvmConfig, Vmm};

/// Where the trusted client CA comes from.
#[derive(Debug, Clone)]
pub enum ClientCa {
    /// A fixed PEM bundle.
    Pem(String),
    /// A file (the CA ConfigMap's `ca.crt`), re-read on change.
    File(PathBuf),
}

/// Everything the agent needs to start.
pub struct AgentOptions {
    /// Kubernetes Node name.
    pub node_name: String,
    /// smolvm supervision.
    pub supervisor: SupervisorConfig,
    /// smolvm's local image directory (for `local:<name>` images).
    pub local_image_dir: Option<PathBuf>,
    /// Listener of the node API (mTLS).
    pub node_api_listener: std::net::TcpListener,
    /// Listener of the ops port (plain HTTP), if any.
    pub ops_listener: Option<std::net::TcpListener>,
    /// Serving certificate (swap it to renew).
    pub resolver: Arc<ReloadableResolver>,
    /// Serving certificate files to re-read on change (`--tls-cert/--tls-key` mode).
    pub serving_files: Option<(PathBuf, PathBuf)>,
    /// Trusted client CA.
    pub client_ca: ClientCa,
    /// Bearer token check.
    pub auth: Arc<TokenAuth>,
    /// Poll interval for changed files.
    pub file_poll_interval: Duration,
    /// How often the pools' keeper heartbeats the leases and makes again the pools smolvm lost
    /// ([`crate::pools::KEEP_INTERVAL`] in production).
    pub pool_keep_interval: Duration,
    /// Directory of the workload records (create's idempotency over the workload); `None`
    /// keeps none, and a repeated create then does not compare the workload. The records of
    /// suspended machines ([`crate::suspensions`]) are kept beside it (`suspended` in the same
    /// parent directory); without it, in memory only (they go with the process).
    pub workload_records: Option<PathBuf>,
    /// The node's address, where published ports are forwarded to smolvm's loopback listeners
    /// ([`crate::forward`]); `None`, a loopback or an unspecified address turns forwarding off.
    pub publish_address: Option<std::net::IpAddr>,
    /// What the agent refuses whatever admission did ([`crate::guards`]): the policy file of
    /// excluded host ports (the built-in defaults without one) and the private-image records.
    pub guards: crate::guards::GuardOptions,
    /// What one client may hold through the forwarder, the node API's listener and its
    /// streams ([`crate::limits`]).
    pub limits: crate::limits::Limits,
}

/// A running agent.
pub struct Agent {
    node_api: MtlsServer,
    ops: Option<PlainServer>,
    release: Option<PlainServer>,
    supervisor: Supervisor,
    metrics: Arc<Metrics>,
    identity: Arc<Identity>,
    vmm: Arc<dyn Vmm>,
    suspensions: Arc<SuspendRecords>,
    activity: Arc<crate::activity::Activity>,
    pools: Arc<PoolBook>,
    keeper: tokio::task::JoinHandle<()>,
    forwarder: Option<(Arc<Forwarder>, tokio::task::JoinHandle<()>)>,
    /// The policy file's watcher, if any.
    policy_watch: Option<tokio::task::JoinHandle<()>>,
}

/// The machines' volumes as `volumes` says, their records beside the workload records when
/// those are kept and `volumes` names no place of its own.
fn machine_volumes(
    options: &AgentOptions,
    volumes: &mut crate::volumes::VolumeOptions,
) -> Result<Arc<crate::volumes::Volumes>> {
    if volumes.records.is_none() {
        volumes.records = options
            .workload_records
            .as_deref()
            .map(|dir| dir.with_file_name("volumes"));
    }
    let made = crate::volumes::Volumes::new(volumes).map_err(|e| {
        Error::io(
            "making the volume mount points",
            volumes.stable_root.clone().unwrap_or_default(),
            e,
        )
    })?;
    Ok(Arc::new(made))
}

/// The release hook of holder Pods on `listener`, where there is one.
fn start_release(listener: Option<std::net::TcpListener>, state: &NodeApiState) -> Result<Option<PlainServer>> {
    let Some(listener) = listener else {
        return Ok(None);
    };
    let server = PlainServer::start_bounded(
        listener,
        crate::nodeapi::release::router(state.clone()),
        crate::nodeapi::release::BOUNDS,
        "release hook",
    )?;
    tracing::info!(address = %server.local_addr(), "release hook serving");
    Ok(Some(server))
}

/// The ops port on `listener`, where there is one.
fn start_ops(
    listener: Option<std::net::TcpListener>,
    metrics: &Arc<Metrics>,
    supervisor: &Supervisor,
) -> Result<Option<PlainServer>> {
    listener
        .map(|listener| {
            PlainServer::start(
                listener,
                crate::ops_port::router(crate::ops_port::OpsState {
                    metrics: metrics.clone(),
                    runtime: supervisor.status(),
                }),
            )
        })
        .transpose()
}

/// The host-port guard of the policy file (the built-in defaults without one), with the agent's
/// own ports excluded whatever the policy says, the release hook's among them; and the policy
/// file's watcher, if any.
fn host_port_guard(
    options: &AgentOptions,
    release_listener: Option<&std::net::TcpListener>,
) -> Result<(Arc<crate::guards::HostPortGuard>, Option<tokio::task::JoinHandle<()>>)> {
    let mut own_ports = own_ports(options);
    if let Some(Ok(address)) = release_listener.map(std::net::TcpListener::local_addr) {
        own_ports.push(address.port());
    }
    let host_ports = crate::guards::HostPortGuard::load(options.guards.policy_file.as_deref(), &own_ports)?;
    let policy_watch = options
        .guards
        .policy_file
        .clone()
        .map(|path| host_ports.spawn_reload(path, options.file_poll_interval));
    Ok((host_ports, policy_watch))
}

/// The node API's `state` with what the agent keeps and refuses: the workload, suspension and
/// pool records, the stream and upload limits, the machines' volumes, the host-port guard and
/// the private-image records.
fn with_records_and_guards(
    state: NodeApiState,
    options: &AgentOptions,
    suspensions: &Arc<SuspendRecords>,
    pools: &Arc<PoolBook>,
    machine_volumes: Arc<crate::volumes::Volumes>,
    host_ports: Arc<crate::guards::HostPortGuard>,
) -> Result<NodeApiState> {
    let state = match &options.workload_records {
        Some(dir) => state.with_workload_records(dir.clone()),
        None => state,
    };
    let state = state
        .with_suspend_records(suspensions.clone())
        .with_pool_book(pools.clone())
        .with_stream_limits(options.limits.streams)
        .with_upload_budget(options.limits.upload_bytes)
        .with_volumes(machine_volumes);
    let state = state.with_host_ports(host_ports);
    Ok(match &options.guards.image_records {
        Some(dir) => state.with_images(Arc::new(
            crate::images::ImageGuard::open(dir).map_err(|e| Error::io("opening the image records", dir, e))?,
        )),
        None => state,
    })
}

/// The runtime CA's certificates, as given or read from their file.
fn client_ca_pem(client_ca: &ClientCa) -> Result<String> {
    match client_ca {
        ClientCa::Pem(pem) => Ok(pem.clone()),
        ClientCa::File(path) => std::fs::read_to_string(path).map_err(|e| Error::io("reading the client CA", path, e)),
    }
}

impl Agent {
    /// Starts supervision and the servers, with no volumes
    /// ([`crate::volumes::VolumeOptions::default`]: machines with volumes are refused).
    pub async fn start(options: AgentOptions) -> Result<Self> {
        Self::start_with(options, crate::volumes::VolumeOptions::default()).await
    }

    /// Starts supervision and the servers, with machines' volumes as `volumes` says (and the
    /// release hook on its listener). Records kept in memory by `volumes` go beside the
    /// workload records when those are kept.
    pub async fn start_with(options: AgentOptions, mut volumes: crate::volumes::VolumeOptions) -> Result<Self> {
        let metrics = Arc::new(Metrics::default());
        let identity = Identity::new(options.node_name.clone());
        let machine_volumes = machine_volumes(&options, &mut volumes)?;
        let (host_ports, policy_watch) = host_port_guard(&options, volumes.release_listener.as_ref())?;
        let (vmm, pools) = runtime(&options);
        let suspensions = suspend_records(options.workload_records.as_deref());
        let supervision = SupervisorConfig {
            suspensions: Some(suspensions.clone()),
            pools: Some(pools.clone()),
            ..options.supervisor.clone()
        };
        let supervisor = Supervisor::start(supervision, metrics.clone(), identity.clone());

        let state = NodeApiState::new(
            vmm.clone(),
            options.auth.clone(),
            identity.clone(),
            metrics.clone(),
            options.local_image_dir.clone(),
        );
        let activity = crate::activity::Activity::new();
        let state = with_records_and_guards(state, &options, &suspensions, &pools, machine_volumes, host_ports)?
            .with_activity(activity.clone());
        let forwarder = start_forwarder(
            options.publish_address,
            &metrics,
            &vmm,
            options.limits.forward,
            (&activity, &suspensions),
        );
        let state = match &forwarder {
            Some((f, _)) => state.with_forwarder(f.clone()),
            None => state,
        };
        let keeper = tokio::spawn(keep_pools(state.clone(), options.pool_keep_interval));
        let release = start_release(volumes.release_listener, &state)?;
        let mut node_api = MtlsServer::start_bounded(
            options.node_api_listener,
            router(state),
            options.resolver,
            &client_ca_pem(&options.client_ca)?,
            options.limits.node_api,
            Some(metrics.clone()),
        )?;
        metrics.set_serving_cert_loaded(true);
        if let ClientCa::File(path) = options.client_ca {
            node_api.watch_client_ca(path, options.file_poll_interval);
        }
        if let Some((cert, key)) = options.serving_files {
            node_api.watch_serving_files(cert, key, options.file_poll_interval);
        }
        let ops = start_ops(options.ops_listener, &metrics, &supervisor)?;
        tracing::info!(node_api = %node_api.local_addr(), "node API serving");
        Ok(Self {
            node_api,
            ops,
            release,
            supervisor,
            metrics,
            identity,
            vmm,
            suspensions,
            activity,
            pools,
            keeper,
            forwarder,
            policy_watch,
        })
    }

    /// The port forwarder, where forwarding is on.
    pub fn forwarder(&self) -> Option<&Arc<Forwarder>> {
        self.forwarder.as_ref().map(|(f, _)| f)
    }

    /// Address of the node API.
    pub fn node_api_addr(&self) -> SocketAddr {
        self.node_api.local_addr()
    }

    /// Address of the ops port.
    pub fn ops_addr(&self) -> Option<SocketAddr> {
        self.ops.as_ref().map(PlainServer::local_addr)
    }

    /// Address of the release hook, where it serves.
    pub fn release_addr(&self) -> Option<SocketAddr> {
        self.release.as_ref().map(PlainServer::local_addr)
    }

    /// The supervisor.
    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// Metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Identity (node UID is filled in by the reporter).
    pub fn identity(&self) -> &Arc<Identity> {
        &self.identity
    }

    /// The runtime client the node API uses.
    pub fn vmm(&self) -> &Arc<dyn Vmm> {
        &self.vmm
    }

    /// The records of the machines this agent suspended.
    pub fn suspensions(&self) -> &Arc<SuspendRecords> {
        &self.suspensions
    }

    /// Each machine's use and the wakes asked for, which the heartbeat reports.
    pub fn activity(&self) -> &Arc<crate::activity::Activity> {
        &self.activity
    }

    /// The records of the pools this agent keeps and of the machines served from them.
    pub fn pools(&self) -> &Arc<PoolBook> {
        &self.pools
    }

    /// The node API server (serving certificate and client CA reload).
    pub fn node_api(&self) -> &MtlsServer {
        &self.node_api
    }

    /// Stops the servers, then smolvm.
    pub async fn shutdown(self) {
        let grace = Duration::from_secs(2);
        if let Some((_, sync)) = &self.forwarder {
            sync.abort();
        }
        if let Some(watch) = &self.policy_watch {
            watch.abort();
        }
        self.keeper.abort();
        self.node_api.shutdown(grace).await;
        if let Some(ops) = self.ops {
            ops.shutdown(grace).await;
        }
        if let Some(release) = self.release {
            release.shutdown(grace).await;
        }
        self.supervisor.shutdown().await;
    }
}

/// The pools' keeper: every `interval`, the leases of the served machines are heartbeated and
/// every recorded pool smolvm lost (it restarted) is made again ([`crate::pools::keep_once`]).
async fn keep_pools(state: crate::nodeapi::NodeApiState, interval: Duration) {
    let vmm = state.vmm.clone();
    let book = state.pools.clone();
    loop {
        tokio::time::sleep(interval).await;
        crate::pools::keep_once(&vmm, &book, |name, _| {
            let state = state.clone();
            async move {
                // Registry credentials are never stored: a private image's pool waits for the
                // controller's next apply.
                if let Err(error) = crate::nodeapi::pools::remake_pool(&state, &name).await {
                    tracing::warn!(pool = %name, code = error.0.body.code.as_str(), message = %error.0.body.message, "cannot make the pool again");
                }
            }
        })
        .await;
    }
}

/// The runtime the node API drives: smolvm's client, with the machines served from pools under
/// their own names ([`LeasedVmm`]), and the records of the pools, beside the workload records
/// (in memory without them).
fn runtime(options: &AgentOptions) -> (Arc<dyn Vmm>, Arc<PoolBook>) {
    let mut smolvm_config = SmolvmConfig::new(&options.supervisor.socket);
    if let Some(dir) = &options.local_image_dir {
        smolvm_config = smolvm_config.with_local_image_dir(dir);
    }
    let pools = Arc::new(match options.workload_records.as_deref() {
        Some(dir) => PoolBook::beside(dir),
        None => PoolBook::in_memory(),
    });
    let vmm: Arc<dyn Vmm> = Arc::new(LeasedVmm::new(
        Arc::new(SmolvmClient::new(smolvm_config)),
        pools.clone(),
    ));
    (vmm, pools)
}

/// The records of the machines the agent suspends: beside the workload records, or in memory
/// without them.
fn suspend_records(workload_records: Option<&std::path::Path>) -> Arc<SuspendRecords> {
    Arc::new(match workload_records {
        Some(dir) => SuspendRecords::beside(dir),
        None => SuspendRecords::in_memory(),
    })
}

/// The ports the agent listens on: the node API, the ops port, and the guest rollout port of
/// the smolvm it starts. No VM may publish them.
fn own_ports(options: &AgentOptions) -> Vec<u16> {
    let mut ports = Vec::new();
    if let Ok(address) = options.node_api_listener.local_addr() {
        ports.push(address.port());
    }
    if let Some(Ok(address)) = options.ops_listener.as_ref().map(std::net::TcpListener::local_addr) {
        ports.push(address.port());
    }
    if let Some(spawn) = &options.supervisor.spawn {
        ports.push(spawn.guest_rollout_port);
    }
    ports
}

/// The port forwarder from the node's address to smolvm's loopback listeners, where the publish
/// address is one (not loopback, not unspecified), with its sync task.
fn start_forwarder(
    publish_address: Option<std::net::IpAddr>,
    metrics: &Arc<Metrics>,
    vmm: &Arc<dyn Vmm>,
    limits: crate::forward::ForwardLimits,
    (activity, suspensions): (&Arc<crate::activity::Activity>, &Arc<SuspendRecords>),
) -> Option<(Arc<Forwarder>, tokio::task::JoinHandle<()>)> {
    match publish_address {
        Some(address) if !address.is_loopback() && !address.is_unspecified() => {
            let forwarder = Forwarder::waking(address, metrics.clone(), limits, activity.clone(), suspensions.clone());
            let sync = forwarder.spawn_sync(vmm.clone(), Duration::from_secs(1));
            tracing::info!(%address, limits = ?limits, "forwarding published ports from the node's address to smolvm's loopback listeners");
            Some((forwarder, sync))
        }
        Some(address) => {
            tracing::info!(%address, "port forwarding off: the publish address is where smolvm's own loopback listeners already are");
            None
        }
        None => {
            tracing::warn!(
                "port forwarding off: no publish address (set --publish-address or NODE_IP); published ports are reachable on this host's loopback only"
            );
            None
        }
    }
}
