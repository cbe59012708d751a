//! `farcache bench paper --quick` through the real binary, as root: it builds the testbed
//! (loop device, ext4, blkio throttle, memory cgroup, a lender in a network namespace), runs
//! seqread, randread and tpch (PostgreSQL 15 on TPC-H data at scale factor 0.01) in all four
//! configurations, and tears everything down. The numbers must be sane — every configuration
//! ran both passes, times are positive, every block read had the right contents, farcache's
//! 2nd random pass got remote hits and only farcache talked to lenders; every configuration
//! loaded every TPC-H row and ran the 66 queries of its power and throughput tests, each
//! query returning the same rows (count and checksum) in every configuration and stream —
//! not fast: targets are for `make bench`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory `farcache-bench-NAME-PID` for a root-only run, removed when dropped;
/// `None` without root (the testbed cannot be built: the test has nothing to run).
fn root_scratch(name: &str) -> Option<Scratch> {
    if !is_root() {
        return None;
    }
    let dir = Scratch(std::env::temp_dir().join(format!("farcache-bench-{name}-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    Some(dir)
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64().unwrap_or_else(|| panic!("{path:?} is not a number in {v}"))
}

/// One `bench paper` run at a time in this binary. A run is a benchmark of the whole machine
/// (its disk, its two CPUs, a memory cgroup sized to the workload), as `make bench` runs them:
/// side by side, one run's gigabytes of disk I/O stalled another's write-through mount behind
/// a 128 MiB cgroup until the OOM killer took it (a fresh clone's `make test`, session 29:
/// the OLTP run beside the tier's, "3946 MiB of other I/O on the machine's disk in 66 s").
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `farcache bench paper --quick ARGS --out DIR`, bounded by `limit`, alone
/// ([`ONE_RUN_AT_A_TIME`]); then checks that nothing of its testbed is left, whatever the
/// outcome. Its status, stdout and stderr.
fn run_quick(args: &[&str], dir: &Path, limit: Duration) -> (std::process::ExitStatus, String, String) {
    // A run that panicked left nothing to protect: its testbed is checked below.
    let _alone = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new(bin())
        .args(["bench", "paper", "--quick"])
        .args(args)
        .arg("--out")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let prefix = format!("fcb-{:x}", child.id());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            // SIGTERM first: the harness tears its testbed down on it.
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(30));
            let _ = child.kill();
            let _ = child.wait();
            panic!("bench paper --quick ran over {limit:?}; stderr:\n{}", std::fs::read_to_string(&err_path).unwrap());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();

    // Nothing of the testbed is left, whatever the outcome.
    let losetup = Command::new("losetup").arg("-a").output().unwrap();
    assert!(!String::from_utf8_lossy(&losetup.stdout).contains(&prefix), "loop device left behind");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&netns.stdout).contains(&prefix), "network namespace left behind");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&prefix), "mount left behind");
    for ctl in ["memory", "blkio", "cpuset"] {
        let names: Vec<String> = std::fs::read_dir(format!("/sys/fs/cgroup/{ctl}"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        assert!(!names.iter().any(|n| n.starts_with(&prefix)), "{ctl} cgroup left behind: {names:?}");
    }
    assert!(!Path::new("/var/tmp/farcache-bench").join(&prefix).exists(), "run directory left behind");
    let shm: Vec<String> =
        std::fs::read_dir("/dev/shm").unwrap().flatten().map(|e| e.file_name().to_string_lossy().to_string()).collect();
    assert!(!shm.iter().any(|n| n.starts_with(&prefix)), "tier file left behind in /dev/shm: {shm:?}");
    (status, stdout, stderr)
}

/// Paper 003's experiments, scaled down: postmark, dfsio, durable writes and destage in the backing
/// alone, the mount without a tier and the mount with a `dram` and an `ssd` tier. Every case
/// of every configuration ran, the tiers took the writes, and every figure is a number.
#[test]
fn bench_paper_quick_runs_the_write_back_tier_experiments() {
    let Some(dir) = root_scratch("paper003") else { return };
    let args = [
        "--experiment",
        "postmark,dfsio,durable,destage",
        "--profile",
        "ssd",
        // Enough files that postmark never runs out of them (it then stops its transactions
        // without a report, which the harness refuses): 3,000 / 1,000 / 100 files for
        // 150 / 250 / 100 transactions.
        "--postmark-scale",
        "0.0005",
        "--postmark-files-scale",
        "0.1",
        "--dfsio-size",
        "16MiB",
        "--durable-secs",
        "1",
        "--destage-size",
        "8MiB",
    ];
    let (status, stdout, stderr) = run_quick(&args, &dir.0, Duration::from_secs(400));
    assert!(
        status.success(),
        "bench paper --quick (paper 003) failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.0.join("paper003-quick.json")).unwrap()).unwrap();
    assert_eq!(json["complete"], true, "{json}");
    let runs = json["tier_runs"].as_array().unwrap();
    // postmark 3 cases, dfsio 4, durable 3, destage 3; in 4 configurations; and in the two
    // with a tier, durable's reference through a mount of tmpfs.
    assert_eq!(runs.len(), 4 * (3 + 4 + 3 + 3) + 2, "{json}");
    for r in runs {
        assert!(r["error"].is_null(), "{r}");
        assert!(num(r, &["per_sec"]) > 0.0 && num(r, &["secs"]) > 0.0, "{r}");
        let cfg = r["config"].as_str().unwrap();
        if r["experiment"] == "destage" && r["case"].as_str().unwrap().starts_with("written back") {
            // The write-back (with a tier: `farcache flush`) or the sequential write really
            // reached the loop disk.
            assert!(num(r, &["disk", "write_bytes"]) >= (8 << 20) as f64, "{r}");
            // With a tier, what it held when the flush began (read from its stats, at most
            // what was written into it).
            assert!(num(r, &["ops"]) > 0.0 && num(r, &["ops"]) <= (8 << 20) as f64 * 1.01, "{r}");
        }
        if let Some(mode) = cfg.strip_prefix("tier-") {
            assert!(num(r, &["tier", "writes"]) > 0.0, "the tier took no writes: {r}");
            assert_eq!(r["tier"]["mode"].as_str(), Some(mode), "{r}");
        } else {
            assert!(r["tier"].is_null(), "{r}");
        }
    }
    let checks = json["checks"].as_array().unwrap();
    assert!(checks.len() >= 4 * 3 && checks.iter().all(|c| c["ok"] == true), "{json}");
    let md = std::fs::read_to_string(dir.0.join("paper003-quick.md")).unwrap();
    assert!(md.contains("## postmark") && md.contains("tier-dram/native") && md.contains("## destage"), "{md}");
}

/// Paper 002's experiments, the ends of each range: fio through io_uring in native,
/// passthrough, passthrough over FUSE-over-io_uring, passthrough served by the kernel and
/// farcache; the serialization test in native, passthrough, passthrough served by the kernel
/// and the mount serving one request at a time. Every point of every configuration ran and
/// is a number, and the kernel's passthrough left the daemon out of the reads and writes.
#[test]
fn bench_paper_quick_runs_the_engine_experiments() {
    let Some(dir) = root_scratch("paper002") else { return };
    // The kernel's FUSE-over-io_uring switch, which passthrough-ring turns on and restores.
    let before = std::fs::read_to_string(farcache_testkit::ENABLE_URING).unwrap();
    let args = ["--experiment", "engine,serial", "--profile", "raw", "--engine-size", "16MiB", "--engine-secs", "1"];
    let (status, stdout, stderr) = run_quick(&args, &dir.0, Duration::from_secs(400));
    assert!(
        status.success(),
        "bench paper --quick (paper 002) failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.0.join("paper002-quick.json")).unwrap()).unwrap();
    assert_eq!(json["complete"], true, "{json}");
    let runs = json["engine_runs"].as_array().unwrap();
    // engine: 2 rw × 2 job counts × 2 queue depths in 5 configurations (native, passthrough,
    // passthrough-ring, passthrough-kernel, farcache); serial: 2 process counts in 4.
    assert_eq!(runs.len(), 5 * 8 + 4 * 2, "{json}");
    for r in runs {
        assert!(r["error"].is_null(), "{r}");
        assert!(num(r, &["iops"]) > 0.0 && num(r, &["p50_us"]) > 0.0 && num(r, &["disk_queue"]) >= 0.0, "{r}");
        let cpu = num(r, &["daemon_cpu_us_per_io"]);
        if r["config"] == "passthrough-kernel" {
            // The kernel served the I/O: the daemon answered an open and a few lookups
            // (through the daemon, tens of µs per I/O).
            assert!(cpu < 5.0, "the daemon served a passthrough file's I/O: {r}");
        } else {
            // Every other mounted configuration's daemon used CPU for its requests.
            assert_eq!(cpu > 0.0, r["config"] != "native", "{r}");
        }
    }
    for cfg in ["native", "passthrough", "passthrough-ring", "passthrough-kernel", "farcache", "serialized"] {
        assert!(runs.iter().any(|r| r["config"] == cfg), "{cfg} missing: {json}");
    }
    let md = std::fs::read_to_string(dir.0.join("paper002-quick.md")).unwrap();
    assert!(md.contains("## engine") && md.contains("passthrough/serialized"), "{md}");
    assert!(md.contains("passthrough-ring/passthrough") && md.contains("CPU time per I/O"), "{md}");
    assert_eq!(std::fs::read_to_string(farcache_testkit::ENABLE_URING).unwrap().trim(), before.trim(), "restored");
}

/// Paper 002's OLTP, tiny: go-tpc's TPC-C-like load (one warehouse, 3 s points) on
/// PostgreSQL 15 in native, passthrough and farcache at 1 and 4 connections, and in farcache
/// the loop device's schedulers none and mq-deadline and a cpuset of 1 then 2 CPUs. Every
/// point committed NewOrders with no failed transaction and no OOM kill, the series ran with
/// the scheduler and CPUs they name, only farcache talked to its lender, and no cgroup
/// (cpuset included) is left; a rerun with --resume keeps every point and loads nothing.
#[test]
fn bench_paper_quick_runs_the_oltp_experiment() {
    let Some(dir) = root_scratch("oltp") else { return };
    let args = ["--experiment", "oltp", "--profile", "raw", "--memory", "128MiB"];
    let (status, stdout, stderr) = run_quick(&args, &dir.0, Duration::from_secs(300));
    assert!(status.success(), "bench paper --quick (oltp) failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}");
    let path = dir.0.join("paper002-oltp-quick.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(json["complete"], true, "{json}");
    let setup = &json["oltp_setup"];
    assert_eq!(setup["warehouses"], 1, "{json}");
    // One warehouse: about 120 MB of tables and indexes; the cluster holds WAL besides.
    assert!(num(setup, &["data_bytes"]) > (50 << 20) as f64, "{setup}");
    assert!(num(setup, &["database_bytes"]) > num(setup, &["data_bytes"]), "{setup}");
    let default_sched = setup["default_scheduler"].as_str().unwrap().to_string();
    let runs = json["oltp"].as_array().unwrap();
    let key = |r: &Value| {
        format!("{} {} {} {} {}", r["config"], r["kind"], r["connections"], r["scheduler"], r["cpus"]).replace('"', "")
    };
    let keys: Vec<String> = runs.iter().map(key).collect();
    let d = &default_sched;
    let want = [
        format!("native connections 1 {d} 2"),
        format!("native connections 4 {d} 2"),
        format!("passthrough connections 1 {d} 2"),
        format!("passthrough connections 4 {d} 2"),
        format!("farcache connections 1 {d} 2"),
        format!("farcache connections 4 {d} 2"),
        "farcache scheduler 4 none 2".into(),
        "farcache scheduler 4 mq-deadline 2".into(),
        format!("farcache cpus 4 {d} 1"),
        format!("farcache cpus 4 {d} 2"),
        format!("passthrough-kernel connections 1 {d} 2"),
        format!("passthrough-kernel connections 4 {d} 2"),
    ];
    assert_eq!(keys, want, "{json}");
    for r in runs {
        assert!(r["error"].is_null(), "{r}");
        assert!(num(r, &["tpmc"]) > 0.0 && num(r, &["new_orders"]) > 0.0, "{r}");
        assert!(num(r, &["tpm_total"]) >= num(r, &["tpmc"]), "{r}");
        assert_eq!((num(r, &["errors"]), num(r, &["oom_kills"])), (0.0, 0.0), "{r}");
        assert_eq!(num(r, &["cached_pages_at_start"]), 0.0, "not a cold start: {r}");
        assert!(num(r, &["cpu", "client_ms"]) > 0.0, "{r}");
        // PostgreSQL wrote its WAL to the loop disk, through the mount or not.
        assert!(num(r, &["disk", "write_ios"]) > 0.0, "{r}");
        let mounted = r["config"] != "native";
        assert_eq!(num(r, &["cpu", "daemon_ms"]) > 0.0, mounted, "{r}");
        if r["config"] != "farcache" {
            assert_eq!(num(r, &["lenders", "hits"]) + num(r, &["lenders", "puts"]), 0.0, "{r}");
        }
    }
    let lender: f64 = runs.iter().filter(|r| r["config"] == "farcache").map(|r| num(r, &["lenders", "puts"])).sum();
    assert!(lender > 0.0, "farcache never filled its lender: {json}");
    let checks = json["checks"].as_array().unwrap();
    assert!(checks.len() == 4 && checks.iter().all(|c| c["ok"] == true), "one check per configuration: {json}");
    let md = std::fs::read_to_string(dir.0.join("paper002-oltp-quick.md")).unwrap();
    for want in ["## oltp", "farcache/native", "passthrough-kernel/native", "| mq-deadline |", "scaling 1 → 2"] {
        assert!(md.contains(want), "{want:?} missing:\n{md}");
    }

    // --resume keeps every point and loads nothing.
    let mut again = args.to_vec();
    again.push("--resume");
    let (status, stdout, stderr) = run_quick(&again, &dir.0, Duration::from_secs(120));
    assert!(status.success(), "--resume failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("12 oltp point(s) done before"), "{stderr}");
    assert_eq!(stderr.matches("done in an earlier run, kept").count(), 4, "{stderr}");
    assert!(!stderr.contains("loading 1 warehouse"), "the rerun loaded the data again: {stderr}");
    let resumed: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(resumed["oltp"], json["oltp"], "the kept points changed");
}

/// Paper 001's migration, tiny: 8 files of 4 MiB on the first of two throttled loop disks,
/// one reader thread, half the files moved by `farcache balance` from the cache and, from a
/// fresh setup, from the disk. Every planned file moved, every block read during the run
/// was right, the inode numbers did not change, and only the cache copy took blocks from the
/// lenders.
#[test]
fn bench_paper_quick_runs_the_migration_experiment() {
    let Some(dir) = root_scratch("paper001") else { return };
    let args = ["--experiment", "migrate", "--profile", "hdd", "--migrate-files", "8", "--migrate-phase-secs", "2"];
    let (status, stdout, stderr) = run_quick(&args, &dir.0, Duration::from_secs(400));
    assert!(
        status.success(),
        "bench paper --quick (paper 001) failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.0.join("paper001-quick.json")).unwrap()).unwrap();
    assert_eq!(json["complete"], true, "{json}");
    let runs = json["migrate_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "cache and disk, one thread each: {json}");
    for r in runs {
        assert!(r["error"].is_null(), "{r}");
        assert_eq!((num(r, &["planned"]), num(r, &["moved"])), (4.0, 4.0), "{r}");
        assert_eq!(num(r, &["wrong_blocks"]), 0.0, "{r}");
        assert!(num(r, &["reads"]) > 0.0, "{r}");
        assert_eq!((num(r, &["inodes_checked"]), num(r, &["inodes_changed"])), (8.0, 0.0), "{r}");
        assert!(num(r, &["migration_secs"]) > 0.0 && num(r, &["mbps", "before"]) > 0.0, "{r}");
        assert!(r["samples"].as_array().unwrap().len() >= 4, "{r}");
        // The second disk took the copies while the samples ran.
        let samples = r["samples"].as_array().unwrap();
        let written = |s: &Value| s["write_bytes"][1].as_u64().unwrap();
        let copied = written(samples.last().unwrap()) - written(&samples[0]);
        assert!(copied >= 4 * (4 << 20), "disk 2 took {copied} bytes: {r}");
        // The mount's and the machine's counters came with every sample: the lender served
        // the readers, and the CPU ticked.
        let last = samples.last().unwrap();
        let count = |s: &Value, k: &str| s[k].as_u64().unwrap_or_else(|| panic!("no {k} in a sample: {s}"));
        assert!(count(last, "lender_hits") > count(&samples[0], "lender_hits"), "no lender hit sampled: {r}");
        assert!(count(last, "cpu_ticks") > count(&samples[0], "cpu_ticks"), "no CPU time sampled: {r}");
        assert!(num(r, &["mbps", "lender_before"]) > 0.0, "{r}");
        let b = &r["balance"];
        let part = |k: &str| b[k].as_u64().unwrap_or_else(|| panic!("no {k} in the balance: {b}"));
        assert!(part("sync_ms") + part("write_ms") + part("read_disk_ms") + part("read_cache_ms") > 0, "{b}");
        let blocks = 4.0 * 1024.0;
        match r["source"].as_str().unwrap() {
            "cache" => assert!(num(r, &["blocks_from_cache"]) > 0.0, "no block copied from the lenders: {r}"),
            "disk" => assert_eq!((num(r, &["blocks_from_cache"]), num(r, &["blocks_from_disk"])), (0.0, blocks), "{r}"),
            s => panic!("source {s}"),
        }
    }
    let checks = json["checks"].as_array().unwrap();
    assert!(checks.len() >= 6 && checks.iter().all(|c| c["ok"] == true), "{json}");
    let md = std::fs::read_to_string(dir.0.join("paper001-quick.md")).unwrap();
    assert!(md.contains("## migrate") && md.contains("cache/disk") && md.contains("disk2 daemon"), "{md}");
    assert!(md.contains("lenders' misses before / after") && md.contains("CPU busy before / during / after"), "{md}");

    // --resume keeps what the JSON holds and runs nothing again.
    let mut again = args.to_vec();
    again.push("--resume");
    let (status, stdout, stderr) = run_quick(&again, &dir.0, Duration::from_secs(200));
    assert!(status.success(), "--resume failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("2 configuration(s) done before, kept"), "{stderr}");
    assert_eq!(stderr.matches("done in an earlier run, kept").count(), 2, "{stderr}");
    let resumed: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.0.join("paper001-quick.json")).unwrap()).unwrap();
    assert_eq!(resumed["migrate_runs"], json["migrate_runs"], "the kept records changed");
}

/// Paper 004's experiment, scaled down: three PostgreSQL tenants (TPC-H at SF 0.01 each), each
/// with its own disk, memory cgroup and mount, sharing one lender under `static` and `mrc`,
/// Q4 twice per tenant. The tenants are configured at the lender (`--tenants-min 20`: a
/// secret each, presented by its mount, and 20% of the lender guaranteed to each). Every run
/// answered Q4's 5 rows (the same answer each time), every tenant got hits at the lender
/// under its own name, the allocation was read every second, the targets never added up to
/// more than the capacity and never went below a tenant's (non-zero) minimum; a rerun keeps
/// both points.
#[test]
fn bench_paper_quick_runs_the_tenants_experiment() {
    let Some(dir) = root_scratch("paper004") else { return };
    let args = ["--experiment", "tenants", "--tenants-min", "20"];
    let (status, stdout, stderr) = run_quick(&args, &dir.0, Duration::from_secs(240));
    assert!(status.success(), "bench paper --quick (tenants) failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}");
    let path = dir.0.join("paper004-quick.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(json["complete"], true, "{json}");
    let setup = &json["tenants_setup"]["tenants"];
    assert_eq!(setup.as_array().unwrap().len(), 3, "{json}");
    let runs = json["tenants_runs"].as_array().unwrap();
    let modes: Vec<&str> = runs.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["static", "mrc"], "{json}");
    for r in runs {
        assert!(r["error"].is_null(), "{r}");
        let capacity = num(r, &["capacity_bytes"]);
        assert!(capacity > 0.0 && num(r, &["total_secs"]) > 0.0, "{r}");
        let tenants = r["tenants"].as_array().unwrap();
        assert_eq!(tenants.len(), 3, "{r}");
        for t in tenants {
            let queries = t["queries"].as_array().unwrap();
            assert_eq!(queries.len(), 2, "{t}");
            for q in queries {
                assert_eq!(q["status"], "ok", "{q}");
                assert_eq!(num(q, &["rows"]), 5.0, "Q4 answers one row per order priority: {q}");
                assert!(num(q, &["secs"]) > 0.0, "{q}");
                assert_eq!(q["checksum"], queries[0]["checksum"], "runs answered differently: {t}");
            }
            // The tenant really used the lender, under its own name.
            assert!(num(t, &["lender", "hits"]) > 0.0, "no hits at the lender for {}: {r}", t["name"]);
            assert!(num(t, &["mount", "remote_reads"]) > 0.0, "the mount read nothing from the lender: {t}");
        }
        let samples = r["samples"].as_array().unwrap();
        assert!(!samples.is_empty(), "no allocation samples: {r}");
        for s in samples {
            let points = s["tenants"].as_array().unwrap();
            let names: Vec<&str> = points.iter().map(|p| p["name"].as_str().unwrap()).collect();
            assert!(names.iter().all(|n| n.starts_with("tenant")), "{s}");
            let sum: f64 = points.iter().map(|p| num(p, &["target_bytes"])).sum();
            assert!(sum <= capacity, "targets add up to {sum} > capacity {capacity}: {s}");
            for p in points {
                // 20% of the capacity, in whole KiB.
                let min = num(p, &["min_bytes"]);
                assert!(min > 0.19 * capacity && min <= 0.2 * capacity, "min_bytes {min} of {capacity}: {s}");
                assert!(num(p, &["target_bytes"]) >= min, "a target below its tenant's minimum: {s}");
            }
        }
        // The three tenants were seen at the lender by the end.
        assert_eq!(samples.last().unwrap()["tenants"].as_array().unwrap().len(), 3, "{r}");
    }
    let checks = json["checks"].as_array().unwrap();
    assert!(checks.len() >= 2 * 8 && checks.iter().all(|c| c["ok"] == true), "{json}");
    let md = std::fs::read_to_string(dir.0.join("paper004-quick.md")).unwrap();
    assert!(md.contains("## tenants") && md.contains("lender share") && md.contains("| mrc |"), "{md}");

    // A rerun keeps the points the JSON holds and runs nothing again.
    let (status, stdout, stderr) = run_quick(&args, &dir.0, Duration::from_secs(60));
    assert!(status.success(), "rerun failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("2 point(s) done before"), "{stderr}");
    assert!(!stderr.contains("generating scale factor"), "the rerun made the databases again: {stderr}");
    let again: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(again["tenants_runs"], json["tenants_runs"], "the kept points changed");
}

#[test]
fn bench_paper_quick_runs_every_configuration_and_cleans_up() {
    if !is_root() {
        // Without root the testbed cannot be built; the error must say so.
        let out = Command::new(bin()).args(["bench", "paper", "--quick", "--out", "/tmp"]).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("needs root"), "{err}");
        return;
    }
    let dir = Scratch(std::env::temp_dir().join(format!("farcache-bench-paper-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let (status, stdout, stderr) = run_quick(&[], &dir.0, Duration::from_secs(400));
    assert!(status.success(), "bench paper --quick failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.0.join("paper-quick.json")).unwrap()).unwrap();
    assert_eq!(json["complete"], true, "{json}");
    let size = json["options"]["sizes_bytes"][0].as_f64().unwrap();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 4, "seqread and randread × four configurations: {json}");
    for r in runs {
        let (exp, cfg) = (r["experiment"].as_str().unwrap(), r["config"].as_str().unwrap());
        assert!(r["error"].is_null(), "{exp} {cfg}: {}", r["error"]);
        let passes = r["passes"].as_array().unwrap();
        assert_eq!(passes.len(), 2, "{r}");
        for p in passes {
            assert!(num(p, &["secs"]) > 0.0, "{r}");
            assert_eq!(num(p, &["bytes"]), size, "{r}");
            assert_eq!(num(p, &["mismatches"]), 0.0, "wrong data in {exp} {cfg}: {r}");
            if cfg != "farcache" {
                assert_eq!(num(p, &["lenders", "hits"]) + num(p, &["lenders", "puts"]), 0.0, "{r}");
            }
        }
        // The first pass starts cold: it reads the disk.
        assert!(num(&passes[0], &["disk", "read_bytes"]) > 0.0, "{exp} {cfg} pass 1 read no disk: {r}");
        if exp == "randread" {
            let probe = &r["probe"];
            assert!(num(probe, &["measured", "lat_us_mean"]) > 0.0, "{r}");
            for p in passes {
                let sum: f64 =
                    ["hit_ratio_page_cache", "hit_ratio_remote", "hit_ratio_disk"].iter().map(|k| num(p, &[k])).sum();
                assert!((sum - 1.0).abs() < 1e-6, "tier shares add up to 1: {p}");
            }
        }
        if cfg == "farcache" {
            assert!(num(r, &["transfers", "bytes_to_servers"]) > 0.0 || exp == "seqread", "{r}");
        }
    }
    let fc = runs.iter().find(|r| r["experiment"] == "randread" && r["config"] == "farcache").unwrap();
    assert!(num(&fc["passes"][1], &["lenders", "hits"]) > 0.0, "no remote hits in the 2nd pass: {fc}");
    assert!(num(&fc["passes"][1], &["hit_ratio_remote"]) > 0.0, "{fc}");
    // The remote-hit probe reads where the routing sends it. With lender hits cheaper than
    // the disk's reads (a release build: ~70 µs against ~190 µs) most of it is served by the
    // lender. Where the rule measured the lender dearer (a debug build's lender: 1.2-1.9 ms a
    // hit), it keeps the random reads on the disk, as it should, and probes the lender now
    // and then; the report must then say the lender targets do not apply.
    let probe_hits = num(&fc["probe"], &["lender_hits"]);
    let on_lenders = probe_hits * 2.0 >= num(&fc["probe"], &["measured", "reads"]);
    if !on_lenders {
        let adaptive = &fc["mount_stats"]["routing"]["adaptive"];
        assert!(num(adaptive, &["disk_over_remote"]) < 1.5, "the disk was measured dearer, yet kept the reads: {fc}");
        assert!(
            num(&fc["mount_stats"]["engine"], &["adaptive_probes"]) > 0.0,
            "the rule stopped measuring the lender: {fc}"
        );
    }
    let ideal = runs.iter().find(|r| r["experiment"] == "randread" && r["config"] == "ideal").unwrap();
    assert!(
        num(&ideal["passes"][1], &["hit_ratio_page_cache"]) > 0.9,
        "with no memory limit the 2nd pass is served by the page cache: {ideal}"
    );
    for c in json["checks"].as_array().unwrap() {
        assert_eq!(c["ok"], true, "{c}");
    }
    check_tpch(&json);
    let md = std::fs::read_to_string(dir.0.join("paper-quick.md")).unwrap();
    for want in [
        "## seqread (Table 4)",
        "## randread (Tables 5/6)",
        "## tpch (Tables 8/10)",
        "| tpch load test |",
        "### tpch: CPU time by who spent it (s)",
        "farcache/passthrough",
        "## transfers (Table 9)",
    ] {
        assert!(md.contains(want) && stdout.contains(want), "{want:?} missing:\n{md}");
    }
    let kept_on_disk = md.contains("not applicable: the routing kept the reads on the disk");
    assert_eq!(kept_on_disk, !on_lenders, "the report and the routing disagree on where the reads went:\n{md}");
}

/// `--client-cpus 1`: the harness, the mount daemon and the load generator on CPU 0, the
/// lender on the rest — checked by the harness itself (it refuses to go on when a lender's
/// CPUs are not the ones asked), said in the report, and the run completes. With one CPU
/// the option must be refused by name.
#[test]
fn bench_paper_quick_runs_the_lenders_on_cpus_of_their_own() {
    let Some(dir) = root_scratch("cpus") else { return };
    // Refused before any testbed is built: oltp has a cpuset of its own.
    let out = Command::new(bin())
        .args(["bench", "paper", "--quick", "--experiment", "oltp", "--client-cpus", "1", "--out"])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--client-cpus: not with the oltp experiment"), "{out:?}");
    // So is a --watch-stats interval below its floor.
    let out = Command::new(bin())
        .args(["bench", "paper", "--quick", "--experiment", "seqread", "--watch-stats", "10ms", "--out"])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--watch-stats 10ms: give an interval of at least 100ms"),
        "{out:?}"
    );
    // The run also records the mounts' counters (--watch-stats): one series per mounted run,
    // the passthrough's too (its disk reads are what farcache's are compared with).
    let args = [
        "--experiment",
        "seqread",
        "--configs",
        "passthrough,farcache",
        "--client-cpus",
        "1",
        "--watch-stats",
        "200ms",
    ];
    let (status, stdout, stderr) = run_quick(&args, &dir.0, Duration::from_secs(300));
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if online < 2 {
        assert!(!status.success() && stderr.contains("--client-cpus 1: this machine has 1 CPUs"), "{stderr}");
        return;
    }
    assert!(status.success(), "bench paper --client-cpus 1 failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("--client-cpus 1: the client on CPUs 0..1, the lenders on 1.."), "{stderr}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.0.join("paper-quick.json")).unwrap()).unwrap();
    assert_eq!(json["options"]["client_cpus"], 1, "{}", json["options"]);
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{json}");
    assert!(runs.iter().all(|r| r["error"].is_null()), "{json}");
    let md = std::fs::read_to_string(dir.0.join("paper-quick.md")).unwrap();
    assert!(md.contains("the lenders on the other 1 (`--client-cpus 1`"), "{md}");
    assert_eq!(json["options"]["watch_stats_ms"], 200, "{}", json["options"]);
    let mut series: Vec<_> = std::fs::read_dir(dir.0.join("stats")).unwrap().map(|e| e.unwrap().path()).collect();
    series.sort();
    assert_eq!(series.len(), 2, "two mounted runs, two series: {series:?}");
    for (path, tier) in [(&series[0], "lenders"), (&series[1], "none")] {
        let text = std::fs::read_to_string(path).unwrap();
        let docs: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(docs.len() >= 2, "{} answers in {}: {text}", docs.len(), path.display());
        let up: Vec<u64> = docs.iter().map(|d| d["uptime_ms"].as_u64().unwrap()).collect();
        assert!(up.windows(2).all(|w| w[1] >= w[0] + 200), "not a series 200 ms apart: {up:?}");
        assert!(
            docs.iter().all(|d| d["routing"].is_object() && d["remote_tier"] == tier),
            "{}: {text}",
            path.display()
        );
        // Both say what their disk read: the comparison a series is for.
        let last = docs.last().unwrap();
        assert!(last["backing"]["read_latency"]["count"].as_u64().unwrap() > 0, "{}: {last}", path.display());
    }
}

/// tpch: the load test loaded every row the generator wrote, in every configuration; the power
/// test ran the 22 queries and the throughput test 2 × 22, all to completion; and every query
/// returned the same rows — row count and checksum of the sorted rows — in every
/// configuration and stream (a wrong block anywhere below PostgreSQL would change an answer).
fn check_tpch(json: &Value) {
    let setup = &json["tpch_setup"];
    assert!(setup.is_object(), "no tpch setup: {}", json["tpch_error"]);
    let want: Vec<(String, u64)> = setup["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_u64().unwrap()))
        .collect();
    assert_eq!(want.len(), 8, "{setup}");
    assert!(want.iter().all(|(_, n)| *n > 0), "{setup}");
    let recs = json["tpch"].as_array().unwrap();
    let cfgs: Vec<&str> = recs.iter().map(|r| r["config"].as_str().unwrap()).collect();
    assert_eq!(cfgs, ["native", "passthrough", "farcache", "ideal"]);
    // query → (rows, checksum) of its first run; every other run must match.
    let mut answers: std::collections::BTreeMap<u64, (u64, String, String)> = Default::default();
    for r in recs {
        let cfg = r["config"].as_str().unwrap();
        assert!(r["error"].is_null(), "tpch {cfg}: {}", r["error"]);
        assert!(num(r, &["load_secs"]) > 0.0, "{r}");
        assert!(num(r, &["power_secs"]) > 0.0, "{r}");
        assert!(num(r, &["throughput_secs"]) > 0.0, "{r}");
        assert!(num(r, &["queries_per_hour"]) > 0.0, "{r}");
        assert!(num(r, &["database_bytes"]) > 0.0, "{r}");
        assert_eq!(num(r, &["cached_pages_at_start"]), 0.0, "tpch {cfg} did not start cold");
        let loaded: Vec<(String, u64)> = r["load_steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| {
                let t = s["what"].as_str()?.strip_prefix("create and copy ")?;
                Some((t.to_string(), s["rows"].as_u64()?))
            })
            .collect();
        assert_eq!(loaded, want, "tpch {cfg}: rows loaded");
        // The load read its CSV files from the disk (cold): through the mount or not.
        assert!(num(&r["load"], &["disk", "read_bytes"]) > 0.0, "tpch {cfg} load read no disk: {r}");
        // Each test's CPU time, by who spent it: PostgreSQL in the client's cgroup, the machine
        // at least that; the daemon only where there is one (over the three tests), the lenders
        // never where there are none. Where there are, a quick run's lender can take less than
        // a clock tick of CPU in all three tests (/proc counts process CPU in ticks: seen in CI),
        // so only its presence is asserted; the full runs' figures are in BENCHMARKS.md.
        let (mut daemon, mut lenders) = (0.0, 0.0);
        for test in ["load", "power_phase", "throughput_phase"] {
            let cpu = &r[test]["cpu"];
            let (client, machine) = (num(cpu, &["client_ms"]), num(cpu, &["machine_ms"]));
            assert!(client > 0.0 && machine > 0.0, "tpch {cfg} {test}: no CPU measured: {cpu}");
            assert!(num(cpu, &["daemon_ms"]) <= client + 50.0, "the daemon is in the client's cgroup: {cpu}");
            daemon += num(cpu, &["daemon_ms"]);
            lenders += num(cpu, &["lenders_ms"]);
        }
        assert_eq!(daemon > 0.0, cfg == "passthrough" || cfg == "farcache", "tpch {cfg}: daemon CPU {daemon} ms");
        if cfg == "farcache" {
            assert!(r["power_phase"]["cpu"]["lenders_ms"].is_number(), "tpch {cfg}: lenders' CPU not recorded: {r}");
        } else {
            assert_eq!(lenders, 0.0, "tpch {cfg} has no lenders, yet counted their CPU");
        }
        let power = r["power"].as_array().unwrap();
        let tput = r["throughput"].as_array().unwrap();
        assert_eq!(power.len(), 22, "{r}");
        assert_eq!(tput.len(), 44, "{r}");
        let mut per_stream = [0usize; 3];
        for q in power.iter().chain(tput) {
            let (n, stream) = (q["query"].as_u64().unwrap(), q["stream"].as_u64().unwrap() as usize);
            per_stream[stream] += 1;
            assert_eq!(q["status"], "ok", "tpch {cfg} stream {stream} q{n}: {q}");
            assert!(num(q, &["secs"]) > 0.0, "{q}");
            let got = (q["rows"].as_u64().unwrap(), q["checksum"].as_str().unwrap().to_string());
            assert_eq!(got.1.len(), 16, "{q}");
            let where_ = format!("{cfg} stream {stream}");
            let first = answers.entry(n).or_insert_with(|| (got.0, got.1.clone(), where_.clone()));
            assert_eq!(
                (first.0, &first.1),
                (got.0, &got.1),
                "q{n} answered differently in {where_} than in {}",
                first.2
            );
        }
        assert_eq!(per_stream, [22, 22, 22], "{r}");
        // Each query says when it started (what lines it up with a --watch-stats series): the
        // power test's one after the other, each after the last one's start and its time.
        let starts: Vec<(u64, f64)> =
            power.iter().map(|q| (q["started_unix_ms"].as_u64().unwrap(), num(q, &["wall_secs"]))).collect();
        for w in starts.windows(2) {
            assert!(w[1].0 as f64 >= w[0].0 as f64 + 1000.0 * w[0].1 - 50.0, "tpch {cfg}: power starts {starts:?}");
        }
        let lender_bytes: f64 = ["load", "power_phase", "throughput_phase"]
            .iter()
            .map(|p| num(&r[*p], &["lenders", "bytes_in"]) + num(&r[*p], &["lenders", "bytes_out"]))
            .sum();
        if cfg == "farcache" {
            assert!(lender_bytes > 0.0, "tpch farcache never talked to its lender: {r}");
        } else {
            assert_eq!(lender_bytes, 0.0, "{r}");
        }
    }
    assert_eq!(answers.len(), 22);
    // Queries that return rows at SF 0.01 (most do): the answers are not trivially empty.
    assert!(answers.values().filter(|a| a.0 > 0).count() >= 20, "{answers:?}");
}
