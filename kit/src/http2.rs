//! What every TLS listener's HTTP/2 connections share (the webhook's, served by its own `h2`
//! loop; the node API's and the access API's, by [`crate::serve`]): a flow-control window
//! derived from a memory budget and the connection cap ([`window`]), and the idle timeout that
//! closes a connection holding no stream ([`Streams`], [`Idle`]).
//!
//! # Why a budget
//!
//! HTTP/2 lets a client send DATA ahead of the server reading it, up to the connection's
//! flow-control window: what the server has not yet read, the `h2` crate holds. The server gives
//! the window back only as it reads, so all connections together hold at most
//! `max_connections x window` bytes that no reader asked for. With `h2`'s and hyper's 1 MiB
//! windows and the webhook's 1,024 connections that was 1 GiB, four times the pod's memory
//! limit. So the window is derived: `window = budget / max_connections`, and the budget
//! (`--http2-buffer-budget`, 64 MiB by default) is what a listener may hold for readers that
//! are not reading, whatever its callers do. The window cannot go below HTTP/2's initial 65,535
//! bytes (a connection's window starts there, and only grows), so a budget too small for the
//! connection cap is refused at start rather than silently exceeded.
//!
//! # Why an idle timeout
//!
//! A client that answers every PING keeps its connection, and its slot among the listener's
//! connections, for ever. A connection with no stream in flight for [`Idle`]'s timeout (and less
//! than a quarter more) is told GOAWAY and closed. The API server's webhook client (Go's `net/http` through client-go) closes
//! its own idle connections after 90 s and opens a new one for the next call, so a timeout above
//! that (2 minutes by default) lets it be the one that closes, and one below it only makes it
//! reconnect: either way no review fails, as a GOAWAY tells the client which streams were not
//! taken.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::{Error, Result};

/// The smallest window: HTTP/2's initial connection window (RFC 9113, 6.9.2), which a server
/// cannot shrink.
pub const MIN_WINDOW: u32 = 65_535;
/// The largest window HTTP/2 allows.
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// The flow-control window (each stream's and each connection's) under which `max_connections`
/// connections hold at most `budget` bytes of DATA their server has not read: `budget /
/// max_connections`, at most [`MAX_WINDOW`]. A budget that cannot give each connection
/// [`MIN_WINDOW`] is an error naming both flags.
pub fn window(budget: usize, max_connections: usize) -> Result<u32> {
    let per_connection = budget / max_connections.max(1);
    if per_connection < MIN_WINDOW as usize {
        return Err(Error::Config(format!(
            "--http2-buffer-budget {budget} gives each of --max-connections {max_connections} less than HTTP/2's smallest window of {MIN_WINDOW} bytes: raise the budget to at least {} or lower the connections",
            max_connections.max(1).saturating_mul(MIN_WINDOW as usize)
        )));
    }
    Ok(u32::try_from(per_connection).unwrap_or(MAX_WINDOW).min(MAX_WINDOW))
}

/// The streams in flight on one connection: a request taken and not yet answered (the webhook),
/// or answered with a body still going out ([`crate::serve`]). Two atomic additions when a
/// stream starts and two when it ends: nothing else runs per request.
#[derive(Debug, Default)]
pub struct Streams {
    in_flight: AtomicUsize,
    /// Streams started and ended: tells [`Idle`] that one came or went since it last looked.
    events: AtomicU64,
}

impl Streams {
    /// A connection's count, none in flight.
    pub fn new() -> Arc<Self> {
        Arc::new(Streams::default())
    }

    /// One stream in flight until the returned guard is dropped.
    pub fn open(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.events.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// Streams in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// A stream in flight; dropping it ends it.
#[derive(Debug)]
pub struct InFlight(Arc<Streams>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.events.fetch_add(1, Ordering::AcqRel);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many looks a timeout is cut into: a connection is closed between the timeout and a
/// quarter more after its last stream ended.
const LOOKS: u32 = 4;

/// Tells when a connection has had no stream in flight for its timeout. It looks at the
/// connection's [`Streams`] every quarter of the timeout (no timer is touched per request), and
/// expires after four looks in a row saw nothing in flight and nothing started or ended since the
/// look before: at least the timeout, and less than a quarter more, after the last stream ended.
#[derive(Debug)]
pub struct Idle {
    streams: Arc<Streams>,
    looks: tokio::time::Interval,
    /// [`Streams::events`] at the last look.
    seen: u64,
    /// Looks in a row that found the connection quiet.
    quiet: u32,
}

impl Idle {
    /// Watches `streams` for `timeout` (at least four milliseconds) without one.
    pub fn new(streams: Arc<Streams>, timeout: Duration) -> Self {
        let every = (timeout / LOOKS).max(Duration::from_millis(1));
        let mut looks = tokio::time::interval_at(Instant::now() + every, every);
        looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let seen = streams.events.load(Ordering::Acquire);
        Idle {
            streams,
            looks,
            seen,
            quiet: 0,
        }
    }

    /// Resolves once the connection has been quiet for the timeout. Cancel-safe: when another
    /// branch of a `select!` wins, calling it again goes on where it was.
    pub async fn expired(&mut self) {
        loop {
            self.looks.tick().await;
            let events = self.streams.events.load(Ordering::Acquire);
            if self.streams.in_flight() > 0 || events != self.seen {
                self.quiet = 0;
            } else {
                self.quiet += 1;
            }
            self.seen = events;
            if self.quiet >= LOOKS {
                self.quiet = 0;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_from_budgets() {
        // (budget, connections, window or error)
        let table: [(usize, usize, Option<u32>); 6] = [
            (64 << 20, 1024, Some(65_536)),
            (64 << 20, 256, Some(262_144)),
            (64 << 20, 1, Some(64 << 20)),
            (32 << 20, 1024, None),
            (usize::MAX, 1, Some(MAX_WINDOW)),
            (65_535, 0, Some(65_535)),
        ];
        for (budget, connections, want) in table {
            assert_eq!(window(budget, connections).ok(), want, "{budget} {connections}");
        }
        let error = window(1 << 20, 1024)
            .map(|_| ())
            .map_err(|e| (e.reason(), e.to_string()));
        let Err((reason, message)) = error else {
            panic!("too small a budget is refused")
        };
        assert_eq!(reason, "Config");
        assert!(message.contains("--http2-buffer-budget") && message.contains("--max-connections"));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_between_the_timeout_and_a_quarter_more_after_the_last_stream() {
        let streams = Streams::new();
        let mut idle = Idle::new(streams.clone(), Duration::from_secs(10));
        let start = Instant::now();
        // A stream from 0 s to 14 s, another from 19 s to 21 s; looks every 2.5 s.
        let first = streams.open();
        let watcher = tokio::spawn(async move {
            idle.expired().await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_secs(14)).await;
        drop(first);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let second = streams.open();
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(second);
        let quiet = watcher.await.expect("watcher") - start - Duration::from_secs(21);
        assert!(
            quiet >= Duration::from_secs(10) && quiet < Duration::from_millis(12_500),
            "idle {quiet:?} after the last stream ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_wait_goes_on_where_it_was() {
        let streams = Streams::new();
        let mut idle = Idle::new(streams.clone(), Duration::from_secs(10));
        let start = Instant::now();
        let cancelled = tokio::time::timeout(Duration::from_secs(6), idle.expired()).await;
        assert!(cancelled.is_err(), "not idle after 6 s");
        idle.expired().await;
        assert_eq!(Instant::now() - start, Duration::from_secs(10));
        // A stream that comes and goes between two looks still counts.
        let opener = streams.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(opener.open());
        });
        idle.expired().await;
        assert_eq!(Instant::now() - start, Duration::from_millis(22_500));
    }
}
