//! A budget of open descriptors, shared by whatever holds one per file it knows and can open
//! the file again (the mount's inode table, `farcache-fuse`'s `inode.rs`; the write-back
//! tier's write-back descriptors, `writeback`): where the process's limit is below what they
//! would hold (a container, a root without CAP_SYS_RESOURCE), each keeps at most its budget
//! and lets go of the least recently used idle ones past it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

/// The process's open-descriptor limit in force (RLIMIT_NOFILE's soft limit; 1024 if it
/// cannot be read).
pub fn limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    }
}

/// The share of `limit` one holder keeps by default: a quarter, from 64 to 65,536 (the inode
/// table and the tier a quarter each; open files and everything else the rest).
pub fn share_of(limit: u64) -> usize {
    usize::try_from(limit / 4).unwrap_or(usize::MAX).clamp(64, 65_536)
}

/// Descriptors held against a budget, a clock of their last uses, and the letting go.
pub struct DescriptorBudget {
    budget: usize,
    held: AtomicUsize,
    tick: AtomicU64,
    /// One thread lets go at a time.
    letting_go: Mutex<()>,
}

impl DescriptorBudget {
    pub fn new(budget: usize) -> DescriptorBudget {
        DescriptorBudget {
            budget: budget.max(1),
            held: AtomicUsize::new(0),
            tick: AtomicU64::new(0),
            letting_go: Mutex::new(()),
        }
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// A descriptor was opened (`true`) or closed against the budget.
    pub fn count(&self, opened: bool) {
        if opened {
            self.held.fetch_add(1, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The clock now: a use's time, for least recently used first.
    pub fn now(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed)
    }

    /// Past the budget: offer the holders `candidates` lists (with their last use) to
    /// `release`, least recently used first, until three quarters of the budget are held (so
    /// that the scans, which visit every holder, are rare). `release` lets go of one if it is
    /// idle (and counts it closed); another thread letting go meanwhile makes this a no-op.
    pub fn let_go<T>(&self, candidates: impl FnOnce() -> Vec<(u64, T)>, release: impl Fn(&T)) {
        if self.held() <= self.budget {
            return;
        }
        let Some(_one) = self.letting_go.try_lock() else { return };
        let target = self.budget - self.budget / 4;
        let mut idle = candidates();
        idle.sort_unstable_by_key(|(used, _)| *used);
        for (_, c) in &idle {
            if self.held() <= target {
                break;
            }
            release(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letting_go_starts_past_the_budget_and_takes_the_least_recently_used_first() {
        let b = DescriptorBudget::new(8);
        for _ in 0..8 {
            b.count(true);
        }
        let released = Mutex::new(Vec::new());
        let release = |i: &u32| {
            released.lock().push(*i);
            b.count(false);
        };
        b.let_go(|| (0..8u32).map(|i| (u64::from(8 - i), i)).collect(), release);
        assert!(released.lock().is_empty(), "within the budget: nothing let go of");
        b.count(true);
        b.let_go(|| (0..9u32).map(|i| (u64::from(9 - i), i)).collect(), release);
        assert_eq!(*released.lock(), vec![8, 7, 6], "the oldest, down to three quarters of 8");
        assert_eq!(b.held(), 6);
        assert_eq!(share_of(20_000), 5_000);
        assert_eq!(share_of(100), 64);
    }
}
