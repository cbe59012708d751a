//! Bodies of each frame type: views that borrow a frame, and encoders that append one.

use crate::{
    FrameWriter, Header, Key, Limits, Opcode, WireError, FLAG_FATAL, HELLO_MAGIC, KEY_BYTES, MAX_ERROR_MESSAGE_BYTES,
    MAX_PING_BYTES, MAX_SECRET_BYTES, MAX_TENANT_BYTES,
};

/// Bytes before the entries of every batched body: count u16, reserved u16.
pub const BATCH_PREFIX_BYTES: usize = 4;
/// Bytes of a HELLO_OK body.
pub const HELLO_OK_BYTES: usize = 24;

/// HELLO: the first frame of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    pub min_version: u16,
    pub max_version: u16,
    /// Tenant name: 1..=64 bytes of `[A-Za-z0-9._-]`.
    pub tenant: &'a str,
    /// Credential for the tenant; empty where the server runs without tenants configured.
    pub secret: &'a [u8],
}

/// HELLO_OK flag: this connection's STATS show every tenant, not only its own.
pub const HELLO_OK_FLAG_ADMIN: u16 = 0x0001;

/// HELLO_OK: the version chosen and the limits the server enforces on this connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloOk {
    pub version: u16,
    pub flags: u16,
    pub max_frame_bytes: u32,
    pub max_batch: u16,
    /// Requests the client may have in flight on this connection; the server stops reading a
    /// connection whose unsent responses pass this.
    pub max_inflight: u16,
    pub max_value_bytes: u32,
    /// Random per server start: a client that sees it change knows the server's memory is new
    /// and drops whatever it believed was stored there.
    pub instance_id: u64,
}

impl HelloOk {
    /// The limits a client decodes this server's responses with.
    pub fn limits(&self) -> Limits {
        Limits {
            max_frame_bytes: self.max_frame_bytes,
            max_batch: self.max_batch,
            max_value_bytes: self.max_value_bytes,
        }
    }
}

/// Result of one PUT entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PutStatus {
    Stored = 0,
    /// The value is larger than the server's slots.
    TooLarge = 1,
    /// The tenant's limit is zero or nothing could be evicted to make room.
    NoSpace = 2,
}

impl PutStatus {
    pub fn from_u8(b: u8) -> Option<PutStatus> {
        match b {
            0 => Some(PutStatus::Stored),
            1 => Some(PutStatus::TooLarge),
            2 => Some(PutStatus::NoSpace),
            _ => None,
        }
    }
}

/// Result of one DEL entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum DelStatus {
    Absent = 0,
    Removed = 1,
}

impl DelStatus {
    pub fn from_u8(b: u8) -> Option<DelStatus> {
        match b {
            0 => Some(DelStatus::Absent),
            1 => Some(DelStatus::Removed),
            _ => None,
        }
    }
}

/// Bytes of a VALUES frame answering `count` keys when every one hits with a value of
/// `max_value_bytes`: the most a GET of `count` keys can bring back.
pub const fn max_values_frame_bytes(count: usize, max_value_bytes: u32) -> usize {
    crate::HEADER_BYTES + BATCH_PREFIX_BYTES + count * (5 + max_value_bytes as usize)
}

/// Bytes one entry adds to a PUT frame.
pub const fn put_entry_bytes(value_len: usize) -> usize {
    KEY_BYTES + 4 + value_len
}

/// The largest batch whose fullest GET answer and whose PUT of full values each fit in a
/// frame of `max_frame_bytes`, capped at `max_batch`. Servers grant this; clients split by it.
pub fn fitting_batch(max_frame_bytes: u32, max_value_bytes: u32, max_batch: u16) -> u16 {
    let room = (max_frame_bytes as usize).saturating_sub(crate::HEADER_BYTES + BATCH_PREFIX_BYTES);
    let per_entry = put_entry_bytes(max_value_bytes as usize).max(5 + max_value_bytes as usize);
    (room / per_entry).clamp(1, max_batch.max(1) as usize) as u16
}

/// Codes carried by ERROR frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// The frame could not be decoded (the message says why).
    BadFrame,
    UnknownOpcode,
    /// No protocol version in common; the message names the server's range.
    UnsupportedVersion,
    /// Unknown tenant or wrong secret.
    AuthFailed,
    /// The frame exceeds the negotiated limit.
    TooLarge,
    /// Too many connections or tenants; try later.
    Busy,
    /// A request before HELLO, or a second HELLO.
    HandshakeRequired,
    /// The peer was idle, or too slow to send a whole frame.
    Timeout,
    Internal,
    ShuttingDown,
    /// A code this build does not know (from a newer peer).
    Other(u16),
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorCode::Other(c) => write!(f, "error code {c}"),
            known => std::fmt::Debug::fmt(known, f),
        }
    }
}

impl ErrorCode {
    pub fn to_u16(self) -> u16 {
        match self {
            ErrorCode::BadFrame => 1,
            ErrorCode::UnknownOpcode => 2,
            ErrorCode::UnsupportedVersion => 3,
            ErrorCode::AuthFailed => 4,
            ErrorCode::TooLarge => 5,
            ErrorCode::Busy => 6,
            ErrorCode::HandshakeRequired => 7,
            ErrorCode::Timeout => 8,
            ErrorCode::Internal => 9,
            ErrorCode::ShuttingDown => 10,
            ErrorCode::Other(c) => c,
        }
    }

    pub fn from_u16(c: u16) -> ErrorCode {
        match c {
            1 => ErrorCode::BadFrame,
            2 => ErrorCode::UnknownOpcode,
            3 => ErrorCode::UnsupportedVersion,
            4 => ErrorCode::AuthFailed,
            5 => ErrorCode::TooLarge,
            6 => ErrorCode::Busy,
            7 => ErrorCode::HandshakeRequired,
            8 => ErrorCode::Timeout,
            9 => ErrorCode::Internal,
            10 => ErrorCode::ShuttingDown,
            c => ErrorCode::Other(c),
        }
    }
}

/// ERROR: a request failed, or the connection is about to close (`fatal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorFrame<'a> {
    pub code: ErrorCode,
    pub fatal: bool,
    pub message: &'a str,
}

/// A batch of keys (GET, DEL), validated at decode time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyList<'a> {
    bytes: &'a [u8],
}

impl<'a> KeyList<'a> {
    pub fn len(&self) -> usize {
        self.bytes.len() / KEY_BYTES
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Key> + 'a {
        self.bytes.chunks_exact(KEY_BYTES).map(|c| Key::decode(c.try_into().unwrap()))
    }
}

/// A batch of (key, value) entries (PUT), validated at decode time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutList<'a> {
    count: usize,
    bytes: &'a [u8],
}

impl<'a> PutList<'a> {
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn iter(&self) -> PutIter<'a> {
        PutIter { rest: self.bytes, left: self.count }
    }
}

pub struct PutIter<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for PutIter<'a> {
    type Item = (Key, &'a [u8]);
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Lengths were checked when the list was decoded.
        let key = Key::decode(self.rest[..KEY_BYTES].try_into().unwrap());
        let len = u32::from_le_bytes(self.rest[KEY_BYTES..KEY_BYTES + 4].try_into().unwrap()) as usize;
        let value = &self.rest[KEY_BYTES + 4..KEY_BYTES + 4 + len];
        self.rest = &self.rest[KEY_BYTES + 4 + len..];
        Some((key, value))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for PutIter<'_> {}

/// The answers of a VALUES frame: for each requested key in order, the value or a miss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueList<'a> {
    count: usize,
    bytes: &'a [u8],
}

impl<'a> ValueList<'a> {
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn iter(&self) -> ValueIter<'a> {
        ValueIter { rest: self.bytes, left: self.count }
    }
}

pub struct ValueIter<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for ValueIter<'a> {
    type Item = Option<&'a [u8]>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        if self.rest[0] == 0 {
            self.rest = &self.rest[1..];
            return Some(None);
        }
        let len = u32::from_le_bytes(self.rest[1..5].try_into().unwrap()) as usize;
        let value = &self.rest[5..5 + len];
        self.rest = &self.rest[5 + len..];
        Some(Some(value))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for ValueIter<'_> {}

/// One status byte per entry (PUT_OK, DEL_OK).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusList<'a> {
    bytes: &'a [u8],
}

impl<'a> StatusList<'a> {
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    pub fn as_slice(&self) -> &'a [u8] {
        self.bytes
    }
}

/// A decoded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Hello(Hello<'a>),
    Get(KeyList<'a>),
    Put(PutList<'a>),
    Del(KeyList<'a>),
    Stats,
    Ping(&'a [u8]),
}

/// A decoded response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    HelloOk(HelloOk),
    Values(ValueList<'a>),
    PutOk(StatusList<'a>),
    DelOk(StatusList<'a>),
    /// UTF-8 JSON, see docs/PROTOCOL.md.
    StatsOk(&'a str),
    Pong(&'a [u8]),
    Error(ErrorFrame<'a>),
}

/// A little cursor that turns "ran off the end" into a [`WireError::Truncated`].
struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated(self.what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn end(self) -> Result<(), WireError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}

fn batch_count(r: &mut Reader<'_>, limits: &Limits) -> Result<usize, WireError> {
    let count = r.u16()? as usize;
    if r.u16()? != 0 {
        return Err(WireError::Reserved);
    }
    if count == 0 {
        return Err(WireError::BadField { field: "count", why: "a batch needs at least one entry" });
    }
    if count > limits.max_batch as usize {
        return Err(WireError::BatchTooLarge { count, max: limits.max_batch });
    }
    Ok(count)
}

fn decode_keys<'a>(body: &'a [u8], limits: &Limits) -> Result<KeyList<'a>, WireError> {
    let mut r = Reader { buf: body, what: "key batch" };
    let count = batch_count(&mut r, limits)?;
    let bytes = r.take(count * KEY_BYTES)?;
    r.end()?;
    Ok(KeyList { bytes })
}

fn decode_puts<'a>(body: &'a [u8], limits: &Limits) -> Result<PutList<'a>, WireError> {
    let mut r = Reader { buf: body, what: "PUT batch" };
    let count = batch_count(&mut r, limits)?;
    let start = r.buf;
    for _ in 0..count {
        r.take(KEY_BYTES)?;
        let len = r.u32()?;
        if len > limits.max_value_bytes {
            return Err(WireError::ValueTooLarge { len, max: limits.max_value_bytes });
        }
        r.take(len as usize)?;
    }
    let used = start.len() - r.buf.len();
    r.end()?;
    Ok(PutList { count, bytes: &start[..used] })
}

fn decode_values<'a>(body: &'a [u8], limits: &Limits) -> Result<ValueList<'a>, WireError> {
    let mut r = Reader { buf: body, what: "VALUES batch" };
    let count = batch_count(&mut r, limits)?;
    let start = r.buf;
    for _ in 0..count {
        match r.u8()? {
            0 => {}
            1 => {
                let len = r.u32()?;
                if len > limits.max_value_bytes {
                    return Err(WireError::ValueTooLarge { len, max: limits.max_value_bytes });
                }
                r.take(len as usize)?;
            }
            _ => return Err(WireError::BadField { field: "value status", why: "must be 0 (miss) or 1 (hit)" }),
        }
    }
    let used = start.len() - r.buf.len();
    r.end()?;
    Ok(ValueList { count, bytes: &start[..used] })
}

fn decode_statuses<'a>(body: &'a [u8], limits: &Limits, max_status: u8) -> Result<StatusList<'a>, WireError> {
    let mut r = Reader { buf: body, what: "status batch" };
    let count = batch_count(&mut r, limits)?;
    let bytes = r.take(count)?;
    r.end()?;
    if bytes.iter().any(|&b| b > max_status) {
        return Err(WireError::BadField { field: "status", why: "unknown status code" });
    }
    Ok(StatusList { bytes })
}

fn valid_tenant(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TENANT_BYTES
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Is `name` acceptable as a tenant name (1..=64 bytes of `[A-Za-z0-9._-]`)?
pub fn is_valid_tenant_name(name: &str) -> bool {
    valid_tenant(name)
}

fn decode_hello(body: &[u8]) -> Result<Hello<'_>, WireError> {
    let mut r = Reader { buf: body, what: "HELLO" };
    let magic: [u8; 4] = r.take(4)?.try_into().unwrap();
    if magic != HELLO_MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let min_version = r.u16()?;
    let max_version = r.u16()?;
    if min_version > max_version {
        return Err(WireError::BadField { field: "versions", why: "min_version > max_version" });
    }
    let tlen = r.u8()? as usize;
    let tenant = std::str::from_utf8(r.take(tlen)?)
        .ok()
        .filter(|t| valid_tenant(t))
        .ok_or(WireError::BadField { field: "tenant", why: "must be 1..=64 bytes of [A-Za-z0-9._-]" })?;
    let slen = r.u8()? as usize;
    if slen > MAX_SECRET_BYTES {
        return Err(WireError::BadField { field: "secret", why: "longer than 128 bytes" });
    }
    let secret = r.take(slen)?;
    r.end()?;
    Ok(Hello { min_version, max_version, tenant, secret })
}

/// Decode a request body. `header` must come from [`Header::decode`] on the same frame.
pub fn decode_request<'a>(header: &Header, body: &'a [u8], limits: &Limits) -> Result<Request<'a>, WireError> {
    debug_assert_eq!(body.len(), header.body_len as usize);
    let op = Opcode::from_u8(header.opcode)?;
    if header.flags != 0 {
        return Err(WireError::BadField { field: "flags", why: "requests carry no flags" });
    }
    Ok(match op {
        Opcode::Hello => Request::Hello(decode_hello(body)?),
        Opcode::Get => Request::Get(decode_keys(body, limits)?),
        Opcode::Put => Request::Put(decode_puts(body, limits)?),
        Opcode::Del => Request::Del(decode_keys(body, limits)?),
        Opcode::Stats => {
            Reader { buf: body, what: "STATS" }.end()?;
            Request::Stats
        }
        Opcode::Ping => {
            if body.len() > MAX_PING_BYTES {
                return Err(WireError::BadField { field: "ping payload", why: "longer than 256 bytes" });
            }
            Request::Ping(body)
        }
        _ => return Err(WireError::UnknownOpcode(header.opcode)),
    })
}

/// Decode a response body. `header` must come from [`Header::decode`] on the same frame.
pub fn decode_response<'a>(header: &Header, body: &'a [u8], limits: &Limits) -> Result<Response<'a>, WireError> {
    debug_assert_eq!(body.len(), header.body_len as usize);
    let op = Opcode::from_u8(header.opcode)?;
    let allowed_flags = if op == Opcode::Error { FLAG_FATAL } else { 0 };
    if header.flags & !allowed_flags != 0 {
        return Err(WireError::BadField { field: "flags", why: "unknown flag bits" });
    }
    Ok(match op {
        Opcode::HelloOk => {
            let mut r = Reader { buf: body, what: "HELLO_OK" };
            let ok = HelloOk {
                version: r.u16()?,
                flags: r.u16()?,
                max_frame_bytes: r.u32()?,
                max_batch: r.u16()?,
                max_inflight: r.u16()?,
                max_value_bytes: r.u32()?,
                instance_id: r.u64()?,
            };
            r.end()?;
            Response::HelloOk(ok)
        }
        Opcode::Values => Response::Values(decode_values(body, limits)?),
        Opcode::PutOk => Response::PutOk(decode_statuses(body, limits, PutStatus::NoSpace as u8)?),
        Opcode::DelOk => Response::DelOk(decode_statuses(body, limits, DelStatus::Removed as u8)?),
        Opcode::StatsOk => Response::StatsOk(
            std::str::from_utf8(body).map_err(|_| WireError::BadField { field: "stats", why: "not UTF-8" })?,
        ),
        Opcode::Pong => {
            if body.len() > MAX_PING_BYTES {
                return Err(WireError::BadField { field: "pong payload", why: "longer than 256 bytes" });
            }
            Response::Pong(body)
        }
        Opcode::Error => {
            let mut r = Reader { buf: body, what: "ERROR" };
            let code = ErrorCode::from_u16(r.u16()?);
            let len = r.u16()? as usize;
            if len > MAX_ERROR_MESSAGE_BYTES {
                return Err(WireError::BadField { field: "error message", why: "longer than 1024 bytes" });
            }
            let message = std::str::from_utf8(r.take(len)?)
                .map_err(|_| WireError::BadField { field: "error message", why: "not UTF-8" })?;
            r.end()?;
            Response::Error(ErrorFrame { code, fatal: header.flags & FLAG_FATAL != 0, message })
        }
        _ => return Err(WireError::UnknownOpcode(header.opcode)),
    })
}

// ---------------------------------------------------------------------------------------
// Encoders. Each appends one whole frame to `out`. They assert what the caller controls
// (batch sizes, field lengths): a violation is a bug in the caller, not bad input.

pub fn encode_hello(out: &mut Vec<u8>, request_id: u64, hello: &Hello<'_>) {
    assert!(valid_tenant(hello.tenant), "invalid tenant name");
    assert!(hello.secret.len() <= MAX_SECRET_BYTES);
    let w = FrameWriter::begin(out, Opcode::Hello, 0, request_id);
    out.extend_from_slice(&HELLO_MAGIC);
    out.extend_from_slice(&hello.min_version.to_le_bytes());
    out.extend_from_slice(&hello.max_version.to_le_bytes());
    out.push(hello.tenant.len() as u8);
    out.extend_from_slice(hello.tenant.as_bytes());
    out.push(hello.secret.len() as u8);
    out.extend_from_slice(hello.secret);
    w.finish(out);
}

pub fn encode_hello_ok(out: &mut Vec<u8>, request_id: u64, ok: &HelloOk) {
    let w = FrameWriter::begin(out, Opcode::HelloOk, 0, request_id);
    out.extend_from_slice(&ok.version.to_le_bytes());
    out.extend_from_slice(&ok.flags.to_le_bytes());
    out.extend_from_slice(&ok.max_frame_bytes.to_le_bytes());
    out.extend_from_slice(&ok.max_batch.to_le_bytes());
    out.extend_from_slice(&ok.max_inflight.to_le_bytes());
    out.extend_from_slice(&ok.max_value_bytes.to_le_bytes());
    out.extend_from_slice(&ok.instance_id.to_le_bytes());
    w.finish(out);
}

fn put_count(out: &mut Vec<u8>, count: usize) {
    assert!((1..=u16::MAX as usize).contains(&count), "batch of {count} entries");
    out.extend_from_slice(&(count as u16).to_le_bytes());
    out.extend_from_slice(&[0, 0]);
}

/// GET or DEL of a batch of keys.
pub fn encode_keys(out: &mut Vec<u8>, opcode: Opcode, request_id: u64, keys: &[Key]) {
    assert!(matches!(opcode, Opcode::Get | Opcode::Del));
    let w = FrameWriter::begin(out, opcode, 0, request_id);
    put_count(out, keys.len());
    for k in keys {
        out.extend_from_slice(&k.to_bytes());
    }
    w.finish(out);
}

/// PUT of a batch of (key, value) entries.
pub fn encode_put(out: &mut Vec<u8>, request_id: u64, entries: &[(Key, &[u8])]) {
    let w = FrameWriter::begin(out, Opcode::Put, 0, request_id);
    put_count(out, entries.len());
    for (k, v) in entries {
        let len = u32::try_from(v.len()).expect("value of 4 GiB or more");
        out.extend_from_slice(&k.to_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(v);
    }
    w.finish(out);
}

/// Builds a VALUES frame entry by entry, so a server can copy each value straight from its
/// store into the output buffer.
#[must_use = "call finish()"]
pub struct ValuesWriter {
    frame: FrameWriter,
}

impl ValuesWriter {
    pub fn begin(out: &mut Vec<u8>, request_id: u64, count: usize) -> ValuesWriter {
        let frame = FrameWriter::begin(out, Opcode::Values, 0, request_id);
        put_count(out, count);
        ValuesWriter { frame }
    }
    pub fn miss(&mut self, out: &mut Vec<u8>) {
        out.push(0);
    }
    pub fn hit(&mut self, out: &mut Vec<u8>, value: &[u8]) {
        out.push(1);
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    pub fn finish(self, out: &mut [u8]) {
        self.frame.finish(out)
    }
}

/// PUT_OK or DEL_OK: one status byte per entry.
pub fn encode_statuses(out: &mut Vec<u8>, opcode: Opcode, request_id: u64, statuses: &[u8]) {
    assert!(matches!(opcode, Opcode::PutOk | Opcode::DelOk));
    let w = FrameWriter::begin(out, opcode, 0, request_id);
    put_count(out, statuses.len());
    out.extend_from_slice(statuses);
    w.finish(out);
}

/// A frame with a raw body: STATS (empty), STATS_OK (JSON), PING and PONG (payload).
pub fn encode_raw(out: &mut Vec<u8>, opcode: Opcode, request_id: u64, body: &[u8]) {
    assert!(matches!(opcode, Opcode::Stats | Opcode::StatsOk | Opcode::Ping | Opcode::Pong));
    assert!(
        !matches!(opcode, Opcode::Ping | Opcode::Pong) || body.len() <= MAX_PING_BYTES,
        "PING payload over 256 bytes"
    );
    let w = FrameWriter::begin(out, opcode, 0, request_id);
    out.extend_from_slice(body);
    w.finish(out);
}

/// ERROR. Messages longer than the limit are cut at a character boundary.
pub fn encode_error(out: &mut Vec<u8>, request_id: u64, code: ErrorCode, fatal: bool, message: &str) {
    let mut end = message.len().min(MAX_ERROR_MESSAGE_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let w = FrameWriter::begin(out, Opcode::Error, if fatal { FLAG_FATAL } else { 0 }, request_id);
    out.extend_from_slice(&code.to_u16().to_le_bytes());
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&message.as_bytes()[..end]);
    w.finish(out);
}
