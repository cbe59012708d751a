//! The real `farcache server` binary, on port 0, driven over TCP by `farcache-client`:
//! data round trips, the capacity bound (in STATS and in resident memory), both eviction
//! policies, tenants, shutdown, `farcache stats`, configuration errors, and many clients.
//!
//! Each test starts its own server (memcached's t/lib/MemcachedTest.pm does the same), so
//! tests run in parallel and a failure in one cannot leak into another.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use farcache_client::{Client, ClientConfig, ClientError, DelStatus, Key, PutStatus};
use farcache_testkit::{run_with_timeout, RawConn, Rng, ServerProcess, StartError};
use farcache_wire::ErrorCode;
use serde_json::Value;

/// Every test body runs under this bound: a hang is a failure, not a stuck CI job.
const TEST_BOUND: Duration = Duration::from_secs(60);
const SLOT: usize = 4096;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_BOUND, f).await.expect("test exceeded its time bound")
}

async fn try_connect(addr: SocketAddr, tenant: &str, secret: &str) -> Result<Client, ClientError> {
    let mut cfg = ClientConfig::new(addr, tenant);
    cfg.secret = secret.as_bytes().to_vec();
    // Debug builds on two shared cores: leave room, the bound is still finite.
    cfg.connect_timeout = Duration::from_secs(5);
    cfg.request_timeout = Duration::from_secs(10);
    Client::connect(cfg).await
}

async fn connect(addr: SocketAddr, tenant: &str, secret: &str) -> Client {
    try_connect(addr, tenant, secret).await.unwrap_or_else(|e| panic!("connect as {tenant}: {e}"))
}

async fn stats(c: &Client) -> Value {
    serde_json::from_str(&c.stats().await.expect("STATS")).expect("STATS is JSON")
}

fn u(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("stats field {field:?} missing or not a number in {v}"))
}

/// The entry of `name` in the stats' tenant list.
fn tenant<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["tenants"]
        .as_array()
        .expect("tenants array")
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("tenant {name:?} not in stats {v}"))
}

fn tenant_names(v: &Value) -> Vec<String> {
    let mut names: Vec<String> = v["tenants"]
        .as_array()
        .expect("tenants array")
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

fn key(space: u128, i: u64) -> Key {
    Key::new(space, i, 7)
}

/// The bytes stored under `k` by these tests: derived from the key, so any mix-up shows.
fn value_for(k: &Key, len: usize) -> Vec<u8> {
    let mut rng = Rng::new((k.file as u64) ^ (k.block.rotate_left(17)) ^ k.epoch.rotate_left(41) ^ len as u64);
    rng.bytes(len)
}

/// PUT `keys` with values from [`value_for`] of `len` bytes; require every one stored.
async fn put_all(c: &Client, keys: &[Key], len: usize) {
    let values: Vec<Vec<u8>> = keys.iter().map(|k| value_for(k, len)).collect();
    let entries: Vec<(Key, &[u8])> = keys.iter().zip(&values).map(|(k, v)| (*k, &v[..])).collect();
    let st = c.put(&entries).await.expect("PUT");
    assert_eq!(st.len(), keys.len());
    assert!(st.iter().all(|s| *s == PutStatus::Stored), "not all stored: {:?}", &st[..st.len().min(10)]);
}

/// GET `keys`; require every hit to be exactly its value. Returns the number of hits.
async fn get_verified(c: &Client, keys: &[Key], len: usize) -> usize {
    let got = c.get(keys).await.expect("GET");
    assert_eq!(got.len(), keys.len());
    let mut hits = 0;
    for (k, v) in keys.iter().zip(&got) {
        if let Some(v) = v {
            assert_eq!(&v[..], &value_for(k, len)[..], "wrong bytes for {k:?}");
            hits += 1;
        }
    }
    hits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_del_round_trip_exact_bytes() {
    let srv = ServerProcess::start(bin(), &["--capacity", "16MiB"], None);
    bounded(async {
        let c = connect(srv.addr(), "t1", "").await;
        let lens = [0usize, 1, 7, 100, 4095, 4096];
        let keys: Vec<Key> = (0..lens.len() as u64).map(|i| key(1, i)).collect();
        let values: Vec<Vec<u8>> = keys.iter().zip(lens).map(|(k, l)| value_for(k, l)).collect();
        assert_eq!(c.get(&keys).await.unwrap(), vec![None; keys.len()], "fresh server has nothing");

        let entries: Vec<(Key, &[u8])> = keys.iter().zip(&values).map(|(k, v)| (*k, &v[..])).collect();
        assert_eq!(c.put(&entries).await.unwrap(), vec![PutStatus::Stored; keys.len()]);
        let got = c.get(&keys).await.unwrap();
        for ((k, want), got) in keys.iter().zip(&values).zip(&got) {
            assert_eq!(got.as_deref(), Some(&want[..]), "value of {k:?} ({} bytes)", want.len());
        }

        // Overwrite: the new bytes, never the old ones.
        let newer = vec![0x5Au8; 3000];
        assert_eq!(c.put(&[(keys[4], &newer)]).await.unwrap(), vec![PutStatus::Stored]);
        assert_eq!(c.get(&[keys[4]]).await.unwrap()[0].as_deref(), Some(&newer[..]));

        // Another epoch of the same block is another key.
        let other_epoch = Key::new(keys[5].file, keys[5].block, keys[5].epoch + 1);
        assert_eq!(c.get(&[other_epoch]).await.unwrap(), vec![None]);

        assert_eq!(c.del(&[keys[0], keys[1]]).await.unwrap(), vec![DelStatus::Removed; 2]);
        assert_eq!(c.del(&[keys[0]]).await.unwrap(), vec![DelStatus::Absent]);
        let got = c.get(&keys).await.unwrap();
        assert_eq!((got[0].as_deref(), got[1].as_deref()), (None, None));
        assert_eq!(got[2].as_deref(), Some(&values[2][..]));

        // Larger than a slot: refused, not truncated.
        let big = vec![1u8; SLOT + 1];
        assert_eq!(c.put(&[(key(1, 99), &big)]).await.unwrap(), vec![PutStatus::TooLarge]);
        assert_eq!(c.get(&[key(1, 99)]).await.unwrap(), vec![None]);
        c.ping().await.unwrap();

        let s = stats(&c).await;
        assert_eq!(u(&s, "blocks"), 4, "{s}");
        assert_eq!(u(&s, "dels"), 2, "{s}");
        // Scripts read the address from stdout: it must be the only thing there.
        let out = srv.stdout_text();
        assert_eq!(out, format!("farcache server listening on {}\n", srv.addr()), "stdout: {out:?}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_of_200_keys() {
    let srv = ServerProcess::start(bin(), &["--capacity", "16MiB"], None);
    bounded(async {
        let c = connect(srv.addr(), "batch", "").await;
        let keys: Vec<Key> = (0..200).map(|i| key(2, i)).collect();
        put_all(&c, &keys, SLOT).await;
        assert_eq!(get_verified(&c, &keys, SLOT).await, 200);

        // Answers come in request order, whatever the order.
        let reversed: Vec<Key> = keys.iter().rev().copied().collect();
        assert_eq!(get_verified(&c, &reversed, SLOT).await, 200);

        let st = c.del(&keys[..100]).await.unwrap();
        assert_eq!(st, vec![DelStatus::Removed; 100]);
        let got = c.get(&keys).await.unwrap();
        assert!(got[..100].iter().all(Option::is_none), "deleted keys still answer");
        for (k, v) in keys[100..].iter().zip(&got[100..]) {
            assert_eq!(v.as_deref(), Some(&value_for(k, SLOT)[..]), "{k:?}");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_is_never_exceeded_in_stats_or_memory() {
    const CAPACITY: u64 = 64 << 20;
    let srv = ServerProcess::start(bin(), &["--capacity", "64MiB"], None);
    // Resident memory may pass capacity by the bookkeeping (a few percent) and the process
    // itself (runtime, buffers, a debug binary): 32 MiB + 3% of capacity.
    let rss_bound = CAPACITY + (32 << 20) + CAPACITY * 3 / 100;
    bounded(async {
        let c = connect(srv.addr(), "fill", "").await;
        let rss_start = srv.rss_bytes();
        let total = 4 * CAPACITY / SLOT as u64;
        let keys: Vec<Key> = (0..total).map(|i| key(3, i)).collect();
        let mut max_rss = rss_start;
        for (n, chunk) in keys.chunks(2048).enumerate() {
            put_all(&c, chunk, SLOT).await;
            if n % 8 == 7 {
                let s = stats(&c).await;
                assert!(u(&s, "used_bytes") <= CAPACITY, "used_bytes over capacity: {s}");
                max_rss = max_rss.max(srv.rss_bytes());
                assert!(max_rss <= rss_bound, "RSS {max_rss} > bound {rss_bound}");
            }
        }
        let s = stats(&c).await;
        let used = u(&s, "used_bytes");
        assert_eq!(u(&s, "capacity_bytes"), CAPACITY, "{s}");
        assert!(used <= CAPACITY, "used {used} > capacity: {s}");
        assert!(used >= CAPACITY * 99 / 100, "4x capacity written but only {used} used: {s}");
        assert!(u(&s, "evictions") > 0, "{s}");
        assert_eq!(u(&s, "puts"), total, "{s}");
        let rss_end = srv.rss_bytes();
        assert!(rss_end <= rss_bound, "RSS {rss_end} > bound {rss_bound}");
        eprintln!(
            "capacity {CAPACITY}: rss at start {rss_start}, max {max_rss}, end {rss_end}; overhead_bytes {}",
            u(&s, "overhead_bytes")
        );
        // What is still there is exactly what was put.
        let recent = &keys[keys.len() - 2000..];
        let hits = get_verified(&c, recent, SLOT).await;
        assert!(hits > 0, "none of the last 2000 blocks written survived");
    })
    .await
}

/// Store a hot set, read it twice, then write a one-pass scan of twice the capacity, and
/// report how much of the hot set is still there.
async fn hot_set_after_scan(policy: &str) -> (f64, Value) {
    let srv = ServerProcess::start(bin(), &["--capacity", "16MiB", "--policy", policy], None);
    let c = connect(srv.addr(), "scan", "").await;
    let slots = (16 << 20) / SLOT as u64;
    let hot: Vec<Key> = (0..slots / 4).map(|i| key(4, i)).collect();
    put_all(&c, &hot, SLOT).await;
    for _ in 0..2 {
        assert_eq!(get_verified(&c, &hot, SLOT).await, hot.len(), "{policy}: hot set fits and must hit");
    }
    let scan: Vec<Key> = (0..2 * slots).map(|i| key(5, i)).collect();
    for chunk in scan.chunks(2048) {
        put_all(&c, chunk, SLOT).await;
    }
    let hits = get_verified(&c, &hot, SLOT).await;
    let s = stats(&c).await;
    assert_eq!(s["policy"], policy, "{s}");
    assert!(u(&s, "evictions") > 0, "{policy}: no eviction after writing 2.25x capacity: {s}");
    assert!(u(&s, "used_bytes") <= u(&s, "capacity_bytes"), "{policy}: {s}");
    (hits as f64 / hot.len() as f64, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lru_and_s3fifo_both_evict_and_s3fifo_resists_a_scan() {
    bounded(async {
        let ((lru, _), (s3, _)) = tokio::join!(hot_set_after_scan("lru"), hot_set_after_scan("s3fifo"));
        eprintln!("hot set kept after a 2x-capacity scan: lru {lru:.3}, s3fifo {s3:.3}");
        // LRU orders by last transfer: a scan newer than every hot read pushes the hot set out.
        assert!(lru <= 0.10, "lru kept {lru} of the hot set through a scan of 2x capacity");
        // S3-FIFO: the scan's one-hit wonders leave through the small queue; re-read blocks stay.
        assert!(s3 >= 0.90, "s3fifo kept only {s3} of a re-read hot set through a scan");
    })
    .await
}

/// Tenants a and b with secrets, and an admin. `a_limit`: a's `limit` line, if any.
fn tenants_toml(a_limit: &str) -> String {
    format!(
        r#"
[server]
capacity = "64MiB"

[[server.tenant]]
name = "a"
secret = "sa"
{a_limit}

[[server.tenant]]
name = "b"
secret = "sb"

[[server.tenant]]
name = "ops"
secret = "so"
admin = true
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_isolated_and_authenticated() {
    // No limit for a: its quota is split per shard, and a small limit could evict a's own
    // blocks here, which is not what this test is about.
    let srv = ServerProcess::start(bin(), &[], Some(&tenants_toml("")));
    bounded(async {
        let addr = srv.addr();
        let a = connect(addr, "a", "sa").await;
        let b = connect(addr, "b", "sb").await;
        assert_eq!(a.hello().flags & farcache_wire::HELLO_OK_FLAG_ADMIN, 0, "a is not admin");

        let keys: Vec<Key> = (0..50).map(|i| key(6, i)).collect();
        put_all(&a, &keys, 1000).await;
        // Same keys, other tenant: nothing to see, nothing to delete.
        assert_eq!(b.get(&keys).await.unwrap(), vec![None; 50], "b sees a's blocks");
        assert_eq!(b.del(&keys).await.unwrap(), vec![DelStatus::Absent; 50], "b deleted a's blocks");
        // b's writes under the same keys land in b's space only.
        let theirs = vec![0xBBu8; 1000];
        let entries: Vec<(Key, &[u8])> = keys.iter().map(|k| (*k, &theirs[..])).collect();
        assert_eq!(b.put(&entries).await.unwrap(), vec![PutStatus::Stored; 50]);
        assert_eq!(get_verified(&a, &keys, 1000).await, 50, "a's blocks changed or vanished");
        assert!(b.get(&keys).await.unwrap().iter().all(|v| v.as_deref() == Some(&theirs[..])));

        // Credentials.
        match try_connect(addr, "a", "wrong").await {
            Err(ClientError::AuthFailed(_)) => {}
            other => panic!("wrong secret: {other:?}"),
        }
        match try_connect(addr, "a", "").await {
            Err(ClientError::AuthFailed(_)) => {}
            other => panic!("no secret: {other:?}"),
        }
        match try_connect(addr, "mallory", "sa").await {
            Err(ClientError::AuthFailed(_)) => {}
            other => panic!("unknown tenant: {other:?}"),
        }

        // STATS: a tenant sees itself; an admin sees everyone.
        let sa = stats(&a).await;
        assert_eq!(tenant_names(&sa), ["a"], "{sa}");
        assert_eq!(u(tenant(&sa, "a"), "blocks"), 50);
        let sb = stats(&b).await;
        assert_eq!(tenant_names(&sb), ["b"], "{sb}");
        let ops = connect(addr, "ops", "so").await;
        assert_ne!(ops.hello().flags & farcache_wire::HELLO_OK_FLAG_ADMIN, 0, "ops is admin");
        let so = stats(&ops).await;
        assert_eq!(tenant_names(&so), ["a", "b", "ops"], "{so}");
        assert_eq!(u(tenant(&so, "b"), "blocks"), 50);
        assert!(srv.wait_for_stderr(Duration::from_secs(3), |l| l.contains("closing connection")).is_some());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_limit_is_enforced() {
    let srv = ServerProcess::start(bin(), &[], Some(&tenants_toml("limit = \"1MiB\"")));
    bounded(async {
        let a = connect(srv.addr(), "a", "sa").await;
        let b = connect(srv.addr(), "b", "sb").await;
        // 4 MiB into a 1 MiB limit: a evicts its own blocks, and every PUT is stored.
        let keys: Vec<Key> = (0..1024).map(|i| key(7, i)).collect();
        put_all(&a, &keys, SLOT).await;
        let s = stats(&a).await;
        let ta = tenant(&s, "a");
        let shards = 64;
        let bound = (1 << 20) + shards * SLOT as u64;
        assert_eq!(u(ta, "limit_bytes"), 1 << 20, "{s}");
        assert!(u(ta, "used_bytes") <= bound, "a holds {} > {bound}: {s}", u(ta, "used_bytes"));
        assert!(u(ta, "evictions") >= 1024 - bound / SLOT as u64, "{s}");
        let hits = get_verified(&a, &keys, SLOT).await as u64;
        assert!(hits * SLOT as u64 <= bound, "{hits} blocks readable");

        // b has no limit of its own (100% of capacity) and is not held to a's.
        let keys_b: Vec<Key> = (0..1024).map(|i| key(8, i)).collect();
        put_all(&b, &keys_b, SLOT).await;
        let s = stats(&b).await;
        assert_eq!(u(tenant(&s, "b"), "used_bytes"), 1024 * SLOT as u64, "{s}");
        assert_eq!(get_verified(&b, &keys_b, SLOT).await, 1024);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_mode_admits_at_most_max_tenants() {
    let srv = ServerProcess::start(bin(), &["--capacity", "16MiB"], Some("[server]\nmax_tenants = 2\n"));
    bounded(async {
        let addr = srv.addr();
        let t1 = connect(addr, "t1", "").await;
        let _t2 = connect(addr, "t2", "").await;
        match try_connect(addr, "t3", "").await {
            Err(ClientError::Busy(m)) => assert!(m.contains("max_tenants"), "{m}"),
            other => panic!("third tenant admitted: {other:?}"),
        }
        // Known names still come in, on new connections too.
        let again = connect(addr, "t1", "").await;
        put_all(&again, &[key(9, 1)], 10).await;
        assert_eq!(get_verified(&t1, &[key(9, 1)], 10).await, 1, "same tenant, same blocks");
        let s = stats(&t1).await;
        assert_eq!(tenant_names(&s), ["t1", "t2"], "{s}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_server_with_clients_connected() {
    let mut srv = ServerProcess::start(bin(), &["--capacity", "16MiB"], None);
    bounded(async {
        let addr = srv.addr();
        let mut clients = Vec::new();
        for i in 0..4 {
            clients.push(connect(addr, &format!("c{i}"), "").await);
        }
        // Two of them keep working until the server goes away.
        let mut busy = Vec::new();
        for c in &clients[..2] {
            let c = c.clone();
            busy.push(tokio::spawn(async move {
                let v = vec![3u8; SLOT];
                for i in 0..100_000u64 {
                    if c.put(&[(key(10, i % 64), &v[..])]).await.is_err() {
                        return i;
                    }
                }
                panic!("server still answering after 100000 requests");
            }));
        }
        // And one raw connection, to see exactly what the server says as it goes.
        let mut raw = RawConn::connect(addr).unwrap();
        raw.hello("raw", b"", Duration::from_secs(5)).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        let (status, srv, goodbye) = tokio::task::spawn_blocking(move || {
            let st = srv.terminate(Duration::from_secs(3));
            let goodbye = raw.expect_fatal(ErrorCode::ShuttingDown, Duration::from_secs(1));
            (st, srv, goodbye)
        })
        .await
        .unwrap();
        let took = started.elapsed();
        let status = status.unwrap_or_else(|| panic!("server still running 3 s after SIGTERM"));
        let goodbye = goodbye.expect("a connected client is told ShuttingDown, then closed");
        assert_eq!(goodbye.request_id, 0, "{goodbye:?}");
        assert_eq!(status.code(), Some(0), "exit status {status}");
        for b in busy {
            let done = tokio::time::timeout(Duration::from_secs(5), b).await.expect("client hung").unwrap();
            assert!(done > 0, "the busy client never got an answer");
        }
        for c in &clients {
            assert!(c.ping().await.is_err(), "a client still works after the server stopped");
        }
        let err = srv.stderr_text();
        assert!(err.contains("SIGTERM"), "{err}");
        assert!(err.contains("stopped"), "{err}");
        eprintln!("SIGTERM to exit with 4 clients connected: {took:?}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_command_prints_counters_that_match() {
    let srv = ServerProcess::start(bin(), &["--capacity", "16MiB"], None);
    bounded(async {
        let c = connect(srv.addr(), "cli-t", "").await;
        let keys: Vec<Key> = (0..10).map(|i| key(11, i)).collect();
        put_all(&c, &keys, 500).await;
        assert_eq!(get_verified(&c, &keys, 500).await, 10);
        let absent: Vec<Key> = (100..105).map(|i| key(11, i)).collect();
        assert_eq!(get_verified(&c, &absent, 500).await, 0);
        assert_eq!(c.del(&keys[..3]).await.unwrap(), vec![DelStatus::Removed; 3]);

        let addr = srv.addr().to_string();
        let run = |args: Vec<String>| {
            tokio::task::spawn_blocking(move || {
                let mut cmd = Command::new(bin());
                cmd.args(&args);
                let out = run_with_timeout(cmd, Duration::from_secs(20)).unwrap();
                assert!(out.status.success(), "{args:?}: {:?}", String::from_utf8_lossy(&out.stderr));
                String::from_utf8(out.stdout).unwrap()
            })
        };
        // As the open-mode default tenant ("default"), which sees every tenant.
        let json = run(vec!["stats".into(), "--server".into(), addr.clone(), "--json".into()]).await.unwrap();
        let s: Value = serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {json:?}"));
        assert_eq!((u(&s, "hits"), u(&s, "misses")), (10, 5), "{s}");
        assert_eq!((u(&s, "puts"), u(&s, "dels"), u(&s, "blocks")), (10, 3, 7), "{s}");
        let t = tenant(&s, "cli-t");
        assert_eq!((u(t, "hits"), u(t, "misses"), u(t, "blocks")), (10, 5, 7), "{s}");
        assert_eq!(u(&s, "used_bytes"), 7 * SLOT as u64, "{s}");

        // As the tenant itself, in the table form.
        let text = run(vec!["stats".into(), "--server".into(), addr, "--tenant".into(), "cli-t".into()]).await.unwrap();
        let line = text.lines().find(|l| l.starts_with("hits")).unwrap_or_else(|| panic!("{text}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&words[..4], ["hits", "10", "misses", "5"], "{text}");
    })
    .await
}

#[test]
fn bad_configuration_is_refused_naming_the_key() {
    let cases: &[(&[&str], Option<&str>, &[&str])] = &[
        (&[], Some("[server]\ncapasity = \"1GiB\"\n"), &["capasity"]),
        (&[], Some("[server]\ncapacity = \"1 gigglebyte\"\n"), &["capacity", "unknown unit"]),
        (&[], Some("[server]\ncapacity = \"4KiB\"\n"), &["server.capacity", "set at least"]),
        (&[], Some("[server]\nidle_timeout = \"5\"\n"), &["idle_timeout", "unit"]),
        (&[], Some("[server]\npolicy = \"mru\"\n"), &["server.policy"]),
        (&[], Some("[server]\nmax_connections = 0\n"), &["server.max_connections"]),
        (&[], Some("[[server.tenant]]\nname = \"a\"\n"), &["server.tenant.secret"]),
        (&["--capacity", "4KiB"], None, &["server.capacity"]),
        (&["--config", "/nonexistent/farcache.toml"], None, &["/nonexistent/farcache.toml"]),
    ];
    for (args, toml, needles) in cases {
        let err = match ServerProcess::try_start(bin(), args, *toml, &[]) {
            Ok(s) => panic!("{args:?} {toml:?}: server started on {}", s.addr()),
            Err(e) => e,
        };
        match err {
            StartError::Exited { status, stdout, stderr } => {
                assert!(!status.success(), "{toml:?}: exit status {status}");
                assert!(stdout.is_empty(), "{toml:?}: printed {stdout:?}");
                for n in *needles {
                    assert!(stderr.contains(n), "{toml:?}: stderr does not name {n:?}: {stderr}");
                }
            }
            other => panic!("{toml:?}: {other}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_clients_get_correct_data() {
    const TASKS: u64 = 32;
    const OPS: u64 = 200;
    const KEYS: u64 = 40;
    let srv = ServerProcess::start(bin(), &["--capacity", "64MiB"], None);
    bounded(async {
        let addr = srv.addr();
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            tasks.push(tokio::spawn(async move {
                let c = connect(addr, "many", "").await;
                let mut rng = Rng::new(1000 + t);
                // What this task's keys hold: its own key space, so the model is exact.
                let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
                let mut verified = 0;
                for op in 0..OPS {
                    let i = rng.below(KEYS);
                    let k = key(0x1000 + t as u128, i);
                    match rng.below(10) {
                        0..=3 => {
                            let len = rng.below(SLOT as u64 + 1) as usize;
                            let v = rng.bytes(len);
                            assert_eq!(c.put(&[(k, &v[..])]).await.unwrap(), vec![PutStatus::Stored]);
                            model.insert(i, v);
                        }
                        4..=7 => {
                            let got = c.get(&[k]).await.unwrap();
                            assert_eq!(got[0].as_deref(), model.get(&i).map(|v| &v[..]), "task {t} op {op} key {i}");
                            verified += 1;
                        }
                        _ => {
                            let want = if model.remove(&i).is_some() { DelStatus::Removed } else { DelStatus::Absent };
                            assert_eq!(c.del(&[k]).await.unwrap(), vec![want], "task {t} op {op} key {i}");
                        }
                    }
                }
                verified
            }));
        }
        let mut verified = 0;
        for t in tasks {
            verified += t.await.expect("a client task failed");
        }
        assert!(verified > TASKS * OPS / 4, "only {verified} verified reads");
        let c = connect(addr, "many", "").await;
        let s = stats(&c).await;
        assert_eq!(u(&s, "evictions"), 0, "the model assumes nothing was evicted: {s}");
        assert!(u(&s, "connections_total") >= TASKS, "{s}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_times_out_requests_and_recovers_on_sigcont() {
    let mut srv = ServerProcess::start(bin(), &["--capacity", "16MiB"], None);
    bounded(async {
        let mut cfg = ClientConfig::new(srv.addr(), "frozen");
        cfg.request_timeout = Duration::from_millis(500);
        cfg.connect_timeout = Duration::from_secs(5);
        let c = Client::connect(cfg).await.unwrap();
        put_all(&c, &[key(12, 1)], 100).await;

        srv.stop();
        let t = Instant::now();
        match c.get(&[key(12, 1)]).await {
            Err(ClientError::Timeout) => {}
            other => panic!("GET from a stopped server: {other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert!(srv.is_alive(), "a stopped process is alive");

        srv.cont();
        // The late answer to the timed-out GET is dropped; new requests are answered.
        assert_eq!(get_verified(&c, &[key(12, 1)], 100).await, 1);

        let status = srv.kill();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc_sigkill()), "{status}");
        assert!(c.ping().await.is_err(), "a killed server still answers");
    })
    .await
}

/// SIGKILL's number (9 on every Linux architecture), without a libc dependency here.
fn libc_sigkill() -> i32 {
    9
}
