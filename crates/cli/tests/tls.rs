//! TLS 1.3 with mutual authentication through the real binaries: `farcache certs` makes a
//! deployment; a lender requiring TLS serves a mount with proper certificates (second-pass
//! O_DIRECT reads are lender hits); plaintext clients and clients with another CA's
//! certificate are refused with one log line each; expired certificates are refused at
//! start; and a man-in-the-middle flipping one byte costs a dropped connection and disk
//! reads — never a wrong byte or an I/O error — after which the mount reconnects. Without
//! TLS but with block encryption, bytes flipped on the wire are caught as misses. The client
//! certificate's common name is the mount's tenant.

use std::fs::{self};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farcache_testkit::{fuse_mounted, pattern, DirectReader, MountProcess, ServerProcess, LENDERS_FIRST};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn farcache(args: &[&str]) -> std::process::Output {
    farcache_testkit::run_bin(bin(), args)
}

use farcache_testkit::text;

/// A deployment from `farcache certs`, plus a second one whose client certificate no lender
/// of the first trusts.
struct Pki {
    root: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let root = tempfile::tempdir().unwrap();
        for (dir, client) in [("pki", "db1"), ("other", "db1")] {
            let out = farcache(&["certs", "--out", root.path().join(dir).to_str().unwrap(), "--client", client]);
            assert!(out.status.success(), "{}", text(&out.stderr));
        }
        Pki { root }
    }
    fn p(&self, rel: &str) -> String {
        self.root.path().join(rel).to_str().unwrap().to_owned()
    }
    fn server_toml(&self) -> String {
        format!(
            "[server]\ncapacity = \"64MiB\"\ntls_cert = {:?}\ntls_key = {:?}\ntls_client_ca = {:?}\n",
            self.p("pki/server.pem"),
            self.p("pki/server.key"),
            self.p("pki/ca.pem")
        )
    }
    /// `--tls-ca/--tls-cert/--tls-key` with the client certificate in `dir`.
    fn client_args(&self, dir: &str) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            self.p("pki/ca.pem"),
            "--tls-cert".into(),
            self.p(&format!("{dir}/client-db1.pem")),
            "--tls-key".into(),
            self.p(&format!("{dir}/client-db1.key")),
        ]
    }
}

fn mount_stats(mnt: &Path) -> serde_json::Value {
    let out = farcache(&["stats", mnt.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

struct Dirs {
    root: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
}

fn dirs(data: &[u8]) -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(backing.join("f"), data).unwrap();
    Dirs { root, backing, mnt }
}

const BLOCKS: u64 = 512;

fn pass(r: &mut DirectReader, data: &[u8], n: usize) {
    for i in 0..BLOCKS {
        let b = (i * 37) % BLOCKS;
        let o = (b * 4096) as usize;
        assert_eq!(r.read(b * 4096), &data[o..o + 4096], "pass {n} block {b}");
    }
}

/// Read passes until one is served by the lender (90% hits or more): fills are asynchronous
/// and dropped past cache.max_pending_puts, so a loaded machine may need a pass more.
fn warm(r: &mut DirectReader, data: &[u8], mnt: &Path) -> serde_json::Value {
    pass(r, data, 0);
    let mut before = mount_stats(mnt)["remote"]["hits"].as_u64().unwrap();
    for n in 1..10 {
        std::thread::sleep(Duration::from_millis(300));
        pass(r, data, n);
        let s = mount_stats(mnt);
        let hits = s["remote"]["hits"].as_u64().unwrap();
        if hits - before >= BLOCKS * 9 / 10 {
            return s;
        }
        before = hits;
    }
    panic!("no pass was served by the lender: {}", mount_stats(mnt));
}

#[test]
fn certs_writes_private_keys_and_never_overwrites() {
    let pki = Pki::new();
    for key in ["pki/ca.key", "pki/server.key", "pki/client-db1.key"] {
        let mode = fs::metadata(pki.p(key)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{key}");
    }
    let before = fs::read(pki.p("pki/server.key")).unwrap();
    let out = farcache(&["certs", "--out", &pki.p("pki")]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("already exists") && e.contains("never overwrites"), "{e}");
    assert_eq!(fs::read(pki.p("pki/server.key")).unwrap(), before);
}

#[test]
fn a_mount_with_proper_certificates_reads_from_a_tls_lender_and_others_are_refused() {
    let pki = Pki::new();
    let srv = ServerProcess::start(bin(), &[], Some(&pki.server_toml()));
    let addr = srv.addr().to_string();
    let data = pattern((BLOCKS * 4096) as usize, 3);
    let d = dirs(&data);
    let mut args = vec!["--server".to_string(), addr.clone()];
    args.extend(LENDERS_FIRST.map(String::from));
    args.extend(pki.client_args("pki"));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let m = MountProcess::start(bin(), &d.backing, &d.mnt, &args, &d.root.path().join("log"));
    let mut r = DirectReader::open(&d.mnt.join("f"));
    warm(&mut r, &data, &d.mnt);

    // A plaintext client: refused, with one line naming it.
    let out = farcache(&["stats", "--server", &addr, "--json"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("TLS required"), "{}", text(&out.stderr));
    srv.wait_for_stderr(Duration::from_secs(5), |t| t.contains("plaintext client refused: TLS required"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{}", srv.stderr_text()));
    let err = srv.stderr_text();
    let line = err.lines().find(|l| l.contains("plaintext client refused")).unwrap();
    assert!(line.contains("peer=127.0.0.1:"), "{line}");
    assert_eq!(srv.count_stderr_lines(|l| l.contains("plaintext client refused")), 1);

    // A client whose certificate another CA signed: refused by the server, which says why.
    let mut check = vec!["check", "--server", &addr, "--size", "64KiB"];
    let other = pki.client_args("other");
    check.extend(other.iter().map(|s| s.as_str()));
    let out = farcache(&check);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    srv.wait_for_stderr(Duration::from_secs(5), |t| t.contains("client refused: its certificate is not acceptable"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{}", srv.stderr_text()));
    assert_eq!(
        srv.count_stderr_lines(|l| l.contains("client refused: its certificate") && l.contains("peer=")),
        1,
        "{}",
        srv.stderr_text()
    );

    // The proper client's tools work too.
    let mut stats = vec!["stats", "--server", &addr, "--json"];
    let ok = pki.client_args("pki");
    stats.extend(ok.iter().map(|s| s.as_str()));
    let out = farcache(&stats);
    assert!(out.status.success(), "{}", text(&out.stderr));

    drop(r);
    assert_eq!(fs::read(d.backing.join("f")).unwrap(), data);
    let log = m.stop();
    assert!(log.contains("TLS 1.3 to lenders"), "{log}");
}

/// A port on loopback with nothing listening (yet).
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[test]
fn certificates_a_lender_refuses_stop_the_mount_at_start_and_later_cost_only_misses() {
    let pki = Pki::new();
    let srv = ServerProcess::start(bin(), &[], Some(&pki.server_toml()));
    let addr = srv.addr().to_string();
    let data = pattern((BLOCKS * 4096) as usize, 4);
    let d = dirs(&data);
    let try_mount = |server: &str, client: Vec<String>, log: &str| {
        let mut args = vec!["--server".to_string(), server.to_string()];
        args.extend(client);
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        MountProcess::try_start(bin(), &d.backing, &d.mnt, &args, &d.root.path().join(log))
    };

    // At start: the lender refuses the mount's certificate (another CA signed it) ...
    let e = try_mount(&addr, pki.client_args("other"), "log1").err().expect("mounted with an untrusted certificate");
    assert!(
        e.contains(&format!("lender {addr}"))
            && e.contains("refused this mount's certificate")
            && e.contains("tls_client_ca"),
        "{e}"
    );
    // ... or the mount does not trust the lender's (its CA is another one).
    let mut other_ca = pki.client_args("pki");
    other_ca[1] = pki.p("other/ca.pem");
    let e = try_mount(&addr, other_ca, "log2").err().expect("mounted trusting another CA");
    assert!(e.contains(&format!("lender {addr}")) && e.contains("not signed by cache.tls_ca"), "{e}");
    // ... or it names another host than the certificate's.
    let mut wrong_name = pki.client_args("pki");
    wrong_name.extend(["--tls-server-name".to_string(), "lender.example".to_string()]);
    let e = try_mount(&addr, wrong_name, "log3").err().expect("mounted with the wrong server name");
    assert!(e.contains("tls_server_name"), "{e}");
    assert!(!fuse_mounted(&d.mnt));

    // Later: a lender that is down at start only warns; when it comes up refusing the mount's
    // certificate, the refusal is logged and every read comes from the disk.
    let later = free_addr();
    let m = try_mount(&later.to_string(), pki.client_args("other"), "log").expect("a mount whose lender is down");
    let _srv2 = ServerProcess::start_on(bin(), later, &[], Some(&pki.server_toml()));
    let mut r = DirectReader::open(&d.mnt.join("f"));
    pass(&mut r, &data, 0);
    std::thread::sleep(Duration::from_millis(500));
    pass(&mut r, &data, 1);
    let s = mount_stats(&d.mnt);
    assert_eq!(s["remote"]["hits"].as_u64(), Some(0), "{s}");
    drop(r);
    let log = m.stop();
    assert!(log.contains("not reachable at start"), "{log}");
    assert!(log.contains("TLS connection to lender failed"), "{log}");
}

#[test]
fn expired_certificates_are_refused_at_start() {
    let pki = Pki::new();
    // farcache certs makes valid ones; an expired pair comes from the library it uses.
    let ca_dir = pki.root.path().join("pki");
    let ca_pem = fs::read_to_string(ca_dir.join("ca.pem")).unwrap();
    assert!(ca_pem.contains("BEGIN CERTIFICATE"));
    let old = farcache_tls::certs::Ca::generate("old CA", 30).unwrap().client("db1", -1).unwrap();
    let dir = pki.root.path().join("old");
    fs::create_dir(&dir).unwrap();
    farcache_tls::certs::write_new(&dir, "client-db1.pem", &old.cert_pem, false).unwrap();
    farcache_tls::certs::write_new(&dir, "client-db1.key", &old.key_pem, true).unwrap();
    let expired = pki.p("old/client-db1.pem");

    // The lender.
    let toml = format!(
        "[server]\ncapacity = \"64MiB\"\ntls_cert = {:?}\ntls_key = {:?}\ntls_client_ca = {:?}\n",
        expired,
        pki.p("old/client-db1.key"),
        pki.p("pki/ca.pem")
    );
    let e = match ServerProcess::try_start(bin(), &[], Some(&toml), &[]) {
        Ok(_) => panic!("a lender started with an expired certificate"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(&format!("certificate {expired} expired on")) && e.contains("generate new ones with farcache certs"),
        "{e}"
    );

    // The borrower: the mount, and the tools.
    let d = dirs(&[0u8; 4096]);
    let mut args = vec!["--server".to_string(), "127.0.0.1:9".into()];
    args.extend(pki.client_args("old"));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let e = match MountProcess::try_start(bin(), &d.backing, &d.mnt, &args, &d.root.path().join("log")) {
        Ok(_) => panic!("a mount started with an expired certificate"),
        Err(e) => e,
    };
    assert!(e.contains("cache.tls_cert") && e.contains("expired on") && e.contains("farcache certs"), "{e}");
    let mut check = vec!["check", "--server", "127.0.0.1:9"];
    let old_args = pki.client_args("old");
    check.extend(old_args.iter().map(|s| s.as_str()));
    let out = farcache(&check);
    assert!(!out.status.success() && text(&out.stderr).contains("expired on"), "{}", text(&out.stderr));

    // Missing and garbage files name themselves.
    let toml = pki.server_toml().replace("server.key", "nonexistent.key");
    let e = ServerProcess::try_start(bin(), &[], Some(&toml), &[]).err().expect("started").to_string();
    assert!(e.contains("server.tls_key: ") && e.contains("nonexistent.key does not exist (no such file)"), "{e}");
    fs::write(pki.root.path().join("garbage.pem"), "hello\n").unwrap();
    let toml = pki.server_toml().replace(&pki.p("pki/ca.pem"), &pki.p("garbage.pem"));
    let e = ServerProcess::try_start(bin(), &[], Some(&toml), &[]).err().expect("started").to_string();
    assert!(e.contains("garbage.pem") && e.contains("no CERTIFICATE"), "{e}");
}

/// A TCP proxy that, when `flip` is set, flips one byte of the next server→client chunk
/// (of every one while `keep_flipping` is set too).
struct Mitm {
    addr: SocketAddr,
    flip: Arc<AtomicBool>,
    keep_flipping: Arc<AtomicBool>,
    flipped: Arc<AtomicU64>,
    conns: Arc<AtomicU64>,
}

fn mitm(upstream: SocketAddr) -> Mitm {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let flip = Arc::new(AtomicBool::new(false));
    let keep_flipping = Arc::new(AtomicBool::new(false));
    let flipped = Arc::new(AtomicU64::new(0));
    let conns = Arc::new(AtomicU64::new(0));
    let (f, fl, c, k) = (flip.clone(), flipped.clone(), conns.clone(), keep_flipping.clone());
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(upstream) else { continue };
            c.fetch_add(1, Ordering::SeqCst);
            let (c2s_in, c2s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || pump(c2s_in, c2s_out, None));
            let flips = Flips { flip: f.clone(), keep: k.clone(), flipped: fl.clone() };
            std::thread::spawn(move || pump(server, client, Some(flips)));
        }
    });
    Mitm { addr, flip, keep_flipping, flipped, conns }
}

struct Flips {
    flip: Arc<AtomicBool>,
    keep: Arc<AtomicBool>,
    flipped: Arc<AtomicU64>,
}

fn pump(mut from: TcpStream, mut to: TcpStream, flip: Option<Flips>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(f) = &flip {
            let keep = f.keep.load(Ordering::SeqCst);
            if (keep && f.flip.load(Ordering::SeqCst)) || f.flip.swap(false, Ordering::SeqCst) {
                buf[n / 2] ^= 0x01;
                f.flipped.fetch_add(1, Ordering::SeqCst);
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[test]
fn a_flipped_byte_on_the_wire_drops_the_connection_and_reads_stay_exact() {
    let pki = Pki::new();
    let srv = ServerProcess::start(bin(), &[], Some(&pki.server_toml()));
    let proxy = mitm(srv.addr());
    let data = pattern((BLOCKS * 4096) as usize, 5);
    let d = dirs(&data);
    let mut args = vec!["--server".to_string(), proxy.addr.to_string()];
    args.extend(LENDERS_FIRST.map(String::from));
    args.extend(pki.client_args("pki"));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let m = MountProcess::start(bin(), &d.backing, &d.mnt, &args, &d.root.path().join("log"));
    let mut r = DirectReader::open(&d.mnt.join("f"));
    let before = warm(&mut r, &data, &d.mnt);
    let connects =
        before["remote"]["connects"].as_u64().unwrap() + before["remote"]["fetch_connects"].as_u64().unwrap();

    // Corrupt the next answer: its record fails authentication, the connection drops, and
    // the reads that needed it come from the disk.
    proxy.flip.store(true, Ordering::SeqCst);
    pass(&mut r, &data, 2);
    assert_eq!(proxy.flipped.load(Ordering::SeqCst), 1, "the proxy never flipped a byte");
    let log_has = |what: &str| fs::read_to_string(d.root.path().join("log")).unwrap().contains(what);
    // The answer came on the lender's main connection or on one of its fetch connections
    // (cache.fetch_connections); either way that connection is dropped, and said so.
    let lost = || log_has("lost the lender") || log_has("lost a fetch connection");
    let t = Instant::now();
    while !lost() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(lost(), "the connection survived a corrupted record");

    // The mount is served by the lender again.
    let t = Instant::now();
    loop {
        pass(&mut r, &data, 3);
        let s = mount_stats(&d.mnt);
        // Served again: on a new connection, or on another fetch connection that was there.
        let made = |s: &serde_json::Value| {
            s["remote"]["connects"].as_u64().unwrap() + s["remote"]["fetch_connects"].as_u64().unwrap()
        };
        let spare = s["remote"]["fetch_connects"].as_u64().unwrap() > 1;
        if (made(&s) > connects || spare)
            && s["remote"]["hits"].as_u64().unwrap() > before["remote"]["hits"].as_u64().unwrap() + BLOCKS
        {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no reconnection: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(proxy.conns.load(Ordering::SeqCst) >= 2);
    assert!(fuse_mounted(&d.mnt));
    drop(r);
    assert_eq!(fs::read(d.backing.join("f")).unwrap(), data);
    m.stop();
}

#[test]
fn without_tls_block_encryption_turns_bytes_flipped_on_the_wire_into_misses() {
    // Plain TCP to a lender with slots for sealed blocks, through a proxy that flips a byte in
    // every chunk it forwards to the mount while it is on.
    let srv = ServerProcess::start(bin(), &[], Some("[server]\ncapacity = \"64MiB\"\nslot_bytes = 4160\n"));
    let proxy = mitm(srv.addr());
    let data = pattern((BLOCKS * 4096) as usize, 6);
    let d = dirs(&data);
    let key = d.root.path().join("block.key");
    let out = farcache(&["keygen", "--out", key.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let args =
        ["--server", &proxy.addr.to_string(), "--key-file", key.to_str().unwrap(), LENDERS_FIRST[0], LENDERS_FIRST[1]];
    let m = MountProcess::start(bin(), &d.backing, &d.mnt, &args, &d.root.path().join("log"));
    let mut r = DirectReader::open(&d.mnt.join("f"));
    let before = warm(&mut r, &data, &d.mnt);
    assert_eq!(before["remote"]["auth_failures"].as_u64(), Some(0), "{before}");

    // Most flips land inside sealed blocks (a flip in a frame header drops the connection
    // instead): each is a miss, read from the disk — never a wrong byte.
    proxy.keep_flipping.store(true, Ordering::SeqCst);
    proxy.flip.store(true, Ordering::SeqCst);
    let t = Instant::now();
    let mut s = mount_stats(&d.mnt);
    while s["remote"]["auth_failures"].as_u64().unwrap() == 0 {
        assert!(t.elapsed() < Duration::from_secs(30), "no corrupted block was caught: {s}");
        pass(&mut r, &data, 2);
        s = mount_stats(&d.mnt);
    }
    proxy.flip.store(false, Ordering::SeqCst);
    assert!(proxy.flipped.load(Ordering::SeqCst) > 0);
    let auth = s["remote"]["auth_failures"].as_u64().unwrap();

    // With the wire clean again the lender serves hits, and every read was exact.
    let after = warm(&mut r, &data, &d.mnt);
    assert!(after["remote"]["hits"].as_u64() > s["remote"]["hits"].as_u64(), "{after}");
    assert!(fuse_mounted(&d.mnt));
    drop(r);
    let log = m.stop();
    assert!(log.contains("failed authentication"), "{auth} auth failures, log:\n{log}");
    assert_eq!(fs::read(d.backing.join("f")).unwrap(), data);
}

#[test]
fn the_client_certificate_names_the_tenant() {
    let pki = Pki::new();
    let srv = ServerProcess::start(bin(), &[], Some(&pki.server_toml()));
    let addr = srv.addr().to_string();
    let data = pattern((BLOCKS * 4096) as usize, 7);
    let d = dirs(&data);

    // A mount told another tenant than its certificate's does not start, and says why.
    let mut args = vec!["--server".to_string(), addr.clone(), "--tenant".into(), "db2".into()];
    args.extend(pki.client_args("pki"));
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let e = match MountProcess::try_start(bin(), &d.backing, &d.mnt, &a, &d.root.path().join("log0")) {
        Ok(_) => panic!("a mount started as db2 with db1's certificate"),
        Err(e) => e,
    };
    assert!(e.contains("cache.tenant") && e.contains("is for tenant \"db1\""), "{e}");
    let mut check = vec!["check", "--server", &addr, "--size", "64KiB", "--tenant", "db2"];
    let ok = pki.client_args("pki");
    check.extend(ok.iter().map(|s| s.as_str()));
    let out = farcache(&check);
    assert!(!out.status.success() && text(&out.stderr).contains("is for tenant \"db1\""), "{}", text(&out.stderr));

    // Left at its default, the mount borrows as the certificate's tenant: the lender (open
    // mode, so the CLI's connection is an admin's) holds its blocks under db1.
    let mut args = vec!["--server".to_string(), addr.clone()];
    args.extend(LENDERS_FIRST.map(String::from));
    args.extend(pki.client_args("pki"));
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let m = MountProcess::start(bin(), &d.backing, &d.mnt, &a, &d.root.path().join("log"));
    let mut r = DirectReader::open(&d.mnt.join("f"));
    warm(&mut r, &data, &d.mnt);
    let mut stats = vec!["stats", "--server", &addr, "--json"];
    stats.extend(ok.iter().map(|s| s.as_str()));
    let out = farcache(&stats);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tenants = v["tenants"].as_array().unwrap();
    let names: Vec<&str> = tenants.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["db1"], "{v}");
    assert!(tenants[0]["blocks"].as_u64().unwrap() >= BLOCKS * 9 / 10, "{v}");
    drop(r);
    let log = m.stop();
    assert!(log.contains("as tenant \"db1\""), "{log}");
}
