//! The mount outlives its daemon: real `farcache mount` daemons SIGKILLed under load and
//! upgraded in place (`--takeover`, and SIGHUP to `--supervise`), while a reader, a writer
//! and a renamer verify every byte and every name they see; operations on names resent
//! after a crash at each point of their execution answer as done; a takeover refused on a
//! settings or protocol mismatch leaves the running daemon serving; a new daemon killed in
//! the middle of a takeover leaves the old one serving.
//!
//! A real lender process runs across all the daemons of a test, so blocks an earlier daemon
//! stored stay on it: a daemon that read one of them after a write would fail the writer's
//! check (each daemon keys blocks with a secret of its own: none of them can).
//!
//! Every test is bounded: a watchdog aborts the FUSE connection (through fusectl) if a test
//! runs past its bound, so a hung mount fails the test instead of hanging it.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use farcache_testkit::{
    fuse_mounted, pattern, require_fuse, require_root, wait_until, AlignedBuf, DirectReader, MountProcess, Rng,
    ScratchDir, ServerProcess, TierFile, Watchdog,
};

const BLOCK: usize = 4096;
/// Files the renamer moves back and forth.
const RENAMED: usize = 4;
const STATIC_BLOCKS: usize = 512;
const DATA_BLOCKS: usize = 256;
/// SIGKILLs in the load test (`FARCACHE_TAKEOVER_KILLS` overrides); one upgrade follows
/// every [`KILLS_PER_UPGRADE`] of them.
const KILLS: usize = 100;
const KILLS_PER_UPGRADE: usize = 5;
/// Each event comes this long (uniformly drawn, seeded) after the mount serves again, so it
/// lands at a random point of whatever the load is doing.
const EVENT_DELAY_MS: std::ops::Range<u64> = 10..250;
/// How long a new daemon may take to appear after an event.
const EVENT_WAIT: Duration = Duration::from_secs(15);
/// Past this, the watchdog aborts the test's FUSE connection.
const TEST_BOUND: Duration = Duration::from_secs(100);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// A [`ScratchDir`] under Cargo's per-target temporary directory (ext4 here, where node ids
/// resolve by file handle after a crash), with `backing/meta`, a control socket and logs.
struct TestDir(ScratchDir);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        let d = ScratchDir::new(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("takeover-{tag}"));
        fs::create_dir_all(d.backing().join("meta")).unwrap();
        fs::create_dir_all(d.backing().join("ren")).unwrap();
        TestDir(d)
    }
    fn backing(&self) -> PathBuf {
        self.0.backing()
    }
    fn mnt(&self) -> PathBuf {
        self.0.mnt()
    }
    fn ctl(&self) -> PathBuf {
        self.0.join("ctl.sock")
    }
    fn log(&self, name: &str) -> PathBuf {
        self.0.join(format!("{name}.log"))
    }
}

fn open_direct(p: &Path, write: bool) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(write).custom_flags(libc::O_DIRECT).open(p)
}

/// What the load saw: errors (any is a failure), operations, the longest single operation.
#[derive(Default)]
struct Seen {
    errors: Mutex<Vec<String>>,
    ops: AtomicU64,
    longest_us: AtomicU64,
    /// What the test is doing now (0 nothing, 1 a kill, 2 an upgrade), and the longest
    /// operation that started during each.
    phase: AtomicU64,
    longest_by_phase_us: [AtomicU64; 3],
    /// Operations under way now, by kind (what a kill lands in the middle of).
    in_flight: Mutex<std::collections::BTreeMap<String, u32>>,
}

impl Seen {
    fn op<T>(&self, what: &str, f: impl FnOnce() -> std::io::Result<T>) -> Option<T> {
        let phase = self.phase.load(Ordering::Relaxed).min(2) as usize;
        *self.in_flight.lock().unwrap().entry(what.to_string()).or_default() += 1;
        let t0 = Instant::now();
        let r = f();
        *self.in_flight.lock().unwrap().get_mut(what).expect("counted above") -= 1;
        let us = t0.elapsed().as_micros() as u64;
        self.longest_us.fetch_max(us, Ordering::Relaxed);
        self.longest_by_phase_us[phase].fetch_max(us, Ordering::Relaxed);
        self.ops.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.fail(format!("{what}: {e}"));
                None
            }
        }
    }
    /// The kinds of operation under way now.
    fn under_way(&self) -> Vec<String> {
        self.in_flight.lock().unwrap().iter().filter(|(_, n)| **n > 0).map(|(k, _)| k.clone()).collect()
    }
    fn fail(&self, msg: String) {
        let mut e = self.errors.lock().unwrap();
        if e.len() < 20 {
            e.push(msg);
        }
    }
}

/// A reader of a file nobody writes (O_DIRECT, one descriptor opened before every event,
/// so its handle crosses them all) and a buffered reader; a writer of another file
/// (O_DIRECT writes, fsyncs, read-backs against its model); a third thread creating,
/// truncating and reading small files. Runs until `stop`; returns the writer's model.
struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
    threads: Vec<std::thread::JoinHandle<Option<Vec<u8>>>>,
}

impl Load {
    fn start(mnt: &Path, deadline: Instant) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Seen::default());
        let mut threads = Vec::new();
        let statik = pattern(STATIC_BLOCKS * BLOCK, 1);
        let (p, s, st) = (mnt.join("static"), seen.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let f = open_direct(&p, false).unwrap();
            let buffered = File::open(&p).unwrap();
            let mut a = AlignedBuf::new(BLOCK);
            let mut x = 7u64;
            while !st.load(Ordering::Relaxed) && Instant::now() < deadline {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let b = (x >> 33) as usize % STATIC_BLOCKS;
                if let Some(n) = s.op("read static (O_DIRECT)", || f.read_at(a.buf(), (b * BLOCK) as u64)) {
                    if n != BLOCK || a.buf()[..] != statik[b * BLOCK..(b + 1) * BLOCK] {
                        s.fail(format!("static block {b}: wrong bytes ({n} read)"));
                    }
                }
                let mut small = [0u8; 100];
                let off = (x >> 20) as usize % (statik.len() - small.len());
                if s.op("read static (buffered)", || buffered.read_exact_at(&mut small, off as u64)).is_some()
                    && small[..] != statik[off..off + 100]
                {
                    s.fail(format!("static bytes at {off}: wrong"));
                }
            }
            None
        }));
        let (p, s, st) = (mnt.join("data"), seen.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut model = pattern(DATA_BLOCKS * BLOCK, 2);
            let f = open_direct(&p, true).unwrap();
            let mut a = AlignedBuf::new(BLOCK);
            let mut seq = 100u64;
            while !st.load(Ordering::Relaxed) && Instant::now() < deadline {
                seq += 1;
                let b = (seq.wrapping_mul(2654435761) >> 7) as usize % DATA_BLOCKS;
                let content = pattern(BLOCK, seq);
                a.buf().copy_from_slice(&content);
                if s.op("write data (O_DIRECT)", || f.write_at(a.buf(), (b * BLOCK) as u64)).is_some() {
                    model[b * BLOCK..(b + 1) * BLOCK].copy_from_slice(&content);
                }
                if seq.is_multiple_of(4) {
                    s.op("fsync data", || f.sync_all());
                }
                // Read back the block written, and another one.
                for r in [b, (seq as usize * 31) % DATA_BLOCKS] {
                    if let Some(n) = s.op("read data (O_DIRECT)", || f.read_at(a.buf(), (r * BLOCK) as u64)) {
                        if n != BLOCK || a.buf()[..] != model[r * BLOCK..(r + 1) * BLOCK] {
                            s.fail(format!("data block {r} after write {seq}: stale or wrong bytes"));
                        }
                    }
                }
            }
            Some(model)
        }));
        let (d, s, st) = (mnt.join("meta"), seen.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            // One directory stream, opened before every event and listed again and again.
            let cpath = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: opendir with a valid path; the stream is closed below.
            let stream = unsafe { libc::opendir(cpath.as_ptr()) };
            assert!(!stream.is_null(), "opendir {}", d.display());
            let mut i = 0u64;
            while !st.load(Ordering::Relaxed) && Instant::now() < deadline {
                i += 1;
                let p = d.join(format!("f{}", i % 8));
                let body = format!("meta file, version {i}\n").repeat((i % 50 + 1) as usize);
                s.op("create+write meta", || {
                    let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(&p)?;
                    f.write_all(body.as_bytes())
                });
                if let Some(got) = s.op("read meta", || fs::read(&p)) {
                    if got != body.as_bytes() {
                        s.fail(format!("{}: wrong contents after version {i}", p.display()));
                    }
                }
                s.op("readdir meta", || fs::read_dir(&d).map(|r| r.count()));
                let listed = s.op("readdir of a directory opened before every event", || {
                    // SAFETY: a valid open stream; errno is reset to tell the end from an error.
                    unsafe {
                        libc::rewinddir(stream);
                        let mut n = 0;
                        loop {
                            *libc::__errno_location() = 0;
                            if libc::readdir(stream).is_null() {
                                let e = *libc::__errno_location();
                                return if e == 0 { Ok(n) } else { Err(std::io::Error::from_raw_os_error(e)) };
                            }
                            n += 1;
                        }
                    }
                });
                if listed.is_some_and(|n| n < 3) {
                    s.fail(format!("the held directory listed {listed:?} entries"));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            // SAFETY: the stream opened above, closed once.
            unsafe { libc::closedir(stream) };
            None
        }));
        let (d, s, st) = (mnt.join("ren"), seen.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            renamer(&d, &s, &st, deadline);
            None
        }));
        Load { stop, seen, threads }
    }

    /// Stop, join, and return (errors, operations, longest operation, the writer's model).
    fn finish(self) -> (Vec<String>, u64, Duration, Vec<u8>) {
        self.stop.store(true, Ordering::SeqCst);
        let mut model = Vec::new();
        for t in self.threads {
            if let Some(m) = t.join().expect("a load thread panicked") {
                model = m;
            }
        }
        let errors = self.seen.errors.lock().unwrap().clone();
        let longest = Duration::from_micros(self.seen.longest_us.load(Ordering::Relaxed));
        (errors, self.seen.ops.load(Ordering::Relaxed), longest, model)
    }
}

/// Operations on names, each of which fails if done twice: renames back and forth (one
/// replacing an existing name), exclusive creates, hard and symbolic links, unlinks, mkdir
/// and rmdir. Each must succeed, and afterwards the names must be exactly as it left them
/// with the right contents — a rename resent after a crash that answered `ENOENT`, or one
/// carried out twice, shows here.
fn renamer(d: &Path, s: &Seen, stop: &AtomicBool, deadline: Instant) {
    let body = |k: usize| format!("renamed file {k}\n").repeat(k + 1).into_bytes();
    let name = |k: usize, moved: bool| d.join(format!("{}{k}", if moved { "b" } else { "a" }));
    let mut moved = [false; RENAMED];
    for (k, m) in moved.iter().enumerate() {
        if s.op("renamer setup", || fs::write(name(k, *m), body(k))).is_none() {
            return;
        }
    }
    let absent = |p: &Path, what: &str| {
        if p.symlink_metadata().is_ok() {
            s.fail(format!("{what}: {} still exists", p.display()));
        }
    };
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        // Every file moves once per round, then the other operations on names.
        for (k, m) in moved.iter_mut().enumerate() {
            let (from, to) = (name(k, *m), name(k, !*m));
            if s.op("rename", || fs::rename(&from, &to)).is_none() {
                return; // the names are unknown now: one error is enough
            }
            *m = !*m;
            absent(&from, "after a rename");
            if let Some(got) = s.op("read renamed", || fs::read(&to)) {
                if got != body(k) {
                    s.fail(format!("{} after a rename: wrong contents", to.display()));
                }
            }
        }
        let (x, y, z, sym, sub) = (d.join("x"), d.join("y"), d.join("z"), d.join("sym"), d.join("sub"));
        let ok = s
            .op("create O_EXCL", || OpenOptions::new().write(true).create_new(true).open(&x)?.write_all(b"x"))
            .is_some()
            && s.op("link", || fs::hard_link(&x, &y)).is_some()
            && s.op("unlink", || fs::remove_file(&x)).is_some()
            && s.op("write the name a rename replaces", || fs::write(&z, b"old")).is_some()
            && s.op("rename over an existing name", || fs::rename(&y, &z)).is_some()
            && s.op("read the replaced name", || fs::read(&z)).is_some_and(|got| {
                if got != b"x" {
                    s.fail(format!("{} after a rename over it: {got:?}", z.display()));
                }
                true
            })
            && s.op("unlink the replaced name", || fs::remove_file(&z)).is_some()
            && s.op("symlink", || std::os::unix::fs::symlink("target", &sym)).is_some()
            && s.op("unlink a symlink", || fs::remove_file(&sym)).is_some()
            && s.op("mkdir", || fs::create_dir(&sub)).is_some()
            && s.op("rmdir", || fs::remove_dir(&sub)).is_some();
        if !ok {
            return;
        }
        absent(&y, "after a rename over another name");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn write_files(backing: &Path) {
    fs::write(backing.join("static"), pattern(STATIC_BLOCKS * BLOCK, 1)).unwrap();
    fs::write(backing.join("data"), pattern(DATA_BLOCKS * BLOCK, 2)).unwrap();
}

/// The daemon a supervisor runs: its one child (waits for a single one, bounded).
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

/// The mount serves again: an open reaches the daemon whatever the kernel caches, so it
/// returns once a daemon answers (bounded by the watchdog).
fn served(mnt: &Path) {
    File::open(mnt.join("static")).unwrap_or_else(|e| panic!("open through the mount after an event: {e}"));
}

/// The load test: `KILLS` SIGKILLs of the daemon and one in-place upgrade (SIGHUP to the
/// supervisor) after every `KILLS_PER_UPGRADE`, each at a random moment (seeded, printed;
/// `FARCACHE_TAKEOVER_SEED` replays one) after the mount serves again, under a reader, a
/// writer, a metadata thread and a renamer that verify every byte and name; nothing they do
/// may fail; afterwards the backing files hold exactly what the writer wrote.
#[test]
fn reader_and_writer_verify_every_byte_across_kills_and_takeovers() {
    require_fuse();
    require_root("takeover tests (open_by_handle_at, mounting)");
    let dir = TestDir::new("load");
    write_files(&dir.backing());
    let lender = ServerProcess::start(bin(), &["--capacity", "64MiB"], None);
    let lender_addr = lender.addr().to_string();
    let ctl = dir.ctl();
    // A crash a second ago is forgotten (no backoff): the kills come faster than anyone's.
    let args = [
        "--supervise",
        "--restart-limit",
        "100",
        "--restart-window",
        "1",
        "--server",
        lender_addr.as_str(),
        "--routing",
        "threshold",
        "--control-socket",
        ctl.to_str().unwrap(),
    ];
    let sup = MountProcess::start(bin(), &dir.backing(), &dir.mnt(), &args, &dir.log("supervisor"));
    let kills: usize = std::env::var("FARCACHE_TAKEOVER_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(KILLS);
    let seed: u64 = std::env::var("FARCACHE_TAKEOVER_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    eprintln!("{kills} kills, seed {seed} (FARCACHE_TAKEOVER_SEED={seed} replays the kill points)");
    let mut rng = Rng::new(seed);
    let bound = TEST_BOUND.max(Duration::from_secs(2 * kills as u64));
    let _dog = Watchdog::start(&dir.mnt(), bound);
    let load = Load::start(&dir.mnt(), Instant::now() + bound);
    let mut daemon = daemon_of(&sup, None);
    let (mut killed, mut upgrades) = (0, 0);
    // How many kills landed during each kind of operation.
    let mut landed = std::collections::BTreeMap::new();
    let t0 = Instant::now();
    while killed < kills {
        load.seen.phase.store(0, Ordering::SeqCst);
        let delay = EVENT_DELAY_MS.start + rng.below(EVENT_DELAY_MS.end - EVENT_DELAY_MS.start);
        std::thread::sleep(Duration::from_millis(delay));
        let upgrade = killed > 0 && killed % KILLS_PER_UPGRADE == 0 && upgrades < killed / KILLS_PER_UPGRADE;
        load.seen.phase.store(if upgrade { 2 } else { 1 }, Ordering::SeqCst);
        if upgrade {
            sup.signal(libc::SIGHUP);
            upgrades += 1;
        } else {
            let during = load.seen.under_way();
            // SAFETY: kill(2) on the supervisor's child, a process this test started.
            unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
            killed += 1;
            for k in during {
                *landed.entry(k).or_insert(0u32) += 1;
            }
        }
        let next = daemon_of(&sup, Some(daemon));
        assert!(wait_until(EVENT_WAIT, Duration::from_millis(2), || !alive(daemon)), "pid {daemon} lingers");
        daemon = next;
        served(&dir.mnt());
    }
    let per_event = t0.elapsed() / (killed + upgrades) as u32;
    // A restarted or upgraded daemon prints no second "farcache mounted" line into the
    // supervisor's stdout (a pipe here that nobody reads past the first line: ~500 restarts'
    // lines once filled it and blocked the next daemon before it served).
    let out = fs::read_link(format!("/proc/{daemon}/fd/1")).unwrap();
    assert_eq!(out, Path::new("/dev/null"), "the supervised daemon {daemon} writes its stdout to {out:?}");
    load.seen.phase.store(0, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(EVENT_DELAY_MS.end));
    let by_phase: Vec<Duration> =
        load.seen.longest_by_phase_us.iter().map(|a| Duration::from_micros(a.load(Ordering::Relaxed))).collect();
    let (errors, ops, longest, model) = load.finish();
    eprintln!(
        "{killed} kills, {upgrades} upgrades (seed {seed}), {per_event:?} per event: {ops} operations, longest \
         {longest:?}; longest operation started during a kill {:?}, an upgrade {:?}, neither {:?} (noisy: shared \
         machine, debug build)",
        by_phase[1], by_phase[2], by_phase[0]
    );
    assert!(
        errors.is_empty(),
        "the load saw errors (seed {seed}; FARCACHE_TAKEOVER_SEED={seed} replays the kill points):\n{}\n{}",
        errors.join("\n"),
        sup.log_text()
    );
    assert!(ops > 1000, "too little load to mean anything: {ops} operations");
    eprintln!("kills landed during (operations under way at the SIGKILL): {landed:?}");
    if kills >= KILLS {
        // Kills at random points land in the middle of every kind of operation that takes a
        // round trip to the daemon: too few of one would mean the load is not what it says.
        for kind in ["read", "write", "fsync", "rename"] {
            let n: u32 = landed.iter().filter(|(k, _)| k.starts_with(kind)).map(|(_, n)| n).sum();
            assert!(n > 0, "no kill landed during a {kind}: {landed:?}");
        }
    }
    // The lender was in the path (so a stale block would have been served from it).
    let out = farcache_testkit::run_bin(bin(), &["stats", "--server", &lender_addr, "--json"]);
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("lender stats");
    let hits = stats["hits"].as_u64().unwrap_or(0);
    eprintln!("lender hits across all daemons: {hits}");
    assert!(hits > 100, "the lender served almost nothing ({hits} hits): the test proves little");
    assert_eq!(fs::read(dir.backing().join("data")).unwrap(), model, "the backing file is not what was written");
    assert_eq!(fs::read(dir.backing().join("static")).unwrap(), pattern(STATIC_BLOCKS * BLOCK, 1));
    let log = sup.stop();
    assert!(log.contains("unanswered requests resent"), "{log}");
}

/// Every operation on names, killed at each point of its execution — intent recorded and
/// nothing done, done and its result not recorded, result recorded and the reply not
/// written — then resent by the kernel to the next daemon: the application sees it succeed
/// once, and the names are as one execution leaves them. Without the intent journal the
/// last two points answer `ENOENT` or `EEXIST`.
#[test]
fn operations_on_names_resent_after_a_crash_answer_as_done() {
    require_fuse();
    require_root("takeover tests (open_by_handle_at, mounting)");
    let dir = TestDir::new("resend");
    write_files(&dir.backing());
    let token = dir.0.join("fault");
    let ctl = dir.ctl();
    let args = [
        "--supervise",
        "--restart-limit",
        "100",
        "--restart-window",
        "1",
        "--no-remote",
        "--control-socket",
        ctl.to_str().unwrap(),
    ];
    let sup = MountProcess::try_start_env(
        bin(),
        &dir.backing(),
        &dir.mnt(),
        &args,
        &[("FARCACHE_FAULT_DIE", token.to_str().unwrap())],
        &dir.log("supervisor"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let _dog = Watchdog::start(&dir.mnt(), TEST_BOUND);
    let d = sup.m("ren");
    type Case = (&'static str, fn(&Path) -> std::io::Result<()>, fn(&Path) -> std::io::Result<()>, fn(&Path));
    let cases: [Case; 9] = [
        (
            "rename",
            |d| fs::write(d.join("src"), b"moved"),
            |d| fs::rename(d.join("src"), d.join("dst")),
            |d| {
                assert_eq!(fs::read(d.join("dst")).unwrap(), b"moved");
                assert!(!d.join("src").exists());
                fs::remove_file(d.join("dst")).unwrap();
            },
        ),
        (
            "rename",
            |d| fs::write(d.join("src"), b"moved").and_then(|()| fs::write(d.join("dst"), b"replaced")),
            |d| fs::rename(d.join("src"), d.join("dst")),
            |d| {
                assert_eq!(fs::read(d.join("dst")).unwrap(), b"moved");
                assert!(!d.join("src").exists());
                fs::remove_file(d.join("dst")).unwrap();
            },
        ),
        (
            "unlink",
            |d| fs::write(d.join("u"), b"u"),
            |d| fs::remove_file(d.join("u")),
            |d| assert!(!d.join("u").exists()),
        ),
        ("rmdir", |d| fs::create_dir(d.join("r")), |d| fs::remove_dir(d.join("r")), |d| assert!(!d.join("r").exists())),
        (
            "mkdir",
            |_| Ok(()),
            |d| fs::create_dir(d.join("m")),
            |d| {
                assert!(d.join("m").is_dir());
                fs::remove_dir(d.join("m")).unwrap();
            },
        ),
        (
            "create",
            |_| Ok(()),
            |d| OpenOptions::new().write(true).create_new(true).open(d.join("c"))?.write_all(b"created"),
            |d| {
                assert_eq!(fs::read(d.join("c")).unwrap(), b"created");
                fs::remove_file(d.join("c")).unwrap();
            },
        ),
        (
            "link",
            |d| fs::write(d.join("l1"), b"l"),
            |d| fs::hard_link(d.join("l1"), d.join("l2")),
            |d| {
                use std::os::unix::fs::MetadataExt;
                assert_eq!(fs::metadata(d.join("l1")).unwrap().ino(), fs::metadata(d.join("l2")).unwrap().ino());
                fs::remove_file(d.join("l1")).unwrap();
                fs::remove_file(d.join("l2")).unwrap();
            },
        ),
        (
            "symlink",
            |_| Ok(()),
            |d| std::os::unix::fs::symlink("target", d.join("s")),
            |d| {
                assert_eq!(fs::read_link(d.join("s")).unwrap(), Path::new("target"));
                fs::remove_file(d.join("s")).unwrap();
            },
        ),
        (
            "mknod",
            |_| Ok(()),
            |d| {
                let c = std::ffi::CString::new(d.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: mkfifo with a NUL-terminated path.
                match unsafe { libc::mkfifo(c.as_ptr(), 0o600) } {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            },
            |d| {
                use std::os::unix::fs::FileTypeExt;
                assert!(fs::symlink_metadata(d.join("fifo")).unwrap().file_type().is_fifo());
                fs::remove_file(d.join("fifo")).unwrap();
            },
        ),
    ];
    let mut daemon = daemon_of(&sup, None);
    for (op, setup, act, check) in cases {
        for point in ["begun", "ran", "done"] {
            let what = format!("{op} killed at {point}");
            setup(&d).unwrap_or_else(|e| panic!("{what}: setup: {e}"));
            fs::write(&token, format!("{op}:{point}")).unwrap();
            act(&d).unwrap_or_else(|e| panic!("{what}: the application saw {e}\n{}", sup.log_text()));
            assert!(!token.exists(), "{what}: the fault did not fire (the daemon did not die there)");
            let next = daemon_of(&sup, Some(daemon));
            assert!(wait_until(EVENT_WAIT, Duration::from_millis(2), || !alive(daemon)), "pid {daemon} lingers");
            daemon = next;
            check(&d);
            let left: Vec<_> = fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert!(left.is_empty(), "{what}: left behind {left:?}");
        }
    }
    sup.stop();
}

/// Start a plain daemon (no supervisor) for the tests of `--takeover` itself.
/// A supervised mount of `dir` with no lender, its control socket in `dir`.
fn supervised(dir: &TestDir) -> MountProcess {
    let ctl = dir.ctl();
    let args = ["--supervise", "--no-remote", "--control-socket", ctl.to_str().unwrap()];
    MountProcess::start(bin(), &dir.backing(), &dir.mnt(), &args, &dir.log("supervisor"))
}

fn plain(dir: &TestDir, extra: &[&str]) -> MountProcess {
    let ctl = dir.ctl();
    let mut args = vec!["--no-remote", "--control-socket", ctl.to_str().unwrap()];
    args.extend_from_slice(extra);
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    MountProcess::start(bin(), &dir.backing(), &dir.mnt(), &args, &dir.log("old"))
}

fn still_serves(m: &MountProcess, what: &str) {
    assert_eq!(
        fs::read(m.m("static")).unwrap_or_else(|e| panic!("{what}: reading through the mount: {e}")),
        pattern(STATIC_BLOCKS * BLOCK, 1),
        "{what}"
    );
}

/// A takeover refused — settings the kernel was promised differ, or another takeover
/// protocol — leaves the running daemon serving; then a takeover that matches replaces it,
/// files open across it keep working, and the new daemon unmounts cleanly on SIGTERM.
#[test]
fn refused_takeovers_leave_the_old_daemon_serving_and_a_matching_one_replaces_it() {
    require_fuse();
    require_root("takeover tests (open_by_handle_at, mounting)");
    let dir = TestDir::new("refuse");
    write_files(&dir.backing());
    let old = plain(&dir, &[]);
    let _dog = Watchdog::start(&dir.mnt(), TEST_BOUND);
    let held = File::open(old.m("static")).unwrap();
    let ctl = dir.ctl();
    let ctl_s = ctl.to_str().unwrap();

    // Another max_write: the kernel negotiated the old one at INIT.
    let cfg = dir.0.join("small-writes.toml");
    fs::write(&cfg, "[mount]\nmax_write = \"128KiB\"\n").unwrap();
    let e = MountProcess::try_takeover(
        bin(),
        &dir.backing(),
        &dir.mnt(),
        &["--no-remote", "--control-socket", ctl_s, "--config", cfg.to_str().unwrap()],
        &dir.log("refused"),
    )
    .err()
    .expect("a takeover with another max_write must be refused");
    assert!(e.contains("mount.max_write") && e.contains("fix:"), "{e}");
    still_serves(&old, "after a refused takeover (settings)");

    // Another remote tier.
    let e = MountProcess::try_takeover(
        bin(),
        &dir.backing(),
        &dir.mnt(),
        &["--control-socket", ctl_s],
        &dir.log("refused2"),
    )
    .err()
    .expect("a takeover with a remote tier must be refused by a --no-remote daemon");
    assert!(e.contains("remote_tier"), "{e}");
    still_serves(&old, "after a refused takeover (remote tier)");

    // Another takeover protocol, spoken raw on the control socket.
    let s = UnixStream::connect(&ctl).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (&s).write_all(b"{\"cmd\":\"takeover\",\"protocol\":999,\"version\":\"9.9.9\",\"pid\":1}\n").unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    assert!(line.contains("\"ok\":false") && line.contains("takeover protocol 999"), "{line}");
    still_serves(&old, "after a refused takeover (protocol)");
    assert!(alive(old.pid()));

    // A matching takeover: the old daemon exits 0, the mount stays, the held file reads on.
    let new = MountProcess::try_takeover(
        bin(),
        &dir.backing(),
        &dir.mnt(),
        &["--no-remote", "--control-socket", ctl_s],
        &dir.log("new"),
    )
    .unwrap_or_else(|e| panic!("{e}\nold daemon:\n{}", old.log_text()));
    old.release_mount();
    assert_eq!(old.wait_exit(), 0, "{}", old.log_text());
    assert!(fuse_mounted(&dir.mnt()));
    // Past the page cache: fsync reaches the daemon, and the read after dropping the pages.
    held.sync_all().unwrap_or_else(|e| panic!("fsync of a file opened before the takeover: {e}"));
    // SAFETY: plain syscall on an open descriptor.
    unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&held), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = vec![0u8; 3 * BLOCK];
    held.read_exact_at(&mut buf, 5 * BLOCK as u64).unwrap();
    assert_eq!(buf, pattern(STATIC_BLOCKS * BLOCK, 1)[5 * BLOCK..8 * BLOCK], "a file opened before the takeover");
    still_serves(&new, "after the takeover");
    drop(held);
    // The intent journal lives beside the control socket while the mount does, and goes
    // with a clean unmount.
    let journal = dir.0.join("ctl.sock.journal");
    assert!(journal.exists(), "no intent journal at {}", journal.display());
    new.stop();
    assert!(!journal.exists(), "the intent journal outlived a clean unmount");
}

/// Kills in the middle of an in-place upgrade (SIGHUP to the supervisor): at growing delays
/// after the new daemon starts, SIGKILL either the new daemon or the old one. Whatever the
/// phase — before the old one stopped, while it waited for the new one's confirmation,
/// after it left — one daemon serves afterwards and the load sees no error: the old one
/// serves on (the new one never confirmed), or the new one does, or the supervisor restarts
/// one from the descriptors it holds.
#[test]
fn a_kill_during_takeover_leaves_one_daemon_serving() {
    require_fuse();
    require_root("takeover tests (open_by_handle_at, mounting)");
    let dir = TestDir::new("midway");
    write_files(&dir.backing());
    let ctl = dir.ctl();
    let args = ["--supervise", "--restart-limit", "100", "--no-remote", "--control-socket", ctl.to_str().unwrap()];
    let sup = MountProcess::start(bin(), &dir.backing(), &dir.mnt(), &args, &dir.log("supervisor"));
    let _dog = Watchdog::start(&dir.mnt(), TEST_BOUND);
    let load = Load::start(&dir.mnt(), Instant::now() + TEST_BOUND);
    let mut daemon = daemon_of(&sup, None);
    for (i, delay_ms) in [0u64, 1, 3, 6, 10, 20, 40, 80].into_iter().enumerate() {
        std::thread::sleep(Duration::from_millis(150));
        sup.signal(libc::SIGHUP);
        let mut new = None;
        assert!(
            wait_until(EVENT_WAIT, Duration::from_millis(1), || {
                new = sup.children().into_iter().find(|p| *p != daemon);
                new.is_some()
            }),
            "no new daemon after SIGHUP:\n{}",
            sup.log_text()
        );
        std::thread::sleep(Duration::from_millis(delay_ms));
        let victim = if i % 2 == 0 { new.unwrap() } else { daemon };
        // SAFETY: kill(2) on a daemon the supervisor this test started runs.
        unsafe { libc::kill(victim as i32, libc::SIGKILL) };
        // Settle: one daemon, alive, serving.
        assert!(
            wait_until(EVENT_WAIT, Duration::from_millis(10), || {
                let c = sup.children();
                c.len() == 1 && !c.contains(&victim)
            }),
            "not back to one daemon after killing pid {victim} at {delay_ms} ms (children {:?}):\n{}",
            sup.children(),
            sup.log_text()
        );
        daemon = sup.children()[0];
        still_serves(&sup, &format!("after killing pid {victim} {delay_ms} ms into a takeover"));
    }
    let (errors, ops, longest, _) = load.finish();
    eprintln!("kills during takeovers: {ops} operations, longest {longest:?} (noisy)");
    assert!(errors.is_empty(), "the load saw errors:\n{}\n{}", errors.join("\n"), sup.log_text());
    sup.stop();
}

/// Repeated crashes end in a clear failure, not a loop: with `--restart-limit 2`, the third
/// crash within the window makes the supervisor give up, say why and what to do, detach the
/// mount (no dead mount point left behind) and exit 1.
#[test]
fn repeated_crashes_end_in_a_clear_failure() {
    require_fuse();
    require_root("takeover tests (open_by_handle_at, mounting)");
    let dir = TestDir::new("giveup");
    write_files(&dir.backing());
    let ctl = dir.ctl();
    let args = ["--supervise", "--restart-limit", "2", "--no-remote", "--control-socket", ctl.to_str().unwrap()];
    let sup = MountProcess::start(bin(), &dir.backing(), &dir.mnt(), &args, &dir.log("supervisor"));
    let _dog = Watchdog::start(&dir.mnt(), TEST_BOUND);
    let mut daemon = daemon_of(&sup, None);
    for _ in 0..2 {
        // SAFETY: kill(2) on the supervisor's child.
        unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
        daemon = daemon_of(&sup, Some(daemon));
        still_serves(&sup, "after a crash within the limit");
    }
    // SAFETY: as above.
    unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
    let code = sup.wait_exit();
    let log = sup.log_text();
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("crashed 3 times") && log.contains("gave up") && log.contains("fix:"), "{log}");
    assert!(!fuse_mounted(&dir.mnt()), "a dead mount was left behind:\n{log}");
}

/// Memory a process holds locked (`VmLck` of /proc/PID/status), in KiB.
fn locked_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Serving threads (`fuser-N`) of a process.
fn serving_threads(pid: u32) -> u64 {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).map(|r| r.flatten().collect::<Vec<_>>()).unwrap_or_default();
    tasks.iter().filter(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("fuser-"))).count()
        as u64
}

/// A SIGKILL of a supervised daemon while the kernel copied a request into a page of its
/// request buffer not yet present was an `EIO` to the application, made by the kernel
/// (`fuse_dev_do_read`: faulting the page in fails with a fatal signal pending): the load
/// test's O_DIRECT writes saw it about one run in four on a busy machine. So every daemon
/// of a supervised mount — the first, one restarted after a crash, one upgraded in place —
/// faults in and locks each serving thread's buffer (as much as the largest request, 1 MiB
/// and headers here) before it reads; a plain mount, whose death ends it anyway, does not
/// pay that memory.
#[test]
fn supervised_daemons_fault_their_request_buffers_in_before_serving() {
    require_fuse();
    require_root("takeover tests (open_by_handle_at, mounting)");
    let dir = TestDir::new("prefault");
    write_files(&dir.backing());
    let sup = supervised(&dir);
    let _dog = Watchdog::start(&dir.mnt(), TEST_BOUND);
    let check = |pid: u32, what: &str| {
        served(&dir.mnt());
        // Each thread's buffer: max_write (1 MiB) + 4 KiB, locked before its first read.
        let ok = wait_until(EVENT_WAIT, Duration::from_millis(10), || {
            let n = serving_threads(pid);
            n > 1 && locked_kib(pid) >= n * 1028
        });
        assert!(
            ok,
            "{what}: daemon {pid} has {} KiB locked for {} serving threads (want 1028 KiB each)\n{}",
            locked_kib(pid),
            serving_threads(pid),
            sup.log_text()
        );
        still_serves(&sup, what);
    };
    let daemon = daemon_of(&sup, None);
    check(daemon, "the first daemon");
    // SAFETY: kill(2) on the supervisor's child, a process this test started.
    unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
    let daemon = daemon_of(&sup, Some(daemon));
    check(daemon, "a daemon restarted after a crash");
    sup.signal(libc::SIGHUP);
    let daemon = daemon_of(&sup, Some(daemon));
    check(daemon, "a daemon upgraded in place");
    sup.stop();

    let m = plain(&dir, &[]);
    still_serves(&m, "a plain mount");
    assert!(serving_threads(m.pid()) > 1);
    assert_eq!(locked_kib(m.pid()), 0, "a plain mount's daemon locked memory");
    m.stop();
}

/// A file unlinked through the mount while a process holds it open stays readable across a
/// crash and an upgrade (the supervisor keeps its inode), and its inode number is not handed
/// to a new file meanwhile — after a crash node ids are resolved by number.
#[test]
fn an_open_unlinked_file_survives_a_crash_and_an_upgrade() {
    require_fuse();
    require_root("takeover tests (open_by_handle_at, mounting)");
    let dir = TestDir::new("unlinked");
    write_files(&dir.backing());
    let sup = supervised(&dir);
    let _dog = Watchdog::start(&dir.mnt(), TEST_BOUND);
    let body = pattern(8 * BLOCK, 9);
    fs::write(sup.m("doomed"), &body).unwrap();
    let held = File::open(sup.m("doomed")).unwrap();
    let ino = std::os::unix::fs::MetadataExt::ino(&held.metadata().unwrap());
    fs::remove_file(sup.m("doomed")).unwrap();
    let read_all = |what: &str| {
        // Past the page cache: fsync reaches the daemon, and so does the read once the
        // cached pages are dropped.
        held.sync_all().unwrap_or_else(|e| panic!("{what}: fsync: {e}\n{}", sup.log_text()));
        // SAFETY: plain syscall on an open descriptor.
        unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&held), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let mut got = vec![0u8; body.len()];
        held.read_exact_at(&mut got, 0).unwrap_or_else(|e| panic!("{what}: {e}\n{}", sup.log_text()));
        assert!(got == body, "{what}: wrong bytes");
    };
    read_all("before any event");
    let daemon = daemon_of(&sup, None);
    // SAFETY: kill(2) on the supervisor's child.
    unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
    let daemon = daemon_of(&sup, Some(daemon));
    // New files while the old number would be free if nobody kept it (ext4 reuses freed
    // numbers soon): none may get it.
    for i in 0..64 {
        fs::write(sup.m(&format!("new{i}")), b"x").unwrap();
        let n = std::os::unix::fs::MetadataExt::ino(&fs::metadata(sup.b(&format!("new{i}"))).unwrap());
        assert_ne!(n, ino, "inode number {ino} was reused while the kernel still knew it");
    }
    read_all("after a crash");
    sup.signal(libc::SIGHUP);
    let daemon = daemon_of(&sup, Some(daemon));
    read_all("after an upgrade");
    // A takeover from outside the supervisor would leave it without the mount: refused.
    let e = MountProcess::try_takeover(
        bin(),
        &dir.backing(),
        &dir.mnt(),
        &["--no-remote", "--control-socket", dir.ctl().to_str().unwrap()],
        &dir.log("outsider"),
    )
    .err()
    .expect("a takeover of a supervised mount from outside must be refused");
    assert!(e.contains("supervisor") && e.contains("kill -HUP"), "{e}");
    assert_eq!(sup.children(), vec![daemon]);
    read_all("after a refused outside takeover");
    drop(held);
    sup.stop();
}

/// Unmounts a file system mounted by a test, also when it fails.
struct Submount(PathBuf);

impl Drop for Submount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Inodes on another file system inside the backing directory have synthetic node ids that
/// no file handle on the backing root resolves: their descriptors travel with an upgrade,
/// so a file there, open across the takeover, reads on, and its directory is still listed.
#[test]
fn inodes_on_a_file_system_inside_the_backing_directory_survive_an_upgrade() {
    require_fuse();
    require_root("takeover tests (open_by_handle_at, mounting)");
    let dir = TestDir::new("submount");
    write_files(&dir.backing());
    let sub = dir.backing().join("sub");
    fs::create_dir(&sub).unwrap();
    let st =
        std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=4m", "farcache-test"]).arg(&sub).status();
    assert!(st.is_ok_and(|s| s.success()), "mount -t tmpfs on {}", sub.display());
    let _sub = Submount(sub.clone());
    let old = plain(&dir, &[]);
    let _dog = Watchdog::start(&dir.mnt(), TEST_BOUND);
    let body = pattern(3 * BLOCK, 21);
    fs::write(old.m("sub/f"), &body).unwrap();
    let held = File::open(old.m("sub/f")).unwrap();
    let ino = std::os::unix::fs::MetadataExt::ino(&held.metadata().unwrap());
    assert!(ino >= 1 << 63, "expected a synthetic node id for an inode on the tmpfs, got {ino}");
    let ctl = dir.ctl();
    let new = MountProcess::try_takeover(
        bin(),
        &dir.backing(),
        &dir.mnt(),
        &["--no-remote", "--control-socket", ctl.to_str().unwrap()],
        &dir.log("new"),
    )
    .unwrap_or_else(|e| panic!("{e}\nold daemon:\n{}", old.log_text()));
    old.release_mount();
    assert_eq!(old.wait_exit(), 0, "{}", old.log_text());
    // fsync reaches the daemon whatever the page cache holds; then the cached pages are
    // dropped so that the read does too.
    held.sync_all().unwrap_or_else(|e| panic!("fsync of the held file after the upgrade: {e}\n{}", new.log_text()));
    // SAFETY: plain syscall on an open descriptor.
    unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&held), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut got = vec![0u8; body.len()];
    held.read_exact_at(&mut got, 0)
        .unwrap_or_else(|e| panic!("the held file after the upgrade: {e}\n{}", new.log_text()));
    assert!(got == body, "wrong bytes after the upgrade");
    let names: Vec<String> =
        fs::read_dir(new.m("sub")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, ["f"]);
    drop(held);
    new.stop();
}

/// A mount with a write-back tier is upgraded in place: a takeover naming another tier is
/// refused before anything is handed over; one naming the same tier gets the connection, the
/// running daemon stops destaging and exits, and the new one takes the tier over (recovering
/// what it held, never written to the disk) while requests wait; what the tier held reads
/// back, writes go on, and a clean unmount of the new daemon puts everything on the backing.
#[test]
fn a_mount_with_a_write_back_tier_is_upgraded_in_place_and_keeps_what_the_tier_held() {
    require_fuse();
    require_root("takeover tests (open_by_handle_at, mounting)");
    let dir = TestDir::new("tier");
    write_files(&dir.backing());
    let tier = TierFile::new("takeover");
    let other = TierFile::new("takeover-other");
    // Nothing is destaged while the test looks (no idle write-back, a long dirty age).
    let conf = dir.0.join("farcache.toml");
    fs::write(&conf, "[tier]\nidle_destage_after = \"0s\"\nmax_dirty_age = \"10m\"\n").unwrap();
    let (t, conf) = (tier.arg().to_string(), conf.display().to_string());
    let ctl = dir.ctl();
    let args = |tier: &str| -> Vec<String> {
        ["--no-remote", "--control-socket", ctl.to_str().unwrap(), "--tier", tier, "--tier-size", "64MiB", "--config"]
            .iter()
            .map(|s| s.to_string())
            .chain([conf.clone()])
            .collect()
    };
    let strs = |v: &[String]| v.iter().map(String::to_string).collect::<Vec<String>>();
    let old_args = strs(&args(&t));
    let old = MountProcess::start(
        bin(),
        &dir.backing(),
        &dir.mnt(),
        &old_args.iter().map(String::as_str).collect::<Vec<_>>(),
        &dir.log("old"),
    );
    let _dog = Watchdog::start(&dir.mnt(), TEST_BOUND);
    let held = pattern(64 * BLOCK, 21);
    {
        let mut f = File::create(old.m("fresh")).unwrap();
        f.write_all(&held).unwrap();
        f.sync_all().unwrap();
    }
    let on_disk = |what: &str| {
        let b = fs::read(dir.backing().join("fresh")).unwrap_or_default();
        assert!(b != held, "{what}: the backing file already has the tier's data: nothing was left to hand over");
    };
    on_disk("before the takeover");

    let other_args = strs(&args(other.arg()));
    let e = MountProcess::try_takeover(
        bin(),
        &dir.backing(),
        &dir.mnt(),
        &other_args.iter().map(String::as_str).collect::<Vec<_>>(),
        &dir.log("other-tier"),
    )
    .err()
    .expect("a takeover naming another tier must be refused");
    // Refused by the backing's marker (its tier is dirty) before the running daemon is asked.
    assert!(e.contains("belongs to the write-back tier") && e.contains(other.arg()), "{e}");
    still_serves(&old, "after a takeover naming another tier was refused");

    let new = MountProcess::try_takeover(
        bin(),
        &dir.backing(),
        &dir.mnt(),
        &old_args.iter().map(String::as_str).collect::<Vec<_>>(),
        &dir.log("new"),
    )
    .unwrap_or_else(|e| panic!("{e}\nold daemon's log:\n{}", old.log_text()));
    assert!(old.wait_exit_timeout(Duration::from_secs(10)).is_some(), "the old daemon did not exit after handing over");
    let log = new.log_text();
    assert!(log.contains("took the write-back tier over"), "{log}");
    let recovered = log
        .split("recovered ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("the new daemon's log names no recovery:\n{log}"));
    assert!(recovered > 0, "the new daemon recovered no record from the tier:\n{log}");
    // Past the page cache: what the application reads now comes from the new daemon.
    let blocks: Vec<u64> = (0..(held.len() / BLOCK) as u64).collect();
    DirectReader::open(&new.m("fresh")).pass(&blocks, &held);
    still_serves(&new, "after the takeover");
    let later = pattern(16 * BLOCK, 22);
    fs::write(new.m("later"), &later).unwrap();
    new.stop();
    assert_eq!(fs::read(dir.backing().join("fresh")).unwrap(), held, "after a clean unmount");
    assert_eq!(fs::read(dir.backing().join("later")).unwrap(), later, "after a clean unmount");
}

/// Under `--supervise` with a write-back tier: a crashed daemon's successor recovers the
/// tier (what it held, never on the disk, reads back), an upgrade (SIGHUP) hands it over,
/// writes go on across both, and stopping the supervisor destages everything.
#[test]
fn a_supervised_mount_with_a_write_back_tier_survives_a_crash_and_an_upgrade() {
    require_fuse();
    require_root("takeover tests (open_by_handle_at, mounting)");
    let dir = TestDir::new("tier-sup");
    write_files(&dir.backing());
    let tier = TierFile::new("takeover-sup");
    let conf = dir.0.join("farcache.toml");
    fs::write(&conf, "[tier]\nidle_destage_after = \"0s\"\nmax_dirty_age = \"10m\"\n").unwrap();
    let (t, conf, ctl) = (tier.arg().to_string(), conf.display().to_string(), dir.ctl().display().to_string());
    let args = [
        "--supervise",
        "--no-remote",
        "--control-socket",
        &ctl,
        "--tier",
        &t,
        "--tier-size",
        "64MiB",
        "--config",
        &conf,
    ];
    let sup = MountProcess::start(bin(), &dir.backing(), &dir.mnt(), &args, &dir.log("supervisor"));
    let _dog = Watchdog::start(&dir.mnt(), TEST_BOUND);
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut write = |name: &str, seed: u64| {
        let body = pattern(32 * BLOCK, seed);
        let mut f = File::create(sup.m(name)).unwrap_or_else(|e| panic!("create {name}: {e}\n{}", sup.log_text()));
        f.write_all(&body).unwrap();
        f.sync_all().unwrap();
        assert!(fs::read(sup.b(name)).unwrap_or_default() != body, "{name} reached the disk: nothing left in the tier");
        files.push((name.to_string(), body));
        files.clone()
    };
    let check = |files: &[(String, Vec<u8>)], what: &str| {
        for (name, body) in files {
            let blocks: Vec<u64> = (0..(body.len() / BLOCK) as u64).collect();
            DirectReader::open(&sup.m(name)).pass(&blocks, body);
        }
        still_serves(&sup, what);
    };
    let daemon = daemon_of(&sup, None);
    let now = write("before-crash", 31);
    // SAFETY: kill(2) on the supervisor's child.
    unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
    let daemon = daemon_of(&sup, Some(daemon));
    check(&now, "after a crash");
    let now = write("before-upgrade", 32);
    sup.signal(libc::SIGHUP);
    let _ = daemon_of(&sup, Some(daemon));
    check(&now, "after an upgrade");
    let now = write("after-upgrade", 33);
    let log = sup.stop();
    for (name, body) in &now {
        assert!(fs::read(dir.backing().join(name)).unwrap() == *body, "{name} after stopping the supervisor:\n{log}");
    }
}
