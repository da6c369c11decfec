//! The bounds of a TLS listener that every binary takes as flags, under the same names and value
//! styles (the webhook's admission port, the agent's node API, the controller's access API):
//!
//! | flag | what it bounds |
//! | --- | --- |
//! | `--max-connections` | connections open at once, handshaking or served |
//! | `--max-connections-per-source` | the same, from one source address |
//! | `--max-handshakes` | TLS handshakes in progress at once |
//! | `--max-handshakes-per-source` | the same, from one source address |
//! | `--handshake-timeout` | the time for one TLS handshake (`5s`) |
//! | `--http2-idle-timeout` | how long an HTTP/2 connection may hold no stream (`2m`) |
//! | `--http2-buffer-budget` | bytes all HTTP/2 connections may hold unread (`67108864`) |
//!
//! Each binary declares the flags with its own environment prefix and defaults, and turns them
//! into bounds here, where they are checked: a budget too small for the connection cap, or a
//! timeout too short to work, stops the binary at start with a message naming the flag.

use std::time::Duration;

use crate::accept::AcceptBounds;
use crate::{Error, Result};

/// The shortest `--handshake-timeout` (a TLS handshake takes a few round trips).
pub const MIN_HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(100);
/// The shortest `--http2-idle-timeout`.
pub const MIN_HTTP2_IDLE_TIMEOUT: Duration = Duration::from_secs(1);

/// A listener's flags, as parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// `--max-connections`.
    pub max_connections: usize,
    /// `--max-connections-per-source`.
    pub max_connections_per_source: usize,
    /// `--max-handshakes`.
    pub max_handshakes: usize,
    /// `--max-handshakes-per-source`.
    pub max_handshakes_per_source: usize,
    /// `--handshake-timeout`.
    pub handshake_timeout: Duration,
    /// `--http2-idle-timeout`.
    pub http2_idle_timeout: Duration,
    /// `--http2-buffer-budget`, bytes.
    pub http2_buffer_budget: usize,
}

/// The bounds a listener's flags give, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerBounds {
    /// Before a byte of HTTP: connections, handshakes, in all and per source.
    pub accept: AcceptBounds,
    /// Each HTTP/2 stream's and connection's flow-control window
    /// ([`crate::http2::window`]).
    pub http2_window: u32,
    /// An HTTP/2 connection holding no stream this long is closed.
    pub http2_idle_timeout: Duration,
}

impl ListenerLimits {
    /// The bounds, or the first flag that cannot work.
    pub fn bounds(&self) -> Result<ListenerBounds> {
        if self.handshake_timeout < MIN_HANDSHAKE_TIMEOUT {
            return Err(Error::Config(format!(
                "--handshake-timeout {:?} is shorter than {MIN_HANDSHAKE_TIMEOUT:?}, too short for a TLS handshake",
                self.handshake_timeout
            )));
        }
        if self.http2_idle_timeout < MIN_HTTP2_IDLE_TIMEOUT {
            return Err(Error::Config(format!(
                "--http2-idle-timeout {:?} is shorter than {MIN_HTTP2_IDLE_TIMEOUT:?}",
                self.http2_idle_timeout
            )));
        }
        for (flag, value) in [
            ("--max-connections", self.max_connections),
            ("--max-connections-per-source", self.max_connections_per_source),
            ("--max-handshakes", self.max_handshakes),
            ("--max-handshakes-per-source", self.max_handshakes_per_source),
        ] {
            if value == 0 {
                return Err(Error::Config(format!("{flag} must be at least 1")));
            }
        }
        Ok(ListenerBounds {
            accept: AcceptBounds {
                max_connections: self.max_connections,
                // A share larger than the whole is the whole.
                max_connections_per_source: self.max_connections_per_source.min(self.max_connections),
                max_handshakes: self.max_handshakes,
                max_handshakes_per_source: self.max_handshakes_per_source.min(self.max_handshakes),
                handshake_timeout: self.handshake_timeout,
            },
            http2_window: crate::http2::window(self.http2_buffer_budget, self.max_connections)?,
            http2_idle_timeout: self.http2_idle_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webhook() -> ListenerLimits {
        ListenerLimits {
            max_connections: 1024,
            max_connections_per_source: 64,
            max_handshakes: 64,
            max_handshakes_per_source: 16,
            handshake_timeout: Duration::from_secs(5),
            http2_idle_timeout: Duration::from_secs(120),
            http2_buffer_budget: 64 << 20,
        }
    }

    #[test]
    fn flags_become_bounds_or_name_what_cannot_work() {
        let bounds = webhook().bounds().expect("the webhook's defaults");
        assert_eq!(bounds.http2_window, 65_536);
        assert_eq!(bounds.accept.max_connections_per_source, 64);

        // (what changes, the flag the error names; None: accepted)
        type Change = fn(&mut ListenerLimits);
        let table: [(Change, Option<&str>); 7] = [
            (|l| l.http2_buffer_budget = 1 << 20, Some("--http2-buffer-budget")),
            (
                |l| l.handshake_timeout = Duration::from_millis(10),
                Some("--handshake-timeout"),
            ),
            (|l| l.http2_idle_timeout = Duration::ZERO, Some("--http2-idle-timeout")),
            (|l| l.max_connections = 0, Some("--max-connections must")),
            (|l| l.max_handshakes_per_source = 0, Some("--max-handshakes-per-source")),
            (|l| l.max_connections_per_source = 5000, None),
            (|l| l.max_connections = 256, None),
        ];
        for (change, names) in table {
            let mut limits = webhook();
            change(&mut limits);
            match (limits.bounds(), names) {
                (Ok(bounds), None) => {
                    assert!(bounds.accept.max_connections_per_source <= bounds.accept.max_connections);
                }
                (Err(error), Some(flag)) => {
                    assert_eq!(error.reason(), "Config");
                    assert!(error.to_string().contains(flag), "{error} names {flag}");
                }
                (got, want) => panic!("{limits:?}: {got:?}, wanted an error naming {want:?}"),
            }
        }
    }
}
