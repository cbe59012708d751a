//! FUSE requests by opcode (`fuse.ops` in `farcache stats --json`), end to end with the real
//! binary and a real FUSE mount: known system calls on a mounted file move exactly the
//! counters they must. These tests need root and FUSE (CI and developer machines run as
//! root).

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use farcache_testkit::{text, MountDirs, MountProcess};
use serde_json::Value;

/// Held by every test of this file for its whole run. A process this test binary spawns
/// (a mount, `farcache stats`) inherits every open descriptor until its exec closes them, and
/// the kernel sends FUSE a FLUSH for each: another test's spawn while a file here is open
/// adds a FLUSH this file's exact counts did not make (seen in CI, session 24).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// A backing directory with one 64 KiB file, and an empty mount point.
struct Dirs(MountDirs);

impl std::ops::Deref for Dirs {
    type Target = MountDirs;
    fn deref(&self) -> &MountDirs {
        &self.0
    }
}

impl Dirs {
    fn new() -> Dirs {
        let d = MountDirs::new("the FUSE opcode counter tests");
        fs::write(d.backing.join("f"), vec![7u8; 64 << 10]).unwrap();
        Dirs(d)
    }

    /// `farcache mount --no-remote` with this `[mount]` table.
    fn mount(&self, mount_table: &str) -> MountProcess {
        self.0.mount(bin(), mount_table, &["--no-remote"])
    }
}

/// The mount's `fuse` stats (`farcache stats MNT --json`).
fn fuse_stats(mnt: &Path) -> Value {
    let out = farcache_testkit::run_bin(bin(), &["stats", mnt.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "farcache stats: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["fuse"].clone()
}

/// The mount's requests by opcode (`fuse.ops`).
fn ops(mnt: &Path) -> Value {
    fuse_stats(mnt)["ops"].clone()
}

fn n(v: &Value, op: &str) -> u64 {
    v[op].as_u64().unwrap_or_else(|| panic!("no fuse.ops.{op} in {v:#}"))
}

/// Requests of `op` between two snapshots.
fn delta(before: &Value, after: &Value, op: &str) -> u64 {
    n(after, op) - n(before, op)
}

#[test]
fn known_calls_move_exactly_their_opcodes() {
    let _serial = one_at_a_time();
    let d = Dirs::new();
    // Write-through (the kernel's write-back cache off): one WRITE per write(2).
    let m = d.mount("writeback_cache = false\n");
    let path = m.m("f");
    let before = ops(m.mnt());
    // Every name is there from the start, zero or not, and `other` too.
    for op in ["lookup", "getattr", "open", "read", "write", "fsync", "flush", "release", "lseek", "other"] {
        n(&before, op);
    }
    let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let mid = ops(m.mnt());
    assert_eq!(delta(&before, &mid, "open"), 1, "{mid:#}");
    for i in 0..10u64 {
        f.write_all_at(&[i as u8; 4096], i * 4096).unwrap();
        f.sync_all().unwrap();
    }
    let after = ops(m.mnt());
    assert_eq!(delta(&mid, &after, "write"), 10, "{after:#}");
    assert_eq!(delta(&mid, &after, "fsync"), 10, "{after:#}");
    assert_eq!(delta(&mid, &after, "open"), 0, "{after:#}");
    drop(f);
    // close(2) sends FLUSH, and RELEASE follows (asynchronously).
    let released = farcache_testkit::wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        delta(&after, &ops(m.mnt()), "release") == 1
    });
    assert!(released, "no RELEASE counted: {:#}", ops(m.mnt()));
    let closed = ops(m.mnt());
    assert_eq!(delta(&after, &closed, "flush"), 1, "{closed:#}");
    // SEEK_DATA is FUSE_LSEEK (SEEK_END is answered by the kernel, from attributes).
    let mut f = OpenOptions::new().read(true).open(&path).unwrap();
    let s0 = ops(m.mnt());
    let r = nix_seek_data(&f);
    let s1 = ops(m.mnt());
    assert_eq!(r, 0);
    assert_eq!(delta(&s0, &s1, "lseek"), 1, "{s1:#}");
    assert_eq!(f.seek(SeekFrom::End(0)).unwrap(), 64 << 10);
    m.stop();
}

/// `lseek(fd, 0, SEEK_DATA)`.
fn nix_seek_data(f: &fs::File) -> i64 {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on a descriptor we own.
    unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) }
}

/// Write-through writes of one file, and the GETXATTR requests they cost.
fn getxattrs_for_ten_writes(d: &Dirs, mount_table: &str) -> u64 {
    let m = d.mount(mount_table);
    let f = OpenOptions::new().write(true).open(m.m("f")).unwrap();
    let before = ops(m.mnt());
    for i in 0..10u64 {
        f.write_all_at(&[i as u8; 4096], i * 4096).unwrap();
    }
    let after = ops(m.mnt());
    assert_eq!(delta(&before, &after, "write"), 10, "{after:#}");
    drop(f);
    m.stop();
    delta(&before, &after, "getxattr")
}

/// Without FUSE_HANDLE_KILLPRIV_V2 the kernel asks for `security.capability` before every
/// write(2) (a GETXATTR round trip each); with it (`mount.handle_killpriv`, the default) it
/// asks once per file at most, and never again once the file is known to have none.
#[test]
fn handle_killpriv_spares_writes_their_getxattr() {
    let _serial = one_at_a_time();
    let d = Dirs::new();
    let off = getxattrs_for_ten_writes(&d, "writeback_cache = false\nhandle_killpriv = false\n");
    assert_eq!(off, 10, "one GETXATTR per write without FUSE_HANDLE_KILLPRIV_V2");
    let on = getxattrs_for_ten_writes(&d, "writeback_cache = false\n");
    assert!(on <= 1, "{on} GETXATTRs for 10 writes with FUSE_HANDLE_KILLPRIV_V2");
}

/// Mount with `mount_table`, wait (bounded) until the mount's readahead window is `want_kb`,
/// then read a 16 MiB file through it from start to end: the READ requests it took.
fn reads_for_a_sequential_16mib(d: &Dirs, mount_table: &str, want_kb: u64) -> u64 {
    let big = vec![3u8; 16 << 20];
    fs::write(d.backing.join("big"), &big).unwrap();
    let m = d.mount(mount_table);
    let set = farcache_testkit::wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
        fuse_stats(m.mnt())["read_ahead_kb"].as_u64() == Some(want_kb)
    });
    let f = fuse_stats(m.mnt());
    assert!(set, "the window never became {want_kb} KiB: {f:#}");
    assert_eq!(f["read_ahead_problem"], "", "{f:#}");
    let before = ops(m.mnt());
    let mut got = Vec::new();
    let mut f = fs::File::open(m.m("big")).unwrap();
    std::io::Read::read_to_end(&mut f, &mut got).unwrap();
    assert!(got == big, "the file read back differs");
    delta(&before, &ops(m.mnt()), "read")
}

#[test]
fn a_sequential_reader_is_served_in_windows_of_mount_read_ahead() {
    let _serial = one_at_a_time();
    let d = Dirs::new();
    // The default (1 MiB): 16 requests of 1 MiB once the window has grown, a few smaller
    // ones while it grows.
    let wide = reads_for_a_sequential_16mib(&d, "", 1024);
    assert!((16..=24).contains(&wide), "{wide} READ requests for 16 MiB with a 1 MiB window");
    // The kernel's own window (128 KiB): at least 128 requests.
    let narrow = reads_for_a_sequential_16mib(&d, "read_ahead = \"0\"\n", 128);
    assert!(narrow >= 128, "{narrow} READ requests for 16 MiB with a 128 KiB window");
}

#[test]
fn a_read_ahead_out_of_range_is_refused_by_name() {
    let _serial = one_at_a_time();
    let d = Dirs::new();
    let cfg = d.root.path().join("bad.toml");
    fs::write(&cfg, "[mount]\nread_ahead = \"32MiB\"\n").unwrap();
    let out = farcache_testkit::run_bin(
        bin(),
        &[
            "mount",
            "--no-remote",
            "--config",
            cfg.to_str().unwrap(),
            d.backing.to_str().unwrap(),
            d.mnt.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("mount.read_ahead") && err.contains("16MiB"), "{err}");
}
