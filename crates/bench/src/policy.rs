//! `farcache bench policy`: LRU against S3-FIFO.
//!
//! The same traces twice: (a) simulated ([`crate::simulate`]: one cache, the policy crate's
//! code, no network) at a few cache sizes, and (b) played against the real farcache server,
//! started once per (workload, policy) at one capacity. Against the server, the trace is
//! read in GET batches of up to 16 distinct keys; the misses of a batch are PUT back at
//! once (demand fill), and the hit ratio is counted from the GET answers, each checked
//! against its key's value.
//!
//! Expect the server's ratios near, not equal to, the simulation at the same size: the
//! server splits its capacity into independent shards with a policy each, and a miss's fill
//! lands after the rest of its batch was looked up.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use farcache_policy::PolicyKind;
use farcache_wire::Key;
use serde::{Deserialize, Serialize};

use crate::fc_client::FcClient;
use crate::load::{fc_key, Tally, TENANT};
use crate::proc::{self, FarcacheSpec, WorkDir};
use crate::value::{check_value, fill_value, VALUE_BYTES};
use crate::{scan_mix_trace, simulate, zipf_trace, BenchError, Machine, Result};

const MIB: u64 = 1 << 20;
const POLICIES: [PolicyKind; 2] = [PolicyKind::Lru, PolicyKind::S3Fifo];
/// Most keys per GET against the server.
const SERVER_BATCH: usize = 16;
/// Skew of the Zipf workload.
const THETA: f64 = 0.99;

#[derive(Clone, Debug)]
pub struct PolicyBenchOptions {
    /// The `farcache` binary to run as `farcache server`.
    pub exe: PathBuf,
    /// The real server's capacity, in 4 KiB blocks; the traces are scaled to it.
    pub server_blocks: u64,
    /// Requests per trace.
    pub requests: usize,
    /// Cache sizes simulated, as multiples of `server_blocks`.
    pub sim_sizes: Vec<f64>,
    /// Run the traces against the real server too.
    pub server: bool,
    pub server_threads: u32,
    pub seed: u64,
}

impl PolicyBenchOptions {
    /// 64 MiB server, 1 M requests per trace.
    pub fn full(exe: PathBuf) -> Self {
        PolicyBenchOptions {
            exe,
            server_blocks: (64 * MIB) / VALUE_BYTES as u64,
            requests: 1_000_000,
            sim_sizes: vec![0.25, 0.5, 1.0, 2.0],
            server: true,
            server_threads: 2,
            seed: 0x5EED,
        }
    }

    /// 16 MiB server, 100 k requests per trace.
    pub fn quick(exe: PathBuf) -> Self {
        PolicyBenchOptions { server_blocks: (16 * MIB) / VALUE_BYTES as u64, requests: 100_000, ..Self::full(exe) }
    }

    /// The workloads, scaled to the server's size `c`: Zipf over 10·c keys; and bursts on
    /// that same hot set alternating with one-pass scans of 2·c fresh keys (scans twice the
    /// cache, which flush an LRU).
    fn workloads(&self) -> Vec<(String, Vec<u64>)> {
        let c = self.server_blocks;
        vec![
            (format!("zipf {THETA}"), zipf_trace(10 * c, THETA, self.requests, self.seed)),
            ("scan mix".into(), scan_mix_trace(10 * c, 2 * c, self.requests, self.seed)),
        ]
    }
}

/// One simulated cache size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimRow {
    pub workload: String,
    pub cache_blocks: u64,
    pub lru_hit_ratio: f64,
    pub s3fifo_hit_ratio: f64,
}

/// One run against the real server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerRow {
    pub workload: String,
    pub policy: String,
    pub capacity_bytes: u64,
    pub requests: u64,
    /// From the GET answers, each checked.
    pub checked: Tally,
    pub hit_ratio: f64,
    /// The simulation's ratio for the same trace, policy and size.
    pub sim_hit_ratio: f64,
    /// The server's own counters at the end.
    pub server_hits: u64,
    pub server_misses: u64,
    pub server_evictions: u64,
    pub secs: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyReport {
    pub machine: Machine,
    pub requests: usize,
    pub server_blocks: u64,
    pub sim: Vec<SimRow>,
    pub server: Vec<ServerRow>,
}

impl PolicyReport {
    pub fn mismatches(&self) -> u64 {
        self.server.iter().map(|r| r.checked.mismatches).sum()
    }
}

pub fn run(o: &PolicyBenchOptions) -> Result<PolicyReport> {
    if o.server_blocks == 0 || o.requests == 0 || o.sim_sizes.iter().any(|&s| s <= 0.0) {
        return Err(BenchError::Setup("policy bench: sizes and request count must be positive".into()));
    }
    let machine = Machine::detect();
    let workloads = o.workloads();
    let mut sim = Vec::new();
    for (name, trace) in &workloads {
        for &f in &o.sim_sizes {
            let blocks = (o.server_blocks as f64 * f).round() as u64;
            let slots = u32::try_from(blocks)
                .map_err(|_| BenchError::Setup(format!("{blocks} blocks is too many to simulate")))?;
            let lru = simulate(PolicyKind::Lru, slots, trace);
            let s3 = simulate(PolicyKind::S3Fifo, slots, trace);
            eprintln!("sim {name:<10} {blocks:>7} blocks: LRU {:.4}  S3-FIFO {:.4}", lru.hit_ratio, s3.hit_ratio);
            sim.push(SimRow {
                workload: name.clone(),
                cache_blocks: blocks,
                lru_hit_ratio: lru.hit_ratio,
                s3fifo_hit_ratio: s3.hit_ratio,
            });
        }
    }
    let mut server = Vec::new();
    if o.server {
        let dir = WorkDir::new()?;
        for (name, trace) in &workloads {
            for kind in POLICIES {
                let sim_hit_ratio = simulate(kind, o.server_blocks as u32, trace).hit_ratio;
                let row = server_run(o, &dir, name, kind, trace, sim_hit_ratio)?;
                eprintln!(
                    "server {name:<10} {:<6}: hit ratio {:.4} (simulated {:.4}), {} mismatches, {:.1} s",
                    row.policy, row.hit_ratio, sim_hit_ratio, row.checked.mismatches, row.secs
                );
                server.push(row);
            }
        }
    }
    Ok(PolicyReport { machine, requests: o.requests, server_blocks: o.server_blocks, sim, server })
}

/// Split `trace` into batches of at most `max` keys with no key twice in a batch, so that
/// a repeat is looked up after its first access was filled, as in the simulation.
fn batches(trace: &[u64], max: usize) -> Vec<&[u64]> {
    let mut out = Vec::with_capacity(trace.len() / max + 1);
    let mut start = 0;
    for i in 0..trace.len() {
        if i - start == max || trace[start..i].contains(&trace[i]) {
            out.push(&trace[start..i]);
            start = i;
        }
    }
    if start < trace.len() {
        out.push(&trace[start..]);
    }
    out
}

fn server_run(
    o: &PolicyBenchOptions,
    dir: &WorkDir,
    workload: &str,
    kind: PolicyKind,
    trace: &[u64],
    sim_hit_ratio: f64,
) -> Result<ServerRow> {
    let capacity = o.server_blocks * VALUE_BYTES as u64;
    let spec = FarcacheSpec {
        exe: o.exe.clone(),
        capacity_bytes: capacity,
        policy: kind.name().into(),
        worker_threads: o.server_threads,
        config: String::new(),
        log_filter: None,
    };
    let (mut guard, addr) = proc::spawn_farcache(&spec, dir, kind.name())?;
    let t0 = Instant::now();
    let played = (|| -> Result<(Tally, String)> {
        let mut c = FcClient::connect(addr, TENANT)?;
        let mut tally = Tally::default();
        let mut keys: Vec<Key> = Vec::with_capacity(SERVER_BATCH);
        let mut missed: Vec<u64> = Vec::with_capacity(SERVER_BATCH);
        let mut values = vec![0u8; SERVER_BATCH * VALUE_BYTES];
        for batch in batches(trace, SERVER_BATCH) {
            keys.clear();
            keys.extend(batch.iter().map(|&id| fc_key(id)));
            missed.clear();
            c.get(&keys, |i, v| match v {
                None => {
                    tally.misses += 1;
                    missed.push(batch[i]);
                }
                Some(v) if check_value(batch[i], v) => tally.hits += 1,
                Some(_) => tally.mismatches += 1,
            })?;
            if missed.is_empty() {
                continue;
            }
            for (&id, v) in missed.iter().zip(values.chunks_exact_mut(VALUE_BYTES)) {
                fill_value(id, v);
            }
            let entries: Vec<(Key, &[u8])> =
                missed.iter().zip(values.chunks_exact(VALUE_BYTES)).map(|(&id, v)| (fc_key(id), v)).collect();
            let p = c.put(&entries)?;
            tally.put_stored += p.stored;
            tally.put_rejected += p.rejected;
        }
        Ok((tally, c.stats()?))
    })();
    let (tally, stats) = guard.blame(played)?;
    let secs = t0.elapsed().as_secs_f64();
    guard.stop();
    let v = proc::parse_stats(&stats)?;
    let field = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    let gets = tally.hits + tally.misses + tally.mismatches;
    Ok(ServerRow {
        workload: workload.into(),
        policy: kind.name().into(),
        capacity_bytes: capacity,
        requests: gets,
        checked: tally,
        hit_ratio: tally.hits as f64 / gets.max(1) as f64,
        sim_hit_ratio,
        server_hits: field("hits"),
        server_misses: field("misses"),
        server_evictions: field("evictions"),
        secs,
    })
}

fn policy_label(name: &str) -> &str {
    match name {
        "lru" => "LRU",
        "s3fifo" => "S3-FIFO",
        other => other,
    }
}

pub fn render(r: &PolicyReport) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "machine: {}", r.machine.describe());
    let c = r.server_blocks;
    let _ = writeln!(
        o,
        "traces: {} requests each; zipf {THETA} over {} keys; scan mix: bursts of {} zipf {THETA} requests on those keys \
         alternating with one-pass scans of {} new keys",
        r.requests,
        10 * c,
        2 * c,
        2 * c
    );
    let _ = writeln!(o);
    let _ = writeln!(o, "Simulation (one cache; hit ratio over the whole trace)");
    let head = format!("{:<10} {:>13} {:>9} {:>9} {:>9}", "workload", "cache", "LRU", "S3-FIFO", "S3 − LRU");
    let _ = writeln!(o, "{head}\n{}", "-".repeat(head.chars().count()));
    for s in &r.sim {
        let _ = writeln!(
            o,
            "{:<10} {:>6} blocks {:>9.4} {:>9.4} {:>+9.4}",
            s.workload,
            s.cache_blocks,
            s.lru_hit_ratio,
            s.s3fifo_hit_ratio,
            s.s3fifo_hit_ratio - s.lru_hit_ratio
        );
    }
    if !r.server.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "Real farcache server ({} MiB = {} blocks; GET batches of ≤{SERVER_BATCH} distinct keys, misses PUT back)",
            c * VALUE_BYTES as u64 / MIB,
            c
        );
        let head = format!(
            "{:<10} {:<8} {:>9} {:>10} {:>11} {:>10} {:>10} {:>7}",
            "workload", "policy", "hit ratio", "simulated", "evictions", "mismatch", "rejected", "secs"
        );
        let _ = writeln!(o, "{head}\n{}", "-".repeat(head.chars().count()));
        for s in &r.server {
            let _ = writeln!(
                o,
                "{:<10} {:<8} {:>9.4} {:>10.4} {:>11} {:>10} {:>10} {:>7.1}",
                s.workload,
                policy_label(&s.policy),
                s.hit_ratio,
                s.sim_hit_ratio,
                s.server_evictions,
                s.checked.mismatches,
                s.checked.put_rejected,
                s.secs
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_never_repeat_a_key_and_cover_the_trace() {
        let trace = [1, 2, 3, 2, 4, 5, 6, 7, 8, 1, 1, 9];
        let b = batches(&trace, 4);
        assert_eq!(b, vec![&[1, 2, 3][..], &[2, 4, 5, 6], &[7, 8, 1], &[1, 9]]);
        assert_eq!(b.concat(), trace);
        assert!(batches(&[], 16).is_empty());
        let long: Vec<u64> = (0..100).collect();
        assert!(batches(&long, 16).iter().all(|x| x.len() <= 16));
    }
}
