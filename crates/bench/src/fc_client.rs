//! A minimal synchronous farcache client over `farcache-wire`: one blocking stream, one
//! request in flight. The real client (`farcache-client`) is asynchronous and pipelines;
//! this one exists so that the farcache server and memcached are driven by the same
//! closed-loop logic (see [`crate::mc_client`] for its twin).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use farcache_wire::{
    decode_response, encode_hello, encode_keys, encode_put, encode_raw, split_frame, ErrorFrame, Hello, HelloOk, Key,
    Limits, Opcode, PutStatus, Response, HEADER_BYTES, PROTOCOL_VERSION_MAX, PROTOCOL_VERSION_MIN,
};

use crate::error::IoContext;
use crate::recv::RecvBuf;
use crate::{BenchError, Result};

const SYSTEM: &str = "farcache";

/// How long a blocking read or write may take before the benchmark gives up on a server.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Counts of one PUT batch's answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PutCounts {
    pub stored: u64,
    pub rejected: u64,
}

pub struct FcClient<S> {
    stream: S,
    rx: RecvBuf,
    tx: Vec<u8>,
    limits: Limits,
    hello: HelloOk,
    next_id: u64,
}

impl FcClient<TcpStream> {
    /// Connect to `addr` and say HELLO as `tenant` (open mode: no secret).
    pub fn connect(addr: SocketAddr, tenant: &str) -> Result<Self> {
        Self::connect_with_secret(addr, tenant, b"")
    }

    /// As [`FcClient::connect`], for a configured tenant with its secret.
    pub fn connect_with_secret(addr: SocketAddr, tenant: &str, secret: &[u8]) -> Result<Self> {
        let s = TcpStream::connect(addr).ctx(|| format!("connect to farcache server {addr}"))?;
        s.set_nodelay(true).ctx(|| "TCP_NODELAY".into())?;
        s.set_read_timeout(Some(IO_TIMEOUT)).ctx(|| "read timeout".into())?;
        s.set_write_timeout(Some(IO_TIMEOUT)).ctx(|| "write timeout".into())?;
        FcClient::handshake_with_secret(s, tenant, secret)
    }
}

impl<S: Read + Write> FcClient<S> {
    /// Send HELLO on `stream` and wait for HELLO_OK.
    pub fn handshake(stream: S, tenant: &str) -> Result<Self> {
        Self::handshake_with_secret(stream, tenant, b"")
    }

    /// Send HELLO with a tenant's secret on `stream` and wait for HELLO_OK.
    pub fn handshake_with_secret(stream: S, tenant: &str, secret: &[u8]) -> Result<Self> {
        let mut c = FcClient {
            stream,
            rx: RecvBuf::new(),
            tx: Vec::with_capacity(128 << 10),
            limits: Limits::HANDSHAKE,
            hello: HelloOk {
                version: 0,
                flags: 0,
                max_frame_bytes: 0,
                max_batch: 0,
                max_inflight: 0,
                max_value_bytes: 0,
                instance_id: 0,
            },
            next_id: 1,
        };
        let id = c.id();
        let hello = Hello { min_version: PROTOCOL_VERSION_MIN, max_version: PROTOCOL_VERSION_MAX, tenant, secret };
        encode_hello(&mut c.tx, id, &hello);
        c.send()?;
        let ok = c.recv(id, |r| match r {
            Response::HelloOk(ok) => Ok(ok),
            other => Err(unexpected("HELLO_OK", &other)),
        })?;
        c.limits = ok.limits();
        c.hello = ok;
        Ok(c)
    }

    /// What the server granted.
    pub fn hello_ok(&self) -> &HelloOk {
        &self.hello
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id - 1
    }

    fn send(&mut self) -> Result<()> {
        let r = self.stream.write_all(&self.tx).ctx(|| "send to farcache server".into());
        self.tx.clear();
        r
    }

    /// Wait for the answer to request `id` and hand it to `f`.
    fn recv<T>(&mut self, id: u64, f: impl FnOnce(Response<'_>) -> Result<T>) -> Result<T> {
        let (h, n) = loop {
            if let Some(x) = split_frame(self.rx.data(), self.limits.max_frame_bytes)? {
                break x;
            }
            let want =
                farcache_wire::check_len_prefix(self.rx.data(), self.limits.max_frame_bytes)?.unwrap_or(HEADER_BYTES);
            self.rx.fill(&mut self.stream, want).ctx(|| "receive from farcache server".into())?;
        };
        let body = &self.rx.data()[HEADER_BYTES..n];
        let resp = decode_response(&h, body, &self.limits)?;
        let out = match resp {
            Response::Error(ErrorFrame { code, fatal, message }) => Err(BenchError::Refused {
                system: SYSTEM,
                msg: format!("ERROR {code:?}{}: {message}", if fatal { " (fatal)" } else { "" }),
            }),
            _ if h.request_id != id => Err(BenchError::Protocol {
                system: SYSTEM,
                msg: format!("answer to request {} while waiting for {id}", h.request_id),
            }),
            r => f(r),
        };
        self.rx.consume(n);
        out
    }

    /// GET a batch; `f(i, value)` is called for each key in order (`None`: a miss).
    pub fn get(&mut self, keys: &[Key], mut f: impl FnMut(usize, Option<&[u8]>)) -> Result<()> {
        let id = self.id();
        encode_keys(&mut self.tx, Opcode::Get, id, keys);
        self.send()?;
        self.recv(id, |r| match r {
            Response::Values(vals) if vals.len() == keys.len() => {
                for (i, v) in vals.iter().enumerate() {
                    f(i, v);
                }
                Ok(())
            }
            other => Err(unexpected("VALUES with one answer per key", &other)),
        })
    }

    /// PUT a batch.
    pub fn put(&mut self, entries: &[(Key, &[u8])]) -> Result<PutCounts> {
        let id = self.id();
        encode_put(&mut self.tx, id, entries);
        self.send()?;
        self.recv(id, |r| match r {
            Response::PutOk(st) if st.len() == entries.len() => {
                let stored = st.as_slice().iter().filter(|&&b| b == PutStatus::Stored as u8).count() as u64;
                Ok(PutCounts { stored, rejected: entries.len() as u64 - stored })
            }
            other => Err(unexpected("PUT_OK with one status per entry", &other)),
        })
    }

    /// The server's STATS JSON.
    pub fn stats(&mut self) -> Result<String> {
        let id = self.id();
        encode_raw(&mut self.tx, Opcode::Stats, id, b"");
        self.send()?;
        self.recv(id, |r| match r {
            Response::StatsOk(json) => Ok(json.to_string()),
            other => Err(unexpected("STATS_OK", &other)),
        })
    }
}

fn unexpected(wanted: &str, got: &Response<'_>) -> BenchError {
    let got = match got {
        Response::HelloOk(_) => "HELLO_OK".to_string(),
        Response::Values(v) => format!("VALUES of {}", v.len()),
        Response::PutOk(s) => format!("PUT_OK of {}", s.len()),
        Response::DelOk(s) => format!("DEL_OK of {}", s.len()),
        Response::StatsOk(_) => "STATS_OK".into(),
        Response::Pong(_) => "PONG".into(),
        Response::Error(e) => format!("ERROR {:?}", e.code),
    };
    BenchError::Protocol { system: SYSTEM, msg: format!("expected {wanted}, got {got}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recv::tests::Mock;

    /// HELLO_OK for request 1: version 1, no flags, 1 MiB frames, batch 253, 128 in flight,
    /// 4096-byte values, instance 0x1122334455667788.
    fn hello_ok_fixture() -> Vec<u8> {
        let mut f = vec![
            36, 0, 0, 0, 0x81, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, // header: len 12 + 24
            1, 0, 0, 0, // version, flags
            0, 0, 0x10, 0, // max_frame_bytes = 1 MiB
            253, 0, 128, 0, // max_batch, max_inflight
            0, 0x10, 0, 0, // max_value_bytes = 4096
        ];
        f.extend_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        f
    }

    #[test]
    fn hello_bytes_and_hello_ok_decoding() {
        for chunk in [1, 7, 4096] {
            let mut c = FcClient::handshake(Mock::new(hello_ok_fixture(), chunk), "bench").unwrap();
            let sent = std::mem::take(&mut c.stream.output);
            #[rustfmt::skip]
            let want: Vec<u8> = vec![
                27, 0, 0, 0, 0x01, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, // len = 12 + 15, HELLO, id 1
                b'F', b'A', b'R', b'C', 1, 0, 1, 0,                   // magic, versions 1..=1
                5, b'b', b'e', b'n', b'c', b'h', 0,                   // tenant, empty secret
            ];
            assert_eq!(sent, want);
            let ok = c.hello_ok();
            assert_eq!((ok.max_batch, ok.max_frame_bytes, ok.max_value_bytes), (253, 1 << 20, 4096));
            assert_eq!(ok.instance_id, 0x1122_3344_5566_7788);
        }
    }

    #[test]
    fn get_batch_framing_hits_and_misses() {
        let mut input = hello_ok_fixture();
        // VALUES for request 2: [hit "abc", miss].
        #[rustfmt::skip]
        input.extend_from_slice(&[
            12 + 4 + 8 + 1, 0, 0, 0, 0x82, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
            2, 0, 0, 0,
            1, 3, 0, 0, 0, b'a', b'b', b'c',
            0,
        ]);
        let mut c = FcClient::handshake(Mock::new(input, 5), "t").unwrap();
        c.stream.output.clear();
        let keys = [Key::new(7, 1, 0), Key::new(7, 2, 3)];
        let mut got = Vec::new();
        c.get(&keys, |i, v| got.push((i, v.map(|v| v.to_vec())))).unwrap();
        assert_eq!(got, vec![(0, Some(b"abc".to_vec())), (1, None)]);
        let sent = &c.stream.output;
        assert_eq!(sent.len(), HEADER_BYTES + 4 + 2 * 32);
        assert_eq!(&sent[0..16], &[80, 0, 0, 0, 0x02, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&sent[16..20], &[2, 0, 0, 0]);
        assert_eq!(sent[20], 7, "file id, little-endian");
        assert_eq!(sent[20 + 16], 1, "block of the first key");
        assert_eq!(sent[52 + 16], 2, "block of the second key");
        assert_eq!(sent[52 + 24], 3, "epoch of the second key");
    }

    #[test]
    fn put_statuses_and_server_errors() {
        let mut input = hello_ok_fixture();
        // PUT_OK for request 2: [Stored, NoSpace].
        input.extend_from_slice(&[12 + 4 + 2, 0, 0, 0, 0x83, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2]);
        // ERROR for request 3: Busy (6), non-fatal, "no".
        input.extend_from_slice(&[12 + 6, 0, 0, 0, 0xFF, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 6, 0, 2, 0, b'n', b'o']);
        // An answer to the wrong request id.
        input.extend_from_slice(&[12 + 4 + 1, 0, 0, 0, 0x83, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
        let mut c = FcClient::handshake(Mock::new(input, 3), "t").unwrap();
        let v = [1u8; 10];
        let k = Key::new(1, 1, 0);
        assert_eq!(c.put(&[(k, &v), (k, &v)]).unwrap(), PutCounts { stored: 1, rejected: 1 });
        let e = c.put(&[(k, &v)]).unwrap_err().to_string();
        assert!(e.contains("Busy") && e.contains("no"), "{e}");
        let e = c.put(&[(k, &v)]).unwrap_err().to_string();
        assert!(e.contains("request 9"), "{e}");
        // Then the stream ends: an I/O error, not a hang.
        assert!(matches!(c.stats().unwrap_err(), BenchError::Io { .. }));
    }

    #[test]
    fn a_values_frame_of_the_wrong_length_is_refused() {
        let mut input = hello_ok_fixture();
        input.extend_from_slice(&[12 + 4 + 1, 0, 0, 0, 0x82, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
        let mut c = FcClient::handshake(Mock::new(input, 64), "t").unwrap();
        let keys = [Key::new(1, 1, 0), Key::new(1, 2, 0)];
        let e = c.get(&keys, |_, _| {}).unwrap_err().to_string();
        assert!(e.contains("one answer per key"), "{e}");
    }
}
