//! Configuration primitives shared by farcache's crates: sizes and durations in human units,
//! and loading a TOML file so that every error names the key and the fix.
//!
//! Depends on no other farcache crate.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

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

/// A configuration problem, phrased for the operator: which key, what is wrong, how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("{key}: {problem}; {fix}")]
    Invalid { key: &'static str, problem: String, fix: String },
}

impl ConfigError {
    pub fn invalid(key: &'static str, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        ConfigError::Invalid { key, problem: problem.into(), fix: fix.into() }
    }
}

/// Parse TOML text into `T`. Callers' structs use `#[serde(deny_unknown_fields)]`, so a
/// misspelt key is an error that names it rather than a silently ignored setting.
pub fn parse_toml<T: serde::de::DeserializeOwned>(path: &str, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse { path: path.to_string(), message: e.to_string() })
}

/// Read and parse a TOML file.
pub fn load_toml<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: shown.clone(), source })?;
    parse_toml(&shown, &text)
}

/// A 256-bit key from a key file's text (`farcache keygen`): 64 hexadecimal digits (either
/// case) on one line, surrounding white space and empty lines ignored. The error says what is
/// wrong, as the end of a sentence starting with the file's name.
pub fn parse_hex_key32(text: &str) -> Result<[u8; 32], String> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let Some(line) = lines.next() else {
        return Err("it is empty".into());
    };
    if lines.next().is_some() {
        return Err("it has more than one line".into());
    }
    if line.len() != 64 {
        return Err(format!("its key is {} characters long, not 64 hex digits (32 bytes)", line.len()));
    }
    let mut out = [0u8; 32];
    for (i, pair) in line.as_bytes().chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        match (digit(pair[0]), digit(pair[1])) {
            (Some(h), Some(l)) => out[i] = (h * 16 + l) as u8,
            _ => return Err("its key has a character that is not a hex digit".into()),
        }
    }
    Ok(out)
}

/// The text of `path`, a regular file that only its owner can read or write, holding
/// `what`; errors name `key`, the file and the fix (`create` when it does not exist).
pub fn read_private_file(
    key: &'static str,
    path: &std::path::Path,
    what: &str,
    create: &str,
) -> Result<String, ConfigError> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ConfigError::invalid(key, format!("{shown} does not exist"), create),
        _ => ConfigError::invalid(key, format!("cannot stat {shown}: {e}"), "point it at a readable file"),
    })?;
    if !meta.is_file() {
        return Err(ConfigError::invalid(
            key,
            format!("{shown} is not a regular file"),
            format!("point it at a file holding {what}"),
        ));
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::invalid(
            key,
            format!("{shown} is open to group or others (mode {mode:03o}): {what} would leak"),
            format!("run `chmod 600 {shown}`"),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| {
        ConfigError::invalid(key, format!("cannot read {shown}: {e}"), "make it readable by the mount's user")
    })
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

    #[test]
    fn hex_files_parse_and_bad_ones_say_why() {
        let line = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF\n";
        assert_eq!(parse_hex_key32(line).unwrap()[..3], [0x00, 0x11, 0x22]);
        assert_eq!(parse_hex_key32(line).unwrap()[31], 0xff);
        for (text, why) in [
            ("", "empty"),
            (&line[..63], "characters long"),
            (&format!("{line}{line}"), "more than one line"),
            (&format!("{}g", &line[..63]), "not a hex digit"),
        ] {
            let e = parse_hex_key32(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
