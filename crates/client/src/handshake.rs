//! HELLO / HELLO_OK: version negotiation, authentication, and the limits of the connection.

use std::io;

use farcache_wire::{
    decode_response, encode_hello, Hello, HelloOk, Limits, Response, BATCH_PREFIX_BYTES, HANDSHAKE_MAX_FRAME_BYTES,
    HEADER_BYTES, HELLO_OK_FLAG_ADMIN, KEY_BYTES, MAX_FRAME_BYTES_CEILING, PROTOCOL_VERSION_MAX, PROTOCOL_VERSION_MIN,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::conn::FrameReader;
use crate::{ClientConfig, ClientError};

/// The request id of HELLO. Requests after it count up from [`FIRST_REQUEST_ID`]; id 0 is
/// never used, so that an ERROR for id 0 can only be about the connection.
pub(crate) const HELLO_REQUEST_ID: u64 = 1;
pub(crate) const FIRST_REQUEST_ID: u64 = 2;

/// Bytes of the smallest PUT frame that carries one value of `max_value_bytes`.
pub(crate) fn one_put_frame_bytes(max_value_bytes: u32) -> u64 {
    (HEADER_BYTES + BATCH_PREFIX_BYTES + KEY_BYTES + 4) as u64 + max_value_bytes as u64
}

/// Send HELLO and wait for HELLO_OK. Returns the server's answer and whatever bytes arrived
/// after it. The caller bounds this with the connect timeout.
pub(crate) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    cfg: &ClientConfig,
) -> Result<(HelloOk, FrameReader), ClientError> {
    let mut out = Vec::with_capacity(64);
    let hello = Hello {
        min_version: PROTOCOL_VERSION_MIN,
        max_version: PROTOCOL_VERSION_MAX,
        tenant: &cfg.tenant,
        secret: &cfg.secret,
    };
    encode_hello(&mut out, HELLO_REQUEST_ID, &hello);
    stream.write_all(&out).await.map_err(ClientError::Connect)?;
    stream.flush().await.map_err(ClientError::Connect)?;

    let mut frames_in = FrameReader::new(HANDSHAKE_MAX_FRAME_BYTES);
    let (header, frame) = match frames_in.next(stream).await {
        Ok(Some(f)) => f,
        Ok(None) => {
            return Err(ClientError::Connect(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed the connection during the handshake",
            )))
        }
        Err(ClientError::Io(e)) => return Err(ClientError::Connect(e)),
        Err(e) => return Err(e),
    };
    let body = &frame[HEADER_BYTES..];
    let resp = decode_response(&header, body, &Limits::HANDSHAKE)
        .map_err(|e| ClientError::Protocol(format!("answer to HELLO: {e}")))?;
    let ok = match resp {
        // The server may answer a refused HELLO with id 0 (for instance Busy right after
        // accept, before it read anything) or with HELLO's id.
        Response::Error(err) if header.request_id == 0 || header.request_id == HELLO_REQUEST_ID => {
            return Err(ClientError::from_server(err.code, err.message));
        }
        Response::HelloOk(ok) if header.request_id == HELLO_REQUEST_ID && header.flags == 0 => ok,
        _ => {
            return Err(ClientError::Protocol(format!(
                "answer to HELLO is opcode 0x{:02x} flags 0x{:02x} for request {}",
                header.opcode, header.flags, header.request_id
            )))
        }
    };
    check_hello_ok(&ok)?;
    Ok((ok, frames_in))
}

/// Refuse limits this client cannot work with, rather than fail on the first request.
pub(crate) fn check_hello_ok(ok: &HelloOk) -> Result<(), ClientError> {
    let bad = |why: String| Err(ClientError::Protocol(format!("HELLO_OK: {why}")));
    if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION_MAX).contains(&ok.version) {
        return bad(format!(
            "version {} is outside the offered range {PROTOCOL_VERSION_MIN}..={PROTOCOL_VERSION_MAX}",
            ok.version
        ));
    }
    if ok.flags & !HELLO_OK_FLAG_ADMIN != 0 {
        return bad(format!("unknown flags 0x{:04x}", ok.flags));
    }
    if ok.max_frame_bytes > MAX_FRAME_BYTES_CEILING {
        return bad(format!("max_frame_bytes {} exceeds the ceiling {MAX_FRAME_BYTES_CEILING}", ok.max_frame_bytes));
    }
    if ok.max_batch == 0 || ok.max_inflight == 0 {
        return bad("max_batch and max_inflight must be at least 1".into());
    }
    if (ok.max_frame_bytes as u64) < one_put_frame_bytes(ok.max_value_bytes) {
        return bad(format!(
            "max_frame_bytes {} cannot hold a PUT of one {}-byte value",
            ok.max_frame_bytes, ok.max_value_bytes
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> HelloOk {
        HelloOk {
            version: 1,
            flags: 0,
            max_frame_bytes: 1 << 20,
            max_batch: 256,
            max_inflight: 128,
            max_value_bytes: 4096,
            instance_id: 9,
        }
    }

    #[test]
    fn sane_limits_pass() {
        check_hello_ok(&ok()).unwrap();
        check_hello_ok(&HelloOk { flags: HELLO_OK_FLAG_ADMIN, ..ok() }).unwrap();
        // The smallest frame that holds one PUT of the largest value.
        check_hello_ok(&HelloOk { max_frame_bytes: 56 + 4096, ..ok() }).unwrap();
    }

    #[test]
    fn unusable_limits_are_refused() {
        for bad in [
            HelloOk { version: 0, ..ok() },
            HelloOk { version: PROTOCOL_VERSION_MAX + 1, ..ok() },
            HelloOk { flags: 0x8000, ..ok() },
            HelloOk { max_frame_bytes: MAX_FRAME_BYTES_CEILING + 1, ..ok() },
            HelloOk { max_batch: 0, ..ok() },
            HelloOk { max_inflight: 0, ..ok() },
            HelloOk { max_frame_bytes: 55 + 4096, ..ok() },
            HelloOk { max_value_bytes: u32::MAX, ..ok() },
        ] {
            assert!(matches!(check_hello_ok(&bad), Err(ClientError::Protocol(_))), "{bad:?}");
        }
    }
}
