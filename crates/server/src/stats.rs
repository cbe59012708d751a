//! STATS: the server's counters as JSON. The field names are the metric names documented in
//! docs/METRICS.md; `farcache stats --server` reads this same structure back.

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use crate::store::{TenantCounters, TenantId};
use crate::Server;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerStats {
    pub version: String,
    pub instance_id: u64,
    pub uptime_secs: u64,
    pub policy: String,
    /// `server.allocation` (absent from servers older than allocation: "").
    #[serde(default)]
    pub allocation: String,
    pub capacity_bytes: u64,
    pub slot_bytes: u32,
    pub slots: u64,
    /// Slots in use × slot size.
    pub used_bytes: u64,
    /// Heap bytes of the index and bookkeeping, beside the arena.
    pub overhead_bytes: u64,
    /// Sums over the tenants the caller may see: every tenant for an admin connection, its
    /// own for any other (`blocks`: blocks stored). `used_bytes` likewise.
    #[serde(flatten)]
    pub totals: TenantCounters,
    /// Server-wide connection counters: shown to admin connections only (0 for others, who
    /// must not learn of other tenants' activity).
    pub connections: u64,
    pub connections_total: u64,
    pub connections_refused: u64,
    pub protocol_errors: u64,
    pub timeouts: u64,
    /// Blocks one tenant took from another across shards to hold its allocation (`mrc`
    /// placement swaps, store.rs "Placement"): admin connections only, like the connection
    /// counters (absent from older servers: 0).
    #[serde(default)]
    pub placement_swaps: u64,
    /// The caller's tenant, or every tenant for an admin connection.
    pub tenants: Vec<TenantStats>,
    /// Tenants left out of `tenants` because the list would not fit in one frame.
    #[serde(default)]
    pub tenants_omitted: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantStats {
    pub name: String,
    pub limit_bytes: u64,
    pub used_bytes: u64,
    /// What the allocator gives it now (its limit under `shared`); the fields below are
    /// absent from servers older than allocation and read as 0 / empty.
    #[serde(default)]
    pub target_bytes: u64,
    #[serde(default)]
    pub min_bytes: u64,
    #[serde(default)]
    pub weight: u32,
    /// The allocator's predicted hit ratio at the target (`mrc`), to hold against the
    /// measured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_hit_ratio: Option<f64>,
    /// Predicted hit ratios at a few sizes (`mrc`, once its curve is measured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub predicted: Vec<PredictedPoint>,
    #[serde(flatten)]
    pub counters: TenantCounters,
}

/// One point of a tenant's miss-ratio curve: the hit ratio predicted at `bytes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PredictedPoint {
    pub bytes: u64,
    pub hit_ratio: f64,
}

impl ServerStats {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("stats serialize")
    }

    /// The JSON text, within `max_bytes`: per-tenant entries are dropped (and counted in
    /// `tenants_omitted`) if the whole list would not fit.
    pub fn to_json_within(mut self, max_bytes: usize) -> String {
        let json = self.to_json();
        if json.len() <= max_bytes {
            return json;
        }
        self.tenants_omitted = self.tenants.len() as u64;
        self.tenants.clear();
        self.to_json()
    }
}

/// Gather the stats a connection of `tenant` may see.
pub fn collect(server: &Server, tenant: TenantId, admin: bool) -> ServerStats {
    let cfg = server.config();
    let store = server.store();
    let names = server.tenants().snapshot();
    let counters = store.all_counters(names.len());
    let slot = store.slot_bytes() as u64;
    let mut totals = TenantCounters::default();
    let mut tenants = Vec::new();
    for ((id, name, limit), c) in names.into_iter().zip(counters) {
        // One tenant can neither read nor count another's blocks: totals are only of what
        // the caller may see.
        if admin || id == tenant {
            totals.add(&c);
            let view = server.allocation().view(id as usize).unwrap_or_default();
            tenants.push(TenantStats {
                name,
                limit_bytes: limit,
                used_bytes: c.blocks * slot,
                // Before the first tick (and under `shared`) the quota in force is the limit.
                target_bytes: if server.allocation().is_dynamic() { view.target_bytes } else { limit },
                min_bytes: view.min_bytes,
                weight: view.weight.max(1),
                predicted_hit_ratio: view.predicted_hit_ratio,
                predicted: view
                    .predicted
                    .iter()
                    .map(|&(bytes, hit_ratio)| PredictedPoint { bytes, hit_ratio })
                    .collect(),
                counters: c,
            });
        }
    }
    let cc = server.conn_counters();
    let seen = |c: &std::sync::atomic::AtomicU64| if admin { c.load(Ordering::Relaxed) } else { 0 };
    ServerStats {
        version: env!("CARGO_PKG_VERSION").to_string(),
        instance_id: server.instance_id(),
        uptime_secs: server.started.elapsed().as_secs(),
        policy: cfg.policy.clone(),
        allocation: cfg.allocation.clone(),
        capacity_bytes: store.capacity_slots() * slot,
        slot_bytes: store.slot_bytes(),
        slots: store.capacity_slots(),
        used_bytes: totals.blocks * slot,
        overhead_bytes: store.overhead_bytes(),
        totals,
        connections: seen(&cc.active),
        connections_total: seen(&cc.total),
        connections_refused: seen(&cc.refused),
        protocol_errors: seen(&cc.protocol_errors),
        timeouts: seen(&cc.timeouts),
        placement_swaps: if admin { store.swaps() } else { 0 },
        tenants,
        tenants_omitted: 0,
    }
}
