//! `farcache bench server --quick`, `farcache bench policy --quick` and `farcache bench alloc
//! --quick` through the real binary: they finish, every answer they checked was right, and
//! the figures are sane (throughput above zero, memory above the payload, hit ratios between
//! 0 and 1). With memcached installed, the server benchmark also runs against it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// A scratch directory per test, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("farcache-bench-smoke-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run `farcache ARGS` to completion (killed after `limit`); returns (stdout, stderr).
fn farcache(dir: &Scratch, args: &[&str], limit: Duration) -> (String, String) {
    let out_path = dir.0.join("stdout");
    let err_path = dir.0.join("stderr");
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "farcache {args:?} ran over {limit:?}; stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(status.success(), "farcache {args:?} failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}");
    (stdout, stderr)
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64().unwrap_or_else(|| panic!("{path:?} is not a number in {v}"))
}

/// Checks a server-benchmark report: every run served keys, no wrong value, no miss (the
/// fill fits in both systems), memory above the payload, nothing evicted or refused.
fn check_server_report(json: &Value, systems: &[&str], stdout: &str) {
    let runs = json["runs"].as_array().unwrap();
    // --quick: mixes get and 90/10 × batches 1 and 16 × connections 1 and 4.
    assert_eq!(runs.len(), 8 * systems.len(), "{json}");
    for r in runs {
        assert!(systems.contains(&r["system"].as_str().unwrap()), "{r}");
        assert!(num(r, &["ops_per_sec"]) > 0.0, "{r}");
        assert!(num(r, &["latency_us_p50"]) > 0.0, "{r}");
        assert!(num(r, &["latency_us_p99"]) >= num(r, &["latency_us_p50"]), "{r}");
        assert_eq!(num(r, &["checked", "mismatches"]), 0.0, "{r}");
        assert_eq!(num(r, &["checked", "misses"]), 0.0, "{r}");
        assert!(num(r, &["checked", "hits"]) > 0.0, "{r}");
        if r["get_percent"] != 100 {
            assert!(num(r, &["checked", "put_stored"]) > 0.0, "{r}");
        }
    }
    let memory = json["memory"].as_array().unwrap();
    assert_eq!(memory.len(), systems.len());
    for m in memory {
        let payload = num(m, &["payload_bytes"]);
        assert_eq!(payload, 16.0 * 1024.0 * 1024.0, "{m}");
        assert!(num(m, &["rss_after_bytes"]) > payload, "RSS below the payload it holds: {m}");
        assert_eq!(num(m, &["stored_items"]), 4096.0, "{m}");
        assert_eq!(num(m, &["evictions"]), 0.0, "{m}");
        assert_eq!(num(m, &["rejected"]), 0.0, "{m}");
    }
    assert!(stdout.contains("Throughput (ops/s") && stdout.contains("Memory after the fill"), "{stdout}");
    assert!(stdout.contains("0 mismatches") && !stdout.contains(" 1 mismatches"), "{stdout}");
}

#[test]
fn bench_server_quick_without_memcached() {
    let dir = Scratch::new("server");
    let json_path = dir.0.join("out.json");
    let (stdout, _) = farcache(
        &dir,
        &["bench", "server", "--quick", "--no-memcached", "--json", json_path.to_str().unwrap()],
        Duration::from_secs(120),
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    check_server_report(&json, &["farcache"], &stdout);
    assert!(json["targets"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| !t["target"].as_str().unwrap().contains("memcached at")));
    assert!(stdout.contains("memcached not run"), "{stdout}");
}

#[test]
fn bench_server_quick_against_memcached_when_installed() {
    if farcache_bench::proc::find_memcached().is_err() {
        // Without memcached the comparison cannot run; the error must say how to fix that.
        let dir = Scratch::new("nomc");
        let out = Command::new(bin()).args(["bench", "server", "--quick"]).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("apt-get install -y memcached") && err.contains("--no-memcached"), "{err}");
        drop(dir);
        return;
    }
    let dir = Scratch::new("memcached");
    let json_path = dir.0.join("out.json");
    let (stdout, _) = farcache(
        &dir,
        &["bench", "server", "--quick", "--json", json_path.to_str().unwrap()],
        Duration::from_secs(180),
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    check_server_report(&json, &["farcache", "memcached"], &stdout);
    assert!(json["settings"]["memcached_version"].as_str().unwrap().starts_with("memcached 1."), "{json}");
    // Both GET targets are evaluated, met or not.
    let targets: Vec<&str> =
        json["targets"].as_array().unwrap().iter().map(|t| t["target"].as_str().unwrap()).collect();
    assert!(
        targets.iter().any(|t| t.contains("batch 16")) && targets.iter().any(|t| t.contains("batch 1")),
        "{targets:?}"
    );
    assert!(stdout.contains("ratio"), "{stdout}");
}

#[test]
fn bench_policy_quick() {
    let dir = Scratch::new("policy");
    let json_path = dir.0.join("out.json");
    let (stdout, _) = farcache(
        &dir,
        &["bench", "policy", "--quick", "--json", json_path.to_str().unwrap()],
        Duration::from_secs(120),
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let sim = json["sim"].as_array().unwrap();
    assert_eq!(sim.len(), 2 * 4, "two workloads at four sizes: {json}");
    for s in sim {
        for k in ["lru_hit_ratio", "s3fifo_hit_ratio"] {
            let x = num(s, &[k]);
            assert!(x > 0.0 && x < 1.0, "{s}");
        }
    }
    let server = json["server"].as_array().unwrap();
    assert_eq!(server.len(), 4, "two workloads × two policies: {json}");
    for r in server {
        assert_eq!(num(r, &["checked", "mismatches"]), 0.0, "{r}");
        assert_eq!(num(r, &["checked", "put_rejected"]), 0.0, "{r}");
        let x = num(r, &["hit_ratio"]);
        assert!(x > 0.0 && x < 1.0, "{r}");
        // The server runs the same policy code as the simulation, split into shards: its
        // ratio stays close to the simulated one.
        assert!((x - num(r, &["sim_hit_ratio"])).abs() < 0.05, "{r}");
        // The server's own counters agree with what the client saw.
        assert_eq!(num(r, &["server_hits"]), num(r, &["checked", "hits"]), "{r}");
        assert!(num(r, &["server_evictions"]) > 0.0, "the traces overflow the cache: {r}");
    }
    assert!(stdout.contains("Simulation") && stdout.contains("Real farcache server"), "{stdout}");
}

#[test]
fn bench_alloc_quick_two_modes() {
    let dir = Scratch::new("alloc");
    let json_path = dir.0.join("out.json");
    let (stdout, _) = farcache(
        &dir,
        &[
            "bench",
            "alloc",
            "--quick",
            "--modes",
            "static,mrc",
            "--requests",
            "6000",
            "--json",
            json_path.to_str().unwrap(),
        ],
        Duration::from_secs(180),
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 7 * 3, "seven scenarios in two modes, and mrc again with 70% of the memory: {json}");
    let lean: Vec<&Value> = rows.iter().filter(|r| r["mode"] == "mrc@70%").collect();
    assert_eq!(lean.len(), 7, "{json}");
    for r in &lean {
        assert_eq!(r["capacity_blocks"].as_u64(), Some(1024 * 7 / 10), "{r}");
    }
    for r in rows {
        // Misses per allocation interval (30 intervals of five rounds), adding up to the run's.
        let per_interval: Vec<u64> =
            r["interval_misses"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(per_interval.len(), 30, "{r}");
        assert_eq!(per_interval.iter().sum::<u64>(), r["lender_misses"].as_u64().unwrap(), "{r}");
        let (gets, misses) = (num(r, &["gets"]), num(r, &["lender_misses"]));
        assert!(gets >= 5000.0 && misses <= gets, "{r}");
        // Every tenant of the run shows in the lender's STATS with a target.
        let tenants = r["tenants"].as_array().unwrap();
        assert!(tenants.len() >= 2, "{r}");
        assert!(tenants.iter().any(|t| t[1].as_u64().unwrap() > 0), "no tenant has a target: {r}");
        // Only `mrc` predicts what a tenant should hit, so only it swaps blocks across shards.
        let swaps = r["placement_swaps"].as_u64().unwrap_or_else(|| panic!("no placement_swaps: {r}"));
        if r["mode"] == "static" {
            assert_eq!(swaps, 0, "{r}");
        }
    }
    let mrc_swaps: u64 =
        rows.iter().filter(|r| r["mode"] == "mrc").map(|r| r["placement_swaps"].as_u64().unwrap()).sum();
    // The phase change moves a tenant's keys into shards its old blocks do not fill: its
    // target is held by swaps (167 and 241 in two runs here), and the report carries them.
    assert!(mrc_swaps > 0, "no placement swap under mrc in seven scenarios: {json}");
    // The offline optimum of every scenario: no allocation avoids the cold misses, and the
    // best split per tenth is at least as good as the equal one.
    let optimum = json["optimum"].as_array().unwrap();
    assert_eq!(optimum.len(), 7, "{json}");
    for o in optimum {
        let (cold, best, equal) = (num(o, &["cold"]), num(o, &["best_per_window"]), num(o, &["static_simulated"]));
        assert!(cold > 0.0 && cold <= best && best <= equal, "{o}");
        assert!(best <= num(o, &["best_fixed"]), "{o}");
    }
    assert!(stdout.contains("best/tenth") && stdout.contains("Share of the per-tenth optimum"), "{stdout}");
    // The phase change's new optimum, per interval from the change (the middle of the run), and
    // how soon mrc caught up with it; the lean runs' hit ratios beside static's.
    let change = optimum.iter().find(|o| o["scenario"] == "phase").unwrap()["change"].clone();
    assert_eq!(change["interval"].as_u64(), Some(15), "{change}");
    assert_eq!(change["interval_misses"].as_array().unwrap().len(), 30, "{change}");
    assert!(change["blocks"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).sum::<u64>() <= 1024, "{change}");
    assert!(stdout.contains("caught up") && stdout.contains("Lender hit ratio with less memory"), "{stdout}");
    for scenario in ["skews", "scan+steep", "loop>share", "phase", "idle", "identical", "rate100:1", "total"] {
        assert!(stdout.lines().any(|l| l.starts_with(scenario)), "no {scenario} line in:\n{stdout}");
    }
}

#[test]
fn bench_alloc_throughput_quick() {
    let dir = Scratch::new("alloc-throughput");
    let json_path = dir.0.join("out.json");
    let (stdout, _) = farcache(
        &dir,
        &["bench", "alloc", "--throughput", "--quick", "--json", json_path.to_str().unwrap()],
        Duration::from_secs(120),
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    // Batches 1 and 16 × 1 and 4 connections × two rounds × two lenders.
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 2 * 2 * 2, "{json}");
    for mode in ["shared", "mrc"] {
        assert_eq!(rows.iter().filter(|r| r["mode"] == mode).count(), 8, "{json}");
    }
    for r in rows {
        // Both lenders hold every key: every answer is a hit with the key's own value.
        assert!(num(r, &["ops_per_sec"]) > 0.0, "{r}");
        // The lender's CPU per key: it worked, and a GET costs it between 10 ns and 10 ms.
        let cpu = num(r, &["server_cpu_us_per_key"]);
        assert!((0.01..10_000.0).contains(&cpu), "{r}");
        assert!(num(r, &["checked", "hits"]) > 0.0, "{r}");
        assert_eq!(num(r, &["checked", "misses"]), 0.0, "{r}");
        assert_eq!(num(r, &["checked", "mismatches"]), 0.0, "{r}");
    }
    let medians = json["medians"].as_array().unwrap();
    assert_eq!(medians.len(), 4, "{json}");
    assert_eq!(json["cpu_medians"].as_array().unwrap().len(), 4, "{json}");
    assert!(num(&json, &["geomean"]) > 0.0, "{json}");
    assert!(stdout.contains("mrc GET throughput") && stdout.contains("geometric mean"), "{stdout}");
}

/// `farcache bench restart --quick --events 1` (root: it mounts): one upgrade and one crash
/// of a supervised mount under load, each measured (a stall above zero, throughput back),
/// and nothing left mounted.
#[test]
fn bench_restart_quick_measures_an_upgrade_and_a_crash() {
    farcache_testkit::require_fuse();
    farcache_testkit::require_root("bench restart (mounting)");
    let dir = Scratch::new("restart");
    let json = dir.0.join("restart.json");
    let under = dir.0.to_str().unwrap().to_string();
    let (stdout, stderr) = farcache(
        &dir,
        &["bench", "restart", "--quick", "--events", "1", "--dir", &under, "--json", json.to_str().unwrap()],
        Duration::from_secs(120),
    );
    assert!(stdout.contains("| upgrade | 1 |") && stdout.contains("| crash | 1 |"), "{stdout}\n{stderr}");
    let r: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = r["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{r}");
    for e in events {
        assert!(e["stall_us"].as_u64().unwrap() > 0, "{e}");
        assert!(e["baseline_ops_per_s"].as_f64().unwrap() > 10.0, "{e}");
        assert!(e["recovery_us"].as_u64().is_some(), "throughput never came back: {e}");
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&under), "left mounted:\n{mounts}");
}
