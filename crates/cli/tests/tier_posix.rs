//! POSIX through a mount with a write-back tier (issue 12): what an application does — writes
//! at offsets, appends, short reads, mmap, its own O_DIRECT, truncates both ways, punched
//! holes, renames and unlinks of files whose newest data is only in the tier, hard links — is
//! seen through the mount at once, and is all in the backing directory, under the right names,
//! after a clean unmount. Then `farcache tier status` and `farcache tier recover` on a tier a
//! SIGKILL left dirty.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use farcache_testkit::{o_direct_write_then_read, require_fuse, require_root, MountProcess, TierScratch};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

type Dirs = TierScratch;

fn dirs(name: &str) -> Dirs {
    TierScratch::new(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("tierposix-{name}"))
}

fn mount(d: &Dirs, log: &str) -> MountProcess {
    let t = d.tier.display().to_string();
    let sock = d.base.join("ctl").display().to_string();
    MountProcess::start(
        bin(),
        &d.base.join("b"),
        &d.base.join("m"),
        &["--no-remote", "--tier", &t, "--tier-size", "64MiB", "--control-socket", &sock],
        &d.base.join(log),
    )
}

fn stats(d: &Dirs) -> serde_json::Value {
    let out = Command::new(bin())
        .args(["stats", "--control-socket"])
        .arg(d.base.join("ctl"))
        .arg(d.base.join("m"))
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn posix_through_a_tier_and_all_of_it_on_the_disk_after_a_clean_unmount() {
    require_fuse();
    require_root("the tier POSIX test (FUSE mounts)");
    let d = dirs("ops");
    let m = mount(&d, "log");
    // Writes at offsets, an append, short reads.
    fs::write(m.m("a"), b"through the mount").unwrap();
    let f = OpenOptions::new().read(true).write(true).open(m.m("a")).unwrap();
    f.write_all_at(b"THROUGH", 0).unwrap();
    let mut app = OpenOptions::new().append(true).open(m.m("a")).unwrap();
    app.write_all(b"!").unwrap();
    drop(app);
    f.sync_all().unwrap(); // the first: reaches the disk (the new inode)
    f.write_all_at(b"THROUGH", 0).unwrap();
    f.sync_data().unwrap(); // later ones: absorbed
    assert_eq!(fs::read(m.m("a")).unwrap(), b"THROUGH the mount!");
    assert_eq!(fs::metadata(m.m("a")).unwrap().len(), 18);
    let mut big = vec![0u8; 100];
    assert_eq!(f.read_at(&mut big, 10).unwrap(), 8);
    assert_eq!(f.read_at(&mut big, 1000).unwrap(), 0);
    // mmap sees it.
    // SAFETY: mapping 18 bytes of an open file read-only and reading them back.
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), 18, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(std::slice::from_raw_parts(p as *const u8, 7), b"THROUGH");
        libc::munmap(p, 18);
    }
    drop(f);
    // The application's own O_DIRECT, aligned.
    let ab = o_direct_write_then_read(&m.m("direct"), 8192);
    assert!(ab.iter().all(|&x| x == 0x5a), "O_DIRECT reads back what O_DIRECT wrote");
    // Truncate down into dirty data, then up: the cut bytes read as zeros.
    let t = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("trunc")).unwrap();
    t.write_all_at(&[7u8; 3 * 4096], 0).unwrap();
    t.set_len(5000).unwrap();
    t.set_len(3 * 4096).unwrap();
    let mut want_trunc = vec![7u8; 5000];
    want_trunc.resize(3 * 4096, 0);
    assert_eq!(fs::read(m.m("trunc")).unwrap(), want_trunc);
    drop(t);
    // A hole punched into dirty data.
    let h = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("hole")).unwrap();
    h.write_all_at(&[3u8; 4 * 4096], 0).unwrap();
    // SAFETY: fallocate on an open descriptor.
    let r =
        unsafe { libc::fallocate(h.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 4096, 8192) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let mut want_hole = vec![3u8; 4 * 4096];
    want_hole[4096..3 * 4096].fill(0);
    assert_eq!(fs::read(m.m("hole")).unwrap(), want_hole);
    drop(h);
    // SEEK_DATA / SEEK_HOLE never call a range the tier holds a hole: a sparse file whose
    // only data is dirty in the tier (the backing file has a hole there) is all data.
    let sparse = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("sparse")).unwrap();
    sparse.write_all_at(b"tail", 1 << 24).unwrap();
    // SAFETY: plain syscalls on an open descriptor.
    let (data, hole) = unsafe {
        (libc::lseek(sparse.as_raw_fd(), 0, libc::SEEK_DATA), libc::lseek(sparse.as_raw_fd(), 0, libc::SEEK_HOLE))
    };
    assert_eq!((data, hole), (0, (1 << 24) + 4), "{}", std::io::Error::last_os_error());
    drop(sparse);
    // Renamed while its data is only in the tier; a hard link; an unlinked file still open.
    fs::write(m.m("old"), vec![9u8; 20000]).unwrap();
    fs::rename(m.m("old"), m.m("new")).unwrap();
    fs::hard_link(m.m("new"), m.m("link")).unwrap();
    assert_eq!(fs::read(m.m("link")).unwrap(), vec![9u8; 20000]);
    let gone = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("gone")).unwrap();
    gone.write_all_at(&[1u8; 8192], 0).unwrap();
    fs::remove_file(m.m("gone")).unwrap();
    let mut back = vec![0u8; 8192];
    gone.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(back, vec![1u8; 8192], "an unlinked file still open reads its newest data");
    drop(gone);
    // A larger file, written in 1 MiB writes.
    let data: Vec<u8> = (0..16u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    fs::write(m.m("big"), &data).unwrap();
    assert!(fs::read(m.m("big")).unwrap() == data);
    // The mark on the backing root is no file in it (a database may want the root empty).
    let names: Vec<_> = fs::read_dir(m.mnt()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!names.iter().any(|n| n == ".farcache-tier"), "{names:?}");
    assert!(farcache_engine::writeback::marker::read(&d.base.join("b")).unwrap().is_some());
    // The tier took the writes and absorbed the fsync; the backing lacks data yet.
    let s = stats(&d);
    let tier = &s["tier"];
    assert!(tier["writes"].as_u64().unwrap() > 10, "{tier}");
    assert!(tier["fsyncs_absorbed"].as_u64().unwrap() >= 1, "{tier}");
    assert_eq!(tier["mode"], "dram", "{tier}");
    // A clean unmount writes everything back, under the names it has now.
    let log = m.stop();
    assert!(log.contains("everything destaged"), "{log}");
    let b = |n: &str| fs::read(d.base.join("b").join(n)).unwrap();
    assert_eq!(b("a"), b"THROUGH the mount!");
    assert_eq!(b("direct"), vec![0x5a; 8192]);
    assert_eq!(b("trunc"), want_trunc);
    assert_eq!(b("hole"), want_hole);
    assert_eq!(b("new"), vec![9u8; 20000]);
    assert_eq!(b("link"), vec![9u8; 20000]);
    assert!(b("big") == data);
    assert!(!d.base.join("b/old").exists() && !d.base.join("b/gone").exists());
    assert!(
        farcache_engine::writeback::marker::read(&d.base.join("b")).unwrap().is_none(),
        "a clean unmount removes the marker"
    );
}

/// Paper 003's small-file gain: a file written and deleted while its data is only in the tier
/// never costs the disk a write — once no process has it open. One still open keeps its
/// data readable until it closes.
#[test]
fn a_deleted_file_is_never_written_to_the_disk() {
    require_fuse();
    require_root("the tier POSIX test (FUSE mounts)");
    let d = dirs("discard");
    // No write-back because the mount is idle: only the deleted file's fate is measured.
    let conf = d.base.join("farcache.toml");
    fs::write(&conf, "[tier]\nidle_destage_after = \"0s\"\n").unwrap();
    let t = d.tier.display().to_string();
    let sock = d.base.join("ctl").display().to_string();
    let args = ["--no-remote", "--tier", &t, "--tier-size", "64MiB", "--control-socket", &sock, "--config"];
    let conf = conf.display().to_string();
    let args: Vec<&str> = args.iter().copied().chain([conf.as_str()]).collect();
    let m = MountProcess::start(bin(), &d.base.join("b"), &d.base.join("m"), &args, &d.base.join("log"));
    fs::write(m.m("short-lived"), vec![9u8; 256 << 10]).unwrap();
    let open = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("open")).unwrap();
    open.write_all_at(&[3u8; 64 << 10], 0).unwrap();
    fs::remove_file(m.m("short-lived")).unwrap();
    fs::remove_file(m.m("open")).unwrap();
    // Forgetting is the kernel's, soon after the unlink: wait for it, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let t = loop {
        let t = stats(&d)["tier"].clone();
        if t["discarded_files"].as_u64() >= Some(1) || std::time::Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(t["discarded_files"], 1, "the closed file's data was dropped, the open one's kept: {t}");
    assert_eq!(t["discarded_blocks"], 64, "{t}");
    let mut b = vec![0u8; 64 << 10];
    open.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(b, vec![3u8; 64 << 10], "the file still open reads its newest data");
    let out = Command::new(bin())
        .args(["flush", "--control-socket"])
        .arg(d.base.join("ctl"))
        .arg(d.base.join("m"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t = stats(&d)["tier"].clone();
    assert_eq!(t["destaged_blocks"], 16, "only the open file's 16 blocks reached the disk: {t}");
    drop(open);
    m.stop();
}

#[test]
fn tier_status_and_recover_offline() {
    require_fuse();
    require_root("the tier recover test (FUSE mounts)");
    let d = dirs("recover");
    let m = mount(&d, "log");
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("f")).unwrap();
    f.write_all_at(&[8u8; 3 * 4096], 0).unwrap();
    f.sync_data().unwrap();
    drop(f);
    m.signal(libc::SIGKILL);
    m.wait_exit();
    drop(m);
    let t = d.tier.to_str().unwrap();
    let out = Command::new(bin()).args(["tier", "status", t]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("3 blocks") && text.contains("dram") && text.contains(" f"), "{text}");
    let b = d.base.join("b");
    assert!(fs::read(b.join("f")).unwrap().iter().all(|&x| x == 0), "the data is only in the tier");
    let out = Command::new(bin()).args(["tier", "recover", t]).arg(&b).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(fs::read(b.join("f")).unwrap(), vec![8u8; 3 * 4096]);
    assert!(farcache_engine::writeback::marker::read(&b).unwrap().is_none(), "recover marks the backing complete");
    // Now a mount without the tier is allowed again.
    let m = MountProcess::start(bin(), &b, &d.base.join("m"), &["--no-remote"], &d.base.join("log2"));
    assert_eq!(fs::read(m.m("f")).unwrap(), vec![8u8; 3 * 4096]);
    m.stop();
}

#[test]
fn a_busy_unmount_still_writes_the_tier_back_before_exiting() {
    require_fuse();
    require_root("the tier busy-unmount test (FUSE mounts)");
    let d = dirs("busy");
    let conf = d.base.join("f.toml");
    fs::write(&conf, "[mount]\nshutdown_grace = \"1s\"\n").unwrap();
    let t = d.tier.display().to_string();
    let c = conf.display().to_string();
    let m = MountProcess::start(
        bin(),
        &d.base.join("b"),
        &d.base.join("m"),
        &["--no-remote", "--tier", &t, "--config", &c],
        &d.base.join("log"),
    );
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.m("held")).unwrap();
    f.write_all_at(&[2u8; 8192], 0).unwrap();
    f.sync_data().unwrap();
    // SIGTERM while the file is held open: the mount is detached, the grace passes, and the
    // daemon writes the tier back before it exits.
    m.signal(libc::SIGTERM);
    assert_eq!(m.wait_exit(), 0, "{}", m.log_text());
    assert_eq!(fs::read(d.base.join("b/held")).unwrap(), vec![2u8; 8192], "{}", m.log_text());
    assert!(farcache_engine::writeback::marker::read(&d.base.join("b")).unwrap().is_none(), "{}", m.log_text());
    drop(f);
}
