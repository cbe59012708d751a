//! A minimal synchronous memcached client for its text protocol: `get` of many keys,
//! pipelined `set`s, `stats`. The twin of [`crate::fc_client`]: same blocking stream, same
//! receive buffer, one request (or one batch of pipelined sets) in flight.
//!
//! Key `id` is named `fc<id>` in decimal. A batch GET is one multi-key `get`, whose answer
//! lists only the hits, in the order asked, then `END`:
//! ```text
//! get fc1 fc2 fc3\r\n
//! VALUE fc1 0 4096\r\n<4096 bytes>\r\n
//! VALUE fc3 0 4096\r\n<4096 bytes>\r\n
//! END\r\n
//! ```
//! A batch PUT is that many `set fc<id> 0 0 4096\r\n<data>\r\n` written at once, answered by
//! one `STORED\r\n` each.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use crate::error::IoContext;
use crate::fc_client::{PutCounts, IO_TIMEOUT};
use crate::recv::RecvBuf;
use crate::{BenchError, Result};

const SYSTEM: &str = "memcached";
/// Longest line accepted (a `VALUE` line, a `STAT` line or an error).
const MAX_LINE_BYTES: usize = 2048;

pub struct McClient<S> {
    stream: S,
    rx: RecvBuf,
    tx: Vec<u8>,
}

impl McClient<TcpStream> {
    pub fn connect(addr: SocketAddr) -> Result<Self> {
        let s = TcpStream::connect(addr).ctx(|| format!("connect to memcached {addr}"))?;
        s.set_nodelay(true).ctx(|| "TCP_NODELAY".into())?;
        s.set_read_timeout(Some(IO_TIMEOUT)).ctx(|| "read timeout".into())?;
        s.set_write_timeout(Some(IO_TIMEOUT)).ctx(|| "write timeout".into())?;
        Ok(McClient::new(s))
    }
}

/// Append the memcached key name of key `id`.
pub fn key_name(id: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(b"fc");
    let mut digits = [0u8; 20];
    let mut n = id;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The id in a key name made by [`key_name`].
pub fn parse_key_id(name: &[u8]) -> Option<u64> {
    let digits = name.strip_prefix(b"fc")?;
    if digits.is_empty() || digits.len() > 19 || (digits.len() > 1 && digits[0] == b'0') {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| d.is_ascii_digit().then(|| n * 10 + (d - b'0') as u64))
}

/// Parse `VALUE <key> <flags> <bytes> [<cas>]` (without CRLF): the key, flags and length.
pub fn parse_value_line(line: &[u8]) -> Result<(&[u8], u32, usize)> {
    let bad =
        || BenchError::Protocol { system: SYSTEM, msg: format!("bad VALUE line {:?}", String::from_utf8_lossy(line)) };
    let mut parts = line.split(|&b| b == b' ');
    if parts.next() != Some(b"VALUE") {
        return Err(bad());
    }
    let key = parts.next().filter(|k| !k.is_empty()).ok_or_else(bad)?;
    let num = |p: Option<&[u8]>| -> Option<u64> {
        let p = p?;
        if p.is_empty() || p.len() > 19 {
            return None;
        }
        p.iter().try_fold(0u64, |n, &d| d.is_ascii_digit().then(|| n * 10 + (d - b'0') as u64))
    };
    let flags = num(parts.next()).and_then(|f| u32::try_from(f).ok()).ok_or_else(bad)?;
    let bytes = num(parts.next()).ok_or_else(bad)? as usize;
    // An optional CAS value (only with `gets`), then nothing.
    if let Some(cas) = parts.next() {
        num(Some(cas)).ok_or_else(bad)?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok((key, flags, bytes))
}

fn refused(line: &[u8]) -> BenchError {
    BenchError::Refused { system: SYSTEM, msg: String::from_utf8_lossy(line).into_owned() }
}

impl<S: Read + Write> McClient<S> {
    pub fn new(stream: S) -> Self {
        McClient { stream, rx: RecvBuf::new(), tx: Vec::with_capacity(128 << 10) }
    }

    fn send(&mut self) -> Result<()> {
        let r = self.stream.write_all(&self.tx).ctx(|| "send to memcached".into());
        self.tx.clear();
        r
    }

    /// Wait for a whole line; returns its length without the CRLF (which stays unconsumed).
    fn line(&mut self) -> Result<usize> {
        let mut searched = 0;
        loop {
            let d = self.rx.data();
            if let Some(i) = d[searched..].iter().position(|&b| b == b'\n') {
                let end = searched + i;
                if end == 0 || d[end - 1] != b'\r' {
                    return Err(BenchError::Protocol { system: SYSTEM, msg: "line not ended by CRLF".into() });
                }
                return Ok(end - 1);
            }
            searched = d.len();
            if searched > MAX_LINE_BYTES {
                return Err(BenchError::Protocol {
                    system: SYSTEM,
                    msg: format!("line longer than {MAX_LINE_BYTES} bytes"),
                });
            }
            self.rx.fill(&mut self.stream, searched + 1).ctx(|| "receive from memcached".into())?;
        }
    }

    /// GET a batch with one multi-key `get`; `f(i, value)` is called for each key in order
    /// (`None`: a miss).
    pub fn get(&mut self, ids: &[u64], mut f: impl FnMut(usize, Option<&[u8]>)) -> Result<()> {
        assert!(!ids.is_empty());
        self.tx.extend_from_slice(b"get");
        for &id in ids {
            self.tx.push(b' ');
            key_name(id, &mut self.tx);
        }
        self.tx.extend_from_slice(b"\r\n");
        self.send()?;
        // Hits come in the order asked; the keys skipped over are misses.
        let mut next = 0;
        loop {
            let n = self.line()?;
            let line = &self.rx.data()[..n];
            if line == b"END" {
                self.rx.consume(n + 2);
                break;
            }
            if !line.starts_with(b"VALUE ") {
                return Err(refused(line));
            }
            let (key, _flags, bytes) = parse_value_line(line)?;
            let id = parse_key_id(key).ok_or_else(|| BenchError::Protocol {
                system: SYSTEM,
                msg: format!("VALUE for key {:?} that was not asked for", String::from_utf8_lossy(key)),
            })?;
            while next < ids.len() && ids[next] != id {
                f(next, None);
                next += 1;
            }
            if next == ids.len() {
                return Err(BenchError::Protocol {
                    system: SYSTEM,
                    msg: format!("VALUE for fc{id} out of order or not asked for"),
                });
            }
            self.rx.consume(n + 2);
            while self.rx.data().len() < bytes + 2 {
                self.rx.fill(&mut self.stream, bytes + 2).ctx(|| "receive from memcached".into())?;
            }
            let d = self.rx.data();
            if &d[bytes..bytes + 2] != b"\r\n" {
                return Err(BenchError::Protocol { system: SYSTEM, msg: "data block not ended by CRLF".into() });
            }
            f(next, Some(&d[..bytes]));
            next += 1;
            self.rx.consume(bytes + 2);
        }
        for i in next..ids.len() {
            f(i, None);
        }
        Ok(())
    }

    /// `set` each entry, all written at once, then read one answer per entry.
    pub fn set(&mut self, entries: &[(u64, &[u8])]) -> Result<PutCounts> {
        for &(id, v) in entries {
            self.tx.extend_from_slice(b"set ");
            key_name(id, &mut self.tx);
            self.tx.extend_from_slice(format!(" 0 0 {}\r\n", v.len()).as_bytes());
            self.tx.extend_from_slice(v);
            self.tx.extend_from_slice(b"\r\n");
        }
        self.send()?;
        let mut counts = PutCounts::default();
        for _ in entries {
            let n = self.line()?;
            let line = &self.rx.data()[..n];
            match line {
                b"STORED" => counts.stored += 1,
                // Out of memory with eviction off (-M), or a too-large item: not stored.
                b"NOT_STORED" => counts.rejected += 1,
                l if l.starts_with(b"SERVER_ERROR") => counts.rejected += 1,
                l => return Err(refused(l)),
            }
            self.rx.consume(n + 2);
        }
        Ok(counts)
    }

    /// `stats`: every `STAT name value` line.
    pub fn stats(&mut self) -> Result<BTreeMap<String, String>> {
        self.tx.extend_from_slice(b"stats\r\n");
        self.send()?;
        let mut out = BTreeMap::new();
        loop {
            let n = self.line()?;
            let line = String::from_utf8_lossy(&self.rx.data()[..n]).into_owned();
            self.rx.consume(n + 2);
            if line == "END" {
                return Ok(out);
            }
            let mut p = line.splitn(3, ' ');
            match (p.next(), p.next(), p.next()) {
                (Some("STAT"), Some(k), Some(v)) => {
                    out.insert(k.to_string(), v.to_string());
                }
                _ => return Err(refused(line.as_bytes())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recv::tests::Mock;

    #[test]
    fn key_names_round_trip() {
        for id in [0u64, 7, 10, 123456789, u64::MAX / 10] {
            let mut k = Vec::new();
            key_name(id, &mut k);
            assert_eq!(k, format!("fc{id}").into_bytes());
            assert_eq!(parse_key_id(&k), Some(id));
        }
        for bad in [&b"fc"[..], b"fc01", b"fx1", b"fc1a", b"fc-1", b"fc99999999999999999999"] {
            assert_eq!(parse_key_id(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn value_lines() {
        assert_eq!(parse_value_line(b"VALUE fc1 0 4096").unwrap(), (&b"fc1"[..], 0, 4096));
        assert_eq!(parse_value_line(b"VALUE k 42 5 99").unwrap(), (&b"k"[..], 42, 5));
        for bad in [
            &b"VALUE"[..],
            b"VALUE k",
            b"VALUE k 0",
            b"VALUE k x 5",
            b"VALUE k 0 5 1 2",
            b"VALUE  0 5",
            b"VALUES k 0 5",
            b"VALUE k 0 -5",
            b"VALUE k 4294967296 5",
        ] {
            assert!(parse_value_line(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn multi_get_hits_misses_and_request_bytes() {
        let answer = b"VALUE fc1 0 5\r\nhello\r\nVALUE fc30 0 3\r\na\r\n\r\nEND\r\n".to_vec();
        for chunk in [1, 2, 3, 5, 64] {
            let mut c = McClient::new(Mock::new(answer.clone(), chunk));
            let mut got = Vec::new();
            c.get(&[1, 2, 30, 4], |i, v| got.push((i, v.map(|v| v.to_vec())))).unwrap();
            assert_eq!(
                got,
                vec![(0, Some(b"hello".to_vec())), (1, None), (2, Some(b"a\r\n".to_vec())), (3, None)],
                "chunk {chunk}"
            );
            assert_eq!(c.stream.output, b"get fc1 fc2 fc30 fc4\r\n");
        }
    }

    #[test]
    fn all_miss_and_out_of_order_answers() {
        let mut c = McClient::new(Mock::new(b"END\r\n".to_vec(), 4));
        let mut misses = 0;
        c.get(&[5, 6], |_, v| misses += v.is_none() as u32).unwrap();
        assert_eq!(misses, 2);
        // fc2 after fc3 although fc2 was asked first: memcached never does this.
        let mut c = McClient::new(Mock::new(b"VALUE fc3 0 1\r\nx\r\nVALUE fc2 0 1\r\ny\r\nEND\r\n".to_vec(), 64));
        let e = c.get(&[2, 3], |_, _| {}).unwrap_err().to_string();
        assert!(e.contains("out of order"), "{e}");
        // A data block that is not followed by CRLF.
        let mut c = McClient::new(Mock::new(b"VALUE fc3 0 1\r\nxy\r\nEND\r\n".to_vec(), 64));
        assert!(c.get(&[3], |_, _| {}).unwrap_err().to_string().contains("CRLF"));
        // Errors are reported as refusals with memcached's words.
        let mut c = McClient::new(Mock::new(b"SERVER_ERROR out of memory\r\n".to_vec(), 64));
        let e = c.get(&[3], |_, _| {}).unwrap_err().to_string();
        assert!(e.contains("SERVER_ERROR out of memory"), "{e}");
        // A stream that ends mid-answer.
        let mut c = McClient::new(Mock::new(b"VALUE fc3 0 10\r\nxy".to_vec(), 64));
        assert!(matches!(c.get(&[3], |_, _| {}).unwrap_err(), BenchError::Io { .. }));
    }

    #[test]
    fn pipelined_sets() {
        let answer = b"STORED\r\nSERVER_ERROR out of memory storing object\r\nSTORED\r\n".to_vec();
        let mut c = McClient::new(Mock::new(answer, 3));
        let counts = c.set(&[(1, b"ab"), (2, b"c"), (3, b"")]).unwrap();
        assert_eq!(counts, PutCounts { stored: 2, rejected: 1 });
        assert_eq!(c.stream.output, b"set fc1 0 0 2\r\nab\r\nset fc2 0 0 1\r\nc\r\nset fc3 0 0 0\r\n\r\n");
        let mut c = McClient::new(Mock::new(b"ERROR\r\n".to_vec(), 3));
        assert!(matches!(c.set(&[(1, b"x")]).unwrap_err(), BenchError::Refused { .. }));
    }

    #[test]
    fn stats_lines() {
        let answer = b"STAT pid 12\r\nSTAT version 1.6.18\r\nSTAT evictions 0\r\nEND\r\n".to_vec();
        let mut c = McClient::new(Mock::new(answer, 7));
        let s = c.stats().unwrap();
        assert_eq!(s["version"], "1.6.18");
        assert_eq!(s["evictions"], "0");
        assert_eq!(s.len(), 3);
        assert_eq!(c.stream.output, b"stats\r\n");
    }

    #[test]
    fn lines_must_end_in_crlf_and_stay_short() {
        let mut c = McClient::new(Mock::new(b"END\n".to_vec(), 64));
        assert!(c.get(&[1], |_, _| {}).is_err());
        let mut c = McClient::new(Mock::new(vec![b'x'; 10_000], 64));
        assert!(c.get(&[1], |_, _| {}).unwrap_err().to_string().contains("longer than"));
    }
}
