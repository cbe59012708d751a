//! What a run produces: the raw records (JSON), markdown tables with every configuration
//! side by side and the ratios, the sanity checks (`--quick` fails on them) and the issue's
//! targets (reported, met or not).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::counters::LenderTotals;
use super::mount::MountCounters;
use super::pgbench::{PgMode, PgRecord, PgSetup};
use super::testbed::{DiskStat, OTHER_IO_FLAG_BYTES, OTHER_IO_FLAG_RATE};
use super::tpch::{QueryStatus, TpchRecord, TpchSetup};
use super::worker::PassOutcome;
use super::{human, ConfigKind, Experiment, PaperOptions};
use crate::Machine;

/// One pass of one configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PassRecord {
    pub pass: u32,
    /// What the application measured.
    #[serde(flatten)]
    pub outcome: PassOutcome,
    pub mb_per_s: f64,
    /// What the slow disk served during the pass.
    pub disk: DiskStat,
    /// What the lenders counted during the pass (hits = blocks served).
    pub lenders: LenderTotals,
    /// randread: 4 KiB reads served by the page cache, and each tier's share of the reads.
    pub page_cache_hits: Option<u64>,
    pub hit_ratio_page_cache: Option<f64>,
    pub hit_ratio_remote: Option<f64>,
    pub hit_ratio_disk: Option<f64>,
    /// The client's memory cgroup at the end of the pass.
    pub memory_usage_bytes: Option<u64>,
    pub memory_cache_bytes: Option<u64>,
    /// The mount's counters at the end of the pass (when `farcache stats MNT` exists).
    pub mount: Option<MountCounters>,
    /// The mount daemon's CPU time during the pass (user + system, ms; None without a mount
    /// or in records older than session 54).
    #[serde(default)]
    pub daemon_cpu_ms: Option<f64>,
    /// … of which system (kernel) time (None in records older than session 57).
    #[serde(default)]
    pub daemon_sys_ms: Option<f64>,
    /// … by thread group ([`super::counters::thread_groups_since`]), ms.
    #[serde(default)]
    pub daemon_threads_ms: std::collections::BTreeMap<String, f64>,
    /// The daemon's context switches during the pass, by thread group (voluntary +
    /// involuntary; [`super::counters::switch_groups_since`]).
    #[serde(default)]
    pub daemon_switches: std::collections::BTreeMap<String, u64>,
}

impl PassRecord {
    pub fn summary(&self) -> String {
        let mut s = format!(
            "pass {}: {:.2} s ({:.1} MB/s), disk {} reads / {}",
            self.pass,
            self.outcome.secs,
            self.mb_per_s,
            self.disk.read_ios,
            human_bytes(self.disk.read_bytes)
        );
        if self.lenders.hits + self.lenders.puts > 0 {
            let _ = write!(s, ", lenders {} hits / {} puts", self.lenders.hits, self.lenders.puts);
        }
        if let (Some(p), Some(r), Some(d)) = (self.hit_ratio_page_cache, self.hit_ratio_remote, self.hit_ratio_disk) {
            let _ = write!(
                s,
                ", served by page cache {:.1}% / lenders {:.1}% / disk {:.1}%",
                p * 100.0,
                r * 100.0,
                d * 100.0
            );
        }
        if self.disk.check_before_us > 0.0 {
            let _ = write!(s, ", disk check {:.0}/{:.0} µs", self.disk.check_before_us, self.disk.check_after_us);
        }
        if self.disk.cpu_check_before_us > 0.0 {
            let _ =
                write!(s, ", cpu check {:.0}/{:.0} µs", self.disk.cpu_check_before_us, self.disk.cpu_check_after_us);
        }
        if self.disk.cpu_ticks > 0 {
            let _ = write!(s, ", steal {:.0}%", self.disk.steal_share() * 100.0);
        }
        if let Some(ms) = self.daemon_cpu_ms {
            let _ = write!(s, ", daemon CPU {ms:.0} ms");
            if let Some(sys) = self.daemon_sys_ms {
                let _ = write!(s, " ({sys:.0} system)");
            }
            // Each thread group that did anything: its CPU and its context switches.
            let mut names: Vec<&String> = self.daemon_threads_ms.keys().chain(self.daemon_switches.keys()).collect();
            names.sort();
            names.dedup();
            let parts: Vec<String> = names
                .iter()
                .map(|n| {
                    let ms = self.daemon_threads_ms.get(*n).copied().unwrap_or(0.0);
                    let sw = self.daemon_switches.get(*n).copied().unwrap_or(0);
                    format!("{n} {ms:.0} ms/{sw} switches")
                })
                .collect();
            if !parts.is_empty() {
                let _ = write!(s, " [{}]", parts.join(", "));
            }
        }
        if self.outcome.mismatches > 0 {
            let _ = write!(s, ", {} WRONG BLOCKS", self.outcome.mismatches);
        }
        s
    }
}

/// The O_DIRECT probes of one randread configuration: the second is measured, after the
/// first has put the blocks wherever this configuration keeps them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub warm: PassOutcome,
    pub measured: PassOutcome,
    /// Lender hits during the measured probe.
    pub lender_hits: u64,
    pub disk_read_ios: u64,
}

/// Table 9 for one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Transfers {
    pub bytes_to_servers: u64,
    pub bytes_from_servers: u64,
    pub invalidations: u64,
    pub source: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub experiment: Experiment,
    pub size_bytes: u64,
    pub config: ConfigKind,
    pub memory_limit_bytes: Option<u64>,
    pub passes: Vec<PassRecord>,
    pub probe: Option<ProbeRecord>,
    pub transfers: Transfers,
    /// The mount's counters at the end (stats command, else its exit log).
    pub mount: Option<MountCounters>,
    /// The mount's whole stats document at the end, when `farcache stats MNT --json` works.
    pub mount_stats: Option<serde_json::Value>,
    pub daemon_rss_bytes: Option<u64>,
    /// The daemon's anonymous memory then, less lazily freed pages (None before session 57).
    #[serde(default)]
    pub daemon_anon_bytes: Option<u64>,
    /// Pages of the test file in the page cache before the 1st pass (must be 0: cold).
    #[serde(default)]
    pub cached_pages_at_start: Option<u64>,
    pub memory_max_usage_bytes: Option<u64>,
    pub oom_kills: Option<u64>,
    /// CPUs used by other processes while this configuration ran (noise indicator).
    pub other_cpus: f64,
    pub secs_total: f64,
    pub error: Option<String>,
}

impl RunRecord {
    pub fn new(experiment: Experiment, size_bytes: u64, config: ConfigKind, limit: Option<u64>) -> RunRecord {
        RunRecord {
            experiment,
            size_bytes,
            config,
            memory_limit_bytes: limit,
            passes: Vec::new(),
            probe: None,
            transfers: Transfers::default(),
            mount: None,
            mount_stats: None,
            daemon_rss_bytes: None,
            daemon_anon_bytes: None,
            cached_pages_at_start: None,
            memory_max_usage_bytes: None,
            oom_kills: None,
            other_cpus: 0.0,
            secs_total: 0.0,
            error: None,
        }
    }

    pub fn failed(experiment: Experiment, size_bytes: u64, config: ConfigKind, error: String) -> RunRecord {
        RunRecord { error: Some(error), ..RunRecord::new(experiment, size_bytes, config, None) }
    }

    pub fn pass_secs(&self, pass: u32) -> Option<f64> {
        self.passes.iter().find(|p| p.pass == pass).map(|p| p.outcome.secs).filter(|s| *s > 0.0)
    }
}

/// A sanity check (`--quick` fails on any) or a target of issue 4 (reported).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub what: String,
    pub measured: String,
    pub ok: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PaperReport {
    pub machine: Machine,
    /// Proactive reclaim the machine runs on its own (DAMON), which bounds how long an
    /// untouched page stays cached whatever the memory limit; none when absent.
    #[serde(default)]
    pub damon: Option<String>,
    pub options: PaperOptions,
    pub runs: Vec<RunRecord>,
    /// pgbench: the database, and one record per (configuration, mode, clients).
    #[serde(default)]
    pub pgbench_setup: Option<PgSetup>,
    #[serde(default)]
    pub pgbench: Vec<PgRecord>,
    #[serde(default)]
    pub pgbench_error: Option<String>,
    /// tpch: the data, and one record per configuration.
    #[serde(default)]
    pub tpch_setup: Option<TpchSetup>,
    #[serde(default)]
    pub tpch: Vec<TpchRecord>,
    #[serde(default)]
    pub tpch_error: Option<String>,
    /// Paper 003 (postmark, dfsio, durable): one record per configuration and case.
    #[serde(default)]
    pub tier_runs: Vec<super::writeback::TierRecord>,
    /// Paper 002 (engine, serial): one record per configuration and fio point.
    #[serde(default)]
    pub engine_runs: Vec<super::engine::EngineRecord>,
    /// Paper 001 (migrate): one record per copy source and thread count.
    #[serde(default)]
    pub migrate_runs: Vec<super::migrate::MigrateRecord>,
    /// Paper 004 (tenants): the databases, and one record per (capacity, allocation mode).
    #[serde(default)]
    pub tenants_setup: Option<super::tenants::TenantsSetup>,
    #[serde(default)]
    pub tenants_runs: Vec<super::tenants::TenantsRecord>,
    /// Paper 002's OLTP: the loaded data, one record per (configuration, point).
    #[serde(default)]
    pub oltp_setup: Option<super::oltp::OltpSetup>,
    #[serde(default)]
    pub oltp: Vec<super::oltp::OltpRecord>,
    #[serde(default)]
    pub oltp_error: Option<String>,
    pub checks: Vec<Verdict>,
    pub targets: Vec<Verdict>,
    pub complete: bool,
    pub secs_total: f64,
}

impl PaperReport {
    pub fn new(o: &PaperOptions) -> PaperReport {
        PaperReport {
            machine: Machine::detect(),
            damon: damon_reclaim(),
            options: o.clone(),
            runs: Vec::new(),
            pgbench_setup: None,
            pgbench: Vec::new(),
            pgbench_error: None,
            tpch_setup: None,
            tpch: Vec::new(),
            tpch_error: None,
            tier_runs: Vec::new(),
            engine_runs: Vec::new(),
            migrate_runs: Vec::new(),
            tenants_setup: None,
            tenants_runs: Vec::new(),
            oltp_setup: None,
            oltp: Vec::new(),
            oltp_error: None,
            checks: Vec::new(),
            targets: Vec::new(),
            complete: false,
            secs_total: 0.0,
        }
    }

    pub fn finish(&mut self, secs: f64) {
        self.secs_total = secs;
        self.complete = true;
        self.evaluate();
    }

    /// (Re)compute the sanity checks and targets from the records.
    pub fn evaluate(&mut self) {
        self.checks = checks(self);
        self.targets = targets(self);
    }

    pub fn get(&self, exp: Experiment, size: u64, cfg: ConfigKind) -> Option<&RunRecord> {
        self.runs.iter().find(|r| r.experiment == exp && r.size_bytes == size && r.config == cfg)
    }

    /// The tpch record of `cfg`, if it ran without error.
    pub fn tpch_ok(&self, cfg: ConfigKind) -> Option<&TpchRecord> {
        self.tpch.iter().find(|x| x.config == Some(cfg) && x.error.is_none())
    }

    /// tpch: farcache against `base` in (load, power, throughput): base's time ÷ farcache's
    /// for the load and power tests, farcache's queries per hour ÷ base's for throughput.
    pub fn tpch_ratios(&self, base: ConfigKind) -> (Option<f64>, Option<f64>, Option<f64>) {
        let (Some(f), Some(b)) = (self.tpch_ok(ConfigKind::Farcache), self.tpch_ok(base)) else {
            return (None, None, None);
        };
        let div = |a: Option<f64>, b: Option<f64>| a.zip(b).filter(|(_, b)| *b > 0.0).map(|(a, b)| a / b);
        (div(b.load_secs, f.load_secs), div(b.power_secs, f.power_secs), div(f.queries_per_hour, b.queries_per_hour))
    }

    pub fn checks_failed(&self) -> Vec<&Verdict> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }

    /// Performance of farcache relative to `base` in `pass`: base's time ÷ farcache's.
    pub fn ratio(&self, exp: Experiment, size: u64, base: ConfigKind, pass: u32) -> Option<f64> {
        let f = self.get(exp, size, ConfigKind::Farcache)?.pass_secs(pass)?;
        let b = self.get(exp, size, base)?.pass_secs(pass)?;
        Some(b / f)
    }
}

/// Read (only) the machine's DAMON schemes: a running kdamond with a `pageout` scheme
/// evicts memory idle for `age.min × aggr_us`, page cache included, with no memory pressure.
pub fn damon_reclaim() -> Option<String> {
    let base = std::path::Path::new("/sys/kernel/mm/damon/admin/kdamonds");
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    let mut found = Vec::new();
    for k in std::fs::read_dir(base).ok()?.flatten() {
        if read(k.path().join("state")).as_deref() != Some("on") {
            continue;
        }
        for c in std::fs::read_dir(k.path().join("contexts")).ok()?.flatten().filter(|e| e.path().is_dir()) {
            let ops = read(c.path().join("operations")).unwrap_or_default();
            let aggr_us: u64 =
                read(c.path().join("monitoring_attrs/intervals/aggr_us")).and_then(|x| x.parse().ok()).unwrap_or(0);
            for sch in std::fs::read_dir(c.path().join("schemes")).ok()?.flatten().filter(|e| e.path().is_dir()) {
                let action = read(sch.path().join("action")).unwrap_or_default();
                let age: u64 =
                    read(sch.path().join("access_pattern/age/min")).and_then(|x| x.parse().ok()).unwrap_or(0);
                if action == "pageout" {
                    found.push(format!(
                        "kdamond {} ({ops}) pages out memory idle for {:.0} s or more",
                        k.file_name().to_string_lossy(),
                        (age * aggr_us) as f64 / 1e6
                    ));
                }
            }
        }
    }
    (!found.is_empty()).then(|| found.join("; "))
}

fn human_bytes(b: u64) -> String {
    if b >= 10 << 20 {
        format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn cell(x: Option<f64>, digits: usize) -> String {
    x.map_or("–".into(), |v| format!("{v:.digits$}"))
}

fn checks(r: &PaperReport) -> Vec<Verdict> {
    let o = &r.options;
    let mut v = super::migrate::checks(r);
    v.extend(super::tenants::checks(r));
    v.extend(super::oltp::checks(r));
    if o.experiments.contains(&Experiment::Pgbench) {
        if let Some(e) = &r.pgbench_error {
            v.push(Verdict { what: "pgbench: the database was made".into(), measured: e.clone(), ok: false });
        }
        for &cfg in &o.configs_for(Experiment::Pgbench) {
            for mode in [PgMode::SelectOnly, PgMode::TpcB] {
                for &c in &o.pgbench_clients {
                    let x = r.pgbench.iter().find(|x| x.config == cfg && x.mode == mode && x.clients == c);
                    let (measured, ok) = match x {
                        None => ("missing".to_string(), false),
                        Some(x) if x.error.is_some() => (x.error.clone().unwrap_or_default(), false),
                        Some(x) => (
                            format!(
                                "{:.0} tps, {} failed, {} pages cached at the start",
                                x.tps, x.failed, x.cached_pages_at_start
                            ),
                            x.tps > 0.0 && x.failed == 0 && x.cached_pages_at_start == 0,
                        ),
                    };
                    v.push(Verdict {
                        what: format!(
                            "pgbench {} {} {c} clients ran with no failed transaction",
                            cfg.name(),
                            mode.name()
                        ),
                        measured,
                        ok,
                    });
                }
            }
        }
    }
    if o.experiments.contains(&Experiment::Tpch) {
        tpch_checks(r, &mut v);
    }
    for &exp in o.experiments.iter().filter(|e| e.per_size()) {
        for &size in &o.sizes_bytes {
            for &cfg in &o.configs_for(Experiment::Seqread) {
                let what = format!("{} {} {} ran both passes", exp.name(), human(size), cfg.name());
                let Some(run) = r.get(exp, size, cfg) else {
                    v.push(Verdict { what, measured: "missing".into(), ok: false });
                    continue;
                };
                if let Some(e) = &run.error {
                    v.push(Verdict { what, measured: format!("error: {e}"), ok: false });
                    continue;
                }
                let times: Vec<String> = run.passes.iter().map(|p| format!("{:.3} s", p.outcome.secs)).collect();
                let ok =
                    run.passes.len() == 2 && run.passes.iter().all(|p| p.outcome.secs > 0.0 && p.outcome.bytes == size);
                v.push(Verdict { what, measured: times.join(", "), ok });
                let bad: u64 = run.passes.iter().map(|p| p.outcome.mismatches).sum::<u64>()
                    + run.probe.as_ref().map_or(0, |p| p.warm.mismatches + p.measured.mismatches);
                v.push(Verdict {
                    what: format!(
                        "{} {} {}: every block read had the right contents",
                        exp.name(),
                        human(size),
                        cfg.name()
                    ),
                    measured: format!("{bad} wrong"),
                    ok: bad == 0,
                });
                if let Some(n) = run.cached_pages_at_start {
                    v.push(Verdict {
                        what: format!("{} {} {}: the 1st pass started cold", exp.name(), human(size), cfg.name()),
                        measured: format!("{n} pages of the file cached"),
                        ok: n == 0,
                    });
                }
                if run.oom_kills.unwrap_or(0) > 0 {
                    v.push(Verdict {
                        what: format!(
                            "{} {} {}: no OOM kill in the client's cgroup",
                            exp.name(),
                            human(size),
                            cfg.name()
                        ),
                        measured: format!("{} kills", run.oom_kills.unwrap_or(0)),
                        ok: false,
                    });
                }
                if exp == Experiment::Randread && cfg == ConfigKind::Farcache && size > o.memory_bytes {
                    let hits = run.passes.get(1).map_or(0, |p| p.lenders.hits);
                    v.push(Verdict {
                        what: format!("randread {} farcache: the 2nd pass has remote hits", human(size)),
                        measured: format!("{hits} lender hits"),
                        ok: hits > 0,
                    });
                }
            }
        }
    }
    tier_checks(r, &mut v);
    for &exp in o.experiments.iter().filter(|e| e.of_the_engine()) {
        for cfg in o.configs_for(exp) {
            let recs: Vec<_> =
                r.engine_runs.iter().filter(|x| x.experiment == Some(exp) && x.config == Some(cfg)).collect();
            let want = super::engine::points_of(o, exp).len();
            let ok = recs.len() == want && recs.iter().all(|x| x.error.is_none() && x.iops > 0.0);
            v.push(Verdict {
                what: format!("{} {} ran every point", exp.name(), cfg.name()),
                measured: match recs.iter().find_map(|x| x.error.clone()) {
                    Some(e) => e,
                    None => format!("{} of {want} points", recs.len()),
                },
                ok,
            });
        }
    }
    v
}

/// Paper 003's experiments: every case of every configuration ran, and the mounts with a
/// tier wrote into it.
fn tier_checks(r: &PaperReport, v: &mut Vec<Verdict>) {
    let o = &r.options;
    for &exp in o.experiments.iter().filter(|e| e.of_the_tier()) {
        for cfg in o.configs_for(exp) {
            let recs: Vec<_> =
                r.tier_runs.iter().filter(|x| x.experiment == Some(exp) && x.config == Some(cfg)).collect();
            let failed: Vec<String> =
                recs.iter().filter_map(|x| Some(format!("{}: {}", x.case, x.error.as_ref()?))).collect();
            v.push(Verdict {
                what: format!("{} {} ran every case", exp.name(), cfg.name()),
                measured: if recs.is_empty() {
                    "missing".into()
                } else if failed.is_empty() {
                    format!("{} cases", recs.len())
                } else {
                    failed.join("; ")
                },
                ok: !recs.is_empty() && failed.is_empty(),
            });
            if cfg.has_tier() && !recs.is_empty() && failed.is_empty() {
                let most = |k: &str| recs.iter().filter_map(|x| x.tier.as_ref()?[k].as_u64()).max().unwrap_or(0);
                let (writes, streamed) = (most("writes"), most("write_through_sequential"));
                v.push(Verdict {
                    what: format!("{} {}: writes went into the tier", exp.name(), cfg.name()),
                    measured: format!("{writes} tier writes ({streamed} of long streams past it)"),
                    ok: writes > 0,
                });
            }
        }
    }
}

/// tpch: every configuration loaded every row, ran every query (in `--quick`, to completion),
/// started cold, had no OOM kill; and every query returned the same rows everywhere.
fn tpch_checks(r: &PaperReport, v: &mut Vec<Verdict>) {
    let o = &r.options;
    if let Some(e) = &r.tpch_error {
        v.push(Verdict { what: "tpch: the data was generated".into(), measured: e.clone(), ok: false });
        return;
    }
    let want: Vec<(String, u64)> = r.tpch_setup.as_ref().map(|s| s.rows.clone()).unwrap_or_default();
    for &cfg in &o.configs_for(Experiment::Tpch) {
        let name = cfg.name();
        let Some(x) = r.tpch.iter().find(|x| x.config == Some(cfg)) else {
            v.push(Verdict { what: format!("tpch {name} ran"), measured: "missing".into(), ok: false });
            continue;
        };
        if let Some(e) = &x.error {
            v.push(Verdict { what: format!("tpch {name} ran the three tests"), measured: e.clone(), ok: false });
        }
        let loaded: Vec<(String, u64)> = x
            .load_steps
            .iter()
            .filter_map(|s| Some((s.what.strip_prefix("create and copy ")?.to_string(), s.rows?)))
            .collect();
        let total: u64 = loaded.iter().map(|(_, n)| n).sum();
        v.push(Verdict {
            what: format!("tpch {name}: the load test loaded every row of the 8 tables"),
            measured: format!("{total} rows in {} tables", loaded.len()),
            ok: !want.is_empty() && loaded == want,
        });
        let n = |s| x.count(s);
        let (ok, timed_out, skipped, failed) =
            (n(QueryStatus::Ok), n(QueryStatus::TimedOut), n(QueryStatus::Skipped), n(QueryStatus::Failed));
        let expected = 22 * (1 + super::tpch::THROUGHPUT_STREAMS);
        v.push(Verdict {
            what: format!(
                "tpch {name}: the power and throughput tests ran their {expected} queries{}",
                if o.quick { " to completion" } else { " (timeouts are reported, not failures)" }
            ),
            measured: format!("{ok} ran, {timed_out} timed out, {skipped} skipped at the deadline, {failed} failed"),
            ok: failed == 0 && ok + timed_out + skipped == expected && (!o.quick || ok == expected),
        });
        v.push(Verdict {
            what: format!("tpch {name}: started cold"),
            measured: format!("{} pages of the data and cluster cached", x.cached_pages_at_start),
            ok: x.cached_pages_at_start == 0,
        });
        if x.oom_kills.unwrap_or(0) > 0 {
            v.push(Verdict {
                what: format!("tpch {name}: no OOM kill in the client's cgroup"),
                measured: format!("{} kills", x.oom_kills.unwrap_or(0)),
                ok: false,
            });
        }
    }
    // The same answers everywhere: per query, every completed run (configurations × streams)
    // has the same row count and checksum.
    let mut differ = Vec::new();
    let mut runs = 0;
    for q in 1..=22u32 {
        let seen: Vec<(u64, &str)> = r
            .tpch
            .iter()
            .flat_map(|x| x.queries())
            .filter(|x| x.query == q && x.status == QueryStatus::Ok)
            .map(|x| (x.rows, x.checksum.as_str()))
            .collect();
        runs += seen.len();
        if seen.windows(2).any(|w| w[0] != w[1]) {
            let mut kinds: Vec<String> = seen.iter().map(|(n, c)| format!("{n} rows/{c}")).collect();
            kinds.dedup();
            differ.push(format!("q{q}: {}", kinds.join(" vs ")));
        }
    }
    v.push(Verdict {
        what: "tpch: every query returned the same rows (count and checksum) in every configuration and stream".into(),
        measured: if differ.is_empty() { format!("{runs} query runs agree") } else { differ.join("; ") },
        ok: differ.is_empty() && runs > 0,
    });
}

/// Sizes that fit in the lenders but not in the client.
fn fits_lenders_not_client(o: &PaperOptions, size: u64) -> bool {
    size > o.memory_bytes && size <= (o.lender_capacity_bytes * o.lenders as u64) * 9 / 10
}

/// Probe times (µs, mean): (native disk, passthrough disk via the mount, farcache remote
/// hit). The mean, not the median: blkio throttling holds the *rate* (some I/Os pass at
/// once, others wait for the next slice), so only the mean is the disk's time per read.
pub fn probe_times(r: &PaperReport, size: u64) -> (Option<f64>, Option<f64>, Option<f64>) {
    let t = |c| r.get(Experiment::Randread, size, c).and_then(|x| x.probe.as_ref()).map(|p| p.measured.lat_us_mean);
    (t(ConfigKind::Native), t(ConfigKind::Passthrough), t(ConfigKind::Farcache))
}

fn targets(r: &PaperReport) -> Vec<Verdict> {
    let o = &r.options;
    let mut v = super::migrate::targets(r);
    v.extend(super::tenants::targets(r));
    v.extend(super::oltp::targets(r));
    if o.experiments.contains(&Experiment::Randread) {
        for &size in &o.sizes_bytes {
            if !fits_lenders_not_client(o, size) {
                continue;
            }
            let Some(fc) = r.get(Experiment::Randread, size, ConfigKind::Farcache) else { continue };
            // Whether the routing used the lenders: the probe's reads went to them. A rule
            // that keeps the reads on a disk as fast as a lender hit (the adaptive rule on
            // the raw profile) is right to, and the lender targets do not apply.
            let on_lenders = fc.probe.as_ref().is_none_or(|p| p.lender_hits * 2 >= p.measured.reads);
            let routed = |what: String, measured: String, ok: bool| {
                if on_lenders {
                    Verdict { what, measured, ok }
                } else {
                    Verdict {
                        what,
                        measured: format!("not applicable: the routing kept the reads on the disk ({measured})"),
                        ok: true,
                    }
                }
            };
            if let Some(p2) = fc.passes.get(1) {
                let hit = 1.0 - p2.hit_ratio_disk.unwrap_or(1.0);
                v.push(routed(
                    format!("randread {} 2nd pass: hit ratio (page cache + lenders) >= 99%", human(size)),
                    format!("{:.2}%", hit * 100.0),
                    hit >= 0.99,
                ));
            }
            let (_, disk, remote) = probe_times(r, size);
            if let (Some(achieved), Some(d), Some(rm)) =
                (r.ratio(Experiment::Randread, size, ConfigKind::Passthrough, 2), disk, remote.filter(|_| on_lenders))
            {
                let allowed = d / rm;
                v.push(Verdict {
                    what: format!(
                        "randread {} 2nd pass: farcache/passthrough >= 80% of disk read ÷ remote hit",
                        human(size)
                    ),
                    measured: format!(
                        "{achieved:.2}× of {allowed:.2}× allowed ({:.0}%)",
                        100.0 * achieved / allowed.max(1e-9)
                    ),
                    ok: achieved >= 0.8 * allowed,
                });
            }
            if o.profile == super::DiskProfile::Hdd && size == super::GIB {
                if let Some(x) = r.ratio(Experiment::Randread, size, ConfigKind::Passthrough, 2) {
                    v.push(Verdict {
                        what: "randread 1GiB on hdd, 2nd pass: farcache/passthrough >= 10.3× (the paper)".into(),
                        measured: format!("{x:.2}×"),
                        ok: x >= 10.3,
                    });
                }
            }
        }
    }
    if o.experiments.contains(&Experiment::Tpch) {
        let (load, power, tput) = r.tpch_ratios(ConfigKind::Passthrough);
        let note = |cfg: ConfigKind| {
            r.tpch_ok(cfg)
                .map(|x| x.count(QueryStatus::TimedOut) + x.count(QueryStatus::Skipped))
                .filter(|n| *n > 0)
                .map(|n| format!(", {} with {n} queries timed out or skipped", cfg.name()))
                .unwrap_or_default()
        };
        let notes = format!("{}{}", note(ConfigKind::Passthrough), note(ConfigKind::Farcache));
        for (what, x, want) in [
            ("tpch load test: farcache >= 0.97× passthrough (time)", load, 0.97),
            ("tpch power test: farcache >= 1.0× passthrough (time)", power, 1.0),
            ("tpch throughput test: farcache >= 3.08× passthrough (queries per hour)", tput, 3.08),
        ] {
            if let Some(x) = x {
                v.push(Verdict { what: what.into(), measured: format!("{x:.3}×{notes}"), ok: x >= want });
            }
        }
    }
    if o.experiments.contains(&Experiment::Seqread) {
        for &size in &o.sizes_bytes {
            for pass in [1, 2] {
                if let Some(x) = r.ratio(Experiment::Seqread, size, ConfigKind::Passthrough, pass) {
                    v.push(Verdict {
                        what: format!("seqread {} pass {pass}: farcache >= 0.97× passthrough", human(size)),
                        measured: format!("{x:.3}×"),
                        ok: x >= 0.97,
                    });
                }
            }
        }
    }
    v
}

/// Everything as markdown: the setting, one table per experiment, hit ratios and per-read
/// times for randread, transfers, checks and targets.
pub fn render(r: &PaperReport) -> String {
    let o = &r.options;
    let mut s = String::new();
    let _ = writeln!(s, "# Paper 000 reproduced{}\n", if o.quick { " (--quick)" } else { "" });
    let _ = writeln!(
        s,
        "Machine: {}. Disk: loop device on a file, ext4, {}. Client: memory cgroup of {} (application + \
         mount daemon). Lenders: {} × {} over veth{}.{} Every pass starts from a cold local cache and empty \
         lenders; the 2nd pass follows the 1st at once. Total time {:.0} s.\n",
        r.machine.describe(),
        o.profile.describe(),
        human(o.memory_bytes),
        o.lenders,
        human(o.lender_capacity_bytes),
        o.link_rate.as_deref().map(|x| format!(" with TBF {x}")).unwrap_or_default(),
        o.client_cpus.map_or(String::new(), |n| format!(
            " CPUs: the client (application, mount daemon, harness) on the first {n}, the lenders on the \
             other {} (`--client-cpus {n}`: the lenders as other machines).",
            r.machine.cpus.saturating_sub(n as usize)
        )),
        r.secs_total
    );
    if let Some(d) = &r.damon {
        let _ = writeln!(
            s,
            "This machine reclaims on its own: {d} (DAMON, set up by the VM's platform and left alone here). \
             It evicts page cache that a pass has not touched for that long even with no memory limit, so \
             passes longer than that lose local cache in every configuration (lenders' memory is anonymous \
             and there is no swap: it stays).\n"
        );
    }
    if let Some(routing) = r.runs.iter().find_map(|x| {
        let m = x.mount_stats.as_ref()?;
        (m["routing"]["mode"].as_str()? != "passthrough").then(|| m["routing"].clone())
    }) {
        let _ = writeln!(
            s,
            "farcache's routing (from `farcache stats MNT --json`): mode `{}`, threshold {} bytes.\n",
            routing["mode"].as_str().unwrap_or("?"),
            routing["threshold_bytes"]
        );
    }
    let cfgs = &o.configs_for(Experiment::Seqread);
    for &exp in o.experiments.iter().filter(|e| e.per_size()) {
        let _ = writeln!(s, "## {} ({}): seconds per pass\n", exp.name(), exp.table());
        let mut head = String::from("| size |");
        let mut rule = String::from("|---|");
        for c in cfgs {
            let _ = write!(head, " {0} 1st | {0} 2nd |", c.name());
            rule.push_str("---:|---:|");
        }
        for base in ["passthrough", "ideal"] {
            let _ = write!(head, " farcache/{base} 1st | 2nd |");
            rule.push_str("---:|---:|");
        }
        let _ = writeln!(s, "{head}\n{rule}");
        for &size in &o.sizes_bytes {
            let mut row = format!("| {} |", human(size));
            for &c in cfgs {
                for pass in [1, 2] {
                    let x = r.get(exp, size, c).and_then(|run| run.pass_secs(pass));
                    let _ = write!(row, " {} |", cell(x, 2));
                }
            }
            for base in [ConfigKind::Passthrough, ConfigKind::Ideal] {
                for pass in [1, 2] {
                    let _ = write!(row, " {} |", cell(r.ratio(exp, size, base, pass), 2));
                }
            }
            let _ = writeln!(s, "{row}");
        }
        let _ = writeln!(
            s,
            "\nRatios are performance ratios as in the paper's figures: the other configuration's time ÷ \
             farcache's (> 1: farcache is faster).\n"
        );
        if exp == Experiment::Randread {
            render_tiers(&mut s, r);
            render_probes(&mut s, r);
        }
    }
    render_pgbench(&mut s, r);
    render_tpch(&mut s, r);
    render_tier_runs(&mut s, r);
    render_engine_runs(&mut s, r);
    super::migrate::render(&mut s, r);
    super::tenants::render(&mut s, r);
    super::oltp::render(&mut s, r);
    render_transfers(&mut s, r);
    render_memory(&mut s, r);
    render_other_io(&mut s, r);
    for (title, list) in [("Sanity checks", &r.checks), ("Targets", &r.targets)] {
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(s, "## {title}\n\n| | measured | met? |\n|---|---|---|");
        for c in list {
            let _ = writeln!(s, "| {} | {} | {} |", c.what, c.measured, if c.ok { "yes" } else { "**no**" });
        }
        let _ = writeln!(s);
    }
    s
}

/// Paper 002's experiments: IOPS per fio point and configuration, the ratios to native
/// (engine) or to the serialized mount (serial), and the disk's queue depth.
fn render_engine_runs(s: &mut String, r: &PaperReport) {
    let o = &r.options;
    for &exp in o.experiments.iter().filter(|e| e.of_the_engine()) {
        let cfgs = o.configs_for(exp);
        let recs: Vec<&super::engine::EngineRecord> =
            r.engine_runs.iter().filter(|x| x.experiment == Some(exp) && x.error.is_none()).collect();
        let base = if exp == Experiment::Serial { ConfigKind::Serialized } else { ConfigKind::Native };
        let _ = writeln!(s, "## {} ({}): IOPS (p50 µs; disk queue depth)\n", exp.name(), exp.table());
        let mut head = String::from("| rw | block | jobs | QD |");
        let mut rule = String::from("|---|---:|---:|---:|");
        for c in &cfgs {
            let _ = write!(head, " {} |", c.name());
            rule.push_str("---:|");
        }
        for c in cfgs.iter().filter(|c| **c != base) {
            let _ = write!(head, " {}/{} |", c.name(), base.name());
            rule.push_str("---:|");
        }
        // The transport alone: the same passthrough over rings and over read loops.
        let rings = cfgs.contains(&ConfigKind::Passthrough) && cfgs.contains(&ConfigKind::PassthroughRing);
        if rings {
            head.push_str(" passthrough-ring/passthrough |");
            rule.push_str("---:|");
        }
        let _ = writeln!(s, "{head}\n{rule}");
        for p in super::engine::points_of(o, exp) {
            let get = |cfg: ConfigKind| {
                recs.iter().find(|x| x.config == Some(cfg) && x.rw == p.0 && x.iodepth == p.2 && x.jobs == p.3).copied()
            };
            let mut row = format!("| {} | {} | {} | {} |", p.0, p.1, p.3, p.2);
            for &c in &cfgs {
                let v = get(c).map(|x| format!("{:.0} ({:.0}; {:.1})", x.iops, x.p50_us, x.disk_queue));
                let _ = write!(row, " {} |", v.unwrap_or_else(|| "–".into()));
            }
            for &c in cfgs.iter().filter(|c| **c != base) {
                let ratio = get(c).zip(get(base)).filter(|(_, b)| b.iops > 0.0).map(|(a, b)| a.iops / b.iops);
                let _ = write!(row, " {} |", cell(ratio, 2));
            }
            if rings {
                let (r, l) = (get(ConfigKind::PassthroughRing), get(ConfigKind::Passthrough));
                let ratio = r.zip(l).filter(|(_, b)| b.iops > 0.0).map(|(a, b)| a.iops / b.iops);
                let _ = write!(row, " {} |", cell(ratio, 2));
            }
            let _ = writeln!(s, "{row}");
        }
        // The daemon's CPU per I/O, where measured (runs before it was recorded have 0).
        let mounts: Vec<ConfigKind> = cfgs.iter().copied().filter(|c| c.through_mount()).collect();
        if recs.iter().any(|x| x.daemon_cpu_us_per_io > 0.0) && !mounts.is_empty() {
            let _ = writeln!(s, "\nThe mount daemon's CPU time per I/O (µs, user + system, all threads):\n");
            let mut head = String::from("| rw | jobs | QD |");
            let mut rule = String::from("|---|---:|---:|");
            for c in &mounts {
                let _ = write!(head, " {} |", c.name());
                rule.push_str("---:|");
            }
            let _ = writeln!(s, "{head}\n{rule}");
            for p in super::engine::points_of(o, exp) {
                let mut row = format!("| {} | {} | {} |", p.0, p.3, p.2);
                for &c in &mounts {
                    let v = recs
                        .iter()
                        .find(|x| x.config == Some(c) && x.rw == p.0 && x.iodepth == p.2 && x.jobs == p.3)
                        .map(|x| format!("{:.1}", x.daemon_cpu_us_per_io));
                    let _ = write!(row, " {} |", v.unwrap_or_else(|| "–".into()));
                }
                let _ = writeln!(s, "{row}");
            }
        }
        let failed: Vec<String> = r
            .engine_runs
            .iter()
            .filter(|x| x.experiment == Some(exp))
            .filter_map(|x| Some(format!("{}: {}", x.config?.name(), x.error.as_ref()?)))
            .collect();
        if !failed.is_empty() {
            let _ = writeln!(s, "\nFailed: {}", failed.join("; "));
        }
        let _ = writeln!(s);
    }
}

/// Paper 003's experiments: per case, each configuration's headline figure and the tiers'
/// ratios against the backing alone (native) and the mount without a tier.
fn render_tier_runs(s: &mut String, r: &PaperReport) {
    let o = &r.options;
    for &exp in o.experiments.iter().filter(|e| e.of_the_tier()) {
        let cfgs = o.configs_for(exp);
        let recs: Vec<&super::writeback::TierRecord> =
            r.tier_runs.iter().filter(|x| x.experiment == Some(exp)).collect();
        let mut cases: Vec<&str> = Vec::new();
        for x in &recs {
            if !cases.contains(&x.case.as_str()) {
                cases.push(&x.case);
            }
        }
        let unit = recs.iter().find(|x| x.error.is_none()).map(|x| x.unit.as_str()).unwrap_or("");
        let _ = writeln!(s, "## {} ({}): {unit}, higher is better\n", exp.name(), exp.table());
        let mut head = String::from("| case |");
        let mut rule = String::from("|---|");
        for c in &cfgs {
            let _ = write!(head, " {} |", c.name());
            rule.push_str("---:|");
        }
        let tiers: Vec<ConfigKind> = cfgs.iter().copied().filter(|c| c.has_tier()).collect();
        for t in &tiers {
            let _ = write!(head, " {0}/native | {0}/passthrough |", t.name());
            rule.push_str("---:|---:|");
        }
        let _ = writeln!(s, "{head}\n{rule}");
        let get = |case: &str, cfg: ConfigKind| {
            recs.iter().find(|x| x.case == case && x.config == Some(cfg) && x.error.is_none()).copied()
        };
        let ratio = |case: &str, a: ConfigKind, b: ConfigKind| {
            get(case, a).zip(get(case, b)).filter(|(_, y)| y.per_sec > 0.0).map(|(x, y)| x.per_sec / y.per_sec)
        };
        for case in &cases {
            let mut row = format!("| {case} |");
            for &c in &cfgs {
                let v = get(case, c).map(|x| match (x.p50_us, x.p99_us) {
                    (Some(p50), Some(p99)) => format!("{:.0} (p50 {p50:.0} µs, p99 {p99:.0} µs)", x.per_sec),
                    _ => format!("{:.1}", x.per_sec),
                });
                let _ = write!(row, " {} |", v.unwrap_or_else(|| "–".into()));
            }
            for &t in &tiers {
                let _ = write!(
                    row,
                    " {} | {} |",
                    cell(ratio(case, t, ConfigKind::Native), 2),
                    cell(ratio(case, t, ConfigKind::Passthrough), 2)
                );
            }
            let _ = writeln!(s, "{row}");
        }
        if exp == Experiment::Durable {
            use super::writeback::FUSE_NOOP_CASE;
            for &t in &tiers {
                let p50 = |case: &str| get(case, t).and_then(|x| x.p50_us);
                if let (Some(tier), Some(noop)) = (p50("1 writer"), p50(FUSE_NOOP_CASE)) {
                    let _ = writeln!(
                        s,
                        "\n{}: one writer's write + fdatasync p50 {tier:.0} µs against {noop:.0} µs through a mount that \
                         does nothing costly (+{:.0} µs; target ≤ +10 µs for dram)",
                        t.name(),
                        tier - noop
                    );
                }
            }
        }
        if exp == Experiment::Destage {
            use super::writeback::DESTAGE_CASES;
            for &t in &tiers {
                let wb = ratio(DESTAGE_CASES[0], t, ConfigKind::Native);
                let p99 = |case: &str| get(case, t).and_then(|x| x.p99_us);
                let fg = p99(DESTAGE_CASES[1]).zip(p99(DESTAGE_CASES[2])).map(|(a, b)| a / b.max(1.0));
                let _ = writeln!(
                    s,
                    "\n{}: write-back at {} of the disk's sequential write rate (target ≥ 0.80); a durable writer's \
                     p99 while it ran {} its p99 idle (target ≤ 2)",
                    t.name(),
                    cell(wb, 2),
                    cell(fg, 2),
                );
            }
        }
        let failed: Vec<String> = recs
            .iter()
            .filter_map(|x| Some(format!("{} {}: {}", x.config?.name(), x.case, x.error.as_ref()?)))
            .collect();
        if !failed.is_empty() {
            let _ = writeln!(s, "\nFailed: {}", failed.join("; "));
        }
        let _ = writeln!(s);
    }
}

fn render_tiers(s: &mut String, r: &PaperReport) {
    let o = &r.options;
    let _ = writeln!(s, "### randread: who served the 4 KiB reads (page cache / lenders / disk, % of reads)\n");
    let mut head = String::from("| size | pass |");
    let mut rule = String::from("|---|---|");
    for c in &o.configs_for(Experiment::Seqread) {
        let _ = write!(head, " {} |", c.name());
        rule.push_str("---:|");
    }
    let _ = writeln!(s, "{head}\n{rule}");
    for &size in &o.sizes_bytes {
        for pass in [1u32, 2] {
            let mut row = format!("| {} | {pass} |", human(size));
            for &c in &o.configs_for(Experiment::Seqread) {
                let p = r.get(Experiment::Randread, size, c).and_then(|x| x.passes.iter().find(|p| p.pass == pass));
                let t = p.and_then(|p| Some((p.hit_ratio_page_cache?, p.hit_ratio_remote?, p.hit_ratio_disk?)));
                let _ = match t {
                    Some((a, b, d)) => write!(row, " {:.1} / {:.1} / {:.1} |", a * 100.0, b * 100.0, d * 100.0),
                    None => write!(row, " – |"),
                };
            }
            let _ = writeln!(s, "{row}");
        }
    }
    let _ = writeln!(s);
    render_disk_why(s, r);
}

/// The reads of one pass that farcache's disk served, by why: `(the rule sent them there,
/// the lenders lacked their blocks)`, from the mount's counters at the end of this pass and
/// of the one before (the mount is fresh before the first). `None` without the counters.
pub fn disk_why(run: &RunRecord, pass: u32) -> Option<(u64, u64)> {
    let at = |p: u32| run.passes.iter().find(|x| x.pass == p).and_then(|x| x.mount.as_ref());
    let now = at(pass)?;
    let before = if pass > 1 { Some(at(pass - 1)?) } else { None };
    let d = |f: fn(&MountCounters) -> Option<u64>| Some(f(now)?.saturating_sub(before.map_or(Some(0), f)?));
    let routed = d(|m| m.adaptive_disk)?.saturating_sub(d(|m| m.adaptive_probes).unwrap_or(0));
    Some((routed, d(|m| m.disk_reads)?))
}

/// Why farcache's disk served the reads it did (the adaptive rule only).
fn render_disk_why(s: &mut String, r: &PaperReport) {
    let o = &r.options;
    let mut rows = String::new();
    for &size in &o.sizes_bytes {
        let Some(run) = r.get(Experiment::Randread, size, ConfigKind::Farcache) else { continue };
        for p in run.passes.iter().filter(|p| p.outcome.reads > 0) {
            if let Some((routed, lacked)) = disk_why(run, p.pass) {
                let pc = |x: u64| x as f64 * 100.0 / p.outcome.reads as f64;
                let _ = writeln!(rows, "| {} | {} | {:.2} | {:.2} |", human(size), p.pass, pc(routed), pc(lacked));
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "### randread: why farcache's disk served a read (% of reads)\n\n\
         \"The rule\": reads the adaptive rule sent to the disk (its share, not its probes); \
         \"lenders lacked\": reads sent to the lenders that held none of their blocks (a \
         partial hit's disk span is neither).\n\n| size | pass | the rule | lenders lacked |\n|---|---|---:|---:|\n{rows}"
    );
}

fn render_probes(s: &mut String, r: &PaperReport) {
    let o = &r.options;
    if o.probe_reads == 0 {
        return;
    }
    let _ = writeln!(
        s,
        "### randread: one 4 KiB read per tier (O_DIRECT probes of {} random blocks, mean µs over the last \
         three quarters) and the 2nd-pass speedup against what the hardware allows\n",
        o.probe_reads
    );
    let _ = writeln!(
        s,
        "| size | disk, native | disk via the mount (passthrough) | lender hit via the mount (farcache) | \
         allowed = disk via mount ÷ lender hit | pass-level bound | farcache/passthrough 2nd pass | \
         % of allowed | % of pass-level bound |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for &size in &o.sizes_bytes {
        let (n, d, rm) = probe_times(r, size);
        let allowed = d.zip(rm).map(|(d, rm)| d / rm);
        let bound = pass_bound(r, size);
        let achieved = r.ratio(Experiment::Randread, size, ConfigKind::Passthrough, 2);
        let pct = |b: Option<f64>| b.zip(achieved).map(|(a, x)| 100.0 * x / a);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            human(size),
            cell(n, 0),
            cell(d, 0),
            cell(rm, 0),
            cell(allowed, 2),
            cell(bound, 2),
            cell(achieved, 2),
            cell(pct(allowed), 0),
            cell(pct(bound), 0)
        );
    }
    let _ = writeln!(
        s,
        "\n\"Allowed\" is the issue's measure: one disk read's time over one lender hit's. The pass-level \
         bound applies it to the 2nd pass as it was: passthrough's time with each of its disk reads replaced \
         by a lender hit (its page-cache hits stay as they were), so it is lower when part of the file fits \
         in the client.\n"
    );
}

/// How much faster than passthrough a perfect farcache 2nd pass could be: passthrough's
/// 2nd pass with every disk read (at most its pass time per disk read) replaced by a
/// lender hit of the probe's time.
pub fn pass_bound(r: &PaperReport, size: u64) -> Option<f64> {
    let (_, d, rm) = probe_times(r, size);
    let pt = r.get(Experiment::Randread, size, ConfigKind::Passthrough)?.passes.get(1)?;
    let n_disk = pt.hit_ratio_disk? * pt.outcome.reads as f64;
    let t = pt.outcome.secs;
    if n_disk < 1.0 || t <= 0.0 {
        return None;
    }
    let t_disk = (d? * 1e-6).min(t / n_disk);
    let allowed_secs = t - n_disk * (t_disk - rm? * 1e-6).max(0.0);
    Some(t / allowed_secs.max(1e-9))
}

fn render_pgbench(s: &mut String, r: &PaperReport) {
    let o = &r.options;
    if !o.experiments.contains(&Experiment::Pgbench) {
        return;
    }
    let _ = writeln!(s, "## pgbench: transactions per second\n");
    if let Some(e) = &r.pgbench_error {
        let _ = writeln!(s, "The database could not be made: {e}\n");
        return;
    }
    if let Some(p) = &r.pgbench_setup {
        let _ = writeln!(
            s,
            "PostgreSQL 15, shared_buffers 32MB, pgbench scale {} ({:.0} MiB on disk), {} s per run, runs in \
             this order on one server per configuration (so later runs find what earlier ones cached).\n",
            p.scale,
            p.database_bytes as f64 / (1u64 << 20) as f64,
            o.pgbench_secs
        );
    }
    let mut head = String::from("| workload | clients |");
    let mut rule = String::from("|---|---:|");
    for c in &o.configs_for(Experiment::Pgbench) {
        let _ = write!(head, " {} |", c.name());
        rule.push_str("---:|");
    }
    let tiers: Vec<ConfigKind> = o.configs_for(Experiment::Pgbench).into_iter().filter(|c| c.has_tier()).collect();
    for t in &tiers {
        let _ = write!(head, " {}/passthrough |", t.name());
        rule.push_str("---:|");
    }
    let _ = writeln!(s, "{head} farcache/passthrough | farcache/ideal |\n{rule}---:|---:|");
    let tps = |cfg, mode, c| {
        r.pgbench
            .iter()
            .find(|x| x.config == cfg && x.mode == mode && x.clients == c && x.error.is_none())
            .map(|x| x.tps)
            .filter(|t| *t > 0.0)
    };
    for mode in [PgMode::SelectOnly, PgMode::TpcB] {
        for &c in &o.pgbench_clients {
            let mut row = format!("| {} | {c} |", mode.name());
            for &cfg in &o.configs_for(Experiment::Pgbench) {
                let _ = write!(row, " {} |", cell(tps(cfg, mode, c), 0));
            }
            let f = tps(ConfigKind::Farcache, mode, c);
            let pt = tps(ConfigKind::Passthrough, mode, c);
            let id = tps(ConfigKind::Ideal, mode, c);
            for &t in &tiers {
                let _ = write!(row, " {} |", cell(tps(t, mode, c).zip(pt).map(|(t, p)| t / p), 2));
            }
            let _ = writeln!(
                s,
                "{row} {} | {} |",
                cell(f.zip(pt).map(|(f, p)| f / p), 2),
                cell(f.zip(id).map(|(f, i)| f / i), 2)
            );
        }
    }
    let _ = writeln!(s);
    render_pgbench_cpu(s, r);
    render_pgbench_fuse(s, r);
}

/// CPU time per transaction, by who spent it: on two shared cores a CPU-bound run's rate is
/// what its CPU per transaction allows, and this is the figure other work on the machine
/// disturbs least (the machine's column shows how much other work there was).
fn render_pgbench_cpu(s: &mut String, r: &PaperReport) {
    let runs: Vec<&PgRecord> = r.pgbench.iter().filter(|x| x.error.is_none() && x.transactions > 0).collect();
    if runs.iter().all(|x| x.cpu.client_ms == 0.0) {
        return;
    }
    let _ = writeln!(
        s,
        "CPU per transaction (µs): the client's cgroup (PostgreSQL, pgbench, the mount daemon), the daemon \
         alone, the lenders' processes, and the whole machine (softirq and any other work included).\n\n\
         | workload | clients | configuration | tps | client | daemon | lenders | machine |\n\
         |---|---:|---|---:|---:|---:|---:|---:|"
    );
    let per_tx = |ms: f64, tx: u64| cell(Some(ms * 1e3 / tx as f64), 0);
    for mode in [PgMode::SelectOnly, PgMode::TpcB] {
        for &c in &r.options.pgbench_clients {
            for x in runs.iter().filter(|x| x.mode == mode && x.clients == c) {
                let _ = writeln!(
                    s,
                    "| {} | {c} | {} | {:.0} | {} | {} | {} | {} |",
                    mode.name(),
                    x.config.name(),
                    x.tps,
                    per_tx(x.cpu.client_ms, x.transactions),
                    per_tx(x.cpu.daemon_ms, x.transactions),
                    per_tx(x.cpu.lenders_ms, x.transactions),
                    per_tx(x.cpu.machine_ms, x.transactions)
                );
            }
        }
    }
    let _ = writeln!(s);
    // Which of the daemon's threads a difference is in.
    let mut groups: Vec<&String> = runs.iter().flat_map(|x| x.daemon_threads_ms.keys()).collect();
    groups.sort();
    groups.dedup();
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "The daemon's CPU per transaction (µs) by thread group (thread names without digits; \
         `(ended threads)`: threads that ended during the run).\n\n\
         | workload | clients | configuration | {} |\n|---|---:|---|{}",
        groups.iter().map(|g| format!("`{g}`")).collect::<Vec<_>>().join(" | "),
        "---:|".repeat(groups.len())
    );
    for mode in [PgMode::SelectOnly, PgMode::TpcB] {
        for &c in &r.options.pgbench_clients {
            for x in runs.iter().filter(|x| x.mode == mode && x.clients == c && !x.daemon_threads_ms.is_empty()) {
                let cells: Vec<String> = groups
                    .iter()
                    .map(|g| per_tx(x.daemon_threads_ms.get(*g).copied().unwrap_or(0.0), x.transactions))
                    .collect();
                let _ = writeln!(s, "| {} | {c} | {} | {} |", mode.name(), x.config.name(), cells.join(" | "));
            }
        }
    }
    let _ = writeln!(s);
}

/// FUSE requests per transaction, by opcode (the six most frequent over the runs shown, the
/// rest together): where a configuration's extra CPU per transaction comes from more round
/// trips rather than dearer ones.
fn render_pgbench_fuse(s: &mut String, r: &PaperReport) {
    let runs: Vec<&PgRecord> =
        r.pgbench.iter().filter(|x| x.error.is_none() && x.transactions > 0 && !x.fuse_ops.is_empty()).collect();
    if runs.is_empty() {
        return;
    }
    let mut totals: std::collections::BTreeMap<&str, u64> = Default::default();
    for x in &runs {
        for (op, n) in &x.fuse_ops {
            *totals.entry(op.as_str()).or_default() += n;
        }
    }
    let mut ops: Vec<(&str, u64)> = totals.into_iter().collect();
    ops.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let shown: Vec<&str> = ops.iter().take(6).map(|(op, _)| *op).collect();
    let _ = writeln!(
        s,
        "FUSE requests per transaction that reached the daemon (`fuse.ops`), by opcode.\n\n\
         | workload | clients | configuration | all | {} | others |\n|---|---:|---|---:|{}---:|",
        shown.iter().map(|op| format!("`{op}`")).collect::<Vec<_>>().join(" | "),
        "---:|".repeat(shown.len())
    );
    let per_tx = |n: u64, tx: u64| format!("{:.2}", n as f64 / tx as f64);
    for mode in [PgMode::SelectOnly, PgMode::TpcB] {
        for &c in &r.options.pgbench_clients {
            for x in runs.iter().filter(|x| x.mode == mode && x.clients == c) {
                let all: u64 = x.fuse_ops.values().sum();
                let counts: Vec<u64> = shown.iter().map(|op| x.fuse_ops.get(*op).copied().unwrap_or(0)).collect();
                let cells: Vec<String> = counts.iter().map(|&n| per_tx(n, x.transactions)).collect();
                let others = all - counts.iter().sum::<u64>();
                let _ = writeln!(
                    s,
                    "| {} | {c} | {} | {} | {} | {} |",
                    mode.name(),
                    x.config.name(),
                    per_tx(all, x.transactions),
                    cells.join(" | "),
                    per_tx(others, x.transactions)
                );
            }
        }
    }
    let _ = writeln!(s);
}

fn render_tpch(s: &mut String, r: &PaperReport) {
    let o = &r.options;
    if !o.experiments.contains(&Experiment::Tpch) {
        return;
    }
    let _ = writeln!(s, "## tpch ({}): load, power and throughput tests\n", Experiment::Tpch.table());
    if let Some(e) = &r.tpch_error {
        let _ = writeln!(s, "The data could not be made: {e}\n");
        return;
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    if let Some(p) = &r.tpch_setup {
        let db = r.tpch.iter().map(|x| x.database_bytes).max().unwrap_or(0);
        let _ = writeln!(
            s,
            "PostgreSQL 15 (shared_buffers {}, work_mem {}, maintenance_work_mem {}, no parallel query, JIT off), \
             TPC-H scale factor {} from \
             {} ({:.0} MiB of CSV, generated in {:.0} s, read by each configuration's COPY through its own file \
             system); database after the load test {:.0} MiB = {:.1}× the client's {}; lenders {} × {}. Power \
             test: the specification's stream 0 query order; throughput test: streams 1 and 2 at once, queries \
             per hour = completed queries × 3600 ÷ seconds. statement_timeout {} s per query, {} s per \
             configuration. No refresh functions (RF1/RF2).\n",
            p.shared_buffers,
            p.work_mem,
            p.maintenance_work_mem,
            super::tpch::sf_text(p.scale_factor),
            p.generator,
            mib(p.data_bytes),
            p.gen_secs,
            mib(db),
            db as f64 / o.memory_bytes as f64,
            human(o.memory_bytes),
            o.lenders,
            human(p.lender_capacity_bytes),
            p.statement_timeout_secs,
            p.config_deadline_secs
        );
    }
    let cfgs = &o.configs_for(Experiment::Tpch);
    let mut head = String::from("| test |");
    let mut rule = String::from("|---|");
    for c in cfgs {
        let _ = write!(head, " {} |", c.name());
        rule.push_str("---:|");
    }
    let tiers: Vec<ConfigKind> = o.configs_for(Experiment::Pgbench).into_iter().filter(|c| c.has_tier()).collect();
    for t in &tiers {
        let _ = write!(head, " {}/passthrough |", t.name());
        rule.push_str("---:|");
    }
    let _ = writeln!(s, "{head} farcache/passthrough | farcache/ideal |\n{rule}---:|---:|");
    let get = |c: ConfigKind| r.tpch.iter().find(|x| x.config == Some(c));
    let note = |x: &TpchRecord, stream0: bool| {
        let n = x.queries().filter(|q| (q.stream == 0) == stream0 && q.status != QueryStatus::Ok).count();
        if n > 0 {
            format!(" ({n} not done)")
        } else {
            String::new()
        }
    };
    let (pl, pp, pt) = r.tpch_ratios(ConfigKind::Passthrough);
    let (il, ip, it) = r.tpch_ratios(ConfigKind::Ideal);
    let value = |x: &TpchRecord, test: usize| match test {
        0 => cell(x.load_secs, 1),
        1 => format!("{}{}", cell(x.power_secs, 1), note(x, true)),
        _ => format!("{}{}", cell(x.queries_per_hour, 0), note(x, false)),
    };
    let rows = [("load test (s)", pl, il), ("power test (s)", pp, ip), ("throughput test (queries/h)", pt, it)];
    for (test, (name, a, b)) in rows.iter().enumerate() {
        let mut row = format!("| {name} |");
        for &c in cfgs {
            let v = match get(c) {
                Some(x) if x.error.is_none() => value(x, test),
                Some(_) => "failed".into(),
                None => "–".into(),
            };
            let _ = write!(row, " {v} |");
        }
        let _ = writeln!(s, "{row} {} | {} |", cell(*a, 2), cell(*b, 2));
    }
    let mut row = String::from("| power test, sum of the 22 query times (s) |");
    for &c in cfgs {
        let sum = get(c)
            .filter(|x| x.error.is_none() && x.power.len() == 22 && x.power.iter().all(|q| q.status == QueryStatus::Ok))
            .map(|x| x.power.iter().map(|q| q.secs).sum::<f64>());
        let _ = write!(row, " {} |", cell(sum, 2));
    }
    let _ = writeln!(s, "{row} | |");
    let mut row = String::from("| database after load (MiB) |");
    for &c in cfgs {
        let _ = write!(
            row,
            " {} |",
            get(c).filter(|x| x.database_bytes > 0).map_or("–".into(), |x| format!("{:.0}", mib(x.database_bytes)))
        );
    }
    let _ = writeln!(s, "{row} | |");
    let _ = writeln!(
        s,
        "\nRatios: the other configuration's time ÷ farcache's for the load and power tests, farcache's \
         queries per hour ÷ the other's for the throughput test (> 1: farcache is better). \"not done\": \
         queries that timed out, failed or were skipped at the deadline. The power test's time is the \
         stream's, from the harness: it includes starting one psql per query (tens of ms each), which is \
         what dominates at tiny scale factors; the sum of the query times is psql's `\\timing`.\n"
    );
    // The power test query by query.
    let _ = writeln!(s, "### tpch power test: seconds per query (psql's \\timing)\n");
    let mut head = String::from("| query | rows |");
    let mut rule = String::from("|---|---:|");
    for c in cfgs {
        let _ = write!(head, " {} |", c.name());
        rule.push_str("---:|");
    }
    let _ = writeln!(s, "{head} farcache/passthrough |\n{rule}---:|");
    let q_of = |c: ConfigKind, q: u32| get(c).and_then(|x| x.power.iter().find(|p| p.query == q));
    for &q in &super::tpch::STREAM_ORDERS[0] {
        let rows = cfgs.iter().find_map(|&c| q_of(c, q).filter(|p| p.status == QueryStatus::Ok)).map(|p| p.rows);
        let mut row = format!("| Q{q} | {} |", rows.map_or("–".into(), |n| n.to_string()));
        for &c in cfgs {
            let v = match q_of(c, q) {
                Some(p) if p.status == QueryStatus::Ok => format!("{:.2}", p.secs),
                Some(p) if p.status == QueryStatus::TimedOut => "timed out".into(),
                Some(p) if p.status == QueryStatus::Skipped => "skipped".into(),
                Some(_) => "failed".into(),
                None => "–".into(),
            };
            let _ = write!(row, " {v} |");
        }
        let ok = |c| q_of(c, q).filter(|p| p.status == QueryStatus::Ok).map(|p| p.secs);
        let ratio = ok(ConfigKind::Passthrough).zip(ok(ConfigKind::Farcache)).map(|(p, f)| p / f.max(1e-6));
        let _ = writeln!(s, "{row} {} |", cell(ratio, 2));
    }
    let _ = writeln!(s, "\n(In the specification's stream 0 order.)\n");
    render_tpch_cpu(s, r);
}

/// Each test's CPU time by who spent it, and the machine's busy share: whether a test was
/// bound by the CPUs rather than by the disk or the lenders, and how much of the machine the
/// lenders took — on this testbed they share the client's CPUs, in a deployment they are
/// other machines.
fn render_tpch_cpu(s: &mut String, r: &PaperReport) {
    let runs: Vec<&TpchRecord> =
        r.tpch.iter().filter(|x| x.error.is_none() && x.power_phase.cpu.machine_ms > 0.0).collect();
    if runs.is_empty() {
        return;
    }
    let cpus = r.machine.cpus.max(1) as f64;
    let _ = writeln!(
        s,
        "### tpch: CPU time by who spent it (s)\n\n\
         The client's cgroup (PostgreSQL, psql and the mount daemon), the daemon alone, the lenders' \
         processes (here on the client's {cpus:.0} CPUs; in a deployment other machines'), the whole \
         machine (softirq, the loop device and any other work included), and the machine's busy share of \
         the test's {cpus:.0} × seconds.\n\n\
         | configuration | test | seconds | client | daemon | lenders | machine | busy |\n\
         |---|---|---:|---:|---:|---:|---:|---:|"
    );
    for x in runs {
        for (test, p) in [("load", &x.load), ("power", &x.power_phase), ("throughput", &x.throughput_phase)] {
            let c = &p.cpu;
            let busy = (p.secs > 0.0).then(|| c.machine_ms / 1e3 / (p.secs * cpus) * 100.0);
            let _ = writeln!(
                s,
                "| {} | {test} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                x.config.map_or("?", |c| c.name()),
                p.secs,
                c.client_ms / 1e3,
                c.daemon_ms / 1e3,
                c.lenders_ms / 1e3,
                c.machine_ms / 1e3,
                busy.map_or("–".into(), |b| format!("{b:.0}%"))
            );
        }
    }
    let _ = writeln!(s);
}

/// The measurements during which the rest of the machine moved more than
/// [`OTHER_IO_FLAG_BYTES`], at more than [`OTHER_IO_FLAG_RATE`], on the disk under the loop
/// device ([`DiskStat::other_io_flagged`]; nothing when none did).
fn render_other_io(s: &mut String, r: &PaperReport) {
    let mut rows = Vec::new();
    for run in &r.runs {
        for p in &run.passes {
            let what = format!(
                "{} {} {} pass {}",
                run.experiment.name(),
                human_bytes(run.size_bytes),
                run.config.name(),
                p.pass
            );
            rows.push((what, p.disk, p.outcome.secs));
        }
    }
    for p in &r.pgbench {
        rows.push((format!("pgbench {} {} {} clients", p.config.name(), p.mode.name(), p.clients), p.disk, p.secs));
    }
    rows.retain(|(_, d, secs)| d.other_io_flagged(*secs));
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Other I/O on the machine's disk\n\nThe loop device's image lives on the machine's own disk; its throttle caps the \
         loop device, not what the rest of the machine does to that disk. These measurements saw more than {} MiB of other \
         traffic there, at more than {} MiB/s (a build, a copy): their times are not comparable with the other \
         configurations'.\n\n| measurement | seconds | other I/O |\n|---|---:|---:|",
        OTHER_IO_FLAG_BYTES >> 20,
        OTHER_IO_FLAG_RATE as u64 >> 20
    );
    for (what, d, secs) in rows {
        let _ = writeln!(s, "| {what} | {secs:.1} | {} |", human_bytes(d.other_bytes()));
    }
    let _ = writeln!(s);
}

fn render_memory(s: &mut String, r: &PaperReport) {
    let o = &r.options;
    let _ = writeln!(
        s,
        "## The client's memory: the mount daemon's RSS after the run, and the memory cgroup's peak\n\n\
         RSS counts pages the daemon's allocator has freed lazily (`MADV_FREE`), which the kernel takes \
         back when the cgroup needs them; \"held\" is its anonymous memory without them, what it keeps \
         charged to the client's cgroup beyond shared file pages.\n\n\
         | experiment | size | daemon RSS / held, passthrough | daemon RSS / held, farcache | cgroup peak native | \
         passthrough | farcache |\n|---|---|---:|---:|---:|---:|---:|"
    );
    let mib = |x: Option<u64>| x.map_or("–".into(), |b| format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64));
    let both = |rss: Option<u64>, held: Option<u64>| match held {
        Some(_) => format!("{} / {}", mib(rss), mib(held)),
        None => mib(rss),
    };
    for &exp in o.experiments.iter().filter(|e| e.per_size()) {
        for &size in &o.sizes_bytes {
            let g = |c| r.get(exp, size, c);
            let daemon = |c| g(c).map_or("–".into(), |x: &RunRecord| both(x.daemon_rss_bytes, x.daemon_anon_bytes));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                exp.name(),
                human(size),
                daemon(ConfigKind::Passthrough),
                daemon(ConfigKind::Farcache),
                mib(g(ConfigKind::Native).and_then(|x| x.memory_max_usage_bytes)),
                mib(g(ConfigKind::Passthrough).and_then(|x| x.memory_max_usage_bytes)),
                mib(g(ConfigKind::Farcache).and_then(|x| x.memory_max_usage_bytes)),
            );
        }
    }
    if o.experiments.contains(&Experiment::Tpch) {
        let g = |c| r.tpch.iter().find(|x| x.config == Some(c));
        let daemon = |c| g(c).map_or("–".into(), |x| both(x.daemon_rss_bytes, x.daemon_anon_bytes));
        let _ = writeln!(
            s,
            "| tpch | all tests | {} | {} | {} | {} | {} |",
            daemon(ConfigKind::Passthrough),
            daemon(ConfigKind::Farcache),
            mib(g(ConfigKind::Native).and_then(|x| x.memory_max_usage_bytes)),
            mib(g(ConfigKind::Passthrough).and_then(|x| x.memory_max_usage_bytes)),
            mib(g(ConfigKind::Farcache).and_then(|x| x.memory_max_usage_bytes)),
        );
    }
    let _ = writeln!(s);
}

fn render_transfers(s: &mut String, r: &PaperReport) {
    let rows: Vec<&RunRecord> =
        r.runs.iter().filter(|x| x.config == ConfigKind::Farcache && x.error.is_none()).collect();
    let pg: Vec<&PgRecord> =
        r.pgbench.iter().filter(|x| x.config == ConfigKind::Farcache && x.error.is_none()).collect();
    let tp: Vec<&TpchRecord> =
        r.tpch.iter().filter(|x| x.config == Some(ConfigKind::Farcache) && x.error.is_none()).collect();
    if rows.is_empty() && pg.is_empty() && tp.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## transfers (Table 9): farcache's traffic with its lenders (both passes; pgbench: each run; tpch: each test)\n\n\
         | experiment | size | to lenders | from lenders | invalidated blocks | evicted blocks | index | source |\n\
         |---|---|---:|---:|---:|---:|---:|---|"
    );
    for x in rows {
        let t = &x.transfers;
        let evicted: u64 = x.passes.iter().map(|p| p.lenders.evictions).sum();
        let index = x
            .mount
            .as_ref()
            .and_then(|m| m.index_bytes)
            .map_or("–".into(), |b| format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            x.experiment.name(),
            human(x.size_bytes),
            human_bytes(t.bytes_to_servers),
            human_bytes(t.bytes_from_servers),
            t.invalidations,
            evicted,
            index,
            t.source
        );
    }
    // pgbench: the lenders' counters per run (bytes in and out, deletions = invalidations).
    for x in pg {
        let l = &x.lenders;
        let index = x
            .mount
            .as_ref()
            .and_then(|m| m.index_bytes)
            .map_or("–".into(), |b| format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64));
        let _ = writeln!(
            s,
            "| pgbench {} | {} clients | {} | {} | {} | {} | {} | lender STATS |",
            x.mode.name(),
            x.clients,
            human_bytes(l.bytes_in),
            human_bytes(l.bytes_out),
            l.dels,
            l.evictions,
            index
        );
    }
    // tpch: each test, from the mount's counters (else the lenders'), evictions from the lenders.
    for x in tp {
        let index = x
            .mount
            .as_ref()
            .and_then(|m| m.index_bytes)
            .map_or("–".into(), |b| format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64));
        for (test, p) in [("load", &x.load), ("power", &x.power_phase), ("throughput", &x.throughput_phase)] {
            let t = &p.transfers;
            let _ = writeln!(
                s,
                "| tpch {test} test | SF {} | {} | {} | {} | {} | {} | {} |",
                r.tpch_setup.as_ref().map_or("?".into(), |p| super::tpch::sf_text(p.scale_factor)),
                human_bytes(t.bytes_to_servers),
                human_bytes(t.bytes_from_servers),
                t.invalidations,
                p.lenders.evictions,
                index,
                t.source
            );
        }
    }
    let _ = writeln!(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damon_reading_never_fails() {
        if let Some(d) = damon_reclaim() {
            assert!(d.contains("idle for"), "{d}");
            println!("{d}");
        }
    }

    #[test]
    fn tpch_tests_cpu_by_who_and_the_busy_share() {
        use super::super::counters::CpuTime;
        let o = PaperOptions::quick("farcache".into());
        let mut r = PaperReport::new(&o);
        r.machine.cpus = 2;
        let mut x = TpchRecord { config: Some(ConfigKind::Farcache), ..TpchRecord::default() };
        x.power_phase.secs = 100.0;
        x.power_phase.cpu = CpuTime { client_ms: 90e3, daemon_ms: 40e3, lenders_ms: 30e3, machine_ms: 150e3 };
        r.tpch.push(x.clone());
        // A record from before the CPU was measured shows no rows rather than zeros.
        x.config = Some(ConfigKind::Passthrough);
        x.power_phase.cpu = CpuTime::default();
        r.tpch.push(x);
        let mut s = String::new();
        render_tpch_cpu(&mut s, &r);
        assert!(s.contains("| farcache | power | 100.0 | 90.0 | 40.0 | 30.0 | 150.0 | 75% |"), "{s}");
        assert!(s.contains("| farcache | load | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | – |"), "{s}");
        assert!(!s.contains("| passthrough |"), "{s}");
        let mut empty = PaperReport::new(&o);
        empty.tpch.push(TpchRecord::default());
        let mut s = String::new();
        render_tpch_cpu(&mut s, &empty);
        assert!(s.is_empty(), "{s}");
    }

    #[test]
    fn fuse_requests_per_transaction_by_opcode() {
        let mut o = PaperOptions::quick("farcache".into());
        o.pgbench_clients = vec![4];
        let mut r = PaperReport::new(&o);
        let rec = |cfg, ops: &[(&str, u64)]| {
            let mut x = PgRecord::failed(cfg, String::new());
            (x.error, x.mode, x.clients, x.transactions, x.tps) = (None, PgMode::TpcB, 4, 1000, 100.0);
            x.fuse_ops = ops.iter().map(|(k, n)| (k.to_string(), *n)).collect();
            x
        };
        r.pgbench.push(rec(
            ConfigKind::Passthrough,
            &[
                ("read", 1200),
                ("write", 3000),
                ("fsync", 1000),
                ("getattr", 10),
                ("lseek", 5),
                ("open", 3),
                ("flush", 2),
            ],
        ));
        r.pgbench.push(rec(ConfigKind::Farcache, &[("read", 1500), ("write", 3000), ("fsync", 1000)]));
        // A run without the counters (a daemon that predates them) is left out, not shown as 0.
        r.pgbench.push(rec(ConfigKind::Native, &[]));
        let mut s = String::new();
        render_pgbench_fuse(&mut s, &r);
        assert!(s.contains("| all | `write` | `read` | `fsync` | `getattr` | `lseek` | `open` | others |"), "{s}");
        assert!(
            s.contains("| tpc-b | 4 | passthrough | 5.22 | 3.00 | 1.20 | 1.00 | 0.01 | 0.01 | 0.00 | 0.00 |"),
            "{s}"
        );
        assert!(s.contains("| tpc-b | 4 | farcache | 5.50 | 3.00 | 1.50 | 1.00 | 0.00 | 0.00 | 0.00 | 0.00 |"), "{s}");
        assert!(!s.contains("native"), "{s}");
    }

    /// Quick options for randread alone, an empty report of them, and their one size.
    fn randread_report() -> (PaperOptions, PaperReport, u64) {
        let mut o = PaperOptions::quick("farcache".into());
        o.experiments = vec![Experiment::Randread];
        let r = PaperReport::new(&o);
        let size = o.sizes_bytes[0];
        (o, r, size)
    }

    #[test]
    fn why_the_disk_served_a_read_per_pass() {
        let (o, mut r, size) = randread_report();
        let mut x = RunRecord::new(Experiment::Randread, size, ConfigKind::Farcache, Some(o.memory_bytes));
        // Counters at the end of each pass: cumulative, from a fresh mount.
        for (pass, disk, probes, lacked) in [(1, 300, 20, 500), (2, 330, 25, 510)] {
            let mut p = PassRecord { pass, ..PassRecord::default() };
            p.outcome.reads = 1000;
            p.mount = Some(MountCounters {
                adaptive_disk: Some(disk),
                adaptive_probes: Some(probes),
                disk_reads: Some(lacked),
                ..MountCounters::default()
            });
            x.passes.push(p);
        }
        assert_eq!(disk_why(&x, 1), Some((280, 500)));
        assert_eq!(disk_why(&x, 2), Some((25, 10)));
        r.runs.push(x.clone());
        let mut s = String::new();
        render_disk_why(&mut s, &r);
        assert!(s.contains("| 2 | 2.50 | 1.00 |"), "{s}");
        assert!(s.contains("| 1 | 28.00 | 50.00 |"), "{s}");
        // A daemon without the rule's counters (the threshold rule's, an older build) shows
        // no table rather than zeros.
        x.passes.iter_mut().for_each(|p| p.mount.as_mut().unwrap().adaptive_disk = None);
        assert_eq!(disk_why(&x, 2), None);
        r.runs[0] = x;
        let mut s = String::new();
        render_disk_why(&mut s, &r);
        assert!(s.is_empty(), "{s}");
    }

    #[test]
    fn ratios_and_pass_bound_from_records() {
        let (o, mut r, size) = randread_report();
        let mut add = |cfg, t1: f64, t2: f64, disk2: f64, probe_us: f64| {
            let mut x = RunRecord::new(Experiment::Randread, size, cfg, Some(o.memory_bytes));
            for (pass, t) in [(1, t1), (2, t2)] {
                let mut p = PassRecord { pass, ..PassRecord::default() };
                p.outcome.secs = t;
                p.outcome.reads = 1000;
                p.outcome.bytes = size;
                p.hit_ratio_disk = Some(disk2);
                x.passes.push(p);
            }
            x.probe = Some(ProbeRecord {
                measured: PassOutcome { lat_us_mean: probe_us, ..PassOutcome::default() },
                ..ProbeRecord::default()
            });
            r.runs.push(x);
        };
        add(ConfigKind::Passthrough, 4.0, 0.25, 0.5, 400.0);
        add(ConfigKind::Farcache, 4.0, 0.125, 0.0, 100.0);
        assert_eq!(r.ratio(Experiment::Randread, size, ConfigKind::Passthrough, 2), Some(2.0));
        // 500 disk reads of 400 µs (the probe; the pass allows up to 0.25 s / 500 = 500 µs)
        // become 100 µs lender hits: 0.25 s → 0.1 s.
        assert!((pass_bound(&r, size).unwrap() - 2.5).abs() < 1e-9, "{:?}", pass_bound(&r, size));
        r.evaluate();
        assert!(r.targets.iter().any(|t| t.what.contains("80% of disk read")));
        assert!(render(&r).contains("| 128MiB |"));
    }
}
