//! The block store: an arena of fixed slots reserved up front, split into shards that each
//! have their own lock, index, eviction policy and per-tenant accounting.
//!
//! Memory is bounded by construction: every structure is sized from the slot count when the
//! store is made, and nothing on the data path allocates. The arena is allocated zeroed, so
//! the kernel maps its pages as they are first written: resident memory grows with what is
//! stored and never passes capacity plus the bookkeeping (see `overhead_bytes`).
//!
//! Tenants are the policy's classes. Each tenant has a quota per shard (its limit divided
//! evenly among shards); a PUT from a tenant at its quota evicts that tenant's own victim,
//! and a PUT into a full shard evicts from the tenant furthest over its share. A later
//! allocator re-divides quotas by measured hit ratio through `set_tenant_limit`.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering};

use farcache_policy::{AnyPolicy, ClassId, PolicyKind};
use farcache_wire::{Key, PutStatus};
use hashbrown::HashTable;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// A tenant's dense id: its index in the server's tenant table and its policy class.
pub type TenantId = u16;

/// What the store is built from (derived from `ServerConfig`).
#[derive(Clone, Copy, Debug)]
pub struct StoreConfig {
    pub shards: u32,
    pub slots_per_shard: u32,
    pub slot_bytes: u32,
    pub policy: PolicyKind,
    pub max_tenants: u16,
}

/// Per-slot bookkeeping: the owner's key, so eviction can find the index entry. 40 bytes
/// (no u128 field, whose 16-byte alignment would pad it to 48).
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct PackedMeta {
    file_lo: u64,
    file_hi: u64,
    block: u64,
    epoch: u64,
    tenant: TenantId,
    _pad: u16,
    len: u32,
}
const _: () = assert!(std::mem::size_of::<PackedMeta>() == 40);

impl PackedMeta {
    fn new(tenant: TenantId, key: &Key, len: u32) -> Self {
        PackedMeta {
            file_lo: key.file as u64,
            file_hi: (key.file >> 64) as u64,
            block: key.block,
            epoch: key.epoch,
            tenant,
            _pad: 0,
            len,
        }
    }
    #[inline]
    fn matches(&self, tenant: TenantId, key: &Key) -> bool {
        self.tenant == tenant
            && self.file_lo == key.file as u64
            && self.file_hi == (key.file >> 64) as u64
            && self.block == key.block
            && self.epoch == key.epoch
    }
    fn key(&self) -> Key {
        Key::new(((self.file_hi as u128) << 64) | self.file_lo as u128, self.block, self.epoch)
    }
}

/// Counters of one tenant (in one shard, or summed over all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantCounters {
    pub blocks: u64,
    pub hits: u64,
    pub misses: u64,
    pub puts: u64,
    pub put_rejects: u64,
    pub dels: u64,
    pub evictions: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl TenantCounters {
    /// Add `o`'s counts (summing shards, tenants or lenders).
    pub fn add(&mut self, o: &TenantCounters) {
        self.blocks += o.blocks;
        self.hits += o.hits;
        self.misses += o.misses;
        self.puts += o.puts;
        self.put_rejects += o.put_rejects;
        self.dels += o.dels;
        self.evictions += o.evictions;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
    }

    /// The counts from `earlier` to now; `blocks` is a level, kept as now.
    pub fn since(&self, earlier: &TenantCounters) -> TenantCounters {
        let d = |now: u64, then: u64| now.saturating_sub(then);
        TenantCounters {
            blocks: self.blocks,
            hits: d(self.hits, earlier.hits),
            misses: d(self.misses, earlier.misses),
            puts: d(self.puts, earlier.puts),
            put_rejects: d(self.put_rejects, earlier.put_rejects),
            dels: d(self.dels, earlier.dels),
            evictions: d(self.evictions, earlier.evictions),
            bytes_in: d(self.bytes_in, earlier.bytes_in),
            bytes_out: d(self.bytes_out, earlier.bytes_out),
        }
    }
}

struct Shard {
    data: Box<[u8]>,
    meta: Box<[PackedMeta]>,
    /// Slot ids, hashed by (tenant, key) of the slot's meta.
    index: HashTable<u32>,
    /// Slots freed by DEL or overwrite; `next_unused` hands out the never-used ones first.
    free: Vec<u32>,
    next_unused: u32,
    policy: AnyPolicy,
    tenants: Box<[TenantCounters]>,
    /// Tenants with at least one block here: the candidates when the shard must evict.
    active: Vec<TenantId>,
}

/// Pad shards to a cache line so that locks of neighbours do not share one.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

#[inline]
fn hash_key(h: &hashbrown::DefaultHashBuilder, tenant: TenantId, key: &Key) -> u64 {
    h.hash_one((tenant, key.file, key.block, key.epoch))
}

pub struct Store {
    shards: Box<[Padded]>,
    hasher: hashbrown::DefaultHashBuilder,
    shard_mask: u64,
    slot_bytes: u32,
    slots_per_shard: u32,
    /// Per tenant: the most slots it may hold in each shard.
    quota: Box<[AtomicU32]>,
}

impl Store {
    pub fn new(cfg: StoreConfig) -> Store {
        assert!(cfg.shards.is_power_of_two());
        assert!(cfg.slots_per_shard > 0 && cfg.slots_per_shard < u32::MAX / 2);
        let n = cfg.slots_per_shard as usize;
        let shards = (0..cfg.shards)
            .map(|_| {
                Padded(Mutex::new(Shard {
                    // Zeroed allocation: pages become resident only when a slot is written.
                    data: vec![0u8; n * cfg.slot_bytes as usize].into_boxed_slice(),
                    meta: vec![PackedMeta::default(); n].into_boxed_slice(),
                    index: HashTable::with_capacity(n),
                    free: Vec::with_capacity(n),
                    next_unused: 0,
                    policy: AnyPolicy::new(cfg.policy, cfg.slots_per_shard, cfg.max_tenants),
                    tenants: vec![TenantCounters::default(); cfg.max_tenants as usize].into_boxed_slice(),
                    active: Vec::with_capacity(cfg.max_tenants as usize),
                }))
            })
            .collect();
        Store {
            shards,
            hasher: Default::default(),
            shard_mask: cfg.shards as u64 - 1,
            slot_bytes: cfg.slot_bytes,
            slots_per_shard: cfg.slots_per_shard,
            quota: (0..cfg.max_tenants).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    pub fn slot_bytes(&self) -> u32 {
        self.slot_bytes
    }

    pub fn capacity_slots(&self) -> u64 {
        self.slots_per_shard as u64 * self.shards.len() as u64
    }

    /// Set the most bytes `tenant` may hold. Enforced per shard as an even share, rounded up
    /// to a whole slot, so a tenant may exceed its limit by less than one slot per shard.
    /// Lowering a limit takes effect as the tenant next stores blocks.
    pub fn set_tenant_limit(&self, tenant: TenantId, limit_bytes: u64) {
        let slots = limit_bytes / self.slot_bytes as u64;
        let per_shard = slots.div_ceil(self.shards.len() as u64).min(self.slots_per_shard as u64);
        self.quota[tenant as usize].store(per_shard as u32, Ordering::Relaxed);
    }

    #[inline]
    fn hash(&self, tenant: TenantId, key: &Key) -> u64 {
        hash_key(&self.hasher, tenant, key)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        // hashbrown uses the low bits for buckets and the top 7 for tags: take the middle.
        &self.shards[((hash >> 32) & self.shard_mask) as usize].0
    }

    /// Look up a block; on a hit, `f` receives the value (under the shard's lock: copy it
    /// and return) and the hit counts as a transfer to the client for eviction.
    pub fn get(&self, tenant: TenantId, key: &Key, f: impl FnOnce(&[u8])) -> bool {
        let hash = self.hash(tenant, key);
        let mut guard = self.shard(hash).lock();
        let s = &mut *guard;
        let meta = &s.meta;
        match s.index.find(hash, |&slot| meta[slot as usize].matches(tenant, key)) {
            Some(&slot) => {
                let m = &s.meta[slot as usize];
                let start = slot as usize * self.slot_bytes as usize;
                let value = &s.data[start..start + m.len as usize];
                f(value);
                s.policy.touch(slot);
                let c = &mut s.tenants[tenant as usize];
                c.hits += 1;
                c.bytes_out += value.len() as u64;
                true
            }
            None => {
                s.tenants[tenant as usize].misses += 1;
                false
            }
        }
    }

    /// Store a block, evicting as needed. Never allocates.
    pub fn put(&self, tenant: TenantId, key: &Key, value: &[u8]) -> PutStatus {
        let hash = self.hash(tenant, key);
        let mut guard = self.shard(hash).lock();
        let s = &mut *guard;
        if value.len() > self.slot_bytes as usize {
            s.tenants[tenant as usize].put_rejects += 1;
            return PutStatus::TooLarge;
        }
        let quota = self.quota[tenant as usize].load(Ordering::Relaxed);
        let meta = &s.meta;
        let slot = match s.index.find(hash, |&slot| meta[slot as usize].matches(tenant, key)).copied() {
            Some(slot) => {
                // Overwrite in place; it counts as a fresh insertion for eviction.
                s.policy.remove(slot);
                slot
            }
            None => match self.take_slot(s, tenant, quota) {
                Some(slot) => {
                    let hasher = &self.hasher;
                    let meta = &s.meta;
                    s.index.insert_unique(hash, slot, |&x| {
                        let m = &meta[x as usize];
                        hash_key(hasher, m.tenant, &m.key())
                    });
                    let c = &mut s.tenants[tenant as usize];
                    if c.blocks == 0 {
                        s.active.push(tenant);
                    }
                    c.blocks += 1;
                    slot
                }
                None => {
                    s.tenants[tenant as usize].put_rejects += 1;
                    return PutStatus::NoSpace;
                }
            },
        };
        s.meta[slot as usize] = PackedMeta::new(tenant, key, value.len() as u32);
        let start = slot as usize * self.slot_bytes as usize;
        s.data[start..start + value.len()].copy_from_slice(value);
        s.policy.insert(slot, tenant as ClassId, hash);
        let c = &mut s.tenants[tenant as usize];
        c.puts += 1;
        c.bytes_in += value.len() as u64;
        PutStatus::Stored
    }

    /// A free slot for a new block of `tenant`, evicting if the tenant is at its quota or the
    /// shard is full. `None` if the tenant may hold nothing here.
    fn take_slot(&self, s: &mut Shard, tenant: TenantId, quota: u32) -> Option<u32> {
        if quota == 0 {
            return None;
        }
        if s.tenants[tenant as usize].blocks >= quota as u64 {
            return self.evict_from(s, tenant);
        }
        if let Some(slot) = s.free.pop() {
            return Some(slot);
        }
        if s.next_unused < self.slots_per_shard {
            s.next_unused += 1;
            return Some(s.next_unused - 1);
        }
        // Full: evict from the tenant that holds the most relative to its quota.
        let victim = s
            .active
            .iter()
            .copied()
            .max_by_key(|&t| {
                let q = self.quota[t as usize].load(Ordering::Relaxed).max(1) as u64;
                // Compare blocks/quota without floating point: scale by 2^16.
                (s.tenants[t as usize].blocks << 16) / q
            })
            .expect("a full shard has an active tenant");
        self.evict_from(s, victim)
    }

    /// Evict one block of `tenant` and return its slot, now unowned.
    fn evict_from(&self, s: &mut Shard, tenant: TenantId) -> Option<u32> {
        let slot = s.policy.evict(tenant as ClassId)?;
        let m = s.meta[slot as usize];
        debug_assert_eq!(m.tenant, tenant);
        let hash = self.hash(m.tenant, &m.key());
        match s.index.find_entry(hash, |&x| x == slot) {
            Ok(e) => {
                e.remove();
            }
            Err(_) => unreachable!("evicted slot {slot} is not indexed"),
        }
        let c = &mut s.tenants[tenant as usize];
        c.blocks -= 1;
        c.evictions += 1;
        if c.blocks == 0 {
            s.active.retain(|&t| t != tenant);
        }
        Some(slot)
    }

    /// Remove a block. Returns whether it was there.
    pub fn del(&self, tenant: TenantId, key: &Key) -> bool {
        let hash = self.hash(tenant, key);
        let mut guard = self.shard(hash).lock();
        let s = &mut *guard;
        let meta = &s.meta;
        let Ok(entry) = s.index.find_entry(hash, |&slot| meta[slot as usize].matches(tenant, key)) else {
            return false;
        };
        let (slot, _) = entry.remove();
        s.policy.remove(slot);
        s.free.push(slot);
        let c = &mut s.tenants[tenant as usize];
        c.blocks -= 1;
        c.dels += 1;
        if c.blocks == 0 {
            s.active.retain(|&t| t != tenant);
        }
        true
    }

    /// Counters of one tenant, summed over shards.
    pub fn tenant_counters(&self, tenant: TenantId) -> TenantCounters {
        let mut sum = TenantCounters::default();
        for sh in self.shards.iter() {
            sum.add(&sh.0.lock().tenants[tenant as usize]);
        }
        sum
    }

    /// Counters of every tenant id, summed over shards (one lock per shard).
    pub fn all_counters(&self, tenants: usize) -> Vec<TenantCounters> {
        let mut sums = vec![TenantCounters::default(); tenants];
        for sh in self.shards.iter() {
            let s = sh.0.lock();
            for (sum, c) in sums.iter_mut().zip(s.tenants.iter()) {
                sum.add(c);
            }
        }
        sums
    }

    /// Heap bytes of everything but the arena: the per-block overhead that the 2% budget
    /// speaks of (meta, index, free list, policy, per-tenant counters).
    pub fn overhead_bytes(&self) -> u64 {
        let mut total = 0u64;
        for sh in self.shards.iter() {
            let s = sh.0.lock();
            total += (s.meta.len() * std::mem::size_of::<PackedMeta>()) as u64;
            // hashbrown: one u32 and one control byte per bucket; buckets = capacity * 8 / 7 rounded up to a power of two.
            let buckets = (s.index.capacity() * 8 / 7).next_power_of_two();
            total += (buckets * (std::mem::size_of::<u32>() + 1)) as u64;
            total += (s.free.capacity() * 4) as u64;
            total += s.policy.memory_bytes() as u64;
            total += (s.tenants.len() * std::mem::size_of::<TenantCounters>() + s.active.capacity() * 2) as u64;
        }
        total
    }
}
