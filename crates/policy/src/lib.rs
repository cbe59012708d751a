//! Cache policies for farcache: pure code, no I/O, no clocks (time is passed in).
//!
//! This crate depends on no other farcache crate. Today it holds the lender's eviction
//! policies, the borrower's block placement (`placement`, rendezvous hashing) and read
//! routing (`route`: paper 000's threshold n and an adaptive rule), and the division of a
//! lender's RAM among tenants (`alloc`: paper 004's hit-ratio rule and miss-ratio curves);
//! later also admission.
//!
//! # Eviction model
//! A policy instance manages the slots of one store shard, addressed densely as
//! `0..slots`. Every resident slot belongs to exactly one *class* (a tenant). Classes are
//! evicted independently: the store asks for a victim *of a class* (the tenant that is over
//! its share), so per-tenant limits and later hit-ratio-driven re-division need no other
//! mechanism. Policies never allocate after construction: all bookkeeping is sized by
//! `slots` and `classes` up front.

pub mod alloc;
mod ghost;
mod list;
mod lru;
pub mod placement;
pub mod route;
mod s3fifo;

pub use lru::Lru;
pub use s3fifo::S3Fifo;

/// Index of a slot in one store shard (`0..slots`).
pub type SlotId = u32;
/// A class of entries that is evicted independently of the others (a tenant).
pub type ClassId = u16;

/// One eviction policy over the slots of one shard.
///
/// Contract: synchronous, never blocks, never allocates after `new`. The caller (the store)
/// guarantees that `insert` is only called for a slot that is not resident, and `touch` /
/// `remove` only for resident slots; policies may `debug_assert!` this. `evict` unlinks the
/// victim it returns: the caller must then free the slot and must not call `remove` on it.
pub trait Eviction: Send + 'static {
    /// A policy for `slots` slots and classes `0..classes`, with every slot free. All its
    /// memory is allocated here.
    fn new(slots: u32, classes: u16) -> Self
    where
        Self: Sized;
    /// A new entry became resident in `slot`, owned by `class`. `fingerprint` is a hash of
    /// the entry's key (and class); policies with ghost history recognise re-insertions by it.
    /// Panics if `class >= classes`.
    fn insert(&mut self, slot: SlotId, class: ClassId, fingerprint: u64);
    /// The entry in `slot` was transferred to a client (a hit).
    fn touch(&mut self, slot: SlotId);
    /// The entry in `slot` was deleted or replaced by the caller.
    fn remove(&mut self, slot: SlotId);
    /// Choose a victim among the resident slots of `class`, unlink it and return it;
    /// `None` when the class has no resident slot. Panics if `class >= classes`.
    fn evict(&mut self, class: ClassId) -> Option<SlotId>;
    /// Number of resident slots of `class`.
    fn len(&self, class: ClassId) -> u32;
    /// Bytes of heap memory this policy's bookkeeping holds (for the overhead budget).
    fn memory_bytes(&self) -> usize;
}

/// The policies a store can be configured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// LRU by the last transfer to a client (paper 000's rule).
    Lru,
    /// S3-FIFO (Yang et al., SOSP'23): scan-resistant, small + main FIFO queues and a ghost.
    S3Fifo,
}

impl PolicyKind {
    /// The name used in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::S3Fifo => "s3fifo",
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lru" => Ok(PolicyKind::Lru),
            "s3fifo" => Ok(PolicyKind::S3Fifo),
            other => Err(format!("unknown eviction policy {other:?}: expected \"lru\" or \"s3fifo\"")),
        }
    }
}

/// Static dispatch over the configured policy (no `dyn` on the data path). Its methods are
/// those of [`Eviction`], with the same contract.
pub enum AnyPolicy {
    Lru(Lru),
    S3Fifo(S3Fifo),
}

impl AnyPolicy {
    /// A policy of `kind` for `slots` slots and classes `0..classes`.
    pub fn new(kind: PolicyKind, slots: u32, classes: u16) -> Self {
        match kind {
            PolicyKind::Lru => AnyPolicy::Lru(Lru::new(slots, classes)),
            PolicyKind::S3Fifo => AnyPolicy::S3Fifo(S3Fifo::new(slots, classes)),
        }
    }
}

macro_rules! dispatch {
    ($self:ident, $p:ident => $e:expr) => {
        match $self {
            AnyPolicy::Lru($p) => $e,
            AnyPolicy::S3Fifo($p) => $e,
        }
    };
}

impl AnyPolicy {
    #[inline]
    pub fn insert(&mut self, slot: SlotId, class: ClassId, fingerprint: u64) {
        dispatch!(self, p => p.insert(slot, class, fingerprint))
    }
    #[inline]
    pub fn touch(&mut self, slot: SlotId) {
        dispatch!(self, p => p.touch(slot))
    }
    #[inline]
    pub fn remove(&mut self, slot: SlotId) {
        dispatch!(self, p => p.remove(slot))
    }
    #[inline]
    pub fn evict(&mut self, class: ClassId) -> Option<SlotId> {
        dispatch!(self, p => p.evict(class))
    }
    #[inline]
    pub fn len(&self, class: ClassId) -> u32 {
        dispatch!(self, p => p.len(class))
    }
    pub fn memory_bytes(&self) -> usize {
        dispatch!(self, p => p.memory_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn kind_names_round_trip() {
        for kind in [PolicyKind::Lru, PolicyKind::S3Fifo] {
            assert_eq!(kind.name().parse::<PolicyKind>(), Ok(kind));
        }
        let err = "clock".parse::<PolicyKind>().unwrap_err();
        assert!(err.contains("clock") && err.contains("s3fifo"), "{err}");
    }

    /// The overhead budget: the server's whole per-block overhead must stay under 2% of a
    /// 4 KiB block (82 bytes), of which LRU may take 10 bytes and S3-FIFO 24.
    #[test]
    fn memory_per_slot_is_within_budget() {
        const SLOTS: u32 = 1_000_000;
        const CLASSES: u16 = 64;
        for (kind, budget) in [(PolicyKind::Lru, 10.01), (PolicyKind::S3Fifo, 24.0)] {
            let p = AnyPolicy::new(kind, SLOTS, CLASSES);
            let per_slot = p.memory_bytes() as f64 / f64::from(SLOTS);
            println!("{}: {per_slot:.4} bytes per slot ({SLOTS} slots, {CLASSES} classes)", kind.name());
            assert!(per_slot <= budget, "{}: {per_slot} bytes per slot", kind.name());
            // The report is of real allocations: at least the per-slot links.
            assert!(per_slot >= 8.0, "{}: {per_slot} bytes per slot", kind.name());
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert {
            slot: SlotId,
            class: ClassId,
            fingerprint: u64,
        },
        /// Touches the `n % len`-th resident slot.
        Touch(usize),
        /// Removes the `n % len`-th resident slot.
        Remove(usize),
        Evict(ClassId),
    }

    const SLOTS: u32 = 24;
    const CLASSES: u16 = 3;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // Few fingerprints, so ghost hits (and fingerprints shared by slots) are common.
            4 => (0..SLOTS, 0..CLASSES, 0..12u64)
                .prop_map(|(slot, class, fingerprint)| Op::Insert { slot, class, fingerprint }),
            3 => any::<usize>().prop_map(Op::Touch),
            1 => any::<usize>().prop_map(Op::Remove),
            2 => (0..CLASSES).prop_map(Op::Evict),
        ]
    }

    /// Against a model that knows only which slots are resident in which class: whatever the
    /// victim, it is a resident slot of the class asked for, and `None` means the class is
    /// empty.
    fn check_against_set_model(kind: PolicyKind, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let mut p = AnyPolicy::new(kind, SLOTS, CLASSES);
        let mut model: Vec<BTreeSet<SlotId>> = vec![BTreeSet::new(); usize::from(CLASSES)];
        let resident = |model: &[BTreeSet<SlotId>]| -> Vec<SlotId> {
            let mut all: Vec<SlotId> = model.iter().flatten().copied().collect();
            all.sort_unstable();
            all
        };
        for op in ops {
            match op {
                Op::Insert { slot, class, fingerprint } => {
                    if model.iter().any(|set| set.contains(&slot)) {
                        continue; // the store never inserts a resident slot
                    }
                    p.insert(slot, class, fingerprint);
                    model[usize::from(class)].insert(slot);
                }
                Op::Touch(n) => {
                    let all = resident(&model);
                    if !all.is_empty() {
                        p.touch(all[n % all.len()]);
                    }
                }
                Op::Remove(n) => {
                    let all = resident(&model);
                    if !all.is_empty() {
                        let slot = all[n % all.len()];
                        p.remove(slot);
                        for set in &mut model {
                            set.remove(&slot);
                        }
                    }
                }
                Op::Evict(class) => match p.evict(class) {
                    // Removing it from the model also means it can never be returned twice.
                    Some(slot) => prop_assert!(
                        model[usize::from(class)].remove(&slot),
                        "{} evicted slot {} that is not resident in class {}",
                        kind.name(),
                        slot,
                        class
                    ),
                    None => prop_assert!(
                        model[usize::from(class)].is_empty(),
                        "{} found no victim in non-empty class {}",
                        kind.name(),
                        class
                    ),
                },
            }
            for class in 0..CLASSES {
                prop_assert_eq!(p.len(class) as usize, model[usize::from(class)].len());
            }
        }
        // Draining every class returns exactly its resident slots.
        for class in 0..CLASSES {
            let mut drained = BTreeSet::new();
            while let Some(slot) = p.evict(class) {
                prop_assert!(drained.insert(slot), "slot {} returned twice", slot);
            }
            prop_assert_eq!(&drained, &model[usize::from(class)]);
            prop_assert_eq!(p.len(class), 0);
        }
        match &p {
            AnyPolicy::Lru(lru) => lru.check(),
            AnyPolicy::S3Fifo(s3) => s3.check(),
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn lru_keeps_the_resident_set(ops in prop::collection::vec(op(), 1..500)) {
            check_against_set_model(PolicyKind::Lru, ops)?;
        }

        #[test]
        fn s3fifo_keeps_the_resident_set(ops in prop::collection::vec(op(), 1..500)) {
            check_against_set_model(PolicyKind::S3Fifo, ops)?;
        }
    }
}
