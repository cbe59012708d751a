//! TLS 1.3 for deployments without a PKI: mutual authentication from one pre-shared key.
//!
//! rustls has no external-PSK handshake (RFC 8446 §2.2 with an out-of-band key), so farcache
//! builds the same guarantee from certificates: both sides derive, from the 32-byte PSK, one
//! Ed25519 CA key (HKDF-SHA256, fixed salt and label) and so the same trust anchor (subject
//! and public key). At start each side makes a fresh leaf key and certificate signed by that
//! CA — the lender one for [`PSK_SERVER_NAME`], the mount one for client authentication — and
//! trusts only certificates chaining to the derived CA. Only a holder of the PSK can sign such
//! a certificate, so a completed handshake proves both peers hold the PSK, and the session
//! gets TLS 1.3's forward secrecy from the ephemeral key exchange.
//!
//! What it does not give: tenants. Anyone with the PSK can sign a certificate with any
//! common name, so in PSK mode the lender takes the tenant from HELLO's name and secret
//! (docs/SECURITY.md), never from the certificate.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use ring::hkdf;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use crate::{err, provider, TlsError};

/// The DNS name in every PSK-mode lender certificate, and the name mounts check.
pub const PSK_SERVER_NAME: &str = "psk.farcache.invalid";
/// Bytes of a PSK.
pub const PSK_BYTES: usize = 32;
/// Days a PSK-mode leaf certificate is valid (made afresh at every start).
const LEAF_DAYS: i64 = 3650;

/// The CA every holder of the PSK derives: its key and self-signed certificate.
struct DerivedCa {
    key: KeyPair,
    cert: rcgen::Certificate,
}

fn gen_err(e: impl std::fmt::Display) -> TlsError {
    err(format!("cannot make the PSK-mode certificates: {e}"), "report this as a bug")
}

/// The Ed25519 seed of the CA: HKDF-SHA256 of the PSK.
fn ca_seed(psk: &[u8; PSK_BYTES]) -> [u8; 32] {
    struct Len32;
    impl hkdf::KeyType for Len32 {
        fn len(&self) -> usize {
            32
        }
    }
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"farcache-psk-v1").extract(psk);
    let okm = prk.expand(&[b"ed25519 CA key"], Len32).expect("32 bytes is a valid HKDF-SHA256 length");
    let mut seed = [0u8; 32];
    okm.fill(&mut seed).expect("lengths agree");
    seed
}

/// A short public fingerprint of the PSK (for logs: two sides with different PSKs show
/// different fingerprints); it reveals nothing about the key.
pub fn fingerprint(psk: &[u8; PSK_BYTES]) -> String {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"farcache-psk-v1").extract(psk);
    struct Len8;
    impl hkdf::KeyType for Len8 {
        fn len(&self) -> usize {
            8
        }
    }
    let mut id = [0u8; 8];
    prk.expand(&[b"fingerprint"], Len8).expect("valid length").fill(&mut id).expect("lengths agree");
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn derive_ca(psk: &[u8; PSK_BYTES]) -> Result<DerivedCa, TlsError> {
    // PKCS#8 v1 wrapping of an Ed25519 seed (RFC 8410 §7): fixed prefix, then the 32 bytes.
    const PREFIX: [u8; 16] =
        [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
    let mut der = PREFIX.to_vec();
    der.extend_from_slice(&ca_seed(psk));
    let key =
        KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(der), &rcgen::PKCS_ED25519).map_err(gen_err)?;
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Subject and key are all a trust anchor keeps: both sides derive the same ones.
    p.distinguished_name.push(DnType::CommonName, format!("farcache PSK CA {}", fingerprint(psk)));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    crate::certs::set_validity(&mut p, LEAF_DAYS);
    let cert = p.self_signed(&key).map_err(gen_err)?;
    Ok(DerivedCa { key, cert })
}

impl DerivedCa {
    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert.der().clone()).map_err(gen_err)?;
        Ok(roots)
    }

    /// A fresh leaf: its chain (leaf, CA) and key.
    fn leaf(
        &self,
        cn: &str,
        names: &[String],
        eku: ExtendedKeyUsagePurpose,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
        let key = KeyPair::generate().map_err(gen_err)?;
        let mut p = CertificateParams::new(names.to_vec()).map_err(gen_err)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![eku];
        crate::certs::set_validity(&mut p, LEAF_DAYS);
        let cert = p.signed_by(&key, &self.cert, &self.key).map_err(gen_err)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((vec![cert.der().clone(), self.cert.der().clone()], key))
    }
}

/// The lender's configuration in PSK mode: TLS 1.3 only, a fresh certificate for
/// [`PSK_SERVER_NAME`], and clients must present one signed by the PSK's CA.
pub fn server_config(psk: &[u8; PSK_BYTES]) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let ca = derive_ca(psk)?;
    let (chain, key) = ca.leaf(PSK_SERVER_NAME, &[PSK_SERVER_NAME.to_string()], ExtendedKeyUsagePurpose::ServerAuth)?;
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(ca.roots()?), provider()).build().map_err(gen_err)?;
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(gen_err)?;
    Ok(Arc::new(cfg))
}

/// The borrower's configuration in PSK mode: TLS 1.3 only, the lender must present a
/// certificate for [`PSK_SERVER_NAME`] signed by the PSK's CA (connect with that name), and
/// the client authenticates with a fresh certificate named `client_name` (informational).
pub fn client_config(psk: &[u8; PSK_BYTES], client_name: &str) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let ca = derive_ca(psk)?;
    let (chain, key) = ca.leaf(client_name, &[], ExtendedKeyUsagePurpose::ClientAuth)?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
        .with_root_certificates(ca.roots()?)
        .with_client_auth_cert(chain, key)
        .map_err(gen_err)?;
    Ok(Arc::new(cfg))
}

/// A pre-shared key from a private file (`farcache keygen`): errors name `key`, the file,
/// what it must hold ([`farcache_config::KEY32_FORMAT`]) and the fix.
pub fn read_file(key: &'static str, path: &std::path::Path) -> Result<[u8; PSK_BYTES], farcache_config::ConfigError> {
    let create = format!(
        "create one with `farcache keygen --out {}` and copy it to every lender and mount (mode 600)",
        path.display()
    );
    farcache_config::read_key32_file(key, path, "a pre-shared key", &create)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_derive_the_same_anchor_and_other_psks_do_not() {
        let (a, b) = ([7u8; 32], [8u8; 32]);
        let (a1, a2, b1) = (derive_ca(&a).unwrap(), derive_ca(&a).unwrap(), derive_ca(&b).unwrap());
        assert_eq!(a1.key.public_key_der(), a2.key.public_key_der());
        assert_ne!(a1.key.public_key_der(), b1.key.public_key_der());
        assert_eq!(fingerprint(&a), fingerprint(&a));
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a).len(), 16);
    }
}
