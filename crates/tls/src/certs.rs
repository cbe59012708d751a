//! A small deployment's PKI: one CA, server certificates and client certificates, as PEM
//! (`farcache certs`). Keys are ECDSA P-256; certificates are valid from now for
//! `valid_days` (a negative span makes expired ones, for tests).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::TlsError;

/// A certificate and its key, PEM.
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A CA that signs server and client certificates.
pub struct Ca {
    pub pair: Pair,
    cert: Certificate,
    key: KeyPair,
}

fn gen_err(e: rcgen::Error) -> TlsError {
    crate::err(format!("cannot generate a certificate: {e}"), "report this as a bug")
}

/// `not_before`/`not_after` for `valid_days` from now (or ending `-valid_days` ago).
pub(crate) fn set_validity(p: &mut CertificateParams, valid_days: i64) {
    let now = crate::now_secs();
    let at = |secs: i64| {
        let t = crate::CertTime(secs).to_string(); // "YYYY-MM-DD HH:MM:SS UTC"
        let n = |r: std::ops::Range<usize>| t[r].parse::<i32>().unwrap_or(1);
        rcgen::date_time_ymd(n(0..4), n(5..7) as u8, n(8..10) as u8)
    };
    if valid_days >= 0 {
        p.not_before = at(now - 86_400);
        p.not_after = at(now + valid_days * 86_400);
    } else {
        p.not_before = at(now + (valid_days - 30) * 86_400);
        p.not_after = at(now + valid_days * 86_400);
    }
}

impl Ca {
    pub fn generate(name: &str, valid_days: i64) -> Result<Ca, TlsError> {
        let key = KeyPair::generate().map_err(gen_err)?;
        let mut p = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        set_validity(&mut p, valid_days);
        let cert = p.self_signed(&key).map_err(gen_err)?;
        let pair = Pair { cert_pem: cert.pem(), key_pem: key.serialize_pem() };
        Ok(Ca { pair, cert, key })
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, names: &[String], valid_days: i64) -> Result<Pair, TlsError> {
        self.leaf(
            names.first().map_or("farcache server", |s| s),
            names,
            ExtendedKeyUsagePurpose::ServerAuth,
            valid_days,
        )
    }

    /// A client certificate whose common name is `name`.
    pub fn client(&self, name: &str, valid_days: i64) -> Result<Pair, TlsError> {
        self.leaf(name, &[], ExtendedKeyUsagePurpose::ClientAuth, valid_days)
    }

    fn leaf(
        &self,
        cn: &str,
        names: &[String],
        eku: ExtendedKeyUsagePurpose,
        valid_days: i64,
    ) -> Result<Pair, TlsError> {
        let key = KeyPair::generate().map_err(gen_err)?;
        let mut p = CertificateParams::new(names.to_vec()).map_err(gen_err)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![eku];
        set_validity(&mut p, valid_days);
        let cert = p.signed_by(&key, &self.cert, &self.key).map_err(gen_err)?;
        Ok(Pair { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

/// Write `text` to a new file `dir/name` (never over an existing one); keys get mode 600.
pub fn write_new(dir: &Path, name: &str, text: &str, private: bool) -> Result<PathBuf, TlsError> {
    let path = dir.join(name);
    let mut f =
        OpenOptions::new().write(true).create_new(true).mode(if private { 0o600 } else { 0o644 }).open(&path).map_err(
            |e| TlsError {
                problem: format!("cannot create {}: {e}", path.display()),
                fix: if e.kind() == std::io::ErrorKind::AlreadyExists {
                    "farcache certs never overwrites: choose an empty --out directory or remove the old files".into()
                } else {
                    "choose a writable --out directory".into()
                },
                file: None,
            },
        )?;
    f.write_all(text.as_bytes()).map_err(|e| TlsError {
        problem: format!("cannot write {}: {e}", path.display()),
        fix: "check the disk".into(),
        file: None,
    })?;
    Ok(path)
}
