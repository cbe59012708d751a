//! The POSIX suite of `posix.rs`, run against a mount of two backing branches (see that
//! file's header): the union must behave like one directory.

#[path = "posix.rs"]
mod posix;
