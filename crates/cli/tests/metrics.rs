//! `--metrics-listen`: a Prometheus scrape of the real server binary and a real FUSE mount
//! shows every name docs/METRICS.md documents, and the hit, read and byte counters and the
//! latency histograms move with I/O. Bad addresses stop either daemon at start with the fix.
//!
//! The mount tests need root and FUSE (CI and developer machines run as root).

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use farcache_testkit::{
    pattern, require_root, text, wait_until, DirectReader, MountProcess, ServerProcess, LENDERS_FIRST,
};

const DOC: &str = include_str!("../../../docs/METRICS.md");

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// The names docs/METRICS.md's Prometheus section lists, split into the lender's and the
/// mount's.
fn documented() -> (Vec<String>, Vec<String>) {
    let names = farcache_testkit::documented_metric_names(DOC);
    let (server, mount): (Vec<String>, Vec<String>) =
        names.into_iter().partition(|n| n.starts_with("farcache_server_"));
    assert!(server.len() >= 20 && mount.len() >= 40, "too few names documented: {server:?} {mount:?}");
    (server, mount)
}

/// The address a daemon logged in "metrics on http://ADDR/metrics".
fn metrics_addr(log: &str) -> Option<SocketAddr> {
    let rest = log.split("metrics on http://").nth(1)?;
    rest.split("/metrics").next()?.parse().ok()
}

/// GET /metrics: the samples, by name and labels ("name{labels}" -> value).
fn scrape(addr: SocketAddr) -> HashMap<String, f64> {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line {l:?}"));
            (series.to_string(), value.parse().unwrap_or_else(|_| panic!("bad value in {l:?}")))
        })
        .collect()
}

/// The sum of every series of metric `name` (all label sets), or the one series `name`
/// names with its labels.
fn total(s: &HashMap<String, f64>, name: &str) -> f64 {
    s.iter().filter(|(k, _)| *k == name || k.split('{').next() == Some(name)).map(|(_, v)| v).sum()
}

/// Every documented name in `names` has a sample in `s` (a histogram as `_count`).
fn assert_all_present(s: &HashMap<String, f64>, names: &[String], who: &str) {
    for n in names {
        let present =
            [n.clone(), format!("{n}_count")].iter().any(|x| s.keys().any(|k| k.split('{').next() == Some(x)));
        assert!(present, "{who}'s scrape lacks {n}: {:#?}", s.keys().collect::<Vec<_>>());
    }
}

#[test]
fn a_scrape_of_a_server_and_a_mount_shows_every_documented_name_and_they_move() {
    require_root("the metrics test");
    let (server_names, mount_names) = documented();
    let srv = ServerProcess::start(bin(), &["--capacity", "64MiB", "--metrics-listen", "127.0.0.1:0"], None);
    let srv_metrics = srv
        .wait_for_stderr(Duration::from_secs(10), |l| metrics_addr(l).is_some())
        .and_then(|l| metrics_addr(&l))
        .unwrap_or_else(|| panic!("no metrics address in the server's log:\n{}", srv.stderr_text()));

    let root = tempfile::tempdir().unwrap();
    let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let data = pattern(4 << 20, 5);
    fs::write(backing.join("f"), &data).unwrap();
    let addr = srv.addr().to_string();
    let log = root.path().join("mount.log");
    let m = MountProcess::start(
        bin(),
        &backing,
        &mnt,
        &["--server", &addr, "--metrics-listen", "127.0.0.1:0", LENDERS_FIRST[0], LENDERS_FIRST[1]],
        &log,
    );
    let mount_metrics = metrics_addr(&m.log_text()).unwrap_or_else(|| panic!("no metrics address:\n{}", m.log_text()));

    let (s0, m0) = (scrape(srv_metrics), scrape(mount_metrics));
    assert_all_present(&s0, &server_names, "the server");
    assert_all_present(&m0, &mount_names, "the mount");
    assert_eq!(total(&m0, "farcache_mount_remote_hits_total"), 0.0);
    assert_eq!(s0.get("farcache_server_capacity_bytes"), Some(&(64.0 * 1024.0 * 1024.0)), "{s0:#?}");
    // The mount connects to its lender in the background after it is live: the gauge turns 1
    // within a bound (a loaded machine once scraped before the connection was made).
    let connected = format!("farcache_mount_lender_connected{{lender=\"{addr}\"}}");
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || scrape(mount_metrics).get(&connected)
            == Some(&1.0)),
        "the lender never showed as connected: {:#?}",
        scrape(mount_metrics)
    );

    // Two passes of scattered 4 KiB reads: the first fills the lender, the second hits.
    let order: Vec<u64> = (0..1024u64).map(|i| (i * 613) % 1024).collect();
    let mut r = DirectReader::open(&mnt.join("f"));
    r.pass(&order, &data);
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            total(&scrape(srv_metrics), "farcache_server_blocks") >= 1000.0
        }),
        "the lender never got the first pass's blocks"
    );
    r.pass(&order, &data);
    let w = OpenOptions::new().write(true).open(mnt.join("f")).unwrap();
    w.write_all_at(&[9u8; 4096], 0).unwrap();
    drop(w);

    let (s1, m1) = (scrape(srv_metrics), scrape(mount_metrics));
    assert_all_present(&s1, &server_names, "the server");
    assert_all_present(&m1, &mount_names, "the mount");
    let moved = |a: &HashMap<String, f64>, b: &HashMap<String, f64>, name: &str, by: f64| {
        let (x, y) = (total(a, name), total(b, name));
        assert!(y - x >= by, "{name} moved from {x} to {y}, expected at least +{by}");
    };
    moved(&m0, &m1, "farcache_mount_remote_hits_total", 900.0);
    moved(&m0, &m1, "farcache_mount_remote_gets_total", 900.0);
    moved(&m0, &m1, "farcache_mount_remote_bytes_from_servers_total", 900.0 * 4096.0);
    moved(&m0, &m1, "farcache_mount_remote_bytes_to_servers_total", 1000.0 * 4096.0);
    moved(&m0, &m1, "farcache_mount_engine_remote_reads_total", 900.0);
    moved(&m0, &m1, "farcache_mount_engine_fills_total", 1000.0);
    moved(&m0, &m1, "farcache_mount_lender_hits_total", 900.0);
    moved(&m0, &m1, "farcache_mount_backing_read_bytes_total", 1000.0 * 4096.0);
    moved(&m0, &m1, "farcache_mount_backing_write_bytes_total", 4096.0);
    moved(&m0, &m1, "farcache_mount_remote_invalidations_total", 1.0);
    moved(&m0, &m1, "farcache_mount_remote_fetch_seconds_count", 900.0);
    moved(&m0, &m1, "farcache_mount_remote_fill_seconds_count", 1000.0);
    moved(&m0, &m1, "farcache_mount_backing_read_seconds_count", 200.0);
    moved(&m0, &m1, "farcache_mount_backing_write_seconds_count", 1.0);
    assert!(total(&m1, "farcache_mount_remote_fetch_seconds_sum") > 0.0);
    let inf = "farcache_mount_remote_fetch_seconds_bucket{le=\"+Inf\"}";
    assert_eq!(m1.get(inf), m1.get("farcache_mount_remote_fetch_seconds_count"), "{m1:#?}");
    let hits = "farcache_server_tenant_hits_total{tenant=\"default\"}";
    moved(&s0, &s1, hits, 900.0);
    moved(&s0, &s1, "farcache_server_tenant_bytes_out_total", 900.0 * 4096.0);
    moved(&s0, &s1, "farcache_server_tenant_puts_total", 1000.0);
    assert!(total(&s1, "farcache_server_connections_accepted_total") >= 1.0, "{s1:#?}");
    assert!(total(&s1, "farcache_server_connections_open") >= 1.0, "{s1:#?}");
    drop(r);
    m.stop();
}

#[test]
fn bad_metrics_addresses_stop_the_daemons_at_start_with_the_fix() {
    // Unparsable: refused by the flag's parser, naming the form wanted.
    let out = farcache_testkit::run_bin(bin(), &["server", "--listen", "127.0.0.1:0", "--metrics-listen", "localhost"]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("--metrics-listen") && e.contains("not an IP:PORT") && e.contains("127.0.0.1:7412"), "{e}");
    // In the configuration file: the key is named.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("f.toml");
    fs::write(&cfg, "[server]\nlisten = \"127.0.0.1:0\"\nmetrics_listen = \"9100\"\n").unwrap();
    let out = farcache_testkit::run_bin(bin(), &["server", "--config", cfg.to_str().unwrap()]);
    let e = text(&out.stderr);
    assert!(!out.status.success() && e.contains("server.metrics_listen:") && e.contains("not an IP:PORT"), "{e}");

    // In use: the second server stops before it serves, and says what to do.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let out = farcache_testkit::run_bin(bin(), &["server", "--listen", "127.0.0.1:0", "--metrics-listen", &port]);
    let e = text(&out.stderr);
    assert!(!out.status.success(), "{e}");
    assert!(e.contains(&format!("--metrics-listen: cannot serve metrics on {port}")), "{e}");
    assert!(e.contains("choose another port"), "{e}");
    assert!(!text(&out.stdout).contains("listening"), "it must not announce itself");

    // A mount with the port in use never mounts.
    require_root("the metrics test");
    let (backing, mnt) = (dir.path().join("b"), dir.path().join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let log = dir.path().join("mount.log");
    let err = MountProcess::try_start(bin(), &backing, &mnt, &["--no-remote", "--metrics-listen", &port], &log)
        .err()
        .expect("the mount must refuse a metrics port in use");
    assert!(err.contains("cannot serve metrics on") && err.contains("choose another port"), "{err}");
}
