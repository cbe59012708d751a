//! `mount.kernel_passthrough`: a `--no-remote` mount whose files' reads, writes and mmap go
//! from the kernel to the backing file without a request to the daemon. End to end with the
//! real binary and a real FUSE mount (root: registering a backing file needs CAP_SYS_ADMIN).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use farcache_testkit::{pattern, text, wait_until, AlignedBuf, MountDirs};
use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn dirs() -> MountDirs {
    MountDirs::new("the kernel passthrough tests")
}

/// `farcache mount --config CFG EXTRA BACKING d.mnt` that must refuse to start: its stderr.
fn refused(d: &MountDirs, backing: &Path, mount_table: &str, extra: &[&str]) -> String {
    let cfg = d.config(mount_table);
    let mut args = vec!["mount", "--config", cfg.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend([backing.to_str().unwrap(), d.mnt.to_str().unwrap()]);
    let out = farcache_testkit::run_bin(bin(), &args);
    assert!(!out.status.success(), "it started: {}", text(&out.stderr));
    text(&out.stderr)
}

fn fuse_stats(mnt: &Path) -> Value {
    let out = farcache_testkit::run_bin(bin(), &["stats", mnt.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "farcache stats: {}", text(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["fuse"].clone()
}

fn count(f: &Value, key: &str) -> u64 {
    f[key].as_u64().unwrap_or_else(|| panic!("no fuse.{key} in {f:#}"))
}

/// Pages of `path` in the page cache (mincore of a mapping of it).
fn resident_pages(path: &Path) -> usize {
    let f = File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let pages = len.div_ceil(4096);
    // SAFETY: a read-only shared mapping of a file we hold open, unmapped below.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` has a byte per page of the mapping.
    assert_eq!(unsafe { libc::mincore(p, len, vec.as_mut_ptr()) }, 0);
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(p, len) };
    vec.iter().filter(|b| *b & 1 == 1).count()
}

/// Drop `path`'s pages from the page cache.
fn evict(path: &Path) {
    let f = File::open(path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: a valid descriptor; advice only.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
}

#[test]
fn files_are_served_by_the_kernel_without_the_daemon() {
    let d = dirs();
    let data = pattern(1 << 20, 11);
    fs::write(d.backing.join("f"), &data).unwrap();
    let m = d.mount(bin(), "kernel_passthrough = true\n", &["--no-remote"]);
    let f0 = fuse_stats(m.mnt());
    assert_eq!(f0["kernel_passthrough"], true, "{f0:#}");
    assert_eq!(f0["kernel_passthrough_problem"], "", "{f0:#}");

    // An O_DIRECT reader and writer, and a buffered one, on one file at once: one backing
    // file for the inode, both served.
    let direct = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(m.m("f")).unwrap();
    let buffered = OpenOptions::new().read(true).write(true).open(m.m("f")).unwrap();
    assert_eq!(count(&fuse_stats(m.mnt()), "passthrough_files"), 1);
    let mut v = AlignedBuf::new(8192);
    let buf = v.buf();
    direct.read_exact_at(buf, 65536).unwrap();
    assert_eq!(&buf[..], &data[65536..65536 + 8192]);
    let new = pattern(8192, 12);
    buf.copy_from_slice(&new);
    direct.write_all_at(buf, 4096).unwrap();
    let mut got = vec![0u8; 8192];
    buffered.read_exact_at(&mut got, 4096).unwrap();
    assert_eq!(got, new, "the buffered reader sees the direct write");
    buffered.write_all_at(b"hello", 100).unwrap();
    buffered.sync_data().unwrap();
    let mut expect = data.clone();
    expect[4096..4096 + 8192].copy_from_slice(&new);
    expect[100..105].copy_from_slice(b"hello");
    assert_eq!(fs::read(d.backing.join("f")).unwrap(), expect, "the backing file has every write");

    // mmap of a passthrough file maps the backing file.
    // SAFETY: a shared read-only mapping of an open file, unmapped below.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), expect.len(), libc::PROT_READ, libc::MAP_SHARED, buffered.as_raw_fd(), 0)
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping is expect.len() bytes long.
    let mapped = unsafe { std::slice::from_raw_parts(p as *const u8, expect.len()) };
    assert!(mapped == &expect[..], "mmap differs from the file");
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(p, expect.len()) };

    // A file created through the mount, then truncated: attributes stay the daemon's.
    let mut n = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("n")).unwrap();
    n.write_all(&data[..300_000]).unwrap();
    n.set_len(200_000).unwrap();
    assert_eq!(fs::metadata(m.m("n")).unwrap().len(), 200_000);
    assert_eq!(fs::read(m.m("n")).unwrap(), &data[..200_000]);
    assert_eq!(fs::read(d.backing.join("n")).unwrap(), &data[..200_000]);

    // A fifo through the mount is the kernel's own (no OPEN reaches the daemon for it):
    // opening one leaves passthrough on for the files.
    let fifo = std::ffi::CString::new(d.backing.join("p").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    drop(OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(m.m("p")).unwrap());

    let f1 = fuse_stats(m.mnt());
    assert_eq!(f1["kernel_passthrough"], true, "the fifo switched passthrough off: {f1:#}");
    let ops = |f: &Value, op: &str| f["ops"][op].as_u64().unwrap();
    assert_eq!(ops(&f1, "read") - ops(&f0, "read"), 0, "a read reached the daemon: {f1:#}");
    assert_eq!(ops(&f1, "write") - ops(&f0, "write"), 0, "a write reached the daemon: {f1:#}");
    assert!(count(&f1, "passthrough_opens") >= 4, "{f1:#}"); // direct, buffered, n, fs::read of n
    assert_eq!(count(&f1, "passthrough_files"), 2, "f and n are open: {f1:#}");

    // The last close of each file closes its backing id; an open after that registers anew.
    drop((direct, buffered, n));
    let closed = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        count(&fuse_stats(m.mnt()), "passthrough_files") == 0
    });
    assert!(closed, "backing ids left after every file was closed: {:#}", fuse_stats(m.mnt()));
    assert_eq!(fs::read(m.m("f")).unwrap(), expect);
    let log = m.stop();
    assert!(!log.contains("mount.kernel_passthrough:"), "{log}");
}

/// The kernel opens the backing file with the application's flags: an O_DIRECT reader
/// through the mount reads the disk, not the backing file's page cache (paper 002's bug was
/// a silent fall-back to buffered I/O), and a buffered one fills that cache.
#[test]
fn an_o_direct_reader_stays_direct() {
    let d = dirs();
    let path = d.backing.join("f");
    fs::write(&path, pattern(4 << 20, 13)).unwrap();
    evict(&path);
    let before = resident_pages(&path);
    let m = d.mount(bin(), "kernel_passthrough = true\nread_ahead = \"0\"\n", &["--no-remote"]);
    let direct = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(m.m("f")).unwrap();
    let mut v = AlignedBuf::new(1 << 20);
    let buf = v.buf();
    direct.read_exact_at(buf, 0).unwrap();
    assert!(resident_pages(&path) <= before + 4, "O_DIRECT reads filled the backing file's cache");
    drop(direct);
    let buffered = File::open(m.m("f")).unwrap();
    let mut got = vec![0u8; 1 << 20];
    buffered.read_exact_at(&mut got, 2 << 20).unwrap();
    assert!(resident_pages(&path) >= before + 256, "buffered reads did not use the backing file's cache");
    assert_eq!(count(&fuse_stats(m.mnt()), "passthrough_opens"), 2);
}

#[test]
fn mounts_that_need_the_daemon_refuse_it_by_name() {
    let d = dirs();
    let e = refused(&d, &d.backing, "kernel_passthrough = true\n", &[]);
    assert!(e.contains("mount.kernel_passthrough") && e.contains("--no-remote"), "{e}");
    let e = refused(&d, &d.backing, "kernel_passthrough = true\nwriteback_cache = true\n", &["--no-remote"]);
    assert!(e.contains("mount.kernel_passthrough") && e.contains("writeback_cache"), "{e}");
    let e = refused(&d, &d.backing, "kernel_passthrough = true\n", &["--no-remote", "--supervise"]);
    assert!(e.contains("mount.kernel_passthrough") && e.contains("--supervise"), "{e}");
    let other = d.root.path().join("b2");
    fs::create_dir(&other).unwrap();
    let both = format!("{}:{}", d.backing.display(), other.display());
    let e = refused(&d, Path::new(&both), "kernel_passthrough = true\n", &["--no-remote"]);
    assert!(e.contains("mount.kernel_passthrough") && e.contains("several backing directories"), "{e}");
}

/// A daemon with files open in the kernel's passthrough refuses to hand its connection to
/// another (that one's opens of those files would fail), says why, and serves on.
#[test]
fn a_mount_serving_in_passthrough_is_not_taken_over() {
    let d = dirs();
    fs::write(d.backing.join("f"), b"kept").unwrap();
    let m = d.mount(bin(), "kernel_passthrough = true\n", &["--no-remote"]);
    let open = File::open(m.m("f")).unwrap();
    let e = refused(&d, &d.backing, "", &["--takeover", "--no-remote"]);
    assert!(e.contains("kernel_passthrough"), "{e}");
    let mut got = [0u8; 4];
    open.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(&got, b"kept");
    assert_eq!(fs::read(m.m("f")).unwrap(), b"kept", "the running daemon serves on");
    drop(open);
    m.stop();
}
