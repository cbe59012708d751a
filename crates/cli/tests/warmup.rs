//! `farcache warmup`: with the real binary, a real lender and a real FUSE mount, a warm-up
//! fills the lender with a file's blocks so that the first application pass is answered from
//! it, keeps to its rate, prints progress, and refuses what it cannot warm.
//!
//! These tests need root and FUSE (CI and developer machines run as root).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use farcache_testkit::{
    pattern, require_root, run_bin, text, wait_until, DirectReader, MountProcess, ServerProcess, LENDERS_FIRST,
};
use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn stats(args: &[&str]) -> Value {
    let mut a = vec!["stats"];
    a.extend_from_slice(args);
    a.push("--json");
    let out = run_bin(bin(), &a);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn n(v: &Value, section: &str, field: &str) -> u64 {
    v[section][field].as_u64().unwrap_or_else(|| panic!("no {section}.{field} in {v:#}"))
}

/// A backing directory with `files`, an empty mount point, and the mount on it.
fn mounted(root: &Path, files: &[(&str, &[u8])], args: &[&str]) -> (MountProcess, PathBuf) {
    require_root("the warmup tests");
    let (backing, mnt) = (root.join("b"), root.join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    for (name, data) in files {
        fs::write(backing.join(name), data).unwrap();
    }
    (MountProcess::start(bin(), &backing, &mnt, args, &root.join("mount.log")), mnt)
}

#[test]
fn a_warmed_file_is_read_from_the_lender_on_the_first_pass() {
    let srv = ServerProcess::start(bin(), &["--capacity", "64MiB"], None);
    let addr = srv.addr().to_string();
    let (big, slow) = (pattern(8 << 20, 3), pattern(4 << 20, 4));
    let root = tempfile::tempdir().unwrap();
    let (m, mnt) = mounted(
        root.path(),
        &[("big", &big), ("slow", &slow)],
        &["--server", &addr, LENDERS_FIRST[0], LENDERS_FIRST[1]],
    );
    let mnt_s = mnt.to_str().unwrap();

    let out = run_bin(bin(), &["warmup", mnt_s, mnt.join("big").to_str().unwrap(), "--rate", "1GiB"]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(said.starts_with("warmed 1 files, 8.00 MiB"), "{said}");
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            stats(&["--server", &addr])["blocks"].as_u64().unwrap_or(0) >= 2000
        }),
        "the lender never got the file's blocks: {:#}",
        stats(&["--server", &addr])
    );

    // The application's first pass: answered by the lender.
    let before = stats(&[mnt_s]);
    let order: Vec<u64> = (0..2048u64).map(|i| (i * 613) % 2048).collect();
    DirectReader::open(&mnt.join("big")).pass(&order, &big);
    let after = stats(&[mnt_s]);
    let hits = n(&after, "remote", "hits") - n(&before, "remote", "hits");
    let disk = n(&after, "engine", "disk_reads") - n(&before, "engine", "disk_reads");
    assert!(hits >= 1900 && disk <= 100, "first pass after warm-up: {hits} lender hits, {disk} disk reads\n{after:#}");

    // A bounded rate: 4 MiB at 2 MiB/s takes about 2 s, with progress lines on the way.
    let t0 = Instant::now();
    let out = run_bin(bin(), &["warmup", mnt_s, mnt.join("slow").to_str().unwrap(), "--rate", "2MiB"]);
    let took = t0.elapsed();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(took >= Duration::from_millis(1800), "4 MiB at 2 MiB/s took {took:?}");
    let progress = text(&out.stderr);
    assert!(progress.lines().any(|l| l.starts_with("warmup: ") && l.ends_with("slow")), "{progress}");
    drop(m);
}

#[test]
fn what_cannot_be_warmed_is_refused_with_the_reason() {
    let root = tempfile::tempdir().unwrap();
    let (m, mnt) = mounted(root.path(), &[("f", b"data")], &["--no-remote"]);
    let outside = root.path().join("outside");
    fs::write(&outside, b"x").unwrap();
    let mnt_s = mnt.to_str().unwrap();
    let out = run_bin(bin(), &["warmup", mnt_s, mnt.join("f").to_str().unwrap()]);
    let e = text(&out.stderr);
    assert!(!out.status.success() && e.contains("no remote tier"), "{e}");
    drop(m);

    let srv = ServerProcess::start(bin(), &["--capacity", "16MiB"], None);
    let root = tempfile::tempdir().unwrap();
    let (m, mnt) = mounted(root.path(), &[("f", b"data")], &["--server", &srv.addr().to_string()]);
    let out = run_bin(bin(), &["warmup", mnt.to_str().unwrap(), outside.to_str().unwrap()]);
    let e = text(&out.stderr);
    assert!(!out.status.success() && e.contains("is not under the mount"), "{e}");
    let out = run_bin(bin(), &["warmup", mnt.to_str().unwrap(), mnt.join("f").to_str().unwrap(), "--rate", "1KiB"]);
    assert!(!out.status.success() && text(&out.stderr).contains("at least 4KiB"));
    drop(m);
}
