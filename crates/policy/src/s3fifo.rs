//! S3-FIFO (Yang et al., SOSP 2023, "FIFO queues are all you need for cache eviction").
//!
//! Per class, two FIFO queues: a *small* one that every new entry enters, and a *main* one
//! for entries that proved themselves. A hit only bumps a 2-bit frequency counter (capped at
//! 3); nothing moves on a hit, which is what makes hits cheap and scans harmless:
//!
//! - While the small queue holds more than 10% of the class's resident slots (or main is
//!   empty), eviction looks at small's tail: an entry hit since it entered moves to main's
//!   head with its frequency reset; one that was never hit (a one-hit wonder) is evicted and
//!   its fingerprint is remembered in the ghost.
//! - Otherwise it looks at main's tail: an entry with frequency > 0 has it lowered by one and
//!   goes back to main's head; one with frequency 0 is evicted.
//! - A new entry whose fingerprint is in the ghost (it was evicted from small recently and
//!   came back) skips small and enters main.
//!
//! One ghost serves all classes of an instance (fingerprints already include the class); it
//! remembers as many fingerprints as there are slots. The queues of all classes are intrusive
//! lists over one shared link array; nothing allocates after `new`.
//!
//! Memory per slot: 8 bytes of links, 2 of class id, 4 of state (the folded 28-bit
//! fingerprint that the ghost needs at eviction, the queue and the frequency), and about 9 of
//! ghost (see `ghost.rs`): about 23 bytes, plus 24 bytes per class.

use crate::ghost::{fold, Ghost, FOLD_BITS};
use crate::list::{Link, List};
use crate::{ClassId, Eviction, SlotId};

/// Highest value of the frequency counter.
const MAX_FREQ: u32 = 3;
/// Small may hold up to `1 / SMALL_SHARE_INVERSE` of a class's resident slots before
/// eviction takes from it (the paper's 10%).
const SMALL_SHARE_INVERSE: u64 = 10;

// Layout of a slot's state word: fingerprint in the high `FOLD_BITS`, then the queue, then
// the frequency.
const FREQ_MASK: u32 = 0b11;
const QUEUE_SHIFT: u32 = 2;
const QUEUE_MASK: u32 = 0b11 << QUEUE_SHIFT;
const FP_SHIFT: u32 = 4;
const _: () = assert!(FP_SHIFT + FOLD_BITS == u32::BITS, "state word layout");
const _: () = assert!(MAX_FREQ <= FREQ_MASK, "frequency counter width");

/// Which queue a slot is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    /// Not resident.
    None = 0,
    Small = 1,
    Main = 2,
}

#[inline]
fn state(fingerprint: u32, queue: Queue, freq: u32) -> u32 {
    (fingerprint << FP_SHIFT) | ((queue as u32) << QUEUE_SHIFT) | freq
}

#[inline]
fn queue_of(state: u32) -> Queue {
    match (state & QUEUE_MASK) >> QUEUE_SHIFT {
        0 => Queue::None,
        1 => Queue::Small,
        _ => Queue::Main,
    }
}

#[inline]
fn freq_of(state: u32) -> u32 {
    state & FREQ_MASK
}

#[inline]
fn fingerprint_of(state: u32) -> u32 {
    state >> FP_SHIFT
}

/// The two queues of one class.
#[derive(Clone, Copy)]
struct Queues {
    small: List,
    main: List,
}

/// S3-FIFO eviction, independently per class, with one shared ghost. See the module docs.
pub struct S3Fifo {
    /// Position of every slot on its queue.
    links: Box<[Link]>,
    /// The class of every resident slot (meaningless for the others).
    class_of: Box<[ClassId]>,
    /// Per slot: folded fingerprint, queue (`Queue::None` when not resident), frequency.
    state: Box<[u32]>,
    /// One pair of queues per class.
    queues: Box<[Queues]>,
    /// Fingerprints of recent one-hit wonders, for all classes.
    ghost: Ghost,
}

impl S3Fifo {
    /// Unlinks `slot` from the queue it is on and marks it not resident.
    fn unlink(&mut self, slot: SlotId) {
        let queues = &mut self.queues[usize::from(self.class_of[slot as usize])];
        match queue_of(self.state[slot as usize]) {
            Queue::Small => queues.small.unlink(&mut self.links, slot),
            Queue::Main => queues.main.unlink(&mut self.links, slot),
            Queue::None => unreachable!("slot {slot} is not resident"),
        }
        self.state[slot as usize] = 0;
    }
}

impl Eviction for S3Fifo {
    fn new(slots: u32, classes: u16) -> Self {
        let empty = Queues { small: List::EMPTY, main: List::EMPTY };
        S3Fifo {
            links: vec![Link::UNLINKED; slots as usize].into_boxed_slice(),
            class_of: vec![0; slots as usize].into_boxed_slice(),
            state: vec![0; slots as usize].into_boxed_slice(),
            queues: vec![empty; usize::from(classes)].into_boxed_slice(),
            ghost: Ghost::new(slots),
        }
    }

    fn insert(&mut self, slot: SlotId, class: ClassId, fingerprint: u64) {
        assert!(usize::from(class) < self.queues.len(), "class {class} out of range 0..{}", self.queues.len());
        if queue_of(self.state[slot as usize]) != Queue::None {
            debug_assert!(false, "insert of resident slot {slot}");
            // In release builds, keep the queues consistent: the old entry is gone.
            self.unlink(slot);
        }
        let f = fold(fingerprint);
        let queues = &mut self.queues[usize::from(class)];
        let queue = if self.ghost.take(f) {
            queues.main.push_head(&mut self.links, slot);
            Queue::Main
        } else {
            queues.small.push_head(&mut self.links, slot);
            Queue::Small
        };
        self.class_of[slot as usize] = class;
        self.state[slot as usize] = state(f, queue, 0);
    }

    fn touch(&mut self, slot: SlotId) {
        let s = self.state[slot as usize];
        if queue_of(s) == Queue::None {
            debug_assert!(false, "touch of slot {slot}, which is not resident");
            return;
        }
        if freq_of(s) < MAX_FREQ {
            self.state[slot as usize] = s + 1;
        }
    }

    fn remove(&mut self, slot: SlotId) {
        if queue_of(self.state[slot as usize]) == Queue::None {
            debug_assert!(false, "remove of slot {slot}, which is not resident");
            return;
        }
        self.unlink(slot);
    }

    fn evict(&mut self, class: ClassId) -> Option<SlotId> {
        let queues = &mut self.queues[usize::from(class)];
        let resident = queues.small.len() + queues.main.len();
        if resident == 0 {
            return None;
        }
        // Every step but the last either moves an entry from small to main (at most
        // `resident` times: nothing goes back to small) or lowers the frequency of an entry
        // on main (at most `MAX_FREQ` times each: nothing raises it meanwhile).
        let max_steps = u64::from(resident) * u64::from(MAX_FREQ + 1) + 1;
        for _ in 0..max_steps {
            let (small, main) = (queues.small.len(), queues.main.len());
            let from_small =
                small > 0 && (main == 0 || u64::from(small) * SMALL_SHARE_INVERSE > u64::from(small + main));
            if from_small {
                let slot = queues.small.tail().expect("small is not empty");
                queues.small.unlink(&mut self.links, slot);
                let s = self.state[slot as usize];
                if freq_of(s) > 0 {
                    self.state[slot as usize] = state(fingerprint_of(s), Queue::Main, 0);
                    queues.main.push_head(&mut self.links, slot);
                } else {
                    self.state[slot as usize] = 0;
                    self.ghost.record(fingerprint_of(s));
                    return Some(slot);
                }
            } else {
                let slot = queues.main.tail().expect("main is not empty");
                queues.main.unlink(&mut self.links, slot);
                let s = self.state[slot as usize];
                if freq_of(s) > 0 {
                    self.state[slot as usize] = s - 1;
                    queues.main.push_head(&mut self.links, slot);
                } else {
                    self.state[slot as usize] = 0;
                    return Some(slot);
                }
            }
        }
        unreachable!("S3-FIFO eviction of class {class} did not finish in {max_steps} steps")
    }

    fn len(&self, class: ClassId) -> u32 {
        let queues = &self.queues[usize::from(class)];
        queues.small.len() + queues.main.len()
    }

    fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.links)
            + std::mem::size_of_val(&*self.class_of)
            + std::mem::size_of_val(&*self.state)
            + std::mem::size_of_val(&*self.queues)
            + self.ghost.memory_bytes()
    }
}

#[cfg(test)]
impl S3Fifo {
    /// (small, main) of `class`, each from tail (next to look at) to head, after checking the
    /// links and the slots' states.
    fn queues(&self, class: ClassId) -> (Vec<SlotId>, Vec<SlotId>) {
        let q = &self.queues[usize::from(class)];
        let mut small = q.small.slots(&self.links);
        let mut main = q.main.slots(&self.links);
        small.reverse();
        main.reverse();
        for (list, queue) in [(&small, Queue::Small), (&main, Queue::Main)] {
            for &slot in list {
                assert_eq!(queue_of(self.state[slot as usize]), queue, "slot {slot}");
                assert_eq!(self.class_of[slot as usize], class, "slot {slot}");
            }
        }
        (small, main)
    }

    fn freq(&self, slot: SlotId) -> u32 {
        freq_of(self.state[slot as usize])
    }

    /// Checks every queue, the ghost, and that exactly the queued slots are resident.
    pub(crate) fn check(&self) {
        let mut queued = 0;
        for class in 0..self.queues.len() {
            let (small, main) = self.queues(class as ClassId);
            queued += small.len() + main.len();
        }
        let resident = self.state.iter().filter(|&&s| queue_of(s) != Queue::None).count();
        assert_eq!(queued, resident, "resident slots missing from their queues");
        self.ghost.check();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Lru;
    use proptest::prelude::*;
    use std::collections::{HashMap, VecDeque};

    #[test]
    fn one_hit_wonders_are_evicted_before_touched_entries() {
        let mut p = S3Fifo::new(8, 1);
        for slot in 0..4 {
            p.insert(slot, 0, 100 + u64::from(slot));
        }
        p.touch(1);
        p.touch(3);
        // 0 and 2 were never hit: they go first, although 1 is older than 2.
        assert_eq!(p.evict(0), Some(0));
        assert_eq!(p.evict(0), Some(2));
        assert_eq!(p.queues(0), (vec![3], vec![1]));
        assert_eq!(p.evict(0), Some(1));
        assert_eq!(p.evict(0), Some(3));
        assert_eq!(p.evict(0), None);
        p.check();
    }

    #[test]
    fn ghost_hits_go_to_main_once() {
        let mut p = S3Fifo::new(4, 1);
        p.insert(0, 0, 42);
        assert_eq!(p.evict(0), Some(0)); // a one-hit wonder: remembered in the ghost
        p.insert(1, 0, 42); // it came back
        p.insert(2, 0, 43); // a newcomer
        assert_eq!(p.queues(0), (vec![2], vec![1]));
        // The ghost entry was consumed: after another eviction from main, 42 starts in small.
        p.remove(2);
        assert_eq!(p.evict(0), Some(1));
        p.insert(3, 0, 42);
        assert_eq!(p.queues(0), (vec![3], vec![]));
        p.check();
    }

    #[test]
    fn main_gives_a_second_chance_per_hit_up_to_three() {
        let mut p = S3Fifo::new(4, 1);
        for (slot, fp) in [(0, 10), (1, 11)] {
            p.insert(slot, 0, fp);
            p.evict(0);
            p.insert(slot, 0, fp); // via the ghost straight into main
        }
        assert_eq!(p.queues(0), (vec![], vec![0, 1]));
        for _ in 0..10 {
            p.touch(0);
        }
        p.touch(1);
        assert_eq!((p.freq(0), p.freq(1)), (MAX_FREQ, 1));
        // 0 is at main's tail but has hits left: it is reinserted (freq 2), then 1 (freq 0),
        // then 0 again (freq 1) ... until 1 runs out first.
        assert_eq!(p.evict(0), Some(1));
        assert_eq!(p.freq(0), 1);
        assert_eq!(p.evict(0), Some(0));
        p.check();
    }

    #[test]
    fn small_is_kept_to_a_tenth_of_the_class() {
        let mut p = S3Fifo::new(32, 1);
        // 20 hit entries end up in main as small overflows.
        for slot in 0..20 {
            p.insert(slot, 0, u64::from(slot));
            p.touch(slot);
        }
        for slot in 20..25 {
            p.insert(slot, 0, u64::from(slot));
        }
        // Small holds 25 of 25: it is drained of hit entries until a one-hit wonder goes.
        assert_eq!(p.evict(0), Some(20));
        let (small, main) = p.queues(0);
        assert_eq!(small, vec![21, 22, 23, 24]);
        assert_eq!(main.len(), 20);
        // 4 of 24 is more than 10%: small again. Then at 2 of 22 (< 10%) main's turn comes.
        assert_eq!(p.evict(0), Some(21));
        assert_eq!(p.evict(0), Some(22));
        assert_eq!(p.evict(0), Some(0)); // main's tail, freq reset to 0 on the move
        p.check();
    }

    #[test]
    fn classes_are_independent() {
        let mut p = S3Fifo::new(6, 3);
        p.insert(0, 0, 1);
        p.insert(1, 1, 2);
        p.insert(2, 0, 3);
        p.insert(3, 1, 4);
        p.insert(4, 2, 5);
        p.touch(1); // only changes class 1
        assert_eq!((p.len(0), p.len(1), p.len(2)), (2, 2, 1));
        assert_eq!(p.evict(1), Some(3));
        assert_eq!(p.evict(0), Some(0));
        assert_eq!(p.evict(1), Some(1));
        assert_eq!(p.evict(1), None);
        assert_eq!((p.len(0), p.len(1), p.len(2)), (1, 0, 1));
        p.check();
    }

    #[test]
    fn evict_on_empty_class_is_none() {
        let mut p = S3Fifo::new(4, 2);
        assert_eq!(p.evict(0), None);
        p.insert(0, 1, 0);
        assert_eq!(p.evict(0), None);
        assert_eq!(p.evict(1), Some(0));
        assert_eq!(p.evict(1), None);
        let mut p = S3Fifo::new(0, 1);
        assert_eq!(p.evict(0), None);
    }

    #[test]
    fn remove_from_either_queue_at_any_position() {
        let mut p = S3Fifo::new(8, 1);
        for slot in 0..3 {
            p.insert(slot, 0, 50 + u64::from(slot));
            p.evict(0);
            p.insert(slot, 0, 50 + u64::from(slot)); // into main
        }
        for slot in 3..8 {
            p.insert(slot, 0, u64::from(slot)); // into small
        }
        assert_eq!(p.queues(0), (vec![3, 4, 5, 6, 7], vec![0, 1, 2]));
        p.remove(5); // small, middle
        p.remove(3); // small, tail
        p.remove(7); // small, head
        p.remove(1); // main, middle
        p.remove(2); // main, head
        assert_eq!(p.queues(0), (vec![4, 6], vec![0]));
        p.remove(0); // main, only entry
        assert_eq!(p.len(0), 2);
        p.check();
    }

    /// A store in miniature: keys to slots, evicting when full. Returns whether it was a hit.
    struct Store<P: Eviction> {
        policy: P,
        slot_of: HashMap<u64, SlotId>,
        key_of: Vec<u64>,
        free: Vec<SlotId>,
    }

    impl<P: Eviction> Store<P> {
        fn new(slots: u32) -> Self {
            Store {
                policy: P::new(slots, 1),
                slot_of: HashMap::new(),
                key_of: vec![0; slots as usize],
                free: (0..slots).rev().collect(),
            }
        }

        fn access(&mut self, key: u64) -> bool {
            if let Some(&slot) = self.slot_of.get(&key) {
                self.policy.touch(slot);
                return true;
            }
            let slot = self.free.pop().unwrap_or_else(|| {
                let victim = self.policy.evict(0).expect("a full store has a victim");
                assert_eq!(self.slot_of.remove(&self.key_of[victim as usize]), Some(victim));
                victim
            });
            self.key_of[slot as usize] = key;
            self.slot_of.insert(key, slot);
            self.policy.insert(slot, 0, key.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            false
        }
    }

    /// A working set used every few accesses, during a scan of 50 times the cache: counts
    /// the working set's misses after warm-up.
    fn working_set_misses_during_scan<P: Eviction>() -> usize {
        const WORKING_SET: u64 = 20;
        let mut store = Store::<P>::new(100);
        for _ in 0..3 {
            for key in 0..WORKING_SET {
                store.access(key);
            }
        }
        let mut misses = 0;
        for (i, scanned) in (1_000_000..1_005_000).enumerate() {
            store.access(scanned);
            if i % 10 == 0 {
                misses += usize::from(!store.access(i as u64 / 10 % WORKING_SET));
            }
        }
        misses
    }

    #[test]
    fn a_scan_does_not_flush_a_frequently_used_working_set() {
        assert_eq!(working_set_misses_during_scan::<S3Fifo>(), 0);
        // The scenario is hard: LRU, whose reuse distance here (220) exceeds the cache (100),
        // loses the working set to the scan.
        assert!(working_set_misses_during_scan::<Lru>() > 400);
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Get key `k`, as a store does: touch on a hit; on a miss insert, evicting from the
        /// key's class first when no slot is free.
        Access(u64),
        /// Remove the `n % len`-th resident slot.
        Remove(usize),
        Evict(ClassId),
    }

    const SLOTS: u32 = 16;
    const CLASSES: u16 = 2;
    const KEYS: u64 = 48;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            12 => (1..=KEYS).prop_map(Op::Access),
            1 => any::<usize>().prop_map(Op::Remove),
            2 => (0..CLASSES).prop_map(Op::Evict),
        ]
    }

    /// S3-FIFO written plainly with deques, front = head.
    struct Model {
        small: Vec<VecDeque<SlotId>>,
        main: Vec<VecDeque<SlotId>>,
        freq: Vec<u32>,
        fp: Vec<u32>,
        ghost: Vec<u32>,
        ghost_next: usize,
    }

    impl Model {
        fn insert(&mut self, slot: SlotId, class: ClassId, f: u32) {
            self.fp[slot as usize] = f;
            self.freq[slot as usize] = 0;
            match self.ghost.iter().position(|&g| g == f) {
                Some(i) => {
                    self.ghost[i] = 0;
                    self.main[usize::from(class)].push_front(slot);
                }
                None => self.small[usize::from(class)].push_front(slot),
            }
        }

        fn remove(&mut self, slot: SlotId) {
            for q in self.small.iter_mut().chain(self.main.iter_mut()) {
                q.retain(|&s| s != slot);
            }
        }

        fn evict(&mut self, class: ClassId) -> Option<SlotId> {
            let (small, main) = (&mut self.small[usize::from(class)], &mut self.main[usize::from(class)]);
            loop {
                let resident = small.len() + main.len();
                if resident == 0 {
                    return None;
                }
                if !small.is_empty() && (main.is_empty() || small.len() * 10 > resident) {
                    let slot = small.pop_back().unwrap();
                    if self.freq[slot as usize] > 0 {
                        self.freq[slot as usize] = 0;
                        main.push_front(slot);
                    } else {
                        self.ghost[self.ghost_next] = self.fp[slot as usize];
                        self.ghost_next = (self.ghost_next + 1) % self.ghost.len();
                        return Some(slot);
                    }
                } else {
                    let slot = main.pop_back().unwrap();
                    if self.freq[slot as usize] > 0 {
                        self.freq[slot as usize] -= 1;
                        main.push_front(slot);
                    } else {
                        return Some(slot);
                    }
                }
            }
        }
    }

    /// The policy and the model side by side, driven like a store.
    struct Harness {
        p: S3Fifo,
        m: Model,
        slot_of: HashMap<u64, SlotId>,
        key_of: Vec<Option<u64>>,
        free: Vec<SlotId>,
    }

    fn class_of_key(key: u64) -> ClassId {
        (key % u64::from(CLASSES)) as ClassId
    }

    impl Harness {
        fn new() -> Self {
            Harness {
                p: S3Fifo::new(SLOTS, CLASSES),
                m: Model {
                    small: vec![VecDeque::new(); usize::from(CLASSES)],
                    main: vec![VecDeque::new(); usize::from(CLASSES)],
                    freq: vec![0; SLOTS as usize],
                    fp: vec![0; SLOTS as usize],
                    ghost: vec![0; SLOTS as usize],
                    ghost_next: 0,
                },
                slot_of: HashMap::new(),
                key_of: vec![None; SLOTS as usize],
                free: (0..SLOTS).collect(),
            }
        }

        fn evict(&mut self, class: ClassId) -> Result<Option<SlotId>, TestCaseError> {
            let got = self.p.evict(class);
            prop_assert_eq!(got, self.m.evict(class));
            if let Some(slot) = got {
                let key = self.key_of[slot as usize].take();
                prop_assert!(key.is_some(), "victim {} was not resident", slot);
                let key = key.unwrap();
                prop_assert_eq!(class_of_key(key), class);
                self.slot_of.remove(&key);
            }
            Ok(got)
        }

        fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
            match op {
                Op::Access(key) => {
                    if let Some(&slot) = self.slot_of.get(&key) {
                        self.p.touch(slot);
                        self.m.freq[slot as usize] = (self.m.freq[slot as usize] + 1).min(3);
                        return Ok(());
                    }
                    let class = class_of_key(key);
                    let slot = match self.free.pop() {
                        Some(slot) => slot,
                        None => match self.evict(class)? {
                            Some(slot) => slot,
                            None => return Ok(()), // full, and all of it another class's
                        },
                    };
                    prop_assert_eq!(fold(key), key as u32);
                    self.p.insert(slot, class, key);
                    self.m.insert(slot, class, key as u32);
                    self.slot_of.insert(key, slot);
                    self.key_of[slot as usize] = Some(key);
                }
                Op::Remove(n) => {
                    let mut resident: Vec<SlotId> = self.slot_of.values().copied().collect();
                    if resident.is_empty() {
                        return Ok(());
                    }
                    resident.sort_unstable();
                    let slot = resident[n % resident.len()];
                    self.p.remove(slot);
                    self.m.remove(slot);
                    let key = self.key_of[slot as usize].take().unwrap();
                    self.slot_of.remove(&key);
                    self.free.push(slot);
                }
                Op::Evict(class) => {
                    if let Some(slot) = self.evict(class)? {
                        self.free.push(slot);
                    }
                }
            }
            Ok(())
        }

        /// Queues, their order and frequencies agree with the model.
        fn compare(&self) -> Result<(), TestCaseError> {
            for class in 0..CLASSES {
                let (small, main) = self.p.queues(class);
                let c = usize::from(class);
                let want_small: Vec<_> = self.m.small[c].iter().rev().copied().collect();
                let want_main: Vec<_> = self.m.main[c].iter().rev().copied().collect();
                prop_assert_eq!(small, want_small);
                prop_assert_eq!(main, want_main);
            }
            for slot in 0..SLOTS {
                if self.key_of[slot as usize].is_some() {
                    prop_assert_eq!(self.p.freq(slot), self.m.freq[slot as usize]);
                }
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Exact victims against the plain model. Keys are resident in at most one slot at a
        /// time, as in the store, and are their own (distinct) folded fingerprints.
        #[test]
        fn matches_a_deque_model(ops in prop::collection::vec(op(), 1..500)) {
            let mut h = Harness::new();
            for op in ops {
                h.apply(op)?;
                h.compare()?;
            }
            h.p.check();
        }
    }
}
