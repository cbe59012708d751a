//! Every metric name `/metrics` serves, in one place (docs/METRICS.md, "Prometheus", lists
//! them; a test keeps the two equal). Names are the family names: the OpenMetrics encoder
//! adds `_total` to counters, and histograms are read as `_bucket`, `_sum` and `_count`.

/// What kind of metric a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric: its family name, kind and help text.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

impl Metric {
    /// The name a PromQL query uses: counters carry `_total`. (For the tests that hold
    /// docs/METRICS.md and the Grafana dashboard to these names.)
    #[allow(dead_code)]
    pub fn exposed(&self) -> String {
        match self.kind {
            Kind::Counter => format!("{}_total", self.name),
            Kind::Gauge | Kind::Histogram => self.name.to_string(),
        }
    }
}

/// The label naming a lender's tenant.
pub const TENANT: &str = "tenant";
/// The label naming a mount's lender (its address).
pub const LENDER: &str = "lender";
/// The label naming a FUSE request's opcode.
pub const OP: &str = "op";

macro_rules! metrics {
    ($all:ident: $($id:ident = $name:literal, $kind:ident, $help:literal;)*) => {
        $(pub const $id: Metric = Metric { name: $name, kind: Kind::$kind, help: $help };)*
        /// Every metric of this group (for the tests).
        #[allow(dead_code)]
        pub const $all: &[Metric] = &[$($id),*];
    };
}

// The lender: `farcache server` (and the lender inside a mount has none: it is the mount's).
metrics! { SERVER:
    SERVER_INFO = "farcache_server_info", Gauge, "1, labelled with the server's version, eviction policy and instance id (new on every start)";
    SERVER_UPTIME = "farcache_server_uptime_seconds", Gauge, "Seconds since the server started";
    SERVER_CAPACITY = "farcache_server_capacity_bytes", Gauge, "Memory lent: slots times slot size";
    SERVER_SLOT_BYTES = "farcache_server_slot_bytes", Gauge, "Bytes per slot: the largest block stored";
    SERVER_SLOTS = "farcache_server_slots", Gauge, "Slots in the arena";
    SERVER_USED = "farcache_server_used_bytes", Gauge, "Slots in use times slot size, all tenants";
    SERVER_OVERHEAD = "farcache_server_overhead_bytes", Gauge, "Heap bytes of the index and bookkeeping beside the arena";
    SERVER_BLOCKS = "farcache_server_blocks", Gauge, "Blocks stored, all tenants";
    SERVER_CONNECTIONS = "farcache_server_connections_open", Gauge, "Connections open now";
    SERVER_ACCEPTED = "farcache_server_connections_accepted", Counter, "Connections accepted";
    SERVER_REFUSED = "farcache_server_connections_refused", Counter, "Connections turned away at max_connections";
    SERVER_PROTOCOL_ERRORS = "farcache_server_protocol_errors", Counter, "Malformed requests, and connections closed for bad input or failed handshakes";
    SERVER_TIMEOUTS = "farcache_server_timeouts", Counter, "Connections closed for idleness, slow frames, missing HELLO or unread answers";
    SERVER_PLACEMENT_SWAPS = "farcache_server_placement_swaps", Counter, "Blocks a tenant short of its allocation took from another tenant's blocks in a full shard (mrc placement)";
    TENANT_LIMIT = "farcache_server_tenant_limit_bytes", Gauge, "Most memory the tenant may hold";
    TENANT_USED = "farcache_server_tenant_used_bytes", Gauge, "Slots the tenant holds times slot size";
    TENANT_TARGET = "farcache_server_tenant_target_bytes", Gauge, "Memory the allocator gives the tenant now (server.allocation)";
    TENANT_MIN = "farcache_server_tenant_min_bytes", Gauge, "Memory always held for the tenant (min_bytes)";
    TENANT_BLOCKS = "farcache_server_tenant_blocks", Gauge, "Blocks the tenant has stored";
    TENANT_HITS = "farcache_server_tenant_hits", Counter, "GET keys found";
    TENANT_MISSES = "farcache_server_tenant_misses", Counter, "GET keys not found";
    TENANT_PUTS = "farcache_server_tenant_puts", Counter, "Blocks stored by PUT";
    TENANT_PUT_REJECTS = "farcache_server_tenant_put_rejects", Counter, "PUT entries refused (too large, or no room for the tenant)";
    TENANT_DELS = "farcache_server_tenant_dels", Counter, "Blocks removed by DEL";
    TENANT_EVICTIONS = "farcache_server_tenant_evictions", Counter, "Blocks evicted to make room";
    TENANT_BYTES_IN = "farcache_server_tenant_bytes_in", Counter, "Value bytes received by PUT";
    TENANT_BYTES_OUT = "farcache_server_tenant_bytes_out", Counter, "Value bytes sent in GET hits";
}

// A mount: `farcache mount`.
metrics! { MOUNT:
    MOUNT_INFO = "farcache_mount_info", Gauge, "1, labelled with the mount's version, mount point, backing directory, remote tier and routing mode";
    MOUNT_UPTIME = "farcache_mount_uptime_seconds", Gauge, "Seconds since the mount daemon started";
    REMOTE_GETS = "farcache_mount_remote_gets", Counter, "Blocks asked of lenders";
    REMOTE_HITS = "farcache_mount_remote_hits", Counter, "Blocks delivered by lenders";
    REMOTE_MISSES = "farcache_mount_remote_misses", Counter, "Blocks asked of lenders and not delivered";
    REMOTE_BYTES_FROM = "farcache_mount_remote_bytes_from_servers", Counter, "Block bytes received from lenders";
    REMOTE_BYTES_TO = "farcache_mount_remote_bytes_to_servers", Counter, "Block bytes stored on lenders";
    REMOTE_PUTS = "farcache_mount_remote_puts", Counter, "Blocks stored on lenders (fills acknowledged)";
    REMOTE_PUTS_DROPPED = "farcache_mount_remote_puts_dropped", Counter, "Fills not sent: queue full or no lender connected";
    REMOTE_PUTS_FAILED = "farcache_mount_remote_puts_failed", Counter, "Fills sent and not stored";
    REMOTE_PUTS_IN_FLIGHT = "farcache_mount_remote_puts_in_flight", Gauge, "Fills queued or on their way to a lender now (at most farcache_mount_remote_puts_bound)";
    REMOTE_PUTS_BOUND = "farcache_mount_remote_puts_bound", Gauge, "The bound on fills queued or in flight now: cache.max_pending_puts, or while the queue stands what the lenders' links carry in 50 ms at their measured pace";
    REMOTE_INVALIDATIONS_IN_FLIGHT = "farcache_mount_remote_invalidations_in_flight", Gauge, "Deletions queued or on their way to lenders now (at most cache.max_pending_dels)";
    REMOTE_INVALIDATIONS = "farcache_mount_remote_invalidations", Counter, "Cached blocks retired by writes, truncates and fallocates";
    REMOTE_INVALIDATIONS_DROPPED = "farcache_mount_remote_invalidations_dropped", Counter, "Deletions of retired blocks not sent (queue full)";
    REMOTE_FALLBACKS = "farcache_mount_remote_fallbacks", Counter, "Fetches that gave up (fetch_timeout or connection error) and went to the disk";
    REMOTE_REJECTED = "farcache_mount_remote_rejected", Counter, "Block answers refused for their length";
    REMOTE_AUTH_FAILURES = "farcache_mount_remote_auth_failures", Counter, "Block answers that failed authentication (key_file)";
    REMOTE_CONNECTS = "farcache_mount_remote_connects", Counter, "Connections made to lenders";
    REMOTE_CONNECT_FAILURES = "farcache_mount_remote_connect_failures", Counter, "Connection attempts to lenders that failed";
    REMOTE_FETCH_CONNECTS = "farcache_mount_remote_fetch_connects", Counter, "Fetch connections made to lenders (cache.fetch_connections)";
    REMOTE_FETCHES_POLLED = "farcache_mount_remote_fetches_polled", Counter, "Fetches on a fetch connection answered while the reading thread polled for the answer (cache.fetch_poll)";
    ENGINE_REMOTE_READS = "farcache_mount_engine_remote_reads", Counter, "Reads answered wholly from lenders";
    ENGINE_DISK_READS = "farcache_mount_engine_disk_reads", Counter, "Reads routed to lenders that went wholly to the disk";
    ENGINE_PARTIAL_HITS = "farcache_mount_engine_partial_hits", Counter, "Reads answered partly from lenders, partly from one disk read";
    ENGINE_PARTIAL_REMOTE_BLOCKS = "farcache_mount_engine_partial_remote_blocks", Counter, "Of partial hits, blocks served from lenders";
    ENGINE_PARTIAL_DISK_BLOCKS = "farcache_mount_engine_partial_disk_blocks", Counter, "Of partial hits, blocks read from the disk";
    ENGINE_PARTIAL_OVERLAPPED = "farcache_mount_engine_partial_overlapped", Counter, "Of partial hits, those whose disk read was in flight while the lenders were asked";
    ENGINE_SEQUENTIAL_BYPASSES = "farcache_mount_engine_sequential_bypasses", Counter, "Large reads threshold routing sent straight to the disk";
    ENGINE_FILLS = "farcache_mount_engine_fills", Counter, "Blocks sent to lenders after a disk read";
    ENGINE_SEED_FILLS = "farcache_mount_engine_seed_fills", Counter, "Of fills, seeds: blocks filled only for the routing's probes";
    ENGINE_FILLS_PENDING_SKIPPED = "farcache_mount_engine_fills_pending_skipped", Counter, "Blocks read again while their fill was on its way, not sent twice";
    ENGINE_READ_AROUNDS = "farcache_mount_engine_read_arounds", Counter, "Misses read with their read-around window";
    ENGINE_ADAPTIVE_REMOTE = "farcache_mount_engine_adaptive_remote", Counter, "Reads adaptive routing sent to the lenders";
    ENGINE_ADAPTIVE_DISK = "farcache_mount_engine_adaptive_disk", Counter, "Reads adaptive routing sent to the disk";
    ENGINE_ADAPTIVE_PROBES = "farcache_mount_engine_adaptive_probes", Counter, "Reads fetched from lenders anyway, to keep measuring them";
    ENGINE_CHANGED_BEHIND = "farcache_mount_engine_changed_behind", Counter, "Opens that found a file changed behind the mount";
    CPU_SECONDS = "farcache_mount_cpu_seconds", Counter, "CPU time the mount daemon has spent since it started, by mode (label mode: user, system)";
    MEMORY_RSS = "farcache_mount_memory_resident_bytes", Gauge, "The mount daemon's resident memory (VmRSS)";
    MEMORY_ANON = "farcache_mount_memory_anon_bytes", Gauge, "Of it anonymous (RssAnon), lazily freed pages included";
    MEMORY_LAZYFREE = "farcache_mount_memory_lazyfree_bytes", Gauge, "Of the anonymous memory, pages handed back with MADV_FREE";
    IO_BUFFERS = "farcache_mount_io_buffers_bytes", Gauge, "Pooled disk-read buffers held by reads and fills in flight";
    IO_BUFFERS_IDLE = "farcache_mount_io_buffers_idle_bytes", Gauge, "Pooled disk-read buffers idle, kept for the next reads";
    IO_BUFFERS_UNMAPPED = "farcache_mount_io_buffers_unmapped", Counter, "Disk-read buffers unmapped because the pool held its most idle";
    INDEX_MEMORY = "farcache_mount_index_memory_bytes", Gauge, "Heap bytes of the client-side index";
    INDEX_REMOTE_BLOCKS = "farcache_mount_index_remote_blocks", Gauge, "Blocks the index marks as held by a lender";
    INDEX_PER_GIB = "farcache_mount_index_bytes_per_gib_cached", Gauge, "Index bytes per GiB held on lenders";
    ROUTING_DISK_SHARE = "farcache_mount_routing_disk_share", Gauge, "Share of random reads adaptive routing sends to the disk (0 to 1; 0 under threshold routing)";
    ROUTING_DISK_WEIGHT = "farcache_mount_routing_disk_weight", Gauge, "What a random disk read counts against a lender hit, times its time: 1.1 on a rate-limited disk, down to 0.91 on one whose reads take as long however many it is asked for (0 under threshold routing)";
    LENDER_CONNECTED = "farcache_mount_lender_connected", Gauge, "1 while a connection to the lender is live";
    LENDER_CONNECTS = "farcache_mount_lender_connects", Counter, "Connections made to the lender since it joined the set";
    LENDER_HITS = "farcache_mount_lender_hits", Counter, "Blocks the lender delivered";
    LENDER_MISSES = "farcache_mount_lender_misses", Counter, "Blocks asked of (or placed on) the lender and not delivered";
    LENDER_PUTS = "farcache_mount_lender_puts", Counter, "Blocks the lender stored";
    BACKING_READS_DIRECT = "farcache_mount_backing_reads_direct", Counter, "Reads of backing files with O_DIRECT";
    BACKING_READS_BUFFERED = "farcache_mount_backing_reads_buffered", Counter, "Reads of backing files without O_DIRECT";
    BACKING_READ_BYTES = "farcache_mount_backing_read_bytes", Counter, "Bytes read from backing files";
    BACKING_WRITES = "farcache_mount_backing_writes", Counter, "Writes to backing files";
    BACKING_WRITE_BYTES = "farcache_mount_backing_write_bytes", Counter, "Bytes written to backing files";
    BACKING_FSYNCS = "farcache_mount_backing_fsyncs", Counter, "fsync and fdatasync calls passed to backing files";
    BACKING_FORGETS = "farcache_mount_backing_forgets", Counter, "Files that lost their last name";
    BACKING_WRITES_DIRECT = "farcache_mount_backing_writes_direct", Counter, "Writes to backing files with O_DIRECT";
    IO_OPS_URING = "farcache_mount_io_ops_uring", Counter, "Backing operations completed through io_uring";
    IO_WRITE_OPS = "farcache_mount_io_write_ops", Counter, "Of the backing operations, writes";
    IO_SYNC_OPS = "farcache_mount_io_sync_ops", Counter, "Of the backing operations, fsyncs and fdatasyncs";
    IO_OPS_SYNC = "farcache_mount_io_ops_sync", Counter, "Backing operations completed by synchronous system calls";
    IO_IN_FLIGHT = "farcache_mount_io_in_flight", Gauge, "Backing operations in flight now";
    IO_IN_FLIGHT_PEAK = "farcache_mount_io_in_flight_peak", Gauge, "Most backing operations ever in flight at once";
    IO_RINGS = "farcache_mount_io_rings", Gauge, "io_uring rings made";
    IO_WAITS_FOR_ROOM = "farcache_mount_io_waits_for_room", Counter, "Calls that waited because io_max_in_flight operations were in flight";
    IO_FALLBACK_NO_URING = "farcache_mount_io_fallback_no_uring", Counter, "Operations run synchronously because io_uring was unavailable";
    IO_FALLBACK_UNALIGNED_READS = "farcache_mount_io_fallback_unaligned_reads", Counter, "Direct reads off alignment, read through a bounce buffer";
    IO_FALLBACK_UNALIGNED_WRITES = "farcache_mount_io_fallback_unaligned_writes", Counter, "Writes to O_DIRECT files off alignment, written buffered";
    IO_FALLBACK_DIRECT_REFUSED = "farcache_mount_io_fallback_direct_refused", Counter, "Files whose file system refused O_DIRECT";
    IO_SHORT_RETRIES = "farcache_mount_io_short_retries", Counter, "Short transfers resubmitted for the rest";
    REMOTE_FETCH_SECONDS = "farcache_mount_remote_fetch_seconds", Histogram, "Time a read waited for lenders (hits, misses and timeouts alike)";
    REMOTE_FILL_SECONDS = "farcache_mount_remote_fill_seconds", Histogram, "Time from a fill being queued to its lender storing it";
    BACKING_READ_SECONDS = "farcache_mount_backing_read_seconds", Histogram, "Time of each backing read";
    BACKING_WRITE_SECONDS = "farcache_mount_backing_write_seconds", Histogram, "Time of each backing write";
    TIER_INFO = "farcache_mount_tier_info", Gauge, "1, labelled with the write-back tier's path, mode and what an acknowledged write survives (0, labels empty, without a tier)";
    TIER_CAPACITY = "farcache_mount_tier_capacity_bytes", Gauge, "Bytes of the write-back tier's log";
    TIER_USED = "farcache_mount_tier_used_bytes", Gauge, "Bytes of the log between its oldest live record and its head";
    TIER_DIRTY = "farcache_mount_tier_dirty_bytes", Gauge, "Bytes whose newest data is only in the tier";
    TIER_BROKEN = "farcache_mount_tier_broken", Gauge, "1 if the tier's medium failed (every write then goes through)";
    TIER_DESTAGE_STALLED = "farcache_mount_tier_destage_stalled", Gauge, "1 while the destage round under way has waited on the backing store past tier.stall_warning";
    TIER_WRITES = "farcache_mount_tier_writes", Counter, "Writes acknowledged by the tier";
    TIER_WRITE_BYTES = "farcache_mount_tier_write_bytes", Counter, "Bytes of writes acknowledged by the tier";
    TIER_GROUPS = "farcache_mount_tier_group_commits", Counter, "Group commits of the tier's log (each carries one or more appends; flushed unless all were unsynced writes)";
    TIER_FLUSHES = "farcache_mount_tier_flushes", Counter, "Flushes of the tier's medium";
    TIER_COMMITS = "farcache_mount_tier_commits", Counter, "Flushes asked for by an fsync, an O_DSYNC write or commit_interval (commit = fsync)";
    TIER_UNFLUSHED = "farcache_mount_tier_unflushed_bytes", Gauge, "Bytes of acknowledged writes waiting for the tier's flush (a power cut could take them)";
    TIER_COMMIT_FALLBACKS = "farcache_mount_tier_commit_fallbacks", Counter, "Commits the tier's medium failed, answered by syncing the file on the backing store";
    TIER_FSYNCS_ABSORBED = "farcache_mount_tier_fsyncs_absorbed", Counter, "fsyncs answered without the disk (data durable in the tier)";
    TIER_READS = "farcache_mount_tier_reads", Counter, "Reads that took at least one block from the tier";
    TIER_READS_WHOLE = "farcache_mount_tier_reads_whole", Counter, "Reads the tier answered whole, without the disk";
    TIER_THROUGH_FULL = "farcache_mount_tier_write_through_full", Counter, "Writes that went through because the tier was full";
    TIER_THROUGH_BROKEN = "farcache_mount_tier_write_through_broken", Counter, "Writes that went through because the tier's medium failed";
    TIER_THROUGH_SEQUENTIAL = "farcache_mount_tier_write_through_sequential", Counter, "Writes of a long unsynced sequential run sent to the backing store (tier.sequential_cutoff)";
    TIER_THROUGH_SEQUENTIAL_BYTES = "farcache_mount_tier_write_through_sequential_bytes", Counter, "Bytes of those writes";
    TIER_DESTAGE_ROUNDS = "farcache_mount_tier_destage_rounds", Counter, "Destage rounds run";
    TIER_DESTAGE_DEEP = "farcache_mount_tier_destage_batches_deep", Counter, "Destage batches written all at once because the mount was idle (else four writes at a time)";
    TIER_DESTAGED_BLOCKS = "farcache_mount_tier_destaged_blocks", Counter, "Blocks written back to the backing store";
    TIER_DESTAGED_BYTES = "farcache_mount_tier_destaged_bytes", Counter, "Bytes written back to the backing store";
    TIER_DESTAGE_FS_SYNCS = "farcache_mount_tier_destage_fs_syncs", Counter, "Syncs of the backing file system that made a destage batch of several files durable at once";
    TIER_OPEN_FILES = "farcache_mount_tier_open_files", Gauge, "Backing files the write-back tier holds a descriptor of now";
    TIER_MAX_OPEN_FILES = "farcache_mount_tier_max_open_files", Gauge, "The most backing-file descriptors the tier keeps while idle (tier.max_open_files)";
    TIER_REOPENS = "farcache_mount_tier_reopens", Counter, "Backing files the tier opened again after letting go of their descriptors";
    TIER_DISCARDED_BLOCKS = "farcache_mount_tier_discarded_blocks", Counter, "Dirty blocks of deleted files dropped instead of written back";
    TIER_DESTAGE_ERRORS = "farcache_mount_tier_destage_errors", Counter, "Destage rounds that failed (data kept dirty, retried with back-off)";
    TIER_DESTAGE_STALLS = "farcache_mount_tier_destage_stalls", Counter, "Destage rounds that waited on the backing store past tier.stall_warning";
    UNION_BRANCHES = "farcache_mount_union_branches", Gauge, "Backing branches of the mount (1 for one backing directory)";
    UNION_MOVES = "farcache_mount_union_moves", Counter, "Files moved to another branch by farcache balance";
    UNION_MOVED_BYTES = "farcache_mount_union_moved_bytes", Counter, "Bytes of files moved to another branch";
    UNION_MOVE_FAILURES = "farcache_mount_union_move_failures", Counter, "Moves given up on an error (the file stays where it was, whole)";
    UNION_RACES = "farcache_mount_union_races", Counter, "Copies found stale at the switch (the file changed during the copy)";
    UNION_RETRIES = "farcache_mount_union_retries", Counter, "Copies made again after a race";
    UNION_BLOCKS_FROM_CACHE = "farcache_mount_union_blocks_from_cache", Counter, "Blocks of moved files copied from lenders' RAM or the write-back tier";
    UNION_BLOCKS_FROM_TIER = "farcache_mount_union_blocks_from_tier", Counter, "Blocks of moved files copied from the write-back tier (of those from the cache)";
    UNION_BLOCKS_FROM_DISK = "farcache_mount_union_blocks_from_disk", Counter, "Blocks of moved files read from the source disk";
    UNION_ID_FAILURES = "farcache_mount_union_id_failures", Counter, "Files that could not be given a farcache id (never moved)";
    UNION_AUTO_ACTIVE = "farcache_mount_union_auto_active", Gauge, "1 while the automatic balancer is between a start and a stop";
    UNION_AUTO_CHECKS = "farcache_mount_union_auto_checks", Counter, "Intervals whose load the automatic balancer read";
    UNION_AUTO_ROUNDS = "farcache_mount_union_auto_rounds", Counter, "Rounds of moves the automatic balancer ran";
    UNION_AUTO_MOVES = "farcache_mount_union_auto_moves", Counter, "Files the automatic balancer moved";
    UNION_AUTO_SKIPS = "farcache_mount_union_auto_skips", Counter, "Automatic rounds not started because a balance asked for was running";
    UNION_COPY_YIELDS = "farcache_mount_union_copy_yields", Counter, "Waits of copies of moves before reading the source disk again, for the applications' I/O on their branches";
    UNION_COPY_YIELD_BOUNDED = "farcache_mount_union_copy_yield_bounded", Counter, "Of those, the waits that ran to their bound (the foreground never paused)";
    UNION_COPY_YIELD_WAIT_MS = "farcache_mount_union_copy_yield_wait_milliseconds", Counter, "Milliseconds copies of moves waited for the applications' I/O";
    UNION_COPY_LENDER_YIELDS = "farcache_mount_union_copy_lender_yields", Counter, "Waits of copies of moves before fetching from the lenders again (the applications' lender reads share the link)";
    UNION_COPY_LENDER_YIELD_WAIT_MS = "farcache_mount_union_copy_lender_yield_wait_milliseconds", Counter, "Milliseconds copies of moves waited before fetching from the lenders again";
    FUSE_INODES = "farcache_mount_inodes", Gauge, "Inodes the mount knows now (looked up by the kernel and not forgotten)";
    FUSE_INODE_FDS = "farcache_mount_inode_fds", Gauge, "Descriptors the inode table holds now, where RLIMIT_NOFILE is below mount.max_inodes (0 otherwise)";
    FUSE_INODE_FD_BUDGET = "farcache_mount_inode_fd_budget", Gauge, "The most descriptors the inode table holds (a quarter of RLIMIT_NOFILE), 0 when it holds one per inode";
    FUSE_INODE_REOPENS = "farcache_mount_inode_reopens", Counter, "Inodes reopened by file handle after their descriptors were let go of";
    FUSE_READ_AHEAD = "farcache_mount_read_ahead_bytes", Gauge, "The kernel's readahead window for the mount now (its bdi's read_ahead_kb; mount.read_ahead), 0 where it cannot be read";
    FUSE_RING_ACTIVE = "farcache_mount_fuse_ring_active", Gauge, "1 while FUSE-over-io_uring serves the mount's requests, 0 with /dev/fuse read loops";
    FUSE_RING_REQUESTS = "farcache_mount_fuse_ring_requests", Counter, "Requests received and answered over FUSE-over-io_uring";
    FUSE_RING_COMMIT_ERRORS = "farcache_mount_fuse_ring_commit_errors", Counter, "Ring replies the kernel refused";
    FUSE_REQUESTS = "farcache_mount_fuse_requests", Counter, "FUSE requests received, by opcode (label op: getattr, write, lseek, ..., other)";
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = include_str!("../../../../docs/METRICS.md");

    #[test]
    fn names_are_unique_well_formed_and_documented() {
        let mut exposed: Vec<String> = SERVER.iter().chain(MOUNT).map(Metric::exposed).collect();
        for (m, e) in SERVER.iter().chain(MOUNT).zip(&exposed) {
            assert!(m.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'), "{}", m.name);
            assert!(!m.name.ends_with("_total"), "{}: the encoder adds _total", m.name);
            assert!(m.kind != Kind::Histogram || m.name.ends_with("_seconds"), "{}", m.name);
            assert!(!m.help.is_empty(), "{e} has no help");
        }
        let n = exposed.len();
        exposed.sort();
        exposed.dedup();
        assert_eq!(exposed.len(), n, "a name is defined twice");
        assert_eq!(
            farcache_testkit::documented_metric_names(DOC),
            exposed,
            "docs/METRICS.md's Prometheus section and metrics/names.rs differ"
        );
    }

    const DASHBOARD: &str = include_str!("../../../../etc/grafana/farcache.json");

    /// Every PromQL string of a Grafana dashboard: targets' `expr` and variables' queries
    /// (a datasource variable's query is a plugin name, not PromQL).
    fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) if m.get("type").and_then(|t| t.as_str()) == Some("datasource") => {}
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("expr" | "definition" | "query", serde_json::Value::String(q)) => out.push(q.clone()),
                        _ => queries(x, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| queries(x, out)),
            _ => {}
        }
    }

    /// The identifiers of a PromQL expression that start with `farcache_`.
    fn farcache_names(q: &str) -> Vec<&str> {
        q.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .filter(|w| w.starts_with("farcache_"))
            .collect()
    }

    /// Every `farcache_` name in `queries` is one `/metrics` exports (a histogram read as
    /// `_bucket`, `_sum` or `_count`), and each query names at least one; the names used.
    fn check_queries(origin: &str, queries: &[String]) -> std::collections::HashSet<String> {
        let exported: Vec<String> = SERVER.iter().chain(MOUNT).map(Metric::exposed).collect();
        let histograms: Vec<&str> =
            SERVER.iter().chain(MOUNT).filter(|m| m.kind == Kind::Histogram).map(|m| m.name).collect();
        let mut used = std::collections::HashSet::new();
        for q in queries {
            let names = farcache_names(q);
            assert!(!names.is_empty(), "{origin}: a query names no farcache metric: {q}");
            for n in names {
                let ok = exported.iter().any(|e| e == n)
                    || histograms.iter().any(|h| ["_bucket", "_sum", "_count"].iter().any(|s| n == format!("{h}{s}")));
                assert!(ok, "{origin} queries {n}, which /metrics does not export: {q}");
                used.insert(n.to_string());
            }
        }
        used
    }

    #[test]
    fn every_dashboard_query_names_only_exported_metrics() {
        let dash: serde_json::Value = serde_json::from_str(DASHBOARD).expect("etc/grafana/farcache.json is JSON");
        assert!(dash["title"].is_string() && dash["panels"].is_array(), "not a Grafana dashboard");
        let mut qs = Vec::new();
        queries(&dash, &mut qs);
        assert!(qs.len() >= 20, "only {} queries found", qs.len());
        let used = check_queries("etc/grafana/farcache.json", &qs);
        // The dashboard shows each tier's hits and latency at least.
        for n in [
            "farcache_mount_remote_hits_total",
            "farcache_mount_remote_fetch_seconds_bucket",
            "farcache_server_tenant_hits_total",
        ] {
            assert!(used.contains(n), "the dashboard never shows {n}");
        }
    }

    #[test]
    fn every_alert_rule_names_only_exported_metrics() {
        const RULES: &str = include_str!("../../../../etc/prometheus/farcache-alerts.yml");
        let doc: serde_yaml::Value = serde_yaml::from_str(RULES).expect("etc/prometheus/farcache-alerts.yml is YAML");
        let rules: Vec<&serde_yaml::Value> = doc["groups"]
            .as_sequence()
            .expect("groups")
            .iter()
            .flat_map(|g| g["rules"].as_sequence().expect("rules"))
            .collect();
        assert!(rules.len() >= 8, "only {} rules", rules.len());
        for r in &rules {
            assert!(r["alert"].is_string() && r["annotations"]["summary"].is_string(), "{r:?}");
        }
        let qs: Vec<String> = rules.iter().map(|r| r["expr"].as_str().expect("expr").to_string()).collect();
        let used = check_queries("etc/prometheus/farcache-alerts.yml", &qs);
        // docs/DEPLOY.md's table and the rules alert on the same things.
        let deploy = include_str!("../../../../docs/DEPLOY.md");
        let table = deploy.split("## What to alert on").nth(1).expect("DEPLOY.md: ## What to alert on");
        for n in &used {
            assert!(table.contains(n.as_str()), "docs/DEPLOY.md's alert table does not mention {n}");
        }
    }
}
