#!/usr/bin/env bash
# Paper 002 (the backing I/O engine, issue 11) reproduced: fio 4 KiB random reads and writes
# through io_uring at queue depth 1-32, 1 and 4 jobs on one file (native / passthrough /
# passthrough-ring, the passthrough over FUSE-over-io_uring / passthrough-kernel, the kernel's
# FUSE passthrough / farcache; each point in every configuration before the next,
# --engine-interleave), and the serialization test (1-16 processes of synchronous 8 KiB reads;
# native / passthrough / passthrough-kernel / serialized), one `farcache bench paper`
# invocation per disk profile.
# Then paper 002's OLTP figures (`--experiment oltp`: go-tpc's TPC-C-like load on PostgreSQL 15,
# tpmC by connections 1-32, by the loop device's scheduler and by cpuset CPUs 1 and 2, in
# native / passthrough / farcache / passthrough-kernel; about 55 min per profile at the
# defaults), one invocation per profile, resumable per configuration (`--resume` keeps the
# points its JSON holds).
# Resumable: a profile whose JSON is complete is skipped (delete it to run it again).
# Results: bench/results/paper002/<profile>/, bench/results/paper002-oltp/<profile>/.
#   PROFILES        default "raw cloud"
#   EXTRA           more `bench paper` arguments for engine,serial (e.g. "--engine-secs 5")
#   OLTP_PROFILES   default "raw cloud"; "" skips the OLTP experiment
#   OLTP_EXTRA      more `bench paper` arguments for oltp (e.g. "--oltp-secs 30 --memory 256MiB")
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/farcache}
OUT=${OUT:-bench/results/paper002}
if [ "$(id -u)" != 0 ]; then
  echo "bench-engine: needs root (loop devices, cgroups)" >&2
  exit 1
fi
"$BIN" bench paper --cleanup
for prof in ${PROFILES:-raw cloud}; do
  dir="$OUT/$prof"
  # The JSON is written as the points run: only a complete one means the profile is done.
  if grep -qs '"complete": true' "$dir"/paper002-*.json; then
    echo "== $prof: done before ($dir), skipped"
    continue
  fi
  mkdir -p "$dir"
  echo "== engine, serial ($prof)"
  # shellcheck disable=SC2086
  "$BIN" bench paper --profile "$prof" --experiment engine,serial --engine-interleave --out "$dir" ${EXTRA:-} >"$dir/log" 2>&1 ||
    { echo "   failed: see $dir/log (what ran is kept as partial-*.json)"; for j in "$dir"/paper002-*.json; do [ -e "$j" ] && mv "$j" "$dir/partial-$(basename "$j")"; done; }
  awk '/^## /{p = ($0 !~ /memory|Sanity|Targets/)} p' "$dir"/paper002-*.md 2>/dev/null || true
done

OUT_OLTP=${OUT_OLTP:-bench/results/paper002-oltp}
for prof in ${OLTP_PROFILES-raw cloud}; do
  dir="$OUT_OLTP/$prof"
  mkdir -p "$dir"
  if grep -qs '"complete": true' "$dir/paper002-oltp-$prof.json"; then
    echo "== oltp ($prof): done before ($dir), skipped"
    continue
  fi
  echo "== oltp ($prof)"
  # shellcheck disable=SC2086
  "$BIN" bench paper --profile "$prof" --experiment oltp --resume --out "$dir" ${OLTP_EXTRA:-} >"$dir/stdout" 2>"$dir/log" ||
    echo "   failed or targets/checks not met: see $dir/log (the points that ran are in the JSON; run again to resume)"
  python3 scripts/bench-paper-plot.py "$dir/paper002-oltp-$prof.json" 2>/dev/null || true
  awk '/^## oltp/{p = 1} /^## (The client|Sanity)/{p = 0} p' "$dir/paper002-oltp-$prof.md" 2>/dev/null || true
done
