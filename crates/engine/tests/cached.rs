//! The cache engine against a real lender (the server library on loopback, in this process):
//! reads are served from the lender after a fill, every read returns the disk's bytes, writes
//! make old copies unreachable, and a stopped lender only costs misses.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{backing, wait, Lender};
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
    // 5. A write into block 0 retires chunk 0 (blocks 0..=63): ten cached keys.
    e.write(&file, 10, &[0xAB; 100]).unwrap();
    data[10..110].fill(0xAB);
    assert_eq!(e.index().remote_blocks(), 0);
    // 6. Block 0 again: the disk, and one fill.
    assert_eq!(&e.read(&file, 0, 4096).unwrap()[..], &data[..4096]);
    wait("11 fills", || puts() == 11 && e.index().remote_blocks() == 1);

    let s = e.stats();
    assert_eq!(
        s.remote,
        RemoteCountersSnapshot {
            gets: 8,
            hits: 8,
            misses: 0,
            bytes_from_servers: 8 * 4096,
            puts: 11,
            puts_dropped: 0,
            puts_failed: 0,
            bytes_to_servers: 11 * 4096,
            invalidations: 10,
            invalidations_dropped: 0,
            fallbacks: 0,
            rejected: 0,
            connects: 1,
            connect_failures: 0,
            auth_failures: 0,
        }
    );
    assert_eq!(
        s.engine,
        EngineCountersSnapshot {
            remote_reads: 8,
            sequential_bypasses: 1,
            disk_reads: 10,
            fills: 11,
            adaptive_remote: 0,
            adaptive_disk: 0,
            adaptive_probes: 0,
            changed_behind: 0,
        }
    );
    assert_eq!(s.index.remote_blocks, 1);
    assert!(s.index.memory_bytes > 0);
    assert_eq!(s.index, IndexStats::new(s.index.memory_bytes, 1));
    assert_eq!(s.index.bytes_per_gib_cached, s.index.memory_bytes * 262_144);
    assert_eq!((s.routing.mode.as_str(), s.routing.threshold_bytes), ("threshold", 128 << 10));
    assert!(s.routing.adaptive.is_none());
    assert_eq!(s.lenders.len(), 1);
    let l = &s.lenders[0];
    assert_ne!(l.instance_id, 0);
    assert_eq!(
        l,
        &LenderStatus {
            addr: lender.addr,
            connected: true,
            instance_id: l.instance_id,
            connects: 1,
            hits: 8,
            misses: 0,
            puts: 11
        }
    );
    // Disk reads: 8 single blocks, the 64 KiB the large read found, 2 blocks, 1 block.
    assert_eq!(s.backing.reads_direct + s.backing.reads_buffered, 11);
    assert_eq!(s.backing.read_bytes, (8 + 16 + 2 + 1) * 4096);
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
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    e.opened(&file);
    for b in 0..16u64 {
        e.read(&file, b * 4096, 4096).unwrap();
    }
    wait("fills", || e.index().remote_blocks() == 16);
    // The mount's own write is not a change behind its back: reopening keeps the cache.
    e.write(&file, 0, &data[..100]).unwrap();
    // (The write gave its whole 64-block chunk a new version: read it all back in.)
    wait("refill", || {
        for b in 0..16u64 {
            e.read(&file, b * 4096, 4096).unwrap();
        }
        e.index().remote_blocks() == 16
    });
    e.opened(&file);
    assert_eq!(e.counters().changed_behind.load(Ordering::Relaxed), 0);
    assert_eq!(e.index().remote_blocks(), 16);
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

#[test]
fn the_mounts_own_writes_on_other_handles_are_never_taken_for_changes_behind_its_back() {
    use farcache_engine::{BackingFile, BackingOptions, Identities};
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(1 << 20, 9);
    let writer = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    e.opened(&writer);
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
                let f = std::fs::File::open(dir.path().join("f")).unwrap();
                let id = Identities::new().identify(&f).unwrap();
                let b = BackingFile::new(id, f, libc::O_RDONLY, &BackingOptions { direct_io: true });
                e.opened(&b);
                e.read(&b, (opens % 256) * 4096, 4096).unwrap();
                opens += 1;
            }
        });
    });
    assert_eq!(e.counters().changed_behind.load(Ordering::Relaxed), 0, "own writes taken for foreign changes");
}
