//! cgroup v1 directories the harness creates (memory for the memory-starved client, blkio
//! for the slow disk), and removes: tasks left in one are killed first, then the directory
//! goes (v1 moves any charge left, page cache, to the parent).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::sys;
use crate::error::IoContext;
use crate::{BenchError, Result};

/// Where the v1 hierarchies are mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

pub struct Cgroup {
    path: PathBuf,
    removed: bool,
}

impl Cgroup {
    /// Create `/sys/fs/cgroup/CONTROLLER/NAME` (which must not exist yet).
    pub fn create(controller: &str, name: &str) -> Result<Cgroup> {
        let base = Path::new(ROOT).join(controller);
        if !base.join("cgroup.procs").exists() {
            return Err(BenchError::Setup(format!(
                "no cgroup v1 {controller} hierarchy at {}: the paper testbed needs cgroup v1 memory and blkio \
                 controllers (see ../shared/TESTBED.md)",
                base.display()
            )));
        }
        let path = base.join(name);
        std::fs::create_dir(&path).ctx(|| format!("create cgroup {}", path.display()))?;
        Ok(Cgroup { path, removed: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn procs(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    pub fn set(&self, file: &str, value: &str) -> Result<()> {
        sys::write_file(&self.path.join(file), value)
    }

    pub fn read_u64(&self, file: &str) -> Option<u64> {
        std::fs::read_to_string(self.path.join(file)).ok()?.trim().parse().ok()
    }

    /// One key of memory.stat (e.g. "total_cache", "total_rss").
    pub fn memory_stat(&self, key: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.path.join("memory.stat")).ok()?;
        text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Remove the directory now (idempotent); what went wrong, if anything.
    pub fn remove(&mut self) -> std::result::Result<(), String> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        remove_dir(&self.path)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            note!("paper: warning: {e}");
        }
    }
}

/// The pids in a cgroup directory.
pub fn pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Kill what is left in `dir` (SIGTERM, then SIGKILL after 5 s), then rmdir it, bounded.
pub fn remove_dir(dir: &Path) -> std::result::Result<(), String> {
    if !dir.exists() {
        return Ok(());
    }
    let end = Instant::now() + Duration::from_secs(15);
    let mut killed = false;
    let term_at = Instant::now();
    loop {
        let left = pids(dir);
        if left.is_empty() {
            match std::fs::remove_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) if Instant::now() > end => return Err(format!("cannot remove cgroup {}: {e}", dir.display())),
                Err(_) => {}
            }
        } else {
            let sig = if killed || term_at.elapsed() > Duration::from_secs(5) { libc::SIGKILL } else { libc::SIGTERM };
            for p in &left {
                sys::signal(*p, sig);
            }
            killed |= sig == libc::SIGKILL;
            if Instant::now() > end {
                return Err(format!("cgroup {} still holds pids {left:?}", dir.display()));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
