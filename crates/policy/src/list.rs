//! Intrusive doubly linked lists over a per-slot link array.
//!
//! Both policies keep their queues this way: one `Link` per slot, shared by all the lists of
//! a policy instance (a slot is on at most one list at a time), and a small `List` header per
//! queue. Linking and unlinking are O(1) and never allocate, and a list costs 12 bytes no
//! matter how long it is.

/// "No slot": the end of a list, or the links of a slot that is on no list. Slot ids are
/// `< slots <= u32::MAX`, so no slot can have this id.
pub(crate) const NIL: u32 = u32::MAX;

/// The neighbours of one slot on its list. `prev` points towards the head (newer entries),
/// `next` towards the tail (older entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    prev: u32,
    next: u32,
}

impl Link {
    pub(crate) const UNLINKED: Link = Link { prev: NIL, next: NIL };
}

/// The header of one list: new entries enter at the head, the oldest one is at the tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl List {
    pub(crate) const EMPTY: List = List { head: NIL, tail: NIL, len: 0 };

    #[inline]
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// The oldest entry, if any.
    #[inline]
    pub(crate) fn tail(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }

    /// Links `slot`, which must be on no list, in at the head.
    #[inline]
    pub(crate) fn push_head(&mut self, links: &mut [Link], slot: u32) {
        debug_assert_eq!(links[slot as usize], Link::UNLINKED, "slot {slot} is already linked");
        links[slot as usize] = Link { prev: NIL, next: self.head };
        if self.head == NIL {
            self.tail = slot;
        } else {
            links[self.head as usize].prev = slot;
        }
        self.head = slot;
        self.len += 1;
    }

    /// Unlinks `slot`, which must be on this list, and leaves it unlinked.
    #[inline]
    pub(crate) fn unlink(&mut self, links: &mut [Link], slot: u32) {
        debug_assert!(self.len > 0, "unlink of slot {slot} from an empty list");
        let Link { prev, next } = links[slot as usize];
        if prev == NIL {
            debug_assert_eq!(self.head, slot, "slot {slot} is not on this list");
            self.head = next;
        } else {
            links[prev as usize].next = next;
        }
        if next == NIL {
            debug_assert_eq!(self.tail, slot, "slot {slot} is not on this list");
            self.tail = prev;
        } else {
            links[next as usize].prev = prev;
        }
        links[slot as usize] = Link::UNLINKED;
        self.len -= 1;
    }

    /// The slots from head (newest) to tail (oldest), after checking that the links in both
    /// directions and the length agree. Test-only: it allocates.
    #[cfg(test)]
    pub(crate) fn slots(&self, links: &[Link]) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len as usize);
        let mut prev = NIL;
        let mut at = self.head;
        while at != NIL {
            assert!(out.len() < self.len as usize, "list is longer than its len {}", self.len);
            assert_eq!(links[at as usize].prev, prev, "broken prev link at slot {at}");
            out.push(at);
            prev = at;
            at = links[at as usize].next;
        }
        assert_eq!(self.tail, prev, "tail does not end the list");
        assert_eq!(out.len(), self.len as usize, "len disagrees with the links");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(n: usize) -> Vec<Link> {
        vec![Link::UNLINKED; n]
    }

    #[test]
    fn push_and_unlink_at_head_middle_and_tail() {
        let mut links = fresh(8);
        let mut list = List::EMPTY;
        for slot in [1, 3, 5, 7] {
            list.push_head(&mut links, slot);
        }
        assert_eq!(list.slots(&links), vec![7, 5, 3, 1]);
        assert_eq!(list.tail(), Some(1));

        list.unlink(&mut links, 5); // middle
        assert_eq!(list.slots(&links), vec![7, 3, 1]);
        list.unlink(&mut links, 7); // head
        assert_eq!(list.slots(&links), vec![3, 1]);
        list.unlink(&mut links, 1); // tail
        assert_eq!(list.slots(&links), vec![3]);
        assert_eq!(list.tail(), Some(3));
        list.unlink(&mut links, 3); // only
        assert_eq!(list, List::EMPTY);
        assert_eq!(list.tail(), None);
        assert!(links.iter().all(|l| *l == Link::UNLINKED));
    }

    #[test]
    fn two_lists_share_one_link_array() {
        let mut links = fresh(6);
        let (mut a, mut b) = (List::EMPTY, List::EMPTY);
        for slot in 0..6 {
            if slot % 2 == 0 {
                a.push_head(&mut links, slot);
            } else {
                b.push_head(&mut links, slot);
            }
        }
        a.unlink(&mut links, 2);
        b.push_head(&mut links, 2);
        assert_eq!(a.slots(&links), vec![4, 0]);
        assert_eq!(b.slots(&links), vec![2, 5, 3, 1]);
    }
}
