//! Who a backing file is: `(device, inode, generation)`.
//!
//! Why the generation matters: inode numbers are reused. When a file is deleted, its file
//! system may hand the same inode number to the next file it creates on that device. A cache
//! keyed by `(dev, ino)` alone would then answer reads of the new file with blocks of the dead
//! one — wrong data, silently, long after the delete. The generation tells the lives of an
//! inode number apart: the file system draws a new one each time it allocates the number
//! (ext4, XFS and btrfs draw it at random or from a counter, and report it through the
//! `FS_IOC_GETVERSION` ioctl). Where a file system does not report one, this process makes
//! one up per inode it opens ([`Generation::Local`]); such an identity is never equal to one
//! from another run, so a restarted mount can never mistake an old cached block for current.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// The identity of a backing file's data for the whole life of its inode: the key under which
/// tiers in front of the disk may keep its blocks. Equal identities mean the same file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    /// `st_dev` of the backing file.
    pub dev: u64,
    /// `st_ino` of the backing file.
    pub ino: u64,
    pub generation: Generation,
}

/// `FileId::dev` of identities a mount of several backing branches gives (`farcache_fuse`'s
/// union): no `st_dev` has these high bits set, so such an identity never equals one derived
/// from a backing inode.
pub const UNION_DEV: u64 = 0xfa2c_ac4e_0000_0000;

impl FileId {
    /// The identity of a file of a mount of several branches, from its farcache id (kept
    /// with the file, never reused, unchanged when the file moves to another branch).
    pub fn union(id: u64) -> FileId {
        FileId { dev: UNION_DEV, ino: id, generation: Generation::Fs(0) }
    }

    /// The farcache id of a union identity.
    pub fn union_id(&self) -> Option<u64> {
        (self.dev == UNION_DEV).then_some(self.ino)
    }
}

/// What a tier needs of a mount of several backing branches (`farcache_fuse`'s union), which
/// the engine knows nothing else of: which file of it a descriptor is (the write-back tier
/// finds its files again by their farcache id after a restart).
pub trait UnionFiles: Send + Sync {
    /// The farcache id of the file `file` is open on, if it is a live file of the union: it
    /// has a name on a branch (outside the union's own directory) and its id record is its
    /// own (written for this branch and inode). `None` for anything else — a deleted inode,
    /// a copy in progress, a source a move set aside.
    fn live_id(&self, file: &File) -> Option<u64>;
}

/// Which life of an inode number a [`FileId`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Generation {
    /// The file system's own inode generation (`FS_IOC_GETVERSION`): drawn anew each time
    /// the inode number is allocated, and stable across mounts and reboots.
    Fs(u32),
    /// The file system reports none. `epoch` is drawn at random when the process starts and
    /// `seq` counts the inodes it has identified, so the pair is unique to one inode record
    /// of one run. Caching under it is safe but forgets everything on restart.
    Local { epoch: u64, seq: u64 },
}

/// Hands out [`FileId`]s. One per mount.
#[derive(Debug)]
pub struct Identities {
    epoch: u64,
    next_seq: AtomicU64,
}

impl Default for Identities {
    fn default() -> Self {
        Self::new()
    }
}

impl Identities {
    pub fn new() -> Identities {
        Identities { epoch: random_u64(), next_seq: AtomicU64::new(1) }
    }

    /// The identity of the file `file` is open on. `file` must be a real open file (not an
    /// `O_PATH` descriptor: the ioctl needs one). Only regular files are asked for their
    /// generation: on a device the ioctl would go to the driver.
    pub fn identify(&self, file: &File) -> io::Result<FileId> {
        let st = fstat(file.as_fd())?;
        let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
        let generation = match regular.then(|| fs_generation(file.as_fd())).flatten() {
            Some(g) => Generation::Fs(g),
            None => self.local(),
        };
        Ok(FileId { dev: st.st_dev, ino: st.st_ino, generation })
    }

    /// A fresh process-local generation, for file systems without `FS_IOC_GETVERSION`.
    pub fn local(&self) -> Generation {
        Generation::Local { epoch: self.epoch, seq: self.next_seq.fetch_add(1, Ordering::Relaxed) }
    }
}

/// The file system's inode generation of `fd`, or `None` where the file system does not
/// report one (the ioctl fails with ENOTTY, EOPNOTSUPP, EINVAL...).
pub fn fs_generation(fd: BorrowedFd<'_>) -> Option<u32> {
    // The ioctl is declared with a `long` argument but the kernel stores an `int`: pass a
    // zeroed long and keep the low 32 bits.
    let mut g: libc::c_long = 0;
    // SAFETY: FS_IOC_GETVERSION writes at most sizeof(long) bytes to the pointer we own.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_GETVERSION, &mut g) };
    (r == 0).then_some(g as u32)
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat fills `st` on success; we read it only then.
    let r = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: initialised by the successful fstat.
    Ok(unsafe { st.assume_init() })
}

/// A random u64 from the operating system (`getrandom`, through the AEAD crate's `OsRng`).
fn random_u64() -> u64 {
    use chacha20poly1305::aead::rand_core::RngCore;
    chacha20poly1305::aead::OsRng.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn local_generations_are_unique_and_epochs_differ_between_instances() {
        let a = Identities::new();
        let b = Identities::new();
        assert_ne!(a.local(), a.local());
        assert_ne!(a.epoch, b.epoch, "two runs must not share an epoch");
    }

    #[test]
    fn identify_names_the_inode_and_is_stable() {
        let dir = std::env::temp_dir().join(format!("farcache-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        std::fs::File::create(&p).unwrap().write_all(b"x").unwrap();
        let ids = Identities::new();
        let f1 = File::open(&p).unwrap();
        let f2 = File::open(&p).unwrap();
        let a = ids.identify(&f1).unwrap();
        let b = ids.identify(&f2).unwrap();
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!((a.dev, a.ino), (md.dev(), md.ino()));
        if let Generation::Fs(_) = a.generation {
            // The file system reports generations: two opens of one inode agree.
            assert_eq!(a, b);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
