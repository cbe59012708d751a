//! TLS 1.3 from a pre-shared key (no PKI), through the real binaries: a lender and a mount
//! holding the same `farcache keygen` key speak TLS and the second pass is lender hits; a
//! plaintext client and a client with another key are refused with one log line each; a
//! mount with another key stops at start, and one whose lender comes up later with another key
//! serves every read from the disk; bad key files stop the lender and the mount at start,
//! naming the file and the fix.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use farcache_testkit::{pattern, DirectReader, MountProcess, ServerProcess, LENDERS_FIRST};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn farcache(args: &[&str]) -> std::process::Output {
    farcache_testkit::run_bin(bin(), args)
}

use farcache_testkit::text;

const BLOCKS: u64 = 512;

struct Setup {
    root: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
    data: Vec<u8>,
}

impl Setup {
    fn new(seed: u64) -> Setup {
        let root = tempfile::tempdir().unwrap();
        let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
        fs::create_dir(&backing).unwrap();
        fs::create_dir(&mnt).unwrap();
        let data = pattern((BLOCKS * 4096) as usize, seed);
        fs::write(backing.join("f"), &data).unwrap();
        for k in ["psk", "other"] {
            let out = farcache(&["keygen", "--out", root.path().join(k).to_str().unwrap()]);
            assert!(out.status.success(), "{}", text(&out.stderr));
        }
        Setup { root, backing, mnt, data }
    }
    fn p(&self, rel: &str) -> String {
        self.root.path().join(rel).to_str().unwrap().to_owned()
    }
    fn server_toml(&self, key: &str) -> String {
        format!("[server]\ncapacity = \"64MiB\"\ntls_psk_file = {:?}\n", self.p(key))
    }
    fn pass(&self, r: &mut DirectReader) {
        for i in 0..BLOCKS {
            let b = (i * 37) % BLOCKS;
            let o = (b * 4096) as usize;
            assert_eq!(r.read(b * 4096), &self.data[o..o + 4096], "block {b}");
        }
    }
    fn remote_hits(&self) -> u64 {
        let out = farcache(&["stats", self.mnt.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["remote"]["hits"].as_u64().unwrap()
    }
}

#[test]
fn a_mount_and_a_lender_sharing_a_psk_speak_tls_and_others_are_refused() {
    let s = Setup::new(11);
    let srv = ServerProcess::start(bin(), &[], Some(&s.server_toml("psk")));
    let addr = srv.addr().to_string();
    // The start line may reach the log just after the server says it listens.
    srv.wait_for_stderr(Duration::from_secs(5), |l| l.contains("pre-shared key"))
        .unwrap_or_else(|| panic!("no pre-shared key in the start line:\n{}", srv.stderr_text()));
    let m = MountProcess::start(
        bin(),
        &s.backing,
        &s.mnt,
        &["--server", &addr, "--tls-psk-file", &s.p("psk"), LENDERS_FIRST[0], LENDERS_FIRST[1]],
        &s.root.path().join("log"),
    );
    let mut r = DirectReader::open(&s.mnt.join("f"));
    let mut served = false;
    for _ in 0..10 {
        let before = s.remote_hits();
        s.pass(&mut r);
        if s.remote_hits() - before >= BLOCKS * 9 / 10 {
            served = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(served, "no pass was served by the lender");

    // Plaintext: refused.
    let out = farcache(&["stats", "--server", &addr, "--json"]);
    assert!(!out.status.success() && text(&out.stderr).contains("TLS required"), "{}", text(&out.stderr));
    // Another key: the client does not trust the lender's certificate (nor would the lender
    // trust the client's); one line names it.
    let out = farcache(&["stats", "--server", &addr, "--json", "--tls-psk-file", &s.p("other")]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("UnknownIssuer"), "{}", text(&out.stderr));
    srv.wait_for_stderr(Duration::from_secs(5), |l| l.contains("holds another pre-shared key"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{}", srv.stderr_text()));
    assert_eq!(srv.count_stderr_lines(|l| l.contains("plaintext client refused")), 1, "{}", srv.stderr_text());
    // The same key: the tools work.
    let out = farcache(&["stats", "--server", &addr, "--json", "--tls-psk-file", &s.p("psk")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    drop(r);
    let log = m.stop();
    assert!(log.contains("TLS 1.3 to lenders with the pre-shared key") && log.contains("fingerprint"), "{log}");
}

#[test]
fn a_mount_with_another_psk_stops_at_start_and_a_later_lender_costs_only_misses() {
    let s = Setup::new(12);
    let srv = ServerProcess::start(bin(), &[], Some(&s.server_toml("psk")));
    let addr = srv.addr().to_string();
    let args = ["--server", &addr, "--tls-psk-file", &s.p("other")];
    let e = match MountProcess::try_start(bin(), &s.backing, &s.mnt, &args, &s.root.path().join("log0")) {
        Ok(_) => panic!("mounted with another pre-shared key"),
        Err(e) => e,
    };
    assert!(e.contains(&format!("lender {addr}")) && e.contains("another pre-shared key"), "{e}");

    // A lender down at start, then up with another key: logged, reads from the disk.
    let later = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let args = ["--server", &later.to_string(), "--tls-psk-file", &s.p("other")];
    let m = MountProcess::start(bin(), &s.backing, &s.mnt, &args, &s.root.path().join("log"));
    let _srv2 = ServerProcess::start_on(bin(), later, &[], Some(&s.server_toml("psk")));
    let mut r = DirectReader::open(&s.mnt.join("f"));
    s.pass(&mut r);
    std::thread::sleep(Duration::from_millis(500));
    s.pass(&mut r);
    assert_eq!(s.remote_hits(), 0);
    drop(r);
    let log = m.stop();
    assert!(log.contains("TLS connection to lender failed"), "{log}");
}

#[test]
fn bad_psk_files_stop_the_lender_and_the_mount_at_start() {
    let s = Setup::new(13);
    fs::set_permissions(s.p("psk"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(s.p("short"), "abcd\n").unwrap();
    fs::set_permissions(s.p("short"), fs::Permissions::from_mode(0o600)).unwrap();
    for (key, want) in [
        ("psk", vec!["server.tls_psk_file", "open to group or others", "chmod 600"]),
        ("missing", vec!["server.tls_psk_file", "does not exist", "farcache keygen --out"]),
        ("short", vec!["server.tls_psk_file", "does not hold a pre-shared key", "64 hexadecimal characters"]),
    ] {
        let e =
            ServerProcess::try_start(bin(), &[], Some(&s.server_toml(key)), &[]).err().expect("started").to_string();
        for w in &want {
            assert!(e.contains(w), "{key}: {w:?} not in {e}");
        }
        let args = ["--server", "127.0.0.1:9", "--tls-psk-file", &s.p(key)];
        let e = match MountProcess::try_start(bin(), &s.backing, &s.mnt, &args, &s.root.path().join("log")) {
            Ok(_) => panic!("a mount started with {key}"),
            Err(e) => e,
        };
        assert!(e.contains("cache.tls_psk_file") && e.contains(want[1]), "{key}: {e}");
    }
    // Certificates and a PSK together: refused.
    let toml = format!("{}tls_cert = \"a\"\ntls_key = \"b\"\ntls_client_ca = \"c\"\n", s.server_toml("other"));
    let e = ServerProcess::try_start(bin(), &[], Some(&toml), &[]).err().expect("started").to_string();
    assert!(e.contains("server.tls_psk_file") && e.contains("not both"), "{e}");
}
