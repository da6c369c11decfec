//! A TCP relay on loopback: what stands between a client and one or more servers, as a Service
//! proxy does, and what can cut the path, as a network partition does.
//!
//! - In front of the two webhook replicas it spreads connections over them round-robin and skips
//!   one that refuses the connection (a killed replica), as a Service whose endpoints follow the
//!   replicas' readiness would.
//! - In front of a simulated node's node API it is the address the node advertises; while it is
//!   *cut*, no byte passes either way: new connections are accepted by the kernel but never
//!   reach the node, and what open connections carry is held until the cut ends, as packets
//!   dropped on a partitioned link are retransmitted when it heals. The controller sees calls
//!   that time out, as it would across a real partition.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

/// A running relay; it stops when dropped.
pub struct Relay {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    cut: watch::Sender<bool>,
    _task: AbortOnDropHandle<()>,
}

impl Relay {
    /// Listens on a free loopback port and relays each connection to one of `targets`.
    pub async fn start(targets: Vec<SocketAddr>) -> anyhow::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cut, _) = watch::channel(false);
        let state = Arc::new(State {
            targets,
            next: AtomicUsize::new(0),
            cut: cut.subscribe(),
        });
        let task = tokio::spawn(accept(listener, state));
        Ok(Relay {
            port,
            cut,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// Cuts the path (true) or heals it (false).
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }

    /// Whether the path is cut.
    pub fn is_cut(&self) -> bool {
        *self.cut.borrow()
    }
}

struct State {
    targets: Vec<SocketAddr>,
    next: AtomicUsize,
    cut: watch::Receiver<bool>,
}

async fn accept(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let mut cut = state.cut.clone();
            // A partitioned path reaches nothing: wait for it to heal first.
            if cut.wait_for(|c| !*c).await.is_err() {
                return;
            }
            let Some(server) = connect(&state).await else {
                return;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::join!(
                pump(client_read, server_write, state.cut.clone()),
                pump(server_read, client_write, state.cut.clone())
            );
        });
    }
}

/// The next target that accepts, round-robin from the last one used.
async fn connect(state: &State) -> Option<TcpStream> {
    let n = state.targets.len();
    let first = state.next.fetch_add(1, Ordering::Relaxed);
    for i in 0..n {
        if let Some(addr) = state.targets.get((first + i) % n)
            && let Ok(stream) = TcpStream::connect(addr).await
        {
            return Some(stream);
        }
    }
    None
}

/// Copies `from` to `to`, holding what it read while the path is cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut.wait_for(|c| !*c).await.is_err() {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
