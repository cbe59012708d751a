pub mod config;
pub mod server;
pub mod stats;
