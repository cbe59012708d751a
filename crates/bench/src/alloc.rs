//! `farcache bench alloc`: the division of a lender's memory among tenants, in all four
//! modes (`server.allocation`), on a synthetic suite replayed through the real server.
//!
//! Each scenario is a few tenants (open mode, one connection each), each with its own trace
//! and its own span of the run (an idle tenant's trace ends early; a phase change is one
//! tenant's trace of one kind followed by another). The run proceeds in rounds; in each round
//! every tenant sends the part of its trace that falls in the round, in GET batches of up to
//! 16 distinct keys, and PUTs its misses back (demand fill). The figure is the lender's own
//! GET misses (`misses` in STATS), per scenario and mode, side by side, per tenth of the run
//! and per allocation interval. `mrc` then runs the suite again with less memory (`lean`, 70%
//! by default): the issue's "static's aggregate hit ratio with ≤ 70% of the memory".
//!
//! The reference is the offline optimum from exact curves ([`optimum`]): the same GETs
//! replayed against the lender's policy at every size, and the best split of the capacity.
//!
//! Time is compressed: the server runs with `allocation_interval` of `--interval` (100 ms by
//! default, standing for the default 5 s), and rounds start on a fixed clock, five per
//! interval, so a scenario of `rounds` lasts `rounds / 5` decisions whatever the machine's
//! speed (rounds that end late are counted and shown). The full run is 80 intervals (400 s
//! at the default interval); its phase change leaves 40 to converge, against the issue's
//! "90% of the new optimum within 30 s", six intervals: measured per interval against the new
//! optimum ([`optimum::ChangeReference`]) as the part of its gain over `static` reached
//! ([`caught_up`]).
//!
//! [`throughput`] is the other half of the issue's cost bound: the lender's GET throughput
//! under `mrc` against allocation off.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use farcache_policy::alloc::AllocationKind;
use farcache_policy::PolicyKind;
use farcache_wire::Key;
use serde::{Deserialize, Serialize};

use crate::error::IoContext;
use crate::fc_client::FcClient;
use crate::proc::{self, FarcacheSpec, WorkDir};
use crate::value::VALUE_BYTES;
use crate::{zipf_trace, BenchError, Machine, Result};

pub mod optimum;
pub mod throughput;

use optimum::{Batch, ChangeReference, Optimum};

/// Most keys per GET.
const BATCH: usize = 16;

#[derive(Clone, Debug)]
pub struct AllocBenchOptions {
    /// The `farcache` binary to run as `farcache server`.
    pub exe: PathBuf,
    /// The lender's capacity in 4 KiB blocks; every scenario is scaled to it.
    pub capacity_blocks: u64,
    /// GETs per scenario (all tenants together).
    pub requests: usize,
    /// `server.allocation_interval` of the runs.
    pub interval: Duration,
    /// Rounds per run (the run's time resolution: each round sends one slice of every trace).
    pub rounds: usize,
    pub modes: Vec<AllocationKind>,
    pub server_threads: u32,
    pub seed: u64,
    /// Scenarios to run by name (empty: all).
    pub only: Vec<String>,
    /// Keep each run's server log here, with the allocation timer's decisions at debug
    /// level (one line per tenant per tick: target, use, prediction, measured hit ratio).
    pub server_log: Option<PathBuf>,
    /// Shares of the capacity at which `mrc` runs again, on the same traces (issue 13: static's
    /// aggregate hit ratio with ≤ 70% of the memory). Empty: none; only with `mrc` in `modes`.
    pub lean: Vec<f64>,
}

impl AllocBenchOptions {
    /// 16 MiB lender, 400 k GETs per scenario.
    pub fn full(exe: PathBuf) -> Self {
        AllocBenchOptions {
            exe,
            capacity_blocks: 4096,
            requests: 400_000,
            interval: Duration::from_millis(100),
            rounds: 400,
            modes: AllocationKind::ALL.to_vec(),
            server_threads: 2,
            seed: 0xA110C,
            only: vec![],
            server_log: None,
            lean: vec![0.7],
        }
    }

    /// 4 MiB lender, 60 k GETs per scenario in 30 allocation intervals: a smoke run.
    pub fn quick(exe: PathBuf) -> Self {
        AllocBenchOptions { capacity_blocks: 1024, requests: 60_000, rounds: 150, ..Self::full(exe) }
    }
}

/// One tenant of a scenario: its keys in order, and the part of the run it is active in.
struct TenantLoad {
    name: &'static str,
    trace: Vec<u64>,
    /// Fractions of the run: the trace is spread evenly over `[start, end)`.
    span: (f64, f64),
}

struct Scenario {
    name: &'static str,
    what: String,
    tenants: Vec<TenantLoad>,
    /// Where in the run (a fraction) the tenants change behaviour, if they do.
    change_at: Option<f64>,
}

fn loop_trace(keys: u64, len: usize) -> Vec<u64> {
    (0..len as u64).map(|i| i % keys).collect()
}

fn scan_trace(len: usize) -> Vec<u64> {
    (0..len as u64).collect()
}

/// `a` then `b`: one tenant whose behaviour changes halfway.
fn cat(mut a: Vec<u64>, b: Vec<u64>) -> Vec<u64> {
    a.extend(b);
    a
}

/// Keys of a second phase, apart from the first's.
fn shift(t: Vec<u64>) -> Vec<u64> {
    t.into_iter().map(|k| k + (1 << 32)).collect()
}

/// The suite, scaled to `c` blocks of lender and `n` GETs per scenario.
fn suite(c: u64, n: usize, seed: u64) -> Vec<Scenario> {
    let t = |name, trace, span| TenantLoad { name, trace, span };
    let all = (0.0, 1.0);
    let z = |keys: u64, theta: f64, len: usize, s: u64| zipf_trace(keys.max(1), theta, len, seed ^ s);
    vec![
        Scenario {
            name: "skews",
            what: format!("three Zipf tenants over {} keys each, skew 0.6 / 0.9 / 1.2", 2 * c),
            tenants: vec![
                t("z06", z(2 * c, 0.6, n / 3, 1), all),
                t("z09", z(2 * c, 0.9, n / 3, 2), all),
                t("z12", z(2 * c, 1.2, n / 3, 3), all),
            ],
            change_at: None,
        },
        Scenario {
            name: "scan+steep",
            what: format!("a one-pass scan beside a Zipf 1.0 tenant over {} keys", c),
            tenants: vec![t("steep", z(c, 1.0, n / 2, 4), all), t("scan", scan_trace(n / 2), all)],
            change_at: None,
        },
        Scenario {
            name: "loop>share",
            what: format!("a loop over {} keys (just over half) beside Zipf 0.9 over {} keys", c * 6 / 10, 4 * c),
            tenants: vec![t("loop", loop_trace(c * 6 / 10, n / 2), all), t("zipf", z(4 * c, 0.9, n / 2, 5), all)],
            change_at: None,
        },
        Scenario {
            name: "phase",
            what: format!(
                "two tenants swap working sets halfway (uniform over {} and {} keys, then the other)",
                c / 5,
                3 * c / 2
            ),
            tenants: vec![
                t("a", cat(z(c / 5, 0.0, n / 4, 6), shift(z(3 * c / 2, 0.0, n / 4, 7))), all),
                t("b", cat(z(3 * c / 2, 0.0, n / 4, 8), shift(z(c / 5, 0.0, n / 4, 9))), all),
            ],
            change_at: Some(0.5),
        },
        Scenario {
            name: "idle",
            what: format!("Zipf 0.9 over {} keys beside a tenant that fills {} keys then goes idle", 2 * c, c / 2),
            tenants: vec![
                t("busy", z(2 * c, 0.9, n * 9 / 10, 10), all),
                t("idle", loop_trace(c / 2, n / 10), (0.0, 0.1)),
            ],
            change_at: None,
        },
        Scenario {
            name: "identical",
            what: format!("three identical Zipf 0.9 tenants over {} keys each", c),
            tenants: vec![
                t("id1", z(c, 0.9, n / 3, 11), all),
                t("id2", z(c, 0.9, n / 3, 12), all),
                t("id3", z(c, 0.9, n / 3, 13), all),
            ],
            change_at: None,
        },
        Scenario {
            name: "rate100:1",
            what: format!("two Zipf 0.9 tenants over {} keys each, 100:1 request rates", c),
            tenants: vec![t("fast", z(c, 0.9, n * 100 / 101, 14), all), t("slow", z(c, 0.9, n / 101, 15), all)],
            change_at: None,
        },
    ]
}

/// One (scenario, mode) run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocRow {
    pub scenario: String,
    pub mode: String,
    pub gets: u64,
    /// The lender's GET misses (its STATS).
    pub lender_misses: u64,
    pub hit_ratio: f64,
    /// Per tenant: (name, target_bytes, used_bytes, hits, misses) at the end.
    pub tenants: Vec<(String, u64, u64, u64, u64)>,
    pub secs: f64,
    /// Rounds that ended after their slot on the clock (the machine fell behind the
    /// scenario's time line; the allocators then saw it stretched).
    pub rounds_late: u32,
    /// Blocks taken across shards to hold the allocation (the lender's `placement_swaps`;
    /// `mrc` only; absent from older reports).
    #[serde(default)]
    pub placement_swaps: u64,
    /// Lender misses per tenth of the run ([`optimum::WINDOWS`]).
    pub window_misses: Vec<u64>,
    /// Per tenth of the run, at its end, per tenant: target and use in blocks, and its hits
    /// and misses so far.
    pub window_tenants: Vec<Vec<[u64; 4]>>,
    /// Lender misses per allocation interval (five rounds; absent from older reports).
    #[serde(default)]
    pub interval_misses: Vec<u64>,
    /// The lender's capacity in this run, if not the report's (`mrc` again with less memory:
    /// [`AllocBenchOptions::lean`]; its `mode` reads e.g. `mrc@70%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_blocks: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocReport {
    pub machine: Machine,
    pub capacity_blocks: u64,
    pub requests: usize,
    pub interval_ms: u64,
    pub rounds: usize,
    pub scenarios: Vec<(String, String)>,
    pub rows: Vec<AllocRow>,
    /// Per scenario, the offline optimum from exact curves ([`optimum`]).
    pub optimum: Vec<Optimum>,
}

pub fn run(o: &AllocBenchOptions) -> Result<AllocReport> {
    if o.capacity_blocks < 256 || o.requests == 0 || o.rounds == 0 || o.modes.is_empty() {
        return Err(BenchError::Setup("alloc bench: at least 256 blocks, one request, round and mode".into()));
    }
    if o.rounds > 100_000 || o.interval < Duration::from_millis(10) || o.interval > Duration::from_secs(60) {
        return Err(BenchError::Setup("alloc bench: at most 100,000 rounds, an interval of 10 ms..=60 s".into()));
    }
    if o.lean.iter().any(|&x| !(x > 0.0 && x < 1.0) || (o.capacity_blocks as f64 * x) < 256.0) {
        return Err(BenchError::Setup(format!(
            "alloc bench: --lean {:?}: each share must be in (0, 1) and leave at least 256 blocks",
            o.lean
        )));
    }
    let dir = WorkDir::new()?;
    let mut suite = suite(o.capacity_blocks, o.requests, o.seed);
    if !o.only.is_empty() {
        suite.retain(|s| o.only.iter().any(|n| n == s.name));
        if suite.is_empty() {
            return Err(BenchError::Setup(format!("alloc bench: no scenario named {:?}", o.only)));
        }
    }
    let mut rows = Vec::new();
    let mut optima = Vec::new();
    for sc in &suite {
        let plan = schedule(sc, o.rounds);
        let t0 = Instant::now();
        let curves: Vec<_> = plan
            .iter()
            .map(|batches| optimum::tenant_curves(PolicyKind::S3Fifo, o.capacity_blocks, batches, o.rounds))
            .collect();
        let mut opt = optimum::optimum(sc.name, o.capacity_blocks, &curves);
        if let Some(at) = sc.change_at {
            let round = (at * o.rounds as f64).round() as u32;
            opt.change =
                Some(optimum::change_reference(PolicyKind::S3Fifo, o.capacity_blocks, &curves, &plan, o.rounds, round));
        }
        eprintln!(
            "{:<11} optimum  : best fixed {} / per tenth {} misses, cold {} ({:.1} s)",
            sc.name,
            opt.best_fixed,
            opt.best_per_window,
            opt.cold,
            t0.elapsed().as_secs_f64()
        );
        optima.push(opt);
        // Every mode at the full capacity, then `mrc` at each lean share of it.
        let lean = o.lean.iter().filter(|_| o.modes.contains(&AllocationKind::Mrc));
        let runs = o
            .modes
            .iter()
            .map(|&m| (m, None))
            .chain(lean.map(|&share| (AllocationKind::Mrc, Some((o.capacity_blocks as f64 * share) as u64))));
        for (mode, capacity) in runs {
            let row = run_one(o, &dir, sc, &plan, mode, capacity)?;
            eprintln!(
                "{:<11} {:<9}: {} lender misses of {} GETs ({:.1} s, {} rounds late, {} placement swaps)",
                row.scenario, row.mode, row.lender_misses, row.gets, row.secs, row.rounds_late, row.placement_swaps
            );
            rows.push(row);
        }
    }
    Ok(AllocReport {
        machine: Machine::detect(),
        capacity_blocks: o.capacity_blocks,
        requests: o.requests,
        interval_ms: o.interval.as_millis() as u64,
        rounds: o.rounds,
        scenarios: suite.iter().map(|s| (s.name.to_string(), s.what.clone())).collect(),
        rows,
        optimum: optima,
    })
}

/// Shards of the bench's lender: at least 256 blocks each (a power of two, 1..=64). The
/// default lender has 2,048 per shard; with a few dozen, how a small working set's keys
/// happen to hash across shards decides more than the allocation does (targets are
/// whole-store, but a tenant at its target makes room in the shard it inserts into).
fn shards(capacity_blocks: u64) -> u64 {
    1 << (capacity_blocks / 256).clamp(1, 64).ilog2()
}

/// Each tenant's GETs as sent: per round, the part of its trace in the round, in batches of
/// up to [`BATCH`] keys, each sorted and without repeats (one GET per distinct key).
fn schedule(sc: &Scenario, rounds: usize) -> Vec<Vec<Batch>> {
    sc.tenants
        .iter()
        .map(|t| {
            let mut out = Vec::new();
            for round in 0..rounds {
                let (lo, hi) = (round as f64 / rounds as f64, (round + 1) as f64 / rounds as f64);
                for chunk in slice_in(&t.trace, t.span, lo, hi).chunks(BATCH) {
                    let mut keys = chunk.to_vec();
                    keys.sort_unstable();
                    keys.dedup();
                    out.push(Batch { round: round as u32, keys });
                }
            }
            out
        })
        .collect()
}

fn key(tenant: usize, id: u64) -> Key {
    Key::new(0xA11C ^ ((tenant as u128) << 64), id, 0)
}

fn run_one(
    o: &AllocBenchOptions,
    dir: &WorkDir,
    sc: &Scenario,
    plan: &[Vec<Batch>],
    mode: AllocationKind,
    lean: Option<u64>,
) -> Result<AllocRow> {
    let capacity = lean.unwrap_or(o.capacity_blocks);
    let label = match lean {
        Some(c) => format!("{}@{:.0}%", mode.name(), 100.0 * c as f64 / o.capacity_blocks as f64),
        None => mode.name().to_string(),
    };
    let spec = FarcacheSpec {
        exe: o.exe.clone(),
        capacity_bytes: capacity * VALUE_BYTES as u64,
        policy: "s3fifo".into(),
        worker_threads: o.server_threads,
        config: format!(
            "allocation = \"{}\"\nallocation_interval = \"{}ms\"\nshards = {}\n",
            mode.name(),
            o.interval.as_millis(),
            shards(capacity)
        ),
        log_filter: o.server_log.as_ref().map(|_| "warn,farcache_server::alloc=debug".to_string()),
    };
    let tag = format!("{}-{}", sc.name.replace([':', '>', '+'], "_"), label.replace('%', ""));
    let (mut guard, addr) = proc::spawn_farcache(&spec, dir, &tag)?;
    let t0 = Instant::now();
    let mut behind = 0u32;
    let mut window_misses: Vec<u64> = Vec::with_capacity(optimum::WINDOWS);
    let mut window_tenants: Vec<Vec<[u64; 4]>> = Vec::with_capacity(optimum::WINDOWS);
    let mut interval_misses: Vec<u64> = Vec::with_capacity(optimum::intervals(o.rounds));
    let played = (|| -> Result<String> {
        let mut clients = sc.tenants.iter().map(|t| FcClient::connect(addr, t.name)).collect::<Result<Vec<_>>>()?;
        let value = vec![0x5Au8; VALUE_BYTES];
        let mut keys: Vec<Key> = Vec::with_capacity(BATCH);
        let mut missed: Vec<Key> = Vec::with_capacity(BATCH);
        let mut next = vec![0usize; plan.len()];
        // Rounds start on a fixed clock, five per allocation interval, so that a scenario
        // lasts `rounds / 5` intervals whatever the machine's speed (unless it falls behind).
        let period = o.interval / optimum::ROUNDS_PER_INTERVAL;
        let start = Instant::now();
        for round in 0..o.rounds as u32 {
            for (i, batches) in plan.iter().enumerate() {
                while let Some(b) = batches.get(next[i]).filter(|b| b.round == round) {
                    next[i] += 1;
                    keys.clear();
                    keys.extend(b.keys.iter().map(|&id| key(i, id)));
                    missed.clear();
                    clients[i].get(&keys, |j, v| {
                        if v.is_none() {
                            missed.push(keys[j]);
                        }
                    })?;
                    if !missed.is_empty() {
                        let entries: Vec<(Key, &[u8])> = missed.iter().map(|k| (*k, &value[..])).collect();
                        clients[i].put(&entries)?;
                    }
                }
            }
            let last = round as usize + 1 == o.rounds;
            let new_window = last || optimum::window(round + 1, o.rounds) != optimum::window(round, o.rounds);
            let new_interval = last || optimum::interval(round + 1) != optimum::interval(round);
            if new_window || new_interval {
                let v = proc::parse_stats(&clients[0].stats()?)?;
                let now = v.get("misses").and_then(|x| x.as_u64()).unwrap_or(0);
                if new_interval {
                    interval_misses.push(now - interval_misses.iter().sum::<u64>());
                }
                if new_window {
                    window_misses.push(now - window_misses.iter().sum::<u64>());
                    let tenants = v.get("tenants").and_then(|t| t.as_array()).map(|a| {
                        a.iter().map(|t| {
                            let f = |k: &str| t.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
                            [
                                f("target_bytes") / VALUE_BYTES as u64,
                                f("used_bytes") / VALUE_BYTES as u64,
                                f("hits"),
                                f("misses"),
                            ]
                        })
                    });
                    window_tenants.push(tenants.map(|t| t.collect()).unwrap_or_default());
                }
            }
            continue_clock(start, period, round, &mut behind);
        }
        clients[0].stats()
    })();
    let stats = guard.blame(played)?;
    let secs = t0.elapsed().as_secs_f64();
    guard.stop();
    if let Some(to) = &o.server_log {
        let from = dir.path().join(format!("farcache-{tag}.log"));
        std::fs::create_dir_all(to)
            .and_then(|_| std::fs::copy(&from, to.join(format!("{tag}.log"))))
            .ctx(|| format!("keep {} in {}", from.display(), to.display()))?;
    }
    let v = proc::parse_stats(&stats)?;
    let field = |x: &serde_json::Value, k: &str| x.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    let (hits, misses) = (field(&v, "hits"), field(&v, "misses"));
    let tenants = v
        .get("tenants")
        .and_then(|t| t.as_array())
        .map(|a| {
            a.iter()
                .map(|t| {
                    let name = t.get("name").and_then(|n| n.as_str()).unwrap_or("").to_string();
                    (name, field(t, "target_bytes"), field(t, "used_bytes"), field(t, "hits"), field(t, "misses"))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(AllocRow {
        scenario: sc.name.into(),
        mode: label,
        gets: hits + misses,
        lender_misses: misses,
        hit_ratio: hits as f64 / (hits + misses).max(1) as f64,
        tenants,
        secs,
        rounds_late: behind,
        placement_swaps: field(&v, "placement_swaps"),
        window_misses,
        window_tenants,
        interval_misses,
        capacity_blocks: lean,
    })
}

/// Wait for the next round's slot on the clock, or count the round as late.
fn continue_clock(start: Instant, period: Duration, round: u32, behind: &mut u32) {
    let due = start + period * (round + 1);
    let now = Instant::now();
    if due > now {
        std::thread::sleep(due - now);
    } else {
        *behind += 1;
    }
}

/// The part of `trace`, spread evenly over `span` of the run, that falls in `[lo, hi)`.
fn slice_in(trace: &[u64], span: (f64, f64), lo: f64, hi: f64) -> &[u64] {
    let (s, e) = span;
    if e <= s || hi <= s || lo >= e {
        return &[];
    }
    let at = |x: f64| (((x.clamp(s, e) - s) / (e - s)) * trace.len() as f64).round() as usize;
    &trace[at(lo).min(trace.len())..at(hi).min(trace.len())]
}

pub fn render(r: &AllocReport) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "machine: {}", r.machine.describe());
    let _ = writeln!(
        o,
        "lender: {} blocks ({} MiB), S3-FIFO; {} GETs per scenario in {} rounds ({} allocation intervals of {} ms)",
        r.capacity_blocks,
        (r.capacity_blocks * VALUE_BYTES as u64) >> 20,
        r.requests,
        r.rounds,
        r.rounds / 5,
        r.interval_ms
    );
    for (name, what) in &r.scenarios {
        let _ = writeln!(o, "  {name:<11} {what}");
    }
    let modes: Vec<&str> =
        AllocationKind::ALL.iter().map(|k| k.name()).filter(|m| r.rows.iter().any(|x| x.mode == *m)).collect();
    let misses =
        |name: &str, m: &str| r.rows.iter().find(|x| x.scenario == name && x.mode == m).map(|x| x.lender_misses);
    let opt = |name: &str| r.optimum.iter().find(|x| x.scenario == name);
    let _ = writeln!(
        o,
        "\nLender misses (GETs not found), per scenario and allocation, vs static in parentheses; then the \
         offline optimum from exact curves (best fixed split, best split per tenth of the run), static as \
         simulated, and the cold misses no allocation avoids"
    );
    let mut head = format!("{:<11}", "scenario");
    for m in &modes {
        let _ = write!(head, " {m:>16}");
    }
    let _ = write!(head, " {:>16} {:>16} {:>9} {:>8}", "best fixed", "best/tenth", "sim stat", "cold");
    let _ = writeln!(o, "{head}\n{}", "-".repeat(head.chars().count()));
    // Totals: per mode, then best fixed, best per tenth, simulated static, cold.
    let mut totals = vec![0u64; modes.len() + 4];
    let rel = |x: u64, base: Option<u64>| base.map_or(String::new(), |b| format!("({:+.0}%)", pct(x, b)));
    for (name, _) in &r.scenarios {
        let base = misses(name, "static");
        let mut line = format!("{name:<11}");
        for (j, m) in modes.iter().enumerate() {
            match misses(name, m) {
                Some(x) => {
                    totals[j] += x;
                    let _ = write!(line, " {:>9} {:>6}", x, rel(x, base));
                }
                None => {
                    let _ = write!(line, " {:>16}", "-");
                }
            }
        }
        if let Some(p) = opt(name) {
            let n = modes.len();
            for (j, v) in [p.best_fixed, p.best_per_window, p.static_simulated, p.cold].into_iter().enumerate() {
                totals[n + j] += v;
            }
            let _ = write!(
                line,
                " {:>9} {:>6} {:>9} {:>6} {:>9} {:>8}",
                p.best_fixed,
                rel(p.best_fixed, base),
                p.best_per_window,
                rel(p.best_per_window, base),
                p.static_simulated,
                p.cold
            );
        }
        let _ = writeln!(o, "{line}");
    }
    let base = modes.iter().position(|m| *m == "static").map(|j| totals[j]);
    let mut line = format!("{:<11}", "total");
    for t in &totals[..modes.len()] {
        let _ = write!(line, " {t:>9} {:>6}", rel(*t, base));
    }
    if !r.optimum.is_empty() {
        let n = modes.len();
        let _ = write!(
            line,
            " {:>9} {:>6} {:>9} {:>6} {:>9} {:>8}",
            totals[n],
            rel(totals[n], base),
            totals[n + 1],
            rel(totals[n + 1], base),
            totals[n + 2],
            totals[n + 3]
        );
    }
    let _ = writeln!(o, "{line}");
    if r.optimum.is_empty() || base.is_none() {
        return o;
    }
    // How much of the optimum's gain over static each mode reaches, and the same on the
    // misses an allocation can avoid (above the cold ones).
    let _ = writeln!(
        o,
        "\nShare of the per-tenth optimum's gain over static (static − mode) / (static − optimum); \
         negative: worse than static"
    );
    let mut head = format!("{:<11} {:>9}", "scenario", "opt gain");
    for m in &modes {
        let _ = write!(head, " {m:>10}");
    }
    let _ = writeln!(o, "{head}\n{}", "-".repeat(head.chars().count()));
    let share = |x: u64, st: u64, best: u64| -> String {
        if st <= best {
            "-".into()
        } else {
            format!("{:.0}%", 100.0 * (st as f64 - x as f64) / (st - best) as f64)
        }
    };
    for (name, _) in &r.scenarios {
        let (Some(st), Some(p)) = (misses(name, "static"), opt(name)) else { continue };
        let mut line = format!("{name:<11} {:>9}", st.saturating_sub(p.best_per_window));
        for m in &modes {
            let _ = write!(line, " {:>10}", misses(name, m).map_or("-".into(), |x| share(x, st, p.best_per_window)));
        }
        let _ = writeln!(o, "{line}");
    }
    let (st, best, cold) = (
        totals[modes.iter().position(|m| *m == "static").unwrap_or(0)],
        totals[modes.len() + 1],
        totals[modes.len() + 3],
    );
    let mut line = format!("{:<11} {:>9}", "total", st.saturating_sub(best));
    for t in &totals[..modes.len()] {
        let _ = write!(line, " {:>10}", share(*t, st, best));
    }
    let _ = writeln!(o, "{line}");
    let mut line = format!("{:<11} {:>9}", "avoidable", "");
    for t in &totals[..modes.len()] {
        let _ = write!(line, " {:>10}", format!("{:+.0}%", pct(t.saturating_sub(cold), st.saturating_sub(cold))));
    }
    let _ = writeln!(
        o,
        "{line}\n(avoidable: misses above the cold ones, vs static's; the per-tenth optimum: {:+.0}%)",
        pct(best.saturating_sub(cold), st.saturating_sub(cold))
    );
    if let Some(p) = opt("phase") {
        let _ = writeln!(o, "\nphase: hit ratio per tenth of the run (the change is at the start of the sixth)");
        let ratio = |m: u64, g: u64| if g == 0 { "-".to_string() } else { format!("{:.3}", 1.0 - m as f64 / g as f64) };
        let mut line = format!("{:<11}", "best/tenth");
        for (m, g) in p.window_best.iter().zip(&p.window_gets) {
            let _ = write!(line, " {:>6}", ratio(*m, *g));
        }
        let _ = writeln!(o, "{line}");
        for m in &modes {
            let Some(row) = r.rows.iter().find(|x| x.scenario == "phase" && x.mode == *m) else { continue };
            let mut line = format!("{m:<11}");
            for (x, g) in row.window_misses.iter().zip(&p.window_gets) {
                let _ = write!(line, " {:>6}", ratio(*x, *g));
            }
            let _ = writeln!(o, "{line}");
        }
    }
    render_change(&mut o, r, &modes);
    render_lean(&mut o, r);
    let late: u32 = r.rows.iter().map(|x| x.rounds_late).sum();
    if late > 0 {
        let _ = writeln!(
            o,
            "{late} rounds of {} ended late: the machine fell behind the time line",
            r.rows.len() * r.rounds
        );
    }
    o
}

/// After a phase change, per allocation interval from the change's to the run's end: the new
/// optimum's gain over `static` in that interval and `row`'s (misses avoided; negative when
/// worse than static).
pub fn change_gains(reference: &ChangeReference, stat: &AllocRow, row: &AllocRow) -> Vec<(i64, i64)> {
    let n = reference.interval_misses.len().min(stat.interval_misses.len()).min(row.interval_misses.len());
    (reference.interval.min(n)..n)
        .map(|i| {
            let st = stat.interval_misses[i] as i64;
            (st - reference.interval_misses[i] as i64, st - row.interval_misses[i] as i64)
        })
        .collect()
}

/// The part of the optimum's gain reached over `gains` (the sums' ratio), or `None` when the
/// optimum gains nothing there.
pub fn gain_share(gains: &[(i64, i64)]) -> Option<f64> {
    let (opt, got) = gains.iter().fold((0i64, 0i64), |(a, b), &(o, g)| (a + o, b + g));
    (opt > 0).then(|| got as f64 / opt as f64)
}

/// The first interval after the change (0: the change's own) from which `span` intervals
/// together reach `want` of the optimum's gain: how soon the allocation has caught up.
pub fn caught_up(gains: &[(i64, i64)], want: f64, span: usize) -> Option<usize> {
    (0..gains.len().saturating_sub(span.max(1) - 1))
        .find(|&k| gain_share(&gains[k..k + span.max(1)]).is_some_and(|x| x >= want))
}

/// Intervals after a phase change by which `mrc` must have 90% of the new optimum's gain
/// (issue 13: 30 s at the default 5 s interval).
pub const CATCH_UP_INTERVALS: usize = 6;
/// The part of the new optimum's gain that counts as caught up.
const CATCH_UP_SHARE: f64 = 0.9;
/// Intervals a catch-up is judged over (a single interval's gain is a few hundred misses).
const CATCH_UP_SPAN: usize = 4;

fn render_change(o: &mut String, r: &AllocReport, modes: &[&str]) {
    for p in &r.optimum {
        let Some(c) = &p.change else { continue };
        let Some(stat) = r.rows.iter().find(|x| x.scenario == p.scenario && x.mode == "static") else { continue };
        let _ = writeln!(
            o,
            "\n{}: after the change (interval {}), the part of the new optimum's gain over static reached, per \
             allocation interval ({} ms here, 5 s at the default); the new optimum holds {:?} blocks",
            p.scenario, c.interval, r.interval_ms, c.blocks
        );
        let shown = 12;
        let mut head = format!("{:<11}", "interval");
        for k in 0..shown {
            let _ = write!(head, " {:>6}", format!("+{k}"));
        }
        let _ = write!(head, " {:>10} {:>12}", "caught up", format!("after +{CATCH_UP_INTERVALS}"));
        let _ = writeln!(o, "{head}");
        let mut line = format!("{:<11}", "opt gain");
        for (opt, _) in change_gains(c, stat, stat).iter().take(shown) {
            let _ = write!(line, " {opt:>6}");
        }
        let _ = writeln!(o, "{line}");
        for m in modes.iter().filter(|m| **m != "static") {
            let Some(row) = r.rows.iter().find(|x| x.scenario == p.scenario && x.mode == *m) else { continue };
            let gains = change_gains(c, stat, row);
            let mut line = format!("{m:<11}");
            for g in gains.iter().take(shown) {
                let _ = write!(
                    line,
                    " {:>6}",
                    gain_share(std::slice::from_ref(g)).map_or("-".into(), |x| format!("{:.0}%", 100.0 * x))
                );
            }
            let caught = caught_up(&gains, CATCH_UP_SHARE, CATCH_UP_SPAN).map_or("never".into(), |k| format!("+{k}"));
            let rest = gains
                .get(CATCH_UP_INTERVALS..)
                .and_then(gain_share)
                .map_or("-".into(), |x| format!("{:.0}%", 100.0 * x));
            let _ = writeln!(o, "{line} {caught:>10} {rest:>12}");
        }
        let _ = writeln!(
            o,
            "(caught up: the first interval from which {CATCH_UP_SPAN} intervals together reach {:.0}% of the new \
             optimum's gain; target: by +{CATCH_UP_INTERVALS}, 30 s at the default interval. after \
             +{CATCH_UP_INTERVALS}: the share over the rest of the run)",
            CATCH_UP_SHARE * 100.0
        );
    }
}

/// `mrc` with less memory against `static` with all of it: the lender's hit ratio per scenario
/// and over the suite.
fn render_lean(o: &mut String, r: &AllocReport) {
    // Each lean mode once, in the order run (its rows alternate with the scenarios').
    let mut lean: Vec<&str> = Vec::new();
    for x in r.rows.iter().filter(|x| x.capacity_blocks.is_some()) {
        if !lean.contains(&x.mode.as_str()) {
            lean.push(&x.mode);
        }
    }
    if lean.is_empty() {
        return;
    }
    let _ = writeln!(o, "\nLender hit ratio with less memory: static with all of it against {}", lean.join(", "));
    let mut head = format!("{:<11} {:>10}", "scenario", "static");
    for m in &lean {
        let _ = write!(head, " {m:>10}");
    }
    let _ = writeln!(o, "{head}\n{}", "-".repeat(head.chars().count()));
    let mut totals = vec![(0u64, 0u64); lean.len() + 1];
    for (name, _) in &r.scenarios {
        let mut line = format!("{name:<11}");
        for (j, m) in std::iter::once(&"static").chain(&lean).enumerate() {
            match r.rows.iter().find(|x| x.scenario == *name && x.mode == *m) {
                Some(x) => {
                    totals[j].0 += x.gets - x.lender_misses;
                    totals[j].1 += x.gets;
                    let _ = write!(line, " {:>10.3}", x.hit_ratio);
                }
                None => {
                    let _ = write!(line, " {:>10}", "-");
                }
            }
        }
        let _ = writeln!(o, "{line}");
    }
    let mut line = format!("{:<11}", "all");
    for (h, g) in &totals {
        let _ = write!(line, " {:>10.3}", *h as f64 / (*g).max(1) as f64);
    }
    let _ = writeln!(o, "{line}\n(all: the suite's hits over its GETs; target: mrc at 70% ≥ static)");
}

fn pct(x: u64, base: u64) -> f64 {
    if base == 0 {
        0.0
    } else {
        100.0 * (x as f64 - base as f64) / base as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_each_trace_once_within_its_span() {
        let trace: Vec<u64> = (0..1000).collect();
        for span in [(0.0, 1.0), (0.0, 0.1), (0.5, 1.0)] {
            let rounds = 37;
            let mut seen = vec![];
            for r in 0..rounds {
                let (lo, hi) = (r as f64 / rounds as f64, (r + 1) as f64 / rounds as f64);
                let s = slice_in(&trace, span, lo, hi);
                if !s.is_empty() {
                    assert!(hi > span.0 && lo < span.1, "{span:?}: round {r} outside the span");
                }
                seen.extend_from_slice(s);
            }
            assert_eq!(seen, trace, "{span:?}");
        }
    }

    fn row(mode: &str, interval_misses: Vec<u64>) -> AllocRow {
        AllocRow {
            scenario: "phase".into(),
            mode: mode.into(),
            gets: 0,
            lender_misses: interval_misses.iter().sum(),
            hit_ratio: 0.0,
            tenants: vec![],
            secs: 0.0,
            rounds_late: 0,
            placement_swaps: 0,
            window_misses: vec![],
            window_tenants: vec![],
            interval_misses,
            capacity_blocks: None,
        }
    }

    #[test]
    fn catching_up_after_a_change_is_judged_on_the_optimums_gain() {
        let reference = ChangeReference {
            round: 10,
            interval: 2,
            blocks: vec![],
            interval_misses: vec![10, 10, 50, 20, 10, 10, 10, 10],
            interval_gets: vec![100; 8],
        };
        let stat = row("static", vec![10, 10, 60, 60, 60, 60, 60, 60]);
        let mrc = row("mrc", vec![10, 10, 60, 50, 30, 15, 12, 10]);
        let gains = change_gains(&reference, &stat, &mrc);
        assert_eq!(gains, [(10, 0), (40, 10), (50, 30), (50, 45), (50, 48), (50, 50)]);
        // Two intervals together: +2 reaches 75%, +3 93%.
        assert_eq!(caught_up(&gains, 0.9, 2), Some(3));
        assert_eq!(caught_up(&gains, 0.9, 1), Some(3));
        assert_eq!(caught_up(&gains, 0.99, 1), Some(5));
        assert!((gain_share(&gains).unwrap() - 183.0 / 250.0).abs() < 1e-9);
        // Static itself never catches up; where the optimum gains nothing there is no share.
        assert_eq!(caught_up(&change_gains(&reference, &stat, &stat), 0.9, 2), None);
        assert_eq!(gain_share(&[(0, 5), (-3, 1)]), None);
        // A span longer than what is left after the change: not caught up, not a panic.
        assert_eq!(caught_up(&gains, 0.5, 7), None);
    }

    #[test]
    fn the_suite_has_every_scenario_of_the_issue() {
        let s = suite(1024, 10_000, 1);
        let names: Vec<&str> = s.iter().map(|x| x.name).collect();
        assert_eq!(names, ["skews", "scan+steep", "loop>share", "phase", "idle", "identical", "rate100:1"]);
        for sc in &s {
            let n: usize = sc.tenants.iter().map(|t| t.trace.len()).sum();
            assert!((9_000..=10_000).contains(&n), "{}: {n} GETs", sc.name);
        }
    }
}
