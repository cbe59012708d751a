//! Configuration primitives shared by farcache's crates: sizes and durations in human units,
//! loading a TOML file so that every error names the key and the fix, and reading the small
//! files settings point at (keys, secrets: `files.rs`) the same way.
//!
//! Depends on no other farcache crate.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod files;
pub use files::{parse_hex_key32, read_key32_file, read_private_file, read_text_file, KEY32_FORMAT};

/// A size in bytes, written in human units: `4096`, `4KiB`, `512MiB`, `1.5GiB`, `2GB`.
/// Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (KB, MB, GB, TB)
/// powers of 1000; a bare number or `B` is bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn bytes(self) -> u64 {
        self.0
    }
    pub const fn kib(n: u64) -> Self {
        ByteSize(n << 10)
    }
    pub const fn mib(n: u64) -> Self {
        ByteSize(n << 20)
    }
    pub const fn gib(n: u64) -> Self {
        ByteSize(n << 30)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {why} (examples: {examples})")]
pub struct UnitError {
    what: &'static str,
    input: String,
    why: &'static str,
    examples: &'static str,
}

/// Split "12.5MiB" into (12.5, "MiB"), accepting spaces between them.
fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') {
        return None;
    }
    Some((num.parse().ok()?, unit.trim()))
}

impl FromStr for ByteSize {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        let err = |why| UnitError { what: "size", input: s.to_string(), why, examples: "4096, 64KiB, 512MiB, 4GiB" };
        let (n, unit) = split_number(s).ok_or_else(|| err("expected a number followed by a unit"))?;
        let mult: u64 = match unit {
            "" | "B" => 1,
            "KiB" | "K" | "k" => 1 << 10,
            "MiB" | "M" => 1 << 20,
            "GiB" | "G" => 1 << 30,
            "TiB" | "T" => 1 << 40,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            _ => return Err(err("unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")),
        };
        let bytes = n * mult as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(err("too large"));
        }
        if bytes.fract() != 0.0 {
            return Err(err("not a whole number of bytes"));
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    /// The largest binary unit that shows the value exactly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
        for (name, shift) in UNITS {
            if self.0 >= 1 << shift && self.0.is_multiple_of(1 << shift) {
                return write!(f, "{}{}", self.0 >> shift, name);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl ByteSize {
    /// For people, not for parsing: three significant figures in the largest binary unit
    /// that fits ("1.50 GiB", "640 KiB", "17 B").
    pub fn approx(self) -> String {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u < UNITS.len() - 1 {
            v /= 1024.0;
            u += 1;
        }
        match (u, v) {
            (0, _) => format!("{} B", self.0),
            (_, v) if v >= 100.0 => format!("{v:.0} {}", UNITS[u]),
            (_, v) if v >= 10.0 => format!("{v:.1} {}", UNITS[u]),
            _ => format!("{v:.2} {}", UNITS[u]),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// A duration written in human units: `250ms`, `5s`, `10min`, `1h`, `1.5s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const fn ms(n: u64) -> Self {
        HumanDuration(Duration::from_millis(n))
    }
    pub const fn secs(n: u64) -> Self {
        HumanDuration(Duration::from_secs(n))
    }
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl FromStr for HumanDuration {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        let err = |why| UnitError { what: "duration", input: s.to_string(), why, examples: "500ms, 5s, 10min, 1h" };
        let (n, unit) = split_number(s).ok_or_else(|| err("expected a number followed by a unit"))?;
        let secs = match unit {
            "us" | "µs" => n / 1e6,
            "ms" => n / 1e3,
            "s" => n,
            "min" | "m" => n * 60.0,
            "h" => n * 3600.0,
            "" => return Err(err("a duration needs a unit")),
            _ => return Err(err("unknown unit (use us, ms, s, min or h)")),
        };
        Duration::try_from_secs_f64(secs).map(HumanDuration).map_err(|_| err("out of range"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        let ms = d.as_millis();
        if !d.subsec_nanos().is_multiple_of(1_000_000) {
            write!(f, "{}us", d.as_micros())
        } else if !ms.is_multiple_of(1000) {
            write!(f, "{ms}ms")
        } else if ms.is_multiple_of(3_600_000) && ms > 0 {
            write!(f, "{}h", ms / 3_600_000)
        } else if ms.is_multiple_of(60_000) && ms > 0 {
            write!(f, "{}min", ms / 60_000)
        } else {
            write!(f, "{}s", ms / 1000)
        }
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A configuration problem, phrased for the operator: which key (or flag) and file, what is
/// wrong, how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A configuration file that cannot be read; `origin` is how it was named (`--config`).
    #[error("{origin} {path}: {problem}; {fix}")]
    Read { origin: String, path: String, problem: String, fix: String },
    /// A configuration file that is not TOML, or whose TOML does not fit.
    #[error("{origin} {path} is not a valid farcache configuration: {message}; {fix}")]
    Parse { origin: String, path: String, message: String, fix: String },
    #[error("{key}: {problem}; {fix}")]
    Invalid { key: &'static str, problem: String, fix: String },
}

impl ConfigError {
    pub fn invalid(key: &'static str, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        ConfigError::Invalid { key, problem: problem.into(), fix: fix.into() }
    }
}

/// A `metrics_listen` setting: "" for none, else an `IP:PORT` to serve Prometheus metrics
/// on. `key` names the setting (or flag) in the error, which gives the fix.
pub fn metrics_listen(key: &'static str, value: &str) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    if value.is_empty() {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|_| {
        ConfigError::invalid(
            key,
            format!("{value:?} is not an IP:PORT address"),
            "set an address such as \"127.0.0.1:7412\" or \"[::]:7412\" (an IP, not a host name), or \"\" for no \
             metrics endpoint",
        )
    })
}

/// The fix for a configuration file that is not TOML or does not fit.
const TOML_FIX: &str = "it must be TOML with a table per role ([server], [mount], [cache], [tier]): \
                        `farcache config` prints the template with every key and its default";

fn parse_error(origin: &str, path: &str, e: toml::de::Error) -> ConfigError {
    ConfigError::Parse {
        origin: origin.to_string(),
        path: path.to_string(),
        message: e.to_string().trim_end().to_string(),
        fix: TOML_FIX.to_string(),
    }
}

/// Parse TOML text into `T`. Callers' structs use `#[serde(deny_unknown_fields)]`, so a
/// misspelt key is an error that names it rather than a silently ignored setting.
pub fn parse_toml<T: serde::de::DeserializeOwned>(path: &str, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| parse_error("config file", path, e))
}

/// Read and parse a TOML configuration file that `origin` (the flag, e.g. `--config`) names.
/// Errors name the flag and the file, and tell a missing file, one that cannot be read, one
/// of binary data and one that is not TOML (or not farcache's) apart, each with its fix.
pub fn load_toml<T: serde::de::DeserializeOwned>(origin: &str, path: &std::path::Path) -> Result<T, ConfigError> {
    let shown = path.display().to_string();
    let read = |problem: String, fix: String| ConfigError::Read {
        origin: origin.to_string(),
        path: shown.clone(),
        problem,
        fix,
    };
    let template = format!("`farcache config > {shown}` writes the template with every default");
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            read("no such file".into(), format!("check the path, or create the file: {template}"))
        }
        std::io::ErrorKind::IsADirectory => {
            read("is a directory, not a TOML file".into(), format!("point {origin} at the file; {template}"))
        }
        std::io::ErrorKind::PermissionDenied => {
            read("cannot read it: permission denied".into(), "make it readable by the user running farcache".into())
        }
        _ => read(format!("cannot read it: {e}"), "make it readable by the user running farcache".into()),
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        read(
            format!(
                "holds binary data ({} bytes that are not UTF-8 text), not a TOML configuration",
                e.as_bytes().len()
            ),
            format!("point {origin} at a TOML file; {template}"),
        )
    })?;
    toml::from_str(&text).map_err(|e| parse_error(origin, &shown, e))
}

/// The check every table's template gets in its tests: `template` (the `[table]` text with
/// every default written out) parses, with no unknown key, into exactly `T::default()`;
/// every key `T` serializes is written out in it (`key = ...` at the start of a line); and
/// every key has a comment above it (or shares one with the key before it). Returns the
/// keys, for tests that also pin their number.
pub fn check_template<T>(table: &str, template: &str) -> Result<Vec<String>, String>
where
    T: serde::de::DeserializeOwned + serde::Serialize + Default + PartialEq + std::fmt::Debug,
{
    let doc: toml::Table = toml::from_str(template).map_err(|e| format!("[{table}] template: {e}"))?;
    if doc.len() != 1 {
        return Err(format!("the template holds {} tables; expected [{table}] alone", doc.len()));
    }
    let value = doc.get(table).cloned().ok_or_else(|| format!("the template has no [{table}]"))?;
    let parsed: T = value.try_into().map_err(|e| format!("[{table}] template: {e}"))?;
    if parsed != T::default() {
        return Err(format!("[{table}] template is not the defaults:\n{parsed:?}\n!=\n{:?}", T::default()));
    }
    let defaults = toml::Value::try_from(T::default()).map_err(|e| e.to_string())?;
    let keys: Vec<String> = defaults.as_table().map(|t| t.keys().cloned().collect()).unwrap_or_default();
    for key in &keys {
        if !template.lines().any(|l| l.starts_with(&format!("{key} ="))) {
            return Err(format!("the template lacks {table}.{key}"));
        }
    }
    let lines: Vec<&str> = template.lines().collect();
    for (i, l) in lines.iter().enumerate().skip(1) {
        if l.contains(" = ") && !(lines[i - 1].starts_with('#') || lines[i - 1].contains(" = ")) {
            return Err(format!("no comment above {l:?} in [{table}]"));
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!("4096".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("512MiB".parse::<ByteSize>().unwrap(), ByteSize::mib(512));
        assert_eq!("4 GiB".parse::<ByteSize>().unwrap(), ByteSize::gib(4));
        assert_eq!("1.5GiB".parse::<ByteSize>().unwrap(), ByteSize(3 << 29));
        assert_eq!("2GB".parse::<ByteSize>().unwrap(), ByteSize(2_000_000_000));
        assert_eq!("4k".parse::<ByteSize>().unwrap(), ByteSize(4096));
        for bad in ["", "MiB", "-1GiB", "1.5B", "12 parsecs", "1e9", ".5GiB", "99999999999TiB"] {
            let e = bad.parse::<ByteSize>().unwrap_err().to_string();
            assert!(e.contains("invalid size"), "{bad}: {e}");
        }
        for n in [ByteSize(1), ByteSize(4096), ByteSize::mib(512), ByteSize::gib(3), ByteSize(4097)] {
            assert_eq!(n.to_string().parse::<ByteSize>().unwrap(), n);
        }
        assert_eq!(ByteSize::mib(512).to_string(), "512MiB");
        assert_eq!(ByteSize(3 << 29).approx(), "1.50 GiB");
        assert_eq!(ByteSize(17).approx(), "17 B");
        assert_eq!(ByteSize::kib(640).approx(), "640 KiB");
    }

    #[test]
    fn durations() {
        assert_eq!("5s".parse::<HumanDuration>().unwrap(), HumanDuration::secs(5));
        assert_eq!("250ms".parse::<HumanDuration>().unwrap(), HumanDuration::ms(250));
        assert_eq!("10min".parse::<HumanDuration>().unwrap(), HumanDuration::secs(600));
        assert_eq!("1.5s".parse::<HumanDuration>().unwrap(), HumanDuration::ms(1500));
        assert_eq!("200us".parse::<HumanDuration>().unwrap(), HumanDuration(Duration::from_micros(200)));
        for bad in ["5", "s", "5 fortnights", "-1s"] {
            assert!(bad.parse::<HumanDuration>().is_err(), "{bad}");
        }
        for d in [HumanDuration::ms(250), HumanDuration::secs(5), HumanDuration::secs(600), HumanDuration::secs(7200)] {
            assert_eq!(d.to_string().parse::<HumanDuration>().unwrap(), d);
        }
    }

    #[test]
    fn toml_errors_name_the_key() {
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct C {
            capacity: ByteSize,
        }
        let e = parse_toml::<C>("x.toml", "capacity = \"12 parsecs\"").unwrap_err().to_string();
        assert!(e.contains("capacity") && e.contains("unknown unit"), "{e}");
        let e = parse_toml::<C>("x.toml", "capacity = 1\ncapacty = 2").unwrap_err().to_string();
        assert!(e.contains("capacty"), "{e}");
    }
}
