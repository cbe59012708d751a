//! `farcache`: the one user-facing binary. Thin: parse arguments, load configuration, call
//! into the crates. The only place `anyhow` is used.

mod cmd;
mod config;
mod control;
mod metrics;
mod notify;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: the data path allocates and frees block-sized and
/// request-sized buffers at a high rate from many threads, and glibc gave their pages back to
/// the kernel and faulted them in again on every request (a third of the daemon's CPU in a
/// write profile through the write-back tier; BENCHMARKS.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_arena_eager_commit` (the same index in mimalloc v2 and v3 headers).
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Commit the allocator's arenas page by page as they are used, not whole: eager commit held
/// about 100 MiB more resident in the mount daemon for the same throughput (BENCHMARKS.md,
/// "The allocator") — memory a client's cgroup pays for. mimalloc makes its first arena at its
/// own start-up (a constructor of priority 101), before `main`: this runs ahead of it, from
/// `.init_array` with priority 100.
extern "C" fn tune_allocator() {
    // SAFETY: sets a documented mimalloc option; touches no memory.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
}

#[used]
#[link_section = ".init_array.00100"]
static TUNE_ALLOCATOR: extern "C" fn() = tune_allocator;

#[derive(Parser)]
#[command(name = "farcache", version, about = "Lend spare RAM across machines as a storage cache")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Lend memory: serve a block cache over TCP until SIGINT/SIGTERM.
    Server(cmd::server::Args),
    /// Show the counters of a running mount (MOUNTPOINT) or of a lender (--server).
    Stats(cmd::stats::Args),
    /// List, add or remove the lenders of a running mount.
    Lenders(cmd::lenders::Args),
    /// Check a server end to end: write blocks, read them back twice, verify every byte.
    Check(cmd::check::Args),
    /// Read a file at random 4 KiB offsets, the same sequence each pass, timed per pass.
    Randread(cmd::randread::Args),
    /// Show a backing directory through FUSE (passthrough) until SIGINT/SIGTERM or unmount.
    Mount(cmd::mount::Args),
    /// Move recently read files off the busiest backing directory of a mount of several
    /// (on demand; `[balance] enabled = true` has the mount do it by itself).
    Balance(cmd::balance::Args),
    /// Destage everything a mount's write-back tier holds, and wait.
    Flush(cmd::tier::FlushArgs),
    /// Inspect or recover a write-back tier offline.
    Tier(cmd::tier::Args),
    /// Fill the lenders with files' blocks at a bounded rate, so a new or restarted host starts warm.
    Warmup(cmd::warmup::Args),
    /// Print the configuration template with every default.
    Config(cmd::config::Args),
    /// Write a fresh 256-bit key (a block key for `mount --key-file`, or a TLS pre-shared key) to a new file, mode 600.
    Keygen(cmd::keygen::Args),
    /// Generate a small deployment's TLS files: a CA, server and client certificates and keys.
    Certs(cmd::certs::Args),
    /// Run a benchmark: the server against memcached, or LRU against S3-FIFO.
    Bench(cmd::bench::Args),
}

fn main() {
    let cli = Cli::parse();
    init_logging();
    let res = match cli.command {
        Command::Server(a) => cmd::server::run(a),
        Command::Stats(a) => cmd::stats::run(a),
        Command::Lenders(a) => cmd::lenders::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Mount(a) => cmd::mount::run(a),
        Command::Randread(a) => cmd::randread::run(a),
        Command::Warmup(a) => cmd::warmup::run(a),
        Command::Balance(a) => cmd::balance::run(a),
        Command::Flush(a) => cmd::tier::flush(a),
        Command::Tier(a) => cmd::tier::run(a),
        Command::Config(a) => cmd::config::run(a),
        Command::Keygen(a) => cmd::keygen::run(a),
        Command::Certs(a) => cmd::certs::run(a),
        Command::Bench(a) => cmd::bench::run(a),
    };
    if let Err(e) = res {
        eprintln!("farcache: error: {e:#}");
        std::process::exit(1);
    }
}

/// The default log filter. fuser 0.18 answers every FUSE_INTERRUPT with ENOSYS; when the
/// interrupted request was already answered, the kernel refuses that reply (ENOENT) and
/// fuser logs it as an error: under PostgreSQL, several per second of noise that means
/// nothing (the request was answered). Its reply errors are off unless asked for.
const DEFAULT_LOG: &str = "info,fuser::reply=off";

/// Logs go to stderr; `FARCACHE_LOG` (or `RUST_LOG`) sets the filter, default [`DEFAULT_LOG`].
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("FARCACHE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| DEFAULT_LOG.to_string());
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG)))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
