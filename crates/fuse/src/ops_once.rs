//! Operations on names, each carried out once even when the kernel asks twice: the intent
//! journal (`journal.rs`) around unlink, rmdir, rename, mkdir, mknod, symlink, link and
//! create. Each `*_once` returns the answer and the journal ticket, which the caller drops
//! only after writing the reply (until then a crash leaves the record for the next daemon).
//!
//! A resent request (bit 63 of its unique) whose record the dead daemon left is *settled*:
//! with a recorded result, that result is the answer; with an intent alone, the recorded
//! identities say whether the backing directory shows the operation done (then it is
//! answered as done) or not (then it runs now). Entries are looked up again, so the kernel's
//! lookup count is the one a first answer would have given.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use fuser::{FileAttr, INodeNo, Request};

use crate::fs::Passthrough;
use crate::journal::{Ident, Intent, Op, Record, Ticket, RESEND_BIT};
use crate::sys;

/// An answer and the journal record held until the reply is written.
pub(crate) type Once<'a, T> = (io::Result<T>, Option<Ticket<'a>>);

fn code<T>(r: &io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().filter(|n| *n > 0).unwrap_or(libc::EIO),
    }
}

/// A recorded failure, as the error it was.
fn failed(rec: &Record) -> Option<io::Error> {
    rec.result.filter(|r| *r != 0).map(sys::err)
}

impl Passthrough {
    /// Which inode `parent/name` is now; `None` if none (or it cannot be told).
    fn ident(&self, parent: u64, name: &[u8]) -> Option<Ident> {
        let p = self.inode(INodeNo(parent)).ok()?;
        let c = std::ffi::CString::new(name).ok()?;
        if self.union.is_some() {
            return self.u_ident(&p, &c);
        }
        sys::ident_at(p.fd().ok()?.as_fd(), &c).ok()
    }

    fn intent(&self, op: Op, parent: u64, name: &OsStr) -> Intent {
        Intent { op, parent, parent2: 0, name: name.as_bytes().to_vec(), name2: Vec::new(), flags: 0, a: None, b: None }
    }

    /// The frame every journaled operation shares: settle a resent request from its record,
    /// else record `intent`, `run`, and record the result (with what `created` says the
    /// operation made).
    fn once<T>(
        &self,
        unique: u64,
        intent: impl FnOnce() -> Intent,
        settle: impl FnOnce(&Record) -> Option<io::Result<T>>,
        run: impl FnOnce() -> io::Result<T>,
        created: impl FnOnce(&T) -> Option<Ident>,
    ) -> Once<'_, T> {
        let j = self.journal.as_deref();
        let intent = intent();
        if unique & RESEND_BIT != 0 {
            if let Some((t, rec)) = j.and_then(|j| j.claim(unique)) {
                // The request's id names it for the connection's life; a record of another
                // operation or parent under it is not this request's (a bug): ignored.
                let same = (rec.intent.op, rec.intent.parent) == (intent.op, intent.parent);
                if !same {
                    tracing::warn!(
                        "resent request {}: its journal record is of another operation; ignored",
                        unique & !RESEND_BIT
                    );
                }
                let settled = if same { settle(&rec) } else { None };
                tracing::debug!(
                    "resent request {}: {:?} {}",
                    unique & !RESEND_BIT,
                    rec.intent.op,
                    match &settled {
                        Some(Ok(_)) => "had taken effect: answered as done".to_string(),
                        Some(Err(e)) => format!("had failed: answered {e}"),
                        None => "had not taken effect: carried out now".to_string(),
                    }
                );
                let res = settled.unwrap_or_else(run);
                t.done(code(&res), res.as_ref().ok().and_then(created));
                return (res, Some(t));
            }
        }
        let t = j.and_then(|j| j.begin(unique, &intent));
        fault::die_at(intent.op, fault::Point::Begun);
        let res = run();
        fault::die_at(intent.op, fault::Point::Ran);
        if let Some(t) = &t {
            t.done(code(&res), res.as_ref().ok().and_then(created));
        }
        fault::die_at(intent.op, fault::Point::Done);
        (res, t)
    }

    pub(crate) fn unlink_once(&self, unique: u64, parent: INodeNo, name: &OsStr, dir: bool) -> Once<'_, ()> {
        let op = if dir { Op::Rmdir } else { Op::Unlink };
        self.once(
            unique,
            || Intent { a: self.ident(parent.0, name.as_bytes()), ..self.intent(op, parent.0, name) },
            |rec| {
                if let Some(e) = failed(rec) {
                    return Some(Err(e));
                }
                if rec.result.is_some() {
                    return Some(Ok(()));
                }
                // Done iff the name no longer names the victim.
                let victim = rec.intent.a?;
                (self.ident(parent.0, name.as_bytes()) != Some(victim)).then_some(Ok(()))
            },
            || if dir { self.do_rmdir(parent, name) } else { self.do_unlink(parent, name) },
            |_| None,
        )
    }

    pub(crate) fn rename_once(
        &self,
        unique: u64,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: u32,
    ) -> Once<'_, ()> {
        self.once(
            unique,
            || Intent {
                parent2: newparent.0,
                name2: newname.as_bytes().to_vec(),
                flags,
                a: self.ident(parent.0, name.as_bytes()),
                b: self.ident(newparent.0, newname.as_bytes()),
                ..self.intent(Op::Rename, parent.0, name)
            },
            |rec| {
                if let Some(e) = failed(rec) {
                    return Some(Err(e));
                }
                if rec.result.is_some() {
                    return Some(Ok(()));
                }
                // Done iff the source moved: the old name no longer names it and the new one
                // does (an exchange too: the old name then names what the new one did).
                let source = rec.intent.a?;
                // A union's file renamed on its branch, the target name maybe still on
                // another (a crash between the two steps): done, once that name is gone.
                if self.union.is_some()
                    && self.ident(parent.0, name.as_bytes()) != Some(source)
                    && self.u_finish_rename(newparent, newname, source)
                {
                    return Some(Ok(()));
                }
                let moved = self.ident(parent.0, name.as_bytes()) != Some(source)
                    && self.ident(newparent.0, newname.as_bytes()) == Some(source);
                moved.then_some(Ok(()))
            },
            || self.do_rename(parent, name, newparent, newname, flags),
            |_| None,
        )
    }

    /// mkdir, mknod and symlink: `make` creates `parent/name`.
    pub(crate) fn make_once(
        &self,
        req: &Request,
        op: Op,
        parent: INodeNo,
        name: &OsStr,
        make: impl FnOnce() -> io::Result<FileAttr>,
    ) -> Once<'_, FileAttr> {
        self.once(
            req.unique().0,
            || Intent { a: self.ident(parent.0, name.as_bytes()), ..self.intent(op, parent.0, name) },
            |rec| {
                if let Some(e) = failed(rec) {
                    return Some(Err(e));
                }
                let now = self.ident(parent.0, name.as_bytes())?;
                let made = match rec.result {
                    // Done: still the inode it made.
                    Some(_) => rec.created == Some(now),
                    // Died during it: the name was free and is taken now.
                    None => rec.intent.a.is_none(),
                };
                made.then(|| self.adopt_new(req, parent, name))
            },
            make,
            |_| self.ident(parent.0, name.as_bytes()),
        )
    }

    /// A name the dead daemon created: given to the caller (it may have died before) and
    /// counted as the kernel's, as its first answer would have.
    fn adopt_new(&self, req: &Request, parent: INodeNo, name: &OsStr) -> io::Result<FileAttr> {
        let p = self.inode(parent)?;
        let c = sys::cname(name)?;
        if self.union.is_some() {
            return self.u_adopt_new(req, &p, &c);
        }
        self.finish_new(req, &p, &c)
    }

    pub(crate) fn link_once(
        &self,
        unique: u64,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
    ) -> Once<'_, FileAttr> {
        let source = || self.inode(ino).ok().and_then(|i| sys::ident_at(i.fd().ok()?.as_fd(), c"").ok());
        self.once(
            unique,
            || Intent { parent2: ino.0, a: source(), ..self.intent(Op::Link, newparent.0, newname) },
            |rec| {
                if let Some(e) = failed(rec) {
                    return Some(Err(e));
                }
                // Done iff the new name names the source.
                let linked = rec.intent.a.is_some() && self.ident(newparent.0, newname.as_bytes()) == rec.intent.a;
                linked.then(|| {
                    let p = self.inode(newparent)?;
                    let c = sys::cname(newname)?;
                    if self.union.is_some() {
                        return Ok(self.u_entry_gated(&p, &c)?.1);
                    }
                    Ok(self.entry_of(&p, &c)?.1)
                })
            },
            || self.do_link(ino, newparent, newname),
            |_| None,
        )
    }

    pub(crate) fn create_once(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Once<'_, (FileAttr, u64)> {
        self.once(
            req.unique().0,
            || Intent {
                flags: flags as u32,
                a: self.ident(parent.0, name.as_bytes()),
                ..self.intent(Op::Create, parent.0, name)
            },
            |rec| {
                if let Some(e) = failed(rec) {
                    return Some(Err(e));
                }
                let now = self.ident(parent.0, name.as_bytes())?;
                let made = match rec.result {
                    Some(_) => rec.created == Some(now),
                    None => rec.intent.a.is_none(),
                };
                // Opened again as this call's own new file (no O_EXCL, no O_TRUNC: it is
                // the file the first attempt made, which nobody has written through it).
                made.then(|| self.do_create(req, parent, name, mode, flags & !(libc::O_EXCL | libc::O_TRUNC), true))
            },
            || self.do_create(req, parent, name, mode, flags, false),
            |_| self.ident(parent.0, name.as_bytes()),
        )
    }
}

/// Fault injection for the tests of this module's promise (`tests/takeover.rs` in the CLI):
/// with `FARCACHE_FAULT_DIE=TOKEN` set, a journaled operation checks for the file TOKEN; if
/// it holds `OP:POINT` naming this operation (`unlink`, `rmdir`, `rename`, `mkdir`, `mknod`,
/// `symlink`, `link`, `create`) and point, the daemon removes it (so the fault fires once
/// across all the daemons of a mount) and SIGKILLs itself. POINT is `begun` (intent
/// recorded, nothing done), `ran` (the backing call done, its result not recorded),
/// `done` (result recorded, reply not written), or for a union's rename `between` (the
/// file renamed on its branch, the target name not yet removed from the others). Without the variable: one load of a
/// `OnceLock` per journaled operation.
pub(crate) mod fault {
    use std::path::PathBuf;
    use std::sync::OnceLock;

    use crate::journal::Op;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Point {
        Begun,
        Ran,
        Done,
        /// A union's rename of a file: renamed on its branch, the target name not yet
        /// removed from the other branches.
        Between,
    }

    fn token() -> Option<&'static PathBuf> {
        static T: OnceLock<Option<PathBuf>> = OnceLock::new();
        T.get_or_init(|| {
            let v = std::env::var_os("FARCACHE_FAULT_DIE")?;
            tracing::warn!("fault injection armed: FARCACHE_FAULT_DIE={v:?} (for tests only)");
            Some(PathBuf::from(v))
        })
        .as_ref()
    }

    pub(crate) fn die_at(op: Op, point: Point) {
        let Some(token) = token() else { return };
        let here = format!("{op:?}:{point:?}").to_lowercase();
        let armed = std::fs::read_to_string(token).is_ok_and(|t| t.trim() == here);
        if armed && std::fs::remove_file(token).is_ok() {
            tracing::warn!("fault injection: dying at {here}");
            // SAFETY: kill(2) on this process: what the tests mean by a crash.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
    }
}
