//! `farcache bench paper --quick` through the real binary, as root: it builds the testbed
//! (loop device, ext4, blkio throttle, memory cgroup, a lender in a network namespace), runs
//! seqread and randread in all four configurations, and tears everything down. The numbers
//! must be sane — every configuration ran both passes, times are positive, every block read
//! had the right contents, farcache's 2nd random pass got remote hits and only farcache
//! talked to lenders — not fast: targets are for `make bench`.

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

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64().unwrap_or_else(|| panic!("{path:?} is not a number in {v}"))
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
    let (out_path, err_path) = (dir.0.join("stdout"), dir.0.join("stderr"));
    let mut child = Command::new(bin())
        .args(["bench", "paper", "--quick", "--out"])
        .arg(&dir.0)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let prefix = format!("fcb-{:x}", child.id());
    let limit = Duration::from_secs(400);
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
    for ctl in ["memory", "blkio"] {
        let names: Vec<String> = std::fs::read_dir(format!("/sys/fs/cgroup/{ctl}"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        assert!(!names.iter().any(|n| n.starts_with(&prefix)), "{ctl} cgroup left behind: {names:?}");
    }
    assert!(!Path::new("/var/tmp/farcache-bench").join(&prefix).exists(), "run directory left behind");

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
    assert!(num(&fc["probe"], &["lender_hits"]) > 0.0, "the remote-hit probe was not served by lenders: {fc}");
    let ideal = runs.iter().find(|r| r["experiment"] == "randread" && r["config"] == "ideal").unwrap();
    assert!(
        num(&ideal["passes"][1], &["hit_ratio_page_cache"]) > 0.9,
        "with no memory limit the 2nd pass is served by the page cache: {ideal}"
    );
    for c in json["checks"].as_array().unwrap() {
        assert_eq!(c["ok"], true, "{c}");
    }
    let md = std::fs::read_to_string(dir.0.join("paper-quick.md")).unwrap();
    for want in ["## seqread (Table 4)", "## randread (Tables 5/6)", "farcache/passthrough", "## transfers (Table 9)"] {
        assert!(md.contains(want) && stdout.contains(want), "{want:?} missing:\n{md}");
    }
}
