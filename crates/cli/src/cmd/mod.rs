pub mod bench;
pub mod check;
pub mod config;
pub mod keygen;
pub mod lenders;
pub mod mount;
pub mod randread;
pub mod server;
pub mod stats;

/// The secret in the first line of `path` (for `--secret-file`), or none.
pub fn read_secret_file(path: Option<&std::path::Path>) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context;
    let Some(p) = path else { return Ok(Vec::new()) };
    let text = std::fs::read_to_string(p).with_context(|| format!("cannot read --secret-file {}", p.display()))?;
    Ok(text.lines().next().unwrap_or("").trim().as_bytes().to_vec())
}
