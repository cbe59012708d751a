//! The control channel of a running `farcache mount`: a unix socket on which the daemon
//! answers one JSON request line with one JSON response line.
//!
//! ```text
//! {"cmd":"stats"}                                  {"ok":true,"stats":{...}}
//! {"cmd":"lenders"}                                {"ok":true,"lenders":[...]}
//! {"cmd":"add_lender","addr":"10.0.0.2:7411"}      {"ok":true,"lenders":[...]}
//! {"cmd":"remove_lender","addr":"10.0.0.2:7411"}   {"ok":true,"lenders":[...]}
//! {"cmd":"ping"}                                   {"ok":true,"version":"...","pid":1234}
//! {"cmd":"takeover",...}                           an exchange of its own (takeover.rs)
//! {"cmd":"flush","wait_ms":2000}                   {"ok":true,"done":false,"dirty_bytes":N,"through":S}
//! {"cmd":"flush","wait_ms":2000,"through":S}        (asked again: the same records)
//! {"cmd":"balance","options":{...}}                {"ok":true,"balance":{plan...}}
//! {"cmd":"balance_status"}                         {"ok":true,"balance":{progress...}}
//! anything else                                    {"ok":false,"error":"..."}
//! ```
//!
//! - `path.rs`: where the socket lives (derived from the mount point, so users name only that).
//! - `server.rs`: the daemon side — a listener thread, at most [`MAX_CONNECTIONS`] connections,
//!   every read and write bounded in size and time; nothing here ever blocks a FUSE thread.
//! - `client.rs`: the command side (`farcache stats MNT`, `farcache lenders MNT`).
//!
//! What the daemon does on a request is behind one trait, [`Control`], so that this module
//! knows nothing of the engine and is tested with a fake.

pub mod client;
pub mod fds;
pub mod path;
pub mod server;
pub mod takeover;

use farcache_client::LenderAddr;
use std::time::Duration;

use serde_json::{json, Value};

/// Longest request line accepted, newline excluded.
pub const MAX_REQUEST_BYTES: usize = 4096;
/// Control connections served at once; more are answered with an error line and closed.
pub const MAX_CONNECTIONS: usize = 8;
/// A request line must arrive whole within this of the connection being accepted, and a
/// response must be taken by the client within this.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest response a client accepts (a stats document is a few KiB).
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// What a running mount does on control requests. Called on the control threads, never on
/// a FUSE thread; implementations may block briefly (adding a lender), but must not wait
/// on the file system.
pub trait Control: Send + Sync + 'static {
    /// The mount's counters, as one JSON document (docs/METRICS.md, "Mount").
    fn stats(&self) -> Value;
    /// Each lender and its state (an empty list without a remote tier).
    fn lenders(&self) -> Vec<Value>;
    /// Start borrowing from `addr` (blocks begin landing on it at once); an error says why not.
    fn add_lender(&self, addr: LenderAddr) -> Result<(), String>;
    /// Stop borrowing from `addr`; its blocks become misses.
    fn remove_lender(&self, addr: LenderAddr) -> Result<(), String>;
    /// Hand the mount over to the daemon at the other end of `s` (`takeover.rs`); the
    /// implementation owns the rest of the connection.
    fn takeover(&self, s: std::os::unix::net::UnixStream, _req: &Value) {
        let _ = fds::write_line(&s, &error("this daemon cannot hand its mount over"));
    }
    /// Destage what the write-back tier held when the flush was first asked for (`through`,
    /// given back by the client from the first answer; `None`: now), waiting at most `wait`
    /// (the client asks again until `done`): `{"done":bool,"dirty_bytes":N,"through":S}`, or
    /// why it cannot.
    fn flush(&self, wait: Duration, through: Option<u64>) -> Result<Value, String> {
        let _ = (wait, through);
        Err("this mount has no write-back tier (mount with --tier PATH to have one)".into())
    }
    /// Plan a balance of a mount of several branches (`farcache_fuse::union::BalanceOptions`
    /// in `options`) and, unless a dry run, start it in the background: answers the plan.
    fn balance(&self, options: &Value) -> Result<Value, String> {
        let _ = options;
        Err("this mount cannot balance".into())
    }
    /// The last balance's plan and progress.
    fn balance_status(&self) -> Result<Value, String> {
        Err("this mount cannot balance".into())
    }
}

/// Longest a `flush` request waits before answering (the client asks again).
pub const MAX_FLUSH_WAIT: Duration = Duration::from_secs(3);

/// The commands, in the order error messages list them.
pub const COMMANDS: [&str; 9] =
    ["stats", "lenders", "add_lender", "remove_lender", "ping", "takeover", "flush", "balance", "balance_status"];

/// An error response.
pub fn error(msg: impl Into<String>) -> Value {
    json!({ "ok": false, "error": msg.into() })
}

/// Answer one request line (without its newline). Never panics on any input.
pub fn handle(control: &dyn Control, line: &[u8]) -> Value {
    let req: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return error(format!("malformed request (one JSON object per line expected): {e}")),
    };
    let Some(obj) = req.as_object() else {
        return error("malformed request: expected a JSON object like {\"cmd\":\"stats\"}");
    };
    let Some(cmd) = obj.get("cmd").and_then(Value::as_str) else {
        return error("malformed request: no \"cmd\" string");
    };
    let expected: &[&str] = match cmd {
        "add_lender" | "remove_lender" => &["cmd", "addr"],
        "flush" => &["cmd", "wait_ms", "through"],
        "balance" => &["cmd", "options"],
        _ => &["cmd"],
    };
    if let Some(k) = obj.keys().find(|k| !expected.contains(&k.as_str())) {
        return error(format!("{cmd}: unknown field {k:?}"));
    }
    match cmd {
        "stats" => json!({ "ok": true, "stats": control.stats() }),
        "lenders" => json!({ "ok": true, "lenders": control.lenders() }),
        "balance" => match control.balance(obj.get("options").unwrap_or(&json!({}))) {
            Ok(v) => json!({ "ok": true, "balance": v }),
            Err(e) => error(e),
        },
        "balance_status" => match control.balance_status() {
            Ok(v) => json!({ "ok": true, "balance": v }),
            Err(e) => error(e),
        },
        "ping" => json!({ "ok": true, "version": env!("CARGO_PKG_VERSION"), "pid": std::process::id() }),
        "flush" => {
            let ms = obj.get("wait_ms").and_then(Value::as_u64).unwrap_or(0);
            let through = match obj.get("through") {
                None => None,
                Some(v) => match v.as_u64() {
                    Some(t) => Some(t),
                    None => return error("flush: \"through\" must be the number a previous answer gave"),
                },
            };
            match control.flush(Duration::from_millis(ms).min(MAX_FLUSH_WAIT), through) {
                Ok(mut v) => {
                    v["ok"] = json!(true);
                    v
                }
                Err(e) => error(e),
            }
        }
        "add_lender" | "remove_lender" => {
            let addr = match obj.get("addr").and_then(Value::as_str).map(str::parse::<LenderAddr>) {
                Some(Ok(a)) => a,
                Some(Err(_)) | None => {
                    return error(format!("{cmd}: \"addr\" must be \"IP:PORT\" or \"memcached://IP:PORT\""))
                }
            };
            let res = if cmd == "add_lender" { control.add_lender(addr) } else { control.remove_lender(addr) };
            match res {
                Ok(()) => {
                    tracing::info!("control: {cmd} {addr}");
                    json!({ "ok": true, "lenders": control.lenders() })
                }
                Err(e) => error(e),
            }
        }
        other => {
            let mut shown: String = other.chars().take(64).collect();
            if other.chars().count() > 64 {
                shown.push('…');
            }
            error(format!("unknown cmd {shown:?}; expected one of {}", COMMANDS.join(", ")))
        }
    }
}

#[cfg(test)]
pub mod fake {
    //! A [`Control`] that keeps a list of addresses, for the tests of this module.
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct Fake {
        pub lenders: Mutex<Vec<LenderAddr>>,
        /// How long each stats call takes (to hold connections open in tests).
        pub stats_delay: Mutex<Duration>,
    }

    impl Control for Fake {
        fn stats(&self) -> Value {
            let d = *self.stats_delay.lock().unwrap();
            std::thread::sleep(d);
            json!({ "hits": 1, "misses": 2 })
        }
        fn lenders(&self) -> Vec<Value> {
            self.lenders.lock().unwrap().iter().map(|a| json!({ "addr": a.to_string(), "state": "up" })).collect()
        }
        fn add_lender(&self, addr: LenderAddr) -> Result<(), String> {
            let mut l = self.lenders.lock().unwrap();
            if l.contains(&addr) {
                return Err(format!("lender {addr} is already in the set"));
            }
            l.push(addr);
            Ok(())
        }
        fn remove_lender(&self, addr: LenderAddr) -> Result<(), String> {
            let mut l = self.lenders.lock().unwrap();
            let n = l.len();
            l.retain(|a| *a != addr);
            if l.len() == n {
                return Err(format!("lender {addr} is not in the set"));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::Fake;
    use super::*;

    fn ask(c: &Fake, line: &str) -> Value {
        handle(c, line.as_bytes())
    }

    #[test]
    fn commands_answer() {
        let c = Fake::default();
        assert_eq!(ask(&c, r#"{"cmd":"stats"}"#), json!({"ok":true,"stats":{"hits":1,"misses":2}}));
        assert_eq!(ask(&c, r#"{"cmd":"lenders"}"#), json!({"ok":true,"lenders":[]}));
        let r = ask(&c, r#"{"cmd":"add_lender","addr":"127.0.0.1:7000"}"#);
        assert_eq!(r, json!({"ok":true,"lenders":[{"addr":"127.0.0.1:7000","state":"up"}]}));
        let r = ask(&c, r#"{"cmd":"add_lender","addr":"127.0.0.1:7000"}"#);
        assert_eq!(r, json!({"ok":false,"error":"lender 127.0.0.1:7000 is already in the set"}));
        let r = ask(&c, r#"{"addr":"[::1]:7000","cmd":"remove_lender"}"#);
        assert_eq!(r["error"], "lender [::1]:7000 is not in the set");
        assert_eq!(ask(&c, r#"{"cmd":"remove_lender","addr":"127.0.0.1:7000"}"#)["ok"], true);
        assert_eq!(ask(&c, r#"{"cmd":"ping"}"#)["pid"], std::process::id());
    }

    #[test]
    fn malformed_requests_get_errors() {
        let c = Fake::default();
        for (line, want) in [
            ("", "malformed request"),
            ("{", "malformed request"),
            ("\u{0}\u{1}garbage", "malformed request"),
            ("[1,2]", "expected a JSON object"),
            ("\"stats\"", "expected a JSON object"),
            ("{}", "no \"cmd\""),
            (r#"{"cmd":7}"#, "no \"cmd\""),
            (r#"{"cmd":"stats","x":1}"#, "unknown field \"x\""),
            (r#"{"cmd":"shutdown"}"#, "unknown cmd \"shutdown\"; expected one of stats, lenders"),
            (r#"{"cmd":"add_lender"}"#, "\"addr\" must be"),
            (r#"{"cmd":"add_lender","addr":"lender1:7411"}"#, "\"addr\" must be"),
            (r#"{"cmd":"add_lender","addr":7411}"#, "\"addr\" must be"),
            (r#"{"cmd":"stats"} {"cmd":"stats"}"#, "malformed request"),
            (r#"{"cmd":"flush","wait_ms":10,"through":"x"}"#, "\"through\" must be"),
            (r#"{"cmd":"flush","wait_ms":10,"through":-1}"#, "\"through\" must be"),
        ] {
            let r = ask(&c, line);
            assert_eq!(r["ok"], false, "{line:?}: {r}");
            let e = r["error"].as_str().unwrap();
            assert!(e.contains(want), "{line:?}: {e}");
        }
        // An enormous unknown command name is not echoed whole.
        let long = format!(r#"{{"cmd":"{}"}}"#, "x".repeat(3000));
        assert!(ask(&c, &long)["error"].as_str().unwrap().len() < 200);
        assert!(c.lenders.lock().unwrap().is_empty());
    }
}
