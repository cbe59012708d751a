//! Targets enforced by the store (every `server.allocation` but `shared`): random PUT, GET
//! and DEL sequences from several tenants with random targets, against the rule that a
//! tenant at or below its target never loses a block to another tenant's insert.

use farcache_policy::PolicyKind;
use farcache_server::{Store, StoreConfig};
use farcache_wire::{Key, PutStatus};
use proptest::prelude::*;

const SLOT: u32 = 64;
const TENANTS: u16 = 3;

fn key(k: u16) -> Key {
    Key::new(u128::from(k) << 64, u64::from(k % 7), 1)
}

fn store(policy: PolicyKind, slots: u32, targets: [u64; 3]) -> Store {
    sharded(policy, 1, slots, targets)
}

/// A store with targets enforced (in slots), `shards` shards of `slots_per_shard`.
fn sharded(policy: PolicyKind, shards: u32, slots_per_shard: u32, targets: [u64; 3]) -> Store {
    let mut store = Store::new(StoreConfig { shards, slots_per_shard, slot_bytes: SLOT, policy, max_tenants: 4 });
    store.set_enforce_targets(true);
    for (t, blocks) in targets.iter().enumerate() {
        store.set_tenant_limit(t as u16, blocks * u64::from(SLOT));
    }
    store
}

#[derive(Clone, Debug)]
enum Op {
    Put(u16, u16),
    Get(u16, u16),
    Del(u16, u16),
    /// A new target for a tenant (the allocator's tick).
    Target(u16, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..TENANTS, 0..200u16).prop_map(|(t, k)| Op::Put(t, k)),
        3 => (0..TENANTS, 0..200u16).prop_map(|(t, k)| Op::Get(t, k)),
        1 => (0..TENANTS, 0..200u16).prop_map(|(t, k)| Op::Del(t, k)),
        1 => (0..TENANTS, 0..40u64).prop_map(|(t, b)| Op::Target(t, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With `fill_unused` (`mrc`), a tenant may also grow past its target into never-used
    /// slots (while the store has never been full); the rule for the others is the same.
    #[test]
    fn a_tenant_within_its_target_never_loses_blocks_to_another(
        policy in prop_oneof![Just(PolicyKind::Lru), Just(PolicyKind::S3Fifo)],
        targets in [0..40u64, 0..40u64, 0..40u64],
        fill in any::<bool>(),
        ops in prop::collection::vec(op(), 1..600),
    ) {
        let slots = 48;
        let mut store = store(policy, slots, targets);
        store.set_fill_unused(fill);
        let mut targets = targets;
        let mut peak = 0;
        for op in ops {
            let before: Vec<u64> = (0..TENANTS).map(|t| store.tenant_counters(t).blocks).collect();
            match op {
                Op::Put(t, k) => {
                    let status = store.put(t, &key(k), &[t as u8; 8]);
                    prop_assert!(matches!(status, PutStatus::Stored | PutStatus::NoSpace), "{:?}", status);
                    for o in 0..TENANTS {
                        let now = store.tenant_counters(o).blocks;
                        if o != t && before[o as usize] <= targets[o as usize] {
                            prop_assert!(now >= before[o as usize],
                                "tenant {} within its target {} lost a block to tenant {}'s PUT", o, targets[o as usize], t);
                        }
                    }
                    // The inserting tenant never ends above its target by its own insert
                    // (but into a never-used slot, with `fill_unused`).
                    let mine = store.tenant_counters(t).blocks;
                    let unused = fill && peak < u64::from(slots);
                    prop_assert!(mine <= targets[t as usize].max(before[t as usize]) || unused);
                    // Above its target, its insert never grows it (but into a never-used slot).
                    if before[t as usize] > targets[t as usize] && !unused {
                        prop_assert!(mine <= before[t as usize]);
                    }
                }
                Op::Get(t, k) => {
                    store.get(t, &key(k), |v| assert_eq!(v[0], t as u8));
                }
                Op::Del(t, k) => {
                    store.del(t, &key(k));
                }
                Op::Target(t, b) => {
                    targets[t as usize] = b;
                    store.set_tenant_limit(t, b * u64::from(SLOT));
                }
            }
            let total: u64 = (0..TENANTS).map(|t| store.tenant_counters(t).blocks).sum();
            prop_assert!(total <= u64::from(slots));
            peak = peak.max(total);
        }
    }
}

/// Warm-up (`fill_unused`, `mrc`): a tenant at its target takes never-used slots rather
/// than evict its own blocks, and gives them back as the tenant below its target fills.
/// Without it, the first tenant thrashes in its target while the rest of the store is empty.
#[test]
fn at_warm_up_a_tenant_fills_never_used_slots_and_gives_them_back() {
    for fill in [false, true] {
        let mut store = store(PolicyKind::S3Fifo, 64, [16, 48, 0]);
        store.set_fill_unused(fill);
        for k in 0..40 {
            assert_eq!(store.put(0, &Key::new(7 << 64, k, 1), &[0; 8]), PutStatus::Stored);
        }
        assert_eq!(store.tenant_counters(0).blocks, if fill { 40 } else { 16 }, "fill_unused {fill}");
        // Tenant 1 fills its target: tenant 0's blocks above its own go, none below.
        for k in 0..48 {
            assert_eq!(store.put(1, &Key::new(9 << 64, k, 1), &[1; 8]), PutStatus::Stored);
        }
        assert_eq!(store.tenant_counters(1).blocks, 48);
        assert_eq!(store.tenant_counters(0).blocks, 16);
        // Warm now: at its target, tenant 0 only replaces its own blocks.
        for k in 100..140 {
            store.put(0, &Key::new(7 << 64, k, 1), &[0; 8]);
        }
        assert_eq!(store.tenant_counters(0).blocks, 16);
    }
}

/// The warm-up's never-used slots never take a tenant past its configured limit (its
/// ceiling), only past a target the allocator set below it.
#[test]
fn warm_up_never_passes_a_configured_limit() {
    let mut store = store(PolicyKind::S3Fifo, 64, [16, 48, 0]);
    store.set_fill_unused(true);
    store.set_tenant_ceiling(0, 24 * u64::from(SLOT));
    for k in 0..40 {
        assert_eq!(store.put(0, &Key::new(7 << 64, k, 1), &[0; 8]), PutStatus::Stored);
    }
    assert_eq!(store.tenant_counters(0).blocks, 24, "a target of 16 under a limit of 24");
}

/// A scan (every key new) beside a tenant holding its target: the scan evicts only its own
/// blocks once memory is full, and the other tenant keeps every block.
#[test]
fn a_scan_cannot_push_another_tenant_below_its_target() {
    let store = store(PolicyKind::S3Fifo, 64, [16, 48, 0]);
    for k in 0..16 {
        assert_eq!(store.put(0, &key(k), &[0; 8]), PutStatus::Stored);
    }
    for k in 0..2000u64 {
        store.put(1, &Key::new(9 << 64, k, 1), &[1; 8]);
    }
    assert_eq!(store.tenant_counters(0).blocks, 16);
    assert_eq!(store.tenant_counters(0).evictions, 0);
    for k in 0..16 {
        assert!(store.get(0, &key(k), |_| ()), "tenant 0 lost key {k}");
    }
    // Lowering tenant 0's target makes its blocks fair game for tenant 1's inserts.
    store.set_tenant_limit(0, 4 * u64::from(SLOT));
    store.set_tenant_limit(1, 60 * u64::from(SLOT));
    for k in 2000..2100u64 {
        store.put(1, &Key::new(9 << 64, k, 1), &[1; 8]);
    }
    assert_eq!(store.tenant_counters(0).blocks, 4);
    assert_eq!(store.tenant_counters(1).blocks, 60);
}

/// Targets count over the whole store: a tenant holding exactly its target keeps every
/// block however its keys hash across shards (a per-shard even share would leave the
/// shards where it has more than a quarter of its keys open to the scan).
#[test]
fn targets_hold_over_the_whole_store_not_per_shard() {
    for seed in 0..8u64 {
        let store = sharded(PolicyKind::Lru, 4, 16, [16, 48, 0]);
        let mine: Vec<Key> = (0..16).map(|k| Key::new(u128::from(seed) << 8, k, 1)).collect();
        for k in &mine {
            assert_eq!(store.put(0, k, &[0; 8]), PutStatus::Stored);
        }
        for k in 0..2000 {
            let _ = store.put(1, &Key::new(9 << 64, k, 1), &[1; 8]);
        }
        let held = mine.iter().filter(|k| store.get(0, k, |_| ())).count();
        assert_eq!(held, 16, "seed {seed}: tenant 0 kept {held} of the 16 blocks of its target");
        // The scan is held near its own target: at most one block per shard above it.
        assert!(store.tenant_counters(1).blocks <= 48 + 4);
    }
}

/// Values and minimums for the swaps across shards, as the allocation timer sets them.
fn valued(store: &Store, values: [u64; 3], floors: [u64; 3], short: [bool; 3]) {
    for t in 0..TENANTS {
        store.set_tenant_value(t, values[t as usize], values[t as usize]);
        store.set_tenant_floor(t, floors[t as usize]);
        store.set_tenant_short(t, short[t as usize]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Swaps across shards: random operations on a sharded store with random targets,
    /// values, minimums and short flags. Another tenant's insert takes a block from a tenant
    /// within its target only in a swap — one block, to a short tenant of higher value, never
    /// below its minimum —; the inserting tenant never grows more than a block past its target; the
    /// store never holds more than its slots.
    #[test]
    fn swaps_move_blocks_only_up_in_value_and_never_below_a_minimum(
        policy in prop_oneof![Just(PolicyKind::Lru), Just(PolicyKind::S3Fifo)],
        targets in [0..40u64, 0..40u64, 0..40u64],
        values in [0..4u64, 0..4u64, 0..4u64],
        floors in [0..12u64, 0..12u64, 0..12u64],
        short in [any::<bool>(), any::<bool>(), any::<bool>()],
        ops in prop::collection::vec(op(), 1..600),
    ) {
        let (shards, per_shard) = (4, 12);
        let store = sharded(policy, shards, per_shard, targets);
        valued(&store, values, floors, short);
        let mut targets = targets;
        for op in ops {
            let before: Vec<u64> = (0..TENANTS).map(|t| store.tenant_counters(t).blocks).collect();
            match op {
                Op::Put(t, k) => {
                    let status = store.put(t, &key(k), &[t as u8; 8]);
                    prop_assert!(matches!(status, PutStatus::Stored | PutStatus::NoSpace), "{:?}", status);
                    for o in 0..TENANTS {
                        let (was, now) = (before[o as usize], store.tenant_counters(o).blocks);
                        if o != t && was <= targets[o as usize] && now < was {
                            prop_assert_eq!(now + 1, was, "tenant {} lost more than one block", o);
                            prop_assert!(short[t as usize] && values[o as usize] < values[t as usize],
                                "tenant {} (value {}) lost a block to tenant {} (value {})", o, values[o as usize], t, values[t as usize]);
                            prop_assert!(now >= floors[o as usize].min(was), "tenant {} pushed below its minimum", o);
                        }
                    }
                    let mine = store.tenant_counters(t).blocks;
                    prop_assert!(mine <= targets[t as usize].max(before[t as usize]) + 1);
                }
                Op::Get(t, k) => {
                    store.get(t, &key(k), |v| assert_eq!(v[0], t as u8));
                }
                Op::Del(t, k) => {
                    store.del(t, &key(k));
                }
                Op::Target(t, b) => {
                    targets[t as usize] = b;
                    store.set_tenant_limit(t, b * u64::from(SLOT));
                }
            }
            let total: u64 = (0..TENANTS).map(|t| store.tenant_counters(t).blocks).sum();
            prop_assert!(total <= u64::from(shards * per_shard));
        }
    }
}

/// Placement: a tenant at its target whose keys move into a few shards (a phase change:
/// its old blocks sit everywhere) still gets its working set's hits. Without swaps it
/// keeps its old share of each shard, about 4 blocks, and thrashes 14 keys through them.
#[test]
fn a_tenant_whose_keys_crowd_into_a_few_shards_still_reaches_its_hits() {
    let (shards, per_shard) = (16u32, 64u32);
    // Tenant 0 misses everywhere (a large uniform set); tenant 1 holds a small working set.
    let store = sharded(PolicyKind::S3Fifo, shards, per_shard, [960, 64, 0]);
    // As the timer measures them: tenant 1's blocks are hit far more often than tenant 0's.
    // Tenant 1 is short: it hits less than its curve predicts at its target.
    valued(&store, [1 << 20, 1 << 30, 0], [800, 0, 0], [true, true, false]);
    let big = |k: u64| Key::new(7 << 64, k, 1);
    let small = |k: u64| Key::new(8 << 64, k, 1);
    // Phase 1: tenant 1's 64 blocks spread over every shard, tenant 0 fills the rest.
    for k in 0..64 {
        assert_eq!(store.put(1, &small(k), &[1; 8]), PutStatus::Stored);
    }
    let mut next_big = 0;
    for _ in 0..3000 {
        store.put(0, &big(next_big), &[0; 8]);
        next_big += 1;
    }
    assert_eq!(store.tenant_counters(1).blocks, 64);
    // Phase 2: 56 new keys of tenant 1, all in shards 0..4 (14 in each).
    let mut per = [0u32; 4];
    let mut keys = vec![];
    for k in 1000.. {
        let sh = store.shard_of(1, &small(k));
        if sh < 4 && per[sh] < 14 {
            per[sh] += 1;
            keys.push(small(k));
        }
        if keys.len() == 56 {
            break;
        }
    }
    let mut hits_late = 0;
    for round in 0..60 {
        for k in &keys {
            if store.get(1, k, |_| ()) {
                hits_late += usize::from(round >= 50);
            } else {
                store.put(1, k, &[1; 8]);
            }
            // Tenant 0 keeps missing everywhere.
            store.put(0, &big(next_big), &[0; 8]);
            next_big += 1;
        }
        assert!(store.tenant_counters(0).blocks >= 800, "tenant 0 below its minimum");
        assert!(store.tenant_counters(1).blocks <= 64 + 1, "tenant 1 above its target");
    }
    assert!(hits_late >= 10 * 56 * 95 / 100, "tenant 1 hit {hits_late} of {} in the last 10 rounds", 10 * 56);
    assert!(store.swaps() > 0);
}
