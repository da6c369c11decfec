//! Published ports, reachable from the cluster.
//!
//! smolvm publishes a machine's ports on 127.0.0.1 only (it has no bind address). The agent runs
//! on the node's network and, for every published port of every running machine, listens on the
//! node's address and relays to that loopback port: TCP connections byte for byte (half-close
//! kept), UDP datagrams through one upstream socket per client. [`plan`] decides which forwards
//! to open and close from the machines smolvm reports; [`Forwarder`] does it. The agent re-syncs
//! every second and at once after each node API call that changes a machine, and at start, so a
//! restarted agent picks up the machines that kept running.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::vmm::{Machine, MachineState, Vmm};
use smolvm_api::Protocol;

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

/// The forwards the running machines need, against those open now (port → machine). A port that
/// moved to another machine is closed and opened again.
pub fn plan(machines: &[Machine], open: &BTreeMap<PortKey, String>) -> Plan {
    let mut want: BTreeMap<PortKey, &str> = BTreeMap::new();
    for m in machines.iter().filter(|m| m.state == MachineState::Running) {
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
/// Most concurrent UDP clients per port; datagrams from more are dropped.
const UDP_MAX_SESSIONS: usize = 1024;

struct Open {
    machine: String,
    task: JoinHandle<()>,
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
}

impl Forwarder {
    /// A forwarder that listens on `address` (the node's, never loopback or unspecified).
    pub fn new(address: IpAddr, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            address,
            open: Mutex::default(),
            metrics,
            poke: Notify::new(),
        })
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

    /// Opens and closes forwards so they match `machines`. A port that cannot be bound is
    /// logged and tried again on the next sync.
    pub async fn sync(&self, machines: &[Machine]) {
        let plan = plan(machines, &self.open_forwards());
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
        for (key, machine) in plan.open {
            match self.listen(key).await {
                Ok(task) => {
                    tracing::info!(port = %key, %machine, address = %self.address, "forwarding to smolvm's loopback port");
                    self.lock().insert(key, Open { machine, task });
                }
                Err(error) => {
                    tracing::warn!(port = %key, %machine, address = %self.address, %error, "cannot forward the port yet");
                }
            }
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
                    Ok(machines) => this.sync(&machines).await,
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

    async fn listen(&self, key: PortKey) -> std::io::Result<JoinHandle<()>> {
        let at = SocketAddr::new(self.address, key.port);
        let upstream = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), key.port);
        let metrics = self.metrics.clone();
        Ok(match key.protocol {
            Protocol::Tcp => {
                let listener = TcpListener::bind(at).await?;
                tokio::spawn(relay_tcp(listener, upstream, metrics))
            }
            Protocol::Udp => {
                let socket = Arc::new(UdpSocket::bind(at).await?);
                tokio::spawn(relay_udp(socket, upstream, metrics))
            }
        })
    }
}

// Each relay owns its connections and sessions in a JoinSet: closing the forward (aborting the
// relay) ends them too and releases every socket of the port.

async fn relay_tcp(listener: TcpListener, upstream: SocketAddr, metrics: Arc<Metrics>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (mut client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        connections.spawn(async move {
            let mut server = match TcpStream::connect(upstream).await {
                Ok(server) => server,
                Err(error) => {
                    tracing::debug!(%peer, %upstream, %error, "smolvm's port refused the connection");
                    return;
                }
            };
            metrics.inc_forwarded_connections("tcp");
            match tokio::io::copy_bidirectional(&mut client, &mut server).await {
                Ok((to_vm, from_vm)) => metrics.add_forwarded_bytes("tcp", to_vm + from_vm),
                Err(error) => tracing::debug!(%peer, %error, "forwarded connection ended with an error"),
            }
        });
    }
}

async fn relay_udp(socket: Arc<UdpSocket>, upstream: SocketAddr, metrics: Arc<Metrics>) {
    let sessions: Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>> = Arc::default();
    let mut replies = tokio::task::JoinSet::new();
    let mut buf = vec![0u8; 65_536];
    loop {
        while replies.try_join_next().is_some() {}
        let (n, client) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(%error, "UDP receive failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let existing = sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&client)
            .cloned();
        let session = match existing {
            Some(session) => session,
            None => {
                if sessions.lock().unwrap_or_else(PoisonError::into_inner).len() >= UDP_MAX_SESSIONS {
                    continue;
                }
                let Ok(session) = new_udp_session(upstream).await else {
                    continue;
                };
                metrics.inc_forwarded_connections("udp");
                sessions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(client, session.clone());
                replies.spawn(udp_replies(
                    socket.clone(),
                    session.clone(),
                    client,
                    sessions.clone(),
                    metrics.clone(),
                ));
                session
            }
        };
        if session.send(&buf[..n]).await.is_ok() {
            metrics.add_forwarded_bytes("udp", n as u64);
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
    sessions: Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>>,
    metrics: Arc<Metrics>,
) {
    let mut buf = vec![0u8; 65_536];
    // An upstream that refuses (nothing listens yet) ends the session; the client's next
    // datagram opens a new one.
    while let Ok(Ok(n)) = tokio::time::timeout(UDP_IDLE, session.recv(&mut buf)).await {
        if socket.send_to(&buf[..n], client).await.is_ok() {
            metrics.add_forwarded_bytes("udp", n as u64);
        }
    }
    sessions.lock().unwrap_or_else(PoisonError::into_inner).remove(&client);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::PortMapping;

    fn machine(name: &str, state: MachineState, ports: &[(u16, Protocol)]) -> Machine {
        Machine {
            name: name.into(),
            state,
            cpus: 1,
            memory_mib: 512,
            storage_gib: None,
            overlay_gib: None,
            image: None,
            ports: ports
                .iter()
                .map(|&(host_port, protocol)| PortMapping {
                    host_port,
                    guest_port: 80,
                    protocol,
                })
                .collect(),
            network: true,
            pid: None,
            raw: serde_json::Value::Null,
        }
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
            let got = plan(&machines, &now);
            let want = Plan {
                open: want_open.into_iter().map(|(k, m)| (k, m.to_string())).collect(),
                close: want_close,
            };
            assert_eq!(got, want, "{name}");
        }
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
