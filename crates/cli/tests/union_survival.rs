//! A mount of several backing branches survives what a mount of one does, with the real
//! binary and real FUSE mounts: SIGKILLs of the daemon under `--supervise` while a writer
//! and a reader verify every byte through descriptors held open across every kill, an
//! in-place upgrade (`--takeover`) with files open on both branches, and a SIGKILL at each
//! step of a `farcache balance` move under `--supervise` — after the automatic restart each
//! file is there once, right, under its inode number, and the descriptors opened before
//! read and write the surviving copy — and operations on names killed at each point of
//! their execution, which the next daemon answers as done (the intent journal).
//!
//! Each union is a branch on the test directory's disk file system and one on tmpfs
//! (`/dev/shm`). Root and FUSE needed. Every test is bounded: a watchdog aborts the FUSE
//! connection (fusectl) if it is still running past its bound, so a hang fails instead of
//! blocking; mounts are unmounted and directories removed on drop, also on failure.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use farcache_testkit::{
    fuse_mounted, pattern, require_fuse, require_root, run_bin, text, wait_until, AlignedBuf, MountProcess, Rng,
    UnionDirs, Watchdog,
};
use serde_json::Value;

const BLOCK: usize = 4096;
/// Blocks of each file the load writes and reads.
const FILE_BLOCKS: usize = 256;
/// SIGKILLs in the load test (`FARCACHE_UNION_KILLS` overrides, for a long run); an
/// in-place upgrade (SIGHUP to the supervisor) follows every [`KILLS_PER_UPGRADE`].
const KILLS: usize = 10;
const KILLS_PER_UPGRADE: usize = 5;
/// Each kill comes this long (seeded, uniformly drawn) after the mount serves again.
const KILL_DELAY_MS: std::ops::Range<u64> = 20..250;
/// How long a new daemon may take to appear after an event.
const EVENT_WAIT: Duration = Duration::from_secs(20);
/// Past this, the watchdog aborts the test's FUSE connection.
const TEST_BOUND: Duration = Duration::from_secs(120);

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
        require_fuse();
        require_root("the union survival tests (mounting, open_by_handle_at)");
        Dirs(UnionDirs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("unionsv-{tag}")))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.root.join(format!("{name}.log"))
    }

    /// On which branches `rel` exists.
    fn on(&self, rel: &str) -> (bool, bool) {
        (self.a.join(rel).symlink_metadata().is_ok(), self.b.join(rel).symlink_metadata().is_ok())
    }

    /// The backing file of `rel`, which must be on exactly one branch.
    fn backing_of(&self, rel: &str) -> PathBuf {
        match self.on(rel) {
            (true, false) => self.a.join(rel),
            (false, true) => self.b.join(rel),
            other => panic!("{rel} is on {other:?} (branch a, branch b): not exactly once"),
        }
    }

    fn stats(&self) -> Value {
        let out = run_bin(bin(), &["stats", self.mnt.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn supervised(&self, env: &[(&str, &str)]) -> MountProcess {
        let args = ["--supervise", "--restart-limit", "1000", "--restart-window", "1", "--no-remote"];
        MountProcess::try_start_env(bin(), &self.branches(), &self.mnt, &args, env, &self.log("supervisor"))
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Opened with `O_DIRECT`: every read and write reaches the daemon (no page cache).
fn open_direct(p: &Path, write: bool) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(write).custom_flags(libc::O_DIRECT).open(p)
}

/// All of `f` (`len` bytes) through an `O_DIRECT` descriptor.
fn read_direct(f: &File, len: usize) -> std::io::Result<Vec<u8>> {
    let mut a = AlignedBuf::new(len);
    f.read_exact_at(a.get(len), 0)?;
    Ok(a.get(len).to_vec())
}

/// The daemon a supervisor runs: its one child other than `not` (bounded wait).
fn daemon_of(sup: &MountProcess, not: Option<u32>) -> u32 {
    let mut pid = None;
    let ok = wait_until(EVENT_WAIT, Duration::from_millis(5), || {
        let c = sup.children();
        pid = (c.len() == 1 && Some(c[0]) != not).then(|| c[0]);
        pid.is_some()
    });
    assert!(ok, "no single new daemon under the supervisor (children {:?}):\n{}", sup.children(), sup.log_text());
    pid.unwrap()
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

fn kill9(pid: u32) {
    // SAFETY: kill(2) on a daemon this test's supervisor started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Small files made through the mount before the kills (more than a usual descriptor limit).
const MANY: usize = 1500;

/// Lower this test process's soft descriptor limit to `n` (children inherit it); the hard
/// limit stays, so a process that needs more can raise it.
fn lower_soft_nofile(n: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_cur.min(n);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// Files of the load: name, and the seed of its first contents. Two on each branch, one of
/// each pair in a directory that is on both.
const LOAD_FILES: [(&str, u64); 4] = [("fa", 1), ("fb", 2), ("dir/ga", 3), ("dir/gb", 4)];

/// Put the load's files on their branches (`a` for names ending in "a").
fn lay_out(d: &Dirs) {
    fs::create_dir(d.a.join("dir")).unwrap();
    fs::create_dir(d.b.join("dir")).unwrap();
    for (rel, seed) in LOAD_FILES {
        let branch = if rel.ends_with('a') { &d.a } else { &d.b };
        fs::write(branch.join(rel), pattern(FILE_BLOCKS * BLOCK, seed)).unwrap();
    }
}

/// One file's writer and reader: a descriptor for each, opened once before the first kill
/// and used to the end; each round writes a random block (new random bytes) and reads
/// another, which must be exactly what was last written there. Returns the model (what the
/// file must hold), the operations done, and every error or wrong byte seen.
struct FileLoad {
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
    thread: std::thread::JoinHandle<Vec<u8>>,
}

impl FileLoad {
    fn start(path: PathBuf, seed: u64) -> FileLoad {
        let w = open_direct(&path, true).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        let r = open_direct(&path, false).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        let (stop, ops, errors) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::default());
        let (s, o, e): (_, _, Arc<Mutex<Vec<String>>>) = (stop.clone(), ops.clone(), Arc::clone(&errors));
        let thread = std::thread::spawn(move || {
            let mut model = pattern(FILE_BLOCKS * BLOCK, seed);
            let mut rng = Rng::new(seed * 7919);
            let mut buf = AlignedBuf::new(BLOCK);
            let fail = |m: String| e.lock().unwrap().push(m);
            let mut n = 0u64;
            while !s.load(Ordering::SeqCst) {
                let i = rng.below(FILE_BLOCKS as u64) as usize;
                rng.fill(buf.get(BLOCK));
                match w.write_all_at(buf.get(BLOCK), (i * BLOCK) as u64) {
                    Ok(()) => model[i * BLOCK..(i + 1) * BLOCK].copy_from_slice(buf.get(BLOCK)),
                    Err(err) => {
                        fail(format!("{}: write of block {i}: {err}", path.display()));
                        // The block is unknown now: stop here rather than mis-model.
                        return model;
                    }
                }
                let j = if n.is_multiple_of(2) { i } else { rng.below(FILE_BLOCKS as u64) as usize };
                match r.read_exact_at(buf.get(BLOCK), (j * BLOCK) as u64) {
                    Ok(()) if buf.get(BLOCK) == &model[j * BLOCK..(j + 1) * BLOCK] => {}
                    Ok(()) => fail(format!("{}: block {j} read back wrong (op {n})", path.display())),
                    Err(err) => fail(format!("{}: read of block {j}: {err}", path.display())),
                }
                if n % 16 == 15 {
                    if let Err(err) = w.sync_data() {
                        fail(format!("{}: fdatasync: {err}", path.display()));
                    }
                }
                n += 1;
                o.fetch_add(1, Ordering::Relaxed);
            }
            // A last full read through the descriptor opened before every kill.
            match read_direct(&r, FILE_BLOCKS * BLOCK) {
                Ok(all) if all == model => {}
                Ok(_) => fail(format!("{}: the whole file read back wrong at the end", path.display())),
                Err(err) => fail(format!("{}: the final read: {err}", path.display())),
            }
            model
        });
        FileLoad { stop, ops, errors, thread }
    }
}

/// `KILLS` SIGKILLs (`FARCACHE_UNION_KILLS`) of a supervised union's daemon, and an
/// in-place upgrade after every fifth, each at a random moment (seeded, printed;
/// `FARCACHE_UNION_SEED` replays), while a writer and a
/// reader per file — two files on each branch — verify every byte through descriptors held
/// open across all the kills. Nothing may fail; afterwards each file is on its branch
/// alone and holds exactly what was written, under the inode number it had.
#[test]
fn a_supervised_union_keeps_every_byte_and_open_file_across_kills() {
    let d = Dirs::new("kills");
    lay_out(&d);
    // The usual soft limit on descriptors (systemd's, a login shell's): the supervisor holds
    // one per inode the kernel knows, more than that here.
    lower_soft_nofile(1024);
    // Many inodes the kernel knows, files on both branches: each must resolve after every
    // kill, under its inode number.
    for br in [&d.a, &d.b] {
        fs::create_dir(br.join("many")).unwrap();
    }
    for i in 0..MANY {
        fs::write([&d.a, &d.b][i % 2].join(format!("many/{i}")), i.to_string()).unwrap();
    }
    let sup = d.supervised(&[]);
    let many: Vec<(PathBuf, u64)> = (0..MANY)
        .map(|i| {
            let p = d.m(&format!("many/{i}"));
            let ino = fs::metadata(&p).unwrap().ino();
            (p, ino)
        })
        .collect();
    let kills: usize = std::env::var("FARCACHE_UNION_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(KILLS);
    let seed: u64 = std::env::var("FARCACHE_UNION_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|t| t.as_nanos() as u64).unwrap_or(1)
    });
    eprintln!("{kills} kills, seed {seed} (FARCACHE_UNION_SEED={seed} replays the kill points)");
    let _dog = Watchdog::start(&d.mnt, TEST_BOUND.max(Duration::from_secs(3 * kills as u64)));
    let inos: Vec<u64> =
        ["fa", "fb", "dir", "dir/ga", "dir/gb"].iter().map(|r| fs::metadata(d.m(r)).unwrap().ino()).collect();
    let loads: Vec<FileLoad> = LOAD_FILES.iter().map(|(rel, seed)| FileLoad::start(d.m(rel), *seed)).collect();
    let mut rng = Rng::new(seed);
    let mut daemon = daemon_of(&sup, None);
    let mut upgrades = 0;
    for k in 0..kills + kills / KILLS_PER_UPGRADE {
        let delay = KILL_DELAY_MS.start + rng.below(KILL_DELAY_MS.end - KILL_DELAY_MS.start);
        std::thread::sleep(Duration::from_millis(delay));
        if k % (KILLS_PER_UPGRADE + 1) == KILLS_PER_UPGRADE {
            // An in-place upgrade of the supervised union (SIGHUP: a new daemon takes over).
            sup.signal(libc::SIGHUP);
            upgrades += 1;
        } else {
            kill9(daemon);
        }
        let next = daemon_of(&sup, Some(daemon));
        assert!(wait_until(EVENT_WAIT, Duration::from_millis(2), || !alive(daemon)), "pid {daemon} lingers");
        daemon = next;
        // Served again: a listing reaches the daemon whatever the kernel caches.
        let names: Vec<_> = fs::read_dir(d.m("dir"))
            .unwrap_or_else(|e| panic!("listing after kill {k}: {e}\n{}", sup.log_text()))
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "after kill {k}: {names:?}");
    }
    std::thread::sleep(Duration::from_millis(KILL_DELAY_MS.end));
    let mut ops = 0;
    let mut errors = Vec::new();
    let mut models = Vec::new();
    for l in loads {
        l.stop.store(true, Ordering::SeqCst);
        let model = l.thread.join().expect("a load thread panicked");
        ops += l.ops.load(Ordering::Relaxed);
        errors.extend(l.errors.lock().unwrap().drain(..));
        models.push(model);
    }
    assert!(errors.is_empty(), "the load saw errors (seed {seed}):\n{}\n{}", errors.join("\n"), sup.log_text());
    assert!(ops >= 200, "too little load to mean anything: {ops} write+read rounds");
    eprintln!("{kills} kills, {upgrades} upgrades: {ops} write+read rounds, none failed");
    let after: Vec<u64> =
        ["fa", "fb", "dir", "dir/ga", "dir/gb"].iter().map(|r| fs::metadata(d.m(r)).unwrap().ino()).collect();
    assert_eq!(after, inos, "inode numbers changed across the kills");
    for ((rel, _), model) in LOAD_FILES.iter().zip(&models) {
        let want_on = if rel.ends_with('a') { (true, false) } else { (false, true) };
        assert_eq!(d.on(rel), want_on, "{rel} left its branch");
        assert!(fs::read(d.backing_of(rel)).unwrap() == *model, "{rel}: the backing file is not what was written");
        assert!(fs::read(d.m(rel)).unwrap() == *model, "{rel}: read through the mount differs");
    }
    // Known to the kernel before the kills, resolved after them (the attributes the kernel
    // cached have expired: each stat asks the daemon).
    std::thread::sleep(Duration::from_millis(1100));
    for (i, (p, ino)) in many.iter().enumerate() {
        let m = fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}\n{}", p.display(), sup.log_text()));
        assert_eq!(m.ino(), *ino, "{}: inode number", p.display());
        assert_eq!(fs::read_to_string(p).unwrap(), i.to_string());
    }
    // The restarted daemon serves the union (its counters, its balance).
    assert_eq!(d.stats()["union"]["branches"].as_array().map(Vec::len), Some(2));
    let log = sup.stop();
    if kills > 0 {
        assert!(log.contains("took over the FUSE connection"), "{log}");
    }
    if upgrades > 0 {
        assert!(log.contains("takeover: the new daemon serves"), "no upgrade completed:\n{log}");
    }
}

/// An in-place upgrade of a union: files open on both branches (one of them unlinked while
/// open) read and write on through the same descriptors, with their contents and inode
/// numbers, also looked up afresh and moved by a balance afterwards; a takeover naming
/// other branches is refused and leaves the old daemon serving.
#[test]
fn a_union_is_taken_over_with_files_open_on_both_branches() {
    let d = Dirs::new("takeover");
    lay_out(&d);
    fs::write(d.b.join("gone"), pattern(8 * BLOCK, 9)).unwrap();
    let old = MountProcess::start(bin(), &d.branches(), &d.mnt, &["--no-remote"], &d.log("old"));
    let _dog = Watchdog::start(&d.mnt, TEST_BOUND);
    let rels = ["fa", "fb", "dir/ga", "dir/gb"];
    let inos: Vec<u64> = rels.iter().chain(&["dir"]).map(|r| fs::metadata(d.m(r)).unwrap().ino()).collect();
    let mut models: Vec<Vec<u8>> = LOAD_FILES.iter().map(|(_, s)| pattern(FILE_BLOCKS * BLOCK, *s)).collect();
    let held: Vec<(File, File)> =
        rels.iter().map(|r| (open_direct(&d.m(r), true).unwrap(), open_direct(&d.m(r), false).unwrap())).collect();
    let mut buf = AlignedBuf::new(BLOCK);
    let mut rng = Rng::new(42);
    let mut write_some = |held: &[(File, File)], models: &mut [Vec<u8>], what: &str| {
        for ((w, r), model) in held.iter().zip(models.iter_mut()) {
            for _ in 0..8 {
                let i = rng.below(FILE_BLOCKS as u64) as usize;
                rng.fill(buf.get(BLOCK));
                w.write_all_at(buf.get(BLOCK), (i * BLOCK) as u64).unwrap_or_else(|e| panic!("{what}: write: {e}"));
                model[i * BLOCK..(i + 1) * BLOCK].copy_from_slice(buf.get(BLOCK));
            }
            w.sync_all().unwrap_or_else(|e| panic!("{what}: fsync: {e}"));
            let all = read_direct(r, FILE_BLOCKS * BLOCK).unwrap_or_else(|e| panic!("{what}: read: {e}"));
            assert!(all == *model, "{what}: a file read back wrong");
        }
    };
    write_some(&held, &mut models, "before the takeover");
    let gone = open_direct(&d.m("gone"), false).unwrap();
    fs::remove_file(d.m("gone")).unwrap();

    // Other branches (the first alone): refused, the old daemon serves on.
    let e = MountProcess::try_takeover(bin(), &d.a, &d.mnt, &["--no-remote"], &d.log("refused"))
        .err()
        .expect("a takeover with other branches must be refused");
    assert!(e.contains("backing_dir") && e.contains("fix:"), "{e}");
    write_some(&held, &mut models, "after a refused takeover");

    let new = MountProcess::try_takeover(bin(), &d.branches(), &d.mnt, &["--no-remote"], &d.log("new"))
        .unwrap_or_else(|e| panic!("{e}\nold daemon:\n{}", old.log_text()));
    old.release_mount();
    assert_eq!(old.wait_exit(), 0, "{}", old.log_text());
    assert!(fuse_mounted(&d.mnt));
    // The same descriptors: what was written before reads back, and new writes land.
    for ((_, r), model) in held.iter().zip(&models) {
        assert!(read_direct(r, FILE_BLOCKS * BLOCK).unwrap() == *model, "a file opened before the takeover");
    }
    write_some(&held, &mut models, "after the takeover");
    assert_eq!(read_direct(&gone, 8 * BLOCK).unwrap(), pattern(8 * BLOCK, 9), "an unlinked file held open");
    let after: Vec<u64> = rels.iter().chain(&["dir"]).map(|r| fs::metadata(d.m(r)).unwrap().ino()).collect();
    assert_eq!(after, inos, "inode numbers changed across the takeover");
    for (rel, model) in rels.iter().zip(&models) {
        let want_on = if rel.ends_with('a') { (true, false) } else { (false, true) };
        assert_eq!(d.on(rel), want_on, "{rel} left its branch");
        assert!(fs::read(d.backing_of(rel)).unwrap() == *model, "{rel}: the backing file is not what was written");
    }
    // Names looked up afresh (a rename makes the kernel ask): the same inodes.
    for (rel, ino) in rels.iter().zip(&inos) {
        let moved = format!("{rel}.renamed");
        fs::rename(d.m(rel), d.m(&moved)).unwrap_or_else(|e| panic!("rename {rel} after the takeover: {e}"));
        assert_eq!(fs::metadata(d.m(&moved)).unwrap().ino(), *ino, "{rel} renamed after the takeover");
        fs::rename(d.m(&moved), d.m(rel)).unwrap();
        assert_eq!(fs::metadata(d.m(rel)).unwrap().ino(), *ino, "{rel} renamed back");
    }
    // A balance after the takeover moves the files of branch b (read through the held
    // descriptors just now) to branch a; those descriptors follow the files.
    let mnt = d.mnt.to_str().unwrap();
    let out = run_bin(bin(), &["balance", mnt, "--json", "--window-ms", "100", "--from", "1", "--to", "0"]);
    assert!(out.status.success(), "balance after the takeover: {}{}", text(&out.stdout), text(&out.stderr));
    for rel in ["fb", "dir/gb"] {
        assert_eq!(d.on(rel), (true, false), "{rel} was not moved to branch a");
    }
    write_some(&held, &mut models, "after a balance that followed the takeover");
    for (rel, model) in rels.iter().zip(&models) {
        assert!(fs::read(d.a.join(rel)).unwrap() == *model, "{rel}: the moved file is not what was written");
    }
    // New files still get ids and are placed, after the takeover.
    fs::write(d.m("dir/new"), b"after").unwrap();
    assert_eq!(fs::read(d.m("dir/new")).unwrap(), b"after");
    assert!(new.log_text().contains("took over the FUSE connection"));
    drop((held, gone));
    new.stop();
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd.map(|e| e.unwrap().file_name().into_string().unwrap()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// A SIGKILL of a supervised union's daemon at each step of a `farcache balance` move (the
/// test-only fault point aborts it there): after the automatic restart, which finishes the
/// interrupted move from its journal, each file is on one branch only, right, under its
/// inode number; descriptors opened before read it, and write to the copy that survived.
#[test]
fn a_kill_during_a_balance_under_supervise_leaves_each_file_once_and_open_files_right() {
    const FILES: usize = 3;
    // Three chunks of copy each: "mid-copy" is after the second, the copy begun, not done.
    const SIZE: usize = 3 << 20;
    for step in ["before-copy", "mid-copy", "after-copy", "after-switch", "before-remove"] {
        let d = Dirs::new(&format!("bal-{step}"));
        let rels: Vec<String> = (0..FILES).map(|i| format!("f{i}")).collect();
        let mut models: Vec<Vec<u8>> = (0..FILES).map(|i| pattern(SIZE, 30 + i as u64)).collect();
        for (rel, m) in rels.iter().zip(&models) {
            fs::write(d.a.join(rel), m).unwrap();
        }
        let fault = format!("balance:{step}");
        let sup = d.supervised(&[("FARCACHE_FAULT", &fault)]);
        let _dog = Watchdog::start(&d.mnt, TEST_BOUND);
        let inos: Vec<u64> = rels.iter().map(|r| fs::metadata(d.m(r)).unwrap().ino()).collect();
        // Read through the mount: the balance moves recently used files.
        let held: Vec<(File, File)> =
            rels.iter().map(|r| (open_direct(&d.m(r), true).unwrap(), open_direct(&d.m(r), false).unwrap())).collect();
        for ((_, r), m) in held.iter().zip(&models) {
            assert!(read_direct(r, SIZE).unwrap() == *m, "{step}: before the balance");
        }
        let daemon = daemon_of(&sup, None);
        let mnt = d.mnt.to_str().unwrap();
        let out = run_bin(bin(), &["balance", mnt, "--json", "--window-ms", "100", "--from", "0", "--to", "1"]);
        assert!(!out.status.success(), "{step}: the daemon did not stop at the fault point: {}", text(&out.stdout));
        let next = daemon_of(&sup, Some(daemon));
        assert!(wait_until(EVENT_WAIT, Duration::from_millis(2), || !alive(daemon)), "{step}: pid {daemon} lingers");
        assert!(sup.log_text().contains(&fault), "{step}: the fault point was not reached");
        assert_eq!(names(&d.mnt), rels, "{step}: the listing after the restart");
        let on_b = rels.iter().filter(|r| d.on(r).1).count();
        let switched = matches!(step, "after-switch" | "before-remove");
        assert_eq!(on_b, usize::from(switched), "{step}: files on the target (one once the switch happened)");
        for (i, rel) in rels.iter().enumerate() {
            let (w, r) = &held[i];
            let what = format!("{step}: {rel}");
            let backing = d.backing_of(rel);
            assert_eq!(fs::metadata(d.m(rel)).unwrap().ino(), inos[i], "{what}: inode number");
            assert!(fs::read(d.m(rel)).unwrap() == models[i], "{what}: read through the mount");
            assert!(read_direct(r, SIZE).unwrap() == models[i], "{what}: read through a descriptor held across");
            // A write through a descriptor opened before the crash lands in the file that is
            // left (the backing file on its one branch), never in a removed copy.
            let mut buf = AlignedBuf::new(BLOCK);
            buf.get(BLOCK).fill(0xa0 + i as u8);
            w.write_all_at(buf.get(BLOCK), 5 * BLOCK as u64).unwrap_or_else(|e| panic!("{what}: write: {e}"));
            w.sync_all().unwrap();
            models[i][5 * BLOCK..6 * BLOCK].fill(0xa0 + i as u8);
            assert!(fs::read(&backing).unwrap() == models[i], "{what}: the write did not reach the backing file");
            assert!(read_direct(r, SIZE).unwrap() == models[i], "{what}: read back after the write");
        }
        for br in [&d.a, &d.b] {
            assert!(names(&br.join(".farcache-union/tmp")).is_empty(), "{step}: a copy was left");
            assert!(names(&br.join(".farcache-union/journal")).is_empty(), "{step}: a record was left");
        }
        assert_eq!(d.stats()["union"]["journal_replayed"].as_u64(), Some(1), "{step}");
        assert!(alive(next));
        drop(held);
        sup.stop();
    }
}

/// Operations on names of a supervised union, each killed at each point of its execution
/// (intent recorded and nothing done; done and its result not recorded; result recorded and
/// the reply not written), then resent by the kernel to the next daemon: the application
/// sees it succeed once, and every name is on the branches one execution leaves it on —
/// also for a rename from one branch over a name on the other, killed at those points and
/// between its two steps.
#[test]
fn operations_on_names_of_a_union_resent_after_a_crash_answer_as_done() {
    let d = Dirs::new("resend");
    fs::create_dir(d.a.join("ren")).unwrap();
    fs::create_dir(d.b.join("ren")).unwrap();
    let token = d.root.join("fault");
    let sup = d.supervised(&[("FARCACHE_FAULT_DIE", token.to_str().unwrap())]);
    let _dog = Watchdog::start(&d.mnt, TEST_BOUND);
    let m = d.m("ren");
    type Step = fn(&Dirs) -> std::io::Result<()>;
    type Check = fn(&Dirs);
    let cases: [(&str, Step, Step, Check); 7] = [
        (
            "rename",
            // The source on branch b, the name it replaces on branch a.
            |d| fs::write(d.b.join("ren/src"), b"moved").and_then(|()| fs::write(d.a.join("ren/dst"), b"replaced")),
            |d| fs::rename(d.m("ren/src"), d.m("ren/dst")),
            |d| {
                assert_eq!(fs::read(d.m("ren/dst")).unwrap(), b"moved");
                assert_eq!(d.on("ren/dst"), (false, true), "the target name once, on the source's branch");
                assert_eq!(d.on("ren/src"), (false, false));
                fs::remove_file(d.m("ren/dst")).unwrap();
            },
        ),
        (
            "unlink",
            |d| fs::write(d.b.join("ren/u"), b"u"),
            |d| fs::remove_file(d.m("ren/u")),
            |d| assert_eq!(d.on("ren/u"), (false, false)),
        ),
        (
            "rmdir",
            |d| fs::create_dir(d.a.join("ren/r")).and_then(|()| fs::create_dir(d.b.join("ren/r"))),
            |d| fs::remove_dir(d.m("ren/r")),
            |d| assert_eq!(d.on("ren/r"), (false, false)),
        ),
        (
            "mkdir",
            |_| Ok(()),
            |d| fs::create_dir(d.m("ren/m")),
            |d| {
                assert_eq!(d.on("ren/m"), (true, true), "made on every branch");
                fs::remove_dir(d.m("ren/m")).unwrap();
            },
        ),
        (
            "create",
            |_| Ok(()),
            |d| {
                use std::io::Write;
                OpenOptions::new().write(true).create_new(true).open(d.m("ren/c"))?.write_all(b"created")
            },
            |d| {
                assert_eq!(fs::read(d.m("ren/c")).unwrap(), b"created");
                assert!(matches!(d.on("ren/c"), (true, false) | (false, true)), "once: {:?}", d.on("ren/c"));
                fs::remove_file(d.m("ren/c")).unwrap();
            },
        ),
        (
            "link",
            |d| fs::write(d.b.join("ren/l1"), b"l"),
            |d| fs::hard_link(d.m("ren/l1"), d.m("ren/l2")),
            |d| {
                assert_eq!(fs::metadata(d.m("ren/l1")).unwrap().ino(), fs::metadata(d.m("ren/l2")).unwrap().ino());
                assert_eq!(d.on("ren/l2"), (false, true), "on the file's branch");
                fs::remove_file(d.m("ren/l1")).unwrap();
                fs::remove_file(d.m("ren/l2")).unwrap();
            },
        ),
        (
            "symlink",
            |_| Ok(()),
            |d| std::os::unix::fs::symlink("target", d.m("ren/s")),
            |d| {
                assert_eq!(fs::read_link(d.m("ren/s")).unwrap(), Path::new("target"));
                fs::remove_file(d.m("ren/s")).unwrap();
            },
        ),
    ];
    let mut daemon = daemon_of(&sup, None);
    // A rename of a file also between its two steps: renamed on its branch, the name it
    // replaces not yet removed from the other.
    let rename_between = (cases[0].0, cases[0].1, cases[0].2, cases[0].3, &["between"][..]);
    let all = cases.into_iter().map(|(op, s, a, c)| (op, s, a, c, &["begun", "ran", "done"][..]));
    for (op, setup, act, check, points) in all.chain([rename_between]) {
        for &point in points {
            let what = format!("{op} killed at {point}");
            setup(&d).unwrap_or_else(|e| panic!("{what}: setup: {e}"));
            fs::write(&token, format!("{op}:{point}")).unwrap();
            act(&d).unwrap_or_else(|e| panic!("{what}: the application saw {e}\n{}", sup.log_text()));
            assert!(!token.exists(), "{what}: the fault did not fire (the daemon did not die there)");
            let next = daemon_of(&sup, Some(daemon));
            assert!(wait_until(EVENT_WAIT, Duration::from_millis(2), || !alive(daemon)), "pid {daemon} lingers");
            daemon = next;
            check(&d);
            assert!(names(&m).is_empty(), "{what}: left behind {:?}", names(&m));
        }
    }
    sup.stop();
}
