//! The bench crate's one error type.

use farcache_wire::WireError;

/// What can stop a benchmark. Wrong answers are not errors: they are counted
/// (`mismatches`) and reported, so one bad value does not hide the rest of a run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Socket, pipe or file trouble.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A server's answer could not be understood.
    #[error("{system} protocol error: {msg}")]
    Protocol { system: &'static str, msg: String },
    /// A farcache frame did not decode.
    #[error("farcache wire error: {0}")]
    Wire(#[from] WireError),
    /// A server answered a request with an error of its own.
    #[error("{system} refused a request: {msg}")]
    Refused { system: &'static str, msg: String },
    /// The benchmark could not be set up (missing program, child that did not start, bad
    /// option); the message says what to do.
    #[error("{0}")]
    Setup(String),
}

impl BenchError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        BenchError::Io { what: what.into(), source }
    }
}

/// Attach a description to an I/O result.
pub(crate) trait IoContext<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> crate::Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> crate::Result<T> {
        self.map_err(|e| BenchError::io(what(), e))
    }
}
