//! Counters read between passes: the lenders' own STATS (summed over lenders; per pass, so
//! each pass's remote hits are known exactly) — the mount's counters are in [`super::mount`].

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::error::IoContext;
use crate::fc_client::FcClient;
use crate::{BenchError, Result};

/// The tenant the mount borrows as (its default), so asking adds no tenant to the lender.
const TENANT: &str = "default";

/// Sums of the lenders' STATS totals: the server's own counter set, so the two cannot drift.
pub type LenderTotals = farcache_server::TenantCounters;

/// Ask every lender for its STATS and add them up.
pub fn lender_totals(addrs: &[SocketAddr]) -> Result<LenderTotals> {
    let mut t = LenderTotals::default();
    for &a in addrs {
        let s = TcpStream::connect_timeout(&a, Duration::from_secs(3)).ctx(|| format!("connect to lender {a}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ctx(|| "read timeout".into())?;
        s.set_write_timeout(Some(Duration::from_secs(5))).ctx(|| "write timeout".into())?;
        let mut c = FcClient::handshake(s, TENANT)?;
        let json = c.stats()?;
        let stats: farcache_server::ServerStats = serde_json::from_str(&json)
            .map_err(|e| BenchError::Setup(format!("lender {a} sent STATS that do not parse: {e}")))?;
        t.add(&stats.totals);
    }
    Ok(t)
}

/// CPU time spent during one run, in milliseconds, by who spent it: the figure that decides a
/// CPU-bound comparison on a shared two-core machine better than the rate alone (issue 17:
/// where a TPC-B loss goes).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CpuTime {
    /// Every process of the client's cpuacct cgroup: PostgreSQL, pgbench and the mount daemon.
    pub client_ms: f64,
    /// The mount daemon alone (a part of `client_ms`; 0 without a mount).
    pub daemon_ms: f64,
    /// The lenders' processes (outside the client's cgroups, as on other machines).
    pub lenders_ms: f64,
    /// The whole machine, softirq (the lenders' veth links) included, other work too.
    pub machine_ms: f64,
}

impl CpuTime {
    pub fn since(&self, earlier: &CpuTime) -> CpuTime {
        CpuTime {
            client_ms: self.client_ms - earlier.client_ms,
            daemon_ms: self.daemon_ms - earlier.daemon_ms,
            lenders_ms: self.lenders_ms - earlier.lenders_ms,
            machine_ms: self.machine_ms - earlier.machine_ms,
        }
    }
}

/// Where a run's CPU time is read from.
pub struct CpuProbe {
    /// The client's cpuacct cgroup directory.
    pub cgroup: std::path::PathBuf,
    pub daemon: Option<u32>,
    pub lenders: Vec<u32>,
}

impl CpuProbe {
    /// The probe of a configuration: its client's cpuacct cgroup, its mount daemon and its
    /// lenders, where it has them.
    pub fn of(
        cgroup: &super::cgroup::Cgroup,
        mount: Option<&super::mount::MountDaemon>,
        lenders: Option<&super::testbed::Lenders>,
    ) -> CpuProbe {
        CpuProbe {
            cgroup: cgroup.path().to_path_buf(),
            daemon: mount.map(|m| m.pid()),
            lenders: lenders.map(|l| l.procs.iter().map(|p| p.pid()).collect()).unwrap_or_default(),
        }
    }

    pub fn sample(&self) -> CpuTime {
        let usage_ns = std::fs::read_to_string(self.cgroup.join("cpuacct.usage"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        CpuTime {
            client_ms: usage_ns as f64 / 1e6,
            daemon_ms: self.daemon.map(process_cpu_ms).unwrap_or(0.0),
            lenders_ms: self.lenders.iter().map(|&p| process_cpu_ms(p)).sum(),
            machine_ms: machine_busy_ms(),
        }
    }
}

fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// User + system time of a process (all its threads, live and exited) from /proc/PID/stat;
/// 0 for a process that is gone.
pub fn process_cpu_ms(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| stat_cpu_ticks(&s)).unwrap_or(0) as f64
        * 1000.0
        / ticks_per_sec()
}

/// One thread's counters from /proc: its name (`comm`, with digits dropped so that numbered
/// workers — io_uring's `iou-wrk-123`, a pool's `worker-7` — fall into one group), its user and
/// system time in milliseconds and its context switches (voluntary + involuntary: how often
/// it slept or was preempted, the cost a thread hop adds that no instruction count shows).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadStat {
    pub name: String,
    pub user_ms: f64,
    pub sys_ms: f64,
    pub switches: u64,
}

/// [`ThreadStat`] of each live thread of a process, by thread id. Empty for a process that is
/// gone.
pub fn thread_stats(pid: u32) -> std::collections::HashMap<u32, ThreadStat> {
    let mut out = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let name: String = stat[open + 1..close].chars().filter(|c| !c.is_ascii_digit()).collect();
        let Some((user, sys)) = stat_cpu_split(&stat) else { continue };
        let switches = std::fs::read_to_string(e.path().join("status")).map(|s| status_switches(&s)).unwrap_or(0);
        let ms = |t: u64| t as f64 * 1000.0 / ticks_per_sec();
        out.insert(tid, ThreadStat { name, user_ms: ms(user), sys_ms: ms(sys), switches });
    }
    out
}

/// CPU time of each live thread of a process, by thread id: its [`ThreadStat`] name and its
/// user + system time in milliseconds. Empty for a process that is gone.
pub fn thread_cpu_ms(pid: u32) -> std::collections::HashMap<u32, (String, f64)> {
    thread_stats(pid).into_iter().map(|(tid, t)| (tid, (t.name, t.user_ms + t.sys_ms))).collect()
}

/// The context switches each thread group made between two [`thread_stats`] samples of one
/// process (a thread born in between counts all of its own; ended threads' are lost).
pub fn switch_groups_since(
    before: &std::collections::HashMap<u32, ThreadStat>,
    after: &std::collections::HashMap<u32, ThreadStat>,
) -> std::collections::BTreeMap<String, u64> {
    let mut groups = std::collections::BTreeMap::<String, u64>::new();
    for (tid, t) in after {
        let earlier = before.get(tid).map(|b| b.switches).unwrap_or(0);
        *groups.entry(t.name.clone()).or_default() += t.switches.saturating_sub(earlier);
    }
    groups.retain(|_, v| *v > 0);
    groups
}

/// voluntary_ctxt_switches + nonvoluntary_ctxt_switches of a /proc/PID/task/TID/status text.
fn status_switches(status: &str) -> u64 {
    status
        .lines()
        .filter(|l| l.starts_with("voluntary_ctxt_switches:") || l.starts_with("nonvoluntary_ctxt_switches:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
        .sum()
}

/// The CPU each thread group spent between two [`thread_cpu_ms`] samples of one process whose
/// total grew by `process_ms` meanwhile: a thread live at both counts its growth, one born in
/// between all of its time, and what threads that ended in between spent is the remainder,
/// under `(ended threads)` (io_uring's workers come and go).
pub fn thread_groups_since(
    before: &std::collections::HashMap<u32, (String, f64)>,
    after: &std::collections::HashMap<u32, (String, f64)>,
    process_ms: f64,
) -> std::collections::BTreeMap<String, f64> {
    let mut groups = std::collections::BTreeMap::<String, f64>::new();
    for (tid, (name, ms)) in after {
        let earlier = before.get(tid).map(|(_, m)| *m).unwrap_or(0.0);
        *groups.entry(name.clone()).or_default() += (ms - earlier).max(0.0);
    }
    let seen: f64 = groups.values().sum();
    if process_ms - seen > 0.0 {
        groups.insert("(ended threads)".into(), process_ms - seen);
    }
    groups.retain(|_, v| *v > 0.0);
    groups
}

/// utime + stime of a /proc/PID/stat line (see [`stat_cpu_split`]).
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    stat_cpu_split(stat).map(|(u, s)| u + s)
}

/// (utime, stime) of a /proc/PID/stat line, in clock ticks: fields 14 and 15, counted after
/// the command name's closing parenthesis (the name itself may hold spaces and parentheses).
fn stat_cpu_split(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(11)?.parse::<u64>().ok()?, f.get(12)?.parse::<u64>().ok()?))
}

/// System (kernel) time of a process, all its threads, in milliseconds; 0 when it is gone.
pub fn process_sys_ms(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| stat_cpu_split(&s)).map_or(0, |(_, s)| s)
        as f64
        * 1000.0
        / ticks_per_sec()
}

/// The machine's busy time: user, nice, system, irq and softirq of /proc/stat's `cpu` line.
fn machine_busy_ms() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/stat") else { return 0.0 };
    let Some(line) = s.lines().find(|l| l.starts_with("cpu ")) else { return 0.0 };
    let f: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let busy: u64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| f.get(i)).sum();
    busy as f64 * 1000.0 / ticks_per_sec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "4242 (farcache (mount) x) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 33 0 100";
        assert_eq!(stat_cpu_ticks(line), Some(175));
        assert_eq!(stat_cpu_split(line), Some((150, 25)));
        assert_eq!(stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn thread_groups_count_growth_births_and_ended_threads() {
        let m = |v: &[(u32, &str, f64)]| v.iter().map(|&(t, n, ms)| (t, (n.to_string(), ms))).collect();
        let before = m(&[(1, "main", 100.0), (2, "iou-wrk-", 10.0), (3, "iou-wrk-", 5.0)]);
        let after = m(&[(1, "main", 130.0), (2, "iou-wrk-", 12.0), (4, "iou-wrk-", 3.0)]);
        let g = thread_groups_since(&before, &after, 50.0);
        assert_eq!(g.get("main"), Some(&30.0));
        assert_eq!(g.get("iou-wrk-"), Some(&5.0));
        assert_eq!(g.get("(ended threads)"), Some(&15.0));
        // This process's own threads are read, names without digits.
        let mine = thread_cpu_ms(std::process::id());
        assert!(!mine.is_empty());
        assert!(mine.values().all(|(n, _)| !n.chars().any(|c| c.is_ascii_digit())));
        assert!(thread_cpu_ms(u32::MAX).is_empty());
    }

    #[test]
    fn switches_parse_and_group_by_thread() {
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(status_switches(status), 127);
        assert_eq!(status_switches("Name: x\n"), 0);
        let t = |n: &str, sw: u64| ThreadStat { name: n.into(), switches: sw, ..ThreadStat::default() };
        let before: std::collections::HashMap<u32, ThreadStat> = [(1, t("fuse", 10)), (2, t("fuse", 5))].into();
        let after = [(1, t("fuse", 15)), (2, t("fuse", 5)), (3, t("tokio", 4))].into();
        let g = switch_groups_since(&before, &after);
        assert_eq!(g.get("fuse"), Some(&5));
        assert_eq!(g.get("tokio"), Some(&4));
        assert_eq!(g.len(), 2);
        // This thread has slept at least once by the time it reads its own counters.
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mine = thread_stats(std::process::id());
        assert!(mine.values().map(|t| t.switches).sum::<u64>() > 0, "{mine:?}");
        assert!(process_sys_ms(u32::MAX) == 0.0);
    }

    #[test]
    fn this_process_and_the_machine_have_spent_cpu() {
        // Spin until the kernel has charged this process a tick (bounded: 5 s of wall time).
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while process_cpu_ms(std::process::id()) == 0.0 && t.elapsed() < std::time::Duration::from_secs(5) {
            for _ in 0..100_000 {
                x = x.wrapping_add(std::hint::black_box(1));
            }
        }
        std::hint::black_box(x); // (the process may have been charged before the loop ran)
        assert!(process_cpu_ms(std::process::id()) > 0.0, "no CPU time charged after 5 s of spinning");
        assert_eq!(process_cpu_ms(u32::MAX), 0.0);
        assert!(machine_busy_ms() > 0.0);
    }
}
