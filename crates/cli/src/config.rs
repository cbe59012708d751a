//! The configuration file: one TOML file with a table per role. etc/farcache.toml is the
//! template with every default written out; a test keeps it equal to `Config::default()`.

use std::path::Path;

use farcache_server::ServerConfig;
use serde::{Deserialize, Serialize};

/// The template, embedded so that `farcache config` prints exactly what ships.
pub const TEMPLATE: &str = include_str!("../../../etc/farcache.toml");

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub mount: farcache_fuse::MountConfig,
    pub cache: farcache_engine::config::CacheConfig,
    pub tier: farcache_engine::writeback::TierConfig,
    pub balance: farcache_fuse::union::BalanceConfig,
}

impl Config {
    /// Load `path` (`--config`), or the defaults when there is none.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Config> {
        Ok(match path {
            Some(p) => Config::load_from("--config", p)?,
            None => Config::default(),
        })
    }

    /// Load `path`, which `flag` names: errors name both, what was expected and the fix.
    pub fn load_from(flag: &str, path: &Path) -> Result<Config, farcache_config::ConfigError> {
        farcache_config::load_toml(flag, path)
    }
}

/// `[cache]`'s certificate files (`tls_ca`, `tls_cert`, `tls_key`), each error under the
/// setting that names the file at fault. `CacheConfig::validate` loads them too, but reports
/// every TLS file problem as `cache.tls_cert`; this runs first so the message names the right
/// one. Nothing to do unless all three are set without a pre-shared key (`validate` judges the
/// other combinations).
pub fn check_cache_tls_files(c: &farcache_engine::config::CacheConfig) -> Result<(), farcache_config::ConfigError> {
    if !c.tls_psk_file.is_empty() || c.tls_ca.is_empty() || c.tls_cert.is_empty() || c.tls_key.is_empty() {
        return Ok(());
    }
    farcache_tls::client_config(Path::new(&c.tls_ca), Path::new(&c.tls_cert), Path::new(&c.tls_key))
        .map(drop)
        .map_err(|e| e.into_config_error(["cache.tls_cert", "cache.tls_key", "cache.tls_ca"]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_is_the_defaults() {
        let parsed: Config = farcache_config::parse_toml("etc/farcache.toml", TEMPLATE).unwrap();
        assert_eq!(parsed, Config::default(), "etc/farcache.toml and the code's defaults differ");
        parsed.server.validate().unwrap();
        parsed.mount.validate().unwrap();
        parsed.cache.validate().unwrap();
        parsed.tier.validate().unwrap();
        parsed.balance.validate().unwrap();
    }

    #[test]
    fn template_mentions_every_key() {
        // Serialising the defaults lists every key; each must appear in the template.
        let value = toml::Value::try_from(Config::default()).unwrap();
        for (table, keys) in value.as_table().unwrap() {
            for key in keys.as_table().unwrap().keys() {
                assert!(
                    TEMPLATE.lines().any(|l| l
                        .trim_start()
                        .trim_start_matches('#')
                        .trim_start()
                        .starts_with(&format!("{key} ="))),
                    "etc/farcache.toml lacks {table}.{key}"
                );
            }
        }
        // The [mount] and [cache] tables are their crates' own templates, word for word.
        assert!(
            TEMPLATE.contains(farcache_fuse::TEMPLATE),
            "etc/farcache.toml's [mount] differs from farcache_fuse::TEMPLATE"
        );
        assert!(
            TEMPLATE.contains(farcache_engine::config::TEMPLATE),
            "etc/farcache.toml's [cache] differs from farcache_engine::config::TEMPLATE"
        );
        assert!(
            TEMPLATE.contains(farcache_engine::writeback::TEMPLATE),
            "etc/farcache.toml's [tier] differs from farcache_engine::writeback::TEMPLATE"
        );
        assert!(
            TEMPLATE.contains(farcache_fuse::union::BALANCE_TEMPLATE),
            "etc/farcache.toml's [balance] differs from farcache_fuse::union::BALANCE_TEMPLATE"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_by_name() {
        let e = farcache_config::parse_toml::<Config>("t", "[server]\ncapasity = \"1GiB\"").unwrap_err().to_string();
        assert!(e.contains("capasity"), "{e}");
        let e = farcache_config::parse_toml::<Config>("t", "[server]\ncapacity = \"1 gigglebyte\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("capacity") && e.contains("unknown unit"), "{e}");
        let c: Config = farcache_config::parse_toml("t", "[server]\ncapacity = \"4KiB\"").unwrap();
        let e = c.server.validate().unwrap_err().to_string();
        assert!(e.starts_with("server.capacity:") && e.contains("set at least"), "{e}");
        let c: Config = farcache_config::parse_toml("t", "[server]\npolicy = \"mru\"").unwrap();
        assert!(c.server.validate().unwrap_err().to_string().starts_with("server.policy:"));
        let c: Config = farcache_config::parse_toml("t", "[[server.tenant]]\nname = \"a\"").unwrap();
        assert!(c.server.validate().unwrap_err().to_string().contains("has no secret"));
        let e = farcache_config::parse_toml::<Config>("t", "[cache]\nrouting = \"fastest\"").unwrap_err().to_string();
        assert!(e.contains("routing") && e.contains("fastest"), "{e}");
        let c: Config = farcache_config::parse_toml("t", "[cache]\nthreshold = \"5000B\"").unwrap();
        assert!(c.cache.validate().unwrap_err().to_string().starts_with("cache.threshold:"));
        let c: Config =
            farcache_config::parse_toml("t", "[cache]\nservers = [\"10.0.0.1:7411\"]\nrouting = \"adaptive\"").unwrap();
        c.cache.validate().unwrap();
        assert_eq!(c.cache.routing, farcache_engine::config::Routing::Adaptive);
        let e = farcache_config::parse_toml::<Config>("t", "[balance]\nenabeld = true").unwrap_err().to_string();
        assert!(e.contains("enabeld"), "{e}");
        let c: Config = farcache_config::parse_toml("t", "[balance]\nstart_ratio = 1.5\nstop_ratio = 1.5").unwrap();
        let e = c.balance.validate().unwrap_err().to_string();
        assert!(e.starts_with("balance.stop_ratio:") && e.contains("hysteresis"), "{e}");
    }
}
