//! The client against servers that misbehave: every misbehaviour must become an error for
//! the caller, promptly, never a panic, a hang, or a value that belongs to another request.

mod common;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use farcache_client::{Client, ClientError};
use farcache_wire::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A server that shakes hands, reads one request and answers it with `reply(request_id)`,
/// then keeps the connection open until the client goes away.
async fn answer_once_with(reply: impl FnOnce(u64) -> Vec<u8> + Send + 'static) -> SocketAddr {
    let (addr, _) = serve_one(move |mut s| async move {
        accept_hello(&mut s, &hello_ok()).await;
        let (h, _) = read_frame(&mut s, 1 << 20).await.expect("a request");
        s.write_all(&reply(h.request_id)).await.unwrap();
        while read_frame(&mut s, 1 << 20).await.is_some() {}
    })
    .await;
    addr
}

fn protocol_error_containing(r: Result<impl std::fmt::Debug, ClientError>, what: &str) {
    match r {
        Err(ClientError::Protocol(m)) => assert!(m.contains(what), "{m:?} should mention {what:?}"),
        other => panic!("expected a protocol error about {what:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn values_with_the_wrong_entry_count_close_the_connection() {
    bounded(async {
        let addr = answer_once_with(|id| {
            let mut out = Vec::new();
            let mut w = ValuesWriter::begin(&mut out, id, 1);
            w.hit(&mut out, b"not yours");
            w.finish(&mut out);
            out
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        protocol_error_containing(client.get(&[key(1), key(2)]).await, "1 entries for a request of 2");
        assert!(client.is_closed());
        assert!(matches!(client.get(&[key(1)]).await, Err(ClientError::Closed)));
        client.wait_closed().await;
    })
    .await
}

#[tokio::test]
async fn an_answer_of_the_wrong_kind_is_a_protocol_error() {
    bounded(async {
        let addr = answer_once_with(|id| {
            let mut out = Vec::new();
            encode_statuses(&mut out, Opcode::DelOk, id, &[1]);
            out
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        protocol_error_containing(client.get(&[key(1)]).await, "DEL_OK");
        assert!(client.is_closed());
    })
    .await
}

#[tokio::test]
async fn an_unknown_opcode_is_a_protocol_error() {
    bounded(async {
        let addr = answer_once_with(|id| {
            let mut out = Vec::new();
            let w = FrameWriter::begin(&mut out, Opcode::Pong, 0, id);
            w.finish(&mut out);
            out[4] = 0x42;
            out
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        protocol_error_containing(client.ping().await, "unknown opcode 0x42");
        assert!(client.is_closed());
    })
    .await
}

#[tokio::test]
async fn a_truncated_frame_then_eof_is_an_io_error() {
    bounded(async {
        let (addr, _) = serve_one(|mut s| async move {
            accept_hello(&mut s, &hello_ok()).await;
            let (h, _) = read_frame(&mut s, 1 << 20).await.unwrap();
            let mut out = Vec::new();
            encode_raw(&mut out, Opcode::StatsOk, h.request_id, b"{\"blocks\":0}");
            s.write_all(&out[..out.len() - 3]).await.unwrap();
            // Dropping the stream closes it.
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        match client.stats().await {
            Err(ClientError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{other:?}"),
        }
        assert!(client.is_closed());
        client.wait_closed().await;
    })
    .await
}

#[tokio::test]
async fn an_oversized_length_prefix_is_refused_before_its_body() {
    bounded(async {
        let (addr, _) = serve_one(|mut s| async move {
            accept_hello(&mut s, &hello_ok()).await;
            let _ = read_frame(&mut s, 1 << 20).await;
            // Announce 4 GiB and send nothing more: the client must not wait for the body.
            s.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
        })
        .await;
        let mut cfg = config(addr);
        cfg.request_timeout = Duration::from_secs(10);
        let client = Client::connect(cfg).await.unwrap();
        let started = tokio::time::Instant::now();
        protocol_error_containing(client.ping().await, "exceeds the limit");
        assert!(started.elapsed() < Duration::from_secs(5), "failed at the prefix, not the timeout");
        assert!(client.is_closed());
    })
    .await
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_and_frees_the_slot() {
    bounded(async {
        // One in-flight slot. The server answers the first request only after the client gave
        // up on it, then answers the second one properly: the late answer must be dropped and
        // the second request must get its own value.
        let (addr, _) = serve_one(|mut s| async move {
            accept_hello(&mut s, &HelloOk { max_inflight: 1, ..hello_ok() }).await;
            let (first, _) = read_frame(&mut s, 1 << 20).await.unwrap();
            let (second, _) = read_frame(&mut s, 1 << 20).await.unwrap();
            for (id, v) in [(first.request_id, &b"late"[..]), (second.request_id, &b"fresh"[..])] {
                let mut out = Vec::new();
                let mut w = ValuesWriter::begin(&mut out, id, 1);
                w.hit(&mut out, v);
                w.finish(&mut out);
                s.write_all(&out).await.unwrap();
            }
            while read_frame(&mut s, 1 << 20).await.is_some() {}
        })
        .await;
        let mut cfg = config(addr);
        cfg.request_timeout = Duration::from_millis(200);
        let client = Client::connect(cfg).await.unwrap();
        assert_eq!(client.inflight_limit(), 1);
        let started = tokio::time::Instant::now();
        assert!(matches!(client.get(&[key(1)]).await, Err(ClientError::Timeout)));
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(!client.is_closed(), "a timeout is not a broken connection");
        // The slot is free again, or this would time out waiting for it.
        let got = client.get(&[key(2)]).await.unwrap();
        assert_eq!(got[0].as_deref(), Some(&b"fresh"[..]));
        assert!(!client.is_closed());
    })
    .await
}

#[tokio::test]
async fn a_silent_server_times_out_every_request() {
    bounded(async {
        let (addr, _) = serve_one(|mut s| async move {
            accept_hello(&mut s, &hello_ok()).await;
            while read_frame(&mut s, 1 << 20).await.is_some() {}
        })
        .await;
        let mut cfg = config(addr);
        cfg.request_timeout = Duration::from_millis(100);
        cfg.max_inflight = 2;
        let client = Client::connect(cfg).await.unwrap();
        // More requests than slots: the ones waiting for a slot time out too.
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let c = client.clone();
                tokio::spawn(async move { c.ping().await })
            })
            .collect();
        for t in tasks {
            assert!(matches!(t.await.unwrap(), Err(ClientError::Timeout)));
        }
    })
    .await
}

#[tokio::test]
async fn a_fatal_error_reaches_every_waiter() {
    bounded(async {
        let (addr, _) = serve_one(|mut s| async move {
            accept_hello(&mut s, &hello_ok()).await;
            let _ = read_frame(&mut s, 1 << 20).await.unwrap();
            let _ = read_frame(&mut s, 1 << 20).await.unwrap();
            let mut out = Vec::new();
            encode_error(&mut out, 0, ErrorCode::ShuttingDown, true, "bye");
            s.write_all(&out).await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        let keys = [key(1)];
        let (a, b) = tokio::join!(client.get(&keys), client.ping());
        for r in [a.map(|_| ()), b.map(|_| ())] {
            match r {
                Err(ClientError::Server { code: ErrorCode::ShuttingDown, message }) => assert_eq!(message, "bye"),
                other => panic!("{other:?}"),
            }
        }
        assert!(client.is_closed());
        client.wait_closed().await;
    })
    .await
}

#[tokio::test]
async fn a_non_fatal_error_fails_one_request_only() {
    bounded(async {
        let (addr, _) = serve_one(|mut s| async move {
            accept_hello(&mut s, &hello_ok()).await;
            let (h, _) = read_frame(&mut s, 1 << 20).await.unwrap();
            let mut out = Vec::new();
            encode_error(&mut out, h.request_id, ErrorCode::BadFrame, false, "odd");
            encode_error(&mut out, 0, ErrorCode::Internal, false, "connection-level note");
            encode_error(&mut out, 1, ErrorCode::Internal, false, "late, for HELLO's id");
            s.write_all(&out).await.unwrap();
            let (h, body) = read_frame(&mut s, 1 << 20).await.unwrap();
            out.clear();
            encode_raw(&mut out, Opcode::Pong, h.request_id, &body);
            s.write_all(&out).await.unwrap();
            let (h, _) = read_frame(&mut s, 1 << 20).await.unwrap();
            out.clear();
            encode_error(&mut out, h.request_id, ErrorCode::Busy, false, "tenant full");
            s.write_all(&out).await.unwrap();
            while read_frame(&mut s, 1 << 20).await.is_some() {}
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        match client.get(&[key(1)]).await {
            Err(ClientError::Server { code: ErrorCode::BadFrame, message }) => assert_eq!(message, "odd"),
            other => panic!("{other:?}"),
        }
        client.ping().await.unwrap();
        assert!(matches!(client.stats().await, Err(ClientError::Busy(m)) if m == "tenant full"));
        assert!(!client.is_closed());
    })
    .await
}

#[tokio::test]
async fn an_answer_to_a_request_never_sent_is_a_protocol_error() {
    bounded(async {
        let addr = answer_once_with(|id| {
            let mut out = Vec::new();
            encode_raw(&mut out, Opcode::Pong, id + 1000, b"");
            out
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        protocol_error_containing(client.ping().await, "never sent");
        assert!(client.is_closed());
    })
    .await
}

#[tokio::test]
async fn a_pong_with_another_payload_is_a_protocol_error() {
    bounded(async {
        let addr = answer_once_with(|id| {
            let mut out = Vec::new();
            encode_raw(&mut out, Opcode::Pong, id, b"something else");
            out
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        protocol_error_containing(client.ping().await, "payload");
    })
    .await
}

#[tokio::test]
async fn nonzero_flags_on_an_answer_are_a_protocol_error() {
    bounded(async {
        let addr = answer_once_with(|id| {
            let mut out = Vec::new();
            encode_raw(&mut out, Opcode::StatsOk, id, b"{}");
            out[5] = 0x80;
            out
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        protocol_error_containing(client.stats().await, "flags");
    })
    .await
}

#[tokio::test]
async fn eof_fails_waiters_with_closed() {
    bounded(async {
        let (addr, _) = serve_one(|mut s| async move {
            accept_hello(&mut s, &hello_ok()).await;
            let _ = read_frame(&mut s, 1 << 20).await;
        })
        .await;
        let client = Client::connect(config(addr)).await.unwrap();
        assert!(matches!(client.get(&[key(1)]).await, Err(ClientError::Closed)));
        assert!(client.is_closed());
        client.wait_closed().await;
    })
    .await
}

async fn refuse_hello(code: ErrorCode, id: Option<u64>) -> Result<Client, ClientError> {
    let (addr, _) = serve_one(move |mut s| async move {
        let mut out = Vec::new();
        match id {
            // Busy comes right after accept, before the server read anything.
            None => encode_error(&mut out, 0, code, true, "refused"),
            Some(_) => {
                let (h, _) = read_frame(&mut s, HANDSHAKE_MAX_FRAME_BYTES).await.unwrap();
                encode_error(&mut out, h.request_id, code, true, "refused");
            }
        }
        s.write_all(&out).await.unwrap();
    })
    .await;
    Client::connect(config(addr)).await
}

#[tokio::test]
async fn handshake_refusals_are_distinct_errors() {
    bounded(async {
        assert!(matches!(refuse_hello(ErrorCode::AuthFailed, Some(1)).await, Err(ClientError::AuthFailed(m)) if m == "refused"));
        assert!(matches!(
            refuse_hello(ErrorCode::UnsupportedVersion, Some(1)).await,
            Err(ClientError::UnsupportedVersion(_))
        ));
        assert!(matches!(refuse_hello(ErrorCode::Busy, None).await, Err(ClientError::Busy(_))));
        assert!(matches!(
            refuse_hello(ErrorCode::HandshakeRequired, Some(1)).await,
            Err(ClientError::Server { code: ErrorCode::HandshakeRequired, .. })
        ));
    })
    .await
}

#[tokio::test]
async fn handshake_with_unusable_limits_is_refused() {
    bounded(async {
        let ok = HelloOk { max_frame_bytes: 1000, max_value_bytes: 4096, ..hello_ok() };
        let (addr, _) = serve_one(move |mut s| async move { accept_hello(&mut s, &ok).await }).await;
        protocol_error_containing(Client::connect(config(addr)).await, "cannot hold");
    })
    .await
}

#[tokio::test]
async fn handshake_with_a_hello_ok_for_another_id_is_refused() {
    bounded(async {
        let (addr, _) = serve_one(|mut s| async move {
            let _ = read_frame(&mut s, HANDSHAKE_MAX_FRAME_BYTES).await.unwrap();
            let mut out = Vec::new();
            encode_hello_ok(&mut out, 99, &hello_ok());
            s.write_all(&out).await.unwrap();
        })
        .await;
        protocol_error_containing(Client::connect(config(addr)).await, "answer to HELLO");
    })
    .await
}

#[tokio::test]
async fn a_server_silent_at_handshake_hits_the_connect_timeout() {
    bounded(async {
        let (addr, _) = serve_one(|s: TcpStream| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(s);
        })
        .await;
        let mut cfg = config(addr);
        cfg.connect_timeout = Duration::from_millis(200);
        assert!(matches!(Client::connect(cfg).await, Err(ClientError::Timeout)));
    })
    .await
}

#[tokio::test]
async fn a_server_that_hangs_up_at_handshake_is_a_connect_error() {
    bounded(async {
        let (addr, _) = serve_one(|s: TcpStream| async move { drop(s) }).await;
        assert!(matches!(Client::connect(config(addr)).await, Err(ClientError::Connect(_))));
    })
    .await
}

#[tokio::test]
async fn nobody_listening_is_a_connect_error() {
    bounded(async {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        assert!(matches!(Client::connect(config(addr)).await, Err(ClientError::Connect(_))));
    })
    .await
}

#[tokio::test]
async fn an_invalid_config_fails_before_connecting() {
    bounded(async {
        let (addr, server) = serve_one(|_s: TcpStream| async move {}).await;
        let mut cfg = config(addr);
        cfg.tenant = "no spaces allowed".into();
        assert!(matches!(Client::connect(cfg).await, Err(ClientError::Config(_))));
        assert!(!server.is_finished(), "no connection was made");
    })
    .await
}
