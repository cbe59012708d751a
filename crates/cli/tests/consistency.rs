//! The consistency checker: writers and readers run at once on a real `farcache mount` backed
//! by real lender processes, while the lenders are killed (SIGKILL), restarted on the same
//! address, hung (SIGSTOP) and continued, added and removed mid-run (`farcache lenders
//! --add/--remove`), or started after the mount that names them. Every 4 KiB block carries who it
//! is and which version of it was written (file, block, version, a pattern derived from those
//! and a checksum), so every read can be decoded and judged on its own:
//!
//! - it must decode cleanly: a read of another block (*foreign*), a mix of two writes (*torn*)
//!   or anything else (*garbage*) fails the test;
//! - its version must be at least the latest *acknowledged* version of that block when the
//!   read began (the version whose `pwrite` had returned: anything older is *stale*) and at
//!   most the highest version *started* when the read ended (anything newer was never
//!   written);
//! - no read or write may fail, and none may take longer than [`MAX_LATENCY`] (a hung lender
//!   costs a miss within the fetch timeout, never a stall).
//!
//! Each block has one writer (blocks are dealt to writers), so its versions reach the disk in
//! order and the two bounds above are exact. Reads use `O_DIRECT` 4 KiB-aligned buffers, so
//! every read reaches the daemon (the kernel page cache above the mount would otherwise
//! answer most of them). The scenarios also prove that caching really happened — the lenders'
//! own STATS must show hits before and after each fault — so the checker cannot pass
//! vacuously with the remote tier broken.
//!
//! After the run every block is read once more through the mount (it must be exactly its last
//! acknowledged version) and, once unmounted, straight from the backing file.
//!
//! The scenarios run one at a time (a lock), so that on a two-core machine their timing
//! bounds are not shared with another scenario's daemons.

use std::fs::{self, File, OpenOptions};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use farcache_testkit::{
    require_fuse, require_root, run_with_timeout, wait_until, AlignedBuf, MountProcess, Rng, ServerProcess,
    LENDERS_FIRST,
};

/// Files checked, and 4 KiB blocks in each (1 MiB files: 4 index chunks of 64 blocks).
const FILES: usize = 4;
const BLOCKS_PER_FILE: usize = 256;
const BLOCK: usize = 4096;
const BLOCKS: usize = FILES * BLOCKS_PER_FILE;
/// The first chunk of each file is *hot*: most writes land there, so reads there race with
/// writes all the time. The rest is written rarely, so it stays on the lenders and hits.
const HOT_BLOCKS: usize = 64;
const WRITERS: usize = 2;
const READERS: usize = 2;
/// A writer's pause between writes: keeps invalidations from emptying the cache.
const WRITE_PAUSE: Duration = Duration::from_millis(2);
/// In a thousand writes, how many go to the cold part of a file.
const COLD_WRITES_PER_MILLE: u64 = 20;
/// The first blocks of each file are *contended*: a good share of the writes and of the
/// single-block reads go there, so that a read and a write of the very same block often
/// overlap (a fill racing a write is where a cache goes stale).
const CONTENDED_BLOCKS: usize = 4;
const CONTENDED_WRITES_PER_MILLE: u64 = 500;
const CONTENDED_READS_PERCENT: u64 = 50;
/// The slowest read or write allowed, faults included (the fetch timeout is 50 ms).
const MAX_LATENCY: Duration = Duration::from_secs(2);
/// A scenario's body runs under this bound; past it the daemon is killed and the test fails.
const SCENARIO_BOUND: Duration = Duration::from_secs(100);
/// How long a lender may take to show the hits a scenario waits for.
const HIT_WAIT: Duration = Duration::from_secs(20);
/// Violations and errors kept in full for the failure message (all are counted).
const KEEP: usize = 20;

static SERIAL: Mutex<()> = Mutex::new(());

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

// ---------------------------------------------------------------------------------------
// Block contents.

const MAGIC: u64 = u64::from_le_bytes(*b"FCCHECK1");
const WORDS: usize = BLOCK / 8;

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn checksum(words: &[u64]) -> u64 {
    words.iter().fold(0x6A09_E667_F3BC_C908, |h, w| mix(h.rotate_left(7) ^ w))
}

/// The 4 KiB image of `version` of block `block` of file `file`: a header (magic, file and
/// block, version), a pattern seeded by all three, and a checksum over the rest.
fn encode(out: &mut [u8], file: usize, block: usize, version: u64) {
    assert_eq!(out.len(), BLOCK);
    let mut w = [0u64; WORDS];
    w[0] = MAGIC;
    w[1] = ((file as u64) << 32) | block as u64;
    w[2] = version;
    let mut x = mix(w[1] ^ mix(version) ^ 0x5EED) | 1;
    for v in &mut w[3..WORDS - 1] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *v = x;
    }
    w[WORDS - 1] = checksum(&w[..WORDS - 1]);
    for (o, v) in out.chunks_exact_mut(8).zip(w) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// What a 4 KiB read held.
#[derive(Debug, PartialEq, Eq)]
enum Decoded {
    /// A whole, intact block image.
    Block { file: usize, block: usize, version: u64 },
    /// The header names a block, but the rest does not match it: a mix of writes, or damage.
    Torn { file: usize, block: usize, version: u64, bad_sectors: Vec<usize> },
    /// Not a block image at all (zeros, another file's bytes...).
    Garbage { first_words: [u64; 3] },
}

fn decode(data: &[u8]) -> Decoded {
    assert_eq!(data.len(), BLOCK);
    let word = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
    if word(0) != MAGIC {
        return Decoded::Garbage { first_words: [word(0), word(1), word(2)] };
    }
    let (file, block, version) = ((word(1) >> 32) as usize, (word(1) & 0xFFFF_FFFF) as usize, word(2));
    if file >= FILES || block >= BLOCKS_PER_FILE {
        return Decoded::Garbage { first_words: [word(0), word(1), word(2)] };
    }
    let mut want = vec![0u8; BLOCK];
    encode(&mut want, file, block, version);
    if want != data {
        let bad_sectors = (0..BLOCK / 512).filter(|&s| want[s * 512..(s + 1) * 512] != data[s * 512..(s + 1) * 512]);
        return Decoded::Torn { file, block, version, bad_sectors: bad_sectors.collect() };
    }
    Decoded::Block { file, block, version }
}

// ---------------------------------------------------------------------------------------
// Shared state of one run.

/// Per block: the latest acknowledged version and the highest started one.
struct Versions {
    acked: AtomicU64,
    started: AtomicU64,
}

/// Phases a scenario goes through; reads and latencies are counted per phase.
const MAX_PHASES: usize = 8;

struct State {
    blocks: Vec<Versions>,
    stop: AtomicBool,
    phase: AtomicUsize,
    phase_names: Mutex<Vec<&'static str>>,
    phase_reads: Vec<AtomicU64>,
    phase_max_read_us: Vec<AtomicU64>,
    reads: AtomicU64,
    blocks_checked: AtomicU64,
    writes: AtomicU64,
    max_read_us: AtomicU64,
    max_write_us: AtomicU64,
    violations: AtomicU64,
    errors: AtomicU64,
    /// The first [`KEEP`] violations and errors, in words.
    notes: Mutex<Vec<String>>,
    t0: Instant,
}

impl State {
    fn new() -> State {
        State {
            blocks: (0..BLOCKS).map(|_| Versions { acked: AtomicU64::new(0), started: AtomicU64::new(0) }).collect(),
            stop: AtomicBool::new(false),
            phase: AtomicUsize::new(0),
            phase_names: Mutex::new(vec!["start"]),
            phase_reads: (0..MAX_PHASES).map(|_| AtomicU64::new(0)).collect(),
            phase_max_read_us: (0..MAX_PHASES).map(|_| AtomicU64::new(0)).collect(),
            reads: AtomicU64::new(0),
            blocks_checked: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            max_read_us: AtomicU64::new(0),
            max_write_us: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            notes: Mutex::new(Vec::new()),
            t0: Instant::now(),
        }
    }

    fn note(&self, counter: &AtomicU64, what: String) {
        counter.fetch_add(1, Ordering::SeqCst);
        let mut n = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        if n.len() < KEEP {
            let phase = self.phase_name(self.phase.load(Ordering::SeqCst));
            n.push(format!("[{:.3}s, {phase}] {what}", self.t0.elapsed().as_secs_f64()));
        }
    }

    fn phase_name(&self, i: usize) -> &'static str {
        self.phase_names.lock().unwrap_or_else(|e| e.into_inner()).get(i).copied().unwrap_or("?")
    }

    /// Enter a new phase; returns its number.
    fn enter(&self, name: &'static str) -> usize {
        let mut names = self.phase_names.lock().unwrap_or_else(|e| e.into_inner());
        assert!(names.len() < MAX_PHASES, "too many phases");
        names.push(name);
        let i = names.len() - 1;
        self.phase.store(i, Ordering::SeqCst);
        eprintln!("[{:.3}s] phase {name}", self.t0.elapsed().as_secs_f64());
        i
    }

    fn reads_in(&self, phase: usize) -> u64 {
        self.phase_reads[phase].load(Ordering::SeqCst)
    }

    fn max_read_in(&self, phase: usize) -> Duration {
        Duration::from_micros(self.phase_max_read_us[phase].load(Ordering::SeqCst))
    }

    fn summary(&self) -> String {
        let names = self.phase_names.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let phases: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{n}: {} reads, max {:?}", self.reads_in(i), self.max_read_in(i)))
            .collect();
        format!(
            "{} reads ({} blocks checked), {} writes in {:.1}s; max read {:?}, max write {:?}; \
             {} violations, {} I/O errors; phases: {}",
            self.reads.load(Ordering::SeqCst),
            self.blocks_checked.load(Ordering::SeqCst),
            self.writes.load(Ordering::SeqCst),
            self.t0.elapsed().as_secs_f64(),
            Duration::from_micros(self.max_read_us.load(Ordering::SeqCst)),
            Duration::from_micros(self.max_write_us.load(Ordering::SeqCst)),
            self.violations.load(Ordering::SeqCst),
            self.errors.load(Ordering::SeqCst),
            phases.join("; ")
        )
    }

    fn notes(&self) -> String {
        self.notes.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
    }
}

fn open_files(mnt: &Path, write: bool, direct: bool) -> std::io::Result<Vec<File>> {
    (0..FILES)
        .map(|f| {
            let mut o = OpenOptions::new();
            o.read(!write).write(write);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(mnt.join(file_name(f)))
        })
        .collect()
}

fn file_name(f: usize) -> String {
    format!("f{f}")
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

/// A writer: blocks `i` with `i % WRITERS == w` are its own. Writer 0 writes with `O_DIRECT`,
/// the others through the kernel page cache (write-through to the daemon either way).
fn writer(st: &State, mnt: &Path, w: usize, seed: u64) {
    let files = match open_files(mnt, true, w == 0) {
        Ok(f) => f,
        Err(e) => return st.note(&st.errors, format!("writer {w}: open: {e}")),
    };
    let mut rng = Rng::new(seed);
    let mut buf = AlignedBuf::new(BLOCK);
    // Bounded by the stop flag, which the scenario sets within its bound (or the watchdog).
    while !st.stop.load(Ordering::SeqCst) {
        let file = rng.below(FILES as u64) as usize;
        let (lo, hi) = match rng.below(1000) {
            x if x < COLD_WRITES_PER_MILLE => (HOT_BLOCKS, BLOCKS_PER_FILE),
            x if x < COLD_WRITES_PER_MILLE + CONTENDED_WRITES_PER_MILLE => (0, CONTENDED_BLOCKS),
            _ => (0, HOT_BLOCKS),
        };
        // A block of this writer's share in lo..hi.
        let mut block = lo + rng.below((hi - lo) as u64) as usize;
        while (file * BLOCKS_PER_FILE + block) % WRITERS != w {
            block += 1;
            if block >= hi {
                block = lo;
            }
        }
        let v = &st.blocks[file * BLOCKS_PER_FILE + block];
        let version = v.started.load(Ordering::SeqCst) + 1;
        v.started.store(version, Ordering::SeqCst);
        let data = buf.get(BLOCK);
        encode(data, file, block, version);
        let t = Instant::now();
        let r = files[file].write_at(data, (block * BLOCK) as u64);
        let took = t.elapsed();
        st.max_write_us.fetch_max(micros(took), Ordering::SeqCst);
        match r {
            Ok(n) if n == BLOCK => {
                v.acked.store(version, Ordering::SeqCst);
                st.writes.fetch_add(1, Ordering::SeqCst);
            }
            Ok(n) => st.note(&st.errors, format!("write f{file} block {block} v{version}: short write {n}")),
            Err(e) => st.note(&st.errors, format!("write f{file} block {block} v{version}: {e}")),
        }
        if took > MAX_LATENCY {
            st.note(&st.violations, format!("write f{file} block {block} took {took:?}"));
        }
        std::thread::sleep(WRITE_PAUSE);
    }
}

/// A reader: random reads of 1 to 4 blocks (the remote path), now and then 32 blocks (the
/// sequential bypass), many of them in the contended blocks and the hot part of a file;
/// every block is judged.
fn reader(st: &State, mnt: &Path, r: usize, seed: u64) {
    let files = match open_files(mnt, false, true) {
        Ok(f) => f,
        Err(e) => return st.note(&st.errors, format!("reader {r}: open: {e}")),
    };
    let mut rng = Rng::new(seed);
    let mut buf = AlignedBuf::new(32 * BLOCK);
    let mut low = vec![0u64; 32];
    // Bounded by the stop flag.
    while !st.stop.load(Ordering::SeqCst) {
        let file = rng.below(FILES as u64) as usize;
        let n = match rng.below(100) {
            0..=1 => 32,
            2..=21 => 2 + rng.below(3) as usize,
            _ => 1,
        };
        let first = match rng.below(100) {
            x if x < CONTENDED_READS_PERCENT && n == 1 => rng.below(CONTENDED_BLOCKS as u64) as usize,
            x if x < 50 && n < HOT_BLOCKS => rng.below((HOT_BLOCKS - n + 1) as u64) as usize,
            _ => rng.below((BLOCKS_PER_FILE - n + 1) as u64) as usize,
        };
        let base = file * BLOCKS_PER_FILE + first;
        // The versions acknowledged before the read begins: the least it may return.
        for (l, v) in low.iter_mut().zip(&st.blocks[base..base + n]) {
            *l = v.acked.load(Ordering::SeqCst);
        }
        let phase_start = st.phase.load(Ordering::SeqCst);
        let t = Instant::now();
        let data = buf.get(n * BLOCK);
        let res = files[file].read_at(data, (first * BLOCK) as u64);
        let took = t.elapsed();
        let phase_end = st.phase.load(Ordering::SeqCst);
        let what = || format!("read f{file} blocks {first}..{}", first + n);
        match res {
            Ok(got) if got == n * BLOCK => {}
            Ok(got) => {
                st.note(&st.errors, format!("{}: short read of {got} bytes", what()));
                continue;
            }
            Err(e) => {
                st.note(&st.errors, format!("{}: {e}", what()));
                continue;
            }
        }
        for i in 0..n {
            let (block, v) = (first + i, &st.blocks[base + i]);
            let high = v.started.load(Ordering::SeqCst);
            let at = || format!("f{file} block {block} ({}, took {took:?})", what());
            match decode(&data[i * BLOCK..(i + 1) * BLOCK]) {
                Decoded::Block { file: f, block: b, version } if (f, b) == (file, block) => {
                    if version < low[i] {
                        st.note(
                            &st.violations,
                            format!("STALE {}: version {version}, but {} was acknowledged before", at(), low[i]),
                        );
                    } else if version > high {
                        st.note(&st.violations, format!("FUTURE {}: version {version}, highest started {high}", at()));
                    }
                }
                Decoded::Block { file: f, block: b, version } => {
                    st.note(&st.violations, format!("FOREIGN {}: holds f{f} block {b} version {version}", at()))
                }
                Decoded::Torn { file: f, block: b, version, bad_sectors } => st.note(
                    &st.violations,
                    format!("TORN {}: header f{f} block {b} v{version}, 512-byte sectors {bad_sectors:?} differ", at()),
                ),
                Decoded::Garbage { first_words } => {
                    st.note(&st.violations, format!("GARBAGE {}: first words {first_words:x?}", at()))
                }
            }
        }
        st.reads.fetch_add(1, Ordering::SeqCst);
        st.blocks_checked.fetch_add(n as u64, Ordering::SeqCst);
        st.phase_reads[phase_end].fetch_add(1, Ordering::SeqCst);
        st.max_read_us.fetch_max(micros(took), Ordering::SeqCst);
        st.phase_max_read_us[phase_start].fetch_max(micros(took), Ordering::SeqCst);
        st.phase_max_read_us[phase_end].fetch_max(micros(took), Ordering::SeqCst);
        if took > MAX_LATENCY {
            st.note(&st.violations, format!("SLOW {}: took {took:?}", what()));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Processes and counters.

/// What a lender's own STATS say (`farcache stats --server ADDR --json`, all tenants).
#[derive(Clone, Copy, Debug)]
struct LenderStats {
    hits: u64,
    blocks: u64,
    instance_id: u64,
}

/// `cmd`'s stdout as JSON, or `None` if it fails or takes more than a few seconds.
fn json_of(cmd: Command) -> Option<serde_json::Value> {
    let out = run_with_timeout(cmd, Duration::from_secs(10)).ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The lender's STATS, or `None` if it does not answer (dead, stopped).
fn lender_stats(addr: SocketAddr) -> Option<LenderStats> {
    let mut cmd = Command::new(bin());
    cmd.args(["stats", "--server", &addr.to_string(), "--json"]);
    let v = json_of(cmd)?;
    Some(LenderStats {
        hits: v["hits"].as_u64()?,
        blocks: v["blocks"].as_u64()?,
        instance_id: v["instance_id"].as_u64()?,
    })
}

/// The mount's own counters (`farcache stats MNT --json`).
fn mount_stats(mnt: &Path) -> serde_json::Value {
    let mut cmd = Command::new(bin());
    cmd.arg("stats").arg(mnt).arg("--json");
    json_of(cmd).unwrap_or_else(|| panic!("`farcache stats {} --json` failed", mnt.display()))
}

/// The mount's view of the lender at `addr` (`farcache stats MNT --json`, `lenders`).
fn mount_lender(stats: &serde_json::Value, addr: SocketAddr) -> Option<serde_json::Value> {
    stats["lenders"].as_array()?.iter().find(|l| l["addr"].as_str() == Some(&addr.to_string())).cloned()
}

fn counter(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_u64().unwrap_or_else(|| panic!("no counter {} in {v}", path.join(".")))
}

/// Wait until the lender at `addr` has served at least `hits` hits and holds at least
/// `blocks` blocks; panics with what it saw if it does not within [`HIT_WAIT`].
fn wait_for_lender(st: &State, addr: SocketAddr, hits: u64, blocks: u64, what: &str) -> LenderStats {
    let mut seen = None;
    let ok = wait_until(HIT_WAIT, Duration::from_millis(200), || {
        seen = lender_stats(addr);
        seen.is_some_and(|s| s.hits >= hits && s.blocks >= blocks) || st.stop.load(Ordering::SeqCst)
    });
    assert!(
        ok && !st.stop.load(Ordering::SeqCst),
        "{what}: lender {addr} should reach {hits} hits and {blocks} blocks within {HIT_WAIT:?}; \
         it shows {seen:?}\n{}\n{}",
        st.summary(),
        st.notes()
    );
    let s = seen.expect("checked");
    eprintln!("[{:.3}s] {what}: lender {addr}: {s:?}", st.t0.elapsed().as_secs_f64());
    s
}

/// An address on the loopback interface that nothing listens on now, below the ephemeral
/// port range so that no outgoing connection is given its port in the meantime.
fn unused_addr() -> SocketAddr {
    let range = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let low: u16 = range.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(32768);
    let (from, to) = if low > 12000 { (10000u16, low - 1) } else { (61000u16, 64999u16) };
    let mut rng = Rng::new(std::process::id() as u64 ^ micros(std::time::UNIX_EPOCH.elapsed().unwrap_or_default()));
    for _ in 0..200 {
        let port = from + rng.below((to - from) as u64) as u16;
        let a = SocketAddr::from(([127, 0, 0, 1], port));
        if TcpListener::bind(a).is_ok() {
            return a;
        }
    }
    panic!("no free loopback port in {from}..{to} after 200 tries");
}

/// A fresh directory for one scenario under Cargo's per-target temporary directory (a disk
/// file system: O_DIRECT works there); removed when dropped.
struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("consistency-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("backing")).unwrap();
        fs::create_dir_all(d.join("mnt")).unwrap();
        TestDir(d)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Write every block of every file at version 0, straight into the backing directory.
fn fill_backing(backing: &Path) {
    let mut data = vec![0u8; BLOCKS_PER_FILE * BLOCK];
    for f in 0..FILES {
        for (b, out) in data.chunks_exact_mut(BLOCK).enumerate() {
            encode(out, f, b, 0);
        }
        fs::write(backing.join(file_name(f)), &data).unwrap();
    }
}

/// Check every block of `read(file)` against the acknowledged versions, exactly (no writer
/// runs any more). Returns the mismatches.
fn check_all(st: &State, what: &str, mut read: impl FnMut(usize, &mut [u8]) -> std::io::Result<()>) -> Vec<String> {
    let mut bad = Vec::new();
    let mut buf = AlignedBuf::new(BLOCKS_PER_FILE * BLOCK);
    for f in 0..FILES {
        let data = buf.get(BLOCKS_PER_FILE * BLOCK);
        if let Err(e) = read(f, data) {
            bad.push(format!("{what}: read f{f}: {e}"));
            continue;
        }
        for b in 0..BLOCKS_PER_FILE {
            let want = st.blocks[f * BLOCKS_PER_FILE + b].acked.load(Ordering::SeqCst);
            let got = decode(&data[b * BLOCK..(b + 1) * BLOCK]);
            if got != (Decoded::Block { file: f, block: b, version: want }) && bad.len() < KEEP {
                bad.push(format!("{what}: f{f} block {b}: want version {want}, got {got:?}"));
            }
        }
    }
    bad
}

/// What a scenario's body works with.
struct Ctx<'a> {
    st: &'a State,
    mnt: &'a Path,
}

/// One scenario: files at version 0, a mount with `--server` for each of `mount_servers`,
/// writers and readers for the whole of `body` (which drives the lenders and checks that
/// caching happened), then the verdict. `body` runs under [`SCENARIO_BOUND`]. Returns the
/// mount's counters (`farcache stats MNT --json`) taken at the end, before unmounting.
fn scenario(tag: &str, mount_servers: &[SocketAddr], body: impl FnOnce(&Ctx) + Send) -> serde_json::Value {
    require_root("the consistency checker");
    require_fuse();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TestDir::new(tag);
    let (backing, mnt) = (dir.0.join("backing"), dir.0.join("mnt"));
    fill_backing(&backing);
    let addrs: Vec<String> = mount_servers.iter().map(|a| a.to_string()).collect();
    let mut args: Vec<&str> = LENDERS_FIRST.to_vec();
    for a in &addrs {
        args.extend(["--server", a.as_str()]);
    }
    let m = MountProcess::start(bin(), &backing, &mnt, &args, &dir.0.join("mount.log"));
    let st = State::new();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let mut workers = Vec::new();
        for w in 0..WRITERS {
            let (st, mnt) = (&st, &mnt);
            workers.push(s.spawn(move || writer(st, mnt, w, 0xA000 + w as u64)));
        }
        for r in 0..READERS {
            let (st, mnt) = (&st, &mnt);
            workers.push(s.spawn(move || reader(st, mnt, r, 0xB000 + r as u64)));
        }
        let ctx = Ctx { st: &st, mnt: &mnt };
        // `done_tx` moves into the body's thread: a panicking body drops it, which ends the
        // wait below at once.
        let h = s.spawn(move || {
            body(&ctx);
            let _ = done_tx.send(());
        });
        let timed_out = matches!(done_rx.recv_timeout(SCENARIO_BOUND), Err(mpsc::RecvTimeoutError::Timeout));
        st.stop.store(true, Ordering::SeqCst);
        if timed_out {
            // Kill the daemon: every blocked file operation fails, so every thread ends.
            m.signal(libc::SIGKILL);
        }
        let body_result = h.join();
        for w in workers {
            let _ = w.join();
        }
        assert!(!timed_out, "scenario {tag} exceeded {SCENARIO_BOUND:?}: {}\n{}", st.summary(), st.notes());
        if let Err(p) = body_result {
            eprintln!("scenario {tag}: {}\n{}", st.summary(), st.notes());
            std::panic::resume_unwind(p);
        }
    });
    eprintln!("scenario {tag}: {}", st.summary());
    assert_eq!(
        (st.violations.load(Ordering::SeqCst), st.errors.load(Ordering::SeqCst)),
        (0, 0),
        "scenario {tag}: every read must be current, whole and its own block, with no I/O error:\n{}\n{}",
        st.summary(),
        st.notes()
    );
    assert!(
        st.reads.load(Ordering::SeqCst) >= 1000 && st.writes.load(Ordering::SeqCst) >= 200,
        "scenario {tag}: too little I/O to mean anything: {}",
        st.summary()
    );

    // At rest, through the mount: exactly the last acknowledged version of every block.
    let files = open_files(&mnt, false, true).unwrap();
    let bad = check_all(&st, "at rest through the mount", |f, buf| files[f].read_exact_at(buf, 0));
    drop(files);
    assert!(bad.is_empty(), "scenario {tag}:\n{}", bad.join("\n"));

    let stats = mount_stats(&mnt);
    eprintln!("scenario {tag}: mount counters: {}", stats["remote"]);
    assert!(counter(&stats, &["remote", "hits"]) > 0, "scenario {tag}: the mount counted no remote hits: {stats}");
    // SIGTERM, exit 0. (Not the counters line the daemon logs at exit: when another mount
    // namespace holds a copy of the mount — a concurrent `unshare -m` anywhere on the
    // machine — the daemon leaves after its grace period without writing it.)
    m.stop();

    // And on the disk: every acknowledged write is there.
    let bad =
        check_all(&st, "in the backing file", |f, buf| File::open(backing.join(file_name(f)))?.read_exact_at(buf, 0));
    assert!(bad.is_empty(), "scenario {tag}:\n{}", bad.join("\n"));
    stats
}

/// Let the workers run for `d` (the scenario's phases are timed, not counted).
fn run_for(st: &State, d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d && !st.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads that must have completed in a phase for it to count as "reads went on".
const MIN_PHASE_READS: u64 = 50;

fn assert_reads_went_on(st: &State, phase: usize, what: &str) {
    let (n, max) = (st.reads_in(phase), st.max_read_in(phase));
    eprintln!("[{:.3}s] {what}: {n} reads, slowest {max:?}", st.t0.elapsed().as_secs_f64());
    assert!(
        n >= MIN_PHASE_READS && max < MAX_LATENCY,
        "{what}: reads must go on, each within {MAX_LATENCY:?}: {n} reads, slowest {max:?}\n{}\n{}",
        st.summary(),
        st.notes()
    );
}

/// `farcache lenders MNT ARGS... --json`: the mount's lender list after the change.
fn lenders(mnt: &Path, args: &[&str]) -> Vec<serde_json::Value> {
    let mut cmd = Command::new(bin());
    cmd.arg("lenders").arg(mnt).args(args).arg("--json");
    let v = json_of(cmd).unwrap_or_else(|| panic!("`farcache lenders {} {args:?} --json` failed", mnt.display()));
    v.as_array().cloned().unwrap_or_else(|| panic!("lender list expected, got {v}"))
}

fn capacity() -> [&'static str; 2] {
    ["--capacity", "64MiB"]
}

// ---------------------------------------------------------------------------------------
// Scenarios.

/// One lender: serves hits; is killed (reads go on from the disk); is restarted on the same
/// address (the mount reconnects to the new, empty process and caching resumes there); is
/// stopped for a few seconds (reads go on, each within the fetch timeout, never stalled) and
/// continued (hits again).
#[test]
fn one_lender_killed_restarted_stopped_and_continued() {
    let mut first = ServerProcess::start(bin(), &capacity(), None);
    let addr = first.addr();
    let mut second = None;
    let stats = scenario("one-lender", &[addr], |c| {
        let st = c.st;
        st.enter("warm");
        run_for(st, Duration::from_secs(3));
        let before = wait_for_lender(st, addr, 1000, 300, "before the kill");

        let killed = st.enter("killed");
        first.kill();
        run_for(st, Duration::from_secs(2));
        assert_reads_went_on(st, killed, "with the lender dead");

        st.enter("restarted");
        let s2 = second.insert(ServerProcess::start_on(bin(), addr, &capacity(), None));
        let after = wait_for_lender(st, addr, 1000, 300, "after the restart on the same address");
        assert_ne!(before.instance_id, after.instance_id, "a new process answers on {addr}");
        let seen = mount_lender(&mount_stats(c.mnt), addr).expect("the mount lists its lender");
        assert_eq!(
            (seen["connected"].as_bool(), seen["instance_id"].as_u64()),
            (Some(true), Some(after.instance_id)),
            "the mount is connected to the restarted lender: {seen}"
        );
        run_for(st, Duration::from_secs(2));

        let hits = lender_stats(addr).expect("the restarted lender answers").hits;
        let stopped = st.enter("stopped");
        s2.stop();
        run_for(st, Duration::from_secs(3));
        s2.cont();
        assert_reads_went_on(st, stopped, "with the lender stopped (SIGSTOP)");

        st.enter("continued");
        wait_for_lender(st, addr, hits + 1000, 0, "after SIGCONT");
        run_for(st, Duration::from_secs(2));
    });
    // Reads of blocks the stopped lender held gave up at the fetch timeout.
    assert!(counter(&stats, &["remote", "fallbacks"]) > 0, "no fallback while the lender was stopped: {stats}");
    drop(second);
}

/// Two lenders: both serve; one is killed; the survivor's blocks keep hitting while the dead
/// one's fall back to the disk.
#[test]
fn two_lenders_one_killed() {
    let mut a = ServerProcess::start(bin(), &capacity(), None);
    let b = ServerProcess::start(bin(), &capacity(), None);
    let (addr_a, addr_b) = (a.addr(), b.addr());
    scenario("two-lenders", &[addr_a, addr_b], |c| {
        let st = c.st;
        st.enter("warm");
        run_for(st, Duration::from_secs(3));
        wait_for_lender(st, addr_a, 500, 150, "lender A before the kill");
        let before = wait_for_lender(st, addr_b, 500, 150, "lender B before the kill");

        let killed = st.enter("A killed");
        a.kill();
        wait_for_lender(st, addr_b, before.hits + 1000, before.blocks, "lender B after A's death");
        run_for(st, Duration::from_secs(3));
        assert_reads_went_on(st, killed, "with lender A dead");
        let seen = mount_lender(&mount_stats(c.mnt), addr_a).expect("the mount lists lender A");
        assert_eq!(seen["connected"].as_bool(), Some(false), "the mount knows lender A is gone: {seen}");
    });
    drop(b);
}

/// A lender added mid-run with `farcache lenders MNT --add`: it receives its share of the
/// blocks (its STATS item count grows) and serves hits, and the first lender keeps serving.
/// Then the first lender is removed (its blocks move to the other one) and added back (it
/// still holds copies from before: they must never be served stale). Reads stay correct
/// throughout.
#[test]
fn lender_added_and_removed_mid_run() {
    let a = ServerProcess::start(bin(), &capacity(), None);
    let addr_a = a.addr();
    let mut added = None;
    scenario("lender-added", &[addr_a], |c| {
        let st = c.st;
        st.enter("one lender");
        run_for(st, Duration::from_secs(3));
        wait_for_lender(st, addr_a, 500, 150, "the first lender");

        let phase = st.enter("second lender added");
        let b = added.insert(ServerProcess::start(bin(), &capacity(), None));
        let addr_b = b.addr();
        let list = lenders(c.mnt, &["--add", &addr_b.to_string()]);
        assert_eq!(list.len(), 2, "two lenders after --add: {list:?}");
        let on_b = wait_for_lender(st, addr_b, 500, 150, "the added lender");
        let hits_a = lender_stats(addr_a).expect("the first lender answers").hits;
        run_for(st, Duration::from_secs(2));
        wait_for_lender(st, addr_a, hits_a + 100, 0, "the first lender, beside the added one");
        assert_reads_went_on(st, phase, "with two lenders");

        let phase = st.enter("first lender removed");
        let list = lenders(c.mnt, &["--remove", &addr_a.to_string()]);
        assert_eq!(list.len(), 1, "one lender after --remove: {list:?}");
        let hits_a = lender_stats(addr_a).expect("the first lender answers").hits;
        wait_for_lender(st, addr_b, on_b.hits + 1000, on_b.blocks + 100, "the added lender, alone");
        run_for(st, Duration::from_secs(2));
        let after = lender_stats(addr_a).expect("the first lender answers").hits;
        // (Slack for GETs the lender had read before the mount closed its connection.)
        assert!(after <= hits_a + 32, "a removed lender is not asked any more: {hits_a} -> {after} hits");
        assert_reads_went_on(st, phase, "with the first lender removed");

        let phase = st.enter("first lender back");
        let list = lenders(c.mnt, &["--add", &addr_a.to_string()]);
        assert_eq!(list.len(), 2, "two lenders again: {list:?}");
        wait_for_lender(st, addr_a, after + 300, 0, "the first lender, back");
        run_for(st, Duration::from_secs(2));
        assert_reads_went_on(st, phase, "with the first lender back");
    });
    drop(added);
    drop(a);
}

/// A lender named at mount time that is not up yet: its share of the blocks are misses until
/// it starts mid-run; then the mount connects (after its backoff), fills it and hits.
#[test]
fn lender_listed_before_it_starts() {
    let a = ServerProcess::start(bin(), &capacity(), None);
    let addr_a = a.addr();
    let addr_b = unused_addr();
    let mut late = None;
    scenario("lender-late", &[addr_a, addr_b], |c| {
        let st = c.st;
        st.enter("one of two up");
        run_for(st, Duration::from_secs(3));
        wait_for_lender(st, addr_a, 500, 150, "the first lender");

        let phase = st.enter("both up");
        late = Some(ServerProcess::start_on(bin(), addr_b, &capacity(), None));
        wait_for_lender(st, addr_b, 500, 150, "the late lender");
        run_for(st, Duration::from_secs(2));
        assert_reads_went_on(st, phase, "with both lenders up");
    });
    drop(late);
    drop(a);
}
