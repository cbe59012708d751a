//! `[cache]`: how the mount borrows lenders' RAM. Every default is written out in
//! [`TEMPLATE`]; a test keeps the two in step.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use farcache_client::{ClientConfig, LenderAddr, LenderProtocol};
use farcache_config::{ByteSize, ConfigError, HumanDuration};
use farcache_policy::route::{Adaptive, Threshold};
use serde::{Deserialize, Serialize};

use crate::index::BLOCK_BYTES;
use crate::remote::{
    RemoteConfig, RemoteTls, DEFAULT_FETCH_CONNECTIONS, DEFAULT_FETCH_POLL, DEFAULT_MAX_LENDERS,
    DEFAULT_MAX_PENDING_PUTS,
};
use crate::routing::Router;
use crate::seal::{BlockKeyBytes, BlockSeal, Plaintext, XChaCha};

/// The `[cache]` table with every default, as it belongs in etc/farcache.toml.
pub const TEMPLATE: &str = r#"[cache]
# Lenders to borrow RAM from, as "host:port" (IPv6 in brackets: "[::1]:7411"), or an
# existing memcached (1.6 or later) as "memcached://host:port". Blocks are spread over them
# by rendezvous hashing. Empty: the mount runs a lender in its own process. memcached has
# no tenants, secrets or TLS: blocks stored there are sealed with key_file (required, see
# memcached_plaintext) so that a memcached that is shared, lies or evicts costs misses only.
servers = []
# Tenant to borrow as (1 to 64 characters of A-Z a-z 0-9 . _ -).
tenant = "default"
# A file holding the tenant's secret on its first line; "" for none (lenders in open mode).
# It must be a regular file that only its owner can read (chmod 600).
secret_file = ""
# Block encryption: a file holding a 256-bit key as 64 hex digits on one line (create one
# with `farcache keygen --out FILE`; only its owner may read it, chmod 600). Every block is
# then encrypted and authenticated (XChaCha20-Poly1305) before it leaves, and a block a
# lender alters or swaps is a miss. Lenders need server.slot_bytes >= 4136. "" for none.
key_file = ""
# TLS 1.3 to the lenders, with this client's certificate: the CA (PEM) lender certificates
# must be signed by, and this client's certificate and key (create them with
# `farcache certs --out DIR`). Set all three, or "" for plain TCP (trusted networks only).
# The certificate's common name is the tenant: leave `tenant` as "default" to take it from
# there, or set it to the same name.
tls_ca = ""
tls_cert = ""
tls_key = ""
# The name lender certificates must carry; "" for the host part of each cache.servers entry.
tls_server_name = ""
# TLS 1.3 without certificates: a file holding a pre-shared key (64 hex digits, chmod 600;
# create it with `farcache keygen --out FILE`) that every lender (server.tls_psk_file) and
# mount holds. Instead of tls_ca/tls_cert/tls_key; the tenant is then `tenant` with its
# secret_file. "" for none.
tls_psk_file = ""
# The most a read waits for the lenders before it goes to the disk.
fetch_timeout = "50ms"
# Bound on connecting to a lender, handshake included.
connect_timeout = "500ms"
# Waits between reconnection attempts to a lost lender: the first, doubling up to the last.
reconnect_min = "100ms"
reconnect_max = "5s"
# Blocks on their way to lenders at once (fills, coalesced into one request per lender per
# millisecond); more are dropped, the disk has them. 8192 (32 MiB) holds the bursts a
# rate-limited disk answers a stream in, filling the lenders over a 10 Gbit/s link; 2048
# dropped 25-35% of such fills, 256 87%. While the fills stand in a queue (the links cannot
# keep up), fewer: what the links carry in 50 ms, at least 512.
max_pending_puts = 8192
# Retired blocks waiting to be deleted on lenders (coalesced, one request per lender per
# millisecond); more are dropped (a retired block can never be read again; its lender
# evicts it in time).
max_pending_dels = 4096
# Threads for the lender connections.
threads = 2
# Connections per lender on which the reading thread fetches by itself (no hand-off to the
# connection threads and back: a lender hit costs two thread wake-ups less). Reads beyond
# them at once share the lender's main connection. 0 to 64; 0 turns them off.
fetch_connections = 8
# How long a reading thread checks its fetch connection for the lender's answer before it
# sleeps until the answer wakes it (a blocking round trip on loopback takes 65-80 us, a
# polled one 23 us). Spends up to this much CPU per lender read, so only while at most one
# fetch per two CPUs is in flight (none on one CPU), and for a lender whose answers come
# within it. Off by default: on two CPUs it spent 10-15% more of the daemon's CPU for a gain
# within the noise. For lenders a few tens of us away and CPUs to spare: "30us" to "50us".
# 0 to 1ms; "0us" is off.
fetch_poll = "0us"
# Where reads go: "adaptive" (starts on the disk; random reads shared between the disk and
# the lenders by their measured costs, filled only where a lender hit is clearly cheaper
# than a disk read; streams where they finish sooner) or "threshold" (paper 000: reads of
# `threshold` bytes or more to the disk, smaller ones to the lenders, every miss filled).
# BENCHMARKS.md "Nothing gets slower" measures both.
routing = "adaptive"
# Reads this large or larger go to the disk under "threshold" routing. A multiple of 4KiB,
# 4KiB to 1MiB.
threshold = "128KiB"
# When a small read fills the lenders (every miss under "threshold"; under "adaptive", the
# reads the rule fills), read this much around it (aligned) from the disk and fill the
# lenders with all of it: the blocks the kernel's readahead asks for next are then on the
# lenders. Free on a disk bound by its operations. A multiple of 4KiB up to 128KiB; 0 turns
# it off.
read_around = "16KiB"
# Most lenders in the set at once, including those added while running.
max_lenders = 64
# true: allow memcached lenders without key_file. Their blocks are then stored as they
# are: anyone who can reach the memcached reads them, and a memcached that returns wrong
# bytes is believed. Only for a memcached on a trusted host and network.
memcached_plaintext = false
"#;

/// How reads are routed between lenders and the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Routing {
    /// Paper 000's fixed threshold (`cache.threshold`).
    Threshold,
    /// Per read, from measured costs; the default (it never lost to the passthrough where
    /// the threshold rule did, BENCHMARKS.md "Nothing gets slower").
    #[default]
    Adaptive,
}

/// `[cache]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Lenders as "host:port"; empty: the mount runs an embedded lender.
    pub servers: Vec<String>,
    pub tenant: String,
    /// Path of the tenant secret; "" for none.
    pub secret_file: String,
    /// Path of the block key (64 hex digits); "" for no block encryption.
    pub key_file: String,
    /// TLS: the CA lender certificates must be signed by, and this client's certificate and
    /// key (PEM paths); all "" for plain TCP.
    pub tls_ca: String,
    pub tls_cert: String,
    pub tls_key: String,
    /// The name lender certificates must carry; "" for each server's host.
    pub tls_server_name: String,
    /// TLS from a pre-shared key (path of 64 hex digits); "" for none.
    pub tls_psk_file: String,
    pub fetch_timeout: HumanDuration,
    pub connect_timeout: HumanDuration,
    pub reconnect_min: HumanDuration,
    pub reconnect_max: HumanDuration,
    pub max_pending_puts: u32,
    pub max_pending_dels: u32,
    pub threads: u32,
    /// Direct fetch connections per lender (0: off).
    pub fetch_connections: u32,
    /// Polling for a fetch connection's answer before sleeping; 0: off.
    pub fetch_poll: HumanDuration,
    pub routing: Routing,
    pub threshold: ByteSize,
    /// Aligned window read and filled around a small miss; 0: off.
    pub read_around: ByteSize,
    pub max_lenders: u32,
    /// Allow memcached lenders without a block key.
    pub memcached_plaintext: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            servers: Vec::new(),
            tenant: "default".into(),
            secret_file: String::new(),
            key_file: String::new(),
            tls_ca: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            tls_server_name: String::new(),
            tls_psk_file: String::new(),
            fetch_timeout: HumanDuration::ms(50),
            connect_timeout: HumanDuration::ms(500),
            reconnect_min: HumanDuration::ms(100),
            reconnect_max: HumanDuration::secs(5),
            max_pending_puts: DEFAULT_MAX_PENDING_PUTS as u32,
            max_pending_dels: 4096,
            threads: 2,
            fetch_connections: DEFAULT_FETCH_CONNECTIONS as u32,
            fetch_poll: HumanDuration(DEFAULT_FETCH_POLL),
            routing: Routing::Adaptive,
            threshold: ByteSize::kib(128),
            read_around: ByteSize::kib(16),
            max_lenders: DEFAULT_MAX_LENDERS as u32,
            memcached_plaintext: false,
        }
    }
}

/// Longest `fetch_timeout`: a read can wait this long for a lender before the disk.
pub const MAX_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest `connect_timeout` and `reconnect_max`.
pub const MAX_CONNECT_WAIT: Duration = Duration::from_secs(600);
/// Most pending stores or deletions.
pub const MAX_PENDING: u32 = 65_536;
/// Most connection threads.
pub const MAX_THREADS: u32 = 64;
/// Most lenders in a set.
pub const MAX_LENDERS: u32 = 1024;
/// Most direct fetch connections per lender.
pub const MAX_FETCH_CONNECTIONS: u32 = 64;
/// Longest `fetch_poll`: a thread that polls longer spends a CPU on what a wake-up costs.
pub const MAX_FETCH_POLL: Duration = Duration::from_millis(1);
/// Largest read-around window.
pub const MAX_READ_AROUND_BYTES: u64 = 128 << 10;
/// Largest routing threshold: the largest read the kernel sends through FUSE.
pub const MAX_THRESHOLD_BYTES: u64 = 1 << 20;
const _: () = assert!(MAX_THRESHOLD_BYTES.is_multiple_of(BLOCK_BYTES));
const _: () = assert!(MAX_THRESHOLD_BYTES <= crate::backing::MAX_READ_BYTES as u64);

impl CacheConfig {
    /// Refuse values that cannot work, naming the key and the fix. Also checks that
    /// `secret_file`, when set, is a regular file only its owner can read, holding a secret.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use ConfigError as E;
        if self.max_lenders == 0 || self.max_lenders > MAX_LENDERS {
            return Err(E::invalid(
                "cache.max_lenders",
                format!("{} is out of range", self.max_lenders),
                format!("set 1 to {MAX_LENDERS} (default 64)"),
            ));
        }
        if self.fetch_connections > MAX_FETCH_CONNECTIONS {
            return Err(E::invalid(
                "cache.fetch_connections",
                format!("{} is out of range", self.fetch_connections),
                format!("set 0 to {MAX_FETCH_CONNECTIONS} (default 8)"),
            ));
        }
        if self.fetch_poll.get() > MAX_FETCH_POLL {
            return Err(E::invalid(
                "cache.fetch_poll",
                format!("{} is longer than {}", self.fetch_poll, HumanDuration(MAX_FETCH_POLL)),
                "set 0us (off, the default) to 1ms",
            ));
        }
        if self.servers.len() > self.max_lenders as usize {
            return Err(E::invalid(
                "cache.servers",
                format!("{} lenders listed, cache.max_lenders is {}", self.servers.len(), self.max_lenders),
                "list fewer lenders or raise cache.max_lenders",
            ));
        }
        for (i, s) in self.servers.iter().enumerate() {
            check_host_port(s)?;
            if self.servers[..i].contains(s) {
                return Err(E::invalid("cache.servers", format!("{s:?} is listed twice"), "remove one"));
            }
            if matches!(LenderProtocol::split(s), Ok((LenderProtocol::Memcached, _))) {
                self.check_memcached(s)?;
            }
        }
        // The client's own rule for tenant names (checked with no secret, see below).
        let probe = ClientConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), self.tenant.clone());
        if probe.validate().is_err() {
            return Err(E::invalid(
                "cache.tenant",
                format!("{:?} is not a valid tenant name", self.tenant),
                "use 1 to 64 characters of A-Z a-z 0-9 . _ -",
            ));
        }
        let ms = |d: HumanDuration| d.get();
        if ms(self.fetch_timeout).is_zero() || ms(self.fetch_timeout) > MAX_FETCH_TIMEOUT {
            return Err(E::invalid(
                "cache.fetch_timeout",
                format!("{} is out of range", self.fetch_timeout),
                "set 1ms to 5s (default 50ms)",
            ));
        }
        if ms(self.connect_timeout).is_zero() || ms(self.connect_timeout) > MAX_CONNECT_WAIT {
            return Err(E::invalid(
                "cache.connect_timeout",
                format!("{} is out of range", self.connect_timeout),
                "set 1ms to 10min (default 500ms)",
            ));
        }
        if ms(self.reconnect_min).is_zero() {
            return Err(E::invalid(
                "cache.reconnect_min",
                "0 would retry a lost lender in a busy loop",
                "set a positive duration (default 100ms)",
            ));
        }
        if ms(self.reconnect_max) < ms(self.reconnect_min) || ms(self.reconnect_max) > MAX_CONNECT_WAIT {
            return Err(E::invalid(
                "cache.reconnect_max",
                format!("{} is below cache.reconnect_min ({}) or above 10min", self.reconnect_max, self.reconnect_min),
                "set it between cache.reconnect_min and 10min (default 5s)",
            ));
        }
        for (key, n) in
            [("cache.max_pending_puts", self.max_pending_puts), ("cache.max_pending_dels", self.max_pending_dels)]
        {
            if n == 0 || n > MAX_PENDING {
                return Err(E::invalid(key, format!("{n} is out of range"), format!("set 1 to {MAX_PENDING}")));
            }
        }
        if self.threads == 0 || self.threads > MAX_THREADS {
            return Err(E::invalid(
                "cache.threads",
                format!("{} is out of range", self.threads),
                format!("set 1 to {MAX_THREADS} (default 2)"),
            ));
        }
        let t = self.threshold.bytes();
        if !t.is_multiple_of(BLOCK_BYTES) || !(BLOCK_BYTES..=MAX_THRESHOLD_BYTES).contains(&t) {
            return Err(E::invalid(
                "cache.threshold",
                format!("{} is not a multiple of 4KiB from 4KiB to 1MiB", self.threshold),
                "set e.g. 128KiB (paper 000's 32 blocks)",
            ));
        }
        let w = self.read_around.bytes();
        if !w.is_multiple_of(BLOCK_BYTES) || w > MAX_READ_AROUND_BYTES {
            return Err(E::invalid(
                "cache.read_around",
                format!("{} is not a multiple of 4KiB up to 128KiB", self.read_around),
                "set e.g. 16KiB, or 0 to turn it off",
            ));
        }
        self.secret()?;
        self.block_key()?;
        self.tls()?;
        Ok(())
    }

    /// The TLS client configuration from `tls_ca`, `tls_cert` and `tls_key`, or from
    /// `tls_psk_file`, or `None` when none is set. Fails, naming the key, the file and the
    /// fix, when only some are set or both kinds are, a file is missing or not PEM, the key
    /// does not match the certificate, a certificate has expired or names another tenant, or
    /// the PSK file is open to others or holds no key.
    pub fn tls(&self) -> Result<Option<Arc<farcache_tls::rustls::ClientConfig>>, ConfigError> {
        let set = [&self.tls_ca, &self.tls_cert, &self.tls_key].iter().filter(|s| !s.is_empty()).count();
        if !self.tls_psk_file.is_empty() {
            if set != 0 || !self.tls_server_name.is_empty() {
                return Err(ConfigError::invalid(
                    "cache.tls_psk_file",
                    "set together with tls_ca, tls_cert, tls_key or tls_server_name",
                    "use certificates or a pre-shared key, not both",
                ));
            }
            let psk = farcache_tls::psk::read_file("cache.tls_psk_file", Path::new(&self.tls_psk_file))?;
            return farcache_tls::psk::client_config(&psk, &self.tenant)
                .map(Some)
                .map_err(|e| ConfigError::invalid("cache.tls_psk_file", e.problem, e.fix));
        }
        if set == 0 {
            if !self.tls_server_name.is_empty() {
                return Err(ConfigError::invalid(
                    "cache.tls_server_name",
                    "set without tls_ca, tls_cert and tls_key",
                    "set those too, or tls_server_name = \"\"",
                ));
            }
            return Ok(None);
        }
        if set != 3 {
            return Err(ConfigError::invalid(
                "cache.tls_cert",
                "tls_ca, tls_cert and tls_key must be set together",
                "set all three (create them with `farcache certs --out DIR`), or none for plain TCP",
            ));
        }
        if !self.tls_server_name.is_empty()
            && farcache_tls::rustls::pki_types::ServerName::try_from(self.tls_server_name.as_str()).is_err()
        {
            return Err(ConfigError::invalid(
                "cache.tls_server_name",
                format!("{:?} is not a DNS name or IP address", self.tls_server_name),
                "use the name in the lenders' certificates, or \"\"",
            ));
        }
        let cn = self.certificate_tenant()?;
        if cn.as_deref() != Some(self.tenant.as_str()) {
            return Err(ConfigError::invalid(
                "cache.tenant",
                format!(
                    "{:?}, but the client certificate {} is for tenant {:?}: lenders take the tenant from the certificate",
                    self.tenant,
                    self.tls_cert,
                    cn.unwrap_or_default()
                ),
                "leave tenant as \"default\" (or set it to the certificate's name), or use the tenant's certificate \
                 (`farcache certs --client TENANT`)",
            ));
        }
        let (ca, cert, key) = (Path::new(&self.tls_ca), Path::new(&self.tls_cert), Path::new(&self.tls_key));
        farcache_tls::client_config(ca, cert, key)
            .map(Some)
            .map_err(|e| ConfigError::invalid("cache.tls_cert", e.problem, e.fix))
    }

    /// The common name of `tls_cert` (the tenant it is for), if the file has one.
    fn certificate_tenant(&self) -> Result<Option<String>, ConfigError> {
        let certs = farcache_tls::load_certs(Path::new(&self.tls_cert), "client certificate")
            .map_err(|e| ConfigError::invalid("cache.tls_cert", e.problem, e.fix))?;
        Ok(certs.first().and_then(farcache_tls::common_name))
    }

    /// With a client certificate and `tenant` left at "default", take the tenant from the
    /// certificate's common name (lenders do). Run before [`Self::validate`].
    pub fn tenant_from_certificate(&mut self) -> Result<(), ConfigError> {
        if self.tls_cert.is_empty() || !self.tls_psk_file.is_empty() || self.tenant != "default" {
            return Ok(());
        }
        if let Some(cn) = self.certificate_tenant()? {
            self.tenant = cn;
        }
        Ok(())
    }

    /// A memcached lender needs sealed blocks, unless plaintext is accepted explicitly.
    fn check_memcached(&self, entry: &str) -> Result<(), ConfigError> {
        if self.key_file.is_empty() && !self.memcached_plaintext {
            return Err(ConfigError::invalid(
                "cache.key_file",
                format!(
                    "{entry} is a memcached lender, which has no tenants or authentication: without a block key \
                     anyone who reaches it could read the blocks, and a memcached returning wrong bytes would be believed"
                ),
                "create a key with `farcache keygen --out FILE` and set key_file = \"FILE\" (--key-file), or accept \
                 plaintext with memcached_plaintext = true (--memcached-plaintext)",
            ));
        }
        Ok(())
    }

    /// The TLS name of each listed lender: `tls_server_name`, or the host part of its entry.
    fn tls_names(&self) -> Vec<(SocketAddr, String)> {
        self.servers
            .iter()
            .filter_map(|s| {
                let (_, s) = LenderProtocol::split(s).ok()?;
                let addr = s.to_socket_addrs().ok()?.next()?;
                let host = s.rsplit_once(':').map_or(s, |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = if self.tls_server_name.is_empty() { host } else { &self.tls_server_name };
                Some((addr, name.to_owned()))
            })
            .collect()
    }

    /// The block key from `key_file`, or `None` when there is none (no block encryption).
    /// Refuses a file that is missing, not a regular file, readable or writable by group or
    /// others, or not exactly one line of 64 hex digits; each error names the file and the
    /// fix.
    pub fn block_key(&self) -> Result<Option<BlockKeyBytes>, ConfigError> {
        if self.key_file.is_empty() {
            return Ok(None);
        }
        let key = "cache.key_file";
        let path = Path::new(&self.key_file);
        let shown = path.display();
        let create = format!(
            "create a key with `farcache keygen --out {shown}` (32 random bytes as 64 hex digits on one line, \
             mode 600), or set key_file = \"\" for no block encryption"
        );
        let text = farcache_config::read_private_file(key, path, "the block key", &create)?;
        let k = BlockKeyBytes::from_hex(&text).map_err(|why| {
            ConfigError::invalid(
                key,
                format!("{shown} does not hold a block key: {why}"),
                format!("it must hold 32 random bytes as 64 hex digits on one line; {create}"),
            )
        })?;
        Ok(Some(k))
    }

    /// How blocks are sealed on the lenders: [`XChaCha`] under the block key and the tenant
    /// when `key_file` is set, [`Plaintext`] otherwise.
    pub fn block_seal(&self) -> Result<Arc<dyn BlockSeal>, ConfigError> {
        Ok(match self.block_key()? {
            Some(k) => Arc::new(XChaCha::new(&k, &self.tenant)),
            None => Arc::new(Plaintext),
        })
    }

    /// The tenant secret: the first line of `secret_file` (trimmed), or empty when there is
    /// none. Refuses a file that is missing, not a regular file, readable or writable by
    /// group or others, empty, or holding more than the protocol allows.
    pub fn secret(&self) -> Result<Vec<u8>, ConfigError> {
        if self.secret_file.is_empty() {
            return Ok(Vec::new());
        }
        let key = "cache.secret_file";
        let path = Path::new(&self.secret_file);
        let shown = path.display();
        let create = format!(
            "write the tenant secret on the first line of {shown} and run `chmod 600 {shown}`, or set secret_file = \"\""
        );
        let text = farcache_config::read_private_file(key, path, "the tenant secret", &create)?;
        let secret = text.lines().next().unwrap_or("").trim().as_bytes().to_vec();
        let probe = ClientConfig { secret, ..ClientConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), "t") };
        if probe.secret.is_empty() || probe.validate().is_err() {
            return Err(ConfigError::invalid(
                key,
                format!("{shown}: the secret must be 1 to 128 bytes on the first line"),
                "write the secret on the first line",
            ));
        }
        Ok(probe.secret)
    }

    /// `servers` resolved to addresses (the first address of each name), in order. Fails,
    /// naming the entry, if a name does not resolve or two entries are the same lender.
    pub fn resolve_servers(&self) -> Result<Vec<LenderAddr>, ConfigError> {
        let mut out: Vec<LenderAddr> = Vec::with_capacity(self.servers.len());
        for s in &self.servers {
            let addr = resolve_lender(s)?;
            if out.iter().any(|a| a.addr == addr.addr) {
                return Err(ConfigError::invalid(
                    "cache.servers",
                    format!("{s:?} is {addr}, which is listed already"),
                    "list each lender once",
                ));
            }
            out.push(addr);
        }
        Ok(out)
    }

    /// The remote tier's configuration for lenders `servers` (from [`Self::resolve_servers`],
    /// or the embedded lender's address). Validates, and reads the secret file.
    pub fn remote_config(&self, servers: Vec<LenderAddr>) -> Result<RemoteConfig, ConfigError> {
        self.validate()?;
        if let Some(m) = servers.iter().find(|a| a.is_memcached()) {
            self.check_memcached(&m.to_string())?;
        }
        if servers.len() > self.max_lenders as usize {
            return Err(ConfigError::invalid(
                "cache.servers",
                format!("{} lenders, cache.max_lenders is {}", servers.len(), self.max_lenders),
                "use fewer lenders or raise cache.max_lenders",
            ));
        }
        Ok(RemoteConfig {
            servers,
            tenant: self.tenant.clone(),
            secret: self.secret()?,
            fetch_timeout: self.fetch_timeout.get(),
            connect_timeout: self.connect_timeout.get(),
            reconnect_min: self.reconnect_min.get(),
            reconnect_max: self.reconnect_max.get(),
            max_pending_puts: self.max_pending_puts as usize,
            max_pending_dels: self.max_pending_dels as usize,
            threads: self.threads as usize,
            max_lenders: self.max_lenders as usize,
            memcached_plaintext: self.memcached_plaintext,
            fetch_connections: self.fetch_connections as usize,
            fetch_poll: self.fetch_poll.get(),
            seal: self.block_seal()?,
            tls: self.tls()?.map(|config| RemoteTls {
                config,
                server_name: if !self.tls_psk_file.is_empty() {
                    Some(farcache_tls::psk::PSK_SERVER_NAME.to_string())
                } else {
                    (!self.tls_server_name.is_empty()).then(|| self.tls_server_name.clone())
                },
                names: self.tls_names(),
            }),
        })
    }

    /// The routing rule this configuration asks for (assumes [`Self::validate`] passed).
    pub fn router(&self) -> Router {
        match self.routing {
            Routing::Threshold => Router::Threshold(Threshold {
                blocks: (self.threshold.bytes() / BLOCK_BYTES) as u32,
                block_bytes: BLOCK_BYTES as u32,
            }),
            Routing::Adaptive => Router::Adaptive(Adaptive::new()),
        }
    }

    /// The read-around window in blocks (0: off; assumes [`Self::validate`] passed).
    pub fn read_around_blocks(&self) -> u64 {
        self.read_around.bytes() / BLOCK_BYTES
    }
}

/// One `cache.servers` entry resolved: "host:port" or "memcached://host:port", the first
/// address of the name.
pub fn resolve_lender(entry: &str) -> Result<LenderAddr, ConfigError> {
    check_host_port(entry)?;
    let (protocol, s) = LenderProtocol::split(entry).expect("checked");
    let addr = s.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
        ConfigError::invalid("cache.servers", format!("{entry:?} does not resolve"), "check the host name")
    })?;
    Ok(LenderAddr { protocol, addr })
}

/// "host:port" with a host and a nonzero port (IPv6 addresses in brackets), after an
/// optional "memcached://" or "farcache://".
fn check_host_port(entry: &str) -> Result<(), ConfigError> {
    let s = match LenderProtocol::split(entry) {
        Ok((_, s)) => s,
        Err(why) => return Err(ConfigError::invalid("cache.servers", format!("{entry:?}: {why}"), "fix the entry")),
    };
    if s.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let bad = |why: &str| {
        ConfigError::invalid("cache.servers", format!("{s:?} {why}"), "write \"host:port\", e.g. \"lender1:7411\"")
    };
    let Some((host, port)) = s.rsplit_once(':') else { return Err(bad("has no port")) };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
        return Err(bad("has no valid host"));
    }
    if host.contains(':') || host.starts_with('[') {
        return Err(ConfigError::invalid(
            "cache.servers",
            format!("{s:?} is not a valid address"),
            "write IPv6 addresses in brackets, e.g. \"[::1]:7411\"",
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(bad("has no valid port (1 to 65535)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        cache: CacheConfig,
    }

    fn refused(c: &CacheConfig) -> String {
        c.validate().expect_err("accepted a bad value").to_string()
    }

    #[test]
    fn template_is_the_defaults_and_mentions_every_key() {
        let keys = farcache_config::check_template::<CacheConfig>("cache", TEMPLATE).unwrap();
        assert_eq!(keys.len(), 23);
        CacheConfig::default().validate().unwrap();
    }

    #[test]
    fn a_full_table_parses_with_human_units() {
        let f: File = toml::from_str(
            "[cache]\nservers = [\"10.0.0.1:7411\", \"lender2:7411\"]\nrouting = \"adaptive\"\n\
             threshold = \"256KiB\"\nfetch_timeout = \"20ms\"\n",
        )
        .unwrap();
        let c = f.cache;
        c.validate().unwrap();
        assert_eq!(c.routing, Routing::Adaptive);
        assert_eq!(c.fetch_timeout, HumanDuration::ms(20));
        assert!(matches!(c.router(), Router::Adaptive(_)));
        let c = CacheConfig { threshold: ByteSize::kib(64), routing: Routing::Threshold, ..CacheConfig::default() };
        assert_eq!(CacheConfig::default().routing, Routing::Adaptive, "adaptive is the default");
        assert_eq!(CacheConfig::default().read_around_blocks(), 4);
        match c.router() {
            Router::Threshold(t) => assert_eq!((t.blocks, t.block_bytes), (16, 4096)),
            r => panic!("{r:?}"),
        }
        let rc = c.remote_config(vec!["127.0.0.1:7411".parse().unwrap()]).unwrap();
        assert_eq!(rc.fetch_timeout, Duration::from_millis(50));
        assert_eq!((rc.max_pending_puts, rc.max_pending_dels, rc.threads, rc.max_lenders), (8192, 4096, 2, 64));
        assert!(rc.secret.is_empty());
        let e = toml::from_str::<File>("[cache]\nroutting = \"adaptive\"").err().unwrap().to_string();
        assert!(e.contains("routting"), "{e}");
        let e = toml::from_str::<File>("[cache]\nrouting = \"fastest\"").err().unwrap().to_string();
        assert!(e.contains("fastest"), "{e}");
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let d = CacheConfig::default;
        let cases: Vec<(CacheConfig, &str)> = vec![
            (CacheConfig { threshold: ByteSize(5000), ..d() }, "cache.threshold"),
            (CacheConfig { threshold: ByteSize(0), ..d() }, "cache.threshold"),
            (CacheConfig { threshold: ByteSize::mib(2), ..d() }, "cache.threshold"),
            (CacheConfig { read_around: ByteSize(6000), ..d() }, "cache.read_around"),
            (CacheConfig { read_around: ByteSize::kib(256), ..d() }, "cache.read_around"),
            (CacheConfig { fetch_timeout: HumanDuration::ms(0), ..d() }, "cache.fetch_timeout"),
            (CacheConfig { fetch_timeout: HumanDuration::secs(6), ..d() }, "cache.fetch_timeout"),
            (CacheConfig { connect_timeout: HumanDuration::ms(0), ..d() }, "cache.connect_timeout"),
            (CacheConfig { reconnect_min: HumanDuration::ms(0), ..d() }, "cache.reconnect_min"),
            (
                CacheConfig { reconnect_min: HumanDuration::secs(10), reconnect_max: HumanDuration::secs(5), ..d() },
                "cache.reconnect_max",
            ),
            (CacheConfig { max_pending_puts: 0, ..d() }, "cache.max_pending_puts"),
            (CacheConfig { max_pending_dels: 0, ..d() }, "cache.max_pending_dels"),
            (CacheConfig { fetch_connections: MAX_FETCH_CONNECTIONS + 1, ..d() }, "cache.fetch_connections"),
            (CacheConfig { fetch_poll: HumanDuration(Duration::from_micros(1001)), ..d() }, "cache.fetch_poll"),
            (CacheConfig { max_pending_dels: MAX_PENDING + 1, ..d() }, "cache.max_pending_dels"),
            (CacheConfig { threads: 0, ..d() }, "cache.threads"),
            (CacheConfig { max_lenders: 0, ..d() }, "cache.max_lenders"),
            (CacheConfig { tenant: "".into(), ..d() }, "cache.tenant"),
            (CacheConfig { tenant: "no spaces".into(), ..d() }, "cache.tenant"),
            (CacheConfig { servers: vec!["lender1".into()], ..d() }, "cache.servers"),
            (CacheConfig { servers: vec!["lender1:0".into()], ..d() }, "cache.servers"),
            (CacheConfig { servers: vec![":7411".into()], ..d() }, "cache.servers"),
            (CacheConfig { servers: vec!["::1:7411".into()], ..d() }, "cache.servers"),
            (CacheConfig { servers: vec!["a:1".into(), "a:1".into()], ..d() }, "cache.servers"),
            (CacheConfig { servers: vec!["a:1".into(), "b:1".into()], max_lenders: 1, ..d() }, "cache.servers"),
            (CacheConfig { secret_file: "/nonexistent/farcache.secret".into(), ..d() }, "cache.secret_file"),
            (CacheConfig { tls_psk_file: "/nonexistent/farcache.psk".into(), ..d() }, "cache.tls_psk_file"),
            (CacheConfig { tls_psk_file: "p".into(), tls_ca: "a".into(), ..d() }, "cache.tls_psk_file"),
            (CacheConfig { tls_psk_file: "p".into(), tls_server_name: "n".into(), ..d() }, "cache.tls_psk_file"),
        ];
        for (c, key) in cases {
            let e = refused(&c);
            assert!(e.starts_with(&format!("{key}: ")), "{key}: {e}");
        }
        CacheConfig { servers: vec!["[::1]:7411".into(), "lender-2.example:7411".into()], ..d() }.validate().unwrap();
    }

    #[test]
    fn memcached_lenders_need_a_block_key_or_an_explicit_plaintext() {
        let mc = || CacheConfig { servers: vec!["memcached://127.0.0.1:11211".into()], ..CacheConfig::default() };
        let e = mc().validate().unwrap_err().to_string();
        assert!(e.starts_with("cache.key_file: "), "{e}");
        assert!(e.contains("farcache keygen") && e.contains("memcached_plaintext = true"), "{e}");
        CacheConfig { memcached_plaintext: true, ..mc() }.validate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("block.key");
        std::fs::write(&key, format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        CacheConfig { key_file: key.display().to_string(), ..mc() }.validate().unwrap();
        let e = CacheConfig { servers: vec!["redis://127.0.0.1:6379".into()], ..CacheConfig::default() }
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cache.servers: ") && e.contains("memcached://"), "{e}");
        let e = CacheConfig { servers: vec!["memcached://127.0.0.1".into()], memcached_plaintext: true, ..mc() }
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no port"), "{e}");
    }

    #[test]
    fn servers_resolve_and_duplicates_are_refused() {
        let c = CacheConfig { servers: vec!["127.0.0.1:7411".into(), "[::1]:7412".into()], ..CacheConfig::default() };
        assert_eq!(
            c.resolve_servers().unwrap(),
            vec!["127.0.0.1:7411".parse::<LenderAddr>().unwrap(), "[::1]:7412".parse().unwrap()]
        );
        let c = CacheConfig {
            servers: vec!["127.0.0.1:7411".into(), "memcached://127.0.0.1:11211".into()],
            key_file: "/nonexistent/key".into(),
            ..CacheConfig::default()
        };
        assert_eq!(
            c.resolve_servers().unwrap(),
            vec![
                LenderAddr::farcache("127.0.0.1:7411".parse().unwrap()),
                LenderAddr::memcached("127.0.0.1:11211".parse().unwrap())
            ]
        );
        // The same host and port twice, once per protocol, is one lender listed twice.
        let c = CacheConfig {
            servers: vec!["127.0.0.1:7411".into(), "memcached://127.0.0.1:7411".into()],
            ..CacheConfig::default()
        };
        assert!(c.resolve_servers().unwrap_err().to_string().starts_with("cache.servers: "));
        let c =
            CacheConfig { servers: vec!["127.0.0.1:7411".into(), "localhost:7411".into()], ..CacheConfig::default() };
        // localhost may resolve to ::1 first; only if it is 127.0.0.1 is it a duplicate.
        if let Err(e) = c.resolve_servers() {
            assert!(e.to_string().contains("listed already"), "{e}");
        }
        let c = CacheConfig { servers: vec!["a:1".into(), "b:1".into()], max_lenders: 1, ..CacheConfig::default() };
        let e = CacheConfig::default().remote_config(vec!["127.0.0.1:1".parse().unwrap(); 65]).unwrap_err();
        assert!(e.to_string().starts_with("cache.servers:"), "{e}");
        assert!(c.remote_config(Vec::new()).unwrap_err().to_string().starts_with("cache.servers:"));
    }

    fn secret_file(dir: &tempfile::TempDir, content: &str, mode: u32) -> String {
        let p = dir.path().join("tenant.secret");
        let _ = std::fs::remove_file(&p);
        std::fs::File::create(&p).unwrap().write_all(content.as_bytes()).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p.display().to_string()
    }

    #[test]
    fn secret_file_must_be_private_regular_and_hold_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let with = |path: String| CacheConfig { secret_file: path, ..CacheConfig::default() };

        let c = with(secret_file(&dir, "s3cret\nignored\n", 0o600));
        c.validate().unwrap();
        assert_eq!(c.remote_config(Vec::new()).unwrap().secret, b"s3cret");
        with(secret_file(&dir, "s3cret", 0o400)).validate().unwrap();

        for mode in [0o644, 0o640, 0o604, 0o660] {
            let path = secret_file(&dir, "s3cret\n", mode);
            let e = with(path.clone()).remote_config(Vec::new()).unwrap_err().to_string();
            assert!(e.starts_with("cache.secret_file: "), "{e}");
            assert!(e.contains(&path) && e.contains(&format!("chmod 600 {path}")), "{mode:o}: {e}");
        }

        let e = with(dir.path().display().to_string()).validate().unwrap_err().to_string();
        assert!(e.starts_with("cache.secret_file: ") && e.contains("not a regular file"), "{e}");

        let missing = dir.path().join("nope").display().to_string();
        let e = with(missing.clone()).validate().unwrap_err().to_string();
        assert!(e.contains(&missing) && e.contains("does not exist") && e.contains("chmod 600"), "{e}");

        let e = with(secret_file(&dir, "\n", 0o600)).validate().unwrap_err().to_string();
        assert!(e.starts_with("cache.secret_file: ") && e.contains("1 to 128 bytes"), "{e}");
        let e = with(secret_file(&dir, &"x".repeat(129), 0o600)).validate().unwrap_err().to_string();
        assert!(e.contains("1 to 128 bytes"), "{e}");
    }

    #[test]
    fn key_file_must_be_private_and_hold_64_hex_digits() {
        let dir = tempfile::tempdir().unwrap();
        let with = |path: String| CacheConfig { key_file: path, ..CacheConfig::default() };
        assert_eq!(CacheConfig::default().block_seal().unwrap().name(), "plaintext");
        assert_eq!(CacheConfig::default().remote_config(Vec::new()).unwrap().seal.name(), "plaintext");

        let hex = crate::seal::BlockKeyBytes::generate().to_hex_line();
        let c = with(secret_file(&dir, &hex, 0o600));
        c.validate().unwrap();
        assert!(c.block_key().unwrap().is_some());
        assert_eq!(c.remote_config(Vec::new()).unwrap().seal.name(), "xchacha20poly1305");
        with(secret_file(&dir, &hex, 0o400)).validate().unwrap();

        for mode in [0o644, 0o640, 0o604, 0o620] {
            let path = secret_file(&dir, &hex, mode);
            let e = with(path.clone()).validate().unwrap_err().to_string();
            assert!(e.starts_with("cache.key_file: ") && e.contains(&format!("chmod 600 {path}")), "{mode:o}: {e}");
            assert!(e.contains("block key would leak"), "{e}");
        }
        let missing = dir.path().join("nope").display().to_string();
        let e = with(missing.clone()).validate().unwrap_err().to_string();
        assert!(e.contains(&missing) && e.contains("does not exist"), "{e}");
        assert!(e.contains(&format!("farcache keygen --out {missing}")), "{e}");
        let two = format!("{hex}{hex}");
        let bad = "z".repeat(64);
        for (text, why) in [("", "empty"), ("abcd\n", "not 64"), (bad.as_str(), "hex digit"), (&two, "one line")] {
            let e = with(secret_file(&dir, text, 0o600)).validate().unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
            assert!(e.starts_with("cache.key_file: ") && e.contains("does not hold a block key"), "{e}");
            assert!(e.contains("64 hex digits") && e.contains("farcache keygen"), "{e}");
        }
        let e = with(dir.path().display().to_string()).validate().unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
