pub mod balance;
pub mod bench;
pub mod certs;
pub mod check;
pub mod config;
pub mod keygen;
pub mod lenders;
pub mod mount;
pub mod preflight;
pub mod randread;
pub mod server;
pub mod stats;
pub mod supervise;
pub mod tier;
pub mod warmup;

/// `--metrics-listen`: an IP:PORT, or "" for none; an error gives the fix.
pub fn parse_metrics_listen(s: &str) -> Result<String, String> {
    farcache_config::metrics_listen("--metrics-listen", s).map(|_| s.to_string()).map_err(|e| e.to_string())
}

/// The secret in the first line of `path` (for `--secret-file`), or none. Refuses, naming
/// the flag, the file and the fix, a file that is missing, unreadable, binary, or whose first
/// line is not 1 to 128 bytes (what a tenant secret is, server.tenant.secret_file).
pub fn read_secret_file(path: Option<&std::path::Path>) -> anyhow::Result<Vec<u8>> {
    let Some(p) = path else { return Ok(Vec::new()) };
    let write = format!(
        "write the tenant's secret (1 to 128 bytes, as the lender's [[server.tenant]] has it) on the first line \
         of {}",
        p.display()
    );
    let text = farcache_config::read_text_file("--secret-file", p, "a secret", &write)?;
    let secret = text.lines().next().unwrap_or("").trim().as_bytes().to_vec();
    if secret.is_empty() || secret.len() > farcache_wire::MAX_SECRET_BYTES {
        return Err(farcache_config::ConfigError::invalid(
            "--secret-file",
            format!("{} holds a {}-byte secret on its first line, not 1 to 128 bytes", p.display(), secret.len()),
            write,
        )
        .into());
    }
    Ok(secret)
}

/// How [`TlsArgs`]'s certificate files are named in errors: certificate, key, CA.
const TLS_FLAGS: [&str; 3] = ["--tls-cert", "--tls-key", "--tls-ca"];

/// `--tls-ca`, `--tls-cert`, `--tls-key`, `--tls-server-name`: TLS 1.3 with a client
/// certificate, for commands that connect to lenders.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// CA certificate (PEM) the lender's certificate must be signed by; with --tls-cert and
    /// --tls-key, connect with TLS 1.3 (`farcache certs` makes all three).
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<std::path::PathBuf>,
    /// This client's certificate (PEM).
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<std::path::PathBuf>,
    /// This client's private key (PEM).
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_cert"])]
    pub tls_key: Option<std::path::PathBuf>,
    /// The name the lender's certificate must carry (default: the host given).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// TLS 1.3 from a pre-shared key instead of certificates: a file of 64 hex digits, mode
    /// 600, that the lenders hold too (`farcache keygen --out FILE` makes one).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["tls_ca", "tls_cert", "tls_key"])]
    pub tls_psk_file: Option<std::path::PathBuf>,
}

impl TlsArgs {
    /// The client's TLS settings for a lender given as `host` (its name or address), or
    /// none without `--tls-ca`. Bad files fail here, naming the file and the fix.
    pub fn client_tls(&self, host: &str) -> anyhow::Result<Option<farcache_client::ClientTls>> {
        if let Some(p) = &self.tls_psk_file {
            let psk = farcache_tls::psk::read_file("--tls-psk-file", p)?;
            let config = farcache_tls::psk::client_config(&psk, "farcache-cli")?;
            let server_name = Some(farcache_tls::psk::PSK_SERVER_NAME.to_string());
            return Ok(Some(farcache_client::ClientTls { config, server_name }));
        }
        let (Some(ca), Some(cert), Some(key)) = (&self.tls_ca, &self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let config = farcache_tls::client_config(ca, cert, key).map_err(|e| e.into_config_error(TLS_FLAGS))?;
        let name = self.tls_server_name.clone().unwrap_or_else(|| {
            let h = host.rsplit_once(':').map_or(host, |(h, _)| h);
            h.trim_start_matches('[').trim_end_matches(']').to_owned()
        });
        Ok(Some(farcache_client::ClientTls { config, server_name: Some(name) }))
    }

    /// The tenant to connect as: with a client certificate, its common name (lenders take
    /// the tenant from it), which `given` may repeat but not contradict; else `given`, or
    /// `default`.
    pub fn tenant(&self, given: Option<&str>, default: &str) -> anyhow::Result<String> {
        let Some(cert) = &self.tls_cert else {
            return Ok(given.unwrap_or(default).to_string());
        };
        let certs = farcache_tls::load_certs(cert, "client certificate").map_err(|e| e.into_config_error(TLS_FLAGS))?;
        let Some(cn) = certs.first().and_then(farcache_tls::common_name) else {
            anyhow::bail!(
                "client certificate {} has no common name, and lenders take the tenant from it; \
                 make one with `farcache certs --client TENANT`",
                cert.display()
            );
        };
        match given {
            Some(t) if t != cn => anyhow::bail!(
                "--tenant {t:?}, but the client certificate {} is for tenant {cn:?}: lenders take the tenant from \
                 the certificate; leave --tenant out or use that tenant's certificate",
                cert.display()
            ),
            _ => Ok(cn),
        }
    }

    /// Put the flags given into the `[cache]` table (for `farcache mount`).
    pub fn apply(&self, c: &mut farcache_engine::config::CacheConfig) {
        let s = |p: &std::path::PathBuf| p.display().to_string();
        if let (Some(ca), Some(cert), Some(key)) = (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (c.tls_ca, c.tls_cert, c.tls_key) = (s(ca), s(cert), s(key));
        }
        if let Some(n) = &self.tls_server_name {
            c.tls_server_name = n.clone();
        }
        if let Some(p) = &self.tls_psk_file {
            c.tls_psk_file = s(p);
        }
    }
}
