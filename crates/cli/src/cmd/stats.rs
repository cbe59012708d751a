//! `farcache stats --server HOST:PORT`: a server's counters, as a table or JSON.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use farcache_client::{Client, ClientConfig};
use farcache_config::ByteSize;
use farcache_server::ServerStats;

#[derive(clap::Args)]
pub struct Args {
    /// The server to ask.
    #[arg(long)]
    server: String,
    /// Print the raw JSON.
    #[arg(long)]
    json: bool,
    /// Tenant to connect as (STATS show this tenant, or all for an admin tenant).
    #[arg(long, default_value = "default")]
    tenant: String,
    /// File whose first line is the tenant's secret.
    #[arg(long)]
    secret_file: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let addr: SocketAddr = resolve(&a.server)?;
    let secret = super::read_secret_file(a.secret_file.as_deref())?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let json = rt.block_on(async {
        let mut cfg = ClientConfig::new(addr, a.tenant.clone());
        cfg.secret = secret;
        cfg.connect_timeout = Duration::from_secs(3);
        cfg.request_timeout = Duration::from_secs(5);
        let client = Client::connect(cfg).await.with_context(|| format!("cannot reach farcache server {addr}"))?;
        let json = client.stats().await.context("STATS failed")?;
        client.close();
        anyhow::Ok(json)
    })?;
    if a.json {
        println!("{json}");
        return Ok(());
    }
    let s: ServerStats = serde_json::from_str(&json).context("server sent stats this version cannot read")?;
    print!("{}", render(&s));
    Ok(())
}

fn resolve(s: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .with_context(|| format!("--server {s:?}: expected HOST:PORT"))?
        .next()
        .with_context(|| format!("--server {s:?}: no address"))
}

fn ratio(hits: u64, misses: u64) -> String {
    if hits + misses == 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * hits as f64 / (hits + misses) as f64)
    }
}

fn render(s: &ServerStats) -> String {
    let t = &s.totals;
    let mut out = String::new();
    use std::fmt::Write;
    let _ = writeln!(out, "farcache server {} (policy {}, up {}s)", s.version, s.policy, s.uptime_secs);
    let _ = writeln!(
        out,
        "capacity   {} ({} slots of {} B), used {} ({} blocks), overhead {}",
        ByteSize(s.capacity_bytes).approx(),
        s.slots,
        s.slot_bytes,
        ByteSize(s.used_bytes).approx(),
        t.blocks,
        ByteSize(s.overhead_bytes).approx()
    );
    let _ = writeln!(out, "hits       {}  misses {}  hit ratio {}", t.hits, t.misses, ratio(t.hits, t.misses));
    let _ =
        writeln!(out, "puts       {}  rejected {}  dels {}  evictions {}", t.puts, t.put_rejects, t.dels, t.evictions);
    let _ = writeln!(out, "bytes      in {}  out {}", t.bytes_in, t.bytes_out);
    let _ = writeln!(
        out,
        "conns      {} open, {} total, {} refused, {} protocol errors, {} timeouts",
        s.connections, s.connections_total, s.connections_refused, s.protocol_errors, s.timeouts
    );
    let _ = writeln!(
        out,
        "{:<20} {:>12} {:>12} {:>10} {:>12} {:>12} {:>9} {:>10}",
        "tenant", "limit", "used", "blocks", "hits", "misses", "ratio", "evictions"
    );
    for x in &s.tenants {
        let c = &x.counters;
        let _ = writeln!(
            out,
            "{:<20} {:>12} {:>12} {:>10} {:>12} {:>12} {:>9} {:>10}",
            x.name,
            ByteSize(x.limit_bytes).approx(),
            ByteSize(x.used_bytes).approx(),
            c.blocks,
            c.hits,
            c.misses,
            ratio(c.hits, c.misses),
            c.evictions
        );
    }
    out
}
