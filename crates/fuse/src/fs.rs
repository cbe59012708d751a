//! [`Passthrough`]: the FUSE file system. This file holds the state, the helpers every
//! operation shares, and the `fuser::Filesystem` glue — the one place where `io::Error`
//! becomes an errno for the application. The operations themselves are in `ops_*.rs`, each
//! returning the backing system call's own error.

use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use farcache_engine::{BackingFile, BackingOptions, DataPath, FileId, Generation as DataGeneration, Identities};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle as Fh, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};

use crate::config::MountConfig;
use crate::handles::{DirHandle, FileHandle, Handles};
use crate::inode::{Inode, InodeTable};
use crate::journal::Op;
use crate::sys;

pub(crate) struct Passthrough {
    pub(crate) inodes: Arc<InodeTable>,
    pub(crate) files: Arc<Handles<FileHandle>>,
    pub(crate) dirs: Handles<DirHandle>,
    pub(crate) data: Arc<dyn DataPath>,
    pub(crate) ids: Identities,
    pub(crate) backing_opts: BackingOptions,
    pub(crate) attr_ttl: Duration,
    pub(crate) entry_ttl: Duration,
    pub(crate) keep_cache: bool,
    pub(crate) readdirplus: bool,
    /// `mount.writeback_cache`: asked of the kernel at INIT.
    pub(crate) writeback_cache: bool,
    /// `mount.xattrs`: false answers every xattr request ENOSYS, which the kernel remembers.
    pub(crate) xattrs: bool,
    /// `mount.handle_killpriv`: FUSE_HANDLE_KILLPRIV_V2 asked for at INIT (the daemon drops
    /// set-id bits and capabilities on write and truncate; the kernel stops asking for
    /// `security.capability` before every write).
    pub(crate) handle_killpriv: bool,
    pub(crate) max_write: u32,
    pub(crate) max_background: u16,
    /// We run as root: inodes we create are given to the calling user.
    pub(crate) chown_new: bool,
    /// Set when this daemon took the connection over: resolves what the earlier one knew.
    pub(crate) resolver: Option<crate::takeover::Resolver>,
    /// Where `destroy` leaves the state for the next daemon (`crate::takeover`).
    pub(crate) handover: crate::HandoverSlot,
    pub(crate) incarnation: u32,
    /// Told when an inode the kernel knows loses its last name, and when the kernel forgets
    /// it (`crate::Keeper`).
    pub(crate) keeper: crate::KeeperSlot,
    /// Several backing branches (`crate::union`); `None` for one backing directory.
    pub(crate) union: Option<Arc<crate::union::Union>>,
    /// Where operations on names record what they are about to do (`journal.rs`); `None`
    /// when it could not be opened (then a resent one may fail although it took effect).
    pub(crate) journal: Option<Arc<crate::journal::Journal>>,
    /// Requests received by opcode (`ops_count.rs`), shared with the mount's stats.
    pub(crate) ops: Arc<crate::OpCounts>,
    /// `mount.kernel_passthrough`: opens answered with the kernel's passthrough
    /// (`kernel_passthrough.rs`); `None` when off.
    pub(crate) kernel_passthrough: Option<Arc<crate::KernelPassthrough>>,
}

/// An unknown node id or handle: the kernel and we disagree, which is a bug somewhere.
pub(crate) fn stale() -> io::Error {
    sys::err(libc::ESTALE)
}

fn errno(e: io::Error) -> Errno {
    match e.raw_os_error() {
        Some(libc::EIO) => {
            // The backing store's own I/O error, passed on: say where it came from, since the
            // kernel makes EIOs of its own too (a malformed reply) and they look the same.
            tracing::debug!("answered EIO from the backing store: {e}");
            Errno::EIO
        }
        Some(n) if n > 0 => Errno::from_i32(n),
        _ => {
            tracing::debug!("error without an OS code answered as EIO: {e}");
            Errno::EIO
        }
    }
}

impl Passthrough {
    /// An application's open flags as this mount serves them: under the kernel's write-back
    /// cache the kernel reads pages of files opened write-only (to fill partial pages it
    /// caches), so those are opened for reading too.
    pub(crate) fn app_flags(&self, flags: i32) -> i32 {
        if self.writeback_cache && flags & libc::O_ACCMODE == libc::O_WRONLY {
            (flags & !libc::O_ACCMODE) | libc::O_RDWR
        } else {
            flags
        }
    }

    pub(crate) fn new(
        root: &Path,
        cfg: &MountConfig,
        data: Arc<dyn DataPath>,
        incarnation: u32,
    ) -> io::Result<Passthrough> {
        let c = sys::cname(root.as_os_str())?;
        let at_cwd = unsafe_at_fdcwd();
        let fd = sys::openat(at_cwd, &c, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        let st = sys::fstat(fd.as_fd())?;
        Ok(Passthrough {
            inodes: Arc::new(InodeTable::new(fd, &st, usize::try_from(cfg.max_inodes).unwrap_or(usize::MAX))),
            files: Arc::new(Handles::new(usize::try_from(cfg.max_open_handles).unwrap_or(usize::MAX), incarnation)),
            dirs: Handles::new(usize::try_from(cfg.max_open_handles).unwrap_or(usize::MAX), incarnation),
            data,
            ids: Identities::new(),
            backing_opts: BackingOptions {
                direct_io: cfg.direct_io_backing,
                direct_writes: cfg.direct_io_backing_writes,
            },
            attr_ttl: cfg.attr_timeout.get(),
            entry_ttl: cfg.entry_timeout.get(),
            keep_cache: cfg.keep_cache,
            readdirplus: cfg.readdirplus,
            writeback_cache: cfg.writeback_cache,
            xattrs: cfg.xattrs,
            handle_killpriv: cfg.handle_killpriv,
            max_write: u32::try_from(cfg.max_write.bytes()).unwrap_or(u32::MAX),
            max_background: cfg.max_background,
            chown_new: sys::is_root(),
            resolver: None,
            handover: crate::HandoverSlot::default(),
            incarnation,
            keeper: crate::KeeperSlot::default(),
            union: None,
            journal: None,
            ops: Arc::default(),
            kernel_passthrough: cfg.kernel_passthrough.then(crate::KernelPassthrough::new),
        })
    }

    pub(crate) fn inode(&self, ino: INodeNo) -> io::Result<Arc<Inode>> {
        if let Some(i) = self.inodes.get(ino.0) {
            return Ok(i);
        }
        match &self.resolver {
            Some(r) => r.resolve(&self.inodes, ino.0),
            None => Err(stale()),
        }
    }

    /// The open file `fh` of node `ino`; after a takeover, a handle of the earlier daemon is
    /// reopened here with the request's open `flags` (or read-write where a request has none).
    pub(crate) fn file(&self, ino: INodeNo, fh: Fh, flags: Option<i32>) -> io::Result<Arc<FileHandle>> {
        if let Some(h) = self.files.get(fh.0) {
            return Ok(h);
        }
        if self.resolver.is_none() || fh.0 >> crate::handles::INCARNATION_SHIFT == u64::from(self.incarnation) {
            return Err(sys::err(libc::EBADF));
        }
        let inode = self.inode(ino)?;
        // A union: no move of this file between the reopen and the handle's entry (as in
        // `do_open`; never called with the gate held).
        let _g = self.union.as_ref().map(|u| u.gate.read());
        let flags = self.app_flags(flags.unwrap_or(libc::O_RDWR));
        let fd = sys::reopen(inode.fd()?.as_fd(), crate::ops_entry::backing_open_flags(flags)).or_else(|e| {
            // No flags known and not writable by us: a read-only reopen still serves fsync/lseek.
            if flags == libc::O_RDWR {
                sys::reopen(inode.fd()?.as_fd(), libc::O_RDONLY)
            } else {
                Err(e)
            }
        })?;
        let branch = self.union.as_ref().map_or(crate::handles::NO_BRANCH, |u| u.branch_of(fd.as_fd()));
        let backing = self.backing(&inode, File::from(fd), flags)?;
        tracing::debug!("takeover: reopened file handle {} of node {}", fh.0, ino.0);
        self.files.insert_at(fh.0, FileHandle::on(backing, branch))
    }

    /// The open directory `fh` of node `ino` (reopened after a takeover, as [`Self::file`]).
    pub(crate) fn dir(&self, ino: INodeNo, fh: Fh) -> io::Result<Arc<DirHandle>> {
        if let Some(d) = self.dirs.get(fh.0) {
            return Ok(d);
        }
        if self.resolver.is_none() || fh.0 >> crate::handles::INCARNATION_SHIFT == u64::from(self.incarnation) {
            return Err(sys::err(libc::EBADF));
        }
        let inode = self.inode(ino)?;
        let fd = sys::openat(inode.fd()?.as_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        // Read once from the start before serving: the first request on a reopened handle
        // may be at the end (the kernel resends one that was in flight), and on ext4 a fresh
        // hashed-directory stream first read at its end-of-directory cookie then returns
        // nothing when sought back to 0 (its position state stays at the end: found by the
        // load in tests/takeover.rs). A stream that has read from 0 has no such state.
        let mut scratch = vec![0u8; 8 * 1024];
        sys::getdents(fd.as_fd(), &mut scratch)?;
        tracing::debug!("takeover: reopened directory handle {} of node {}", fh.0, ino.0);
        self.dirs.insert_at(fh.0, DirHandle { inode, fd: parking_lot::Mutex::new(fd), merged: Default::default() })
    }

    pub(crate) fn attr(&self, nodeid: u64, st: &libc::stat) -> FileAttr {
        FileAttr {
            ino: INodeNo(nodeid),
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: systime(st.st_atime, st.st_atime_nsec),
            mtime: systime(st.st_mtime, st.st_mtime_nsec),
            ctime: systime(st.st_ctime, st.st_ctime_nsec),
            crtime: UNIX_EPOCH,
            kind: kind(st.st_mode),
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            // The kernel's 32-bit device encoding equals glibc's for the low 32 bits.
            rdev: st.st_rdev as u32,
            blksize: st.st_blksize as u32,
            flags: 0,
        }
    }

    /// Look `name` up in `parent` and count one kernel reference to it.
    pub(crate) fn entry_of(&self, parent: &Inode, name: &CStr) -> io::Result<(Arc<Inode>, FileAttr)> {
        let fd = sys::openat(parent.fd()?.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let st = sys::fstat(fd.as_fd())?;
        let inode = self.inodes.lookup(fd, &st)?;
        let attr = self.attr(inode.nodeid, &st);
        Ok((inode, attr))
    }

    /// Give a just-created inode (`fd`, in `parent`) to the calling user, as the kernel does
    /// for a local file system. The group is the caller's unless the parent directory is
    /// set-group-id (then the backing file system already gave it the directory's group).
    pub(crate) fn give_to_caller(&self, req: &Request, parent: &Inode, fd: BorrowedFd<'_>) -> io::Result<()> {
        if !self.chown_new || (req.uid() == 0 && req.gid() == 0) {
            return Ok(());
        }
        let pst = sys::fstat(parent.fd()?.as_fd())?;
        let gid = if pst.st_mode & libc::S_ISGID != 0 { u32::MAX } else { req.gid() };
        sys::fchown(fd, req.uid(), gid)
    }

    /// Wrap `file`, opened on `inode` with the application's open `flags`, for the data path.
    pub(crate) fn backing(&self, inode: &Inode, file: File, flags: i32) -> io::Result<BackingFile> {
        let id = match inode.file_id.get() {
            Some(id) => *id,
            None => {
                let id = self.ids.identify(&file)?;
                *inode.file_id.get_or_init(|| id)
            }
        };
        let b = BackingFile::new(id, file, flags & libc::O_ACCMODE, &self.backing_opts)
            .with_app_flags(flags, &self.backing_opts);
        self.data.opened(&b);
        Ok(b)
    }

    /// The identity of a regular file that has just lost its last name, for `forget`.
    pub(crate) fn identity_of_unlinked(&self, dev: u64, ino: u64, fd: BorrowedFd<'_>) -> Option<FileId> {
        if let Some(id) = self.inodes.find(dev, ino).and_then(|i| i.file_id.get().copied()) {
            return Some(id);
        }
        // Never opened through this mount (or forgotten since): only a file-system generation
        // can name blocks cached under it; a process-local one died with its inode record.
        let f = sys::reopen(fd, libc::O_RDONLY | libc::O_NONBLOCK).ok()?;
        let g = farcache_engine::identity::fs_generation(f.as_fd())?;
        Some(FileId { dev, ino, generation: DataGeneration::Fs(g) })
    }
}

/// `AT_FDCWD` as a borrowed descriptor, for `*at` calls on absolute or relative paths.
pub(crate) fn unsafe_at_fdcwd() -> BorrowedFd<'static> {
    // SAFETY: AT_FDCWD is a sentinel the *at system calls accept in place of a descriptor;
    // it is never closed or read through.
    unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) }
}

fn systime(secs: i64, nsecs: i64) -> SystemTime {
    let nsecs = nsecs.clamp(0, 999_999_999) as u32;
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs)
    } else {
        UNIX_EPOCH - Duration::new(secs.unsigned_abs(), 0) + Duration::new(0, nsecs)
    }
}

pub(crate) fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub(crate) fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    match t {
        None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        Some(TimeOrNow::Now) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec { tv_sec: d.as_secs() as i64, tv_nsec: i64::from(d.subsec_nanos()) },
            Err(e) => {
                let d = e.duration();
                let mut s = -(d.as_secs() as i64);
                let mut ns = -i64::from(d.subsec_nanos());
                if ns < 0 {
                    s -= 1;
                    ns += 1_000_000_000;
                }
                libc::timespec { tv_sec: s, tv_nsec: ns }
            }
        },
    }
}

macro_rules! answer {
    ($reply:expr, $res:expr, |$v:pat_param| $ok:expr) => {
        match $res {
            Ok($v) => $ok,
            Err(e) => $reply.error(errno(e)),
        }
    };
}

impl Filesystem for Passthrough {
    fn request_received(&self, opcode: u32) {
        self.ops.count(opcode);
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(n) = config.set_max_write(self.max_write) {
            let _ = config.set_max_write(n);
        }
        let _ = config.set_max_background(self.max_background);
        let _ = config.set_congestion_threshold((u32::from(self.max_background) * 3 / 4).max(1) as u16);
        let mut want = vec![
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_ASYNC_DIO,
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            // An O_DIRECT open is answered as direct I/O (`fopen_flags`); mmap of it must
            // still work as it did through the page cache.
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
        ];
        if self.readdirplus {
            want.push(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        }
        if self.writeback_cache {
            want.push(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        if self.handle_killpriv {
            // The kernel then sets SB_NOSEC: after a file's first write finds no set-id bit
            // and no capability, it stops asking (one GETXATTR round trip per write(2)
            // saved), and leaves dropping them to us (`sys::kill_suidgid`, and the backing
            // file system's own handling of capabilities when we write it).
            want.push(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        }
        for f in want {
            if let Err(missing) = config.add_capabilities(f) {
                tracing::debug!("kernel lacks FUSE capability {missing:?}");
            }
        }
        if let Some(k) = &self.kernel_passthrough {
            // Depth 1: the backing files are on an ordinary file system (not a stacked one),
            // and nothing may be stacked on this mount.
            match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).map(|()| config.set_max_stack_depth(1)) {
                Ok(Ok(_)) => k.set_negotiated(true, ""),
                Ok(Err(_)) => k.set_negotiated(false, "the kernel's INIT refused a passthrough stack depth of 1"),
                Err(_) => k.set_negotiated(
                    false,
                    "the kernel's INIT did not offer FUSE_PASSTHROUGH (Linux 6.9+ built with CONFIG_FUSE_PASSTHROUGH)",
                ),
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.handover.fill(&self.inodes, self.incarnation);
        tracing::debug!(
            "session ends: {} inodes known, {} files and {} directories open",
            self.inodes.len(),
            self.files.len(),
            self.dirs.len()
        );
        if let Some(d) = self.inodes.descriptor_stats() {
            tracing::info!(
                "inode descriptors: {} held (budget {}), {} reopened by file handle, {} let go of",
                d.held,
                d.budget,
                d.reopened,
                d.released
            );
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        answer!(reply, self.do_lookup(parent, name), |(_, a)| reply.entry_with_ttls(
            &self.attr_ttl,
            &self.entry_ttl,
            &a,
            Generation(0)
        ))
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let known = self.inodes.get(ino.0);
        if self.inodes.forget(ino.0, nlookup) {
            self.keeper.tell(crate::Kept::Forgotten { nodeid: ino.0 });
            // Forgotten with no name left: no process can have it open (an open file keeps
            // the kernel's inode), so its data will never be read again.
            if let Some(i) = known.filter(|i| i.fmt == libc::S_IFREG) {
                if let Some(id) = i.file_id.get().filter(|_| i.is_nameless()) {
                    self.data.discard(id);
                }
            }
        } else if let Some(r) = &self.resolver {
            // Known to the kernel from the earlier daemon and never used since.
            r.forget(ino.0, nlookup);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<Fh>, reply: ReplyAttr) {
        answer!(reply, self.do_getattr(ino, fh), |a| reply.attr(&self.attr_ttl, &a))
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<Fh>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = crate::ops_attr::SetAttr { mode, uid, gid, size, atime, mtime, kill_suidgid: req.uid() != 0 };
        answer!(reply, self.do_setattr(ino, fh, &set), |a| reply.attr(&self.attr_ttl, &a))
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        answer!(reply, self.inode(ino).and_then(|i| sys::readlink(i.fd()?.as_fd())), |t| reply.data(&t))
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        // Each journaled operation's ticket (`_held`) is dropped after the reply is written.
        let (res, _held) =
            self.make_once(req, Op::Mknod, parent, name, || self.do_mknod(req, parent, name, mode, rdev));
        answer!(reply, res, |a| { self.entry(reply, &a) })
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let (res, _held) = self.make_once(req, Op::Mkdir, parent, name, || self.do_mkdir(req, parent, name, mode));
        answer!(reply, res, |a| self.entry(reply, &a))
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (res, _held) = self.unlink_once(req.unique().0, parent, name, false);
        answer!(reply, res, |()| reply.ok())
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (res, _held) = self.unlink_once(req.unique().0, parent, name, true);
        answer!(reply, res, |()| reply.ok())
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let (res, _held) =
            self.make_once(req, Op::Symlink, parent, link_name, || self.do_symlink(req, parent, link_name, target));
        answer!(reply, res, |a| self.entry(reply, &a))
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (res, _held) = self.rename_once(req.unique().0, parent, name, newparent, newname, flags.bits());
        answer!(reply, res, |()| reply.ok())
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let (res, _held) = self.link_once(req.unique().0, ino, newparent, newname);
        answer!(reply, res, |a| self.entry(reply, &a))
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        answer!(reply, self.do_open(ino, self.app_flags(flags.0), req.uid() != 0), |fh| {
            match self.passthrough_id(ino.0, fh, |fd| reply.open_backing(fd)) {
                Some(id) => reply.opened_passthrough(Fh(fh), FopenFlags::empty(), &id),
                None => reply.opened(Fh(fh), self.fopen_flags(flags.0)),
            }
        })
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: Fh,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        answer!(reply, self.do_read(ino, fh, offset, size, _flags.0), |d| {
            reply.data(&d);
            // What the read left for after its answer (a stream probe of the lenders) runs
            // now, on this thread, while the kernel already has the data — and the read's
            // buffer is back in its pool.
            drop(d);
            self.data.after_reply();
        })
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: Fh,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        answer!(reply, self.do_write(ino, fh, offset, data, _flags.0, kill), |n| reply.written(n))
    }

    fn flush(&self, _req: &Request, ino: INodeNo, fh: Fh, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Writes are in the backing file, or in the write-back tier (which answers for them
        // until it has written them back) when acknowledged; as on a local file system, close
        // makes nothing durable — fsync does (docs/SEMANTICS.md). Locks are the kernel's (no
        // POSIX lock capability is negotiated). Nothing to flush.
        answer!(reply, self.file(ino, fh, None), |_| reply.ok())
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: Fh,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.remove(fh.0);
        if let Some(k) = &self.kernel_passthrough {
            k.release(fh.0);
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: Fh, datasync: bool, reply: ReplyEmpty) {
        answer!(reply, self.file(ino, fh, None).and_then(|h| self.data.fsync(&h.backing, datasync)), |()| reply.ok())
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        answer!(reply, self.do_opendir(ino), |fh| reply.opened(Fh(fh), FopenFlags::empty()))
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: Fh, offset: u64, mut reply: ReplyDirectory) {
        match self.do_readdir(ino, fh, offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: Fh, offset: u64, mut reply: ReplyDirectoryPlus) {
        match self.do_readdirplus(ino, fh, offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: Fh, _flags: OpenFlags, reply: ReplyEmpty) {
        self.dirs.remove(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, fh: Fh, datasync: bool, reply: ReplyEmpty) {
        let r = match &self.union {
            // Names may have changed on every branch the directory is on.
            Some(_) => self.u_fsyncdir(ino, fh, datasync),
            None => self.dir(ino, fh).and_then(|d| sys::fsync_fd(d.fd.lock().as_fd(), datasync)),
        };
        answer!(reply, r, |()| reply.ok())
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let s = match &self.union {
            Some(u) => u.statfs(),
            None => self.inode(ino).and_then(|i| sys::fstatvfs(i.fd()?.as_fd())),
        };
        answer!(reply, s, |s| reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        ))
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if !self.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        answer!(reply, self.do_setxattr(ino, name, value, flags), |()| reply.ok())
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if !self.xattrs {
            // The kernel answers every later getxattr itself ("not supported"), including the
            // security.capability check it makes before each write.
            return reply.error(Errno::ENOSYS);
        }
        answer!(reply, self.do_getxattr(ino, name, size), |v| match v {
            crate::ops_attr::XattrAnswer::Size(n) => reply.size(n),
            crate::ops_attr::XattrAnswer::Data(d) => reply.data(&d),
        })
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if !self.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        answer!(reply, self.do_listxattr(ino, size), |v| match v {
            crate::ops_attr::XattrAnswer::Size(n) => reply.size(n),
            crate::ops_attr::XattrAnswer::Data(d) => reply.data(&d),
        })
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if !self.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        answer!(reply, self.do_removexattr(ino, name), |()| reply.ok())
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        answer!(reply, self.inode(ino).and_then(|i| sys::faccess(i.fd()?.as_fd(), mask.bits())), |()| reply.ok())
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (res, _held) = self.create_once(req, parent, name, mode, self.app_flags(flags));
        answer!(reply, res, |(a, fh)| match self.passthrough_id(a.ino.0, fh, |fd| reply.open_backing(fd)) {
            Some(id) => reply.created_passthrough(&self.attr_ttl, &a, Generation(0), Fh(fh), FopenFlags::empty(), &id),
            None => reply.created(&self.attr_ttl, &a, Generation(0), Fh(fh), self.fopen_flags(flags)),
        })
    }

    fn fallocate(&self, _req: &Request, ino: INodeNo, fh: Fh, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        answer!(reply, self.do_fallocate(ino, fh, offset, length, mode), |()| { reply.ok() })
    }

    fn lseek(&self, _req: &Request, ino: INodeNo, fh: Fh, offset: i64, whence: i32, reply: ReplyLseek) {
        // The kernel asks only for SEEK_DATA / SEEK_HOLE. Where written data may not be in
        // the backing file yet — in the kernel's write-back cache, or in a write-back tier —
        // the backing file's holes are not the file's: ENOSYS has the kernel answer for good
        // as for any file system without them (the whole file is data, the hole at its end).
        if (whence == libc::SEEK_DATA || whence == libc::SEEK_HOLE)
            && (self.writeback_cache || !self.data.backing_is_complete())
        {
            return reply.error(Errno::ENOSYS);
        }
        answer!(
            reply,
            self.file(ino, fh, None).and_then(|h| sys::lseek(h.backing.file().as_fd(), offset, whence)),
            |o| reply.offset(o)
        )
    }
}

impl Passthrough {
    /// With `mount.kernel_passthrough`: the backing id to answer the open of handle `fh` of
    /// node `ino` with (`register` makes one from a descriptor of the backing file); `None`
    /// to serve the file through the daemon.
    fn passthrough_id(
        &self,
        ino: u64,
        fh: u64,
        register: impl FnOnce(BorrowedFd<'_>) -> io::Result<fuser::BackingId>,
    ) -> Option<Arc<fuser::BackingId>> {
        let k = self.kernel_passthrough.as_ref()?;
        let h = self.files.get(fh)?;
        k.attach(ino, fh, h.backing.file().as_fd(), register)
    }

    fn entry(&self, reply: ReplyEntry, a: &FileAttr) {
        reply.entry_with_ttls(&self.attr_ttl, &self.entry_ttl, a, Generation(0))
    }

    /// What the kernel is told about an open of a file with `flags`. An `O_DIRECT` open
    /// bypasses the page cache anyway; answered as direct I/O with parallel writes, its writes
    /// to one file no longer wait for each other under the inode's lock in the kernel (paper
    /// 002's serialisation: measured 0.13–0.28× native at queue depth ≥ 4 before, BENCHMARKS.md
    /// "The backing I/O engine"). The kernel keeps the exclusive lock where it must (appends,
    /// writes past the end, a file also open through the page cache) and invalidates cached
    /// pages of the range it writes.
    fn fopen_flags(&self, flags: i32) -> FopenFlags {
        if flags & libc::O_DIRECT != 0 {
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        } else if self.keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }
}
