//! The values the benchmarks store: 4 KiB, derived from the key id, so that every value a
//! GET returns can be checked completely and cheaply against the key it was asked for.
//!
//! Word `j` (little-endian u64) of the value of key `id` is `seed(id) + j × G`. Checking all
//! 512 words is a loop of adds, xors and ors that the compiler vectorises: about as cheap as
//! a checksum, but it also catches a value of the wrong key, a torn or shifted value and a
//! short one.

use crate::rng::mix64;

/// Bytes of every value the benchmarks store (one farcache block).
pub const VALUE_BYTES: usize = 4096;
const WORDS: usize = VALUE_BYTES / 8;
const G: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
fn seed(id: u64) -> u64 {
    mix64(id ^ 0xFA2C_AC4E_0000_0000)
}

/// Write the value of key `id` into `out` (exactly [`VALUE_BYTES`]).
pub fn fill_value(id: u64, out: &mut [u8]) {
    assert_eq!(out.len(), VALUE_BYTES);
    let s = seed(id);
    for (j, w) in out.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&s.wrapping_add((j as u64).wrapping_mul(G)).to_le_bytes());
    }
}

/// Is `v` exactly the value of key `id`?
#[inline]
pub fn check_value(id: u64, v: &[u8]) -> bool {
    if v.len() != VALUE_BYTES {
        return false;
    }
    let s = seed(id);
    let mut diff = 0u64;
    for (j, w) in v.chunks_exact(8).enumerate().take(WORDS) {
        diff |= u64::from_le_bytes(w.try_into().unwrap()) ^ s.wrapping_add((j as u64).wrapping_mul(G));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_check_and_differ_by_key() {
        let mut a = vec![0u8; VALUE_BYTES];
        let mut b = vec![0u8; VALUE_BYTES];
        fill_value(1, &mut a);
        fill_value(2, &mut b);
        assert!(check_value(1, &a) && check_value(2, &b));
        assert!(!check_value(2, &a) && !check_value(1, &b));
        assert!(!check_value(1, &a[..VALUE_BYTES - 1]));
        for pos in [0, 1, 2047, 4095] {
            let mut c = a.clone();
            c[pos] ^= 0x10;
            assert!(!check_value(1, &c), "flip at {pos} not caught");
        }
    }
}
