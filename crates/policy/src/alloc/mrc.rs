//! Online miss-ratio curves: SHARDS (Waldspurger et al., FAST'15), fixed-size variant.
//!
//! A key is *sampled* when its hash falls below a threshold (spatial sampling: every access
//! of a sampled key is seen, so reuse distances are exact among the sampled keys and scale
//! by the sampling rate `R` to distances in the whole stream). For each access of a sampled
//! key the estimator finds the number of distinct sampled keys accessed since its previous
//! access (a Fenwick tree over access times), divides by `R`, and counts it in a histogram
//! whose buckets are the curve's sizes. An LRU cache of `c` blocks hits exactly the accesses
//! whose reuse distance is below `c`, so the curve is a prefix sum of the histogram.
//!
//! Bounded: at most `max_samples` keys are tracked. When more are, the threshold is lowered
//! (by an eighth at a time) and the keys above it dropped; the histogram is rescaled by the
//! rate's change, so counts from before and after stay comparable. Memory is fixed at
//! construction: about 64 bytes per sample (8192 samples: 512 KiB). `access` allocates
//! nothing; compaction of the time axis (every ≥ 3 × `max_samples` sampled accesses) is
//! O(`max_samples` log `max_samples`) on preallocated scratch space.
//!
//! SHARDS-adj: spatial sampling's error comes mostly from whether a few very hot keys happen
//! to be sampled. When the caller says how many accesses there were in all (`offered`), the
//! difference between the sampled accesses expected at the rate (`R ×` offered) and those
//! seen is added to (or taken from) the smallest distances, as the paper's correction does.
//! Measured (12 Zipf traces each, 6000 keys, rate 0.128, 1024 samples; mean absolute error
//! of the curve against exact LRU): skew 0.6 0.016 → 0.018, 0.9 0.041 → 0.016, 1.2 0.050 →
//! 0.006.
//!
//! The curve is of LRU. The lender's S3-FIFO misses less than LRU on scans and loops; the
//! curve is then pessimistic for those tenants, which errs towards giving them memory.

/// Points of a curve: sizes `k × capacity / (CURVE_POINTS - 1)` for `k = 0..CURVE_POINTS`.
pub const CURVE_POINTS: usize = 129;
const BUCKETS: usize = CURVE_POINTS - 1;
/// Hashes are sampled on their top 24 bits: `R = threshold / 2^24`.
const SAMPLE_BITS: u32 = 24;
const SAMPLE_SPACE: u64 = 1 << SAMPLE_BITS;
/// Fewest (decayed) sampled accesses for a curve to count as measured.
pub const MIN_CURVE_ACCESSES: f64 = 64.0;
/// A tenant whose sampled reuses (at any distance) are under this share of its sampled
/// accesses gets no SHARDS-adj correction.
pub const NO_REUSE_SHARE: f64 = 0.01;

/// A miss-ratio curve at [`CURVE_POINTS`] evenly spaced sizes from 0 to the capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Curve {
    /// Whether it was measured (false: not enough accesses yet; every ratio is 1).
    pub valid: bool,
    /// Blocks between two points.
    pub unit_blocks: f64,
    /// Miss ratio at `k × unit_blocks`; non-increasing, `miss_ratio[0] == 1`.
    pub miss_ratio: [f32; CURVE_POINTS],
}

impl Default for Curve {
    fn default() -> Self {
        Curve { valid: false, unit_blocks: 1.0, miss_ratio: [1.0; CURVE_POINTS] }
    }
}

impl Curve {
    /// A curve from a function of the size in blocks (tests and the bench's reference).
    pub fn from_fn(capacity: u64, f: impl Fn(f64) -> f64) -> Curve {
        let unit_blocks = capacity.max(1) as f64 / BUCKETS as f64;
        let mut miss_ratio = [1.0; CURVE_POINTS];
        for (k, m) in miss_ratio.iter_mut().enumerate() {
            *m = f(k as f64 * unit_blocks).clamp(0.0, 1.0) as f32;
        }
        Curve { valid: true, unit_blocks, miss_ratio }
    }

    /// The miss ratio of an LRU cache of `blocks`, interpolated between points (1 beyond the
    /// last point's size is never reached: sizes past the capacity read the last point).
    pub fn miss_ratio_at(&self, blocks: f64) -> f64 {
        let x = (blocks / self.unit_blocks).max(0.0);
        let k = x.floor() as usize;
        if k >= BUCKETS {
            return f64::from(self.miss_ratio[BUCKETS]);
        }
        let f = x - k as f64;
        f64::from(self.miss_ratio[k]) * (1.0 - f) + f64::from(self.miss_ratio[k + 1]) * f
    }

    pub fn hit_ratio_at(&self, blocks: f64) -> f64 {
        1.0 - self.miss_ratio_at(blocks)
    }
}

#[derive(Clone, Copy, Default)]
struct Entry {
    /// The sampled key's mixed hash (never 0: 0 marks an empty entry).
    key: u64,
    /// Time of its last access (1..=times).
    time: u32,
}

/// The estimator of one tenant's curve. See the module docs.
pub struct ShardsMrc {
    unit_blocks: f64,
    max_samples: usize,
    threshold: u64,
    /// Open addressing, linear probing, at most half full; keys only leave by rebuilds.
    table: Box<[Entry]>,
    len: usize,
    /// Fenwick tree over times 1..=times: 1 at the last access time of each tracked key.
    tree: Box<[u32]>,
    now: u32,
    scratch: Vec<Entry>,
    /// Sampled accesses by scaled reuse distance, one bucket per curve interval, then those
    /// beyond the capacity; cold accesses (first seen) apart.
    hist: [f64; BUCKETS + 1],
    cold: f64,
    total: f64,
    /// Sampled accesses expected from what `offered` reported (0: no report, no correction).
    expected: f64,
}

impl ShardsMrc {
    /// An estimator for a lender of `capacity` blocks, tracking at most `max_samples` keys.
    /// The first sampling rate, `R = min(1, max_samples / (2 × capacity))`, fits the keys of
    /// a working set of twice the capacity in the sample set; it is lowered as more turn up.
    pub fn new(capacity: u64, max_samples: usize) -> ShardsMrc {
        let max_samples = max_samples.clamp(16, 1 << 24);
        let slots = (2 * max_samples + 2).next_power_of_two();
        let times = 4 * max_samples;
        let rate = (max_samples as f64 / (2.0 * capacity.max(1) as f64)).min(1.0);
        ShardsMrc {
            unit_blocks: capacity.max(1) as f64 / BUCKETS as f64,
            max_samples,
            threshold: ((SAMPLE_SPACE as f64 * rate) as u64).max(1),
            table: vec![Entry::default(); slots].into_boxed_slice(),
            len: 0,
            tree: vec![0; times + 1].into_boxed_slice(),
            now: 0,
            scratch: Vec::with_capacity(max_samples + 1),
            hist: [0.0; BUCKETS + 1],
            cold: 0.0,
            total: 0.0,
            expected: 0.0,
        }
    }

    /// Heap bytes held (fixed at construction).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.table)
            + std::mem::size_of_val(&*self.tree)
            + self.scratch.capacity() * std::mem::size_of::<Entry>()
            + std::mem::size_of::<Self>()
    }

    /// The sampling rate now.
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / SAMPLE_SPACE as f64
    }

    /// Whether a key of this hash is sampled: the cheap test callers make before taking a
    /// lock for [`access`](Self::access).
    #[inline]
    pub fn is_sampled(threshold: u64, hash: u64) -> bool {
        mix(hash) >> (64 - SAMPLE_BITS) < threshold
    }

    /// The threshold for [`is_sampled`](Self::is_sampled).
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// One GET of the key whose hash is `hash` (any well-mixed 64-bit hash of the key).
    /// Returns whether it was sampled. Never allocates.
    pub fn access(&mut self, hash: u64) -> bool {
        let h = mix(hash);
        if h >> (64 - SAMPLE_BITS) >= self.threshold {
            return false;
        }
        let key = h.max(1);
        if self.now as usize + 1 >= self.tree.len() {
            self.compact();
        }
        self.total += 1.0;
        let (idx, found) = self.find(key);
        if found {
            let last = self.table[idx].time;
            let distinct = self.prefix(self.now) - self.prefix(last);
            let scaled = f64::from(distinct) / self.rate();
            let bucket = ((scaled / self.unit_blocks) as usize).min(BUCKETS);
            self.hist[bucket] += 1.0;
            self.add(last, -1);
        } else {
            self.cold += 1.0;
            self.table[idx].key = key;
            self.len += 1;
        }
        self.now += 1;
        self.table[idx].time = self.now;
        self.add(self.now, 1);
        while self.len > self.max_samples {
            self.lower_threshold();
        }
        true
    }

    /// Multiply every count by `factor` (in 0..=1): older accesses weigh less, so the curve
    /// follows a tenant whose behaviour changes.
    pub fn decay(&mut self, factor: f64) {
        for c in &mut self.hist {
            *c *= factor;
        }
        self.cold *= factor;
        self.total *= factor;
        self.expected *= factor;
    }

    /// `accesses` more accesses happened in all, sampled or not (for the SHARDS-adj
    /// correction; call it with every access's count, at the current rate).
    pub fn offered(&mut self, accesses: u64) {
        self.expected += accesses as f64 * self.rate();
    }

    /// Sampled accesses counted (after decay).
    pub fn accesses(&self) -> f64 {
        self.total
    }

    /// The curve of what was seen; `valid` once enough accesses are counted.
    pub fn curve(&self) -> Curve {
        let mut c =
            Curve { valid: self.total >= MIN_CURVE_ACCESSES, unit_blocks: self.unit_blocks, ..Curve::default() };
        // SHARDS-adj: the shortfall (or excess) of sampled accesses goes to the first bucket
        // — unless the tenant reuses (almost) nothing: the correction models hot keys the
        // sample missed, and a scan has none (its shortfall is sampling noise, and read as
        // hits it made a scan look worth memory).
        let reused: f64 = self.hist.iter().sum();
        let first = if self.expected > 0.0 && reused >= NO_REUSE_SHARE * self.total {
            (self.hist[0] + self.expected - self.total).max(0.0)
        } else {
            self.hist[0]
        };
        let total = self.total + first - self.hist[0];
        if total <= 0.0 {
            return c;
        }
        let mut hits = 0.0;
        for k in 1..CURVE_POINTS {
            hits += if k == 1 { first } else { self.hist[k - 1] };
            c.miss_ratio[k] = (1.0 - hits / total).clamp(0.0, 1.0) as f32;
        }
        c
    }

    /// The entry of `key`, or the empty one where it goes.
    fn find(&self, key: u64) -> (usize, bool) {
        let mask = self.table.len() - 1;
        let mut i = (key as usize) & mask;
        loop {
            let e = self.table[i].key;
            if e == key {
                return (i, true);
            }
            if e == 0 {
                return (i, false);
            }
            i = (i + 1) & mask;
        }
    }

    fn prefix(&self, mut t: u32) -> u32 {
        let mut sum = 0;
        while t > 0 {
            sum += self.tree[t as usize];
            t &= t - 1;
        }
        sum
    }

    fn add(&mut self, t: u32, delta: i32) {
        let mut i = t as usize;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Renumber the tracked keys' times `1..=len` in the same order, so time never runs out.
    fn compact(&mut self) {
        self.scratch.clear();
        self.scratch.extend(self.table.iter().filter(|e| e.key != 0).copied());
        self.scratch.sort_unstable_by_key(|e| e.time);
        self.tree.fill(0);
        for (rank, e) in self.scratch.iter_mut().enumerate() {
            e.time = rank as u32 + 1;
        }
        self.rebuild();
        self.now = self.len as u32;
    }

    /// Lower the threshold by an eighth and drop the keys above it; rescale the counts.
    fn lower_threshold(&mut self) {
        let old = self.threshold;
        self.threshold = (old - old / 8).min(old - 1).max(1);
        let factor = self.threshold as f64 / old as f64;
        self.decay(factor);
        let threshold = self.threshold;
        self.scratch.clear();
        self.scratch
            .extend(self.table.iter().filter(|e| e.key != 0 && e.key >> (64 - SAMPLE_BITS) < threshold).copied());
        self.tree.fill(0);
        self.rebuild();
        if threshold == 1 && self.len > self.max_samples {
            // Cannot happen with a mixed hash (2^40 keys share the lowest bucket), but never
            // loop forever: forget everything.
            self.table.fill(Entry::default());
            self.tree.fill(0);
            self.len = 0;
        }
    }

    /// Refill the table and tree from `scratch` (the tree already zeroed).
    fn rebuild(&mut self) {
        self.table.fill(Entry::default());
        self.len = 0;
        // Taken out and put back (no allocation) so that `find` and `add` may borrow self.
        let scratch = std::mem::take(&mut self.scratch);
        for &e in &scratch {
            let (idx, _) = self.find(e.key);
            self.table[idx] = e;
            self.len += 1;
            self.add(e.time, 1);
        }
        self.scratch = scratch;
    }
}

/// A 64-bit finalizer (splitmix64), so that sampling does not depend on which bits of the
/// caller's hash are good.
#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Exact LRU miss ratios at `sizes` for a trace of keys (the test oracle; quadratic).
#[cfg(test)]
pub(crate) fn exact_lru(trace: &[u64], sizes: &[u64]) -> Vec<f64> {
    let mut stack: Vec<u64> = Vec::new(); // most recent last
    let mut dist: Vec<Option<usize>> = Vec::with_capacity(trace.len());
    for &k in trace {
        match stack.iter().rposition(|&x| x == k) {
            Some(p) => {
                dist.push(Some(stack.len() - 1 - p));
                stack.remove(p);
            }
            None => dist.push(None),
        }
        stack.push(k);
    }
    sizes
        .iter()
        .map(|&c| {
            let hits = dist.iter().filter(|d| d.is_some_and(|d| (d as u64) < c)).count();
            1.0 - hits as f64 / trace.len().max(1) as f64
        })
        .collect()
}
