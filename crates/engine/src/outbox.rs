//! The outbox: stores (fills) and deletions (invalidations) on their way to the lenders,
//! coalesced so that the data path pays no wake-up, task or frame per block.
//!
//! Before it, every filled block was a task and a PUT frame of its own, and every write sent
//! a DEL frame of its own — as many runtime wake-ups as the fetches on the hit path, on a
//! two-vCPU machine where wake-ups are the cost (TESTBED.md: most of a loopback round trip
//! is vCPU wake-up). Now the data path only appends to a queue under a mutex held for a push;
//! the first entry of an empty queue wakes the flusher once, which waits [`FLUSH_WINDOW`]
//! for more to gather, then sends everything queued as one PUT and one DEL batch per lender.
//! Deletions wait longer, [`DEL_WINDOW`] (or until [`DEL_BATCH`] keys are queued): nothing
//! reads a retired key, so the only cost of the wait is lender memory held up to a tenth of a
//! second longer (at most [`DEL_BATCH`] keys), while a write-heavy load (TPC-B: three retired
//! keys per transaction) sent a DEL request, its answer and a task per lender every
//! millisecond — measured in BENCHMARKS.md ("Nothing gets slower", session 11); at 20 ms
//! the batches' wake-ups were still most of the remote runtime's CPU (session 52). Deletions
//! that are due leave at once when no block is queued: the flush window is for blocks.
//! *Seeds* (fills the routing makes only so that its probes find blocks to measure the lenders
//! on, `routing.rs`'s `SEED_EVERY`) wait like deletions, [`SEED_WINDOW`] or until
//! [`SEED_BATCH`] blocks are queued, and leave sooner with any batch of other blocks: nothing
//! reads a seed soon, and sent within the flush window, each seed of a disk faster than the
//! lenders was a batch of its own — a wake-up, a timer, a request and its answer on both ends
//! for one 16 KiB read in 64 (measured: the mount daemon's CPU 11% above the passthrough's in
//! a raw randread first pass, all of it the seeds'; BENCHMARKS.md, "Session 66").
//!
//! Bounds: at most `max_puts` blocks and `max_dels` keys are queued or in flight at once
//! (more are dropped and counted: the disk has every block, and a retired key can never be
//! read again, its lender evicts it in time). Fills are held to less while they form a
//! standing queue — one that has not emptied for [`STANDING_INTERVAL`], as CoDel tells a
//! standing queue from a burst: no fill left it within [`STANDING_TARGET`] of its queueing —
//! to what the lenders' links carry in [`FILL_HORIZON`], measured from the fills' own
//! requests ([`FillPace`], [`put_bound`]), never under [`MIN_PUT_BOUND`]. A link that cannot
//! keep up stores as many fills a second whatever waits behind it, so a longer queue only
//! holds more memory (charged to the application's cgroup) and makes each fill later: behind
//! 1 Gbit/s the fixed 8,192 blocks (32 MiB) waited 270 ms to leave and held 43–47 MiB more in
//! the daemon (BENCHMARKS.md, sessions 59–60). A queue that empties between bursts keeps all
//! of `max_puts`: a throttled disk answers a stream in 100 ms slices, and a 10 Gbit/s stream
//! held to its link's pace in 50 ms dropped 15–17% of its fills where 8,192 dropped none
//! (session 60). At most [`FLUSH_WINDOW`] between a block's
//! queueing and its batch's departure, and [`DEL_WINDOW`] for a deletion, whatever the
//! load. Entries are never ordered
//! against each other: a fill's ticket (see `index.rs`) already voids a fill that a write
//! overtook, and a deletion only ever names keys no lookup can return.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::index::BlockKey;

/// How long the flusher lets blocks gather after the first one arrives.
pub const FLUSH_WINDOW: Duration = Duration::from_millis(1);
/// The longest a deletion waits for others to share its request.
pub const DEL_WINDOW: Duration = Duration::from_millis(100);
/// Deletions queued that make a batch leave before [`DEL_WINDOW`] has passed.
pub const DEL_BATCH: usize = 512;
/// The longest a seed waits for other blocks to share its request.
pub const SEED_WINDOW: Duration = DEL_WINDOW;
/// Seeds queued that make a batch leave before [`SEED_WINDOW`] has passed (1 MiB).
pub const SEED_BATCH: usize = 256;
const _: () = assert!(SEED_BATCH > 0 && SEED_WINDOW.as_millis() >= FLUSH_WINDOW.as_millis());
const _: () = assert!(DEL_BATCH > 0 && DEL_WINDOW.as_millis() >= FLUSH_WINDOW.as_millis());
/// The fills queued or in flight may take the lenders' links at most this long to carry, at
/// the pace their requests were last measured.
pub const FILL_HORIZON: Duration = Duration::from_millis(50);
/// The least the fills' bound falls to, whatever the pace measured (2 MiB of fills): room for
/// a burst after a stall that a moving mean has not yet forgotten.
pub const MIN_PUT_BOUND: usize = 512;
/// How long the fills' queue must go without emptying to count as standing (re-decided every
/// interval).
pub const STANDING_INTERVAL: Duration = Duration::from_millis(200);
/// A fill whose request got its slot this soon after the fill was queued shows the queue
/// emptied: the flush window (1 ms) and a little scheduling.
pub const STANDING_TARGET: Duration = Duration::from_millis(5);
/// Requests that must get their slots in an interval for it to decide anything: with fewer
/// (a lender that stopped answering mid-burst, a trickle of fills) the queue keeps the state
/// it had. A link carrying fills takes dozens an interval even at 1 ms a request.
pub const STANDING_SAMPLES: u32 = 4;

/// The bound on fills queued or in flight: what `blocks_per_sec` carry in [`FILL_HORIZON`],
/// between [`MIN_PUT_BOUND`] and `max` (all of `max` while the pace is not measured).
pub fn put_bound(blocks_per_sec: Option<f64>, max: usize) -> usize {
    match blocks_per_sec {
        Some(r) if r.is_finite() && r >= 0.0 => {
            let carried = (r * FILL_HORIZON.as_secs_f64()).min(max as f64) as usize;
            carried.clamp(MIN_PUT_BOUND.min(max), max)
        }
        _ => max,
    }
}

/// One lender's pace of fills: the moving mean (weight 1/8) of the time a full PUT request
/// took per block, from its slot to its answer. Only full requests count: a small one's time
/// is the round trip, not what the link carries. A request's time is capped at `cap` (its
/// timeout), so one stalled request moves the mean, not the bound, for long.
#[derive(Debug, Default)]
pub(crate) struct FillPace {
    /// 0 while nothing was measured.
    ns_per_block: AtomicU64,
}

impl FillPace {
    pub fn record(&self, blocks: usize, took: Duration, cap: Duration) {
        if blocks == 0 {
            return;
        }
        let sample = (took.min(cap).as_nanos() as u64 / blocks as u64).max(1);
        let old = self.ns_per_block.load(Ordering::Relaxed);
        let new = if old == 0 { sample } else { old - old / 8 + sample / 8 };
        // Racing records may lose one sample: a mean, not a count.
        self.ns_per_block.store(new.max(1), Ordering::Relaxed);
    }

    /// Blocks a second it stores with `in_flight` requests at a time, if measured.
    pub fn blocks_per_sec(&self, in_flight: usize) -> Option<f64> {
        match self.ns_per_block.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(in_flight as f64 * 1e9 / ns as f64),
        }
    }
}

/// A block to store, and what to run once its lender has it.
pub(crate) struct PendingPut {
    pub key: BlockKey,
    pub value: Bytes,
    pub done: Box<dyn FnOnce() + Send>,
    /// When it was queued (fill latency runs from here to the lender's answer).
    pub queued: Instant,
    /// A seed: it may wait [`SEED_WINDOW`] for company.
    pub seed: bool,
}

/// When the newest fill of a request was queued, for the standing-queue watch
/// ([`Outbox::left_queue`]); `None` for a request of seeds alone, which wait by design and say
/// nothing of the queue.
pub(crate) fn newest_fill(request: &[PendingPut]) -> Option<Instant> {
    request.iter().filter(|p| !p.seed).map(|p| p.queued).max()
}

/// What one flush takes out of the outbox.
#[derive(Default)]
pub(crate) struct Batch {
    pub puts: Vec<PendingPut>,
    pub dels: Vec<BlockKey>,
}

/// The shortest wait of a fill in the queue this interval, and what the last interval showed.
struct QueueWatch {
    start: Instant,
    /// Requests that got their slots this interval, and the shortest wait among them.
    samples: u32,
    shortest: Option<Duration>,
    standing: bool,
    /// The lenders' pace last given to [`Outbox::pace`], blocks a second.
    pace: Option<f64>,
}

/// What waits in the outbox.
#[derive(Default)]
struct Queued {
    batch: Batch,
    /// When the oldest deletion queued arrived (tokio's clock: tests can pause it).
    dels_since: Option<tokio::time::Instant>,
    /// Seeds waiting for company, and when the oldest of them arrived.
    seeds: Vec<PendingPut>,
    seeds_since: Option<tokio::time::Instant>,
}

impl Queued {
    fn is_empty(&self) -> bool {
        self.batch.puts.is_empty() && self.batch.dels.is_empty() && self.seeds.is_empty()
    }

    /// Whether deletions or seeds wait on a clock (the flusher then sleeps until [`Self::due`]).
    fn deferred(&self) -> bool {
        self.dels_since.is_some() || self.seeds_since.is_some()
    }

    /// When the first of the deletions and seeds waiting is due.
    fn due(&self) -> Option<tokio::time::Instant> {
        let dels = self.dels_since.map(|t| t + DEL_WINDOW);
        let seeds = self.seeds_since.map(|t| t + SEED_WINDOW);
        dels.into_iter().chain(seeds).min()
    }

    /// Whether the deletions queued are due to leave now.
    fn dels_due(&self, now: tokio::time::Instant) -> bool {
        self.batch.dels.len() >= DEL_BATCH || self.dels_since.is_some_and(|t| now.duration_since(t) >= DEL_WINDOW)
    }

    /// Whether the seeds queued are due to leave now.
    fn seeds_due(&self, now: tokio::time::Instant) -> bool {
        self.seeds.len() >= SEED_BATCH || self.seeds_since.is_some_and(|t| now.duration_since(t) >= SEED_WINDOW)
    }
}

/// The queues and their bounds. The flusher is `Remote`'s (it knows the lenders); the
/// outbox only queues, counts and wakes it.
pub(crate) struct Outbox {
    queued: Mutex<Queued>,
    wake: Notify,
    max_puts: usize,
    /// The bound on fills now: `max_puts`, or while the queue stands [`put_bound`] of the
    /// links' pace.
    put_limit: AtomicUsize,
    watch: Mutex<QueueWatch>,
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
            queued: Mutex::new(Queued::default()),
            wake: Notify::new(),
            max_puts,
            put_limit: AtomicUsize::new(max_puts),
            watch: Mutex::new(QueueWatch {
                start: Instant::now(),
                samples: 0,
                shortest: None,
                standing: false,
                pace: None,
            }),
            max_dels,
            puts_out: AtomicUsize::new(0),
            dels_out: AtomicUsize::new(0),
        }
    }

    /// Queue a store; gives it back if the bound ([`Outbox::put_limit`]) of blocks are
    /// already queued or in flight.
    pub fn put(&self, p: PendingPut) -> Result<(), PendingPut> {
        if !reserve(&self.puts_out, 1, self.put_limit.load(Ordering::Relaxed)) {
            return Err(p);
        }
        let mut q = self.queued.lock();
        // The flusher sleeps while no block is queued (at most until queued deletions and
        // seeds are due): a seed wakes it only to set that clock, or with a full batch.
        let wake = if p.seed {
            let wake = !q.deferred() || q.seeds.len() + 1 == SEED_BATCH;
            q.seeds_since.get_or_insert_with(tokio::time::Instant::now);
            q.seeds.push(p);
            wake
        } else {
            let wake = q.batch.puts.is_empty();
            q.batch.puts.push(p);
            wake
        };
        drop(q);
        if wake {
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
        let (before, deferred) = (q.batch.dels.len(), q.deferred());
        if before == 0 {
            q.dels_since = Some(tokio::time::Instant::now());
            q.batch.dels = keys;
        } else {
            q.batch.dels.extend(keys);
        }
        // Wake the flusher for the first deletion (it then sleeps until they are due), unless
        // seeds already set that clock, and when a full batch has gathered.
        let wake = !deferred || (before < DEL_BATCH && q.batch.dels.len() >= DEL_BATCH);
        drop(q);
        if wake {
            self.wake.notify_one();
        }
        true
    }

    /// Wait for the first entry, let blocks gather for [`FLUSH_WINDOW`], take every block
    /// queued (seeds too) and the deletions if they are due (else they wait, at most
    /// [`DEL_WINDOW`]). Deletions and seeds due with no other block queued leave at once.
    pub async fn next_batch(&self) -> Batch {
        loop {
            let due = self.queued.lock().due();
            match due {
                Some(at) => {
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => self.wake.notified().await,
            }
            // Blocks gather for FLUSH_WINDOW after the first; deletions have had their window
            // (or make a full batch), so a wake with no block queued takes them at once: one
            // timer wake-up fewer per batch, and the first deletion's wake only arms the timer.
            if !self.queued.lock().batch.puts.is_empty() {
                tokio::time::sleep(FLUSH_WINDOW).await;
            }
            let mut q = self.queued.lock();
            if q.is_empty() {
                continue;
            }
            let now = tokio::time::Instant::now();
            let mut puts = std::mem::take(&mut q.batch.puts);
            // Seeds ride with other blocks at no cost, or leave once due.
            if !puts.is_empty() || q.seeds_due(now) {
                puts.append(&mut q.seeds);
                q.seeds_since = None;
            }
            let b = Batch {
                puts,
                dels: if q.dels_due(now) {
                    q.dels_since = None;
                    std::mem::take(&mut q.batch.dels)
                } else {
                    Vec::new()
                },
            };
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

    /// A request of fills got its slot `waited` after the newest of them was queued.
    pub fn left_queue(&self, waited: Duration) {
        self.left_queue_at(waited, Instant::now());
    }

    fn left_queue_at(&self, waited: Duration, now: Instant) {
        let mut w = self.watch.lock();
        self.watch_until(&mut w, now);
        w.samples += 1;
        w.shortest = Some(w.shortest.map_or(waited, |s| s.min(waited)));
    }

    /// The lenders' measured pace (`None`: unknown), for the bound while the fills' queue
    /// stands: what it carries in [`FILL_HORIZON`].
    pub fn pace(&self, blocks_per_sec: Option<f64>) {
        self.pace_at(blocks_per_sec, Instant::now());
    }

    fn pace_at(&self, blocks_per_sec: Option<f64>, now: Instant) {
        let mut w = self.watch.lock();
        w.pace = blocks_per_sec;
        self.watch_until(&mut w, now);
    }

    /// Close the watch's interval if it is over — the queue stood if no request got its slot
    /// within [`STANDING_TARGET`] of its newest fill, given [`STANDING_SAMPLES`] requests to
    /// judge by — and set the bound: [`put_bound`] of the pace while the queue stands, else
    /// `max_puts`. Blocks already queued stay; new ones wait for room.
    fn watch_until(&self, w: &mut QueueWatch, now: Instant) {
        if now.saturating_duration_since(w.start) >= STANDING_INTERVAL {
            if w.samples >= STANDING_SAMPLES {
                w.standing = w.shortest.is_some_and(|s| s > STANDING_TARGET);
            }
            (w.start, w.samples, w.shortest) = (now, 0, None);
        }
        let bound = if w.standing { put_bound(w.pace, self.max_puts) } else { self.max_puts };
        self.put_limit.store(bound, Ordering::Relaxed);
    }

    /// The bound on fills queued or in flight now.
    pub fn put_limit(&self) -> usize {
        self.put_limit.load(Ordering::Relaxed)
    }

    /// Blocks and keys queued or in flight now.
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
        PendingPut {
            key: key(block),
            value: Bytes::from_static(b"x"),
            done: Box::new(|| {}),
            queued: Instant::now(),
            seed: false,
        }
    }

    fn seed(block: u64) -> PendingPut {
        PendingPut { seed: true, ..put(block) }
    }

    /// Queue `p` on the paused clock (the outbox stamps seeds with tokio's clock).
    fn put_at(rt: &tokio::runtime::Runtime, o: &Outbox, p: PendingPut) -> bool {
        let _clock = rt.enter();
        o.put(p).is_ok()
    }

    /// A runtime whose clock stands still until everything waits (tokio's test clock): the
    /// windows are checked exactly, not against the machine's load.
    fn paused() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap()
    }

    /// The paused clock's time, and how far it moved since `t`.
    fn now(rt: &tokio::runtime::Runtime) -> tokio::time::Instant {
        rt.block_on(async { tokio::time::Instant::now() })
    }

    fn since(rt: &tokio::runtime::Runtime, t: tokio::time::Instant) -> Duration {
        rt.block_on(async { t.elapsed() })
    }

    /// Queue `keys` on the paused clock (the outbox stamps deletions with tokio's clock).
    fn del_at(rt: &tokio::runtime::Runtime, o: &Outbox, keys: Vec<BlockKey>) -> bool {
        let _clock = rt.enter();
        o.del(keys)
    }

    #[test]
    fn bounds_hold_until_batches_are_sent() {
        let o = Outbox::new(3, 5);
        let rt = paused();
        assert!(o.put(put(1)).is_ok() && o.put(put(2)).is_ok() && o.put(put(3)).is_ok());
        assert!(o.put(put(4)).is_err(), "a fourth block passes max_puts");
        assert!(del_at(&rt, &o, vec![key(1), key(2), key(3)]));
        assert!(!del_at(&rt, &o, vec![key(4), key(5), key(6)]), "all or nothing past max_dels");
        assert!(del_at(&rt, &o, vec![key(4), key(5)]));
        assert_eq!(o.outstanding(), (3, 5));
        let b = rt.block_on(o.next_batch());
        assert_eq!(b.puts.iter().map(|p| p.key.block).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(b.dels.is_empty(), "deletions wait for their own window");
        let b = rt.block_on(o.next_batch());
        assert_eq!(b.dels.iter().map(|k| k.block).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        // Taken but not yet sent: still counted against the bounds.
        assert!(o.put(put(9)).is_err());
        o.puts_sent(3);
        o.dels_sent(5);
        assert_eq!(o.outstanding(), (0, 0));
        assert!(o.put(put(9)).is_ok());
    }

    #[test]
    fn one_wake_gathers_every_block_queued() {
        let o = Outbox::new(1000, 1000);
        for b in 0..100 {
            assert!(o.put(put(b)).is_ok());
        }
        let rt = paused();
        let t = now(&rt);
        let b = rt.block_on(o.next_batch());
        assert_eq!((b.puts.len(), b.dels.len()), (100, 0), "one batch holds all that was queued");
        assert_eq!(since(&rt, t), FLUSH_WINDOW, "blocks leave after the flush window");
        // Nothing queued now: the next batch waits for a new entry.
        let waited = rt.block_on(async { tokio::time::timeout(10 * DEL_WINDOW, o.next_batch()).await.is_err() });
        assert!(waited);
    }

    #[test]
    fn deletions_leave_within_their_window_or_as_a_full_batch() {
        let o = Outbox::new(1000, 10 * DEL_BATCH);
        let rt = paused();
        // Alone, a deletion waits DEL_WINDOW, gathering what comes meanwhile.
        let t = now(&rt);
        assert!(del_at(&rt, &o, vec![key(1)]));
        let b = rt.block_on(async {
            tokio::time::sleep(DEL_WINDOW / 2).await;
            assert!(o.del(vec![key(2), key(3)]));
            o.next_batch().await
        });
        assert_eq!(b.dels.iter().map(|k| k.block).collect::<Vec<_>>(), [1, 2, 3]);
        // Exactly its window: no flush window on top when no block is queued.
        assert_eq!(since(&rt, t), DEL_WINDOW);
        // A full batch leaves at once.
        let t = now(&rt);
        assert!(del_at(&rt, &o, (0..DEL_BATCH as u64).map(key).collect()));
        let b = rt.block_on(o.next_batch());
        assert_eq!(b.dels.len(), DEL_BATCH);
        assert_eq!(since(&rt, t), Duration::ZERO);
        // A block queued while deletions are due still gets its flush window, and they go with it.
        assert!(del_at(&rt, &o, vec![key(5)]));
        let t = now(&rt);
        let b = rt.block_on(async {
            tokio::time::sleep(DEL_WINDOW).await;
            assert!(o.put(put(6)).is_ok());
            o.next_batch().await
        });
        assert_eq!((b.puts.len(), b.dels.iter().map(|k| k.block).collect::<Vec<_>>()), (1, vec![5]));
        assert_eq!(since(&rt, t), DEL_WINDOW + FLUSH_WINDOW);
        // Blocks queued beside waiting deletions do not wait for them.
        assert!(del_at(&rt, &o, vec![key(7)]));
        assert!(o.put(put(8)).is_ok());
        let t = now(&rt);
        let b = rt.block_on(o.next_batch());
        assert_eq!((b.puts.len(), b.dels.len()), (1, 0));
        assert_eq!(since(&rt, t), FLUSH_WINDOW);
        let b = rt.block_on(o.next_batch());
        assert_eq!(b.dels.iter().map(|k| k.block).collect::<Vec<_>>(), [7]);
    }

    #[test]
    fn seeds_wait_for_company_within_their_window_or_a_full_batch() {
        let o = Outbox::new(10 * SEED_BATCH, 16);
        let rt = paused();
        let blocks = |b: &Batch| b.puts.iter().map(|p| p.key.block).collect::<Vec<_>>();
        // Alone, a seed waits SEED_WINDOW, gathering the seeds that come meanwhile.
        let t = now(&rt);
        assert!(put_at(&rt, &o, seed(1)));
        let b = rt.block_on(async {
            tokio::time::sleep(SEED_WINDOW / 2).await;
            assert!(o.put(seed(2)).is_ok());
            o.next_batch().await
        });
        assert_eq!(blocks(&b), [1, 2]);
        assert_eq!(since(&rt, t), SEED_WINDOW, "exactly its window");
        // A fill leaves after its flush window and takes the seeds waiting with it.
        assert!(put_at(&rt, &o, seed(3)));
        assert!(put_at(&rt, &o, put(4)));
        let t = now(&rt);
        let b = rt.block_on(o.next_batch());
        assert_eq!(blocks(&b), [4, 3]);
        assert_eq!(since(&rt, t), FLUSH_WINDOW);
        // A full batch of seeds leaves at once.
        let t = now(&rt);
        for i in 0..SEED_BATCH as u64 {
            assert!(put_at(&rt, &o, seed(100 + i)));
        }
        let b = rt.block_on(o.next_batch());
        assert_eq!(b.puts.len(), SEED_BATCH);
        assert_eq!(since(&rt, t), Duration::ZERO);
        // Seeds and deletions share the flusher's clock: each leaves at its own time, and
        // seeds count against the fills' bound like any fill.
        assert!(del_at(&rt, &o, vec![key(7)]));
        let t = now(&rt);
        let b = rt.block_on(async {
            tokio::time::sleep(SEED_WINDOW / 2).await;
            assert!(o.put(seed(8)).is_ok());
            o.next_batch().await
        });
        assert_eq!((blocks(&b), b.dels.len()), (vec![], 1));
        assert_eq!(since(&rt, t), DEL_WINDOW);
        let b = rt.block_on(o.next_batch());
        assert_eq!((blocks(&b), b.dels.len()), (vec![8], 0));
        assert_eq!(since(&rt, t), SEED_WINDOW / 2 + SEED_WINDOW);
        assert_eq!(o.outstanding().0, 2 + 2 + SEED_BATCH + 1, "taken, not yet sent");
        // Nothing queued now: the next batch waits for a new entry.
        let waited = rt.block_on(async { tokio::time::timeout(10 * SEED_WINDOW, o.next_batch()).await.is_err() });
        assert!(waited);
    }

    #[test]
    fn a_request_of_seeds_alone_is_no_sample_of_the_queue() {
        let t0 = Instant::now();
        let at = |p: PendingPut, ms: u64| PendingPut { queued: t0 + Duration::from_millis(ms), ..p };
        assert_eq!(newest_fill(&[at(seed(1), 90), at(seed(2), 95)]), None);
        // With a fill among them, the newest fill's time, however new the seeds are.
        let mixed = [at(seed(1), 90), at(put(2), 10), at(put(3), 20), at(seed(4), 95)];
        assert_eq!(newest_fill(&mixed), Some(t0 + Duration::from_millis(20)));
        assert_eq!(newest_fill(&[]), None);
    }

    #[test]
    fn the_fills_bound_follows_what_the_links_carry() {
        // Unmeasured: the configured bound.
        assert_eq!(put_bound(None, 8192), 8192);
        // 1 Gbit/s is ~30,500 blocks of 4 KiB a second: 1,525 in 50 ms.
        assert_eq!(put_bound(Some(30_500.0), 8192), 1525);
        // A fast link is held by the configured bound, a stalled one by the floor.
        assert_eq!(put_bound(Some(1e7), 8192), 8192);
        assert_eq!(put_bound(Some(10.0), 8192), MIN_PUT_BOUND);
        assert_eq!(put_bound(Some(0.0), 8192), MIN_PUT_BOUND);
        // The floor never passes a smaller configured bound; nonsense is ignored.
        assert_eq!(put_bound(Some(10.0), 100), 100);
        assert_eq!(put_bound(Some(f64::NAN), 8192), 8192);
        assert_eq!(put_bound(Some(f64::INFINITY), 8192), 8192);
    }

    #[test]
    fn a_lenders_pace_is_a_capped_moving_mean_of_full_requests() {
        let cap = Duration::from_millis(500);
        let p = FillPace::default();
        assert_eq!(p.blocks_per_sec(2), None, "nothing measured");
        p.record(0, Duration::from_millis(1), cap);
        assert_eq!(p.blocks_per_sec(2), None, "an empty request measures nothing");
        // 8 blocks in 800 µs: 100 µs a block, two requests at a time: 20,000 blocks a second.
        p.record(8, Duration::from_micros(800), cap);
        assert_eq!(p.blocks_per_sec(2), Some(20_000.0));
        // One request stalled for seconds moves the mean by an eighth of the cap, no more.
        p.record(8, Duration::from_secs(30), cap);
        let ns = 100_000 - 100_000 / 8 + (500_000_000 / 8) / 8;
        assert_eq!(p.blocks_per_sec(1), Some(1e9 / ns as f64));
        // And the mean comes back as the link does.
        for _ in 0..100 {
            p.record(8, Duration::from_micros(800), cap);
        }
        let r = p.blocks_per_sec(2).unwrap();
        assert!((19_000.0..=20_000.0).contains(&r), "{r}");
    }

    #[test]
    fn a_standing_queue_is_held_to_its_links_pace_and_blocks_queued_stay() {
        let o = Outbox::new(2048, 16);
        let t0 = o.watch.lock().start;
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // `n` requests got their slots at `ms`, each after waiting `waited` ms.
        let leave = |n: u32, waited: u64, ms: u64| {
            for _ in 0..n {
                o.left_queue_at(Duration::from_millis(waited), at(ms));
            }
        };
        assert_eq!(o.put_limit(), 2048);
        for b in 0..600 {
            assert!(o.put(put(b)).is_ok());
        }
        // Requests waited 40 ms and more for their slots all interval: a standing queue.
        // 1,000 blocks a second carry 50 in the horizon: the floor holds it at 512, below
        // what is queued, so nothing more is taken until those leave.
        leave(2, 40, 10);
        leave(2, 90, 60);
        o.pace_at(Some(1_000.0), at(100));
        assert_eq!(o.put_limit(), 2048, "decided once an interval");
        o.pace_at(Some(1_000.0), at(200));
        assert_eq!(o.put_limit(), MIN_PUT_BOUND);
        assert!(o.put(put(1000)).is_err(), "past the bound the links carry");
        assert_eq!(o.outstanding().0, 600, "queued blocks are not dropped");
        o.puts_sent(100);
        assert!(o.put(put(1001)).is_ok(), "room again under the bound");
        // The pace is measured faster: the bound follows within the interval.
        o.pace_at(Some(20_000.0), at(250));
        assert_eq!(o.put_limit(), 1000);
        // One request that left within the target in an interval: the queue emptied, the
        // configured bound again, whatever the pace — decided by the next request as well as
        // by the next batch.
        leave(3, 60, 300);
        leave(1, 2, 350);
        leave(1, 70, 400);
        assert_eq!(o.put_limit(), 2048);
        // Requests that all waited long close the next interval: standing again, at the pace
        // last given.
        leave(3, 80, 500);
        leave(1, 80, 600);
        assert_eq!(o.put_limit(), 1000);
        // Too few requests to judge by (a lender that stopped answering, a trickle): the
        // state stays, standing or not.
        leave(2, 3, 700);
        o.pace_at(Some(1_000.0), at(800));
        assert_eq!(o.put_limit(), MIN_PUT_BOUND, "two quick requests: still standing");
        o.pace_at(Some(1_000.0), at(1000));
        assert_eq!(o.put_limit(), MIN_PUT_BOUND, "none at all: still standing");
        leave(4, 3, 1100);
        o.pace_at(Some(1_000.0), at(1200));
        assert_eq!(o.put_limit(), 2048);
        leave(3, 500, 1300);
        o.pace_at(Some(1_000.0), at(1400));
        assert_eq!(o.put_limit(), 2048, "three slow requests: still not standing");
        // Unmeasured pace: the configured bound even while standing.
        leave(4, 500, 1500);
        o.pace_at(Some(1_000.0), at(1600));
        assert_eq!(o.put_limit(), MIN_PUT_BOUND);
        o.pace_at(None, at(1650));
        assert_eq!(o.put_limit(), 2048);
    }
}
