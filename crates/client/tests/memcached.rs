//! The memcached client against a real memcached, and against memcacheds that lie, break
//! the meta protocol, hang or are not memcached at all: every misbehaviour is an error for
//! the caller (or a miss), promptly, never a panic, a hang, or another key's value.

use std::net::SocketAddr;
use std::time::Duration;

use farcache_client::{ClientConfig, ClientError, DelStatus, Key, LenderClient, LenderProtocol, McClient, PutStatus};
use farcache_testkit::MemcachedProcess;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

fn cfg(addr: SocketAddr, tenant: &str) -> ClientConfig {
    let mut c = ClientConfig::new(addr, tenant);
    c.request_timeout = Duration::from_millis(500);
    c.connect_timeout = Duration::from_secs(2);
    c
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f).await.expect("test took more than 20 s")
}

fn block(seed: u64) -> Vec<u8> {
    (0..4136u64).map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(0x9e37)) as u8).collect()
}

#[tokio::test]
async fn real_memcached_round_trips_byte_for_byte_and_keeps_tenants_apart() {
    let mc = MemcachedProcess::start(64);
    bounded(async {
        let a = McClient::connect(&cfg(mc.addr(), "tenant-a")).await.unwrap();
        let b = McClient::connect(&cfg(mc.addr(), "tenant-b")).await.unwrap();
        assert!(a.info().version.starts_with("1.6"), "{:?}", a.info());
        assert_eq!(a.info().instance_id, b.info().instance_id, "one memcached, one instance");
        assert!(a.info().max_value_bytes >= 4136);
        // 600 keys: more than one request (MAX_KEYS_PER_REQUEST), pipelined.
        let keys: Vec<Key> = (0..600u64).map(|i| Key::new(7, i, 1)).collect();
        let values: Vec<Vec<u8>> = (0..600u64).map(block).collect();
        let entries: Vec<(Key, &[u8])> = keys.iter().zip(&values).map(|(k, v)| (*k, &v[..])).collect();
        let st = a.put(&entries).await.unwrap();
        assert!(st.iter().all(|s| *s == PutStatus::Stored), "{st:?}");
        let got = a.get(&keys).await.unwrap();
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g.as_deref(), Some(&values[i][..]), "key {i}");
        }
        // Another tenant sees none of them; another epoch is another key.
        assert!(b.get(&keys).await.unwrap().iter().all(Option::is_none));
        assert_eq!(a.get(&[Key::new(7, 0, 2)]).await.unwrap(), vec![None]);
        // Many tasks at once on one connection: each gets its own values.
        let mut tasks = Vec::new();
        for t in 0..16u64 {
            let a = a.clone();
            let (keys, values) = (keys.clone(), values.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..20u64 {
                    let i = ((t * 37 + round * 11) % 600) as usize;
                    let got = a.get(&keys[i..i + 1]).await.unwrap();
                    assert_eq!(got[0].as_deref(), Some(&values[i][..]));
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let del = a.del(&keys[..2]).await.unwrap();
        assert_eq!(del, vec![DelStatus::Removed, DelStatus::Removed]);
        assert_eq!(a.del(&keys[..1]).await.unwrap(), vec![DelStatus::Absent]);
        assert_eq!(a.get(&keys[..3]).await.unwrap()[..2], [None, None]);
        // Too large for its slabs: refused before sending, the rest stored.
        let huge = vec![1u8; 2 << 20];
        let st = a.put(&[(Key::new(8, 0, 1), &huge[..]), (Key::new(8, 1, 1), &values[0][..])]).await.unwrap();
        assert_eq!(st, vec![PutStatus::TooLarge, PutStatus::Stored]);
        // The same through the lender enum.
        let l = LenderClient::connect(LenderProtocol::Memcached, cfg(mc.addr(), "tenant-a")).await.unwrap();
        assert_eq!(l.get(&keys[5..6]).await.unwrap()[0].as_deref(), Some(&values[5][..]));
        assert_eq!(l.instance_id(), a.info().instance_id);
    })
    .await;
}

#[tokio::test]
async fn a_restarted_memcached_is_a_new_instance() {
    let mut mc = MemcachedProcess::start(16);
    let port = mc.addr().port();
    let first = bounded(McClient::connect(&cfg(mc.addr(), "t"))).await.unwrap();
    let id = first.info().instance_id;
    bounded(first.put(&[(Key::new(1, 1, 1), &b"x"[..])])).await.unwrap();
    mc.kill();
    // The connection breaks: the next request fails, it does not hang.
    let r = bounded(first.get(&[Key::new(1, 1, 1)])).await;
    assert!(r.is_err(), "{r:?}");
    assert!(first.is_closed());
    let mc = MemcachedProcess::start_on(port, 16);
    let second = bounded(McClient::connect(&cfg(mc.addr(), "t"))).await.unwrap();
    assert_ne!(second.info().instance_id, id);
    assert_eq!(bounded(second.get(&[Key::new(1, 1, 1)])).await.unwrap(), vec![None]);
}

/// A fake memcached: answers the handshake like 1.6.18, then for each request line calls
/// `answer(line)` and writes what it returns (values of `ms` are skipped).
async fn fake(answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move { serve(s, &*answer).await });
        }
    });
    addr
}

async fn serve(s: TcpStream, answer: &(dyn Fn(&str) -> Vec<u8> + Send + Sync)) {
    let (rd, mut wr) = s.into_split();
    let mut rd = BufReader::new(rd);
    let mut line = String::new();
    loop {
        line.clear();
        if rd.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let l = line.trim_end();
        let out = match l {
            "mn" => b"MN\r\n".to_vec(),
            "stats" => b"STAT pid 42\r\nSTAT uptime 10\r\nSTAT time 1000\r\nSTAT version 1.6.18\r\nEND\r\n".to_vec(),
            "stats settings" => b"STAT item_size_max 1048576\r\nEND\r\n".to_vec(),
            _ => {
                if let Some(rest) = l.strip_prefix("ms ") {
                    let n: usize = rest.split(' ').nth(1).unwrap().parse().unwrap();
                    let mut skip = vec![0u8; n + 2];
                    tokio::io::AsyncReadExt::read_exact(&mut rd, &mut skip).await.unwrap();
                }
                answer(l)
            }
        };
        if wr.write_all(&out).await.is_err() {
            return;
        }
    }
}

fn token(line: &str) -> &str {
    line.split(' ').find(|w| w.starts_with('O')).unwrap()
}

fn protocol_error(r: Result<impl std::fmt::Debug, ClientError>, what: &str) {
    match r {
        Err(ClientError::Protocol(m)) => assert!(m.contains(what), "{m:?} should mention {what:?}"),
        other => panic!("expected a protocol error about {what:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn hostile_memcached_answers_close_the_connection() {
    bounded(async {
        let k = [Key::new(1, 2, 3), Key::new(1, 3, 3)];
        // Answers in the wrong order (the tokens of the two keys swapped).
        let swapped = fake(|l| {
            let t: u32 = token(l)[1..].parse().unwrap();
            let other = if t % 2 == 1 { t + 1 } else { t - 1 };
            format!("VA 1 O{other}\r\nx\r\n").into_bytes()
        })
        .await;
        let c = McClient::connect(&cfg(swapped, "t")).await.unwrap();
        protocol_error(c.get(&k).await, "token");
        assert!(c.is_closed());

        // An answer with no token at all.
        let no_token = fake(|_| b"VA 1\r\nx\r\n".to_vec()).await;
        protocol_error(McClient::connect(&cfg(no_token, "t")).await.unwrap().get(&k[..1]).await, "token");

        // A value far larger than any the client accepts: refused before it is read.
        let huge = fake(|l| format!("VA 99999999 {}\r\n", token(l)).into_bytes()).await;
        protocol_error(McClient::connect(&cfg(huge, "t")).await.unwrap().get(&k[..1]).await, "bytes");

        // A value not followed by \r\n (lies about its length).
        let short = fake(|l| format!("VA 2 {}\r\nabcdef\r\n", token(l)).into_bytes()).await;
        protocol_error(McClient::connect(&cfg(short, "t")).await.unwrap().get(&k[..1]).await, "\\r\\n");

        // A code that does not fit the command (a set answered with a value).
        let wrong = fake(|l| format!("VA 1 {}\r\nx\r\n", token(l)).into_bytes()).await;
        protocol_error(
            McClient::connect(&cfg(wrong, "t")).await.unwrap().put(&[(k[0], &b"v"[..])]).await,
            "does not fit",
        );

        // CLIENT_ERROR: the client sent something memcached did not take; never ignored.
        let refuses = fake(|_| b"CLIENT_ERROR bad command line format\r\n".to_vec()).await;
        protocol_error(McClient::connect(&cfg(refuses, "t")).await.unwrap().del(&k[..1]).await, "refused");

        // An over-long line, and a bare \n.
        let long = fake(|_| [vec![b'E'; 5000], b"\r\n".to_vec()].concat()).await;
        protocol_error(McClient::connect(&cfg(long, "t")).await.unwrap().get(&k[..1]).await, "longer");
        let bare = fake(|l| format!("EN {}\n", token(l)).into_bytes()).await;
        protocol_error(McClient::connect(&cfg(bare, "t")).await.unwrap().get(&k[..1]).await, "bare");

        // A miss is a miss; SERVER_ERROR on a set is a failed store, the connection lives.
        let evicts = fake(|l| {
            if l.starts_with("ms") {
                b"SERVER_ERROR out of memory storing object\r\n".to_vec()
            } else {
                format!("EN {}\r\n", token(l)).into_bytes()
            }
        })
        .await;
        let c = McClient::connect(&cfg(evicts, "t")).await.unwrap();
        assert_eq!(c.get(&k).await.unwrap(), vec![None, None]);
        assert_eq!(c.put(&[(k[0], &b"v"[..])]).await.unwrap(), vec![PutStatus::NoSpace]);
        assert!(!c.is_closed());
    })
    .await;
}

#[tokio::test]
async fn a_hung_or_foreign_server_fails_in_bounded_time() {
    bounded(async {
        // Answers the handshake, then never answers a request: each request times out and
        // the slots it held stay bounded.
        let hung = fake(|_| Vec::new()).await;
        let c = McClient::connect(&cfg(hung, "t")).await.unwrap();
        let t0 = std::time::Instant::now();
        assert!(matches!(c.get(&[Key::new(1, 1, 1)]).await, Err(ClientError::Timeout)));
        assert!(t0.elapsed() < Duration::from_secs(2));

        // A server that does not speak the meta protocol (memcached < 1.6, or not memcached).
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let old = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let _ = s.write_all(b"ERROR\r\n").await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        match McClient::connect(&cfg(old, "t")).await {
            Err(ClientError::UnsupportedVersion(m)) => assert!(m.contains("1.6"), "{m}"),
            other => panic!("{other:?}"),
        }

        // A listener that never says anything: the connect timeout.
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let mut c = cfg(addr, "t");
        c.connect_timeout = Duration::from_millis(300);
        assert!(matches!(McClient::connect(&c).await, Err(ClientError::Timeout)));
        drop(silent);

        // A bad tenant name and TLS are configuration errors.
        assert!(matches!(McClient::connect(&cfg(hung, "bad tenant")).await, Err(ClientError::Config(_))));
    })
    .await;
}
