pub mod bench;
pub mod check;
pub mod config;
pub mod mount;
pub mod server;
pub mod stats;
