//! Where a read that missed the page cache is served from: the lenders or the disk.
//!
//! Paper 000's rule: a read of `n` or more blocks is the readahead of a sequential stream and
//! goes to the disk, whose sequential rate beats a 1 Gbit link; a smaller read (a random or
//! single-block read) goes to the lenders when they hold the block. n = 32 blocks (128 KiB,
//! the kernel's readahead maximum of the time). The paper named a dynamic n as future work:
//! [`Adaptive`] decides per read from measured costs instead. Both are pure: the engine
//! feeds measurements in and asks for a route.

/// Where to serve a read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Look in the lenders first (a miss there falls back to the disk).
    Remote,
    /// Straight to the disk.
    Disk,
}

/// Recognises a sequential stream in the reads of one open file.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stream {
    /// Where the next read would start if the stream continues.
    next: u64,
    /// Bytes read back to back so far, this read included.
    run_bytes: u64,
}

impl Stream {
    /// Record a read and return the length of the sequential run it belongs to, in bytes
    /// (its own length if it does not continue the previous read).
    pub fn observe(&mut self, offset: u64, len: u64) -> u64 {
        self.run_bytes =
            if offset == self.next && self.run_bytes > 0 { self.run_bytes.saturating_add(len) } else { len };
        self.next = offset.saturating_add(len);
        self.run_bytes
    }
}

/// Paper 000's fixed threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threshold {
    pub blocks: u32,
    pub block_bytes: u32,
}

impl Threshold {
    /// n = 32 blocks of 4 KiB.
    pub const PAPER: Threshold = Threshold { blocks: 32, block_bytes: 4096 };

    pub fn route(&self, len: u64) -> Route {
        if len >= self.blocks as u64 * self.block_bytes as u64 {
            Route::Disk
        } else {
            Route::Remote
        }
    }
}

/// An exponentially weighted moving average.
#[derive(Clone, Copy, Debug)]
pub struct Ewma {
    value: f64,
    weight: f64,
    seeded: bool,
}

impl Ewma {
    /// `weight` of each new sample, in (0, 1].
    pub fn new(initial: f64, weight: f64) -> Ewma {
        assert!(weight > 0.0 && weight <= 1.0);
        Ewma { value: initial, weight, seeded: false }
    }
    pub fn add(&mut self, sample: f64) {
        if !sample.is_finite() || sample < 0.0 {
            return;
        }
        self.value = if self.seeded { self.value + self.weight * (sample - self.value) } else { sample };
        self.seeded = true;
    }
    pub fn get(&self) -> f64 {
        self.value
    }

    /// Add `sample` with the weight `weight` instead of the average's own (for samples that
    /// must move it faster).
    pub fn add_with(&mut self, sample: f64, weight: f64) {
        if !sample.is_finite() || sample < 0.0 || !(weight > 0.0 && weight <= 1.0) {
            return;
        }
        self.value = if self.seeded { self.value + weight * (sample - self.value) } else { sample };
        self.seeded = true;
    }
}

/// A lender round trip this many times the current estimate is a lender in trouble (hung,
/// overloaded, a link that drops): it moves the estimate by [`SPIKE_WEIGHT`] instead of a
/// tenth, so that reads leave a failing lender after one such fetch. The disk is the truth:
/// quick to leave the lenders, slow to come back.
pub const SPIKE_FACTOR: f64 = 10.0;
/// See [`SPIKE_FACTOR`].
pub const SPIKE_WEIGHT: f64 = 0.5;

/// Decides per read from measured costs: a read goes to the lenders when its expected time
/// there is lower than on the disk.
///
/// What a read of a given size costs is measured directly: a moving average of the time per
/// *size class* (4 KiB, 8 KiB, … 1 MiB, by powers of two), for the disk (random and
/// sequential reads apart) and for the lenders. A class with fewer than
/// [`CLASS_MIN_SAMPLES`] samples is estimated from a model instead — a fixed access time
/// plus bytes over a rate, each a moving average of the same samples:
///
/// - disk: access time of a non-sequential read, and throughput of sequential reads (a read
///   that continues a stream pays no access time);
/// - lenders: round-trip time of a one-block fetch, and throughput of batched fetches.
///
/// Measured classes come first because a rate-limited disk (a cloud volume's IOPS cap, a
/// blkio throttle) is not access plus bytes over a rate: a 16 KiB read costs what a 4 KiB
/// one does until the byte cap binds, and readahead that happens to follow a random read
/// looks like a slow "stream". The model only fills the gaps.
///
/// The engine feeds every timed disk read to [`Adaptive::observe_disk`] and every timed fetch
/// to [`Adaptive::observe_remote`]. Each sample moves its average by a tenth of the
/// difference, a lender spike (see [`SPIKE_FACTOR`]) by half.
#[derive(Clone, Copy, Debug)]
pub struct Adaptive {
    pub disk_access_us: Ewma,
    pub disk_bytes_per_us: Ewma,
    pub remote_access_us: Ewma,
    pub remote_bytes_per_us: Ewma,
    /// Per size class: disk reads, random (`[0]`) and sequential (`[1]`), and fetches.
    disk_class: [[Class; SIZE_CLASSES]; 2],
    remote_class: [Class; SIZE_CLASSES],
}

/// Size classes: 4 KiB << i for i in 0..SIZE_CLASSES (4 KiB … 1 MiB).
pub const SIZE_CLASSES: usize = 9;
/// A class's own average is used once it has this many samples.
pub const CLASS_MIN_SAMPLES: u32 = 8;

/// The measured time of reads of one size class.
#[derive(Clone, Copy, Debug)]
struct Class {
    us: Ewma,
    samples: u32,
}

impl Class {
    const EMPTY: Class = Class { us: Ewma { value: 0.0, weight: 0.1, seeded: false }, samples: 0 };

    fn get(&self) -> Option<f64> {
        (self.samples >= CLASS_MIN_SAMPLES).then(|| self.us.get())
    }

    fn add(&mut self, us: f64, spiky: bool) {
        if !us.is_finite() || us < 0.0 {
            return;
        }
        if spiky && self.us.seeded && us > SPIKE_FACTOR * self.us.get() {
            self.us.add_with(us, SPIKE_WEIGHT);
        } else {
            self.us.add(us);
        }
        self.samples = self.samples.saturating_add(1);
    }
}

/// One size class's measurements: (mean µs, samples) per side, `None` if never measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassEstimate {
    pub bytes: u64,
    pub disk_random: Option<(f64, u32)>,
    pub disk_sequential: Option<(f64, u32)>,
    pub remote: Option<(f64, u32)>,
}

/// The size class of a read of `len` bytes (`len > 0`).
fn class_of(len: u64) -> usize {
    let blocks = len.div_ceil(4096).max(1);
    (blocks.next_power_of_two().trailing_zeros() as usize).min(SIZE_CLASSES - 1)
}

impl Adaptive {
    /// Start from the paper's environment: a SATA disk with 8 ms access and 120 MB/s
    /// sequential, a 1 Gbit link giving 100 MB/s with 100 µs round trips. The first
    /// measurements replace these.
    pub fn new() -> Adaptive {
        Adaptive {
            disk_access_us: Ewma::new(8000.0, 0.1),
            disk_bytes_per_us: Ewma::new(120.0, 0.1),
            remote_access_us: Ewma::new(100.0, 0.1),
            remote_bytes_per_us: Ewma::new(100.0, 0.1),
            disk_class: [[Class::EMPTY; SIZE_CLASSES]; 2],
            remote_class: [Class::EMPTY; SIZE_CLASSES],
        }
    }

    /// Expected microseconds to read `len` bytes from the disk: the measured time of its
    /// size class, or the model's.
    pub fn disk_us(&self, len: u64, sequential: bool) -> f64 {
        self.disk_class[sequential as usize][class_of(len)].get().unwrap_or_else(|| self.disk_model_us(len, sequential))
    }

    /// Expected microseconds to fetch `len` bytes from the lenders: the measured time of its
    /// size class, or the model's.
    pub fn remote_us(&self, len: u64) -> f64 {
        self.remote_class[class_of(len)].get().unwrap_or_else(|| self.remote_model_us(len))
    }

    /// The measured time of fetches of `len` bytes' size class, `None` until it has
    /// [`CLASS_MIN_SAMPLES`] samples (no model).
    pub fn remote_class_us(&self, len: u64) -> Option<f64> {
        self.remote_class[class_of(len)].get()
    }

    /// The measured classes: for each size (bytes), the mean µs of random and of sequential
    /// disk reads and of fetches, each with its number of samples.
    pub fn classes(&self) -> Vec<ClassEstimate> {
        (0..SIZE_CLASSES)
            .map(|i| {
                let c = |c: &Class| (c.samples > 0).then(|| (c.us.get(), c.samples));
                ClassEstimate {
                    bytes: 4096 << i,
                    disk_random: c(&self.disk_class[0][i]),
                    disk_sequential: c(&self.disk_class[1][i]),
                    remote: c(&self.remote_class[i]),
                }
            })
            .filter(|e| e.disk_random.is_some() || e.disk_sequential.is_some() || e.remote.is_some())
            .collect()
    }

    /// The model's microseconds to read `len` bytes from the disk.
    pub fn disk_model_us(&self, len: u64, sequential: bool) -> f64 {
        let access = if sequential { 0.0 } else { self.disk_access_us.get() };
        access + len as f64 / self.disk_bytes_per_us.get().max(1e-3)
    }

    /// The model's microseconds to fetch `len` bytes from the lenders.
    pub fn remote_model_us(&self, len: u64) -> f64 {
        self.remote_access_us.get() + len as f64 / self.remote_bytes_per_us.get().max(1e-3)
    }

    /// Where a read of `len` bytes goes: wherever it is expected to finish sooner (the disk
    /// on a tie). `sequential`: it continues a stream, so the disk pays no access time.
    pub fn route(&self, len: u64, sequential: bool) -> Route {
        if self.remote_us(len) < self.disk_us(len, sequential) {
            Route::Remote
        } else {
            Route::Disk
        }
    }

    /// A disk read of `len` bytes took `us` microseconds. A sequential read (one that
    /// continues a stream) pays no access time, so it measures the throughput; any other read
    /// measures the access time: what it took beyond moving its bytes at the current rate.
    pub fn observe_disk(&mut self, len: u64, sequential: bool, us: f64) {
        if len == 0 || !us.is_finite() || us < 0.0 {
            return;
        }
        self.disk_class[sequential as usize][class_of(len)].add(us, false);
        if sequential {
            self.disk_bytes_per_us.add(len as f64 / us.max(MIN_SAMPLE_US));
        } else {
            let transfer = len as f64 / self.disk_bytes_per_us.get().max(1e-3);
            self.disk_access_us.add((us - transfer).max(0.0));
        }
    }

    /// A fetch of `len` bytes from the lenders took `us` microseconds (a fetch that gave up
    /// at its timeout counts with the time it waited: a hung lender is a slow lender). Small
    /// fetches (up to [`ACCESS_SAMPLE_MAX_BYTES`]) measure the round trip; larger ones the
    /// throughput beyond it.
    pub fn observe_remote(&mut self, len: u64, us: f64) {
        if len == 0 || !us.is_finite() || us < 0.0 {
            return;
        }
        self.remote_class[class_of(len)].add(us, true);
        if len <= ACCESS_SAMPLE_MAX_BYTES {
            let transfer = len as f64 / self.remote_bytes_per_us.get().max(1e-3);
            let sample = (us - transfer).max(0.0);
            if sample > SPIKE_FACTOR * self.remote_access_us.get() {
                self.remote_access_us.add_with(sample, SPIKE_WEIGHT);
            } else {
                self.remote_access_us.add(sample);
            }
        } else {
            // What is left after the round trip moved the bytes; at least a quarter of the
            // whole, so that a noisy round-trip estimate cannot make the rate explode.
            let transfer = (us - self.remote_access_us.get()).max(us / 4.0).max(MIN_SAMPLE_US);
            self.remote_bytes_per_us.add(len as f64 / transfer);
        }
    }
}

/// Fetches of at most this many bytes measure the lenders' round trip, larger ones their
/// throughput (two blocks: a fetch that small is all round trip on any link).
pub const ACCESS_SAMPLE_MAX_BYTES: u64 = 8192;
/// Shortest duration a throughput sample is divided by (clock granularity).
const MIN_SAMPLE_US: f64 = 1.0;

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_recognised() {
        let mut s = Stream::default();
        assert_eq!(s.observe(0, 4096), 4096);
        assert_eq!(s.observe(4096, 4096), 8192);
        assert_eq!(s.observe(8192, 65536), 73728);
        assert_eq!(s.observe(0, 4096), 4096, "a jump starts a new run");
        assert_eq!(s.observe(1 << 20, 4096), 4096);
    }

    #[test]
    fn paper_threshold_is_32_blocks() {
        let t = Threshold::PAPER;
        assert_eq!(t.route(4096), Route::Remote);
        assert_eq!(t.route(31 * 4096), Route::Remote);
        assert_eq!(t.route(32 * 4096), Route::Disk);
    }

    #[test]
    fn adaptive_follows_measurements() {
        let mut a = Adaptive::new();
        // Paper-like costs: random 4 KiB reads go remote, a sequential 1 MiB stream to disk.
        assert_eq!(a.route(4096, false), Route::Remote);
        assert_eq!(a.route(1 << 20, true), Route::Disk);
        // A fast local disk (20 µs access, 1.5 GB/s) beats a slow link for everything.
        for _ in 0..50 {
            a.disk_access_us.add(20.0);
            a.disk_bytes_per_us.add(1500.0);
            a.remote_access_us.add(300.0);
        }
        assert_eq!(a.route(4096, false), Route::Disk);
        // A throttled disk (1 ms access) and a 10 Gbit link: even large random reads go remote.
        for _ in 0..50 {
            a.disk_access_us.add(1000.0);
            a.disk_bytes_per_us.add(125.0);
            a.remote_access_us.add(60.0);
            a.remote_bytes_per_us.add(1100.0);
        }
        assert_eq!(a.route(256 << 10, false), Route::Remote);
        assert_eq!(a.route(4 << 20, true), Route::Remote, "10 Gbit beats a 125 MB/s disk even sequentially");
    }

    #[test]
    fn measurements_move_the_estimates() {
        let mut a = Adaptive::new();
        // One sequential 1 MiB disk read in 2 ms: 524 bytes/µs.
        a.observe_disk(1 << 20, true, 2000.0);
        assert!((a.disk_bytes_per_us.get() - 524.288).abs() < 1e-6);
        // A random 4 KiB read in 100 µs: access is what is left after the transfer.
        a.observe_disk(4096, false, 100.0);
        assert!((a.disk_access_us.get() - (100.0 - 4096.0 / 524.288)).abs() < 1e-6);
        // A one-block fetch in 250 µs: round trip beyond 4 KiB at the prior 100 bytes/µs.
        a.observe_remote(4096, 250.0);
        assert!((a.remote_access_us.get() - (250.0 - 40.96)).abs() < 1e-6);
        // A 256 KiB fetch in 1209.04 µs: 1000 µs of transfer after the round trip.
        a.observe_remote(256 << 10, 1000.0 + a.remote_access_us.get());
        assert!((a.remote_bytes_per_us.get() - 262.144).abs() < 1e-6);
        // Nonsense is ignored.
        let before = (a.disk_access_us.get(), a.remote_bytes_per_us.get());
        a.observe_disk(4096, false, f64::NAN);
        a.observe_remote(1 << 20, -5.0);
        a.observe_disk(0, true, 10.0);
        assert_eq!(before, (a.disk_access_us.get(), a.remote_bytes_per_us.get()));
    }

    #[test]
    fn a_hung_lender_sends_reads_to_the_disk_and_a_slow_disk_sends_them_remote() {
        // A fast disk (200 µs) against lenders that time out at 50 ms.
        let mut a = Adaptive::new();
        a.observe_disk(4096, false, 200.0);
        assert_eq!(a.route(4096, false), Route::Remote, "the prior lender is still faster");
        a.observe_remote(4096, 50_000.0);
        assert_eq!(a.route(4096, false), Route::Disk);
        assert!(a.remote_access_us.get() > 20_000.0, "one timed-out fetch moves the estimate by half");
        // A disk throttled to 20 ms per access against a healthy lender (300 µs): reads of
        // 192 KiB — past paper 000's n — still go remote.
        let mut a = Adaptive::new();
        a.observe_disk(192 << 10, false, 20_000.0);
        a.observe_remote(4096, 300.0);
        assert_eq!(Threshold::PAPER.route(192 << 10), Route::Disk);
        assert_eq!(a.route(192 << 10, false), Route::Remote);
    }

    #[test]
    fn size_classes_cover_4k_to_1m() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(4096), 0);
        assert_eq!(class_of(4097), 1);
        assert_eq!(class_of(8192), 1);
        assert_eq!(class_of(12288), 2);
        assert_eq!(class_of(1 << 20), 8);
        assert_eq!(class_of(64 << 20), 8);
    }

    #[test]
    fn a_rate_limited_disk_is_judged_by_what_its_reads_took() {
        // An IOPS-capped disk: 4 KiB and 16 KiB random reads both take 330 µs, sequential
        // 16 KiB readahead too. The additive model would call that a 30 MB/s stream and an
        // access time of almost nothing; the measured classes say what each read costs.
        let mut a = Adaptive::new();
        for _ in 0..CLASS_MIN_SAMPLES {
            a.observe_disk(4096, false, 330.0);
            a.observe_disk(16384, false, 330.0);
            a.observe_disk(16384, true, 330.0);
            a.observe_remote(4096, 110.0);
        }
        assert!((a.disk_us(4096, false) - 330.0).abs() < 1e-6);
        assert!((a.disk_us(16384, false) - 330.0).abs() < 1e-6);
        assert!((a.disk_us(16384, true) - 330.0).abs() < 1e-6);
        assert!((a.remote_us(4096) - 110.0).abs() < 1e-6);
        assert_eq!(a.route(4096, false), Route::Remote);
        // An unmeasured class falls back to the model.
        assert_eq!(a.disk_us(1 << 20, true), a.disk_model_us(1 << 20, true));
        // A lender spike moves its class by half.
        a.observe_remote(4096, 50_000.0);
        assert!(a.remote_us(4096) > 20_000.0);
        assert_eq!(a.route(4096, false), Route::Disk);
    }

    #[test]
    fn ewma_ignores_nonsense() {
        let mut e = Ewma::new(5.0, 0.5);
        e.add(f64::NAN);
        e.add(-1.0);
        assert_eq!(e.get(), 5.0);
        e.add(10.0);
        assert_eq!(e.get(), 10.0, "the first sample replaces the prior");
        e.add(20.0);
        assert_eq!(e.get(), 15.0);
    }
}
