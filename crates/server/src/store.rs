//! The block store: an arena of fixed slots reserved up front, split into shards that each
//! have their own lock, index, eviction policy and per-tenant accounting.
//!
//! Memory is bounded by construction: every structure is sized from the slot count when the
//! store is made, and nothing on the data path allocates. The arena is allocated zeroed, so
//! the kernel maps its pages as they are first written: resident memory grows with what is
//! stored and never passes capacity plus the bookkeeping (see `overhead_bytes`).
//!
//! Tenants are the policy's classes. Each tenant has a quota per shard (its limit, or under
//! an allocator its target, divided evenly among shards); a PUT from a tenant at its quota
//! evicts that tenant's own victim. A PUT into a full shard evicts:
//! - with `allocation = "shared"` (quotas are limits, which may overbook): from the tenant
//!   fullest relative to its quota;
//! - with targets (`set_enforce_targets`), which count over the whole store rather than per
//!   shard (so a tenant's guarantee does not depend on how its keys hash): a tenant at its
//!   target evicts its own block; a full shard evicts from the tenant furthest above its
//!   target that holds blocks there; if no tenant is above, from the inserting tenant itself,
//!   and if it holds nothing there the PUT is refused (`NoSpace`). So a tenant at or below its
//!   target never loses a block to another tenant's insert, but in a swap (below). The
//!   allocator (`crate::alloc`) moves targets through `set_tenant_limit`; a lowered target
//!   takes effect lazily, as others insert.
//!
//! Placement: targets are whole-store but eviction is per shard, so without more a tenant's
//! blocks stay in the shards they were put in — a tenant at its target makes room in the
//! shard it inserts into, and one whose keys moved (a phase change) keeps stale blocks in
//! shards where its new keys are few and thrashes where they are many; a tenant below its
//! target, in a full shard where nobody is above theirs, evicts its own (session 9: a loop
//! held 2,388 blocks of its target of 2,464 for a loop of 2,457). So a tenant that needs a
//! slot in a full shard may *swap* if it is *short*: its measured hit ratio falls short of
//! what its miss-ratio curve predicts at its target by [`crate::alloc::SHORT_GAP`] (a
//! placement loss). Only `mrc` predicts, so only `mrc` swaps: without a prediction a loop
//! that does not fit its target looks the same, and moving its blocks to where it misses
//! only spreads the misses (measured: `static` on bench alloc's loop, +38% misses). In a
//! swap the tenant takes the victim of the tenant of lowest *cost* in the shard (what one
//! block less costs it: its curve's marginal hits per block at its target), if that cost
//! is below the taker's *value* (its predicted hits per block at its target: what a block
//! where its keys are is worth), never below the donor's minimum — both measured by the
//! allocation timer, so a loop still filling, with few hits yet, is not a cheap donor —, and
//! - if it is at its target, it first gives back one of its own blocks from another shard
//!   where it has not inserted for [`SLACK_INSERTS_PER_SHARD`] × shards of its inserts (its
//!   blocks there meet its demand), found among at most [`GIVE_BACK_TRIES`] shards with
//!   `try_lock`; no such shard, no swap. Its count stays at its target while its blocks
//!   follow its misses, that is, its keys.
//! - if it is below its target (and nobody in the shard is above theirs), it takes the block
//!   outright: the capacity it is owed is free or held above target elsewhere, where the
//!   donor's next inserts find it.
//!
//! So a tenant at or below its target loses a block to another tenant's insert only in a
//! swap, to a short tenant whose value exceeds its cost, one block at a time and never below its
//! minimum; it gets the capacity back from the free slot the swap left (or the taker's
//! debt) as it next inserts there. With one shard, or before the timer has set values and
//! short flags, nothing swaps. A swap costs the data path a scan of the shard's tenants and
//! at most four `try_lock`s; nothing allocates or waits.
//!
//! Warm-up (`mrc` only): while a shard still has slots never used, a tenant at or above its
//! target may take them rather than evict its own block. At start the targets are the
//! allocator's guesses — every tenant gets its static share until its curve is measured —
//! and memory nobody has filled yet costs nobody a hit: a loop just over its share keeps its
//! whole loop through its first passes instead of thrashing in its half while the other
//! half is still empty, and a fast tenant beside a slow one fills what the slow one has not
//! asked for — never past the tenant's configured `limit`, which stays a hard cap. Once
//! every slot of a shard has been used (the lender is warm) the rule is gone: a tenant
//! above its target only ever replaces its own blocks, and the tenants below
//! theirs take the excess back by eviction, as from any tenant above its target. Only `mrc`
//! does this (as only it swaps): the other modes keep the rules their measurements were
//! made with. (Tried and dropped: a tenant above its target freeing a second block of its
//! own at each insert. It freed what nobody filled — a fast tenant above its target beside
//! a slow one below it lost ~100 blocks to empty slots — and where someone does insert, the
//! eviction of tenants above their targets already makes room.)

//! Under `allocation = "mrc"` every *access* of a sampled key also feeds the tenant's
//! miss-ratio curve estimator (`crate::alloc::Sampler`), outside the shard's lock: a hash
//! test, and for sampled keys a `try_lock` (a contended sample is skipped, never waited for).
//! An access is a GET that hits or a PUT (stored or refused), not a GET that misses: a mount
//! GETs only the blocks it stored here (its index), and fills what it read from its disk with
//! a PUT, so a block's first access at the lender is its PUT, and a GET's reuse distance runs
//! from it. Counted from GETs alone, every block's first GET looked like a first access, and
//! a tenant whose every GET hit had a curve of no reuse — a scan — and lost its memory
//! (PostgreSQL tenants in `bench paper --experiment tenants`, session 19). A GET that misses
//! is not counted because the fill that follows it is (the bench's tenants and a mount with a
//! stale index both PUT what they missed).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use farcache_policy::{AnyPolicy, ClassId, PolicyKind};
use farcache_wire::{Key, PutStatus};
use hashbrown::HashTable;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::alloc::Sampler;

/// A swap gives back from a shard only where the tenant has not inserted for this many of
/// its inserts per shard (a tenant missing evenly everywhere inserts into each shard about
/// once per `shards` inserts, so a gap of twice that is rare for it, and the rule for one
/// that misses only where it is short).
pub const SLACK_INSERTS_PER_SHARD: u64 = 2;
/// Shards a give-back tries (`try_lock` each) before the swap is given up.
pub const GIVE_BACK_TRIES: u32 = 4;

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
    /// The accesses the lender did not serve, as the allocators count them: PUTs, stored or
    /// refused (a mount fills what it read from its disk; module docs). With [`Self::hits`],
    /// the tenant's accesses; its hit ratio so is the share of its reads below the page
    /// cache that the lender served, where `misses` (GETs of blocks evicted) would say only
    /// how much of what it stored survived.
    pub fn fills(&self) -> u64 {
        self.puts + self.put_rejects
    }

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
    /// Per tenant, with targets enforced: its insert clock (`Store::clock`) at its last new
    /// block here. A shard where a tenant has not inserted for a while is where its blocks
    /// satisfy its demand: the shard a swap gives back from (`Store::give_back`).
    last_insert: Box<[u64]>,
}

/// Pad shards to a cache line so that locks of neighbours do not share one.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

#[inline]
fn hash_key(h: &hashbrown::DefaultHashBuilder, tenant: TenantId, key: &Key) -> u64 {
    h.hash_one((tenant, key.file, key.block, key.epoch))
}

/// Of the tenants with blocks in shard `s`, the last one with the largest `fullness` (those
/// for which it is `None` are not candidates).
fn fullest(s: &Shard, fullness: impl Fn(TenantId) -> Option<u64>) -> Option<TenantId> {
    s.active.iter().filter_map(|&t| fullness(t).map(|f| (t, f))).max_by_key(|&(_, f)| f).map(|(t, _)| t)
}

/// `part / whole` scaled by 2^16, to compare fractions without floating point.
#[inline]
fn fraction(part: u64, whole: u64) -> u64 {
    (part << 16) / whole.max(1)
}

pub struct Store {
    shards: Box<[Padded]>,
    hasher: hashbrown::DefaultHashBuilder,
    shard_mask: u64,
    slot_bytes: u32,
    slots_per_shard: u32,
    /// Per tenant: the most slots it may hold in each shard.
    quota: Box<[AtomicU32]>,
    /// Per tenant, with targets enforced: its target in slots (whole store), and the slots
    /// it holds in all shards (kept beside the per-shard counts, under each shard's lock).
    target: Box<[AtomicU64]>,
    held: Box<[AtomicU64]>,
    /// Whether quotas are targets that others' inserts must respect (every allocation but
    /// `shared`).
    enforce_targets: bool,
    /// Whether a tenant at its target may take a never-used slot (`mrc`; module docs,
    /// "Warm-up").
    fill_unused: bool,
    /// Per tenant, the curve estimators' sampling (empty unless `allocation = "mrc"`).
    samplers: Box<[Sampler]>,
    /// Per tenant, for swaps across shards (module docs, "Placement"): its minimum in
    /// slots, its value (hits per held block per second, 2^-32 units, set by the allocation
    /// timer; 0 until set, and no tenant takes from another of equal value), its insert
    /// clock, and where its next give-back search starts.
    floor: Box<[AtomicU64]>,
    /// Per tenant: its configured `limit` in slots, which no rule passes — the warm-up's
    /// never-used slots included (a target may be lower; `u64::MAX` until set).
    ceiling: Box<[AtomicU64]>,
    value: Box<[AtomicU64]>,
    /// Per tenant: what one block less costs it (its marginal hits per block, in the units
    /// of `value`): a swap takes from a tenant whose cost is below the taker's value.
    cost: Box<[AtomicU64]>,
    /// Per tenant: whether it may take blocks in swaps (its hits fall short of what its
    /// curve predicts at its target: `Store::set_tenant_short`).
    short: Box<[AtomicBool]>,
    clock: Box<[AtomicU64]>,
    cursor: Box<[AtomicU32]>,
    /// Swaps made, and give-backs tried that found no shard (counters for STATS and tests).
    swaps: AtomicU64,
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
                    last_insert: vec![0; cfg.max_tenants as usize].into_boxed_slice(),
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
            target: (0..cfg.max_tenants).map(|_| AtomicU64::new(0)).collect(),
            held: (0..cfg.max_tenants).map(|_| AtomicU64::new(0)).collect(),
            enforce_targets: false,
            fill_unused: false,
            samplers: Box::new([]),
            floor: (0..cfg.max_tenants).map(|_| AtomicU64::new(0)).collect(),
            ceiling: (0..cfg.max_tenants).map(|_| AtomicU64::new(u64::MAX)).collect(),
            value: (0..cfg.max_tenants).map(|_| AtomicU64::new(0)).collect(),
            cost: (0..cfg.max_tenants).map(|_| AtomicU64::new(0)).collect(),
            short: (0..cfg.max_tenants).map(|_| AtomicBool::new(false)).collect(),
            clock: (0..cfg.max_tenants).map(|_| AtomicU64::new(0)).collect(),
            cursor: (0..cfg.max_tenants).map(|_| AtomicU32::new(0)).collect(),
            swaps: AtomicU64::new(0),
        }
    }

    /// Quotas become targets: a full shard never evicts a tenant at or below its quota for
    /// another tenant's insert (see the module docs). Set before the store is shared.
    pub fn set_enforce_targets(&mut self, on: bool) {
        self.enforce_targets = on;
    }

    /// Let a tenant at or above its target take never-used slots (module docs, "Warm-up").
    /// Set before the store is shared.
    pub fn set_fill_unused(&mut self, on: bool) {
        self.fill_unused = on;
    }

    /// Feed accesses (GET hits and PUTs: module docs) to per-tenant curve estimators
    /// (`allocation = "mrc"`). Set before the store
    /// is shared; each estimator is allocated later, by the allocator, when its tenant shows up.
    pub fn enable_sampling(&mut self, max_tenants: u16) {
        self.samplers = (0..max_tenants).map(|_| Sampler::default()).collect();
    }

    /// The sampler of `tenant`, when sampling is on.
    pub fn sampler(&self, tenant: TenantId) -> Option<&Sampler> {
        self.samplers.get(tenant as usize)
    }

    pub fn slot_bytes(&self) -> u32 {
        self.slot_bytes
    }

    pub fn capacity_slots(&self) -> u64 {
        self.slots_per_shard as u64 * self.shards.len() as u64
    }

    /// Set the most bytes `tenant` may hold. Enforced per shard as an even share, rounded up
    /// to a whole slot, so a tenant may exceed its limit by less than one slot per shard.
    /// Lowering a limit takes effect as the tenant next stores blocks. With targets enforced
    /// this is the tenant's target, enforced over the whole store (see the module docs).
    pub fn set_tenant_limit(&self, tenant: TenantId, limit_bytes: u64) {
        let slots = limit_bytes / self.slot_bytes as u64;
        self.target[tenant as usize].store(slots, Ordering::Relaxed);
        let per_shard = slots.div_ceil(self.shards.len() as u64).min(self.slots_per_shard as u64);
        self.quota[tenant as usize].store(per_shard as u32, Ordering::Relaxed);
    }

    /// Set the most bytes `tenant` may ever hold, whatever its target (its configured
    /// `limit`): the warm-up (module docs) lets a tenant at its target take never-used slots,
    /// but never past this.
    pub fn set_tenant_ceiling(&self, tenant: TenantId, limit_bytes: u64) {
        self.ceiling[tenant as usize].store(limit_bytes / self.slot_bytes as u64, Ordering::Relaxed);
    }

    /// A tenant's configured `limit`: its ceiling, and its target until the allocator sets one.
    pub fn set_tenant_configured_limit(&self, tenant: TenantId, limit_bytes: u64) {
        self.set_tenant_limit(tenant, limit_bytes);
        self.set_tenant_ceiling(tenant, limit_bytes);
    }

    /// Set the slots a swap never takes `tenant` below (its `min_bytes`, in slots).
    pub fn set_tenant_floor(&self, tenant: TenantId, slots: u64) {
        self.floor[tenant as usize].store(slots, Ordering::Relaxed);
    }

    /// Set `tenant`'s value and cost for swaps (module docs, "Placement"), in one unit for
    /// all tenants (the allocation timer's: hits per block over a moving window, 2^-32
    /// units): `value`, what a block of this tenant is worth where its keys are (its
    /// predicted hits per block at its target); `cost`, what one block less costs it (its
    /// marginal hits per block there). A swap takes a block from a tenant whose cost is
    /// below the taker's value; with both 0 (never set) nothing moves.
    pub fn set_tenant_value(&self, tenant: TenantId, value: u64, cost: u64) {
        self.value[tenant as usize].store(value, Ordering::Relaxed);
        self.cost[tenant as usize].store(cost, Ordering::Relaxed);
    }

    /// Set whether `tenant` may take blocks in swaps: whether its measured hit ratio falls
    /// short of what its curve predicts at its target (a placement loss). Without a
    /// prediction (every allocation but `mrc`) nothing tells a placement loss from a working
    /// set that does not fit — moving a loop's blocks to where it misses only spreads the
    /// misses — so nobody swaps.
    pub fn set_tenant_short(&self, tenant: TenantId, short: bool) {
        self.short[tenant as usize].store(short, Ordering::Relaxed);
    }

    /// Swaps across shards made so far (module docs, "Placement").
    pub fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::Relaxed)
    }

    /// The shard a key of `tenant` lives in (for tests that place keys).
    pub fn shard_of(&self, tenant: TenantId, key: &Key) -> usize {
        self.shard_index(self.hash(tenant, key))
    }

    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        // hashbrown uses the low bits for buckets and the top 7 for tags: take the middle.
        ((hash >> 32) & self.shard_mask) as usize
    }

    #[inline]
    fn hash(&self, tenant: TenantId, key: &Key) -> u64 {
        hash_key(&self.hasher, tenant, key)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[self.shard_index(hash)].0
    }

    /// Look up a block; on a hit, `f` receives the value (under the shard's lock: copy it
    /// and return) and the hit counts as a transfer to the client for eviction.
    pub fn get(&self, tenant: TenantId, key: &Key, f: impl FnOnce(&[u8])) -> bool {
        let hash = self.hash(tenant, key);
        let hit = self.get_locked(tenant, key, hash, f);
        if hit {
            self.observe(tenant, hash);
        }
        hit
    }

    /// An access of `tenant`'s key with this hash, for its curve (module docs).
    #[inline]
    fn observe(&self, tenant: TenantId, hash: u64) {
        if let Some(sampler) = self.samplers.get(tenant as usize) {
            sampler.observe(hash);
        }
    }

    fn get_locked(&self, tenant: TenantId, key: &Key, hash: u64, f: impl FnOnce(&[u8])) -> bool {
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
        let status = self.put_locked(tenant, key, hash, value);
        self.observe(tenant, hash);
        status
    }

    fn put_locked(&self, tenant: TenantId, key: &Key, hash: u64, value: &[u8]) -> PutStatus {
        let here = self.shard_index(hash);
        let mut guard = self.shards[here].0.lock();
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
            None => match self.take_slot(s, here, tenant, quota) {
                Some(slot) => {
                    if self.enforce_targets {
                        s.last_insert[tenant as usize] =
                            self.clock[tenant as usize].fetch_add(1, Ordering::Relaxed) + 1;
                    }
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
                    self.held[tenant as usize].fetch_add(1, Ordering::Relaxed);
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
    fn take_slot(&self, s: &mut Shard, here: usize, tenant: TenantId, quota: u32) -> Option<u32> {
        if self.enforce_targets {
            return self.take_slot_within_targets(s, here, tenant);
        }
        if quota == 0 {
            return None;
        }
        if s.tenants[tenant as usize].blocks >= quota as u64 {
            return self.evict_from(s, tenant);
        }
        if let Some(slot) = Self::free_slot(s, self.slots_per_shard) {
            return Some(slot);
        }
        // Full: evict from the tenant that holds the most relative to its quota.
        let victim = fullest(s, |t| {
            let quota = self.quota[t as usize].load(Ordering::Relaxed);
            Some(fraction(s.tenants[t as usize].blocks, u64::from(quota)))
        })
        .expect("a full shard has an active tenant");
        self.evict_from(s, victim)
    }

    /// A never-used or freed slot of the shard, if it has one.
    fn free_slot(s: &mut Shard, slots_per_shard: u32) -> Option<u32> {
        if let Some(slot) = s.free.pop() {
            return Some(slot);
        }
        if s.next_unused < slots_per_shard {
            s.next_unused += 1;
            return Some(s.next_unused - 1);
        }
        None
    }

    /// `take_slot` with targets enforced: targets are whole-store, so a tenant's guarantee
    /// does not depend on how its keys hash across shards. A tenant at its target makes room
    /// itself (when it holds blocks in this shard; otherwise it may take a free slot and is
    /// then above its target, by at most one block per shard; or, with `fill_unused`, while
    /// the shard has never-used slots: module docs, "Warm-up") — unless the shard is full and
    /// it can swap (module docs, "Placement"). A full shard evicts from the tenant furthest
    /// above its target that holds blocks here; with none above, from a tenant of lower value
    /// than the inserting one (placement), else from the inserting tenant itself, or refuses
    /// the PUT.
    fn take_slot_within_targets(&self, s: &mut Shard, here: usize, tenant: TenantId) -> Option<u32> {
        let target = self.target[tenant as usize].load(Ordering::Relaxed);
        if target == 0 {
            return None;
        }
        let mine = s.tenants[tenant as usize].blocks;
        let full = s.free.is_empty() && s.next_unused >= self.slots_per_shard;
        let held = self.held[tenant as usize].load(Ordering::Relaxed);
        if held >= target {
            if full {
                if let Some(donor) = self.donor(s, tenant) {
                    if self.give_back(here, tenant) {
                        self.swaps.fetch_add(1, Ordering::Relaxed);
                        return self.evict_from(s, donor);
                    }
                }
            }
            // Warm-up: a never-used slot is nobody's yet, and the targets of a lender still
            // filling are the allocator's guesses (no curve measured yet) — but never past
            // the tenant's configured limit.
            let unused = self.fill_unused
                && s.next_unused < self.slots_per_shard
                && held < self.ceiling[tenant as usize].load(Ordering::Relaxed);
            if mine > 0 && !unused {
                return self.evict_from(s, tenant);
            }
        }
        if let Some(slot) = Self::free_slot(s, self.slots_per_shard) {
            return Some(slot);
        }
        let victim = fullest(s, |t| {
            let target = self.target[t as usize].load(Ordering::Relaxed);
            let held = self.held[t as usize].load(Ordering::Relaxed);
            (held > target).then(|| fraction(held, target))
        });
        if let Some(t) = victim {
            return self.evict_from(s, t);
        }
        if self.held[tenant as usize].load(Ordering::Relaxed) < target {
            // Below its target in a full shard where nobody is above theirs: the capacity
            // it is owed is free (or held above target) in other shards, where the donor's
            // next inserts find it.
            if let Some(donor) = self.donor(s, tenant) {
                self.swaps.fetch_add(1, Ordering::Relaxed);
                return self.evict_from(s, donor);
            }
        }
        if mine > 0 {
            return self.evict_from(s, tenant);
        }
        None
    }

    /// When `tenant` may take (it is short), of the other tenants with blocks in shard `s`
    /// the one whose cost is lowest, below `tenant`'s value, and above its minimum: the one a
    /// block of this shard moves from.
    fn donor(&self, s: &Shard, tenant: TenantId) -> Option<TenantId> {
        if self.shards.len() < 2 || !self.short[tenant as usize].load(Ordering::Relaxed) {
            return None;
        }
        let value = self.value[tenant as usize].load(Ordering::Relaxed);
        s.active
            .iter()
            .filter(|&&t| t != tenant)
            .filter_map(|&t| {
                let cost = self.cost[t as usize].load(Ordering::Relaxed);
                let above_floor =
                    self.held[t as usize].load(Ordering::Relaxed) > self.floor[t as usize].load(Ordering::Relaxed);
                (cost < value && above_floor).then_some((t, cost))
            })
            .min_by_key(|&(_, c)| c)
            .map(|(t, _)| t)
    }

    /// Give back one of `tenant`'s blocks from a shard other than `here` where it has not
    /// inserted for [`SLACK_INSERTS_PER_SHARD`] × shards of its inserts (its blocks there
    /// meet its demand), trying at most [`GIVE_BACK_TRIES`] shards, each with `try_lock` (the
    /// caller holds `here`'s lock; nothing waits). The slot is freed: whoever inserts there
    /// next takes it. Returns whether a block was given back.
    fn give_back(&self, here: usize, tenant: TenantId) -> bool {
        let n = self.shards.len();
        let now = self.clock[tenant as usize].load(Ordering::Relaxed);
        let slack = SLACK_INSERTS_PER_SHARD * n as u64;
        for _ in 0..GIVE_BACK_TRIES {
            let y = self.cursor[tenant as usize].fetch_add(1, Ordering::Relaxed) as usize & (n - 1);
            if y == here {
                continue;
            }
            let Some(mut guard) = self.shards[y].0.try_lock() else {
                continue;
            };
            let sy = &mut *guard;
            if sy.tenants[tenant as usize].blocks == 0 || now.saturating_sub(sy.last_insert[tenant as usize]) < slack {
                continue;
            }
            if let Some(slot) = self.evict_from(sy, tenant) {
                sy.free.push(slot);
                return true;
            }
        }
        false
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
        self.held[tenant as usize].fetch_sub(1, Ordering::Relaxed);
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
        self.held[tenant as usize].fetch_sub(1, Ordering::Relaxed);
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
            total += (s.last_insert.len() * 8) as u64;
        }
        let per_tenant = (self.floor.len() * (5 * 8 + 4 + 1)) as u64;
        total + per_tenant + self.samplers.iter().map(|x| x.memory_bytes() as u64).sum::<u64>()
    }
}
