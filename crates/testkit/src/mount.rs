//! The real `farcache mount` daemon in a test: started on a backing directory and a mount
//! point, waited for until the kernel shows the FUSE mount, and always unmounted and reaped
//! on drop — also when the test fails — so that a failing test leaves no mount behind.

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `farcache mount` arguments for tests of the data path with lenders in it: paper 000's
/// routing, under which every small read asks the lenders. The default (adaptive) rule
/// rightly keeps reads on a disk as fast as the test machine's, and the lenders would then
/// see only its seeds.
pub const LENDERS_FIRST: [&str; 2] = ["--routing", "threshold"];

/// How long a mount may take to go live.
pub const MOUNT_WAIT: Duration = Duration::from_secs(20);
/// How long a daemon may take to exit after SIGTERM/SIGINT or an unmount.
pub const EXIT_WAIT: Duration = Duration::from_secs(20);

/// Fail (with what to install) when this machine cannot mount FUSE: a machine that cannot
/// mount cannot pass the mount tests.
pub fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: these tests need FUSE (modprobe fuse, or --device /dev/fuse in a container)"
    );
    assert!(Command::new("fusermount3").arg("-V").output().is_ok(), "fusermount3 is missing: apt-get install fuse3");
}

/// Fail unless running as root (CI and developer machines run as root).
pub fn require_root(what: &str) {
    // SAFETY: no arguments, cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "{what} needs root (CI and developer machines run as root)");
}

/// Whether `mnt` is the mount point of a FUSE mount, per /proc/self/mountinfo.
pub fn fuse_mounted(mnt: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = mnt.to_str().unwrap_or_default().replace(' ', "\\040");
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-");
        f.len() > 4 && f[4] == want && sep.is_some_and(|i| f.get(i + 1).is_some_and(|t| t.starts_with("fuse")))
    })
}

/// A running `farcache mount BACKING MNT ARGS...`, its stderr in a log file. Dropping it
/// unmounts (lazily if busy), kills the daemon if it lingers, reaps it, and prints the log
/// if the test is failing.
pub struct MountProcess {
    backing: PathBuf,
    mnt: PathBuf,
    log: PathBuf,
    child: Mutex<Child>,
    /// Whether dropping this unmounts: not once the mount was handed to another daemon.
    owns_mount: std::sync::atomic::AtomicBool,
}

impl MountProcess {
    /// Start the daemon and wait until the mount is live and its one stdout line
    /// (`farcache mounted ...`) has come. Panics with the daemon's log if it does not.
    pub fn start(bin: &Path, backing: &Path, mnt: &Path, args: &[&str], log: &Path) -> MountProcess {
        match Self::try_start(bin, backing, mnt, args, log) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`MountProcess::start`], but a daemon that exits before mounting is an `Err`
    /// with its exit status and log (for tests of refused configurations).
    pub fn try_start(
        bin: &Path,
        backing: &Path,
        mnt: &Path,
        args: &[&str],
        log: &Path,
    ) -> Result<MountProcess, String> {
        Self::try_start_env(bin, backing, mnt, args, &[], log)
    }

    /// [`MountProcess::try_start`] with extra environment variables (e.g. `NOTIFY_SOCKET`).
    pub fn try_start_env(
        bin: &Path,
        backing: &Path,
        mnt: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<MountProcess, String> {
        require_fuse();
        if fuse_mounted(mnt) {
            // Waiting below would take the existing mount for ours, and dropping the guard
            // would unmount it.
            return Err(format!("{} is already a FUSE mount point", mnt.display()));
        }
        let m = Self::spawn(bin, backing, mnt, args, env, log, true)?;
        let t0 = Instant::now();
        while !fuse_mounted(mnt) {
            if let Some(st) = m.child.lock().unwrap().try_wait().unwrap() {
                return Err(format!("farcache mount exited ({st}) before mounting:\n{}", m.log_text()));
            }
            if t0.elapsed() > MOUNT_WAIT {
                return Err(format!("not mounted after {MOUNT_WAIT:?}:\n{}", m.log_text()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The daemon prints one line once the mount is live.
        let line = m.first_line();
        if !line.starts_with("farcache mounted ") {
            return Err(format!("unexpected first line {line:?}:\n{}", m.log_text()));
        }
        Ok(m)
    }

    /// Start `farcache mount BACKING MNT ARGS... --takeover` against the daemon serving
    /// `mnt`, and wait for its line on stdout (`farcache mounted ... (taken over)`). `Err`
    /// with the log when it exits first (a refused takeover). The caller bounds the time
    /// (the daemon answers or exits within the takeover's own timeouts).
    pub fn try_takeover(
        bin: &Path,
        backing: &Path,
        mnt: &Path,
        args: &[&str],
        log: &Path,
    ) -> Result<MountProcess, String> {
        let args: Vec<&str> = args.iter().copied().chain(["--takeover"]).collect();
        let m = Self::spawn(bin, backing, mnt, &args, &[], log, false)?;
        let line = m.first_line();
        if !line.starts_with("farcache mounted ") {
            let code = m.wait_exit_timeout(EXIT_WAIT);
            return Err(format!("takeover failed (exit {code:?}), first line {line:?}:\n{}", m.log_text()));
        }
        m.owns_mount.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(m)
    }

    /// Spawn `farcache mount BACKING MNT ARGS...` (stdout piped, stderr to `log`); `owns`:
    /// whether dropping it unmounts `mnt`.
    fn spawn(
        bin: &Path,
        backing: &Path,
        mnt: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
        owns: bool,
    ) -> Result<MountProcess, String> {
        let mut cmd = Command::new(bin);
        cmd.arg("mount").arg(backing).arg(mnt).args(args).envs(env.iter().copied());
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(File::create(log).map_err(|e| format!("{e}"))?);
        let child = cmd.spawn().map_err(|e| format!("cannot spawn farcache mount {}: {e}", args.join(" ")))?;
        Ok(MountProcess {
            backing: backing.to_path_buf(),
            mnt: mnt.to_path_buf(),
            log: log.to_path_buf(),
            child: Mutex::new(child),
            owns_mount: std::sync::atomic::AtomicBool::new(owns),
        })
    }

    /// The daemon's first line on stdout ("" if it closed stdout first).
    fn first_line(&self) -> String {
        let mut line = String::new();
        let mut child = self.child.lock().unwrap();
        let _ = BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line);
        line
    }

    /// The mount now belongs to another daemon: dropping this one must not unmount it.
    pub fn release_mount(&self) {
        self.owns_mount.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// The pids of this process's children (for `--supervise`: the daemon it runs).
    pub fn children(&self) -> Vec<u32> {
        let pid = self.pid();
        let mut out = Vec::new();
        if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                let c = fs::read_to_string(t.path().join("children")).unwrap_or_default();
                out.extend(c.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
        out
    }

    pub fn mnt(&self) -> &Path {
        &self.mnt
    }
    pub fn backing(&self) -> &Path {
        &self.backing
    }
    /// A path under the mount point.
    pub fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }
    /// A path under the backing directory.
    pub fn b(&self, rel: &str) -> PathBuf {
        self.backing.join(rel)
    }
    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap().id()
    }
    /// The daemon's stderr so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Send `sig` to the daemon.
    pub fn signal(&self, sig: libc::c_int) {
        let mut child = self.child.lock().unwrap();
        if child.try_wait().ok().flatten().is_none() {
            // SAFETY: kill(2) on our own child, not reaped (we hold the lock that reaping needs).
            unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        }
    }

    /// Stop the daemon (SIGSTOP) and wait, up to five seconds, until every one of its threads
    /// is stopped: a signal reaches a busy machine's threads when each is next scheduled, and
    /// a request sent just after `signal(SIGSTOP)` returned was answered by a thread still
    /// running (a fresh-clone CI run on two loaded CPUs, session 68). Panics if they do not
    /// all stop.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
        let pid = self.pid();
        let stopped = crate::wait_until(Duration::from_secs(5), Duration::from_millis(1), || {
            crate::process::all_threads_stopped(pid)
        });
        assert!(stopped, "daemon {pid}'s threads not all stopped 5 s after SIGSTOP:\n{}", self.log_text());
    }

    /// Wait up to [`EXIT_WAIT`] for the daemon to exit; its exit code (-1 if killed by a
    /// signal). Panics with the log if it does not exit.
    pub fn wait_exit(&self) -> i32 {
        match self.wait_exit_timeout(EXIT_WAIT) {
            Some(code) => code,
            None => panic!("daemon still running after {EXIT_WAIT:?}:\n{}", self.log_text()),
        }
    }

    /// Wait up to `timeout` for the daemon to exit; its exit code (-1 if killed by a
    /// signal), or `None` if it is still running.
    pub fn wait_exit_timeout(&self, timeout: Duration) -> Option<i32> {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.lock().unwrap_or_else(|e| e.into_inner()).try_wait().ok().flatten() {
                return Some(st.code().unwrap_or(-1));
            }
            if t0.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, wait for a clean exit (code 0), and return the daemon's log.
    pub fn stop(&self) -> String {
        self.signal(libc::SIGTERM);
        let code = self.wait_exit();
        let log = self.log_text();
        assert_eq!(code, 0, "farcache mount exited with {code} after SIGTERM:\n{log}");
        assert!(!fuse_mounted(&self.mnt), "still mounted after the daemon exited");
        log
    }
}

impl Drop for MountProcess {
    fn drop(&mut self) {
        if self.owns_mount.load(std::sync::atomic::Ordering::SeqCst) && fuse_mounted(&self.mnt) {
            let ok = Command::new("fusermount3").arg("-u").arg(&self.mnt).status().is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.mnt).status();
            }
        }
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let t0 = Instant::now();
        while child.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- farcache mount log ({}) ---\n{}", self.log.display(), self.log_text());
        }
    }
}

/// Reads with `O_DIRECT` through a mount (4 KiB ones, or up to the capacity it was opened
/// with), into an aligned buffer: every read reaches the daemon (none is answered by the local
/// page cache). Any I/O error fails the test.
pub struct DirectReader {
    file: File,
    buf: AlignedBuf,
}

/// A buffer of `len` bytes aligned to 4 KiB, as `O_DIRECT` reads and writes want.
pub struct AlignedBuf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes.
    pub fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + 4096];
        let off = raw.as_ptr().align_offset(4096);
        AlignedBuf { raw, off, len }
    }

    /// All of it.
    pub fn buf(&mut self) -> &mut [u8] {
        self.get(self.len)
    }

    /// Its first `len` bytes (at most its length).
    pub fn get(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.len, "{len} bytes asked of an aligned buffer of {}", self.len);
        &mut self.raw[self.off..self.off + len]
    }
}

impl DirectReader {
    pub fn open(p: &Path) -> DirectReader {
        DirectReader::with_capacity(p, 4096)
    }

    /// For reads of up to `capacity` bytes (a multiple of 4 KiB).
    pub fn with_capacity(p: &Path, capacity: usize) -> DirectReader {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(p)
            .unwrap_or_else(|e| panic!("open {} with O_DIRECT: {e}", p.display()));
        assert!(capacity > 0 && capacity.is_multiple_of(4096), "a direct read's buffer is whole 4 KiB blocks");
        DirectReader { file, buf: AlignedBuf::new(capacity) }
    }

    /// The 4 KiB at `offset` (fewer at the end of the file).
    pub fn read(&mut self, offset: u64) -> &[u8] {
        self.read_len(offset, 4096)
    }

    /// The `len` bytes at `offset` (fewer at the end of the file); `len` a multiple of 4 KiB
    /// up to the capacity.
    pub fn read_len(&mut self, offset: u64, len: usize) -> &[u8] {
        use std::os::unix::fs::FileExt;
        let b = self.buf.get(len);
        let n = self.file.read_at(b, offset).unwrap_or_else(|e| panic!("read at {offset} through the mount: {e}"));
        &b[..n]
    }

    /// Read every block in `order`, checking each against `data` (the file's contents).
    pub fn pass(&mut self, order: &[u64], data: &[u8]) {
        for &b in order {
            let o = (b * 4096) as usize;
            assert_eq!(self.read(b * 4096), &data[o..o + 4096], "block {b}");
        }
    }
}

/// Create `path` with `O_DIRECT`, write `len` bytes of 0x5a from an aligned buffer, and read
/// them back through the same descriptor (also `O_DIRECT`, from offset 0): what came back.
/// `len` must be a multiple of 4 KiB. Any I/O error fails the test.
pub fn o_direct_write_then_read(path: &Path, len: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::OpenOptionsExt;
    assert!(len > 0 && len.is_multiple_of(4096), "O_DIRECT needs whole 4 KiB blocks, not {len} bytes");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("open {} with O_DIRECT: {e}", path.display()));
    let mut buf = AlignedBuf::new(len);
    let ab = buf.buf();
    ab.fill(0x5a);
    f.write_all(ab).unwrap_or_else(|e| panic!("O_DIRECT write to {}: {e}", path.display()));
    ab.fill(0);
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(ab).unwrap_or_else(|e| panic!("O_DIRECT read of {}: {e}", path.display()));
    ab.to_vec()
}

/// Aborts the FUSE connection of `mnt` if the test is still running after `bound`.
pub struct Watchdog {
    done: Arc<AtomicBool>,
}

impl Watchdog {
    pub fn start(mnt: &Path, bound: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let minor = fuse_minor(mnt).expect("the mount is in mountinfo");
        let d = done.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while t0.elapsed() < bound {
                if d.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!("watchdog: test still running after {bound:?}: aborting FUSE connection {minor}");
            let conns = Path::new("/sys/fs/fuse/connections");
            if fs::read_dir(conns).map(|mut d| d.next().is_none()).unwrap_or(true) {
                let _ = std::process::Command::new("mount").args(["-t", "fusectl", "none"]).arg(conns).status();
            }
            let _ = fs::write(conns.join(minor.to_string()).join("abort"), "1");
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// The device minor of the FUSE mount on `mnt` (its fusectl connection number).
pub fn fuse_minor(mnt: &Path) -> Option<u32> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mnt.to_str()?;
    info.lines().rfind(|l| l.split(' ').nth(4) == Some(want))?.split(' ').nth(2)?.split(':').nth(1)?.parse().ok()
}
