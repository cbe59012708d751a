//! TLS 1.3 for farcache's transport: one stream type for plain TCP or TLS on either side,
//! and the rustls configurations of the lender (server, requiring client certificates signed
//! by one CA) and the borrower (client, presenting its certificate).
//!
//! Loading refuses, at start and with a message that names the file and the fix, a missing
//! or unreadable file, PEM without the expected item, a key that does not match its
//! certificate, and a certificate past its `not_after` date. Only TLS 1.3 is offered, with
//! the `ring` provider.

pub mod certs;
mod der;
pub mod psk;
mod stream;

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

pub use der::{common_name, not_after, CertTime};
pub use rustls;
pub use stream::Stream;
pub use tokio_rustls::{self, TlsAcceptor, TlsConnector};

/// The first byte of a TLS handshake record: a connection that starts otherwise is not TLS.
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Which of a TLS configuration's files an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFile {
    /// The certificate (chain) this side presents.
    Cert,
    /// Its private key.
    Key,
    /// The CA certificate the peer's certificate must be signed by.
    Ca,
}

/// What is wrong with a TLS file, as a sentence naming the file, and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{problem}: {fix}")]
pub struct TlsError {
    pub problem: String,
    pub fix: String,
    /// The file at fault, if the error is about one.
    pub file: Option<TlsFile>,
}

impl TlsError {
    /// The setting or flag, out of `names` (certificate, key, CA), that names the file at
    /// fault; the certificate's when the error is about no one file.
    pub fn setting(&self, names: [&'static str; 3]) -> &'static str {
        match self.file {
            Some(TlsFile::Key) => names[1],
            Some(TlsFile::Ca) => names[2],
            Some(TlsFile::Cert) | None => names[0],
        }
    }

    /// As a configuration error under [`Self::setting`].
    pub fn into_config_error(self, names: [&'static str; 3]) -> farcache_config::ConfigError {
        farcache_config::ConfigError::invalid(self.setting(names), self.problem, self.fix)
    }
}

const REGENERATE: &str = "generate new ones with farcache certs";

fn err(problem: impl Into<String>, fix: impl Into<String>) -> TlsError {
    TlsError { problem: problem.into(), fix: fix.into(), file: None }
}

fn file_err(file: TlsFile, problem: impl Into<String>, fix: impl Into<String>) -> TlsError {
    TlsError { problem: problem.into(), fix: fix.into(), file: Some(file) }
}

/// What a file of kind `file` described as `what` must hold, and which file `farcache certs`
/// writes for it, as the fix for a file that is missing or holds something else.
fn expected(file: TlsFile, what: &str) -> String {
    let made = match what {
        "server certificate" => " such as DIR/server.pem",
        "server key" => " such as DIR/server.key",
        "client certificate" => " such as DIR/client-TENANT.pem",
        "client key" => " such as DIR/client-TENANT.key",
        "CA certificate" | "client CA certificate" => " such as DIR/ca.pem",
        _ => "",
    };
    let holds = match file {
        TlsFile::Cert => "a PEM certificate chain (-----BEGIN CERTIFICATE----- blocks, this side's first)",
        TlsFile::Key => "a PEM private key (-----BEGIN PRIVATE KEY-----; PKCS#8, PKCS#1 or SEC1)",
        TlsFile::Ca => "the CA's PEM certificate (-----BEGIN CERTIFICATE-----)",
    };
    format!("it must be {holds}{made} from `farcache certs --out DIR`: point it at one, or {REGENERATE}")
}

fn read(path: &Path, what: &str, file: TlsFile) -> Result<Vec<u8>, TlsError> {
    let shown = path.display();
    std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            file_err(file, format!("{what} {shown} does not exist (no such file)"), expected(file, what))
        }
        std::io::ErrorKind::IsADirectory => {
            file_err(file, format!("{what} {shown} is a directory, not a PEM file"), expected(file, what))
        }
        std::io::ErrorKind::PermissionDenied => file_err(
            file,
            format!("cannot read {what} {shown}: permission denied"),
            "make it readable by the user running farcache",
        ),
        _ => {
            file_err(file, format!("cannot read {what} {shown}: {e}"), "make it readable by the user running farcache")
        }
    })
}

/// What a file without the PEM item it should hold holds instead, for the message.
fn instead(pem: &[u8]) -> &'static str {
    let has = |needle: &str| pem.windows(needle.len()).any(|w| w == needle.as_bytes());
    if pem.is_empty() {
        "it is empty"
    } else if pem.iter().all(u8::is_ascii_whitespace) {
        "it holds only white space"
    } else if has("-----BEGIN") {
        if has("PRIVATE KEY-----") && !has("-----BEGIN CERTIFICATE") {
            "it holds a private key, not a certificate (is this the key file?)"
        } else if has("-----BEGIN CERTIFICATE") && !has("PRIVATE KEY-----") {
            "it holds a certificate, not a private key (is this the certificate file?)"
        } else {
            "its PEM blocks are of another kind"
        }
    } else if std::str::from_utf8(pem).is_err() || pem.contains(&0) {
        if pem[0] == 0x30 {
            "it holds binary data, DER perhaps, not PEM text (convert DER with `openssl x509 -inform der` or \
             `openssl pkey -inform der`)"
        } else {
            "it holds binary data, not PEM text"
        }
    } else {
        "it holds text without a -----BEGIN ...----- line"
    }
}

/// The certificates in a PEM file (a chain: leaf first), each checked not to have expired.
pub fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    load_certs_as(path, what, TlsFile::Cert)
}

fn load_certs_as(path: &Path, what: &str, file: TlsFile) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path, what, file)?;
    let shown = path.display();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(file, format!("{what} {shown} is not valid PEM: {e}"), expected(file, what)))?;
    if certs.is_empty() {
        return Err(file_err(
            file,
            format!("{what} {shown} holds no CERTIFICATE (-----BEGIN CERTIFICATE-----): {}", instead(&pem)),
            expected(file, what),
        ));
    }
    let now = CertTime::now();
    for c in &certs {
        let Some(end) = not_after(c) else {
            return Err(file_err(
                file,
                format!("{what} {shown} holds a certificate that cannot be parsed"),
                expected(file, what),
            ));
        };
        if end < now {
            return Err(file_err(file, format!("certificate {shown} expired on {end}"), REGENERATE));
        }
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    let file = TlsFile::Key;
    let pem = read(path, what, file)?;
    let shown = path.display();
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => file_err(
            file,
            format!("{what} {shown} holds no PRIVATE KEY (-----BEGIN PRIVATE KEY-----): {}", instead(&pem)),
            expected(file, what),
        ),
        e => file_err(file, format!("{what} {shown} holds no usable PRIVATE KEY ({e})"), expected(file, what)),
    })
}

fn roots(ca: &Path, what: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in load_certs_as(ca, what, TlsFile::Ca)? {
        roots.add(c).map_err(|e| {
            file_err(
                TlsFile::Ca,
                format!("{what} {} is not a usable CA certificate: {e}", ca.display()),
                expected(TlsFile::Ca, what),
            )
        })?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn key_mismatch(cert: &Path, key: &Path, e: rustls::Error) -> TlsError {
    file_err(
        TlsFile::Key,
        format!("key {} does not go with certificate {}: {e}", key.display(), cert.display()),
        format!("use the key generated with that certificate, or {REGENERATE}"),
    )
}

/// The lender's configuration: TLS 1.3 only, its certificate chain and key, and clients must
/// present a certificate signed by `client_ca`.
pub fn server_config(cert: &Path, key: &Path, client_ca: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = load_certs(cert, "server certificate")?;
    let k = load_key(key, "server key")?;
    let roots = roots(client_ca, "client CA certificate")?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| file_err(TlsFile::Ca, format!("client CA {}: {e}", client_ca.display()), REGENERATE))?;
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, k)
        .map_err(|e| key_mismatch(cert, key, e))?;
    Ok(Arc::new(cfg))
}

/// The borrower's configuration: TLS 1.3 only, lenders must present a certificate signed by
/// `ca`, and the client authenticates with `cert` and `key`.
pub fn client_config(ca: &Path, cert: &Path, key: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let roots = roots(ca, "CA certificate")?;
    let chain = load_certs(cert, "client certificate")?;
    let k = load_key(key, "client key")?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, k)
        .map_err(|e| key_mismatch(cert, key, e))?;
    Ok(Arc::new(cfg))
}

/// Why a server-side handshake failed, in words for the operator's log line.
pub fn describe_server_handshake_error(e: &std::io::Error) -> String {
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::NoCertificatesPresented) => {
            "client refused: it presented no certificate (TLS required with a client certificate signed by server.tls_client_ca)".into()
        }
        Some(rustls::Error::InvalidCertificate(c)) => {
            format!("client refused: its certificate is not acceptable ({c:?}); it must be signed by server.tls_client_ca and unexpired")
        }
        Some(rustls::Error::AlertReceived(
            a @ (rustls::AlertDescription::UnknownCA
            | rustls::AlertDescription::BadCertificate
            | rustls::AlertDescription::CertificateUnknown),
        )) => format!(
            "TLS handshake failed: the client rejected this lender's certificate ({a:?}): it trusts another CA, \
             or holds another pre-shared key"
        ),
        Some(other) => format!("TLS handshake failed: {other}"),
        None => format!("TLS handshake failed: {e}"),
    }
}

/// Seconds since the Unix epoch now (for expiry checks).
pub(crate) fn now_secs() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file under the system's temporary directory, removed on drop.
    struct Tmp(std::path::PathBuf);

    impl Tmp {
        fn new(name: &str, content: &[u8]) -> Tmp {
            let p = std::env::temp_dir().join(format!("farcache-tls-test-{}-{name}", std::process::id()));
            std::fs::write(&p, content).unwrap();
            Tmp(p)
        }
    }

    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn a_file_without_the_item_says_what_it_holds_instead() {
        let ca = certs::Ca::generate("t", 30).unwrap();
        let (cert, key) = (ca.pair.cert_pem.as_bytes(), ca.pair.key_pem.as_bytes());
        assert_eq!(instead(b""), "it is empty");
        assert_eq!(instead(b" \n\t\n"), "it holds only white space");
        assert!(instead(key).contains("is this the key file?"));
        assert!(instead(cert).contains("is this the certificate file?"));
        assert!(instead(b"-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n").contains("another kind"));
        assert!(instead(&[0x30, 0x82, 0x01, 0x0a, 0x02]).contains("DER perhaps"));
        assert!(instead(&[0xff, 0xd8, 0xff, 0xe0]).contains("binary data, not PEM text"));
        assert!(instead(b"hello\n").contains("text without a -----BEGIN"));
    }

    #[test]
    fn each_file_is_named_with_what_it_must_hold_and_the_fix() {
        let ca = certs::Ca::generate("t", 30).unwrap();
        let pair = ca.server(&["localhost".into()], 30).unwrap();
        let cert = Tmp::new("cert.pem", pair.cert_pem.as_bytes());
        let key = Tmp::new("key.pem", pair.key_pem.as_bytes());
        let ca_pem = Tmp::new("ca.pem", ca.pair.cert_pem.as_bytes());
        let binary = Tmp::new("binary", &[0x30, 0x82, 0x00, 0xff]);
        server_config(&cert.0, &key.0, &ca_pem.0).unwrap();

        let names = ["x.tls_cert", "x.tls_key", "x.tls_ca"];
        let missing = std::env::temp_dir().join("farcache-tls-test-none.pem");
        let srv = |c: &Path, k: &Path, a: &Path| server_config(c, k, a).map(drop);
        let cli = |a: &Path, c: &Path, k: &Path| client_config(a, c, k).map(drop);
        for (e, setting, why, holds) in [
            (srv(&missing, &key.0, &ca_pem.0), "x.tls_cert", "does not exist (no such file)", "certificate"),
            (srv(&cert.0, &missing, &ca_pem.0), "x.tls_key", "does not exist (no such file)", "private key"),
            (srv(&cert.0, &key.0, &missing), "x.tls_ca", "does not exist (no such file)", "CA's PEM"),
            (srv(&binary.0, &key.0, &ca_pem.0), "x.tls_cert", "DER perhaps", "certificate"),
            (srv(&cert.0, &binary.0, &ca_pem.0), "x.tls_key", "DER perhaps", "private key"),
            (srv(&cert.0, &key.0, &binary.0), "x.tls_ca", "DER perhaps", "CA's PEM"),
            (srv(&key.0, &cert.0, &ca_pem.0), "x.tls_cert", "is this the key file?", "certificate"),
            (cli(&ca_pem.0, &cert.0, &cert.0), "x.tls_key", "is this the certificate file?", "private key"),
            (cli(&key.0, &cert.0, &key.0), "x.tls_ca", "is this the key file?", "CA's PEM"),
        ] {
            let e = e.unwrap_err();
            assert_eq!(e.setting(names), setting, "{e}");
            let msg = e.into_config_error(names).to_string();
            assert!(msg.starts_with(&format!("{setting}: ")) && msg.contains(why), "{msg}");
            assert!(msg.contains(holds) && msg.contains("generate new ones with farcache certs"), "{msg}");
            assert!(!msg.contains("readable"), "the fix is the file, not its permissions: {msg}");
        }
        let e = server_config(&cert.0, &std::env::temp_dir(), &ca_pem.0).map(drop).unwrap_err();
        assert!(e.problem.contains("is a directory, not a PEM file") && e.file == Some(TlsFile::Key), "{e}");
        let other = certs::Ca::generate("other", 30).unwrap().server(&["localhost".into()], 30).unwrap();
        let other_key = Tmp::new("other.key", other.key_pem.as_bytes());
        let e = server_config(&cert.0, &other_key.0, &ca_pem.0).map(drop).unwrap_err();
        assert_eq!(e.setting(names), "x.tls_key", "{e}");
        assert!(e.problem.contains("does not go with certificate"), "{e}");
    }
}
