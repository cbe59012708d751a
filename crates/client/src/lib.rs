//! The async, pipelined client of the farcache wire protocol (docs/PROTOCOL.md).
//!
//! One [`Client`] is one TCP connection to one lender. Many tasks share it: each request gets
//! a fresh request id, takes one of the connection's in-flight slots (at most
//! min([`ClientConfig::max_inflight`], the server's `max_inflight`)) and waits for the answer
//! with that id. Two tasks own the socket:
//!
//! * the writer owns the write half and drains a bounded queue of encoded frames, gathering
//!   what is queued into few write syscalls;
//! * the reader owns the read half, reads into a buffer that never holds more than one
//!   frame limit, splits frames, checks each answer against what its request expects (opcode,
//!   entry count, PONG payload) and completes the waiter.
//!
//! Anything the server sends that breaks the protocol closes the connection, and every
//! waiter gets the cause: a caller never gets a value that might belong to another request.
//! A request that times out frees its slot; its answer, if it comes, is dropped.
//!
//! ```no_run
//! # async fn demo() -> Result<(), farcache_client::ClientError> {
//! use farcache_client::{Client, ClientConfig, Key};
//! let client = Client::connect(ClientConfig::new("127.0.0.1:7000".parse().unwrap(), "db1")).await?;
//! let key = Key::new(42, 0, 1);
//! client.put(&[(key, &[0u8; 4096][..])]).await?;
//! let values = client.get(&[key]).await?;
//! assert_eq!(values[0].as_deref(), Some(&[0u8; 4096][..]));
//! # Ok(()) }
//! ```

mod client;
mod config;
mod conn;
mod error;
mod handshake;
mod lender;
pub mod memcached;

pub use client::Client;
pub use config::{ClientConfig, ClientTls, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_INFLIGHT, DEFAULT_REQUEST_TIMEOUT};
pub use error::ClientError;
pub use farcache_wire::{DelStatus, ErrorCode, HelloOk, Key, PutStatus};
pub use lender::{LenderAddr, LenderClient, LenderProtocol};
pub use memcached::{McClient, McInfo};
