//! The write-back layer against a model of the file: random writes (partial blocks,
//! extensions), truncates, reads, fsyncs, flushes, crashes (the layer dropped without a
//! flush) and recoveries, with a tier small enough to fill.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::identity::Identities;
use crate::DirectPath;

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
    tier: PathBuf,
    ids: Identities,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("backing");
    std::fs::create_dir(&root).unwrap();
    let root = root.canonicalize().unwrap();
    let tier = dir.path().join("tier");
    Env { _dir: dir, root, tier, ids: Identities::new() }
}

fn cfg(env: &Env, size: u64) -> TierConfig {
    TierConfig {
        path: env.tier.display().to_string(),
        size: farcache_config::ByteSize(size),
        mode: TierMode::Dram,
        // Nothing destages by itself unless a test asks.
        max_dirty_age: farcache_config::HumanDuration::secs(3600),
        idle_destage_after: farcache_config::HumanDuration::ms(0),
        ..TierConfig::default()
    }
}

fn open_tier(env: &Env, c: &TierConfig) -> WritebackPath<DirectPath> {
    WritebackPath::open(DirectPath::new(), c, &env.root, BackingOptions { direct_io: false, direct_writes: false })
        .unwrap()
}

fn open_file(env: &Env, name: &str) -> BackingFile {
    let p = env.root.join(name);
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p).unwrap();
    let id = env.ids.identify(&f).unwrap();
    BackingFile::new(id, f, libc::O_RDWR, &BackingOptions { direct_io: false, direct_writes: false })
}

fn on_disk(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

fn read_all<D: DataPath>(t: &WritebackPath<D>, f: &BackingFile, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < len {
        let n = (len - out.len()).min(1 << 20);
        let b = t.read(f, out.len() as u64, n).unwrap();
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    out
}

/// The path below a tier in these tests: a `DirectPath` with switches a test flips to fail
/// writes or syncs, and counts of what reached it.
struct Hooked {
    inner: DirectPath,
    /// Writes fail with ENOSPC while set.
    refuse_writes: AtomicBool,
    /// Syncs fail with EIO while set.
    fail_sync: AtomicBool,
    /// `sync_fs` calls.
    fs_syncs: AtomicU64,
    /// The write of this number (counting from 1) fails with EIO; 0: none.
    fail_write_at: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    /// Each write takes this many milliseconds more (a slow disk).
    write_delay_ms: AtomicU64,
}

impl Hooked {
    fn new() -> Hooked {
        Hooked {
            inner: DirectPath::new(),
            refuse_writes: false.into(),
            fail_sync: false.into(),
            fs_syncs: 0.into(),
            fail_write_at: 0.into(),
            reads: 0.into(),
            writes: 0.into(),
            write_delay_ms: 0.into(),
        }
    }
}

impl DataPath for Hooked {
    fn read(&self, f: &BackingFile, o: u64, l: usize) -> io::Result<Bytes> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read(f, o, l)
    }
    fn write(&self, f: &BackingFile, o: u64, d: &[u8]) -> io::Result<usize> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if self.refuse_writes.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        if n == self.fail_write_at.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        std::thread::sleep(Duration::from_millis(self.write_delay_ms.load(Ordering::SeqCst)));
        self.inner.write(f, o, d)
    }
    fn set_len(&self, f: &BackingFile, s: u64) -> io::Result<()> {
        self.inner.set_len(f, s)
    }
    fn fallocate(&self, f: &BackingFile, m: i32, o: u64, l: u64) -> io::Result<()> {
        self.inner.fallocate(f, m, o, l)
    }
    fn fsync(&self, f: &BackingFile, d: bool) -> io::Result<()> {
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.fsync(f, d)
    }
    fn sync_fs(&self, fs: &File) -> io::Result<()> {
        self.fs_syncs.fetch_add(1, Ordering::SeqCst);
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.sync_fs(fs)
    }
    fn forget(&self, id: &FileId) {
        self.inner.forget(id)
    }
}

#[test]
fn writes_are_served_from_the_tier_and_reach_the_disk_on_flush() {
    let env = env();
    let t = open_tier(&env, &cfg(&env, 8 << 20));
    let f = open_file(&env, "a");
    t.write(&f, 5000, b"hello").unwrap();
    t.write(&f, 0, &[7u8; 4096]).unwrap();
    t.fsync(&f, true).unwrap();
    assert_eq!(t.stats().fsyncs_absorbed, 0, "the first fsync after the tier met the file reaches the disk");
    t.write(&f, 0, &[7u8; 4096]).unwrap();
    t.fsync(&f, true).unwrap();
    assert_eq!(t.stats().fsyncs_absorbed, 1, "later ones cost nothing");
    // The size is on the disk at once; the data only in the tier.
    assert_eq!(f.file().metadata().unwrap().len(), 5005);
    assert!(on_disk(&env.root.join("a")).iter().all(|&b| b == 0));
    let mut want = vec![7u8; 4096];
    want.resize(5000, 0);
    want.extend_from_slice(b"hello");
    assert_eq!(read_all(&t, &f, 6000), want);
    t.flush(Duration::from_secs(10), &mut |_| {}).unwrap();
    assert_eq!(on_disk(&env.root.join("a")), want);
    let s = t.stats();
    assert_eq!((s.log.dirty_blocks, s.destaged_blocks), (0, 2));
    assert!(marker::read(&env.root).unwrap().is_some());
    assert!(t.shutdown(Duration::from_secs(10)));
    assert!(marker::read(&env.root).unwrap().is_none(), "a clean shutdown removes the marker");
}

#[test]
fn a_tier_has_one_user_at_a_time() {
    let env = env();
    let c = cfg(&env, 8 << 20);
    let t = open_tier(&env, &c);
    assert!(tier_in_use(&env.tier));
    let e = WritebackPath::open(
        DirectPath::new(),
        &c,
        &env.root,
        BackingOptions { direct_io: false, direct_writes: false },
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("another process uses this tier") && e.to_string().contains("fix:"), "{e}");
    drop(t);
    assert!(!tier_in_use(&env.tier));
}

#[test]
fn a_crash_loses_nothing_acknowledged_and_recovery_writes_it_back() {
    let env = env();
    let c = cfg(&env, 8 << 20);
    let t = open_tier(&env, &c);
    let f = open_file(&env, "a");
    t.write(&f, 0, &[1u8; 10000]).unwrap();
    t.write(&f, 4096, &[2u8; 100]).unwrap();
    t.set_len(&f, 9000).unwrap();
    let g = open_file(&env, "gone");
    t.write(&g, 0, &[3u8; 4096]).unwrap();
    std::fs::remove_file(env.root.join("gone")).unwrap();
    drop(t); // a crash: nothing destaged
    assert_eq!(marker::check(&env.root, ""), Err(marker::check(&env.root, "").unwrap_err()));
    assert!(marker::check(&env.root, "").unwrap_err().contains("--tier"));
    let t = open_tier(&env, &c);
    let s = t.stats();
    assert_eq!(s.recovered.files, 2);
    let mut want = vec![1u8; 9000];
    want[4096..4196].fill(2);
    // Served at once (from the tier, where the destager has not written it back yet).
    let f = open_file(&env, "a");
    assert_eq!(read_all(&t, &f, 20000), want);
    t.flush(Duration::from_secs(10), &mut |_| {}).unwrap();
    assert_eq!(t.stats().log.dirty_blocks, 0, "recovery writes everything back");
    assert_eq!(on_disk(&env.root.join("a")), want);
    assert!(!env.root.join("gone").exists(), "a deleted file is not brought back");
}

#[test]
fn random_operations_match_a_model_through_crashes_and_a_full_tier() {
    let env = env();
    // 1 MiB tier: 254 ring pages, fills quickly; writes then go through.
    let c = cfg(&env, 1 << 20);
    random_operations(&env, c);
}

/// The same on an ssd tier, whose long streams go to the disk (`sequential_cutoff`).
#[test]
fn random_operations_and_streams_past_an_ssd_tier_match_a_model() {
    let Some((_dir, env, c)) = ssd_env(1 << 20) else { return };
    random_operations(&env, c);
}

fn random_operations(env: &Env, mut c: TierConfig) {
    let ssd = c.mode == TierMode::Ssd;
    c.high_watermark = 95;
    c.low_watermark = 90;
    // Sequential runs past 64 KiB go to the disk (unless over dirty blocks).
    c.sequential_cutoff = farcache_config::ByteSize::kib(64);
    let mut seed = 0x1234_5678_9abc_def1u64 ^ u64::from(std::process::id());
    let start = seed;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n.max(1)
    };
    let mut model: Vec<u8> = Vec::new();
    let mut t = open_tier(env, &c);
    let mut f = open_file(env, "m");
    let mut tag = 1u8;
    let (mut through, mut tiered, mut streamed) = (0, 0, 0);
    let mut next = 0u64;
    for step in 0..600 {
        match rnd(100) {
            0..=69 => {
                // Half of the writes continue the last one (a stream).
                let off = if rnd(2) == 0 && next < 800_000 { next } else { rnd(600_000) };
                let big = rnd(4) == 0;
                let len = 1 + rnd(if big { 200_000 } else { 9000 }) as usize;
                tag = tag.wrapping_add(1).max(1);
                let data: Vec<u8> = (0..len).map(|i| tag ^ (i as u8)).collect();
                t.write(&f, off, &data).unwrap();
                next = off + len as u64;
                let end = off as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            70..=73 => {
                let size = rnd(model.len() as u64 + 10_000) as usize;
                t.set_len(&f, size as u64).unwrap();
                model.resize(size, 0);
            }
            74..=89 => {
                let off = rnd(model.len() as u64 + 5000);
                let len = 1 + rnd(300_000) as usize;
                let got = t.read(&f, off, len).unwrap();
                let lo = (off as usize).min(model.len());
                let hi = (off as usize + len).min(model.len());
                assert_eq!(&got[..], &model[lo..hi], "step {step} read {off}+{len} (seed {start:#x})");
            }
            90..=95 => t.fsync(&f, rnd(2) == 0).unwrap(),
            96..=97 => t.flush(Duration::from_secs(30), &mut |_| {}).unwrap(),
            _ => {
                // Crash and recover: drop without flushing, reopen, check the disk.
                through += t.stats().write_through_full;
                tiered += t.stats().writes;
                streamed += t.stats().write_through_sequential;
                drop(f);
                drop(t);
                t = open_tier(env, &c);
                f = open_file(env, "m");
                let got = read_all(&t, &f, model.len() + 10);
                assert!(got == model, "read after recovery at step {step} (seed {start:#x})");
                if rnd(2) == 0 {
                    t.flush(Duration::from_secs(30), &mut |_| {}).unwrap();
                    assert!(
                        on_disk(&env.root.join("m")) == model,
                        "disk after recovery at step {step} (seed {start:#x})"
                    );
                }
            }
        }
    }
    assert_eq!(read_all(&t, &f, model.len() + 10), model);
    let s = t.stats();
    assert!(through + s.write_through_full > 0, "the tier never filled: {s:?}");
    assert!(tiered + s.writes > 0);
    let streamed = streamed + s.write_through_sequential;
    assert_eq!(streamed > 0, ssd, "streams past the tier: {streamed} (an ssd tier: {ssd}) {s:?}");
    t.flush(Duration::from_secs(30), &mut |_| {}).unwrap();
    assert_eq!(on_disk(&env.root.join("m")), model);
}

#[test]
fn a_long_unsynced_stream_goes_to_the_disk_and_one_that_syncs_stays_in_the_tier() {
    let Some((_dir, env, c)) = ssd_env(64 << 20) else { return };
    assert_eq!(c.sequential_cutoff.bytes(), 4 << 20, "the default this test is written for");
    const W: usize = 256 << 10;
    {
        // A dram tier takes the whole stream.
        let dram = tempfile::tempdir().unwrap();
        let d = TierConfig { path: dram.path().join("t").display().to_string(), mode: TierMode::Dram, ..c.clone() };
        let t = open_tier(&env, &d);
        let f = open_file(&env, "dram");
        for i in 0..32u64 {
            t.write(&f, i * W as u64, &[5u8; W]).unwrap();
        }
        let s = t.stats();
        assert_eq!((s.writes, s.write_through_sequential), (32, 0), "{s:?}");
        t.flush(Duration::from_secs(30), &mut |_| {}).unwrap();
    }
    let t = open_tier(&env, &c);
    let stream = |f: &BackingFile, from: u64, bytes: usize, tag: u8, sync: bool| {
        for i in 0..bytes / W {
            t.write(f, from + (i * W) as u64, &vec![tag.wrapping_add(i as u8); W]).unwrap();
            if sync {
                t.fsync(f, true).unwrap();
            }
        }
    };
    let expect = |from: usize, bytes: usize, tag: u8| -> Vec<u8> {
        (0..bytes).map(|i| tag.wrapping_add(((from + i) / W) as u8)).collect()
    };
    // 8 MiB without a sync: the first 4 MiB in the tier, the rest on the disk at once.
    let a = open_file(&env, "a");
    stream(&a, 0, 8 << 20, 1, false);
    let s = t.stats();
    assert_eq!((s.writes, s.write_through_sequential), (16, 16), "{s:?}");
    assert_eq!(s.write_through_sequential_bytes, 4 << 20);
    assert_eq!(s.log.dirty_blocks, 1024, "{s:?}");
    let disk = on_disk(&env.root.join("a"));
    assert!(disk[..4 << 20].iter().all(|&b| b == 0), "the tier's part is not on the disk yet");
    assert_eq!(&disk[4 << 20..], &expect(4 << 20, 4 << 20, 1)[..]);
    assert_eq!(read_all(&t, &a, 9 << 20), expect(0, 8 << 20, 1));
    // The same with an fsync after each write (a database's log): all of it in the tier.
    let b = open_file(&env, "b");
    stream(&b, 0, 8 << 20, 2, true);
    let s2 = t.stats();
    assert_eq!((s2.writes - s.writes, s2.write_through_sequential), (32, 16), "{s2:?}");
    // A stream across blocks dirty in the tier keeps them there (an older record must not win
    // over the disk at recovery), and goes to the disk again past them.
    let c_ = open_file(&env, "c");
    t.write(&c_, 5 << 20, &vec![9u8; 1 << 20]).unwrap();
    stream(&c_, 0, 8 << 20, 3, false);
    let s3 = t.stats();
    assert_eq!(s3.write_through_sequential - s2.write_through_sequential, 12, "{s3:?}: 4..5 and 6..8 MiB");
    assert_eq!(read_all(&t, &c_, 9 << 20), expect(0, 8 << 20, 3));
    // A crash: recovery replays the tier's records, and each is the newest of its blocks.
    drop((a, b, c_));
    drop(t);
    let t = open_tier(&env, &c);
    for (name, tag) in [("a", 1), ("b", 2), ("c", 3)] {
        let f = open_file(&env, name);
        assert!(read_all(&t, &f, 9 << 20) == expect(0, 8 << 20, tag), "{name} after recovery");
    }
    t.flush(Duration::from_secs(30), &mut |_| {}).unwrap();
    for (name, tag) in [("a", 1), ("b", 2), ("c", 3)] {
        assert!(on_disk(&env.root.join(name)) == expect(0, 8 << 20, tag), "{name} on the disk");
    }
}

/// Past 50% of a ~2 MiB tier (each 4 KiB write costs a data and a header page): 200 blocks
/// of `f` from block `from`, block `from + i` holding the byte `i`.
fn write_past_half<D: DataPath>(t: &WritebackPath<D>, f: &BackingFile, from: u64) {
    for i in 0..200u64 {
        t.write(f, (from + i) * 4096, &[i as u8; 4096]).unwrap();
    }
}

#[test]
fn destage_starts_at_the_high_watermark_and_by_age() {
    let env = env();
    let mut c = cfg(&env, 2 << 20);
    c.destage_interval = farcache_config::HumanDuration::ms(10);
    let t = open_tier(&env, &c);
    let f = open_file(&env, "w");
    write_past_half(&t, &f, 0);
    let t0 = std::time::Instant::now();
    loop {
        let s = t.stats();
        if s.log.used_bytes <= s.log.capacity_bytes / 2 {
            assert!(s.log.freed_batches > 0 && s.destaged_blocks > 0, "{s:?}");
            assert!(s.log.dirty_blocks > 0, "stops at the low watermark, not everything: {s:?}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no destage past the high watermark: {s:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(t);
    // By age: a young tier with an old block.
    let mut c2 = cfg(&env, 8 << 20);
    c2.destage_interval = farcache_config::HumanDuration::ms(10);
    c2.max_dirty_age = farcache_config::HumanDuration::ms(200);
    let t = open_tier(&env, &c2);
    t.write(&f, 0, &[9u8; 4096]).unwrap();
    let t0 = std::time::Instant::now();
    while t.stats().log.dirty_blocks > 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "an old block was never destaged");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(&on_disk(&env.root.join("w"))[..4096], &[9u8; 4096][..]);
}

/// A write past the high watermark wakes the destager itself: with a destage interval of an
/// hour, only the kick can start the round. Twice, so that a kick flag left set (or cleared
/// too early) by the first wake-up shows as a second round that never starts.
#[test]
fn a_write_past_the_high_watermark_wakes_the_destager_each_time() {
    let env = env();
    let mut c = cfg(&env, 2 << 20);
    c.destage_interval = farcache_config::HumanDuration::secs(3600);
    let t = open_tier(&env, &c);
    let f = open_file(&env, "k");
    std::thread::sleep(Duration::from_millis(50)); // the destager waits by now
    for cycle in 0..2u64 {
        let before = t.stats().destage_rounds;
        write_past_half(&t, &f, cycle * 200);
        let t0 = std::time::Instant::now();
        loop {
            let s = t.stats();
            if s.destage_rounds > before && s.log.used_bytes <= s.log.capacity_bytes / 2 {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "cycle {cycle}: the kick did not start a round: {s:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    t.flush(Duration::from_secs(10), &mut |_| {}).unwrap();
    assert_eq!(t.stats().log.dirty_blocks, 0);
    assert_eq!(&on_disk(&env.root.join("k"))[399 * 4096..400 * 4096], &[199u8; 4096][..]);
}

/// A write-back of more than one batch: scattered single blocks (more runs than a batch
/// takes), long runs (more bytes than a batch takes) and a partial last block, on a backing
/// written direct and on one written buffered — every byte on the disk after the flush.
#[test]
fn a_write_back_of_many_batches_lands_every_byte() {
    for direct_writes in [false, true] {
        let env = env();
        let mut c = cfg(&env, 64 << 20);
        // The destager looks often, so it has seen the mount quiet before the flush.
        c.destage_interval = farcache_config::HumanDuration::ms(5);
        let t =
            WritebackPath::open(DirectPath::new(), &c, &env.root, BackingOptions { direct_io: true, direct_writes })
                .unwrap();
        let f = open_file(&env, "many");
        let mut model = vec![0u8; 0];
        let mut put = |t: &WritebackPath<DirectPath>, off: u64, data: &[u8]| {
            t.write(&f, off, data).unwrap();
            let end = off as usize + data.len();
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(data);
        };
        // 600 scattered blocks (every other one of the first 1,200).
        for i in 0..600u64 {
            put(&t, i * 2 * 4096, &[(i % 251) as u8 + 1; 4096]);
        }
        // 6 MiB contiguous after them, in 1 MiB writes, then a partial block at the end.
        let base = 1200 * 4096;
        for m in 0..6u64 {
            let data: Vec<u8> = (0..1 << 20).map(|j: u64| (j / 4096 + m * 7) as u8).collect();
            put(&t, base + (m << 20), &data);
        }
        put(&t, base + (6 << 20), &[9u8; 1000]);
        std::thread::sleep(Duration::from_millis(100));
        t.flush(Duration::from_secs(30), &mut |_| {}).unwrap();
        assert_eq!(t.stats().log.dirty_blocks, 0, "direct_writes {direct_writes}");
        assert!(on_disk(&env.root.join("many")) == model, "direct_writes {direct_writes}: the disk differs");
        // The mount was quiet: batches went all at once.
        assert!(t.stats().destage_batches_deep > 0, "direct_writes {direct_writes}: {:?}", t.stats());
    }
}

/// An `ssd` tier of `size` bytes in a directory of the source tree (a disk file system), and
/// that directory; `None` (the test skips, saying so) where the tree is not on one.
fn ssd_env(size: u64) -> Option<(tempfile::TempDir, Env, TierConfig)> {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let tier = dir.path().join("tier");
    if farcache_tier::detect(&tier).unwrap() != Mode::Ssd {
        eprintln!("skipped: the source tree is not on a disk file system (no O_DIRECT)");
        return None;
    }
    let mut env = env();
    env.tier = tier;
    let mut c = cfg(&env, size);
    c.mode = TierMode::Ssd;
    Some((dir, env, c))
}

/// An `ssd` tier (a file on a disk file system, read `O_DIRECT`) hands the write-back's reads
/// of a file's dirty blocks to the mount's I/O engine together: blocks written in random
/// order lie on pages far apart, and were read one `pread` after another (session 29: 9 s to
/// flush 512 MiB). Every byte lands; the tier's reads show in the engine's counters.
#[test]
fn an_ssd_tiers_scattered_blocks_are_read_through_the_io_engine_for_the_write_back() {
    let Some((_dir, env, c)) = ssd_env(64 << 20) else { return };
    let io = Arc::new(crate::IoEngine::default());
    let t = WritebackPath::open(
        DirectPath::with_io(io.clone()),
        &c,
        &env.root,
        BackingOptions { direct_io: false, direct_writes: false },
    )
    .unwrap();
    let f = open_file(&env, "scattered");
    // 1,000 blocks in a scrambled order (7 is coprime to 1,000), each its own pattern.
    let n = 1000u64;
    let mut model = vec![0u8; (n * 4096) as usize];
    for i in 0..n {
        let b = (i * 7 + 3) % n;
        let data: Vec<u8> = (0..4096u64).map(|j| (b * 13 + j) as u8).collect();
        t.write(&f, b * 4096, &data).unwrap();
        model[(b * 4096) as usize..((b + 1) * 4096) as usize].copy_from_slice(&data);
    }
    let reads = |s: &crate::io::IoCountersSnapshot| s.ops_uring + s.ops_sync - s.write_ops - s.sync_ops;
    let before = reads(&io.counters().snapshot());
    t.flush(Duration::from_secs(30), &mut |_| {}).unwrap();
    assert_eq!(t.stats().log.dirty_blocks, 0);
    assert!(on_disk(&env.root.join("scattered")) == model, "the disk differs");
    // Nothing read the backing file: the engine's reads were the tier's, at least one per
    // 64 blocks (a chunk of `Log::read_blocks`), and no more than one per block.
    let tier_reads = reads(&io.counters().snapshot()) - before;
    assert!((n / 64..=n).contains(&tier_reads), "{tier_reads} reads of the tier through the engine for {n} blocks");
}

/// A write-back beside an application's writes goes a few writes at a time (the batches at
/// full depth are counted): the same file as above, flushed while another file is written
/// in a loop.
#[test]
fn a_write_back_beside_a_writer_goes_a_few_writes_at_a_time() {
    let env = env();
    let c = cfg(&env, 64 << 20);
    let t = open_tier(&env, &c);
    let f = open_file(&env, "many");
    for i in 0..600u64 {
        t.write(&f, i * 2 * 4096, &[(i % 251) as u8 + 1; 4096]).unwrap();
    }
    for m in 0..6u64 {
        t.write(&f, 1200 * 4096 + (m << 20), &vec![m as u8 + 1; 1 << 20]).unwrap();
    }
    let g = open_file(&env, "busy");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let deep = std::thread::scope(|sc| {
        let w = sc.spawn(|| {
            let mut i = 0u64;
            // Bounded: stops when told, or after 60 s.
            let t0 = std::time::Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(60) {
                t.write(&g, (i % 64) * 4096, &[i as u8; 4096]).unwrap();
                i += 1;
            }
            i
        });
        std::thread::sleep(Duration::from_millis(20));
        let before = t.stats().destage_batches_deep;
        t.flush(Duration::from_secs(30), &mut |_| {}).unwrap();
        let deep = t.stats().destage_batches_deep - before;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(w.join().unwrap() > 0);
        deep
    });
    // At least 5 batches went down (601 runs, 8.3 MiB); one may have found the writer
    // descheduled for its whole length on a loaded machine.
    assert!(deep <= 1, "{deep} batches at full depth beside a writer: {:?}", t.stats());
    let mut want = vec![0u8; 1200 * 4096 + (6 << 20)];
    for i in 0..600usize {
        want[i * 2 * 4096..(i * 2 + 1) * 4096].fill((i % 251) as u8 + 1);
    }
    for m in 0..6usize {
        want[1200 * 4096 + (m << 20)..1200 * 4096 + ((m + 1) << 20)].fill(m as u8 + 1);
    }
    assert!(on_disk(&env.root.join("many")) == want, "the disk differs");
}

#[test]
fn an_idle_mount_destages_everything_and_a_busy_one_does_not() {
    let env = env();
    let mut c = cfg(&env, 8 << 20);
    c.destage_interval = farcache_config::HumanDuration::ms(10);
    c.idle_destage_after = farcache_config::HumanDuration::ms(500);
    let t = open_tier(&env, &c);
    let f = open_file(&env, "idle");
    // Busy: a write every 50 ms for a second keeps the block dirty (far below the watermark,
    // far younger than max_dirty_age).
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(1) {
        t.write(&f, 0, &[1u8; 4096]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(t.stats().destaged_blocks, 0, "nothing destaged while the mount was busy");
    // Idle: everything goes, bounded.
    let t0 = std::time::Instant::now();
    while t.stats().log.dirty_blocks > 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "an idle mount never destaged: {:?}", t.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(on_disk(&env.root.join("idle")), vec![1u8; 4096]);
}

#[test]
fn a_backing_that_refuses_writes_keeps_the_data_dirty_and_says_so() {
    let env = env();
    let mut c = cfg(&env, 8 << 20);
    c.retry_min = farcache_config::HumanDuration::ms(10);
    let inner = Arc::new(Hooked::new());
    inner.refuse_writes.store(true, Ordering::Relaxed);
    let t =
        WritebackPath::open(inner.clone(), &c, &env.root, BackingOptions { direct_io: false, direct_writes: false })
            .unwrap();
    let f = open_file(&env, "x");
    t.write(&f, 0, &[5u8; 8192]).unwrap();
    let e = t.flush(Duration::from_secs(10), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("No space left") || e.to_string().contains("os error 28"), "{e}");
    let s = t.stats();
    assert!(s.destage_errors > 0 && s.last_destage_error.is_some() && s.log.dirty_blocks == 2, "{s:?}");
    assert_eq!(&t.read(&f, 0, 8192).unwrap()[..], &[5u8; 8192][..], "reads still see the data");
    // The writes go through but the sync fails: nothing may be freed (the disk may not have it).
    inner.refuse_writes.store(false, Ordering::Relaxed);
    inner.fail_sync.store(true, Ordering::Relaxed);
    let e = t.flush(Duration::from_secs(10), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("Input/output error"), "{e}");
    assert_eq!(t.stats().log.dirty_blocks, 2, "a record is freed only after the sync that covers it succeeded");
    inner.fail_sync.store(false, Ordering::Relaxed);
    t.flush(Duration::from_secs(10), &mut |_| {}).unwrap();
    assert_eq!(on_disk(&env.root.join("x")), vec![5u8; 8192]);
    let mut whole = File::open(env.root.join("x")).unwrap();
    let mut b = [0u8; 1];
    whole.read_exact_at(&mut b, 8191).unwrap();
    let _ = &mut whole;
}

/// A file of many merged runs is written back in batches (`destage::Writer`; one batch on the
/// reading thread, more through a helper thread): when one of its writes fails, the round
/// fails and frees nothing; the next writes every run. 20 runs (one batch) failing at the
/// 7th write, and 600 (three batches) failing at the 300th, in the helper's batch.
#[test]
fn a_failed_run_among_many_keeps_the_whole_file_dirty_until_a_round_writes_them_all() {
    for (runs, fail_at) in [(20u64, 7u64), (600, 300)] {
        let env = env();
        let mut c = cfg(&env, 16 << 20);
        c.retry_min = farcache_config::HumanDuration::ms(10);
        let inner = Arc::new(Hooked::new());
        inner.fail_write_at.store(fail_at, Ordering::SeqCst);
        let t = WritebackPath::open(
            inner.clone(),
            &c,
            &env.root,
            BackingOptions { direct_io: false, direct_writes: false },
        )
        .unwrap();
        let f = open_file(&env, "x");
        // Blocks 0, 2, 4, ...: runs of one block each; the file ends on the last.
        let mut model = vec![0u8; (2 * runs as usize - 1) * 4096];
        for b in (0..2 * runs).step_by(2) {
            let data = vec![(b % 251) as u8 + 1; 4096];
            t.write(&f, b * 4096, &data).unwrap();
            model[b as usize * 4096..(b as usize + 1) * 4096].copy_from_slice(&data);
        }
        let e = t.flush(Duration::from_secs(10), &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("Input/output error"), "{runs} runs: {e}");
        assert_eq!(t.stats().log.dirty_blocks, runs, "{runs} runs: nothing freed after a failed run");
        assert!(read_all(&t, &f, model.len()) == model, "{runs} runs: reads do not see the data");
        // No more failures: one round writes every run.
        inner.fail_write_at.store(0, Ordering::SeqCst);
        t.flush(Duration::from_secs(10), &mut |_| {}).unwrap();
        assert_eq!(t.stats().log.dirty_blocks, 0);
        assert!(on_disk(&env.root.join("x")) == model, "{runs} runs: the disk lacks a run");
        assert!(
            inner.writes.load(Ordering::SeqCst) >= runs + fail_at,
            "{runs} runs: every run written in the second round"
        );
    }
}

#[test]
fn an_unlinked_file_still_open_reads_its_newest_data() {
    let env = env();
    let t = open_tier(&env, &cfg(&env, 8 << 20));
    let f = open_file(&env, "tmp");
    t.write(&f, 0, &[4u8; 8192]).unwrap();
    std::fs::remove_file(env.root.join("tmp")).unwrap();
    t.forget(f.id());
    assert_eq!(&t.read(&f, 0, 8192).unwrap()[..], &[4u8; 8192][..], "an open handle sees what it wrote");
    t.write(&f, 4096, &[5u8; 10]).unwrap();
    t.flush(Duration::from_secs(10), &mut |_| {}).unwrap();
    let mut want = vec![4u8; 8192];
    want[4096..4106].fill(5);
    assert_eq!(&t.read(&f, 0, 8192).unwrap()[..], &want[..]);
    assert!(t.shared.files.lock().is_empty(), "the entry of an unlinked, clean file goes");
}

#[test]
fn a_deleted_file_nobody_has_open_is_never_written_back() {
    let env = env();
    let c = cfg(&env, 8 << 20);
    let t = open_tier(&env, &c);
    let (f, g) = (open_file(&env, "gone"), open_file(&env, "kept"));
    t.write(&f, 0, &[7u8; 3 * 4096]).unwrap();
    t.write(&g, 0, &[8u8; 4096]).unwrap();
    std::fs::remove_file(env.root.join("gone")).unwrap();
    t.forget(f.id());
    t.discard(f.id());
    let st = t.stats();
    assert_eq!((st.discarded_files, st.discarded_blocks), (1, 3));
    assert_eq!(st.log.dirty_blocks, 1, "only the other file's block is left");
    t.discard(f.id());
    t.discard(g.id());
    assert_eq!(t.stats().discarded_files, 1, "a second call drops nothing, and a file with a name is never dropped");
    assert_eq!(t.stats().log.dirty_blocks, 1);
    t.flush(Duration::from_secs(10), &mut |_| {}).unwrap();
    let st = t.stats();
    assert_eq!(st.destaged_blocks, 1, "the deleted file's blocks were never written back: {st:?}");
    assert_eq!(on_disk(&env.root.join("kept")), vec![8u8; 4096]);
    // The drop is logged: a crash and recovery do not bring the records back.
    drop((f, g));
    drop(t);
    let t = open_tier(&env, &c);
    assert_eq!(t.stats().log.dirty_blocks, 0);
}

#[test]
fn a_hole_punched_in_dirty_data_is_a_hole() {
    let env = env();
    let t = open_tier(&env, &cfg(&env, 8 << 20));
    let f = open_file(&env, "h");
    t.write(&f, 0, &[6u8; 4 * 4096]).unwrap();
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    t.fallocate(&f, mode, 4096, 8192).unwrap();
    let mut want = vec![6u8; 4 * 4096];
    want[4096..3 * 4096].fill(0);
    assert_eq!(&t.read(&f, 0, 4 * 4096).unwrap()[..], &want[..]);
    assert_eq!(t.stats().file_flushes, 1);
    assert_eq!(t.stats().log.dirty_blocks, 0);
    assert_eq!(on_disk(&env.root.join("h")), want);
}

#[test]
fn concurrent_partial_writes_to_shared_blocks_lose_nothing() {
    // Eight threads each own one 512-byte slice of every block of a 16-block file and rewrite
    // it over and over: a read-modify-write that raced another would lose a slice.
    let env = env();
    let mut c = cfg(&env, 4 << 20);
    c.destage_interval = farcache_config::HumanDuration::ms(5);
    c.high_watermark = 10;
    c.low_watermark = 5;
    let t = Arc::new(open_tier(&env, &c));
    let f = Arc::new(open_file(&env, "p"));
    let threads: Vec<_> = (0..8u8)
        .map(|i| {
            let (t, f) = (t.clone(), f.clone());
            std::thread::spawn(move || {
                for round in 1..=30u8 {
                    for b in 0..16u64 {
                        t.write(&f, b * 4096 + u64::from(i) * 512, &[round.wrapping_mul(8).wrapping_add(i); 512])
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let mut want = Vec::new();
    for _ in 0..16 {
        for i in 0..8u8 {
            want.extend_from_slice(&[30u8.wrapping_mul(8).wrapping_add(i); 512]);
        }
    }
    assert!(read_all(&t, &f, 16 * 4096) == want, "a slice was lost");
    t.flush(Duration::from_secs(30), &mut |_| {}).unwrap();
    assert!(on_disk(&env.root.join("p")) == want, "a slice was lost on the way to the disk");
    assert!(t.stats().destage_rounds > 0);
}

#[test]
fn a_crash_after_an_unlink_drops_the_files_records_without_looking_for_it() {
    let env = env();
    let c = cfg(&env, 8 << 20);
    let t = open_tier(&env, &c);
    let f = open_file(&env, "u");
    t.write(&f, 0, &[4u8; 8192]).unwrap();
    // Renamed to a name it will not have at recovery, then a new file takes the old name.
    std::fs::rename(env.root.join("u"), env.root.join("v")).unwrap();
    std::fs::remove_file(env.root.join("v")).unwrap();
    t.forget(f.id());
    std::fs::write(env.root.join("u"), b"another file").unwrap();
    drop(f);
    drop(t); // a crash
    let t = open_tier(&env, &c);
    assert_eq!(t.stats().recovered.files, 1);
    t.flush(Duration::from_secs(10), &mut |_| {}).unwrap();
    assert_eq!(t.stats().log.dirty_blocks, 0);
    assert_eq!(on_disk(&env.root.join("u")), b"another file", "the other file is never written");
}

#[test]
fn recovery_restores_the_size_a_lost_extension_took_away() {
    let env = env();
    let c = cfg(&env, 8 << 20);
    let t = open_tier(&env, &c);
    let f = open_file(&env, "x");
    t.write(&f, 0, &[3u8; 10_000]).unwrap();
    drop(f);
    drop(t); // a crash...
             // ... that lost the size extension too (a power cut before the file system committed it).
    std::fs::OpenOptions::new().write(true).open(env.root.join("x")).unwrap().set_len(0).unwrap();
    let t = open_tier(&env, &c);
    assert_eq!(std::fs::metadata(env.root.join("x")).unwrap().len(), 10_000);
    let f = open_file(&env, "x");
    assert_eq!(read_all(&t, &f, 20_000), vec![3u8; 10_000]);
}

#[test]
fn a_range_the_tier_holds_whole_is_read_from_it_alone() {
    let env = env();
    let inner = Arc::new(Hooked::new());
    let t = WritebackPath::open(
        inner.clone(),
        &cfg(&env, 8 << 20),
        &env.root,
        BackingOptions { direct_io: false, direct_writes: false },
    )
    .unwrap();
    // On the disk first: 16 KiB of 1s; then 8 KiB of 2s over its start, and 100 bytes of 3s
    // into its third block, through the tier.
    std::fs::write(env.root.join("f"), vec![1u8; 16384]).unwrap();
    let f = open_file(&env, "f");
    t.write(&f, 0, &[2u8; 8192]).unwrap();
    t.write(&f, 8192 + 50, &[3u8; 100]).unwrap();
    let reads = || inner.reads.load(Ordering::Relaxed);
    let before = reads();
    // Whole blocks, all dirty: the tier alone.
    assert_eq!(&t.read(&f, 0, 8192).unwrap()[..], &[2u8; 8192][..]);
    assert_eq!(&t.read(&f, 100, 5000).unwrap()[..], &[2u8; 5000][..]);
    assert_eq!(reads(), before, "a range the tier holds whole must not be read from the disk");
    assert_eq!(t.stats().reads_only_from_tier, 2);
    // A range reaching past the tier's blocks, or into a block it holds only partly: the disk
    // supplies the rest, and the tier's bytes win where it has them.
    let mut want = vec![2u8; 8192];
    want.extend_from_slice(&[1u8; 4096]);
    want[8192 + 50..8192 + 150].fill(3);
    want.extend_from_slice(&[1u8; 4096]);
    assert_eq!(&t.read(&f, 0, 16384).unwrap()[..], &want[..]);
    assert!(reads() > before);
    // A block written in part over data on the disk was completed from it when written:
    // the tier holds it whole.
    let before = reads();
    assert_eq!(&t.read(&f, 8192, 4096).unwrap()[..], &want[8192..12288]);
    assert_eq!(reads(), before);
    // A block the tier holds only in part (a write past the end): the disk is asked.
    t.write(&f, 16384, &[4u8; 100]).unwrap();
    let before = reads();
    assert_eq!(&t.read(&f, 16384, 4096).unwrap()[..], &[4u8; 100][..]);
    assert!(reads() > before, "a block the tier holds in part is completed by the path below");
}

/// A union for the tier's sake: the files registered by (device, inode) with their ids.
#[derive(Default)]
struct FakeUnion(parking_lot::Mutex<HashMap<(u64, u64), u64>>);

impl FakeUnion {
    fn set(&self, p: &Path, id: Option<u64>) {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).unwrap();
        match id {
            Some(id) => self.0.lock().insert((m.dev(), m.ino()), id),
            None => self.0.lock().remove(&(m.dev(), m.ino())),
        };
    }
}

impl crate::identity::UnionFiles for FakeUnion {
    fn live_id(&self, file: &File) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().ok()?;
        (m.nlink() > 0).then(|| self.0.lock().get(&(m.dev(), m.ino())).copied()).flatten()
    }
}

#[test]
fn a_union_files_data_is_copied_from_the_tier_follows_a_move_and_is_found_by_id_after_a_crash() {
    let env = env();
    let (a, b) = (env.root.join("a"), env.root.join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    let roots = vec![a.clone(), b.clone()];
    let union = Arc::new(FakeUnion::default());
    let c = cfg(&env, 8 << 20);
    let open = |u: &Arc<FakeUnion>| {
        WritebackPath::open_union(
            DirectPath::new(),
            &c,
            &roots,
            BackingOptions { direct_io: false, direct_writes: false },
            u.clone(),
        )
        .unwrap()
    };
    let union_file = |p: &Path| {
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p).unwrap();
        BackingFile::new(FileId::union(7), f, libc::O_RDWR, &BackingOptions { direct_io: false, direct_writes: false })
    };
    let t = open(&union);
    assert!(marker::read(&a).unwrap().is_some() && marker::read(&b).unwrap().is_some(), "every branch marked");
    let src = union_file(&a.join("f"));
    union.set(&a.join("f"), Some(7));
    let mut model: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
    t.write(&src, 0, &model).unwrap();
    assert_eq!(t.cached_blocks(&FileId::union(7)), 4);
    // A file without a farcache id is written through.
    let plain = open_file(&env, "a/plain");
    t.write(&plain, 0, b"through").unwrap();
    assert_eq!(on_disk(&a.join("plain")), b"through");

    // The copy: every block from the tier (the disk has zeros), counted.
    let r = t.copy_read(&src, 0, 1 << 20).unwrap();
    assert_eq!(r.data.as_ref(), &model[..]);
    assert_eq!((r.tier_blocks, r.cache_blocks, r.disk_blocks), (4, 4, 0));
    std::fs::write(b.join("f"), &r.data).unwrap();
    let copy = std::fs::OpenOptions::new().read(true).write(true).open(b.join("f")).unwrap();
    union.set(&b.join("f"), Some(7));
    t.moving(&FileId::union(7), &copy).unwrap();
    // The switch: the source loses its name, the tier follows the file to the copy.
    t.moved(&FileId::union(7), &copy);
    union.set(&a.join("f"), None);
    std::fs::remove_file(a.join("f")).unwrap();
    let dst = union_file(&b.join("f"));
    t.write(&dst, 4096 + 10, b"after the move").unwrap();
    model[4096 + 10..4096 + 24].copy_from_slice(b"after the move");
    t.flush(Duration::from_secs(10), &mut |_| {}).unwrap();
    assert_eq!(on_disk(&b.join("f")), model, "written back to the file's new branch");

    // Partly dirty: the dirty block from the tier, the others from the disk.
    t.write(&dst, 2 * 4096, b"partly").unwrap();
    model[2 * 4096..2 * 4096 + 6].copy_from_slice(b"partly");
    let r = t.copy_read(&dst, 0, 1 << 20).unwrap();
    assert_eq!(r.data.as_ref(), &model[..]);
    assert_eq!((r.tier_blocks, r.cache_blocks, r.disk_blocks), (1, 1, 3));
    // The same in two steps, as a balance copies: the held part (the dirty block; nothing
    // below holds the rest), then each missing span from the disk over it.
    let h = t.copy_read_held(&dst, 0, model.len()).unwrap();
    assert_eq!((h.tier_blocks, h.cache_blocks, h.disk_blocks), (1, 1, 0));
    assert_eq!(h.missing, vec![(0, 2 * 4096), (3 * 4096, 100)], "the runs the tier does not hold");
    assert_eq!(&h.data[2 * 4096..3 * 4096], &model[2 * 4096..3 * 4096]);
    let mut copy = h.data.to_vec();
    for (at, n) in &h.missing {
        let d = t.copy_read(&dst, *at, *n).unwrap();
        assert!(d.missing.is_empty() && d.disk_blocks > 0);
        copy[*at as usize..*at as usize + d.data.len()].copy_from_slice(&d.data);
    }
    assert_eq!(copy, model);

    // A crash with that block dirty: found again by its id, where it lives now.
    drop(t);
    let t = open(&union);
    assert_eq!(t.stats().recovered.files, 1);
    assert_eq!(read_all(&t, &dst, model.len()), model);
    t.flush(Duration::from_secs(10), &mut |_| {}).unwrap();
    assert_eq!(on_disk(&b.join("f")), model);
    assert!(t.shutdown(Duration::from_secs(10)));
    assert!(marker::read(&a).unwrap().is_none() && marker::read(&b).unwrap().is_none(), "every branch unmarked");
}

/// `flush` writes back what was written before it was called and returns, even beside a
/// writer that keeps the tier dirty: a flush that chased the writer's new records ended only
/// when a round happened to finish with none (the destage experiment's flush beside a
/// writer took 45 s; here it would time out).
#[test]
fn a_flush_beside_a_steady_writer_ends_with_what_came_before_it_on_the_disk() {
    let env = env();
    let inner = Arc::new(Hooked::new());
    let t = Arc::new(
        WritebackPath::open(
            inner.clone(),
            &cfg(&env, 64 << 20),
            &env.root,
            BackingOptions { direct_io: false, direct_writes: false },
        )
        .unwrap(),
    );
    let (a, b) = (open_file(&env, "a"), Arc::new(open_file(&env, "b")));
    let before: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    t.write(&a, 0, &before).unwrap();
    // A slow disk, and a writer adding a record every millisecond to another file.
    inner.write_delay_ms.store(5, Ordering::SeqCst);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (t, b, stop) = (t.clone(), b.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) && n < 20_000 {
                t.write(&b, (n % 1024) * 4096, &[n as u8; 4096]).unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let r = t.flush(Duration::from_secs(5), &mut |_| {});
    stop.store(true, Ordering::SeqCst);
    let written = writer.join().unwrap();
    r.unwrap_or_else(|e| panic!("the flush beside {written} writes did not end: {e}"));
    assert_eq!(on_disk(&env.root.join("a")), before);
    inner.write_delay_ms.store(0, Ordering::SeqCst);
    assert!(t.shutdown(Duration::from_secs(10)), "a shutdown writes back everything");
    assert!(t.stats().log.dirty_blocks == 0);
}

/// An `ssd` tier with `commit = "fsync"` (the default) acknowledges a write once it is in the
/// tier file (through the page cache), flushes at the file's fsync or an O_DSYNC write (once:
/// a second fsync finds nothing to flush), and a write it acknowledged survives the daemon
/// (dropped without a flush) all the same. With `commit = "write"` every write is flushed
/// before it is acknowledged.
#[test]
fn an_ssd_tier_commits_at_fsync_and_its_unsynced_writes_survive_the_daemon() {
    let Some((dir, env, c)) = ssd_env(16 << 20) else { return };
    let t = open_tier(&env, &c);
    let f = open_file(&env, "a");
    let s0 = t.stats().log;
    assert!(s0.lazy, "{s0:?}");
    for b in 0..8u64 {
        t.write(&f, b * 4096, &[b as u8 + 1; 4096]).unwrap();
    }
    let s = t.stats().log;
    assert_eq!(s.flushes, s0.flushes, "unsynced writes are not flushed: {s:?}");
    assert!(s.unflushed_bytes >= 8 * 4096, "{s:?}");
    t.fsync(&f, true).unwrap();
    let s = t.stats().log;
    assert_eq!((s.unflushed_bytes, s.commits, s.flushes), (0, 1, s0.flushes + 1), "{s:?}");
    t.fsync(&f, true).unwrap();
    assert_eq!(t.stats().log.commits, 1, "nothing left to flush");
    t.write(&f, 0, &[9u8; 4096]).unwrap();
    t.sync_writes(&f).unwrap();
    assert_eq!(t.stats().log.unflushed_bytes, 0, "an O_DSYNC write is flushed");
    // Unsynced, then the daemon dies (no flush, no destage): the tier file has it.
    t.write(&f, 8 * 4096, &[42u8; 4096]).unwrap();
    assert!(t.stats().log.unflushed_bytes > 0);
    drop(t);
    let t = open_tier(&env, &c);
    let f = open_file(&env, "a");
    let got = read_all(&t, &f, 9 * 4096);
    let mut want: Vec<u8> = (0..8u8).flat_map(|b| [b + 1; 4096]).collect();
    want[..4096].fill(9);
    want.extend([42u8; 4096]);
    assert!(got == want, "after the daemon's death the tier holds every acknowledged write");
    drop(t);
    // commit = "write": each write flushed before it is acknowledged.
    let mut env2 = self::env();
    env2.tier = dir.path().join("tier2");
    let mut c = cfg(&env2, 16 << 20);
    c.mode = TierMode::Ssd;
    c.commit = super::TierCommit::Write;
    let t = open_tier(&env2, &c);
    let f = open_file(&env2, "a");
    let s0 = t.stats().log;
    t.write(&f, 0, &[1u8; 4096]).unwrap();
    t.write(&f, 4096, &[2u8; 4096]).unwrap();
    let s = t.stats().log;
    assert_eq!((s.lazy, s.unflushed_bytes, s.flushes), (false, 0, s0.flushes + 2), "{s:?}");
}

/// Many dirty files, few descriptors: the tier keeps at most `tier.max_open_files` of its own
/// open while idle, opens a file again (from the writer's file, or by its handle to write it
/// back) when it needs it — after a rename too —, drops the records of a file deleted
/// meanwhile, and every byte reaches its own file.
#[test]
fn a_tier_with_more_dirty_files_than_its_descriptor_budget_writes_every_one_back() {
    const BUDGET: u64 = 8;
    const FILES: usize = 100;
    let env = env();
    let c = TierConfig { max_open_files: BUDGET, ..cfg(&env, 64 << 20) };
    let t = open_tier(&env, &c);
    let content = |i: usize| -> Vec<u8> {
        // Whole blocks and a partial one, different in every file.
        (0..(2 * 4096 + 100 + i * 7)).map(|j| (i * 31 + j * 7 + j / 4096) as u8).collect()
    };
    let mut files: Vec<Option<BackingFile>> = (0..FILES).map(|i| Some(open_file(&env, &format!("f{i}")))).collect();
    let mut most = 0;
    for (i, f) in files.iter().enumerate() {
        let f = f.as_ref().unwrap();
        let data = content(i);
        // In two writes, the second a partial block merged with the first (read back through
        // the tier's descriptor, opened again if it let go of it).
        t.write(f, 0, &data[..5000]).unwrap();
        t.write(f, 5000, &data[5000..]).unwrap();
        most = most.max(t.stats().open_files);
    }
    // Again, the files met first (let go of since): extended (the size set through the
    // tier's descriptor, opened again from the writer's file).
    let tail = |i: usize| vec![i as u8 ^ 0x5a; 300];
    let want = |i: usize| if i < 20 { [content(i), tail(i)].concat() } else { content(i) };
    for (i, f) in files.iter().enumerate().take(20) {
        let f = f.as_ref().unwrap();
        t.write(f, content(i).len() as u64, &tail(i)).unwrap();
        most = most.max(t.stats().open_files);
    }
    let s = t.stats();
    assert_eq!(s.log.dirty_blocks, (3 * FILES) as u64, "every file's blocks are dirty in the tier");
    assert!(most <= BUDGET, "the tier held {most} descriptors, over its budget of {BUDGET}");
    assert!(s.reopens >= 20, "files were not opened again ({} reopens)", s.reopens);
    assert_eq!(s.max_open_files, BUDGET);
    // Renamed: found again by its handle. Deleted (and closed everywhere): its records go.
    std::fs::rename(env.root.join("f50"), env.root.join("renamed50")).unwrap();
    files[7] = None;
    std::fs::remove_file(env.root.join("f7")).unwrap();
    t.flush(Duration::from_secs(30), &mut |_| {}).unwrap();
    let s = t.stats();
    assert_eq!(s.log.dirty_blocks, 0);
    assert_eq!(s.destage_errors, 0, "{:?}", s.last_destage_error);
    assert_eq!(s.discarded_files, 1, "the deleted file's records are dropped");
    assert!(s.open_files <= BUDGET, "{} descriptors held after the flush", s.open_files);
    for i in (0..FILES).filter(|&i| i != 7) {
        let p = env.root.join(if i == 50 { "renamed50".to_string() } else { format!("f{i}") });
        assert!(on_disk(&p) == want(i), "file {i}'s bytes on the disk are not what was written");
    }
    drop(files);
    assert!(t.shutdown(Duration::from_secs(10)));
}

/// A round that writes back many files makes them durable with a sync of the backing file
/// system per batch, not a flush of each (`destage::SyncBatch`); a failed sync frees nothing
/// of any of them, and the next round writes every one back.
#[test]
fn a_round_of_many_files_syncs_the_file_system_once_per_batch_and_a_failed_sync_frees_nothing() {
    let env = env();
    // Below the high watermark: no round before the flush.
    let mut c = cfg(&env, 128 << 20);
    c.retry_min = farcache_config::HumanDuration::ms(10);
    let inner = Arc::new(Hooked::new());
    inner.fail_sync.store(true, Ordering::SeqCst);
    let t =
        WritebackPath::open(inner.clone(), &c, &env.root, BackingOptions { direct_io: false, direct_writes: false })
            .unwrap();
    const FILES: usize = 1200;
    let files: Vec<BackingFile> = (0..FILES).map(|i| open_file(&env, &format!("f{i}"))).collect();
    for (i, f) in files.iter().enumerate() {
        t.write(f, 0, &vec![(i % 251) as u8; 4096 + i]).unwrap();
    }
    let dirty = t.stats().log.dirty_blocks;
    assert_eq!(dirty, 2 * FILES as u64 - 1);
    let e = t.flush(Duration::from_secs(30), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("Input/output error"), "{e}");
    assert_eq!(t.stats().log.dirty_blocks, dirty, "a record is freed only after the sync that covers it succeeded");
    inner.fail_sync.store(false, Ordering::SeqCst);
    let before = inner.fs_syncs.load(Ordering::SeqCst);
    t.flush(Duration::from_secs(30), &mut |_| {}).unwrap();
    let s = t.stats();
    assert_eq!(s.log.dirty_blocks, 0);
    let syncs = inner.fs_syncs.load(Ordering::SeqCst) - before;
    // 1,200 files: three batches of at most 512 files.
    assert!((3..=4).contains(&syncs), "{syncs} syncs of the file system for {FILES} files");
    assert!(s.destage_fs_syncs >= 3, "{s:?}");
    for i in (0..FILES).step_by(37) {
        assert_eq!(on_disk(&env.root.join(format!("f{i}"))), vec![(i % 251) as u8; 4096 + i], "f{i}");
    }
}
