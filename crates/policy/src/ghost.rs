//! S3-FIFO's ghost: the fingerprints of the most recently evicted one-hit wonders.
//!
//! It is a FIFO of the last `capacity` fingerprints recorded, with O(1) membership:
//!
//! - a ring of `capacity` folded 28-bit fingerprints in recording order (0 marks a position
//!   that is empty or whose fingerprint was consumed), and
//! - an open-addressed (linear probing) hash table whose entries name *ring positions*, one
//!   entry per live ring position. An entry is `(tag << pos_bits) | (position + 1)`: the tag
//!   is spare hash bits that let a probe skip most non-matching entries without reading the
//!   ring; 0 is an empty entry.
//!
//! A fingerprint's count is the number of live ring positions holding it, which is the number
//! of table entries that lead to it; it is "in the ghost" while that count is > 0. When the
//! ring overwrites a position, the table entry of that position (and only that one) goes;
//! when `take` consumes a fingerprint, one of its positions is emptied in the ring and its
//! entry goes. So the counts stay exact however often a fingerprint recurs, and removal needs
//! no tombstones (backward-shift deletion).
//!
//! Memory: 4 bytes per ring position plus 4 bytes per table entry at a load of at most 0.8
//! (`capacity + capacity / 4 + 1` entries): about 9 bytes per slot. Nothing allocates after
//! `new`. Two keys whose 28-bit folds collide are confused, so a new key is mistaken for a
//! returning one with a probability of about `capacity / 2^28` (0.4% at 1 Mi slots): it then
//! starts in S3-FIFO's main queue, which costs a little hit ratio and nothing else.

/// Bits of a folded fingerprint. Four bits fewer than a `u32`, so S3-FIFO can keep the
/// fingerprint and a slot's queue and frequency in one `u32` per slot.
pub(crate) const FOLD_BITS: u32 = 28;
const FOLD_MASK: u32 = (1 << FOLD_BITS) - 1;

/// Folds a 64-bit fingerprint into a non-zero `FOLD_BITS`-bit one, using every input bit.
#[inline]
pub(crate) fn fold(fingerprint: u64) -> u32 {
    let x = fingerprint ^ (fingerprint >> 32);
    let x = (x as u32) ^ ((x as u32) >> FOLD_BITS);
    match x & FOLD_MASK {
        0 => 1, // 0 marks an empty ring position
        f => f,
    }
}

/// Murmur3's 32-bit finaliser: spreads a folded fingerprint over the table.
#[inline]
fn mix(f: u32) -> u32 {
    let mut h = f;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// See the module docs.
pub(crate) struct Ghost {
    /// Folded fingerprints in recording order; 0 = empty or consumed.
    ring: Box<[u32]>,
    /// The ring position the next `record` writes.
    next: u32,
    /// Entries naming ring positions; 0 = empty. Always has an empty entry, so probes end.
    table: Box<[u32]>,
    /// Bits of an entry that hold `position + 1`; the bits above hold the tag.
    pos_bits: u32,
}

impl Ghost {
    pub(crate) fn new(capacity: u32) -> Self {
        let table_len = capacity as usize + capacity as usize / 4 + 1;
        Ghost {
            ring: vec![0; capacity as usize].into_boxed_slice(),
            next: 0,
            table: vec![0; table_len].into_boxed_slice(),
            // Enough bits for the largest stored value, `capacity` (position + 1).
            pos_bits: u32::BITS - capacity.leading_zeros(),
        }
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.ring) + std::mem::size_of_val(&*self.table)
    }

    /// Records the folded fingerprint `f` as the newest entry, forgetting the oldest one if
    /// the ghost is full.
    pub(crate) fn record(&mut self, f: u32) {
        debug_assert!(f != 0 && f <= FOLD_MASK, "not a folded fingerprint: {f:#x}");
        if self.ring.is_empty() {
            return;
        }
        let pos = self.next;
        if self.ring[pos as usize] != 0 {
            let i = self.find_entry_of(pos);
            self.remove_entry(i);
        }
        self.ring[pos as usize] = f;
        let h = mix(f);
        let i = self.probe(self.home(h), |entry| entry == 0);
        self.table[i] = self.tag(h) | (pos + 1);
        self.next = if pos + 1 == self.ring.len() as u32 { 0 } else { pos + 1 };
    }

    /// If the folded fingerprint `f` is in the ghost, consumes one occurrence and returns
    /// true.
    pub(crate) fn take(&mut self, f: u32) -> bool {
        self.take_position(f).is_some()
    }

    /// `take`, telling which ring position was consumed.
    fn take_position(&mut self, f: u32) -> Option<u32> {
        if self.ring.is_empty() {
            return None;
        }
        let h = mix(f);
        let (tag, mask) = (self.tag(h), self.pos_mask());
        let i = self.probe(self.home(h), |entry| {
            entry == 0 || (entry & !mask == tag && self.ring[((entry & mask) - 1) as usize] == f)
        });
        let entry = self.table[i];
        if entry == 0 {
            return None;
        }
        let pos = (entry & mask) - 1;
        self.remove_entry(i);
        self.ring[pos as usize] = 0;
        Some(pos)
    }

    /// The first table index from `start` on (cyclically) whose entry satisfies `stop`, which
    /// must accept an empty entry: the table always has one, so the probe ends within one
    /// lap.
    #[inline]
    fn probe(&self, start: usize, stop: impl Fn(u32) -> bool) -> usize {
        let mut i = start;
        for _ in 0..self.table.len() {
            if stop(self.table[i]) {
                return i;
            }
            i = self.step(i);
        }
        panic!("ghost table has no empty entry");
    }

    #[inline]
    fn pos_mask(&self) -> u32 {
        u32::MAX.checked_shr(u32::BITS - self.pos_bits).unwrap_or(0)
    }

    /// The tag of hash `h`, in place: its low bits (the home uses mostly the high ones).
    #[inline]
    fn tag(&self, h: u32) -> u32 {
        h.checked_shl(self.pos_bits).unwrap_or(0)
    }

    /// The first table index a hash probes (Lemire's multiply-shift range reduction).
    #[inline]
    fn home(&self, h: u32) -> usize {
        ((u64::from(h) * self.table.len() as u64) >> 32) as usize
    }

    #[inline]
    fn step(&self, i: usize) -> usize {
        if i + 1 == self.table.len() {
            0
        } else {
            i + 1
        }
    }

    /// The home of the entry at table index `i`, from the fingerprint it names.
    #[inline]
    fn home_of_entry(&self, i: usize) -> usize {
        let pos = (self.table[i] & self.pos_mask()) - 1;
        self.home(mix(self.ring[pos as usize]))
    }

    /// The table index of the entry naming the live ring position `pos`.
    fn find_entry_of(&self, pos: u32) -> usize {
        let mask = self.pos_mask();
        let start = self.home(mix(self.ring[pos as usize]));
        let i = self.probe(start, |entry| entry == 0 || entry & mask == pos + 1);
        assert!(self.table[i] != 0, "ghost table lost the entry of ring position {pos}");
        i
    }

    /// Empties table index `hole`, moving later entries of its cluster back so that every
    /// entry stays reachable from its home without crossing an empty entry.
    fn remove_entry(&mut self, mut hole: usize) {
        let n = self.table.len();
        let mut j = hole;
        // Ends at the first empty entry, within one lap: the table always has one.
        for _ in 0..n {
            j = self.step(j);
            if self.table[j] == 0 {
                break;
            }
            // The entry at `j` may fill the hole if the hole lies on its probe path, that is
            // between its home and `j` (cyclically).
            let probed = (j + n - self.home_of_entry(j)) % n;
            let to_hole = (j + n - hole) % n;
            if to_hole <= probed {
                self.table[hole] = self.table[j];
                hole = j;
            }
        }
        self.table[hole] = 0;
    }
}

#[cfg(test)]
impl Ghost {
    /// Checks that the table holds exactly one reachable entry per live ring position.
    pub(crate) fn check(&self) {
        let mut seen = vec![false; self.ring.len()];
        let mut entries = 0;
        for (i, &entry) in self.table.iter().enumerate() {
            if entry == 0 {
                continue;
            }
            entries += 1;
            let pos = (entry & self.pos_mask()) - 1;
            let f = self.ring[pos as usize];
            assert!(f != 0, "table entry {i} names the dead ring position {pos}");
            assert!(!seen[pos as usize], "two table entries name ring position {pos}");
            seen[pos as usize] = true;
            assert_eq!(entry & !self.pos_mask(), self.tag(mix(f)), "wrong tag at {i}");
            let mut k = self.home(mix(f));
            while k != i {
                assert!(self.table[k] != 0, "entry {i} unreachable from its home");
                k = self.step(k);
            }
        }
        let live = self.ring.iter().filter(|&&f| f != 0).count();
        assert_eq!(entries, live, "table entries vs live ring positions");
        assert!(entries < self.table.len(), "the table must keep an empty entry");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fold_is_nonzero_and_fits() {
        for fp in [0, 1, u64::MAX, 1 << 28, 0x1000_0000_1000_0000, 0xdead_beef_cafe_f00d] {
            let f = fold(fp);
            assert!(f != 0 && f <= FOLD_MASK, "{fp:#x} -> {f:#x}");
        }
        // High and low halves both matter.
        assert_ne!(fold(1), fold(2));
        assert_ne!(fold(1 << 32), fold(2 << 32));
    }

    #[test]
    fn remembers_the_last_capacity_records() {
        let mut g = Ghost::new(4);
        for f in 1..=6 {
            g.record(f);
        }
        g.check();
        // 1 and 2 were overwritten by 5 and 6.
        assert!(!g.take(1));
        assert!(!g.take(2));
        for f in 3..=6 {
            assert!(g.take(f), "{f} should be in the ghost");
        }
        g.check();
    }

    #[test]
    fn take_consumes_one_occurrence() {
        let mut g = Ghost::new(8);
        g.record(7);
        g.record(7);
        assert!(g.take(7));
        assert!(g.take(7));
        assert!(!g.take(7));
        g.check();
    }

    #[test]
    fn overwriting_a_consumed_position_keeps_counts_right() {
        let mut g = Ghost::new(2);
        g.record(9); // position 0
        assert!(g.take(9)); // position 0 consumed
        g.record(9); // position 1: the only live 9
        g.record(5); // overwrites the consumed position 0: must not forget the live 9
        g.check();
        assert!(g.take(9));
        assert!(g.take(5));
        g.check();
    }

    #[test]
    fn zero_capacity_remembers_nothing() {
        let mut g = Ghost::new(0);
        g.record(3);
        assert!(!g.take(3));
        assert_eq!(g.ring.len(), 0);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Record(u32),
        Take(u32),
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Against a plain ring scanned linearly. Fingerprints come from a small range so they
        /// recur, and tables this small make probe clusters and wrap-around common.
        #[test]
        fn matches_a_linear_ring(
            capacity in 0u32..40,
            ops in prop::collection::vec(
                prop_oneof![
                    (1u32..30).prop_map(Op::Record),
                    (1u32..30).prop_map(Op::Take),
                ],
                1..500,
            ),
        ) {
            let mut g = Ghost::new(capacity);
            let mut ring = vec![0u32; capacity as usize];
            let mut next = 0;
            for op in ops {
                match op {
                    Op::Record(f) => {
                        g.record(f);
                        if capacity > 0 {
                            ring[next] = f;
                            next = (next + 1) % capacity as usize;
                        }
                    }
                    Op::Take(f) => match g.take_position(f) {
                        Some(pos) => {
                            prop_assert_eq!(ring[pos as usize], f);
                            ring[pos as usize] = 0;
                        }
                        None => prop_assert!(!ring.contains(&f), "{} was in the ghost", f),
                    },
                }
                prop_assert_eq!(&*g.ring, &ring[..]);
                g.check();
            }
        }
    }
}
