//! The mount daemon holds an open descriptor for each file or directory the kernel keeps
//! known (crates/fuse/src/inode.rs). Where its hard limit cannot be raised (a root without
//! CAP_SYS_RESOURCE, a container) and stays below `mount.max_inodes`, a mount of one backing
//! directory holds them for a budget of its inodes and reopens the others by file handle
//! (tests/inode_descriptors.rs). A mount of several branches cannot: it says so at start,
//! naming the fix, and past the limit creates fail with a clear error (EMFILE or ENFILE) while
//! the mount stays up and every file it did create keeps its data.
//!
//! And a write-back tier, which holds a descriptor of its own for each file it has data of,
//! lets go of it when a deleted file is forgotten: creating and deleting many more files than
//! the limit, one after another, never runs out (postmark did, BENCHMARKS.md session 35). Nor
//! do many more dirty files than the limit: the tier keeps at most `tier.max_open_files` of
//! its descriptors (a quarter of the limit) and opens a file again when it writes it back.
//!
//! Its own test binary: the limit is the process's, lowered here (by each test, to the same
//! value) for the daemons to inherit.

use std::io::Write;
use std::path::Path;

use farcache_testkit::{require_fuse, require_root, LoopFs, MountProcess, ScratchDir, TierFile};

const LIMIT: u64 = 400;

/// One test at a time: one of them makes the kernel forget inodes (`drop_caches`), which
/// would close the descriptors another counts on running out of.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn lower_limit() {
    let lim = libc::rlimit { rlim_cur: LIMIT, rlim_max: LIMIT };
    // SAFETY: plain syscall; lowering a limit needs no privilege, and only these tests run in
    // this process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
}

#[test]
fn a_union_over_a_low_descriptor_limit_warns_and_creates_past_it_fail_cleanly() {
    require_fuse();
    require_root("the descriptor-limit test (FUSE mounts)");
    let _one = one_at_a_time();
    lower_limit();
    let d = ScratchDir::new(Path::new(env!("CARGO_TARGET_TMPDIR")), "nofile");
    // A union's branches are file systems of their own.
    let (fa, fb) = (LoopFs::new(&d.backing(), "a"), LoopFs::new(&d.backing(), "b"));
    let (a, b) = (fa.dir.clone(), fb.dir.clone());
    let branches = std::path::PathBuf::from(format!("{}:{}", a.display(), b.display()));
    let m = MountProcess::start(
        Path::new(env!("CARGO_BIN_EXE_farcache")),
        &branches,
        &d.mnt(),
        &["--no-remote"],
        &d.backing().with_extension("log"),
    );
    let log = m.log_text();
    assert!(
        log.contains(&format!("may hold {LIMIT} open descriptors"))
            && log.contains("several branches holds every descriptor")
            && log.contains("LimitNOFILE"),
        "the start does not warn of the limit and its fix:\n{log}"
    );
    let (mut made, mut refused) = (Vec::new(), 0);
    for i in 0..2 * LIMIT {
        let p = m.m(&format!("f{i}"));
        match std::fs::File::create(&p) {
            Ok(mut f) => {
                f.write_all(format!("file {i}").as_bytes()).unwrap();
                made.push(i);
            }
            Err(e) => {
                let code = e.raw_os_error();
                assert!(code == Some(libc::EMFILE) || code == Some(libc::ENFILE), "create f{i}: {e}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "{} creates past a limit of {LIMIT} descriptors all succeeded", 2 * LIMIT);
    assert!(made.len() as u64 > LIMIT / 2, "only {} creates succeeded", made.len());
    for i in &made {
        let name = format!("f{i}");
        let on = if a.join(&name).exists() { &a } else { &b };
        assert_eq!(std::fs::read_to_string(on.join(&name)).unwrap(), format!("file {i}"));
    }
    assert!(m.wait_exit_timeout(std::time::Duration::ZERO).is_none(), "the daemon exited:\n{}", m.log_text());
    m.stop();
}

#[test]
fn a_tier_lets_go_of_deleted_files_descriptors() {
    require_fuse();
    require_root("the descriptor-limit test (FUSE mounts)");
    let _one = one_at_a_time();
    lower_limit();
    let d = ScratchDir::new(Path::new(env!("CARGO_TARGET_TMPDIR")), "nofile-tier");
    let tier = TierFile::new("nofile");
    let t = tier.arg();
    let m = MountProcess::start(
        Path::new(env!("CARGO_BIN_EXE_farcache")),
        &d.backing(),
        &d.mnt(),
        &["--no-remote", "--tier", t, "--tier-size", "64MiB"],
        &d.backing().with_extension("log"),
    );
    // Written into the tier, closed, deleted: 3 × LIMIT files, one at a time, each with its
    // data only in the tier when it goes.
    for i in 0..3 * LIMIT {
        let p = m.m(&format!("g{i}"));
        let mut f = std::fs::File::create(&p).unwrap_or_else(|e| panic!("create g{i}: {e}\n{}", m.log_text()));
        f.write_all(&[i as u8; 4096]).unwrap();
        drop(f);
        std::fs::remove_file(&p).unwrap_or_else(|e| panic!("delete g{i}: {e}"));
    }
    let kept = m.m("kept");
    std::fs::write(&kept, b"still writable").unwrap();
    assert_eq!(std::fs::read(&kept).unwrap(), b"still writable");
    m.stop();
}

/// 1,500 files written through a dram tier under a limit of 400 descriptors and kept, all
/// dirty in the tier at once; then `farcache flush`, and every file's bytes on the backing.
/// The kernel is made to forget the files' inodes as the test goes (`drop_caches`), so that
/// the mount's inode table lets go of its descriptors and only the tier's could run out —
/// which they did, one per dirty file (EMFILE), before the tier had a budget.
#[test]
fn a_tier_with_more_dirty_files_than_the_limit_writes_every_one_back() {
    const FILES: usize = 1500;
    require_fuse();
    require_root("the descriptor-limit test (FUSE mounts)");
    let _one = one_at_a_time();
    lower_limit();
    let d = ScratchDir::new(Path::new(env!("CARGO_TARGET_TMPDIR")), "nofile-dirty");
    let tier = TierFile::new("nofile-dirty");
    let conf = d.backing().with_extension("toml");
    // Nothing destages by itself: every file stays dirty until the flush.
    std::fs::write(&conf, "[tier]\nidle_destage_after = \"0s\"\nmax_dirty_age = \"10m\"\n").unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_farcache"));
    let m = MountProcess::start(
        bin,
        &d.backing(),
        &d.mnt(),
        &["--no-remote", "--tier", tier.arg(), "--tier-size", "64MiB", "--config", conf.to_str().unwrap()],
        &d.backing().with_extension("log"),
    );
    let content = |i: usize| -> Vec<u8> { (0..4096 + 37 * (i % 50)).map(|j| (i * 7 + j / 13) as u8).collect() };
    for i in 0..FILES {
        let p = m.m(&format!("d{i}"));
        let mut f = std::fs::File::create(&p).unwrap_or_else(|e| panic!("create d{i}: {e}\n{}", m.log_text()));
        f.write_all(&content(i)).unwrap_or_else(|e| panic!("write d{i}: {e}\n{}", m.log_text()));
        drop(f);
        if i % 50 == 49 {
            // The kernel forgets the inodes it does not use (FUSE forgets).
            std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        }
    }
    let mnt = m.mnt().to_str().unwrap().to_string();
    let stats = || -> serde_json::Value {
        let out = std::process::Command::new(bin).args(["stats", &mnt, "--json"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = stats();
    let t = &v["tier"];
    assert!(t["dirty_bytes"].as_u64().unwrap() >= (FILES * 4096) as u64, "not every file is dirty in the tier: {t}");
    assert_eq!(t["write_through_unnamed"].as_u64(), Some(0), "writes went around the tier: {t}");
    assert!(t["open_files"].as_u64().unwrap() <= t["max_open_files"].as_u64().unwrap(), "{t}");
    let out = std::process::Command::new(bin).args(["flush", &mnt, "--timeout", "60s"]).output().unwrap();
    assert!(
        out.status.success(),
        "flush: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        m.log_text()
    );
    let t = &stats()["tier"];
    assert_eq!(t["dirty_bytes"].as_u64(), Some(0), "{t}");
    assert_eq!(t["destage_errors"].as_u64(), Some(0), "{t}");
    assert!(t["reopens"].as_u64().unwrap() > 0, "the tier never opened a file again: {t}");
    for i in 0..FILES {
        let got = std::fs::read(d.backing().join(format!("d{i}"))).unwrap();
        assert!(got == content(i), "d{i} on the backing is not what was written ({} bytes)", got.len());
    }
    assert!(m.wait_exit_timeout(std::time::Duration::ZERO).is_none(), "the daemon exited:\n{}", m.log_text());
    m.stop();
}
