//! `tenants` (paper 004, issue 13): three PostgreSQL tenants sharing one lender, the lender
//! started with each allocation mode in turn (`farcache server --allocation shared | static |
//! hit-ratio | mrc`).
//!
//! - Each tenant has its own slow disk ([`Testbed::add_disk`], throttled like the testbed's),
//!   its own memory cgroup (a small page cache, so that reads fall out of it), its own
//!   `farcache mount --tenant tenantN` of that disk, and its own PostgreSQL 15 cluster (data
//!   directory on the mount, port [`PORT_BASE`]` + N`) holding a TPC-H database; the scale
//!   factors are in the ratio 1:2:3 (the paper: 0.25 / 0.5 / 0.75). The databases are loaded
//!   once, on the disks directly ([`tpch::prepare_at`], [`tpch::load`]), and only read after.
//! - One lender ([`Testbed::start_lender`], open mode: each mount's `--tenant` is its tenant)
//!   lends a fraction of the three databases' total size (the paper's memory-to-data ratio:
//!   about 0.38). The three tenants say HELLO to it together right after it starts (the
//!   paper's VMs boot together), before the mounts start one after the other. With
//!   `--tenants-min PERCENT` the three tenants are configured instead (`[[server.tenant]]`,
//!   a secret each, which its mount presents from a `secret_file`) with `min_bytes` of that
//!   percent of the lender, so that "zero min_bytes violations" checks something (in open
//!   mode every minimum is 0).
//! - The mounts route by threshold with `tenants_threshold` (1 MiB by default), so that Q4's
//!   sequential scans, which arrive as 128 KiB readahead, reach the lender: with the mount's
//!   defaults they go to the disk (measured; BENCHMARKS.md).
//! - Per (capacity, mode): a cold start (every disk remounted, new cgroups, new mounts, a new
//!   lender), then each tenant runs its query [`TenantsQuery`] `runs` times, the three at once;
//!   before each run a tenant waits a seeded random 0–[`JITTER_SECS`] s, so that which tenant
//!   starts first, and how their runs overlap, is random (the paper: "SF order random").
//! - Meanwhile the lender's STATS are read every second ([`POLL`]): each tenant's target,
//!   use, minimum, hits and misses — the allocation over time (the paper's Fig. 4).
//! - Recorded: total completion time, every query (time, rows, checksum), per tenant the
//!   lender's hits and misses and the mount's counters (lender reads against disk reads: the
//!   check that the queries reach the lender at all).
//! - Resumable: a (capacity, mode) point already in the results file is kept, not run again
//!   (`run_experiment` is handed the earlier records); results are saved after each point.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cgroup::Cgroup;
use super::mount::{MountCounters, MountDaemon};
use super::pgbench::{self, Server};
use super::report::{PaperReport, Verdict};
use super::testbed::{ExtraDisk, Testbed};
use super::tpch::{self, QueryStatus, TpchQuery, TpchRecord};
use super::{human, run as runner, sys, ConfigKind, PaperOptions, GIB, MIB};
use crate::error::IoContext;
use crate::fc_client::FcClient;
use crate::progress::Progress;
use crate::rng::{mix64, Rng};
use crate::{BenchError, Result};

/// The allocation modes, in the order they run (the lender's `--allocation`).
pub const MODES: [&str; 4] = ["shared", "static", "hit-ratio", "mrc"];
/// Tenant N's PostgreSQL listens on this port + N.
pub const PORT_BASE: u16 = 5440;
/// A tenant waits up to this long (seeded, uniform) before each of its runs.
pub const JITTER_SECS: f64 = 2.0;
/// How often the lender's STATS are read.
pub const POLL: Duration = Duration::from_secs(1);
/// The paper's memory-to-data ratio (4 GiB against TPC-H at SF 1 + 2 + 3).
pub const PAPER_FRACTION: f64 = 0.38;
/// Rows of Q4's answer: one per order priority.
pub const Q4_ROWS: u64 = 5;
/// How much longer than its statement_timeout a query may run before the harness kills it.
const PSQL_GRACE: Duration = Duration::from_secs(60);
const HEARTBEAT: Duration = Duration::from_secs(30);

/// What each tenant runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TenantsQuery {
    /// TPC-H Q4 with PostgreSQL's own plan.
    Q4,
    /// Q4 with its plan held to index probes (no sequential or bitmap scans, no hash or
    /// merge joins): orders through its o_orderdate index, lineitem probed through its
    /// primary key per order — 8 KiB random reads. (Measured: at small scale factors these
    /// stay in PostgreSQL's shared buffers, and reach neither the lender nor the disk after
    /// the first run; the plain plan's scans of lineitem go through a ring buffer and are
    /// read again every run.)
    Q4Index,
}

impl TenantsQuery {
    pub fn name(self) -> &'static str {
        match self {
            TenantsQuery::Q4 => "q4",
            TenantsQuery::Q4Index => "q4-index",
        }
    }

    /// The settings the query runs with (PGOPTIONS).
    pub fn pg_options(self) -> &'static str {
        match self {
            TenantsQuery::Q4 => "",
            TenantsQuery::Q4Index => {
                "-c enable_seqscan=off -c enable_bitmapscan=off -c enable_hashjoin=off -c enable_mergejoin=off"
            }
        }
    }
}

impl std::str::FromStr for TenantsQuery {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "q4" => Ok(TenantsQuery::Q4),
            "q4-index" => Ok(TenantsQuery::Q4Index),
            _ => Err(format!("unknown tenants query {s:?}: q4 or q4-index")),
        }
    }
}

/// One tenant's database.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantDb {
    pub name: String,
    pub scale_factor: f64,
    pub port: u16,
    pub database_bytes: u64,
    pub load_secs: f64,
    pub lineitem_rows: u64,
    /// `EXPLAIN` of the query with its settings, on this database.
    pub plan: String,
}

/// The databases, made once per run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantsSetup {
    pub tenants: Vec<TenantDb>,
    pub total_database_bytes: u64,
    pub generator: String,
}

/// One tenant's part of a point.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantResult {
    pub name: String,
    pub scale_factor: f64,
    pub queries: Vec<TpchQuery>,
    /// Mean seconds of its completed runs.
    pub mean_secs: Option<f64>,
    /// Seconds from the point's start until its last run ended.
    pub finish_secs: f64,
    /// The lender's counters of this tenant at the end (since the lender started).
    pub lender: farcache_server::TenantCounters,
    pub hit_ratio: Option<f64>,
    /// The mount's counters at the end (lender reads against disk reads).
    pub mount: Option<MountCounters>,
    /// Of the reads below the page cache, the share the lender served (the mount's
    /// counters: lender reads ÷ (lender reads + disk reads)). The lender's own hit ratio
    /// counts only what the mount asked for, and a mount asks only for blocks it stored
    /// there: a miss is a block the lender evicted, and reads the mount routes to the disk
    /// (blocks it never stored, or knows are gone) are not in it at all.
    #[serde(default)]
    pub lender_share: Option<f64>,
    pub memory_max_usage_bytes: Option<u64>,
    pub oom_kills: Option<u64>,
}

/// One tenant in one reading of the lender's STATS.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocPoint {
    pub name: String,
    pub target_bytes: u64,
    pub used_bytes: u64,
    pub min_bytes: u64,
    pub hits: u64,
    pub misses: u64,
}

/// One reading of the lender's STATS.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocSample {
    /// Seconds since the point's queries started (negative: before).
    pub t_secs: f64,
    pub tenants: Vec<AllocPoint>,
}

/// One (capacity, mode) point.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantsRecord {
    pub mode: String,
    /// The lender's capacity as a share of the three databases' total size.
    pub capacity_fraction: f64,
    pub capacity_bytes: u64,
    /// Seconds from the first run's start to the last run's end, all tenants.
    pub total_secs: f64,
    pub tenants: Vec<TenantResult>,
    pub samples: Vec<AllocSample>,
    pub secs_total: f64,
    pub error: Option<String>,
}

impl TenantsRecord {
    /// Mean seconds of every completed run of every tenant.
    pub fn mean_secs(&self) -> Option<f64> {
        let t: Vec<f64> = self
            .tenants
            .iter()
            .flat_map(|t| &t.queries)
            .filter(|q| q.status == QueryStatus::Ok)
            .map(|q| q.secs)
            .collect();
        (!t.is_empty()).then(|| t.iter().sum::<f64>() / t.len() as f64)
    }

    /// Whether this mode's targets are a division of the capacity (all but `shared`, whose
    /// "target" is each tenant's limit).
    pub fn divides(&self) -> bool {
        self.mode != "shared"
    }

    /// The largest sum of targets over the samples.
    pub fn max_target_sum(&self) -> u64 {
        self.samples.iter().map(|s| s.tenants.iter().map(|t| t.target_bytes).sum::<u64>()).max().unwrap_or(0)
    }

    /// Samples in which a tenant was targeted, or held, below its `min_bytes` while it used
    /// at least that much before.
    pub fn min_violations(&self) -> usize {
        self.samples.iter().filter(|s| s.tenants.iter().any(|t| t.target_bytes < t.min_bytes)).count()
    }
}

/// The tenants' names.
pub fn tenant_name(i: usize) -> String {
    format!("tenant{}", i + 1)
}

/// The lender's capacity at `fraction` of `total` bytes (whole MiB, at least 16 MiB).
pub fn capacity_at(fraction: f64, total: u64) -> u64 {
    (((fraction * total as f64) as u64) / MIB).max(16) * MIB
}

/// Room on tenant `sf`'s disk: its CSV, the empty cluster and the database, and slack.
pub fn disk_bytes_for(sf: f64) -> u64 {
    (sf * (1100 * MIB + 2 * tpch::DB_BYTES_PER_SF) as f64) as u64 + GIB
}

/// A point of an earlier run to keep: same capacity and mode, and complete (no error, every
/// tenant's `runs` runs answered Q4's rows).
fn done(earlier: &[TenantsRecord], mode: &str, fraction: f64, runs: u32) -> Option<TenantsRecord> {
    earlier
        .iter()
        .find(|r| {
            r.mode == mode
                && (r.capacity_fraction - fraction).abs() < 1e-9
                && r.error.is_none()
                && !r.tenants.is_empty()
                && r.tenants.iter().all(|t| {
                    t.queries.len() == runs as usize
                        && t.queries.iter().all(|q| q.status == QueryStatus::Ok && q.rows == Q4_ROWS)
                })
        })
        .cloned()
}

/// The experiment: the databases, then every (capacity, mode) point not in
/// `o.tenants_resume`, each recorded in `report` and saved (`progress`) as it ends.
pub fn run_experiment(
    tb: &mut Testbed,
    o: &PaperOptions,
    report: &mut PaperReport,
    progress: &mut dyn FnMut(&PaperReport),
    bar: &Progress,
) -> Result<()> {
    let points: Vec<(f64, &str)> =
        o.tenants_capacity.iter().flat_map(|&f| o.tenants_modes.iter().map(move |m| (f, m.as_str()))).collect();
    let mut todo = Vec::new();
    // An earlier run's points of other capacities or modes stay in the results too.
    for r in &o.tenants_resume {
        if !points.iter().any(|&(f, m)| r.mode == m && (r.capacity_fraction - f).abs() < 1e-9) {
            report.tenants_runs.push(r.clone());
        }
    }
    for &(f, m) in &points {
        match done(&o.tenants_resume, m, f, o.tenants_runs) {
            Some(r) => {
                note!("paper: tenants {m} at {f}: kept from the earlier run");
                report.tenants_runs.push(r);
                bar.inc(1);
            }
            None => todo.push((f, m)),
        }
    }
    if todo.is_empty() {
        report.tenants_setup = o.tenants_resume_setup.clone();
        progress(report);
        return Ok(());
    }
    bar.message("tenants: making the databases");
    let (setup, disks) = prepare(tb, o)?;
    if let Some(earlier) = &o.tenants_resume_setup {
        let sizes = |s: &TenantsSetup| s.tenants.iter().map(|t| t.scale_factor).collect::<Vec<_>>();
        if sizes(earlier) != sizes(&setup) {
            return Err(BenchError::Setup(
                "the results file holds points of other scale factors: move it away, or rerun with its --tenants-sf"
                    .into(),
            ));
        }
    }
    report.tenants_setup = Some(setup.clone());
    progress(report);
    for (f, m) in todo {
        bar.message(format!("tenants {m} at {f}"));
        let rec = match run_point(tb, o, &setup, &disks, m, f) {
            Ok(r) => r,
            Err(e) if sys::interrupted() => return Err(e),
            Err(e) => {
                note!("paper: tenants {m} at {f}: FAILED: {e}");
                TenantsRecord {
                    mode: m.to_string(),
                    capacity_fraction: f,
                    capacity_bytes: capacity_at(f, setup.total_database_bytes),
                    error: Some(e.to_string()),
                    ..TenantsRecord::default()
                }
            }
        };
        report.tenants_runs.push(rec);
        progress(report);
        bar.inc(1);
    }
    Ok(())
}

/// Each tenant's disk, data and loaded database (on the disk directly, outside the cgroups:
/// not measured).
fn prepare(tb: &mut Testbed, o: &PaperOptions) -> Result<(TenantsSetup, Vec<ExtraDisk>)> {
    let user = pgbench::postgres_user()?;
    let mut setup = TenantsSetup::default();
    let mut disks = Vec::new();
    for (i, &sf) in o.tenants_sf.iter().enumerate() {
        let name = tenant_name(i);
        let port = PORT_BASE + i as u16 + 1;
        let disk = tb.add_disk(&name, disk_bytes_for(sf))?;
        let base = disk.dir.join("tpch");
        let t = Instant::now();
        let ts = tpch::prepare_at(tb, o, sf, &base, Some(port))?;
        let db = base.join("db");
        let (src, dst) = (base.join("pristine").to_string_lossy().to_string(), db.to_string_lossy().to_string());
        sys::run("cp", &["-a", &src, &dst])?;
        let log = tb.logs.join(format!("tenants-{name}-load.postgres.log"));
        let mut server = Server::start(tb, db.clone(), &[], &log, user)?;
        let label = format!("tenants {name} (SF {})", tpch::sf_text(sf));
        let deadline = Instant::now() + Duration::from_secs(o.tpch_deadline_secs.max(60));
        let mut ctx = tpch::Ctx {
            tb,
            o,
            setup: &ts,
            cfg: ConfigKind::Native,
            cgroups: &[],
            addrs: &[],
            mount: None,
            cpu: None,
            deadline,
            label: &label,
            port: Some(port),
        };
        let mut rec = TpchRecord::default();
        let loaded = tpch::load(&mut ctx, &base, &mut rec);
        let plan = loaded.and_then(|_| explain(&ctx, o.tenants_query));
        let stopped = server.stop();
        let plan = plan?;
        stopped?;
        // The CSV files are not needed again: room on the disk.
        let _ = std::fs::remove_dir_all(base.join("data"));
        let db_bytes = pgbench::du(&db);
        note!(
            "paper: [{label}] database {} MiB, loaded in {:.0} s; plan of {}:\n{plan}",
            db_bytes / MIB,
            t.elapsed().as_secs_f64(),
            o.tenants_query.name()
        );
        setup.generator = ts.generator.clone();
        setup.total_database_bytes += db_bytes;
        setup.tenants.push(TenantDb {
            name,
            scale_factor: sf,
            port,
            database_bytes: db_bytes,
            load_secs: t.elapsed().as_secs_f64(),
            lineitem_rows: ts.rows.iter().find(|(t, _)| t == "lineitem").map_or(0, |(_, n)| *n),
            plan,
        });
        disks.push(disk);
    }
    Ok((setup, disks))
}

/// The query's plan on a tenant's database, with the settings it runs with.
fn explain(c: &tpch::Ctx, q: TenantsQuery) -> Result<String> {
    let file = tpch::sql_dir(c.tb).join("q4.sql");
    let text = std::fs::read_to_string(&file).ctx(|| format!("read {}", file.display()))?;
    let body: String = text.lines().filter(|l| !l.trim_start().starts_with("--")).collect::<Vec<_>>().join("\n");
    let mut cmd =
        tpch::psql_with(c, &["-X", "-q", "-A", "-t", "-c", &format!("EXPLAIN {body}")], Some(60), q.pg_options());
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    sys::output_bounded(cmd, Duration::from_secs(120), "EXPLAIN of the tenants' query")
        .map(|s| s.trim_end().to_string())
}

/// The mounts' configuration file: `--mount-config`, or one with `tenants_threshold`'s
/// routing; none for the mount's defaults.
fn mount_config(tb: &Testbed, o: &PaperOptions, tenant: &str) -> Result<Option<std::path::PathBuf>> {
    if o.tenants_min_percent.is_some() && o.mount_config.is_some() {
        return Err(BenchError::Setup(
            "--mount-config and --tenants-min both set the mounts' configuration (--tenants-min writes each mount's \
             secret_file): give one"
                .into(),
        ));
    }
    let secret = match o.tenants_min_percent {
        Some(_) => {
            let p = tb.dir.join(format!("tenants-{tenant}.secret"));
            write_private(&p, &format!("{}\n", tenant_secret(tenant)))?;
            format!("secret_file = \"{}\"\n", p.display())
        }
        None => String::new(),
    };
    match (o.tenants_threshold, &o.mount_config) {
        (Some(_), Some(_)) => Err(BenchError::Setup(
            "--mount-config and --tenants-threshold both set the mounts' configuration: give one (--tenants-threshold \
             none to keep the file's)"
                .into(),
        )),
        (None, Some(c)) => Ok(Some(c.clone())),
        (None, None) if secret.is_empty() => Ok(None),
        (t, None) => {
            let p = tb.dir.join(format!("tenants-mount-{tenant}.toml"));
            let routing =
                t.map_or(String::new(), |t| format!("routing = \"threshold\"\nthreshold = \"{}KiB\"\n", t / 1024));
            let text = format!("# farcache bench paper --experiment tenants\n[cache]\n{routing}{secret}");
            std::fs::write(&p, text).ctx(|| format!("write {}", p.display()))?;
            Ok(Some(p))
        }
    }
}

/// The secret of a configured tenant (`--tenants-min`): fixed, for a lender on the
/// testbed's own network namespace only.
fn tenant_secret(tenant: &str) -> String {
    format!("farcache-bench-{tenant}")
}

/// Write `text` to a new file only its owner can read (the mount refuses a secret file
/// others can).
fn write_private(path: &std::path::Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .ctx(|| format!("create {}", path.display()))?;
    f.write_all(text.as_bytes()).ctx(|| format!("write {}", path.display()))
}

/// With `--tenants-min`, the lender's configuration: the three tenants configured, each
/// with its secret, `min_bytes` of `percent` of `capacity`, and `admin` (the harness reads
/// every tenant's STATS as the first).
fn lender_config(tb: &Testbed, names: &[String], percent: u32, capacity: u64) -> Result<std::path::PathBuf> {
    let min_kib = capacity / 100 * u64::from(percent) / 1024;
    let mut text = String::from("# farcache bench paper --experiment tenants --tenants-min\n[server]\n");
    for n in names {
        text.push_str(&format!(
            "\n[[server.tenant]]\nname = \"{n}\"\nsecret = \"{}\"\nmin_bytes = \"{min_kib}KiB\"\nadmin = true\n",
            tenant_secret(n)
        ));
    }
    let p = tb.dir.join("tenants-lender.toml");
    std::fs::write(&p, text).ctx(|| format!("write {}", p.display()))?;
    Ok(p)
}

/// What runs for one tenant during a point.
struct Tenant<'a> {
    db: &'a TenantDb,
    mem: Cgroup,
    mount: Option<MountDaemon>,
}

/// One (capacity, mode) point from a cold start.
fn run_point(
    tb: &mut Testbed,
    o: &PaperOptions,
    setup: &TenantsSetup,
    disks: &[ExtraDisk],
    mode: &str,
    fraction: f64,
) -> Result<TenantsRecord> {
    let t0 = Instant::now();
    let user = pgbench::postgres_user()?;
    let capacity = capacity_at(fraction, setup.total_database_bytes);
    let mut rec = TenantsRecord {
        mode: mode.to_string(),
        capacity_fraction: fraction,
        capacity_bytes: capacity,
        ..TenantsRecord::default()
    };
    for d in disks {
        d.remount()?;
    }
    // The logs directory again, should another run's start have pruned it.
    std::fs::create_dir_all(tpch::logs_dir(tb)).ctx(|| format!("create {}", tb.logs.display()))?;
    let names: Vec<String> = setup.tenants.iter().map(|t| t.name.clone()).collect();
    let lender_cfg = match o.tenants_min_percent {
        Some(p) => Some(lender_config(tb, &names, p, capacity)?.display().to_string()),
        None => None,
    };
    let mut extra = vec!["--allocation", mode];
    if let Some(c) = &lender_cfg {
        extra.extend(["--config", c.as_str()]);
    }
    let mut lender = tb.start_lender(0, capacity, o.policy.as_deref(), &extra)?;
    let secret = |name: &str| if o.tenants_min_percent.is_some() { tenant_secret(name) } else { String::new() };
    let addr = tb.nets[0].addr;
    // Every tenant known to the lender at once, before its first decision, as the paper's
    // VMs boot together: a tenant is active from its HELLO. (Before session 13 one that
    // appeared after `hit-ratio`'s first decision started at its minimum and, at a 0% hit
    // ratio, earned nothing; now it gets its static share at once — hit_ratio.rs, "Start" —
    // but the point still starts with every tenant present, whichever mount is quickest.)
    // Held open until the point ends.
    let _hellos = setup
        .tenants
        .iter()
        .map(|t| FcClient::connect_with_secret(addr, &t.name, secret(&t.name).as_bytes()))
        .collect::<Result<Vec<_>>>()?;
    note!(
        "paper: tenants {mode} at {fraction}: a lender of {} (capacity {fraction} × {} MiB of databases)",
        human(capacity),
        setup.total_database_bytes / MIB
    );
    // The allocation over time, read from the first second on.
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::<(Instant, Vec<AllocPoint>)>::new()));
    let poller = {
        let (stop, samples, who) = (stop.clone(), samples.clone(), tenant_name(0));
        let key = secret(&who);
        std::thread::spawn(move || poll_lender(addr, &who, key.as_bytes(), &stop, &samples))
    };
    let mut tenants: Vec<Tenant> = Vec::new();
    let mut servers: Vec<Server> = Vec::new();
    let started = (|| -> Result<()> {
        for (db, disk) in setup.tenants.iter().zip(disks) {
            let mem = tb.memory_cgroup(Some(o.tenants_memory_bytes))?;
            let mnt = tb.dir.join(format!("mnt-{}", db.name));
            std::fs::create_dir_all(&mnt).ctx(|| format!("create {}", mnt.display()))?;
            let log = tb.logs.join(format!("tenants-{mode}-{fraction}-{}.mount.log", db.name));
            let mut extra: Vec<std::ffi::OsString> = vec!["--tenant".into(), db.name.clone().into()];
            if let Some(c) = mount_config(tb, o, &db.name)? {
                extra.extend(["--config".into(), c.clone().into_os_string()]);
            }
            let mount = MountDaemon::start_with(
                &o.exe,
                &disk.dir,
                &mnt,
                Some(&[addr]),
                o.routing.as_deref(),
                &extra,
                &[&mem, &tb.blkio],
                &log,
            )?
            .watched(o, &log)?;
            tenants.push(Tenant { db, mem, mount: Some(mount) });
        }
        Ok(())
    })();
    let tb_ref: &Testbed = tb;
    let res = started.and_then(|_| {
        for t in &tenants {
            let data = t.mount.as_ref().expect("mounted").mountpoint().join("tpch").join("db");
            let log = tb_ref.logs.join(format!("tenants-{mode}-{fraction}-{}.postgres.log", t.db.name));
            servers.push(Server::start(tb_ref, data, &[&t.mem, &tb_ref.blkio], &log, user)?);
        }
        run_queries(tb_ref, o, &tenants, mode, &mut rec)
    });
    let queries_start = res.as_ref().ok().copied();
    for mut s in servers {
        let _ = s.stop();
    }
    stop.store(true, Ordering::Relaxed);
    let _ = poller.join();
    let origin = queries_start.unwrap_or(t0);
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    rec.samples = samples
        .into_iter()
        .map(|(at, tenants)| AllocSample {
            t_secs: if at >= origin {
                at.duration_since(origin).as_secs_f64()
            } else {
                -origin.duration_since(at).as_secs_f64()
            },
            tenants,
        })
        .collect();
    // The lender's last reading: each tenant's hits and misses over the point.
    if let Some(last) = rec.samples.last() {
        for r in rec.tenants.iter_mut() {
            if let Some(p) = last.tenants.iter().find(|p| p.name == r.name) {
                r.lender.hits = p.hits;
                r.lender.misses = p.misses;
                r.hit_ratio = (p.hits + p.misses > 0).then(|| p.hits as f64 / (p.hits + p.misses) as f64);
            }
        }
    }
    for t in tenants.iter_mut() {
        let counters = t.mount.as_mut().and_then(|m| m.stats_now()).map(|(c, _)| c);
        let td = runner::tear_down(&t.mem, t.mount.take(), None);
        if let Some(r) = rec.tenants.iter_mut().find(|r| r.name == t.db.name) {
            r.mount = counters.or(td.mount_at_exit);
            r.lender_share = r.mount.as_ref().and_then(|m| {
                let (l, d) = (m.remote_reads?, m.disk_reads?);
                (l + d > 0).then(|| l as f64 / (l + d) as f64)
            });
            (r.memory_max_usage_bytes, r.oom_kills) = (td.memory_max_usage_bytes, td.oom_kills);
        }
    }
    lender.stop();
    if let Err(e) = res {
        if sys::interrupted() {
            return Err(e);
        }
        rec.error = Some(e.to_string());
        note!("paper: tenants {mode} at {fraction}: FAILED: {e}");
    }
    rec.secs_total = t0.elapsed().as_secs_f64();
    Ok(rec)
}

/// Read the lender's STATS every [`POLL`] until `stop`, as tenant `who` with `secret` (open
/// mode: every connection sees every tenant; configured, every tenant is `admin`), over one
/// connection (reconnecting after an error).
fn poll_lender(
    addr: std::net::SocketAddr,
    who: &str,
    secret: &[u8],
    stop: &AtomicBool,
    out: &Mutex<Vec<(Instant, Vec<AllocPoint>)>>,
) {
    let mut client: Option<FcClient<std::net::TcpStream>> = None;
    let mut last_try = Instant::now().checked_sub(POLL).unwrap_or_else(Instant::now);
    // A final reading after `stop`, so that the counters are the point's last.
    let mut last = false;
    loop {
        let next = last_try + POLL;
        while !last && Instant::now() < next {
            if stop.load(Ordering::Relaxed) {
                last = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        last_try = Instant::now();
        if client.is_none() {
            client = FcClient::connect_with_secret(addr, who, secret).ok();
        }
        let got = client.as_mut().and_then(|c| c.stats().ok());
        match got.and_then(|j| serde_json::from_str::<farcache_server::ServerStats>(&j).ok()) {
            Some(s) => {
                let points = s
                    .tenants
                    .iter()
                    .filter(|t| t.name.starts_with("tenant"))
                    .map(|t| AllocPoint {
                        name: t.name.clone(),
                        target_bytes: t.target_bytes,
                        used_bytes: t.used_bytes,
                        min_bytes: t.min_bytes,
                        hits: t.counters.hits,
                        misses: t.counters.misses,
                    })
                    .collect();
                out.lock().unwrap_or_else(|e| e.into_inner()).push((last_try, points));
            }
            None => client = None,
        }
        if last {
            return;
        }
    }
}

/// A tenant's runs in progress.
struct Stream {
    rng: Rng,
    next_start: Instant,
    runs_started: u32,
    active: Option<tpch::Active>,
    done: Vec<TpchQuery>,
    finished_at: Option<Instant>,
}

/// Every tenant's runs, the tenants at once; fills `rec.tenants` and `rec.total_secs`, and
/// returns when the queries started.
fn run_queries(
    tb: &Testbed,
    o: &PaperOptions,
    tenants: &[Tenant],
    mode: &str,
    rec: &mut TenantsRecord,
) -> Result<Instant> {
    let timeout = o.tpch_statement_timeout_secs.max(1);
    let hard = Duration::from_secs(timeout) + PSQL_GRACE;
    let deadline = Instant::now() + Duration::from_secs(o.tpch_deadline_secs.max(60));
    let dummy = tpch::TpchSetup::default();
    let labels: Vec<String> = tenants.iter().map(|t| format!("tenants {mode} {}", t.db.name)).collect();
    let cgroups: Vec<[&Cgroup; 2]> = tenants.iter().map(|t| [&t.mem, &tb.blkio]).collect();
    let ctxs: Vec<tpch::Ctx> = tenants
        .iter()
        .enumerate()
        .map(|(i, t)| tpch::Ctx {
            tb,
            o,
            setup: &dummy,
            cfg: ConfigKind::Farcache,
            cgroups: &cgroups[i],
            addrs: &[],
            mount: None,
            cpu: None,
            deadline,
            label: &labels[i],
            port: Some(t.db.port),
        })
        .collect();
    let file = tpch::sql_dir(tb).join("q4.sql").to_string_lossy().to_string();
    let out_dir = tb.dir.join("tenants-out");
    std::fs::create_dir_all(&out_dir).ctx(|| format!("create {}", out_dir.display()))?;
    let t0 = Instant::now();
    let mut streams: Vec<Stream> = (0..tenants.len())
        .map(|i| {
            let mut rng = Rng::new(mix64(o.seed ^ mix64(i as u64 + 1)));
            let delay = Duration::from_secs_f64(rng.unit() * JITTER_SECS);
            Stream { rng, next_start: t0 + delay, runs_started: 0, active: None, done: Vec::new(), finished_at: None }
        })
        .collect();
    let mut beat = Instant::now();
    loop {
        if sys::interrupted() {
            for s in streams.iter_mut() {
                if let Some(mut a) = s.active.take() {
                    let _ = a.child.kill();
                    let _ = a.child.wait();
                }
            }
            sys::check_interrupt()?;
        }
        for (i, s) in streams.iter_mut().enumerate() {
            if let Some(a) = s.active.as_mut() {
                if let Some(r) = tpch::poll_psql(a, hard, deadline) {
                    let a = s.active.take().expect("active");
                    let q = tpch::finish(&a, s.runs_started, r);
                    note!("paper: [{}] run {}: {}", labels[i], s.runs_started, tpch::describe(&q));
                    s.done.push(q);
                    s.next_start = Instant::now() + Duration::from_secs_f64(s.rng.unit() * JITTER_SECS);
                    if s.runs_started >= o.tenants_runs {
                        s.finished_at = Some(Instant::now());
                    }
                }
            }
            if s.active.is_some() || s.runs_started >= o.tenants_runs || Instant::now() < s.next_start {
                continue;
            }
            s.runs_started += 1;
            let c = &ctxs[i];
            if o.tenants_drop_cache {
                if let Some(m) = tenants[i].mount.as_ref() {
                    super::testbed::drop_cached(&m.mountpoint().join("tpch").join("db"));
                }
            }
            if Instant::now() >= deadline {
                s.done.push(TpchQuery {
                    query: 4,
                    stream: s.runs_started,
                    status: QueryStatus::Skipped,
                    secs: 0.0,
                    wall_secs: 0.0,
                    rows: 0,
                    checksum: String::new(),
                    error: Some("not started: --tpch-deadline had passed".into()),
                    started_unix_ms: None,
                });
                s.finished_at = Some(Instant::now());
                continue;
            }
            // The answers go to the run directory, not the logs (which other runs prune): the
            // harness reads them back.
            let stem = out_dir.join(format!("{mode}-{}-run{}", tenants[i].db.name, s.runs_started));
            let (out, err) = (stem.with_extension("out"), stem.with_extension("err"));
            let args = ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", "\\timing on", "-f", &file];
            let mut cmd = tpch::psql_with(c, &args, Some(timeout), o.tenants_query.pg_options());
            cmd.stdout(std::fs::File::create(&out).ctx(|| "create a log".into())?);
            cmd.stderr(std::fs::File::create(&err).ctx(|| "create a log".into())?);
            let start = Instant::now();
            let child = cmd.spawn().ctx(|| "start psql for the tenants' query (setpriv)".into())?;
            s.active = Some(tpch::Active { query: 4, child, start, out, err });
        }
        if streams.iter().all(|s| s.active.is_none() && s.runs_started >= o.tenants_runs) {
            break;
        }
        if beat.elapsed() >= HEARTBEAT {
            beat = Instant::now();
            let n: usize = streams.iter().map(|s| s.done.len()).sum();
            note!(
                "paper: [tenants {mode}] {n} of {} runs done after {:.0} s",
                o.tenants_runs as usize * streams.len(),
                t0.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let end = Instant::now();
    // The total: from the point's start (the first run waits its 0–JITTER_SECS) to the last
    // run's end.
    rec.total_secs = end.duration_since(t0).as_secs_f64();
    for (t, s) in tenants.iter().zip(streams) {
        let ok: Vec<f64> = s.done.iter().filter(|q| q.status == QueryStatus::Ok).map(|q| q.secs).collect();
        rec.tenants.push(TenantResult {
            name: t.db.name.clone(),
            scale_factor: t.db.scale_factor,
            mean_secs: (!ok.is_empty()).then(|| ok.iter().sum::<f64>() / ok.len() as f64),
            finish_secs: s.finished_at.unwrap_or(end).duration_since(t0).as_secs_f64(),
            queries: s.done,
            ..TenantResult::default()
        });
    }
    Ok(t0)
}

fn by<'a>(r: &'a PaperReport, mode: &str, fraction: f64) -> Option<&'a TenantsRecord> {
    r.tenants_runs.iter().find(|x| x.mode == mode && (x.capacity_fraction - fraction).abs() < 1e-9 && x.error.is_none())
}

/// The capacity points of the records (an earlier run's kept ones too), the run's own
/// order first.
fn fractions(r: &PaperReport) -> Vec<f64> {
    let mut v: Vec<f64> = Vec::new();
    let known = r.options.tenants_capacity.iter().copied().chain(r.tenants_runs.iter().map(|x| x.capacity_fraction));
    for f in known {
        if !v.iter().any(|x| (x - f).abs() < 1e-9)
            && r.tenants_runs.iter().any(|x| (x.capacity_fraction - f).abs() < 1e-9)
        {
            v.push(f);
        }
    }
    v
}

/// Sanity checks: every run of every tenant answered Q4's rows, every tenant used the lender,
/// the allocation was read, and a dividing mode's targets fit in the capacity.
pub fn checks(r: &PaperReport) -> Vec<Verdict> {
    let mut v = Vec::new();
    if !r.options.experiments.contains(&super::Experiment::Tenants) {
        return v;
    }
    let runs = r.options.tenants_runs as usize;
    for x in &r.tenants_runs {
        let tag = format!("tenants {} at {}", x.mode, x.capacity_fraction);
        if let Some(e) = &x.error {
            v.push(Verdict { what: format!("{tag}: ran"), measured: e.clone(), ok: false });
            continue;
        }
        for t in &x.tenants {
            let ok = t.queries.iter().filter(|q| q.status == QueryStatus::Ok && q.rows == Q4_ROWS).count();
            let sums: std::collections::BTreeSet<&str> = t.queries.iter().map(|q| q.checksum.as_str()).collect();
            v.push(Verdict {
                what: format!("{tag} {}: every run answered Q4's {Q4_ROWS} rows, the same each time", t.name),
                measured: format!("{ok} of {runs} runs, {} distinct answers", sums.len()),
                ok: ok == runs && t.queries.len() == runs && sums.len() == 1,
            });
            v.push(Verdict {
                what: format!("{tag} {}: used the lender (GETs and hits > 0)", t.name),
                measured: format!("{} hits, {} misses", t.lender.hits, t.lender.misses),
                ok: t.lender.hits > 0 && t.lender.hits + t.lender.misses > 0,
            });
        }
        v.push(Verdict {
            what: format!("{tag}: the allocation was read every second"),
            measured: format!("{} samples over {:.0} s", x.samples.len(), x.total_secs),
            ok: !x.samples.is_empty() && x.samples.len() as f64 >= 0.5 * x.total_secs,
        });
        if x.divides() {
            v.push(Verdict {
                what: format!("{tag}: targets add up to at most the capacity"),
                measured: format!("largest sum {} of {}", human_mib(x.max_target_sum()), human_mib(x.capacity_bytes)),
                ok: x.max_target_sum() <= x.capacity_bytes,
            });
        }
    }
    v
}

fn human_mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / MIB as f64)
}

/// The targets, per capacity: mrc's mean query time ≤ 0.85× static's, mrc never
/// worse than hit-ratio, no `min_bytes` violation.
pub fn targets(r: &PaperReport) -> Vec<Verdict> {
    let mut v = Vec::new();
    if !r.options.experiments.contains(&super::Experiment::Tenants) {
        return v;
    }
    for f in fractions(r) {
        let mean = |m| by(r, m, f).and_then(TenantsRecord::mean_secs);
        if let (Some(m), Some(s)) = (mean("mrc"), mean("static")) {
            v.push(Verdict {
                what: format!("tenants at {f}: mrc's mean query time ≤ 0.85× static's"),
                measured: format!("{m:.2} s vs {s:.2} s ({:.2}×)", m / s),
                ok: m <= 0.85 * s,
            });
        }
        if let (Some(m), Some(h)) = (mean("mrc"), mean("hit-ratio")) {
            v.push(Verdict {
                what: format!("tenants at {f}: mrc never worse than hit-ratio (mean query time)"),
                measured: format!("{m:.2} s vs {h:.2} s ({:.2}×)", m / h),
                ok: m <= h,
            });
        }
        let viol: usize = r
            .tenants_runs
            .iter()
            .filter(|x| (x.capacity_fraction - f).abs() < 1e-9 && x.divides() && x.error.is_none())
            .map(TenantsRecord::min_violations)
            .sum();
        let mins: u64 = r
            .tenants_runs
            .iter()
            .flat_map(|x| &x.samples)
            .flat_map(|s| &s.tenants)
            .map(|t| t.min_bytes)
            .max()
            .unwrap_or(0);
        v.push(Verdict {
            what: format!("tenants at {f}: zero min_bytes violations (a target below a tenant's minimum)"),
            measured: if mins == 0 {
                format!("{viol} (open-mode tenants: every min_bytes is 0, so this cannot fail here)")
            } else {
                format!("{viol} samples")
            },
            ok: viol == 0,
        });
    }
    v
}

/// The markdown section.
pub fn render(s: &mut String, r: &PaperReport) {
    use std::fmt::Write;
    let o = &r.options;
    if !o.experiments.contains(&super::Experiment::Tenants) {
        return;
    }
    let _ = writeln!(s, "## tenants (paper 004, issue 13): three PostgreSQL tenants sharing one lender\n");
    if let Some(st) = &r.tenants_setup {
        let dbs: Vec<String> = st
            .tenants
            .iter()
            .map(|t| format!("{} SF {} ({} MiB)", t.name, tpch::sf_text(t.scale_factor), t.database_bytes / MIB))
            .collect();
        let _ = writeln!(
            s,
            "Databases: {} — {} MiB in all. Each tenant: its own {} disk, a {} memory cgroup, its own mount \
             (`--tenant`). Query: `{}` ({} runs per tenant, the three tenants at once, each run after a seeded \
             random wait of 0–{JITTER_SECS} s){}.\n",
            dbs.join(", "),
            st.total_database_bytes / MIB,
            o.profile.name(),
            human(o.tenants_memory_bytes),
            o.tenants_query.name(),
            o.tenants_runs,
            if o.tenants_query.pg_options().is_empty() {
                String::new()
            } else {
                format!(", with `{}`", o.tenants_query.pg_options())
            }
        );
    }
    for f in fractions(r) {
        let rows: Vec<&TenantsRecord> =
            r.tenants_runs.iter().filter(|x| (x.capacity_fraction - f).abs() < 1e-9).collect();
        let Some(first) = rows.first() else { continue };
        let names: Vec<String> = first.tenants.iter().map(|t| t.name.clone()).collect();
        let _ = writeln!(s, "### Lender capacity {f} × the databases ({})\n", human_mib(first.capacity_bytes));
        let mut head = String::from("| mode |");
        let mut rule = String::from("|---|");
        for n in &names {
            let _ = write!(head, " {n} mean s |");
            rule.push_str("---:|");
        }
        head.push_str(" mean s | ×static | total s | ×static |");
        rule.push_str("---:|---:|---:|---:|");
        for n in &names {
            let _ = write!(head, " {n} hit ratio |");
            rule.push_str("---:|");
        }
        for n in &names {
            let _ = write!(head, " {n} lender share |");
            rule.push_str("---:|");
        }
        let _ = writeln!(s, "{head}\n{rule}");
        let st = by(r, "static", f);
        for m in &o.tenants_modes {
            let Some(x) = rows.iter().find(|x| &x.mode == m) else { continue };
            if let Some(e) = &x.error {
                let _ = writeln!(s, "| {m} | failed: {} |", e.lines().next().unwrap_or(""));
                continue;
            }
            let mut row = format!("| {m} |");
            for n in &names {
                let t = x.tenants.iter().find(|t| &t.name == n).and_then(|t| t.mean_secs);
                let _ = write!(row, " {} |", t.map_or("–".into(), |v| format!("{v:.2}")));
            }
            let mean = x.mean_secs();
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "–".into(),
            };
            let _ = write!(
                row,
                " {} | {} | {:.1} | {} |",
                mean.map_or("–".into(), |v| format!("{v:.2}")),
                ratio(mean, st.and_then(TenantsRecord::mean_secs)),
                x.total_secs,
                ratio(Some(x.total_secs), st.map(|s| s.total_secs))
            );
            for n in &names {
                let h = x.tenants.iter().find(|t| &t.name == n).and_then(|t| t.hit_ratio);
                let _ = write!(row, " {} |", h.map_or("–".into(), |v| format!("{:.1}%", 100.0 * v)));
            }
            for n in &names {
                let h = x.tenants.iter().find(|t| &t.name == n).and_then(|t| t.lender_share);
                let _ = write!(row, " {} |", h.map_or("–".into(), |v| format!("{:.0}%", 100.0 * v)));
            }
            let _ = writeln!(s, "{row}");
        }
        let _ = writeln!(s);
        // Where the reads went: the mount's counters.
        let _ = writeln!(s, "Reads per tenant (the mount's counters, all modes at {f}): lender reads / disk reads / sequential bypasses:\n");
        for x in &rows {
            let parts: Vec<String> = x
                .tenants
                .iter()
                .map(|t| {
                    let m = t.mount.as_ref();
                    let g =
                        |f: fn(&MountCounters) -> Option<u64>| m.and_then(f).map_or("–".into(), |v| v.to_string());
                    format!(
                        "{} {} / {} / {}",
                        t.name,
                        g(|c| c.remote_reads),
                        g(|c| c.disk_reads),
                        g(|c| c.sequential_bypasses)
                    )
                })
                .collect();
            let _ = writeln!(s, "- {}: {}", x.mode, parts.join("; "));
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "Times are psql's (`\\timing`) per run; *mean s* is over every run of every tenant; *total s* from the \
         first run's start to the last one's end. *Hit ratio*: the lender's, per tenant, over the point (a mount asks only for blocks \
         it stored there: a miss is a block the lender evicted). *Lender share*: of the tenant's reads below \
         its page cache, the share the lender served (the mount's counters) — what the allocation changes. \
         The allocation over time: `scripts/bench-paper-plot.py` on the JSON (`-tenants-<share>.png`).\n"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(mode: &str, secs: &[f64], targets: &[u64]) -> TenantsRecord {
        let q = |s: f64| TpchQuery {
            query: 4,
            stream: 1,
            status: QueryStatus::Ok,
            secs: s,
            wall_secs: s,
            rows: Q4_ROWS,
            checksum: "x".into(),
            error: None,
            started_unix_ms: None,
        };
        TenantsRecord {
            mode: mode.into(),
            capacity_fraction: 0.38,
            capacity_bytes: 100 * MIB,
            tenants: vec![TenantResult {
                name: "tenant1".into(),
                queries: secs.iter().map(|&s| q(s)).collect(),
                ..Default::default()
            }],
            samples: vec![AllocSample {
                t_secs: 0.0,
                tenants: targets.iter().map(|&t| AllocPoint { target_bytes: t, ..Default::default() }).collect(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn means_sums_and_capacity() {
        let r = rec("mrc", &[1.0, 3.0], &[40 * MIB, 70 * MIB]);
        assert_eq!(r.mean_secs(), Some(2.0));
        assert_eq!(r.max_target_sum(), 110 * MIB);
        assert!(r.divides() && !rec("shared", &[1.0], &[]).divides());
        assert_eq!(capacity_at(0.38, 1000 * MIB), 380 * MIB);
        assert_eq!(capacity_at(0.001, 10 * MIB), 16 * MIB);
        assert_eq!("q4-index".parse::<TenantsQuery>(), Ok(TenantsQuery::Q4Index));
        assert!("q5".parse::<TenantsQuery>().is_err());
    }

    #[test]
    fn targets_compare_against_static_and_hit_ratio() {
        let mut o = PaperOptions::quick("farcache".into());
        o.experiments = vec![super::super::Experiment::Tenants];
        o.tenants_capacity = vec![0.38];
        let mut r = PaperReport::new(&o);
        r.tenants_runs = vec![
            rec("static", &[10.0], &[50 * MIB]),
            rec("hit-ratio", &[9.0], &[50 * MIB]),
            rec("mrc", &[8.0], &[50 * MIB]),
        ];
        let t = targets(&r);
        assert!(t.iter().any(|v| v.what.contains("0.85×") && v.ok), "{t:?}");
        assert!(t.iter().any(|v| v.what.contains("hit-ratio") && v.ok));
        r.tenants_runs[2] = rec("mrc", &[9.5], &[200 * MIB]);
        let t = targets(&r);
        assert!(t.iter().any(|v| v.what.contains("0.85×") && !v.ok));
        assert!(t.iter().any(|v| v.what.contains("hit-ratio") && !v.ok));
        let c = checks(&r);
        assert!(c.iter().any(|v| v.what.contains("targets add up") && !v.ok), "{c:?}");
        // No hits at the lender: the check fails.
        assert!(c.iter().any(|v| v.what.contains("used the lender") && !v.ok));
    }
}
