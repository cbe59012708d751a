//! The testbed on one machine, out of real kernel mechanisms (../shared/TESTBED.md):
//!
//! - a slow disk: a sparse file under [`WORK_BASE`], attached to a loop device with
//!   `losetup --direct-io=on` (the loop driver reads its file with O_DIRECT, so the host's
//!   page cache is not a second cache), formatted ext4 (inode tables written up front, no
//!   background `ext4lazyinit` writes) and mounted `noatime`; its IOPS and bandwidth capped
//!   by blkio v1 throttling in a cgroup that every process of the client joins;
//! - lenders' links: one network namespace per lender, a veth pair, TBF on both ends.
//!
//! Every name carries the run's prefix `fcb-<harness pid, hex>`. Each step pushes its undo
//! onto a stack that [`Drop`] runs in reverse: on success, on error (`?` unwinds through
//! here), on panic, and after SIGINT/SIGTERM (the waits see the flag and return errors).
//! [`super::cleanup`] removes what a killed run left.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cgroup::Cgroup;
use super::child::Child;
use super::sys;
use super::worker::{fill_block, AlignedBuf, BLOCK};
use crate::error::IoContext;
use crate::{BenchError, Result};

/// Where run directories (disk image, mount points, logs) live: on the real disk, not tmpfs.
pub const WORK_BASE: &str = "/var/tmp/farcache-bench";
/// Every name the harness creates starts with this.
pub const PREFIX: &str = "fcb-";
/// The port lenders listen on inside their namespaces.
const LENDER_PORT: u16 = 7411;
const MIB: u64 = 1 << 20;
/// Runs whose logs are kept under `WORK_BASE/logs`.
pub const LOG_RUNS_KEPT: usize = 5;

/// How slow the emulated disk is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskProfile {
    /// A cloud block volume: 3000 IOPS, 125 MB/s (the default).
    Cloud,
    /// A 7200 rpm disk: 200 IOPS, 150 MB/s (the paper's environment B).
    Hdd,
    /// The loop device with no cap (the host caches the virtual disk: fast).
    Raw,
    /// A SATA SSD: 20,000 IOPS, 500 MB/s (paper 003's block device, behind the tier).
    Ssd,
}

impl DiskProfile {
    /// (IOPS, bytes/s) for reads and writes alike, or none.
    pub fn limits(self) -> Option<(u64, u64)> {
        match self {
            DiskProfile::Cloud => Some((3000, 125_000_000)),
            DiskProfile::Hdd => Some((200, 150_000_000)),
            DiskProfile::Raw => None,
            DiskProfile::Ssd => Some((20_000, 500_000_000)),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DiskProfile::Cloud => "cloud",
            DiskProfile::Hdd => "hdd",
            DiskProfile::Raw => "raw",
            DiskProfile::Ssd => "ssd",
        }
    }

    pub fn describe(self) -> String {
        match self.limits() {
            Some((iops, bps)) => format!("{} ({iops} IOPS, {} MB/s)", self.name(), bps / 1_000_000),
            None => "raw (no cap)".into(),
        }
    }
}

impl std::str::FromStr for DiskProfile {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cloud" => Ok(DiskProfile::Cloud),
            "hdd" => Ok(DiskProfile::Hdd),
            "raw" => Ok(DiskProfile::Raw),
            "ssd" => Ok(DiskProfile::Ssd),
            _ => Err(format!("unknown disk profile {s:?}: cloud, hdd, ssd or raw")),
        }
    }
}

/// What to build.
#[derive(Clone, Debug)]
pub struct TestbedSpec {
    /// The `farcache` binary (lenders run it as `farcache server`).
    pub exe: PathBuf,
    /// Size of the ext4 file system on the loop device.
    pub disk_bytes: u64,
    pub profile: DiskProfile,
    pub lenders: usize,
    /// TBF rate of every lender's link, as tc writes it ("1gbit", "10gbit"), or none.
    pub link_rate: Option<String>,
    /// The CPUs the lenders run on (`--client-cpus`: those the client does not); `None`: any.
    pub lender_cpus: Option<std::ops::Range<u32>>,
}

/// One lender's network: a namespace and the host end of its veth.
#[derive(Clone, Debug)]
pub struct LenderNet {
    pub netns: String,
    pub host_if: String,
    pub addr: std::net::SocketAddr,
}

type UndoFn = Box<dyn FnOnce() -> std::result::Result<(), String>>;

pub struct Testbed {
    pub prefix: String,
    pub dir: PathBuf,
    pub loopdev: String,
    /// "MAJ:MIN" of the loop device.
    pub devno: String,
    /// Where the ext4 file system is mounted (the backing directory).
    pub ext4: PathBuf,
    /// The FUSE mount point.
    pub mnt: PathBuf,
    pub blkio: Cgroup,
    /// `/sys/dev/block/MAJ:MIN/stat` of the machine's disk that holds the loop device's image
    /// (its reads and writes, everyone's: see [`DiskStat::other_bytes`]).
    pub host_disk_stat: Option<PathBuf>,
    pub nets: Vec<LenderNet>,
    pub spec: TestbedSpec,
    /// Logs of every child, kept after the run (the newest [`LOG_RUNS_KEPT`] runs).
    pub logs: PathBuf,
    undo: Vec<(String, UndoFn)>,
    cgroups_made: u32,
}

impl Testbed {
    /// The prefix of this process's run.
    pub fn own_prefix() -> String {
        format!("{PREFIX}{:x}", std::process::id())
    }

    /// Build the whole testbed; on any error, what was built is torn down before returning.
    pub fn create(spec: TestbedSpec) -> Result<Testbed> {
        if !sys::is_root() {
            return Err(BenchError::Setup(
                "farcache bench paper needs root: it attaches loop devices, mounts file systems, creates \
                 cgroups and network namespaces"
                    .into(),
            ));
        }
        let prefix = Self::own_prefix();
        let dir = Path::new(WORK_BASE).join(&prefix);
        // A partly built testbed: its Drop undoes what was done if a later step fails.
        let mut tb = Testbed {
            prefix: prefix.clone(),
            dir: dir.clone(),
            loopdev: String::new(),
            devno: String::new(),
            ext4: dir.join("ext4"),
            mnt: dir.join("mnt"),
            blkio: Cgroup::create("blkio", &prefix)?,
            host_disk_stat: None,
            nets: Vec::new(),
            spec: spec.clone(),
            logs: Path::new(WORK_BASE).join("logs").join(&prefix),
            undo: Vec::new(),
            cgroups_made: 0,
        };
        std::fs::create_dir_all(&tb.ext4).ctx(|| format!("create {}", tb.ext4.display()))?;
        std::fs::create_dir_all(&tb.mnt).ctx(|| format!("create {}", tb.mnt.display()))?;
        prune_logs();
        std::fs::create_dir_all(&tb.logs).ctx(|| format!("create {}", tb.logs.display()))?;
        let d = dir.clone();
        tb.push("remove the run directory", move || std::fs::remove_dir_all(&d).map_err(|e| e.to_string()));

        // The slow disk.
        let image = dir.join("disk.img");
        let f = std::fs::File::create(&image).ctx(|| format!("create {}", image.display()))?;
        f.set_len(spec.disk_bytes).ctx(|| format!("size {}", image.display()))?;
        drop(f);
        let img = image.to_string_lossy().to_string();
        tb.loopdev = sys::run("losetup", &["--direct-io=on", "--show", "-f", &img])?.trim().to_string();
        let dev = tb.loopdev.clone();
        tb.push("detach the loop device", move || sys::run_quiet("losetup", &["-d", &dev]));
        let name = tb.loopdev.trim_start_matches("/dev/").to_string();
        let dio = std::fs::read_to_string(format!("/sys/block/{name}/loop/dio")).unwrap_or_default();
        if dio.trim() != "1" {
            return Err(BenchError::Setup(format!(
                "{} did not switch to direct I/O (loop/dio = {dio:?}): its reads would hit the host's page cache",
                tb.loopdev
            )));
        }
        tb.host_disk_stat = host_disk_of(&image);
        tb.devno = std::fs::read_to_string(format!("/sys/block/{name}/dev"))
            .ctx(|| format!("read the device number of {}", tb.loopdev))?
            .trim()
            .to_string();
        sys::run("mkfs.ext4", &["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", &tb.loopdev])?;
        tb.mount_ext4()?;
        let (dev, mnt) = (tb.loopdev.clone(), tb.ext4.clone());
        tb.push("unmount ext4", move || unmount(&mnt, &dev));

        // The throttle: every client process joins this cgroup.
        if let Some((iops, bps)) = spec.profile.limits() {
            for (file, v) in [
                ("blkio.throttle.read_iops_device", iops),
                ("blkio.throttle.write_iops_device", iops),
                ("blkio.throttle.read_bps_device", bps),
                ("blkio.throttle.write_bps_device", bps),
            ] {
                tb.blkio.set(file, &format!("{} {v}", tb.devno))?;
            }
        }

        // Lenders' links.
        let subnet = free_subnet()?;
        for i in 0..spec.lenders {
            tb.add_lender_net(i, subnet)?;
        }
        Ok(tb)
    }

    fn push(&mut self, what: &str, f: impl FnOnce() -> std::result::Result<(), String> + 'static) {
        self.undo.push((what.to_string(), Box::new(f)));
    }

    fn mount_ext4(&self) -> Result<()> {
        let target = self.ext4.to_string_lossy().to_string();
        sys::run("mount", &["-t", "ext4", "-o", "noatime", &self.loopdev, &target]).map(|_| ())
    }

    /// Unmount and mount the ext4 file system again: every page of it leaves the page cache
    /// (whoever it was charged to), so the next pass starts cold — scoped to this disk,
    /// unlike the global `echo 3 > /proc/sys/vm/drop_caches`.
    ///
    /// Should anything else still hold the file system (a process in another mount namespace
    /// that copied the mount), its pages would survive: so every file's clean pages are also
    /// dropped with `POSIX_FADV_DONTNEED` after the remount, and [`cached_pages`] lets the
    /// caller check the result.
    pub fn remount(&self) -> Result<()> {
        let target = self.ext4.to_string_lossy().to_string();
        sys::run("sync", &[])?;
        sys::run("umount", &[&target])?;
        self.mount_ext4()?;
        drop_cached(&self.ext4);
        Ok(())
    }

    fn add_lender_net(&mut self, i: usize, subnet: u8) -> Result<()> {
        let netns = format!("{}-l{i}", self.prefix);
        let compact = self.prefix.replace('-', "");
        let host_if = format!("{compact}h{i}");
        let ns_if = format!("{compact}n{i}");
        let host_ip = format!("10.199.{subnet}.{}", 4 * i + 1);
        let ns_ip = format!("10.199.{subnet}.{}", 4 * i + 2);
        sys::run("ip", &["netns", "add", &netns])?;
        let (n, h) = (netns.clone(), host_if.clone());
        self.push("delete a lender's namespace and veth", move || {
            let a = sys::run_quiet("ip", &["netns", "del", &n]);
            // Deleting the namespace deletes its veth end and so the pair; this is a no-op
            // unless the pair was made and never moved.
            if std::path::Path::new(&format!("/sys/class/net/{h}")).exists() {
                sys::run_quiet("ip", &["link", "del", &h])?;
            }
            a
        });
        sys::run("ip", &["link", "add", &host_if, "type", "veth", "peer", "name", &ns_if])?;
        sys::run("ip", &["link", "set", &ns_if, "netns", &netns])?;
        sys::run("ip", &["addr", "add", &format!("{host_ip}/30"), "dev", &host_if])?;
        sys::run("ip", &["link", "set", &host_if, "up"])?;
        sys::run("ip", &["-n", &netns, "addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if])?;
        sys::run("ip", &["-n", &netns, "link", "set", &ns_if, "up"])?;
        sys::run("ip", &["-n", &netns, "link", "set", "lo", "up"])?;
        if let Some(rate) = &self.spec.link_rate {
            let burst = tbf_burst(rate);
            let args =
                ["qdisc", "replace", "dev", &host_if, "root", "tbf", "rate", rate, "burst", &burst, "latency", "1ms"];
            sys::run("tc", &args)?;
            // `tc -n`, not `ip netns exec`: see start_lenders.
            let mut ns_args = vec!["-n", &netns];
            ns_args.extend_from_slice(&args);
            ns_args[5] = &ns_if;
            sys::run("tc", &ns_args)?;
        }
        let addr = format!("{ns_ip}:{LENDER_PORT}").parse().expect("valid address");
        self.nets.push(LenderNet { netns, host_if, addr });
        Ok(())
    }

    /// A new memory cgroup for one configuration's client: `limit` bytes, or none.
    pub fn memory_cgroup(&mut self, limit: Option<u64>) -> Result<Cgroup> {
        self.cgroups_made += 1;
        let cg = Cgroup::create("memory", &format!("{}-c{}", self.prefix, self.cgroups_made))?;
        if let Some(l) = limit {
            cg.set("memory.limit_in_bytes", &l.to_string())?;
        }
        Ok(cg)
    }

    /// A new cpuacct cgroup beside a configuration's memory cgroup: the client's CPU time.
    pub fn cpu_cgroup(&mut self) -> Result<Cgroup> {
        Cgroup::create("cpuacct", &format!("{}-c{}", self.prefix, self.cgroups_made))
    }

    /// Start one `farcache server` per lender namespace, each lending `capacity` bytes.
    pub fn start_lenders(&self, capacity: u64, policy: Option<&str>) -> Result<Lenders> {
        if self.nets.is_empty() {
            return Err(BenchError::Setup(
                "a configuration with lenders on a testbed made without lender namespaces (a bug of the \
                 harness: the testbed's lender count comes from the configurations that borrow lenders)"
                    .into(),
            ));
        }
        let mut procs = Vec::new();
        for i in 0..self.nets.len() {
            procs.push(self.start_lender(i, capacity, policy, &[])?);
        }
        Ok(Lenders { procs, addrs: self.nets.iter().map(|n| n.addr).collect() })
    }

    /// Start the `farcache server` of lender namespace `i`, lending `capacity` bytes, with
    /// `extra` arguments (e.g. `--allocation mrc`); returns once it listens.
    pub fn start_lender(&self, i: usize, capacity: u64, policy: Option<&str>, extra: &[&str]) -> Result<Child> {
        let net = &self.nets[i];
        // nsenter --net, not `ip netns exec`: the latter also gives the process a private
        // copy of every mount of the machine (/ is private here), which pins this run's —
        // and any concurrent run's — ext4: its unmount would then not empty the page cache,
        // and cold starts would silently be warm.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", net.netns))
            .arg("--")
            .arg(&self.spec.exe)
            .args(["server", "--listen", &net.addr.to_string()])
            .arg("--capacity")
            .arg(format!("{}MiB", capacity / MIB))
            .args(extra)
            .env("FARCACHE_LOG", "warn");
        if let Some(p) = policy {
            cmd.args(["--policy", p]);
        }
        sys::confine(&mut cmd, &[]);
        if let Some(cpus) = &self.spec.lender_cpus {
            sys::pin_command(&mut cmd, cpus.clone());
        }
        let log = self.logs.join(format!("lender{i}-{}.log", self.cgroups_made));
        let mut c = Child::spawn(&format!("lender {i}"), cmd, &log, false)?;
        let line = c.next_line(Duration::from_secs(30))?;
        if !line.starts_with("farcache server listening on") {
            return Err(BenchError::Setup(format!("lender {i} said {line:?}; log:\n{}", c.log_tail())));
        }
        if let Some(cpus) = &self.spec.lender_cpus {
            sys::check_pinned(c.pid(), &format!("lender {i}"), cpus.clone())?;
        }
        Ok(c)
    }

    /// The test file of `size` bytes in the ext4 file system, made on first use. Written
    /// with O_DIRECT by the harness (outside the client's cgroups: not throttled, and none
    /// of it left in the page cache). Block b's bytes are [`fill_block`]`(b)`, which the
    /// load generator checks.
    pub fn ensure_file(&self, size: u64) -> Result<String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let name = format!("data-{}MiB.bin", size / MIB);
        let path = self.ext4.join(&name);
        if path.metadata().map(|m| m.len() == size).unwrap_or(false) {
            return Ok(name);
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .ctx(|| format!("create {}", path.display()))?;
        const CHUNK: usize = 1 << 20;
        let mut buf = AlignedBuf::new(CHUNK);
        let mut done = 0u64;
        while done < size {
            sys::check_interrupt()?;
            let n = CHUNK.min((size - done) as usize);
            for (i, blk) in buf.as_mut_slice()[..n].chunks_mut(BLOCK).enumerate() {
                fill_block(done / BLOCK as u64 + i as u64, blk);
            }
            f.write_all(&buf.as_mut_slice()[..n]).ctx(|| format!("write {}", path.display()))?;
            done += n as u64;
        }
        f.sync_all().ctx(|| format!("fsync {}", path.display()))?;
        Ok(name)
    }

    /// A second slow disk (paper 001's two HDDs): another loop device of `bytes` with its own
    /// ext4, mounted at `dir/<tag>`, throttled like the first in the same blkio cgroup;
    /// torn down with the testbed.
    pub fn add_disk(&mut self, tag: &str, bytes: u64) -> Result<ExtraDisk> {
        let dir = self.dir.join(tag);
        std::fs::create_dir_all(&dir).ctx(|| format!("create {}", dir.display()))?;
        let image = self.dir.join(format!("{tag}.img"));
        let f = std::fs::File::create(&image).ctx(|| format!("create {}", image.display()))?;
        f.set_len(bytes).ctx(|| format!("size {}", image.display()))?;
        drop(f);
        let img = image.to_string_lossy().to_string();
        let loopdev = sys::run("losetup", &["--direct-io=on", "--show", "-f", &img])?.trim().to_string();
        let dev = loopdev.clone();
        self.push("detach the second loop device", move || sys::run_quiet("losetup", &["-d", &dev]));
        let name = loopdev.trim_start_matches("/dev/").to_string();
        let devno = std::fs::read_to_string(format!("/sys/block/{name}/dev"))
            .ctx(|| format!("read the device number of {loopdev}"))?
            .trim()
            .to_string();
        sys::run("mkfs.ext4", &["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", &loopdev])?;
        let d = ExtraDisk { loopdev, devno, dir };
        d.mount()?;
        let (dev, mnt) = (d.loopdev.clone(), d.dir.clone());
        self.push("unmount the second ext4", move || unmount(&mnt, &dev));
        if let Some((iops, bps)) = self.spec.profile.limits() {
            for (file, v) in [
                ("blkio.throttle.read_iops_device", iops),
                ("blkio.throttle.write_iops_device", iops),
                ("blkio.throttle.read_bps_device", bps),
                ("blkio.throttle.write_bps_device", bps),
            ] {
                self.blkio.set(file, &format!("{} {v}", d.devno))?;
            }
        }
        Ok(d)
    }

    /// Reads and writes the loop device has served so far, and the bytes the machine's disk
    /// under it has moved for anyone.
    ///
    /// With it, a check of the disk's own speed ([`disk_check_us`]), so that an interval
    /// ([`DiskStat::since`]) knows how fast the disk was at its start and at its end.
    pub fn disk_stat(&self) -> DiskStat {
        let mut d = disk_stat_of(&self.loopdev);
        if let Some(p) = &self.host_disk_stat {
            let (r, w) = stat_bytes(&std::fs::read_to_string(p).unwrap_or_default());
            d.host_bytes = r + w;
        }
        let check = disk_check_us(Path::new(&self.loopdev), DISK_CHECK_READS, DISK_CHECK_LIMIT);
        (d.check_before_us, d.check_after_us) = (check, check);
        let cpu = cpu_check_us();
        (d.cpu_check_before_us, d.cpu_check_after_us) = (cpu, cpu);
        (d.cpu_ticks, d.steal_ticks) = cpu_and_steal_ticks(&std::fs::read_to_string("/proc/stat").unwrap_or_default());
        d
    }
}

/// A disk made by [`Testbed::add_disk`].
#[derive(Clone, Debug)]
pub struct ExtraDisk {
    pub loopdev: String,
    /// "MAJ:MIN".
    pub devno: String,
    /// Where its ext4 is mounted.
    pub dir: PathBuf,
}

impl ExtraDisk {
    fn mount(&self) -> Result<()> {
        let target = self.dir.to_string_lossy().to_string();
        sys::run("mount", &["-t", "ext4", "-o", "noatime", &self.loopdev, &target]).map(|_| ())
    }

    /// Unmount and mount again: nothing of it stays in the page cache ([`Testbed::remount`]).
    pub fn remount(&self) -> Result<()> {
        let target = self.dir.to_string_lossy().to_string();
        sys::run("sync", &[])?;
        sys::run("umount", &[&target])?;
        self.mount()?;
        drop_cached(&self.dir);
        Ok(())
    }
}

/// Reads and writes block device `dev` (`/dev/loopN`) has served so far.
pub fn disk_stat_of(dev: &str) -> DiskStat {
    let name = dev.trim_start_matches("/dev/");
    let g = stat_fields(&std::fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap_or_default());
    DiskStat { read_ios: g(0), read_bytes: g(2) * 512, write_ios: g(4), write_bytes: g(6) * 512, ..DiskStat::default() }
}

/// Two disk checks this far apart (slowest ÷ fastest) say the disk's speed moved: the log
/// warns, and scripts/nothing-slower-table.py marks the ratio (§).
pub const DISK_CHECK_SPREAD: f64 = 1.3;
/// A share of the machine's CPU time stolen by the hypervisor above which an interval is
/// flagged ([`DiskStat::steal_share`]): the log warns, and scripts/nothing-slower-table.py
/// marks the ratio.
pub const STEAL_FLAG: f64 = 0.05;
/// Two CPU checks this far apart (slowest ÷ fastest) say the machine's CPU ran at different
/// speeds ([`cpu_check_us`]): the log warns, and scripts/nothing-slower-table.py marks the
/// ratio.
pub const CPU_CHECK_SPREAD: f64 = 1.2;
/// Runs of a CPU check's loop ([`cpu_check_us`]; the median is its reading), and the steps of
/// each (about 0.7 ms on this machine: the check takes a few ms of one CPU).
pub const CPU_CHECK_RUNS: usize = 5;
pub const CPU_CHECK_STEPS: u64 = 300_000;
/// Reads of a disk check ([`disk_check_us`]), and its bound in time.
pub const DISK_CHECK_READS: u32 = 400;
pub const DISK_CHECK_LIMIT: Duration = Duration::from_millis(300);

/// The disk's own speed, now: the mean µs of up to `reads` 4 KiB `O_DIRECT` reads at random
/// offsets of `dev`, one at a time, for at most `limit` — by the harness, outside the
/// client's cgroups, so a profile's throttle does not apply and the loop device's direct
/// I/O reaches the machine's disk. On a shared machine that disk's speed moves with what
/// other machines do to it (4 KiB reads of the raw disk at 75 µs in session 16 and 150–300 µs
/// in session 17, and in session 17 a passthrough's second pass at 14 s and 32 s within 25
/// minutes), which no count on this machine sees; two configurations measured at different
/// speeds are not comparable. 0.0 when it cannot read (no device, or a file system that
/// refuses `O_DIRECT`).
pub fn disk_check_us(dev: &Path, reads: u32, limit: Duration) -> f64 {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let Ok(f) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(dev) else {
        return 0.0;
    };
    let size = {
        use std::io::Seek;
        let mut g = &f;
        g.seek(std::io::SeekFrom::End(0)).unwrap_or(0)
    };
    let blocks = size / BLOCK as u64;
    if blocks == 0 {
        return 0.0;
    }
    let mut buf = AlignedBuf::new(BLOCK);
    // A new sequence each check: offsets spread over the device, not what a read cache holds.
    let mut rng = crate::rng::Rng::new(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
    );
    let (start, mut total, mut n) = (std::time::Instant::now(), Duration::ZERO, 0u32);
    while n < reads && start.elapsed() < limit {
        let off = rng.below(blocks) * BLOCK as u64;
        let t = std::time::Instant::now();
        if f.read_at(&mut buf.as_mut_slice()[..BLOCK], off).is_err() {
            return 0.0;
        }
        total += t.elapsed();
        n += 1;
    }
    if n == 0 {
        0.0
    } else {
        total.as_secs_f64() * 1e6 / n as f64
    }
}

/// Field `i` of a block device's `stat` file (0 where absent): reads, reads merged, sectors
/// read, ms reading, writes, writes merged, sectors written, …
fn stat_fields(text: &str) -> impl Fn(usize) -> u64 {
    let f: Vec<u64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    move |i| f.get(i).copied().unwrap_or(0)
}

/// The machine's CPU speed, now: the median µs of [`CPU_CHECK_RUNS`] runs of a fixed loop of
/// [`CPU_CHECK_STEPS`] dependent integer steps (xorshift), on the calling thread. A shared
/// virtual machine's vCPUs run slower while other guests load the host's cores (a sibling
/// hyperthread, shared caches), and /proc/stat's steal does not count that: measured in
/// session 48's table, pgbench at one client did 26% fewer transactions in one passthrough
/// run than in another with the same CPU time consumed and no steal in either. Two
/// configurations measured at different CPU speeds are not comparable; with the check at
/// each measurement's start and end ([`Testbed::disk_stat`]), the table can say which were.
pub fn cpu_check_us() -> f64 {
    let mut runs = [0.0f64; CPU_CHECK_RUNS];
    for r in runs.iter_mut() {
        let t = std::time::Instant::now();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..std::hint::black_box(CPU_CHECK_STEPS) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        std::hint::black_box(x);
        *r = t.elapsed().as_secs_f64() * 1e6;
    }
    runs.sort_by(f64::total_cmp);
    runs[CPU_CHECK_RUNS / 2]
}

/// All CPU time and the part stolen, in clock ticks, from `/proc/stat`'s first line (`cpu
/// user nice system idle iowait irq softirq steal guest guest_nice`; guest time is already
/// in user time). (0, 0) when it is not there.
fn cpu_and_steal_ticks(proc_stat: &str) -> (u64, u64) {
    let (all, _, steal) = cpu_idle_steal_ticks(proc_stat);
    (all, steal)
}

/// All CPU time, the idle part (idle and iowait) and the part stolen, in clock ticks, from
/// `/proc/stat`'s first line. Zeros when it is not there.
pub(crate) fn cpu_idle_steal_ticks(proc_stat: &str) -> (u64, u64, u64) {
    let Some(line) = proc_stat.lines().find(|l| l.starts_with("cpu ")) else { return (0, 0, 0) };
    let g = stat_fields(line);
    ((0..8).map(&g).sum(), g(3) + g(4), g(7))
}

/// Bytes read and written, from a block device's `stat` file (sectors of 512 bytes).
fn stat_bytes(text: &str) -> (u64, u64) {
    let g = stat_fields(text);
    (g(2) * 512, g(6) * 512)
}

/// The `stat` file of the block device (a disk or a partition) that holds `path`, if the
/// file system is on one (not on tmpfs or overlay).
fn host_disk_of(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let p = PathBuf::from(format!("/sys/dev/block/{}:{}/stat", libc::major(dev), libc::minor(dev)));
    p.exists().then_some(p)
}

impl Drop for Testbed {
    fn drop(&mut self) {
        while let Some((what, f)) = self.undo.pop() {
            if let Err(e) = f() {
                note!("paper: warning: could not {what}: {e}");
            }
        }
        if let Err(e) = self.blkio.remove() {
            note!("paper: warning: {e}");
        }
    }
}

/// What the loop device served, from /sys/block/loopN/stat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DiskStat {
    pub read_ios: u64,
    pub read_bytes: u64,
    pub write_ios: u64,
    pub write_bytes: u64,
    /// Bytes read and written on the machine's disk that holds the loop device's image, by
    /// everyone (0 where the image is not on a block device). The loop device reads and
    /// writes its image with O_DIRECT, so its own bytes are in this too.
    #[serde(default)]
    pub host_bytes: u64,
    /// The disk's own speed ([`disk_check_us`]) when the interval began and when it ended (a
    /// single reading: both the same). 0.0: not measured.
    #[serde(default)]
    pub check_before_us: f64,
    #[serde(default)]
    pub check_after_us: f64,
    /// The machine's CPU time so far (`/proc/stat`, every CPU, in clock ticks) and the part
    /// of it the hypervisor gave to other machines (*steal*): over an interval, their
    /// differences. A shared virtual machine's vCPUs are taken away while other guests run
    /// (session 18: 17% of this machine's CPU time over 10 s of a benchmark), and every
    /// wake-up of the mount's hit path waits for a vCPU; no count of the benchmark's own
    /// processes sees that.
    #[serde(default)]
    pub cpu_ticks: u64,
    #[serde(default)]
    pub steal_ticks: u64,
    /// The machine's CPU speed ([`cpu_check_us`]) when the interval began and when it ended
    /// (a single reading: both the same). 0.0: not measured.
    #[serde(default)]
    pub cpu_check_before_us: f64,
    #[serde(default)]
    pub cpu_check_after_us: f64,
}

/// Other traffic on the machine's disk beyond which a measurement is flagged: the loop
/// device's throttle caps its own I/O, not what else the machine does to the disk under it
/// (a build writing gigabytes, a copy), and the `raw` profile's disk *is* that disk. Flagged
/// when both this much and [`OTHER_IO_FLAG_RATE`] on average: a build's few MB/s of object
/// files beside a 30 s run do not show in it, a copy of a target directory (a gigabyte a
/// second) does.
pub const OTHER_IO_FLAG_BYTES: u64 = 64 << 20;
/// See [`OTHER_IO_FLAG_BYTES`]: bytes per second.
pub const OTHER_IO_FLAG_RATE: f64 = (16u64 << 20) as f64;

impl DiskStat {
    pub fn since(&self, e: &DiskStat) -> DiskStat {
        DiskStat {
            read_ios: self.read_ios.saturating_sub(e.read_ios),
            read_bytes: self.read_bytes.saturating_sub(e.read_bytes),
            write_ios: self.write_ios.saturating_sub(e.write_ios),
            write_bytes: self.write_bytes.saturating_sub(e.write_bytes),
            host_bytes: self.host_bytes.saturating_sub(e.host_bytes),
            check_before_us: e.check_after_us,
            check_after_us: self.check_after_us,
            cpu_ticks: self.cpu_ticks.saturating_sub(e.cpu_ticks),
            steal_ticks: self.steal_ticks.saturating_sub(e.steal_ticks),
            cpu_check_before_us: e.cpu_check_after_us,
            cpu_check_after_us: self.cpu_check_after_us,
        }
    }

    /// Of an interval's CPU time, the share stolen by the hypervisor (0 to 1; 0 when not
    /// measured).
    pub fn steal_share(&self) -> f64 {
        if self.cpu_ticks == 0 {
            0.0
        } else {
            self.steal_ticks as f64 / self.cpu_ticks as f64
        }
    }

    /// Of an interval's bytes on the machine's disk, those that were not the loop device's:
    /// the rest of the machine competing with the measurement for the same disk.
    pub fn other_bytes(&self) -> u64 {
        self.host_bytes.saturating_sub(self.read_bytes + self.write_bytes)
    }

    /// Whether other traffic on the machine's disk during an interval of `secs` seconds
    /// passed [`OTHER_IO_FLAG_BYTES`] and [`OTHER_IO_FLAG_RATE`].
    pub fn other_io_flagged(&self, secs: f64) -> bool {
        let o = self.other_bytes();
        o > OTHER_IO_FLAG_BYTES && o as f64 > OTHER_IO_FLAG_RATE * secs
    }

    /// The log's warnings for an interval of `secs` seconds: other I/O on the machine's disk
    /// ([`Self::other_io_warning`]), a disk whose own speed moved by more than
    /// [`DISK_CHECK_SPREAD`] between the interval's start and end ([`disk_check_us`]), a CPU
    /// whose speed moved by more than [`CPU_CHECK_SPREAD`] ([`cpu_check_us`]), and steal past
    /// [`STEAL_FLAG`].
    pub fn warnings(&self, what: &str, secs: f64) -> Vec<String> {
        let mut w: Vec<String> = self.other_io_warning(what, secs).into_iter().collect();
        let (a, b) = (self.check_before_us, self.check_after_us);
        if a > 0.0 && b > 0.0 && a.max(b) > DISK_CHECK_SPREAD * a.min(b) {
            w.push(format!(
                "paper: warning: [{what}] the disk itself changed speed: 4 KiB direct reads took {a:.0} µs at the \
                 start and {b:.0} µs at the end (another machine's load on a shared disk?): its time is not \
                 comparable with the other configurations'"
            ));
        }
        let (a, b) = (self.cpu_check_before_us, self.cpu_check_after_us);
        if a > 0.0 && b > 0.0 && a.max(b) > CPU_CHECK_SPREAD * a.min(b) {
            w.push(format!(
                "paper: warning: [{what}] the machine's CPU changed speed: its check took {a:.0} µs at the start \
                 and {b:.0} µs at the end (other guests on the host's cores?): its time is not comparable with \
                 the other configurations'"
            ));
        }
        let steal = self.steal_share();
        if steal > STEAL_FLAG {
            w.push(format!(
                "paper: warning: [{what}] the hypervisor took {:.0}% of this machine's CPU time (steal): its \
                 time is not comparable with the other configurations'",
                steal * 100.0
            ));
        }
        w
    }

    /// A warning for the log when [`Self::other_io_flagged`].
    pub fn other_io_warning(&self, what: &str, secs: f64) -> Option<String> {
        let o = self.other_bytes();
        self.other_io_flagged(secs).then(|| {
            format!(
                "paper: warning: [{what}] {} MiB of other I/O on the machine's disk under the loop device \
                 in {secs:.0} s (a build, a copy?): its time is not comparable with the other configurations'",
                o >> 20
            )
        })
    }
}

/// Running lenders; stopped when dropped.
pub struct Lenders {
    pub procs: Vec<Child>,
    pub addrs: Vec<std::net::SocketAddr>,
}

impl Lenders {
    pub fn stop(&mut self) {
        for p in self.procs.iter_mut().rev() {
            p.stop();
        }
    }
}

/// Unmount `mnt` (the ext4 of `dev`), lazily if it stays busy.
pub fn unmount(mnt: &Path, dev: &str) -> std::result::Result<(), String> {
    let m = mnt.to_string_lossy().to_string();
    if !sys::mounts_under(mnt).iter().any(|(p, _)| p == &m) {
        return Ok(());
    }
    for _ in 0..20 {
        if sys::run_quiet("umount", &[&m]).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    sys::run_quiet("umount", &["-l", &m]).map_err(|e| format!("{e} (lazy unmount of {dev} failed too)"))
}

/// Drop the clean cached pages of every file under `dir` (posix_fadvise DONTNEED).
pub(super) fn drop_cached(dir: &Path) {
    use std::os::fd::AsRawFd;
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => drop_cached(&e.path()),
            Ok(t) if t.is_file() => {
                if let Ok(f) = std::fs::File::open(e.path()) {
                    // SAFETY: fadvise on a descriptor we own; it only drops clean cached pages.
                    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                }
            }
            _ => {}
        }
    }
}

/// How many pages of `path` are in the page cache now (mincore over a mapping of it).
pub fn cached_pages(path: &Path) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len() as usize;
    if len == 0 {
        return Some(0);
    }
    // SAFETY: a read-only shared mapping of a file we hold open, unmapped below; mincore
    // writes one byte per page into a vector of exactly that many bytes.
    unsafe {
        let addr = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        if addr == libc::MAP_FAILED {
            return None;
        }
        let pages = len.div_ceil(4096);
        let mut v = vec![0u8; pages];
        let rc = libc::mincore(addr, len, v.as_mut_ptr());
        libc::munmap(addr, len);
        (rc == 0).then(|| v.iter().filter(|b| **b & 1 == 1).count() as u64)
    }
}

/// Keep the logs of the newest runs only.
fn prune_logs() {
    let base = Path::new(WORK_BASE).join("logs");
    let mut runs: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&base)
        .map(|d| d.flatten().filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path()))).collect())
        .unwrap_or_default();
    runs.sort();
    let excess = (runs.len() + 1).saturating_sub(LOG_RUNS_KEPT);
    // Never the logs of a run still going (another user's, on a shared machine): its
    // harness reads its children's output back from them.
    let dead = runs
        .into_iter()
        .filter(|(_, p)| !p.file_name().map(|n| super::cleanup::live(&n.to_string_lossy())).unwrap_or(false));
    for (_, p) in dead.take(excess) {
        let _ = std::fs::remove_dir_all(p);
    }
}

/// TBF's bucket: at least 256 KiB (what TESTBED.md measured at 1 Gbit/s), and 1 ms of the
/// rate above that, so that fast links are not held back by timer granularity.
fn tbf_burst(rate: &str) -> String {
    let bits: f64 = {
        let r = rate.to_ascii_lowercase();
        let (num, mult) = if let Some(n) = r.strip_suffix("gbit") {
            (n, 1e9)
        } else if let Some(n) = r.strip_suffix("mbit") {
            (n, 1e6)
        } else if let Some(n) = r.strip_suffix("kbit") {
            (n, 1e3)
        } else {
            (r.as_str(), 1.0)
        };
        num.parse::<f64>().unwrap_or(1.0) * mult
    };
    let one_ms = (bits / 8.0 / 1000.0) as u64;
    format!("{}b", one_ms.max(256 << 10))
}

/// A /24 under 10.199.0.0/16 that no interface of the host uses, searched from one derived
/// from this process's pid, so that two runs started at once rarely pick the same one.
fn free_subnet() -> Result<u8> {
    let addrs = sys::run("ip", &["-o", "-4", "addr", "show"])?;
    let start = (std::process::id() % 256) as u16;
    (0..256u16)
        .map(|i| ((start + i) % 256) as u8)
        .find(|k| !addrs.contains(&format!("10.199.{k}.")))
        .ok_or_else(|| BenchError::Setup("no free /24 in 10.199.0.0/16 for the lenders' links".into()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn burst_scales_with_rate() {
        assert_eq!(super::tbf_burst("1gbit"), format!("{}b", 256 << 10));
        assert_eq!(super::tbf_burst("10gbit"), "1250000b");
        assert_eq!("hdd".parse::<super::DiskProfile>().unwrap().limits(), Some((200, 150_000_000)));
        assert_eq!("ssd".parse::<super::DiskProfile>().unwrap().limits(), Some((20_000, 500_000_000)));
        assert!("nvme".parse::<super::DiskProfile>().is_err());
    }

    #[test]
    fn other_io_is_the_machine_disk_beyond_the_loop_device() {
        use super::{DiskStat, OTHER_IO_FLAG_BYTES};
        // A stat line: reads, merged, sectors read, ms, writes, merged, sectors written, ...
        assert_eq!(super::stat_bytes("  10 0 80 5 4 0 16 1 0 3 6"), (80 * 512, 16 * 512));
        assert_eq!(super::stat_bytes(""), (0, 0));
        let at =
            |loop_read: u64, host: u64| DiskStat { read_bytes: loop_read, host_bytes: host, ..DiskStat::default() };
        // The loop device's own O_DIRECT reads are on the machine's disk too: not "other".
        let quiet = at(500 << 20, 1000 << 20).since(&at(0, 500 << 20));
        assert_eq!(quiet.other_bytes(), 0);
        assert!(quiet.other_io_warning("x", 1.0).is_none());
        // A build writing a gigabyte beside it is.
        let busy = at(500 << 20, 2524 << 20).since(&at(0, 500 << 20));
        assert_eq!(busy.other_bytes(), 1524 << 20);
        assert!(busy.other_bytes() > OTHER_IO_FLAG_BYTES);
        let w = busy.other_io_warning("randread 1GiB farcache pass 1", 19.0).unwrap();
        assert!(w.contains("1524 MiB") && w.contains("randread 1GiB farcache pass 1"), "{w}");
        // The same spread over 200 s (a build's object files beside a long run) is not.
        assert!(busy.other_io_warning("x", 200.0).is_none());
        // Where the image is not on a block device nothing is counted, nothing flagged.
        assert_eq!(at(500 << 20, 0).since(&at(0, 0)).other_bytes(), 0);
    }

    #[test]
    fn a_disk_check_times_direct_reads_and_an_interval_keeps_both_ends() {
        use super::{disk_check_us, DiskStat};
        use std::os::unix::fs::OpenOptionsExt;
        use std::time::Duration;
        // A file of 1 MiB where the harness keeps its disks (a real disk, unless /var/tmp is
        // a tmpfs, which refuses O_DIRECT: then the check must say "not measured").
        let path = std::path::Path::new("/var/tmp").join(format!("farcache-disk-check-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let direct = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path).is_ok();
        let us = disk_check_us(&path, 50, Duration::from_secs(5));
        let none = disk_check_us(std::path::Path::new("/nonexistent/disk"), 50, Duration::from_secs(5));
        let zero_reads = disk_check_us(&path, 0, Duration::from_secs(5));
        std::fs::remove_file(&path).unwrap();
        // Where the file system takes O_DIRECT, a positive mean (50 reads of 4 KiB: well under
        // the 5 s limit each); elsewhere 0.0.
        assert_eq!(us > 0.0, direct, "{us} µs, O_DIRECT {direct}");
        assert!(us < 5e6, "{us}");
        assert_eq!(none, 0.0, "no device: not measured");
        assert_eq!(zero_reads, 0.0);
        // An interval: the check at its start (the earlier reading's) and at its end.
        let at = |us: f64| DiskStat { check_before_us: us, check_after_us: us, ..DiskStat::default() };
        let d = at(300.0).since(&at(150.0));
        assert_eq!((d.check_before_us, d.check_after_us), (150.0, 300.0));
        let w = d.warnings("randread 1GiB farcache pass 2", 20.0);
        assert!(w.len() == 1 && w[0].contains("150 µs") && w[0].contains("300 µs"), "{w:?}");
        assert!(at(160.0).since(&at(150.0)).warnings("x", 20.0).is_empty(), "within the spread");
        assert!(at(160.0).since(&at(0.0)).warnings("x", 20.0).is_empty(), "not measured");
    }

    #[test]
    fn the_cpu_check_reads_the_cpus_speed_and_an_interval_flags_a_change() {
        use super::{cpu_check_us, DiskStat, CPU_CHECK_SPREAD};
        // A reading: positive, and a few ms at most on any machine that runs the tests (the
        // loop is 300,000 dependent steps; a CPU at 0.1 steps per ns takes 3 ms a run).
        let us = cpu_check_us();
        assert!(us > 0.0 && us < 100_000.0, "{us} µs");
        // An interval: the check at its start (the earlier reading's) and at its end.
        let at = |us: f64| DiskStat { cpu_check_before_us: us, cpu_check_after_us: us, ..DiskStat::default() };
        let d = at(900.0).since(&at(700.0));
        assert_eq!((d.cpu_check_before_us, d.cpu_check_after_us), (700.0, 900.0));
        let w = d.warnings("pgbench select-only 1 clients farcache", 30.0);
        assert!(w.len() == 1 && w[0].contains("CPU changed speed") && w[0].contains("700 µs"), "{w:?}");
        let within = 700.0 * CPU_CHECK_SPREAD * 0.99;
        assert!(at(within).since(&at(700.0)).warnings("x", 30.0).is_empty(), "within the spread");
        assert!(at(900.0).since(&at(0.0)).warnings("x", 30.0).is_empty(), "not measured");
        // Documents written before the check have none: read as not measured.
        let old: DiskStat =
            serde_json::from_str(r#"{"read_ios": 1, "read_bytes": 4096, "write_ios": 0, "write_bytes": 0}"#).unwrap();
        assert_eq!((old.cpu_check_before_us, old.cpu_check_after_us), (0.0, 0.0));
    }

    #[test]
    fn steal_is_read_from_proc_stat_and_flagged_over_an_interval() {
        use super::{cpu_and_steal_ticks, DiskStat, STEAL_FLAG};
        // /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice.
        let (cpu, steal) = cpu_and_steal_ticks("cpu  100 0 50 800 20 0 10 20 5 0\ncpu0 1 2 3\n");
        assert_eq!((cpu, steal), (1000, 20), "guest time is in user time already: not counted twice");
        assert_eq!(cpu_and_steal_ticks("nothing here"), (0, 0));
        assert_eq!(cpu_and_steal_ticks("cpu  100 0 50 800"), (950, 0), "an old kernel's line: no steal field");
        // This machine's own /proc/stat has the line, and time in it.
        let (cpu, steal) = cpu_and_steal_ticks(&std::fs::read_to_string("/proc/stat").unwrap());
        assert!(cpu > 0 && steal <= cpu, "{cpu} {steal}");
        // An interval: the differences, and a warning past STEAL_FLAG.
        let at = |cpu_ticks, steal_ticks| DiskStat { cpu_ticks, steal_ticks, ..DiskStat::default() };
        let d = at(3000, 340).since(&at(1000, 0));
        assert!((d.steal_share() - 0.17).abs() < 1e-9, "{}", d.steal_share());
        let w = d.warnings("randread 1GiB farcache pass 2", 20.0);
        assert!(w.len() == 1 && w[0].contains("17%"), "{w:?}");
        let quiet = at(3000, (2000.0 * STEAL_FLAG) as u64 / 2).since(&at(1000, 0));
        assert!(quiet.warnings("x", 20.0).is_empty());
        assert_eq!(at(0, 0).since(&at(0, 0)).steal_share(), 0.0, "not measured");
    }

    #[test]
    fn the_host_disk_of_a_file_on_a_block_device_is_found() {
        // /proc is not on a block device; the crate's own source usually is (not on tmpfs).
        assert!(super::host_disk_of(std::path::Path::new("/proc/self/stat")).is_none());
        if let Some(p) = super::host_disk_of(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))) {
            let (r, w) = super::stat_bytes(&std::fs::read_to_string(&p).unwrap());
            assert!(r + w > 0, "{}: a disk that holds a source tree has moved bytes", p.display());
        }
    }
}
