//! LRU by the last transfer to a client.
//!
//! One intrusive list per class over a shared per-slot link array: the head is the most
//! recently used entry, the tail the least. Every operation is O(1) and nothing allocates
//! after `new`.
//!
//! Memory: 10 bytes per slot (8 of links, 2 of class id) plus 12 bytes per class.

use crate::list::{Link, List};
use crate::{ClassId, Eviction, SlotId};

/// Marks a slot that is not resident. Class ids are `< classes <= u16::MAX`, so no class can
/// have this id.
const NO_CLASS: ClassId = ClassId::MAX;

/// LRU eviction, independently per class. See the module docs.
pub struct Lru {
    /// Position of every slot on its class's list.
    links: Box<[Link]>,
    /// The class of every resident slot, `NO_CLASS` for the others.
    class_of: Box<[ClassId]>,
    /// One list per class, most recently used first.
    lists: Box<[List]>,
}

impl Eviction for Lru {
    fn new(slots: u32, classes: u16) -> Self {
        Lru {
            links: vec![Link::UNLINKED; slots as usize].into_boxed_slice(),
            class_of: vec![NO_CLASS; slots as usize].into_boxed_slice(),
            lists: vec![List::EMPTY; usize::from(classes)].into_boxed_slice(),
        }
    }

    fn insert(&mut self, slot: SlotId, class: ClassId, _fingerprint: u64) {
        assert!(usize::from(class) < self.lists.len(), "class {class} out of range 0..{}", self.lists.len());
        if self.class_of[slot as usize] != NO_CLASS {
            debug_assert!(false, "insert of resident slot {slot}");
            // In release builds, keep the lists consistent: the old entry is gone.
            self.remove(slot);
        }
        self.class_of[slot as usize] = class;
        self.lists[usize::from(class)].push_head(&mut self.links, slot);
    }

    fn touch(&mut self, slot: SlotId) {
        let class = self.class_of[slot as usize];
        if class == NO_CLASS {
            debug_assert!(false, "touch of slot {slot}, which is not resident");
            return;
        }
        let list = &mut self.lists[usize::from(class)];
        list.unlink(&mut self.links, slot);
        list.push_head(&mut self.links, slot);
    }

    fn remove(&mut self, slot: SlotId) {
        let class = self.class_of[slot as usize];
        if class == NO_CLASS {
            debug_assert!(false, "remove of slot {slot}, which is not resident");
            return;
        }
        self.lists[usize::from(class)].unlink(&mut self.links, slot);
        self.class_of[slot as usize] = NO_CLASS;
    }

    fn evict(&mut self, class: ClassId) -> Option<SlotId> {
        let list = &mut self.lists[usize::from(class)];
        let victim = list.tail()?;
        list.unlink(&mut self.links, victim);
        self.class_of[victim as usize] = NO_CLASS;
        Some(victim)
    }

    fn len(&self, class: ClassId) -> u32 {
        self.lists[usize::from(class)].len()
    }

    fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.links)
            + std::mem::size_of_val(&*self.class_of)
            + std::mem::size_of_val(&*self.lists)
    }
}

#[cfg(test)]
impl Lru {
    /// The resident slots of `class`, least recently used first, after checking the links.
    pub(crate) fn order(&self, class: ClassId) -> Vec<SlotId> {
        let mut v = self.lists[usize::from(class)].slots(&self.links);
        v.reverse();
        for &slot in &v {
            assert_eq!(self.class_of[slot as usize], class, "slot {slot} on the wrong list");
        }
        v
    }

    /// Checks every list and that exactly the listed slots are marked resident.
    pub(crate) fn check(&self) {
        let mut listed = 0;
        for class in 0..self.lists.len() {
            listed += self.order(class as ClassId).len();
        }
        let resident = self.class_of.iter().filter(|&&c| c != NO_CLASS).count();
        assert_eq!(listed, resident, "resident slots missing from their lists");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn evicts_in_insertion_order_without_touches() {
        let mut lru = Lru::new(8, 1);
        for slot in [4, 2, 6, 0] {
            lru.insert(slot, 0, u64::from(slot));
        }
        assert_eq!(lru.order(0), vec![4, 2, 6, 0]);
        let victims: Vec<_> = std::iter::from_fn(|| lru.evict(0)).collect();
        assert_eq!(victims, vec![4, 2, 6, 0]);
        assert_eq!(lru.len(0), 0);
        lru.check();
    }

    #[test]
    fn touch_moves_to_most_recently_used() {
        let mut lru = Lru::new(4, 1);
        for slot in 0..4 {
            lru.insert(slot, 0, 0);
        }
        lru.touch(0); // the LRU entry becomes the MRU one
        lru.touch(2); // a middle entry
        lru.touch(2); // touching the MRU entry keeps it there
        assert_eq!(lru.order(0), vec![1, 3, 0, 2]);
        assert_eq!(lru.evict(0), Some(1));
        assert_eq!(lru.evict(0), Some(3));
        assert_eq!(lru.evict(0), Some(0));
    }

    #[test]
    fn classes_are_independent() {
        let mut lru = Lru::new(6, 3);
        lru.insert(0, 0, 0);
        lru.insert(1, 1, 0);
        lru.insert(2, 0, 0);
        lru.insert(3, 1, 0);
        lru.insert(4, 2, 0);
        lru.touch(1); // class 1's order changes; class 0's does not
        assert_eq!((lru.len(0), lru.len(1), lru.len(2)), (2, 2, 1));
        assert_eq!(lru.evict(1), Some(3));
        assert_eq!(lru.evict(0), Some(0));
        assert_eq!(lru.evict(1), Some(1));
        assert_eq!(lru.evict(1), None);
        assert_eq!(lru.len(0), 1);
        assert_eq!(lru.len(2), 1);
        lru.check();
    }

    #[test]
    fn evict_on_empty_class_is_none() {
        let mut lru = Lru::new(4, 2);
        assert_eq!(lru.evict(0), None);
        lru.insert(0, 1, 0);
        assert_eq!(lru.evict(0), None);
        assert_eq!(lru.evict(1), Some(0));
        assert_eq!(lru.evict(1), None);
    }

    #[test]
    fn remove_from_head_middle_and_tail() {
        let mut lru = Lru::new(5, 1);
        for slot in 0..5 {
            lru.insert(slot, 0, 0);
        }
        lru.remove(2); // middle
        lru.remove(0); // LRU end
        lru.remove(4); // MRU end
        assert_eq!(lru.order(0), vec![1, 3]);
        assert_eq!(lru.len(0), 2);
        // A removed slot can be reused at once.
        lru.insert(0, 0, 0);
        assert_eq!(lru.order(0), vec![1, 3, 0]);
        lru.check();
    }

    #[test]
    fn zero_slots_and_zero_classes_are_usable() {
        let lru = Lru::new(0, 0);
        assert_eq!(lru.memory_bytes(), 0);
        let mut lru = Lru::new(0, 1);
        assert_eq!(lru.evict(0), None);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "not resident")]
    fn touch_of_a_free_slot_is_caught_in_debug_builds() {
        let mut lru = Lru::new(2, 1);
        lru.touch(1);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert {
            slot: SlotId,
            class: ClassId,
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
            4 => (0..SLOTS, 0..CLASSES).prop_map(|(slot, class)| Op::Insert { slot, class }),
            3 => any::<usize>().prop_map(Op::Touch),
            1 => any::<usize>().prop_map(Op::Remove),
            2 => (0..CLASSES).prop_map(Op::Evict),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Against a model LRU: a vector of (slot, class), least recently used first.
        #[test]
        fn matches_a_vec_model(ops in prop::collection::vec(op(), 1..500)) {
            let mut lru = Lru::new(SLOTS, CLASSES);
            let mut model: Vec<(SlotId, ClassId)> = Vec::new();
            for op in ops {
                match op {
                    Op::Insert { slot, class } => {
                        if model.iter().any(|&(s, _)| s == slot) {
                            continue; // the store never inserts a resident slot
                        }
                        lru.insert(slot, class, 0);
                        model.push((slot, class));
                    }
                    Op::Touch(n) if !model.is_empty() => {
                        let entry = model.remove(n % model.len());
                        lru.touch(entry.0);
                        model.push(entry);
                    }
                    Op::Remove(n) if !model.is_empty() => {
                        let (slot, _) = model.remove(n % model.len());
                        lru.remove(slot);
                    }
                    Op::Touch(_) | Op::Remove(_) => {}
                    Op::Evict(class) => {
                        let expected = model.iter().position(|&(_, c)| c == class);
                        let expected = expected.map(|i| model.remove(i).0);
                        prop_assert_eq!(lru.evict(class), expected);
                    }
                }
                for class in 0..CLASSES {
                    let want = model.iter().filter(|&&(_, c)| c == class).count();
                    prop_assert_eq!(lru.len(class) as usize, want);
                }
            }
            lru.check();
            for class in 0..CLASSES {
                let want: Vec<_> =
                    model.iter().filter(|&&(_, c)| c == class).map(|&(s, _)| s).collect();
                prop_assert_eq!(lru.order(class), want);
            }
        }
    }
}
