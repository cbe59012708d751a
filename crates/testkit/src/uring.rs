//! The kernel's FUSE-over-io_uring switch (`/sys/module/fuse/parameters/enable_uring`) for
//! tests: set while a guard lives, restored to what it was when the last guard goes — also
//! when the test panics (the guard drops while unwinding). Tests that need rings share the
//! switch on; a test that needs it at a given value holds it alone.

use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The kernel parameter.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

static EXCLUSIVE: RwLock<()> = RwLock::new(());
/// Shared holders and the value before the first of them.
static SHARED: Mutex<(usize, Option<String>)> = Mutex::new((0, None));

fn read() -> String {
    std::fs::read_to_string(ENABLE_URING)
        .unwrap_or_else(|e| panic!("{ENABLE_URING}: {e} (a kernel with FUSE-over-io_uring, Linux 6.14+, is needed)"))
        .trim()
        .to_string()
}

fn write(v: &str) {
    std::fs::write(ENABLE_URING, v).unwrap_or_else(|e| panic!("writing {v} to {ENABLE_URING}: {e} (needs root)"));
}

/// The switch on, shared with other tests that want it on.
pub struct UringOn {
    _shared: RwLockReadGuard<'static, ()>,
}

/// The switch on while this lives (restored when the last such guard drops).
pub fn uring_on() -> UringOn {
    let g = EXCLUSIVE.read().unwrap_or_else(|e| e.into_inner());
    let mut s = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if s.0 == 0 {
        s.1 = Some(read());
        write("Y");
    }
    s.0 += 1;
    UringOn { _shared: g }
}

impl Drop for UringOn {
    fn drop(&mut self) {
        let mut s = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        s.0 -= 1;
        if s.0 == 0 {
            if let Some(v) = s.1.take() {
                write(&v);
            }
        }
    }
}

/// The switch at one value, held by this test alone.
pub struct UringAt {
    before: String,
    _alone: RwLockWriteGuard<'static, ()>,
}

/// The switch at `on` while this lives, no other test touching it; restored on drop.
pub fn uring_at(on: bool) -> UringAt {
    let g = EXCLUSIVE.write().unwrap_or_else(|e| e.into_inner());
    let before = read();
    write(if on { "Y" } else { "N" });
    UringAt { before, _alone: g }
}

impl Drop for UringAt {
    fn drop(&mut self) {
        write(&self.before);
    }
}
