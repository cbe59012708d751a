//! The offline optimum of a scenario, from exact curves: the reference every allocation of
//! `farcache bench alloc` is measured against.
//!
//! Each tenant's GETs, exactly as the bench sends them (the same batches, each sorted and
//! without repeats, misses put back after the batch), are replayed against one cache of the
//! lender's own policy (the policy crate's code) at every size `k × capacity / GRID`. That
//! gives, per tenant, window of the run and size, the misses it would have with that much
//! memory all along: exact curves, not estimates. The optimum is then the split of the
//! capacity (in steps of `capacity / GRID`) with the fewest misses in all, by dynamic
//! programming over the tenants (exact for any curve, cliffs included):
//! - *best fixed*: one split for the whole run;
//! - *best per window*: a split per tenth of the run, each chosen knowing that tenth (the
//!   reference for a phase change; moving memory between windows is taken as free, so it is a
//!   bound that no online allocator reaches exactly).
//!
//! Also from the same curves: *static as simulated* (an equal split among the tenants active
//! in each window: a check that the simulation matches the real server's `static`), and the
//! *cold* misses (first access of every key: no allocation avoids them).
//!
//! The lender runs 16 shards, each with its own per-tenant queues; the simulation is one
//! queue per tenant. The gap shows in `static` measured against `static` simulated.

use std::collections::HashMap;

use farcache_policy::{AnyPolicy, PolicyKind, SlotId};
use serde::{Deserialize, Serialize};

/// Steps of the capacity in the optimum's splits (divisible by 2, 3 and 4, so an equal
/// split of the suite's tenants falls on the grid).
pub const GRID: usize = 96;
/// Windows of the run for the per-window optimum.
pub const WINDOWS: usize = 10;
/// Rounds per allocation interval: the bench starts five rounds per interval.
pub const ROUNDS_PER_INTERVAL: u32 = 5;

/// A tenant's GET batch: the round it is sent in and its distinct keys, in the order sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub round: u32,
    pub keys: Vec<u64>,
}

/// One tenant's exact curves: `misses[w][k]` is its misses in window `w` with `k × capacity /
/// GRID` blocks all along.
#[derive(Clone, Debug)]
pub struct TenantCurves {
    pub misses: Vec<Vec<u64>>,
    /// GETs per window.
    pub gets: Vec<u64>,
    /// Distinct keys (the cold misses).
    pub cold: u64,
}

/// The window of `round` in a run of `rounds`.
pub fn window(round: u32, rounds: usize) -> usize {
    (round as usize * WINDOWS / rounds.max(1)).min(WINDOWS - 1)
}

/// The allocation interval of `round`.
pub fn interval(round: u32) -> usize {
    (round / ROUNDS_PER_INTERVAL) as usize
}

/// Allocation intervals in a run of `rounds`.
pub fn intervals(rounds: usize) -> usize {
    rounds.div_ceil(ROUNDS_PER_INTERVAL as usize)
}

/// Blocks of grid step `k`.
pub fn blocks_at(capacity: u64, k: usize) -> u64 {
    capacity * k as u64 / GRID as u64
}

/// Replay `batches` against a cache of `slots` blocks of `kind`; add each batch's misses to
/// `out[bucket(round)]` (a window of the run, an allocation interval).
fn replay(kind: PolicyKind, slots: u32, batches: &[Batch], bucket: impl Fn(u32) -> usize, out: &mut [u64]) {
    if slots == 0 {
        for b in batches {
            out[bucket(b.round)] += b.keys.len() as u64;
        }
        return;
    }
    let mut policy = AnyPolicy::new(kind, slots, 1);
    let mut slot_of: HashMap<u64, SlotId> = HashMap::with_capacity(slots as usize);
    let mut key_of: Vec<u64> = vec![0; slots as usize];
    let mut free: Vec<SlotId> = (0..slots).rev().collect();
    let mut missed = Vec::with_capacity(64);
    for b in batches {
        missed.clear();
        for &k in &b.keys {
            match slot_of.get(&k) {
                Some(&s) => policy.touch(s),
                None => missed.push(k),
            }
        }
        out[bucket(b.round)] += missed.len() as u64;
        // Demand fill, after the batch's answer, as the bench does.
        for &k in &missed {
            let slot = match free.pop() {
                Some(s) => s,
                None => {
                    let victim = policy.evict(0).expect("a full cache has a victim");
                    slot_of.remove(&key_of[victim as usize]);
                    victim
                }
            };
            key_of[slot as usize] = k;
            slot_of.insert(k, slot);
            policy.insert(slot, 0, mix(k));
        }
    }
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A tenant's exact curves at every grid size (two threads: the sizes are independent).
pub fn tenant_curves(kind: PolicyKind, capacity: u64, batches: &[Batch], rounds: usize) -> TenantCurves {
    let mut misses = vec![vec![0u64; GRID + 1]; WINDOWS];
    let per_size: Vec<Vec<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|part| {
                s.spawn(move || {
                    (0..=GRID)
                        .filter(|k| k % 2 == part)
                        .map(|k| {
                            let mut out = vec![0u64; WINDOWS];
                            let slots = u32::try_from(blocks_at(capacity, k)).unwrap_or(u32::MAX);
                            replay(kind, slots, batches, |r| window(r, rounds), &mut out);
                            (k, out)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(usize, Vec<u64>)> =
            workers.into_iter().flat_map(|w| w.join().expect("a replay thread panicked")).collect();
        all.sort_by_key(|x| x.0);
        all.into_iter().map(|x| x.1).collect()
    });
    for (k, out) in per_size.iter().enumerate() {
        for w in 0..WINDOWS {
            misses[w][k] = out[w];
        }
    }
    let mut gets = vec![0u64; WINDOWS];
    let mut seen = std::collections::HashSet::new();
    for b in batches {
        gets[window(b.round, rounds)] += b.keys.len() as u64;
        seen.extend(b.keys.iter().copied());
    }
    TenantCurves { misses, gets, cold: seen.len() as u64 }
}

/// The fewest misses in all over splits of `GRID` steps among tenants whose misses at `k`
/// steps are `cost[t][k]`, and the split (steps per tenant). Exact (dynamic programming), so
/// cliffs in the curves are handled.
pub fn best_split(cost: &[Vec<u64>]) -> (u64, Vec<usize>) {
    // best[t][j]: fewest misses of tenants 0..t with j steps among them; pick[t][j]: tenant
    // t-1's steps in it.
    let n = cost.len();
    let mut best = vec![vec![0u64; GRID + 1]; n + 1];
    let mut pick = vec![vec![0usize; GRID + 1]; n + 1];
    for t in 1..=n {
        for j in 0..=GRID {
            let (mut b, mut p) = (u64::MAX, 0);
            for k in 0..=j {
                let v = best[t - 1][j - k].saturating_add(cost[t - 1][k]);
                if v < b {
                    (b, p) = (v, k);
                }
            }
            best[t][j] = b;
            pick[t][j] = p;
        }
    }
    let mut split = vec![0; n];
    let mut j = GRID;
    for t in (1..=n).rev() {
        split[t - 1] = pick[t][j];
        j -= pick[t][j];
    }
    (best[n][GRID], split)
}

/// The reference figures of one scenario.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Optimum {
    pub scenario: String,
    /// First accesses: misses no allocation avoids.
    pub cold: u64,
    /// An equal split among the tenants active in each window, simulated.
    pub static_simulated: u64,
    pub best_fixed: u64,
    /// Per tenant, blocks in the best fixed split.
    pub best_fixed_blocks: Vec<u64>,
    pub best_per_window: u64,
    /// Per window: the best split's misses, and the GETs.
    pub window_best: Vec<u64>,
    pub window_gets: Vec<u64>,
    /// Per window, per tenant, blocks in that window's best split.
    pub best_per_window_blocks: Vec<Vec<u64>>,
    /// Scenarios with a phase change: the new optimum, per allocation interval (absent from
    /// older reports).
    #[serde(default)]
    pub change: Option<ChangeReference>,
}

/// The reference after a phase change ("the new optimum"): the split with the fewest misses
/// from the change's window to the end of the run, held all along (so at the change every
/// tenant already has its new memory, filled with what it kept of its old phase), replayed
/// exactly per allocation interval. An online allocator is measured against it interval by
/// interval after the change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChangeReference {
    /// The round of the change, and its allocation interval.
    pub round: u32,
    pub interval: usize,
    /// Per tenant, blocks in the split.
    pub blocks: Vec<u64>,
    /// Per allocation interval of the whole run: that split's misses, and the GETs.
    pub interval_misses: Vec<u64>,
    pub interval_gets: Vec<u64>,
}

/// [`ChangeReference`] of a scenario whose tenants change behaviour at `round`: `curves` and
/// `plan` (each tenant's batches) as for [`optimum`].
pub fn change_reference(
    kind: PolicyKind,
    capacity: u64,
    curves: &[TenantCurves],
    plan: &[Vec<Batch>],
    rounds: usize,
    round: u32,
) -> ChangeReference {
    let from = window(round, rounds);
    let after: Vec<Vec<u64>> =
        curves.iter().map(|c| (0..=GRID).map(|k| c.misses[from..].iter().map(|w| w[k]).sum()).collect()).collect();
    let (_, split) = best_split(&after);
    let n = intervals(rounds);
    let (mut interval_misses, mut interval_gets) = (vec![0u64; n], vec![0u64; n]);
    for (batches, &k) in plan.iter().zip(&split) {
        let slots = u32::try_from(blocks_at(capacity, k)).unwrap_or(u32::MAX);
        replay(kind, slots, batches, interval, &mut interval_misses);
        for b in batches {
            interval_gets[interval(b.round)] += b.keys.len() as u64;
        }
    }
    ChangeReference {
        round,
        interval: interval(round),
        blocks: split.iter().map(|&k| blocks_at(capacity, k)).collect(),
        interval_misses,
        interval_gets,
    }
}

/// The optimum of a scenario from its tenants' curves.
pub fn optimum(scenario: &str, capacity: u64, curves: &[TenantCurves]) -> Optimum {
    let whole: Vec<Vec<u64>> =
        curves.iter().map(|c| (0..=GRID).map(|k| c.misses.iter().map(|w| w[k]).sum()).collect()).collect();
    let (best_fixed, split) = best_split(&whole);
    let (mut best_per_window, mut per_window, mut static_simulated) = (0, vec![], 0);
    let mut window_best = vec![];
    for w in 0..WINDOWS {
        let cost: Vec<Vec<u64>> = curves.iter().map(|c| c.misses[w].clone()).collect();
        let (m, s) = best_split(&cost);
        best_per_window += m;
        window_best.push(m);
        per_window.push(s.iter().map(|&k| blocks_at(capacity, k)).collect());
        let active = curves.iter().filter(|c| c.gets[w] > 0).count().max(1);
        static_simulated += curves.iter().map(|c| c.misses[w][GRID / active]).sum::<u64>();
    }
    Optimum {
        scenario: scenario.into(),
        cold: curves.iter().map(|c| c.cold).sum(),
        static_simulated,
        best_fixed,
        best_fixed_blocks: split.iter().map(|&k| blocks_at(capacity, k)).collect(),
        best_per_window,
        window_best,
        window_gets: (0..WINDOWS).map(|w| curves.iter().map(|c| c.gets[w]).sum()).collect(),
        best_per_window_blocks: per_window,
        change: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batches(keys: &[u64], per_round: usize) -> Vec<Batch> {
        keys.chunks(per_round).enumerate().map(|(r, c)| Batch { round: r as u32, keys: c.to_vec() }).collect()
    }

    #[test]
    fn the_best_split_is_exact_on_a_cliff() {
        // Tenant 0 gains nothing until it has 60 of 96 steps, then everything; tenant 1 gains
        // a little per step. Greedy on marginal gains would feed tenant 1; the optimum jumps.
        let cliff: Vec<u64> = (0..=GRID).map(|k| if k >= 60 { 0 } else { 1000 }).collect();
        let gentle: Vec<u64> = (0..=GRID).map(|k| 500 - 5 * k as u64).collect();
        let (m, split) = best_split(&[cliff, gentle]);
        assert_eq!(split, vec![60, 36]);
        assert_eq!(m, 500 - 5 * 36);
    }

    #[test]
    fn curves_count_cold_misses_and_fall_with_size() {
        // A loop over 50 keys, 20 times: at ≥ 50 blocks only the 50 cold misses remain.
        let keys: Vec<u64> = (0..1000).map(|i| i % 50).collect();
        let b = batches(&keys, 10);
        let c = tenant_curves(PolicyKind::S3Fifo, 96, &b, b.len());
        assert_eq!(c.cold, 50);
        assert_eq!(c.gets.iter().sum::<u64>(), 1000);
        let total = |k: usize| c.misses.iter().map(|w| w[k]).sum::<u64>();
        assert_eq!(total(0), 1000);
        assert_eq!(total(GRID), 50);
        for k in 1..=GRID {
            assert!(total(k) <= total(k - 1), "misses grow from {} to {} blocks", k - 1, k);
        }
    }

    /// Two tenants that swap a 20-key and a 70-key loop halfway (3,000 GETs each way, ten per
    /// round: 600 rounds), each tenant's batches.
    fn swapping_loops() -> [Vec<Batch>; 2] {
        let small: Vec<u64> = (0..3000).map(|i| i % 20).collect();
        let large: Vec<u64> = (0..3000).map(|i| i % 70).collect();
        let a: Vec<u64> = small.iter().copied().chain(large.iter().map(|k| k + 1000)).collect();
        let b: Vec<u64> = large.iter().copied().chain(small.iter().map(|k| k + 1000)).collect();
        [batches(&a, 10), batches(&b, 10)]
    }

    #[test]
    fn the_per_window_optimum_follows_a_phase_change() {
        // 96 blocks: each half's own split fits both loops, no fixed split does.
        let [ba, bb] = swapping_loops();
        let rounds = ba.len();
        let curves = [tenant_curves(PolicyKind::Lru, 96, &ba, rounds), tenant_curves(PolicyKind::Lru, 96, &bb, rounds)];
        let o = optimum("phase", 96, &curves);
        // Per window only the cold misses remain: 20 + 70 per tenant.
        assert_eq!(o.cold, 180);
        assert_eq!(o.best_per_window, 180, "{o:?}");
        assert!(o.best_fixed > o.best_per_window + 1000, "{o:?}");
        assert!(o.best_fixed <= o.static_simulated, "{o:?}");
        let (first, last) = (&o.best_per_window_blocks[0], &o.best_per_window_blocks[WINDOWS - 1]);
        assert!(first[0] >= 20 && first[1] >= 70, "{first:?}");
        assert!(last[0] >= 70 && last[1] >= 20, "{last:?}");
    }

    #[test]
    fn the_change_reference_holds_the_new_split_and_counts_per_interval() {
        // The swap at round 300 of 600: the new optimum fits both new loops, so from the change
        // on it misses only their first accesses (70 + 20 new keys).
        let plan = swapping_loops();
        let rounds = plan[0].len();
        let curves: Vec<_> = plan.iter().map(|p| tenant_curves(PolicyKind::Lru, 96, p, rounds)).collect();
        let r = change_reference(PolicyKind::Lru, 96, &curves, &plan, rounds, 300);
        assert_eq!(r.interval, 60);
        assert_eq!(r.interval_misses.len(), intervals(rounds));
        assert!(r.blocks[0] >= 70 && r.blocks[1] >= 20, "{r:?}");
        assert_eq!(r.interval_gets.iter().sum::<u64>(), 12_000);
        assert_eq!(r.interval_misses[r.interval..].iter().sum::<u64>(), 90, "{r:?}");
        // Before the change b's 70-key loop does not fit its 20-odd blocks: every GET misses.
        assert!(r.interval_misses[..r.interval].iter().sum::<u64>() > 2900, "{r:?}");
    }
}
