//! Tests of the allocators: the invariants of every allocator on random input, the marginal
//! allocator's convergence, bounds and choices, the paper's rule, and the curve estimator
//! against exact LRU curves of the same trace.

use std::time::Duration;

use proptest::prelude::*;

use super::marginal::step;
use super::mrc::exact_lru;
use super::*;

fn tenant(min: u64, max: u64, curve: Curve) -> TenantSample {
    TenantSample { active: true, min_blocks: min, max_blocks: max, weight: 1, curve, ..Default::default() }
}

/// A working set of `ws` blocks read uniformly: LRU misses `1 - x/ws` below it.
fn uniform(capacity: u64, ws: f64) -> Curve {
    Curve::from_fn(capacity, |x| (1.0 - x / ws).max(0.0))
}

/// A loop over `ws` blocks: LRU misses everything until the whole loop fits (a cliff).
fn cliff(capacity: u64, ws: f64) -> Curve {
    Curve::from_fn(capacity, |x| if x >= ws { 0.0 } else { 1.0 })
}

/// Run `a` for `rounds` decisions `dt` apart, each tenant asking `rates[i]` GETs per second
/// (hits as its curve predicts at its target); returns every round's targets.
fn run(
    a: &mut dyn Allocator,
    capacity: u64,
    tenants: &mut [TenantSample],
    rates: &[u64],
    rounds: usize,
    dt: Duration,
) -> Vec<Vec<u64>> {
    let mut targets = vec![0; tenants.len()];
    let mut out = vec![];
    for r in 0..rounds {
        let now = dt * r as u32;
        for (i, s) in tenants.iter_mut().enumerate() {
            let asked = rates[i] * dt.as_secs().max(1);
            let hits = (asked as f64 * s.curve.hit_ratio_at(targets[i] as f64)) as u64;
            s.hits += hits;
            s.misses += asked - hits;
            // A busy lender: every tenant holds its whole target.
            s.used_blocks = targets[i];
        }
        a.decide(now, capacity, tenants, &mut targets);
        out.push(targets.clone());
    }
    out
}

fn check_invariants(
    shared: bool,
    capacity: u64,
    tenants: &[TenantSample],
    targets: &[u64],
) -> Result<(), TestCaseError> {
    prop_assert!(shared || targets.iter().sum::<u64>() <= capacity, "sum {:?} over {}", targets, capacity);
    for (t, s) in targets.iter().zip(tenants) {
        prop_assert!(*t >= s.min_blocks, "target {} below minimum {}", t, s.min_blocks);
        prop_assert!(*t <= s.max_blocks.max(s.min_blocks), "target {} above maximum {}", t, s.max_blocks);
    }
    Ok(())
}

#[test]
fn kinds_round_trip() {
    for k in AllocationKind::ALL {
        assert_eq!(k.name().parse::<AllocationKind>(), Ok(k));
    }
    assert!("fair".parse::<AllocationKind>().unwrap_err().contains("hit-ratio"));
}

#[test]
fn static_splits_equally_among_active_tenants_within_limits() {
    let mut ts =
        vec![tenant(0, 1000, Curve::default()), tenant(0, 100, Curve::default()), tenant(50, 1000, Curve::default())];
    ts.push(TenantSample { active: false, min_blocks: 10, max_blocks: 1000, weight: 1, ..Default::default() });
    let mut targets = vec![0; 4];
    Static.decide(Duration::ZERO, 1000, &ts, &mut targets);
    // 990 for three: the second is capped at 100, the rest share what it cannot take.
    assert_eq!(targets, vec![445, 100, 445, 10]);
    ts[1].weight = 3;
    ts[1].max_blocks = 1000;
    ts[2].min_blocks = 300;
    Static.decide(Duration::ZERO, 1000, &ts, &mut targets);
    // Level 172.5: the first 172, the second 3 × 172 + 1, the third its minimum.
    assert_eq!(targets, vec![173, 517, 300, 10]);
}

#[test]
fn shared_targets_are_the_limits() {
    let ts = vec![tenant(0, 1000, Curve::default()), tenant(0, 300, Curve::default())];
    let mut targets = vec![0; 2];
    Shared.decide(Duration::ZERO, 1000, &ts, &mut targets);
    assert_eq!(targets, vec![1000, 300]);
}

#[test]
fn the_papers_rule_moves_memory_to_the_tenant_below_100_percent() {
    let cap = 1000;
    // A misses half its GETs at any size the test gives it; B hits them all.
    let mut ts = vec![tenant(0, cap, Curve::from_fn(cap, |_| 0.5)), tenant(100, cap, Curve::from_fn(cap, |_| 0.0))];
    let mut a = HitRatio::new(hit_ratio::HitRatioConfig::PAPER);
    let rounds = run(&mut a, cap, &mut ts, &[100, 100], 40, Duration::from_secs(3));
    // The boot split, then at once the first decision: B gives 50 to A.
    assert_eq!(rounds[0], vec![550, 450]);
    // B gives 10% at every part it takes (every 30 s) and never receives; A takes it all.
    let last = rounds.last().unwrap();
    assert!(last[0] > 600 && last[1] < 400, "{last:?}");
    assert!(last[1] >= 100, "B's minimum: {last:?}");
    for r in &rounds {
        assert_eq!(r.iter().sum::<u64>(), cap, "{r:?}");
    }
    // Netting: A, taking part every 5 s, gives 10% and gets the whole pool back at once: its
    // target never drops.
    for w in rounds.windows(2) {
        assert!(w[1][0] >= w[0][0], "A lost memory it would re-earn: {w:?}");
    }
}

#[test]
fn the_papers_rule_gives_in_proportion_to_hit_ratio() {
    let cap = 1000;
    let mut ts = vec![tenant(0, cap, Curve::from_fn(cap, |_| 0.2)), tenant(0, cap, Curve::from_fn(cap, |_| 0.6))];
    let mut a = HitRatio::new(hit_ratio::HitRatioConfig::PAPER);
    let rounds = run(&mut a, cap, &mut ts, &[100, 100], 60, Duration::from_secs(3));
    // The fixed point has targets in the ratio of the hit ratios, 0.8 : 0.4.
    let last = rounds.last().unwrap();
    assert!((640..=700).contains(&last[0]), "{last:?}");
}

/// Feed each tenant `gets` GETs with hits as its curve predicts at its target, then decide.
fn feed_and_decide(a: &mut dyn Allocator, now: Duration, cap: u64, ts: &mut [TenantSample], targets: &mut [u64]) {
    for (i, s) in ts.iter_mut().enumerate() {
        let hits = (100.0 * s.curve.hit_ratio_at(targets[i] as f64)) as u64;
        s.hits += hits;
        s.misses += 100 - hits;
        s.used_blocks = targets[i];
    }
    a.decide(now, cap, ts, targets);
}

#[test]
fn the_papers_rule_gives_a_late_tenant_its_share_whatever_its_hit_ratio() {
    let cap = 1000;
    // Both hit half their GETs once they have any memory; with none, every GET misses.
    let half = || Curve::from_fn(cap, |x| if x < 1.0 { 1.0 } else { 0.5 });
    let mut ts = vec![tenant(0, cap, half())];
    let mut targets = vec![0];
    let mut a = HitRatio::new(hit_ratio::HitRatioConfig::PAPER);
    let dt = Duration::from_secs(3);
    for r in 0..10 {
        feed_and_decide(&mut a, dt * r, cap, &mut ts, &mut targets);
    }
    assert_eq!(targets, vec![cap], "alone, the first tenant holds everything");
    // The second arrives with a 0% hit ratio (every GET so far missed: it had no memory).
    ts.push(TenantSample { misses: 500, ..tenant(0, cap, half()) });
    targets.push(0);
    feed_and_decide(&mut a, dt * 10, cap, &mut ts, &mut targets);
    assert_eq!(targets, vec![500, 500], "the newcomer gets its static share at once");
    // Then the paper's rule: both at 50%, both keep about half.
    for r in 11..60 {
        feed_and_decide(&mut a, dt * r, cap, &mut ts, &mut targets);
        assert!(targets[1] >= 400, "round {r}: {targets:?}");
        assert!(targets.iter().sum::<u64>() <= cap);
    }
}

#[test]
fn the_papers_rule_splits_equally_among_tenants_arriving_milliseconds_apart() {
    let cap = 1000;
    let mut a = HitRatio::new(hit_ratio::HitRatioConfig::PAPER);
    let mut ts = vec![];
    let mut targets = vec![];
    for k in 0..3u32 {
        // Each has already asked for 100 blocks and missed them all.
        ts.push(TenantSample { misses: 100, ..tenant(0, cap, Curve::from_fn(cap, |_| 0.3)) });
        targets.push(0);
        a.decide(Duration::from_millis(u64::from(k)), cap, &ts, &mut targets);
    }
    let mut equal = vec![0; 3];
    Static.decide(Duration::ZERO, cap, &ts, &mut equal);
    assert_eq!(targets, equal);
    assert!(targets.iter().all(|&t| (333..=334).contains(&t)), "{targets:?}");
}

#[test]
fn the_papers_rule_gives_a_tenant_back_from_idle_its_share() {
    let cap = 1000;
    let mut ts = vec![tenant(0, cap, Curve::from_fn(cap, |_| 0.5)), tenant(0, cap, Curve::from_fn(cap, |_| 0.5))];
    let mut a = HitRatio::new(hit_ratio::HitRatioConfig::PAPER);
    let mut targets = vec![0, 0];
    let dt = Duration::from_secs(3);
    feed_and_decide(&mut a, Duration::ZERO, cap, &mut ts, &mut targets);
    // The second goes idle and its memory is taken (as an operator's lower limit would).
    ts[1].active = false;
    ts[1].max_blocks = 0;
    for r in 1..5 {
        feed_and_decide(&mut a, dt * r, cap, &mut ts, &mut targets);
    }
    assert_eq!(targets, vec![cap, 0]);
    ts[1].active = true;
    ts[1].max_blocks = cap;
    feed_and_decide(&mut a, dt * 5, cap, &mut ts, &mut targets);
    assert_eq!(targets, vec![500, 500]);
}

#[test]
fn mrc_follows_the_curves_and_the_request_rates() {
    let cap = 1000;
    // Both read a uniform working set of 600 blocks; A asks ten times as often.
    let mut ts = vec![tenant(0, cap, uniform(cap, 600.0)), tenant(0, cap, uniform(cap, 600.0))];
    let mut a = Marginal::new(MarginalConfig::default());
    let rounds = run(&mut a, cap, &mut ts, &[1000, 100], 200, Duration::from_secs(5));
    let last = rounds.last().unwrap();
    assert!(last[0] >= 595 && last[1] <= 405, "{last:?}");
}

#[test]
fn mrc_climbs_a_cliff_the_greedy_walk_would_not() {
    let cap = 1000;
    // A loops over 700 blocks (nothing below 700 helps); B's uniform 2000-block set gains a
    // little with every block. Hits: A all 700 + B 300 blocks = 1000 + 15 vs B alone 50.
    let mut ts = vec![tenant(0, cap, cliff(cap, 700.0)), tenant(0, cap, uniform(cap, 2000.0))];
    let mut a = Marginal::new(MarginalConfig::default());
    let rounds = run(&mut a, cap, &mut ts, &[100, 100], 100, Duration::from_secs(5));
    let last = rounds.last().unwrap();
    assert!(last[0] >= 700, "{last:?}");
}

#[test]
fn mrc_reclaims_an_idle_tenants_memory_above_its_minimum() {
    let cap = 1000;
    let mut ts = vec![tenant(100, cap, uniform(cap, 800.0)), tenant(0, cap, uniform(cap, 800.0))];
    let mut a = Marginal::new(MarginalConfig::default());
    let rounds = run(&mut a, cap, &mut ts, &[100, 100], 10, Duration::from_secs(5));
    assert!(rounds.last().unwrap()[0] > 300);
    ts[0].active = false;
    let rounds = run(&mut a, cap, &mut ts, &[0, 100], 200, Duration::from_secs(5));
    assert_eq!(rounds.last().unwrap()[0], 100, "{:?}", rounds.last());
}

#[test]
fn step_moves_at_most_the_budget_and_free_capacity_at_once() {
    let mut t = vec![500, 300, 100];
    step(1000, &mut t, &[100, 500, 400], &[0, 0, 0], 50);
    // 100 unclaimed go to the largest gaps first; then 50 from the one above its ideal.
    assert_eq!(t.iter().sum::<u64>(), 1000);
    assert_eq!(t[0], 450);
    let mut t = vec![100, 500, 400];
    step(1000, &mut t, &[100, 500, 400], &[0, 0, 0], 50);
    assert_eq!(t, vec![100, 500, 400], "at the ideal nothing moves");
    // What the donor can give for free (blocks it does not hold) moves at once, then the
    // budget on top.
    let mut t = vec![600, 300, 100];
    step(1000, &mut t, &[100, 500, 400], &[200, 0, 0], 50);
    assert_eq!(t, vec![350, 350, 300], "200 free to the largest gap, then 50 to the next");
}

#[test]
fn a_donor_gives_at_once_what_it_does_not_hold_or_does_not_use() {
    let cap = 1000;
    // Holds 300 of a target of 800: 500 are free to give.
    let s = TenantSample { used_blocks: 300, ..tenant(0, cap, uniform(cap, 2000.0)) };
    assert_eq!(Marginal::free_to_give(&s, 1.0, 800, 100), 500);
    // Its working set is 200 blocks: above that its curve is flat, so all above 200 are free.
    let s = TenantSample { used_blocks: 800, ..tenant(0, cap, uniform(cap, 200.0)) };
    let f = Marginal::free_to_give(&s, 1.0, 800, 100);
    assert!((590..=600).contains(&f), "{f}");
    // A steep curve it uses: only what loses under FLAT_LOSS in all (a block or two here).
    let s = TenantSample { used_blocks: 800, ..tenant(0, cap, uniform(cap, 2000.0)) };
    assert!(Marginal::free_to_give(&s, 1.0, 800, 100) <= 2);
    // The same curve, but a tenth of the lender's requests: ten times as much is free.
    let f = Marginal::free_to_give(&s, 0.1, 800, 100);
    assert!((15..=25).contains(&f), "{f}");
    // It stopped asking: everything above its ideal is free.
    assert_eq!(Marginal::free_to_give(&s, 0.0, 800, 100), 700);
}

#[test]
fn a_tenant_that_stops_asking_gives_its_memory_within_two_decisions() {
    let cap = 1000;
    let mut ts = vec![tenant(0, cap, uniform(cap, 800.0)), tenant(0, cap, uniform(cap, 800.0))];
    let mut a = Marginal::new(MarginalConfig::default());
    let rounds = run(&mut a, cap, &mut ts, &[100, 100], 10, Duration::from_secs(5));
    assert!(rounds.last().unwrap()[0] >= 400, "{:?}", rounds.last());
    // Still active (not yet idle), but no GETs: not 2% per decision, all at once.
    let rounds = run(&mut a, cap, &mut ts, &[0, 100], 2, Duration::from_secs(5));
    assert!(rounds.last().unwrap()[1] >= 795, "{rounds:?}");
}

#[test]
fn a_tenant_not_yet_measured_keeps_its_static_share() {
    let cap = 900;
    // The first two are measured and steep; the third has no curve yet.
    let mut ts = vec![
        tenant(0, cap, uniform(cap, 2000.0)),
        tenant(0, cap, uniform(cap, 2000.0)),
        tenant(0, cap, Curve::default()),
    ];
    let mut a = Marginal::new(MarginalConfig::default());
    let rounds = run(&mut a, cap, &mut ts, &[100, 100, 100], 5, Duration::from_secs(5));
    for r in &rounds {
        assert!(r[2] >= 300, "{rounds:?}");
    }
}

#[test]
fn mrc_follows_a_phase_change_within_a_few_decisions() {
    // Tenant 0 had a large working set and holds most of the lender; its new phase needs 100
    // blocks. Tenant 1's working set grows to 700. The memory tenant 0 no longer uses moves
    // at once, not 2% per decision.
    let cap = 1000;
    let mut ts = vec![tenant(0, cap, uniform(cap, 900.0)), tenant(0, cap, uniform(cap, 100.0))];
    let mut a = Marginal::new(MarginalConfig::default());
    let rounds = run(&mut a, cap, &mut ts, &[100, 100], 20, Duration::from_secs(5));
    assert!(rounds.last().unwrap()[0] > 800, "{:?}", rounds.last());
    ts[0].curve = uniform(cap, 100.0);
    ts[1].curve = uniform(cap, 700.0);
    let rounds = run(&mut a, cap, &mut ts, &[100, 100], 6, Duration::from_secs(5));
    let last = rounds.last().unwrap();
    assert!(last[1] >= 630, "90% of the new optimum within 30 s: {rounds:?}");
}

fn arb_curve(cap: u64) -> impl Strategy<Value = Curve> {
    (0..3u8, 1..2 * cap, 0.0..0.5f64).prop_map(move |(shape, ws, floor)| match shape {
        0 => Curve::from_fn(cap, |x| floor + (1.0 - floor) * (1.0 - x / ws as f64).max(0.0)),
        1 => Curve::from_fn(cap, |x| if x >= ws as f64 { floor } else { 1.0 }),
        _ => Curve::from_fn(cap, |x| floor + (1.0 - floor) / (1.0 + x / (ws as f64 / 8.0))),
    })
}

const CAP: u64 = 10_000;

fn arb_tenants() -> impl Strategy<Value = (Vec<TenantSample>, Vec<u64>)> {
    prop::collection::vec((0..CAP / 8, 0..2 * CAP, 1..4u32, any::<bool>(), arb_curve(CAP), 0..5000u64), 1..7).prop_map(
        |v| {
            let rates = v.iter().map(|x| x.5).collect();
            let ts = v
                .into_iter()
                .map(|(min, max, weight, idle, curve, _)| TenantSample {
                    active: !idle || min % 3 != 0,
                    min_blocks: min,
                    max_blocks: max.max(min),
                    weight,
                    curve,
                    ..Default::default()
                })
                .collect();
            (ts, rates)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Every allocator, on random tenants whose activity changes: minimums always held,
    /// maximums respected, the sum never above capacity.
    #[test]
    fn every_allocator_holds_minimums_and_capacity(
        (mut ts, rates) in arb_tenants(),
        flips in prop::collection::vec((0..7usize, 1..60u64), 0..8),
    ) {
        for kind in AllocationKind::ALL {
            let mut a = new_allocator(kind);
            let mut targets = vec![0; ts.len()];
            let mut now = Duration::ZERO;
            for round in 0..40u64 {
                if let Some(&(i, _)) = flips.iter().find(|&&(_, at)| at == round) {
                    if let Some(t) = ts.get_mut(i) {
                        t.active = !t.active;
                    }
                }
                now += Duration::from_millis(500 + round * 97 % 5000);
                for (i, s) in ts.iter_mut().enumerate() {
                    let hit = (rates[i] as f64 * s.curve.hit_ratio_at(targets[i] as f64)) as u64;
                    s.hits += hit;
                    s.misses += rates[i] - hit;
                }
                a.decide(now, CAP, &ts, &mut targets);
                check_invariants(kind == AllocationKind::Shared, CAP, &ts, &targets)?;
            }
        }
    }

    /// The paper's rule, tenants arriving one by one (in any order, any weights, minimums
    /// and limits) before its second decision: whoever came first, they end with the static
    /// split (up to its rounding), and no tenant already there is pushed below its static share at any arrival.
    #[test]
    fn the_papers_rule_splits_tenants_arriving_together_like_static(
        (mut ts, _) in arb_tenants(),
        gets in prop::collection::vec((0..1000u64, 0..1000u64), 7),
    ) {
        for (t, (h, m)) in ts.iter_mut().zip(gets) {
            t.active = true;
            (t.hits, t.misses) = (h, m);
        }
        let mut a = HitRatio::new(hit_ratio::HitRatioConfig::PAPER);
        let mut targets = vec![];
        for k in 1..=ts.len() {
            targets.push(0);
            a.decide(Duration::from_millis(k as u64), CAP, &ts[..k], &mut targets);
            check_invariants(false, CAP, &ts[..k], &targets)?;
            let mut shares = vec![0; k];
            Static.decide(Duration::ZERO, CAP, &ts[..k], &mut shares);
            for (i, (t, s)) in targets.iter().zip(&shares).enumerate() {
                // (The static split's rounding hands single blocks to the first tenants with
                // room, so a share may grow by one when another tenant arrives.)
                prop_assert!(t + 1 >= *s, "tenant {} at {} below its static share {}: {:?}", i, t, s, targets);
            }
            if k == ts.len() {
                // The static split, but for its rounding: it may leave less than one level
                // step (the weights' sum) unassigned, which the targets may hold.
                let weights: u64 = ts.iter().map(|t| u64::from(t.weight)).sum();
                let above: i64 = targets.iter().zip(&shares).map(|(&t, &s)| t as i64 - s as i64).map(i64::abs).sum();
                prop_assert!(above < 2 * weights as i64, "{:?} vs static {:?}", targets, shares);
            }
        }
    }

    /// Stationary input: the marginal allocator's targets move monotonically, settle, and
    /// never take more than the budget per decision from the tenants (after the first).
    #[test]
    fn mrc_settles_without_oscillation_in_bounded_steps((mut ts, rates) in arb_tenants()) {
        for t in &mut ts {
            t.active = true;
        }
        let mut a = Marginal::new(MarginalConfig::default());
        let rounds = run(&mut a, CAP, &mut ts, &rates, 400, Duration::from_secs(5));
        let budget = CAP * 2 / 100;
        // Each tenant's part of the (weighted) request rate, as the allocator sees it.
        let weighted: Vec<f64> = ts.iter().zip(&rates).map(|(s, &r)| f64::from(s.weight.max(1)) * r as f64).collect();
        let total: f64 = weighted.iter().sum();
        let shares: Vec<f64> = weighted.iter().map(|w| if total > 0.0 { w / total } else { 1.0 }).collect();
        for w in rounds.windows(2).skip(1) {
            // Blocks taken beyond what each donor's curve and request rate say costs nothing
            // (every tenant holds its target here): at most the budget.
            let costly: u64 = w[0]
                .iter()
                .zip(&w[1])
                .zip(&ts)
                .enumerate()
                .map(|(i, ((a, b), s))| {
                    let s = TenantSample { used_blocks: *a, ..s.clone() };
                    a.saturating_sub(*b).saturating_sub(Marginal::free_to_give(&s, shares[i], *a, *b))
                })
                .sum();
            prop_assert!(costly <= budget, "moved {} > {}: {:?}", costly, budget, w);
        }
        for i in 0..ts.len() {
            let dirs: Vec<i8> = rounds.windows(2).skip(1)
                .map(|w| (w[1][i] as i64 - w[0][i] as i64).signum() as i8)
                .filter(|&d| d != 0)
                .collect();
            prop_assert!(dirs.windows(2).all(|d| d[0] == d[1]), "tenant {} reversed: {:?}", i, dirs);
        }
        let tail = &rounds[rounds.len() - 10..];
        prop_assert!(tail.iter().all(|r| r == &tail[0]), "not settled: {:?}", tail);
    }

    /// The estimator samples every key when it has room: its curve is then the exact one.
    #[test]
    fn mrc_estimate_is_exact_when_every_key_is_tracked(
        trace in prop::collection::vec(0..300u64, 64..3000),
        cap in 64..1024u64,
    ) {
        let mut e = ShardsMrc::new(cap, 1 << 12);
        prop_assert_eq!(e.rate(), 1.0);
        for &k in &trace {
            prop_assert!(e.access(k));
        }
        let c = e.curve();
        let sizes: Vec<u64> = (0..CURVE_POINTS).map(|k| (k as f64 * c.unit_blocks) as u64).collect();
        let exact = exact_lru(&trace, &sizes);
        for (k, want) in exact.iter().enumerate() {
            // A point between whole blocks counts distances below its fractional size.
            let x = k as f64 * c.unit_blocks;
            if (x - x.floor()).abs() < 1e-9 {
                prop_assert!((f64::from(c.miss_ratio[k]) - want).abs() < 1e-4, "size {}: {} vs {}", x, c.miss_ratio[k], want);
            }
        }
    }
}

/// A Zipf-like trace of `n` accesses over `keys` keys (skew `s`), deterministic.
fn zipf_trace(n: usize, keys: u64, s: f64, seed: u64) -> Vec<u64> {
    let weights: Vec<f64> = (1..=keys).map(|k| 1.0 / (k as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(weights.len());
    let mut acc = 0.0;
    for w in weights {
        acc += w / total;
        cdf.push(acc);
    }
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            cdf.partition_point(|&c| c < u) as u64
        })
        .collect()
}

#[test]
fn mrc_estimate_with_sampling_is_close_to_the_exact_curve() {
    let cap = 4000;
    for (s, seed) in [(0.6, 1), (0.9, 2), (1.2, 3)] {
        let trace = zipf_trace(60_000, 6000, s, seed);
        // 1024 samples of 6000 keys: the rate drops to about a sixth.
        let mut e = ShardsMrc::new(cap, 1024);
        for &k in &trace {
            e.offered(1);
            e.access((k + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        assert!(e.rate() < 0.3, "rate {}", e.rate());
        let c = e.curve();
        assert!(c.valid);
        let sizes: Vec<u64> = (0..CURVE_POINTS).step_by(8).map(|k| (k as f64 * c.unit_blocks) as u64).collect();
        let exact = exact_lru(&trace, &sizes);
        let mae: f64 = sizes.iter().zip(&exact).map(|(&x, &m)| (c.miss_ratio_at(x as f64) - m).abs()).sum::<f64>()
            / sizes.len() as f64;
        println!("zipf {s}: mean absolute error {mae:.4} at rate {:.3}", e.rate());
        assert!(mae < 0.03, "zipf {s}: mean absolute error {mae}");
    }
}

#[test]
fn mrc_estimator_state_is_bounded_and_fixed() {
    let mut e = ShardsMrc::new(1 << 20, 8192);
    let before = e.memory_bytes();
    assert!(before <= 1 << 20, "{before} bytes");
    for k in 0..400_000u64 {
        e.access(k % 150_000);
    }
    assert_eq!(e.memory_bytes(), before, "the estimator grew");
    assert!(e.rate() < 0.1);
}

#[test]
fn a_scans_curve_shows_no_hits_whatever_the_adj_correction_says() {
    // A one-pass scan: no key comes back. Told that twice as many accesses happened as it
    // sampled (sampling noise on a scan: its rate was lowered as keys piled up), SHARDS-adj
    // would count the shortfall as hits at distance 0 and make the scan look worth memory.
    let mut e = ShardsMrc::new(4096, 8192);
    for k in 0..50_000u64 {
        e.access(k);
    }
    e.offered(100_000);
    let c = e.curve();
    assert!(c.valid);
    assert_eq!(c.hit_ratio_at(4096.0), 0.0, "{:?}", &c.miss_ratio[..4]);
    // A tenant that reuses keeps the correction: a loop whose hot keys the sample missed.
    let mut e = ShardsMrc::new(4096, 8192);
    for k in 0..50_000u64 {
        e.access(k % 1000);
    }
    e.offered(100_000);
    assert!(e.curve().hit_ratio_at(32.0) > 0.4, "{:?}", &e.curve().miss_ratio[..4]);
}

/// A scan: valid curve, no hit at any size.
fn scan(capacity: u64) -> Curve {
    Curve::from_fn(capacity, |_| 1.0)
}

/// Decide at `now` after each tenant asked `rates[i]` GETs per second for `dt`, hitting as
/// its curve predicts at its target and holding its whole target.
fn feed(
    a: &mut dyn Allocator,
    now: Duration,
    dt: Duration,
    cap: u64,
    ts: &mut [TenantSample],
    rates: &[u64],
    targets: &mut [u64],
) {
    for (i, s) in ts.iter_mut().enumerate() {
        let asked = rates[i] * dt.as_secs().max(1);
        let hits = (asked as f64 * s.curve.hit_ratio_at(targets[i] as f64)) as u64;
        s.hits += hits;
        s.misses += asked - hits;
        s.used_blocks = targets[i];
    }
    a.decide(now, cap, ts, targets);
}

/// Two tenants with no curve yet, a `Marginal` allocator with its defaults, no targets.
fn two_unmeasured(cap: u64) -> (Vec<TenantSample>, Marginal, Vec<u64>) {
    (
        vec![tenant(0, cap, Curve::default()), tenant(0, cap, Curve::default())],
        Marginal::new(MarginalConfig::default()),
        vec![0, 0],
    )
}

#[test]
fn capacity_no_curve_wants_goes_to_tenants_that_reuse_not_to_a_scan() {
    let cap = 1000;
    let iv = Duration::from_secs(5);
    // A's working set is 500 blocks (its curve is flat above); B's curve is not measured
    // yet, then shows that B reuses nothing (a scan). The 500 blocks no slope wants go to A,
    // and move at once although A's curve predicts no gain from them (no hysteresis to
    // pass): they cost B nothing.
    let (mut ts, mut a, mut targets) = two_unmeasured(cap);
    feed(&mut a, Duration::ZERO, iv, cap, &mut ts, &[100, 100], &mut targets);
    assert_eq!(targets, vec![500, 500]);
    ts[0].curve = uniform(cap, 500.0);
    feed(&mut a, iv, iv, cap, &mut ts, &[100, 100], &mut targets);
    assert_eq!(targets, vec![500, 500], "B not measured: it keeps its static share");
    ts[1].curve = scan(cap);
    for r in 2..5 {
        feed(&mut a, iv * r, iv, cap, &mut ts, &[100, 100], &mut targets);
    }
    assert_eq!(targets, vec![1000, 0]);
}

#[test]
fn near_a_full_hit_ratio_the_hysteresis_counts_misses() {
    let cap = 1000;
    let iv = Duration::from_secs(5);
    // A asks 100 times as often as B and hits 99% at half the lender, 100% at all of it;
    // B hits in proportion to its memory. Giving B's 500 to A is worth 0.5% more hits — under
    // the 1% hysteresis — but avoids a third of the lender's misses.
    let (mut ts, mut a, mut targets) = two_unmeasured(cap);
    let rates = [10_000u64, 100];
    feed(&mut a, Duration::ZERO, iv, cap, &mut ts, &rates, &mut targets);
    assert_eq!(targets, vec![500, 500]);
    ts[0].curve = Curve::from_fn(cap, |x| 0.02 * (1.0 - x / 1000.0));
    ts[1].curve = uniform(cap, 1000.0);
    for r in 1..40 {
        feed(&mut a, iv * r, iv, cap, &mut ts, &rates, &mut targets);
    }
    assert!(targets[0] >= 950, "{targets:?}");
}

#[test]
fn a_tenant_gone_quiet_gives_its_memory_between_decisions() {
    let cap = 1000;
    let mut ts = vec![tenant(0, cap, uniform(cap, 800.0)), tenant(0, cap, uniform(cap, 800.0))];
    let mut a = Marginal::new(MarginalConfig::default());
    let iv = Duration::from_secs(5);
    let rounds = run(&mut a, cap, &mut ts, &[100, 100], 10, iv);
    let mut targets = rounds.last().unwrap().clone();
    assert!(targets[0] >= 400, "{targets:?}");
    let ask = |ts: &mut [TenantSample], i: usize, n: u64| {
        ts[i].hits += n;
        ts[i].misses += n;
    };
    // The last decision was at 45 s. Both ask at 46 s, then nobody: a stall.
    ask(&mut ts, 0, 100);
    ask(&mut ts, 1, 100);
    a.decide(Duration::from_secs(46), cap, &ts, &mut targets);
    a.decide(Duration::from_secs(50), cap, &ts, &mut targets);
    let before = targets.clone();
    a.decide(Duration::from_millis(51_500), cap, &ts, &mut targets);
    assert_eq!(targets, before, "a stall is not silence");
    // Tenant 1 asks again, tenant 0 does not: more than an interval after its last GET,
    // between decisions (the next is at 55 s), its memory is reclaimed.
    ask(&mut ts, 1, 500);
    a.decide(Duration::from_secs(52), cap, &ts, &mut targets);
    assert!(targets[1] >= 795, "{targets:?}");
}
