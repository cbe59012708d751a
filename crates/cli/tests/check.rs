//! `farcache check` against the real server: it must report every block back when they fit,
//! report the shortfall (not fail) when they do not, and fail when the server is unreachable.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use farcache_testkit::{run_with_timeout, MemcachedProcess, ServerProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn check(addr: &str, size: &str) -> std::process::Output {
    let mut cmd = Command::new(bin());
    cmd.args(["check", "--server", addr, "--size", size]).env("FARCACHE_PROGRESS", "plain");
    run_with_timeout(cmd, Duration::from_secs(60)).expect("farcache check finished")
}

#[test]
fn check_verifies_every_block_when_they_fit() {
    let srv = ServerProcess::start(bin(), &["--capacity", "16MiB"], None);
    let out = check(&srv.addr().to_string(), "4MiB");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("write    1024/1024 blocks stored"), "{text}");
    assert_eq!(text.matches("1024/1024 hits (100.0%)").count(), 2, "{text}");
    assert!(text.contains("deleted the check blocks"), "{text}");
    // Not a terminal: plain progress lines, the last one at 100%.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.lines().any(|l| l.starts_with("check: 3072 of 3072 blocks (100%)")), "{err}");
}

#[test]
fn check_verifies_a_real_memcached_and_refuses_what_memcached_lacks() {
    let mc = MemcachedProcess::start(16);
    let out = check(&mc.url(), "2MiB");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("against {}", mc.url())), "{text}");
    assert!(text.contains("write    512/512 blocks stored"), "{text}");
    assert_eq!(text.matches("512/512 hits (100.0%)").count(), 2, "{text}");
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("s");
    std::fs::write(&secret, "x\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["check", "--server", &mc.url(), "--secret-file", secret.to_str().unwrap()]);
    let out = run_with_timeout(cmd, Duration::from_secs(30)).unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("memcached has no tenant secrets"));
}

#[test]
fn check_reports_a_shortfall_when_the_server_is_too_small() {
    let srv = ServerProcess::start(bin(), &["--capacity", "4MiB", "--policy", "lru"], None);
    let out = check(&srv.addr().to_string(), "8MiB");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // 2048 blocks into 1024 slots (64 shards of 16): each shard keeps its last 16 writes, so
    // at most 1024 hits — fewer only if a shard got under 16 keys. GETs insert nothing, so
    // both passes find the same blocks.
    let hits: Vec<u64> = text
        .lines()
        .filter(|l| l.starts_with("read "))
        .map(|l| l.split_whitespace().nth(2).unwrap().split('/').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(hits.len(), 2, "{text}");
    assert_eq!(hits[0], hits[1], "{text}");
    assert!((900..=1024).contains(&hits[0]), "{text}");
    assert!(text.contains("/2048 hits"), "{text}");
}

#[test]
fn check_fails_clearly_without_a_server() {
    // A port nobody listens on: bind, take the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = check(&format!("127.0.0.1:{port}"), "4KiB");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach farcache server"), "{err}");
}
