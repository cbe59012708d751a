//! `pgbench`: PostgreSQL 15 on each configuration, select-only and TPC-B-like at 1, 4 and 16
//! clients, on a database about twice the client's memory (sized to fit the lenders).
//!
//! The database is made once (`initdb`, `pgbench -i`) on the ext4 file system by the harness,
//! outside the client's cgroups (not throttled), and kept as a pristine copy. Each
//! configuration gets a fresh copy (TPC-B writes change it), then a cold start (ext4
//! remounted, new memory cgroup, new mount and lenders), then PostgreSQL started inside the
//! client's memory and blkio cgroups — postmaster, backends and the pgbench client all stay
//! in them, and the memory cgroup's removal kills whatever is left. PostgreSQL refuses to run
//! as root: every PostgreSQL program runs through `setpriv` as the `postgres` user, which
//! drops privileges after the process has joined its cgroups (as root).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cgroup::Cgroup;
use super::counters::{lender_totals, thread_cpu_ms, thread_groups_since, CpuProbe, CpuTime, LenderTotals};
use super::mount::{MountCounters, MountDaemon};
use super::testbed::{DiskStat, Testbed};
use super::{human, sys, ConfigKind, PaperOptions, MIB};
use crate::error::IoContext;
use crate::{BenchError, Result};

/// Where Debian's PostgreSQL 15 lives.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// About 15 MiB of tables and indexes per pgbench scale unit.
const BYTES_PER_SCALE: u64 = 15 * MIB;
/// PostgreSQL's own cache, small so that the OS cache (the cgroup's) is what matters.
pub(super) const SHARED_BUFFERS: &str = "32MB";
/// Bound on initdb, pg_ctl and `pgbench -i`.
pub(super) const PG_CMD_TIMEOUT: Duration = Duration::from_secs(900);

/// The two pgbench workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PgMode {
    SelectOnly,
    TpcB,
}

impl PgMode {
    pub fn name(self) -> &'static str {
        match self {
            PgMode::SelectOnly => "select-only",
            PgMode::TpcB => "tpc-b",
        }
    }
}

/// One pgbench run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PgRecord {
    pub config: ConfigKind,
    pub mode: PgMode,
    pub clients: u32,
    pub secs: f64,
    pub tps: f64,
    pub latency_ms_avg: f64,
    pub transactions: u64,
    pub failed: u64,
    pub disk: DiskStat,
    pub lenders: LenderTotals,
    /// The mount's counters after the run (cumulative since the mount started).
    pub mount: Option<MountCounters>,
    /// Pages of the database in the page cache when the configuration started (0: cold).
    #[serde(default)]
    pub cached_pages_at_start: u64,
    /// CPU time the run took, by who spent it.
    #[serde(default)]
    pub cpu: CpuTime,
    /// The mount daemon's CPU time in milliseconds by thread group (see
    /// [`super::counters::thread_groups_since`]): which of its threads a difference is in.
    #[serde(default)]
    pub daemon_threads_ms: std::collections::BTreeMap<String, f64>,
    /// FUSE requests the mount received during the run, by opcode (`fuse.ops`; empty without
    /// a mount): per transaction, which round trips a configuration adds.
    #[serde(default)]
    pub fuse_ops: std::collections::BTreeMap<String, u64>,
    /// The mount's routing state after the run (`routing` of `farcache stats --json`: the rule,
    /// its estimates and counters such as `adaptive.backoff_ends`, cumulative since the mount
    /// started, so a run's own counts are the difference from the run before; none without a
    /// mount): what sent the run's reads where they went.
    #[serde(default)]
    pub routing: Option<serde_json::Value>,
    pub error: Option<String>,
}

impl PgRecord {
    /// A configuration that could not run at all.
    pub fn failed(config: ConfigKind, error: String) -> PgRecord {
        PgRecord {
            config,
            mode: PgMode::SelectOnly,
            clients: 0,
            secs: 0.0,
            tps: 0.0,
            latency_ms_avg: 0.0,
            transactions: 0,
            failed: 0,
            disk: DiskStat::default(),
            lenders: LenderTotals::default(),
            mount: None,
            cached_pages_at_start: 0,
            cpu: CpuTime::default(),
            daemon_threads_ms: Default::default(),
            fuse_ops: Default::default(),
            routing: None,
            error: Some(error),
        }
    }
}

/// The database every configuration starts from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PgSetup {
    pub scale: u32,
    pub database_bytes: u64,
    pub init_secs: f64,
}

/// The pgbench scale for a database of about twice the client's memory, at most 90% of
/// what the lenders hold.
pub fn scale_for(o: &PaperOptions) -> u32 {
    let want = 2 * o.memory_bytes;
    let cap = o.lender_capacity_bytes * o.lenders as u64 * 9 / 10;
    (want.min(cap) / BYTES_PER_SCALE).max(1) as u32
}

#[derive(Clone, Copy)]
pub(super) struct PgUser {
    uid: u32,
    gid: u32,
}

pub(super) fn postgres_user() -> Result<PgUser> {
    for prog in ["initdb", "pg_ctl", "postgres", "pgbench"] {
        if !Path::new(PG_BIN).join(prog).exists() {
            return Err(BenchError::Setup(format!(
                "PostgreSQL 15 is missing ({PG_BIN}/{prog}): apt-get install -y postgresql-15 (scripts/deps.sh)"
            )));
        }
    }
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: getpwnam with a valid C string; the record is read at once, on the one thread
    // that runs the harness.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(BenchError::Setup("no `postgres` user (the postgresql-common package creates it)".into()));
    }
    // SAFETY: pw is non-null and points to getpwnam's static record.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok(PgUser { uid, gid })
}

pub(super) fn chown(p: &Path, u: PgUser) -> Result<()> {
    std::os::unix::fs::chown(p, Some(u.uid), Some(u.gid)).ctx(|| format!("chown {}", p.display()))
}

/// A PostgreSQL program as `postgres`, joined to `cgroups` first (as root, in pre_exec),
/// with a clean environment pointing at the cluster's socket.
pub(super) fn pg_cmd(tb: &Testbed, prog: &str, cgroups: &[&Cgroup]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"])
        .arg(Path::new(PG_BIN).join(prog))
        .env_clear()
        .env("PATH", format!("{PG_BIN}:/usr/bin:/bin"))
        .env("LC_ALL", "C")
        .env("PGHOST", tb.dir.join("sock"))
        .env("PGUSER", "postgres")
        .env("PGDATABASE", "postgres")
        .current_dir(&tb.dir);
    let procs: Vec<PathBuf> = cgroups.iter().map(|g| g.procs()).collect();
    let refs: Vec<&Path> = procs.iter().map(|p| p.as_path()).collect();
    sys::confine(&mut c, &refs);
    c
}

/// Run a PostgreSQL program to completion (a signal to the harness cuts it short); its output.
pub(super) fn pg_run(tb: &Testbed, prog: &str, args: &[&str], cgroups: &[&Cgroup], limit: Duration) -> Result<String> {
    pg_run_inner(tb, prog, args, cgroups, limit, true)
}

/// The same for teardown: runs to completion (bounded) even after a signal.
fn pg_run_teardown(tb: &Testbed, prog: &str, args: &[&str], limit: Duration) -> Result<String> {
    pg_run_inner(tb, prog, args, &[], limit, false)
}

fn pg_run_inner(
    tb: &Testbed,
    prog: &str,
    args: &[&str],
    cgroups: &[&Cgroup],
    limit: Duration,
    interruptible: bool,
) -> Result<String> {
    let mut c = pg_cmd(tb, prog, cgroups);
    c.args(args).stdin(std::process::Stdio::null());
    let out_path = tb.logs.join(format!("{prog}.out"));
    let err_path = tb.logs.join(format!("{prog}.err"));
    c.stdout(std::fs::File::create(&out_path).ctx(|| "create a log".into())?);
    c.stderr(std::fs::File::create(&err_path).ctx(|| "create a log".into())?);
    let mut child = c.spawn().ctx(|| format!("start {prog} (setpriv)"))?;
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().ctx(|| format!("wait for {prog}"))? {
            break st;
        }
        if (interruptible && sys::interrupted()) || Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            if interruptible {
                sys::check_interrupt()?;
            }
            return Err(BenchError::Setup(format!("{prog} {args:?} ran over {limit:?}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    if !status.success() {
        let err = std::fs::read_to_string(&err_path).unwrap_or_default();
        return Err(BenchError::Setup(format!("{prog} {args:?} failed ({status}): {}{}", out.trim(), err.trim())));
    }
    Ok(out + &std::fs::read_to_string(&err_path).unwrap_or_default())
}

/// A running PostgreSQL server; stopped (fast, then immediate) when dropped.
pub(super) struct Server<'a> {
    tb: &'a Testbed,
    data: PathBuf,
    running: bool,
}

impl<'a> Server<'a> {
    pub(super) fn start(
        tb: &'a Testbed,
        data: PathBuf,
        cgroups: &[&Cgroup],
        log: &Path,
        user: PgUser,
    ) -> Result<Server<'a>> {
        std::fs::File::create(log).ctx(|| format!("create {}", log.display()))?;
        chown(log, user)?;
        let (d, l) = (data.to_string_lossy().to_string(), log.to_string_lossy().to_string());
        pg_run(tb, "pg_ctl", &["start", "-w", "-t", "300", "-D", &d, "-l", &l], cgroups, PG_CMD_TIMEOUT)?;
        Ok(Server { tb, data, running: true })
    }

    pub(super) fn stop(&mut self) -> Result<()> {
        if !self.running {
            return Ok(());
        }
        self.running = false;
        let d = self.data.to_string_lossy().to_string();
        let limit = Duration::from_secs(150);
        // After a signal the run is being torn down and the cluster is a throwaway copy: no
        // need for a clean shutdown (which may wait on a crash recovery for minutes).
        let fast = if sys::interrupted() {
            Err(BenchError::Setup("interrupted".into()))
        } else {
            pg_run_teardown(self.tb, "pg_ctl", &["stop", "-w", "-t", "120", "-m", "fast", "-D", &d], limit)
        };
        if fast.is_err() {
            let args = ["stop", "-w", "-t", "30", "-m", "immediate", "-D", &d];
            let _ = pg_run_teardown(self.tb, "pg_ctl", &args, limit);
        }
        fast.map(|_| ())
    }
}

impl Drop for Server<'_> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Pages of every file under `p` in the page cache.
pub(super) fn cached_under(p: &Path) -> u64 {
    let mut n = 0;
    if let Ok(d) = std::fs::read_dir(p) {
        for e in d.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => n += cached_under(&e.path()),
                Ok(t) if t.is_file() => n += super::testbed::cached_pages(&e.path()).unwrap_or(0),
                _ => {}
            }
        }
    }
    n
}

pub(super) fn du(p: &Path) -> u64 {
    let mut n = 0;
    if let Ok(d) = std::fs::read_dir(p) {
        for e in d.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => n += du(&e.path()),
                Ok(t) if t.is_file() => n += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    n
}

/// Make ext4/DIR (and the testbed's socket directory) owned by `user`, and a fresh cluster in
/// ext4/DIR/pristine, which it returns. PostgreSQL's configuration is the
/// caller's.
pub(super) fn init_pristine(tb: &Testbed, dir: &str, user: PgUser) -> Result<PathBuf> {
    let base = tb.ext4.join(dir);
    let sock = tb.dir.join("sock");
    for d in [&base, &sock] {
        std::fs::create_dir_all(d).ctx(|| format!("create {}", d.display()))?;
        chown(d, user)?;
    }
    let pristine = base.join("pristine");
    let p = pristine.to_string_lossy().to_string();
    pg_run(
        tb,
        "initdb",
        &["-D", &p, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"],
        &[],
        PG_CMD_TIMEOUT,
    )?;
    Ok(pristine)
}

/// ext4/DIR/data made afresh as a copy of ext4/DIR/pristine ([`init_pristine`]'s), and the
/// disk remounted so that no page of it is cached: the data directory's path.
pub(super) fn fresh_copy(tb: &mut Testbed, dir: &str) -> Result<PathBuf> {
    let base = tb.ext4.join(dir);
    let data = base.join("data");
    if data.exists() {
        std::fs::remove_dir_all(&data).ctx(|| format!("remove {}", data.display()))?;
    }
    let (src, dst) = (base.join("pristine").to_string_lossy().to_string(), data.to_string_lossy().to_string());
    sys::run_with_timeout("cp", &["-a", &src, &dst], PG_CMD_TIMEOUT)?;
    tb.remount()?;
    Ok(data)
}

/// Make the pristine database under ext4/pg/pristine.
pub fn prepare(tb: &Testbed, o: &PaperOptions) -> Result<PgSetup> {
    let user = postgres_user()?;
    let t = Instant::now();
    let scale = scale_for(o);
    let pristine = init_pristine(tb, "pg", user)?;
    let sock = tb.dir.join("sock");
    let conf = format!(
        "\n# farcache bench paper\nlisten_addresses = ''\nunix_socket_directories = '{}'\nshared_buffers = {SHARED_BUFFERS}\n\
         max_connections = 40\n",
        sock.display()
    );
    std::fs::OpenOptions::new()
        .append(true)
        .open(pristine.join("postgresql.conf"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, conf.as_bytes()))
        .ctx(|| "write postgresql.conf".into())?;
    note!("paper: pgbench: loading scale {scale} (about {})", human(scale as u64 * BYTES_PER_SCALE));
    let mut server = Server::start(tb, pristine.clone(), &[], &tb.logs.join("postgres-init.log"), user)?;
    pg_run(tb, "pgbench", &["-i", "-q", "-s", &scale.to_string()], &[], PG_CMD_TIMEOUT)?;
    server.stop()?;
    sys::run("sync", &[])?;
    let setup = PgSetup { scale, database_bytes: du(&pristine), init_secs: t.elapsed().as_secs_f64() };
    note!(
        "paper: pgbench: database of {:.0} MiB ready in {:.0} s",
        setup.database_bytes as f64 / MIB as f64,
        setup.init_secs
    );
    Ok(setup)
}

/// What pgbench printed: (tps, average latency ms, transactions, failed).
fn parse_pgbench(out: &str) -> Option<(f64, f64, u64, u64)> {
    let field = |prefix: &str| out.lines().find_map(|l| l.trim().strip_prefix(prefix)).map(|x| x.trim().to_string());
    let first = |s: String| s.split_whitespace().next().map(str::to_string);
    let tps: f64 = first(field("tps =")?)?.parse().ok()?;
    let lat: f64 = first(field("latency average =")?)?.parse().ok()?;
    let tx: u64 = first(field("number of transactions actually processed:")?)?.split('/').next()?.parse().ok()?;
    let failed: u64 = field("number of failed transactions:").and_then(first).and_then(|x| x.parse().ok()).unwrap_or(0);
    Some((tps, lat, tx, failed))
}

/// Every pgbench run of one configuration, on a fresh copy of the pristine database.
pub fn run_config(tb: &mut Testbed, o: &PaperOptions, cfg: ConfigKind) -> Result<Vec<PgRecord>> {
    let user = postgres_user()?;
    let data = fresh_copy(tb, "pg")?;
    let cached_at_start = cached_under(&data);
    let limit = (cfg != ConfigKind::Ideal).then_some(o.memory_bytes);
    let mem = tb.memory_cgroup(limit)?;
    let cpu = tb.cpu_cgroup()?;
    let mut lenders = match cfg.has_lenders() {
        true => Some(tb.start_lenders(o.lender_capacity_bytes, o.policy.as_deref())?),
        false => None,
    };
    let addrs: Vec<_> = lenders.as_ref().map(|l| l.addrs.clone()).unwrap_or_default();
    // tier-dram / tier-ssd: TPC-B with the write-back tier (issue 12).
    let tier = super::writeback::TierFile::make(tb, cfg, o.tier_bytes)?;
    let log = tb.logs.join(format!("pgbench-{}.mount.log", cfg.name()));
    let extra = tier.as_ref().map(|t| t.mount_args(o)).unwrap_or_default();
    let remote = lenders.as_ref().map(|l| &l.addrs[..]);
    let mut mount = MountDaemon::for_config(tb, o, cfg, remote, &extra, &[&mem, &cpu, &tb.blkio], &log)?;
    let probe = CpuProbe::of(&cpu, mount.as_ref(), lenders.as_ref());
    let base = if mount.is_some() { tb.mnt.join("pg").join("data") } else { data.clone() };
    let log = tb.logs.join(format!("pgbench-{}.postgres.log", cfg.name()));
    let tb_ref: &Testbed = tb;
    let mut server = Server::start(tb_ref, base, &[&mem, &cpu, &tb_ref.blkio], &log, user)?;
    let mut out = Vec::new();
    for mode in [PgMode::SelectOnly, PgMode::TpcB] {
        for &clients in &o.pgbench_clients {
            sys::check_interrupt()?;
            let d0 = tb_ref.disk_stat();
            let l0 = if addrs.is_empty() { LenderTotals::default() } else { lender_totals(&addrs)? };
            let c0 = probe.sample();
            let t0 = probe.daemon.map(thread_cpu_ms).unwrap_or_default();
            let ops0 = mount.as_mut().map(MountDaemon::fuse_ops).unwrap_or_default();
            let secs = o.pgbench_secs.to_string();
            let (c, j) = (clients.to_string(), clients.min(2).to_string());
            let mut args = vec!["-n", "-c", &c, "-j", &j, "-T", &secs];
            if mode == PgMode::SelectOnly {
                args.push("-S");
            }
            let t = Instant::now();
            let limit = Duration::from_secs(o.pgbench_secs * 3 + 120);
            let res = pg_run(tb_ref, "pgbench", &args, &[&mem, &cpu, &tb_ref.blkio], limit);
            let cpu_used = probe.sample().since(&c0);
            let t1 = probe.daemon.map(thread_cpu_ms).unwrap_or_default();
            let l1 = if addrs.is_empty() { LenderTotals::default() } else { lender_totals(&addrs)? };
            // One reading after the run: the counters and the requests.
            let after = mount.as_mut().and_then(|m| m.stats_now());
            let ops1 = after.as_ref().map(|(_, v)| super::mount::fuse_ops_of(v)).unwrap_or_default();
            let routing = after.as_ref().and_then(|(_, v)| v.get("routing").cloned());
            let mut rec = PgRecord {
                config: cfg,
                mode,
                clients,
                secs: t.elapsed().as_secs_f64(),
                tps: 0.0,
                latency_ms_avg: 0.0,
                transactions: 0,
                failed: 0,
                disk: tb_ref.disk_stat().since(&d0),
                lenders: l1.since(&l0),
                mount: after.map(|(c, _)| c),
                cached_pages_at_start: cached_at_start,
                cpu: cpu_used,
                daemon_threads_ms: thread_groups_since(&t0, &t1, cpu_used.daemon_ms),
                fuse_ops: super::mount::ops_since(&ops1, &ops0),
                routing,
                error: None,
            };
            match res.map(|s| parse_pgbench(&s).ok_or(s)) {
                Ok(Ok((tps, lat, tx, failed))) => {
                    (rec.tps, rec.latency_ms_avg, rec.transactions, rec.failed) = (tps, lat, tx, failed)
                }
                Ok(Err(text)) => rec.error = Some(format!("unreadable pgbench output: {text}")),
                Err(e) => {
                    sys::check_interrupt()?;
                    rec.error = Some(e.to_string());
                }
            }
            note!(
                "paper: [pgbench {} {} {clients} clients] {:.0} tps, {:.2} ms, disk {} reads / {} writes, lenders {} hits, \
                 CPU s: client {:.1} (daemon {:.1}), lenders {:.1}, machine {:.1}{}",
                cfg.name(),
                mode.name(),
                rec.tps,
                rec.latency_ms_avg,
                rec.disk.read_ios,
                rec.disk.write_ios,
                rec.lenders.hits,
                rec.cpu.client_ms / 1e3,
                rec.cpu.daemon_ms / 1e3,
                rec.cpu.lenders_ms / 1e3,
                rec.cpu.machine_ms / 1e3,
                rec.error.as_deref().map(|e| format!(" — FAILED: {e}")).unwrap_or_default()
            );
            let what = format!("pgbench {} {} {clients} clients", cfg.name(), mode.name());
            for w in rec.disk.warnings(&what, rec.secs) {
                note!("{w}");
            }
            out.push(rec);
        }
    }
    server.stop()?;
    drop(server);
    if let Some(m) = mount.as_mut() {
        let at_exit = m.stop();
        if let (Some(last), Some(x)) = (out.last_mut(), at_exit) {
            if last.mount.is_none() {
                last.mount = Some(x);
            }
        }
    }
    drop(mount);
    if let Some(l) = lenders.as_mut() {
        l.stop();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_pgbench_output() {
        let out = "transaction type: <builtin: select only>\nscaling factor: 10\nnumber of clients: 4\n\
            number of transactions actually processed: 12345\nnumber of failed transactions: 0 (0.000%)\n\
            latency average = 0.324 ms\ninitial connection time = 5.1 ms\ntps = 12340.5 (without initial connection time)\n";
        assert_eq!(super::parse_pgbench(out), Some((12340.5, 0.324, 12345, 0)));
        assert_eq!(super::parse_pgbench("nothing"), None);
    }
}
