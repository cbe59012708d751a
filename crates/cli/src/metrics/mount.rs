//! A mount's metrics: the document `farcache stats MOUNTPOINT` shows, rendered at scrape
//! time — the remote tier, the engine, the index, routing, each lender (label `lender`), the
//! disk, and the latency histograms the data path keeps.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::names::*;
use super::Out;
use crate::cmd::mount::MountStats;

/// One snapshot of a mount, encoded.
#[derive(Debug)]
pub struct Snapshot(pub MountStats);

impl Collector for Snapshot {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        let c = &s.cache;
        let mut o = Out(encoder);
        let info = [
            ("version", s.version.as_str()),
            ("mountpoint", s.mountpoint.as_str()),
            ("backing_dir", s.backing_dir.as_str()),
            ("remote_tier", s.remote_tier.as_str()),
            ("routing", c.routing.mode.as_str()),
        ];
        o.family(MOUNT_INFO, &[(info, 1u64)])?;
        o.value(MOUNT_UPTIME, s.uptime_secs)?;
        let (r, e, b) = (&c.remote, &c.engine, &c.backing);
        for (m, v) in [
            (REMOTE_GETS, r.gets),
            (REMOTE_HITS, r.hits),
            (REMOTE_MISSES, r.misses),
            (REMOTE_BYTES_FROM, r.bytes_from_servers),
            (REMOTE_BYTES_TO, r.bytes_to_servers),
            (REMOTE_PUTS, r.puts),
            (REMOTE_PUTS_DROPPED, r.puts_dropped),
            (REMOTE_PUTS_FAILED, r.puts_failed),
            (REMOTE_PUTS_IN_FLIGHT, r.puts_in_flight),
            (REMOTE_PUTS_BOUND, r.puts_bound),
            (REMOTE_INVALIDATIONS_IN_FLIGHT, r.invalidations_in_flight),
            (REMOTE_INVALIDATIONS, r.invalidations),
            (REMOTE_INVALIDATIONS_DROPPED, r.invalidations_dropped),
            (REMOTE_FALLBACKS, r.fallbacks),
            (REMOTE_REJECTED, r.rejected),
            (REMOTE_AUTH_FAILURES, r.auth_failures),
            (REMOTE_CONNECTS, r.connects),
            (REMOTE_CONNECT_FAILURES, r.connect_failures),
            (REMOTE_FETCH_CONNECTS, r.fetch_connects),
            (REMOTE_FETCHES_POLLED, r.fetches_polled),
            (ENGINE_REMOTE_READS, e.remote_reads),
            (ENGINE_DISK_READS, e.disk_reads),
            (ENGINE_PARTIAL_HITS, e.partial_hits),
            (ENGINE_PARTIAL_REMOTE_BLOCKS, e.partial_remote_blocks),
            (ENGINE_PARTIAL_DISK_BLOCKS, e.partial_disk_blocks),
            (ENGINE_PARTIAL_OVERLAPPED, e.partial_overlapped),
            (ENGINE_SEQUENTIAL_BYPASSES, e.sequential_bypasses),
            (ENGINE_FILLS, e.fills),
            (ENGINE_SEED_FILLS, e.seed_fills),
            (ENGINE_FILLS_PENDING_SKIPPED, e.fills_pending_skipped),
            (ENGINE_READ_AROUNDS, e.read_arounds),
            (ENGINE_ADAPTIVE_REMOTE, e.adaptive_remote),
            (ENGINE_ADAPTIVE_DISK, e.adaptive_disk),
            (ENGINE_ADAPTIVE_PROBES, e.adaptive_probes),
            (ENGINE_CHANGED_BEHIND, e.changed_behind),
            (INDEX_MEMORY, c.index.memory_bytes),
            (INDEX_REMOTE_BLOCKS, c.index.remote_blocks),
            (INDEX_PER_GIB, c.index.bytes_per_gib_cached),
            (BACKING_READS_DIRECT, b.reads_direct),
            (BACKING_READS_BUFFERED, b.reads_buffered),
            (BACKING_READ_BYTES, b.read_bytes),
            (BACKING_WRITES, b.writes),
            (BACKING_WRITE_BYTES, b.write_bytes),
            (BACKING_FSYNCS, b.fsyncs),
            (BACKING_FORGETS, b.forgets),
            (BACKING_WRITES_DIRECT, b.writes_direct),
            (IO_OPS_URING, b.io.ops_uring),
            (IO_WRITE_OPS, b.io.write_ops),
            (IO_SYNC_OPS, b.io.sync_ops),
            (IO_OPS_SYNC, b.io.ops_sync),
            (IO_IN_FLIGHT, b.io.in_flight),
            (IO_IN_FLIGHT_PEAK, b.io.in_flight_peak),
            (IO_RINGS, b.io.rings),
            (IO_WAITS_FOR_ROOM, b.io.waits_for_room),
            (IO_FALLBACK_NO_URING, b.io.fallback_no_uring),
            (IO_FALLBACK_UNALIGNED_READS, b.io.fallback_unaligned_reads),
            (IO_FALLBACK_UNALIGNED_WRITES, b.io.fallback_unaligned_writes),
            (IO_FALLBACK_DIRECT_REFUSED, b.io.fallback_direct_refused),
            (IO_SHORT_RETRIES, b.io.short_retries),
        ] {
            o.value(m, v)?;
        }
        o.gauge_f64(ROUTING_DISK_SHARE, c.routing.adaptive.as_ref().map_or(0.0, |a| a.disk_share))?;
        o.gauge_f64(ROUTING_DISK_WEIGHT, c.routing.adaptive.as_ref().map_or(0.0, |a| a.disk_weight))?;
        let addrs: Vec<String> = c.lenders.iter().map(|l| l.addr.to_string()).collect();
        type Field = fn(&farcache_engine::LenderStatus) -> u64;
        let per_lender: [(Metric, Field); 5] = [
            (LENDER_CONNECTED, |l| l.connected as u64),
            (LENDER_CONNECTS, |l| l.connects),
            (LENDER_HITS, |l| l.hits),
            (LENDER_MISSES, |l| l.misses),
            (LENDER_PUTS, |l| l.puts),
        ];
        for (m, f) in per_lender {
            let rows: Vec<_> = c.lenders.iter().zip(&addrs).map(|(l, a)| ([(LENDER, a.as_str())], f(l))).collect();
            o.family(m, &rows)?;
        }
        let t = c.tier.clone().unwrap_or_default();
        let info =
            [("path", t.path.as_str()), ("mode", t.log.mode.as_str()), ("durability", t.log.durability.as_str())];
        o.family(TIER_INFO, &[(info, u64::from(c.tier.is_some()))])?;
        for (m, v) in [
            (TIER_CAPACITY, t.log.capacity_bytes),
            (TIER_USED, t.log.used_bytes),
            (TIER_DIRTY, t.log.dirty_bytes),
            (TIER_BROKEN, u64::from(t.log.broken.is_some())),
            (TIER_DESTAGE_STALLED, u64::from(t.destage_stalled_on.is_some())),
            (TIER_WRITES, t.writes),
            (TIER_WRITE_BYTES, t.write_bytes),
            (TIER_GROUPS, t.log.groups),
            (TIER_FLUSHES, t.log.flushes),
            (TIER_COMMITS, t.log.commits),
            (TIER_UNFLUSHED, t.log.unflushed_bytes),
            (TIER_COMMIT_FALLBACKS, t.commit_fallbacks),
            (TIER_FSYNCS_ABSORBED, t.fsyncs_absorbed),
            (TIER_READS, t.reads_from_tier),
            (TIER_READS_WHOLE, t.reads_only_from_tier),
            (TIER_THROUGH_FULL, t.write_through_full),
            (TIER_THROUGH_BROKEN, t.write_through_broken),
            (TIER_THROUGH_SEQUENTIAL, t.write_through_sequential),
            (TIER_THROUGH_SEQUENTIAL_BYTES, t.write_through_sequential_bytes),
            (TIER_DESTAGE_ROUNDS, t.destage_rounds),
            (TIER_DESTAGE_DEEP, t.destage_batches_deep),
            (TIER_DESTAGED_BLOCKS, t.destaged_blocks),
            (TIER_DESTAGED_BYTES, t.destaged_bytes),
            (TIER_DESTAGE_FS_SYNCS, t.destage_fs_syncs),
            (TIER_DISCARDED_BLOCKS, t.discarded_blocks),
            (TIER_DESTAGE_ERRORS, t.destage_errors),
            (TIER_DESTAGE_STALLS, t.destage_stalls),
            (TIER_OPEN_FILES, t.open_files),
            (TIER_MAX_OPEN_FILES, t.max_open_files),
            (TIER_REOPENS, t.reopens),
        ] {
            o.value(m, v)?;
        }
        for (m, v) in [
            (FUSE_RING_ACTIVE, u64::from(s.fuse.mode == "io_uring")),
            (FUSE_RING_REQUESTS, s.fuse.ring_requests),
            (FUSE_RING_COMMIT_ERRORS, s.fuse.ring_commit_errors),
            (FUSE_READ_AHEAD, s.fuse.read_ahead_kb * 1024),
            (FUSE_INODES, s.fuse.inodes),
            (FUSE_INODE_FDS, s.fuse.inode_fds),
            (FUSE_INODE_FD_BUDGET, s.fuse.inode_fd_budget),
            (FUSE_INODE_REOPENS, s.fuse.inode_reopens),
            (MEMORY_RSS, s.memory.rss_bytes),
            (MEMORY_ANON, s.memory.anon_bytes),
            (MEMORY_LAZYFREE, s.memory.lazyfree_bytes),
            (IO_BUFFERS, s.memory.io_buffers_bytes),
            (IO_BUFFERS_IDLE, s.memory.io_buffers_idle_bytes),
            (IO_BUFFERS_UNMAPPED, s.memory.io_buffers_unmapped),
        ] {
            o.value(m, v)?;
        }
        let secs = |us: u64| us as f64 / 1e6;
        o.family(
            CPU_SECONDS,
            &[([("mode", "user")], secs(s.cpu.user_us)), ([("mode", "system")], secs(s.cpu.system_us))],
        )?;
        let ops: Vec<_> = s.fuse.ops.iter().map(|(op, n)| ([(OP, op.as_str())], *n)).collect();
        o.family(FUSE_REQUESTS, &ops)?;
        let u = s.union.clone().unwrap_or_default();
        for (m, v) in [
            (UNION_BRANCHES, u.branches.len().max(1) as u64),
            (UNION_MOVES, u.moves),
            (UNION_MOVED_BYTES, u.bytes_moved),
            (UNION_MOVE_FAILURES, u.move_failures),
            (UNION_RACES, u.races),
            (UNION_RETRIES, u.retries),
            (UNION_BLOCKS_FROM_CACHE, u.blocks_from_cache),
            (UNION_BLOCKS_FROM_DISK, u.blocks_from_disk),
            (UNION_BLOCKS_FROM_TIER, u.blocks_from_tier),
            (UNION_ID_FAILURES, u.id_failures),
            (UNION_AUTO_ACTIVE, u.auto_active as u64),
            (UNION_AUTO_CHECKS, u.auto_checks),
            (UNION_AUTO_ROUNDS, u.auto_rounds),
            (UNION_AUTO_MOVES, u.auto_moves),
            (UNION_AUTO_SKIPS, u.auto_skips),
            (UNION_COPY_YIELDS, u.copy_yields),
            (UNION_COPY_YIELD_BOUNDED, u.copy_yield_bounded),
            (UNION_COPY_YIELD_WAIT_MS, u.copy_yield_wait_ms),
            (UNION_COPY_LENDER_YIELDS, u.copy_lender_yields),
            (UNION_COPY_LENDER_YIELD_WAIT_MS, u.copy_lender_yield_wait_ms),
        ] {
            o.value(m, v)?;
        }
        o.histogram(REMOTE_FETCH_SECONDS, &r.fetch_latency)?;
        o.histogram(REMOTE_FILL_SECONDS, &r.fill_latency)?;
        o.histogram(BACKING_READ_SECONDS, &b.read_latency)?;
        o.histogram(BACKING_WRITE_SECONDS, &b.write_latency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farcache_engine::latency::Latency;

    #[test]
    fn every_mount_name_is_rendered_with_lender_labels_and_buckets() {
        let mut cache = farcache_engine::CacheStats::default();
        cache.remote.hits = 9;
        let l = Latency::default();
        l.record(std::time::Duration::from_micros(300));
        cache.backing.read_latency = l.snapshot();
        cache.lenders.push(farcache_engine::LenderStatus {
            addr: "127.0.0.1:7411".parse().unwrap(),
            connected: true,
            instance_id: 1,
            connects: 1,
            hits: 9,
            misses: 0,
            puts: 3,
        });
        let mut t = farcache_engine::writeback::TierStats { path: "/dev/shm/t".into(), ..Default::default() };
        t.log.mode = "dram".into();
        t.log.dirty_bytes = 8192;
        cache.tier = Some(t);
        cache.routing.mode = "adaptive".into();
        cache.routing.adaptive = Some(farcache_engine::routing::AdaptiveEstimates {
            disk_share: 0.25,
            disk_weight: 1.1,
            ..Default::default()
        });
        let s = MountStats {
            version: "0.1.0".into(),
            pid: 1,
            mountpoint: "/mnt".into(),
            backing_dir: "/srv".into(),
            uptime_secs: 2,
            uptime_ms: 2_000,
            unix_ms: 1_765_000_000_000,
            remote_tier: "lenders".into(),
            cache,
            union: None,
            fuse: farcache_fuse::TransportStats {
                ops: [("getattr".to_string(), 7), ("write".to_string(), 2)].into_iter().collect(),
                ..Default::default()
            },
            memory: Default::default(),
            cpu: crate::cmd::mount::DaemonCpu { user_us: 1_500_000, system_us: 250_000 },
        };
        let text = super::super::render(Snapshot(s));
        assert!(text.contains("farcache_mount_fuse_requests_total{op=\"getattr\"} 7"), "{text}");
        assert!(text.contains("farcache_mount_lender_puts_total{lender=\"127.0.0.1:7411\"} 3"), "{text}");
        assert!(text.contains("farcache_mount_remote_hits_total 9"), "{text}");
        assert!(text.contains("farcache_mount_cpu_seconds_total{mode=\"user\"} 1.5\n"), "{text}");
        assert!(text.contains("farcache_mount_cpu_seconds_total{mode=\"system\"} 0.25\n"), "{text}");
        assert!(text.contains("farcache_mount_tier_dirty_bytes 8192"), "{text}");
        assert!(text.contains("farcache_mount_routing_disk_share 0.25\n"), "{text}");
        assert!(text.contains("farcache_mount_routing_disk_weight 1.1\n"), "{text}");
        assert!(text.contains("farcache_mount_tier_info{path=\"/dev/shm/t\",mode=\"dram\""), "{text}");
        assert!(text.contains("farcache_mount_backing_read_seconds_bucket{le=\"0.00025\"} 0"), "{text}");
        assert!(text.contains("farcache_mount_backing_read_seconds_bucket{le=\"0.0005\"} 1"), "{text}");
        assert!(text.contains("farcache_mount_backing_read_seconds_bucket{le=\"+Inf\"} 1"), "{text}");
        assert!(text.contains("farcache_mount_backing_read_seconds_sum 0.0003"), "{text}");
        for m in MOUNT {
            assert!(text.contains(&format!("\n{}", m.exposed())), "{} missing:\n{text}", m.exposed());
        }
    }
}
