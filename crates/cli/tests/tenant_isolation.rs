//! Tenant isolation against the real `farcache server`, by every request a client can send
//! (issue 5): a client holding tenant B's credentials cannot read, overwrite, delete, evict or
//! count tenant A's blocks, and cannot become A. Run twice: with tenant secrets over plain
//! TCP, and with TLS client certificates, where the certificate's common name is the tenant.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use farcache_client::{Client, ClientConfig, ClientError, ClientTls, DelStatus, Key, PutStatus};
use farcache_testkit::{run_with_timeout, ServerProcess};
use serde_json::Value;

const TEST_BOUND: Duration = Duration::from_secs(90);
const SLOT: u64 = 4096;
/// B's limit: small, so that B fills it and must evict (only its own blocks).
const B_LIMIT_BLOCKS: u64 = 1024;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Plain TCP; the tenant is HELLO's name with its secret.
    Secrets,
    /// TLS 1.3; the tenant is the client certificate's common name.
    Certificates,
}

struct Setup {
    _dir: tempfile::TempDir,
    pki: PathBuf,
    mode: Mode,
}

impl Setup {
    fn new(mode: Mode) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        if mode == Mode::Certificates {
            for (out, clients) in [(&pki, &["a", "b", "ops"][..]), (&dir.path().join("other"), &["a"][..])] {
                let mut cmd = Command::new(bin());
                cmd.args(["certs", "--out", out.to_str().unwrap()]);
                for c in clients {
                    cmd.args(["--client", c]);
                }
                let o = run_with_timeout(cmd, Duration::from_secs(30)).unwrap();
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            }
        }
        Setup { _dir: dir, pki, mode }
    }

    fn p(&self, name: &str) -> String {
        self.pki.join(name).to_str().unwrap().to_owned()
    }

    fn server_toml(&self) -> String {
        let limit = format!("{}KiB", B_LIMIT_BLOCKS * SLOT / 1024);
        let tls = match self.mode {
            Mode::Secrets => String::new(),
            Mode::Certificates => format!(
                "tls_cert = {:?}\ntls_key = {:?}\ntls_client_ca = {:?}\n",
                self.p("server.pem"),
                self.p("server.key"),
                self.p("ca.pem")
            ),
        };
        // With certificates, b and ops have no secret (the certificate is the credential);
        // a keeps one, so both must match.
        let secret = |s: &str| match self.mode {
            Mode::Secrets => format!("secret = {s:?}"),
            Mode::Certificates if s == "sa" => format!("secret = {s:?}"),
            Mode::Certificates => String::new(),
        };
        format!(
            "[server]\ncapacity = \"64MiB\"\n{tls}\n\
             [[server.tenant]]\nname = \"a\"\n{}\n\n\
             [[server.tenant]]\nname = \"b\"\n{}\nlimit = \"{limit}\"\n\n\
             [[server.tenant]]\nname = \"ops\"\n{}\nadmin = true\n",
            secret("sa"),
            secret("sb"),
            secret("so")
        )
    }

    /// A client as `tenant` with `secret`, holding `cert`'s certificate (certificates mode;
    /// "other/..." is a certificate from a CA the lender does not trust).
    async fn try_connect(
        &self,
        addr: SocketAddr,
        tenant: &str,
        secret: &str,
        cert: &str,
    ) -> Result<Client, ClientError> {
        let mut cfg = ClientConfig::new(addr, tenant);
        cfg.secret = secret.as_bytes().to_vec();
        cfg.connect_timeout = Duration::from_secs(5);
        cfg.request_timeout = Duration::from_secs(10);
        if self.mode == Mode::Certificates {
            let (pem, key) = if let Some(o) = cert.strip_prefix("other/") {
                let other = self.pki.parent().unwrap().join("other");
                (other.join(format!("client-{o}.pem")), other.join(format!("client-{o}.key")))
            } else {
                (self.pki.join(format!("client-{cert}.pem")), self.pki.join(format!("client-{cert}.key")))
            };
            let config = farcache_tls::client_config(Path::new(&self.p("ca.pem")), &pem, &key).unwrap();
            cfg.tls = Some(ClientTls { config, server_name: Some("localhost".into()) });
        }
        Client::connect(cfg).await
    }

    async fn connect(&self, addr: SocketAddr, tenant: &str, secret: &str) -> Client {
        self.try_connect(addr, tenant, secret, tenant).await.unwrap_or_else(|e| panic!("connect as {tenant}: {e}"))
    }
}

async fn stats(c: &Client) -> Value {
    serde_json::from_str(&c.stats().await.expect("STATS")).expect("STATS is JSON")
}

fn u(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field:?} missing in {v}"))
}

fn names(v: &Value) -> Vec<String> {
    let mut n: Vec<String> =
        v["tenants"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect();
    n.sort();
    n
}

/// A's blocks: a recognisable value per key.
fn a_value(k: &Key) -> Vec<u8> {
    let mut v = vec![0xAA; SLOT as usize];
    v[..8].copy_from_slice(&k.block.to_le_bytes());
    v
}

/// GET `keys` as `c`; the number that came back as A's exact bytes (anything else there fails).
async fn a_blocks_intact(c: &Client, keys: &[Key]) -> usize {
    let got = c.get(keys).await.expect("GET");
    let mut n = 0;
    for (k, v) in keys.iter().zip(&got) {
        let v = v.as_ref().unwrap_or_else(|| panic!("A's block {k:?} is gone"));
        assert_eq!(&v[..], &a_value(k)[..], "A's block {k:?} changed");
        n += 1;
    }
    n
}

fn refused(r: Result<Client, ClientError>, what: &str) -> String {
    match r {
        Err(e @ (ClientError::AuthFailed(_) | ClientError::Tls(_))) => e.to_string(),
        Err(e) => panic!("{what}: refused for the wrong reason: {e}"),
        Ok(_) => panic!("{what}: accepted"),
    }
}

async fn sweep(mode: Mode) {
    let s = Setup::new(mode);
    let srv = ServerProcess::start(bin(), &[], Some(&s.server_toml()));
    let addr = srv.addr();
    let a = s.connect(addr, "a", "sa").await;
    let b = s.connect(addr, "b", "sb").await;
    assert_eq!(a.hello().flags & farcache_wire::HELLO_OK_FLAG_ADMIN, 0);
    assert_eq!(b.hello().flags & farcache_wire::HELLO_OK_FLAG_ADMIN, 0);

    // A stores 64 blocks.
    let keys: Vec<Key> = (0..64).map(|i| Key::new(0xA, i, 1)).collect();
    let values: Vec<Vec<u8>> = keys.iter().map(a_value).collect();
    let entries: Vec<(Key, &[u8])> = keys.iter().zip(&values).map(|(k, v)| (*k, &v[..])).collect();
    assert_eq!(a.put(&entries).await.unwrap(), vec![PutStatus::Stored; 64]);

    // GET: B names A's keys and sees nothing.
    assert_eq!(b.get(&keys).await.unwrap(), vec![None; 64], "B read A's blocks");
    // DEL: B cannot invalidate A's blocks.
    assert_eq!(b.del(&keys).await.unwrap(), vec![DelStatus::Absent; 64], "B deleted A's blocks");
    assert_eq!(a_blocks_intact(&a, &keys).await, 64);
    // PUT: B's writes under the same keys land in B's space only.
    let theirs = vec![0xBB; SLOT as usize];
    let b_entries: Vec<(Key, &[u8])> = keys.iter().map(|k| (*k, &theirs[..])).collect();
    assert_eq!(b.put(&b_entries).await.unwrap(), vec![PutStatus::Stored; 64]);
    assert_eq!(a_blocks_intact(&a, &keys).await, 64, "B overwrote A's blocks");
    assert!(b.get(&keys).await.unwrap().iter().all(|v| v.as_deref() == Some(&theirs[..])));

    // STATS: B sees itself only, and its totals count only its own blocks.
    let sb = stats(&b).await;
    assert_eq!(names(&sb), ["b"], "{sb}");
    assert_eq!(u(&sb, "blocks"), 64, "B's totals count other tenants' blocks: {sb}");
    assert_eq!(u(&sb, "used_bytes"), 64 * SLOT, "{sb}");
    assert_eq!(u(&sb, "connections"), 0, "server-wide connection counts are for admins: {sb}");
    let sa = stats(&a).await;
    assert_eq!((names(&sa), u(&sa, "blocks")), (vec!["a".to_string()], 64), "{sa}");

    // Memory: B filling twice its limit evicts only its own blocks.
    let fill: Vec<Key> = (0..2 * B_LIMIT_BLOCKS).map(|i| Key::new(0xB, i, 1)).collect();
    for chunk in fill.chunks(128) {
        let e: Vec<(Key, &[u8])> = chunk.iter().map(|k| (*k, &theirs[..])).collect();
        let st = b.put(&e).await.unwrap();
        assert!(st.iter().all(|x| *x == PutStatus::Stored), "{st:?}");
    }
    assert_eq!(a_blocks_intact(&a, &keys).await, 64, "B's fill evicted A's blocks");
    let sb = stats(&b).await;
    assert!(u(&sb, "blocks") <= B_LIMIT_BLOCKS, "B holds more than its limit: {sb}");
    assert!(u(&sb, "evictions") >= B_LIMIT_BLOCKS, "B evicted its own: {sb}");
    let sa = stats(&a).await;
    assert_eq!(u(&sa, "evictions"), 0, "{sa}");

    // An admin sees every tenant, and the totals are the sum.
    let ops = s.connect(addr, "ops", "so").await;
    let so = stats(&ops).await;
    assert_eq!(names(&so), ["a", "b", "ops"], "{so}");
    assert_eq!(u(&so, "blocks"), 64 + u(&sb, "blocks"), "{so}");
    assert!(u(&so, "connections") >= 3, "{so}");

    // HELLO: B's credentials cannot become A.
    match mode {
        Mode::Secrets => {
            let e = refused(s.try_connect(addr, "a", "sb", "b").await, "A's name with B's secret");
            assert!(e.contains("unknown tenant or wrong secret"), "{e}");
        }
        Mode::Certificates => {
            // B's certificate with A's name, even with A's right secret.
            let e = refused(s.try_connect(addr, "a", "sa", "b").await, "B's certificate naming A");
            assert!(e.contains("certificate is for tenant \"b\""), "{e}");
            // A's certificate without A's secret: a's secret is still required.
            let e = refused(s.try_connect(addr, "a", "", "a").await, "A's certificate without A's secret");
            assert!(e.contains("unknown tenant or wrong secret"), "{e}");
            // A certificate named "a" from a CA the lender does not trust.
            // (TLS 1.3 rejects a client certificate after the client's last flight, so the
            // client may see a TLS alert or a closed connection; the lender says why.)
            assert!(s.try_connect(addr, "a", "sa", "other/a").await.is_err(), "another CA's certificate for A");
            srv.wait_for_stderr(Duration::from_secs(5), |l| {
                l.contains("client refused: its certificate is not acceptable")
            })
            .unwrap_or_else(|| panic!("no refusal logged:\n{}", srv.stderr_text()));
        }
    }
    // (A second HELLO on a connection is fatal, never a tenant switch: malformed.rs.)
    assert_eq!(a_blocks_intact(&a, &keys).await, 64);
    assert!(!srv.stderr_text().contains("panicked"), "{}", srv.stderr_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_secrets_no_request_of_one_tenant_reaches_anothers_blocks() {
    tokio::time::timeout(TEST_BOUND, sweep(Mode::Secrets)).await.expect("test bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_certificates_the_certificate_is_the_tenant_and_no_request_crosses() {
    tokio::time::timeout(TEST_BOUND, sweep(Mode::Certificates)).await.expect("test bound");
}

#[test]
fn a_tenant_without_a_secret_needs_client_certificates() {
    let toml = "[server]\ncapacity = \"64MiB\"\n[[server.tenant]]\nname = \"a\"\n";
    let mut cmd = Command::new(bin());
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, toml).unwrap();
    cmd.args(["server", "--config", cfg.to_str().unwrap()]);
    let o = run_with_timeout(cmd, Duration::from_secs(30)).unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("server.tenant.secret") && e.contains("has no secret") && e.contains("client certificates"),
        "{e}"
    );
}
