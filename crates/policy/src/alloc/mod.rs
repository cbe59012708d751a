//! Division of a lender's memory among its tenants (paper 004, and better).
//!
//! An [`Allocator`] decides, on a timer, each tenant's *target*: the blocks it may keep when
//! memory is short. The store enforces targets (eviction takes from tenants above theirs); the
//! allocator only computes them. Pure code: time is passed in, no I/O, no clocks. Decisions
//! run on the server's timer, never on the data path; the one part that runs on the data
//! path, the miss-ratio-curve estimator ([`mrc::ShardsMrc::access`]), allocates nothing.
//!
//! Four allocators, one per [`AllocationKind`]:
//! - [`Shared`]: targets are the tenants' limits (what the lender did before allocation
//!   existed: when memory is short, the tenant fullest relative to its limit gives way).
//! - [`Static`]: the paper's baseline, capacity split equally (by weight) among the active
//!   tenants, each capped at its limit.
//! - [`hit_ratio::HitRatio`]: paper 004's rule.
//! - [`marginal::Marginal`]: marginal benefit over each tenant's miss-ratio curve.
//!
//! Invariants every allocator keeps (property-tested in `tests.rs`): every tenant's target is
//! at least its minimum and at most its maximum (when the maximum is at least the minimum);
//! except with `Shared`, whose targets are limits that may overbook, the targets add up to
//! at most the capacity (given that the minimums do, which the server checks at start).

pub mod hit_ratio;
pub mod marginal;
pub mod minisim;
pub mod mrc;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use hit_ratio::HitRatio;
pub use marginal::{Marginal, MarginalConfig};
pub use minisim::MiniSim;
pub use mrc::{Curve, ShardsMrc, CURVE_POINTS};

/// How a lender divides its memory among tenants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocationKind {
    /// Targets are the limits; the fullest tenant relative to its limit gives way.
    Shared,
    /// Equal (weighted) split among active tenants, capped at each limit.
    Static,
    /// Paper 004: every interval, 10% of every tenant's memory is pooled and handed to the
    /// tenants below a 100% hit ratio in proportion to their hit ratio.
    HitRatio,
    /// Marginal benefit over online miss-ratio curves.
    Mrc,
}

impl AllocationKind {
    pub const ALL: [AllocationKind; 4] =
        [AllocationKind::Shared, AllocationKind::Static, AllocationKind::HitRatio, AllocationKind::Mrc];

    /// The name used in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            AllocationKind::Shared => "shared",
            AllocationKind::Static => "static",
            AllocationKind::HitRatio => "hit-ratio",
            AllocationKind::Mrc => "mrc",
        }
    }
}

impl std::str::FromStr for AllocationKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        AllocationKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            format!("unknown allocation {s:?}: expected \"shared\", \"static\", \"hit-ratio\" or \"mrc\"")
        })
    }
}

/// What the lender knows of one tenant when it decides. Counters are cumulative (the
/// allocator keeps its own previous values); sizes are in blocks (slots).
#[derive(Clone, Debug, Default)]
pub struct TenantSample {
    /// Whether the tenant counts: it holds blocks or asked for some recently. Inactive
    /// tenants are held at their minimum.
    pub active: bool,
    /// Blocks always held for it, whatever the others do.
    pub min_blocks: u64,
    /// Most blocks it may hold (its `limit`).
    pub max_blocks: u64,
    /// Relative weight (1 by default): the share of a static split, and a factor on the
    /// benefit the other allocators see.
    pub weight: u32,
    /// Blocks it holds now.
    pub used_blocks: u64,
    /// Hits and misses at this lender so far (cumulative). The server counts as misses the
    /// tenant's *fills* (PUTs), not its GET misses: a mount GETs only what it stored, so its
    /// reads the lender did not serve show as fills (`TenantCounters::fills` in the server).
    pub hits: u64,
    pub misses: u64,
    /// Its miss-ratio curve, where one is estimated ([`Curve::valid`] otherwise false).
    pub curve: Curve,
}

impl TenantSample {
    /// The floor of its target: its minimum, capped at its maximum only when the maximum is
    /// the smaller (a configuration the server refuses, but the allocators stay sane).
    fn floor(&self) -> u64 {
        self.min_blocks.min(self.max_blocks.max(self.min_blocks))
    }
}

/// One allocation policy. Contract: synchronous, called from one thread (the server's
/// allocation timer) with a time that never goes backwards. `targets` has one entry per
/// tenant in `tenants` (the same length); on entry it holds the targets in force, on return
/// the new ones. Tenants only ever get added at the end (ids are dense and never reused).
pub trait Allocator: Send {
    /// Recompute `targets` at time `now` (since any fixed origin) for a lender of
    /// `capacity` blocks.
    fn decide(&mut self, now: Duration, capacity: u64, tenants: &[TenantSample], targets: &mut [u64]);
    /// The predicted hit ratio of tenant `i` at its current target, where the allocator
    /// predicts one (for the closed-loop check in the stats).
    fn predicted_hit_ratio(&self, _tenant: usize) -> Option<f64> {
        None
    }
    /// Where the allocator would put tenant `i` if moves were free (its *ideal*), where it
    /// computes one (for the decision log).
    fn ideal_target(&self, _tenant: usize) -> Option<u64> {
        None
    }
}

/// An allocator of `kind` (static dispatch is not needed: it runs once per interval).
pub fn new_allocator(kind: AllocationKind) -> Box<dyn Allocator> {
    match kind {
        AllocationKind::Shared => Box::new(Shared),
        AllocationKind::Static => Box::new(Static),
        AllocationKind::HitRatio => Box::new(HitRatio::new(hit_ratio::HitRatioConfig::PAPER)),
        AllocationKind::Mrc => Box::new(Marginal::new(MarginalConfig::default())),
    }
}

/// Targets are the limits: the store falls back to its limit rule.
pub struct Shared;

impl Allocator for Shared {
    fn decide(&mut self, _now: Duration, capacity: u64, tenants: &[TenantSample], targets: &mut [u64]) {
        for (t, s) in targets.iter_mut().zip(tenants) {
            *t = s.max_blocks.min(capacity).max(s.floor());
        }
    }
}

/// The paper's baseline: capacity split by weight (equally by default) among the active
/// tenants, each capped at its limit and never below its minimum; inactive tenants hold
/// their minimum.
pub struct Static;

impl Allocator for Static {
    fn decide(&mut self, _now: Duration, capacity: u64, tenants: &[TenantSample], targets: &mut [u64]) {
        for (t, s) in targets.iter_mut().zip(tenants) {
            *t = s.floor();
        }
        fill_by_weight(capacity, tenants, |s| s.active, targets);
    }
}

/// Give what capacity the targets leave free to the tenants `eligible` picks, by weight:
/// water-filling to a level `λ` such that each eligible tenant ends at `max(its target,
/// weight × λ)`, none above its maximum (what a capped tenant cannot take goes to the
/// others). Never raises the sum above `capacity`; never lowers a target.
pub(crate) fn fill_by_weight(
    capacity: u64,
    tenants: &[TenantSample],
    eligible: impl Fn(&TenantSample) -> bool,
    targets: &mut [u64],
) {
    let total = |level: u64, targets: &[u64]| -> u64 {
        targets
            .iter()
            .zip(tenants)
            .map(|(&t, s)| if eligible(s) { level_target(t, s, level) } else { t })
            .fold(0u64, u64::saturating_add)
    };
    if total(0, targets) >= capacity || !tenants.iter().any(&eligible) {
        return;
    }
    // The highest level whose targets fit (total is monotone in the level).
    let (mut lo, mut hi) = (0u64, capacity + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if total(mid, targets) <= capacity {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    for (t, s) in targets.iter_mut().zip(tenants) {
        if eligible(s) {
            *t = level_target(*t, s, lo);
        }
    }
    // Rounding: what is left (less than one level step per tenant), a block at a time.
    let mut left = capacity.saturating_sub(targets.iter().sum());
    for (t, s) in targets.iter_mut().zip(tenants) {
        if left > 0 && eligible(s) && *t < s.max_blocks {
            *t += 1;
            left -= 1;
        }
    }
}

/// A tenant's target at water level `level`: `weight × level`, at least `t`, at most its
/// maximum (but never below `t`).
fn level_target(t: u64, s: &TenantSample, level: u64) -> u64 {
    level.saturating_mul(u64::from(s.weight.max(1))).min(s.max_blocks).max(t)
}

/// Make every target at least its floor and at most its maximum, and the sum at most
/// `capacity` (taking first from the tenants furthest above their floors). The last line of
/// every allocator, so that the invariants hold whatever the policy computed.
pub(crate) fn clamp(capacity: u64, tenants: &[TenantSample], targets: &mut [u64]) {
    for (t, s) in targets.iter_mut().zip(tenants) {
        *t = (*t).min(s.max_blocks).max(s.floor());
    }
    let mut excess = targets.iter().sum::<u64>().saturating_sub(capacity);
    while excess > 0 {
        let Some((i, room)) =
            targets.iter().zip(tenants).map(|(t, s)| t - s.floor()).enumerate().max_by_key(|&(_, r)| r)
        else {
            return;
        };
        if room == 0 {
            return; // the minimums alone exceed capacity: refused at start, nothing to take
        }
        let take = excess.min(room.div_ceil(2).max(1));
        targets[i] -= take;
        excess -= take;
    }
}

/// GET hits and misses since the previous decision, per tenant.
#[derive(Default)]
pub(crate) struct Deltas {
    prev: Vec<(u64, u64)>,
}

impl Deltas {
    /// (hits, misses) of tenant `i` since the last call for it; updates the memory.
    pub(crate) fn take(&mut self, i: usize, s: &TenantSample) -> (u64, u64) {
        if self.prev.len() <= i {
            self.prev.resize(i + 1, (0, 0));
        }
        let (h, m) = self.prev[i];
        self.prev[i] = (s.hits, s.misses);
        (s.hits.saturating_sub(h), s.misses.saturating_sub(m))
    }
}
