//! `farcache config`: print the template with every default, or check a file.

use std::path::PathBuf;

use crate::config::{Config, TEMPLATE};

#[derive(clap::Args)]
pub struct Args {
    /// Check this file instead: parse it, validate it, print the effective configuration.
    #[arg(long)]
    check: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match a.check {
        None => print!("{TEMPLATE}"),
        Some(path) => {
            let cfg = Config::load_from("--check", &path)?;
            cfg.server.validate()?;
            cfg.mount.validate()?;
            crate::config::check_cache_tls_files(&cfg.cache)?;
            cfg.cache.validate()?;
            cfg.tier.validate()?;
            print!("{}", toml::to_string(&cfg)?);
        }
    }
    Ok(())
}
