//! A mount whose descriptor limit is far below the files the kernel keeps known (a root
//! without CAP_SYS_RESOURCE, a container) holds descriptors for a budget of them and reopens
//! the others by file handle (crates/fuse/src/inode.rs): every operation on a file whose
//! descriptor it let go of still reaches that file, a takeover carries such files over, and
//! nothing fails with "Too many open files".
//!
//! Its own test binary: the limit is the process's, lowered here for the daemons to inherit.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use farcache_testkit::{require_fuse, require_root, MountProcess, ScratchDir};

/// The daemon's limit: a budget of 64 inode descriptors (a quarter, at least 64).
const LIMIT: u64 = 256;
/// Files the kernel keeps known: several times the limit.
const FILES: usize = 1200;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

#[test]
#[allow(clippy::needless_range_loop)] // i names the file and indexes its inode number
fn a_mount_over_more_files_than_its_descriptor_limit_reopens_them_by_handle() {
    require_fuse();
    require_root("the inode descriptor test (FUSE mounts, file handles)");
    let lim = libc::rlimit { rlim_cur: LIMIT, rlim_max: LIMIT };
    // SAFETY: plain syscall; lowering a limit needs no privilege, and only this test runs in
    // this process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let d = ScratchDir::new(Path::new(env!("CARGO_TARGET_TMPDIR")), "inode-fds");
    let log = d.backing().with_extension("log");
    let m = MountProcess::start(bin(), &d.backing(), &d.mnt(), &["--no-remote"], &log);
    let text = m.log_text();
    assert!(
        text.contains(&format!("may hold {LIMIT} open descriptors"))
            && text.contains("reopens the others by file handle"),
        "the start does not say how it fits its descriptor limit:\n{text}"
    );
    std::fs::create_dir(m.m("a")).unwrap();
    std::fs::create_dir(m.m("b")).unwrap();
    // Every file created, written and kept known (its metadata asked through the mount).
    for i in 0..FILES {
        let mut f = std::fs::File::create(m.m(&format!("a/f{i}"))).unwrap_or_else(|e| panic!("create a/f{i}: {e}"));
        f.write_all(format!("file {i}").as_bytes()).unwrap();
    }
    let inos: Vec<u64> = (0..FILES).map(|i| std::fs::metadata(m.m(&format!("a/f{i}"))).unwrap().ino()).collect();
    // The first files' descriptors were let go of long ago: each kind of operation on them.
    for i in 0..40 {
        let p = m.m(&format!("a/f{i}"));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), format!("file {i}"), "a/f{i}");
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), inos[i], "a/f{i} is another inode");
        match i % 5 {
            0 => std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b" more").unwrap(),
            1 => std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap(),
            2 => std::fs::rename(&p, m.m(&format!("b/r{i}"))).unwrap(),
            3 => std::fs::hard_link(&p, m.m(&format!("b/l{i}"))).unwrap(),
            _ => std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(4).unwrap(),
        }
    }
    std::os::unix::fs::symlink("f100", m.m("a/s")).unwrap();
    assert_eq!(std::fs::read_to_string(m.m("a/s")).unwrap(), "file 100");
    assert_eq!(std::fs::read_dir(m.m("a")).unwrap().count(), FILES - 8 + 1, "entries of a/");
    // What the backing holds is what was done.
    for i in 0..40 {
        let (rel, want) = match i % 5 {
            0 => (format!("a/f{i}"), format!("file {i} more")),
            2 => (format!("b/r{i}"), format!("file {i}")),
            4 => (format!("a/f{i}"), format!("file {i}")[..4].to_string()),
            _ => (format!("a/f{i}"), format!("file {i}")),
        };
        assert_eq!(std::fs::read_to_string(d.backing().join(&rel)).unwrap(), want, "{rel}");
        if i % 5 == 1 {
            assert_eq!(std::fs::metadata(d.backing().join(&rel)).unwrap().mode() & 0o777, 0o600, "{rel}");
        }
        if i % 5 == 3 {
            assert_eq!(std::fs::metadata(d.backing().join(format!("b/l{i}"))).unwrap().ino(), inos[i]);
        }
    }
    // `farcache stats` shows the budget, what is held against it and the reopens.
    let out = farcache_testkit::run_bin(bin(), &["stats", d.mnt().to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "farcache stats: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = |k: &str| v["fuse"][k].as_u64().unwrap_or_else(|| panic!("no fuse.{k} in {}", v["fuse"]));
    assert_eq!(f("inode_fd_budget"), 64, "{}", v["fuse"]);
    assert!(f("inode_fds") <= 64 && f("inode_reopens") >= 40 && f("inode_fds_released") > 0, "{}", v["fuse"]);
    assert!(f("inodes") >= FILES as u64 / 2, "{}", v["fuse"]);
    let text = farcache_testkit::run_bin(bin(), &["stats", d.mnt().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("descriptors held (at most 64"), "{text}");
    // A takeover carries the known files over, whether their descriptors were held or not.
    let taken = MountProcess::try_takeover(bin(), &d.backing(), &d.mnt(), &["--no-remote"], &log.with_extension("2"))
        .unwrap_or_else(|e| panic!("{e}"));
    let old = m.wait_exit_timeout(std::time::Duration::from_secs(30));
    assert_eq!(old, Some(0), "the old daemon did not hand over:\n{}", m.log_text());
    m.release_mount();
    let ended = m.log_text();
    assert!(
        ended.lines().any(|l| l.contains("inode descriptors:") && !l.contains(" 0 reopened")),
        "the old daemon reopened nothing by handle:\n{ended}"
    );
    for i in (0..FILES).step_by(7).filter(|i| i % 5 != 2 || *i >= 40) {
        let p = taken.m(&format!("a/f{i}"));
        assert!(std::fs::read_to_string(&p).unwrap().starts_with(&format!("file {i}")[..4]), "a/f{i}");
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), inos[i], "a/f{i} after the takeover");
    }
    assert!(taken.wait_exit_timeout(std::time::Duration::ZERO).is_none(), "the daemon exited:\n{}", taken.log_text());
    let log2 = taken.stop();
    for l in [&ended, &log2] {
        assert!(!l.contains("Too many open files"), "a descriptor ran out:\n{l}");
    }
}
