//! FUSE-over-io_uring (`mount.fuse_uring`) through the real `farcache mount --no-remote`: the
//! rings are used (the request counter in `farcache stats` moves), concurrent `O_DIRECT`
//! reads and writes come back byte for byte, `"on"` without the kernel's switch and with
//! `--supervise` is refused with the fix named, `"auto"` says which transport it took, and a
//! mount served over rings refuses to be taken over while it serves on. The POSIX suite over
//! rings is `ring_posix.rs`.
//!
//! The kernel's switch (`/sys/module/fuse/parameters/enable_uring`) is set by guards that
//! restore it, also when a test fails (`farcache_testkit::uring_on`, `uring_at`). Needs root.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use farcache_testkit::{fuse_mounted, require_root, text, AlignedBuf, MountProcess};
use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// A fresh test directory with `backing/`, `mnt/` and a configuration file holding `mount`.
fn setup(tag: &str, mount: &str) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    require_root("FUSE-over-io_uring's kernel switch");
    let root = farcache_testkit::fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("fuse-uring-{tag}"));
    let (backing, mnt, cfg) = (root.join("backing"), root.join("mnt"), root.join("farcache.toml"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(&cfg, format!("[mount]\n{mount}")).unwrap();
    (root, backing, mnt, cfg)
}

fn start(root: &Path, backing: &Path, mnt: &Path, cfg: &Path, extra: &[&str]) -> Result<MountProcess, String> {
    let mut args = vec!["--no-remote", "--config", cfg.to_str().unwrap()];
    args.extend_from_slice(extra);
    MountProcess::try_start(bin(), backing, mnt, &args, &root.join("daemon.log"))
}

/// `farcache stats MNT --json`'s `fuse` document.
fn fuse_stats(mnt: &Path) -> Value {
    let out = farcache_testkit::run_bin(bin(), &["stats", mnt.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "farcache stats: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["fuse"].clone()
}

/// Wait (at most 10 s) until the rings serve: they are registered as serving starts.
fn wait_rings(mnt: &Path) -> Value {
    let t0 = Instant::now();
    loop {
        let f = fuse_stats(mnt);
        if f["mode"] == "io_uring" || t0.elapsed() > Duration::from_secs(10) {
            return f;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `farcache mount` with these arguments, which must be refused: its stderr.
fn refused(backing: &Path, mnt: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(bin())
        .arg("mount")
        .arg(backing)
        .arg(mnt)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "not refused: {}", text(&out.stderr));
    assert!(!fuse_mounted(mnt));
    text(&out.stderr)
}

/// Deterministic 4 KiB block contents for (writer, round, block).
fn block(w: u64, round: u64, b: u64) -> Vec<u8> {
    let mut x = (w << 40) ^ (round << 20) ^ b ^ 0x9E37_79B9_7F4A_7C15;
    let mut v = Vec::with_capacity(4096);
    for _ in 0..512 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

#[test]
fn rings_serve_requests_and_count_them() {
    let _k = farcache_testkit::uring_on();
    let (root, backing, mnt, cfg) = setup("count", "fuse_uring = \"on\"\nfuse_uring_queue_depth = 4\n");
    fs::write(backing.join("f"), b"over the ring").unwrap();
    let m = start(&root, &backing, &mnt, &cfg, &[]).unwrap();
    let before = wait_rings(&mnt);
    assert_eq!(before["mode"], "io_uring", "{before}");
    assert_eq!(before["fuse_uring"], "on");
    // One queue per possible CPU, as the kernel makes them.
    let possible = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let cpus = possible.trim().split([',', '-']).filter_map(|t| t.parse::<u64>().ok()).max().unwrap() + 1;
    assert_eq!(before["ring_queues"], cpus, "{before}");
    assert_eq!(before["ring_entries"], 4 * cpus, "{before}");
    for _ in 0..50 {
        assert_eq!(fs::read(m.m("f")).unwrap(), b"over the ring");
        fs::metadata(m.m("nope")).unwrap_err();
    }
    let after = fuse_stats(&mnt);
    let moved = after["ring_requests"].as_u64().unwrap() - before["ring_requests"].as_u64().unwrap();
    // 50 × (open, read, flush, release, a lookup that fails...): far more than 100.
    assert!(moved >= 100, "ring requests moved by {moved}: {before} -> {after}");
    assert_eq!(after["ring_commit_errors"], 0);
    let human = text(&farcache_testkit::run_bin(bin(), &["stats", mnt.to_str().unwrap()]).stdout);
    assert!(human.contains("fuse       FUSE-over-io_uring (mount.fuse_uring = on)"), "{human}");
    assert!(m.log_text().contains("requests by FUSE-over-io_uring"), "{}", m.log_text());
    drop(m);
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn concurrent_o_direct_reads_and_writes_come_back_byte_for_byte() {
    const WRITERS: u64 = 4;
    const BLOCKS: u64 = 64; // per writer
    const ROUNDS: u64 = 6;
    let _k = farcache_testkit::uring_on();
    let (root, backing, mnt, cfg) = setup("odirect", "fuse_uring = \"on\"\n");
    let m = start(&root, &backing, &mnt, &cfg, &[]).unwrap();
    assert_eq!(wait_rings(&mnt)["mode"], "io_uring");
    let path = m.m("shared");
    fs::File::create(&path).unwrap().set_len(WRITERS * BLOCKS * 4096).unwrap();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let path = path.clone();
            s.spawn(move || {
                let f = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
                let mut a = AlignedBuf::new(4096);
                for round in 0..ROUNDS {
                    for b in 0..BLOCKS {
                        let off = (w * BLOCKS + b) * 4096;
                        a.buf().copy_from_slice(&block(w, round, b));
                        f.write_all_at(a.buf(), off).unwrap();
                        a.buf().fill(0);
                        f.read_exact_at(a.buf(), off).unwrap();
                        assert!(a.buf() == block(w, round, b).as_slice(), "writer {w} round {round} block {b}");
                    }
                }
            });
        }
        // Readers of every region meanwhile: each block is always one round's whole block.
        for r in 0..4u64 {
            let path = path.clone();
            s.spawn(move || {
                let f = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
                let mut a = AlignedBuf::new(4096);
                for i in 0..1500u64 {
                    let n = (i * 7919 + r * 104_729) % (WRITERS * BLOCKS);
                    f.read_exact_at(a.buf(), n * 4096).unwrap();
                    let (w, b) = (n / BLOCKS, n % BLOCKS);
                    let ok =
                        a.buf().iter().all(|&x| x == 0) || (0..ROUNDS).any(|k| a.buf() == block(w, k, b).as_slice());
                    assert!(ok, "reader {r}: block {n} is torn or foreign");
                }
            });
        }
    });
    assert!(t0.elapsed() < Duration::from_secs(120), "took {:?}", t0.elapsed());
    let all = fs::read(backing.join("shared")).unwrap();
    for w in 0..WRITERS {
        for b in 0..BLOCKS {
            let off = ((w * BLOCKS + b) * 4096) as usize;
            assert!(all[off..off + 4096] == block(w, ROUNDS - 1, b)[..], "backing block {w}/{b}");
        }
    }
    assert!(fuse_stats(&mnt)["ring_requests"].as_u64().unwrap() > WRITERS * BLOCKS * ROUNDS * 2);
    drop(m);
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn on_without_the_kernel_switch_is_refused_and_auto_says_read_loops() {
    let _k = farcache_testkit::uring_at(false);
    let (root, backing, mnt, cfg) = setup("off", "fuse_uring = \"on\"\n");
    let e = refused(&backing, &mnt, &["--no-remote", "--config", cfg.to_str().unwrap()]);
    assert!(e.contains("mount.fuse_uring") && e.contains("echo Y > /sys/module/fuse/parameters/enable_uring"), "{e}");
    fs::write(&cfg, "[mount]\nfuse_uring = \"auto\"\n").unwrap();
    let m = start(&root, &backing, &mnt, &cfg, &[]).unwrap();
    let f = fuse_stats(&mnt);
    assert_eq!(f["mode"], "read-loops", "{f}");
    assert!(f["reason"].as_str().unwrap().contains("enable_uring is N"), "{f}");
    assert!(m.log_text().contains("read loops (FUSE-over-io_uring is off in the kernel"), "{}", m.log_text());
    fs::write(backing.join("g"), b"x").unwrap();
    assert_eq!(fs::read(m.m("g")).unwrap(), b"x");
    assert_eq!(fuse_stats(&mnt)["ring_requests"], 0);
    drop(m);
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn rings_are_never_handed_to_another_daemon() {
    let _k = farcache_testkit::uring_on();
    let (root, backing, mnt, cfg) = setup("handover", "fuse_uring = \"on\"\n");
    // "on" with --supervise: refused at start, naming the fix.
    let c = cfg.to_str().unwrap();
    let e = refused(&backing, &mnt, &["--no-remote", "--config", c, "--supervise"]);
    assert!(e.contains("cannot be combined with --supervise") && e.contains("fix:"), "{e}");
    // A mount served over rings refuses to be taken over, and serves on.
    let m = start(&root, &backing, &mnt, &cfg, &[]).unwrap();
    assert_eq!(wait_rings(&mnt)["mode"], "io_uring");
    fs::write(&cfg, "[mount]\nfuse_uring = \"auto\"\n").unwrap();
    let t0 = Instant::now();
    let args = ["--no-remote", "--config", c];
    let e = MountProcess::try_takeover(bin(), &backing, &mnt, &args, &root.join("takeover.log")).err().unwrap();
    assert!(e.contains("FUSE-over-io_uring") && e.contains("refused"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(30));
    fs::write(backing.join("h"), b"still").unwrap();
    assert_eq!(fs::read(m.m("h")).unwrap(), b"still");
    assert_eq!(fuse_stats(&mnt)["mode"], "io_uring");
    drop(m);
    // "auto" under --supervise: read loops, said in the log.
    let log = root.join("supervised.log");
    let args = ["--no-remote", "--config", c, "--supervise"];
    let s = MountProcess::try_start(bin(), &backing, &mnt, &args, &log).unwrap();
    assert_eq!(fs::read(s.m("h")).unwrap(), b"still");
    let f = fuse_stats(&mnt);
    assert_eq!(f["mode"], "read-loops", "{f}");
    assert!(s.log_text().contains("with --supervise: /dev/fuse read loops"), "{}", s.log_text());
    drop(s);
    fs::remove_dir_all(&root).unwrap();
}

/// What the kernel does with a ring connection whose daemon died while another process holds
/// the connection (as `--supervise` does), learned by being that other process: it takes a
/// copy of the dead daemon's `/dev/fuse` descriptor (`pidfd_getfd`) and registers ring
/// entries of its own. The findings this asserts (ARCHITECTURE.md, "The FUSE transport"):
/// 1. a new process's REGISTER is accepted on the live connection after the old rings are
///    gone, and new requests are then served over its entries;
/// 2. a request the dead daemon had been handed is never delivered again, not even after
///    FUSE_NOTIFY_RESEND (which only requeues `/dev/fuse` requests): it fails with ECANCELED
///    when the daemon dies, or waits until the connection is aborted (then ENOTCONN or
///    ECONNABORTED), or (when the daemon died between its assignment and its delivery) even
///    past the abort;
/// 3. a request made while no entry was registered is not delivered by a REGISTER, only by
///    the next COMMIT_AND_FETCH on its queue.
///
/// So a daemon dying under rings leaves its in-flight requests hanging, and a successor that
/// serves with read loops gets nothing at all (the connection routes every request to the
/// rings): `--supervise` and `--takeover` use read loops, and "on" with them is refused.
#[test]
fn after_a_ring_daemon_dies_a_new_process_can_register_but_its_requests_are_lost() {
    use io_uring::{cqueue, opcode, squeue, types, IoUring};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    let _k = farcache_testkit::uring_on();
    let (root, backing, mnt, cfg) = setup("orphan", "fuse_uring = \"on\"\nfuse_uring_queue_depth = 1\n");
    let m = start(&root, &backing, &mnt, &cfg, &[]).unwrap();
    assert_eq!(wait_rings(&mnt)["mode"], "io_uring");
    let pid = m.pid() as i32;
    // A copy of the daemon's /dev/fuse descriptor keeps the connection alive after it dies.
    let target = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| fs::read_link(e.path()).is_ok_and(|l| l == Path::new("/dev/fuse")))
        .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .expect("the daemon's /dev/fuse descriptor");
    // SAFETY: plain system calls; results checked, the new descriptors owned at once.
    let fuse = unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
        assert!(pidfd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
        let fd = libc::syscall(libc::SYS_pidfd_getfd, pidfd, target, 0) as i32;
        libc::close(pidfd);
        assert!(fd >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
        OwnedFd::from_raw_fd(fd)
    };
    let conn = connection_number(&mnt);
    // Whatever happens below, abort the connection (blocked callers get ENOTCONN) and
    // detach the mount at the end.
    struct Cleanup(String, PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = fs::write(format!("/sys/fs/fuse/connections/{}/abort", self.0), "1");
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.1).status();
        }
    }
    let cleanup = Cleanup(conn, mnt.clone());

    // A stat on CPU 0 (so on ring queue 0), on its own thread; its result comes on `rx`.
    // Returns the thread's id, which the kernel puts in its requests' headers (`pid`).
    let (tx, rx) = std::sync::mpsc::channel::<(&'static str, i32)>();
    let stat_on_cpu0 = |name: &'static str| -> u32 {
        let (tx, p) = (tx.clone(), mnt.join(name));
        let (tid_tx, tid_rx) = std::sync::mpsc::channel::<u32>();
        std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let _ = tid_tx.send(unsafe { libc::gettid() } as u32);
            // SAFETY: a zeroed cpu_set_t with CPU 0 set, for this thread.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            let e = fs::metadata(&p).err().and_then(|e| e.raw_os_error()).unwrap_or(0);
            let _ = tx.send((name, e));
        });
        tid_rx.recv_timeout(Duration::from_secs(5)).unwrap()
    };

    // (2) The daemon is handed a request and dies before answering it.
    m.freeze();
    let inflight = stat_on_cpu0("inflight");
    std::thread::sleep(Duration::from_millis(300));
    m.release_mount();
    m.signal(libc::SIGKILL);
    assert!(m.wait_exit_timeout(Duration::from_secs(10)).is_some(), "the daemon did not die");
    // Depending on whether the request had reached the daemon's ring (its completion
    // posted) before it died, it fails at once with ECANCELED (the kernel's task-work path
    // for a dead ring task) or stays assigned to the dead entry.
    let cancelled = match rx.recv_timeout(Duration::from_millis(500)) {
        Ok(("inflight", e)) => {
            assert_eq!(e, libc::ECANCELED, "the in-flight request's error");
            true
        }
        Ok(other) => panic!("unexpected answer {other:?}"),
        Err(_) => false,
    };
    // (3) A request while nobody has an entry registered.
    let early = stat_on_cpu0("early");
    std::thread::sleep(Duration::from_millis(300));
    let answered = rx.try_recv();
    assert!(answered.is_err(), "a request was answered with no daemon: {answered:?}");

    // (1) This process registers one entry per queue.
    let queues = {
        let possible = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
        possible.trim().split([',', '-']).filter_map(|t| t.parse::<usize>().ok()).max().unwrap() + 1
    };
    const PAYLOAD: usize = 2 << 20;
    struct Ent {
        header: Box<[u8; 288]>,
        _payload: Vec<u8>,
        iov: Box<[libc::iovec; 2]>,
    }
    let mut ents: Vec<Ent> = (0..queues)
        .map(|_| {
            let mut header = Box::new([0u8; 288]);
            let mut payload = vec![0u8; PAYLOAD];
            let iov = Box::new([
                libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: 288 },
                libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: PAYLOAD },
            ]);
            Ent { header, _payload: payload, iov }
        })
        .collect();
    let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(8).unwrap();
    let sqe = |ent: &Ent, qid: usize, op: u32, commit_id: u64| -> squeue::Entry128 {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&(qid as u16).to_ne_bytes());
        let e = opcode::UringCmd80::new(types::Fd(fuse.as_raw_fd()), op)
            .cmd(cmd)
            .addr(Some(ent.iov.as_ptr() as u64))
            .build()
            .user_data(qid as u64);
        // `len` (the iovec count, 2) at offset 24 of the SQE; io-uring's builder has no field.
        // SAFETY: Entry128 is a repr(C) 128-byte SQE.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        // SAFETY: back to the same type.
        unsafe { std::mem::transmute(raw) }
    };
    for (qid, ent) in ents.iter().enumerate() {
        // SAFETY: the entry's buffers outlive the ring (dropped after it, below).
        unsafe { ring.submission().push(&sqe(ent, qid, 1, 0)).unwrap() };
    }
    ring.submit().unwrap();
    let refused: Vec<i32> = ring.completion().map(|c| c.result()).collect();
    assert!(refused.is_empty(), "REGISTER refused: {refused:?}");
    // Wait (bounded) for the next request on any entry: (qid, unique, requesting thread).
    let next_request = |ring: &mut IoUring<squeue::Entry128, cqueue::Entry>, ents: &[Ent], wait: Duration| {
        let ts = types::Timespec::new().sec(wait.as_secs()).nsec(wait.subsec_nanos());
        let args = types::SubmitArgs::new().timespec(&ts);
        let _ = ring.submitter().submit_with_args(1, &args);
        let c = ring.completion().next()?;
        assert!(c.result() >= 0, "ring entry completed with {}", c.result());
        let q = c.user_data() as usize;
        let h = &ents[q].header;
        let unique = u64::from_ne_bytes(h[8..16].try_into().unwrap());
        let tid = u32::from_ne_bytes(h[32..36].try_into().unwrap());
        Some((q, unique, tid))
    };
    // (3) Registering did not deliver the early request.
    assert!(next_request(&mut ring, &ents, Duration::from_secs(1)).is_none(), "REGISTER delivered a queued request");
    // (1) A new request is served over this process's entry; answering it (ENOENT, whatever
    // it is: the LOOKUP, or a GETATTR of the root first) with COMMIT_AND_FETCH then fetches
    // the early one.
    let late = stat_on_cpu0("late");
    let (mut served, mut answered): (Vec<&str>, Vec<(&str, i32)>) = (Vec::new(), Vec::new());
    let t0 = Instant::now();
    while answered.len() < 2 && t0.elapsed() < Duration::from_secs(10) {
        while let Ok(a) = rx.try_recv() {
            answered.push(a);
        }
        // Also submits the commit queued last time round.
        let Some((q, unique, tid)) = next_request(&mut ring, &ents, Duration::from_millis(200)) else { continue };
        served.push(if tid == late {
            "late"
        } else if tid == early {
            "early"
        } else {
            "other"
        });
        let h = &mut ents[q].header;
        h[..4].copy_from_slice(&16u32.to_ne_bytes());
        h[4..8].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        h[272..276].copy_from_slice(&0u32.to_ne_bytes());
        // SAFETY: as above.
        unsafe { ring.submission().push(&sqe(&ents[q], q, 2, unique)).unwrap() };
    }
    served.dedup();
    answered.sort();
    assert_eq!(answered, [("early", libc::ENOENT), ("late", libc::ENOENT)], "served {served:?}");
    assert_eq!(served, ["late", "early"], "the order requests were delivered in");
    // (2) The dead daemon's request: not delivered, not even after FUSE_NOTIFY_RESEND.
    let resend: [u8; 16] = {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&16u32.to_ne_bytes());
        b[4..8].copy_from_slice(&7i32.to_ne_bytes()); // FUSE_NOTIFY_RESEND
        b
    };
    // SAFETY: writes 16 bytes from a local buffer to a descriptor we own.
    let w = unsafe { libc::write(fuse.as_raw_fd(), resend.as_ptr().cast(), 16) };
    assert_eq!(w, 16, "FUSE_NOTIFY_RESEND: {}", std::io::Error::last_os_error());
    assert!(next_request(&mut ring, &ents, Duration::from_secs(2)).is_none(), "the lost request came back");
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err(), "the lost request was answered");
    // Aborting the connection ends it (ENOTCONN) — the only way out for its caller.
    drop(cleanup);
    if !cancelled {
        // Usually it then fails (ENOTCONN or ECONNABORTED). If the daemon died between the request being
        // assigned to its entry and the entry's completion being posted, the entry is in
        // none of the lists a teardown walks and the caller stays in request_wait_answer
        // (killable) past the abort — seen in about one run in five here.
        match rx.recv_timeout(Duration::from_secs(5)) {
            // ENOTCONN, or ECONNABORTED from the teardown of the dead entry.
            Ok((name, e)) => assert!(name == "inflight" && [libc::ENOTCONN, libc::ECONNABORTED].contains(&e), "{e}"),
            Err(_) => {
                let wchan = fs::read_to_string(format!("/proc/self/task/{inflight}/wchan")).unwrap_or_default();
                assert_eq!(wchan, "request_wait_answer", "where the lost request's caller waits");
            }
        }
    }
    drop(ring);
    drop(ents);
    drop(m);
    let _ = fs::remove_dir_all(&root);
}

/// The FUSE connection number of the mount at `mnt` (its device's minor number, the name
/// under /sys/fs/fuse/connections), from /proc/self/mountinfo (stat(2) would ask the mount).
fn connection_number(mnt: &Path) -> String {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = mnt.to_str().unwrap();
    let line = info.lines().find(|l| l.split(' ').nth(4) == Some(want)).expect("the mount in mountinfo");
    line.split(' ').nth(2).unwrap().split(':').nth(1).unwrap().to_string()
}
