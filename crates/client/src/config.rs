//! Client configuration.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use farcache_wire::{is_valid_tenant_name, MAX_SECRET_BYTES};

use crate::ClientError;

/// Default for [`ClientConfig::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default for [`ClientConfig::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Default for [`ClientConfig::max_inflight`].
pub const DEFAULT_MAX_INFLIGHT: u16 = 64;

/// How to reach one lender and who to be there.
#[derive(Clone)]
pub struct ClientConfig {
    pub addr: SocketAddr,
    /// Tenant name: 1..=64 bytes of `[A-Za-z0-9._-]`.
    pub tenant: String,
    /// Credential for the tenant, at most 128 bytes; empty where the server has no tenants
    /// configured.
    pub secret: Vec<u8>,
    /// Bound on TCP connect plus the HELLO / HELLO_OK exchange.
    pub connect_timeout: Duration,
    /// Bound on one request, from waiting for an in-flight slot to the answer. A batch that is
    /// split into several frames bounds each frame separately.
    pub request_timeout: Duration,
    /// Most requests in flight on the connection. The effective bound is the smaller of this
    /// and the server's `max_inflight` from HELLO_OK.
    pub max_inflight: u16,
    /// TLS 1.3 with a client certificate; `None` for plain TCP.
    pub tls: Option<ClientTls>,
}

/// How to speak TLS to the server.
#[derive(Clone)]
pub struct ClientTls {
    /// Trusted CA, client certificate and key (see `farcache_tls::client_config`).
    pub config: Arc<farcache_tls::rustls::ClientConfig>,
    /// The name the server's certificate must carry; `None`: the address's IP.
    pub server_name: Option<String>,
}

impl ClientTls {
    pub fn new(config: Arc<farcache_tls::rustls::ClientConfig>) -> ClientTls {
        ClientTls { config, server_name: None }
    }
}

impl ClientConfig {
    /// A configuration with every default: no secret, 1 s connect and request timeouts, 64
    /// requests in flight.
    pub fn new(addr: SocketAddr, tenant: impl Into<String>) -> ClientConfig {
        ClientConfig {
            addr,
            tenant: tenant.into(),
            secret: Vec::new(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_inflight: DEFAULT_MAX_INFLIGHT,
            tls: None,
        }
    }

    /// Check what the wire encoders would otherwise assert on, naming the field and the fix.
    pub fn validate(&self) -> Result<(), ClientError> {
        if !is_valid_tenant_name(&self.tenant) {
            return Err(ClientError::Config(format!(
                "tenant {:?} must be 1..=64 bytes of [A-Za-z0-9._-]",
                self.tenant
            )));
        }
        if self.secret.len() > MAX_SECRET_BYTES {
            return Err(ClientError::Config(format!(
                "secret is {} bytes; at most {MAX_SECRET_BYTES} are allowed",
                self.secret.len()
            )));
        }
        if self.max_inflight == 0 {
            return Err(ClientError::Config("max_inflight must be at least 1".into()));
        }
        if let Some(name) = self.tls.as_ref().and_then(|t| t.server_name.as_deref()) {
            if farcache_tls::rustls::pki_types::ServerName::try_from(name).is_err() {
                return Err(ClientError::Config(format!("tls server name {name:?} is not a DNS name or IP address")));
            }
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(ClientError::Config("connect_timeout and request_timeout must be longer than zero".into()));
        }
        Ok(())
    }
}

/// The secret is never printed.
impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("addr", &self.addr)
            .field("tenant", &self.tenant)
            .field("secret", &format_args!("<{} bytes>", self.secret.len()))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_inflight", &self.max_inflight)
            .field(
                "tls",
                &self.tls.as_ref().map(|t| t.server_name.clone().unwrap_or_else(|| self.addr.ip().to_string())),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ClientConfig {
        ClientConfig::new("127.0.0.1:1".parse().unwrap(), "db1")
    }

    #[test]
    fn defaults_are_valid() {
        let c = cfg();
        assert_eq!(c.connect_timeout, Duration::from_secs(1));
        assert_eq!(c.request_timeout, Duration::from_secs(1));
        assert_eq!(c.max_inflight, 64);
        assert!(c.secret.is_empty());
        c.validate().unwrap();
    }

    #[test]
    fn invalid_fields_are_named() {
        let mut c = cfg();
        c.tenant = "a/b".into();
        assert!(matches!(c.validate(), Err(ClientError::Config(m)) if m.contains("tenant")));
        let mut c = cfg();
        c.secret = vec![0; MAX_SECRET_BYTES + 1];
        assert!(matches!(c.validate(), Err(ClientError::Config(m)) if m.contains("secret")));
        let mut c = cfg();
        c.max_inflight = 0;
        assert!(matches!(c.validate(), Err(ClientError::Config(m)) if m.contains("max_inflight")));
        let mut c = cfg();
        c.request_timeout = Duration::ZERO;
        assert!(matches!(c.validate(), Err(ClientError::Config(m)) if m.contains("request_timeout")));
    }

    #[test]
    fn debug_hides_the_secret() {
        let mut c = cfg();
        c.secret = b"hunter2".to_vec();
        let s = format!("{c:?}");
        assert!(!s.contains("hunter2"), "{s}");
        assert!(s.contains("<7 bytes>"), "{s}");
    }
}
