//! Automatic balance (`[balance] enabled = true`): a thread of the mount daemon that reads
//! each branch's load every `interval` and, when one branch is much busier than another,
//! runs a bounded round of `farcache balance` — the same plan and the same moves
//! (`balance.rs`), on its own thread, at a stated rate and (by default) at the idle I/O
//! priority.
//!
//! The controller has two states and moves in bounded steps (memcached's `slab_automove`
//! windows, RobinHood's bounded moves):
//! - **idle**: a round starts when the busiest branch was busy at least `min_busy_percent`
//!   of the interval and at least `start_ratio` times the least busy one;
//! - **active**: rounds go on, one per interval, while the busiest is still `min_busy_percent`
//!   busy and more than `stop_ratio` times the least busy; then back to idle. Between the two
//!   ratios nothing starts and nothing stops: the hysteresis that keeps a load that is nearly
//!   even from moving files back and forth.
//!
//! A round moves at most `max_files_per_round` files and `max_bytes_per_round` bytes, copying
//! at most `copy_bytes_per_sec`. A balance asked for meanwhile (`farcache balance`) is refused
//! while a round runs, and a round is not started while one asked for runs (counted).
//! The ratio's denominator is at least [`RATIO_FLOOR_PERMILLE`], so an idle branch does
//! not make every small load look infinitely uneven.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use farcache_config::{ByteSize, ConfigError, HumanDuration};
use serde::{Deserialize, Serialize};

use super::balance::{CopySource, MAX_FILES};
use super::load;
use super::UnionHandle;

/// The `[balance]` table with every default, as it belongs in etc/farcache.toml.
pub const TEMPLATE: &str = r#"[balance]
# Move hot files off a busy branch of a mount of several backing directories without being
# asked (`farcache balance` does it on demand). Off by default. The same moves as
# `farcache balance` (docs/SEMANTICS.md, "Several backing directories"), in bounded rounds.
enabled = false
# A round starts when the busiest branch was busy at least min_busy_percent of the interval
# and at least start_ratio times the least busy branch (busy: the larger of the device's
# io_ticks and the daemon's own I/O time on the branch).
start_ratio = 2.0
# Rounds go on, one per interval, until the busiest is at most stop_ratio times the least
# busy (or below min_busy_percent): between the two ratios nothing starts or stops.
stop_ratio = 1.25
# Below this share of the interval, the busiest branch is not worth relieving.
min_busy_percent = 20
# How often the load is read (the load of one interval decides the next round).
interval = "10s"
# At most this many files, and bytes, per round.
max_files_per_round = 16
max_bytes_per_round = "1GiB"
# The copy's rate, at most (bytes per second; 0 for as fast as the disks go).
copy_bytes_per_sec = "32MiB"
# Copy at the idle I/O priority class (ioprio_set IOPRIO_CLASS_IDLE on the copying thread),
# for every balance, automatic or asked for. Only I/O schedulers with priorities (bfq,
# mq-deadline) act on it; blkio throttling and the "none" scheduler do not.
idle_io_priority = true
# The copy gives way to the applications' I/O, for every balance, automatic or asked for:
# while the mount's reads or writes of files on the branches it copies between are in
# flight, it reads the source disk again only after a wait of up to yield_wait_ratio times
# its last read of it (at most yield_max_wait), and fetches from the lenders again only after
# a wait as long as its last fetch; it copies what the other side gives meanwhile. It never
# stops: under a foreground that never pauses it still holds the source disk
# 1 / (1 + yield_wait_ratio) of the time (9: a tenth) and the lenders' link half of it.
# Works with any I/O scheduler (idle_io_priority needs one with priorities).
yield_to_foreground = true
yield_wait_ratio = 9.0
yield_max_wait = "500ms"
# Where the copies read from: "cache" (every block lenders or a tier hold, the rest from
# the busy disk) or "disk" (all from the disk).
source = "cache"
"#;

/// The smallest denominator of the busy ratio, per mille of the interval.
pub const RATIO_FLOOR_PERMILLE: u32 = 10;
/// Shortest and longest `interval`.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Slowest `copy_bytes_per_sec` (besides 0): one copy chunk (1 MiB) then waits at most 1 s.
pub const MIN_COPY_BYTES_PER_SEC: u64 = 1 << 20;
/// Largest `yield_wait_ratio`: the copy keeps at least 1% of its speed under a foreground
/// that never pauses.
pub const MAX_YIELD_WAIT_RATIO: f64 = 99.0;
/// Shortest and longest `yield_max_wait`.
pub const MIN_YIELD_MAX_WAIT: Duration = Duration::from_millis(1);
pub const MAX_YIELD_MAX_WAIT: Duration = Duration::from_secs(10);
/// Largest ratio that means anything (busy per mille over the floor).
pub const MAX_RATIO: f64 = 1000.0 / RATIO_FLOOR_PERMILLE as f64;

/// `[balance]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BalanceConfig {
    pub enabled: bool,
    pub start_ratio: f64,
    pub stop_ratio: f64,
    pub min_busy_percent: u32,
    pub interval: HumanDuration,
    pub max_files_per_round: u32,
    pub max_bytes_per_round: ByteSize,
    pub copy_bytes_per_sec: ByteSize,
    pub idle_io_priority: bool,
    pub yield_to_foreground: bool,
    pub yield_wait_ratio: f64,
    pub yield_max_wait: HumanDuration,
    pub source: CopySource,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        BalanceConfig {
            enabled: false,
            start_ratio: 2.0,
            stop_ratio: 1.25,
            min_busy_percent: 20,
            interval: HumanDuration::secs(10),
            max_files_per_round: 16,
            max_bytes_per_round: ByteSize::gib(1),
            copy_bytes_per_sec: ByteSize::mib(32),
            idle_io_priority: true,
            yield_to_foreground: true,
            yield_wait_ratio: 9.0,
            yield_max_wait: HumanDuration::ms(500),
            source: CopySource::Cache,
        }
    }
}

impl BalanceConfig {
    /// Refuse values that cannot work, naming the key and the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.start_ratio.is_nan() || self.start_ratio <= 1.0 || self.start_ratio > MAX_RATIO {
            return Err(ConfigError::invalid(
                "balance.start_ratio",
                format!("{} is out of range", self.start_ratio),
                format!("set more than 1.0, at most {MAX_RATIO}"),
            ));
        }
        if self.stop_ratio.is_nan() || self.stop_ratio < 1.0 || self.stop_ratio >= self.start_ratio {
            return Err(ConfigError::invalid(
                "balance.stop_ratio",
                format!("{} is not between 1.0 and start_ratio ({})", self.stop_ratio, self.start_ratio),
                "set at least 1.0 and less than balance.start_ratio (the gap is the hysteresis)",
            ));
        }
        if !(1..=100).contains(&self.min_busy_percent) {
            return Err(ConfigError::invalid(
                "balance.min_busy_percent",
                format!("{} is out of range", self.min_busy_percent),
                "set 1 to 100",
            ));
        }
        let i = self.interval.get();
        if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&i) {
            return Err(ConfigError::invalid("balance.interval", format!("{i:?} is out of range"), "set 100ms to 1h"));
        }
        if self.max_files_per_round == 0 || self.max_files_per_round as usize > MAX_FILES {
            return Err(ConfigError::invalid(
                "balance.max_files_per_round",
                format!("{} is out of range", self.max_files_per_round),
                format!("set 1 to {MAX_FILES}"),
            ));
        }
        if self.max_bytes_per_round.bytes() < 4096 {
            return Err(ConfigError::invalid(
                "balance.max_bytes_per_round",
                "less than one block",
                "set at least 4KiB",
            ));
        }
        let r = self.copy_bytes_per_sec.bytes();
        if r != 0 && r < MIN_COPY_BYTES_PER_SEC {
            return Err(ConfigError::invalid(
                "balance.copy_bytes_per_sec",
                format!("{} is too slow to copy one 1 MiB chunk a second", self.copy_bytes_per_sec),
                "set at least 1MiB, or 0 for no limit",
            ));
        }
        let q = self.yield_wait_ratio;
        if q.is_nan() || q <= 0.0 || q > MAX_YIELD_WAIT_RATIO {
            return Err(ConfigError::invalid(
                "balance.yield_wait_ratio",
                format!("{q} is out of range"),
                format!(
                    "set more than 0 and at most {MAX_YIELD_WAIT_RATIO} (the copy keeps 1 / (1 + ratio) of its speed \
                     under a busy foreground), or yield_to_foreground = false to never wait"
                ),
            ));
        }
        let w = self.yield_max_wait.get();
        if !(MIN_YIELD_MAX_WAIT..=MAX_YIELD_MAX_WAIT).contains(&w) {
            return Err(ConfigError::invalid(
                "balance.yield_max_wait",
                format!("{w:?} is out of range"),
                "set 1ms to 10s, or yield_to_foreground = false to never wait",
            ));
        }
        Ok(())
    }

    /// The yielding a balance's copy does (`yielding.rs`).
    pub(crate) fn yield_policy(&self) -> super::yielding::YieldPolicy {
        super::yielding::YieldPolicy {
            enabled: self.yield_to_foreground,
            wait_ratio: self.yield_wait_ratio,
            max_wait: self.yield_max_wait.get(),
        }
    }
}

/// What the controller decided for one interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// A round from `from` (the busiest) to `to` (the least busy).
    Move { from: usize, to: usize },
    /// Nothing this interval, and why.
    Wait(&'static str),
}

/// The busiest and least busy branches (ties: the lower position is the busier and the
/// later one the least busy) and their ratio, the least busy floored.
fn extremes(busy: &[u32]) -> Option<(usize, usize, f64)> {
    if busy.len() < 2 {
        return None;
    }
    let from = (0..busy.len()).max_by_key(|&b| (busy[b], std::cmp::Reverse(b)))?;
    let to = (0..busy.len()).filter(|&b| b != from).min_by_key(|&b| (busy[b], std::cmp::Reverse(b)))?;
    let ratio = busy[from] as f64 / busy[to].max(RATIO_FLOOR_PERMILLE) as f64;
    Some((from, to, ratio))
}

/// The controller's step: from `active` (rounds under way) and the interval's busy per mille
/// of each branch, whether it stays active and what to do.
pub(crate) fn decide(active: bool, busy: &[u32], c: &BalanceConfig) -> (bool, Decision) {
    let Some((from, to, ratio)) = extremes(busy) else { return (false, Decision::Wait("fewer than two branches")) };
    if busy[from] < c.min_busy_percent * 10 {
        return (false, Decision::Wait("no branch busy enough"));
    }
    if active {
        if ratio > c.stop_ratio {
            (true, Decision::Move { from, to })
        } else {
            (false, Decision::Wait("balanced (stop_ratio reached)"))
        }
    } else if ratio >= c.start_ratio {
        (true, Decision::Move { from, to })
    } else {
        (false, Decision::Wait("balanced enough (below start_ratio)"))
    }
}

/// The automatic balancer's thread; stopped (and joined) when dropped.
pub struct AutoBalancer {
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for AutoBalancer {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            // A round in progress ends after the file in hand (one move, bounded).
            let _ = t.join();
        }
    }
}

impl UnionHandle {
    /// Apply `[balance]`: the I/O priority of every balance's copy, and, if enabled, start
    /// the automatic balancer (its handle stops it when dropped).
    pub fn configure(&self, c: &BalanceConfig) -> Result<Option<AutoBalancer>, String> {
        c.validate().map_err(|e| e.to_string())?;
        self.idle_io.store(c.idle_io_priority, Ordering::Relaxed);
        *self.yielding.lock() = c.yield_policy();
        if !c.enabled {
            return Ok(None);
        }
        let (tx, rx) = mpsc::channel::<()>();
        let h = self.clone();
        let cfg = c.clone();
        let thread = std::thread::Builder::new()
            .name("farcache-auto".into())
            .spawn(move || h.auto_loop(&cfg, &rx))
            .map_err(|e| format!("cannot start the automatic balancer's thread: {e}"))?;
        self.u.counters.auto_enabled.store(1, Ordering::Relaxed);
        tracing::info!(
            "automatic balance: every {:?}, start at {}×, stop at {}× (busiest at least {}% busy), \
             {} files / {} per round at {} per second, from {:?}, yielding to the foreground: {}",
            c.interval.get(),
            c.start_ratio,
            c.stop_ratio,
            c.min_busy_percent,
            c.max_files_per_round,
            c.max_bytes_per_round,
            c.copy_bytes_per_sec,
            c.source,
            c.yield_to_foreground
        );
        Ok(Some(AutoBalancer { cancel: self.cancel.clone(), stop: Some(tx), thread: Some(thread) }))
    }

    fn auto_loop(&self, c: &BalanceConfig, stop: &mpsc::Receiver<()>) {
        let u = &*self.u;
        if c.idle_io_priority {
            // The whole thread: its copies are its only I/O.
            if let Err(e) = crate::sys::set_idle_io_priority() {
                tracing::warn!(
                    "automatic balance: the idle I/O priority could not be set ({e}); copying at the default"
                );
            }
        }
        let mut active = false;
        let mut before = load::ticks_now(&u.branches, &u.busy_ns);
        let mut t = Instant::now();
        loop {
            match stop.recv_timeout(c.interval.get()) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let now = load::ticks_now(&u.branches, &u.busy_ns);
            let busy = load::busy_between(&before, &now, t.elapsed());
            u.counters.auto_checks.fetch_add(1, Ordering::Relaxed);
            *u.auto_busy.lock() = busy.clone();
            let (next, d) = decide(active, &busy, c);
            if next != active {
                tracing::info!("automatic balance {} (busy per mille {busy:?})", if next { "starts" } else { "stops" });
            }
            active = next;
            u.counters.auto_active.store(active as u64, Ordering::Relaxed);
            if let Decision::Move { from, to } = d {
                match self.auto_round(from, to, busy, c) {
                    Ok(0) => {
                        tracing::debug!("automatic balance: nothing recently read to move off branch {from}")
                    }
                    Ok(n) => tracing::info!("automatic balance: round moved {n} files from branch {from} to {to}"),
                    Err(e) => tracing::info!("automatic balance: no round: {e}"),
                }
            }
            // The next interval's load starts after the round: the copy's own I/O is not
            // taken for the applications'.
            before = load::ticks_now(&u.branches, &u.busy_ns);
            t = Instant::now();
        }
    }

    /// One bounded round from `from` to `to`, on this thread: the files moved.
    fn auto_round(&self, from: usize, to: usize, busy: Vec<u32>, c: &BalanceConfig) -> Result<u64, String> {
        let limits = super::balance::Limits {
            files: c.max_files_per_round as usize,
            bytes: c.max_bytes_per_round.bytes(),
            bytes_per_sec: c.copy_bytes_per_sec.bytes(),
        };
        let (st, from, to) = self.plan(false, c.source, limits, Some(from), Some(to), busy, true)?;
        if st.planned.is_empty() {
            return Ok(0);
        }
        if !self.claim(&st) {
            self.u.counters.auto_skips.fetch_add(1, Ordering::Relaxed);
            return Err("a balance asked for is running".into());
        }
        self.u.counters.auto_rounds.fetch_add(1, Ordering::Relaxed);
        let done = self.run(from, to, c.source, limits);
        self.u.counters.auto_moves.fetch_add(done.moved, Ordering::Relaxed);
        Ok(done.moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        balance: BalanceConfig,
    }

    #[test]
    fn template_is_the_defaults_and_mentions_every_key() {
        let keys = farcache_config::check_template::<BalanceConfig>("balance", TEMPLATE).unwrap();
        assert!(keys.contains(&"copy_bytes_per_sec".to_string()));
        BalanceConfig::default().validate().unwrap();
    }

    #[test]
    fn bad_values_are_refused_by_name_with_the_fix() {
        let bad = |f: &dyn Fn(&mut BalanceConfig), key: &str, fix: &str| {
            let mut c = BalanceConfig::default();
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.starts_with(&format!("{key}:")) && e.contains(fix), "{e}");
        };
        bad(&|c| c.start_ratio = 1.0, "balance.start_ratio", "more than 1.0");
        bad(&|c| c.start_ratio = f64::NAN, "balance.start_ratio", "more than 1.0");
        bad(&|c| c.stop_ratio = 2.0, "balance.stop_ratio", "less than balance.start_ratio");
        bad(&|c| c.stop_ratio = 0.5, "balance.stop_ratio", "at least 1.0");
        bad(&|c| c.min_busy_percent = 0, "balance.min_busy_percent", "1 to 100");
        bad(&|c| c.min_busy_percent = 101, "balance.min_busy_percent", "1 to 100");
        bad(&|c| c.interval = HumanDuration::ms(10), "balance.interval", "100ms to 1h");
        bad(&|c| c.max_files_per_round = 0, "balance.max_files_per_round", "set 1 to");
        bad(&|c| c.max_bytes_per_round = ByteSize(100), "balance.max_bytes_per_round", "4KiB");
        bad(&|c| c.copy_bytes_per_sec = ByteSize::kib(64), "balance.copy_bytes_per_sec", "0 for no limit");
        let never = "yield_to_foreground = false to never wait";
        bad(&|c| c.yield_wait_ratio = 0.0, "balance.yield_wait_ratio", never);
        bad(&|c| c.yield_wait_ratio = -1.0, "balance.yield_wait_ratio", "more than 0 and at most 99");
        bad(&|c| c.yield_wait_ratio = f64::NAN, "balance.yield_wait_ratio", never);
        bad(&|c| c.yield_wait_ratio = 100.0, "balance.yield_wait_ratio", "at most 99");
        bad(&|c| c.yield_max_wait = HumanDuration::ms(0), "balance.yield_max_wait", "1ms to 10s");
        bad(&|c| c.yield_max_wait = HumanDuration::secs(11), "balance.yield_max_wait", never);
        let f: File =
            toml::from_str("[balance]\nyield_to_foreground = false\nyield_wait_ratio = 0.5\nyield_max_wait = \"20ms\"")
                .unwrap();
        f.balance.validate().unwrap();
        let p = f.balance.yield_policy();
        assert_eq!((p.enabled, p.wait_ratio, p.max_wait), (false, 0.5, Duration::from_millis(20)));
        let e = toml::from_str::<File>("[balance]\nyield_to_foreground = \"yes\"").err().unwrap().to_string();
        assert!(e.contains("yield_to_foreground"), "{e}");
        let ok = BalanceConfig { copy_bytes_per_sec: ByteSize(0), ..BalanceConfig::default() };
        ok.validate().unwrap();
        let f: File = toml::from_str("[balance]\nenabled = true\nsource = \"disk\"\ninterval = \"500ms\"").unwrap();
        assert!(f.balance.enabled);
        assert_eq!(f.balance.source, CopySource::Disk);
        assert_eq!(f.balance.interval.get(), Duration::from_millis(500));
        assert!(toml::from_str::<File>("[balance]\nsource = \"ram\"").is_err());
        let e = toml::from_str::<File>("[balance]\nstart_ration = 3.0").err().unwrap().to_string();
        assert!(e.contains("start_ration"), "{e}");
    }

    #[test]
    fn the_controller_starts_above_start_ratio_and_stops_at_stop_ratio() {
        let c = BalanceConfig::default(); // start 2.0, stop 1.25, 20%
                                          // Idle: not busy enough, whatever the ratio.
        assert_eq!(decide(false, &[150, 0], &c), (false, Decision::Wait("no branch busy enough")));
        // Uneven enough: start, from the busiest to the least busy.
        assert_eq!(decide(false, &[200, 900], &c), (true, Decision::Move { from: 1, to: 0 }));
        assert_eq!(decide(false, &[900, 0, 300], &c), (true, Decision::Move { from: 0, to: 1 }));
        // Between the ratios: idle stays idle...
        assert_eq!(decide(false, &[600, 400], &c), (false, Decision::Wait("balanced enough (below start_ratio)")));
        // ...and active stays active.
        assert_eq!(decide(true, &[600, 400], &c), (true, Decision::Move { from: 0, to: 1 }));
        // At stop_ratio or below: stop.
        assert_eq!(decide(true, &[500, 400], &c), (false, Decision::Wait("balanced (stop_ratio reached)")));
        assert_eq!(decide(true, &[1000, 1000], &c), (false, Decision::Wait("balanced (stop_ratio reached)")));
        // An idle least busy branch counts as RATIO_FLOOR_PERMILLE: a bounded ratio.
        assert_eq!(extremes(&[1000, 0]).unwrap().2, MAX_RATIO);
        assert!(!decide(true, &[1000], &c).0);
        // Load that falls away stops an active controller.
        assert_eq!(decide(true, &[100, 0], &c), (false, Decision::Wait("no branch busy enough")));
    }
}
