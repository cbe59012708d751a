//! Counters read between passes: the lenders' own STATS (summed over lenders; per pass, so
//! each pass's remote hits are known exactly) — the mount's counters are in [`super::mount`].

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::IoContext;
use crate::fc_client::FcClient;
use crate::{BenchError, Result};

/// The tenant the mount borrows as (its default), so asking adds no tenant to the lender.
const TENANT: &str = "default";

/// Sums of the lenders' STATS totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LenderTotals {
    pub blocks: u64,
    pub hits: u64,
    pub misses: u64,
    pub puts: u64,
    pub put_rejects: u64,
    pub dels: u64,
    pub evictions: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl LenderTotals {
    /// Counts from `earlier` to now (`blocks` is a level: kept as now).
    pub fn since(&self, e: &LenderTotals) -> LenderTotals {
        LenderTotals {
            blocks: self.blocks,
            hits: self.hits.saturating_sub(e.hits),
            misses: self.misses.saturating_sub(e.misses),
            puts: self.puts.saturating_sub(e.puts),
            put_rejects: self.put_rejects.saturating_sub(e.put_rejects),
            dels: self.dels.saturating_sub(e.dels),
            evictions: self.evictions.saturating_sub(e.evictions),
            bytes_in: self.bytes_in.saturating_sub(e.bytes_in),
            bytes_out: self.bytes_out.saturating_sub(e.bytes_out),
        }
    }
}

/// Ask every lender for its STATS and add them up.
pub fn lender_totals(addrs: &[SocketAddr]) -> Result<LenderTotals> {
    let mut t = LenderTotals::default();
    for &a in addrs {
        let s = TcpStream::connect_timeout(&a, Duration::from_secs(3)).ctx(|| format!("connect to lender {a}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ctx(|| "read timeout".into())?;
        s.set_write_timeout(Some(Duration::from_secs(5))).ctx(|| "write timeout".into())?;
        let mut c = FcClient::handshake(s, TENANT)?;
        let json = c.stats()?;
        let v: serde_json::Value = serde_json::from_str(&json)
            .map_err(|e| BenchError::Setup(format!("lender {a} sent STATS that are not JSON: {e}")))?;
        let g = |k: &str| v[k].as_u64().unwrap_or(0);
        t.blocks += g("blocks");
        t.hits += g("hits");
        t.misses += g("misses");
        t.puts += g("puts");
        t.put_rejects += g("put_rejects");
        t.dels += g("dels");
        t.evictions += g("evictions");
        t.bytes_in += g("bytes_in");
        t.bytes_out += g("bytes_out");
    }
    Ok(t)
}
