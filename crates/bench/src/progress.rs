//! Progress on long work (`bench paper`, `check`, `warmup`, later `flush`, `balance`, tier
//! recovery): a bar (indicatif) when stderr is a terminal, and a plain line at most every
//! [`Progress::every`] otherwise — logs, CI and journals get a line they can read, not a
//! stream of carriage returns. `FARCACHE_PROGRESS=bar|plain|none` overrides the choice.
//!
//! One long job per process: while a bar is up, lines that other code prints go through
//! [`say`], which writes them above the bar instead of through it.

use std::fmt::Display;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Default time between two plain lines.
pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// What is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    /// Whole things, named in the plural ("runs", "blocks").
    Items(&'static str),
}

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Bar,
    Plain,
    None,
}

impl Mode {
    /// `FARCACHE_PROGRESS` if set to bar, plain or none; else a bar on a terminal, plain lines
    /// otherwise.
    pub fn detect() -> Mode {
        match std::env::var("FARCACHE_PROGRESS").as_deref() {
            Ok("bar") => Mode::Bar,
            Ok("plain") => Mode::Plain,
            Ok("none") => Mode::None,
            _ if std::io::stderr().is_terminal() => Mode::Bar,
            _ => Mode::Plain,
        }
    }
}

/// The bar now on screen, for [`say`].
static ACTIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Print `line` on stderr, above the progress bar if one is up.
pub fn say(line: impl Display) {
    let active = ACTIVE.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match active {
        Some(bar) => bar.println(line.to_string()),
        None => eprintln!("{line}"),
    }
}

/// Progress of one job of `total` units.
pub struct Progress {
    what: String,
    total: u64,
    unit: Unit,
    mode: Mode,
    every: Duration,
    bar: Option<ProgressBar>,
    started: Instant,
    state: Mutex<State>,
}

struct State {
    done: u64,
    /// When the last plain line was printed.
    last: Instant,
    message: String,
}

impl Progress {
    /// Progress of `what` (e.g. "warmup") over `total` units, shown as [`Mode::detect`] says.
    pub fn new(what: &str, total: u64, unit: Unit) -> Progress {
        Progress::with_mode(what, total, unit, Mode::detect())
    }

    pub fn with_mode(what: &str, total: u64, unit: Unit, mode: Mode) -> Progress {
        let bar = (mode == Mode::Bar).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let count = match unit {
                Unit::Bytes => "{bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})".to_string(),
                Unit::Items(name) => format!("{{pos}}/{{len}} {name} (eta {{eta}})"),
            };
            let style =
                ProgressStyle::with_template(&format!("{what}: [{{elapsed_precise}}] {{wide_bar}} {count} {{msg}}"))
                    .expect("a valid template")
                    .progress_chars("=> ");
            bar.set_style(style);
            *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar.clone());
            bar
        });
        let now = Instant::now();
        Progress {
            what: what.to_string(),
            total,
            unit,
            mode,
            every: PLAIN_EVERY,
            bar,
            started: now,
            state: Mutex::new(State { done: 0, last: now, message: String::new() }),
        }
    }

    /// Print plain lines at most this often (default [`PLAIN_EVERY`]).
    pub fn every(mut self, every: Duration) -> Progress {
        self.every = every;
        self
    }

    /// `n` more units done.
    pub fn inc(&self, n: u64) {
        let done = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.done += n;
            st.done
        };
        self.update(done);
    }

    /// `done` units done in all (for work measured by what is left, e.g. dirty bytes).
    pub fn set(&self, done: u64) {
        let done = done.min(self.total);
        self.state.lock().unwrap_or_else(|p| p.into_inner()).done = done;
        self.update(done);
    }

    /// What is being done now (a file name, a run's label).
    pub fn message(&self, message: impl Into<String>) {
        let message = message.into();
        if let Some(bar) = &self.bar {
            bar.set_message(message.clone());
        }
        self.state.lock().unwrap_or_else(|p| p.into_inner()).message = message;
    }

    fn update(&self, done: u64) {
        match self.mode {
            Mode::Bar => {
                if let Some(bar) = &self.bar {
                    bar.set_position(done);
                }
            }
            Mode::Plain => {
                let line = {
                    let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                    if st.last.elapsed() < self.every {
                        return;
                    }
                    st.last = Instant::now();
                    plain_line(&self.what, done, self.total, self.unit, self.started.elapsed(), &st.message)
                };
                eprintln!("{line}");
            }
            Mode::None => {}
        }
    }

    /// Done (or given up): take the bar down; in plain mode, one last line.
    pub fn finish(&self) {
        let (done, message) = {
            let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (st.done, st.message.clone())
        };
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
            *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        if self.mode == Mode::Plain {
            eprintln!("{}", plain_line(&self.what, done, self.total, self.unit, self.started.elapsed(), &message));
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
            *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

/// "warmup: 1.5 GiB of 4.0 GiB (37%), 64.0 MiB/s, 24 s, eta 40 s: db/base/16384/2619".
pub fn plain_line(what: &str, done: u64, total: u64, unit: Unit, elapsed: Duration, message: &str) -> String {
    let secs = elapsed.as_secs_f64();
    let pct = if total == 0 { 100.0 } else { done as f64 * 100.0 / total as f64 };
    let rate = done as f64 / secs.max(1e-3);
    let eta =
        if done == 0 || done >= total { String::new() } else { format!(", eta {:.0} s", (total - done) as f64 / rate) };
    let (amount, speed) = match unit {
        Unit::Bytes => {
            (format!("{} of {}", human_bytes(done), human_bytes(total)), format!("{}/s", human_bytes(rate as u64)))
        }
        Unit::Items(name) => (format!("{done} of {total} {name}"), format!("{rate:.1} {name}/s")),
    };
    let tail = if message.is_empty() { String::new() } else { format!(": {message}") };
    format!("{what}: {amount} ({pct:.0}%), {speed}, {secs:.0} s{eta}{tail}")
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_say_how_far_how_fast_and_how_long() {
        let l = plain_line("warmup", 1 << 30, 4 << 30, Unit::Bytes, Duration::from_secs(16), "db/f");
        assert_eq!(l, "warmup: 1.0 GiB of 4.0 GiB (25%), 64.0 MiB/s, 16 s, eta 48 s: db/f");
        let l = plain_line("paper", 3, 12, Unit::Items("runs"), Duration::from_secs(600), "");
        assert_eq!(l, "paper: 3 of 12 runs (25%), 0.0 runs/s, 600 s, eta 1800 s");
        let l = plain_line("check", 0, 0, Unit::Items("blocks"), Duration::ZERO, "");
        assert_eq!(l, "check: 0 of 0 blocks (100%), 0.0 blocks/s, 0 s");
        assert_eq!(human_bytes(512), "512 B");
    }

    #[test]
    fn plain_mode_is_rate_limited_and_bar_mode_routes_lines_above_the_bar() {
        let p = Progress::with_mode("t", 100, Unit::Items("things"), Mode::Plain).every(Duration::from_secs(3600));
        for _ in 0..100 {
            p.inc(1);
        }
        assert_eq!(p.state.lock().unwrap().done, 100);
        p.finish();
        let b = Progress::with_mode("t", 10, Unit::Bytes, Mode::Bar);
        assert!(ACTIVE.lock().unwrap().is_some());
        say("a line above the bar");
        b.inc(5);
        assert_eq!(b.bar.as_ref().unwrap().position(), 5);
        b.finish();
        assert!(ACTIVE.lock().unwrap().is_none());
    }
}
