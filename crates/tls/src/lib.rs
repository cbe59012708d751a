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

/// What is wrong with a TLS file, as a sentence naming the file, and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{problem}: {fix}")]
pub struct TlsError {
    pub problem: String,
    pub fix: String,
}

const REGENERATE: &str = "generate new ones with farcache certs";

fn err(problem: impl Into<String>, fix: impl Into<String>) -> TlsError {
    TlsError { problem: problem.into(), fix: fix.into() }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| {
        err(
            format!("cannot read {what} {}: {e}", path.display()),
            format!("point it at a readable PEM file, or {REGENERATE} --out DIR"),
        )
    })
}

/// The certificates in a PEM file (a chain: leaf first), each checked not to have expired.
pub fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path, what)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| err(format!("{what} {} is not valid PEM: {e}", path.display()), REGENERATE))?;
    if certs.is_empty() {
        return Err(err(format!("{what} {} holds no CERTIFICATE", path.display()), REGENERATE));
    }
    let now = CertTime::now();
    for c in &certs {
        let Some(end) = not_after(c) else {
            return Err(err(
                format!("{what} {} holds a certificate that cannot be parsed", path.display()),
                REGENERATE,
            ));
        };
        if end < now {
            return Err(err(format!("certificate {} expired on {end}", path.display()), REGENERATE));
        }
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path, what)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| err(format!("{what} {} holds no usable PRIVATE KEY ({e})", path.display()), REGENERATE))
}

fn roots(ca: &Path, what: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(ca, what)? {
        roots
            .add(c)
            .map_err(|e| err(format!("{what} {} is not a usable CA certificate: {e}", ca.display()), REGENERATE))?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn key_mismatch(cert: &Path, key: &Path, e: rustls::Error) -> TlsError {
    err(
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
        .map_err(|e| err(format!("client CA {}: {e}", client_ca.display()), REGENERATE))?;
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
