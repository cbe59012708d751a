//! The FUSE layer of `farcache mount`: a passthrough of a backing directory whose file data
//! goes through a [`farcache_engine::DataPath`]. It is the only place where errors become
//! errno values (mountpoint-s3's `fuse.rs` plays the same part).
//!
//! Entry points: [`Mount::new`] checks the directories and the FUSE device, mounts, and
//! returns once the kernel has finished the FUSE handshake (the mount is live);
//! [`Mount::run`] serves requests on `threads` worker threads until the file system is
//! unmounted — by [`Unmounter::unmount`] (from a signal handler thread), by
//! `fusermount3 -u`, or by `umount`.
//!
//! Code map:
//! - `inode.rs`: node ids ↔ backing inodes, one `O_PATH` descriptor each (rename- and
//!   hard-link-safe; see its docs).
//! - `handles.rs`: open file and directory handles, bounded.
//! - `fs.rs`: shared state and the `fuser::Filesystem` glue (errno conversion).
//! - `ops_entry.rs`, `ops_attr.rs`, `ops_file.rs`, `ops_dir.rs`: the operations.
//! - `sys.rs`: the system calls.
//! - `config.rs`: `[mount]`.
//!
//! Permissions: the mount uses `default_permissions`, so the kernel checks every access
//! against the attributes we report (mode, owner, group) before asking us; the daemon then
//! acts with its own credentials. Run as root with `allow_other`, it serves every user, and
//! gives the inodes it creates to the calling user.

mod config;
mod error;
mod fs;
mod handles;
mod inode;
mod ops_attr;
mod ops_dir;
mod ops_entry;
mod ops_file;
mod sys;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use farcache_engine::DataPath;
use fuser::{MountOption, SessionACL};

pub use config::{MountConfig, MAX_THREADS, TEMPLATE};
pub use error::MountError;

/// A live mount. Dropping it without [`Mount::run`] unmounts.
pub struct Mount {
    session: fuser::Session<fs::Passthrough>,
    mountpoint: PathBuf,
    /// `st_dev` of the mounted file system: unmount only what is still ours.
    dev: u64,
}

/// Unmounts a [`Mount`] from another thread (a signal handler's).
pub struct Unmounter {
    /// fuser's own handle: unmounting through it also tells the session not to unmount
    /// again by path when it ends (fuser 0.18.0 would otherwise try, see `run`).
    inner: fuser::SessionUnmounter,
    mountpoint: PathBuf,
    dev: u64,
}

/// What [`Unmounter::unmount`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Gone; [`Mount::run`] returns shortly.
    Done,
    /// The mount was busy (open files, a working directory inside): it was detached from
    /// the directory tree at once, and [`Mount::run`] returns when its last user lets go.
    Detached,
    /// It was no longer mounted here (unmounted by someone else).
    NotMounted,
}

impl Mount {
    /// Check everything that can be checked, then mount `backing` on `mountpoint`.
    ///
    /// Side effects on the process, which is expected to be the mount daemon: the umask
    /// becomes 0 (the kernel applies the caller's umask before asking us) and the
    /// open-descriptor limit is raised (each inode the kernel knows holds a descriptor).
    pub fn new(
        backing: &Path,
        mountpoint: &Path,
        cfg: &MountConfig,
        data: Arc<dyn DataPath>,
    ) -> Result<Mount, MountError> {
        cfg.validate()?;
        let backing = check_dir(backing, MountError::BackingMissing, MountError::BackingNotDir)?;
        let mountpoint = check_dir(mountpoint, MountError::MountpointMissing, MountError::MountpointNotDir)?;
        if mountpoint != backing && mountpoint.starts_with(&backing) {
            return Err(MountError::MountpointInsideBacking { mountpoint, backing });
        }
        if !Path::new("/proc/self/fd").is_dir() {
            return Err(MountError::NoProc);
        }
        let root = sys::is_root();
        if !root && find_in_path("fusermount3").is_none() {
            return Err(MountError::FusermountMissing);
        }
        std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").map_err(MountError::NoDevFuse)?;
        if root && find_in_path("fusermount3").is_none() {
            tracing::warn!(
                "fusermount3 not found: mounting directly as root, but `fusermount3 -u` will not be available"
            );
        }

        sys::set_umask(0);
        let want_fds = cfg.max_inodes.saturating_add(cfg.max_open_handles.saturating_mul(3)).saturating_add(1024);
        let nofile = sys::raise_nofile(want_fds);
        tracing::debug!("open descriptor limit {nofile}");

        // The backing root is opened before mounting, so even a mount on top of the backing
        // directory itself reaches the files underneath.
        let fs = fs::Passthrough::new(&backing, cfg, data)
            .map_err(|source| MountError::BackingOpen { path: backing.clone(), source })?;

        let mut fc = fuser::Config::default();
        fc.mount_options = vec![
            MountOption::FSName(format!("farcache:{}", backing.display())),
            MountOption::Subtype("farcache".into()),
            MountOption::DefaultPermissions,
        ];
        if cfg.allow_other && root {
            fc.acl = SessionACL::All;
        }
        fc.n_threads = Some(cfg.threads as usize);
        fc.clone_fd = true;
        let session = fuser::Session::new(fs, &mountpoint, &fc)
            .map_err(|source| MountError::Mount { mountpoint: mountpoint.clone(), source })?;
        // Not stat(2): that would ask the file system, which serves nothing before `run`.
        let dev = mounted_dev(&mountpoint).ok_or_else(|| MountError::Mount {
            mountpoint: mountpoint.clone(),
            source: io::Error::other("mounted, but not found in /proc/self/mountinfo"),
        })?;
        tracing::info!(
            "mounted {} on {}: {} threads, backing reads {}",
            backing.display(),
            mountpoint.display(),
            cfg.threads,
            if cfg.direct_io_backing { "direct (O_DIRECT where supported)" } else { "buffered" }
        );
        Ok(Mount { session, mountpoint, dev })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter { inner: self.session.unmount_callable(), mountpoint: self.mountpoint.clone(), dev: self.dev }
    }

    /// Serve requests until the file system is unmounted.
    ///
    /// Known fuser 0.18.0 issue: when someone else unmounts (`fusermount3 -u`), the session's
    /// teardown still calls umount(2) on the mount point (its is-still-mounted check is
    /// inverted; fixed upstream in fuser PR #703, not yet released). That fails with EINVAL
    /// and logs a harmless warning — unless a new file system was mounted on the same path
    /// in the microseconds in between. Restart scripts should wait for the old daemon to exit
    /// before mounting again. Unmounting through [`Unmounter`] avoids it.
    pub fn run(self) -> Result<(), MountError> {
        let mountpoint = self.mountpoint.clone();
        match self.session.run() {
            Ok(()) => {}
            // The kernel tore the connection down: a detached mount whose last user left (seen
            // as ECONNABORTED on Linux 6.18 on some of the cloned device fds), or someone wrote
            // to /sys/fs/fuse/connections/N/abort. Either way the file system is gone and
            // nothing is lost (writes go through to the backing store), so it is an end.
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
                tracing::info!(
                    "the kernel closed the FUSE connection on {} (connection aborted)",
                    mountpoint.display()
                );
            }
            Err(source) => return Err(MountError::Session { mountpoint, source }),
        }
        tracing::info!("unmounted {}", self.mountpoint.display());
        Ok(())
    }
}

impl Unmounter {
    /// Unmount; if the mount is busy, detach it (lazy unmount).
    pub fn unmount(&mut self) -> io::Result<Unmounted> {
        // Only what is still ours: the top-most mount on the mount point must be this one.
        if mounted_dev(&self.mountpoint) != Some(self.dev) {
            return Ok(Unmounted::NotMounted);
        }
        match self.inner.unmount() {
            Ok(()) => Ok(Unmounted::Done),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                let c = CString::new(self.mountpoint.as_os_str().as_bytes()).map_err(|_| sys::err(libc::EINVAL))?;
                // SAFETY: plain syscall with a NUL-terminated path.
                if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
                    Ok(Unmounted::Detached)
                } else {
                    Err(io::Error::last_os_error())
                }
            }
            Err(e) => Err(e),
        }
    }
}

/// The canonical path of an existing directory, or the right error.
fn check_dir(
    p: &Path,
    missing: fn(PathBuf) -> MountError,
    not_dir: fn(PathBuf) -> MountError,
) -> Result<PathBuf, MountError> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(p.canonicalize().map_err(|_| missing(p.to_path_buf()))?),
        Ok(_) => Err(not_dir(p.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(missing(p.to_path_buf())),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Err(MountError::Mount {
            mountpoint: p.to_path_buf(),
            source: io::Error::other(format!(
                "{}: a dead FUSE mount is still there (its daemon died); run `fusermount3 -u {}` first",
                e,
                p.display()
            )),
        }),
        Err(e) => Err(MountError::Mount { mountpoint: p.to_path_buf(), source: e }),
    }
}

/// The device (`st_dev`) of the top-most mount on `mountpoint`, from /proc/self/mountinfo
/// (which, unlike stat(2), does not ask the mounted file system).
pub fn mounted_dev(mountpoint: &Path) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        // id parent major:minor root mount-point options ... - fstype source super-options
        let mut f = line.split(' ');
        let (Some(_), Some(_), Some(dev), Some(_), Some(mp)) = (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        if unescape_mountinfo(mp) == want {
            let (maj, min) = dev.split_once(':')?;
            found = Some(libc::makedev(maj.parse().ok()?, min.parse().ok()?));
        }
    }
    found
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn find_in_path(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bin)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone_and_the_root_is_found() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b\134c"), b"/tmp/a b\\c");
        assert_eq!(unescape_mountinfo(r"/x\04"), b"/x\\04");
        assert!(mounted_dev(Path::new("/")).is_some());
        assert_eq!(mounted_dev(Path::new("/no/such/mount/point")), None);
    }
}
