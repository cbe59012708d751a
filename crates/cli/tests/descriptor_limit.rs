//! The mount daemon holds one open descriptor per file or directory the kernel keeps known
//! (crates/fuse/src/inode.rs). Where its hard limit cannot be raised (a root without
//! CAP_SYS_RESOURCE, a container) and stays below `mount.max_inodes`, it says so at start,
//! naming the fix; past the limit, creates fail with a clear error (EMFILE or ENFILE) while
//! the mount stays up and every file it did create keeps its data.
//!
//! And a write-back tier, which holds a descriptor of its own for each file it has data of,
//! lets go of it when a deleted file is forgotten: creating and deleting many more files than
//! the limit, one after another, never runs out (postmark did, BENCHMARKS.md session 35).
//!
//! Its own test binary: the limit is the process's, lowered here (by each test, to the same
//! value) for the daemons to inherit.

use std::io::Write;
use std::path::Path;

use farcache_testkit::{require_fuse, require_root, MountProcess, ScratchDir, TierFile};

const LIMIT: u64 = 400;

fn lower_limit() {
    let lim = libc::rlimit { rlim_cur: LIMIT, rlim_max: LIMIT };
    // SAFETY: plain syscall; lowering a limit needs no privilege, and only these tests run in
    // this process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
}

#[test]
fn a_low_descriptor_limit_is_reported_and_creates_past_it_fail_cleanly() {
    require_fuse();
    require_root("the descriptor-limit test (FUSE mounts)");
    lower_limit();
    let d = ScratchDir::new(Path::new(env!("CARGO_TARGET_TMPDIR")), "nofile");
    let m = MountProcess::start(
        Path::new(env!("CARGO_BIN_EXE_farcache")),
        &d.backing(),
        &d.mnt(),
        &["--no-remote"],
        &d.backing().with_extension("log"),
    );
    let log = m.log_text();
    assert!(
        log.contains(&format!("may hold {LIMIT} open descriptors")) && log.contains("LimitNOFILE"),
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
        assert_eq!(std::fs::read_to_string(d.backing().join(format!("f{i}"))).unwrap(), format!("file {i}"));
    }
    assert!(m.wait_exit_timeout(std::time::Duration::ZERO).is_none(), "the daemon exited:\n{}", m.log_text());
    m.stop();
}

#[test]
fn a_tier_lets_go_of_deleted_files_descriptors() {
    require_fuse();
    require_root("the descriptor-limit test (FUSE mounts)");
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
