//! `tpch` (paper 000's Tables 8 and 10, DBT-3 being TPC-H-like): PostgreSQL 15 on each
//! configuration, a TPC-H database of 2–4× the client's memory, and the three tests of the
//! specification's performance run — the load test (tables, data, keys and indexes,
//! statistics), the power test (the 22 queries in one stream) and the throughput test (two
//! streams at once, queries per hour).
//!
//! - Data: `tpchgen-cli` (PyPI) writes the eight tables as CSV once per run, by the harness,
//!   outside the client's cgroups (not throttled), to `ext4/tpch/data/`. They stay there:
//!   every configuration's load test reads them with `COPY ... FROM` *through its own file
//!   system* (the mount for passthrough and farcache, ext4 for native and ideal), after the
//!   cold start, so the load reads the slow disk like an operator's load would.
//! - Each configuration starts from a copy of one empty cluster (`initdb` once), after a cold
//!   start (ext4 remounted, a new memory cgroup, new mount and lenders); postmaster,
//!   backends and every `psql` run in the client's memory and blkio cgroups as `postgres`
//!   (as in [`super::pgbench`]). Lenders lend enough to hold the whole database.
//! - Load test: per table `CREATE TABLE` and `COPY ... FREEZE` in one transaction (with
//!   `wal_level = minimal` the data skips the WAL and is loaded frozen, so the queries write
//!   no hint bits), then keys and indexes (`bench/tpch/indexes.sql`), then `ANALYZE`.
//! - Power test: stream 0 of the specification's query order (Appendix A), one `psql` per
//!   query; throughput test: streams 1 and 2 at once. Each query has a `statement_timeout`;
//!   a query that hits it is recorded as timed out, and the whole configuration has a
//!   deadline after which the queries not started are recorded as skipped.
//! - Every result is kept (`logs/fcb-…/tpch/*.out`) and summarised by its row count and a checksum
//!   of its sorted rows, which must be the same in every configuration and stream.
//! - Not run: the refresh functions RF1/RF2 of the specification's power and throughput tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cgroup::Cgroup;
use super::counters::{CpuProbe, CpuTime, LenderTotals};
use super::mount::{MountCounters, MountDaemon};
use super::pgbench::{self, Server, SHARED_BUFFERS};
use super::report::Transfers;
use super::run::{self as runner, Snapshot};
use super::testbed::{DiskStat, Testbed};
use super::{sys, ConfigKind, PaperOptions, GIB, MIB};
use crate::error::IoContext;
use crate::{BenchError, Result};

/// The eight tables, in load order (small first).
pub const TABLES: [&str; 8] = ["region", "nation", "part", "supplier", "partsupp", "customer", "orders", "lineitem"];

/// The 22 queries (bench/tpch/queries/), built into the binary.
const QUERIES: [&str; 22] = [
    include_str!("../../../../bench/tpch/queries/q1.sql"),
    include_str!("../../../../bench/tpch/queries/q2.sql"),
    include_str!("../../../../bench/tpch/queries/q3.sql"),
    include_str!("../../../../bench/tpch/queries/q4.sql"),
    include_str!("../../../../bench/tpch/queries/q5.sql"),
    include_str!("../../../../bench/tpch/queries/q6.sql"),
    include_str!("../../../../bench/tpch/queries/q7.sql"),
    include_str!("../../../../bench/tpch/queries/q8.sql"),
    include_str!("../../../../bench/tpch/queries/q9.sql"),
    include_str!("../../../../bench/tpch/queries/q10.sql"),
    include_str!("../../../../bench/tpch/queries/q11.sql"),
    include_str!("../../../../bench/tpch/queries/q12.sql"),
    include_str!("../../../../bench/tpch/queries/q13.sql"),
    include_str!("../../../../bench/tpch/queries/q14.sql"),
    include_str!("../../../../bench/tpch/queries/q15.sql"),
    include_str!("../../../../bench/tpch/queries/q16.sql"),
    include_str!("../../../../bench/tpch/queries/q17.sql"),
    include_str!("../../../../bench/tpch/queries/q18.sql"),
    include_str!("../../../../bench/tpch/queries/q19.sql"),
    include_str!("../../../../bench/tpch/queries/q20.sql"),
    include_str!("../../../../bench/tpch/queries/q21.sql"),
    include_str!("../../../../bench/tpch/queries/q22.sql"),
];
const SCHEMA: &str = include_str!("../../../../bench/tpch/schema.sql");
const INDEXES: &str = include_str!("../../../../bench/tpch/indexes.sql");

/// The specification's query order (TPC-H Appendix A): stream 0 is the power test's, streams
/// 1 and 2 are the throughput test's.
pub const STREAM_ORDERS: [[u32; 22]; 3] = [
    [14, 2, 9, 20, 6, 17, 18, 8, 21, 13, 3, 22, 16, 4, 11, 15, 1, 10, 19, 5, 7, 12],
    [21, 3, 18, 5, 11, 7, 6, 20, 17, 12, 16, 15, 13, 10, 2, 8, 14, 19, 9, 22, 1, 4],
    [6, 17, 14, 16, 19, 10, 9, 2, 15, 8, 5, 22, 12, 7, 13, 18, 1, 4, 20, 3, 11, 21],
];
/// Concurrent query streams of the throughput test (the specification's minimum at SF 1).
pub const THROUGHPUT_STREAMS: usize = 2;

/// A PostgreSQL database of the TPC-H tables and the indexes above takes about this much per
/// unit of scale factor (measured: 194 MiB of `base/` at SF 0.1, plus WAL and catalogs).
pub const DB_BYTES_PER_SF: u64 = 2000 * MIB;
/// tpchgen-cli's CSV files: about 1.1 GB per unit of scale factor.
const CSV_BYTES_PER_SF: u64 = 1100 * MIB;
/// Per-query sorts and hashes: modest, so that the OS cache in the client's cgroup is what
/// matters (a hash table may take hash_mem_multiplier = 2 times this).
const WORK_MEM: &str = "8MB";
/// Index builds: PostgreSQL's default (64MB), less in small clients — an eighth of the
/// client's memory, at least 8MB (a 96 MiB client's farcache configuration was OOM-killed
/// building lineitem's primary key with 64MB at SF 0.1).
pub fn maintenance_work_mem(o: &PaperOptions) -> String {
    format!("{}MB", (o.memory_bytes / 8 / MIB).clamp(8, 64))
}
/// How much longer than its statement_timeout one psql may run before the harness kills it.
const PSQL_GRACE: Duration = Duration::from_secs(60);
/// How often a long step says it is still running.
const HEARTBEAT: Duration = Duration::from_secs(30);

/// The scale factor of a run: the option, else about three times the client's memory
/// (rounded down to 0.05; at least 0.01).
pub fn scale_factor(o: &PaperOptions) -> f64 {
    if let Some(sf) = o.tpch_scale_factor {
        return sf;
    }
    let sf = (3 * o.memory_bytes) as f64 / DB_BYTES_PER_SF as f64;
    ((sf * 20.0).floor() / 20.0).max(0.01)
}

/// What each lender lends in this experiment: its usual capacity, or more when the database
/// (with a quarter more for slack) would not fit in all lenders together.
pub fn lender_capacity(o: &PaperOptions) -> u64 {
    let db = (scale_factor(o) * DB_BYTES_PER_SF as f64) as u64;
    let each = (db + db / 4).div_ceil(o.lenders.max(1) as u64).div_ceil(MIB) * MIB;
    o.lender_capacity_bytes.max(each)
}

/// Room on the slow disk: the CSV files, the empty cluster, one database with its WAL and
/// the queries' temporary files (half as much again), and slack.
pub fn disk_bytes(o: &PaperOptions) -> u64 {
    let sf = scale_factor(o);
    (sf * (CSV_BYTES_PER_SF + 2 * DB_BYTES_PER_SF) as f64) as u64 + 2 * GIB
}

/// Format the scale factor as tpchgen-cli and psql read it ("0.75", "1", "0.01").
pub fn sf_text(sf: f64) -> String {
    let s = format!("{sf:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// The data every configuration loads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TpchSetup {
    pub scale_factor: f64,
    /// `tpchgen-cli --version`.
    pub generator: String,
    /// The CSV files' total size.
    pub data_bytes: u64,
    /// Rows per table, counted in the CSV files (header excluded).
    pub rows: Vec<(String, u64)>,
    pub gen_secs: f64,
    /// What each lender lent in this experiment.
    pub lender_capacity_bytes: u64,
    pub statement_timeout_secs: u64,
    /// Each configuration's share of the experiment's deadline.
    pub config_deadline_secs: u64,
    pub work_mem: String,
    #[serde(default)]
    pub maintenance_work_mem: String,
    pub shared_buffers: String,
}

/// How one query run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueryStatus {
    Ok,
    /// Stopped by statement_timeout (or, past it, by the harness).
    TimedOut,
    /// Not started: the configuration's deadline had passed.
    Skipped,
    /// Any other error.
    Failed,
}

/// One query of one stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TpchQuery {
    pub query: u32,
    /// 0: the power test; 1, 2: the throughput test's streams.
    pub stream: u32,
    pub status: QueryStatus,
    /// The query's time as psql measured it (`\timing`), else the wall time.
    pub secs: f64,
    /// From the harness: psql's start, connection and exit included.
    pub wall_secs: f64,
    pub rows: u64,
    /// FNV-1a 64 of the result's rows, sorted (so that a plan's row order does not count).
    pub checksum: String,
    pub error: Option<String>,
    /// When its psql started, in milliseconds since the Unix epoch: what lines a query up
    /// with the mounts' `--watch-stats` series (each document has its `unix_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_unix_ms: Option<u64>,
}

/// One step of the load test.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TpchStep {
    pub what: String,
    pub secs: f64,
    /// Rows COPY reported (the tables' steps).
    pub rows: Option<u64>,
}

/// What the disk and the lenders did during one test.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TpchPhase {
    pub secs: f64,
    pub disk: DiskStat,
    pub lenders: LenderTotals,
    /// Table 9: bytes to and from lenders, invalidations (the mount's counters when it has a
    /// stats command, else the lenders' STATS).
    pub transfers: Transfers,
    /// CPU time by who spent it: the client's cgroup (PostgreSQL, psql, the mount daemon), the
    /// daemon alone, the lenders (on this one machine; other machines in a deployment) and
    /// the whole machine. Zeros in results from before session 61.
    #[serde(default)]
    pub cpu: CpuTime,
}

/// One configuration's three tests.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TpchRecord {
    pub config: Option<ConfigKind>,
    /// Load test: seconds, from the first CREATE TABLE to the end of ANALYZE.
    pub load_secs: Option<f64>,
    pub load_steps: Vec<TpchStep>,
    /// The cluster's size after the load test.
    pub database_bytes: u64,
    /// Power test: seconds of the whole stream.
    pub power_secs: Option<f64>,
    pub power: Vec<TpchQuery>,
    /// Throughput test: seconds until both streams were done, and completed queries per hour.
    pub throughput_secs: Option<f64>,
    pub queries_per_hour: Option<f64>,
    pub throughput: Vec<TpchQuery>,
    pub load: TpchPhase,
    pub power_phase: TpchPhase,
    pub throughput_phase: TpchPhase,
    /// Pages of the data files and the cluster in the page cache at the start (0: cold).
    pub cached_pages_at_start: u64,
    pub memory_max_usage_bytes: Option<u64>,
    pub oom_kills: Option<u64>,
    pub daemon_rss_bytes: Option<u64>,
    /// The daemon's anonymous memory then, less lazily freed pages (None before session 57).
    #[serde(default)]
    pub daemon_anon_bytes: Option<u64>,
    /// The mount's counters at the end.
    pub mount: Option<MountCounters>,
    pub secs_total: f64,
    pub error: Option<String>,
}

impl TpchRecord {
    pub fn failed(config: ConfigKind, error: String) -> TpchRecord {
        TpchRecord { config: Some(config), error: Some(error), ..TpchRecord::default() }
    }

    /// Every query run of both tests.
    pub fn queries(&self) -> impl Iterator<Item = &TpchQuery> {
        self.power.iter().chain(self.throughput.iter())
    }

    pub fn count(&self, status: QueryStatus) -> usize {
        self.queries().filter(|q| q.status == status).count()
    }
}

/// The CREATE TABLE statement of `table` in schema.sql (comments dropped).
pub fn create_statement(table: &str) -> Option<String> {
    let text: String = SCHEMA.lines().filter(|l| !l.trim_start().starts_with("--")).collect::<Vec<_>>().join("\n");
    text.split(';').map(str::trim).find(|s| s.starts_with(&format!("CREATE TABLE {table} ("))).map(str::to_string)
}

/// The statements of indexes.sql, one per line.
pub fn index_statements() -> Vec<String> {
    INDEXES
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("--"))
        .map(|l| l.trim_end_matches(';').to_string())
        .collect()
}

/// `tpchgen-cli` on PATH, else in Python's scripts directory (where pip puts it).
fn find_tpchgen() -> Result<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Ok(out) = sys::run_with_timeout(
        "python3",
        &["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"],
        Duration::from_secs(20),
    ) {
        dirs.push(PathBuf::from(out.trim()));
    }
    dirs.extend(["/usr/local/bin", "/root/.local/bin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join("tpchgen-cli")).find(|p| p.is_file()).ok_or_else(|| {
        BenchError::Setup("tpchgen-cli is missing: pip install tpchgen-cli (scripts/bench-deps.sh installs it)".into())
    })
}

/// Lines of a file minus its header.
fn data_rows(path: &Path) -> Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ctx(|| format!("open {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).ctx(|| format!("read {}", path.display()))?;
        if k == 0 {
            break;
        }
        n += buf[..k].iter().filter(|b| **b == b'\n').count() as u64;
    }
    Ok(n.saturating_sub(1))
}

/// The data (once per run) and the empty cluster every configuration copies.
pub fn prepare(tb: &Testbed, o: &PaperOptions) -> Result<TpchSetup> {
    prepare_at(tb, o, scale_factor(o), &tb.ext4.join("tpch"), None)
}

/// The data of scale factor `sf` in `base/data` and an empty cluster in `base/pristine`
/// (listening on `port`, else PostgreSQL's default): [`prepare`], and each tenant's of
/// [`super::tenants`].
pub(super) fn prepare_at(tb: &Testbed, o: &PaperOptions, sf: f64, base: &Path, port: Option<u16>) -> Result<TpchSetup> {
    let user = pgbench::postgres_user()?;
    let gen = find_tpchgen()?;
    let gen_s = gen.to_string_lossy().to_string();
    let version = sys::run_with_timeout(&gen_s, &["--version"], Duration::from_secs(20))?.trim().to_string();
    let t = Instant::now();
    let base = base.to_path_buf();
    let data = base.join("data");
    std::fs::create_dir_all(&data).ctx(|| format!("create {}", data.display()))?;
    note!(
        "paper: tpch: generating scale factor {} with {version} (about {:.0} MiB of CSV)",
        sf_text(sf),
        sf * CSV_BYTES_PER_SF as f64 / MIB as f64
    );
    let limit = Duration::from_secs(120 + (600.0 * sf) as u64);
    let d = data.to_string_lossy().to_string();
    sys::run_with_timeout(&gen_s, &["csv", "-s", &sf_text(sf), "-o", &d, "--quiet", "--overwrite"], limit)?;
    sys::check_interrupt()?;
    let mut rows = Vec::new();
    let mut data_bytes = 0;
    for table in TABLES {
        let p = data.join(format!("{table}.csv"));
        data_bytes += p.metadata().ctx(|| format!("tpchgen-cli wrote no {}", p.display()))?.len();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .ctx(|| format!("chmod {}", p.display()))?;
        rows.push((table.to_string(), data_rows(&p)?));
    }
    for dir in [&base, &data] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .ctx(|| format!("chmod {}", dir.display()))?;
    }

    // The empty cluster.
    let sock = tb.dir.join("sock");
    std::fs::create_dir_all(&sock).ctx(|| format!("create {}", sock.display()))?;
    pgbench::chown(&sock, user)?;
    let pristine = base.join("pristine");
    std::fs::create_dir_all(&pristine).ctx(|| format!("create {}", pristine.display()))?;
    pgbench::chown(&pristine, user)?;
    let p = pristine.to_string_lossy().to_string();
    pgbench::pg_run(
        tb,
        "initdb",
        &["-D", &p, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"],
        &[],
        pgbench::PG_CMD_TIMEOUT,
    )?;
    let conf = format!(
        "\n# farcache bench paper --experiment tpch\nlisten_addresses = ''\nunix_socket_directories = '{}'\n\
         shared_buffers = {SHARED_BUFFERS}\nwork_mem = {WORK_MEM}\nmaintenance_work_mem = {}\n\
         max_connections = 20\nwal_level = minimal\nmax_wal_senders = 0\nmax_wal_size = 2GB\njit = off\n\
         max_parallel_workers_per_gather = 0\n{}",
        sock.display(),
        maintenance_work_mem(o),
        port.map(|p| format!("port = {p}\n")).unwrap_or_default()
    );
    std::fs::OpenOptions::new()
        .append(true)
        .open(pristine.join("postgresql.conf"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, conf.as_bytes()))
        .ctx(|| "write postgresql.conf".into())?;

    // The SQL, where psql (as postgres) can read it: not on the measured disk.
    let sql = sql_dir(tb);
    std::fs::create_dir_all(&sql).ctx(|| format!("create {}", sql.display()))?;
    std::fs::create_dir_all(logs_dir(tb)).ctx(|| "create the tpch log directory".into())?;
    for (i, q) in QUERIES.iter().enumerate() {
        let p = sql.join(format!("q{}.sql", i + 1));
        std::fs::write(&p, q).ctx(|| format!("write {}", p.display()))?;
    }
    sys::run("sync", &[])?;
    let share = o.tpch_deadline_secs / o.configs_for(super::Experiment::Tpch).len().max(1) as u64;
    let setup = TpchSetup {
        scale_factor: sf,
        generator: version,
        data_bytes,
        rows,
        gen_secs: t.elapsed().as_secs_f64(),
        lender_capacity_bytes: lender_capacity(o),
        statement_timeout_secs: o.tpch_statement_timeout_secs,
        config_deadline_secs: share,
        work_mem: WORK_MEM.into(),
        maintenance_work_mem: maintenance_work_mem(o),
        shared_buffers: SHARED_BUFFERS.into(),
    };
    note!(
        "paper: tpch: {:.0} MiB of CSV ({} lineitem rows) and an empty cluster ready in {:.1} s",
        data_bytes as f64 / MIB as f64,
        setup.rows.iter().find(|(t, _)| t == "lineitem").map_or(0, |(_, n)| *n),
        setup.gen_secs
    );
    Ok(setup)
}

pub(super) fn sql_dir(tb: &Testbed) -> PathBuf {
    tb.dir.join("tpch-sql")
}

/// Every psql's output and errors (the queries' results included), kept with the run's logs.
pub(super) fn logs_dir(tb: &Testbed) -> PathBuf {
    tb.logs.join("tpch")
}

/// One configuration: fresh cluster, cold start, the three tests. A test that fails ends
/// the configuration with its error recorded (what was measured stays).
pub fn run_config(tb: &mut Testbed, o: &PaperOptions, setup: &TpchSetup, cfg: ConfigKind) -> Result<TpchRecord> {
    let user = pgbench::postgres_user()?;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(setup.config_deadline_secs.max(60));
    let base = tb.ext4.join("tpch");
    let db = base.join("db");
    if db.exists() {
        std::fs::remove_dir_all(&db).ctx(|| format!("remove {}", db.display()))?;
    }
    let (src, dst) = (base.join("pristine").to_string_lossy().to_string(), db.to_string_lossy().to_string());
    sys::run("cp", &["-a", &src, &dst])?;
    tb.remount()?;
    let mut rec = TpchRecord { config: Some(cfg), ..TpchRecord::default() };
    rec.cached_pages_at_start = pgbench::cached_under(&base);
    let limit = (cfg != ConfigKind::Ideal).then_some(o.memory_bytes);
    let mem = tb.memory_cgroup(limit)?;
    let cpu = tb.cpu_cgroup()?;
    let mut lenders = match cfg {
        ConfigKind::Farcache => Some(tb.start_lenders(setup.lender_capacity_bytes, o.policy.as_deref())?),
        _ => None,
    };
    let addrs: Vec<_> = lenders.as_ref().map(|l| l.addrs.clone()).unwrap_or_default();
    let log = tb.logs.join(format!("tpch-{}.mount.log", cfg.name()));
    let remote = lenders.as_ref().map(|l| &l.addrs[..]);
    let mut mount = MountDaemon::for_config(tb, o, cfg, remote, &[], &[&mem, &cpu, &tb.blkio], &log)?;
    let probe = CpuProbe::of(&cpu, mount.as_ref(), lenders.as_ref());
    let fs = if mount.is_some() { tb.mnt.join("tpch") } else { base.clone() };
    let tb_ref: &Testbed = tb;
    let log = tb_ref.logs.join(format!("tpch-{}.postgres.log", cfg.name()));
    let cgroups = [&mem, &cpu, &tb_ref.blkio];
    let label = format!("tpch {}", cfg.name());
    let res = Server::start(tb_ref, fs.join("db"), &cgroups, &log, user).and_then(|mut server| {
        let mut ctx = Ctx {
            tb: tb_ref,
            o,
            setup,
            cfg,
            cgroups: &cgroups,
            addrs: &addrs,
            mount: mount.as_mut(),
            cpu: Some(&probe),
            deadline,
            label: &label,
            port: None,
        };
        let r = measure(&mut ctx, &fs, &db, &mut rec);
        let stopped = server.stop();
        r.and(stopped)
    });
    if let Err(e) = res {
        if sys::interrupted() {
            return Err(e);
        }
        let mut msg = e.to_string();
        if let Some(k) = runner::oom_kills(&mem).filter(|k| *k > 0) {
            msg.push_str(&format!("\n{k} OOM kill(s) in the client's memory cgroup"));
        }
        if let Some(m) = mount.as_ref() {
            msg.push_str(&format!("\nthe mount daemon's log ends:\n{}", m.log_tail()));
        }
        note!("paper: [{label}] FAILED: {msg}");
        rec.error = Some(msg);
    }
    let t = runner::tear_down(&mem, mount, lenders.as_mut());
    (rec.memory_max_usage_bytes, rec.oom_kills, rec.daemon_rss_bytes, rec.daemon_anon_bytes) =
        (t.memory_max_usage_bytes, t.oom_kills, t.daemon_rss_bytes, t.daemon_anon_bytes);
    rec.mount = rec.mount.or(t.mount_at_exit);
    rec.secs_total = t0.elapsed().as_secs_f64();
    Ok(rec)
}

/// What the tests of one configuration share.
pub(super) struct Ctx<'a> {
    pub(super) tb: &'a Testbed,
    pub(super) o: &'a PaperOptions,
    pub(super) setup: &'a TpchSetup,
    pub(super) cfg: ConfigKind,
    pub(super) cgroups: &'a [&'a Cgroup],
    pub(super) addrs: &'a [std::net::SocketAddr],
    pub(super) mount: Option<&'a mut MountDaemon>,
    /// Where the tests' CPU time is read from (`None`: not measured).
    pub(super) cpu: Option<&'a CpuProbe>,
    pub(super) deadline: Instant,
    pub(super) label: &'a str,
    /// The cluster's port, when not PostgreSQL's default (several clusters at once).
    pub(super) port: Option<u16>,
}

impl Ctx<'_> {
    /// The counters now, and the CPU time so far (read first: the counters' own questions to
    /// the daemon and the lenders are not the tests' work).
    fn snapshot(&mut self) -> Result<(Snapshot, CpuTime)> {
        let cpu = self.cpu.map(CpuProbe::sample).unwrap_or_default();
        Ok((runner::snapshot(self.tb, self.addrs, self.mount.as_deref_mut())?, cpu))
    }

    fn left(&self) -> Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BenchError::Setup(format!(
                "[{}] the configuration's deadline ({} s, --tpch-deadline over the configurations) has passed",
                self.label, self.setup.config_deadline_secs
            )));
        }
        Ok(left)
    }
}

fn phase((a, ca): &(Snapshot, CpuTime), (b, cb): &(Snapshot, CpuTime), secs: f64) -> TpchPhase {
    TpchPhase {
        secs,
        disk: b.disk.since(&a.disk),
        lenders: b.lenders.since(&a.lenders),
        transfers: runner::transfers(a, b),
        cpu: cb.since(ca),
    }
}

fn measure(c: &mut Ctx, fs: &Path, db: &Path, rec: &mut TpchRecord) -> Result<()> {
    // Load test.
    let s0 = c.snapshot()?;
    let t = Instant::now();
    load(c, fs, rec)?;
    let load_secs = t.elapsed().as_secs_f64();
    rec.load_secs = Some(load_secs);
    let s1 = c.snapshot()?;
    rec.load = phase(&s0, &s1, load_secs);
    rec.database_bytes = pgbench::du(db);
    note!(
        "paper: [{}] load test: {load_secs:.1} s, database {:.0} MiB, disk {} reads / {} writes",
        c.label,
        rec.database_bytes as f64 / MIB as f64,
        rec.load.disk.read_ios,
        rec.load.disk.write_ios
    );

    // Power test.
    let orders: Vec<(u32, &[u32])> = vec![(0, &STREAM_ORDERS[0][..])];
    let (queries, secs) = run_streams(c, "power", &orders)?;
    rec.power = queries;
    rec.power_secs = Some(secs);
    let s2 = c.snapshot()?;
    rec.power_phase = phase(&s1, &s2, secs);
    note!("paper: [{}] power test: {secs:.1} s{}", c.label, status_note(&rec.power));

    // Throughput test.
    let orders: Vec<(u32, &[u32])> =
        (1..=THROUGHPUT_STREAMS).map(|s| (s as u32, &STREAM_ORDERS[s.min(2)][..])).collect();
    let (queries, secs) = run_streams(c, "throughput", &orders)?;
    let ok = queries.iter().filter(|q| q.status == QueryStatus::Ok).count();
    rec.throughput = queries;
    rec.throughput_secs = Some(secs);
    rec.queries_per_hour = (secs > 0.0 && ok > 0).then(|| ok as f64 * 3600.0 / secs);
    let s3 = c.snapshot()?;
    rec.throughput_phase = phase(&s2, &s3, secs);
    rec.mount = s3.0.mount.clone();
    note!(
        "paper: [{}] throughput test: {secs:.1} s, {:.0} queries per hour{}",
        c.label,
        rec.queries_per_hour.unwrap_or(0.0),
        status_note(&rec.throughput)
    );
    Ok(())
}

fn status_note(q: &[TpchQuery]) -> String {
    let n = |s| q.iter().filter(|x| x.status == s).count();
    let (t, k, f) = (n(QueryStatus::TimedOut), n(QueryStatus::Skipped), n(QueryStatus::Failed));
    if t + k + f == 0 {
        return String::new();
    }
    format!(" ({t} timed out, {k} skipped at the deadline, {f} failed)")
}

/// The load test's steps, each one psql, timed by the harness.
pub(super) fn load(c: &mut Ctx, fs: &Path, rec: &mut TpchRecord) -> Result<()> {
    let sql = sql_dir(c.tb);
    for table in TABLES {
        let create = create_statement(table)
            .ok_or_else(|| BenchError::Setup(format!("bench/tpch/schema.sql has no CREATE TABLE {table}")))?;
        let file = fs.join("data").join(format!("{table}.csv"));
        let text = format!(
            "BEGIN;\n{create};\nCOPY {table} FROM '{}' WITH (FORMAT csv, HEADER true, FREEZE true);\nCOMMIT;\n",
            file.display()
        );
        let path = sql.join(format!("load-{table}.sql"));
        std::fs::write(&path, text).ctx(|| format!("write {}", path.display()))?;
        let p = path.to_string_lossy().to_string();
        let (out, secs) = psql_blocking(c, &["-X", "-v", "ON_ERROR_STOP=1", "-f", &p], &format!("load {table}"))?;
        let rows = out.lines().find_map(|l| l.trim().strip_prefix("COPY ")?.trim().parse::<u64>().ok());
        note!("paper: [{}] load {table}: {secs:.1} s, {} rows", c.label, rows.unwrap_or(0));
        rec.load_steps.push(TpchStep { what: format!("create and copy {table}"), secs, rows });
    }
    let statements = index_statements();
    let path = sql.join("indexes.sql");
    let mut text = String::from("\\timing on\n");
    for s in &statements {
        text.push_str(s);
        text.push_str(";\n");
    }
    std::fs::write(&path, text).ctx(|| format!("write {}", path.display()))?;
    let p = path.to_string_lossy().to_string();
    let (out, secs) = psql_blocking(c, &["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", &p], "keys and indexes")?;
    let times: Vec<f64> = out.lines().filter_map(timing_secs).collect();
    for (i, s) in statements.iter().enumerate() {
        let secs = times.get(i).copied().unwrap_or(0.0);
        rec.load_steps.push(TpchStep { what: s.clone(), secs, rows: None });
    }
    note!("paper: [{}] keys and indexes ({} statements): {secs:.1} s", c.label, statements.len());
    let (_, secs) = psql_blocking(c, &["-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", "ANALYZE"], "analyze")?;
    rec.load_steps.push(TpchStep { what: "ANALYZE".into(), secs, rows: None });
    note!("paper: [{}] analyze: {secs:.1} s", c.label);
    Ok(())
}

/// "Time: 12.345 ms" (psql's `\timing`) → seconds.
fn timing_secs(line: &str) -> Option<f64> {
    let ms: f64 = line.strip_prefix("Time: ")?.split_whitespace().next()?.parse().ok()?;
    Some(ms / 1000.0)
}

/// A psql in the client's cgroups with a clean environment.
pub(super) fn psql_cmd(c: &Ctx, args: &[&str], timeout_secs: Option<u64>) -> Command {
    psql_with(c, args, timeout_secs, "")
}

/// [`psql_cmd`] with more server settings (`-c name=value ...`, PGOPTIONS).
pub(super) fn psql_with(c: &Ctx, args: &[&str], timeout_secs: Option<u64>, options: &str) -> Command {
    let mut cmd = pgbench::pg_cmd(c.tb, "psql", c.cgroups);
    cmd.args(args);
    if let Some(p) = c.port {
        cmd.env("PGPORT", p.to_string());
    }
    let mut opts = options.to_string();
    if let Some(t) = timeout_secs {
        opts = format!("-c statement_timeout={t}s {opts}");
    }
    if !opts.trim().is_empty() {
        cmd.env("PGOPTIONS", opts.trim());
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// Run one psql to completion within the configuration's deadline, saying every
/// [`HEARTBEAT`] that it is still going; its stdout and the wall time.
fn psql_blocking(c: &Ctx, args: &[&str], what: &str) -> Result<(String, f64)> {
    let limit = c.left()?;
    let stem = logs_dir(c.tb).join(format!("{}-{}", c.cfg.name(), what.replace(' ', "-")));
    let (out_path, err_path) = (stem.with_extension("out"), stem.with_extension("err"));
    let mut cmd = psql_cmd(c, args, None);
    cmd.stdout(std::fs::File::create(&out_path).ctx(|| "create a log".into())?);
    cmd.stderr(std::fs::File::create(&err_path).ctx(|| "create a log".into())?);
    let t = Instant::now();
    let mut child = cmd.spawn().ctx(|| format!("start psql for {what} (setpriv)"))?;
    let mut beat = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().ctx(|| format!("wait for psql ({what})"))? {
            break st;
        }
        if sys::interrupted() || t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            sys::check_interrupt()?;
            return Err(BenchError::Setup(format!(
                "[{}] {what} ran into the configuration's deadline after {:.0} s",
                c.label,
                t.elapsed().as_secs_f64()
            )));
        }
        if beat.elapsed() >= HEARTBEAT {
            beat = Instant::now();
            note!("paper: [{}] {what}: still running after {:.0} s", c.label, t.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let secs = t.elapsed().as_secs_f64();
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    if !status.success() {
        let err = std::fs::read_to_string(&err_path).unwrap_or_default();
        return Err(BenchError::Setup(format!("[{}] {what}: psql failed ({status}): {}", c.label, err.trim())));
    }
    Ok((out, secs))
}

/// A query in flight.
pub(super) struct Active {
    pub(super) query: u32,
    pub(super) child: std::process::Child,
    pub(super) start: Instant,
    pub(super) out: PathBuf,
    pub(super) err: PathBuf,
}

/// Run query streams at once, each query by its own psql (one thread: children are polled),
/// until every stream is done; the queries and the seconds until the last one ended.
fn run_streams(c: &mut Ctx, test: &str, streams: &[(u32, &[u32])]) -> Result<(Vec<TpchQuery>, f64)> {
    let timeout = c.o.tpch_statement_timeout_secs.max(1);
    let hard = Duration::from_secs(timeout) + PSQL_GRACE;
    let sf = sf_text(c.setup.scale_factor);
    let sql = sql_dir(c.tb);
    let t0 = Instant::now();
    let mut next = vec![0usize; streams.len()];
    let mut active: Vec<Option<Active>> = streams.iter().map(|_| None).collect();
    let mut done: Vec<TpchQuery> = Vec::new();
    let mut beat = Instant::now();
    let kill_all = |active: &mut Vec<Option<Active>>| {
        for a in active.iter_mut().filter_map(Option::take) {
            let mut ch = a.child;
            let _ = ch.kill();
            let _ = ch.wait();
        }
    };
    loop {
        if sys::interrupted() {
            kill_all(&mut active);
            sys::check_interrupt()?;
        }
        for (i, &(stream, order)) in streams.iter().enumerate() {
            // A query that ended, or ran past every bound.
            if let Some(a) = active[i].as_mut() {
                if let Some(r) = poll_psql(a, hard, c.deadline) {
                    let a = active[i].take().expect("active");
                    let q = finish(&a, stream, r);
                    if stream == 0 || q.status != QueryStatus::Ok {
                        note!("paper: [{} {test}] stream {stream} q{}: {}", c.label, q.query, describe(&q));
                    }
                    done.push(q);
                }
            }
            if active[i].is_some() || next[i] >= order.len() {
                continue;
            }
            let q = order[next[i]];
            next[i] += 1;
            if Instant::now() >= c.deadline {
                done.push(TpchQuery {
                    query: q,
                    stream,
                    status: QueryStatus::Skipped,
                    secs: 0.0,
                    wall_secs: 0.0,
                    rows: 0,
                    checksum: String::new(),
                    error: Some("not started: the configuration's deadline had passed".into()),
                    started_unix_ms: None,
                });
                continue;
            }
            let stem = logs_dir(c.tb).join(format!("{}-{test}-s{stream}-q{q}", c.cfg.name()));
            let (out, err) = (stem.with_extension("out"), stem.with_extension("err"));
            let file = sql.join(format!("q{q}.sql")).to_string_lossy().to_string();
            let sfv = format!("sf={sf}");
            let args = ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-v", &sfv, "-c", "\\timing on", "-f", &file];
            let mut cmd = psql_cmd(c, &args, Some(timeout));
            cmd.stdout(std::fs::File::create(&out).ctx(|| "create a log".into())?);
            cmd.stderr(std::fs::File::create(&err).ctx(|| "create a log".into())?);
            let start = Instant::now();
            let child = cmd.spawn().ctx(|| format!("start psql for q{q} (setpriv)"))?;
            active[i] = Some(Active { query: q, child, start, out, err });
        }
        if active.iter().all(Option::is_none) && streams.iter().enumerate().all(|(i, (_, o))| next[i] >= o.len()) {
            break;
        }
        if beat.elapsed() >= HEARTBEAT {
            beat = Instant::now();
            let running: Vec<String> = active
                .iter()
                .zip(streams)
                .filter_map(|(a, (s, _))| a.as_ref().map(|a| format!("stream {s} q{}", a.query)))
                .collect();
            note!(
                "paper: [{} {test}] {} of {} queries done after {:.0} s; running {}",
                c.label,
                done.len(),
                streams.iter().map(|(_, o)| o.len()).sum::<usize>(),
                t0.elapsed().as_secs_f64(),
                running.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok((done, t0.elapsed().as_secs_f64()))
}

/// Whether query `a` ended: its exit status, or why the harness killed it (it ran `hard`
/// past its start, or past `deadline`); none while it runs.
pub(super) fn poll_psql(
    a: &mut Active,
    hard: Duration,
    deadline: Instant,
) -> Option<std::result::Result<std::process::ExitStatus, String>> {
    match a.child.try_wait() {
        Ok(Some(st)) => Some(Ok(st)),
        Ok(None) if a.start.elapsed() > hard || Instant::now() > deadline => {
            let _ = a.child.kill();
            let _ = a.child.wait();
            Some(Err(if Instant::now() > deadline {
                "killed by the harness at the configuration's deadline".to_string()
            } else {
                format!("psql ran {hard:?}, past its statement_timeout: killed by the harness")
            }))
        }
        Ok(None) => None,
        Err(e) => Some(Err(format!("wait for psql: {e}"))),
    }
}

pub(super) fn describe(q: &TpchQuery) -> String {
    match q.status {
        QueryStatus::Ok => format!("{:.2} s, {} rows", q.secs, q.rows),
        QueryStatus::TimedOut => format!("TIMED OUT after {:.0} s", q.wall_secs),
        QueryStatus::Skipped => "skipped (deadline)".into(),
        QueryStatus::Failed => format!("FAILED: {}", q.error.as_deref().unwrap_or("?")),
    }
}

/// The record of a psql that ended (or was killed: `Err`).
pub(super) fn finish(a: &Active, stream: u32, r: std::result::Result<std::process::ExitStatus, String>) -> TpchQuery {
    let elapsed = a.start.elapsed();
    let started = std::time::SystemTime::now().checked_sub(elapsed);
    let wall = elapsed.as_secs_f64();
    let out = std::fs::read_to_string(&a.out).unwrap_or_default();
    let err = std::fs::read_to_string(&a.err).unwrap_or_default();
    let mut q = TpchQuery {
        query: a.query,
        stream,
        status: QueryStatus::Ok,
        secs: wall,
        wall_secs: wall,
        rows: 0,
        checksum: String::new(),
        error: None,
        started_unix_ms: started
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64),
    };
    match r {
        Ok(st) if st.success() => {
            let (rows, checksum, secs) = summarize(&out);
            (q.rows, q.checksum) = (rows, checksum);
            if let Some(s) = secs {
                q.secs = s;
            }
        }
        Ok(st) => {
            q.status = if err.contains("statement timeout") { QueryStatus::TimedOut } else { QueryStatus::Failed };
            q.error = Some(format!("psql {st}: {}", err.trim()));
        }
        Err(e) => {
            q.status = QueryStatus::TimedOut;
            q.error = Some(e);
        }
    }
    q
}

/// A query's output (`psql -A -t` with `\timing`): its row count, a checksum of its rows
/// sorted, and the time psql measured.
pub fn summarize(out: &str) -> (u64, String, Option<f64>) {
    let mut rows: Vec<&str> = Vec::new();
    let mut secs: Option<f64> = None;
    for l in out.lines() {
        if let Some(s) = timing_secs(l) {
            secs = Some(secs.unwrap_or(0.0) + s);
        } else if !l.starts_with("Timing is ") {
            rows.push(l);
        }
    }
    rows.sort_unstable();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in &rows {
        for b in r.bytes().chain(std::iter::once(b'\n')) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    (rows.len() as u64, format!("{h:016x}"), secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_orders_are_permutations() {
        for order in STREAM_ORDERS {
            let mut v = order.to_vec();
            v.sort_unstable();
            assert_eq!(v, (1..=22).collect::<Vec<u32>>());
        }
    }

    #[test]
    fn every_table_and_query_is_there() {
        for t in TABLES {
            let s = create_statement(t).unwrap_or_else(|| panic!("no CREATE TABLE {t}"));
            assert!(s.ends_with(')'), "{s}");
        }
        assert_eq!(index_statements().len(), 17);
        for (i, q) in QUERIES.iter().enumerate() {
            assert!(q.contains(&format!("Q{}", i + 1)), "q{}.sql is not query {}", i + 1, i + 1);
            assert!(q.trim_end().ends_with(';'));
        }
    }

    #[test]
    fn summarizes_output_in_any_row_order() {
        let a = summarize("b|2\na|1\nTime: 12.500 ms\n");
        let b = summarize("a|1\nb|2\nTime: 1.000 ms (00:00.001)\n");
        assert_eq!((a.0, &a.1), (2, &b.1));
        assert_eq!(a.2, Some(0.0125));
        assert_ne!(summarize("a|1\n").1, summarize("a|2\n").1);
        assert_eq!(summarize("").0, 0);
    }

    #[test]
    fn scale_factor_follows_the_client() {
        let mut o = PaperOptions::full("farcache".into());
        assert_eq!(scale_factor(&o), 0.75);
        assert_eq!(sf_text(0.75), "0.75");
        assert_eq!(sf_text(1.0), "1");
        assert_eq!(sf_text(0.01), "0.01");
        // 0.75 × 2000 MiB × 1.25 = 1875 MiB > 1228 MiB.
        assert_eq!(lender_capacity(&o), 1875 * MIB);
        o.tpch_scale_factor = Some(0.01);
        assert_eq!(lender_capacity(&o), o.lender_capacity_bytes);
        assert_eq!(maintenance_work_mem(&o), "64MB");
        o.memory_bytes = 96 * MIB;
        assert_eq!(maintenance_work_mem(&o), "12MB");
    }
}
