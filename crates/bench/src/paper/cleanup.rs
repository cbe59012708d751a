//! `farcache bench paper --cleanup`: remove what earlier runs left behind (a run killed with
//! SIGKILL, a machine that lost power mid-run). Only names with the harness's prefix are
//! touched, and never those of a run whose harness is still alive.

use std::path::Path;

use super::cgroup;
use super::sys;
use super::testbed::{Testbed, PREFIX, WORK_BASE};

/// The harness pid encoded in a name ("fcb-1a2b…" or the compact "fcb1a2bh0"), if any.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX).or_else(|| name.strip_prefix(PREFIX.trim_end_matches('-')))?;
    let hex: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
    u32::from_str_radix(&hex, 16).ok()
}

/// The run prefix ("fcb-<hex>") of a name.
fn run_prefix(name: &str) -> Option<String> {
    owner_pid(name).map(|p| format!("{PREFIX}{p:x}"))
}

/// Whether the run that made `name` is still going (its harness is a live `farcache`).
pub(crate) fn live(name: &str) -> bool {
    let Some(pid) = owner_pid(name) else { return false };
    if format!("{PREFIX}{pid:x}") == Testbed::own_prefix() {
        return true;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    sys::alive(pid) && comm.trim() == "farcache"
}

fn ours(name: &str) -> bool {
    run_prefix(name).is_some() && !live(name)
}

fn list_dir(p: &str) -> Vec<String> {
    std::fs::read_dir(p)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().to_string()).collect())
        .unwrap_or_default()
}

/// Remove every leftover of runs that are not alive; returns what was removed (and what
/// could not be) as lines for the user.
pub fn cleanup() -> Vec<String> {
    let mut done = Vec::new();
    fn note(done: &mut Vec<String>, r: std::result::Result<(), String>, what: String) {
        match r {
            Ok(()) => done.push(format!("removed {what}")),
            Err(e) => done.push(format!("could not remove {what}: {e}")),
        }
    }
    if !sys::is_root() {
        return vec!["--cleanup needs root (loop devices, mounts, cgroups, namespaces)".into()];
    }
    // 1. Processes: load generators and mount daemons live in the run's cgroups, lenders in
    //    its namespaces. Stop them first so nothing holds a mount or a device.
    let netns: Vec<String> = sys::run("ip", &["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|n| ours(n))
        .collect();
    for ns in &netns {
        let pids = sys::run("ip", &["netns", "pids", ns]).unwrap_or_default();
        for p in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            sys::signal(p, libc::SIGKILL);
            done.push(format!("killed pid {p} in namespace {ns}"));
        }
    }
    let mut cgroups = Vec::new();
    for ctl in ["memory", "blkio", "cpuacct", "cpuset"] {
        for name in list_dir(&format!("{}/{ctl}", cgroup::ROOT)).into_iter().filter(|n| ours(n)) {
            let dir = Path::new(cgroup::ROOT).join(ctl).join(&name);
            for p in cgroup::pids(&dir) {
                sys::signal(p, libc::SIGKILL);
                done.push(format!("killed pid {p} in cgroup {}", dir.display()));
            }
            cgroups.push(dir);
        }
    }
    // 2. Mounts under the run directories: FUSE first (it sits on the ext4), deepest first.
    let runs: Vec<String> = list_dir(WORK_BASE).into_iter().filter(|n| ours(n)).collect();
    for run in &runs {
        let base = Path::new(WORK_BASE).join(run);
        let mut mounts = sys::mounts_under(&base);
        mounts.sort_by_key(|(p, fs)| (!fs.starts_with("fuse"), std::cmp::Reverse(p.len())));
        for (m, fs) in mounts {
            let r = if fs.starts_with("fuse") {
                sys::run_quiet("fusermount3", &["-uz", &m]).or_else(|_| sys::run_quiet("umount", &["-l", &m]))
            } else {
                sys::run_quiet("umount", &[&m]).or_else(|_| sys::run_quiet("umount", &["-l", &m]))
            };
            note(&mut done, r, format!("mount {m} ({fs})"));
        }
    }
    // Write-back tier files of paper 003's configurations on tmpfs (writeback.rs).
    for name in list_dir("/dev/shm").into_iter().filter(|n| ours(n)) {
        let p = Path::new("/dev/shm").join(&name);
        note(&mut done, std::fs::remove_file(&p).map_err(|e| e.to_string()), p.display().to_string());
    }
    // 3. Loop devices whose backing file is in a run directory.
    let loops = sys::run("losetup", &["--list", "--noheadings", "-O", "NAME,BACK-FILE"]).unwrap_or_default();
    for l in loops.lines() {
        let mut f = l.split_whitespace();
        let (Some(dev), Some(back)) = (f.next(), f.next()) else { continue };
        let Some(run) = back.strip_prefix(&format!("{WORK_BASE}/")).and_then(|r| r.split('/').next()) else {
            continue;
        };
        if ours(run) {
            note(&mut done, sys::run_quiet("losetup", &["-d", dev]), format!("loop device {dev} ({back})"));
        }
    }
    // 4. Namespaces and veths.
    for ns in &netns {
        note(&mut done, sys::run_quiet("ip", &["netns", "del", ns]), format!("network namespace {ns}"));
    }
    for ifname in list_dir("/sys/class/net").into_iter().filter(|n| ours(n)) {
        note(&mut done, sys::run_quiet("ip", &["link", "del", &ifname]), format!("interface {ifname}"));
    }
    // 5. Cgroups (their processes were killed above) and run directories.
    for dir in cgroups {
        note(&mut done, cgroup::remove_dir(&dir), format!("cgroup {}", dir.display()));
    }
    for run in runs {
        let p = Path::new(WORK_BASE).join(&run);
        note(
            &mut done,
            std::fs::remove_dir_all(&p).map_err(|e| e.to_string()),
            format!("run directory {}", p.display()),
        );
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_owner() {
        assert_eq!(owner_pid("fcb-1a2b"), Some(0x1a2b));
        assert_eq!(owner_pid("fcb-1a2b-l0"), Some(0x1a2b));
        assert_eq!(owner_pid("fcb-1a2b-c3"), Some(0x1a2b));
        assert_eq!(owner_pid("fcb1a2bh0"), Some(0x1a2b));
        assert_eq!(owner_pid("fcb1a2bn12"), Some(0x1a2b));
        assert_eq!(owner_pid("eth0"), None);
        assert_eq!(owner_pid("process_api"), None);
        assert!(live(&Testbed::own_prefix()), "this process's own names are never removed");
    }
}
