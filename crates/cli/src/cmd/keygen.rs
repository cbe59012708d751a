//! `farcache keygen --out FILE`: write a fresh 256-bit key — a block key for `farcache mount
//! --key-file` (cache.key_file), or a pre-shared key for TLS without certificates
//! (server.tls_psk_file, cache.tls_psk_file, `--tls-psk-file`; use different keys for the two
//! purposes): 32 bytes from the operating system's random source, as 64 hex digits on
//! one line, in a new file only its owner can read or write (mode 600). Never overwrites: a
//! key in use must not be replaced by accident.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::Context;
use farcache_engine::seal::BlockKeyBytes;

#[derive(clap::Args)]
pub struct Args {
    /// Where to write the key; must not exist yet.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let shown = a.out.display();
    let mut f = match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&a.out) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => anyhow::bail!(
            "{shown} already exists: not overwriting a key (blocks sealed with it could no longer be read); \
             choose another path, or remove {shown} first"
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot create {shown}")),
    };
    let key = BlockKeyBytes::generate();
    f.write_all(key.to_hex_line().as_bytes()).with_context(|| format!("writing {shown}"))?;
    f.sync_all().with_context(|| format!("syncing {shown}"))?;
    println!(
        "wrote a new 256-bit key to {shown} (mode 600); use it as a block key (`farcache mount ... --key-file {shown}`) \
         or as a TLS pre-shared key (server.tls_psk_file and cache.tls_psk_file), not both"
    );
    Ok(())
}
