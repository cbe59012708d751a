//! The kernel's FUSE passthrough (Linux 6.9+, `mount.kernel_passthrough`): an open file's
//! reads, writes and mmap go from the kernel straight to the backing file, without a request
//! to this daemon. Only for a mount whose every read belongs on the disk anyway — no lenders,
//! no write-back tier, one backing directory — where the daemon would only add its round trip
//! (paper 002's issue: a mount that cannot come near the disk's own rate at queue depth 16).
//! What still reaches the daemon: lookups, attributes, open/close, truncate, fsync, xattrs.
//!
//! The kernel's rules this module keeps:
//! - A backing file is registered with `FUSE_DEV_IOC_BACKING_OPEN` (root only) and named by
//!   a backing id in the open's reply. Every open of one inode must name the same backing
//!   (the kernel refuses another with EIO to the application), so the id is kept per inode
//!   and shared by its opens, and closed when the last of them is released.
//! - For each open the kernel opens its own file on the backing path with the
//!   application's flags: an `O_DIRECT` open stays direct, an `O_RDONLY` one read-only —
//!   whatever descriptor registered the id.
//! - An inode is either in passthrough or in cached mode: once passthrough fails (the
//!   ioctl refused), it is switched off for the whole mount, loudly, and later opens are
//!   served by the daemon; inodes already in passthrough keep their id until their last
//!   close, so no open is ever refused for the switch.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use fuser::BackingId;
use parking_lot::Mutex;

/// Per inode: its backing id and the opens that use it.
struct Registered {
    id: Arc<BackingId>,
    opens: u64,
}

#[derive(Default)]
struct State {
    /// Node id → its backing id, while one of its files is open in passthrough.
    inodes: HashMap<u64, Registered>,
    /// Handle → node id, for the handles opened in passthrough.
    handles: HashMap<u64, u64>,
}

/// The mount's passthrough: its per-inode backing ids and its counters.
#[derive(Default)]
pub struct KernelPassthrough {
    state: Mutex<State>,
    /// INIT agreed to FUSE_PASSTHROUGH.
    negotiated: AtomicBool,
    /// Why passthrough does not serve ("" while it does or before INIT).
    problem: Mutex<String>,
    /// Opens answered with passthrough.
    opens: AtomicU64,
}

/// What `farcache stats` shows of it (`fuse.kernel_passthrough*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassthroughCounts {
    pub opens: u64,
    pub files: u64,
}

impl KernelPassthrough {
    pub fn new() -> Arc<KernelPassthrough> {
        Arc::new(KernelPassthrough::default())
    }

    /// At INIT: whether the kernel agreed.
    pub(crate) fn set_negotiated(&self, yes: bool, why_not: &str) {
        self.negotiated.store(yes, Ordering::SeqCst);
        if !yes {
            self.refuse(why_not);
        }
    }

    fn refuse(&self, why: &str) {
        let mut p = self.problem.lock();
        if p.is_empty() {
            tracing::error!(
                "mount.kernel_passthrough: {why}; files are served by the daemon from now on (files already open \
                 in passthrough stay so until closed)"
            );
            *p = why.to_string();
        }
    }

    /// Whether passthrough serves (negotiated, never refused).
    pub fn active(&self) -> bool {
        self.negotiated.load(Ordering::SeqCst) && self.problem.lock().is_empty()
    }

    /// Why it does not serve ("" when it does).
    pub fn problem(&self) -> String {
        self.problem.lock().clone()
    }

    pub fn counts(&self) -> PassthroughCounts {
        PassthroughCounts { opens: self.opens.load(Ordering::Relaxed), files: self.state.lock().inodes.len() as u64 }
    }

    /// The backing id handle `fh` of node `ino` is to be opened with: the inode's own if
    /// one of its files is open in passthrough, else a new one made by `register` from `fd`.
    /// `None`: serve this open through the daemon (passthrough off, or just refused).
    pub(crate) fn attach<F: AsFd>(
        &self,
        ino: u64,
        fh: u64,
        fd: F,
        register: impl FnOnce(F) -> io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        let mut st = self.state.lock();
        let id = match st.inodes.get_mut(&ino) {
            Some(r) => {
                r.opens += 1;
                r.id.clone()
            }
            None => {
                if !self.active() {
                    return None;
                }
                match register(fd) {
                    Ok(id) => {
                        let id = Arc::new(id);
                        st.inodes.insert(ino, Registered { id: id.clone(), opens: 1 });
                        id
                    }
                    Err(e) => {
                        drop(st);
                        let fix = if e.raw_os_error() == Some(libc::EPERM) {
                            " (it needs CAP_SYS_ADMIN: run the mount as root)"
                        } else {
                            ""
                        };
                        self.refuse(&format!("the kernel refused to register a backing file: {e}{fix}"));
                        return None;
                    }
                }
            }
        };
        st.handles.insert(fh, ino);
        self.opens.fetch_add(1, Ordering::Relaxed);
        Some(id)
    }

    /// Handle `fh` was released: its inode's backing id is closed with its last open.
    pub(crate) fn release(&self, fh: u64) {
        let mut st = self.state.lock();
        let Some(ino) = st.handles.remove(&fh) else { return };
        if let Some(r) = st.inodes.get_mut(&ino) {
            r.opens -= 1;
            if r.opens == 0 {
                st.inodes.remove(&ino); // dropping the last reference closes the id
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // `BackingId` can only be made by the kernel; the bookkeeping is tested with refusals
    // here and for real through a mount (crates/cli/tests/kernel_passthrough.rs).
    #[test]
    fn a_refused_registration_switches_passthrough_off_once_and_serves_through_the_daemon() {
        let k = KernelPassthrough::new();
        assert!(!k.active(), "not before INIT");
        k.set_negotiated(true, "");
        assert!(k.active());
        let f = std::fs::File::open("/dev/null").unwrap();
        let got = k.attach(7, 1, &f, |_| Err(io::Error::from_raw_os_error(libc::EPERM)));
        assert!(got.is_none());
        assert!(!k.active());
        assert!(k.problem().contains("CAP_SYS_ADMIN"), "{}", k.problem());
        // Later opens are not tried again.
        let mut tried = false;
        assert!(k
            .attach(8, 2, &f, |_| {
                tried = true;
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            })
            .is_none());
        assert!(!tried);
        assert_eq!(k.counts(), PassthroughCounts { opens: 0, files: 0 });
        k.release(1); // a handle never in passthrough: nothing to do
    }

    #[test]
    fn a_kernel_without_passthrough_says_so() {
        let k = KernelPassthrough::new();
        k.set_negotiated(false, "the kernel's INIT did not offer FUSE_PASSTHROUGH");
        assert!(!k.active());
        assert!(k.problem().contains("FUSE_PASSTHROUGH"));
    }
}
