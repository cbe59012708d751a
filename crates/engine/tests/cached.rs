//! The cache engine against a real lender (the server library on loopback, in this process):
//! reads are served from the lender after a fill, every read returns the disk's bytes, writes
//! make old copies unreachable, and a stopped lender only costs misses.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{backing, reopened, wait, Lender};
use farcache_engine::cached::{CachedPath, EngineCountersSnapshot};
use farcache_engine::remote::{LenderStatus, RemoteCountersSnapshot};
use farcache_engine::stats::IndexStats;
use farcache_engine::{CacheStats, DataPath, DirectPath};
use farcache_policy::route::Threshold;
use farcache_testkit::pattern;

fn engine(servers: Vec<SocketAddr>) -> CachedPath<DirectPath> {
    common::engine(DirectPath::new(), servers, Threshold::PAPER)
}

#[test]
fn second_pass_is_served_by_the_lender_and_is_exact() {
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(1 << 20, 1);
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    let offsets: Vec<u64> = (0..256u64).map(|i| (i * 97 % 256) * 4096).collect();
    for &o in &offsets {
        assert_eq!(&e.read(&file, o, 4096).unwrap()[..], &data[o as usize..o as usize + 4096]);
    }
    wait("fills", || e.remote().counters().puts.load(Ordering::Relaxed) == 256);
    wait("index", || e.index().remote_blocks() == 256);
    for &o in &offsets {
        // Unaligned reads inside and across blocks too.
        assert_eq!(&e.read(&file, o + 100, 3000).unwrap()[..], &data[o as usize + 100..o as usize + 3100]);
    }
    assert_eq!(e.counters().remote_reads.load(Ordering::Relaxed), 256);
    assert_eq!(e.remote().counters().hits.load(Ordering::Relaxed), 256);
    // A large read bypasses the lenders.
    assert_eq!(&e.read(&file, 0, 256 << 10).unwrap()[..], &data[..256 << 10]);
    assert_eq!(e.counters().sequential_bypasses.load(Ordering::Relaxed), 1);
    let mem = e.index().memory_bytes();
    assert!(mem < 64 << 10, "index of 1 MiB cached: {mem} bytes");
}

#[test]
fn writes_make_cached_copies_unreachable() {
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let mut data = pattern(64 << 10, 2);
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    for b in 0..16u64 {
        e.read(&file, b * 4096, 4096).unwrap();
    }
    wait("fills", || e.index().remote_blocks() == 16);
    for round in 0..20u8 {
        let b = (round as u64 * 7) % 16;
        let new = vec![round; 100];
        e.write(&file, b * 4096 + 50, &new).unwrap();
        data[(b * 4096 + 50) as usize..(b * 4096 + 150) as usize].copy_from_slice(&new);
        for b2 in 0..16u64 {
            let got = e.read(&file, b2 * 4096, 4096).unwrap();
            assert_eq!(&got[..], &data[(b2 * 4096) as usize..((b2 + 1) * 4096) as usize], "round {round} block {b2}");
        }
    }
    assert!(e.remote().counters().invalidations.load(Ordering::Relaxed) > 0);
    // Truncate then extend: the tail reads as zeros, never as the old cached bytes.
    e.set_len(&file, 10_000).unwrap();
    e.set_len(&file, 64 << 10).unwrap();
    let got = e.read(&file, 8192, 4096).unwrap();
    assert_eq!(&got[..10_000 - 8192], &data[8192..10_000]);
    assert!(got[10_000 - 8192..].iter().all(|&b| b == 0));
    let got = e.read(&file, 12 * 4096, 4096).unwrap();
    assert!(got.iter().all(|&b| b == 0), "old block 12 must not come back");
}

#[test]
fn a_stopped_lender_costs_only_misses() {
    let mut lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(256 << 10, 3);
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    for b in 0..64u64 {
        e.read(&file, b * 4096, 4096).unwrap();
    }
    wait("fills", || e.index().remote_blocks() == 64);
    lender.stop();
    let t = Instant::now();
    for b in 0..64u64 {
        let got = e.read(&file, b * 4096, 4096).unwrap();
        assert_eq!(&got[..], &data[(b * 4096) as usize..((b + 1) * 4096) as usize]);
    }
    assert!(t.elapsed() < Duration::from_secs(10), "fallback took {:?}", t.elapsed());
    assert_eq!(e.counters().remote_reads.load(Ordering::Relaxed), 0);
}

#[test]
fn no_lender_at_all_is_a_plain_passthrough() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 << 10, 4);
    let file = backing(&dir, &data);
    // Nobody listens on this port.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = engine(vec![format!("127.0.0.1:{port}").parse().unwrap()]);
    for b in 0..16u64 {
        assert_eq!(&e.read(&file, b * 4096, 4096).unwrap()[..], &data[(b * 4096) as usize..((b + 1) * 4096) as usize]);
    }
    assert_eq!(e.remote().counters().puts.load(Ordering::Relaxed), 0);
}

#[test]
fn stats_count_a_known_sequence_exactly() {
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let mut data = pattern(64 << 10, 5);
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    let puts = || e.remote().counters().puts.load(Ordering::Relaxed);
    let block = |b: usize| data[b * 4096..(b + 1) * 4096].to_vec();

    // 1. Eight cold single-block reads: the disk, and eight fills.
    for b in 0..8 {
        assert_eq!(&e.read(&file, b as u64 * 4096, 4096).unwrap()[..], &block(b)[..]);
    }
    wait("8 fills", || puts() == 8 && e.index().remote_blocks() == 8);
    // 2. The same eight again: all from the lender.
    for b in 0..8 {
        assert_eq!(&e.read(&file, b as u64 * 4096, 4096).unwrap()[..], &block(b)[..]);
    }
    // 3. A 128 KiB read (32 blocks: the paper's n) bypasses the lender; the file has 64 KiB.
    assert_eq!(&e.read(&file, 0, 128 << 10).unwrap()[..], &data[..]);
    // 4. Two cold blocks in one read: one disk read, two fills.
    assert_eq!(&e.read(&file, 8 * 4096, 8192).unwrap()[..], &data[8 * 4096..10 * 4096]);
    wait("10 fills", || puts() == 10 && e.index().remote_blocks() == 10);
    // 5. A write into block 0 retires block 0 alone: one cached key. Blocks 1..=9 stay.
    e.write(&file, 10, &[0xAB; 100]).unwrap();
    data[10..110].fill(0xAB);
    assert_eq!(e.index().remote_blocks(), 9);
    // 6. Block 0 again: the disk, and one fill.
    assert_eq!(&e.read(&file, 0, 4096).unwrap()[..], &data[..4096]);
    wait("11 fills", || puts() == 11 && e.index().remote_blocks() == 10);
    // 7. Blocks 0..=11, unaligned: a partial hit. Ten blocks from the lender, blocks 10 and
    //    11 in one disk read, two fills.
    assert_eq!(&e.read(&file, 100, 12 * 4096 - 200).unwrap()[..], &data[100..12 * 4096 - 100]);
    wait("13 fills", || puts() == 13 && e.index().remote_blocks() == 12);

    let s = e.stats();
    // Every stored fill is timed; so is every fetch that asked a lender.
    assert_eq!(s.remote.fill_latency.count, 13);
    assert!(s.remote.fetch_latency.count > 0 && s.remote.fetch_latency.count <= 18);
    assert_eq!(
        s.remote,
        RemoteCountersSnapshot {
            gets: 18,
            hits: 18,
            misses: 0,
            bytes_from_servers: 18 * 4096,
            puts: 13,
            puts_dropped: 0,
            puts_failed: 0,
            put_requests_failed: 0,
            bytes_to_servers: 13 * 4096,
            invalidations: 1,
            invalidations_dropped: 0,
            fallbacks: 0,
            rejected: 0,
            connects: 1,
            // Made in the background as fetches found none idle: one at least (the second
            // fetch made one), at most the default limit of 8.
            fetch_connects: s.remote.fetch_connects.clamp(1, 8),
            // Answered while the reading thread polled: any of the fetches on fetch
            // connections, timing decides which.
            fetches_polled: s.remote.fetches_polled.min(s.remote.fetch_latency.count),
            connect_failures: 0,
            auth_failures: 0,
            fetch_latency: s.remote.fetch_latency,
            fill_latency: s.remote.fill_latency,
            // Every fill stored has given back its place; the deletion may still wait for
            // others to share its request (DEL_WINDOW).
            puts_in_flight: 0,
            // No request of fills was full, so no link's pace is measured: the default bound.
            puts_bound: 8192,
            invalidations_in_flight: s.remote.invalidations_in_flight.min(1),
        }
    );
    assert_eq!(
        s.engine,
        EngineCountersSnapshot {
            remote_reads: 8,
            sequential_bypasses: 1,
            disk_reads: 10,
            partial_hits: 1,
            partial_remote_blocks: 10,
            partial_disk_blocks: 2,
            // Its two disk blocks were known before the fetch: read beside it.
            partial_overlapped: 1,
            fills: 13,
            seed_fills: 0,
            fills_pending_skipped: 0,
            read_arounds: 0,
            adaptive_remote: 0,
            adaptive_disk: 0,
            adaptive_probes: 0,
            changed_behind: 0,
        }
    );
    assert_eq!(s.index.remote_blocks, 12);
    assert!(s.index.memory_bytes > 0);
    assert_eq!(s.index, IndexStats::new(s.index.memory_bytes, 12));
    assert_eq!(s.index.bytes_per_gib_cached, s.index.memory_bytes * 262_144 / 12);
    assert_eq!((s.routing.mode.as_str(), s.routing.threshold_bytes), ("threshold", 128 << 10));
    assert!(s.routing.adaptive.is_none());
    assert_eq!(s.lenders.len(), 1);
    let l = &s.lenders[0];
    assert_ne!(l.instance_id, 0);
    assert_eq!(
        l,
        &LenderStatus {
            addr: lender.addr.into(),
            connected: true,
            instance_id: l.instance_id,
            connects: 1,
            hits: 18,
            misses: 0,
            puts: 13
        }
    );
    // Disk reads: 8 single blocks, the 64 KiB the large read found, 2 blocks, 1 block, 2.
    assert_eq!(s.backing.reads_direct + s.backing.reads_buffered, 12);
    assert_eq!(s.backing.read_bytes, (8 + 16 + 2 + 1 + 2) * 4096);
    assert_eq!((s.backing.writes, s.backing.write_bytes, s.backing.fsyncs, s.backing.forgets), (1, 100, 0, 0));

    // An operator's tool reads the document back as it was written.
    let json = serde_json::to_string_pretty(&s).unwrap();
    assert_eq!(serde_json::from_str::<CacheStats>(&json).unwrap(), s);
    assert!(json.contains("\"bytes_per_gib_cached\"") && json.contains("\"sequential_bypasses\": 1"), "{json}");
}

#[test]
fn a_file_changed_behind_the_mount_is_noticed_at_the_next_open() {
    use std::os::unix::fs::FileExt;
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 << 10, 7);
    drop(backing(&dir, &data));
    let file = reopened(&dir, libc::O_RDONLY);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    e.opened(&file);
    for b in 0..16u64 {
        e.read(&file, b * 4096, 4096).unwrap();
    }
    wait("fills", || e.index().remote_blocks() == 16);
    // The mount's own write is not a change behind its back: reopening keeps the cache,
    // while the handle that wrote is open (its changes' stamp is not taken yet) and after
    // it closed (its close took it).
    let writer = reopened(&dir, libc::O_RDWR);
    e.opened(&writer);
    e.write(&writer, 0, &data[..100]).unwrap();
    assert_eq!(e.index().remote_blocks(), 15, "only block 0 was written");
    // (Block 0 has a new version: read it back in.)
    wait("refill", || {
        for b in 0..16u64 {
            e.read(&file, b * 4096, 4096).unwrap();
        }
        e.index().remote_blocks() == 16
    });
    e.opened(&file);
    e.write(&writer, 8192, &data[8192..8200]).unwrap();
    let held = e.index().remote_blocks();
    assert!(held >= 14, "a write of block 2 dropped more than blocks 0 and 2: {held} held");
    drop(writer);
    e.opened(&file);
    assert_eq!(e.counters().changed_behind.load(Ordering::Relaxed), 0);
    assert_eq!(e.index().remote_blocks(), held, "the open after the writer's close dropped cached blocks");
    // Another program rewrites block 3 in place (same inode) while the file is not open here.
    let other = std::fs::OpenOptions::new().write(true).open(dir.path().join("f")).unwrap();
    other.write_all_at(&[0xAB; 4096], 3 * 4096).unwrap();
    drop(other);
    // Until it is opened again the mount may not know; after the open it must.
    e.opened(&file);
    assert_eq!(e.counters().changed_behind.load(Ordering::Relaxed), 1);
    assert_eq!(e.index().remote_blocks(), 0, "every cached block dropped");
    assert_eq!(&e.read(&file, 3 * 4096, 4096).unwrap()[..], &[0xAB; 4096][..]);
    assert_eq!(&e.read(&file, 4 * 4096, 4096).unwrap()[..], &data[4 * 4096..5 * 4096]);
}

/// Writes on one handle for 1.5 s while another thread opens the file again and again: no
/// open may take the writes for changes behind the mount. `counted`: the writer was opened
/// through the data path (its changes' stamp is taken at its close), else it is a handle the
/// data path was never told of (as the write-back tier's own), whose every change takes its
/// stamp at its end, racing the opens.
fn own_writes_on_other_handles(counted: bool) {
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(1 << 20, 9);
    let writer = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    if counted {
        e.opened(&writer);
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut x = 1u64;
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(1500) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let off = (x >> 33) % ((1 << 20) - 8192);
                e.write(&writer, off, &[x as u8; 8192]).unwrap();
            }
            stop.store(true, Ordering::Relaxed);
        });
        s.spawn(|| {
            let mut opens = 0;
            while !stop.load(Ordering::Relaxed) || opens < 100 {
                let b = reopened(&dir, libc::O_RDONLY);
                e.opened(&b);
                e.read(&b, (opens % 256) * 4096, 4096).unwrap();
                opens += 1;
            }
        });
    });
    drop(writer);
    e.opened(&reopened(&dir, libc::O_RDONLY));
    assert_eq!(e.counters().changed_behind.load(Ordering::Relaxed), 0, "own writes taken for foreign changes");
}

#[test]
fn the_mounts_own_writes_on_other_handles_are_never_taken_for_changes_behind_its_back() {
    own_writes_on_other_handles(true);
    own_writes_on_other_handles(false);
}

fn held(e: &CachedPath<DirectPath>, file: &farcache_engine::BackingFile, b: u64) -> bool {
    e.index().lookup(&e.index().file(file.id()), b).is_some()
}

#[test]
fn partial_hits_assemble_lender_blocks_and_one_disk_span_exactly() {
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    // 40 whole blocks and a 1000-byte tail.
    let data = pattern(40 * 4096 + 1000, 8);
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    let held_blocks: Vec<u64> = (0..40).filter(|b| b % 3 == 0).collect();
    for &b in &held_blocks {
        e.read(&file, b * 4096, 4096).unwrap();
    }
    wait("fills", || e.index().remote_blocks() == held_blocks.len() as u64);
    let counters = || e.counters().snapshot();
    let backing_bytes = || e.stats().backing.read_bytes;

    // Blocks 0..=4, unaligned: block 0 from the lender, 1..=4 in one disk read (block 3,
    // held, inside the span, is read from the disk rather than fetched).
    let (c0, d0) = (counters(), backing_bytes());
    assert_eq!(&e.read(&file, 100, 4 * 4096).unwrap()[..], &data[100..100 + 4 * 4096]);
    let c = counters();
    assert_eq!((c.partial_hits - c0.partial_hits, c.remote_reads - c0.remote_reads), (1, 0));
    assert_eq!(
        (c.partial_remote_blocks - c0.partial_remote_blocks, c.partial_disk_blocks - c0.partial_disk_blocks),
        (1, 4)
    );
    assert_eq!(c.partial_overlapped - c0.partial_overlapped, 1, "the disk's span was known before the fetch");
    assert_eq!(backing_bytes() - d0, 4 * 4096);
    wait("fills of 1, 2, 4", || (1..=4).all(|b| held(&e, &file, b)));

    // A read ending past the end of the file: block 39 from the lender, the 1000-byte tail
    // from the disk (short: never cached).
    let c0 = counters();
    let got = e.read(&file, 39 * 4096 + 10, 100_000).unwrap();
    assert_eq!(&got[..], &data[39 * 4096 + 10..]);
    assert_eq!(counters().partial_hits - c0.partial_hits, 1);
    wait("fills settled", || common::fills_settled(&e));
    assert!(!held(&e, &file, 40), "a short block is never cached");

    // A lender that no longer has one of the blocks (12): it joins the span.
    let k12 = e.index().lookup(&e.index().file(file.id()), 12).unwrap();
    e.remote().del_async(vec![k12]);
    wait("block 12 deleted on the lender", || e.remote().get(&[k12], 4096)[0].is_none());
    let (c0, r0, d0) = (counters(), e.remote().counters().snapshot(), backing_bytes());
    assert_eq!(&e.read(&file, 9 * 4096 + 1, 4 * 4096 - 2).unwrap()[..], &data[9 * 4096 + 1..13 * 4096 - 1]);
    let (c, r) = (counters(), e.remote().counters().snapshot());
    assert_eq!((c.partial_hits - c0.partial_hits, c.partial_disk_blocks - c0.partial_disk_blocks), (1, 3));
    assert_eq!((r.hits - r0.hits, r.misses - r0.misses), (1, 1), "9 served, 12 missed");
    assert_eq!(backing_bytes() - d0, 3 * 4096);
    // (Under the same key: nothing was written, so the key still names these bytes.)
    wait("block 12 refilled", || e.index().lookup(&e.index().file(file.id()), 12) == Some(k12));

    // When the lenders lost every block asked of them, it is a disk read: block 16 read
    // beside the fetch, the lost block 15 after it.
    let k15 = e.index().lookup(&e.index().file(file.id()), 15).unwrap();
    e.remote().del_async(vec![k15]);
    wait("block 15 deleted on the lender", || e.remote().get(&[k15], 4096)[0].is_none());
    let (c0, d0) = (counters(), backing_bytes());
    assert_eq!(&e.read(&file, 15 * 4096, 8192).unwrap()[..], &data[15 * 4096..17 * 4096]);
    let c = counters();
    assert_eq!((c.partial_hits - c0.partial_hits, c.disk_reads - c0.disk_reads), (0, 1));
    assert_eq!(backing_bytes() - d0, 2 * 4096);

    // A lost block beside the span known before the fetch: one more disk read for it, the
    // other held block from the lender. Blocks 27..=33: 27, 30 and 33 held, 27 lost; the span
    // is 28..=32 (30 inside it).
    let k27 = e.index().lookup(&e.index().file(file.id()), 27).unwrap();
    e.remote().del_async(vec![k27]);
    wait("block 27 deleted on the lender", || e.remote().get(&[k27], 4096)[0].is_none());
    let (c0, d0) = (counters(), backing_bytes());
    assert_eq!(&e.read(&file, 27 * 4096 + 5, 7 * 4096 - 10).unwrap()[..], &data[27 * 4096 + 5..34 * 4096 - 5]);
    let c = counters();
    assert_eq!((c.partial_hits - c0.partial_hits, c.partial_overlapped - c0.partial_overlapped), (1, 1));
    assert_eq!(
        (c.partial_remote_blocks - c0.partial_remote_blocks, c.partial_disk_blocks - c0.partial_disk_blocks),
        (1, 6),
        "33 from the lender; the span 28..=32, then 27"
    );
    assert_eq!(backing_bytes() - d0, 6 * 4096);
}

/// Reads of every size and alignment, interleaved with page writes and lost copies, against
/// the bytes on the disk: whole hits, partial hits and misses all assemble exactly.
#[test]
fn random_reads_and_writes_read_the_disks_bytes() {
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let size = 200 * 4096 + 777;
    let mut data = pattern(size, 9);
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    let mut x = 11u64;
    let mut next = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        x >> 33
    };
    for step in 0..3000 {
        match next() % 10 {
            0 => {
                let off = next() % (size as u64 - 100);
                let len = (1 + next() % 9000).min(size as u64 - off) as usize;
                let bytes: Vec<u8> = (0..len).map(|i| (step + i) as u8).collect();
                e.write(&file, off, &bytes).unwrap();
                data[off as usize..off as usize + len].copy_from_slice(&bytes);
            }
            1 => {
                // A lender loses a copy.
                let b = next() % 200;
                if let Some(k) = e.index().lookup(&e.index().file(file.id()), b) {
                    e.remote().del_async(vec![k]);
                }
            }
            _ => {
                let off = next() % (size as u64 + 100);
                let len = 1 + (next() % (31 * 4096)) as usize;
                let got = e.read(&file, off, len).unwrap();
                let want = &data[(off as usize).min(size)..(off as usize + len).min(size)];
                assert!(got[..] == *want, "step {step}: read of {len} at {off}");
            }
        }
        if step % 500 == 0 {
            wait("fills", || common::fills_settled(&e));
        }
    }
    let c = e.counters().snapshot();
    assert!(c.partial_hits > 0 && c.remote_reads > 0 && c.disk_reads > 0, "{c:?}");
}

#[test]
fn a_small_miss_reads_and_fills_its_aligned_window_and_stays_exact() {
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let mut data = pattern(64 * 4096 + 100, 31);
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]).with_read_around(8);
    wait("connection", || e.remote().connected() == 1);
    let puts = || e.remote().counters().puts.load(Ordering::Relaxed);
    // Block 13 misses: blocks 8..=15 are read from the disk in one read, all eight filled.
    assert_eq!(&e.read(&file, 13 * 4096 + 5, 100).unwrap()[..], &data[13 * 4096 + 5..13 * 4096 + 105]);
    wait("8 fills", || puts() == 8 && e.index().remote_blocks() == 8);
    assert_eq!(e.counters().read_arounds.load(Ordering::Relaxed), 1);
    assert_eq!(e.disk().backing_counters().unwrap().reads_direct, 1);
    // Its neighbours are lender hits now, with no disk read.
    for b in [8u64, 9, 12, 14, 15] {
        let o = (b * 4096) as usize;
        assert_eq!(&e.read(&file, b * 4096, 4096).unwrap()[..], &data[o..o + 4096], "block {b}");
    }
    assert_eq!(e.counters().remote_reads.load(Ordering::Relaxed), 5);
    assert_eq!(e.disk().backing_counters().unwrap().reads_direct, 1);
    // A write into the window retires only what it touched; the next read of that block
    // is the new bytes (from the disk), its neighbours still hits.
    e.write(&file, 9 * 4096 + 10, &[0x5A; 50]).unwrap();
    data[9 * 4096 + 10..9 * 4096 + 60].fill(0x5A);
    assert_eq!(&e.read(&file, 9 * 4096, 4096).unwrap()[..], &data[9 * 4096..10 * 4096]);
    assert_eq!(&e.read(&file, 10 * 4096, 4096).unwrap()[..], &data[10 * 4096..11 * 4096]);
    // A window that runs past the end of the file: the short tail is never cached, the
    // answer is exact.
    assert_eq!(&e.read(&file, 60 * 4096, 4096).unwrap()[..], &data[60 * 4096..61 * 4096]);
    assert_eq!(&e.read(&file, 64 * 4096, 4096).unwrap()[..], &data[64 * 4096..]);
    wait("fills settle", || common::fills_settled(&e));
    assert!(e.index().lookup(&e.index().file(file.id()), 64).is_none(), "short tail cached");
    // A read as large as the window, or across two windows, reads only itself.
    let before = e.counters().read_arounds.load(Ordering::Relaxed);
    assert_eq!(&e.read(&file, 23 * 4096, 8192).unwrap()[..], &data[23 * 4096..25 * 4096]);
    assert_eq!(&e.read(&file, 32 * 4096, 8 * 4096).unwrap()[..], &data[32 * 4096..40 * 4096]);
    assert_eq!(e.counters().read_arounds.load(Ordering::Relaxed), before);
}
