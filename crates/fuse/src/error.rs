//! Why a mount could not start. (Errors of individual file operations never come here: they
//! are errno values for the application, made in `fs.rs`.)

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("backing directory {0} does not exist")]
    BackingMissing(PathBuf),
    #[error("backing directory {0} is not a directory")]
    BackingNotDir(PathBuf),
    #[error("cannot open backing directory {path}: {source}")]
    BackingOpen { path: PathBuf, source: std::io::Error },
    #[error("mount point {0} does not exist (create an empty directory first)")]
    MountpointMissing(PathBuf),
    #[error("mount point {0} is not a directory")]
    MountpointNotDir(PathBuf),
    #[error(
        "mount point {mountpoint} is inside backing directory {backing}: the mount would serve \
         itself and deadlock; choose a mount point outside it"
    )]
    MountpointInsideBacking { mountpoint: PathBuf, backing: PathBuf },
    #[error(
        "/dev/fuse is not available ({0}): load the fuse module (modprobe fuse), or in a \
         container pass the device (--device /dev/fuse)"
    )]
    NoDevFuse(std::io::Error),
    #[error(
        "fusermount3 not found on PATH: a mount by a non-root user needs it \
         (Debian: apt-get install fuse3), or run as root"
    )]
    FusermountMissing,
    #[error("/proc is not mounted: the passthrough reopens files through /proc/self/fd")]
    NoProc,
    #[error("backing branch {path} {problem}; {fix}")]
    Branch { path: PathBuf, problem: String, fix: String },
    #[error(
        "{what} is not available with several backing branches in this version: mount the branches \
         without it (docs/SEMANTICS.md, \"Several backing directories\")"
    )]
    UnionUnsupported { what: &'static str },
    #[error(transparent)]
    Config(#[from] farcache_config::ConfigError),
    #[error("mount {mountpoint} failed: {source}")]
    Mount { mountpoint: PathBuf, source: std::io::Error },
    #[error("mount.kernel_passthrough: {problem}; {fix}")]
    KernelPassthrough { problem: String, fix: String },
    #[error("mount.fuse_uring: {problem}; {fix}")]
    FuseUring { problem: String, fix: String },
    #[error("FUSE session on {mountpoint} ended with an error: {source}")]
    Session { mountpoint: PathBuf, source: std::io::Error },
}
