//! `farcache balance MOUNTPOINT`: move recently read files off the busiest backing branch of
//! a mount of several (`farcache mount DIR1:DIR2 MOUNTPOINT`), copying what lenders hold
//! from their RAM and only the rest from the busy disk. The daemon does the work
//! (`farcache_fuse::union::balance`); this command asks it over the control socket, then
//! shows its progress until it is done.

use std::path::PathBuf;
use std::time::Duration;

use farcache_bench::progress::{say, Progress, Unit};
use farcache_fuse::union::{BalanceOptions, BalanceStatus, CopySource};
use serde_json::json;

use crate::control::client::call_mount;

/// How often progress is asked for.
const POLL: Duration = Duration::from_millis(200);

/// `--source`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum SourceArg {
    /// Blocks lenders hold from their RAM, the rest from the disk.
    Cache,
    /// Everything from the source disk (the conventional migration, for comparison).
    Disk,
}

#[derive(clap::Args)]
pub struct Args {
    /// The mount point of a running mount of several backing directories.
    mountpoint: PathBuf,
    /// Show the plan (which files, from where to where, the load measured) and move nothing.
    #[arg(long)]
    dry_run: bool,
    /// Where the copies read from.
    #[arg(long, value_enum, default_value = "cache")]
    source: SourceArg,
    /// Move at most this many files (the most recently read ones whose blocks lenders hold
    /// first).
    #[arg(long, default_value_t = 16)]
    files: usize,
    /// Target branch (its directory, or its position from 0); default the least busy.
    #[arg(long, value_name = "BRANCH")]
    to: Option<String>,
    /// Source branch; default the busiest.
    #[arg(long, value_name = "BRANCH")]
    from: Option<String>,
    /// How long the devices' load is measured before choosing, in milliseconds (at most 3000).
    #[arg(long, default_value_t = 500)]
    window_ms: u64,
    /// Print the final status as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// The mount's control socket, if not the default one for MOUNTPOINT.
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
}

fn status(v: &serde_json::Value) -> anyhow::Result<BalanceStatus> {
    Ok(serde_json::from_value(v["balance"].clone())?)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let socket = crate::control::client::socket_for(&a.mountpoint, a.control_socket.as_deref())?;
    let o = BalanceOptions {
        dry_run: a.dry_run,
        source: match a.source {
            SourceArg::Cache => CopySource::Cache,
            SourceArg::Disk => CopySource::Disk,
        },
        files: a.files,
        to: a.to.clone(),
        from: a.from.clone(),
        window_ms: a.window_ms,
    };
    let plan = status(&call_mount(&a.mountpoint, &socket, &json!({ "cmd": "balance", "options": o }))?)?;
    eprintln!(
        "balance {} -> {} (device busy per mille: {:?}; recent accesses: {:?}): {} files, {} bytes, from {}",
        plan.from,
        plan.to,
        plan.busy_permille,
        plan.recent_accesses,
        plan.planned.len(),
        plan.bytes_total,
        match o.source {
            CopySource::Cache => "the cache where it holds the blocks",
            CopySource::Disk => "the disk",
        }
    );
    if a.dry_run {
        for f in &plan.planned {
            println!("{}\t{} bytes\t{} blocks cached", f.path, f.bytes, f.cached_blocks);
        }
        if a.json {
            println!("{}", serde_json::to_string(&plan)?);
        }
        return Ok(());
    }
    let bar = Progress::new("balance", plan.bytes_total, Unit::Bytes);
    let plan_id = plan.id;
    let mut last = plan;
    while last.running {
        std::thread::sleep(POLL);
        last = status(&call_mount(&a.mountpoint, &socket, &json!({ "cmd": "balance_status" }))?)?;
        if last.id != plan_id {
            bar.finish();
            anyhow::bail!(
                "the daemon serving {} was replaced during the balance (it crashed and was restarted, or was \
                 upgraded): a move it had begun was finished or undone from the journal, each file is whole and in \
                 one place; fix: run farcache balance again for the files not moved yet",
                a.mountpoint.display()
            );
        }
        bar.set(last.bytes_done);
        bar.message(format!("{}/{} files", last.files_done, last.planned.len()));
    }
    bar.finish();
    say(format!(
        "moved {} of {} files in {} ms ({} skipped, {} failed); blocks from cache {} ({} from the write-back tier), \
         from disk {}; races {}, retries {}; yielded to the foreground {} times before the disk for {} ms ({} to \
         the bound), {} before the lenders for {} ms; ms reading from the cache {}, from the disk {}, writing {}, \
         syncing {}, switching {}",
        last.moved,
        last.planned.len(),
        last.elapsed_ms,
        last.skipped,
        last.failed,
        last.blocks_from_cache,
        last.blocks_from_tier,
        last.blocks_from_disk,
        last.races,
        last.retries,
        last.yields,
        last.yield_wait_ms,
        last.yield_bounded,
        last.lender_yields,
        last.lender_yield_wait_ms,
        last.read_cache_ms,
        last.read_disk_ms,
        last.write_ms,
        last.sync_ms,
        last.switch_ms
    ));
    if a.json {
        println!("{}", serde_json::to_string(&last)?);
    }
    if let Some(e) = &last.error {
        anyhow::bail!("not every file moved: {e}");
    }
    Ok(())
}
