//! The on-medium format, byte by byte. Every structure is one 4 KiB page, little-endian,
//! with a CRC-32 (crc32fast) of the page's first 4092 bytes in its last four.
//!
//! ```text
//! page 0, page 1   superblock copies A and B (the valid one with the higher `generation` wins)
//! page 2 ..        the ring: batches, each a header page then the data pages of its entries
//! ```
//!
//! Superblock: `magic "FCTIERSB"`, `format u32`, `page_bytes u32`, `pages u64`, `log_id u64`,
//! `generation u64`, `tail_seq u64`, `tail_page u64`, `backing_len u16`, 2 zero bytes, `tail_prev u32`
//! (the `prev` the batch at the tail must carry), `backing` (UTF-8, at most
//! [`MAX_BACKING_BYTES`]), zeros, `crc u32` at 4092.
//!
//! Batch header: `magic "FCTIERBT"`, `log_id u64`, `seq u64`, `entries u32`, `data_pages u32`,
//! `prev u32` (the CRC of the previous batch's header), 4 zero bytes, `session u64` (drawn at
//! each open of the log), zeros to byte 64, then `entries` entries of [`ENTRY_BYTES`] each, zeros, `crc u32` at 4092.
//! Entry: `kind u8`, 3 zero bytes, `data_crc u32`, `key u64`, `block u64`, `aux u64`, 16 zero
//! bytes. Kinds: 1 data (one data page: the block; `aux` = bytes of it that are file contents),
//! 2 name (one data page: the key's opaque name, `aux` = its length), 3 trim (no page: the
//! file's size became `aux`; older records past it are gone), 4 drop (no page: every record of
//! the key with a seq up to `aux` is gone; with none left, its name too). Data pages follow the header in entry order.
//!
//! **The commit rule**: a batch counts if and only if its header and every data page check,
//! its `log_id` is the superblock's, and its `seq` and `prev` follow the previous batch that
//! counts (`seq` one more, `prev` that batch's header CRC; for the first one the superblock's
//! `tail_seq` and `tail_prev`). The `prev` link (with the session) is what keeps a batch
//! written but never flushed before a crash from being taken, after the restart, as the
//! successor of a new batch that happens to land where its predecessor was. The first batch that fails ends the
//! log; it and everything after it were never acknowledged.

use crate::{FileKey, PAGE_BYTES};

pub const FORMAT: u32 = 1;
pub const SB_MAGIC: &[u8; 8] = b"FCTIERSB";
pub const BATCH_MAGIC: &[u8; 8] = b"FCTIERBT";
/// Pages before the ring: the two superblock copies.
pub const RING_START: u64 = 2;
pub const ENTRY_BYTES: usize = 48;
const ENTRIES_AT: usize = 64;
const CRC_AT: usize = PAGE_BYTES - 4;
/// Most entries one batch holds (data pages at most as many).
pub const MAX_ENTRIES: usize = 64;
pub const MAX_BACKING_BYTES: usize = 2048;
const _: () = assert!(ENTRIES_AT + MAX_ENTRIES * ENTRY_BYTES <= CRC_AT);
const _: () = assert!(64 + MAX_BACKING_BYTES <= CRC_AT);

fn crc(page: &[u8]) -> u32 {
    crc32fast::hash(&page[..CRC_AT])
}

fn seal(page: &mut [u8]) {
    let c = crc(page);
    page[CRC_AT..].copy_from_slice(&c.to_le_bytes());
}

fn checks(page: &[u8]) -> bool {
    page.len() == PAGE_BYTES && u32::from_le_bytes(page[CRC_AT..].try_into().unwrap()) == crc(page)
}

fn u32_at(p: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(p[at..at + 4].try_into().unwrap())
}
fn u64_at(p: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(p[at..at + 8].try_into().unwrap())
}

/// The checksum of a data page, as its entry records it.
pub fn data_crc(page: &[u8]) -> u32 {
    crc32fast::hash(page)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub pages: u64,
    pub log_id: u64,
    pub generation: u64,
    /// The first batch that counts.
    pub tail_seq: u64,
    /// Where it starts (a ring page).
    pub tail_page: u64,
    pub tail_prev: u32,
    /// The backing directory this tier belongs to (as given when it was made).
    pub backing: String,
}

impl Superblock {
    pub fn encode(&self, page: &mut [u8]) {
        page.fill(0);
        page[..8].copy_from_slice(SB_MAGIC);
        page[8..12].copy_from_slice(&FORMAT.to_le_bytes());
        page[12..16].copy_from_slice(&(PAGE_BYTES as u32).to_le_bytes());
        page[16..24].copy_from_slice(&self.pages.to_le_bytes());
        page[24..32].copy_from_slice(&self.log_id.to_le_bytes());
        page[32..40].copy_from_slice(&self.generation.to_le_bytes());
        page[40..48].copy_from_slice(&self.tail_seq.to_le_bytes());
        page[48..56].copy_from_slice(&self.tail_page.to_le_bytes());
        let b = self.backing.as_bytes();
        let n = b.len().min(MAX_BACKING_BYTES);
        page[56..58].copy_from_slice(&(n as u16).to_le_bytes());
        page[60..64].copy_from_slice(&self.tail_prev.to_le_bytes());
        page[64..64 + n].copy_from_slice(&b[..n]);
        seal(page);
    }

    /// The superblock in `page`, or why not: `Err(true)` if it is one of ours but damaged or
    /// of another format, `Err(false)` if it is not a farcache tier at all.
    pub fn decode(page: &[u8]) -> Result<Superblock, bool> {
        if page.len() != PAGE_BYTES || &page[..8] != SB_MAGIC {
            return Err(false);
        }
        if !checks(page) || u32_at(page, 8) != FORMAT || u32_at(page, 12) as usize != PAGE_BYTES {
            return Err(true);
        }
        let n = (u16::from_le_bytes([page[56], page[57]]) as usize).min(MAX_BACKING_BYTES);
        Ok(Superblock {
            pages: u64_at(page, 16),
            log_id: u64_at(page, 24),
            generation: u64_at(page, 32),
            tail_seq: u64_at(page, 40),
            tail_page: u64_at(page, 48),
            tail_prev: u32_at(page, 60),
            backing: String::from_utf8_lossy(&page[64..64 + n]).into_owned(),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Data = 1,
    Name = 2,
    Trim = 3,
    Drop = 4,
}

impl Kind {
    pub fn has_page(self) -> bool {
        matches!(self, Kind::Data | Kind::Name)
    }
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Data,
            2 => Kind::Name,
            3 => Kind::Trim,
            4 => Kind::Drop,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHead {
    pub kind: Kind,
    pub data_crc: u32,
    pub key: FileKey,
    pub block: u64,
    pub aux: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchHead {
    pub log_id: u64,
    pub seq: u64,
    pub prev: u32,
    pub session: u64,
    pub entries: Vec<EntryHead>,
}

impl BatchHead {
    pub fn data_pages(&self) -> usize {
        self.entries.iter().filter(|e| e.kind.has_page()).count()
    }

    /// Encode into `page`; returns the header's CRC (the next batch's `prev`).
    pub fn encode(&self, page: &mut [u8]) -> u32 {
        assert!(self.entries.len() <= MAX_ENTRIES);
        page.fill(0);
        page[..8].copy_from_slice(BATCH_MAGIC);
        page[8..16].copy_from_slice(&self.log_id.to_le_bytes());
        page[16..24].copy_from_slice(&self.seq.to_le_bytes());
        page[24..28].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        page[28..32].copy_from_slice(&(self.data_pages() as u32).to_le_bytes());
        page[32..36].copy_from_slice(&self.prev.to_le_bytes());
        page[40..48].copy_from_slice(&self.session.to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let p = &mut page[ENTRIES_AT + i * ENTRY_BYTES..ENTRIES_AT + (i + 1) * ENTRY_BYTES];
            p[0] = e.kind as u8;
            p[4..8].copy_from_slice(&e.data_crc.to_le_bytes());
            p[8..16].copy_from_slice(&e.key.0.to_le_bytes());
            p[16..24].copy_from_slice(&e.block.to_le_bytes());
            p[24..32].copy_from_slice(&e.aux.to_le_bytes());
        }
        seal(page);
        u32_at(page, CRC_AT)
    }

    /// The CRC a header page carries (valid only for a page that decoded).
    pub fn crc_of(page: &[u8]) -> u32 {
        u32_at(page, CRC_AT)
    }

    /// The header in `page` if it checks (its data pages are checked by the caller).
    pub fn decode(page: &[u8]) -> Option<BatchHead> {
        if page.len() != PAGE_BYTES || &page[..8] != BATCH_MAGIC || !checks(page) {
            return None;
        }
        let n = u32_at(page, 24) as usize;
        if n > MAX_ENTRIES {
            return None;
        }
        let mut entries = Vec::with_capacity(n);
        for i in 0..n {
            let p = &page[ENTRIES_AT + i * ENTRY_BYTES..ENTRIES_AT + (i + 1) * ENTRY_BYTES];
            entries.push(EntryHead {
                kind: Kind::from_u8(p[0])?,
                data_crc: u32_at(p, 4),
                key: FileKey(u64_at(p, 8)),
                block: u64_at(p, 16),
                aux: u64_at(p, 24),
            });
        }
        let b = BatchHead {
            log_id: u64_at(page, 8),
            seq: u64_at(page, 16),
            prev: u32_at(page, 32),
            session: u64_at(page, 40),
            entries,
        };
        (b.data_pages() == u32_at(page, 28) as usize).then_some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_and_header_round_trip_and_any_flipped_bit_fails() {
        let sb = Superblock {
            pages: 1000,
            log_id: 7,
            generation: 3,
            tail_seq: 9,
            tail_page: 17,
            tail_prev: 99,
            backing: "/srv/data".into(),
        };
        let mut p = vec![0u8; PAGE_BYTES];
        sb.encode(&mut p);
        assert_eq!(Superblock::decode(&p), Ok(sb));
        p[100] ^= 1;
        assert_eq!(Superblock::decode(&p), Err(true));

        let b = BatchHead {
            log_id: 7,
            seq: 12,
            prev: 3,
            session: 11,
            entries: vec![
                EntryHead { kind: Kind::Name, data_crc: 5, key: FileKey(1), block: 0, aux: 10 },
                EntryHead { kind: Kind::Data, data_crc: 6, key: FileKey(1), block: 42, aux: 4096 },
                EntryHead { kind: Kind::Trim, data_crc: 0, key: FileKey(1), block: 0, aux: 100 },
            ],
        };
        b.encode(&mut p);
        assert_eq!(BatchHead::decode(&p), Some(b.clone()));
        assert_eq!(b.data_pages(), 2);
        for bit in [0usize, 8 * 70, 8 * 4094] {
            let mut q = p.clone();
            q[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(BatchHead::decode(&q), None, "bit {bit}");
        }
    }
}
