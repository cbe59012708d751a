//! Recovery: the scan from the superblock's tail by the commit rule (`format.rs`), through a
//! read-ahead window.

use super::*;

impl Log {
    /// Rebuild the ring and index from the tail by the commit rule.
    pub(super) fn scan(&self, rec: &mut Recovered) -> Result<(), TierError> {
        let mut ring = self.commit.lock();
        let mut ix = self.index.lock();
        let mut win = Window { start: 0, pages: Vec::new() };
        let mut total = 0u64;
        let ring_pages = self.end - RING_START;
        loop {
            let (seq, prev) = (ring.next_seq, ring.last_crc);
            let mut torn = false;
            let mut found = match self.batch_at(&mut win, ring.head, seq, prev)? {
                Probe::Found(h, c) => Some((ring.head, (h, c))),
                Probe::Torn => {
                    torn = true;
                    None
                }
                Probe::Nothing => None,
            };
            if found.is_none() && ring.head != RING_START {
                // The writer wraps to the ring's start when a batch does not fit before its end.
                found = match self.batch_at(&mut win, RING_START, seq, prev)? {
                    Probe::Found(h, c) => Some((RING_START, (h, c))),
                    Probe::Torn => {
                        torn = true;
                        None
                    }
                    Probe::Nothing => None,
                };
            }
            let Some((at, (head, crc))) = found else {
                rec.torn_tail = torn;
                break;
            };
            let size = 1 + head.data_pages() as u64;
            total += size;
            if total > ring_pages {
                break; // more than a ring's worth cannot be live (defensive)
            }
            let data = win.get(&*self.medium, at + 1, size - 1, self.end)?;
            let mut d = 0usize;
            for e in &head.entries {
                let (page_no, name) = if e.kind.has_page() {
                    d += 1;
                    (at + d as u64, Some(&data[d - 1].0[..]))
                } else {
                    (0, None)
                };
                let name = name.map(|n| &n[..(e.aux as usize).min(PAGE_BYTES)]);
                ix.apply(seq, e, page_no, if e.kind == Kind::Name { name } else { None });
            }
            ring.batches.push_back(BatchPos { seq, page: at, pages: size, prev, at: Instant::now() });
            ring.head = at + size;
            ring.next_seq = seq + 1;
            ring.last_crc = crc;
            rec.batches += 1;
        }
        Ok(())
    }

    /// The batch at page `at` if it counts as the successor (`seq`, `prev`): header and data
    /// check.
    fn batch_at(&self, win: &mut Window, at: u64, seq: u64, prev: u32) -> Result<Probe, TierError> {
        if at >= self.end {
            return Ok(Probe::Nothing);
        }
        let hp = &win.get(&*self.medium, at, 1, self.end)?[0];
        let crc = BatchHead::crc_of(&hp.0);
        let Some(h) = BatchHead::decode(&hp.0) else {
            let ours = &hp.0[..8] == crate::format::BATCH_MAGIC;
            return Ok(if ours { Probe::Torn } else { Probe::Nothing });
        };
        if h.log_id != self.log_id || h.seq != seq || h.prev != prev {
            let later = h.log_id == self.log_id && h.seq >= seq;
            return Ok(if later { Probe::Torn } else { Probe::Nothing });
        }
        let n = h.data_pages() as u64;
        if at + 1 + n > self.end {
            return Ok(Probe::Torn);
        }
        let data = win.get(&*self.medium, at + 1, n, self.end)?;
        let mut d = 0;
        for e in &h.entries {
            if e.kind.has_page() {
                if data_crc(&data[d].0) != e.data_crc {
                    return Ok(Probe::Torn);
                }
                d += 1;
            }
        }
        Ok(Probe::Found(h, crc))
    }
}

pub(super) enum Probe {
    Found(BatchHead, u32),
    /// One of ours that fails the rule: written, never acknowledged.
    Torn,
    Nothing,
}

/// A read-ahead window over the medium for the recovery scan (1 MiB reads, not a read per
/// page: ≤ 1 s per GiB even on an SSD).
struct Window {
    start: u64,
    pages: Vec<Page>,
}

const WINDOW_PAGES: u64 = 256;

impl Window {
    fn get(&mut self, m: &dyn Medium, at: u64, n: u64, end: u64) -> Result<&[Page], TierError> {
        let have = at >= self.start && at + n <= self.start + self.pages.len() as u64;
        if !have {
            let len = n.max(WINDOW_PAGES).min(end - at);
            let mut pages = page::zeroed(len as usize);
            m.read_at(at * PB, page::bytes_mut(&mut pages)).map_err(|e| TierError::io("reading the log", e))?;
            self.start = at;
            self.pages = pages;
        }
        let o = (at - self.start) as usize;
        Ok(&self.pages[o..o + n as usize])
    }
}
