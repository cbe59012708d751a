//! The machine a result was measured on, printed beside every table.

use std::collections::HashMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub mem_total_bytes: u64,
    pub kernel: String,
}

impl Machine {
    pub fn detect() -> Machine {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_total_bytes = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        Machine { cpus, cpu_model, mem_total_bytes, kernel }
    }

    /// One line: "2 CPUs (model), 23.4 GiB RAM, Linux 6.18".
    pub fn describe(&self) -> String {
        format!(
            "{} CPUs ({}), {:.1} GiB RAM, Linux {}",
            self.cpus,
            self.cpu_model,
            self.mem_total_bytes as f64 / (1u64 << 30) as f64,
            self.kernel
        )
    }
}

/// CPU time of every process on the machine but the benchmark's own, at one instant: to
/// tell whether something else (a build, another benchmark) ran beside a measurement.
pub struct CpuSnapshot {
    at: Instant,
    /// pid → (own ticks: utime + stime, with reaped children: + cutime + cstime, command).
    ticks: HashMap<u32, (u64, u64, String)>,
}

/// CPU used by other processes between two snapshots.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OtherCpu {
    /// Average CPUs busy with other processes (1.0 = one whole CPU).
    pub cpus: f64,
    /// The biggest consumer, e.g. "rustc 0.83".
    pub top: String,
}

impl CpuSnapshot {
    /// Read /proc/*/stat of every process except `exclude`.
    pub fn take(exclude: &[u32]) -> CpuSnapshot {
        let mut ticks = HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                if exclude.contains(&pid) {
                    continue;
                }
                if let Some(x) =
                    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().as_deref().and_then(parse_stat)
                {
                    ticks.insert(pid, x);
                }
            }
        }
        CpuSnapshot { at: Instant::now(), ticks }
    }

    /// What other processes used from `earlier` to this snapshot.
    pub fn since(&self, earlier: &CpuSnapshot) -> OtherCpu {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let secs = (self.at - earlier.at).as_secs_f64().max(1e-3);
        let mut by_name: HashMap<&str, u64> = HashMap::new();
        for (pid, (own, with_children, name)) in &self.ticks {
            // A process seen both times: its own time in between (children reaped in between
            // report their whole life, which may predate the window, so they are left out).
            // A new process: all of it, children included, since it began in the window.
            let used = match earlier.ticks.get(pid) {
                Some((own0, _, _)) => own.saturating_sub(*own0),
                None => *with_children,
            };
            *by_name.entry(name.as_str()).or_default() += used;
        }
        let total: u64 = by_name.values().sum();
        let top = by_name
            .iter()
            .max_by_key(|(_, &t)| t)
            .filter(|(_, &t)| t > 0)
            .map(|(n, &t)| format!("{n} {:.2}", t as f64 / hz / secs))
            .unwrap_or_default();
        OtherCpu { cpus: total as f64 / hz / secs, top }
    }
}

/// CPU seconds process `pid` has used so far (utime + stime), if it is there to read.
pub fn process_cpu_secs(pid: u32) -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let line = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&line).map(|(own, _, _)| own as f64 / hz)
}

/// (utime + stime, that + cutime + cstime, comm) from a /proc/PID/stat line.
fn parse_stat(line: &str) -> Option<(u64, u64, String)> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let comm = line.get(open + 1..close)?.to_string();
    let f: Vec<&str> = line.get(close + 1..)?.split_whitespace().collect();
    // After the command: state ppid pgrp session tty tpgid flags minflt cminflt majflt
    // cmajflt utime stime cutime cstime ...
    let n = |i: usize| f.get(i).and_then(|x| x.parse::<i64>().ok()).map(|x| x.max(0) as u64);
    let own = n(11)? + n(12)?;
    Some((own, own + n(13)? + n(14)?, comm))
}

#[cfg(test)]
mod tests {
    #[test]
    fn stat_lines_and_other_cpu() {
        let line = "123 (my (odd) cmd) S 1 2 3 0 -1 4 5 6 7 8 100 20 3 4 20 0 1 0 5 6 7";
        assert_eq!(super::parse_stat(line), Some((120, 127, "my (odd) cmd".to_string())));
        assert_eq!(super::parse_stat("garbage"), None);
        let a = super::CpuSnapshot::take(&[std::process::id()]);
        let b = super::CpuSnapshot::take(&[std::process::id()]);
        let o = b.since(&a);
        assert!(o.cpus >= 0.0, "{o:?}");
    }

    #[test]
    fn detects_this_machine() {
        let m = super::Machine::detect();
        assert!(m.cpus >= 1 && m.mem_total_bytes > 0 && !m.kernel.is_empty(), "{m:?}");
        assert!(m.describe().contains("CPUs"));
    }
}
