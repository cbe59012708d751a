//! A hostile lender behind a real FUSE mount with block encryption on (`--key-file`).
//!
//! The lender is a test double speaking the real protocol (farcache-wire's encoders and
//! decoders). It stores every fill honestly, then lies or misbehaves when asked for blocks:
//! another key's value, an older version of the same block, random bytes of the right
//! length, one flipped bit, malformed (truncated) frames, a huge length prefix, answers
//! after 2 s, or a connection closed mid-frame. For every mode, every O_DIRECT 4 KiB read
//! through the mount returns exactly the backing file's bytes with no I/O error, and the
//! mount stays up. For the lying modes, `farcache stats MNT --json` must show
//! `remote.auth_failures > 0`: the lies were served and caught, not merely avoided.
//!
//! Every mode runs twice: against a farcache lender, and against a memcached lender
//! (`--server memcached://...`) — the same double speaking memcached's meta protocol, with the
//! same lies and the protocol's own ways of breaking (a value shorter than its `VA` line says,
//! a length of 4 GiB, late answers, a connection closed inside a value).

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::net::SocketAddr;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use farcache_testkit::{fuse_mounted, pattern, run_with_timeout, DirectReader, MountProcess, Rng, LENDERS_FIRST};
use farcache_wire::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// How the hostile lender answers GET.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The value stored under another key (another block of a file).
    OtherKey,
    /// The value stored under an older version of the same block.
    OldVersion,
    /// Random bytes as long as the stored value.
    Random,
    /// The stored value with one random bit flipped.
    FlipBit,
    /// A VALUES frame whose value's length prefix runs past the frame's end.
    TruncatedFrame,
    /// A header announcing a frame of about 4 GiB.
    HugeLength,
    /// The honest answer, 2 s late.
    Slow,
    /// Half the honest answer, then the connection closed.
    CloseMidFrame,
}

impl Mode {
    fn lies(self) -> bool {
        matches!(self, Mode::OtherKey | Mode::OldVersion | Mode::Random | Mode::FlipBit)
    }
}

/// Which protocol the hostile lender speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Speaks {
    Farcache,
    Memcached,
}

type Store = Arc<Mutex<HashMap<Key, Vec<u8>>>>;

fn hello_ok() -> HelloOk {
    HelloOk {
        version: PROTOCOL_VERSION_MAX,
        flags: 0,
        max_frame_bytes: 1 << 20,
        max_batch: 64,
        max_inflight: 64,
        max_value_bytes: 8192,
        instance_id: 0x0bad_1e4d,
    }
}

/// Start the hostile lender on a runtime of its own; returns its address and its store.
fn start_lender(rt: &tokio::runtime::Runtime, mode: Mode, speaks: Speaks) -> (SocketAddr, Store) {
    let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let store: Store = Arc::default();
    let s = store.clone();
    rt.spawn(async move {
        let mut seed = 1;
        while let Ok((conn, _)) = listener.accept().await {
            seed += 1;
            match speaks {
                Speaks::Farcache => tokio::spawn(serve(conn, mode, s.clone(), Rng::new(seed))),
                Speaks::Memcached => tokio::spawn(serve_memcached(conn, mode, s.clone(), Rng::new(seed))),
            };
        }
    });
    (addr, store)
}

async fn read_frame(s: &mut TcpStream, max: u32) -> Option<(Header, Vec<u8>)> {
    let mut head = [0u8; HEADER_BYTES];
    s.read_exact(&mut head).await.ok()?;
    let h = Header::decode(&head, max).ok()??;
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).await.ok()?;
    Some((h, body))
}

async fn serve(mut s: TcpStream, mode: Mode, store: Store, mut rng: Rng) {
    let ok = hello_ok();
    let Some((h, _)) = read_frame(&mut s, HANDSHAKE_MAX_FRAME_BYTES).await else { return };
    let mut out = Vec::new();
    encode_hello_ok(&mut out, h.request_id, &ok);
    if s.write_all(&out).await.is_err() {
        return;
    }
    let limits = ok.limits();
    let (mut rd, wr) = s.into_split();
    let wr = Arc::new(tokio::sync::Mutex::new(wr));
    loop {
        let mut head = [0u8; HEADER_BYTES];
        if rd.read_exact(&mut head).await.is_err() {
            return;
        }
        let Ok(Some(h)) = Header::decode(&head, limits.max_frame_bytes) else { return };
        let mut body = vec![0u8; h.body_len as usize];
        if rd.read_exact(&mut body).await.is_err() {
            return;
        }
        let Ok(req) = decode_request(&h, &body, &limits) else { return };
        let id = h.request_id;
        let mut out = Vec::new();
        let mut close_after = false;
        match req {
            Request::Put(entries) => {
                let mut map = store.lock().unwrap();
                let st: Vec<u8> = entries
                    .iter()
                    .map(|(k, v)| {
                        map.insert(k, v.to_vec());
                        PutStatus::Stored as u8
                    })
                    .collect();
                encode_statuses(&mut out, Opcode::PutOk, id, &st);
            }
            // A hostile lender keeps what it is told to delete (old versions to replay).
            Request::Del(keys) => {
                let st = vec![DelStatus::Removed as u8; keys.len()];
                encode_statuses(&mut out, Opcode::DelOk, id, &st);
            }
            Request::Get(keys) => {
                let keys: Vec<Key> = keys.iter().collect();
                let honest = |out: &mut Vec<u8>| {
                    let map = store.lock().unwrap();
                    let mut w = ValuesWriter::begin(out, id, keys.len());
                    for k in &keys {
                        match map.get(k) {
                            Some(v) => w.hit(out, v),
                            None => w.miss(out),
                        }
                    }
                    w.finish(out);
                };
                match mode {
                    Mode::OtherKey | Mode::OldVersion | Mode::Random | Mode::FlipBit => {
                        let map = store.lock().unwrap();
                        let mut w = ValuesWriter::begin(&mut out, id, keys.len());
                        for k in &keys {
                            match lie(mode, &map, k, &mut rng) {
                                Some(v) => w.hit(&mut out, &v),
                                None => w.miss(&mut out),
                            }
                        }
                        w.finish(&mut out);
                    }
                    Mode::TruncatedFrame => {
                        let mut w = ValuesWriter::begin(&mut out, id, 1);
                        w.hit(&mut out, &[0xa5; 100]);
                        w.finish(&mut out);
                        // The value claims 4136 bytes; the frame holds 100.
                        out[HEADER_BYTES + 5..HEADER_BYTES + 9].copy_from_slice(&4136u32.to_le_bytes());
                    }
                    Mode::HugeLength => {
                        let mut w = ValuesWriter::begin(&mut out, id, 1);
                        w.miss(&mut out);
                        w.finish(&mut out);
                        out[0..4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
                    }
                    Mode::Slow => {
                        honest(&mut out);
                        let wr = wr.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            let _ = wr.lock().await.write_all(&out).await;
                        });
                        continue;
                    }
                    Mode::CloseMidFrame => {
                        honest(&mut out);
                        out.truncate(out.len() / 2);
                        close_after = true;
                    }
                }
            }
            Request::Stats => encode_raw(&mut out, Opcode::StatsOk, id, b"{}"),
            Request::Ping(p) => encode_raw(&mut out, Opcode::Pong, id, p),
            Request::Hello(_) => return,
        }
        let mut w = wr.lock().await;
        if w.write_all(&out).await.is_err() || close_after {
            let _ = w.shutdown().await;
            return;
        }
    }
}

/// What a lying lender answers for `k`: another block's value, an older version, random
/// bytes or one flipped bit (`None`: it has nothing to lie with).
fn lie(mode: Mode, map: &HashMap<Key, Vec<u8>>, k: &Key, rng: &mut Rng) -> Option<Vec<u8>> {
    match mode {
        // Another block of the same file, same length.
        Mode::OtherKey => map
            .iter()
            .find(|(o, _)| o.file == k.file && o.block != k.block)
            .or_else(|| map.iter().find(|(o, _)| *o != k))
            .map(|(_, v)| v.clone()),
        // The same block under an older version.
        Mode::OldVersion => map
            .iter()
            .filter(|(o, _)| o.file == k.file && o.block == k.block && o.epoch < k.epoch)
            .max_by_key(|(o, _)| o.epoch)
            .map(|(_, v)| v.clone()),
        Mode::Random => map.get(k).map(|v| rng.bytes(v.len())),
        Mode::FlipBit => map.get(k).map(|v| {
            let mut v = v.clone();
            let bit = rng.below(v.len() as u64 * 8) as usize;
            v[bit / 8] ^= 1 << (bit % 8);
            v
        }),
        _ => map.get(k).cloned(),
    }
}

/// The key a memcached lender was sent, back as the block key (`fc:<tenant>:<file>:<block>:<epoch>`).
fn parse_mc_key(s: &str) -> Option<Key> {
    let mut p = s.split(':');
    let (_, _tenant) = (p.next()?, p.next()?);
    let file = u128::from_str_radix(p.next()?, 16).ok()?;
    let block = u64::from_str_radix(p.next()?, 16).ok()?;
    let epoch = u64::from_str_radix(p.next()?, 16).ok()?;
    Some(Key::new(file, block, epoch))
}

/// The hostile lender as a memcached: answers the handshake like 1.6.18, stores every `ms`
/// honestly, keeps what `md` deletes (to replay old versions), and misbehaves on `mg`.
async fn serve_memcached(s: TcpStream, mode: Mode, store: Store, mut rng: Rng) {
    use tokio::io::AsyncBufReadExt;
    let (rd, wr) = s.into_split();
    let mut rd = tokio::io::BufReader::new(rd);
    let wr = Arc::new(tokio::sync::Mutex::new(wr));
    let mut line = String::new();
    loop {
        line.clear();
        if rd.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let words: Vec<&str> = line.trim_end().split(' ').collect();
        let token = words.iter().find(|w| w.starts_with('O')).copied().unwrap_or("O0");
        let mut out = Vec::new();
        let mut close_after = false;
        match words[0] {
            "mn" => out.extend_from_slice(b"MN\r\n"),
            "stats" if words.len() == 1 => out.extend_from_slice(
                b"STAT pid 4242\r\nSTAT uptime 5\r\nSTAT time 1000\r\nSTAT version 1.6.18\r\nEND\r\n",
            ),
            "stats" => out.extend_from_slice(b"STAT item_size_max 1048576\r\nEND\r\n"),
            "ms" => {
                let n: usize = words[2].parse().unwrap();
                let mut v = vec![0u8; n + 2];
                if rd.read_exact(&mut v).await.is_err() {
                    return;
                }
                v.truncate(n);
                if let Some(k) = parse_mc_key(words[1]) {
                    store.lock().unwrap().insert(k, v);
                }
                out.extend_from_slice(format!("HD {token}\r\n").as_bytes());
            }
            "md" => out.extend_from_slice(format!("HD {token}\r\n").as_bytes()),
            "mg" => {
                let k = parse_mc_key(words[1]).unwrap();
                let value = lie(mode, &store.lock().unwrap(), &k, &mut rng);
                let hit = |out: &mut Vec<u8>, v: &[u8]| {
                    out.extend_from_slice(format!("VA {} {token}\r\n", v.len()).as_bytes());
                    out.extend_from_slice(v);
                    out.extend_from_slice(b"\r\n");
                };
                match (mode, value) {
                    (Mode::TruncatedFrame, _) => {
                        // Claims 4136 bytes, sends 100 and the next answer's line.
                        out.extend_from_slice(format!("VA 4136 {token}\r\n").as_bytes());
                        out.extend_from_slice(&[0xa5; 100]);
                        out.extend_from_slice(b"\r\nEN O1\r\n");
                    }
                    (Mode::HugeLength, _) => out.extend_from_slice(format!("VA 4294967295 {token}\r\n").as_bytes()),
                    (Mode::Slow, v) => {
                        match v {
                            Some(v) => hit(&mut out, &v),
                            None => out.extend_from_slice(format!("EN {token}\r\n").as_bytes()),
                        }
                        let wr = wr.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            let _ = wr.lock().await.write_all(&out).await;
                        });
                        continue;
                    }
                    (Mode::CloseMidFrame, Some(v)) => {
                        hit(&mut out, &v);
                        out.truncate(out.len() / 2);
                        close_after = true;
                    }
                    (_, Some(v)) => hit(&mut out, &v),
                    (_, None) => out.extend_from_slice(format!("EN {token}\r\n").as_bytes()),
                }
            }
            _ => out.extend_from_slice(b"ERROR\r\n"),
        }
        let mut w = wr.lock().await;
        if w.write_all(&out).await.is_err() || close_after {
            let _ = w.shutdown().await;
            return;
        }
    }
}

fn mount_stats(mnt: &Path) -> serde_json::Value {
    let mut cmd = Command::new(bin());
    cmd.args(["stats", mnt.to_str().unwrap(), "--json"]);
    let out = run_with_timeout(cmd, Duration::from_secs(10)).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

const BLOCKS: u64 = 64;

fn run(mode: Mode, speaks: Speaks) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (addr, store) = start_lender(&rt, mode, speaks);
    let addr = match speaks {
        Speaks::Farcache => addr.to_string(),
        Speaks::Memcached => format!("memcached://{addr}"),
    };
    let root = tempfile::tempdir().unwrap();
    let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let key = root.path().join("key");
    let mut k = vec![0u8; 32];
    Rng::new(mode as u64 + 11).fill(&mut k);
    fs::write(&key, k.iter().map(|b| format!("{b:02x}")).collect::<String>() + "\n").unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    let mut data = pattern((BLOCKS * 4096) as usize, mode as u64);
    fs::write(backing.join("f"), &data).unwrap();
    let m = MountProcess::start(
        bin(),
        &backing,
        &mnt,
        &["--server", &addr, "--key-file", key.to_str().unwrap(), LENDERS_FIRST[0], LENDERS_FIRST[1]],
        &root.path().join("log"),
    );
    let t0 = Instant::now();
    let mut r = DirectReader::open(&mnt.join("f"));
    let order: Vec<u64> = (0..BLOCKS).map(|i| (i * 37) % BLOCKS).collect();
    let pass = |r: &mut DirectReader, data: &[u8], n: usize| {
        for &b in &order {
            let o = (b * 4096) as usize;
            assert_eq!(r.read(b * 4096), &data[o..o + 4096], "{mode:?}: pass {n} block {b}");
        }
    };
    let filled = |at_least: usize| {
        let end = Instant::now() + Duration::from_secs(5);
        while store.lock().unwrap().len() < at_least && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The lender has them; give the acknowledgements a moment to reach the index.
        std::thread::sleep(Duration::from_millis(100));
    };

    pass(&mut r, &data, 0);
    filled(BLOCKS as usize);
    {
        let map = store.lock().unwrap();
        assert!(!map.is_empty(), "{mode:?}: nothing was filled");
        let sealed = map.values().next().unwrap();
        assert_eq!(sealed.len(), 4096 + 40, "{speaks:?}: nonce ‖ ciphertext ‖ tag");
        // What the lender holds is not the block: no 64 bytes of it appear in its value.
        for (k, v) in map.iter() {
            let o = (k.block * 4096) as usize;
            assert!(!v.windows(64).any(|w| w == &data[o..o + 64]), "{mode:?}: plaintext on the lender");
        }
    }
    if mode == Mode::OldVersion {
        // A write through the mount gives every block of the chunk a new version; the old
        // sealed copies stay on the (hostile) lender. Refill under the new version, then ask.
        let w = OpenOptions::new().write(true).open(mnt.join("f")).unwrap();
        for b in [3u64, 40] {
            let new = vec![0xee; 100];
            w.write_at(&new, b * 4096 + 7).unwrap();
            data[(b * 4096 + 7) as usize..(b * 4096 + 107) as usize].copy_from_slice(&new);
        }
        drop(w);
        pass(&mut r, &data, 1);
        filled(2 * BLOCKS as usize);
    }
    pass(&mut r, &data, 2);
    pass(&mut r, &data, 3);

    assert!(fuse_mounted(&mnt), "{mode:?}: the mount is gone");
    let s = mount_stats(&mnt);
    let auth = s["remote"]["auth_failures"].as_u64().unwrap();
    // The lender was asked (the misbehaviour was met, not avoided).
    assert!(s["remote"]["gets"].as_u64().unwrap() > 0, "{mode:?}: never asked: {s}");
    if mode.lies() {
        assert!(auth > 0, "{mode:?}: no lie was caught: {s}");
        assert_eq!(s["remote"]["hits"].as_u64(), Some(0), "{mode:?}: a lie was believed: {s}");
    } else {
        assert_eq!(auth, 0, "{mode:?}: {s}");
    }
    drop(r);
    // The disk still has exactly what was written.
    assert_eq!(fs::read(backing.join("f")).unwrap(), data);
    let log = m.stop();
    if mode.lies() {
        // Logged, naming the lender, at most once per 10 s.
        let warned: Vec<&str> = log.lines().filter(|l| l.contains("failed authentication")).collect();
        assert!(!warned.is_empty() && warned.iter().all(|l| l.contains(&addr)), "{log}");
        assert!(t0.elapsed() >= Duration::from_secs(10) || warned.len() == 1, "{warned:?}");
    }
    assert!(t0.elapsed() < Duration::from_secs(40), "{mode:?} took {:?}", t0.elapsed());
}

#[test]
fn another_keys_block_is_a_miss() {
    run(Mode::OtherKey, Speaks::Farcache);
}

#[test]
fn memcached_another_keys_block_is_a_miss() {
    run(Mode::OtherKey, Speaks::Memcached);
}

#[test]
fn an_older_version_of_the_block_is_a_miss() {
    run(Mode::OldVersion, Speaks::Farcache);
}

#[test]
fn memcached_an_older_version_of_the_block_is_a_miss() {
    run(Mode::OldVersion, Speaks::Memcached);
}

#[test]
fn random_bytes_of_the_right_length_are_a_miss() {
    run(Mode::Random, Speaks::Farcache);
}

#[test]
fn memcached_random_bytes_of_the_right_length_are_a_miss() {
    run(Mode::Random, Speaks::Memcached);
}

#[test]
fn one_flipped_bit_is_a_miss() {
    run(Mode::FlipBit, Speaks::Farcache);
}

#[test]
fn memcached_one_flipped_bit_is_a_miss() {
    run(Mode::FlipBit, Speaks::Memcached);
}

#[test]
fn truncated_frames_cost_only_misses() {
    run(Mode::TruncatedFrame, Speaks::Farcache);
}

#[test]
fn memcached_truncated_frames_cost_only_misses() {
    run(Mode::TruncatedFrame, Speaks::Memcached);
}

#[test]
fn a_huge_length_prefix_costs_only_misses() {
    run(Mode::HugeLength, Speaks::Farcache);
}

#[test]
fn memcached_huge_length_prefix_costs_only_misses() {
    run(Mode::HugeLength, Speaks::Memcached);
}

#[test]
fn answers_after_two_seconds_cost_only_misses() {
    run(Mode::Slow, Speaks::Farcache);
}

#[test]
fn memcached_answers_after_two_seconds_cost_only_misses() {
    run(Mode::Slow, Speaks::Memcached);
}

#[test]
fn a_connection_closed_mid_frame_costs_only_misses() {
    run(Mode::CloseMidFrame, Speaks::Farcache);
}

#[test]
fn memcached_connection_closed_mid_frame_costs_only_misses() {
    run(Mode::CloseMidFrame, Speaks::Memcached);
}
