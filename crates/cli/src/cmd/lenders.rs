//! `farcache lenders MOUNTPOINT [--add HOST:PORT]... [--remove HOST:PORT]...`: list, add or
//! remove the lenders of a running mount, through its control socket.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use farcache_client::{LenderAddr, LenderProtocol};
use farcache_engine::remote::LenderStatus;
use serde_json::{json, Value};

use crate::control::client::{call_mount, socket_for};

#[derive(clap::Args)]
pub struct Args {
    /// Mount point of a running `farcache mount`.
    #[arg(required_unless_present = "control_socket")]
    mountpoint: Option<PathBuf>,
    /// Start borrowing from this lender (repeatable); blocks start landing on it at once.
    #[arg(long, value_name = "[memcached://]HOST:PORT")]
    add: Vec<String>,
    /// Stop borrowing from this lender (repeatable); removals are done before additions.
    #[arg(long, value_name = "[memcached://]HOST:PORT")]
    remove: Vec<String>,
    /// Print the raw JSON list.
    #[arg(long)]
    json: bool,
    /// The mount's control socket, if not the default one for MOUNTPOINT.
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let (mnt, socket) = target(a.mountpoint.as_deref(), a.control_socket.as_deref())?;
    let mut requests = Vec::new();
    for r in &a.remove {
        requests.push(json!({ "cmd": "remove_lender", "addr": resolve_lender(r, "--remove")?.to_string() }));
    }
    for r in &a.add {
        requests.push(json!({ "cmd": "add_lender", "addr": resolve_lender(r, "--add")?.to_string() }));
    }
    requests.push(json!({ "cmd": "lenders" }));
    let mut last = Value::Null;
    for (i, req) in requests.iter().enumerate() {
        last = match call_mount(&mnt, &socket, req) {
            Ok(v) => v,
            Err(e) if i > 0 => anyhow::bail!("{e:#} (the {i} change(s) before it were made)"),
            Err(e) => return Err(e),
        };
    }
    let lenders = last.get("lenders").cloned().unwrap_or(Value::Array(Vec::new()));
    if a.json {
        println!("{lenders}");
        return Ok(());
    }
    let lenders: Vec<LenderStatus> =
        serde_json::from_value(lenders).context("the daemon sent a lender list this version cannot read")?;
    print!("{}", render(&lenders));
    Ok(())
}

/// The mount point (for messages) and the socket a client command talks to.
pub fn target(
    mountpoint: Option<&std::path::Path>,
    explicit: Option<&std::path::Path>,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let socket = match mountpoint {
        Some(m) => socket_for(m, explicit)?,
        None => explicit.context("name a MOUNTPOINT or a --control-socket")?.to_path_buf(),
    };
    Ok((mountpoint.map(|m| m.to_path_buf()).unwrap_or_else(|| socket.clone()), socket))
}

/// `HOST:PORT` to one address, resolved here so the daemon is told exactly which.
pub fn resolve(s: &str, flag: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .with_context(|| format!("{flag} {s:?}: expected HOST:PORT"))?
        .next()
        .with_context(|| format!("{flag} {s:?}: no address"))
}

/// `HOST:PORT` or `memcached://HOST:PORT` to one lender address.
pub fn resolve_lender(s: &str, flag: &str) -> anyhow::Result<LenderAddr> {
    let (protocol, rest) = LenderProtocol::split(s).map_err(|why| anyhow::anyhow!("{flag} {s:?}: {why}"))?;
    Ok(LenderAddr { protocol, addr: resolve(rest, flag)? })
}

/// What a lender's state is called in tables.
pub fn state(l: &LenderStatus) -> &'static str {
    match (l.connected, l.instance_id) {
        (true, _) => "connected",
        (false, 0) => "connecting",
        (false, _) => "reconnecting",
    }
}

pub fn render(lenders: &[LenderStatus]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if lenders.is_empty() {
        out.push_str("no lenders\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<28} {:<13} {:<17} {:>8} {:>12} {:>12} {:>9} {:>12}",
        "lender", "state", "instance", "connects", "hits", "misses", "ratio", "puts"
    );
    for l in lenders {
        let _ = writeln!(
            out,
            "{:<28} {:<13} {:<17} {:>8} {:>12} {:>12} {:>9} {:>12}",
            l.addr.to_string(),
            state(l),
            if l.instance_id == 0 { "-".to_string() } else { format!("{:016x}", l.instance_id) },
            l.connects,
            l.hits,
            l.misses,
            super::stats::ratio(l.hits, l.misses),
            l.puts
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let up = LenderStatus {
            addr: "10.0.0.2:7411".parse().unwrap(),
            connected: true,
            instance_id: 0xabc,
            connects: 1,
            hits: 3,
            misses: 1,
            puts: 4,
        };
        let down = LenderStatus { addr: "[::1]:7411".parse().unwrap(), connected: false, instance_id: 0, ..up.clone() };
        let t = render(&[up, down]);
        let rows: Vec<&str> = t.lines().collect();
        assert_eq!(rows.len(), 3, "{t}");
        assert!(rows[1].starts_with("10.0.0.2:7411") && rows[1].contains("connected") && rows[1].contains("75.0%"));
        assert!(rows[1].contains("0000000000000abc"), "{t}");
        assert!(rows[2].starts_with("[::1]:7411") && rows[2].contains("connecting"), "{t}");
        assert_eq!(render(&[]), "no lenders\n");
    }
}
