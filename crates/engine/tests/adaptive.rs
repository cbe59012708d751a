//! The adaptive routing rule fed with real measurements: a slow disk hands random reads of
//! many blocks to the lenders; a hung lender sends reads to the disk; a stream on a fast
//! disk stores in the lenders only the seeds its probes need, and probes them only after the
//! read it was offered on is answered.

mod common;

use std::time::{Duration, Instant};

use common::{backing, fill_all, wait, Lender, Proxy, SlowDisk};
use farcache_engine::cached::CachedPath;
use farcache_engine::direct::DirectPath;
use farcache_engine::index::BLOCK_BYTES;
use farcache_engine::latency::BOUNDS_US;
use farcache_engine::routing::{
    PROBE_COST_FACTOR, REMOTE_PROBE_INTERVAL, SEED_EVERY, STREAM_QUIET_MAX_LEVEL, STREAM_SEED_GRACE,
    STREAM_SEED_RESERVE,
};
use farcache_engine::DataPath;
use farcache_policy::route::Adaptive;
use farcache_testkit::pattern;

#[test]
fn a_slow_disk_sends_mid_size_reads_to_the_lenders() {
    const READ: usize = 96 << 10; // 24 blocks: below a stream's (routing::STREAM_MIN_BYTES)
    assert!((READ as u64) < farcache_engine::routing::STREAM_MIN_BYTES);
    let lender = Lender::start("32MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(8 * READ, 21);
    let file = backing(&dir, &data);
    let remote = common::remote(vec![lender.addr], |c| {
        c.max_pending_puts = 1024;
        c.fetch_timeout = Duration::from_secs(1);
    });
    let e = CachedPath::new(SlowDisk::new(Duration::from_millis(40)), remote, Adaptive::new());
    wait("connection", || e.remote().connected() == 1);
    // Scattered, so no read continues the one before it.
    let order = [0usize, 5, 2, 7, 1, 4, 6, 3];
    let pass = || {
        for i in order {
            let got = e.read(&file, (i * READ) as u64, READ).unwrap();
            assert_eq!(&got[..], &data[i * READ..(i + 1) * READ], "read {i}");
        }
    };
    // Cold: the rule starts with every read on the disk; the disk's windows (40 ms a read)
    // hand them to the lenders within a few passes, and every read that touches the disk
    // meanwhile fills them.
    let t = Instant::now();
    while e.stats().routing.adaptive.expect("adaptive estimates").disk_share > 0.0 {
        assert!(t.elapsed() < Duration::from_secs(20), "the disk kept a share: {:?}", e.stats().routing);
        pass();
    }
    wait("fills", || common::fills_settled(&e));
    let s = e.stats();
    assert_eq!(s.engine.sequential_bypasses, 0);
    assert!(s.engine.adaptive_disk > 0 && s.engine.fills > 0, "{s:?}");
    // Warm: the next read that misses fills, then every read comes from the lenders.
    pass();
    wait("fills", || common::fills_settled(&e));
    assert_eq!(e.index().remote_blocks(), 8 * 24, "fills dropped: {:?}", e.stats().remote);
    let before = e.stats();
    pass();
    let s = e.stats();
    let delta = |f: fn(&farcache_engine::cached::EngineCountersSnapshot) -> u64| f(&s.engine) - f(&before.engine);
    assert_eq!((delta(|c| c.adaptive_remote), delta(|c| c.adaptive_disk)), (8, 0), "{s:?}");
    assert_eq!(delta(|c| c.remote_reads), 8);
    assert_eq!(s.routing.mode, "adaptive");
    let est = s.routing.adaptive.expect("adaptive estimates");
    assert!(est.disk_samples >= 8 && est.remote_samples >= 8, "{est:?}");
    assert!(est.disk_access_us > 20_000.0, "{est:?}");
    assert!(est.remote_access_us + READ as f64 / est.remote_bytes_per_us < est.disk_access_us, "{est:?}");
    // The reads sent to the lenders before they held them were misses: counted in the share
    // of reads the lenders hold, and timed as the disk's read (40 ms) and its fill.
    assert!(est.lenders_held < 1.0, "{est:?}");
    assert!(est.lender_miss_us >= 40_000.0, "{est:?}");
}

#[test]
fn the_rule_learns_a_disk_reads_time_from_the_path_that_timed_it() {
    // The engine times a disk read by the disk path's own clock reads (`read_timed`), not
    // two more of its own: a disk that reports 40 ms reads is a slow disk to the rule, however
    // fast the call returns.
    const READ: usize = 8 * BLOCK_BYTES as usize;
    let lender = Lender::start("32MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(16 * READ, 23);
    let file = backing(&dir, &data);
    let remote = common::remote(vec![lender.addr], |c| c.max_pending_puts = 1024);
    let e = CachedPath::new(SlowDisk::reporting(Duration::from_millis(40)), remote, Adaptive::new());
    wait("connection", || e.remote().connected() == 1);
    let order = [0usize, 9, 2, 13, 5, 11, 7, 15, 1, 4, 12, 3, 8, 14, 6, 10];
    let t = Instant::now();
    while e.stats().routing.adaptive.expect("adaptive estimates").disk_share > 0.0 {
        assert!(t.elapsed() < Duration::from_secs(20), "the disk kept a share: {:?}", e.stats().routing);
        for i in order {
            assert_eq!(&e.read(&file, (i * READ) as u64, READ).unwrap()[..], &data[i * READ..(i + 1) * READ]);
        }
    }
    let est = e.stats().routing.adaptive.expect("adaptive estimates");
    assert!(est.disk_access_us > 20_000.0 && est.disk_window_mean_us > 20_000.0, "{est:?}");
}

#[test]
fn a_direct_read_is_timed_once_and_its_time_given_to_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 << 10, 5);
    let file = backing(&dir, &data);
    let d = DirectPath::new();
    let before = Instant::now();
    let (got, time) = d.read_timed(&file, 4096, 8192).unwrap();
    assert_eq!(&got[..], &data[4096..12288]);
    assert!(before <= time.start && time.start <= time.end && time.end <= Instant::now(), "{time:?}");
    assert_eq!(time.took(), time.end - time.start);
    assert_eq!(&d.read(&file, 0, 4096).unwrap()[..], &data[..4096]);
    // Each read counted and timed once: `read` is `read_timed` with the time dropped.
    let s = d.snapshot();
    assert_eq!((s.read_latency.count, s.reads_direct + s.reads_buffered, s.read_bytes), (2, 2, 12288), "{s:?}");
}

#[test]
fn a_hung_lender_sends_reads_to_a_fast_disk() {
    const BLOCKS: usize = 32;
    let fetch_timeout = Duration::from_millis(150);
    let lender = Lender::start("16MiB");
    let proxy = Proxy::start(lender.addr);
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(BLOCKS * 4096, 22);
    let file = backing(&dir, &data);
    let remote = common::remote(vec![proxy.addr], |c| c.fetch_timeout = fetch_timeout);
    // 8 ms per disk read (paper 000's disk): slower than a healthy lender on loopback, far
    // faster than a hung one. One fetch that waits out its 150 ms moves the lenders' estimate
    // by a tenth of that: past the disk's.
    let e = CachedPath::new(SlowDisk::new(Duration::from_millis(8)), remote, Adaptive::new());
    wait("connection", || e.remote().connected() == 1);
    common::until_lenders_take_every_read(&e, &file, &data);
    fill_all(&e, &file, &data);
    // A healthy lender: random single blocks come from it.
    let before = e.stats().engine;
    common::read_all(&e, &file, &data);
    let s = e.stats().engine;
    assert_eq!(s.adaptive_remote - before.adaptive_remote, BLOCKS as u64, "{s:?}");
    assert_eq!(s.remote_reads - before.remote_reads, BLOCKS as u64);

    // The lender hangs. The first read waits out fetch_timeout and teaches the rule; the rest
    // go to the disk without asking.
    proxy.freeze(true);
    let before = e.stats().engine;
    let t = Instant::now();
    common::read_all(&e, &file, &data);
    let took = t.elapsed();
    let s = e.stats();
    let remote = s.engine.adaptive_remote - before.adaptive_remote;
    let disk = s.engine.adaptive_disk - before.adaptive_disk;
    assert_eq!(remote + disk, BLOCKS as u64);
    assert!(remote <= 2, "{remote} reads still routed to the hung lender: {s:?}");
    assert!(took < fetch_timeout * 4 + Duration::from_millis(8) * BLOCKS as u32 * 3, "the pass took {took:?}");
    let est = s.routing.adaptive.unwrap();
    assert!(est.remote_access_us > est.disk_access_us, "{est:?}");
    assert!(s.remote.fallbacks >= 1);
    proxy.freeze(false);
}

#[test]
fn a_stream_on_a_fast_disk_stores_the_seeds_its_probes_need_and_seeds_again_once_they_are_lost() {
    const MIB: usize = 1 << 20;
    const BLOCK: u64 = 4096;
    let lender = Lender::start("64MiB");
    let dir = tempfile::tempdir().unwrap();
    // 17 MiB: a stream's seeds (one 1 MiB read in SEED_EVERY) land on different ranges.
    let data = pattern(17 * MIB, 23);
    let file = backing(&dir, &data);
    // The disk is the machine's page cache: a stream's read far faster than a lender's.
    let e = common::engine(DirectPath::new(), vec![lender.addr], Adaptive::new());
    wait("connection", || e.remote().connected() == 1);
    let mut at = 0u64;
    let mut read = |n: u64, pause: Duration| {
        for _ in 0..n {
            let o = (at % 17) as usize * MIB;
            at += 1;
            let got = e.read(&file, o as u64, MIB).unwrap();
            assert_eq!(&got[..], &data[o..o + MIB], "the MiB at {o}");
            std::thread::sleep(pause);
        }
    };
    // Six times SEED_EVERY reads: one in SEED_EVERY seeding would store 6 MiB; the seeds
    // stop at STREAM_SEED_RESERVE (2 MiB).
    read(6 * SEED_EVERY, Duration::ZERO);
    wait("fills", || common::fills_settled(&e));
    let s = e.stats();
    assert!(s.engine.sequential_bypasses == 0 && s.engine.adaptive_disk >= 6 * SEED_EVERY, "{s:?}");
    assert_eq!(s.engine.fills * BLOCK, STREAM_SEED_RESERVE, "{s:?}");
    assert_eq!(s.engine.seed_fills, s.engine.fills, "a stream's fills on a fast disk are seeds: {s:?}");
    assert_eq!(e.index().remote_blocks() * BLOCK, STREAM_SEED_RESERVE);
    // The file changes under the seeds (a write through the mount retires its blocks): the
    // next stream probe due finds none held, forgets them once they are STREAM_SEED_GRACE
    // old, and the stream seeds again.
    e.write(&file, 0, &data).unwrap();
    assert_eq!(e.index().remote_blocks(), 0);
    let t = Instant::now();
    while e.index().remote_blocks() * BLOCK < STREAM_SEED_RESERVE {
        // The lost seeds are found by the next stream probe, which waits up to
        // PROBE_COST_FACTOR times what the last one took, doubled up to STREAM_QUIET_MAX_LEVEL
        // times (the back-off): on a loaded machine a probe of 15 ms puts the next one 48 s
        // out. The seeds come back within that bound of the slowest probe (its latency
        // bucket's upper bound), and 30 s.
        let fetches = e.stats().remote.fetch_latency;
        let slowest_us = (0..BOUNDS_US.len()).rev().find(|&i| fetches.buckets[i] > 0).map_or(0, |i| BOUNDS_US[i]);
        let probe_wait = (REMOTE_PROBE_INTERVAL.as_micros() as u64).max(slowest_us * PROBE_COST_FACTOR);
        let bound = Duration::from_secs(30) + Duration::from_micros(probe_wait << STREAM_QUIET_MAX_LEVEL);
        assert!(t.elapsed() < bound, "no new seeds in {bound:?}: {:?}", e.stats());
        read(SEED_EVERY, Duration::from_millis(2));
        wait("fills", || common::fills_settled(&e));
    }
    assert!(t.elapsed() >= STREAM_SEED_GRACE, "seeds forgotten before their grace: {:?}", t.elapsed());
    assert_eq!(e.stats().engine.fills * BLOCK, 2 * STREAM_SEED_RESERVE, "{:?}", e.stats());
}

#[test]
fn a_stream_probe_runs_after_the_read_it_was_offered_on_is_answered() {
    const MIB: usize = 1 << 20;
    const BLOCK: u64 = 4096;
    let fetch_timeout = Duration::from_millis(400);
    let lender = Lender::start("64MiB");
    let proxy = Proxy::start(lender.addr);
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(17 * MIB, 24);
    let file = backing(&dir, &data);
    let remote = common::remote(vec![proxy.addr], |c| c.fetch_timeout = fetch_timeout);
    // The disk is the machine's page cache: a stream's 1 MiB read takes well under a millisecond.
    let e = CachedPath::new(DirectPath::new(), remote, Adaptive::new());
    wait("connection", || e.remote().connected() == 1);
    let mut at = 0u64;
    // One read of the stream as the FUSE layer makes it: the read (timed), then what it left
    // for after its answer (timed).
    let mut read = || {
        let o = (at % 17) as usize * MIB;
        at += 1;
        let t = Instant::now();
        let got = e.read(&file, o as u64, MIB).unwrap();
        let read_took = t.elapsed();
        assert_eq!(&got[..], &data[o..o + MIB], "the MiB at {o}");
        let t = Instant::now();
        e.after_reply();
        (read_took, t.elapsed())
    };
    // The stream stores the seeds its probes need.
    let t = Instant::now();
    while e.index().remote_blocks() * BLOCK < STREAM_SEED_RESERVE {
        assert!(t.elapsed() < Duration::from_secs(30), "no seeds stored: {:?}", e.stats());
        read();
        wait("fills", || common::fills_settled(&e));
    }
    // The lender stops answering: a stream probe now waits out the fetch timeout. It must do
    // so after its read was answered, never inside a read.
    proxy.freeze(true);
    let probes = e.stats().engine.adaptive_probes;
    let (mut slowest_read, mut probe_took) = (Duration::ZERO, None);
    let t = Instant::now();
    while probe_took.is_none() {
        assert!(t.elapsed() < Duration::from_secs(60), "no stream probe came due: {:?}", e.stats());
        let (r, after) = read();
        slowest_read = slowest_read.max(r);
        if e.stats().engine.adaptive_probes > probes {
            probe_took = Some(after);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    proxy.freeze(false);
    let probe_took = probe_took.unwrap();
    assert!(probe_took >= fetch_timeout * 3 / 4, "the probe did not wait for the frozen lender: {probe_took:?}");
    assert!(slowest_read < fetch_timeout / 2, "a read waited for the probe: {slowest_read:?}");
    assert!(e.stats().remote.fallbacks >= 1, "{:?}", e.stats().remote);
    // A caller that never says it answered loses no probe: the one a read left runs at the
    // next read on the thread.
    let probes = e.stats().engine.adaptive_probes;
    let t = Instant::now();
    while e.stats().engine.adaptive_probes == probes {
        assert!(t.elapsed() < Duration::from_secs(60), "no stream probe without after_reply: {:?}", e.stats());
        let o = (at % 17) as usize * MIB;
        at += 1;
        assert_eq!(&e.read(&file, o as u64, MIB).unwrap()[..], &data[o..o + MIB]);
        std::thread::sleep(Duration::from_millis(5));
    }
}
