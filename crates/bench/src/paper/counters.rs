//! Counters read between passes: the lenders' own STATS (summed over lenders; per pass, so
//! each pass's remote hits are known exactly) — the mount's counters are in [`super::mount`].

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::error::IoContext;
use crate::fc_client::FcClient;
use crate::{BenchError, Result};

/// The tenant the mount borrows as (its default), so asking adds no tenant to the lender.
const TENANT: &str = "default";

/// Sums of the lenders' STATS totals: the server's own counter set, so the two cannot drift.
pub type LenderTotals = farcache_server::TenantCounters;

/// Ask every lender for its STATS and add them up.
pub fn lender_totals(addrs: &[SocketAddr]) -> Result<LenderTotals> {
    let mut t = LenderTotals::default();
    for &a in addrs {
        let s = TcpStream::connect_timeout(&a, Duration::from_secs(3)).ctx(|| format!("connect to lender {a}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ctx(|| "read timeout".into())?;
        s.set_write_timeout(Some(Duration::from_secs(5))).ctx(|| "write timeout".into())?;
        let mut c = FcClient::handshake(s, TENANT)?;
        let json = c.stats()?;
        let stats: farcache_server::ServerStats = serde_json::from_str(&json)
            .map_err(|e| BenchError::Setup(format!("lender {a} sent STATS that do not parse: {e}")))?;
        t.add(&stats.totals);
    }
    Ok(t)
}
