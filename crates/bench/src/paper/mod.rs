//! `farcache bench paper`: paper 000's evaluation (../shared/seeds/, Tables 4–10) reproduced
//! on one machine, every configuration in the same run, side by side.
//!
//! - [`testbed`]: the slow disk (loop device, ext4, blkio throttling), the lenders' network
//!   namespaces and links; torn down in reverse order however the run ends. [`cleanup`]
//!   removes what a killed run left behind (`--cleanup`).
//! - [`run`]: each experiment × access size × configuration: `native` (ext4 directly),
//!   `passthrough` (`farcache mount --no-remote`), `farcache` (mount + lenders), `ideal`
//!   (ext4 directly, no memory limit). Client processes (the load generator [`worker`] and
//!   the mount daemon) run inside one memory cgroup per configuration and the throttled
//!   blkio cgroup; every pass starts from a cold local cache and fresh lenders.
//! - [`pgbench`] and [`tpch`]: PostgreSQL 15 on each configuration (pgbench; the TPC-H-like
//!   load, power and throughput tests of Tables 8/10).
//! - [`tenants`]: paper 004's three PostgreSQL tenants, each with its own disk, memory cgroup
//!   and `--tenant` mount, sharing one lender under each allocation mode.
//! - [`oltp`]: paper 002's OLTP figures — go-tpc's TPC-C-like load on PostgreSQL 15 by
//!   connections, block-layer scheduler and CPUs.
//! - [`report`]: JSON, markdown tables with ratios, sanity checks, the targets.

/// A line on stderr about the run, above the progress bar when one is up
/// ([`crate::progress::say`]).
macro_rules! note {
    ($($t:tt)*) => { $crate::progress::say(format!($($t)*)) };
}

pub mod cgroup;
pub mod child;
pub mod cleanup;
pub mod counters;
pub mod engine;
pub mod migrate;
pub mod mount;
pub mod oltp;
pub mod pgbench;
pub mod report;
pub mod run;
pub mod sys;
pub mod tenants;
pub mod testbed;
pub mod tpch;
pub mod worker;
pub mod writeback;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use report::{render, PaperReport};
pub use run::run;
pub use testbed::DiskProfile;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The paper's experiments (`transfers`, Table 9, is a view of the others' counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Experiment {
    /// Table 4: the whole file read sequentially, twice.
    Seqread,
    /// Tables 5/6: random 4 KiB reads until the access size is read, twice, same sequence.
    Randread,
    /// PostgreSQL 15, pgbench select-only and TPC-B-like, on a database about twice the
    /// client's memory (no table in the paper; issue 4).
    Pgbench,
    /// Tables 8/10 (DBT-3, TPC-H-like): PostgreSQL 15 on a TPC-H database of 2–4× the
    /// client's memory (`tpchgen-cli` data): load test, power test, throughput test.
    Tpch,
    /// Paper 003, Table 1 / Fig. 6: Postmark (Debian's `postmark`), small, medium and large
    /// files ([`writeback`]).
    Postmark,
    /// Paper 003, Fig. 7: TestDFSIO-like sequential writes then reads, one large file and
    /// several of 100 MB, caches dropped in between ([`writeback`]).
    Dfsio,
    /// Durable small writes: 4 KiB `pwrite` + `fdatasync`, 1 and 32 writers ([`writeback`]).
    Durable,
    /// The tier's write-back: how fast a randomly written region goes to the disk against
    /// the disk's own sequential writes, and what a durable writer sees meanwhile
    /// ([`writeback`]).
    Destage,
    /// Paper 002: fio 4 KiB random reads and writes, O_DIRECT, queue depth 1–32, 1 and 4
    /// jobs on one file ([`engine`]).
    Engine,
    /// Paper 002's serialization test: 1–16 processes of synchronous 8 KiB reads of one file,
    /// and the disk's queue depth ([`engine`]).
    Serial,
    /// Paper 001: half of the files moved from one disk to another during random whole-file
    /// reads, copied from lenders' RAM vs from the disk ([`migrate`]).
    Migrate,
    /// Paper 004: three PostgreSQL tenants (TPC-H Q4 at scale factors 1:2:3) sharing one
    /// lender, under each allocation mode ([`tenants`]).
    Tenants,
    /// Paper 002's OLTP figures: go-tpc's TPC-C-like load on PostgreSQL 15, tpmC by
    /// connections, loop-device scheduler and CPUs ([`oltp`]).
    Oltp,
}

impl Experiment {
    pub fn name(self) -> &'static str {
        match self {
            Experiment::Seqread => "seqread",
            Experiment::Randread => "randread",
            Experiment::Pgbench => "pgbench",
            Experiment::Tpch => "tpch",
            Experiment::Postmark => "postmark",
            Experiment::Dfsio => "dfsio",
            Experiment::Durable => "durable",
            Experiment::Destage => "destage",
            Experiment::Engine => "engine",
            Experiment::Serial => "serial",
            Experiment::Migrate => "migrate",
            Experiment::Tenants => "tenants",
            Experiment::Oltp => "oltp",
        }
    }

    /// Paper 003's experiments: the write-back tier against the backing alone, in the
    /// configurations [`ConfigKind::TIER_SET`].
    pub fn of_the_tier(self) -> bool {
        matches!(self, Experiment::Postmark | Experiment::Dfsio | Experiment::Durable | Experiment::Destage)
    }

    /// Paper 002's experiments ([`engine`]).
    pub fn of_the_engine(self) -> bool {
        matches!(self, Experiment::Engine | Experiment::Serial)
    }

    /// The configurations this experiment runs in.
    pub fn own_configs(self) -> &'static [ConfigKind] {
        match self {
            e if e.of_the_tier() => &ConfigKind::TIER_SET,
            Experiment::Engine => &[
                ConfigKind::Native,
                ConfigKind::Passthrough,
                ConfigKind::PassthroughRing,
                ConfigKind::PassthroughKernel,
                ConfigKind::Farcache,
            ],
            Experiment::Serial => {
                &[ConfigKind::Native, ConfigKind::Passthrough, ConfigKind::PassthroughKernel, ConfigKind::Serialized]
            }
            Experiment::Migrate | Experiment::Tenants => &[ConfigKind::Farcache],
            Experiment::Oltp => {
                &[ConfigKind::Native, ConfigKind::Passthrough, ConfigKind::Farcache, ConfigKind::PassthroughKernel]
            }
            _ => &ConfigKind::ALL,
        }
    }

    /// Whether `cfg` is one of this experiment's configurations: its own, and for pgbench
    /// also the write-back tier's (TPC-B with the tier, issue 12; asked for with --configs).
    pub fn runs_in(self, cfg: ConfigKind) -> bool {
        self.own_configs().contains(&cfg) || (self == Experiment::Pgbench && cfg.has_tier())
    }

    pub fn table(self) -> &'static str {
        match self {
            Experiment::Seqread => "Table 4",
            Experiment::Randread => "Tables 5/6",
            Experiment::Pgbench => "issue 4",
            Experiment::Tpch => "Tables 8/10",
            Experiment::Postmark => "paper 003, Table 1",
            Experiment::Dfsio => "paper 003, TestDFSIO",
            Experiment::Durable => "issue 12",
            Experiment::Destage => "issue 12, destage",
            Experiment::Engine => "paper 002, issue 11",
            Experiment::Serial => "paper 002's serialization test",
            Experiment::Migrate => "paper 001, issue 14",
            Experiment::Tenants => "paper 004, issue 13",
            Experiment::Oltp => "paper 002's OLTP, issue 11",
        }
    }

    /// Whether it runs once per access size (seqread, randread) rather than once.
    pub fn per_size(self) -> bool {
        matches!(self, Experiment::Seqread | Experiment::Randread)
    }
}

/// What sits between the application and the slow disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigKind {
    /// ext4 directly, in the same memory cgroup.
    Native,
    /// `farcache mount --no-remote`: the FUSE passthrough, no lenders.
    Passthrough,
    /// `farcache mount --server ...`: lenders' RAM below the page cache.
    Farcache,
    /// ext4 directly with no memory limit: everything fits in local RAM (the ceiling).
    Ideal,
    /// `farcache mount --no-remote --tier FILE` with the tier file on tmpfs (`dram`, paper
    /// 003's emulation of persistent memory).
    #[serde(rename = "tier-dram")]
    TierDram,
    /// `farcache mount --no-remote --tier FILE` with the tier file on the machine's own fast
    /// disk (`ssd`: O_DIRECT and fdatasync).
    #[serde(rename = "tier-ssd")]
    TierSsd,
    /// The whole stack: lenders' RAM below the page cache (as `farcache`) and a write-back
    /// tier on tmpfs in front (as `tier-dram`). For TPC-B with the tier (issue 12): the tier
    /// takes the writes, the lenders the reads.
    #[serde(rename = "farcache-tier")]
    FarcacheTier,
    /// `farcache mount --no-remote` serving one request at a time (one FUSE thread, the
    /// synchronous engine): paper 002's serialized I/O, for its comparison only.
    Serialized,
    /// `farcache mount --no-remote --fuse-uring on`: the passthrough with FUSE-over-io_uring
    /// instead of `/dev/fuse` read loops (issue 11; the kernel's switch is turned on for it
    /// and restored after).
    #[serde(rename = "passthrough-ring")]
    PassthroughRing,
    /// `farcache mount --no-remote --kernel-passthrough`: the kernel serves the files' reads
    /// and writes from the backing files, without the daemon (issue 11).
    #[serde(rename = "passthrough-kernel")]
    PassthroughKernel,
}

impl ConfigKind {
    /// Paper 000's configurations (seqread, randread, pgbench, tpch).
    pub const ALL: [ConfigKind; 4] =
        [ConfigKind::Native, ConfigKind::Passthrough, ConfigKind::Farcache, ConfigKind::Ideal];
    /// Paper 003's: the backing alone, the mount without a tier, the mount with each tier.
    pub const TIER_SET: [ConfigKind; 4] =
        [ConfigKind::Native, ConfigKind::Passthrough, ConfigKind::TierDram, ConfigKind::TierSsd];

    pub fn name(self) -> &'static str {
        match self {
            ConfigKind::Native => "native",
            ConfigKind::Passthrough => "passthrough",
            ConfigKind::Farcache => "farcache",
            ConfigKind::Ideal => "ideal",
            ConfigKind::TierDram => "tier-dram",
            ConfigKind::TierSsd => "tier-ssd",
            ConfigKind::FarcacheTier => "farcache-tier",
            ConfigKind::Serialized => "serialized",
            ConfigKind::PassthroughRing => "passthrough-ring",
            ConfigKind::PassthroughKernel => "passthrough-kernel",
        }
    }

    pub fn through_mount(self) -> bool {
        matches!(
            self,
            ConfigKind::Passthrough
                | ConfigKind::Farcache
                | ConfigKind::TierDram
                | ConfigKind::TierSsd
                | ConfigKind::FarcacheTier
                | ConfigKind::Serialized
                | ConfigKind::PassthroughRing
                | ConfigKind::PassthroughKernel
        )
    }

    /// Whether the mount has a write-back tier.
    pub fn has_tier(self) -> bool {
        matches!(self, ConfigKind::TierDram | ConfigKind::TierSsd | ConfigKind::FarcacheTier)
    }

    /// Whether it borrows lenders' RAM.
    pub fn has_lenders(self) -> bool {
        matches!(self, ConfigKind::Farcache | ConfigKind::FarcacheTier)
    }
}

impl std::str::FromStr for ConfigKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ConfigKind::ALL.into_iter().chain(ConfigKind::TIER_SET).chain([ConfigKind::Serialized, ConfigKind::FarcacheTier, ConfigKind::PassthroughRing, ConfigKind::PassthroughKernel]).find(|c| c.name() == s).ok_or_else(|| {
            format!("unknown configuration {s:?}: native, passthrough, passthrough-ring, passthrough-kernel, farcache, ideal, tier-dram, tier-ssd, farcache-tier or serialized")
        })
    }
}

impl std::str::FromStr for Experiment {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "seqread" => Ok(Experiment::Seqread),
            "randread" => Ok(Experiment::Randread),
            "pgbench" => Ok(Experiment::Pgbench),
            "tpch" => Ok(Experiment::Tpch),
            "postmark" => Ok(Experiment::Postmark),
            "dfsio" => Ok(Experiment::Dfsio),
            "durable" => Ok(Experiment::Durable),
            "destage" => Ok(Experiment::Destage),
            "engine" => Ok(Experiment::Engine),
            "serial" => Ok(Experiment::Serial),
            "migrate" => Ok(Experiment::Migrate),
            "tenants" => Ok(Experiment::Tenants),
            "oltp" => Ok(Experiment::Oltp),
            _ => Err(format!(
                "unknown experiment {s:?}: seqread, randread, pgbench, tpch (transfers comes with each); postmark, \
                 dfsio, durable, destage (paper 003); engine, serial, oltp (paper 002); migrate (paper 001); tenants (paper 004)"
            )),
        }
    }
}

/// Everything a run needs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PaperOptions {
    /// The `farcache` binary (mount, server, and the load generator `bench paper-worker`).
    #[serde(skip)]
    pub exe: PathBuf,
    pub quick: bool,
    pub experiments: Vec<Experiment>,
    /// Access sizes (= file sizes), the same for every experiment.
    pub sizes_bytes: Vec<u64>,
    pub configs: Vec<ConfigKind>,
    pub profile: DiskProfile,
    /// The client's memory cgroup limit (application + mount daemon).
    pub memory_bytes: u64,
    pub lenders: usize,
    /// What each lender lends.
    pub lender_capacity_bytes: u64,
    /// TBF rate of each lender's link ("1gbit", "10gbit"), or none.
    pub link_rate: Option<String>,
    /// `--client-cpus N`: the client — everything the harness starts but the lenders (the
    /// application, the mount daemon, the load generators, the harness itself) — on the
    /// first N CPUs, the lenders on the others, as if they were other machines. `None`: all
    /// share every CPU.
    #[serde(default)]
    pub client_cpus: Option<u32>,
    /// The lenders' eviction policy (default: the server's default).
    pub policy: Option<String>,
    /// farcache's routing rule (`--routing` of its mounts; default: the mount's default).
    #[serde(default)]
    pub routing: Option<String>,
    /// A configuration file every mount of the run is started with (`--config`): an A/B of
    /// any `[mount]`/`[cache]`/`[tier]` setting, e.g. `mount.writeback_cache`.
    #[serde(default)]
    pub mount_config: Option<PathBuf>,
    /// `--watch-stats`: each mount's counters (the passthrough's too) recorded this often (ms) in
    /// [`Self::stats_dir`] (`farcache stats MNT --watch`), for diagnosis; none: not recorded.
    #[serde(default)]
    pub watch_stats_ms: Option<u64>,
    /// Where the `--watch-stats` series go (OUT/stats).
    #[serde(skip)]
    pub stats_dir: PathBuf,
    pub seed: u64,
    /// O_DIRECT 4 KiB reads per probe (the disk's and a remote hit's read time); 0 = none.
    pub probe_reads: u64,
    /// Seconds of each pgbench run.
    #[serde(default)]
    pub pgbench_secs: u64,
    /// Client counts of the pgbench runs.
    #[serde(default)]
    pub pgbench_clients: Vec<u32>,
    /// tpch: the TPC-H scale factor; none: about three times the client's memory
    /// ([`tpch::scale_factor`]).
    #[serde(default)]
    pub tpch_scale_factor: Option<f64>,
    /// tpch: every query's statement_timeout.
    #[serde(default)]
    pub tpch_statement_timeout_secs: u64,
    /// tpch: the whole experiment's deadline, shared equally by the configurations.
    #[serde(default)]
    pub tpch_deadline_secs: u64,
    /// Paper 003: the write-back tier's size (tier-dram, tier-ssd).
    #[serde(default)]
    pub tier_bytes: u64,
    /// Paper 003: the tier's commit (`--tier-commit`), or the mount's default.
    #[serde(default)]
    pub tier_commit: Option<String>,
    /// Paper 003: the tier's sequential cutoff in bytes (`--tier-sequential-cutoff`), or the
    /// mount's default.
    #[serde(default)]
    pub tier_sequential_cutoff: Option<u64>,
    /// postmark: the share of Table 1's transactions run (1.0: the paper's).
    #[serde(default)]
    pub postmark_scale: f64,
    /// postmark: the share of Table 1's files (1.0: the paper's; the working set against the
    /// client's memory is what decides whether the page cache absorbs the run).
    #[serde(default = "one")]
    pub postmark_files_scale: f64,
    /// dfsio: the one large file's size (the paper's 100–800 MB); the several files are
    /// [`writeback::DFSIO_FILES`] of an eighth of it each (100 MB at the default 800 MiB).
    #[serde(default)]
    pub dfsio_bytes: u64,
    /// durable: seconds of each load.
    #[serde(default)]
    pub durable_secs: u64,
    /// destage: the region written at random into the tier, then written back (and, without
    /// a tier, written sequentially: the disk's own rate).
    #[serde(default)]
    pub destage_bytes: u64,
    /// engine, serial: the file's size, and seconds of each fio point.
    #[serde(default)]
    pub engine_file_bytes: u64,
    #[serde(default)]
    pub engine_secs: u64,
    /// engine: fio points of these kinds only ("randread", "randwrite"; empty: both).
    #[serde(default)]
    pub engine_rw: Vec<String>,
    /// engine: these queue depths only (empty: all of `engine::QUEUE_DEPTHS`).
    #[serde(default)]
    pub engine_qds: Vec<u32>,
    /// engine: each fio point in every configuration before the next point (a fresh mount
    /// for each), so that the machine's drift falls on every configuration alike.
    #[serde(default)]
    pub engine_interleave: bool,
    /// migrate: files of 4 MiB on the first disk (half of them move).
    #[serde(default)]
    pub migrate_files: u64,
    /// migrate: foreground reader threads, one configuration each.
    #[serde(default)]
    pub migrate_threads: Vec<u32>,
    /// migrate: copy sources ("cache", "disk"), one configuration each.
    #[serde(default)]
    pub migrate_sources: Vec<String>,
    /// migrate: seconds of foreground before and after the migration.
    #[serde(default)]
    pub migrate_phase_secs: u64,
    /// migrate: the lender's size when `--lender-capacity` is given (else
    /// [`migrate::lender_bytes`]: a little more than half of the files).
    #[serde(default)]
    pub migrate_lender_bytes: Option<u64>,
    /// migrate: configurations an earlier run finished (`--resume`), kept rather than run.
    #[serde(skip)]
    pub migrate_resume: Vec<migrate::MigrateRecord>,
    /// tenants: the three tenants' TPC-H scale factors (the paper's 0.25, 0.5, 0.75; ratio 1:2:3).
    #[serde(default)]
    pub tenants_sf: Vec<f64>,
    /// tenants: runs of the query per tenant (the paper: 10).
    #[serde(default)]
    pub tenants_runs: u32,
    /// tenants: the lender's capacity points, as shares of the databases' total size.
    #[serde(default)]
    pub tenants_capacity: Vec<f64>,
    /// tenants: the lender's allocation modes, one point each.
    #[serde(default)]
    pub tenants_modes: Vec<String>,
    /// tenants: what each tenant runs.
    #[serde(default = "q4")]
    pub tenants_query: tenants::TenantsQuery,
    /// tenants: each tenant's memory cgroup (PostgreSQL + its mount daemon).
    #[serde(default)]
    pub tenants_memory_bytes: u64,
    /// tenants: before each run, drop the clean pages of the tenant's database from the page
    /// cache (through its mount), so that every run reads its data below the page cache, as
    /// in the paper, where the data was several times the VMs' memory.
    #[serde(default)]
    pub tenants_drop_cache: bool,
    /// tenants: the mounts' `[cache] threshold` under `routing = "threshold"` (none: the
    /// mount's defaults, adaptive routing). 1 MiB sends the 128 KiB readahead of sequential
    /// scans to the lender (the default threshold, 128 KiB, sends it to the disk).
    #[serde(default)]
    pub tenants_threshold: Option<u64>,
    /// tenants: run the lender with the three tenants configured (`[[server.tenant]]`, each
    /// with a secret its mount presents) and each guaranteed this percent of the lender's
    /// capacity as `min_bytes`, so that "zero min_bytes violations" is a real check (open
    /// mode, the default, has every minimum at 0).
    #[serde(default)]
    pub tenants_min_percent: Option<u32>,
    /// tenants: points the results file already holds (kept, not run again).
    #[serde(skip)]
    pub tenants_resume: Vec<tenants::TenantsRecord>,
    #[serde(skip)]
    pub tenants_resume_setup: Option<tenants::TenantsSetup>,
    /// oltp: warehouses (none: about three times the client's memory, [`oltp::warehouses_for`]).
    #[serde(default)]
    pub oltp_warehouses: Option<u32>,
    /// oltp: go-tpc connection counts of the `connections` series.
    #[serde(default)]
    pub oltp_connections: Vec<u32>,
    /// oltp: seconds of each point.
    #[serde(default)]
    pub oltp_secs: u64,
    /// oltp: the loop device's schedulers of the `scheduler` series.
    #[serde(default)]
    pub oltp_schedulers: Vec<String>,
    /// oltp: CPU counts of the `cpus` series (a cpuset of the first N CPUs).
    #[serde(default)]
    pub oltp_cpus: Vec<u32>,
    /// oltp: the connection count of the scheduler and CPU series.
    #[serde(default)]
    pub oltp_point_connections: u32,
    /// oltp: the configurations that run the scheduler and CPU series (empty: all).
    #[serde(default)]
    pub oltp_point_configs: Vec<ConfigKind>,
    /// oltp: points an earlier run finished (`--resume`), kept rather than run.
    #[serde(skip)]
    pub oltp_resume: Vec<oltp::OltpRecord>,
    #[serde(skip)]
    pub oltp_resume_setup: Option<oltp::OltpSetup>,
}

impl PaperOptions {
    /// The paper's environment B on the `cloud` disk: 512 MiB client, one lender of
    /// 1.2 GiB over 1 Gbit/s, access sizes 64 MiB … 2 GiB.
    pub fn full(exe: PathBuf) -> PaperOptions {
        PaperOptions {
            exe,
            quick: false,
            experiments: vec![Experiment::Seqread, Experiment::Randread, Experiment::Pgbench, Experiment::Tpch],
            sizes_bytes: vec![64 * MIB, 128 * MIB, 256 * MIB, 512 * MIB, GIB, 2 * GIB],
            configs: ConfigKind::ALL.to_vec(),
            profile: DiskProfile::Cloud,
            memory_bytes: 512 * MIB,
            lenders: 1,
            lender_capacity_bytes: 1228 * MIB,
            link_rate: Some("1gbit".into()),
            client_cpus: None,
            policy: None,
            routing: None,
            mount_config: None,
            watch_stats_ms: None,
            stats_dir: PathBuf::new(),
            seed: 0x000D_C5EE,
            probe_reads: 3000,
            pgbench_secs: 30,
            pgbench_clients: vec![1, 4, 16],
            tpch_scale_factor: None,
            tpch_statement_timeout_secs: 600,
            tpch_deadline_secs: 4 * 3600,
            tier_bytes: 2 * GIB,
            tier_commit: None,
            tier_sequential_cutoff: None,
            postmark_scale: 1.0,
            postmark_files_scale: 1.0,
            dfsio_bytes: 800 * MIB,
            durable_secs: 20,
            destage_bytes: 512 * MIB,
            engine_file_bytes: GIB,
            engine_secs: 10,
            engine_rw: Vec::new(),
            engine_qds: Vec::new(),
            engine_interleave: false,
            // Paper 001 used 1,024 files; 128 (512 MiB) keeps a full run (2 sources × 3
            // thread counts, each warmed through 200-IOPS disks) under 15 minutes.
            migrate_files: 128,
            migrate_threads: vec![1, 2, 3],
            migrate_sources: vec!["cache".into(), "disk".into()],
            migrate_phase_secs: 20,
            migrate_lender_bytes: None,
            migrate_resume: Vec::new(),
            // Scaled down from the paper's 0.25 / 0.5 / 0.75 (same ratio) to fit a session.
            tenants_sf: vec![0.05, 0.1, 0.15],
            tenants_runs: 10,
            tenants_capacity: vec![tenants::PAPER_FRACTION],
            tenants_modes: tenants::MODES.iter().map(|m| m.to_string()).collect(),
            tenants_query: tenants::TenantsQuery::Q4,
            tenants_memory_bytes: 128 * MIB,
            tenants_drop_cache: false,
            tenants_threshold: Some(MIB),
            tenants_min_percent: None,
            tenants_resume: Vec::new(),
            tenants_resume_setup: None,
            oltp_warehouses: None,
            oltp_connections: oltp::CONNECTIONS.to_vec(),
            oltp_secs: 60,
            oltp_schedulers: oltp::SCHEDULERS.iter().map(|s| s.to_string()).collect(),
            oltp_cpus: vec![1, 2],
            oltp_point_connections: 16,
            oltp_point_configs: Vec::new(),
            oltp_resume: Vec::new(),
            oltp_resume_setup: None,
        }
    }

    /// One size per experiment, small enough to run all four configurations end to end in
    /// about a minute: a 128 MiB file (81 MiB of distinct blocks touched by a random pass)
    /// against a 96 MiB client, so the local cache overflows and lenders get hits. (Less
    /// memory does not work: the mount daemon alone holds ~75 MiB of anonymous memory after
    /// sequential reads, and was OOM-killed in 48 and 64 MiB clients.) tpch runs at scale
    /// factor 0.01 (a 56 MiB cluster: a smoke test of every step and of the answers, ~20–30 s).
    pub fn quick(exe: PathBuf) -> PaperOptions {
        PaperOptions {
            quick: true,
            sizes_bytes: vec![128 * MIB],
            memory_bytes: 96 * MIB,
            lender_capacity_bytes: 256 * MIB,
            probe_reads: 1000,
            experiments: vec![Experiment::Seqread, Experiment::Randread, Experiment::Tpch],
            pgbench_secs: 5,
            tpch_scale_factor: Some(0.01),
            tpch_statement_timeout_secs: 60,
            tpch_deadline_secs: 600,
            tier_bytes: 256 * MIB,
            postmark_scale: 0.001,
            postmark_files_scale: 0.1,
            dfsio_bytes: 64 * MIB,
            durable_secs: 2,
            destage_bytes: 32 * MIB,
            engine_file_bytes: 64 * MIB,
            engine_secs: 1,
            migrate_files: 16,
            migrate_threads: vec![1],
            migrate_phase_secs: 3,
            tenants_sf: vec![0.01, 0.01, 0.01],
            tenants_runs: 2,
            tenants_modes: vec!["static".into(), "mrc".into()],
            tenants_memory_bytes: 96 * MIB,
            tenants_drop_cache: true,
            // oltp: one warehouse, the scheduler and CPU series in farcache only.
            oltp_warehouses: Some(1),
            oltp_connections: vec![1, 4],
            oltp_secs: 3,
            oltp_schedulers: vec!["none".into(), "mq-deadline".into()],
            oltp_point_connections: 4,
            oltp_point_configs: vec![ConfigKind::Farcache],
            ..PaperOptions::full(exe)
        }
    }

    /// The configurations `exp` runs in, of those asked for.
    pub fn configs_for(&self, exp: Experiment) -> Vec<ConfigKind> {
        self.configs.iter().copied().filter(|c| exp.runs_in(*c)).collect()
    }

    /// Room for every test file, ext4's own needs and slack (and for pgbench: the pristine
    /// database, a working copy and WAL).
    pub fn disk_bytes(&self) -> u64 {
        let files: u64 = if self.experiments.iter().any(|e| e.per_size()) { self.sizes_bytes.iter().sum() } else { 0 };
        let pg = if self.experiments.contains(&Experiment::Pgbench) {
            3 * pgbench::scale_for(self) as u64 * 15 * MIB + 2 * GIB
        } else {
            0
        };
        let tpch = if self.experiments.contains(&Experiment::Tpch) { tpch::disk_bytes(self) } else { 0 };
        let tier = if self.experiments.iter().any(|e| e.of_the_tier()) { writeback::disk_bytes(self) } else { 0 };
        let engine = if self.experiments.iter().any(|e| e.of_the_engine()) { self.engine_file_bytes } else { 0 };
        let migrate = if self.experiments.contains(&Experiment::Migrate) { migrate::disk_bytes(self) } else { 0 };
        let oltp = if self.experiments.contains(&Experiment::Oltp) { oltp::disk_bytes(self) } else { 0 };
        files + files / 8 + pg + tpch + tier + engine + migrate + oltp + 512 * MIB
    }
}

fn one() -> f64 {
    1.0
}

fn q4() -> tenants::TenantsQuery {
    tenants::TenantsQuery::Q4
}

/// Sizes as the paper writes them: "64MiB", "1GiB".
pub fn human(bytes: u64) -> String {
    if bytes >= GIB && bytes.trailing_zeros() >= 30 {
        format!("{}GiB", bytes / GIB)
    } else if bytes.trailing_zeros() >= 20 {
        format!("{}MiB", bytes / MIB)
    } else {
        format!("{bytes}B")
    }
}
