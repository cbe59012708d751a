//! A lender of either kind: a farcache server or a memcached, behind one address type and one
//! connection type, so that the engine places, fetches and fills the same way on both.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use bytes::Bytes;
use farcache_wire::{DelStatus, Key, PutStatus};
use serde::{Deserialize, Serialize};

use crate::{Client, ClientConfig, ClientError, McClient};

/// The scheme that marks a memcached lender in an address (`memcached://host:port`).
pub const MEMCACHED_SCHEME: &str = "memcached://";
/// The scheme of a farcache lender, which may also be written without it.
pub const FARCACHE_SCHEME: &str = "farcache://";

/// What a lender speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LenderProtocol {
    /// The farcache wire protocol (docs/PROTOCOL.md): tenants, secrets, TLS.
    Farcache,
    /// memcached 1.6+'s meta protocol, plain TCP.
    Memcached,
}

impl LenderProtocol {
    /// Split an optional scheme off `s`: `memcached://h:p` is memcached, `farcache://h:p` and a
    /// bare `h:p` are farcache. Any other `scheme://` is an error naming the two known ones.
    pub fn split(s: &str) -> Result<(LenderProtocol, &str), String> {
        if let Some(rest) = s.strip_prefix(MEMCACHED_SCHEME) {
            return Ok((LenderProtocol::Memcached, rest));
        }
        if let Some(rest) = s.strip_prefix(FARCACHE_SCHEME) {
            return Ok((LenderProtocol::Farcache, rest));
        }
        if let Some((scheme, _)) = s.split_once("://") {
            return Err(format!(
                "unknown scheme {scheme:?}: write host:port for a farcache lender or memcached://host:port"
            ));
        }
        Ok((LenderProtocol::Farcache, s))
    }
}

/// One lender's address and protocol. Shown and parsed as `host:port` for a farcache lender
/// and `memcached://host:port` for a memcached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct LenderAddr {
    pub protocol: LenderProtocol,
    pub addr: SocketAddr,
}

impl LenderAddr {
    pub const fn farcache(addr: SocketAddr) -> LenderAddr {
        LenderAddr { protocol: LenderProtocol::Farcache, addr }
    }

    pub const fn memcached(addr: SocketAddr) -> LenderAddr {
        LenderAddr { protocol: LenderProtocol::Memcached, addr }
    }

    pub fn is_memcached(&self) -> bool {
        self.protocol == LenderProtocol::Memcached
    }
}

impl From<SocketAddr> for LenderAddr {
    fn from(addr: SocketAddr) -> LenderAddr {
        LenderAddr::farcache(addr)
    }
}

impl fmt::Display for LenderAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.protocol {
            LenderProtocol::Farcache => write!(f, "{}", self.addr),
            LenderProtocol::Memcached => write!(f, "{MEMCACHED_SCHEME}{}", self.addr),
        }
    }
}

impl FromStr for LenderAddr {
    type Err = String;

    /// An address with an IP (no name lookup): `ip:port`, `farcache://ip:port` or
    /// `memcached://ip:port`.
    fn from_str(s: &str) -> Result<LenderAddr, String> {
        let (protocol, rest) = LenderProtocol::split(s)?;
        let addr = rest.parse::<SocketAddr>().map_err(|_| format!("{s:?} is not ip:port or memcached://ip:port"))?;
        Ok(LenderAddr { protocol, addr })
    }
}

impl From<LenderAddr> for String {
    fn from(a: LenderAddr) -> String {
        a.to_string()
    }
}

impl TryFrom<String> for LenderAddr {
    type Error = String;
    fn try_from(s: String) -> Result<LenderAddr, String> {
        s.parse()
    }
}

/// A connection to a lender of either kind: the operations the engine needs, the same way.
#[derive(Clone, Debug)]
pub enum LenderClient {
    Farcache(Client),
    Memcached(McClient),
}

impl LenderClient {
    /// Connect to `cfg.addr` speaking `protocol`. For memcached, `cfg.secret` must be empty
    /// and `cfg.tls` unset.
    pub async fn connect(protocol: LenderProtocol, cfg: ClientConfig) -> Result<LenderClient, ClientError> {
        Ok(match protocol {
            LenderProtocol::Farcache => LenderClient::Farcache(Client::connect(cfg).await?),
            LenderProtocol::Memcached => LenderClient::Memcached(McClient::connect(&cfg).await?),
        })
    }

    /// Changes when the lender restarts (its memory is new then).
    pub fn instance_id(&self) -> u64 {
        match self {
            LenderClient::Farcache(c) => c.hello().instance_id,
            LenderClient::Memcached(c) => c.info().instance_id,
        }
    }

    /// The largest value the lender stores.
    pub fn max_value_bytes(&self) -> u32 {
        match self {
            LenderClient::Farcache(c) => c.hello().max_value_bytes,
            LenderClient::Memcached(c) => c.info().max_value_bytes,
        }
    }

    pub async fn get(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, ClientError> {
        match self {
            LenderClient::Farcache(c) => c.get(keys).await,
            LenderClient::Memcached(c) => c.get(keys).await,
        }
    }

    pub async fn put(&self, entries: &[(Key, &[u8])]) -> Result<Vec<PutStatus>, ClientError> {
        match self {
            LenderClient::Farcache(c) => c.put(entries).await,
            LenderClient::Memcached(c) => c.put(entries).await,
        }
    }

    pub async fn del(&self, keys: &[Key]) -> Result<Vec<DelStatus>, ClientError> {
        match self {
            LenderClient::Farcache(c) => c.del(keys).await,
            LenderClient::Memcached(c) => c.del(keys).await,
        }
    }

    pub fn is_closed(&self) -> bool {
        match self {
            LenderClient::Farcache(c) => c.is_closed(),
            LenderClient::Memcached(c) => c.is_closed(),
        }
    }

    pub fn close(&self) {
        match self {
            LenderClient::Farcache(c) => c.close(),
            LenderClient::Memcached(c) => c.close(),
        }
    }

    pub async fn wait_closed(&self) {
        match self {
            LenderClient::Farcache(c) => c.wait_closed().await,
            LenderClient::Memcached(c) => c.wait_closed().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_show_and_parse_both_kinds() {
        let f: LenderAddr = "127.0.0.1:7411".parse().unwrap();
        assert_eq!(f, LenderAddr::farcache("127.0.0.1:7411".parse().unwrap()));
        assert_eq!(f.to_string(), "127.0.0.1:7411");
        assert_eq!("farcache://127.0.0.1:7411".parse::<LenderAddr>().unwrap(), f);
        let m: LenderAddr = "memcached://[::1]:11211".parse().unwrap();
        assert!(m.is_memcached());
        assert_eq!(m.to_string(), "memcached://[::1]:11211");
        assert_eq!(m.to_string().parse::<LenderAddr>().unwrap(), m);
        assert!("redis://1.2.3.4:6379".parse::<LenderAddr>().unwrap_err().contains("unknown scheme"));
        assert!("memcached://host".parse::<LenderAddr>().is_err());
        let json = serde_json_like(&m);
        assert_eq!(json, "memcached://[::1]:11211");
    }

    fn serde_json_like(a: &LenderAddr) -> String {
        String::from(*a)
    }
}
