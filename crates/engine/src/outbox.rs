//! The outbox: stores (fills) and deletions (invalidations) on their way to the lenders,
//! coalesced so that the data path pays no wake-up, task or frame per block.
//!
//! Before it, every filled block was a task and a PUT frame of its own, and every write sent
//! a DEL frame of its own — as many runtime wake-ups as the fetches on the hit path, on a
//! two-vCPU machine where wake-ups are the cost (TESTBED.md: most of a loopback round trip
//! is vCPU wake-up). Now the data path only appends to a queue under a mutex held for a push;
//! the first entry of an empty queue wakes the flusher once, which waits [`FLUSH_WINDOW`]
//! for more to gather, then sends everything queued as one PUT and one DEL batch per lender.
//!
//! Bounds: at most `max_puts` blocks and `max_dels` keys are queued or in flight at once
//! (more are dropped and counted: the disk has every block, and a retired key can never be
//! read again, its lender evicts it in time); at most [`FLUSH_WINDOW`] between a block's
//! queueing and its batch's departure, whatever the load. Entries are never ordered
//! against each other: a fill's ticket (see `index.rs`) already voids a fill that a write
//! overtook, and a deletion only ever names keys no lookup can return.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::index::BlockKey;

/// How long the flusher lets entries gather after the first one arrives.
pub const FLUSH_WINDOW: Duration = Duration::from_millis(1);

/// A block to store, and what to run once its lender has it.
pub(crate) struct PendingPut {
    pub key: BlockKey,
    pub value: Bytes,
    pub done: Box<dyn FnOnce() + Send>,
    /// When it was queued (fill latency runs from here to the lender's answer).
    pub queued: Instant,
}

/// What one flush takes out of the outbox.
#[derive(Default)]
pub(crate) struct Batch {
    pub puts: Vec<PendingPut>,
    pub dels: Vec<BlockKey>,
}

/// The queues and their bounds. The flusher is `Remote`'s (it knows the lenders); the
/// outbox only queues, counts and wakes it.
pub(crate) struct Outbox {
    queued: Mutex<Batch>,
    wake: Notify,
    max_puts: usize,
    max_dels: usize,
    /// Blocks queued or in flight (released by [`Outbox::puts_sent`]).
    puts_out: AtomicUsize,
    /// Keys queued or in flight (released by [`Outbox::dels_sent`]).
    dels_out: AtomicUsize,
}

/// Reserve `n` of `max` on `c`; false (and nothing reserved) if that would pass `max`.
fn reserve(c: &AtomicUsize, n: usize, max: usize) -> bool {
    c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| (v + n <= max).then_some(v + n)).is_ok()
}

impl Outbox {
    pub fn new(max_puts: usize, max_dels: usize) -> Outbox {
        Outbox {
            queued: Mutex::new(Batch::default()),
            wake: Notify::new(),
            max_puts,
            max_dels,
            puts_out: AtomicUsize::new(0),
            dels_out: AtomicUsize::new(0),
        }
    }

    /// Queue a store; gives it back if `max_puts` blocks are already queued or in flight.
    pub fn put(&self, p: PendingPut) -> Result<(), PendingPut> {
        if !reserve(&self.puts_out, 1, self.max_puts) {
            return Err(p);
        }
        let mut q = self.queued.lock();
        let was_empty = q.puts.is_empty() && q.dels.is_empty();
        q.puts.push(p);
        drop(q);
        if was_empty {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Queue deletions; false (nothing queued) if they would pass `max_dels` keys queued or
    /// in flight.
    pub fn del(&self, keys: Vec<BlockKey>) -> bool {
        if keys.is_empty() {
            return true;
        }
        if !reserve(&self.dels_out, keys.len(), self.max_dels) {
            return false;
        }
        let mut q = self.queued.lock();
        let was_empty = q.puts.is_empty() && q.dels.is_empty();
        if q.dels.is_empty() {
            q.dels = keys;
        } else {
            q.dels.extend(keys);
        }
        drop(q);
        if was_empty {
            self.wake.notify_one();
        }
        true
    }

    /// Wait for the first entry, let more gather for [`FLUSH_WINDOW`], take them all.
    pub async fn next_batch(&self) -> Batch {
        loop {
            self.wake.notified().await;
            tokio::time::sleep(FLUSH_WINDOW).await;
            let b = std::mem::take(&mut *self.queued.lock());
            if !b.puts.is_empty() || !b.dels.is_empty() {
                return b;
            }
        }
    }

    /// `n` blocks of a batch are done (stored, failed or dropped).
    pub fn puts_sent(&self, n: usize) {
        self.puts_out.fetch_sub(n, Ordering::AcqRel);
    }

    /// `n` keys of a batch are done.
    pub fn dels_sent(&self, n: usize) {
        self.dels_out.fetch_sub(n, Ordering::AcqRel);
    }

    /// Blocks and keys queued or in flight now.
    #[cfg(test)]
    pub fn outstanding(&self) -> (usize, usize) {
        (self.puts_out.load(Ordering::Acquire), self.dels_out.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(block: u64) -> BlockKey {
        BlockKey { file: 7, block, version: 1 }
    }

    fn put(block: u64) -> PendingPut {
        PendingPut { key: key(block), value: Bytes::from_static(b"x"), done: Box::new(|| {}), queued: Instant::now() }
    }

    #[test]
    fn bounds_hold_until_batches_are_sent() {
        let o = Outbox::new(3, 5);
        assert!(o.put(put(1)).is_ok() && o.put(put(2)).is_ok() && o.put(put(3)).is_ok());
        assert!(o.put(put(4)).is_err(), "a fourth block passes max_puts");
        assert!(o.del(vec![key(1), key(2), key(3)]));
        assert!(!o.del(vec![key(4), key(5), key(6)]), "all or nothing past max_dels");
        assert!(o.del(vec![key(4), key(5)]));
        assert_eq!(o.outstanding(), (3, 5));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let b = rt.block_on(o.next_batch());
        assert_eq!(b.puts.iter().map(|p| p.key.block).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(b.dels.iter().map(|k| k.block).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        // Taken but not yet sent: still counted against the bounds.
        assert!(o.put(put(9)).is_err());
        o.puts_sent(3);
        o.dels_sent(5);
        assert_eq!(o.outstanding(), (0, 0));
        assert!(o.put(put(9)).is_ok());
    }

    #[test]
    fn one_wake_gathers_everything_queued() {
        let o = Outbox::new(1000, 1000);
        for b in 0..100 {
            assert!(o.put(put(b)).is_ok());
        }
        assert!(o.del(vec![key(1)]));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let b = rt.block_on(o.next_batch());
        assert_eq!((b.puts.len(), b.dels.len()), (100, 1), "one batch holds all that was queued");
        // Nothing queued now: the next batch waits for a new entry.
        let waited = rt.block_on(async { tokio::time::timeout(10 * FLUSH_WINDOW, o.next_batch()).await.is_err() });
        assert!(waited);
    }
}
