//! A lender's metrics: its STATS document as an admin sees it (every tenant), rendered at
//! scrape time.

use std::fmt;
use std::sync::Arc;

use farcache_server::{Server, ServerStats};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::names::*;
use super::Out;

/// What a scrape of `server` shows.
pub fn render(server: &Arc<Server>) -> String {
    // Tenant 0 with admin rights: every tenant and the connection counters.
    super::render(Snapshot(farcache_server::stats::collect(server, 0, true)))
}

/// One STATS snapshot, encoded.
#[derive(Debug)]
pub struct Snapshot(pub ServerStats);

impl Collector for Snapshot {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        let mut o = Out(encoder);
        let id = s.instance_id.to_string();
        let info = [("version", s.version.as_str()), ("policy", s.policy.as_str()), ("instance_id", id.as_str())];
        o.family(SERVER_INFO, &[(info, 1u64)])?;
        for (m, v) in [
            (SERVER_UPTIME, s.uptime_secs),
            (SERVER_CAPACITY, s.capacity_bytes),
            (SERVER_SLOT_BYTES, s.slot_bytes as u64),
            (SERVER_SLOTS, s.slots),
            (SERVER_USED, s.used_bytes),
            (SERVER_OVERHEAD, s.overhead_bytes),
            (SERVER_BLOCKS, s.totals.blocks),
            (SERVER_CONNECTIONS, s.connections),
            (SERVER_ACCEPTED, s.connections_total),
            (SERVER_REFUSED, s.connections_refused),
            (SERVER_PROTOCOL_ERRORS, s.protocol_errors),
            (SERVER_TIMEOUTS, s.timeouts),
            (SERVER_PLACEMENT_SWAPS, s.placement_swaps),
        ] {
            o.value(m, v)?;
        }
        type Field = fn(&farcache_server::stats::TenantStats) -> u64;
        let per_tenant: [(Metric, Field); 13] = [
            (TENANT_LIMIT, |t| t.limit_bytes),
            (TENANT_USED, |t| t.used_bytes),
            (TENANT_TARGET, |t| t.target_bytes),
            (TENANT_MIN, |t| t.min_bytes),
            (TENANT_BLOCKS, |t| t.counters.blocks),
            (TENANT_HITS, |t| t.counters.hits),
            (TENANT_MISSES, |t| t.counters.misses),
            (TENANT_PUTS, |t| t.counters.puts),
            (TENANT_PUT_REJECTS, |t| t.counters.put_rejects),
            (TENANT_DELS, |t| t.counters.dels),
            (TENANT_EVICTIONS, |t| t.counters.evictions),
            (TENANT_BYTES_IN, |t| t.counters.bytes_in),
            (TENANT_BYTES_OUT, |t| t.counters.bytes_out),
        ];
        for (m, f) in per_tenant {
            let rows: Vec<_> = s.tenants.iter().map(|t| ([(TENANT, t.name.as_str())], f(t))).collect();
            o.family(m, &rows)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lender_name_is_rendered_with_tenant_labels() {
        let mut s = ServerStats {
            version: "0.1.0".into(),
            policy: "lru".into(),
            capacity_bytes: 4096,
            placement_swaps: 3,
            ..Default::default()
        };
        s.tenants.push(farcache_server::stats::TenantStats {
            name: "db\"1".into(),
            limit_bytes: 4096,
            used_bytes: 0,
            counters: farcache_server::TenantCounters { hits: 7, ..Default::default() },
            ..Default::default()
        });
        let text = super::super::render(Snapshot(s));
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("farcache_server_tenant_hits_total{tenant=\"db\\\"1\"} 7"), "{text}");
        assert!(text.contains("farcache_server_capacity_bytes 4096"), "{text}");
        assert!(text.contains("farcache_server_placement_swaps_total 3"), "{text}");
        for m in SERVER {
            assert!(text.contains(&format!("\n{}", m.exposed())), "{} missing:\n{text}", m.exposed());
        }
    }
}
