//! POSIX behaviour through a real FUSE mount of the real `farcache mount` binary.
//!
//! Each test mounts its own backing directory (under Cargo's per-target temporary directory,
//! a disk file system, so `O_DIRECT` backing reads are exercised), waits until the mount shows
//! in /proc/self/mountinfo, runs its body under a time bound, and always unmounts — a guard
//! runs `fusermount3 -u` (lazily if busy) and kills the daemon if it lingers, also when the
//! test fails. Without /dev/fuse or fusermount3 the tests fail with a message saying so: a
//! machine that cannot mount cannot pass.
//!
//! `union_posix.rs` runs this same suite against a mount of two backing branches (the test
//! directory's backing directory first, an empty tmpfs branch second, new files placed on
//! the first): every operation then takes the union's code paths (farcache ids, merged
//! directories, placement, summed statfs).
//!
//! `ring_posix.rs` runs it over FUSE-over-io_uring (`mount.fuse_uring = "on"`, the kernel's
//! `enable_uring` switched on for the run and restored after, `farcache_testkit::uring_on`):
//! every request but FORGET and INTERRUPT then comes and goes through ring entries.
//!
//! Several checks need root (chown, other users through `allow_other`, /dev hidden with
//! `unshare`); CI and developers run as root (see TESTBED.md), and a non-root run fails with
//! a message saying so rather than passing vacuously.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use farcache_testkit::{fuse_mounted, o_direct_write_then_read, require_fuse, require_root, MountProcess};

/// Every test body runs under this bound; past it the daemon is killed (which fails every
/// pending file operation) and the test fails.
const TEST_BOUND: Duration = Duration::from_secs(180);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// A fresh directory for one test, under the target directory (a disk file system).
fn test_root(tag: &str) -> PathBuf {
    farcache_testkit::fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("posix-{tag}"))
}

/// Whether this is the suite as `union_posix.rs` runs it: against two branches.
fn union_run() -> bool {
    module_path!().starts_with("union_posix")
}

/// Whether this is the suite as `writeback_posix.rs` runs it: with the kernel's write-back
/// cache (`mount.writeback_cache = true`).
fn writeback_run() -> bool {
    module_path!().starts_with("writeback_posix")
}

/// Whether this is the suite as `ring_posix.rs` runs it: over FUSE-over-io_uring.
fn ring_run() -> bool {
    module_path!().starts_with("ring_posix")
}

/// A running `farcache mount --no-remote` of a fresh backing directory, in a fresh test
/// directory that is removed afterwards unless the test failed.
struct Mounted {
    root: PathBuf,
    mnt: PathBuf,
    backing: PathBuf,
    /// The second branch (on tmpfs) of a union run.
    second: Option<PathBuf>,
    proc: MountProcess,
    /// The kernel's switch, on for a ring run (after `proc`: restored once unmounted).
    _rings: Option<farcache_testkit::UringOn>,
}

impl Mounted {
    fn start(tag: &str, config: Option<&str>) -> Mounted {
        let root = test_root(tag);
        let (backing, mnt) = (root.join("backing"), root.join("mnt"));
        fs::create_dir(&backing).unwrap();
        fs::create_dir(&mnt).unwrap();
        let mut args = vec!["--no-remote".to_string()];
        let second = union_run().then(|| {
            let p = PathBuf::from(format!("/dev/shm/farcache-test-union-posix-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir(&p).unwrap();
            p
        });
        let extra = match (union_run(), writeback_run(), ring_run()) {
            (true, _, _) => Some("create_policy = \"first\"\n"),
            (_, true, _) => Some("writeback_cache = true\n"),
            (_, _, true) => Some("fuse_uring = \"on\"\n"),
            _ => None,
        };
        let rings = ring_run().then(farcache_testkit::uring_on);
        let config = match (config, extra) {
            (Some(c), Some(x)) if c.contains("[mount]\n") => Some(c.replacen("[mount]\n", &format!("[mount]\n{x}"), 1)),
            (Some(c), Some(x)) => Some(format!("[mount]\n{x}{c}")),
            (None, Some(x)) => Some(format!("[mount]\n{x}")),
            (c, None) => c.map(str::to_string),
        };
        if let Some(c) = config {
            assert!(c.contains("[mount]") || !union_run(), "a union run places files by the [mount] table");
            let p = root.join("farcache.toml");
            fs::write(&p, c).unwrap();
            args.extend(["--config".to_string(), p.to_str().unwrap().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let branches = match &second {
            Some(s) => PathBuf::from(format!("{}:{}", backing.display(), s.display())),
            None => backing.clone(),
        };
        let proc = MountProcess::start(bin(), &branches, &mnt, &args, &root.join("daemon.log"));
        if union_run() {
            assert!(proc.log_text().contains("mounted 2 branches"), "not a union: {}", proc.log_text());
        }
        if ring_run() {
            // The queues are registered as serving starts, before any request is answered.
            let t0 = std::time::Instant::now();
            while !proc.log_text().contains("FUSE-over-io_uring: ") && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(proc.log_text().contains("entries registered"), "no rings: {}", proc.log_text());
        }
        Mounted { root, mnt, backing, second, proc, _rings: rings }
    }

    fn log_text(&self) -> String {
        self.proc.log_text()
    }

    fn m(&self, rel: &str) -> PathBuf {
        self.proc.m(rel)
    }

    /// `rel` in the backing directory (the first branch of a union run, where new files go).
    fn b(&self, rel: &str) -> PathBuf {
        self.backing.join(rel)
    }

    fn signal(&self, sig: i32) {
        self.proc.signal(sig)
    }

    /// Wait (bounded) for the daemon to exit; its exit code.
    fn wait_exit(&self) -> i32 {
        self.proc.wait_exit()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            // The mount process guard (dropped after this) unmounts first; the directory
            // goes once nothing is mounted on it.
            if fuse_mounted(&self.mnt) {
                let _ = Command::new("fusermount3").arg("-u").arg(&self.mnt).status();
            }
            let _ = self.proc.wait_exit_timeout(Duration::from_secs(5));
            let _ = fs::remove_dir_all(&self.root);
        }
        if let Some(s) = &self.second {
            let _ = fs::remove_dir_all(s);
        }
    }
}

/// Mount, run `body` under [`TEST_BOUND`], unmount.
fn with_mount(tag: &str, config: Option<&str>, body: impl FnOnce(&Mounted) + Send) {
    let m = Mounted::start(tag, config);
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let mref = &m;
        // `tx` moves into the thread: a panicking body drops it, which ends the wait below.
        let h = s.spawn(move || {
            body(mref);
            let _ = tx.send(());
        });
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(TEST_BOUND) {
            // Kill the daemon: every blocked file operation fails, the body panics and ends.
            m.signal(libc::SIGKILL);
            let _ = h.join();
            panic!("test body exceeded {TEST_BOUND:?}");
        }
        if let Err(p) = h.join() {
            std::panic::resume_unwind(p);
        }
    });
}

fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.raw_os_error().unwrap_or_else(|| panic!("error without errno: {e}")),
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Run a libc call returning -1 on error as an io::Result.
fn cvt(r: i64) -> io::Result<i64> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Deterministic content: 8-byte words mixed from (seed, word index).
fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    assert!(offset.is_multiple_of(8) && len.is_multiple_of(8));
    let mut v = Vec::with_capacity(len);
    for i in 0..(len / 8) as u64 {
        let mut x = seed ^ (offset / 8 + i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        v.extend_from_slice(&(x ^ (x >> 29)).to_le_bytes());
    }
    v
}

/// A 64-bit checksum over 8-byte words (FNV-style), fast enough in debug builds.
fn checksum(h: &mut u64, data: &[u8]) {
    for w in data.chunks(8) {
        let mut b = [0u8; 8];
        b[..w.len()].copy_from_slice(w);
        *h = (*h ^ u64::from_le_bytes(b)).wrapping_mul(0x0000_0100_0000_01B3);
    }
}

#[test]
fn data_written_on_either_side_is_seen_on_the_other() {
    with_mount("data", None, |m| {
        fs::write(m.m("a"), b"through the mount").unwrap();
        assert_eq!(fs::read(m.b("a")).unwrap(), b"through the mount", "write-through to the backing file");
        fs::write(m.b("b"), b"behind the mount").unwrap();
        assert_eq!(fs::read(m.m("b")).unwrap(), b"behind the mount");
        // Overwrite in the middle, append, read at offsets.
        let f = OpenOptions::new().read(true).write(true).open(m.m("a")).unwrap();
        f.write_all_at(b"THROUGH", 0).unwrap();
        let mut app = OpenOptions::new().append(true).open(m.m("a")).unwrap();
        app.write_all(b"!").unwrap();
        drop(app);
        let mut buf = [0u8; 7];
        f.read_exact_at(&mut buf, 8).unwrap();
        assert_eq!(&buf, b"the mou");
        assert_eq!(fs::read(m.b("a")).unwrap(), b"THROUGH the mount!");
        assert_eq!(fs::metadata(m.m("a")).unwrap().len(), 18);
        // Reads past the end are short, then empty.
        let mut big = vec![0u8; 100];
        assert_eq!(f.read_at(&mut big, 10).unwrap(), 8);
        assert_eq!(f.read_at(&mut big, 1000).unwrap(), 0);
        // mmap through the mount sees the file.
        // SAFETY: mapping 18 bytes of an open file read-only and reading them back.
        unsafe {
            let p = libc::mmap(std::ptr::null_mut(), 18, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(std::slice::from_raw_parts(p as *const u8, 7), b"THROUGH");
            libc::munmap(p, 18);
        }
        // An application's own O_DIRECT open works (aligned I/O).
        let ab = o_direct_write_then_read(&m.m("direct"), 4096);
        assert!(ab.iter().all(|&x| x == 0x5a));
        assert_eq!(fs::read(m.b("direct")).unwrap(), vec![0x5a; 4096]);
    });
}

#[test]
fn names_and_their_errors() {
    with_mount("names", None, |m| {
        assert_eq!(errno(File::open(m.m("missing"))), libc::ENOENT);
        assert_eq!(errno(fs::metadata(m.m("missing/deeper"))), libc::ENOENT);
        fs::write(m.m("f"), b"x").unwrap();
        assert_eq!(errno(OpenOptions::new().write(true).create_new(true).open(m.m("f"))), libc::EEXIST);
        fs::create_dir(m.m("d")).unwrap();
        assert!(m.b("d").is_dir());
        assert_eq!(errno(fs::create_dir(m.m("d"))), libc::EEXIST);
        assert_eq!(errno(fs::create_dir(m.m("f"))), libc::EEXIST);
        assert_eq!(errno(OpenOptions::new().write(true).open(m.m("d"))), libc::EISDIR);
        assert_eq!(errno(File::open(m.m("f/x"))), libc::ENOTDIR);
        assert_eq!(errno(fs::create_dir(m.m("f/x"))), libc::ENOTDIR);
        fs::write(m.m("d/inner"), b"y").unwrap();
        assert_eq!(errno(fs::remove_dir(m.m("d"))), libc::ENOTEMPTY);
        assert_eq!(errno(fs::remove_dir(m.m("f"))), libc::ENOTDIR);
        assert_eq!(errno(fs::remove_file(m.m("d"))), libc::EISDIR);
        assert_eq!(errno(fs::remove_file(m.m("missing"))), libc::ENOENT);
        let long = "n".repeat(256);
        assert_eq!(errno(File::create(m.m(&long))), libc::ENAMETOOLONG);
        fs::remove_file(m.m("d/inner")).unwrap();
        fs::remove_dir(m.m("d")).unwrap();
        assert!(!m.b("d").exists());
        // A file unlinked while open keeps its data for the open descriptor.
        let f = OpenOptions::new().read(true).write(true).open(m.m("f")).unwrap();
        fs::remove_file(m.m("f")).unwrap();
        assert!(!m.b("f").exists());
        f.write_all_at(b"still here", 0).unwrap();
        let mut buf = [0u8; 10];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"still here");
        assert_eq!(f.metadata().unwrap().nlink(), 0);
    });
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<i64> {
    let (a, b) = (cpath(from), cpath(to));
    // SAFETY: NUL-terminated paths.
    cvt(unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) } as i64)
}

#[test]
fn rename_over_files_dirs_and_open_files_with_flags() {
    with_mount("rename", None, |m| {
        fs::write(m.m("old"), b"old content").unwrap();
        fs::write(m.m("new"), b"new content").unwrap();
        // The target is open while it is renamed over: its reader keeps the old data.
        let held = File::open(m.m("old")).unwrap();
        fs::rename(m.m("new"), m.m("old")).unwrap();
        assert_eq!(fs::read(m.m("old")).unwrap(), b"new content");
        assert_eq!(fs::read(m.b("old")).unwrap(), b"new content");
        assert!(!m.m("new").exists() && !m.b("new").exists());
        let mut buf = Vec::new();
        (&held).read_to_end(&mut buf).unwrap();
        assert_eq!(buf, b"old content");
        // Directories move with their contents; a file open inside stays usable.
        fs::create_dir_all(m.m("d1/sub")).unwrap();
        fs::write(m.m("d1/sub/f"), b"deep").unwrap();
        let inside = OpenOptions::new().read(true).write(true).open(m.m("d1/sub/f")).unwrap();
        fs::rename(m.m("d1"), m.m("d2")).unwrap();
        inside.write_all_at(b"DEEP", 0).unwrap();
        assert_eq!(fs::read(m.m("d2/sub/f")).unwrap(), b"DEEP");
        assert_eq!(fs::read(m.b("d2/sub/f")).unwrap(), b"DEEP");
        // RENAME_NOREPLACE refuses an existing target; RENAME_EXCHANGE swaps.
        fs::write(m.m("x"), b"x").unwrap();
        fs::write(m.m("y"), b"y").unwrap();
        assert_eq!(errno(renameat2(&m.m("x"), &m.m("y"), libc::RENAME_NOREPLACE)), libc::EEXIST);
        renameat2(&m.m("x"), &m.m("z"), libc::RENAME_NOREPLACE).unwrap();
        renameat2(&m.m("z"), &m.m("y"), libc::RENAME_EXCHANGE).unwrap();
        assert_eq!(fs::read(m.m("y")).unwrap(), b"x");
        assert_eq!(fs::read(m.m("z")).unwrap(), b"y");
        assert_eq!(fs::read(m.b("y")).unwrap(), b"x");
        assert_eq!(fs::read(m.b("z")).unwrap(), b"y", "exchanged on the backing file system");
        // Kind mismatches and non-empty targets.
        fs::create_dir(m.m("empty")).unwrap();
        assert_eq!(errno(fs::rename(m.m("y"), m.m("d2"))), libc::EISDIR);
        assert_eq!(errno(fs::rename(m.m("d2"), m.m("y"))), libc::ENOTDIR);
        assert_eq!(errno(fs::rename(m.m("empty"), m.m("d2"))), libc::ENOTEMPTY);
        fs::rename(m.m("d2"), m.m("empty")).unwrap();
        assert_eq!(fs::read(m.m("empty/sub/f")).unwrap(), b"DEEP");
        assert_eq!(errno(fs::rename(m.m("nothing"), m.m("y"))), libc::ENOENT);
    });
}

#[test]
fn files_losing_their_last_name_are_reported_to_the_data_path() {
    let m = Mounted::start("forget", None);
    for n in ["a", "b", "d", "e", "f"] {
        fs::write(m.m(n), n).unwrap();
    }
    fs::hard_link(m.m("a"), m.m("c")).unwrap();
    fs::remove_file(m.m("a")).unwrap(); // "c" still names it: not dead
    fs::remove_file(m.m("c")).unwrap(); // dead (1)
    fs::rename(m.m("b"), m.m("d")).unwrap(); // the old "d" is dead (2)
    renameat2(&m.m("d"), &m.m("e"), libc::RENAME_EXCHANGE).unwrap(); // nobody dies
    fs::rename(m.m("e"), m.m("g")).unwrap(); // no target: nobody dies

    // Other tests of this binary fork children: between fork and exec a child holds copies of
    // whatever descriptors this process had open, files of this mount included, and the
    // unmount is refused (EBUSY) for that instant. Retry, bounded.
    let mut tries = 0;
    let out = loop {
        let out = Command::new("fusermount3").arg("-u").arg(&m.mnt).output().unwrap();
        tries += 1;
        if out.status.success() || tries == 40 || !String::from_utf8_lossy(&out.stderr).contains("busy") {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(out.status.success(), "{out:?} after {tries} tries");
    assert_eq!(m.wait_exit(), 0);
    let log = m.log_text();
    assert!(log.contains("; 2 files lost their last name"), "{log}");
}

#[test]
fn hard_links_are_one_inode() {
    with_mount("links", None, |m| {
        fs::write(m.m("a"), b"shared").unwrap();
        fs::hard_link(m.m("a"), m.m("b")).unwrap();
        let (ma, mb) = (fs::metadata(m.m("a")).unwrap(), fs::metadata(m.m("b")).unwrap());
        assert_eq!(ma.ino(), mb.ino());
        assert_eq!(ma.nlink(), 2);
        assert_eq!(fs::metadata(m.b("a")).unwrap().ino(), fs::metadata(m.b("b")).unwrap().ino());
        OpenOptions::new().write(true).open(m.m("b")).unwrap().write_all_at(b"SHARED", 0).unwrap();
        assert_eq!(fs::read(m.m("a")).unwrap(), b"SHARED");
        assert_eq!(fs::read(m.b("a")).unwrap(), b"SHARED");
        fs::remove_file(m.m("a")).unwrap();
        assert_eq!(fs::read(m.m("b")).unwrap(), b"SHARED");
        assert_eq!(fs::metadata(m.m("b")).unwrap().nlink(), 1);
        fs::create_dir(m.m("d")).unwrap();
        assert_eq!(errno(fs::hard_link(m.m("d"), m.m("d2"))), libc::EPERM);
        assert_eq!(errno(fs::hard_link(m.m("b"), m.m("d"))), libc::EEXIST);
        assert_eq!(errno(fs::hard_link(m.m("none"), m.m("n2"))), libc::ENOENT);
        // A hard link to a symlink stays a symlink.
        symlink("b", m.m("s")).unwrap();
        fs::hard_link(m.m("s"), m.m("s2")).unwrap();
        assert_eq!(fs::read_link(m.m("s2")).unwrap(), Path::new("b"));
    });
}

#[test]
fn symlinks_resolve_dangle_and_loop() {
    with_mount("symlinks", None, |m| {
        fs::create_dir(m.m("dir")).unwrap();
        fs::write(m.m("dir/target"), b"t").unwrap();
        symlink("dir/target", m.m("rel")).unwrap();
        symlink(m.m("dir/target"), m.m("abs")).unwrap();
        assert_eq!(fs::read_link(m.m("rel")).unwrap(), Path::new("dir/target"));
        assert_eq!(fs::read_link(m.b("rel")).unwrap(), Path::new("dir/target"));
        assert_eq!(fs::read(m.m("rel")).unwrap(), b"t");
        assert_eq!(fs::read(m.m("abs")).unwrap(), b"t");
        assert!(fs::symlink_metadata(m.m("rel")).unwrap().file_type().is_symlink());
        symlink("nowhere", m.m("dangling")).unwrap();
        assert_eq!(errno(File::open(m.m("dangling"))), libc::ENOENT);
        symlink("loop2", m.m("loop1")).unwrap();
        symlink("loop1", m.m("loop2")).unwrap();
        assert_eq!(errno(File::open(m.m("loop1"))), libc::ELOOP);
        assert_eq!(errno(symlink("x", m.m("rel"))), libc::EEXIST);
        assert_eq!(errno(fs::read_link(m.m("dir/target"))), libc::EINVAL);
        // O_NOFOLLOW on a symlink.
        assert_eq!(errno(OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(m.m("rel"))), libc::ELOOP);
    });
}

#[test]
fn setattr_mode_owner_times_and_size() {
    require_root("chown");
    with_mount("setattr", None, |m| {
        fs::write(m.m("f"), b"0123456789").unwrap();
        fs::set_permissions(m.m("f"), fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(fs::metadata(m.m("f")).unwrap().mode() & 0o7777, 0o640);
        assert_eq!(fs::metadata(m.b("f")).unwrap().mode() & 0o7777, 0o640);
        std::os::unix::fs::chown(m.m("f"), Some(1234), Some(5678)).unwrap();
        let md = fs::metadata(m.b("f")).unwrap();
        assert_eq!((md.uid(), md.gid()), (1234, 5678));
        // Symlinks get their own owner (lchown).
        symlink("f", m.m("s")).unwrap();
        std::os::unix::fs::lchown(m.m("s"), Some(42), None).unwrap();
        assert_eq!(fs::symlink_metadata(m.b("s")).unwrap().uid(), 42);
        assert_eq!(fs::metadata(m.b("f")).unwrap().uid(), 1234);
        // Specific times, then UTIME_NOW.
        let p = cpath(&m.m("f"));
        let ts = [
            libc::timespec { tv_sec: 1_000_000_000, tv_nsec: 5 },
            libc::timespec { tv_sec: 1_100_000_000, tv_nsec: 7 },
        ];
        // SAFETY: NUL-terminated path, two timespecs.
        cvt(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), ts.as_ptr(), 0) } as i64).unwrap();
        let md = fs::metadata(m.b("f")).unwrap();
        assert_eq!((md.atime(), md.atime_nsec(), md.mtime(), md.mtime_nsec()), (1_000_000_000, 5, 1_100_000_000, 7));
        assert_eq!(fs::metadata(m.m("f")).unwrap().mtime(), 1_100_000_000);
        let now = [
            libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
            libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        ];
        // SAFETY: as above.
        cvt(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), now.as_ptr(), 0) } as i64).unwrap();
        let md = fs::metadata(m.b("f")).unwrap();
        assert_eq!(md.atime(), 1_000_000_000, "UTIME_OMIT left atime alone");
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        assert!((md.mtime() - wall).abs() < 60, "UTIME_NOW set mtime to now");
        // truncate(2) by path: shrink, then extend with zeros.
        let p = cpath(&m.m("f"));
        // SAFETY: NUL-terminated path.
        cvt(unsafe { libc::truncate(p.as_ptr(), 4) } as i64).unwrap();
        assert_eq!(fs::read(m.m("f")).unwrap(), b"0123");
        // SAFETY: as above.
        cvt(unsafe { libc::truncate(p.as_ptr(), 8) } as i64).unwrap();
        assert_eq!(fs::read(m.m("f")).unwrap(), b"0123\0\0\0\0");
        assert_eq!(fs::read(m.b("f")).unwrap(), b"0123\0\0\0\0");
        // ftruncate through an open handle, and O_TRUNC on open.
        let f = OpenOptions::new().read(true).write(true).open(m.m("f")).unwrap();
        f.set_len(2).unwrap();
        let mut s = String::new();
        (&f).read_to_string(&mut s).unwrap();
        assert_eq!(s, "01");
        fs::write(m.m("f"), b"abc").unwrap();
        OpenOptions::new().write(true).truncate(true).open(m.m("f")).unwrap();
        assert_eq!(fs::metadata(m.b("f")).unwrap().len(), 0);
        fs::create_dir(m.m("d")).unwrap();
        let d = cpath(&m.m("d"));
        // SAFETY: NUL-terminated path.
        assert_eq!(errno(cvt(unsafe { libc::truncate(d.as_ptr(), 0) } as i64)), libc::EISDIR);
    });
}

#[test]
fn fallocate_punch_holes_and_sparse_files() {
    with_mount("sparse", None, |m| {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("f")).unwrap();
        let fd = f.as_raw_fd();
        // SAFETY: plain syscalls on an open descriptor.
        cvt(unsafe { libc::fallocate(fd, 0, 0, 1 << 20) } as i64).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 1 << 20);
        assert!(fs::metadata(m.b("f")).unwrap().blocks() * 512 >= 1 << 20, "space allocated");
        // SAFETY: as above.
        cvt(unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20) } as i64).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 1 << 20, "KEEP_SIZE keeps the size");
        f.write_all_at(&vec![7u8; 64 << 10], 0).unwrap();
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: as above.
        cvt(unsafe { libc::fallocate(fd, punch, 4096, 8192) } as i64).unwrap();
        let mut buf = vec![1u8; 16384];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 7));
        assert!(buf[4096..12288].iter().all(|&b| b == 0), "punched range reads zeros");
        assert!(buf[12288..].iter().all(|&b| b == 7));
        // A sparse file: one block written 1 GiB in.
        let s = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("sparse")).unwrap();
        s.write_all_at(b"end", 1 << 30).unwrap();
        let md = fs::metadata(m.m("sparse")).unwrap();
        assert_eq!(md.len(), (1 << 30) + 3);
        assert!(md.blocks() < 1024, "sparse: {} blocks allocated", md.blocks());
        let mut z = vec![9u8; 8192];
        s.read_exact_at(&mut z, 1 << 29).unwrap();
        assert!(z.iter().all(|&b| b == 0), "holes read as zeros");
        // SAFETY: plain syscalls.
        let data = cvt(unsafe { libc::lseek(s.as_raw_fd(), 0, libc::SEEK_DATA) }).unwrap();
        let hole = cvt(unsafe { libc::lseek(s.as_raw_fd(), 0, libc::SEEK_HOLE) }).unwrap();
        if writeback_run() {
            // The write is in the kernel's cache, not yet in the backing file: the kernel
            // answers as for a file system without holes (all data, the hole at the end),
            // never a hole where data was written.
            assert_eq!((data, hole), (0, (1 << 30) + 3));
        } else {
            // SEEK_DATA / SEEK_HOLE go to the backing file.
            assert!(((1 << 30) - 4096..=1 << 30).contains(&data), "SEEK_DATA found the data at {data}");
            assert_eq!(hole, 0);
        }
        // fallocate needs a writable descriptor.
        let ro = File::open(m.m("f")).unwrap();
        // SAFETY: plain syscall.
        assert_eq!(errno(cvt(unsafe { libc::fallocate(ro.as_raw_fd(), 0, 0, 4096) } as i64)), libc::EBADF);
    });
}

#[test]
fn large_file_64mib_sequential_checksum() {
    with_mount("large", None, |m| {
        const CHUNK: usize = 1 << 20;
        const CHUNKS: u64 = 64;
        let mut f = File::create(m.m("big")).unwrap();
        let mut written = 0xcbf2_9ce4_8422_2325u64;
        for i in 0..CHUNKS {
            let c = pattern(42, i * CHUNK as u64, CHUNK);
            checksum(&mut written, &c);
            f.write_all(&c).unwrap();
        }
        f.sync_all().unwrap();
        drop(f);
        let sum = |p: &Path| {
            let mut h = 0xcbf2_9ce4_8422_2325u64;
            let mut f = File::open(p).unwrap();
            let mut buf = vec![0u8; CHUNK];
            for _ in 0..CHUNKS {
                f.read_exact(&mut buf).unwrap();
                checksum(&mut h, &buf);
            }
            assert_eq!(f.read(&mut buf).unwrap(), 0, "{} is longer than written", p.display());
            h
        };
        assert_eq!(sum(&m.m("big")), written, "read back through the mount");
        assert_eq!(sum(&m.b("big")), written, "the backing file");
    });
}

#[test]
fn concurrent_readers_and_writers() {
    with_mount("concurrent", None, |m| {
        const REGION: usize = 256 << 10;
        const WRITERS: u64 = 4;
        const ROUNDS: u64 = 8;
        File::create(m.m("shared")).unwrap().set_len(WRITERS * REGION as u64).unwrap();
        std::thread::scope(|s| {
            for w in 0..WRITERS {
                let path = m.m("shared");
                s.spawn(move || {
                    let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
                    let off = w * REGION as u64;
                    for round in 0..ROUNDS {
                        let data = pattern(w * 1000 + round, off, REGION);
                        f.write_all_at(&data, off).unwrap();
                        let mut back = vec![0u8; REGION];
                        f.read_exact_at(&mut back, off).unwrap();
                        assert!(back == data, "writer {w} round {round}: read back differs");
                    }
                });
            }
            for r in 0..4u64 {
                let path = m.m("shared");
                s.spawn(move || {
                    let f = File::open(&path).unwrap();
                    let mut buf = vec![0u8; 4096];
                    for i in 0..2000u64 {
                        let off = (i * 7919 + r * 104_729) % (WRITERS * REGION as u64 - 4096);
                        f.read_exact_at(&mut buf, off).unwrap();
                    }
                });
            }
        });
        let all = fs::read(m.b("shared")).unwrap();
        for w in 0..WRITERS {
            let off = w * REGION as u64;
            assert!(
                all[off as usize..off as usize + REGION] == pattern(w * 1000 + ROUNDS - 1, off, REGION),
                "region {w}"
            );
        }
    });
}

#[test]
fn readdir_of_10000_entries() {
    with_mount("readdir", None, |m| {
        const N: usize = 10_000;
        fs::create_dir(m.m("many")).unwrap();
        for i in 0..N {
            File::create(m.m(&format!("many/entry-{i:05}"))).unwrap();
        }
        let mut names: Vec<String> =
            fs::read_dir(m.m("many")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), N, "every entry exactly once");
        names.sort();
        names.dedup();
        assert_eq!(names.len(), N, "no duplicates");
        assert_eq!(fs::read_dir(m.b("many")).unwrap().count(), N);
        // d_ino equals st_ino through the mount, and "." and ".." are listed (raw getdents
        // through libc's readdir).
        let dir = cpath(&m.m("many"));
        // SAFETY: opendir/readdir/closedir on a path we own; entries read before closedir.
        let (dots, ino_ok) = unsafe {
            let d = libc::opendir(dir.as_ptr());
            assert!(!d.is_null());
            let (mut dots, mut ok) = (0, 0);
            for _ in 0..N + 10 {
                let e = libc::readdir(d);
                if e.is_null() {
                    break;
                }
                let name = std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_str().unwrap().to_string();
                if name == "." || name == ".." {
                    dots += 1;
                } else if name == "entry-00042" && (*e).d_ino == fs::metadata(m.m("many/entry-00042")).unwrap().ino() {
                    ok += 1;
                }
            }
            libc::closedir(d);
            (dots, ok)
        };
        assert_eq!(dots, 2);
        assert_eq!(ino_ok, 1, "d_ino matches st_ino");
        // Entries made behind the mount show up too; removal through the mount empties it.
        fs::write(m.b("many/behind"), b"").unwrap();
        assert_eq!(fs::read_dir(m.m("many")).unwrap().count(), N + 1);
        for e in fs::read_dir(m.m("many")).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
        assert_eq!(fs::read_dir(m.b("many")).unwrap().count(), 0);
        fs::remove_dir(m.m("many")).unwrap();
    });
}

fn xattr_get(p: &Path, name: &str, size: usize) -> io::Result<Vec<u8>> {
    let (cp, cn) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    // SAFETY: NUL-terminated strings; the kernel writes at most size bytes into buf.
    let n = cvt(unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), size) } as i64)?;
    buf.truncate(if size == 0 { 0 } else { n as usize });
    if size == 0 {
        buf = vec![0; n as usize];
    }
    Ok(buf)
}

fn xattr_set(p: &Path, name: &str, v: &[u8], flags: i32) -> io::Result<i64> {
    let (cp, cn) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: NUL-terminated strings; v read for v.len() bytes.
    cvt(unsafe { libc::setxattr(cp.as_ptr(), cn.as_ptr(), v.as_ptr().cast(), v.len(), flags) } as i64)
}

/// `mount.xattrs = false`: every xattr call through the mount is "not supported" (the
/// kernel stops asking the daemon, which spares every write(2) its security.capability
/// lookup), and a write still drops a file's capabilities, as a local file system does.
#[test]
fn extended_attributes_off() {
    with_mount("xattr-off", Some("[mount]\nxattrs = false\n"), |m| {
        fs::write(m.m("f"), b"before").unwrap();
        assert_eq!(errno(xattr_set(&m.m("f"), "user.color", b"blue", 0)), libc::EOPNOTSUPP);
        xattr_set(&m.b("f"), "user.color", b"blue", 0).unwrap();
        assert_eq!(errno(xattr_get(&m.m("f"), "user.color", 64)), libc::EOPNOTSUPP, "set behind the mount");
        let cp = cpath(&m.m("f"));
        let mut list = vec![0u8; 256];
        // SAFETY: NUL-terminated path; at most 256 bytes written.
        let r = cvt(unsafe { libc::listxattr(cp.as_ptr(), list.as_mut_ptr().cast(), list.len()) } as i64);
        assert_eq!(errno(r), libc::EOPNOTSUPP);
        // SAFETY: no arguments, no memory.
        if unsafe { libc::geteuid() } == 0 {
            // File capabilities (VFS_CAP_REVISION_2: cap_net_raw permitted), set behind the
            // mount, must go with the next write through it.
            let mut cap = Vec::new();
            for w in [0x0200_0000u32, 1 << 13, 0, 0, 0] {
                cap.extend_from_slice(&w.to_le_bytes());
            }
            xattr_set(&m.b("f"), "security.capability", &cap, 0).unwrap();
            assert_eq!(xattr_get(&m.b("f"), "security.capability", 64).unwrap().len(), cap.len());
        }
        let f = OpenOptions::new().write(true).open(m.m("f")).unwrap();
        f.write_all_at(b"after!", 0).unwrap();
        f.sync_all().unwrap();
        assert_eq!(errno(xattr_get(&m.b("f"), "security.capability", 64)), libc::ENODATA);
        assert_eq!(fs::read(m.m("f")).unwrap(), b"after!");
    });
}

#[test]
fn extended_attributes() {
    with_mount("xattr", None, |m| {
        fs::write(m.m("f"), b"").unwrap();
        xattr_set(&m.m("f"), "user.color", b"blue", 0).unwrap();
        assert_eq!(xattr_get(&m.m("f"), "user.color", 64).unwrap(), b"blue");
        assert_eq!(xattr_get(&m.b("f"), "user.color", 64).unwrap(), b"blue", "stored on the backing file");
        assert_eq!(xattr_get(&m.m("f"), "user.color", 0).unwrap().len(), 4, "size query");
        assert_eq!(errno(xattr_get(&m.m("f"), "user.color", 2)), libc::ERANGE);
        assert_eq!(errno(xattr_get(&m.m("f"), "user.none", 64)), libc::ENODATA);
        assert_eq!(errno(xattr_set(&m.m("f"), "user.color", b"red", libc::XATTR_CREATE)), libc::EEXIST);
        assert_eq!(errno(xattr_set(&m.m("f"), "user.size", b"big", libc::XATTR_REPLACE)), libc::ENODATA);
        xattr_set(&m.m("f"), "user.color", b"red", libc::XATTR_REPLACE).unwrap();
        xattr_set(&m.m("f"), "user.shape", b"round", 0).unwrap();
        let cp = cpath(&m.m("f"));
        let mut list = vec![0u8; 256];
        // SAFETY: NUL-terminated path; at most 256 bytes written.
        let n = cvt(unsafe { libc::listxattr(cp.as_ptr(), list.as_mut_ptr().cast(), list.len()) } as i64).unwrap();
        let names: Vec<&[u8]> = list[..n as usize].split(|&b| b == 0).filter(|s| !s.is_empty()).collect();
        assert!(names.contains(&&b"user.color"[..]) && names.contains(&&b"user.shape"[..]), "{names:?}");
        let rm = CString::new("user.color").unwrap();
        // SAFETY: NUL-terminated strings.
        cvt(unsafe { libc::removexattr(cp.as_ptr(), rm.as_ptr()) } as i64).unwrap();
        assert_eq!(errno(xattr_get(&m.b("f"), "user.color", 64)), libc::ENODATA);
        // SAFETY: as above.
        assert_eq!(errno(cvt(unsafe { libc::removexattr(cp.as_ptr(), rm.as_ptr()) } as i64)), libc::ENODATA);
        fs::create_dir(m.m("d")).unwrap();
        xattr_set(&m.m("d"), "user.dir", b"1", 0).unwrap();
        assert_eq!(xattr_get(&m.b("d"), "user.dir", 8).unwrap(), b"1");
    });
}

#[test]
fn fifos_statfs_fsync_and_access() {
    with_mount("misc", None, |m| {
        let p = cpath(&m.m("fifo"));
        // SAFETY: NUL-terminated path.
        cvt(unsafe { libc::mkfifo(p.as_ptr(), 0o600) } as i64).unwrap();
        assert!(fs::metadata(m.b("fifo")).unwrap().file_type().is_fifo());
        assert!(fs::metadata(m.m("fifo")).unwrap().file_type().is_fifo());
        // SAFETY: NUL-terminated path.
        assert_eq!(errno(cvt(unsafe { libc::mkfifo(p.as_ptr(), 0o600) } as i64)), libc::EEXIST);
        // statfs: the backing file system's numbers.
        let sv = |path: &Path| {
            let c = cpath(path);
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: NUL-terminated path; fills s.
            cvt(unsafe { libc::statvfs(c.as_ptr(), &mut s) } as i64).unwrap();
            s
        };
        let (a, b) = (sv(&m.mnt), sv(&m.backing));
        match &m.second {
            // A union: the branches' sizes added up, in the first branch's fragment size.
            Some(s) => {
                let s = sv(s);
                let bytes = |v: &libc::statvfs| v.f_blocks as u128 * v.f_frsize as u128;
                assert_eq!(a.f_blocks as u128, (bytes(&b) + bytes(&s)) / b.f_frsize as u128);
                assert_eq!(a.f_files, b.f_files + s.f_files);
            }
            None => assert_eq!(
                (a.f_bsize, a.f_blocks, a.f_files, a.f_namemax),
                (b.f_bsize, b.f_blocks, b.f_files, b.f_namemax)
            ),
        }
        // fsync, fdatasync, and fsync of a directory.
        let f = File::create(m.m("durable")).unwrap();
        (&f).write_all(b"data").unwrap();
        f.sync_all().unwrap();
        f.sync_data().unwrap();
        File::open(&m.mnt).unwrap().sync_all().unwrap();
        fs::create_dir(m.m("d")).unwrap();
        File::open(m.m("d")).unwrap().sync_all().unwrap();
        // access(2) (the kernel answers it from the attributes under default_permissions).
        let c = cpath(&m.m("durable"));
        // SAFETY: NUL-terminated path.
        cvt(unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) } as i64).unwrap();
        // SAFETY: as above.
        assert_eq!(errno(cvt(unsafe { libc::access(c.as_ptr(), libc::X_OK) } as i64)), libc::EACCES);
    });
}

/// Run `args` as user/group 65534 (nobody) with no supplementary groups.
fn as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(args)
        .output()
        .expect("setpriv (util-linux)")
}

#[test]
fn other_users_get_kernel_permission_checks_and_own_what_they_create() {
    require_root("acting as another user");
    with_mount("perms", None, |m| {
        fs::create_dir(m.m("private")).unwrap();
        fs::set_permissions(m.m("private"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(m.m("private/secret"), b"s").unwrap();
        fs::write(m.m("readonly"), b"r").unwrap();
        fs::set_permissions(m.m("readonly"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::create_dir(m.m("shared")).unwrap();
        fs::set_permissions(m.m("shared"), fs::Permissions::from_mode(0o777)).unwrap();
        let mnt = |rel: &str| m.m(rel).to_str().unwrap().to_string();
        let out = as_nobody(&["cat", &mnt("private/secret")]);
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
        let out = as_nobody(&["ls", &mnt("private")]);
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
        let out = as_nobody(&["sh", "-c", &format!("echo x >> {}", mnt("readonly"))]);
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
        let out = as_nobody(&["cat", &mnt("readonly")]);
        assert!(out.status.success() && out.stdout == b"r", "{out:?}");
        // What another user creates is theirs, on the backing file system too.
        let out = as_nobody(&[
            "sh",
            "-c",
            &format!("echo mine > {0} && mkdir {1} && ln -s x {2}", mnt("shared/f"), mnt("shared/d"), mnt("shared/l")),
        ]);
        assert!(out.status.success(), "{out:?}");
        for name in ["shared/f", "shared/d", "shared/l"] {
            let md = fs::symlink_metadata(m.b(name)).unwrap();
            assert_eq!((md.uid(), md.gid()), (65534, 65534), "{name}");
        }
        // A set-group-id directory gives its group to what is made in it.
        fs::create_dir(m.m("sgid")).unwrap();
        std::os::unix::fs::chown(m.m("sgid"), None, Some(4242)).unwrap();
        fs::set_permissions(m.m("sgid"), fs::Permissions::from_mode(0o2777)).unwrap();
        let out = as_nobody(&["touch", &mnt("sgid/f")]);
        assert!(out.status.success(), "{out:?}");
        let md = fs::metadata(m.b("sgid/f")).unwrap();
        assert_eq!((md.uid(), md.gid()), (65534, 4242));
    });
}

/// A write or truncation by a user without `CAP_FSETID` drops the file's set-user-id bit, and
/// its set-group-id bit where group execute is set; root's does not; a write drops file
/// capabilities. Under `mount.handle_killpriv` (the default, FUSE_HANDLE_KILLPRIV_V2) the
/// daemon does this, not the kernel; with it off the kernel does — the same outcome.
#[test]
fn set_id_bits_and_capabilities_go_with_writes_and_truncates() {
    require_root("acting as another user");
    for (tag, cfg) in [("killpriv", None), ("killpriv-off", Some("[mount]\nhandle_killpriv = false\n"))] {
        with_mount(tag, cfg, |m| {
            let mnt = |rel: &str| m.m(rel).to_str().unwrap().to_string();
            let mode = |rel: &str| fs::metadata(m.b(rel)).unwrap().permissions().mode() & 0o7777;
            for (name, bits) in [("w", 0o6777), ("w-nogx", 0o6767), ("t", 0o6777), ("o", 0o6777), ("root", 0o6777)] {
                fs::write(m.b(name), b"0123456789").unwrap();
                fs::set_permissions(m.b(name), fs::Permissions::from_mode(bits)).unwrap();
            }
            // Every file is read once through the mount first, so the kernel knows its mode.
            for name in ["w", "w-nogx", "t", "o", "root"] {
                assert_eq!(fs::read(m.m(name)).unwrap(), b"0123456789");
            }
            let out = as_nobody(&["sh", "-c", &format!("printf x >> {} && printf y >> {}", mnt("w"), mnt("w-nogx"))]);
            assert!(out.status.success(), "{out:?}");
            assert_eq!(mode("w"), 0o0777, "{tag}: a write by nobody drops both bits (group execute set)");
            assert_eq!(mode("w-nogx"), 0o2767, "{tag}: set-group-id without group execute stays");
            let out = as_nobody(&["truncate", "-s", "3", &mnt("t")]);
            assert!(out.status.success(), "{out:?}");
            assert_eq!(mode("t"), 0o0777, "{tag}: a truncate by nobody drops both bits");
            assert_eq!(fs::read(m.b("t")).unwrap(), b"012");
            let out = as_nobody(&["sh", "-c", &format!(": > {}", mnt("o"))]);
            assert!(out.status.success(), "{out:?}");
            assert_eq!(mode("o"), 0o0777, "{tag}: an O_TRUNC open by nobody drops both bits");
            assert_eq!(fs::read(m.b("o")).unwrap(), b"");
            let f = OpenOptions::new().append(true).open(m.m("root")).unwrap();
            f.write_all_at(b"!", 10).unwrap();
            f.sync_all().unwrap();
            assert_eq!(mode("root"), 0o6777, "{tag}: root (CAP_FSETID) keeps them");
            // File capabilities (VFS_CAP_REVISION_2: cap_net_raw permitted), set behind the
            // mount, go with the next write through it.
            let mut cap = Vec::new();
            for w in [0x0200_0000u32, 1 << 13, 0, 0, 0] {
                cap.extend_from_slice(&w.to_le_bytes());
            }
            fs::write(m.b("cap"), b"c").unwrap();
            xattr_set(&m.b("cap"), "security.capability", &cap, 0).unwrap();
            let f = OpenOptions::new().write(true).open(m.m("cap")).unwrap();
            f.write_all_at(b"d", 0).unwrap();
            f.sync_all().unwrap();
            assert_eq!(errno(xattr_get(&m.b("cap"), "security.capability", 64)), libc::ENODATA, "{tag}");
            // Extended attributes still work under FUSE_HANDLE_KILLPRIV_V2.
            xattr_set(&m.m("cap"), "user.color", b"blue", 0).unwrap();
            assert_eq!(xattr_get(&m.m("cap"), "user.color", 64).unwrap(), b"blue");
        });
    }
}

/// `mount.direct_io_backing_writes`: aligned writes reach the backing file without staying in
/// its page cache, unaligned ones are written buffered, and every read — through the mount
/// after its cache is dropped, with O_DIRECT, and of the backing file — sees the newest bytes
/// whichever way each write went.
#[test]
fn direct_backing_writes_are_coherent_and_leave_the_backing_file_uncached() {
    const LEN: usize = 4 << 20;
    with_mount("direct-writes", Some("[mount]\ndirect_io_backing_writes = true\n"), |m| {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("f")).unwrap();
        let mut model = pattern(1, 0, LEN);
        f.write_all_at(&model, 0).unwrap();
        // Aligned and unaligned writes over the same pages, in turn.
        for (i, (off, len)) in
            [(0usize, 8192usize), (104, 5000), (8192, 65536), (4088, 16), (1 << 20, 1 << 20), (LEN - 24, 24)]
                .into_iter()
                .enumerate()
        {
            let data = pattern(10 + i as u64, off as u64, len);
            f.write_all_at(&data, off as u64).unwrap();
            model[off..off + len].copy_from_slice(&data);
            let mut back = vec![0u8; len];
            f.read_exact_at(&mut back, off as u64).unwrap();
            assert!(back == data, "write {i} at {off}+{len}: read back through the mount");
        }
        f.sync_all().unwrap();
        // The backing file, read on its own side, has every write.
        assert!(fs::read(m.b("f")).unwrap() == model, "the backing file");
        // SAFETY: plain syscall on an open descriptor; drops the mount's cached pages.
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
        drop(f);
        assert!(fs::read(m.m("f")).unwrap() == model, "through the mount, after its cache was dropped");
        // Aligned writes of a fresh file: the backing file's pages are not cached after them.
        let (res, pages) = write_aligned_and_count_backing_pages(m, "g", LEN);
        assert!(res * 20 < pages, "direct backing writes: {res} of {pages} backing pages cached (want < 5%)");
        assert!(fs::read(m.m("g")).unwrap() == pattern(3, 0, LEN));
    });
    // The check can fail: with buffered backing writes the same writes cache the backing file.
    with_mount("buffered-writes", Some("[mount]\ndirect_io_backing_writes = false\n"), |m| {
        let (res, pages) = write_aligned_and_count_backing_pages(m, "g", LEN);
        assert!(res * 2 > pages, "buffered backing writes: only {res} of {pages} pages cached");
    });
}

/// Write a fresh `name` of `len` bytes through the mount in aligned 64 KiB writes, fsync it,
/// and count its backing file's pages in the page cache (resident, all).
fn write_aligned_and_count_backing_pages(m: &Mounted, name: &str, len: usize) -> (usize, usize) {
    let g = OpenOptions::new().write(true).create(true).truncate(true).open(m.m(name)).unwrap();
    for i in 0..(len / 65536) {
        g.write_all_at(&pattern(3, (i * 65536) as u64, 65536), (i * 65536) as u64).unwrap();
    }
    g.sync_all().unwrap();
    drop(g);
    resident_pages(&m.b(name))
}

/// Pages of `path` resident in the page cache, and the file's pages.
fn resident_pages(path: &Path) -> (usize, usize) {
    let f = File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let pages = len.div_ceil(4096);
    // SAFETY: a read-only shared mapping of len bytes of an open file, unmapped below;
    // mincore writes one byte per page into vec.
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED);
        let mut vec = vec![0u8; pages];
        assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
        libc::munmap(p, len);
        (vec.iter().filter(|&&b| b & 1 != 0).count(), pages)
    }
}

/// Write a file on the backing side and drop it from the page cache.
fn cold_backing_file(path: &Path, len: usize) {
    let f = File::create(path).unwrap();
    f.write_all_at(&pattern(7, 0, len), 0).unwrap();
    f.sync_all().unwrap();
    // SAFETY: plain syscall on an open descriptor.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    let (res, _) = resident_pages(path);
    assert!(res < 16, "setup: {res} pages still cached");
}

#[test]
fn direct_backing_reads_leave_the_backing_file_out_of_the_page_cache() {
    const LEN: usize = 8 << 20;
    with_mount("direct-on", None, |m| {
        cold_backing_file(&m.b("cold"), LEN);
        let data = fs::read(m.m("cold")).unwrap();
        assert!(data == pattern(7, 0, LEN), "content through the mount");
        let (res, pages) = resident_pages(&m.b("cold"));
        assert!(res * 20 < pages, "direct_io_backing: {res} of {pages} backing pages cached (want < 5%)");
    });
    // The check can fail: with buffered backing reads the same read caches the backing file.
    with_mount("direct-off", Some("[mount]\ndirect_io_backing = false\n"), |m| {
        cold_backing_file(&m.b("cold"), LEN);
        fs::read(m.m("cold")).unwrap();
        let (res, pages) = resident_pages(&m.b("cold"));
        assert!(res * 2 > pages, "buffered backing reads: only {res} of {pages} pages cached");
    });
}

#[test]
fn changes_behind_the_mount_show_without_keep_cache() {
    let cfg = "[mount]\nkeep_cache = false\nattr_timeout = \"0s\"\nentry_timeout = \"0s\"\n";
    with_mount("nocache", Some(cfg), |m| {
        fs::write(m.b("f"), b"version 1").unwrap();
        assert_eq!(fs::read(m.m("f")).unwrap(), b"version 1");
        fs::write(m.b("f"), b"version 2").unwrap();
        assert_eq!(fs::read(m.m("f")).unwrap(), b"version 2");
        fs::remove_file(m.b("f")).unwrap();
        assert_eq!(errno(File::open(m.m("f"))), libc::ENOENT);
    });
}

#[test]
fn sigterm_unmounts_and_exits_zero() {
    let m = Mounted::start("sigterm", None);
    fs::write(m.m("f"), b"x").unwrap();
    m.signal(libc::SIGTERM);
    assert_eq!(m.wait_exit(), 0, "exit code after SIGTERM:\n{}", m.log_text());
    assert!(!fuse_mounted(&m.mnt), "still mounted after SIGTERM");
    assert_eq!(fs::read(m.b("f")).unwrap(), b"x");
}

#[test]
fn sigint_while_busy_detaches_then_exits_zero() {
    let m = Mounted::start("busy", Some("[mount]\nshutdown_grace = \"1s\"\n"));
    let held = File::create(m.m("held")).unwrap();
    m.signal(libc::SIGINT);
    assert_eq!(m.wait_exit(), 0, "exit code after SIGINT:\n{}", m.log_text());
    assert!(!fuse_mounted(&m.mnt), "still mounted after SIGINT");
    drop(held);
}

#[test]
fn fusermount_u_ends_the_daemon_cleanly() {
    let m = Mounted::start("fusermount", None);
    let out = Command::new("fusermount3").arg("-u").arg(&m.mnt).output().unwrap();
    assert!(out.status.success(), "fusermount3 -u: {out:?}");
    assert_eq!(m.wait_exit(), 0, "exit code after fusermount3 -u:\n{}", m.log_text());
    assert!(!fuse_mounted(&m.mnt));
}

/// Run `farcache mount` expecting it to refuse; its stderr.
fn refused(args: &[&std::ffi::OsStr], wrap: &[&str]) -> String {
    let mut cmd = if wrap.is_empty() { Command::new(bin()) } else { Command::new(wrap[0]) };
    if !wrap.is_empty() {
        cmd.args(&wrap[1..]).arg(bin());
    }
    let out = cmd.arg("mount").args(args).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn startup_errors_name_the_problem() {
    require_fuse();
    let root = test_root("errors");
    let (dir, file, mnt) = (root.join("dir"), root.join("file"), root.join("mnt"));
    fs::create_dir(&dir).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(&file, b"").unwrap();
    let o = |p: &Path| p.as_os_str().to_owned();
    let e = refused(&[&o(&root.join("nope")), &o(&mnt)], &[]);
    assert!(e.contains("does not exist") && e.contains("backing directory"), "{e}");
    let e = refused(&[&o(&file), &o(&mnt)], &[]);
    assert!(e.contains("is not a directory"), "{e}");
    let e = refused(&[&o(&dir), &o(&root.join("nomnt"))], &[]);
    assert!(e.contains("mount point") && e.contains("does not exist"), "{e}");
    fs::create_dir(dir.join("inner")).unwrap();
    let e = refused(&[&o(&dir), &o(&dir.join("inner"))], &[]);
    assert!(e.contains("inside backing directory"), "{e}");
    let cfg = root.join("bad.toml");
    fs::write(&cfg, "[mount]\nthreds = 4\n").unwrap();
    let e = refused(&[&o(&dir), &o(&mnt), "--config".as_ref(), &o(&cfg)], &[]);
    assert!(e.contains("threds"), "{e}");
    fs::write(&cfg, "[mount]\nthreads = 0\n").unwrap();
    let e = refused(&[&o(&dir), &o(&mnt), "--config".as_ref(), &o(&cfg)], &[]);
    assert!(e.contains("mount.threads"), "{e}");
    // /dev/fuse missing: hide /dev in a private mount namespace.
    require_root("unshare -m");
    let script = format!("mount -t tmpfs none /dev && exec \"$0\" mount {} {}", dir.display(), mnt.display());
    let e = refused(&[], &["unshare", "-m", "--propagation", "private", "sh", "-c", &script]);
    assert!(e.contains("/dev/fuse is not available"), "{e}");
    // fusermount3 missing for a non-root user.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "env", "PATH=/nonexistent"])
        .arg(bin())
        .args(["mount", "/usr", "/tmp"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && e.contains("fusermount3 not found"), "{out:?}");
    assert!(!fuse_mounted(&mnt));
    fs::remove_dir_all(&root).unwrap();
}
