//! The store against a simple model: random operation sequences from several tenants into a
//! small store. A GET returns the last value PUT under that tenant and key, or a miss —
//! never another key's or tenant's data, never an older value — and capacity and tenant
//! quotas are never exceeded.

use std::collections::HashMap;

use farcache_policy::PolicyKind;
use farcache_server::{Store, StoreConfig};
use farcache_wire::{Key, PutStatus};
use proptest::prelude::*;

const SLOT: u32 = 64;

#[derive(Clone, Debug)]
enum Op {
    Put { tenant: u16, key: u8, len: u8 },
    Get { tenant: u16, key: u8 },
    Del { tenant: u16, key: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u16..3, any::<u8>(), 0u8..=64).prop_map(|(tenant, key, len)| Op::Put { tenant, key, len }),
        4 => (0u16..3, any::<u8>()).prop_map(|(tenant, key)| Op::Get { tenant, key }),
        1 => (0u16..3, any::<u8>()).prop_map(|(tenant, key)| Op::Del { tenant, key }),
    ]
}

fn key(k: u8) -> Key {
    // Keys that differ only in one field each, to catch a comparison that forgets one.
    Key::new((k % 4) as u128 * (1 << 70), (k / 4 % 8) as u64, (k / 32) as u64)
}

/// A value that names its tenant, key and version, padded to `len` bytes.
fn value(tenant: u16, k: u8, version: u32, len: u8) -> Vec<u8> {
    let mut v = Vec::with_capacity(len as usize);
    let tag = [tenant as u8, k, version as u8, (version >> 8) as u8];
    while v.len() < len as usize {
        v.push(tag[v.len() % 4]);
    }
    v
}

fn run(
    policy: PolicyKind,
    shards: u32,
    slots_per_shard: u32,
    limits: [u64; 3],
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let store = Store::new(StoreConfig { shards, slots_per_shard, slot_bytes: SLOT, policy, max_tenants: 4 });
    for (t, l) in limits.iter().enumerate() {
        store.set_tenant_limit(t as u16, *l);
    }
    let capacity = (shards * slots_per_shard) as u64;
    // Model: (tenant, key) -> (version, value) of the last stored PUT.
    let mut model: HashMap<(u16, u8), Vec<u8>> = HashMap::new();
    let mut version = 0u32;
    for op in ops {
        match op {
            Op::Put { tenant, key: k, len } => {
                version += 1;
                let v = value(tenant, k, version, len);
                let status = store.put(tenant, &key(k), &v);
                if limits[tenant as usize] < SLOT as u64 {
                    prop_assert_eq!(status, PutStatus::NoSpace);
                    // A refused PUT must not leave the old value readable as if current.
                    model.remove(&(tenant, k));
                    store.del(tenant, &key(k));
                } else {
                    prop_assert_eq!(status, PutStatus::Stored);
                    model.insert((tenant, k), v);
                }
            }
            Op::Get { tenant, key: k } => {
                let mut got = None;
                let hit = store.get(tenant, &key(k), |v| got = Some(v.to_vec()));
                prop_assert_eq!(hit, got.is_some());
                if let Some(got) = got {
                    prop_assert_eq!(Some(&got), model.get(&(tenant, k)), "tenant {} key {}", tenant, k);
                }
            }
            Op::Del { tenant, key: k } => {
                let removed = store.del(tenant, &key(k));
                if removed {
                    prop_assert!(model.contains_key(&(tenant, k)));
                }
                model.remove(&(tenant, k));
                prop_assert!(!store.get(tenant, &key(k), |_| ()));
            }
        }
        let counters: Vec<_> = (0..3).map(|t| store.tenant_counters(t)).collect();
        let total: u64 = counters.iter().map(|c| c.blocks).sum();
        prop_assert!(total <= capacity, "{} blocks in {} slots", total, capacity);
        for (t, c) in counters.iter().enumerate() {
            let quota_slots = (limits[t] / SLOT as u64).div_ceil(shards as u64) * shards as u64;
            prop_assert!(c.blocks <= quota_slots, "tenant {} holds {} > quota {}", t, c.blocks, quota_slots);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn lru_matches_model(ops in prop::collection::vec(op(), 1..400), shards in prop::sample::select(vec![1u32, 2, 4])) {
        run(PolicyKind::Lru, shards, 8, [u64::MAX / 2, 10 * SLOT as u64, 0], ops)?;
    }

    #[test]
    fn s3fifo_matches_model(ops in prop::collection::vec(op(), 1..400), shards in prop::sample::select(vec![1u32, 2, 4])) {
        run(PolicyKind::S3Fifo, shards, 8, [u64::MAX / 2, 10 * SLOT as u64, 0], ops)?;
    }

    #[test]
    fn roomy_store_forgets_nothing(ops in prop::collection::vec(op(), 1..300)) {
        // 3 tenants x 256 keys fit: every stored value must be found.
        let store = Store::new(StoreConfig { shards: 2, slots_per_shard: 1024, slot_bytes: SLOT, policy: PolicyKind::S3Fifo, max_tenants: 3 });
        for t in 0..3 { store.set_tenant_limit(t, 1 << 30); }
        let mut model: HashMap<(u16, u8), Vec<u8>> = HashMap::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Put { tenant, key: k, len } => {
                    let v = value(tenant, k, i as u32, len);
                    prop_assert_eq!(store.put(tenant, &key(k), &v), PutStatus::Stored);
                    model.insert((tenant, k), v);
                }
                Op::Get { tenant, key: k } => {
                    let mut got = None;
                    store.get(tenant, &key(k), |v| got = Some(v.to_vec()));
                    prop_assert_eq!(got.as_ref(), model.get(&(tenant, k)));
                }
                Op::Del { tenant, key: k } => {
                    prop_assert_eq!(store.del(tenant, &key(k)), model.remove(&(tenant, k)).is_some());
                }
            }
        }
    }
}

#[test]
fn too_large_values_are_refused() {
    let store = Store::new(StoreConfig {
        shards: 1,
        slots_per_shard: 4,
        slot_bytes: SLOT,
        policy: PolicyKind::Lru,
        max_tenants: 1,
    });
    store.set_tenant_limit(0, 1 << 20);
    assert_eq!(store.put(0, &key(1), &[0; SLOT as usize + 1]), PutStatus::TooLarge);
    assert_eq!(store.put(0, &key(1), &[7; SLOT as usize]), PutStatus::Stored);
}

#[test]
fn lru_evicts_least_recently_transferred() {
    let store = Store::new(StoreConfig {
        shards: 1,
        slots_per_shard: 3,
        slot_bytes: SLOT,
        policy: PolicyKind::Lru,
        max_tenants: 1,
    });
    store.set_tenant_limit(0, 1 << 20);
    for k in 0..3 {
        store.put(0, &key(k), &[k]);
    }
    assert!(store.get(0, &key(0), |_| ())); // 0 is now the most recent transfer to a client
    store.put(0, &key(3), &[3]); // evicts 1
    assert!(store.get(0, &key(0), |_| ()));
    assert!(!store.get(0, &key(1), |_| ()));
    assert!(store.get(0, &key(2), |_| ()));
    assert_eq!(store.tenant_counters(0).evictions, 1);
}

#[test]
fn full_shard_evicts_from_the_tenant_furthest_over_its_share() {
    let store = Store::new(StoreConfig {
        shards: 1,
        slots_per_shard: 8,
        slot_bytes: SLOT,
        policy: PolicyKind::Lru,
        max_tenants: 2,
    });
    store.set_tenant_limit(0, 8 * SLOT as u64);
    store.set_tenant_limit(1, 4 * SLOT as u64);
    for k in 0..6 {
        store.put(0, &key(k), &[k]);
    }
    for k in 0..2 {
        store.put(1, &key(k), &[k]);
    }
    // Full: tenant 0 holds 6/8 of its share, tenant 1 2/4; tenant 1's PUT evicts tenant 0's block.
    store.put(1, &key(2), &[2]);
    assert_eq!(store.tenant_counters(0).blocks, 5);
    assert_eq!(store.tenant_counters(1).blocks, 3);
    // Now tenant 1 is fuller relative to its limit (3/4 > 5/8): its PUT evicts its own block,
    // and tenant 0's PUT evicts tenant 1's.
    store.put(1, &key(3), &[3]);
    assert_eq!((store.tenant_counters(0).blocks, store.tenant_counters(1).blocks), (5, 3));
    store.put(0, &key(6), &[6]);
    assert_eq!((store.tenant_counters(0).blocks, store.tenant_counters(1).blocks), (6, 2));
    // At its quota, a tenant evicts its own blocks even with room in the shard.
    store.set_tenant_limit(1, 2 * SLOT as u64);
    store.del(0, &key(6));
    store.put(1, &key(4), &[4]);
    assert_eq!((store.tenant_counters(0).blocks, store.tenant_counters(1).blocks), (5, 2));
    assert!(store.get(1, &key(4), |_| ()));
}

/// The 2% budget: bookkeeping beside the arena, per 4 KiB slot, at 1 GiB of slots.
#[test]
fn overhead_is_within_two_percent_of_payload() {
    let slots: u64 = (1 << 30) / 4096;
    for policy in [PolicyKind::Lru, PolicyKind::S3Fifo] {
        let store = Store::new(StoreConfig {
            shards: 64,
            slots_per_shard: (slots / 64) as u32,
            slot_bytes: 4096,
            policy,
            max_tenants: 64,
        });
        let per_slot = store.overhead_bytes() as f64 / slots as f64;
        let pct = 100.0 * per_slot / 4096.0;
        println!("{policy:?}: {per_slot:.1} bytes per slot = {pct:.2}% of a 4 KiB block");
        assert!(pct <= 2.0, "{policy:?}: overhead {pct:.2}% > 2%");
    }
}
