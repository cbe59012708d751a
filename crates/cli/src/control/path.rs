//! Where a mount's control socket lives, derived from the mount point alone so that users
//! name only that: `DIR/HASH-TAIL.sock`, where
//!
//! - DIR is `/run/farcache` for root, else `$XDG_RUNTIME_DIR/farcache`, else
//!   `/tmp/farcache-UID` — a directory of ours, mode 0700 (the daemon creates it, and refuses
//!   one that another user owns or that others may write to: in /tmp anyone can make a
//!   directory of that name first);
//! - HASH is 16 hex digits of a stable hash (FNV-1a) of the canonical mount point path, so
//!   that two mount points never share a socket;
//! - TAIL is the end of that path with everything but `A-Z a-z 0-9 . _ -` replaced, so that
//!   `ls` shows which socket is which; shortened as needed to keep the whole path under the
//!   108-byte `sun_path` limit.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Longest socket path: `sun_path` is 108 bytes including the terminating NUL.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;
/// Longest readable tail in a socket name.
const MAX_TAIL_BYTES: usize = 40;

pub fn euid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() }
}

/// The directory default sockets live in, for this user (not created here).
pub fn runtime_dir() -> PathBuf {
    runtime_dir_for(euid(), std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from))
}

fn runtime_dir_for(uid: u32, xdg: Option<PathBuf>) -> PathBuf {
    if uid == 0 {
        return PathBuf::from("/run/farcache");
    }
    match xdg {
        Some(x) if x.is_absolute() && x.is_dir() => x.join("farcache"),
        _ => PathBuf::from(format!("/tmp/farcache-{uid}")),
    }
}

/// FNV-1a, 64 bits: stable across builds and versions (unlike std's hasher), which matters
/// because the daemon and the command that looks for its socket may be different builds.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The socket file name for a canonical mount point, at most `budget` bytes long (at least
/// the 21 bytes of `HASH.sock`).
pub fn socket_name(mountpoint: &Path, budget: usize) -> String {
    let bytes = mountpoint.as_os_str().as_bytes();
    let hash = format!("{:016x}", fnv1a(bytes));
    let clean: String = bytes
        .iter()
        .map(|&b| if b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_' { b as char } else { '_' })
        .collect();
    let clean = clean.trim_matches('_');
    let clean = if clean.is_empty() { "root" } else { clean };
    // Room for "-TAIL" between the hash and ".sock".
    let room = budget.saturating_sub(hash.len() + ".sock".len() + 1).min(MAX_TAIL_BYTES);
    if room == 0 {
        return format!("{hash}.sock");
    }
    // The end of the path is the part that tells mounts apart; all bytes are ASCII here.
    let tail = &clean[clean.len().saturating_sub(room)..];
    format!("{hash}-{}.sock", tail.trim_start_matches('_'))
}

/// The default socket path of the mount on `mountpoint`, which should be canonical.
pub fn default_socket_path(mountpoint: &Path) -> io::Result<PathBuf> {
    socket_path_in(&runtime_dir(), mountpoint)
}

fn socket_path_in(dir: &Path, mountpoint: &Path) -> io::Result<PathBuf> {
    let budget = MAX_SOCKET_PATH_BYTES.saturating_sub(dir.as_os_str().len() + 1);
    if budget < 21 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is too long a directory for a unix socket; choose one with --control-socket", dir.display()),
        ));
    }
    Ok(dir.join(socket_name(mountpoint, budget)))
}

/// Make sure `dir` exists as a private directory of ours: create it with mode 0700, or check
/// that the one there is a real directory (not a symlink), owned by us, and not writable by
/// group or others.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("cannot create {}: {e}", dir.display()))),
    }
    let m = std::fs::symlink_metadata(dir)?;
    let refuse = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("refusing {} for control sockets: {why}; remove it or use --control-socket", dir.display()),
        ))
    };
    if !m.file_type().is_dir() {
        return refuse("not a directory");
    }
    if m.uid() != euid() {
        return refuse(&format!("owned by uid {}, not by us (uid {})", m.uid(), euid()));
    }
    if m.permissions().mode() & 0o022 != 0 {
        return refuse(&format!("mode {:o} lets others write to it", m.permissions().mode() & 0o7777));
    }
    Ok(())
}

/// Fit a path into `sun_path`, or say why not.
pub fn check_len(path: &Path) -> io::Result<()> {
    if path.as_os_str().len() > MAX_SOCKET_PATH_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "control socket path {} is {} bytes; unix sockets allow {MAX_SOCKET_PATH_BYTES}",
                path.display(),
                path.as_os_str().len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_distinct_readable_and_short() {
        let a = socket_name(Path::new("/srv/pg/data"), 100);
        assert_eq!(a, format!("{:016x}-srv_pg_data.sock", fnv1a(b"/srv/pg/data")));
        // FNV-1a of the empty string is the offset basis: the hash is the published one.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(socket_name(Path::new("/srv/pg/data"), 100), a, "stable");
        // Paths that sanitise alike still differ by hash.
        let b = socket_name(Path::new("/srv/pg_data"), 100);
        assert_ne!(a, b);
        assert!(b.ends_with("-srv_pg_data.sock"));
        assert!(socket_name(Path::new("/"), 100).ends_with("-root.sock"));
        let odd = socket_name(Path::new("/mnt/with space/ünïcode\n"), 100);
        assert!(odd.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c)), "{odd}");
        // Long paths keep their end, within the budget.
        let long = format!("/{}/the-end", "d".repeat(300));
        let n = socket_name(Path::new(&long), 60);
        assert!(n.len() <= 60 && n.ends_with("the-end.sock"), "{n}");
        assert!(socket_name(Path::new(&long), 1000).len() <= 16 + 1 + MAX_TAIL_BYTES + 5);
        assert_eq!(socket_name(Path::new(&long), 21).len(), 21);
    }

    #[test]
    fn directories_by_user() {
        assert_eq!(runtime_dir_for(0, Some("/run/user/0".into())), Path::new("/run/farcache"));
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(runtime_dir_for(1000, Some(tmp.path().into())), tmp.path().join("farcache"));
        assert_eq!(runtime_dir_for(1000, None), Path::new("/tmp/farcache-1000"));
        assert_eq!(runtime_dir_for(1000, Some("relative".into())), Path::new("/tmp/farcache-1000"));
        assert_eq!(runtime_dir_for(1000, Some("/no/such/dir".into())), Path::new("/tmp/farcache-1000"));
    }

    #[test]
    fn socket_paths_fit_sun_path() {
        let mnt = Path::new(&format!("/{}", "m".repeat(500))).to_path_buf();
        for dir_len in [1usize, 13, 40, 80, 85] {
            let dir = PathBuf::from(format!("/{}", "r".repeat(dir_len - 1)));
            let p = socket_path_in(&dir, &mnt).unwrap();
            assert!(p.as_os_str().len() <= MAX_SOCKET_PATH_BYTES, "{}", p.display());
            check_len(&p).unwrap();
        }
        let deep = PathBuf::from(format!("/{}", "r".repeat(100)));
        assert!(socket_path_in(&deep, &mnt).unwrap_err().to_string().contains("--control-socket"));
        assert!(check_len(&deep.join("x".repeat(10))).is_err());
    }

    #[test]
    fn private_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("fc");
        ensure_private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        ensure_private_dir(&d).unwrap(); // there already: fine

        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_private_dir(&d).unwrap_err().to_string();
        assert!(e.contains("lets others write"), "{e}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o720)).unwrap();
        assert!(ensure_private_dir(&d).is_err(), "group-writable");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o750)).unwrap();
        ensure_private_dir(&d).unwrap();

        // A symlink to a good directory is still refused (it could be swapped).
        let l = tmp.path().join("link");
        std::os::unix::fs::symlink(&d, &l).unwrap();
        assert!(ensure_private_dir(&l).unwrap_err().to_string().contains("not a directory"));
        let f = tmp.path().join("file");
        std::fs::write(&f, "").unwrap();
        assert!(ensure_private_dir(&f).is_err());

        // Someone else's directory (only testable as root, where chown works).
        if euid() == 0 {
            let other = tmp.path().join("other");
            std::fs::DirBuilder::new().mode(0o700).create(&other).unwrap();
            std::os::unix::fs::chown(&other, Some(65534), None).unwrap();
            let e = ensure_private_dir(&other).unwrap_err().to_string();
            assert!(e.contains("owned by uid 65534"), "{e}");
        }
    }
}
