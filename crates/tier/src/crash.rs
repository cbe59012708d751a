//! The crash-state checker (issue 12, "power cut, emulated").
//!
//! A recording [`Medium`] under the log keeps every write and every flush in order. A crash
//! state is: every write before the last flush that completed, applied in order, plus any
//! subset of the writes after it, each whole or torn at a 512-byte sector (a prefix, a
//! suffix, or — in the random phase — any subset of its sectors). Recovery runs on each
//! state, and the checker compares what a reader would see of every block with a model:
//! each block shows its last acknowledged value, or the value (or absence) an operation in
//! flight at the crash would have given it — never an older value, never a mix (a block's
//! value is one 8-byte tag written over its whole page, checked on every byte).
//!
//! The workload drives the log the way the write-back layer does: writes of whole blocks,
//! truncates and unlinks (backing first, then the log), destage rounds (the plan's blocks
//! written to the backing model, then `free_through`), and write-through when the log is
//! full (a block that is dirty in the log goes to the reserve instead).
//!
//! `every_state_of_short_sequences`: every sequence of one to three operations over one file
//! of two blocks, ending in fsync, and every crash state of each. `random_crash_states`:
//! longer random sequences on a small ring (wraps, full tier, re-declared names), random
//! crash points and sector subsets. Together well over 1,000 states per run.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::log::{Append, AppendError, Entry, Log};
use crate::medium::{Medium, Mode};
use crate::page::Page;
use crate::{FileKey, PAGE_BYTES};

const SECTOR: usize = 512;

#[derive(Clone, Debug)]
enum IoOp {
    Write { off: u64, data: Vec<u8> },
    Flush,
}

#[derive(Default)]
struct Tape {
    ops: Vec<IoOp>,
}

/// Records every write and flush; reads see everything written.
struct Recorder {
    len: u64,
    image: Mutex<Vec<u8>>,
    tape: Arc<Mutex<Tape>>,
}

impl Medium for Recorder {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let img = self.image.lock();
        buf.copy_from_slice(&img[off as usize..off as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, off: u64, data: &[u8]) -> io::Result<()> {
        self.image.lock()[off as usize..off as usize + data.len()].copy_from_slice(data);
        self.tape.lock().ops.push(IoOp::Write { off, data: data.to_vec() });
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.tape.lock().ops.push(IoOp::Flush);
        Ok(())
    }
}

/// A crash state's image, for recovery.
struct Image(Mutex<Vec<u8>>);

impl Medium for Image {
    fn len(&self) -> u64 {
        self.0.lock().len() as u64
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let img = self.0.lock();
        buf.copy_from_slice(&img[off as usize..off as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, off: u64, data: &[u8]) -> io::Result<()> {
        self.0.lock()[off as usize..off as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

/// xorshift64*: deterministic, seeded, enough for choosing states.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write {
        key: u64,
        block: u64,
    },
    /// A write no one asked to be synchronous: acknowledged once written, durable with the
    /// next flush (a lazily committing log).
    LazyWrite {
        key: u64,
        block: u64,
    },
    Trim {
        key: u64,
        blocks: u64,
    },
    Drop {
        key: u64,
    },
    /// Both blocks of a file written by two appends that share a group (as concurrent
    /// writers do): packed into one batch.
    WriteBoth {
        key: u64,
    },
    /// One file's blocks written back and synced, then dropped through the seq it started at
    /// (what the write-back layer does before a content-changing fallocate).
    FlushFile {
        key: u64,
    },
    Destage,
    /// A destage round through the oldest live batch only (names re-declared).
    DestageOldest,
    Fsync,
}

type Slot = (u64, u64);

/// What the model allows a block to show after a crash at some point of the workload.
#[derive(Clone, Debug, Default)]
struct Allowed {
    /// The acknowledged value (0: none, the block is absent or was cut off).
    acked: u64,
    /// Values (0: absent) an operation in flight at the crash may have given it.
    in_flight: Vec<u64>,
}

/// A point of the I/O tape and what the model allowed there.
struct Checkpoint {
    tape_len: usize,
    allowed: HashMap<Slot, Allowed>,
    /// The backing model as durable then. For the start of an operation: as of its end
    /// (its backing changes precede its log I/O).
    backing: HashMap<Slot, u64>,
}

struct Run {
    tape: Arc<Mutex<Tape>>,
    checkpoints: Vec<Checkpoint>,
    len: u64,
}

fn page_of(v: u64) -> Box<Page> {
    let mut p = Page::zeroed();
    for c in p.0.chunks_mut(8) {
        c.copy_from_slice(&v.to_le_bytes());
    }
    p
}

/// The tag a block's page carries, or `None` if its bytes are not one tag throughout.
fn tag_of(p: &[u8]) -> Option<u64> {
    let v = u64::from_le_bytes(p[..8].try_into().unwrap());
    p.chunks(8).all(|c| c == v.to_le_bytes()).then_some(v)
}

const NAME: &[u8] = b"file";

/// Drive the log through `ops` on a fresh medium of `pages` pages, recording the tape and,
/// around every operation, what each block may show after a crash there.
fn drive(ops: &[Op], pages: u64) -> Run {
    let tape = Arc::new(Mutex::new(Tape::default()));
    let len = pages * PAGE_BYTES as u64;
    let rec = Recorder { len, image: Mutex::new(vec![0; len as usize]), tape: tape.clone() };
    let (log, _) = Log::open(Box::new(rec), Mode::Dram, Some("b")).unwrap();
    let log = log.commit_lazily(0);
    // The backing model: durable contents of each block (destage syncs before freeing).
    let mut backing: HashMap<Slot, u64> = HashMap::new();
    // The durable value of each block: acknowledged by a durable operation, or by a lazy
    // write that a flush on the tape has covered since.
    let mut acked: HashMap<Slot, u64> = HashMap::new();
    // Lazy writes not yet covered by a flush: the block may show any of them, or `acked`.
    // (slot, value, tape length once it was written), in order.
    let mut lazy: Vec<(Slot, u64, usize)> = Vec::new();
    let mut next_val = 1u64;
    let mut checkpoints =
        vec![Checkpoint { tape_len: tape.lock().ops.len(), allowed: HashMap::new(), backing: HashMap::new() }];
    let names = |k: u64| vec![(FileKey(k), Arc::<[u8]>::from(NAME))];
    let snapshot = |acked: &HashMap<Slot, u64>, lazy: &[(Slot, u64, usize)], flight: &HashMap<Slot, Vec<u64>>| {
        let mut m: HashMap<Slot, Allowed> = HashMap::new();
        for (s, v) in acked {
            m.entry(*s).or_default().acked = *v;
        }
        for (s, v, _) in lazy {
            m.entry(*s).or_default().in_flight.push(*v);
        }
        for (s, vs) in flight {
            m.entry(*s).or_default().in_flight.extend(vs);
        }
        m
    };
    for op in ops {
        let first_new = checkpoints.len();
        // While `op` runs, a crash may show its effect or not.
        let mut flight: HashMap<Slot, Vec<u64>> = HashMap::new();
        match *op {
            Op::Write { key, block } | Op::LazyWrite { key, block } => {
                let lazy_op = matches!(op, Op::LazyWrite { .. });
                let v = next_val;
                next_val += 1;
                flight.insert((key, block), vec![v]);
                // Mark the start of the operation: the tape from here on is in flight.
                let start = tape.lock().ops.len();
                checkpoints.push(Checkpoint {
                    tape_len: start,
                    allowed: snapshot(&acked, &lazy, &flight),
                    backing: HashMap::new(),
                });
                let dirty = !log.dirty_in(FileKey(key), block, block).is_empty();
                let mk = |reserve| Append {
                    entries: vec![Entry::Data { key: FileKey(key), block, valid: PAGE_BYTES as u32, page: page_of(v) }],
                    names: names(key),
                    reserve,
                    lazy: lazy_op,
                };
                let mut r = log.append(mk(false));
                if r == Err(AppendError::Full) && dirty {
                    r = log.append(mk(true));
                }
                if r == Err(AppendError::Full) && dirty {
                    destage(&log, &mut backing);
                    r = log.append(mk(true));
                }
                match r {
                    Ok(()) if lazy_op => lazy.push(((key, block), v, tape.lock().ops.len())),
                    Ok(()) => {
                        acked.insert((key, block), v);
                    }
                    Err(AppendError::Full) => {
                        assert!(!dirty, "a write to a dirty block must find room after a destage");
                        backing.insert((key, block), v); // write-through
                        lazy.retain(|(s, _, _)| *s != (key, block));
                        acked.insert((key, block), v);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            Op::Trim { key, blocks } => {
                for b in blocks..2 {
                    flight.insert((key, b), vec![0]);
                }
                let start = tape.lock().ops.len();
                checkpoints.push(Checkpoint {
                    tape_len: start,
                    allowed: snapshot(&acked, &lazy, &flight),
                    backing: HashMap::new(),
                });
                // The backing first (and synced), then the log.
                room_for_meta(&log, &mut backing);
                backing.retain(|(k, b), _| !(*k == key && *b >= blocks));
                append_meta(&log, &mut backing, || Entry::Trim { key: FileKey(key), size: blocks * PAGE_BYTES as u64 });
                acked.retain(|(k, b), _| !(*k == key && *b >= blocks));
            }
            Op::Drop { key } => {
                for b in 0..2 {
                    flight.insert((key, b), vec![0]);
                }
                let start = tape.lock().ops.len();
                checkpoints.push(Checkpoint {
                    tape_len: start,
                    allowed: snapshot(&acked, &lazy, &flight),
                    backing: HashMap::new(),
                });
                room_for_meta(&log, &mut backing);
                backing.retain(|(k, _), _| *k != key);
                append_meta(&log, &mut backing, || Entry::Drop { key: FileKey(key), through: u64::MAX });
                acked.retain(|(k, _), _| *k != key);
            }
            Op::WriteBoth { key } => {
                let (v0, v1) = (next_val, next_val + 1);
                next_val += 2;
                flight.insert((key, 0), vec![v0]);
                flight.insert((key, 1), vec![v1]);
                let start = tape.lock().ops.len();
                checkpoints.push(Checkpoint {
                    tape_len: start,
                    allowed: snapshot(&acked, &lazy, &flight),
                    backing: HashMap::new(),
                });
                let mk = |block, v| Append {
                    entries: vec![Entry::Data { key: FileKey(key), block, valid: PAGE_BYTES as u32, page: page_of(v) }],
                    names: names(key),
                    reserve: true,
                    lazy: false,
                };
                let r = log.append_group(vec![mk(0, v0), mk(1, v1)]);
                for (b, (v, r)) in [(0u64, (v0, &r[0])), (1, (v1, &r[1]))] {
                    match r {
                        Ok(()) => {
                            acked.insert((key, b), v);
                        }
                        Err(AppendError::Full) => {
                            // The layer would write it back through the file first; here:
                            // everything back, then through.
                            destage(&log, &mut backing);
                            backing.insert((key, b), v);
                            acked.insert((key, b), v);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            Op::FlushFile { key } => {
                let start = tape.lock().ops.len();
                checkpoints.push(Checkpoint {
                    tape_len: start,
                    allowed: snapshot(&acked, &lazy, &flight),
                    backing: HashMap::new(),
                });
                room_for_meta(&log, &mut backing);
                let through = log.last_seq();
                for (b, _) in log.dirty_in(FileKey(key), 0, u64::MAX) {
                    let (p, _) = log.read_block(FileKey(key), b).unwrap().expect("dirty");
                    backing.insert((key, b), tag_of(&p.0).expect("a whole tag"));
                }
                append_meta(&log, &mut backing, || Entry::Drop { key: FileKey(key), through });
            }
            Op::Destage | Op::DestageOldest => {
                let start = tape.lock().ops.len();
                checkpoints.push(Checkpoint {
                    tape_len: start,
                    allowed: snapshot(&acked, &lazy, &flight),
                    backing: HashMap::new(),
                });
                let through = if *op == Op::Destage { Some(log.last_seq()) } else { log.first_seq() };
                if let Some(t) = through {
                    destage_through(&log, &mut backing, t);
                }
            }
            Op::Fsync => {
                // Durable appends are durable when they return; lazy ones once committed.
                log.commit().unwrap();
            }
        }
        // Once done, a durable change of a block supersedes its older lazy values (its flush
        // covered them); while it ran, a crash could still show them.
        match *op {
            Op::Write { key, block } => lazy.retain(|(s, _, _)| *s != (key, block)),
            Op::Trim { key, blocks } => lazy.retain(|((k, b), _, _)| !(*k == key && *b >= blocks)),
            Op::Drop { key } | Op::WriteBoth { key } => lazy.retain(|((k, _), _, _)| *k != key),
            _ => {}
        }
        // Lazy values a flush on the tape has covered since are durable now, in order.
        let last_flush = tape.lock().ops.iter().rposition(|o| matches!(o, IoOp::Flush));
        lazy.retain(|&(s, v, at)| {
            let covered = last_flush.is_some_and(|f| f >= at);
            if covered {
                acked.insert(s, v);
            }
            !covered
        });
        for c in &mut checkpoints[first_new..] {
            c.backing = backing.clone();
        }
        let end = tape.lock().ops.len();
        checkpoints.push(Checkpoint {
            tape_len: end,
            allowed: snapshot(&acked, &lazy, &HashMap::new()),
            backing: backing.clone(),
        });
    }
    Run { tape, checkpoints, len }
}

/// Before a truncate or unlink changes the backing: make sure its trim or drop will fit in the
/// log (what the write-back layer does), destaging first if not — never after the backing
/// changed, or the destage would write records past the cut back into the file.
fn room_for_meta(log: &Log, backing: &mut HashMap<Slot, u64>) {
    if !log.meta_room() {
        destage(log, backing);
    }
}

/// Append a trim or drop: it must fit (see [`room_for_meta`]).
fn append_meta(log: &Log, _backing: &mut HashMap<Slot, u64>, e: impl Fn() -> Entry) {
    log.append(Append { entries: vec![e()], names: Vec::new(), reserve: true, lazy: false })
        .expect("room was made for it");
}

fn destage(log: &Log, backing: &mut HashMap<Slot, u64>) {
    destage_through(log, backing, log.last_seq());
}

fn destage_through(log: &Log, backing: &mut HashMap<Slot, u64>, through: u64) {
    for f in log.plan(through) {
        for (b, _) in f.blocks {
            let (p, _) = log.read_block(f.key, b).unwrap().expect("planned blocks are dirty");
            backing.insert((f.key.0, b), tag_of(&p.0).expect("a whole tag"));
        }
    }
    match log.free_through(through) {
        // No room to declare the names still needed: everything, which needs none.
        Err(AppendError::Full) if through < log.last_seq() => destage(log, backing),
        r => {
            r.unwrap();
        }
    }
}

/// How each write after the last flush lands in a crash state.
#[derive(Clone, Debug)]
enum Landing {
    Absent,
    Whole,
    /// These sectors of it, the others not.
    Sectors(Vec<bool>),
}

/// Build the crash image: `ops[..durable]` whole (flushed), then each later write as `land`.
fn image(len: u64, ops: &[IoOp], durable: usize, later: &[(usize, Landing)]) -> Vec<u8> {
    let mut img = vec![0u8; len as usize];
    let mut apply = |off: u64, data: &[u8], sectors: Option<&[bool]>| {
        for (i, s) in data.chunks(SECTOR).enumerate() {
            if sectors.is_none_or(|m| m[i]) {
                let at = off as usize + i * SECTOR;
                img[at..at + s.len()].copy_from_slice(s);
            }
        }
    };
    for op in &ops[..durable] {
        if let IoOp::Write { off, data } = op {
            apply(*off, data, None);
        }
    }
    for (i, land) in later {
        if let IoOp::Write { off, data } = &ops[*i] {
            match land {
                Landing::Absent => {}
                Landing::Whole => apply(*off, data, None),
                Landing::Sectors(m) => apply(*off, data, Some(m)),
            }
        }
    }
    img
}

/// Recover `img` and check every block against `allowed` over `backing`. Panics with the
/// state on a violation.
fn check(img: Vec<u8>, allowed: &HashMap<Slot, Allowed>, backing: &HashMap<Slot, u64>, what: &dyn Fn() -> String) {
    let (log, _) = match Log::open(Box::new(Image(Mutex::new(img))), Mode::Dram, Some("b")) {
        Ok(l) => l,
        Err(e) => panic!("recovery failed: {e}\n{}", what()),
    };
    // Every file with dirty blocks can be found again: its name survived.
    for f in log.plan(u64::MAX) {
        assert_eq!(&f.name[..], NAME, "file key {} has dirty blocks but no name\n{}", f.key.0, what());
    }
    let mut slots: Vec<Slot> = allowed.keys().copied().collect();
    slots.extend(backing.keys());
    for k in 0..2 {
        for b in 0..2 {
            slots.push((k, b));
        }
    }
    slots.sort();
    slots.dedup();
    for s in slots {
        let seen = match log.read_block(FileKey(s.0), s.1).unwrap() {
            Some((p, _)) => tag_of(&p.0).unwrap_or_else(|| panic!("block {s:?} mixes values\n{}", what())),
            None => backing.get(&s).copied().unwrap_or(0),
        };
        let a = allowed.get(&s).cloned().unwrap_or_default();
        assert!(seen == a.acked || a.in_flight.contains(&seen), "block {s:?} shows {seen}, allowed {a:?}\n{}", what());
    }
}

/// Check every crash state of `run` (exhaustive landings), or `samples` random ones per
/// crash point with `rng`. Returns the number of states checked.
fn explore(run: &Run, ops_desc: &str, rng: Option<(&mut Rng, usize)>) -> usize {
    let tape = run.tape.lock().ops.clone();
    let mut states = 0;
    let mut rng = rng;
    // Crash after `cut` I/O operations, for every cut once the log was made.
    for cut in run.checkpoints[0].tape_len..=tape.len() {
        // What the model allows at `cut`: the last checkpoint at or before it, combined
        // with the operation in flight (the checkpoint taken at its start covers it).
        let cp = run.checkpoints.iter().rev().find(|c| c.tape_len <= cut).expect("a checkpoint at 0");
        let backing = &cp.backing;
        let durable = tape[..cut].iter().rposition(|o| matches!(o, IoOp::Flush)).map_or(0, |i| i + 1);
        let later: Vec<usize> = (durable..cut).filter(|&i| matches!(tape[i], IoOp::Write { .. })).collect();
        let what = |l: &[(usize, Landing)]| {
            format!("ops {ops_desc}; crash after {cut} of {} I/O ops; later writes {l:?}", tape.len())
        };
        match rng.as_mut() {
            None => {
                // Every landing of every later write: absent, whole, torn prefixes and suffixes.
                let choices: Vec<Vec<Landing>> = later
                    .iter()
                    .map(|&i| {
                        let IoOp::Write { data, .. } = &tape[i] else { unreachable!() };
                        let n = data.len().div_ceil(SECTOR);
                        let mut c = vec![Landing::Absent, Landing::Whole];
                        for k in 1..n {
                            c.push(Landing::Sectors((0..n).map(|j| j < k).collect()));
                            c.push(Landing::Sectors((0..n).map(|j| j >= k).collect()));
                        }
                        c
                    })
                    .collect();
                let mut idx = vec![0usize; later.len()];
                loop {
                    let l: Vec<(usize, Landing)> =
                        later.iter().zip(&idx).map(|(&i, &c)| (i, choices_at(&choices, i, &later, c))).collect();
                    check(image(run.len, &tape, durable, &l), &cp.allowed, backing, &|| what(&l));
                    states += 1;
                    // Next combination.
                    let mut j = 0;
                    while j < idx.len() {
                        idx[j] += 1;
                        if idx[j] < choices[j].len() {
                            break;
                        }
                        idx[j] = 0;
                        j += 1;
                    }
                    if j == idx.len() {
                        break;
                    }
                }
            }
            Some((r, samples)) => {
                for _ in 0..*samples {
                    let l: Vec<(usize, Landing)> = later
                        .iter()
                        .map(|&i| {
                            let IoOp::Write { data, .. } = &tape[i] else { unreachable!() };
                            let n = data.len().div_ceil(SECTOR);
                            let land = match r.below(4) {
                                0 => Landing::Absent,
                                1 => Landing::Whole,
                                _ => Landing::Sectors((0..n).map(|_| r.below(2) == 0).collect()),
                            };
                            (i, land)
                        })
                        .collect();
                    check(image(run.len, &tape, durable, &l), &cp.allowed, backing, &|| what(&l));
                    states += 1;
                }
            }
        }
    }
    states
}

fn choices_at(choices: &[Vec<Landing>], i: usize, later: &[usize], c: usize) -> Landing {
    let j = later.iter().position(|&x| x == i).unwrap();
    choices[j][c].clone()
}

#[test]
fn every_state_of_short_sequences() {
    let alphabet = [
        Op::Write { key: 0, block: 0 },
        Op::Write { key: 0, block: 1 },
        Op::LazyWrite { key: 0, block: 0 },
        Op::Trim { key: 0, blocks: 0 },
        Op::Trim { key: 0, blocks: 1 },
        Op::Drop { key: 0 },
        Op::Destage,
        Op::DestageOldest,
        Op::FlushFile { key: 0 },
        Op::WriteBoth { key: 0 },
    ];
    let mut seqs: Vec<Vec<Op>> = Vec::new();
    for a in &alphabet {
        seqs.push(vec![*a]);
        for b in &alphabet {
            seqs.push(vec![*a, *b]);
            for c in &alphabet {
                seqs.push(vec![*a, *b, *c]);
            }
        }
    }
    let mut states = 0;
    for mut s in seqs.clone() {
        s.push(Op::Fsync);
        let run = drive(&s, 64);
        states += explore(&run, &format!("{s:?}"), None);
    }
    eprintln!("{} sequences, {states} crash states", seqs.len());
    assert!(states >= 1000, "{states}");
}

#[test]
fn random_crash_states() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id()));
    let seed = rng.0;
    let mut states = 0;
    // 30 rounds in CI; `FARCACHE_CRASH_ROUNDS` overrides (`make test-long`: 1,000).
    let rounds: usize = std::env::var("FARCACHE_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    for round in 0..rounds {
        let n = 10 + rng.below(30) as usize;
        let ops: Vec<Op> = (0..n)
            .map(|_| match rng.below(20) {
                0..=7 => Op::Write { key: rng.below(2), block: rng.below(2) },
                8..=12 => Op::LazyWrite { key: rng.below(2), block: rng.below(2) },
                13 => Op::Trim { key: rng.below(2), blocks: rng.below(2) },
                14 => Op::Drop { key: rng.below(2) },
                19 => Op::FlushFile { key: rng.below(2) },
                18 => Op::WriteBoth { key: rng.below(2) },
                15 => Op::Destage,
                16..=17 => Op::DestageOldest,
                _ => Op::Fsync,
            })
            .collect();
        // A small ring (28 pages): wraps, a full tier, the reserve and re-declared names.
        let run = drive(&ops, 30);
        states += explore(&run, &format!("seed {seed:#x} round {round}: {ops:?}"), Some((&mut rng, 3)));
    }
    eprintln!("{states} random crash states");
    assert!(states >= 1000, "{states}");
}

#[test]
fn recovery_keeps_every_committed_record_and_drops_a_torn_tail() {
    let run =
        drive(&[Op::Write { key: 0, block: 0 }, Op::Write { key: 0, block: 1 }, Op::Write { key: 1, block: 0 }], 64);
    let tape = run.tape.lock().ops.clone();
    // Everything: three records.
    let img = image(run.len, &tape, tape.len(), &[]);
    let (log, r) = Log::open(Box::new(Image(Mutex::new(img))), Mode::Dram, Some("b")).unwrap();
    assert_eq!((r.batches, r.records, r.files, r.torn_tail), (3, 3, 2, false));
    assert_eq!(log.stats().dirty_blocks, 3);
    // The last batch torn (its first sector only): two records, the tail noticed.
    let last = tape.iter().rposition(|o| matches!(o, IoOp::Write { .. })).unwrap();
    let IoOp::Write { data, .. } = &tape[last] else { unreachable!() };
    let n = data.len() / SECTOR;
    let img = image(run.len, &tape, last, &[(last, Landing::Sectors((0..n).map(|j| j == 0).collect()))]);
    let (_, r) = Log::open(Box::new(Image(Mutex::new(img))), Mode::Dram, Some("b")).unwrap();
    assert_eq!((r.batches, r.records, r.torn_tail), (2, 2, true));
    // Another backing is refused, naming both.
    let img = image(run.len, &tape, tape.len(), &[]);
    let e = Log::open(Box::new(Image(Mutex::new(img))), Mode::Dram, Some("other")).unwrap_err().to_string();
    assert!(e.contains("\"b\"") && e.contains("fix:"), "{e}");
}

/// Found by `random_crash_states`: a destage round frees the oldest batch, whose record of a
/// block a lazy write (unflushed) supersedes. The superblock that moves the tail must not be
/// durable before that lazy batch, or a crash between them loses both records of the block.
#[test]
fn a_freed_record_never_outlives_the_lazy_record_that_supersedes_it() {
    use Op::*;
    let ops = [
        Write { key: 0, block: 1 },
        Write { key: 0, block: 1 },
        Write { key: 1, block: 1 },
        Write { key: 0, block: 1 },
        Write { key: 1, block: 1 },
        Write { key: 1, block: 0 },
        DestageOldest,
        Write { key: 1, block: 0 },
        LazyWrite { key: 0, block: 1 },
        Write { key: 1, block: 1 },
        DestageOldest,
        LazyWrite { key: 0, block: 1 },
        Write { key: 0, block: 1 },
        Write { key: 1, block: 1 },
        WriteBoth { key: 1 },
        DestageOldest,
        LazyWrite { key: 1, block: 1 },
        DestageOldest,
        Fsync,
    ];
    let run = drive(&ops, 30);
    let mut rng = Rng(7);
    let states = explore(&run, &format!("{ops:?}"), Some((&mut rng, 64)));
    assert!(states >= 1000, "{states}");
}
