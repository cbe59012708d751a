//! Paper 004's rule (Sakamoto, Yamaguchi): every interval, take 10% of every tenant's memory
//! into a pool and hand the pool to the tenants whose hit ratio is below 100%, in proportion
//! to their hit ratio. A tenant takes part every 5 s while below 100% and every 30 s at
//! 100%; the host decides every 3 s.
//!
//! How the paper's terms are read at a lender (each choice is a constant or a line below):
//! - *Memory* of a tenant is its target, not its use: a tenant that holds less than its
//!   target still gives 10% of the target.
//! - *Hit ratio* is the lender's GET hits over hits + misses of the tenant over its own
//!   period (since it last took part), where the server counts the tenant's fills (PUTs) as
//!   its misses: a mount GETs only blocks it stored, so its GET hit ratio is ~100% whatever
//!   its memory (it says what survived, not what was served), while hits over hits + fills is
//!   the share of its reads below the page cache that the lender served — the VM's page-cache
//!   hit ratio of the paper, one level down. A tenant that asked nothing in its period is at 100%
//!   (like an idle VM, whose page cache is never missed): it gives and receives nothing.
//! - *Taking part*: the host decides every `decide_every`; at a decision, the tenants whose
//!   period has elapsed (5 s below 100%, 30 s at 100%, from their last part) take part: they
//!   give 10% of their target (never going below their minimum) and, if below 100%, share
//!   the pool. Tenants not due keep their targets.
//! - *The pool is netted*: a tenant's new target is `target - given + share`, applied as
//!   one change. A tenant that gets back about what it gave keeps its warm blocks; only a net
//!   decrease lets others' inserts evict its blocks (the store evicts lazily from tenants
//!   above their targets). Nothing is evicted to be re-earned.
//! - *In proportion to hit ratio*, as the paper says (not to miss ratio): a tenant at 0%
//!   receives nothing. Weights multiply the hit ratio. Capacity no tenant holds joins the
//!   pool. What tenants cannot take (limits) goes back to the donors in proportion to what
//!   they gave; with no tenant below 100% among those taking part, nothing changes.
//! - *Start*: the paper's VMs boot with equal memory, and its rule only ever moves memory
//!   between VMs that have some. At a lender tenants arrive one by one (three HELLOs sent
//!   together reach it milliseconds apart, over several timer ticks), so the start is a rule
//!   of its own: a tenant that *becomes active* (new, or back from idle) gets at least its
//!   static share, the equal (weighted) split of capacity among the active tenants, capped
//!   at its limit — from free capacity first, then from the tenants above their own static
//!   share, in proportion to how far above they are (none goes below its static share or its
//!   minimum). Whatever its hit ratio: before it had memory every GET of a newcomer missed,
//!   and a tenant at 0% earns nothing from the pool, so without this a late tenant would
//!   start at its minimum (0) and stay there for good. So tenants that arrive before the
//!   first pool decision moves anything end with the equal split (up to its rounding),
//!   whatever their order, and
//!   a late tenant starts where a VM booted into a running host would be ballooned to. A
//!   tenant that arrives after the first decision takes its first part a period after it
//!   arrives, its hit ratio measured from then (at the first decision every tenant takes
//!   part, as before). Free capacity (what no target claims) goes to the active tenants by
//!   weight at every decision.

use std::time::Duration;

use super::{clamp, fill_by_weight, Allocator, Deltas, Static, TenantSample};

/// The rule's constants.
#[derive(Clone, Copy, Debug)]
pub struct HitRatioConfig {
    /// Share of every taking-part tenant's target put into the pool, in percent.
    pub pool_percent: u64,
    /// How often the host decides.
    pub decide_every: Duration,
    /// A tenant's period while its hit ratio is below 100%.
    pub period_below: Duration,
    /// A tenant's period at 100%.
    pub period_full: Duration,
}

impl HitRatioConfig {
    /// The paper's values.
    pub const PAPER: HitRatioConfig = HitRatioConfig {
        pool_percent: 10,
        decide_every: Duration::from_secs(3),
        period_below: Duration::from_secs(5),
        period_full: Duration::from_secs(30),
    };
}

/// Paper 004's allocator; see the module docs.
pub struct HitRatio {
    cfg: HitRatioConfig,
    last: Option<Duration>,
    deltas: Deltas,
    /// Per tenant: hits and misses since it last took part, when it next takes part, and
    /// the hit ratio measured then.
    window: Vec<(u64, u64)>,
    due: Vec<Duration>,
    ratio: Vec<f64>,
    given: Vec<u64>,
    /// Per tenant: whether it was active at the previous call (a tenant that was not and
    /// is now is a newcomer), and its static share at this call (scratch).
    was_active: Vec<bool>,
    share: Vec<u64>,
}

impl HitRatio {
    pub fn new(cfg: HitRatioConfig) -> Self {
        HitRatio {
            cfg,
            last: None,
            deltas: Deltas::default(),
            window: vec![],
            due: vec![],
            ratio: vec![],
            given: vec![],
            was_active: vec![],
            share: vec![],
        }
    }
}

impl Allocator for HitRatio {
    fn decide(&mut self, now: Duration, capacity: u64, tenants: &[TenantSample], targets: &mut [u64]) {
        let n = tenants.len();
        self.window.resize(n, (0, 0));
        self.due.resize(n, now);
        self.ratio.resize(n, 1.0);
        self.given.resize(n, 0);
        for (i, s) in tenants.iter().enumerate() {
            let (h, m) = self.deltas.take(i, s);
            self.window[i].0 += h;
            self.window[i].1 += m;
        }
        // The start rule (module docs): newcomers to at least their static share.
        for (t, s) in targets.iter_mut().zip(tenants) {
            *t = (*t).min(s.max_blocks).max(s.floor());
        }
        self.was_active.resize(n, false);
        self.share.resize(n, 0);
        Static.decide(now, capacity, tenants, &mut self.share);
        let newcomers: Vec<bool> = (0..n).map(|i| tenants[i].active && !self.was_active[i]).collect();
        admit(capacity, tenants, &self.share, &newcomers, targets);
        if self.last.is_some() {
            for i in (0..n).filter(|&i| newcomers[i]) {
                // Its period starts now: the GETs it made with no memory are not its hit ratio.
                self.window[i] = (0, 0);
                self.due[i] = self.due[i].max(now + self.cfg.period_below);
            }
        }
        for (w, s) in self.was_active.iter_mut().zip(tenants) {
            *w = s.active;
        }
        clamp(capacity, tenants, targets);
        if targets.iter().sum::<u64>() < capacity {
            // Free capacity, equally (by weight), to the active tenants.
            fill_by_weight(capacity, tenants, |s| s.active, targets);
        }
        if self.last.is_some_and(|l| now < l + self.cfg.decide_every) {
            return;
        }
        self.last = Some(now);

        // Who takes part, with what hit ratio; their 10% into the pool.
        let mut pool = capacity.saturating_sub(targets.iter().sum());
        let free = pool;
        let mut weights = 0.0;
        for i in 0..n {
            self.given[i] = 0;
            if !tenants[i].active || now < self.due[i] {
                self.ratio[i] = -1.0; // not taking part
                continue;
            }
            let (h, m) = std::mem::take(&mut self.window[i]);
            let ratio = if h + m == 0 { 1.0 } else { h as f64 / (h + m) as f64 };
            self.ratio[i] = ratio;
            self.due[i] = now + if ratio < 1.0 { self.cfg.period_below } else { self.cfg.period_full };
            let give = (targets[i] * self.cfg.pool_percent / 100).min(targets[i].saturating_sub(tenants[i].floor()));
            self.given[i] = give;
            pool += give;
            if ratio < 1.0 {
                weights += ratio * f64::from(tenants[i].weight.max(1));
            }
        }
        if weights == 0.0 {
            return; // nobody below 100% (or all at 0%): every tenant keeps what it gave
        }
        // Net: the new targets, each at most its maximum; what is left goes back.
        let mut handed = 0;
        for i in 0..n {
            let mut t = targets[i] - self.given[i];
            let r = self.ratio[i];
            if (0.0..1.0).contains(&r) {
                let share = (pool as f64 * r * f64::from(tenants[i].weight.max(1)) / weights) as u64;
                let share = share.min(tenants[i].max_blocks.saturating_sub(t));
                t += share;
                handed += share;
            }
            targets[i] = t;
        }
        // Back to the donors in proportion to what they gave (free capacity stays free).
        let back = (pool - handed).saturating_sub(free);
        let gave: u64 = self.given.iter().sum();
        if back > 0 && gave > 0 {
            for (t, &g) in targets.iter_mut().zip(&self.given) {
                *t += (u128::from(back) * u128::from(g) / u128::from(gave)) as u64;
            }
        }
        clamp(capacity, tenants, targets);
    }
}

/// Raise every newcomer to at least its static share `share[i]`, taking what free capacity
/// does not cover from the other tenants above their own static share (or minimum, if
/// higher), in proportion to how far above it they are. Nobody goes below its static share
/// for a newcomer; if the donors cannot cover it all (a newcomer kept a target above its
/// share), the caller's `clamp` takes the rest.
fn admit(capacity: u64, tenants: &[TenantSample], share: &[u64], newcomers: &[bool], targets: &mut [u64]) {
    if !newcomers.contains(&true) {
        return;
    }
    for i in (0..targets.len()).filter(|&i| newcomers[i]) {
        targets[i] = targets[i].max(share[i]);
    }
    let over = targets.iter().sum::<u64>().saturating_sub(capacity);
    let excess: Vec<u64> = (0..targets.len())
        .map(|j| if newcomers[j] { 0 } else { targets[j].saturating_sub(share[j].max(tenants[j].floor())) })
        .collect();
    let total: u64 = excess.iter().sum();
    let take = over.min(total);
    if take == 0 {
        return;
    }
    // In proportion, rounded down; then one more block from each donor with excess left
    // until `take` is reached (fewer than one per donor is left, and `take < total` leaves
    // each donor with excess at least one more).
    let mut left = take;
    for (t, &e) in targets.iter_mut().zip(&excess) {
        let g = (u128::from(take) * u128::from(e) / u128::from(total)) as u64;
        *t -= g;
        left -= g;
    }
    for (t, &e) in targets.iter_mut().zip(&excess) {
        let g = (u128::from(take) * u128::from(e) / u128::from(total)) as u64;
        if left > 0 && e > g {
            *t -= 1;
            left -= 1;
        }
    }
    debug_assert_eq!(left, 0);
}
