//! The POSIX suite of `posix.rs`, run over FUSE-over-io_uring (`mount.fuse_uring = "on"`,
//! see that file's header): requests received and answered through ring entries must keep
//! every rule the suite checks.

#[path = "posix.rs"]
mod posix;
