//! `farcache bench`: the benchmarks that BENCHMARKS.md reports. Thin: options in, the
//! `farcache-bench` crate does the work, tables out (and JSON on request).

use std::path::{Path, PathBuf};

use anyhow::Context;
use farcache_bench::alloc::{self as alloc_bench, AllocBenchOptions};
use farcache_bench::paper::{self, ConfigKind, DiskProfile, Experiment, PaperOptions};
use farcache_bench::policy::{self, PolicyBenchOptions};
use farcache_bench::server::{self, Mix, ServerBenchOptions};
use farcache_config::{ByteSize, HumanDuration};

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
    /// The division of a lender's memory among tenants: shared, static, hit-ratio and mrc
    /// on a synthetic suite of tenants, through the real server; lender misses side by side.
    Alloc(AllocArgs),
    /// Paper 000's evaluation (Tables 4-6, 9) on a testbed built here (root only): a
    /// throttled loop-device disk, a memory-limited client, lenders in network namespaces;
    /// native, passthrough, farcache and ideal side by side.
    Paper(Box<PaperArgs>),
    /// The stall an application sees when the mount daemon is upgraded in place (SIGHUP to
    /// `--supervise`) or SIGKILLed and restarted (root only): longest request per event and
    /// time until throughput is back to 95%.
    Restart(RestartArgs),
    /// The load generator of `bench paper`, started by it inside the client's cgroups.
    #[command(hide = true)]
    PaperWorker(PaperWorkerArgs),
}

#[derive(clap::Args)]
struct PaperArgs {
    /// One small size per experiment (128 MiB file, 96 MiB client, 256 MiB lender): all four
    /// configurations end to end in a minute or two, then sanity checks.
    #[arg(long)]
    quick: bool,
    /// Remove what earlier runs left (mounts, loop devices, cgroups, namespaces), and exit.
    #[arg(long)]
    cleanup: bool,
    /// Print the tables of an earlier run's JSON again (and rewrite its .md beside it).
    #[arg(long, value_name = "JSON")]
    render: Option<PathBuf>,
    /// Experiments: seqread, randread, pgbench, tpch (transfers, Table 9, comes with each);
    /// paper 003's write-back tier: postmark, dfsio, durable (best with --profile ssd);
    /// paper 002's engine: engine, serial, oltp (go-tpc TPC-C on PostgreSQL); paper 001's migration between two disks: migrate
    /// (best with --profile hdd); paper 004's three PostgreSQL tenants on one lender: tenants.
    /// Default: all (--quick: seqread, randread, tpch).
    /// `transfers` alone means seqread and randread.
    #[arg(long = "experiment", value_delimiter = ',')]
    experiments: Option<Vec<String>>,
    /// Access sizes (= file sizes), e.g. 64MiB,1GiB. Default 64MiB … 2GiB (--quick 128MiB).
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<ByteSize>>,
    /// Configurations: native, passthrough, farcache, ideal; tier-dram, tier-ssd (paper 003's
    /// experiments); farcache-tier (lenders and a dram tier: pgbench); serialized (serial). Default: each experiment's own (native, passthrough,
    /// farcache, ideal; postmark/dfsio/durable: native, passthrough, tier-dram, tier-ssd;
    /// engine: native, passthrough, farcache; serial: native, passthrough, serialized).
    #[arg(long, value_delimiter = ',')]
    configs: Option<Vec<ConfigKind>>,
    /// Disk profile: cloud (3000 IOPS, 125 MB/s), hdd (200 IOPS, 150 MB/s), ssd (20000 IOPS,
    /// 500 MB/s) or raw.
    #[arg(long, default_value = "cloud")]
    profile: DiskProfile,
    /// The client's memory (application + mount daemon). Default 512MiB (--quick 96MiB).
    #[arg(long)]
    memory: Option<ByteSize>,
    /// Number of lenders, each in its own network namespace.
    #[arg(long)]
    lenders: Option<usize>,
    /// Memory each lender lends. Default 1228MiB (1.2 GiB; --quick 256MiB; migrate: a little more
    /// than half of its files).
    #[arg(long)]
    lender_capacity: Option<ByteSize>,
    /// Rate of each lender's link (tc TBF), e.g. 1gbit, 10gbit, or "none".
    #[arg(long, default_value = "1gbit")]
    link: String,
    /// Run the client (the application, the mount daemon, the harness) on the first N CPUs and
    /// the lenders on the others, as if they were other machines (default: all share every
    /// CPU). Not with oltp, which sets its own cpuset (--oltp-cpus).
    #[arg(long, value_name = "N")]
    client_cpus: Option<u32>,
    /// The lenders' eviction policy (default: the server's).
    #[arg(long)]
    policy: Option<String>,
    /// farcache's routing rule, `threshold` or `adaptive` (default: the mount's default).
    #[arg(long, value_parser = ["threshold", "adaptive"])]
    routing: Option<String>,
    /// A configuration file (TOML) every mount of the run is started with (`farcache mount
    /// --config`): an A/B of a setting, e.g. `[mount] writeback_cache = true`.
    #[arg(long, value_name = "FILE")]
    mount_config: Option<std::path::PathBuf>,
    /// Record each mount's counters every DURATION (e.g. 2s; at least 100ms) in
    /// OUT/stats/<run>.stats.jsonl, one JSON document per line (`farcache stats MNT --watch
    /// DURATION --json` beside the mount): the routing's state over a run, and the
    /// passthrough's disk reads beside farcache's, for diagnosis. Off by default: each answer
    /// is a request to the mount's control socket.
    #[arg(long, value_name = "DURATION")]
    watch_stats: Option<farcache_config::HumanDuration>,
    /// O_DIRECT 4 KiB probe reads per randread configuration (0: no probes).
    #[arg(long)]
    probe_reads: Option<u64>,
    /// Seed of the random read sequence.
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds of each pgbench run (default 30; --quick 5).
    #[arg(long)]
    pgbench_secs: Option<u64>,
    /// pgbench client counts, e.g. 1,4,16.
    #[arg(long, value_delimiter = ',')]
    pgbench_clients: Option<Vec<u32>>,
    /// tpch: TPC-H scale factor. Default: about 3× the client's memory (0.75 for 512MiB;
    /// --quick 0.01).
    #[arg(long)]
    tpch_sf: Option<f64>,
    /// tpch: statement_timeout of every query, seconds (default 600; --quick 60).
    #[arg(long)]
    tpch_timeout: Option<u64>,
    /// tpch: deadline of the whole experiment, seconds, shared by the configurations
    /// (default 14400; --quick 600).
    #[arg(long)]
    tpch_deadline: Option<u64>,
    /// tier-dram / tier-ssd: the write-back tier's size (default 2GiB; --quick 256MiB).
    #[arg(long)]
    tier_size: Option<ByteSize>,
    /// tier-ssd / tier-dram / farcache-tier: the tier's commit (`farcache mount --tier-commit`:
    /// fsync, the default, or write).
    #[arg(long, value_parser = ["fsync", "write"])]
    tier_commit: Option<String>,
    /// tier-ssd / tier-dram / farcache-tier: the tier's sequential cutoff
    /// (`farcache mount --tier-sequential-cutoff`; 0 sends every write to the tier).
    #[arg(long)]
    tier_sequential_cutoff: Option<ByteSize>,
    /// postmark: the share of paper 003's Table 1 transactions to run (default 1: the paper's;
    /// --quick 0.001).
    #[arg(long)]
    postmark_scale: Option<f64>,
    /// postmark: the share of Table 1's files (the working set; default 1; --quick 0.1: postmark stops, without a report, once it runs out of files).
    #[arg(long)]
    postmark_files_scale: Option<f64>,
    /// dfsio: the large file's size; the several files are 8 of an eighth each (default
    /// 800MiB; --quick 64MiB).
    #[arg(long)]
    dfsio_size: Option<ByteSize>,
    /// durable: seconds of each load (default 20; --quick 2).
    #[arg(long)]
    durable_secs: Option<u64>,
    /// destage: the region written at random into the tier and written back (default
    /// 512MiB; --quick 32MiB; at most a quarter of --tier-size, under the tier's watermark).
    #[arg(long)]
    destage_size: Option<ByteSize>,
    /// engine, serial: seconds of each fio point (default 10; --quick 1).
    #[arg(long)]
    engine_secs: Option<u64>,
    /// engine: fio points of these kinds only: randread, randwrite (default both).
    #[arg(long, value_delimiter = ',')]
    engine_rw: Vec<String>,
    /// engine: these queue depths only, e.g. 1,16,32 (default 1,4,16,32).
    #[arg(long, value_delimiter = ',')]
    engine_qds: Vec<u32>,
    /// engine: run each fio point in every configuration before the next point (a fresh
    /// mount each time), so that the machine's drift falls on all configurations alike.
    #[arg(long)]
    engine_interleave: bool,
    /// engine, serial: the file's size (default 1GiB; --quick 64MiB).
    #[arg(long)]
    engine_size: Option<ByteSize>,
    /// migrate: files of 4 MiB on the first disk, half of which move (default 128; --quick 16;
    /// the paper: 1024).
    #[arg(long)]
    migrate_files: Option<u64>,
    /// migrate: foreground reader threads, one configuration each (default 1,2,3; --quick 1).
    #[arg(long, value_delimiter = ',')]
    migrate_threads: Option<Vec<u32>>,
    /// migrate: where the copies read from, one configuration each: cache, disk (default both).
    #[arg(long, value_delimiter = ',', value_parser = ["cache", "disk"])]
    migrate_sources: Option<Vec<String>>,
    /// migrate: seconds of foreground before and after the migration (default 20; --quick 3).
    #[arg(long)]
    migrate_phase_secs: Option<u64>,
    /// migrate: keep the configurations the JSON at --out already holds (from an earlier,
    /// interrupted run with the same --migrate-files) and run only the others.
    #[arg(long)]
    resume: bool,
    /// tenants: the three tenants' TPC-H scale factors (default 0.05,0.1,0.15: the paper's
    /// 0.25,0.5,0.75 scaled down; --quick 0.01,0.01,0.01).
    #[arg(long, value_delimiter = ',')]
    tenants_sf: Option<Vec<f64>>,
    /// tenants: runs of the query per tenant (default 10, the paper's; --quick 2).
    #[arg(long)]
    tenants_runs: Option<u32>,
    /// tenants: the lender's capacity points as shares of the databases' total size (default
    /// 0.38, the paper's memory-to-data ratio), e.g. 0.25,0.38,0.6.
    #[arg(long, value_delimiter = ',')]
    tenants_capacity: Option<Vec<f64>>,
    /// tenants: the lender's allocation modes (default shared,static,hit-ratio,mrc; --quick
    /// static,mrc).
    #[arg(long, value_delimiter = ',', value_parser = ["shared", "static", "hit-ratio", "mrc"])]
    tenants_modes: Option<Vec<String>>,
    /// tenants: the query, q4 (PostgreSQL's own plan: sequential scans; the default) or
    /// q4-index (index probes only).
    #[arg(long)]
    tenants_query: Option<paper::tenants::TenantsQuery>,
    /// tenants: each tenant's memory cgroup (default 128MiB; --quick 96MiB).
    #[arg(long)]
    tenants_memory: Option<ByteSize>,
    /// tenants: drop each tenant's database from the page cache before each of its runs
    /// (--quick: on), so that every run reads below the page cache.
    #[arg(long)]
    tenants_drop_cache: bool,
    /// tenants: the mounts' threshold routing (`[cache] routing = "threshold"`, reads this
    /// large or larger to the disk), or "none" for the mount's defaults (adaptive). Default
    /// 1MiB: sequential scans' 128 KiB readahead goes to the lender.
    #[arg(long)]
    tenants_threshold: Option<String>,
    /// tenants: configure the three tenants at the lender (each with a secret its mount
    /// presents) and guarantee each this percent of the lender's capacity as `min_bytes`
    /// (1..=33), so that the "zero min_bytes violations" check can fail. Default: open mode,
    /// every minimum 0.
    #[arg(long, value_name = "PERCENT")]
    tenants_min: Option<u32>,
    /// oltp: TPC-C warehouses (default: about 3× the client's memory on disk, ~115 MiB each;
    /// --quick 1).
    #[arg(long)]
    oltp_warehouses: Option<u32>,
    /// oltp: go-tpc connection counts (default 1,2,4,8,16,32; --quick 1,4).
    #[arg(long, value_delimiter = ',')]
    oltp_connections: Option<Vec<u32>>,
    /// oltp: seconds of each point (default 60; --quick 3).
    #[arg(long)]
    oltp_secs: Option<u64>,
    /// oltp: the loop device's schedulers to compare (default none,mq-deadline,bfq,kyber; those
    /// the kernel lacks are skipped and said so; "" for none).
    #[arg(long, value_delimiter = ',')]
    oltp_schedulers: Option<Vec<String>>,
    /// oltp: CPU counts (cpuset of PostgreSQL, go-tpc and the mount daemon; default 1,2; ""
    /// for none).
    #[arg(long, value_delimiter = ',')]
    oltp_cpus: Option<Vec<String>>,
    /// oltp: connections of the scheduler and CPU points (default 16; --quick 4).
    #[arg(long)]
    oltp_point_connections: Option<u32>,
    /// oltp: configurations that run the scheduler and CPU points (default all; --quick
    /// farcache).
    #[arg(long, value_delimiter = ',')]
    oltp_point_configs: Option<Vec<ConfigKind>>,
    /// Directory for paper-*.json and paper-*.md.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
}

#[derive(clap::Args)]
struct PaperWorkerArgs {
    #[arg(long)]
    op: farcache_bench::paper::worker::Op,
    #[arg(long)]
    file: PathBuf,
    #[arg(long)]
    size: u64,
    #[arg(long)]
    seed: u64,
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
struct RestartArgs {
    /// Three upgrades and three crashes on a 16 MiB file: a smoke run of half a minute.
    #[arg(long)]
    quick: bool,
    /// Upgrades, and as many crashes (default 30; --quick 3).
    #[arg(long)]
    events: Option<usize>,
    /// Where the backing directory and mount point go (removed afterwards). Its file system
    /// must resolve node ids by file handle after a crash (ext4 does; docs/SEMANTICS.md).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Write the full results (every event) as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
struct AllocArgs {
    /// A small lender and short traces: a smoke run of a minute or two.
    #[arg(long)]
    quick: bool,
    /// Allocations to run (default: all four).
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<String>>,
    /// GETs per scenario, all tenants together.
    #[arg(long)]
    requests: Option<usize>,
    /// Scenarios to run (default: all).
    #[arg(long, value_delimiter = ',')]
    scenarios: Option<Vec<String>>,
    /// Rounds per scenario, five per allocation interval (the scenario's length).
    #[arg(long)]
    rounds: Option<usize>,
    /// The lender's `allocation_interval` in milliseconds (the time scale).
    #[arg(long)]
    interval_ms: Option<u64>,
    /// Shares of the lender's capacity at which `mrc` runs the suite again, to compare its
    /// hit ratio with static's at the whole capacity (default 0.7).
    #[arg(long, value_delimiter = ',', conflicts_with = "no_lean")]
    lean: Option<Vec<f64>>,
    /// Do not run `mrc` again with less memory.
    #[arg(long)]
    no_lean: bool,
    /// Instead of the suite: the lender's GET throughput under `mrc` against `shared`
    /// (allocation off), side by side (about 3 minutes; --quick: 10 s).
    #[arg(long)]
    throughput: bool,
    /// Keep each run's server log in this directory, with the allocation timer's decisions
    /// (debug level: per tenant and tick, target, use, prediction, measured hit ratio).
    #[arg(long)]
    server_log: Option<PathBuf>,
    /// Write the full results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
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
        What::Alloc(a) => run_alloc(a),
        What::Paper(a) => run_paper(*a),
        What::Restart(a) => run_restart(a),
        What::PaperWorker(a) => {
            let w = paper::worker::WorkerArgs { op: a.op, file: a.file, size: a.size, seed: a.seed };
            Ok(paper::worker::run(&w)?)
        }
    }
}

fn run_restart(a: RestartArgs) -> anyhow::Result<()> {
    use farcache_bench::restart::{self, RestartBenchOptions};
    let exe = this_binary()?;
    let dir = a.dir.join(format!("farcache-bench-restart-{}", std::process::id()));
    let mut o = if a.quick {
        RestartBenchOptions::quick(exe, dir.clone())
    } else {
        RestartBenchOptions::full(exe, dir.clone())
    };
    if let Some(n) = a.events {
        o.events = n;
    }
    println!(
        "bench restart: {} upgrades and {} crashes of a supervised --no-remote mount under {}; reader and writer of \
         4 KiB O_DIRECT, queue depth 1",
        o.events,
        o.events,
        dir.display()
    );
    let report = restart::run(&o, &|line| eprintln!("{line}"));
    let _ = std::fs::remove_dir_all(&dir);
    let report = report?;
    print!("{}", restart::render(&report));
    if let Some(p) = a.json {
        std::fs::write(&p, serde_json::to_vec_pretty(&report)?).with_context(|| format!("write {}", p.display()))?;
    }
    Ok(())
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

fn run_alloc(a: AllocArgs) -> anyhow::Result<()> {
    let exe = this_binary()?;
    if a.throughput {
        use alloc_bench::throughput::{self, ThroughputOptions};
        let o = if a.quick { ThroughputOptions::quick(exe) } else { ThroughputOptions::full(exe) };
        let report = throughput::run(&o)?;
        print!("{}", throughput::render(&report));
        if let Some(path) = &a.json {
            write_json(path, &report)?;
        }
        let bad = report.mismatches();
        anyhow::ensure!(bad == 0, "{bad} GET answers carried the wrong value");
        return Ok(());
    }
    let mut o = if a.quick { AllocBenchOptions::quick(exe) } else { AllocBenchOptions::full(exe) };
    if let Some(m) = a.modes {
        o.modes = m
            .iter()
            .map(|x| x.parse().map_err(|e: String| anyhow::anyhow!("--modes: {e}")))
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(r) = a.requests {
        o.requests = r;
    }
    if let Some(r) = a.rounds {
        o.rounds = r;
    }
    if let Some(s) = a.scenarios {
        o.only = s;
    }
    if let Some(ms) = a.interval_ms {
        o.interval = std::time::Duration::from_millis(ms);
    }
    if let Some(l) = a.lean {
        o.lean = l;
    }
    if a.no_lean {
        o.lean.clear();
    }
    o.server_log = a.server_log;
    let report = alloc_bench::run(&o)?;
    print!("{}", alloc_bench::render(&report));
    if let Some(path) = &a.json {
        write_json(path, &report)?;
    }
    Ok(())
}

fn run_paper(a: PaperArgs) -> anyhow::Result<()> {
    if a.cleanup {
        let done = paper::cleanup::cleanup();
        if done.is_empty() {
            println!("paper: nothing left over from earlier runs");
        }
        for l in &done {
            println!("paper: {l}");
        }
        anyhow::ensure!(
            !done.iter().any(|l| l.starts_with("could not") || l.contains("needs root")),
            "cleanup incomplete"
        );
        return Ok(());
    }
    if let Some(path) = &a.render {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut report: paper::PaperReport =
            serde_json::from_str(&text).with_context(|| format!("{} is not a bench paper report", path.display()))?;
        report.evaluate();
        let md = paper::render(&report);
        print!("{md}");
        std::fs::write(path.with_extension("md"), &md)?;
        return Ok(());
    }
    let exe = this_binary()?;
    let mut o = if a.quick { PaperOptions::quick(exe) } else { PaperOptions::full(exe) };
    if let Some(names) = a.experiments {
        let mut list: Vec<Experiment> = Vec::new();
        for n in names {
            let add: Vec<Experiment> = if n == "transfers" {
                vec![Experiment::Seqread, Experiment::Randread]
            } else {
                vec![n.parse().map_err(|e: String| anyhow::anyhow!("--experiment: {e}"))?]
            };
            for e in add {
                if !list.contains(&e) {
                    list.push(e);
                }
            }
        }
        o.experiments = list;
    }
    if let Some(s) = a.sizes {
        o.sizes_bytes = s.iter().map(|b| b.bytes()).collect();
    }
    match a.configs {
        Some(c) => o.configs = c,
        // Each experiment runs in its own configurations (paper 000's four, paper 003's four).
        None => {
            for e in o.experiments.clone() {
                for c in e.own_configs() {
                    if !o.configs.contains(c) {
                        o.configs.push(*c);
                    }
                }
            }
            o.configs.retain(|c| o.experiments.iter().any(|e| e.runs_in(*c)));
        }
    }
    for e in &o.experiments {
        anyhow::ensure!(
            !o.configs_for(*e).is_empty(),
            "--configs: none of them runs {} (it runs in {})",
            e.name(),
            e.own_configs().iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
        );
    }
    o.profile = a.profile;
    if let Some(m) = a.memory {
        o.memory_bytes = m.bytes();
    }
    if let Some(n) = a.lenders {
        o.lenders = n;
    }
    if let Some(c) = a.lender_capacity {
        o.lender_capacity_bytes = c.bytes();
        // migrate sizes its lender to its files unless told.
        o.migrate_lender_bytes = Some(c.bytes());
    }
    o.link_rate = (a.link != "none").then_some(a.link);
    if let Some(n) = a.client_cpus {
        anyhow::ensure!(
            !o.experiments.contains(&Experiment::Oltp),
            "--client-cpus: not with the oltp experiment, which puts the client in a cpuset of its own \
             (--oltp-cpus); run oltp without it"
        );
        o.client_cpus = Some(n);
    }
    o.policy = a.policy;
    o.routing = a.routing;
    if let Some(c) = a.mount_config {
        // Checked now, in full: a bad file would otherwise fail every configuration's mount.
        crate::config::Config::load_from("--mount-config", &c)?;
        o.mount_config = Some(std::path::absolute(&c)?);
    }
    if let Some(w) = a.watch_stats {
        // The harness runs `farcache stats --watch`: the same floor, refused here before a testbed is built.
        anyhow::ensure!(
            w.get() >= super::stats::MIN_WATCH,
            "--watch-stats {w}: give an interval of at least {}, such as 2s",
            farcache_config::HumanDuration(super::stats::MIN_WATCH)
        );
        o.watch_stats_ms = Some(w.get().as_millis() as u64);
        o.stats_dir = std::path::absolute(a.out.join("stats"))?;
    }
    if let Some(n) = a.probe_reads {
        o.probe_reads = n;
    }
    if let Some(s) = a.seed {
        o.seed = s;
    }
    if let Some(s) = a.pgbench_secs {
        o.pgbench_secs = s.max(1);
    }
    if let Some(c) = a.pgbench_clients {
        o.pgbench_clients = c;
    }
    if let Some(sf) = a.tpch_sf {
        anyhow::ensure!(sf > 0.0 && sf <= 100.0, "--tpch-sf: more than 0, at most 100");
        o.tpch_scale_factor = Some(sf);
    }
    if let Some(t) = a.tpch_timeout {
        o.tpch_statement_timeout_secs = t.max(1);
    }
    if let Some(t) = a.tier_size {
        anyhow::ensure!(t.bytes() >= 64 << 20, "--tier-size: at least 64MiB");
        o.tier_bytes = t.bytes();
    }
    if let Some(c) = &a.tier_commit {
        o.tier_commit = Some(c.clone());
    }
    if let Some(n) = a.tier_sequential_cutoff {
        o.tier_sequential_cutoff = Some(n.bytes());
    }
    if let Some(x) = a.postmark_scale {
        anyhow::ensure!(x > 0.0 && x <= 1.0, "--postmark-scale: more than 0, at most 1");
        o.postmark_scale = x;
    }
    if let Some(x) = a.postmark_files_scale {
        anyhow::ensure!(x > 0.0 && x <= 1.0, "--postmark-files-scale: more than 0, at most 1");
        o.postmark_files_scale = x;
    }
    if let Some(d) = a.dfsio_size {
        anyhow::ensure!(d.bytes() >= 8 << 20, "--dfsio-size: at least 8MiB");
        o.dfsio_bytes = d.bytes();
    }
    if let Some(d) = a.destage_size {
        anyhow::ensure!(d.bytes() >= 4 << 20, "--destage-size: at least 4MiB");
        o.destage_bytes = d.bytes();
    }
    if let Some(d) = a.durable_secs {
        anyhow::ensure!((1..=3600).contains(&d), "--durable-secs: 1 to 3600");
        o.durable_secs = d;
    }
    if let Some(d) = a.engine_secs {
        anyhow::ensure!((1..=600).contains(&d), "--engine-secs: 1 to 600");
        o.engine_secs = d;
    }
    for rw in &a.engine_rw {
        anyhow::ensure!(rw == "randread" || rw == "randwrite", "--engine-rw: randread or randwrite, not {rw:?}");
    }
    o.engine_rw = a.engine_rw.clone();
    for q in &a.engine_qds {
        anyhow::ensure!((1..=1024).contains(q), "--engine-qds: 1 to 1024");
    }
    o.engine_qds = a.engine_qds.clone();
    o.engine_interleave = a.engine_interleave;
    if let Some(d) = a.engine_size {
        anyhow::ensure!(
            d.bytes() >= 16 << 20 && d.bytes() % (1 << 20) == 0,
            "--engine-size: whole MiB, at least 16MiB"
        );
        o.engine_file_bytes = d.bytes();
    }
    if let Some(d) = a.tpch_deadline {
        o.tpch_deadline_secs = d.max(60);
    }
    if let Some(n) = a.migrate_files {
        anyhow::ensure!(
            (2..=paper::migrate::MAX_FILES).contains(&n),
            "--migrate-files: 2 to {}",
            paper::migrate::MAX_FILES
        );
        o.migrate_files = n;
    }
    if let Some(t) = a.migrate_threads {
        anyhow::ensure!(!t.is_empty() && t.iter().all(|t| (1..=64).contains(t)), "--migrate-threads: 1 to 64 each");
        o.migrate_threads = t;
    }
    if let Some(s) = a.migrate_sources {
        o.migrate_sources = s;
    }
    if let Some(s) = a.migrate_phase_secs {
        anyhow::ensure!((1..=3600).contains(&s), "--migrate-phase-secs: 1 to 3600");
        o.migrate_phase_secs = s;
    }
    if let Some(sf) = a.tenants_sf {
        anyhow::ensure!(
            !sf.is_empty() && sf.len() <= 8 && sf.iter().all(|x| *x >= 0.01 && *x <= 10.0),
            "--tenants-sf: 1 to 8 scale factors, each 0.01 to 10 (the paper: 0.25,0.5,0.75)"
        );
        o.tenants_sf = sf;
    }
    if let Some(n) = a.tenants_runs {
        anyhow::ensure!((1..=100).contains(&n), "--tenants-runs: 1 to 100");
        o.tenants_runs = n;
    }
    if let Some(c) = a.tenants_capacity {
        anyhow::ensure!(
            !c.is_empty() && c.iter().all(|x| *x > 0.0 && *x <= 4.0),
            "--tenants-capacity: shares of the databases' size, more than 0, at most 4 (e.g. 0.25,0.38,0.6)"
        );
        o.tenants_capacity = c;
    }
    if let Some(m) = a.tenants_modes {
        o.tenants_modes = m;
    }
    if let Some(q) = a.tenants_query {
        o.tenants_query = q;
    }
    if a.tenants_drop_cache {
        o.tenants_drop_cache = true;
    }
    if let Some(t) = a.tenants_threshold {
        o.tenants_threshold = if t == "none" {
            None
        } else {
            let b: ByteSize = t.parse().map_err(|e| anyhow::anyhow!("--tenants-threshold: {e}"))?;
            anyhow::ensure!(
                b.bytes() >= 4096 && b.bytes() <= 1 << 20 && b.bytes().is_multiple_of(4096),
                "--tenants-threshold: a multiple of 4KiB, 4KiB to 1MiB, or none"
            );
            Some(b.bytes())
        };
    }
    if let Some(p) = a.tenants_min {
        anyhow::ensure!(
            (1..=33).contains(&p),
            "--tenants-min: a percent of the lender's capacity, 1..=33 (three tenants' minimums must fit)"
        );
        o.tenants_min_percent = Some(p);
    }
    if let Some(m) = a.tenants_memory {
        anyhow::ensure!(m.bytes() >= 64 << 20, "--tenants-memory: at least 64MiB (PostgreSQL and the mount daemon)");
        o.tenants_memory_bytes = m.bytes();
    }
    let max_conn = paper::oltp::MAX_CLIENT_CONNECTIONS;
    if let Some(w) = a.oltp_warehouses {
        anyhow::ensure!((1..=1000).contains(&w), "--oltp-warehouses: 1 to 1000");
        o.oltp_warehouses = Some(w);
    }
    if let Some(c) = a.oltp_connections {
        anyhow::ensure!(
            !c.is_empty() && c.iter().all(|c| (1..=max_conn).contains(c)),
            "--oltp-connections: 1 to {max_conn} each"
        );
        o.oltp_connections = c;
    }
    if let Some(x) = a.oltp_secs {
        anyhow::ensure!((1..=3600).contains(&x), "--oltp-secs: 1 to 3600");
        o.oltp_secs = x;
    }
    if let Some(sc) = a.oltp_schedulers {
        let sc: Vec<String> = sc.into_iter().filter(|x| !x.is_empty()).collect();
        for x in &sc {
            anyhow::ensure!(
                x.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
                "--oltp-schedulers: names such as none, mq-deadline, bfq, kyber, not {x:?}"
            );
        }
        o.oltp_schedulers = sc;
    }
    if let Some(c) = a.oltp_cpus {
        o.oltp_cpus = c
            .iter()
            .filter(|x| !x.is_empty())
            .map(|x| x.parse::<u32>().ok().filter(|n| (1..=1024).contains(n)))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| anyhow::anyhow!("--oltp-cpus: CPU counts, 1 to 1024 each (e.g. 1,2)"))?;
    }
    if let Some(n) = a.oltp_point_connections {
        anyhow::ensure!((1..=max_conn).contains(&n), "--oltp-point-connections: 1 to {max_conn}");
        o.oltp_point_connections = n;
    }
    if let Some(c) = a.oltp_point_configs {
        o.oltp_point_configs = c;
    }
    anyhow::ensure!(
        o.sizes_bytes.iter().all(|s| *s >= 1 << 20 && s.trailing_zeros() >= 12),
        "--sizes: whole 4 KiB blocks, at least 1MiB"
    );
    anyhow::ensure!(o.lenders >= 1 && o.lenders <= 32, "--lenders: 1 to 32");
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create --out {}", a.out.display()))?;
    // Paper 003's experiments alone keep their own files (a cloud run of them does not
    // overwrite paper 000's paper-cloud.json).
    let family = if o.experiments.iter().all(|e| e.of_the_tier()) {
        "paper003"
    } else if o.experiments.iter().all(|e| e.of_the_engine()) {
        "paper002"
    } else if o.experiments.iter().all(|e| *e == Experiment::Migrate) {
        "paper001"
    } else if o.experiments.iter().all(|e| *e == Experiment::Tenants) {
        "paper004"
    } else if o.experiments.iter().all(|e| *e == Experiment::Oltp) {
        "paper002-oltp"
    } else {
        "paper"
    };
    let stem = if o.quick { format!("{family}-quick") } else { format!("{family}-{}", o.profile.name()) };
    let json = a.out.join(format!("{stem}.json"));
    let md = a.out.join(format!("{stem}.md"));
    if a.resume {
        if let Ok(text) = std::fs::read_to_string(&json) {
            let earlier: paper::PaperReport = serde_json::from_str(&text)
                .with_context(|| format!("--resume: {} is not a bench paper report; move it away", json.display()))?;
            o.migrate_resume = earlier.migrate_runs.into_iter().filter(|r| r.error.is_none()).collect();
            eprintln!("paper: --resume: {} configuration(s) done before, kept", o.migrate_resume.len());
            o.oltp_resume = earlier.oltp.into_iter().filter(|r| r.error.is_none()).collect();
            o.oltp_resume_setup = earlier.oltp_setup;
            if !o.oltp_resume.is_empty() {
                eprintln!("paper: --resume: {} oltp point(s) done before", o.oltp_resume.len());
            }
        }
    }
    // tenants: the points the results file holds are kept, the others run (resumable).
    if o.experiments.contains(&Experiment::Tenants) {
        if let Ok(text) = std::fs::read_to_string(&json) {
            let earlier: paper::PaperReport = serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not a bench paper report: move it away to start the tenants experiment afresh",
                    json.display()
                )
            })?;
            o.tenants_resume = earlier.tenants_runs.into_iter().filter(|r| r.error.is_none()).collect();
            o.tenants_resume_setup = earlier.tenants_setup;
            eprintln!("paper: tenants: {} point(s) done before in {}, kept", o.tenants_resume.len(), json.display());
        }
    }
    let mut save = |r: &paper::PaperReport| {
        if let Err(e) = write_json(&json, r) {
            eprintln!("paper: warning: {e:#}");
        }
    };
    let report = paper::run(&o, &mut save)?;
    save(&report);
    let text = paper::render(&report);
    print!("{text}");
    std::fs::write(&md, &text).with_context(|| format!("cannot write {}", md.display()))?;
    println!("\nResults: {} and {}", json.display(), md.display());
    let failed = report.checks_failed();
    anyhow::ensure!(
        failed.is_empty(),
        "{} sanity check(s) failed: {}",
        failed.len(),
        failed.iter().map(|c| format!("{} ({})", c.what, c.measured)).collect::<Vec<_>>().join("; ")
    );
    Ok(())
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write --json {}", path.display()))
}
