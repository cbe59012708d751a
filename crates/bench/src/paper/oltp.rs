//! `oltp`: paper 002's OLTP figures (issue 11) — a TPC-C-like load (go-tpc, `-d postgres`) on
//! PostgreSQL 15 in `native`, `passthrough` and `farcache`: tpmC against the connection count,
//! the block-layer scheduler of the loop device, and the CPUs the client may use.
//!
//! The data is loaded once per run (`go-tpc tpcc prepare`) by the harness into a pristine
//! cluster on ext4, outside the client's cgroups, with `fsync`, `synchronous_commit` and
//! `full_page_writes` off for the load only (a 1-warehouse load takes 5 s instead of 4 min;
//! the cluster is stopped cleanly and synced, then its configuration is put back). Each
//! configuration then gets a fresh copy, a cold start (ext4 remounted, new memory, cpuacct
//! and cpuset cgroups, new mount and lenders) and one PostgreSQL, like [`super::pgbench`];
//! PostgreSQL and the mount daemon run in the client's memory, cpuacct, cpuset and blkio
//! cgroups; go-tpc, which stands for the database's remote clients, in the cpuacct and cpuset
//! ones only (its CPU is counted and confined with the server's; its memory is not the
//! server's — inside a small memory cgroup it got PostgreSQL backends OOM-killed). Its points
//! run one after the other on that server, in this order:
//!
//! 1. `connections`: `go-tpc tpcc run -T N` for each connection count, the device's own
//!    scheduler, every CPU;
//! 2. `scheduler`: at `oltp_point_connections`, each scheduler of `oltp_schedulers` written
//!    to /sys/block/loopN/queue/scheduler (one the kernel lacks is skipped, and said so);
//! 3. `cpus`: at `oltp_point_connections`, the cpuset cgroup that PostgreSQL, go-tpc and the
//!    mount daemon share narrowed to the first N CPUs (cpuset.cpus is rewritten between
//!    points; the kernel moves the tasks). The lenders stay outside: other machines.
//!
//! The device's scheduler and the cpuset are put back however a configuration ends.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cgroup::Cgroup;
use super::counters::{lender_totals, thread_cpu_ms, thread_groups_since, CpuProbe, CpuTime, LenderTotals};
use super::mount::MountDaemon;
use super::pgbench::{cached_under, du, pg_run, postgres_user, Server, PG_CMD_TIMEOUT, SHARED_BUFFERS};
use super::report::{PaperReport, Verdict};
use super::run::oom_kills;
use super::testbed::{DiskStat, Testbed};
use super::{sys, ConfigKind, Experiment, PaperOptions, MIB};
use crate::error::IoContext;
use crate::progress::Progress;
use crate::{BenchError, Result};

/// On-disk size of one warehouse in PostgreSQL 15 after `go-tpc tpcc prepare` (measured:
/// 121 MB for one, the item table included), used to size the default.
pub const BYTES_PER_WAREHOUSE: u64 = 115 * MIB;
/// The connection counts.
pub const CONNECTIONS: [u32; 6] = [1, 2, 4, 8, 16, 32];
/// The schedulers.
pub const SCHEDULERS: [&str; 4] = ["none", "mq-deadline", "bfq", "kyber"];
/// PostgreSQL's `max_connections` (go-tpc holds one per thread); connection counts above
/// [`MAX_CLIENT_CONNECTIONS`] are refused at the command line.
const PG_MAX_CONNECTIONS: u32 = 80;
pub const MAX_CLIENT_CONNECTIONS: u32 = 64;
const _: () = assert!(MAX_CLIENT_CONNECTIONS + 5 <= PG_MAX_CONNECTIONS);
/// The database go-tpc loads.
const DB: &str = "tpcc";
/// The settings of the harness's load only (never of a measured run).
const LOAD_SETTINGS: &str = "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n";

/// Which series a point belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PointKind {
    Connections,
    Scheduler,
    Cpus,
}

/// One `go-tpc tpcc run`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OltpRecord {
    pub config: ConfigKind,
    pub kind: PointKind,
    pub connections: u32,
    /// The loop device's scheduler while it ran.
    pub scheduler: String,
    /// CPUs of the client's cpuset while it ran.
    pub cpus: u32,
    pub secs: f64,
    /// NewOrder transactions per minute (go-tpc's `tpmC`), and every kind together.
    pub tpmc: f64,
    pub tpm_total: f64,
    pub new_orders: u64,
    pub new_order_ms_avg: f64,
    pub new_order_ms_p99: f64,
    /// Transactions that failed (go-tpc's `*_ERR` counts; it runs with --ignore-error).
    pub errors: u64,
    /// OOM kills in the client's memory cgroup while it ran (a killed backend restarts
    /// PostgreSQL: the point is void).
    #[serde(default)]
    pub oom_kills: u64,
    pub disk: DiskStat,
    pub lenders: LenderTotals,
    /// Pages of the database in the page cache when the configuration started (0: cold).
    pub cached_pages_at_start: u64,
    pub cpu: CpuTime,
    /// The mount daemon's CPU by thread group ([`thread_groups_since`]).
    #[serde(default)]
    pub daemon_threads_ms: BTreeMap<String, f64>,
    /// FUSE requests the mount received during the point, by opcode (`fuse.ops` of
    /// `farcache stats`; only those that moved). Empty for native.
    #[serde(default)]
    pub fuse_ops: BTreeMap<String, u64>,
    pub error: Option<String>,
}

impl OltpRecord {
    fn at(config: ConfigKind, p: &Point) -> OltpRecord {
        OltpRecord {
            config,
            kind: p.kind,
            connections: p.connections,
            scheduler: p.scheduler.clone().unwrap_or_default(),
            cpus: p.cpus.unwrap_or(0),
            secs: 0.0,
            tpmc: 0.0,
            tpm_total: 0.0,
            new_orders: 0,
            new_order_ms_avg: 0.0,
            new_order_ms_p99: 0.0,
            errors: 0,
            oom_kills: 0,
            disk: DiskStat::default(),
            lenders: LenderTotals::default(),
            cached_pages_at_start: 0,
            cpu: CpuTime::default(),
            daemon_threads_ms: BTreeMap::new(),
            fuse_ops: BTreeMap::new(),
            error: None,
        }
    }

    /// Whether this record is the measurement of point `p` in `cfg`.
    fn is(&self, cfg: ConfigKind, p: &Point) -> bool {
        self.config == cfg
            && self.kind == p.kind
            && self.connections == p.connections
            && p.scheduler.as_ref().is_none_or(|s| *s == self.scheduler)
            && p.cpus.is_none_or(|c| c == self.cpus)
    }
}

/// The loaded data every configuration starts from, and what the machine offers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OltpSetup {
    pub warehouses: u32,
    /// `du` of the pristine cluster after the load (all databases, WAL included: the load
    /// leaves up to `max_wal_size` of it).
    pub database_bytes: u64,
    /// `du` of its tables and indexes alone (`base/`: the TPC-C database and PostgreSQL's
    /// three small template databases), what the 2–4× of the client's memory is about.
    #[serde(default)]
    pub data_bytes: u64,
    pub prepare_secs: f64,
    /// The loop device's scheduler as the kernel set it (the `connections` points run with it).
    pub default_scheduler: String,
    pub schedulers_available: Vec<String>,
    pub cpus_online: u32,
    /// What was asked for and cannot run here (a scheduler the kernel lacks, more CPUs than
    /// the machine has).
    pub skipped: Vec<String>,
}

/// One point of a configuration's plan; `None`: as the device / machine has it.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub kind: PointKind,
    pub connections: u32,
    pub scheduler: Option<String>,
    pub cpus: Option<u32>,
}

/// Warehouses for a database of about three times the client's memory (the issue: 2–4×).
pub fn warehouses_for(o: &PaperOptions) -> u32 {
    o.oltp_warehouses.unwrap_or_else(|| (3 * o.memory_bytes).div_ceil(BYTES_PER_WAREHOUSE).max(1) as u32)
}

/// Room for the pristine cluster, a working copy, its growth and WAL.
pub fn disk_bytes(o: &PaperOptions) -> u64 {
    3 * warehouses_for(o) as u64 * BYTES_PER_WAREHOUSE + 2 * super::GIB
}

/// The points of `cfg` (schedulers and CPU counts the machine lacks are already dropped).
pub fn plan(o: &PaperOptions, setup: &OltpSetup, cfg: ConfigKind) -> Vec<Point> {
    let mut v: Vec<Point> = o
        .oltp_connections
        .iter()
        .map(|&c| Point { kind: PointKind::Connections, connections: c, scheduler: None, cpus: None })
        .collect();
    if !o.oltp_point_configs.is_empty() && !o.oltp_point_configs.contains(&cfg) {
        return v;
    }
    let n = o.oltp_point_connections;
    for s in o.oltp_schedulers.iter().filter(|s| setup.schedulers_available.contains(s)) {
        v.push(Point { kind: PointKind::Scheduler, connections: n, scheduler: Some(s.clone()), cpus: None });
    }
    for &c in o.oltp_cpus.iter().filter(|&&c| c >= 1 && c <= setup.cpus_online) {
        v.push(Point { kind: PointKind::Cpus, connections: n, scheduler: None, cpus: Some(c) });
    }
    v
}

/// The go-tpc binary: on PATH, or where scripts/deps.sh and `go install` put it.
pub fn go_tpc() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/local/bin", "/root/go/bin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join("go-tpc")).find(|p| p.is_file()).ok_or_else(|| {
        BenchError::Setup(
            "go-tpc is missing (the TPC-C-like load of --experiment oltp): run `make deps` (scripts/deps.sh: \
             GOBIN=/usr/local/bin go install github.com/pingcap/go-tpc/cmd/go-tpc@v1.0.12)"
                .into(),
        )
    })
}

/// go-tpc's arguments to reach the run's cluster over its Unix socket: lib/pq takes the
/// socket directory as `host=` when the address has no host of its own (`:5432`).
fn go_tpc_args(sock: &Path, sub: &str, warehouses: u32) -> Vec<String> {
    ["tpcc", sub, "-d", "postgres", "-U", "postgres", "-D", DB, "--targets", ":5432", "--conn-params"]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("host={}&sslmode=disable", sock.display()), "--warehouses".into(), warehouses.to_string()])
        .collect()
}

/// Run go-tpc inside `cgroups`, bounded by `limit` and the interrupt flag; its output.
fn run_go_tpc(
    go: &Path,
    tb: &Testbed,
    args: &[String],
    cgroups: &[&Cgroup],
    limit: Duration,
    tag: &str,
) -> Result<String> {
    let mut c = Command::new(go);
    c.args(args).env_clear().env("PATH", "/usr/bin:/bin").stdin(Stdio::null()).current_dir(&tb.dir);
    let out_path = tb.logs.join(format!("go-tpc-{tag}.out"));
    c.stdout(std::fs::File::create(&out_path).ctx(|| "create a log".into())?);
    c.stderr(std::fs::File::create(out_path.with_extension("err")).ctx(|| "create a log".into())?);
    let procs: Vec<PathBuf> = cgroups.iter().map(|g| g.procs()).collect();
    let refs: Vec<&Path> = procs.iter().map(|p| p.as_path()).collect();
    sys::confine(&mut c, &refs);
    let mut child = c.spawn().ctx(|| format!("start {}", go.display()))?;
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().ctx(|| "wait for go-tpc".into())? {
            break st;
        }
        if sys::interrupted() || Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            sys::check_interrupt()?;
            return Err(BenchError::Setup(format!("go-tpc {} ran over {limit:?}; killed", args[1])));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&out_path).unwrap_or_default()
        + &std::fs::read_to_string(out_path.with_extension("err")).unwrap_or_default();
    if !status.success() {
        let tail: Vec<&str> = out.lines().rev().take(8).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(BenchError::Setup(format!("go-tpc {} failed ({status}): {}", args[1], tail.join("\n"))));
    }
    Ok(out)
}

/// What `go-tpc tpcc run` printed at the end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunOutput {
    pub tpmc: f64,
    pub tpm_total: f64,
    pub new_orders: u64,
    pub new_order_ms_avg: f64,
    pub new_order_ms_p99: f64,
    pub errors: u64,
}

/// Read go-tpc's summary: the `[Summary] OP - Key: value, ...` lines (`OP_ERR`: failures)
/// and `tpmC: X, tpmTotal: Y, efficiency: Z%`. None without a tpmC line.
pub fn parse_run(out: &str) -> Option<RunOutput> {
    let mut r = RunOutput::default();
    let mut tpmc = None;
    for line in out.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("tpmC:") {
            let mut f = rest.split(',');
            tpmc = f.next()?.trim().parse().ok();
            r.tpm_total = f.next()?.trim().strip_prefix("tpmTotal:")?.trim().parse().ok()?;
            continue;
        }
        let Some(rest) = line.strip_prefix("[Summary]") else { continue };
        let Some((op, fields)) = rest.split_once(" - ") else { continue };
        let field = |k: &str| {
            fields.split(", ").find_map(|kv| kv.trim().strip_prefix(k)?.strip_prefix(": ")?.trim().parse::<f64>().ok())
        };
        let op = op.trim();
        let count = field("Count").unwrap_or(0.0) as u64;
        if op.ends_with("_ERR") {
            r.errors += count;
        } else if op == "NEW_ORDER" {
            r.new_orders = count;
            r.new_order_ms_avg = field("Avg(ms)").unwrap_or(0.0);
            r.new_order_ms_p99 = field("99th(ms)").unwrap_or(0.0);
        }
    }
    r.tpmc = tpmc?;
    Some(r)
}

/// The scheduler line of /sys/block/loopN/queue/scheduler: (current, available).
pub fn parse_schedulers(line: &str) -> (String, Vec<String>) {
    let mut cur = String::new();
    let all = line
        .split_whitespace()
        .map(|w| match w.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
            Some(x) => {
                cur = x.to_string();
                x.to_string()
            }
            None => w.to_string(),
        })
        .collect();
    (cur, all)
}

fn scheduler_file(dev: &str) -> PathBuf {
    Path::new("/sys/block").join(dev.trim_start_matches("/dev/")).join("queue/scheduler")
}

/// The loop device's scheduler, put back as it was when this is dropped.
struct SchedulerGuard {
    file: PathBuf,
    before: String,
}

impl SchedulerGuard {
    fn hold(dev: &str) -> Result<SchedulerGuard> {
        let file = scheduler_file(dev);
        let text = std::fs::read_to_string(&file).ctx(|| format!("read {}", file.display()))?;
        Ok(SchedulerGuard { before: parse_schedulers(&text).0, file })
    }

    fn set(&self, name: &str) -> Result<()> {
        sys::write_file(&self.file, name)
    }
}

impl Drop for SchedulerGuard {
    fn drop(&mut self) {
        if let Err(e) = sys::write_file(&self.file, &self.before) {
            note!("paper: oltp: could not put the scheduler {} back: {e}", self.before);
        }
    }
}

/// "0-(n-1)": the first `n` CPUs.
fn cpu_list(n: u32) -> String {
    if n <= 1 {
        "0".into()
    } else {
        format!("0-{}", n - 1)
    }
}

/// Make the pristine cluster under ext4/oltp/pristine with the TPC-C data loaded.
pub fn prepare(tb: &Testbed, o: &PaperOptions) -> Result<OltpSetup> {
    let user = postgres_user()?;
    let go = go_tpc()?;
    let t = Instant::now();
    let warehouses = warehouses_for(o);
    let pristine = super::pgbench::init_pristine(tb, "oltp", user)?;
    let sock = tb.dir.join("sock");
    let conf_path = pristine.join("postgresql.conf");
    let mut conf = std::fs::read_to_string(&conf_path).ctx(|| "read postgresql.conf".into())?;
    let _ = write!(
        conf,
        "\n# farcache bench paper oltp\nlisten_addresses = ''\nunix_socket_directories = '{}'\nshared_buffers = \
         {SHARED_BUFFERS}\nmax_connections = {PG_MAX_CONNECTIONS}\n",
        sock.display()
    );
    std::fs::write(&conf_path, format!("{conf}# the load only\n{LOAD_SETTINGS}"))
        .ctx(|| "write postgresql.conf".into())?;
    note!(
        "paper: oltp: loading {warehouses} warehouse(s) with go-tpc (about {} MiB)",
        warehouses as u64 * BYTES_PER_WAREHOUSE / MIB
    );
    let mut server = Server::start(tb, pristine.clone(), &[], &tb.logs.join("postgres-oltp-load.log"), user)?;
    pg_run(tb, "psql", &["-q", "-c", &format!("CREATE DATABASE {DB}")], &[], PG_CMD_TIMEOUT)?;
    let mut args = go_tpc_args(&sock, "prepare", warehouses);
    args.extend(["--no-check", "-T", "2"].map(String::from));
    let limit = Duration::from_secs(600 + 120 * warehouses as u64);
    run_go_tpc(&go, tb, &args, &[], limit, "prepare")?;
    server.stop()?;
    drop(server);
    // The measured runs are durable again.
    std::fs::write(&conf_path, conf).ctx(|| "write postgresql.conf".into())?;
    sys::run("sync", &[])?;
    let sched = std::fs::read_to_string(scheduler_file(&tb.loopdev)).unwrap_or_default();
    let (default_scheduler, schedulers_available) = parse_schedulers(&sched);
    let mut setup = OltpSetup {
        warehouses,
        database_bytes: du(&pristine),
        data_bytes: du(&pristine.join("base")),
        prepare_secs: t.elapsed().as_secs_f64(),
        default_scheduler,
        schedulers_available,
        cpus_online: sys::cpus_online(),
        skipped: Vec::new(),
    };
    for s in o.oltp_schedulers.iter().filter(|s| !setup.schedulers_available.contains(s)) {
        setup.skipped.push(format!("scheduler {s}: this kernel lacks it (it offers {sched:?})", sched = sched.trim()));
    }
    for c in o.oltp_cpus.iter().filter(|&&c| c == 0 || c > setup.cpus_online) {
        setup.skipped.push(format!("{c} CPUs: the machine has {}", setup.cpus_online));
    }
    for s in &setup.skipped {
        note!("paper: oltp: skipped {s}");
    }
    note!(
        "paper: oltp: {warehouses} warehouse(s): tables and indexes {:.0} MiB ({:.1}× the client's memory), cluster \
         with WAL {:.0} MiB, ready in {:.0} s",
        setup.data_bytes as f64 / MIB as f64,
        setup.data_bytes as f64 / o.memory_bytes as f64,
        setup.database_bytes as f64 / MIB as f64,
        setup.prepare_secs
    );
    Ok(setup)
}

/// The data once, then every configuration; a configuration that fails is recorded with its
/// error and the others still run. Configurations whose every point `o.oltp_resume` holds
/// are kept, not run again.
pub(super) fn run_experiment(
    tb: &mut Testbed,
    o: &PaperOptions,
    report: &mut PaperReport,
    progress: &mut dyn FnMut(&PaperReport),
    bar: &Progress,
) -> Result<()> {
    let cfgs = o.configs_for(Experiment::Oltp);
    let done = |setup: &OltpSetup, cfg: ConfigKind| -> Option<Vec<OltpRecord>> {
        plan(o, setup, cfg)
            .iter()
            .map(|p| o.oltp_resume.iter().find(|r| r.is(cfg, p) && r.error.is_none()).cloned())
            .collect()
    };
    let earlier = o.oltp_resume_setup.clone().filter(|s| s.warehouses == warehouses_for(o));
    let setup = match earlier.filter(|s| cfgs.iter().all(|&c| done(s, c).is_some())) {
        Some(s) => s,
        None => {
            bar.message("oltp: loading the data");
            match super::run::setup_or_note("oltp: FAILED to load the data", prepare(tb, o), &mut report.oltp_error)? {
                Some(s) => s,
                None => return Ok(()),
            }
        }
    };
    report.oltp_setup = Some(setup.clone());
    let go = go_tpc()?;
    for cfg in cfgs {
        if let Some(kept) = done(&setup, cfg) {
            note!("paper: [oltp {}] done in an earlier run, kept", cfg.name());
            report.oltp.extend(kept);
            progress(report);
            bar.inc(1);
            continue;
        }
        bar.message(format!("oltp {}", cfg.name()));
        match run_config(tb, o, &setup, cfg, &go, report, progress) {
            Ok(()) => {}
            Err(e) if sys::interrupted() => return Err(e),
            Err(e) => {
                note!("paper: oltp {}: FAILED: {e}", cfg.name());
                let p = Point { kind: PointKind::Connections, connections: 0, scheduler: None, cpus: None };
                report.oltp.push(OltpRecord { error: Some(e.to_string()), ..OltpRecord::at(cfg, &p) });
            }
        }
        progress(report);
        bar.inc(1);
    }
    Ok(())
}

/// Every point of one configuration on a fresh copy of the pristine cluster; each record
/// goes into `report` (and is saved) as it ends.
fn run_config(
    tb: &mut Testbed,
    o: &PaperOptions,
    setup: &OltpSetup,
    cfg: ConfigKind,
    go: &Path,
    report: &mut PaperReport,
    progress: &mut dyn FnMut(&PaperReport),
) -> Result<()> {
    let user = postgres_user()?;
    let data = super::pgbench::fresh_copy(tb, "oltp")?;
    let cached_at_start = cached_under(&data);
    let mem = tb.memory_cgroup(Some(o.memory_bytes))?;
    let cpu = tb.cpu_cgroup()?;
    let name = cpu.path().file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let cpuset = Cgroup::create("cpuset", &name)?;
    let mems = std::fs::read_to_string(Path::new(super::cgroup::ROOT).join("cpuset/cpuset.mems"))
        .ctx(|| "read the root cpuset's mems".into())?;
    cpuset.set("cpuset.mems", mems.trim())?;
    let all_cpus = cpu_list(setup.cpus_online);
    cpuset.set("cpuset.cpus", &all_cpus)?;
    let sched = SchedulerGuard::hold(&tb.loopdev)?;
    let mut lenders = match cfg.has_lenders() {
        true => Some(tb.start_lenders(o.lender_capacity_bytes, o.policy.as_deref())?),
        false => None,
    };
    let addrs: Vec<_> = lenders.as_ref().map(|l| l.addrs.clone()).unwrap_or_default();
    let cgroups = [&mem, &cpu, &cpuset, &tb.blkio];
    // go-tpc stands for the database's remote clients: its CPU is counted and confined with
    // the server's, its memory and I/O are not the server's.
    let tpc_cgroups = [&cpu, &cpuset];
    let log = tb.logs.join(format!("oltp-{}.mount.log", cfg.name()));
    let remote = lenders.as_ref().map(|l| &l.addrs[..]);
    let mut mount = MountDaemon::for_config(tb, o, cfg, remote, &[], &cgroups, &log)?;
    let probe = CpuProbe::of(&cpu, mount.as_ref(), lenders.as_ref());
    let pgdata = if mount.is_some() { tb.mnt.join("oltp").join("data") } else { data.clone() };
    let tb_ref: &Testbed = tb;
    let log = tb_ref.logs.join(format!("oltp-{}.postgres.log", cfg.name()));
    let mut server = Server::start(tb_ref, pgdata, &cgroups, &log, user)?;
    for p in plan(o, setup, cfg) {
        sys::check_interrupt()?;
        sched.set(p.scheduler.as_deref().unwrap_or(&setup.default_scheduler))?;
        let cpus = p.cpus.unwrap_or(setup.cpus_online);
        cpuset.set("cpuset.cpus", &cpu_list(cpus))?;
        let mut rec = OltpRecord::at(cfg, &p);
        rec.scheduler = p.scheduler.clone().unwrap_or_else(|| setup.default_scheduler.clone());
        rec.cpus = cpus;
        rec.cached_pages_at_start = cached_at_start;
        let d0 = tb_ref.disk_stat();
        let l0 = if addrs.is_empty() { LenderTotals::default() } else { lender_totals(&addrs)? };
        let c0 = probe.sample();
        let th0 = probe.daemon.map(thread_cpu_ms).unwrap_or_default();
        let ops0 = mount.as_mut().map(MountDaemon::fuse_ops).unwrap_or_default();
        let oom0 = oom_kills(&mem).unwrap_or(0);
        let mut args = go_tpc_args(&tb_ref.dir.join("sock"), "run", setup.warehouses);
        let secs = o.oltp_secs.to_string();
        args.extend(["-T".into(), p.connections.to_string(), "--time".into(), format!("{secs}s")]);
        args.extend(["--interval".into(), format!("{}s", o.oltp_secs + 60), "--ignore-error".into()]);
        let t = Instant::now();
        let tag = format!("{}-{}-{}-{}-{}", cfg.name(), p.connections, rec.scheduler, cpus, report.oltp.len());
        // go-tpc runs go in a bound of its own (--time); a lost connection can leave it waiting.
        let limit = Duration::from_secs(o.oltp_secs * 2 + 60);
        let res = run_go_tpc(go, tb_ref, &args, &tpc_cgroups, limit, &tag);
        rec.secs = t.elapsed().as_secs_f64();
        rec.cpu = probe.sample().since(&c0);
        let th1 = probe.daemon.map(thread_cpu_ms).unwrap_or_default();
        rec.daemon_threads_ms = thread_groups_since(&th0, &th1, rec.cpu.daemon_ms);
        let ops1 = mount.as_mut().map(MountDaemon::fuse_ops).unwrap_or_default();
        rec.fuse_ops = super::mount::ops_since(&ops1, &ops0);
        rec.disk = tb_ref.disk_stat().since(&d0);
        for w in rec.disk.warnings(&tag, rec.secs) {
            note!("{w}");
        }
        rec.lenders = if addrs.is_empty() { LenderTotals::default() } else { lender_totals(&addrs)?.since(&l0) };
        match res.map(|s| parse_run(&s).ok_or(s)) {
            Ok(Ok(x)) => {
                (rec.tpmc, rec.tpm_total, rec.new_orders, rec.errors) = (x.tpmc, x.tpm_total, x.new_orders, x.errors);
                (rec.new_order_ms_avg, rec.new_order_ms_p99) = (x.new_order_ms_avg, x.new_order_ms_p99);
            }
            Ok(Err(text)) => {
                let tail: String = text.chars().rev().take(600).collect::<Vec<_>>().into_iter().rev().collect();
                rec.error = Some(format!("go-tpc printed no tpmC: {tail}"))
            }
            Err(e) => {
                sys::check_interrupt()?;
                rec.error = Some(e.to_string());
            }
        }
        rec.oom_kills = oom_kills(&mem).unwrap_or(0).saturating_sub(oom0);
        if rec.oom_kills > 0 {
            let was = rec.error.take().map(|e| format!(" ({e})")).unwrap_or_default();
            let victim =
                super::mount::oom_victim(mount.as_mut().and_then(MountDaemon::ended), super::mount::PG_RESTARTED);
            rec.error = Some(format!(
                "{} OOM kill(s) in the client's memory cgroup of {} MiB, of {victim}; the point is void; give it \
                 more --memory{was}",
                rec.oom_kills,
                o.memory_bytes / MIB
            ));
        }
        note!(
            "paper: [oltp {} {:?} {} conn, {}, {} CPU(s)] tpmC {:.0}, {} errors, NewOrder p99 {:.1} ms, disk {} reads / {} \
             writes, lenders {} hits, CPU s: client {:.1} (daemon {:.1}){}",
            cfg.name(),
            p.kind,
            p.connections,
            rec.scheduler,
            cpus,
            rec.tpmc,
            rec.errors,
            rec.new_order_ms_p99,
            rec.disk.read_ios,
            rec.disk.write_ios,
            rec.lenders.hits,
            rec.cpu.client_ms / 1e3,
            rec.cpu.daemon_ms / 1e3,
            rec.error.as_deref().map(|e| format!(" — FAILED: {e}")).unwrap_or_default()
        );
        report.oltp.push(rec);
        progress(report);
    }
    cpuset.set("cpuset.cpus", &all_cpus)?;
    server.stop()?;
    drop(server);
    if let Some(m) = mount.as_mut() {
        m.stop();
    }
    drop(mount);
    if let Some(l) = lenders.as_mut() {
        l.stop();
    }
    drop(sched);
    Ok(())
}

/// The successful record of `cfg` at point kind `kind` with these values.
fn find<'a>(
    r: &'a PaperReport,
    cfg: ConfigKind,
    kind: PointKind,
    conn: u32,
    sched: Option<&str>,
    cpus: Option<u32>,
) -> Option<&'a OltpRecord> {
    r.oltp.iter().find(|x| {
        x.config == cfg
            && x.kind == kind
            && x.connections == conn
            && x.error.is_none()
            && sched.is_none_or(|s| s == x.scheduler)
            && cpus.is_none_or(|c| c == x.cpus)
    })
}

fn tpmc(
    r: &PaperReport,
    cfg: ConfigKind,
    kind: PointKind,
    conn: u32,
    sched: Option<&str>,
    cpus: Option<u32>,
) -> Option<f64> {
    find(r, cfg, kind, conn, sched, cpus).map(|x| x.tpmc).filter(|t| *t > 0.0)
}

/// Every planned point of every configuration ran, with tpmC > 0 and no failed transaction.
pub fn checks(r: &PaperReport) -> Vec<Verdict> {
    let o = &r.options;
    let mut v = Vec::new();
    if !o.experiments.contains(&Experiment::Oltp) {
        return v;
    }
    if let Some(e) = &r.oltp_error {
        v.push(Verdict { what: "oltp: the TPC-C data was loaded".into(), measured: e.clone(), ok: false });
    }
    let Some(setup) = &r.oltp_setup else { return v };
    for cfg in o.configs_for(Experiment::Oltp) {
        let want = plan(o, setup, cfg);
        let recs: Vec<&OltpRecord> = r.oltp.iter().filter(|x| x.config == cfg).collect();
        let failed = recs.iter().find_map(|x| x.error.clone());
        let ran = want.iter().filter(|p| recs.iter().any(|x| x.is(cfg, p) && x.error.is_none())).count();
        let zero = recs.iter().filter(|x| x.error.is_none() && x.tpmc <= 0.0).count();
        let errors: u64 = recs.iter().map(|x| x.errors).sum();
        let cold = recs.iter().all(|x| x.cached_pages_at_start == 0);
        v.push(Verdict {
            what: format!("oltp {}: every point ran from a cold start, tpmC > 0, no failed transaction", cfg.name()),
            measured: failed.unwrap_or_else(|| {
                format!(
                    "{ran} of {} points, {zero} with tpmC 0, {errors} failed transactions, cold: {cold}",
                    want.len()
                )
            }),
            ok: ran == want.len() && zero == 0 && errors == 0 && cold,
        });
    }
    v
}

/// The targets: CPU scaling 1 → 2 CPUs ≥ 1.8×; the mounts at ≥ 0.90× native tpmC
/// (raw disk) or ≥ 0.95× (throttled), as for fio at queue depth ≥ 16, at 16 connections and up.
pub fn targets(r: &PaperReport) -> Vec<Verdict> {
    let o = &r.options;
    let mut v = Vec::new();
    if !o.experiments.contains(&Experiment::Oltp) {
        return v;
    }
    let n = o.oltp_point_connections;
    for cfg in o.configs_for(Experiment::Oltp) {
        if let (Some(a), Some(b)) =
            (tpmc(r, cfg, PointKind::Cpus, n, None, Some(1)), tpmc(r, cfg, PointKind::Cpus, n, None, Some(2)))
        {
            v.push(Verdict {
                what: format!(
                    "oltp {} at {n} connections: tpmC with 2 CPUs >= 1.8× with 1 (the paper: 1.9×)",
                    cfg.name()
                ),
                measured: format!("{:.0} → {:.0}: {:.2}×", a, b, b / a),
                ok: b / a >= 1.8,
            });
        }
    }
    let want = if o.profile == super::DiskProfile::Raw { 0.90 } else { 0.95 };
    for cfg in o.configs_for(Experiment::Oltp).into_iter().filter(|c| c.through_mount()) {
        for &c in o.oltp_connections.iter().filter(|&&c| c >= 16) {
            let k = PointKind::Connections;
            if let (Some(x), Some(nat)) =
                (tpmc(r, cfg, k, c, None, None), tpmc(r, ConfigKind::Native, k, c, None, None))
            {
                v.push(Verdict {
                    what: format!("oltp {c} connections: {} >= {want:.2}× native tpmC", cfg.name()),
                    measured: format!("{:.0} / {:.0} = {:.3}×", x, nat, x / nat),
                    ok: x / nat >= want,
                });
            }
        }
    }
    v
}

fn cell(x: Option<f64>, digits: usize) -> String {
    x.map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// The tables: tpmC by connections with the ratios, by scheduler, by CPUs, and where the CPU
/// went per NewOrder.
pub fn render(s: &mut String, r: &PaperReport) {
    let o = &r.options;
    if !o.experiments.contains(&Experiment::Oltp) {
        return;
    }
    let _ = writeln!(s, "## oltp ({}): TPC-C-like tpmC (go-tpc, PostgreSQL 15)\n", Experiment::Oltp.table());
    if let Some(e) = &r.oltp_error {
        let _ = writeln!(s, "The data could not be loaded: {e}\n");
        return;
    }
    let Some(setup) = &r.oltp_setup else { return };
    let cfgs = o.configs_for(Experiment::Oltp);
    let _ = writeln!(
        s,
        "{} warehouse(s): tables and indexes {} ({} the client's {} MiB), the cluster with WAL {:.0} MiB on disk \
         after the load, loaded in {:.0} s. {} s per point; every configuration on a fresh copy from a cold start, \
         its points one after the other on one PostgreSQL (shared_buffers {SHARED_BUFFERS}). Loop device \
         scheduler: `{}` (of {}); {} CPU(s) online.\n",
        setup.warehouses,
        if setup.data_bytes > 0 { format!("{:.0} MiB", setup.data_bytes as f64 / MIB as f64) } else { "–".into() },
        if setup.data_bytes > 0 {
            format!("{:.1}×", setup.data_bytes as f64 / o.memory_bytes as f64)
        } else {
            "– ×".into()
        },
        o.memory_bytes / MIB,
        setup.database_bytes as f64 / MIB as f64,
        setup.prepare_secs,
        o.oltp_secs,
        setup.default_scheduler,
        setup.schedulers_available.join(", "),
        setup.cpus_online
    );
    for x in &setup.skipped {
        let _ = writeln!(s, "Skipped: {x}.\n");
    }
    let mut head = String::from("| connections |");
    let mut rule = String::from("|---:|");
    for c in &cfgs {
        let _ = write!(head, " {} |", c.name());
        rule.push_str("---:|");
    }
    let pairs: Vec<(ConfigKind, ConfigKind)> = [
        (ConfigKind::Passthrough, ConfigKind::Native),
        (ConfigKind::Farcache, ConfigKind::Native),
        (ConfigKind::Farcache, ConfigKind::Passthrough),
        (ConfigKind::PassthroughKernel, ConfigKind::Native),
    ]
    .into_iter()
    .filter(|(a, b)| cfgs.contains(a) && cfgs.contains(b))
    .collect();
    for (a, b) in &pairs {
        let _ = write!(head, " {}/{} |", a.name(), b.name());
        rule.push_str("---:|");
    }
    let _ = writeln!(s, "### tpmC by connections\n\n{head}\n{rule}");
    let k = PointKind::Connections;
    for &c in &o.oltp_connections {
        let mut row = format!("| {c} |");
        for &cfg in &cfgs {
            let _ = write!(row, " {} |", cell(tpmc(r, cfg, k, c, None, None), 0));
        }
        for &(a, b) in &pairs {
            let x = tpmc(r, a, k, c, None, None).zip(tpmc(r, b, k, c, None, None)).map(|(x, y)| x / y);
            let _ = write!(row, " {} |", cell(x, 2));
        }
        let _ = writeln!(s, "{row}");
    }
    let n = o.oltp_point_connections;
    let point_cfgs: Vec<ConfigKind> =
        cfgs.iter().copied().filter(|c| o.oltp_point_configs.is_empty() || o.oltp_point_configs.contains(c)).collect();
    let head: String = point_cfgs.iter().map(|c| format!(" {} |", c.name())).collect();
    let rule = "---:|".repeat(point_cfgs.len());
    if r.oltp.iter().any(|x| x.kind == PointKind::Scheduler) {
        let _ = writeln!(
            s,
            "\n### tpmC by the loop device's scheduler, {n} connections\n\n| scheduler |{head}\n|---|{rule}"
        );
        for sc in o.oltp_schedulers.iter().filter(|x| setup.schedulers_available.contains(x)) {
            let mut row = format!("| {sc} |");
            for &cfg in &point_cfgs {
                let _ = write!(row, " {} |", cell(tpmc(r, cfg, PointKind::Scheduler, n, Some(sc), None), 0));
            }
            let _ = writeln!(s, "{row}");
        }
    }
    if r.oltp.iter().any(|x| x.kind == PointKind::Cpus) {
        let _ =
            writeln!(s, "\n### tpmC by CPUs (cpuset of PostgreSQL, go-tpc and the mount daemon), {n} connections\n");
        let _ = writeln!(s, "| CPUs |{head}\n|---:|{rule}");
        let cpus: Vec<u32> = o.oltp_cpus.iter().copied().filter(|&c| c >= 1 && c <= setup.cpus_online).collect();
        for &c in &cpus {
            let mut row = format!("| {c} |");
            for &cfg in &point_cfgs {
                let _ = write!(row, " {} |", cell(tpmc(r, cfg, PointKind::Cpus, n, None, Some(c)), 0));
            }
            let _ = writeln!(s, "{row}");
        }
        if let (Some(&lo), Some(&hi)) = (cpus.first(), cpus.last()) {
            if hi > lo {
                let mut row = format!("| scaling {lo} → {hi} |");
                for &cfg in &point_cfgs {
                    let x = tpmc(r, cfg, PointKind::Cpus, n, None, Some(lo))
                        .zip(tpmc(r, cfg, PointKind::Cpus, n, None, Some(hi)))
                        .map(|(a, b)| b / a);
                    let _ = write!(row, " {}× |", cell(x, 2));
                }
                let _ = writeln!(s, "{row}");
            }
        }
    }
    let _ = writeln!(
        s,
        "\n### Every point: CPU per NewOrder and the disk\n\n| config | series | conn | scheduler | CPUs | tpmC | NewOrder \
         avg / p99 ms | errors | CPU ms per NewOrder: client (PostgreSQL, go-tpc, daemon) | daemon | disk reads | disk writes | lender hits |\n\
         |---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for x in &r.oltp {
        if let Some(e) = &x.error {
            let _ = writeln!(
                s,
                "| {} | {:?} | {} | {} | {} | FAILED: {} |",
                x.config.name(),
                x.kind,
                x.connections,
                x.scheduler,
                x.cpus,
                e.lines().next().unwrap_or("")
            );
            continue;
        }
        let per = |ms: f64| if x.new_orders > 0 { format!("{:.2}", ms / x.new_orders as f64) } else { "–".into() };
        let _ = writeln!(
            s,
            "| {} | {:?} | {} | {} | {} | {:.0} | {:.1} / {:.1} | {} | {} | {} | {} | {} | {} |",
            x.config.name(),
            x.kind,
            x.connections,
            x.scheduler,
            x.cpus,
            x.tpmc,
            x.new_order_ms_avg,
            x.new_order_ms_p99,
            x.errors,
            per(x.cpu.client_ms),
            per(x.cpu.daemon_ms),
            x.disk.read_ios,
            x.disk.write_ios,
            x.lenders.hits
        );
    }
    let _ = writeln!(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "2026/11/26 07:27:43 maxprocs: Leaving GOMAXPROCS=2: CPU quota undefined
Finished
[Summary] DELIVERY - Takes(s): 4.9, Count: 237, TPM: 2883.9, Sum(ms): 2697.2, Avg(ms): 11.4, 50th(ms): 9.4, 90th(ms): 17.8, 95th(ms): 29.4, 99th(ms): 46.1, 99.9th(ms): 54.5, Max(ms): 54.5
[Summary] NEW_ORDER - Takes(s): 5.0, Count: 2204, TPM: 26612.8, Sum(ms): 8335.9, Avg(ms): 3.8, 50th(ms): 3.7, 90th(ms): 6.3, 95th(ms): 6.8, 99th(ms): 10.0, 99.9th(ms): 14.7, Max(ms): 17.8
[Summary] NEW_ORDER_ERR - Takes(s): 5.0, Count: 3, TPM: 36.0, Sum(ms): 8.0, Avg(ms): 2.7, 50th(ms): 2.6, 90th(ms): 4.2, 95th(ms): 5.2, 99th(ms): 6.3, 99.9th(ms): 8.9, Max(ms): 8.9
[Summary] PAYMENT_ERR - Takes(s): 5.0, Count: 2, TPM: 24.0, Sum(ms): 8.0, Avg(ms): 2.7, 50th(ms): 2.6, 90th(ms): 4.2, 95th(ms): 5.2, 99th(ms): 6.3, 99.9th(ms): 8.9, Max(ms): 8.9
tpmC: 26612.4, tpmTotal: 58296.2, efficiency: 206939.5%
";

    #[test]
    fn reads_go_tpc_output() {
        let r = parse_run(OUT).unwrap();
        assert_eq!((r.tpmc, r.tpm_total, r.new_orders, r.errors), (26612.4, 58296.2, 2204, 5));
        assert_eq!((r.new_order_ms_avg, r.new_order_ms_p99), (3.8, 10.0));
        assert_eq!(parse_run("Finished\n[Summary] PAYMENT - Takes(s): 1.0, Count: 3"), None);
    }

    #[test]
    fn reads_the_scheduler_line() {
        let (cur, all) = parse_schedulers("[none] mq-deadline kyber bfq\n");
        assert_eq!(cur, "none");
        assert_eq!(all, ["none", "mq-deadline", "kyber", "bfq"]);
        assert_eq!(parse_schedulers("mq-deadline [bfq]").0, "bfq");
        assert_eq!((cpu_list(1), cpu_list(2), cpu_list(4)), ("0".into(), "0-1".into(), "0-3".into()));
    }

    #[test]
    fn plans_the_points_and_sizes_the_data() {
        let mut o = PaperOptions::full(PathBuf::from("/x"));
        o.experiments = vec![Experiment::Oltp];
        assert_eq!(o.oltp_connections, CONNECTIONS);
        // 3 × 512 MiB in warehouses of 115 MiB.
        assert_eq!(warehouses_for(&o), 14);
        let setup = OltpSetup {
            schedulers_available: vec!["none".into(), "mq-deadline".into(), "kyber".into()],
            cpus_online: 2,
            ..OltpSetup::default()
        };
        o.oltp_cpus = vec![1, 2, 4];
        let p = plan(&o, &setup, ConfigKind::Farcache);
        assert_eq!(p.iter().filter(|x| x.kind == PointKind::Connections).count(), 6);
        // bfq is not offered, 4 CPUs are not there.
        let s: Vec<_> = p.iter().filter_map(|x| x.scheduler.clone()).collect();
        assert_eq!(s, ["none", "mq-deadline", "kyber"]);
        assert_eq!(p.iter().filter_map(|x| x.cpus).collect::<Vec<_>>(), [1, 2]);
        assert!(p.iter().filter(|x| x.kind != PointKind::Connections).all(|x| x.connections == 16));
        o.oltp_point_configs = vec![ConfigKind::Farcache];
        assert_eq!(plan(&o, &setup, ConfigKind::Native).len(), 6);
        assert_eq!(plan(&o, &setup, ConfigKind::Farcache).len(), 11);
        // A record is the measurement of its own point only.
        let pt = &p[7];
        let rec = OltpRecord { scheduler: "mq-deadline".into(), cpus: 2, ..OltpRecord::at(ConfigKind::Farcache, pt) };
        assert!(
            rec.is(ConfigKind::Farcache, pt) && !rec.is(ConfigKind::Native, pt) && !rec.is(ConfigKind::Farcache, &p[8])
        );
        let args = go_tpc_args(Path::new("/run/x/sock"), "run", 7);
        for w in [["--targets", ":5432"], ["--conn-params", "host=/run/x/sock&sslmode=disable"], ["--warehouses", "7"]]
        {
            assert!(args.windows(2).any(|x| x == w), "{w:?} in {args:?}");
        }
        assert_eq!(&args[..2], ["tpcc", "run"]);
    }
}
