//! Paper 004's rule (Sakamoto, Yamaguchi): every interval, take 10% of every tenant's memory
//! into a pool and hand the pool to the tenants whose hit ratio is below 100%, in proportion
//! to their hit ratio. A tenant takes part every 5 s while below 100% and every 30 s at
//! 100%; the host decides every 3 s.
//!
//! How the paper's terms are read at a lender (each choice is a constant or a line below):
//! - *Memory* of a tenant is its target, not its use: a tenant that holds less than its
//!   target still gives 10% of the target.
//! - *Hit ratio* is the lender's GET hits over hits + misses of the tenant over its own
//!   period (since it last took part). A tenant that asked nothing in its period is at 100%
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
//! - *Start*: the paper's VMs boot with equal memory. The first decision (and a tenant that
//!   becomes active while there is free capacity) gets an equal split of the free capacity;
//!   a tenant that becomes active when there is none starts at its minimum and earns memory
//!   through the pool, as a VM would (with a 0% hit ratio it earns nothing: the paper's
//!   rule, which `mrc` does not share).

use std::time::Duration;

use super::{clamp, fill_by_weight, Allocator, Deltas, TenantSample};

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
        clamp(capacity, tenants, targets);
        if self.last.is_none() || targets.iter().sum::<u64>() < capacity {
            // The boot split: free capacity, equally, to the active tenants.
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
