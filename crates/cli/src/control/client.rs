//! The command side of the control channel: send one request, read one response, all within
//! a deadline, and tell "nobody is there" apart from "the daemon said no".

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use super::MAX_RESPONSE_BYTES;

/// How long a command waits for the daemon's answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub enum CallError {
    /// No daemon answers: no socket file, nobody listening, or no answer in time.
    NotAnswering(io::Error),
    /// The socket is there but not ours to use (its mode is 0600: the owner and root only).
    Denied(io::Error),
    /// The daemon answered `{"ok":false,"error":...}`.
    Refused(String),
    /// The daemon answered something else than a response line.
    BadResponse(String),
}

/// Send `req` on the socket at `path`; the response if it says `"ok":true`.
pub fn call(path: &Path, req: &Value, timeout: Duration) -> Result<Value, CallError> {
    let mut s = UnixStream::connect(path).map_err(|e| match e.kind() {
        io::ErrorKind::PermissionDenied => CallError::Denied(e),
        _ => CallError::NotAnswering(e),
    })?;
    let io_err = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            CallError::NotAnswering(io::Error::new(io::ErrorKind::TimedOut, format!("no answer within {timeout:?}")))
        }
        _ => CallError::NotAnswering(e),
    };
    s.set_read_timeout(Some(timeout)).map_err(io_err)?;
    s.set_write_timeout(Some(timeout)).map_err(io_err)?;
    let mut line = serde_json::to_vec(req).map_err(|e| CallError::BadResponse(e.to_string()))?;
    line.push(b'\n');
    // A daemon that refuses the connection writes its error line and closes: a failed write
    // is then no reason to miss the line, so read whatever came.
    let wrote = s.write_all(&line);
    let mut resp = String::new();
    let read = BufReader::new((&s).take(MAX_RESPONSE_BYTES as u64)).read_line(&mut resp);
    match (read, wrote) {
        (Ok(_), _) if resp.ends_with('\n') => {}
        (Ok(_), Err(e)) | (Err(_), Err(e)) => return Err(io_err(e)),
        (Ok(0), Ok(())) => {
            return Err(CallError::BadResponse("the daemon closed the connection without answering".into()))
        }
        (Ok(_), Ok(())) => return Err(CallError::BadResponse("the answer is incomplete or too long".into())),
        (Err(e), Ok(())) => return Err(io_err(e)),
    }
    let v: Value = serde_json::from_str(&resp).map_err(|e| CallError::BadResponse(format!("not JSON: {e}")))?;
    match v.get("ok") {
        Some(Value::Bool(true)) => Ok(v),
        Some(Value::Bool(false)) => {
            Err(CallError::Refused(v.get("error").and_then(Value::as_str).unwrap_or("(no reason given)").to_string()))
        }
        _ => Err(CallError::BadResponse(format!("no \"ok\" field in {resp:?}"))),
    }
}

/// Which socket a command talks to: `--control-socket` if given, else the default path of
/// the mount on `mountpoint`.
pub fn socket_for(mountpoint: &Path, explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    // The mount point as the daemon named it: canonical, as `farcache mount` resolves it.
    let canon = std::fs::canonicalize(mountpoint).with_context(|| {
        format!("no farcache mount answers at {}: the directory cannot be resolved", mountpoint.display())
    })?;
    Ok(super::path::default_socket_path(&canon)?)
}

/// [`call`] for a command about the mount on `mountpoint`, with errors a user can act on.
pub fn call_mount(mountpoint: &Path, socket: &Path, req: &Value) -> anyhow::Result<Value> {
    call(socket, req, CALL_TIMEOUT).map_err(|e| match e {
        CallError::NotAnswering(e) => anyhow::anyhow!(
            "no farcache mount answers at {} (socket {}): is it mounted? ({e})",
            mountpoint.display(),
            socket.display()
        ),
        CallError::Denied(e) => anyhow::anyhow!(
            "cannot use the control socket {} of {}: {e} (only its owner and root may)",
            socket.display(),
            mountpoint.display()
        ),
        CallError::Refused(msg) => anyhow::anyhow!("{msg}"),
        CallError::BadResponse(msg) => {
            anyhow::anyhow!("the daemon at {} answered oddly: {msg}", socket.display())
        }
    })
}
