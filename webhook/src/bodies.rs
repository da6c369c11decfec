//! Reader slots for request bodies still arriving.
//!
//! A fixed number of slots, each stamped with when its reader took it. When every slot is
//! taken, a newcomer displaces the reader that has held its slot longest, once that one has held
//! it for [`MIN_HOLD`] (it is told, answers 408 and frees the slot), and waits a short while for
//! a slot to free; at most as many newcomers wait at once as there are slots (each displaces at
//! most one reader, so more could only queue), and one more is refused at once, so that streams
//! opened faster than bodies arrive are answered at once rather than held. A review's body comes in
//! milliseconds; a body that trickles holds a slot for seconds. So however many clients
//! trickle, a body that is actually arriving gets a slot, and a slow one loses it first.
//!
//! Lock-free on the way in and out: a semaphore's `try_acquire`, one compare-and-swap for a
//! free slot, a store when done. Only a newcomer finding every slot taken scans the slots and
//! waits on the semaphore.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use futures::task::AtomicWaker;
use tokio::sync::{Semaphore, SemaphorePermit};

/// How long a reader holds its slot before a newcomer may displace it: far longer than a review's
/// body takes to arrive once its head has, far shorter than a trickle holds a slot.
pub const MIN_HOLD: Duration = Duration::from_millis(50);

/// One slot: when its reader took it (microseconds since [`Readers`] began, plus one; zero when
/// free), whether a newcomer displaced it, and the reader's task to wake when it is.
#[derive(Default)]
struct Slot {
    started: AtomicU64,
    displaced: AtomicBool,
    waker: AtomicWaker,
}

/// The reader slots.
pub struct Readers {
    permits: Semaphore,
    slots: Box<[Slot]>,
    epoch: Instant,
    /// Newcomers waiting for a slot.
    waiting: AtomicUsize,
}

/// A newcomer's place among those waiting, given up when dropped (also when its wait is
/// cancelled).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Readers {
    /// `n` slots (at least one).
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        Readers {
            permits: Semaphore::new(n),
            slots: (0..n).map(|_| Slot::default()).collect(),
            epoch: Instant::now(),
            waiting: AtomicUsize::new(0),
        }
    }

    /// The number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// A free slot, if there is one.
    pub fn try_take(&self) -> Option<Reader<'_>> {
        self.permits.try_acquire().ok().map(|permit| self.claim(permit))
    }

    /// A slot when every one is taken: displaces the reader that has held its slot longest (once
    /// it has held it for [`MIN_HOLD`]), then waits up to `wait` for a slot. `None` when none
    /// frees in time, or at once when as many newcomers as there are slots are waiting already.
    ///
    /// A reader is displaced only after [`MIN_HOLD`]: a review whose body is a moment behind its
    /// head (over HTTP/2, the DATA frame after the HEADERS) keeps its slot, and the newcomer waits
    /// for that body, which comes in milliseconds, or for the holder to age. One newcomer
    /// displaces at most one reader.
    pub async fn take_displacing(&self, wait: Duration) -> Option<Reader<'_>> {
        if let Some(reader) = self.try_take() {
            return Some(reader);
        }
        let _waiting = Waiting(&self.waiting);
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.slots.len() {
            return None;
        }
        let deadline = tokio::time::Instant::now() + wait;
        let mut displaced = false;
        loop {
            if !displaced {
                displaced = self.displace_oldest(MIN_HOLD);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            // Until one is displaced, look again as holders age.
            let tick = if displaced { left } else { left.min(MIN_HOLD / 4) };
            match tokio::time::timeout(tick, self.permits.acquire()).await {
                Ok(Ok(permit)) => return Some(self.claim(permit)),
                Ok(Err(_)) => return None,
                Err(_) => continue,
            }
        }
    }

    /// Marks the longest-held slot not yet displaced, held for at least `min_hold`, as displaced,
    /// and wakes its reader. Whether it displaced one.
    fn displace_oldest(&self, min_hold: Duration) -> bool {
        let now = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1) + 1;
        let min_hold = u64::try_from(min_hold.as_micros()).unwrap_or(u64::MAX);
        let oldest = self
            .slots
            .iter()
            .filter(|s| !s.displaced.load(Ordering::Acquire))
            .filter_map(|s| match s.started.load(Ordering::Acquire) {
                0 => None,
                started if now.saturating_sub(started) < min_hold => None,
                started => Some((started, s)),
            })
            .min_by_key(|(started, _)| *started);
        match oldest {
            Some((_, slot)) if !slot.displaced.swap(true, Ordering::AcqRel) => {
                slot.waker.wake();
                true
            }
            _ => false,
        }
    }

    /// Stamps a free slot for `permit`'s holder. Every permit has a free slot: a reader frees its
    /// slot before its permit.
    fn claim<'a>(&'a self, permit: SemaphorePermit<'a>) -> Reader<'a> {
        let now = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1) + 1;
        let index = self
            .slots
            .iter()
            .position(|s| {
                s.started
                    .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            // Unreachable while slots and permits match; the first slot then serves, shared.
            .unwrap_or(0);
        Reader {
            readers: self,
            index,
            _permit: permit,
        }
    }
}

/// A taken slot, freed when dropped.
pub struct Reader<'a> {
    readers: &'a Readers,
    index: usize,
    // Dropped after `drop` frees the slot.
    _permit: SemaphorePermit<'a>,
}

impl Reader<'_> {
    fn slot(&self) -> Option<&Slot> {
        self.readers.slots.get(self.index)
    }

    /// Ready once a newcomer displaced this reader; registers the task to be woken then.
    pub fn poll_displaced(&self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(slot) = self.slot() else { return Poll::Pending };
        if slot.displaced.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        slot.waker.register(cx.waker());
        if slot.displaced.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Resolves once a newcomer displaced this reader.
    pub async fn displaced(&self) {
        std::future::poll_fn(|cx| self.poll_displaced(cx)).await
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot() {
            slot.displaced.store(false, Ordering::Release);
            slot.started.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_newcomer_displaces_the_longest_held_slot() {
        let readers = Readers::new(2);
        let first = readers.try_take();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let second = readers.try_take();
        let (Some(first), Some(second)) = (first, second) else {
            panic!("two free slots")
        };
        assert!(readers.try_take().is_none(), "both taken");

        // The newcomer displaces the first reader, which is told and gives its slot up.
        let newcomer = readers.take_displacing(Duration::from_secs(30));
        let gives_up = async {
            first.displaced().await;
            drop(first);
        };
        let (newcomer, ()) = tokio::join!(newcomer, gives_up);
        assert!(newcomer.is_some(), "the newcomer got the freed slot");
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(
            second.poll_displaced(&mut cx).is_pending(),
            "the younger reader keeps its slot"
        );

        // A displaced reader that does not give its slot up: the next newcomer displaces the
        // other reader, and with neither freeing a slot, it is refused after its wait.
        let refused = readers.take_displacing(Duration::from_millis(20)).await;
        assert!(refused.is_none());
        assert!(
            second.poll_displaced(&mut cx).is_ready(),
            "the oldest left was displaced"
        );
        drop(second);
        drop(newcomer);
        assert!(readers.try_take().is_some(), "slots free again");
        assert_eq!(readers.capacity(), 2);
    }

    /// With every slot taken, as many newcomers wait as there are slots; one more is refused at
    /// once, and a place comes back when a waiter goes (here, its wait cancelled).
    #[tokio::test(start_paused = true)]
    async fn at_most_as_many_newcomers_wait_as_there_are_slots() {
        let readers = Readers::new(2);
        let held = (readers.try_take(), readers.try_take());
        let waiters = (
            readers.take_displacing(Duration::from_secs(30)),
            readers.take_displacing(Duration::from_secs(30)),
        );
        let mut waiters = (Box::pin(waiters.0), Box::pin(waiters.1));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(waiters.0.as_mut().poll(&mut cx).is_pending());
        assert!(waiters.1.as_mut().poll(&mut cx).is_pending());
        assert!(
            readers.take_displacing(Duration::from_secs(30)).await.is_none(),
            "a third newcomer is refused at once"
        );
        drop(waiters.0);
        let mut third = Box::pin(readers.take_displacing(Duration::from_secs(30)));
        assert!(third.as_mut().poll(&mut cx).is_pending(), "a place came back");
        drop((held, waiters.1, third));
    }

    #[test]
    fn only_a_reader_that_held_its_slot_long_enough_is_displaced() {
        let readers = Readers::new(1);
        let Some(reader) = readers.try_take() else {
            panic!("a free slot")
        };
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(
            !readers.displace_oldest(Duration::from_secs(3600)),
            "younger than the minimum hold: kept"
        );
        assert!(reader.poll_displaced(&mut cx).is_pending());
        assert!(readers.displace_oldest(Duration::ZERO), "old enough: displaced");
        assert!(reader.poll_displaced(&mut cx).is_ready());
        assert!(!readers.displace_oldest(Duration::ZERO), "one displacement per reader");
    }
}
