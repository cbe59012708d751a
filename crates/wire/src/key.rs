//! The key of a cached block.

/// Bytes of an encoded [`Key`].
pub const KEY_BYTES: usize = 32;

/// Names one cached block *within a tenant*. The tenant is never part of the key on the wire:
/// the server takes it from the authenticated connection, so a client cannot name another
/// tenant's blocks at all.
///
/// * `file`: an opaque 128-bit file identity chosen by the client (farcache's mount derives
///   it from the backing file's device, inode and generation). The server never interprets it.
/// * `block`: the block number within the file.
/// * `epoch`: a version the client bumps whenever the block's contents may have changed
///   without an invalidation reaching the server; a lookup with a new epoch can never hit a
///   copy stored under an old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Key {
    pub file: u128,
    pub block: u64,
    pub epoch: u64,
}

impl Key {
    pub const fn new(file: u128, block: u64, epoch: u64) -> Self {
        Key { file, block, epoch }
    }

    /// Little-endian: file (16 bytes), block (8), epoch (8).
    #[inline]
    pub fn encode(&self, out: &mut [u8; KEY_BYTES]) {
        out[0..16].copy_from_slice(&self.file.to_le_bytes());
        out[16..24].copy_from_slice(&self.block.to_le_bytes());
        out[24..32].copy_from_slice(&self.epoch.to_le_bytes());
    }

    #[inline]
    pub fn to_bytes(&self) -> [u8; KEY_BYTES] {
        let mut b = [0u8; KEY_BYTES];
        self.encode(&mut b);
        b
    }

    #[inline]
    pub fn decode(b: &[u8; KEY_BYTES]) -> Self {
        Key {
            file: u128::from_le_bytes(b[0..16].try_into().unwrap()),
            block: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            epoch: u64::from_le_bytes(b[24..32].try_into().unwrap()),
        }
    }
}
