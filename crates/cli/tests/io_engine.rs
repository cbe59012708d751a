//! The backing I/O engine (`crates/engine/src/io/`) through a real FUSE mount of the real
//! binary: many threads reading and writing overlapping ranges of one file, `O_DIRECT` and
//! buffered, checked byte for byte against a model; the fallback counters in
//! `farcache stats` moving when a fallback is forced; backing faults (a full file system, a
//! file system shut down under the mount) reaching the application as the right errno.
//!
//! Root is needed for the fault tests (loop-mounted ext4); CI and developers run as root.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use farcache_testkit::{require_root, text, AlignedBuf, MountProcess, Rng, LENDERS_FIRST};
use serde_json::Value;

const BLOCK: usize = 4096;

/// The tests that look at which engine ran take this shared; the one that turns io_uring
/// off for the whole machine takes it alone.
static URING_SWITCH: RwLock<()> = RwLock::new(());

fn uring_as_is() -> RwLockReadGuard<'static, ()> {
    URING_SWITCH.read().unwrap_or_else(|e| e.into_inner())
}

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// A fresh directory for one test, under the target directory (a disk file system).
fn test_root(tag: &str) -> PathBuf {
    farcache_testkit::fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("io-{tag}"))
}

/// `farcache mount BACKING ROOT/mnt ARGS` with `config` (if any) as its configuration file.
fn mount(root: &Path, backing: &Path, args: &[&str], config: Option<&str>) -> MountProcess {
    let mnt = root.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    if let Some(c) = config {
        let p = root.join("farcache.toml");
        fs::write(&p, c).unwrap();
        a.extend(["--config".into(), p.to_str().unwrap().into()]);
    }
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    MountProcess::start(bin(), backing, &mnt, &a, &root.join("daemon.log"))
}

/// `farcache stats MNT --json`'s `backing` document.
fn backing_stats(mnt: &Path) -> Value {
    let out = farcache_testkit::run_bin(bin(), &["stats", mnt.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "farcache stats: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["backing"].clone()
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no counter {key} in {v}"))
}

fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    r.expect_err("an error").raw_os_error().expect("an OS error")
}

/// The model: the file's bytes, one mutex per block. Holding the mutexes of the blocks an
/// operation covers orders it against every other operation on them, so the model knows
/// what each read must see, while operations on other blocks run in parallel.
struct Model {
    blocks: Vec<Mutex<Vec<u8>>>,
}

impl Model {
    fn lock(&self, off: usize, len: usize) -> Vec<std::sync::MutexGuard<'_, Vec<u8>>> {
        (off / BLOCK..=(off + len - 1) / BLOCK).map(|b| self.blocks[b].lock().unwrap()).collect()
    }
}

fn model_bytes(g: &[std::sync::MutexGuard<'_, Vec<u8>>], first: usize, off: usize, len: usize) -> Vec<u8> {
    let all: Vec<u8> = g.iter().flat_map(|b| b.iter().copied()).collect();
    let s = off - first * BLOCK;
    all[s..s + len].to_vec()
}

fn model_write(g: &mut [std::sync::MutexGuard<'_, Vec<u8>>], first: usize, off: usize, data: &[u8]) {
    for (i, &x) in data.iter().enumerate() {
        let p = off + i;
        g[p / BLOCK - first][p % BLOCK] = x;
    }
}

/// Threads × ops on one file through the mount: half `O_DIRECT` (aligned), half buffered
/// (any offset and length), reads and writes on overlapping ranges.
fn hammer(file: &Path, size: usize, threads: usize, ops: usize) {
    let model = Arc::new(Model { blocks: (0..size / BLOCK).map(|_| Mutex::new(vec![0u8; BLOCK])).collect() });
    fs::write(file, vec![0u8; size]).unwrap();
    std::thread::scope(|s| {
        for t in 0..threads {
            let model = model.clone();
            s.spawn(move || {
                let direct = t % 2 == 0;
                let mut o = OpenOptions::new();
                o.read(true).write(true);
                if direct {
                    o.custom_flags(libc::O_DIRECT);
                }
                let f = o.open(file).unwrap();
                let mut rng = Rng::new(t as u64 + 1);
                for i in 0..ops {
                    let (off, len) = if direct {
                        let b = rng.below((size / BLOCK) as u64 - 4) as usize;
                        (b * BLOCK, (1 + rng.below(4) as usize) * BLOCK)
                    } else {
                        let off = rng.below((size - 20_000) as u64) as usize;
                        (off, 1 + rng.below(12_000) as usize)
                    };
                    let first = off / BLOCK;
                    let mut g = model.lock(off, len);
                    let mut buf = AlignedBuf::new(len);
                    if rng.below(2) == 0 {
                        let fill = (t * 1000 + i) as u32;
                        for (k, x) in buf.buf().iter_mut().enumerate() {
                            *x = (fill.wrapping_mul(31).wrapping_add(k as u32 / 7)) as u8;
                        }
                        f.write_all_at(buf.buf(), off as u64).unwrap_or_else(|e| panic!("write {off}+{len}: {e}"));
                        model_write(&mut g, first, off, buf.buf());
                    } else {
                        f.read_exact_at(buf.buf(), off as u64).unwrap_or_else(|e| panic!("read {off}+{len}: {e}"));
                        let want = model_bytes(&g, first, off, len);
                        assert!(
                            buf.buf() == &want[..],
                            "thread {t} op {i}: read {off}+{len} (direct {direct}) differs"
                        );
                    }
                }
            });
        }
    });
    let want: Vec<u8> = model.blocks.iter().flat_map(|b| b.lock().unwrap().clone()).collect();
    assert!(fs::read(file).unwrap() == want, "the file's final contents differ from the model");
}

#[test]
fn concurrent_overlapping_reads_and_writes_match_a_model() {
    let _uring = uring_as_is();
    for (tag, args) in [("noremote", &["--no-remote"][..]), ("lenders", &LENDERS_FIRST[..])] {
        let root = test_root(tag);
        let backing = root.join("backing");
        fs::create_dir(&backing).unwrap();
        let m = mount(&root, &backing, args, None);
        hammer(&m.m("shared"), 1 << 20, 8, 400);
        // And the backing file itself holds what the mount said.
        assert_eq!(fs::read(m.b("shared")).unwrap(), fs::read(m.m("shared")).unwrap());
        let s = backing_stats(m.mnt());
        let io = &s["io"];
        assert_eq!(io["engine"], "uring", "{s}");
        assert!(n(io, "ops_uring") > 0 && n(io, "ops_sync") == 0, "{s}");
        assert!(n(io, "in_flight_peak") >= 1 && n(io, "fallback_no_uring") == 0, "{s}");
        assert!(n(&s, "writes_direct") > 0, "O_DIRECT writers' aligned writes go direct: {s}");
        drop(m);
        fs::remove_dir_all(&root).unwrap();
    }
}

#[test]
fn forced_fallbacks_move_their_counters() {
    let _uring = uring_as_is();
    // io_engine = "sync": the synchronous path, shown as such.
    let root = test_root("sync");
    let backing = root.join("backing");
    fs::create_dir(&backing).unwrap();
    let m = mount(&root, &backing, &["--no-remote"], Some("[mount]\nio_engine = \"sync\"\n"));
    hammer(&m.m("f"), 256 << 10, 4, 100);
    let s = backing_stats(m.mnt());
    assert_eq!(s["io"]["engine"], "sync", "{s}");
    assert!(n(&s["io"], "ops_sync") > 0 && n(&s["io"], "ops_uring") == 0, "{s}");
    drop(m);

    // Unaligned O_DIRECT transfers: a bounce buffer for the read, a buffered write.
    let m = mount(&root, &backing, &["--no-remote"], None);
    let before = backing_stats(m.mnt());
    let f = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(m.m("f")).unwrap();
    f.write_all_at(b"unaligned", 100).unwrap();
    let mut b = [0u8; 9];
    f.read_exact_at(&mut b, 100).unwrap();
    assert_eq!(&b, b"unaligned");
    let after = backing_stats(m.mnt());
    for k in ["fallback_unaligned_writes", "fallback_unaligned_reads"] {
        assert!(n(&after["io"], k) > n(&before["io"], k), "{k} did not move: {before} -> {after}");
    }
    let log = m.stop();
    assert_eq!(log.matches("backing I/O fallback (fallback_unaligned_writes)").count(), 1, "logged once:\n{log}");
    fs::remove_dir_all(&root).unwrap();
}

/// A small ext4 file system on a loop device, mounted at ROOT/fs; unmounted on drop.
struct Ext4 {
    dir: PathBuf,
}

impl Ext4 {
    fn new(root: &Path, size_mib: u64) -> Ext4 {
        require_root("a loop-mounted ext4 for backing faults");
        let img = root.join("fs.img");
        File::create(&img).unwrap().set_len(size_mib << 20).unwrap();
        run("mkfs.ext4", &["-q", "-F", img.to_str().unwrap()]);
        let dir = root.join("fs");
        fs::create_dir_all(&dir).unwrap();
        run("mount", &["-o", "loop", img.to_str().unwrap(), dir.to_str().unwrap()]);
        Ext4 { dir }
    }

    /// Shut the file system down (`FS_IOC_SHUTDOWN`, without flushing the log): from now on
    /// every I/O on it fails with EIO, as on a dead disk.
    fn shut_down(&self) {
        let d = File::open(&self.dir).unwrap();
        let mut flags: u32 = 2; // EXT4_GOING_FLAGS_NOLOGFLUSH
                                // SAFETY: FS_IOC_SHUTDOWN = _IOR('X', 125, __u32) reads one u32.
        let r = unsafe { libc::ioctl(d.as_raw_fd(), 0x8004_587d, &mut flags) };
        assert_eq!(r, 0, "FS_IOC_SHUTDOWN: {}", io::Error::last_os_error());
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", text(&out.stderr));
}

#[test]
fn backing_faults_reach_the_application_as_their_errno() {
    let _uring = uring_as_is();
    let root = test_root("faults");
    let fs4 = Ext4::new(&root, 16);
    let m = mount(&root, &fs4.dir, &["--no-remote"], None);

    // ENOSPC, buffered and O_DIRECT: fill the file system through the mount.
    for (name, flags) in [("full-buffered", 0), ("full-direct", libc::O_DIRECT)] {
        let f = OpenOptions::new().write(true).create(true).custom_flags(flags).open(m.m(name)).unwrap();
        let mut chunk = AlignedBuf::new(1 << 20);
        chunk.buf().fill(0xab);
        let mut res = Ok(());
        for i in 0..64u64 {
            res = f.write_all_at(chunk.buf(), i << 20);
            if res.is_err() {
                break;
            }
        }
        assert_eq!(errno(res), libc::ENOSPC, "{name}");
        drop(f);
        fs::remove_file(m.m(name)).unwrap();
    }
    // The mount still works once there is room again.
    fs::write(m.m("after"), b"room again").unwrap();
    assert_eq!(fs::read(m.m("after")).unwrap(), b"room again");

    // EIO: the file system under the mount dies.
    let f = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(m.m("after")).unwrap();
    fs4.shut_down();
    let mut b = AlignedBuf::new(BLOCK);
    assert_eq!(errno(f.read_at(b.buf(), 0)), libc::EIO, "a read from a dead file system");
    assert_eq!(errno(f.write_at(b.buf(), 0)), libc::EIO, "a write to a dead file system");
    assert_eq!(errno(f.sync_all()), libc::EIO, "an fsync on a dead file system");
    drop(f);
    // Nothing else broke: the daemon answers, and says what failed.
    let s = backing_stats(m.mnt());
    assert!(n(&s["io"], "ops_uring") > 0, "{s}");
    drop(m);
    drop(fs4);
    fs::remove_dir_all(&root).unwrap();
}

/// `/proc/sys/kernel/io_uring_disabled` set to `value` until dropped (then restored).
struct UringDisabled {
    was: String,
}

const URING_SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";

impl UringDisabled {
    fn set(value: &str) -> UringDisabled {
        let was = fs::read_to_string(URING_SYSCTL)
            .unwrap_or_else(|e| panic!("{URING_SYSCTL}: {e} (the kernel's io_uring switch, Linux 6.6 and later)"));
        fs::write(URING_SYSCTL, value).unwrap();
        UringDisabled { was: was.trim().to_string() }
    }
}

impl Drop for UringDisabled {
    fn drop(&mut self) {
        let _ = fs::write(URING_SYSCTL, &self.was);
    }
}

/// With io_uring forbidden by the kernel (`io_uring_disabled = 2`, as a hardened host or a
/// seccomp filter would have it) the mount serves every request on synchronous system
/// calls — the same bytes — and says so: `fallback_no_uring` and `ops_sync` move, no ring is
/// made, and the log has one line for it.
#[test]
fn without_io_uring_the_mount_serves_on_synchronous_calls_counted_and_logged_once() {
    require_root("the kernel's io_uring switch");
    let _alone = URING_SWITCH.write().unwrap_or_else(|e| e.into_inner());
    let root = test_root("no-uring");
    let backing = root.join("backing");
    fs::create_dir(&backing).unwrap();
    let off = UringDisabled::set("2");
    let m = mount(&root, &backing, &["--no-remote"], None);
    hammer(&m.m("f"), 256 << 10, 4, 100);
    assert_eq!(fs::read(m.b("f")).unwrap(), fs::read(m.m("f")).unwrap());
    let s = backing_stats(m.mnt());
    let io = &s["io"];
    assert_eq!(io["engine"], "sync", "the engine in force: {s}");
    assert_eq!((n(io, "ops_uring"), n(io, "rings")), (0, 0), "{s}");
    assert!(n(io, "ops_sync") > 0 && n(io, "fallback_no_uring") >= n(io, "ops_sync"), "{s}");
    let log = m.stop();
    drop(off);
    assert_eq!(log.matches("backing I/O fallback (fallback_no_uring)").count(), 1, "logged once:\n{log}");
    fs::remove_dir_all(&root).unwrap();
}
