use std::fs::File;
use std::io::Write;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::sync::Arc;

use super::*;

fn engine(kind: IoEngineKind, queue_depth: u32, max_in_flight: u32) -> IoEngine {
    IoEngine::new(IoOptions { kind, queue_depth, max_in_flight })
}

fn tmpfile(tag: &str, data: &[u8]) -> (tempfile::TempDir, File) {
    // Under the target directory: a disk file system, like the backing store.
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/engine-test");
    std::fs::create_dir_all(&base).unwrap();
    let d = tempfile::Builder::new().prefix(tag).tempdir_in(base).unwrap();
    let p = d.path().join("f");
    File::create(&p).unwrap().write_all(data).unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    (d, f)
}

fn uninit(n: usize) -> Vec<MaybeUninit<u8>> {
    vec![MaybeUninit::new(0); n]
}

fn init(b: &[MaybeUninit<u8>]) -> Vec<u8> {
    // SAFETY: the tests only look at bytes a read filled (or the zeroes they started as).
    b.iter().map(|x| unsafe { x.assume_init() }).collect()
}

#[test]
fn both_engines_read_write_and_sync_in_batches() {
    for kind in [IoEngineKind::Uring, IoEngineKind::Sync] {
        let e = engine(kind, 4, 8);
        let (_d, f) = tmpfile("batch", &[0u8; 40_000]);
        let fd = f.as_fd();
        let blocks: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i + 1; 4000]).collect();
        let mut ops: Vec<Op<'_>> =
            blocks.iter().enumerate().map(|(i, b)| Op::Write { fd, offset: i as u64 * 4000, data: b }).collect();
        ops.push(Op::Fsync { fd, datasync: true });
        let res = e.run(&mut ops);
        assert!(res[..10].iter().all(|r| *r.as_ref().unwrap() == 4000), "{res:?}");
        assert_eq!(*res[10].as_ref().unwrap(), 0);
        let mut bufs: Vec<Vec<MaybeUninit<u8>>> = (0..11).map(|_| uninit(4000)).collect();
        let mut ops: Vec<Op<'_>> =
            bufs.iter_mut().enumerate().map(|(i, b)| Op::Read { fd, offset: i as u64 * 4000, buf: b }).collect();
        let res: Vec<usize> = e.run(&mut ops).into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(res, [vec![4000; 10], vec![0]].concat(), "the last read is past the end of the file");
        for (i, b) in bufs.iter().take(10).enumerate() {
            assert_eq!(init(b), blocks[i]);
        }
        let s = e.counters().snapshot();
        assert_eq!(s.engine, kind);
        let total = 22;
        match kind {
            IoEngineKind::Uring => assert_eq!((s.ops_uring, s.ops_sync, s.rings), (total, 0, 1)),
            IoEngineKind::Sync => assert_eq!((s.ops_uring, s.ops_sync, s.rings), (0, total, 0)),
        }
        assert!(s.in_flight_peak <= 4 && s.in_flight == 0, "{s:?}");
        assert_eq!(s.fallback_no_uring, 0);
    }
}

#[test]
fn errors_are_the_os_errors_and_offsets_off_the_range_are_refused() {
    for kind in [IoEngineKind::Uring, IoEngineKind::Sync] {
        let e = engine(kind, 2, 2);
        let (_d, f) = tmpfile("err", b"hello");
        let ro = File::open(_d.path().join("f")).unwrap();
        let err = e.write_all(ro.as_fd(), 0, b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{kind}: {err}");
        let mut b = uninit(8);
        for off in [u64::MAX, i64::MAX as u64 + 1] {
            let err = e.run_one(Op::Read { fd: f.as_fd(), offset: off, buf: &mut b }).unwrap_err();
            assert!(matches!(err.raw_os_error(), Some(libc::EFBIG)), "{kind} at {off}: {err}");
        }
        // A read at end of file is short, not an error; read_full stops there.
        assert_eq!(e.read_full(f.as_fd(), 2, &mut b, 1).unwrap(), 3);
        assert_eq!(&init(&b)[..3], b"llo");
        assert_eq!(e.counters().snapshot().short_retries, 0, "the end of a file is not a short transfer");
    }
}

#[test]
fn in_flight_stays_within_its_bound_with_many_threads() {
    for kind in [IoEngineKind::Uring, IoEngineKind::Sync] {
        let e = Arc::new(engine(kind, 2, 3));
        let (_d, f) = tmpfile("bound", &vec![5u8; 1 << 20]);
        let f = Arc::new(f);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (e, f) = (e.clone(), f.clone());
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        let mut a = uninit(4096);
                        let mut b = uninit(4096);
                        let off = (t * 7919 + i * 104_729) % 255 * 4096;
                        let mut ops = [
                            Op::Read { fd: f.as_fd(), offset: off, buf: &mut a },
                            Op::Read { fd: f.as_fd(), offset: off + 4096, buf: &mut b },
                        ];
                        for r in e.run(&mut ops) {
                            assert_eq!(r.unwrap(), 4096);
                        }
                        assert!(init(&a).iter().chain(init(&b).iter()).all(|&x| x == 5));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = e.counters().snapshot();
        assert!(s.in_flight_peak <= 3 && s.in_flight == 0, "{kind}: {s:?}");
        assert_eq!(s.ops_uring + s.ops_sync, 8 * 200 * 2);
        if kind == IoEngineKind::Uring {
            assert!(s.rings <= 3, "a ring per caller in flight at most: {s:?}");
        }
    }
}

#[test]
fn without_io_uring_everything_runs_synchronously_and_is_counted() {
    let e = engine(IoEngineKind::Uring, 4, 4);
    // As when io_uring_setup failed on the first ring (ENOSYS, EPERM).
    e.counters.uring_unavailable.store(true, Ordering::Relaxed);
    let (_d, f) = tmpfile("nouring", b"abcdefgh");
    let mut b = uninit(8);
    assert_eq!(e.read_full(f.as_fd(), 0, &mut b, 1).unwrap(), 8);
    e.fsync(f.as_fd(), false).unwrap();
    let s = e.counters().snapshot();
    assert_eq!(s.engine, IoEngineKind::Sync, "the engine in force is shown");
    assert_eq!((s.ops_sync, s.fallback_no_uring, s.ops_uring), (2, 2, 0), "{s:?}");
}

#[test]
fn options_out_of_range_are_named() {
    assert!(IoOptions::default().problem().is_none());
    let o = IoOptions { queue_depth: 0, ..IoOptions::default() };
    assert!(o.problem().unwrap().contains("io_queue_depth"));
    let o = IoOptions { queue_depth: 64, max_in_flight: 32, ..IoOptions::default() };
    assert!(o.problem().unwrap().contains("io_max_in_flight"));
}

/// An empty pipe and its write end (a read of it completes only once something is written).
fn pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills both descriptors on success, and they are ours alone.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    unsafe { (std::os::fd::OwnedFd::from_raw_fd(fds[0]), std::os::fd::OwnedFd::from_raw_fd(fds[1])) }
}

fn write_fd(fd: std::os::fd::BorrowedFd<'_>, data: &[u8]) {
    use std::os::fd::AsRawFd;
    // SAFETY: a live descriptor and a buffer of its true length.
    assert_eq!(unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) }, data.len() as isize);
}

/// `meanwhile` runs while the read waits in the kernel: a read of an empty pipe that only
/// `meanwhile` writes to completes with its bytes. (Run after the wait, the read would block
/// until the watchdog's bytes arrive, and return those.)
#[test]
fn meanwhile_runs_while_a_ring_read_is_in_flight() {
    let e = engine(IoEngineKind::Uring, 4, 8);
    let (r, w) = pipe();
    let w = Arc::new(w);
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = {
        let w = w.clone();
        std::thread::spawn(move || {
            if stop_rx.recv_timeout(std::time::Duration::from_secs(10)).is_err() {
                write_fd(w.as_fd(), b"late!");
            }
        })
    };
    let mut ran = 0;
    let mut m = || {
        ran += 1;
        write_fd(w.as_fd(), b"hello");
    };
    let mut buf = uninit(5);
    let n = e.read_full_while(r.as_fd(), 0, &mut buf, 1, &mut Meanwhile::new(&mut m)).unwrap();
    stop_tx.send(()).unwrap();
    watchdog.join().unwrap();
    assert_eq!((n, init(&buf).as_slice(), ran), (5, &b"hello"[..], 1));
    assert_eq!(e.counters().snapshot().ops_uring, 1, "the read went through a ring");
}

/// A batch larger than the queue depth slides through it: the first completion lets the next
/// operation in while the others still wait. Depth 2, operations [read A, read B, write C]:
/// only once C is in the kernel does the helper feed B. In rounds of 2, C would wait for B
/// and B for C (the helper then gives up after 10 s, feeds B, and says so).
#[test]
fn a_batch_deeper_than_the_queue_slides_through_it() {
    let e = engine(IoEngineKind::Uring, 2, 2);
    let ((ra, wa), (rb, wb), (rc, wc)) = (pipe(), pipe(), pipe());
    let helper = std::thread::spawn(move || {
        write_fd(wa.as_fd(), b"aaaa");
        let mut fd = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&rc), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live descriptor.
        let ready = unsafe { libc::poll(&mut fd, 1, 10_000) } == 1;
        write_fd(wb.as_fd(), b"bbbb");
        (ready, rc) // C's pipe stays open until the batch is done
    });
    let (mut a, mut b) = (uninit(4), uninit(4));
    let mut ops = [
        Op::Read { fd: ra.as_fd(), offset: 0, buf: &mut a },
        Op::Read { fd: rb.as_fd(), offset: 0, buf: &mut b },
        Op::Write { fd: wc.as_fd(), offset: 0, data: b"cccc" },
    ];
    let res: Vec<usize> = e.run(&mut ops).into_iter().map(|r| r.unwrap()).collect();
    assert!(helper.join().unwrap().0, "the write was not submitted until the read before it completed (rounds)");
    assert_eq!((res, init(&a), init(&b)), (vec![4, 4, 4], b"aaaa".to_vec(), b"bbbb".to_vec()));
    let s = e.counters().snapshot();
    assert_eq!((s.ops_uring, s.rings, s.in_flight), (3, 1, 0), "{s:?}");
}

/// A panic in `meanwhile` waits for the read the kernel holds a buffer of, then goes on up;
/// the engine serves the next read.
#[test]
fn a_panic_in_meanwhile_waits_for_the_read_first() {
    let e = engine(IoEngineKind::Uring, 4, 8);
    let (r, w) = pipe();
    let mut buf = uninit(5);
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut m = || {
            write_fd(w.as_fd(), b"12345");
            panic!("meanwhile failed");
        };
        e.read_full_while(r.as_fd(), 0, &mut buf, 1, &mut Meanwhile::new(&mut m))
    }));
    assert!(res.is_err(), "the panic went on up");
    assert_eq!(init(&buf), b"12345", "the read completed before the unwind");
    assert_eq!(e.counters().snapshot().ops_uring, 1);
    write_fd(w.as_fd(), b"abc");
    let mut buf = uninit(3);
    assert_eq!(e.read_full(r.as_fd(), 0, &mut buf, 1).unwrap(), 3);
    assert_eq!(init(&buf), b"abc");
}

/// On either engine `meanwhile` runs exactly once, also for an empty read and past the end
/// of the file, and the bytes are the file's.
#[test]
fn meanwhile_runs_once_on_both_engines() {
    for kind in [IoEngineKind::Uring, IoEngineKind::Sync] {
        let e = engine(kind, 4, 8);
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let (_d, f) = tmpfile("meanwhile", &data);
        for (offset, len, want) in
            [(0u64, 12_000usize, 12_000usize), (16_000, 8_000, 4_000), (30_000, 100, 0), (0, 0, 0)]
        {
            let mut ran = 0;
            let mut m = || ran += 1;
            let mut buf = uninit(len);
            let n = e.read_full_while(f.as_fd(), offset, &mut buf, 1, &mut Meanwhile::new(&mut m)).unwrap();
            assert_eq!((n, ran), (want, if len == 0 { 0 } else { 1 }), "{kind} at {offset}+{len}");
            let at = (offset as usize).min(data.len());
            assert_eq!(init(&buf[..n]), data[at..at + n]);
        }
    }
}

/// A short transfer from the kernel is resubmitted for the rest and counted, and the caller
/// gets every byte: a pipe holding 3 bytes answers a 6-byte read with 3 at its submission;
/// the other 3 arrive while it is in flight (written by `meanwhile`) and the resubmission
/// reads them.
#[test]
fn a_short_read_is_resubmitted_for_the_rest_and_counted() {
    let e = engine(IoEngineKind::Uring, 4, 8);
    let (r, w) = pipe();
    write_fd(w.as_fd(), b"abc");
    let mut m = || write_fd(w.as_fd(), b"def");
    let mut buf = uninit(6);
    let n = e.read_full_while(r.as_fd(), 0, &mut buf, 1, &mut Meanwhile::new(&mut m)).unwrap();
    assert_eq!((n, init(&buf).as_slice()), (6, &b"abcdef"[..]));
    let s = e.counters().snapshot();
    assert_eq!((s.short_retries, s.ops_uring), (1, 2), "{s:?}");
}
