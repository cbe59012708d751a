//! [`Ranges`]: the blocks of one file that writes hold, so that two writes sharing a block are
//! ordered (as a kernel's page lock orders a read-modify-write) while writes to other blocks
//! of the file — and every other file — proceed together.
//!
//! It replaced 256 stripe locks hashed by file and block (session 32): a 1 MiB write spans 256
//! blocks and so took every stripe, which made eight streams to eight files one at a time —
//! including while the kernel throttled one of them on the backing file's dirty pages
//! (BENCHMARKS.md, "Session 32").

use parking_lot::{Condvar, Mutex};

/// Block ranges held by writes in flight (a handful at a time: one per concurrent writer).
#[derive(Default)]
pub(crate) struct Ranges {
    held: Mutex<Vec<(u64, u64)>>,
    released: Condvar,
}

/// Blocks `first..=last` held until dropped.
pub(crate) struct Held<'a> {
    ranges: &'a Ranges,
    range: (u64, u64),
}

impl Ranges {
    /// Hold blocks `first..=last`, waiting while another write holds any of them.
    pub(crate) fn hold(&self, first: u64, last: u64) -> Held<'_> {
        debug_assert!(first <= last);
        let mut held = self.held.lock();
        while held.iter().any(|&(a, b)| a <= last && first <= b) {
            self.released.wait(&mut held);
        }
        held.push((first, last));
        Held { ranges: self, range: (first, last) }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut held = self.ranges.held.lock();
        if let Some(i) = held.iter().position(|&r| r == self.range) {
            held.swap_remove(i);
        }
        drop(held);
        self.ranges.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn overlapping_ranges_wait_and_disjoint_ones_do_not() {
        let r = Ranges::default();
        let a = r.hold(10, 20);
        // Disjoint: at once (the test would hang here otherwise).
        let b = r.hold(21, 300);
        let c = r.hold(0, 9);
        let got = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _d = r.hold(20, 21);
                got.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!got.load(Ordering::SeqCst), "a range sharing block 20 and 21 went ahead");
            drop(a);
            std::thread::sleep(Duration::from_millis(50));
            assert!(!got.load(Ordering::SeqCst), "block 21 is still held");
            drop(b);
        });
        assert!(got.load(Ordering::SeqCst));
        drop(c);
        assert!(r.held.lock().is_empty());
    }

    #[test]
    fn writes_of_one_block_are_ordered_under_contention() {
        let r = Ranges::default();
        let inside = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (r, inside) = (&r, &inside);
                s.spawn(move || {
                    for i in 0..200u64 {
                        // Every range covers block 100.
                        let _h = r.hold(100 - (i + t) % 3, 100 + (i * t) % 5);
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders of block 100 at once");
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
    }
}
