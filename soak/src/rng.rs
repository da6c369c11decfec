//! The soak's seeded PRNG: SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom
//! number generators", 2014; the reference `splitmix64.c` by Vigna). Only wrapping 64-bit
//! arithmetic, so a seed gives the same numbers on every machine and every build; that is the
//! whole point (a seed printed by a failing run reproduces its schedule and its workload).
//! Not for anything secret.

/// The additive constant of SplitMix64 (the golden ratio, as a 64-bit fraction).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output function: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Which part of a run draws from a stream, so that each part's numbers depend on the seed
/// alone and not on how many numbers another part drew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The fault injector's schedule.
    Schedule,
    /// The workload generator.
    Workload,
}

impl Stream {
    fn id(self) -> u64 {
        match self {
            Stream::Schedule => 1,
            Stream::Workload => 2,
        }
    }
}

/// A SplitMix64 generator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// The generator whose first output is SplitMix64's first output for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// The generator of one part of the run with this seed. (SplitMix64 seeded with `seed + k *
    /// GAMMA` is the same sequence shifted by k, so the stream's seed is mixed, not added.)
    pub fn stream(seed: u64, stream: Stream) -> Self {
        Rng::new(mix(seed ^ mix(stream.id().wrapping_mul(GAMMA))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// A number in `0..n` (0 when `n` is 0), unbiased: Lemire's multiply-and-shift with
    /// rejection of the short zone.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let product = u128::from(self.next_u64()) * u128::from(n);
            // The low half decides rejection; the high half is the answer (both fit by shifting).
            let low = product as u64;
            if low >= threshold {
                return (product >> 64) as u64;
            }
        }
    }

    /// A number in `low..=high` (`low` when `high < low`).
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        match (high - low).checked_add(1) {
            Some(span) => low + self.below(span),
            None => self.next_u64(),
        }
    }

    /// True `numerator` times in `denominator` on average.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }

    /// One item of `items`, or None when it is empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        let len = u64::try_from(items.len()).ok()?;
        usize::try_from(self.below(len)).ok().and_then(|i| items.get(i))
    }

    /// An index into `weights` drawn in proportion to its weight; None when every weight is 0.
    pub fn weighted(&mut self, weights: &[u64]) -> Option<usize> {
        let total = weights.iter().fold(0u64, |sum, w| sum.saturating_add(*w));
        if total == 0 {
            return None;
        }
        let mut draw = self.below(total);
        for (i, weight) in weights.iter().enumerate() {
            if draw < *weight {
                return Some(i);
            }
            draw -= weight;
        }
        None
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = u64::try_from(i + 1).map_or(0, |n| self.below(n));
            items.swap(i, usize::try_from(j).unwrap_or(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference outputs: `splitmix64.c` with x = 0, and Rosetta Code's SplitMix64 task
    /// (seed 1234567).
    #[test]
    fn outputs_are_splitmix64s() {
        let cases: [(u64, [u64; 5]); 2] = [
            (
                0,
                [
                    0xe220_a839_7b1d_cdaf,
                    0x6e78_9e6a_a1b9_65f4,
                    0x06c4_5d18_8009_454f,
                    0xf88b_b8a8_724c_81ec,
                    0x1b39_896a_51a8_749b,
                ],
            ),
            (
                1_234_567,
                [
                    6_457_827_717_110_365_317,
                    3_203_168_211_198_807_973,
                    9_817_491_932_198_370_423,
                    4_593_380_528_125_082_431,
                    16_408_922_859_458_223_821,
                ],
            ),
        ];
        for (seed, expected) in cases {
            let mut rng = Rng::new(seed);
            let got: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
            assert_eq!(got, expected, "seed {seed}");
        }
    }

    #[test]
    fn streams_differ_and_repeat() {
        let a: Vec<u64> = {
            let mut r = Rng::stream(7, Stream::Schedule);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::stream(7, Stream::Workload);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let again: Vec<u64> = {
            let mut r = Rng::stream(7, Stream::Schedule);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_ne!(a, b);
        assert_eq!(a, again);
        // A fixed value, so that a change of the derivation (which changes every seed's run) is
        // a deliberate one.
        assert_eq!(Rng::stream(0, Stream::Schedule), Rng::new(mix(mix(GAMMA))));
    }

    #[test]
    fn bounded_draws_stay_in_bounds() {
        let mut rng = Rng::new(42);
        let cases: [(u64, u64); 5] = [(0, 0), (3, 3), (5, 9), (0, 1), (10, 2)];
        for (low, high) in cases {
            for _ in 0..200 {
                let v = rng.between(low, high);
                assert!(v >= low && v <= high.max(low), "{v} outside {low}..={high}");
            }
        }
        assert_eq!(rng.below(0), 0);
        // The full range (its span overflows u64) draws without panicking.
        assert_ne!(rng.between(0, u64::MAX), rng.between(0, u64::MAX));
        for n in [1u64, 2, 3, 7, 1000] {
            for _ in 0..200 {
                assert!(rng.below(n) < n);
            }
        }
    }

    #[test]
    fn below_reaches_every_value() {
        let mut rng = Rng::new(9);
        let mut seen = [0u32; 6];
        for _ in 0..6000 {
            seen[rng.below(6) as usize] += 1;
        }
        assert!(seen.iter().all(|n| (800..1200).contains(n)), "{seen:?}");
    }

    #[test]
    fn weighted_pick_and_shuffle() {
        let mut rng = Rng::new(3);
        let cases: [(&[u64], Option<&[usize]>); 4] = [
            (&[], None),
            (&[0, 0], None),
            (&[0, 5, 0], Some(&[1])),
            (&[1, 1], Some(&[0, 1])),
        ];
        for (weights, allowed) in cases {
            for _ in 0..50 {
                let got = rng.weighted(weights);
                match allowed {
                    None => assert_eq!(got, None, "{weights:?}"),
                    Some(allowed) => assert!(got.is_some_and(|i| allowed.contains(&i)), "{weights:?}: {got:?}"),
                }
            }
        }
        assert_eq!(rng.pick::<u8>(&[]), None);
        assert_eq!(rng.pick(&[4]), Some(&4));
        let mut items: Vec<u32> = (0..20).collect();
        rng.shuffle(&mut items);
        let mut sorted = items.clone();
        sorted.sort();
        assert_eq!(sorted, (0..20).collect::<Vec<_>>());
        assert_ne!(items, sorted);
    }
}
