//! Filesystem session
//!
//! A session runs a filesystem implementation while it is being mounted to a specific mount
//! point. A session begins by mounting the filesystem and ends by unmounting it. While the
//! filesystem is mounted, the session loop receives, dispatches and replies to kernel requests
//! for filesystem operations under its mount point.

use std::borrow::Cow;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::BorrowedFd;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::thread::{self};

use log::debug;
use log::error;
use log::info;
use log::warn;
use nix::unistd::Uid;
use nix::unistd::geteuid;
use parking_lot::Mutex;

use crate::Errno;
use crate::Filesystem;
use crate::KernelConfig;
use crate::MountOption;
use crate::ReplyEmpty;
use crate::Request;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::dev_fuse::DevFuse;
use crate::ll;
use crate::ll::Operation;
use crate::ll::ResponseErrno;
use crate::ll::Version;
use crate::ll::flags::init_flags::InitFlags;
use crate::ll::fuse_abi as abi;
use crate::mnt::Mount;
use crate::mnt::mount_options::Config;
use crate::mnt::mount_options::check_option_conflicts;
use crate::notify::Notifier;
use crate::read_buf::FuseReadBuf;
use crate::reply::Reply;
use crate::reply::ReplyRaw;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;

/// The max size of write requests from the kernel. The absolute minimum is 4k,
/// FUSE recommends at least 128k, max 16M. The FUSE default is 16M on macOS
/// and 128k on other systems.
pub(crate) const MAX_WRITE_SIZE: usize = 16 * 1024 * 1024;

#[derive(Default, Debug, Eq, PartialEq, Clone, Copy)]
/// How requests should be filtered based on the calling UID.
pub enum SessionACL {
    /// Allow requests from any user. Corresponds to the `allow_other` mount option.
    All,
    /// Allow requests from root. Corresponds to the `allow_root` mount option.
    RootAndOwner,
    /// Allow requests from the owning UID. This is FUSE's default mode of operation.
    #[default]
    Owner,
}

impl SessionACL {
    /// Returns the mount option string for kernel/fusermount/libfuse paths.
    /// Both `All` and `RootAndOwner` map to `allow_other` - the kernel only
    /// understands `allow_other`, and fuser enforces the root-only restriction internally.
    #[allow(dead_code)]
    pub(crate) fn to_mount_option(self) -> Option<&'static str> {
        match self {
            SessionACL::All | SessionACL::RootAndOwner => Some("allow_other"),
            SessionACL::Owner => None,
        }
    }
}

/// Calls `destroy` on drop.
#[derive(Debug)]
pub(crate) struct FilesystemHolder<FS: Filesystem> {
    pub(crate) fs: Option<FS>,
}

impl<FS: Filesystem> FilesystemHolder<FS> {
    fn destroy(&mut self) {
        if let Some(mut fs) = self.fs.take() {
            fs.destroy();
        }
    }
}

impl<FS: Filesystem> Drop for FilesystemHolder<FS> {
    fn drop(&mut self) {
        self.destroy();
    }
}

#[derive(Debug)]
struct UmountOnDrop {
    mount: Arc<Mutex<Option<Mount>>>,
}

impl UmountOnDrop {
    fn umount(&self) -> io::Result<()> {
        if let Some(mount) = self.mount.lock().take() {
            mount.umount()?;
        }
        Ok(())
    }
}

impl Drop for UmountOnDrop {
    fn drop(&mut self) {
        if let Err(e) = self.umount() {
            warn!("Failed to umount filesystem: {}", e);
        }
    }
}

/// The session data structure
#[derive(Debug)]
pub struct Session<FS: Filesystem> {
    /// Filesystem operation implementations. None after `destroy` called.
    pub(crate) filesystem: FilesystemHolder<FS>,
    /// Communication channel to the kernel driver
    pub(crate) ch: Channel,
    /// Handle to the mount.  Dropping this unmounts.
    mount: UmountOnDrop,
    /// Whether to restrict access to owner, root + owner, or unrestricted
    /// Used to implement `allow_root` and `auto_unmount`
    pub(crate) allowed: SessionACL,
    /// User that launched the fuser process
    pub(crate) session_owner: Uid,
    /// FUSE protocol version, as reported by the kernel.
    /// The field is set to `Some` when the init message is received.
    pub(crate) proto_version: Option<Version>,
    pub(crate) config: Config,
    /// farcache patch: descriptors (already cloned from the main one with
    /// `FUSE_DEV_IOC_CLONE`) for the worker threads, used before cloning new ones.
    worker_fds: Vec<OwnedFd>,
    /// farcache patch: when set, the loop can be stopped cleanly (see [`SessionStopper`]).
    stopper: Option<SessionStopper>,
    /// farcache patch: what the FUSE-over-io_uring transport negotiated and did.
    uring_stats: Arc<crate::UringStats>,
    /// farcache patch: the ring payload buffer the kernel requires (set at INIT).
    uring_payload: usize,
    /// farcache patch: bytes of each read loop's request buffer faulted in (and locked where
    /// allowed) before its first read; 0 for none ([`Session::prefault_read_buffers`]).
    prefault: usize,
}

/// farcache patch: stops a session loop at a clean point. After [`SessionStopper::stop`],
/// each worker thread finishes the request it is handling (its reply is sent), reads no
/// other, and [`Session::run`] returns `Ok(())` once every thread is done, without
/// unmounting and without touching the connection: requests the kernel queues meanwhile wait
/// for the next reader of the same connection (a new session on a copy of the descriptor).
#[derive(Debug, Clone)]
pub struct SessionStopper {
    inner: Arc<StopInner>,
}

#[derive(Debug)]
struct StopInner {
    stopped: std::sync::atomic::AtomicBool,
    /// Becomes readable (and stays so) at `stop`: wakes every thread waiting in poll(2).
    eventfd: OwnedFd,
}

impl SessionStopper {
    fn new() -> io::Result<SessionStopper> {
        // SAFETY: plain syscall; the result is checked and then owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let eventfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(SessionStopper {
            inner: Arc::new(StopInner {
                stopped: std::sync::atomic::AtomicBool::new(false),
                eventfd,
            }),
        })
    }

    /// Ask every worker thread to stop after its current request. Returns at once.
    pub fn stop(&self) {
        use std::os::fd::AsRawFd;
        self.inner
            .stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to an eventfd we own.
        unsafe {
            libc::write(
                self.inner.eventfd.as_raw_fd(),
                (&one as *const u64).cast(),
                8,
            )
        };
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.inner
            .stopped
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A waiter for one worker thread: an epoll instance on its descriptor and on the
    /// stopper's eventfd. The descriptor is added with `EPOLLEXCLUSIVE`: the connection's
    /// descriptors share one wait queue, and without it every idle worker would wake for
    /// each request (a herd of 30 wake-ups per request with 32 threads, measured; blocked
    /// `read(2)`s wake one). The eventfd is not exclusive: a stop wakes them all.
    pub(crate) fn waiter(&self, fd: BorrowedFd<'_>) -> io::Result<StopWaiter> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: plain syscalls; the new descriptor is owned at once.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let epfd = unsafe { OwnedFd::from_raw_fd(epfd) };
        for (target, flags) in [
            (fd.as_raw_fd(), libc::EPOLLIN | libc::EPOLLEXCLUSIVE),
            (self.inner.eventfd.as_raw_fd(), libc::EPOLLIN),
        ] {
            let mut ev = libc::epoll_event {
                events: flags as u32,
                u64: target as u64,
            };
            // SAFETY: valid descriptors and a valid event.
            if unsafe { libc::epoll_ctl(epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, target, &mut ev) }
                < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(StopWaiter { epfd })
    }
}

/// farcache patch: one worker thread's wait for a request or a stop (see
/// [`SessionStopper::waiter`]).
#[derive(Debug)]
pub(crate) struct StopWaiter {
    epfd: OwnedFd,
}

impl StopWaiter {
    /// Wait until the descriptor may be readable or the stopper fired.
    pub(crate) fn wait(&self) -> nix::Result<()> {
        use std::os::fd::AsRawFd;
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: the buffer holds 2 events, as passed.
        let n = unsafe { libc::epoll_wait(self.epfd.as_raw_fd(), ev.as_mut_ptr(), 2, -1) };
        if n < 0 {
            let e = nix::errno::Errno::last();
            if e != nix::errno::Errno::EINTR {
                return Err(e);
            }
        }
        Ok(())
    }
}

impl<FS: Filesystem> AsFd for Session<FS> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ch.as_fd()
    }
}

impl<FS: Filesystem> Session<FS> {
    /// Create a new session by mounting the given filesystem to the given mountpoint
    /// # Errors
    /// Returns an error if the options are incorrect, or if the fuse device can't be mounted.
    pub fn new<P: AsRef<Path>>(
        filesystem: FS,
        mountpoint: P,
        options: &Config,
    ) -> io::Result<Session<FS>> {
        check_option_conflicts(options)?;

        let mountpoint = mountpoint.as_ref();
        info!("Mounting {}", mountpoint.display());
        // If AutoUnmount is requested, but not AllowRoot or AllowOther, return an error
        // because fusermount needs allow_root or allow_other to handle the auto_unmount option
        if options.mount_options.contains(&MountOption::AutoUnmount)
            && options.acl == SessionACL::Owner
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("auto_unmount requires acl != Owner, got: {:?}", options.acl),
            ));
        }
        let (file, mount) = Mount::new(mountpoint, &options.mount_options, options.acl)?;

        let ch = Channel::new(file);

        let mut session = Session {
            filesystem: FilesystemHolder {
                fs: Some(filesystem),
            },
            ch,
            mount: UmountOnDrop {
                mount: Arc::new(Mutex::new(Some(mount))),
            },
            allowed: options.acl,
            session_owner: geteuid(),
            proto_version: None,
            config: options.clone(),
            worker_fds: Vec::new(),
            stopper: None,
            uring_stats: Arc::default(),
            uring_payload: 0,
            prefault: 0,
        };

        session.handshake()?;

        Ok(session)
    }

    /// Wrap an existing /dev/fuse file descriptor. This doesn't mount the
    /// filesystem anywhere; that must be done separately.
    pub fn from_fd(
        filesystem: FS,
        fd: OwnedFd,
        acl: SessionACL,
        config: Config,
    ) -> io::Result<Self> {
        let ch = Channel::new(Arc::new(DevFuse(File::from(fd))));
        let mut session = Session {
            filesystem: FilesystemHolder {
                fs: Some(filesystem),
            },
            ch,
            mount: UmountOnDrop {
                mount: Arc::new(Mutex::new(None)),
            },
            allowed: acl,
            session_owner: geteuid(),
            proto_version: None,
            config,
            worker_fds: Vec::new(),
            stopper: None,
            uring_stats: Arc::default(),
            uring_payload: 0,
            prefault: 0,
        };

        session.handshake()?;

        Ok(session)
    }

    /// farcache patch: serve a connection whose INIT handshake is already done — by another
    /// process that handed the descriptor over (a live connection never sends INIT again).
    /// `filesystem.init` is not called: the caller sets the file system up as the original
    /// INIT reply promised (the negotiated parameters travel with the descriptor).
    pub fn from_initialized_fd(
        filesystem: FS,
        fd: OwnedFd,
        acl: SessionACL,
        config: Config,
    ) -> Self {
        Session {
            filesystem: FilesystemHolder {
                fs: Some(filesystem),
            },
            ch: Channel::new(Arc::new(DevFuse(File::from(fd)))),
            mount: UmountOnDrop {
                mount: Arc::new(Mutex::new(None)),
            },
            allowed: acl,
            session_owner: geteuid(),
            proto_version: None,
            config,
            worker_fds: Vec::new(),
            stopper: None,
            uring_stats: Arc::default(),
            uring_payload: 0,
            prefault: 0,
        }
    }

    /// farcache patch: worker threads read from these descriptors (clones of this session's
    /// connection) before any new clone is made, so that a process holding copies of them
    /// keeps the requests read on them alive if this one dies.
    pub fn set_worker_fds(&mut self, fds: Vec<OwnedFd>) {
        self.worker_fds = fds;
    }

    /// farcache patch: before its first `read(2)`, each read loop faults in the first `bytes`
    /// of its request buffer and locks them where the process may (`mlock`; unlocked when
    /// the loop ends). `bytes` should cover the largest request the connection can send
    /// (`max_write` and the headers). For a process whose death the connection outlives
    /// (a supervisor holds copies of the descriptors): the kernel copies a request into a
    /// buffer page that is not present by the slow path of get_user_pages, which fails when
    /// a SIGKILL is pending, and then ends the request with `EIO` to its caller instead of
    /// leaving it for the next daemon (`fuse_dev_do_read`). Costs `bytes` of memory per
    /// thread from the start (without it a thread's buffer grows to that with the largest
    /// request it has read).
    pub fn prefault_read_buffers(&mut self, bytes: usize) {
        self.prefault = bytes;
    }

    /// farcache patch: a handle that stops [`Session::run`] cleanly. Must be taken before
    /// `run`; the loop then reads with non-blocking descriptors and poll(2).
    pub fn stopper(&mut self) -> io::Result<SessionStopper> {
        if self.stopper.is_none() {
            self.stopper = Some(SessionStopper::new()?);
        }
        Ok(self.stopper.clone().expect("just set"))
    }

    /// farcache patch: what the FUSE-over-io_uring transport negotiated at INIT and, once
    /// [`Session::run`] started, whether the rings serve and how many requests they did.
    pub fn uring_stats(&self) -> Arc<crate::UringStats> {
        self.uring_stats.clone()
    }

    /// Run the session loop in a background thread. If the returned handle is dropped,
    /// the filesystem is unmounted and the given session ends.
    pub fn spawn(self) -> io::Result<BackgroundSession> {
        let sender = self.ch.sender();
        // Take the fuse_session, so that we can unmount it
        let mount = std::mem::take(&mut *self.mount.mount.lock());
        let guard = thread::Builder::new()
            .name("fuser-bg".to_string())
            .spawn(move || self.run())?;
        Ok(BackgroundSession {
            guard,
            sender,
            mount,
        })
    }

    /// Run the session loop that receives kernel requests and dispatches them to method
    /// calls into the filesystem. This read-dispatch-loop is non-concurrent to prevent
    /// having multiple buffers (which take up much memory), but the filesystem methods
    /// may run concurrent by spawning threads.
    /// # Errors
    /// Returns any final error when the session comes to an end.
    pub fn run(self) -> io::Result<()> {
        let Session {
            filesystem,
            ch,
            mount: _do_not_umount_yet,
            allowed,
            session_owner,
            proto_version: _,
            config,
            worker_fds,
            stopper,
            uring_stats,
            uring_payload,
            prefault,
        } = self;

        let n_threads = config.n_threads.unwrap_or(1);

        if !cfg!(target_os = "linux") && n_threads != 1 {
            // TODO: check whether it works on macOS/FreeBSD and enable if it works.
            return Err(io::Error::other(
                "n_threads != 1 is only supported on Linux",
            ));
        }

        let Some(n_threads_minus_one) = n_threads.checked_sub(1) else {
            return Err(io::Error::other("n_threads"));
        };

        let mut filesystem = Arc::new(filesystem);

        let mut channels = Vec::with_capacity(n_threads);
        let mut given = worker_fds.into_iter();

        for _ in 0..n_threads_minus_one {
            if let Some(fd) = given.next() {
                channels.push(Channel::new(Arc::new(DevFuse(File::from(fd)))));
                continue;
            }
            if config.clone_fd {
                #[cfg(target_os = "linux")]
                {
                    channels.push(ch.clone_fd()?);
                    continue;
                }
                #[cfg(not(target_os = "linux"))]
                {
                    return Err(io::Error::other("clone_fd is only supported on Linux"));
                }
            } else {
                channels.push(ch.clone());
            }
        }
        channels.push(ch);
        if stopper.is_some() {
            for ch in &channels {
                ch.set_nonblocking()?;
            }
        }

        // farcache patch: with FUSE-over-io_uring negotiated, register the ring entries
        // first (the kernel holds every request until all queues have one); the read loops
        // then only see what never goes over the rings (FORGET, INTERRUPT), so two do.
        let mut rings = None;
        if let (true, Some(ucfg)) = (
            uring_stats.negotiated.load(std::sync::atomic::Ordering::SeqCst),
            config.uring,
        ) {
            let queues = crate::uring::possible_cpus();
            let (r, res) = crate::uring::start(
                &channels[channels.len() - 1],
                queues,
                ucfg.queue_depth.clamp(1, crate::uring::MAX_QUEUE_DEPTH),
                uring_payload,
                uring_stats.clone(),
                |thread_name| SessionEventLoop {
                    thread_name,
                    filesystem: filesystem.clone(),
                    ch: channels[channels.len() - 1].clone(),
                    allowed,
                    session_owner,
                    stopper: None,
                    prefault: 0,
                },
            );
            match res {
                Ok(()) => {
                    info!(
                        "FUSE-over-io_uring: {queues} queues x {} entries registered",
                        ucfg.queue_depth
                    );
                    channels.truncate(2.min(channels.len()));
                }
                Err(e) => error!(
                    "FUSE-over-io_uring registration failed ({e}): requests go through /dev/fuse read loops"
                ),
            }
            rings = Some(r);
        }

        let mut threads = Vec::with_capacity(n_threads);

        for (i, ch) in channels.into_iter().enumerate() {
            let thread_name = format!("fuser-{i}");
            let event_loop = SessionEventLoop {
                thread_name: thread_name.clone(),
                filesystem: filesystem.clone(),
                ch,
                allowed,
                session_owner,
                stopper: stopper.clone(),
                prefault,
            };
            threads.push(
                thread::Builder::new()
                    .name(thread_name)
                    .spawn(move || event_loop.event_loop())?,
            );
        }

        let mut reply: io::Result<()> = Ok(());
        for thread in threads {
            let res = match thread.join() {
                Ok(res) => res,
                Err(_) => {
                    return Err(io::Error::other("event loop thread panicked"));
                }
            };
            if let Err(e) = res {
                if reply.is_ok() {
                    reply = Err(e);
                }
            }
        }

        // farcache patch: the ring threads end when the kernel tears their entries down
        // (unmount or abort), which is also what ended the read loops.
        if let Some(rings) = rings {
            for t in rings.threads {
                if t.join().is_err() && reply.is_ok() {
                    reply = Err(io::Error::other("ring thread panicked"));
                }
            }
        }

        let Some(filesystem) = Arc::get_mut(&mut filesystem) else {
            return Err(io::Error::other(
                "BUG: must have one refcount for filesystem",
            ));
        };

        filesystem.destroy();

        reply
    }

    fn handshake(&mut self) -> io::Result<()> {
        let mut buf = FuseReadBuf::new();
        let buf = buf.as_mut();

        loop {
            // Read the init request from the kernel
            let size = match self.ch.receive_retrying(buf) {
                Ok(size) => size,
                Err(nix::errno::Errno::ENODEV) => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "FUSE device disconnected during handshake",
                    ));
                }
                Err(err) => return Err(err.into()),
            };

            // Parse the request
            let request = match ll::AnyRequest::try_from(&buf[..size]) {
                Ok(request) => request,
                Err(err) => {
                    error!("{err}");
                    return Err(io::Error::new(io::ErrorKind::InvalidData, err.to_string()));
                }
            };

            // Extract the init operation
            let op = match request.operation() {
                Ok(op) => op,
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "Failed to parse FUSE operation",
                    ));
                }
            };

            let init = match op {
                ll::Operation::Init(init) => init,
                _ => {
                    error!("Received non-init FUSE operation before init: {}", request);
                    // Send error response and return error - non-init during handshake is invalid
                    <ReplyRaw as Reply>::new(
                        request.unique(),
                        ReplySender::Channel(self.ch.sender()),
                    )
                    .send_ll(&ResponseErrno(ll::Errno::EIO));
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "Received non-init FUSE operation during handshake",
                    ));
                }
            };

            let v = init.version();
            if v.0 > abi::FUSE_KERNEL_VERSION {
                // Kernel has a newer major version than we support.
                // Send our version and wait for a second INIT request with a compatible version.
                debug!(
                    "INIT: Kernel version {} > our version {}, sending our version and waiting for next init",
                    v.0,
                    abi::FUSE_KERNEL_VERSION
                );
                let response = init.reply_version_only();
                <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                    .send_ll(&response);
                continue;
            }

            // We don't support ABI versions before 7.6
            if v < Version(7, 6) {
                error!("Unsupported FUSE ABI version {v}");
                <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                    .send_ll(&ResponseErrno(ll::Errno::EPROTO));
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("Unsupported FUSE ABI version {v}"),
                ));
            }

            let mut config = KernelConfig::new(init.capabilities(), init.max_readahead(), v);

            // Call filesystem init method and give it a chance to return an error
            let Some(filesystem) = &mut self.filesystem.fs else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "Bug: filesystem must be initialized during handshake",
                ));
            };
            let res = filesystem.init(Request::ref_cast(request.header()), &mut config);
            if let Err(error) = res {
                let errno = Errno::from_i32(error.raw_os_error().unwrap_or(0));
                <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                    .send_ll(&ResponseErrno(errno));
                return Err(error);
            }

            // farcache patch: FUSE-over-io_uring, when asked for and offered.
            let offered = init.capabilities().contains(InitFlags::FUSE_OVER_IO_URING);
            self.uring_stats
                .offered
                .store(offered, std::sync::atomic::Ordering::SeqCst);
            if offered
                && self.config.uring.is_some()
                && config
                    .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                    .is_ok()
            {
                self.uring_payload = crate::uring::payload_size(config.max_write, config.max_pages());
                self.uring_stats
                    .negotiated
                    .store(true, std::sync::atomic::Ordering::SeqCst);
            }

            // Remember the ABI version supported by kernel and mark the session initialized.
            self.proto_version = Some(v);

            // Log capability status for debugging
            for bit in 0..64 {
                let bitflags = InitFlags::from_bits_retain(1 << bit);
                if bitflags == InitFlags::FUSE_INIT_EXT {
                    continue;
                }
                let bitflag_is_known = InitFlags::all().contains(bitflags);
                let kernel_supports = init.capabilities().contains(bitflags);
                let we_requested = config.requested.contains(bitflags);
                // On macOS, there's a clash between linux and macOS constants,
                // so we pick macOS ones (last).
                let name = if let Some((name, _)) = bitflags.iter_names().last() {
                    Cow::Borrowed(name)
                } else {
                    Cow::Owned(format!("(1 << {bit})"))
                };
                if we_requested && kernel_supports {
                    debug!("capability {name} enabled")
                } else if we_requested {
                    debug!("capability {name} not supported by kernel")
                } else if kernel_supports {
                    debug!("capability {name} not requested by client")
                } else if bitflag_is_known {
                    debug!("capability {name} not supported nor requested")
                }
            }

            // Reply with our desired version and settings.
            debug!(
                "INIT response: ABI {}.{}, flags {:#x}, max readahead {}, max write {}",
                abi::FUSE_KERNEL_VERSION,
                abi::FUSE_KERNEL_MINOR_VERSION,
                init.capabilities() & config.requested,
                config.max_readahead,
                config.max_write
            );

            let response = init.reply(&config);
            <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                .send_ll(&response);

            return Ok(());
        }
    }

    /// Unmount the filesystem
    pub fn unmount(&mut self) -> io::Result<()> {
        self.mount.umount()
    }

    /// Returns a thread-safe object that can be used to unmount the Filesystem
    pub fn unmount_callable(&mut self) -> SessionUnmounter {
        SessionUnmounter {
            mount: self.mount.mount.clone(),
        }
    }

    /// Returns an object that can be used to send notifications to the kernel
    pub fn notifier(&self) -> Notifier {
        Notifier::new(self.ch.sender())
    }
}

#[derive(Debug)]
/// A thread-safe object that can be used to unmount a Filesystem
pub struct SessionUnmounter {
    mount: Arc<Mutex<Option<Mount>>>,
}

impl SessionUnmounter {
    /// Unmount the filesystem
    pub fn unmount(&mut self) -> io::Result<()> {
        if let Some(mount) = std::mem::take(&mut *self.mount.lock()) {
            mount.umount()?;
        }
        Ok(())
    }

    /// farcache patch: never unmount — the mount now belongs to another process that took
    /// the connection over. The mount record (and its copy of the descriptor) is leaked on
    /// purpose: dropping it would unmount; the process is about to exit.
    pub fn disarm(&mut self) {
        if let Some(mount) = std::mem::take(&mut *self.mount.lock()) {
            std::mem::forget(mount);
        }
    }
}

pub(crate) struct SessionEventLoop<FS: Filesystem> {
    /// Cache thread name for faster `debug!`.
    pub(crate) thread_name: String,
    pub(crate) ch: Channel,
    pub(crate) filesystem: Arc<FilesystemHolder<FS>>,
    pub(crate) allowed: SessionACL,
    pub(crate) session_owner: Uid,
    /// farcache patch: stop cleanly when this fires.
    pub(crate) stopper: Option<SessionStopper>,
    /// farcache patch: bytes of the request buffer to fault in before the first read.
    pub(crate) prefault: usize,
}

impl<FS: Filesystem> SessionEventLoop<FS> {
    fn event_loop(&self) -> io::Result<()> {
        // Buffer for receiving requests from the kernel. Only one is allocated and
        // it is reused immediately after dispatching to conserve memory and allocations.
        // farcache patch: after a large request, its pages past 64 KiB are handed back
        // (`FuseReadBuf::release_after`) before the next request is read — unless the buffer
        // is prefaulted (a supervised daemon: its pages must stay present).
        let mut read_buf = FuseReadBuf::new();
        if self.prefault > 0 && !read_buf.prefault(self.prefault) {
            debug!(
                "{}: request buffer: {} bytes faulted in, not locked (mlock: {})",
                self.thread_name,
                self.prefault,
                io::Error::last_os_error()
            );
        }
        let mut last = 0;
        let waiter = match &self.stopper {
            Some(stop) => Some((stop, stop.waiter(self.ch.as_fd())?)),
            None => None,
        };
        loop {
            read_buf.release_after(std::mem::take(&mut last));
            let buf = read_buf.as_mut();
            // Read the next request from the given channel to kernel driver
            // The kernel driver makes sure that we get exactly one request per read
            let received = match &waiter {
                None => self.ch.receive_retrying(buf),
                Some((stop, waiter)) => match self.ch.receive_or_stop(buf, stop, waiter) {
                    Ok(Some(size)) => Ok(size),
                    Ok(None) => return Ok(()),
                    Err(e) => Err(e),
                },
            };
            if let Ok(size) = received {
                last = size;
            }
            match received {
                // farcache patch: the request names where its reply goes.
                Ok(size) => match RequestWithSender::new(ReplySender::Channel(self.ch.sender()), &buf[..size]) {
                    // Dispatch request
                    Some(req) => {
                        if let Ok(Operation::Destroy(_)) = req.request.operation() {
                            req.reply::<ReplyEmpty>().ok();
                            return Ok(());
                        } else {
                            req.dispatch(self)
                        }
                    }
                    // Quit loop on illegal request
                    None => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "Invalid request",
                        ));
                    }
                },
                Err(nix::errno::Errno::ENODEV) => return Ok(()),
                Err(err) => return Err(err.into()),
            }
        }
    }
}

/// The background session data structure
#[derive(Debug)]
pub struct BackgroundSession {
    /// Thread guard of the background session
    pub guard: JoinHandle<io::Result<()>>,
    /// Object for creating Notifiers for client use
    sender: ChannelSender,
    /// Ensures the filesystem is unmounted when the session ends
    mount: Option<Mount>,
}

impl BackgroundSession {
    /// Unmount the filesystem and join the background thread.
    pub fn umount_and_join(mut self) -> io::Result<()> {
        if let Some(mount) = self.mount.take() {
            mount.umount()?;
        }
        self.join()
    }

    /// Returns an object that can be used to send notifications to the kernel
    pub fn notifier(&self) -> Notifier {
        Notifier::new(self.sender.clone())
    }

    /// Join the filesystem thread.
    pub fn join(self) -> io::Result<()> {
        self.guard
            .join()
            .map_err(|_panic: Box<dyn std::any::Any + Send>| {
                io::Error::new(
                    io::ErrorKind::Other,
                    "filesystem background thread panicked",
                )
            })?
    }
}
