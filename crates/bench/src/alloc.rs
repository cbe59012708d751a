//! `farcache bench alloc`: the division of a lender's memory among tenants, in all four
//! modes (`server.allocation`), on a synthetic suite replayed through the real server.
//!
//! Each scenario is a few tenants (open mode, one connection each), each with its own trace
//! and its own span of the run (an idle tenant's trace ends early; a phase change is one
//! tenant's trace of one kind followed by another). The run proceeds in rounds; in each round
//! every tenant sends the part of its trace that falls in the round, in GET batches of up to
//! 16 distinct keys, and PUTs its misses back (demand fill). The figure is the lender's own
//! GET misses (`misses` in STATS), per scenario and mode, side by side, and per tenth of the
//! run.
//!
//! The reference is the offline optimum from exact curves ([`optimum`]): the same GETs
//! replayed against the lender's policy at every size, and the best split of the capacity.
//!
//! Time is compressed: the server runs with `allocation_interval` of `--interval` (100 ms by
//! default, standing for the default 5 s), and rounds start on a fixed clock, five per
//! interval, so a scenario of `rounds` lasts `rounds / 5` decisions whatever the machine's
//! speed (rounds that end late are counted and shown). The full run is 80 intervals (400 s
//! at the default interval); its phase change leaves 40 to converge, against the issue's
//! "90% of the new optimum within 30 s", six intervals.

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

use optimum::{Batch, Optimum};

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
        },
        Scenario {
            name: "scan+steep",
            what: format!("a one-pass scan beside a Zipf 1.0 tenant over {} keys", c),
            tenants: vec![t("steep", z(c, 1.0, n / 2, 4), all), t("scan", scan_trace(n / 2), all)],
        },
        Scenario {
            name: "loop>share",
            what: format!("a loop over {} keys (just over half) beside Zipf 0.9 over {} keys", c * 6 / 10, 4 * c),
            tenants: vec![t("loop", loop_trace(c * 6 / 10, n / 2), all), t("zipf", z(4 * c, 0.9, n / 2, 5), all)],
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
        },
        Scenario {
            name: "idle",
            what: format!("Zipf 0.9 over {} keys beside a tenant that fills {} keys then goes idle", 2 * c, c / 2),
            tenants: vec![
                t("busy", z(2 * c, 0.9, n * 9 / 10, 10), all),
                t("idle", loop_trace(c / 2, n / 10), (0.0, 0.1)),
            ],
        },
        Scenario {
            name: "identical",
            what: format!("three identical Zipf 0.9 tenants over {} keys each", c),
            tenants: vec![
                t("id1", z(c, 0.9, n / 3, 11), all),
                t("id2", z(c, 0.9, n / 3, 12), all),
                t("id3", z(c, 0.9, n / 3, 13), all),
            ],
        },
        Scenario {
            name: "rate100:1",
            what: format!("two Zipf 0.9 tenants over {} keys each, 100:1 request rates", c),
            tenants: vec![t("fast", z(c, 0.9, n * 100 / 101, 14), all), t("slow", z(c, 0.9, n / 101, 15), all)],
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
        let opt = optimum::optimum(sc.name, o.capacity_blocks, &curves);
        eprintln!(
            "{:<11} optimum  : best fixed {} / per tenth {} misses, cold {} ({:.1} s)",
            sc.name,
            opt.best_fixed,
            opt.best_per_window,
            opt.cold,
            t0.elapsed().as_secs_f64()
        );
        optima.push(opt);
        for &mode in &o.modes {
            let row = run_one(o, &dir, sc, &plan, mode)?;
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
) -> Result<AllocRow> {
    let spec = FarcacheSpec {
        exe: o.exe.clone(),
        capacity_bytes: o.capacity_blocks * VALUE_BYTES as u64,
        policy: "s3fifo".into(),
        worker_threads: o.server_threads,
        config: format!(
            "allocation = \"{}\"\nallocation_interval = \"{}ms\"\nshards = {}\n",
            mode.name(),
            o.interval.as_millis(),
            shards(o.capacity_blocks)
        ),
        log_filter: o.server_log.as_ref().map(|_| "warn,farcache_server::alloc=debug".to_string()),
    };
    let tag = format!("{}-{}", sc.name.replace([':', '>', '+'], "_"), mode.name());
    let (mut guard, addr) = proc::spawn_farcache(&spec, dir, &tag)?;
    let t0 = Instant::now();
    let mut behind = 0u32;
    let mut window_misses: Vec<u64> = Vec::with_capacity(optimum::WINDOWS);
    let mut window_tenants: Vec<Vec<[u64; 4]>> = Vec::with_capacity(optimum::WINDOWS);
    let played = (|| -> Result<String> {
        let mut clients = sc.tenants.iter().map(|t| FcClient::connect(addr, t.name)).collect::<Result<Vec<_>>>()?;
        let value = vec![0x5Au8; VALUE_BYTES];
        let mut keys: Vec<Key> = Vec::with_capacity(BATCH);
        let mut missed: Vec<Key> = Vec::with_capacity(BATCH);
        let mut next = vec![0usize; plan.len()];
        // Rounds start on a fixed clock, five per allocation interval, so that a scenario
        // lasts `rounds / 5` intervals whatever the machine's speed (unless it falls behind).
        let period = o.interval / 5;
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
            if round as usize + 1 == o.rounds
                || optimum::window(round + 1, o.rounds) != optimum::window(round, o.rounds)
            {
                let v = proc::parse_stats(&clients[0].stats()?)?;
                let now = v.get("misses").and_then(|x| x.as_u64()).unwrap_or(0);
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
            let due = start + period * (round + 1);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            } else {
                behind += 1;
            }
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
        mode: mode.name().into(),
        gets: hits + misses,
        lender_misses: misses,
        hit_ratio: hits as f64 / (hits + misses).max(1) as f64,
        tenants,
        secs,
        rounds_late: behind,
        placement_swaps: field(&v, "placement_swaps"),
        window_misses,
        window_tenants,
    })
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
