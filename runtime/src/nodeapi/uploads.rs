//! The bytes of file uploads the node API holds at once ([`UploadBudget`]): the files route
//! keeps an upload in memory until smolvm has it.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes of file uploads the node API holds at once by default (256 MiB: four uploads of the
/// largest size).
pub const DEFAULT_UPLOAD_BYTES: usize = 256 << 20;

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
}
