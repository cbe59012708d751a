//! Division of a real lender's memory among tenants (`server.allocation`): the real
//! `farcache server` on port 0, two tenants driven over TCP by `farcache-client`.
//!
//! - `mrc`: a tenant with a small working set beside one with a large working set end with
//!   the allocation their curves predict (the small set whole, the rest to the large one),
//!   not the static split;
//! - a scanning tenant cannot push another below its `min_bytes`;
//! - minimums that do not fit in the capacity stop the server at start, naming the key.

use std::path::Path;
use std::time::{Duration, Instant};

use farcache_client::{Client, ClientConfig, Key, PutStatus};
use farcache_testkit::{run_with_timeout, Rng, ServerProcess};
use serde_json::Value;

const TEST_BOUND: Duration = Duration::from_secs(90);
const SLOT: u64 = 4096;
/// The lender: 8 MiB = 2048 slots.
const CAPACITY_BLOCKS: u64 = 2048;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn config(allocation: &str, tenants: &str) -> String {
    format!(
        "[server]\ncapacity = \"8MiB\"\nshards = 4\npolicy = \"lru\"\nallocation = \"{allocation}\"\n\
         allocation_interval = \"200ms\"\n{tenants}"
    )
}

async fn connect(addr: std::net::SocketAddr, tenant: &str, secret: &str) -> Client {
    let mut cfg = ClientConfig::new(addr, tenant);
    cfg.secret = secret.as_bytes().to_vec();
    cfg.connect_timeout = Duration::from_secs(5);
    cfg.request_timeout = Duration::from_secs(10);
    Client::connect(cfg).await.unwrap_or_else(|e| panic!("connect as {tenant}: {e}"))
}

async fn tenant_stats(c: &Client, name: &str) -> Value {
    let v: Value = serde_json::from_str(&c.stats().await.expect("STATS")).expect("STATS is JSON");
    v["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no tenant {name:?} in {v}"))
        .clone()
}

fn u(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field:?} missing in {v}"))
}

/// One round of a read-through cache client: GET `n` keys drawn uniformly from `0..set`
/// of key space `space`, PUT the misses. Returns the hits.
async fn round(c: &Client, rng: &mut Rng, space: u128, set: u64, n: usize) -> usize {
    let keys: Vec<Key> = (0..n).map(|_| Key::new(space, rng.below(set), 1)).collect();
    let got = c.get(&keys).await.expect("GET");
    let value = [space as u8; 64];
    let misses: Vec<(Key, &[u8])> =
        keys.iter().zip(&got).filter(|(_, v)| v.is_none()).map(|(k, _)| (*k, &value[..])).collect();
    if !misses.is_empty() {
        let st = c.put(&misses).await.expect("PUT");
        assert!(st.iter().all(|s| matches!(s, PutStatus::Stored | PutStatus::NoSpace)), "{st:?}");
    }
    keys.len() - misses.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrc_gives_each_tenant_what_its_curve_is_worth() {
    let srv = ServerProcess::start(bin(), &[], Some(&config("mrc", "")));
    tokio::time::timeout(TEST_BOUND, async {
        // Open mode: "small" reads 400 blocks, "large" 4000, at the same rate. Static would
        // give each 1024 blocks; the curves say: all of small's 400 (each block is worth ten
        // of large's), the rest to large.
        let small = connect(srv.addr(), "small", "").await;
        let large = connect(srv.addr(), "large", "").await;
        let mut rng = Rng::new(13);
        let start = Instant::now();
        let mut settled = None;
        while start.elapsed() < Duration::from_secs(60) {
            for _ in 0..20 {
                round(&small, &mut rng, 1, 400, 32).await;
                round(&large, &mut rng, 2, 4000, 32).await;
            }
            let (s, l) = (tenant_stats(&small, "small").await, tenant_stats(&small, "large").await);
            let (ts, tl) = (u(&s, "target_bytes") / SLOT, u(&l, "target_bytes") / SLOT);
            if (400..=480).contains(&ts) && tl >= CAPACITY_BLOCKS - 480 {
                settled = Some((s, l, start.elapsed()));
                break;
            }
        }
        let (mut s, mut l, after) = settled.unwrap_or_else(|| panic!("never settled near 400 / 1648 blocks"));
        println!("settled after {after:?}: small {s}\nlarge {l}");
        // The targets add up to the capacity; the predictions are those of the curves —
        // once the curves have seen more than their first uses: a curve counts each block's
        // first GET as a miss at every size, and the targets can settle (decisions run as
        // soon as a curve is measured) while those still weigh, the more so on a loaded
        // machine, where fewer GETs fit in an interval. Bounded: 30 s more of the same load.
        let predictions = |s: &Value, l: &Value| {
            let ps = s["predicted_hit_ratio"].as_f64().expect("small's prediction");
            let pl = l["predicted_hit_ratio"].as_f64().expect("large's prediction");
            (ps, pl, (u(l, "target_bytes") / SLOT) as f64 / 4000.0)
        };
        let more = Instant::now();
        let (mut ps, mut pl, mut want) = predictions(&s, &l);
        while (ps <= 0.9 || (pl - want).abs() >= 0.08) && more.elapsed() < Duration::from_secs(30) {
            for _ in 0..10 {
                round(&small, &mut rng, 1, 400, 32).await;
                round(&large, &mut rng, 2, 4000, 32).await;
            }
            (s, l) = (tenant_stats(&small, "small").await, tenant_stats(&small, "large").await);
            (ps, pl, want) = predictions(&s, &l);
        }
        assert!(u(&s, "target_bytes") + u(&l, "target_bytes") <= CAPACITY_BLOCKS * SLOT);
        assert!(ps > 0.9, "small at its whole working set: predicted {ps}: {s}");
        assert!((pl - want).abs() < 0.08, "large: predicted {pl}, uniform curve says {want}: {l}");
        assert_eq!(s["predicted"].as_array().map(Vec::len), Some(4), "{s}");
        // And the store keeps to them: small holds its working set and hits.
        let mut hits = 0;
        for _ in 0..20 {
            hits += round(&small, &mut rng, 1, 400, 32).await;
        }
        assert!(hits as f64 >= 0.9 * 640.0, "small hit {hits} of 640");

        // The time series for plots: one STATS document per line, each with the targets.
        let mut cmd = std::process::Command::new(bin());
        let addr = srv.addr().to_string();
        cmd.args(["stats", "--server", &addr, "--tenant", "small", "--json", "--watch", "100ms", "--count", "3"]);
        let out = tokio::task::spawn_blocking(move || run_with_timeout(cmd, Duration::from_secs(30)))
            .await
            .unwrap()
            .expect("stats --watch");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(lines.len(), 3);
        for l in &lines {
            assert_eq!(l["allocation"], "mrc", "{l}");
            assert!(l["tenants"].as_array().unwrap().iter().all(|t| t["target_bytes"].as_u64().unwrap() > 0), "{l}");
        }
        // And as a table.
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["stats", "--server", &addr, "--tenant", "small"]);
        let out = tokio::task::spawn_blocking(move || run_with_timeout(cmd, Duration::from_secs(30)))
            .await
            .unwrap()
            .expect("stats");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("allocation mrc") && text.contains("target") && text.contains("curve:"), "{text}");
    })
    .await
    .expect("test exceeded its time bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_cannot_push_a_tenant_below_its_minimum() {
    let tenants = "[[server.tenant]]\nname = \"db\"\nsecret = \"s1\"\nmin_bytes = \"2MiB\"\nadmin = true\n\n\
                   [[server.tenant]]\nname = \"scan\"\nsecret = \"s2\"\n";
    for allocation in ["static", "hit-ratio", "mrc"] {
        let srv = ServerProcess::start(bin(), &[], Some(&config(allocation, tenants)));
        tokio::time::timeout(TEST_BOUND, async {
            let db = connect(srv.addr(), "db", "s1").await;
            let scan = connect(srv.addr(), "scan", "s2").await;
            // db's 512 blocks (its minimum) first; then a scan of 20000 new blocks.
            let keys: Vec<Key> = (0..512).map(|i| Key::new(1, i, 1)).collect();
            let value = [7u8; 64];
            for chunk in keys.chunks(128) {
                let entries: Vec<(Key, &[u8])> = chunk.iter().map(|k| (*k, &value[..])).collect();
                let st = db.put(&entries).await.expect("PUT");
                assert!(st.iter().all(|s| *s == PutStatus::Stored), "{allocation}: {st:?}");
            }
            for block in (0..20_000u64).step_by(128) {
                let ks: Vec<Key> = (block..block + 128).map(|i| Key::new(2, i, 1)).collect();
                let _ = scan.get(&ks).await.expect("GET");
                let entries: Vec<(Key, &[u8])> = ks.iter().map(|k| (*k, &value[..])).collect();
                let _ = scan.put(&entries).await.expect("PUT");
            }
            let got = db.get(&keys).await.expect("GET");
            let held = got.iter().filter(|v| v.is_some()).count();
            let d = tenant_stats(&db, "db").await;
            assert_eq!(held, 512, "{allocation}: db kept {held} of its 512 minimum blocks: {d}");
            assert_eq!(u(&d, "min_bytes"), 2 << 20, "{d}");
            assert!(u(&d, "target_bytes") >= 2 << 20, "{allocation}: {d}");
            assert!(u(&tenant_stats(&db, "scan").await, "evictions") > 0, "the scan never filled the lender");
        })
        .await
        .expect("test exceeded its time bound");
    }
}

#[test]
fn minimums_beyond_the_capacity_stop_the_server_naming_the_key() {
    let tenants = "[[server.tenant]]\nname = \"a\"\nsecret = \"s1\"\nmin_bytes = \"6MiB\"\n\n\
                   [[server.tenant]]\nname = \"b\"\nsecret = \"s2\"\nmin_bytes = \"4MiB\"\n";
    let err = match ServerProcess::try_start(bin(), &[], Some(&config("mrc", tenants)), &[]) {
        Ok(_) => panic!("a lender whose minimums exceed its capacity started"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("server.tenant.min_bytes: the tenants' min_bytes add up to 10MiB"), "{err}");
    assert!(err.contains("raise server.capacity"), "{err}");
}
