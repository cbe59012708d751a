//! A restarted mount never reads blocks its previous run cached unless it can prove them
//! current. One real lender process keeps running across several runs of the real
//! `farcache mount`: the first run reads files twice with `O_DIRECT` (so every read reaches
//! the daemon) until the lender holds every block; the mount is stopped (SIGTERM, exit 0);
//! the files change — behind the backing directory, or through another mount — and the next
//! run must read the new contents, block by block, while the lender still holds the old
//! copies (checked from its STATS at that moment, so the test means something).
//!
//! The changes cover the ways a cache can be fooled: bytes rewritten in place (same inode,
//! same size, same name), a file truncated and extended back to its old size, a file unlinked
//! and created again under the same name — on the same inode number when the file system
//! hands it out again (ext4 does; the test tries to get it and says whether it did) — and a
//! short last block.

use std::fs::{self, File, OpenOptions};
use std::net::SocketAddr;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use farcache_testkit::{
    pattern, require_fuse, require_root, run_with_timeout, wait_until, AlignedBuf, MountProcess, ScratchDir,
    ServerProcess, LENDERS_FIRST,
};

const BLOCK: usize = 4096;
/// Each test body runs under this bound; past it the running mount is killed and the test fails.
const TEST_BOUND: Duration = Duration::from_secs(90);
/// How long the lender may take to show the blocks a read filled (fills are asynchronous),
/// and how many reads of everything may be needed until it holds every block.
const FILL_WAIT: Duration = Duration::from_secs(3);
const FILL_PASSES: usize = 4;
/// Attempts at getting a recreated file on its predecessor's inode number.
const REUSE_TRIES: usize = 64;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// The files of a test, their first contents: name, size, pattern seed. `truncext` and
/// `tail` end in a short block (never cached, but it must change too); `truncext` ends
/// mid-chunk (the index groups 64 blocks in a chunk), `truncchunk` on a chunk boundary.
const FILES: [(&str, usize, u64); 5] = [
    ("inplace", 256 * BLOCK, 1),
    ("truncext", 250 * BLOCK + 500, 2),
    ("truncchunk", 256 * BLOCK, 3),
    ("recreate", 256 * BLOCK, 4),
    ("tail", 64 * BLOCK + 1000, 5),
];

/// Whole blocks over all files: what the lender holds once every block was read.
fn full_blocks() -> u64 {
    FILES.iter().map(|(_, len, _)| (len / BLOCK) as u64).sum()
}

/// A fresh [`ScratchDir`] under Cargo's per-target temporary directory (a disk file system,
/// where O_DIRECT works).
fn test_dir(tag: &str) -> ScratchDir {
    ScratchDir::new(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("restart-{tag}"))
}

/// The lender's STATS: `(hits, blocks, evictions)`, or `None` if it does not answer within
/// seconds.
fn lender_stats(addr: SocketAddr) -> Option<(u64, u64, u64)> {
    let mut cmd = Command::new(bin());
    cmd.args(["stats", "--server", &addr.to_string(), "--json"]);
    let out = run_with_timeout(cmd, Duration::from_secs(10)).ok()?;
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((v["hits"].as_u64()?, v["blocks"].as_u64()?, v["evictions"].as_u64()?))
}

fn stats(addr: SocketAddr) -> (u64, u64, u64) {
    lender_stats(addr).unwrap_or_else(|| panic!("lender {addr} does not answer STATS"))
}

/// Require the lender to hold at least `blocks` blocks and to have evicted none: every copy
/// it was given is still there, the old ones a stale read would come from included.
fn assert_old_copies_held(lender: SocketAddr, blocks: u64, what: &str) {
    let (_, held, evicted) = stats(lender);
    assert!(
        held >= blocks && evicted == 0,
        "{what}: the lender should still hold the old copies ({blocks}): it holds {held}, evicted {evicted}"
    );
}

/// What each file must hold now, kept in step with every change the test makes.
struct Expected(Vec<(String, Vec<u8>)>);

impl Expected {
    fn initial() -> Expected {
        Expected(FILES.iter().map(|&(n, len, seed)| (n.to_string(), pattern(len, seed))).collect())
    }
    fn get_mut(&mut self, name: &str) -> &mut Vec<u8> {
        &mut self.0.iter_mut().find(|(n, _)| n == name).expect("known file").1
    }
    fn write_all(&self, dir: &Path) {
        for (n, data) in &self.0 {
            fs::write(dir.join(n), data).unwrap();
        }
    }
}

/// Read every file under `dir` in 4 KiB `O_DIRECT` reads and compare each block with what is
/// expected. On a mismatch, say whether the block holds what an earlier generation of the
/// file held (`old`), which is what a stale cached copy would look like.
fn check_files(dir: &Path, want: &Expected, old: &Expected, what: &str) {
    let mut buf = AlignedBuf::new(BLOCK);
    let mut bad = Vec::new();
    let mut count = 0;
    for ((name, data), (_, before)) in want.0.iter().zip(&old.0) {
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.join(name))
            .unwrap_or_else(|e| panic!("{what}: open {name}: {e}"));
        let blocks = data.len().div_ceil(BLOCK);
        for b in 0..=blocks {
            let b_off = b * BLOCK;
            let out = buf.buf();
            let n = f.read_at(out, b_off as u64).unwrap_or_else(|e| panic!("{what}: read {name} block {b}: {e}"));
            let end = data.len().min(b_off + BLOCK).max(b_off);
            let expect = data.get(b_off..end).unwrap_or(&[]);
            if &out[..n] != expect {
                count += 1;
            }
            if &out[..n] != expect && bad.len() < 20 {
                let stale = before.get(b_off..before.len().min(b_off + BLOCK)).is_some_and(|o| &out[..n] == o);
                bad.push(format!(
                    "{name} block {b}: {n} bytes read, {} expected{}",
                    expect.len(),
                    if stale { " — it holds the OLD contents (a stale copy)" } else { "" }
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{what}: {count} blocks differ (the first {}):\n{}", bad.len(), bad.join("\n"));
}

/// The pid of the mount that runs now, for the watchdog of [`bounded`]: set while the
/// daemon runs, cleared before it is stopped or reaped, so the watchdog never signals a pid
/// that may have been reused.
type Running = Mutex<Option<u32>>;

/// A running mount that [`bounded`]'s watchdog may kill.
struct Watched<'a> {
    m: Option<MountProcess>,
    running: &'a Running,
}

impl Watched<'_> {
    /// SIGTERM, exit 0 (see [`MountProcess::stop`]).
    fn stop(mut self) {
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.m.take().expect("running").stop();
    }
}

impl std::ops::Deref for Watched<'_> {
    type Target = MountProcess;
    fn deref(&self) -> &MountProcess {
        self.m.as_ref().expect("running")
    }
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A running mount borrowing from `lender`; its log goes beside the test directory.
fn mount<'a>(dir: &ScratchDir, lender: SocketAddr, run: usize, running: &'a Running) -> Watched<'a> {
    let log = dir.join(format!("mount-{run}.log"));
    let m = MountProcess::start(
        bin(),
        &dir.backing(),
        &dir.mnt(),
        &["--server", &lender.to_string(), LENDERS_FIRST[0], LENDERS_FIRST[1]],
        &log,
    );
    *running.lock().unwrap_or_else(|e| e.into_inner()) = Some(m.pid());
    Watched { m: Some(m), running }
}

/// The number of blocks the mount's index says its lenders hold (`farcache stats MNT`).
fn remote_blocks(m: &Watched) -> u64 {
    let mut cmd = Command::new(bin());
    cmd.arg("stats").arg(m.mnt()).arg("--json");
    let out = run_with_timeout(cmd, Duration::from_secs(10)).expect("farcache stats MNT finished");
    assert!(out.status.success(), "farcache stats MNT: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    v["index"]["remote_blocks"].as_u64().unwrap_or_else(|| panic!("no index.remote_blocks in {v}"))
}

/// Read everything until the mount's index says its lender holds every whole block (fills
/// are asynchronous and may be dropped under load: then the next read fills again), then
/// once more — now from the lender: its hits must grow by nearly one per block. Every read
/// is checked.
fn cache_everything(m: &Watched, lender: SocketAddr, want: &Expected, old: &Expected, what: &str) {
    let n = full_blocks();
    let mut held = 0;
    let mut filled = false;
    for pass in 1..=FILL_PASSES {
        check_files(m.mnt(), want, old, &format!("{what}, read {pass}"));
        filled = wait_until(FILL_WAIT, Duration::from_millis(100), || {
            held = remote_blocks(m);
            held >= n
        });
        if filled {
            break;
        }
    }
    assert!(filled, "{what}: the mount's lender should hold all {n} blocks after {FILL_PASSES} reads: {held}");
    let (hits0, _, _) = stats(lender);
    check_files(m.mnt(), want, old, &format!("{what}, read from the lender"));
    let (hits1, _, _) = stats(lender);
    assert!(
        hits1 - hits0 >= n * 9 / 10,
        "{what}: the last read should come from the lender: {} hits for {n} blocks",
        hits1 - hits0
    );
}

/// Stop the mount (SIGTERM, exit 0) and require the lender still to hold at least `blocks`
/// blocks: the copies a stale read would come from.
fn unmount_keeping_copies(m: Watched, lender: SocketAddr, blocks: u64, what: &str) {
    m.stop();
    assert_old_copies_held(lender, blocks, what);
}

/// `dir/name`'s inode number.
fn ino(dir: &Path, name: &str) -> u64 {
    fs::metadata(dir.join(name)).unwrap().ino()
}

/// Unlink `dir/name` and create it again with `data`, trying to land on the old inode number
/// (file systems like ext4 hand out the lowest free one, so files created in between to fill
/// lower holes get us there). `backing` is where inode numbers are looked at (`dir` itself,
/// or the backing directory of a mount on `dir`). Returns whether the number was reused.
fn recreate(dir: &Path, backing: &Path, name: &str, data: &[u8]) -> bool {
    let old = ino(backing, name);
    fs::remove_file(dir.join(name)).unwrap();
    let mut decoys = Vec::new();
    let mut reused = false;
    for i in 0..REUSE_TRIES {
        let p = dir.join(name);
        File::create(&p).unwrap();
        if ino(backing, name) == old {
            reused = true;
            break;
        }
        // Keep this inode taken, so that the next create gets another number.
        let decoy = dir.join(format!(".decoy-{name}-{i}"));
        fs::rename(&p, &decoy).unwrap();
        decoys.push(decoy);
    }
    if !reused {
        // Give up on the number; the name still has to exist.
        File::create(dir.join(name)).unwrap();
    }
    fs::write(dir.join(name), data).unwrap();
    for d in decoys {
        fs::remove_file(d).unwrap();
    }
    eprintln!("recreated {name}: inode {old} {}", if reused { "reused" } else { "not reused by the file system" });
    reused
}

/// In place: the same inode, no truncation, every byte rewritten with `pwrite`.
fn rewrite_in_place(dir: &Path, name: &str, data: &[u8]) {
    let before = ino(dir, name);
    let f = OpenOptions::new().write(true).open(dir.join(name)).unwrap();
    f.write_all_at(data, 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(ino(dir, name), before, "{name} must stay the same inode");
}

/// Truncate to `short` bytes, extend back to the old length (zeros), write `patch` at `at`.
fn truncate_and_extend(dir: &Path, name: &str, want: &mut Vec<u8>, short: usize, at: usize, patch: &[u8]) {
    let len = want.len();
    let f = OpenOptions::new().write(true).open(dir.join(name)).unwrap();
    let set_len = |n: usize| {
        f.set_len(n as u64).unwrap_or_else(|e| panic!("truncate {name} to {n} bytes in {}: {e}", dir.display()))
    };
    set_len(short);
    set_len(len);
    f.write_all_at(patch, at as u64).unwrap();
    f.sync_all().unwrap();
    want.truncate(short);
    want.resize(len, 0);
    want[at..at + patch.len()].copy_from_slice(patch);
}

/// Apply every kind of change to the files under `dir` (the backing directory `backing`, or
/// a mount of it), with contents drawn from `seed`; keep `want` in step, and call `check`
/// with it after each change (to read it back at once through the mount that made it).
fn change_everything(dir: &Path, backing: &Path, want: &mut Expected, seed: u64, check: &dyn Fn(&Expected, &str)) {
    let new = pattern(256 * BLOCK, seed);
    rewrite_in_place(dir, "inplace", &new);
    *want.get_mut("inplace") = new;
    check(want, "after rewriting inplace");

    // Cut mid-block in chunk 1 (block 100 keeps 123 bytes), grow back to the old length
    // (mid-chunk 3), patch blocks 200..220 (chunk 3): chunk 2 (blocks 128..192) must read as
    // zeros, with nothing written there to renew it.
    let patch = pattern(20 * BLOCK, seed + 1);
    truncate_and_extend(dir, "truncext", want.get_mut("truncext"), 100 * BLOCK + 123, 200 * BLOCK, &patch);
    check(want, "after truncating and extending truncext");
    // Cut and grow back on chunk boundaries (blocks 128 and 256).
    let patch = pattern(3 * BLOCK + 7, seed + 2);
    truncate_and_extend(dir, "truncchunk", want.get_mut("truncchunk"), 128 * BLOCK, 250 * BLOCK, &patch);
    check(want, "after truncating and extending truncchunk");

    let tail = pattern(64 * BLOCK + 1000, seed + 3);
    rewrite_in_place(dir, "tail", &tail);
    *want.get_mut("tail") = tail;
    check(want, "after rewriting tail");

    let fresh = pattern(256 * BLOCK, seed + 4);
    recreate(dir, backing, "recreate", &fresh);
    *want.get_mut("recreate") = fresh;
    check(want, "after recreating recreate");
}

/// Run `body` under [`TEST_BOUND`]; past it, kill the mount that runs then (which fails its
/// pending file operations, so the body ends), and fail.
fn bounded(body: impl FnOnce(&Running) + Send) {
    require_root("the restart tests");
    require_fuse();
    let running: Running = Mutex::new(None);
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let r = &running;
        // `done_tx` moves into the body's thread: a panicking body drops it, which ends the
        // wait below at once.
        let h = s.spawn(move || {
            body(r);
            let _ = done_tx.send(());
        });
        let t0 = Instant::now();
        let timed_out = matches!(done_rx.recv_timeout(TEST_BOUND), Err(mpsc::RecvTimeoutError::Timeout));
        if timed_out {
            let pid = running.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(pid) = *pid {
                // SAFETY: kill(2) on the running daemon: its pid is cleared (under this lock)
                // before it is stopped or reaped, so it cannot have been reused.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        let r = h.join();
        assert!(!timed_out, "test body exceeded {TEST_BOUND:?}");
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
        eprintln!("test body took {:?}", t0.elapsed());
    });
}

/// Run 1, the same in every test: write the initial files, mount, cache every block on the
/// lender, unmount with the lender keeping the copies. Returns the files' contents.
fn first_run(dir: &ScratchDir, addr: SocketAddr, running: &Running) -> Expected {
    let want = Expected::initial();
    want.write_all(&dir.backing());
    // Before any change there are no older contents for a stale read to show.
    let initial = Expected::initial();
    let m = mount(dir, addr, 1, running);
    cache_everything(&m, addr, &want, &initial, "first mount");
    unmount_keeping_copies(m, addr, full_blocks(), "after the first mount");
    want
}

/// (i) Changes made behind the backing directory while nothing is mounted.
#[test]
fn remount_reads_changes_made_behind_the_backing_directory() {
    let lender = ServerProcess::start(bin(), &["--capacity", "64MiB"], None);
    let addr = lender.addr();
    let dir = test_dir("behind");
    bounded(|running| {
        let mut want = first_run(&dir, addr, running);

        let old = Expected(want.0.clone());
        // Nothing is mounted to read the changes back through.
        change_everything(&dir.backing(), &dir.backing(), &mut want, 100, &|_, _| {});
        assert_old_copies_held(addr, full_blocks(), "at the remount");

        // Every block read twice: from the disk, then from this run's own fills.
        let m = mount(&dir, addr, 2, running);
        cache_everything(&m, addr, &want, &old, "second mount, after changes behind the backing directory");
        m.stop();
        check_files(&dir.backing(), &want, &old, "the backing files");
    });
}

/// (ii) Changes made through a second mount (which had cached the old contents itself),
/// then a third mount; and the same changes read back within the second mount.
#[test]
fn remount_reads_changes_made_through_another_mount() {
    let lender = ServerProcess::start(bin(), &["--capacity", "64MiB"], None);
    let addr = lender.addr();
    let dir = test_dir("through");
    bounded(|running| {
        let mut want = first_run(&dir, addr, running);

        let m = mount(&dir, addr, 2, running);
        // This run caches the same (old) contents under its own keys, then changes them.
        cache_everything(&m, addr, &want, &Expected::initial(), "second mount, before the changes");
        // Each change is read back at once through this mount, whose own old copies are
        // still on the lender too.
        let old = Expected(want.0.clone());
        let check = |w: &Expected, what: &str| check_files(m.mnt(), w, &old, &format!("second mount, {what}"));
        change_everything(m.mnt(), &dir.backing(), &mut want, 200, &check);
        unmount_keeping_copies(m, addr, full_blocks(), "after the second mount");
        check_files(&dir.backing(), &want, &old, "the backing files after the second mount");

        let m = mount(&dir, addr, 3, running);
        cache_everything(&m, addr, &want, &old, "third mount");
        m.stop();
    });
}
