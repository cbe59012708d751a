//! The marker a tier leaves in the backing root, `.farcache-tier`: "a write-back tier may
//! hold data this directory lacks". Written (and synced, with its directory) when a tier is
//! opened for the backing directory, removed only once a clean unmount destaged everything.
//! `farcache mount` without `--tier` refuses to start over a backing directory that has one,
//! and with another tier than the marker names. It is visible through the mount (a small
//! text file naming the tier); deleting it by hand gives up that protection.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub const FILE: &str = ".farcache-tier";

pub fn path(root: &Path) -> PathBuf {
    root.join(FILE)
}

/// The tier path the marker in `root` names, if there is a marker.
pub fn read(root: &Path) -> io::Result<Option<String>> {
    match std::fs::read_to_string(path(root)) {
        Ok(s) => Ok(Some(s.lines().find_map(|l| l.strip_prefix("tier ")).unwrap_or("").to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn write(root: &Path, tier: &str) -> io::Result<()> {
    if read(root)?.as_deref() == Some(tier) {
        return Ok(());
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
    std::fs::File::open(root)?.sync_all()
}

pub fn remove(root: &Path) -> io::Result<()> {
    match std::fs::remove_file(path(root)) {
        Ok(()) => std::fs::File::open(root)?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Refuse a mount of `root` without a tier (`tier` empty) or with another tier than the
/// marker names: the error says what to do.
pub fn check(root: &Path, tier: &str) -> Result<(), String> {
    let named = read(root).map_err(|e| format!("{}: cannot read it: {e}", path(root).display()))?;
    match named {
        None => Ok(()),
        Some(n) if n == tier => Ok(()),
        Some(n) if tier.is_empty() => Err(format!(
            "tier.path: {} has a write-back tier at {n} that may hold data the directory lacks ({} says so); fix: \
             mount with --tier {n}, or run `farcache tier recover {n} {}` first",
            root.display(),
            path(root).display(),
            root.display()
        )),
        Some(n) => Err(format!(
            "tier.path: {} belongs to the write-back tier {n}, not {tier}; fix: mount with --tier {n}, or run \
             `farcache tier recover {n} {}` first",
            root.display(),
            root.display()
        )),
    }
}
