//! The lender's side of allocation (`[server] allocation`): feeding each tenant's curve
//! estimator from the GET stream, and the timer that asks the allocator
//! (`farcache_policy::alloc`) for targets and hands them to the store as quotas.
//!
//! The timer runs on the server's runtime every `allocation_interval / 5` (10 ms..=1 s); the
//! allocators keep their own cadence (`hit-ratio`: the paper's 3/5/30 s, scaled by
//! `allocation_interval / 5 s`; `mrc`: `allocation_interval`). A tick takes one lock per shard (the counters) and one per
//! tenant estimator; the data path only ever `try_lock`s an estimator.
//!
//! Each tick also hands the store what its swaps across shards need (store.rs,
//! "Placement"): every tenant's minimum, its *value* (predicted hits per block at its
//! target), its *cost* (its curve's marginal hits per block just below the target), both
//! over about the last interval's GETs, and whether it is *short* (its hit ratio over about
//! the last interval is [`SHORT_GAP`] below what the allocator predicts at its target; only
//! `mrc` predicts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use farcache_policy::alloc::hit_ratio::HitRatioConfig;
use farcache_policy::alloc::{self, AllocationKind, Allocator, Curve, MarginalConfig, ShardsMrc, TenantSample};
use parking_lot::Mutex;

use crate::Server;

/// Keys tracked per tenant estimator: about 512 KiB of state, allocated when the tenant first
/// shows up (the allocator's tick, not the data path).
pub const MAX_SAMPLES: usize = 8192;
/// A tenant with no request for this many allocation intervals (30 s by default) is idle:
/// held at its minimum.
pub const IDLE_INTERVALS: u32 = 6;
/// The interval at which `hit-ratio` runs on the paper's clock (3 s decisions, 5 s / 30 s
/// periods); other intervals scale those periods alike (a shorter interval compresses time,
/// for tests and `farcache bench alloc`).
pub const PAPER_INTERVAL: Duration = Duration::from_secs(5);
/// A tenant whose measured hit ratio (over about the last interval) is this far below what
/// its curve predicts at its target is *short*: a placement loss the store's swaps across
/// shards may fix (store.rs, "Placement").
pub const SHORT_GAP: f64 = 0.02;
/// The store's unit of value and cost (`Store::set_tenant_value`): 2^-32 of a hit per
/// block, over the moving window of recent GETs (a half-life of one interval).
const VALUE_UNIT: f64 = 4_294_967_296.0;
/// A tenant's cost (what one block less costs it) is its curve's slope over the last
/// `capacity / COST_SPAN` blocks below its target: wide enough to see a cliff just below
/// it (a loop that barely fits), narrow enough to be marginal.
const COST_SPAN: u64 = 64;
/// Sizes, in fractions of capacity, at which STATS show each tenant's predicted hit ratio.
pub const PREDICTED_AT: [f64; 4] = [0.125, 0.25, 0.5, 1.0];

/// One tenant's key sampling for its curve estimator. See `Store::get`.
#[derive(Default)]
pub struct Sampler {
    /// The estimator's sampling threshold; 0 while it has none (nothing is sampled).
    threshold: AtomicU64,
    estimator: Mutex<Option<Box<ShardsMrc>>>,
    /// Sampled GETs not counted because the estimator was busy (`try_lock` failed).
    busy: AtomicU64,
}

impl Sampler {
    /// A GET of the key with this store hash. Allocation-free; never waits.
    #[inline]
    pub fn observe(&self, hash: u64) {
        let threshold = self.threshold.load(Ordering::Relaxed);
        if threshold == 0 || !ShardsMrc::is_sampled(threshold, hash) {
            return;
        }
        match self.estimator.try_lock() {
            Some(mut guard) => {
                if let Some(e) = guard.as_mut() {
                    e.access(hash);
                    self.threshold.store(e.threshold(), Ordering::Relaxed);
                }
            }
            None => {
                self.busy.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Heap bytes of the estimator (0 until it starts).
    pub fn memory_bytes(&self) -> usize {
        self.estimator.lock().as_ref().map_or(0, |e| e.memory_bytes())
    }

    /// Start estimating, for a lender of `capacity` blocks (once). Returns whether it
    /// started now.
    fn start(&self, capacity: u64) -> bool {
        let mut g = self.estimator.lock();
        if g.is_some() {
            return false;
        }
        let e = ShardsMrc::new(capacity, MAX_SAMPLES);
        self.threshold.store(e.threshold(), Ordering::Relaxed);
        *g = Some(Box::new(e));
        true
    }

    /// The curve so far, given that `gets` accesses of the tenant (GET hits and fills: the
    /// store's module docs) were made since the last call
    /// (the SHARDS-adj correction); then older accesses weigh `decay` times less.
    fn curve(&self, gets: u64, decay: f64) -> Curve {
        match self.estimator.lock().as_mut() {
            Some(e) => {
                e.offered(gets);
                let c = e.curve();
                e.decay(decay);
                c
            }
            None => Curve::default(),
        }
    }
}

/// What STATS show of one tenant's allocation.
#[derive(Clone, Debug, Default)]
pub struct TenantView {
    pub target_bytes: u64,
    pub min_bytes: u64,
    pub weight: u32,
    /// The allocator's prediction at the target (mrc), for the closed-loop check.
    pub predicted_hit_ratio: Option<f64>,
    /// (bytes, predicted hit ratio) at [`PREDICTED_AT`] of capacity (mrc).
    pub predicted: Vec<(u64, f64)>,
}

/// The allocator and what it last decided.
pub struct Allocation {
    kind: AllocationKind,
    interval: Duration,
    started: Instant,
    state: Mutex<State>,
}

struct State {
    allocator: Box<dyn Allocator>,
    samples: Vec<TenantSample>,
    targets: Vec<u64>,
    /// Per tenant: requests counted at the last tick and when that count last changed.
    seen: Vec<(u64, Duration)>,
    last_tick: Option<Duration>,
    views: Vec<TenantView>,
    /// Per tenant: the running mean of (measured − predicted) hit ratio, and the last gap if
    /// it departed from it ([`phase_shift`]).
    gaps: Vec<(Option<f64>, Option<f64>)>,
    /// Per tenant: (hits, GETs, target, blocks held) since its last comparison, until there
    /// are [`PHASE_MIN_GETS`] (a slow tenant is compared over several ticks); started afresh
    /// when its target changes, when the blocks it holds move by more than [`settled_slack`]
    /// (it is filling or draining: its hit ratio follows its memory, not its workload), or
    /// when there is no prediction to compare with.
    pending: Vec<(u64, u64, u64, u64)>,
    /// Per tenant: a phase change found before this time, [`SETTLE_INTERVALS`] after its
    /// target or holding last moved, does not restart its curve young.
    settle: Vec<Duration>,
    /// Per tenant: (GETs, time) when its curve last started from nothing (its estimator's
    /// start or a phase change), for [`mature`].
    young: Vec<(u64, Duration)>,
    /// Per tenant: the last curve it was planned with ([`planned_curve`]).
    last_curve: Vec<Option<Curve>>,
    /// Per tenant: GET hits and GETs, moving sums with a half-life of one interval (its
    /// measured hit ratio, against the prediction, for `Store::set_tenant_short`).
    recent: Vec<(f64, f64)>,
}

/// A curve shows a reuse distance only after the tenant has made that many GETs: until it
/// has made as many as the lender has blocks, a curve of mostly first accesses says "no
/// reuse seen yet", not "memory is worth nothing" (a loop over half the lender is all cold
/// misses for its first pass). So a curve counts as measured once the tenant has made
/// `capacity` GETs since it started from nothing, or after this many intervals if it shows
/// some reuse already or is *slow* — at its pace it would take more than [`SLOW_INTERVALS`]
/// to make them (a slow tenant, whose curve is worth little to the others, is not held at
/// its static share for long). A curve with no reuse at all from a tenant that is not slow
/// waits: measured at one interval whatever it showed, a loop over 60% of the lender a few
/// GETs short of its first reuse looked like a scan, worth nothing at any size, and gave
/// its memory away (bench alloc's loop scenario lost up to 5,700 misses in its first tenth
/// so, in about one run in five).
pub const MATURE_INTERVALS: u32 = 1;
/// A tenant that would take more than this many intervals to make `capacity` GETs is slow.
pub const SLOW_INTERVALS: f64 = 4.0;

/// Whether a curve started at `young` = (GETs, time) is mature at `now` with `gets` GETs
/// made, given whether it shows any reuse (`reuses`).
pub fn mature(
    young: (u64, Duration),
    gets: u64,
    now: Duration,
    capacity: u64,
    interval: Duration,
    reuses: bool,
) -> bool {
    let made = gets.saturating_sub(young.0);
    let age = now.saturating_sub(young.1);
    let intervals = age.as_secs_f64() / interval.as_secs_f64().max(1e-9);
    let slow = (made as f64) * SLOW_INTERVALS < capacity as f64 * intervals;
    made >= capacity || (age >= interval * MATURE_INTERVALS && (reuses || slow))
}

/// The curve a tenant is planned with: the estimator's, once it is `ripe` ([`mature`]) — or,
/// when the estimator holds too few samples to draw one (`MIN_CURVE_ACCESSES`: a tenant that
/// asks little, whose samples decayed away or were cut by a phase change's decay), the last
/// curve the tenant was planned with, if it had one: its shape is still the best known, and
/// its request rate says what it is worth now. Without it, a tenant that had finished its
/// work and then made a trickle of requests (a database's checkpointer) counted as not yet
/// measured, and an active tenant not yet measured is held at its static share: in `bench
/// paper --experiment tenants` (session 19) a third of the lender for a minute, for a tenant
/// holding 4 MiB. A curve not `ripe` is not measured, whatever the estimator holds.
pub fn planned_curve(fresh: Curve, ripe: bool, last: &mut Option<Curve>) -> Curve {
    let mut c = match *last {
        Some(old) if ripe && !fresh.valid => old,
        _ => fresh,
    };
    c.valid &= ripe;
    if c.valid {
        *last = Some(c);
    }
    c
}

/// A tick's measured hit ratio that departs from the running mean of (measured − predicted)
/// by more than this is a phase change: the tenant's curve forgets its past at once.
pub const PHASE_SHIFT: f64 = 0.15;
/// GETs a comparison needs (fewer are noise); they accumulate over ticks.
pub const PHASE_MIN_GETS: u64 = 256;
/// How much of the past a tenant's curve keeps after a phase change.
pub const PHASE_DECAY: f64 = 0.05;

/// Blocks a tenant's holding may move during one comparison of the closed loop: more, and
/// it is filling or draining, so its hit ratio says more about its memory's warm-up than
/// about its workload (a loop given the last blocks it needs hits more every pass for a
/// while; read as a phase change, that reset its curve and froze its target for an
/// interval). One 64th of the lender, at least one block per shard's worth of rounding.
pub fn settled_slack(capacity: u64) -> u64 {
    (capacity / 64).max(1)
}

/// After a tenant's target or holding moved, a phase change found in its comparisons
/// restarts its curve young only after this many intervals: the lender's S3-FIFO takes a
/// pass or two of a tenant's working set to settle into new memory (a loop given more hits
/// more every pass; measured, the same loop first hit 0.97 and then 0.77 of its GETs at one
/// target), and the LRU curve does not predict that. The curve still forgets its past.
pub const SETTLE_INTERVALS: f64 = 0.5;

/// What a detected phase change does to a tenant's curve: it always forgets its past
/// ([`PHASE_DECAY`]); it starts again *young* (not measured, held at least at its static
/// share until it matures: [`mature`]) only when the tenant now hits *less* than its curve
/// predicted, and less than its usual gap ([`phase_shift`]'s mean) — its working set grew or
/// moved, and a curve of first accesses would say its memory is worth nothing — and its
/// memory has been still for [`SETTLE_INTERVALS`] (a tenant whose memory just moved hits
/// what its memory's warm-up gives, not what its workload does). A tenant that hits *more*
/// than predicted (its working set shrank, or its memory warmed up) keeps a measured curve:
/// its new accesses are reuses the
/// curve sees at once, and holding it at its static share would take memory back from the
/// tenant that needs it (the phase scenario: the shrunk tenant raised to half the lender
/// twice after the other had been given its memory).
pub fn phase_restarts_young(old_mean: f64, gap: f64) -> bool {
    gap < old_mean && gap < 0.0
}

/// The closed loop on one tenant's prediction: given the running mean of its gap (measured −
/// predicted hit ratio), whether the last comparison already departed from it, and this
/// comparison's gap: whether the workload changed phase, the new mean, and whether this one
/// departs. A steady bias (the lender's S3-FIFO hits more than the LRU curve predicts on
/// scans) moves into the mean and is no change; a jump away from it is, once two comparisons
/// in a row depart the same way (one noisy window is not).
pub fn phase_shift(mean: Option<f64>, departed: Option<f64>, gap: f64) -> (bool, f64, Option<f64>) {
    match mean {
        None => (false, gap, None),
        Some(m) if (gap - m).abs() > PHASE_SHIFT => match departed {
            Some(d) if (d - m).signum() == (gap - m).signum() => (true, gap, None),
            _ => (false, m, Some(gap)),
        },
        Some(m) => (false, 0.7 * m + 0.3 * gap, None),
    }
}

impl Allocation {
    pub fn new(kind: AllocationKind, interval: Duration) -> Allocation {
        let scale = interval.as_secs_f64() / PAPER_INTERVAL.as_secs_f64();
        let paper = HitRatioConfig::PAPER;
        let allocator: Box<dyn Allocator> = match kind {
            AllocationKind::Mrc => Box::new(alloc::Marginal::new(MarginalConfig { interval, ..Default::default() })),
            AllocationKind::HitRatio => Box::new(alloc::HitRatio::new(HitRatioConfig {
                decide_every: paper.decide_every.mul_f64(scale),
                period_below: paper.period_below.mul_f64(scale),
                period_full: paper.period_full.mul_f64(scale),
                ..paper
            })),
            k => alloc::new_allocator(k),
        };
        Allocation {
            kind,
            interval,
            started: Instant::now(),
            state: Mutex::new(State {
                allocator,
                samples: vec![],
                targets: vec![],
                seen: vec![],
                last_tick: None,
                views: vec![],
                gaps: vec![],
                pending: vec![],
                settle: vec![],
                young: vec![],
                last_curve: vec![],
                recent: vec![],
            }),
        }
    }

    pub fn kind(&self) -> AllocationKind {
        self.kind
    }

    /// Whether targets move at run time (everything but `shared`, whose targets are limits).
    pub fn is_dynamic(&self) -> bool {
        self.kind != AllocationKind::Shared
    }

    /// Time between two ticks of the timer.
    pub fn tick_period(&self) -> Duration {
        (self.interval / 5).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// What STATS show of tenant `id` (limits stand in for targets before the first tick).
    pub fn view(&self, id: usize) -> Option<TenantView> {
        self.state.lock().views.get(id).cloned()
    }

    /// One tick: measure, decide, and hand the targets to the store.
    pub fn tick(&self, server: &Server) {
        let store = server.store();
        let slot = u64::from(store.slot_bytes());
        let capacity = store.capacity_slots();
        let tenants = server.tenants().allocation_snapshot();
        let counters = store.all_counters(tenants.len());
        let now = self.started.elapsed();
        let mut st = self.state.lock();
        let st = &mut *st;
        let secs = st.last_tick.map_or(0.0, |l| now.saturating_sub(l).as_secs_f64());
        st.last_tick = Some(now);
        // Curves forget with a half-life of six decisions, so a phase change shows within a
        // few intervals while one interval's noise does not.
        let decay = 0.5f64.powf(secs / (6.0 * self.interval.as_secs_f64()).max(1e-3));
        let n = tenants.len();
        st.samples.resize(n, TenantSample::default());
        st.targets.resize(n, 0);
        st.seen.resize(n, (0, now));
        st.views.resize(n, TenantView::default());
        st.gaps.resize(n, (None, None));
        st.pending.resize(n, (0, 0, 0, 0));
        st.settle.resize(n, now);
        st.young.resize(n, (0, now));
        st.last_curve.resize(n, None);
        st.recent.resize(n, (0.0, 0.0));
        let weight = 1.0 - 0.5f64.powf(secs / self.interval.as_secs_f64().max(1e-3));
        for (i, (t, c)) in tenants.iter().zip(&counters).enumerate() {
            let requests = c.hits + c.misses + c.puts;
            // What the allocators see as the tenant's misses: its fills, not its GET misses
            // (`TenantCounters::fills`; the store's module docs).
            let misses = c.fills();
            if requests != st.seen[i].0 {
                st.seen[i] = (requests, now);
            }
            let s = &mut st.samples[i];
            s.active = now.saturating_sub(st.seen[i].1) < self.interval * IDLE_INTERVALS;
            s.min_blocks = t.min_bytes.div_ceil(slot);
            s.max_blocks = t.limit_bytes / slot;
            s.weight = t.weight;
            s.used_blocks = c.blocks;
            if let Some(sampler) = store.sampler(i as u16) {
                // GETs since the last tick, none before the estimator existed.
                let started = sampler.start(capacity);
                if started {
                    st.young[i] = (c.hits + misses, now);
                }
                let gets = if started { 0 } else { (c.hits + misses).saturating_sub(s.hits + s.misses) };
                let mut decay = decay;
                let pending = &mut st.pending[i];
                let predicted = st.allocator.predicted_hit_ratio(i);
                let moved = pending.2 != st.targets[i] || c.blocks.abs_diff(pending.3) > settled_slack(capacity);
                if moved {
                    st.settle[i] = now + self.interval.mul_f64(SETTLE_INTERVALS);
                }
                if started || predicted.is_none() || moved {
                    *pending = (0, 0, st.targets[i], c.blocks);
                } else {
                    *pending = (pending.0 + c.hits.saturating_sub(s.hits), pending.1 + gets, pending.2, pending.3);
                }
                if let Some(predicted) = predicted.filter(|_| pending.1 >= PHASE_MIN_GETS) {
                    let measured = pending.0 as f64 / pending.1 as f64;
                    *pending = (0, 0, st.targets[i], c.blocks);
                    let old_mean = st.gaps[i].0;
                    let (shifted, mean, departed) = phase_shift(old_mean, st.gaps[i].1, measured - predicted);
                    st.gaps[i] = (Some(mean), departed);
                    if shifted {
                        let young =
                            now >= st.settle[i] && phase_restarts_young(old_mean.unwrap_or(0.0), measured - predicted);
                        tracing::debug!(
                            tenant = i,
                            measured,
                            predicted,
                            young,
                            "phase change: the curve forgets its past"
                        );
                        decay = decay.min(PHASE_DECAY);
                        if young {
                            st.young[i] = (c.hits + misses, now);
                        }
                    }
                }
                let fresh = sampler.curve(gets, decay);
                let reuses = fresh.hit_ratio_at(capacity as f64) >= alloc::marginal::NO_REUSE;
                let ripe = mature(st.young[i], c.hits + misses, now, capacity, self.interval, reuses);
                s.curve = planned_curve(fresh, ripe, &mut st.last_curve[i]);
            }
            if self.is_dynamic() {
                store.set_tenant_floor(i as u16, s.min_blocks);
            }
            let (h, g) = st.recent[i];
            let keep = 1.0 - weight;
            st.recent[i] = (
                h * keep + c.hits.saturating_sub(s.hits) as f64,
                g * keep + (c.hits + misses).saturating_sub(s.hits + s.misses) as f64,
            );
            s.hits = c.hits;
            s.misses = misses;
        }
        st.allocator.decide(now, capacity, &st.samples, &mut st.targets);
        for (i, s) in st.samples.iter().enumerate() {
            let (h, g) = st.recent[i];
            tracing::debug!(
                t_ms = now.as_millis() as u64,
                tenant = i,
                target = st.targets[i],
                used = s.used_blocks,
                active = s.active,
                measured = s.curve.valid,
                at_target = s.curve.hit_ratio_at(st.targets[i] as f64),
                predicted = st.allocator.predicted_hit_ratio(i).unwrap_or(-1.0),
                ideal = st.allocator.ideal_target(i).map_or(-1, |x| x as i64),
                recent_hit_ratio = if g > 0.0 { h / g } else { -1.0 },
                recent_gets = g,
                "allocation"
            );
        }
        for (i, t) in tenants.iter().enumerate() {
            if self.is_dynamic() {
                store.set_tenant_limit(i as u16, st.targets[i] * slot);
                let (h, g) = st.recent[i];
                let s = &st.samples[i];
                let predicted = st.allocator.predicted_hit_ratio(i);
                let short = predicted.is_some_and(|p| g >= 1.0 && p - h / g > SHORT_GAP);
                let target = st.targets[i] as f64;
                // Value: the predicted hits per block at the target (measured where there is
                // no prediction); cost: the marginal hits per block just below the target.
                let value = predicted.map_or(h, |p| p * g) / target.max(1.0);
                let cost = if s.curve.valid {
                    let d = (capacity / COST_SPAN).max(1) as f64;
                    let lower = s.curve.hit_ratio_at((target - d).max(0.0));
                    g * (s.curve.hit_ratio_at(target) - lower).max(0.0) / d
                } else {
                    h / s.used_blocks.max(1) as f64
                };
                store.set_tenant_value(i as u16, (value * VALUE_UNIT) as u64, (cost * VALUE_UNIT) as u64);
                store.set_tenant_short(i as u16, short);
            }
            let s = &st.samples[i];
            st.views[i] = TenantView {
                target_bytes: st.targets[i] * slot,
                min_bytes: t.min_bytes,
                weight: s.weight,
                predicted_hit_ratio: st.allocator.predicted_hit_ratio(i),
                predicted: if s.curve.valid {
                    PREDICTED_AT
                        .iter()
                        .map(|f| {
                            let blocks = (capacity as f64 * f) as u64;
                            (blocks * slot, s.curve.hit_ratio_at(blocks as f64))
                        })
                        .collect()
                } else {
                    vec![]
                },
            };
        }
    }
}

/// Tick the allocator until `close` turns true.
pub(crate) async fn run(server: std::sync::Arc<Server>, mut close: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(server.allocation().tick_period());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => server.allocation().tick(&server),
            _ = close.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Store, StoreConfig};
    use farcache_policy::PolicyKind;
    use farcache_wire::Key;

    #[test]
    fn a_measured_tenant_that_asks_too_little_for_a_curve_keeps_its_last_one() {
        let shaped = |valid: bool, at_half: f32| {
            let mut c = Curve { valid, unit_blocks: 1.0, ..Curve::default() };
            for (k, m) in c.miss_ratio.iter_mut().enumerate() {
                *m = if k == 0 { 1.0 } else { at_half };
            }
            c
        };
        let mut last = None;
        // Never measured: an empty estimator gives an unmeasured curve, ripe or not.
        assert!(!planned_curve(shaped(false, 1.0), true, &mut last).valid);
        assert!(last.is_none());
        // Measured: kept.
        let good = shaped(true, 0.3);
        assert_eq!(planned_curve(good, true, &mut last), good);
        assert_eq!(last, Some(good));
        // Its samples decayed below the estimator's minimum: planned with the last curve.
        assert_eq!(planned_curve(shaped(false, 1.0), true, &mut last), good);
        // Not ripe (a phase change restarted it young): unmeasured, whatever it had.
        assert!(!planned_curve(shaped(true, 0.5), false, &mut last).valid);
        assert!(!planned_curve(shaped(false, 1.0), false, &mut last).valid);
        // A new measured curve replaces the old one.
        let newer = shaped(true, 0.6);
        assert_eq!(planned_curve(newer, true, &mut last), newer);
        assert_eq!(last, Some(newer));
    }

    #[test]
    fn a_tenant_that_reads_back_what_it_filled_shows_reuse() {
        // As a mount does: it PUTs each block it read from its disk, and GETs only blocks it
        // stored. Its every GET hits, a reuse 1,000 accesses after the block's PUT; counted from
        // GETs alone, the curve saw 1,000 first accesses (a scan) and said memory was worthless.
        let cfg =
            StoreConfig { shards: 4, slots_per_shard: 1024, slot_bytes: 64, policy: PolicyKind::Lru, max_tenants: 2 };
        let mut store = Store::new(cfg);
        store.enable_sampling(2);
        let capacity = store.capacity_slots();
        store.set_tenant_limit(0, capacity * 64);
        assert!(store.sampler(0).unwrap().start(capacity));
        let key = |b: u64| Key::new(7, b, 1);
        for b in 0..1000 {
            store.put(0, &key(b), &[1u8; 64]);
        }
        for b in 0..1000 {
            assert!(store.get(0, &key(b), |_| ()));
        }
        // GETs of blocks it never stored miss and are not accesses: the fill that follows a
        // miss is.
        for b in 5000..5100 {
            assert!(!store.get(0, &key(b), |_| ()));
        }
        let c = store.sampler(0).unwrap().curve(2000, 1.0);
        assert!(c.valid, "{c:?}");
        // Half the accesses (the GETs) reuse a block 1,000 distinct blocks back.
        let (all, half) = (c.hit_ratio_at(capacity as f64), c.hit_ratio_at(500.0));
        assert!((0.4..=0.6).contains(&all), "hit ratio {all} at the capacity: {c:?}");
        assert!(half < 0.15, "hit ratio {half} at half the working set: {c:?}");
    }

    #[test]
    fn a_curve_matures_after_capacity_gets_or_an_interval_if_it_reuses_or_is_slow() {
        let (cap, iv) = (1000, Duration::from_secs(5));
        let young = (500, Duration::from_secs(10));
        // 999 GETs within 4 s: not yet (a loop of 1000 would not have shown its reuse).
        assert!(!mature(young, 1499, Duration::from_secs(14), cap, iv, true));
        assert!(mature(young, 1500, Duration::from_secs(11), cap, iv, false));
        // A slow tenant: an interval is enough whatever it asked.
        assert!(mature(young, 510, Duration::from_secs(15), cap, iv, false));
        // One that reuses: an interval is enough.
        assert!(mature(young, 1100, Duration::from_secs(15), cap, iv, true));
        // One that would make its 1000 GETs within four intervals and shows no reuse yet
        // waits for them: 600 GETs in 5 s (a loop over 700 blocks not yet come round).
        assert!(!mature(young, 1100, Duration::from_secs(15), cap, iv, false));
        assert!(!mature(young, 1499, Duration::from_secs(20), cap, iv, false));
        // 999 GETs in nine intervals: slow after all.
        assert!(mature(young, 1499, Duration::from_secs(55), cap, iv, false));
    }

    #[test]
    fn only_a_tenant_hitting_less_than_predicted_restarts_young() {
        // Its working set grew: it hits 0.4 below the curve, where it used to hit 0.05 above.
        assert!(phase_restarts_young(0.05, -0.4));
        // It hits more than predicted: its working set shrank, or its memory warmed up (a loop
        // the LRU curve predicts 0 for below its cliff, hitting 0.97 then 0.77 under S3-FIFO).
        assert!(!phase_restarts_young(0.97, 0.77));
        assert!(!phase_restarts_young(-0.5, 0.2));
        // Below the prediction but above its usual gap: no new reason to distrust the curve.
        assert!(!phase_restarts_young(-0.5, -0.2));
    }

    #[test]
    fn a_jump_in_the_prediction_gap_is_a_phase_change_a_steady_bias_is_not() {
        // A tenant the curve under-predicts by 0.2 every comparison (S3-FIFO on a scan): no
        // change.
        let (mut mean, mut departed) = (None, None);
        for _ in 0..20 {
            let (shifted, m, d) = phase_shift(mean, departed, 0.2);
            assert!(!shifted);
            (mean, departed) = (Some(m), d);
        }
        // Small noise around it: still none.
        for g in [0.25, 0.15, 0.22, 0.18] {
            let (shifted, m, d) = phase_shift(mean, departed, g);
            assert!(!shifted, "{g}");
            (mean, departed) = (Some(m), d);
        }
        // One noisy window far off, then back: no change, and the mean did not move.
        let (shifted, m, d) = phase_shift(mean, departed, -0.3);
        assert!(!shifted && d == Some(-0.3) && m == mean.unwrap());
        let (shifted, m, d) = phase_shift(Some(m), d, 0.21);
        assert!(!shifted && d.is_none());
        (mean, departed) = (Some(m), d);
        // Its working set grew: measured drops 0.5 below what the curve said, twice.
        let (shifted, m, d) = phase_shift(mean, departed, -0.3);
        assert!(!shifted);
        let (shifted, m, d) = phase_shift(Some(m), d, -0.32);
        assert!(shifted);
        // The new gap is the new mean: the next comparisons of the new phase are no change.
        assert_eq!(m, -0.32);
        assert!(!phase_shift(Some(m), d, -0.28).0);
    }
}
