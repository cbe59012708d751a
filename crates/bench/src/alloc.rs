//! `farcache bench alloc`: the division of a lender's memory among tenants, in all four
//! modes (`server.allocation`), on a synthetic suite replayed through the real server.
//!
//! Each scenario is a few tenants (open mode, one connection each), each with its own trace
//! and its own span of the run (an idle tenant's trace ends early; a phase change is two
//! traces one after the other). The run proceeds in rounds; in each round every tenant sends
//! the part of its trace that falls in the round, in GET batches of up to 16 distinct keys,
//! and PUTs its misses back (demand fill). The figure is the lender's own GET misses
//! (`misses` in STATS), per scenario and mode, side by side.
//!
//! Time is compressed: the server runs with `allocation_interval` of `--interval` (100 ms by
//! default), which scales `mrc`'s decisions (each moving ≤ 2% of capacity), the paper's
//! `hit-ratio` clock and the idle time alike.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use farcache_policy::alloc::AllocationKind;
use farcache_wire::Key;
use serde::{Deserialize, Serialize};

use crate::fc_client::FcClient;
use crate::proc::{self, FarcacheSpec, WorkDir};
use crate::value::VALUE_BYTES;
use crate::{zipf_trace, BenchError, Machine, Result};

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
        }
    }

    /// 4 MiB lender, 40 k GETs per scenario: a smoke run.
    pub fn quick(exe: PathBuf) -> Self {
        AllocBenchOptions { capacity_blocks: 1024, requests: 40_000, rounds: 50, ..Self::full(exe) }
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
            what: format!("two tenants swap working sets ({} and {} keys, uniform) halfway", c / 5, 3 * c / 2),
            tenants: vec![
                t("a-small", z(c / 5, 0.0, n / 4, 6), (0.0, 0.5)),
                t("a-large", z(3 * c / 2, 0.0, n / 4, 7), (0.5, 1.0)),
                t("b-large", z(3 * c / 2, 0.0, n / 4, 8), (0.0, 0.5)),
                t("b-small", z(c / 5, 0.0, n / 4, 9), (0.5, 1.0)),
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
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocReport {
    pub machine: Machine,
    pub capacity_blocks: u64,
    pub requests: usize,
    pub interval_ms: u64,
    pub scenarios: Vec<(String, String)>,
    pub rows: Vec<AllocRow>,
}

pub fn run(o: &AllocBenchOptions) -> Result<AllocReport> {
    if o.capacity_blocks < 256 || o.requests == 0 || o.rounds == 0 || o.modes.is_empty() {
        return Err(BenchError::Setup("alloc bench: at least 256 blocks, one request, round and mode".into()));
    }
    let dir = WorkDir::new()?;
    let suite = suite(o.capacity_blocks, o.requests, o.seed);
    let mut rows = Vec::new();
    for sc in &suite {
        for &mode in &o.modes {
            let row = run_one(o, &dir, sc, mode)?;
            eprintln!(
                "{:<11} {:<9}: {} lender misses of {} GETs ({:.1} s)",
                row.scenario, row.mode, row.lender_misses, row.gets, row.secs
            );
            rows.push(row);
        }
    }
    Ok(AllocReport {
        machine: Machine::detect(),
        capacity_blocks: o.capacity_blocks,
        requests: o.requests,
        interval_ms: o.interval.as_millis() as u64,
        scenarios: suite.iter().map(|s| (s.name.to_string(), s.what.clone())).collect(),
        rows,
    })
}

fn key(tenant: usize, id: u64) -> Key {
    Key::new(0xA11C ^ ((tenant as u128) << 64), id, 0)
}

fn run_one(o: &AllocBenchOptions, dir: &WorkDir, sc: &Scenario, mode: AllocationKind) -> Result<AllocRow> {
    let spec = FarcacheSpec {
        exe: o.exe.clone(),
        capacity_bytes: o.capacity_blocks * VALUE_BYTES as u64,
        policy: "s3fifo".into(),
        worker_threads: o.server_threads,
        config: format!(
            "allocation = \"{}\"\nallocation_interval = \"{}ms\"\nshards = 16\n",
            mode.name(),
            o.interval.as_millis()
        ),
    };
    let tag = format!("{}-{}", sc.name.replace([':', '>', '+'], "_"), mode.name());
    let (mut guard, addr) = proc::spawn_farcache(&spec, dir, &tag)?;
    let t0 = Instant::now();
    let played = (|| -> Result<String> {
        let mut clients = sc.tenants.iter().map(|t| FcClient::connect(addr, t.name)).collect::<Result<Vec<_>>>()?;
        let value = vec![0x5Au8; VALUE_BYTES];
        let mut keys: Vec<Key> = Vec::with_capacity(BATCH);
        let mut missed: Vec<Key> = Vec::with_capacity(BATCH);
        for round in 0..o.rounds {
            let (lo, hi) = (round as f64 / o.rounds as f64, (round + 1) as f64 / o.rounds as f64);
            for (i, t) in sc.tenants.iter().enumerate() {
                let slice = slice_in(&t.trace, t.span, lo, hi);
                for chunk in slice.chunks(BATCH) {
                    keys.clear();
                    keys.extend(chunk.iter().map(|&id| key(i, id)));
                    keys.sort_unstable_by_key(|k| k.block);
                    keys.dedup();
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
            // Rounds are at least one allocation tick apart, so that the allocators see the
            // run unfold rather than all at once.
            std::thread::sleep(o.interval / 5);
        }
        clients[0].stats()
    })();
    let stats = guard.blame(played)?;
    let secs = t0.elapsed().as_secs_f64();
    guard.stop();
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
        "lender: {} blocks ({} MiB), S3-FIFO; {} GETs per scenario; allocation_interval {} ms",
        r.capacity_blocks,
        (r.capacity_blocks * VALUE_BYTES as u64) >> 20,
        r.requests,
        r.interval_ms
    );
    for (name, what) in &r.scenarios {
        let _ = writeln!(o, "  {name:<11} {what}");
    }
    let modes: Vec<&str> =
        AllocationKind::ALL.iter().map(|k| k.name()).filter(|m| r.rows.iter().any(|x| x.mode == *m)).collect();
    let _ = writeln!(o, "\nLender misses (GETs not found), per scenario and allocation; vs static in parentheses");
    let mut head = format!("{:<11}", "scenario");
    for m in &modes {
        let _ = write!(head, " {m:>18}");
    }
    let _ = writeln!(o, "{head}\n{}", "-".repeat(head.chars().count()));
    let mut totals = vec![0u64; modes.len()];
    for (name, _) in &r.scenarios {
        let mut line = format!("{name:<11}");
        let base = r.rows.iter().find(|x| &x.scenario == name && x.mode == "static").map(|x| x.lender_misses);
        for (j, m) in modes.iter().enumerate() {
            match r.rows.iter().find(|x| &x.scenario == name && x.mode == *m) {
                Some(x) => {
                    totals[j] += x.lender_misses;
                    let rel = base.map_or(String::new(), |b| format!("({:+.0}%)", pct(x.lender_misses, b)));
                    let _ = write!(line, " {:>10} {:>7}", x.lender_misses, rel);
                }
                None => {
                    let _ = write!(line, " {:>18}", "-");
                }
            }
        }
        let _ = writeln!(o, "{line}");
    }
    let mut line = format!("{:<11}", "total");
    let base = modes.iter().position(|m| *m == "static").map(|j| totals[j]);
    for t in &totals {
        let rel = base.map_or(String::new(), |b| format!("({:+.0}%)", pct(*t, b)));
        let _ = write!(line, " {t:>10} {rel:>7}");
    }
    let _ = writeln!(o, "{line}");
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
