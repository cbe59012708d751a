//! A fake farcache server for client tests: it speaks the real protocol through
//! farcache-wire, keeps blocks in a map, and records what it saw. Hostile tests script
//! their own server with `serve_one` and the frame helpers.

#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use farcache_client::ClientConfig;
use farcache_wire::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Every test body runs under this bound: a hang is a failure, not a stuck CI job.
pub const TEST_BOUND: Duration = Duration::from_secs(20);

pub async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_BOUND, f).await.expect("test hung")
}

pub fn hello_ok() -> HelloOk {
    HelloOk {
        version: PROTOCOL_VERSION_MAX,
        flags: 0,
        max_frame_bytes: 1 << 20,
        max_batch: 256,
        max_inflight: 128,
        max_value_bytes: 4096,
        instance_id: 0xfeed_f00d,
    }
}

/// Short timeouts, so that tests of timeouts are quick.
pub fn config(addr: SocketAddr) -> ClientConfig {
    let mut cfg = ClientConfig::new(addr, "db1");
    cfg.secret = b"pw".to_vec();
    cfg.connect_timeout = Duration::from_secs(2);
    cfg.request_timeout = Duration::from_secs(2);
    cfg
}

pub fn key(i: u64) -> Key {
    Key::new(0xabc0 + i as u128, i, 1)
}

/// Read one whole frame: header and body. `None` at a clean EOF.
pub async fn read_frame(s: &mut TcpStream, max_frame_bytes: u32) -> Option<(Header, Vec<u8>)> {
    let mut head = [0u8; HEADER_BYTES];
    match s.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
        Err(e) => panic!("fake server read: {e}"),
    }
    let h = Header::decode(&head, max_frame_bytes).expect("client sent a bad header").unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).await.expect("client sent a truncated frame");
    Some((h, body))
}

/// Expect HELLO and answer `ok`. Returns the HELLO's tenant and secret.
pub async fn accept_hello(s: &mut TcpStream, ok: &HelloOk) -> (String, Vec<u8>) {
    let (h, body) = read_frame(s, HANDSHAKE_MAX_FRAME_BYTES).await.expect("HELLO");
    let hello = match decode_request(&h, &body, &Limits::HANDSHAKE).expect("valid HELLO") {
        Request::Hello(hello) => hello,
        other => panic!("expected HELLO, got {other:?}"),
    };
    assert_eq!((hello.min_version, hello.max_version), (PROTOCOL_VERSION_MIN, PROTOCOL_VERSION_MAX));
    let mut out = Vec::new();
    encode_hello_ok(&mut out, h.request_id, ok);
    s.write_all(&out).await.unwrap();
    (hello.tenant.to_owned(), hello.secret.to_vec())
}

/// Accept one connection and hand it to `script`. The returned handle yields the script's
/// result, so a test can check what the server saw.
pub async fn serve_one<F, Fut, T>(script: F) -> (SocketAddr, tokio::task::JoinHandle<T>)
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        script(s).await
    });
    (addr, handle)
}

/// How the map server sends its answers.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// Answer each request as soon as it is read.
    Immediate,
    /// Answer each request after this delay, from its own task (answers may reorder).
    Delayed(Duration),
    /// Gather this many answers, then send them last first.
    Reversed(usize),
}

/// What the map server saw.
#[derive(Default, Debug)]
pub struct Seen {
    /// Requests read and not yet answered.
    pub inflight: AtomicUsize,
    pub max_inflight: AtomicUsize,
    /// Frames per request opcode.
    pub frames: Mutex<HashMap<u8, usize>>,
    /// Entries in every batched request, in arrival order.
    pub batch_sizes: Mutex<Vec<usize>>,
    /// Request ids in the order the answers were written.
    pub answer_order: Mutex<Vec<u64>>,
    pub tenants: Mutex<Vec<String>>,
}

impl Seen {
    pub fn frames(&self, op: Opcode) -> usize {
        *self.frames.lock().unwrap().get(&(op as u8)).unwrap_or(&0)
    }
}

pub type Store = Arc<Mutex<HashMap<Key, Vec<u8>>>>;

/// A well-behaved server over an in-memory map, for any number of connections.
pub struct MapServer {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    pub store: Store,
}

pub async fn map_server(ok: HelloOk, mode: Mode) -> MapServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let store: Store = Arc::default();
    let (seen2, store2) = (seen.clone(), store.clone());
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(serve_map(s, ok, mode, seen2.clone(), store2.clone()));
        }
    });
    MapServer { addr, seen, store }
}

async fn serve_map(mut s: TcpStream, ok: HelloOk, mode: Mode, seen: Arc<Seen>, store: Store) {
    let (tenant, _) = accept_hello(&mut s, &ok).await;
    seen.tenants.lock().unwrap().push(tenant);
    let (mut rd, mut wr) = s.into_split();
    // Answers go through one writer task; the channel is bounded by the server's in-flight
    // limit, as a real server's would be.
    let (tx, mut rx) = mpsc::channel::<(u64, Vec<u8>)>(ok.max_inflight as usize);
    let seen_w = seen.clone();
    let writer = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((id, frame)) = rx.recv().await {
            held.push((id, frame));
            let n = if let Mode::Reversed(n) = mode { n } else { 1 };
            if held.len() < n {
                continue;
            }
            for (id, frame) in held.drain(..).rev() {
                seen_w.inflight.fetch_sub(1, Ordering::SeqCst);
                seen_w.answer_order.lock().unwrap().push(id);
                if wr.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
    });
    let limits = ok.limits();
    loop {
        let mut head = [0u8; HEADER_BYTES];
        if rd.read_exact(&mut head).await.is_err() {
            break;
        }
        let h = Header::decode(&head, limits.max_frame_bytes).expect("client header").unwrap();
        let mut body = vec![0u8; h.body_len as usize];
        rd.read_exact(&mut body).await.expect("client body");
        let now = seen.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        seen.max_inflight.fetch_max(now, Ordering::SeqCst);
        *seen.frames.lock().unwrap().entry(h.opcode).or_default() += 1;
        let req = decode_request(&h, &body, &limits).expect("client sent a valid request");
        let frame = answer(&store, &seen, h.request_id, req);
        match mode {
            Mode::Delayed(d) => {
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    let _ = tx.send((h.request_id, frame)).await;
                });
            }
            _ => {
                if tx.send((h.request_id, frame)).await.is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

fn answer(store: &Store, seen: &Seen, id: u64, req: Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut map = store.lock().unwrap();
    match req {
        Request::Get(keys) => {
            seen.batch_sizes.lock().unwrap().push(keys.len());
            let mut w = ValuesWriter::begin(&mut out, id, keys.len());
            for k in keys.iter() {
                match map.get(&k) {
                    Some(v) => w.hit(&mut out, v),
                    None => w.miss(&mut out),
                }
            }
            w.finish(&mut out);
        }
        Request::Put(entries) => {
            seen.batch_sizes.lock().unwrap().push(entries.len());
            let statuses: Vec<u8> = entries
                .iter()
                .map(|(k, v)| {
                    map.insert(k, v.to_vec());
                    PutStatus::Stored as u8
                })
                .collect();
            encode_statuses(&mut out, Opcode::PutOk, id, &statuses);
        }
        Request::Del(keys) => {
            seen.batch_sizes.lock().unwrap().push(keys.len());
            let statuses: Vec<u8> = keys
                .iter()
                .map(|k| if map.remove(&k).is_some() { DelStatus::Removed as u8 } else { DelStatus::Absent as u8 })
                .collect();
            encode_statuses(&mut out, Opcode::DelOk, id, &statuses);
        }
        Request::Stats => {
            let json = format!("{{\"blocks\":{}}}", map.len());
            encode_raw(&mut out, Opcode::StatsOk, id, json.as_bytes());
        }
        Request::Ping(payload) => encode_raw(&mut out, Opcode::Pong, id, payload),
        Request::Hello(_) => encode_error(&mut out, id, ErrorCode::HandshakeRequired, true, "second HELLO"),
    }
    out
}
