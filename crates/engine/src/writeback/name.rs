//! How the tier finds a file again after a restart: each file key is declared in the log
//! with a *name* — the file's identity, its file handle (`name_to_handle_at`) and its path
//! relative to the backing root at the time of its first write.
//!
//! Recovery opens the file by its handle (`open_by_handle_at` on the backing root: survives
//! renames, and the file system refuses a handle whose inode was freed or reused, with
//! `ESTALE`), which needs `CAP_DAC_READ_SEARCH` (root). Without it, or where the file system
//! gives no handles, it opens the path and accepts the file only if its inode number and
//! generation are the recorded ones. A file the handle says is gone (`ESTALE`) was deleted:
//! its records are dropped. A file found neither way (renamed while the mount ran without
//! root, say) stops recovery with the path it was looking for.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::identity::{fs_generation, FileId, Generation, UnionFiles};

/// Longest handle kept (the kernel's MAX_HANDLE_SZ).
const MAX_HANDLE_BYTES: usize = 128;
/// Longest relative path kept in a name (a name fits one 4 KiB page).
const MAX_PATH_BYTES: usize = 3000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileName {
    pub dev: u64,
    pub ino: u64,
    /// The file system's inode generation, if it reports one.
    pub generation: Option<u32>,
    /// `file_handle.handle_type` and its bytes in hex, if the file system gives handles.
    pub handle_type: Option<i32>,
    pub handle: String,
    /// Relative to the backing root; "" if unknown or too long.
    pub path: String,
    /// The file lost its last name while the mount ran: after a restart (every descriptor
    /// of the dead daemon closed) its inode is gone, and so are its records.
    #[serde(default)]
    pub unlinked: bool,
    /// On a mount of several backing branches: the file's farcache id. Such a file is found
    /// again as the live file of the union with that id (`UnionFiles`), by handle or path on
    /// any branch; `dev`, `ino`, `handle` and `path` are then its inode's on its branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub union_id: Option<u64>,
    /// A move between branches is about to make the file another inode: that copy's name
    /// (declared before the switch, so that recovery finds the file whichever copy the
    /// move's journal keeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_to: Option<Box<FileName>>,
}

/// A branch root as recovery uses it: its path, an open descriptor (for
/// `open_by_handle_at`) and its device.
pub struct Root {
    pub path: std::path::PathBuf,
    pub fd: File,
    pub dev: u64,
}

impl Root {
    pub fn open(path: &Path) -> io::Result<Root> {
        use std::os::unix::fs::MetadataExt;
        let fd = open_root(path)?;
        let dev = fd.metadata()?.dev();
        Ok(Root { path: path.to_path_buf(), fd, dev })
    }
}

impl FileName {
    /// The name of `file` (open on a backing file whose identity is `id`) under `root`.
    pub fn of(root: &Path, file: &File, id: &FileId) -> FileName {
        let generation = match id.generation {
            Generation::Fs(g) => Some(g),
            Generation::Local { .. } => None,
        };
        let (handle_type, handle) = match handle_of(file) {
            Some((t, h)) => (Some(t), hex(&h)),
            None => (None, String::new()),
        };
        let link = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok();
        let unlinked = link.as_ref().is_some_and(|p| p.as_os_str().as_encoded_bytes().ends_with(b" (deleted)"));
        let path = link
            .filter(|_| !unlinked)
            .and_then(|p| p.strip_prefix(root).ok().map(|r| r.to_string_lossy().into_owned()))
            .filter(|p| p.len() <= MAX_PATH_BYTES)
            .unwrap_or_default();
        FileName {
            dev: id.dev,
            ino: id.ino,
            generation,
            handle_type,
            handle,
            path,
            unlinked,
            union_id: None,
            moving_to: None,
        }
    }

    /// The name of `file`, a file of a mount of several branches (`roots`) whose farcache id
    /// is `id`: its inode on its branch, its path relative to that branch.
    pub fn of_union(roots: &[std::path::PathBuf], file: &File, id: u64) -> FileName {
        use std::os::unix::fs::MetadataExt;
        let md = file.metadata().ok();
        let link = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok();
        let root = link.as_ref().and_then(|l| roots.iter().find(|r| l.starts_with(r))).cloned().unwrap_or_default();
        let real = FileId {
            dev: md.as_ref().map_or(0, |m| m.dev()),
            ino: md.as_ref().map_or(0, |m| m.ino()),
            generation: match fs_generation(std::os::fd::AsFd::as_fd(file)) {
                Some(g) => Generation::Fs(g),
                None => Generation::Local { epoch: 0, seq: 0 },
            },
        };
        let mut n = FileName { union_id: Some(id), ..FileName::of(&root, file, &real) };
        if root.as_os_str().is_empty() {
            n.path.clear(); // on no branch: the handle alone
        }
        n
    }

    /// Find the file of a mount of several branches this name names (its `union_id`) again
    /// after a restart, once the union finished the moves a crash interrupted: the live
    /// file with that id among the inodes its handles (and those of `moving_to`) name, else
    /// at its recorded path on any branch. `Gone` only when every handle could be tried and
    /// none is live: each inode a file of the union had while the tier held its data was
    /// declared here before the file became it (`DataPath::moving`), so the file was deleted.
    pub fn locate_union(&self, roots: &[Root], union: &dyn UnionFiles) -> Located {
        let Some(want) = self.union_id else { return Located::Lost("not a file of a union".into()) };
        if self.unlinked {
            return Located::Gone;
        }
        let names: Vec<&FileName> = std::iter::once(self).chain(self.moving_to.as_deref()).collect();
        let mut sure = true;
        for n in &names {
            let (Some(t), Some(h)) = (n.handle_type, unhex(&n.handle)) else {
                sure = false;
                continue;
            };
            let Some(r) = roots.iter().find(|r| r.dev == n.dev) else {
                sure = false;
                continue;
            };
            match open_by_handle(&r.fd, t, &h) {
                Ok(f) if union.live_id(&f) == Some(want) => return Located::Found(f),
                Ok(_) => {} // deleted (held open by someone), or no longer the file
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) => {}
                Err(_) => sure = false, // not root, or no handles here: by path
            }
        }
        for n in &names {
            if n.path.is_empty() {
                continue;
            }
            for r in roots {
                let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).open(r.path.join(&n.path)) else {
                    continue;
                };
                if union.live_id(&f) == Some(want) {
                    return Located::Found(f);
                }
            }
        }
        if sure {
            Located::Gone
        } else {
            Located::Lost(format!(
                "file {want} of the union (last at {}) is neither where its handles nor where its path lead",
                if self.path.is_empty() { "an unknown path" } else { &self.path }
            ))
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a name serialises")
    }

    pub fn decode(b: &[u8]) -> Option<FileName> {
        serde_json::from_slice(b).ok()
    }

    /// Open the file again while the mount runs (the tier let go of its descriptor): as
    /// [`FileName::locate`], except that a file named unlinked is looked for by its handle
    /// alone — it lives as long as a process has it open, and the file system refuses the
    /// handle (`ESTALE`: gone) once its inode is freed.
    pub fn reopen(&self, root: &Path, root_fd: &File) -> Located {
        if !self.unlinked {
            return self.locate(root, root_fd);
        }
        match (self.handle_type, unhex(&self.handle)) {
            (Some(t), Some(h)) => match open_by_handle(root_fd, t, &h) {
                Ok(f) => Located::Found(f),
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) => Located::Gone,
                Err(e) => Located::Lost(format!("an unlinked file, by its handle: {e}")),
            },
            _ => Located::Lost("an unlinked file with no handle".into()),
        }
    }

    /// Whether this name's handle opens the file again (`Some(false)`: it opens nothing or
    /// another inode; `None`: no handle, or out of descriptors — nothing learnt).
    pub fn handle_opens(&self, root_fd: &File) -> Option<bool> {
        use std::os::unix::fs::MetadataExt;
        let (t, h) = (self.handle_type?, unhex(&self.handle)?);
        match open_by_handle(root_fd, t, &h) {
            Ok(f) => Some(f.metadata().is_ok_and(|m| m.ino() == self.ino && m.dev() == self.dev)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)) => None,
            Err(_) => Some(false),
        }
    }

    /// Open the file this name names, read-write, under `root` (`root_fd` open on it).
    pub fn locate(&self, root: &Path, root_fd: &File) -> Located {
        if self.unlinked {
            return Located::Gone;
        }
        if let (Some(t), Some(h)) = (self.handle_type, unhex(&self.handle)) {
            match open_by_handle(root_fd, t, &h) {
                Ok(f) => return Located::Found(f),
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) => return Located::Gone,
                Err(_) => {} // not root, or no handles here: by path
            }
        }
        if self.path.is_empty() {
            return Located::Lost("no usable handle and no path recorded".into());
        }
        let p = root.join(&self.path);
        let f = match std::fs::OpenOptions::new().read(true).write(true).open(&p) {
            Ok(f) => f,
            Err(e) => return Located::Lost(format!("{}: {e}", p.display())),
        };
        use std::os::unix::fs::MetadataExt;
        let md = match f.metadata() {
            Ok(m) => m,
            Err(e) => return Located::Lost(format!("{}: {e}", p.display())),
        };
        let gen_ok = self.generation.is_none_or(|g| fs_generation(std::os::fd::AsFd::as_fd(&f)) == Some(g));
        if md.ino() != self.ino || !gen_ok {
            return Located::Lost(format!(
                "{} is now another file (inode {} generation differs)",
                p.display(),
                md.ino()
            ));
        }
        Located::Found(f)
    }
}

pub enum Located {
    Found(File),
    /// The file system says the inode is gone: the file was deleted.
    Gone,
    /// Could not be found; why.
    Lost(String),
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

#[repr(C)]
struct Handle {
    bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_BYTES],
}

fn handle_of(file: &File) -> Option<(i32, Vec<u8>)> {
    let mut h = Handle { bytes: MAX_HANDLE_BYTES as u32, handle_type: 0, f_handle: [0; MAX_HANDLE_BYTES] };
    let mut mount_id: libc::c_int = 0;
    let empty = CString::new("").expect("no NUL");
    // SAFETY: `h` is a file_handle with room for MAX_HANDLE_BYTES; AT_EMPTY_PATH names `file`.
    let r = unsafe {
        libc::name_to_handle_at(
            file.as_raw_fd(),
            empty.as_ptr(),
            (&mut h as *mut Handle).cast(),
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    (r == 0).then(|| (h.handle_type, h.f_handle[..(h.bytes as usize).min(MAX_HANDLE_BYTES)].to_vec()))
}

fn open_by_handle(root_fd: &File, handle_type: i32, bytes: &[u8]) -> io::Result<File> {
    if bytes.len() > MAX_HANDLE_BYTES {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut h = Handle { bytes: bytes.len() as u32, handle_type, f_handle: [0; MAX_HANDLE_BYTES] };
    h.f_handle[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: `h` is a valid file_handle; returns a new descriptor or -1.
    let fd = unsafe {
        libc::open_by_handle_at(root_fd.as_raw_fd(), (&mut h as *mut Handle).cast(), libc::O_RDWR | libc::O_CLOEXEC)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The root as `open_by_handle_at` needs it.
pub fn open_root(root: &Path) -> io::Result<File> {
    let c = CString::new(root.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: NUL-terminated path; returns a new descriptor or -1.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identities;

    #[test]
    fn a_name_finds_its_file_after_a_rename_and_refuses_a_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/a"), b"x").unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(root.join("d/a")).unwrap();
        let id = Identities::new().identify(&f).unwrap();
        let n = FileName::of(&root, &f, &id);
        assert_eq!(n.path, "d/a");
        let n = FileName::decode(&n.encode()).unwrap();
        let rfd = open_root(&root).unwrap();
        assert!(matches!(n.locate(&root, &rfd), Located::Found(_)));
        // Renamed: found by handle (root) — or, by path only, lost with the path named.
        std::fs::rename(root.join("d/a"), root.join("d/b")).unwrap();
        match n.locate(&root, &rfd) {
            Located::Found(g) => {
                use std::os::unix::fs::MetadataExt;
                assert_eq!(g.metadata().unwrap().ino(), n.ino);
            }
            Located::Lost(why) => assert!(why.contains("d/a"), "{why}"),
            Located::Gone => panic!("a renamed file is not gone"),
        }
        // Without a handle (not root, say), by path only: a renamed file is lost, with the path.
        let by_path = FileName { handle_type: None, handle: String::new(), ..n.clone() };
        assert!(matches!(by_path.locate(&root, &rfd), Located::Lost(why) if why.contains("d/a")));
        // Named unlinked: gone, whatever is at its path now.
        assert!(matches!(FileName { unlinked: true, ..by_path.clone() }.locate(&root, &rfd), Located::Gone));
        // Deleted and replaced by another file at the old path: never the new one.
        drop(f);
        std::fs::remove_file(root.join("d/b")).unwrap();
        std::fs::write(root.join("d/a"), b"other").unwrap();
        if let Located::Found(g) = n.locate(&root, &rfd) {
            use std::os::unix::fs::MetadataExt;
            let md = g.metadata().unwrap();
            // Same inode number reused: the generation must differ, so it cannot be found.
            panic!("found inode {} for a deleted file (recorded {})", md.ino(), n.ino);
        }
    }
}
