//! Memory by marginal benefit over miss-ratio curves (`allocation = "mrc"`).
//!
//! Every interval, each tenant's value of `x` blocks is `weight × rate × (1 - mr(x))`: the
//! GET hits per second it would have at `x` (its request rate at this lender times its
//! curve's hit ratio), so request rates count and not only ratios. The *ideal* allocation
//! starts every tenant at its minimum and hands out the rest by the steepest slope of each
//! tenant's **upper convex hull** of that value from its minimum to its limit: a curve with a
//! cliff (a loop slightly larger than its share gains nothing until the whole loop fits) is
//! judged by the straight line across the cliff, so the greedy walk neither starves it nor
//! stops halfway up. On concave hulls the greedy walk is optimal for the hulls. Capacity no
//! slope wants (every curve flat) is split by weight among the active tenants that reuse
//! anything (a curve flat at its top may not have seen its longest reuses yet; a scan gains
//! nothing at any size), then among all active tenants.
//!
//! The targets then move towards the ideal:
//! - *bounded where it costs hits*: at most `max_move_percent` of capacity per decision is
//!   taken from tenants above their ideal. Not counted against that bound, because none of
//!   them evicts a warm block for another tenant's gain: raising a tenant to its minimum,
//!   handing out capacity no target claims, the part of a donor's target it does not hold
//!   (`used_blocks` below its target), and the part whose loss costs less than
//!   [`FLAT_LOSS`] of the lender's hits by the donor's curve and request rate (a tenant
//!   whose working set shrank in a phase change, that holds blocks it does not reuse, or
//!   that stopped asking);
//! - *with hysteresis*: no move at all unless the ideal's predicted hits exceed the current
//!   targets' by `hysteresis_percent` — or, near a 100% hit ratio, by
//!   [`HYSTERESIS_MISS_SHARE`] of the predicted misses, if that is less —, so estimation
//!   noise does not shuffle memory; once a move starts it continues towards the ideal until
//!   what is left is worth a quarter of that (the ideal of stationary input is fixed, so the
//!   targets approach it monotonically and stop: no oscillation);
//! - *idle tenants* (inactive), tenants gone quiet ([`QUIET_FRACTION`]) and tenants that
//!   reuse nothing are planned at their minimum (or what no slope wants), and reclaiming
//!   their memory bypasses the hysteresis;
//! - *between decisions*, free moves only (never the bound's budget), when the last decision
//!   is out of date: a tenant went quiet, or a tenant's curve became measured (so that the
//!   memory others have not filled yet goes where the curves say before they fill it).
//!
//! Tenants whose curve is not yet measured keep their current target, at least their
//! minimum and their static share (capacity split by weight among the active tenants), and
//! take part only in the split of what no slope wants.

use std::time::Duration;

use super::{clamp, fill_by_weight, Allocator, Deltas, TenantSample};

#[derive(Clone, Copy, Debug)]
pub struct MarginalConfig {
    /// Time between decisions.
    pub interval: Duration,
    /// Most capacity taken from tenants per decision, in percent.
    pub max_move_percent: f64,
    /// Predicted gain (percent of current predicted hits) below which nothing moves.
    pub hysteresis_percent: f64,
}

impl Default for MarginalConfig {
    fn default() -> Self {
        MarginalConfig { interval: Duration::from_secs(5), max_move_percent: 2.0, hysteresis_percent: 1.0 }
    }
}

/// Blocks whose removal costs less than this part of the lender's hits (by the donor's
/// curve and request rate) are taken without counting against the per-decision bound.
pub const FLAT_LOSS: f64 = 0.001;

/// The hysteresis on a lender near a 100% hit ratio: a move starts when it promises this
/// share of the predicted misses, if that is less than `hysteresis_percent` of the hits.
pub const HYSTERESIS_MISS_SHARE: f64 = 0.1;

/// A tenant that made no GET for this part of an interval (and for four of its mean gaps
/// between GETs, while the others asked) is *quiet*: its request rate counts as 0 from then
/// on, and what it holds above its ideal is reclaimed at once, between decisions and outside
/// the bound (a tenant that stopped asking loses no hits by it). Before, that took until a
/// decision had seen a whole interval without its GETs: up to two intervals after it
/// stopped. Half an interval reclaimed sooner in bench alloc's idle scenario (about 500
/// misses of its second tenth) but read a loaded machine's stalls as silence.
pub const QUIET_FRACTION: f64 = 1.0;

/// One piece of a tenant's hull: `blocks` more blocks gain `slope` hits/s each.
#[derive(Clone, Copy, Debug)]
struct Segment {
    tenant: usize,
    blocks: u64,
    slope: f64,
}

pub struct Marginal {
    cfg: MarginalConfig,
    last: Option<Duration>,
    deltas: Deltas,
    /// Requests per second per tenant, smoothed over two intervals (0 after an interval
    /// without any).
    rate: Vec<f64>,
    predicted: Vec<Option<f64>>,
    ideal: Vec<u64>,
    segments: Vec<Segment>,
    hull: Vec<(f64, f64)>,
    /// A move to the ideal is under way (the hysteresis was passed once).
    moving: bool,
    /// Per tenant: its GETs so far, when that count last changed, and the GETs of all
    /// tenants then (for [`Self::quiet`]).
    heard: Vec<(u64, Duration, u64)>,
    /// GETs of all tenants so far.
    all_gets: u64,
    /// Per tenant: whether its curve was measured at the last call (decision or not).
    was_valid: Vec<bool>,
}

impl Marginal {
    pub fn new(cfg: MarginalConfig) -> Self {
        Marginal {
            cfg,
            last: None,
            deltas: Deltas::default(),
            rate: vec![],
            predicted: vec![],
            ideal: vec![],
            segments: vec![],
            hull: vec![],
            moving: false,
            heard: vec![],
            all_gets: 0,
            was_valid: vec![],
        }
    }

    /// Whether tenant `i` has gone quiet ([`QUIET_FRACTION`]): no GET for that part of an
    /// interval, nor for four of its mean gaps between GETs at its last measured rate (so a
    /// slow tenant's ordinary pauses are not silence), while the other tenants went on
    /// asking — at least half what the lender's last measured rate says they would in that
    /// time (a lender, or a machine, that stalled silences every tenant at once: measured,
    /// bench alloc's rounds falling behind on a loaded machine took one of three identical
    /// tenants down to 524 blocks for a tenth of the run). A quiet tenant gains nothing from
    /// memory now: its rate counts as 0 at once, and its memory above its ideal is free to
    /// give between decisions.
    fn quiet(&self, i: usize, now: Duration) -> bool {
        let Some(&(gets, since, all_then)) = self.heard.get(i) else { return false };
        let rate = self.rate.get(i).copied().unwrap_or(0.0);
        if gets == 0 {
            return false;
        }
        let gap = if rate > 0.0 { Duration::from_secs_f64((4.0 / rate).min(3600.0)) } else { Duration::ZERO };
        let silent = now.saturating_sub(since);
        if silent < self.cfg.interval.mul_f64(QUIET_FRACTION).max(gap) {
            return false;
        }
        let others: f64 = self.rate.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, r)| r).sum();
        (self.all_gets.saturating_sub(all_then) as f64) >= 0.5 * others * silent.as_secs_f64()
    }

    /// Note every tenant's GETs at `now` (for [`Self::quiet`]).
    fn hear(&mut self, now: Duration, tenants: &[TenantSample]) {
        self.all_gets = tenants.iter().map(|s| s.hits + s.misses).sum();
        self.heard.resize(tenants.len(), (0, now, self.all_gets));
        for (h, s) in self.heard.iter_mut().zip(tenants) {
            let gets = s.hits + s.misses;
            if gets != h.0 {
                *h = (gets, now, self.all_gets);
            }
        }
    }

    /// The ideal of the last decision (for the stats and tests).
    pub fn ideal(&self) -> &[u64] {
        &self.ideal
    }

    /// Predicted hits per second of `tenant` at `blocks` (weighted).
    fn value(&self, s: &TenantSample, i: usize, blocks: u64) -> f64 {
        if !s.curve.valid {
            return 0.0;
        }
        f64::from(s.weight.max(1)) * self.rate[i] * s.curve.hit_ratio_at(blocks as f64)
    }

    /// Tenant `i`'s share of the lender's (weighted) request rate, in 0..=1 (1 when no
    /// tenant asks anything: then every loss counts in full).
    pub fn rate_share(&self, tenants: &[TenantSample], i: usize) -> f64 {
        let w = |j: usize| f64::from(tenants[j].weight.max(1)) * self.rate.get(j).copied().unwrap_or(0.0);
        let total: f64 = (0..tenants.len()).map(w).sum();
        if total <= 0.0 {
            1.0
        } else {
            w(i) / total
        }
    }

    /// How many blocks tenant `s` can give from `target` down towards `ideal` without costing
    /// hits: what it targets but does not hold, or more where the hits it loses are under
    /// [`FLAT_LOSS`] of the lender's: a loss of hit ratio `Δ` costs `Δ × share` of the
    /// lender's hits, `share` being its part of the request rate ([`Self::rate_share`]). So a
    /// flat curve (a tenant whose working set shrank, or that holds blocks it does not reuse)
    /// gives at once, and so does a tenant that stopped asking (share 0), whatever its curve.
    pub fn free_to_give(s: &TenantSample, share: f64, target: u64, ideal: u64) -> u64 {
        let over = target.saturating_sub(ideal);
        let unheld = target.saturating_sub(s.used_blocks).min(over);
        if !s.curve.valid || over == 0 {
            return unheld;
        }
        if share <= 0.0 {
            return over;
        }
        let allowed = FLAT_LOSS / share.min(1.0);
        let at = s.curve.hit_ratio_at(target as f64);
        // The loss grows with the blocks taken (hit ratios never fall as memory grows): the
        // largest k with a loss under `allowed`, by bisection.
        let (mut lo, mut hi) = (0u64, over + 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if at - s.curve.hit_ratio_at((target - mid) as f64) < allowed {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo.max(unheld)
    }

    /// The gain (predicted hits per second) a move must promise to start: `hysteresis_percent`
    /// of the hits predicted at the targets — or, when that is more than
    /// [`HYSTERESIS_MISS_SHARE`] of the misses predicted there, that share of the misses. A
    /// lender near a 100% hit ratio otherwise leaves a move that would avoid half its misses
    /// undone because it is worth under 1% of its hits (measured: the 100:1 scenario held
    /// 3,904 blocks of 4,096 for the fast tenant against an ideal of 4,064, for about 300
    /// misses per tenth of the run).
    fn threshold(&self, tenants: &[TenantSample], now_value: f64) -> f64 {
        let requests: f64 = tenants.iter().enumerate().map(|(i, s)| self.value_of_all(s, i)).sum();
        let misses = (requests - now_value).max(0.0);
        (self.cfg.hysteresis_percent / 100.0 * now_value).min(HYSTERESIS_MISS_SHARE * misses).max(1e-9)
    }

    /// The (weighted) requests per second of a measured tenant: its value were every GET a hit.
    fn value_of_all(&self, s: &TenantSample, i: usize) -> f64 {
        if !s.curve.valid {
            return 0.0;
        }
        f64::from(s.weight.max(1)) * self.rate[i]
    }

    /// What each tenant can give towards the ideal without costing hits
    /// ([`Self::free_to_give`]).
    fn free(&self, tenants: &[TenantSample], targets: &[u64]) -> Vec<u64> {
        tenants
            .iter()
            .enumerate()
            .map(|(i, s)| Self::free_to_give(s, self.rate_share(tenants, i), targets[i], self.ideal[i]))
            .collect()
    }

    fn predict(&mut self, tenants: &[TenantSample], targets: &[u64]) {
        for (i, s) in tenants.iter().enumerate() {
            self.predicted[i] = s.curve.valid.then(|| s.curve.hit_ratio_at(targets[i] as f64));
        }
    }

    fn total_value(&self, tenants: &[TenantSample], alloc: &[u64]) -> f64 {
        tenants.iter().enumerate().map(|(i, s)| self.value(s, i, alloc[i])).sum()
    }

    /// The ideal allocation into `self.ideal`; see the module docs.
    fn plan(&mut self, capacity: u64, tenants: &[TenantSample], current: &[u64]) {
        self.ideal.clear();
        self.segments.clear();
        let active_weight: u64 = tenants.iter().filter(|s| s.active).map(|s| u64::from(s.weight.max(1))).sum();
        for (i, s) in tenants.iter().enumerate() {
            let measured = s.active && s.curve.valid;
            // A tenant not yet measured keeps at least its static share: what it would have
            // under `static`, so that one measured first does not take everything.
            let fair = capacity * u64::from(s.weight.max(1)) / active_weight.max(1);
            let start = if s.active && !measured { current[i].max(s.floor()).max(fair) } else { s.floor() };
            self.ideal.push(start.min(s.max_blocks.max(s.floor())));
            if measured && self.rate[i] > 0.0 {
                self.hull_segments(i, s, capacity);
            }
        }
        self.segments.sort_by(|a, b| b.slope.total_cmp(&a.slope));
        let mut free = capacity.saturating_sub(self.ideal.iter().sum());
        for seg in &self.segments {
            if free == 0 {
                break;
            }
            let take = seg.blocks.min(free);
            self.ideal[seg.tenant] += take;
            free -= take;
        }
        // Capacity no slope wants goes first to the tenants that reuse anything (or are not
        // measured yet): a curve flat at its top may only not have seen its long reuses yet
        // (a Zipf tenant's rarest keys come back after tens of thousands of GETs), while a
        // tenant that reuses nothing (a scan) gains nothing from memory at any size. What
        // they cannot take (their maximums) goes to every active tenant.
        let reuses = |s: &TenantSample| s.active && !(s.curve.valid && no_reuse(s, capacity));
        fill_by_weight(capacity, tenants, reuses, &mut self.ideal);
        fill_by_weight(capacity, tenants, |s| s.active, &mut self.ideal);
        clamp(capacity, tenants, &mut self.ideal);
    }

    /// Push the segments of tenant `i`'s upper concave hull, from its floor to its maximum,
    /// with a positive slope.
    fn hull_segments(&mut self, i: usize, s: &TenantSample, capacity: u64) {
        let lo = s.floor();
        let hi = s.max_blocks.min(capacity);
        if hi <= lo {
            return;
        }
        let unit = s.curve.unit_blocks;
        let mut hull = std::mem::take(&mut self.hull);
        hull.clear();
        let first = (lo as f64 / unit).floor() as u64 + 1;
        let xs = std::iter::once(lo)
            .chain((first..).map(|k| (k as f64 * unit).round() as u64).take_while(|&x| x < hi))
            .chain(std::iter::once(hi));
        for x in xs {
            let p = (x as f64, self.value(s, i, x));
            if hull.last().is_some_and(|q| q.0 >= p.0) {
                continue;
            }
            // Pop while the last point lies on or below the line from its predecessor to p.
            while hull.len() >= 2 {
                let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
                if (b.1 - a.1) * (p.0 - a.0) <= (p.1 - a.1) * (b.0 - a.0) {
                    hull.pop();
                } else {
                    break;
                }
            }
            hull.push(p);
        }
        for w in hull.windows(2) {
            let blocks = (w[1].0 - w[0].0) as u64;
            let slope = (w[1].1 - w[0].1) / (w[1].0 - w[0].0);
            if blocks > 0 && slope > 1e-12 {
                self.segments.push(Segment { tenant: i, blocks, slope });
            }
        }
        self.hull = hull;
    }
}

impl Allocator for Marginal {
    fn decide(&mut self, now: Duration, capacity: u64, tenants: &[TenantSample], targets: &mut [u64]) {
        let n = tenants.len();
        self.rate.resize(n, 0.0);
        self.predicted.resize(n, None);
        let first = self.last.is_none() || targets.iter().sum::<u64>() == 0;
        self.hear(now, tenants);
        self.was_valid.resize(n, false);
        let newly_measured = tenants.iter().zip(&self.was_valid).any(|(s, &was)| s.active && s.curve.valid && !was);
        for (w, s) in self.was_valid.iter_mut().zip(tenants) {
            *w = s.curve.valid;
        }
        if !first && self.last.is_some_and(|l| now < l + self.cfg.interval) {
            // A new tenant gets its minimum, and its static share, at once.
            clamp(capacity, tenants, targets);
            raise_newcomers(capacity, tenants, targets);
            // Between decisions, free moves only (the bound's budget is the decisions'),
            // when something the last decision did not know happened: a tenant went quiet
            // (its memory is reclaimed now), or a curve became measured (the memory the
            // others do not hold yet goes where the curves say before they fill it: a loop
            // beside a tenant still filling its static share).
            let mut quiet = false;
            for i in 0..n {
                if self.rate[i] > 0.0 && targets[i] > tenants[i].floor() && self.quiet(i, now) {
                    self.rate[i] = 0.0;
                    quiet = true;
                }
            }
            if !quiet && !newly_measured {
                return;
            }
            self.plan(capacity, tenants, targets);
            let now_value = self.total_value(tenants, targets);
            let gain = self.total_value(tenants, &self.ideal) - now_value;
            if quiet || self.moving || gain > self.threshold(tenants, now_value) {
                let free = self.free(tenants, targets);
                step(capacity, targets, &self.ideal, &free, 0);
                clamp(capacity, tenants, targets);
            }
            self.predict(tenants, targets);
            return;
        }
        let secs = self.last.map_or(self.cfg.interval, |l| now.saturating_sub(l)).as_secs_f64().max(1e-3);
        self.last = Some(now);
        for (i, s) in tenants.iter().enumerate() {
            let (h, m) = self.deltas.take(i, s);
            let r = (h + m) as f64 / secs;
            // Smoothed over two intervals; but a tenant that asked nothing for a whole
            // interval gains nothing from memory now (its blocks are free to give at once,
            // long before it counts as idle).
            self.rate[i] = if self.rate[i] == 0.0 || r == 0.0 { r } else { 0.5 * (self.rate[i] + r) };
            if self.quiet(i, now) {
                self.rate[i] = 0.0;
            }
        }
        clamp(capacity, tenants, targets);
        raise_newcomers(capacity, tenants, targets);
        self.plan(capacity, tenants, targets);
        let reclaim = tenants.iter().enumerate().any(|(i, s)| {
            let worthless = !s.active || self.rate[i] == 0.0 || (s.curve.valid && no_reuse(s, capacity));
            worthless && targets[i] > s.floor().max(self.ideal[i])
        });
        let now_value = self.total_value(tenants, targets);
        let gain = self.total_value(tenants, &self.ideal) - now_value;
        // Two thresholds: a move starts when the ideal is worth `hysteresis_percent` more
        // than the targets, and stops once what is left is worth a quarter of that (so an
        // ideal that wanders with estimation noise does not drag the targets along).
        let threshold = self.threshold(tenants, now_value);
        if gain > threshold {
            self.moving = true;
        } else if gain < threshold / 4.0 {
            self.moving = false;
        }
        if first {
            targets.copy_from_slice(&self.ideal);
        } else if self.moving || reclaim {
            let budget = ((capacity as f64 * self.cfg.max_move_percent / 100.0) as u64).max(1);
            let free = self.free(tenants, targets);
            step(capacity, targets, &self.ideal, &free, budget);
        }
        clamp(capacity, tenants, targets);
        self.moving &= targets != self.ideal.as_slice();
        self.predict(tenants, targets);
    }

    fn predicted_hit_ratio(&self, tenant: usize) -> Option<f64> {
        self.predicted.get(tenant).copied().flatten()
    }

    fn ideal_target(&self, tenant: usize) -> Option<u64> {
        self.ideal.get(tenant).copied()
    }
}

/// Whether a measured tenant's curve shows no reuse at any size up to `capacity` (hit ratio
/// under [`NO_REUSE`]: a scan).
fn no_reuse(s: &TenantSample, capacity: u64) -> bool {
    s.curve.hit_ratio_at(capacity as f64) < NO_REUSE
}

/// A curve whose hit ratio at the lender's whole capacity is below this reuses nothing.
pub const NO_REUSE: f64 = 0.001;

/// Raise every active tenant not yet measured to its static share (capacity split by weight
/// among the active tenants, at most its maximum) at once, taking from the tenants furthest
/// above their floors, as a minimum is raised: a tenant that connects after another took
/// the whole lender starts where `static` would put it, not at its minimum climbing 2% per
/// decision.
fn raise_newcomers(capacity: u64, tenants: &[TenantSample], targets: &mut [u64]) {
    let active_weight: u64 = tenants.iter().filter(|s| s.active).map(|s| u64::from(s.weight.max(1))).sum();
    if !tenants.iter().any(|s| s.active && !s.curve.valid) {
        return;
    }
    let floors: Vec<TenantSample> = tenants
        .iter()
        .map(|s| {
            let mut f = TenantSample { curve: super::Curve::default(), ..s.clone() };
            if s.active && !s.curve.valid {
                let fair = capacity * u64::from(s.weight.max(1)) / active_weight.max(1);
                f.min_blocks = f.min_blocks.max(fair.min(s.max_blocks));
            }
            f
        })
        .collect();
    clamp(capacity, &floors, targets);
}

/// Move `targets` towards `ideal`: first into capacity no target claims, then what each
/// donor can give for free (`free[i]`, see [`Marginal::free_to_give`]), both unbounded;
/// then at most `budget` blocks more from tenants above their ideal to tenants below it,
/// largest gaps first. The sum never grows past `max(capacity, sum before)`.
pub(crate) fn step(capacity: u64, targets: &mut [u64], ideal: &[u64], free: &[u64], budget: u64) {
    let mut unclaimed = capacity.saturating_sub(targets.iter().sum());
    for (t, &want) in targets.iter_mut().zip(ideal) {
        let add = want.saturating_sub(*t).min(unclaimed);
        *t += add;
        unclaimed -= add;
    }
    let (mut free, mut unbounded) = (free.to_vec(), u64::MAX);
    transfer(targets, ideal, &mut free, &mut unbounded);
    let mut budget = budget;
    transfer(targets, ideal, &mut vec![u64::MAX; targets.len()], &mut budget);
}

/// Move blocks from tenants above their ideal to tenants below it, largest gaps first: from
/// donor `d` at most `room[d]`, and at most `shared` in all (both lowered as blocks move).
fn transfer(targets: &mut [u64], ideal: &[u64], room: &mut [u64], shared: &mut u64) {
    // Each round exhausts a donor's excess or room, a receiver's gap, or `shared`.
    for _ in 0..3 * targets.len() + 1 {
        let gap = |i: usize, t: &[u64]| ideal[i].saturating_sub(t[i]);
        let give = |i: usize, t: &[u64]| t[i].saturating_sub(ideal[i]).min(room[i]);
        let r = (0..targets.len()).max_by_key(|&i| gap(i, targets));
        let d = (0..targets.len()).max_by_key(|&i| give(i, targets));
        let (Some(r), Some(d)) = (r, d) else { return };
        let amount = gap(r, targets).min(give(d, targets)).min(*shared);
        if amount == 0 {
            return;
        }
        targets[d] -= amount;
        targets[r] += amount;
        room[d] -= amount;
        *shared -= amount;
    }
}
