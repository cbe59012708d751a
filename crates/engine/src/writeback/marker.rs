//! The mark a tier leaves on its backing root: "a write-back tier may hold data this
//! directory lacks". Set (and synced, with the directory) when a tier is opened for the
//! backing directory, removed only once a clean unmount (or `farcache tier recover`) wrote
//! everything back. `farcache mount` without `--tier` refuses to start over a backing
//! directory that carries one, and so does a mount with another tier than the mark names.
//!
//! Where: the extended attribute `user.farcache.tier` of the backing root (its value is the
//! tier's path), invisible in directory listings — a database may want the mount's root as
//! its data directory, which must look empty. Where the file system takes no user extended
//! attributes, a file `.farcache-tier` in the root instead (visible through the mount).
//! Removing the mark by hand gives up the protection.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The fallback file's name.
pub const FILE: &str = ".farcache-tier";
/// The extended attribute.
pub const XATTR: &str = "user.farcache.tier";

pub fn path(root: &Path) -> PathBuf {
    root.join(FILE)
}

/// Where the mark of `root` is, for messages.
pub fn describe(root: &Path) -> String {
    format!("the {XATTR} attribute of {} (or {})", root.display(), path(root).display())
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn xattr_name() -> CString {
    CString::new(XATTR).expect("no NUL")
}

fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::EPERM))
}

fn get_xattr(root: &Path) -> io::Result<Option<String>> {
    let p = cpath(root)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: NUL-terminated path and name; the kernel writes at most buf.len() bytes.
    let n = unsafe { libc::getxattr(p.as_ptr(), xattr_name().as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) => Ok(None),
            _ if unsupported(&e) => Ok(None),
            _ => Err(e),
        };
    }
    buf.truncate(n as usize);
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// The tier path the mark on `root` names, if there is a mark.
pub fn read(root: &Path) -> io::Result<Option<String>> {
    if let Some(t) = get_xattr(root)? {
        return Ok(Some(t));
    }
    match std::fs::read_to_string(path(root)) {
        Ok(s) => Ok(Some(s.lines().find_map(|l| l.strip_prefix("tier ")).unwrap_or("").to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn sync_dir(root: &Path) -> io::Result<()> {
    std::fs::File::open(root)?.sync_all()
}

pub fn write(root: &Path, tier: &str) -> io::Result<()> {
    if read(root)?.as_deref() == Some(tier) {
        return Ok(());
    }
    let p = cpath(root)?;
    // SAFETY: NUL-terminated path and name; the value is `tier`'s bytes.
    let r = unsafe { libc::setxattr(p.as_ptr(), xattr_name().as_ptr(), tier.as_ptr().cast(), tier.len(), 0) };
    if r == 0 {
        return sync_dir(root);
    }
    let e = io::Error::last_os_error();
    if !unsupported(&e) {
        return Err(e);
    }
    let tmp = root.join(format!("{FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(
        f,
        "tier {tier}\n# A farcache write-back tier may hold data not yet in this directory.\n# Mount it with --tier {tier}, or run `farcache tier recover {tier} {}`.",
        root.display()
    )?;
    f.sync_all()?;
    std::fs::rename(&tmp, path(root))?;
    sync_dir(root)
}

pub fn remove(root: &Path) -> io::Result<()> {
    let p = cpath(root)?;
    // SAFETY: NUL-terminated path and name.
    if unsafe { libc::removexattr(p.as_ptr(), xattr_name().as_ptr()) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENODATA) && !unsupported(&e) {
            return Err(e);
        }
    }
    match std::fs::remove_file(path(root)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    sync_dir(root)
}

/// Refuse a mount of `root` without a tier (`tier` empty) or with another tier than the
/// mark names: the error says what to do.
pub fn check(root: &Path, tier: &str) -> Result<(), String> {
    check_named(root, tier, &root.display().to_string())
}

/// [`check`] of one branch of a mount of several backing directories, `backing` naming them
/// all (DIR1:DIR2, as `farcache tier recover` takes them).
pub fn check_named(root: &Path, tier: &str, backing: &str) -> Result<(), String> {
    let named = read(root).map_err(|e| format!("{}: cannot read it: {e}", describe(root)))?;
    match named {
        None => Ok(()),
        Some(n) if n == tier => Ok(()),
        Some(n) if tier.is_empty() => Err(format!(
            "tier.path: {} has a write-back tier at {n} that may hold data the directory lacks ({} says so); fix: \
             mount with --tier {n}, or run `farcache tier recover {n} {backing}` first",
            root.display(),
            describe(root),
        )),
        Some(n) => Err(format!(
            "tier.path: {} belongs to the write-back tier {n}, not {tier}; fix: mount with --tier {n}, or run \
             `farcache tier recover {n} {backing}` first",
            root.display(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_set_read_checked_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(read(root).unwrap(), None);
        check(root, "").unwrap();
        write(root, "/dev/shm/t").unwrap();
        assert_eq!(read(root).unwrap().as_deref(), Some("/dev/shm/t"));
        if get_xattr(root).unwrap().is_some() {
            assert!(std::fs::read_dir(root).unwrap().next().is_none(), "an attribute leaves the directory empty");
        }
        let e = check(root, "").unwrap_err();
        assert!(e.contains("--tier /dev/shm/t") && e.contains("fix:"), "{e}");
        let e = check(root, "/other").unwrap_err();
        assert!(e.contains("belongs to the write-back tier /dev/shm/t"), "{e}");
        check(root, "/dev/shm/t").unwrap();
        remove(root).unwrap();
        assert_eq!(read(root).unwrap(), None);
        remove(root).unwrap();
    }
}
