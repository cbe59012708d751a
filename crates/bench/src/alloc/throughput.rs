//! `farcache bench alloc --throughput`: what dividing the lender costs on its GET path (issue
//! 13: "lender GET throughput within 2% of allocation off").
//!
//! Two lenders run side by side, one per allocation — `shared` (no allocator: one eviction
//! order, no curves) and `mrc` (the default: every GET of a sampled key feeds its tenant's
//! miss-ratio curve, and the allocation timer runs) — each filled with the same keys and large
//! enough never to evict. Then closed-loop GET runs ([`crate::load`], every answer checked)
//! against each in turn, for each (batch, connections), `rounds` times, the order of the two
//! alternating from run to run so neither always goes first on a machine whose speed drifts.
//! Per configuration the figure is the median of the rounds; the target is on the geometric
//! mean, over configurations, of `mrc ÷ shared`. Beside it, each lender's CPU time per key
//! (its utime + stime over the run, warm-up included, ÷ the keys answered in it): on a shared
//! machine whose speed moves from run to run (hypervisor steal), what a GET costs the lender
//! moves less than what a closed loop gets through.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use farcache_policy::alloc::AllocationKind;
use serde::{Deserialize, Serialize};

use crate::load::{self, RunResult, RunSpec, Tally, Target};
use crate::machine::process_cpu_secs;
use crate::proc::{self, FarcacheSpec, WorkDir};
use crate::server::HEADROOM_BYTES;
use crate::value::VALUE_BYTES;
use crate::{BenchError, Machine, Result};

/// The allocation that is "off" and the one measured against it.
const OFF: AllocationKind = AllocationKind::Shared;
const ON: AllocationKind = AllocationKind::Mrc;
/// The bound: `mrc`'s GET throughput at least this share of `shared`'s.
pub const WITHIN: f64 = 0.98;

#[derive(Clone, Debug)]
pub struct ThroughputOptions {
    /// The `farcache` binary to run as `farcache server`.
    pub exe: PathBuf,
    /// Keys of 4 KiB, all stored in both lenders, read uniformly at random.
    pub keys: u64,
    pub batches: Vec<usize>,
    pub connections: Vec<usize>,
    pub warmup: Duration,
    pub duration: Duration,
    /// Runs of every (batch, connections) per lender.
    pub rounds: usize,
    pub server_threads: u32,
    pub seed: u64,
}

impl ThroughputOptions {
    /// 256 MiB of keys, batches 1 and 16 at 1 / 4 / 16 connections, 3 s runs, 3 rounds: about
    /// three minutes.
    pub fn full(exe: PathBuf) -> Self {
        ThroughputOptions {
            exe,
            keys: (256 << 20) / VALUE_BYTES as u64,
            batches: vec![1, 16],
            connections: vec![1, 4, 16],
            warmup: Duration::from_millis(500),
            duration: Duration::from_secs(3),
            rounds: 3,
            server_threads: 2,
            seed: 0x7E57,
        }
    }

    /// 16 MiB, 1 and 4 connections, half-second runs, two rounds: a smoke run.
    pub fn quick(exe: PathBuf) -> Self {
        ThroughputOptions {
            keys: (16 << 20) / VALUE_BYTES as u64,
            connections: vec![1, 4],
            warmup: Duration::from_millis(100),
            duration: Duration::from_millis(500),
            rounds: 2,
            ..Self::full(exe)
        }
    }
}

/// One measured run against one lender.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThroughputRow {
    pub mode: String,
    pub batch: usize,
    pub connections: usize,
    pub round: usize,
    /// The lender's CPU time per key answered in the run, warm-up included, in µs.
    pub server_cpu_us_per_key: f64,
    #[serde(flatten)]
    pub result: RunResult,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThroughputReport {
    pub machine: Machine,
    pub keys: u64,
    pub duration_secs: f64,
    pub rounds: usize,
    pub rows: Vec<ThroughputRow>,
    /// Per (batch, connections): the median ops/s under `shared` and `mrc`, and their ratio.
    pub medians: Vec<(usize, usize, f64, f64, f64)>,
    /// Per (batch, connections): the median lender CPU µs per key under `shared` and `mrc`,
    /// and their ratio.
    pub cpu_medians: Vec<(usize, usize, f64, f64, f64)>,
    /// The geometric mean of the CPU ratios.
    pub cpu_geomean: f64,
    /// The geometric mean of the ratios: the figure the target is on.
    pub geomean: f64,
    pub met: bool,
}

impl ThroughputReport {
    /// Answers with another key's value or a torn one, over every run. Must be 0.
    pub fn mismatches(&self) -> u64 {
        self.rows.iter().map(|r| r.result.checked.mismatches).sum()
    }
}

pub fn run(o: &ThroughputOptions) -> Result<ThroughputReport> {
    if o.keys == 0 || o.rounds == 0 || o.batches.is_empty() || o.connections.is_empty() || o.duration.is_zero() {
        return Err(BenchError::Setup("alloc throughput: at least one key, round, batch and connection".into()));
    }
    let dir = WorkDir::new()?;
    let capacity = (o.keys * VALUE_BYTES as u64 + HEADROOM_BYTES).next_multiple_of(1 << 20);
    let mut lenders = Vec::new();
    for mode in [OFF, ON] {
        let spec = FarcacheSpec {
            exe: o.exe.clone(),
            capacity_bytes: capacity,
            policy: "s3fifo".into(),
            worker_threads: o.server_threads,
            config: format!("allocation = \"{}\"\n", mode.name()),
            log_filter: None,
        };
        let (mut guard, addr) = proc::spawn_farcache(&spec, &dir, &format!("throughput-{}", mode.name()))?;
        let filled = guard.blame(load::fill(Target::Farcache(addr), o.keys, 16, 2))?;
        if filled.put_rejected > 0 {
            return Err(BenchError::Setup(format!(
                "alloc throughput: the {} lender refused {} of {} PUTs while filling",
                mode.name(),
                filled.put_rejected,
                o.keys
            )));
        }
        eprintln!("{:<6}: lender on {addr} filled with {} keys", mode.name(), o.keys);
        lenders.push((mode, guard, addr));
    }
    let mut rows = Vec::new();
    let configs: Vec<(usize, usize)> =
        o.batches.iter().flat_map(|&b| o.connections.iter().map(move |&c| (b, c))).collect();
    let mut turn = 0usize;
    for round in 0..o.rounds {
        for &(batch, connections) in &configs {
            turn += 1;
            let spec = RunSpec {
                connections,
                batch,
                get_percent: 100,
                keys: o.keys,
                warmup: o.warmup,
                duration: o.duration,
                seed: o.seed ^ (round as u64) << 40 ^ (batch as u64) << 20 ^ connections as u64,
            };
            for j in 0..lenders.len() {
                let (mode, guard, addr) = &mut lenders[(j + turn) % 2];
                let cpu0 = process_cpu_secs(guard.pid());
                let result = guard.blame(load::run(Target::Farcache(*addr), &spec))?;
                let answered = (result.checked.hits + result.checked.misses).max(1) as f64;
                let server_cpu_us_per_key = match (cpu0, process_cpu_secs(guard.pid())) {
                    (Some(a), Some(b)) => (b - a) * 1e6 / answered,
                    _ => 0.0,
                };
                eprintln!(
                    "{:<6} batch {batch:>2} conns {connections:>2} round {}: {:>9.0} keys/s, p50 {:.1} µs, \
                     lender CPU {server_cpu_us_per_key:.2} µs/key, {} misses",
                    mode.name(),
                    round + 1,
                    result.ops_per_sec,
                    result.latency_us_p50,
                    result.checked.misses
                );
                rows.push(ThroughputRow {
                    mode: mode.name().into(),
                    batch,
                    connections,
                    round,
                    server_cpu_us_per_key,
                    result,
                });
            }
        }
    }
    for (_, guard, _) in &mut lenders {
        guard.check_alive()?;
        guard.stop();
    }
    let side_by_side = |figure: fn(&ThroughputRow) -> f64| -> Vec<(usize, usize, f64, f64, f64)> {
        configs
            .iter()
            .map(|&(b, c)| {
                let median = |m: AllocationKind| {
                    median(rows.iter().filter(|r| r.mode == m.name() && r.batch == b && r.connections == c).map(figure))
                };
                let (off, on) = (median(OFF), median(ON));
                (b, c, off, on, on / off.max(1e-9))
            })
            .collect()
    };
    let medians = side_by_side(|r| r.result.ops_per_sec);
    let cpu_medians = side_by_side(|r| r.server_cpu_us_per_key);
    let geomean = geometric_mean(medians.iter().map(|m| m.4));
    let cpu_geomean = geometric_mean(cpu_medians.iter().map(|m| m.4));
    Ok(ThroughputReport {
        machine: Machine::detect(),
        keys: o.keys,
        duration_secs: o.duration.as_secs_f64(),
        rounds: o.rounds,
        rows,
        medians,
        geomean,
        cpu_medians,
        cpu_geomean,
        met: geomean >= WITHIN,
    })
}

fn median(xs: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = xs.collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn geometric_mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x.max(1e-12).ln(), n + 1));
    if n == 0 {
        0.0
    } else {
        (sum / n as f64).exp()
    }
}

pub fn render(r: &ThroughputReport) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "machine: {}", r.machine.describe());
    let _ = writeln!(
        o,
        "two lenders filled with {} keys of 4 KiB, never evicting; closed-loop GETs, {:.1} s per run, {} rounds, \
         the order alternating; keys/s, median of the rounds",
        r.keys, r.duration_secs, r.rounds
    );
    let _ = writeln!(
        o,
        "{:>5} {:>5} | {:>11} {:>11} | {:>7} | lender CPU µs/key {:>7} {:>7} | {:>7}",
        "batch",
        "conns",
        OFF.name(),
        ON.name(),
        "ratio",
        OFF.name(),
        ON.name(),
        "ratio"
    );
    for ((b, c, off, on, ratio), (_, _, coff, con, cratio)) in r.medians.iter().zip(&r.cpu_medians) {
        let _ = writeln!(
            o,
            "{b:>5} {c:>5} | {off:>11.0} {on:>11.0} | {ratio:>6.3}× | {:>17} {coff:>7.2} {con:>7.2} | {cratio:>6.3}×",
            ""
        );
    }
    let mut t = Tally::default();
    for x in &r.rows {
        t.add(&x.result.checked);
    }
    let _ = writeln!(o, "answers checked: {} hits, {} misses, {} mismatches", t.hits, t.misses, t.mismatches);
    let _ = writeln!(
        o,
        "\nTargets\n  [{}] mrc GET throughput ≥ {WITHIN} × shared's (geometric mean over the configurations): {:.3}×",
        if r.met { "met" } else { "MISSED" },
        r.geomean
    );
    let _ = writeln!(
        o,
        "  (lender CPU per key, mrc ÷ shared, geometric mean: {:.3}×; rounds of one configuration can differ \
         by more than that on a machine whose speed moves: the rows are in the JSON)",
        r.cpu_geomean
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_the_geometric_mean() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0].into_iter()), 2.5);
        assert_eq!(median(std::iter::empty()), 0.0);
        assert!((geometric_mean([0.5, 2.0].into_iter()) - 1.0).abs() < 1e-12);
        assert!((geometric_mean([0.9, 0.9, 0.9].into_iter()) - 0.9).abs() < 1e-12);
    }
}
