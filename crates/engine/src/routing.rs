//! Where [`crate::cached::CachedPath`] sends a read: the routing rule and, for the adaptive
//! rule, the measurements it decides from.
//!
//! - [`Router::Threshold`] is paper 000's rule: a read of `n` blocks or more goes to the disk,
//!   a smaller one to the lenders. Nothing is measured.
//! - [`Router::Adaptive`] is the dynamic `n` the paper left as future work: each read goes
//!   where [`Adaptive`] expects it to finish sooner, from moving averages of what this mount
//!   measured — every disk read (timed, by size, sequential or not) and every fetch from the
//!   lenders (timed, by bytes; a fetch that gave up at `fetch_timeout` counts with the time it
//!   waited, so a hung lender looks as slow as it is).
//!
//! Sequential or not is decided per file by a [`Stream`] in a fixed table of
//! [`STREAM_SLOTS`] slots, indexed by a hash of the file's identity: bounded however many
//! files are read, and two files that share a slot only make each other look random.
//!
//! A rule that sends everything to the disk stops measuring the lenders, so a lender that
//! recovered would never be tried again: when the lenders have not been measured for
//! [`REMOTE_PROBE_INTERVAL`], the next read the rule sends to the disk whose blocks the
//! lenders hold all of goes to them instead (the engine checks its index, then claims the
//! probe). A probe also waits at least [`PROBE_COST_FACTOR`] times what the last fetch took,
//! so probing costs at most about 2% of the time however slow the lenders are (a hung lender
//! that takes 50 ms a fetch is probed every 2.5 s, not every 20 ms); at most 50 probes a
//! second, counted in the stats. While the disk has every random read, one in
//! [`SEED_EVERY`] of them still fills the lenders (a *seed*), so that they hold blocks to
//! be probed on. While the disk also keeps finding itself clearly faster, window after
//! window, the probes and seeds back off ([`QUIET_MAX_LEVEL`]): to one probe every 1.28 s
//! and one seed in 4,096 reads, until a window does not, or a probe and the hit estimate
//! it moves find the lenders clearly faster.
//!
//! The rule starts with every random read on the disk: the disk is the truth and the safe
//! first guess, and the lenders earn their share from what is measured. A disk slower than
//! a lender hit hands the reads over within a few windows (2 s from a busy cloud volume,
//! tested); a disk faster than one keeps them, and the lenders cost nothing but seeds (on a
//! disk faster than the lenders, filling them costs CPU and network for no later gain:
//! measured here on the host-cached virtual disk, a rule that started on the lenders and
//! filled every miss made the first pass of a random read 0.77× the passthrough's).
//!
//! Random reads are *shared* between the disk and the lenders, not switched: a share of
//! them, [`Measured::disk_share`], goes to the disk. Every [`WINDOW_TIME`] the random disk
//! reads of that window move it by one to eight [`WINDOW_STEP`]s (more the farther apart
//! the two sides are; one up from a share of 0, where the window held the disk's probes
//! alone, which an idle disk answers at its best): up if their mean time (weighted by
//! [`Measured::disk_weight`]) was below a lender hit's, down if above. The lender hit it is held
//! against is the moving mean of the one- and two-block fetches ([`REMOTE_HIT_WEIGHT`]),
//! fetches that wait behind fills on the link included: the fills go on whichever way the
//! reads are split (every read that touches the disk fills while the lenders have a share),
//! so what a read costs on each side now is what the split must equalize. (A low percentile
//! of the fetches, used before, made the lenders look faster than any read found them: on
//! the host-cached disk the rule kept 84% of the reads on lenders that were slower than the
//! disk.) A read sent to the lenders is a hit only as often as they hold its blocks
//! ([`Measured::held`], sampled on the reads of both sides); otherwise it is a disk read
//! after all, widened to its read-around window and filled. While the disk is less than
//! [`FILL_MARGIN`] times a hit, such a fill is not worth making, and the lenders' side of
//! the vote is the hit's time that often and the measured miss's time (weighted like a disk
//! read, and never less than the disk's read now, which a miss includes) the rest
//! ([`Measured::remote_route_us`]); above the margin a miss is an investment, and the hit
//! alone judges. Whether the disk's reads fill the lenders, and the
//! back-off below, go by the hit: that is what a fill buys. A fetch more than
//! [`TROUBLE_FACTOR`] times as slow as the disk, from lenders whose recent fetches are that
//! slow too (a lender in trouble, not one slow fetch), moves the share up one step, and a
//! fetch that fails (times out, or its connection breaks) hands every random read to the
//! disk at once. A disk faster than the lenders at any load (a host-cached virtual disk,
//! local NVMe) ends up with all of them; a rate-limited disk (a cloud volume's IOPS cap, a
//! blkio throttle) — fast while it has little to do, slow once it has all of them — gets
//! the share at which its reads take what a lender hit takes, and the lenders the rest: the
//! split that makes both finish soonest. Measured here, a throttled disk's reads took less
//! than a lender hit when the lenders had most of them and three times as long when it had
//! all of them; a rule that switched all random reads to whichever side looked faster
//! oscillated thousands of times a minute between the two. The share crosses its whole
//! range in 4 to 32 windows (2 to 16 s), and never flips.
//!
//! A lender hit counts [`Measured::fill_cost_factor`] times its time: more (up to 4×) while
//! writes through the mount retire most of what is filled, since a block filled and then
//! overwritten before anyone reads it was a PUT and a DEL for nothing (an update-heavy
//! database rewrites nearly every page it reads).
//!
//! A disk read counts [`DISK_WEIGHT`] times its time: it also spends an operation of the
//! disk's budget — which a cloud volume's IOPS cap, a throttled or shared disk, and the
//! application's own writes and fsyncs draw on — and a rate-limited disk at low queue depth
//! shows its cap in throughput, not in the latency of one read: measured here through the
//! mount, a disk capped at 3,000 IOPS answered each read in about what a lender hit took,
//! yet a pass served by the lenders took 2.4 times less time than one served by the disk.
//! A disk that is really faster than the lenders (a host-cached virtual disk, local NVMe:
//! 1.8× faster than a lender hit here) still gets every random read. That weight is for a
//! disk whose reads are measured to take longer the more of them it is asked for (and for
//! any disk until it has been seen at different rates); one whose reads take as long however
//! many counts [`FLAT_DISK_WEIGHT`] instead, and a tie with the lenders is its own: a read
//! the lenders serve costs the daemon more CPU and fills them, for nothing on such a disk
//! (`LoadFit`, the marginal cost of a disk read).
//!
//! While the disk's reads take more than [`FILL_MARGIN`] lender hits, the reads the disk
//! serves fill the lenders too (they are likely to be asked for those blocks next); so do
//! they while the lenders take part of the random reads, in proportion ([`FILL_SHARE`]):
//! every one while the lenders take at least half (a rate-limited disk at the share where
//! its reads take a hit), a part that falls with the disk's share above that, none once the
//! disk has every read. A disk that keeps every read and is about as fast as a hit fills
//! nothing but seeds (on a disk that fast the lenders' copies would cost CPU and network for
//! nothing). A read that fills reads its read-around window, but one in
//! [`READ_AROUND_CONTROL_EVERY`] is read as asked, and only reads as asked vote: a window
//! is the fill's investment, not what serving the read from the disk costs.
//!
//! Sequential reads are decided whole, with hysteresis: a stream goes where it is expected
//! to finish sooner (the lenders only on a link faster than the disk's stream), and changes
//! side only when the other is faster by more than [`HYSTERESIS`]; every change is counted.
//! Each side is judged for streams by its cost per byte at its own load (`StreamCost`), not
//! by the size classes random reads use. The lenders are measured for streams on a clock of
//! their own (random hits say nothing about a stream's rate): while streams are on the disk,
//! one read in [`SEED_EVERY`] fills the lenders (a stream seed, `RouterState::stream_seeds`)
//! until the seeds kept hold [`STREAM_SEED_RESERVE`] (again once a probe finds some lost),
//! and when a stream probe is due the engine fetches the last seeds back (at least
//! [`STREAM_PROBE_MIN_BYTES`]) and times it — on the reading thread once the read it was
//! offered on is answered from the disk (`DataPath::after_reply`: the FUSE reply is sent
//! first, so the probe's fetch is not part of any read's time), bounded like every probe.
//! A stream reads each offset once a pass, so a probe that waited for a read of blocks the
//! lenders hold would wait for the next pass (and, with seeds falling on the same offsets
//! each pass, for ever: measured, a 10 Gbit/s link was never probed in three passes). Probes
//! must find the lenders [`STREAM_PROBE_MARGIN`] times faster; a side change holds
//! [`STREAM_DWELL`]. No stream is probed before the disk's first stream window closes, and
//! while the disk's windows keep finding it clearly faster than the probes, the probes and
//! the stream seeds back off ([`STREAM_QUIET_MAX_LEVEL`]), like the random ones.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use farcache_policy::route::{Adaptive, Route, Stream, Threshold};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::data_path::ReadTime;
use crate::identity::FileId;

/// Reads of at least this many bytes are a stream's (readahead), sequential or not: paper
/// 000's n = 32 blocks.
pub const STREAM_MIN_BYTES: u64 = 128 << 10;
/// Slots of the per-file stream table.
pub const STREAM_SLOTS: usize = 512;
/// The lenders are probed when they have not been measured for this long.
pub const REMOTE_PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// A probe waits at least this many times the last measurement of its side.
pub const PROBE_COST_FACTOR: u64 = 50;
/// The disk is probed when it has no share and has not been measured for this long.
pub const DISK_PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// Lenders whose recent fetches ([`TROUBLE_WEIGHT`]) take this many times the disk's read
/// (weighted) are in trouble, and each such fetch moves the share one step at once; below it
/// only the disk's windows do (a fetch waiting behind fills on a busy 1 Gbit/s link took 3
/// to 7 times a throttled disk's mean read, measured here, and that passes with the fills).
/// A fetch that fails moves it all the way, whatever it took.
pub const TROUBLE_FACTOR: f64 = 8.0;
/// The weight of each fetch in the recent mean that [`TROUBLE_FACTOR`] judges: a lender in
/// trouble is slow fetch after fetch, and one that hangs (50 ms) is there at its first
/// fetch (one fetch past about four times [`TROUBLE_FACTOR`] moves the mean past it at
/// once); a lone fetch that is merely slow is the machine. Judged fetch by fetch, the few
/// fetches of a healthy lender that a busy 2-CPU machine held past 1 ms (0.46% of them,
/// measured in a cloud randread pass) moved the share up a step each, dozens a second,
/// against windows that found the disk 1.5–3 times slower: the disk kept 0–68% of the
/// second pass's reads, swinging second to second.
pub const TROUBLE_WEIGHT: f64 = 0.25;
/// A random disk read counts this many times its time against a lender hit on a disk whose
/// reads are measured to slow down as it is asked for more of them (a rate-limited one), and
/// before anything says otherwise (see the module doc and [`LoadFit`]).
pub const DISK_WEIGHT: f64 = 1.1;
/// ... and this many times on a disk whose reads take as long however many it is asked for
/// (a fast local disk, a host-cached one): a tie between such a disk and the lenders is the disk's.
/// A read the lenders serve costs the mount's daemon more CPU than a disk read (measured in
/// a TPC-H power test on the raw disk: 1.8 times as much a read in the queries where the
/// lenders took reads, whose hits took what the disk's reads took, 78 µs) and fills them on
/// the way; on such a disk it saves nothing to pay for that.
pub const FLAT_DISK_WEIGHT: f64 = 1.0 / (1.0 + HYSTERESIS);
/// The weight of each closed window in [`LoadFit`]'s moving sums: the fit remembers about
/// this many windows' worth (1 / weight; 8 s at [`WINDOW_TIME`]).
pub const LOAD_FIT_WEIGHT: f64 = 1.0 / 16.0;
/// The spread of the windows' disk read rates (their standard deviation over their mean)
/// that [`LoadFit`] must see before it believes their slope: around a steady share the
/// windows differ by a step or two ([`WINDOW_STEP`], 3% of the reads) and their means by
/// noise, a slope of nothing.
pub const LOAD_FIT_MIN_SPREAD: f64 = 0.08;
/// A disk read that fills the lenders reads its whole read-around window (`cache.read_around`)
/// — except one in this many, read as asked: the *control* reads. Only reads as asked vote
/// on the disk's share and on whether filling is worth it; a widened read tells the model
/// what its own size costs and nothing else. A window costs more than the read it widens
/// (measured on this machine's raw disk: 16 KiB 460 µs against 186 µs for 4 KiB, under
/// load), and counted as the asked read's cost, it made the disk look slower for as long as
/// the rule was filling — which kept it filling: once a slow moment of the disk started the
/// fills, they went on after the disk was fast again (raw disk, randread 1 GiB: 172,000–
/// 233,000 blocks filled in a pass, 0.44–0.69× the passthrough; with read-around off 2,900–
/// 38,600 and 0.91–1.58×; BENCHMARKS.md, "Session 21").
pub const READ_AROUND_CONTROL_EVERY: u64 = 8;
const _: () = assert!(READ_AROUND_CONTROL_EVERY >= 2);
/// Random disk reads vote on the share in windows of this long (and at least
/// [`WINDOW_MIN_READS`] reads), with the window's mean: a throttled disk answers most reads
/// at once and stalls a few for tens of ms (measured here at 3,000 IOPS: p50 79 µs, one read
/// in 300 stalled about 60 ms, mean 275 µs; blkio throttles in 100 ms slices), so only a
/// mean over several slices says what its reads cost.
pub const WINDOW_TIME: Duration = Duration::from_millis(500);
pub const WINDOW_MIN_READS: u32 = 8;
/// How far one window's vote moves the share at least (1/32 of the range); a window whose
/// mean is far from a lender hit's moves it up to 8 times as far.
pub const WINDOW_STEP: u64 = SHARE_ONE / 32;
const BLOCK: u64 = 4096;
/// The weight of each one- or two-block fetch in the lenders' hit estimate (a moving mean:
/// fetches that wait behind fills count, since what a read costs now is what the split
/// must equalize).
pub const REMOTE_HIT_WEIGHT: f64 = 0.02;
/// The weight of each one- or two-block fetch while the disk has every random read: then
/// the only fetches are probes, a few a second at most, and each says what a lender costs
/// now. At [`REMOTE_HIT_WEIGHT`] a lender whose estimate a failed fetch had raised to the
/// failure's time (38 ms, measured in a TPC-H run) took about 240 probes to be trusted
/// again, minutes in which every random read went to a disk at its IOPS cap; at this
/// weight, seven.
pub const PROBE_HIT_WEIGHT: f64 = 0.5;
/// Random reads the disk serves fill the lenders only while the disk's mean read takes this
/// many times a lender hit: filling costs CPU and link on both ends, and pays back only
/// where a later hit saves more than that (see the module doc).
pub const FILL_MARGIN: f64 = 1.5;
/// The disk's random reads fill the lenders too while its share of them is at most this
/// (in 1/[`SHARE_ONE`]), whatever their time: the lenders take at least as many random reads
/// as the disk, so a block the disk serves now is asked of them next time at least as often
/// as not, and unfilled it is a miss there. A rate-limited disk at the share where its reads
/// take a lender hit (the split the rule aims for) is under [`FILL_MARGIN`] by design, and
/// judged by the margin alone it filled none of that share: measured on the cloud volume
/// (BENCHMARKS.md, "Session 46"), first passes whose share sat at a fifth to a half of the
/// reads for seconds left 4.5–10.7% of a 1 GiB file out of the lenders, against 2.5–3.7% in
/// those whose share went to 0, and their warm passes found the blocks of 1,900–6,500 reads
/// missing there, against 400–1,300. Above this share a part of the disk's reads fills,
/// twice the lenders' part of the reads (all at this share, none at [`SHARE_ONE`]), spread
/// evenly ([`Measured::share_fill`]): a disk that keeps most reads under the margin (a
/// disk about as fast as a hit at full load, or a busy machine's slow hits) otherwise left
/// its blocks out of lenders that still took part of the reads, which then missed, and their
/// misses, weighed below the margin, kept the share up — a first pass judged by what being
/// cold costs (modelled in `a_cold_first_pass_fills_the_lenders_as_they_will_be_asked`:
/// filling only at this share or below left a tenth of a file out; measured on the cloud
/// volume, one first pass kept more than half of the reads on a slow disk and left 11.8%).
/// A disk with every read fills by the margin (and seeds).
pub const FILL_SHARE: u64 = SHARE_ONE / 2;
/// While the disk's reads are not worth filling, one in this many of them still fills the lenders
/// (a *seed*), so that the lenders hold blocks a probe can measure them on: without it a
/// rule that started on the disk could never learn that the lenders became faster.
pub const SEED_EVERY: u64 = 64;
/// While the disk keeps every random read and each of its windows finds it clearly faster
/// than a lender hit, the lenders' random probes and seeds *back off*: each such window
/// doubles the probe interval and the seeds' spacing, up to this many doublings (from one
/// probe every [`REMOTE_PROBE_INTERVAL`] and one seed in [`SEED_EVERY`] disk reads to one
/// probe every 1.28 s and one seed in 4,096). The first window that does not clearly favour
/// the disk ends the back-off at once, and so does a probe that, with the hit estimate it
/// moves, clearly favours the lenders (not one fast probe among slow ones, nor one within
/// [`HYSTERESIS`] of the disk: see `RouterState::remote_fetch`). On a disk as fast as a
/// lender hit (the host-cached virtual disk) the seeds and probes were the mount's whole
/// lender traffic, and cost 5–10% of the CPU per transaction for nothing (measured: pgbench
/// select-only at one client).
pub const QUIET_MAX_LEVEL: u64 = 6;
/// The weight of each random read in [`Measured::held`], the moving share of random reads
/// whose blocks the lenders hold (sampled, see [`HELD_SAMPLE_EVERY`]).
pub const HELD_WEIGHT: f64 = 0.02;
/// One random read in this many that the rule sends to the disk asks the index whether the
/// lenders hold its blocks (a read sent to the lenders always finds out): what
/// [`Measured::held`] learns from while the disk has every read.
pub const HELD_SAMPLE_EVERY: u64 = 16;
/// The weight of each lender miss's time in [`Measured::miss_us`].
pub const MISS_WEIGHT: f64 = 0.05;
/// Fills that writes retire: the share of filled blocks that a write through the mount
/// replaces while the lenders still hold them is measured in windows of at least this many
/// fills and [`SURVIVAL_WINDOW`] (see [`Measured::fill_cost_factor`]).
pub const SURVIVAL_MIN_FILLS: u64 = 64;
pub const SURVIVAL_WINDOW: Duration = Duration::from_secs(2);
/// Each closed window moves the survival estimate this far towards what it measured.
pub const SURVIVAL_WEIGHT: f64 = 0.5;
/// The survival below which the lenders' hit counts no dearer: at most `1 / SURVIVAL_FLOOR`
/// times its time.
pub const SURVIVAL_FLOOR: f64 = 0.25;
/// [`Measured::disk_share`] of all random reads.
pub const SHARE_ONE: u64 = 1024;
/// The other side must be expected faster by this fraction before the rule switches to it.
pub const HYSTERESIS: f64 = 0.1;
/// A stream probe fetches the blocks of up to this many of the last stream seeds at once.
pub const STREAM_PROBE_SEEDS: usize = 8;
/// A stream probe counts only if it fetched at least this much: a shaped link's burst (a
/// token bucket's, an emulated link's) lets a lone 128 KiB fetch through at the wire's
/// speed, not the link's rate — measured here, 541 µs on a 1 Gbit/s TBF link with a 256 KiB
/// bucket, where the rate alone takes 1,049 µs.
pub const STREAM_PROBE_MIN_BYTES: u64 = 1 << 20;
/// Streams stop seeding the lenders once the seeds kept for probes hold this many bytes (two
/// probes' worth: one seed the lenders lose does not leave the next probe short), or fill all
/// [`STREAM_PROBE_SEEDS`] slots; they seed again when a probe finds seeds lost
/// ([`RouterState::stream_seeds_lost`]). A probe fetches the same seeds each time: one in
/// [`SEED_EVERY`] reads of every stream was 16 MiB sent and stored a GiB streamed, where a
/// probe needs 1 MiB (measured on the raw disk: the daemon's CPU 18% above the passthrough's
/// in a 1 GiB first pass; BENCHMARKS.md, "Session 54").
pub const STREAM_SEED_RESERVE: u64 = 2 * STREAM_PROBE_MIN_BYTES;
/// A seed a probe does not find on the lenders is forgotten only once it is this old: a
/// younger one may still be on its way (its fill queued, or answered after the probe's GET).
pub const STREAM_SEED_GRACE: Duration = Duration::from_secs(2);
/// A probe (a fetch alone, at no load) must find the lenders this many times faster than the
/// disk at its load before streams move to them; on the lenders their own fetches judge them.
pub const STREAM_PROBE_MARGIN: f64 = 1.5;
/// Lenders whose own stream fetches measured them slower than their probes are judged by
/// those fetches for this long after the last of them (then the probes may try them again).
pub const STREAM_RETRY: Duration = Duration::from_secs(30);
/// A stream cost window closes after at least this many reads (and [`WINDOW_TIME`]).
pub const STREAM_WINDOW_READS: u32 = 8;
/// Streams stay on a side at least this long after changing to it (at most one change a
/// second, however noisy the two sides' measurements).
pub const STREAM_DWELL: Duration = Duration::from_secs(1);
/// While streams are on the disk and each window of theirs finds the disk clearly faster
/// than the lenders' last stream probes (with [`STREAM_PROBE_MARGIN`]), the stream probes and
/// seeds *back off*: each such window doubles the wait between stream probes (the whole
/// wait, [`PROBE_COST_FACTOR`] times the last probe's cost included) and the stream seeds'
/// spacing, up to this many doublings; a window or a probe that does not clearly favour the
/// disk ends it at once. A stream probe delays the read it rides on by all of its fetch
/// (1 MiB on a 1 Gbit/s link: 8 to 9 ms), and on the raw disk, whose stream is eight times the
/// link's rate, the probes and seeds were all the lender traffic of a pass, for nothing
/// (measured: a 256 MiB pass of 0.24 s paid a 1 MiB probe and 4 MiB of seeds, 0.95× the
/// passthrough; BENCHMARKS.md, "Session 42"). Nor is a stream probed before the disk's first
/// stream window has closed: until then there is nothing to hold a probe against.
pub const STREAM_QUIET_MAX_LEVEL: u64 = 6;
const _: () = assert!(STREAM_SLOTS.is_power_of_two());
const _: () = assert!(HYSTERESIS > 0.0 && HYSTERESIS < 0.5);
const _: () = assert!(WINDOW_STEP > 0 && WINDOW_MIN_READS > 0);
const _: () = assert!(DISK_WEIGHT >= 1.0 && FLAT_DISK_WEIGHT < 1.0);
const _: () = assert!(LOAD_FIT_WEIGHT > 0.0 && LOAD_FIT_WEIGHT < 1.0 && LOAD_FIT_MIN_SPREAD > 0.0);
const _: () = assert!(SEED_EVERY >= 16);
const _: () = assert!(STREAM_SEED_RESERVE >= STREAM_PROBE_MIN_BYTES);
const _: () = assert!(QUIET_MAX_LEVEL <= 10 && STREAM_QUIET_MAX_LEVEL <= 10);
const _: () = assert!(FILL_MARGIN >= DISK_WEIGHT);

/// Whether the stream seeds kept hold enough for probes ([`STREAM_SEED_RESERVE`]).
fn seeds_enough(seeds: &std::collections::VecDeque<(FileId, u64, u64, u64)>) -> bool {
    seeds.len() >= STREAM_PROBE_SEEDS
        || seeds.iter().map(|&(_, first, last, _)| (last - first + 1) * BLOCK).sum::<u64>() >= STREAM_SEED_RESERVE
}

/// The routing rule a [`crate::cached::CachedPath`] is built with (once per mount: the
/// adaptive rule's measurement table makes that variant large, which costs nothing here).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
pub enum Router {
    /// Paper 000's fixed threshold.
    Threshold(Threshold),
    /// Per read, from measured costs; starts from the model's prior.
    Adaptive(Adaptive),
}

impl From<Threshold> for Router {
    fn from(t: Threshold) -> Router {
        Router::Threshold(t)
    }
}

impl From<Adaptive> for Router {
    fn from(a: Adaptive) -> Router {
        Router::Adaptive(a)
    }
}

impl Router {
    /// The name of the rule in configuration and stats: "threshold" or "adaptive".
    pub fn mode(&self) -> &'static str {
        match self {
            Router::Threshold(_) => "threshold",
            Router::Adaptive(_) => "adaptive",
        }
    }
}

/// Whether this one of a run of events is among the `part` (in 1/[`SHARE_ONE`], at most
/// `SHARE_ONE`) picked from it, spread evenly: each event adds `part` to the accumulator
/// `acc` (always below `SHARE_ONE`), and one that fills it is picked. `part` 0 and
/// `SHARE_ONE` (the shares a rule sits at most of the time) are answered without touching
/// `acc`, which every reading thread shares.
fn spread(acc: &AtomicU64, part: u64) -> bool {
    if part == 0 || part >= SHARE_ONE {
        return part != 0;
    }
    let mut picked = false;
    let _ = acc.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
        let a = a + part;
        picked = a >= SHARE_ONE;
        Some(if picked { a - SHARE_ONE } else { a })
    });
    picked
}

/// Move the moving mean of times in `mean` (`f64` bits) towards `x` by `weight`, and return
/// it; one still 0 (none yet) takes `x` itself.
fn ewma(mean: &AtomicU64, x: f64, weight: f64) -> f64 {
    let mut now = x;
    let _ = mean.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        let was = f64::from_bits(v);
        now = if was == 0.0 { x } else { was + weight * (x - was) };
        Some(now.to_bits())
    });
    now
}

/// Whether the disk, at `disk_us` a read (weighted), is clearly faster than the lenders at
/// `remote_us`: by more than [`HYSTERESIS`]. No disk measurement yet (0) is not.
fn clearly_faster(disk_us: f64, remote_us: f64) -> bool {
    disk_us > 0.0 && disk_us * (1.0 + HYSTERESIS) < remote_us
}

fn one() -> f64 {
    1.0
}

fn disk_weight_default() -> f64 {
    DISK_WEIGHT
}

/// What the adaptive rule believes now (the model's moving averages) and how many
/// measurements it has taken.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveEstimates {
    /// Access time of a non-sequential disk read.
    pub disk_access_us: f64,
    /// Sequential disk throughput.
    pub disk_bytes_per_us: f64,
    /// Round trip of a small fetch from the lenders.
    pub remote_access_us: f64,
    /// Throughput of larger fetches beyond the round trip.
    pub remote_bytes_per_us: f64,
    /// Disk reads measured.
    pub disk_samples: u64,
    /// Fetches from the lenders measured.
    pub remote_samples: u64,
    /// Times the rule changed sides for sequential reads.
    #[serde(default)]
    pub switches: u64,
    /// The share of random reads the rule sends to the disk now, 0 to 1.
    #[serde(default)]
    pub disk_share: f64,
    /// Reads sent to the disk while it had no share, to measure it.
    #[serde(default)]
    pub disk_probes: u64,
    /// Doublings of the lenders' probe interval and seed spacing now (0 to
    /// [`QUIET_MAX_LEVEL`]): the disk has every random read and keeps finding itself faster.
    #[serde(default)]
    pub probe_backoff: u64,
    /// Times a back-off in force was ended: by a window of the disk's reads that did not
    /// find it clearly faster (the disk got busy), and by a probe that, with the hit
    /// estimate it moved, found the lenders clearly faster than the disk's last window (the
    /// lenders may win now).
    #[serde(default)]
    pub backoff_ends: [u64; 2],
    /// Doublings of the wait between stream probes and of the stream seeds' spacing now (0
    /// to [`STREAM_QUIET_MAX_LEVEL`]): streams are on the disk and it keeps finding itself
    /// clearly faster than the lenders' stream probes.
    #[serde(default)]
    pub stream_probe_backoff: u64,
    /// The mean of the last window of random disk reads, µs (0: none yet).
    #[serde(default)]
    pub disk_window_mean_us: f64,
    /// A one- or two-block lender hit, the moving mean, µs.
    #[serde(default)]
    pub remote_hit_us: f64,
    /// What a random disk read counts against a lender hit, times its time:
    /// [`DISK_WEIGHT`] on a disk whose reads slow down as it is asked for more of them (and
    /// until the rule has seen it at different rates), down to [`FLAT_DISK_WEIGHT`] on one
    /// whose reads take as long however many (see `LoadFit`).
    #[serde(default = "disk_weight_default")]
    pub disk_weight: f64,
    /// The last window's disk time over what the lenders would have taken for the same
    /// reads (0: no window yet); the disk's reads fill the lenders while it is above
    /// [`FILL_MARGIN`] (and in proportion to the lenders' part of the reads, see
    /// [`FILL_SHARE`]).
    #[serde(default)]
    pub disk_over_remote: f64,
    /// The moving share of random reads whose blocks the lenders held, 0 to 1 (sampled): a
    /// read sent to them is a hit this often, a disk read with a fill otherwise, and the
    /// share weighs both.
    #[serde(default = "one")]
    pub lenders_held: f64,
    /// What a random read sent to the lenders that they did not hold took (the disk's read,
    /// its read-around window included, and the fill), the moving mean, µs (0: none yet).
    #[serde(default)]
    pub lender_miss_us: f64,
    /// The moving share of filled blocks that writes through the mount did not retire
    /// while the lenders held them, 0 to 1: a lender hit counts `1 / max(this, 0.25)`
    /// times its time against the disk's reads.
    #[serde(default = "one")]
    pub fills_surviving: f64,
    /// What each size of read measured: `[bytes, disk random µs, disk sequential µs,
    /// lenders µs]` (-1: not measured).
    #[serde(default)]
    pub classes: Vec<[f64; 4]>,
    /// What stream reads cost, µs per MiB: `[disk at its load, lenders at theirs, lenders'
    /// probes]` (0: not measured).
    #[serde(default)]
    pub stream_us_per_mib: [f64; 3],
    /// Where sequential reads go now: true = the lenders.
    #[serde(default)]
    pub stream_remote: bool,
}

/// One read's route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    pub route: Route,
    /// Decided by the adaptive rule (else by the threshold).
    pub adaptive: bool,
    /// The read continues its file's stream (adaptive rule only; `false` otherwise).
    pub sequential: bool,
    /// The read goes to the other side than the rule chose, to measure it: to the lenders
    /// (`route` is `Remote`; only if they hold all of its blocks, else it goes to the disk
    /// as the rule said), or to the disk (`route` is `Disk`).
    pub probe: bool,
    /// A random read the rule sends to the disk while its reads take more than
    /// [`FILL_MARGIN`] lender hits, or one of the part of them the lenders' share of the reads
    /// calls for ([`FILL_SHARE`]), or a seed ([`SEED_EVERY`]): the disk's blocks fill the
    /// lenders too.
    pub fill: bool,
    /// The fill is a seed, there only for the probes (random reads' [`SEED_EVERY`], a
    /// stream's): its blocks may wait for company on their way (`outbox::SEED_WINDOW`).
    pub seed: bool,
    /// The read goes to the disk, and the lenders are due a measurement: if they hold all
    /// of its blocks and [`RouterState::claim_remote_probe`] says yes, it is fetched from
    /// them instead (then `route` becomes `Remote` and `probe` true).
    pub may_probe_remote: bool,
}

impl Decision {
    /// Where the rule itself sent the read (before any probe).
    pub fn chosen(&self) -> Route {
        match (self.route, self.probe) {
            (r, false) => r,
            (Route::Remote, true) => Route::Disk,
            (Route::Disk, true) => Route::Remote,
        }
    }
}

/// What stream reads cost one side, in µs per byte at the side's own load: each read's time
/// divided by the stream reads in flight on its side when it started (by Little's law, the
/// time the side takes per read at that load), summed over windows of at least
/// [`STREAM_WINDOW_READS`] reads and [`WINDOW_TIME`], each window's cost per byte moving the
/// estimate halfway.
///
/// Why not a moving mean of each read's time, as for random reads: a throttled disk answers
/// most of a stream's reads at once and holds one for the rest of its slice (measured here:
/// 128 KiB reads at 0.3 ms and, a few times a second, 15–30 ms), so one stall moved the mean
/// ten times past the disk's real cost; and reads at different loads do not compare (the
/// disk carrying a stream against lenders idle, and the other way round): streams changed
/// sides every second. The window mean is the real cost, and the side not carrying the
/// stream keeps the estimate it had when it did — except the lenders' probes, fetched alone:
/// a lender's cost at load is at most its cost alone, so a probe is the safe side of it.
#[derive(Clone, Copy, Debug)]
struct StreamCost {
    sum_us: f64,
    bytes: u64,
    reads: u32,
    /// When the window opened, µs after `born`.
    start_us: u64,
    /// The estimate: µs per byte (0: not measured yet).
    per_byte_us: f64,
    /// When a window last closed, µs after `born`.
    closed_us: u64,
}

impl StreamCost {
    fn new() -> StreamCost {
        StreamCost { sum_us: 0.0, bytes: 0, reads: 0, start_us: 0, per_byte_us: 0.0, closed_us: 0 }
    }

    /// A read of `len` bytes that cost `us` at its load and took `took_us`, ending at `now`.
    /// True if it closed a window (the estimate moved).
    fn add(&mut self, len: u64, us: f64, now: u64, took_us: f64) -> bool {
        if len == 0 || !us.is_finite() {
            return false;
        }
        if self.reads == 0 {
            self.start_us = now.saturating_sub(took_us as u64);
        }
        self.sum_us += us;
        self.bytes += len;
        self.reads += 1;
        if self.reads >= STREAM_WINDOW_READS && now.saturating_sub(self.start_us) >= WINDOW_TIME.as_micros() as u64 {
            let cost = self.sum_us / self.bytes as f64;
            self.per_byte_us = if self.per_byte_us > 0.0 { (self.per_byte_us + cost) / 2.0 } else { cost };
            *self = StreamCost { per_byte_us: self.per_byte_us, closed_us: now, ..StreamCost::new() };
            return true;
        }
        false
    }
}

/// What streams cost: each side's reads at its load (`[0]` the disk, `[1]` the lenders),
/// and the lenders' stream probes (µs per byte, each probe moving it halfway; 0: none yet).
struct StreamCosts {
    side: [StreamCost; 2],
    probe_per_byte_us: f64,
}

impl StreamCosts {
    /// Whether the disk's streams are clearly faster than the lenders' stream probes say the
    /// lenders would be (with [`STREAM_PROBE_MARGIN`]): what [`STREAM_QUIET_MAX_LEVEL`]'s
    /// back-off holds on. Not without both measurements.
    fn disk_clearly_faster(&self) -> bool {
        self.probe_per_byte_us > 0.0
            && clearly_faster(self.side[0].per_byte_us, self.probe_per_byte_us * STREAM_PROBE_MARGIN)
    }
}

/// A stream read in flight on one side (`RouterState::stream_begin`).
pub struct StreamRead<'a> {
    busy: &'a AtomicU64,
    /// Stream reads in flight on its side when it started, itself included.
    in_flight: u64,
    remote: bool,
    /// A probe's fetch, not a read's.
    probe: bool,
}

impl Drop for StreamRead<'_> {
    fn drop(&mut self) {
        self.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The routing rule with its state.
pub(crate) enum RouterState {
    Threshold(Threshold),
    Adaptive(Box<Measured>),
}

pub(crate) struct Measured {
    model: Mutex<Adaptive>,
    streams: Streams,
    disk_samples: AtomicU64,
    remote_samples: AtomicU64,
    /// The side chosen last for sequential reads: true = lenders.
    stream_remote: AtomicBool,
    /// The share of random reads sent to the disk, in 1/[`SHARE_ONE`].
    disk_share: AtomicU64,
    /// The random disk reads of the window being measured.
    disk_window: Mutex<Window>,
    /// Time tests skip ahead by (always 0 outside them).
    skipped_us: AtomicU64,
    /// Tests that simulate all of the time: the clock is `skipped_us` alone, so that their
    /// outcome does not depend on how fast the machine runs them.
    #[cfg(test)]
    virtual_clock: AtomicBool,
    /// The mean of the last closed window, in µs (`f64` bits; 0: none yet).
    disk_mean_us: AtomicU64,
    /// How the disk's window means move with its read rate.
    load_fit: Mutex<LoadFit>,
    /// What a disk read counts against the lenders, times its time (`f64` bits): between
    /// [`FLAT_DISK_WEIGHT`] and [`DISK_WEIGHT`], from [`LoadFit`].
    disk_weight: AtomicU64,
    /// The last closed window's disk time over the lenders' expected time for the same
    /// reads (`f64` bits; 0: none yet).
    disk_over_remote: AtomicU64,
    /// A lender hit of one or two blocks: the moving mean of such fetches, weight
    /// [`REMOTE_HIT_WEIGHT`] (`f64` bits; 0: none yet).
    remote_hit_us: AtomicU64,
    /// The recent mean of every fetch's time, weight [`TROUBLE_WEIGHT`] (`f64` bits; 0: none
    /// yet): what [`TROUBLE_FACTOR`] judges.
    remote_recent_us: AtomicU64,
    /// The moving share of random reads whose blocks the lenders hold, weight
    /// [`HELD_WEIGHT`] (`f64` bits; 1 at start): a read the rule sends to the lenders is a
    /// hit this often, and a disk read (with its read-around and fill) otherwise.
    held: AtomicU64,
    /// What a random read sent to the lenders that they did not hold took — the disk's read
    /// of it (read-around window included) and its fill — moving mean, weight
    /// [`MISS_WEIGHT`] (`f64` bits; 0: none yet).
    miss_us: AtomicU64,
    /// Random disk reads counted for [`HELD_SAMPLE_EVERY`].
    held_acc: AtomicU64,
    /// Random reads sent to the disk while it had every one of them (for seeds).
    seed_acc: AtomicU64,
    /// Fill reads that could be widened to their read-around window (for control reads).
    widen_acc: AtomicU64,
    /// How many times the lenders' random probes and seeds are backed off (doublings, at
    /// most [`QUIET_MAX_LEVEL`]; see the constant).
    quiet: AtomicU64,
    /// Times a back-off in force was ended, by a window of the disk's reads and by a probe
    /// of the lenders (see [`AdaptiveEstimates::backoff_ends`]).
    quiet_ends: [AtomicU64; 2],
    /// Blocks filled, and blocks the lenders held that writes retired, in the survival
    /// window opened at `survival_start_us` (see [`Measured::fill_cost_factor`]).
    fills_window: AtomicU64,
    retired_window: AtomicU64,
    survival_start_us: AtomicU64,
    /// The moving share of filled blocks that writes do not retire (`f64` bits; 1 at start).
    survival: AtomicU64,
    /// The share accumulated by the random reads decided since the last one sent to the
    /// disk, in 1/[`SHARE_ONE`] (below `SHARE_ONE`; see [`spread`]).
    share_acc: AtomicU64,
    /// The same for the disk's reads that fill ([`Measured::share_fill`]).
    fill_acc: AtomicU64,
    switches: AtomicU64,
    /// When each side was last measured (or probed), in µs after `born`.
    remote_seen_us: AtomicU64,
    disk_seen_us: AtomicU64,
    /// What the last measurement of each side took, in µs.
    remote_cost_us: AtomicU64,
    disk_cost_us: AtomicU64,
    disk_probes: AtomicU64,
    /// Streams' own probe clock: when a stream-sized fetch was last timed, and what it took.
    stream_seen_us: AtomicU64,
    stream_cost_us: AtomicU64,
    /// How many times the stream probes' wait and the stream seeds' spacing are doubled (at
    /// most [`STREAM_QUIET_MAX_LEVEL`]; see the constant).
    stream_quiet: AtomicU64,
    /// The blocks of the last [`STREAM_PROBE_SEEDS`] stream reads that seeded the lenders:
    /// (file, first, last, when in µs after `born`), oldest first.
    stream_seeds: Mutex<std::collections::VecDeque<(FileId, u64, u64, u64)>>,
    /// `stream_seeds` holds enough for probes ([`STREAM_SEED_RESERVE`]): no stream seeds more.
    /// Kept beside the deque (set under its lock) so that a stream read checks it without
    /// taking the lock.
    stream_seeds_enough: AtomicBool,
    /// When streams last changed sides, in µs after `born` (0: never).
    stream_switched_us: AtomicU64,
    /// Stream reads in flight on the disk (`[0]`) and the lenders (`[1]`).
    stream_busy: [AtomicU64; 2],
    /// What stream reads cost on each side, and the lenders' stream probes.
    stream_cost: Mutex<StreamCosts>,
    born: Instant,
}

/// A window of random disk reads: their total time and number, and when it opened (µs
/// after `born`).
struct Window {
    sum_us: f64,
    /// What the lenders were expected to take for the same reads.
    remote_sum_us: f64,
    reads: u32,
    start_us: u64,
    /// The disk reads measured when the window opened (`Measured::disk_samples`, the read
    /// that closed the one before included): the window's reads of the disk, voting or not,
    /// are the count past it ([`LoadFit`]'s rate).
    samples_before: u64,
}

impl Window {
    fn new(start_us: u64, samples_before: u64) -> Window {
        Window { sum_us: 0.0, remote_sum_us: 0.0, reads: 0, start_us, samples_before }
    }
}

/// How the disk's reads slow down as it is asked for more of them: a moving least-squares
/// fit of each closed window's mean time against the rate of disk reads in it (every read
/// the mount made of the disk in the window: the reads it voted with, the read-around
/// windows, the misses' reads and the streams'), with moving means of the rate, the time,
/// the rate's square and the product, weight [`LOAD_FIT_WEIGHT`].
///
/// What a read sent to the disk costs is not its own time but the time it adds: on a
/// rate-limited disk (a cloud volume's IOPS cap, a blkio throttle) one more read makes the
/// others wait a little longer, and the split that finishes soonest gives the disk a share
/// at which its reads take *less* than a lender hit — the marginal cost, the mean plus the
/// rate times the slope, is what must tie a hit. Measured on the cloud volume (BENCHMARKS.md,
/// "Session 68"): votes that gave ties to the disk made a 1 GiB random read's passes 19–41%
/// slower. On a disk whose reads take as long however many it is asked for (the raw disk: 78
/// µs a read at a share of 1.0 and of 0.14 in one TPC-H power test) the marginal cost is the
/// mean, and lenders that only tie it cost the daemon's CPU (1.8 times as much a read) and
/// fills for nothing. So the disk's weight ([`Measured::disk_weight`]) is the marginal cost
/// over the mean, less [`HYSTERESIS`], between [`FLAT_DISK_WEIGHT`] and [`DISK_WEIGHT`].
///
/// The rate, not the share: reads the rule sends to lenders that lack their blocks (a cold
/// first pass) are the disk's reads all the same, and a disk at its cap answers no more
/// reads whatever its share — its windows differ in time at one rate, a slope as steep as
/// there is. The weight moves only while the windows' rates spread by at least
/// [`LOAD_FIT_MIN_SPREAD`] of their mean (at a steady rate the fit has nothing to go on,
/// and the weight keeps what it last learned), and starts at [`DISK_WEIGHT`]: a disk whose
/// reads tie the lenders' at every rate hands them part of its share, learns that its reads
/// do not get faster for it, and takes the share back.
#[derive(Clone, Copy, Debug, Default)]
struct LoadFit {
    rate: f64,
    us: f64,
    rate_sq: f64,
    rate_us: f64,
    /// Windows seen (the first ones average, later ones move by the weight).
    windows: u32,
}

impl LoadFit {
    /// A window closed with `rate` disk reads a millisecond and a mean of `us`; the disk's
    /// weight at that rate if the windows now spread far enough to say.
    fn add(&mut self, rate: f64, us: f64) -> Option<f64> {
        if !(rate.is_finite() && us.is_finite() && rate >= 0.0 && us > 0.0) {
            return None;
        }
        self.windows = self.windows.saturating_add(1);
        let w = (1.0 / self.windows as f64).max(LOAD_FIT_WEIGHT);
        let step = |acc: &mut f64, x: f64| *acc += w * (x - *acc);
        step(&mut self.rate, rate);
        step(&mut self.us, us);
        step(&mut self.rate_sq, rate * rate);
        step(&mut self.rate_us, rate * us);
        let var = self.rate_sq - self.rate * self.rate;
        let spread = LOAD_FIT_MIN_SPREAD * self.rate;
        if self.windows < 4 || var < spread * spread || var <= 0.0 {
            return None;
        }
        let slope = (self.rate_us - self.rate * self.us) / var;
        // The fit's time at this rate (steadier than the one window's), and what one more
        // read adds to it.
        let at = (self.us + slope * (rate - self.rate)).max(us.min(self.us));
        let weight = (at + rate * slope) / at / (1.0 + HYSTERESIS);
        weight.is_finite().then(|| weight.clamp(FLAT_DISK_WEIGHT, DISK_WEIGHT))
    }
}

impl Measured {
    /// What a random disk read counts, times its time, against the lenders ([`LoadFit`]).
    fn disk_weight(&self) -> f64 {
        f64::from_bits(self.disk_weight.load(Ordering::Relaxed))
    }

    /// Move the disk's share `by` (in 1/[`SHARE_ONE`]) up (`to_disk`) or down.
    fn step_share_by(&self, to_disk: bool, by: u64) {
        let _ = self.disk_share.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(if to_disk { (v + by).min(SHARE_ONE) } else { v.saturating_sub(by) })
        });
    }

    /// A lender hit: the measured mean, or the model's prior before any.
    fn remote_hit_estimate_us(&self) -> f64 {
        let hit = f64::from_bits(self.remote_hit_us.load(Ordering::Relaxed));
        if hit > 0.0 {
            hit
        } else {
            self.model.lock().remote_us(BLOCK)
        }
    }

    /// What a random read would take if the rule sent it to the lenders, whose hit takes
    /// `hit_us`, while the disk's reads take `disk_us` on average: a hit as often as they hold
    /// a read's blocks ([`Measured::held`]), otherwise a miss — the disk's read after all,
    /// widened to its read-around window and filled (its measured time; the disk's read
    /// until one was measured), weighed like a disk read ([`Measured::disk_weight`]: it
    /// spends an operation of the disk's budget too).
    ///
    /// The share goes by this only while the disk is less than [`FILL_MARGIN`] times a hit
    /// (then a miss's fill is not worth making, and a miss is all cost). Judged by hits alone
    /// there, lenders that held about half of what they were sent took every random read
    /// from a disk about as fast as a hit — the raw disk under TPC-H: hits 150–190 µs against
    /// disk reads of 170–200, and half the reads sent to the lenders read 16 KiB windows from
    /// the disk and filled them (BENCHMARKS.md, "Session 44"). Above the margin a miss is an
    /// investment that pays back (a cloud volume at its cap: a read-around window fetched
    /// later saves three of its reads), and the hits alone judge: judged with the misses
    /// there, a first pass of random reads stayed on the disk and took 1.5 and 2.2 times as
    /// long in two rounds.
    ///
    /// A miss is never taken as cheaper than the disk's read now: it *is* one (and a fill on
    /// top). The misses' mean is measured only on misses, and none happen while the disk has
    /// every read, so it keeps what misses cost when the disk last gave the lenders reads:
    /// measured (session 63, the raw disk under pgbench), 123 µs from a select-only run
    /// stood for a miss once TPC-B's writes had made the disk's reads take 250, and windows
    /// that weighed the disk's 250 against it moved a fifth of the reads to lenders that held
    /// 4–8% of them: misses, each a 16 KiB read and a fill.
    fn remote_route_us(&self, hit_us: f64, disk_us: f64) -> f64 {
        let held = f64::from_bits(self.held.load(Ordering::Relaxed)).clamp(0.0, 1.0);
        let miss = f64::from_bits(self.miss_us.load(Ordering::Relaxed)).max(disk_us);
        held * hit_us + (1.0 - held) * miss * self.disk_weight()
    }

    /// How much dearer a lender hit is than its time, for the fills that writes retire:
    /// `1 / survival`, at most `1 / SURVIVAL_FLOOR`. A block filled and then overwritten
    /// before anyone reads it from the lenders cost a PUT and a DEL (CPU and link on both
    /// ends) for nothing; under an update-heavy workload (TPC-B rewrites nearly every page
    /// it reads, measured: 2.4 fills and 2.75 retirements per transaction) most fills are
    /// that, and on a CPU-bound host their cost was the whole loss against the passthrough
    /// (the mount with no lender traffic at all spent the passthrough's CPU per
    /// transaction). Read-only workloads retire nothing, and pay nothing.
    fn fill_cost_factor(&self) -> f64 {
        1.0 / f64::from_bits(self.survival.load(Ordering::Relaxed)).max(SURVIVAL_FLOOR)
    }

    /// Close the survival window if it is full (one thread closes it).
    fn survival_tick(&self) {
        let fills = self.fills_window.load(Ordering::Relaxed);
        let start = self.survival_start_us.load(Ordering::Relaxed);
        let now = self.now_us();
        if fills < SURVIVAL_MIN_FILLS
            || now.saturating_sub(start) < SURVIVAL_WINDOW.as_micros() as u64
            || self.survival_start_us.compare_exchange(start, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        let fills = self.fills_window.swap(0, Ordering::Relaxed).max(1);
        let retired = self.retired_window.swap(0, Ordering::Relaxed);
        let measured = 1.0 - (retired as f64 / fills as f64).min(1.0);
        let _ = self.survival.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            let s = f64::from_bits(v);
            Some((s + SURVIVAL_WEIGHT * (measured - s)).to_bits())
        });
    }

    /// Whether the disk's random reads are worth filling the lenders with: its last window's
    /// reads took more than [`FILL_MARGIN`] times what the lenders would have (no window
    /// yet: not yet).
    fn fill_worth(&self) -> bool {
        f64::from_bits(self.disk_over_remote.load(Ordering::Relaxed)) > FILL_MARGIN
    }

    /// Whether this random disk read, sent there by a share of `share`, fills the lenders for
    /// the reads they will take: every one at a share of at most [`FILL_SHARE`], none at
    /// [`SHARE_ONE`], and in between a part that falls with the share (spread evenly).
    fn share_fill(&self, share: u64) -> bool {
        spread(&self.fill_acc, (2 * (SHARE_ONE - share.min(SHARE_ONE))).min(SHARE_ONE))
    }

    /// Whether this disk read is a seed: one in `every` (the reads of both kinds counted
    /// together).
    fn seed(&self, every: u64) -> bool {
        self.seed_acc.fetch_add(1, Ordering::Relaxed) % every == every - 1
    }

    /// Whether this random disk read is a seed: one in [`SEED_EVERY`], spaced further while
    /// the back-off holds ([`QUIET_MAX_LEVEL`]).
    fn random_seed(&self) -> bool {
        self.seed(SEED_EVERY << self.quiet.load(Ordering::Relaxed))
    }

    /// How long the lenders go unmeasured before a random read probes them: longer while the
    /// back-off holds ([`QUIET_MAX_LEVEL`]).
    fn remote_probe_interval(&self) -> Duration {
        REMOTE_PROBE_INTERVAL * (1 << self.quiet.load(Ordering::Relaxed)) as u32
    }

    /// µs since `born` (plus what tests skipped ahead).
    fn now_us(&self) -> u64 {
        self.us_at(Instant::now())
    }

    /// [`Self::now_us`] at `at`, a time read already (a read's end): no clock read.
    fn us_at(&self, at: Instant) -> u64 {
        #[cfg(test)]
        if self.virtual_clock.load(Ordering::Relaxed) {
            return self.skipped_us.load(Ordering::Relaxed);
        }
        at.saturating_duration_since(self.born).as_micros() as u64 + self.skipped_us.load(Ordering::Relaxed)
    }

    /// Whether the side last seen at `seen`, whose last measurement took `cost` µs, is due
    /// a probe; claims it (one probe per interval, however many threads ask). The wait is
    /// doubled `doublings` times (the stream back-off, [`STREAM_QUIET_MAX_LEVEL`]).
    fn probe_due(&self, seen: &AtomicU64, cost: &AtomicU64, interval: Duration, doublings: u64) -> bool {
        let now = self.now_us();
        let last = seen.load(Ordering::Relaxed);
        Self::waited(now, last, cost, interval, doublings)
            && seen.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// Whether the side is due a probe, without claiming it.
    fn probe_wanted(&self, seen: &AtomicU64, cost: &AtomicU64, interval: Duration, doublings: u64) -> bool {
        Self::waited(self.now_us(), seen.load(Ordering::Relaxed), cost, interval, doublings)
    }

    fn waited(now: u64, last: u64, cost: &AtomicU64, interval: Duration, doublings: u64) -> bool {
        let wait = (interval.as_micros() as u64).max(cost.load(Ordering::Relaxed).saturating_mul(PROBE_COST_FACTOR));
        now.saturating_sub(last) >= wait.saturating_mul(1 << doublings.min(10))
    }

    /// Whether a stream probe is due (`claim`: and claim it). Never before the disk's first
    /// stream window (`disk_measured`), and backed off by [`STREAM_QUIET_MAX_LEVEL`].
    fn stream_probe(&self, disk_measured: bool, claim: bool) -> bool {
        let q = self.stream_quiet.load(Ordering::Relaxed);
        disk_measured
            && if claim {
                self.probe_due(&self.stream_seen_us, &self.stream_cost_us, REMOTE_PROBE_INTERVAL, q)
            } else {
                self.probe_wanted(&self.stream_seen_us, &self.stream_cost_us, REMOTE_PROBE_INTERVAL, q)
            }
    }

    /// The stream back-off after its measurements changed: one more doubling if the disk is
    /// still clearly faster (`grow`: a disk window closed), none if not.
    fn stream_quiet_update(&self, c: &StreamCosts, grow: bool) {
        let clear = c.disk_clearly_faster();
        let _ = self.stream_quiet.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
            Some(match (clear, grow) {
                (false, _) => 0,
                (true, true) => (q + 1).min(STREAM_QUIET_MAX_LEVEL),
                (true, false) => q,
            })
        });
    }
}

impl RouterState {
    pub fn new(r: Router) -> RouterState {
        match r {
            Router::Threshold(t) => RouterState::Threshold(t),
            Router::Adaptive(a) => RouterState::Adaptive(Box::new(Measured {
                model: Mutex::new(a),
                streams: Streams::new(),
                disk_samples: AtomicU64::new(0),
                remote_samples: AtomicU64::new(0),
                stream_remote: AtomicBool::new(false),
                // The disk is the truth and the first guess: the lenders earn their share.
                disk_share: AtomicU64::new(SHARE_ONE),
                seed_acc: AtomicU64::new(0),
                widen_acc: AtomicU64::new(0),
                quiet: AtomicU64::new(0),
                quiet_ends: [AtomicU64::new(0), AtomicU64::new(0)],
                fills_window: AtomicU64::new(0),
                retired_window: AtomicU64::new(0),
                survival_start_us: AtomicU64::new(0),
                survival: AtomicU64::new(1f64.to_bits()),
                share_acc: AtomicU64::new(0),
                fill_acc: AtomicU64::new(0),
                disk_window: Mutex::new(Window::new(0, 0)),
                skipped_us: AtomicU64::new(0),
                #[cfg(test)]
                virtual_clock: AtomicBool::new(false),
                disk_mean_us: AtomicU64::new(0),
                load_fit: Mutex::new(LoadFit::default()),
                disk_weight: AtomicU64::new(DISK_WEIGHT.to_bits()),
                disk_over_remote: AtomicU64::new(0),
                remote_hit_us: AtomicU64::new(0),
                remote_recent_us: AtomicU64::new(0),
                held: AtomicU64::new(1f64.to_bits()),
                miss_us: AtomicU64::new(0),
                held_acc: AtomicU64::new(0),
                switches: AtomicU64::new(0),
                remote_seen_us: AtomicU64::new(0),
                disk_seen_us: AtomicU64::new(0),
                disk_cost_us: AtomicU64::new(0),
                disk_probes: AtomicU64::new(0),
                remote_cost_us: AtomicU64::new(0),
                stream_seen_us: AtomicU64::new(0),
                stream_cost_us: AtomicU64::new(0),
                stream_quiet: AtomicU64::new(0),
                stream_seeds: Mutex::new(std::collections::VecDeque::with_capacity(STREAM_PROBE_SEEDS)),
                stream_seeds_enough: AtomicBool::new(false),
                stream_switched_us: AtomicU64::new(0),
                stream_busy: [AtomicU64::new(0), AtomicU64::new(0)],
                stream_cost: Mutex::new(StreamCosts {
                    side: [StreamCost::new(), StreamCost::new()],
                    probe_per_byte_us: 0.0,
                }),
                born: Instant::now(),
            })),
        }
    }

    pub fn mode(&self) -> &'static str {
        match self {
            RouterState::Threshold(_) => "threshold",
            RouterState::Adaptive(_) => "adaptive",
        }
    }

    /// Bytes from which the threshold rule sends reads to the disk; 0 for the adaptive rule.
    pub fn threshold_bytes(&self) -> u64 {
        match self {
            RouterState::Threshold(t) => t.blocks as u64 * t.block_bytes as u64,
            RouterState::Adaptive(_) => 0,
        }
    }

    /// Whether reads should be timed (only the adaptive rule uses the times).
    pub fn measures(&self) -> bool {
        matches!(self, RouterState::Adaptive(_))
    }

    /// Where a read of `len` bytes at `offset` of `id` goes.
    pub fn decide(&self, id: &FileId, offset: u64, len: u64) -> Decision {
        match self {
            RouterState::Threshold(t) => Decision {
                route: t.route(len),
                adaptive: false,
                sequential: false,
                probe: false,
                fill: false,
                seed: false,
                may_probe_remote: false,
            },
            RouterState::Adaptive(m) => {
                // A read as large as a readahead window is a stream's, whether or not it
                // continues the one before it.
                let sequential = m.streams.observe(id, offset, len) || len >= STREAM_MIN_BYTES;
                let (remote, fill, seed, stream_disk_measured) = if sequential {
                    // Streams go to the lenders only on stream reads measured there (probes
                    // on seeded blocks), never on the model's extrapolation from small
                    // fetches: a few 16 KiB fetches say little about a 1 Gbit/s link's rate,
                    // and a stream sent to a slower side loses its whole length. Both sides
                    // by their cost per byte at their own load (`StreamCost`); a side not
                    // yet measured keeps streams where they are.
                    let was_remote = m.stream_remote.load(Ordering::Relaxed);
                    let (remote_us, disk_us, disk_measured) = {
                        let c = m.stream_cost.lock();
                        let probed = c.probe_per_byte_us * STREAM_PROBE_MARGIN;
                        // On the lenders, they are judged by the stream's own fetches; on the
                        // disk, by their probes (fresh, but taken alone: with a margin), or
                        // by what the stream's fetches measured if that is worse and less
                        // than STREAM_RETRY old (lenders fast alone and slow at a stream's
                        // load would otherwise win every probe and lose every stream).
                        let at_load = c.side[1].per_byte_us;
                        let recent = at_load > 0.0
                            && m.now_us().saturating_sub(c.side[1].closed_us) < STREAM_RETRY.as_micros() as u64;
                        let remote = match was_remote {
                            true if at_load > 0.0 => at_load,
                            false if recent => at_load.max(probed),
                            _ => probed,
                        };
                        let disk = c.side[0].per_byte_us;
                        match (remote, disk) {
                            (r, d) if r > 0.0 && d > 0.0 => (r * len as f64, d * len as f64, true),
                            _ => (f64::NAN, f64::NAN, disk > 0.0),
                        }
                    };
                    // Stay unless the other side is clearly faster, and for at least
                    // STREAM_DWELL after a change (with per-read moving means and no dwell,
                    // streams changed sides 228 times in a 17 s run on a 10 Gbit/s link,
                    // measured; the dwell bounds it whatever the measurements do).
                    let mut remote = if remote_us.is_nan() {
                        was_remote
                    } else if was_remote {
                        remote_us <= disk_us * (1.0 + HYSTERESIS)
                    } else {
                        remote_us * (1.0 + HYSTERESIS) < disk_us
                    };
                    if remote != was_remote {
                        let now = m.now_us();
                        let last = m.stream_switched_us.load(Ordering::Relaxed);
                        let dwelt = last == 0 || now.saturating_sub(last) >= STREAM_DWELL.as_micros() as u64;
                        if !dwelt {
                            remote = was_remote;
                        } else if m.stream_remote.swap(remote, Ordering::Relaxed) == was_remote {
                            m.switches.fetch_add(1, Ordering::Relaxed);
                            m.stream_switched_us.store(now.max(1), Ordering::Relaxed);
                            tracing::info!(
                                len,
                                remote_us,
                                disk_us,
                                "sequential reads now go to the {}",
                                if remote { "lenders" } else { "disk" }
                            );
                        }
                    }
                    // A stream on the disk seeds the lenders one read in SEED_EVERY (backed
                    // off: fewer) until the seeds kept hold STREAM_SEED_RESERVE, so that a
                    // probe can measure them at its size (on a link faster than the disk, the
                    // next pass's stream then moves to them).
                    let seed = !remote
                        && !m.stream_seeds_enough.load(Ordering::Relaxed)
                        && m.seed(SEED_EVERY << m.stream_quiet.load(Ordering::Relaxed));
                    if seed {
                        let (first, last) = (offset / BLOCK, (offset + len - 1) / BLOCK);
                        let mut seeds = m.stream_seeds.lock();
                        // A range seeded before is kept once (its blocks are held once).
                        seeds.retain(|&(i, f, l, _)| (i, f, l) != (*id, first, last));
                        if seeds.len() == STREAM_PROBE_SEEDS {
                            seeds.pop_front();
                        }
                        seeds.push_back((*id, first, last, m.now_us()));
                        m.stream_seeds_enough.store(seeds_enough(&seeds), Ordering::Relaxed);
                    }
                    (remote, seed, seed, disk_measured)
                } else {
                    let share = m.disk_share.load(Ordering::Relaxed);
                    // `share` of the reads go to the disk, spread evenly.
                    let to_disk = spread(&m.share_acc, share);
                    // A disk read fills in proportion to the lenders' part of the reads
                    // (FILL_SHARE), and always while a lender hit is clearly cheaper than a
                    // disk read; otherwise one in SEED_EVERY still does (a seed).
                    let worth = to_disk && (m.share_fill(share) || m.fill_worth());
                    let seed = to_disk && !worth && m.random_seed();
                    (!to_disk, worth || seed, seed, false)
                };
                let (route, probe, may_probe_remote) = if remote {
                    if !sequential
                        && m.disk_share.load(Ordering::Relaxed) == 0
                        && m.probe_due(&m.disk_seen_us, &m.disk_cost_us, DISK_PROBE_INTERVAL, 0)
                    {
                        m.disk_probes.fetch_add(1, Ordering::Relaxed);
                        (Route::Disk, true, false)
                    } else {
                        (Route::Remote, false, false)
                    }
                } else if sequential {
                    // A stream's probe is due on its own clock, seed or not (see the module
                    // doc): the engine claims it ([`Self::claim_remote_probe`]) and fetches
                    // the last stream seeds.
                    (Route::Disk, false, m.stream_probe(stream_disk_measured, false))
                } else {
                    // The lenders are due a measurement: the engine claims it
                    // ([`Self::claim_remote_probe`]) once it knows they hold this read's blocks.
                    // By the clock, not by when the disk's last read ended: a disk that hangs
                    // ends none, and its reads are when the lenders most need measuring.
                    (
                        Route::Disk,
                        false,
                        !fill && m.probe_wanted(&m.remote_seen_us, &m.remote_cost_us, m.remote_probe_interval(), 0),
                    )
                };
                Decision { route, adaptive: true, sequential, probe, fill, seed, may_probe_remote }
            }
        }
    }

    /// Claim the lenders' probe a [`Decision::may_probe_remote`] offered (one per interval,
    /// however many threads ask; streams' on their own clock); `false` if another read took
    /// it.
    pub fn claim_remote_probe(&self, d: &Decision) -> bool {
        match self {
            // Offered only once the disk's streams were measured (`decide`).
            RouterState::Adaptive(m) if d.sequential => m.stream_probe(true, true),
            RouterState::Adaptive(m) => m.probe_due(&m.remote_seen_us, &m.remote_cost_us, m.remote_probe_interval(), 0),
            RouterState::Threshold(_) => false,
        }
    }

    /// A stream read starts on the disk (`remote` false) or the lenders: the guard counts it
    /// in flight until dropped, and [`Self::stream_read`] takes it back with the time.
    /// `None` for the threshold rule and for reads that are not a stream's.
    pub fn stream_begin(&self, sequential: bool, remote: bool) -> Option<StreamRead<'_>> {
        self.stream_start(sequential, remote, false)
    }

    /// A stream probe's fetch starts ([`Self::stream_begin`] for a probe).
    pub fn stream_probe_begin(&self) -> Option<StreamRead<'_>> {
        self.stream_start(true, true, true)
    }

    fn stream_start(&self, sequential: bool, remote: bool, probe: bool) -> Option<StreamRead<'_>> {
        match self {
            RouterState::Adaptive(m) if sequential => {
                let busy = &m.stream_busy[remote as usize];
                let in_flight = busy.fetch_add(1, Ordering::Relaxed) + 1;
                Some(StreamRead { busy, in_flight, remote, probe })
            }
            _ => None,
        }
    }

    /// A stream read of `len` bytes begun with [`Self::stream_begin`] took `took` (`None`:
    /// it failed, and only leaves the count). A disk read while streams are on the lenders
    /// (a block they lack) is not the disk at a stream's load, and is not counted.
    pub fn stream_read(&self, read: Option<StreamRead<'_>>, len: u64, took: Option<Duration>) {
        if let (RouterState::Adaptive(m), Some(r), Some(took)) = (self, read, took) {
            if !r.remote && m.stream_remote.load(Ordering::Relaxed) {
                return;
            }
            let now = m.now_us();
            let us = took.as_secs_f64() * 1e6;
            let mut c = m.stream_cost.lock();
            if r.probe {
                // The next probe waits PROBE_COST_FACTOR times twice this one's time: a
                // stream probe delays the read it rides on by all of it (1 MiB on a 1 Gbit/s
                // link: 8 ms, so a probe at most every 0.8 s, 1% of the stream's time).
                m.stream_seen_us.store(now, Ordering::Relaxed);
                m.stream_cost_us.store(2 * us as u64, Ordering::Relaxed);
                let cost = us / len as f64;
                let old = c.probe_per_byte_us;
                c.probe_per_byte_us = if old > 0.0 { (old + cost) / 2.0 } else { cost };
                // A probe that does not leave the disk clearly faster ends the back-off.
                m.stream_quiet_update(&c, false);
            } else if c.side[r.remote as usize].add(len, us / r.in_flight as f64, now, us) && !r.remote {
                // A disk window: one more doubling if it still finds the disk clearly
                // faster, none if not (the disk got busy: the next probe comes soon).
                m.stream_quiet_update(&c, true);
            }
        }
    }

    /// The blocks of the last stream reads that seeded the lenders, `(file, first, last)`,
    /// oldest first: what a stream probe fetches.
    pub fn stream_seeds(&self) -> Vec<(FileId, u64, u64)> {
        match self {
            RouterState::Adaptive(m) => {
                m.stream_seeds.lock().iter().map(|&(id, first, last, _)| (id, first, last)).collect()
            }
            RouterState::Threshold(_) => Vec::new(),
        }
    }

    /// A stream probe did not find these seeds ([`Self::stream_seeds`]) on the lenders
    /// (evicted, their file changed, or their fill not there yet): those older than
    /// [`STREAM_SEED_GRACE`] are forgotten, and streams seed again until the seeds kept hold
    /// [`STREAM_SEED_RESERVE`] once more.
    pub fn stream_seeds_lost(&self, lost: &[(FileId, u64, u64)]) {
        if let (RouterState::Adaptive(m), false) = (self, lost.is_empty()) {
            let now = m.now_us();
            let grace = STREAM_SEED_GRACE.as_micros() as u64;
            let mut seeds = m.stream_seeds.lock();
            seeds.retain(|&(id, first, last, at)| now.saturating_sub(at) < grace || !lost.contains(&(id, first, last)));
            m.stream_seeds_enough.store(seeds_enough(&seeds), Ordering::Relaxed);
        }
    }

    /// A disk read of `len` bytes took `took`, and ended just now (tests that make up the
    /// times; the engine gives the read's own, [`Self::disk_read_timed`]).
    #[cfg(test)]
    pub fn disk_read(&self, len: u64, sequential: bool, took: Duration) {
        self.disk_observed(len, sequential, took, true, Instant::now());
    }

    /// A disk read of `len` bytes timed by `time` (its end is the rule's clock: no clock read
    /// of its own).
    pub fn disk_read_timed(&self, len: u64, sequential: bool, time: ReadTime) {
        self.disk_observed(len, sequential, time.took(), true, time.end);
    }

    /// A disk read widened to its read-around window ([`Self::widen`]) timed by `time` for
    /// its `len` bytes: the model learns what reads of that size cost, and the probe clock
    /// that the disk was measured; the disk's votes do not count it (see
    /// [`READ_AROUND_CONTROL_EVERY`]).
    pub fn disk_read_widened(&self, len: u64, time: ReadTime) {
        self.disk_observed(len, false, time.took(), false, time.end);
    }

    /// [`Self::disk_read_timed`] of a read that took `took` and ended at `end`, the window's
    /// vote only with `vote`.
    fn disk_observed(&self, len: u64, sequential: bool, took: Duration, vote: bool, end: Instant) {
        if let RouterState::Adaptive(m) = self {
            let us = took.as_secs_f64() * 1e6;
            // The window's and the probe clock's time: when the read ended.
            let now = m.us_at(end);
            // The disk reads measured so far, this one included (the windows' rate).
            let samples = m.disk_samples.fetch_add(1, Ordering::Relaxed) + 1;
            // What the same read would have cost at the lenders: a hit for a block or two,
            // else the model for its size.
            let remote_us = {
                let mut a = m.model.lock();
                a.observe_disk(len, sequential, us);
                (vote && len > 2 * BLOCK).then(|| a.remote_us(len))
            };
            if vote && !sequential {
                // The disk's own random reads, at the load its share gives it, move the share:
                // each window of them votes with their time against what the lenders would
                // have taken for the same reads.
                let remote_us = remote_us.unwrap_or_else(|| m.remote_hit_estimate_us()) * m.fill_cost_factor();
                let closed = {
                    let mut w = m.disk_window.lock();
                    w.sum_us += us;
                    w.remote_sum_us += remote_us;
                    w.reads += 1;
                    let full =
                        w.reads >= WINDOW_MIN_READS && now.saturating_sub(w.start_us) >= WINDOW_TIME.as_micros() as u64;
                    full.then(|| std::mem::replace(&mut *w, Window::new(now, samples)))
                };
                if let Some(w) = closed {
                    let mean = w.sum_us / w.reads as f64;
                    m.disk_mean_us.store(mean.to_bits(), Ordering::Relaxed);
                    let remote_us = w.remote_sum_us / w.reads as f64;
                    let over = mean / remote_us.max(1.0);
                    m.disk_over_remote.store(over.to_bits(), Ordering::Relaxed);
                    // The disk's reads in the window, this one included.
                    let reads = samples.saturating_sub(w.samples_before);
                    let rate = reads as f64 * 1e3 / now.saturating_sub(w.start_us).max(1) as f64;
                    if let Some(w) = m.load_fit.lock().add(rate, mean) {
                        m.disk_weight.store(w.to_bits(), Ordering::Relaxed);
                    }
                    let share = m.disk_share.load(Ordering::Relaxed);
                    let disk_us = mean * m.disk_weight();
                    // The share moves by what each route costs: below the fill margin, the
                    // lenders' misses included; above it, a miss is a fill worth making, and
                    // the lenders are judged by their hits (see `remote_route_us`).
                    let route_us = if over > FILL_MARGIN { remote_us } else { m.remote_route_us(remote_us, mean) };
                    let gap = disk_us.max(route_us) / disk_us.min(route_us).max(1.0);
                    // From a share of 0 the window held the disk's probes alone, which an
                    // idle disk answers at its best (a rate-limited one far from its cap): they
                    // say what the disk costs with no share, not with any, so they move it
                    // one step up at most, and the next window measures the disk with that.
                    let idle = share == 0;
                    let steps = if idle && disk_us < route_us { 1.0 } else { ((gap - 1.0) * 8.0).clamp(1.0, 8.0) };
                    m.step_share_by(disk_us < route_us, (WINDOW_STEP as f64 * steps) as u64);
                    // The back-off: one more doubling for a window that found the disk clearly
                    // faster while it has every read, none left for any other.
                    let clear = clearly_faster(disk_us, remote_us) && m.disk_share.load(Ordering::Relaxed) == SHARE_ONE;
                    let was = m.quiet.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                        Some(if clear { (q + 1).min(QUIET_MAX_LEVEL) } else { 0 })
                    });
                    if !clear && was.is_ok_and(|q| q > 0) {
                        m.quiet_ends[0].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            m.disk_seen_us.store(now, Ordering::Relaxed);
            m.disk_cost_us.store(took.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// Whether a disk read that fills the lenders and could read its read-around window
    /// should: all but one in [`READ_AROUND_CONTROL_EVERY`] (the control reads, read as
    /// asked so that the disk's votes measure reads as asked); always under the threshold
    /// rule, which measures nothing.
    pub fn widen(&self) -> bool {
        match self {
            RouterState::Adaptive(m) => {
                m.widen_acc.fetch_add(1, Ordering::Relaxed) % READ_AROUND_CONTROL_EVERY != READ_AROUND_CONTROL_EVERY - 1
            }
            RouterState::Threshold(_) => true,
        }
    }

    /// Whether this random read, sent to the disk, should ask the index whether the lenders
    /// hold its blocks, for [`Self::lenders_held`]: one in [`HELD_SAMPLE_EVERY`].
    pub fn held_sample(&self) -> bool {
        match self {
            RouterState::Adaptive(m) => m.held_acc.fetch_add(1, Ordering::Relaxed) % HELD_SAMPLE_EVERY == 0,
            RouterState::Threshold(_) => false,
        }
    }

    /// The lenders held (`true`) every block of a random read, or not: one sample of
    /// [`Measured::held`] (probes, sent only where they hold everything, are not samples).
    pub fn lenders_held(&self, held: bool) {
        if let RouterState::Adaptive(m) = self {
            // A share, not a time: it starts at 1 and may reach 0, so no "none yet" as in
            // `ewma` (at 0, one held read would set it back to 1 at once).
            let x = if held { 1.0 } else { 0.0 };
            let _ = m.held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                let was = f64::from_bits(v);
                Some((was + HELD_WEIGHT * (x - was)).to_bits())
            });
        }
    }

    /// A random read sent to the lenders that held none of what it needed went to the disk
    /// (with its read-around and fill) and took `took`.
    pub fn lender_miss(&self, took: Duration) {
        if let RouterState::Adaptive(m) = self {
            ewma(&m.miss_us, took.as_secs_f64() * 1e6, MISS_WEIGHT);
        }
    }

    /// `blocks` blocks were sent to the lenders to fill them.
    pub fn filled(&self, blocks: u64) {
        if let RouterState::Adaptive(m) = self {
            if blocks > 0 {
                m.fills_window.fetch_add(blocks, Ordering::Relaxed);
                m.survival_tick();
            }
        }
    }

    /// A write through the mount retired `blocks` blocks the lenders held.
    pub fn retired(&self, blocks: u64) {
        if let RouterState::Adaptive(m) = self {
            if blocks > 0 {
                m.retired_window.fetch_add(blocks, Ordering::Relaxed);
                m.survival_tick();
            }
        }
    }

    /// A fetch of `len` bytes from the lenders took `took`.
    pub fn remote_fetch(&self, len: u64, took: Duration) {
        if let RouterState::Adaptive(m) = self {
            let us = took.as_secs_f64() * 1e6;
            let disk_us = {
                let mut a = m.model.lock();
                a.observe_remote(len, us);
                a.disk_us(len, false)
            };
            // The disk's last window mean (0: none yet).
            let mean = f64::from_bits(m.disk_mean_us.load(Ordering::Relaxed));
            if len <= 2 * BLOCK {
                let probing = m.disk_share.load(Ordering::Relaxed) == SHARE_ONE;
                let weight = if probing { PROBE_HIT_WEIGHT } else { REMOTE_HIT_WEIGHT };
                let hit = ewma(&m.remote_hit_us, us, weight);
                // A probe ends the back-off only if both it and the hit estimate it has just
                // moved find the lenders clearly faster than the disk's last window (the
                // windows' own test, see `disk_observed`, the other way round): the lenders
                // may win now (a failure had raised the estimate, or the disk got busy), so
                // the next probes come soon. The windows weigh the disk against that
                // estimate, and end the back-off once the disk is not clearly faster, so a
                // probe ends it at most a window sooner than they would. The probe alone is
                // not enough: on a CPU-bound machine probes take 0.2 to 12 ms by turns
                // (measured: pgbench select-only at 4 and 16 clients on the raw disk, whose
                // reads took 0.35 ms), and ending the back-off at each fast one — clearly
                // faster than a disk read — ended it 12 to 47 times in a 30 s run while the
                // estimate stood at 1.1 to 15.5 ms and the windows kept every read on the
                // disk (BENCHMARKS.md "Session 58"). Nor does a probe within the hysteresis
                // of the disk, where neither side wins: on the raw disk (window means of
                // 56–75 µs, probes of 76–231 µs on average) such probes ended the back-off
                // 10–25 times a pass, and the seeds and read-around fills that followed
                // (5,900–32,000 blocks in a 1 GiB pass that served none) went with a first
                // pass of 0.995 the passthrough's against 1.04 where it held (BENCHMARKS.md
                // "Session 57").
                if probing
                    && clearly_faster(us.max(hit) * m.fill_cost_factor(), mean * m.disk_weight())
                    && m.quiet.swap(0, Ordering::Relaxed) > 0
                {
                    m.quiet_ends[1].fetch_add(1, Ordering::Relaxed);
                }
            }
            // The disk's last window mean where there is one (a rate-limited disk's typical
            // read hides its stalls), else its estimate for this size.
            let disk_us = if len <= BLOCK && mean > 0.0 { mean } else { disk_us } * m.disk_weight();
            // The recent fetches, in time per block (a fetch of many blocks is not a slow one),
            // held against the disk's estimate for this fetch's size like the fetch itself: a
            // large fetch counts towards trouble only if its blocks are slow indeed.
            let per_block = us / len.div_ceil(BLOCK).max(1) as f64;
            let recent = ewma(&m.remote_recent_us, per_block, TROUBLE_WEIGHT);
            if us > TROUBLE_FACTOR * disk_us && recent > TROUBLE_FACTOR * disk_us {
                // Lenders far slower than the disk, fetch after fetch: each such fetch gives
                // the disk one step (lenders that stay that slow lose every read within 32
                // fetches; one that fails loses them at once, see `remote_failed`). Near the
                // balance only the disk's windows move the share.
                m.step_share_by(true, WINDOW_STEP);
            }
            m.remote_samples.fetch_add(1, Ordering::Relaxed);
            let (seen, cost) = if len >= STREAM_MIN_BYTES {
                (&m.stream_seen_us, &m.stream_cost_us)
            } else {
                (&m.remote_seen_us, &m.remote_cost_us)
            };
            seen.store(m.now_us(), Ordering::Relaxed);
            cost.store(took.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// A fetch failed after `took` (timed out, or its connection broke): every random read
    /// goes to the disk, and the lenders' hit estimate becomes at least what the failure
    /// cost, until fetches that succeed (probes) bring it down and the disk's windows earn
    /// the lenders their share back (the disk is the truth: quick to leave a failing lender,
    /// slow to return).
    pub fn remote_failed(&self, took: Duration) {
        if let RouterState::Adaptive(m) = self {
            m.step_share_by(true, SHARE_ONE);
            let us = took.as_secs_f64() * 1e6;
            let _ = m
                .remote_hit_us
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(f64::from_bits(v).max(us).to_bits()));
        }
    }

    /// Let the rule's clock skip `by` ahead (tests that simulate time).
    #[cfg(test)]
    fn skip(&self, by: Duration) {
        if let RouterState::Adaptive(m) = self {
            m.skipped_us.fetch_add(by.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// From now on the rule's clock moves only by [`Self::skip`] (tests that simulate all of
    /// the time, whose outcome must not depend on how fast the machine runs them).
    #[cfg(test)]
    fn virtual_clock(&self) {
        if let RouterState::Adaptive(m) = self {
            m.skipped_us.store(m.now_us(), Ordering::Relaxed);
            m.virtual_clock.store(true, Ordering::Relaxed);
        }
    }

    /// The adaptive rule's estimates; `None` for the threshold rule.
    pub fn estimates(&self) -> Option<AdaptiveEstimates> {
        let RouterState::Adaptive(m) = self else { return None };
        let a = *m.model.lock();
        Some(AdaptiveEstimates {
            disk_access_us: a.disk_access_us.get(),
            disk_bytes_per_us: a.disk_bytes_per_us.get(),
            remote_access_us: a.remote_access_us.get(),
            remote_bytes_per_us: a.remote_bytes_per_us.get(),
            disk_samples: m.disk_samples.load(Ordering::Relaxed),
            remote_samples: m.remote_samples.load(Ordering::Relaxed),
            switches: m.switches.load(Ordering::Relaxed),
            disk_share: m.disk_share.load(Ordering::Relaxed) as f64 / SHARE_ONE as f64,
            disk_probes: m.disk_probes.load(Ordering::Relaxed),
            probe_backoff: m.quiet.load(Ordering::Relaxed),
            backoff_ends: [m.quiet_ends[0].load(Ordering::Relaxed), m.quiet_ends[1].load(Ordering::Relaxed)],
            stream_probe_backoff: m.stream_quiet.load(Ordering::Relaxed),
            disk_window_mean_us: f64::from_bits(m.disk_mean_us.load(Ordering::Relaxed)),
            remote_hit_us: f64::from_bits(m.remote_hit_us.load(Ordering::Relaxed)),
            disk_weight: m.disk_weight(),
            disk_over_remote: f64::from_bits(m.disk_over_remote.load(Ordering::Relaxed)),
            lenders_held: f64::from_bits(m.held.load(Ordering::Relaxed)),
            lender_miss_us: f64::from_bits(m.miss_us.load(Ordering::Relaxed)),
            fills_surviving: f64::from_bits(m.survival.load(Ordering::Relaxed)),
            classes: a
                .classes()
                .iter()
                .map(|c| {
                    let v = |x: Option<(f64, u32)>| x.map_or(-1.0, |(us, _)| us);
                    [c.bytes as f64, v(c.disk_random), v(c.disk_sequential), v(c.remote)]
                })
                .collect(),
            stream_remote: m.stream_remote.load(Ordering::Relaxed),
            stream_us_per_mib: {
                let c = m.stream_cost.lock();
                let mib = (1 << 20) as f64;
                [c.side[0].per_byte_us * mib, c.side[1].per_byte_us * mib, c.probe_per_byte_us * mib]
            },
        })
    }
}

/// Sequential-stream detection per file, in a fixed number of slots.
struct Streams {
    /// foldhash (hashbrown's default), random per run: every read hashes its file here.
    hasher: hashbrown::DefaultHashBuilder,
    /// (hash of the file's identity, its stream).
    slots: Box<[Mutex<(u64, Stream)>]>,
}

impl Streams {
    fn new() -> Streams {
        Streams {
            hasher: hashbrown::DefaultHashBuilder::default(),
            slots: (0..STREAM_SLOTS).map(|_| Mutex::new((0, Stream::default()))).collect(),
        }
    }

    /// Record a read; whether it continues the previous read of the same file.
    fn observe(&self, id: &FileId, offset: u64, len: u64) -> bool {
        let h = self.hasher.hash_one(id);
        let mut slot = self.slots[h as usize & (STREAM_SLOTS - 1)].lock();
        if slot.0 != h {
            *slot = (h, Stream::default());
        }
        slot.1.observe(offset, len) > len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Generation;

    /// A read that took `took` and ended now.
    fn ended_now(took: Duration) -> ReadTime {
        let end = Instant::now();
        ReadTime { start: end.checked_sub(took).expect("the machine's uptime"), end }
    }

    fn id(ino: u64) -> FileId {
        FileId { dev: 1, ino, generation: Generation::Fs(3) }
    }

    #[test]
    fn streams_are_per_file_and_bounded() {
        let s = Streams::new();
        assert!(!s.observe(&id(1), 0, 4096));
        assert!(!s.observe(&id(2), 0, 4096), "another file's stream is its own");
        assert!(s.observe(&id(1), 4096, 8192), "file 1 continues");
        assert!(s.observe(&id(2), 4096, 4096), "file 2 continues");
        assert!(!s.observe(&id(1), 1 << 20, 4096), "a jump is not sequential");
        // Many more files than slots: the table does not grow, and each file still works.
        for ino in 0..10 * STREAM_SLOTS as u64 {
            s.observe(&id(100 + ino), 0, 4096);
        }
        assert_eq!(s.slots.len(), STREAM_SLOTS);
        assert!(!s.observe(&id(7), 0, 4096));
        assert!(s.observe(&id(7), 4096, 4096));
    }

    #[test]
    fn threshold_rule_is_the_papers() {
        let r = RouterState::new(Threshold::PAPER.into());
        assert_eq!(r.mode(), "threshold");
        assert_eq!(r.threshold_bytes(), 128 << 10);
        assert!(!r.measures());
        assert_eq!(r.decide(&id(1), 0, 4096).route, Route::Remote);
        assert_eq!(r.decide(&id(1), 0, 128 << 10).route, Route::Disk);
        assert_eq!(r.estimates(), None);
    }

    #[test]
    fn adaptive_rule_learns_and_probes_within_its_bounds() {
        let r = RouterState::new(Adaptive::new().into());
        assert_eq!(r.mode(), "adaptive");
        assert_eq!(r.threshold_bytes(), 0);
        // A slow lender and a fast disk: after a few thousand reads every random
        // read goes to the disk; the lenders are probed at most once per
        // REMOTE_PROBE_INTERVAL, however many reads there are.
        r.remote_fetch(4096, Duration::from_micros(350));
        r.disk_read(4096, false, Duration::from_micros(200));
        for i in 0..40_000 {
            r.skip(Duration::from_micros(250));
            match r.decide(&id(1), (i * 7 % 1000) << 20, 4096).route {
                Route::Disk => r.disk_read(4096, false, Duration::from_micros(200)),
                // One read in ten the lenders are asked for misses and reads the disk.
                Route::Remote if i % 10 == 0 => r.disk_read(4096, false, Duration::from_micros(200)),
                Route::Remote => r.remote_fetch(4096, Duration::from_micros(350)),
            }
        }
        assert_eq!(r.estimates().unwrap().disk_share, 1.0);
        let e = r.estimates().unwrap();
        // The disk clearly faster in every window: the probes and seeds are backed off all
        // the way.
        assert_eq!(e.probe_backoff, QUIET_MAX_LEVEL);
        let (probes, seeds, reads) = probe_for(&r, REMOTE_PROBE_INTERVAL * 5);
        let every = SEED_EVERY << QUIET_MAX_LEVEL;
        assert!(seeds.abs_diff(reads / every) <= 1, "{seeds} seeds in {reads} reads");
        assert!(probes <= 1, "{probes} lender probes in 5 intervals, backed off {QUIET_MAX_LEVEL} times");
        let after = r.estimates().unwrap();
        assert_eq!((after.disk_samples, after.remote_samples), (e.disk_samples, e.remote_samples));
        assert!(e.remote_access_us > 250.0 && e.disk_access_us < 200.0, "{e:?}");
        // Sequential reads are recognised per file.
        assert!(!r.decide(&id(2), 0, 65536).sequential);
        assert!(r.decide(&id(2), 65536, 65536).sequential);
    }

    /// Random reads for `time` (real time) of a router whose disk has every one: the lender
    /// probes claimed (the lenders hold every block), the seeds, and the reads.
    fn probe_for(r: &RouterState, time: Duration) -> (u64, u64, u64) {
        let t = Instant::now();
        let (mut probes, mut seeds, mut reads) = (0, 0, 0u64);
        while t.elapsed() < time {
            let d = r.decide(&id(1), (reads * 7 % 1000) << 20, 4096);
            reads += 1;
            assert!(d.adaptive && !d.sequential && !d.probe);
            assert_eq!((d.route, d.chosen()), (Route::Disk, Route::Disk));
            // With no share, one disk read in SEED_EVERY (backed off: fewer) still fills
            // the lenders — as a seed (sent in batches: `outbox::SEED_WINDOW`).
            assert_eq!(d.seed, d.fill, "{d:?}");
            seeds += d.fill as u64;
            // The lenders are offered for a probe while one is due; the engine claims it
            // when they hold the read's blocks (here: always).
            if d.may_probe_remote && r.claim_remote_probe(&d) {
                probes += 1;
            }
        }
        assert!(reads > 100, "{reads}");
        (probes, seeds, reads)
    }

    /// One window of random disk reads of `us` each.
    fn disk_window(r: &RouterState, us: u64) {
        for _ in 0..WINDOW_MIN_READS {
            r.skip(WINDOW_TIME / WINDOW_MIN_READS);
            r.disk_read(4096, false, Duration::from_micros(us));
        }
    }

    #[test]
    fn probes_and_seeds_back_off_while_the_disk_keeps_winning_and_return_at_once() {
        let r = RouterState::new(Adaptive::new().into());
        r.remote_fetch(4096, Duration::from_micros(350));
        // Each window that finds the disk clearly faster (200 µs × DISK_WEIGHT, with the
        // margin, against a 350 µs hit) doubles the spacing, up to the cap.
        for level in 1..=QUIET_MAX_LEVEL + 2 {
            disk_window(&r, 200);
            assert_eq!(r.estimates().unwrap().probe_backoff, level.min(QUIET_MAX_LEVEL));
        }
        // One window that does not (the disk got busy: 400 µs) ends it at once, and the
        // lenders get a share in the same window.
        disk_window(&r, 400);
        let e = r.estimates().unwrap();
        assert_eq!(e.probe_backoff, 0);
        assert_eq!(e.backoff_ends, [1, 0], "ended by a window");
        assert!(e.disk_share < 1.0, "{e:?}");
        // A disk faster, but not clearly (300 µs: within the margin of 350), keeps every read
        // without backing off: the lenders are probed once per REMOTE_PROBE_INTERVAL and
        // one read in SEED_EVERY seeds them.
        let r = RouterState::new(Adaptive::new().into());
        r.remote_fetch(4096, Duration::from_micros(350));
        for _ in 0..8 {
            disk_window(&r, 300);
        }
        let e = r.estimates().unwrap();
        assert_eq!((e.disk_share, e.probe_backoff), (1.0, 0), "{e:?}");
        let (probes, seeds, reads) = probe_for(&r, REMOTE_PROBE_INTERVAL * 5);
        assert!(seeds.abs_diff(reads / SEED_EVERY) <= 1, "{seeds} seeds in {reads} reads");
        assert!((4..=6).contains(&probes), "{probes} lender probes in 5 intervals");
    }

    #[test]
    fn noisy_probes_slower_than_the_disk_keep_the_back_off() {
        // The raw disk at 16 busy clients on two vCPUs (session 41): reads of 350 µs, and
        // lender probes that wait for a CPU, 0.6 to 12 ms by turns.
        let backoff = |r: &RouterState| r.estimates().unwrap().probe_backoff;
        let r = RouterState::new(Adaptive::new().into());
        r.remote_fetch(4096, Duration::from_micros(1_000));
        for _ in 0..QUIET_MAX_LEVEL {
            disk_window(&r, 350);
        }
        assert_eq!(backoff(&r), QUIET_MAX_LEVEL);
        // A probe faster than the estimate but still clearly slower than a disk read keeps
        // the back-off (the rule before ended it at each one twice as fast as the estimate).
        for (i, us) in [12_000, 600, 9_000, 700, 6_000, 500].into_iter().enumerate() {
            r.remote_fetch(4096, Duration::from_micros(us));
            assert_eq!(backoff(&r), QUIET_MAX_LEVEL, "probe {i}, {us} µs");
            disk_window(&r, 350);
            assert_eq!(backoff(&r), QUIET_MAX_LEVEL, "window after probe {i}");
        }
        let (probes, seeds, reads) = probe_for(&r, REMOTE_PROBE_INTERVAL * 8);
        assert!(probes <= 1 && seeds <= reads / (SEED_EVERY << QUIET_MAX_LEVEL) + 1, "{probes} probes, {seeds} seeds");
        assert_eq!(r.estimates().unwrap().backoff_ends, [0, 0]);
        // Nor does one within the hysteresis of the disk (the lenders at 360 and 400 µs
        // against reads of 350 µs weighed 385 µs): neither side clearly wins.
        for us in [400, 360] {
            r.remote_fetch(4096, Duration::from_micros(us));
            assert_eq!(backoff(&r), QUIET_MAX_LEVEL, "probe of {us} µs");
        }
        assert_eq!(r.estimates().unwrap().backoff_ends, [0, 0]);
        // Probes that find the lenders clearly faster (300 µs) end it once the estimate they
        // move (935 µs by now, at half weight each) is clearly faster too: not the first one
        // (a single fast probe is not the lenders' mean), but within a few.
        r.remote_fetch(4096, Duration::from_micros(300));
        assert_eq!(backoff(&r), QUIET_MAX_LEVEL, "a single fast probe: {:?}", r.estimates().unwrap());
        let mut probes = 1;
        while backoff(&r) > 0 {
            assert!(probes < 5, "{probes} probes of 300 µs: {:?}", r.estimates().unwrap());
            r.remote_fetch(4096, Duration::from_micros(300));
            probes += 1;
        }
        assert_eq!(r.estimates().unwrap().backoff_ends, [0, 1], "ended by a probe");
        // A probe with no back-off in force ends none.
        r.remote_fetch(4096, Duration::from_micros(300));
        assert_eq!(r.estimates().unwrap().backoff_ends, [0, 1]);
    }

    #[test]
    fn a_lender_that_failed_once_wins_its_share_back_within_seconds() {
        // Lenders at 150 µs a hit and a disk at 1 ms a read: the lenders get the reads.
        let r = RouterState::new(Adaptive::new().into());
        let step = |r: &RouterState, i: u64, disk_us: u64| {
            r.skip(Duration::from_micros(100));
            let d = r.decide(&id(6), (i * 13 % 997) << 20, 4096);
            if d.route == Route::Remote || (d.may_probe_remote && r.claim_remote_probe(&d)) {
                r.remote_fetch(4096, Duration::from_micros(150));
            } else {
                r.disk_read(4096, false, Duration::from_micros(disk_us));
            }
        };
        for i in 0..50_000 {
            step(&r, i, 1_000);
        }
        assert_eq!(r.estimates().unwrap().disk_share, 0.0);
        // One fetch fails after 38 ms (measured in a TPC-H run: a fetch timed out on a busy
        // machine): every read goes to the disk, which then answers in 300 µs (busy, but
        // not yet as slow as its share will make it).
        r.remote_failed(Duration::from_millis(38));
        assert_eq!(r.estimates().unwrap().disk_share, 1.0);
        // The probes that follow find the lenders as fast as ever: within 4 s (simulated;
        // the first probe waits 50 times the failure's 38 ms) they get a share back.
        let mut took = None;
        for i in 0..40_000u64 {
            step(&r, i, 300);
            if r.estimates().unwrap().disk_share < 1.0 {
                took = Some(i);
                break;
            }
        }
        let e = r.estimates().unwrap();
        assert!(took.is_some(), "the lenders never got a share back: {e:?}");
        assert!(e.remote_hit_us < 1_000.0, "{e:?}");
    }

    #[test]
    fn a_hung_lender_is_probed_at_a_bounded_cost() {
        let r = RouterState::new(Adaptive::new().into());
        r.disk_read(4096, false, Duration::from_micros(200));
        // Each probe of a hung lender waits out a 10 ms timeout: the next waits 50 times that.
        r.remote_fetch(4096, Duration::from_millis(10));
        let t = Instant::now();
        let mut probes = 0;
        while t.elapsed() < Duration::from_millis(400) {
            let d = r.decide(&id(5), 1 << 30, 4096);
            if d.may_probe_remote && r.claim_remote_probe(&d) {
                probes += 1;
                r.remote_fetch(4096, Duration::from_millis(10));
            }
        }
        assert!(probes <= 1, "{probes} probes in 400 ms of a lender that costs 10 ms a fetch");
    }

    #[test]
    fn the_rule_starts_on_the_disk_and_a_slow_disk_hands_reads_over_within_seconds() {
        let r = RouterState::new(Adaptive::new().into());
        assert_eq!(r.estimates().unwrap().disk_share, 1.0, "the disk is the first guess");
        // A disk at 3 ms a read (a busy cloud volume) and no lender measured yet: its windows
        // alone (against the model's prior for a lender hit) hand the reads over in at most
        // four windows.
        let mut windows = 0;
        while r.estimates().unwrap().disk_share > 0.0 {
            disk_window(&r, 3_000);
            windows += 1;
            assert!(windows <= 4, "{:?}", r.estimates());
            // From its first window on, every read it still serves fills the lenders.
            let d = r.decide(&id(9), (windows as u64) << 30, 4096);
            assert!(d.route == Route::Remote || d.fill, "{d:?}");
        }
        // A fast disk (a host-cached virtual disk, 60 µs a read) keeps every read, and the
        // lenders are filled only by seeds.
        let r = RouterState::new(Adaptive::new().into());
        let mut fills = 0;
        for i in 0..20_000u64 {
            r.skip(Duration::from_micros(100));
            let d = r.decide(&id(8), (i * 13 % 997) << 20, 4096);
            assert_eq!(d.route, Route::Disk);
            fills += d.fill as u64;
            r.disk_read(4096, false, Duration::from_micros(60));
            if d.may_probe_remote && r.claim_remote_probe(&d) {
                r.remote_fetch(4096, Duration::from_micros(120));
            }
        }
        assert_eq!(r.estimates().unwrap().disk_share, 1.0);
        assert!(fills <= 20_000 / SEED_EVERY + 1, "{fills} fills");
    }

    /// A rate-limited disk: its reads take `idle_us` plus `per_share_us` for every part of
    /// all random reads it gets (its queue grows with its share). The lenders take 150 µs;
    /// one read in 20 they are asked for misses and goes to the disk. Returns the rule's
    /// estimates at the end and the decisions of the last 50,000 reads.
    fn throttled(idle_us: f64, per_share_us: f64) -> (AdaptiveEstimates, Vec<Decision>) {
        let r = RouterState::new(Adaptive::new().into());
        let mut decisions = Vec::new();
        for i in 0..100_000u64 {
            r.skip(Duration::from_micros(200));
            let share = r.estimates().unwrap().disk_share;
            let load = share + (1.0 - share) / 20.0;
            let disk = Duration::from_secs_f64((idle_us + per_share_us * load) / 1e6);
            let d = r.decide(&id(3), (i * 13 % 997) << 20, 4096);
            match d.route {
                Route::Disk => r.disk_read(4096, false, disk),
                Route::Remote if i % 20 == 0 => r.disk_read(4096, false, disk),
                Route::Remote => r.remote_fetch(4096, Duration::from_micros(150)),
            }
            if i >= 50_000 {
                decisions.push(d);
            }
        }
        (r.estimates().unwrap(), decisions)
    }

    /// Random reads of one block as `CachedPath::read` serves them: a disk read that fills
    /// reads its 16 KiB window (`window_us`) unless the rule wants a control read
    /// (`plain_us`, as every read that does not fill); the lenders hit in 145 µs, but one
    /// read in two sent to them finds a block they never held, which the disk serves and
    /// fills (the first pass over a file). Returns the fill reads and the lenders' reads
    /// among the reads from `late` on.
    fn fills_after(r: &RouterState, from: u64, to: u64, late: u64, plain_us: u64, window_us: u64) -> (u64, u64) {
        let hit = Duration::from_micros(145);
        let fill_read = |r: &RouterState| {
            if r.widen() {
                r.disk_read_widened(16384, ended_now(Duration::from_micros(window_us)));
            } else {
                r.disk_read(4096, false, Duration::from_micros(plain_us));
            }
        };
        let (mut fills, mut remote) = (0, 0);
        for i in from..to {
            r.skip(Duration::from_micros(200));
            let d = r.decide(&id(5), (i * 13 % 997) << 20, 4096);
            let counted = i >= late;
            match d.route {
                Route::Disk if d.fill => {
                    fill_read(r);
                    fills += counted as u64;
                }
                Route::Disk => r.disk_read(4096, false, Duration::from_micros(plain_us)),
                Route::Remote if i % 2 == 0 => {
                    fill_read(r);
                    fills += counted as u64;
                }
                Route::Remote => {
                    r.remote_fetch(4096, hit);
                    remote += counted as u64;
                }
            }
            if d.may_probe_remote && r.claim_remote_probe(&d) {
                r.remote_fetch(4096, hit);
            }
        }
        (fills, remote)
    }

    #[test]
    fn a_disk_fast_again_ends_the_fills_its_slow_moment_started() {
        let r = RouterState::new(Adaptive::new().into());
        // Four seconds of a slow disk (600 µs a read, 1.2 ms a 16 KiB window): the reads
        // go to the lenders, and the disk's reads fill them.
        let (fills, _) = fills_after(&r, 0, 20_000, 0, 600, 1_200);
        assert!(fills > 5_000, "{fills} fills while the disk was slow");
        assert!(r.estimates().unwrap().disk_share < 0.5, "{:?}", r.estimates());
        // Then a disk faster than a lender hit again (120 µs a read), whose windows still
        // cost more than a hit (330 µs): the disk's reads as asked win the reads back and the
        // fills stop. (Voted with the windows' time, the disk looked 2.3 times slower than
        // the lenders for as long as it filled, so it filled for ever.)
        let (fills, remote) = fills_after(&r, 20_000, 420_000, 370_000, 120, 330);
        let e = r.estimates().unwrap();
        assert_eq!(e.disk_share, 1.0, "{e:?}");
        assert!(e.disk_over_remote < FILL_MARGIN, "{e:?}");
        assert!(fills <= 50_000 / SEED_EVERY + 1, "{fills} fills in the last 50,000 reads: {e:?}");
        assert!(remote <= 50, "{remote} lender reads in the last 50,000: {e:?}");
    }

    #[test]
    fn a_rate_limited_disk_gets_the_share_at_which_it_is_as_fast_as_the_lenders() {
        // 40 µs idle, 440 µs with all reads: worth a lender hit (150 µs = 1.25 × 120 µs) at
        // a share of 20%, give or take a window's step.
        let (e, decisions) = throttled(40.0, 400.0);
        let share = e.disk_share;
        // Its reads were measured slowing down as its share grew: a disk read counts all of
        // DISK_WEIGHT (the marginal cost, far above the mean here).
        assert_eq!(e.disk_weight, DISK_WEIGHT, "{e:?}");
        assert!((0.1..=0.35).contains(&share), "disk share {share}");
        let to_disk: Vec<_> = decisions.iter().filter(|d| d.route == Route::Disk).collect();
        let part = to_disk.len() as f64 / decisions.len() as f64;
        assert!((0.1..=0.35).contains(&part), "{part} of the reads went to the disk");
        // There its reads take about a lender hit (under FILL_MARGIN), and every one of them
        // fills the lenders: they take the other 65–90% of the reads, and would be asked for
        // these blocks next time (unfilled, up to a tenth of a file stayed out of them).
        assert!(to_disk.iter().all(|d| d.fill), "a disk read at the equilibrium share did not fill");
        assert!(to_disk.iter().all(|d| !d.seed), "a fill the lenders' share calls for is not a seed");
        // A disk clearly faster than the lenders at any load gets every read, and fills
        // nothing but seeds; a disk about as fast, or slower, none.
        let (e, decisions) = throttled(60.0, 0.0);
        assert_eq!(e.disk_share, 1.0);
        let fills = decisions.iter().filter(|d| d.fill).count() as u64;
        assert!(fills <= 50_000 / SEED_EVERY + 1, "{fills} fills of 50,000 reads on a fast disk");
        assert!(decisions.iter().all(|d| d.seed == d.fill), "a fast disk's fills are all seeds");
        assert_eq!(throttled(400.0, 0.0).0.disk_share, 0.0);
    }

    #[test]
    fn ties_go_to_a_disk_whose_reads_take_as_long_however_many_it_is_asked_for() {
        // Disks whose reads take what a lender hit takes (150 µs), give or take a tenth,
        // however many they are asked for (a fast local disk, or the raw disk under TPC-H:
        // 78 µs at a share of 1.0 and of 0.14). Each starts out weighing its reads by
        // DISK_WEIGHT and hands the lenders part of its share, finds its reads no faster for
        // it, and takes them back: at the end it has every read, and no read of the last
        // 50,000 goes to the lenders but probes.
        for idle_us in [140.0, 150.0, 160.0] {
            let (e, decisions) = throttled(idle_us, 0.0);
            assert_eq!(e.disk_share, 1.0, "{idle_us} µs: {e:?}");
            assert!((e.disk_weight - FLAT_DISK_WEIGHT).abs() < 1e-6, "{idle_us} µs: {e:?}");
            let remote = decisions.iter().filter(|d| d.chosen() == Route::Remote).count();
            assert_eq!(remote, 0, "{idle_us} µs: {remote} reads of the last 50,000 sent to the lenders");
        }
        // A disk that slows down as it is asked for more, even by a fifth over its whole range
        // (140 µs idle, 168 with every read), weighs its reads by what the next one costs,
        // the others' wait included — more than FLAT_DISK_WEIGHT — and gives the lenders the
        // share at which that ties a hit (about 0.44 here).
        let (e, _) = throttled(140.0, 28.0);
        assert!(e.disk_weight > FLAT_DISK_WEIGHT && e.disk_weight < DISK_WEIGHT, "{e:?}");
        assert!((0.25..=0.6).contains(&e.disk_share), "{e:?}");
        // A disk clearly slower than the lenders at any share gives them every read, flat
        // or not.
        assert_eq!(throttled(200.0, 0.0).0.disk_share, 0.0);
    }

    /// Passes of random one-block reads over a file of `blocks` blocks the lenders hold none
    /// of at first, each block read once a pass (in a scattered order), one read every
    /// 200 µs, as `CachedPath::read` serves them: a rate-limited disk bound by operations
    /// takes `idle_us` plus `per_load_us` for the share of recent reads that used it (its
    /// reads as asked and its 16 KiB windows alike); a lender hit takes `hit_us`; a read sent
    /// to lenders that lack its block is a miss — the disk's read of its window, filled.
    /// Returns, per pass, the share of the file the lenders lacked at its end, the share of
    /// its reads that used the disk, and its reads' time against the disk's alone at full
    /// load (the passthrough's).
    fn cold_passes(passes: u32, blocks: u64, hit_us: u64, idle_us: f64, per_load_us: f64) -> Vec<(f64, f64, f64)> {
        const WINDOW: u64 = 4;
        let r = RouterState::new(Adaptive::new().into());
        r.virtual_clock();
        let mut held = vec![false; blocks as usize];
        let mut load = 1.0f64;
        let mut out = Vec::new();
        for _ in 0..passes {
            let (mut disk_ops, mut time_us) = (0u64, 0.0);
            for i in 0..blocks {
                r.skip(Duration::from_micros(200));
                let b = i * 7919 % blocks;
                let d = r.decide(&id(6), b * BLOCK, BLOCK);
                let disk_us = idle_us + per_load_us * load;
                let took = Duration::from_secs_f64(disk_us / 1e6);
                // A disk read that fills: its window, or the block alone for a control read.
                let fill = |r: &RouterState, held: &mut Vec<bool>| {
                    let (first, last) = if r.widen() {
                        r.disk_read_widened(WINDOW * BLOCK, ended_now(took));
                        (b / WINDOW * WINDOW, (b / WINDOW * WINDOW + WINDOW - 1).min(blocks - 1))
                    } else {
                        r.disk_read(BLOCK, false, took);
                        (b, b)
                    };
                    let new = (first..=last).filter(|&x| !std::mem::replace(&mut held[x as usize], true)).count();
                    r.filled(new as u64);
                };
                let mut route = d.route;
                if d.may_probe_remote && held[b as usize] && r.claim_remote_probe(&d) {
                    route = Route::Remote;
                }
                let used_disk = match route {
                    Route::Disk => {
                        if !d.probe && r.held_sample() {
                            r.lenders_held(held[b as usize]);
                        }
                        if d.fill {
                            fill(&r, &mut held);
                        } else {
                            r.disk_read(BLOCK, false, took);
                        }
                        true
                    }
                    Route::Remote if held[b as usize] => {
                        r.lenders_held(true);
                        r.remote_fetch(BLOCK, Duration::from_micros(hit_us));
                        false
                    }
                    Route::Remote => {
                        r.lenders_held(false);
                        fill(&r, &mut held);
                        r.lender_miss(took);
                        true
                    }
                };
                disk_ops += used_disk as u64;
                time_us += if used_disk { disk_us } else { hit_us as f64 };
                load += 0.01 * (f64::from(u8::from(used_disk)) - load);
            }
            let lacked = held.iter().filter(|h| !**h).count() as f64 / blocks as f64;
            let alone = blocks as f64 * (idle_us + per_load_us);
            out.push((lacked, disk_ops as f64 / blocks as f64, time_us / alone));
        }
        out
    }

    #[test]
    fn a_cold_first_pass_fills_the_lenders_as_they_will_be_asked() {
        // A disk whose reads at full load take about a lender hit (210 µs against 200, or
        // 160), under the fill margin, and much less with fewer reads: the rule keeps most
        // reads on it. The lenders still take the rest, so the disk's reads fill them in
        // proportion (the lenders' part, doubled): the first pass leaves under 5% of the file
        // out of them and the second under 1% (3.2% and 0.4% at 200 µs, 0.6% and 0 at 160).
        // Filling only at a share of a half or less, the first pass left 10.3% out and the
        // second 3.9% at 200 µs (3.3% and 0.5% at 160): the misses of lenders left cold kept
        // the share up, a rule judged by what being cold costs.
        for hit in [200, 160] {
            let p = cold_passes(2, 65_536, hit, 60.0, 150.0);
            assert!(p[0].0 < 0.05 && p[1].0 < 0.01, "hit {hit} µs: {p:?}");
            assert!(p.iter().all(|&(_, _, time)| time <= 1.0), "slower than the disk alone: {p:?}");
        }
        // A disk that gets cheap when the lenders take reads hands them most of the reads, and
        // every disk read fills.
        let p = cold_passes(2, 65_536, 160, 40.0, 400.0);
        assert!(p[0].0 < 0.001 && p[1].1 < 0.3, "{p:?}");
    }

    #[test]
    fn probes_alone_move_the_share_up_from_nothing_one_step() {
        let r = RouterState::new(Adaptive::new().into());
        r.remote_fetch(4096, Duration::from_micros(150));
        while r.estimates().unwrap().disk_share > 0.0 {
            disk_window(&r, 3_000);
        }
        // The lenders slow to 400 µs a hit; the idle disk's probes answer in 40 µs, ten times
        // faster — as far apart as eight steps at once. With no share, that is what the disk
        // costs idle, not under any share: one step, and the next window, with its share's
        // reads, says more.
        for _ in 0..500 {
            r.remote_fetch(4096, Duration::from_micros(400));
        }
        disk_window(&r, 40);
        assert_eq!(r.estimates().unwrap().disk_share, WINDOW_STEP as f64 / SHARE_ONE as f64);
        disk_window(&r, 40);
        assert!(r.estimates().unwrap().disk_share > 2.0 * WINDOW_STEP as f64 / SHARE_ONE as f64);
    }

    /// Lenders at 80 µs a hit, one fetch in `every` held for `slow_us` (a busy machine), then
    /// for the last 10,000 reads every fetch (lenders in trouble), against a disk at 300 µs:
    /// the disk's share of the reads before the trouble, and after.
    fn lone_slow_fetches(every: u64, slow_us: u64) -> (f64, f64) {
        let r = RouterState::new(Adaptive::new().into());
        let (mut before, mut after) = (0u64, 0u64);
        for i in 0..70_000u64 {
            r.skip(Duration::from_micros(200));
            let d = r.decide(&id(11), (i * 13 % 997) << 20, 4096);
            let trouble = i >= 60_000;
            match d.route {
                Route::Disk => {
                    r.disk_read(4096, false, Duration::from_micros(300));
                    match i {
                        30_000..60_000 => before += 1,
                        60_010.. => after += 1,
                        _ => {}
                    }
                }
                Route::Remote => {
                    let us = if trouble || i % every == 0 { slow_us } else { 80 };
                    r.remote_fetch(4096, Duration::from_micros(us));
                }
            }
        }
        (before as f64 / 30_000.0, after as f64 / 9_990.0)
    }

    #[test]
    fn a_lone_slow_fetch_is_the_machine_and_slow_fetches_a_lender_in_trouble() {
        // One fetch in 200 at 3 ms, past TROUBLE_FACTOR times the disk: the lenders keep the
        // reads (judged fetch by fetch, each moved the share a step: the disk took a fifth).
        let (before, after) = lone_slow_fetches(200, 3_000);
        assert!(before < 0.05, "the disk took {before} of the reads from lenders 4 times as fast");
        // Once every fetch takes that long, the disk has every read within a few fetches.
        assert!(after > 0.95, "the disk took only {after} of the reads from lenders in trouble");
    }

    /// A disk at 190 µs a read and lenders whose hits take 150 µs, holding the blocks of one
    /// read in `held_every` (1: all of them), a miss there costing the disk's read of its
    /// 16 KiB window and a fill, 400 µs: the disk's share after 60,000 reads, and the share
    /// of the last 20,000 reads that went to the lenders and missed.
    fn lenders_holding_part(held_every: u64) -> (f64, f64) {
        let r = RouterState::new(Adaptive::new().into());
        let mut misses = 0;
        for i in 0..60_000u64 {
            r.skip(Duration::from_micros(200));
            let d = r.decide(&id(5), (i * 13 % 997) << 20, 4096);
            let held = i % held_every == 0;
            match d.route {
                Route::Disk => {
                    r.disk_read(4096, false, Duration::from_micros(190));
                    if r.held_sample() {
                        r.lenders_held(held);
                    }
                }
                Route::Remote => {
                    r.lenders_held(held);
                    if held {
                        r.remote_fetch(4096, Duration::from_micros(150));
                    } else {
                        r.disk_read_widened(16384, ended_now(Duration::from_micros(400)));
                        r.lender_miss(Duration::from_micros(400));
                        misses += u64::from(i >= 40_000);
                    }
                }
            }
        }
        (r.estimates().unwrap().disk_share, misses as f64 / 20_000.0)
    }

    #[test]
    fn lenders_are_judged_by_their_misses_too() {
        // Holding every block, the lenders' faster hits win the random reads...
        let (share, missed) = lenders_holding_part(1);
        assert!(share < 0.1 && missed == 0.0, "disk share {share}, missed {missed}");
        // ...holding half, a read sent to them costs more than the disk's on average (a hit
        // 150 µs or a miss 400), and the disk keeps them: judged by hits alone they took
        // every read, and half of those missed.
        let (share, missed) = lenders_holding_part(2);
        assert!(share > 0.9, "disk share {share}");
        assert!(missed < 0.05, "{missed} of the reads went to lenders that missed");
    }

    /// Random two-block reads, one every 200 µs on the rule's own clock, the disk taking
    /// `disk_us` and the lenders `hit_us` a hit, of which they hold one read's blocks in
    /// `held_every` (a read sent to them that they lack is a miss: the disk's 16 KiB window
    /// and a fill). Returns the reads sent to the lenders and the disk's reads that filled.
    fn pgbench_like(r: &RouterState, reads: u64, disk_us: u64, hit_us: u64, held_every: u64) -> (u64, u64) {
        let (mut remote, mut fills) = (0, 0);
        let (disk, hit) = (Duration::from_micros(disk_us), Duration::from_micros(hit_us));
        for i in 0..reads {
            r.skip(Duration::from_micros(200));
            let d = r.decide(&id(11), (i * 7919 % 65_536) * 2 * BLOCK, 2 * BLOCK);
            let held = i % held_every == 0;
            match d.route {
                Route::Disk => {
                    r.disk_read(2 * BLOCK, false, disk);
                    fills += u64::from(d.fill);
                    if r.held_sample() {
                        r.lenders_held(held);
                    }
                    if d.may_probe_remote && held && r.claim_remote_probe(&d) {
                        r.remote_fetch(2 * BLOCK, hit);
                    }
                }
                Route::Remote => {
                    remote += 1;
                    r.lenders_held(held);
                    if held {
                        r.remote_fetch(2 * BLOCK, hit);
                    } else {
                        r.disk_read_widened(4 * BLOCK, ended_now(disk));
                        r.lender_miss(disk);
                    }
                }
            }
        }
        (remote, fills)
    }

    #[test]
    fn an_old_miss_does_not_make_lenders_that_hold_little_look_cheap() {
        // Measured on the raw disk under pgbench (session 63): a select-only run, the disk's
        // reads 70–90 µs, lender hits 130–200 µs, the lenders holding a few percent of what
        // is read (seeds); then TPC-B, whose writes slowed the disk's reads.
        let r = RouterState::new(Adaptive::new().into());
        r.virtual_clock();
        // Misses from an earlier moment when the disk was fast and the lenders took some
        // reads: 60 µs each (the disk's read then, widened, and a fill).
        for _ in 0..50 {
            r.lender_miss(Duration::from_micros(60));
        }
        let (remote, fills) = pgbench_like(&r, 150_000, 75, 160, 20);
        let e = r.estimates().unwrap();
        assert_eq!(e.disk_share, 1.0, "{e:?}");
        assert!(remote == 0 && fills <= 150_000 / SEED_EVERY + 1, "{remote} lender reads, {fills} fills: {e:?}");
        // The disk slows to 140 µs, still faster than a 160 µs hit (weighted too: 154 µs).
        // A read sent to lenders that hold a twentieth of the reads is then a miss — the
        // disk's read and a fill — nineteen times in twenty: dearer than the disk's. Weighed
        // against the misses' old 60 µs instead, the share left the disk, 1,880 reads went to
        // the lenders and 5,445 of the disk's reads filled them (the bound here: 2,344).
        let (remote, fills) = pgbench_like(&r, 150_000, 140, 160, 20);
        let e = r.estimates().unwrap();
        assert!(e.disk_over_remote < FILL_MARGIN, "{e:?}");
        assert_eq!(e.disk_share, 1.0, "{e:?}");
        assert!(remote == 0 && fills <= 150_000 / SEED_EVERY + 1, "{remote} lender reads, {fills} fills: {e:?}");
        // Lenders that hold every read, with hits cheaper than the disk's reads, take them
        // (here under the fill margin: 150 µs against 200).
        let (remote, _) = pgbench_like(&r, 150_000, 200, 150, 1);
        let e = r.estimates().unwrap();
        assert!(e.disk_share < 0.1, "{e:?}");
        assert!(remote > 75_000, "{remote} lender reads: {e:?}");
    }

    /// A disk at 250 µs a read and lenders at 150 µs: the lenders win the random reads
    /// unless writes retire what is filled (every fill, then all of them, retired by the
    /// next read's write: TPC-B's update of the page it read).
    fn under_writes(retire: bool) -> (f64, f64) {
        let r = RouterState::new(Adaptive::new().into());
        for i in 0..60_000u64 {
            r.skip(Duration::from_micros(200));
            let d = r.decide(&id(4), (i * 13 % 997) << 20, 4096);
            match d.route {
                Route::Disk => r.disk_read(4096, false, Duration::from_micros(250)),
                Route::Remote if i % 4 == 0 => r.disk_read(4096, false, Duration::from_micros(250)),
                Route::Remote => r.remote_fetch(4096, Duration::from_micros(150)),
            }
            if d.fill || (d.route == Route::Remote && i % 4 == 0) {
                r.filled(1);
                if retire {
                    r.retired(1);
                }
            }
        }
        let e = r.estimates().unwrap();
        (e.disk_share, e.fills_surviving)
    }

    #[test]
    fn fills_that_writes_retire_make_the_lenders_dearer() {
        let (share, surviving) = under_writes(false);
        assert_eq!((share, surviving), (0.0, 1.0), "read-only: the faster lenders get the reads");
        let (share, surviving) = under_writes(true);
        // Measured down past the floor, where a lender hit counts its most; then the disk
        // has every read, the seeds back off, and the few fills left move it no further.
        assert!(surviving < SURVIVAL_FLOOR, "every fill retired, yet {surviving} survive");
        assert_eq!(share, 1.0, "lenders whose every fill is overwritten at 1/4 their cost must lose");
        // The factor is bounded: lenders 4 times as fast still win while every fill is retired
        // (by a hair once the disk is found to take as long at any rate, FLAT_DISK_WEIGHT:
        // 909 against 800 µs, a step a window).
        let r = RouterState::new(Adaptive::new().into());
        for _ in 0..100 {
            r.skip(SURVIVAL_WINDOW);
            r.filled(SURVIVAL_MIN_FILLS);
            r.retired(SURVIVAL_MIN_FILLS);
        }
        for i in 0..100_000u64 {
            r.skip(Duration::from_micros(200));
            r.disk_read(4096, false, Duration::from_micros(1_000));
            r.remote_fetch(4096, Duration::from_micros(200));
            r.decide(&id(4), i << 20, 4096);
        }
        assert_eq!(r.estimates().unwrap().disk_share, 0.0, "{:?}", r.estimates());
    }

    /// A stream read of `len` bytes on one side that took `us` (the clock moves by it).
    fn stream(r: &RouterState, remote: bool, len: u64, us: u64) {
        let g = r.stream_begin(true, remote);
        r.skip(Duration::from_micros(us));
        r.stream_read(g, len, Some(Duration::from_micros(us)));
    }

    /// A stream probe that fetched `len` bytes in `us`.
    fn stream_probe(r: &RouterState, len: u64, us: u64) {
        let g = r.stream_probe_begin();
        r.stream_read(g, len, Some(Duration::from_micros(us)));
    }

    #[test]
    fn streams_change_sides_only_past_the_margin() {
        let r = RouterState::new(Adaptive::new().into());
        // Streams as fast from the disk as the lenders' probes say the lenders are, noisy:
        // the rule stays put.
        for i in 0..2000u64 {
            let jitter = i * 37 % 11;
            stream(&r, false, 65536, 495 + jitter);
            if i % 16 == 0 {
                stream_probe(&r, 1 << 20, (495 + (10 - jitter)) * 16);
            }
            r.decide(&id(6), i * 65536, 65536);
        }
        let e = r.estimates().unwrap();
        assert_eq!(e.switches, 0, "streams changed sides: {e:?}");
        assert!(e.stream_us_per_mib[0] > 0.0 && e.stream_us_per_mib[2] > 0.0, "{e:?}");
    }

    #[test]
    fn streams_go_to_the_lenders_only_on_stream_probes_clear_of_the_margin() {
        let r = RouterState::new(Adaptive::new().into());
        // Small fetches that would extrapolate to a fast link, and a slow disk stream: 1 MiB
        // in 8 ms.
        for _ in 0..100 {
            r.remote_fetch(4096, Duration::from_micros(50));
            r.remote_fetch(16384, Duration::from_micros(60));
            stream(&r, false, 1 << 20, 8000);
        }
        // A 1 MiB read (a stream's, even as the first of its file) stays on the disk, and one
        // read in SEED_EVERY seeds the lenders (and is kept for probes).
        let mut seeds = 0;
        for i in 0..SEED_EVERY {
            let d = r.decide(&id(10), i << 20, 1 << 20);
            assert!(d.sequential && d.route == Route::Disk, "{d:?}");
            seeds += d.fill as u64;
        }
        assert_eq!(seeds, 1);
        assert_eq!(r.stream_seeds(), vec![(id(10), 256 * (SEED_EVERY - 1), 256 * SEED_EVERY - 1)]);
        // Probes at 6 ms a MiB (a shaped link's burst, or a link as fast as the disk): inside
        // the margin, streams stay on the disk.
        stream_probe(&r, 1 << 20, 6000);
        let d = r.decide(&id(10), 100 << 20, 1 << 20);
        assert!(d.route == Route::Disk, "{d:?}");
        // Probes at 2 ms a MiB (a 10 Gbit/s link): streams move to the lenders, once.
        for _ in 0..4 {
            stream_probe(&r, 1 << 20, 2000);
        }
        for i in 0..10 {
            let d = r.decide(&id(10), (101 + i) << 20, 1 << 20);
            assert!(d.sequential && d.route == Route::Remote, "{d:?}");
        }
        assert_eq!(r.estimates().unwrap().switches, 1);
    }

    #[test]
    fn a_throttled_disk_does_not_make_streams_change_sides_back_and_forth() {
        let r = RouterState::new(Adaptive::new().into());
        // A throttled disk: 128 KiB readahead answered in 0.3 ms, and one read in eight held
        // for the rest of a throttle slice (15 ms): 2.1 ms a read on average.
        let throttled = |i: u64| if i % 8 == 7 { 15_000 } else { 300 };
        for i in 0..800 {
            stream(&r, false, 128 << 10, throttled(i));
        }
        // Lenders that probe at 0.3 ms per 128 KiB take the streams…
        for _ in 0..2 {
            stream_probe(&r, 1 << 20, 2400);
        }
        let mut at = 0u64;
        let mut decide = |r: &RouterState| {
            at += 1;
            r.decide(&id(12), at * (128 << 10), 128 << 10)
        };
        assert_eq!(decide(&r).route, Route::Remote);
        // …and keep them for a minute of their own fetches at 0.45 ms (three in flight at
        // once, 1.35 ms each), while the disk answers the few blocks they lack at once (an
        // idle disk: not the disk at a stream's load, and not counted).
        for i in 0..60_000u64 {
            let g: Vec<_> = (0..3).map(|_| r.stream_begin(true, true)).collect();
            r.skip(Duration::from_micros(450));
            for g in g {
                r.stream_read(g, 128 << 10, Some(Duration::from_micros(1350)));
            }
            if i % 16 == 0 {
                stream(&r, false, 128 << 10, 250);
            }
            assert_eq!(decide(&r).route, Route::Remote, "read {i}: {:?}", r.estimates());
        }
        assert_eq!(r.estimates().unwrap().switches, 1);
        // Lenders that slow down to 4 ms a read at their load give the streams back.
        for _ in 0..4000u64 {
            stream(&r, true, 128 << 10, 4000);
            decide(&r);
        }
        let e = r.estimates().unwrap();
        assert_eq!(decide(&r).route, Route::Disk, "{e:?}");
        assert_eq!(e.switches, 2);
        // Fast probes do not win them back while the lenders' fetches at load are recent…
        for i in 0..20_000u64 {
            stream(&r, false, 128 << 10, throttled(i));
            if i % 64 == 0 {
                stream_probe(&r, 1 << 20, 2400);
            }
            if r.estimates().unwrap().stream_us_per_mib[1] > 0.0 && i < 5000 {
                assert_eq!(decide(&r).route, Route::Disk, "read {i}");
            }
        }
        // …and may try them again once those are STREAM_RETRY old (20,000 reads: 42 s).
        assert_eq!(decide(&r).route, Route::Remote);
        assert_eq!(r.estimates().unwrap().switches, 3);
    }

    #[test]
    fn streams_seed_until_probes_have_enough_and_again_once_seeds_are_lost() {
        let r = RouterState::new(Adaptive::new().into());
        r.virtual_clock();
        // A fast disk's stream of 1 MiB reads (0.2 ms each), decided and timed; the seeds
        // counted.
        let mut at = 0u64;
        let mut run = |r: &RouterState, n: u64| {
            let mut seeds = 0;
            for _ in 0..n {
                let d = r.decide(&id(30), at << 20, 1 << 20);
                at += 1;
                assert!(d.sequential && d.route == Route::Disk, "{d:?}");
                seeds += d.fill as u64;
                stream(r, false, 1 << 20, 200);
            }
            seeds
        };
        // One read in SEED_EVERY seeds until the seeds hold STREAM_SEED_RESERVE (2 MiB: two
        // reads); a thousand reads more seed nothing (one in SEED_EVERY would be 15 MiB).
        assert_eq!(run(&r, 2 * SEED_EVERY), 2);
        assert_eq!(run(&r, 1000), 0);
        let kept = r.stream_seeds();
        assert_eq!(
            kept,
            vec![
                (id(30), 256 * (SEED_EVERY - 1), 256 * SEED_EVERY - 1),
                (id(30), 256 * (2 * SEED_EVERY - 1), 256 * (2 * SEED_EVERY) - 1)
            ]
        );
        // A probe that does not find the newest on the lenders leaves it while it is young
        // (its fill may be on its way), and a seed the rule never kept changes nothing.
        let young = RouterState::new(Adaptive::new().into());
        young.virtual_clock();
        let d = (0..SEED_EVERY).map(|i| young.decide(&id(31), i << 20, 1 << 20)).filter(|d| d.fill && d.seed).count();
        assert_eq!(d, 1, "one stream seed in SEED_EVERY reads");
        young.stream_seeds_lost(&young.stream_seeds());
        assert_eq!(young.stream_seeds().len(), 1, "a young seed forgotten");
        r.stream_seeds_lost(&[(id(99), 0, 255)]);
        assert_eq!(r.stream_seeds(), kept);
        // Once past STREAM_SEED_GRACE, a lost seed is forgotten and streams seed again, one
        // read in SEED_EVERY, until the reserve is whole.
        r.skip(STREAM_SEED_GRACE);
        r.stream_seeds_lost(&kept[1..]);
        assert_eq!(r.stream_seeds(), kept[..1]);
        assert_eq!(run(&r, SEED_EVERY), 1);
        assert_eq!(run(&r, 1000), 0);
        assert_eq!(r.stream_seeds().len(), 2);
        // The same range seeded again is kept once: a 4 MiB file read over and over, whose
        // seeds land on its last MiB, seeds it every SEED_EVERY reads (its fill then finds
        // the blocks held and sends nothing) and keeps one seed.
        let r = RouterState::new(Adaptive::new().into());
        let mut seeds = 0;
        for i in 0..10 * SEED_EVERY {
            seeds += r.decide(&id(32), (i % 4) << 20, 1 << 20).fill as u64;
        }
        assert_eq!(seeds, 10);
        assert_eq!(r.stream_seeds(), vec![(id(32), 3 * 256, 4 * 256 - 1)]);
    }

    #[test]
    fn stream_probes_wait_for_the_disk_and_back_off_while_it_keeps_winning() {
        // The raw disk's stream: 128 KiB readahead in 100 µs (1.3 GB/s), against a 1 Gbit/s
        // link whose 1 MiB probe takes 8.5 ms.
        let r = RouterState::new(Adaptive::new().into());
        let mut at = 0u64;
        // Streams on the disk, `n` reads of 100 µs, each decided first; the probes offered
        // and claimed (each fetching 1 MiB in 8.5 ms) and the seeds are counted.
        let mut run = |r: &RouterState, n: u64| {
            let (mut probes, mut seeds) = (0u64, 0u64);
            for _ in 0..n {
                at += 1;
                let d = r.decide(&id(20), at * (128 << 10), 128 << 10);
                assert!(d.sequential && d.route == Route::Disk, "{d:?}");
                seeds += d.fill as u64;
                if d.may_probe_remote && r.claim_remote_probe(&d) {
                    probes += 1;
                    stream_probe(r, 1 << 20, 8_500);
                }
                stream(r, false, 128 << 10, 100);
            }
            (probes, seeds)
        };
        // A short pass (0.2 s): the disk's first window has not closed, so nothing to hold a
        // probe against and no probe, though 20 ms went by many times.
        let (probes, seeds) = run(&r, 2_000);
        assert_eq!(probes, 0, "{:?}", r.estimates());
        // One read in SEED_EVERY seeds until the seeds kept fill their slots (8 × 128 KiB, a
        // probe's 1 MiB); then none.
        assert_eq!(seeds, STREAM_PROBE_SEEDS as u64, "{seeds} seeds");
        // Once the disk's window closed, the lenders are probed; each disk window after the
        // probe finds the disk clearly faster (0.8 against 8.5 ms a MiB, times the margin)
        // and doubles the probes' wait and the seeds' spacing, up to the cap.
        let (probes, _) = run(&r, 40_000);
        assert!(probes >= 1, "{:?}", r.estimates());
        let e = r.estimates().unwrap();
        assert_eq!(e.stream_probe_backoff, STREAM_QUIET_MAX_LEVEL, "{e:?}");
        assert!(e.stream_us_per_mib[0] > 0.0 && e.stream_us_per_mib[2] > 0.0, "{e:?}");
        // Backed off: a minute of the stream (600,000 reads of 100 µs) pays at most two probes
        // (one per 2 × 8.5 ms × PROBE_COST_FACTOR × 64 = 54 s) and one seed in 4,096 reads;
        // without the back-off it would have paid one probe every 0.85 s.
        let (probes, seeds) = run(&r, 600_000);
        assert!(probes <= 2, "{probes} probes in a minute");
        assert!(seeds <= 600_000 / (SEED_EVERY << STREAM_QUIET_MAX_LEVEL) + 1, "{seeds} seeds");
        assert_eq!(r.estimates().unwrap().switches, 0);
        // The disk gets busy: windows at 12.8 ms a MiB, no longer clearly faster than the
        // probes with their margin (12.75 ms) though not slow enough to give the streams
        // away. The back-off ends, and the next read is offered a probe at once, 13 s after
        // the last one (backed off, the wait was 54 s).
        for _ in 0..8 * STREAM_WINDOW_READS {
            stream(&r, false, 128 << 10, 1_600);
            r.skip(WINDOW_TIME / STREAM_WINDOW_READS);
        }
        let e = r.estimates().unwrap();
        assert_eq!((e.stream_probe_backoff, e.stream_remote), (0, false), "{e:?}");
        let d = r.decide(&id(20), (at + 1) * (128 << 10), 128 << 10);
        assert!(d.route == Route::Disk && d.may_probe_remote && r.claim_remote_probe(&d), "{d:?}");
        // And probes that no longer leave the disk clearly faster end it too.
        let r = RouterState::new(Adaptive::new().into());
        for _ in 0..3 * STREAM_WINDOW_READS {
            stream(&r, false, 1 << 20, 800);
            r.skip(WINDOW_TIME / STREAM_WINDOW_READS);
        }
        stream_probe(&r, 1 << 20, 8_500);
        for _ in 0..3 * STREAM_WINDOW_READS {
            stream(&r, false, 1 << 20, 800);
            r.skip(WINDOW_TIME / STREAM_WINDOW_READS);
        }
        assert!(r.estimates().unwrap().stream_probe_backoff >= 2, "{:?}", r.estimates());
        for _ in 0..8 {
            stream_probe(&r, 1 << 20, 200);
        }
        assert_eq!(r.estimates().unwrap().stream_probe_backoff, 0, "{:?}", r.estimates());
    }

    #[test]
    fn a_slow_disk_is_probed_at_a_bounded_cost() {
        let r = RouterState::new(Adaptive::new().into());
        // A slow disk and fast lenders: once the disk's windows hand every read to the
        // lenders (misses measure the disk), the disk is probed rarely.
        for _ in 0..20 {
            r.remote_fetch(4096, Duration::from_micros(100));
        }
        for _ in 0..8 {
            disk_window(&r, 5_000);
        }
        assert_eq!(r.estimates().unwrap().disk_share, 0.0);
        let t = Instant::now();
        let mut probes = 0;
        while t.elapsed() < DISK_PROBE_INTERVAL * 3 {
            let d = r.decide(&id(4), 7 << 20, 4096);
            assert_eq!(d.chosen(), Route::Remote);
            if d.probe {
                assert_eq!(d.route, Route::Disk);
                probes += 1;
                // The probe finds the disk as slow as before: it gets no share.
                r.disk_read(4096, false, Duration::from_millis(5));
            }
        }
        // 5 ms a read: a probe every 50 × 5 ms at most.
        assert!(probes <= 2, "{probes} disk probes");
        assert_eq!(r.estimates().unwrap().disk_share, 0.0);
    }
}
