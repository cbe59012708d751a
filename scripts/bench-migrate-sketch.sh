#!/usr/bin/env bash
# SKETCH — not run by `make bench`, not yet part of `farcache bench paper` (issue 14's
# `--experiment migrate` is to be written in crates/bench/src/paper/ from this outline).
#
# Paper 001's experiment at a stated scale: two loop-device "HDDs" (the hdd profile of
# crates/bench/src/paper/testbed.rs: 200 IOPS, 150 MB/s, by blkio v1 throttling of every
# process of the client), N files of 4 MiB on the first, random whole-file reads by T fio
# threads, and half the files migrated to the second disk during the run — from the cache
# (lenders' RAM) and, on a fresh setup, from the disk — while /proc/diskstats and the
# daemon's per-branch time are sampled every second.
#
#   scripts/bench-migrate-sketch.sh [N_FILES=64] [THREADS=2] [SOURCE=cache|disk]
#
# Needs root, fio, mkfs.ext4, losetup, cgroup v1 blkio, and target/release/farcache.
set -euo pipefail

n=${1:-64}
threads=${2:-2}
source=${3:-cache}
bin=${FARCACHE_BIN:-target/release/farcache}
work=$(mktemp -d /var/tmp/farcache-migrate.XXXXXX)
cg=/sys/fs/cgroup/blkio/farcache-migrate-$$
pids=()

cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  fusermount3 -u "$work/mnt" 2>/dev/null
  for d in 1 2; do umount "$work/disk$d" 2>/dev/null; done
  for l in "${loops[@]:-}"; do [ -n "$l" ] && losetup -d "$l"; done
  [ -d "$cg" ] && rmdir "$cg"
  rm -rf "$work"
}
trap cleanup EXIT

# Two disks, each its own ext4 on a loop device (the union refuses two branches on one file system).
loops=()
mkdir -p "$cg" "$work/mnt"
for d in 1 2; do
  truncate -s $(( (n * 4 + 512) ))M "$work/disk$d.img"
  l=$(losetup -f --show --direct-io=on "$work/disk$d.img")
  loops+=("$l")
  mkfs.ext4 -q "$l"
  mkdir -p "$work/disk$d"
  mount "$l" "$work/disk$d"
  mm=$(lsblk -no MAJ:MIN "$l" | tr -d ' ')
  for k in read_iops_device write_iops_device; do echo "$mm 200" >"$cg/blkio.throttle.$k"; done
  for k in read_bps_device write_bps_device; do echo "$mm 150000000" >"$cg/blkio.throttle.$k"; done
done
for i in $(seq 0 $((n - 1))); do
  dd if=/dev/urandom of="$work/disk1/f$i" bs=4M count=1 oflag=direct status=none
done

# The client (mount daemon and fio) in the throttled cgroup; one lender beside it.
echo $$ >"$cg/cgroup.procs"
"$bin" server --listen 127.0.0.1:17411 --capacity $(( n * 4 + 256 ))MiB >"$work/server.log" 2>&1 &
pids+=($!)
"$bin" mount "$work/disk1:$work/disk2" "$work/mnt" --server 127.0.0.1:17411 --routing threshold \
  >"$work/mount.log" 2>&1 &
pids+=($!)
while ! grep -q "farcache mounted" "$work/mount.log"; do sleep 0.1; done

# Per-second samples: both devices' diskstats lines, and the union counters.
(
  while :; do
    t=$(date +%s.%N)
    for l in "${loops[@]}"; do
      echo "$t $(grep " $(basename "$l") " /proc/diskstats)"
    done
    sleep 1
  done
) >"$work/diskstats.txt" &
pids+=($!)

# Random whole-file reads (fio's file_service_type=random over N files stands in for FFSB).
fio --name=ffsb --directory="$work/mnt" --filename_format='f$filenum' --nrfiles="$n" --filesize=4M \
  --rw=read --bs=4k --file_service_type=random --numjobs="$threads" --time_based --runtime=300 \
  --group_reporting --output-format=json --status-interval=5 >"$work/fio.json" &
fio_pid=$!
pids+=($fio_pid)
sleep 60   # "before": the files are read (and their blocks reach the lender)

start=$(date +%s.%N)
"$bin" balance "$work/mnt" --from 0 --to 1 --files $((n / 2)) --source "$source" --json >"$work/balance.json"
end=$(date +%s.%N)
echo "migration of $((n / 2)) files from $source: $(echo "$end - $start" | bc) s"
wait "$fio_pid" || true
"$bin" stats "$work/mnt" --json >"$work/stats.json"

# To keep: fio.json (throughput over time: before / early / middle / late / after the
# migration), diskstats.txt (each device's io_ticks over time: the paper's Figs. 14-16),
# balance.json (time, blocks from cache vs disk), stats.json (union counters).
out=${OUT:-bench/migrate-$(date +%Y%m%d-%H%M%S)-$source}
mkdir -p "$out"
cp "$work"/{fio.json,diskstats.txt,balance.json,stats.json,mount.log} "$out/"
echo "results in $out"
