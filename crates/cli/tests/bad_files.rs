//! Bad key, secret, certificate and configuration files through the real binary (issue 17,
//! "Clear errors"). For each kind of bad file — binary data, the wrong length, not hex,
//! empty, missing, a directory, one the process may not read — every command that reads one
//! stops at start (exit status 1) with one message that names the setting or flag, the file,
//! what the file must hold and the fix (`farcache keygen`, `farcache certs`, `farcache
//! config`), and that tells the operator to change permissions only when permissions are the
//! problem.
//!
//! A file the process may not read: as root (which reads everything) the command runs as
//! `nobody` on a root-owned file of mode 600; otherwise the file gets mode 000.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use farcache_testkit::{run_with_timeout, text, MountProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Run `farcache ARGS`, which must fail at start: its message (stderr), checked to be one
/// `farcache: error:` line that never blames permissions unless `unreadable`.
fn refused_by(args: &[&str], unreadable: bool) -> String {
    let mut cmd = Command::new(bin());
    cmd.args(args).env("FARCACHE_LOG", "error");
    if unreadable && is_root() {
        cmd.uid(65534).gid(65534); // nobody
    }
    let out = run_with_timeout(cmd, Duration::from_secs(30)).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?} did not fail at start:\n{e}{}", text(&out.stdout));
    assert!(e.starts_with("farcache: error: "), "{args:?}: {e}");
    assert!(!e.contains("stream did not contain valid UTF-8"), "{args:?}: {e}");
    assert_eq!(e.contains("readable by"), unreadable, "{args:?}: permissions named {}: {e}", !unreadable);
    e
}

fn refused(args: &[&str]) -> String {
    refused_by(args, false)
}

/// A directory of bad files, readable by `nobody` (for the unreadable case as root).
struct Files {
    dir: tempfile::TempDir,
}

const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n";

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let f = Files { dir };
        // 32 bytes, not UTF-8, starting like DER: a raw key, or a certificate in DER.
        let mut binary = vec![0x30u8, 0x82, 0x01, 0x0a];
        binary.extend((0..28).map(|i| 0x80 + i as u8));
        f.put("binary", &binary, 0o600);
        f.put("empty", b"", 0o600);
        f.put("short", b"deadbeef\n", 0o600);
        f.put("nonhex", "xy".repeat(32).as_bytes(), 0o600);
        f.put("toolong", "x".repeat(129).as_bytes(), 0o600);
        f.put("text", b"hello\n", 0o600);
        fs::create_dir(f.dir.path().join("dir")).unwrap();
        f
    }

    fn p(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }

    fn put(&self, name: &str, content: &[u8], mode: u32) -> String {
        let p = self.p(name);
        fs::write(&p, content).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    /// `content` in a file that is private and good but that the command cannot read.
    fn unreadable(&self, name: &str, content: &[u8]) -> String {
        self.put(name, content, if is_root() { 0o600 } else { 0o000 })
    }

    /// A configuration file holding `toml`, readable by anyone.
    fn toml(&self, name: &str, toml: &str) -> String {
        self.put(name, toml.as_bytes(), 0o644)
    }

    /// `farcache certs` into `pki/`, readable by `nobody` too.
    fn pki(&self) {
        let out = farcache_testkit::run_bin(bin(), &["certs", "--out", &self.p("pki"), "--client", "db1"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        fs::set_permissions(self.p("pki"), fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Every message about a 256-bit key file (the block key, a TLS pre-shared key).
fn names_key_format_and_keygen(e: &str, key: &str, path: &str) {
    assert!(e.contains(&format!("{key}: ")) && e.contains(path), "{key} {path}: {e}");
    assert!(e.contains(&format!("farcache keygen --out {path}")), "{e}");
}

#[test]
fn bad_block_key_files_name_the_format_and_keygen() {
    let f = Files::new();
    let b = tempfile::tempdir().unwrap();
    let (back, mnt) = (b.path().join("b"), b.path().join("m"));
    fs::create_dir(&back).unwrap();
    fs::create_dir(&mnt).unwrap();
    let unreadable = f.unreadable("unreadable", HEX.as_bytes());
    for (name, why) in [
        ("binary", "holds binary data (32 bytes that are not UTF-8 text), where the block key must be written as text"),
        ("short", "does not hold a block key: its key is 8 characters long, not 64 hexadecimal characters"),
        ("nonhex", "does not hold a block key: character 1 of its key is not a hex digit"),
        ("empty", "does not hold a block key: it is empty"),
        ("missing", "does not exist (no such file)"),
    ] {
        let path = f.p(name);
        // The mount, with the flag.
        let e = match MountProcess::try_start(bin(), &back, &mnt, &["--key-file", &path], &b.path().join("log")) {
            Ok(m) => panic!("mounted with the {name} key file:\n{}", m.stop()),
            Err(e) => e,
        };
        assert!(e.contains("exited (exit status: 1)") && !e.contains("readable by"), "{e}");
        for e in [e, refused(&["config", "--check", &f.toml("c.toml", &format!("[cache]\nkey_file = {path:?}\n"))])] {
            names_key_format_and_keygen(&e, "cache.key_file", &path);
            assert!(e.contains(why), "{name}: {e}");
            assert!(e.contains("64 hex digits on one line"), "{name}: the format: {e}");
        }
    }
    let e =
        refused_by(&["config", "--check", &f.toml("c.toml", &format!("[cache]\nkey_file = {unreadable:?}\n"))], true);
    assert!(e.contains(&format!("cache.key_file: cannot read {unreadable}: permission denied")), "{e}");
    assert!(e.contains("make it readable by the mount's user"), "{e}");
}

#[test]
fn bad_psk_files_name_the_format_and_keygen_for_lenders_mounts_and_tools() {
    let f = Files::new();
    let unreadable = f.unreadable("unreadable", HEX.as_bytes());
    let format = "it must hold 64 hexadecimal characters (a 256-bit key) on one line";
    for (name, why) in [
        ("binary", "holds binary data (32 bytes that are not UTF-8 text), not a pre-shared key written in hex"),
        ("short", "does not hold a pre-shared key: its key is 8 characters long, not 64 hexadecimal characters"),
        ("nonhex", "does not hold a pre-shared key: character 1 of its key is not a hex digit"),
        ("empty", "does not hold a pre-shared key: it is empty"),
        ("missing", "does not exist (no such file)"),
    ] {
        let path = f.p(name);
        let lender = f.toml("s.toml", &format!("[server]\ncapacity = \"16MiB\"\ntls_psk_file = {path:?}\n"));
        let mount = f.toml("m.toml", &format!("[cache]\ntls_psk_file = {path:?}\n"));
        for (key, e) in [
            ("server.tls_psk_file", refused(&["server", "--listen", "127.0.0.1:0", "--config", &lender])),
            ("cache.tls_psk_file", refused(&["config", "--check", &mount])),
            ("--tls-psk-file", refused(&["stats", "--server", "127.0.0.1:9", "--tls-psk-file", &path])),
            ("--tls-psk-file", refused(&["check", "--server", "127.0.0.1:9", "--tls-psk-file", &path])),
        ] {
            names_key_format_and_keygen(&e, key, &path);
            assert!(e.contains(why) && e.contains(format), "{key} {name}: {e}");
            if name == "binary" {
                assert!(e.contains("32 raw bytes"), "{e}");
            }
        }
    }
    let lender = f.toml("s.toml", &format!("[server]\ncapacity = \"16MiB\"\ntls_psk_file = {unreadable:?}\n"));
    for (args, who) in [
        (vec!["server", "--listen", "127.0.0.1:0", "--config", &lender], "server.tls_psk_file: cannot read"),
        (vec!["stats", "--server", "127.0.0.1:9", "--tls-psk-file", &unreadable], "--tls-psk-file: cannot read"),
    ] {
        let e = refused_by(&args, true);
        assert!(e.contains(&format!("{who} {unreadable}: permission denied")), "{e}");
        assert!(e.contains("make it readable by the"), "{e}");
    }
}

#[test]
fn bad_certificate_files_are_named_by_their_own_setting_with_the_pem_expected_and_farcache_certs() {
    let f = Files::new();
    f.pki();
    let pki = |n: &str| f.p(&format!("pki/{n}"));
    let unreadable = f.unreadable("unreadable.pem", &fs::read(pki("server.key")).unwrap());
    let kinds = [
        ("binary", "DER perhaps"),
        ("empty", "it is empty"),
        ("text", "text without a -----BEGIN"),
        ("missing", "does not exist (no such file)"),
        ("dir", "is a directory, not a PEM file"),
    ];
    let lender = |cert: &str, key: &str, ca: &str| {
        let toml =
            format!("[server]\ncapacity = \"16MiB\"\ntls_cert = {cert:?}\ntls_key = {key:?}\ntls_client_ca = {ca:?}\n");
        refused_by(&["server", "--listen", "127.0.0.1:0", "--config", &f.toml("s.toml", &toml)], cert == unreadable)
    };
    let (cert, key, ca) = (pki("server.pem"), pki("server.key"), pki("ca.pem"));
    let (ccert, ckey) = (pki("client-db1.pem"), pki("client-db1.key"));
    let mount = |ca: &str, cert: &str, key: &str| {
        let toml = format!("[cache]\ntls_ca = {ca:?}\ntls_cert = {cert:?}\ntls_key = {key:?}\n");
        refused(&["config", "--check", &f.toml("m.toml", &toml)])
    };
    let tool = |ca: &str, cert: &str, key: &str| {
        refused(&["check", "--server", "127.0.0.1:9", "--tls-ca", ca, "--tls-cert", cert, "--tls-key", key])
    };
    for (name, why) in kinds {
        let bad = f.p(name);
        for (setting, e) in [
            ("server.tls_cert", lender(&bad, &key, &ca)),
            ("server.tls_key", lender(&cert, &bad, &ca)),
            ("server.tls_client_ca", lender(&cert, &key, &bad)),
            ("cache.tls_ca", mount(&bad, &ccert, &ckey)),
            ("cache.tls_cert", mount(&ca, &bad, &ckey)),
            ("cache.tls_key", mount(&ca, &ccert, &bad)),
            ("--tls-ca", tool(&bad, &ccert, &ckey)),
            ("--tls-cert", tool(&ca, &bad, &ckey)),
            ("--tls-key", tool(&ca, &ccert, &bad)),
        ] {
            assert!(e.starts_with(&format!("farcache: error: {setting}: ")) && e.contains(&bad), "{setting}: {e}");
            assert!(e.contains(why), "{setting} {name}: {e}");
            let holds = if setting.ends_with("key") { "a PEM private key" } else { "PEM certificate" };
            assert!(e.contains(holds) && e.contains("`farcache certs --out DIR`"), "{setting} {name}: {e}");
        }
    }
    // A key where the certificate goes, and the other way round.
    let e = lender(&key, &cert, &ca);
    assert!(e.contains("server.tls_cert: ") && e.contains("it holds a private key, not a certificate"), "{e}");
    let e = mount(&ca, &ccert, &ccert);
    assert!(e.contains("cache.tls_key: ") && e.contains("it holds a certificate, not a private key"), "{e}");
    // The mount itself, with the flags.
    let b = tempfile::tempdir().unwrap();
    let (back, mnt) = (b.path().join("b"), b.path().join("m"));
    fs::create_dir(&back).unwrap();
    fs::create_dir(&mnt).unwrap();
    let args = ["--tls-ca", &ca, "--tls-cert", &ccert, "--tls-key", &f.p("binary")];
    let e = match MountProcess::try_start(bin(), &back, &mnt, &args, &b.path().join("log")) {
        Ok(m) => panic!("mounted with a binary TLS key:\n{}", m.stop()),
        Err(e) => e,
    };
    assert!(
        e.contains("cache.tls_key: client key") && e.contains("DER perhaps") && e.contains("farcache certs"),
        "{e}"
    );
    // Only a file that cannot be read is a matter of permissions.
    let e = lender(&unreadable, &key, &ca);
    assert!(e.contains(&format!("server.tls_cert: cannot read server certificate {unreadable}: permission denied")));
    assert!(e.contains("make it readable by the user running farcache"), "{e}");
}

#[test]
fn bad_tenant_secret_files_name_the_tenant_the_file_and_what_it_must_hold() {
    let f = Files::new();
    let unreadable = f.unreadable("unreadable", b"s3cret\n");
    for (name, why) in [
        ("binary", "holds binary data (32 bytes that are not UTF-8 text)"),
        ("empty", "1 to 128 bytes"),
        ("toolong", "1 to 128 bytes"),
        ("missing", "does not exist (no such file)"),
        ("dir", ""),
    ] {
        let path = f.p(name);
        let lender =
            format!("[server]\ncapacity = \"16MiB\"\n[[server.tenant]]\nname = \"db1\"\nsecret_file = {path:?}\n");
        let e = refused(&["server", "--listen", "127.0.0.1:0", "--config", &f.toml("s.toml", &lender)]);
        assert!(e.contains("server.tenant.secret_file: tenant \"db1\": ") && e.contains(&path), "{e}");
        assert!(e.contains(why) && e.contains("secret (1 to 128 bytes) on the first line of"), "{name}: {e}");

        let e = refused(&["config", "--check", &f.toml("m.toml", &format!("[cache]\nsecret_file = {path:?}\n"))]);
        assert!(e.contains("cache.secret_file: ") && e.contains(&path) && e.contains(why), "{name}: {e}");
        let holds = if name == "dir" { "is not a regular file" } else { "on the first line" };
        assert!(e.contains(holds), "{name}: {e}");

        for cmd in ["check", "stats"] {
            let e = refused(&[cmd, "--server", "127.0.0.1:9", "--secret-file", &path]);
            assert!(e.contains("--secret-file: ") && e.contains(&path) && e.contains(why), "{cmd} {name}: {e}");
            assert!(e.contains("secret (1 to 128 bytes") && e.contains("on the first line"), "{cmd} {name}: {e}");
        }
    }
    let e = refused_by(&["check", "--server", "127.0.0.1:9", "--secret-file", &unreadable], true);
    assert!(e.contains(&format!("--secret-file: cannot read {unreadable}: permission denied")), "{e}");
    let toml = f.toml("m.toml", &format!("[cache]\nsecret_file = {unreadable:?}\n"));
    let e = refused_by(&["config", "--check", &toml], true);
    assert!(e.contains("cache.secret_file: cannot read") && e.contains("readable by the mount's user"), "{e}");
}

#[test]
fn bad_config_files_name_the_flag_the_file_and_the_template() {
    let f = Files::new();
    let unreadable = f.unreadable("unreadable.toml", b"[server]\n");
    let typo = f.toml("typo.toml", "[server]\ncapasity = \"1GiB\"\n");
    let key = f.put("key.toml", HEX.as_bytes(), 0o644);
    let dir = f.p("dir");
    let (missing, binary) = (f.p("missing.toml"), f.p("binary"));
    let cases = [
        (&missing, "no such file; check the path, or create the file: `farcache config > "),
        (&binary, "holds binary data (32 bytes that are not UTF-8 text), not a TOML configuration"),
        (&key, "is not a valid farcache configuration: TOML parse error at line 1"),
        (&typo, "is not a valid farcache configuration: TOML parse error at line 2"),
        (&dir, "is a directory, not a TOML file"),
    ];
    let b = tempfile::tempdir().unwrap();
    let (back, mnt) = (b.path().join("b"), b.path().join("m"));
    fs::create_dir(&back).unwrap();
    fs::create_dir(&mnt).unwrap();
    for (path, why) in cases {
        let mount = match MountProcess::try_start(bin(), &back, &mnt, &["--config", path], &b.path().join("log")) {
            Ok(m) => panic!("mounted with --config {path}:\n{}", m.stop()),
            Err(e) => e,
        };
        for (flag, e) in [
            ("--config", refused(&["server", "--listen", "127.0.0.1:0", "--config", path])),
            ("--config", mount),
            ("--check", refused(&["config", "--check", path])),
        ] {
            assert!(e.contains(&format!("{flag} {path}")) && e.contains(why), "{flag} {path}: {e}");
            assert!(e.contains("farcache config"), "{flag} {path}: the fix: {e}");
            assert!(!e.contains("os error") && !e.contains("readable by"), "{flag} {path}: {e}");
        }
    }
    let e = refused(&["config", "--check", &typo]);
    assert!(e.contains("capasity") && e.contains("`farcache config` prints the template"), "{e}");
    let e = refused_by(&["server", "--listen", "127.0.0.1:0", "--config", &unreadable], true);
    assert!(e.contains(&format!("--config {unreadable}: cannot read it: permission denied")), "{e}");
    assert!(e.contains("make it readable by the user running farcache"), "{e}");
}
