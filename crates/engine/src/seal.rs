//! [`BlockSeal`]: what a block looks like on a lender. The seam between the engine and the
//! bytes it hands to lenders it does not trust.
//!
//! - [`Plaintext`]: the identity, for a mount with no block key (`cache.key_file = ""`):
//!   lenders are trusted, as before issue 5.
//! - [`XChaCha`]: XChaCha20-Poly1305 (the RustCrypto `chacha20poly1305` crate), each block
//!   encrypted and authenticated on the client before it leaves, bound by its associated data
//!   to the tenant, the file key, the block number and the version. A lender (or anyone on
//!   the path) that swaps a block for another, serves an older version, hands one tenant's
//!   block to another, flips a bit, truncates or extends a value makes [`BlockSeal::open`]
//!   fail, and the engine reads the disk instead.
//!
//! # Sealed value layout (docs/SECURITY.md)
//! `nonce (24 bytes) ‖ ciphertext (as long as the block) ‖ tag (16 bytes)`: a 4 KiB block is
//! 4136 bytes on the lender. The lender stores it as an opaque value and never looks inside.
//!
//! # Associated data
//! `"farcache-block-v1" ‖ tenant length (1 byte) ‖ tenant ‖ file key (16 bytes LE) ‖ block
//! (8 bytes LE) ‖ version (8 bytes LE)`. Nothing of it is sent: the client rebuilds it from
//! the key it asked for, so a value answered for any other key fails.

use std::fmt;

use bytes::Bytes;
use chacha20poly1305::aead::{AeadCore, AeadInPlace, KeyInit, OsRng};
use chacha20poly1305::{Tag, XChaCha20Poly1305, XNonce};

use crate::index::BlockKey;

/// Bytes of a block key (XChaCha20-Poly1305 takes a 256-bit key).
pub const KEY_BYTES: usize = 32;
/// Bytes of the random nonce at the front of a sealed value.
pub const NONCE_BYTES: usize = 24;
/// Bytes of the Poly1305 tag at the end of a sealed value.
pub const TAG_BYTES: usize = 16;
/// What sealing adds to a block.
pub const SEAL_OVERHEAD: usize = NONCE_BYTES + TAG_BYTES;
/// Domain separation: a value sealed by another format version can never open.
const AD_DOMAIN: &[u8] = b"farcache-block-v1";
/// Longest tenant name (the protocol's limit), so the associated data fits a fixed buffer.
const MAX_TENANT_BYTES: usize = 64;
const AD_MAX_BYTES: usize = AD_DOMAIN.len() + 1 + MAX_TENANT_BYTES + 16 + 8 + 8;

/// Why a value from a lender was not accepted as the block asked for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Too short to hold a nonce and a tag: cannot be a sealed block at all.
    #[error("a sealed value of {got} bytes is shorter than the {SEAL_OVERHEAD} bytes of nonce and tag")]
    TooShort { got: usize },
    /// The tag does not match: another block, another version, another tenant, another
    /// key, or altered bytes.
    #[error("the block failed authentication")]
    Auth,
}

/// How blocks are sealed before they are stored on a lender and opened when they come back.
///
/// Contract: synchronous and pure (no I/O, no lock held across calls), callable from any
/// thread. `open(key, seal(key, p)) == Ok(p)` for every `key` and `p`; for a [`BlockSeal`]
/// that authenticates, `open` fails for any value not produced by `seal` under the same key
/// (block number, version, file key) and the same tenant and block key. A failed `open` is a
/// miss to the caller, never an error to the application.
pub trait BlockSeal: Send + Sync + fmt::Debug {
    /// Short name for logs and stats: "plaintext" or "xchacha20poly1305".
    fn name(&self) -> &'static str;
    /// Length on the lender of a block of `plain_len` bytes.
    fn sealed_len(&self, plain_len: usize) -> usize;
    /// The value to store on a lender for block `key` holding `plain`.
    fn seal(&self, key: &BlockKey, plain: &[u8]) -> Bytes;
    /// The block `key` out of a value a lender answered.
    fn open(&self, key: &BlockKey, sealed: &[u8]) -> Result<Bytes, SealError>;
    /// [`Self::seal`] of a shared buffer (an identity seal returns it without copying).
    fn seal_bytes(&self, key: &BlockKey, plain: Bytes) -> Bytes {
        self.seal(key, &plain)
    }
    /// [`Self::open`] of a shared buffer (an identity seal returns it without copying).
    fn open_bytes(&self, key: &BlockKey, sealed: Bytes) -> Result<Bytes, SealError> {
        self.open(key, &sealed)
    }
}

/// No encryption, no authentication: what the lender stores is the block. For lenders that
/// are trusted (a private network, or the lender inside the mount process).
#[derive(Clone, Copy, Debug, Default)]
pub struct Plaintext;

impl BlockSeal for Plaintext {
    fn name(&self) -> &'static str {
        "plaintext"
    }
    fn sealed_len(&self, plain_len: usize) -> usize {
        plain_len
    }
    fn seal(&self, _key: &BlockKey, plain: &[u8]) -> Bytes {
        Bytes::copy_from_slice(plain)
    }
    fn open(&self, _key: &BlockKey, sealed: &[u8]) -> Result<Bytes, SealError> {
        Ok(Bytes::copy_from_slice(sealed))
    }
    fn seal_bytes(&self, _key: &BlockKey, plain: Bytes) -> Bytes {
        plain
    }
    fn open_bytes(&self, _key: &BlockKey, sealed: Bytes) -> Result<Bytes, SealError> {
        Ok(sealed)
    }
}

/// A 256-bit block key. Its `Debug` never shows the bytes.
#[derive(Clone)]
pub struct BlockKeyBytes([u8; KEY_BYTES]);

impl BlockKeyBytes {
    pub fn new(bytes: [u8; KEY_BYTES]) -> BlockKeyBytes {
        BlockKeyBytes(bytes)
    }

    /// A fresh key from the operating system's random source (`getrandom`).
    pub fn generate() -> BlockKeyBytes {
        let k = XChaCha20Poly1305::generate_key(&mut OsRng);
        BlockKeyBytes(k.into())
    }

    /// The key file's text: the key as 64 hexadecimal digits (either case) on the first
    /// line, surrounding white space ignored; nothing else but empty lines after it.
    pub fn from_hex(text: &str) -> Result<BlockKeyBytes, String> {
        farcache_config::parse_hex_key32(text).map(BlockKeyBytes)
    }

    /// The key file's text: 64 lowercase hex digits and a newline.
    pub fn to_hex_line(&self) -> String {
        let mut s = String::with_capacity(2 * KEY_BYTES + 1);
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s.push('\n');
        s
    }
}

impl fmt::Debug for BlockKeyBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BlockKeyBytes(..)")
    }
}

/// XChaCha20-Poly1305 with a random 192-bit nonce per seal.
///
/// Why this AEAD and this nonce: one block key seals every block of every run of the mount,
/// and the same [`BlockKey`] can be sealed twice with different contents (a fill that read
/// the disk before a write can race the write and be stored under the old version, see
/// `index.rs`). A nonce derived from the key, block or version would then repeat with two
/// different plaintexts, which gives away their XOR and lets anyone forge Poly1305 tags. So
/// nonces are random, and 192 bits make a random collision negligible however many blocks
/// are sealed (2^-96 after 2^48 seals); AES-256-GCM's 96-bit random nonces would cap one key
/// at about 2^32 seals, which a busy mount reaches. ChaCha20 is also fast without AES
/// instructions and constant-time in software.
pub struct XChaCha {
    aead: XChaCha20Poly1305,
    /// The tenant name, bound into every block's associated data.
    tenant: String,
}

impl fmt::Debug for XChaCha {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XChaCha").field("tenant", &self.tenant).finish_non_exhaustive()
    }
}

impl XChaCha {
    /// Blocks of `tenant` sealed with `key`. Panics if the tenant name is longer than the
    /// protocol allows (64 bytes; config validation refuses it first).
    pub fn new(key: &BlockKeyBytes, tenant: &str) -> XChaCha {
        assert!(tenant.len() <= MAX_TENANT_BYTES, "tenant name longer than {MAX_TENANT_BYTES} bytes");
        XChaCha { aead: XChaCha20Poly1305::new(&key.0.into()), tenant: tenant.to_string() }
    }

    /// The associated data of block `key`, into `buf`; returns its length.
    fn ad(&self, key: &BlockKey, buf: &mut [u8; AD_MAX_BYTES]) -> usize {
        let mut n = 0;
        let mut put = |b: &[u8]| {
            buf[n..n + b.len()].copy_from_slice(b);
            n += b.len();
        };
        put(AD_DOMAIN);
        put(&[self.tenant.len() as u8]);
        put(self.tenant.as_bytes());
        put(&key.file.to_le_bytes());
        put(&key.block.to_le_bytes());
        put(&key.version.to_le_bytes());
        n
    }
}

impl BlockSeal for XChaCha {
    fn name(&self) -> &'static str {
        "xchacha20poly1305"
    }

    fn sealed_len(&self, plain_len: usize) -> usize {
        plain_len + SEAL_OVERHEAD
    }

    fn seal(&self, key: &BlockKey, plain: &[u8]) -> Bytes {
        let mut ad = [0u8; AD_MAX_BYTES];
        let ad_len = self.ad(key, &mut ad);
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let mut out = Vec::with_capacity(plain.len() + SEAL_OVERHEAD);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = self
            .aead
            .encrypt_in_place_detached(&nonce, &ad[..ad_len], &mut out[NONCE_BYTES..])
            .expect("a 4 KiB block is far below XChaCha20-Poly1305's message limit");
        out.extend_from_slice(&tag);
        Bytes::from(out)
    }

    fn open(&self, key: &BlockKey, sealed: &[u8]) -> Result<Bytes, SealError> {
        if sealed.len() < SEAL_OVERHEAD {
            return Err(SealError::TooShort { got: sealed.len() });
        }
        let mut ad = [0u8; AD_MAX_BYTES];
        let ad_len = self.ad(key, &mut ad);
        let (nonce, rest) = sealed.split_at(NONCE_BYTES);
        let (ct, tag) = rest.split_at(rest.len() - TAG_BYTES);
        let mut plain = ct.to_vec();
        self.aead
            .decrypt_in_place_detached(XNonce::from_slice(nonce), &ad[..ad_len], &mut plain, Tag::from_slice(tag))
            .map_err(|_| SealError::Auth)?;
        Ok(Bytes::from(plain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::BLOCK_BYTES;

    const K: BlockKey = BlockKey { file: 0x0123_4567_89ab_cdef_0011_2233_4455_6677, block: 42, version: 7 };

    fn block(seed: u8) -> Vec<u8> {
        (0..BLOCK_BYTES as usize).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn seal_a() -> XChaCha {
        XChaCha::new(&BlockKeyBytes::new([7; KEY_BYTES]), "tenant-a")
    }

    #[test]
    fn round_trip_and_layout() {
        let s = seal_a();
        let p = block(1);
        let v = s.seal(&K, &p);
        assert_eq!(v.len(), BLOCK_BYTES as usize + SEAL_OVERHEAD);
        assert_eq!(s.sealed_len(BLOCK_BYTES as usize), 4136);
        assert_eq!(s.open(&K, &v).unwrap(), p);
        assert_eq!(s.open_bytes(&K, v.clone()).unwrap(), p);
        // The ciphertext is not the plaintext, and two seals of one block differ (random
        // nonces) yet both open.
        assert_ne!(&v[NONCE_BYTES..NONCE_BYTES + p.len()], &p[..]);
        let w = s.seal(&K, &p);
        assert_ne!(v[..NONCE_BYTES], w[..NONCE_BYTES]);
        assert_eq!(s.open(&K, &w).unwrap(), p);
        // Empty and odd-sized blocks round-trip too.
        for n in [0, 1, 17, 4095] {
            let v = s.seal(&K, &p[..n]);
            assert_eq!(v.len(), n + SEAL_OVERHEAD);
            assert_eq!(s.open(&K, &v).unwrap(), &p[..n]);
        }
    }

    #[test]
    fn open_fails_for_any_other_binding() {
        let s = seal_a();
        let v = s.seal(&K, &block(2));
        let other = |k: BlockKey| s.open(&k, &v);
        assert_eq!(other(BlockKey { block: K.block + 1, ..K }), Err(SealError::Auth), "another block");
        assert_eq!(other(BlockKey { version: K.version - 1, ..K }), Err(SealError::Auth), "older version");
        assert_eq!(other(BlockKey { version: K.version + 1, ..K }), Err(SealError::Auth), "newer version");
        assert_eq!(other(BlockKey { file: K.file ^ 1, ..K }), Err(SealError::Auth), "another file");
        let b = XChaCha::new(&BlockKeyBytes::new([7; KEY_BYTES]), "tenant-b");
        assert_eq!(b.open(&K, &v), Err(SealError::Auth), "another tenant, same key");
        // A tenant name that is a prefix of another cannot shift bytes into the file key.
        let t = XChaCha::new(&BlockKeyBytes::new([7; KEY_BYTES]), "tenant-");
        assert_eq!(t.open(&K, &v), Err(SealError::Auth));
        let k2 = XChaCha::new(&BlockKeyBytes::new([8; KEY_BYTES]), "tenant-a");
        assert_eq!(k2.open(&K, &v), Err(SealError::Auth), "another block key");
    }

    #[test]
    fn open_fails_for_every_single_flipped_bit() {
        let s = seal_a();
        let v = s.seal(&K, &block(3));
        let mut w = v.to_vec();
        for i in 0..w.len() * 8 {
            w[i / 8] ^= 1 << (i % 8);
            assert_eq!(s.open(&K, &w), Err(SealError::Auth), "bit {i} flipped");
            w[i / 8] ^= 1 << (i % 8);
        }
        assert!(s.open(&K, &w).is_ok());
    }

    #[test]
    fn open_fails_for_truncated_extended_and_empty_values() {
        let s = seal_a();
        let v = s.seal(&K, &block(4));
        for n in [0, 1, NONCE_BYTES, SEAL_OVERHEAD - 1] {
            assert_eq!(s.open(&K, &v[..n]), Err(SealError::TooShort { got: n }), "{n} bytes");
        }
        for n in [SEAL_OVERHEAD, SEAL_OVERHEAD + 1, v.len() - TAG_BYTES, v.len() - 1] {
            assert_eq!(s.open(&K, &v[..n]), Err(SealError::Auth), "truncated to {n}");
        }
        for extra in [&[0u8][..], &[0; 16], &v[..]] {
            let mut w = v.to_vec();
            w.extend_from_slice(extra);
            assert_eq!(s.open(&K, &w), Err(SealError::Auth), "extended by {}", extra.len());
        }
        // A value of the right length that was never sealed (random or zero bytes).
        assert_eq!(s.open(&K, &vec![0u8; v.len()]), Err(SealError::Auth));
        assert_eq!(s.open(&K, &block(4)[..v.len() - 1000]), Err(SealError::Auth));
    }

    /// Random keys, contents and single changes: a property check over many cases with a
    /// fixed-seed generator (no dependency; the cases are reproducible).
    #[test]
    fn random_bindings_and_corruptions_never_open() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let s = seal_a();
        for _ in 0..300 {
            let k = BlockKey { file: (next() as u128) << 64 | next() as u128, block: next(), version: next() };
            let len = (next() % 4097) as usize;
            let p: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let v = s.seal(&k, &p);
            assert_eq!(s.open(&k, &v).unwrap(), p);
            let which = next() % 4;
            let k2 = match which {
                0 => BlockKey { file: k.file ^ (1u128 << (next() % 128)), ..k },
                1 => BlockKey { block: k.block ^ (1 << (next() % 64)), ..k },
                2 => BlockKey { version: k.version ^ (1 << (next() % 64)), ..k },
                _ => k,
            };
            let mut w = v.to_vec();
            if which == 3 {
                let bit = (next() as usize) % (w.len() * 8);
                w[bit / 8] ^= 1 << (bit % 8);
            }
            assert!(s.open(&k2, &w).is_err(), "case {which} opened");
        }
    }

    #[test]
    fn plaintext_is_the_identity_without_copies() {
        let p = Bytes::from(block(5));
        let v = Plaintext.seal_bytes(&K, p.clone());
        assert_eq!(v.as_ptr(), p.as_ptr());
        assert_eq!(Plaintext.open_bytes(&K, v).unwrap(), p);
        assert_eq!(Plaintext.sealed_len(4096), 4096);
        assert_eq!(Plaintext.open(&K, &p).unwrap(), p);
    }

    #[test]
    fn key_text_round_trips_and_bad_text_is_refused() {
        let k = BlockKeyBytes::generate();
        let line = k.to_hex_line();
        assert_eq!(line.len(), 65);
        assert_eq!(BlockKeyBytes::from_hex(&line).unwrap().0, k.0);
        assert_eq!(BlockKeyBytes::from_hex(&format!("  {}\n\n", line.trim().to_uppercase())).unwrap().0, k.0);
        assert_ne!(BlockKeyBytes::generate().0, k.0, "two fresh keys differ");
        assert!(!format!("{k:?}").contains(&line[..8]), "Debug shows no key bytes");
        for (text, why) in [
            ("", "empty"),
            ("\n\n", "empty"),
            (&line[..63], "characters long"),
            (&format!("{}0", line.trim()), "characters long"),
            (&format!("{}g", &line[..63]), "not a hex digit"),
            (&format!("{line}{line}"), "more than one line"),
        ] {
            let e = BlockKeyBytes::from_hex(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
