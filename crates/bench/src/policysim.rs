//! Trace-driven simulation of the lender's eviction policies: hit ratios without a network.
//!
//! Everything here is pure and deterministic: the same trace (and the same seed for the
//! generators) gives the same result on every machine, so figures can be quoted beside the
//! command that produced them.

use std::collections::HashMap;

use farcache_policy::{AnyPolicy, PolicyKind, SlotId};

/// Outcome of one simulation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimResult {
    pub hits: u64,
    pub misses: u64,
    /// `hits / (hits + misses)`, 0 for an empty trace.
    pub hit_ratio: f64,
}

/// Plays `trace` (a sequence of keys) against a cache of `slots` slots managed by `kind`, as
/// the store does with a single class: a hit touches the key's slot; a miss inserts the key
/// into a free slot, evicting a victim first when none is free.
pub fn simulate(kind: PolicyKind, slots: u32, trace: &[u64]) -> SimResult {
    let mut policy = AnyPolicy::new(kind, slots, 1);
    let mut slot_of: HashMap<u64, SlotId> = HashMap::with_capacity(slots as usize);
    let mut key_of: Vec<u64> = vec![0; slots as usize];
    // Popped from the end: slots fill in order 0, 1, 2, ...
    let mut free: Vec<SlotId> = (0..slots).rev().collect();
    let (mut hits, mut misses) = (0u64, 0u64);
    for &key in trace {
        if let Some(&slot) = slot_of.get(&key) {
            policy.touch(slot);
            hits += 1;
            continue;
        }
        misses += 1;
        let slot = match free.pop() {
            Some(slot) => slot,
            None => match policy.evict(0) {
                Some(victim) => {
                    let evicted = slot_of.remove(&key_of[victim as usize]);
                    debug_assert_eq!(evicted, Some(victim), "policy and index disagree");
                    victim
                }
                None => continue, // a cache of zero slots
            },
        };
        key_of[slot as usize] = key;
        slot_of.insert(key, slot);
        policy.insert(slot, 0, fingerprint(key));
    }
    let total = hits + misses;
    let hit_ratio = if total == 0 { 0.0 } else { hits as f64 / total as f64 };
    SimResult { hits, misses, hit_ratio }
}

/// A well-mixed 64-bit hash of a key (SplitMix64's finaliser), as the store's fingerprints
/// are.
fn fingerprint(key: u64) -> u64 {
    let mut z = key;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64: a tiny, fast, seedable generator, good enough for workloads.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        fingerprint(self.0)
    }

    /// Uniform in `[0, 1)`, from the top 53 bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf over ranks `0..keys`: rank `i` has weight `1 / (i + 1)^theta`. Sampled by binary
/// search in the precomputed cumulative weights (8 bytes per key).
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(keys: u64, theta: f64) -> Self {
        assert!(keys > 0, "Zipf needs at least one key");
        assert!(theta >= 0.0 && theta.is_finite(), "Zipf theta must be >= 0, got {theta}");
        let mut total = 0.0;
        let cdf = (0..keys)
            .map(|i| {
                total += 1.0 / ((i + 1) as f64).powf(theta);
                total
            })
            .collect();
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut SplitMix64) -> u64 {
        let total = *self.cdf.last().expect("at least one key");
        let u = rng.next_f64() * total;
        let rank = self.cdf.partition_point(|&c| c <= u);
        rank.min(self.cdf.len() - 1) as u64
    }
}

/// `len` accesses to keys `0..keys`, Zipf-distributed with skew `theta` (0.99 is the usual
/// "web-like" skew); key 0 is the most popular.
pub fn zipf_trace(keys: u64, theta: f64, len: usize, seed: u64) -> Vec<u64> {
    let zipf = Zipf::new(keys, theta);
    let mut rng = SplitMix64(seed);
    (0..len).map(|_| zipf.sample(&mut rng)).collect()
}

/// Skew of the hot set in [`scan_mix_trace`].
pub const SCAN_MIX_THETA: f64 = 0.99;

/// `len` accesses alternating between bursts of `scan_keys` Zipf([`SCAN_MIX_THETA`]) accesses
/// to the hot keys `0..hot_keys` and one-pass sequential scans of `scan_keys` keys that are
/// never seen again (numbered from `hot_keys` up), so about half the accesses are scans. This
/// is the pattern that flushes an LRU cache whenever a scan is longer than the cache.
pub fn scan_mix_trace(hot_keys: u64, scan_keys: u64, len: usize, seed: u64) -> Vec<u64> {
    assert!(scan_keys > 0, "scan_mix_trace needs scan_keys > 0");
    let zipf = Zipf::new(hot_keys, SCAN_MIX_THETA);
    let mut rng = SplitMix64(seed);
    let mut next_scan_key = hot_keys;
    let mut trace = Vec::with_capacity(len);
    'phases: loop {
        for _ in 0..scan_keys {
            if trace.len() == len {
                break 'phases;
            }
            trace.push(zipf.sample(&mut rng));
        }
        for _ in 0..scan_keys {
            if trace.len() == len {
                break 'phases;
            }
            trace.push(next_scan_key);
            next_scan_key += 1;
        }
    }
    trace
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const KINDS: [PolicyKind; 2] = [PolicyKind::Lru, PolicyKind::S3Fifo];

    #[test]
    fn zipf_traces_are_deterministic_in_range_and_skewed() {
        let a = zipf_trace(1000, 0.99, 50_000, 7);
        assert_eq!(a, zipf_trace(1000, 0.99, 50_000, 7));
        assert_ne!(a, zipf_trace(1000, 0.99, 50_000, 8));
        assert_eq!(a.len(), 50_000);
        assert!(a.iter().all(|&k| k < 1000));
        let mut counts = vec![0u32; 1000];
        for &k in &a {
            counts[k as usize] += 1;
        }
        // Rank 0 has weight 1 / H(1000, 0.99), about 13% of the accesses; rank 9 about 1.4%.
        assert!(counts[0] > 5_500 && counts[0] < 7_500, "rank 0: {}", counts[0]);
        assert!(counts[0] > 5 * counts[9], "{} vs {}", counts[0], counts[9]);
        // theta = 0 is uniform: every key appears.
        let uniform = zipf_trace(100, 0.0, 10_000, 1);
        assert_eq!(uniform.iter().collect::<HashSet<_>>().len(), 100);
    }

    #[test]
    fn scan_mix_is_half_one_pass_scans() {
        let trace = scan_mix_trace(1000, 300, 10_000, 3);
        assert_eq!(trace.len(), 10_000);
        let scans: Vec<u64> = trace.iter().copied().filter(|&k| k >= 1000).collect();
        // 16 full phases of 600 accesses, then 300 hot and 100 scanned.
        assert_eq!(scans.len(), 16 * 300 + 100);
        // Scanned keys are sequential and never repeat.
        assert!(scans.windows(2).all(|w| w[1] == w[0] + 1));
        assert_eq!(trace[..300].iter().filter(|&&k| k >= 1000).count(), 0);
        assert_eq!(trace[300..600], (1000..1300).collect::<Vec<_>>()[..]);
    }

    #[test]
    fn simulation_counts_every_access_and_is_deterministic() {
        let trace = zipf_trace(500, 0.9, 20_000, 11);
        for kind in KINDS {
            let r = simulate(kind, 50, &trace);
            assert_eq!(r.hits + r.misses, trace.len() as u64);
            assert_eq!(r, simulate(kind, 50, &trace));
            assert!(r.hit_ratio > 0.0 && r.hit_ratio < 1.0, "{kind:?}: {r:?}");
        }
    }

    #[test]
    fn a_cache_that_holds_everything_misses_only_once_per_key() {
        let trace = zipf_trace(300, 0.8, 10_000, 5);
        let distinct = trace.iter().collect::<HashSet<_>>().len() as u64;
        for kind in KINDS {
            let r = simulate(kind, 300, &trace);
            assert_eq!(r.misses, distinct, "{kind:?}");
        }
    }

    #[test]
    fn a_zero_slot_cache_never_hits() {
        let trace = [1, 1, 2, 1];
        for kind in KINDS {
            let r = simulate(kind, 0, &trace);
            assert_eq!((r.hits, r.misses), (0, 4), "{kind:?}");
        }
        assert_eq!(simulate(PolicyKind::Lru, 4, &[]).hit_ratio, 0.0);
    }

    /// A recency-only workload where LRU is exactly right: a loop over `slots` keys hits
    /// every time after the first pass.
    #[test]
    fn lru_is_exact_on_a_loop_that_fits() {
        let trace: Vec<u64> = (0..10).flat_map(|_| 0..64).collect();
        let r = simulate(PolicyKind::Lru, 64, &trace);
        assert_eq!(r.misses, 64);
    }

    #[test]
    fn both_policies_do_well_on_zipf() {
        // A cache of 10% of the keys under the usual skew.
        let trace = zipf_trace(10_000, 0.99, 200_000, 42);
        let lru = simulate(PolicyKind::Lru, 1_000, &trace);
        let s3 = simulate(PolicyKind::S3Fifo, 1_000, &trace);
        // Measured: LRU 0.66, S3-FIFO 0.72.
        assert!(lru.hit_ratio > 0.6, "LRU {lru:?}");
        assert!(s3.hit_ratio > 0.6, "S3-FIFO {s3:?}");
        // Zipf is frequency-driven, where S3-FIFO beats LRU (as in the paper).
        assert!(s3.hit_ratio > lru.hit_ratio, "S3-FIFO {s3:?} vs LRU {lru:?}");
    }

    #[test]
    fn s3fifo_resists_scans_that_flush_lru() {
        // Scans of 5x the cache between bursts on a hot set 10x the cache.
        let trace = scan_mix_trace(10_000, 5_000, 200_000, 42);
        let lru = simulate(PolicyKind::Lru, 1_000, &trace);
        let s3 = simulate(PolicyKind::S3Fifo, 1_000, &trace);
        // At most half the accesses (the hot ones) can hit.
        assert!(s3.hit_ratio < 0.5 && lru.hit_ratio < 0.5);
        // Measured: LRU 0.31, S3-FIFO 0.36.
        assert!(s3.hit_ratio > lru.hit_ratio + 0.03, "S3-FIFO {s3:?} vs LRU {lru:?}");
    }
}
