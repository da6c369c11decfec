//! `smolvm-runtime`: the node agent (DaemonSet), and `smolvm-runtime hold`, the container of a
//! SmolVM's holder Pod ([`smolvm_runtime::hold`]). See `--help`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use smolvm_api::types::Endpoint;
use smolvm_certs::ReloadableResolver;
use smolvm_runtime::agent::{Agent, AgentOptions, ClientCa};
use smolvm_runtime::canary;
use smolvm_runtime::cli::{Flags, RENAMED, Switch, advertise_address};
use smolvm_runtime::error::{Error, Result};
use smolvm_runtime::host;
use smolvm_runtime::nodeapi::auth::TokenAuth;
use smolvm_runtime::serving_cert;
use smolvm_runtime::smolvm_node::{Observation, Reporter, spawn_reporter};
use smolvm_runtime::supervisor::{SpawnConfig, SupervisorConfig};

fn bind(addr: SocketAddr, what: &'static str) -> Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr).map_err(|e| Error::Serve {
        what,
        message: format!("bind {addr}: {e}"),
    })
}

fn read(path: &Path, what: &'static str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(what, path, e))
}

async fn run(flags: Flags) -> Result<()> {
    let client = if flags.standalone {
        None
    } else {
        Some(smolvm_kit::client::client("smolvm-runtime", env!("CARGO_PKG_VERSION")).await?)
    };
    let (resolver, serving_files) = serving_identity(&flags, client.as_ref()).await?;
    let (auth, _token_watch) = TokenAuth::from_file(flags.token_file.clone(), Duration::from_secs(2))?;
    let volumes = volume_options(&flags)?;
    let options = agent_options(&flags, resolver.clone(), serving_files, auth)?;
    let agent = Agent::start_with(options, volumes).await?;
    let (background, canary_task) = match client {
        Some(client) => cluster_tasks(&flags, &agent, client, resolver)?,
        None => (Vec::new(), None),
    };

    smolvm_kit::shutdown::signal().await;
    drop(canary_task);
    for task in background {
        task.abort();
    }
    agent.shutdown().await;
    Ok(())
}

/// Where `smolvm serve` listens, and how to start it: `None` to attach to --attach-socket.
fn smolvm_serve(flags: &Flags, local_image_dir: &Path) -> (PathBuf, Option<SpawnConfig>) {
    match &flags.attach_socket {
        Some(socket) => (socket.clone(), None),
        None => (
            flags.run_dir.join("smolvm.sock"),
            Some(SpawnConfig {
                bin: flags.smolvm_bin.clone(),
                state_dir: flags.state_dir.join("state"),
                local_image_dir: local_image_dir.to_path_buf(),
                guest_rollout_port: flags.guest_rollout_port,
                env: flags.smolvm_env.clone(),
                log_file: None,
            }),
        ),
    }
}

/// The volumes' directories, and the release hook's listener (bound here, on localhost).
fn volume_options(flags: &Flags) -> Result<smolvm_runtime::volumes::VolumeOptions> {
    let release_address = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, flags.release_port));
    Ok(smolvm_runtime::volumes::VolumeOptions {
        kubelet_root: flags.kubelet_root_dir.clone(),
        stable_root: Some(flags.state_dir.join("volumes")),
        records: Some(flags.state_dir.join("operator").join("volumes")),
        release_listener: Some(bind(release_address, "release hook")?),
        binder: Arc::new(smolvm_runtime::volumes::MountBinder),
    })
}

/// The agent's options from its flags; the node API and ops listeners are bound here.
fn agent_options(
    flags: &Flags,
    resolver: Arc<ReloadableResolver>,
    serving_files: Option<(PathBuf, PathBuf)>,
    auth: Arc<TokenAuth>,
) -> Result<AgentOptions> {
    let local_image_dir = flags
        .local_image_dir
        .clone()
        .unwrap_or_else(|| flags.state_dir.join("images"));
    let (socket, spawn) = smolvm_serve(flags, &local_image_dir);
    Ok(AgentOptions {
        node_name: flags.node_name.clone(),
        supervisor: SupervisorConfig::new(socket, spawn),
        local_image_dir: Some(local_image_dir),
        node_api_listener: bind(SocketAddr::new(flags.listen_address, flags.port), "node API")?,
        ops_listener: Some(bind(flags.ops_address, "ops port")?),
        resolver,
        serving_files,
        client_ca: ClientCa::File(flags.client_ca.clone()),
        auth,
        file_poll_interval: Duration::from_secs(2),
        pool_keep_interval: smolvm_runtime::pools::KEEP_INTERVAL,
        workload_records: Some(flags.state_dir.join("operator").join("workloads")),
        publish_address: flags
            .publish_address
            .or_else(|| std::env::var("NODE_IP").ok().and_then(|ip| ip.parse().ok())),
        guards: smolvm_runtime::guards::GuardOptions {
            policy_file: flags.policy.clone(),
            image_records: Some(flags.state_dir.join("operator").join("images")),
        },
        limits: smolvm_runtime::limits::Limits::from_flags(flags, smolvm_runtime::limits::open_files_limit())?,
    })
}

/// What runs against the cluster, to be aborted on shutdown: the serving certificate's
/// renewal (when the agent obtained it through a CSR) and the SmolVMNode reporter. And the
/// guest boot check, which runs while the agent reports (it needs no Kubernetes itself, but only
/// a reported SmolVMNode makes its result matter); dropped, it stops.
fn cluster_tasks(
    flags: &Flags,
    agent: &Agent,
    client: kube::Client,
    resolver: Arc<ReloadableResolver>,
) -> Result<(Vec<tokio::task::JoinHandle<()>>, Option<canary::Canary>)> {
    let mut background = Vec::new();
    if flags.tls_cert.is_none() {
        // Checked every 5 s: a CA rotation waits for this agent's new certificate.
        background.push(serving_cert::spawn_renewal(
            client.clone(),
            flags.node_name.clone(),
            resolver.clone(),
            agent.node_api().client_ca().clone(),
            Duration::from_secs(5),
            Duration::from_secs(30),
        ));
    }
    let canary = start_canary(flags, agent);
    let reporter = Reporter::new(client, flags.node_name.clone());
    let reporter = match &canary {
        Some(canary) => reporter.with_recheck(canary.requester()),
        None => reporter,
    };
    background.push(spawn_reporter(
        reporter,
        flags.heartbeat_interval,
        Some(agent.activity().clone()),
        observer(flags, agent, resolver, canary.as_ref().map(canary::Canary::subscribe))?,
    ));
    Ok((background, canary))
}

/// The serving certificate: from --tls-cert and --tls-key (with the files to watch), else
/// obtained through a CSR filed for this node.
async fn serving_identity(
    flags: &Flags,
    client: Option<&kube::Client>,
) -> Result<(Arc<ReloadableResolver>, Option<(PathBuf, PathBuf)>)> {
    Ok(match (&flags.tls_cert, &flags.tls_key, client) {
        (Some(cert), Some(key), _) => (
            Arc::new(ReloadableResolver::from_pem(
                &read(cert, "reading the serving certificate")?,
                &read(key, "reading the serving key")?,
            )?),
            Some((cert.clone(), key.clone())),
        ),
        (_, _, Some(client)) => {
            let pair = serving_cert::request_serving_cert(
                client.clone(),
                &flags.node_name,
                Duration::from_secs(2),
                Duration::from_secs(600),
            )
            .await?;
            (
                Arc::new(ReloadableResolver::from_pem(&pair.cert_pem, &pair.key_pem)?),
                None,
            )
        }
        _ => {
            return Err(Error::Config("--standalone needs --tls-cert and --tls-key".into()));
        }
    })
}

/// The guest boot check, as `--canary` says (`None` when off).
fn start_canary(flags: &Flags, agent: &Agent) -> Option<canary::Canary> {
    match flags.canary {
        Switch::On => Some(canary::spawn(
            agent.vmm().clone(),
            agent.supervisor().status(),
            agent.metrics().clone(),
            canary::Config {
                interval: flags.canary_interval,
                boot_timeout: flags.canary_boot_timeout,
                poll: Duration::from_secs(5),
                kvm_device: flags.kvm_device.clone(),
                smolvm_env: flags.smolvm_env.clone(),
            },
        )),
        Switch::Off => {
            tracing::warn!("guest boot check off (--canary=off): VMs are placed here without proof that a guest boots");
            None
        }
    }
}

/// What each heartbeat reports: smolvm's state, KVM, the host's capacity less the reservations,
/// the serving certificate and the guest boot check.
fn observer(
    flags: &Flags,
    agent: &Agent,
    resolver: Arc<ReloadableResolver>,
    boot_check: Option<tokio::sync::watch::Receiver<canary::BootCheck>>,
) -> Result<impl FnMut(&str) -> Observation + Send + 'static> {
    let address = advertise_address(flags.advertise_address.clone())
        .ok_or_else(|| Error::Config("no endpoint address: set --advertise-address, POD_IP or NODE_IP".into()))?;
    let (reserve_cpus, reserve_memory, reserve_storage) = (
        flags.reserved_cpus,
        flags.reserved_memory_mib,
        flags.reserved_storage_gib,
    );
    let cpu_ratio = flags.cpu_allocation_ratio;
    let status = agent.supervisor().status();
    let identity = agent.identity().clone();
    let state_dir = flags.state_dir.clone();
    let kvm_device = flags.kvm_device.clone();
    let last_capacity = std::sync::Mutex::new(None);
    let port = i32::from(flags.port);
    let client_ca = agent.node_api().client_ca().clone();
    let activity = agent.activity().clone();
    Ok(move |node_uid: &str| {
        identity.set_node_uid(Some(node_uid.to_string()));
        let runtime = status.borrow().clone();
        let kvm = host::check_kvm(&kvm_device);
        let capacity = match host::host_capacity(&state_dir) {
            Ok(capacity) => {
                *last_capacity.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(capacity);
                capacity
            }
            Err(error) => {
                // Keep reporting the last reading rather than zero; without one, zero
                // (nothing is placed here) is the safe answer.
                let last = *last_capacity.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                tracing::warn!(reason = error.reason(), %error, kept_last = last.is_some(), "reading host capacity failed");
                last.unwrap_or_default()
            }
        };
        let used = activity.report();
        Observation {
            node_uid: node_uid.to_string(),
            endpoint: Endpoint {
                address: address.clone(),
                port,
            },
            internal_ip: None,
            runtime_version: runtime.version.clone(),
            runtime_ready: runtime.ready,
            runtime_message: runtime.message.clone(),
            kvm_available: kvm.available,
            kvm_message: kvm.message,
            capacity,
            allocatable: host::allocatable(
                capacity,
                host::reservations(capacity, reserve_cpus, reserve_memory, reserve_storage),
                cpu_ratio,
            ),
            machines: runtime.ready.then(|| runtime.machines.clone()),
            suspended_machines: runtime.ready.then(|| runtime.suspended.clone()),
            pools: runtime.ready.then(|| runtime.pools.clone()),
            activity: used.0,
            wake_requests: used.1,
            serving_certificate: Some(serving_cert::report_current(&resolver, &client_ca)),
            boot_check: boot_check.as_ref().map(|check| check.borrow().clone()),
        }
    })
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The holder Pod's container: before anything of the agent is set up.
    if smolvm_runtime::hold::requested(&args) {
        return smolvm_runtime::hold::run(&args[2..]);
    }
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(agent()),
        Err(error) => {
            eprintln!("smolvm-runtime: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The agent, as its flags say.
async fn agent() -> ExitCode {
    smolvm_runtime::install_crypto_provider();
    let (flags, deprecated) = smolvm_kit::cli::parse::<Flags>(RENAMED);
    smolvm_kit::log::init(flags.log_format);
    smolvm_kit::cli::warn_deprecated(&deprecated);
    match run(flags).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(
                error = %smolvm_kit::causes::explained(&error),
                reason = error.reason(),
                "smolvm-runtime failed"
            );
            ExitCode::FAILURE
        }
    }
}
