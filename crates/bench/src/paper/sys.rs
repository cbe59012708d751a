//! Small system helpers for the testbed: commands with a time limit, the interrupt flag that
//! SIGINT/SIGTERM/SIGHUP set, children started inside cgroups and their own process group.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::IoContext;
use crate::{BenchError, Result};

/// How long any one setup or teardown command (losetup, mkfs.ext4, ip, tc, mount) may take.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(120);

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Turn SIGINT, SIGTERM and SIGHUP into a flag that every wait of the run checks, so that an
/// interrupted run unwinds through its guards and tears the testbed down in order.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with a handler that only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fail with "interrupted" once a signal came.
pub fn check_interrupt() -> Result<()> {
    if interrupted() {
        return Err(BenchError::Setup("interrupted by a signal: tearing the testbed down".into()));
    }
    Ok(())
}

/// Sleep `d`, waking early (with an error) on a signal.
pub fn sleep_checked(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        check_interrupt()?;
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    Ok(())
}

/// Run `prog args`, wait at most [`CMD_TIMEOUT`]; its stdout on success, an error with its
/// stderr otherwise.
pub fn run(prog: &str, args: &[&str]) -> Result<String> {
    run_with_timeout(prog, args, CMD_TIMEOUT)
}

pub fn run_with_timeout(prog: &str, args: &[&str], limit: Duration) -> Result<String> {
    let mut cmd = Command::new(prog);
    cmd.args(args);
    output_bounded(cmd, limit, &format!("`{prog} {}`", args.join(" ")))
}

/// Run `cmd` (prepared by the caller, e.g. [`confine`]d), wait at most `limit`; its stdout
/// on success, an error naming `what` with its stderr otherwise.
pub fn output_bounded(mut cmd: Command, limit: Duration, what: &str) -> Result<String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ctx(|| format!("run {what} (is it installed? {cmd:?})"))?;
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let status = wait_bounded(&mut child, limit);
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    match status {
        Some(st) if st.success() => Ok(out),
        Some(st) => Err(BenchError::Setup(format!("{what} failed ({st}): {} {}", err.trim(), tail(&out)))),
        None => Err(BenchError::Setup(format!("{what} did not finish within {limit:?}; killed"))),
    }
}

/// The last lines of `text`.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Run a teardown command: errors are returned as text for a warning, never raised.
pub fn run_quiet(prog: &str, args: &[&str]) -> std::result::Result<(), String> {
    run_with_timeout(prog, args, Duration::from_secs(30)).map(|_| ()).map_err(|e| e.to_string())
}

fn drain<R: Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut r) = r {
            let _ = r.read_to_string(&mut s);
        }
        s
    })
}

/// Wait for `child` up to `limit`; on timeout kill it (and reap it) and return None.
pub fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Write `value` to a sysfs/cgroupfs/procfs file.
pub fn write_file(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).ctx(|| format!("write {value:?} to {}", path.display()))
}

/// Prepare `cmd` so that, between fork and exec, the child: joins each cgroup whose
/// `cgroup.procs` path is given (so it does all its work, and allocates all its memory,
/// inside them); leaves the terminal's process group (a Ctrl-C reaches the harness only,
/// which then stops children in order); and gets SIGTERM should the harness die without
/// cleaning up (PR_SET_PDEATHSIG follows the spawning thread: the harness runs on one thread).
pub fn confine(cmd: &mut Command, cgroup_procs: &[&Path]) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let paths: Vec<std::ffi::CString> = cgroup_procs
        .iter()
        .map(|p| std::ffi::CString::new(p.as_os_str().as_bytes()).expect("cgroup path without NUL"))
        .collect();
    // SAFETY: only async-signal-safe calls (open, write, close, setpgid, prctl) between fork
    // and exec, on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for p in &paths {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0" moves the writing process (cgroup v1 and v2).
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
            }
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
            Ok(())
        });
    }
}

/// CPUs the machine has online (not this process's affinity, which [`pin_process`] narrows).
pub fn cpus_online() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as u32
    } else {
        1
    }
}

/// CPUs `cpus` (a range of CPU numbers) as an affinity mask.
fn cpu_mask(cpus: std::ops::Range<u32>) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; all zeros is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in cpus {
        // SAFETY: CPU_SET only writes within the set (it ignores numbers past its size).
        unsafe { libc::CPU_SET(c as usize, &mut set) };
    }
    set
}

/// Run every thread of this process — and so every process it starts after, which inherit
/// it — on the CPUs `cpus` only (`--client-cpus`: the client on its own CPUs).
pub fn pin_process(cpus: std::ops::Range<u32>) -> Result<()> {
    let set = cpu_mask(cpus.clone());
    let tasks = std::fs::read_dir("/proc/self/task").ctx(|| "list /proc/self/task".into())?;
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<libc::pid_t>().ok()) else { continue };
        // SAFETY: `set` is a valid cpu_set_t of the size passed.
        if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
            let e = std::io::Error::last_os_error();
            // A thread that ended since the listing is not an error.
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(BenchError::Setup(format!("cannot pin thread {tid} to CPUs {cpus:?}: {e}")));
            }
        }
    }
    Ok(())
}

/// The CPUs process `pid` may run on (`Cpus_allowed_list` of /proc/PID/status, e.g.
/// "0-1,3"); `None` when the process is gone or the line does not parse.
pub fn allowed_cpus(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_cpu_list(status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?.trim())
}

/// "0-1,3" → [0, 1, 3].
fn parse_cpu_list(list: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi): (u32, u32) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
        if hi < lo || hi - lo > 4096 {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    Some(cpus)
}

/// That process `pid` (`what`) runs on the CPUs `cpus` and no others: what `--client-cpus`
/// promises, checked rather than assumed.
pub fn check_pinned(pid: u32, what: &str, cpus: std::ops::Range<u32>) -> Result<()> {
    let want: Vec<u32> = cpus.collect();
    match allowed_cpus(pid) {
        Some(got) if got == want => Ok(()),
        got => Err(BenchError::Setup(format!(
            "{what} (pid {pid}) may run on CPUs {got:?}, not {want:?} as --client-cpus asked"
        ))),
    }
}

/// Have the process `cmd` starts run on the CPUs `cpus` only (the lenders, beside a client
/// pinned by [`pin_process`]).
pub fn pin_command(cmd: &mut Command, cpus: std::ops::Range<u32>) {
    use std::os::unix::process::CommandExt;
    let set = cpu_mask(cpus);
    // SAFETY: one system call between fork and exec, on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Signal one process we started (never a group, never by name).
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a pid we started or read from one of our own cgroups/namespaces.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Whether `pid` names a live process.
pub fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks existence.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// Whether we run as root (the testbed needs loop devices, mounts, cgroups, namespaces).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Mount points (field 5 of /proc/self/mountinfo, unescaped) that start with `prefix`.
pub fn mounts_under(prefix: &Path) -> Vec<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = prefix.to_string_lossy().to_string();
    let mut out = Vec::new();
    for l in info.lines() {
        let mut f = l.split(' ');
        let Some(mnt) = f.nth(4) else { continue };
        let mnt = mnt.replace("\\040", " ");
        let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next()).unwrap_or("").to_string();
        if mnt.starts_with(&want) {
            out.push((mnt, fstype));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_this_process_has_one() {
        assert_eq!(parse_cpu_list("0-1,3"), Some(vec![0, 1, 3]));
        assert_eq!(parse_cpu_list("2"), Some(vec![2]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        let mine = allowed_cpus(std::process::id()).expect("own Cpus_allowed_list");
        assert!(!mine.is_empty() && mine.len() as u32 <= cpus_online(), "{mine:?}");
        assert!(check_pinned(std::process::id(), "this test", 0..0).is_err());
    }
}
