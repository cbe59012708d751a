//! Scratch space for tests: a directory with a backing directory and a mount point, and for
//! the write-back tier a tier file on tmpfs (`/dev/shm`, the `dram` mode), removed when
//! dropped (a [`TierScratch`] keeps its directory when the test panics, for its logs).

use std::path::{Path, PathBuf};

/// A tier file at [`fresh_tier_path`], removed on drop.
pub struct TierFile(PathBuf);

/// `/dev/shm/farcache-test-TAG-PID.tier`, with whatever an earlier run left there removed.
fn fresh_tier_path(tag: &str) -> PathBuf {
    let p = PathBuf::from(format!("/dev/shm/farcache-test-{tag}-{}.tier", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

impl TierFile {
    pub fn new(tag: &str) -> TierFile {
        TierFile(fresh_tier_path(tag))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The path as `--tier` takes it.
    pub fn arg(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Drop for TierFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `PARENT/TAG-PID` with `b/` (the backing directory) and `m/` (the mount point), plus a
/// tier file at [`fresh_tier_path`] of the same tag. `tier` may be pointed elsewhere (e.g. a file on a disk for
/// the `ssd` mode); what it names then is removed on drop too.
pub struct TierScratch {
    pub base: PathBuf,
    pub tier: PathBuf,
}

impl TierScratch {
    pub fn new(parent: &Path, tag: &str) -> TierScratch {
        let base = parent.join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("b")).unwrap();
        std::fs::create_dir_all(base.join("m")).unwrap();
        TierScratch { base, tier: fresh_tier_path(tag) }
    }
}

impl Drop for TierScratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tier);
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }
}

/// A fresh directory `PARENT/TAG-PID` (whatever an earlier run left there is removed) with
/// `backing/` and `mnt/` in it, removed when dropped. Tests give Cargo's per-target
/// temporary directory as PARENT: a disk file system, where `O_DIRECT` works and node ids
/// resolve by file handle.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(parent: &Path, tag: &str) -> ScratchDir {
        let d = parent.join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("backing")).unwrap();
        std::fs::create_dir_all(d.join("mnt")).unwrap();
        ScratchDir(d)
    }
    pub fn backing(&self) -> PathBuf {
        self.0.join("backing")
    }
    pub fn mnt(&self) -> PathBuf {
        self.0.join("mnt")
    }
    /// A path in the directory (logs, sockets, configuration files).
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A union test's directories below `parent` (a test binary's `CARGO_TARGET_TMPDIR`):
/// branch `a` on the disk, branch `b` on tmpfs (`/dev/shm`: another file system, as a union's
/// branches are), the mount point. On drop, a mount a failing test left is lazily unmounted
/// and everything is removed (`root` is kept when the test panicked, for its logs).
pub struct UnionDirs {
    pub root: PathBuf,
    pub a: PathBuf,
    pub b: PathBuf,
    pub mnt: PathBuf,
}

impl UnionDirs {
    pub fn new(parent: &Path, tag: &str) -> UnionDirs {
        let root = crate::fresh_dir(parent, tag);
        let b = PathBuf::from(format!("/dev/shm/farcache-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&b);
        std::fs::create_dir(&b).unwrap();
        let (a, mnt) = (root.join("a"), root.join("mnt"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        UnionDirs { root, a, b, mnt }
    }

    /// The branches as the command line takes them: `a:b`.
    pub fn branches(&self) -> PathBuf {
        PathBuf::from(format!("{}:{}", self.a.display(), self.b.display()))
    }

    /// `rel` under the mount point.
    pub fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// `farcache balance MNT --json --window-ms 100 EXTRA…` with the binary `bin`.
    pub fn balance(&self, bin: &Path, extra: &[&str]) -> std::process::Output {
        let mnt = self.mnt.to_str().unwrap();
        let mut args = vec!["balance", mnt, "--json", "--window-ms", "100"];
        args.extend_from_slice(extra);
        crate::run_bin(bin, &args)
    }

    /// [`UnionDirs::balance`] that must succeed: its final status.
    pub fn balanced(&self, bin: &Path, extra: &[&str]) -> serde_json::Value {
        let out = self.balance(bin, extra);
        let s = crate::text(&out.stdout);
        assert!(out.status.success(), "balance {extra:?}: {s}{}", crate::text(&out.stderr));
        serde_json::from_str(s.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {s}"))
    }

    /// `farcache stats MNT --json`, which must succeed.
    pub fn stats(&self, bin: &Path) -> serde_json::Value {
        let out = crate::run_bin(bin, &["stats", self.mnt.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", crate::text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for UnionDirs {
    fn drop(&mut self) {
        if crate::fuse_mounted(&self.mnt) {
            let _ = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(&self.mnt).status();
        }
        let _ = std::fs::remove_dir_all(&self.b);
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// A temporary directory with an empty backing directory `b/` and mount point `m/`, for a
/// single-directory mount with a `[mount]` table of the test's (root only: it calls
/// [`crate::require_root`] with `what`).
pub struct MountDirs {
    pub root: tempfile::TempDir,
    pub backing: PathBuf,
    pub mnt: PathBuf,
}

impl MountDirs {
    pub fn new(what: &str) -> MountDirs {
        crate::require_root(what);
        let root = tempfile::tempdir().unwrap();
        let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
        std::fs::create_dir(&backing).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        MountDirs { root, backing, mnt }
    }

    /// A configuration file holding `[mount]` and `mount_table`.
    pub fn config(&self, mount_table: &str) -> PathBuf {
        let cfg = self.root.path().join("farcache.toml");
        std::fs::write(&cfg, format!("[mount]\n{mount_table}")).unwrap();
        cfg
    }

    /// `farcache mount --config CFG ARGS b m`, its log in the directory.
    pub fn mount(&self, bin: &Path, mount_table: &str, args: &[&str]) -> crate::MountProcess {
        let cfg = self.config(mount_table);
        let mut all = vec!["--config", cfg.to_str().unwrap()];
        all.extend_from_slice(args);
        crate::MountProcess::start(bin, &self.backing, &self.mnt, &all, &self.root.path().join("mount.log"))
    }
}

/// An ext4 file system of its own on a loop device (an image under `parent`), mounted at
/// `parent/<tag>`; unmounted and detached on drop. For tests whose directories must behave
/// alike (two tmpfs or a disk and tmpfs differ by far in what a read costs), and for tests
/// that throttle one device ([`BlkioThrottle`]). Root.
pub struct LoopFs {
    image: PathBuf,
    pub dev: String,
    pub dir: PathBuf,
}

impl LoopFs {
    pub fn new(parent: &Path, tag: &str) -> LoopFs {
        let image = parent.join(format!("{tag}.img"));
        let dir = parent.join(tag);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::File::create(&image).unwrap().set_len(96 << 20).unwrap();
        let run = |cmd: &str, args: &[&str]| {
            let out = std::process::Command::new(cmd).args(args).output().unwrap();
            assert!(out.status.success(), "{cmd} {args:?}: {}", crate::text(&out.stderr));
            crate::text(&out.stdout).trim().to_string()
        };
        let dev = run("losetup", &["--direct-io=on", "--show", "-f", image.to_str().unwrap()]);
        let lf = LoopFs { image, dev, dir };
        run("mkfs.ext4", &["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", &lf.dev]);
        run("mount", &["-o", "noatime", &lf.dev, lf.dir.to_str().unwrap()]);
        lf
    }

    /// The loop device's "MAJOR:MINOR".
    pub fn dev_numbers(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(&self.dev).unwrap().rdev();
        format!("{}:{}", libc::major(rdev), libc::minor(rdev))
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let d = self.dir.to_str().unwrap();
        let quiet =
            |cmd: &str, args: &[&str]| std::process::Command::new(cmd).args(args).status().is_ok_and(|s| s.success());
        if !quiet("umount", &[d]) {
            quiet("umount", &["-l", d]);
        }
        quiet("losetup", &["-d", &self.dev]);
        let _ = std::fs::remove_file(&self.image);
    }
}

/// A cgroup v1 blkio directory of its own whose members' writes to one device are throttled
/// (the kernel's `blkio.throttle.write_*_device`): a disk that all but stops taking a
/// process's writes. Lifted, its members moved back to the root and the directory removed
/// on drop. Root, and the v1 blkio hierarchy (../shared/TESTBED.md).
pub struct BlkioThrottle {
    dir: PathBuf,
    dev: String,
}

impl BlkioThrottle {
    const ROOT: &'static str = "/sys/fs/cgroup/blkio";

    /// Move process `pid` (all its threads) into a new cgroup that lets it write at most
    /// `iops` requests and `bps` bytes a second to device `dev` ("MAJOR:MINOR").
    pub fn new(tag: &str, pid: u32, dev: &str, iops: u64, bps: u64) -> BlkioThrottle {
        let root = Path::new(Self::ROOT);
        assert!(root.join("cgroup.procs").exists(), "no cgroup v1 blkio hierarchy at {}", root.display());
        let dir = root.join(format!("farcache-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let t = BlkioThrottle { dir, dev: dev.to_string() };
        t.set(iops, bps);
        std::fs::write(t.dir.join("cgroup.procs"), pid.to_string()).unwrap();
        t
    }

    /// New limits (0: none).
    pub fn set(&self, iops: u64, bps: u64) {
        for (f, v) in [("blkio.throttle.write_iops_device", iops), ("blkio.throttle.write_bps_device", bps)] {
            std::fs::write(self.dir.join(f), format!("{} {v}", self.dev))
                .unwrap_or_else(|e| panic!("{}/{f}: {e}", self.dir.display()));
        }
    }
}

impl Drop for BlkioThrottle {
    fn drop(&mut self) {
        for f in ["blkio.throttle.write_iops_device", "blkio.throttle.write_bps_device"] {
            let _ = std::fs::write(self.dir.join(f), format!("{} 0", self.dev));
        }
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(Path::new(Self::ROOT).join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
