//! `farcache stats`: counters as a table or JSON — of a lender (`--server HOST:PORT`, its
//! STATS document) or of a running mount (`MOUNTPOINT`, through its control socket).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use farcache_client::{Client, ClientConfig};
use farcache_config::{ByteSize, HumanDuration};
use farcache_engine::routing::FILL_MARGIN;
use farcache_server::ServerStats;
use serde_json::json;

use super::mount::MountStats;

#[derive(clap::Args)]
#[command(after_help = "A mount's control socket is, unless --control-socket says otherwise, \
/run/farcache/ (root), else $XDG_RUNTIME_DIR/farcache/, else /tmp/farcache-UID/, \
named after the mount point.")]
pub struct Args {
    /// Mount point of a running `farcache mount` whose counters to show.
    #[arg(required_unless_present_any = ["server", "control_socket"], conflicts_with = "server")]
    mountpoint: Option<PathBuf>,
    /// A lender (`farcache server`) whose counters to show, instead of a mount's.
    #[arg(long, value_name = "HOST:PORT")]
    server: Option<String>,
    /// Print the raw JSON.
    #[arg(long)]
    json: bool,
    /// With --server: tenant to connect as (STATS show this tenant, or all for an admin tenant).
    #[arg(long, conflicts_with_all = ["mountpoint", "control_socket"])]
    tenant: Option<String>,
    /// With --server: file whose first line is the tenant's secret.
    #[arg(long, conflicts_with_all = ["mountpoint", "control_socket"])]
    secret_file: Option<PathBuf>,
    #[command(flatten)]
    tls: super::TlsArgs,
    /// Ask again every DURATION (e.g. 1s; at least 100ms), printing each answer (with --json,
    /// one JSON document per line: a time series — a lender's targets and hit ratios, a
    /// mount's routing and counters, `uptime_ms` the mount's clock — for plots), until
    /// interrupted or --count answers. A lender is asked over the same connection, a mount
    /// through its control socket; a mount that stops answering ends the watch with an error.
    #[arg(long, value_name = "DURATION")]
    watch: Option<HumanDuration>,
    /// With --watch: stop after this many answers.
    #[arg(long, value_name = "N", requires = "watch")]
    count: Option<u64>,
    /// The mount's control socket, if not the default one for MOUNTPOINT.
    #[arg(long, value_name = "PATH", conflicts_with = "server")]
    control_socket: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match &a.server {
        Some(server) => run_server(&a, server),
        None => run_mount(&a),
    }
}

/// The shortest `--watch` interval: a stats request costs the daemon a snapshot of every
/// counter and of its memory (`/proc/self/smaps_rollup`), so a watch is kept to ten a second.
pub(crate) const MIN_WATCH: Duration = Duration::from_millis(100);

/// How many answers to print and how far apart: one, or `--watch`'s series.
fn watch_plan(a: &Args) -> anyhow::Result<(u64, Duration)> {
    let Some(every) = a.watch.map(|w| w.get()) else { return Ok((1, Duration::ZERO)) };
    anyhow::ensure!(
        every >= MIN_WATCH,
        "--watch {}: give an interval of at least {} such as 1s",
        HumanDuration(every),
        HumanDuration(MIN_WATCH)
    );
    Ok((a.count.unwrap_or(u64::MAX), every))
}

fn run_mount(a: &Args) -> anyhow::Result<()> {
    let (mnt, socket) = super::lenders::target(a.mountpoint.as_deref(), a.control_socket.as_deref())?;
    let (count, every) = watch_plan(a)?;
    for n in 0..count {
        if n > 0 {
            std::thread::sleep(every);
        }
        let resp = crate::control::client::call_mount(&mnt, &socket, &json!({ "cmd": "stats" }))?;
        let stats = resp.get("stats").context("the daemon's answer has no stats")?;
        if a.json {
            println!("{stats}");
        } else {
            let s: MountStats =
                serde_json::from_value(stats.clone()).context("the mount sent stats this version cannot read")?;
            print!("{}", render_mount(&s));
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    Ok(())
}

fn run_server(a: &Args, server: &str) -> anyhow::Result<()> {
    let addr: SocketAddr = resolve(server)?;
    let secret = super::read_secret_file(a.secret_file.as_deref())?;
    let tenant = a.tls.tenant(a.tenant.as_deref(), "default")?;
    let tls = a.tls.client_tls(server)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (count, every) = watch_plan(a)?;
    rt.block_on(async {
        let mut cfg = ClientConfig::new(addr, tenant);
        cfg.secret = secret;
        cfg.tls = tls;
        cfg.connect_timeout = Duration::from_secs(3);
        cfg.request_timeout = Duration::from_secs(5);
        let client = Client::connect(cfg).await.with_context(|| format!("cannot reach farcache server {addr}"))?;
        for n in 0..count {
            if n > 0 {
                tokio::time::sleep(every).await;
            }
            let json = client.stats().await.context("STATS failed")?;
            if a.json {
                println!("{json}");
            } else {
                let s: ServerStats =
                    serde_json::from_str(&json).context("server sent stats this version cannot read")?;
                print!("{}", render(&s));
            }
            use std::io::Write;
            let _ = std::io::stdout().flush();
        }
        client.close();
        anyhow::Ok(())
    })
}

fn resolve(s: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .with_context(|| format!("--server {s:?}: expected HOST:PORT"))?
        .next()
        .with_context(|| format!("--server {s:?}: no address"))
}

pub fn ratio(hits: u64, misses: u64) -> String {
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
    let alloc = if s.allocation.is_empty() { "shared" } else { s.allocation.as_str() };
    if s.placement_swaps > 0 {
        let _ = writeln!(out, "allocation {alloc} ({} placement swaps)", s.placement_swaps);
    } else {
        let _ = writeln!(out, "allocation {alloc}");
    }
    let _ = writeln!(
        out,
        "{:<20} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12} {:>9} {:>9} {:>10}",
        "tenant", "limit", "target", "min", "used", "blocks", "hits", "misses", "ratio", "predicted", "evictions"
    );
    for x in &s.tenants {
        let c = &x.counters;
        let predicted = x.predicted_hit_ratio.map_or("-".to_string(), |p| format!("{:.1}%", 100.0 * p));
        let _ = writeln!(
            out,
            "{:<20} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12} {:>9} {:>9} {:>10}",
            x.name,
            ByteSize(x.limit_bytes).approx(),
            ByteSize(x.target_bytes).approx(),
            ByteSize(x.min_bytes).approx(),
            ByteSize(x.used_bytes).approx(),
            c.blocks,
            c.hits,
            c.misses,
            ratio(c.hits, c.misses),
            predicted,
            c.evictions
        );
        if !x.predicted.is_empty() {
            let points: Vec<String> = x
                .predicted
                .iter()
                .map(|p| format!("{:.1}% at {}", 100.0 * p.hit_ratio, ByteSize(p.bytes).approx()))
                .collect();
            let _ = writeln!(out, "{:<20} curve: {}", "", points.join(", "));
        }
    }
    out
}

/// A mount's counters as a table: what each line means is in docs/METRICS.md ("Mount").
fn render_mount(s: &MountStats) -> String {
    use std::fmt::Write;
    let (r, e, c, b) = (&s.cache.remote, &s.cache.engine, &s.cache, &s.cache.backing);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "farcache mount {} (backing {}), version {}, pid {}, up {}s",
        s.mountpoint, s.backing_dir, s.version, s.pid, s.uptime_secs
    );
    let routing = match c.routing.mode.as_str() {
        "threshold" => format!("threshold: reads of {} or more go to the disk", ByteSize(c.routing.threshold_bytes)),
        "adaptive" => match &c.routing.adaptive {
            Some(a) => format!(
                "adaptive: {} to lenders, {} to the disk, {} probes (backed off {}x, ended by {} disk windows and {} probes; streams' {}x), {} switches; \
                 disk share {:.0}%, a disk read {:.1}x a lender's (fills above {FILL_MARGIN}x, counts {:.2}x its time), \
                 {:.0}% of fills not retired by writes, lenders hold {:.0}% of random reads (a miss {:.0}us); \
                 disk {:.0}us + {:.0} MB/s ({} samples), lenders {:.0}us + {:.0} MB/s ({} samples); \
                 streams to the {}: disk {}, lenders {} (probes {})",
                e.adaptive_remote,
                e.adaptive_disk,
                e.adaptive_probes,
                1u64 << a.probe_backoff,
                a.backoff_ends[0],
                a.backoff_ends[1],
                1u64 << a.stream_probe_backoff,
                a.switches,
                a.disk_share * 100.0,
                a.disk_over_remote,
                a.disk_weight,
                a.fills_surviving * 100.0,
                a.lenders_held * 100.0,
                a.lender_miss_us,
                a.disk_access_us,
                a.disk_bytes_per_us,
                a.disk_samples,
                a.remote_access_us,
                a.remote_bytes_per_us,
                a.remote_samples,
                if a.stream_remote { "lenders" } else { "disk" },
                stream_rate(a.stream_us_per_mib[0]),
                stream_rate(a.stream_us_per_mib[1]),
                stream_rate(a.stream_us_per_mib[2]),
            ),
            None => "adaptive".to_string(),
        },
        other => other.to_string(),
    };
    let tier = match s.remote_tier.as_str() {
        "none" => "none (--no-remote: plain passthrough)".to_string(),
        "embedded" => "a lender inside the mount process".to_string(),
        _ => format!("{} lender(s)", c.lenders.len()),
    };
    let _ = writeln!(out, "remote     {tier}; routing {routing}");
    let _ = writeln!(out, "{:<10} {:>12} {:>12} {:>9}", "tier", "hits", "misses", "ratio");
    let _ = writeln!(out, "{:<10} {:>12} {:>12} {:>9}", "lenders", r.hits, r.misses, ratio(r.hits, r.misses));
    let disk = b.reads_direct + b.reads_buffered;
    let _ = writeln!(out, "{:<10} {:>12} {:>12} {:>9}", "disk", disk, "-", "-");
    let _ = writeln!(
        out,
        "hit ratio  {} of blocks asked of lenders; reads: {} from lenders, {} small from disk, {} sequential bypasses",
        ratio(r.hits, r.misses),
        e.remote_reads,
        e.disk_reads,
        e.sequential_bypasses
    );
    let _ = writeln!(
        out,
        "bytes      {} from lenders, {} to lenders; {} fills ({} dropped, {} failed, {} in flight of {}, {} not sent twice), \
         {} read-arounds, {} seed blocks",
        ByteSize(r.bytes_from_servers).approx(),
        ByteSize(r.bytes_to_servers).approx(),
        r.puts,
        r.puts_dropped,
        r.puts_failed,
        r.puts_in_flight,
        r.puts_bound,
        e.fills_pending_skipped,
        e.read_arounds,
        e.seed_fills
    );
    let _ = writeln!(
        out,
        "faults     {} invalidations ({} dropped), {} fallbacks, {} answers rejected, {} failed authentication, \
         {} connects ({} failed)",
        r.invalidations,
        r.invalidations_dropped,
        r.fallbacks,
        r.rejected,
        r.auth_failures,
        r.connects,
        r.connect_failures
    );
    let _ = writeln!(
        out,
        "index      {} for {} blocks cached ({} per GiB cached)",
        ByteSize(c.index.memory_bytes).approx(),
        c.index.remote_blocks,
        ByteSize(c.index.bytes_per_gib_cached).approx()
    );
    let _ = writeln!(
        out,
        "backing    {} direct + {} buffered reads ({}), {} writes ({}), {} fsyncs",
        b.reads_direct,
        b.reads_buffered,
        ByteSize(b.read_bytes).approx(),
        b.writes,
        ByteSize(b.write_bytes).approx(),
        b.fsyncs
    );
    let f = &s.fuse;
    match f.mode.as_str() {
        "io_uring" => {
            let _ = writeln!(
                out,
                "fuse       FUSE-over-io_uring (mount.fuse_uring = {}): {} queues, {} entries, {} requests over the \
                 rings, {} replies refused",
                f.fuse_uring, f.ring_queues, f.ring_entries, f.ring_requests, f.ring_commit_errors
            );
        }
        "" => {}
        _ => {
            let _ = writeln!(
                out,
                "fuse       /dev/fuse read loops (mount.fuse_uring = {}){}",
                f.fuse_uring,
                if f.reason.is_empty() { String::new() } else { format!(": {}", f.reason) }
            );
        }
    }
    if f.read_ahead_wanted_kb > 0 || f.read_ahead_kb > 0 {
        let _ = writeln!(
            out,
            "readahead  {} KiB a window (mount.read_ahead: {}){}",
            f.read_ahead_kb,
            if f.read_ahead_wanted_kb == 0 {
                "the kernel's".to_string()
            } else {
                format!("{} KiB", f.read_ahead_wanted_kb)
            },
            if f.read_ahead_problem.is_empty() { String::new() } else { format!(": {}", f.read_ahead_problem) }
        );
    }
    if f.kernel_passthrough || !f.kernel_passthrough_problem.is_empty() {
        let _ = writeln!(
            out,
            "passthru   {} (mount.kernel_passthrough): {} opens served by the kernel, {} files open so now{}",
            if f.kernel_passthrough { "on" } else { "off" },
            f.passthrough_opens,
            f.passthrough_files,
            if f.kernel_passthrough_problem.is_empty() {
                String::new()
            } else {
                format!("; {}", f.kernel_passthrough_problem)
            }
        );
    }
    if f.inode_fd_budget > 0 {
        let _ = writeln!(
            out,
            "inodes     {} known; {} descriptors held (at most {}: RLIMIT_NOFILE is below mount.max_inodes), {} reopened by \
             file handle, {} let go of",
            f.inodes, f.inode_fds, f.inode_fd_budget, f.inode_reopens, f.inode_fds_released
        );
    } else if f.inodes > 0 {
        let _ = writeln!(out, "inodes     {} known, a descriptor each", f.inodes);
    }
    let mut ops: Vec<(&String, &u64)> = f.ops.iter().filter(|(_, n)| **n > 0).collect();
    if !ops.is_empty() {
        ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let list: Vec<String> = ops.iter().map(|(op, n)| format!("{op} {n}")).collect();
        let _ = writeln!(out, "fuse ops   {}", list.join(", "));
    }
    let m = &s.memory;
    if m.rss_bytes > 0 {
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
        let _ = writeln!(
            out,
            "memory     daemon RSS {}, anon {} ({} of it lazily freed); disk-read buffers {} in use, {} idle (at most {})",
            mib(m.rss_bytes),
            mib(m.anon_bytes),
            mib(m.lazyfree_bytes),
            mib(m.io_buffers_bytes),
            mib(m.io_buffers_idle_bytes),
            mib(m.io_buffers_idle_max_bytes)
        );
    }
    let cpu = &s.cpu;
    if cpu.user_us + cpu.system_us > 0 {
        let secs = |us: u64| format!("{:.1} s", us as f64 / 1e6);
        let _ = writeln!(
            out,
            "cpu        daemon {} user, {} system since it started",
            secs(cpu.user_us),
            secs(cpu.system_us)
        );
    }
    if let Some(u) = &s.union {
        let _ = writeln!(
            out,
            "union      {} branches ({}), new files {}; {} ids given ({} failed)",
            u.branches.len(),
            u.branches.join(", "),
            u.create_policy,
            u.ids_assigned,
            u.id_failures
        );
        let _ = writeln!(
            out,
            "moves      {} files ({}), {} failed, {} skipped; blocks from cache {} ({} from the tier), from disk {}; races {}, \
             retries {}; \
             {} open handles switched; {} interrupted moves finished at start; copies yielded to the foreground {} \
             times before the disk ({} to the bound) for {} ms, {} times before the lenders for {} ms",
            u.moves,
            ByteSize(u.bytes_moved).approx(),
            u.move_failures,
            u.move_skips,
            u.blocks_from_cache,
            u.blocks_from_tier,
            u.blocks_from_disk,
            u.races,
            u.retries,
            u.handles_switched,
            u.journal_replayed,
            u.copy_yields,
            u.copy_yield_bounded,
            u.copy_yield_wait_ms,
            u.copy_lender_yields,
            u.copy_lender_yield_wait_ms
        );
        if u.auto_enabled {
            let _ = writeln!(
                out,
                "auto       {}: {} checks, {} rounds moved {} files, {} rounds skipped (a balance was running); \
                 last busy per mille {:?}",
                if u.auto_active { "active" } else { "idle" },
                u.auto_checks,
                u.auto_rounds,
                u.auto_moves,
                u.auto_skips,
                u.auto_busy_permille
            );
        }
    }
    if let Some(t) = &c.tier {
        let l = &t.log;
        let _ = writeln!(
            out,
            "write-back {} ({}: {}), {} dirty in {} blocks of {} files, {} of {} used",
            t.path,
            l.mode,
            l.durability,
            ByteSize(l.dirty_bytes).approx(),
            l.dirty_blocks,
            l.files,
            ByteSize(l.used_bytes).approx(),
            ByteSize(l.capacity_bytes).approx()
        );
        let _ = writeln!(
            out,
            "           {} writes ({}) in {} group commits, {} fsyncs absorbed; written through: {} full, {} broken, \
             {} unnamed, {} of long streams ({})",
            t.writes,
            ByteSize(t.write_bytes).approx(),
            l.groups,
            t.fsyncs_absorbed,
            t.write_through_full,
            t.write_through_broken,
            t.write_through_unnamed,
            t.write_through_sequential,
            ByteSize(t.write_through_sequential_bytes).approx()
        );
        let _ = writeln!(
            out,
            "           destaged {} blocks ({}) in {} rounds ({} batches at full depth, the mount idle; {} file-system syncs), {} blocks of {} deleted files never written; {} errors{}",
            t.destaged_blocks,
            ByteSize(t.destaged_bytes).approx(),
            t.destage_rounds,
            t.destage_batches_deep,
            t.destage_fs_syncs,
            t.discarded_blocks,
            t.discarded_files,
            t.destage_errors,
            t.last_destage_error.as_deref().map(|e| format!(", last: {e}")).unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "           {} backing files open (at most {} kept while idle), {} opened again",
            t.open_files, t.max_open_files, t.reopens
        );
        if let Some(f) = &t.destage_stalled_on {
            let _ = writeln!(
                out,
                "           DESTAGE STALLED: waiting {:.0} s on the backing store ({f}); {} stalls so far — the data stays dirty in the tier",
                t.destage_round_ms as f64 / 1000.0,
                t.destage_stalls
            );
        } else if t.destage_stalls > 0 {
            let _ = writeln!(out, "           {} destage stalls so far (none now)", t.destage_stalls);
        }
        if let Some(b) = &l.broken {
            let _ = writeln!(out, "           MEDIUM FAILED: {b} (every write goes through)");
        }
    }
    if s.remote_tier != "none" {
        let _ = writeln!(out, "lenders");
        out.push_str(&super::lenders::render(&c.lenders));
    }
    out
}

/// A stream cost in µs per MiB as a rate ("-" before it is measured).
fn stream_rate(us_per_mib: f64) -> String {
    if us_per_mib > 0.0 {
        format!("{:.0} MB/s", (1u64 << 20) as f64 / us_per_mib)
    } else {
        "-".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::mount::{DaemonCpu, DaemonMemory};
    use farcache_engine::stats::CacheStats;

    #[test]
    fn a_mount_table_shows_every_group() {
        let mut cache = CacheStats::default();
        cache.remote.hits = 900;
        cache.remote.misses = 100;
        cache.remote.bytes_from_servers = 900 * 4096;
        cache.engine.sequential_bypasses = 7;
        cache.index = farcache_engine::stats::IndexStats::new(150 << 10, 262_144);
        cache.routing.mode = "threshold".into();
        cache.routing.threshold_bytes = 128 << 10;
        let s = MountStats {
            version: "0.1.0".into(),
            pid: 42,
            mountpoint: "/mnt/data".into(),
            backing_dir: "/srv/data".into(),
            uptime_secs: 5,
            uptime_ms: 5_000,
            unix_ms: 1_765_000_000_000,
            remote_tier: "lenders".into(),
            cache,
            union: None,
            fuse: farcache_fuse::TransportStats {
                mode: "read-loops".into(),
                fuse_uring: "auto".into(),
                reason: "FUSE-over-io_uring is off in the kernel".into(),
                ops: [("getattr".to_string(), 3), ("write".to_string(), 5), ("lseek".to_string(), 0)]
                    .into_iter()
                    .collect(),
                inodes: 30_000,
                inode_fds: 4_000,
                inode_fd_budget: 5_000,
                inode_reopens: 12,
                inode_fds_released: 26_000,
                ..Default::default()
            },
            memory: DaemonMemory {
                rss_bytes: 40 << 20,
                anon_bytes: 30 << 20,
                lazyfree_bytes: 8 << 20,
                io_buffers_bytes: 3 << 20,
                io_buffers_idle_bytes: 2 << 20,
                io_buffers_idle_max_bytes: 16 << 20,
                ..Default::default()
            },
            cpu: DaemonCpu { user_us: 12_345_678, system_us: 4_500_000 },
        };
        let t = render_mount(&s);
        for want in [
            "/mnt/data",
            "hit ratio  90.0%",
            "128KiB or more",
            "7 sequential bypasses",
            "per GiB cached",
            "no lenders",
            "invalidations",
            "fallbacks",
            "read loops (mount.fuse_uring = auto): FUSE-over-io_uring is off",
            "fuse ops   write 5, getattr 3\n",
            "inodes     30000 known; 4000 descriptors held (at most 5000",
            "12 reopened by file handle, 26000 let go of",
            "memory     daemon RSS 40.0 MiB, anon 30.0 MiB (8.0 MiB of it lazily freed); disk-read buffers 3.0 MiB in use, 2.0 MiB idle (at most 16.0 MiB)",
            "cpu        daemon 12.3 s user, 4.5 s system since it started",
        ] {
            assert!(t.contains(want), "no {want:?} in\n{t}");
        }
        // It reads back from the JSON the daemon sends (flattened engine stats).
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["remote"]["hits"], 900);
        assert_eq!(v["mountpoint"], "/mnt/data");
        let back: MountStats = serde_json::from_value(v).unwrap();
        assert_eq!(back.cache, s.cache);
        let none = MountStats { remote_tier: "none".into(), ..s };
        assert!(!render_mount(&none).contains("lenders\n"));
        assert!(!render_mount(&none).contains("write-back"), "{}", render_mount(&none));
        // With a tier: its mode and durability, dirty bytes, destage errors; and the JSON
        // reads back.
        let mut with_tier = none.clone();
        let mut t = farcache_engine::writeback::TierStats { path: "/dev/shm/t".into(), ..Default::default() };
        t.log.mode = "dram".into();
        t.log.durability = "survives the daemon, not a power cut".into();
        t.log.dirty_bytes = 8192;
        t.destage_errors = 2;
        t.destage_fs_syncs = 7;
        t.last_destage_error = Some("x: No space left on device".into());
        with_tier.cache.tier = Some(t);
        let r = render_mount(&with_tier);
        for want in [
            "write-back /dev/shm/t (dram: survives the daemon, not a power cut)",
            "8.00 KiB dirty",
            "2 errors, last: x: No space",
            "7 file-system syncs",
        ] {
            assert!(r.contains(want), "no {want:?} in\n{r}");
        }
        let back: MountStats = serde_json::from_value(serde_json::to_value(&with_tier).unwrap()).unwrap();
        assert_eq!(back.cache, with_tier.cache);
        // The adaptive rule's line: the share, and what a disk read counts against a hit.
        let mut adaptive = none.clone();
        adaptive.cache.routing.mode = "adaptive".into();
        adaptive.cache.routing.adaptive = Some(farcache_engine::routing::AdaptiveEstimates {
            disk_share: 1.0,
            disk_over_remote: 0.5,
            disk_weight: 1.0 / 1.1,
            ..Default::default()
        });
        let r = render_mount(&adaptive);
        let want = "disk share 100%, a disk read 0.5x a lender's (fills above 1.5x, counts 0.91x its time)";
        assert!(r.contains(want), "no {want:?} in\n{r}");
    }
}
