//! Supervision of `smolvm serve`: start it as a child (or attach to an existing socket),
//! health-check it, restart it with exponential backoff, re-list its machines after every
//! (re)start, and publish whether it is ready. The child is stopped (SIGTERM, then SIGKILL)
//! on shutdown.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use smolvm_kit::backoff::{Backoff, Schedule};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::nodeapi::Identity;
use crate::vmm::{SmolvmClient, SmolvmConfig, Vmm};

/// How to run `smolvm serve` as a child.
#[derive(Debug, Clone)]
pub struct SpawnConfig {
    /// The smolvm binary.
    pub bin: PathBuf,
    /// `--state-dir` for smolvm.
    pub state_dir: PathBuf,
    /// `--local-image-dir` for smolvm.
    pub local_image_dir: PathBuf,
    /// `--guest-rollout-port` (distinct per server on a host).
    pub guest_rollout_port: u16,
    /// Extra environment for the child (e.g. `SMOLVM_LIB_DIR`, `SMOLVM_VM_UID_DROP`).
    pub env: Vec<(String, String)>,
    /// File for the child's stdout and stderr; `None` inherits the agent's.
    pub log_file: Option<PathBuf>,
}

/// Supervisor settings.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// The Unix socket smolvm listens on.
    pub socket: PathBuf,
    /// `Some`: start smolvm as a child; `None`: attach to `socket`.
    pub spawn: Option<SpawnConfig>,
    /// Interval of health checks.
    pub health_interval: Duration,
    /// Time a fresh child has to answer its first health check.
    pub startup_timeout: Duration,
    /// Consecutive failed health checks before a restart.
    pub failure_threshold: u32,
    /// First restart delay.
    pub backoff_initial: Duration,
    /// Largest restart delay.
    pub backoff_max: Duration,
    /// Time between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// The machines the agent suspended, to tell them from stopped ones in each listing
    /// ([`RuntimeStatus::suspended`]); `None` reports none.
    pub suspensions: Option<Arc<crate::suspensions::SuspendRecords>>,
    /// The machines served from pools, to list them under their own names rather than their
    /// workers' ([`crate::pools`]); `None` maps none.
    pub pools: Option<Arc<crate::pools::PoolBook>>,
}

impl SupervisorConfig {
    /// Defaults: health every 2 s, 30 s startup, 3 failures, backoff 0.5 s doubling to 30 s.
    pub fn new(socket: PathBuf, spawn: Option<SpawnConfig>) -> Self {
        Self {
            socket,
            spawn,
            health_interval: Duration::from_secs(2),
            startup_timeout: Duration::from_secs(30),
            failure_threshold: 3,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            stop_grace: Duration::from_secs(10),
            suspensions: None,
            pools: None,
        }
    }
}

/// What the supervisor publishes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuntimeStatus {
    /// smolvm answers its health check.
    pub ready: bool,
    /// smolvm's version, once seen.
    pub version: Option<String>,
    /// Machine names listed after the last (re)start, sorted.
    pub machines: Vec<String>,
    /// Of [`RuntimeStatus::machines`], those the agent suspended (stopped, with a record; see
    /// [`crate::suspensions`]), sorted.
    pub suspended: Vec<String>,
    /// The pools smolvm keeps, as last listed, sorted by name.
    pub pools: Vec<smolvm_api::nodeapi::PoolStatus>,
    /// Why not ready (empty when ready).
    pub message: String,
    /// Restarts of the child so far.
    pub restarts: u64,
    /// Process id of the current child.
    pub pid: Option<u32>,
    /// Times smolvm became ready (first start and every restart).
    pub generation: u64,
}

/// A running supervisor.
pub struct Supervisor {
    status: watch::Receiver<RuntimeStatus>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Supervisor {
    /// Starts supervising.
    pub fn start(config: SupervisorConfig, metrics: Arc<Metrics>, identity: Arc<Identity>) -> Self {
        let (status_tx, status) = watch::channel(RuntimeStatus {
            message: "starting".into(),
            ..RuntimeStatus::default()
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(run(config, metrics, identity, status_tx, shutdown_rx));
        Self { status, shutdown, task }
    }

    /// The published status.
    pub fn status(&self) -> watch::Receiver<RuntimeStatus> {
        self.status.clone()
    }

    /// Waits until smolvm is ready for the `generation`-th time (or later), up to `limit`.
    pub async fn wait_ready(&self, generation: u64, limit: Duration) -> Option<RuntimeStatus> {
        let mut rx = self.status.clone();
        let wait = rx.wait_for(|s| s.ready && s.generation >= generation);
        match tokio::time::timeout(limit, wait).await {
            Ok(Ok(status)) => Some(status.clone()),
            _ => None,
        }
    }

    /// Stops the child (SIGTERM, then SIGKILL after the grace period) and the supervisor.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

fn health_client(socket: &std::path::Path) -> SmolvmClient {
    let mut config = SmolvmConfig::new(socket);
    config.connect_timeout = Duration::from_secs(2);
    config.request_timeout = Duration::from_secs(5);
    SmolvmClient::new(config)
}

/// Starts `smolvm serve` as `spawn` says, listening on `socket` (a stale socket file is removed
/// first: callers check that no server answers on it).
pub fn spawn_child(spawn: &SpawnConfig, socket: &std::path::Path) -> std::io::Result<Child> {
    std::fs::create_dir_all(&spawn.state_dir)?;
    std::fs::create_dir_all(&spawn.local_image_dir)?;
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // A socket left by a killed server would make the new one fail to bind.
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let (stdout, stderr) = match &spawn.log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
            (Stdio::from(file.try_clone()?), Stdio::from(file))
        }
        None => (Stdio::inherit(), Stdio::inherit()),
    };
    Command::new(&spawn.bin)
        .arg("serve")
        .arg("start")
        .arg("--listen")
        .arg(format!("unix://{}", socket.display()))
        .arg("--state-dir")
        .arg(&spawn.state_dir)
        .arg("--local-image-dir")
        .arg(&spawn.local_image_dir)
        .arg("--guest-rollout-port")
        .arg(spawn.guest_rollout_port.to_string())
        .envs(spawn.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
}

/// SIGTERM, wait up to `grace`, then SIGKILL.
pub async fn terminate(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with our own child's pid and a valid signal number.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        tracing::warn!("smolvm serve ignored SIGTERM; sending SIGKILL");
        let _ = child.kill().await;
    }
}

enum Outcome {
    Shutdown,
    Restart(String),
}

async fn run(
    config: SupervisorConfig,
    metrics: Arc<Metrics>,
    identity: Arc<Identity>,
    status: watch::Sender<RuntimeStatus>,
    mut shutdown: watch::Receiver<bool>,
) {
    let client = health_client(&config.socket);
    let mut restarts = Backoff::<()>::new(Schedule::new(config.backoff_initial, config.backoff_max));
    let mut first = true;
    loop {
        if *shutdown.borrow() {
            break;
        }
        if !first && config.spawn.is_some() {
            metrics.inc_smolvm_restarts();
            status.send_modify(|s| s.restarts += 1);
        }
        first = false;
        let mut child = match &config.spawn {
            // A server an earlier agent started (and could not stop: it was SIGKILLed) may still
            // answer on the socket. Starting a second one would remove its socket and run two
            // servers on one state directory; supervise the one that answers instead, and start
            // our own only once it stops answering.
            Some(_) if config.socket.exists() && client.health().await.is_ok() => {
                tracing::warn!(
                    socket = %config.socket.display(),
                    "a smolvm serve started earlier still answers on the socket; supervising it instead of starting a second one"
                );
                None
            }
            Some(spawn) => match spawn_child(spawn, &config.socket) {
                Ok(child) => {
                    tracing::info!(pid = child.id(), socket = %config.socket.display(), "started smolvm serve");
                    Some(child)
                }
                Err(error) => {
                    let message = format!("cannot start {}: {error}", spawn.bin.display());
                    tracing::error!(%message);
                    mark_down(&status, &metrics, &message, None);
                    let wait = restarts.failed((), std::time::Instant::now(), ());
                    if sleep_or_shutdown(wait, &mut shutdown).await {
                        break;
                    }
                    continue;
                }
            },
            None => None,
        };
        let pid = child.as_ref().and_then(Child::id);
        status.send_modify(|s| s.pid = pid);
        let outcome = supervise_once(
            &config,
            &client,
            child.as_mut(),
            &metrics,
            &identity,
            &status,
            &mut shutdown,
            &mut restarts,
        )
        .await;
        if let Some(child) = child.as_mut() {
            terminate(child, config.stop_grace).await;
        }
        match outcome {
            Outcome::Shutdown => break,
            Outcome::Restart(message) => {
                let wait = restarts.failed((), std::time::Instant::now(), ());
                tracing::warn!(%message, delay_ms = wait.as_millis() as u64, "smolvm serve down; restarting");
                mark_down(&status, &metrics, &message, None);
                if sleep_or_shutdown(wait, &mut shutdown).await {
                    break;
                }
            }
        }
    }
    mark_down(&status, &metrics, "agent shutting down", None);
}

fn mark_down(status: &watch::Sender<RuntimeStatus>, metrics: &Metrics, message: &str, pid: Option<u32>) {
    metrics.set_runtime_ready(false);
    status.send_modify(|s| {
        s.ready = false;
        s.message = message.to_string();
        if pid.is_some() {
            s.pid = pid;
        }
    });
}

/// Sleeps; `true` when shutdown was asked meanwhile.
async fn sleep_or_shutdown(delay: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    let asked = tokio::select! {
        _ = tokio::time::sleep(delay) => false,
        _ = shutdown.wait_for(|s| *s) => true,
    };
    asked || *shutdown.borrow()
}

/// The names of the machines smolvm listed, and of those the agent suspended, both sorted; the
/// suspended-machines gauge follows.
fn listing(config: &SupervisorConfig, metrics: &Metrics, list: &[crate::vmm::Machine]) -> (Vec<String>, Vec<String>) {
    // A machine served from a pool is listed under its own name, not its worker's.
    let served: std::collections::BTreeMap<String, String> = config
        .pools
        .iter()
        .flat_map(|book| book.leases.all())
        .map(|(name, record)| (record.worker, name))
        .collect();
    let renamed: Vec<crate::vmm::Machine>;
    let list = if served.is_empty() {
        list
    } else {
        renamed = list
            .iter()
            .cloned()
            .map(|mut m| {
                if let Some(name) = served.get(&m.name) {
                    m.name = name.clone();
                }
                m
            })
            .collect();
        &renamed
    };
    let mut names: Vec<String> = list.iter().map(|m| m.name.clone()).collect();
    names.sort();
    let suspended = config
        .suspensions
        .as_ref()
        .map(|records| records.suspended_among(list))
        .unwrap_or_default();
    metrics.set_machines_suspended(suspended.len());
    (names, suspended)
}

/// The pools smolvm keeps, and those the agent has a record of ([`crate::pools::with_records`]),
/// sorted by name; `None` when smolvm cannot list them.
async fn pool_listing(
    client: &SmolvmClient,
    book: Option<&crate::pools::PoolBook>,
) -> Option<Vec<smolvm_api::nodeapi::PoolStatus>> {
    use crate::vmm::Vmm as _;
    let mut pools: Vec<smolvm_api::nodeapi::PoolStatus> = client
        .pools()
        .await
        .ok()?
        .into_iter()
        .map(|p| smolvm_api::nodeapi::PoolStatus {
            name: p.name,
            slots: p.desired,
            ready: p.ready,
            provisioning: p.provisioning,
            leased: p.active,
        })
        .collect();
    pools.sort_by(|a, b| a.name.cmp(&b.name));
    Some(match book {
        Some(book) => crate::pools::with_records(pools, book),
        None => pools,
    })
}

#[allow(clippy::too_many_arguments)]
async fn supervise_once(
    config: &SupervisorConfig,
    client: &SmolvmClient,
    mut child: Option<&mut Child>,
    metrics: &Metrics,
    identity: &Identity,
    status: &watch::Sender<RuntimeStatus>,
    shutdown: &mut watch::Receiver<bool>,
    restarts: &mut Backoff<()>,
) -> Outcome {
    let started = tokio::time::Instant::now();
    let mut ready = false;
    let mut failures = 0u32;
    let mut delay = Duration::from_millis(100);
    loop {
        if let Some(outcome) = next_check_or_end(child.as_deref_mut(), shutdown, delay).await {
            return outcome;
        }
        match client.health().await {
            Ok(health) => {
                failures = 0;
                identity.set_runtime_version(Some(health.version.clone()));
                if ready {
                    refresh_listing(config, client, metrics, status).await;
                } else if publish_ready(config, client, metrics, status, &health.version).await {
                    ready = true;
                    restarts.succeeded(&());
                    delay = config.health_interval;
                } else {
                    delay = (delay * 2).min(config.health_interval);
                }
            }
            Err(error) => {
                if ready {
                    failures += 1;
                    tracing::warn!(%error, failures, "smolvm health check failed");
                    if failures >= config.failure_threshold {
                        return Outcome::Restart(format!("health check failed {failures} times: {error}"));
                    }
                } else if started.elapsed() > config.startup_timeout {
                    return Outcome::Restart(format!(
                        "smolvm serve not healthy within {}s: {error}",
                        config.startup_timeout.as_secs()
                    ));
                } else if config.spawn.is_none() {
                    // Attached: report the reason while waiting.
                    mark_down(status, metrics, &error.to_string(), None);
                    delay = config.health_interval;
                }
            }
        }
    }
}

/// Waits `delay` for the next health check; the outcome instead when shutdown is asked or the
/// child exits meanwhile.
async fn next_check_or_end(
    child: Option<&mut Child>,
    shutdown: &mut watch::Receiver<bool>,
    delay: Duration,
) -> Option<Outcome> {
    let exited = async {
        match child {
            Some(child) => child.wait().await.ok(),
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => Some(Outcome::Shutdown),
        exit = exited => {
            let how = exit.map(|s| s.to_string()).unwrap_or_else(|| "unknown status".into());
            Some(Outcome::Restart(format!("smolvm serve exited ({how})")))
        }
        _ = tokio::time::sleep(delay) => None,
    }
}

/// smolvm (re)started and answers: re-lists its machines, so nothing it knows is forgotten,
/// and publishes ready with them. `false` (still not ready) when the listing failed.
async fn publish_ready(
    config: &SupervisorConfig,
    client: &SmolvmClient,
    metrics: &Metrics,
    status: &watch::Sender<RuntimeStatus>,
    version: &str,
) -> bool {
    let (machines, suspended) = match client.list().await {
        Ok(list) => listing(config, metrics, &list),
        Err(error) => {
            // Not ready on an empty list: that would forget the machines.
            tracing::warn!(%error, "listing machines after start failed; not ready until it succeeds");
            return false;
        }
    };
    tracing::info!(version = %version, machines = machines.len(), "smolvm serve ready");
    metrics.set_runtime_ready(true);
    status.send_modify(|s| {
        s.ready = true;
        s.version = Some(version.to_string());
        s.machines = machines;
        s.suspended = suspended;
        s.message.clear();
        s.generation += 1;
    });
    true
}

/// Keeps the machine and pool lists current while smolvm is ready: the SmolVMNode reports
/// them, and the controller finds machines no SmolVM owns from them. A failed listing keeps
/// the last one; so does a failed listing of the pools.
async fn refresh_listing(
    config: &SupervisorConfig,
    client: &SmolvmClient,
    metrics: &Metrics,
    status: &watch::Sender<RuntimeStatus>,
) {
    let Ok(list) = client.list().await else {
        return;
    };
    let (mut machines, mut suspended) = listing(config, metrics, &list);
    let pools = pool_listing(client, config.pools.as_deref()).await;
    status.send_if_modified(|s| {
        let mut changed = s.machines != machines || s.suspended != suspended;
        if changed {
            s.machines = std::mem::take(&mut machines);
            s.suspended = std::mem::take(&mut suspended);
        }
        if let Some(pools) = pools
            && pools != s.pools
        {
            s.pools = pools;
            changed = true;
        }
        changed
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_wait_the_configured_schedule() {
        let config = SupervisorConfig::new(PathBuf::from("smolvm.sock"), None);
        let mut restarts = Backoff::<()>::new(Schedule::new(config.backoff_initial, config.backoff_max));
        let now = std::time::Instant::now();
        let waits: Vec<u128> = (0..8).map(|_| restarts.failed((), now, ()).as_millis()).collect();
        assert_eq!(waits, [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
        restarts.succeeded(&());
        assert_eq!(restarts.failed((), now, ()).as_millis(), 500);
    }
}
