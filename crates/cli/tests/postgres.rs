//! PostgreSQL 15 on a real `farcache mount` in front of a real lender process: the workload
//! farcache is for, end to end, with checks that would see a stale or foreign block.
//!
//! Run 1 (lender L, mount M1): `initdb --data-checksums` on the mount, `pgbench -i`, a TPC-B
//! run, then the data checks — row counts, one history row per committed transaction, the
//! TPC-B invariant sum(abalance) = sum(bbalance) = sum(tbalance) = sum(delta), computed once
//! by sequential scans and once by index lookups in random order (small random reads, the
//! ones the mount sends to the lender, after the files' pages were dropped from the kernel
//! page cache), `amcheck` on every B-tree index and `verify_heapam` on the pgbench tables.
//! The lender must have served reads (its STATS `hits`), so the test cannot pass with caching
//! broken. PostgreSQL stops cleanly and `pg_checksums --check` reads every page through the
//! mount.
//!
//! Between the runs PostgreSQL runs directly on the backing directory and changes it, while
//! the lender still holds the blocks that run 1 cached. Run 2 (same lender, mount M2) must
//! read none of them: the data checks again (random lookups and amcheck included), a
//! select-only pgbench during which the lender is killed with SIGKILL (zero failed
//! transactions), the counts and the invariant once more, `pg_checksums`.
//!
//! A second test runs TPC-B on a supervised mount (`--supervise`) while the daemon is
//! SIGKILLed 10 times and upgraded in place 10 times: zero failed transactions, a clean server
//! log, the invariant, amcheck and pg_checksums afterwards (issue 15).
//!
//! PostgreSQL refuses to run as root: its programs run as the `postgres` user, in a test tree
//! under the temporary directory that this user can reach. The binaries come from the Debian
//! package `postgresql-15`, which `scripts/deps.sh` (run by `make test`) installs.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use farcache_testkit::{
    require_root, run_with_timeout, wait_until, MountProcess, ServerProcess, TierFile, LENDERS_FIRST,
};

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// pgbench scale: 100,000 accounts per unit, about 15 MiB of table and index each; with
/// `shared_buffers` at 16 MiB most reads fall out of PostgreSQL's own cache.
const SCALE: u64 = 5;
const ACCOUNTS: u64 = SCALE * 100_000;
/// Bound on any one PostgreSQL command (initdb, pg_ctl, psql, pgbench, pg_checksums).
const CMD_TIMEOUT: Duration = Duration::from_secs(60);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn pg_bin(prog: &str) -> PathBuf {
    Path::new(PG_BIN).join(prog)
}

/// The `postgres` OS user that runs every PostgreSQL program.
#[derive(Clone, Copy)]
struct PgUser {
    uid: u32,
    gid: u32,
}

/// Fail — never skip — when PostgreSQL 15 is not installed: a machine without it cannot
/// pass this test.
fn require_postgres() -> PgUser {
    let hint = "run scripts/deps.sh as root (`make test` does): it installs the Debian package postgresql-15";
    for prog in ["initdb", "pg_ctl", "postgres", "pgbench", "pg_checksums", "psql"] {
        assert!(pg_bin(prog).exists(), "PostgreSQL 15 is missing ({} not found): {hint}", pg_bin(prog).display());
    }
    let amcheck = Path::new("/usr/share/postgresql/15/extension/amcheck.control");
    assert!(amcheck.exists(), "the amcheck extension is missing ({}): {hint}", amcheck.display());
    let name = std::ffi::CString::new("postgres").unwrap();
    // SAFETY: getpwnam with a valid C string; the result is read at once, before any other
    // call that could overwrite its static buffer (the test's other threads do not call it).
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(!pw.is_null(), "no `postgres` user (the postgresql-common package creates it): {hint}");
    // SAFETY: pw is non-null and points to getpwnam's static passwd record.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    assert_ne!(uid, 0, "the `postgres` user must not be root");
    PgUser { uid, gid }
}

/// A directory tree the `postgres` user can reach: a fresh directory under the temporary
/// directory, every ancestor of which must be traversable by others. Removed on drop (after
/// the guards declared later, the mount and PostgreSQL, are gone).
fn test_tree(user: PgUser) -> tempfile::TempDir {
    let root = tempfile::Builder::new().prefix("farcache-pg-").tempdir().unwrap();
    for dir in root.path().ancestors().skip(1) {
        let mode = fs::metadata(dir).unwrap().permissions().mode();
        assert!(
            mode & 0o001 != 0,
            "{} (mode {mode:o}) is not traversable by the postgres user; point TMPDIR elsewhere",
            dir.display()
        );
    }
    fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for sub in ["backing", "mnt", "sock", "logs"] {
        let p = root.path().join(sub);
        fs::create_dir(&p).unwrap();
        std::os::unix::fs::chown(&p, Some(user.uid), Some(user.gid)).unwrap();
    }
    root
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The last `max` bytes of a file, for failure messages.
fn tail(path: &Path, max: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let start = s.len().saturating_sub(max);
    let start = (start..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
    s[start..].to_string()
}

/// One PostgreSQL cluster (a data directory), its programs run as `postgres`. A drop guard:
/// a running server is stopped (fast, then immediate, then SIGKILL) also when the test fails,
/// and its log is printed then. Declared after the mount it runs on, so it drops first.
struct Pg {
    data: PathBuf,
    root: PathBuf,
    sock: PathBuf,
    port: u16,
    log: PathBuf,
    user: PgUser,
    /// The postmaster's pid while it runs (from postmaster.pid), for the last resort.
    postmaster: Option<i32>,
}

impl Pg {
    fn new(data: PathBuf, root: &Path, port: u16, log_name: &str, user: PgUser) -> Pg {
        Pg {
            data,
            root: root.to_path_buf(),
            sock: root.join("sock"),
            port,
            log: root.join("logs").join(log_name),
            user,
            postmaster: None,
        }
    }

    /// A PostgreSQL program as the postgres user, with a clean environment that points the
    /// client programs at this cluster's socket.
    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(pg_bin(prog));
        c.env_clear()
            .env("PATH", format!("{PG_BIN}:/usr/bin:/bin"))
            .env("HOME", &self.root)
            .env("LC_ALL", "C")
            .env("PGHOST", &self.sock)
            .env("PGPORT", self.port.to_string())
            .env("PGUSER", "postgres")
            .env("PGDATABASE", "postgres")
            .current_dir(&self.root)
            .uid(self.user.uid)
            .gid(self.user.gid);
        c
    }

    /// Run `prog ARGS` to completion within [`CMD_TIMEOUT`]; panics unless it succeeds.
    fn run(&self, prog: &str, args: &[&str]) -> Output {
        let out = self.run_unchecked(prog, args);
        assert!(out.status.success(), "{prog} {args:?} failed: {}", text(&out));
        out
    }

    fn run_unchecked(&self, prog: &str, args: &[&str]) -> Output {
        let mut c = self.cmd(prog);
        c.args(args);
        run_with_timeout(c, CMD_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Run SQL statements in one session (one `-c` each); the last one's rows, `|`-separated.
    fn psql(&self, stmts: &[&str]) -> String {
        let mut args = vec!["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"];
        for s in stmts {
            args.extend(["-c", s]);
        }
        String::from_utf8(self.run("psql", &args).stdout).unwrap().trim().to_string()
    }

    fn initdb(&self) {
        let data = self.data.to_str().unwrap();
        self.run(
            "initdb",
            &["--data-checksums", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"],
        );
        // Unix socket only (no TCP port to collide with), in the test tree; fsync stays on
        // (the default); shared_buffers small so that PostgreSQL reads through the mount.
        let conf = format!(
            "\n# farcache postgres test\nlisten_addresses = ''\nport = {}\nunix_socket_directories = '{}'\n\
             shared_buffers = 16MB\nfsync = on\nfull_page_writes = on\nmax_connections = 20\n",
            self.port,
            self.sock.display()
        );
        let mut f = fs::OpenOptions::new().append(true).open(self.data.join("postgresql.conf")).unwrap();
        std::io::Write::write_all(&mut f, conf.as_bytes()).unwrap();
    }

    fn start(&mut self) {
        let (data, log) = (self.data.to_str().unwrap(), self.log.to_str().unwrap());
        let out = self.run_unchecked("pg_ctl", &["start", "-w", "-t", "50", "-D", data, "-l", log]);
        let pid = fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()));
        self.postmaster = pid;
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}\n--- server log ---\n{}",
            text(&out),
            tail(&self.log, 16 << 10)
        );
    }

    /// Fail if the server logged anything worse than a notice: a read error, a checksum
    /// failure or an invalid page shows up here even when no query failed.
    fn assert_clean_log(&self) {
        let log = tail(&self.log, 1 << 20);
        let bad: Vec<&str> =
            log.lines().filter(|l| ["WARNING:", "ERROR:", "FATAL:", "PANIC:"].iter().any(|w| l.contains(w))).collect();
        assert!(bad.is_empty(), "PostgreSQL logged problems ({}):\n{}", self.log.display(), bad.join("\n"));
    }

    /// A clean stop (`-m fast`: a shutdown checkpoint, so pg_checksums accepts the cluster).
    fn stop(&mut self) {
        let data = self.data.to_str().unwrap().to_string();
        let out = self.run_unchecked("pg_ctl", &["stop", "-w", "-t", "50", "-m", "fast", "-D", &data]);
        assert!(
            out.status.success(),
            "pg_ctl stop failed: {}\n--- server log ---\n{}",
            text(&out),
            tail(&self.log, 16 << 10)
        );
        self.postmaster = None;
        self.assert_clean_log();
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        if let Some(pid) = self.postmaster.take() {
            let data = self.data.to_str().unwrap().to_string();
            let stopped = ["fast", "immediate"].iter().any(|mode| {
                let mut c = self.cmd("pg_ctl");
                c.args(["stop", "-w", "-t", "15", "-m", mode, "-D", &data]);
                run_with_timeout(c, Duration::from_secs(20)).is_ok_and(|o| o.status.success())
            });
            if !stopped {
                // SAFETY: kill(2) on the postmaster this guard started; nothing else ran it.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        if std::thread::panicking() {
            eprintln!("--- PostgreSQL log ({}) ---\n{}", self.log.display(), tail(&self.log, 32 << 10));
        }
    }
}

/// What one pgbench run reported.
struct Bench {
    tps: f64,
    processed: u64,
}

/// Run pgbench with `args`; panics unless it exits 0 with zero failed transactions.
fn pgbench(pg: &Pg, args: &[&str]) -> Bench {
    let out = pg.run_unchecked("pgbench", args);
    parse_pgbench(&out, args)
}

fn parse_pgbench(out: &Output, args: &[&str]) -> Bench {
    let all = text(out);
    assert!(out.status.success(), "pgbench {args:?} failed: {all}");
    assert!(!all.contains("aborted"), "pgbench {args:?}: a client aborted: {all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let field = |prefix: &str| -> String {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in pgbench output: {all}"))
            .trim()
            .to_string()
    };
    let failed: u64 = field("number of failed transactions:").split(' ').next().unwrap().parse().unwrap();
    assert_eq!(failed, 0, "pgbench {args:?}: failed transactions: {all}");
    let processed: u64 =
        field("number of transactions actually processed:").split(' ').next().unwrap().parse().unwrap();
    let tps: f64 = field("tps =").split(' ').next().unwrap().parse().unwrap();
    assert!(processed > 0, "pgbench {args:?} processed nothing: {all}");
    Bench { tps, processed }
}

/// Drop the kernel's cached pages of every file under `dir` (through the mount), so that
/// PostgreSQL's next reads of them reach the FUSE daemon. Files that vanish meanwhile (the
/// server may be running) are skipped. Returns how many files were dropped.
fn drop_page_cache(dir: &Path) -> usize {
    let mut n = 0;
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => n += drop_page_cache(&p),
            Ok(t) if t.is_file() => {
                if let Ok(f) = File::open(&p) {
                    // SAFETY: fadvise on a descriptor we own; it only drops clean cached pages.
                    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                    assert_eq!(rc, 0, "posix_fadvise({}): {}", p.display(), std::io::Error::from_raw_os_error(rc));
                    n += 1;
                }
            }
            _ => {}
        }
    }
    n
}

/// The lender's STATS `hits` (blocks it served), via `farcache stats --json`.
fn lender_hits(addr: &str) -> u64 {
    let mut c = Command::new(bin());
    c.args(["stats", "--server", addr, "--json"]);
    let out = run_with_timeout(c, Duration::from_secs(20)).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "farcache stats failed: {}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["hits"].as_u64().unwrap_or_else(|| panic!("no hits in {v}"))
}

fn nums(row: &str) -> Vec<i64> {
    row.split('|').map(|x| x.trim().parse().unwrap_or_else(|e| panic!("{x:?} in {row:?}: {e}"))).collect()
}

/// The data checks: row counts for the scale, one history row per committed transaction,
/// and the TPC-B invariant by sequential scans. Returns sum(abalance).
fn check_data(pg: &Pg, history_rows: u64) -> i64 {
    let counts =
        nums(&pg.psql(&["SELECT (SELECT count(*) FROM pgbench_accounts), (SELECT count(*) FROM pgbench_branches), \
         (SELECT count(*) FROM pgbench_tellers), (SELECT count(*) FROM pgbench_history)"]));
    assert_eq!(counts, [ACCOUNTS as i64, SCALE as i64, 10 * SCALE as i64, history_rows as i64], "row counts");
    let seq = nums(&pg.psql(&[
        "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches), \
         (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history)",
    ]));
    assert!(seq.iter().all(|&s| s == seq[3]), "TPC-B invariant broken (accounts, branches, tellers, history): {seq:?}");
    seq[0]
}

/// Every account read again by index lookups in a random order, after the pages of the data
/// directory `pgdata` (seen through the mount) were dropped from the kernel page cache: small
/// random reads, the ones the mount serves from the lender. Their sum must be `abalance_sum`,
/// the sequential scan's.
fn check_random_reads(pg: &Pg, pgdata: &Path, abalance_sum: i64) {
    assert!(drop_page_cache(pgdata) > 100, "no files under {}", pgdata.display());
    // A nested loop over a shuffled list of ids, one index scan each: the planner may not
    // turn it into a scan or a sorted batch.
    let random = nums(&pg.psql(&[
        "SET enable_seqscan = off",
        "SET enable_bitmapscan = off",
        "SET enable_hashjoin = off",
        "SET enable_mergejoin = off",
        RANDOM_LOOKUPS,
    ]));
    assert_eq!(random, [ACCOUNTS as i64, abalance_sum], "accounts read by random index lookups differ from the scan");
}

/// Every account by its primary key, in a pseudo-random order (see [`check_random_reads`]).
const RANDOM_LOOKUPS: &str = "SELECT count(*), coalesce(sum(a.abalance), 0) \
     FROM (SELECT g FROM generate_series(1, (SELECT count(*) FROM pgbench_accounts)::int) g \
           ORDER BY hashint4(g) OFFSET 0) s \
     CROSS JOIN LATERAL (SELECT abalance FROM pgbench_accounts WHERE aid = s.g) a";

/// amcheck on every B-tree index of the database (heapallindexed: every heap tuple must be
/// found in its index) and verify_heapam on the pgbench tables.
fn check_amcheck(pg: &Pg) {
    let r = nums(&pg.psql(&[
        "CREATE EXTENSION IF NOT EXISTS amcheck",
        "SELECT count(*), count(*) FILTER (WHERE c.relname LIKE 'pgbench%') \
         FROM (SELECT c.oid, c.relname, bt_index_check(c.oid, true) FROM pg_index i \
               JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam \
               WHERE am.amname = 'btree' AND i.indisvalid AND i.indisready AND c.relpersistence <> 't') c",
    ]));
    assert!(r[0] > 100 && r[1] == 3, "amcheck checked {} indexes, {} of pgbench (want 3)", r[0], r[1]);
    let bad = pg.psql(&["SELECT c.relname, v.blkno, v.offnum, v.msg FROM pg_class c, verify_heapam(c.oid) v \
         WHERE c.relname LIKE 'pgbench%' AND c.relkind = 'r'"]);
    assert!(bad.is_empty(), "verify_heapam found corruption:\n{bad}");
}

/// `pg_checksums --check` on a stopped cluster: every page of every relation is read and its
/// checksum verified. Returns the number of blocks scanned.
fn check_checksums(pg: &Pg) -> u64 {
    if let Some(parent) = pg.data.parent() {
        drop_page_cache(parent);
    }
    let out = pg.run("pg_checksums", &["--check", "-D", pg.data.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |prefix: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} in pg_checksums output: {}", text(&out)))
    };
    assert_eq!(field("Bad checksums:"), 0, "{}", text(&out));
    let blocks = field("Blocks scanned:");
    // pgbench_accounts alone is about 1,640 pages per scale unit, its index 275.
    assert!(blocks > SCALE * 1_900, "pg_checksums scanned only {blocks} blocks: {}", text(&out));
    blocks
}

/// The mount daemon's own counters line, logged when it exits.
fn remote_tier_line(log: &str) -> String {
    log.lines()
        .find(|l| l.contains("remote tier:"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no counters in {log}"))
}

#[test]
fn postgres_on_the_mount_keeps_its_data_intact() {
    require_root("the PostgreSQL test (it mounts FUSE and runs PostgreSQL as the postgres user)");
    let user = require_postgres();
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:6.1}s] {what}", t0.elapsed().as_secs_f64());

    let tree = test_tree(user);
    let root = tree.path();
    let (backing, mnt) = (root.join("backing"), root.join("mnt"));
    let port = free_port();
    let mut srv = ServerProcess::start(bin(), &["--capacity", "256MiB"], None);
    let addr = srv.addr().to_string();
    let mut history = 0u64;

    // Run 1: create, load, run TPC-B, check, stop, checksums. The kernel's readahead kept
    // to a page: once the random lookups have cached some pages, the kernel takes the next
    // miss beside them for a stream and reads up to its window around it (1 MiB by
    // default), and the threshold rule sends reads that large to the disk without filling
    // the lenders — measured: the two checks reached the daemon as 998 reads of 157 MB, and
    // the lenders served 119–376 blocks in the second (the failures of sessions 25–28).
    // Here the lookups must reach the mount as what they are: 8 KiB random reads.
    let one_page = root.join("one-page-readahead.toml");
    fs::write(&one_page, "[mount]\nread_ahead = \"4KiB\"\n").unwrap();
    {
        let m1 = MountProcess::start(
            bin(),
            &backing,
            &mnt,
            &["--server", &addr, LENDERS_FIRST[0], LENDERS_FIRST[1], "--config", one_page.to_str().unwrap()],
            &root.join("mount1.log"),
        );
        let pgdata = mnt.join("pgdata");
        let mut pg = Pg::new(pgdata.clone(), root, port, "pg-run1.log", user);
        pg.initdb();
        assert_eq!(fs::metadata(backing.join("pgdata/PG_VERSION")).unwrap().uid(), user.uid, "owner on the disk");
        phase("initdb done");
        pg.start();
        pg.run("pgbench", &["-i", "-q", "-s", &SCALE.to_string()]);
        phase("pgbench -i done");
        // -n on every run: no VACUUM and, above all, no TRUNCATE of pgbench_history before
        // it, so the history keeps every transaction since the load and the invariant holds.
        let tpcb = pgbench(&pg, &["-n", "-T", "10", "-c", "4", "-j", "2"]);
        history += tpcb.processed;
        phase(&format!("TPC-B: {:.0} tps, {} transactions", tpcb.tps, tpcb.processed));

        let sum = check_data(&pg, history);
        check_random_reads(&pg, &pgdata, sum);
        check_amcheck(&pg);
        phase("data checks and amcheck done");
        // The lender now holds what the random lookups read; read it all again from there.
        let before = lender_hits(&addr);
        check_random_reads(&pg, &pgdata, sum);
        let hits = lender_hits(&addr);
        phase(&format!("lender hits: {before} before the second check, {hits} after"));
        assert!(hits > before + 500, "the lender served almost nothing: {before} -> {hits} hits");

        pg.stop();
        let blocks = check_checksums(&pg);
        phase(&format!("pg_checksums: {blocks} blocks, no bad checksum"));
        drop(pg);
        let log = m1.stop();
        phase(&format!("mount 1 stopped: {}", remote_tier_line(&log)));
    }

    // Between the runs, PostgreSQL changes the files on the disk directly. The lender still
    // holds blocks of run 1; the next mount must not serve any of them.
    {
        let mut pg = Pg::new(backing.join("pgdata"), root, port, "pg-direct.log", user);
        pg.start();
        let b = pgbench(&pg, &["-n", "-T", "3", "-c", "2", "-j", "2"]);
        history += b.processed;
        check_data(&pg, history);
        pg.stop();
        phase(&format!("direct TPC-B on the backing directory: {} transactions", b.processed));
    }

    // Run 2: remount, check, select-only load while the lender is killed, check, checksums.
    {
        let m2 = MountProcess::start(
            bin(),
            &backing,
            &mnt,
            &["--server", &addr, LENDERS_FIRST[0], LENDERS_FIRST[1]],
            &root.join("mount2.log"),
        );
        let pgdata = mnt.join("pgdata");
        let mut pg = Pg::new(pgdata.clone(), root, port, "pg-run2.log", user);
        pg.start();
        let sum = check_data(&pg, history);
        check_random_reads(&pg, &pgdata, sum);
        check_amcheck(&pg);
        phase("run 2: data checks and amcheck done");

        drop_page_cache(&pgdata);
        let before = lender_hits(&addr);
        let mut c = pg.cmd("pgbench");
        c.args(["-n", "-S", "-T", "8", "-c", "4", "-j", "2"]);
        let select_only = std::thread::spawn(move || run_with_timeout(c, CMD_TIMEOUT));
        let served = wait_until(Duration::from_secs(5), Duration::from_millis(50), || lender_hits(&addr) > before);
        assert!(!select_only.is_finished(), "pgbench -S ended before the lender was killed");
        srv.kill();
        phase(&format!("lender killed during pgbench -S (it had served reads: {served})"));
        assert!(served, "the lender served nothing during pgbench -S");
        let out = select_only.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
        let s = parse_pgbench(&out, &["-S"]);
        phase(&format!("pgbench -S across the kill: {:.0} tps, {} transactions, 0 failed", s.tps, s.processed));

        assert_eq!(check_data(&pg, history), sum, "the select-only run changed the balances");
        pg.stop();
        let blocks = check_checksums(&pg);
        phase(&format!("run 2: checks after the kill and pg_checksums ({blocks} blocks) done"));
        drop(pg);
        let log = m2.stop();
        phase(&format!("mount 2 stopped: {}", remote_tier_line(&log)));
    }
}

/// The daemon under PostgreSQL dies and is upgraded while pgbench runs (issue 15): TPC-B with
/// 4 clients on a supervised mount, a lender in the path, while the daemon is SIGKILLed 10
/// times and upgraded in place (SIGHUP to the supervisor) 10 times. Zero failed transactions,
/// no warning or error in PostgreSQL's log, the TPC-B invariant, amcheck, and pg_checksums
/// over every page afterwards.
#[test]
fn pgbench_survives_kills_and_upgrades_of_the_mount_daemon() {
    require_root("the PostgreSQL test (it mounts FUSE and runs PostgreSQL as the postgres user)");
    let user = require_postgres();
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:6.1}s] {what}", t0.elapsed().as_secs_f64());
    let tree = test_tree(user);
    let root = tree.path();
    let (backing, mnt) = (root.join("backing"), root.join("mnt"));
    let srv = ServerProcess::start(bin(), &["--capacity", "256MiB"], None);
    let addr = srv.addr().to_string();
    let ctl = root.join("ctl.sock");
    let sup = MountProcess::start(
        bin(),
        &backing,
        &mnt,
        &[
            "--supervise",
            "--restart-limit",
            "100",
            "--server",
            &addr,
            LENDERS_FIRST[0],
            LENDERS_FIRST[1],
            "--control-socket",
            ctl.to_str().unwrap(),
        ],
        &root.join("supervisor.log"),
    );
    let daemon_of = |not: Option<u32>| -> u32 {
        let mut pid = None;
        let ok = wait_until(Duration::from_secs(15), Duration::from_millis(5), || {
            let c = sup.children();
            pid = (c.len() == 1 && Some(c[0]) != not).then(|| c[0]);
            pid.is_some()
        });
        assert!(ok, "no single new daemon (children {:?}):\n{}", sup.children(), sup.log_text());
        pid.unwrap()
    };
    let pgdata = mnt.join("pgdata");
    let mut pg = Pg::new(pgdata.clone(), root, free_port(), "pg-events.log", user);
    pg.initdb();
    pg.start();
    pg.run("pgbench", &["-i", "-q", "-s", &SCALE.to_string()]);
    phase("initdb and pgbench -i done");

    let mut c = pg.cmd("pgbench");
    c.args(["-n", "-T", "40", "-c", "4", "-j", "2"]);
    let tpcb = std::thread::spawn(move || run_with_timeout(c, CMD_TIMEOUT));
    let mut daemon = daemon_of(None);
    let (mut kills, mut upgrades) = (0, 0);
    for i in 0..20 {
        std::thread::sleep(Duration::from_millis(1000));
        assert!(!tpcb.is_finished(), "pgbench ended early (after {kills} kills, {upgrades} upgrades)");
        if i % 2 == 0 {
            // SAFETY: kill(2) on the daemon the supervisor this test started runs.
            unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
            kills += 1;
        } else {
            sup.signal(libc::SIGHUP);
            upgrades += 1;
        }
        daemon = daemon_of(Some(daemon));
    }
    phase(&format!("{kills} kills and {upgrades} upgrades done"));
    let out = tpcb.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let b = parse_pgbench(&out, &["-n", "-T", "40"]);
    phase(&format!("TPC-B across them: {:.0} tps, {} transactions, 0 failed", b.tps, b.processed));
    check_data(&pg, b.processed);
    check_amcheck(&pg);
    pg.stop();
    let blocks = check_checksums(&pg);
    phase(&format!("amcheck, the invariant and pg_checksums ({blocks} blocks) are clean"));
    drop(pg);
    let log = sup.stop();
    assert!(log.contains("unanswered requests resent"), "no restart happened?\n{log}");
}

/// PostgreSQL on a mount with a write-back tier (issue 12): its WAL and data files written
/// into the tier (fsyncs absorbed there), a crash of PostgreSQL itself (`pg_ctl stop -m
/// immediate`: no shutdown checkpoint) recovered from the WAL the tier holds, the data checks
/// and amcheck, a clean stop and `pg_checksums` through the mount; then a clean unmount writes
/// everything back, and PostgreSQL run directly on the backing directory finds every
/// committed transaction.
#[test]
fn postgres_on_a_mount_with_a_write_back_tier() {
    require_root("the PostgreSQL test (it mounts FUSE and runs PostgreSQL as the postgres user)");
    let user = require_postgres();
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:6.1}s] {what}", t0.elapsed().as_secs_f64());
    let tree = test_tree(user);
    let root = tree.path();
    let (backing, mnt) = (root.join("backing"), root.join("mnt"));
    let port = free_port();
    let tier = TierFile::new("pg");
    let t = tier.arg();
    let m = MountProcess::start(
        bin(),
        &backing,
        &mnt,
        &["--no-remote", "--tier", t, "--tier-size", "512MiB"],
        &root.join("mount.log"),
    );
    let pgdata = mnt.join("pgdata");
    let mut pg = Pg::new(pgdata.clone(), root, port, "pg-tier.log", user);
    pg.initdb();
    pg.start();
    pg.run("pgbench", &["-i", "-q", "-s", &SCALE.to_string()]);
    let tpcb = pgbench(&pg, &["-n", "-T", "5", "-c", "4", "-j", "2"]);
    let history = tpcb.processed;
    phase(&format!("TPC-B through the tier: {:.0} tps, {} transactions", tpcb.tps, tpcb.processed));
    // A crash of PostgreSQL: recovery replays the WAL, which only the tier may hold yet.
    let out =
        pg.run_unchecked("pg_ctl", &["stop", "-w", "-t", "50", "-m", "immediate", "-D", pgdata.to_str().unwrap()]);
    assert!(out.status.success(), "pg_ctl stop -m immediate: {}", text(&out));
    pg.postmaster = None;
    pg.start();
    check_data(&pg, history);
    check_amcheck(&pg);
    pg.stop();
    let blocks = check_checksums(&pg);
    phase(&format!("after a PostgreSQL crash: data checks, amcheck, pg_checksums ({blocks} blocks) done"));
    drop(pg);
    let log = m.stop();
    assert!(log.contains("everything destaged"), "{log}");
    // Everything is on the disk: PostgreSQL directly on the backing directory.
    let mut pg = Pg::new(backing.join("pgdata"), root, port, "pg-backing.log", user);
    pg.start();
    check_data(&pg, history);
    pg.stop();
    phase("directly on the backing directory after the clean unmount: every transaction there");
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let ppid =
            stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)).and_then(|x| x.parse().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// The mount daemon SIGKILLed under PostgreSQL in the middle of TPC-B, with a write-back tier:
/// PostgreSQL dies of it (its files are gone); the mount comes back with the same tier
/// (recovery), PostgreSQL recovers from its WAL, and no transaction committed before the kill
/// is lost — the history holds at least every transaction of the runs before, and the TPC-B
/// invariant holds for what it holds — amcheck and `pg_checksums` clean.
#[test]
fn postgres_survives_the_mount_daemon_killed_under_it_with_a_tier() {
    let tier = TierFile::new("pgkill");
    daemon_killed_under_postgres(tier.arg().to_string(), None);
}

/// The same with an `ssd` tier (a file on the test tree's disk file system) and its default
/// commit ("fsync"): a write is acknowledged before its flush, and PostgreSQL's WAL fdatasync
/// is what makes a commit durable — no committed transaction may be lost to the kill.
#[test]
fn postgres_survives_the_mount_daemon_killed_under_it_with_an_ssd_tier() {
    daemon_killed_under_postgres(String::new(), Some("pgkill-ssd.tier"));
}

/// `tier`: the tier's path; or, with `ssd_name`, a file of that name in the test tree.
fn daemon_killed_under_postgres(tier: String, ssd_name: Option<&str>) {
    require_root("the PostgreSQL test (it mounts FUSE and runs PostgreSQL as the postgres user)");
    let user = require_postgres();
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:6.1}s] {what}", t0.elapsed().as_secs_f64());
    let tree = test_tree(user);
    let root = tree.path();
    let (backing, mnt) = (root.join("backing"), root.join("mnt"));
    let port = free_port();
    // An ssd tier on the target directory's disk file system (as `tier_crash.rs`'s).
    let ssd_file = ssd_name.map(|n| {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{n}-{}", std::process::id()));
        let _ = fs::remove_file(&p);
        p
    });
    let tier = match &ssd_file {
        Some(p) => p.to_str().expect("a UTF-8 path").to_string(),
        None => tier,
    };
    let args = ["--no-remote", "--tier", tier.as_str(), "--tier-size", "512MiB"];
    let m = MountProcess::start(bin(), &backing, &mnt, &args, &root.join("mount1.log"));
    let pgdata = mnt.join("pgdata");
    let mut pg = Pg::new(pgdata.clone(), root, port, "pg-kill.log", user);
    pg.initdb();
    pg.start();
    pg.run("pgbench", &["-i", "-q", "-s", &SCALE.to_string()]);
    let before = pgbench(&pg, &["-n", "-T", "3", "-c", "4", "-j", "2"]).processed;
    phase(&format!("{before} transactions committed before the kill run"));
    let mut c = pg.cmd("pgbench");
    c.args(["-n", "-T", "20", "-c", "4", "-j", "2"]);
    let run = std::thread::spawn(move || run_with_timeout(c, CMD_TIMEOUT));
    std::thread::sleep(Duration::from_secs(3));
    m.signal(libc::SIGKILL);
    m.wait_exit();
    phase("mount daemon killed under TPC-B");
    // What pgbench saw committed in the killed run, if it got to print its summary.
    let during: u64 = run
        .join()
        .ok()
        .and_then(|r| r.ok())
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
                l.trim()
                    .strip_prefix("number of transactions actually processed:")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0);
    phase(&format!("pgbench reported {during} transactions committed in the killed run"));
    // PostgreSQL lost its files: stop what is left of it (the postmaster and its children).
    if let Some(pid) = pg.postmaster.take() {
        for child in children_of(pid) {
            // SAFETY: kill(2) on a child of the postmaster this test started.
            unsafe { libc::kill(child, libc::SIGKILL) };
        }
        // SAFETY: kill(2) on the postmaster this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let gone = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            !Path::new(&format!("/proc/{pid}")).exists() && children_of(pid).is_empty()
        });
        assert!(gone, "the postmaster did not go");
    }
    drop(m); // unmounts the dead mount
    let m = MountProcess::start(bin(), &backing, &mnt, &args, &root.join("mount2.log"));
    let log = m.log_text();
    assert!(log.contains("recovered"), "{log}");
    if ssd_file.is_some() {
        assert!(log.contains("(ssd: a write acknowledged by it survives the daemon at once"), "{log}");
    }
    // A new server log: the first holds the PANICs of losing the files.
    drop(pg);
    let mut pg = Pg::new(pgdata.clone(), root, port, "pg-after-kill.log", user);
    pg.start();
    let rows = nums(&pg.psql(&["SELECT count(*) FROM pgbench_history"]))[0] as u64;
    assert!(
        rows >= before + during,
        "committed transactions lost: {rows} history rows, {before} committed before the kill run and {during} in it"
    );
    check_data(&pg, rows);
    check_amcheck(&pg);
    pg.stop();
    let blocks = check_checksums(&pg);
    phase(&format!(
        "after the remount: {rows} history rows (>= {before} + {during}), data checks, amcheck, pg_checksums ({blocks} blocks)"
    ));
    drop(pg);
    m.stop();
    if let Some(p) = ssd_file {
        let _ = fs::remove_file(p);
    }
}
