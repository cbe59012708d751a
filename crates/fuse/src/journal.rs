//! The intent journal: what makes an operation on names that a dead daemon carried out, and
//! the kernel resent to the next one, answer as it would have the first time.
//!
//! After a crash the kernel resends every request the dead daemon had read and not answered
//! (`FUSE_NOTIFY_RESEND`, Linux 6.9+; `fuse_resend` in fs/fuse/dev.c sets bit 63 of the
//! request's `unique`, [`RESEND_BIT`], and keeps the rest: the connection's request counter
//! never sets that bit, so the rest names the request for the connection's whole life).
//! Reads, writes, truncation and fsync give the same answer twice. An unlink, rmdir, rename,
//! mkdir, mknod, symlink, link or exclusive create does not: done once and done again, it
//! fails (`ENOENT`, `EEXIST`), although it took effect. So before such an operation touches
//! the backing directory the daemon writes an *intent* here — the request's unique, the
//! operation, the parents and names, and the identity of the inodes it concerns — and after,
//! its *result*; the record is freed once the reply is written, when the kernel can no longer
//! resend it. A resent request finds:
//!
//! - no record: the dead daemon never began it; it runs as usual;
//! - a record with a result: that result is the answer (an entry is looked up again);
//! - an intent without a result: the dead daemon died during the system call, before or
//!   after it took effect. The recorded identities decide which (`ops_entry.rs`,
//!   `Passthrough::settle`): a rename happened iff the source name no longer names the
//!   source inode; an unlink iff the name no longer names the victim; a mkdir iff the name
//!   that was free now exists; a link iff the new name names the source.
//!
//! Identities are (device, inode number, birth time): a freed inode number handed to a new
//! file at once (ext4 does) has another birth time, so an unlinked victim is never confused
//! with its successor.
//!
//! The journal is a fixed-size file mapped shared (`MAP_SHARED`): what a process stored in it
//! is in the page cache the moment the store retires, so it survives the process being
//! killed at any instruction — not a power cut, which the FUSE connection does not survive
//! either. It lives next to the control socket (the CLI picks the path), in the runtime
//! directory. A record is written field by field and made valid by one release store of its
//! state word, which is the last thing written; a reader in the next process sees either no
//! record or the whole of it.
//!
//! Bounds: [`SLOTS`] records. A daemon holds at most one per FUSE worker thread (each thread
//! answers one request at a time), at most [`crate::MAX_THREADS`]. Records left by earlier
//! daemons (*carried*) are kept until a resent request claims them or the space is needed:
//! a record whose reply was written but not yet freed when its daemon died is never resent,
//! and one that is resent is claimed by the first request of the next daemon that reads it.
//! When no slot is free the carried record with the oldest request goes first (the kernel
//! resends in request order, ahead of every newer request), so one is lost only after more
//! than `SLOTS - threads` carried records — many consecutive crashes each dying before it
//! read its resent requests, which the supervisor's restart limit ends far earlier.
//!
//! A new mount (a new connection, whose request numbers start again) empties the journal;
//! a daemon taking over keeps it when it was written for the same connection (its mount's
//! device number) and empties it otherwise.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

/// Bit 63 of a request's `unique`: the kernel resent it (`FUSE_UNIQUE_RESEND`).
pub(crate) const RESEND_BIT: u64 = 1 << 63;

const MAGIC: u64 = u64::from_le_bytes(*b"FCINTENT");
const VERSION: u32 = 1;
/// Records in the file.
pub(crate) const SLOTS: usize = 1024;
const SLOT_BYTES: usize = 1024;
const HEADER_BYTES: usize = 4096;
const FILE_BYTES: usize = HEADER_BYTES + SLOTS * SLOT_BYTES;
/// The longest name a record holds (`NAME_MAX`); longer ones are not journaled (and fail
/// with `ENAMETOOLONG` in the backing file system anyway).
const NAME_BYTES: usize = 255;

const _: () = assert!(SLOTS >= 4 * crate::config::MAX_THREADS as usize, "room for carried records");
const _: () = assert!(SLOT_BYTES >= OFF_NAME2 + NAME_BYTES);
const _: () = assert!(HEADER_BYTES.is_multiple_of(SLOT_BYTES) && SLOT_BYTES.is_multiple_of(8));

// Header: magic u64, version u32, slots u32, connection (the mount's st_dev) u64.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_SLOTS: usize = 12;
const H_CONN: usize = 16;

// A slot. The state word is written last (release) and read first (acquire).
const OFF_STATE: usize = 0;
const OFF_OP: usize = 4;
const OFF_KEY: usize = 8;
const OFF_PARENT: usize = 16;
const OFF_PARENT2: usize = 24;
const OFF_FLAGS: usize = 32;
const OFF_RESULT: usize = 36;
const OFF_IDS: usize = 40; // three identities of 4 × u64: present, dev, ino, birth
const ID_BYTES: usize = 32;
const OFF_NAME_LEN: usize = OFF_IDS + 3 * ID_BYTES;
const OFF_NAME2_LEN: usize = OFF_NAME_LEN + 4;
const OFF_NAME: usize = OFF_NAME2_LEN + 4;
const OFF_NAME2: usize = OFF_NAME + NAME_BYTES + 1;

const FREE: u32 = 0;
const STARTED: u32 = 1;
const DONE: u32 = 2;

/// An operation whose repetition is not harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Op {
    Unlink = 1,
    Rmdir = 2,
    Rename = 3,
    Mkdir = 4,
    Mknod = 5,
    Symlink = 6,
    Link = 7,
    Create = 8,
}

impl Op {
    fn from_u32(v: u32) -> Option<Op> {
        Some(match v {
            1 => Op::Unlink,
            2 => Op::Rmdir,
            3 => Op::Rename,
            4 => Op::Mkdir,
            5 => Op::Mknod,
            6 => Op::Symlink,
            7 => Op::Link,
            8 => Op::Create,
            _ => return None,
        })
    }
}

/// Which inode a name named: device, inode number, birth time (seconds and nanoseconds in
/// one number; 0 where the file system keeps none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ident {
    pub dev: u64,
    pub ino: u64,
    pub birth: u64,
}

/// What an operation is about to do, and to what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Intent {
    pub op: Op,
    pub parent: u64,
    /// The new parent of a rename or link (for a link, its source node is `parent`).
    pub parent2: u64,
    pub name: Vec<u8>,
    pub name2: Vec<u8>,
    pub flags: u32,
    /// Unlink, rmdir: the victim. Rename, link: the source. Creations: what the name named
    /// before (normally nothing).
    pub a: Option<Ident>,
    /// Rename: what the new name named before.
    pub b: Option<Ident>,
}

/// A record as found: the intent and, if the operation finished, its result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub intent: Intent,
    /// `Some(0)` done, `Some(errno)` failed, `None` unknown (the daemon died during it).
    pub result: Option<i32>,
    /// What a creation created.
    pub created: Option<Ident>,
}

struct Alloc {
    free: Vec<usize>,
    /// Records of earlier daemons, by request (unique without the resend bit).
    carried: HashMap<u64, usize>,
}

pub(crate) struct Journal {
    base: *mut u8,
    alloc: Mutex<Alloc>,
}

// SAFETY: the mapping is shared memory; every slot is written by the one thread holding it
// (a `Ticket`), the header only before the journal is shared, and the state words atomically.
unsafe impl Send for Journal {}
// SAFETY: as above.
unsafe impl Sync for Journal {}

impl Drop for Journal {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, of FILE_BYTES; no reference into it outlives self.
        unsafe { libc::munmap(self.base.cast(), FILE_BYTES) };
    }
}

impl Journal {
    /// Open (or create) the journal at `path` for the connection `conn` (the mount's
    /// `st_dev`). With `fresh` (a new mount) or a journal of another connection or format, it
    /// starts empty; otherwise the records found are carried.
    pub(crate) fn open(path: &Path, conn: u64, fresh: bool) -> io::Result<Journal> {
        use std::os::unix::fs::OpenOptionsExt;
        let f =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(path)?;
        // Ours iff the header names this format and this connection; otherwise (or for a new
        // mount) the file is emptied by truncation, which leaves every page a hole: only the
        // slots used later take memory.
        let mut h = [0u8; 24];
        let ours = !fresh
            && f.metadata()?.len() == FILE_BYTES as u64
            && std::os::unix::fs::FileExt::read_exact_at(&f, &mut h, 0).is_ok()
            && h[H_MAGIC..H_MAGIC + 8] == MAGIC.to_ne_bytes()
            && h[H_VERSION..H_VERSION + 4] == VERSION.to_ne_bytes()
            && h[H_SLOTS..H_SLOTS + 4] == (SLOTS as u32).to_ne_bytes()
            && h[H_CONN..H_CONN + 8] == conn.to_ne_bytes();
        if !ours {
            f.set_len(0)?;
            f.set_len(FILE_BYTES as u64)?;
        }
        // SAFETY: a shared read-write mapping of a file of FILE_BYTES we hold open; the
        // descriptor may close after mmap.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let j = Journal { base: p.cast(), alloc: Mutex::new(Alloc { free: Vec::new(), carried: HashMap::new() }) };
        if !ours {
            j.put_u64(H_MAGIC, MAGIC);
            j.put_u32(H_VERSION, VERSION);
            j.put_u32(H_SLOTS, SLOTS as u32);
            j.put_u64(H_CONN, conn);
        }
        let mut alloc = j.alloc.lock();
        for s in (0..SLOTS).rev() {
            match j.state(s).load(Ordering::Acquire) {
                FREE => alloc.free.push(s),
                _ => {
                    alloc.carried.insert(j.u64_at(slot_off(s) + OFF_KEY), s);
                }
            }
        }
        if !alloc.carried.is_empty() {
            tracing::debug!("intent journal: {} records of the earlier daemon carried", alloc.carried.len());
        }
        drop(alloc);
        Ok(j)
    }

    /// Name the connection once it is known (a new mount learns its device number after
    /// mounting; until then the journal is of no connection and a successor empties it).
    pub(crate) fn set_conn(&self, conn: u64) {
        self.put_u64(H_CONN, conn);
    }

    /// Records carried from earlier daemons.
    #[cfg(test)]
    pub(crate) fn carried(&self) -> usize {
        self.alloc.lock().carried.len()
    }

    /// The record an earlier daemon left for request `unique`, which the kernel resent; the
    /// returned ticket holds it (and so keeps it for a daemon after this one) until dropped.
    pub(crate) fn claim(&self, unique: u64) -> Option<(Ticket<'_>, Record)> {
        let key = unique & !RESEND_BIT;
        let slot = self.alloc.lock().carried.remove(&key)?;
        let rec = self.read(slot);
        // An unreadable record: dropping the ticket frees it.
        let t = Ticket { j: self, slot };
        rec.map(|r| (t, r))
    }

    /// Record `intent` for request `unique` before carrying it out. `None` (a warning
    /// logged) when no slot can be had or a name is too long: the operation runs unjournaled.
    pub(crate) fn begin(&self, unique: u64, intent: &Intent) -> Option<Ticket<'_>> {
        if intent.name.len() > NAME_BYTES || intent.name2.len() > NAME_BYTES {
            return None;
        }
        let slot = {
            let mut a = self.alloc.lock();
            match a.free.pop() {
                Some(s) => s,
                None => {
                    // The carried record of the oldest request goes.
                    let Some((&key, _)) = a.carried.iter().min_by_key(|(k, _)| **k) else {
                        tracing::warn!("intent journal full (a bug: {SLOTS} slots, one per worker thread)");
                        return None;
                    };
                    tracing::debug!("intent journal: dropping the carried record of request {key}");
                    a.carried.remove(&key).expect("just found")
                }
            }
        };
        let o = slot_off(slot);
        self.state(slot).store(FREE, Ordering::Release);
        self.put_u32(o + OFF_OP, intent.op as u32);
        self.put_u64(o + OFF_KEY, unique & !RESEND_BIT);
        self.put_u64(o + OFF_PARENT, intent.parent);
        self.put_u64(o + OFF_PARENT2, intent.parent2);
        self.put_u32(o + OFF_FLAGS, intent.flags);
        self.put_u32(o + OFF_RESULT, 0);
        self.put_ident(o, 0, intent.a);
        self.put_ident(o, 1, intent.b);
        self.put_ident(o, 2, None);
        self.put_name(o + OFF_NAME_LEN, o + OFF_NAME, &intent.name);
        self.put_name(o + OFF_NAME2_LEN, o + OFF_NAME2, &intent.name2);
        self.state(slot).store(STARTED, Ordering::Release);
        Some(Ticket { j: self, slot })
    }

    fn read(&self, slot: usize) -> Option<Record> {
        let o = slot_off(slot);
        let state = self.state(slot).load(Ordering::Acquire);
        let op = Op::from_u32(self.u32_at(o + OFF_OP))?;
        let intent = Intent {
            op,
            parent: self.u64_at(o + OFF_PARENT),
            parent2: self.u64_at(o + OFF_PARENT2),
            name: self.name(o + OFF_NAME_LEN, o + OFF_NAME)?,
            name2: self.name(o + OFF_NAME2_LEN, o + OFF_NAME2)?,
            flags: self.u32_at(o + OFF_FLAGS),
            a: self.ident(o, 0),
            b: self.ident(o, 1),
        };
        let (result, created) = match state {
            DONE => (Some(self.u32_at(o + OFF_RESULT) as i32), self.ident(o, 2)),
            STARTED => (None, None),
            _ => return None,
        };
        Some(Record { intent, result, created })
    }

    fn state(&self, slot: usize) -> &AtomicU32 {
        // SAFETY: in the mapping, 8-aligned (slots and the header are multiples of 8).
        unsafe { &*self.base.add(slot_off(slot) + OFF_STATE).cast::<AtomicU32>() }
    }
    fn u32_at(&self, off: usize) -> u32 {
        // SAFETY: in the mapping, 4-aligned by the layout.
        unsafe { (*self.base.add(off).cast::<AtomicU32>()).load(Ordering::Relaxed) }
    }
    fn u64_at(&self, off: usize) -> u64 {
        // SAFETY: in the mapping, 8-aligned by the layout.
        unsafe { (*self.base.add(off).cast::<AtomicU64>()).load(Ordering::Relaxed) }
    }
    fn put_u32(&self, off: usize, v: u32) {
        // SAFETY: as u32_at.
        unsafe { (*self.base.add(off).cast::<AtomicU32>()).store(v, Ordering::Relaxed) }
    }
    fn put_u64(&self, off: usize, v: u64) {
        // SAFETY: as u64_at.
        unsafe { (*self.base.add(off).cast::<AtomicU64>()).store(v, Ordering::Relaxed) }
    }
    fn put_ident(&self, o: usize, i: usize, id: Option<Ident>) {
        let at = o + OFF_IDS + i * ID_BYTES;
        let id = id.map(|d| (1, d.dev, d.ino, d.birth)).unwrap_or((0, 0, 0, 0));
        self.put_u64(at, id.0);
        self.put_u64(at + 8, id.1);
        self.put_u64(at + 16, id.2);
        self.put_u64(at + 24, id.3);
    }
    fn ident(&self, o: usize, i: usize) -> Option<Ident> {
        let at = o + OFF_IDS + i * ID_BYTES;
        (self.u64_at(at) == 1).then(|| Ident {
            dev: self.u64_at(at + 8),
            ino: self.u64_at(at + 16),
            birth: self.u64_at(at + 24),
        })
    }
    fn put_name(&self, len_at: usize, at: usize, name: &[u8]) {
        // SAFETY: at..at+NAME_BYTES is inside this slot, which only the ticket holder writes.
        unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), self.base.add(at), name.len()) };
        self.put_u32(len_at, name.len() as u32);
    }
    fn name(&self, len_at: usize, at: usize) -> Option<Vec<u8>> {
        let n = self.u32_at(len_at) as usize;
        if n > NAME_BYTES {
            return None;
        }
        let mut v = vec![0u8; n];
        // SAFETY: at..at+n is inside the slot (n ≤ NAME_BYTES).
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(at), v.as_mut_ptr(), n) };
        Some(v)
    }
}

fn slot_off(slot: usize) -> usize {
    debug_assert!(slot < SLOTS);
    HEADER_BYTES + slot * SLOT_BYTES
}

/// One held record. [`Ticket::done`] records the result; dropping it (after the reply is
/// written) frees the record.
pub(crate) struct Ticket<'a> {
    j: &'a Journal,
    slot: usize,
}

impl Ticket<'_> {
    /// The operation finished with `result` (0 or an errno); `created` is what it created.
    pub(crate) fn done(&self, result: i32, created: Option<Ident>) {
        let o = slot_off(self.slot);
        self.j.put_u32(o + OFF_RESULT, result as u32);
        self.j.put_ident(o, 2, created);
        self.j.state(self.slot).store(DONE, Ordering::Release);
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.j.state(self.slot).store(FREE, Ordering::Release);
        self.j.alloc.lock().free.push(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(op: Op, name: &str) -> Intent {
        Intent {
            op,
            parent: 1,
            parent2: 7,
            name: name.as_bytes().to_vec(),
            name2: b"new".to_vec(),
            flags: 3,
            a: Some(Ident { dev: 5, ino: 6, birth: 9 }),
            b: None,
        }
    }

    /// A record survives its process as it was at the instant of death: an intent alone,
    /// or with its result; a freed one is gone; resent requests find theirs by the unique
    /// without the resend bit.
    #[test]
    fn records_outlive_the_journal_that_wrote_them() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j");
        let j = Journal::open(&p, 42, true).unwrap();
        let started = j.begin(10, &intent(Op::Rename, "a")).unwrap();
        let done = j.begin(12, &intent(Op::Mkdir, "d")).unwrap();
        done.done(0, Some(Ident { dev: 1, ino: 2, birth: 3 }));
        let freed = j.begin(14, &intent(Op::Unlink, "u")).unwrap();
        drop(freed);
        // A crash: the tickets are never dropped.
        std::mem::forget(started);
        std::mem::forget(done);
        drop(j);

        let j = Journal::open(&p, 42, false).unwrap();
        assert_eq!(j.carried(), 2);
        assert!(j.claim(14 | RESEND_BIT).is_none(), "freed before the crash");
        let (t10, r) = j.claim(10 | RESEND_BIT).unwrap();
        assert_eq!((r.intent, r.result), (intent(Op::Rename, "a"), None));
        let (t, r) = j.claim(12 | RESEND_BIT).unwrap();
        assert_eq!((r.result, r.created), (Some(0), Some(Ident { dev: 1, ino: 2, birth: 3 })));
        assert!(j.claim(12 | RESEND_BIT).is_none(), "claimed once");
        // Claimed and not yet answered when this daemon dies too: the next one finds it.
        std::mem::forget(t);
        std::mem::forget(t10);
        drop(j);
        let j = Journal::open(&p, 42, false).unwrap();
        assert!(j.claim(12 | RESEND_BIT).is_some());
        assert!(j.claim(10 | RESEND_BIT).is_some(), "held by a ticket of the earlier daemon");
    }

    #[test]
    fn a_new_mount_or_another_connection_starts_empty() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j");
        let j = Journal::open(&p, 42, true).unwrap();
        std::mem::forget(j.begin(10, &intent(Op::Rmdir, "x")).unwrap());
        drop(j);
        assert_eq!(Journal::open(&p, 43, false).unwrap().carried(), 0, "another connection");
        let j = Journal::open(&p, 43, true).unwrap();
        std::mem::forget(j.begin(10, &intent(Op::Rmdir, "x")).unwrap());
        drop(j);
        assert_eq!(Journal::open(&p, 43, true).unwrap().carried(), 0, "a new mount");
    }

    /// Full of carried records: the oldest request's goes first, live ones never.
    #[test]
    fn carried_records_make_room_oldest_first() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j");
        let j = Journal::open(&p, 1, true).unwrap();
        for k in 0..SLOTS as u64 {
            std::mem::forget(j.begin(100 + 2 * k, &intent(Op::Unlink, "n")).unwrap());
        }
        drop(j);
        let j = Journal::open(&p, 1, false).unwrap();
        assert_eq!(j.carried(), SLOTS);
        let t = j.begin(5000, &intent(Op::Unlink, "m")).unwrap();
        assert!(j.claim(100 | RESEND_BIT).is_none(), "the oldest made room");
        assert!(j.claim(102 | RESEND_BIT).is_some());
        drop(t);
        assert!(j.begin(1, &intent(Op::Unlink, &"x".repeat(256))).is_none(), "too long a name");
    }
}
