//! The lender set changes while the mount runs: lenders join and leave, blocks follow
//! rendezvous placement, every read returns the disk's bytes, and a lender removed while hung
//! holds nothing up.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{backing, fill_all, read_all, wait, Lender, Proxy, SilentListener};
use farcache_engine::cached::CachedPath;
use farcache_engine::remote::{
    LenderError, LenderStatus, Remote, MIN_PUT_BOUND, PUT_REQUESTS_IN_FLIGHT, STANDING_INTERVAL,
};
use farcache_engine::{DataPath, DirectPath};
use farcache_policy::route::Threshold;
use farcache_testkit::pattern;

fn status(e: &CachedPath<DirectPath>, addr: SocketAddr) -> LenderStatus {
    e.remote().lenders().into_iter().find(|l| l.addr.addr == addr).expect("lender in the set")
}

/// Nobody listens on this port.
fn unused_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[test]
fn lenders_join_and_leave_and_reads_stay_exact() {
    const BLOCKS: usize = 512;
    let a = Lender::start("32MiB");
    let b = Lender::start("32MiB");
    // B behind a proxy, to see its connection close when it leaves.
    let b_proxy = Proxy::start(b.addr);
    let dir = tempfile::tempdir().unwrap();
    let mut data = pattern(BLOCKS * 4096, 11);
    let file = backing(&dir, &data);
    let e = common::engine(DirectPath::new(), vec![a.addr], Threshold::PAPER);
    wait("connection", || e.remote().connected() == 1);

    // One lender: every block lands on A.
    fill_all(&e, &file, &data);
    // (At least: a block refilled after a dropped fill may be stored twice.)
    assert!(status(&e, a.addr).puts >= BLOCKS as u64);

    // B joins. Rewrite the file, so that every block is cached anew under new keys and
    // placement over {A, B} decides where each lands.
    e.remote().add_lender(b_proxy.addr).unwrap();
    assert_eq!(e.remote().add_lender(b_proxy.addr), Err(LenderError::AlreadyPresent(b_proxy.addr.into())));
    wait("B connected", || e.remote().connected() == 2);
    assert_eq!(b_proxy.live(), 1);
    data = pattern(BLOCKS * 4096, 12);
    e.write(&file, 0, &data).unwrap();
    let a_before = status(&e, a.addr).puts;
    fill_all(&e, &file, &data);
    let on_b = status(&e, b_proxy.addr).puts;
    let on_a = status(&e, a.addr).puts - a_before;
    assert!((BLOCKS as u64 / 4..=3 * BLOCKS as u64 / 4).contains(&on_b), "B stored {on_b} of {BLOCKS}");
    assert!(on_a + on_b >= BLOCKS as u64, "A {on_a} + B {on_b}");

    // Both serve: a whole pass from the lenders.
    let before = e.stats();
    read_all(&e, &file, &data);
    let after = e.stats();
    assert_eq!(after.engine.remote_reads - before.engine.remote_reads, BLOCKS as u64);
    let b_hits = status(&e, b_proxy.addr).hits;
    assert!(b_hits >= on_b.min(BLOCKS as u64 / 4), "B served {b_hits}");

    // B leaves: its share misses once on A, is refilled there, and is served from A.
    e.remote().remove_lender(b_proxy.addr).unwrap();
    assert_eq!(e.remote().remove_lender(b_proxy.addr), Err(LenderError::NotPresent(b_proxy.addr.into())));
    assert_eq!(e.remote().lenders().iter().map(|l| l.addr.addr).collect::<Vec<_>>(), vec![a.addr]);
    wait("B's connection closed", || b_proxy.live() == 0);
    let before = e.stats();
    read_all(&e, &file, &data);
    let after = e.stats();
    let misses = after.remote.misses - before.remote.misses;
    assert!(misses > 0 && misses <= on_b, "{misses} misses after B left ({on_b} blocks were on B)");
    assert_eq!(after.engine.remote_reads - before.engine.remote_reads, BLOCKS as u64 - misses);
    fill_all(&e, &file, &data);
    let before = e.stats();
    read_all(&e, &file, &data);
    assert_eq!(e.stats().engine.remote_reads - before.engine.remote_reads, BLOCKS as u64);
    assert_eq!(e.stats().remote.rejected, 0);
}

#[test]
fn set_changes_are_checked_and_bounded() {
    let (x, y, z) = (unused_addr(), unused_addr(), unused_addr());
    let r = common::remote(vec![x], |c| c.max_lenders = 2);
    assert_eq!(r.add_lender(x), Err(LenderError::AlreadyPresent(x.into())));
    r.add_lender(y).unwrap();
    assert_eq!(r.add_lender(z), Err(LenderError::TooMany { addr: z.into(), max: 2 }));
    assert_eq!(r.remove_lender(z), Err(LenderError::NotPresent(z.into())));
    r.remove_lender(x).unwrap();
    r.add_lender(z).unwrap();
    let set: Vec<_> = r.lenders().into_iter().map(|l| (l.addr.addr, l.connected, l.instance_id)).collect();
    assert_eq!(set, vec![(y, false, 0), (z, false, 0)]);
    let e = LenderError::TooMany { addr: z.into(), max: 2 }.to_string();
    assert!(e.contains("max_lenders"), "{e}");

    // The initial set is checked the same way.
    let mut cfg = farcache_engine::remote::RemoteConfig::new(vec![x, y, x]);
    assert!(Remote::start(cfg.clone()).unwrap_err().to_string().contains("twice"));
    cfg.servers = vec![x.into(), y.into(), z.into()];
    cfg.max_lenders = 2;
    assert!(Remote::start(cfg).unwrap_err().to_string().contains("max_lenders"));
}

#[test]
fn a_hung_lender_removed_holds_nothing_up() {
    const BLOCKS: usize = 64;
    let fetch_timeout = Duration::from_secs(2);
    let a = Lender::start("16MiB");
    let b = Lender::start("16MiB");
    let hung = Proxy::start(b.addr);
    let silent = SilentListener::start();
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(BLOCKS * 4096, 13);
    let file = Arc::new(backing(&dir, &data));
    let remote = common::remote(vec![a.addr, hung.addr], |c| {
        c.fetch_timeout = fetch_timeout;
        c.connect_timeout = Duration::from_secs(30);
    });
    let e = Arc::new(CachedPath::new(DirectPath::new(), remote, Threshold::PAPER));
    wait("connections", || e.remote().connected() == 2);
    fill_all(&e, &file, &data);
    assert!(status(&e, hung.addr).puts > 0, "no block landed on the second lender");

    // A lender that accepts and never answers joins: its keeper waits in the handshake.
    // Its share of blocks are misses, at once (it is not connected).
    e.remote().add_lender(silent.addr).unwrap();
    wait("the silent lender's connection", || silent.accepted() == 1);
    let t = Instant::now();
    read_all(&e, &file, &data);
    assert!(t.elapsed() < fetch_timeout, "a pass with a silent lender took {:?}", t.elapsed());

    // B hangs with requests in flight; a reader waits on it.
    hung.freeze(true);
    let reader = {
        let (e, file, data) = (e.clone(), file.clone(), data.clone());
        std::thread::spawn(move || {
            let t = Instant::now();
            read_all(&e, &file, &data);
            t.elapsed()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    e.remote().remove_lender(hung.addr).unwrap();
    e.remote().remove_lender(silent.addr).unwrap();
    let took = t.elapsed();
    assert!(took < Duration::from_millis(100), "removing took {took:?}");
    // The waiting reader is released when the connection closes, not at fetch_timeout; every
    // read after that goes to A or the disk.
    let pass = reader.join().unwrap();
    assert!(pass < fetch_timeout, "the pass that met the hung lender took {pass:?}");
    assert!(e.remote().counters().snapshot().fallbacks >= 1, "the reader never waited on the hung lender");
    let t = Instant::now();
    read_all(&e, &file, &data);
    assert!(t.elapsed() < fetch_timeout, "a pass after the removal took {:?}", t.elapsed());
    assert_eq!(e.remote().lenders().len(), 1);

    // Both removed lenders' connections are closed: the silent one's at once, the hung one's
    // as soon as its lender reads again.
    wait("the silent lender's connection closed", || silent.closed() == 1);
    hung.freeze(false);
    wait("the hung lender's connection closed", || hung.live() == 0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(silent.accepted(), 1, "the removed lender's keeper reconnected");
}

/// The reverted first cut of per-block invalidation kept a written block's version: its
/// refill was stored under the same key as the old bytes, on the block's owner in the set of
/// the moment, while the old copy stayed on the lender that had left, and was named again
/// when that lender came back. A write must give the block a key never used for it before;
/// the blocks not written keep theirs (and are still served).
#[test]
fn a_written_block_refilled_elsewhere_is_never_named_on_its_old_lender() {
    const BLOCKS: usize = 256; // four chunks
    let a = Lender::start("32MiB");
    let b = Lender::start("32MiB");
    let dir = tempfile::tempdir().unwrap();
    let mut data = pattern(BLOCKS * 4096, 14);
    let file = backing(&dir, &data);
    let e = common::engine(DirectPath::new(), vec![a.addr, b.addr], Threshold::PAPER);
    wait("connections", || e.remote().connected() == 2);
    fill_all(&e, &file, &data);
    let on_b = status(&e, b.addr).puts;
    assert!(on_b >= BLOCKS as u64 / 4, "B stored {on_b} of {BLOCKS}");

    // B leaves, keeping the copies it holds (its memory is not touched, and deletions go to
    // the set of the moment, which B is not in).
    e.remote().remove_lender(b.addr).unwrap();
    // Every even block written, one page write each: each retires its own block only.
    let before = e.stats();
    for blk in (0..BLOCKS).step_by(2) {
        let new = pattern(4096, 1000 + blk as u64);
        e.write(&file, (blk * 4096) as u64, &new).unwrap();
        data[blk * 4096..(blk + 1) * 4096].copy_from_slice(&new);
    }
    assert_eq!(e.stats().remote.invalidations - before.remote.invalidations, BLOCKS as u64 / 2);
    assert_eq!(e.index().remote_blocks(), BLOCKS as u64 / 2, "the odd blocks stay reachable");

    // With B gone: the odd blocks A holds are hits under their old keys; everything else
    // (the written blocks, the odd blocks B held) is read from the disk and refilled on A.
    let before = e.stats();
    read_all(&e, &file, &data);
    let hits = e.stats().remote.hits - before.remote.hits;
    assert!(hits >= BLOCKS as u64 / 8, "only {hits} odd blocks served after the writes");
    fill_all(&e, &file, &data);

    // B comes back with every old copy it held. No read may return one of them.
    e.remote().add_lender(b.addr).unwrap();
    wait("B connected again", || e.remote().connected() == 2);
    read_all(&e, &file, &data);
    fill_all(&e, &file, &data);
    let before = e.stats();
    read_all(&e, &file, &data);
    let after = e.stats();
    assert_eq!(after.engine.remote_reads - before.engine.remote_reads, BLOCKS as u64);
    assert_eq!(after.remote.rejected, 0);
}

#[test]
fn reading_threads_fetch_on_connections_of_their_own_bounded_per_lender() {
    const BLOCKS: usize = 256;
    let a = Lender::start("32MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(BLOCKS * 4096, 21);
    let file = Arc::new(backing(&dir, &data));
    for limit in [0usize, 2] {
        let proxy = Proxy::start(a.addr);
        let remote = common::remote(vec![proxy.addr], |c| c.fetch_connections = limit);
        let e = Arc::new(CachedPath::new(DirectPath::new(), remote, Threshold::PAPER));
        wait("connection", || e.remote().connected() == 1);
        fill_all(&e, &file, &data);
        let hits_before = e.remote().counters().snapshot().hits;
        // Eight readers at once, three passes each: every byte right, whichever connection
        // answered.
        let readers: Vec<_> = (0..8)
            .map(|_| {
                let (e, file, data) = (e.clone(), file.clone(), data.clone());
                std::thread::spawn(move || {
                    for _ in 0..3 {
                        read_all(&e, &file, &data);
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        assert!(e.remote().counters().snapshot().hits > hits_before, "limit {limit}: no lender hit");
        // The main connection, plus at most `limit` fetch connections (made as reads needed
        // them), never more however many threads read.
        if limit > 0 {
            wait("fetch connections", || proxy.live() == 1 + limit);
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(proxy.live(), 1 + limit, "limit {limit}");
        // Removing the lender closes them all.
        e.remote().remove_lender(proxy.addr).unwrap();
        wait("all closed", || proxy.live() == 0);
    }
}

#[test]
fn a_reading_thread_polls_for_its_answer_only_when_told_to() {
    const BLOCKS: usize = 64;
    let a = Lender::start("32MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(BLOCKS * 4096, 22);
    let file = Arc::new(backing(&dir, &data));
    for poll in [Duration::ZERO, Duration::from_millis(1)] {
        let remote = common::remote(vec![a.addr], |c| {
            c.fetch_connections = 1;
            c.fetch_poll = poll;
        });
        let e = CachedPath::new(DirectPath::new(), remote, Threshold::PAPER);
        wait("connection", || e.remote().connected() == 1);
        fill_all(&e, &file, &data);
        // The first fetch finds no fetch connection and has one made for the next.
        read_all(&e, &file, &data);
        wait("fetch connection", || e.remote().counters().snapshot().fetch_connects == 1);
        for _ in 0..3 {
            read_all(&e, &file, &data);
        }
        let s = e.remote().counters().snapshot();
        assert!(s.hits >= BLOCKS as u64, "poll {poll:?}: {s:?}");
        // One reading thread: it polls where the machine has a CPU to spare for it.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if poll.is_zero() || cpus < 2 {
            assert_eq!(s.fetches_polled, 0, "no polling ({cpus} CPUs), yet answers counted as polled");
        } else {
            // A loopback answer takes tens of µs: within a millisecond of polling, most come
            // (asserting one keeps a loaded machine from failing it).
            assert!(s.fetches_polled >= 1, "polled for 1 ms, no answer came meanwhile: {s:?}");
            assert!(s.fetches_polled <= s.fetch_latency.count, "{s:?}");
        }
    }
}

/// A lender behind a [`Proxy`], an engine on it whose fill requests give up after 500 ms on
/// the link (fetch_timeout 100 ms, at no less than 500 ms), and a backing file of `blocks`.
struct BehindProxy {
    _lender: Lender,
    proxy: Proxy,
    e: CachedPath<DirectPath>,
    _dir: tempfile::TempDir,
    data: Vec<u8>,
    file: farcache_engine::BackingFile,
}

fn behind_proxy(blocks: usize, seed: u64) -> BehindProxy {
    behind_proxy_timing_out_at(blocks, seed, Duration::from_millis(100))
}

/// [`behind_proxy`] with requests timing out after `fetch_timeout` (fills' requests share
/// it, at least 500 ms).
fn behind_proxy_timing_out_at(blocks: usize, seed: u64, fetch_timeout: Duration) -> BehindProxy {
    behind_proxy_sized(blocks, seed, fetch_timeout, "16MiB")
}

/// [`behind_proxy_timing_out_at`] with a lender of `memory`.
fn behind_proxy_sized(blocks: usize, seed: u64, fetch_timeout: Duration, memory: &str) -> BehindProxy {
    let lender = Lender::start(memory);
    let proxy = Proxy::start(lender.addr);
    let remote = common::remote(vec![proxy.addr], |c| c.fetch_timeout = fetch_timeout);
    let e = CachedPath::new(DirectPath::new(), remote, Threshold::PAPER);
    wait("the connection", || e.remote().connected() == 1);
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(blocks * 4096, seed);
    let file = backing(&dir, &data);
    BehindProxy { _lender: lender, proxy, e, _dir: dir, data, file }
}

/// Fills sent to a lender that stops answering are given up at the request timeout: they
/// count as failed and give back their place in `max_pending_puts`, so a hung lender can
/// never leave the mount dropping every later fill. Once it answers again, fills land.
#[test]
fn fills_to_a_hung_lender_fail_at_the_timeout_and_free_their_places() {
    const BLOCKS: usize = 64;
    let BehindProxy { _lender, proxy: hung, e, _dir, data, file } = behind_proxy(BLOCKS, 23);

    hung.freeze(true);
    let t = Instant::now();
    read_all(&e, &file, &data);
    let reads_took = t.elapsed();
    let fills = e.counters().snapshot().fills;
    assert!(fills > 0, "no fill was sent");
    wait("the fills to the hung lender to settle", || common::fills_settled(&e));
    let r = e.remote().stats();
    // The proxy may pass on what it was reading when it froze: up to the requests the
    // outbox keeps on the link at once (seen: 10 blocks stored, a request and part of the
    // next in one read of the proxy's).
    let on_the_link = farcache_engine::remote::PUT_REQUEST_BLOCKS * PUT_REQUESTS_IN_FLIGHT;
    assert!(r.puts <= on_the_link as u64, "{r:?}");
    assert!(r.puts_failed > 0, "nothing was sent to the hung lender: {r:?}");
    assert_eq!(r.puts_in_flight, 0, "failed fills kept their places: {r:?}");
    // Each failed request holds its batch at most about one timeout (500 ms: the fills'
    // floor; two at a time, often fewer as the link is found dead): from the first read,
    // everything settles within the reads' time and one timeout per failed request, with
    // 100 ms of slack each and 500 ms more. (Under load the reads are slow and the fills
    // leave in more, smaller batches: a fixed 3 s after the reads was once exceeded in CI.)
    let requests = r.put_requests_failed;
    assert!(requests > 0, "no request failed: {r:?}");
    let bound = reads_took + Duration::from_millis(600) * requests as u32 + Duration::from_millis(500);
    assert!(t.elapsed() < bound, "the fills waited {:?} for {requests} failed requests", t.elapsed());

    hung.freeze(false);
    fill_all(&e, &file, &data);
    assert_eq!(e.remote().stats().puts_in_flight, 0);
    assert_eq!(e.index().remote_blocks(), BLOCKS as u64);
}

/// A burst of fills larger than the link takes at once is queued whole at the default bound
/// and lands when the lender takes it. A rate-limited disk answers a stream in bursts (a
/// blkio throttle releases a 100 ms slice at once) while the fills drain at the link's pace:
/// at the old bound of 2048 blocks a 1 GiB stream over 10 Gbit/s dropped 25–35% of its
/// fills, and the next pass read those blocks from the disk (BENCHMARKS.md, "Session 48").
/// Here the lender takes nothing while 24 MiB of disk reads complete.
#[test]
fn a_burst_of_fills_the_link_cannot_take_at_once_is_queued_whole() {
    const BLOCKS: usize = 6144;
    let defaults = farcache_engine::remote::RemoteConfig::new(Vec::<SocketAddr>::new());
    assert!(defaults.max_pending_puts >= BLOCKS, "{}", defaults.max_pending_puts);
    // A request on the link waits up to 5 s for its answer: longer than the reads take.
    let BehindProxy { _lender, proxy: held, e, _dir, data, file } =
        behind_proxy_sized(BLOCKS, 31, Duration::from_secs(5), "64MiB");

    held.freeze(true);
    read_all(&e, &file, &data);
    let during = e.remote().stats();
    held.freeze(false);
    assert_eq!(during.puts_dropped, 0, "fills dropped while the lender held them: {during:?}");
    assert_eq!(e.counters().snapshot().fills, BLOCKS as u64, "{during:?}");
    wait("the held fills to land", || common::fills_settled(&e));
    let r = e.remote().stats();
    assert_eq!((r.puts_dropped, r.puts_failed, r.puts_in_flight), (0, 0, 0), "{r:?}");
    assert_eq!(e.index().remote_blocks(), BLOCKS as u64, "{r:?}");
}

/// A lender that answers slowly still takes every fill: the timeout runs from the moment a
/// request is on the link, not from when its batch left the outbox, so the tail of a batch
/// waiting its turn behind PUT_REQUESTS_IN_FLIGHT slow requests is not failed. (Timed from
/// the batch, a batch that takes longer than the timeout lost its tail, and a loaded machine
/// filled nothing: CI of session 23.)
#[test]
fn a_slow_lender_takes_every_fill_at_its_own_pace() {
    const BLOCKS: usize = 256;
    let BehindProxy { _lender, proxy: slow, e, _dir, data, file } = behind_proxy(BLOCKS, 29);

    // 32 requests of 8 blocks, two at a time, each answer held 80 ms: about 1.3 s for the
    // batch, well past the 500 ms a single request may take.
    slow.slow(80);
    let t = Instant::now();
    read_all(&e, &file, &data);
    wait("the fills to the slow lender to settle", || common::fills_settled(&e));
    let took = t.elapsed();
    let r = e.remote().stats();
    assert_eq!(r.puts_failed, 0, "fills to a slow lender failed after {took:?}: {r:?}");
    assert_eq!(r.puts_dropped, 0, "{r:?}");
    assert_eq!(e.index().remote_blocks(), BLOCKS as u64, "{r:?}");
    assert!(took > Duration::from_millis(500), "the lender was not slow: the fills took {took:?}");
    assert_eq!(r.puts_in_flight, 0);
}

/// Behind a link slower than the disk's reads, the fills' queue stands: it is then held to
/// what the link carries in FILL_HORIZON (never under MIN_PUT_BOUND) instead of
/// `max_pending_puts` — the rest are dropped, as they would be at the bound anyway, and the
/// mount holds that much less memory. Blocks already queued still land, and once the link
/// keeps up again the whole bound comes back.
#[test]
fn a_standing_queue_of_fills_is_held_to_what_the_link_carries() {
    const BLOCKS: usize = 2048;
    let BehindProxy { _lender, proxy: slow, e, _dir, data, file } =
        behind_proxy_sized(BLOCKS, 37, Duration::from_secs(5), "64MiB");
    let max = e.remote().config().max_pending_puts as u64;
    assert!(max > 2 * BLOCKS as u64 && (MIN_PUT_BOUND as u64) < BLOCKS as u64 / 2, "max_pending_puts {max}");
    // A first burst while the lender takes nothing: no pace is measured, so it is queued
    // whole, however long it stands.
    slow.freeze(true);
    read_all(&e, &file, &data);
    let first = e.remote().stats();
    assert_eq!((first.puts_bound, first.puts_dropped), (max, 0), "{first:?}");
    assert_eq!(first.puts_in_flight, BLOCKS as u64, "{first:?}");
    // Then the link carries fills, slowly: each answer held 50 ms, two requests of 8 blocks
    // at a time, at most 320 blocks a second — 16 in the horizon, so the floor. Behind two
    // thousand fills every request waits long for its slot: the queue stands, and the bound
    // falls to the floor.
    slow.slow(50);
    slow.freeze(false);
    wait("the bound to fall to what the link carries", || e.remote().stats().puts_bound == MIN_PUT_BOUND as u64);
    // New blocks read while it stands are dropped, not queued (the disk has them).
    let data = pattern(BLOCKS * 4096, 38);
    e.write(&file, 0, &data).unwrap();
    read_all(&e, &file, &data);
    let standing = e.remote().stats();
    assert!(standing.puts_dropped > 0, "the second pass's fills were all queued: {standing:?}");
    assert!(standing.puts_in_flight <= BLOCKS as u64, "the queue grew past the bound: {standing:?}");
    // The link keeps up again: what was queued lands, and the whole bound comes back once
    // fills leave the queue within the target again (decided each interval).
    slow.slow(0);
    wait("the queued fills to land", || common::fills_settled(&e));
    let settled = e.remote().stats();
    assert_eq!((settled.puts_failed, settled.puts_in_flight), (0, 0), "{settled:?}");
    assert!(settled.puts >= BLOCKS as u64, "the first burst was stored: {settled:?}");
    let t = Instant::now();
    let mut seed = 39;
    while e.remote().stats().puts_bound != max {
        assert!(t.elapsed() < Duration::from_secs(20), "the bound stayed {:?}", e.remote().stats());
        seed += 1;
        let block = pattern(4096, seed);
        e.write(&file, 0, &block).unwrap();
        assert_eq!(&e.read(&file, 0, 4096).unwrap()[..], &block[..]);
        // Several requests an interval: fewer decide nothing.
        std::thread::sleep(STANDING_INTERVAL / 20);
    }
    assert_eq!(e.remote().stats().puts_failed, 0);
}

/// A block read from the disk again while its fill is still on its way is not sent a second
/// time (a read-around window read twice, several readers missing one block); once the fill
/// settles — stored, or failed at a hung lender — its key is free and a later miss fills
/// again. (Before, every such read sent the block again: up to four times under a slow
/// lender with read-around windows of four blocks.)
#[test]
fn a_block_read_again_while_its_fill_is_on_its_way_is_not_sent_twice() {
    const BLOCKS: usize = 8;
    // Requests may take 3 s (`fetch_timeout`, which fills' requests share, at least 500 ms):
    // a fill held 1 s by the proxy below still lands on a loaded machine, and the reads
    // meanwhile have a second to run.
    let BehindProxy { _lender, proxy, e, _dir, data, file } =
        behind_proxy_timing_out_at(BLOCKS, 31, Duration::from_secs(3));
    let block = |b: usize| &data[b * 4096..(b + 1) * 4096];

    // The lender's answers held 1 s: the first read's fill is on its way during the others.
    proxy.slow(1000);
    for _ in 0..3 {
        assert_eq!(&e.read(&file, 0, 4096).unwrap()[..], block(0));
    }
    let c = e.counters().snapshot();
    assert_eq!((c.fills, c.fills_pending_skipped), (1, 2), "{c:?}");
    assert_eq!(e.fills_pending(), 1);
    wait("the fill to settle", || common::fills_settled(&e));
    assert_eq!(e.fills_pending(), 0, "a stored fill keeps its key");
    assert_eq!(e.index().remote_blocks(), 1);

    // A fill that fails gives its key back. (The frozen proxy may still pass on the request
    // it was reading when it froze: the next block then.)
    proxy.slow(0);
    proxy.freeze(true);
    let failed = (1..BLOCKS)
        .find(|&b| {
            assert_eq!(&e.read(&file, b as u64 * 4096, 4096).unwrap()[..], block(b));
            wait("the fill to the hung lender to settle", || common::fills_settled(&e));
            e.remote().stats().puts_failed >= 1
        })
        .expect("no fill to the hung lender failed");
    assert_eq!(e.fills_pending(), 0, "a failed fill keeps its key");
    let before = e.counters().snapshot().fills;
    assert_eq!(&e.read(&file, failed as u64 * 4096, 4096).unwrap()[..], block(failed));
    assert_eq!(e.counters().snapshot().fills, before + 1, "the block was not filled again after its fill failed");
    proxy.freeze(false);
}
