//! Arbitrary bytes through the wire decoder, as a server or client reads them: split frames off
//! a stream, decode each as a request and as a response, walk every batch.
//!
//! Checked, beyond "no panic": every slice a decoder returns lies inside the frame it came
//! from and within the limits it was given, split_frame agrees with check_len_prefix, and
//! whatever decodes re-encodes to exactly the same bytes (the decoder accepts only the one
//! canonical form of each frame, so it cannot silently ignore a byte or a flag bit).
//!
//! Input layout: byte 0 chooses the limits (see `limits`); the rest is the stream.

#![no_main]

use farcache_wire::*;
use libfuzzer_sys::fuzz_target;

/// Most frames taken from one input: the loop's bound (each frame is at least 16 bytes, so
/// this is never reached by inputs under 64 KiB; it is here so the bound is written down).
const MAX_FRAMES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let (limits, stream) = limits(sel, rest);
    let mut stream = stream;
    for _ in 0..MAX_FRAMES {
        let split = split_frame(stream, limits.max_frame_bytes);
        let prefix = check_len_prefix(stream, limits.max_frame_bytes);
        match split {
            Err(e) => {
                // Only the header can be refused; it is refused as soon as its bytes are in.
                assert!(stream.len() >= 4, "error {e} on {} bytes", stream.len());
                return;
            }
            Ok(None) => {
                if let Ok(Some(total)) = prefix {
                    assert!(
                        stream.len() < total,
                        "a whole frame of {total} bytes was not split off"
                    );
                }
                return;
            }
            Ok(Some((h, n))) => {
                assert_eq!(
                    prefix.unwrap(),
                    Some(n),
                    "split_frame and check_len_prefix disagree"
                );
                assert_eq!(n, h.frame_bytes());
                assert!(
                    n >= HEADER_BYTES
                        && n <= stream.len()
                        && n as u64 <= limits.max_frame_bytes as u64
                );
                let frame = &stream[..n];
                let body = &frame[HEADER_BYTES..];
                check_request(&h, frame, body, &limits);
                check_response(&h, frame, body, &limits);
                stream = &stream[n..];
            }
        }
    }
});

/// The limits this input is decoded with: the handshake's, a server's defaults, the
/// protocol's ceilings, or any (taken from the next 10 bytes).
fn limits(sel: u8, rest: &[u8]) -> (Limits, &[u8]) {
    match sel % 4 {
        0 => (Limits::HANDSHAKE, rest),
        1 => (
            Limits {
                max_frame_bytes: 1 << 20,
                max_batch: 253,
                max_value_bytes: 4096,
            },
            rest,
        ),
        2 => (
            Limits {
                max_frame_bytes: MAX_FRAME_BYTES_CEILING,
                max_batch: u16::MAX,
                max_value_bytes: u32::MAX,
            },
            rest,
        ),
        _ if rest.len() >= 10 => {
            let l = Limits {
                max_frame_bytes: u32::from_le_bytes(rest[0..4].try_into().unwrap()),
                max_batch: u16::from_le_bytes(rest[4..6].try_into().unwrap()),
                max_value_bytes: u32::from_le_bytes(rest[6..10].try_into().unwrap()),
            };
            (l, &rest[10..])
        }
        _ => (Limits::HANDSHAKE, rest),
    }
}

/// `part` is a sub-slice of `whole` (same memory, not a copy).
fn inside(part: &[u8], whole: &[u8]) -> bool {
    let (p, w) = (part.as_ptr() as usize, whole.as_ptr() as usize);
    p >= w && p + part.len() <= w + whole.len()
}

fn check_request(h: &Header, frame: &[u8], body: &[u8], limits: &Limits) {
    let Ok(req) = decode_request(h, body, limits) else {
        return;
    };
    assert_eq!(h.flags, 0, "a request with flags decoded");
    let mut out = Vec::with_capacity(frame.len());
    match req {
        Request::Hello(hello) => {
            assert!(inside(hello.tenant.as_bytes(), body) && inside(hello.secret, body));
            assert!(is_valid_tenant_name(hello.tenant));
            assert!(hello.secret.len() <= MAX_SECRET_BYTES);
            assert!(hello.min_version <= hello.max_version);
            encode_hello(&mut out, h.request_id, &hello);
        }
        Request::Get(keys) | Request::Del(keys) => {
            assert!(!keys.is_empty() && keys.len() <= limits.max_batch as usize);
            let all: Vec<Key> = keys.iter().collect();
            assert_eq!(all.len(), keys.len());
            let op = if h.opcode == Opcode::Get as u8 {
                Opcode::Get
            } else {
                Opcode::Del
            };
            encode_keys(&mut out, op, h.request_id, &all);
        }
        Request::Put(entries) => {
            assert!(!entries.is_empty() && entries.len() <= limits.max_batch as usize);
            let all: Vec<(Key, &[u8])> = entries.iter().collect();
            assert_eq!(all.len(), entries.len());
            for (_, v) in &all {
                assert!(inside(v, body) && v.len() as u64 <= limits.max_value_bytes as u64);
            }
            encode_put(&mut out, h.request_id, &all);
        }
        Request::Stats => {
            assert!(body.is_empty());
            encode_raw(&mut out, Opcode::Stats, h.request_id, b"");
        }
        Request::Ping(payload) => {
            assert!(inside(payload, body) && payload.len() <= MAX_PING_BYTES);
            encode_raw(&mut out, Opcode::Ping, h.request_id, payload);
        }
    }
    assert_eq!(out, frame, "request {:?} re-encodes differently", h.opcode);
}

fn check_response(h: &Header, frame: &[u8], body: &[u8], limits: &Limits) {
    let Ok(resp) = decode_response(h, body, limits) else {
        return;
    };
    let mut out = Vec::with_capacity(frame.len());
    // Responses carry no flags but ERROR's FATAL; the decoder refuses any other bit.
    let allowed = if matches!(resp, Response::Error(_)) {
        FLAG_FATAL
    } else {
        0
    };
    assert_eq!(
        h.flags & !allowed,
        0,
        "response 0x{:02x} with unknown flags decoded",
        h.opcode
    );
    match resp {
        Response::HelloOk(ok) => encode_hello_ok(&mut out, h.request_id, &ok),
        Response::Values(values) => {
            assert!(!values.is_empty() && values.len() <= limits.max_batch as usize);
            let all: Vec<Option<&[u8]>> = values.iter().collect();
            assert_eq!(all.len(), values.len());
            let mut w = ValuesWriter::begin(&mut out, h.request_id, all.len());
            for v in &all {
                match v {
                    Some(v) => {
                        assert!(inside(v, body) && v.len() as u64 <= limits.max_value_bytes as u64);
                        w.hit(&mut out, v);
                    }
                    None => w.miss(&mut out),
                }
            }
            w.finish(&mut out);
        }
        Response::PutOk(s) | Response::DelOk(s) => {
            assert!(
                inside(s.as_slice(), body) && !s.is_empty() && s.len() <= limits.max_batch as usize
            );
            let max = if h.opcode == Opcode::PutOk as u8 {
                PutStatus::NoSpace as u8
            } else {
                DelStatus::Removed as u8
            };
            assert!(s.as_slice().iter().all(|&b| b <= max));
            let op = if h.opcode == Opcode::PutOk as u8 {
                Opcode::PutOk
            } else {
                Opcode::DelOk
            };
            encode_statuses(&mut out, op, h.request_id, s.as_slice());
        }
        Response::StatsOk(json) => {
            assert!(inside(json.as_bytes(), body));
            encode_raw(&mut out, Opcode::StatsOk, h.request_id, json.as_bytes());
        }
        Response::Pong(payload) => {
            assert!(inside(payload, body));
            // PONG echoes a PING payload, which is at most MAX_PING_BYTES (docs/PROTOCOL.md).
            assert!(
                payload.len() <= MAX_PING_BYTES,
                "PONG with a {}-byte payload decoded",
                payload.len()
            );
            encode_raw(&mut out, Opcode::Pong, h.request_id, payload);
        }
        Response::Error(e) => {
            assert!(
                inside(e.message.as_bytes(), body) && e.message.len() <= MAX_ERROR_MESSAGE_BYTES
            );
            assert_eq!(e.fatal, h.flags & FLAG_FATAL != 0);
            encode_error(&mut out, h.request_id, e.code, e.fatal, e.message);
        }
    }
    assert_eq!(
        out, frame,
        "response 0x{:02x} re-encodes differently",
        h.opcode
    );
}
