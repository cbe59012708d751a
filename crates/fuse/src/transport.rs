//! How the kernel's requests reach this daemon: `/dev/fuse` read loops, or FUSE-over-io_uring
//! (`mount.fuse_uring`; the transport itself is in the vendored fuser, `uring.rs`). Which one
//! serves is never silent: it is logged at mount and shown by `farcache stats` with the
//! reason when rings were asked for and are not used.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::{FuseUring, MountConfig, MountError, OpCounts};

/// The kernel's switch for FUSE-over-io_uring (Linux 6.14+, off by default).
pub const ENABLE_URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

/// The kernel parameter: `None` when this kernel has no FUSE-over-io_uring at all.
pub fn kernel_enable_uring() -> Option<bool> {
    let s = std::fs::read_to_string(ENABLE_URING_PARAM).ok()?;
    Some(matches!(s.trim(), "Y" | "y" | "1"))
}

/// Whether to ask for rings at INIT: `Ok(None)` yes, `Ok(Some(reason))` no, and why; an
/// error when `mount.fuse_uring = "on"` cannot be honoured.
pub(crate) fn plan(cfg: &MountConfig) -> Result<Option<String>, MountError> {
    if cfg.fuse_uring == FuseUring::Off {
        return Ok(Some("mount.fuse_uring = \"off\"".into()));
    }
    let problem = match kernel_enable_uring() {
        None => Some("this kernel has no FUSE-over-io_uring (Linux 6.14+ built with CONFIG_FUSE_IO_URING)".to_string()),
        Some(false) => Some(format!("FUSE-over-io_uring is off in the kernel ({ENABLE_URING_PARAM} is N)")),
        Some(true) => match std::fs::read_to_string(IO_URING_DISABLED).map(|s| s.trim().to_string()) {
            Ok(v) if v == "2" => Some("io_uring is disabled on this machine (kernel.io_uring_disabled = 2)".into()),
            _ => None,
        },
    };
    match (problem, cfg.fuse_uring) {
        (None, _) => Ok(None),
        (Some(p), FuseUring::On) => Err(MountError::FuseUring {
            problem: format!("\"on\", but {p}"),
            fix: format!(
                "as root, `echo Y > {ENABLE_URING_PARAM}` (and kernel.io_uring_disabled = 0), or set mount.fuse_uring \
                 = \"auto\" (rings when available) or \"off\""
            ),
        }),
        (Some(p), _) => Ok(Some(p)),
    }
}

/// How requests reach this daemon, and the ring transport's counters.
#[derive(Clone)]
pub struct Transport {
    setting: FuseUring,
    /// Why rings are not asked for ("" when they are).
    why_not: String,
    rings: Option<Arc<fuser::UringStats>>,
    /// Requests received by opcode (counted by the file system).
    ops: Arc<OpCounts>,
    /// The mount's readahead window (`mount.read_ahead`).
    read_ahead: Option<Arc<crate::ReadAhead>>,
    /// `mount.kernel_passthrough`, when on.
    kernel_passthrough: Option<Arc<crate::KernelPassthrough>>,
    /// The inode table: how many inodes it knows, and its descriptors when frugal.
    inodes: Option<Arc<crate::inode::InodeTable>>,
}

/// What `farcache stats` shows of the transport (docs/METRICS.md, `fuse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportStats {
    /// "io_uring" (FUSE-over-io_uring serves) or "read-loops" (`/dev/fuse`).
    pub mode: String,
    /// `mount.fuse_uring` as configured: "off", "auto" or "on".
    pub fuse_uring: String,
    /// Why rings do not serve, when asked for ("" otherwise).
    pub reason: String,
    /// Ring queues (one per possible CPU) and entries registered.
    pub ring_queues: u64,
    pub ring_entries: u64,
    /// Requests received and answered over the rings (FORGET and INTERRUPT never are).
    pub ring_requests: u64,
    /// Replies the kernel refused over the rings.
    pub ring_commit_errors: u64,
    /// Requests received since the daemon started, by FUSE opcode (every opcode's name,
    /// `other` for any opcode without one), over either transport.
    #[serde(default)]
    pub ops: BTreeMap<String, u64>,
    /// The kernel's readahead window for the mount now, KiB (its bdi's `read_ahead_kb`; 0
    /// where it cannot be read), and the one `mount.read_ahead` asked for (0: none).
    #[serde(default)]
    pub read_ahead_kb: u64,
    #[serde(default)]
    pub read_ahead_wanted_kb: u64,
    /// Why the window is not the one asked for ("" when it is).
    #[serde(default)]
    pub read_ahead_problem: String,
    /// `mount.kernel_passthrough`: whether opens are answered with the kernel's passthrough
    /// now, why not when it was asked for and does not serve, opens so answered, and inodes
    /// with a backing file registered now.
    #[serde(default)]
    pub kernel_passthrough: bool,
    #[serde(default)]
    pub kernel_passthrough_problem: String,
    #[serde(default)]
    pub passthrough_opens: u64,
    #[serde(default)]
    pub passthrough_files: u64,
    /// Inodes the mount knows now (the kernel has looked them up and not forgotten them).
    #[serde(default)]
    pub inodes: u64,
    /// Where RLIMIT_NOFILE is below `mount.max_inodes` (CONFIGURATION.md): the inode table
    /// holds descriptors for at most `inode_fd_budget` inodes (0: a descriptor per inode, no
    /// budget), holds `inode_fds` now, and reopened `inode_reopens` by file handle after
    /// letting go of `inode_fds_released` since start.
    #[serde(default)]
    pub inode_fds: u64,
    #[serde(default)]
    pub inode_fd_budget: u64,
    #[serde(default)]
    pub inode_reopens: u64,
    #[serde(default)]
    pub inode_fds_released: u64,
}

impl Transport {
    pub(crate) fn read_loops(cfg: &MountConfig, why: &str) -> Transport {
        Transport {
            setting: cfg.fuse_uring,
            why_not: why.to_string(),
            rings: None,
            ops: Arc::default(),
            read_ahead: None,
            kernel_passthrough: None,
            inodes: None,
        }
    }

    /// After INIT: rings asked for (`why_not` None) and agreed, or the reason they are not.
    pub(crate) fn negotiated(
        cfg: &MountConfig,
        why_not: Option<String>,
        stats: Arc<fuser::UringStats>,
    ) -> Result<Transport, MountError> {
        if let Some(why) = why_not {
            return Ok(Transport::read_loops(cfg, &why));
        }
        if !stats.negotiated.load(Ordering::SeqCst) {
            let problem = if stats.offered.load(Ordering::SeqCst) {
                "the INIT reply could not ask for FUSE_OVER_IO_URING".to_string()
            } else {
                "the kernel's INIT did not offer FUSE_OVER_IO_URING".to_string()
            };
            if cfg.fuse_uring == FuseUring::On {
                return Err(MountError::FuseUring {
                    problem: format!("\"on\", but {problem}"),
                    fix: format!("check {ENABLE_URING_PARAM} is Y, or set mount.fuse_uring = \"auto\" or \"off\""),
                });
            }
            return Ok(Transport::read_loops(cfg, &problem));
        }
        Ok(Transport { rings: Some(stats), ..Transport::read_loops(cfg, "") })
    }

    /// The mount's readahead window, for the stats.
    pub(crate) fn with_read_ahead(mut self, r: Arc<crate::ReadAhead>) -> Transport {
        self.read_ahead = Some(r);
        self
    }

    /// The mount's kernel passthrough, for the stats.
    pub(crate) fn with_kernel_passthrough(mut self, k: Option<Arc<crate::KernelPassthrough>>) -> Transport {
        self.kernel_passthrough = k;
        self
    }

    /// The mount's inode table, for the stats.
    pub(crate) fn with_inodes(mut self, inodes: Arc<crate::inode::InodeTable>) -> Transport {
        self.inodes = Some(inodes);
        self
    }

    /// The counters the mount's file system counts its requests in.
    pub(crate) fn with_ops(mut self, ops: Arc<OpCounts>) -> Transport {
        self.ops = ops;
        self
    }

    /// For the mount's log line.
    pub fn describe(&self) -> String {
        match (&self.rings, self.why_not.is_empty()) {
            (Some(_), _) => "FUSE-over-io_uring (negotiated at INIT; queues registered when serving starts)".into(),
            (None, true) => "/dev/fuse read loops".into(),
            (None, false) => format!("/dev/fuse read loops ({})", self.why_not),
        }
    }

    /// Whether the INIT reply asked for rings: from then on the kernel routes requests to
    /// ring queues (once registered), so the connection can no longer be handed over.
    pub fn negotiated_rings(&self) -> bool {
        self.rings.is_some()
    }

    /// Whether the rings serve (negotiated and every entry registered).
    pub fn uses_rings(&self) -> bool {
        self.rings.as_ref().is_some_and(|s| s.active.load(Ordering::SeqCst))
    }

    pub fn snapshot(&self) -> TransportStats {
        let mut t = TransportStats {
            mode: "read-loops".into(),
            fuse_uring: self.setting.to_string(),
            reason: self.why_not.clone(),
            ops: self.ops.snapshot(),
            ..TransportStats::default()
        };
        if let Some(r) = &self.read_ahead {
            t.read_ahead_kb = r.current_kb().unwrap_or(0);
            t.read_ahead_wanted_kb = r.wanted_kb();
            t.read_ahead_problem = r.problem();
        }
        if let Some(i) = &self.inodes {
            t.inodes = i.len() as u64;
            if let Some(d) = i.descriptor_stats() {
                (t.inode_fds, t.inode_fd_budget, t.inode_reopens, t.inode_fds_released) =
                    (d.held, d.budget, d.reopened, d.released);
            }
        }
        if let Some(k) = &self.kernel_passthrough {
            let c = k.counts();
            t.kernel_passthrough = k.active();
            t.kernel_passthrough_problem = k.problem();
            (t.passthrough_opens, t.passthrough_files) = (c.opens, c.files);
        }
        if let Some(s) = &self.rings {
            if s.active.load(Ordering::SeqCst) {
                t.mode = "io_uring".into();
            } else if let Some(e) = s.error.lock().as_ref() {
                t.reason = format!("ring registration failed: {e}");
            } else {
                t.reason = "rings negotiated, not registered yet".into();
            }
            t.ring_queues = s.queues.load(Ordering::Relaxed);
            t.ring_entries = s.entries.load(Ordering::Relaxed);
            t.ring_requests = s.requests.load(Ordering::Relaxed);
            t.ring_commit_errors = s.commit_errors.load(Ordering::Relaxed);
        }
        t
    }
}
