//! [`CacheStats`]: the borrower's counters as one document, for operators. Serializable both
//! ways, so the mount can write it out (JSON) and a CLI can read it back.
//!
//! Every counter counts from the start of the mount and only grows; the index and lender
//! fields are the state at the moment of the snapshot.

use serde::{Deserialize, Serialize};

use crate::cached::EngineCountersSnapshot;
use crate::direct::BackingCountersSnapshot;
use crate::index::BLOCK_BYTES;
use crate::remote::{LenderStatus, RemoteCountersSnapshot};
use crate::routing::AdaptiveEstimates;

/// `RoutingStats::mode` of a plain passthrough (no remote tier).
pub const MODE_PASSTHROUGH: &str = "passthrough";

/// A snapshot of the whole cache engine ([`crate::cached::CachedPath::stats`]), or of a
/// plain passthrough ([`CacheStats::passthrough`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheStats {
    /// The remote tier's counters (all zero for a passthrough).
    pub remote: RemoteCountersSnapshot,
    /// How reads were served and routed.
    pub engine: EngineCountersSnapshot,
    /// The client-side index of what the lenders hold.
    pub index: IndexStats,
    /// The routing rule.
    pub routing: RoutingStats,
    /// The lender set now, in the order lenders joined.
    pub lenders: Vec<LenderStatus>,
    /// The disk underneath.
    pub backing: BackingCountersSnapshot,
    /// The write-back tier, if the mount has one (`--tier`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<crate::writeback::TierStats>,
}

impl CacheStats {
    /// The stats of a plain passthrough (`--no-remote`): the backing counters, everything
    /// else zero, routing mode "passthrough".
    pub fn passthrough(backing: BackingCountersSnapshot) -> CacheStats {
        CacheStats {
            routing: RoutingStats {
                mode: MODE_PASSTHROUGH.to_string(),
                threshold_bytes: 0,
                read_around_bytes: 0,
                adaptive: None,
            },
            backing,
            ..CacheStats::default()
        }
    }
}

/// The index's size against what it describes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexStats {
    /// Heap bytes of the index.
    pub memory_bytes: u64,
    /// Blocks marked as held by a lender.
    pub remote_blocks: u64,
    /// Index bytes per GiB of blocks held remotely (`memory_bytes` scaled to 1 GiB of
    /// `remote_blocks`); 0 when nothing is held.
    pub bytes_per_gib_cached: u64,
}

impl IndexStats {
    pub fn new(memory_bytes: u64, remote_blocks: u64) -> IndexStats {
        let cached_bytes = remote_blocks as u128 * BLOCK_BYTES as u128;
        let bytes_per_gib_cached =
            (memory_bytes as u128 * (1u128 << 30)).checked_div(cached_bytes).map_or(0, |b| b as u64);
        IndexStats { memory_bytes, remote_blocks, bytes_per_gib_cached }
    }
}

/// The routing rule and, for the adaptive rule, what it believes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoutingStats {
    /// "threshold", "adaptive" or "passthrough".
    pub mode: String,
    /// Reads of this many bytes or more go to the disk (threshold rule); 0 otherwise.
    pub threshold_bytes: u64,
    /// The read-around window a small miss reads and fills (`cache.read_around`); 0: off.
    #[serde(default)]
    pub read_around_bytes: u64,
    /// The adaptive rule's estimates; absent for the other modes.
    pub adaptive: Option<AdaptiveEstimates>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_gib_is_scaled_and_zero_when_empty() {
        assert_eq!(IndexStats::new(4096, 0).bytes_per_gib_cached, 0);
        // 150 KiB describing 1 GiB (262144 blocks).
        assert_eq!(IndexStats::new(150 << 10, 262_144).bytes_per_gib_cached, 150 << 10);
        // 1 KiB describing 1 MiB: 1 MiB per GiB.
        assert_eq!(IndexStats::new(1024, 256).bytes_per_gib_cached, 1 << 20);
    }

    #[test]
    fn passthrough_is_the_backing_alone_and_reads_back() {
        let backing = BackingCountersSnapshot { reads_direct: 3, read_bytes: 12288, writes: 1, ..Default::default() };
        let s = CacheStats::passthrough(backing);
        assert_eq!(s.routing.mode, "passthrough");
        assert_eq!(s.remote, RemoteCountersSnapshot::default());
        assert_eq!(s.engine, EngineCountersSnapshot::default());
        assert!(s.lenders.is_empty() && s.routing.adaptive.is_none());
        assert_eq!(s.backing, backing);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<CacheStats>(&json).unwrap(), s);
    }
}
