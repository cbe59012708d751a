//! `farcache bench`: the benchmarks that BENCHMARKS.md reports. Thin: options in, the
//! `farcache-bench` crate does the work, tables out (and JSON on request).

use std::path::{Path, PathBuf};

use anyhow::Context;
use farcache_bench::policy::{self, PolicyBenchOptions};
use farcache_bench::server::{self, Mix, ServerBenchOptions};
use farcache_config::HumanDuration;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// The farcache server against memcached: memory per GiB stored, then GET/PUT
    /// throughput and latency, both started here as child processes on 127.0.0.1.
    Server(ServerArgs),
    /// LRU against S3-FIFO: trace simulation, then the real server once per policy.
    Policy(PolicyArgs),
}

#[derive(clap::Args)]
struct ServerArgs {
    /// A small, fast run (16 MiB, 1 s runs, 1 and 4 connections), for tests.
    #[arg(long)]
    quick: bool,
    /// Measured time of each run.
    #[arg(long)]
    duration: Option<HumanDuration>,
    /// Unmeasured time before each run.
    #[arg(long)]
    warmup: Option<HumanDuration>,
    /// Keys of 4 KiB to fill and then use (default 262144 = 1 GiB; --quick 4096).
    #[arg(long)]
    keys: Option<u64>,
    /// Connection counts to run, e.g. 1,4,16.
    #[arg(long, value_delimiter = ',')]
    connections: Option<Vec<usize>>,
    /// Keys per request to run, e.g. 1,16.
    #[arg(long, value_delimiter = ',')]
    batches: Option<Vec<usize>>,
    /// Request mixes: get, put, or GET%/PUT% such as 90/10.
    #[arg(long, value_delimiter = ',')]
    mixes: Option<Vec<Mix>>,
    /// Write the full results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Benchmark the farcache server alone.
    #[arg(long)]
    no_memcached: bool,
    /// memcached -m in MiB (default: enough to hold every key, payload × 1.25 + 64).
    #[arg(long)]
    memcached_memory_mib: Option<u64>,
    /// The farcache server's eviction policy.
    #[arg(long)]
    policy: Option<String>,
    /// Threads of each server (farcache worker_threads, memcached -t).
    #[arg(long)]
    server_threads: Option<u32>,
    /// Run a configuration again, up to this many times, when other processes used the CPUs
    /// during it (default 3; --quick 0).
    #[arg(long)]
    retries: Option<u32>,
}

#[derive(clap::Args)]
struct PolicyArgs {
    /// Short traces and a small cache, for tests.
    #[arg(long)]
    quick: bool,
    /// Write the full results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Skip the runs against the real server (simulation only).
    #[arg(long)]
    no_server: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match a.what {
        What::Server(a) => run_server(a),
        What::Policy(a) => run_policy(a),
    }
}

fn this_binary() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("cannot find this binary's path to start `farcache server`")
}

fn run_server(a: ServerArgs) -> anyhow::Result<()> {
    let exe = this_binary()?;
    let mut o = if a.quick { ServerBenchOptions::quick(exe) } else { ServerBenchOptions::full(exe) };
    if let Some(d) = a.duration {
        o.duration = d.get();
    }
    if let Some(w) = a.warmup {
        o.warmup = w.get();
    }
    if let Some(k) = a.keys {
        o.keys = k;
    }
    if let Some(c) = a.connections {
        o.connections = c;
    }
    if let Some(b) = a.batches {
        o.batches = b;
    }
    if let Some(m) = a.mixes {
        o.mixes = m;
    }
    if let Some(p) = a.policy {
        o.policy = p;
    }
    if let Some(t) = a.server_threads {
        o.server_threads = t;
    }
    if let Some(r) = a.retries {
        o.retries = r;
    }
    o.memcached = !a.no_memcached;
    o.memcached_memory_mib = a.memcached_memory_mib;
    let report = server::run(&o)?;
    print!("{}", server::render(&report));
    if let Some(path) = &a.json {
        write_json(path, &report)?;
    }
    let bad = report.mismatches();
    anyhow::ensure!(bad == 0, "{bad} GET answers carried the wrong value");
    Ok(())
}

fn run_policy(a: PolicyArgs) -> anyhow::Result<()> {
    let exe = this_binary()?;
    let mut o = if a.quick { PolicyBenchOptions::quick(exe) } else { PolicyBenchOptions::full(exe) };
    o.server = !a.no_server;
    let report = policy::run(&o)?;
    print!("{}", policy::render(&report));
    if let Some(path) = &a.json {
        write_json(path, &report)?;
    }
    let bad = report.mismatches();
    anyhow::ensure!(bad == 0, "{bad} GET answers carried the wrong value");
    Ok(())
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write --json {}", path.display()))
}
