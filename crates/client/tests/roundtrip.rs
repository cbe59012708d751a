//! The client against a well-behaved fake server: handshake, every request, batching,
//! pipelining, out-of-order answers, the in-flight bound, close.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use farcache_client::{Client, ClientError, DelStatus, PutStatus};
use farcache_wire::{HelloOk, Opcode, HELLO_OK_FLAG_ADMIN};

#[tokio::test]
async fn handshake_reports_server_limits_and_sends_credentials() {
    bounded(async {
        let ok = HelloOk { flags: HELLO_OK_FLAG_ADMIN, max_inflight: 7, ..hello_ok() };
        let (addr, server) = serve_one(move |mut s| async move { accept_hello(&mut s, &ok).await }).await;
        let client = Client::connect(config(addr)).await.unwrap();
        assert_eq!(*client.hello(), ok);
        assert_eq!(client.inflight_limit(), 7, "min(config 64, server 7)");
        assert!(!client.is_closed());
        let (tenant, secret) = server.await.unwrap();
        assert_eq!((tenant.as_str(), secret.as_slice()), ("db1", &b"pw"[..]));
    })
    .await
}

#[tokio::test]
async fn get_put_del_stats_ping_roundtrip() {
    bounded(async {
        let server = map_server(hello_ok(), Mode::Immediate).await;
        let client = Client::connect(config(server.addr)).await.unwrap();

        let (a, b, c) = (key(1), key(2), key(3));
        assert_eq!(client.get(&[a, b]).await.unwrap(), vec![None, None]);
        let puts = client.put(&[(a, &b"alpha"[..]), (b, &[7u8; 4096][..])]).await.unwrap();
        assert_eq!(puts, vec![PutStatus::Stored, PutStatus::Stored]);
        let got = client.get(&[a, c, b]).await.unwrap();
        assert_eq!(got[0].as_deref(), Some(&b"alpha"[..]));
        assert_eq!(got[1], None);
        assert_eq!(got[2].as_deref(), Some(&[7u8; 4096][..]));
        assert_eq!(client.del(&[a, c]).await.unwrap(), vec![DelStatus::Removed, DelStatus::Absent]);
        assert_eq!(client.get(&[a]).await.unwrap(), vec![None]);
        assert_eq!(client.stats().await.unwrap(), "{\"blocks\":1}");
        let rtt = client.ping().await.unwrap();
        assert!(rtt < Duration::from_secs(2), "{rtt:?}");
        assert_eq!(server.seen.frames(Opcode::Ping), 1);

        // Empty batches send nothing (the wire has no empty batch).
        assert!(client.get(&[]).await.unwrap().is_empty());
        assert!(client.put(&[]).await.unwrap().is_empty());
        assert!(client.del(&[]).await.unwrap().is_empty());
        assert_eq!(server.seen.frames(Opcode::Get), 3);
    })
    .await
}

#[tokio::test]
async fn batches_over_max_batch_are_split() {
    bounded(async {
        let server = map_server(HelloOk { max_batch: 3, ..hello_ok() }, Mode::Immediate).await;
        let client = Client::connect(config(server.addr)).await.unwrap();
        let keys: Vec<_> = (0..10).map(key).collect();
        let values: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + i as usize]).collect();
        let entries: Vec<_> = keys.iter().zip(&values).map(|(k, v)| (*k, v.as_slice())).collect();
        assert_eq!(client.put(&entries).await.unwrap(), vec![PutStatus::Stored; 10]);
        let got = client.get(&keys).await.unwrap();
        for (g, v) in got.iter().zip(&values) {
            assert_eq!(g.as_deref(), Some(v.as_slice()));
        }
        assert_eq!(client.del(&keys).await.unwrap(), vec![DelStatus::Removed; 10]);
        assert_eq!(server.seen.frames(Opcode::Put), 4);
        assert_eq!(server.seen.frames(Opcode::Get), 4);
        assert_eq!(server.seen.frames(Opcode::Del), 4);
        assert_eq!(*server.seen.batch_sizes.lock().unwrap(), [3, 3, 3, 1].repeat(3));
    })
    .await
}

#[tokio::test]
async fn batches_over_max_frame_bytes_are_split() {
    bounded(async {
        // Room for 3 largest VALUES entries per frame: 20 + 3 * (5 + 4096) <= 12_400.
        let ok = HelloOk { max_frame_bytes: 12_400, max_value_bytes: 4096, ..hello_ok() };
        let server = map_server(ok, Mode::Immediate).await;
        let client = Client::connect(config(server.addr)).await.unwrap();
        let keys: Vec<_> = (0..7).map(key).collect();
        let block = [9u8; 4096];
        let entries: Vec<_> = keys.iter().map(|k| (*k, &block[..])).collect();
        assert_eq!(client.put(&entries).await.unwrap(), vec![PutStatus::Stored; 7]);
        let got = client.get(&keys).await.unwrap();
        assert!(got.iter().all(|g| g.as_deref() == Some(&block[..])));
        // PUT: 20 + n * (36 + 4096) <= 12_400 gives 2 per frame; GET: 3 per frame.
        assert_eq!(server.seen.frames(Opcode::Put), 4);
        assert_eq!(server.seen.frames(Opcode::Get), 3);
        assert_eq!(*server.seen.batch_sizes.lock().unwrap(), vec![2, 2, 2, 1, 3, 3, 1]);
    })
    .await
}

#[tokio::test]
async fn values_over_max_value_bytes_are_refused_locally() {
    bounded(async {
        let server = map_server(HelloOk { max_value_bytes: 100, ..hello_ok() }, Mode::Immediate).await;
        let client = Client::connect(config(server.addr)).await.unwrap();
        let big = [1u8; 101];
        let small = [2u8; 100];
        let got = client.put(&[(key(1), &big[..]), (key(2), &small[..]), (key(3), &big[..])]).await.unwrap();
        assert_eq!(got, vec![PutStatus::TooLarge, PutStatus::Stored, PutStatus::TooLarge]);
        assert_eq!(*server.seen.batch_sizes.lock().unwrap(), vec![1], "only the small value was sent");
        // Nothing to send at all: no frame.
        assert_eq!(client.put(&[(key(4), &big[..])]).await.unwrap(), vec![PutStatus::TooLarge]);
        assert_eq!(server.seen.frames(Opcode::Put), 1);
        assert!(!client.is_closed());
    })
    .await
}

#[tokio::test]
async fn answers_out_of_order_are_matched_by_id() {
    bounded(async {
        const N: usize = 8;
        let server = map_server(hello_ok(), Mode::Reversed(N)).await;
        for i in 0..N as u64 {
            server.store.lock().unwrap().insert(key(i), format!("value {i}").into_bytes());
        }
        let client = Client::connect(config(server.addr)).await.unwrap();
        let tasks: Vec<_> = (0..N as u64)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { (i, client.get(&[key(i)]).await) })
            })
            .collect();
        for t in tasks {
            let (i, got) = t.await.unwrap();
            assert_eq!(got.unwrap()[0].as_deref(), Some(format!("value {i}").as_bytes()));
        }
        let order = server.seen.answer_order.lock().unwrap().clone();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order.len(), N);
        assert_ne!(order, sorted, "the server really answered out of order");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_share_one_connection() {
    bounded(async {
        let server = map_server(hello_ok(), Mode::Immediate).await;
        let client = Client::connect(config(server.addr)).await.unwrap();
        let tasks: Vec<_> = (0..32u64)
            .map(|t| {
                let client = client.clone();
                tokio::spawn(async move {
                    for round in 0..40u64 {
                        let k = key(t * 1000 + round);
                        let v = format!("{t}/{round}").into_bytes();
                        assert_eq!(client.put(&[(k, &v[..])]).await.unwrap(), vec![PutStatus::Stored]);
                        let got = client.get(&[k, key(t * 1000 + round + 1)]).await.unwrap();
                        assert_eq!(got[0].as_deref(), Some(&v[..]), "task {t} round {round}");
                        assert_eq!(got[1], None);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(server.seen.frames(Opcode::Put), 32 * 40);
        assert_eq!(server.seen.frames(Opcode::Get), 32 * 40);
        assert!(server.seen.max_inflight.load(Ordering::SeqCst) > 1, "requests were pipelined");
    })
    .await
}

async fn max_inflight_seen(server_limit: u16, client_limit: u16) -> (usize, usize) {
    let ok = HelloOk { max_inflight: server_limit, ..hello_ok() };
    let server = map_server(ok, Mode::Delayed(Duration::from_millis(20))).await;
    let mut cfg = config(server.addr);
    cfg.max_inflight = client_limit;
    let client = Client::connect(cfg).await.unwrap();
    let tasks: Vec<_> = (0..24)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                for _ in 0..3 {
                    client.ping().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(server.seen.frames(Opcode::Ping), 72);
    (client.inflight_limit(), server.seen.max_inflight.load(Ordering::SeqCst))
}

#[tokio::test]
async fn inflight_bound_is_the_servers_when_smaller() {
    bounded(async {
        let (limit, seen) = max_inflight_seen(4, 64).await;
        assert_eq!(limit, 4);
        assert_eq!(seen, 4, "the server saw at most 4 at once, and the client used all 4");
    })
    .await
}

#[tokio::test]
async fn inflight_bound_is_the_clients_when_smaller() {
    bounded(async {
        let (limit, seen) = max_inflight_seen(64, 3).await;
        assert_eq!(limit, 3);
        assert_eq!(seen, 3);
    })
    .await
}

#[tokio::test]
async fn a_batch_larger_than_the_inflight_bound_still_completes() {
    bounded(async {
        // 40 keys in frames of 2 with 3 slots: the client must free slots as answers arrive.
        let ok = HelloOk { max_batch: 2, max_inflight: 3, ..hello_ok() };
        let server = map_server(ok, Mode::Delayed(Duration::from_millis(5))).await;
        let client = Client::connect(config(server.addr)).await.unwrap();
        let keys: Vec<_> = (0..40).map(key).collect();
        assert_eq!(client.get(&keys).await.unwrap().len(), 40);
        assert_eq!(server.seen.frames(Opcode::Get), 20);
        assert!(server.seen.max_inflight.load(Ordering::SeqCst) <= 3);
    })
    .await
}

#[tokio::test]
async fn close_fails_waiters_and_releases_the_socket() {
    bounded(async {
        // The server reads one request, never answers, then reports when the client hangs up.
        let (addr, server) = serve_one(|mut s| async move {
            accept_hello(&mut s, &hello_ok()).await;
            let first = read_frame(&mut s, 1 << 20).await.expect("a request");
            let eof = read_frame(&mut s, 1 << 20).await;
            (first.0.opcode, eof.is_none())
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        let c2 = client.clone();
        let waiting = tokio::spawn(async move { c2.get(&[key(1)]).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.close();
        assert!(client.is_closed());
        assert!(matches!(waiting.await.unwrap(), Err(ClientError::Closed)));
        client.wait_closed().await;
        assert!(matches!(client.ping().await, Err(ClientError::Closed)));
        assert_eq!(server.await.unwrap(), (Opcode::Get as u8, true), "the server saw EOF");
    })
    .await
}

#[tokio::test]
async fn dropping_the_last_clone_closes_the_connection() {
    bounded(async {
        let (addr, server) = serve_one(|mut s| async move {
            accept_hello(&mut s, &hello_ok()).await;
            read_frame(&mut s, 1 << 20).await.is_none()
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        let clone = client.clone();
        drop(client);
        assert!(!clone.is_closed(), "a clone keeps it open");
        drop(clone);
        assert!(server.await.unwrap(), "the server saw EOF");
    })
    .await
}
