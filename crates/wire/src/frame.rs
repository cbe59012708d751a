//! Frame header, opcodes and framing of a byte stream.
//!
//! ```text
//! offset size field
//!   0     4   len         bytes after this field (so a whole frame is len + 4 bytes)
//!   4     1   opcode
//!   5     1   flags       requests: 0; ERROR: bit 0 = the sender closes the connection
//!   6     2   reserved    0
//!   8     8   request_id  chosen by the client, echoed in the response
//!  16     -   body        opcode-specific
//! ```
//! All integers are little-endian.

use crate::{WireError, HEADER_BYTES};

/// Frame opcodes. Responses are the request's opcode with the high bit set; ERROR is 0xFF.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Hello = 0x01,
    Get = 0x02,
    Put = 0x03,
    Del = 0x04,
    Stats = 0x05,
    Ping = 0x06,
    HelloOk = 0x81,
    Values = 0x82,
    PutOk = 0x83,
    DelOk = 0x84,
    StatsOk = 0x85,
    Pong = 0x86,
    Error = 0xFF,
}

impl Opcode {
    pub fn from_u8(b: u8) -> Result<Opcode, WireError> {
        Ok(match b {
            0x01 => Opcode::Hello,
            0x02 => Opcode::Get,
            0x03 => Opcode::Put,
            0x04 => Opcode::Del,
            0x05 => Opcode::Stats,
            0x06 => Opcode::Ping,
            0x81 => Opcode::HelloOk,
            0x82 => Opcode::Values,
            0x83 => Opcode::PutOk,
            0x84 => Opcode::DelOk,
            0x85 => Opcode::StatsOk,
            0x86 => Opcode::Pong,
            0xFF => Opcode::Error,
            other => return Err(WireError::UnknownOpcode(other)),
        })
    }

    pub fn is_request(self) -> bool {
        (self as u8) & 0x80 == 0
    }
}

/// ERROR flag: the sender closes the connection after this frame.
pub const FLAG_FATAL: u8 = 0x01;

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The raw opcode byte; [`Opcode::from_u8`] names it. Kept raw so that an unknown opcode
    /// still has a request id to answer with an ERROR.
    pub opcode: u8,
    pub flags: u8,
    pub request_id: u64,
    /// Bytes in the body (frame length minus the header).
    pub body_len: u32,
}

impl Header {
    /// Decode the first [`HEADER_BYTES`] of `buf`, checking the length against `max_frame_bytes`.
    /// Returns `Ok(None)` if fewer than 16 bytes are available; the length check is done as
    /// soon as the first 4 bytes are in, so an oversized frame is refused before its body is
    /// read (see [`check_len_prefix`]).
    pub fn decode(buf: &[u8], max_frame_bytes: u32) -> Result<Option<Header>, WireError> {
        if let Some(err) = check_len_prefix(buf, max_frame_bytes).err() {
            return Err(err);
        }
        if buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let len = u32::from_le_bytes(buf[0..4].try_into().unwrap());
        let reserved = u16::from_le_bytes(buf[6..8].try_into().unwrap());
        if reserved != 0 {
            return Err(WireError::Reserved);
        }
        Ok(Some(Header {
            opcode: buf[4],
            flags: buf[5],
            request_id: u64::from_le_bytes(buf[8..16].try_into().unwrap()),
            body_len: len - (HEADER_BYTES as u32 - 4),
        }))
    }

    /// Total bytes of the frame this header starts.
    pub fn frame_bytes(&self) -> usize {
        HEADER_BYTES + self.body_len as usize
    }
}

/// Validate the length prefix at the start of `buf` as soon as its 4 bytes are present.
/// Returns the whole frame's size once known.
pub fn check_len_prefix(buf: &[u8], max_frame_bytes: u32) -> Result<Option<usize>, WireError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().unwrap());
    if len < (HEADER_BYTES as u32 - 4) {
        return Err(WireError::TooShort(len));
    }
    let total = len as u64 + 4;
    if total > max_frame_bytes as u64 {
        return Err(WireError::TooLarge { len: total, max: max_frame_bytes });
    }
    Ok(Some(total as usize))
}

/// If `buf` starts with a whole frame, return its header and the frame's length.
pub fn split_frame(buf: &[u8], max_frame_bytes: u32) -> Result<Option<(Header, usize)>, WireError> {
    match Header::decode(buf, max_frame_bytes)? {
        Some(h) if buf.len() >= h.frame_bytes() => Ok(Some((h, h.frame_bytes()))),
        _ => Ok(None),
    }
}

/// Appends one frame to a buffer: `begin` writes a header with a placeholder length,
/// `finish` patches the length in. Between them the caller appends the body.
#[must_use = "call finish() to patch the frame length"]
pub struct FrameWriter {
    start: usize,
}

impl FrameWriter {
    pub fn begin(out: &mut Vec<u8>, opcode: Opcode, flags: u8, request_id: u64) -> FrameWriter {
        let start = out.len();
        out.extend_from_slice(&[0, 0, 0, 0, opcode as u8, flags, 0, 0]);
        out.extend_from_slice(&request_id.to_le_bytes());
        FrameWriter { start }
    }

    /// Bytes of the frame so far, header included.
    pub fn len(&self, out: &[u8]) -> usize {
        out.len() - self.start
    }

    pub fn finish(self, out: &mut [u8]) {
        let len = (out.len() - self.start - 4) as u32;
        out[self.start..self.start + 4].copy_from_slice(&len.to_le_bytes());
    }
}
