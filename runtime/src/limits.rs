//! What the agent's listeners let one client hold, from the flags: the port forwarder's caps
//! and idle timeout (within the process's open-files limit), and the node API's caps on exec
//! and log-follow streams, and the bytes of file uploads it holds at once ([`UploadBudget`]).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::cli::Flags;
use crate::forward::{ForwardLimits, connection_budget};
use crate::nodeapi::stream::StreamLimits;

/// Bytes of file uploads the node API holds at once by default (256 MiB: four uploads of the
/// largest size).
pub const DEFAULT_UPLOAD_BYTES: usize = 256 << 20;

/// The bounds the agent starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The port forwarder's.
    pub forward: ForwardLimits,
    /// The node API's exec and log-follow streams.
    pub streams: StreamLimits,
    /// Bytes of file uploads the node API holds at once ([`UploadBudget`]).
    pub upload_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            forward: ForwardLimits::default(),
            streams: StreamLimits::default(),
            upload_bytes: DEFAULT_UPLOAD_BYTES,
        }
    }
}

impl Limits {
    /// The bounds the flags ask for, the forwarder's agent-wide cap fitted to `nofile` (the
    /// open-files limit; see [`connection_budget`]).
    pub fn from_flags(flags: &Flags, nofile: Option<u64>) -> Self {
        let wanted = flags.forward_max_connections as usize;
        Self {
            forward: ForwardLimits {
                connections_per_port: flags.forward_max_connections_per_port as usize,
                connections: connection_budget(wanted, nofile, flags.forward_fd_reserve),
                idle_timeout: flags.forward_idle_timeout,
                udp_sessions_per_port: flags.forward_max_udp_sessions_per_port as usize,
                udp_sessions_per_source: flags.forward_max_udp_sessions_per_source as usize,
            },
            streams: StreamLimits {
                per_machine: flags.max_streams_per_machine as usize,
                per_node: flags.max_streams as usize,
            },
            upload_bytes: usize::try_from(flags.max_upload_bytes).unwrap_or(usize::MAX),
        }
    }
}

/// The bytes of file uploads the node API holds at once, all callers together: the files route
/// keeps an upload in memory until smolvm has it, so without a budget a few callers with large
/// uploads could take the agent's memory (the agent shares its cgroup with the node's VMs).
/// An upload takes its declared length before a byte of its body is read, or, without one,
/// each piece as it arrives; beyond the budget it is answered 429 `TooManyBytes`.
#[derive(Debug, Clone)]
pub struct UploadBudget {
    free: Arc<Semaphore>,
    limit: usize,
}

/// Bytes taken from an [`UploadBudget`], given back when dropped.
#[derive(Debug, Default)]
pub struct UploadHold {
    taken: Option<OwnedSemaphorePermit>,
}

impl UploadBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        let limit = limit.min(Semaphore::MAX_PERMITS);
        Self {
            free: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The bytes free now.
    pub fn free(&self) -> usize {
        self.free.available_permits()
    }

    /// Takes `bytes` more into `hold`; `false` (and nothing taken) when fewer are free.
    pub fn take(&self, hold: &mut UploadHold, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let Ok(bytes) = u32::try_from(bytes) else {
            return false;
        };
        match self.free.clone().try_acquire_many_owned(bytes) {
            Ok(permit) => {
                match &mut hold.taken {
                    Some(taken) => taken.merge(permit),
                    None => hold.taken = Some(permit),
                }
                true
            }
            Err(_) => false,
        }
    }
}

impl UploadHold {
    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.taken.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
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
    fn uploads_share_the_budget_until_they_end() {
        let budget = UploadBudget::new(100);
        let mut first = UploadHold::default();
        assert!(budget.take(&mut first, 60));
        assert!(budget.take(&mut first, 0));
        let mut second = UploadHold::default();
        // (taken, asked, admitted, held after)
        for (asked, admitted, held) in [(50, false, 0), (40, true, 40), (1, false, 40)] {
            assert_eq!(budget.take(&mut second, asked), admitted, "{asked}");
            assert_eq!(second.bytes(), held, "{asked}");
        }
        assert!(!budget.take(&mut UploadHold::default(), u64::MAX));
        drop(first);
        assert!(budget.take(&mut second, 60));
        assert_eq!(second.bytes(), 100);
    }

    #[test]
    fn the_open_files_limit_is_read() {
        assert!(open_files_limit().is_some_and(|n| n > 0));
    }
}
