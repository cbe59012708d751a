//! The client's one error type.
//!
//! The variants keep apart what a caller reacts to differently: back-pressure (`Busy`, try
//! later), faults of the network or the peer (`Connect`, `Io`, `Closed`, `Timeout`: reconnect),
//! corruption or a broken server (`Protocol`: the connection is closed and nothing it returned
//! for the failed request is trusted), refusals (`AuthFailed`, `UnsupportedVersion`: fix the
//! configuration) and bugs of the caller (`Config`).

use std::io;

use farcache_wire::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The TCP connection could not be set up, or the server hung up during the handshake.
    #[error("cannot connect: {0}")]
    Connect(#[source] io::Error),
    /// Reading or writing an established connection failed. The connection is closed.
    #[error("connection I/O failed: {0}")]
    Io(#[source] io::Error),
    /// The request (or the handshake) did not complete within its timeout. The connection
    /// stays open; a late answer is dropped.
    #[error("timed out")]
    Timeout,
    /// The connection is closed: by `close()`, by the server, or after an earlier failure.
    #[error("connection closed")]
    Closed,
    /// The server sent bytes that break the protocol. The connection is closed.
    #[error("protocol violation by the server: {0}")]
    Protocol(String),
    /// The server answered with an ERROR frame.
    #[error("server error {code:?}: {message}")]
    Server { code: ErrorCode, message: String },
    /// Unknown tenant or wrong secret.
    #[error("authentication failed: {0}")]
    AuthFailed(String),
    /// No protocol version in common with the server; the message names the server's range.
    #[error("unsupported protocol version: {0}")]
    UnsupportedVersion(String),
    /// The server is overloaded (too many connections or tenants); try later.
    #[error("server busy: {0}")]
    Busy(String),
    /// The TLS handshake failed: certificates that do not check out on one side or the other,
    /// or a server that does not speak TLS.
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    /// The configuration cannot work; the message names the field.
    #[error("invalid client configuration: {0}")]
    Config(String),
}

impl ClientError {
    /// The error an ERROR frame stands for.
    pub(crate) fn from_server(code: ErrorCode, message: &str) -> ClientError {
        let message = message.to_owned();
        match code {
            ErrorCode::Busy => ClientError::Busy(message),
            ErrorCode::AuthFailed => ClientError::AuthFailed(message),
            ErrorCode::UnsupportedVersion => ClientError::UnsupportedVersion(message),
            code => ClientError::Server { code, message },
        }
    }

    /// A copy for each of the waiters a connection failure reaches (`io::Error` is not `Clone`).
    pub(crate) fn duplicate(&self) -> ClientError {
        match self {
            ClientError::Connect(e) => ClientError::Connect(io::Error::new(e.kind(), e.to_string())),
            ClientError::Io(e) => ClientError::Io(io::Error::new(e.kind(), e.to_string())),
            ClientError::Timeout => ClientError::Timeout,
            ClientError::Closed => ClientError::Closed,
            ClientError::Protocol(m) => ClientError::Protocol(m.clone()),
            ClientError::Server { code, message } => ClientError::Server { code: *code, message: message.clone() },
            ClientError::AuthFailed(m) => ClientError::AuthFailed(m.clone()),
            ClientError::UnsupportedVersion(m) => ClientError::UnsupportedVersion(m.clone()),
            ClientError::Busy(m) => ClientError::Busy(m.clone()),
            ClientError::Config(m) => ClientError::Config(m.clone()),
            ClientError::Tls(m) => ClientError::Tls(m.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_codes_map_to_distinct_variants() {
        assert!(matches!(ClientError::from_server(ErrorCode::Busy, "x"), ClientError::Busy(m) if m == "x"));
        assert!(matches!(ClientError::from_server(ErrorCode::AuthFailed, "x"), ClientError::AuthFailed(_)));
        assert!(matches!(
            ClientError::from_server(ErrorCode::UnsupportedVersion, "x"),
            ClientError::UnsupportedVersion(_)
        ));
        assert!(matches!(
            ClientError::from_server(ErrorCode::Other(77), "x"),
            ClientError::Server { code: ErrorCode::Other(77), .. }
        ));
    }

    #[test]
    fn duplicate_keeps_kind_and_text() {
        let e = ClientError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "mid-frame"));
        match e.duplicate() {
            ClientError::Io(d) => {
                assert_eq!(d.kind(), io::ErrorKind::UnexpectedEof);
                assert!(d.to_string().contains("mid-frame"));
            }
            other => panic!("{other:?}"),
        }
    }
}
