//! Published ports, reachable from the cluster.
//!
//! smolvm publishes a machine's ports on 127.0.0.1 only (it has no bind address). The agent runs
//! on the node's network and, for every published port of every running machine, listens on the
//! node's address and relays to that loopback port: TCP connections byte for byte (half-close
//! kept), UDP datagrams through one upstream socket per client. [`plan`] decides which forwards
//! to open and close from the machines smolvm reports; [`Forwarder`] does it. A suspended
//! machine (smolvm reports it stopped) has none: its ports close with the suspend and open
//! again with the resume. A machine the controller suspended for idleness with `wakeOnTraffic`
//! keeps its forwards (SPEC 2.7): a TCP connection that arrives while it sleeps is held (at most
//! `held_per_port` per port, for at most `hold_timeout`, then refused and counted), a wake is
//! asked for ([`crate::activity`]), and the connection is relayed once the machine runs, so the
//! first client is served; a UDP datagram asks for the wake and is dropped (its client sends
//! again). Every byte relayed counts as the machine's activity. The agent re-syncs
//! every second and at once after each node API call that changes a machine, and at start, so a
//! restarted agent picks up the machines that kept running.
//!
//! Anyone who can reach the node's address reaches a published port, so the forwarder bounds
//! what clients may hold ([`ForwardLimits`]): concurrent TCP connections per port and for the
//! whole agent (within a file-descriptor budget that keeps a reserve for the node API and
//! smolvm's socket, [`connection_budget`]), UDP sessions per port and per source address, and
//! time without a byte either way. A connection beyond a cap is closed at once and counted
//! (`smolvm_runtime_forward_refused_total`); accept errors (out of descriptors) back off instead
//! of spinning.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;

use crate::activity::{Activity, MachineUse};
use crate::metrics::Metrics;
use crate::suspensions::SuspendRecords;
use crate::vmm::{Machine, MachineState, Vmm};
use smolvm_api::Protocol;
use smolvm_kit::accept::AcceptBackoff;

/// One published port on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    /// The host port.
    pub port: u16,
    /// Its transport.
    pub protocol: Protocol,
}

impl std::fmt::Display for PortKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.port, self.protocol)
    }
}

/// What to change so the open forwards match the running machines.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Forwards to open: the port and the machine it belongs to.
    pub open: Vec<(PortKey, String)>,
    /// Forwards to close.
    pub close: Vec<PortKey>,
}

/// The forwards the running machines need, and those of the sleeping machines traffic wakes
/// (`wakeable`: suspended for idleness with `wakeOnTraffic`), against those open now (port →
/// machine). A port that moved to another machine is closed and opened again; a machine that
/// goes to sleep or wakes keeps its forwards.
pub fn plan(machines: &[Machine], wakeable: &BTreeSet<String>, open: &BTreeMap<PortKey, String>) -> Plan {
    let mut want: BTreeMap<PortKey, &str> = BTreeMap::new();
    let forwarded = |m: &&Machine| {
        m.state == MachineState::Running || (m.state == MachineState::Stopped && wakeable.contains(&m.name))
    };
    // The running first: a port a sleeping machine and a running one both name is the running one's.
    let (running, sleeping): (Vec<&Machine>, Vec<&Machine>) = machines
        .iter()
        .filter(forwarded)
        .partition(|m| m.state == MachineState::Running);
    for m in running.into_iter().chain(sleeping) {
        for p in &m.ports {
            want.entry(PortKey {
                port: p.host_port,
                protocol: p.protocol,
            })
            .or_insert(&m.name);
        }
    }
    let close: Vec<PortKey> = open
        .iter()
        .filter(|(key, machine)| want.get(key) != Some(&machine.as_str()))
        .map(|(key, _)| *key)
        .collect();
    let opened = want
        .into_iter()
        .filter(|(key, machine)| open.get(key).map(String::as_str) != Some(*machine))
        .map(|(key, machine)| (key, machine.to_string()))
        .collect();
    Plan { open: opened, close }
}

/// Whether `key` can be bound on `address` now (tried, then released at once).
pub fn port_free(address: IpAddr, key: PortKey) -> bool {
    let at = SocketAddr::new(address, key.port);
    match key.protocol {
        Protocol::Tcp => std::net::TcpListener::bind(at).is_ok(),
        Protocol::Udp => std::net::UdpSocket::bind(at).is_ok(),
    }
}

/// Idle UDP sessions are dropped after this long.
const UDP_IDLE: Duration = Duration::from_secs(60);

/// What one client may hold through the forwarder; see the module's doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardLimits {
    /// Most concurrent TCP connections per published port.
    pub connections_per_port: usize,
    /// Most concurrent TCP connections and UDP sessions over all ports of the agent (already
    /// within the file-descriptor budget, [`connection_budget`]).
    pub connections: usize,
    /// A TCP connection that carries no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// Most TCP connections held per port while its machine wakes; more are refused.
    pub held_per_port: usize,
    /// How long a held connection waits for its machine to run before it is refused.
    pub hold_timeout: Duration,
    /// Most concurrent UDP client sessions per published port.
    pub udp_sessions_per_port: usize,
    /// Most concurrent UDP client sessions per source address on one port.
    pub udp_sessions_per_source: usize,
}

impl Default for ForwardLimits {
    /// The flags' defaults (`smolvm-runtime --help`).
    fn default() -> Self {
        Self {
            connections_per_port: 1024,
            connections: 8192,
            idle_timeout: Duration::from_secs(3600),
            held_per_port: 64,
            hold_timeout: Duration::from_secs(60),
            udp_sessions_per_port: 1024,
            udp_sessions_per_source: 256,
        }
    }
}

/// File descriptors one forwarded TCP connection holds: the client's and smolvm's side. (A UDP
/// session holds one; it is counted as a connection, which errs on the safe side.)
pub const FDS_PER_CONNECTION: u64 = 2;

/// The open-files limit assumed when it cannot be read (the usual soft default).
pub const ASSUMED_NOFILE: u64 = 1024;

/// The agent-wide connection cap: `wanted` (the flag), within what the process's open-files
/// limit `nofile` leaves once `reserve` descriptors are kept for the node API, smolvm's socket,
/// the log and state files. A reserve above half the limit is cut to half, so a low limit
/// still forwards something and still keeps half for the rest. An unknown limit is taken as
/// [`ASSUMED_NOFILE`].
pub fn connection_budget(wanted: usize, nofile: Option<u64>, reserve: u64) -> usize {
    let nofile = nofile.unwrap_or(ASSUMED_NOFILE);
    let reserve = reserve.min(nofile / 2);
    let budget = nofile.saturating_sub(reserve) / FDS_PER_CONNECTION;
    wanted.min(usize::try_from(budget).unwrap_or(usize::MAX))
}

/// Why a connection or session was refused (the metric's `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The port's cap.
    Port,
    /// The agent's cap (or its file-descriptor budget).
    Agent,
    /// The per-source cap of a UDP port.
    Source,
    /// The port's cap of connections held while its machine wakes.
    WakeCap,
    /// A held connection's machine did not run within the hold timeout.
    WakeTimeout,
    /// A UDP datagram to a sleeping machine (dropped; it asked for the wake).
    Asleep,
}

impl Refusal {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Port => "port",
            Refusal::Agent => "agent",
            Refusal::Source => "source",
            Refusal::WakeCap => "wake_cap",
            Refusal::WakeTimeout => "wake_timeout",
            Refusal::Asleep => "asleep",
        }
    }
}

/// Whether a UDP port with `sessions` sessions, `from_source` of them from the new client's
/// address, may open one more.
pub fn admit_udp(sessions: usize, from_source: usize, limits: &ForwardLimits) -> Result<(), Refusal> {
    if sessions >= limits.udp_sessions_per_port {
        Err(Refusal::Port)
    } else if from_source >= limits.udp_sessions_per_source {
        Err(Refusal::Source)
    } else {
        Ok(())
    }
}

struct Open {
    machine: String,
    task: JoinHandle<()>,
    /// Whether the machine runs (false: it sleeps and traffic wakes it).
    awake: watch::Sender<bool>,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        for open in self.open.get_mut().unwrap_or_else(PoisonError::into_inner).values() {
            open.task.abort();
        }
    }
}

/// Forwards from the node's address to smolvm's loopback listeners.
pub struct Forwarder {
    address: IpAddr,
    open: Mutex<BTreeMap<PortKey, Open>>,
    metrics: Arc<Metrics>,
    poke: Notify,
    limits: ForwardLimits,
    /// The agent-wide connection slots, shared by every port.
    slots: Arc<Semaphore>,
    /// Each machine's use, and the wakes asked for.
    activity: Arc<Activity>,
    /// The agent's suspensions: which sleeping machines traffic wakes.
    suspensions: Option<Arc<SuspendRecords>>,
}

impl Forwarder {
    /// A forwarder that listens on `address` (the node's, never loopback or unspecified), with
    /// the default limits.
    pub fn new(address: IpAddr, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::with_limits(address, metrics, ForwardLimits::default())
    }

    /// A forwarder bounded by `limits`, which forwards running machines only.
    pub fn with_limits(address: IpAddr, metrics: Arc<Metrics>, limits: ForwardLimits) -> Arc<Self> {
        Arc::new(Self::made(address, metrics, limits, (Activity::new(), None)))
    }

    /// A forwarder bounded by `limits` that records use in `activity` and keeps the forwards of
    /// the sleeping machines `suspensions` says traffic wakes.
    pub fn waking(
        address: IpAddr,
        metrics: Arc<Metrics>,
        limits: ForwardLimits,
        activity: Arc<Activity>,
        suspensions: Arc<SuspendRecords>,
    ) -> Arc<Self> {
        Arc::new(Self::made(address, metrics, limits, (activity, Some(suspensions))))
    }

    fn made(
        address: IpAddr,
        metrics: Arc<Metrics>,
        limits: ForwardLimits,
        (activity, suspensions): (Arc<Activity>, Option<Arc<SuspendRecords>>),
    ) -> Self {
        Self {
            address,
            open: Mutex::default(),
            metrics,
            poke: Notify::new(),
            slots: Arc::new(Semaphore::new(limits.connections.min(Semaphore::MAX_PERMITS))),
            limits,
            activity,
            suspensions,
        }
    }

    /// Its limits.
    pub fn limits(&self) -> ForwardLimits {
        self.limits
    }

    /// The address it listens on.
    pub fn address(&self) -> IpAddr {
        self.address
    }

    /// The forwards open now: port → machine.
    pub fn open_forwards(&self) -> BTreeMap<PortKey, String> {
        self.lock().iter().map(|(k, o)| (*k, o.machine.clone())).collect()
    }

    /// Whether `key` is forwarded for `machine` now.
    pub fn holds(&self, key: PortKey, machine: &str) -> bool {
        self.lock().get(&key).is_some_and(|o| o.machine == machine)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<PortKey, Open>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens and closes forwards so they match `machines` (and the sleeping machines among them
    /// that traffic wakes), and tells each forward whether its machine runs. A port that cannot
    /// be bound is logged and tried again on the next sync.
    pub async fn sync(&self, machines: &[Machine]) {
        let wakeable = self
            .suspensions
            .as_ref()
            .map(|records| records.wakeable_among(machines))
            .unwrap_or_default();
        let plan = plan(machines, &wakeable, &self.open_forwards());
        for key in &plan.close {
            let removed = self.lock().remove(key);
            if let Some(open) = removed {
                // The task owns the listening socket and every relayed connection: once it has
                // ended, the port is free on the node's address again.
                open.task.abort();
                let _ = open.task.await;
                tracing::info!(port = %key, machine = %open.machine, "closed forward");
            }
        }
        let running: BTreeSet<&str> = machines
            .iter()
            .filter(|m| m.state == MachineState::Running)
            .map(|m| m.name.as_str())
            .collect();
        for (key, machine) in plan.open {
            let (awake, asleep) = watch::channel(running.contains(machine.as_str()));
            match self.listen(key, &machine, asleep).await {
                Ok(task) => {
                    tracing::info!(port = %key, %machine, address = %self.address, "forwarding to smolvm's loopback port");
                    self.lock().insert(key, Open { machine, task, awake });
                }
                Err(error) => {
                    tracing::warn!(port = %key, %machine, address = %self.address, %error, "cannot forward the port yet");
                }
            }
        }
        for open in self.lock().values() {
            let runs = running.contains(open.machine.as_str());
            open.awake
                .send_if_modified(|awake| std::mem::replace(awake, runs) != runs);
        }
        self.metrics.set_open_forwards(self.lock().len() as u64);
    }

    /// Asks the sync loop to run now (after a start, stop or delete).
    pub fn poke(&self) {
        self.poke.notify_one();
    }

    /// Re-syncs from smolvm's machine list every `interval` and whenever poked, until aborted.
    pub fn spawn_sync(self: &Arc<Self>, vmm: Arc<dyn Vmm>, interval: Duration) -> JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                match vmm.list().await {
                    Ok(machines) => {
                        this.sync(&machines).await;
                        // Forgotten with the list the forwards were just made from, so that no
                        // forward keeps the use of a machine the record no longer holds.
                        let names: Vec<String> = machines.iter().map(|m| m.name.clone()).collect();
                        this.activity.retain(&names);
                    }
                    // smolvm restarting: keep what is open; its machines keep running.
                    Err(error) => tracing::debug!(%error, "listing machines for the forwards failed"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = this.poke.notified() => {}
                }
            }
        })
    }

    async fn listen(
        &self,
        key: PortKey,
        machine: &str,
        awake: watch::Receiver<bool>,
    ) -> std::io::Result<JoinHandle<()>> {
        let at = SocketAddr::new(self.address, key.port);
        let upstream = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), key.port);
        let bounds = Bounds {
            metrics: self.metrics.clone(),
            limits: self.limits,
            agent: self.slots.clone(),
            machine: Waker {
                name: machine.to_string(),
                use_: self.activity.of(machine),
                activity: self.activity.clone(),
                awake,
            },
        };
        Ok(match key.protocol {
            Protocol::Tcp => {
                let listener = TcpListener::bind(at).await?;
                tokio::spawn(relay_tcp(listener, upstream, bounds))
            }
            Protocol::Udp => {
                let socket = Arc::new(UdpSocket::bind(at).await?);
                tokio::spawn(relay_udp(socket, upstream, bounds))
            }
        })
    }
}

/// What every relay of a forwarder shares, and the machine of its port.
#[derive(Clone)]
struct Bounds {
    metrics: Arc<Metrics>,
    limits: ForwardLimits,
    agent: Arc<Semaphore>,
    machine: Waker,
}

/// A forward's machine: its use, whether it runs, and how to ask for its wake.
#[derive(Clone)]
struct Waker {
    name: String,
    use_: Arc<MachineUse>,
    activity: Arc<Activity>,
    awake: watch::Receiver<bool>,
}

/// How often a held connection tries smolvm's port once its machine runs again (smolvm binds
/// it a moment after the resume returns), and for how long.
const UPSTREAM_RETRY: Duration = Duration::from_millis(10);
const UPSTREAM_RETRY_FOR: Duration = Duration::from_secs(5);

impl Waker {
    fn runs(&self) -> bool {
        *self.awake.borrow()
    }

    /// Holds a connection while the machine wakes: asks for the wake and waits until it runs,
    /// for at most `timeout` (false: it did not).
    async fn wait_awake(&self, timeout: Duration) -> bool {
        let mut awake = self.awake.clone();
        self.activity.ask_wake(&self.name);
        let woke = tokio::time::timeout(timeout, awake.wait_for(|runs| *runs)).await;
        self.activity.woke(&self.name);
        matches!(woke, Ok(Ok(_)))
    }
}

/// Connects to smolvm's port; a held connection's machine may bind it a moment after it runs
/// again, so a refusal is tried again for a while.
async fn connect_upstream(upstream: SocketAddr, held: bool) -> std::io::Result<TcpStream> {
    let started = tokio::time::Instant::now();
    loop {
        match TcpStream::connect(upstream).await {
            Ok(server) => return Ok(server),
            Err(error) if held && started.elapsed() < UPSTREAM_RETRY_FOR => {
                tracing::trace!(%upstream, %error, "smolvm's port not open yet after the wake");
                tokio::time::sleep(UPSTREAM_RETRY).await;
            }
            Err(error) => return Err(error),
        }
    }
}

impl Bounds {
    fn agent_slot(&self, protocol: &'static str) -> Option<OwnedSemaphorePermit> {
        let slot = self.agent.clone().try_acquire_owned().ok();
        if slot.is_none() {
            self.metrics.inc_forward_refused(protocol, Refusal::Agent.label());
        }
        slot
    }
}

/// The time of the last byte a relayed connection carried, either way, and how many; each byte
/// is its machine's use too.
struct Traffic {
    start: tokio::time::Instant,
    last_ms: AtomicU64,
    bytes: AtomicU64,
    machine: Arc<MachineUse>,
}

impl Traffic {
    fn new(machine: Arc<MachineUse>) -> Arc<Self> {
        Arc::new(Self {
            start: tokio::time::Instant::now(),
            last_ms: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            machine,
        })
    }

    fn moved(&self, n: usize) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, Ordering::Relaxed);
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.machine.touch();
    }

    /// Resolves once `limit` has passed without a byte.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            if tokio::time::Instant::now() >= last + limit {
                return;
            }
            tokio::time::sleep_until(last + limit).await;
        }
    }
}

/// A relayed stream whose reads (the bytes it brings in) count as [`Traffic`].
struct Watched<S> {
    inner: S,
    activity: Arc<Traffic>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.activity.moved(n);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// Each relay owns its connections and sessions in a JoinSet: closing the forward (aborting the
// relay) ends them too and releases every socket of the port.

async fn relay_tcp(listener: TcpListener, upstream: SocketAddr, bounds: Bounds) {
    let port_slots = Arc::new(Semaphore::new(
        bounds.limits.connections_per_port.min(Semaphore::MAX_PERMITS),
    ));
    let hold_slots = Arc::new(Semaphore::new(bounds.limits.held_per_port.min(Semaphore::MAX_PERMITS)));
    let mut backoff = AcceptBackoff::default();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                if !backoff.failing() {
                    tracing::warn!(%error, "accepting a forwarded connection failed; backing off");
                }
                tokio::time::sleep(backoff.failed()).await;
                continue;
            }
        };
        backoff.succeeded();
        // Beyond a cap the connection is closed at once: it never holds smolvm's side.
        let Ok(port_slot) = port_slots.clone().try_acquire_owned() else {
            bounds.metrics.inc_forward_refused("tcp", Refusal::Port.label());
            tracing::debug!(%peer, "forwarded port at its connection cap; closed");
            continue;
        };
        let Some(agent_slot) = bounds.agent_slot("tcp") else {
            tracing::debug!(%peer, "forwarder at its connection cap; closed");
            continue;
        };
        // A sleeping machine's connection is held while it wakes, within the port's hold cap.
        let held = match bounds.machine.runs() {
            true => None,
            false => match hold_slots.clone().try_acquire_owned() {
                Ok(slot) => Some(slot),
                Err(_) => {
                    bounds.metrics.inc_forward_refused("tcp", Refusal::WakeCap.label());
                    tracing::debug!(%peer, machine = %bounds.machine.name, "too many connections held for a waking machine; closed");
                    continue;
                }
            },
        };
        let connection = Connection {
            client,
            peer,
            upstream,
            held,
        };
        connections.spawn(relay_connection(connection, bounds.clone(), (port_slot, agent_slot)));
    }
}

/// One accepted TCP connection, and its slot among those held for a waking machine.
struct Connection {
    client: TcpStream,
    peer: SocketAddr,
    upstream: SocketAddr,
    held: Option<OwnedSemaphorePermit>,
}

/// Relays one connection (holding its port's and the agent's slots until it ends): once its
/// machine runs, when it was held for a wake, then byte for byte until either side ends or it
/// idles.
async fn relay_connection(c: Connection, bounds: Bounds, _slots: (OwnedSemaphorePermit, OwnedSemaphorePermit)) {
    let Connection {
        client,
        peer,
        upstream,
        held,
    } = c;
    let (metrics, machine, hold) = (&bounds.metrics, &bounds.machine, bounds.limits.hold_timeout);
    let arrived = tokio::time::Instant::now();
    let was_held = held.is_some();
    if let Some(held) = held {
        metrics.inc_wake_held();
        let woke = machine.wait_awake(hold).await;
        drop(held);
        if !woke {
            metrics.inc_forward_refused("tcp", Refusal::WakeTimeout.label());
            tracing::info!(%peer, machine = %machine.name, timeout_s = hold.as_secs(), "a held connection's machine did not wake in time; closed");
            return;
        }
    }
    let server = match connect_upstream(upstream, was_held).await {
        Ok(server) => server,
        Err(error) => {
            tracing::debug!(%peer, %upstream, %error, "smolvm's port refused the connection");
            return;
        }
    };
    if was_held {
        metrics.observe_wake_hold(arrived.elapsed());
    }
    metrics.inc_forwarded_connections("tcp");
    let activity = Traffic::new(machine.use_.clone());
    let mut client = Watched {
        inner: client,
        activity: activity.clone(),
    };
    let mut server = Watched {
        inner: server,
        activity: activity.clone(),
    };
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut server) => {
            if let Err(error) = copied {
                tracing::debug!(%peer, %error, "forwarded connection ended with an error");
            }
        }
        () = activity.idle_for(bounds.limits.idle_timeout) => {
            metrics.inc_forward_idle_closed("tcp");
            tracing::debug!(%peer, "forwarded connection idle; closed");
        }
    }
    metrics.add_forwarded_bytes("tcp", activity.bytes.load(Ordering::Relaxed));
}

/// One UDP port's client sessions, counted per source address.
#[derive(Default)]
struct UdpSessions {
    by_client: HashMap<SocketAddr, Arc<UdpSocket>>,
    by_source: HashMap<IpAddr, usize>,
}

impl UdpSessions {
    fn insert(&mut self, client: SocketAddr, session: Arc<UdpSocket>) {
        if self.by_client.insert(client, session).is_none() {
            *self.by_source.entry(client.ip()).or_default() += 1;
        }
    }

    fn remove(&mut self, client: &SocketAddr) {
        if self.by_client.remove(client).is_some()
            && let Some(n) = self.by_source.get_mut(&client.ip())
        {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&client.ip());
            }
        }
    }

    fn admit(&self, client: &SocketAddr, limits: &ForwardLimits) -> Result<(), Refusal> {
        let from_source = self.by_source.get(&client.ip()).copied().unwrap_or(0);
        admit_udp(self.by_client.len(), from_source, limits)
    }
}

type SharedSessions = Arc<Mutex<UdpSessions>>;

fn lock_sessions(sessions: &SharedSessions) -> std::sync::MutexGuard<'_, UdpSessions> {
    sessions.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn relay_udp(socket: Arc<UdpSocket>, upstream: SocketAddr, bounds: Bounds) {
    let sessions = SharedSessions::default();
    let mut replies = tokio::task::JoinSet::new();
    let mut buf = vec![0u8; 65_536];
    let mut backoff = AcceptBackoff::default();
    loop {
        while replies.try_join_next().is_some() {}
        let (n, client) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            Err(error) => {
                if !backoff.failing() {
                    tracing::debug!(%error, "UDP receive failed; backing off");
                }
                tokio::time::sleep(backoff.failed()).await;
                continue;
            }
        };
        backoff.succeeded();
        if !bounds.machine.runs() {
            bounds.machine.activity.ask_wake(&bounds.machine.name);
            bounds.metrics.inc_forward_refused("udp", Refusal::Asleep.label());
            continue;
        }
        let existing = lock_sessions(&sessions).by_client.get(&client).cloned();
        let session = match existing {
            Some(session) => session,
            None => {
                // Datagrams from a client beyond a cap are dropped (and counted); its next one
                // is judged again.
                if let Err(refusal) = lock_sessions(&sessions).admit(&client, &bounds.limits) {
                    bounds.metrics.inc_forward_refused("udp", refusal.label());
                    continue;
                }
                let Some(agent_slot) = bounds.agent_slot("udp") else {
                    continue;
                };
                let Ok(session) = new_udp_session(upstream).await else {
                    continue;
                };
                bounds.metrics.inc_forwarded_connections("udp");
                lock_sessions(&sessions).insert(client, session.clone());
                replies.spawn(udp_replies(
                    socket.clone(),
                    session.clone(),
                    client,
                    sessions.clone(),
                    bounds.metrics.clone(),
                    agent_slot,
                ));
                session
            }
        };
        if session.send(&buf[..n]).await.is_ok() {
            bounds.metrics.add_forwarded_bytes("udp", n as u64);
            bounds.machine.use_.touch();
        }
    }
}

async fn new_udp_session(upstream: SocketAddr) -> std::io::Result<Arc<UdpSocket>> {
    let session = UdpSocket::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)).await?;
    session.connect(upstream).await?;
    Ok(Arc::new(session))
}

/// Carries the replies of one UDP client's session back to it until it idles.
async fn udp_replies(
    socket: Arc<UdpSocket>,
    session: Arc<UdpSocket>,
    client: SocketAddr,
    sessions: SharedSessions,
    metrics: Arc<Metrics>,
    _agent_slot: OwnedSemaphorePermit,
) {
    let mut buf = vec![0u8; 65_536];
    // An upstream that refuses (nothing listens yet) ends the session; the client's next
    // datagram opens a new one.
    while let Ok(Ok(n)) = tokio::time::timeout(UDP_IDLE, session.recv(&mut buf)).await {
        if socket.send_to(&buf[..n], client).await.is_ok() {
            metrics.add_forwarded_bytes("udp", n as u64);
        }
    }
    lock_sessions(&sessions).remove(&client);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, state: MachineState, ports: &[(u16, Protocol)]) -> Machine {
        Machine::publishing(name, state, ports)
    }

    fn key(port: u16, protocol: Protocol) -> PortKey {
        PortKey { port, protocol }
    }

    #[test]
    fn plan_table() {
        use MachineState::{Created, Running, Stopped};
        use Protocol::{Tcp, Udp};
        let open = |pairs: &[(u16, Protocol, &str)]| -> BTreeMap<PortKey, String> {
            pairs
                .iter()
                .map(|&(p, proto, m)| (key(p, proto), m.to_string()))
                .collect()
        };
        // (name, machines, open now, expected open, expected close)
        type Case = (
            &'static str,
            Vec<Machine>,
            BTreeMap<PortKey, String>,
            Vec<(PortKey, &'static str)>,
            Vec<PortKey>,
        );
        let cases: Vec<Case> = vec![
            ("nothing", vec![], open(&[]), vec![], vec![]),
            (
                "running_opens_each_port",
                vec![machine("a", Running, &[(8080, Tcp), (5353, Udp)])],
                open(&[]),
                vec![(key(5353, Udp), "a"), (key(8080, Tcp), "a")],
                vec![],
            ),
            (
                "steady_changes_nothing",
                vec![machine("a", Running, &[(8080, Tcp)])],
                open(&[(8080, Tcp, "a")]),
                vec![],
                vec![],
            ),
            (
                "created_opens_nothing",
                vec![machine("a", Created, &[(8080, Tcp)])],
                open(&[]),
                vec![],
                vec![],
            ),
            (
                "stopped_closes",
                vec![machine("a", Stopped, &[(8080, Tcp)])],
                open(&[(8080, Tcp, "a")]),
                vec![],
                vec![key(8080, Tcp)],
            ),
            (
                "deleted_closes",
                vec![],
                open(&[(8080, Tcp, "a")]),
                vec![],
                vec![key(8080, Tcp)],
            ),
            (
                "same_port_other_protocol_is_another_forward",
                vec![machine("a", Running, &[(8080, Tcp), (8080, Udp)])],
                open(&[(8080, Tcp, "a")]),
                vec![(key(8080, Udp), "a")],
                vec![],
            ),
            (
                "port_moved_to_another_machine",
                vec![
                    machine("a", Stopped, &[(8080, Tcp)]),
                    machine("b", Running, &[(8080, Tcp)]),
                ],
                open(&[(8080, Tcp, "a")]),
                vec![(key(8080, Tcp), "b")],
                vec![key(8080, Tcp)],
            ),
        ];
        for (name, machines, now, want_open, want_close) in cases {
            let got = plan(&machines, &BTreeSet::new(), &now);
            let want = Plan {
                open: want_open.into_iter().map(|(k, m)| (k, m.to_string())).collect(),
                close: want_close,
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_machine_traffic_wakes_keeps_its_forwards_while_it_sleeps() {
        use MachineState::{Running, Stopped};
        use Protocol::Tcp;
        let wakeable: BTreeSet<String> = ["a".to_string()].into();
        let open_a: BTreeMap<PortKey, String> = [(key(8080, Tcp), "a".to_string())].into();
        // (name, machines, open now, expected open, expected close)
        type Case = (
            &'static str,
            Vec<Machine>,
            BTreeMap<PortKey, String>,
            Vec<PortKey>,
            Vec<PortKey>,
        );
        let cases: Vec<Case> = vec![
            (
                "goes to sleep: kept",
                vec![machine("a", Stopped, &[(8080, Tcp)])],
                open_a.clone(),
                vec![],
                vec![],
            ),
            (
                "asleep from the start: opened",
                vec![machine("a", Stopped, &[(8080, Tcp)])],
                BTreeMap::new(),
                vec![key(8080, Tcp)],
                vec![],
            ),
            (
                "wakes: kept",
                vec![machine("a", Running, &[(8080, Tcp)])],
                open_a.clone(),
                vec![],
                vec![],
            ),
            (
                "another sleeps: closed",
                vec![machine("b", Stopped, &[(8080, Tcp)])],
                [(key(8080, Tcp), "b".to_string())].into(),
                vec![],
                vec![key(8080, Tcp)],
            ),
            (
                "a running machine's port is its own",
                vec![
                    machine("a", Stopped, &[(8080, Tcp)]),
                    machine("b", Running, &[(8080, Tcp)]),
                ],
                open_a.clone(),
                vec![key(8080, Tcp)],
                vec![key(8080, Tcp)],
            ),
        ];
        for (name, machines, now, want_open, want_close) in cases {
            let got = plan(&machines, &wakeable, &now);
            assert_eq!(
                got.open.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
                want_open,
                "{name}"
            );
            assert_eq!(got.close, want_close, "{name}");
        }
    }

    #[test]
    fn connection_budget_table() {
        // (wanted, RLIMIT_NOFILE, reserve, cap)
        let cases: [(usize, Option<u64>, u64, usize); 7] = [
            (8192, Some(1_048_576), 1024, 8192),
            (8192, Some(65_536), 1024, 8192),
            (8192, Some(8192), 1024, 3584),
            (8192, Some(1024), 1024, 256),
            (8192, None, 1024, 256),
            (8192, Some(10), 1024, 2),
            (0, Some(1_048_576), 1024, 0),
        ];
        for (wanted, nofile, reserve, cap) in cases {
            assert_eq!(
                connection_budget(wanted, nofile, reserve),
                cap,
                "{wanted} {nofile:?} {reserve}"
            );
        }
    }

    #[test]
    fn udp_admission_table() {
        let limits = ForwardLimits {
            udp_sessions_per_port: 4,
            udp_sessions_per_source: 2,
            ..ForwardLimits::default()
        };
        let cases = [
            (0, 0, Ok(())),
            (3, 1, Ok(())),
            (3, 2, Err(Refusal::Source)),
            (4, 0, Err(Refusal::Port)),
            (4, 2, Err(Refusal::Port)),
        ];
        for (sessions, from_source, want) in cases {
            assert_eq!(
                admit_udp(sessions, from_source, &limits),
                want,
                "{sessions} {from_source}"
            );
        }
    }

    #[tokio::test]
    async fn udp_sessions_are_counted_per_source() {
        let limits = ForwardLimits {
            udp_sessions_per_port: 3,
            udp_sessions_per_source: 2,
            ..ForwardLimits::default()
        };
        let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
        let client = |ip: [u8; 4], port: u16| SocketAddr::from((ip, port));
        let mut sessions = UdpSessions::default();
        sessions.insert(client([10, 0, 0, 1], 1), socket.clone());
        sessions.insert(client([10, 0, 0, 1], 1), socket.clone());
        sessions.insert(client([10, 0, 0, 1], 2), socket.clone());
        assert_eq!(sessions.admit(&client([10, 0, 0, 1], 3), &limits), Err(Refusal::Source));
        assert_eq!(sessions.admit(&client([10, 0, 0, 2], 1), &limits), Ok(()));
        sessions.insert(client([10, 0, 0, 2], 1), socket.clone());
        assert_eq!(sessions.admit(&client([10, 0, 0, 3], 1), &limits), Err(Refusal::Port));
        sessions.remove(&client([10, 0, 0, 1], 1));
        sessions.remove(&client([10, 0, 0, 1], 1));
        assert_eq!(sessions.admit(&client([10, 0, 0, 1], 3), &limits), Ok(()));
        sessions.remove(&client([10, 0, 0, 1], 2));
        assert!(!sessions.by_source.contains_key(&IpAddr::from([10, 0, 0, 1])));
    }

    #[test]
    fn a_bound_port_is_not_free() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(!port_free(lo, key(port, Protocol::Tcp)));
        drop(taken);
        assert!(port_free(lo, key(port, Protocol::Tcp)));
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let port = udp.local_addr().expect("addr").port();
        assert!(!port_free(lo, key(port, Protocol::Udp)));
    }
}
