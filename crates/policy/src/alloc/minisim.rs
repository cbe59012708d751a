//! Miniature simulation (Waldspurger et al., "Cache Modeling and Optimization using
//! Miniature Simulations", ATC'17): a tenant's miss-ratio curve *of the lender's own policy*,
//! for policies such as S3-FIFO that no stack-distance curve describes.
//!
//! Keys are spatially sampled at a fixed rate `R` (the same hash test as SHARDS); the
//! sampled stream is replayed against [`MINI_SIZES`] miniature caches of the real policy
//! code, the `k`-th of `R × k / MINI_SIZES × capacity` slots: a miniature cache of `R × s`
//! slots fed a sample of rate `R` misses about as often as a cache of `s` slots fed
//! everything. The curve is the miss ratio of each miniature cache, interpolated between
//! sizes (1 at size 0).
//!
//! Bounded: every structure is sized at construction (at most [`MAX_MINI_SLOTS`] slots in the
//! largest cache; with eight sizes 4.5 times that in all), and an access allocates nothing.
//! Unlike SHARDS the sample set needs no bound of its own: a miniature cache holds at most its
//! slots, so the rate never has to be lowered.
//!
//! Not wired into the lender: measured wired in (one per tenant beside SHARDS under S3-FIFO,
//! its curve handed to the allocator), `farcache bench alloc` had 16% fewer misses than
//! static against 17–19% with SHARDS' LRU curve. Eight sizes make the hulls' knees multiples
//! of capacity / 8 (a loop over 2,457 blocks of a 4,096-block lender got a target of 2,560,
//! and its neighbour's 1,536 left slots no one could use). Next: more sizes where the curve
//! bends, or the LRU curve's shape scaled to these sizes' miss ratios (BENCHMARKS.md).

use super::mrc::Curve;
use crate::{AnyPolicy, PolicyKind};

/// Miniature caches per tenant.
pub const MINI_SIZES: usize = 8;
/// Slots of the largest miniature cache (the lender's whole capacity, sampled).
pub const MAX_MINI_SLOTS: u64 = 1024;
/// Hashes are sampled on their top 24 bits, as in SHARDS.
const SAMPLE_BITS: u32 = 24;

/// One miniature cache: the policy, and an open-addressing key → slot table (linear
/// probing, at most half full, backward-shift deletion: no tombstones, no allocation).
struct Mini {
    policy: AnyPolicy,
    keys: Box<[u64]>,
    slot_at: Box<[u32]>,
    key_of: Box<[u64]>,
    used: u32,
    slots: u32,
    misses: f64,
}

impl Mini {
    fn new(kind: PolicyKind, slots: u32) -> Mini {
        let table = (2 * slots as usize + 2).next_power_of_two();
        Mini {
            policy: AnyPolicy::new(kind, slots, 1),
            keys: vec![0; table].into_boxed_slice(),
            slot_at: vec![0; table].into_boxed_slice(),
            key_of: vec![0; slots as usize].into_boxed_slice(),
            used: 0,
            slots,
            misses: 0.0,
        }
    }

    fn find(&self, key: u64) -> (usize, bool) {
        let mask = self.keys.len() - 1;
        let mut i = (key as usize) & mask;
        loop {
            match self.keys[i] {
                0 => return (i, false),
                k if k == key => return (i, true),
                _ => i = (i + 1) & mask,
            }
        }
    }

    fn remove(&mut self, key: u64) {
        let (mut i, found) = self.find(key);
        debug_assert!(found, "evicted key not in the table");
        let mask = self.keys.len() - 1;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            if self.keys[j] == 0 {
                break;
            }
            let home = (self.keys[j] as usize) & mask;
            // Move the entry at j into the hole at i unless its home lies cyclically in (i, j].
            let stays = if i <= j { i < home && home <= j } else { i < home || home <= j };
            if !stays {
                self.keys[i] = self.keys[j];
                self.slot_at[i] = self.slot_at[j];
                i = j;
            }
        }
        self.keys[i] = 0;
    }

    fn access(&mut self, key: u64) {
        let (i, found) = self.find(key);
        if found {
            self.policy.touch(self.slot_at[i]);
            return;
        }
        self.misses += 1.0;
        let slot = if self.used < self.slots {
            self.used += 1;
            self.used - 1
        } else {
            let victim = self.policy.evict(0).expect("a full cache has a victim");
            self.remove(self.key_of[victim as usize]);
            victim
        };
        // The table may have shifted on removal: find the key's place again.
        let (i, _) = self.find(key);
        self.keys[i] = key;
        self.slot_at[i] = slot;
        self.key_of[slot as usize] = key;
        self.policy.insert(slot, 0, key);
    }
}

/// A tenant's miniature simulations. See the module docs.
pub struct MiniSim {
    capacity: u64,
    threshold: u64,
    caches: Vec<Mini>,
    /// Sizes (in the lender's blocks) the caches stand for.
    sizes: [f64; MINI_SIZES],
    accesses: f64,
    /// Sampled accesses expected from what `offered` reported (0: no report).
    expected: f64,
    rate: f64,
}

impl MiniSim {
    /// Miniature caches of policy `kind` for a lender of `capacity` blocks, sampled at
    /// `R = min(1, MAX_MINI_SLOTS / capacity)`.
    pub fn new(kind: PolicyKind, capacity: u64) -> MiniSim {
        let capacity = capacity.max(1);
        let rate = (MAX_MINI_SLOTS as f64 / capacity as f64).min(1.0);
        let threshold = (((1u64 << SAMPLE_BITS) as f64 * rate) as u64).max(1);
        // The rate the threshold really gives, so that sizes scale by it exactly.
        let rate = threshold as f64 / (1u64 << SAMPLE_BITS) as f64;
        let mut sizes = [0.0; MINI_SIZES];
        let caches = (1..=MINI_SIZES)
            .map(|k| {
                let blocks = capacity as f64 * k as f64 / MINI_SIZES as f64;
                let slots = ((blocks * rate).round() as u32).max(1);
                sizes[k - 1] = f64::from(slots) / rate;
                Mini::new(kind, slots)
            })
            .collect();
        MiniSim { capacity, threshold, caches, sizes, accesses: 0.0, expected: 0.0, rate }
    }

    /// One GET of the key whose hash is `hash`. Returns whether it was sampled. Never
    /// allocates.
    pub fn access(&mut self, hash: u64) -> bool {
        let h = mix(hash);
        if h >> (64 - SAMPLE_BITS) >= self.threshold {
            return false;
        }
        let key = h.max(1);
        self.accesses += 1.0;
        for c in &mut self.caches {
            c.access(key);
        }
        true
    }

    /// `accesses` more accesses happened in all, sampled or not. Spatial sampling's error is
    /// mostly whether a few very hot keys happen to be sampled, and their accesses are hits:
    /// so misses are counted against the accesses expected at the rate, not those seen (the
    /// miniature-simulation form of SHARDS-adj).
    pub fn offered(&mut self, accesses: u64) {
        self.expected += accesses as f64 * self.rate;
    }

    /// The sampling threshold (see `ShardsMrc::is_sampled`; fixed).
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// Older accesses weigh `factor` (0..=1) times as much.
    pub fn decay(&mut self, factor: f64) {
        self.accesses *= factor;
        self.expected *= factor;
        for c in &mut self.caches {
            c.misses *= factor;
        }
    }

    /// The curve of what was seen (valid once some accesses are counted; the caller decides
    /// when it is mature).
    pub fn curve(&self) -> Curve {
        let mut c = Curve::from_fn(self.capacity, |_| 1.0);
        c.valid = self.accesses >= super::mrc::MIN_CURVE_ACCESSES;
        if self.accesses <= 0.0 {
            return c;
        }
        let seen = if self.expected > 0.0 { self.expected } else { self.accesses };
        let ratio = |k: usize| (self.caches[k].misses / seen).clamp(0.0, 1.0);
        let mut last = 1.0f64;
        for (p, m) in c.miss_ratio.iter_mut().enumerate().skip(1) {
            let x = p as f64 * c.unit_blocks;
            // Between (0, 1) and the first size, then between neighbouring sizes.
            let k = self.sizes.iter().position(|&s| s >= x).unwrap_or(MINI_SIZES - 1);
            let (x0, y0) = if k == 0 { (0.0, 1.0) } else { (self.sizes[k - 1], ratio(k - 1)) };
            let (x1, y1) = (self.sizes[k], ratio(k));
            let f = if x1 > x0 { ((x - x0) / (x1 - x0)).clamp(0.0, 1.0) } else { 1.0 };
            // Non-increasing, as the allocator's hulls assume (a policy need not be).
            last = last.min(y0 + (y1 - y0) * f);
            *m = last as f32;
        }
        c
    }

    /// Heap bytes held (fixed at construction).
    pub fn memory_bytes(&self) -> usize {
        self.caches
            .iter()
            .map(|c| {
                c.policy.memory_bytes()
                    + std::mem::size_of_val(&*c.keys)
                    + std::mem::size_of_val(&*c.slot_at)
                    + std::mem::size_of_val(&*c.key_of)
            })
            .sum::<usize>()
            + std::mem::size_of::<Self>()
    }
}

/// splitmix64's finalizer, as SHARDS samples (the same keys are sampled by both).
#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::alloc::CURVE_POINTS;

    /// Exact miss ratio of one cache of `slots` of `kind` over `trace`, the policy given
    /// fingerprints `fp(key)`.
    fn exact_with(kind: PolicyKind, slots: u32, trace: &[u64], fp: impl Fn(u64) -> u64) -> f64 {
        let mut p = AnyPolicy::new(kind, slots, 1);
        let (mut slot_of, mut key_of, mut used, mut misses) = (HashMap::new(), vec![0u64; slots as usize], 0, 0);
        for &k in trace {
            if let Some(&s) = slot_of.get(&k) {
                p.touch(s);
                continue;
            }
            misses += 1;
            let s = if used < slots {
                used += 1;
                used - 1
            } else {
                let v = p.evict(0).unwrap();
                slot_of.remove(&key_of[v as usize]);
                v
            };
            key_of[s as usize] = k;
            slot_of.insert(k, s);
            p.insert(s, 0, fp(k));
        }
        misses as f64 / trace.len() as f64
    }

    fn exact(kind: PolicyKind, slots: u32, trace: &[u64]) -> f64 {
        exact_with(kind, slots, trace, |k| mix(k ^ 0x55))
    }

    fn zipf(n: usize, keys: u64, s: f64, seed: u64) -> Vec<u64> {
        let w: Vec<f64> = (1..=keys).map(|k| 1.0 / (k as f64).powf(s)).collect();
        let total: f64 = w.iter().sum();
        let mut acc = 0.0;
        let cdf: Vec<f64> = w
            .iter()
            .map(|x| {
                acc += x / total;
                acc
            })
            .collect();
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                cdf.partition_point(|&c| c < (x >> 11) as f64 / (1u64 << 53) as f64) as u64
            })
            .collect()
    }

    #[test]
    fn every_key_sampled_gives_the_exact_s3fifo_miss_ratios() {
        // Capacity at most MAX_MINI_SLOTS: rate 1, each miniature cache is the real one.
        let cap = 800;
        let trace = zipf(40_000, 2000, 0.9, 7);
        let mut m = MiniSim::new(PolicyKind::S3Fifo, cap);
        // The keys are their own hashes here; the estimator mixes them again.
        for &k in &trace {
            assert!(m.access(k));
        }
        let hashed: Vec<u64> = trace.iter().map(|&k| mix(k).max(1)).collect();
        let c = m.curve();
        assert!(c.valid);
        for k in 1..=MINI_SIZES {
            let slots = (cap as usize * k / MINI_SIZES) as u32;
            // The same keys and fingerprints as the miniature cache: the same decisions.
            let want = exact_with(PolicyKind::S3Fifo, slots, &hashed, |k| k);
            let got = c.miss_ratio_at(slots as f64);
            assert!((got - want).abs() < 0.02, "{slots} slots: {got} vs exact {want}");
        }
    }

    #[test]
    fn a_sample_of_a_large_lender_is_close_to_the_exact_curve() {
        // Rate 1024 / 8192 = 1/8: each miniature cache stands for eight times its slots.
        let cap = 8192;
        let trace = zipf(300_000, 16_384, 0.9, 11);
        let mut m = MiniSim::new(PolicyKind::S3Fifo, cap);
        let sampled = trace.iter().filter(|&&k| m.access(k)).count();
        m.offered(trace.len() as u64);
        // About an eighth, give or take whether the hottest keys happen to be sampled.
        assert!((10_000..100_000).contains(&sampled), "{sampled} sampled");
        let c = m.curve();
        let mut err = 0.0;
        for k in [2, 4, 6, 8] {
            let slots = (cap as usize * k / MINI_SIZES) as u32;
            let want = exact(PolicyKind::S3Fifo, slots, &trace);
            let got = c.miss_ratio_at(slots as f64);
            err += (got - want).abs();
            assert!((got - want).abs() < 0.06, "{slots} slots: {got} vs exact {want}");
        }
        assert!(err / 4.0 < 0.04, "mean error {}", err / 4.0);
    }

    #[test]
    fn a_loop_that_fits_misses_only_its_first_pass_and_state_is_fixed() {
        let cap = 1000;
        let mut m = MiniSim::new(PolicyKind::S3Fifo, cap);
        let bytes = m.memory_bytes();
        // The largest state, any lender at or above 1024 blocks: with SHARDS' 512 KiB, under
        // the 1 MiB per tenant.
        let most = MiniSim::new(PolicyKind::S3Fifo, 1 << 30).memory_bytes();
        assert!(bytes <= most && most < 512 * 1024, "{bytes} / {most} bytes");
        for i in 0..50_000u64 {
            m.access(i % 300);
        }
        assert_eq!(m.memory_bytes(), bytes, "an access allocated");
        let c = m.curve();
        // At every size that holds the loop (≥ 375 blocks) only its first passes miss (the
        // first, and the second for keys S3-FIFO's small queue let go to its ghost).
        for x in [375.0, 500.0, 1000.0] {
            assert!(c.miss_ratio_at(x) < 0.02, "{x}: {}", c.miss_ratio_at(x));
        }
        assert!(c.miss_ratio_at(125.0) > 0.5, "{}", c.miss_ratio_at(125.0));
        let last = c.miss_ratio[CURVE_POINTS - 1];
        assert!(c.miss_ratio.windows(2).all(|w| w[1] <= w[0]) && last < 0.02);
    }
}
