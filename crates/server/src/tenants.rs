//! Tenants: who a connection is, what it may hold.
//!
//! A connection's tenant is fixed by its credentials at HELLO and never taken from a request,
//! so the store keys every block by the connection's tenant id and one tenant cannot name
//! another's blocks. With client certificates (`server.tls_client_ca`), the tenant is the
//! certificate's common name: HELLO must name that tenant, and a configured secret must match
//! too. Otherwise a HELLO must name a configured tenant with its secret (compared in constant
//! time). With no tenants configured the server is in open mode: any valid name (or, with
//! certificates, any certificate's name) is accepted, up to `max_tenants` names, for trusted
//! networks only.

use parking_lot::RwLock;
use subtle::ConstantTimeEq;

use crate::config::{tenant_secret, ServerConfig};
use crate::store::{Store, TenantId};
use farcache_config::ConfigError;

pub struct Tenant {
    pub name: String,
    secret: Option<Vec<u8>>,
    pub limit_bytes: u64,
    /// Memory always held for it (`min_bytes`), and its weight, for the allocator.
    pub min_bytes: u64,
    pub weight: u32,
    pub admin: bool,
}

/// What the allocator needs of a tenant.
#[derive(Clone, Copy, Debug)]
pub struct TenantShares {
    pub limit_bytes: u64,
    pub min_bytes: u64,
    pub weight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Deliberately one message for both: do not tell a prober which names exist.
    #[error("unknown tenant or wrong secret")]
    Denied,
    #[error("too many tenants (server.max_tenants = {0})")]
    TooMany(u16),
    /// The client's certificate names another tenant than its HELLO.
    #[error("the client certificate is for tenant {0:?}; a client's tenant is its certificate's common name")]
    NotTheCertificates(String),
}

pub struct Tenants {
    open: bool,
    max: u16,
    default_limit_bytes: u64,
    list: RwLock<Vec<Tenant>>,
}

impl Tenants {
    /// Build the table from configuration and give each tenant its limit in `store`.
    pub fn from_config(cfg: &ServerConfig, store: &Store) -> Result<Tenants, ConfigError> {
        let default_limit_bytes =
            (cfg.capacity.bytes() as u128 * cfg.default_tenant_share_percent as u128 / 100) as u64;
        let mut list = Vec::with_capacity(cfg.max_tenants as usize);
        for t in &cfg.tenants {
            let limit_bytes = t.limit.map_or(default_limit_bytes, |l| l.bytes());
            store.set_tenant_configured_limit(list.len() as TenantId, limit_bytes);
            list.push(Tenant {
                name: t.name.clone(),
                secret: tenant_secret(t)?,
                limit_bytes,
                min_bytes: t.min_bytes.map_or(0, |b| b.bytes()),
                weight: t.weight.unwrap_or(1),
                admin: t.admin,
            });
        }
        Ok(Tenants { open: cfg.tenants.is_empty(), max: cfg.max_tenants, default_limit_bytes, list: RwLock::new(list) })
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The tenant a HELLO's credentials name, and whether it sees every tenant's stats.
    /// `certified`: the common name of the client's certificate, when the connection was
    /// authenticated by one (it must equal `name`).
    pub fn authenticate(
        &self,
        name: &str,
        secret: &[u8],
        certified: Option<&str>,
        store: &Store,
    ) -> Result<(TenantId, bool), AuthError> {
        if let Some(cn) = certified {
            if cn != name {
                return Err(AuthError::NotTheCertificates(cn.to_string()));
            }
        }
        {
            let list = self.list.read();
            if let Some(id) = list.iter().position(|t| t.name == name) {
                let t = &list[id];
                let ok = match &t.secret {
                    Some(s) => bool::from(s.as_slice().ct_eq(secret)),
                    // No secret: a tenant seen in open mode, or one named by certificates.
                    None => self.open || certified.is_some(),
                };
                return if ok { Ok((id as TenantId, t.admin || self.open)) } else { Err(AuthError::Denied) };
            }
        }
        if !self.open {
            return Err(AuthError::Denied);
        }
        let mut list = self.list.write();
        // Raced with another HELLO of the same name?
        if let Some(id) = list.iter().position(|t| t.name == name) {
            return Ok((id as TenantId, true));
        }
        if list.len() >= self.max as usize {
            return Err(AuthError::TooMany(self.max));
        }
        let id = list.len() as TenantId;
        store.set_tenant_configured_limit(id, self.default_limit_bytes);
        list.push(Tenant {
            name: name.to_string(),
            secret: None,
            limit_bytes: self.default_limit_bytes,
            min_bytes: 0,
            weight: 1,
            admin: true,
        });
        Ok((id, true))
    }

    /// Limits, minimums and weights of every tenant, by id.
    pub fn allocation_snapshot(&self) -> Vec<TenantShares> {
        self.list
            .read()
            .iter()
            .map(|t| TenantShares { limit_bytes: t.limit_bytes, min_bytes: t.min_bytes, weight: t.weight })
            .collect()
    }

    /// (id, name, limit) of every tenant.
    pub fn snapshot(&self) -> Vec<(TenantId, String, u64)> {
        self.list.read().iter().enumerate().map(|(i, t)| (i as TenantId, t.name.clone(), t.limit_bytes)).collect()
    }
}
