//! Block encryption against a real lender (the server library on loopback): sealed blocks
//! round-trip through the lender, what the lender holds is not the block, and a lender whose
//! slots are too small for sealed blocks costs misses, never errors.

mod common;

use std::sync::Arc;

use common::{backing, fill_all, read_all, wait, Lender};
use farcache_engine::cached::CachedPath;
use farcache_engine::index::BlockKey;
use farcache_engine::seal::{BlockKeyBytes, BlockSeal, XChaCha, SEAL_OVERHEAD};
use farcache_engine::{DataPath, DirectPath};
use farcache_policy::route::Threshold;
use farcache_testkit::pattern;

fn sealed_engine(lender: &Lender) -> CachedPath<DirectPath> {
    let seal: Arc<dyn BlockSeal> = Arc::new(XChaCha::new(&BlockKeyBytes::generate(), "default"));
    let remote = common::remote(vec![lender.addr], |c| c.seal = seal);
    CachedPath::new(DirectPath::new(), remote, Threshold::PAPER)
}

#[test]
fn sealed_blocks_round_trip_through_a_lender_with_large_enough_slots() {
    let lender = Lender::with_slots("16MiB", 4096 + SEAL_OVERHEAD as u32);
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(256 << 10, 3);
    let file = backing(&dir, &data);
    let e = sealed_engine(&lender);
    wait("connection", || e.remote().connected() == 1);
    fill_all(&e, &file, &data);
    let before = e.remote().counters().snapshot();
    read_all(&e, &file, &data);
    let r = e.remote().counters().snapshot();
    assert_eq!(r.hits - before.hits, 64, "{r:?}");
    assert_eq!(r.auth_failures, 0);
    assert_eq!(r.bytes_to_servers, r.puts * (4096 + SEAL_OVERHEAD as u64), "sealed blocks are stored");
    assert_eq!(r.bytes_from_servers, r.hits * (4096 + SEAL_OVERHEAD as u64));
    assert_eq!(e.stats().remote.auth_failures, 0);
}

#[test]
fn a_lender_with_slots_too_small_for_sealed_blocks_costs_only_misses() {
    let lender = Lender::start("16MiB"); // 4096-byte slots
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 << 10, 4);
    let file = backing(&dir, &data);
    let e = sealed_engine(&lender);
    wait("connection", || e.remote().connected() == 1);
    for _ in 0..2 {
        read_all(&e, &file, &data);
        wait("fills", || common::fills_settled(&e));
    }
    let r = e.remote().counters().snapshot();
    assert_eq!((r.puts, r.hits), (0, 0), "{r:?}");
    assert_eq!(r.puts_failed, 32, "every fill refused as too large: {r:?}");
    assert_eq!(e.index().remote_blocks(), 0);
}

#[test]
fn values_stored_under_one_key_never_open_under_another() {
    // What a lender could do with what it holds: answer block k with the value of block j.
    let seal = XChaCha::new(&BlockKeyBytes::generate(), "default");
    let k = |block| BlockKey { file: 9, block, version: 1 };
    let a = seal.seal(&k(1), &[1u8; 4096]);
    let b = seal.seal(&k(2), &[1u8; 4096]); // same bytes, other block
    assert!(seal.open(&k(2), &a).is_err() && seal.open(&k(1), &b).is_err());
    assert!(seal.open(&k(1), &a).is_ok() && seal.open(&k(2), &b).is_ok());
    // A written block's new key differs in the version only: the old copy must not open.
    let newer = BlockKey { version: 2, ..k(1) };
    assert!(seal.open(&newer, &a).is_err());
}

#[test]
fn a_write_retires_its_block_and_the_neighbours_stay_sealed_hits() {
    let lender = Lender::with_slots("16MiB", 4096 + SEAL_OVERHEAD as u32);
    let dir = tempfile::tempdir().unwrap();
    let mut data = pattern(64 * 4096, 5);
    let file = backing(&dir, &data);
    let e = sealed_engine(&lender);
    wait("connection", || e.remote().connected() == 1);
    fill_all(&e, &file, &data);
    let old = e.index().lookup(&e.index().file(file.id()), 9).unwrap();
    // One 8 KiB page: blocks 8 and 9.
    let page = pattern(8192, 6);
    e.write(&file, 8 * 4096, &page).unwrap();
    data[8 * 4096..10 * 4096].copy_from_slice(&page);
    assert_eq!(e.index().remote_blocks(), 62);
    let before = e.remote().counters().snapshot();
    read_all(&e, &file, &data);
    let r = e.remote().counters().snapshot();
    assert_eq!(r.hits - before.hits, 62, "the neighbours are served: {r:?}");
    fill_all(&e, &file, &data);
    let new = e.index().lookup(&e.index().file(file.id()), 9).unwrap();
    assert!(new.version > old.version, "{new:?} after {old:?}");
    read_all(&e, &file, &data);
    assert_eq!(e.remote().counters().snapshot().auth_failures, 0);
}
