//! TLS 1.3 with client certificates between the real server and the real client: the right
//! certificates work; plaintext, a missing certificate, another CA's certificate, a wrong
//! server name and bad files are refused.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use farcache_client::{Client, ClientConfig, ClientError, ClientTls, Key};
use farcache_server::{Server, ServerConfig};
use farcache_tls::certs::{write_new, Ca};
use tokio::net::TcpListener;

struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("test CA", 30).unwrap();
        let other = Ca::generate("other CA", 30).unwrap();
        let d = dir.path();
        write_new(d, "ca.pem", &ca.pair.cert_pem, false).unwrap();
        let s = ca.server(&["127.0.0.1".into(), "localhost".into()], 30).unwrap();
        write_new(d, "server.pem", &s.cert_pem, false).unwrap();
        write_new(d, "server.key", &s.key_pem, true).unwrap();
        let c = ca.client("db1", 30).unwrap();
        write_new(d, "client.pem", &c.cert_pem, false).unwrap();
        write_new(d, "client.key", &c.key_pem, true).unwrap();
        let o = other.client("db1", 30).unwrap();
        write_new(d, "other.pem", &o.cert_pem, false).unwrap();
        write_new(d, "other.key", &o.key_pem, true).unwrap();
        let x = ca.client("old", -1).unwrap();
        write_new(d, "expired.pem", &x.cert_pem, false).unwrap();
        write_new(d, "expired.key", &x.key_pem, true).unwrap();
        Pki { dir }
    }

    fn p(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn server_config(&self) -> ServerConfig {
        let s = |n: &str| self.p(n).to_str().unwrap().to_owned();
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            capacity: farcache_config::ByteSize::mib(4),
            shards: 4,
            tls_cert: s("server.pem"),
            tls_key: s("server.key"),
            tls_client_ca: s("ca.pem"),
            ..ServerConfig::default()
        }
    }

    fn client_tls(&self, cert: &str, key: &str) -> ClientTls {
        ClientTls::new(farcache_tls::client_config(&self.p("ca.pem"), &self.p(cert), &self.p(key)).unwrap())
    }
}

async fn start(cfg: ServerConfig) -> std::net::SocketAddr {
    let server = Server::new(cfg).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(farcache_server::run(listener, server, std::future::pending()));
    addr
}

fn client_cfg(addr: std::net::SocketAddr, tls: Option<ClientTls>) -> ClientConfig {
    let mut c = ClientConfig::new(addr, "db1");
    c.tls = tls;
    c.connect_timeout = Duration::from_secs(5);
    c
}

#[tokio::test]
async fn mutual_tls_serves_and_refuses_the_rest() {
    let pki = Pki::new();
    let addr = start(pki.server_config()).await;

    // The right certificates: a round trip.
    let c = Client::connect(client_cfg(addr, Some(pki.client_tls("client.pem", "client.key")))).await.unwrap();
    let k = Key::new(1, 2, 3);
    c.put(&[(k, &[7u8; 4096][..])]).await.unwrap();
    assert_eq!(c.get(&[k]).await.unwrap()[0].as_deref(), Some(&[7u8; 4096][..]));

    // Plaintext: told in the protocol that TLS is required.
    let e = Client::connect(client_cfg(addr, None)).await.unwrap_err();
    assert!(matches!(&e, ClientError::AuthFailed(m) if m.contains("TLS required")), "{e}");

    // A certificate from another CA: the server refuses it (the client sees an alert).
    let e = Client::connect(client_cfg(addr, Some(pki.client_tls("other.pem", "other.key")))).await.unwrap_err();
    assert!(e.to_string().to_lowercase().contains("alert") || matches!(e, ClientError::Tls(_)), "{e}");

    // No client certificate at all.
    let mut roots = farcache_tls::rustls::RootCertStore::empty();
    for cert in farcache_tls::load_certs(&pki.p("ca.pem"), "ca").unwrap() {
        roots.add(cert).unwrap();
    }
    let anon = farcache_tls::rustls::ClientConfig::builder_with_provider(Arc::new(
        farcache_tls::rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&farcache_tls::rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let e = Client::connect(client_cfg(addr, Some(ClientTls::new(Arc::new(anon))))).await.unwrap_err();
    assert!(!matches!(e, ClientError::Config(_)), "{e}");

    // The server's certificate must carry the name the client expects.
    let mut wrong = pki.client_tls("client.pem", "client.key");
    wrong.server_name = Some("lender.example".into());
    let e = Client::connect(client_cfg(addr, Some(wrong))).await.unwrap_err();
    assert!(matches!(&e, ClientError::Tls(m) if m.contains("NotValidForName") || m.contains("not valid for")), "{e}");

    // The server still serves the good client after all that.
    assert_eq!(c.get(&[k]).await.unwrap()[0].as_deref(), Some(&[7u8; 4096][..]));
}

fn start_err(cfg: ServerConfig) -> String {
    match Server::new(cfg) {
        Ok(_) => panic!("server started"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_tls_files_fail_at_start_naming_the_problem() {
    let pki = Pki::new();
    let s = |n: &str| pki.p(n).to_str().unwrap().to_owned();

    let e = start_err(ServerConfig { tls_cert: s("missing.pem"), ..pki.server_config() });
    assert!(
        e.starts_with("server.tls_cert: server certificate ")
            && e.contains("missing.pem does not exist (no such file)")
            && e.contains("farcache certs --out DIR"),
        "{e}"
    );

    std::fs::write(pki.p("garbage.pem"), "not a certificate\n").unwrap();
    let e = start_err(ServerConfig { tls_cert: s("garbage.pem"), ..pki.server_config() });
    assert!(e.contains("garbage.pem") && e.contains("no CERTIFICATE"), "{e}");

    // Each file's problem is named by its own setting, with what it must hold and the fix.
    std::fs::write(pki.p("binary"), [0x30u8, 0x82, 0x01, 0x0a, 0xff, 0x00]).unwrap();
    std::fs::write(pki.p("empty"), "").unwrap();
    for (cfg, key, why) in [
        (ServerConfig { tls_key: s("missing.key"), ..pki.server_config() }, "server.tls_key", "does not exist"),
        (ServerConfig { tls_key: s("server.pem"), ..pki.server_config() }, "server.tls_key", "is this the certificate"),
        (ServerConfig { tls_key: s("binary"), ..pki.server_config() }, "server.tls_key", "binary data, DER perhaps"),
        (ServerConfig { tls_key: s("empty"), ..pki.server_config() }, "server.tls_key", "it is empty"),
        (ServerConfig { tls_cert: s("server.key"), ..pki.server_config() }, "server.tls_cert", "is this the key file"),
        (ServerConfig { tls_cert: s("empty"), ..pki.server_config() }, "server.tls_cert", "it is empty"),
        (ServerConfig { tls_client_ca: s("missing.pem"), ..pki.server_config() }, "server.tls_client_ca", "no such"),
        (ServerConfig { tls_client_ca: s("binary"), ..pki.server_config() }, "server.tls_client_ca", "binary data"),
        (
            ServerConfig { tls_client_ca: s("garbage.pem"), ..pki.server_config() },
            "server.tls_client_ca",
            "text without a -----BEGIN",
        ),
    ] {
        let e = start_err(cfg);
        assert!(e.starts_with(&format!("{key}: ")) && e.contains(why), "{key} {why}: {e}");
        let holds = if key == "server.tls_key" { "a PEM private key" } else { "PEM certificate" };
        assert!(e.contains(holds) && e.contains("generate new ones with farcache certs"), "{e}");
    }

    let e = start_err(ServerConfig { tls_key: s("client.key"), ..pki.server_config() });
    assert!(e.starts_with("server.tls_key: ") && e.contains("does not go with certificate"), "{e}");

    let e = start_err(ServerConfig { tls_cert: s("expired.pem"), tls_key: s("expired.key"), ..pki.server_config() });
    assert!(e.contains("expired.pem expired on") && e.contains("generate new ones with farcache certs"), "{e}");

    let e = start_err(ServerConfig { tls_client_ca: String::new(), ..pki.server_config() });
    assert!(e.contains("must be set together"), "{e}");

    // And the client side, the same way.
    let e = farcache_tls::client_config(&pki.p("ca.pem"), &pki.p("expired.pem"), &pki.p("expired.key")).unwrap_err();
    assert!(e.to_string().contains("expired on"), "{e}");
    assert!(!Path::new(&s("nothing")).exists());
}

#[test]
fn common_name_and_not_after_are_read() {
    let pki = Pki::new();
    let certs = farcache_tls::load_certs(&pki.p("client.pem"), "c").unwrap();
    assert_eq!(farcache_tls::common_name(&certs[0]).as_deref(), Some("db1"));
    let end = farcache_tls::not_after(&certs[0]).unwrap();
    let now = farcache_tls::CertTime::now();
    assert!(end.0 > now.0 + 29 * 86_400 && end.0 < now.0 + 31 * 86_400, "{end}");
}
