//! Group commit, the recovery scan's rate, and reads of dirty blocks.
use super::*;
use std::io;

/// An in-memory medium whose flush takes `flush_us` (a device's cache flush).
struct Mem {
    data: Arc<Mutex<Vec<u8>>>,
    flush_us: u64,
    flushes: AtomicU64,
    reads: AtomicU64,
    /// [`Medium::start_writeback`] calls (shared: read after the medium is boxed).
    writebacks: Arc<AtomicU64>,
}
impl Mem {
    fn new(data: Arc<Mutex<Vec<u8>>>, flush_us: u64) -> Mem {
        Mem { data, flush_us, flushes: AtomicU64::new(0), reads: AtomicU64::new(0), writebacks: Arc::default() }
    }
}

impl Medium for Mem {
    fn len(&self) -> u64 {
        self.data.lock().len() as u64
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        buf.copy_from_slice(&self.data.lock()[off as usize..off as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, off: u64, d: &[u8]) -> io::Result<()> {
        self.data.lock()[off as usize..off as usize + d.len()].copy_from_slice(d);
        Ok(())
    }
    fn start_writeback(&self) {
        self.writebacks.fetch_add(1, Ordering::Relaxed);
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_micros(self.flush_us));
        Ok(())
    }
}

fn data(key: u64, block: u64) -> Append {
    let mut p = Page::zeroed();
    p.0[..16].copy_from_slice(&[key.to_le_bytes(), block.to_le_bytes()].concat());
    Append {
        entries: vec![Entry::Data { key: FileKey(key), block, valid: PAGE_BYTES as u32, page: p }],
        names: vec![(FileKey(key), Arc::from(&b"n"[..]))],
        reserve: false,
        lazy: false,
    }
}

#[test]
fn the_appends_of_a_group_share_one_header() {
    let bytes = Arc::new(Mutex::new(vec![0; 64 << 20]));
    let (log, _) = Log::open(Box::new(Mem::new(bytes, 0)), Mode::Ssd, Some("b")).unwrap();
    let base = log.stats().used_bytes / PB;
    for r in log.append_group((0..16).map(|t| data(t, 0)).collect()) {
        r.unwrap();
    }
    let one = log.stats().used_bytes / PB - base;
    for t in 0..16 {
        log.append(data(t, 1)).unwrap();
    }
    let alone = log.stats().used_bytes / PB - base - one;
    // Together: one header page for the 16, then each file's name and its data page.
    assert_eq!(one, 1 + 16 + 16, "a group of 16 appends of new files");
    // Apart (names known by now): a header and a data page each.
    assert_eq!(alone, 16 * 2, "16 appends one by one");
}

#[test]
fn concurrent_writers_share_flushes() {
    let bytes = Arc::new(Mutex::new(vec![0; 64 << 20]));
    let m = Mem::new(bytes.clone(), 2000);
    let (log, _) = Log::open(Box::new(m), Mode::Ssd, Some("b")).unwrap();
    let log = Arc::new(log);
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..40 {
                    log.append(data(t, i)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = log.stats();
    assert_eq!((s.appends, s.dirty_blocks), (640, 640));
    // 16 writers, each waiting on a 2 ms flush: flushes carry several appends (typically
    // 5 to 15; at least 2 on average even on a loaded machine). A group is written while the
    // flush before it runs, and a flush covers every group written before it starts: groups
    // may be smaller than flushes are.
    assert!(
        s.flushes * 3 <= s.appends,
        "group commit shares flushes: {} flushes ({} groups) for {} appends",
        s.flushes,
        s.groups,
        s.appends
    );
    // Packed: fewer pages than a header and a data page per append.
    // Packed: one header page per group, however the scheduler formed the groups (on a
    // loaded machine most may hold one append; `the_appends_of_a_group_share_one_header`
    // checks the sharing itself), then each file's name once and each append's data page.
    // (A leader may find the appends already taken, and lead an empty group: no header.)
    assert!(
        s.used_bytes / PB <= s.groups + 16 + s.appends,
        "{} pages used: more than a header per group ({}), 16 names and a data page per append ({})",
        s.used_bytes / PB,
        s.groups,
        s.appends
    );
    for t in 0..16 {
        for i in 0..40 {
            let (p, _) = log.read_block(FileKey(t), i).unwrap().unwrap();
            assert_eq!(&p.0[..16], &[t.to_le_bytes(), i.to_le_bytes()].concat()[..]);
        }
    }
    // And recovery reads the packed batches back.
    let log = Arc::into_inner(log).unwrap();
    drop(log);
    let m = Mem::new(bytes, 0);
    let (log, r) = Log::open(Box::new(m), Mode::Ssd, Some("b")).unwrap();
    assert_eq!((r.records, r.files), (640, 16));
    for t in 0..16 {
        for i in 0..40 {
            let (p, _) = log.read_block(FileKey(t), i).unwrap().unwrap();
            assert_eq!(&p.0[..16], &[t.to_le_bytes(), i.to_le_bytes()].concat()[..]);
        }
    }
}

/// A writer that found the commit lock held by someone other than a leader (a statistic, the
/// write-back) is woken when it is let go, not by its wait's 10 ms safety net: each round holds
/// the lock while one writer queues behind it, then lets go. (Before slots, a waiting writer
/// heard only leaders; without the wake on release it would wait out the net every round.)
#[test]
fn a_writer_behind_a_non_leader_holding_the_commit_lock_is_woken_when_it_lets_go() {
    let m = Mem::new(Arc::new(Mutex::new(vec![0; 8 << 20])), 0);
    let (log, _) = Log::open(Box::new(m), Mode::Ssd, Some("b")).unwrap();
    let log = Arc::new(log);
    let rounds = 20u64;
    for i in 0..rounds {
        let guard = log.ring();
        let w = {
            let log = log.clone();
            std::thread::spawn(move || log.append(data(1, i)).unwrap())
        };
        let t0 = Instant::now();
        while log.pending.lock().is_empty() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(1)); // time to reach its wait
        drop(guard);
        w.join().unwrap();
    }
    let s = log.stats();
    assert_eq!(s.appends, rounds);
    assert!(s.wait_timeouts <= rounds / 4, "{} of {rounds} writers waited out the safety net", s.wait_timeouts);
}

#[test]
fn recovery_scans_at_least_a_gib_per_second() {
    // 64 MiB of one-block appends (the slowest shape: a header per block), then a scan.
    let bytes = Arc::new(Mutex::new(vec![0; 64 << 20]));
    let m = Mem::new(bytes.clone(), 0);
    let (log, _) = Log::open(Box::new(m), Mode::Dram, Some("b")).unwrap();
    let mut n = 0;
    while log.append(Append { reserve: true, ..data(n % 7, n) }).is_ok() {
        n += 1;
    }
    let used = log.stats().used_bytes;
    assert!(used > 60 << 20, "{used}");
    drop(log);
    let m = Mem::new(bytes, 0);
    // CPU time of this thread, not wall time: the scan is CPU-bound here (the medium is
    // memory), and a loaded machine must not fail the test.
    let cpu = || {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime fills `ts`.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    };
    let t0 = cpu();
    let (log2, rec) = Log::open(Box::new(m), Mode::Dram, Some("b")).unwrap();
    let took = cpu() - t0;
    assert_eq!(rec.records, n);
    assert_eq!(log2.stats().dirty_blocks, n);
    let per_gib = took.as_secs_f64() * (1u64 << 30) as f64 / used as f64;
    eprintln!("scanned {used} bytes ({n} records) in {took:?}: {per_gib:.2} s per GiB");
    // The bound is for optimised builds; an unoptimised test build gets four times it.
    let bound = if cfg!(debug_assertions) { 4.0 } else { 1.0 };
    assert!(per_gib <= bound, "{per_gib:.2} s per GiB");
}

/// Version `v` of block 0 of key 1: the version in its first 8 bytes and all through.
fn version(v: u64) -> Append {
    let mut p = Page::zeroed();
    for c in p.0.chunks_mut(8) {
        c.copy_from_slice(&v.to_le_bytes());
    }
    Append {
        entries: vec![Entry::Data { key: FileKey(1), block: 0, valid: PAGE_BYTES as u32, page: p }],
        names: vec![(FileKey(1), Arc::from(&b"n"[..]))],
        reserve: false,
        lazy: false,
    }
}

#[test]
fn reads_of_a_block_rewritten_and_freed_under_them_see_one_whole_version() {
    // One writer rewrites one block as fast as it can while another frees everything written
    // so far: the lock-free reads lose their race over and over, and the read under the commit
    // lock must still give a whole version (never an error, never a mix of two).
    let bytes = Arc::new(Mutex::new(vec![0; 16 << 20]));
    let m = Mem::new(bytes, 0);
    let (log, _) = Log::open(Box::new(m), Mode::Ssd, Some("b")).unwrap();
    let log = Arc::new(log);
    log.append(version(1)).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut v = 2;
            while !stop.load(Ordering::Relaxed) {
                log.append(version(v)).unwrap();
                if v % 4 == 0 {
                    log.free_through(log.last_seq().saturating_sub(2)).unwrap();
                }
                v += 1;
            }
            v
        })
    };
    let check = |p: &Page| {
        let v = u64::from_le_bytes(p.0[..8].try_into().unwrap());
        assert!(v >= 1, "version 0");
        assert!(p.0.chunks(8).all(|c| c == v.to_le_bytes()), "a page mixing versions (first {v})");
    };
    let t = std::time::Instant::now();
    let mut reads = 0;
    while t.elapsed() < Duration::from_millis(300) {
        if let Some((p, _)) = log.read_block(FileKey(1), 0).unwrap() {
            check(&p);
        }
        if let Some((p, _)) = log.read_block_locked(FileKey(1), 0).unwrap() {
            check(&p);
        }
        log.read_blocks(
            FileKey(1),
            &[0],
            || 1,
            |b, d| {
                assert_eq!((b, d.len()), (0, PAGE_BYTES));
                let mut p = Page::zeroed();
                p.0.copy_from_slice(d);
                check(&p);
                true
            },
        )
        .unwrap();
        reads += 3;
    }
    stop.store(true, Ordering::Relaxed);
    let versions = writer.join().unwrap();
    assert!(versions > 10 && reads > 10, "{versions} versions, {reads} reads");
}

/// Block `b` of key `k`, `valid` bytes of a pattern of both.
fn block(k: u64, b: u64, valid: usize) -> Entry {
    let mut p = Page::zeroed();
    for (i, x) in p.0[..valid].iter_mut().enumerate() {
        *x = (k as usize * 31 + b as usize * 7 + i) as u8;
    }
    Entry::Data { key: FileKey(k), block: b, valid: valid as u32, page: p }
}

#[test]
fn read_blocks_reads_runs_together_and_gives_each_block_its_newest_bytes() {
    let bytes = Arc::new(Mutex::new(vec![0; 16 << 20]));
    let m = Arc::new(Mem::new(bytes.clone(), 0));
    struct Shared(Arc<Mem>);
    impl Medium for Shared {
        fn len(&self) -> u64 {
            self.0.len()
        }
        fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
            self.0.read_at(off, buf)
        }
        fn write_at(&self, off: u64, d: &[u8]) -> io::Result<()> {
            self.0.write_at(off, d)
        }
        fn flush(&self) -> io::Result<()> {
            self.0.flush()
        }
        fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
            WIDEST.fetch_max(reads.len() as u64, Ordering::Relaxed);
            for (o, b) in reads.iter_mut() {
                self.0.read_at(*o, b)?;
            }
            Ok(())
        }
    }
    /// The most reads handed to the medium at once.
    static WIDEST: AtomicU64 = AtomicU64::new(0);
    let (log, _) = Log::open(Box::new(Shared(m.clone())), Mode::Dram, Some("b")).unwrap();
    let name = |k: u64| (FileKey(k), Arc::from(&b"n"[..]));
    // Key 1: blocks 0..200 in one append (consecutive pages), the last one partial; key 2
    // after them, on a page of its own; then blocks 10 and 150 of key 1 rewritten (newer
    // records on later pages).
    let mut entries: Vec<Entry> = (0..200).map(|b| block(1, b, if b == 199 { 100 } else { PAGE_BYTES })).collect();
    entries.push(block(2, 0, PAGE_BYTES));
    log.append(Append { entries, names: vec![name(1), name(2)], reserve: false, lazy: false }).unwrap();
    let newer = |b: u64| {
        let Entry::Data { mut page, .. } = block(1, b, PAGE_BYTES) else { unreachable!() };
        page.0[0] = 0xEE;
        log.append(Append {
            entries: vec![Entry::Data { key: FileKey(1), block: b, valid: PAGE_BYTES as u32, page }],
            names: vec![name(1)],
            reserve: false,
            lazy: false,
        })
        .unwrap();
    };
    newer(10);
    newer(150);
    // Asked: every block 0..260 (200..260 were never written: skipped).
    let asked: Vec<u64> = (0..260).collect();
    let reads0 = m.reads.load(Ordering::Relaxed);
    let mut got = Vec::new();
    log.read_blocks(
        FileKey(1),
        &asked,
        || usize::MAX,
        |b, d| {
            got.push((b, d.to_vec()));
            true
        },
    )
    .unwrap();
    let reads = m.reads.load(Ordering::Relaxed) - reads0;
    assert_eq!(got.iter().map(|(b, _)| *b).collect::<Vec<_>>(), (0..200).collect::<Vec<_>>());
    for (b, d) in &got {
        let (p, valid) = log.read_block(FileKey(1), *b).unwrap().unwrap();
        assert_eq!(d.len(), valid as usize, "block {b}");
        assert_eq!(&d[..], &p.0[..valid as usize], "block {b}");
    }
    assert_eq!((got[10].1[0], got[150].1[0], got[199].1.len()), (0xEE, 0xEE, 100));
    // 200 blocks in runs broken by the two rewritten ones, the 64-block chunks and the batch's
    // header pages (measured: 11 reads): far fewer reads than blocks.
    assert!(reads <= 16, "{reads} reads of the medium for 200 blocks");
    // The runs of a chunk went to the medium together; `depth` bounds how many at once.
    assert!(WIDEST.swap(0, Ordering::Relaxed) >= 3, "the runs of a chunk were read together");
    log.read_blocks(FileKey(1), &asked, || 2, |_, _| true).unwrap();
    assert_eq!(WIDEST.load(Ordering::Relaxed), 2, "at most `depth` reads at once");
    // Stopping early: no more blocks given once `f` says so.
    let mut n = 0;
    log.read_blocks(
        FileKey(1),
        &asked,
        || usize::MAX,
        |_, _| {
            n += 1;
            n < 5
        },
    )
    .unwrap();
    assert_eq!(n, 5);
    // A damaged page of a run is an error, not bytes.
    let rec = log.dirty_in(FileKey(1), 30, 30)[0].1;
    bytes.lock()[(rec.page * PB) as usize] ^= 0xFF;
    let err = log.read_blocks(FileKey(1), &asked, || usize::MAX, |_, _| true).unwrap_err();
    assert!(err.to_string().contains("fails its checksum"), "{err}");
}

/// A lazily committing log acknowledges lazy appends without a flush, flushes them at a
/// commit (once, then nothing is left to flush), with the next durable append, and at its
/// bound on unflushed pages; a log that does not commit lazily flushes every append.
#[test]
fn lazy_appends_are_flushed_by_a_commit_a_durable_append_or_the_bound() {
    let writebacks = Arc::new(AtomicU64::new(0));
    let open = |lazy: Option<u64>| {
        let mut m = Mem::new(Arc::new(Mutex::new(vec![0; 64 << 20])), 0);
        m.writebacks = writebacks.clone();
        let (log, _) = Log::open(Box::new(m), Mode::Ssd, Some("b")).unwrap();
        match lazy {
            Some(n) => log.commit_lazily(n),
            None => log,
        }
    };
    let lazy = |k, b| Append { lazy: true, ..data(k, b) };
    let log = open(Some(0));
    let f0 = log.stats().flushes;
    for b in 0..10 {
        log.append(lazy(1, b)).unwrap();
    }
    let s = log.stats();
    assert_eq!((s.flushes - f0, s.lazy), (0, true), "lazy appends are not flushed");
    assert!(s.unflushed_bytes >= 10 * PB, "{s:?}");
    // Readable at once.
    let (p, _) = log.read_block(FileKey(1), 9).unwrap().unwrap();
    assert_eq!(&p.0[..16], &[1u64.to_le_bytes(), 9u64.to_le_bytes()].concat()[..]);
    log.commit().unwrap();
    let s = log.stats();
    assert_eq!((s.flushes - f0, s.commits, s.unflushed_bytes), (1, 1, 0), "{s:?}");
    log.commit().unwrap();
    assert_eq!(log.stats().commits, 1, "nothing left to commit: no flush");
    // A durable append flushes the lazy ones before it.
    log.append(lazy(1, 20)).unwrap();
    log.append(data(1, 21)).unwrap();
    let s = log.stats();
    assert_eq!((s.flushes - f0, s.unflushed_bytes), (2, 0), "{s:?}");
    // The bound: at most MAX_GROUP_PAGES (the least it may be) unflushed.
    for b in 0..(MAX_GROUP_PAGES + 10) {
        log.append(lazy(2, b)).unwrap();
        assert!(log.unflushed_bytes() <= MAX_GROUP_PAGES * PB);
    }
    assert!(log.stats().flushes - f0 >= 3, "the bound flushed");
    assert!(writebacks.load(Ordering::Relaxed) >= 1, "the medium was asked to start writing back");
    // The age bound.
    log.append(lazy(3, 0)).unwrap();
    log.commit_if_older(Duration::from_secs(3600)).unwrap();
    assert!(log.unflushed_bytes() > 0, "younger than the age bound");
    log.commit_if_older(Duration::ZERO).unwrap();
    assert_eq!(log.unflushed_bytes(), 0);
    // Not lazy: `lazy` is ignored, each append is flushed.
    let log = open(None);
    let f0 = log.stats().flushes;
    for b in 0..5 {
        log.append(lazy(1, b)).unwrap();
    }
    let s = log.stats();
    assert_eq!((s.flushes - f0, s.unflushed_bytes, s.lazy), (5, 0, false), "{s:?}");
}

/// A medium that keeps what a power cut would leave: a write is durable once a flush that
/// began after it completed has ended — not a flush already under way when it completed.
struct PowerCut {
    volatile: Mutex<Vec<u8>>,
    durable: Mutex<Vec<u8>>,
    /// Completed writes no flush has begun since.
    since_flush: Mutex<Vec<(u64, Vec<u8>)>>,
    /// The first 24 bytes of every durable page (a test append's tag: key, block, version).
    durable_tags: Mutex<std::collections::HashSet<[u8; 24]>>,
    flush_us: u64,
}

impl Medium for Arc<PowerCut> {
    fn len(&self) -> u64 {
        self.volatile.lock().len() as u64
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        buf.copy_from_slice(&self.volatile.lock()[off as usize..off as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, off: u64, d: &[u8]) -> io::Result<()> {
        self.volatile.lock()[off as usize..off as usize + d.len()].copy_from_slice(d);
        self.since_flush.lock().push((off, d.to_vec()));
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        let covered = std::mem::take(&mut *self.since_flush.lock());
        std::thread::sleep(Duration::from_micros(self.flush_us));
        let mut durable = self.durable.lock();
        let mut tags = self.durable_tags.lock();
        for (off, d) in covered {
            durable[off as usize..off as usize + d.len()].copy_from_slice(&d);
            for page in d.chunks(PAGE_BYTES) {
                tags.insert(page[..24].try_into().unwrap());
            }
        }
        Ok(())
    }
}

fn tagged(key: u64, block: u64, version: u64, lazy: bool) -> (Append, [u8; 24]) {
    let mut tag = [0u8; 24];
    tag.copy_from_slice(&[key.to_le_bytes(), block.to_le_bytes(), version.to_le_bytes()].concat());
    let mut p = Page::zeroed();
    p.0[..24].copy_from_slice(&tag);
    let a = Append {
        entries: vec![Entry::Data { key: FileKey(key), block, valid: PAGE_BYTES as u32, page: p }],
        names: vec![(FileKey(key), Arc::from(&b"n"[..]))],
        reserve: false,
        lazy,
    };
    (a, tag)
}

/// The next group is written while a flush runs, so an append must not be acknowledged
/// durable by a flush that had begun before it was written: writers check, at each
/// acknowledgement (a durable append's, or a commit's for the lazy appends before it), that
/// what it acknowledges is on the medium's durable image; then the log is recovered from
/// that image alone (a power cut) and holds every acknowledged append.
#[test]
fn an_acknowledgement_waits_for_a_flush_begun_after_the_write() {
    for lazy_log in [false, true] {
        let pc = Arc::new(PowerCut {
            volatile: Mutex::new(vec![0; 16 << 20]),
            durable: Mutex::new(vec![0; 16 << 20]),
            since_flush: Mutex::new(Vec::new()),
            durable_tags: Mutex::new(Default::default()),
            flush_us: 500,
        });
        let (log, _) = Log::open(Box::new(pc.clone()), Mode::Ssd, Some("b")).unwrap();
        let log = Arc::new(if lazy_log { log.commit_lazily(1 << 20) } else { log });
        let acked = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..12u64)
            .map(|t| {
                let (log, pc, acked) = (log.clone(), pc.clone(), acked.clone());
                std::thread::spawn(move || {
                    let mut waiting = Vec::new();
                    for i in 0..60u64 {
                        // Every third append durable itself; the others lazy on a lazy log,
                        // committed after every fourth.
                        let lazy = lazy_log && i % 3 != 0;
                        let (a, tag) = tagged(t, i, 1000 + t * 100 + i, lazy);
                        log.append(a).unwrap();
                        waiting.push(tag);
                        if lazy && i % 4 != 3 {
                            continue;
                        }
                        if lazy {
                            log.commit().unwrap();
                        }
                        let tags = pc.durable_tags.lock();
                        for tag in waiting.drain(..) {
                            assert!(tags.contains(&tag), "acknowledged before a flush covered it: {tag:?}");
                            acked.lock().push(tag);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = log.stats();
        assert!(s.flushes > 0 && s.flushes < s.appends, "{s:?}");
        // A power cut now: only the durable image is left.
        drop(Arc::into_inner(log).unwrap());
        let image = pc.durable.lock().clone();
        let (log, _) = Log::open(Box::new(Mem::new(Arc::new(Mutex::new(image)), 0)), Mode::Ssd, Some("b")).unwrap();
        let acked = acked.lock();
        assert!(acked.len() >= 12 * 45, "{} acknowledged", acked.len());
        for tag in acked.iter() {
            let key = u64::from_le_bytes(tag[..8].try_into().unwrap());
            let block = u64::from_le_bytes(tag[8..16].try_into().unwrap());
            let (p, _) = log.read_block(FileKey(key), block).unwrap().expect("an acknowledged append survives");
            assert_eq!(&p.0[..24], &tag[..], "lazy {lazy_log}");
        }
    }
}
