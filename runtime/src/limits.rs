//! What the agent's listeners let one client hold, from the flags: the port forwarder's caps
//! and idle timeout (within the process's open-files limit), the node API listener's bounds
//! (connections and handshakes in all and per source, HTTP/2 windows and idle timeout:
//! [`crate::nodeapi::tls::NodeApiBounds`]), and the node API's caps on exec and log-follow
//! streams, and the bytes of file uploads it holds at once
//! ([`crate::nodeapi::uploads::UploadBudget`]).

use crate::cli::Flags;
use crate::error::{Error, Result};
use crate::forward::{ForwardLimits, connection_budget};
use crate::nodeapi::stream::StreamLimits;
use crate::nodeapi::tls::NodeApiBounds;
use crate::nodeapi::uploads::DEFAULT_UPLOAD_BYTES;

/// The bounds the agent starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The port forwarder's.
    pub forward: ForwardLimits,
    /// The node API's exec and log-follow streams.
    pub streams: StreamLimits,
    /// Bytes of file uploads the node API holds at once
    /// ([`crate::nodeapi::uploads::UploadBudget`]).
    pub upload_bytes: usize,
    /// The node API listener's.
    pub node_api: NodeApiBounds,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            forward: ForwardLimits::default(),
            streams: StreamLimits::default(),
            upload_bytes: DEFAULT_UPLOAD_BYTES,
            node_api: NodeApiBounds::default(),
        }
    }
}

impl Limits {
    /// The bounds the flags ask for, the forwarder's agent-wide cap fitted to `nofile` (the
    /// open-files limit; see [`connection_budget`]); an error names a flag that cannot work.
    pub fn from_flags(flags: &Flags, nofile: Option<u64>) -> Result<Self> {
        let wanted = flags.forward_max_connections as usize;
        let listener = smolvm_kit::limits::ListenerLimits {
            max_connections: flags.max_connections as usize,
            max_connections_per_source: flags.max_connections_per_source as usize,
            max_handshakes: flags.max_handshakes as usize,
            max_handshakes_per_source: flags.max_handshakes_per_source as usize,
            handshake_timeout: flags.handshake_timeout,
            http2_idle_timeout: flags.http2_idle_timeout,
            http2_buffer_budget: usize::try_from(flags.http2_buffer_budget).unwrap_or(usize::MAX),
        }
        .bounds()
        .map_err(|e| match e {
            smolvm_kit::Error::Config(message) => Error::Config(message),
            other => Error::Config(other.to_string()),
        })?;
        Ok(Self {
            forward: ForwardLimits {
                connections_per_port: flags.forward_max_connections_per_port as usize,
                connections: connection_budget(wanted, nofile, flags.forward_fd_reserve),
                idle_timeout: flags.forward_idle_timeout,
                held_per_port: flags.forward_max_held_per_port as usize,
                hold_timeout: flags.forward_hold_timeout,
                udp_sessions_per_port: flags.forward_max_udp_sessions_per_port as usize,
                udp_sessions_per_source: flags.forward_max_udp_sessions_per_source as usize,
            },
            streams: StreamLimits {
                per_machine: flags.max_streams_per_machine as usize,
                per_node: flags.max_streams as usize,
            },
            upload_bytes: usize::try_from(flags.max_upload_bytes).unwrap_or(usize::MAX),
            node_api: NodeApiBounds {
                accept: listener.accept,
                http2_window: listener.http2_window,
                http2_idle_timeout: listener.http2_idle_timeout,
                ..NodeApiBounds::default()
            },
        })
    }
}

/// The process's open-files limit (RLIMIT_NOFILE's soft value) now, if it can be read.
pub fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given, which lives on this stack.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (read == 0).then_some(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_files_limit_is_read() {
        assert!(open_files_limit().is_some_and(|n| n > 0));
    }
}
