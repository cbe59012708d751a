//! The real `farcache server` against clients that break the protocol: garbage, lies about
//! lengths, bad handshakes, bad requests, slow senders, silent and idle clients, too many
//! clients, clients that never read (memcached's t/malicious-commands.t in spirit).
//!
//! After every case: the server is still alive, a fresh well-behaved client still gets its
//! bytes back, and stderr has a line about the bad connection (naming its `peer`).
//! Timeouts are configured short so the whole file runs in seconds; each test has its own
//! server, so the harness runs them in parallel.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farcache_client::{Client, ClientConfig, DelStatus, Key, PutStatus};
use farcache_testkit::{
    check_round_trip, frame, frame_with_reserved, hello_body, hello_bytes, hello_bytes_versions, wait_until, RawConn,
    Rng, ServerProcess,
};
use farcache_wire::{encode_keys, encode_put, ErrorCode, HelloOk, Opcode, HELLO_MAGIC, KEY_BYTES};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// Short timeouts: every timeout case ends within about a second or two.
const SHORT: &str = r#"
[server]
capacity = "8MiB"
handshake_timeout = "1s"
frame_timeout = "1s"
idle_timeout = "2s"
write_timeout = "1s"
max_connections = 8
"#;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
const FRAME_TIMEOUT: Duration = Duration::from_secs(1);
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// Allowed lateness of a timeout: scheduling on two loaded cores, a debug build.
const MARGIN: Duration = Duration::from_millis(900);
/// How long to wait for an answer or a close that should come at once.
const PROMPT: Duration = Duration::from_secs(3);

/// Bad requests that do not close the connection are logged at debug (nothing above debug
/// on the request path); turn that on for the connection module only.
const LOG: (&str, &str) = ("FARCACHE_LOG", "info,farcache_server::conn=debug");

fn server(config: &str) -> ServerProcess {
    ServerProcess::start_env(bin(), &[], Some(config), &[LOG])
}

static SEED: AtomicU64 = AtomicU64::new(1);

/// The checks after every case. `needle`: what the log line about `bad` must say.
fn assert_healthy(srv: &mut ServerProcess, bad: SocketAddr, needle: &str) {
    assert!(srv.is_alive(), "server died; stderr:\n{}", srv.stderr_text());
    let seed = SEED.fetch_add(1, Ordering::Relaxed);
    check_round_trip(srv.addr(), "good", b"", seed).unwrap_or_else(|e| panic!("after the bad connection {bad}: {e}"));
    let peer = format!("peer={bad}");
    let line = srv.wait_for_stderr(PROMPT, |l| l.contains(&peer) && l.contains(needle));
    assert!(line.is_some(), "no log line with {peer:?} and {needle:?}; stderr:\n{}", srv.stderr_text());
}

/// A connection that has completed HELLO as tenant "bad".
fn authed(srv: &ServerProcess) -> (RawConn, HelloOk) {
    let mut c = RawConn::connect(srv.addr()).unwrap();
    let ok = c.hello("bad", b"", PROMPT).unwrap();
    (c, ok)
}

fn get_frame(id: u64, keys: &[Key]) -> Vec<u8> {
    let mut f = Vec::new();
    encode_keys(&mut f, Opcode::Get, id, keys);
    f
}

/// A batched body: count, reserved, then `rest`.
fn batch(count: u16, reserved: u16, rest: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&count.to_le_bytes());
    b.extend_from_slice(&reserved.to_le_bytes());
    b.extend_from_slice(rest);
    b
}

fn keys_bytes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| Key::new(9, i as u64, 1).to_bytes()).collect()
}

fn put_entry(key: Key, len_field: u32, value: &[u8]) -> Vec<u8> {
    let mut e = key.to_bytes().to_vec();
    e.extend_from_slice(&len_field.to_le_bytes());
    e.extend_from_slice(value);
    e
}

#[test]
fn bad_handshakes_get_a_fatal_error_then_close() {
    let mut srv = server(SHORT);
    let good_hello = hello_bytes("t", b"");
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        ("4 GiB length prefix", vec![0xFF; 4], ErrorCode::TooLarge),
        ("4 GiB length prefix and more", [vec![0xFF; 4], vec![0x01; 100]].concat(), ErrorCode::TooLarge),
        ("length shorter than a header", [5u32.to_le_bytes().to_vec(), vec![0; 12]].concat(), ErrorCode::BadFrame),
        ("HELLO over the handshake frame limit", frame(Opcode::Hello as u8, 0, 1, &[0; 5000]), ErrorCode::TooLarge),
        ("bad magic", frame(Opcode::Hello as u8, 0, 1, &hello_body(*b"MEMC", 1, 1, b"t", b"")), ErrorCode::BadFrame),
        ("versions 2..=9 only", hello_bytes_versions("t", b"", 2, 9), ErrorCode::UnsupportedVersion),
        ("version 0 only", hello_bytes_versions("t", b"", 0, 0), ErrorCode::UnsupportedVersion),
        ("min version > max version", hello_bytes_versions("t", b"", 3, 1), ErrorCode::BadFrame),
        (
            "reserved header bits",
            frame_with_reserved(Opcode::Hello as u8, 0, 0x8000, 1, &good_hello[16..]),
            ErrorCode::BadFrame,
        ),
        ("flags on HELLO", frame(Opcode::Hello as u8, 0x01, 1, &good_hello[16..]), ErrorCode::BadFrame),
        (
            "tenant with a slash",
            frame(Opcode::Hello as u8, 0, 1, &hello_body(HELLO_MAGIC, 1, 1, b"a/b", b"")),
            ErrorCode::BadFrame,
        ),
        (
            "empty tenant",
            frame(Opcode::Hello as u8, 0, 1, &hello_body(HELLO_MAGIC, 1, 1, b"", b"")),
            ErrorCode::BadFrame,
        ),
        (
            "tenant not UTF-8",
            frame(Opcode::Hello as u8, 0, 1, &hello_body(HELLO_MAGIC, 1, 1, &[0xC3, 0x28], b"")),
            ErrorCode::BadFrame,
        ),
        (
            "secret of 200 bytes",
            frame(Opcode::Hello as u8, 0, 1, &hello_body(HELLO_MAGIC, 1, 1, b"t", &[7; 200])),
            ErrorCode::BadFrame,
        ),
        (
            "HELLO with trailing bytes",
            frame(Opcode::Hello as u8, 0, 1, &[&good_hello[16..], &[0u8; 3][..]].concat()),
            ErrorCode::BadFrame,
        ),
        (
            "HELLO body cut inside the tenant",
            frame(Opcode::Hello as u8, 0, 1, &[&HELLO_MAGIC[..], &[1, 0, 1, 0, 50], b"abc"].concat()),
            ErrorCode::BadFrame,
        ),
        ("unknown opcode first", frame(0x42, 0, 1, b""), ErrorCode::HandshakeRequired),
        ("a response opcode first", frame(Opcode::HelloOk as u8, 0, 1, &[0; 24]), ErrorCode::HandshakeRequired),
        ("PING before HELLO", frame(Opcode::Ping as u8, 0, 1, b"x"), ErrorCode::HandshakeRequired),
        ("STATS before HELLO", frame(Opcode::Stats as u8, 0, 1, b""), ErrorCode::HandshakeRequired),
    ];
    for (what, bytes, code) in cases {
        let mut c = RawConn::connect(srv.addr()).unwrap();
        c.send(&bytes).unwrap_or_else(|e| panic!("{what}: send: {e}"));
        let err = c.expect_fatal(code, PROMPT).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!err.message.is_empty(), "{what}: ERROR without a message");
        assert_healthy(&mut srv, c.local_addr(), "closing connection");
    }
}

#[test]
fn requests_before_hello_are_refused_as_handshake_required() {
    // A GET, PUT or DEL before HELLO is "a request before HELLO" (ErrorCode::HandshakeRequired),
    // whatever its body: the client must learn that it skipped the handshake.
    let mut srv = server(SHORT);
    let key = Key::new(1, 2, 3);
    let mut put = Vec::new();
    encode_put(&mut put, 1, &[(key, &b"v"[..])]);
    let mut del = Vec::new();
    encode_keys(&mut del, Opcode::Del, 1, &[key]);
    for (what, bytes) in [("GET", get_frame(1, &[key])), ("PUT", put), ("DEL", del)] {
        let mut c = RawConn::connect(srv.addr()).unwrap();
        c.send(&bytes).unwrap();
        let err = c.read_error(PROMPT).unwrap_or_else(|e| panic!("{what} before HELLO: {e}"));
        assert!(err.fatal, "{what} before HELLO: {err:?}");
        assert_eq!(err.code, ErrorCode::HandshakeRequired, "{what} before HELLO: {err:?}");
        c.expect_closed(PROMPT).unwrap();
        assert_healthy(&mut srv, c.local_addr(), "closing connection");
    }
}

#[test]
fn truncated_frame_then_close() {
    let mut srv = server(SHORT);
    // Before HELLO: ten bytes of a HELLO, then EOF.
    let mut c = RawConn::connect(srv.addr()).unwrap();
    c.send(&hello_bytes("t", b"")[..10]).unwrap();
    c.shutdown_write().unwrap();
    let frames = c.expect_closed(PROMPT).unwrap();
    assert!(frames.is_empty(), "{frames:?}");
    assert_healthy(&mut srv, c.local_addr(), "mid-frame");

    // After HELLO: half a GET, then EOF.
    let (mut c, _) = authed(&srv);
    let f = get_frame(2, &[Key::new(1, 1, 1)]);
    c.send(&f[..f.len() / 2]).unwrap();
    c.shutdown_write().unwrap();
    assert!(c.expect_closed(PROMPT).unwrap().is_empty());
    assert_healthy(&mut srv, c.local_addr(), "mid-frame");

    // Half a frame, socket kept open: the frame timeout ends it.
    let (mut c, _) = authed(&srv);
    c.send(&f[..f.len() / 2]).unwrap();
    let t = Instant::now();
    let err = c.expect_fatal(ErrorCode::Timeout, FRAME_TIMEOUT + MARGIN + PROMPT).unwrap();
    let took = t.elapsed();
    assert!(took >= FRAME_TIMEOUT - Duration::from_millis(100) && took <= FRAME_TIMEOUT + MARGIN, "{took:?}");
    assert!(err.message.contains("frame_timeout"), "{err:?}");
    assert_healthy(&mut srv, c.local_addr(), "frame_timeout");
}

#[test]
fn framing_errors_after_hello_are_fatal() {
    let mut srv = server(SHORT);
    let (_, ok) = authed(&srv);
    let over = ok.max_frame_bytes + 1 - 4;
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        ("4 GiB length prefix", vec![0xFF; 4], ErrorCode::TooLarge),
        (
            "one byte over max_frame_bytes",
            [over.to_le_bytes().to_vec(), vec![Opcode::Put as u8, 0, 0, 0]].concat(),
            ErrorCode::TooLarge,
        ),
        ("length shorter than a header", [11u32.to_le_bytes().to_vec(), vec![0; 12]].concat(), ErrorCode::BadFrame),
        ("reserved header bits", frame_with_reserved(Opcode::Ping as u8, 0, 1, 2, b""), ErrorCode::BadFrame),
        ("second HELLO", hello_bytes("bad", b""), ErrorCode::HandshakeRequired),
        ("HELLO as another tenant", hello_bytes("other", b""), ErrorCode::HandshakeRequired),
    ];
    for (what, bytes, code) in cases {
        let (mut c, _) = authed(&srv);
        c.send(&bytes).unwrap_or_else(|e| panic!("{what}: send: {e}"));
        c.expect_fatal(code, PROMPT).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_healthy(&mut srv, c.local_addr(), "closing connection");
    }
}

#[test]
fn bad_requests_are_answered_and_the_connection_lives_on() {
    let mut srv = server(SHORT);
    let (mut c, ok) = authed(&srv);
    let max_batch = ok.max_batch;
    let slot = ok.max_value_bytes;
    let k = Key::new(77, 1, 1);
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        ("unknown opcode", frame(0x42, 0, 10, b"whatever"), ErrorCode::UnknownOpcode),
        (
            "a response opcode (VALUES)",
            frame(Opcode::Values as u8, 0, 11, &batch(1, 0, &[0])),
            ErrorCode::UnknownOpcode,
        ),
        ("an ERROR from the client", frame(0xFF, 0, 12, &[1, 0, 0, 0]), ErrorCode::UnknownOpcode),
        ("flags on GET", frame(Opcode::Get as u8, 0x01, 13, &batch(1, 0, &keys_bytes(1))), ErrorCode::BadFrame),
        ("GET of 0 keys", frame(Opcode::Get as u8, 0, 14, &batch(0, 0, b"")), ErrorCode::BadFrame),
        (
            "GET over max_batch",
            frame(Opcode::Get as u8, 0, 15, &batch(max_batch + 1, 0, &keys_bytes(max_batch as usize + 1))),
            ErrorCode::TooLarge,
        ),
        (
            "DEL count 65535, one key",
            frame(Opcode::Del as u8, 0, 16, &batch(u16::MAX, 0, &keys_bytes(1))),
            ErrorCode::TooLarge,
        ),
        ("batch reserved bits", frame(Opcode::Get as u8, 0, 17, &batch(1, 9, &keys_bytes(1))), ErrorCode::BadFrame),
        ("GET count 2, one key", frame(Opcode::Get as u8, 0, 18, &batch(2, 0, &keys_bytes(1))), ErrorCode::BadFrame),
        (
            "GET with trailing bytes",
            frame(Opcode::Get as u8, 0, 19, &batch(1, 0, &[keys_bytes(1), vec![0; 5]].concat())),
            ErrorCode::BadFrame,
        ),
        ("GET key cut short", frame(Opcode::Get as u8, 0, 20, &batch(1, 0, &[0; KEY_BYTES - 1])), ErrorCode::BadFrame),
        (
            "PUT value one byte over a slot",
            frame(Opcode::Put as u8, 0, 21, &batch(1, 0, &put_entry(k, slot + 1, &vec![1; slot as usize + 1]))),
            ErrorCode::TooLarge,
        ),
        (
            "PUT value length 4 GiB",
            frame(Opcode::Put as u8, 0, 22, &batch(1, 0, &put_entry(k, u32::MAX, b"abc"))),
            ErrorCode::TooLarge,
        ),
        (
            "PUT value shorter than its length",
            frame(Opcode::Put as u8, 0, 23, &batch(1, 0, &put_entry(k, 100, b"abc"))),
            ErrorCode::BadFrame,
        ),
        (
            "PUT count 2, one entry",
            frame(Opcode::Put as u8, 0, 24, &batch(2, 0, &put_entry(k, 3, b"abc"))),
            ErrorCode::BadFrame,
        ),
        ("PING payload of 257 bytes", frame(Opcode::Ping as u8, 0, 25, &[0; 257]), ErrorCode::BadFrame),
        ("STATS with a body", frame(Opcode::Stats as u8, 0, 26, b"{}"), ErrorCode::BadFrame),
    ];
    let n = cases.len();
    for (i, (what, bytes, code)) in cases.into_iter().enumerate() {
        let id = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        c.send(&bytes).unwrap();
        let err = c.read_error(PROMPT).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!((err.code, err.fatal, err.request_id), (code, false, id), "{what}: {err:?}");
        // The connection still works: PING gets its PONG.
        c.ping(1000 + i as u64, what.as_bytes(), PROMPT).unwrap_or_else(|e| panic!("after {what}: {e}"));
        // Nothing of a refused PUT was stored.
        let (_, body) = c.request(&get_frame(2000 + i as u64, &[k]), PROMPT).unwrap();
        assert_eq!(body, batch(1, 0, &[0]), "after {what}: the key is not a miss");
        assert_healthy(&mut srv, c.local_addr(), "bad request");
    }
    let peer = format!("peer={}", c.local_addr());
    // The server may log a refusal just after answering it, and its stderr is read by
    // another thread: wait (bounded) for the lines, then require exactly one per request.
    let count = || srv.count_stderr_lines(|l| l.contains(&peer) && l.contains("bad request"));
    farcache_testkit::wait_until(Duration::from_secs(5), Duration::from_millis(10), || count() >= n);
    assert_eq!(count(), n, "one log line per bad request");
    // And a real request on the same connection.
    let mut put = Vec::new();
    encode_put(&mut put, 3000, &[(k, &b"still here"[..])]);
    let (h, body) = c.request(&put, PROMPT).unwrap();
    assert_eq!((h.opcode, body), (Opcode::PutOk as u8, batch(1, 0, &[0])));
}

#[test]
fn random_bytes_close_the_connection_and_nothing_else() {
    let srv = Arc::new(std::sync::Mutex::new(server(SHORT)));
    let addr = srv.lock().unwrap().addr();
    // Four workers at a time: with the health checks, within max_connections = 8.
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let srv = srv.clone();
            std::thread::spawn(move || {
                for i in 0..8u64 {
                    let seed = w * 1000 + i;
                    let mut rng = Rng::new(seed);
                    let after_hello = i % 2 == 1;
                    let mut c = RawConn::connect(addr).unwrap();
                    if after_hello {
                        c.hello("bad", b"", PROMPT).unwrap();
                    }
                    let len = 1 + rng.below(3000) as usize;
                    let mut bytes = rng.bytes(len);
                    if i % 4 >= 2 {
                        // A plausible length prefix (within the handshake limit), random after it.
                        let frame_len = 12 + rng.below(4000) as u32;
                        bytes[..4.min(len)].copy_from_slice(&frame_len.to_le_bytes()[..4.min(len)]);
                    }
                    // The send may fail once the server has refused the first bytes.
                    let _ = c.send(&bytes);
                    let frames = c
                        .expect_closed(HANDSHAKE_TIMEOUT + FRAME_TIMEOUT + MARGIN)
                        .unwrap_or_else(|e| panic!("seed {seed} ({len} bytes, after HELLO {after_hello}): {e}"));
                    // The server closes a connection it reads from only after saying why: the
                    // last frame is a fatal ERROR, and no fatal ERROR came before it (frames
                    // that happened to decode may have been answered).
                    let (last, earlier) = frames.split_last().unwrap_or_else(|| panic!("seed {seed}: closed silently"));
                    let e = farcache_testkit::ErrorReply::parse(&last.0, &last.1);
                    assert!(e.as_ref().is_some_and(|e| e.fatal), "seed {seed}: last frame {e:?}");
                    for (h, b) in earlier {
                        let e = farcache_testkit::ErrorReply::parse(h, b);
                        assert!(e.is_none_or(|e| !e.fatal), "seed {seed}: frame after a fatal ERROR");
                    }
                    let mut s = srv.lock().unwrap();
                    assert_healthy(&mut s, c.local_addr(), "closing connection");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker failed");
    }
}

#[test]
fn random_bodies_under_valid_headers_reach_the_body_decoders() {
    // Random bytes mostly die at the header; these get past it: a right length, zero
    // reserved and flags, a request opcode, and (for batches) a small count up front.
    let mut srv = server(SHORT);
    const OPS: [Opcode; 5] = [Opcode::Get, Opcode::Put, Opcode::Del, Opcode::Ping, Opcode::Stats];
    let (mut refused, mut answered) = (0, 0);
    for seed in 0..60u64 {
        let mut rng = Rng::new(0xB0D1 + seed);
        let after_hello = seed % 3 != 0;
        let op = if after_hello { OPS[rng.below(OPS.len() as u64) as usize] } else { Opcode::Hello };
        // PING payloads straddle their 256-byte limit.
        let body_len = rng.below(if op == Opcode::Ping { 320 } else { 600 }) as usize;
        let mut body = rng.bytes(body_len);
        if matches!(op, Opcode::Get | Opcode::Put | Opcode::Del) && body.len() >= 4 {
            body[..4].copy_from_slice(&batch(1 + rng.below(4) as u16, 0, b""));
        }
        if op == Opcode::Hello && body.len() >= 8 {
            // Past the magic and versions, into the tenant and secret.
            body[..8].copy_from_slice(&[&HELLO_MAGIC[..], &[1, 0, 1, 0]].concat());
        }
        let id = 0x5EED_0000 + seed;
        let mut c = RawConn::connect(srv.addr()).unwrap();
        if !after_hello {
            c.send(&frame(op as u8, 0, id, &body)).unwrap();
            let frames = c.expect_closed(PROMPT).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            // A random HELLO that happens to be valid is answered HELLO_OK; then idle.
            let last = frames.last().unwrap_or_else(|| panic!("seed {seed}: closed silently"));
            let e = farcache_testkit::ErrorReply::parse(&last.0, &last.1);
            assert!(e.as_ref().is_some_and(|e| e.fatal), "seed {seed}: last frame {e:?}");
            assert_healthy(&mut srv, c.local_addr(), "closing connection");
            continue;
        }
        c.hello("bad", b"", PROMPT).unwrap();
        let (h, answer) =
            c.request(&frame(op as u8, 0, id, &body), PROMPT).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        match farcache_testkit::ErrorReply::parse(&h, &answer) {
            Some(e) => {
                assert!(!e.fatal, "seed {seed}: a well-framed bad {op:?} closed the connection: {e:?}");
                c.ping(1, b"alive", PROMPT).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                assert_healthy(&mut srv, c.local_addr(), "bad request");
                refused += 1;
            }
            None => {
                // It happened to be a valid request: answered with its response opcode.
                assert_eq!(h.opcode, op as u8 | 0x80, "seed {seed}");
                c.ping(1, b"alive", PROMPT).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                answered += 1;
            }
        }
    }
    // Most random bodies are refused by a body decoder; a few (short PINGs) are valid.
    eprintln!("random bodies after HELLO: {refused} refused, {answered} answered");
    assert!(refused >= 25 && answered >= 1, "{refused} refused, {answered} answered");
}

#[test]
fn slow_loris_is_cut_at_frame_timeout() {
    let mut srv = server(SHORT);
    // After HELLO: a PING one byte every 300 ms (it would take 7 s).
    let (mut c, _) = authed(&srv);
    let ping = frame(Opcode::Ping as u8, 0, 5, b"12345678");
    let (took, err) = trickle(&mut c, &ping, Duration::from_millis(300));
    assert_eq!((err.code, err.fatal), (ErrorCode::Timeout, true), "{err:?}");
    assert!(took >= FRAME_TIMEOUT - Duration::from_millis(100) && took <= FRAME_TIMEOUT + MARGIN, "{took:?}");
    assert_healthy(&mut srv, c.local_addr(), "frame_timeout");

    // Before HELLO, from the moment of connecting: cut within the handshake window.
    let mut c = RawConn::connect(srv.addr()).unwrap();
    let (took, err) = trickle(&mut c, &hello_bytes("slow", b""), Duration::from_millis(300));
    assert_eq!((err.code, err.fatal), (ErrorCode::Timeout, true), "{err:?}");
    assert!(took <= HANDSHAKE_TIMEOUT.max(FRAME_TIMEOUT) + MARGIN, "{took:?}");
    assert_healthy(&mut srv, c.local_addr(), "closing connection");
}

#[test]
fn a_hello_sent_slowly_is_cut_at_handshake_timeout() {
    // handshake_timeout bounds the time to a complete HELLO from accept ("A new connection
    // must send HELLO within this time"), even when the HELLO's bytes keep trickling in: a
    // long frame_timeout must not extend the life of an unauthenticated connection.
    let mut srv = server(&SHORT.replace("frame_timeout = \"1s\"", "frame_timeout = \"5s\""));
    let mut c = RawConn::connect(srv.addr()).unwrap();
    let connected = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let (_, err) = trickle(&mut c, &hello_bytes("slow", b""), Duration::from_millis(300));
    let took = connected.elapsed();
    assert_eq!((err.code, err.fatal), (ErrorCode::Timeout, true), "{err:?}");
    assert!(took <= HANDSHAKE_TIMEOUT + MARGIN, "an unauthenticated connection lived {took:?}: {err:?}");
    assert_healthy(&mut srv, c.local_addr(), "closing connection");
}

/// Send `bytes` one at a time, `every` apart, until the server answers. Returns the time
/// from the first byte to the ERROR, and the ERROR; the connection must then close.
fn trickle(c: &mut RawConn, bytes: &[u8], every: Duration) -> (Duration, farcache_testkit::ErrorReply) {
    let start = Instant::now();
    for (i, b) in bytes.iter().enumerate() {
        if c.send(&[*b]).is_err() {
            break; // closed: the ERROR is waiting to be read
        }
        match c.read_frame(every) {
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
            Ok(Some((h, body))) => {
                let took = start.elapsed();
                let err = farcache_testkit::ErrorReply::parse(&h, &body)
                    .unwrap_or_else(|| panic!("answer to a partial frame after {i} bytes: opcode {}", h.opcode));
                assert!(c.expect_closed(PROMPT).unwrap().is_empty());
                return (took, err);
            }
            other => panic!("after {i} bytes: {other:?}"),
        }
    }
    let err = c.read_error(PROMPT).unwrap_or_else(|e| panic!("whole frame trickled in without a timeout: {e}"));
    (start.elapsed(), err)
}

#[test]
fn silent_and_idle_clients_are_closed() {
    let mut srv = server(SHORT);
    std::thread::scope(|s| {
        // Both wait concurrently: the file's wall time is the longer of the two.
        let addr = srv.addr();
        let silent = s.spawn(move || {
            let mut c = RawConn::connect(addr).unwrap();
            let t = Instant::now();
            let err = c.expect_fatal(ErrorCode::Timeout, HANDSHAKE_TIMEOUT + MARGIN + PROMPT).unwrap();
            (t.elapsed(), err, c.local_addr())
        });
        let idle = s.spawn(move || {
            let mut c = RawConn::connect(addr).unwrap();
            c.hello("idle", b"", PROMPT).unwrap();
            let t = Instant::now();
            let err = c.expect_fatal(ErrorCode::Timeout, IDLE_TIMEOUT + MARGIN + PROMPT).unwrap();
            (t.elapsed(), err, c.local_addr())
        });
        let (took, err, peer) = silent.join().unwrap();
        assert!(err.message.contains("handshake_timeout"), "{err:?}");
        assert!(
            took >= HANDSHAKE_TIMEOUT - Duration::from_millis(100) && took <= HANDSHAKE_TIMEOUT + MARGIN,
            "{took:?}"
        );
        assert_healthy(&mut srv, peer, "handshake_timeout");
        let (took, err, peer) = idle.join().unwrap();
        assert!(err.message.contains("idle_timeout"), "{err:?}");
        assert!(took >= IDLE_TIMEOUT - Duration::from_millis(100) && took <= IDLE_TIMEOUT + MARGIN, "{took:?}");
        assert_healthy(&mut srv, peer, "idle_timeout");
    });
}

#[test]
fn connections_over_the_limit_are_refused_busy() {
    let mut srv = server(SHORT);
    // Eight authenticated connections: HELLO_OK proves each holds a connection slot.
    let hogs: Vec<RawConn> = (0..8).map(|_| authed(&srv).0).collect();
    let mut extra = RawConn::connect(srv.addr()).unwrap();
    let err = extra.expect_fatal(ErrorCode::Busy, PROMPT).unwrap();
    assert_eq!(err.request_id, 0, "{err:?}");
    let peer = extra.local_addr();
    drop(hogs);
    // The slots come back as the server sees the hogs' EOFs.
    let mut last = String::new();
    let back = wait_until(PROMPT, Duration::from_millis(50), || match check_round_trip(srv.addr(), "good", b"", 1) {
        Ok(()) => true,
        Err(e) => {
            last = e;
            false
        }
    });
    assert!(back, "connection slots not released: {last}");
    assert_healthy(&mut srv, peer, "refusing connection");
}

#[test]
fn a_client_that_never_reads_is_disconnected_and_memory_stays_bounded() {
    let mut srv = server(SHORT);
    let (mut c, ok) = authed(&srv);
    // Fill max_batch full slots, so that each GET of them is answered with about a frame.
    let n = ok.max_batch as usize;
    let keys: Vec<Key> = (0..n as u64).map(|i| Key::new(0xFEED, i, 1)).collect();
    let value = vec![0xAB; ok.max_value_bytes as usize];
    let entries: Vec<(Key, &[u8])> = keys.iter().map(|k| (*k, &value[..])).collect();
    let mut put = Vec::new();
    encode_put(&mut put, 2, &entries);
    let (h, _) = c.request(&put, PROMPT).unwrap();
    assert_eq!(h.opcode, Opcode::PutOk as u8);

    let rss_before = srv.rss_bytes();
    let get = get_frame(3, &keys);
    c.socket().set_write_timeout(Some(Duration::from_millis(100))).unwrap();
    let start = Instant::now();
    let mut sent = 0usize;
    let mut rss_max = rss_before;
    let mut disconnected = None;
    // Bounded by time: the server must give up on us well within it.
    while start.elapsed() < FRAME_TIMEOUT * 8 {
        match c.send(&get) {
            Ok(()) => sent += 1,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => {
                disconnected = Some((start.elapsed(), e));
                break;
            }
        }
        rss_max = rss_max.max(srv.rss_bytes());
    }
    let (took, e) =
        disconnected.unwrap_or_else(|| panic!("still connected after {:?} ({sent} GETs sent)", start.elapsed()));
    eprintln!("never-reading client: {sent} GETs sent, cut after {took:?} ({e}); RSS {rss_before} -> max {rss_max}");
    // write_timeout (1 s) after the socket buffers filled, plus scheduling.
    assert!(took <= Duration::from_secs(1) + MARGIN + Duration::from_secs(2), "{took:?}");
    assert!(rss_max <= rss_before + (16 << 20), "RSS grew from {rss_before} to {rss_max}");
    assert_healthy(&mut srv, c.local_addr(), "did not read its responses");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_connections_do_not_disturb_a_good_client() {
    const HOSTILE: u64 = 8;
    const GOOD_OPS: u64 = 500;
    let mut srv = server(&SHORT.replace("max_connections = 8", "max_connections = 32"));
    let addr = srv.addr();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hostile: Vec<_> = (0..HOSTILE)
        .map(|h| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(0xBAD0 + h);
                let start = Instant::now();
                let mut rounds = 0u64;
                // Bounded: two seconds or 400 connections, whichever comes first, and on
                // until the good client is done (but never past 20 s).
                while rounds < 400
                    && (start.elapsed() < Duration::from_secs(2) || !stop.load(Ordering::Relaxed))
                    && start.elapsed() < Duration::from_secs(20)
                {
                    rounds += 1;
                    let Ok(mut c) = RawConn::connect(addr) else {
                        continue;
                    };
                    let len = 1 + rng.below(200) as usize;
                    let junk = rng.bytes(len);
                    let _ = match rng.below(5) {
                        0 => c.send(&junk),
                        1 => c.send(&hello_bytes("evil", b"")).and_then(|_| c.send(&junk)),
                        2 => c.send(&hello_bytes("evil", b"")).and_then(|_| c.send(&frame(0x42, 0, 9, &junk))),
                        3 => c.send(&hello_bytes("evil", b"")[..7]),
                        _ => Ok(()),
                    };
                    let _ = c.read_frame(Duration::from_millis(20));
                }
                rounds
            })
        })
        .collect();

    let mut cfg = ClientConfig::new(addr, "good");
    cfg.connect_timeout = Duration::from_secs(5);
    cfg.request_timeout = Duration::from_secs(10);
    let good = Client::connect(cfg).await.unwrap();
    let mut rng = Rng::new(42);
    let mut model: std::collections::HashMap<u64, Vec<u8>> = Default::default();
    for op in 0..GOOD_OPS {
        let i = rng.below(50);
        let k = Key::new(0x600D, i, 1);
        match rng.below(3) {
            0 => {
                let len = rng.below(4097) as usize;
                let v = rng.bytes(len);
                assert_eq!(good.put(&[(k, &v[..])]).await.unwrap(), vec![PutStatus::Stored], "op {op}");
                model.insert(i, v);
            }
            1 => {
                let got = good.get(&[k]).await.unwrap();
                assert_eq!(got[0].as_deref(), model.get(&i).map(|v| &v[..]), "op {op} key {i}");
            }
            _ => {
                let want = if model.remove(&i).is_some() { DelStatus::Removed } else { DelStatus::Absent };
                assert_eq!(good.del(&[k]).await.unwrap(), vec![want], "op {op} key {i}");
            }
        }
    }
    // Asked now, not after the hostile threads wind down: they run for at least 2 s, and a
    // good client that finished its operations sooner would sit idle past the server's
    // idle_timeout (2 s) and be closed for that, as it should be.
    good.ping().await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let rounds: u64 = hostile.into_iter().map(|h| h.join().expect("hostile thread")).sum();
    assert!(rounds >= HOSTILE, "hostile threads did not run");
    let closed_for_cause = srv.count_stderr_lines(|l| l.contains("closing connection"));
    eprintln!("{rounds} hostile connections, {closed_for_cause} closed for cause, {GOOD_OPS} good ops verified");
    assert!(closed_for_cause > 0, "no hostile connection was logged");
    assert!(srv.is_alive());
    check_round_trip(addr, "good", b"", 7).unwrap();
}
