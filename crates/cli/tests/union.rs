//! Mounts of several backing branches (`farcache mount DIR1:DIR2 MOUNTPOINT`) and
//! `farcache balance`, with the real binary and real FUSE mounts: the union's own rules
//! (placement, merged directories, renames between branches, hidden state), file identity
//! across moves and restarts, moves under a verifying writer, a crash at each step of a
//! move, and lender hits after a move. `union_posix.rs` runs the POSIX suite on a union.
//!
//! Each union here is a branch on the test directory's disk file system and one on tmpfs
//! (`/dev/shm`): branches must be different file systems. These tests need root and FUSE.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use farcache_testkit::{
    fuse_mounted, pattern, require_root, run_bin, text, wait_until, DirectReader, LoopFs, MountProcess, UnionDirs,
    LENDERS_FIRST,
};
use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// A test's directories ([`UnionDirs`]), with this file's helpers.
struct Dirs(UnionDirs);

impl std::ops::Deref for Dirs {
    type Target = UnionDirs;
    fn deref(&self) -> &UnionDirs {
        &self.0
    }
}

impl Dirs {
    fn new(tag: &str) -> Dirs {
        require_root("the union tests");
        Dirs(UnionDirs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("union-{tag}")))
    }

    /// A configuration file with `toml`, for `--config`.
    fn config(&self, toml: &str) -> String {
        let p = self.root.join("farcache.toml");
        fs::write(&p, toml).unwrap();
        p.display().to_string()
    }

    /// Wait (at most `within`) until the mount's index lists at least `blocks` blocks as held
    /// by its lenders: fills land in the background.
    fn wait_listed(&self, blocks: u64, within: Duration) {
        assert!(
            wait_until(within, Duration::from_millis(50), || n(&self.stats(), "index", "remote_blocks") >= blocks),
            "the index never listed {blocks} blocks as held by the lenders: {:#}",
            self.stats()
        );
    }

    fn try_mount(&self, args: &[&str], env: &[(&str, &str)]) -> Result<MountProcess, String> {
        MountProcess::try_start_env(bin(), &self.branches(), &self.mnt, args, env, &self.root.join("daemon.log"))
    }

    fn mount(&self, args: &[&str]) -> MountProcess {
        self.try_mount(args, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// On which branches `rel` exists.
    fn on(&self, rel: &str) -> (bool, bool) {
        (self.a.join(rel).symlink_metadata().is_ok(), self.b.join(rel).symlink_metadata().is_ok())
    }

    fn balance(&self, extra: &[&str]) -> Output {
        self.0.balance(bin(), extra)
    }

    /// `farcache balance` that must succeed: its final status.
    fn balanced(&self, extra: &[&str]) -> Value {
        self.0.balanced(bin(), extra)
    }

    fn stats(&self) -> Value {
        self.0.stats(bin())
    }
}

fn n(v: &Value, section: &str, field: &str) -> u64 {
    v[section][field].as_u64().unwrap_or_else(|| panic!("no {section}.{field} in {v:#}"))
}

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("an error was expected").raw_os_error().unwrap_or(0)
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

#[test]
fn branches_are_checked_and_errors_name_the_fix() {
    let d = Dirs::new("checks");
    let same = d.root.join("a2");
    fs::create_dir(&same).unwrap();
    let log = d.root.join("daemon.log");
    let try_with = |branches: String| {
        MountProcess::try_start_env(bin(), Path::new(&branches), &d.mnt, &["--no-remote"], &[], &log)
            .err()
            .unwrap_or_else(|| panic!("{branches} was mounted"))
    };
    let e = try_with(format!("{}:{}", d.a.display(), same.display()));
    assert!(e.contains("same file system") && e.contains("give each branch a file system"), "{e}");
    let e = try_with(format!("{}:{}", d.a.display(), d.a.display()));
    assert!(e.contains("listed twice"), "{e}");
    let e = try_with(format!("{}:/no/such/branch", d.a.display()));
    assert!(e.contains("/no/such/branch does not exist") && e.contains("leave it out of the branches"), "{e}");
    let e = try_with(format!("{}:{}", d.a.display(), d.a.join("inner").display()));
    assert!(e.contains("does not exist"), "{e}");
    fs::create_dir(d.a.join("inner")).unwrap();
    let e = try_with(format!("{}:{}", d.a.display(), d.a.join("inner").display()));
    assert!(e.contains("is inside branch"), "{e}");
    let e = try_with(format!("{}:{}", d.b.display(), d.b.join("..").join(d.b.file_name().unwrap()).display()));
    assert!(e.contains("listed twice"), "{e}");
    assert!(!e.contains("supervisor: daemon pid"), "a daemon was started: {e}");
}

#[test]
fn placement_merged_directories_renames_links_and_hidden_state() {
    let d = Dirs::new("rules");
    fs::create_dir_all(d.a.join("shared")).unwrap();
    fs::create_dir_all(d.b.join("shared")).unwrap();
    fs::create_dir_all(d.b.join("only_b")).unwrap();
    fs::write(d.a.join("shared/x"), b"A").unwrap();
    fs::write(d.b.join("shared/x"), b"B").unwrap();
    fs::write(d.b.join("shared/y"), b"yyy").unwrap();
    fs::write(d.b.join("only_b/z"), b"zz").unwrap();
    fs::write(d.a.join("top"), b"top").unwrap();
    let cfg = d.config("[mount]\ncreate_policy = \"first\"\n");
    let _m = d.mount(&["--no-remote", "--config", &cfg]);

    // Merged listings, first branch wins, farcache's own directory hidden.
    assert_eq!(names(&d.mnt), vec!["only_b", "shared", "top"]);
    assert_eq!(names(&d.m("shared")), vec!["x", "y"]);
    assert_eq!(fs::read(d.m("shared/x")).unwrap(), b"A");
    assert_eq!(errno(fs::metadata(d.m(".farcache-union"))), libc::ENOENT);
    assert_eq!(errno(fs::create_dir(d.m(".farcache-union"))), libc::EPERM);
    // readdir's d_ino is the inode number stat shows.
    for e in fs::read_dir(d.m("shared")).unwrap() {
        let e = e.unwrap();
        assert_eq!(std::os::unix::fs::DirEntryExt::ino(&e), e.metadata().unwrap().ino(), "{:?}", e.file_name());
    }

    // Placement: "first" among the branches the parent is on; mkdir on every branch.
    fs::write(d.m("shared/new"), b"n").unwrap();
    assert_eq!(d.on("shared/new"), (true, false));
    fs::write(d.m("only_b/new"), b"n").unwrap();
    assert_eq!(d.on("only_b/new"), (false, true));
    fs::create_dir(d.m("dir")).unwrap();
    assert_eq!(d.on("dir"), (true, true));

    // Rename of a file happens on its branch; a missing target directory is made there.
    fs::rename(d.m("top"), d.m("only_b/top")).unwrap();
    assert_eq!(d.on("only_b/top"), (true, false));
    assert_eq!(names(&d.m("only_b")), vec!["new", "top", "z"]);
    // Over a name on the other branch: that one goes.
    fs::write(d.m("shared/w"), b"w on a").unwrap();
    fs::rename(d.m("shared/y"), d.m("shared/w")).unwrap();
    assert_eq!(d.on("shared/w"), (false, true));
    assert_eq!(fs::read(d.m("shared/w")).unwrap(), b"yyy");
    // A hard link is made on the file's branch.
    fs::hard_link(d.m("shared/w"), d.m("dir/w2")).unwrap();
    assert_eq!(d.on("dir/w2"), (false, true));
    assert_eq!(fs::metadata(d.m("dir/w2")).unwrap().ino(), fs::metadata(d.m("shared/w")).unwrap().ino());
    // An exchange between branches is refused.
    let (p, q) = (
        CString::new(d.m("shared/x").as_os_str().as_bytes()).unwrap(),
        CString::new(d.m("shared/w").as_os_str().as_bytes()).unwrap(),
    );
    // SAFETY: NUL-terminated paths.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            p.as_ptr(),
            libc::AT_FDCWD,
            q.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EXDEV)));
    // A directory is renamed on every branch it is on.
    fs::rename(d.m("dir"), d.m("dir2")).unwrap();
    assert_eq!((d.on("dir"), d.on("dir2")), ((false, false), (true, true)));

    // Unlink removes the name everywhere (the shadowed copy too); rmdir wants the merged
    // directory empty.
    fs::remove_file(d.m("shared/x")).unwrap();
    assert_eq!(d.on("shared/x"), (false, false));
    assert_eq!(errno(fs::remove_dir(d.m("shared"))), libc::ENOTEMPTY);
    fs::remove_file(d.m("shared/w")).unwrap();
    fs::remove_file(d.m("shared/new")).unwrap();
    fs::remove_dir(d.m("shared")).unwrap();
    assert_eq!(d.on("shared"), (false, false));

    // The id attribute is farcache's: not listed, not readable, not settable.
    let f = CString::new(d.m("only_b/z").as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: NUL-terminated path; the kernel writes at most buf.len() bytes.
    let len = unsafe { libc::listxattr(f.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(len >= 0);
    assert!(!String::from_utf8_lossy(&buf[..len as usize]).contains("farcache"), "listed");
    let name = c"trusted.farcache.id";
    // SAFETY: as above.
    let r = unsafe { libc::getxattr(f.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ENODATA)));
    // SAFETY: as above.
    let r = unsafe { libc::setxattr(f.as_ptr(), name.as_ptr(), b"x".as_ptr().cast(), 1, 0) };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EPERM)));
}

#[test]
fn a_files_inode_number_survives_a_move_and_a_remount() {
    let d = Dirs::new("ino");
    let files: Vec<(String, Vec<u8>)> =
        (0..4).map(|i| (format!("d/f{i}"), pattern(300_000 + i * 4096, i as u64))).collect();
    fs::create_dir(d.a.join("d")).unwrap();
    for (p, data) in &files {
        fs::write(d.a.join(p), data).unwrap(); // made behind the mount: ids given at lookup
    }
    let m = d.mount(&["--no-remote"]);
    let inos: Vec<u64> = files
        .iter()
        .map(|(p, data)| {
            assert_eq!(&fs::read(d.m(p)).unwrap(), data);
            fs::metadata(d.m(p)).unwrap().ino()
        })
        .collect();
    let dry = d.balanced(&["--from", "0", "--to", "1", "--dry-run"]);
    assert_eq!(dry["planned"].as_array().unwrap().len(), 4, "{dry:#}");
    assert!(files.iter().all(|(p, _)| d.on(p) == (true, false)), "a dry run moves nothing");
    let io0 = d.stats()["backing"]["io"].clone();
    let s = d.balanced(&["--from", "0", "--to", d.b.to_str().unwrap(), "--files", "3"]);
    assert_eq!((s["moved"].as_u64(), s["failed"].as_u64()), (Some(3), Some(0)), "{s:#}");
    // The copies were written and synced through the mount's I/O engine.
    let io = d.stats()["backing"]["io"].clone();
    for k in ["write_ops", "sync_ops"] {
        assert!(io[k].as_u64().unwrap() >= io0[k].as_u64().unwrap() + 3, "{k}: {io0} -> {io}");
    }
    let moved: Vec<bool> = files.iter().map(|(p, _)| d.on(p) == (false, true)).collect();
    assert_eq!(moved.iter().filter(|m| **m).count(), 3);
    for ((p, data), ino) in files.iter().zip(&inos) {
        assert_eq!(&fs::read(d.m(p)).unwrap(), data, "{p}");
        assert_eq!(fs::metadata(d.m(p)).unwrap().ino(), *ino, "{p}: inode number after the move");
    }
    let st = d.stats();
    assert_eq!(n(&st, "union", "moves"), 3, "{st:#}");
    assert!(n(&st, "union", "blocks_from_disk") >= 3 * 73, "{st:#}");
    m.stop();
    let _m = d.mount(&["--no-remote"]);
    for ((p, data), ino) in files.iter().zip(&inos) {
        assert_eq!(fs::metadata(d.m(p)).unwrap().ino(), *ino, "{p}: inode number after a remount");
        assert_eq!(&fs::read(d.m(p)).unwrap(), data, "{p}");
    }
    // An id record copied with the file (cp -a) is not the copy's: it gets a number of its own.
    let (src, _) = &files[0];
    let on = if d.on(src).0 { &d.a } else { &d.b };
    let status = std::process::Command::new("cp").arg("-a").arg(on.join(src)).arg(on.join("d/copy")).status().unwrap();
    assert!(status.success());
    assert_ne!(fs::metadata(d.m("d/copy")).unwrap().ino(), inos[0]);
    assert_eq!(fs::metadata(d.m(src)).unwrap().ino(), inos[0]);
}

/// 8-byte records written at random offsets of a file, each remembered, so that the file
/// can be checked byte for byte at the end.
struct Writer {
    model: Vec<u8>,
    writes: u64,
    wrong_reads: u64,
}

#[test]
fn files_open_for_reading_and_writing_move_under_a_verifying_writer() {
    const SIZE: usize = 2 << 20;
    let d = Dirs::new("writer");
    let ro = pattern(SIZE, 7);
    fs::write(d.a.join("ro"), &ro).unwrap();
    fs::write(d.a.join("rw"), pattern(SIZE, 8)).unwrap();
    let _m = d.mount(&["--no-remote"]);
    let ino = fs::metadata(d.m("rw")).unwrap().ino();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (path, stop) = (d.m("rw"), stop.clone());
        std::thread::spawn(move || {
            let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
            let mut w = Writer { model: fs::read(&path).unwrap(), writes: 0, wrong_reads: 0 };
            let mut rng = farcache_testkit::Rng::new(11);
            while !stop.load(Ordering::Relaxed) {
                let off = (rng.below((SIZE / 8) as u64) * 8) as usize;
                w.writes += 1;
                let rec = w.writes.to_le_bytes();
                f.write_all_at(&rec, off as u64).unwrap();
                w.model[off..off + 8].copy_from_slice(&rec);
                let mut back = [0u8; 8];
                f.read_exact_at(&mut back, off as u64).unwrap();
                if back != rec {
                    w.wrong_reads += 1;
                }
                if w.writes.is_multiple_of(64) {
                    // Pace: give the copies a chance to finish between bursts.
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            w
        })
    };
    let mut reader = DirectReader::open(&d.m("ro"));
    let order: Vec<u64> = (0..(SIZE / 4096) as u64).collect();
    reader.pass(&order, &ro);
    let mut moved_rw = 0;
    for round in 0..6 {
        let (from, to) = if round % 2 == 0 { ("0", "1") } else { ("1", "0") };
        fs::read(d.m("ro")).unwrap(); // recent again
        let s = d.balanced(&["--from", from, "--to", to]);
        assert_eq!(s["failed"].as_u64(), Some(0), "{s:#}");
        // The held read-only handle reads the file wherever it is now.
        reader.pass(&order, &ro);
        let rw_on = d.on("rw");
        assert!(rw_on == (true, false) || rw_on == (false, true), "rw on {rw_on:?}");
        if rw_on == if to == "1" { (false, true) } else { (true, false) } {
            moved_rw += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let w = writer.join().unwrap();
    assert!(w.writes > 1000, "the writer wrote only {} records", w.writes);
    assert_eq!(w.wrong_reads, 0, "reads after writes returned other bytes");
    let now = fs::read(d.m("rw")).unwrap();
    let wrong = now.iter().zip(&w.model).filter(|(a, b)| a != b).count();
    assert_eq!(wrong, 0, "{wrong} bytes differ from what was written ({} writes)", w.writes);
    assert_eq!(fs::metadata(d.m("rw")).unwrap().ino(), ino);
    let st = d.stats();
    assert!(n(&st, "union", "moves") >= 6, "{st:#}");
    assert!(moved_rw > 0 || n(&st, "union", "races") > 0, "the written file neither moved nor raced: {st:#}");
    assert!(n(&st, "union", "handles_switched") >= 1, "{st:#}");
    // And on the branch itself: nothing lost below the mount either.
    let on = if d.on("rw").0 { d.a.join("rw") } else { d.b.join("rw") };
    assert_eq!(fs::read(on).unwrap(), w.model);
}

#[test]
fn a_crash_at_each_step_of_a_move_leaves_each_file_once_and_right() {
    for step in ["before-copy", "mid-copy", "after-copy", "after-switch", "before-remove"] {
        let d = Dirs::new(&format!("crash-{step}"));
        // Four chunks of copy (the last one short): "mid-copy" is after the second.
        let data = pattern((3 << 20) + 777, 21);
        let fault = format!("balance:{step}");
        // New files on the first branch, whatever room each has (most-free put it on the
        // tmpfs branch once the test disk had less free than /dev/shm).
        let cfg = d.config("[mount]\ncreate_policy = \"first\"\n");
        let m = d.try_mount(&["--no-remote", "--config", &cfg], &[("FARCACHE_FAULT", &fault)]).unwrap();
        fs::write(d.m("f"), &data).unwrap();
        let ino = fs::metadata(d.m("f")).unwrap().ino();
        assert_eq!(fs::read(d.m("f")).unwrap(), data);
        let out = d.balance(&["--from", "0", "--to", "1"]);
        assert!(!out.status.success(), "{step}: the daemon did not stop at the fault point");
        assert!(m.wait_exit_timeout(Duration::from_secs(20)).is_some(), "{step}: the daemon did not die");
        drop(m); // unmounts the dead mount
        assert!(m_log_has(&d.root, &fault), "{step}: the fault point was not reached");
        if step == "mid-copy" {
            // The crash left a copy begun and not finished for the replay to clear.
            let tmp = d.b.join(".farcache-union/tmp");
            let copies: Vec<u64> = names(&tmp).iter().map(|f| fs::metadata(tmp.join(f)).unwrap().len()).collect();
            assert!(
                copies.len() == 1 && copies[0] > 0 && copies[0] < data.len() as u64,
                "{step}: the copy left is not a partial one: {copies:?}"
            );
        }
        let _m = d.mount(&["--no-remote"]);
        let (a, b) = d.on("f");
        assert!(a != b, "{step}: the file is on {:?} (a, b): not exactly once", (a, b));
        let switched = matches!(step, "after-switch" | "before-remove");
        assert_eq!(b, switched, "{step}: on the target only once the switch happened");
        assert_eq!(fs::read(d.m("f")).unwrap(), data, "{step}");
        assert_eq!(fs::metadata(d.m("f")).unwrap().ino(), ino, "{step}");
        assert_eq!(names(&d.mnt), vec!["f"]);
        for br in [&d.a, &d.b] {
            assert!(names(&br.join(".farcache-union/tmp")).is_empty(), "{step}: a copy was left");
            assert!(names(&br.join(".farcache-union/journal")).is_empty(), "{step}: a record was left");
        }
        assert_eq!(n(&d.stats(), "union", "journal_replayed"), 1, "{step}");
    }
}

fn m_log_has(root: &Path, what: &str) -> bool {
    fs::read_to_string(root.join("daemon.log")).unwrap_or_default().contains(what)
}

#[test]
fn blocks_of_a_moved_file_still_hit_on_the_lender() {
    const SIZE: usize = 4 << 20;
    let d = Dirs::new("lender");
    let data = pattern(SIZE, 31);
    fs::write(d.a.join("hot"), &data).unwrap();
    let _m = d.mount(&LENDERS_FIRST);
    let blocks = (SIZE / 4096) as u64;
    let order: Vec<u64> = (0..blocks).map(|i| (i * 613) % blocks).collect();
    DirectReader::open(&d.m("hot")).pass(&order, &data);
    d.wait_listed(blocks * 9 / 10, Duration::from_secs(10));
    let s = d.balanced(&["--from", "0", "--to", "1", "--files", "1"]);
    assert_eq!(s["moved"].as_u64(), Some(1), "{s:#}");
    assert_eq!(d.on("hot"), (false, true));
    let from_cache = s["blocks_from_cache"].as_u64().unwrap();
    assert!(from_cache >= blocks * 9 / 10, "copied {from_cache} of {blocks} blocks from the lender: {s:#}");
    let before = d.stats();
    DirectReader::open(&d.m("hot")).pass(&order, &data);
    let after = d.stats();
    let hits = n(&after, "remote", "hits") - n(&before, "remote", "hits");
    let disk = n(&after, "engine", "disk_reads") - n(&before, "engine", "disk_reads");
    assert!(hits >= blocks * 9 / 10 && disk <= blocks / 10, "after the move: {hits} lender hits, {disk} disk reads");
    assert_eq!(n(&after, "engine", "changed_behind"), 0, "the move was taken for a change: {after:#}");
    // The conventional baseline reads everything from the disk, lenders or not.
    let s = d.balanced(&["--from", "1", "--to", "0", "--files", "1", "--source", "disk"]);
    assert_eq!(s["moved"].as_u64(), Some(1), "{s:#}");
    assert_eq!(s["blocks_from_cache"].as_u64(), Some(0), "{s:#}");
    assert_eq!(s["blocks_from_disk"].as_u64(), Some(blocks), "{s:#}");
    assert_eq!(d.on("hot"), (true, false));
    assert!(fs::read(d.m("hot")).unwrap() == data);
}

#[test]
fn renames_during_moves_leave_the_file_once_and_whole() {
    let d = Dirs::new("renames");
    let data = pattern(24 << 20, 41);
    fs::create_dir(d.a.join("x")).unwrap();
    fs::write(d.a.join("x/f"), &data).unwrap();
    let _m = d.mount(&["--no-remote"]);
    let ino = fs::metadata(d.m("x/f")).unwrap().ino();
    fs::create_dir(d.m("y")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let renamer = {
        let (mnt, stop) = (d.mnt.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            let names = [mnt.join("x/f"), mnt.join("y/g")];
            while !stop.load(Ordering::Relaxed) {
                let (from, to) = (&names[(n % 2) as usize], &names[((n + 1) % 2) as usize]);
                fs::rename(from, to).unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(3));
            }
            n
        })
    };
    for round in 0..4 {
        let (from, to) = if round % 2 == 0 { ("0", "1") } else { ("1", "0") };
        for p in ["x/f", "y/g"] {
            let _ = fs::metadata(d.m(p)).map(|_| File::open(d.m(p)));
        }
        let s = d.balanced(&["--from", from, "--to", to]);
        assert_eq!(s["failed"].as_u64(), Some(0), "{s:#}");
    }
    stop.store(true, Ordering::Relaxed);
    let renames = renamer.join().unwrap();
    assert!(renames > 10, "{renames} renames");
    let here: Vec<PathBuf> =
        [&d.a, &d.b].iter().flat_map(|b| [b.join("x/f"), b.join("y/g")]).filter(|p| p.exists()).collect();
    assert_eq!(here.len(), 1, "the file is at {here:?}");
    let rel = here[0].strip_prefix(if here[0].starts_with(&d.a) { &d.a } else { &d.b }).unwrap();
    let through = d.mnt.join(rel);
    assert_eq!(fs::metadata(&through).unwrap().ino(), ino);
    assert!(fs::read(&through).unwrap() == data, "contents changed");
    let st = d.stats();
    assert!(n(&st, "union", "moves") + n(&st, "union", "races") >= 2, "the file neither moved nor raced: {st:#}");
}

#[test]
fn the_configuration_file_can_name_the_branches() {
    let d = Dirs::new("config");
    fs::write(d.b.join("on_b"), b"b").unwrap();
    let cfg = d.config(&format!(
        "[mount]\nbacking = [{:?}, {:?}]\ncreate_policy = \"least-busy\"\n",
        d.a.display().to_string(),
        d.b.display().to_string()
    ));
    let log = File::create(d.root.join("daemon.log")).unwrap();
    let mut child = std::process::Command::new(bin())
        .args(["mount", d.mnt.to_str().unwrap(), "--no-remote", "--config", &cfg])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(20), Duration::from_millis(20), || fuse_mounted(&d.mnt));
    let seen = up.then(|| (fs::read(d.m("on_b")).ok(), fs::write(d.m("new"), b"n").is_ok()));
    let _ = std::process::Command::new("fusermount3").arg("-u").arg(&d.mnt).status();
    if !wait_until(Duration::from_secs(20), Duration::from_millis(20), || child.try_wait().is_ok_and(|s| s.is_some())) {
        let _ = child.kill();
    }
    let _ = child.wait();
    let log = fs::read_to_string(d.root.join("daemon.log")).unwrap_or_default();
    assert_eq!(seen, Some((Some(b"b".to_vec()), true)), "{log}");
    assert!(log.contains("mounted 2 branches") && log.contains("LeastBusy"), "{log}");
    let (a, b) = d.on("new");
    assert!(a != b, "placed once");
}

#[test]
fn a_source_set_aside_whose_target_was_lost_is_put_back_at_start() {
    // The state a power cut can leave: the source's rename aside reached its disk, the
    // target's rename did not.
    let d = Dirs::new("aside");
    let data = pattern(100_000, 51);
    // The file on the first branch, whatever room each has.
    let cfg = d.config("[mount]\ncreate_policy = \"first\"\n");
    let m = d.mount(&["--no-remote", "--config", &cfg]);
    fs::write(d.m("f"), &data).unwrap();
    let ino = fs::metadata(d.m("f")).unwrap().ino();
    m.stop();
    let uuid = |b: &Path| fs::read_to_string(b.join(".farcache-union/branch")).unwrap().trim().to_string();
    let p = CString::new(d.a.join("f").as_os_str().as_bytes()).unwrap();
    let mut rec = [0u8; 64];
    // SAFETY: NUL-terminated strings; the kernel writes at most rec.len() bytes.
    let len =
        unsafe { libc::getxattr(p.as_ptr(), c"trusted.farcache.id".as_ptr(), rec.as_mut_ptr().cast(), rec.len()) };
    assert_eq!(len, 32, "the id record: {}", std::io::Error::last_os_error());
    let id = u64::from_le_bytes(rec[8..16].try_into().unwrap());
    assert_eq!(id, ino, "the inode number is the id");
    fs::rename(d.a.join("f"), d.a.join(format!(".farcache-union/tmp/{id}.source"))).unwrap();
    let record = format!("farcache-move 1\nid {id}\nfrom {}\nto {}\nrel {}\n", uuid(&d.a), uuid(&d.b), "66");
    fs::write(d.b.join(format!(".farcache-union/journal/{id}")), record).unwrap();
    let _m = d.mount(&["--no-remote"]);
    assert_eq!(d.on("f"), (true, false));
    assert!(fs::read(d.m("f")).unwrap() == data);
    assert_eq!(fs::metadata(d.m("f")).unwrap().ino(), ino);
    assert!(names(&d.a.join(".farcache-union/tmp")).is_empty());
    assert_eq!(n(&d.stats(), "union", "journal_replayed"), 1);
}

/// The I/O priority (ioprio_get) of the daemon's thread named `comm`.
fn io_priority_of_thread(pid: u32, comm: &str) -> Option<i64> {
    for t in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        if fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == comm) {
            let tid: i64 = t.file_name().to_str()?.parse().ok()?;
            // SAFETY: a plain system call with integer arguments (IOPRIO_WHO_PROCESS = 1).
            return Some(unsafe { libc::syscall(libc::SYS_ioprio_get, 1, tid) });
        }
    }
    None
}

#[test]
fn automatic_balance_moves_off_a_loaded_branch_and_holds_still_when_even() {
    require_root("the automatic balance test (loop devices)");
    const FILES: usize = 8;
    const SIZE: usize = 1 << 20;
    let root = farcache_testkit::fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "union-auto");
    let (a, b) = (LoopFs::new(&root, "a"), LoopFs::new(&root, "b"));
    let mnt = root.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let data: Vec<Vec<u8>> = (0..FILES).map(|i| pattern(SIZE, 500 + i as u64)).collect();
    for (i, d) in data.iter().enumerate() {
        fs::write(a.dir.join(format!("f{i}")), d).unwrap();
    }
    // Hysteresis wide apart: a round starts at 8×, rounds stop at 3×; one file per round.
    // With k of the 8 files on b and the reads spread evenly, a/b is at most (8 - k)/k (less
    // where a's busy share is capped at 100%): 7 at k = 1, so nothing starts again once a
    // file moved, and at most 3 from k = 2 on, so the rounds stop by then.
    let cfg = root.join("farcache.toml");
    fs::write(
        &cfg,
        "[balance]\nenabled = true\ninterval = \"300ms\"\nstart_ratio = 8.0\nstop_ratio = 3.0\n\
         min_busy_percent = 5\nmax_files_per_round = 1\ncopy_bytes_per_sec = \"8MiB\"\nidle_io_priority = true\n",
    )
    .unwrap();
    let branches = PathBuf::from(format!("{}:{}", a.dir.display(), b.dir.display()));
    let m = MountProcess::start(
        bin(),
        &branches,
        &mnt,
        &["--no-remote", "--config", cfg.to_str().unwrap()],
        &root.join("daemon.log"),
    );
    let stats = || {
        let out = run_bin(bin(), &["stats", mnt.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["union"].clone()
    };
    let u = |v: &Value, f: &str| v[f].as_u64().unwrap_or_else(|| panic!("no union.{f} in {v:#}"));
    let inos: Vec<u64> = (0..FILES).map(|i| fs::metadata(mnt.join(format!("f{i}"))).unwrap().ino()).collect();

    // Idle: the balancer reads the load and moves nothing.
    assert!(wait_until(Duration::from_secs(10), Duration::from_millis(100), || u(&stats(), "auto_checks") >= 3));
    let s = stats();
    assert_eq!(s["auto_enabled"], Value::Bool(true), "{s:#}");
    assert_eq!((u(&s, "moves"), u(&s, "auto_rounds")), (0, 0), "moved files of an idle mount: {s:#}");
    // The copying thread is in the idle I/O class (IOPRIO_CLASS_IDLE << 13, level 0).
    assert_eq!(io_priority_of_thread(m.pid(), "farcache-auto"), Some(3 << 13), "the balancer's I/O priority");

    // Load on branch a alone: four threads of verified O_DIRECT 4 KiB reads of every file.
    let stop = Arc::new(AtomicBool::new(false));
    let wrong = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let readers: Vec<_> = (0..4u64)
        .map(|t| {
            let (stop, wrong, data, mnt) = (stop.clone(), wrong.clone(), data.clone(), mnt.clone());
            std::thread::spawn(move || {
                let mut files: Vec<DirectReader> =
                    (0..FILES).map(|i| DirectReader::open(&mnt.join(format!("f{i}")))).collect();
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let (i, blk) = ((x % FILES as u64) as usize, ((x >> 8) % (SIZE as u64 / 4096)) as usize);
                    if files[i].read(blk as u64 * 4096) != &data[i][blk * 4096..(blk + 1) * 4096] {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let moved = wait_until(Duration::from_secs(60), Duration::from_millis(200), || u(&stats(), "auto_moves") >= 1);
    assert!(moved, "no automatic move off the loaded branch: {:#}\n{}", stats(), m.log_text());
    // Moves continue while uneven, then stop once the load is even enough (below 3×) and the
    // balancer is idle again; from then on, with the same load, nothing moves.
    let settled =
        wait_until(Duration::from_secs(60), Duration::from_millis(300), || !stats()["auto_active"].as_bool().unwrap());
    assert!(settled, "the balancer never stopped: {:#}", stats());
    let before = stats();
    std::thread::sleep(Duration::from_secs(3)); // ten intervals of the same load
    let after = stats();
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert_eq!(wrong.load(Ordering::Relaxed), 0, "wrong bytes read during the moves");
    assert!(u(&after, "auto_checks") >= u(&before, "auto_checks") + 5, "{after:#}");
    assert_eq!(
        (u(&after, "moves"), u(&after, "auto_rounds")),
        (u(&before, "moves"), u(&before, "auto_rounds")),
        "moved files under an even load (hysteresis): before {before:#} after {after:#}"
    );
    let n_moved = u(&after, "auto_moves") as usize;
    assert!((1..FILES).contains(&n_moved), "{n_moved} files moved: {after:#}");
    assert_eq!(u(&after, "moves"), n_moved as u64, "only the automatic balancer moved files");
    // Each file exactly once, whole, with its inode number.
    let on_b = (0..FILES).filter(|i| b.dir.join(format!("f{i}")).exists()).count();
    assert_eq!(on_b, n_moved, "files on branch b");
    for (i, d) in data.iter().enumerate() {
        let name = format!("f{i}");
        assert!(a.dir.join(&name).exists() != b.dir.join(&name).exists(), "{name} is on exactly one branch");
        assert!(fs::read(mnt.join(&name)).unwrap() == *d, "{name}'s contents after the moves");
        assert_eq!(fs::metadata(mnt.join(&name)).unwrap().ino(), inos[i], "{name}'s inode number");
    }
    eprintln!("automatic balance: {n_moved} files moved under {reads} reads; {after:#}");
    drop(m);
    drop((a, b));
    let _ = fs::remove_dir_all(&root);
}

/// `threads` readers of verified `O_DIRECT` 4 KiB blocks of `path` (contents `data`) through
/// the mount, until `stop`; each returns its reads and wrong reads.
fn foreground_readers(
    path: &Path,
    data: &Arc<Vec<u8>>,
    threads: u64,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<(u64, u64)>> {
    (0..threads)
        .map(|t| {
            let (path, data, stop) = (path.to_path_buf(), data.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut r = DirectReader::open(&path);
                let blocks = (data.len() / 4096) as u64;
                let (mut reads, mut wrong) = (0u64, 0u64);
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let b = (x % blocks) as usize;
                    if r.read(b as u64 * 4096) != &data[b * 4096..(b + 1) * 4096] {
                        wrong += 1;
                    }
                    reads += 1;
                }
                (reads, wrong)
            })
        })
        .collect()
}

#[test]
fn the_copy_yields_to_foreground_io_and_still_finishes() {
    const FILES: usize = 4;
    const SIZE: usize = 4 << 20; // 4 chunks each
    const MAX_WAIT_MS: u64 = 20;
    let d = Dirs::new("yield");
    let data: Vec<Vec<u8>> = (0..FILES).map(|i| pattern(SIZE, 700 + i as u64)).collect();
    for (i, x) in data.iter().enumerate() {
        fs::write(d.a.join(format!("f{i}")), x).unwrap();
    }
    let fg = Arc::new(pattern(SIZE, 799));
    fs::write(d.a.join("fg"), &*fg).unwrap();
    // A wait may be 99 times the previous chunk's time, so the bound that holds is the cap.
    let yield_cfg = |on: bool| {
        d.config(&format!(
            "[balance]\nyield_to_foreground = {on}\nyield_wait_ratio = 99.0\nyield_max_wait = \"{MAX_WAIT_MS}ms\"\n"
        ))
    };
    // One balance of every file from `from` to `to` under four readers of `fg` (the most
    // recent file: moved first, its readers follow it; on the branches the copy uses
    // throughout): its status.
    let under_load = |from: &str, to: &str| {
        for i in 0..FILES {
            fs::read(d.m(&format!("f{i}"))).unwrap(); // recent
        }
        let stop = Arc::new(AtomicBool::new(false));
        let readers = foreground_readers(&d.m("fg"), &fg, 4, &stop);
        std::thread::sleep(Duration::from_millis(200));
        let s = d.balanced(&["--from", from, "--to", to, "--files", &(FILES + 1).to_string()]);
        stop.store(true, Ordering::Relaxed);
        let (reads, wrong) = readers.into_iter().map(|r| r.join().unwrap()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert_eq!(wrong, 0, "wrong bytes read during the moves");
        assert!(reads > 100, "the foreground read only {reads} blocks");
        s
    };
    let moved_ok = |s: &Value, moved: usize, on_b: bool| {
        assert_eq!((s["moved"].as_u64(), s["failed"].as_u64()), (Some(moved as u64), Some(0)), "{s:#}");
        let place = if on_b { (false, true) } else { (true, false) };
        for (i, x) in data.iter().enumerate() {
            let name = format!("f{i}");
            assert_eq!(d.on(&name), place, "{name} after the balance: {s:#}");
            assert!(fs::read(d.m(&name)).unwrap() == *x, "{name}'s contents after the move");
        }
        assert!(fs::read(d.m("fg")).unwrap() == *fg, "fg's contents after the moves");
    };

    // Yielding on: the copy waits before its chunks, each wait at most MAX_WAIT_MS.
    let m = d.mount(&["--no-remote", "--config", &yield_cfg(true)]);
    let s = under_load("0", "1");
    moved_ok(&s, FILES + 1, true);
    assert_eq!(d.on("fg"), (false, true));
    let (yields, bounded, waited) =
        (s["yields"].as_u64().unwrap(), s["yield_bounded"].as_u64().unwrap(), s["yield_wait_ms"].as_u64().unwrap());
    let chunks = ((FILES + 1) * SIZE / (1 << 20)) as u64;
    // Every chunk but the very first had a bound; under four readers that never pause,
    // nearly all of them waited, most of them to the bound.
    assert!(yields >= chunks / 2 && bounded >= 1, "the copy did not yield to the readers: {s:#}");
    assert!(yields <= chunks, "at most one wait per chunk: {s:#}");
    // Bounded: each wait ends at the cap (the unit test in yielding.rs checks the bound
    // exactly). Here a sleeping thread also waits for a CPU: these tests may run at idle CPU
    // priority beside other work, where a wake-up measured up to ~0.3 s late; a copy that
    // waited for the readers to stop would show seconds per chunk.
    assert!(waited >= 1, "{s:#}");
    assert!(waited <= yields * (MAX_WAIT_MS + 500), "a wait passed its bound: {s:#}");
    // Where the time went: the parts (each rounded down to a ms) and the waits make the
    // balance's time, less what no part times (opening, metadata, the plan).
    let part = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {s:#}"));
    let parts: u64 =
        ["read_cache_ms", "read_disk_ms", "write_ms", "sync_ms", "switch_ms"].iter().map(|k| part(k)).sum();
    let elapsed = part("elapsed_ms");
    assert!(parts + waited <= elapsed + 6, "the parts exceed the whole: {s:#}");
    assert!((parts + waited) * 2 + 12 >= elapsed, "most of the balance's time untimed: {s:#}");
    let st = d.stats();
    assert_eq!((n(&st, "union", "copy_yields"), n(&st, "union", "copy_yield_bounded")), (yields, bounded), "{st:#}");
    assert!(n(&st, "union", "copy_yield_wait_ms") <= waited + 1, "{st:#}");
    m.stop();

    // Yielding off: the same load, no wait at all.
    let _m = d.mount(&["--no-remote", "--config", &yield_cfg(false)]);
    let s = under_load("1", "0");
    moved_ok(&s, FILES + 1, false);
    assert_eq!((s["yields"].as_u64(), s["yield_wait_ms"].as_u64()), (Some(0), Some(0)), "{s:#}");
    // With no foreground, no wait either (yielding on).
    drop(_m);
    let _m = d.mount(&["--no-remote", "--config", &yield_cfg(true)]);
    for i in 0..FILES {
        fs::read(d.m(&format!("f{i}"))).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    let s = d.balanced(&["--from", "0", "--to", "1", "--files", &(FILES + 1).to_string()]);
    moved_ok(&s, FILES, true);
    assert_eq!(s["yields"].as_u64(), Some(0), "waited with no foreground I/O: {s:#}");
}

/// A lender smaller than the file evicts part of what the mount filled, and the mount's index
/// does not know which part: the copy takes what the lender still has, reads the rest from
/// the disk afterwards (its queued spans), and the moved file is exactly the file.
#[test]
fn a_copy_from_a_lender_that_evicted_part_of_the_file_reads_the_rest_from_the_disk() {
    const SIZE: usize = 4 << 20;
    let d = Dirs::new("evicted");
    let data = pattern(SIZE, 51);
    fs::write(d.a.join("f"), &data).unwrap();
    // The mount's own lender, 2 MiB: half the file at most.
    let cfg = d.config("[server]\ncapacity = \"2MiB\"\nshards = 8\n");
    let _m = d.mount(&[LENDERS_FIRST[0], LENDERS_FIRST[1], "--config", &cfg]);
    let blocks = (SIZE / 4096) as u64;
    let order: Vec<u64> = (0..blocks).map(|i| (i * 613) % blocks).collect();
    DirectReader::open(&d.m("f")).pass(&order, &data);
    // Every block listed, though the lender holds half at most.
    d.wait_listed(blocks, Duration::from_secs(30));
    let before = d.stats();
    let s = d.balanced(&["--from", "0", "--to", "1", "--files", "1"]);
    assert_eq!(s["moved"].as_u64(), Some(1), "{s:#}");
    let (cache, disk) = (s["blocks_from_cache"].as_u64().unwrap(), s["blocks_from_disk"].as_u64().unwrap());
    assert!(cache > 0 && disk > 0, "the copy should take part from the lender and part from the disk: {s:#}");
    assert!(cache < blocks * 3 / 4, "more blocks from a 2 MiB lender than it can hold: {s:#}");
    let after = d.stats();
    assert!(
        n(&after, "remote", "misses") > n(&before, "remote", "misses"),
        "the copy asked for no evicted block (the test's premise): {after:#}"
    );
    assert_eq!(d.on("f"), (false, true));
    assert!(fs::read(d.b.join("f")).unwrap() == data, "the copy on the target branch differs");
    assert!(fs::read(d.m("f")).unwrap() == data, "the moved file reads differently");
}

#[test]
fn a_copy_from_lenders_alone_does_not_wait_and_one_from_the_disk_does() {
    const SIZE: usize = 4 << 20;
    let d = Dirs::new("yield-lender");
    let hot = pattern(SIZE, 41);
    fs::write(d.a.join("hot"), &hot).unwrap();
    // The foreground's file is on the target branch: its reads count there.
    let fg = Arc::new(pattern(SIZE, 42));
    fs::write(d.b.join("fg"), &*fg).unwrap();
    let cfg = d.config("[balance]\nyield_wait_ratio = 99.0\nyield_max_wait = \"20ms\"\n");
    let _m = d.mount(&[LENDERS_FIRST[0], LENDERS_FIRST[1], "--config", &cfg]);
    let blocks = (SIZE / 4096) as u64;
    let order: Vec<u64> = (0..blocks).collect();
    DirectReader::open(&d.m("hot")).pass(&order, &hot);
    d.wait_listed(blocks, Duration::from_secs(10));
    let under_readers = |args: &[&str]| {
        let stop = Arc::new(AtomicBool::new(false));
        let readers = foreground_readers(&d.m("fg"), &fg, 4, &stop);
        std::thread::sleep(Duration::from_millis(200));
        let s = d.balanced(args);
        stop.store(true, Ordering::Relaxed);
        let wrong: u64 = readers.into_iter().map(|r| r.join().unwrap().1).sum();
        assert_eq!(wrong, 0);
        s
    };
    // Every block from the lender: no chunk read the disk, none waited for it, busy readers
    // or not (yield_wait_ratio 99 would have made each wait 20 ms). Fetches from the lender
    // owe the readers a wait as long as themselves (the link is theirs too), not 99 times.
    let s = under_readers(&["--from", "0", "--to", "1", "--files", "1"]);
    assert_eq!((s["moved"].as_u64(), s["blocks_from_disk"].as_u64()), (Some(1), Some(0)), "{s:#}");
    assert_eq!(s["yields"].as_u64(), Some(0), "a copy from the lender alone waited for the disk: {s:#}");
    let (lender_waits, lender_waited, fetching) = (
        s["lender_yields"].as_u64().unwrap(),
        s["lender_yield_wait_ms"].as_u64().unwrap(),
        s["read_cache_ms"].as_u64().unwrap(),
    );
    // Each wait at most its fetch's time, plus a late wake-up (see the test above).
    assert!(lender_waited <= fetching + 1 + lender_waits * 500, "waited longer than it fetched: {s:#}");
    assert_eq!(d.on("hot"), (false, true));
    // The same readers, the conventional copy back (both files, all from the disk): it waits.
    let s = under_readers(&["--from", "1", "--to", "0", "--files", "2", "--source", "disk"]);
    assert_eq!((s["moved"].as_u64(), s["blocks_from_cache"].as_u64()), (Some(2), Some(0)), "{s:#}");
    assert!(s["yields"].as_u64().unwrap() >= 2, "a copy from the disk under readers did not wait: {s:#}");
    assert_eq!(s["lender_yields"].as_u64(), Some(0), "a copy from the disk waited for the lenders: {s:#}");
    assert!(fs::read(d.m("hot")).unwrap() == hot && fs::read(d.m("fg")).unwrap() == *fg);
}
