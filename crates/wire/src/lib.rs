//! The farcache wire protocol: frames, encoding and decoding, protocol versions.
//!
//! No I/O lives here (memcached keeps `proto_*.c` apart from storage in the same way): the
//! server and the client feed bytes in and take bytes out. docs/PROTOCOL.md describes the
//! format byte by byte; the fixtures in `tests` pin it.
//!
//! Decoding is zero-copy: request and response views borrow the frame buffer, and batched
//! bodies are walked lazily by iterators that were validated once, up front, so a malformed
//! frame is rejected before any of it is acted on.

mod codec;
mod frame;
mod key;

pub use codec::*;
pub use frame::*;
pub use key::*;

/// The protocol versions this build speaks (inclusive). A new version is needed for any
/// change a peer of the old version would misread; see docs/PROTOCOL.md "Versioning".
pub const PROTOCOL_VERSION_MIN: u16 = 1;
pub const PROTOCOL_VERSION_MAX: u16 = 1;

/// First four bytes of every HELLO body.
pub const HELLO_MAGIC: [u8; 4] = *b"FARC";

/// Bytes in a frame header, including the 4-byte length prefix.
pub const HEADER_BYTES: usize = 16;

/// The largest frame (header included) any peer may ever announce or accept. Negotiated
/// limits are at most this.
pub const MAX_FRAME_BYTES_CEILING: u32 = 16 << 20;
/// The frame limit peers assume before HELLO_OK has told them otherwise. A HELLO is tiny.
pub const HANDSHAKE_MAX_FRAME_BYTES: u32 = 4096;

/// Limits of the variable-length fields of HELLO.
pub const MAX_TENANT_BYTES: usize = 64;
pub const MAX_SECRET_BYTES: usize = 128;
/// Largest PING payload.
pub const MAX_PING_BYTES: usize = 256;
/// Largest ERROR message.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;

const _: () = assert!(HANDSHAKE_MAX_FRAME_BYTES as usize >= HEADER_BYTES + 10 + MAX_TENANT_BYTES + MAX_SECRET_BYTES);
const _: () = assert!(MAX_FRAME_BYTES_CEILING as usize >= HEADER_BYTES + 4 + u16::MAX as usize);

/// Errors found while decoding bytes from a peer. Each one names what was wrong, so the
/// ERROR frame and the log line can say it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u64, max: u32 },
    #[error("frame length {0} is shorter than a header")]
    TooShort(u32),
    #[error("unknown opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    #[error("bad HELLO magic {0:02x?}: not a farcache client")]
    BadMagic([u8; 4]),
    #[error("reserved header field is not zero")]
    Reserved,
    #[error("truncated body: {0}")]
    Truncated(&'static str),
    #[error("{0} trailing bytes after the body")]
    Trailing(usize),
    #[error("invalid field {field}: {why}")]
    BadField { field: &'static str, why: &'static str },
    #[error("batch of {count} entries exceeds the limit of {max}")]
    BatchTooLarge { count: usize, max: u16 },
    #[error("value of {len} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge { len: u32, max: u32 },
}

/// Limits a decoder enforces. The server fills it from its configuration; a client from the
/// server's HELLO_OK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest whole frame, header included.
    pub max_frame_bytes: u32,
    /// Most keys in one batched request.
    pub max_batch: u16,
    /// Largest value in PUT or VALUES.
    pub max_value_bytes: u32,
}

impl Limits {
    /// The limits in force before the handshake completes.
    pub const HANDSHAKE: Limits =
        Limits { max_frame_bytes: HANDSHAKE_MAX_FRAME_BYTES, max_batch: 0, max_value_bytes: 0 };
}
