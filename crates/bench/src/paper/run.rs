//! Driving the experiments: for each experiment, access size and configuration, a cold
//! start (ext4 remounted, a new memory cgroup, fresh lenders and mount), two passes with
//! every counter read between them, then (randread) the O_DIRECT probes.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::progress::{Progress, Unit};

use super::cgroup::Cgroup;
use super::child::Child;
use super::counters::{
    lender_totals, process_cpu_ms, process_sys_ms, switch_groups_since, thread_groups_since, thread_stats,
    LenderTotals, ThreadStat,
};
use super::mount::{MountCounters, MountDaemon};
use super::report::{PaperReport, PassRecord, ProbeRecord, RunRecord, Transfers};
use super::testbed::{DiskStat, Lenders, Testbed, TestbedSpec};
use super::worker::{PassOutcome, BLOCK};
use super::{human, pgbench, sys, tpch, ConfigKind, Experiment, PaperOptions};
use crate::machine::CpuSnapshot;
use crate::{BenchError, Result};

/// Counters at one instant.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Snapshot {
    pub(super) disk: DiskStat,
    pub(super) lenders: LenderTotals,
    pub(super) mount: Option<MountCounters>,
    /// The mount daemon's CPU time so far (user + system, ms), when there is one.
    pub(super) daemon_cpu_ms: Option<f64>,
    /// … of which system (kernel) time.
    pub(super) daemon_sys_ms: Option<f64>,
    /// Its threads' own counters, to split a pass's CPU and context switches by thread.
    #[serde(skip)]
    pub(super) daemon_threads: std::collections::HashMap<u32, ThreadStat>,
}

/// Lender namespaces the testbed needs: `o.lenders` if any configuration borrows lenders'
/// RAM (`farcache`, `farcache-tier`), else none. (Made only for `farcache`, a run of
/// `farcache-tier` without it had no lenders, and measured the tier alone.)
fn testbed_lenders(o: &PaperOptions) -> usize {
    if o.configs.iter().any(|c| c.has_lenders()) {
        o.lenders
    } else {
        0
    }
}

/// Puts this process back on every CPU when dropped (after `--client-cpus`).
struct Unpin(u32);

impl Drop for Unpin {
    fn drop(&mut self) {
        if let Err(e) = sys::pin_process(0..self.0) {
            note!("paper: warning: {e}");
        }
    }
}

/// Run everything `o` asks for; `progress` sees the report after every configuration (to
/// save partial results). The testbed is gone when this returns, whatever happened.
pub fn run(o: &PaperOptions, progress: &mut dyn FnMut(&PaperReport)) -> Result<PaperReport> {
    sys::install_signal_handlers();
    let started = Instant::now();
    let mut report = PaperReport::new(o);
    // --client-cpus: the harness, and all it starts, on the client's CPUs; the lenders on the
    // rest. Put back when the run ends, however it ends.
    let online = sys::cpus_online();
    let _pinned = match o.client_cpus {
        Some(n) if n == 0 || n >= online => {
            return Err(BenchError::Setup(format!(
                "--client-cpus {n}: this machine has {online} CPUs; give the client 1 to {} and the lenders the rest",
                online.saturating_sub(1)
            )))
        }
        Some(n) => {
            let unpin = Unpin(online);
            sys::pin_process(0..n)?;
            sys::check_pinned(std::process::id(), "the harness", 0..n)?;
            note!("paper: --client-cpus {n}: the client on CPUs 0..{n}, the lenders on {n}..{online}");
            Some(unpin)
        }
        None => None,
    };
    let spec = TestbedSpec {
        exe: o.exe.clone(),
        disk_bytes: o.disk_bytes(),
        profile: o.profile,
        lenders: testbed_lenders(o),
        link_rate: o.link_rate.clone(),
        lender_cpus: o.client_cpus.map(|n| n..online),
    };
    let mut tb = Testbed::create(spec)?;
    note!("paper: logs in {}", tb.logs.display());
    note!(
        "paper: testbed {}: {} ext4 on {} ({}), memory cgroup {}, {} lender(s) of {} over {}",
        tb.prefix,
        human(o.disk_bytes()),
        tb.loopdev,
        o.profile.describe(),
        human(o.memory_bytes),
        tb.nets.len(),
        // migrate sizes its lenders to its files.
        human(if o.experiments == [Experiment::Migrate] {
            super::migrate::lender_of(o)
        } else {
            o.lender_capacity_bytes
        }),
        o.link_rate.as_deref().unwrap_or("unshaped veth")
    );
    // One step per experiment × size × configuration (pgbench and tpch: per configuration).
    let steps: usize = o
        .experiments
        .iter()
        .map(|&e| match e {
            Experiment::Migrate => o.migrate_sources.len() * o.migrate_threads.len(),
            Experiment::Tenants => o.tenants_capacity.len() * o.tenants_modes.len(),
            e if e.per_size() => o.sizes_bytes.len() * o.configs_for(e).len(),
            e => o.configs_for(e).len(),
        })
        .sum();
    let bar = Progress::new("paper", steps as u64, Unit::Items("runs")).every(Duration::from_secs(60));
    for &exp in &o.experiments {
        if exp == Experiment::Pgbench {
            run_pgbench(&mut tb, o, &mut report, progress, &bar)?;
            report.secs_total = started.elapsed().as_secs_f64();
            continue;
        }
        if exp == Experiment::Tpch {
            run_tpch(&mut tb, o, &mut report, progress, &bar)?;
            report.secs_total = started.elapsed().as_secs_f64();
            continue;
        }
        if exp.of_the_engine() {
            super::engine::run_experiment(&mut tb, o, exp, &mut report, progress, &bar)?;
            report.secs_total = started.elapsed().as_secs_f64();
            continue;
        }
        if exp == Experiment::Tenants {
            super::tenants::run_experiment(&mut tb, o, &mut report, progress, &bar)?;
            report.secs_total = started.elapsed().as_secs_f64();
            continue;
        }
        if exp == Experiment::Oltp {
            super::oltp::run_experiment(&mut tb, o, &mut report, progress, &bar)?;
            report.secs_total = started.elapsed().as_secs_f64();
            continue;
        }
        if exp == Experiment::Migrate {
            super::migrate::run_experiment(&mut tb, o, &mut report, progress, &bar)?;
            report.secs_total = started.elapsed().as_secs_f64();
            continue;
        }
        if exp.of_the_tier() {
            super::writeback::run_experiment(&mut tb, o, exp, &mut report, progress, &bar)?;
            report.secs_total = started.elapsed().as_secs_f64();
            continue;
        }
        for &size in &o.sizes_bytes {
            sys::check_interrupt()?;
            let t = Instant::now();
            let file = tb.ensure_file(size)?;
            note!("paper: {} file {file} ready in {:.1} s", human(size), t.elapsed().as_secs_f64());
            for cfg in o.configs_for(exp) {
                bar.message(format!("{} {} {}", exp.name(), human(size), cfg.name()));
                let rec = match run_one(&mut tb, o, exp, size, cfg, &file) {
                    Ok(r) => r,
                    Err(e) if sys::interrupted() => return Err(e),
                    Err(e) => {
                        note!("paper: {} {} {}: FAILED: {e}", exp.name(), human(size), cfg.name());
                        RunRecord::failed(exp, size, cfg, e.to_string())
                    }
                };
                report.runs.push(rec);
                report.secs_total = started.elapsed().as_secs_f64();
                progress(&report);
                bar.inc(1);
            }
        }
    }
    bar.finish();
    drop(tb);
    report.finish(started.elapsed().as_secs_f64());
    Ok(report)
}

/// An experiment's one-time setup: `Some` of it, or `None` with its failure noted (`what:
/// error`) and kept in `error`, so that the run goes on with the other experiments; an
/// interrupt ends the run.
pub(super) fn setup_or_note<T>(what: &str, setup: Result<T>, error: &mut Option<String>) -> Result<Option<T>> {
    match setup {
        Ok(s) => Ok(Some(s)),
        Err(e) if sys::interrupted() => Err(e),
        Err(e) => {
            note!("paper: {what}: {e}");
            *error = Some(e.to_string());
            Ok(None)
        }
    }
}

/// pgbench: the database once, then every configuration; a configuration that fails is
/// recorded as failed and the others still run.
fn run_pgbench(
    tb: &mut Testbed,
    o: &PaperOptions,
    report: &mut PaperReport,
    progress: &mut dyn FnMut(&PaperReport),
    bar: &Progress,
) -> Result<()> {
    bar.message("pgbench: making the database");
    let Some(setup) =
        setup_or_note("pgbench: FAILED to make the database", pgbench::prepare(tb, o), &mut report.pgbench_error)?
    else {
        return Ok(());
    };
    report.pgbench_setup = Some(setup);
    for cfg in o.configs_for(Experiment::Pgbench) {
        bar.message(format!("pgbench {}", cfg.name()));
        match pgbench::run_config(tb, o, cfg) {
            Ok(recs) => report.pgbench.extend(recs),
            Err(e) if sys::interrupted() => return Err(e),
            Err(e) => {
                note!("paper: pgbench {}: FAILED: {e}", cfg.name());
                report.pgbench.push(pgbench::PgRecord::failed(cfg, e.to_string()));
            }
        }
        progress(report);
        bar.inc(1);
    }
    Ok(())
}

/// tpch: the data and the empty cluster once, then every configuration; a configuration that
/// fails is recorded with its error and the others still run.
fn run_tpch(
    tb: &mut Testbed,
    o: &PaperOptions,
    report: &mut PaperReport,
    progress: &mut dyn FnMut(&PaperReport),
    bar: &Progress,
) -> Result<()> {
    bar.message("tpch: making the data");
    let Some(setup) = setup_or_note("tpch: FAILED to make the data", tpch::prepare(tb, o), &mut report.tpch_error)?
    else {
        return Ok(());
    };
    report.tpch_setup = Some(setup.clone());
    for cfg in o.configs_for(Experiment::Tpch) {
        bar.message(format!("tpch {}", cfg.name()));
        match tpch::run_config(tb, o, &setup, cfg) {
            Ok(rec) => report.tpch.push(rec),
            Err(e) if sys::interrupted() => return Err(e),
            Err(e) => {
                note!("paper: tpch {}: FAILED: {e}", cfg.name());
                report.tpch.push(tpch::TpchRecord::failed(cfg, e.to_string()));
            }
        }
        progress(report);
        bar.inc(1);
    }
    Ok(())
}

/// An upper bound for one pass: three times what the disk's caps allow, plus a minute.
fn pass_limit(o: &PaperOptions, exp: Experiment, size: u64) -> Duration {
    let reads = size / BLOCK as u64;
    let secs = match (o.profile.limits(), exp) {
        (Some((_, bps)), Experiment::Seqread) => size / bps,
        (Some((iops, bps)), Experiment::Randread) => reads / iops + size / bps,
        (None, Experiment::Seqread) => size / 20_000_000,
        (None, Experiment::Randread) => reads / 2_000,
        (_, Experiment::Pgbench) => o.pgbench_secs * 3,
        (_, Experiment::Tpch) => o.tpch_deadline_secs,
        // They bound their own steps (writeback.rs).
        (
            _,
            Experiment::Postmark
            | Experiment::Dfsio
            | Experiment::Durable
            | Experiment::Destage
            | Experiment::Engine
            | Experiment::Serial
            | Experiment::Migrate
            | Experiment::Tenants
            | Experiment::Oltp,
        ) => 0,
    };
    Duration::from_secs(3 * secs + 60)
}

pub(super) fn snapshot(
    tb: &Testbed,
    lenders: &[std::net::SocketAddr],
    mount: Option<&mut MountDaemon>,
) -> Result<Snapshot> {
    // The CPU first: the stats command below is the daemon's work too, and not the pass's.
    let daemon_cpu_ms = mount.as_ref().map(|m| process_cpu_ms(m.pid()));
    let daemon_sys_ms = mount.as_ref().map(|m| process_sys_ms(m.pid()));
    let daemon_threads = mount.as_ref().map(|m| thread_stats(m.pid())).unwrap_or_default();
    Ok(Snapshot {
        disk: tb.disk_stat(),
        lenders: if lenders.is_empty() { LenderTotals::default() } else { lender_totals(lenders)? },
        mount: mount.and_then(|m| m.stats_now()).map(|(c, _)| c),
        daemon_cpu_ms,
        daemon_sys_ms,
        daemon_threads,
    })
}

fn start_worker(
    o: &PaperOptions,
    exp: Experiment,
    file: &Path,
    size: u64,
    cgroups: &[&Cgroup],
    log: &Path,
) -> Result<Child> {
    let mut cmd = Command::new(&o.exe);
    cmd.args(["bench", "paper-worker", "--op", exp.name(), "--file"])
        .arg(file)
        .args(["--size", &size.to_string(), "--seed", &o.seed.to_string()])
        .env("FARCACHE_LOG", "warn");
    let procs: Vec<_> = cgroups.iter().map(|c| c.procs()).collect();
    let refs: Vec<&Path> = procs.iter().map(|p| p.as_path()).collect();
    sys::confine(&mut cmd, &refs);
    let mut w = Child::spawn("load generator", cmd, log, true)?;
    let hello: serde_json::Value = parse_line(&w.next_line(Duration::from_secs(30))?)?;
    // The worker must be where the harness put it before it does any work.
    let seen = hello["cgroups"].to_string();
    for c in cgroups {
        let name = c.path().file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        if !seen.contains(&format!("/{name}\"")) {
            return Err(BenchError::Setup(format!("the load generator is not in cgroup {name}: {seen}")));
        }
    }
    Ok(w)
}

fn parse_line<T: serde::de::DeserializeOwned>(line: &str) -> Result<T> {
    serde_json::from_str(line).map_err(|e| BenchError::Setup(format!("load generator said {line:?}: {e}")))
}

/// How often a long pass says it is still going.
const HEARTBEAT: Duration = Duration::from_secs(30);

/// Send `cmd` to the load generator and wait for its answer, at most `limit`, saying every
/// [`HEARTBEAT`] that it is still running.
fn ask(w: &mut Child, cmd: &str, limit: Duration, label: &str) -> Result<PassOutcome> {
    w.send(cmd)?;
    let start = Instant::now();
    loop {
        let left = limit.saturating_sub(start.elapsed());
        if let Some(line) = w.try_line(left.min(HEARTBEAT))? {
            return parse_line(&line);
        }
        if start.elapsed() >= limit {
            return Err(BenchError::Setup(format!(
                "[{label}] `{cmd}` took more than {limit:?} (bounded wait); the load generator's log ends:\n{}",
                w.log_tail()
            )));
        }
        note!("paper: [{label}] {cmd}: still running after {:.0} s", start.elapsed().as_secs_f64());
    }
}

fn run_one(
    tb: &mut Testbed,
    o: &PaperOptions,
    exp: Experiment,
    size: u64,
    cfg: ConfigKind,
    file: &str,
) -> Result<RunRecord> {
    let label = format!("{} {} {}", exp.name(), human(size), cfg.name());
    let t0 = Instant::now();
    tb.remount()?;
    let cached_at_start = super::testbed::cached_pages(&tb.ext4.join(file));
    let limit = (cfg != ConfigKind::Ideal).then_some(o.memory_bytes);
    let mem = tb.memory_cgroup(limit)?;
    let n = tb.logs.join(format!("{}-{}-{}", exp.name(), human(size), cfg.name()));
    let log = |what: &str| n.with_file_name(format!("{}.{what}.log", n.file_name().unwrap().to_string_lossy()));
    let mut lenders = match cfg {
        ConfigKind::Farcache => Some(tb.start_lenders(o.lender_capacity_bytes, o.policy.as_deref())?),
        _ => None,
    };
    let addrs: Vec<_> = lenders.as_ref().map(|l| l.addrs.clone()).unwrap_or_default();
    let remote = lenders.as_ref().map(|l| &l.addrs[..]);
    let mut mount = MountDaemon::for_config(tb, o, cfg, remote, &[], &[&mem, &tb.blkio], &log("mount"))?;
    let dir = if mount.is_some() { &tb.mnt } else { &tb.ext4 };
    let mut w = start_worker(o, exp, &dir.join(file), size, &[&mem, &tb.blkio], &log("worker"))?;
    let mut own = vec![std::process::id(), w.pid()];
    own.extend(mount.as_ref().map(|m| m.pid()));
    own.extend(lenders.iter().flat_map(|l| l.procs.iter().map(|p| p.pid())));
    let cpu0 = CpuSnapshot::take(&own);

    let mut rec = RunRecord::new(exp, size, cfg, limit);
    rec.cached_pages_at_start = cached_at_start;
    if let Err(e) = measure(tb, o, exp, size, &label, &mem, &addrs, mount.as_mut(), &mut w, &mut rec) {
        if sys::interrupted() {
            return Err(e);
        }
        // Say why: the daemon's last words and the cgroup's OOM kills.
        let mut msg = e.to_string();
        // The load generator first: it may be blocked in a read of the mount.
        w.stop();
        let ended = mount.as_mut().and_then(MountDaemon::ended);
        if let Some(m) = mount.as_mut() {
            m.stop();
            msg.push_str(&format!("\nthe mount daemon's log ends:\n{}", m.log_tail()));
        }
        if let Some(k) = oom_kills(&mem).filter(|k| *k > 0) {
            let victim = super::mount::oom_victim(ended, "the load generator");
            msg.push_str(&format!("\n{k} OOM kill(s) in the client's memory cgroup, of {victim}"));
        }
        return Err(BenchError::Setup(msg));
    }
    rec.other_cpus = CpuSnapshot::take(&own).since(&cpu0).cpus;
    let _ = w.send("quit");
    w.close_stdin();
    w.wait_exit(Duration::from_secs(10));
    drop(w);
    let t = tear_down(&mem, mount, lenders.as_mut());
    (rec.memory_max_usage_bytes, rec.oom_kills, rec.daemon_rss_bytes, rec.daemon_anon_bytes) =
        (t.memory_max_usage_bytes, t.oom_kills, t.daemon_rss_bytes, t.daemon_anon_bytes);
    rec.mount = rec.mount.or(t.mount_at_exit);
    rec.secs_total = t0.elapsed().as_secs_f64();
    Ok(rec)
}

/// The two passes and the probes of one configuration, every counter read in between.
#[allow(clippy::too_many_arguments)]
fn measure(
    tb: &Testbed,
    o: &PaperOptions,
    exp: Experiment,
    size: u64,
    label: &str,
    mem: &Cgroup,
    addrs: &[std::net::SocketAddr],
    mut mount: Option<&mut MountDaemon>,
    w: &mut Child,
    rec: &mut RunRecord,
) -> Result<()> {
    let first = snapshot(tb, addrs, mount.as_deref_mut())?;
    let mut prev = first.clone();
    let plimit = pass_limit(o, exp, size);
    for pass in 1..=2u32 {
        let out = ask(w, "pass", plimit, label)?;
        let now = snapshot(tb, addrs, mount.as_deref_mut())?;
        let p = pass_record(pass, exp, out, &prev, &now, mem);
        note!("paper: [{label}] {}", p.summary());
        for w in p.disk.warnings(&format!("{label} pass {pass}"), p.outcome.secs) {
            note!("{w}");
        }
        rec.passes.push(p);
        prev = now;
    }
    rec.transfers = transfers(&first, &prev);
    rec.mount = prev.mount.clone();
    if exp == Experiment::Randread && o.probe_reads > 0 {
        let probe_limit = Duration::from_secs(60 + 3 * o.probe_reads / o.profile.limits().map_or(1000, |l| l.0));
        let seed = o.seed ^ 0x9E0B;
        let warm = ask(w, &format!("probe {} {seed}", o.probe_reads), probe_limit, label)?;
        // Let the fills of the warm-up probe reach the lenders.
        sys::sleep_checked(Duration::from_millis(500))?;
        let s0 = snapshot(tb, addrs, mount.as_deref_mut())?;
        let measured = ask(w, &format!("probe {} {seed}", o.probe_reads), probe_limit, label)?;
        let s1 = snapshot(tb, addrs, mount.as_deref_mut())?;
        let p = ProbeRecord {
            lender_hits: s1.lenders.since(&s0.lenders).hits,
            disk_read_ios: s1.disk.since(&s0.disk).read_ios,
            warm,
            measured,
        };
        note!(
            "paper: [{label}] probe: O_DIRECT 4 KiB read {:.0} µs mean, {:.0} µs median; of its {} reads {} from \
             lenders, {} disk I/Os",
            p.measured.lat_us_mean,
            p.measured.lat_us_p50,
            o.probe_reads,
            p.lender_hits,
            p.disk_read_ios
        );
        rec.probe = Some(p);
    }
    rec.mount_stats = mount.and_then(|m| m.stats_now()).map(|(_, v)| v);
    Ok(())
}

/// What a configuration leaves to record once its load is over.
pub(super) struct Teardown {
    /// The client cgroup's peak memory and OOM kills.
    pub memory_max_usage_bytes: Option<u64>,
    pub oom_kills: Option<u64>,
    /// The mount daemon's resident memory just before it stopped, and its counters at exit.
    pub daemon_rss_bytes: Option<u64>,
    /// … and the anonymous memory it held then ([`crate::proc::anon_held_bytes`]).
    pub daemon_anon_bytes: Option<u64>,
    pub mount_at_exit: Option<MountCounters>,
}

/// Read the cgroup's peak and OOM kills, stop the mount daemon (after reading its RSS) and the
/// lenders.
pub(super) fn tear_down(mem: &Cgroup, mount: Option<MountDaemon>, lenders: Option<&mut Lenders>) -> Teardown {
    let mut t = Teardown {
        memory_max_usage_bytes: mem.read_u64("memory.max_usage_in_bytes"),
        oom_kills: oom_kills(mem),
        daemon_rss_bytes: None,
        daemon_anon_bytes: None,
        mount_at_exit: None,
    };
    if let Some(mut m) = mount {
        t.daemon_rss_bytes = crate::proc::rss_bytes(m.pid()).ok();
        t.daemon_anon_bytes = crate::proc::anon_held_bytes(m.pid()).ok();
        t.mount_at_exit = m.stop();
    }
    if let Some(l) = lenders {
        l.stop();
    }
    t
}

pub(super) fn oom_kills(mem: &Cgroup) -> Option<u64> {
    std::fs::read_to_string(mem.path().join("memory.oom_control"))
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok()))
}

/// A [`thread_stats`] sample as [`thread_groups_since`] takes it: name and user + system ms.
fn cpu_of(t: &std::collections::HashMap<u32, ThreadStat>) -> std::collections::HashMap<u32, (String, f64)> {
    t.iter().map(|(&tid, t)| (tid, (t.name.clone(), t.user_ms + t.sys_ms))).collect()
}

fn pass_record(
    pass: u32,
    exp: Experiment,
    out: PassOutcome,
    prev: &Snapshot,
    now: &Snapshot,
    mem: &Cgroup,
) -> PassRecord {
    let disk = now.disk.since(&prev.disk);
    let lenders = now.lenders.since(&prev.lenders);
    let mut p = PassRecord {
        pass,
        mb_per_s: out.bytes as f64 / out.secs.max(1e-9) / 1e6,
        disk,
        lenders,
        memory_usage_bytes: mem.read_u64("memory.usage_in_bytes"),
        memory_cache_bytes: mem.memory_stat("total_cache"),
        mount: now.mount.clone(),
        daemon_cpu_ms: now.daemon_cpu_ms.zip(prev.daemon_cpu_ms).map(|(b, a)| (b - a).max(0.0)),
        daemon_sys_ms: now.daemon_sys_ms.zip(prev.daemon_sys_ms).map(|(b, a)| (b - a).max(0.0)),
        daemon_threads_ms: thread_groups_since(
            &cpu_of(&prev.daemon_threads),
            &cpu_of(&now.daemon_threads),
            now.daemon_cpu_ms.zip(prev.daemon_cpu_ms).map_or(0.0, |(b, a)| b - a),
        ),
        daemon_switches: switch_groups_since(&prev.daemon_threads, &now.daemon_threads),
        outcome: out,
        ..PassRecord::default()
    };
    if exp == Experiment::Randread && p.outcome.reads > 0 {
        // Every 4 KiB read that missed the page cache became one request below it: one read
        // of the disk (a block I/O; through the mount, one O_DIRECT read of the daemon), or
        // one read the mount answered from lenders. Through the mount, its own counters say
        // which (a request may span a few blocks when the kernel reads around a miss);
        // without them, lender hits (blocks) stand in for remote reads.
        let reads = p.outcome.reads;
        let d = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?));
        let m = prev.mount.as_ref().zip(now.mount.as_ref());
        let (remote, disk_reqs) = match m {
            Some((a, b)) => (
                d(a.remote_reads, b.remote_reads).unwrap_or(lenders.hits),
                d(a.backing_reads, b.backing_reads).unwrap_or(disk.read_ios),
            ),
            None => (lenders.hits, disk.read_ios),
        };
        let disk_reqs = disk_reqs.min(reads);
        let remote = remote.min(reads - disk_reqs);
        let page = reads - disk_reqs - remote;
        let f = |x: u64| x as f64 / reads as f64;
        p.page_cache_hits = Some(page);
        p.hit_ratio_page_cache = Some(f(page));
        p.hit_ratio_remote = Some(f(remote));
        p.hit_ratio_disk = Some(f(disk_reqs));
    }
    p
}

/// Table 9 for one run (the two passes): from the mount's own counters when it has a stats
/// command, else from the lenders' STATS (bytes in and out, deletions received).
pub(super) fn transfers(first: &Snapshot, last: &Snapshot) -> Transfers {
    if let (Some(a), Some(b)) = (&first.mount, &last.mount) {
        let d = |x: Option<u64>, y: Option<u64>| y.unwrap_or(0).saturating_sub(x.unwrap_or(0));
        return Transfers {
            bytes_to_servers: d(a.bytes_to_servers, b.bytes_to_servers),
            bytes_from_servers: d(a.bytes_from_servers, b.bytes_from_servers),
            invalidations: d(a.invalidations, b.invalidations),
            source: "mount stats".into(),
        };
    }
    let l = last.lenders.since(&first.lenders);
    Transfers {
        bytes_to_servers: l.bytes_in,
        bytes_from_servers: l.bytes_out,
        invalidations: l.dels,
        source: "lender STATS".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_testbed_has_lenders_for_every_configuration_that_borrows_them() {
        let mut o = PaperOptions::full(std::path::PathBuf::from("farcache"));
        for (configs, lenders) in [
            (vec![ConfigKind::Passthrough, ConfigKind::FarcacheTier], o.lenders),
            (vec![ConfigKind::Farcache], o.lenders),
            (vec![ConfigKind::Passthrough, ConfigKind::TierDram], 0),
        ] {
            o.configs = configs.clone();
            assert_eq!(testbed_lenders(&o), lenders, "{configs:?}");
        }
        assert!(o.lenders > 0);
    }
}
