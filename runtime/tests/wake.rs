//! The forwarder and a machine suspended for idleness whose traffic wakes it (SPEC 2.7), over
//! real sockets: its port keeps listening while it sleeps; a connection that arrives asks for the
//! wake and is held, then relayed once the machine runs (its first bytes reach the machine); the
//! port's hold cap refuses the connections beyond it at once, and the hold deadline the ones whose
//! machine does not wake in time, each counted. The forwarder listens on 127.0.0.2 (standing for
//! the node's address) and relays to 127.0.0.1, where smolvm would listen: an echo server here,
//! the double of the woken guest's service. Prints `skipped: …` where 127.0.0.2 cannot be bound.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use smolvm_api::Protocol;
use smolvm_runtime::activity::Activity;
use smolvm_runtime::forward::{ForwardLimits, Forwarder};
use smolvm_runtime::metrics::Metrics;
use smolvm_runtime::suspensions::{SuspendRecords, Suspension};
use smolvm_runtime::vmm::{Machine, MachineState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const NODE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// Generous bound on each wait, only so that a broken test fails instead of hanging.
const WAIT: Duration = Duration::from_secs(30);

fn machine(state: MachineState, port: u16) -> Machine {
    Machine::publishing("svm-a", state, &[(port, Protocol::Tcp)])
}

/// A port free on both addresses now.
fn free_port() -> Option<u16> {
    let probe = std::net::TcpListener::bind((NODE, 0)).ok()?;
    let port = probe.local_addr().ok()?.port();
    drop(probe);
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .ok()
        .map(|_| port)
}

/// The woken machine's service on smolvm's loopback port.
async fn echo_on(port: u16) -> tokio::task::JoinHandle<()> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .await
        .expect("bind the echo");
    tokio::spawn(smolvm_testkit::smolvm_double::echo(listener))
}

/// Whether the forwarder closed `conn` (a read ends) within `within`.
async fn closed(conn: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1];
    matches!(
        tokio::time::timeout(within, conn.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

fn asleep_forwarder(limits: ForwardLimits) -> (Arc<Forwarder>, Arc<Activity>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let activity = Activity::new();
    let records = Arc::new(SuspendRecords::in_memory());
    let suspension = Suspension {
        idle: true,
        wake_on_traffic: true,
        ..Suspension::now()
    };
    records.write("svm-a", &suspension).expect("record");
    let forwarder = Forwarder::waking(NODE, metrics.clone(), limits, activity.clone(), records);
    (forwarder, activity, metrics)
}

#[tokio::test]
async fn a_held_connection_is_relayed_once_its_machine_wakes() {
    smolvm_runtime::install_crypto_provider();
    let Some(port) = free_port() else {
        println!("skipped: 127.0.0.2 cannot be bound here; the forwarder's wake needs an address of its own");
        return;
    };
    let limits = ForwardLimits {
        held_per_port: 2,
        hold_timeout: WAIT,
        ..ForwardLimits::default()
    };
    let (forwarder, activity, metrics) = asleep_forwarder(limits);
    forwarder.sync(&[machine(MachineState::Stopped, port)]).await;
    assert_eq!(
        forwarder.open_forwards().len(),
        1,
        "a sleeping machine traffic wakes keeps its port"
    );

    // The first client arrives while it sleeps: it is held, and the wake is asked for at once.
    let at = SocketAddr::new(NODE, port);
    let mut first = TcpStream::connect(at).await.expect("connect");
    first.write_all(b"hello").await.expect("write");
    tokio::time::timeout(WAIT, activity.wake_asked())
        .await
        .expect("the wake is asked");
    assert_eq!(activity.report().1, ["svm-a"], "the heartbeat carries the wake");
    let mut second = TcpStream::connect(at).await.expect("connect");
    // Beyond the hold cap: closed at once, and counted.
    let mut third = TcpStream::connect(at).await.expect("connect");
    assert!(closed(&mut third, WAIT).await, "beyond the cap, refused");
    assert_eq!(metrics.forward_refused("tcp", "wake_cap"), 1);
    assert!(
        !closed(&mut first, Duration::from_millis(300)).await,
        "the first is held, not refused"
    );

    // The machine runs again: smolvm's port answers, the forwarder is told, the held bytes go.
    let echo = echo_on(port).await;
    forwarder.sync(&[machine(MachineState::Running, port)]).await;
    let mut got = [0u8; 5];
    tokio::time::timeout(WAIT, first.read_exact(&mut got))
        .await
        .expect("relayed in time")
        .expect("read");
    assert_eq!(&got, b"hello", "the first client is served");
    second.write_all(b"again").await.expect("write");
    tokio::time::timeout(WAIT, second.read_exact(&mut got))
        .await
        .expect("relayed in time")
        .expect("read");
    assert_eq!(&got, b"again");
    assert!(activity.report().1.is_empty(), "no wake asked once it runs");
    assert!(
        activity.report().0.iter().any(|(name, _)| name == "svm-a"),
        "the relayed bytes are the machine's activity"
    );
    let text = metrics.encode();
    assert!(
        text.contains("smolvm_runtime_forward_held_connections_total 2"),
        "{text}"
    );
    echo.abort();
}

#[tokio::test]
async fn a_held_connection_whose_machine_does_not_wake_is_refused_at_the_deadline() {
    smolvm_runtime::install_crypto_provider();
    let Some(port) = free_port() else {
        println!("skipped: 127.0.0.2 cannot be bound here; the forwarder's wake needs an address of its own");
        return;
    };
    let limits = ForwardLimits {
        hold_timeout: Duration::from_millis(500),
        ..ForwardLimits::default()
    };
    let (forwarder, activity, metrics) = asleep_forwarder(limits);
    forwarder.sync(&[machine(MachineState::Stopped, port)]).await;
    let mut held = TcpStream::connect(SocketAddr::new(NODE, port)).await.expect("connect");
    assert!(closed(&mut held, WAIT).await, "closed at the deadline");
    assert_eq!(metrics.forward_refused("tcp", "wake_timeout"), 1);
    assert!(activity.report().1.is_empty(), "a wake that gave up is no longer asked");
    // A machine suspended by a user (no wake on traffic) has no forward at all.
    let plain = Arc::new(SuspendRecords::in_memory());
    plain.write("svm-a", &Suspension::now()).expect("record");
    let user = Forwarder::waking(NODE, Arc::new(Metrics::default()), limits, Activity::new(), plain);
    user.sync(&[machine(MachineState::Stopped, port)]).await;
    assert!(user.open_forwards().is_empty());
}
