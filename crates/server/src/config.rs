//! The lender's configuration: the `[server]` table of farcache.toml. Every default is
//! written out in etc/farcache.toml, and a test keeps the two in step.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use farcache_config::{ByteSize, ConfigError, HumanDuration};
use farcache_policy::alloc::AllocationKind;
use farcache_policy::PolicyKind;
use serde::{Deserialize, Serialize};

/// `[server]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on. Loopback by default: lending to the network is a decision.
    pub listen: SocketAddr,
    /// Memory lent, in block payload. Reserved up front as an arena of fixed slots.
    pub capacity: ByteSize,
    /// Bytes per slot: the largest value stored. 4 KiB blocks; larger slots leave room for
    /// per-block authentication data (see docs/CONFIGURATION.md).
    pub slot_bytes: u32,
    /// Eviction policy: "s3fifo" (scan-resistant) or "lru" (by last transfer to a client).
    pub policy: String,
    /// Independent store shards, each with its own lock. A power of two.
    pub shards: u32,
    /// Threads serving connections; 0 means one per CPU.
    pub worker_threads: u32,
    /// Connections served at once; more are refused with ERROR Busy.
    pub max_connections: u32,
    /// Largest frame accepted or sent, header included.
    pub max_frame_bytes: ByteSize,
    /// Buffer memory all connections together may borrow for frames and answers larger than
    /// their 16 KiB base buffers. At least two frames.
    pub max_buffer_bytes: ByteSize,
    /// Most keys in one batched request.
    pub max_batch: u16,
    /// Requests a client may have in flight per connection.
    pub max_inflight: u16,
    /// Time a new connection has to send HELLO.
    pub handshake_timeout: HumanDuration,
    /// Time a frame has to arrive whole once its first byte is in (defeats slow senders).
    pub frame_timeout: HumanDuration,
    /// A connection with nothing to say for this long is closed.
    pub idle_timeout: HumanDuration,
    /// A client that does not read its responses for this long is disconnected.
    pub write_timeout: HumanDuration,
    /// Most tenants known at once (configured or, in open mode, seen).
    pub max_tenants: u16,
    /// Limit of a tenant that has none of its own, in percent of capacity.
    pub default_tenant_share_percent: u8,
    /// How memory is divided among tenants: "shared" (limits only; the fullest tenant
    /// relative to its limit gives way), "static" (equal split among active tenants),
    /// "hit-ratio" (paper 004's rule) or "mrc" (marginal benefit over miss-ratio curves; the
    /// default: fewest misses of the four on `farcache bench alloc`, BENCHMARKS.md).
    pub allocation: String,
    /// Time between two decisions of the "mrc" allocator, each moving at most 2% of capacity.
    pub allocation_interval: HumanDuration,
    /// Tenants and their credentials. None configured means open mode: any tenant name is
    /// accepted without a secret (trusted networks only; the server logs a warning).
    /// TLS 1.3 with client certificates: the server's certificate chain (PEM). Set together
    /// with `tls_key` and `tls_client_ca`; then every client must speak TLS and present a
    /// certificate signed by `tls_client_ca`. "" for plain TCP.
    pub tls_cert: String,
    /// The server certificate's private key (PEM).
    pub tls_key: String,
    /// The CA (PEM) client certificates must be signed by. A client's tenant is then the
    /// common name of its certificate.
    pub tls_client_ca: String,
    /// TLS 1.3 without a PKI: a file holding a pre-shared key (64 hex digits, mode 600, as
    /// `farcache keygen` writes). Instead of `tls_cert`/`tls_key`/`tls_client_ca`; every client
    /// must hold the same key. Tenants still authenticate with their secrets. "" for none.
    pub tls_psk_file: String,
    /// Address to serve Prometheus metrics on (GET /metrics over HTTP); "" for none.
    pub metrics_listen: String,
    #[serde(rename = "tenant")]
    pub tenants: Vec<TenantConfig>,
}

/// `[[server.tenant]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// The shared secret the tenant's clients present in HELLO.
    #[serde(default)]
    pub secret: Option<String>,
    /// A file holding the secret (first line), instead of `secret`.
    #[serde(default)]
    pub secret_file: Option<std::path::PathBuf>,
    /// Most memory this tenant may hold; default: `default_tenant_share_percent` of capacity.
    #[serde(default)]
    pub limit: Option<ByteSize>,
    /// Memory always held for this tenant, whatever the others do (default 0). The sum over
    /// tenants must fit in `capacity`.
    #[serde(default)]
    pub min_bytes: Option<ByteSize>,
    /// Relative weight in the division of memory (default 1).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Whether this tenant's STATS show every tenant.
    #[serde(default)]
    pub admin: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:7411".parse().unwrap(),
            capacity: ByteSize::mib(512),
            slot_bytes: 4096,
            policy: "s3fifo".into(),
            shards: 64,
            worker_threads: 0,
            max_connections: 1024,
            max_frame_bytes: ByteSize::mib(1),
            max_buffer_bytes: ByteSize::mib(64),
            max_batch: 256,
            max_inflight: 128,
            handshake_timeout: HumanDuration::secs(5),
            frame_timeout: HumanDuration::secs(10),
            idle_timeout: HumanDuration::secs(600),
            write_timeout: HumanDuration::secs(10),
            max_tenants: 64,
            default_tenant_share_percent: 100,
            allocation: "mrc".into(),
            allocation_interval: HumanDuration::secs(5),
            tls_cert: String::new(),
            tls_key: String::new(),
            tls_client_ca: String::new(),
            tls_psk_file: String::new(),
            metrics_listen: String::new(),
            tenants: Vec::new(),
        }
    }
}

/// Largest slot: a block plus room for authentication data, far below any frame limit.
pub const MAX_SLOT_BYTES: u32 = 64 << 10;
/// Fewest slots per shard worth having; capacity below shards × this is refused.
pub const MIN_SLOTS_PER_SHARD: u64 = 16;

impl ServerConfig {
    pub fn policy_kind(&self) -> PolicyKind {
        self.policy.parse().expect("validated")
    }

    pub fn allocation_kind(&self) -> AllocationKind {
        self.allocation.parse().expect("validated")
    }

    /// Slots in the whole store.
    pub fn slots(&self) -> u64 {
        self.capacity.bytes() / self.slot_bytes as u64
    }

    /// How clients must connect (`validate` refuses half-set TLS settings).
    pub fn tls_mode(&self) -> TlsMode {
        if !self.tls_psk_file.is_empty() {
            TlsMode::Psk
        } else if !self.tls_cert.is_empty() {
            TlsMode::Certificates
        } else {
            TlsMode::Plain
        }
    }

    /// Whether clients must speak TLS.
    pub fn tls_enabled(&self) -> bool {
        self.tls_mode() != TlsMode::Plain
    }

    /// Load the TLS files: `None` for plain TCP. Fails, naming the key, the file and the fix,
    /// on a missing or unreadable file, bad PEM, a key that does not match the certificate,
    /// an expired certificate, or a PSK file open to others or not holding a key.
    pub fn tls_server_config(&self) -> Result<Option<Arc<farcache_tls::rustls::ServerConfig>>, ConfigError> {
        match self.tls_mode() {
            TlsMode::Plain => Ok(None),
            TlsMode::Certificates => {
                let (cert, key, ca) =
                    (Path::new(&self.tls_cert), Path::new(&self.tls_key), Path::new(&self.tls_client_ca));
                farcache_tls::server_config(cert, key, ca)
                    .map(Some)
                    .map_err(|e| e.into_config_error(["server.tls_cert", "server.tls_key", "server.tls_client_ca"]))
            }
            TlsMode::Psk => {
                let psk = farcache_tls::psk::read_file("server.tls_psk_file", Path::new(&self.tls_psk_file))?;
                farcache_tls::psk::server_config(&psk)
                    .map(Some)
                    .map_err(|e| ConfigError::invalid("server.tls_psk_file", e.problem, e.fix))
            }
        }
    }

    /// Check every relation between settings; each error names the key and the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use ConfigError as E;
        let tls_set = [&self.tls_cert, &self.tls_key, &self.tls_client_ca].iter().filter(|s| !s.is_empty()).count();
        if tls_set != 0 && tls_set != 3 {
            return Err(E::invalid(
                "server.tls_cert",
                "tls_cert, tls_key and tls_client_ca must be set together",
                "set all three (create them with `farcache certs --out DIR`), or none for plain TCP",
            ));
        }
        if tls_set != 0 && !self.tls_psk_file.is_empty() {
            return Err(E::invalid(
                "server.tls_psk_file",
                "set together with tls_cert, tls_key and tls_client_ca",
                "use certificates or a pre-shared key, not both",
            ));
        }
        farcache_config::metrics_listen("server.metrics_listen", &self.metrics_listen)?;
        if !(512..=MAX_SLOT_BYTES).contains(&self.slot_bytes) {
            return Err(E::invalid(
                "server.slot_bytes",
                format!("{} is out of range", self.slot_bytes),
                "use 4096 (or 512..=65536)",
            ));
        }
        if self.policy.parse::<PolicyKind>().is_err() {
            return Err(E::invalid(
                "server.policy",
                format!("unknown policy {:?}", self.policy),
                "use \"s3fifo\" or \"lru\"",
            ));
        }
        if !self.shards.is_power_of_two() || self.shards > 4096 {
            return Err(E::invalid(
                "server.shards",
                format!("{} is not a power of two in 1..=4096", self.shards),
                "use 64",
            ));
        }
        let min_capacity = self.shards as u64 * MIN_SLOTS_PER_SHARD * self.slot_bytes as u64;
        if self.capacity.bytes() < min_capacity {
            return Err(E::invalid(
                "server.capacity",
                format!("{} is too small for {} shards of {}-byte slots", self.capacity, self.shards, self.slot_bytes),
                format!("set at least {} or fewer shards", ByteSize(min_capacity)),
            ));
        }
        if self.slots() / self.shards as u64 >= u32::MAX as u64 / 2 {
            return Err(E::invalid(
                "server.capacity",
                format!("{} holds too many slots per shard", self.capacity),
                "use more shards",
            ));
        }
        let max_frame = self.max_frame_bytes.bytes();
        let need = (farcache_wire::HEADER_BYTES + 4 + 5 + self.slot_bytes as usize + 32) as u64;
        if max_frame < need || max_frame > farcache_wire::MAX_FRAME_BYTES_CEILING as u64 {
            return Err(E::invalid(
                "server.max_frame_bytes",
                format!("{} must hold one slot and be at most 16MiB", self.max_frame_bytes),
                "use 1MiB",
            ));
        }
        if self.max_buffer_bytes.bytes() < 2 * max_frame || self.max_buffer_bytes.bytes() > (u32::MAX as u64) << 10 {
            return Err(E::invalid(
                "server.max_buffer_bytes",
                format!(
                    "{} is less than two frames of server.max_frame_bytes ({})",
                    self.max_buffer_bytes, self.max_frame_bytes
                ),
                format!("set at least {}", ByteSize(2 * max_frame)),
            ));
        }
        if self.max_batch == 0 {
            return Err(E::invalid("server.max_batch", "0 allows no request", "use 256"));
        }
        if self.max_inflight == 0 {
            return Err(E::invalid("server.max_inflight", "0 allows no request", "use 128"));
        }
        if self.max_connections == 0 {
            return Err(E::invalid("server.max_connections", "0 allows no client", "use 1024"));
        }
        if self.max_tenants == 0 || self.max_tenants > 4096 {
            return Err(E::invalid(
                "server.max_tenants",
                format!("{} is out of range", self.max_tenants),
                "use 1..=4096 (default 64)",
            ));
        }
        if self.default_tenant_share_percent > 100 {
            return Err(E::invalid("server.default_tenant_share_percent", "over 100", "use 1..=100"));
        }
        if self.allocation.parse::<AllocationKind>().is_err() {
            return Err(E::invalid(
                "server.allocation",
                format!("unknown allocation {:?}", self.allocation),
                "use \"shared\", \"static\", \"hit-ratio\" or \"mrc\"",
            ));
        }
        let interval = self.allocation_interval.get();
        if interval < std::time::Duration::from_millis(50) || interval > std::time::Duration::from_secs(3600) {
            return Err(E::invalid(
                "server.allocation_interval",
                format!("{} is out of range", self.allocation_interval),
                "use 50ms..=1h (default 5s)",
            ));
        }
        self.validate_shares()?;
        for (name, d) in [
            ("server.handshake_timeout", self.handshake_timeout),
            ("server.frame_timeout", self.frame_timeout),
            ("server.idle_timeout", self.idle_timeout),
            ("server.write_timeout", self.write_timeout),
        ] {
            if d.get().is_zero() {
                return Err(E::invalid(name, "0 would close every connection", "use a positive duration such as 10s"));
            }
        }
        if self.tenants.len() > self.max_tenants as usize {
            return Err(E::invalid(
                "server.tenant",
                format!("{} tenants configured", self.tenants.len()),
                "raise server.max_tenants",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for t in &self.tenants {
            if !farcache_wire::is_valid_tenant_name(&t.name) {
                return Err(E::invalid(
                    "server.tenant.name",
                    format!("{:?} is not a valid tenant name", t.name),
                    "use 1..=64 characters of A-Z a-z 0-9 . _ -",
                ));
            }
            if !seen.insert(&t.name) {
                return Err(E::invalid(
                    "server.tenant.name",
                    format!("tenant {:?} is configured twice", t.name),
                    "remove one",
                ));
            }
            match (&t.secret, &t.secret_file) {
                (Some(_), Some(_)) => {
                    return Err(E::invalid(
                        "server.tenant.secret",
                        format!("tenant {:?} has both secret and secret_file", t.name),
                        "keep one",
                    ))
                }
                // With client certificates, the certificate names the tenant.
                (None, None) if self.tls_mode() != TlsMode::Certificates => {
                    return Err(E::invalid(
                        "server.tenant.secret",
                        format!("tenant {:?} has no secret", t.name),
                        "set secret or secret_file (or use client certificates: tls_cert, tls_key, tls_client_ca)",
                    ))
                }
                _ => {}
            }
            if let Some(s) = &t.secret {
                if s.is_empty() || s.len() > farcache_wire::MAX_SECRET_BYTES {
                    return Err(E::invalid(
                        "server.tenant.secret",
                        format!("tenant {:?}: secret must be 1..=128 bytes", t.name),
                        "use a longer or shorter secret",
                    ));
                }
            }
        }
        Ok(())
    }
}

impl ServerConfig {
    /// Each tenant's `min_bytes` within its limit, `weight` in range, and the minimums
    /// together within `capacity`.
    fn validate_shares(&self) -> Result<(), ConfigError> {
        use ConfigError as E;
        let default_limit = (self.capacity.bytes() as u128 * self.default_tenant_share_percent as u128 / 100) as u64;
        let mut sum = 0u64;
        for t in &self.tenants {
            let min = t.min_bytes.map_or(0, |b| b.bytes());
            let limit = t.limit.map_or(default_limit, |l| l.bytes());
            if min > limit {
                return Err(E::invalid(
                    "server.tenant.min_bytes",
                    format!(
                        "tenant {:?}: min_bytes {} is more than its limit {}",
                        t.name,
                        ByteSize(min),
                        ByteSize(limit)
                    ),
                    "lower min_bytes or raise the tenant's limit",
                ));
            }
            if t.weight.is_some_and(|w| !(1..=1000).contains(&w)) {
                return Err(E::invalid(
                    "server.tenant.weight",
                    format!("tenant {:?}: weight {} is out of range", t.name, t.weight.unwrap_or(0)),
                    "use 1..=1000 (default 1)",
                ));
            }
            sum = sum.saturating_add(min);
        }
        if sum > self.capacity.bytes() {
            return Err(E::invalid(
                "server.tenant.min_bytes",
                format!(
                    "the tenants' min_bytes add up to {}, more than server.capacity ({})",
                    ByteSize(sum),
                    self.capacity
                ),
                "lower some tenant's min_bytes, or raise server.capacity",
            ));
        }
        Ok(())
    }
}

/// How clients connect to the lender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP (trusted networks only).
    Plain,
    /// TLS 1.3; clients present a certificate signed by `tls_client_ca`, whose common name is
    /// their tenant.
    Certificates,
    /// TLS 1.3 with certificates derived from a pre-shared key (farcache_tls::psk).
    Psk,
}

/// Read a tenant's secret, from the config or its file; `None` when it has none (allowed
/// only with client certificates).
pub fn tenant_secret(t: &TenantConfig) -> Result<Option<Vec<u8>>, ConfigError> {
    if let Some(s) = &t.secret {
        return Ok(Some(s.as_bytes().to_vec()));
    }
    let Some(path) = t.secret_file.as_ref() else {
        return Ok(None);
    };
    let key = "server.tenant.secret_file";
    let shown = path.display();
    let write = format!(
        "write tenant {:?}'s secret (1 to 128 bytes) on the first line of {shown}, or set its secret instead",
        t.name
    );
    let text = farcache_config::read_text_file(key, path, "a secret", &write).map_err(|e| match e {
        ConfigError::Invalid { key, problem, fix } => {
            ConfigError::Invalid { key, problem: format!("tenant {:?}: {problem}", t.name), fix }
        }
        e => e,
    })?;
    let secret = text.lines().next().unwrap_or("").trim().as_bytes().to_vec();
    if secret.is_empty() || secret.len() > farcache_wire::MAX_SECRET_BYTES {
        return Err(ConfigError::invalid(
            key,
            format!(
                "tenant {:?}: {shown} holds a {}-byte secret on its first line, not 1 to 128 bytes",
                t.name,
                secret.len()
            ),
            write,
        ));
    }
    Ok(Some(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(secret_file: &Path) -> TenantConfig {
        TenantConfig {
            name: "db1".into(),
            secret: None,
            secret_file: Some(secret_file.to_path_buf()),
            limit: None,
            min_bytes: None,
            weight: None,
            admin: false,
        }
    }

    #[test]
    fn a_bad_tenant_secret_file_names_the_tenant_the_file_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("good"), "s3cret\nignored\n").unwrap();
        assert_eq!(tenant_secret(&tenant(&p("good"))).unwrap().unwrap(), b"s3cret");

        std::fs::write(p("binary"), [0xffu8, 0xfe, 0x00, 0x80]).unwrap();
        std::fs::write(p("empty"), "").unwrap();
        std::fs::write(p("long"), "x".repeat(129)).unwrap();
        for (name, why) in [
            ("missing", "missing does not exist (no such file)"),
            ("binary", "binary holds binary data (4 bytes that are not UTF-8 text)"),
            ("empty", "empty holds a 0-byte secret on its first line, not 1 to 128 bytes"),
            ("long", "long holds a 129-byte secret on its first line, not 1 to 128 bytes"),
        ] {
            let e = tenant_secret(&tenant(&p(name))).unwrap_err().to_string();
            assert!(e.starts_with("server.tenant.secret_file: tenant \"db1\": "), "{name}: {e}");
            assert!(e.contains(why), "{name}: {e}");
            assert!(e.contains("write tenant \"db1\"'s secret (1 to 128 bytes) on the first line of"), "{name}: {e}");
            assert!(!e.contains("readable"), "{name}: the fix is the contents: {e}");
        }
        let e = tenant_secret(&tenant(dir.path())).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
    }
}
