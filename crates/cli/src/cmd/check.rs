//! `farcache check --server [memcached://]HOST:PORT`: prove a lender works end to end — a
//! farcache server, or a memcached about to be listed as one. Writes blocks with contents
//! derived from their keys, reads them back twice in a random order with many requests in
//! flight, verifies every byte, deletes them, and reports what it saw.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use farcache_bench::progress::{Progress, Unit};
use farcache_client::{ClientConfig, Key, LenderClient, PutStatus};
use farcache_config::ByteSize;

#[derive(clap::Args)]
pub struct Args {
    /// The lender to check: HOST:PORT for a farcache server, memcached://HOST:PORT for a
    /// memcached.
    #[arg(long, value_name = "[memcached://]HOST:PORT")]
    server: String,
    /// Data to write and read back.
    #[arg(long, default_value = "64MiB")]
    size: ByteSize,
    /// Tenant to connect as (default: "check", or the client certificate's name).
    #[arg(long)]
    tenant: Option<String>,
    /// File whose first line is the tenant's secret.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    #[command(flatten)]
    tls: super::TlsArgs,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

const BLOCK: usize = 4096;
/// The file identity used for check blocks: unlikely to meet a real client's.
const CHECK_FILE: u128 = 0xfa5c_ac4e_c4ec_0000_0000_0000_0000_0001;

/// The contents of block `n` under `run`: every 8 bytes spell (run, n, offset).
fn block(run: u64, n: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(BLOCK);
    for i in 0..(BLOCK / 8) as u64 {
        v.extend_from_slice(&(run ^ n.rotate_left(20) ^ i.rotate_left(44)).to_le_bytes());
    }
    v
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let blocks = a.size.bytes() / BLOCK as u64;
    if blocks == 0 || a.concurrency == 0 {
        bail!("--size must be at least 4KiB and --concurrency at least 1");
    }
    let server = super::lenders::resolve_lender(&a.server, "--server")?;
    let secret = super::read_secret_file(a.secret_file.as_deref())?;
    let tls = a.tls.client_tls(&server.addr.to_string())?;
    let tenant = a.tls.tenant(a.tenant.as_deref(), "check")?;
    if server.is_memcached() && (!secret.is_empty() || tls.is_some()) {
        bail!("{server}: memcached has no tenant secrets and no TLS; drop --secret-file and the --tls-* flags");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let mut cfg = ClientConfig::new(server.addr, tenant.clone());
        cfg.secret = secret;
        cfg.tls = tls;
        cfg.request_timeout = Duration::from_secs(10);
        let client = LenderClient::connect(server.protocol, cfg).await.with_context(|| {
            let kind = if server.is_memcached() { "memcached" } else { "farcache server" };
            format!("cannot reach {kind} {}", server.addr)
        })?;
        // A fresh epoch per run, so two checks never read each other's blocks.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let run_id = (now.as_nanos() as u64) ^ ((std::process::id() as u64) << 40);
        let key = move |n: u64| Key::new(CHECK_FILE, n, run_id);
        println!("checking {} ({} blocks of 4 KiB) against {} as tenant {:?}", a.size.approx(), blocks, server, tenant);
        let bar = Progress::new("check", 3 * blocks, Unit::Items("blocks"));
        bar.message("write");

        // Write.
        let t = Instant::now();
        let mut stored = 0u64;
        for chunk in (0..blocks).collect::<Vec<_>>().chunks(64) {
            let values: Vec<Vec<u8>> = chunk.iter().map(|&n| block(run_id, n)).collect();
            let entries: Vec<(Key, &[u8])> = chunk.iter().zip(&values).map(|(&n, v)| (key(n), v.as_slice())).collect();
            let statuses = client.put(&entries).await.context("PUT failed")?;
            stored += statuses.iter().filter(|s| **s == PutStatus::Stored).count() as u64;
            bar.inc(chunk.len() as u64);
        }
        let secs = t.elapsed().as_secs_f64();
        println!("write    {stored}/{blocks} blocks stored in {secs:.2} s ({:.0} blocks/s)", blocks as f64 / secs);

        // Read twice, random order, `concurrency` single-key GETs in flight.
        let mut order: Vec<u64> = (0..blocks).collect();
        let mut x = run_id | 1;
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        for pass in 1..=2 {
            bar.message(format!("read {pass}"));
            let t = Instant::now();
            let (mut hits, mut wrong) = (0u64, 0u64);
            for wave in order.chunks(a.concurrency) {
                let futs = wave.iter().map(|&n| {
                    let client = client.clone();
                    let k = key(n);
                    async move { (n, client.get(&[k]).await) }
                });
                for (n, res) in futures_join(futs).await {
                    if let Some(v) = res.context("GET failed")?.pop().flatten() {
                        hits += 1;
                        if v[..] != block(run_id, n)[..] {
                            wrong += 1;
                        }
                    }
                }
                bar.inc(wave.len() as u64);
            }
            let secs = t.elapsed().as_secs_f64();
            println!(
                "read {pass}   {hits}/{blocks} hits ({:.1}%), {:.0} reads/s, every byte of every hit verified",
                100.0 * hits as f64 / blocks as f64,
                blocks as f64 / secs
            );
            if wrong > 0 {
                bail!("{wrong} blocks came back with wrong contents");
            }
        }
        bar.finish();
        let keys: Vec<Key> = (0..blocks).map(key).collect();
        client.del(&keys).await.context("DEL failed")?;
        println!("cleanup  deleted the check blocks");
        client.close();
        anyhow::Ok(())
    })
}

/// Await a batch of futures concurrently, keeping their order.
async fn futures_join<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("check task panicked"));
    }
    out
}
