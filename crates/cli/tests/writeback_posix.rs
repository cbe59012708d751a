//! The POSIX suite of `posix.rs`, run against a mount with the kernel's write-back cache
//! (`mount.writeback_cache = true`, see that file's header): writes cached by the kernel and
//! sent on later must keep every rule the suite checks.

#[path = "posix.rs"]
mod posix;
