//! Whatever bytes a server sends, the client answers with a value or an error, in bounded
//! time, and none of its tasks panics. Its own test binary, because it watches for panics
//! with a process-wide hook.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::Duration;

use common::*;
use farcache_client::{Client, ClientError};
use farcache_wire::*;
use tokio::io::AsyncWriteExt;

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

/// xorshift64*: deterministic, so a failure names a reproducible case.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A valid answer to GET `id` of one key, for mutation.
fn valid_values(id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = ValuesWriter::begin(&mut out, id, 1);
    w.hit(&mut out, b"block");
    w.finish(&mut out);
    out
}

/// What the server sends in reply to one GET: random bytes, a valid frame with a few bytes
/// flipped, a valid frame cut short, or a well-framed header (any response opcode, this
/// request's id) over a random body.
fn hostile_reply(rng: &mut Rng, id: u64) -> Vec<u8> {
    match rng.below(4) {
        3 => {
            const OPS: [u8; 8] = [0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0xff, 0x42];
            let body: Vec<u8> = (0..rng.below(24)).map(|_| [0, 1, 2, rng.next() as u8][rng.below(4)]).collect();
            let mut f = ((HEADER_BYTES - 4 + body.len()) as u32).to_le_bytes().to_vec();
            f.extend_from_slice(&[OPS[rng.below(OPS.len())], [0, 1][rng.below(2)], 0, 0]);
            f.extend_from_slice(&id.to_le_bytes());
            f.extend_from_slice(&body);
            f
        }
        0 => (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
        1 => {
            let mut f = valid_values(id);
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(f.len());
                f[i] ^= 1 << rng.below(8);
            }
            f
        }
        _ => {
            let f = valid_values(id);
            f[..rng.below(f.len())].to_vec()
        }
    }
}

#[tokio::test]
async fn random_and_mutated_answers_never_panic_or_hang() {
    count_panics();
    bounded(async {
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        let (mut values, mut errors) = (0, 0);
        for case in 0..200 {
            let mut case_rng = Rng(rng.next() | 1);
            let hang_up = rng.below(2) == 0;
            let (addr, _) = serve_one(move |mut s| async move {
                accept_hello(&mut s, &HelloOk { max_frame_bytes: 64 << 10, ..hello_ok() }).await;
                let Some((h, _)) = read_frame(&mut s, 1 << 20).await else {
                    return;
                };
                let _ = s.write_all(&hostile_reply(&mut case_rng, h.request_id)).await;
                if !hang_up {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            })
            .await;
            let mut cfg = config(addr);
            cfg.request_timeout = Duration::from_millis(100);
            let client = Client::connect(cfg).await.unwrap();
            match client.get(&[key(1)]).await {
                Ok(v) => {
                    assert_eq!(v.len(), 1, "case {case}: one answer per key");
                    values += 1;
                }
                Err(
                    ClientError::Protocol(_)
                    | ClientError::Io(_)
                    | ClientError::Closed
                    | ClientError::Timeout
                    | ClientError::Server { .. }
                    | ClientError::Busy(_)
                    | ClientError::AuthFailed(_)
                    | ClientError::UnsupportedVersion(_),
                ) => errors += 1,
                Err(e) => panic!("case {case}: unexpected {e:?}"),
            }
            client.close();
            client.wait_closed().await;
        }
        assert!(errors > 150, "most hostile answers are errors ({values} values, {errors} errors)");
    })
    .await;
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a client task panicked");
}
