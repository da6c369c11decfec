//! Slots counted in all and per source address: what a listener lets its callers hold before
//! they have authenticated (connections, TLS handshakes in progress; the ops ports' connections).
//!
//! Anyone who reaches a port can open TCP connections, as many as they like, so a cap in all
//! alone lets one address take every slot. [`Shares`] caps both: a source beyond its share, or a
//! newcomer once every slot is taken, is refused at once ([`judge`], a pure rule), and a slot
//! comes back when its [`Share`] is dropped. Sources are whole addresses (an IPv4 address mapped
//! into IPv6 counts as the IPv4 one): a caller holding many addresses (an IPv6 prefix, many pods)
//! is bounded only by the cap in all, which is why the listeners' NetworkPolicies and the host
//! firewall still matter.
//!
//! One short lock per slot taken and given back (connections and handshakes, never requests);
//! the table holds an entry only for a source with a slot, so it is never larger than the cap.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Why a slot was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Every slot is taken.
    Full,
    /// The source holds its share.
    Source,
}

/// Whether a source holding `from_source` slots may take one more while `open` are taken, with
/// `cap` slots in all and `per_source` for one source. A source at its share is refused as such
/// (`Source`) even when every slot is taken too: it is the more precise reason.
pub fn judge(open: usize, from_source: usize, cap: usize, per_source: usize) -> Result<(), Refused> {
    if from_source >= per_source {
        Err(Refused::Source)
    } else if open >= cap {
        Err(Refused::Full)
    } else {
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Counts {
    open: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// `cap` slots in all, `per_source` for one source address.
#[derive(Debug)]
pub struct Shares {
    cap: usize,
    per_source: usize,
    counts: Mutex<Counts>,
}

impl Shares {
    /// `cap` slots in all, at most `per_source` of them for one address (at least one each).
    pub fn new(cap: usize, per_source: usize) -> Arc<Self> {
        Arc::new(Shares {
            cap: cap.max(1),
            per_source: per_source.max(1),
            counts: Mutex::new(Counts::default()),
        })
    }

    /// A slot for `source`, or why not.
    pub fn take(self: &Arc<Self>, source: IpAddr) -> Result<Share, Refused> {
        let source = source.to_canonical();
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let from_source = counts.by_source.get(&source).copied().unwrap_or(0);
        judge(counts.open, from_source, self.cap, self.per_source)?;
        counts.open += 1;
        *counts.by_source.entry(source).or_default() += 1;
        Ok(Share {
            shares: self.clone(),
            source,
        })
    }

    /// Slots taken now, in all and by `source`.
    pub fn taken(&self, source: IpAddr) -> (usize, usize) {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let from_source = counts.by_source.get(&source.to_canonical()).copied().unwrap_or(0);
        (counts.open, from_source)
    }
}

/// A slot taken from [`Shares`], given back when dropped.
#[derive(Debug)]
pub struct Share {
    shares: Arc<Shares>,
    source: IpAddr,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut counts = self.shares.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.open = counts.open.saturating_sub(1);
        if let Some(n) = counts.by_source.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.by_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        // (open in all, open from the source, cap, per source, verdict)
        let table = [
            (0, 0, 3, 2, Ok(())),
            (2, 1, 3, 2, Ok(())),
            (2, 2, 3, 2, Err(Refused::Source)),
            (3, 0, 3, 2, Err(Refused::Full)),
            (3, 2, 3, 2, Err(Refused::Source)),
            (0, 0, 1, 1, Ok(())),
            (1, 1, 1, 1, Err(Refused::Source)),
        ];
        for (open, from_source, cap, per_source, verdict) in table {
            assert_eq!(
                judge(open, from_source, cap, per_source),
                verdict,
                "{open} {from_source} {cap} {per_source}"
            );
        }
    }

    #[test]
    fn slots_are_counted_per_source_and_come_back() {
        let a: IpAddr = "127.0.0.2".parse().expect("address");
        let b: IpAddr = "127.0.0.3".parse().expect("address");
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().expect("address");
        let shares = Shares::new(3, 2);
        let first = shares.take(a).expect("a's first");
        let second = shares.take(mapped).expect("a's second, spelt as IPv6");
        assert_eq!(shares.take(a).map(|_| ()), Err(Refused::Source));
        let third = shares.take(b).expect("b's first");
        assert_eq!(shares.take(b).map(|_| ()), Err(Refused::Full));
        assert_eq!(shares.taken(a), (3, 2));
        drop(first);
        assert_eq!(shares.taken(a), (2, 1));
        let again = shares.take(b).expect("b's second, once a slot came back");
        drop((second, third, again));
        assert_eq!(shares.taken(a), (0, 0));
        let counts = shares.counts.lock().expect("counts");
        assert!(counts.by_source.is_empty(), "no entry left behind");
    }
}
