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
}

/// Decides per read from measured costs: a read goes to the lenders when its expected time
/// there is lower than on the disk. Costs are a fixed access time plus bytes over a rate,
/// each tracked as a moving average of what the engine measured:
///
/// - disk: access time of a non-sequential read, and throughput of sequential reads (a read
///   that continues a stream pays no access time);
/// - lenders: round-trip time of a one-block fetch, and throughput of batched fetches.
#[derive(Clone, Copy, Debug)]
pub struct Adaptive {
    pub disk_access_us: Ewma,
    pub disk_bytes_per_us: Ewma,
    pub remote_access_us: Ewma,
    pub remote_bytes_per_us: Ewma,
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
        }
    }

    /// Expected microseconds to read `len` bytes from the disk.
    pub fn disk_us(&self, len: u64, sequential: bool) -> f64 {
        let access = if sequential { 0.0 } else { self.disk_access_us.get() };
        access + len as f64 / self.disk_bytes_per_us.get().max(1e-3)
    }

    /// Expected microseconds to fetch `len` bytes from the lenders.
    pub fn remote_us(&self, len: u64) -> f64 {
        self.remote_access_us.get() + len as f64 / self.remote_bytes_per_us.get().max(1e-3)
    }

    pub fn route(&self, len: u64, sequential: bool) -> Route {
        if self.remote_us(len) < self.disk_us(len, sequential) {
            Route::Remote
        } else {
            Route::Disk
        }
    }
}

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
